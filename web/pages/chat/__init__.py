"""The chat page: routes, the conversation service, views, replies that outlive the tab and
their standing in words, export and import."""
from web.pages.chat.routes import ChatController

__all__ = ["ChatController"]

"""The chat's actions (send, edit, regenerate, continue, stop, settings, delete) over the
store, the engine and replies."""
from __future__ import annotations

from collections.abc import Sequence

import anyio

from web.access.identity import User
from web.pages.chat.prompting import ConversationModel
from web.pages.chat.replies import Replies
from web.pages.chat.rules import SETTING_NAMES, ChatError, check_settings, title_for
from web.services import Services
from web.storage.images import NewImage
from web.storage.store import Conversation, Message
from web.worker import below_engine

__all__ = ["ChatError", "ChatService"]


class ChatService(ConversationModel):
    """The chat's actions; the conversation's model and prompt come from ConversationModel."""

    def __init__(self, s: Services, replies: Replies) -> None:
        super().__init__(s)
        self.replies = replies  # the chat's streaming replies (the chat package owns them)

    def conversation(self, user: User, conversation_id: int) -> Conversation | None:
        """The conversation if `user` owns it (others' chats do not exist for them)."""
        conv = self.s.store.conversation(conversation_id)
        return conv if conv is not None and user.can_read(conv.owner) else None

    def message(self, conv: Conversation, message_id: int) -> Message | None:
        msg = self.s.store.message(message_id)
        return msg if msg is not None and msg.conversation_id == conv.id else None

    async def start_reply(self, user: User, conv: Conversation, history: list[Message],
                          version_group: int | None = None) -> Message:
        """Submit a reply to `history` and start streaming it (raises RequestError, QueueFull)."""
        chat = await anyio.to_thread.run_sync(self.for_conversation, conv, user)
        try:
            p = await below_engine(chat.prompt, conv, history)
            handle = chat.s.submit(user, p.ids, chat._params(conv, p.max_tokens), "chat",
                                   label=conv.title, link=f"/c/{conv.id}",
                                   reasoning=p.reasoning, images=p.images)
        finally:
            chat.s.leave()  # announced, not submitted: no longer listed
        msg = self.s.store.add_message(conv.id, "assistant", "", "streaming", handle.id,
                                       version_group, p.note, p.max_tokens,
                                       model=chat.s.model if chat.s.catalog else None)
        self.replies.start(handle, msg.id, conv.id, p.max_tokens, user=user)
        return msg

    # -- checks --------------------------------------------------------------------------
    def _check_idle(self, conv: Conversation) -> None:
        if self.replies.in_conversation(conv.id):
            raise ChatError("a reply is still being written: wait for it or press Stop")

    def _check_content(self, content: str, pictures: bool = False) -> str:
        """The message's text, stripped; empty only beside pictures."""
        content = content.strip()
        if not content and not pictures:
            raise ChatError("the message is empty", 400)
        if len(content.encode()) > self.s.config.max_body_bytes:
            raise ChatError("the message is too long", 413)
        return content

    def _last(self, conv: Conversation, msg: Message, what: str) -> list[Message]:
        history = self.s.store.messages(conv.id)
        if msg.role != "assistant" or not history or history[-1].group != msg.group:
            raise ChatError(f"only the last reply can be {what}")
        return history

    # -- actions -------------------------------------------------------------------------
    async def create(self, user: User, content: str, model: str = "",
                     images: Sequence[NewImage] = ()) -> tuple[Conversation, Message, Message]:
        content = self._check_content(content, bool(images))
        picked = self.model_name(model)
        title = title_for(content) if content else \
            f"{len(images)} picture{'s' if len(images) > 1 else ''}"
        conv = self.s.store.create_conversation(user.name, title)
        if picked is not None:
            self.s.store.set_model(conv.id, picked)
            conv = self.s.store.conversation(conv.id) or conv
        try:
            mine, reply = await self.send(user, conv, content, images)
        except Exception:
            self.s.store.delete_conversation(conv.id)
            raise
        return conv, mine, reply

    async def send(self, user: User, conv: Conversation, content: str,
                   images: Sequence[NewImage] = ()) -> tuple[Message, Message]:
        """Store the message (and its pictures) and start the reply to it."""
        content = self._check_content(content, bool(images))
        self._check_idle(conv)
        mine = self.s.store.add_message(conv.id, "user", content, images=images)
        try:
            reply = await self.start_reply(user, conv, self.s.store.messages(conv.id))
        except Exception:
            self.s.store.delete_message(mine.id)  # so the user can simply send it again
            raise
        return mine, reply

    async def edit(self, user: User, conv: Conversation, msg: Message,
                   content: str) -> tuple[Message, Message]:
        """Change a sent message and ask again: what followed it is replaced by a new reply."""
        content = self._check_content(content, bool(self.s.store.images(conv.id).get(msg.id)))
        if msg.role != "user":
            raise ChatError("only your own messages can be edited")
        self._check_idle(conv)
        self.s.store.edit_message(msg.id, content)
        self.s.store.delete_after(conv.id, msg.id)
        edited = self.s.store.message(msg.id)
        assert edited is not None
        reply = await self.start_reply(user, conv, self.s.store.messages(conv.id))
        return edited, reply

    async def regenerate(self, user: User, conv: Conversation, msg: Message) -> Message:
        """A new version of the last reply; the earlier ones stay (‹1/2›)."""
        history = self._last(conv, msg, "regenerated")
        self._check_idle(conv)
        reply = await self.start_reply(user, conv, history[:-1], msg.group)
        self.s.store.set_hidden(history[-1].id, True)
        return reply

    def show_version(self, conv: Conversation, msg: Message) -> None:
        self._last(conv, msg, "switched")
        self._check_idle(conv)
        self.s.store.show_version(msg)

    async def continue_reply(self, user: User, conv: Conversation, msg: Message) -> Message:
        """Go on writing a reply that was cut at its token limit (or stopped)."""
        history = self._last(conv, msg, "continued")
        self._check_idle(conv)
        if msg.id != history[-1].id or msg.finish_reason not in ("length", "cancelled"):
            raise ChatError("only a reply that was cut short can be continued")
        chat = await anyio.to_thread.run_sync(self.for_conversation, conv, user)
        try:
            p, reasoning = await below_engine(chat.continued_prompt, conv,
                                                          history[:-1], msg)
            handle = chat.s.submit(user, p.ids, chat._params(conv, p.max_tokens), "chat",
                                   label=conv.title, link=f"/c/{conv.id}",
                                   reasoning=reasoning, images=p.images)
        finally:
            chat.s.leave()
        self.s.store.restart_message(msg.id, p.max_tokens)
        self.replies.start(handle, msg.id, conv.id, p.max_tokens, prefix=msg.content,
                             earlier_tokens=msg.completion_tokens or 0,
                             reasoning_prefix=msg.reasoning or "", user=user)
        again = self.s.store.message(msg.id)
        assert again is not None
        return again

    def stop(self, msg: Message) -> bool:
        reply = self.replies.get(msg.id)
        return reply.stop() if reply is not None else False

    def rename(self, conv: Conversation, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            raise ChatError("the title is empty", 400)
        self.s.store.rename(conv.id, title[:200])

    def set_settings(self, conv: Conversation, system_prompt: str, temperature: str,
                     top_p: str, max_tokens: str, thinking: bool | None = None) -> None:
        """Blank fields mean the server's defaults; out-of-range values are refused;
        `thinking` None: the form had no Thinking switch (the model takes none)."""
        def number(text: str, name: str) -> float | None:
            if not text.strip():
                return None
            try:
                return float(text)
            except ValueError:
                raise ChatError(f"{name} must be a number", 400) from None
        limit = number(max_tokens, "max tokens")
        checked = check_settings(self.s.config.max_tokens_limit, system_prompt.strip() or None,
                                 number(temperature, "temperature"), number(top_p, "top_p"),
                                 limit, names=SETTING_NAMES)
        if thinking is None:
            thinking = None if conv.enable_thinking is None else conv.thinking
        self.s.store.set_settings(conv.id, *checked, thinking)

    def delete(self, conv: Conversation) -> None:
        for reply in self.replies.in_conversation(conv.id):
            reply.handle.cancel()
        self.s.store.delete_conversation(conv.id)

"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) over the chat path:
schemas (the request body), translate (blocks <-> chat messages, the reply), stream (the
event sequence), errors (Anthropic's error shape), routes."""

"""The chat's actions (send, regenerate, stop, delete) over the store, the engine and replies."""
from __future__ import annotations

import anyio

from engine import SamplingParams
from web.access.identity import User
from web.services import Services
from web.storage.store import Conversation, Message


class ChatError(Exception):
    """An action the chat refuses (shown to the user as a notice)."""

    def __init__(self, message: str, status_code: int = 409) -> None:
        super().__init__(message)
        self.status_code = status_code


def title_for(content: str, limit: int = 60) -> str:
    line = " ".join(content.split())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


class ChatService:
    def __init__(self, s: Services) -> None:
        self.s = s

    def conversation(self, user: User, conversation_id: int) -> Conversation | None:
        """The conversation if `user` owns it (others' chats do not exist for them)."""
        conv = self.s.store.conversation(conversation_id)
        return conv if conv is not None and user.can_read(conv.owner) else None

    def message(self, conv: Conversation, message_id: int) -> Message | None:
        msg = self.s.store.message(message_id)
        return msg if msg is not None and msg.conversation_id == conv.id else None

    def _params(self, prompt_len: int) -> SamplingParams:
        cfg = self.s.config
        max_tokens = max(1, min(cfg.default_max_tokens, self.s.context_limit - prompt_len))
        return SamplingParams(max_tokens=max_tokens, temperature=cfg.chat_temperature,
                              top_p=cfg.chat_top_p, ignore_eos=cfg.chat_ignore_eos)

    def _prompt(self, history: list[Message]) -> list[int]:
        """Prompt ids for the history, dropping the oldest turns until a reply fits."""
        turns = [{"role": m.role, "content": m.content} for m in history
                 if m.role == "user" or m.content]
        system = self.s.config.chat_system_prompt
        head = [{"role": "system", "content": system}] if system else []
        room = self.s.context_limit - min(self.s.config.default_max_tokens,
                                          self.s.context_limit // 2)
        while True:
            ids = self.s.tokenizer.apply_chat_template(head + turns)
            if len(ids) <= room or len(turns) <= 1:
                return ids
            turns = turns[2:] if len(turns) > 2 else turns[1:]

    async def start_reply(self, user: User, conv: Conversation,
                          history: list[Message]) -> Message:
        """Submit a reply to `history` and start streaming it (raises RequestError, QueueFull)."""
        ids = await anyio.to_thread.run_sync(self._prompt, history)
        handle = self.s.submit(user, ids, self._params(len(ids)), "chat", label=conv.title,
                               link=f"/c/{conv.id}")
        msg = self.s.store.add_message(conv.id, "assistant", "", "streaming", handle.id)
        self.s.replies.start(handle, msg.id, conv.id)
        return msg

    def _check_idle(self, conv: Conversation) -> None:
        if self.s.replies.in_conversation(conv.id):
            raise ChatError("a reply is still being written: wait for it or press Stop")

    def _check_content(self, content: str) -> str:
        content = content.strip()
        if not content:
            raise ChatError("the message is empty", 400)
        if len(content.encode()) > self.s.config.max_body_bytes:
            raise ChatError("the message is too long", 413)
        return content

    async def create(self, user: User, content: str) -> tuple[Conversation, Message, Message]:
        content = self._check_content(content)
        conv = self.s.store.create_conversation(user.name, title_for(content))
        try:
            mine, reply = await self.send(user, conv, content)
        except Exception:
            self.s.store.delete_conversation(conv.id)
            raise
        return conv, mine, reply

    async def send(self, user: User, conv: Conversation, content: str) -> tuple[Message, Message]:
        content = self._check_content(content)
        self._check_idle(conv)
        mine = self.s.store.add_message(conv.id, "user", content)
        try:
            reply = await self.start_reply(user, conv, self.s.store.messages(conv.id))
        except Exception:
            self.s.store.delete_message(mine.id)  # so the user can simply send it again
            raise
        return mine, reply

    async def regenerate(self, user: User, conv: Conversation, msg: Message) -> Message:
        history = self.s.store.messages(conv.id)
        if msg.role != "assistant" or not history or history[-1].id != msg.id:
            raise ChatError("only the last reply can be regenerated")
        self._check_idle(conv)
        reply = await self.start_reply(user, conv, history[:-1])
        self.s.store.delete_message(msg.id)
        return reply

    def stop(self, msg: Message) -> bool:
        reply = self.s.replies.get(msg.id)
        return reply.handle.cancel() if reply is not None else False

    def delete(self, conv: Conversation) -> None:
        for reply in self.s.replies.in_conversation(conv.id):
            reply.handle.cancel()
        self.s.store.delete_conversation(conv.id)

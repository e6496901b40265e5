"""The chat's actions (send, edit, regenerate, continue, stop, settings, delete) over the
store, the engine and replies."""
from __future__ import annotations

from dataclasses import dataclass

import anyio

from engine import Reasoning, SamplingParams, UnknownModel, continuation
from web.access.identity import User
from web.services import Services
from web.storage.store import Conversation, Message


class ChatError(Exception):
    """An action the chat refuses (shown to the user as a notice)."""

    def __init__(self, message: str, status_code: int = 409) -> None:
        super().__init__(message)
        self.status_code = status_code


SETTING_NAMES = {"system_prompt": "system prompt", "temperature": "temperature",
                 "top_p": "top_p", "max_tokens": "max tokens"}
Settings = tuple[str | None, float | None, float | None, int | None]


def check_settings(max_tokens_limit: int, system_prompt: str | None, temperature: float | None,
                   top_p: float | None, max_tokens: float | None,
                   names: dict[str, str]) -> Settings:
    """A conversation's settings (None: the server's default) by the Settings form's rules,
    which the import follows too; raises ChatError (400) naming the field as `names` says."""
    def within(value: float | None, name: str, low: float, high: float) -> None:
        if value is not None and not low <= value <= high:  # NaN fails too
            raise ChatError(f"{names[name]} must be between {low:g} and {high:g}", 400)
    within(temperature, "temperature", 0.0, 2.0)
    within(top_p, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ChatError(f"{names['top_p']} must be above 0", 400)
    within(max_tokens, "max_tokens", 1, max_tokens_limit)
    if max_tokens is not None and max_tokens != int(max_tokens):
        raise ChatError(f"{names['max_tokens']} must be a whole number", 400)
    return (system_prompt, temperature, top_p, None if max_tokens is None else int(max_tokens))


def title_for(content: str, limit: int = 60) -> str:
    line = " ".join(content.split())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    max_tokens: int  # the reply's limit once the prompt's room is taken
    note: str | None  # what the reader should know (turns left out, a smaller limit)
    reasoning: Reasoning | None = None  # how a thinking model's reply carries its reasoning


@dataclass(frozen=True, slots=True)
class Version:
    """Where a reply stands among the versions of its group (‹index/count›)."""

    index: int  # 1-based
    count: int
    previous: int | None  # message ids to switch to
    next: int | None


def version_nav(s: Services, messages: list[Message]) -> dict[int, Version]:
    """Version navigation for the replies of `messages` that have more than one version."""
    nav: dict[int, Version] = {}
    for m in messages:
        if m.role != "assistant":
            continue
        ids = [v.id for v in s.store.versions(m.group)]
        if len(ids) > 1 and m.id in ids:
            i = ids.index(m.id)
            nav[m.id] = Version(i + 1, len(ids), ids[i - 1] if i else None,
                                ids[i + 1] if i + 1 < len(ids) else None)
    return nav


class ChatService:
    def __init__(self, s: Services) -> None:
        self.s = s

    def conversation(self, user: User, conversation_id: int) -> Conversation | None:
        """The conversation if `user` owns it (others' chats do not exist for them)."""
        conv = self.s.store.conversation(conversation_id)
        return conv if conv is not None and user.can_read(conv.owner) else None

    # -- the model -----------------------------------------------------------------------
    def for_conversation(self, conv: Conversation) -> ChatService:
        """The service for the conversation's model (several models: its engine, tokenizer
        and template; a model no longer served falls back to the default). Opening a model's
        tokenizer the first time takes seconds: call it off the event loop."""
        if self.s.catalog is None:
            return self
        try:
            return ChatService(self.s.for_model(conv.model))
        except UnknownModel:
            return ChatService(self.s.for_model(None))

    def model_name(self, model: str) -> str | None:
        """The stored name for a picked model ("" or the default: None); ChatError if
        unknown."""
        if self.s.catalog is None or not model:
            return None
        try:
            name = self.s.catalog.resolve(model)
        except UnknownModel as exc:
            raise ChatError(str(exc), 400) from None
        return None if name == self.s.catalog.default else name

    def set_model(self, conv: Conversation, model: str) -> None:
        self.s.store.set_model(conv.id, self.model_name(model))

    def message(self, conv: Conversation, message_id: int) -> Message | None:
        msg = self.s.store.message(message_id)
        return msg if msg is not None and msg.conversation_id == conv.id else None

    # -- the prompt ----------------------------------------------------------------------
    def _params(self, conv: Conversation, max_tokens: int) -> SamplingParams:
        cfg = self.s.config
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=cfg.chat_temperature if conv.temperature is None else conv.temperature,
            top_p=cfg.chat_top_p if conv.top_p is None else conv.top_p,
            ignore_eos=cfg.chat_ignore_eos, stop=self.s.tokenizer.chat_stops)

    def wanted_tokens(self, conv: Conversation) -> int:
        cfg = self.s.config
        if conv.max_tokens is None:
            return cfg.default_max_tokens
        # within the limit even for a conversation stored before imports were checked
        return min(conv.max_tokens, cfg.max_tokens_limit)

    def prompt(self, conv: Conversation, history: list[Message], tail: str = "") -> Prompt:
        """Prompt ids for the history, leaving out the oldest turns (never the system prompt)
        until the prompt and a reply fit the context; `tail` is a reply being continued.
        Replies go back as their answers only: their reasoning is not fed to the model."""
        turns = [{"role": m.role, "content": m.content} for m in history
                 if m.role == "user" or m.content]
        system = conv.system_prompt if conv.system_prompt is not None else \
            self.s.config.chat_system_prompt
        head = [{"role": "system", "content": system}] if system else []
        limit = self.s.context_limit
        wanted = self.wanted_tokens(conv)
        room = limit - min(wanted, limit // 2)  # at least half the context for the prompt
        tokenizer = self.s.tokenizer
        tail_ids = tokenizer.encode(tail, add_special_tokens=False) if tail else []
        dropped = 0
        while True:
            base = tokenizer.apply_chat_template(head + turns, enable_thinking=conv.thinking)
            ids = base + tail_ids
            if len(ids) <= room or len(turns) <= 1:
                break
            step = 2 if len(turns) > 2 else 1
            turns, dropped = turns[step:], dropped + step
        if len(ids) >= limit:
            raise ChatError(f"the message does not fit the model's {limit}-token context "
                            f"({len(ids)} tokens with what it needs around it)", 400)
        max_tokens = min(wanted, limit - len(ids))
        notes = []
        if dropped:
            notes.append(f"the {dropped} oldest message{'s' if dropped > 1 else ''} "
                         f"{'were' if dropped > 1 else 'was'} left out to fit the "
                         f"{limit}-token context")
        if max_tokens < wanted:
            notes.append(f"the reply is limited to {max_tokens} tokens (not {wanted}): "
                         "the context is nearly full")
        return Prompt(ids, max_tokens, "; ".join(notes) or None, tokenizer.reasoning_for(base))

    def continued_prompt(self, conv: Conversation, history: list[Message],
                         msg: Message) -> tuple[Prompt, Reasoning | None]:
        """The prompt that continues `msg` (its reasoning and its answer so far), and how the
        rest carries reasoning (None: only answer text follows)."""
        p = self.prompt(conv, history, msg.content)
        if p.reasoning is None:
            return p, None
        tail, inside = continuation(p.reasoning, msg.reasoning or "", msg.content)
        p = self.prompt(conv, history, tail)
        return p, Reasoning(started=True, fresh=False) if inside else None

    async def start_reply(self, user: User, conv: Conversation, history: list[Message],
                          version_group: int | None = None) -> Message:
        """Submit a reply to `history` and start streaming it (raises RequestError, QueueFull)."""
        chat = await anyio.to_thread.run_sync(self.for_conversation, conv)
        p = await anyio.to_thread.run_sync(chat.prompt, conv, history)
        handle = chat.s.submit(user, p.ids, chat._params(conv, p.max_tokens), "chat",
                               label=conv.title, link=f"/c/{conv.id}", reasoning=p.reasoning)
        msg = self.s.store.add_message(conv.id, "assistant", "", "streaming", handle.id,
                                       version_group, p.note, p.max_tokens,
                                       model=chat.s.model if chat.s.catalog else None)
        self.s.replies.start(handle, msg.id, conv.id, p.max_tokens)
        return msg

    # -- checks --------------------------------------------------------------------------
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

    def _last(self, conv: Conversation, msg: Message, what: str) -> list[Message]:
        history = self.s.store.messages(conv.id)
        if msg.role != "assistant" or not history or history[-1].group != msg.group:
            raise ChatError(f"only the last reply can be {what}")
        return history

    # -- actions -------------------------------------------------------------------------
    async def create(self, user: User, content: str,
                     model: str = "") -> tuple[Conversation, Message, Message]:
        content = self._check_content(content)
        picked = self.model_name(model)
        conv = self.s.store.create_conversation(user.name, title_for(content))
        if picked is not None:
            self.s.store.set_model(conv.id, picked)
            conv = self.s.store.conversation(conv.id) or conv
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

    async def edit(self, user: User, conv: Conversation, msg: Message,
                   content: str) -> tuple[Message, Message]:
        """Change a sent message and ask again: what followed it is replaced by a new reply."""
        content = self._check_content(content)
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
        chat = await anyio.to_thread.run_sync(self.for_conversation, conv)
        p, reasoning = await anyio.to_thread.run_sync(chat.continued_prompt, conv,
                                                      history[:-1], msg)
        handle = chat.s.submit(user, p.ids, chat._params(conv, p.max_tokens), "chat",
                               label=conv.title, link=f"/c/{conv.id}", reasoning=reasoning)
        self.s.store.restart_message(msg.id, p.max_tokens)
        self.s.replies.start(handle, msg.id, conv.id, p.max_tokens, prefix=msg.content,
                             earlier_tokens=msg.completion_tokens or 0,
                             reasoning_prefix=msg.reasoning or "")
        again = self.s.store.message(msg.id)
        assert again is not None
        return again

    def stop(self, msg: Message) -> bool:
        reply = self.s.replies.get(msg.id)
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
        for reply in self.s.replies.in_conversation(conv.id):
            reply.handle.cancel()
        self.s.store.delete_conversation(conv.id)

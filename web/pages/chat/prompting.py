"""A conversation's model and its prompt: which model a conversation chats with (several
models), and the prompt ids, token limit and sampling of its next reply."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from engine import LoadRefused, QueueFull, Reasoning, SamplingParams, UnknownModel, continuation
from web.access.identity import User
from web.pages.chat.rules import ChatError
from web.services import Services
from web.storage.store import Conversation, Message

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    max_tokens: int  # the reply's limit once the prompt's room is taken
    note: str | None  # what the reader should know (turns left out, a smaller limit)
    reasoning: Reasoning | None = None  # how a thinking model's reply carries its reasoning


class ConversationModel:
    """The model side of ChatService (split out to keep one concern per file)."""

    def __init__(self, s: Services) -> None:
        self.s = s

    # -- the model -----------------------------------------------------------------------
    def for_conversation(self, conv: Conversation, user: User | None = None
                         ) -> ConversationModel:
        """The service for the conversation's model (several models: its engine, tokenizer
        and template; a model no longer served falls back to the default). With `user`, a
        reply about to be asked for: announced (listed as waiting for its model) until
        submitted or `s.leave()`. Opening a model's tokenizer the first time takes seconds:
        call it off the event loop."""
        if self.s.catalog is None:
            return self
        try:
            return ConversationModel(self.s.for_model(conv.model, user=user))
        except UnknownModel:
            return ConversationModel(self.s.for_model(None, user=user))
        except (LoadRefused, QueueFull):
            raise
        except Exception:  # its tokenizer would not open (a file found on disk, say)
            log.warning("opening %s's tokenizer failed", conv.model, exc_info=True)
            raise ChatError(f"the model {conv.model} cannot be used: its tokenizer does not "
                            "open (the server's log says why)", 503) from None

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

    def imported_model(self, model: str | None) -> tuple[str | None, str | None]:
        """An imported file's model: (the name stored, None for the default; the file's name
        when this server does not serve it, which then falls back to the default)."""
        if not model:
            return None, None
        if self.s.catalog is None:
            return None, (None if model == self.s.config.model_name else model)
        try:
            return self.model_name(model), None
        except ChatError:
            return None, model

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

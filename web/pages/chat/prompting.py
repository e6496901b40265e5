"""A conversation's model and its prompt: which model a conversation chats with (several
models), and the prompt ids, token limit and sampling of its next reply."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from engine import (
    ImageInput,
    LoadRefused,
    QueueFull,
    Reasoning,
    SamplingParams,
    UnknownModel,
    continuation,
)
from web.access.identity import User
from web.api.errors import APIError
from web.api.vision import ImagePrompt, build_image_prompt
from web.pages.chat.rules import ChatError
from web.pages.chat.vision import (
    content_parts,
    left_out_words,
    limit_words,
    sent_pictures,
    takes_images,
    vision_models,
)
from web.services import Services
from web.storage.store import Conversation, Message

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    max_tokens: int  # the reply's limit once the prompt's room is taken
    note: str | None  # what the reader should know (turns left out, a smaller limit)
    reasoning: Reasoning | None = None  # how a thinking model's reply carries its reasoning
    images: tuple[ImageInput, ...] = ()  # a vision model's pictures, placed in `ids`


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
        Replies go back as their answers only: their reasoning is not fed to the model.
        A message's pictures go to a model that takes them (decoded here: call it off the
        event loop); to any other, never (the note says so)."""
        turns, unsent = self._turns(conv, history)
        system = conv.system_prompt if conv.system_prompt is not None else \
            self.s.config.chat_system_prompt
        head = [{"role": "system", "content": system}] if system else []
        limit = self.s.context_limit
        wanted = self.wanted_tokens(conv)
        room = limit - min(wanted, limit // 2)  # at least half the context for the prompt
        tokenizer = self.s.tokenizer
        tail_ids = tokenizer.encode(tail, add_special_tokens=False) if tail else []
        dropped = 0
        pixels: dict[str, Any] = {}  # each picture decoded once while old turns are dropped
        while True:
            built = self._with_images(head + turns, conv, pixels)
            base = built.ids
            ids = base + tail_ids
            if len(ids) <= room or len(turns) <= 1:
                break
            step = 2 if len(turns) > 2 else 1
            turns, dropped = turns[step:], dropped + step
        if len(ids) >= limit:
            raise ChatError(f"the message does not fit the model's {limit}-token context "
                            f"({len(ids)} tokens with what it needs around it)", 400)
        max_tokens = min(wanted, limit - len(ids))
        notes = unsent
        if dropped:
            notes.append(f"the {dropped} oldest message{'s' if dropped > 1 else ''} "
                         f"{'were' if dropped > 1 else 'was'} left out to fit the "
                         f"{limit}-token context")
        if max_tokens < wanted:
            notes.append(f"the reply is limited to {max_tokens} tokens (not {wanted}): "
                         "the context is nearly full")
        return Prompt(ids, max_tokens, "; ".join(notes) or None, tokenizer.reasoning_for(base),
                      built.images)

    def _with_images(self, messages: list[dict[str, Any]], conv: Conversation,
                     pixels: dict[str, Any]) -> ImagePrompt:
        """The messages' ids and placed pictures through the API's own path (its checks and
        the model's preprocessing); its 400s become the chat's."""
        def render(plain: list[dict[str, Any]], **kw: Any) -> list[int]:
            return list(self.s.tokenizer.apply_chat_template(plain,
                                                             enable_thinking=conv.thinking,
                                                             **kw))
        try:
            return build_image_prompt(messages, self.s.engine, self.s.config, self.s.model_name,
                                      render, pixels)
        except APIError as exc:
            raise ChatError(exc.message, exc.status_code) from None

    def _turns(self, conv: Conversation, history: list[Message]
               ) -> tuple[list[dict[str, Any]], list[str]]:
        """The history as chat-template turns, and why some pictures were not sent (the
        model takes none, or the limits of one request)."""
        stored = self.s.store.images(conv.id)
        pictures = {m.id: stored[m.id] for m in history if m.role == "user" and m.id in stored}
        sees = takes_images(self.s.engine)
        sent = sent_pictures(pictures, self.s.config) if sees else None
        turns: list[dict[str, Any]] = []
        left_out = 0
        for m in history:
            if m.role != "user" and not m.content:
                continue
            attached = pictures.get(m.id, [])
            going = sent.pictures.get(m.id, []) if sent is not None else []
            if going:
                turns.append({"role": m.role,
                              "content": content_parts(self.s.store, m.content, going)})
            else:
                turns.append({"role": m.role, "content": m.content})
            if sent is None:
                left_out += len(attached)
        if sent is not None:
            return turns, limit_words(sent, self.s.config)
        if left_out:
            return turns, [left_out_words(self.s.model_name, left_out, vision_models(self.s))]
        return turns, []

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

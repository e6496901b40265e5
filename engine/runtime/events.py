"""Messages that cross the thread line: inbox commands in, per-request events out."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.scheduling.request import FinishReason, Request, TokenLogprob


@dataclass(frozen=True, slots=True)
class Submit:
    request: Request


@dataclass(frozen=True, slots=True)
class Cancel:
    request_id: str
    reason: FinishReason = "cancelled"  # "stop" when the consumer matched a stop string


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Change the scheduling policy / admission order at runtime (admin action)."""

    policy: str | None = None
    admission: str | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """Token ids sampled for one request in one round (detokenized by the consumer), with
    their log-probabilities when asked; the round that completes a prompt that is scored
    carries all of its prompt log-probabilities (token_ids is empty for max_tokens 0)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    # time.perf_counter() when the round emitted them: a consumer that reads several queued
    # events at once (the bench's client threads) still sees when each token came
    emitted: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds, measured on the engine clock."""

    queued: float  # arrival -> admission
    ttft: float | None  # arrival -> first token
    tpot: float | None  # mean gap after the first token
    total: float  # arrival -> finish


@dataclass(frozen=True, slots=True)
class FinalEvent:
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    error: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

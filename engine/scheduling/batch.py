"""What the scheduler hands an executor for one round, and what comes back."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from engine.scheduling.request import Request

# "encode": a round of image encoder work only (Batch.encodes), no positions computed
Phase = Literal["prefill", "decode", "mixed", "encode"]
# What an executor returns per item: a token; a speculative item's emitted run (its kept
# drafts and the target's next token: 1 to len(drafts) + 1 tokens); None (no sample).
# An int for a speculative item means no draft was kept.
Sampled = int | tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One request's work in a round: compute positions [start, start + num_tokens)."""

    request: Request
    start: int
    num_tokens: int
    sample: bool  # last prefill chunk or decode: produce one token
    # speculative decode: positions start + 1 .. start + len(drafts) hold these drafted
    # tokens (num_tokens == 1 + len(drafts)); the executor verifies them
    drafts: tuple[int, ...] = ()

    @property
    def is_decode(self) -> bool:
        return self.request.prompt_len <= self.start


@dataclass(frozen=True, slots=True)
class Batch:
    phase: Phase
    items: tuple[BatchItem, ...]
    # admitted requests whose next chunk waits for an image's encoder output: the executor
    # runs a slice of that encoder work in this round (see Scheduler.image_ready)
    encodes: tuple[Request, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(item.num_tokens for item in self.items)


class Executor(Protocol):
    """Runs one round. Returns one sampled token per item (None where `sample` is False;
    for an item with drafts, the tokens verification emits, see `Sampled`).

    The KV for positions [start, start + num_tokens) is written into the pool at the pages in
    `request.pages` (position p lives at pages[p // page_size] * page_size + p % page_size);
    earlier positions (cached prefix, previous chunks, previous decodes) are already there.
    """

    def run(self, batch: Batch) -> Sequence[Sampled]: ...

    def release(self, request: Request) -> None:
        """Forget per-request state (e.g. a sampling generator) once the request ends."""
        ...


class Drafter(Protocol):
    """Proposes draft tokens for a decoding request and learns from their verification."""

    def prepare(self, requests: Sequence[Request], limits: Sequence[int], spare: int) -> None:
        """A speculative round's decoding requests, each one's most drafts and the round's
        most (`spare`), before `draft` is asked for each in order (a draft model proposes
        for all of them at once)."""
        ...

    def draft(self, request: Request, limit: int) -> list[int]:
        """At most `limit` tokens likely to follow the request's sequence ([]: decode
        plainly this round)."""
        ...

    def record(self, request: Request, drafted: int, accepted: int) -> None:
        """A speculative round's outcome: `accepted` of `drafted` drafts were kept."""
        ...

    def release(self, request: Request) -> None:
        """Forget the request (it finished)."""
        ...

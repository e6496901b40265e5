"""What the scheduler hands an executor for one round, and what comes back."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from engine.scheduling.request import Request

Phase = Literal["prefill", "decode", "mixed"]


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One request's work in a round: compute positions [start, start + num_tokens)."""

    request: Request
    start: int
    num_tokens: int
    sample: bool  # last prefill chunk or decode: produce one token

    @property
    def is_decode(self) -> bool:
        return self.request.prompt_len <= self.start


@dataclass(frozen=True, slots=True)
class Batch:
    phase: Phase
    items: tuple[BatchItem, ...]

    @property
    def num_tokens(self) -> int:
        return sum(item.num_tokens for item in self.items)


class Executor(Protocol):
    """Runs one round. Returns one sampled token per item (None where `sample` is False).

    The KV for positions [start, start + num_tokens) is written into the pool at the pages in
    `request.pages` (position p lives at pages[p // page_size] * page_size + p % page_size);
    earlier positions (cached prefix, previous chunks, previous decodes) are already there.
    """

    def run(self, batch: Batch) -> list[int | None]: ...

    def release(self, request: Request) -> None:
        """Forget per-request state (e.g. a sampling generator) once the request ends."""
        ...

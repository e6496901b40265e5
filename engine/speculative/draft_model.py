"""Drafting with a small second model: the interface the speculator drafts through.

The draft model runs on the engine thread with a KV pool of its own (the torch side is
`engine.execution.draft_runner.DraftRunner`). Per request it keeps draft K/V for the prefix
the target has accepted; `propose` first computes the positions it is missing (the tokens
appended since its last proposal), then decodes k tokens greedily, several requests in one
forward per step. Greedy drafts are a function of the sequence, so verification treats each
as certain (q(d) = 1), as for prompt lookup: the rejection rule still leaves every emitted
token distributed as plain sampling's. Draft K/V past what the target kept is dropped at
the next proposal (the sequence tells which drafts were kept); `release` frees the rest.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from engine.config import ConfigError
from engine.scheduling.request import Request

log = logging.getLogger(__name__)

class DraftModelError(ConfigError):
    """A draft model that cannot draft for this target (no model, another vocabulary, a
    target with sliding-window layers)."""


class DraftModel(Protocol):
    """A draft model with its own KV pages."""

    num_pages: int  # pages in its KV pool

    @property
    def free_pages(self) -> int: ...

    def propose(self, asks: Sequence[tuple[Request, int]]) -> list[list[int]]:
        """For each (request, k): up to k greedy drafts continuing its sequence
        (prompt + outputs), in one batched forward per step."""
        ...

    def release(self, request: Request) -> None:
        """Free the request's draft K/V (it finished or was cancelled)."""
        ...


def check_vocabularies(target: dict[str, int], draft: dict[str, int]) -> None:
    """The draft must speak the target's tokens: same size, same string for every id."""
    if len(target) != len(draft):
        raise DraftModelError(f"the draft model's tokenizer has {len(draft):,} tokens, the "
                              f"target's {len(target):,}: a draft model needs the target's "
                              "tokenizer")
    if target != draft:
        differ = sorted(t for t in target if draft.get(t) != target[t])
        raise DraftModelError(f"the draft model's tokenizer differs from the target's "
                              f"({len(differ):,} tokens differ, e.g. {differ[0]!r}): a draft "
                              "model needs the target's tokenizer")


class PreparedDrafts:
    """One round's proposals, made for every drafting request at once (`prepare`), then
    handed out per request as the scheduler asks."""

    def __init__(self, model: DraftModel) -> None:
        self.model = model
        self._ready: dict[str, list[int]] = {}

    def prepare(self, asks: Sequence[tuple[Request, int]]) -> None:
        self._ready.clear()
        asks = [(r, k) for r, k in asks if k > 0]
        if asks:
            for (req, _), drafts in zip(asks, self._propose(asks)):
                self._ready[req.id] = drafts

    def __call__(self, request: Request, k: int) -> list[int]:
        ready = self._ready.pop(request.id, None)
        if ready is not None:  # prepared for at least k (fewer: all the model could)
            return ready[:k]
        return self._propose([(request, k)])[0]

    def _propose(self, asks: Sequence[tuple[Request, int]]) -> list[list[int]]:
        # runs while the scheduler selects the round: a failing draft model costs the
        # round its drafts, never the round (the target decodes plainly)
        try:
            return self.model.propose(asks)
        except Exception:
            log.exception("the draft model failed; this round decodes without drafts")
            for req, _ in asks:  # its K/V for them is in doubt: rebuilt at the next draft
                self.model.release(req)
            return [[] for _ in asks]

    def release(self, request: Request) -> None:
        self._ready.pop(request.id, None)
        self.model.release(request)

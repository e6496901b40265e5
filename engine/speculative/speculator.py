"""The scheduler's drafter: which requests speculate, how far, and from what.

Implements `engine.scheduling.batch.Drafter`. Per request it keeps a `DraftLength` (the
adaptive length, paused after repeated misses) and, for prompt lookup, an `NgramIndex` over
the prompt and the reply so far, extended with the tokens appended since the last round.
With a draft model (`model`), `prepare` has it propose for every drafting request of the
round at once; `draft` then hands each its share.
A request does not speculate when it asked not to (`speculative: false`), when its output is
grammar-constrained (each token needs the matcher's mask first), or when it samples with a
seed (a seed promises the same tokens whatever the batch; whether a round speculates depends
on the batch). The scheduler caps `limit` (remaining output, the batch-size gate).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.scheduling.request import Request
from engine.speculative.adaptive import DraftLength, DraftPolicy
from engine.speculative.draft_model import DraftModel, PreparedDrafts
from engine.speculative.ngram import NgramIndex

# (request, k) -> up to k drafts; the default looks the request's own n-grams up
Source = Callable[[Request, int], list[int]]


def eligible(req: Request) -> bool:
    p = req.params
    return (p.speculative and p.constraint is None and req.matcher is None
            and (p.greedy or p.seed is None))


@dataclass(slots=True)
class SpeculationTotals:
    """Since start: drafts proposed and kept, and speculative request-rounds."""

    drafted: int = 0
    accepted: int = 0
    rounds: int = 0


class Speculator:
    def __init__(self, policy: DraftPolicy | None = None, source: Source | None = None,
                 model: DraftModel | None = None) -> None:
        self.policy = policy or DraftPolicy()
        self.prepared = PreparedDrafts(model) if model is not None else None
        self.source = source or self.prepared or self._lookup
        # what drafts: prompt lookup, a draft model, or a source given (the simulator's script)
        self.kind = "draft" if model is not None else "ngram" if source is None else "scripted"
        self.lengths: dict[str, DraftLength] = {}
        self.indexes: dict[str, NgramIndex] = {}
        self.totals = SpeculationTotals()

    def _length(self, request: Request) -> DraftLength:
        length = self.lengths.get(request.id)
        if length is None:
            length = self.lengths[request.id] = DraftLength(self.policy)
        return length

    def prepare(self, requests: Sequence[Request], limits: Sequence[int], spare: int) -> None:
        """The round's decoding requests, each one's most drafts and the round's (`spare`),
        before `draft` is asked for each in order: a draft model proposes for all of them
        in one batched pass (prompt lookup needs nothing ahead)."""
        if self.prepared is None:
            return
        asks = []
        for req, limit in zip(requests, limits):
            k = max(0, min(limit, spare, self._length(req).wanted())) if eligible(req) else 0
            spare -= k
            asks.append((req, k))
        self.prepared.prepare(asks)

    def draft(self, request: Request, limit: int) -> list[int]:
        if not eligible(request):
            return []
        length = self._length(request)
        k = min(limit, length.wanted())
        drafts = self.source(request, k) if k > 0 else []
        if not drafts:
            length.record(0, 0)  # a plain round: counts down a pause
        return drafts[:k]

    def record(self, request: Request, drafted: int, accepted: int) -> None:
        length = self.lengths.get(request.id)
        if length is not None:
            length.record(drafted, accepted)
        self.totals.drafted += drafted
        self.totals.accepted += accepted
        self.totals.rounds += 1

    def release(self, request: Request) -> None:
        self.lengths.pop(request.id, None)
        self.indexes.pop(request.id, None)
        if self.prepared is not None:
            self.prepared.release(request)  # its draft K/V pages back

    def _lookup(self, req: Request, k: int) -> list[int]:
        index = self.indexes.get(req.id)
        if index is None:
            index = self.indexes[req.id] = NgramIndex(req.prompt_ids)
        done = len(index) - req.prompt_len  # outputs indexed so far
        index.extend(req.output_ids[done:])
        return index.propose(k)

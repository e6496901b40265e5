"""A minimal stand-in for the scheduler over one executor: the model tests drive rounds
with it (page allocation, packing, greedy sampling) and compare logits."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from engine.execution.executor import ModelExecutor
from engine.scheduling.batch import Batch, BatchItem
from engine.scheduling.request import Request, SamplingParams


@dataclass
class Harness:
    """A minimal stand-in for the scheduler: page allocation and round execution."""

    executor: ModelExecutor
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    free: list[int] = field(default_factory=list)
    logits: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)

    local_free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.free = list(range(self.executor.pool.num_pages))
        self.rng.shuffle(self.free)  # non-contiguous page tables
        local = self.executor.local_pool
        self.local_free = list(range(local.num_pages)) if local is not None else []
        self.rng.shuffle(self.local_free)

    @property
    def page_size(self) -> int:
        return self.executor.page_size

    def new(self, prompt: list[int], shared_pages: list[int] | None = None,
            **params: object) -> Request:
        req = Request(list(prompt), SamplingParams(**{"max_tokens": 64, **params}))
        req.pages = list(shared_pages or [])
        self.logits[req.id] = {}
        return req

    def cover(self, req: Request, end: int, start: int = 0) -> None:
        while len(req.pages) * self.page_size < end:
            req.pages.append(self.free.pop())
        window = self.executor.sliding_window
        if self.executor.local_pool is not None:
            # as the scheduler does: local pages before the window of `start` go back first
            first = max(0, start - window + 1) // self.page_size
            while req.local_first < first and req.local_pages:
                self.local_free.append(req.local_pages.pop(0))
                req.local_first += 1
            req.local_first = max(req.local_first, first) if not req.local_pages \
                else req.local_first
            while (req.local_first + len(req.local_pages)) * self.page_size < end:
                req.local_pages.append(self.local_free.pop())

    def round(self, work: list[tuple[Request, int, int, bool]], phase: str = "prefill",
              use_run: bool = False) -> list[int | None]:
        """work: (request, start, num_tokens, sample). Appends sampled tokens (greedy)."""
        for req, start, n, _ in work:
            self.cover(req, start + n, start)
        items = tuple(BatchItem(r, s, n, smp) for r, s, n, smp in work)
        batch = Batch(phase, items)  # type: ignore[arg-type]
        if use_run:
            tokens = self.executor.run(batch)
        else:
            logits, rows = self.executor.compute_logits(batch)
            tokens = [None] * len(work)
            for row, i in enumerate(rows):
                req, start, n, _ = work[i]
                self.logits[req.id][start + n - 1] = logits[row].float().cpu()
                tokens[i] = int(logits[row].argmax())
        for (req, _, _, smp), tok in zip(work, tokens):
            if smp:
                assert tok is not None
                req.output_ids.append(tok)
        return tokens

    def prefill(self, reqs: list[Request]) -> None:
        self.round([(r, 0, r.prompt_len, True) for r in reqs])

    def decode(self, reqs: list[Request], steps: int) -> None:
        for _ in range(steps):
            self.round([(r, r.num_tokens - 1, 1, True) for r in reqs], "decode")

"""Token masks of constrained requests: computed while the forward pass runs, applied at sampling.

A round's constrained rows get their llguidance bitmasks filled on one worker thread started
before the forward (llguidance drops the GIL while it computes), joined before sampling, and
applied as -inf on those logits rows only; unconstrained rows are never touched. After
sampling, every sampled token is consumed by its request's matcher; a matcher that has
stopped (the grammar is complete) marks its request done, and the scheduler ends it (stop).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from engine.affinity import free_thread
from engine.execution.host import to_device
from engine.scheduling.request import Request


def _fill(matchers: list[Any], bitmask: torch.Tensor) -> list[float]:
    """Each matcher's next-token bitmask into its row of `bitmask` -> seconds per row."""
    row_bytes = bitmask.shape[1] * bitmask.element_size()
    base = bitmask.data_ptr()
    times = []
    for i, matcher in enumerate(matchers):
        t0 = time.perf_counter()
        matcher.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)
        times.append(time.perf_counter() - t0)
    return times


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bitmask int32 [R, ceil(V/32)] -> allowed bool [R, vocab] (bit j of word w: id 32w+j)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, words, 32]
    allowed = bits.reshape(bitmask.shape[0], -1).bool()
    if allowed.shape[1] >= vocab:
        return allowed[:, :vocab]
    pad = torch.zeros(bitmask.shape[0], vocab - allowed.shape[1], dtype=torch.bool,
                      device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)


@dataclass(slots=True)
class MaskJob:
    requests: list[Request]
    bitmask: torch.Tensor  # [R, words] int32, CPU
    future: Future[list[float]]

    def apply(self, logits: torch.Tensor, rows: Sequence[int]) -> None:
        """Wait for the masks, then -inf on the disallowed ids of logits[rows[i]] (request i)."""
        times = self.future.result()
        for req, seconds in zip(self.requests, times):
            req.mask_time = seconds
        # the packed words cross to the device (32 ids a word), then unpack there
        allowed = unpack(self.bitmask.to(logits.device), logits.shape[1])
        index = to_device(list(rows), torch.int64, logits.device)
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


class MaskWorker:
    def __init__(self, vocab_size: int) -> None:
        self.words = -(-vocab_size // 32)
        self._pool: ThreadPoolExecutor | None = None

    def start(self, requests: list[Request]) -> MaskJob | None:
        """Begin filling the masks of `requests` (None when there are none: nothing to pay)."""
        if not requests:
            return None
        if self._pool is None:
            # started by the engine's thread: not kept on that thread's core
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-masks",
                                            initializer=free_thread)
        bitmask = torch.zeros((len(requests), self.words), dtype=torch.int32, device="cpu")
        future = self._pool.submit(_fill, [r.matcher for r in requests], bitmask)
        return MaskJob(requests, bitmask, future)


def consume(requests: Sequence[Request], tokens: Sequence[int]) -> None:
    """Advance each constrained request's matcher by its sampled token."""
    for req, token in zip(requests, tokens):
        matcher: Any = req.matcher
        if matcher is None:
            continue
        matcher.consume_token(token)
        if matcher.is_stopped() or matcher.is_error():
            req.grammar_done = True

"""Engine metrics (docs/architecture.md), kept on the scheduler thread, read via snapshots."""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from engine.runtime.snapshot import MetricsView
from engine.scheduling.request import Request

# Prometheus-style bucket bounds in seconds, shared by the TTFT and ITL histograms.
LATENCY_BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                                      1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
# token-mask times of constrained requests: microseconds to milliseconds
MASK_BUCKETS: tuple[float, ...] = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                   1e-2, 2.5e-2, 0.1)
MASK_SAMPLES = 100_000  # recent mask times kept for the percentiles


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> tuple[tuple[float, int], ...]:
        out, acc = [], 0
        counts = self.counts or [0] * (len(self.bounds) + 1)
        for bound, count in zip((*self.bounds, float("inf")), counts):
            acc += count
            out.append((bound, acc))
        return tuple(out)


class Window:
    """Timed values in arrival order, kept sorted as well: the percentiles a view is built
    with every round are read off, not sorted (an insort and a drop move pointers in C)."""
    __slots__ = ("_arrived", "_maxlen", "_sorted")

    def __init__(self, maxlen: int | None = None) -> None:
        self._arrived: deque[tuple[float, float]] = deque()  # (time, value)
        self._sorted: list[float] = []
        self._maxlen = maxlen

    def __len__(self) -> int:
        return len(self._arrived)

    def add(self, when: float, value: float) -> None:
        self._arrived.append((when, value))
        bisect.insort(self._sorted, value)
        if self._maxlen is not None and len(self._arrived) > self._maxlen:
            self._drop_oldest()

    def drop_before(self, edge: float) -> None:
        while self._arrived and self._arrived[0][0] < edge:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, value = self._arrived.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]

    def percentiles(self, *qs: float) -> tuple[float | None, ...]:
        """values[int(q * n)] of the sorted values for each q; None for no values."""
        ordered, n = self._sorted, len(self._sorted)
        return tuple(ordered[min(n - 1, int(q * n))] if n else None for q in qs)


class MetricsRecorder:
    def __init__(self, window: float = 10.0, history_step: float = 5.0,
                 history_len: int = 72) -> None:
        self.window = window  # seconds for the rates and percentiles
        self.history_step = history_step  # one chart point per step (6 minutes by default)
        self.rounds: deque[tuple[float, int, int]] = deque()  # (time, output, prefill tokens)
        self._window_out = self._window_prefill = 0  # the tokens of self.rounds
        self.ttfts = Window()
        self.itls = Window()
        self.history: deque[tuple[float, float, float | None, float | None]] = deque(
            maxlen=history_len)
        self.ttft_hist = Histogram()
        self.itl_hist = Histogram()
        self.mask_hist = Histogram(MASK_BUCKETS)
        self.masks = Window(maxlen=MASK_SAMPLES)
        self.structured: dict[str, int] = {}  # constraint kind -> requests finished
        self.completed = self.cancelled = self.errors = self.rejected = 0
        self.output_total = self.prefill_total = 0
        # decoding: request-rounds, tokens they emitted; speculation: drafts made and kept
        self.decode_steps = self.decode_tokens = self.drafted = self.accepted = 0
        self._next_point = 0.0

    def on_round(self, now: float, output_tokens: int, prefill_tokens: int) -> None:
        self.rounds.append((now, output_tokens, prefill_tokens))
        self._window_out += output_tokens
        self._window_prefill += prefill_tokens
        self.output_total += output_tokens
        self.prefill_total += prefill_tokens

    def on_decode(self, emitted: int, drafted: int, accepted: int) -> None:
        """One decoding request's round: `emitted` tokens, `accepted` of `drafted` drafts."""
        self.decode_steps += 1
        self.decode_tokens += emitted
        self.drafted += drafted
        self.accepted += accepted

    def on_token(self, req: Request, now: float) -> None:
        if req.num_outputs == 1:
            ttft = now - req.arrival
            self.ttfts.add(now, ttft)
            self.ttft_hist.observe(ttft)
        elif req.itl is not None:
            self.itls.add(now, req.itl)
            self.itl_hist.observe(req.itl)

    def on_mask(self, seconds: float) -> None:
        """One constrained token's mask time (the last MASK_SAMPLES, whenever they came)."""
        self.mask_hist.observe(seconds)
        self.masks.add(0.0, seconds)

    def on_finish(self, req: Request) -> None:
        if req.params.constraint is not None:
            kind = req.params.constraint.kind
            self.structured[kind] = self.structured.get(kind, 0) + 1
        if req.finish_reason == "cancelled":
            self.cancelled += 1
        elif req.finish_reason == "error":
            self.errors += 1
        else:
            self.completed += 1

    def _trim(self, now: float) -> None:
        edge = now - self.window
        while self.rounds and self.rounds[0][0] < edge:
            _, out, prefill = self.rounds.popleft()
            self._window_out -= out
            self._window_prefill -= prefill
        self.ttfts.drop_before(edge)
        self.itls.drop_before(edge)

    def view(self, now: float) -> MetricsView:
        self._trim(now)
        span = self.window
        out_rate = self._window_out / span
        pre_rate = self._window_prefill / span
        ttft_p50, ttft_p95 = self.ttfts.percentiles(0.5, 0.95)
        itl_p50, itl_p95 = self.itls.percentiles(0.5, 0.95)
        mask_p50, mask_p99 = self.masks.percentiles(0.5, 0.99)
        if now >= self._next_point:  # a chart point every history_step seconds
            self.history.append((now, out_rate, ttft_p50, itl_p50))
            self._next_point = now + self.history_step
        return MetricsView(
            output_tokens_per_s=out_rate, prefill_tokens_per_s=pre_rate,
            ttft_p50=ttft_p50, ttft_p95=ttft_p95, itl_p50=itl_p50, itl_p95=itl_p95,
            completed=self.completed, cancelled=self.cancelled, errors=self.errors,
            rejected=self.rejected, output_tokens_total=self.output_total,
            prefill_tokens_total=self.prefill_total, history=tuple(self.history),
            ttft_buckets=self.ttft_hist.cumulative(), ttft_sum=self.ttft_hist.total,
            itl_buckets=self.itl_hist.cumulative(), itl_sum=self.itl_hist.total,
            mask_buckets=self.mask_hist.cumulative(), mask_sum=self.mask_hist.total,
            mask_p50=mask_p50, mask_p99=mask_p99,
            structured_requests=tuple(sorted(self.structured.items())),
            decode_steps=self.decode_steps, decode_tokens=self.decode_tokens,
            drafted_tokens=self.drafted, accepted_tokens=self.accepted)

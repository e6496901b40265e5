"""The gateway's own metrics (design.md §7 measured at the front): TTFT includes Ferry's queue
and the upstream's; ITL is the gap between stream chunks (one token each from vLLM, SGLang,
llama.cpp and Ferry)."""
from __future__ import annotations

import bisect
from collections import deque

from engine import MetricsView

BUCKETS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                              2.5, 5.0, 10.0, 20.0, 40.0, 80.0)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.total += value

    def cumulative(self) -> tuple[tuple[float, int], ...]:
        out, acc = [], 0
        for bound, count in zip((*BUCKETS, float("inf")), self.counts):
            acc += count
            out.append((bound, acc))
        return tuple(out)


class GatewayStats:
    def __init__(self, window: float = 10.0, history_step: float = 5.0) -> None:
        self.window = window
        self.history_step = history_step
        self.tokens: deque[float] = deque()  # time of each output chunk in the window
        self.ttfts: deque[tuple[float, float]] = deque()
        self.itls: deque[tuple[float, float]] = deque()
        self.history: deque[tuple[float, float, float | None, float | None]] = deque(maxlen=72)
        self.ttft_hist, self.itl_hist = Histogram(), Histogram()
        self.completed = self.cancelled = self.errors = self.rejected = 0
        self.output_total = self.prompt_total = 0
        self._next_point = 0.0

    def on_token(self, now: float, ttft: float | None, itl: float | None) -> None:
        self.tokens.append(now)
        self.output_total += 1
        if ttft is not None:
            self.ttfts.append((now, ttft))
            self.ttft_hist.observe(ttft)
        if itl is not None:
            self.itls.append((now, itl))
            self.itl_hist.observe(itl)

    def on_finish(self, reason: str, prompt_tokens: int) -> None:
        self.prompt_total += prompt_tokens
        if reason == "cancelled":
            self.cancelled += 1
        elif reason == "error":
            self.errors += 1
        else:
            self.completed += 1

    def view(self, now: float) -> MetricsView:
        edge = now - self.window
        while self.tokens and self.tokens[0] < edge:
            self.tokens.popleft()
        for q in (self.ttfts, self.itls):
            while q and q[0][0] < edge:
                q.popleft()
        rate = len(self.tokens) / self.window
        ttfts, itls = [v for _, v in self.ttfts], [v for _, v in self.itls]
        if now >= self._next_point:
            self.history.append((now, rate, percentile(ttfts, 0.5), percentile(itls, 0.5)))
            self._next_point = now + self.history_step
        return MetricsView(
            output_tokens_per_s=rate, prefill_tokens_per_s=0.0,
            ttft_p50=percentile(ttfts, 0.5), ttft_p95=percentile(ttfts, 0.95),
            itl_p50=percentile(itls, 0.5), itl_p95=percentile(itls, 0.95),
            completed=self.completed, cancelled=self.cancelled, errors=self.errors,
            rejected=self.rejected, output_tokens_total=self.output_total,
            prefill_tokens_total=self.prompt_total, history=tuple(self.history),
            ttft_buckets=self.ttft_hist.cumulative(), ttft_sum=self.ttft_hist.total,
            itl_buckets=self.itl_hist.cumulative(), itl_sum=self.itl_hist.total)

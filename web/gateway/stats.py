"""The gateway's own metrics (the engine's, measured at the front): TTFT includes Ferry's queue
and the upstream's; ITL is the gap between stream chunks (one token each from vLLM, SGLang,
llama.cpp and Ferry)."""
from __future__ import annotations

from collections import deque

from engine import Histogram, MetricsView, Window


class GatewayStats:
    def __init__(self, window: float = 10.0, history_step: float = 5.0) -> None:
        self.window = window
        self.history_step = history_step
        self.tokens: deque[float] = deque()  # time of each output chunk in the window
        self.ttfts, self.itls = Window(), Window()
        self.history: deque[tuple[float, float, float | None, float | None]] = deque(maxlen=72)
        self.ttft_hist, self.itl_hist = Histogram(), Histogram()
        self.completed = self.cancelled = self.errors = self.rejected = 0
        self.output_total = self.prompt_total = 0
        self._next_point = 0.0

    def on_token(self, now: float, ttft: float | None, itl: float | None) -> None:
        self.tokens.append(now)
        self.output_total += 1
        if ttft is not None:
            self.ttfts.add(now, ttft)
            self.ttft_hist.observe(ttft)
        if itl is not None:
            self.itls.add(now, itl)
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
        self.ttfts.drop_before(edge)
        self.itls.drop_before(edge)
        rate = len(self.tokens) / self.window
        ttft_p50, ttft_p95 = self.ttfts.percentiles(0.5, 0.95)
        itl_p50, itl_p95 = self.itls.percentiles(0.5, 0.95)
        if now >= self._next_point:
            self.history.append((now, rate, ttft_p50, itl_p50))
            self._next_point = now + self.history_step
        return MetricsView(
            output_tokens_per_s=rate, prefill_tokens_per_s=0.0,
            ttft_p50=ttft_p50, ttft_p95=ttft_p95, itl_p50=itl_p50, itl_p95=itl_p95,
            completed=self.completed, cancelled=self.cancelled, errors=self.errors,
            rejected=self.rejected, output_tokens_total=self.output_total,
            prefill_tokens_total=self.prompt_total, history=tuple(self.history),
            ttft_buckets=self.ttft_hist.cumulative(), ttft_sum=self.ttft_hist.total,
            itl_buckets=self.itl_hist.cumulative(), itl_sum=self.itl_hist.total)

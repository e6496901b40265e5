"""MetricsRecorder.view: the window's rates and percentiles, read off values kept sorted."""
from __future__ import annotations

import random

from engine.runtime.metrics import MetricsRecorder, Window


def test_view_percentiles_over_the_window() -> None:
    rec = MetricsRecorder(window=10.0)
    now = 100.0
    # ITLs 1..100 ms in shuffled order, inside the window; one older gap that the trim drops
    rec.itls.add(now - 11.0, 9.9)
    for i in (37, 2, 100, 55, 1, 99, 73, *range(3, 37), *range(38, 55), *range(56, 73),
              *range(74, 99)):
        rec.itls.add(now - 5.0 + i / 1000, i / 1000)
    for t in (0.5, 0.1, 0.3):
        rec.ttfts.add(now - 1.0, t)
    for m in (0.004, 0.001, 0.003, 0.002):
        rec.on_mask(m)
    view = rec.view(now)
    assert (view.itl_p50, view.itl_p95) == (0.051, 0.096)  # values[int(q * n)] of the sorted
    assert (view.ttft_p50, view.ttft_p95) == (0.3, 0.5)
    assert (view.mask_p50, view.mask_p99) == (0.003, 0.004)
    assert rec.history[-1][2:] == (0.3, 0.051)  # the chart point takes the same p50s


def test_view_of_an_empty_window_has_no_percentiles() -> None:
    view = MetricsRecorder().view(5.0)
    assert (view.itl_p50, view.itl_p95, view.ttft_p50, view.ttft_p95) == (None,) * 4
    assert (view.mask_p50, view.mask_p99) == (None, None)


def test_rates_count_the_rounds_inside_the_window() -> None:
    rec = MetricsRecorder(window=10.0)
    rec.on_round(1.0, 5, 100)
    rec.on_round(6.0, 7, 0)
    rec.on_round(12.0, 9, 50)
    view = rec.view(12.0)  # the round at 1.0 has left the window
    assert (view.output_tokens_per_s, view.prefill_tokens_per_s) == (1.6, 5.0)
    assert (view.output_tokens_total, view.prefill_tokens_total) == (21, 150)
    assert rec.view(30.0).output_tokens_per_s == 0.0


def test_window_matches_sorting_what_is_left() -> None:
    rng = random.Random(7)
    window, kept = Window(maxlen=50), []
    for t in range(400):
        value = rng.choice([rng.random(), 0.5])  # repeats: a drop takes one copy only
        window.add(float(t), value)
        kept.append((float(t), value))
        kept = kept[-50:]
        if t % 37 == 0:
            window.drop_before(t - 20.0)
            kept = [(w, v) for w, v in kept if w >= t - 20.0]
        ordered = sorted(v for _, v in kept)
        assert len(window) == len(kept)
        assert window.percentiles(0.0, 0.5, 0.99) == tuple(
            ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.0, 0.5, 0.99))

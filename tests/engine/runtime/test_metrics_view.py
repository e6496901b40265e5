"""MetricsRecorder.view: the window's percentiles, each list sorted once for all of them."""
from __future__ import annotations

from engine.runtime.metrics import MetricsRecorder


def test_view_percentiles_over_the_window() -> None:
    rec = MetricsRecorder(window=10.0)
    now = 100.0
    # ITLs 1..100 ms in shuffled order, inside the window; one older gap that the trim drops
    rec.itls.append((now - 11.0, 9.9))
    for i in (37, 2, 100, 55, 1, 99, 73, *range(3, 37), *range(38, 55), *range(56, 73),
              *range(74, 99)):
        rec.itls.append((now - 5.0 + i / 1000, i / 1000))
    rec.ttfts.extend([(now - 1.0, 0.5), (now - 1.0, 0.1), (now - 1.0, 0.3)])
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

"""Small server-rendered inline SVG charts for the dashboard (no JavaScript)."""
from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

Point = tuple[float, float | None]  # (time, value); None leaves a gap


def _nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= value."""
    if value <= 0:
        return 1.0
    base = 10.0 ** math.floor(math.log10(value))
    return next(m * base for m in (1, 2, 2.5, 5, 10) if value <= m * base * (1 + 1e-9))


def sparkline(points: Sequence[Point], now: float, span: float, label: str, unit: str,
              fmt: str = "{:.1f}", width: int = 280, height: int = 72) -> Markup:
    """An area chart of `points` over the last `span` seconds before `now`."""
    pad_top, pad_bottom = 14, 4
    inner = height - pad_top - pad_bottom
    values = [v for _, v in points if v is not None]
    top = _nice_max(max(values) if values else 0.0)
    segments: list[list[tuple[float, float]]] = [[]]
    for t, v in points:
        if v is None:
            if segments[-1]:
                segments.append([])
            continue
        x = width * (1 - min(max(now - t, 0.0), span) / span)
        y = pad_top + inner * (1 - min(v / top, 1.0))
        segments[-1].append((x, y))
    shapes = []
    base = pad_top + inner
    for seg in segments:
        if not seg:
            continue
        if len(seg) == 1:
            x, y = seg[0]
            shapes.append(f'<line x1="{x - 1.5:.1f}" x2="{x + 1.5:.1f}" y1="{y:.1f}" '
                          f'y2="{y:.1f}" class="line"/>')
            continue
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y in seg)
        area = f"{seg[0][0]:.1f},{base} {line} {seg[-1][0]:.1f},{base}"
        shapes.append(f'<polygon points="{area}" class="area"/>')
        shapes.append(f'<polyline points="{line}" class="line"/>')
    latest = next((v for _, v in reversed(points) if v is not None), None)
    current = fmt.format(latest) + unit if latest is not None else "–"
    grid = "".join(f'<line x1="0" x2="{width}" y1="{pad_top + inner * f:.1f}" '
                   f'y2="{pad_top + inner * f:.1f}" class="grid"/>' for f in (0, 0.5, 1))
    empty = "" if values else '<span class="chart-empty">no data yet</span>'
    return Markup(
        f'<figure class="chart"><figcaption><span>{escape(label)}</span>'
        f'<strong>{escape(current)}</strong></figcaption>'
        f'<div class="chart-plot"><span class="chart-top">{escape(fmt.format(top) + unit)}</span>'
        f'{empty}<svg viewBox="0 0 {width} {height}" width="100%" height="{height}" '
        f'preserveAspectRatio="none" role="img" aria-label="{escape(label)}">'
        f'{grid}{"".join(shapes)}</svg></div>'
        f'<div class="chart-x"><span>−{int(span // 60)} min</span><span>now</span></div>'
        f'</figure>')

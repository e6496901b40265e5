"""`ferry bench --structured-fraction F`: the same workload with a share of it under a JSON schema.

The schema asks for more array items than any reply can hold, so a constrained request, like
an unconstrained one with ignore_eos, makes exactly --output tokens: the two runs' output
tokens/s compare like for like. Every 1/F-th request is the constrained one, spread evenly.
"""
from __future__ import annotations

from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["words"], "additionalProperties": False,
    "properties": {"words": {"type": "array", "minItems": 10_000,
                             "items": {"type": "string", "maxLength": 12}}}}


def constrained_indices(requests: int, fraction: float) -> set[int]:
    """Which of `requests` run under the schema (round(requests * fraction), evenly spread)."""
    count = round(requests * fraction)
    if count <= 0:
        return set()
    return {int(i * requests / count) for i in range(count)}


def constraint() -> Any:
    from engine import structured

    return structured.json_schema(SCHEMA)


def mask_percentiles(engine: Any) -> tuple[float | None, float | None]:
    """Recent per-token mask time p50 / p99 in microseconds (None without constrained tokens)."""
    m = engine.snapshot().metrics

    def us(v: float | None) -> float | None:
        return None if v is None else round(v * 1e6, 1)

    return us(m.mask_p50), us(m.mask_p99)

"""The JSON depth guard: the depth it reads, against a recursive walk of valid JSON, and its
time on hostile bodies (it runs on the event loop before every API body is decoded)."""
from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from web.api.guards import json_depth

MiB = 1 << 20


def nesting(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    return 0


def random_json(rng: random.Random, level: int = 0) -> Any:
    roll = rng.random()
    if level > 6 or roll < 0.3:  # strings full of what could fool a scanner
        return "".join(rng.choice('ab[]{}"\\\n/') for _ in range(rng.randrange(8)))
    if roll < 0.65:
        return [random_json(rng, level + 1) for _ in range(rng.randrange(4))]
    return {random_json(rng, 9): random_json(rng, level + 1) for _ in range(rng.randrange(4))}


def test_depth_matches_a_walk_of_the_decoded_value() -> None:
    rng = random.Random(37)
    for _ in range(2000):
        value = random_json(rng)
        for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
            assert json_depth(text.encode()) == nesting(value), text


@pytest.mark.parametrize("text, depth", [
    ("", 0), ("{}", 1), ("[1,[2,[3]]]", 3), ('{"a": "[[[", "b": ["\\"[", "]"]}', 2),
    ('"\\\\"[[', 2),  # the string holds one backslash: its quote closes it
    ('"[[[', 0),  # an unterminated string: msgspec stops in it
    ("[[[[", 4),  # unbalanced: msgspec would recurse before it sees the end
])
def test_depth_of_edge_cases(text: str, depth: int) -> None:
    assert json_depth(text.encode()) == depth


@pytest.mark.parametrize("body", [
    b'"' + b'\\"' * (MiB // 2),  # escaped quotes: the regex this replaced took 3 s on 31 KB
    b'["' + b"\\" * MiB,
    b'"' * MiB,
    b"[" * MiB,
    b'"[' * (MiB // 2),
    b'["\\' * (MiB // 3),
])
def test_depth_is_linear_on_a_hostile_megabyte(body: bytes) -> None:
    started = time.perf_counter()
    json_depth(body)
    assert time.perf_counter() - started < 0.25  # milliseconds; the bound allows a busy machine

"""A large run through `ferry simulate --summary` completes and every request ends.

Deliberately not a timing test: only that the run finishes (pytest's timeout guards a hang).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine.sim.simulator import cli

N = 2000


def _scenario() -> dict:
    rng = random.Random(2000)
    systems = [list(range(1000 * s, 1000 * s + 64)) for s in range(1, 5)]
    requests = []
    for i in range(N):
        req = {"id": f"r{i}", "arrive": round(i * 0.25 + rng.random(), 2),
               "output": rng.randint(1, 64), "user": rng.choice("abcd")}
        if i % 3 == 0:
            tail = [rng.randrange(50) for _ in range(rng.randint(1, 40))]
            req["prompt_ids"] = rng.choice(systems) + tail
        else:
            req["prompt"] = rng.randint(1, 300)
        if i % 17 == 0:
            req["eos_at"] = rng.randint(1, 30)
        if i % 97 == 0:
            req["cancel_at"] = req["arrive"] + rng.randint(0, 20)
        requests.append(req)
    return {"about": "2,000 requests, 64 slots",
            "engine": {"max_running": 64, "max_prefill_tokens": 512, "kv_tokens": 32768,
                       "page_size": 16, "prefix_cache": True, "admission": "fair"},
            "requests": requests}


@pytest.mark.parametrize("policy", ["prefill-first", "mixed"])
def test_two_thousand_requests_summary(policy: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = _scenario()
    path = tmp_path / "large.json"
    path.write_text(json.dumps(data))
    assert cli([str(path), "--summary", "--policy", policy]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    result = json.loads(captured.out)
    assert set(result) == {"rounds", "requests"}
    assert isinstance(result["rounds"], int) and result["rounds"] > 0
    assert len(result["requests"]) == N
    for spec in data["requests"]:
        got = result["requests"][spec["id"]]
        assert got["finish_reason"] in ("length", "stop", "cancelled"), (spec, got)
        assert got["finish_round"] is not None
        assert 0 <= got["output_tokens"] <= spec["output"]
        if got["finish_reason"] == "length":
            assert got["output_tokens"] == spec["output"]
        elif got["finish_reason"] == "stop":
            assert got["output_tokens"] == spec["eos_at"]

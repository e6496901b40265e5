"""Why a request waits: the reason codes and texts, as the simulator's JSON reports them."""
from __future__ import annotations

from sched_helpers import prefix_scenario, round_at, sim


# -- wait reasons in the simulator's JSON ----------------------------------------------------
def _reasons(result: dict, rid: str) -> list[dict]:
    return [r["waiting_reasons"][rid] for r in result["rounds"] if rid in r["waiting_reasons"]]


def test_wait_reason_codes_in_json() -> None:
    slot = sim({"max_running": 1, "max_prefill_tokens": 64, "kv_tokens": 1000, "page_size": 1,
                "prefix_cache": False},
               [{"id": "A", "prompt": 3, "output": 3}, {"id": "B", "prompt": 2, "output": 1},
                {"id": "C", "prompt": 2, "output": 1}])
    b, c = _reasons(slot, "B")[0], _reasons(slot, "C")[0]
    assert b["code"] == "slot" and "slot" in b["text"]
    assert c["code"] == "behind" and "B" in c["text"]

    kv = prefix_scenario(list(range(200, 220)))
    reason = round_at(kv, 1)["waiting_reasons"]["B"]
    assert reason["code"] == "kv" and "KV" in reason["text"] and "available" in reason["text"]

    chunk = sim({"max_running": 3, "max_prefill_tokens": 1024, "kv_tokens": 100000,
                 "page_size": 1, "prefix_cache": False},
                [{"id": "B", "prompt": 10, "output": 5},
                 {"id": "C", "arrive": 0.5, "prompt": 2500, "output": 2},
                 {"id": "D", "arrive": 0.5, "prompt": 5, "output": 1}])
    r1 = round_at(chunk, 1)
    assert r1["batch"] == [{"id": "C", "tokens": 1024}]
    assert r1["waiting"] == ["C", "D"]
    assert r1["waiting_reasons"]["C"]["code"] == "chunk"
    assert "2 of 3" in r1["waiting_reasons"]["C"]["text"]
    assert "1024 of 2500" in r1["waiting_reasons"]["C"]["text"]
    assert r1["waiting_reasons"]["D"]["code"] == "budget"
    assert "1024" in r1["waiting_reasons"]["D"]["text"]
    # D gets the budget C's last chunk leaves (1024 - 452).
    r3 = round_at(chunk, 3)
    assert r3["batch"] == [{"id": "C", "tokens": 452}, {"id": "D", "tokens": 5}]
    for result in (slot, kv, chunk):
        for r in result["rounds"]:
            assert set(r["waiting_reasons"]) == set(r["waiting"])
            for reason in r["waiting_reasons"].values():
                assert reason["text"].strip(), reason


def test_kv_reason_says_its_own_need_and_the_reservations_apart() -> None:
    """FERRY_KV_TOKENS=1024's case: a request needing ~242 positions waits behind others'
    reservations; the text must not call the sum its need."""
    result = sim({"max_running": 4, "max_prefill_tokens": 512, "kv_tokens": 1024,
                  "page_size": 16, "prefix_cache": False},
                 [{"id": "A", "prompt": 40, "output": 800},
                  {"id": "B", "arrive": 0.5, "prompt": 43, "output": 185}])
    reason = round_at(result, 1)["waiting_reasons"]["B"]
    own = 43 + 185 + 15  # uncached prompt + max output + page slack
    reserved = 800 - 2 + 15  # A after rounds 0 and 1: output still to write + page slack
    available = 1024 - 48  # A holds three pages of 16
    assert reason["code"] == "kv"
    assert reason["text"].startswith(f"needs {own} KV positions, {available - reserved} free ")
    assert f"{reserved} of them reserved for admitted requests" in reason["text"]
    assert f"{own + reserved} asked in all" in reason["text"]


def test_behind_says_behind_once() -> None:
    result = sim({"max_running": 1, "max_prefill_tokens": 64, "kv_tokens": 1000, "page_size": 1,
                  "prefix_cache": False},
                 [{"id": "A", "prompt": 3, "output": 3}, {"id": "B", "prompt": 2, "output": 1},
                  {"id": "C", "prompt": 2, "output": 1}])
    assert _reasons(result, "C")[0] == {"code": "behind", "text": "behind B"}

"""The simulator reproduces speculative rounds: a request's `accept` script says how many
drafts the target keeps in each of its speculative rounds; the real scheduler, drafter policy
(adaptive length) and KV accounting do the rest. Expected figures derived by hand."""
from __future__ import annotations

import pytest

from engine.sim.scenario import ScenarioError, parse
from engine.sim.simulator import simulate

ENGINE = {"max_running": 2, "max_prefill_tokens": 64, "kv_tokens": 64, "page_size": 4}


def run(requests: list[dict], **engine: object) -> dict:
    return simulate(parse({"engine": {**ENGINE, **engine}, "requests": requests}))


def test_speculative_rounds_reserve_and_return_pages() -> None:
    result = run([{"id": "A", "prompt": 6, "output": 12, "accept": [4, 0, 2]}])
    rows = [(r["batch"][0], r["outputs"]["A"], r["kv_used"]) for r in result["rounds"]]
    assert rows == [
        ({"id": "A", "tokens": 6}, 1, 8),  # prefill: 2 pages (the first cached, locked)
        # length 4 (the policy's start): all 4 kept, 5 tokens; 11 positions -> 3 pages
        ({"id": "A", "tokens": 5, "drafts": 4, "accepted": 4, "emitted": 5}, 6, 12),
        # length 5 after a full run; none kept: pages for 17 positions taken, 3 kept
        ({"id": "A", "tokens": 6, "drafts": 5, "accepted": 0, "emitted": 1}, 7, 12),
        # length 1 after a miss; the script's 2 is capped at the 1 drafted
        ({"id": "A", "tokens": 2, "drafts": 1, "accepted": 1, "emitted": 2}, 9, 16),
        ({"id": "A", "tokens": 1}, 10, 16),  # the script is done: plain decoding
        ({"id": "A", "tokens": 1}, 11, 16),
        ({"id": "A", "tokens": 1}, 12, 0),
    ]
    assert result["requests"]["A"]["finish_reason"] == "length"


def test_eos_inside_a_kept_run_ends_the_request_there() -> None:
    result = run([{"id": "B", "prompt": 6, "output": 12, "eos_at": 4, "accept": [4]}])
    spec = result["rounds"][1]["batch"][0]
    assert spec == {"id": "B", "tokens": 5, "drafts": 4, "accepted": 4, "emitted": 3}
    assert result["requests"]["B"] == {"first_token_round": 0, "finish_round": 1,
                                       "finish_reason": "stop", "output_tokens": 4}


def test_drafts_end_where_max_tokens_leaves_no_room() -> None:
    """Output 4: after the first token, at most 4 - 1 - 1 = 2 drafts."""
    result = run([{"id": "C", "prompt": 6, "output": 4, "accept": [9, 9]}])
    assert result["rounds"][1]["batch"][0] == {"id": "C", "tokens": 3, "drafts": 2,
                                               "accepted": 2, "emitted": 3}
    assert result["requests"]["C"]["output_tokens"] == 4
    assert len(result["rounds"]) == 2


def test_off_and_large_batches_do_not_speculate() -> None:
    reqs = [{"id": f"R{i}", "prompt": 4, "output": 6, "accept": [3, 3]} for i in range(3)]
    for result in (run(reqs, speculative="off"), run(reqs, max_running=3, speculative_batch=2)):
        assert all("drafts" not in b for r in result["rounds"] for b in r["batch"])
        assert all(q["output_tokens"] == 6 for q in result["requests"].values())


@pytest.mark.parametrize("bad", [3, [1, -1], [1.5], [True], "2"])
def test_accept_must_be_a_list_of_counts(bad: object) -> None:
    with pytest.raises(ScenarioError, match="accept"):
        parse({"requests": [{"id": "A", "prompt": 4, "output": 4, "accept": bad}]})

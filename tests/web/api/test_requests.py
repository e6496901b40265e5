"""GET and DELETE /v1/requests/{id} say the same thing about a request, during and after it:
the state a DELETE answers is what a later GET reports, the prompt's progress never exceeds
the prompt, and an ended request has its total time.

A stand-in executor replaces the model (one round per 20 ms): these tests are about what the
endpoints report.
"""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from engine import SamplingParams
from web.access.users import LOCAL_USER

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(make_server: Any, stand_in: Any) -> Any:
    return make_server(executor=stand_in(0.02), max_running=2, max_prefill_tokens=32)


def body(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Count to a hundred."}],
            "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}


def test_progress_stays_within_the_prompt_and_total_is_set_at_the_end(
        server: Any, waiter: Any, idle_check: Any) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body(60, True),
                      timeout=60) as response:
        rid = response.headers["x-request-id"]
        lines = response.iter_lines()
        next(line for line in lines if '"content":"' in line and '"content":""' not in line)
        decoding = waiter(lambda: (i := httpx.get(f"{server.url}/v1/requests/{rid}").json())[
            "output_tokens"] >= 10 and i, 20, message="ten tokens out")
        assert decoding["state"] == "running"
        assert decoding["prefill_done"] == decoding["prompt_tokens"] > 0  # not + outputs
        assert decoding["timings"]["total"] is None
        list(lines)
    done = httpx.get(f"{server.url}/v1/requests/{rid}").json()
    assert done["state"] == "finished" and done["finish_reason"] == "length"
    assert done["prefill_done"] == done["prompt_tokens"]
    total = done["timings"]["total"]
    assert total is not None and total >= done["timings"]["ttft"] > 0
    idle_check(server.engine)


def test_total_is_set_for_an_ended_request_nobody_read_to_the_end(server: Any, waiter: Any,
                                                                  idle_check: Any) -> None:
    """The engine's finished view (no consumer took the final event) carries the total too."""
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    handle = server.services.submit(LOCAL_USER, [1, 2, 3, 4, 5], params, "api")
    waiter(lambda: server.engine.handle(handle.id) is None, 20, message="it ends")
    info = waiter(lambda: (i := httpx.get(f"{server.url}/v1/requests/{handle.id}").json())[
        "state"] == "finished" and i, 10, message="a finished view")
    assert handle.final is None  # nobody consumed its events
    assert info["timings"]["total"] is not None and info["timings"]["total"] > 0
    assert info["prefill_done"] <= info["prompt_tokens"] == 5
    idle_check(server.engine)


def test_delete_answers_what_a_later_get_says(server: Any, idle_check: Any) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body(400, True),
                      timeout=60) as response:
        rid = response.headers["x-request-id"]
        lines = response.iter_lines()
        next(line for line in lines if '"content":"' in line and '"content":""' not in line)
        cancelled = httpx.delete(f"{server.url}/v1/requests/{rid}", timeout=30).json()
        assert cancelled == {"id": rid, "cancelled": True, "state": "finished"}
        later = httpx.get(f"{server.url}/v1/requests/{rid}").json()  # before the stream's end
        assert later["state"] == cancelled["state"] and later["finish_reason"] == "cancelled"
        assert later["output_tokens"] < 400 and later["timings"]["total"] is not None
        list(lines)
    again = httpx.get(f"{server.url}/v1/requests/{rid}").json()
    assert again["state"] == "finished" and again["finish_reason"] == "cancelled"
    assert httpx.delete(f"{server.url}/v1/requests/{rid}").json() == {
        "id": rid, "cancelled": False, "state": "finished"}
    idle_check(server.engine)


def test_delete_of_a_waiting_request(server: Any, waiter: Any, idle_check: Any) -> None:
    """Both slots busy: the third request waits; DELETE ends it in the queue."""
    streams = [httpx.stream("POST", server.url + "/v1/chat/completions", json=body(400, True),
                            timeout=60) for _ in range(3)]
    responses = [s.__enter__() for s in streams]
    try:
        ids = [r.headers["x-request-id"] for r in responses]
        waiting = waiter(lambda: next((v.id for v in server.engine.snapshot().waiting
                                       if v.id in ids), None), 10, message="one waits")
        answer = httpx.delete(f"{server.url}/v1/requests/{waiting}", timeout=30).json()
        assert answer == {"id": waiting, "cancelled": True, "state": "finished"}
        info = httpx.get(f"{server.url}/v1/requests/{waiting}").json()
        assert info["state"] == "finished" and info["output_tokens"] == 0
        assert info["prefill_done"] == 0
        for rid in ids:
            httpx.delete(f"{server.url}/v1/requests/{rid}", timeout=30)
    finally:
        for s in streams:
            s.__exit__(None, None, None)
    idle_check(server.engine)

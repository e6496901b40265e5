"""OpenAI's shape: GET /v1/models/{id}, `object` fields, finish reasons in OpenAI's words,
n > 1 (streaming and not), and clear 400s for an out-of-range seed and deep nesting; against
the real server and model, through the `openai` client where it fits."""
from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
MAX_RUNNING, MAX_WAITING = 4, 4


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=MAX_RUNNING, max_waiting=MAX_WAITING)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return dict(error)


def sse(r: httpx.Response) -> list[dict[str, Any]]:
    lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_model_by_id(server: Any, client: openai.OpenAI) -> None:
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    assert card.model_dump()["max_model_len"] == 2048
    error = error_of(httpx.get(server.url + "/v1/models/no-such-model"), 404)
    assert error["code"] == "model_not_found" and "no-such-model" in error["message"]
    error_of(httpx.get(server.url + "/v1/models/org/no-such-model"), 404)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_object_fields(server: Any, client: openai.OpenAI, idle_check: Any) -> None:
    done = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
    assert done.object == "text_completion"
    done_chat = client.chat.completions.create(model=MODEL, messages=chat("Hi"), max_tokens=3)
    assert done_chat.object == "chat.completion"
    chunks = list(client.chat.completions.create(model=MODEL, messages=chat("Hi"),
                                                 max_tokens=3, stream=True))
    assert chunks and {c.object for c in chunks} == {"chat.completion.chunk"}
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 3,
            "stream": True}) as r:
        assert {c["object"] for c in sse(r)} == {"text_completion"}
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] in ("stop", "length") and set(reasons[:-1]) == {None}
    idle_check(server.engine)


def test_cancelled_reports_stop_with_ferrys_reason(server: Any, idle_check: Any,
                                                   long_stream: Any) -> None:
    with long_stream(server.url, MODEL) as (rid, lines):
        assert httpx.delete(f"{server.url}/v1/requests/{rid}").json()["cancelled"] is True
        chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    end = chunks[-1]["choices"][0]
    assert end["finish_reason"] == "stop" and end["ferry_finish_reason"] == "cancelled"
    idle_check(server.engine)


def test_n_choices(server: Any, client: openai.OpenAI, idle_check: Any) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "My favourite animal is the",
                              "max_tokens": 6, "temperature": 1.0, "seed": 11, "n": 3,
                              "extra_body": {"ignore_eos": True}}
    done = client.completions.create(**kwargs)
    assert [c.index for c in done.choices] == [0, 1, 2]
    texts = [c.text for c in done.choices]
    assert len(set(texts)) > 1, texts  # seeds 11, 12, 13: different samples
    assert done.usage.completion_tokens == 18
    assert done.usage.total_tokens == done.usage.prompt_tokens + 18
    assert [c.text for c in client.completions.create(**kwargs).choices] == texts  # seeded

    streamed: dict[int, str] = {}
    finished: dict[int, str | None] = {}
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert [streamed[i] for i in range(3)] == texts
    assert finished == {0: "length", 1: "length", 2: "length"}

    messages = chat("Name a colour.")
    chat_done = client.chat.completions.create(model=MODEL, messages=messages, n=2,
                                               max_tokens=5, temperature=0)
    assert [c.index for c in chat_done.choices] == [0, 1]
    assert chat_done.choices[0].message.content == chat_done.choices[1].message.content
    parts: dict[int, str] = {}
    roles = set()
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, n=2,
                                                max_tokens=5, temperature=0, stream=True):
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
            if c.delta.role:
                roles.add(c.index)
    assert roles == {0, 1}
    assert parts == {0: chat_done.choices[0].message.content,
                     1: chat_done.choices[1].message.content}
    idle_check(server.engine)


def test_n_counts_against_the_queue_bounds(server: Any, idle_check: Any) -> None:
    """n requests are n engine requests: more than the queue holds is refused, and the
    choices already queued are withdrawn."""
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "Hello", "max_tokens": 4, "n": MAX_RUNNING + MAX_WAITING + 1})
    error = error_of(r, 429)
    assert error["code"] == "queue_full"
    idle_check(server.engine)
    error_of(httpx.post(server.url + "/v1/completions", json={
        "model": MODEL, "prompt": "Hello", "n": 17}), 400)
    error_of(httpx.post(server.url + "/v1/completions", json={
        "model": MODEL, "prompt": "Hello", "n": 0}), 400)


def test_n_counts_against_the_per_user_limit(make_server: Any,
                                             tmp_path_factory: pytest.TempPathFactory,
                                             idle_check: Any, waiter: Any) -> None:
    from web.access.users import UserStore
    data = tmp_path_factory.mktemp("shared")
    token = UserStore(data / "users.json").add("bob")
    shared = make_server(data_dir=data, max_running=4,
                         web={"shared": True, "per_user_limit": 2})
    bob = httpx.Client(base_url=shared.url, timeout=60,
                       headers={"Authorization": f"Bearer {token}"})
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
    # more choices than the limit could ever hold: a 400 that says so, not a retryable 429
    error = error_of(bob.post("/v1/completions", json={**body, "n": 3}), 400)
    assert error["param"] == "n" and "per_user_limit (2)" in error["message"]
    # with one of bob's requests running, n=2 does not fit now: 429, and the choice that
    # fitted is withdrawn
    from engine import SamplingParams
    held = shared.engine.submit([1, 2, 3], SamplingParams(max_tokens=1000, ignore_eos=True),
                                owner="bob", owner_limit=2)
    error = error_of(bob.post("/v1/completions", json={**body, "n": 2}), 429)
    assert "bob" in error["message"]
    waiter(lambda: shared.engine.live_ids(owner="bob") == [held.id], 10,
           message="the choice that fitted withdrawn")
    held.cancel()
    idle_check(shared.engine)
    done = bob.post("/v1/completions", json={**body, "n": 2})
    assert done.status_code == 200 and len(done.json()["choices"]) == 2
    idle_check(shared.engine)


def test_disconnect_cancels_every_choice(server: Any, waiter: Any, idle_check: Any) -> None:
    before = server.engine.snapshot().metrics.cancelled
    body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 400,
            "ignore_eos": True, "stream": True, "n": 3}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        seen = set()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.update(c["index"] for c in json.loads(line[6:])["choices"])
            if len(seen) == 3:
                break  # leave with all three running
    waiter(lambda: server.engine.snapshot().metrics.cancelled - before >= 3,
           message="three cancels")
    idle_check(server.engine)


def test_seed_out_of_range_is_400(server: Any, client: openai.OpenAI, idle_check: Any) -> None:
    for seed in (18446744073709551616, -(2 ** 63) - 1, 10 ** 40):
        for path, body in (("/v1/completions", {"prompt": "Hi"}),
                           ("/v1/chat/completions", {"messages": chat("Hi")})):
            r = httpx.post(server.url + path, timeout=30,
                           json={"model": MODEL, "max_tokens": 2, "seed": seed, **body})
            error = error_of(r, 400)
            assert error["param"] == "seed" and "seed" in error["message"]
    for seed in (2 ** 64 - 1, -(2 ** 63), 0):  # the range torch.Generator takes
        done = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, seed=seed,
                                         temperature=1.0)
        assert done.choices[0].finish_reason in ("stop", "length")
    assert server.engine.last_error is None
    idle_check(server.engine)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions",
                                  "/v1/engine/policy"])
def test_deep_nesting_is_400(server: Any, path: str, idle_check: Any) -> None:
    depth = 100_000
    body = f'{{"model": "{MODEL}", "prompt": {"[" * depth}{"]" * depth}}}'
    r = httpx.post(server.url + path, content=body, timeout=30,
                   headers={"content-type": "application/json"})
    error = error_of(r, 400)
    assert "deep" in error["message"] and error["code"] == "too_deep"
    # brackets inside strings are text, not nesting
    text = json.dumps({"model": MODEL, "prompt": "[" * 500, "max_tokens": 1})
    assert httpx.post(server.url + "/v1/completions", content=text, timeout=30,
                      headers={"content-type": "application/json"}).status_code == 200
    idle_check(server.engine)

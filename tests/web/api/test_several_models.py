"""Several models in one server, through the API: /v1/models lists each (loaded or not),
`model` routes a request to its model (loading it first, with the `loading` wait reason),
an unknown model is a 404 naming the known ones, keep_alive unloads."""
from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.model
PROMPT = [{"role": "user", "content": "What is the capital of Germany?"}]


@pytest.fixture(scope="module")
def server(make_models_server: Any) -> Any:
    return make_models_server(("alpha", "beta"), max_running=4)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def states(server: Any) -> dict[str, str]:
    return {m["id"]: m["state"] for m in httpx.get(server.url + "/v1/models").json()["data"]}


def wait_for(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_models_lists_every_configured_model(server: Any, client: openai.OpenAI) -> None:
    cards = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert list(cards) == ["alpha", "beta"]
    alpha, beta = cards["alpha"], cards["beta"]
    assert alpha["loaded"] and alpha["default"] and alpha["architecture"] == "llama"
    assert alpha["runs"] and alpha["size"] > 50_000_000
    assert not beta["loaded"] and beta["state"] == "unloaded" and not beta["default"]
    assert beta["size"] > 50_000_000 and beta["keep_alive"] == 300
    assert [m.id for m in client.models.list()] == ["alpha", "beta"]
    assert httpx.get(server.url + "/v1/models/beta").json()["id"] == "beta"
    missing = httpx.get(server.url + "/v1/models/gamma")
    assert missing.status_code == 404 and "'alpha', 'beta'" in missing.json()["error"]["message"]


def test_unknown_model_is_404_listing_the_known(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gamma", messages=PROMPT, max_tokens=4)
    body = err.value.response.json()["error"]
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert "'alpha', 'beta'" in body["message"]


def test_bad_keep_alive_is_400(server: Any) -> None:
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"model": "beta", "messages": PROMPT, "keep_alive": "soon"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "keep_alive"


def test_request_for_unloaded_model_waits_loading_then_runs(server: Any) -> None:
    """beta is not loaded: the request is accepted at once, /v1/requests shows it waiting with
    the reason `loading`, then it streams; keep_alive 0 unloads beta once done."""
    assert states(server)["beta"] == "unloaded"
    body = {"model": "beta", "messages": PROMPT, "max_tokens": 12, "temperature": 0,
            "stream": True, "keep_alive": 0}
    seen: list[dict[str, Any]] = []
    text = ""
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=120) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        info = httpx.get(f"{server.url}/v1/requests/{rid}").json()
        seen.append(info)
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert chunk["model"] == "beta"
                text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
    first = seen[0]
    assert first["state"] == "waiting" and first["model"] == "beta"
    assert first["reason"]["code"] == "loading"
    assert first["reason"]["text"].startswith("loading beta, ")
    assert "Berlin" in text
    wait_for(lambda: states(server)["beta"] == "unloaded")  # keep_alive 0


def test_default_and_named_models_answer_alike(server: Any, client: openai.OpenAI) -> None:
    """A missing model is the default; both models (the same weights) answer the same."""
    by_default = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": PROMPT, "max_tokens": 12, "temperature": 0}).json()
    assert by_default["model"] == "alpha"
    beta = client.completions.create(model="beta", prompt="The capital of France is",
                                     max_tokens=6, temperature=0)
    alpha = client.completions.create(model="alpha", prompt="The capital of France is",
                                      max_tokens=6, temperature=0)
    assert beta.model == "beta" and beta.choices[0].text == alpha.choices[0].text
    assert states(server)["beta"] == "loaded"  # the default keep_alive (5 min) keeps it
    snap = server.engine.snapshot()
    assert not snap.waiting and not snap.running
    assert server.engine.wait_idle(10)

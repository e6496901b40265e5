"""Ollama's /api/* through the official ollama client with the default model: list, show,
ps, chat (whole and streamed: the same greedy text as /v1/chat/completions), generate with
format=json, and Ollama-shaped 400s and 501s naming the field."""
from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import openai
import pytest

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0, "num_predict": 24, "num_ctx": 2048}  # num_ctx: ignored


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=4)


@pytest.fixture(scope="module")
def client(server: Any) -> ollama.Client:
    return ollama.Client(host=server.url)


def chat_text(server: Any, messages: list[dict[str, Any]], max_tokens: int) -> str:
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    reply = oa.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                       max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content or ""


def test_list_show_ps_version(server: Any, client: ollama.Client) -> None:
    listed = client.list()
    assert [m.model for m in listed.models] == [f"{MODEL}:latest"]
    shown = client.show(f"{MODEL}:latest")
    assert shown.capabilities and "completion" in shown.capabilities
    assert client.show(MODEL).modelinfo == shown.modelinfo  # the tag is optional
    running = client.ps()
    assert [m.model for m in running.models] == [f"{MODEL}:latest"]
    assert running.models[0].context_length == server.services.context_limit
    assert httpx.get(f"{server.url}/api/version").json()["version"]


def test_chat_matches_chat_completions(server: Any, client: ollama.Client) -> None:
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "Name three colours."}]
    reply = client.chat(model=f"{MODEL}:latest", messages=messages, options=GREEDY,
                        stream=False)
    assert reply.done and reply.done_reason in ("stop", "length")
    assert reply.message.role == "assistant"
    assert reply.message.content == chat_text(server, messages, 24)
    assert reply.prompt_eval_count and reply.eval_count and reply.eval_count <= 24
    streamed = list(client.chat(model=MODEL, messages=messages, options=GREEDY, stream=True))
    assert all(not p.done for p in streamed[:-1]) and streamed[-1].done
    assert "".join(p.message.content or "" for p in streamed) == reply.message.content
    assert streamed[-1].eval_count == reply.eval_count


def test_generate_with_format_json(client: ollama.Client) -> None:
    reply = client.generate(model=MODEL, prompt="Describe a cat as JSON.", format="json",
                            options={"temperature": 0, "num_predict": 60}, stream=False)
    text = reply.response or ""
    assert reply.done and text.lstrip().startswith("{")
    if reply.done_reason == "stop":  # whole: it parses (cut at num_predict, it cannot)
        assert isinstance(json.loads(text), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}},
              "required": ["name"], "additionalProperties": False}
    shaped = client.generate(model=MODEL, prompt="Name a cat.", format=schema,
                             options={"temperature": 0, "num_predict": 40}, stream=False)
    assert set(json.loads(shaped.response or "")) == {"name"}
    pieces: list[Any] = list(client.generate(model=MODEL, prompt="Name a cat.", format=schema,
                                             options={"temperature": 0, "num_predict": 40},
                                             stream=True))
    assert "".join(p.response for p in pieces) == shaped.response
    loaded = client.generate(model=MODEL, prompt="")  # an empty prompt only loads it
    assert loaded.done and loaded.done_reason == "load"


def test_request_appears_with_its_endpoint(server: Any) -> None:
    r = httpx.post(f"{server.url}/api/chat", json={
        "model": MODEL, "stream": False, "options": {"num_predict": 2},
        "messages": [{"role": "user", "content": "hi"}]})
    info = httpx.get(f"{server.url}/v1/requests/{r.headers['x-request-id']}").json()
    assert info["endpoint"] == "/api/chat"


def test_errors_are_ollama_shaped(server: Any, client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                    options={"mirostat": 2})
    assert err.value.status_code == 400 and "options.mirostat" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 404
    r = httpx.post(f"{server.url}/api/chat", json={"model": MODEL, "messages": [
        {"role": "user", "content": "hi", "images": ["aGk="]}]})
    # images to a text model: refused, naming it (a vision model takes them: test_vision_api)
    assert r.status_code == 400 and "takes no images" in r.json()["error"]
    r = httpx.post(f"{server.url}/api/chat", json={"model": MODEL, "messages": [
        {"role": "user", "content": "hi"}], "options": {"num_predict": 10**9}})
    assert r.status_code == 400 and r.json()["error"].startswith("options.num_predict")
    r = httpx.post(f"{server.url}/api/generate", json={"model": MODEL, "prompt": "hi",
                                                       "format": "yaml"})
    assert r.status_code == 400 and r.json()["error"].startswith("format")
    with pytest.raises(ollama.ResponseError) as err:
        client.pull(MODEL)
    assert err.value.status_code == 501
    r = httpx.request("DELETE", f"{server.url}/api/delete", json={"model": MODEL})
    assert r.status_code == 501 and "error" in r.json()

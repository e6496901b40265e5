"""echo + logprobs on /v1/completions and logprobs + top_logprobs on /v1/chat/completions,
against the real server and model; numbers checked against Hugging Face transformers on the
same weights, streams against non-streamed answers, prefix-cache hits against misses."""
from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
TEXT = ("The river ran past the old mill, where the miller's daughter sat counting sacks of "
        "flour. Every morning the carts came down from the hills, and every evening they went "
        "back up, lighter by a load of grain and heavier by a few coins. In the spring the "
        "water rose over the lower field, and the children of the village waded through it to "
        "school, holding their shoes above their heads and laughing at the cold. Nobody "
        "remembered who had built the mill, only that it had always been there. ")


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    # a small prefill budget: prompts of ~100 tokens are scored over several chunks
    return make_server(max_running=4, max_prefill_tokens=48, prefix_cache=True, page_size=16)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(hf_model: Any) -> Any:
    """ids -> log_softmax [len, vocab] of Hugging Face transformers (float32, same weights)."""
    import torch

    def run(ids: list[int]) -> Any:
        with torch.inference_mode():
            return hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return run


def post(server: Any, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def stream(server: Any, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.url + path, json={"model": MODEL, "stream": True, **body},
                      timeout=120) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_echo_scores_the_prompt_like_transformers(server: Any, tokenizer: Any, reference: Any,
                                                   idle_check: Any) -> None:
    ids = tokenizer.encode(TEXT)
    assert len(ids) > 48 * 2  # three chunks at least
    out = post(server, "/v1/completions", {"prompt": TEXT, "echo": True, "logprobs": 3,
                                           "max_tokens": 0})
    choice = out["choices"][0]
    assert out["object"] == "text_completion"
    assert choice["text"] == TEXT and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 0 and out["usage"]["prompt_tokens"] == len(ids)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
    assert "".join(lp["tokens"]) == TEXT
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(ids))]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref = reference(ids)
    for i in range(1, len(ids)):
        want = ref[i - 1, ids[i]].item()
        assert lp["token_logprobs"][i] == pytest.approx(want, abs=2e-3), i
        top = lp["top_logprobs"][i]
        assert lp["tokens"][i] in top and 3 <= len(top) <= 4
        best = ref[i - 1].topk(3)
        assert max(top.values()) == pytest.approx(best.values[0].item(), abs=2e-3)
        assert tokenizer.decode([int(best.indices[0])]) in top
    idle_check(server.engine)


def test_echo_with_output_and_stream_agree(server: Any, tokenizer: Any, reference: Any,
                                           idle_check: Any) -> None:
    body = {"prompt": TEXT, "echo": True, "logprobs": 2, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True}
    done = post(server, "/v1/completions", body)
    choice = done["choices"][0]
    ids = tokenizer.encode(TEXT)
    assert choice["text"].startswith(TEXT) and len(choice["text"]) > len(TEXT)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 6
    out_ids = tokenizer.encode(TEXT + choice["text"][len(TEXT):], add_special_tokens=False)
    ref = reference(out_ids)
    for i in range(len(ids), len(ids) + 6):  # greedy: the chosen token is the best one
        assert lp["token_logprobs"][i] == pytest.approx(max(lp["top_logprobs"][i].values()))
        assert lp["text_offset"][i] >= len(TEXT)
    # the first output token's logprob is the one the full forward gives at the prompt's end
    first = tokenizer.encode(lp["tokens"][len(ids)], add_special_tokens=False)[0]
    assert lp["token_logprobs"][len(ids)] == pytest.approx(ref[len(ids) - 1, first].item(),
                                                           abs=2e-3)

    chunks = stream(server, "/v1/completions", body)
    assert all(c["object"] == "text_completion" for c in chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == choice["text"]
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    assert chunks[0]["choices"][0]["text"] == TEXT  # the echoed prompt comes first
    joined = {k: [v for p in parts for v in p[k]] for k in lp}
    assert joined["tokens"] == lp["tokens"] and joined["text_offset"] == lp["text_offset"]
    assert joined["token_logprobs"][1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-4)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    idle_check(server.engine)


def test_scored_prompts_skip_the_prefix_cache(server: Any, idle_check: Any) -> None:
    body = {"prompt": TEXT, "echo": True, "logprobs": 0, "max_tokens": 0}
    first = post(server, "/v1/completions", body)
    plain = post(server, "/v1/completions", {"prompt": TEXT, "max_tokens": 1})
    # the cache is on and holds this prompt: a request that scores nothing reuses it ...
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48
    again = post(server, "/v1/completions", body)
    # ... one that scores the prompt computes every position again, and loses nothing
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    a, b = first["choices"][0]["logprobs"], again["choices"][0]["logprobs"]
    assert a["tokens"] == b["tokens"] and None not in a["token_logprobs"][1:]
    assert a["token_logprobs"][1:] == pytest.approx(b["token_logprobs"][1:], abs=1e-4)
    assert all(len(t) == 1 for t in b["top_logprobs"][1:])  # logprobs 0: just the chosen one
    idle_check(server.engine)


def test_sampled_logprobs_are_the_raw_distribution(server: Any, tokenizer: Any,
                                                   reference: Any, idle_check: Any) -> None:
    """With temperature 1.7 the logprobs are still the model's own (not the tempered ones)."""
    out = post(server, "/v1/completions", {"prompt": TEXT, "logprobs": 1, "max_tokens": 5,
                                           "temperature": 1.7, "seed": 3, "ignore_eos": True})
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 5 and lp["text_offset"][0] == 0
    out_ids = []
    for token in lp["tokens"]:  # each token's text gives back its id (asserted, not assumed)
        piece = tokenizer.encode(token, add_special_tokens=False)
        assert len(piece) == 1, (token, piece)
        out_ids.extend(piece)
    ids = tokenizer.encode(TEXT)
    ref = reference(ids + out_ids)
    for i, token_id in enumerate(out_ids):
        raw = ref[len(ids) + i - 1, token_id].item()
        assert lp["token_logprobs"][i] == pytest.approx(raw, abs=2e-3), i
    idle_check(server.engine)


def test_chat_logprobs(server: Any, client: openai.OpenAI, idle_check: Any) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                          temperature=0, logprobs=True, top_logprobs=2)
    choice = done.choices[0]
    assert done.object == "chat.completion"
    content = choice.logprobs.content
    assert len(content) == done.usage.completion_tokens
    for entry in content:
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == 2
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    shown = "".join(e.token for e in content)
    assert shown.startswith(choice.message.content)

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=2, stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content],
                                                          abs=1e-4)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert plain.choices[0].logprobs is None
    idle_check(server.engine)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "top_logprobs": 2}, "top_logprobs"),
])
def test_bad_logprob_requests_are_400(server: Any, path: str, body: dict[str, Any],
                                      param: str) -> None:
    r = httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_scores_in_a_mixed_batch_beside_decodes(make_server: Any, tokenizer: Any,
                                                reference: Any, idle_check: Any) -> None:
    """A scored prompt chunked into rounds that also decode another request (policy mixed:
    single-token rows come first in the packed batch) is scored as when it runs alone."""
    mixed = make_server(max_running=4, max_prefill_tokens=40, policy="mixed")
    body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 300,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", mixed.url + "/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # it decodes now
        out = post(mixed, "/v1/completions", {"prompt": TEXT, "echo": True, "logprobs": 1,
                                              "max_tokens": 0})
        assert mixed.engine.snapshot().running, "the other request should still decode"
    ids = tokenizer.encode(TEXT)
    ref = reference(ids)
    scores = out["choices"][0]["logprobs"]["token_logprobs"]
    assert scores[1:] == pytest.approx([ref[i - 1, ids[i]].item() for i in range(1, len(ids))],
                                       abs=2e-3)
    idle_check(mixed.engine)

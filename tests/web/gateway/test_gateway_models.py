"""Upstream mode by model: a front over two real `ferry serve` upstreams that serve different
models (the default GGUF, and the same file under another name). The front lists the union
of their models, sends each request to an upstream that serves its model, answers an unknown
model with a 404 that lists the known ones, and holds one model's overflow in its own queue
(`upstream-busy`) without holding back the other model's requests."""
from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.tools.waiting import wait_for

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
GREEDY = {"temperature": 0, "ignore_eos": True}
UP = ("up", "slow")


def model_of(up: Any) -> str:
    return str(httpx.get(up.url + "/v1/models", timeout=10).json()["data"][0]["id"])


def generated(up: Any) -> float:
    """The upstream's own count of output tokens (its /metrics)."""
    text = httpx.get(up.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ferry:generation_tokens_total":
                return float(sample.value)
    raise AssertionError("ferry:generation_tokens_total is not in the upstream's /metrics")


@pytest.fixture(scope="module")
def front(two_models: list[Any], make_front: Any) -> Any:
    a, b = two_models
    front = make_front([a.url, b.url], web={"default_max_tokens": 4})
    wait_for(lambda: all(u.health in UP and u.models for u in
                         front.gateway.gateway_view().upstreams), 15, "both models read")
    return front


def test_the_union_is_listed_and_each_request_goes_to_its_model(two_models: list[Any],
                                                                 front: Any) -> None:
    a, b = two_models
    ma, mb = model_of(a), model_of(b)
    assert ma != mb
    listed = httpx.get(front.url + "/v1/models", timeout=10).json()["data"]
    assert [(m["id"], m["upstreams"]) for m in listed] == [(ma, [a.name]), (mb, [b.name])]
    one = httpx.get(f"{front.url}/v1/models/{mb}", timeout=10)
    assert one.status_code == 200 and one.json()["upstreams"] == [b.name]
    page = httpx.get(front.url + "/dashboard", timeout=10).text  # each upstream's models
    for up, model in ((a, ma), (b, mb)):
        row = page.split(f'data-upstream="{up.name}"', 1)[1].split("</tr>", 1)[0]
        assert f'class="upstream-models">{model}<' in row
    for model, up, other in ((ma, a, b), (mb, b, a)):
        before, before_other = generated(up), generated(other)
        r = httpx.post(front.url + "/v1/chat/completions", timeout=120, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            **GREEDY})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model and r.json()["usage"]["completion_tokens"] == 3
        # the upstream that serves the model wrote the tokens; the other wrote none
        assert generated(up) - before == 3 and generated(other) == before_other
        r = httpx.post(front.url + "/v1/completions", timeout=120, json={
            "model": model, "prompt": "Once", "max_tokens": 2, **GREEDY})
        assert r.status_code == 200, r.text
        assert generated(up) - before == 5 and generated(other) == before_other
    # the chat, which names no model, goes to the default: the first model of the union
    before = generated(a)
    made = httpx.post(front.url + "/c", data={"content": "Hello"}, timeout=30)
    assert made.status_code in (200, 303), made.text
    store = front.services.store
    conv = store.conversations("local")[0]
    wait_for(lambda: any(m.role == "assistant" and m.status != "streaming"
                         for m in store.messages(conv.id)), 120, "the chat's reply")
    assert generated(a) > before
    assert front.gateway.wait_idle(10)


def test_an_unknown_model_is_a_404_that_lists_the_known_ones(two_models: list[Any],
                                                             front: Any) -> None:
    ma, mb = (model_of(u) for u in two_models)
    sent = len(front.gateway.dispatch_log)
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user",
                                                                "content": "Hi"}]}),
                       ("/v1/completions", {"prompt": "Hi"})):
        r = httpx.post(front.url + path, timeout=30, json={"model": "nope", "max_tokens": 2,
                                                           **body})
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert repr(ma) in error["message"] and repr(mb) in error["message"]
    assert httpx.get(front.url + "/v1/models/nope", timeout=10).status_code == 404
    assert not front.gateway.live_ids() and len(front.gateway.dispatch_log) == sent


def test_one_models_overflow_waits_at_the_front_and_not_before_the_other(
        two_models: list[Any], front: Any) -> None:
    """Default settings: each upstream's cap is its 4 slots. Six long requests for the
    default model: four go upstream, two wait at the front as upstream-busy; a request for
    the other model then goes at once, past them."""
    a, b = two_models
    ma, mb = model_of(a), model_of(b)
    gw = front.gateway
    wait_for(lambda: [u.max_in_flight for u in gw.gateway_view().upstreams] == [4, 4], 15,
             "the caps read from the upstreams' slots")
    long = {"model": ma, "prompt": "Tell me a story", "max_tokens": 300, **GREEDY}
    def send(body: dict[str, Any], out: list[Any]) -> None:
        out.append(httpx.post(front.url + "/v1/completions", json=body, timeout=300))

    sent = len(gw.dispatch_log)
    results: list[Any] = []
    threads = [threading.Thread(target=send, args=(long, results), daemon=True)
               for _ in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: len(gw.live_ids()) == 6 and len(gw.gateway_view().in_flight) == 4, 60,
             "four in flight, two waiting")
    snap = gw.snapshot()
    assert len(snap.waiting) == 2
    head, second = snap.waiting
    assert head.reason is not None and head.reason.code == "upstream-busy"
    assert head.reason.text == f"the upstream {a.name} is at its 4-request cap (for {ma})"
    assert second.reason is not None and second.reason.code == "behind"
    held = a.requests()  # the upstream holds only what it runs: the front holds the rest
    assert len(held) <= 4 and all(r.get("state") != "waiting" for r in held)
    assert not b.requests()

    other: list[Any] = []
    t = threading.Thread(target=send, args=({"model": mb, "prompt": "Hi", "max_tokens": 2,
                                             **GREEDY}, other), daemon=True)
    t.start()
    t.join(120)
    assert other and other[0].status_code == 200, other
    # it went to its own upstream while the default model's two still waited at the front
    assert [d[2] for d in gw.dispatch_log][sent:] == [a.name] * 4 + [b.name]
    assert len(gw.snapshot().waiting) == 2

    def cancel_all() -> bool:  # the two waiting go upstream as the first four end
        for rid in gw.live_ids():
            gw.cancel(rid)
        return not gw.live_ids()
    wait_for(cancel_all, 30, "the default model's requests cancelled", 0.2)
    for th in threads:
        th.join(60)
    assert len(results) == 6 and all(r.status_code == 200 for r in results)
    assert gw.wait_idle(10)
    wait_for(lambda: not a.requests(), 10, "the upstream to be idle")

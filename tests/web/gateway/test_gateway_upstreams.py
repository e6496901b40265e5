"""Upstream mode end to end: a front (the web app over a Gateway) before real `ferry serve`
upstreams on the default model. Chat and the OpenAI API through the front, fair order and
the in-flight cap, Cancel freeing the upstream, two upstreams sharing the load, an upstream
killed mid-reply, both down, and one coming back."""
from __future__ import annotations

import re
import threading
import time
from collections import Counter
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.tools.waiting import wait_for
from web.access.users import UserStore
from web.pages.chat import reply_status

# the upstreams' start (the model's load, twice) counts against the first test's time
pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]
GREEDY = {"temperature": 0, "ignore_eos": True}
UP = ("up", "slow")  # slow: answering, its metrics late (a busy machine)


wait = wait_for


def complete(url: str, model: str, max_tokens: int, token: str | None = None,
             prompt: str = "Once upon a time") -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url + "/v1/completions", headers=headers, timeout=300, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, **GREEDY})


def front_metric(url: str, name: str, token: str | None = None, **labels: str) -> float:
    """One sample of the front's own /metrics (the gateway's gauges)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name} {labels} is not in the front's /metrics")


class Background(threading.Thread):
    """One request in a thread; `.response` when it is done."""

    def __init__(self, fn: Any, *args: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.args = fn, args
        self.response: Any = None

    def run(self) -> None:
        self.response = self.fn(*self.args)


def test_openai_api_and_chat_through_the_front(upstreams: list[Any], make_front: Any) -> None:
    a = upstreams[0]
    front = make_front([a.url], web={"default_max_tokens": 6})
    model = httpx.get(a.url + "/v1/models").json()["data"][0]["id"]
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == [model]
    messages = [{"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=model, messages=messages,  # type: ignore
                                          max_tokens=3, temperature=0,
                                          extra_body={"ignore_eos": True})
    direct = httpx.post(a.url + "/v1/chat/completions", timeout=60, json={
        "model": model, "messages": messages, "max_tokens": 3, **GREEDY}).json()
    # the upstream applied the chat template and counted the tokens; greedy: the same text
    assert chat.choices[0].message.content == direct["choices"][0]["message"]["content"]
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    assert chat.usage.prompt_tokens == direct["usage"]["prompt_tokens"]

    stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=3,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == complete(a.url, model, 3).json()["choices"][0]["text"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert chunks[-1].usage.prompt_tokens == complete(a.url, model, 1).json()["usage"][
        "prompt_tokens"]

    # the chat page: a conversation whose reply the upstream writes, saved complete
    made = httpx.post(front.url + "/c", data={"content": "Say hello."}, timeout=30)
    assert made.status_code in (200, 303), made.text
    conv_id = int(re.search(r"/c/(\d+)", str(made.url) + made.headers.get("location", "") +
                            made.headers.get("hx-redirect", ""))[1])  # type: ignore[index]
    store = front.services.store
    reply = wait(lambda: next((m for m in store.messages(conv_id) if m.role == "assistant"
                               and m.status != "streaming"), None), 60, "the chat reply")
    assert reply.status == "complete" and reply.content, reply
    assert reply.prompt_tokens and reply.prompt_tokens > 5  # the upstream's count
    assert front.gateway.wait_idle(10)
    assert wait(lambda: not a.requests(), 5, "the upstream to be idle")


def test_fair_order_and_the_in_flight_cap(upstreams: list[Any], make_front: Any,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    a = upstreams[0]
    data = tmp_path_factory.mktemp("fair")
    users = UserStore(data / "users.json")
    tokens = {"ann": users.add("ann", admin=True), "bob": users.add("bob")}
    front = make_front([a.url], caps=[1], web={"shared": True}, data_dir=data)
    gw, model = front.gateway, front.services.config.model_name
    # holds the one place while the others queue: long enough that it is still writing when
    # the last one arrives (speculative decoding writes several tokens a round)
    jobs = [Background(complete, front.url, model, 160, tokens["ann"])]
    jobs[0].start()
    wait(lambda: any(v.output_tokens for v in gw.snapshot().running), 60,
         "ann's first request writing")
    for owner in ("ann", "ann", "bob", "bob"):
        jobs.append(Background(complete, front.url, model, 1, tokens[owner]))
        jobs[-1].start()
        wait(lambda: len(gw.live_ids()) == len(jobs), 10, "the request in the queue")
    snap = gw.snapshot()
    held = a.requests()  # Ferry, not the upstream, holds the queue
    # bob has not been served yet: he goes first, then they take turns
    assert [v.owner for v in snap.waiting] == ["bob", "ann", "bob", "ann"]
    head = snap.waiting[0]
    assert head.reason is not None and head.reason.code == "upstream-busy"
    assert head.reason.text == f"the upstream {a.name} is at its 1-request cap"
    assert {v.reason.code for v in snap.waiting[1:] if v.reason} == {"behind"}
    assert len(snap.running) == 1 and len(held) == 1
    assert "at its 1-request cap" in (reply_status.standing(snap, head.id) or "")  # the bubble
    admin = tokens["ann"]
    assert front_metric(front.url, "ferry:gateway_requests_waiting", admin) == 4
    assert front_metric(front.url, "ferry:gateway_requests_in_flight", admin,
                        upstream=a.name) == 1
    assert front_metric(front.url, "ferry:gateway_max_in_flight", admin, upstream=a.name) == 1
    for job in jobs:
        job.join(300)
        assert job.response is not None and job.response.status_code == 200, job.response
    owners = [owner for _, owner, _ in list(gw.dispatch_log)]
    assert owners == ["ann", "bob", "ann", "bob", "ann"]


def test_cancel_from_the_dashboard_ends_it_on_the_upstream(upstreams: list[Any],
                                                           make_front: Any) -> None:
    a = upstreams[0]
    front = make_front([a.url])
    model = front.services.config.model_name
    # long enough that a busy machine's upstream cannot finish it before the front reads its
    # first token (the upstream's KV holds 2048 tokens); without drafts, which a looping
    # greedy reply would accept several at a step
    body = {"model": model, "prompt": "Tell me a story", "max_tokens": 1500, "stream": True,
            "speculative": False, **GREEDY}
    ended = threading.Event()
    chunks: list[str] = []

    def read() -> None:
        with httpx.stream("POST", front.url + "/v1/completions", json=body, timeout=60) as r:
            chunks.extend(r.iter_lines())
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    req = wait(lambda: next((r for r in front.gateway.gateway_view().in_flight
                             if r.upstream_id and r.output_tokens), None), 60, "tokens")
    upstream_id = req.upstream_id
    assert upstream_id in {r["id"] for r in a.requests()}
    r = httpx.post(f"{front.url}/dashboard/requests/{req.id}/cancel", timeout=10)
    assert r.status_code == 204, r.text
    cancelled = time.monotonic()
    wait(lambda: upstream_id not in {r["id"] for r in a.requests()}, 10,
         "the upstream to drop the request")
    took = time.monotonic() - cancelled
    # far sooner than the rest of a 1,500-token reply (ten seconds and more), with room for a
    # busy machine's pauses
    assert took < 3.0, f"the upstream dropped it {took:.2f} s after the cancel"
    assert ended.wait(10) and [c for c in chunks if c][-1] == "data: [DONE]"
    assert any('"ferry_finish_reason":"cancelled"' in c for c in chunks)  # OpenAI says stop


def test_two_upstreams_share_the_load(upstreams: list[Any], make_front: Any) -> None:
    a, b = upstreams
    front = make_front([a.url, b.url], caps=[2, 2])
    gw, model = front.gateway, front.services.config.model_name
    wait(lambda: all(u.health in UP for u in gw.gateway_view().upstreams), 10, "both up")
    jobs = [Background(complete, front.url, model, 3) for _ in range(4)]
    for job in jobs:
        job.start()
    wait(lambda: len(gw.gateway_view().in_flight) == 4, 30, "four in flight")
    view = gw.gateway_view()
    assert sorted(u.in_flight for u in view.upstreams) == [2, 2]
    assert "2 of 2 upstreams up · 4 in flight" in view.summary
    for job in jobs:
        job.join(120)
        assert job.response.status_code == 200, job.response.text
    assert Counter(up for _, _, up in gw.dispatch_log) == {a.name: 2, b.name: 2}
    page = httpx.get(front.url + "/dashboard", timeout=10).text
    assert 'id="upstreams"' in page and a.name in page and b.name in page


def test_default_cap_is_the_upstreams_slots(upstreams: list[Any], make_front: Any) -> None:
    """No max_in_flight set: the front sends an upstream of 4 slots (FERRY_MAX_RUNNING=4)
    four of eight requests and holds the other four in its own queue, as upstream-busy."""
    a = upstreams[0]
    front = make_front([a.url])
    gw, model = front.gateway, front.services.config.model_name
    wait(lambda: gw.gateway_view().upstreams[0].max_in_flight == 4, 15,
         "the cap read from the upstream's slots")
    jobs = [Background(complete, front.url, model, 12) for _ in range(8)]
    for job in jobs:
        job.start()
    wait(lambda: len(gw.live_ids()) == 8, 30, "all eight at the front")
    wait(lambda: len(gw.gateway_view().in_flight) == 4, 30, "four in flight")
    snap = gw.snapshot()
    assert len(snap.running) == 4 and len(snap.waiting) == 4
    head = snap.waiting[0]
    assert head.reason is not None and head.reason.code == "upstream-busy"
    assert head.reason.text == f"the upstream {a.name} is at its 4-request cap"
    held = a.requests()
    assert len(held) <= 4 and all(r.get("state") != "waiting" for r in held)
    for job in jobs:
        job.join(300)
        assert job.response is not None and job.response.status_code == 200, job.response
    assert len(gw.dispatch_log) == 8


def test_an_upstream_dies_mid_reply_then_both_down_then_one_comes_back(
        upstreams: list[Any], make_front: Any) -> None:
    """Last in the module: it kills both upstreams and brings one back."""
    a, b = upstreams
    front = make_front([a.url, b.url], web={"chat_ignore_eos": True, "default_max_tokens": 300})
    gw, model, store = front.gateway, front.services.config.model_name, front.services.store
    wait(lambda: all(u.health in UP for u in gw.gateway_view().upstreams), 10, "both up")
    made = httpx.post(front.url + "/c", data={"content": "Write a long story."}, timeout=30)
    assert made.status_code in (200, 303), made.text
    conv = store.conversations("local")[0]

    def reply() -> Any:
        return next(m for m in store.messages(conv.id) if m.role == "assistant")

    wait(lambda: len(reply().content) > 5, 60, "part of the reply saved")
    req = gw.gateway_view().in_flight[0]
    dead, alive = (a, b) if req.upstream == a.name else (b, a)
    dead.kill()
    wait(lambda: reply().status != "streaming", 30, "the end of the reply")
    msg = reply()
    assert msg.status == "incomplete" and len(msg.content) > 5  # the partial reply is kept
    assert msg.finish_reason == "error" and dead.name in (msg.error or "")
    assert "incomplete" in (msg.error or "")
    # new requests go to the live upstream
    r = complete(front.url, model, 2)
    assert r.status_code == 200, r.text
    assert list(gw.dispatch_log)[-1][2] == alive.name
    assert {u.name: u.health for u in gw.gateway_view().upstreams}[dead.name] == "down"

    alive.kill()
    wait(lambda: all(u.health == "down" for u in gw.gateway_view().upstreams), 10,
         "both down")
    r = complete(front.url, model, 2)
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    assert "all 2 upstreams are down" in r.json()["error"]["message"]
    page = httpx.get(front.url + "/dashboard", timeout=10).text
    assert "0 of 2 upstreams up" in page and page.count('data-health="down"') == 2
    for up in (a, b):
        assert front_metric(front.url, "ferry:gateway_upstream_up", upstream=up.name) == 0
        assert front_metric(front.url, "ferry:gateway_upstream_health", upstream=up.name,
                            health="down") == 1

    dead.start().wait_ready()
    wait(lambda: {u.name: u.health for u in gw.gateway_view().upstreams}[dead.name] in UP,
         10, "the upstream back up")
    r = complete(front.url, model, 2)
    assert r.status_code == 200, r.text
    assert list(gw.dispatch_log)[-1][2] == dead.name
    assert front_metric(front.url, "ferry:gateway_upstream_up", upstream=dead.name) == 1
    assert front_metric(front.url, "ferry:gateway_requests_sent_total", upstream=dead.name) >= 2

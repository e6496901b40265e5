"""Who decides what is loaded, on a shared server with two models (the default SmolLM2 GGUF
as `alpha`, a copy as `beta`), an admin (ann) and two normal users (bob, cat): a normal
user's keep_alive only shortens the life of a model loaded for that user alone; odd
keep_alive values are 400s; loading on demand can be kept for admins; only an admin's load
evicts the default model; and a request for a model not loaded is listed, with reason
`loading`, from its first moment (its model reading `loading`), tokenizer opening included."""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import Budget, SharingRules
from web.access.users import UserStore

pytestmark = pytest.mark.model
PROMPT = [{"role": "user", "content": "What is the capital of Germany?"}]
USERS = {"ann": True, "bob": False, "cat": False}
GB = 1 << 30


@pytest.fixture(scope="module")
def shared_models(make_models_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """make(name, budget=..., rules=...) -> (Server in shared mode over alpha and beta,
    {user: httpx.Client signed in})."""
    clients: list[httpx.Client] = []

    def make(name: str, budget: Budget | None = None,
             rules: SharingRules | None = None) -> tuple[Any, dict[str, httpx.Client]]:
        data: Path = tmp_path_factory.mktemp(name)
        store = UserStore(data / "users.json")
        tokens = {user: store.add(user, admin=admin) for user, admin in USERS.items()}
        server = make_models_server(("alpha", "beta"), web={"shared": True},
                                    budget=budget, rules=rules, data_dir=data, max_running=4)
        made = {u: httpx.Client(base_url=server.url, timeout=120,
                                headers={"Authorization": f"Bearer {t}"})
                for u, t in tokens.items()}
        clients.extend(made.values())
        return server, made

    yield make
    for c in clients:
        c.close()


def ask(c: httpx.Client, model: str, **extra: Any) -> httpx.Response:
    return c.post("/v1/chat/completions", json={"model": model, "messages": PROMPT,
                                                "max_tokens": 4, "temperature": 0, **extra})


def cards(c: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in c.get("/v1/models").json()["data"]}


def loaded_for(server: Any, name: str) -> str | None:
    with server.engine.table.lock:
        return server.engine.table.entries[name].loaded_for  # type: ignore[no-any-return]


def test_normal_users_keep_alive_only_shortens_their_own_load(
        shared_models: Any, waiter: Any, idle_check: Any) -> None:
    server, c = shared_models("keep")
    bob, cat, ann = c["bob"], c["cat"], c["ann"]
    # the shared default: bob can neither unload it (0) nor change its lifetime
    assert ask(bob, "alpha", keep_alive=0).status_code == 200
    assert ask(bob, "alpha", keep_alive="1m").status_code == 200
    alpha = cards(bob)["alpha"]
    assert alpha["state"] == "loaded" and alpha["keep_alive"] is None  # stays, for everyone
    # beta, loaded for bob alone: he may not pin it (-1), nor lengthen it past the admin's
    assert ask(bob, "beta", keep_alive=-1).status_code == 200
    assert loaded_for(server, "beta") == "bob"
    assert cards(bob)["beta"]["keep_alive"] == 300
    assert ask(bob, "beta", keep_alive="2h").status_code == 200
    assert cards(bob)["beta"]["keep_alive"] == 300
    # ... but he may shorten it
    assert ask(bob, "beta", keep_alive=120).status_code == 200
    assert cards(bob)["beta"]["keep_alive"] == 120
    # once cat used beta it is shared: bob's shortening ends, and his 0 no longer applies
    assert ask(cat, "beta").status_code == 200
    assert cards(bob)["beta"]["keep_alive"] == 300
    assert ask(bob, "beta", keep_alive=0).status_code == 200
    card = cards(bob)["beta"]
    assert card["keep_alive"] == 300 and card["state"] == "loaded"
    # the admin decides as Ollama's keep_alive does: 0 unloads beta once idle
    assert ask(ann, "beta", keep_alive=0).status_code == 200
    waiter(lambda: cards(ann)["beta"]["state"] == "unloaded", message="beta unloaded")
    # loaded again for bob alone: his 0 unloads it once his request is done
    assert ask(bob, "beta", keep_alive=0).status_code == 200
    waiter(lambda: cards(bob)["beta"]["state"] == "unloaded", message="beta unloaded")
    # the admin's 0 on the default unloads even it (as before); the admin's -1 pins beta
    assert ask(ann, "beta", keep_alive=-1).status_code == 200
    assert cards(ann)["beta"]["keep_alive"] is None
    assert ask(cat, "beta", keep_alive=5).status_code == 200  # not cat's load: unchanged
    assert cards(ann)["beta"]["keep_alive"] is None
    idle_check(server.engine)


@pytest.fixture(scope="module")
def odd(shared_models: Any) -> Any:
    return shared_models("odd")


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999", True, False, -2, -0.5,
                                   "-5m", "soon", "", "5 minutes", [1], {"s": 1}])
def test_odd_keep_alive_values_are_400s_naming_the_field(odd: Any, value: Any) -> None:
    server, c = odd
    before = cards(c["ann"])
    for user in ("bob", "ann"):
        r = ask(c[user], "beta", keep_alive=value)
        assert r.status_code == 400, (value, r.text)
        error = r.json()["error"]
        assert error["param"] == "keep_alive", error  # the field named, for any type
    # a JSON number out of a float's range: refused where the body is read (a 400 too)
    r = c["bob"].post("/v1/chat/completions", content=b'{"model": "beta", "messages": '
                      + json.dumps(PROMPT).encode() + b', "keep_alive": 1e999}',
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"], r.text
    assert cards(c["ann"]) == before  # nothing loaded, nothing changed
    assert not server.engine.live_ids()


def test_loading_on_demand_can_be_kept_for_admins(shared_models: Any, waiter: Any,
                                                  idle_check: Any) -> None:
    server, c = shared_models("admins-load", rules=SharingRules(users_load=False))
    bob, ann = c["bob"], c["ann"]
    r = ask(bob, "beta")
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "model_not_loaded" and error["param"] == "model"
    assert "'beta'" in error["message"] and "admin" in error["message"]
    assert "/" not in error["message"]  # a name, never a path
    assert cards(bob)["beta"]["state"] == "unloaded" and not server.engine.live_ids()
    # the chat page refuses the same, with the same status
    created = bob.post("/c", data={"content": "hello", "model": "beta"},
                       headers={"HX-Request": "true"})
    assert created.status_code == 409 and "beta" in created.text
    assert ask(bob, "alpha").status_code == 200  # loaded models serve everyone
    assert ask(ann, "beta").status_code == 200  # the admin's request loads it ...
    assert ask(bob, "beta").status_code == 200  # ... and then bob may use it
    idle_check(server.engine)


def test_only_an_admins_load_evicts_the_default_model(shared_models: Any, waiter: Any,
                                                      idle_check: Any) -> None:
    server, c = shared_models("one-model", budget=Budget(1, 8 * GB))
    bob, ann = c["bob"], c["ann"]
    r = ask(bob, "beta")
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "model_no_room" and error["param"] == "model"
    assert "'beta'" in error["message"] and "'alpha'" in error["message"]
    assert cards(bob)["alpha"]["state"] == "loaded" and cards(bob)["beta"]["state"] == \
        "unloaded"
    assert not any(e.kind == "unloaded" for e in server.engine.events)
    # the admin's load may: alpha gives way to beta
    reply = ask(ann, "beta")
    assert reply.status_code == 200 and reply.json()["model"] == "beta"
    assert (cards(ann)["alpha"]["state"], cards(ann)["beta"]["state"]) == \
        ("unloaded", "loaded")
    # bringing the default back evicts only beta: bob may; but the default is everyone's,
    # so his keep_alive 0 does not unload it even though his request loaded it
    assert ask(bob, "alpha", keep_alive=0).status_code == 200
    assert (cards(ann)["alpha"]["state"], cards(ann)["beta"]["state"]) == \
        ("loaded", "unloaded")
    assert cards(ann)["alpha"]["keep_alive"] is None
    time.sleep(0.5)  # ten turns of the monitor: a keep_alive of 0 would have unloaded it
    assert cards(ann)["alpha"]["state"] == "loaded"
    idle_check(server.engine)


def gate(server: Any, name: str) -> tuple[threading.Event, threading.Event]:
    """Fault injection: `name`'s tokenizer opening and its weights' load each wait for an
    event, so a test sees the request while both are under way."""
    tokenizer, weights = threading.Event(), threading.Event()
    with server.engine.table.lock:
        entry = server.engine.table.entries[name]
        source = entry.source
        assert entry.tokenizer is None, "the tokenizer must not be open yet"

        def open_tokenizer() -> Any:
            assert tokenizer.wait(60)
            return source.open_tokenizer()

        def load() -> Any:
            assert weights.wait(60)
            return source.load()

        entry.source = dataclasses.replace(source, open_tokenizer=open_tokenizer, load=load)
    return tokenizer, weights


def listed(c: httpx.Client) -> list[dict[str, Any]]:
    return c.get("/v1/requests").json()["data"]  # type: ignore[no-any-return]


def test_a_request_shows_loading_from_its_first_moment(shared_models: Any, waiter: Any,
                                                       idle_check: Any) -> None:
    server, c = shared_models("visible")
    bob, cat, ann = c["bob"], c["cat"], c["ann"]
    tokenizer, weights = gate(server, "beta")
    answer: dict[str, Any] = {}

    def stream() -> None:
        body = {"model": "beta", "messages": PROMPT, "max_tokens": 6, "temperature": 0,
                "stream": True}
        with bob.stream("POST", "/v1/chat/completions", json=body) as r:
            answer["id"] = r.headers.get("x-request-id")
            answer["status"] = r.status_code
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
            answer["text"] = "".join(ch["delta"].get("content") or ""
                                     for chunk in chunks for ch in chunk["choices"])

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        # the tokenizer is still opening: the request is listed, waiting for beta's load
        first = waiter(lambda: listed(bob), 30, message="the request listed")[0]
        assert first["state"] == "waiting" and first["model"] == "beta"
        assert first["reason"]["code"] == "loading"
        assert first["reason"]["text"].startswith("loading beta")
        assert cards(bob)["beta"]["state"] == "loading"
        assert cards(bob)["beta"]["loaded"] is False
        assert not listed(cat)  # another user's request stays hidden from cat ...
        assert [r["id"] for r in listed(ann)] == [first["id"]]  # ... not from the admin
        board = bob.get("/dashboard").text
        assert f'data-id="{first["id"]}"' in board and "loading beta" in board
        assert 'class="state model-loading"' in board
        # the tokenizer opened, the weights still load: the same request, still loading
        tokenizer.set()
        waiter(lambda: server.engine.handle(first["id"]) is not None, 30,
               message="the request submitted")
        again = listed(bob)
        assert [r["id"] for r in again] == [first["id"]]
        assert again[0]["reason"]["code"] == "loading" and again[0]["prompt_tokens"] > 0
        assert cards(bob)["beta"]["state"] == "loading"
    finally:
        tokenizer.set()
        weights.set()
        thread.join(120)
    assert answer["status"] == 200 and answer["id"] == first["id"]
    assert "Berlin" in answer["text"]
    assert cards(bob)["beta"]["state"] == "loaded"
    idle_check(server.engine)


def test_an_announced_request_refused_later_is_no_longer_listed(
        shared_models: Any, waiter: Any, idle_check: Any) -> None:
    """A request listed while its model's tokenizer opens, then refused (400: its messages),
    leaves the list; one the admin cancels meanwhile ends cancelled."""
    server, c = shared_models("withdrawn")
    bob, ann = c["bob"], c["ann"]
    tokenizer, weights = gate(server, "beta")
    weights.set()
    answers: list[httpx.Response] = []
    bad = {"model": "beta", "messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 4}
    thread = threading.Thread(target=lambda: answers.append(
        bob.post("/v1/chat/completions", json=bad)))
    thread.start()
    try:
        waiter(lambda: listed(bob), 30, message="the request listed")
        tokenizer.set()
        thread.join(60)
        assert answers[0].status_code == 400, answers[0].text
        assert not listed(bob) and not listed(ann)
        assert not server.engine.live_ids()
    finally:
        tokenizer.set()
        thread.join(60)
    # cancelled while announced: its reply ends at once, cancelled, when its prompt is ready
    server2, c2 = shared_models("cancelled")
    tokenizer2, weights2 = gate(server2, "beta")
    weights2.set()
    replies: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: replies.append(ask(c2["bob"], "beta")))
    thread.start()
    try:
        rid = waiter(lambda: listed(c2["bob"]), 30, message="the request listed")[0]["id"]
        cancelled = c2["ann"].delete(f"/v1/requests/{rid}").json()
        assert cancelled["cancelled"] is True
        tokenizer2.set()
        thread.join(60)
        reply = replies[0]
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert (choice["finish_reason"], choice["ferry_finish_reason"]) == ("stop", "cancelled")
        assert reply.json()["usage"]["completion_tokens"] == 0
    finally:
        tokenizer2.set()
        thread.join(60)
    idle_check(server.engine)
    idle_check(server2.engine)

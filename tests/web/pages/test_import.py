"""The conversation import checks every field by the Settings form's and the API's rules: a
refused file is a 400 naming the field and leaves no conversation behind; and `n` above the
per-user limit is a 400 (it could never fit), not a retryable 429."""
from __future__ import annotations

import html
import json
import logging
from typing import Any

import httpx
import pytest

GOOD = {"format": "ferry-conversation", "version": 1, "title": "Trip",
        "settings": {"system_prompt": "Be brief.", "temperature": 0.5, "top_p": 0.9,
                     "max_tokens": 64},
        "messages": [{"role": "user", "content": "Where to?"},
                     {"role": "assistant", "content": "Lisbon.", "finish_reason": "stop",
                      "status": "complete"}]}


@pytest.fixture(scope="module")
def server(make_server: Any, stand_in: Any) -> Any:
    return make_server(executor=stand_in(), web={"max_tokens_limit": 4096})


def post(server: Any, data: Any, raw: bytes | None = None) -> httpx.Response:
    body = raw if raw is not None else json.dumps(data).encode()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        return c.post("/import", files={"file": ("c.json", body, "application/json")},
                      headers={"Accept": "text/html"})


def with_settings(**settings: Any) -> dict[str, Any]:
    return {**GOOD, "settings": {**GOOD["settings"], **settings}}


def with_message(index: int, **fields: Any) -> dict[str, Any]:
    messages = [dict(m) for m in GOOD["messages"]]
    messages[index].update(fields)
    return {**GOOD, "messages": messages}


REFUSED = [
    (with_settings(max_tokens=2 ** 70), "settings.max_tokens"),
    (with_settings(max_tokens=10 ** 9), "settings.max_tokens"),  # over max_tokens_limit
    (with_settings(max_tokens=4097), "settings.max_tokens"),
    (with_settings(max_tokens=0), "settings.max_tokens"),
    (with_settings(max_tokens=-5), "settings.max_tokens"),
    (with_settings(max_tokens=1.5), "settings.max_tokens"),
    (with_settings(max_tokens="64"), "settings.max_tokens"),
    (with_settings(max_tokens=True), "settings.max_tokens"),
    (with_settings(temperature=2.5), "settings.temperature"),
    (with_settings(temperature=-0.1), "settings.temperature"),
    (with_settings(temperature=1e400), "settings.temperature"),  # json reads it as inf
    (with_settings(temperature=float("nan")), "settings.temperature"),
    (with_settings(temperature=2 ** 70), "settings.temperature"),
    (with_settings(top_p=0), "settings.top_p"),
    (with_settings(top_p=1.01), "settings.top_p"),
    (with_settings(top_p="high"), "settings.top_p"),
    (with_settings(system_prompt=7), "settings.system_prompt"),
    (with_settings(system_prompt="\ud800x"), "settings.system_prompt"),
    ({**GOOD, "settings": [1]}, "'settings'"),
    (with_message(0, content="\ud800x"), "messages[0].content"),
    (with_message(1, content="ok \udfff"), "messages[1].content"),
    (with_message(0, content=None), "messages[0].content"),
    (with_message(0, role="system"), "messages[0].role"),
    (with_message(1, finish_reason="exploded"), "messages[1].finish_reason"),
    (with_message(0, finish_reason="stop"), "messages[0].finish_reason"),  # not on a reply
    (with_message(1, status="streaming"), "messages[1].status"),
    (with_message(1, created="yesterday"), "messages[1].created"),
    ({**GOOD, "title": "\ud800"}, "title"),
    ({**GOOD, "title": 5}, "title"),
    ({**GOOD, "version": 2}, "version"),
    ({**GOOD, "messages": []}, "no messages"),
    ({**GOOD, "messages": ["hi"]}, "messages[0]"),
    ({**GOOD, "model": 5}, "model"),
    (with_message(1, model=["x"]), "messages[1].model"),
]


@pytest.mark.parametrize(("data", "field"), REFUSED,
                         ids=[f"{i}-{f}" for i, (_, f) in enumerate(REFUSED)])
def test_refused_imports_leave_nothing(server: Any, data: dict[str, Any], field: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    store = server.services.store
    before = store.conversations("local")
    with caplog.at_level(logging.ERROR):
        r = post(server, data)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert field in html.unescape(r.text), r.text[:500]
    assert store.conversations("local") == before
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def test_a_good_import_keeps_every_field(server: Any) -> None:
    r = post(server, GOOD)
    assert r.status_code in (200, 303), r.text[:300]
    conv = server.services.store.conversations("local")[0]
    assert (conv.title, conv.system_prompt, conv.temperature, conv.top_p, conv.max_tokens) == \
        ("Trip", "Be brief.", 0.5, 0.9, 64)
    messages = server.services.store.messages(conv.id)
    assert [(m.role, m.content, m.status, m.finish_reason) for m in messages] == [
        ("user", "Where to?", "complete", None), ("assistant", "Lisbon.", "complete", "stop")]
    server.services.store.delete_conversation(conv.id)


def test_the_model_travels_and_an_unknown_one_falls_back_with_a_note(server: Any) -> None:
    """One model served: a file of that model imports quietly; a file of another model goes
    on with this one, and the page says so (never a 500)."""
    store = server.services.store
    served = server.services.config.model_name
    r = httpx.post(server.url + "/import", follow_redirects=True, files={
        "file": ("c.json", json.dumps({**GOOD, "model": served}).encode(), "application/json")})
    assert r.status_code == 200 and "does not serve" not in r.text
    data = {**with_message(1, model="qwen3:8b"), "model": "qwen3:8b"}
    r = httpx.post(server.url + "/import", follow_redirects=True, files={
        "file": ("c.json", json.dumps(data).encode(), "application/json")})
    assert r.status_code == 200
    assert (f"This conversation was written with qwen3:8b, which this server does not serve: "
            f"it goes on with {served}.") in html.unescape(r.text)
    conv = store.conversations("local")[0]
    assert conv.model is None and store.messages(conv.id)[1].model == "qwen3:8b"
    exported = httpx.get(f"{server.url}/c/{conv.id}/export.json").json()
    assert exported["model"] == served and exported["messages"][1]["model"] == "qwen3:8b"
    for c in store.conversations("local")[:2]:
        store.delete_conversation(c.id)


def test_a_stored_max_tokens_above_the_limit_is_held_to_it(server: Any) -> None:
    """A conversation kept before imports were checked (max_tokens 10^9) replies within
    max_tokens_limit."""
    from web.pages.chat.service import ChatService

    store = server.services.store
    conv = store.create_conversation("local", "old import")
    store.set_settings(conv.id, None, None, None, 10 ** 9)
    chat = ChatService(server.services, server.app.state.replies)
    assert chat.wanted_tokens(store.conversation(conv.id)) == 4096
    store.delete_conversation(conv.id)


def test_a_failing_store_write_leaves_nothing_and_is_logged(
        server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A fault injected into the transaction's last insert: the conversation row goes too,
    the answer is a 500 and the log has the traceback."""
    store = server.services.store
    before = store.conversations("local")
    real = store._db

    class FailingLastInsert:
        def __init__(self) -> None:
            self.messages = 0

        def execute(self, sql: str, args: Any = ()) -> Any:
            if sql.startswith("INSERT INTO messages"):
                self.messages += 1
                if self.messages == 2:
                    raise RuntimeError("disk on fire")
            return real.execute(sql, args)

    monkeypatch.setattr(store, "_db", FailingLastInsert())
    with caplog.at_level(logging.ERROR):
        r = post(server, GOOD)
    monkeypatch.setattr(store, "_db", real)
    assert r.status_code == 500
    assert store.conversations("local") == before
    logged = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert logged and logged[0].exc_info and "disk on fire" in str(logged[0].exc_info[1])


def test_n_above_the_per_user_limit_is_a_400(make_shared_server: Any) -> None:
    shared, tokens = make_shared_server("n-limit", {"alice": False}, web={"per_user_limit": 8})
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 2, "n": 9,
            "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=shared.url, timeout=30,
                      headers={"Authorization": f"Bearer {tokens['alice']}"}) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "n" and "per_user_limit (8)" in error["message"]
        assert "n=9" in error["message"] and "retry-after" not in r.headers
        r = c.post("/v1/completions", json={**body, "messages": None, "prompt": "hi", "n": 16})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        ok = c.post("/v1/chat/completions", json={**body, "n": 8})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 8
    assert not shared.engine.live_ids()

"""Shared mode (listening on the LAN) through create_app: tokens, sessions, and ownership.

A stand-in executor replaces the model (these tests are about who sees and cancels what),
so they run in a few seconds; the tokenizer is the default model's.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def setup(make_shared_server: Any) -> tuple[Any, dict]:
    return make_shared_server("shared", {"ann": True, "bob": False, "cat": False},
                              max_running=2,
                              web={"per_user_limit": 2, "chat_ignore_eos": True,
                                   "default_max_tokens": 400})


def client(server: Any, tokens: dict[str, str], name: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {tokens[name]}"} if name else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def long_request(c: httpx.Client) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 400, "ignore_eos": True}
    with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return r.headers["x-request-id"]  # leaving cancels it: only used for refusals


def test_pages_and_api_need_sign_in(setup: tuple[Any, dict]) -> None:
    server, tokens = setup
    anon = client(server, tokens, None)
    page = anon.get("/", headers={"Accept": "text/html"})
    assert page.status_code == 303 and page.headers["location"].startswith("/login")
    assert anon.get("/v1/models").status_code == 401
    assert anon.get("/healthz").json()["status"] == "ok"
    assert client(server, tokens, "bob").get("/v1/models").status_code == 200


def test_others_cannot_see_or_cancel(setup: tuple[Any, dict], waiter: Any,
                                     idle_check: Any) -> None:
    server, tokens = setup
    bob, cat, ann = (client(server, tokens, n) for n in ("bob", "cat", "ann"))
    created = bob.post("/c", data={"content": "BOB-SECRET-TITLE please"})
    assert created.status_code == 303
    cid = int(created.headers["location"].rsplit("/", 1)[1])
    rid = waiter(lambda: server.engine.live_ids(owner="bob"), 10, message="bob's reply")[0]
    assert server.engine.handle(rid).owner == "bob"

    assert cat.get(f"/c/{cid}").status_code == 404
    assert "BOB-SECRET-TITLE" not in cat.get("/").text
    assert cat.get(f"/v1/requests/{rid}").status_code == 404
    assert rid not in [r["id"] for r in cat.get("/v1/requests").json()["data"]]
    assert cat.delete(f"/v1/requests/{rid}").status_code == 404
    assert cat.post(f"/dashboard/requests/{rid}/cancel").status_code == 404
    board = cat.get("/dashboard").text
    assert rid in board and "BOB-SECRET-TITLE" not in board  # metadata only
    assert not re.search(rf'data-cancel="{rid}"', board)
    assert "BOB-SECRET-TITLE" in bob.get("/dashboard").text
    assert rid in server.engine.live_ids()

    assert cat.delete("/v1/requests/nope").status_code == 404
    assert bob.get(f"/c/{cid}").status_code == 200  # the owner reads it
    assert ann.get(f"/c/{cid}").status_code == 404  # private, even to an admin
    admin_view = ann.get(f"/v1/requests/{rid}")
    assert admin_view.json()["owner"] == "bob"  # the admin sees every request's metadata
    assert "BOB-SECRET" not in admin_view.text and "BOB-SECRET" not in ann.get("/v1/requests").text
    admin_board = ann.get("/dashboard").text
    assert rid in admin_board and "BOB-SECRET-TITLE" not in admin_board
    assert re.search(rf'data-cancel="{rid}"', admin_board)  # ... and may cancel it
    assert ann.delete(f"/v1/requests/{rid}").json()["cancelled"] is True
    waiter(lambda: not server.engine.live_ids(), 10, message="cancel")
    idle_check(server.engine)


def test_local_conversations_stay_with_the_admins(setup: tuple[Any, dict]) -> None:
    """What was made before sharing (owner "local") is reachable by any admin, no one else."""
    server, tokens = setup
    conv = server.services.store.create_conversation("local", "LOCAL-HISTORY")
    ann, bob = client(server, tokens, "ann"), client(server, tokens, "bob")
    page = ann.get(f"/c/{conv.id}")
    assert page.status_code == 200 and "LOCAL-HISTORY" in page.text
    assert bob.get(f"/c/{conv.id}").status_code == 404


def test_per_user_limit(setup: tuple[Any, dict], waiter: Any, idle_check: Any) -> None:
    server, tokens = setup
    bob = client(server, tokens, "bob")
    for text in ("one", "two"):
        assert bob.post("/c", data={"content": text}).status_code == 303
    waiter(lambda: len(server.engine.live_ids(owner="bob")) == 2, 10, message="two live")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "three"}], "max_tokens": 4}
    refused = bob.post("/v1/chat/completions", json=body)
    assert refused.status_code == 429 and refused.headers["retry-after"]
    assert refused.json()["error"]["code"] == "queue_full"
    cat = client(server, tokens, "cat")
    assert cat.post("/v1/chat/completions", json=body).status_code == 200  # others still can
    for rid in server.engine.live_ids():
        client(server, tokens, "ann").delete(f"/v1/requests/{rid}")
    idle_check(server.engine)


def test_session_cookie_and_csrf(setup: tuple[Any, dict], idle_check: Any) -> None:
    server, tokens = setup
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        signed = browser.post("/login", data={"token": tokens["cat"], "next": "/"})
        assert signed.status_code in (200, 303)
        page = browser.get("/")
        token = re.search(r'"X-CSRF-Token": "([^"]+)"', page.text)
        assert page.status_code == 200 and token and "Sign out" in page.text
        assert browser.post("/c", data={"content": "no token"}).status_code == 403
        made = browser.post("/c", data={"content": "with token", "csrf_token": token.group(1)},
                            follow_redirects=False)
        assert made.status_code == 303
    for rid in server.engine.live_ids():
        client(server, tokens, "ann").delete(f"/v1/requests/{rid}")
    idle_check(server.engine)


def test_users_file_lives_in_data_dir(setup: tuple[Any, dict]) -> None:
    server, _ = setup
    assert Path(server.services.config.users_path).exists()


def test_sign_out_kills_a_copied_cookie(setup: tuple[Any, dict]) -> None:
    """Over HTTP with the real cookie: after Sign out, a kept copy gets the login page."""
    server, tokens = setup
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        assert browser.post("/login", data={"token": tokens["cat"], "next": "/"}).status_code \
            in (200, 303)
        copied = browser.cookies["ferry_session"]
        page = browser.get("/")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert page.status_code == 200 and csrf
        out = browser.post("/logout", data={"csrf_token": csrf.group(1)}, follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/login"
    with httpx.Client(base_url=server.url, timeout=30,
                      cookies={"ferry_session": copied}) as thief:
        again = thief.get("/", headers={"Accept": "text/html"})
        assert again.status_code == 303 and again.headers["location"] == "/login"
        assert thief.get("/v1/requests").status_code == 401


@pytest.mark.browser
def test_sign_out_in_chromium_then_the_old_cookie_gets_the_login_page(
        setup: tuple[Any, dict], browser: Any, sign_in: Any) -> None:
    server, tokens = setup
    context = browser.new_context()
    try:
        page = sign_in(context, server.url, tokens["bob"])
        kept = [c for c in context.cookies() if c["name"] == "ferry_session"]
        assert kept
        page.get_by_role("button", name="Sign out").click()
        page.wait_for_url(re.compile(r"/login"))
    finally:
        context.close()
    replay = browser.new_context()
    try:
        replay.add_cookies(kept)  # type: ignore[arg-type]
        page = replay.new_page()
        page.goto(server.url + "/")
        assert "/login" in page.url and page.locator("input[name=token]").count() == 1
    finally:
        replay.close()

"""The chat's newer routes in shared mode: nobody reaches another user's conversation through
edit, Continue, versions, settings, rename, export or search (404, as for the page)."""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest


@pytest.fixture(scope="module")
def setup(make_shared_server: Any) -> tuple[Any, dict]:
    return make_shared_server("shared-chat", {"bob": False, "cat": False}, delay=0.01,
                              max_running=2, web={"default_max_tokens": 20})


def client(server: Any, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                        timeout=30)


def test_others_conversations_stay_out_of_reach(setup: tuple[Any, dict], waiter: Any,
                                                idle_check: Any) -> None:
    server, tokens = setup
    store = server.services.store
    bob, cat = client(server, tokens["bob"]), client(server, tokens["cat"])
    created = bob.post("/c", data={"content": "BOB-PRIVATE question"})
    cid = int(created.headers["location"].rsplit("/", 1)[1])
    waiter(lambda: store.messages(cid)[-1].status != "streaming", 30, message="bob's reply")
    question, reply = store.messages(cid)
    base = f"/c/{cid}/messages"
    for method, url, data in [
        ("GET", f"/c/{cid}/export.json", None), ("GET", f"/c/{cid}/export.md", None),
        ("POST", f"/c/{cid}/rename", {"title": "mine now"}),
        ("POST", f"/c/{cid}/settings", {"temperature": "1"}),
        ("POST", f"{base}/{question.id}/edit", {"content": "changed"}),
        ("POST", f"{base}/{reply.id}/continue", None), ("POST", f"{base}/{reply.id}/show", None),
        ("POST", f"{base}/{reply.id}/regenerate", None),
    ]:
        answer = cat.request(method, url, data=data)
        assert answer.status_code == 404, (url, answer.status_code)
    assert store.conversation(cid).title == "BOB-PRIVATE question"
    assert store.messages(cid)[0].content == "BOB-PRIVATE question"
    found = cat.get("/conversations", params={"q": "BOB-PRIVATE"}).text
    assert f'href="/c/{cid}"' not in found and "No conversation matches" in found
    assert f'href="/c/{cid}"' in bob.get("/conversations", params={"q": "bob-private"}).text
    # bob's export imports as cat's own copy, which bob cannot open
    exported = bob.get(f"/c/{cid}/export.json").json()
    imported = cat.post("/import", files={"file": ("c.json", json.dumps(exported))})
    assert imported.status_code == 303
    copy = int(imported.headers["location"].rsplit("/", 1)[1])
    assert store.conversation(copy).owner == "cat"
    assert bob.get(f"/c/{copy}").status_code == 404
    # bad settings and bad files are 400s with the reason
    bad = bob.post(f"/c/{cid}/settings", data={"top_p": "2"}, headers={"HX-Request": "true"})
    assert bad.status_code == 400 and "top_p must be between 0 and 1" in bad.text
    nested = cat.post("/import", files={"file": ("c.json", "[" * 100_000)})
    assert nested.status_code == 400 and "not JSON" in nested.text
    idle_check(server.engine)

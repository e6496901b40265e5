"""Privacy between users of a shared server: the prefix cache is kept per user, so a user who
sends another user's exact prompt gets no cached tokens (and no faster first token), while
the user who sent it hits their own cache. The real default model, two users (A an admin,
B not: the rule is the same for both)."""
from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.settings import Settings, engine_config

pytestmark = pytest.mark.model

MODEL = "SmolLM2-135M-Instruct"
PROMPT = ("Alice's private note: the meeting with the lawyers about the Hendricks merger "
          "moved to Thursday at 9, room 4B; bring the signed term sheet and the board's "
          "letter, and tell nobody in sales. " * 2)


def test_a_shared_server_keeps_prefixes_per_user() -> None:
    """What `ferry serve` builds: per user when shared, one shared cache when local."""
    assert engine_config(Settings(host="0.0.0.0")).prefix_cache_per_owner is True
    assert engine_config(Settings()).prefix_cache_per_owner is False


def test_another_users_prompt_is_not_a_cache_hit(make_server: Any, tmp_path_factory: Any,
                                                idle_check: Any) -> None:
    from web.access.users import UserStore

    data = tmp_path_factory.mktemp("privacy")
    store = UserStore(data / "users.json")
    tokens = {"alice": store.add("alice", admin=True), "bob": store.add("bob", admin=False)}
    server = make_server(data_dir=data, web={"shared": True}, prefix_cache_per_owner=True)

    def cached(user: str) -> int:
        body = {"model": MODEL, "max_tokens": 2, "temperature": 0,
                "messages": [{"role": "user", "content": PROMPT}]}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {tokens[user]}"})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] > 64  # several whole pages to hit
        return int(usage["prompt_tokens_details"]["cached_tokens"])

    assert cached("alice") == 0
    assert cached("bob") == 0  # alice's prompt, token for token: not a hit for bob
    assert cached("alice") > 0  # her own prompt again: a hit
    assert cached("bob") > 0  # bob's own copy, now cached for him
    board = httpx.get(server.url + "/dashboard", timeout=30, headers={
        "Authorization": f"Bearer {tokens['bob']}", "Accept": "text/html"}).text
    assert "on, per user" in board  # the settings panel says how the cache is kept
    idle_check(server.engine)

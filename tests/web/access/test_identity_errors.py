"""current_user's fallbacks and the mapping of engine refusals to HTTP answers."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from litestar.exceptions import NotAuthorizedException

from engine.runtime.engine import QueueFull
from engine.scheduling.request import RequestError
from web.access.identity import LOCAL_USER, User, current_user
from web.api.errors import from_engine
from web.config import WebConfig
from web.services import EngineUnavailable


def connection(user: object, shared: bool) -> SimpleNamespace:
    config = WebConfig(data_dir=Path("/nonexistent"), shared=shared)
    scope = {} if user is None else {"user": user}
    return SimpleNamespace(scope=scope, app=SimpleNamespace(state=SimpleNamespace(config=config)))


def test_local_admin_without_auth() -> None:
    assert current_user(connection(None, shared=False)) == LOCAL_USER
    assert LOCAL_USER.is_admin and LOCAL_USER.can_manage("anyone")


def test_auth_layer_user_is_used() -> None:
    alice = User("alice")
    assert current_user(connection(alice, shared=True)) is alice
    other = current_user(connection(SimpleNamespace(name="bob", is_admin=False), shared=True))
    assert other == User("bob") and other.can_manage("bob") and not other.can_manage("alice")


def test_shared_server_never_falls_back_to_local_admin() -> None:
    with pytest.raises(NotAuthorizedException):
        current_user(connection(None, shared=True))


def test_engine_refusals_map_to_status_codes() -> None:
    full = from_engine(QueueFull("the queue is full", retry_after=3))
    assert full.status_code == 429 and full.headers == {"Retry-After": "3"}
    down = from_engine(EngineUnavailable("the engine is not running"))
    assert down.status_code == 503 and "Retry-After" in (down.headers or {})
    bad = from_engine(RequestError("prompt too long"), "messages")
    assert bad.status_code == 400 and bad.param == "messages" and bad.type == \
        "invalid_request_error"

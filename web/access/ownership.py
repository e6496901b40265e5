"""Ownership rules: who may read a request's or conversation's text, and who may cancel it.

Each request and conversation has an owner (a user name; "local" when Ferry is not shared).
Owners see their own prompts and replies and cancel their own requests; admins see and cancel
everything. Everyone else sees other people's requests on the dashboard and in
GET /v1/requests only as metadata: visible_request() keeps an allowlist of fields, so text
the web layer adds under any other name (prompt, output, title, messages...) is dropped.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotFoundException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from web.access.identity import current_user

if TYPE_CHECKING:
    from web.access.users import (
        User,  # web.access.identity.User works too: both have .name and .is_admin
    )

# Fields that never hold user text: everything in engine.runtime.snapshot.RequestView plus a few the
# web layer may add. Anything not listed is removed from other users' requests.
METADATA_FIELDS = frozenset({
    "id", "owner", "state", "phase", "position", "reason", "slot", "prompt_tokens",
    "cached_tokens", "prefill_done", "chunk", "num_chunks", "output_tokens", "max_tokens",
    "arrival", "waited", "ttft", "itl", "finish_reason", "created", "kind", "model",
    "tokens_per_s", "elapsed", "redacted", "cancelled",
})


def can_see_text(user: User, owner: str) -> bool:
    return user.is_admin or user.name == owner


def can_cancel(user: User, owner: str) -> bool:
    return user.is_admin or user.name == owner


def check_cancel(user: User, owner: str | None) -> None:
    """Raise 404 for an unknown request (owner None) and 403 for someone else's."""
    if owner is None:
        raise NotFoundException("no such request")
    if not can_cancel(user, owner):
        raise PermissionDeniedException("you can only cancel your own requests")


def check_owner(user: User, owner: str | None) -> None:
    """For conversations: someone else's is answered exactly like a missing one (404)."""
    if owner is None or not can_see_text(user, owner):
        raise NotFoundException("no such conversation")


def _as_dict(view: Any) -> dict[str, Any]:
    if isinstance(view, Mapping):
        return dict(view)
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        data = dataclasses.asdict(view)
        phase = getattr(view, "phase", None)  # RequestView.phase is a property
        if isinstance(phase, str):
            data.setdefault("phase", phase)
        return data
    raise TypeError(f"cannot make a request view out of {type(view).__name__}")


def redact(view: Any) -> dict[str, Any]:
    data = _as_dict(view)
    out = {k: v for k, v in data.items() if k in METADATA_FIELDS}
    out["redacted"] = True
    return out


def visible_request(user: User, view: Any) -> dict[str, Any]:
    """The view as a dict: whole for its owner and admins, metadata only for anyone else."""
    data = _as_dict(view)
    owner = data.get("owner")
    if not isinstance(owner, str):
        raise TypeError("a request view needs an owner (a user name)")
    if can_see_text(user, owner):
        data["redacted"] = False
        return data
    return redact(data)


def visible_requests(user: User, views: Iterable[Any]) -> list[dict[str, Any]]:
    return [visible_request(user, view) for view in views]


def admin_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Litestar guard for admin-only routes (changing the policy at runtime, ...)."""
    if not current_user(connection).is_admin:
        raise PermissionDeniedException("only an admin can do this")

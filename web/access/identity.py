"""Who is asking: the one place handlers learn the current user.

An auth layer (web/auth.py, for LAN sharing) puts the signed-in user into
`request.scope["user"]`; without one, every request comes from the local admin.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException


@dataclass(frozen=True, slots=True)
class User:
    name: str
    is_admin: bool = False

    def can_see(self, owner: str) -> bool:
        """Whether this user may see (and cancel) a request or conversation of `owner`."""
        return self.is_admin or owner == self.name


LOCAL_USER = User("local", is_admin=True)


def current_user(request: ASGIConnection[Any, Any, Any, Any]) -> User:
    """The user behind `request`: the auth layer's, else the local admin.

    When the server is shared (listening beyond loopback) there is no local fallback: a
    request that reached a handler without a user is refused.
    """
    user = request.scope.get("user")
    if user is None:
        config = getattr(request.app.state, "config", None)
        if config is not None and config.shared:
            raise NotAuthorizedException("sign in first")
        return LOCAL_USER
    if isinstance(user, User):
        return user
    return User(str(user.name), bool(getattr(user, "is_admin", False)))

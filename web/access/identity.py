"""Who is asking: the one place handlers learn the current user, and the admin guard.

web.access.auth's middleware puts the signed-in user into `request.scope["user"]`; without
it, every request comes from the local admin. The user type and its ownership rule are
web.access.users.User.
"""
from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from web.access.users import LOCAL_USER, User

__all__ = ["LOCAL_USER", "User", "admin_guard", "current_user"]


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
    return User(str(user.name), is_admin=bool(getattr(user, "is_admin", False)))


def admin_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Litestar guard for admin-only routes (changing the policy at runtime, ...)."""
    if not current_user(connection).is_admin:
        raise PermissionDeniedException("only an admin can do this")

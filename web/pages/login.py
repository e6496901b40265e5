"""GET /login (form), POST /login (token -> session cookie), POST /logout.

Needs web.access.auth.AuthMiddleware on the app (it hands these handlers the Auth object) and a
Jinja template config that includes web/templates (for login.html).
"""
from __future__ import annotations

from typing import Any

from litestar import Request, Router, get, post
from litestar.datastructures import Cookie
from litestar.exceptions import ImproperlyConfiguredException
from litestar.response import Redirect, Response, Template

from web.access.auth import (
    COOKIE_SAMESITE,
    SCOPE_AUTH,
    SCOPE_SESSION,
    SESSION_COOKIE,
    Auth,
    csrf_token,
    safe_next,
)
from web.worker import below_engine

LOGIN_TEMPLATE = "login.html"


def auth_of(request: Request[Any, Any, Any]) -> Auth:
    auth = request.scope.get(SCOPE_AUTH)
    if not isinstance(auth, Auth):
        raise ImproperlyConfiguredException("web.access.auth.AuthMiddleware is not installed")
    return auth


def is_https(request: Request[Any, Any, Any]) -> bool:
    return request.scope.get("scheme") == "https"


def session_cookie(value: str, *, secure: bool, max_age: int) -> Cookie:
    return Cookie(key=SESSION_COOKIE, value=value, path="/", max_age=max_age, httponly=True,
                  samesite=COOKIE_SAMESITE, secure=secure or None)


def login_form(request: Request[Any, Any, Any], next_url: str, error: str | None = None,
               status_code: int = 200) -> Template:
    return Template(LOGIN_TEMPLATE, status_code=status_code,
                    context={"error": error, "next": next_url, "csrf_token": csrf_token(request)},
                    headers={"Cache-Control": "no-store"})


@get("/login", name="login")
async def login_page(request: Request[Any, Any, Any]) -> Response[Any]:
    auth = auth_of(request)
    target = safe_next(request.query_params.get("next"))
    if not auth.shared or request.scope.get("user") is not None:
        return Redirect(target, status_code=303)
    return login_form(request, target)


@post("/login", name="login_submit", status_code=303)
async def login_submit(request: Request[Any, Any, Any]) -> Response[Any]:
    auth = auth_of(request)
    form = await request.form()
    target = safe_next(str(form.get("next") or "/"))
    if not auth.shared:
        return Redirect(target, status_code=303)
    token = str(form.get("token") or "")
    # a token's hash and the users file's write (fsync) off the event loop
    result = await below_engine(auth.login, token) if token else None
    if result is None:
        return login_form(request, target, "That token is not valid. Check it and try again.",
                          status_code=401)
    _, value = result
    return Redirect(target, status_code=303, cookies=[
        session_cookie(value, secure=is_https(request), max_age=auth.max_age)])


@post("/logout", name="logout", status_code=303)
async def logout(request: Request[Any, Any, Any]) -> Response[Any]:
    auth = auth_of(request)
    cookie = request.scope.get(SCOPE_SESSION)
    if isinstance(cookie, str) and cookie:
        # the server forgets the session (copies of the cookie stop working): a file write
        await below_engine(auth.logout, cookie)
    response: Response[Any] = Redirect("/login" if auth.shared else "/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


login_router = Router(path="/", route_handlers=[login_page, login_submit, logout],
                      include_in_schema=False)

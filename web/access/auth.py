"""Who is asking: the ASGI middleware that checks bearer tokens, session cookies and CSRF
tokens (their signing lives in web.access.sessions).

Local mode (Ferry listens on loopback only): everyone is LOCAL_USER (an admin), and
state-changing requests that a browser marks as coming from another site are refused (a web
page must not be able to drive a local Ferry).

Shared mode (any other address): every request except PUBLIC_PATHS needs either
`Authorization: Bearer <token>` (API clients; no CSRF check, browsers never add it on their
own) or the `ferry_session` cookie set by POST /login. Cookie-authenticated POST/PUT/PATCH/
DELETE must also carry the CSRF token, as the `X-CSRF-Token` header (htmx, fetch) or as the
`csrf_token` form field (plain forms). The token is an HMAC of the session cookie and changes
with each login; the session itself is listed in the users file until Sign out.

The middleware leaves the user in scope["user"] (Litestar's `request.user`): a
web.access.users.User, or None on a public path nobody is signed in to. Handlers read it with
web.access.identity.current_user.
"""
from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar
from urllib.parse import quote, urlsplit

from web.access.forms import form_field
from web.access.sessions import SESSION_MAX_AGE, SessionSigner, load_secret_key
from web.access.users import LOCAL_USER, User, UserError, UserStore
from web.worker import below_engine

T = TypeVar("T")

if TYPE_CHECKING:
    from web.config import WebConfig

log = logging.getLogger("ferry.auth")

SESSION_COOKIE = "ferry_session"
# Lax: links from other sites still land signed in; CSRF tokens guard posts
COOKIE_SAMESITE: Literal["lax"] = "lax"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
PUBLIC_PATHS = frozenset({"/login", "/healthz", "/favicon.ico"})
PUBLIC_PREFIXES = ("/static/",)
API_PREFIXES = ("/v1/", "/api/")
API_PATHS = frozenset({"/v1", "/metrics"})
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# scope keys the middleware sets besides "user"
SCOPE_AUTH = "ferry.auth"  # the Auth object (login handlers use it)
SCOPE_CSRF = "ferry.csrf"  # the CSRF token for this session ("" when none is needed)
SCOPE_VIA = "ferry.auth_via"  # "local" | "bearer" | "session" | None
SCOPE_SESSION = "ferry.session"  # the session cookie value in use ("" when none): logout ends it
CROSS_SITE = "requests from other sites are not accepted"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Auth:
    """Everything the middleware and the login handlers need: mode, users, signer."""

    def __init__(self, *, shared: bool, store: UserStore, key: bytes,
                 max_age: int = SESSION_MAX_AGE, max_body_bytes: int = 1024 * 1024,
                 clock: Callable[[], float] = time.time) -> None:
        self.shared = shared
        self.store = store
        self.signer = SessionSigner(key, max_age=max_age, clock=clock)
        self.max_body_bytes = max_body_bytes

    @classmethod
    def from_config(cls, config: WebConfig, store: UserStore | None = None) -> Auth:
        return cls(shared=config.shared,
                   store=store if store is not None else UserStore(config.users_path),
                   key=load_secret_key(config.data_dir, config.secret_key),
                   # the largest form a route takes (the chat's, with pictures): a form read
                   # for its CSRF token; each route then holds its body to its own limit
                   max_body_bytes=config.chat_body_bytes)

    @property
    def max_age(self) -> int:
        return self.signer.max_age

    def bearer_user(self, token: str) -> User | None:
        """The token's user, or None; blocks for a token not seen before (its hash: tens of
        milliseconds), so off the event loop (known_bearer_user first)."""
        return _unless_store_fails("check a token", lambda: self.store.verify(token))

    def known_bearer_user(self, token: str) -> User | None:
        """The user of a token verified before, at once; None: ask bearer_user."""
        return _unless_store_fails("check a token", lambda: self.store.verified(token))

    def session_user(self, cookie_value: str) -> User | None:
        session = self.signer.unsign(cookie_value)
        if session is None:
            return None
        record = _unless_store_fails("check a session", lambda: self.store.get(session.name))
        if record is None or not hmac.compare_digest(record.token_id, session.token_id):
            return None  # removed, or the token was rotated since this login
        if session.sid not in record.sessions:
            return None  # signed out (or pushed out by newer sessions)
        return record.user

    def login(self, token: str) -> tuple[User, str] | None:
        """(user, session cookie value) for a valid token, else None."""
        user = self.bearer_user(token.strip())
        if user is None:
            return None
        record = self.store.get(user.name)
        if record is None:
            return None
        sid = _unless_store_fails("open a session", lambda: self.store.open_session(user.name))
        if sid is None:
            return None
        return user, self.signer.sign(user.name, record.token_id, sid)

    def logout(self, cookie_value: str) -> None:
        """End the session behind this cookie on the server: the cookie stops working even
        where a copy of it is kept."""
        session = self.signer.unsign(cookie_value)
        if session is None:
            return
        _unless_store_fails("close a session",
                            lambda: self.store.close_session(session.name, session.sid))

    def csrf_token(self, cookie_value: str) -> str:
        return self.signer.csrf_token(cookie_value)


def _unless_store_fails(what: str, call: Callable[[], T]) -> T | None:
    """call(), or None (logged) where the users file cannot be read or written."""
    try:
        return call()
    except UserError as exc:
        log.error("cannot %s: %s", what, exc)
        return None


# --- helpers on raw ASGI scopes ------------------------------------------------------------

def header(scope: Scope, name: str) -> str | None:
    raw = name.encode("latin-1")
    for key, value in scope.get("headers", ()):
        if key.lower() == raw:
            return bytes(value).decode("latin-1")
    return None


def cookie_values(header: str | None, name: str) -> list[str]:
    """Every value the Cookie header gives `name` (other apps on this host may share names)."""
    if not header:
        return []
    found = []
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            found.append(value.strip().strip('"'))
    return found


def _norm_host(host: str, scheme: str) -> str:
    host = host.strip().lower()
    default = {"http": ":80", "https": ":443", "ws": ":80", "wss": ":443"}.get(scheme)
    if default and host.endswith(default):
        host = host[: -len(default)]
    return host


def is_cross_site(scope: Scope) -> bool:
    """True when the browser says this request was started by another site (or origin)."""
    site = header(scope, "sec-fetch-site")
    if site is not None:
        return site.strip().lower() not in ("same-origin", "none")
    origin = header(scope, "origin")
    if origin is None:
        return False  # not a browser, or an old one on a same-origin GET-like request
    if origin.strip() == "null":
        return True
    host = header(scope, "host")
    if not host:
        return True
    parts = urlsplit(origin.strip())
    scheme = scope.get("scheme", "http")
    return _norm_host(parts.netloc, parts.scheme) != _norm_host(host, scheme)


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def is_api(path: str) -> bool:
    return path in API_PATHS or path.startswith(API_PREFIXES)


def safe_next(target: str | None) -> str:
    """A local path to go to after login; anything else (other hosts, odd schemes) -> "/"."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    if any(c in target for c in "\r\n\t\\") or target.split("?")[0] in ("/login", "/logout"):
        return "/"
    return target


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def csrf_from_body(content_type: str, body: bytes) -> str | None:
    return form_field(content_type, body, CSRF_FIELD)


async def send_simple(send: Send, status: int, body: bytes, content_type: str,
                      headers: list[tuple[str, str]] | None = None) -> None:
    raw = [(b"content-type", content_type.encode()),
           (b"content-length", str(len(body)).encode()),
           (b"cache-control", b"no-store")]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers or ()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _error_json(status: int, kind: str, message: str) -> bytes:
    code = {401: "unauthorized", 403: "forbidden", 413: "too_large"}.get(status, str(status))
    # the same shape as web.api.errors (OpenAI's): message, type, param, code
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}).encode()


@dataclass(frozen=True, slots=True)
class Caller:
    user: User | None
    via: str | None  # "bearer" | "session" | None
    cookie: str = ""  # the session cookie value that signed the user in


def changes_state(scope: Scope) -> bool:
    return scope.get("type") == "websocket" or scope.get("method", "GET") in UNSAFE_METHODS


class AuthMiddleware:
    """Pure ASGI middleware; in Litestar: `DefineMiddleware(AuthMiddleware, auth=auth)`."""

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope[SCOPE_AUTH] = self.auth
        scope[SCOPE_CSRF] = ""
        scope[SCOPE_SESSION] = ""
        if self.auth.shared:
            await self.shared(scope, receive, send)
        else:
            await self.local(scope, receive, send)

    async def local(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Loopback only: everyone is the local admin; other sites may not change state."""
        scope["user"] = LOCAL_USER
        scope[SCOPE_VIA] = "local"
        if changes_state(scope) and is_cross_site(scope):
            await self.forbid(scope, send, CROSS_SITE)
            return
        await self.app(scope, receive, send)

    async def shared(self, scope: Scope, receive: Receive, send: Send) -> None:
        """On the LAN: a bearer token or a session cookie (+ CSRF token) on every path but
        the public ones."""
        public = is_public(scope.get("path", "/"))
        caller = await self.identify(scope)
        if caller is None:  # a wrong bearer token
            if not public:
                await self.unauthorized(scope, send, "invalid access token", force_json=True)
                return
            caller = Caller(None, None)
        scope["user"] = caller.user
        scope[SCOPE_VIA] = caller.via
        if caller.via == "session":
            scope[SCOPE_CSRF] = self.auth.csrf_token(caller.cookie)
            scope[SCOPE_SESSION] = caller.cookie
        if caller.via != "bearer" and changes_state(scope) and is_cross_site(scope):
            await self.forbid(scope, send, CROSS_SITE)
            return
        if caller.user is None:
            if public:
                await self.app(scope, receive, send)
            else:
                await self.unauthorized(scope, send, "sign in or send an access token")
            return
        if caller.via == "session" and scope["type"] == "http" and not public \
                and scope.get("method", "GET") in UNSAFE_METHODS:
            checked = await self.check_csrf(scope, receive, send, caller.cookie)
            if checked is None:
                return
            receive = checked
        await self.app(scope, receive, send)

    async def identify(self, scope: Scope) -> Caller | None:
        """Who sent this: by bearer token (or `x-api-key`, which counts as one), else by session
        cookie; None for a bad token. A token not seen before is checked on a worker thread:
        its hash would hold the event loop, every user's streams with it, for tens of ms."""
        authorization = header(scope, "authorization")
        api_key = header(scope, "x-api-key")  # Anthropic's clients send the token here
        if authorization is None and api_key is not None:
            authorization = f"Bearer {api_key}"
        if authorization is not None:
            scheme, _, token = authorization.strip().partition(" ")
            user = None
            token = token.strip()
            if scheme.lower() == "bearer" and token:
                user = self.auth.known_bearer_user(token) \
                    or await below_engine(self.auth.bearer_user, token)
            return Caller(user, "bearer") if user is not None else None
        for value in cookie_values(header(scope, "cookie"), SESSION_COOKIE):
            user = self.auth.session_user(value)
            if user is not None:
                return Caller(user, "session", value)
        return Caller(None, None)

    async def check_csrf(self, scope: Scope, receive: Receive, send: Send,
                         cookie: str) -> Receive | None:
        """The receive to pass on (the body replayed if it was read for the token), or None
        when the request was refused (answer sent)."""
        supplied = header(scope, CSRF_HEADER)
        if supplied is None:
            content_type = header(scope, "content-type") or ""
            if content_type.split(";")[0].strip().lower() in FORM_TYPES:
                body = await self.read_body(receive)
                if body is None:
                    await send_simple(send, 413, _error_json(
                        413, "invalid_request_error", "request body too large"),
                        "application/json")
                    return None
                supplied = csrf_from_body(content_type, body)
                receive = self.replay(body, receive)
        if not self.auth.signer.check_csrf(cookie, supplied):
            await self.forbid(scope, send, "missing or wrong CSRF token; reload the page "
                                           "and try again")
            return None
        return receive

    async def read_body(self, receive: Receive) -> bytes | None:
        """The whole request body, or None when it exceeds max_body_bytes."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # disconnected: the app will see an empty body and the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.auth.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    def replay(body: bytes, receive: Receive) -> Receive:
        sent = False

        async def again() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return again

    async def unauthorized(self, scope: Scope, send: Send, message: str,
                           force_json: bool = False) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        path = scope.get("path", "/")
        accept = header(scope, "accept") or ""
        if not force_json and header(scope, "hx-request") == "true":
            await send_simple(send, 401, b"Please sign in.", "text/plain; charset=utf-8",
                              [("HX-Redirect", "/login")])
            return
        if not force_json and "text/html" in accept and not is_api(path):
            target = "/"
            if scope.get("method") in ("GET", "HEAD"):
                query = scope.get("query_string", b"").decode("latin-1")
                target = safe_next(path + (f"?{query}" if query else ""))
            location = "/login" if target == "/" else f"/login?next={quote(target, safe='')}"
            await send_simple(send, 303, b"", "text/plain; charset=utf-8",
                              [("Location", location)])
            return
        await send_simple(send, 401, _error_json(401, "authentication_error", message),
                          "application/json",
                          [("WWW-Authenticate", 'Bearer realm="ferry"')])

    async def forbid(self, scope: Scope, send: Send, message: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if is_api(scope.get("path", "/")) or "json" in (header(scope, "accept") or ""):
            await send_simple(send, 403, _error_json(403, "permission_error", message),
                              "application/json")
        else:
            await send_simple(send, 403, f"Forbidden: {message}.".encode(),
                              "text/plain; charset=utf-8")


def csrf_token(connection: Any) -> str:
    """The token a page's forms send back as `csrf_token` (htmx: the X-CSRF-Token header).

    Takes a Litestar Request (or anything with .scope). Empty when none is needed (local mode,
    Bearer clients): templates can always include it.
    """
    return str(connection.scope.get(SCOPE_CSRF, "") or "")

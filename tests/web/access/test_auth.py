"""Access control: the user store, session cookies, CSRF, the middleware, login, ownership."""
from __future__ import annotations

import json
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar, Request, get, post
from litestar.middleware import DefineMiddleware
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.template.config import TemplateConfig
from litestar.testing import TestClient

from web.access.auth import (
    CSRF_FIELD,
    SESSION_COOKIE,
    Auth,
    AuthMiddleware,
    cookie_values,
    csrf_from_body,
    csrf_token,
    safe_next,
)
from web.access.identity import admin_guard, current_user
from web.access.sessions import SessionSigner, load_secret_key
from web.access.users import LOCAL_USER, User, UserError, UserStore, token_id_of
from web.config import WebConfig
from web.pages.login import login_router

TEMPLATES = Path(__file__).resolve().parents[3] / "web" / "templates"
FAST_N = 2 ** 10  # cheap scrypt for tests; the format and code path are the same
POSIX = sys.platform != "win32"


@pytest.fixture
def store(tmp_path: Path) -> UserStore:
    return UserStore(tmp_path / "users.json", scrypt_n=FAST_N)


# --- the user store --------------------------------------------------------------------------

def test_add_stores_only_a_hash(store: UserStore) -> None:
    token = store.add("ann", admin=True)
    assert token.startswith("fy_") and len(token) >= 50
    text = store.path.read_text()
    assert token not in text and token[15:] not in text  # neither the token nor its secret part
    data = json.loads(text)
    rec = data["users"]["ann"]
    assert rec["admin"] is True and rec["kdf"].startswith(("scrypt:", "pbkdf2_sha256:"))
    assert rec["token_id"] == token_id_of(token) and len(bytes.fromhex(rec["salt"])) == 16
    if POSIX:
        assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert not list(store.path.parent.glob(".users.json.*"))  # no temp files left behind


def test_verify(store: UserStore) -> None:
    ann = store.add("ann", admin=True)
    bob = store.add("bob")
    assert store.verify(ann) == User("ann", True)
    assert store.verify(bob) == User("bob", False)
    assert store.verify(bob) == User("bob", False)  # cached path
    assert store.verify(ann[:-1] + ("A" if ann[-1] != "A" else "B")) is None
    for junk in ("", "fy_", "nope", ann[:20], "fy_zzzzzzzzzzzz" + "a" * 43, "x" * 5000):
        assert store.verify(junk) is None
    # a token from another store with the same id format is not accepted
    other = UserStore(store.path.parent / "other.json", scrypt_n=FAST_N).add("ann")
    assert store.verify(other) is None


def test_rotate_invalidates_old_token(store: UserStore) -> None:
    old = store.add("ann")
    assert store.verify(old) is not None  # now cached
    new = store.rotate("ann")
    assert new != old
    assert store.verify(old) is None
    assert store.verify(new) == User("ann", False)
    assert store.get("ann").rotated is not None  # type: ignore[union-attr]


def test_remove_and_has_users(store: UserStore) -> None:
    assert not store.has_users()
    token = store.add("ann")
    assert store.has_users()
    store.verify(token)
    store.remove("ann")
    assert store.verify(token) is None
    assert not store.has_users()
    with pytest.raises(UserError, match="no user named 'ann'"):
        store.remove("ann")
    with pytest.raises(UserError, match="no user named"):
        store.rotate("ann")


def test_changes_by_another_process_are_seen(store: UserStore) -> None:
    token = store.add("ann")
    server = UserStore(store.path, scrypt_n=FAST_N)  # e.g. the running server
    assert server.verify(token) is not None
    store.remove("ann")  # e.g. `ferry users remove ann`
    assert server.verify(token) is None
    assert [r.name for r in server.list()] == []


@pytest.mark.parametrize("name", ["", "a" * 33, "has space", "semi;colon", "ünï", "local",
                                  "a/b"])
def test_bad_names(store: UserStore, name: str) -> None:
    with pytest.raises(UserError):
        store.add(name)


def test_good_names_and_duplicates(store: UserStore) -> None:
    for name in ("a", "A.b-c_9", "x" * 32):
        store.add(name)
    with pytest.raises(UserError, match="already exists"):
        store.add("a")
    assert [r.name for r in store.list()] == sorted(["a", "A.b-c_9", "x" * 32])


@pytest.mark.parametrize("content", ["{not json", '["a"]', '{"users": {"ann": {"admin": 1}}}'])
def test_damaged_file_is_a_clear_error(store: UserStore, content: str) -> None:
    store.path.write_text(content)
    with pytest.raises(UserError, match=r"users\.json"):
        store.has_users()
    with pytest.raises(UserError):  # a damaged file is not "a wrong token": Auth logs it
        store.verify("fy_" + "0" * 12 + "a" * 43)


def test_empty_file_means_no_users(store: UserStore) -> None:
    store.path.write_text("")
    assert not store.has_users()


# --- keys, cookies and CSRF -----------------------------------------------------------------

def test_secret_key_made_once(tmp_path: Path) -> None:
    key = load_secret_key(tmp_path)
    assert len(key) == 32 and load_secret_key(tmp_path) == key
    if POSIX:
        assert stat.S_IMODE((tmp_path / "secret.key").stat().st_mode) == 0o600
    assert load_secret_key(tmp_path, b"k" * 32) == b"k" * 32


def test_cookie_sign_expire_tamper() -> None:
    now = [1000.0]
    signer = SessionSigner(b"k" * 32, max_age=60, clock=lambda: now[0])
    value = signer.sign("ann", "abc")
    session = signer.unsign(value)
    assert session is not None and session.name == "ann" and session.token_id == "abc"
    assert signer.sign("ann", "abc") != value  # each login differs
    body, mac = value.split(".")
    assert signer.unsign(body + "." + mac[:-1] + ("A" if mac[-1] != "A" else "B")) is None
    forged = SessionSigner(b"x" * 32, max_age=60, clock=lambda: now[0]).sign("ann", "abc")
    assert signer.unsign(forged) is None
    assert signer.unsign(forged.split(".")[0] + "." + mac) is None
    for junk in (None, "", "a.b.c", "....", "%%%.%%%", "x" * 2000):
        assert signer.unsign(junk) is None
    now[0] += 61
    assert signer.unsign(value) is None


def test_csrf_accept_reject() -> None:
    signer = SessionSigner(b"k" * 32)
    cookie = signer.sign("ann", "abc")
    token = signer.csrf_token(cookie)
    assert signer.check_csrf(cookie, token)
    assert not signer.check_csrf(cookie, None)
    assert not signer.check_csrf(cookie, "")
    assert not signer.check_csrf(cookie, token[:-1])
    assert not signer.check_csrf(signer.sign("ann", "abc"), token)  # another session's token
    assert not signer.check_csrf(cookie, "ü" * 10)


def test_csrf_from_bodies() -> None:
    assert csrf_from_body("application/x-www-form-urlencoded", b"a=1&csrf_token=xy-Z_") == "xy-Z_"
    multipart = (b'--B\r\nContent-Disposition: form-data; name="text"\r\n\r\nhi\r\n'
                 b'--B\r\nContent-Disposition: form-data; name="csrf_token"\r\n\r\nT0k\r\n'
                 b'--B--\r\n')
    assert csrf_from_body("multipart/form-data; boundary=B", multipart) == "T0k"
    assert csrf_from_body("application/json", b'{"csrf_token": "x"}') is None


def test_cookie_values_and_safe_next() -> None:
    assert cookie_values('a=1; ferry_session=x.y; ferry_session="z.w"', SESSION_COOKIE) == [
        "x.y", "z.w"]
    assert cookie_values(None, SESSION_COOKIE) == []
    assert safe_next("/chat/3?x=1") == "/chat/3?x=1"
    for bad in (None, "", "http://evil", "//evil.com", "/\\evil.com", "evil", "/login",
                "/a\r\nSet-Cookie: x"):
        assert safe_next(bad) == "/"


# --- the middleware on a tiny app ------------------------------------------------------------

@get("/")
async def home(request: Request[Any, Any, Any]) -> str:
    return f"home for {current_user(request).name} csrf={csrf_token(request)}"


@get("/v1/whoami")
async def whoami(request: Request[Any, Any, Any]) -> dict[str, Any]:
    user = current_user(request)
    return {"name": user.name, "admin": user.is_admin}


@post("/chat/send")
async def chat_send(request: Request[Any, Any, Any]) -> dict[str, Any]:
    form = await request.form()  # the middleware read the body for the CSRF field: replayed
    return {"text": form.get("text"), "user": current_user(request).name}


@post("/v1/echo")
async def echo(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"got": await request.json(), "user": current_user(request).name}


@get("/healthz")
async def healthz() -> str:
    return "ok"


@get("/metrics")
async def metrics() -> str:
    return "ferry_up 1"


@post("/admin/policy", guards=[admin_guard])
async def set_policy() -> str:
    return "changed"


@get("/v1/requests")
async def list_requests(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"data": [], "user": current_user(request).name}


@get("/dashboard")
async def dashboard(request: Request[Any, Any, Any]) -> str:
    return f"dashboard for {current_user(request).name}"


def make_app(auth: Auth) -> Litestar:
    return Litestar(
        [home, whoami, chat_send, echo, healthz, metrics, set_policy, list_requests, dashboard,
         login_router],
        middleware=[DefineMiddleware(AuthMiddleware, auth=auth)],
        template_config=TemplateConfig(directory=TEMPLATES, engine=JinjaTemplateEngine))


@pytest.fixture
def tokens(store: UserStore) -> dict[str, str]:
    return {"ann": store.add("ann", admin=True), "bob": store.add("bob"),
            "cat": store.add("cat")}


@pytest.fixture
def shared(tmp_path: Path, store: UserStore) -> Iterator[TestClient[Litestar]]:
    auth = Auth(shared=True, store=store, key=load_secret_key(tmp_path), max_body_bytes=4096)
    with TestClient(make_app(auth)) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def login(client: TestClient[Litestar], token: str, next_url: str = "/") -> str:
    """Sign in through the form; returns the page's CSRF token."""
    response = client.post("/login", data={"token": token, "next": next_url},
                           follow_redirects=False)
    assert response.status_code == 303, response.text
    assert response.headers["location"] == next_url
    page = client.get("/")
    assert page.status_code == 200
    return page.text.split("csrf=")[1]


def test_no_token_api_401(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    for path in ("/v1/whoami", "/v1/requests", "/metrics"):
        response = shared.get(path)
        assert response.status_code == 401, path
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert shared.post("/v1/echo", json={"a": 1}).status_code == 401
    assert shared.get("/", headers={"accept": "*/*"}).status_code == 401  # curl: no redirect


def test_no_token_page_redirects(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    response = shared.get("/dashboard?x=1", headers={"accept": "text/html"},
                          follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=%2Fdashboard%3Fx%3D1"
    htmx = shared.get("/dashboard", headers={"accept": "text/html", "hx-request": "true"})
    assert htmx.status_code == 401 and htmx.headers["hx-redirect"] == "/login"
    # an API path never redirects, even for a browser
    assert shared.get("/v1/whoami", headers={"accept": "text/html"},
                      follow_redirects=False).status_code == 401


def test_public_paths(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    assert shared.get("/healthz").text == "ok"
    page = shared.get("/login")
    assert page.status_code == 200 and 'name="token"' in page.text


def test_bearer(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    assert shared.get("/v1/whoami", headers=bearer(tokens["bob"])).json() == {
        "name": "bob", "admin": False}
    assert shared.get("/metrics", headers=bearer(tokens["bob"])).status_code == 200
    # Bearer needs no CSRF token: browsers never send Authorization on their own
    echoed = shared.post("/v1/echo", json={"a": 1}, headers=bearer(tokens["bob"]))
    assert echoed.status_code == 201 and echoed.json() == {"got": {"a": 1}, "user": "bob"}
    for header in ("Bearer nope", "Bearer " + tokens["bob"][:-2], "Basic Ym9iOng=", "Bearer"):
        response = shared.get("/v1/whoami", headers={"Authorization": header,
                                                     "accept": "text/html"})
        assert response.status_code == 401, header
    # a bad bearer is refused even if a good cookie is present
    login(shared, tokens["bob"])
    assert shared.get("/v1/whoami", headers=bearer("fy_bad")).status_code == 401


def test_cookie_login_flags_and_use(shared: TestClient[Litestar],
                                    tokens: dict[str, str]) -> None:
    response = shared.post("/login", data={"token": tokens["bob"], "next": "/dashboard"},
                           follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/dashboard"
    set_cookie = response.headers["set-cookie"]
    assert set_cookie.startswith(f"{SESSION_COOKIE}=")
    flags = [part.strip().lower() for part in set_cookie.split(";")]
    assert "httponly" in flags and "samesite=lax" in flags and "path=/" in flags
    assert "secure" not in flags  # plain http: a Secure cookie would never come back
    assert any(f.startswith("max-age=") for f in flags)
    assert tokens["bob"] not in set_cookie
    assert shared.get("/v1/whoami").json()["name"] == "bob"
    assert shared.get("/login", follow_redirects=False).status_code == 303  # already signed in


def test_secure_flag_on_https(tmp_path: Path, store: UserStore,
                              tokens: dict[str, str]) -> None:
    auth = Auth(shared=True, store=store, key=load_secret_key(tmp_path))
    with TestClient(make_app(auth), base_url="https://ferry.test") as client:
        response = client.post("/login", data={"token": tokens["bob"]}, follow_redirects=False)
        assert "secure" in [p.strip().lower() for p in response.headers["set-cookie"].split(";")]


def test_wrong_token_login(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    response = shared.post("/login", data={"token": "fy_wrong<script>", "next": "//evil.com"})
    assert response.status_code == 401
    assert "not valid" in response.text and "set-cookie" not in response.headers
    assert "<script>" not in response.text
    assert 'value="/"' in response.text  # the off-site next was dropped
    assert shared.get("/v1/whoami").status_code == 401


def test_login_from_another_site_refused(shared: TestClient[Litestar],
                                         tokens: dict[str, str]) -> None:
    response = shared.post("/login", data={"token": tokens["bob"]},
                           headers={"origin": "http://evil.example"}, follow_redirects=False)
    assert response.status_code == 403 and "set-cookie" not in response.headers


def test_csrf(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    csrf = login(shared, tokens["bob"])
    assert csrf
    # missing or wrong: 403
    assert shared.post("/chat/send", data={"text": "hi"}).status_code == 403
    assert shared.post("/chat/send", data={"text": "hi", CSRF_FIELD: "x" * 43}).status_code == 403
    assert shared.post("/v1/echo", json={"a": 1}).status_code == 403
    assert shared.post("/v1/echo", json={"a": 1},
                       headers={"X-CSRF-Token": csrf[:-1]}).status_code == 403
    # right, as a form field (the body still reaches the handler) or as the htmx header
    ok = shared.post("/chat/send", data={"text": "hi there", CSRF_FIELD: csrf})
    assert ok.status_code == 201 and ok.json() == {"text": "hi there", "user": "bob"}
    ok = shared.post("/chat/send", files={"text": (None, "multi")}, data={CSRF_FIELD: csrf})
    assert ok.status_code == 201 and ok.json()["text"] == "multi"
    ok = shared.post("/v1/echo", json={"a": 1}, headers={"X-CSRF-Token": csrf})
    assert ok.status_code == 201
    # a valid token from another site's page is still refused
    assert shared.post("/chat/send", data={"text": "x", CSRF_FIELD: csrf},
                       headers={"sec-fetch-site": "cross-site"}).status_code == 403
    # another session's token does not fit this session
    other = TestClient(shared.app)
    with other:
        other_csrf = login(other, tokens["cat"])
    assert shared.post("/v1/echo", json={}, headers={"X-CSRF-Token": other_csrf}).status_code \
        == 403


def test_csrf_body_limit(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    login(shared, tokens["bob"])
    assert shared.post("/chat/send", data={"text": "x" * 10_000}).status_code == 413


def test_logout(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    csrf = login(shared, tokens["bob"])
    assert shared.post("/logout").status_code == 403  # logout is a form post: CSRF too
    response = shared.post("/logout", data={CSRF_FIELD: csrf}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login"
    assert SESSION_COOKIE in response.headers["set-cookie"]
    assert shared.get("/v1/whoami").status_code == 401


def test_sign_out_ends_the_session_on_the_server(shared: TestClient[Litestar], store: UserStore,
                                                 tokens: dict[str, str]) -> None:
    csrf = login(shared, tokens["bob"])
    copied = shared.cookies[SESSION_COOKIE]  # what a cookie thief (or a second tab) kept
    other = TestClient(shared.app, base_url=str(shared.base_url))  # closed with the app
    login(other, tokens["bob"])  # bob's second browser: stays signed in
    assert len(store.get("bob").sessions) == 2  # type: ignore[union-attr]
    assert shared.post("/logout", data={CSRF_FIELD: csrf}).status_code == 200  # -> /login
    assert len(store.get("bob").sessions) == 1  # type: ignore[union-attr]
    shared.cookies.set(SESSION_COOKIE, copied)
    assert shared.get("/v1/whoami").status_code == 401
    page = shared.get("/", headers={"accept": "text/html"}, follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login"
    assert other.get("/v1/whoami").json() == {"name": "bob", "admin": False}


def test_sessions_are_bounded_and_rotate_ends_them(store: UserStore) -> None:
    store.add("bob")
    from web.access.users import MAX_SESSIONS
    sids = [store.open_session("bob") for _ in range(MAX_SESSIONS + 3)]
    assert store.get("bob").sessions == tuple(sids[-MAX_SESSIONS:])  # type: ignore[union-attr]
    assert store.close_session("bob", sids[-1]) and not store.close_session("bob", sids[-1])
    assert not store.close_session("nobody", "x")
    store.rotate("bob")
    assert store.get("bob").sessions == ()  # type: ignore[union-attr]
    with pytest.raises(UserError):
        store.open_session("nobody")


def test_rotate_and_remove_end_sessions(shared: TestClient[Litestar], store: UserStore,
                                        tokens: dict[str, str]) -> None:
    login(shared, tokens["bob"])
    store.rotate("bob")
    assert shared.get("/v1/whoami").status_code == 401
    login(shared, tokens["cat"])
    store.remove("cat")
    assert shared.get("/v1/whoami").status_code == 401
    assert shared.get("/v1/whoami", headers=bearer(tokens["cat"])).status_code == 401


def test_forged_cookie(shared: TestClient[Litestar], tokens: dict[str, str],
                       tmp_path: Path) -> None:
    forged = SessionSigner(b"attacker" * 4).sign("ann", "000000000000")
    shared.cookies.set(SESSION_COOKIE, forged)
    assert shared.get("/v1/whoami").status_code == 401


def test_admin_guard(shared: TestClient[Litestar], tokens: dict[str, str]) -> None:
    assert shared.post("/admin/policy", headers=bearer(tokens["bob"])).status_code == 403
    assert shared.post("/admin/policy", headers=bearer(tokens["ann"])).status_code == 201


# --- local (not shared) mode -----------------------------------------------------------------

@pytest.fixture
def local(tmp_path: Path, store: UserStore) -> Iterator[TestClient[Litestar]]:
    auth = Auth.from_config(WebConfig(data_dir=tmp_path, shared=False), store=store)
    with TestClient(make_app(auth)) as client:
        yield client


def test_local_mode_is_local_admin(local: TestClient[Litestar]) -> None:
    assert local.get("/v1/whoami").json() == {"name": "local", "admin": True}
    # OpenAI clients send some key anyway: ignored when not shared
    assert local.get("/v1/whoami", headers=bearer("sk-anything")).status_code == 200
    assert local.post("/v1/echo", json={"a": 1}).status_code == 201  # no CSRF token needed
    assert local.post("/admin/policy").status_code == 201
    assert local.get("/login", follow_redirects=False).status_code == 303


def test_local_mode_refuses_other_sites(local: TestClient[Litestar]) -> None:
    assert local.post("/v1/echo", json={}, headers={"origin": "http://evil.example"}) \
        .status_code == 403
    assert local.post("/chat/send", data={"text": "x"},
                      headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert local.post("/v1/echo", json={}, headers={"sec-fetch-site": "same-origin"}) \
        .status_code == 201
    assert local.post("/v1/echo", json={}, headers={
        "origin": "http://testserver.local", "host": "testserver.local"}).status_code == 201
    # reading is fine from anywhere (CORS keeps the answer from other sites' scripts)
    assert local.get("/v1/whoami", headers={"origin": "http://evil.example"}).status_code == 200


def test_from_config_makes_key_in_data_dir(tmp_path: Path) -> None:
    auth = Auth.from_config(WebConfig(data_dir=tmp_path, shared=True))
    assert auth.shared and (tmp_path / "secret.key").is_file()
    assert auth.store.path == tmp_path / "users.json"


# --- the ownership rule (its HTTP paths: tests/web/access/test_shared.py) -----------------------

def test_ownership_rule() -> None:
    ann, bob = User("ann", is_admin=True), User("bob")
    # requests (metadata and cancel): the owner and admins
    assert bob.can_manage("bob") and not bob.can_manage("ann")
    assert ann.can_manage("bob") and LOCAL_USER.can_manage("local")
    assert not bob.can_manage("local")
    # conversations (text): the owner only, and admins for what was made in local mode
    assert bob.can_read("bob") and not bob.can_read("ann")
    assert not ann.can_read("bob") and ann.can_read("ann") and ann.can_read("local")
    assert not bob.can_read("local") and LOCAL_USER.can_read("local")


def test_csrf_from_multipart_reads_parts_not_text() -> None:
    """The field is a part's name, not text anywhere: a file holding the same words does
    not count, headers are case-insensitive, a quoted boundary works."""
    body = (b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.json"\r\n'
            b'Content-Type: application/json\r\n\r\n'
            b'name="csrf_token"\r\n\r\nFAKE\r\n'
            b'\r\n--B\r\ncontent-disposition: form-data; name=csrf_token\r\n\r\nReal\r\n--B--\r\n')
    assert csrf_from_body('multipart/form-data; boundary="B"', body) == "Real"
    assert csrf_from_body("multipart/form-data", body) is None  # no boundary
    assert csrf_from_body("multipart/form-data; boundary=B",
                          b'--B\r\nContent-Disposition: form-data; name="x"\r\n\r\ny\r\n--B--\r\n'
                          b'--B\r\nContent-Disposition: form-data; name="csrf_token"\r\n\r\n'
                          b'after the end\r\n') is None
    assert csrf_from_body("application/x-www-form-urlencoded",
                          b"xcsrf_token=1&csrf_token=a+b%2F&csrf_token=2") == "a b/"


@pytest.mark.parametrize("content_type, body", [
    ("multipart/form-data; boundary=B", b'name="csrf_token"\r\nx' * 52_000),
    ("multipart/form-data; boundary=B", b"--B\r\n" * 200_000),
    ("multipart/form-data; boundary=B", b"--B\r\n" + b"x:y\r\n" * 200_000),
    ("multipart/form-data; boundary=B",
     (b"--B\r\n" + b"content-disposition: a\r\n" * 300 + b"\r\n\r\n") * 140),
    ("application/x-www-form-urlencoded", b"&" * 1_000_000),
])
def test_csrf_search_is_linear_on_a_hostile_megabyte(content_type: str, body: bytes) -> None:
    """The middleware searches bodies up to the limit on the event loop; a regex took 3 s on
    148 KB of the first shape. A megabyte of each takes milliseconds (bound: 0.25 s, for a
    loaded machine)."""
    started = time.perf_counter()
    assert csrf_from_body(content_type, body) is None
    assert time.perf_counter() - started < 0.25


def test_a_token_being_checked_holds_no_one_else(tmp_path: Path, store: UserStore,
                                                  tokens: dict[str, str],
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  in_thread_server: Any) -> None:
    """A token not seen before costs its hash (scrypt: tens of milliseconds of a core, more
    on a busy machine), and signing in writes the users file. Both run on a worker thread:
    while a sign-in's or a first API call's hash is held, the server answers /healthz. On the
    event loop, that answer would wait for the hash, which is held until it came."""
    import threading
    from types import SimpleNamespace

    import httpx

    from web.access import users

    hashing, release = threading.Event(), threading.Event()
    real = users._derive

    def held(token: str, salt: bytes, kdf: str) -> bytes:
        hashing.set()
        release.wait(30)
        return real(token, salt, kdf)

    monkeypatch.setattr(users, "_derive", held)
    auth = Auth(shared=True, store=store, key=load_secret_key(tmp_path))
    no_engine = SimpleNamespace(alive=False)  # the tiny app runs none
    server = in_thread_server(make_app(auth), no_engine, "auth", 30)
    got: dict[str, httpx.Response] = {}
    sends = {"sign-in": lambda: httpx.post(server.url + "/login", timeout=60, data={
                 "token": tokens["bob"], "next": "/"}),
             "bearer": lambda: httpx.get(server.url + "/v1/whoami", timeout=60,
                                         headers=bearer(tokens["cat"]))}
    try:
        for kind, send in sends.items():
            hashing.clear()
            release.clear()
            caller = threading.Thread(target=lambda k=kind, s=send: got.update({k: s()}))
            caller.start()
            assert hashing.wait(10), f"{kind}: the token was not checked"
            try:
                assert httpx.get(server.url + "/healthz", timeout=5).text == "ok", kind
            finally:
                release.set()
                caller.join(30)
        assert got["sign-in"].status_code == 303
        assert got["bearer"].json() == {"name": "cat", "admin": False}
        # a token checked once is known: no hash on its next call
        hashing.clear()
        assert httpx.get(server.url + "/v1/whoami", headers=bearer(tokens["cat"]),
                         timeout=5).status_code == 200
        assert not hashing.is_set()
    finally:
        release.set()
        server.stop()

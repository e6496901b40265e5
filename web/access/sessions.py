"""Signed session cookies and CSRF tokens: the signing key, the cookie format, the HMACs.

A cookie is base64url(JSON {user, token id, expiry, session id}) "." base64url(HMAC-SHA256);
the CSRF token is an HMAC of the cookie value under a second derived key. A signature alone
does not make a session live: the users file lists each user's open session ids, and Sign out
removes its id there (web.access.users.UserStore), so a copied cookie dies with the session.
web.access.auth decides who is asking and when these are checked.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SESSION_MAX_AGE = 14 * 24 * 3600  # seconds
SECRET_FILE = "secret.key"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_secret_key(data_dir: Path | str, configured: bytes | None = None) -> bytes:
    """The signing key: `configured` if given, else data_dir/secret.key, made once (mode 0600)."""
    if configured:
        return configured
    path = Path(data_dir) / SECRET_FILE
    for _ in range(50):
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            key = b""
        if len(key) >= 32:
            return key
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # another process is writing it: read theirs
            with os.fdopen(fd, "wb") as out:
                out.write(secrets.token_bytes(32))
            continue
        time.sleep(0.01)  # exists but short: being written right now
    raise RuntimeError(f"{path} holds fewer than 32 bytes; delete it to make a new key")


@dataclass(frozen=True, slots=True)
class Session:
    name: str
    token_id: str  # the user's token id at login: a rotate or remove ends the session
    expires: int  # unix seconds
    sid: str  # the session id the users file lists while the session is open


class SessionSigner:
    """Cookie value = base64url(JSON payload) "." base64url(HMAC-SHA256(payload))."""

    def __init__(self, key: bytes, *, max_age: int = SESSION_MAX_AGE,
                 clock: Callable[[], float] = time.time) -> None:
        if len(key) < 16:
            raise ValueError("the session key must be at least 16 bytes")
        self._session_key = hmac.new(key, b"ferry session cookie", hashlib.sha256).digest()
        self._csrf_key = hmac.new(key, b"ferry csrf token", hashlib.sha256).digest()
        self.max_age = max_age
        self.clock = clock

    def sign(self, name: str, token_id: str, sid: str | None = None) -> str:
        # n: the session id; every login gets its own, so its own cookie and CSRF token
        payload = {"u": name, "t": token_id, "e": int(self.clock()) + self.max_age,
                   "n": sid or secrets.token_hex(8)}
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        return f"{body}.{self._mac(body)}"

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._session_key, body.encode("ascii"), hashlib.sha256).digest())

    def unsign(self, value: str | None) -> Session | None:
        """The session in a cookie value, or None if it is forged, damaged or expired."""
        if not value or len(value) > 1024 or value.count(".") != 1:
            return None
        body, mac = value.split(".")
        try:
            if not hmac.compare_digest(mac.encode("ascii"), self._mac(body).encode("ascii")):
                return None
            payload = json.loads(_unb64(body))
        except (ValueError, UnicodeError):
            return None
        if not isinstance(payload, dict):
            return None
        name, token_id, expires = payload.get("u"), payload.get("t"), payload.get("e")
        sid = payload.get("n")
        if not (isinstance(name, str) and isinstance(token_id, str) and isinstance(expires, int)
                and isinstance(sid, str)):
            return None
        if expires <= self.clock():
            return None
        return Session(name, token_id, expires, sid)

    def csrf_token(self, cookie_value: str) -> str:
        return _b64(hmac.new(self._csrf_key, cookie_value.encode("ascii", "replace"),
                             hashlib.sha256).digest())

    def check_csrf(self, cookie_value: str, supplied: str | None) -> bool:
        if not supplied:
            return False
        expected = self.csrf_token(cookie_value).encode("ascii")
        return hmac.compare_digest(expected, supplied.strip().encode("ascii", "replace"))

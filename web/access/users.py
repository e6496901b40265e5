"""Users and their access tokens, kept in users.json in the data dir.

A token is shown once, when made (`ferry users add` / `rotate`); the file keeps only a salted
scrypt hash of it (PBKDF2 where this Python lacks scrypt). A token is "fy_" + a 12-hex-digit
id + 43 urlsafe characters (256 random bits). The id is stored in the clear and only says whose
hash to check, so a wrong token costs one dictionary lookup and a right one a single key
derivation; verified tokens are then remembered in memory until the file changes. The file is
re-read whenever its mtime/size changes, so `ferry users remove/rotate` on a running server
takes effect on the next request.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TOKEN_PREFIX = "fy_"
TOKEN_ID_CHARS = 12  # hex digits after the prefix
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
FILE_VERSION = 1
SCRYPT_N = 2 ** 14  # 16 MiB, tens of milliseconds; verified tokens are cached afterwards
SCRYPT_R = 8
SCRYPT_P = 1
PBKDF2_ITERATIONS = 300_000
DERIVING = 2  # token hashes computed at once
HASH_BYTES = 32
MAX_SESSIONS = 20  # open browser sessions kept per user; the oldest ends when one more opens


class UserError(ValueError):
    """A user operation cannot be done (bad name, no such user, unreadable file...)."""


@dataclass(frozen=True, slots=True)
class User:
    """Who is asking; the one ownership rule of Ferry lives in its two methods.

    Requests (metadata: state, queue place, timings; never text) are managed by their owner and
    by admins: they see them in GET /v1/requests and on the dashboard and may cancel them.
    Conversations (text) are read by their owner only, private by default even to admins; the
    one exception is the "local" user's conversations, made before sharing was turned on:
    any admin reaches them, so switching to shared mode strands nobody's history.
    """

    name: str
    is_admin: bool = False

    def can_manage(self, owner: str) -> bool:
        """Whether this user may see the metadata of `owner`'s request and cancel it."""
        return self.is_admin or owner == self.name

    def can_read(self, owner: str) -> bool:
        """Whether this user may read (and write to) a conversation of `owner`."""
        return owner == self.name or (self.is_admin and owner == LOCAL_NAME)


LOCAL_NAME = "local"
LOCAL_USER = User(LOCAL_NAME, is_admin=True)  # everyone, when Ferry listens on loopback only


@dataclass(frozen=True, slots=True)
class UserRecord:
    """What `ferry users list` shows: never the token or its hash."""

    name: str
    admin: bool
    created: str  # ISO 8601, UTC
    rotated: str | None = None
    token_id: str = ""  # changes on rotate; session cookies carry it, so rotate logs out
    sessions: tuple[str, ...] = ()  # open session ids (Sign out removes one; rotate all)

    @property
    def user(self) -> User:
        return User(self.name, is_admin=self.admin)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise UserError(f"invalid user name {name!r}: use 1-32 letters, digits, '_', '.' or '-'")
    if name == LOCAL_NAME:
        raise UserError(f"the name {name!r} is reserved for the local (unshared) user")
    return name


def token_id_of(token: str) -> str | None:
    """The id part of a well-formed token, or None for anything else."""
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        return None
    token_id = token[len(TOKEN_PREFIX):len(TOKEN_PREFIX) + TOKEN_ID_CHARS]
    if len(token) < len(TOKEN_PREFIX) + TOKEN_ID_CHARS + 32 or len(token) > 200:
        return None
    if not re.fullmatch(r"[0-9a-f]+", token_id):
        return None
    return token_id


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _digest(token: str) -> bytes:
    """A verified token's key in the store's memory (never written anywhere)."""
    return hashlib.sha256(token.encode()).digest()


def _derive(token: str, salt: bytes, kdf: str) -> bytes:
    secret = token.encode()
    kind, *params = kdf.split(":")
    if kind == "scrypt":
        n, r, p = (int(x) for x in params)
        return hashlib.scrypt(secret, salt=salt, n=n, r=r, p=p, dklen=HASH_BYTES,
                              maxmem=256 * r * n + (1 << 20))
    if kind == "pbkdf2_sha256":
        return hashlib.pbkdf2_hmac("sha256", secret, salt, int(params[0]), dklen=HASH_BYTES)
    raise UserError(f"unknown token hash {kdf!r} in the users file")


def _default_kdf(scrypt_n: int) -> str:
    if hasattr(hashlib, "scrypt"):
        return f"scrypt:{scrypt_n}:{SCRYPT_R}:{SCRYPT_P}"
    return f"pbkdf2_sha256:{PBKDF2_ITERATIONS}"


def write_private(path: Path, data: bytes) -> None:
    """Replace path with data atomically (temp file + rename), readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o600)  # mkstemp already makes it 0600; be explicit
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class UserStore:
    """users.json: {"version": 1, "users": {name: {admin, created, token_id, kdf, salt, hash,
    sessions}}}."""

    def __init__(self, path: Path | str, *, scrypt_n: int = SCRYPT_N) -> None:
        self.path = Path(path)
        self._kdf = _default_kdf(scrypt_n)
        self._lock = threading.RLock()
        self._stamp: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) when loaded
        self._users: dict[str, dict[str, Any]] = {}
        self._by_id: dict[str, str] = {}  # token id -> name
        self._verified: dict[bytes, str] = {}  # sha256(token) -> name, for this file version
        # tokens checked at once: each hash takes 16 MiB and a core, and a flood of wrong
        # tokens must cost a bounded share of the machine
        self._deriving = threading.BoundedSemaphore(DERIVING)

    # --- reading ---------------------------------------------------------------------------

    def _load(self) -> dict[str, dict[str, Any]]:
        """The users, re-read from disk if the file changed since the last look."""
        with self._lock:
            try:
                st = self.path.stat()
                stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
            except FileNotFoundError:
                stamp = None
            except OSError as exc:
                raise UserError(f"cannot read {self.path}: {exc.strerror or exc}") from None
            if stamp == self._stamp and (stamp is not None or not self._users):
                return self._users
            users = self._parse() if stamp is not None else {}
            self._users = users
            self._by_id = {rec["token_id"]: name for name, rec in users.items()}
            self._verified = {}
            self._stamp = stamp
            return users

    def _parse(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if not text.strip():
            return {}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{self.path} is not valid JSON ({exc}); fix or remove it") from None
        if (not isinstance(data, dict) or not isinstance(data.get("users", {}), dict)
                or set(data) - {"version", "users"}):
            raise UserError(f"{self.path} is not a Ferry users file; fix or remove it")
        users: dict[str, dict[str, Any]] = {}
        for name, rec in data.get("users", {}).items():
            keys = ("token_id", "kdf", "salt", "hash")
            if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in keys):
                raise UserError(f"{self.path}: the entry for {name!r} is damaged; "
                                f"remove it and `ferry users add` again")
            users[name] = rec
        return users

    def has_users(self) -> bool:
        return bool(self._load())

    def list(self) -> list[UserRecord]:
        return [self._record(name, rec) for name, rec in sorted(self._load().items())]

    def get(self, name: str) -> UserRecord | None:
        rec = self._load().get(name)
        return None if rec is None else self._record(name, rec)

    @staticmethod
    def _record(name: str, rec: dict[str, Any]) -> UserRecord:
        sessions = rec.get("sessions")
        open_ids = tuple(s for s in sessions if isinstance(s, str)) \
            if isinstance(sessions, list) else ()
        return UserRecord(name, bool(rec.get("admin")), str(rec.get("created", "")),
                          rec.get("rotated"), rec["token_id"], open_ids)

    def verified(self, token: str) -> User | None:
        """The user of a token this store has verified before (and whose record is unchanged
        since), at the cost of a dictionary lookup; None for any other token, which only
        `verify` can tell (tens of milliseconds of a core: never on an event loop)."""
        if token_id_of(token) is None:
            return None
        with self._lock:
            users = self._load()
            name = self._verified.get(_digest(token))
            if name is not None and name in users:
                return self._record(name, users[name]).user
        return None

    def verify(self, token: str) -> User | None:
        """The user this token belongs to, or None. Never raises for a bad token."""
        token_id = token_id_of(token)
        if token_id is None:
            return None
        known = self.verified(token)
        if known is not None:
            return known
        with self._lock:
            users = self._load()
            name = self._by_id.get(token_id)
            if name is None:
                return None
            rec = users[name]
        try:
            expected = bytes.fromhex(rec["hash"])
            with self._deriving:
                actual = _derive(token, bytes.fromhex(rec["salt"]), rec["kdf"])
        except (ValueError, UserError):
            return None
        if not hmac.compare_digest(expected, actual):
            return None
        with self._lock:
            if self._users.get(name) is rec:  # the file did not change meanwhile
                self._verified[_digest(token)] = name
        return User(name, is_admin=bool(rec.get("admin")))

    # --- changing --------------------------------------------------------------------------

    def _save(self, users: dict[str, dict[str, Any]]) -> None:
        data = {"version": FILE_VERSION, "users": users}
        write_private(self.path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
        self._stamp = None  # force a reload on the next read
        self._users = {}

    def _new_secret(self, users: dict[str, dict[str, Any]]) -> tuple[str, dict[str, str]]:
        taken = {rec["token_id"] for rec in users.values()}
        while True:
            token_id = secrets.token_hex(TOKEN_ID_CHARS // 2)
            if token_id not in taken:
                break
        token = f"{TOKEN_PREFIX}{token_id}{secrets.token_urlsafe(32)}"
        salt = secrets.token_bytes(16)
        fields = {"token_id": token_id, "kdf": self._kdf, "salt": salt.hex(),
                  "hash": _derive(token, salt, self._kdf).hex()}
        return token, fields

    @contextlib.contextmanager
    def _editing(self, name: str | None = None) -> Iterator[dict[str, dict[str, Any]]]:
        """The users to change, under the lock, saved when the block ends without raising;
        with a name, that user must exist."""
        with self._lock:
            users = dict(self._load())
            if name is not None and name not in users:
                raise UserError(f"no user named {name!r}")
            yield users
            self._save(users)

    def add(self, name: str, admin: bool = False) -> str:
        """Create a user; returns their token (the only time it is available)."""
        check_name(name)
        with self._editing() as users:
            if name in users:
                raise UserError(f"user {name!r} already exists (use `ferry users rotate {name}` "
                                f"for a new token)")
            token, fields = self._new_secret(users)
            users[name] = {"admin": bool(admin), "created": _now(), **fields}
        return token

    def remove(self, name: str) -> None:
        with self._editing(name) as users:
            del users[name]

    def rotate(self, name: str) -> str:
        """Give the user a new token; the old one (and their browser sessions) stop working."""
        with self._editing(name) as users:
            token, fields = self._new_secret(users)
            users[name] = {**users[name], **fields, "rotated": _now(), "sessions": []}
        return token

    # --- browser sessions ------------------------------------------------------------------

    def open_session(self, name: str) -> str:
        """A new session id for `name`, listed until close_session (or a rotate)."""
        with self._editing(name) as users:
            sid = secrets.token_hex(8)
            kept = [s for s in users[name].get("sessions") or [] if isinstance(s, str)]
            users[name] = {**users[name], "sessions": [*kept[-(MAX_SESSIONS - 1):], sid]}
        return sid

    def close_session(self, name: str, sid: str) -> bool:
        """End one session (Sign out); False when it was not open."""
        with self._lock:
            users = dict(self._load())
            kept = list(users.get(name, {}).get("sessions") or [])
            if sid not in kept:
                return False
            kept.remove(sid)
            users[name] = {**users[name], "sessions": kept}
            self._save(users)
            return True

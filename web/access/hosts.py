"""Which names Ferry answers to: the Host allow-list, and the Origin check that rides on it.

A browser sends the page's own name as `Host`. A page on `http://evil.example:8000` whose
DNS name was re-pointed at 127.0.0.1 (DNS rebinding) reaches Ferry with `Host:
evil.example:8000` and, if Ferry answered, would be same-origin with it: its scripts could
read every conversation. So a request whose Host is not a name Ferry serves is refused (421)
before any route runs, whatever the path: pages, SSE streams, the OpenAI API, /healthz.

Served names: `127.0.0.1`, `localhost` and `[::1]` with the port the connection arrived on
(the bound port, so port 0 works); the address the connection arrived on (the bound address)
with that port; in shared mode the machine's hostname and addresses with that port; and the
configured `allowed_hosts` (`name` for any port, `name:port` for one, `.example.com` for a
domain and its subdomains), for a reverse proxy or a DNS name. Names are compared exactly
(lower-cased): `localhost.` with a trailing dot is another name.

A state-changing request that carries `Origin` must also come from one of these names.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from web.access.auth import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    changes_state,
    header,
    is_api,
    send_simple,
)

log = logging.getLogger("ferry.hosts")

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
MAX_LOGGED = 50  # distinct refused Host values written to the log (a flood stays small)


class HostError(ValueError):
    """An allowed_hosts entry that is not a host name, an address or name:port."""


def split_host(value: str) -> tuple[str, int | None] | None:
    """`name[:port]` -> (lower-cased name, port or None); None when it is not a host.
    IPv6 addresses keep their brackets: `[::1]:8000` -> ("[::1]", 8000)."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/\\@?#% \t\r\n"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[:end + 1], value[end + 1:]
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_text = value.partition(":")
        if ":" in port_text:
            return None  # a bare IPv6 address: browsers always bracket it
        if not sep:
            port_text = None
    if not name:
        return None
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


def address_name(address: str) -> str:
    """How an address appears in a Host header: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address


def check_allowed_host(entry: str) -> str:
    """An allowed_hosts entry, normalised (lower case); raises HostError."""
    parts = split_host(entry.lstrip(".")) if entry.strip() else None
    if parts is None or parts[0].endswith("."):
        raise HostError(f"allowed_hosts: {entry!r} is not a host name, an address or "
                        "name:port")
    return entry.strip().lower()


def machine_names() -> list[str]:
    """This machine's hostname (also as NAME.local, mDNS) and the addresses it resolves to,
    plus the address its LAN route goes out from. Names only: the port is the bound one."""
    names: list[str] = []
    host = socket.gethostname().lower()
    if host:
        names += [host] if "." in host else [host, f"{host}.local"]
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP,
                                       flags=socket.AI_CANONNAME)
        except OSError:
            infos = []
        for _, _, _, canon, sockaddr in infos:
            if canon:
                names.append(canon.lower())
            names.append(address_name(str(sockaddr[0])))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: picks a route, sends nothing
            names.append(probe.getsockname()[0])
    except OSError:
        pass
    return [n for n in dict.fromkeys(names) if not n.startswith("127.") and n != "[::1]"]


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """The names served with the bound port (`names`) and the configured extras (`extra`:
    any port unless an entry says one; a leading dot covers subdomains)."""

    names: frozenset[str]
    extra: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def build(cls, shared: bool, allowed_hosts: Iterable[str] = (),
              machine: Iterable[str] | None = None) -> HostPolicy:
        names = set(LOOPBACK_NAMES)
        if shared:
            names.update(machine_names() if machine is None else machine)
        extra = []
        for entry in allowed_hosts:
            parts = split_host(check_allowed_host(entry).lstrip("."))
            assert parts is not None
            extra.append(("." + parts[0] if entry.strip().startswith(".") else parts[0],
                          parts[1]))
        return cls(frozenset(names), tuple(extra))

    def describe(self, port: int | str = "PORT") -> list[str]:
        """The allowed names as a reader writes them (banner, doctor)."""
        out = [f"{n}:{port}" for n in sorted(self.names, key=_name_order)]
        for name, fixed in self.extra:
            out.append(f"{name}:{fixed}" if fixed is not None else f"{name} (any port)")
        return out

    def allows(self, name: str, port: int, bound: tuple[str, int | None] | None) -> bool:
        """Whether `name:port` (port made explicit) is served, for a connection that
        arrived on `bound` (the ASGI scope's "server": address and port)."""
        bound_port = bound[1] if bound else None
        same_port = bound_port is None or port == bound_port
        if same_port and (name in self.names or
                          (bound is not None and name == address_name(bound[0].lower()))):
            return True
        for entry, fixed in self.extra:
            matches = name == entry or (entry.startswith(".") and
                                        (name == entry[1:] or name.endswith(entry)))
            if matches and (fixed is None or fixed == port):
                return True
        return False

    def allows_host(self, host: str | None, scheme: str,
                    bound: tuple[str, int | None] | None) -> bool:
        parts = split_host(host) if host else None
        if parts is None:
            return False
        name, port = parts
        return self.allows(name, port if port is not None else DEFAULT_PORTS.get(scheme, 80),
                           bound)

    def allows_origin(self, origin: str, bound: tuple[str, int | None] | None) -> bool:
        parts = urlsplit(origin.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
            return False  # "null", file:, chrome-extension:, ...
        return self.allows_host(parts.netloc, parts.scheme, bound)


def _name_order(name: str) -> tuple[int, str]:
    return (LOOPBACK_NAMES.index(name) if name in LOOPBACK_NAMES else len(LOOPBACK_NAMES), name)


def _bound(scope: Scope) -> tuple[str, int | None] | None:
    server = scope.get("server")
    if not server or server[0] is None:
        return None  # a unix socket: nothing to compare the port with
    return str(server[0]), (int(server[1]) if server[1] is not None else None)


class HostGuard:
    """Pure ASGI middleware: a Host not served -> 421 (none at all -> 400), and a
    state-changing request from an Origin not served -> 403, before any route runs."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy
        self.logged: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = header(scope, "host")
        bound = _bound(scope)
        if not self.policy.allows_host(host, scope.get("scheme", "http"), bound):
            self.note(host)
            if host is None:
                await self.refuse(scope, send, 400, "the request has no Host header")
            else:
                await self.refuse(scope, send, 421, "this Ferry does not serve that host name "
                                  "(its banner and `ferry doctor` list the names it serves; "
                                  "add one with --allowed-host)")
            return
        origin = header(scope, "origin")
        if origin is not None and changes_state(scope) and \
                not self.policy.allows_origin(origin, bound):
            await self.refuse(scope, send, 403, "requests from other sites are not accepted")
            return
        await self.app(scope, receive, send)

    def note(self, host: str | None) -> None:
        key = repr(host)[:200]
        if key not in self.logged and len(self.logged) < MAX_LOGGED:
            self.logged.add(key)
            log.warning("refused a request for host %s: not one of the names this Ferry "
                        "serves (add it with --allowed-host if it is yours)", key)

    @staticmethod
    async def refuse(scope: Scope, send: Send, status: int, message: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if is_api(scope.get("path", "/")) or "json" in (header(scope, "accept") or ""):
            kind = "permission_error" if status == 403 else "invalid_request_error"
            body = json.dumps({"error": {"message": message, "type": kind, "param": None,
                                         "code": "host_not_allowed" if status != 403
                                         else "forbidden"}}).encode()
            await send_simple(send, status, body, "application/json")
        else:
            await send_simple(send, status, f"{message}.".encode(), "text/plain; charset=utf-8")

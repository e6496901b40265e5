"""Upstream mode's settings: `--upstream URL` (repeatable) or, in ferry.toml,
`upstreams = [{url = "http://gpu1:8000", api_key = "...", kind = "vllm", max_in_flight = 64}]`,
checked into plain tables and turned into the gateway's config."""
from __future__ import annotations

from typing import Any

from web.gateway.config import KINDS, GatewayConfig, UpstreamConfig, base_url

FIELDS = ("url", "api_key", "kind", "max_in_flight")


class UpstreamsError(ValueError):
    """An upstreams entry Ferry cannot use; the message names it."""


def normalize(entries: list[Any]) -> list[dict[str, object]]:
    """Each entry (a URL, or a table) -> a table with `url` and the fields given.
    Raises ValueError naming the bad entry."""
    out: list[dict[str, object]] = []
    for i, entry in enumerate(entries):
        where = f"upstreams[{i}]"
        table: dict[str, object] = {"url": entry} if isinstance(entry, str) else entry
        if not isinstance(table, dict):
            raise UpstreamsError(f"{where} must be a URL or a table with url, api_key, kind, "
                             "max_in_flight")
        unknown = sorted(set(table) - set(FIELDS))
        if unknown:
            raise UpstreamsError(f"{where}: unknown field {unknown[0]!r} (known: "
                             f"{', '.join(FIELDS)})")
        url = table.get("url")
        if not isinstance(url, str):
            raise UpstreamsError(f"{where} needs a url")
        try:
            base_url(url)
        except ValueError as exc:
            raise UpstreamsError(f"{where}: {exc}") from None
        kind = table.get("kind")
        if kind is not None and kind not in KINDS:
            raise UpstreamsError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        key = table.get("api_key")
        if key is not None and not isinstance(key, str):
            raise UpstreamsError(f"{where}: api_key must be a string")
        cap = table.get("max_in_flight")
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise UpstreamsError(f"{where}: max_in_flight must be an integer >= 1")
        out.append(dict(table))
    if len({base_url(str(t["url"])) for t in out}) != len(out):
        raise UpstreamsError("the same upstream is listed twice")
    return out


def gateway_config(tables: list[dict[str, object]], max_waiting: int, shared: bool
                   ) -> GatewayConfig:
    ups = tuple(UpstreamConfig(str(t["url"]), t.get("api_key"),  # type: ignore[arg-type]
                               t.get("kind"),  # type: ignore[arg-type]
                               t.get("max_in_flight"))  # type: ignore[arg-type]
                for t in tables)
    return GatewayConfig(ups, max_waiting=max_waiting, admission="fair" if shared else "fifo")

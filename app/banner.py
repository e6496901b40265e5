"""The start-up banner (where to point a browser, what runs) and `--open`."""
from __future__ import annotations

import socket
import threading
import webbrowser
from collections.abc import Mapping, Sequence

from app.settings import Settings


def lan_address() -> str | None:
    """This machine's address on the LAN (no packets sent: UDP connect only picks a route)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"  # a wildcard bind is reached locally through loopback
    return f"[{host}]" if ":" in host else host


def local_url(settings: Settings) -> str:
    return f"http://{url_host(settings.host)}:{settings.port}/"


def lan_url(settings: Settings) -> str | None:
    if not settings.shared:
        return None
    if settings.host in ("0.0.0.0", "::"):
        address = lan_address()
        return f"http://{address}:{settings.port}/" if address else None
    return f"http://{url_host(settings.host)}:{settings.port}/"


def served_names(settings: Settings) -> list[str]:
    """The Host names this server answers (web.access.hosts); any other is refused."""
    from web.access.hosts import HostPolicy

    return HostPolicy.build(settings.shared, settings.allowed_hosts).describe(settings.port)


def memory_line(rss: int, floor: int, models: Sequence[tuple[str, Mapping[str, int]]]) -> str:
    """"466 MB resident: 265 MB Python, torch and the server; default 197 MB (weights
    106, KV 24, tokenizer 19, vocabulary 38, other 11)" -- figures in MB."""
    return (f"{rss / 1e6:,.0f} MB resident: {floor / 1e6:,.0f} MB Python, torch and the "
            f"server; " + "; ".join(model_memory(name, m) for name, m in models))


def model_memory(name: str, parts: Mapping[str, int]) -> str:
    """"default 197 MB (weights 106, KV 24, tokenizer 19, vocabulary 38, other 11)"."""
    each = ", ".join(f"{'KV' if k == 'kv' else k} {parts.get(k, 0) / 1e6:,.0f}"
                     for k in ("weights", "kv", "tokenizer", "vocabulary", "other"))
    return f"{name} {parts.get('total', 0) / 1e6:,.0f} MB ({each})"


def banner(settings: Settings, model: str, device: str = "", dtype: str = "",
           chat_template: str = "", device_info: str = "", memory: str = "") -> str:
    """The text printed once the server listens (device "upstream": a front, dtype its URLs;
    `chat_template`: the one chats use, in words; `device_info`: the device, why it, and the
    torch build)."""
    lines = ["", "  Ferry is serving", f"  Local:   {local_url(settings)}"]
    lan = lan_url(settings)
    if lan:
        lines.append(f"  LAN:     {lan}   (sign-in with an access token required)")
    lines.append(f"  Hosts:   {', '.join(served_names(settings))}   (others refused; add one "
                 "with --allowed-host)")
    where = ", ".join(part for part in (device, dtype) if part)
    lines.append(f"  Model:   {model}" + (f" ({where})" if where else ""))
    if device_info:
        lines.append(f"  Device:  {device_info}")
    if chat_template:
        lines.append(f"  Chat:    template {chat_template}")
    if memory:
        lines.append(f"  Memory:  {memory}")
    if device == "upstream":  # no engine here: the upstreams run the model
        count = len(settings.upstreams)
        lines.append(f"  Front:   {count} upstream{'s' if count != 1 else ''}; Ferry holds the "
                     "queue (fair across users), the upstreams run the model")
        lines += ["  Stop with Ctrl+C", ""]
        return "\n".join(lines)
    lines.append(
        f"  Engine:  policy {settings.policy}, admission {settings.admission}, "
        f"{settings.max_running} slots, prefill budget {settings.max_prefill_tokens}, "
        f"KV {settings.kv_tokens} tokens / page {settings.page_size}, "
        f"prefix cache {'on' if settings.prefix_cache else 'off'}, "
        f"speculative {settings.speculative}"
        + (", deterministic" if settings.deterministic else ""))
    lines.append("  Stop with Ctrl+C")
    lines.append("")
    return "\n".join(lines)


def open_browser(url: str, delay: float = 0.5) -> threading.Timer:
    """Open url in the default browser shortly after, off the caller's thread."""
    timer = threading.Timer(delay, webbrowser.open, args=(url,))
    timer.daemon = True
    timer.start()
    return timer

"""`ferry serve` as a real process (FERRY_HOME in a temp dir, the default model's converted
folder, a small KV pool): killing it mid-reply loses no committed message, and SIGTERM or
SIGINT shut it down cleanly.

SIGKILL: the user message and the part of the reply saved so far are in the database
(WAL), which passes integrity_check; the raw row is still `streaming`, and the next Store
opened on the file (the next start) marks it `incomplete` with its text kept.
SIGTERM/SIGINT: the process exits 0 within a few seconds, an open API stream ends with
its last chunk and [DONE], an open chat stream ends, the partial reply is saved
`incomplete`, and the database passes integrity_check.
"""
from __future__ import annotations

import contextlib
import html
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from web.storage.store import Store

pytestmark = pytest.mark.model
START_TIMEOUT = 120.0
EXIT_LIMIT = 10.0  # uvicorn's graceful shutdown is 5 s; streams end within 2 s of it
PROMPT = "Write a long story about a dragon who learns to sail, with many chapters."


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    home: Path

    @property
    def db(self) -> Path:
        return self.home / "data" / "ferry.sqlite3"

    def output(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        out, _ = self.proc.communicate(timeout=5)
        return (out or b"(written to a file)").decode(errors="replace")[-3000:]


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(model_dir: Path, home: Path, port: int,
                  python_flags: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """`ferry serve` of the default model's folder on `port`, and its environment."""
    env = {**os.environ, "FERRY_HOME": str(home), "FERRY_KV_TOKENS": "4096",
           "FERRY_MAX_RUNNING": "4", "PYTHONUNBUFFERED": "1",
           "FERRY_DISCOVER_MODELS": "0"}  # one model, whatever this machine holds
    # the `ferry` entry point, with Ctrl+C handling as in a terminal (a child of a
    # background job would inherit SIGINT ignored)
    entry = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler)"
             "; from app.cli import main; sys.exit(main())")
    return [sys.executable, *python_flags, "-c", entry, "serve", "--host", "127.0.0.1",
            "--port", str(port), "--model", str(model_dir), "--dtype", "float32",
            "--device", "cpu"], env


def wait_ready(served: Served) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        assert served.proc.poll() is None, f"ferry serve exited:\n{served.output()}"
        assert time.monotonic() < deadline, "ferry serve did not start"
        try:
            if httpx.get(served.url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


@pytest.fixture
def serve(model_dir: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[Served] = []

    def start(home: Path | None = None) -> Served:
        home = home or tmp_path / "home"
        port = free_port()
        command, env = serve_command(model_dir, home, port)
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        served = Served(proc, f"http://127.0.0.1:{port}", home)
        started.append(served)
        wait_ready(served)
        return served

    yield start
    for served in started:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait(10)


class ChatListener(threading.Thread):
    """Follows a reply's SSE stream as the chat page does (so the reply is not orphaned)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="chat-listener", daemon=True)
        self.url = url
        self.text = ""
        self.events: list[str] = []
        self.ended = threading.Event()

    def run(self) -> None:
        event = ""
        try:
            with httpx.stream("GET", self.url, timeout=httpx.Timeout(10, read=120)) as r:
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                        self.events.append(event)
                    elif line.startswith("data: ") and event == "token":
                        self.text += html.unescape(line[6:])
        except httpx.HTTPError:
            pass  # the server went away
        finally:
            self.ended.set()


def read_rows(db: Path) -> list[sqlite3.Row]:
    """The messages, read-only (the server may be writing)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    con.row_factory = sqlite3.Row
    try:
        return con.execute("SELECT * FROM messages ORDER BY id").fetchall()
    finally:
        con.close()


def start_reply(served: Served) -> tuple[int, ChatListener]:
    """Post the chat form; follow the reply's stream; wait until part of it is saved."""
    for _ in range(3):  # a reply that ends (EOS) before anything is saved: ask again
        made = httpx.post(served.url + "/c", data={"content": PROMPT}, follow_redirects=False,
                          timeout=30)
        assert made.status_code == 303, made.text
        cid = int(made.headers["location"].rsplit("/", 1)[1])
        reply = next(r for r in read_rows(served.db) if r["conversation_id"] == cid
                     and r["role"] == "assistant")
        listener = ChatListener(f"{served.url}/c/{cid}/messages/{reply['id']}/stream")
        listener.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            row = next(r for r in read_rows(served.db) if r["id"] == reply["id"])
            if row["status"] != "streaming":
                break
            if row["content"]:
                return cid, listener
            time.sleep(0.1)
    raise AssertionError("no partial reply was ever saved while streaming")


def integrity(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        con.close()


def test_sigkill_mid_reply_loses_no_committed_message(serve: Any) -> None:
    served = serve()
    cid, listener = start_reply(served)
    time.sleep(0.6)  # one more save of the growing reply
    before = {r["id"]: dict(r) for r in read_rows(served.db)}
    served.proc.send_signal(signal.SIGKILL)
    assert served.proc.wait(10) == -signal.SIGKILL
    listener.ended.wait(10)

    assert integrity(served.db) == "ok"
    rows = [dict(r) for r in read_rows(served.db) if r["conversation_id"] == cid]
    assert [r["role"] for r in rows] == ["user", "assistant"]
    user, reply = rows
    assert user["content"] == PROMPT and user["status"] == "complete"
    # as stored: the reply was streaming when the process died; its saved text is there
    assert reply["status"] == "streaming" and reply["content"]
    assert len(reply["content"]) >= len(before[reply["id"]]["content"])
    assert listener.text.startswith(reply["content"]) or reply["content"].startswith(
        listener.text), "the saved text is not what was streamed"

    # the next start opens the store: the leftover is marked incomplete, its text kept
    store = Store(served.db)
    try:
        kept = store.message(reply["id"])
        assert kept is not None and kept.status == "incomplete"
        assert kept.content == reply["content"]
        assert [m.content for m in store.messages(cid) if m.role == "user"] == [PROMPT]
    finally:
        store.close()
    assert integrity(served.db) == "ok"


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (Linux's /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command name may hold spaces and parentheses: the fields follow the last ")"
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_a_killed_servers_rendering_worker_ends_too(serve: Any) -> None:
    """The page-rendering worker (a process of its own) is not left running, idle, when its
    server is killed outright (SIGKILL: no shutdown runs)."""
    served = serve()
    cid, listener = start_reply(served)
    assert httpx.get(f"{served.url}/c/{cid}", timeout=60).status_code == 200  # renders
    left = children(served.proc.pid)
    assert left, "showing a reply started no rendering worker"
    served.proc.send_signal(signal.SIGKILL)
    assert served.proc.wait(10) == -signal.SIGKILL
    listener.ended.wait(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in left):
        time.sleep(0.2)
    alive = [p for p in left if Path(f"/proc/{p}").exists()
             and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[:1]]
    assert not alive, f"still running after their server was killed: {alive}"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_shuts_down_gracefully(serve: Any, signum: signal.Signals) -> None:
    served = serve()
    cid, listener = start_reply(served)
    api_lines: list[str] = []
    api_open = threading.Event()

    model = httpx.get(served.url + "/v1/models").json()["data"][0]["id"]

    def api_stream() -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a story."}],
                "max_tokens": 1000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", served.url + "/v1/chat/completions", json=body,
                              timeout=httpx.Timeout(10, read=60)) as r:
                if r.status_code != 200:
                    api_lines.append(f"status {r.status_code}: {r.read()!r}")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        api_lines.append(line)
                        if '"content":"' in line and '"content":""' not in line:
                            api_open.set()
        except httpx.HTTPError as exc:
            api_lines.append(f"error: {exc!r}")
        finally:
            api_open.set()

    api = threading.Thread(target=api_stream, daemon=True)
    api.start()
    assert api_open.wait(60) and api.is_alive(), api_lines[-3:]
    # the check below compares the saved reply's first 20 characters with what the listener
    # got: shut down only once it has more than that (on a busy machine it may lag the store)
    deadline = time.monotonic() + 60
    while len(listener.text) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)

    sent = time.monotonic()
    served.proc.send_signal(signum)
    code = served.proc.wait(EXIT_LIMIT + 20)
    took = time.monotonic() - sent
    print(f"\n{signum.name}: ferry serve exited {code} after {took:.2f} s")
    assert code == 0, served.output()
    assert took < EXIT_LIMIT, f"exit took {took:.1f} s"
    api.join(10)
    assert listener.ended.wait(10), "the chat stream did not end"
    assert not api.is_alive(), "the API stream did not end"
    assert api_lines[-1] == "data: [DONE]", api_lines[-3:]
    assert '"ferry_finish_reason":"cancelled"' in api_lines[-2], api_lines[-3:]

    assert integrity(served.db) == "ok"
    rows = [dict(r) for r in read_rows(served.db) if r["conversation_id"] == cid]
    assert [r["role"] for r in rows] == ["user", "assistant"]
    reply = rows[1]
    assert reply["status"] == "incomplete" and reply["finish_reason"] == "cancelled"
    assert reply["content"] and listener.text.startswith(reply["content"][:20])


NEVER_SERVING = ("polyfactory", "faker", "rich", "httpx", "sympy", "pydantic", "markdown_it")


def imported_by_serving(model: Path, tmp_path: Path) -> set[str]:
    """The top-level packages a server of `model` imported by the end of a chat (and of a
    read of its API schema)."""
    port = free_port()
    command, env = serve_command(model, tmp_path / "home", port, ("-X", "importtime"))
    log = tmp_path / "imports.log"  # a file: the import log would fill a pipe
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    served = Served(proc, f"http://127.0.0.1:{port}", tmp_path / "home")
    try:
        wait_ready(served)
        assert httpx.get(served.url + "/schema/openapi.json", timeout=30).status_code == 200
        reply = httpx.post(served.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert reply.status_code == 200, reply.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(EXIT_LIMIT + 20)
    imported = {line.split("|")[-1].strip().split(".")[0]
                for line in log.read_text(errors="replace").splitlines()
                if line.startswith("import time:")}
    assert {"litestar", "torch"} <= imported  # the import log was read
    return imported


def test_serving_imports_nothing_it_does_not_use(model_dir: Path, tmp_path: Path) -> None:
    """Each module imported stays resident for the process's life: the schema's examples
    (polyfactory, Faker), remote image fetching (httpx, and rich through it),
    transformers' GGUF reading (sympy), Litestar's plugins for libraries Ferry's routes do
    not use (pydantic) and the pages' Markdown (until a page shows a message) stay out of a
    server that serves a chat without them."""
    imported = imported_by_serving(model_dir, tmp_path)
    assert not imported & set(NEVER_SERVING), sorted(imported & set(NEVER_SERVING))


def test_a_gguf_serves_without_transformers(tmp_path: Path) -> None:
    """A GGUF's tokenizer serves through Ferry's compact tables and template rendering:
    transformers (~20 MB of modules with huggingface_hub and its HTTP client) and the Rust
    tokenizer's package (~3 MB) stay out, and Pillow (~2.5 MB) until a picture is read."""
    from tests.tools.synthetic_gguf import default_gguf

    imported = imported_by_serving(default_gguf(), tmp_path)
    unused = set(NEVER_SERVING) | {"transformers", "huggingface_hub", "PIL", "tokenizers"}
    assert not imported & unused, sorted(imported & unused)

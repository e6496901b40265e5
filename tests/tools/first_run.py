"""What a new user does with an installed Ferry, as one check: start `ferry serve` with an
empty home, wait for /healthz, get a greedy answer from /v1/chat/completions and the same
answer streamed over SSE, open the chat page (its scripts and styles load), send a message
from the chat form and follow the reply's SSE stream to its end, then stop the server with
SIGTERM. Used by the PyInstaller bundle's test and install.sh's test."""
from __future__ import annotations

import html
import json
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.tools.waiting import wait_healthy

QUESTION = "What is the capital of France? Answer in one sentence."
EXIT_LIMIT = 15.0  # uvicorn's graceful shutdown is 5 s


@dataclass(frozen=True)
class FirstRun:
    start_s: float  # from the command to /healthz answering 200
    answer: str  # the greedy API answer
    chat_reply: str  # the chat page's reply, as streamed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def isolated_env(base: dict[str, str], root: Path) -> dict[str, str]:
    """`base` with HOME and the XDG folders under `root`, and no session bus or user
    manager: nothing a test starts can reach the real user's files or services."""
    env = {k: v for k, v in base.items() if not k.startswith(("FERRY_", "XDG_", "HF_"))
           and k not in ("DBUS_SESSION_BUS_ADDRESS", "VIRTUAL_ENV", "PYTHONPATH")}
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / ".local" / "share"),
               XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_STATE_HOME=str(home / ".local" / "state"), PYTHONUNBUFFERED="1")
    return env


def first_run(command: list[str], env: dict[str, str], log: Path,
              start_timeout: float = 600.0) -> FirstRun:
    """Run the whole first-run path against `command` (the `ferry` executable); see above."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([*command, "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=log.parent)  # not a checkout: import only what is installed
    try:
        wait_healthy(url + "/healthz", proc, log, start_timeout, "ferry serve", 0.5)
        start_s = time.monotonic() - started
        assert httpx.get(url + "/healthz", timeout=10).json()["engine"] is True
        with httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=900)) as client:
            answer = api_answers(client)
            chat_reply = chat_page_reply(client)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(EXIT_LIMIT + 30)
        assert code == 0, f"exit {code} after SIGTERM:\n{log.read_text()[-4000:]}"
        assert time.monotonic() - sent < EXIT_LIMIT, "SIGTERM took too long"
        return FirstRun(start_s, answer, chat_reply)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def api_answers(client: httpx.Client) -> str:
    """The greedy answer, asked plainly and streamed: both the same, non-empty text."""
    model = client.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 24, "temperature": 0}
    plain = client.post("/v1/chat/completions", json=body)
    assert plain.status_code == 200, plain.text
    choice = plain.json()["choices"][0]
    answer = str(choice["message"]["content"])
    assert answer.strip() and choice["finish_reason"] in ("stop", "length"), choice
    parts: list[str] = []
    lines: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream"), r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line)
            if line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    parts.append(c["delta"].get("content") or "")
    assert lines and lines[-1] == "data: [DONE]", lines[-3:]
    assert "".join(parts) == answer, ("".join(parts), answer)
    return answer


def chat_page_reply(client: httpx.Client) -> str:
    """Open `/`, check its form and assets, send a message, follow the reply's stream."""
    index = client.get("/")
    assert index.status_code == 200, index.text
    assert 'id="composer"' in index.text and 'name="content"' in index.text, index.text[:2000]
    for asset in re.findall(r'(?:src|href)="(/(?:assets|static)/[^"]+)"', index.text):
        got = client.get(asset)
        assert got.status_code == 200 and got.content, f"{asset}: {got.status_code}"
    made = client.post("/c", data={"content": QUESTION}, follow_redirects=False)
    assert made.status_code == 303, made.text
    page_url = made.headers["location"]
    page = client.get(page_url)
    assert page.status_code == 200, page.text
    streamed = ""
    stream = re.search(r'sse-connect="([^"]+)"', page.text)
    if stream:  # still generating: follow it as the page does, to `done`
        events: list[str] = []
        event = ""
        with client.stream("GET", stream.group(1)) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                    events.append(event)
                    if event == "done":
                        break
                elif line.startswith("data: ") and event == "token":
                    streamed += line[6:]
        assert events and events[-1] == "done", events[-5:]
        page = client.get(page_url)
    assert 'sse-connect="' not in page.text, "the reply is still streaming after `done`"
    reply = re.search(r'class="msg assistant (\w+)".*?<textarea class="raw"[^>]*>(.*?)</textarea>',
                      page.text, re.S)
    assert reply, page.text[:3000]
    status, content = reply.group(1), html.unescape(reply.group(2))
    assert status == "complete" and content.strip(), (status, content)
    if streamed:  # the stream carried the saved text (newlines split SSE data lines)
        assert "".join(html.unescape(streamed).split()) == "".join(content.split()), \
            (streamed, content)
    return content

"""The pages in headless Chromium against the real server: streaming, Stop, reload, the live
dashboard and its Cancel buttons.

Screenshots go to docs/screenshots/{chat,dashboard}.png when FERRY_UPDATE_SCREENSHOTS=1 is
set or the file is missing (so a plain test run leaves the committed images alone)."""
from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.screenshots import screenshot_path

pytestmark = [pytest.mark.model, pytest.mark.browser]
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    # replies run past EOS to 200 tokens, so they are still streaming when Stop is pressed
    return make_server(max_running=2, web={"chat_ignore_eos": True, "default_max_tokens": 200,
                                            "dashboard_interval": 0.25,
                                            "max_body_bytes": 64 * 1024})


@pytest.fixture
def page(browser: Any, csp_page: Any) -> Iterator[Any]:
    with csp_page(browser) as page:
        yield page


def send(page: Any, text: str) -> None:
    page.fill("#composer textarea", text)
    page.keyboard.press("Enter")


def streaming_text(page: Any) -> str:
    body = page.locator("article.msg.assistant.streaming .body")
    return body.inner_text() if body.count() else ""


def start_reply(page: Any, url: str, text: str, waiter: Any, more_than: int) -> str:
    """Send `text` in a new chat; the streaming reply's text once it is longer than
    `more_than` characters."""
    page.goto(url + "/")
    send(page, text)
    page.wait_for_url(re.compile(r"/c/\d+$"))
    return str(waiter(lambda: len(streaming_text(page)) > more_than and streaming_text(page),
                      30, message="first tokens"))


def conversation_id(page: Any) -> int:
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def test_message_streams_and_stop_keeps_it_incomplete(server: Any, page: Any, waiter: Any,
                                                      idle_check: Any) -> None:
    first = start_reply(page, server.url, "Tell me a long story about a lighthouse keeper.",
                        waiter, 5)
    waiter(lambda: len(streaming_text(page)) > len(first) + 5, 30, message="more tokens")
    page.click("article.msg.assistant.streaming button.stop")
    waiter(lambda: not server.engine.live_ids(), 3, message="the engine request to end")
    page.wait_for_selector("article.msg.assistant.incomplete .badge.warn")
    shown = page.inner_text("article.msg.assistant .body")
    assert shown.strip() and shown.startswith(first.strip()[:5])
    reply = server.services.store.messages(conversation_id(page))[-1]
    assert reply.status == "incomplete" and reply.finish_reason == "cancelled"
    assert reply.content.strip() and reply.content.startswith(first.strip()[:5])
    page.reload()
    page.wait_for_selector("article.msg.assistant.incomplete .badge.warn")
    idle_check(server.engine)


def test_reload_mid_reply_reattaches(server: Any, page: Any, waiter: Any,
                                     idle_check: Any) -> None:
    before = start_reply(page, server.url, "Describe the ocean in great detail.", waiter, 10)
    request_id = server.services.store.messages(conversation_id(page))[-1].request_id
    page.reload()
    # the stream replays the text so far, then goes on with the same engine request
    waiter(lambda: len(streaming_text(page)) > len(before) + 5, 30, message="continued text")
    assert streaming_text(page).startswith(before.strip()[:10])
    assert server.engine.live_ids() == [request_id]
    page.click("article.msg.assistant.streaming button.stop")
    page.wait_for_selector("article.msg.assistant.incomplete")
    idle_check(server.engine)


def test_chat_stream_disconnect_leaves_the_reply_running(server: Any, waiter: Any,
                                                        idle_check: Any) -> None:
    store = server.services.store
    with httpx.Client(base_url=server.url, timeout=30) as client:
        created = client.post("/c", data={"content": "Count slowly to one hundred."})
        assert created.status_code == 303
        cid = int(created.headers["location"].rsplit("/", 1)[1])
        reply = store.messages(cid)[-1]
        with client.stream("GET", f"/c/{cid}/messages/{reply.id}/stream") as stream:
            next(line for line in stream.iter_lines() if line.startswith("data:"))
        # nobody listens any more: the reply belongs to the conversation and goes on
        seen = len(waiter(lambda: store.message(reply.id).content, 30, message="saved text"))
        waiter(lambda: len(store.message(reply.id).content) > seen + 10, 30,
               message="the reply growing with no listener")
        assert server.engine.live_ids() == [reply.request_id]
        page = client.get(f"/c/{cid}").text
        assert 'class="live-dot"' in page  # the sidebar marks the reply in progress
        assert client.post(f"/c/{cid}/messages/{reply.id}/stop").status_code == 204
        kept = waiter(lambda: (m := store.message(reply.id)).status != "streaming" and m, 10,
                      message="saved reply")
        assert kept.status == "incomplete" and kept.content and kept.ended == "stopped by you"
        # the stream URL stays idempotent: a finished reply answers its final form and `done`
        text = client.get(f"/c/{cid}/messages/{reply.id}/stream").text
        assert "event: final" in text and text.rstrip().endswith("data: done")
        assert "stopped by you" in text
    idle_check(server.engine)


def test_regenerate_busy_notice_and_delete(server: Any, waiter: Any, idle_check: Any) -> None:
    store = server.services.store
    with httpx.Client(base_url=server.url, timeout=30, headers={"HX-Request": "true"}) as c:
        created = c.post("/c", data={"content": "Say hello."})
        cid = int(created.headers["hx-redirect"].rsplit("/", 1)[1])
        user_msg, reply = store.messages(cid)
        assert reply.status == "streaming" and reply.request_id in server.engine.live_ids()
        busy = c.post(f"/c/{cid}/messages", data={"content": "And again?"})
        assert busy.status_code == 409 and busy.headers["hx-retarget"] == "#notice"
        assert "still being written" in busy.text and len(store.messages(cid)) == 2
        assert c.post(f"/c/{cid}/messages", data={"content": "   "}).status_code == 400
        too_long = c.post(f"/c/{cid}/messages", data={"content": "x" * 70_000})
        assert too_long.status_code == 413 and "too long" in too_long.text
        assert too_long.headers["hx-retarget"] == "#notice"
        assert c.post(f"/c/{cid}/messages/{reply.id}/stop").status_code == 204
        waiter(lambda: store.message(reply.id).status == "incomplete", 10, message="stopped")
        refused = c.post(f"/c/{cid}/messages/{user_msg.id}/regenerate")
        assert refused.status_code == 409 and "only the last reply" in refused.text
        again = c.post(f"/c/{cid}/messages/{reply.id}/regenerate")
        # the earlier version stays, hidden (‹1/2›)
        assert again.status_code == 200 and store.message(reply.id).hidden == 1
        new = store.messages(cid)[-1]
        assert new.status == "streaming" and f'id="msg-{new.id}"' in again.text
        assert f'sse-connect="/c/{cid}/messages/{new.id}/stream"' in again.text
        deleted = c.delete(f"/c/{cid}")
        assert deleted.headers["hx-redirect"] == "/"
        assert store.conversation(cid) is None and store.messages(cid) == []
        assert c.get(f"/c/{cid}").status_code == 404
    waiter(lambda: not server.engine.live_ids(), 10, message="delete cancels the reply")
    idle_check(server.engine)


def load_engine(server: Any, n: int, results: list[str]) -> list[threading.Thread]:
    """n long API streams (ignore_eos), each recording its finish reason."""
    def run(i: int) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"Story {i}"}],
                "max_tokens": 300, "ignore_eos": True, "stream": True}
        reason = "?"
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=120) as response:
            for line in response.iter_lines():
                # OpenAI's finish_reason says "stop" for a cancel; Ferry's own word rides beside it
                found = re.search(r'"ferry_finish_reason":"(\w+)"', line)
                if found:
                    reason = found.group(1)
        results.append(reason)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def test_dashboard_shows_queue_and_cancel_frees_slot(server: Any, page: Any, waiter: Any,
                                                     idle_check: Any, tmp_path: Path) -> None:
    results: list[str] = []
    threads = load_engine(server, 3, results)
    try:
        page.goto(server.url + "/dashboard")
        waiter(lambda: page.locator("#running tr[data-id]").count() == 2 and
               page.locator("#waiting tr[data-id]").count() == 1, 30, message="2 run, 1 waits")
        waiting = page.locator("#waiting tr[data-id]")
        assert "slot" in waiting.inner_text()
        waiter(lambda: page.locator("#running tr[data-id]").count() == 2 and "/ 300" in
               page.inner_text("#running"), 30, message="decoding rows")
        page.locator(".timeline td.m-d").first.wait_for()
        page.screenshot(path=str(screenshot_path("dashboard.png", tmp_path)), full_page=True)

        waiting_id = page.get_attribute("#waiting tr[data-id]", "data-id")
        def cancelled() -> Any:
            i = httpx.get(f"{server.url}/v1/requests/{waiting_id}").json()
            return i["state"] == "finished" and i

        info = None
        for _ in range(5):  # SSE re-renders the board: a click can land on a row being swapped
            button = page.locator(f"#waiting button[data-cancel='{waiting_id}']")
            if button.count():
                with contextlib.suppress(Exception):
                    button.click(timeout=2000)
            with contextlib.suppress(AssertionError):
                info = waiter(cancelled, 3, message="waiting request cancelled")
                break
        assert info, "the waiting request was not cancelled"
        assert info["finish_reason"] == "cancelled" and info["output_tokens"] == 0
        waiter(lambda: page.locator("#waiting tr[data-id]").count() == 0, 10,
               message="queue row gone")

        running_id = page.get_attribute("#running tr[data-id]", "data-id")
        page.click(f"#running button[data-cancel='{running_id}']")
        def freed() -> object:
            snap = server.engine.snapshot()
            return running_id not in {v.id for v in snap.running} and snap

        snap = waiter(freed, 10, message="running request gone from the running set")
        assert snap.free_slots == 1 and running_id not in snap.slots
        info = httpx.get(f"{server.url}/v1/requests/{running_id}").json()
        assert info["state"] == "finished" and info["finish_reason"] == "cancelled"
        waiter(lambda: page.locator("#slots .slot.free").count() == 1, 10,
               message="the dashboard shows the freed slot")
    finally:
        for rid in server.engine.live_ids():
            httpx.delete(f"{server.url}/v1/requests/{rid}")
        for t in threads:
            t.join(60)
    assert sorted(results) == ["cancelled"] * 3
    idle_check(server.engine)


def test_dashboard_stream_pushes_while_busy_quiet_when_idle(server: Any, waiter: Any,
                                                             idle_check: Any) -> None:
    results: list[str] = []
    threads = load_engine(server, 1, results)
    waiter(lambda: server.engine.snapshot().running, 30, message="a running request")
    boards = 0
    with httpx.stream("GET", server.url + "/dashboard/stream", timeout=30) as stream:
        start = time.monotonic()
        for line in stream.iter_lines():
            boards += line == "event: board"
            if time.monotonic() - start > 2.0:
                break
    assert boards >= 4, boards  # at least 2 updates a second while the engine works
    for rid in server.engine.live_ids():
        httpx.delete(f"{server.url}/v1/requests/{rid}")
    threads[0].join(30)
    idle_check(server.engine)
    time.sleep(0.5)
    with httpx.stream("GET", server.url + "/dashboard/stream",
                      timeout=httpx.Timeout(30, read=1.5)) as stream, \
            pytest.raises(httpx.ReadTimeout):
        for line in stream.iter_lines():
            assert line != "event: board", "a push while idle"


def test_chat_page_screenshot(server: Any, page: Any, idle_check: Any, tmp_path: Path) -> None:
    server.services.config = dataclasses.replace(server.services.config, chat_ignore_eos=False,
                                                 chat_temperature=0.0, default_max_tokens=60)
    page.goto(server.url + "/")
    send(page, "What is the capital of France?")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    page.wait_for_selector("article.msg.assistant.complete")
    for i, question in enumerate(["List three things to pack for a day at the beach.",
                                  "Write a Python function that adds two numbers."]):
        send(page, question)
        page.locator("article.msg.assistant:not(.streaming)").nth(i + 1).wait_for()
    assert "Paris" in page.inner_text("#messages")
    assert page.locator("article.msg.assistant .body.md pre code").count() >= 1
    page.mouse.move(0, 0)
    # the newest reply in view (its figures and Continue), not mid-way through a smooth scroll
    page.evaluate("(m => { m.style.scrollBehavior = 'auto'; m.scrollTop = m.scrollHeight; })"
                  "(document.getElementById('messages'))")
    page.screenshot(path=str(screenshot_path("chat.png", tmp_path)))
    idle_check(server.engine)

"""The chat's features in headless Chromium against the real server and model: replies that
outlive the page, the queue seen from a waiting reply's bubble, Continue, edit and resend,
regenerate versions, copy, settings, rename, search, export/import, long histories, the
narrow layout, and a refused first message that keeps its text."""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.browser]
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    # one slot, so a second request queues; replies run past EOS to their limit
    return make_server(max_running=1, max_prefill_tokens=256,
                       web={"chat_ignore_eos": True, "default_max_tokens": 40,
                            "dashboard_interval": 0.25, "max_body_bytes": 64 * 1024})


@pytest.fixture
def page(browser: Any, csp_page: Any) -> Iterator[Any]:
    with csp_page(browser, permissions=["clipboard-read", "clipboard-write"]) as page:
        yield page


def send(page: Any, text: str) -> None:
    page.fill("#composer textarea", text)
    page.keyboard.press("Enter")


def conversation_id(page: Any) -> int:
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def new_chat(page: Any, server: Any, text: str) -> int:
    page.goto(server.url + "/")
    send(page, text)
    page.wait_for_url(re.compile(r"/c/\d+$"))
    return conversation_id(page)


def last_reply(page: Any) -> Any:
    return page.locator("#messages article.msg.assistant").last


def wait_done(page: Any, replies: int = 1, timeout: float = 30_000) -> Any:
    """The last reply once it is finished and at least `replies` replies are shown."""
    page.wait_for_function(
        "n => document.querySelectorAll('#messages > article.msg.assistant').length >= n && "
        "document.querySelector('#messages > article.msg:last-child.assistant:not(.streaming)')",
        arg=replies, timeout=timeout)
    return last_reply(page)


def import_conversation(page: Any, server: Any, tmp_path: Path, data: dict[str, Any]) -> int:
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(data))
    page.goto(server.url + "/")
    page.set_input_files(".import input[type=file]", str(path))
    page.wait_for_url(re.compile(r"/c/\d+$"))
    return conversation_id(page)


def test_reply_keeps_growing_on_the_dashboard_then_continue(server: Any, page: Any, waiter: Any,
                                                            idle_check: Any) -> None:
    store = server.services.store
    server.services.config = server.services.config.__class__(
        **{**_fields(server.services.config), "default_max_tokens": 120})
    try:
        cid = new_chat(page, server, "Tell me about lighthouses.")
        reply_id = int(last_reply(page).get_attribute("data-id"))
        waiter(lambda: len(store.message(reply_id).content) > 5, 30, message="first text")
        page.click("text=Dashboard")
        page.wait_for_url(re.compile(r"/dashboard$"))
        seen = len(store.message(reply_id).content)
        # the author is away: the reply goes on and is saved as it grows
        waiter(lambda: len(store.message(reply_id).content) > seen + 20, 30,
               message="the reply growing while its author is on the dashboard")
        done = waiter(lambda: (m := store.message(reply_id)).status != "streaming" and m, 60,
                      message="the reply finished")
        assert done.status == "complete" and done.finish_reason == "length"
        assert done.completion_tokens == 120 and done.ended == "cut at the 120-token limit"
        page.goto(f"{server.url}/c/{cid}")
        reply = wait_done(page)
        assert page.locator("#conversations .live-dot").count() == 0
        figures = reply.locator(".figures").inner_text()
        assert "cut at the 120-token limit" in figures and "tokens/s" in figures
        assert "first token after" in figures and "120 tokens" in figures
        shown = reply.locator(".body").inner_text()
        # Continue: the same reply goes on from where it was cut
        reply.locator("button.continue").click()
        page.locator(f"#msg-{reply_id}.streaming").wait_for()
        waiter(lambda: store.message(reply_id).status != "streaming", 60, message="continued")
        more = store.message(reply_id)
        assert more.content.startswith(done.content) and len(more.content) > len(done.content)
        assert more.completion_tokens == 240 and more.ended == "cut at the 120-token limit"
        page.locator(f"#msg-{reply_id}:not(.streaming)").wait_for()
        assert len(page.locator(f"#msg-{reply_id} .body").inner_text()) > len(shown)
        assert len(store.messages(cid)) == 2
    finally:
        server.services.config = server.services.config.__class__(
            **{**_fields(server.services.config), "default_max_tokens": 40})
    idle_check(server.engine)


def _fields(config: Any) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__slots__}


def occupy_slot(server: Any, tokens: int, done: list[str]) -> threading.Thread:
    """A long API stream that holds the only slot."""
    def run() -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Story"}],
                "max_tokens": tokens, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=120) as response:
            for _ in response.iter_lines():
                pass
        done.append("ok")
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_queued_reply_shows_its_place_then_streams(server: Any, page: Any, waiter: Any,
                                                   idle_check: Any) -> None:
    done: list[str] = []
    thread = occupy_slot(server, 400, done)
    try:
        api_id = waiter(lambda: server.engine.snapshot().running and
                        server.engine.snapshot().running[0].id, 30, message="the API request runs")
        cid = new_chat(page, server, "Hello there, who are you?")
        status = page.locator("article.msg.assistant.streaming .queue-status")
        waiter(lambda: "Waiting: 1st in line" in status.inner_text(), 15,
               message="the waiting bubble's place")
        assert "1 of 1 slots in use" in status.inner_text()
        assert page.locator(f".conv.live a[href='/c/{cid}'] .live-dot").count() == 1
        page.keyboard.press("Escape")  # Esc stops the waiting reply ...
        page.locator("article.msg.assistant.incomplete").wait_for()
        assert "stopped by you" in last_reply(page).locator(".figures").inner_text()
        # ... and a new one waits again, then streams once the slot frees
        send(page, "Hello again?")
        waiter(lambda: "Waiting" in status.inner_text(), 15, message="waiting again")
        assert page.get_attribute("#composer button.send", "aria-label") == "Stop"
        httpx.delete(f"{server.url}/v1/requests/{api_id}")
        body = page.locator("article.msg.assistant.streaming .body")
        waiter(lambda: body.count() == 0 or len(body.inner_text()) > 3, 30,
               message="the queued reply streams")
        reply = wait_done(page, 2)
        assert reply.locator(".body").inner_text().strip()
        waiter(lambda: page.get_attribute("#composer button.send", "aria-label") == "Send", 5,
               message="Stop turns back into Send")
    finally:
        for rid in server.engine.live_ids():
            httpx.delete(f"{server.url}/v1/requests/{rid}")
        thread.join(60)
    idle_check(server.engine)


def test_cancel_by_an_admin_is_named_in_the_reply(server: Any, page: Any, waiter: Any,
                                                  idle_check: Any) -> None:
    """The tracker's `cancelled_by` (set by the dashboard's cancel) reaches the bubble."""
    cid = new_chat(page, server, "Tell me a long story.")
    reply = server.services.store.messages(cid)[-1]
    server.services.tracker.get(reply.request_id).cancelled_by = "alice (admin)"
    server.engine.cancel(reply.request_id)
    wait_done(page)
    assert "cancelled by alice (admin) from the dashboard" in \
        last_reply(page).locator(".figures").inner_text()
    idle_check(server.engine)


def test_edit_resend_regenerate_versions_and_copy(server: Any, page: Any, waiter: Any,
                                                  idle_check: Any) -> None:
    store = server.services.store
    cid = new_chat(page, server, "What is two plus two?")
    first = wait_done(page)
    first_text = first.locator(".body").inner_text()
    # copy the reply (its Markdown source)
    first.locator("button[data-copy]").click()
    assert page.evaluate("navigator.clipboard.readText()") == store.messages(cid)[-1].content
    # regenerate: a second version, ‹2/2›, and the first one is one click away
    first.locator("button.regen").click()
    page.locator("#messages .version-n", has_text="2/2").wait_for()
    second = wait_done(page)
    assert second.locator(".version-n").inner_text() == "2/2"
    assert second.locator("button.regen").is_visible()  # not hover-only
    second.locator("button[aria-label='Previous version']").click()
    page.locator("#messages .version-n", has_text="1/2").wait_for()
    assert last_reply(page).locator(".body").inner_text() == first_text
    # edit the question and send it again: a new reply replaces what followed
    page.locator("article.msg.user button[data-edit]").click()
    page.fill("article.msg.user .edit-form textarea", "What is three plus three?")
    page.click("article.msg.user .edit-form button[type=submit]")
    page.locator("article.msg.user .body", has_text="three plus three").wait_for()
    wait_done(page)
    shown = store.messages(cid)
    assert [m.role for m in shown] == ["user", "assistant"]
    assert shown[0].content == "What is three plus three?"
    assert page.locator("#messages .version-n").count() == 0
    idle_check(server.engine)


def test_code_copy_settings_rename_search(server: Any, page: Any, waiter: Any, idle_check: Any,
                                          tmp_path: Path) -> None:
    store = server.services.store
    code = "def add(a, b):\n    return a + b"
    cid = import_conversation(page, server, tmp_path, {
        "format": "ferry-conversation", "version": 1, "title": "Adding numbers",
        "messages": [{"role": "user", "content": "Write add in Python"},
                     {"role": "assistant", "content": f"Here:\n\n```python\n{code}\n```"}]})
    # highlighted on the server; the code block's Copy button copies the code only
    assert page.locator(".code pre .k", has_text="def").count() == 1
    page.click(".code .copy-code")
    assert page.evaluate("navigator.clipboard.readText()").rstrip() == code
    # settings: a system prompt and a 5-token limit, then a reply that obeys them
    send(page, "Thanks.")
    plain = wait_done(page, 2)
    assert plain.is_visible()
    base = store.messages(cid)[-1]
    page.click(".conv-menu summary")
    page.fill(".conv-settings textarea[name=system_prompt]",
              "You are a terse assistant who answers every question with one short sentence.")
    page.fill(".conv-settings input[name=max_tokens]", "5")
    page.fill(".conv-settings input[name=temperature]", "0")
    page.click(".conv-settings button[type=submit]")
    page.locator("#notice .notice.ok").wait_for()
    conv = store.conversation(cid)
    assert conv.max_tokens == 5 and conv.temperature == 0.0 and conv.system_prompt
    page.fill(".conv-settings input[name=temperature]", "9")
    page.click(".conv-settings button[type=submit]")
    page.locator("#notice .notice:not(.ok)", has_text="temperature").wait_for()
    page.click(".conv-menu summary")
    send(page, "And once more.")
    wait_done(page, 3)
    reply = store.messages(cid)[-1]
    assert reply.completion_tokens == 5 and reply.ended == "cut at the 5-token limit"
    assert reply.prompt_tokens > base.prompt_tokens + 15  # the system prompt is in it
    # rename, then search by title and by content. The title's word is one no model reply
    # writes: the server is shared, and another test's real reply can say "arithmetic"
    page.fill(".rename input[name=title]", "Quokkasum in Python")
    # the rename reloads the page (ClientRedirect). Waiting for the new title is not enough: the
    # list's own refresh (while the last reply's live mark shows) can show it on the old page, and
    # a search typed there is lost when the reload lands; so wait for the reload itself
    with page.expect_navigation(wait_until="load"):
        page.press(".rename input[name=title]", "Enter")
    page.locator(".conv.active a", has_text="Quokkasum in Python").wait_for()
    assert store.conversation(cid).title == "Quokkasum in Python"
    # the search's own response, then the list it left (a failure says what the list shows)
    with page.expect_response(lambda r: "/conversations?" in r.url and "q=quokkasum" in r.url):
        page.fill(".sidebar .search", "quokkasum")
    try:
        waiter(lambda: page.locator("#conversations .conv").count() == 1, 10, message="title hit")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; search box {page.input_value('.sidebar .search')!r}, "
                             f"list: {page.inner_text('#conversations')!r}") from exc
    page.fill(".sidebar .search", "return a + b")
    waiter(lambda: page.locator("#conversations .conv").count() == 1 and
           page.locator(f"#conversations a[href='/c/{cid}']").count() == 1, 10,
           message="content hit")
    page.fill(".sidebar .search", "no such words zzq")
    waiter(lambda: "No conversation matches" in page.inner_text("#conversations"), 10,
           message="no hit")
    page.focus("#composer textarea")
    page.keyboard.press("Control+Shift+O")  # the New chat shortcut
    page.wait_for_url(server.url + "/")
    idle_check(server.engine)


def test_export_import_and_long_history(server: Any, page: Any, waiter: Any, idle_check: Any,
                                        tmp_path: Path) -> None:
    store = server.services.store
    words = " ".join(f"word{i}" for i in range(220))  # ~ 600 tokens a message
    turns = []
    for i in range(4):
        turns += [{"role": "user", "content": f"Question {i}: {words}"},
                  {"role": "assistant", "content": f"Answer {i}: {words}"}]
    cid = import_conversation(page, server, tmp_path, {
        "format": "ferry-conversation", "version": 1, "title": "A long one",
        "settings": {"max_tokens": 8, "system_prompt": "Be helpful."}, "messages": turns})
    assert page.locator("#messages article.msg").count() == 8
    # what the waiting bubble said, in order (a ~1500-token prompt is read in 256-token chunks)
    page.evaluate("""() => { window.__said = [];
        new MutationObserver(() => document.querySelectorAll('.queue-status').forEach(e => {
            if (window.__said.at(-1) !== e.textContent) window.__said.push(e.textContent); }))
        .observe(document.getElementById('messages'),
                 {childList: true, subtree: true, characterData: true}); }""")
    # 8 messages of ~600 tokens do not fit 2048: the oldest are left out, with a note
    send(page, "Summarise.")
    reply = wait_done(page, 5, timeout=120_000)  # a ~1500-token prefill on a busy CPU
    said = page.evaluate("window.__said")
    assert any(re.fullmatch(r"Reading your message: chunk \d of [67] \(\d+ of \d+ tokens\)", t)
               for t in said), said
    note = reply.locator(".note").inner_text()
    assert re.search(r"the \d+ oldest messages were left out to fit the 2048-token context", note)
    assert store.messages(cid)[-1].status == "complete"
    # export as Markdown and JSON; the JSON imports back to the same conversation
    with page.expect_download() as md:
        page.click(".conv-menu summary")
        page.click("a[href$='export.md']")
    text = Path(md.value.path()).read_text()
    assert text.startswith("# A long one") and "## You\n\nSummarise." in text
    with page.expect_download() as js:
        page.click("a[href$='export.json']")
    exported = json.loads(Path(js.value.path()).read_text())
    assert exported["settings"]["max_tokens"] == 8 and len(exported["messages"]) == 10
    again = import_conversation(page, server, tmp_path, exported)
    assert again != cid
    copied = store.messages(again)
    assert [(m.role, m.content) for m in copied] == [
        (m.role, m.content) for m in store.messages(cid)]
    assert store.conversation(again).system_prompt == "Be helpful."
    # a file that is not a conversation gets a notice, not a 500
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    page.goto(server.url + "/")
    page.set_input_files(".import input[type=file]", str(bad))
    page.locator("#notice .notice", has_text="not a Ferry conversation").wait_for()
    idle_check(server.engine)


def test_narrow_screen_code_scrolls_in_its_box_and_drawer_opens(
        server: Any, browser: Any, tmp_path: Path) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        long_line = "x = [" + ", ".join(str(i) for i in range(200)) + "]"
        import_conversation(page, server, tmp_path, {
            "format": "ferry-conversation", "version": 1, "title": "Wide code",
            "messages": [{"role": "user", "content": "a long line please"},
                         {"role": "assistant", "content": f"```python\n{long_line}\n```"}]})
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, width
        pre = page.locator(".code pre")
        assert pre.evaluate("e => e.scrollWidth > e.clientWidth")
        assert page.locator("#composer button.send").bounding_box()["x"] < 390
        sidebar = page.locator("#sidebar")
        assert sidebar.bounding_box()["x"] + sidebar.bounding_box()["width"] <= 0
        page.click("[data-drawer-toggle]")
        page.wait_for_function(
            "() => document.getElementById('sidebar').getBoundingClientRect().x >= 0")
        assert page.locator("#sidebar .conv", has_text="Wide code").is_visible()
        page.keyboard.press("Escape")
        page.wait_for_function(
            "() => document.getElementById('sidebar').getBoundingClientRect().right <= 0")
        # the theme toggle flips dark mode and remembers it
        page.click("[data-theme-toggle]")
        theme = page.evaluate("document.documentElement.dataset.theme")
        page.reload()
        assert page.evaluate("document.documentElement.dataset.theme") == theme
    finally:
        context.close()


def test_refused_first_message_keeps_its_text(server: Any, page: Any, idle_check: Any) -> None:
    text = "Please read this. " + "lorem ipsum dolor " * 900  # longer than the context
    page.goto(server.url + "/")
    page.fill("#composer textarea", text)
    page.keyboard.press("Enter")
    page.locator("#notice .notice").wait_for()
    assert page.url.rstrip("/") == server.url
    assert page.input_value("#composer textarea") == text
    assert server.services.store.conversations("local") is not None
    # a reload of /c (a form post without JavaScript) is a page, never a JSON error
    response = page.goto(server.url + "/c")
    assert response.ok and "<textarea" in page.content()
    idle_check(server.engine)


def test_reply_waiting_for_kv_says_how_much_it_needs(make_server: Any, page: Any, waiter: Any,
                                                     idle_check: Any) -> None:
    # a small pool: one long API reply reserves nearly all of it, the chat reply waits for KV
    small = make_server(max_running=2, kv_tokens=1024, web={"default_max_tokens": 40})
    done: list[str] = []
    thread = occupy_slot(small, 940, done)
    try:
        waiter(lambda: small.engine.snapshot().running, 30, message="the API request runs")
        new_chat(page, small, "Hi!")
        status = page.locator("article.msg.assistant.streaming .queue-status")
        waiter(lambda: "KV positions" in status.inner_text(), 15, message="the KV reason")
        text = status.inner_text()
        assert text.startswith("Waiting: 1st in line · 1 of 2 slots in use · ")
        assert re.search(r"needs \d+ KV positions", text), text
        for rid in small.engine.snapshot().running:
            httpx.delete(f"{small.url}/v1/requests/{rid.id}")
        wait_done(page)
        assert last_reply(page).locator(".body").inner_text().strip()
    finally:
        for rid in small.engine.live_ids():
            httpx.delete(f"{small.url}/v1/requests/{rid}")
        thread.join(60)
    idle_check(small.engine)

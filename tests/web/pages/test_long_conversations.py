"""A long conversation's page shows its latest messages and offers the earlier ones a page at a
time (Show earlier): what one view costs is bounded however long an import makes it. The
rule without a server, then the pages over HTTP, then the button in headless Chromium."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from web.pages.chat.rules import PAGE_CHARS, PAGE_MESSAGES, latest_page
from web.storage.store import Message

ARTICLE = re.compile(r'<article id="msg-(\d+)"')
EARLIER = re.compile(r'hx-get="(/c/\d+/earlier\?before=\d+)"')


def message(i: int, role: str, size: int = 10) -> Message:
    return Message(id=i, conversation_id=1, role=role, content="x" * size, status="complete",
                   finish_reason=None, error=None, request_id=None, created=0.0)


def chat(pairs: int, reply_size: int = 10) -> list[Message]:
    return [message(2 * i + k, role, reply_size if role == "assistant" else 10)
            for i in range(pairs) for k, role in enumerate(("user", "assistant"))]


def test_a_short_conversation_is_shown_whole() -> None:
    messages = chat(5)
    assert latest_page(messages) == (messages, None)
    assert latest_page([]) == ([], None)


def test_a_long_one_shows_its_latest_messages_and_counts_the_rest() -> None:
    messages = chat(100)
    shown, earlier = latest_page(messages)
    assert shown == messages[-PAGE_MESSAGES:]
    assert earlier is not None and earlier.count == 200 - PAGE_MESSAGES
    assert earlier.before == shown[0].id


def test_the_text_bound_keeps_a_reply_with_its_question() -> None:
    size = PAGE_CHARS // 3
    messages = chat(6, reply_size=size)
    shown, earlier = latest_page(messages)
    assert sum(len(m.content) for m in shown) <= PAGE_CHARS + 10
    assert shown[0].role == "user" and len(shown) == 4  # two pairs of a third each
    assert earlier is not None and earlier.count == 8


def test_one_message_past_the_bound_is_still_shown() -> None:
    messages = chat(3, reply_size=2 * PAGE_CHARS)
    shown, earlier = latest_page(messages)
    assert [m.role for m in shown] == ["user", "assistant"]  # the last reply, its question
    assert earlier is not None and earlier.count == 4


@pytest.fixture(scope="module")
def server(make_server: Any, stand_in: Any) -> Any:
    return make_server(executor=stand_in())


def imported(server: Any, pairs: int) -> str:
    messages = [m for i in range(pairs) for m in (
        {"role": "user", "content": f"Question {i}?"},
        {"role": "assistant", "content": f"Answer **{i}**.", "finish_reason": "stop",
         "status": "complete"})]
    raw = json.dumps({"format": "ferry-conversation", "version": 1, "title": "Long",
                      "messages": messages}).encode()
    r = httpx.post(server.url + "/import", files={"file": ("c.json", raw, "application/json")},
                   headers={"Accept": "text/html"}, timeout=30)
    assert r.status_code == 303, r.text[:300]
    return str(r.headers["location"])


def test_every_message_is_reached_once_in_order_through_show_earlier(server: Any) -> None:
    location = imported(server, 70)
    conv_id = int(location.rsplit("/", 1)[1])
    everything = [m.id for m in server.services.store.messages(conv_id)]
    page = httpx.get(server.url + location, timeout=30).text
    seen = [int(i) for i in ARTICLE.findall(page)]
    assert seen == everything[-PAGE_MESSAGES:]
    assert f"Show earlier messages ({140 - PAGE_MESSAGES})" in page
    link = EARLIER.search(page)
    while link:
        part = httpx.get(server.url + link.group(1), headers={"HX-Request": "true"},
                         timeout=30)
        assert part.status_code == 200, part.text[:300]
        seen = [int(i) for i in ARTICLE.findall(part.text)] + seen
        link = EARLIER.search(part.text)
    assert seen == everything
    assert "Answer <strong>0</strong>." in part.text  # rendered like the rest


def test_another_users_earlier_messages_are_a_404(make_shared_server: Any) -> None:
    server, tokens = make_shared_server("earlier", {"ann": False, "bob": False})
    conv = server.services.store.create_conversation("ann", "Ann's")
    r = httpx.get(f"{server.url}/c/{conv.id}/earlier?before=99", timeout=10,
                  headers={"Authorization": f"Bearer {tokens['bob']}"})
    assert r.status_code == 404
    r = httpx.get(f"{server.url}/c/{conv.id}/earlier?before=x", timeout=10,
                  headers={"Authorization": f"Bearer {tokens['ann']}"})
    assert r.status_code == 400


@pytest.fixture
def page(browser: Any, csp_page: Any) -> Iterator[Any]:
    with csp_page(browser) as page:
        yield page


def settled(page: Any, element_id: str) -> float:
    """The element's place in the window once it stays put (no scroll or layout under way)."""
    place = None
    for _ in range(50):
        now = page.evaluate("(id) => document.getElementById(id).getBoundingClientRect().top",
                            element_id)
        if now == place:
            return float(now)
        place = now
        page.wait_for_timeout(100)
    raise AssertionError(f"#{element_id} kept moving")


@pytest.mark.browser
def test_show_earlier_keeps_the_reader_in_place(server: Any, page: Any) -> None:
    location = imported(server, 30)  # a page of 40, then the 20 before them
    page.goto(server.url + location)
    articles = page.locator("#messages article.msg")
    assert articles.count() == PAGE_MESSAGES
    first = articles.first.get_attribute("id")
    # at the top at once (the list scrolls smoothly: no animation in the measurement), and
    # without Chromium's scroll anchoring, as in a browser that has none (Safari): app.js
    # keeps the place
    page.evaluate("""() => { const el = document.querySelector('#messages');
        el.style.overflowAnchor = 'none'; el.scrollTo({top: 0, behavior: 'instant'}); }""")
    top = settled(page, first)
    page.locator("#earlier button").dispatch_event("click")  # a click that scrolls nothing
    page.locator("#earlier").wait_for(state="detached")  # nothing is left before
    assert articles.count() == 60
    # the message the reader saw at the top is where it was, the earlier ones above it
    assert abs(settled(page, first) - top) < 40
    assert page.locator("#messages article.msg").first.inner_text().startswith("Question 0?")

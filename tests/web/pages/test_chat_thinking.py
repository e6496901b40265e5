"""A thinking model in the chat, against the real server and model (the default model under
a template that opens a think block, greedy: tests/tools/thinking.py): the reasoning is
stored apart, never fed back, survives reload, export and import, Continue carries on inside
it, the Thinking setting reaches the template; in Chromium, the collapsed Thinking block
fills while the reply streams."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.tools.thinking import (
    ANSWER,
    FEW_SHOT,
    QUESTION,
    REASONING,
    THINKING_TEMPLATE,
    with_template,
)
from tests.tools.waiting import wait_for

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(make_server: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    thinking = with_template(tokenizer, tmp_path_factory.mktemp("thinking"), THINKING_TEMPLATE)
    return make_server(tokenizer_override=thinking, max_prefill_tokens=512, web={
        "chat_system_prompt": FEW_SHOT, "chat_temperature": 0.0, "chat_ignore_eos": True,
        "default_max_tokens": 16})


def post(url: str, **kw: Any) -> httpx.Response:
    """A plain form post, as a browser without htmx sends it (303s followed)."""
    return httpx.post(url, follow_redirects=True, timeout=60, **kw)


def new_conversation(server: Any, text: str = QUESTION) -> tuple[int, Any]:
    """A conversation with `text` sent, once its reply has ended: (its id, the reply)."""
    r = post(server.url + "/c", data={"content": text})
    assert r.status_code == 200, r.text  # the redirect to /c/{id}, followed
    conv_id = int(str(r.url).rstrip("/").rsplit("/", 1)[1])
    return conv_id, finished(server, conv_id)


def finished(server: Any, conv_id: int) -> Any:
    store = server.services.store
    assert server.engine.wait_idle(60)
    # the engine is idle once the last token is out; the store's write of the ended reply
    # follows on the server's loop (an idle engine's wait_idle returns at once: poll by time)
    def ended() -> Any:
        last = store.messages(conv_id)[-1]
        return last if last.role == "assistant" and not last.is_streaming else None
    return wait_for(ended, 30, "the reply to end")


def test_reasoning_is_stored_apart_and_never_fed_back(server: Any, idle_check: Any) -> None:
    conv_id, reply = new_conversation(server)
    assert reply.reasoning == REASONING
    assert reply.content.startswith(ANSWER) and REASONING not in reply.content
    page = httpx.get(f"{server.url}/c/{conv_id}").text
    block = re.search(r'<details class="thinking">(.*?)</details>', page, re.S)
    assert block and REASONING in block.group(1) and "<summary>Thinking</summary>" in page
    # the next turn's prompt holds the answer, not the reasoning
    from web.pages.chat.service import ChatService

    chat = ChatService(server.services, server.app.state.replies)
    conv = server.services.store.conversation(conv_id)
    prompt = chat.prompt(conv, server.services.store.messages(conv_id))
    text = server.services.tokenizer.decode(prompt.ids, skip_special_tokens=False)
    assert ANSWER in text and REASONING not in text
    idle_check(server.engine)


def test_export_and_import_carry_the_reasoning(server: Any) -> None:
    conv_id, _ = new_conversation(server)
    data = httpx.get(f"{server.url}/c/{conv_id}/export.json").json()
    assert data["messages"][-1]["reasoning"] == REASONING
    assert "reasoning" not in data["messages"][0]
    markdown = httpx.get(f"{server.url}/c/{conv_id}/export.md").text
    assert f"<details><summary>Thinking</summary>\n\n{REASONING}\n\n</details>" in markdown
    r = post(server.url + "/import",
                   files={"file": ("c.json", json.dumps(data), "application/json")})
    assert r.status_code == 200
    copy = int(str(r.url).rstrip("/").rsplit("/", 1)[1])
    assert copy != conv_id
    assert server.services.store.messages(copy)[-1].reasoning == REASONING
    bad = {**data, "messages": [{**data["messages"][-1], "reasoning": 3}]}
    r = post(server.url + "/import",
                   files={"file": ("c.json", json.dumps(bad), "application/json")})
    assert r.status_code == 400 and "reasoning" in r.text


def test_continue_goes_on_inside_the_thinking(server: Any, idle_check: Any) -> None:
    r = post(server.url + "/c", data={"content": QUESTION})
    conv_id = int(str(r.url).rstrip("/").rsplit("/", 1)[1])
    finished(server, conv_id)
    settings = {"system_prompt": "", "temperature": "", "top_p": "", "max_tokens": "3",
                "thinking_switch": "1", "enable_thinking": "on"}
    assert post(f"{server.url}/c/{conv_id}/settings", data=settings).status_code == 200
    store = server.services.store
    reply = store.messages(conv_id)[-1]
    post(f"{server.url}/c/{conv_id}/messages/{reply.id}/regenerate")
    cut = finished(server, conv_id)
    assert cut.finish_reason == "length" and cut.content == ""
    assert cut.reasoning and REASONING.startswith(cut.reasoning)
    settings["max_tokens"] = "16"
    post(f"{server.url}/c/{conv_id}/settings", data=settings)
    post(f"{server.url}/c/{conv_id}/messages/{cut.id}/continue")
    again = finished(server, conv_id)
    assert again.id == cut.id
    assert again.reasoning == REASONING and again.content.startswith(ANSWER)
    idle_check(server.engine)


def test_thinking_setting_reaches_the_template(server: Any) -> None:
    conv_id, _ = new_conversation(server)
    page = httpx.get(f"{server.url}/c/{conv_id}").text
    assert 'name="enable_thinking" checked' in page
    settings = {"system_prompt": "", "temperature": "", "top_p": "", "max_tokens": "",
                "thinking_switch": "1"}  # the box unticked
    assert post(f"{server.url}/c/{conv_id}/settings", data=settings).status_code == 200
    conv = server.services.store.conversation(conv_id)
    assert conv.enable_thinking == 0 and not conv.thinking
    assert 'name="enable_thinking" >' in httpx.get(f"{server.url}/c/{conv_id}").text
    post(f"{server.url}/c/{conv_id}/messages", data={"content": "5+5?"})
    reply = finished(server, conv_id)
    assert reply.reasoning is None and reply.content  # the prompt closed the block


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


@pytest.mark.browser
def test_browser_shows_a_collapsed_thinking_block_live(server: Any, page: Any, waiter: Any,
                                                       idle_check: Any) -> None:
    conv_id, _ = new_conversation(server)
    # a long version of the reply, so that it is seen while it streams
    settings = {"system_prompt": "", "temperature": "", "top_p": "", "max_tokens": "300",
                "thinking_switch": "1", "enable_thinking": "on"}
    post(f"{server.url}/c/{conv_id}/settings", data=settings)
    page.goto(f"{server.url}/c/{conv_id}")
    page.click("article.msg.assistant button.regen")
    streaming = page.locator("article.msg.assistant.streaming")
    thinking = streaming.locator("details.thinking")
    waiter(lambda: streaming.count() and REASONING in thinking.text_content(), 30,
           message="the reasoning, while the reply streams")
    assert thinking.is_visible() and thinking.get_attribute("open") is None  # collapsed
    assert thinking.locator("summary").inner_text().startswith("Thinking")
    assert not thinking.locator(".thinking-body").is_visible()
    thinking.locator("summary").click()  # open it while the answer goes on streaming
    assert thinking.locator(".thinking-body").is_visible()
    waiter(lambda: ANSWER in streaming.locator(".body").inner_text(), 30, message="the answer")
    assert streaming.count() == 1  # still streaming: the block filled live
    page.click("article.msg.assistant.streaming button.stop")
    page.wait_for_selector("article.msg.assistant:not(.streaming) .figures")
    done = page.locator("article.msg.assistant").last
    block = done.locator("details.thinking")
    assert block.get_attribute("open") is None and block.is_visible()
    assert not block.locator(".thinking-body").is_visible()
    assert REASONING not in done.locator(".body").inner_text()
    page.reload()
    block = page.locator("article.msg.assistant").last.locator("details.thinking")
    block.locator("summary").click()
    assert REASONING in block.locator(".thinking-body").inner_text()
    idle_check(server.engine)

"""Several models in the pages: the chat's model picker (per conversation, stored; a reply
says which model wrote it; the bubble shows `loading` while its model loads) and the
dashboard's Models panel with the admin's Load and Unload, in headless Chromium.

Screenshots go to docs/screenshots/{models-picker,models-dashboard}.png when
FERRY_UPDATE_SCREENSHOTS=1 is set or the file is missing."""
from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.screenshots import screenshot_path

pytestmark = [pytest.mark.model, pytest.mark.browser]


@pytest.fixture(scope="module")
def server(make_models_server: Any) -> Any:
    return make_models_server(("alpha", "beta"), max_running=2,
                              web={"default_max_tokens": 24, "chat_temperature": 0.0,
                                   "dashboard_interval": 0.25})


@pytest.fixture
def page(browser: Any, csp_page: Any) -> Iterator[Any]:
    with csp_page(browser) as page:
        page.set_default_timeout(60_000)  # model loads wait longer than the usual 30 s
        yield page


def model_state(server: Any, name: str) -> str:
    cards = httpx.get(server.url + "/v1/models").json()["data"]
    return str(next(c["state"] for c in cards if c["id"] == name))


def long_request(url: str, model: str) -> None:
    httpx.post(url + "/v1/completions", timeout=120, json={
        "model": model, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True})


def last_reply(page: Any) -> Any:
    return page.locator("article.msg.assistant").last


def test_unknown_models_are_refused(server: Any) -> None:
    r = httpx.post(server.url + "/c", data={"content": "hi", "model": "gamma"})
    assert r.status_code == 400 and "gamma" in r.text
    r = httpx.post(server.url + "/dashboard/models", data={"model": "gamma", "action": "load"},
                   headers={"HX-Request": "true"})
    assert r.status_code == 400


def test_picker_routes_the_chat_and_replies_name_their_model(
        server: Any, page: Any, waiter: Any, idle_check: Any, tmp_path: Path) -> None:
    assert model_state(server, "beta") == "unloaded"
    page.goto(server.url + "/")
    picker = page.locator("select.model-pick")
    assert picker.locator("option").all_inner_texts() == ["alpha", "beta (not loaded)"]
    picker.select_option("beta")
    page.fill("#composer textarea", "What is the capital of Germany?")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    # while beta loads, the bubble says so (the reply waits with the reason `loading`)
    waiter(lambda: "loading beta" in last_reply(page).inner_text()
           or model_state(server, "beta") == "loaded", 60, message="loading shown")
    waiter(lambda: "by beta" in last_reply(page).inner_text(), 60, message="beta's reply")
    assert "Berlin" in last_reply(page).inner_text()
    assert page.locator(".model-pick select").input_value() == "beta"  # remembered
    # the conversation goes on with alpha: the next reply is alpha's
    page.locator(".model-pick select").select_option("alpha")
    page.wait_for_load_state()
    waiter(lambda: page.locator(".model-pick select").input_value() == "alpha", 30,
           message="alpha picked")
    page.fill("#composer textarea", "And of France?")
    page.keyboard.press("Enter")
    waiter(lambda: page.locator("article.msg.assistant").count() == 2 and
           "by alpha" in last_reply(page).inner_text(), 60, message="alpha's reply")
    page.reload()
    texts = page.locator("article.msg.assistant .figures").all_inner_texts()
    assert "by beta" in texts[0] and "by alpha" in texts[1]
    page.locator(".model-pick select").focus()
    page.screenshot(path=str(screenshot_path("models-picker.png", tmp_path)))
    idle_check(server.engine)


def test_dashboard_shows_each_model_and_admin_loads_and_unloads(
        server: Any, page: Any, waiter: Any, idle_check: Any, tmp_path: Path) -> None:
    page.goto(server.url + "/dashboard")
    panel = page.locator("#models")
    waiter(lambda: panel.locator("tr[data-model]").count() == 2, 30, message="models panel")
    if model_state(server, "beta") != "loaded":
        page.select_option("#models-form select[name=model]", "beta")
        page.click("#models-form button[value=load]")
        waiter(lambda: model_state(server, "beta") == "loaded", 60, message="beta loaded")
        # the status line follows the load to its end (it used to say "Loading" for good)
        waiter(lambda: "Loaded beta." in page.inner_text("#models-status"), 30,
               message="load status")
    waiter(lambda: "loaded" in panel.locator("tr[data-model=beta]").inner_text(), 30,
           message="beta shown loaded")
    assert "default" in panel.locator("tr[data-model=alpha]").inner_text()
    assert "loaded beta" in panel.inner_text()  # the load event
    # both models at work: each has its row, and their rounds take turns
    streams = [threading.Thread(target=long_request, args=(server.url, name), daemon=True)
               for name in ("alpha", "beta")]
    for t in streams:
        t.start()
    waiter(lambda: page.locator("#running tr[data-id]").count() == 2 and
           all(panel.locator(f"tr[data-model={n}] td").nth(3).inner_text().strip() == "1"
               for n in ("alpha", "beta")), 60, message="one request running on each model")
    page.wait_for_timeout(1500)  # a few rounds into the timeline
    page.screenshot(path=str(screenshot_path("models-dashboard.png", tmp_path)),
                    full_page=True)
    for rid in server.engine.live_ids():
        server.engine.cancel(rid)
    for t in streams:
        t.join(60)
    idle_check(server.engine)
    page.select_option("#models-form select[name=model]", "beta")
    page.click("#models-form button[value=unload]")
    waiter(lambda: "Unloaded beta" in page.inner_text("#models-status"), 30,
           message="unload status")
    assert model_state(server, "beta") == "unloaded"
    waiter(lambda: "unloaded" in panel.locator("tr[data-model=beta]").inner_text(), 30,
           message="beta shown unloaded")
    assert "unloaded beta: unloaded by an admin" in panel.inner_text()
    idle_check(server.engine)


def test_dashboard_shows_the_rounds_and_charts_of_the_chosen_model(
        server: Any, waiter: Any, idle_check: Any) -> None:
    assert model_state(server, "beta") == "unloaded"  # the test above unloaded it
    page = httpx.get(server.url + "/dashboard", params={"model": "beta"}).text
    assert "Recent rounds of beta" in page and "beta is not loaded." in page
    assert 'sse-connect="/dashboard/stream?model=beta"' in page
    pushed: list[str] = []

    def listen() -> None:  # the board the stream pushes for this viewer's choice
        with httpx.stream("GET", server.url + "/dashboard/stream", params={"model": "beta"},
                          timeout=120) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:") and "Recent rounds" in line:
                    pushed.append(line)
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    r = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "model": "beta", "prompt": "Once upon a time", "max_tokens": 4})
    assert r.status_code == 200
    rid = r.headers["X-Request-Id"]
    listener.join(60)
    assert pushed and "Recent rounds of beta" in pushed[0]
    beta = httpx.get(server.url + "/dashboard", params={"model": "beta"}).text
    assert f"<th>{rid}</th>" in beta and 'aria-label="Throughput"' in beta
    alpha = httpx.get(server.url + "/dashboard").text  # the default's rounds: not beta's
    assert "Recent rounds of alpha" in alpha and f"<th>{rid}</th>" not in alpha
    assert 'sse-connect="/dashboard/stream"' in alpha
    idle_check(server.engine)
    r = httpx.post(server.url + "/dashboard/models", data={"model": "beta", "action": "unload"},
                   headers={"HX-Request": "true"})
    assert r.status_code == 200

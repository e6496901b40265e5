"""In headless Chromium: a page on a foreign name that resolves to 127.0.0.1 (DNS rebinding,
made with --host-resolver-rules) cannot read a conversation or drive Ferry; and the pages
(login, chat, dashboard) run under the Content-Security-Policy, which refuses inline script."""
from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.browser
EVIL = "evil.example"
# Chromium's own Local Network Access checks would stop a public page's requests to
# loopback before Ferry sees them; other browsers have none: turn them off to test Ferry's
CHROMIUM_EXTRA_ARGS = [f"--host-resolver-rules=MAP {EVIL} 127.0.0.1",
                       "--disable-features=LocalNetworkAccessChecks,"
                       "BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights,"
                       "PrivateNetworkAccessRespectPreflightResults"]
SECRET = "the secret launch code is 0000"
ATTACK = """async (cid) => {
    const out = {};
    try {
        const r = await fetch(`/c/${cid}/export.json`);
        out.export = [r.status, await r.text()];
        const p = await fetch(`/c/${cid}/rename`, {method: "POST", body: "title=pwned",
            headers: {"Content-Type": "application/x-www-form-urlencoded"}});
        out.rename = p.status;
        const a = await fetch("/v1/chat/completions", {method: "POST",
            headers: {"Content-Type": "application/json"},
            body: JSON.stringify({model: "SmolLM2-135M-Instruct", max_tokens: 2,
                                  messages: [{role: "user", content: "hi"}]})});
        out.api = a.status;
    } catch (e) { out.error = String(e); }
    return out;
}"""


@pytest.fixture(scope="module")
def server(make_server: Any, stand_in: Any) -> Any:
    return make_server(executor=stand_in())


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    yield context
    context.close()


def csp_watch(page: Any) -> list[str]:
    """Console messages about Content-Security-Policy violations, as they come."""
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text)
            if "Content Security Policy" in m.text else None)
    return seen


def test_a_rebinding_page_cannot_read_or_drive_ferry(server: Any, context: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    store = server.services.store
    conv = store.create_conversation("local", "Plans")
    store.add_message(conv.id, "user", SECRET)
    port = urlsplit(server.url).port
    evil = f"http://{EVIL}:{port}"
    # the attacker's page as its own server first served it; its scripts' requests then go
    # to the rebound name, that is to 127.0.0.1, to Ferry
    context.route(f"{evil}/", lambda route: route.fulfill(
        status=200, content_type="text/html", body="<!doctype html><title>cats</title>"))
    page = context.new_page()
    page.goto(f"{evil}/")
    with caplog.at_level(logging.WARNING, logger="ferry.hosts"):
        got = page.evaluate(ATTACK, conv.id)
    assert "error" not in got, got
    assert got["export"][0] == 421 and SECRET not in got["export"][1]
    assert got["rename"] == 421 and got["api"] == 421
    assert store.conversation(conv.id).title == "Plans"
    assert not server.engine.live_ids()
    # the requests did reach Ferry (through the resolver rule), which refused the name
    assert any(EVIL in r.getMessage() for r in caplog.records), caplog.text
    # the same script on Ferry's own page reads the conversation: the attack was real
    own = context.new_page()
    own.goto(server.url + "/healthz")
    export = own.evaluate("async (cid) => { const r = await fetch(`/c/${cid}/export.json`);"
                          " return [r.status, await r.text()]; }", conv.id)
    assert export[0] == 200 and SECRET in export[1]
    store.delete_conversation(conv.id)


def test_chat_and_dashboard_run_under_the_csp(server: Any, context: Any) -> None:
    page = context.new_page()
    page.set_default_timeout(30_000)
    violations = csp_watch(page)
    response = page.goto(server.url + "/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    page.wait_for_function("window.htmx !== undefined")
    before = page.evaluate("document.documentElement.dataset.theme || ''")
    page.click("[data-theme-toggle]")  # app.js runs
    assert page.evaluate("document.documentElement.dataset.theme") != before
    # inline script is refused: the policy is enforced, not only sent
    ran = page.evaluate("""() => { const s = document.createElement('script');
        s.textContent = 'window.__inline = 1'; document.head.appendChild(s);
        return window.__inline === 1; }""")
    assert ran is False
    assert violations and all("script-src" in v for v in violations)  # that one only
    violations.clear()
    page.goto(server.url + "/dashboard")
    page.wait_for_selector("#kvbar")
    page.wait_for_function("document.querySelector('#board') !== null "
                           "|| document.querySelector('[sse-connect]') !== null")
    page.goto(server.url + "/")
    page.fill("#composer textarea", "Hello there")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    page.locator("article.msg.assistant").first.wait_for()
    assert not violations, violations


def test_login_page_runs_under_the_csp(make_shared_server: Any, context: Any,
                                       sign_in: Any) -> None:
    shared, tokens = make_shared_server("csp", {"ann": False})
    page = context.new_page()
    violations = csp_watch(page)
    page.goto(shared.url + "/login")
    assert page.evaluate("getComputedStyle(document.body).display") == "grid"  # login.css
    page.close()
    signed_in = sign_in(context, shared.url, tokens["ann"])
    signed_in.goto(shared.url + "/dashboard")
    signed_in.wait_for_selector("#kvbar")
    assert not violations, violations

"""The dashboard on a real server in shared mode: figures that agree with each other, one
count for the queue, an admin's cancel of someone else's request (confirmation, and the owner
learns who), and the policy form answering htmx with a fragment.

A stand-in executor replaces the model (these tests are about what the page says); the
engine's own tests cover the scheduling.
"""
from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def setup(make_shared_server: Any) -> tuple[Any, dict]:
    return make_shared_server("dashboard", {"ann": True, "bob": False},
                              max_running=1, max_prefill_tokens=16,
                              web={"chat_ignore_eos": True, "default_max_tokens": 300,
                                   "dashboard_interval": 0.1})


def client(server: Any, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"},
                        timeout=30)


def tile(html: str, name: str) -> str:
    found = re.search(rf'<div class="stat"><span>{name}</span><strong[^>]*>(.*?)</strong>', html)
    assert found, name
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def chart_value(html: str, label: str) -> str:
    found = re.search(rf"<figcaption><span>{label}</span><strong>(.*?)</strong>", html)
    assert found, label
    return found.group(1).strip()


def cancel_all(server: Any, tokens: dict[str, str], idle_check: Any) -> None:
    with client(server, tokens["ann"]) as ann:
        for rid in server.engine.live_ids():
            ann.delete(f"/v1/requests/{rid}")
    idle_check(server.engine)


def test_tiles_and_charts_agree(setup: tuple[Any, dict], waiter: Any, idle_check: Any) -> None:
    server, tokens = setup
    with client(server, tokens["bob"]) as bob:
        assert bob.post("/c", data={"content": "a long reply please"}).status_code == 303
        waiter(lambda: server.engine.snapshot().metrics.itl_p50 is not None, 20,
               message="ITL figures")
        for _ in range(5):  # while it runs, and across the engine's history steps
            html = bob.get("/dashboard").text
            output = tile(html, "Output").replace("tok/s", "").strip()
            assert chart_value(html, "Throughput") == f"{output} tok/s"
            # the stand-in never keeps a draft: one token per step
            assert re.fullmatch(r"0% kept, 1\.00 tok/step", tile(html, "Speculative"))
            itl = tile(html, "ITL p50")
            assert itl != "–" and "no data yet" not in html.split("ITL p50")[-1]
            if itl.endswith(" ms"):
                assert chart_value(html, "ITL p50") == itl
            time.sleep(0.3)
    cancel_all(server, tokens, idle_check)


def test_waiting_tile_and_queue_header_count_the_same(setup: tuple[Any, dict], waiter: Any,
                                                      idle_check: Any) -> None:
    """A chunked prompt holds the slot (Running) and is not counted as waiting anywhere."""
    server, tokens = setup
    long_prompt = " ".join(f"word{i}" for i in range(300))  # many chunks of 16 tokens
    with client(server, tokens["bob"]) as bob:
        for text in (long_prompt, "second", "third"):
            assert bob.post("/c", data={"content": text}).status_code == 303

        def rows(html: str) -> int:
            return html.split('id="waiting"')[1].split("</table>")[0].count("<tr data-id=") \
                if 'id="waiting"' in html else 0

        def chunked_page() -> str | None:  # the long prompt in chunks, the other two queued
            html = bob.get("/dashboard").text
            return html if "prefill chunk" in html and rows(html) == 2 else None

        html = waiter(chunked_page, 20, message="a chunked prompt and two queued")
        header = re.search(r'id="queue-count">(\d+)<', html)
        assert header and tile(html, "Waiting") == header.group(1) == "2"
        assert "behind behind" not in html and "queued</span> <span class=\"reason-text\">" \
            "behind req-" in html
        metrics = bob.get("/metrics").text
        assert re.search(r'ferry:num_requests_waiting\{[^}]*\} 2\.0', metrics)
    cancel_all(server, tokens, idle_check)


def test_admin_cancel_confirms_and_the_owner_learns_who(setup: tuple[Any, dict], waiter: Any,
                                                        idle_check: Any) -> None:
    server, tokens = setup
    with client(server, tokens["bob"]) as bob, client(server, tokens["ann"]) as ann:
        made = bob.post("/c", data={"content": "keep going"})
        cid = made.headers["location"].rsplit("/", 1)[1]
        rid = waiter(lambda: server.engine.live_ids(owner="bob"), 10, message="bob's reply")[0]
        button = re.compile(rf'<button[^>]*hx-post="/dashboard/requests/{rid}/cancel"[^>]*>')
        own = waiter(lambda: button.search(bob.get("/dashboard").text), 10, message="its row")
        assert "hx-confirm" not in own.group(0)  # one's own: no question asked
        other = button.search(ann.get("/dashboard").text)
        assert other and re.search(r'hx-confirm="Cancel [^"]*bob', other.group(0))
        assert ann.post(f"/dashboard/requests/{rid}/cancel").status_code == 204
        waiter(lambda: not server.engine.live_ids(), 10, message="cancelled")
        assert server.services.tracker.get(rid).cancelled_by == "ann (admin)"
        waiter(lambda: "cancelled by ann (admin) from the dashboard" in bob.get(f"/c/{cid}").text,
               10, message="the owner's chat says who cancelled")
        # the owner's own cancel names nobody
        bob.post("/c", data={"content": "again"})
        mine = waiter(lambda: server.engine.live_ids(owner="bob"), 10, message="reply")[0]
        assert bob.post(f"/dashboard/requests/{mine}/cancel").status_code == 204
        waiter(lambda: not server.engine.live_ids(), 10, message="cancelled")
        assert server.services.tracker.get(mine).cancelled_by is None
    idle_check(server.engine)


def test_policy_form_answers_htmx_with_a_fragment(setup: tuple[Any, dict]) -> None:
    server, tokens = setup
    with client(server, tokens["ann"]) as ann:
        form = {"policy": "prefill-first", "admission": "fifo"}
        fragment = ann.post("/dashboard/policy", data=form, headers={"HX-Request": "true"})
        assert fragment.status_code == 200 and fragment.text.startswith("Policy prefill-first")
        plain = ann.post("/dashboard/policy", data=form, follow_redirects=False)
        assert plain.status_code == 303 and plain.headers["location"] == "/dashboard"


@contextlib.contextmanager
def dashboard_beside_a_reply(setup: tuple[Any, dict], browser: Any, waiter: Any,
                             sign_in: Any) -> Iterator[tuple[Any, str]]:
    """(ann's dashboard page in Chromium, the id of bob's running reply) once its row and
    Cancel button are on the page; the browser context is closed after."""
    server, tokens = setup
    with client(server, tokens["bob"]) as bob:
        bob.post("/c", data={"content": "keep going"})
    rid = waiter(lambda: server.engine.live_ids(owner="bob"), 10, message="bob's reply")[0]
    context = browser.new_context()
    try:
        page = sign_in(context, server.url, tokens["ann"])
        page.goto(server.url + "/dashboard")
        page.locator(f"button[data-cancel='{rid}']").wait_for()
        yield page, rid
    finally:
        context.close()


@pytest.mark.browser
def test_admin_confirms_in_chromium(setup: tuple[Any, dict], browser: Any, waiter: Any,
                                    idle_check: Any, sign_in: Any) -> None:
    server, _ = setup
    with dashboard_beside_a_reply(setup, browser, waiter, sign_in) as (page, rid):
        asked: list[str] = []
        answer = {"accept": False}

        def on_dialog(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.accept() if answer["accept"] else dialog.dismiss()

        page.on("dialog", on_dialog)
        page.click(f"button[data-cancel='{rid}']")
        waiter(lambda: asked, 10, message="a confirmation")  # (the row is there by now)
        assert "bob" in asked[0]
        time.sleep(0.5)
        assert rid in server.engine.live_ids()  # dismissed: still running
        answer["accept"] = True
        page.click(f"button[data-cancel='{rid}']")
        waiter(lambda: rid not in server.engine.live_ids(), 10, message="cancelled after yes")
        assert len(asked) == 2
    idle_check(server.engine)


@pytest.mark.browser
def test_cancel_buttons_survive_the_boards_redraws(setup: tuple[Any, dict], browser: Any,
                                                   waiter: Any, idle_check: Any,
                                                   sign_in: Any) -> None:
    """The board is redrawn on every update (ten a second here), its Cancel buttons kept:
    the button under the pointer stays the same element while the board around it changes,
    so a click is not lost between press and release, and the click cancels."""
    server, tokens = setup
    with dashboard_beside_a_reply(setup, browser, waiter, sign_in) as (page, rid):
        selector = f"button[data-cancel='{rid}']"
        page.evaluate("() => { window.__redraws = 0; new MutationObserver(() => { "
                      "window.__redraws += 1; }).observe(document.getElementById('board'), "
                      "{ childList: true }); }")
        page.hover(selector)
        page.eval_on_selector(selector, "b => { b.dataset.marked = 'yes'; }")
        waiter(lambda: page.evaluate("window.__redraws") >= 5, 10, message="redraws")
        assert page.eval_on_selector(selector, "b => b.dataset.marked") == "yes"
        assert page.eval_on_selector(selector, "b => b.matches(':hover')")
        page.focus(selector)  # the keyboard's focus stays on it too
        start = page.evaluate("window.__redraws")
        waiter(lambda: page.evaluate("window.__redraws") >= start + 3, 10, message="redraws")
        assert page.eval_on_selector(selector, "b => b === document.activeElement")
        page.on("dialog", lambda dialog: dialog.accept())  # bob's: ann confirms
        page.click(selector)
        waiter(lambda: rid not in server.engine.live_ids(), 10, message="cancelled")
        assert server.services.tracker.get(rid).cancelled_by == "ann (admin)"
        waiter(lambda: page.locator(selector).count() == 0, 10, message="its row gone")
    cancel_all(server, tokens, idle_check)

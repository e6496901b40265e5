"""Changing the scheduling policy and admission order at runtime: POST /v1/engine/policy
(admins only) and the dashboard's control (shown to admins only), in shared mode, through
the API, plain forms with CSRF, and headless Chromium clicking the control.

A stand-in executor replaces the model: these tests are about access and wiring; the
engine's own tests cover what each policy does.
"""
from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest


@pytest.fixture(scope="module")
def setup(make_shared_server: Any) -> tuple[Any, dict]:
    return make_shared_server("policy", {"ann": True, "bob": False}, delay=0.01,
                              max_running=2)


def client(server: Any, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def wait_policy(server: Any, policy: str, admission: str, waiter: Any) -> None:
    waiter(lambda: (s := server.engine.snapshot()).policy == policy
           and s.admission == admission, 10, message=f"{policy}/{admission} in the snapshot")
    assert (server.engine.config.policy, server.engine.config.admission) == (policy, admission)


def test_admin_changes_policy_through_the_api(setup: tuple[Any, dict], waiter: Any) -> None:
    server, tokens = setup
    ann = client(server, tokens["ann"])
    before = ann.get("/v1/engine/policy").json()
    assert before["policies"] == ["prefill-first", "interleave", "mixed"]
    assert before["admissions"] == ["fifo", "fair"]
    changed = ann.post("/v1/engine/policy", json={"policy": "mixed", "admission": "fair"})
    assert changed.status_code == 200, changed.text
    assert changed.json()["policy"] == "mixed" and changed.json()["admission"] == "fair"
    wait_policy(server, "mixed", "fair", waiter)
    assert ann.get("/v1/engine/policy").json()["policy"] == "mixed"
    # one at a time: the other keeps its value
    assert ann.post("/v1/engine/policy", json={"admission": "fifo"}).json() == {
        **before, "policy": "mixed", "admission": "fifo"}
    wait_policy(server, "mixed", "fifo", waiter)
    # the dashboard's settings panel follows
    assert re.search(r"<dt>Policy</dt><dd>mixed</dd>", ann.get("/dashboard").text)


@pytest.mark.parametrize(("body", "param"), [
    ({}, "policy"),
    ({"policy": "lifo"}, "policy"),
    ({"admission": "random"}, "admission"),
    ({"policy": 3}, "policy"),
])
def test_bad_policy_bodies_are_clear_400s(setup: tuple[Any, dict], body: dict[str, Any],
                                          param: str) -> None:
    server, tokens = setup
    response = client(server, tokens["ann"]).post("/v1/engine/policy", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_non_admins_get_403(setup: tuple[Any, dict], waiter: Any) -> None:
    server, tokens = setup
    before = (server.engine.snapshot().policy, server.engine.snapshot().admission)
    bob = client(server, tokens["bob"])
    assert bob.get("/v1/engine/policy").status_code == 200  # reading is fine
    refused = bob.post("/v1/engine/policy", json={"policy": "interleave"})
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error"
    assert bob.post("/dashboard/policy", data={"policy": "interleave"}).status_code == 403
    assert client(server).post("/v1/engine/policy", json={"policy": "mixed"}).status_code == 401
    time.sleep(0.2)
    assert (server.engine.snapshot().policy, server.engine.snapshot().admission) == before
    # the control is on the admin's dashboard only
    assert 'id="policy-form"' not in bob.get("/dashboard").text
    assert 'id="policy-form"' in client(server, tokens["ann"]).get("/dashboard").text


def sign_in(browser: httpx.Client, token: str) -> str:
    """Sign in through the login form; returns the pages' CSRF token."""
    assert browser.post("/login", data={"token": token, "next": "/"}).status_code in (200, 303)
    page = browser.get("/dashboard")
    found = re.search(r'"X-CSRF-Token": "([^"]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


def test_dashboard_control_with_a_session(setup: tuple[Any, dict], waiter: Any) -> None:
    server, tokens = setup
    with httpx.Client(base_url=server.url, timeout=30) as bob:
        csrf = sign_in(bob, tokens["bob"])
        refused = bob.post("/dashboard/policy", data={"policy": "mixed"},
                           headers={"X-CSRF-Token": csrf, "HX-Request": "true"})
        assert refused.status_code == 403
    with httpx.Client(base_url=server.url, timeout=30) as ann:
        csrf = sign_in(ann, tokens["ann"])
        page = ann.get("/dashboard").text
        form = page[page.index('id="policy-form"'):page.index("</form>", page.index(
            'id="policy-form"'))]
        assert 'hx-post="/dashboard/policy"' in form and f'value="{csrf}"' in form
        assert ann.post("/dashboard/policy", data={"policy": "interleave"}).status_code == 403
        done = ann.post("/dashboard/policy", data={"policy": "interleave", "admission": "fair"},
                        headers={"X-CSRF-Token": csrf, "HX-Request": "true"})
        assert done.status_code == 200 and "interleave" in done.text
        wait_policy(server, "interleave", "fair", waiter)
        bad = ann.post("/dashboard/policy", data={"policy": "<b>lifo</b>"},
                       headers={"X-CSRF-Token": csrf, "HX-Request": "true"})
        assert bad.status_code == 400 and "&lt;b&gt;" in bad.text and "<b>" not in bad.text
        # a plain form post (no script) lands back on the dashboard
        plain = ann.post("/dashboard/policy", data={"policy": "prefill-first",
                                                    "admission": "fifo", "csrf_token": csrf})
        assert plain.status_code == 303 and plain.headers["location"] == "/dashboard"
        wait_policy(server, "prefill-first", "fifo", waiter)


@pytest.mark.browser
def test_admin_uses_the_control_in_chromium(setup: tuple[Any, dict], browser: Any,
                                            waiter: Any, sign_in: Any) -> None:
    server, tokens = setup
    context = browser.new_context()
    try:
        page = sign_in(context, server.url, tokens["ann"])
        page.goto(server.url + "/dashboard")
        page.select_option("#policy-form select[name=policy]", "mixed")
        page.select_option("#policy-form select[name=admission]", "fair")
        page.click("#policy-form button[type=submit]")
        page.wait_for_function(
            "document.querySelector('#policy-status').textContent.includes('mixed')")
        wait_policy(server, "mixed", "fair", waiter)
        assert page.url.endswith("/dashboard")  # htmx: no navigation
    finally:
        context.close()

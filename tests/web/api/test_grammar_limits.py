"""Grammar inputs against a real server on the default model: each limit is a 400 naming it (in
the API's error shape), the inputs that used to kill the process are 400s and the server goes
on serving, a guided_choice request with n=8 compiles once, and compiles run on the compile
threads, off the event loop and outside the model set's lock: /healthz answers while one
compiles."""
from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from engine.structured import compiler
from engine.structured.compiler import CACHE
from engine.structured.limits import LIMITS
from tests.tools.grammar_chains import nested, ref_chain, rule_chain

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=8, kv_tokens=8192)


def post(url: str, body: dict[str, Any], path: str = "/v1/chat/completions",
         model: str = MODEL) -> httpx.Response:
    body = {"model": model, "max_tokens": 4, **body}
    if path.endswith("chat/completions"):
        body.setdefault("messages", [{"role": "user", "content": "Pick one."}])
    else:
        body.setdefault("prompt", "Pick one:")
    return httpx.post(url + path, json=body, timeout=120)


def tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}


CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "grammar bytes": ({"guided_grammar": 'start: "' + "x" * LIMITS.max_bytes + '"'},
                      "guided_grammar", "max_bytes"),
    "grammar rules": ({"guided_grammar": rule_chain(LIMITS.max_rules)}, "guided_grammar",
                      "max_rules"),
    "gbnf rules": ({"grammar": "root ::= r0\n" + "".join(
        f"r{i} ::= r{i + 1}\n" for i in range(LIMITS.max_rules)) + f'r{LIMITS.max_rules} ::= "x"'},
        "grammar", "max_rules"),
    "grammar depth": ({"guided_grammar": "start: " + "(" * 65 + '"x"' + ")" * 65},
                      "guided_grammar", "max_depth"),
    # as JSON text (vLLM's form): the body's own depth guard does not look inside strings
    "schema depth": ({"guided_json": json.dumps(nested(LIMITS.max_depth))}, "guided_json",
                     "max_depth"),
    "schema text bytes": ({"guided_json": '{"type": "string", "description": "' +
                           "x" * LIMITS.max_bytes + '"}'}, "guided_json", "max_bytes"),
    "regex depth": ({"guided_regex": "(" * 65 + "x" + ")" * 65}, "guided_regex", "max_depth"),
    "choices": ({"guided_choice": [str(i) for i in range(LIMITS.max_choices + 1)]},
                "guided_choice", "max_choices"),
    "tools": ({"tools": [tool(i) for i in range(LIMITS.max_tools + 1)]}, "tools", "max_tools"),
    "tool schema": ({"tools": [{"type": "function", "function": {
        "name": "chain", "parameters": ref_chain(LIMITS.max_rules)}}],
        "tool_choice": "required"}, "tools", "max_rules"),
    # the inputs that killed the process: a ~700 KB chain of $refs, a ~400 KB chain of rules
    "issue's $ref chain": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "chain", "schema": ref_chain(20_000)}}}, "response_format", "max_rules"),
    "issue's rule chain": ({"guided_grammar": rule_chain(30_000)}, "guided_grammar",
                           "max_bytes"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_limit_is_a_400_naming_it(server: Any, case: str) -> None:
    extra, param, limit = CASES[case]
    r = post(server.url, extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == limit, error
    assert error["type"] == "invalid_request_error" and f"({limit})" in error["message"]
    assert server.engine.wait_idle(10)


def test_the_server_serves_on_after_the_crashers_and_the_deepest_legal_grammar(
        server: Any) -> None:
    for case in ("issue's $ref chain", "issue's rule chain"):
        assert post(server.url, CASES[case][0]).status_code == 400
    # within the limits: a chain that overflows a default thread stack when compiled
    r = post(server.url, {"guided_grammar": rule_chain(LIMITS.max_rules - 2)}, "/v1/completions")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "x"
    assert httpx.get(server.url + "/healthz", timeout=10).json()["engine"] is True
    r = post(server.url, {"guided_choice": ["red", "blue"]})
    assert r.json()["choices"][0]["message"]["content"] in ("red", "blue")
    assert server.engine.wait_idle(10)


def test_n_choices_share_one_compile(server: Any) -> None:
    options = [f"{colour}-{uuid.uuid4().hex[:6]}" for colour in ("red", "green", "blue")]
    before = CACHE.compiles
    r = post(server.url, {"guided_choice": options, "n": 8, "temperature": 1.0, "seed": 3,
                          "max_tokens": 16})
    assert r.status_code == 200, r.text
    assert CACHE.compiles == before + 1
    texts = [c["message"]["content"] for c in r.json()["choices"]]
    assert len(texts) == 8 and set(texts) <= set(options)
    assert server.engine.wait_idle(10)


class SlowCompile:
    """A fault: the next compile waits until released (a big grammar taking its time), and
    says on which thread it ran and whether `lock` was free meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, lock: Any = None) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.thread, self.lock_free, self.lock = "", None, lock
        real = compiler._compile

        def slow(view: Any, grammar: str) -> Any:
            self.thread = threading.current_thread().name
            if self.lock is not None:  # held by whoever waits for this compile?
                self.lock_free = self.lock.acquire(timeout=5)
                if self.lock_free:
                    self.lock.release()
            self.started.set()
            self.release.wait(60)
            return real(view, grammar)

        monkeypatch.setattr(compiler, "_compile", slow)


def healthz_while_compiling(url: str, slow: SlowCompile, path: str = "/v1/completions",
                            model: str = MODEL) -> tuple[float, httpx.Response]:
    """(seconds /healthz took while a compile was held, the constrained request's reply)."""
    replies: list[httpx.Response] = []
    body = {"guided_choice": [f"slow-{uuid.uuid4().hex[:6]}", "fast"]}
    client = threading.Thread(target=lambda: replies.append(post(url, body, path, model)))
    client.start()
    try:
        assert slow.started.wait(60), "the compile never started"
        t0 = time.perf_counter()
        assert httpx.get(url + "/healthz", timeout=30).status_code == 200
        took = time.perf_counter() - t0
        assert client.is_alive()  # the compile was still held while /healthz answered
    finally:
        slow.release.set()
        client.join(120)
    return took, replies[0]


def test_healthz_answers_while_a_grammar_compiles(server: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    slow = SlowCompile(monkeypatch)
    took, reply = healthz_while_compiling(server.url, slow)
    assert took < 2.0, took  # loosely: the held compile would hold it for 60 s
    assert slow.thread.startswith("ferry-grammar")
    assert reply.status_code == 200, reply.text
    assert server.engine.wait_idle(10)


def test_a_model_set_compiles_outside_its_lock(make_models_server: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    models = make_models_server(("alpha",), max_running=4)
    slow = SlowCompile(monkeypatch, models.engine.table.lock)
    took, reply = healthz_while_compiling(models.url, slow, "/v1/chat/completions", "alpha")
    assert slow.lock_free is True and slow.thread.startswith("ferry-grammar")
    assert took < 2.0, took  # loosely: the held compile would hold it for 60 s
    assert reply.status_code == 200, reply.text
    assert models.engine.wait_idle(10)


def test_a_model_loaded_on_demand_uses_the_compile_checked_before(
        make_models_server: Any) -> None:
    models = make_models_server(("alpha", "beta"), max_running=4)
    options = [f"beta-{uuid.uuid4().hex[:6]}", "other"]
    before = CACHE.compiles
    r = post(models.url, {"guided_choice": options, "n": 2, "max_tokens": 16}, model="beta")
    assert r.status_code == 200, r.text
    assert {c["message"]["content"] for c in r.json()["choices"]} <= set(options)
    assert CACHE.compiles == before + 1  # checked before the load, not compiled again after
    assert models.engine.wait_idle(10)

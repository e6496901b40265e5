"""Schemathesis against the served OpenAPI schema (/schema/openapi.json), on a live server
with the real default model: generated requests (valid and invalid) to every documented
operation never get a 5xx, and every answer conforms to the schema (status code, content
type, headers, body).

Bounded: MAX_EXAMPLES per operation and mode, no deadline, generation capped at
max_tokens_limit=8 tokens so replies stay short, and a wall-clock cap per operation.
Half of the valid completion bodies are drawn for the served model in the ranges it
takes, so generation really runs (random bodies only ever get a 404 or a 400).

Checks left out: `positive_data_acceptance` (Ferry refuses some schema-valid bodies on
purpose, with a 400 naming the field: n > 1, penalties, tools, temperature above 2, an
unknown model is a 404), and the stateful/auth checks that need links or credentials.
/dashboard/stream is an endless event stream (one request would never end): it is checked
by hand below instead of by generation.
"""
from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
MAX_EXAMPLES = 25
CAP_SECONDS = 40.0  # per operation, both modes together
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance, negative_data_rejection]
ENDLESS = {("GET", "/dashboard/stream")}


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=4, max_waiting=32, kv_tokens=4096,
                       web={"max_tokens_limit": 8, "default_max_tokens": 8,
                            "max_body_bytes": 64 * 1024, "max_messages": 16})


@pytest.fixture(scope="module")
def schema(server: Any) -> Any:
    return schemathesis.openapi.from_url(server.url + "/schema/openapi.json")


def operations(schema: Any) -> list[Any]:
    ops = [result.ok() for result in schema.get_all_operations()]
    return [op for op in ops if (op.method.upper(), op.path) not in ENDLESS]


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


TEXT = st.text(max_size=40)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": TEXT})
SERVED: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "/v1/chat/completions": {"messages": st.lists(MESSAGE, min_size=1, max_size=3)},
    "/v1/completions": {"prompt": st.one_of(TEXT.filter(str.strip),
                                            st.lists(st.integers(0, 49151), min_size=1,
                                                     max_size=20))},
    # the other APIs' views over the chat path (web/api/compat)
    "/v1/messages": {"messages": st.lists(MESSAGE, min_size=1, max_size=3),
                     "max_tokens": st.integers(1, 9)},
    "/v1/responses": {"input": st.one_of(TEXT, st.lists(MESSAGE, min_size=1, max_size=3))},
    "/api/chat": {"messages": st.lists(MESSAGE, min_size=1, max_size=3)},
    "/api/generate": {"prompt": TEXT},
}


def served_body(required: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Bodies for the served model in the ranges it takes, and a little beyond them (so
    generation runs; edges like max_tokens 0 or 9 and five stop strings get their 400s)."""
    optional = {
        "max_tokens": _maybe(st.integers(0, 9)), "temperature": _maybe(st.floats(0, 2)),
        "top_p": _maybe(st.floats(0, 1, exclude_min=True)), "top_k": _maybe(st.integers(-1, 50)),
        "seed": _maybe(st.integers(0, 2**31)), "stop": _maybe(st.lists(TEXT, max_size=5)),
        "stream": st.booleans(), "ignore_eos": st.booleans(),
        "stream_options": _maybe(st.fixed_dictionaries({"include_usage": st.booleans()})),
    }
    optional = {k: v for k, v in optional.items() if k not in required}
    return st.fixed_dictionaries({"model": st.just(MODEL), **required}, optional=optional)


def run_operation(op: Any, base_url: str, mode: GenerationMode, deadline: float,
                  seen: dict[int, int]) -> None:
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode), data=st.data())
    def check(case: Any, data: st.DataObject) -> None:
        if time.monotonic() > deadline:
            return  # over the time cap: the remaining examples pass without a request
        if (mode is GenerationMode.POSITIVE and op.path in SERVED
                and data.draw(st.booleans(), "served")):
            case.body = data.draw(served_body(SERVED[op.path]), "body")
        response = case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=60)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1

    try:
        check()
    except Unsatisfiable:
        if mode is GenerationMode.POSITIVE:
            raise
        # no parameters or body to make invalid (GET /healthz, GET /v1/models, ...)


def test_every_operation_conforms_and_never_5xx(server: Any, schema: Any,
                                                idle_check: Any) -> None:
    ops = operations(schema)
    labels = {f"{op.method.upper()} {op.path}" for op in ops}
    for needed in ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
                   "GET /v1/requests", "GET /v1/requests/{request_id}",
                   "DELETE /v1/requests/{request_id}", "GET /v1/engine/policy",
                   "POST /v1/engine/policy", "GET /metrics", "GET /healthz"):
        assert needed in labels, f"{needed} is not in the schema"
    figures: dict[str, dict[int, int]] = {}
    started = time.monotonic()
    for op in ops:
        seen: dict[int, int] = {}
        deadline = time.monotonic() + CAP_SECONDS
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run_operation(op, server.url, mode, deadline, seen)
        figures[f"{op.method.upper()} {op.path}"] = seen
    for label, seen in sorted(figures.items()):
        print(f"schemathesis {label}: {dict(sorted(seen.items()))}")
    print(f"schemathesis: {sum(sum(s.values()) for s in figures.values())} requests in "
          f"{time.monotonic() - started:.1f} s")
    chat = figures["POST /v1/chat/completions"]
    assert chat.get(200, 0) > 0, f"no chat completion ever ran: {chat}"
    assert figures["POST /v1/completions"].get(200, 0) > 0
    idle_check(server.engine)


def test_dashboard_stream_is_an_event_stream(server: Any) -> None:
    with httpx.stream("GET", server.url + "/dashboard/stream", timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")

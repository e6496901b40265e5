"""Structured output through the real openai client: parse() with Pydantic models, JSON mode,
a set of JSON schemas checked with a real validator, vLLM's and llama.cpp's field names, and
the 400s for what cannot be compiled. Every constrained reply must parse and validate."""
from __future__ import annotations

import enum
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.tools.json_schemas import SCHEMAS

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=16, kv_tokens=16384)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


class Color(enum.StrEnum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: str = Field(max_length=12)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    favourite: Color
    address: Address
    colours: list[Color] = Field(min_length=1, max_length=2)
    nickname: str | None = Field(default=None, max_length=8)


PROMPTS = [f"Describe a person who lives in {city}, as JSON." for city in (
    "Paris", "Lagos", "Lima", "Oslo", "Tokyo", "Quito", "Perth", "Cairo", "Dakar", "Hanoi",
    "Rome", "Kyiv", "Bern", "Doha", "Riga", "Baku", "Lyon", "Pune", "Kobe", "Nice")]


def parallel(fn: Any, items: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


@pytest.mark.timeout(900)  # 20 replies of ~50 tokens: minutes on a busy 2-core machine
def test_parse_gives_pydantic_instances(client: openai.OpenAI, server: Any) -> None:
    def one(prompt: str) -> Any:
        reply = client.chat.completions.parse(model=MODEL, messages=chat(prompt),
                                              response_format=Person, temperature=0,
                                              max_tokens=160)
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        return reply.choices[0].message.parsed

    people = parallel(one, PROMPTS)
    assert len(people) == 20 and all(isinstance(p, Person) for p in people)
    assert server.engine.wait_idle(30)


def test_json_object_always_loads(client: openai.OpenAI) -> None:
    prompts = ["List three fruits.", "Who are you?", "Give me a recipe.", "Say hi.",
               "What is 2 + 2?", "Name a color."]

    def one(prompt: str) -> Any:
        reply = client.chat.completions.create(
            model=MODEL, messages=chat(prompt + " Answer in JSON."), max_tokens=300,
            response_format={"type": "json_object"}, temperature=0.7, seed=len(prompt))
        assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
        return json.loads(reply.choices[0].message.content or "")

    assert all(isinstance(v, dict) for v in parallel(one, prompts))


@pytest.mark.timeout(900)
def test_schemas_validate(client: openai.OpenAI) -> None:
    assert len(SCHEMAS) >= 30
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER  # RFC 3339 times, not draft 3

    def one(item: tuple[str, dict[str, Any]]) -> tuple[str, Any]:
        name, schema = item
        reply = client.chat.completions.create(
            model=MODEL, messages=chat(f"Answer with JSON for: {name}"), temperature=0,
            max_tokens=200, response_format={"type": "json_schema", "json_schema": {
                "name": name, "schema": schema, "strict": True}})
        assert reply.choices[0].finish_reason == "stop", (name, reply.choices[0])
        return name, json.loads(reply.choices[0].message.content or "")

    for name, value in parallel(one, list(SCHEMAS.items())):
        jsonschema.validate(value, SCHEMAS[name], format_checker=checker)


def test_completions_and_other_field_names(server: Any) -> None:
    url = server.url + "/v1/completions"
    base = {"model": MODEL, "prompt": "The answer is", "max_tokens": 20, "temperature": 0}
    got = httpx.post(url, json={**base, "guided_choice": ["yes", "no"]}, timeout=60).json()
    assert got["choices"][0]["text"] in ("yes", "no")
    got = httpx.post(url, json={**base, "guided_regex": r"[0-9]{3}-[a-z]{2}"},
                     timeout=60).json()
    assert len(got["choices"][0]["text"]) == 6 and got["choices"][0]["text"][3] == "-"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    for field in ("guided_json", "json_schema"):
        got = httpx.post(url, json={**base, field: schema}, timeout=60).json()
        jsonschema.validate(json.loads(got["choices"][0]["text"]), schema)
    r = httpx.post(url, json={**base, "grammar": 'root ::= "A" | "B"'}, timeout=60)
    assert r.json()["choices"][0]["text"] in ("A", "B")
    info = httpx.get(f"{server.url}/v1/requests/{r.headers['x-request-id']}").json()
    assert info["constraint"] == "grammar"
    metrics = httpx.get(server.url + "/metrics").text
    assert 'ferry:structured_requests_total{kind="choice",model_name=' in metrics
    count = next(line for line in metrics.splitlines()
                 if line.startswith("ferry:structured_mask_seconds_count"))
    assert float(count.split()[-1]) > 0


def test_max_tokens_still_ends_with_length(client: openai.OpenAI, server: Any) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=chat("Write a long JSON list of words."), max_tokens=5,
        response_format={"type": "json_object"}, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert server.engine.wait_idle(30)


def test_stream_of_a_constrained_reply(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}}
    chunks = client.chat.completions.create(model=MODEL, messages=chat("ok?"), stream=True,
                                            response_format=fmt, temperature=0)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "if": {}, "then": {}}}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#/$defs/nowhere"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
    ({"grammar": "root ::= ("}, "grammar"),
])
def test_bad_constraints_are_400s_naming_the_field(server: Any, extra: dict[str, Any],
                                                   param: str) -> None:
    body = {"model": MODEL, "messages": chat("Hi"), "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert server.engine.wait_idle(10)


def test_the_dashboard_shows_what_constrains_a_request(server: Any) -> None:
    body = {"model": MODEL, "prompt": "ab", "guided_regex": "(ab){150}", "max_tokens": 300,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(line for line in lines if '"text":"' in line and '"text":""' not in line)
        html = httpx.get(server.url + "/dashboard", timeout=30).text
        rid = r.headers["x-request-id"]
        listed = httpx.get(server.url + "/v1/requests", timeout=30).json()["data"]
    assert 'class="phase constrained"' in html and ">regex</span>" in html
    assert {"id": rid, "constraint": "regex"}.items() <= next(
        d for d in listed if d["id"] == rid).items()
    assert server.engine.wait_idle(30)

"""Simulator input files (docs/architecture.md): parsed and validated, unknown fields refused."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.config import EngineConfig

REQUEST_FIELDS = {"id", "arrive", "prompt", "prompt_ids", "output", "eos_at", "ignore_eos",
                  "cancel_at", "user", "accept", "images"}
TOP_FIELDS = {"engine", "requests", "about"}


class ScenarioError(ValueError):
    """The scenario file is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class SimRequest:
    id: str
    arrive: float
    prompt_ids: tuple[int, ...]
    output: int
    eos_at: int | None = None
    ignore_eos: bool = False
    cancel_at: float | None = None
    user: str = "local"
    # speculative rounds, in order: drafts the target keeps in each (then it stops drafting)
    accept: tuple[int, ...] = ()
    # a vision request's images: (first position, positions, image id, attended as a whole:
    # never split between prefill chunks, rounds its encoder runs ahead of its chunk: 0,
    # inline in the round that reaches it); one id, one image
    images: tuple[tuple[int, int, str, bool, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Scenario:
    engine: EngineConfig
    requests: tuple[SimRequest, ...]


def _number(value: Any, where: str, minimum: float = 0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < minimum:
        raise ScenarioError(f"{where} must be a number >= {minimum}, got {value!r}")
    return float(value)


def _count(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScenarioError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def parse(data: Any, policy: str | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError("a scenario is a JSON object with 'engine' and 'requests'")
    for key in data:
        if key not in TOP_FIELDS:
            raise ScenarioError(f"unknown field {key!r} at top level "
                                f"(known: {', '.join(sorted(TOP_FIELDS))})")
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise ScenarioError("'engine' must be an object")
    known = set(EngineConfig.field_names())
    for key in engine:
        if key not in known:
            raise ScenarioError(f"unknown field {key!r} in 'engine' "
                                f"(known: {', '.join(sorted(known))})")
    if policy is not None:
        engine = {**engine, "policy": policy}
    try:
        config = EngineConfig(**engine)
    except (ValueError, TypeError) as exc:
        raise ScenarioError(f"engine: {exc}") from None
    raw = data.get("requests")
    if not isinstance(raw, list):
        raise ScenarioError("'requests' must be a list")
    seen: set[str] = set()
    requests = [_request(item, i, seen) for i, item in enumerate(raw)]
    return Scenario(config, tuple(requests))


def _request(item: Any, index: int, seen: set[str]) -> SimRequest:
    where = f"requests[{index}]"
    if not isinstance(item, dict):
        raise ScenarioError(f"{where} must be an object")
    for key in item:
        if key not in REQUEST_FIELDS:
            raise ScenarioError(f"unknown field {key!r} in {where} "
                                f"(known: {', '.join(sorted(REQUEST_FIELDS))})")
    rid = item.get("id")
    if not isinstance(rid, str) or not rid:
        raise ScenarioError(f"{where}.id must be a non-empty string")
    if rid in seen:
        raise ScenarioError(f"{where}.id {rid!r} is used twice")
    seen.add(rid)
    where = f"request {rid!r}"
    if ("prompt" in item) == ("prompt_ids" in item):
        raise ScenarioError(f"{where} needs exactly one of 'prompt' (a count) or 'prompt_ids'")
    if "prompt_ids" in item:
        ids = item["prompt_ids"]
        if not isinstance(ids, list) or not ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ScenarioError(f"{where}.prompt_ids must be a non-empty list of token ids >= 0")
        prompt = tuple(ids)
    else:
        n = _count(item["prompt"], f"{where}.prompt")
        base = (index + 1) << 32  # ids unique to this request: counts never share a prefix
        prompt = tuple(range(base, base + n))
    eos_at = item.get("eos_at")
    cancel_at = item.get("cancel_at")
    ignore_eos = item.get("ignore_eos", False)
    user = item.get("user", "local")
    if not isinstance(ignore_eos, bool):
        raise ScenarioError(f"{where}.ignore_eos must be true or false")
    if not isinstance(user, str) or not user:
        raise ScenarioError(f"{where}.user must be a non-empty string")
    accept = item.get("accept", [])
    if not isinstance(accept, list) or not all(
            isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in accept):
        raise ScenarioError(f"{where}.accept must be a list of integers >= 0 (drafts kept "
                            "per speculative round)")
    return SimRequest(
        id=rid, arrive=_number(item.get("arrive", 0), f"{where}.arrive"), prompt_ids=prompt,
        images=_images(item.get("images", []), len(prompt), where, rid),
        output=_count(item.get("output"), f"{where}.output"),
        eos_at=None if eos_at is None else _count(eos_at, f"{where}.eos_at"),
        ignore_eos=ignore_eos,
        cancel_at=None if cancel_at is None else _number(cancel_at, f"{where}.cancel_at"),
        user=user, accept=tuple(accept))


def _images(items: Any, prompt: int, where: str,
            rid: str) -> tuple[tuple[int, int, str, bool, int], ...]:
    """`images`: [{"at": first position, "tokens": positions, "id": optional, "whole":
    optional, "encode": optional}], in order, apart, inside the prompt; the same id is the
    same image (its KV may be shared); `whole`: its positions attend to one another both
    ways (Gemma 3's), so a prefill chunk never splits it; `encode`: rounds its encoder takes,
    run ahead of its chunk a slice a round as a vision model's engine does (0, the default:
    encoded inside the round that reaches it)."""
    if not isinstance(items, list):
        raise ScenarioError(f"{where}.images must be a list of {{at, tokens, id}} objects")
    out: list[tuple[int, int, str, bool, int]] = []
    end = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"at", "tokens", "id", "whole", "encode"} \
                or not isinstance(item.get("whole", False), bool):
            raise ScenarioError(f"{where}.images[{i}] must be an object with at, tokens, id, "
                                "whole (true or false) and encode")
        at = _count(item.get("at"), f"{where}.images[{i}].at", 0)
        tokens = _count(item.get("tokens"), f"{where}.images[{i}].tokens")
        rounds = _count(item.get("encode", 0), f"{where}.images[{i}].encode", 0)
        if at < end or at + tokens > prompt:
            raise ScenarioError(f"{where}.images[{i}] must lie inside the prompt, after the "
                                "image before it")
        out.append((at, tokens, str(item.get("id", f"{rid}#{i}")), item.get("whole", False),
                    rounds))
        end = at + tokens
    return tuple(out)


def load(path: str | Path, policy: str | None = None) -> Scenario:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScenarioError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path} is not valid JSON: {exc}") from None
    return parse(data, policy)

"""Turning OpenAI-style request bodies into prompt ids and SamplingParams, with clear 400s."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from engine import (
    KEEP,
    MAX_LOGPROBS,
    SEED_MAX,
    SEED_MIN,
    LoadRefused,
    QueueFull,
    RequestError,
    SamplingParams,
    Tokenizer,
    UnknownModel,
    parse_keep_alive,
)
from web.access.identity import User
from web.api.errors import APIError, from_engine, unsupported
from web.api.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields, TextPart
from web.config import WebConfig
from web.services import Services

log = logging.getLogger(__name__)

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
MAX_N = 16  # choices per request; each is one engine request, counted by per-user limits


class ModelFields(Protocol):
    """What routing reads of a request: the model it names and its keep_alive."""

    @property
    def model(self) -> str | None: ...

    @property
    def keep_alive(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class ModelAsk:
    """A model named outside a sampling body (e.g. Ollama's "name:tag" made plain)."""

    model: str | None
    keep_alive: Any = None


def check_model(body: ModelFields, model_name: str, known: Sequence[str] = ()) -> None:
    """A 404 unless the body names a model served here (missing or empty: the default):
    `model_name`, or in upstream mode any of `known` (the models the upstreams list)."""
    names = list(known) or [model_name]
    if body.model and body.model not in names:
        raise APIError(f"the model {body.model!r} does not exist; this server serves "
                       f"{', '.join(map(repr, names))}", 404, param="model",
                       code="model_not_found")


def _check_common(body: SamplingFields) -> None:
    if body.n is not None and not 1 <= body.n <= MAX_N:
        raise APIError(f"n must be within [1, {MAX_N}], got {body.n}", param="n")
    if body.seed is not None and not SEED_MIN <= body.seed <= SEED_MAX:
        raise APIError(f"seed must be an integer within [{SEED_MIN}, {SEED_MAX}], got "
                       f"{body.seed}", param="seed")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) not in (None, 0, 0.0):
            raise unsupported(name)
    if body.logit_bias:
        raise unsupported("logit_bias")


def check_chat(body: ChatCompletionRequest, config: WebConfig) -> list[dict[str, Any]]:
    """Validate what only chat completions have; return the messages as template input."""
    _check_common(body)
    if body.top_logprobs is not None:
        if not 0 <= body.top_logprobs <= MAX_LOGPROBS:
            raise APIError(f"top_logprobs must be within [0, {MAX_LOGPROBS}], got "
                           f"{body.top_logprobs}", param="top_logprobs")
        if body.top_logprobs and not body.logprobs:
            raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    if body.functions:
        raise unsupported("functions", "the legacy functions field (use tools)")
    if body.function_call not in (None, "none"):
        raise unsupported("function_call", "the legacy function_call field (use tool_choice)")
    if not body.messages:
        raise APIError("messages must not be empty", param="messages")
    if len(body.messages) > config.max_messages:
        raise APIError(f"too many messages: {len(body.messages)} (at most "
                       f"{config.max_messages})", param="messages")
    out = []
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        role = ROLES.get(message.role)
        if role is None:
            raise unsupported(f"{where}.role", f"role {message.role!r}")
        if message.tool_calls and role != "assistant":
            raise APIError(f"{where}.tool_calls: only assistant messages carry tool calls",
                           param=f"{where}.tool_calls")
        content: Any = message.content
        if isinstance(content, list):
            content = _content_parts(content, where, role)
        entry: dict[str, Any] = {"role": role, "content": content or ""}
        if message.tool_calls:  # web/api/structured/tools.py renders them for the template
            entry["tool_calls"] = message.tool_calls
        if role == "tool" and message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        out.append(entry)
    return out


def _content_parts(parts: list[TextPart], where: str, role: str) -> str | list[dict[str, Any]]:
    """A message's content parts: their text joined, or, with image parts (a user's), the
    parts as template input for web/api/vision."""
    out: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        if part.type == "image_url" and part.image_url is not None and role == "user":
            out.append({"type": "image_url", "image_url": {"url": part.image_url.url,
                                                            "detail": part.image_url.detail}})
        elif part.type == "image_url" and part.image_url is not None:
            raise APIError(f"{where}.content[{j}]: only user messages carry images",
                           param=f"{where}.content[{j}]")
        elif part.type != "text" or part.text is None:
            raise unsupported(f"{where}.content", f"content of type {part.type!r}")
        else:
            out.append({"type": "text", "text": part.text})
    if any(p["type"] == "image_url" for p in out):
        return out
    return "".join(p["text"] for p in out)


def check_completion(body: CompletionRequest, tokenizer: Tokenizer) -> list[int]:
    """Validate what only completions have; return the prompt ids."""
    _check_common(body)
    if body.suffix:
        raise unsupported("suffix")
    if body.best_of not in (None, 1):
        raise unsupported("best_of", "best_of > 1")
    if body.logprobs is not None and not 0 <= body.logprobs <= MAX_LOGPROBS:
        raise APIError(f"logprobs must be within [0, {MAX_LOGPROBS}], got {body.logprobs}",
                       param="logprobs")
    if body.max_tokens == 0 and not body.echo:
        raise APIError("max_tokens 0 is allowed only with echo (to score the prompt)",
                       param="max_tokens")
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) != 1:
            raise unsupported("prompt", "more than one prompt in a request")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                          for t in prompt):
        ids = list(prompt)
        if any(not 0 <= t < tokenizer.vocab_size for t in ids):
            raise APIError("prompt token ids must be within the vocabulary", param="prompt")
    else:
        raise APIError("prompt must be a string, a list of token ids, or a list with one "
                       "of these", param="prompt")
    if not ids:
        raise APIError("the prompt is empty", param="prompt")
    return ids


def logprob_fields(body: SamplingFields) -> tuple[int | None, int | None]:
    """(output logprobs, prompt logprobs) the engine computes for `body`: None = none."""
    if isinstance(body, ChatCompletionRequest):
        return (body.top_logprobs or 0 if body.logprobs else None), None
    assert isinstance(body, CompletionRequest)
    prompt = body.logprobs if body.echo else None
    if body.echo and body.max_tokens == 0 and prompt is None:
        prompt = 0  # a prefill-only request must score something; nothing shows it
    return body.logprobs, prompt


def sampling_params(body: SamplingFields, config: WebConfig, prompt_len: int,
                    context_limit: int, default_max: int, max_tokens: int | None,
                    choice: int = 0) -> SamplingParams:
    """The engine's parameters for choice number `choice` of `body` (choices get seeds
    seed, seed + 1, ... so that n > 1 with a seed gives n different, reproducible samples)."""
    if max_tokens is not None and max_tokens > config.max_tokens_limit:
        raise APIError(f"max_tokens is {max_tokens}, above this server's limit of "
                       f"{config.max_tokens_limit}", param="max_tokens")
    if max_tokens is None:
        room = context_limit - prompt_len
        max_tokens = max(1, min(default_max, config.max_tokens_limit, room))
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > config.max_stop:
        raise APIError(f"at most {config.max_stop} stop sequences are allowed, got {len(stop)}",
                       param="stop")
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    if body.top_k is not None and body.top_k < -1:
        raise APIError(f"top_k must be -1, 0 or positive, got {body.top_k}", param="top_k")
    seed = body.seed
    if seed is not None and choice:
        seed = seed + choice if seed + choice <= SEED_MAX else seed - choice
    logprobs, prompt_logprobs = logprob_fields(body)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else float(body.temperature),
            top_p=1.0 if body.top_p is None else float(body.top_p), top_k=top_k,
            seed=seed, stop=tuple(stop), ignore_eos=body.ignore_eos, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, speculative=body.speculative)
    except RequestError as exc:
        message = str(exc)
        param = next((p for p in ("max_tokens", "temperature", "top_p", "top_k", "stop",
                                  "seed", "logprobs") if message.startswith(p)), None)
        raise APIError(message, param=param) from exc


@asynccontextmanager
async def route_model(s: Services, body: ModelFields, user: User,
                      known: Sequence[str] = ()) -> AsyncIterator[Services]:
    """The services of the model `body` names (several models: its engine, tokenizer and
    chat template; missing or empty: the default); 404 listing the known ones otherwise.
    `known`: upstream mode's models, which the gateway routes itself. With several models
    the request is listed from here on (waiting for its model, if not loaded) until it is
    submitted, or until the block ends without a submit."""
    if s.catalog is None:
        check_model(body, s.config.model_name, known)
        yield s
        return
    keep: object = KEEP
    if body.keep_alive is not None:
        try:
            keep = parse_keep_alive(body.keep_alive)
        except RequestError as exc:
            raise APIError(str(exc), param="keep_alive") from None
    try:
        routed = await anyio.to_thread.run_sync(s.for_model, body.model or None, keep, user)
    except UnknownModel as exc:
        known = ", ".join(repr(n) for n in exc.known)
        raise APIError(f"the model {body.model!r} does not exist; this server serves {known}",
                       404, param="model", code="model_not_found") from None
    except (LoadRefused, QueueFull) as exc:
        raise from_engine(exc, "model") from None
    except Exception:  # its tokenizer does not open (its file gone, say): the server's fault
        name = body.model or s.catalog.default
        log.exception("opening the model %s failed", name)
        raise APIError(f"the model {name} is not available now: its files could not be "
                       "opened", 503, param="model", code="model_unavailable",
                       type="server_error", headers={"Retry-After": "5"}) from None
    try:
        yield routed
    finally:
        routed.leave()

"""Talking to one upstream over HTTP: a streamed completion read as SSE, and aborts.

Every way an upstream can fail becomes an UpstreamError that says what happened and whether
anything was produced, so the gateway can retry elsewhere (nothing produced yet) or keep the
partial reply (cut mid-stream). Garbage is an error at once, never a hang: reads time out
after `stall_timeout` seconds without a byte.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from engine import SamplingParams
from web.gateway.prompt import UpstreamPrompt

MAX_ERROR_BODY = 2000


class UpstreamError(Exception):
    """`retry`: another upstream may serve the request (it produced nothing and the cause is
    the upstream, not the request); `down`: the upstream looks unreachable."""

    def __init__(self, message: str, retry: bool = False, down: bool = False,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.retry = retry
        self.down = down
        self.status = status


@dataclass(frozen=True, slots=True)
class Chunk:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from the final usage chunk
    completion_tokens: int | None = None
    cached_tokens: int = 0
    # (index, name piece, arguments piece) of streamed tool-call deltas
    tool_calls: tuple[tuple[int, str, str], ...] = ()
    reasoning: str = ""  # a thinking model's reasoning_content (vLLM, llama.cpp, Ferry)


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def request_body(prompt: list[int], params: SamplingParams, model: str, kind: str,
                 request_id: str) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the streamed request for this prompt."""
    body: dict[str, Any] = {
        "model": model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": params.max_tokens, "temperature": params.temperature,
        "top_p": params.top_p}
    if params.top_k:
        body["top_k"] = params.top_k
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.ignore_eos:
        body["ignore_eos"] = True
    if kind == "sglang":
        body["rid"] = request_id  # so /abort_request can name it
    if kind == "ferry" and not params.speculative:
        body["speculative"] = False  # drafts turned off at the front stay off (Ferry's field)
    # tools, response_format...: as sent; the model is the gateway's to name (the route)
    body.update({k: v for k, v in (getattr(prompt, "extra", None) or {}).items()
                 if k != "model"})
    if isinstance(prompt, UpstreamPrompt) and prompt.messages is not None:
        messages = list(prompt.messages)
        if prompt.continued:
            messages.append({"role": "assistant", "content": prompt.continued})
            body["add_generation_prompt"] = False
            body["continue_final_message"] = True  # vLLM and SGLang continue the reply
        body["messages"] = messages
        return "/v1/chat/completions", body
    if isinstance(prompt, UpstreamPrompt) and prompt.text is not None:
        body["prompt"] = prompt.text
    else:
        body["prompt"] = list(prompt)  # token ids: the upstream checks them
    return "/v1/completions", body


def error_message(status: int, raw: bytes) -> str:
    """The upstream's own error text (OpenAI `error.message`, FastAPI `detail`, or the body)."""
    text = raw[:MAX_ERROR_BODY].decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300] or f"HTTP {status}"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if data.get("message"):
            return str(data["message"])
        if data.get("detail"):
            return str(data["detail"])
    return text[:300]


def parse_event(data: str, name: str) -> Chunk | None:
    """One `data:` payload of an OpenAI stream -> a Chunk (None for [DONE])."""
    if data == "[DONE]":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        raise UpstreamError(f"{name} sent something that is not an OpenAI stream: "
                            f"{data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise UpstreamError(f"{name} sent an unexpected stream event: {data[:80]!r}")
    if "error" in obj:
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else err
        raise UpstreamError(f"{name} failed: {message}")
    text, reasoning, finish = "", "", None
    calls: list[tuple[int, str, str]] = []
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise UpstreamError(f"{name} sent an unexpected stream event: {data[:80]!r}")
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text += delta.get("content") or ""
            # vLLM, llama.cpp and Ferry say reasoning_content; some servers `reasoning`
            reasoning += delta.get("reasoning_content") or delta.get("reasoning") or ""
            calls.extend(tool_call_pieces(delta.get("tool_calls")))
        elif isinstance(choice.get("text"), str):
            text += choice["text"]
        finish = choice.get("finish_reason") or finish
    usage = obj.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        return Chunk(text, finish, int(usage.get("prompt_tokens") or 0),
                     int(usage.get("completion_tokens") or 0), int(cached or 0), tuple(calls),
                     reasoning)
    return Chunk(text, finish, tool_calls=tuple(calls), reasoning=reasoning)


def tool_call_pieces(deltas: Any) -> list[tuple[int, str, str]]:
    out = []
    for d in deltas if isinstance(deltas, list) else []:
        if not isinstance(d, dict):
            continue
        fn: dict[str, Any] = d["function"] if isinstance(d.get("function"), dict) else {}
        out.append((int(d.get("index") or 0), str(fn.get("name") or ""),
                    str(fn.get("arguments") or "")))
    return out


class ToolCalls:
    """An upstream's streamed tool calls handed on as they come, as the generic format's text
    (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), which the API reads back into
    tool calls like a local reply's: the arguments stream on as the upstream sends them."""

    def __init__(self) -> None:
        self.index: int | None = None  # the call being written
        self.name = ""
        self.started = False  # its block's head and arguments have begun

    def _head(self) -> str:
        self.started = True
        return f'<tool_call>\n{{"name": {json.dumps(self.name)}, "arguments": '

    def add(self, pieces: tuple[tuple[int, str, str], ...]) -> str:
        out = []
        for index, name, arguments in pieces:
            if index != self.index:
                out.append(self.close())
                self.index, self.name, self.started = index, "", False
            self.name += name  # whole by the first arguments piece (OpenAI sends it first)
            if arguments:
                out.append((self._head() if not self.started else "") + arguments)
        return "".join(out)

    def close(self) -> str:
        """The open call's end (arguments `{}` when the upstream sent none)."""
        if self.index is None:
            return ""
        text = "" if self.started else self._head() + "{}"
        self.index = None
        return text + "}\n</tool_call>"


async def stream_chunks(client: httpx.AsyncClient, base: str, name: str, api_key: str | None,
                        path: str, body: dict[str, Any],
                        on_open: Any = None) -> AsyncIterator[Chunk]:
    """POST the request and yield its chunks; `on_open(response)` sees the headers first."""
    produced = False
    try:
        async with client.stream("POST", base + path, json=body,
                                 headers=auth_headers(api_key)) as response:
            if response.status_code != 200:
                raw = await response.aread()
                status = response.status_code
                message = f"{name} answered {status}: {error_message(status, raw)}"
                if status in (401, 403):
                    message = f"{name} refused Ferry's API key ({status})"
                # busy or broken upstreams: another may serve it; the request's own faults not
                raise UpstreamError(message, retry=status in (408, 429) or status >= 500,
                                    status=status)
            kind = response.headers.get("content-type", "")
            if "text/event-stream" not in kind:
                raise UpstreamError(f"{name} did not answer with an event stream "
                                    f"(content-type {kind or 'none'})", retry=True)
            if on_open is not None:
                on_open(response)
            finished = False
            calls = ToolCalls()
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # comments, event names, blank lines
                chunk = parse_event(line[5:].strip(), name)
                text = calls.add(chunk.tool_calls) if chunk is not None else ""
                if chunk is None or chunk.finish_reason:
                    text += calls.close()
                if text:
                    produced = True
                    yield Chunk(text)
                if chunk is None:
                    finished = True
                    break
                produced = produced or bool(chunk.text or chunk.reasoning)
                yield chunk
            if not finished:
                raise UpstreamError(f"{name} closed the stream before the end")
    except httpx.TimeoutException as exc:
        what = "did not answer" if isinstance(exc, httpx.ConnectTimeout) else \
            "stopped sending"
        raise UpstreamError(f"{name} {what} (timed out)", retry=not produced,
                            down=True) from exc
    except httpx.ConnectError as exc:
        raise UpstreamError(f"{name} cannot be reached ({exc or 'connection refused'})",
                            retry=True, down=True) from exc
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        raise UpstreamError(f"{name} dropped the connection ({exc or 'connection lost'})",
                            retry=not produced, down=True) from exc


async def abort(client: httpx.AsyncClient, base: str, kind: str, api_key: str | None,
                request_id: str, upstream_id: str | None) -> None:
    """Free the request on the upstream at once (closing the stream frees it too, later)."""
    try:
        if kind == "ferry" and upstream_id:
            await client.delete(f"{base}/v1/requests/{upstream_id}",
                                headers=auth_headers(api_key), timeout=3)
        elif kind == "sglang":
            await client.post(f"{base}/abort_request", json={"rid": request_id},
                              headers=auth_headers(api_key), timeout=3)
    except (httpx.HTTPError, RuntimeError):  # RuntimeError: the client closed (shutdown)
        pass  # the closed stream still ends it

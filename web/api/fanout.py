"""n choices of one API call: n engine requests, submitted together, read as one stream.

Each choice is its own engine request (its own slot, KV and seed), so per-user limits and the
queue bounds count every one; if one cannot be submitted, those already queued are cancelled.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar import Request

from engine import (
    FinalEvent,
    ImageInput,
    LoadRefused,
    QueueFull,
    Reasoning,
    RequestError,
    RequestHandle,
    SamplingParams,
    TextDelta,
)
from web.access.identity import current_user
from web.api.errors import APIError, from_engine
from web.services import EngineUnavailable, Services
from web.sse import until_disconnect


def submit_all(request: Request[Any, Any, Any], s: Services, prompt_ids: list[int],
               params: list[SamplingParams], param: str,
               reasoning: Reasoning | None = None,
               endpoint: str | None = None,
               images: tuple[ImageInput, ...] = ()) -> list[RequestHandle]:
    """Submit one request per choice, labelled with `endpoint` (default: the route the
    request came through), with a vision model's `images`; all or none (a refusal cancels
    those submitted)."""
    limit = s.config.per_user_limit if s.config.shared else None
    if limit is not None and len(params) > limit:
        # could never fit, however long the client waits: not a retryable 429
        raise APIError(f"n={len(params)} asks for more choices than per_user_limit "
                       f"({limit}) lets one user run at once", param="n")
    handles: list[RequestHandle] = []
    try:
        for p in params:
            handles.append(s.submit(current_user(request), prompt_ids, p, "api",
                                    reasoning=reasoning, images=images,
                                    endpoint=endpoint or request.url.path))
    except (RequestError, QueueFull, EngineUnavailable, LoadRefused) as exc:
        for handle in handles:
            handle.cancel()
        raise from_engine(exc, param) from exc
    return handles


def _retrieve(task: asyncio.Future[None]) -> None:
    """Take a finished watcher's outcome, so that a failure of its receive is not logged as
    never retrieved (the answer was made without it)."""
    if not task.cancelled():
        task.exception()


def cancel_all(handles: list[RequestHandle]) -> None:
    for handle in handles:
        if handle.final is None:
            handle.cancel()


async def merge(handles: list[RequestHandle]) -> AsyncIterator[tuple[int, TextDelta | FinalEvent]]:
    """Every handle's events as they come, tagged with the handle's index (its choice)."""
    if len(handles) == 1:  # one choice (nearly every call): no task and wait per event
        async for event in handles[0]:
            yield 0, event
        return
    iters = [aiter(h) for h in handles]
    pending = {asyncio.ensure_future(anext(it)): i for i, it in enumerate(iters)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=pending.__getitem__):
                i = pending.pop(task)
                try:
                    event = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(iters[i]))] = i
                yield i, event
    finally:
        for task in pending:
            task.cancel()


async def collect_all(request: Request[Any, Any, Any], handles: list[RequestHandle],
                      on_error: Callable[[FinalEvent], APIError]) -> list[FinalEvent]:
    """Run every choice to its end; a client that goes away cancels all of them; a choice
    that fails fails the call (the others are cancelled)."""
    finals: list[FinalEvent | None] = [None] * len(handles)

    async def watch() -> None:
        await until_disconnect(request)
        cancel_all(handles)

    # a bare task, not an anyio task group: cancelling a group's scope formats the task's
    # repr into its reason, a tenth of a millisecond on every answer
    watcher = asyncio.ensure_future(watch())
    try:
        async for i, event in merge(handles):
            if isinstance(event, FinalEvent):
                finals[i] = event
    finally:
        cancel_all(handles)
        watcher.cancel()
        watcher.add_done_callback(_retrieve)
    for final in finals:
        assert final is not None
        if final.finish_reason == "error":
            raise on_error(final)
    return [f for f in finals if f is not None]

"""Work one request asks for that takes a core (tokenizing a long prompt, decoding its images,
reading an imported conversation) runs on anyio's worker threads, each lowered below the
engine's priority before it runs such work (engine.priority): on a machine with few cores the
engine's threads keep the cores, and the request that asked waits, not the others. Each such
job is counted while it runs, and the engine's rounds meanwhile run on one core fewer.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio

from engine.host import job_below, lower_priority

T = TypeVar("T")


async def below_engine(fn: Callable[..., T], *args: object) -> T:
    """fn(*args) on a worker thread below the engine's priority; the event loop goes on."""
    def run() -> T:
        lower_priority()
        with job_below():
            return fn(*args)
    return await anyio.to_thread.run_sync(run)

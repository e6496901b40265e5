"""Work a request asks for runs below the engine's priority, off the event loop."""
from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Any

import pytest

from web.worker import below_engine


def nice_here() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_below_engine_runs_lower_and_off_the_loop() -> None:
    async def main() -> tuple[int, int, int]:
        loop_thread = threading.get_native_id()
        ran_on, nice = await below_engine(lambda: (threading.get_native_id(), nice_here()))
        assert ran_on != loop_thread
        return nice_here(), nice, await below_engine(nice_here)

    loop_nice, worker_nice, again = asyncio.run(main())
    assert worker_nice == min(19, loop_nice + 10)
    assert again == worker_nice  # a worker thread is lowered once, never further


@pytest.mark.model  # make_server opens the default model's tokenizer
def test_the_heap_is_settled_while_serving(make_server: Any, stand_in: Any) -> None:
    """What lives when the server starts stays out of Python's full collections while it
    serves (engine.models.memory.settled_heap), and is collectable again once it stops."""
    import gc

    gc.unfreeze()  # another server of this process may have settled it
    server = make_server(executor=stand_in())
    assert gc.get_freeze_count() > 0
    server.stop()
    assert gc.get_freeze_count() == 0

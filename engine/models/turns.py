"""Fair turns: engines of several models share the CPU one round at a time, in arrival order.

Each engine takes a turn around each busy round (Engine(turns=...)). Turns are handed out
first come, first served (a ticket queue, not a bare lock, which lets the thread that just
released it take it again): when two models have work their rounds alternate, so each gets
half the rounds; a model alone takes every round without waiting.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager


class FairTurns:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()  # tickets waiting, the holder first
        self._next = 0
        self.taken = 0  # turns handed out (tests, the dashboard)

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._cond:
            ticket = self._next
            self._next += 1
            self._queue.append(ticket)
            while self._queue[0] != ticket:
                self._cond.wait()
            self.taken += 1
        try:
            yield
        finally:
            with self._cond:
                self._queue.popleft()
                self._cond.notify_all()

    def __call__(self) -> AbstractContextManager[None]:
        return self.turn()

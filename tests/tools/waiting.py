"""Polling helpers for tests that start real servers or wait for their state."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx


def wait_for(predicate: Any, timeout: float = 30.0, message: str = "condition",
             interval: float = 0.05) -> Any:
    """predicate()'s first truthy value, polled every `interval` s; fails after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {message}"
        time.sleep(interval)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float,
                 name: str, interval: float) -> float:
    """Poll url until it answers 200 while proc lives; the seconds it took. A process that
    exits or never answers fails the test with the tail of its log."""
    started = time.monotonic()
    while True:
        assert proc.poll() is None, f"{name} exited:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < started + timeout, \
            f"{name} did not start:\n{log.read_text()[-4000:]}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(interval)

"""The server processes a benchmark starts: a port for each, and an end that waits."""
from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def end(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Ask `proc` to exit (SIGTERM), then kill it after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

"""Ollama's `keep_alive`: how long a model stays loaded after its last request."""
from __future__ import annotations

import re

from engine.scheduling.request import RequestError

DEFAULT_KEEP_ALIVE = 300.0  # seconds (Ollama's 5m)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_keep_alive(value: object) -> float | None:
    """Seconds as Ollama reads them: a number (seconds) or a duration string ("5m",
    "1h30m", "90s", "0"); negative = forever (None). Raises RequestError when unreadable."""
    if isinstance(value, bool):
        raise RequestError("keep_alive must be seconds or a duration like '5m'")
    if isinstance(value, int | float):
        return None if value < 0 else float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            return None if number < 0 else number
        negative = text.startswith("-")
        body = text.lstrip("-")
        parts = _PART.findall(body)
        if body and "".join(n + u for n, u in parts) == body:
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
            return None if negative else seconds
    raise RequestError(f"keep_alive {value!r} is not seconds or a duration like '5m'")

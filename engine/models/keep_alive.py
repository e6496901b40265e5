"""Ollama's `keep_alive`: how long a model stays loaded after its last request."""
from __future__ import annotations

import math
import re

from engine.scheduling.request import RequestError

DEFAULT_KEEP_ALIVE = 300.0  # seconds (Ollama's 5m)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
# "stay loaded": -1 alone (Ollama's documented forms -1, "-1", "-1m"); any other negative is
# more likely a mistake than a wish, and is refused
_FOREVER = re.compile(r"-1(?:\.0*)?(?:ms|s|m|h)?")
# no duration needs more; a cap keeps the regex scan short (`\d+` rescans from every start
# of a long run of digits that ends in no unit: quadratic in the length)
MAX_TEXT = 64
_ASK = "keep_alive must be seconds (>= 0), a duration like '5m', or -1 (stay loaded)"


def parse_keep_alive(value: object) -> float | None:
    """Seconds as Ollama reads them: a number (seconds) or a duration string ("5m",
    "1h30m", "90s", "0"); -1 = forever (None). Raises RequestError for anything else: NaN,
    infinities, booleans, negatives other than -1, text that does not parse."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RequestError(_ASK)
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_TEXT:
            raise RequestError(f"{_ASK}; got {len(text)} characters (at most {MAX_TEXT})")
        if _FOREVER.fullmatch(text):
            return None
        parts = _PART.findall(text)
        if text and "".join(n + u for n, u in parts) == text:
            return _finite(sum(float(n) * _UNITS[u] for n, u in parts), value)
        try:
            number = float(text)
        except ValueError:
            raise RequestError(f"{_ASK}; got {value[:40]!r}") from None
        return _number(number, value)
    try:
        return _number(float(value), value)
    except OverflowError:  # an integer too large for a float
        raise RequestError(f"{_ASK}; got a number out of range") from None


def _number(number: float, value: object) -> float | None:
    if number == -1:
        return None
    if number < 0:
        raise RequestError(f"{_ASK}; got {number:g}")
    return _finite(number, value)


def _finite(seconds: float, value: object) -> float:
    if not math.isfinite(seconds):
        raise RequestError(f"{_ASK}; got {str(value)[:40]!r}")
    return seconds + 0.0  # -0 reads as 0

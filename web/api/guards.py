"""Checks on a request body before it is decoded: a nesting-depth guard for JSON.

msgspec decodes nested arrays and objects recursively; 100,000 `[` in a row exhaust Python's
recursion limit inside it and would end as a 500. The guard answers a clear 400 first.

The guard runs on the event loop for every API body (up to the body limit), so it is linear
in the body and runs in C: escapes dropped by bytes.replace, then numpy marks what lies inside
strings and sums the brackets outside. (A regex for strings with escapes inside retries at
every quote of a body of escaped quotes: quadratic, seconds for 30 KB.)
"""
from __future__ import annotations

from typing import Any

import numpy as np
from litestar import Request

from web.api.errors import APIError

MAX_JSON_DEPTH = 64  # the deepest valid OpenAI body is ~6 levels (messages[].content[])
QUOTE = ord('"')
_STEP = np.zeros(256, dtype=np.int8)  # byte -> how it changes the depth
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in `body` (JSON text, valid or not);
    brackets inside strings don't count."""
    # escaped backslashes first (pairs, left to right, as JSON reads them), then escaped
    # quotes: every quote left opens or closes a string
    text = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    codes = np.frombuffer(text, dtype=np.uint8)
    in_string = np.bitwise_xor.accumulate(codes == QUOTE)  # True from an opening quote on
    steps = np.where(in_string, 0, _STEP[codes])
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


async def json_depth_guard(request: Request[Any, Any, Any]) -> None:
    """before_request hook: refuse JSON bodies nested deeper than MAX_JSON_DEPTH."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    body = await request.body()  # cached: the handler's decoding reads the same bytes
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return
    depth = json_depth(body)
    if depth > MAX_JSON_DEPTH:
        raise APIError(f"the request body nests arrays and objects {depth} levels deep; at "
                       f"most {MAX_JSON_DEPTH} are allowed", code="too_deep")

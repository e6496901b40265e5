"""Checks on a request body before it is decoded: a nesting-depth guard for JSON.

msgspec decodes nested arrays and objects recursively; 100,000 `[` in a row exhaust Python's
recursion limit inside it and would end as a 500. The guard answers a clear 400 first.
"""
from __future__ import annotations

import re
from itertools import accumulate
from typing import Any

from litestar import Request

from web.api.errors import APIError

MAX_JSON_DEPTH = 64  # the deepest valid OpenAI body is ~6 levels (messages[].content[])
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # brackets inside strings don't count
_NOT_BRACKETS = re.compile(rb"[^\[\]{}]")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in `body` (JSON text, valid or not)."""
    brackets = _NOT_BRACKETS.sub(b"", _STRINGS.sub(b"", body))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


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

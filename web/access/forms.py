"""One field of a form body (url-encoded or multipart), found without decoding the rest.

The auth middleware reads the CSRF token of a plain form on the event loop, before any
route, from bodies up to the body limit that anyone may send. So every step here is a
bytes.find over a part of the body no other step looks at (linear, in C), and the Python-level
loops are bounded by MAX_PARTS and MAX_HEADER_BYTES: no body makes it take longer than a few
passes over its bytes.
"""
from __future__ import annotations

from urllib.parse import unquote_plus

MAX_PARTS = 1000  # multipart parts looked at (Litestar's own form parser allows as many)
MAX_HEADER_BYTES = 8192  # a part's headers; a longer block is not a form field
MAX_PARAMS = 8  # parameters of one header looked at (form-data; name=..; filename=..)
DISPOSITION = b"\r\ncontent-disposition:"


def form_field(content_type: str, body: bytes, name: str) -> str | None:
    """The first value of field `name` in a url-encoded or multipart body, else None."""
    kind, _, params = content_type.partition(";")
    kind = kind.strip().lower()
    if kind == "application/x-www-form-urlencoded":
        return urlencoded_field(body, name)
    if kind == "multipart/form-data":
        boundary = _param(params, "boundary")
        if not boundary:
            return None
        value = multipart_field(body, boundary.encode("latin-1"), name)
        return value.decode("latin-1") if value is not None else None
    return None


def urlencoded_field(body: bytes, name: str) -> str | None:
    """`name=value` at the start of the body or after an `&`, decoded as parse_qs would."""
    key = b"&" + name.encode() + b"="
    start = (b"&" + body).find(key)
    if start < 0:
        return None
    start += len(key) - 1  # in body: (b"&" + body) is one byte longer
    end = body.find(b"&", start)
    return unquote_plus(body[start:end if end >= 0 else len(body)].decode("latin-1"))


def multipart_field(body: bytes, boundary: bytes, name: str) -> bytes | None:
    """The content of the first part named `name` (RFC 7578), else None."""
    delimiter = b"--" + boundary
    pos = body.find(delimiter)  # anything before the first delimiter is a preamble
    for _ in range(MAX_PARTS):
        if pos < 0:
            return None
        start = pos + len(delimiter)
        if body.startswith(b"--", start):
            return None  # the close delimiter
        following = body.find(b"\r\n" + delimiter, start)
        end = following if following >= 0 else len(body)
        head_end = body.find(b"\r\n\r\n", start, min(end, start + MAX_HEADER_BYTES))
        if head_end >= 0 and _part_name(body[start:head_end]) == name:
            return body[head_end + 4:end]
        pos = following + 2 if following >= 0 else -1
    return None


def _part_name(headers: bytes) -> str | None:
    """The `name` parameter of a part's Content-Disposition header."""
    raw = b"\r\n" + headers
    at = raw.lower().find(DISPOSITION)
    if at < 0:
        return None
    line_end = raw.find(b"\r\n", at + len(DISPOSITION))
    line = raw[at + len(DISPOSITION):line_end if line_end >= 0 else len(raw)]
    return _param(line.decode("latin-1").partition(";")[2], "name")


def _param(params: str, key: str) -> str | None:
    """A parameter of a header value's `; k=v; k2="v2"` tail (the tail after the first `;`)."""
    for item in params.split(";")[:MAX_PARAMS]:
        k, sep, v = item.partition("=")
        if sep and k.strip().lower() == key:
            return v.strip().strip('"')
    return None

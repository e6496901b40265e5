"""Reading tool calls out of a reply, whole or as it streams.

`ToolStream.push(text)` returns the pieces that are settled: content text; in `<tool_call>`
blocks, a call's start (`CallStart`, once its name is read and is one of the request's tools)
then its arguments as the model writes them (`ArgsPiece`s, cut where the JSON so far can be
closed: web/api/structured/call_scan.py); or whole calls (`ParsedCall`: the prefix formats,
and blocks whose name comes after the arguments or that only parse leniently). Text that may
still become a call is held back. Parsing is lenient (a missing closing brace, text after the
JSON), but a call is only ever returned with arguments that are valid JSON and a name among
the request's tools; anything else stays content, as the model wrote it. A whole reply reads
through the same stream (`parse_reply`), so a streamed call joins into exactly the whole one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from web.api.structured.call_scan import CallScanner
from web.api.structured.formats import CLOSE, OPEN, ToolFormat

PYTHON_TAG, MISTRAL = "<|python_tag|>", "[TOOL_CALLS]"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True, slots=True)
class CallStart:
    name: str  # a call begins: its arguments follow as ArgsPieces


@dataclass(frozen=True, slots=True)
class ArgsPiece:
    text: str  # the next piece of the current call's arguments


Piece = str | ParsedCall | CallStart | ArgsPiece


def loads_lenient(text: str) -> Any | None:
    """json.loads, else once more without trailing text or with the missing closers added."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        value, _ = json.JSONDecoder().raw_decode(text)  # trailing text after the JSON
        return value
    except ValueError:
        pass
    closers = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped = not escaped and ch == "\\"
            if ch == '"' and not escaped:
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]" and closers:
            closers.pop()
    if in_string or not closers:
        return None
    try:
        return json.loads(text + "".join(reversed(closers)))
    except ValueError:
        return None


def _call(obj: Any, fmt: ToolFormat, names: frozenset[str]) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if obj["name"] not in names:
        return None
    args = obj.get(fmt.args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as JSON text
        args = loads_lenient(args)
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_calls(body: str, fmt: ToolFormat, names: frozenset[str]) -> list[ParsedCall] | None:
    """The calls in one block's text (a JSON object, or a list for mistral); None if it is not
    a valid call."""
    value = loads_lenient(body)
    if value is None and fmt.name == "llama3" and ";" in body:
        value = [loads_lenient(part) for part in body.split(";")]
    if value is None and fmt.name == "mistral" and "[ARGS]" in body:  # name[ARGS]{...}
        name, _, args = body.partition("[ARGS]")
        value = {"name": name.strip(), "arguments": loads_lenient(args)}
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, fmt, names) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ToolStream:
    def __init__(self, fmt: ToolFormat, names: frozenset[str]) -> None:
        self.fmt = fmt
        self.names = names
        self._buf = ""
        self._inside = False  # marker formats: inside a <tool_call> block
        self._scan = CallScanner(fmt.args_key)  # the open block's JSON
        self._sent: int | None = None  # its arguments' end sent so far (None: no CallStart)
        self._mode = "undecided"  # prefix formats: undecided | content | calls

    def push(self, text: str) -> list[Piece]:
        self._buf += text
        if self.fmt.name in ("llama3", "mistral"):
            return self._push_prefixed()
        return self._push_marked()

    def _push_marked(self) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if not self._inside:
                i = self._buf.find(OPEN)
                if i < 0:
                    keep = _held_prefix(self._buf, OPEN)
                    out.append(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                out.append(self._buf[:i])
                self._buf, self._inside = self._buf[i + len(OPEN):], True
            j = self._buf.find(CLOSE)
            if j < 0:  # the block goes on: read what cannot be the closing tag
                keep = _held_prefix(self._buf, CLOSE)
                self._scan.push(self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                out.extend(self._args())
                break
            self._scan.push(self._buf[:j])
            self._buf, self._inside = self._buf[j + len(CLOSE):], False
            out.extend(self._end_block(CLOSE))
        return [p for p in out if p != ""]

    def _args(self) -> list[Piece]:
        """The open block's call start and arguments up to the scanner's frontier."""
        scan = self._scan
        out: list[Piece] = []
        if self._sent is None:
            if scan.name not in self.names or scan.args_start is None:
                return []
            out.append(CallStart(scan.name))
            self._sent = scan.args_start
        if scan.frontier > self._sent:
            out.append(ArgsPiece(scan.text[self._sent:scan.frontier]))
            self._sent = scan.frontier
        return out

    def _end_block(self, close: str) -> list[Piece]:
        """A block ends (its closing tag, or the reply): the streamed call's last piece (the
        closers its arguments still need), else the block read whole, leniently."""
        out = self._args()
        scan, sent = self._scan, self._sent
        self._scan, self._sent = CallScanner(self.fmt.args_key), None
        if sent is not None:
            return out + ([ArgsPiece(scan.closers)] if scan.closers else [])
        calls = parse_calls(scan.text, self.fmt, self.names)
        return list(calls) if calls is not None else [OPEN + scan.text + close]

    def _markers(self) -> tuple[str, ...]:
        return (PYTHON_TAG, "{") if self.fmt.name == "llama3" else (MISTRAL,)

    def _push_prefixed(self) -> list[Piece]:
        if self._mode == "undecided":
            head = self._buf.lstrip()
            if not head:
                return []
            if any(head.startswith(m) for m in self._markers()):
                self._mode = "calls"
            elif any(m.startswith(head) for m in self._markers()):
                return []  # could still be a marker
            else:
                self._mode = "content"
        if self._mode == "calls":
            return []
        out, self._buf = self._buf, ""
        return [out] if out else []

    def flush(self) -> list[Piece]:
        """What is left at the end of the reply: an unclosed call if it parses, else text."""
        rest, self._buf = self._buf, ""
        if self.fmt.name in ("llama3", "mistral"):
            if self._mode != "calls":
                return [rest] if rest else []
            body = rest.lstrip()
            for marker in self._markers()[:1]:
                body = body.removeprefix(marker)
            calls = parse_calls(body, self.fmt, self.names)
            return list(calls) if calls is not None else [rest]
        if self._inside:
            self._inside = False
            held = _held_prefix(rest, CLOSE)
            self._scan.push(rest[:len(rest) - held])
            return [p for p in self._end_block(rest[len(rest) - held:]) if p != ""]
        return [rest] if rest else []


def assemble(pieces: list[Piece]) -> tuple[str, list[ParsedCall]]:
    """Pieces -> (the content text, the calls), as a client joins a stream's deltas."""
    content, calls = [], []
    for p in pieces:
        if isinstance(p, str):
            content.append(p)
        elif isinstance(p, ParsedCall):
            calls.append(p)
        elif isinstance(p, CallStart):
            calls.append(ParsedCall(p.name, ""))
        else:
            calls[-1] = ParsedCall(calls[-1].name, calls[-1].arguments + p.text)
    return "".join(content), calls


def parse_reply(text: str, fmt: ToolFormat, names: frozenset[str]) -> tuple[str, list[ParsedCall]]:
    """A whole reply -> (its content text, its calls)."""
    stream = ToolStream(fmt, names)
    return assemble(stream.push(text) + stream.flush())

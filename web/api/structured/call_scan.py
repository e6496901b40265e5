"""One tool call's JSON (`{"name": ..., "arguments": {...}}`) read a character at a time, so
its arguments can stream as the model writes them.

The scanner checks the JSON as it goes and keeps a frontier inside the arguments: the last
point where the text so far can be closed into valid JSON by appending closers (a quote for
an open string value, then `]`/`}` for the open containers). Points after a `,` or `:`, inside
a key, a number, a literal or an escape are not frontiers. Only text up to the frontier is
ever sent, so the arguments a client puts together always parse: the model's text up to the
frontier, then the closers its end needs (none when it closed them itself). The result
depends only on the text, never on how it was split into pushes.
"""
from __future__ import annotations

import json
import re

ARGS_KEYS = ("arguments", "parameters")
NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
LITERALS = ("true", "false", "null")
CLOSER = {"{": "}", "[": "]"}


class CallScanner:
    def __init__(self, args_key: str = "arguments") -> None:
        self.keys = (args_key, *ARGS_KEYS)
        self.text = ""
        self.name: str | None = None
        self.args_start: int | None = None  # index of the arguments' `{`
        self.args_done = False
        self.broken = False  # not JSON: the scan stopped
        self.frontier = 0  # text[args_start:frontier] + closers is valid JSON
        self.closers = ""
        self._stack: list[str] = []
        self._expect = "value"  # value | key | colon | next (`,` or a closer)
        self._first = False  # just after an opener: a closer may come at once
        self._string: list[str] | None = None  # the open string's characters
        self._is_key = False
        self._escape = ""  # the escape read so far (`\`, `\u12`...)
        self._token = ""  # an open number or literal
        self._key: str | None = None  # the outer object's key being read
        self._base = 0  # stack depth inside the arguments object

    @property
    def in_args(self) -> bool:
        return self.args_start is not None and not self.args_done

    def args(self) -> str:
        """The arguments so far as sendable JSON text: up to the frontier, then closers."""
        assert self.args_start is not None
        return self.text[self.args_start:self.frontier] + self.closers

    def push(self, text: str) -> None:
        for ch in text:
            if self.broken:
                self.text += ch
                continue
            self._char(ch)
            self.text += ch
            if not self.broken and self.in_args:
                self._mark(len(self.text))

    # -- the JSON checker ---------------------------------------------------------------
    def _char(self, ch: str) -> None:
        if self._string is not None:
            self._in_string(ch)
            return
        if self._token:
            if ch.isalnum() or ch in "+-.":
                self._token += ch
                return
            token, self._token = self._token, ""
            if not (NUMBER.fullmatch(token) or token in LITERALS):
                self.broken = True
                return
            self._value_done()
            if self.in_args:
                self._mark(len(self.text))  # the number or literal ended just before `ch`
        if ch in " \t\r\n":
            return
        first, self._first = self._first, False
        if self._expect == "done":
            self.broken = True  # text after the call's object
        elif self._expect == "value":
            self._value(ch, first)
        elif self._expect == "key":
            if ch == '"':
                self._string, self._is_key = [], True
            elif ch == "}" and first:
                self._close(ch)
            else:
                self.broken = True
        elif self._expect == "colon":
            if ch == ":":
                self._expect = "value"
            else:
                self.broken = True
        elif ch == ",":
            self._expect = "key" if self._stack[-1] == "{" else "value"
        elif ch in "]}":
            self._close(ch)
        else:
            self.broken = True

    def _value(self, ch: str, first: bool) -> None:
        if ch in "{[":
            depth = len(self._stack)
            if depth == 1 and self._key in self.keys and self.args_start is None and ch == "{":
                self.args_start, self._base = len(self.text), depth + 1
            self._stack.append(ch)
            self._expect, self._first = ("key" if ch == "{" else "value"), True
        elif ch == '"':
            self._string, self._is_key = [], False
        elif ch == "-" or ch.isdigit() or ch in "tfn":
            self._token = ch
        elif ch == "]" and first:
            self._close(ch)
        else:
            self.broken = True

    def _close(self, ch: str) -> None:
        if not self._stack or CLOSER[self._stack[-1]] != ch:
            self.broken = True
            return
        self._stack.pop()
        if self.args_start is not None and not self.args_done and \
                len(self._stack) < self._base:
            self.args_done = True
            self.frontier, self.closers = len(self.text) + 1, ""
        self._value_done()

    def _in_string(self, ch: str) -> None:
        assert self._string is not None
        if self._escape:
            self._escape += ch
            if self._escape[1] == "u":
                if len(self._escape) > 2 and ch not in "0123456789abcdefABCDEF":
                    self.broken = True
                if len(self._escape) < 6:
                    return
            elif ch not in '"\\/bfnrt':
                self.broken = True
                return
            self._string.append(self._escape)
            self._escape = ""
        elif ch == "\\":
            self._escape = ch
        elif ch == '"':
            raw = '"' + "".join(self._string) + '"'
            self._string = None
            if self._is_key:
                if len(self._stack) == 1:
                    self._key = json.loads(raw)
                self._expect = "colon"
            else:
                if len(self._stack) == 1 and self._key == "name" and self.name is None:
                    self.name = json.loads(raw)
                self._value_done()
        elif ord(ch) < 0x20:
            self.broken = True
        else:
            self._string.append(ch)

    def _value_done(self) -> None:
        self._expect = "next" if self._stack else "done"

    # -- the frontier --------------------------------------------------------------------
    def _mark(self, end: int) -> None:
        """After the character ending at `end`: is this a point the arguments can stop at?"""
        inner = self._stack[self._base - 1:]
        closers = "".join(CLOSER[c] for c in reversed(inner))
        if self._string is not None:
            if not self._is_key and not self._escape:
                self.frontier, self.closers = end, '"' + closers
        elif not self._token and (self._expect == "next" or self._first):
            # after a whole value, or just after an opener
            self.frontier, self.closers = end, closers

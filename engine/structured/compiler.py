"""Grammars to matchers: llguidance's tokenizer view built once per tokenizer, each distinct
grammar compiled once, a cheap copy of it per request.

Every compile runs on engine.structured.threads (large stack), never on the caller's thread:
callers are web worker threads (the API checks a constraint before queueing it) or, for a
constraint nobody checked, Engine.submit. `compile` returns the constraint carrying its
compiled matcher, so that submitting it (n choices: n copies) compiles nothing again. A
grammar llguidance cannot compile, or a schema keyword it does not implement, is a
RequestError whose message says why (the API turns it into a 400 naming the field).
"""
from __future__ import annotations

import copy
import dataclasses
import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from engine.scheduling.constraint import Constraint
from engine.scheduling.request import RequestError
from engine.structured.limits import parser_limits
from engine.structured.threads import THREADS

CACHED = 64  # distinct grammars kept compiled (least recently used dropped first)


@dataclasses.dataclass(frozen=True, slots=True)
class Compiled:
    view: Any  # the llguidance tokenizer view it was compiled for
    matcher: Any  # the compiled LLMatcher, never advanced: requests get copies
    error: str = ""  # why it does not compile (then `matcher` is None)


class GrammarCompiler:
    def __init__(self, hf_tokenizer: Any, vocab_size: int | None = None) -> None:
        """`hf_tokenizer`: a fast Hugging Face tokenizer; `vocab_size`: the width of the
        model's logits (ids past the tokenizer's own vocabulary are never allowed)."""
        self.tokenizer = _view(hf_tokenizer, vocab_size)
        self.vocab_size = int(self.tokenizer.vocab_size)

    def compile(self, constraint: Constraint) -> Constraint:
        """`constraint` carrying its compiled matcher (compiled at most once per grammar and
        tokenizer while cached); RequestError when it does not compile."""
        if _usable(constraint, self.tokenizer):
            return constraint
        return dataclasses.replace(constraint, compiled=CACHE.get(self.tokenizer, constraint))

    def check(self, constraint: Constraint) -> Constraint:
        """Raise RequestError when `constraint` does not compile; else it, compiled."""
        return self.compile(constraint)

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh llguidance LLMatcher for one request (a copy of the compiled one)."""
        compiled = self.compile(constraint).compiled
        assert isinstance(compiled, Compiled) and compiled.matcher is not None
        return compiled.matcher.deep_copy()


class Cache:
    """Compiled grammars by (tokenizer view, grammar text); one compile per key at a time
    (a second asker waits for the first), errors kept too (a refused grammar costs once).
    Each entry holds its view, so the id in its key is not reused while it is kept."""

    def __init__(self, size: int = CACHED) -> None:
        self.size = size
        self.compiles = 0  # how many compiles ran (tests and metrics read it)
        self._done: OrderedDict[tuple[int, str], Compiled] = OrderedDict()
        self._running: dict[tuple[int, str], Future[Compiled]] = {}
        self._lock = threading.Lock()

    def get(self, view: Any, constraint: Constraint) -> Compiled:
        key = (id(view), constraint.grammar)
        with self._lock:
            found = self._done.get(key)
            if found is not None:
                self._done.move_to_end(key)
            running = self._running.get(key)
            mine = found is None and running is None
            if mine:
                running = self._running[key] = Future()
        if found is None:
            assert running is not None
            found = self._compile(key, view, constraint.grammar, running) if mine \
                else running.result()
        if found.error:
            raise RequestError(f"the {describe(constraint)} cannot be used: {found.error}")
        return found

    def _compile(self, key: tuple[int, str], view: Any, grammar: str,
                 running: Future[Compiled]) -> Compiled:
        try:
            found = THREADS.run(lambda: _compile(view, grammar))
        except BaseException as exc:
            running.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._running.pop(key, None)
                self.compiles += 1
        with self._lock:
            self._done[key] = found
            while len(self._done) > self.size:
                self._done.popitem(last=False)
        running.set_result(found)
        return found


CACHE = Cache()
_views: weakref.WeakKeyDictionary[Any, dict[int | None, Any]] = weakref.WeakKeyDictionary()
_views_lock = threading.Lock()


def _view(hf_tokenizer: Any, vocab_size: int | None) -> Any:
    """llguidance's view of a tokenizer, one per tokenizer and vocabulary width (built in
    about a second): every compiler of one model shares it, and so its compiled grammars.
    Built from the Rust tokenizer's JSON as llguidance.hf builds it, without that module's
    import of transformers (a plain tokenizer serves without it)."""
    from llguidance import LLTokenizer

    with _views_lock:
        views = _views.setdefault(hf_tokenizer, {})
        if vocab_size not in views:
            backend = copy.copy(hf_tokenizer.backend_tokenizer)
            backend.no_padding()
            backend.no_truncation()
            view = LLTokenizer(backend.to_str(), n_vocab=vocab_size,
                               eos_token=hf_tokenizer.eos_token_id)
            width = int(view.vocab_size)
            views[vocab_size] = views.setdefault(width, view)
        return views[vocab_size]


def _usable(constraint: Constraint, view: Any) -> bool:
    compiled = constraint.compiled
    return isinstance(compiled, Compiled) and compiled.view is view


def _compile(view: Any, grammar: str) -> Compiled:
    """On a compile thread: the compiled matcher, or llguidance's reason it is not one."""
    import llguidance

    matcher = llguidance.LLMatcher(view, grammar, log_level=0, limits=parser_limits())
    if matcher.is_error():
        return Compiled(view, None, clean(matcher.get_error()) or "it does not compile")
    return Compiled(view, matcher)


def describe(constraint: Constraint) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object grammar",
            "regex": "regular expression", "choice": "choice list", "grammar": "grammar",
            "tool_call": "tool's parameter schema"}[constraint.kind]


def clean(error: str) -> str:
    """llguidance's message, without its internal prefixes."""
    text = error.strip()
    for prefix in ("Error building parser: ", "Error: "):
        text = text.removeprefix(prefix)
    return text[:500]

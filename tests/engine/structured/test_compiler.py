"""Compiling with the default model's tokenizer: each distinct grammar once (concurrent askers
wait for the one compile), always on a compile thread, refusals cached too; a request's matcher
is a copy of the compiled one; the deepest grammars the limits allow compile without
overflowing the stack (in a child process: an overflow kills the process it happens in)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine import Constraint, RequestError, structured
from engine.structured import compiler
from engine.structured.compiler import CACHE, GrammarCompiler

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def grammars(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer.hf)


@pytest.fixture
def compile_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each compile ran on."""
    names: list[str] = []
    real = compiler._compile

    def recording(view: Any, grammar: str) -> Any:
        names.append(threading.current_thread().name)
        return real(view, grammar)

    monkeypatch.setattr(compiler, "_compile", recording)
    return names


def unique_choice() -> Constraint:
    return structured.choice([f"yes-{uuid.uuid4().hex[:8]}", "no"])


def test_one_compile_per_grammar(grammars: GrammarCompiler, compile_threads: list[str],
                                 tokenizer: Any) -> None:
    constraint = unique_choice()
    with ThreadPoolExecutor(4) as pool:
        compiled = list(pool.map(grammars.compile, [constraint] * 4))
    assert len(compile_threads) == 1 and compile_threads[0].startswith("ferry-grammar")
    assert grammars.compile(constraint).compiled is compiled[0].compiled  # cached
    assert len(compile_threads) == 1
    # another compiler of the same tokenizer (a model set's, before the model is loaded)
    # shares the compiled grammars
    again = GrammarCompiler(tokenizer.hf)
    assert again.tokenizer is grammars.tokenizer
    again.compile(constraint)
    assert len(compile_threads) == 1


def test_requests_get_copies_not_compiles(grammars: GrammarCompiler,
                                          compile_threads: list[str]) -> None:
    constraint = grammars.compile(unique_choice())
    before, compile_threads[:] = CACHE.compiles, []
    CACHE._done.clear()  # evicted meanwhile: the constraint still carries its compile
    first, second = grammars.matcher(constraint), grammars.matcher(constraint)
    assert CACHE.compiles == before and not compile_threads
    token = grammars.tokenizer.tokenize_str("no")[0]
    first.consume_token(token)  # the copies advance on their own
    assert second.validate_tokens([token]) == 1 and not second.is_error()
    # a constraint nobody compiled is compiled when it is submitted, on a compile thread
    grammars.matcher(unique_choice())
    assert len(compile_threads) == 1 and compile_threads[0].startswith("ferry-grammar")


def test_a_refusal_is_compiled_once(grammars: GrammarCompiler,
                                    compile_threads: list[str]) -> None:
    bad = structured.regex(f"(unclosed-{uuid.uuid4().hex}")
    for _ in range(2):
        with pytest.raises(RequestError, match="regular expression cannot be used"):
            grammars.compile(bad)
    assert len(compile_threads) == 1


DEEPEST = """
import sys
from engine.execution.text.tokenizer import Tokenizer
from engine import structured
from engine.structured.compiler import GrammarCompiler
from engine.structured.limits import LIMITS
from tests.tools.grammar_chains import ref_chain, rule_chain

grammars = GrammarCompiler(Tokenizer(sys.argv[1]).hf)
for constraint in (structured.lark(rule_chain(LIMITS.max_rules - 2)),
                   structured.json_schema(ref_chain(LIMITS.max_rules - 1))):
    matcher = grammars.matcher(constraint)
    assert not matcher.is_error(), matcher.get_error()
print("compiled both")
"""


def test_the_deepest_grammars_the_limits_allow_compile(model_dir: Path) -> None:
    # chains of 4,000 links: the default 8 MB thread stack overflows near 3,000
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", DEEPEST, str(model_dir)], cwd=root,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "compiled both" in done.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_compiles_run_below_the_engines_priority() -> None:
    """A compile yields the cores to the engine's threads: its thread's nice value is the
    process's plus ten (at most 19)."""
    from engine.structured.threads import THREADS

    def nice_here() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    base = nice_here()
    assert THREADS.run(nice_here) == min(19, base + 10)
    assert THREADS.run(nice_here) == min(19, base + 10)  # lowered once, not again
    assert nice_here() == base  # the caller's own is untouched


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_a_thread_started_by_a_lowered_one_is_not_lowered_twice() -> None:
    """Threads inherit their creator's nice value: a compile thread first started from a
    lowered worker (a tokenizing one) sits at the process's plus ten, not plus twenty."""
    from engine.priority import NICE, lower_priority

    def nice_here() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def lowered_then_spawns() -> None:
        lower_priority()
        got.append(nice_here())
        child = threading.Thread(target=lambda: (lower_priority(), got.append(nice_here())))
        child.start()
        child.join()

    base = nice_here()
    got: list[int] = []
    worker = threading.Thread(target=lowered_then_spawns)
    worker.start()
    worker.join()
    assert got == [min(19, base + NICE)] * 2

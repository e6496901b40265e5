"""`ferry bench --profile`'s sampler: samples are filed under the innermost frame of a known
part of Ferry, C time under its Python caller, a waiting thread as idle."""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from app.bench.profile import IDLE, MOE, OTHER, StackSampler, part_of
from engine.scheduling.prefix_cache import PrefixCache


def sampled(body: Callable[[threading.Event], object], seconds: float) -> StackSampler:
    """A StackSampler's counts over a thread running body(stop) for `seconds`."""
    stop = threading.Event()
    worker = threading.Thread(target=body, args=(stop,), name="profiled", daemon=True)
    worker.start()
    try:
        with StackSampler("profiled", interval=0.001) as sampler:
            time.sleep(seconds)
    finally:
        stop.set()
        worker.join()
    return sampler


def test_a_running_thread_is_filed_by_its_innermost_known_frame() -> None:
    # The work loops inside engine/scheduling/ (a 4096-page prefix match per call), so the
    # GIL hand-offs that let the sampler in fall mostly there, not on this file's loop.
    cache = PrefixCache(page_size=1)
    tokens = list(range(4096))
    cache.insert(tokens, tokens, cache.root, free_page=lambda page: None)

    def work(stop: threading.Event) -> None:
        while not stop.is_set():
            cache.match(tokens, len(tokens))

    sampler = sampled(work, 0.3)
    top = sampler.breakdown()[0]
    assert top[0] == "scheduling" and top[1] > 0.5, sampler.counts


def test_a_waiting_thread_is_idle_and_unknown_code_is_other() -> None:
    sampler = sampled(threading.Event.wait, 0.1)
    assert set(sampler.counts) == {IDLE} and sampler.breakdown() == []
    assert "100.0% idle" in sampler.report()
    assert part_of(None) == OTHER


def frame_in(path: str, function: str) -> FrameType:
    """A live frame of a function named `function` in a file at `path`."""
    code = compile(f"def {function}():\n    return sys._getframe()\n", path, "exec")
    scope: dict[str, Any] = {"sys": sys}
    exec(code, scope)
    frame: FrameType = scope[function]()
    return frame


def test_shared_kernel_files_are_filed_by_function() -> None:
    # layer_ops.py holds both the fused decode layer and the MoE MLP the layer-by-layer path
    # calls (a prefill's experts): the latter is not a fused decode layer
    layer_ops = "/src/ferry/engine/kernels/layer_ops.py"
    assert part_of(frame_in(layer_ops, "moe_mlp")) == MOE
    assert part_of(frame_in(layer_ops, "decode_layers")) == "fused decode layers"
    ops = "/src/ferry/engine/kernels/ops.py"
    assert part_of(frame_in(ops, "decode_attention")) == "attention"
    assert part_of(frame_in(ops, "rms_norm")) == OTHER


def test_a_missing_thread_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no thread named"), StackSampler("no-such-thread"):
        pass

"""`ferry bench --profile`: where the engine thread's time goes during a run, by part.

A sampling profiler: a side thread reads the engine thread's Python stack every `interval`
seconds (sys._current_frames) and files the sample under the innermost frame that belongs to
a known part of Ferry. Time inside C (Ferry's kernels through ctypes, torch's operators) is
filed under the Python frame that called it, so a quantized product counts as `products`
whatever kernel ran it. Sampling costs the engine little: the kernels and torch release the
GIL, and the sampler holds it only to copy one stack. The HTTP layer (SSE) is not on this
thread: compare `ferry bench` with peerbench against a server for its share.
"""
from __future__ import annotations

import sys
import threading
from collections import Counter
from types import FrameType

# (part, path fragments), innermost frame first: the first part whose fragment is in the
# frame's file names the sample
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("products", ("engine/kernels/quant.py", "model/layers/linear.py",
                  "model/linear_kernels.py")),
    ("attention", ("engine/execution/attention/",)),
    ("fused decode layers", ("model/fused_decode.py", "engine/kernels/layer_ops.py")),
    ("sampling", ("engine/execution/sampling/",)),
    ("norms, rotary, activations, MoE routing", ("engine/execution/model/",)),
    ("batch assembly (executor)", ("engine/execution/",)),
    ("scheduling", ("engine/scheduling/", "engine/speculative/", "engine/structured/",
                    "engine/models/")),
    ("engine loop (events, metrics, streams)", ("engine/runtime/",)),
)
IDLE = "idle (waiting for work)"
OTHER = "other"


MOE = "mixture-of-experts MLPs (layer by layer)"
# files holding the kernels of several parts: filed by function (the rest of layer_ops.py is
# the fused decode layers; the fused layer runs its MoE inside its one C call)
BY_FUNCTION: dict[str, dict[str, str]] = {
    "engine/kernels/ops.py": {"store_kv": "attention", "decode_attention": "attention",
                              "gemv_bf16": "products", "argmax": "sampling"},
    "engine/kernels/layer_ops.py": {"moe_mlp": MOE},
}


def part_of(frame: FrameType | None) -> str:
    """The part a stack's sample belongs to (innermost known frame wins)."""
    innermost = frame
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        for path, parts in BY_FUNCTION.items():
            if name.endswith(path) and frame.f_code.co_name in parts:
                return parts[frame.f_code.co_name]
        for part, fragments in PARTS:
            if any(f in name for f in fragments):
                return part
        frame = frame.f_back
    if innermost is not None and innermost.f_code.co_filename.endswith(
            ("threading.py", "queue.py")):
        return IDLE
    return OTHER


class StackSampler:
    """Samples one thread (found by name) until stopped; `counts` by part."""

    def __init__(self, thread_name: str = "ferry-scheduler", interval: float = 0.001) -> None:
        self.thread_name = thread_name
        self.interval = interval
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StackSampler:
        target = next((t.ident for t in threading.enumerate() if t.name == self.thread_name),
                      None)
        if target is None:
            raise RuntimeError(f"no thread named {self.thread_name!r} to profile")
        self._thread = threading.Thread(target=self._sample, args=(target,), daemon=True,
                                        name="ferry-profiler")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self, ident: int) -> None:
        while not self._stop.wait(self.interval):
            self.counts[part_of(sys._current_frames().get(ident))] += 1

    def breakdown(self) -> list[tuple[str, float]]:
        """(part, share of the busy samples), largest first; idle samples left out."""
        busy = {k: v for k, v in self.counts.items() if k != IDLE}
        total = sum(busy.values())
        return sorted(((k, v / total) for k, v in busy.items()), key=lambda kv: -kv[1]) \
            if total else []

    def report(self) -> str:
        total = sum(self.counts.values())
        idle = self.counts.get(IDLE, 0)
        lines = [f"engine thread, {total} samples every {self.interval * 1000:g} ms, "
                 f"{100 * idle / total if total else 0:.1f}% idle; busy time by part:"]
        lines += [f"  {share * 100:5.1f}%  {part}" for part, share in self.breakdown()]
        return "\n".join(lines)

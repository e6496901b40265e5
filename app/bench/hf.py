"""The `--baseline hf` side of `ferry bench`: Hugging Face `generate`, same prompts, same run."""
from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from app.bench.workload import Result, Workload


class _Model(Protocol):
    """What the baseline uses of a transformers causal LM."""

    def eval(self) -> object: ...

    def generate(self, **kwargs: Any) -> object: ...


class _Clock:
    """A generate() streamer that records when each step's tokens come out."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._first = True

    def put(self, value: object) -> None:
        if self._first:  # the prompt is put first
            self._first = False
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def load(model_path: Path, dtype: str) -> tuple[_Model, ModuleType]:
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    model: _Model
    if Path(model_path).suffix == ".gguf":  # transformers dequantises it in memory
        model = AutoModelForCausalLM.from_pretrained(str(Path(model_path).parent),
                                                     gguf_file=Path(model_path).name,
                                                     dtype=torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch_dtype)
    model.eval()  # type: ignore[no-untyped-call]  # transformers leaves its eval() unannotated
    return model, torch


def _generate(model: _Model, torch: ModuleType, batch: list[list[int]], work: Workload,
              pad: int) -> tuple[float, list[float]]:
    width = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    clock = _Clock()
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=work.output,
                       min_new_tokens=work.output, do_sample=False, pad_token_id=pad,
                       streamer=clock)
    return start, clock.times


def one_at_a_time(model: _Model, torch: ModuleType, prompts: list[list[int]], work: Workload,
                  pad: int, total: int) -> Result:
    result = Result("hf generate, one at a time", len(prompts), 0.0, 0, 0,
                    note=f"{len(prompts)} of {total} requests (rate extrapolates)"
                    if len(prompts) < total else "")
    begin = time.perf_counter()
    for p in prompts:
        start, times = _generate(model, torch, [p], work, pad)
        result.output_tokens += len(times)
        result.prompt_tokens += len(p)
        result.ttft.append(times[0] - start)
        result.itl.extend(b - a for a, b in pairwise(times))
        result.tpot.append((times[-1] - times[0]) / max(1, len(times) - 1))
    result.wall = time.perf_counter() - begin
    return result


def static_batches(model: _Model, torch: ModuleType, prompts: list[list[int]], work: Workload,
                   pad: int) -> Result:
    size = work.concurrency
    result = Result(f"hf generate, static batches of {size}", len(prompts), 0.0, 0, 0)
    begin = time.perf_counter()
    for i in range(0, len(prompts), size):
        batch = prompts[i:i + size]
        _, times = _generate(model, torch, batch, work, pad)
        result.output_tokens += len(times) * len(batch)
        result.prompt_tokens += sum(len(p) for p in batch)
        result.ttft.extend([times[0] - begin] * len(batch))  # all queued at the start
        steps = [b - a for a, b in pairwise(times)]
        for _ in batch:
            result.itl.extend(steps)
            result.tpot.append((times[-1] - times[0]) / max(1, len(times) - 1))
    result.wall = time.perf_counter() - begin
    return result

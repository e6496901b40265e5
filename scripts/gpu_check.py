"""The GPU check's measurements (driven by scripts/gpu-check.sh; see docs/gpu.md).

  python scripts/gpu_check.py env OUT        versions: torch, CUDA, GPU, FlashInfer, nvcc
  python scripts/gpu_check.py kernels OUT    build FlashInfer's kernels once, timed apart
  python scripts/gpu_check.py bench OUT      throughput of the default model's shape
  python scripts/gpu_check.py collect OUT    everything under OUT into OUT/results.json

Each step writes OUT/<step>.json, so a step that fails or runs out of time leaves the others.
The throughput run builds a model of the default model's shape (SmolLM2-135M: Llama, 30
layers, hidden 576, 9 heads of 64, 3 KV heads, vocabulary 49152) with random weights: its
GGUF is not carried to a machine without network, and speed does not depend on the values.
Decode is timed at 1, 8 and 32 chats, prefill at 512 and 2048 tokens, on each attention
backend the machine can run.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
           "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 1,
           "eos_token_id": 2, "torch_dtype": "bfloat16"}
DECODE_CHATS = (1, 8, 32)
PREFILL_TOKENS = (512, 2048)
DECODE_STEPS = 32


def write(out: Path, step: str, data: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{step}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(json.dumps({step: data}, default=str)[:2000], flush=True)


def env(out: Path) -> None:
    import torch

    data: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda,
                            "cuda_available": torch.cuda.is_available(),
                            "nvcc": shutil.which("nvcc")}
    if torch.cuda.is_available():
        data["gpu"] = torch.cuda.get_device_name(0)
        data["capability"] = list(torch.cuda.get_device_capability(0))
        free, total = torch.cuda.mem_get_info(0)
        data["memory_gib"] = {"free": free / 2**30, "total": total / 2**30}
    try:
        import flashinfer

        data["flashinfer"] = flashinfer.__version__
    except Exception as exc:  # reported: the check goes on with the torch backend
        data["flashinfer_error"] = f"{type(exc).__name__}: {exc}"
    from engine.execution.devices import flashinfer_kernels, pick_device

    data["pick_device"] = pick_device("auto").why
    data["kernels"] = flashinfer_kernels()[1]
    write(out, "env", data)


def kernels(out: Path) -> None:
    """The self-test of each shape the tests and the throughput run use: the first one of a
    shape compiles FlashInfer's modules (nvcc), timed one by one."""
    import torch

    from engine.execution.attention.choice import self_test

    device = torch.device("cuda")
    shapes = [  # (heads, kv_heads, head_dim, page_size, window)
        (9, 3, 64, 16, None),  # the default model
        (4, 1, 64, 16, None), (8, 1, 64, 16, None), (2, 2, 64, 16, None),
        (4, 1, 128, 16, None), (8, 1, 128, 1, None), (2, 2, 128, 16, None),
        (4, 2, 64, 16, 6),  # a sliding window
    ]
    results = []
    for heads, kv_heads, head_dim, page_size, window in shapes:
        start = time.perf_counter()
        problem = self_test(device, torch.bfloat16, heads, kv_heads, head_dim,
                            head_dim ** -0.5, page_size, window)
        results.append({"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                        "page_size": page_size, "window": window,
                        "seconds": round(time.perf_counter() - start, 2),
                        "ok": problem is None, "problem": problem})
    total = round(sum(float(r["seconds"] or 0) for r in results), 1)
    write(out, "kernels", {"shapes": results, "total_seconds": total})


def _model_dir(root: Path) -> Path:
    """The default model's shape as a bfloat16 safetensors folder, random weights."""
    import torch
    from safetensors.torch import save_file

    folder = root / "smollm2-shape"
    if (folder / "model.safetensors").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(SMOLLM2))
    c = {k: int(v) for k, v in SMOLLM2.items() if isinstance(v, int)}
    h, inter, d = c["hidden_size"], c["intermediate_size"], 64
    kvh, heads = c["num_key_value_heads"], c["num_attention_heads"]
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device="cpu") * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rand(c["vocab_size"], h),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16, device="cpu")}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors |= {p + "self_attn.q_proj.weight": rand(heads * d, h),
                    p + "self_attn.k_proj.weight": rand(kvh * d, h),
                    p + "self_attn.v_proj.weight": rand(kvh * d, h),
                    p + "self_attn.o_proj.weight": rand(h, heads * d),
                    p + "mlp.gate_proj.weight": rand(inter, h),
                    p + "mlp.up_proj.weight": rand(inter, h),
                    p + "mlp.down_proj.weight": rand(h, inter),
                    p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16,
                                                             device="cpu"),
                    p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16,
                                                                      device="cpu")}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _timed(fn: Callable[[], object], repeat: int) -> float:
    import torch

    fn()  # warm: allocator, plans, kernels
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def _bench_backend(folder: Path, backend: str) -> dict[str, Any]:
    """One backend's figures (or the error that kept it from loading)."""
    from engine.config import EngineConfig
    from engine.execution.executor import ModelExecutor
    from engine.scheduling.batch import Batch, BatchItem
    from engine.scheduling.request import Request, SamplingParams

    config = EngineConfig(max_running=64, kv_tokens=65536, page_size=16, max_context=4096,
                          max_prefill_tokens=2048)
    try:
        ex = ModelExecutor.from_pretrained(folder, config, dtype="bfloat16", device="cuda",
                                           backend=backend, progress=False)
    except Exception as exc:  # FlashInfer absent or broken: said, the rest goes on
        return {"error": f"{type(exc).__name__}: {exc}"}
    row: dict[str, Any] = {"attention": f"{ex.attention.name} ({ex.attention.reason})",
                           "weights_gib": ex.weight_bytes() / 2**30}
    free = list(range(ex.pool.num_pages))

    def request(n: int) -> Request:
        req = Request([(7 * i) % 49000 + 3 for i in range(n)],
                      SamplingParams(max_tokens=DECODE_STEPS + 8, ignore_eos=True))
        req.pages = [free.pop() for _ in range(-(-(n + DECODE_STEPS + 8) // 16))]
        return req

    def prefill(req: Request, tokens: int) -> None:
        ex.run(Batch("prefill", (BatchItem(req, 0, tokens, True),)))

    for tokens in PREFILL_TOKENS:
        req = request(tokens)
        seconds = _timed(lambda: prefill(req, tokens), 5)  # noqa: B023 - called at once
        row[f"prefill_{tokens}_tokens_per_s"] = round(tokens / seconds, 1)
        free.extend(req.pages)
    for chats in DECODE_CHATS:
        reqs = [request(64 + 16 * i) for i in range(chats)]
        ex.run(Batch("prefill", tuple(BatchItem(r, 0, r.prompt_len, True) for r in reqs)))
        for r in reqs:
            r.output_ids.append(5)
        step = Batch("decode", tuple(BatchItem(r, r.prompt_len, 1, True) for r in reqs))
        # the same step again and again: the same K/V position rewritten, the same work
        seconds = _timed(lambda: ex.run(step), DECODE_STEPS)  # noqa: B023 - called at once
        row[f"decode_{chats}_chats_tokens_per_s"] = round(chats / seconds, 1)
        row[f"decode_{chats}_chats_ms_per_step"] = round(seconds * 1000, 2)
        for r in reqs:
            free.extend(r.pages)
    return row


def bench(out: Path) -> None:
    """Decode tokens/s at 1, 8 and 32 chats and prefill tokens/s at 512 and 2048 tokens,
    through the executor (packing, attention, sampling), per attention backend."""
    import torch

    folder = _model_dir(out / "model")
    results: dict[str, Any] = {"model": "SmolLM2-135M shape, random bfloat16 weights"}
    for backend in ("torch", "flashinfer"):
        results[backend] = _bench_backend(folder, backend)
        torch.cuda.empty_cache()
    write(out, "bench", results)


def collect(out: Path) -> None:
    data: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    for path in sorted(out.glob("*.json")):
        if path.name != "results.json":
            data[path.stem] = json.loads(path.read_text())
    for path in sorted(out.glob("*.txt")):
        data[path.stem] = path.read_text()[-4000:]
    (out / "results.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"wrote {out / 'results.json'}")


STEPS: dict[str, Callable[[Path], None]] = {"env": env, "kernels": kernels, "bench": bench,
                                            "collect": collect}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in STEPS:
        print(__doc__, file=sys.stderr)
        return 2
    STEPS[argv[0]](Path(argv[1]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))


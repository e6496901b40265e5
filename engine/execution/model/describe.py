"""One line on how a loaded model runs, for `ferry doctor`, the banner and `ferry bench`."""
from __future__ import annotations

from engine.execution.model.llama import LlamaForCausalLM

KERNELS = {"avx2": "native AVX2 kernels", "plain": "native plain-C kernels",
           "torch": "torch fallback kernels (slow)"}


def describe_weights(model: LlamaForCausalLM, source: str = "") -> str:
    """e.g. "GGUF Q4_1 + Q8_0 head, native AVX2 kernels, 98 MB" (quantized) or
    "GGUF dequantised to float32, 538 MB" (float). Sizes are of the weights held, in MB."""
    layers, head, total = model.weight_types()
    size = f"{total / 1e6:.0f} MB"
    kinds = [k for k, _ in sorted(layers.items(), key=lambda kv: -kv[1])]
    main = " + ".join(kinds) if kinds else head
    if not model.quantized:
        dtype = str(model.dtype).removeprefix("torch.")
        if source == "GGUF":
            return f"GGUF dequantised to {dtype}, {size}"
        return ", ".join(p for p in (f"{source} {dtype}".strip(), size) if p)
    from engine.kernels import quant

    what = main if head in kinds[:1] else f"{main} + {head} head"
    if source == "GGUF":
        what = f"GGUF {what}"
    elif source:
        what = f"{source} quantized to {what} at load"
    return f"{what}, {KERNELS.get(quant.kernel_path(), quant.kernel_path())}, {size}"

"""One line on how a loaded model runs, for `ferry doctor`, the banner and `ferry bench`, led
by its architecture (registry name); and whether Ferry runs a file at all (`ferry models`)."""
from __future__ import annotations

from pathlib import Path

from engine.execution.loading.model_files import is_gguf
from engine.execution.model.decoder import CausalLM

KERNELS = {"avx2": "native AVX2 kernels", "avx-vnni": "native AVX-VNNI kernels",
           "avx512-vnni": "native AVX-512 VNNI kernels",
           "plain": "native plain-C kernels", "torch": "torch fallback kernels (slow)"}
DEVICE_KERNELS = "Triton block kernels on the GPU"  # engine.kernels.gpu_quant
IMAGES = ", text + images"  # a vision model (docs/vision.md)


def images_said(projector: str | Path | None, tower: str = "") -> str:
    """How a vision model's line ends: ", text + images", naming the projector file a GGUF
    takes its image side from (and `tower`, its matrices' block types where it runs in
    blocks)."""
    if projector is None:
        return IMAGES
    blocks = f", tower in {tower}" if tower else ""
    return f"{IMAGES} (projector {Path(projector).name}{blocks})"


def describe_weights(model: CausalLM, source: str = "",
                     projector: str | Path | None = None) -> str:
    """e.g. "llama: GGUF Q4_1 + Q8_0 head, native AVX2 kernels, 98 MB" (quantized) or
    "llama: GGUF dequantised to float32, 538 MB" (float). Sizes are of the weights held. A
    vision model's line ends ", text + images" (and its `projector` file's name, and the
    block types its tower multiplies where it runs in blocks)."""
    images = images_said(projector, _tower_blocks(model)) if model.takes_images else ""
    return f"{model.config.model_type}: {_weights(model, source)}{images}"


def _tower_blocks(model: CausalLM) -> str:
    """The block types of the image side's projections ("Q8_0"), "" where they are float:
    the projections outside the text model (`model.`, `lm_head`)."""
    from engine.execution.model.layers import Linear
    from engine.execution.model.linear_kernels import host_blocks
    from engine.kernels import quant

    kinds = {quant.type_name(p.qtype)
             for name, m in model.named_modules()
             if isinstance(m, Linear) and not name.startswith(("model.", "lm_head"))
             for p in host_blocks(m.weight)}
    return "/".join(sorted(kinds))


def _weights(model: CausalLM, source: str) -> str:
    layers, head, total = model.weight_types()
    size = f"{total / 1e6:.0f} MB"
    kinds = [k for k, _ in sorted(layers.items(), key=lambda kv: -kv[1])]
    main = " + ".join(kinds) if kinds else head
    if not model.quantized and not model.device_quantized:
        dtype = str(model.dtype).removeprefix("torch.")
        if source == "GGUF":
            return f"GGUF dequantised to {dtype}, {size}"
        return ", ".join(p for p in (f"{source} {dtype}".strip(), size) if p)
    what = main if head in kinds[:1] else f"{main} + {head} head"
    if source == "GGUF":
        what = f"GGUF {what}"
    elif source:
        what = f"{source} quantized to {what} at load"
    if model.device_quantized:
        return f"{what}, {DEVICE_KERNELS}, {size}"
    return f"{what}, {_kernels([*kinds, *head.split('/')])}, {size}"


def describe_file(path: str | Path, dtype: str = "auto", device: str = "cpu",
                  quantize: str | None = None, projector: str | Path | None = None) -> str:
    """The same line for a model not loaded yet (`ferry doctor`): a GGUF's tensor table is
    read (memory-mapped, no weights touched); a folder is described by its settings. A
    GGUF's projector file is `projector`, or the one beside it."""
    from engine.execution.errors import ModelFileError
    from engine.execution.loading.gguf_file import GGUFFile
    from engine.execution.loading.loader import vision_of
    from engine.execution.loading.projector_gguf import projector_for
    from engine.execution.model import registry
    from engine.execution.model.config import UnsupportedModel

    path = Path(path)
    arch = model_architecture(path)
    if registry.is_embedding_model(path):  # the encoder executor's, in floats
        kind = "reranker" if registry.embedding_task(path) == "score" else "embedding model"
        return f"{arch}: {kind}, {'GGUF' if is_gguf(path) else 'safetensors'}"
    weights = _file(path, dtype, device, quantize)
    paired = projector_for(path, projector)
    if paired is not None:  # the vision family over the file's text model (it says why not
        try:  # when it loads; listed as text until then)
            family = GGUFFile(path, paired).config.model_type
        except (UnsupportedModel, ModelFileError, ValueError, OSError):
            return f"{arch}: {weights}"
        return f"{family}: {weights}{images_said(paired)}"
    return f"{arch}: {weights}" + (IMAGES if vision_of(path) is not None else "")


def model_architecture(path: str | Path) -> str:
    """The registry name of the architecture a .gguf file or a model folder holds; raises
    UnsupportedModel / ModelFileError (saying what Ferry runs) where Ferry cannot run it. A
    GGUF's metadata and tensor table are read and checked (memory-mapped, no weights)."""
    from engine.execution.loading.loader import read_config
    from engine.execution.model import registry

    path = Path(path)
    if registry.is_embedding_model(path) and (is_gguf(path) or registry.is_bert_folder(path)):
        return "bert"  # an encoder (engine.execution.encoder), not a decoder family
    if is_gguf(path):
        from engine.execution.errors import ModelFileError
        from engine.execution.loading.gguf_file import GGUFFile

        file = GGUFFile(path)
        if "tokenizer.ggml.model" not in file.meta:  # weights alone: nothing to chat with
            raise ModelFileError(f"{path} holds no tokenizer (no tokenizer.ggml.* metadata)")
        return file.config.model_type
    cfg = read_config(path)
    return registry.for_hf(cfg).config_from_hf(cfg).model_type


def _file(path: Path, dtype: str, device: str, quantize: str | None) -> str:
    import torch

    from engine.execution.loading.loader import GGUF, GGUF_DEVICE, weight_mode

    torch_dtype, mode = weight_mode(path, dtype, device, quantize)
    name = str(torch_dtype).removeprefix("torch.")
    if not is_gguf(path):
        if mode is None:
            return f"safetensors {name}"
        return f"safetensors quantized to {mode.upper()} at load, {_kernels([mode.upper()])}"
    from engine.execution.loading.gguf_file import GGUFFile

    file = GGUFFile(path)
    if mode not in (GGUF, GGUF_DEVICE):
        n = sum(int(torch.Size(t.shape).numel()) for t in file.tensors.values())
        size = n * torch.empty((), dtype=torch_dtype).element_size()
        return f"GGUF dequantised to {name}, {size / 1e6:.0f} MB"
    from engine.kernels import quant

    layers: dict[str, int] = {}
    for key, t in file.tensors.items():
        if key.startswith("model.layers.") and len(t.shape) == 2:
            kind = quant.type_name(t.qtype)
            layers[kind] = layers.get(kind, 0) + t.nbytes
    head = file.tensors.get("lm_head.weight", file.tensors["model.embed_tokens.weight"])
    kinds = [k for k, _ in sorted(layers.items(), key=lambda kv: -kv[1])]
    head_kind = quant.type_name(head.qtype)
    what = " + ".join(kinds) if head_kind in kinds[:1] else \
        f"{' + '.join(kinds)} + {head_kind} head"
    kernels = DEVICE_KERNELS if mode == GGUF_DEVICE else _kernels([*kinds, head_kind])
    return f"GGUF {what}, {kernels}, {file.total_bytes() / 1e6:.0f} MB"


def _kernels(type_names: list[str] | None = None) -> str:
    """The dot products that run for weights of these types ("Q4_K", ...; None: the CPU's
    best)."""
    from engine.kernels import quant

    qtypes = {q for k in type_names or [] if (q := quant.type_id(k)) is not None}
    paths = {quant.kernel_path(q) for q in qtypes} if qtypes else {quant.kernel_path()}
    names = [p for p in reversed(quant.PATHS) if p in paths] or sorted(paths)
    if len(names) == 1:
        return KERNELS.get(names[0], f"native {names[0]} kernels")
    return "native " + " + ".join(KERNELS.get(p, p).removeprefix("native ").removesuffix(
        " kernels") for p in names) + " kernels"

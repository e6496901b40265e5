"""A vision model's image side as llama.cpp keeps it: a projector file (`mmproj-*.gguf`,
architecture `clip`) beside the text model's GGUF, as llama.cpp's converter writes it with
`--mmproj` and LM Studio and Ollama store it.

The file holds the vision tower (`v.*`) and the projector (`mm.*`) and says which projector it
is (`clip.projector_type`): that picks the family (engine.execution.model.registry), whose
`config_from_projector` reads the tower's shape here and whose `projector_names` maps the
projector's tensors. The tower's tensors are named alike for every family (TOWER_NAMES).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.execution.errors import ModelFileError
from engine.execution.model.vision.config import TowerConfig

F32, F16 = 0, 1  # GGML's type numbers
PROJECTOR_TYPE = "clip.projector_type"
VISION = "clip.vision."
# the tower's tensors: GGUF name (after "v.") -> the tower module's (after its prefix)
TOWER_NAMES = {
    "patch_embd": "embeddings.patch_embedding", "position_embd": "embeddings.position_embedding",
    "class_embd": "embeddings.class_embedding", "pre_ln": "pre_layrnorm",
    "post_ln": "post_layernorm"}
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj", "ln1": "layer_norm1", "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}
LAYER = re.compile(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)$")
TOP = re.compile(r"v\.(\w+)\.(weight|bias)$")
CLASS_EMBD = "v.class_embd"  # stored without a .weight suffix


@dataclass(frozen=True, slots=True)
class ProjectorTensor:
    name: str  # as in the file
    qtype: int
    shape: tuple[int, ...]  # torch order
    data: np.ndarray  # a view into the file's map


class ProjectorFile:
    """An opened projector file: its type, metadata and tensors (by GGUF name)."""

    def __init__(self, path: str | Path) -> None:
        from engine.execution.loading.gguf_file import _open_reader, _value

        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"no projector file at {self.path}")
        reader = _open_reader(self.path)
        self.meta: dict[str, Any] = {k: _value(f) for k, f in reader.fields.items()}
        arch = self.meta.get("general.architecture")
        if arch != "clip":
            raise ModelFileError(f"{self.path}: a projector file has architecture 'clip', "
                                 f"not {arch!r}")
        if not self.meta.get("clip.has_vision_encoder", False):
            raise ModelFileError(f"{self.path}: the projector has no vision encoder")
        self.kind = str(self.meta.get(PROJECTOR_TYPE) or self.meta.get(VISION + "projector_type")
                        or "")
        self.tensors = {t.name: ProjectorTensor(
            t.name, int(t.tensor_type), tuple(int(d) for d in reversed(t.shape.tolist())),
            t.data) for t in reader.tensors}

    @property
    def pinpoints(self) -> bool:
        """The file cuts a picture into tiles at one of its resolutions (LLaVA 1.6's
        `image_grid_pinpoints`)."""
        return bool(self.meta.get(VISION + "image_grid_pinpoints"))

    def get(self, key: str, default: Any = None) -> Any:
        """`clip.vision.<key>`; a missing one without a default is an error naming the file."""
        value = self.meta.get(VISION + key)
        if value is None:
            if default is None:
                raise ModelFileError(f"{self.path}: metadata {VISION}{key} is missing")
            return default
        return value

    def tower(self, hidden_act: str, class_token: bool, eps: float) -> TowerConfig:
        """The tower the metadata describes (every layer of it)."""
        return TowerConfig(
            hidden_size=int(self.get("embedding_length")),
            intermediate_size=int(self.get("feed_forward_length")),
            num_heads=int(self.get("attention.head_count")), layers=int(self.get("block_count")),
            image_size=int(self.get("image_size")), patch_size=int(self.get("patch_size")),
            # stored as float32: its shortest spelling (1e-06, not 9.99...e-07)
            layer_norm_eps=float(str(np.float32(self.get("attention.layer_norm_epsilon",
                                                         eps)))),
            hidden_act=hidden_act, class_token=class_token)

    def image_token(self, token_id: Callable[[str], int | None], text: str) -> int:
        """The id of the image token `text` in the text model's vocabulary (`token_id`)."""
        found = token_id(text)
        if found is None:
            raise ModelFileError(f"{self.path}: the text model's vocabulary has no {text}, "
                                 "the token an image's positions hold")
        return found

    def mean_std(self) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
        mean, std = self.get("image_mean"), self.get("image_std")
        if len(mean) != 3 or len(std) != 3:
            raise ModelFileError(f"{self.path}: image_mean and image_std need 3 values each")
        return (float(mean[0]), float(mean[1]), float(mean[2])), \
            (float(std[0]), float(std[1]), float(std[2]))

    def floats(self, name: str) -> np.ndarray:
        """A tensor's values as float32 in torch's shape, dequantised where it is stored
        in blocks."""
        from gguf import GGMLQuantizationType, quants

        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name} is missing")
        values = quants.dequantize(np.asarray(t.data), GGMLQuantizationType(t.qtype))
        return np.ascontiguousarray(values, dtype=np.float32).reshape(t.shape)

    def joined(self, names: list[str], axis: int, stack: bool = False) -> ProjectorTensor:
        """Tensors the file keeps apart and the model keeps as one (Qwen2.5-VL's q, k and v
        as qkv; its patch embedding's two frames as one Conv3d kernel): joined along `axis`
        (stacked along a new one where `stack`), float16 where all are F16, else float32."""
        missing = [n for n in names if n not in self.tensors]
        if missing:
            raise ModelFileError(f"{self.path}: tensor {missing[0]} is missing")
        if all(self.tensors[n].qtype == F16 for n in names):
            parts = [np.asarray(self.tensors[n].data).reshape(self.tensors[n].shape)
                     for n in names]
            kind = F16
        else:
            parts, kind = [self.floats(name) for name in names], F32
        data = np.stack(parts, axis) if stack else np.concatenate(parts, axis)
        return ProjectorTensor("+".join(names), kind, tuple(data.shape), data)

    def unpermuted(self, name: str, heads: int) -> ProjectorTensor:
        """A q or k matrix (or bias) whose rows llama.cpp's converter put in its rotary
        order over `heads` heads (LlamaModel.permute), back in Hugging Face's order. Rows
        are whole in every storage type, so blocks move as they are."""
        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name} is missing")
        rows = t.shape[0]
        data = np.asarray(t.data).reshape(rows, -1)
        order = np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).ravel()
        return ProjectorTensor(t.name, t.qtype, t.shape, np.ascontiguousarray(data[order]))

    def keyed(self, tower: str, projector: dict[str, str],
              hidden: int) -> dict[str, ProjectorTensor]:
        """Every tensor under the model's key: the tower's under `tower` (its module
        prefix), the projector's by `projector` (GGUF name -> key). An FFN stored with up and
        down swapped (older files; llama.cpp tells them by shape) is put right: fc1 is the
        one that reads the tower's width."""
        out: dict[str, ProjectorTensor] = {}
        for name, t in self.tensors.items():
            key = projector.get(name) or _tower_key(name, tower)
            if key is None:
                raise ModelFileError(f"{self.path}: tensor {name} is not one Ferry knows for "
                                     f"a {self.kind!r} projector")
            out[key] = t
        for prefix in sorted({k.rsplit(".mlp.", 1)[0] for k in out if ".mlp.fc" in k}):
            up, down = f"{prefix}.mlp.fc1.weight", f"{prefix}.mlp.fc2.weight"
            if up in out and down in out and out[down].shape[-1] == hidden \
                    and out[up].shape[-1] != hidden:
                for part in ("weight", "bias"):
                    a, b = f"{prefix}.mlp.fc1.{part}", f"{prefix}.mlp.fc2.{part}"
                    if a in out and b in out:
                        out[a], out[b] = out[b], out[a]
        return out


def _tower_key(name: str, tower: str) -> str | None:
    if name == CLASS_EMBD:
        return f"{tower}.{TOWER_NAMES['class_embd']}"
    layer = LAYER.match(name)
    if layer is not None:
        mapped = LAYER_NAMES.get(layer[2])
        return None if mapped is None else \
            f"{tower}.encoder.layers.{layer[1]}.{mapped}.{layer[3]}"
    top = TOP.match(name)
    if top is not None and top[1] in TOWER_NAMES:
        return f"{tower}.{TOWER_NAMES[top[1]]}.{top[2]}"
    return None


def projector_type(path: str | Path) -> str:
    """The `clip.projector_type` of a projector file ("" where it is not one)."""
    try:
        return ProjectorFile(path).kind
    except (ModelFileError, ValueError, OSError):
        return ""


def projector_beside(model: str | Path) -> Path | None:
    """The projector file a GGUF model has beside it, as LM Studio and llama.cpp's converter
    keep them: one `mmproj*.gguf` in the model's folder whose projector Ferry runs over the
    model's architecture (an F16 one first, where there are several). None: a text model
    (a projector of another kind, or none, is no error: the model still serves text)."""
    from engine.execution.loading.gguf_file import gguf_metadata_value
    from engine.execution.model import registry

    model = Path(model)
    try:
        arch = gguf_metadata_value(model, "general.architecture")
        found = sorted(p for p in model.parent.iterdir()
                       if p.is_file() and p != model and p.suffix.lower() == ".gguf"
                       and p.name.lower().startswith("mmproj"))
    except (OSError, ValueError, ModelFileError):
        return None
    found.sort(key=lambda p: "f16" not in p.name.lower())  # stable: by name within each
    for path in found:
        family = registry.for_projector(projector_type(path))
        if family is not None and arch in family.projector_text_archs:
            return path
    return None


def projector_for(model: str | Path, given: str | Path | None = None) -> Path | None:
    """The projector file a model takes its image side from: `given` (--mmproj, Ollama's
    projector layer), else, for a GGUF, the one beside it (projector_beside); None for a
    folder or a text model."""
    from engine.execution.loading.model_files import is_gguf

    if given is not None:
        return Path(given)
    return projector_beside(model) if is_gguf(Path(model)) else None

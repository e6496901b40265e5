"""Reading a GGUF file: its metadata as our ModelConfig, its tensors under Hugging Face names.

gguf-py's GGUFReader memory-maps the file; each tensor's `data` is a numpy view into that map,
so nothing is read until used. The checks a bad file needs happen here, before any kernel sees
a byte: the architecture, every tensor's block type and extent (a truncated file), and every
tensor's shape against the metadata. Errors name the file and the tensor.

llama.cpp's converter permutes the rows of attn_q / attn_k (Llama only) from Hugging Face's
rotary layout (first half / second half of each head) to interleaved pairs. `hf_rows` is the
row order that undoes it; rows of a block matrix are independent runs of blocks, so the same
order applies to the quantized bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.execution.errors import ModelFileError
from engine.execution.model.llama import ModelConfig

ARCHS = ("llama",)  # GGUF architectures Ferry runs (Mistral and SmolLM2 GGUFs say "llama")
PERMUTED = ("llama",)  # archs whose attn_q / attn_k rows llama.cpp permutes

# GGUF tensor name (per layer: without "blk.N.") -> Hugging Face key suffix
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                "output": "lm_head"}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _open_reader(path: Path) -> Any:
    import gguf

    class Reader(gguf.GGUFReader):
        """GGUFReader whose tensor table is checked first, so that a bad entry is reported
        by name (the plain reader fails with a bare ValueError or a reshape error)."""

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any],
                                                                           list[int], list[Any]]:
            """Arrays in one piece: gguf-py makes one numpy view per element, seconds for a
            tokenizer's 50-150k tokens. A scalar array becomes a single view (its values:
            `_value`); a string array is only measured (its strings are the tokenizer's,
            which transformers reads itself, once: tokenizer.gguf_tokenizer_dir)."""
            if raw_type != gguf.GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            item = self._get(orig_offs, np.uint32)
            count = self._get(orig_offs + 4, np.uint64)
            offs, n = orig_offs + 12, int(count[0])
            kind = gguf.GGUFValueType(int(item[0]))
            nptype = self.gguf_scalar_to_np.get(kind)
            if nptype is not None:
                values = self._get(offs, nptype, n)
                return 12 + int(values.nbytes), [item, count, values], [2], [
                    gguf.GGUFValueType.ARRAY, kind]
            if kind != gguf.GGUFValueType.STRING:
                return super()._get_field_parts(orig_offs, raw_type)
            # numpy's stubs give arrays __buffer__ only for Python >= 3.12
            raw = memoryview(self.data)  # type: ignore[arg-type]
            for _ in range(n):  # uint64 length, then the bytes
                offs += 8 + int.from_bytes(raw[offs:offs + 8], "little")
            return offs - orig_offs, [item, count], [], [gguf.GGUFValueType.ARRAY, kind]

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            size = len(self.data)
            for field in fields:
                _, name_data, _, dims, raw_dtype, offset = field.parts
                name = bytes(name_data).decode("utf-8", "replace")
                try:
                    qtype = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                except ValueError:
                    raise ModelFileError(f"{path}: tensor {name} has block type "
                                         f"{int(raw_dtype[0])}, which Ferry does not know"
                                         ) from None
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
                elems = int(np.prod(dims.astype(np.int64)))
                end = int(start_offs + offset[0]) + elems * type_size // block
                if elems % block or end > size:
                    raise ModelFileError(
                        f"{path}: tensor {name} ends at byte {end} but the file has {size} "
                        "bytes (truncated or corrupt file)" if end > size else
                        f"{path}: tensor {name} is not a whole number of {qtype.name} blocks")
            super()._build_tensors(start_offs, fields)

    try:
        return Reader(str(path), "c")  # copy-on-write map: arrays are writable, file untouched
    except ModelFileError:
        raise
    except (ValueError, IndexError, OSError, KeyError) as exc:
        raise ModelFileError(f"{path}: not a readable GGUF file ({exc})") from exc


def _value(field: Any) -> Any:
    """A metadata field's value: scalar, string, or list of either."""
    import gguf

    kinds = field.types
    if not kinds:
        return None
    if kinds[0] == gguf.GGUFValueType.ARRAY:  # as our reader keeps them (one part, or none)
        if kinds[-1] == gguf.GGUFValueType.STRING or not field.data:
            return None
        return field.parts[field.data[0]].tolist()
    if kinds[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    return field.parts[field.data[0]][0].item()


@dataclass
class GGUFTensor:
    name: str  # as in the file
    key: str  # Hugging Face key
    qtype: int
    shape: tuple[int, ...]  # torch order: [out, in] for a matrix
    data: np.ndarray  # view into the map
    offset: int  # absolute file offset of the data
    nbytes: int
    permute_heads: int = 0  # >0: rows are in llama.cpp's rotary order over this many heads

    def hf_rows(self) -> torch.Tensor | None:
        """Row order that turns this tensor's rows into Hugging Face's (None: as stored)."""
        if not self.permute_heads:
            return None
        rows = self.shape[0]
        half = rows // self.permute_heads // 2
        return torch.arange(rows).view(self.permute_heads, half, 2).transpose(1, 2).reshape(-1)


class GGUFFile:
    """An opened GGUF: `config`, `tensors` (HF key -> GGUFTensor), `rope_factors`, `eos_ids`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"no GGUF file at {self.path}")
        self.reader = _open_reader(self.path)
        self.meta = {k: _value(f) for k, f in self.reader.fields.items()}
        self.arch = str(self.meta.get("general.architecture", ""))
        if self.arch not in ARCHS:
            raise ModelFileError(f"{self.path}: architecture {self.arch!r} is not one Ferry "
                                 f"runs (supported: {', '.join(ARCHS)})")
        by_name = {t.name: t for t in self.reader.tensors}
        self.config = self._config(by_name)
        self.tensors: dict[str, GGUFTensor] = {}
        self.rope_factors: torch.Tensor | None = None
        self._map_tensors(by_name)
        eos = self.meta.get("tokenizer.ggml.eos_token_id")
        self.eos_ids: frozenset[int] = frozenset([int(eos)] if eos is not None else [])

    def _get(self, key: str, default: Any = None) -> Any:
        value = self.meta.get(f"{self.arch}.{key}", default)
        if value is None:
            raise ModelFileError(f"{self.path}: metadata {self.arch}.{key} is missing")
        if isinstance(value, list):
            raise ModelFileError(f"{self.path}: per-layer {self.arch}.{key} is not supported")
        return value

    def _config(self, by_name: dict[str, Any]) -> ModelConfig:
        hidden = int(self._get("embedding_length"))
        heads = int(self._get("attention.head_count"))
        embed = by_name.get("token_embd.weight")
        if embed is None:
            raise ModelFileError(f"{self.path}: tensor token_embd.weight is missing")
        vocab = int(self.meta.get(f"{self.arch}.vocab_size") or embed.shape[-1])
        rope: dict[str, Any] = {"rope_type": "default"}
        kind = self.meta.get(f"{self.arch}.rope.scaling.type", "none")
        if kind == "linear":
            rope = {"rope_type": "linear",
                    "factor": float(self._get("rope.scaling.factor"))}
        elif kind not in ("none", ""):
            raise ModelFileError(f"{self.path}: rope scaling {kind!r} is not supported")
        return ModelConfig(
            model_type=self.arch, vocab_size=vocab, hidden_size=hidden,
            intermediate_size=int(self._get("feed_forward_length")),
            num_layers=int(self._get("block_count")), num_heads=heads,
            num_kv_heads=int(self._get("attention.head_count_kv", heads)),
            head_dim=int(self._get("attention.key_length", hidden // heads)),
            rms_norm_eps=float(self._get("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(self._get("context_length")),
            rope_theta=float(self._get("rope.freq_base", 10000.0)), rope=rope,
            tie_word_embeddings="output.weight" not in by_name,
            qkv_bias="blk.0.attn_q.bias" in by_name, o_bias="blk.0.attn_output.bias" in by_name,
            mlp_bias="blk.0.ffn_up.bias" in by_name)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
            "model.norm.weight": (c.hidden_size,)}
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
        per_layer = {"input_layernorm": (c.hidden_size,),
                     "post_attention_layernorm": (c.hidden_size,),
                     "self_attn.q_proj": (q, c.hidden_size),
                     "self_attn.k_proj": (kv, c.hidden_size),
                     "self_attn.v_proj": (kv, c.hidden_size),
                     "self_attn.o_proj": (c.hidden_size, q),
                     "mlp.gate_proj": (c.intermediate_size, c.hidden_size),
                     "mlp.up_proj": (c.intermediate_size, c.hidden_size),
                     "mlp.down_proj": (c.hidden_size, c.intermediate_size)}
        biased = ((["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"] if c.qkv_bias
                   else []) + (["self_attn.o_proj"] if c.o_bias else [])
                  + (["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] if c.mlp_bias else []))
        for i in range(c.num_layers):
            for name, shape in per_layer.items():
                shapes[f"model.layers.{i}.{name}.weight"] = shape
            for name in biased:
                shapes[f"model.layers.{i}.{name}.bias"] = per_layer[name][:1]
        return shapes

    def _map_tensors(self, by_name: dict[str, Any]) -> None:
        import gguf

        expected = self.expected_shapes()
        c = self.config
        for name, t in by_name.items():
            if name == "rope_freqs.weight":
                self.rope_factors = torch.from_numpy(np.array(t.data, dtype=np.float32))
                continue
            key = _hf_key(name)
            if key is None:
                raise ModelFileError(f"{self.path}: tensor {name} is not one Ferry knows "
                                     f"for architecture {self.arch}")
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            want = expected.get(key)
            if want is None or shape != want:
                raise ModelFileError(f"{self.path}: tensor {name} has shape {list(shape)}, "
                                     f"but the metadata implies {list(want or ())}")
            qtype = int(t.tensor_type)
            if len(shape) == 1 and qtype not in (gguf.GGMLQuantizationType.F32,
                                                 gguf.GGMLQuantizationType.F16,
                                                 gguf.GGMLQuantizationType.BF16):
                raise ModelFileError(f"{self.path}: vector {name} is stored as "
                                     f"{t.tensor_type.name}, expected a float type")
            heads = 0
            if self.arch in PERMUTED and ".q_proj." in key:
                heads = c.num_heads
            elif self.arch in PERMUTED and ".k_proj." in key:
                heads = c.num_kv_heads
            self.tensors[key] = GGUFTensor(name, key, qtype, shape, t.data, int(t.data_offset),
                                           int(t.n_bytes), heads)
        missing = [k for k in expected if k not in self.tensors]
        if missing:
            names = [_gguf_name(k) for k in missing[:3]]
            raise ModelFileError(f"{self.path}: {len(missing)} tensors are missing, "
                                 f"e.g. {', '.join(names)}")

    def read(self, t: GGUFTensor) -> np.ndarray:
        """The tensor's bytes read from the file into fresh memory (not through the map, so
        that pages of tensors that are copied anyway never become resident twice)."""
        out = np.empty(t.nbytes, dtype=np.uint8)
        with open(self.path, "rb") as f:
            # numpy's stubs give arrays __buffer__ only for Python >= 3.12
            got = os.preadv(f.fileno(), [memoryview(out)], t.offset)  # type: ignore[arg-type]
        if got != t.nbytes:
            raise ModelFileError(f"{self.path}: tensor {t.name} is cut short")
        return out

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def gguf_eos_ids(path: str | Path) -> frozenset[int]:
    """A GGUF's EOS id (tokenizer.ggml.eos_token_id), from its metadata alone."""
    field = _open_reader(Path(path)).fields.get("tokenizer.ggml.eos_token_id")
    value = None if field is None else _value(field)
    return frozenset([int(value)]) if value is not None else frozenset()


def _hf_key(name: str) -> str | None:
    base, _, kind = name.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if base in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[base]}.{kind}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{kind}"
    return None


def _gguf_name(key: str) -> str:
    for gg, hf in GLOBAL_NAMES.items():
        if key.startswith(hf + "."):
            return gg + key[len(hf):]
    parts = key.split(".")
    rest = ".".join(parts[3:-1])
    short = next((g for g, h in LAYER_NAMES.items() if h == rest), rest)
    return f"blk.{parts[2]}.{short}.{parts[-1]}"

"""Reading a GGUF file: its metadata as our ModelConfig, its tensors under Hugging Face names.

The architecture (registry: `general.architecture` -> class) reads the metadata and names
the tensors (its gguf_global_names / gguf_layer_names); the shapes the config implies come
from the model itself, built on the meta device.

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
from engine.execution.loading.projector_gguf import ProjectorFile
from engine.execution.model import registry
from engine.execution.model.config import GGUFMeta, ModelConfig
from engine.execution.model.decoder import CausalLM

# an embedding model's head beside the text model, read by its own loader
# (engine.execution.model.embedding_decoder): a reranker's (Qwen3-Reranker: the LM head's
# "yes" and "no" rows), EmbeddingGemma's two Dense modules
HEAD_TENSORS = ("cls.output.weight", "cls.output.bias", "dense_2.weight", "dense_3.weight")


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
    projector: bool = False  # from the projector file (offset -1): read as floats (F16 kept)

    def hf_rows(self) -> torch.Tensor | None:
        """Row order that turns this tensor's rows into Hugging Face's (None: as stored)."""
        if not self.permute_heads:
            return None
        rows = self.shape[0]
        half = rows // self.permute_heads // 2
        return torch.arange(rows).view(self.permute_heads, half, 2).transpose(1, 2).reshape(-1)


class GGUFFile:
    """An opened GGUF: `config`, `tensors` (HF key -> GGUFTensor), `rope_factors`, `eos_ids`.
    With `projector` (a vision model's projector file, projector_gguf): the text model's
    file and its image side as one vision model."""

    def __init__(self, path: str | Path, projector: str | Path | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileError(f"no GGUF file at {self.path}")
        self.reader = _open_reader(self.path)
        self.meta = {k: _value(f) for k, f in self.reader.fields.items()}
        self.arch = str(self.meta.get("general.architecture", ""))
        arch = registry.for_gguf(self.arch)
        if arch is None:
            raise ModelFileError(f"{self.path}: architecture {self.arch!r} is not one Ferry "
                                 f"runs (supported: {', '.join(registry.GGUF_ARCHS)})")
        self.text_architecture: type[CausalLM] = arch  # names the text model's tensors
        self.architecture: type[CausalLM] = arch
        by_name = {t.name: t for t in self.reader.tensors}
        shapes = {n: tuple(int(d) for d in reversed(t.shape.tolist())) for n, t in by_name.items()}
        self.config: ModelConfig = arch.config_from_gguf(GGUFMeta(
            str(self.path), self.arch, self.meta, shapes,
            lambda name: np.array(by_name[name].data, dtype=np.float32).ravel().tolist()))
        self.projector: ProjectorFile | None = None
        if projector is not None:
            self._with_projector(ProjectorFile(projector))
        self.tensors: dict[str, GGUFTensor] = {}
        self.rope_factors: torch.Tensor | None = None
        self._map_tensors(by_name)
        eos = self.meta.get("tokenizer.ggml.eos_token_id")
        self.eos_ids: frozenset[int] = frozenset([int(eos)] if eos is not None else [])

    def _with_projector(self, projector: ProjectorFile) -> None:
        """The vision family whose projector this is, over this text model."""
        family = registry.for_projector(projector.kind, projector.pinpoints)
        if family is None:
            raise ModelFileError(f"{projector.path}: projector type {projector.kind!r} is not "
                                 "one Ferry runs (supported: "
                                 f"{', '.join(registry.PROJECTOR_TYPES)})")
        if self.arch not in family.projector_text_archs:
            raise ModelFileError(f"{projector.path}: a {projector.kind!r} projector goes with "
                                 f"a {' or '.join(family.projector_text_archs)} model, not "
                                 f"{self.path.name} ({self.arch})")
        width = family.projector_width(projector) or self.config.hidden_size
        if width != self.config.hidden_size:
            raise ModelFileError(f"{projector.path}: the projector gives {width}-wide rows, "
                                 f"{self.path.name} takes {self.config.hidden_size}")
        self.projector, self.architecture = projector, family
        self.config = family.config_from_projector(self.config, projector, self.token_id)

    def token_id(self, text: str) -> int | None:
        """The id of a token of the file's vocabulary spelled `text` (None: no such token)."""
        field = self.reader.fields.get("tokenizer.ggml.tokens")
        if field is None:
            return None
        # our reader only measured the strings (_open_reader): walk them where they lie,
        # after the field's key, type, item type and count
        raw = memoryview(self.reader.data)
        offs = int(field.offset) + sum(int(p.nbytes) for p in field.parts)
        want = text.encode()
        for i in range(int(field.parts[-1][0])):
            length = int.from_bytes(raw[offs:offs + 8], "little")
            offs += 8
            if length == len(want) and raw[offs:offs + length] == want:
                return i
            offs += length
        return None

    def skeleton(self) -> CausalLM:
        """The architecture's model for this config, on the meta device (no storage)."""
        return self.architecture(self.config, torch.float32, "meta")

    def _map_tensors(self, by_name: dict[str, Any]) -> None:
        import gguf

        expected = self.skeleton().checkpoint_shapes()
        c = self.config
        names = _Names(self.text_architecture)
        permute = self.text_architecture.gguf_permute_qk
        for name, t in by_name.items():
            if name == "rope_freqs.weight":
                self.rope_factors = torch.from_numpy(np.array(t.data, dtype=np.float32))
                continue
            if name in self.architecture.gguf_config_tensors:  # read into the config
                continue
            if name in HEAD_TENSORS:  # an embedding model's head: its loader reads it apart
                continue
            per_expert = names.expert_key(name)
            if per_expert is not None:
                self._split_experts(t, per_expert, expected)
                continue
            key = names.hf_key(name)
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
            if permute and ".q_proj." in key:
                heads = c.num_heads
            elif permute and ".k_proj." in key:
                heads = c.num_kv_heads
            self.tensors[key] = GGUFTensor(name, key, qtype, shape, t.data, int(t.data_offset),
                                           int(t.n_bytes), heads)
        if self.projector is not None:
            self._map_projector(self.projector, expected)
        missing = [k for k in expected if k not in self.tensors]
        if missing:
            shown = [names.gguf_name(k) for k in missing[:3]]
            raise ModelFileError(f"{self.path}: {len(missing)} tensors are missing, "
                                 f"e.g. {', '.join(shown)}")

    def _map_projector(self, projector: ProjectorFile,
                       expected: dict[str, tuple[int, ...]]) -> None:
        """The projector file's tensors under the vision family's keys (read as floats:
        the tower runs float, whatever the file stores; F16 matrices stay float16 on the
        CPU, see gguf_loader)."""
        keyed = self.architecture.projector_tensors(projector, self.config)
        for key, t in keyed.items():
            want = expected.get(key)
            if want is None or t.shape != want:
                raise ModelFileError(f"{projector.path}: tensor {t.name} has shape "
                                     f"{list(t.shape)}, but the metadata implies "
                                     f"{list(want or ())}")
            self.tensors[key] = GGUFTensor(t.name, key, t.qtype, t.shape, t.data, -1,
                                           int(t.data.nbytes), projector=True)

    def _split_experts(self, t: Any, key: str, expected: dict[str, tuple[int, ...]]) -> None:
        """A 3-D tensor of all experts [experts, out, in] as one 2-D view per expert, under
        the per-expert key (`key` with "{e}"), so that an expert's blocks are read only when
        it is used."""
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        experts = self.config.moe.experts if self.config.moe else 0
        want = expected.get(key.format(e=0))
        if len(shape) != 3 or shape[0] != experts or want is None or shape[1:] != want:
            raise ModelFileError(f"{self.path}: tensor {t.name} has shape {list(shape)}, "
                                 f"but the metadata implies {[experts, *(want or ())]}")
        data = np.asarray(t.data).reshape(experts, -1)
        size = int(t.n_bytes) // experts
        for e in range(experts):
            k = key.format(e=e)
            self.tensors[k] = GGUFTensor(t.name, k, int(t.tensor_type), shape[1:], data[e],
                                         int(t.data_offset) + e * size, size)

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


def gguf_metadata_value(path: str | Path, key: str) -> Any:
    """One scalar or string metadata value of a GGUF (None when absent), from its metadata
    alone."""
    field = _open_reader(Path(path)).fields.get(key)
    return None if field is None else _value(field)


def gguf_tokenizer_model(path: str | Path) -> str | None:
    """A GGUF's vocabulary kind (tokenizer.ggml.model: "gpt2" for byte-level BPE, "llama"
    for SentencePiece, "bert" for WordPiece, ...), from its metadata alone."""
    value = gguf_metadata_value(path, "tokenizer.ggml.model")
    return str(value) if value is not None else None


class _Names:
    """An architecture's GGUF tensor names <-> Hugging Face keys."""

    def __init__(self, arch: type[CausalLM]) -> None:
        self.top, self.layer = arch.gguf_global_names, arch.gguf_layer_names
        self.experts = arch.gguf_expert_names

    def expert_key(self, name: str) -> str | None:
        """blk.N.ffn_gate_exps.weight -> model.layers.N.mlp.experts.{e}.gate_proj.weight"""
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in self.experts \
                and parts[3] == "weight":
            return f"model.layers.{parts[1]}.{self.experts[parts[2]]}.weight"
        return None

    def hf_key(self, name: str) -> str | None:
        base, _, kind = name.rpartition(".")
        if kind not in ("weight", "bias"):
            return None
        if base in self.top:
            return f"{self.top[base]}.{kind}"
        parts = base.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() \
                and parts[2] in self.layer:
            return f"model.layers.{parts[1]}.{self.layer[parts[2]]}.{kind}"
        return None

    def gguf_name(self, key: str) -> str:
        for gg, hf in self.top.items():
            if key.startswith(hf + "."):
                return gg + key[len(hf):]
        parts = key.split(".")
        rest = ".".join(parts[3:-1])
        short = next((g for g, h in self.layer.items() if h == rest), rest)
        return f"blk.{parts[2]}.{short}.{parts[-1]}"

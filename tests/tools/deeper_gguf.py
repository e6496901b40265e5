"""A "deeper" copy of a Llama GGUF: its own layers, then `extra` more, for the draft-model
speculative tests (the original drafts for the deeper one: same tokenizer, mostly the same
next token, not always).

Each extra layer copies the last layer's norms and q/k/v/gate/up projections; its output
projections (attn_output, ffn_down) are small random matrices (normal, std `scale`), so it
adds a small random term to the residual stream. Every other field and tensor is copied
as stored (quantized blocks byte for byte); `renamed` changes token strings (a draft model
whose tokenizer is not the target's).

  python tests/tools/deeper_gguf.py OUT.gguf [--extra 2 --scale 0.01]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from tests.tools.synthetic_gguf import default_gguf

COPIED = ("attn_norm", "attn_q", "attn_k", "attn_v", "ffn_norm", "ffn_gate", "ffn_up")
PERTURBED = ("attn_output", "ffn_down")


def _copy_field(writer: GGUFWriter, name: str, field: object, arch: str, blocks: int,
                renamed: dict[int, str]) -> None:
    parts, data, types = field.parts, field.data, field.types  # type: ignore[attr-defined]
    if name == f"{arch}.block_count":
        writer.add_uint32(name, blocks)
        return
    kind = types[0]
    if kind == GGUFValueType.ARRAY:
        if types[1] == GGUFValueType.STRING:
            values = [bytes(parts[i]).decode("utf-8", "replace") for i in data]
            if name == "tokenizer.ggml.tokens":
                for token_id, text in renamed.items():
                    values[token_id] = text
            writer.add_array(name, values)
        else:
            writer.add_array(name, [parts[i].tolist()[0] for i in data])
    elif kind == GGUFValueType.STRING:
        writer.add_string(name, bytes(parts[data[0]]).decode("utf-8"))
    else:
        writer.add_key_value(name, parts[data[0]].tolist()[0], kind)


def write_deeper(out: Path, extra: int = 2, scale: float = 0.01, seed: int = 0,
                 source: Path | None = None, renamed: dict[int, str] | None = None) -> Path:
    """`renamed`: token id -> another string (a tokenizer that is not the source's)."""
    reader = GGUFReader(source or default_gguf())
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    blocks = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    writer = GGUFWriter(str(out), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer adds the header and the architecture itself
        _copy_field(writer, name, field, arch, blocks + extra, renamed or {})
    by_name = {t.name: t for t in reader.tensors}

    def add_raw(name: str, src: str) -> None:
        t = by_name[src]
        writer.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)

    for t in reader.tensors:
        add_raw(t.name, t.name)
    rng = np.random.default_rng(seed)
    last = f"blk.{blocks - 1}."
    for i in range(blocks, blocks + extra):
        for part in COPIED:
            add_raw(f"blk.{i}.{part}.weight", f"{last}{part}.weight")
        for part in PERTURBED:
            rows, cols = (int(x) for x in reversed(by_name[f"{last}{part}.weight"].shape))
            noise = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale)
            writer.add_tensor(f"blk.{i}.{part}.weight", noise,
                              raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--extra", type=int, default=2)
    p.add_argument("--scale", type=float, default=0.01)
    args = p.parse_args()
    write_deeper(args.out, args.extra, args.scale)


if __name__ == "__main__":
    main()

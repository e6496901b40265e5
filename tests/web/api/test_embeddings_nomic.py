"""nomic-bert (rotary positions, SwiGLU, no projection biases): a tiny seeded model built by
transformers and saved by sentence-transformers, served through /v1/embeddings, its vectors
equal to sentence-transformers' on the same folder; both namings of its tensors (nomic's
original ones, transformers' own) read alike."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tools.embedding_server import (
    SHARED_SENTENCES,
    encoder_fixtures,
    engine_vectors,
    worst_cosine_to_sentence_transformers,
)

SENTENCES = [*SHARED_SENTENCES, "search_query: what do embeddings measure?"]
folder, server = encoder_fixtures("nomic_bert", "nomic")


def test_vectors_match_sentence_transformers(server: Any, folder: Path) -> None:
    assert worst_cosine_to_sentence_transformers(server.url, "nomic", folder, SENTENCES) >= 0.999
    assert server.engine.executor.describe().startswith("nomic-bert: safetensors float32")
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.free == snap.kv.total and any(len(r.batch) > 1 for r in snap.rounds)


def test_both_namings_of_the_checkpoint(server: Any, folder: Path) -> None:
    """transformers writes nomic's original names (`encoder.layers.N.attn.Wqkv`, `mlp.fc11`
    ...: what the test above served); its own names (`layers.N.self_attn.q_proj`...) give the
    same weights."""
    from safetensors.torch import load_file

    from engine.execution.model.architectures.encoders import nomic_bert

    cfg = server.engine.executor.model_config
    original = load_file(str(folder / "model.safetensors"))
    assert any(".attn.Wqkv." in k for k in original)
    renamed = {}
    for key, value in original.items():
        name = nomic_bert.canonical(key)
        if ".self_attn.qkv." in name:
            for x, part in zip("qkv", value.chunk(3)):
                renamed[name.replace(".qkv.", f".{x}_proj.")] = part
        else:
            renamed[name] = value
    assert "layers.0.self_attn.q_proj.weight" in renamed
    a = nomic_bert.weights_from_tensors(original, cfg, torch.float32, "cpu")
    b = nomic_bert.weights_from_tensors(renamed, cfg, torch.float32, "cpu")
    assert all(torch.equal(x, y) for la, lb in zip(a.layers, b.layers, strict=True)
               for x, y in zip(la.tensors, lb.tensors, strict=True))
    assert torch.equal(a.ln[0], b.ln[0]) and a.position is None


@pytest.mark.parametrize("blocks", ["F16", "Q8_0"])
def test_a_nomic_bert_gguf_matches_sentence_transformers(folder: Path, tmp_path: Path,
                                                         blocks: str) -> None:
    """The folder as a llama.cpp `nomic-bert` GGUF (gguf-py's writer, llama.cpp's names:
    a fused attn_qkv, ffn_gate, no position table); in Q8_0 its fused qkv stays one matrix
    of blocks."""
    from sentence_transformers import SentenceTransformer

    from engine import EncoderExecutor, Tokenizer
    from engine.kernels.quant import QuantWeight
    from tests.tools.bert_gguf import write_bert_gguf

    types = None if blocks == "F16" else {
        k: blocks for k in ("attn_qkv", "attn_output", "ffn_up", "ffn_gate", "ffn_down")}
    gguf = write_bert_gguf(folder, tmp_path / "nomic.gguf", types)
    executor = EncoderExecutor.from_pretrained(gguf, threads=1, cache_dir=tmp_path / "cache")
    assert executor.describe().startswith("nomic-bert: gguf")
    qkv = executor.weights.layers[0].qkv_w  # type: ignore[union-attr]
    assert isinstance(qkv, QuantWeight) == (blocks != "F16")
    assert executor.tokenizer_path is not None
    got = engine_vectors(executor, Tokenizer(executor.tokenizer_path), SENTENCES)
    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(SENTENCES))
    assert min(torch.nn.functional.cosine_similarity(got, want, dim=1).tolist()) >= 0.999

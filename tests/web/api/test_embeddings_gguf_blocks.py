"""A quantized `bert` GGUF (all-MiniLM-L6-v2's layers in Q8_0, as llama-quantize writes them)
keeps its blocks: the layers' matrices multiply in Ferry's kernels, the token table decodes
only an input's rows, so the model costs about its file's bytes. Its vectors stay within
cosine 0.999 of sentence-transformers' on the folder and of the same file dequantized to
float32; a fused projection whose parts differ in type multiplies part by part."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine import EncoderExecutor, EngineConfig, Tokenizer
from engine.execution.model.linear_kernels import SplitWeight
from engine.kernels.quant import Q4_0, Q8_0, QuantWeight, amx_available
from tests.tools.bert_gguf import write_bert_gguf
from tests.tools.embedding_server import (
    engine_vectors,
    serve_encoder,
    worst_cosine_to_sentence_transformers,
)

NAME = "all-MiniLM-L6-v2-q8"
SENTENCES = ["The cat sits on the mat.", "A dog sleeps by the fire.",
             "Ferry's Über-fast naïve café serves 1,234 cups!",
             "Embeddings place similar sentences near one another, even long ones like this "
             "sentence, which goes on for a while to cover more positions than the others."]
Q8 = {kind: "Q8_0" for kind in ("token_embd", "attn_q", "attn_k", "attn_v", "attn_output",
                                 "ffn_up", "ffn_down")}


@pytest.fixture(scope="module")
def files(embedding_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("bert-blocks")
    return {"f16": write_bert_gguf(embedding_dir, out / "minilm-f16.gguf"),
            "q8": write_bert_gguf(embedding_dir, out / "minilm-q8.gguf", Q8),
            # v in Q4_0 beside q and k in Q8_0: one fused qkv of two block types
            "mixed": write_bert_gguf(embedding_dir, out / "minilm-mixed.gguf",
                                     {**Q8, "attn_v": "Q4_0"})}


def load(path: Path, tmp: Path, dtype: str = "auto") -> EncoderExecutor:
    return EncoderExecutor.from_pretrained(path, EngineConfig(), dtype=dtype, threads=1,
                                           cache_dir=tmp / "cache")


def vectors(executor: EncoderExecutor, texts: list[str]) -> torch.Tensor:
    assert executor.tokenizer_path is not None
    out: torch.Tensor = engine_vectors(executor, Tokenizer(executor.tokenizer_path), texts)
    return out


def worst_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=1).min())


def test_layers_and_token_table_stay_in_blocks(files: dict[str, Path], tmp_path: Path) -> None:
    q8, f16 = load(files["q8"], tmp_path), load(files["f16"], tmp_path)
    w = q8.weights
    assert isinstance(w, type(f16.weights))
    layer = w.layers[0]  # type: ignore[union-attr]
    for m in (layer.qkv_w, layer.o_w, layer.up_w, layer.down_w):
        assert isinstance(m, QuantWeight) and m.qtype == Q8_0
    assert layer.qkv_w.out_features == 3 * 384  # q, k and v joined: one product
    assert isinstance(w.word, QuantWeight)  # type: ignore[union-attr]
    assert q8.block_types == ("Q8_0",) and f16.block_types == ()
    assert q8.describe().startswith("bert: gguf float32, layers in Q8_0 blocks, embeddings "
                                    "of 384")
    # the F16 file's token table stays F16 too; its layers multiply in floats
    assert isinstance(f16.weights.word, QuantWeight)  # type: ignore[union-attr]
    assert not isinstance(f16.weights.layers[0].qkv_w, QuantWeight)  # type: ignore[union-attr]
    # about the file's bytes: the Q8_0 model holds under half the F16 file's
    assert q8.memory_bytes() < 0.6 * files["f16"].stat().st_size
    assert q8.memory_bytes() < 1.1 * files["q8"].stat().st_size


def test_blocks_match_the_dequantized_file_and_batch_as_alone(files: dict[str, Path],
                                                              tmp_path: Path) -> None:
    """int8 activations against the same blocks widened to float32 (dtype float32 keeps
    nothing in blocks); a batch's vectors equal each input's alone (on an AMX CPU they match
    as closely as the file's blocks do: a batch's many rows multiply in AMX tiles with bf16
    activations, one short input's few in int8 lanes)."""
    blocks, wide = load(files["q8"], tmp_path), load(files["q8"], tmp_path, "float32")
    assert wide.block_types == ()
    got, want = vectors(blocks, SENTENCES), vectors(wide, SENTENCES)
    assert worst_cosine(got, want) >= 0.999
    assert not torch.allclose(got, want, atol=1e-6)  # the products did run on the blocks
    for text, together in zip(SENTENCES[:2], got):
        alone = vectors(blocks, [text])[0]
        if amx_available():  # int8 activations against bf16 ones: the blocks' own rounding
            assert worst_cosine(alone[None], together[None]) >= 0.999
        else:
            assert torch.allclose(alone, together, atol=1e-5)


def test_a_fused_projection_of_two_block_types(files: dict[str, Path], tmp_path: Path) -> None:
    """q and k in Q8_0, v in Q4_0: multiplied part by part into one qkv, the same vectors
    as the file's blocks widened to float32 (Q4_0's own rounding is the file's)."""
    mixed = load(files["mixed"], tmp_path)
    qkv = mixed.weights.layers[0].qkv_w  # type: ignore[union-attr]
    assert isinstance(qkv, SplitWeight)
    assert [p.qtype for p in qkv.parts] == [Q8_0, Q8_0, Q4_0]
    assert mixed.block_types == ("Q4_0", "Q8_0")
    want = vectors(load(files["mixed"], tmp_path, "float32"), SENTENCES)
    assert worst_cosine(vectors(mixed, SENTENCES), want) >= 0.999


def test_served_q8_file_matches_sentence_transformers(files: dict[str, Path],
                                                      embedding_dir: Path, in_thread_server: Any,
                                                      tmp_path: Path) -> None:
    running = serve_encoder(in_thread_server, files["q8"], tmp_path / "data", NAME,
                            max_prefill_tokens=1024, cache_dir=tmp_path / "cache")
    try:
        assert worst_cosine_to_sentence_transformers(running.url, NAME, embedding_dir,
                                                     SENTENCES) >= 0.999
        assert "Q8_0 blocks" in running.engine.executor.describe()
        assert running.engine.wait_idle(30)
        snap = running.engine.snapshot()
        assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)
    finally:
        running.stop()

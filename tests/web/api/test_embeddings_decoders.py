"""Decoder-based embedding models (a tiny Qwen3-Embedding-like model with last-token pooling,
a tiny EmbeddingGemma-like one with bidirectional sliding attention, mean pooling and Dense
modules) served through /v1/embeddings: their vectors equal sentence-transformers' on the
same folder, as prefill-only engine work that keeps no KV."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from tests.tools.embedding_decoders import WINDOW, embedding_decoder
from tests.tools.embedding_server import serve_encoder

SENTENCES = ["The cat sits on the mat.",
             "A quick brown fox jumps over the lazy dog, twice, while nobody watches it.",
             "x", "Instruct: find related passages\nQuery: what do embeddings measure?"]


@pytest.fixture(scope="module", params=["qwen3", "gemma3_text"])
def folder(request: pytest.FixtureRequest, embedding_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Path:
    return embedding_decoder(request.param, embedding_dir,
                             tmp_path_factory.mktemp("decoder-embed") / request.param)


@pytest.fixture(scope="module")
def server(folder: Path, in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    running = serve_encoder(in_thread_server, folder, tmp_path_factory.mktemp("data"),
                            folder.name, max_prefill_tokens=48)
    yield running
    running.stop()


def test_vectors_match_sentence_transformers(server: Any, folder: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folder), device="cpu")
    want = torch.tensor(reference.encode(SENTENCES))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    got = torch.tensor([d.embedding for d in client.embeddings.create(
        model=folder.name, input=SENTENCES, encoding_format="float").data])
    assert got.shape == want.shape
    assert min(torch.nn.functional.cosine_similarity(got, want, dim=1).tolist()) >= 0.999
    assert torch.allclose(got.norm(dim=1), torch.ones(len(SENTENCES)), atol=1e-4)
    # the inputs outrun Gemma's sliding window: the window's masking is part of what matched
    assert max(len(server.engine.tokenizer.encode(s)) for s in SENTENCES) > 2 * WINDOW
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)
    rounds = snap.rounds
    assert any(len(r.batch) > 1 for r in rounds)  # inputs batched in one round


def test_executor_reads_the_sentence_transformers_modules(server: Any, folder: Path) -> None:
    executor = server.engine.executor
    cfg = executor.model_config
    if folder.name == "qwen3":
        assert (cfg.pooling, cfg.normalize, cfg.bidirectional, executor.dimensions) == \
            ("lasttoken", True, False, 64)
    else:
        assert (cfg.pooling, cfg.normalize, cfg.bidirectional, executor.dimensions) == \
            ("mean", True, True, 48)
    assert executor.describe().startswith(f"{folder.name}: safetensors float32, embeddings")
    assert server.engine.task == "embed"

"""An XLM-RoBERTa embedding model (as multilingual-e5 and bge-m3 are built: positions counted
from the padding id + 1, one token type, mean pooling): a tiny seeded one built by
transformers and saved by sentence-transformers, served through /v1/embeddings, its vectors
equal to sentence-transformers' on the same folder."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from tests.tools.embedding_decoders import embedding_decoder
from tests.tools.embedding_server import serve_encoder

SENTENCES = ["The cat sits on the mat.",
             "A quick brown fox jumps over the lazy dog, twice, while nobody watches it.",
             "x", "query: Wie spät ist es?"]


@pytest.fixture(scope="module")
def folder(embedding_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return embedding_decoder("xlm_roberta", embedding_dir,
                             tmp_path_factory.mktemp("xlmr") / "xlm_roberta")


@pytest.fixture(scope="module")
def server(folder: Path, in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    running = serve_encoder(in_thread_server, folder, tmp_path_factory.mktemp("data"),
                            "multilingual", max_prefill_tokens=48)
    yield running
    running.stop()


def test_vectors_match_sentence_transformers(server: Any, folder: Path) -> None:
    from sentence_transformers import SentenceTransformer

    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(SENTENCES))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    got = torch.tensor([d.embedding for d in client.embeddings.create(
        model="multilingual", input=SENTENCES, encoding_format="float").data])
    assert got.shape == want.shape
    assert min(torch.nn.functional.cosine_similarity(got, want, dim=1).tolist()) >= 0.999
    executor = server.engine.executor
    assert executor.describe().startswith("roberta: ") and server.engine.task == "embed"
    # 514 learned positions, the first (the padding id, 0, + 1) before any token's
    assert executor.max_context == 513
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.used == snap.kv.reserved == 0 and all(s is None for s in snap.slots)

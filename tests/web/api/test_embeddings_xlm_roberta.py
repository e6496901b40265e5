"""An XLM-RoBERTa embedding model (as multilingual-e5 and bge-m3 are built: positions counted
from the padding id + 1, one token type, mean pooling): a tiny seeded one built by
transformers and saved by sentence-transformers, served through /v1/embeddings, its vectors
equal to sentence-transformers' on the same folder."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.tools.embedding_server import (
    SHARED_SENTENCES,
    encoder_fixtures,
    worst_cosine_to_sentence_transformers,
)

SENTENCES = [*SHARED_SENTENCES, "query: Wie spät ist es?"]
folder, server = encoder_fixtures("xlm_roberta", "multilingual")


def test_vectors_match_sentence_transformers(server: Any, folder: Path) -> None:
    assert worst_cosine_to_sentence_transformers(server.url, "multilingual", folder,
                                                 SENTENCES) >= 0.999
    executor = server.engine.executor
    assert executor.describe().startswith("roberta: ") and server.engine.task == "embed"
    # 514 learned positions, the first (the padding id, 0, + 1) before any token's
    assert executor.max_context == 513
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.used == snap.kv.reserved == 0 and all(s is None for s in snap.slots)

"""An XLM-RoBERTa embedding model (as multilingual-e5 and bge-m3 are built: positions counted
from the padding id + 1, one token type, mean pooling): a tiny seeded one built by
transformers and saved by sentence-transformers, served through /v1/embeddings, its vectors
equal to sentence-transformers' on the same folder; so too from its GGUF as llama.cpp's
converter writes it, with a SentencePiece Unigram vocabulary read back from the file."""
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
    # 513 learned positions, the first (the padding id, 0, + 1) before any token's
    assert executor.max_context == 512
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.used == snap.kv.reserved == 0 and all(s is None for s in snap.slots)


def test_its_gguf_with_a_unigram_vocabulary_matches_sentence_transformers(
        in_thread_server: Any, tmp_path: Path) -> None:
    """The converter's `bert` file of an XLM-RoBERTa folder whose tokenizer is SentencePiece
    Unigram (as every XLM-RoBERTa model's is): the file's pieces and scores give the folder
    tokenizer's ids, alone and as a pair, and the vectors are the folder's."""
    from engine import Tokenizer
    from engine.execution.loading.encoder_gguf import is_cross_encoder_gguf
    from tests.tools.bert_gguf import write_bert_gguf
    from tests.tools.embedding_decoders import embedding_decoder
    from tests.tools.embedding_server import serve_encoder
    from tests.tools.xlm_roberta import unigram_tokenizer_folder

    vocabulary = unigram_tokenizer_folder(tmp_path / "vocabulary")
    folder = embedding_decoder("xlm_roberta", vocabulary, tmp_path / "e5-like")
    gguf = write_bert_gguf(folder, tmp_path / "e5-like.gguf")
    assert not is_cross_encoder_gguf(gguf)
    server = serve_encoder(in_thread_server, gguf, tmp_path / "data", "e5-gguf",
                           cache_dir=tmp_path / "tokenizers")
    try:
        executor = server.engine.executor
        assert executor.tokenizer_path is not None
        mine, theirs = Tokenizer(executor.tokenizer_path), Tokenizer(folder)
        texts = [*SENTENCES, "  two  spaces ", "unseen: Ωmega 東京"]
        assert [mine.encode(t) for t in texts] == [theirs.encode(t) for t in texts]
        assert mine.hf("a query", "a document")["input_ids"] == \
            theirs.hf("a query", "a document")["input_ids"]
        assert worst_cosine_to_sentence_transformers(server.url, "e5-gguf", folder,
                                                     SENTENCES) >= 0.999
        assert executor.describe().startswith("roberta: gguf")
        assert executor.max_context == 512  # the cut table: no padding rows before it
        assert server.engine.wait_idle(30)
        snap = server.engine.snapshot()
        assert snap.kv.used == snap.kv.reserved == 0 and all(s is None for s in snap.slots)
    finally:
        server.stop()


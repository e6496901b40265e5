"""Qwen3-Embedding as a GGUF, as llama.cpp's converter writes it from a sentence-transformers
folder: a `qwen3` text model with `qwen3.pooling_type` (the last token). The tiny seeded
Qwen3 embedding model of the folder tests, written so (all-MiniLM's WordPiece vocabulary
beside it, as its folder has), is served as an embedding model and its vectors equal
sentence-transformers' on the folder; the same file without a pooling type is a chat model."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from engine.execution.loading.encoder_gguf import decoder_pooling_type, is_encoder_gguf
from engine.execution.model.config import UnsupportedModel
from tests.tools.bert_gguf import write_bert_gguf
from tests.tools.embedding_decoders import embedding_decoder
from tests.tools.embedding_server import serve_encoder, worst_cosine_to_sentence_transformers
from tests.tools.hf_gguf import write_gguf

SENTENCES = ["The cat sits on the mat.", "x",
             "A quick brown fox jumps over the lazy dog, twice, while nobody watches it.",
             "Instruct: find related passages\nQuery: what do embeddings measure?"]


def write_qwen3_gguf(folder: Path, vocabulary: Path, out: Path, pooling: int | None) -> Path:
    """The sentence-transformers `folder`'s Qwen3 as a qwen3 GGUF (its matrices Q8_0, as
    Qwen publishes Qwen3-Embedding) with `vocabulary`'s tokenizer (another GGUF's) and
    `pooling` as llama.cpp's pooling type (None: none)."""
    from transformers import Qwen3ForCausalLM, Qwen3Model

    body = Qwen3Model.from_pretrained(str(folder)).eval()
    body.config.tie_word_embeddings = True
    lm = Qwen3ForCausalLM(body.config).eval()
    lm.model.load_state_dict(body.state_dict())
    write_gguf(out, lm, T.Q8_0, tokenizer_of=vocabulary,
               metadata={} if pooling is None else {"qwen3.pooling_type": pooling})
    return out


@pytest.fixture(scope="module")
def files(embedding_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sentence-transformers folder, its GGUF)."""
    where = tmp_path_factory.mktemp("qwen3-embed-gguf")
    folder = embedding_decoder("qwen3", embedding_dir, where / "qwen3")
    vocabulary = write_bert_gguf(embedding_dir, where / "minilm.gguf")
    return folder, write_qwen3_gguf(folder, vocabulary, where / "qwen3-embed.gguf", 3)


@pytest.fixture(scope="module")
def server(files: tuple[Path, Path], in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    running = serve_encoder(in_thread_server, files[1], tmp_path_factory.mktemp("data"),
                            "qwen3-embed", max_prefill_tokens=48,
                            cache_dir=tmp_path_factory.mktemp("tokenizers"))
    yield running
    running.stop()


def test_vectors_match_sentence_transformers_on_the_folder(
        server: Any, files: tuple[Path, Path]) -> None:
    folder, gguf = files
    assert worst_cosine_to_sentence_transformers(server.url, "qwen3-embed", folder,
                                                 SENTENCES) >= 0.999
    executor = server.engine.executor
    assert executor.describe().startswith("qwen3: gguf float32, embeddings of 64 "
                                          "(lasttoken pooling, normalized)")
    # the weights it holds are the file's blocks, in place: what a memory budget counts
    held = sum(int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors)
    assert held * 0.95 <= executor.memory_bytes() <= held * 1.5
    assert server.engine.task == "embed"
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)


def test_only_a_file_that_names_its_pooling_is_an_embedding_model(
        files: tuple[Path, Path], embedding_dir: Path, tmp_path: Path) -> None:
    from engine import EncoderExecutor

    folder, gguf = files
    assert decoder_pooling_type(gguf) == 3 and is_encoder_gguf(gguf)
    vocabulary = write_bert_gguf(embedding_dir, tmp_path / "v.gguf")
    chat = write_qwen3_gguf(folder, vocabulary, tmp_path / "qwen3-chat.gguf", None)
    assert decoder_pooling_type(chat) is None and not is_encoder_gguf(chat)
    # a reranker's (llama.cpp's rank pooling) is refused, not served as a chat model
    rank = write_qwen3_gguf(folder, vocabulary, tmp_path / "qwen3-rank.gguf", 4)
    assert is_encoder_gguf(rank)
    with pytest.raises(UnsupportedModel, match="GGUF reranker"):
        EncoderExecutor.from_pretrained(rank)

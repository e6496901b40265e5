"""A llama.cpp `bert` GGUF (written from all-MiniLM-L6-v2's safetensors with gguf-py's writer,
under llama.cpp's names and keys) served through /v1/embeddings: its vectors equal
sentence-transformers' on the folder, its WordPiece vocabulary tokenizes as the folder's."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from tests.tools.bert_gguf import write_bert_gguf
from tests.tools.embedding_server import serve_encoder

NAME = "all-MiniLM-L6-v2-gguf"
SENTENCES = ["The cat sits on the mat.", "A dog sleeps by the fire.",
             "Ferry's Über-fast naïve café serves 1,234 cups!",
             "東京 is a city; antidisestablishmentarianism."]


@pytest.fixture(scope="module")
def gguf_file(embedding_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bert_gguf(embedding_dir, tmp_path_factory.mktemp("bert-gguf") / "minilm.gguf")


@pytest.fixture(scope="module")
def server(gguf_file: Path, in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    running = serve_encoder(in_thread_server, gguf_file, tmp_path_factory.mktemp("data"), NAME,
                            max_prefill_tokens=1024, cache_dir=tmp_path_factory.mktemp("cache"))
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def everything_back(server: Any) -> Any:
    yield
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)


def test_gguf_embeddings_match_sentence_transformers(server: Any, embedding_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(embedding_dir), device="cpu").encode(SENTENCES)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    got = client.embeddings.create(model=NAME, input=SENTENCES)
    for d, w in zip(got.data, want):
        cos = torch.nn.functional.cosine_similarity(torch.tensor(d.embedding),
                                                    torch.tensor(w), dim=0)
        assert float(cos) >= 0.999
        assert float(torch.tensor(d.embedding).norm()) == pytest.approx(1.0, abs=1e-4)
    assert "gguf" in server.engine.executor.describe()


def test_wordpiece_vocabulary_tokenizes_as_the_folder(server: Any, embedding_dir: Path) -> None:
    from engine import Tokenizer

    folder = Tokenizer(embedding_dir)
    for text in SENTENCES:
        assert server.engine.tokenizer.encode(text) == folder.encode(text)


def test_serving_picks_the_encoder_for_a_bert_gguf(gguf_file: Path, tmp_path: Path) -> None:
    from app.serve import LoadOptions, load_model
    from engine import EncoderExecutor, EngineConfig, is_embedding_model

    assert is_embedding_model(gguf_file)
    executor, config = load_model(str(gguf_file), EngineConfig(max_context=4096),
                                  LoadOptions("auto", "cpu", tmp_path, progress=False))
    assert isinstance(executor, EncoderExecutor) and executor.source == "gguf"
    assert config.max_context == 512 and executor.dimensions == 384


def test_listed_as_an_embedding_model_before_it_loads(gguf_file: Path,
                                                       embedding_dir: Path) -> None:
    """What discovery and `ferry models` read: the architecture, and how it will run."""
    from app.discovery import cannot_run
    from engine import describe_model_file, embedding_task, model_architecture

    for path in (gguf_file, embedding_dir):
        assert model_architecture(path) == "bert" and cannot_run(path) is None
        assert embedding_task(path) == "embed"
    assert describe_model_file(gguf_file) == "bert: embedding model, GGUF"


def test_a_bert_cross_encoder_gguf_is_refused_naming_the_file(gguf_file: Path,
                                                              tmp_path: Path) -> None:
    """llama.cpp's converter drops the pooler a BERT classifier reads: such a file (rank
    pooling, a WordPiece vocabulary) cannot score as its model does."""
    import gguf

    from engine.execution.errors import ModelFileError
    from engine.execution.loading.encoder_gguf import load_bert_gguf

    reader = gguf.GGUFReader(str(gguf_file))
    out = tmp_path / "rank.gguf"
    w = gguf.GGUFWriter(str(out), "bert")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "bert.pooling_type":
            value = int(gguf.PoolingType.RANK)
        kind = field.types[0]
        w.add_key_value(key, value, kind,
                        field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match=r"rank\.gguf: a BERT cross-encoder's GGUF"):
        load_bert_gguf(out, torch.float32, "cpu")

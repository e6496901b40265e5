"""/v1/rerank with a cross-encoder (a sequence classifier with one label: BERT's, as the
ms-marco MiniLM ones, and XLM-RoBERTa's, as bge-reranker): a tiny random one built by
transformers offline, with all-MiniLM-L6-v2's tokenizer; its scores against transformers' own
forward of each (query, document) pair, sigmoid applied."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

NAME = "tiny-reranker"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module", params=["bert", "xlm-roberta"])
def reranker(request: pytest.FixtureRequest, embedding_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )

    from tests.tools.random_hf import random_hf

    sizes: dict[str, Any] = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "intermediate_size": 64,
                             "num_labels": 1, "initializer_range": 0.2}
    if request.param == "bert":
        config: Any = BertConfig(max_position_embeddings=128, **sizes)
        kind: Any = BertForSequenceClassification
    else:  # positions from the padding id + 1 (the tokenizer's [PAD], 0): 128 of them
        config = XLMRobertaConfig(max_position_embeddings=129, type_vocab_size=1,
                                  pad_token_id=0, **sizes)
        kind = XLMRobertaForSequenceClassification
    config.architectures = [kind.__name__]
    torch.manual_seed(0)
    model = random_hf(config, kind)
    folder = tmp_path_factory.mktemp(f"reranker-{request.param}")
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(embedding_dir / name, folder / name)
    return folder, model.eval()


@pytest.fixture(scope="module")
def server(reranker: tuple[Path, Any], in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine import EncoderExecutor, Engine, EngineConfig, Tokenizer
    from web.app import create_app
    from web.config import WebConfig

    folder, _ = reranker
    executor = EncoderExecutor.from_pretrained(folder, threads=1)
    assert executor.task == "score" and "cross-encoder" in executor.describe()
    tokenizer = Tokenizer(folder)
    engine = Engine(EngineConfig(max_context=executor.max_context), executor, tokenizer)
    app = create_app(engine, tokenizer, WebConfig(data_dir=tmp_path_factory.mktemp("rr"),
                                                  model_name=NAME))
    running = in_thread_server(app, engine, "uvicorn-reranker", 60)
    yield running
    running.stop()


def test_scores_are_the_heads(server: Any, reranker: tuple[Path, Any]) -> None:
    from transformers import AutoTokenizer

    folder, model = reranker
    query = "what do cats eat?"
    docs = ["Cats eat fish and meat.", "The stock market fell.", "Dogs bark at night.",
            "word " * 200]  # cut to the context, as sentence-transformers does
    r = httpx.post(server.url + "/v1/rerank", json={"model": NAME, "query": query,
                                                    "documents": docs}, timeout=60)
    assert r.status_code == 200, r.text
    tok = AutoTokenizer.from_pretrained(folder)
    with torch.inference_mode():
        batch = tok([query] * len(docs), docs, padding=True, truncation="only_second",
                    max_length=128, return_tensors="pt")
        if model.config.type_vocab_size == 1:  # XLM-RoBERTa: one token type
            batch.pop("token_type_ids")
        want = torch.sigmoid(model(**batch).logits[:, 0]).tolist()
    results = r.json()["results"]
    assert [x["index"] for x in results] == sorted(range(len(docs)), key=lambda i: -want[i])
    for x in results:
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=1e-4)
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)


def test_a_query_that_fills_the_context_is_a_400(server: Any) -> None:
    """The documents are cut to fit; a query that leaves no room for any of a document is
    refused, naming the field (transformers raises there: it was a 500)."""
    r = httpx.post(server.url + "/v1/rerank", json={
        "model": NAME, "query": "word " * 200, "documents": ["a short document"]}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "query" and "too long" in error["message"]
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)


def test_a_reranker_makes_no_embeddings(server: Any) -> None:
    r = httpx.post(server.url + "/v1/embeddings", json={"model": NAME, "input": "x"},
                   timeout=30)
    assert r.status_code == 400 and "reranker" in r.json()["error"]["message"]
    assert NAME in r.json()["error"]["message"]


def test_an_xlm_roberta_cross_encoder_gguf_scores_as_transformers(
        in_thread_server: Any, tmp_path: Path) -> None:
    """A bge-reranker-like model (XLM-RoBERTa sequence classifier, SentencePiece Unigram
    vocabulary) as llama.cpp's converter writes it: a `bert` file with its head as `cls` and
    `cls.output` and no pooling type. Served as a reranker, each (query, document) pair is
    `<s> query </s></s> document </s>` in the file's own vocabulary, and the scores are
    transformers' on the folder."""
    from engine import describe_model_file, embedding_task
    from engine.execution.loading.encoder_gguf import is_cross_encoder_gguf
    from tests.tools.bert_gguf import write_bert_gguf
    from tests.tools.embedding_server import serve_encoder
    from tests.tools.xlm_roberta import cross_encoder, unigram_tokenizer_folder

    folder = unigram_tokenizer_folder(tmp_path / "bge-reranker-like")
    model = cross_encoder(folder)
    gguf = write_bert_gguf(folder, tmp_path / "bge-reranker-like.gguf")
    assert is_cross_encoder_gguf(gguf) and embedding_task(gguf) == "score"
    assert describe_model_file(gguf) == "bert: reranker, GGUF"
    server = serve_encoder(in_thread_server, gguf, tmp_path / "data", NAME,
                           cache_dir=tmp_path / "tokenizers")
    try:
        assert server.engine.task == "score"
        assert "cross-encoder" in server.engine.executor.describe()
        want = assert_ranks_as(server.url, model, folder, 2e-3)  # F16 matrices
        assert len({round(v, 3) for v in want}) == len(want)  # the documents score apart
        assert server.engine.wait_idle(30)
        snap = server.engine.snapshot()
        assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)
    finally:
        server.stop()


def assert_ranks_as(url: str, model: Any, folder: Path, tolerance: float) -> list[float]:
    """/v1/rerank at `url` ranks and scores four documents (one past the context) as
    transformers does with `model` on `folder`; returns transformers' scores."""
    from tests.tools.xlm_roberta import reference_scores

    query = "what does a ferry carry?"
    docs = ["A ferry carries cars and people across the river.",
            "Stock markets fell sharply on Monday.", "Le chat dort sur le tapis.",
            "word " * 200]  # cut to the context, as sentence-transformers does
    r = httpx.post(url + "/v1/rerank", json={"model": NAME, "query": query,
                                             "documents": docs}, timeout=60)
    assert r.status_code == 200, r.text
    want = reference_scores(model, folder, query, docs)
    results = r.json()["results"]
    assert [x["index"] for x in results] == sorted(range(len(docs)), key=lambda i: -want[i])
    for x in results:
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=tolerance)
    return want

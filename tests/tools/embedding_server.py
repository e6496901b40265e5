"""An embedding or reranking model served for real in this process: its EncoderExecutor, an
Engine and the web app behind uvicorn (the `in_thread_server` fixture runs it)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# texts every tiny encoder's test embeds (each module adds one in its model's own style)
SHARED_SENTENCES = ["The cat sits on the mat.",
             "A quick brown fox jumps over the lazy dog, twice, while nobody watches it.", "x"]


def serve_encoder(in_thread_server: Any, model: Path, data: Path, name: str, *,
                  max_prefill_tokens: int = 512, cache_dir: Path | None = None,
                  **web: Any) -> Any:
    """Serve the encoder at `model` (a folder, or a GGUF whose tokenizer folder goes under
    `cache_dir`) as `name`; `web`: more WebConfig fields. Returns the running server."""
    from engine import EncoderExecutor, Engine, EngineConfig, Tokenizer
    from web.app import create_app
    from web.config import WebConfig

    executor = EncoderExecutor.from_pretrained(model, threads=2, cache_dir=cache_dir)
    config = EngineConfig(max_context=executor.max_context,
                          max_prefill_tokens=max_prefill_tokens)
    tokenizer = Tokenizer(executor.tokenizer_path or model)
    engine = Engine(config, executor, tokenizer)
    app = create_app(engine, tokenizer, WebConfig(data_dir=data, model_name=name, **web))
    return in_thread_server(app, engine, f"uvicorn-{name}", 60)


def encoder_fixtures(kind: str, name: str) -> tuple[Any, Any]:
    """A test module's `folder` (the tiny seeded `kind` model of tests/tools/embedding_decoders,
    saved by sentence-transformers) and `server` (Ferry serving it as `name`) fixtures, both
    module-scoped: `folder, server = encoder_fixtures("nomic_bert", "nomic")`."""
    from tests.tools.embedding_decoders import embedding_decoder

    @pytest.fixture(scope="module")
    def folder(embedding_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return embedding_decoder(kind, embedding_dir, tmp_path_factory.mktemp(kind) / kind)

    @pytest.fixture(scope="module")
    def server(folder: Path, in_thread_server: Any,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        running = serve_encoder(in_thread_server, folder, tmp_path_factory.mktemp("data"), name,
                                max_prefill_tokens=48)
        yield running
        running.stop()

    return folder, server


def worst_cosine_to_sentence_transformers(url: str, name: str, folder: Path,
                                          sentences: list[str]) -> float:
    """The lowest cosine similarity between the vectors of `sentences` that the server at
    `url` gives through the openai SDK and sentence-transformers' on the same folder."""
    import openai
    import torch
    from sentence_transformers import SentenceTransformer

    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(sentences))
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    got = torch.tensor([d.embedding for d in client.embeddings.create(
        model=name, input=sentences, encoding_format="float").data])
    assert got.shape == want.shape
    return float(torch.nn.functional.cosine_similarity(got, want, dim=1).min())


def engine_vectors(executor: Any, tokenizer: Any, texts: list[str]) -> Any:
    """Each text's vector [len(texts), dims] as a real Engine makes them (one round for
    all), every slot and KV page back after it."""
    import torch

    from engine import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(max_context=executor.max_context), executor,
                    tokenizer).start()
    try:
        handles = [engine.submit(tokenizer.encode(t), SamplingParams(max_tokens=0, embed=True))
                   for t in texts]
        finals = [list(h.events(timeout=60))[-1] for h in handles]
        assert engine.wait_idle(30)
        snap = engine.snapshot()
        assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)
    finally:
        engine.stop()
    assert all(f.error is None for f in finals), [f.error for f in finals]
    return torch.tensor([f.extra["embedding"] for f in finals])

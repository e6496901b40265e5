"""all-MiniLM-L6-v2 served beside the default chat model in one server (a model set): each
answers its own kind of request, loaded on demand, and refuses the other's with a 400."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

NAME = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def server(model_dir: Path, embedding_dir: Path, in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine import (
        Budget,
        EncoderExecutor,
        EngineConfig,
        LoadedModel,
        ModelSet,
        ModelSource,
        Tokenizer,
    )
    from tests.tools.model_sources import gguf_source
    from web.app import create_app
    from web.config import WebConfig

    config = EngineConfig(kv_tokens=4096, max_context=2048)

    def load() -> LoadedModel:
        ex = EncoderExecutor.from_pretrained(embedding_dir, config, threads=2)
        cfg = dataclasses.replace(config, max_context=ex.max_context)
        return LoadedModel(ex, cfg, ex.describe(), ex.nbytes)

    embedder = ModelSource(NAME, lambda: Tokenizer(embedding_dir), load, 90 << 20,
                           {"architecture": "bert", "format": "safetensors"})
    chat = gguf_source("chat", model_dir, config, tmp_path_factory.mktemp("cache"))
    loaded, tokenizer = chat.load(), chat.open_tokenizer()
    models = ModelSet([chat, embedder], loaded.config, Budget(2, 8 << 30),
                      preloaded={"chat": (loaded, tokenizer)}, poll=0.05)
    web = WebConfig(data_dir=tmp_path_factory.mktemp("data"), model_name="chat",
                    model_runs=loaded.runs)
    running = in_thread_server(create_app(models, tokenizer, web), models, "uvicorn-mixed", 60)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


def test_each_model_answers_its_own_kind(client: openai.OpenAI, embedding_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    texts = ["The cat sits on the mat.", "Markets fell on Monday."]
    out = client.embeddings.create(model=NAME, input=texts)  # loads it on demand
    want = SentenceTransformer(str(embedding_dir), device="cpu").encode(texts)
    got = torch.tensor([d.embedding for d in out.data])
    assert torch.nn.functional.cosine_similarity(got, torch.tensor(want)).min() >= 0.999
    reply = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert reply.choices[0].message.content


def test_each_refuses_the_others_kind(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="chat", input="hello")
    assert "'chat' is a chat model" in str(err.value)
    client.embeddings.create(model=NAME, input="load it")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}])
    assert f"{NAME!r} is an embedding model" in str(err.value)
    ids = [m.id for m in client.models.list().data]
    assert ids == ["chat", NAME]

"""/v1/embeddings, /v1/rerank and /api/embed against a real server serving all-MiniLM-L6-v2,
through the openai SDK and plain HTTP, compared with sentence-transformers on the same files;
the refusals of a chat model and of an embedding model for each other's requests."""
from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from tests.tools.embedding_server import serve_encoder

NAME = "all-MiniLM-L6-v2"
SENTENCES = ["The cat sits on the mat.", "A dog sleeps by the fire.",
             "Stock markets fell sharply on Monday.", "Ferry runs models on your computer."]


@pytest.fixture(scope="module")
def server(embedding_dir: Path, in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    running = serve_encoder(in_thread_server, embedding_dir, tmp_path_factory.mktemp("emb"), NAME)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none")


@pytest.fixture(scope="module")
def reference(embedding_dir: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embedding_dir), device="cpu")


@pytest.fixture(autouse=True)
def everything_back(server: Any) -> Any:
    """After each test: no request live, every slot and KV position free."""
    yield
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)


def cosine(a: list[float], b: Any) -> float:
    return float(torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=0))


def test_sdk_embeddings_match_sentence_transformers(client: openai.OpenAI,
                                                    reference: Any) -> None:
    want = reference.encode(SENTENCES)
    batch = client.embeddings.create(model=NAME, input=SENTENCES)
    assert [d.index for d in batch.data] == list(range(len(SENTENCES)))
    assert all(cosine(d.embedding, w) >= 0.999 for d, w in zip(batch.data, want))
    one = client.embeddings.create(model=NAME, input=SENTENCES[2])
    assert len(one.data) == 1 and len(one.data[0].embedding) == 384
    assert cosine(one.data[0].embedding, want[2]) >= 0.999
    assert batch.model == NAME and batch.usage.prompt_tokens == batch.usage.total_tokens > 0


def test_base64_equals_float(server: Any, client: openai.OpenAI) -> None:
    floats = client.embeddings.create(model=NAME, input=SENTENCES[:2], encoding_format="float")
    raw = httpx.post(server.url + "/v1/embeddings", json={
        "model": NAME, "input": SENTENCES[:2], "encoding_format": "base64"}, timeout=60).json()
    for d, f in zip(raw["data"], floats.data):
        data = base64.b64decode(d["embedding"])
        assert list(struct.unpack(f"<{len(data) // 4}f", data)) == \
            pytest.approx(f.embedding, abs=1e-7)
    # the SDK asks for base64 by default and decodes it itself
    # (each alone: a batch's padding may round the last bit differently)
    default = client.embeddings.create(model=NAME, input=SENTENCES[0])
    alone = client.embeddings.create(model=NAME, input=SENTENCES[0], encoding_format="float")
    assert default.data[0].embedding == pytest.approx(alone.data[0].embedding, abs=1e-7)


def test_token_ids_equal_text(client: openai.OpenAI, embedding_dir: Path) -> None:
    from engine import Tokenizer

    ids = Tokenizer(embedding_dir).encode(SENTENCES[1])
    by_ids = client.embeddings.create(model=NAME, input=[ids])
    by_text = client.embeddings.create(model=NAME, input=SENTENCES[1])
    assert by_ids.data[0].embedding == pytest.approx(by_text.data[0].embedding, abs=1e-6)
    assert by_ids.usage.prompt_tokens == len(ids)


def test_models_marks_an_embedding_model(client: openai.OpenAI) -> None:
    (card,) = client.models.list().data
    assert card.id == NAME and card.model_extra and card.model_extra["embedding"] is True


@pytest.mark.parametrize("body, param, words", [
    ({"input": ""}, "input", "empty"),
    ({"input": []}, "input", "empty"),
    ({"input": ["fine", ""]}, "input", "input[1]"),
    ({"input": "word " * 400}, "input", "at most 256"),
    ({"input": [[1, 2, 10 ** 6]]}, "input", "vocabulary"),
    ({"input": "hi", "dimensions": 128}, "dimensions", "Matryoshka"),
])
def test_bad_input_is_400_naming_the_field(server: Any, body: dict[str, Any], param: str,
                                           words: str) -> None:
    r = httpx.post(server.url + "/v1/embeddings", json={"model": NAME, **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_dimensions_of_its_own_width_are_fine(client: openai.OpenAI) -> None:
    out = client.embeddings.create(model=NAME, input="hello", dimensions=384)
    assert len(out.data[0].embedding) == 384


def test_chat_to_an_embedding_model_is_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])
    assert NAME in str(err.value) and "embedding model" in str(err.value)
    with pytest.raises(openai.BadRequestError, match=NAME):
        client.completions.create(model=NAME, prompt="hi")


def test_rerank_by_cosine(server: Any, reference: Any) -> None:
    query = "Where is the cat?"
    docs = ["Stock markets fell sharply on Monday.", "The cat sits on the mat.",
            "A dog sleeps by the fire."]
    r = httpx.post(server.url + "/v1/rerank", json={
        "model": NAME, "query": query, "documents": docs, "top_n": 2,
        "return_documents": True}, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    q, d = reference.encode([query]), reference.encode(docs)
    want = torch.nn.functional.cosine_similarity(torch.tensor(q), torch.tensor(d)).tolist()
    order = sorted(range(3), key=lambda i: -want[i])[:2]
    assert [x["index"] for x in results] == order
    assert [x["document"]["text"] for x in results] == [docs[i] for i in order]
    assert [x["relevance_score"] for x in results] == pytest.approx([want[i] for i in order],
                                                                    abs=1e-3)
    bad = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": []},
                     timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "documents"


def test_ollama_embed(server: Any, reference: Any) -> None:
    r = httpx.post(server.url + "/api/embed", json={"model": NAME + ":latest",
                                                    "input": SENTENCES[:2]}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == NAME + ":latest" and len(body["embeddings"]) == 2
    want = reference.encode(SENTENCES[:2])
    assert all(cosine(e, w) >= 0.999 for e, w in zip(body["embeddings"], want))
    # truncate (the default) cuts a long input to the context; without it: a 400
    long = "word " * 400
    assert httpx.post(server.url + "/api/embed", json={"model": NAME, "input": long},
                      timeout=60).status_code == 200
    r = httpx.post(server.url + "/api/embed", json={"model": NAME, "input": long,
                                                    "truncate": False}, timeout=60)
    assert r.status_code == 400 and "at most 256" in r.json()["error"]
    r = httpx.post(server.url + "/api/embed", json={"model": "nope", "input": "x"}, timeout=30)
    assert r.status_code == 404 and "nope" in r.json()["error"]


def test_official_ollama_client(server: Any, reference: Any) -> None:
    import ollama

    client = ollama.Client(host=server.url)
    out = client.embed(model=NAME, input=SENTENCES)
    want = reference.encode(SENTENCES)
    assert len(out.embeddings) == len(SENTENCES)
    assert all(cosine(e, w) >= 0.999 for e, w in zip(out.embeddings, want))
    assert out.prompt_eval_count and out.prompt_eval_count > len(SENTENCES)
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model=NAME, input="")
    assert err.value.status_code == 400 and "empty" in err.value.error


def test_requests_and_dashboard_say_embedding(server: Any, client: openai.OpenAI) -> None:
    raw = client.embeddings.with_raw_response.create(model=NAME, input="hello")
    rid = raw.headers["x-request-id"]
    info = httpx.get(f"{server.url}/v1/requests/{rid}", timeout=30).json()
    assert info["kind"] == "embedding" and info["state"] == "finished"
    assert server.services.tracker.get(rid).label == "embedding"  # the dashboard row's label


def test_embedding_request_to_a_chat_model_is_400_naming_it(make_server: Any) -> None:
    chat = make_server()
    client = openai.OpenAI(base_url=chat.url + "/v1", api_key="none")
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="", input="hello")
    assert "chat model" in str(err.value) and chat.services.config.model_name in str(err.value)


def test_shared_mode_needs_a_token_and_takes_inputs_a_few_at_a_time(
        embedding_dir: Path, in_thread_server: Any, tmp_path: Path) -> None:
    from web.access.users import UserStore

    token = UserStore(tmp_path / "users.json").add("ann", admin=False)
    shared = serve_encoder(in_thread_server, embedding_dir, tmp_path, NAME, shared=True,
                           per_user_limit=2)
    try:
        body = {"model": NAME, "input": SENTENCES}
        assert httpx.post(shared.url + "/v1/embeddings", json=body,
                          timeout=30).status_code == 401
        assert httpx.post(shared.url + "/api/embed", json=body, timeout=30).status_code == 401
        client = openai.OpenAI(base_url=shared.url + "/v1", api_key=token)
        out = client.embeddings.create(**body)  # 4 inputs, 2 at a time: no 429
        assert len(out.data) == len(SENTENCES)
        assert shared.engine.wait_idle(30)
    finally:
        shared.stop()

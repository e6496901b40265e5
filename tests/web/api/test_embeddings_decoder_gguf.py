"""Qwen3-Embedding as a GGUF, as llama.cpp's converter writes it from a sentence-transformers
folder: a `qwen3` text model with `qwen3.pooling_type` (the last token). The tiny seeded
Qwen3 embedding model of the folder tests, written so (all-MiniLM's WordPiece vocabulary
beside it, as its folder has), is served as an embedding model and its vectors equal
sentence-transformers' on the folder; the same file without a pooling type is a chat model,
and as Qwen3-Reranker's GGUF (rank pooling, the head's "yes" and "no" rows) it ranks
documents with transformers' scores."""
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


def causal_lm(folder: Path) -> Any:
    """The sentence-transformers `folder`'s Qwen3 with its embeddings as the LM head (as
    Qwen3-Embedding and Qwen3-Reranker tie them)."""
    from transformers import Qwen3ForCausalLM, Qwen3Model

    body = Qwen3Model.from_pretrained(str(folder)).eval()
    body.config.tie_word_embeddings = True
    lm = Qwen3ForCausalLM(body.config).eval()
    lm.model.load_state_dict(body.state_dict())
    lm.tie_weights()
    return lm


def write_qwen3_gguf(folder: Path, vocabulary: Path, out: Path, pooling: int | None,
                     judge: list[int] | None = None) -> Path:
    """The sentence-transformers `folder`'s Qwen3 as a qwen3 GGUF (its matrices Q8_0, as
    Qwen publishes Qwen3-Embedding) with `vocabulary`'s tokenizer (another GGUF's) and
    `pooling` as llama.cpp's pooling type (None: none); `judge` (the "yes" and "no" ids): a
    reranker's `cls.output`, those rows of the head, and its prompt, as llama.cpp's converter
    writes Qwen3-Reranker."""
    from engine.execution.model.embedding_decoder import RERANK_TEMPLATE

    lm = causal_lm(folder)
    metadata: dict[str, int | str] = {} if pooling is None else {"qwen3.pooling_type": pooling}
    extra = {}
    if judge is not None:
        extra["cls.output.weight"] = lm.lm_head.weight[judge].detach().float().numpy()
        metadata["tokenizer.chat_template.rerank"] = RERANK_TEMPLATE
    write_gguf(out, lm, T.Q8_0, tokenizer_of=vocabulary, metadata=metadata, extra=extra)
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
    from engine import EncoderExecutor, embedding_task

    folder, gguf = files
    assert decoder_pooling_type(gguf) == 3 and is_encoder_gguf(gguf)
    assert embedding_task(gguf) == "embed"
    vocabulary = write_bert_gguf(embedding_dir, tmp_path / "v.gguf")
    chat = write_qwen3_gguf(folder, vocabulary, tmp_path / "qwen3-chat.gguf", None)
    assert decoder_pooling_type(chat) is None and not is_encoder_gguf(chat)
    # rank pooling without the reranker's yes and no rows is refused, naming the tensor
    rank = write_qwen3_gguf(folder, vocabulary, tmp_path / "qwen3-rank.gguf", 4)
    assert is_encoder_gguf(rank) and embedding_task(rank) == "score"
    with pytest.raises(UnsupportedModel, match=r"without cls\.output\.weight"):
        EncoderExecutor.from_pretrained(rank)


QUERY = "what does a river ferry carry"
DOCUMENTS = ["A ferry carries cars and people across the river.", "x",
             "Stock markets fell sharply on Monday, and nobody knew why."]


def rerank_prompts(tokenizer: Any) -> list[Any]:
    """Each of DOCUMENTS in Qwen's rerank prompt with QUERY, as `tokenizer`'s ids [1, T]."""
    import torch

    from engine.execution.model.embedding_decoder import RERANK_TEMPLATE

    before, after = RERANK_TEMPLATE.split("{document}")
    return [torch.tensor([tokenizer.encode(before.replace("{query}", QUERY) + doc + after,
                                           add_special_tokens=False)]) for doc in DOCUMENTS]


def reranked(server: Any) -> dict[int, float]:
    """A reranker server's relevance of each of DOCUMENTS to QUERY, by index."""
    import httpx

    assert server.engine.task == "score"
    r = httpx.post(server.url + "/v1/rerank", timeout=60, json={
        "model": "rerank", "query": QUERY, "documents": DOCUMENTS})
    assert r.status_code == 200, r.text
    return {x["index"]: x["relevance_score"] for x in r.json()["results"]}


def test_a_qwen3_reranker_gguf_scores_as_transformers(
        files: tuple[Path, Path], embedding_dir: Path, in_thread_server: Any,
        tmp_path: Path) -> None:
    """The tiny Qwen3 as Qwen3-Reranker's GGUF: /v1/rerank's relevance of each document is
    transformers' probability of "yes" against "no" after the reranker's prompt."""
    import httpx
    import torch

    from engine import Tokenizer

    folder, _ = files
    reference_tok = Tokenizer(embedding_dir)
    judge = [reference_tok.encode(w, add_special_tokens=False)[0] for w in ("yes", "no")]
    vocabulary = write_bert_gguf(embedding_dir, tmp_path / "v.gguf")
    rank = write_qwen3_gguf(folder, vocabulary, tmp_path / "qwen3-rerank.gguf", 4, judge)
    server = serve_encoder(in_thread_server, rank, tmp_path / "data", "rerank",
                           cache_dir=tmp_path / "tokenizers")
    try:
        assert server.engine.task == "score"
        r = httpx.post(server.url + "/v1/rerank", timeout=60, json={
            "model": "rerank", "query": QUERY, "documents": DOCUMENTS, "top_n": 3})
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        lm = causal_lm(folder)
        want = {}
        for i, ids in enumerate(rerank_prompts(reference_tok)):
            with torch.inference_mode():
                last = lm(input_ids=ids).logits[0, -1]
            want[i] = float(torch.sigmoid(last[judge[0]] - last[judge[1]]))
        assert got == pytest.approx(want, abs=3e-4)  # Q8_0 blocks against floats
        assert len(set(round(v, 4) for v in want.values())) == len(want)  # they differ
        assert [x["index"] for x in r.json()["results"]] == sorted(want, key=lambda i: -want[i])
        # a document past the context is cut to fit it, as the folder rerankers' are
        long = " ".join(["the ferry crosses the river"] * 400)
        r = httpx.post(server.url + "/v1/rerank", timeout=60, json={
            "model": "rerank", "query": QUERY, "documents": [long, ""]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
        r = httpx.post(server.url + "/v1/rerank", timeout=60, json={
            "model": "rerank", "query": QUERY, "documents": [long]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] <= server.engine.executor.max_context
        assert server.engine.wait_idle(30)
    finally:
        server.stop()


def write_embeddinggemma_gguf(folder: Path, vocabulary: Path, out: Path) -> Path:
    """The sentence-transformers `folder` (the "embeddinggemma" layout) as llama.cpp's
    converter writes EmbeddingGemma with --sentence-transformers-dense-modules: a
    `gemma-embedding` text model (matrices F16), `gemma-embedding.pooling_type` mean, and
    the Dense modules' weights as `dense_2` and `dense_3`."""
    from safetensors.torch import load_file
    from transformers import Gemma3ForCausalLM, Gemma3TextModel

    body = Gemma3TextModel.from_pretrained(str(folder)).eval()
    body.config.tie_word_embeddings = True
    lm = Gemma3ForCausalLM(body.config).eval()
    lm.model.load_state_dict(body.state_dict())
    extra = {f"dense_{i}.weight": load_file(str(folder / f"{i}_Dense" / "model.safetensors"))[
        "linear.weight"].float().numpy() for i in (2, 3)}
    write_gguf(out, lm, T.F16, tokenizer_of=vocabulary, arch="gemma-embedding",
               metadata={"gemma-embedding.pooling_type": 1}, extra=extra)
    return out


def test_an_embeddinggemma_gguf_matches_sentence_transformers_on_the_folder(
        embedding_dir: Path, in_thread_server: Any, tmp_path: Path) -> None:
    """EmbeddingGemma's GGUF (`gemma-embedding`): both ways attention within its sliding
    layers' window, mean pooling, the two Dense modules, normalized: the folder's vectors."""
    from tests.tools.embedding_decoders import WINDOW

    folder = embedding_decoder("embeddinggemma", embedding_dir, tmp_path / "embeddinggemma")
    vocabulary = write_bert_gguf(embedding_dir, tmp_path / "v.gguf")
    gguf = write_embeddinggemma_gguf(folder, vocabulary, tmp_path / "embeddinggemma.gguf")
    assert is_encoder_gguf(gguf) and decoder_pooling_type(gguf) == 1
    server = serve_encoder(in_thread_server, gguf, tmp_path / "data", "embeddinggemma",
                           max_prefill_tokens=48, cache_dir=tmp_path / "tokenizers")
    try:
        assert worst_cosine_to_sentence_transformers(server.url, "embeddinggemma", folder,
                                                     SENTENCES) >= 0.999
        executor = server.engine.executor
        assert executor.describe().startswith("gemma-embedding: gguf float32, embeddings of "
                                              "64 (mean pooling, normalized)")
        assert executor.model_config.bidirectional
        assert [tuple(d.weight.shape) for d in executor.weights.dense] == [(256, 64), (64, 256)]
        # the inputs outrun the sliding window: its masking is part of what matched
        assert max(len(server.engine.tokenizer.encode(s)) for s in SENTENCES) > 2 * WINDOW
        assert server.engine.wait_idle(30)
        snap = server.engine.snapshot()
        assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)
    finally:
        server.stop()


def test_a_qwen3_reranker_sequence_classifier_folder_scores_as_transformers(
        files: tuple[Path, Path], embedding_dir: Path, in_thread_server: Any,
        tmp_path: Path) -> None:
    """Qwen3-Reranker converted to a one-label Qwen3ForSequenceClassification (its `score`
    row the LM head's "yes" row minus its "no" row, as the seq-cls folders vLLM and
    sentence-transformers load): served as a reranker over Qwen's prompt, its relevance is
    transformers' sigmoid of the classifier's logit."""
    import torch
    from transformers import Qwen3ForSequenceClassification

    from engine import Tokenizer, embedding_task
    from tests.tools.embedding_decoders import TOKENIZER_FILES

    folder, _ = files
    reference_tok = Tokenizer(embedding_dir)
    yes, no = (reference_tok.encode(w, add_special_tokens=False)[0] for w in ("yes", "no"))
    lm = causal_lm(folder)
    config = lm.config
    config.num_labels, config.pad_token_id = 1, 0
    config.architectures = ["Qwen3ForSequenceClassification"]
    classifier = Qwen3ForSequenceClassification(config).eval()
    classifier.model.load_state_dict(lm.model.state_dict())
    with torch.no_grad():
        classifier.score.weight.copy_(lm.lm_head.weight[yes] - lm.lm_head.weight[no])
    seq_cls = tmp_path / "qwen3-reranker-seq-cls"
    classifier.save_pretrained(seq_cls)
    for name in TOKENIZER_FILES:
        (seq_cls / name).write_bytes((embedding_dir / name).read_bytes())
    assert embedding_task(seq_cls) == "score"
    server = serve_encoder(in_thread_server, seq_cls, tmp_path / "data", "rerank")
    try:
        got = reranked(server)
        with torch.inference_mode():
            want = {i: float(torch.sigmoid(classifier(input_ids=ids).logits[0, 0]))
                    for i, ids in enumerate(rerank_prompts(reference_tok))}
        assert got == pytest.approx(want, abs=1e-4)
        assert len(set(round(v, 4) for v in want.values())) == len(want)  # they differ
        assert server.engine.wait_idle(30)
    finally:
        server.stop()


def test_a_published_qwen3_reranker_folder_scores_as_transformers(
        files: tuple[Path, Path], embedding_dir: Path, in_thread_server: Any,
        tmp_path: Path) -> None:
    """Qwen3-Reranker as Qwen publishes it: a Qwen3ForCausalLM (its own LM head here, as
    the 4B and 8B have) that its model card's title names. Served as a reranker, each
    document's relevance is transformers' probability of "yes" against "no" after Qwen's
    prompt; the same folder without the title or name is a chat model."""
    import httpx
    import torch
    from transformers import Qwen3ForCausalLM

    from engine import Tokenizer, embedding_task
    from tests.tools.embedding_decoders import TOKENIZER_FILES

    folder, _ = files
    reference_tok = Tokenizer(embedding_dir)
    yes, no = (reference_tok.encode(w, add_special_tokens=False)[0] for w in ("yes", "no"))
    body = causal_lm(folder)
    config = body.config
    config.tie_word_embeddings = False
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(7)
    lm = Qwen3ForCausalLM(config).eval()  # a head of its own, apart from the embeddings
    lm.model.load_state_dict(body.model.state_dict())
    assert not torch.equal(lm.lm_head.weight, lm.model.embed_tokens.weight)
    plain, ranker = tmp_path / "tiny-qwen3", tmp_path / "tiny-ranker"
    for where in (plain, ranker):
        lm.save_pretrained(where)
        for name in TOKENIZER_FILES:
            (where / name).write_bytes((embedding_dir / name).read_bytes())
    (ranker / "README.md").write_text("---\nlicense: apache-2.0\n---\n\n# Qwen3-Reranker-0.6B\n"
                                      "\n<p>Judge relevance.</p>\n")
    assert embedding_task(plain) is None  # a chat model
    assert embedding_task(ranker) == "score"
    named = tmp_path / "Qwen3-Reranker-tiny"
    plain.rename(named)
    assert embedding_task(named) == "score"
    server = serve_encoder(in_thread_server, ranker, tmp_path / "data", "rerank")
    try:
        got = reranked(server)
        want = {}
        for i, ids in enumerate(rerank_prompts(reference_tok)):
            with torch.inference_mode():
                last = lm(input_ids=ids).logits[0, -1]
            want[i] = float(torch.softmax(last[[yes, no]], dim=0)[0])  # Qwen's own scoring
        assert got == pytest.approx(want, abs=1e-4)
        assert len(set(round(v, 4) for v in want.values())) == len(want)  # they differ
        # the embeddings' rows would score otherwise: the head's were read
        with torch.inference_mode():
            rows = body.lm_head.weight[yes] - body.lm_head.weight[no]
            tied = {i: float(torch.sigmoid(rows @ h))
                    for i, h in enumerate(hidden_last(lm, reference_tok))}
        assert got != pytest.approx(tied, abs=1e-3)
        r = httpx.post(server.url + "/v1/embeddings", timeout=60,
                       json={"model": "rerank", "input": "x"})
        assert r.status_code == 400, r.text
        assert server.engine.wait_idle(30)
        snap = server.engine.snapshot()
        assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)
    finally:
        server.stop()


def hidden_last(lm: Any, tokenizer: Any) -> list[Any]:
    """The final norm's state at the last token of each rerank prompt."""
    import torch

    out = []
    for ids in rerank_prompts(tokenizer):
        with torch.inference_mode():
            out.append(lm.model(input_ids=ids).last_hidden_state[0, -1])
    return out


@pytest.mark.parametrize(("where", "card", "ranks"), [
    ("models--Qwen--Qwen3-Reranker-0.6B/snapshots/6e9e69", None, True),  # a hub cache
    ("models--Qwen--Qwen3-8B/snapshots/6e9e69", None, False),
    ("q", "# Qwen3-Reranker-4B\n", True),
    ("q", "# Qwen3-8B\nThis is not Qwen3-Reranker.\n", False),
    ("my-qwen3-reranker", None, True),
])
def test_qwen3_reranker_is_told_by_its_name_or_card(
        tmp_path: Path, where: str, card: str | None, ranks: bool) -> None:
    from engine.execution.model.registry import is_decoder_reranker

    folder = tmp_path / where
    folder.mkdir(parents=True)
    if card is not None:
        (folder / "README.md").write_text(card)
    cfg = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    assert is_decoder_reranker(folder, cfg) is ranks
    assert not is_decoder_reranker(folder, {**cfg, "model_type": "llama"})

"""Opt-in (`-m slow`, FERRY_LLAMA_CPP=<a llama.cpp source checkout with build/bin>): an
embedding model's GGUF as llama.cpp's own converter writes it. all-MiniLM-L6-v2's folder is
converted by the checkout's `convert_hf_to_gguf.py` (in the converter venv of
test_llama_cpp_files, FERRY_CONVERT_VENV) to F32 and F16; Ferry loads each file, tokenizes
with the file's WordPiece vocabulary and its vectors equal sentence-transformers' on the
folder (cosine >= 0.999); its Q8_0 and Q4_K_M files (the checkout's llama-quantize) keep
their blocks and give llama.cpp's server's vectors; so too a tiny Qwen3-Embedding-like
folder, converted as a `qwen3` GGUF with its pooling type, and a tiny Qwen3-Reranker-like one
scores as transformers."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.execution.loading.test_llama_cpp_files import (  # noqa: F401 (fixtures)
    converter_python,
    llama_cpp,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SENTENCES = ["The cat sits on the mat.", "Stock markets fell sharply on Monday.",
             "Ferry's naïve café serves 1,234 cups!"]


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_converted_bert_file_matches_sentence_transformers(
        outtype: str, embedding_dir: Path, llama_cpp: Path,  # noqa: F811
        converter_python: Path, tmp_path: Path) -> None:  # noqa: F811

    from engine import EncoderExecutor, Tokenizer

    folder = tmp_path / "all-MiniLM-L6-v2"
    shutil.copytree(embedding_dir, folder)
    out = tmp_path / f"minilm-{outtype}.gguf"
    convert(converter_python, llama_cpp, folder, out, outtype)

    executor = EncoderExecutor.from_pretrained(out, threads=2, cache_dir=tmp_path / "cache")
    assert executor.tokenizer_path is not None
    tokenizer = Tokenizer(executor.tokenizer_path)
    reference = Tokenizer(embedding_dir)
    assert [tokenizer.encode(s) for s in SENTENCES] == [reference.encode(s) for s in SENTENCES]
    assert_vectors_match(executor, tokenizer, embedding_dir)


@pytest.mark.parametrize("kind,blocks", [("Q8_0", ("Q8_0",)),
                                         ("Q4_K_M", ("Q4_K", "Q5_0", "Q6_K", "Q8_0"))])
def test_quantized_file_keeps_its_blocks_and_matches_llama_cpp(
        kind: str, blocks: tuple[str, ...], embedding_dir: Path, llama_cpp: Path,  # noqa: F811
        converter_python: Path, tmp_path: Path) -> None:  # noqa: F811
    """The converter's F16 file quantized by the checkout's llama-quantize: Ferry keeps the
    blocks (the types llama-quantize chose for MiniLM's 384-wide rows), and its vectors equal
    llama.cpp's server's on the same file (a real llama-server --embeddings) and, within the
    file's own rounding, sentence-transformers' on the folder."""
    import httpx

    from benchmarks.processes import end, free_port
    from engine import EncoderExecutor, Tokenizer
    from tests.tools.embedding_server import engine_vectors

    folder = tmp_path / "all-MiniLM-L6-v2"
    shutil.copytree(embedding_dir, folder)
    f16, out = tmp_path / "minilm-f16.gguf", tmp_path / f"minilm-{kind}.gguf"
    convert(converter_python, llama_cpp, folder, f16, "f16")
    done = subprocess.run([str(llama_cpp / "build" / "bin" / "llama-quantize"), str(f16),
                           str(out), kind], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    executor = EncoderExecutor.from_pretrained(out, threads=2, cache_dir=tmp_path / "cache")
    assert executor.block_types == blocks
    assert executor.memory_bytes() < 1.2 * out.stat().st_size
    assert executor.tokenizer_path is not None
    ours = engine_vectors(executor, Tokenizer(executor.tokenizer_path), SENTENCES)

    port = free_port()
    server = subprocess.Popen([str(llama_cpp / "build" / "bin" / "llama-server"),
                               "--embeddings", "-m", str(out), "--host", "127.0.0.1",
                               "--port", str(port), "-t", "2"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        answer = httpx.post(url + "/v1/embeddings", json={"input": SENTENCES}, timeout=60)
        assert answer.status_code == 200, answer.text
        theirs = torch.tensor([d["embedding"] for d in answer.json()["data"]])
    finally:
        end(server, 10)
    assert min(torch.nn.functional.cosine_similarity(ours, theirs, dim=1).tolist()) >= 0.999
    from sentence_transformers import SentenceTransformer

    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(SENTENCES))
    floor = 0.999 if kind == "Q8_0" else 0.99
    assert min(torch.nn.functional.cosine_similarity(ours, want, dim=1).tolist()) >= floor


def assert_vectors_match(executor: Any, tokenizer: Any, folder: Path) -> None:
    """The executor's vectors of SENTENCES, through an Engine, against sentence-transformers'
    on `folder`: cosine at least 0.999 each."""
    from sentence_transformers import SentenceTransformer

    from tests.tools.embedding_server import engine_vectors

    got = engine_vectors(executor, tokenizer, SENTENCES)
    want = torch.tensor(SentenceTransformer(str(folder), device="cpu").encode(SENTENCES))
    assert min(torch.nn.functional.cosine_similarity(got, want, dim=1).tolist()) >= 0.999


def convert(python: Path, root: Path, folder: Path, out: Path, outtype: str,
            *options: str) -> None:
    """`folder` converted to the GGUF `out` by the checkout's convert_hf_to_gguf.py."""
    done = subprocess.run([str(python), str(root / "convert_hf_to_gguf.py"), str(folder),
                           "--outtype", outtype, "--outfile", str(out), *options],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def for_the_converter(folder: Path) -> None:
    """A transformers 5 tokenizer folder as the converter's transformers 4 reads it."""
    tok_file = folder / "tokenizer_config.json"
    fields = {**json.loads(tok_file.read_text()), "tokenizer_class": "GPT2Tokenizer"}
    if isinstance(fields.get("extra_special_tokens"), list):
        fields["additional_special_tokens"] = fields.pop("extra_special_tokens")
    tok_file.write_text(json.dumps(fields))


def test_converted_qwen3_embedding_file_matches_sentence_transformers(
        tokenizer: Any, llama_cpp: Path, converter_python: Path,  # noqa: F811
        tmp_path: Path) -> None:
    """A tiny Qwen3-Embedding-like folder (SmolLM2's BPE vocabulary, which the converter
    knows) converted as Qwen's GGUF is: `qwen3` with `qwen3.pooling_type` from its Pooling
    module. Ferry serves the file as an embedding model with the folder's vectors."""

    from engine import EncoderExecutor, Tokenizer
    from tests.tools.embedding_decoders import TOKENIZER_FILES, embedding_decoder

    vocabulary = tmp_path / "vocabulary"
    copy.deepcopy(tokenizer.hf).save_pretrained(str(vocabulary))
    for name in TOKENIZER_FILES:  # transformers 5 writes no special_tokens_map.json
        if not (vocabulary / name).exists():
            (vocabulary / name).write_text("{}")
    folder = embedding_decoder("qwen3", vocabulary, tmp_path / "qwen3-embed")
    convertible = tmp_path / "convertible"
    shutil.copytree(folder, convertible)
    cfg_file = convertible / "config.json"  # the bare model has no LM head: tied, as Qwen's
    cfg_file.write_text(json.dumps({**json.loads(cfg_file.read_text()),
                                    "tie_word_embeddings": True}))
    for_the_converter(convertible)
    out = tmp_path / "qwen3-embed-f32.gguf"
    convert(converter_python, llama_cpp, convertible, out, "f32")

    executor = EncoderExecutor.from_pretrained(out, threads=2, cache_dir=tmp_path / "cache")
    assert executor.describe().startswith("qwen3: gguf")
    assert_vectors_match(executor, Tokenizer(executor.tokenizer_path or out), folder)


def test_converted_qwen3_reranker_file_scores_as_transformers(
        tokenizer: Any, llama_cpp: Path, converter_python: Path,  # noqa: F811
        in_thread_server: Any, tmp_path: Path) -> None:
    """A tiny Qwen3 causal LM in a folder named as Qwen3-Reranker's (which the converter
    goes by) converted to its GGUF (rank pooling, cls.output of the head's "yes" and "no"
    rows, the rerank prompt): Ferry's relevance of each document is transformers'
    probability of "yes" against "no" after that prompt."""
    import httpx
    from transformers import Qwen3Config

    from engine.execution.model.embedding_decoder import RERANK_TEMPLATE
    from tests.tools.embedding_server import serve_encoder
    from tests.tools.random_hf import random_hf

    folder = tmp_path / "qwen3-reranker-tiny"
    hf_tok = copy.deepcopy(tokenizer.hf)
    cfg = Qwen3Config(vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=512, tie_word_embeddings=True)
    lm = random_hf(cfg)
    lm.save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    for_the_converter(folder)
    out = tmp_path / "qwen3-reranker-f32.gguf"
    convert(converter_python, llama_cpp, folder, out, "f32")

    query = "what does a river ferry carry"
    documents = ["A ferry carries cars and people across the river.",
                 "Stock markets fell sharply on Monday."]
    server = serve_encoder(in_thread_server, out, tmp_path / "data", "rerank",
                           cache_dir=tmp_path / "cache")
    try:
        r = httpx.post(server.url + "/v1/rerank", timeout=60,
                       json={"model": "rerank", "query": query, "documents": documents})
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        # the prompt's ids as the file's tokenizer gives them: a qwen3 file's is read with
        # Qwen2's pre-tokenizer (its "\n\n" is one token), SmolLM2's folder splits it
        served = server.engine.tokenizer
    finally:
        server.stop()
    yes, no = (hf_tok.convert_tokens_to_ids(w) for w in ("yes", "no"))
    before, after = RERANK_TEMPLATE.split("{document}")
    want = {}
    for i, doc in enumerate(documents):
        ids = served.encode(before.replace("{query}", query) + doc + after,
                            add_special_tokens=False)
        with torch.inference_mode():
            last = lm(input_ids=torch.tensor([ids])).logits[0, -1]
        want[i] = float(torch.sigmoid(last[yes] - last[no]))
    assert got == pytest.approx(want, abs=1e-5)


def test_converted_embeddinggemma_file_matches_sentence_transformers(
        tokenizer: Any, llama_cpp: Path, converter_python: Path,  # noqa: F811
        tmp_path: Path) -> None:
    """A tiny EmbeddingGemma-like folder (six layers, the sixth full, sliding ones attending
    both ways; mean pooling; Dense modules out and back) converted with
    --sentence-transformers-dense-modules, as EmbeddingGemma's GGUFs are: `gemma-embedding`
    with `dense_2` and `dense_3`. Ferry serves the file with the folder's vectors."""
    from engine import EncoderExecutor, Tokenizer
    from tests.tools.embedding_decoders import TOKENIZER_FILES, embedding_decoder

    vocabulary = tmp_path / "vocabulary"
    copy.deepcopy(tokenizer.hf).save_pretrained(str(vocabulary))
    for name in TOKENIZER_FILES:
        if not (vocabulary / name).exists():
            (vocabulary / name).write_text("{}")
    folder = embedding_decoder("embeddinggemma", vocabulary, tmp_path / "embeddinggemma")
    convertible = tmp_path / "convertible"
    shutil.copytree(folder, convertible)
    for_the_converter(convertible)
    out = tmp_path / "embeddinggemma-f32.gguf"
    convert(converter_python, llama_cpp, convertible, out, "f32",
            "--sentence-transformers-dense-modules")

    executor = EncoderExecutor.from_pretrained(out, threads=2, cache_dir=tmp_path / "cache")
    assert executor.describe().startswith("gemma-embedding: gguf")
    assert len(executor.weights.dense) == 2
    assert_vectors_match(executor, Tokenizer(executor.tokenizer_path or out), folder)


SPM_CHARSMAP = """
import base64, io, sys
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb
out = io.BytesIO()
spm.SentencePieceTrainer.train(
    sentence_iterator=iter(["The cat sits on the mat."] * 50 + ["full width: \\uff26\\uff55"] * 9),
    model_writer=out, vocab_size=30, model_type="unigram", hard_vocab_limit=False,
    normalization_rule_name="nmt_nfkc")
proto = pb.ModelProto()
proto.ParseFromString(out.getvalue())
sys.stdout.write(base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode())
"""
NFKC_TEXTS = ["Ｆｕｌｌ ｗｉｄｔｈ café", "① ﬁne  spaced\ttext", "Wie spät ist es?"]


@pytest.fixture
def xlmr_vocabulary(converter_python: Path, tmp_path: Path) -> Path:  # noqa: F811
    """An XLM-RoBERTa-like Unigram tokenizer folder carrying SentencePiece's nmt_nfkc
    character map (compiled by sentencepiece in the converter's venv), as real ones do."""
    import base64

    from tests.tools.xlm_roberta import unigram_tokenizer_folder

    done = subprocess.run([str(converter_python), "-c", SPM_CHARSMAP], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return unigram_tokenizer_folder(tmp_path / "vocabulary",
                                    charsmap=base64.b64decode(done.stdout))


def test_converted_xlm_roberta_embedding_file_matches_sentence_transformers(
        xlmr_vocabulary: Path, llama_cpp: Path, converter_python: Path,  # noqa: F811
        tmp_path: Path) -> None:
    """A tiny multilingual-e5-like folder (XLM-RoBERTa, mean pooling, a Unigram vocabulary
    with its character map) converted by llama.cpp's converter: the file's tokenizer gives the
    folder's ids (NFKC-folded text among them) and its vectors are the folder's."""
    from engine import EncoderExecutor, Tokenizer
    from tests.tools.embedding_decoders import embedding_decoder

    folder = embedding_decoder("xlm_roberta", xlmr_vocabulary, tmp_path / "e5-like")
    out = tmp_path / "e5-like-f32.gguf"
    convert(converter_python, llama_cpp, folder, out, "f32")
    executor = EncoderExecutor.from_pretrained(out, threads=2, cache_dir=tmp_path / "cache")
    assert executor.describe().startswith("roberta: gguf")
    assert executor.tokenizer_path is not None
    tokenizer = Tokenizer(executor.tokenizer_path)
    reference = Tokenizer(folder)
    texts = [*SENTENCES, *NFKC_TEXTS]
    assert [tokenizer.encode(t) for t in texts] == [reference.encode(t) for t in texts]
    assert_vectors_match(executor, tokenizer, folder)


def test_converted_xlm_roberta_reranker_file_scores_as_transformers(
        xlmr_vocabulary: Path, llama_cpp: Path, converter_python: Path,  # noqa: F811
        in_thread_server: Any, tmp_path: Path) -> None:
    """A tiny bge-reranker-like folder converted by llama.cpp's converter (`cls` and
    `cls.output`, no pooling type): /v1/rerank's scores are transformers'."""
    from tests.tools.embedding_server import serve_encoder
    from tests.tools.xlm_roberta import cross_encoder
    from tests.web.api.test_rerank_cross_encoder import NAME, assert_ranks_as

    folder = tmp_path / "bge-reranker-like"
    shutil.copytree(xlmr_vocabulary, folder)
    model = cross_encoder(folder)
    out = tmp_path / "bge-reranker-like-f32.gguf"
    convert(converter_python, llama_cpp, folder, out, "f32")
    server = serve_encoder(in_thread_server, out, tmp_path / "data", NAME,
                           cache_dir=tmp_path / "tokenizers")
    try:
        assert server.engine.task == "score"
        assert_ranks_as(server.url, model, folder, 1e-4)
    finally:
        server.stop()

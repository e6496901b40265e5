"""The BERT-family encoder against sentence-transformers on the same files (all-MiniLM-L6-v2):
alone and batched through a real Engine, where embedding requests are prefill-only work that
keeps no KV and never runs beside a split input."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.execution.encoder import EncoderExecutor
from engine.execution.model.linear_kernels import native_bf16_products
from engine.execution.text.tokenizer import Tokenizer
from engine.kernels.quant import amx_available
from engine.runtime.engine import Engine
from engine.scheduling.request import RequestError, SamplingParams

SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog, twice, while nobody watches.",
    "Ferry serves language models on your own computer.",
    "Embeddings place similar sentences near one another.",
    "x",
]
EMBED = SamplingParams(max_tokens=0, embed=True)


@pytest.fixture(scope="module")
def reference(embedding_dir: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embedding_dir), device="cpu")


@pytest.fixture(scope="module")
def executor(embedding_dir: Path) -> EncoderExecutor:
    return EncoderExecutor.from_pretrained(embedding_dir, EngineConfig(), threads=1)


def cosines(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return torch.nn.functional.cosine_similarity(a, b, dim=1).tolist()


def run_engine(executor: EncoderExecutor, tokenizer: Tokenizer, texts: list[str],
               **config: Any) -> tuple[Engine, list[Any]]:
    engine = Engine(EngineConfig(**{"max_context": executor.max_context, **config}), executor,
                    tokenizer).start()
    try:
        handles = [engine.submit(tokenizer.encode(t), EMBED) for t in texts]
        finals = [list(h.events(timeout=60))[-1] for h in handles]
        assert engine.wait_idle(30)
        snap = engine.snapshot()
        assert snap.kv.free == snap.kv.total  # nothing kept: no KV, no cache entries
    finally:
        engine.stop()
    return engine, finals


def test_config_follows_the_sentence_transformers_files(executor: EncoderExecutor) -> None:
    cfg = executor.model_config
    assert (cfg.pooling, cfg.normalize, cfg.max_seq_length, cfg.hidden_size) == \
        ("mean", True, 256, 384)
    products = " (bf16 products)" if native_bf16_products() else ""
    assert executor.describe().startswith(f"bert: safetensors float32{products}, embeddings "
                                          "of 384")


def test_products_are_bf16_only_where_the_cpu_multiplies_bf16(
        executor: EncoderExecutor, embedding_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dtype auto multiplies in bf16 on a CPU with AVX512-BF16 or AMX (packed bf16 weights,
    float32 between products), within cosine 0.9999 of float32 throughout; dtype float32,
    a FERRY_CPU cap or a CPU without those keeps every product in float32."""
    from engine.execution.cpu import cpu_has_native_bf16
    from engine.execution.model.linear_kernels import native_bf16_products
    from engine.kernels import cpu_level

    tokenizer = Tokenizer(embedding_dir)
    wide = EncoderExecutor.from_pretrained(embedding_dir, EngineConfig(), dtype="float32",
                                           threads=1)
    assert not wide.bf16_products
    flags = cpu_level.cpu_flags() or set()
    assert executor.bf16_products == (native_bf16_products() and (
        bool({"avx512_bf16", "amx_bf16"} & flags) and cpu_level.cap() is None))
    _, narrow = run_engine(executor, tokenizer, SENTENCES)
    _, exact = run_engine(wide, tokenizer, SENTENCES)
    got = torch.tensor([f.extra["embedding"] for f in narrow])
    want = torch.tensor([f.extra["embedding"] for f in exact])
    assert min(cosines(got, want)) >= 0.9999
    if not executor.bf16_products:
        assert torch.allclose(got, want, atol=1e-6)
    # a cap below this CPU's bf16 instructions turns them off
    native_bf16_products.cache_clear()
    cpu_has_native_bf16.cache_clear()
    try:
        monkeypatch.setenv(cpu_level.ENV, "avx2")
        if cpu_level.cap() is not None:
            assert not native_bf16_products()
    finally:
        monkeypatch.delenv(cpu_level.ENV)
        native_bf16_products.cache_clear()
        cpu_has_native_bf16.cache_clear()


def test_engine_embeddings_match_sentence_transformers(executor: EncoderExecutor,
                                                       reference: Any,
                                                       embedding_dir: Path) -> None:
    tokenizer = Tokenizer(embedding_dir)
    want = torch.tensor(reference.encode(SENTENCES))
    # a budget of 40 tokens a round: several rounds, each batching whole inputs only
    engine, finals = run_engine(executor, tokenizer, SENTENCES, max_prefill_tokens=40)
    assert all(f.finish_reason == "length" and f.error is None for f in finals)
    got = torch.tensor([f.extra["embedding"] for f in finals])
    assert min(cosines(got, want)) >= 0.999
    assert torch.allclose(got.norm(dim=1), torch.ones(len(SENTENCES)), atol=1e-5)
    assert [f.usage.prompt_tokens for f in finals] == \
        [len(tokenizer.encode(t)) for t in SENTENCES]
    rounds = engine.snapshot().rounds
    assert any(len(r.batch) > 1 for r in rounds)  # requests batched together
    sizes = [sum(n for _, n in r.batch) for r in rounds]
    assert max(sizes) <= 40


def test_batched_equals_alone(executor: EncoderExecutor, embedding_dir: Path) -> None:
    tokenizer = Tokenizer(embedding_dir)
    _, together = run_engine(executor, tokenizer, SENTENCES)
    alone = [run_engine(executor, tokenizer, [t])[1][0] for t in SENTENCES[:2]]
    # Every step but the products works on an input's own rows. On an AMX CPU the products
    # pick their kernel by the number of rows (oneDNN's bf16 ones, Ferry's in blocks), which
    # round otherwise: a batch's vectors then match each input's alone closely, not exactly
    tol = 1e-3 if amx_available() else 1e-5
    for a, b in zip(alone, together):
        va, vb = torch.tensor(a.extra["embedding"]), torch.tensor(b.extra["embedding"])
        assert torch.allclose(va, vb, atol=tol)
        assert min(cosines(va[None], vb[None])) >= 0.99999


def test_refusals(executor: EncoderExecutor, embedding_dir: Path) -> None:
    tokenizer = Tokenizer(embedding_dir)
    engine = Engine(EngineConfig(max_context=executor.max_context, max_prefill_tokens=64),
                    executor, tokenizer).start()
    try:
        with pytest.raises(RequestError, match="embeddings only"):
            engine.submit(tokenizer.encode("hello"), SamplingParams(max_tokens=4))
        with pytest.raises(RequestError, match="prefill budget"):
            engine.submit(list(range(100, 200)), EMBED)
        with pytest.raises(RequestError, match="context"):
            engine.submit(list(range(100, 400)), EMBED)
        with pytest.raises(RequestError, match="empty"):
            engine.submit([], EMBED)
    finally:
        engine.stop()


@pytest.mark.parametrize("modules, pooling, want", [
    (["Transformer", "Pooling", "Normalize"], {"pooling_mode_cls_token": True}, ("cls", True)),
    (["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True}, ("mean", False)),
    (["Transformer", "Pooling"], {"pooling_mode_lasttoken": True}, ("lasttoken", False)),
])
def test_pooling_follows_modules_json(embedding_dir: Path, tmp_path: Path,
                                      modules: list[str], pooling: dict[str, bool],
                                      want: tuple[str, bool]) -> None:
    import json

    from engine.execution.model.architectures.encoders import bert

    (tmp_path / "config.json").write_text((embedding_dir / "config.json").read_text())
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": i, "name": str(i), "path": "1_Pooling" if m == "Pooling" else "",
         "type": f"sentence_transformers.models.{m}"} for i, m in enumerate(modules)]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    cfg = bert.config_from_folder(tmp_path)
    assert (cfg.pooling, cfg.normalize, cfg.max_seq_length) == (*want, 512)
    hidden = torch.arange(12, dtype=torch.float32).view(4, 3)  # inputs of 1 and 3 rows
    pooled = bert.pool(hidden, cfg, [1, 3])
    rows = {"cls": hidden[[0, 1]], "mean": torch.stack([hidden[0], hidden[1:].mean(0)]),
            "lasttoken": hidden[[0, 3]]}[cfg.pooling]
    assert torch.allclose(pooled, torch.nn.functional.normalize(rows) if cfg.normalize
                          else rows)


def test_unsupported_pooling_is_refused_by_name(embedding_dir: Path, tmp_path: Path) -> None:
    import json

    from engine.execution.model.architectures.encoders import bert
    from engine.execution.model.config import UnsupportedModel

    (tmp_path / "config.json").write_text((embedding_dir / "config.json").read_text())
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(UnsupportedModel, match="pooling_mode_max_tokens"):
        bert.config_from_folder(tmp_path)


def test_native_layers_match_the_torch_ops(executor: EncoderExecutor,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """encode_native (Ferry's attention and add-and-norm kernels between the products; an
    input over SHORT_INPUT tokens in torch's attention) against the plain torch layers, on a
    round of a short, a long and a middling input."""
    from engine.execution.model.architectures.encoders import bert
    from engine.kernels import ops

    if not ops.usable(torch.zeros(1)):
        pytest.skip("Ferry's kernels are not built here")
    cfg = executor.model_config
    assert isinstance(cfg, bert.BertConfig) and isinstance(executor.weights, bert.BertWeights)
    lengths = [7, bert.SHORT_INPUT + 22, 20]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (sum(lengths),), generator=gen)
    positions = torch.cat([torch.arange(n) for n in lengths])
    types = torch.zeros_like(ids)

    def vectors() -> torch.Tensor:
        with torch.inference_mode():
            hidden = bert.encode(executor.weights, cfg, ids, positions, types, lengths)
            return bert.pool(hidden, cfg, lengths)

    native = vectors()
    monkeypatch.setattr(bert.ops, "usable", lambda t: False)
    plain = vectors()
    # the kernels' float32 sums in another order: a bf16 product's input may round otherwise
    assert min(cosines(native, plain)) >= 0.9999
    assert not torch.equal(native, plain)  # the two paths did differ

"""GGUF files written here with gguf-py, laid out as llama.cpp's converter does (attn_q / attn_k
rows permuted), in several block types, loaded in their own blocks and dequantised.

* float path (--dtype float32 on a GGUF) == HF on the dequantised weights (atol 1e-4):
  proves the tensor mapping, the un-permutation and the config read from the metadata;
* quantized path (dtype auto) against the float path: logits within 3% (relative L2 per row:
  activations are quantized to int8 per block of 32); greedy decoding through the engine, one
  request at a time equal to the executor's, batched and chunked to its length, with every
  slot and page free after;
* a 1B-class file (0.44 GB of Q4_0) loads in seconds within file size + KV + 0.6 GB of RSS.
* bad files (truncated, unknown block type, unsupported type, other architecture, shapes that
  disagree with the metadata, a missing tensor) fail at load with the file and tensor named.
"""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.config import EngineConfig
from engine.execution.errors import ModelFileError
from engine.execution.executor import ModelExecutor
from engine.execution.loading.loader import load_model
from engine.execution.model.linear_kernels import SplitWeight
from engine.kernels import quant
from engine.runtime.engine import Engine
from engine.runtime.handle import TextDelta
from engine.scheduling.request import SamplingParams
from tests.tools.engine_runs import assert_all_free, run_all
from tests.tools.hf_gguf import K_QUANTS, llama_cpp_permute, random_blocks
from tests.tools.random_hf import random_hf

MIXED = {"attn_q": T.Q4_K, "attn_k": T.Q4_K, "attn_v": T.Q6_K, "attn_output": T.Q5_K,
         "ffn_gate": T.Q4_0, "ffn_up": T.Q4_1, "ffn_down": T.Q5_0, "token_embd": T.Q8_0,
         "output": T.Q6_K}


def write_gguf(path: Path, hf: torch.nn.Module, types: dict[str, T], default: T = T.Q8_0,
               arch: str = "llama", tweak: dict[str, int] | None = None,
               drop: str | None = None) -> dict[str, torch.Tensor]:
    """`hf`'s weights as a GGUF: each 2-D weight in types[short name] or `default`, vectors
    F32. Returns what the file holds as an HF state dict (gguf-py's dequantisation,
    un-permuted): the reference model's weights."""
    cfg = hf.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf.GGUFWriter(str(path), arch)
    meta = {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": heads, "attention.head_count_kv": kv,
            "vocab_size": cfg.vocab_size, **(tweak or {})}
    for key, value in meta.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_float32(f"{arch}.rope.freq_base", float(cfg.rope_parameters["rope_theta"]))
    w.add_eos_token_id(2)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    rng = np.random.default_rng(0)
    held: dict[str, torch.Tensor] = {}
    for key, value in hf.state_dict().items():
        base, _, kind = key.rpartition(".")
        if base == "lm_head" and cfg.tie_word_embeddings:
            continue
        parts = base.split(".")
        name = top.get(base) or f"blk.{parts[2]}.{per_layer['.'.join(parts[3:])]}"
        short = name.rsplit(".", 1)[-1]
        if f"{name}.{kind}" == drop:
            continue
        value = value.detach().float()
        n_heads = heads if short == "attn_q" else kv if short == "attn_k" else 0
        stored = llama_cpp_permute(value, n_heads) if n_heads else value
        if value.dim() == 1:
            w.add_tensor(f"{name}.{kind}", stored.numpy())
            held[key] = value
            continue
        qtype = types.get(short, default)
        if qtype in K_QUANTS or qtype == T.Q2_K:
            blocks = random_blocks(qtype, *stored.shape, rng) if qtype != T.Q2_K else \
                np.zeros((stored.shape[0], stored.shape[1] // 256 * 84), dtype=np.uint8)
        elif qtype == T.F32:
            blocks = stored.numpy()
        else:
            blocks = gguf.quants.quantize(stored.numpy(), qtype)
        w.add_tensor(f"{name}.{kind}", blocks, raw_dtype=qtype)
        if qtype == T.Q2_K:
            continue
        deq = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(blocks, qtype),
                                                    dtype=np.float32)).reshape(stored.shape)
        if n_heads:  # back to HF's layout
            deq = deq.reshape(n_heads, -1, 2, deq.shape[1]).swapaxes(1, 2).reshape(deq.shape)
        held[key] = deq
    if cfg.tie_word_embeddings:
        held["lm_head.weight"] = held["model.embed_tokens.weight"]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def tiny_hf(tied: bool) -> torch.nn.Module:
    """A Llama whose rows hold whole K-quant blocks (256 values)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, rms_norm_eps=1e-6, initializer_range=0.05,
                      tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    return random_hf(cfg)


@pytest.fixture(scope="module", params=["untied", "tied"])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, torch.nn.Module]:
    """(GGUF path, HF reference model on exactly the weights the file holds)."""
    hf = tiny_hf(request.param == "tied")
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf"
    held = write_gguf(path, hf, MIXED)
    hf.load_state_dict(held, strict=False)
    if hf.config.tie_word_embeddings:
        hf.tie_weights()
    return path, hf


PROMPTS = [[random.Random(i).randrange(3, 320) for _ in range(5 + 3 * i)] for i in range(6)]


def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0]


def test_float_path_matches_hf_on_the_dequantised_weights(written, make_harness) -> None:
    path, hf = written
    h = make_harness(path)  # dtype float32: every tensor dequantised in memory
    assert not h.executor.model.quantized and h.executor.eos_ids == {2}
    reqs = [h.new(p) for p in PROMPTS[:3]]
    h.prefill(reqs)
    h.decode(reqs, 4)
    for req in reqs:
        ref = hf_logits(hf, req.prompt_ids + req.output_ids)
        for pos, row in h.logits[req.id].items():
            torch.testing.assert_close(row, ref[pos], atol=1e-4, rtol=1e-4)


def test_quantized_path_keeps_the_blocks_and_tracks_the_float_path(written,
                                                                  make_harness) -> None:
    path, _ = written
    model = load_model(path, torch.float32, "cpu", "gguf")
    layer = model.model.layers[0]
    qkv, gate_up = layer.self_attn.qkv_proj.weight, layer.mlp.gate_up_proj.weight
    assert isinstance(qkv, SplitWeight)  # Q4_K, Q4_K, Q6_K: separate products
    assert [p.qtype for p in qkv.parts] == [T.Q4_K, T.Q4_K, T.Q6_K]
    assert isinstance(gate_up, SplitWeight)  # Q4_0 + Q4_1
    assert model.model.embed_tokens.weight.qtype == T.Q8_0
    head = model.lm_head.weight
    if model.config.tie_word_embeddings:
        assert head is model.model.embed_tokens.weight  # one copy of the blocks
    else:
        assert head.qtype == T.Q6_K
    # an untouched tensor is a view of the file's map, not a copy
    assert layer.self_attn.o_proj.weight.data.numpy().base is not None
    assert not any(isinstance(p, torch.Tensor) and p.dim() == 2 for p in model.parameters())

    hq, hf_ = make_harness(path, dtype="auto"), make_harness(path)
    assert hq.executor.model.quantized and hq.executor.dtype == torch.float32
    assert hq.executor.pool.dtype == torch.float32
    for h in (hq, hf_):
        reqs = [h.new(p) for p in PROMPTS[:3]]
        h.prefill(reqs)
    for rq, rf in zip(hq.logits.values(), hf_.logits.values()):
        for pos, row in rq.items():
            ref = rf[pos]
            assert (row - ref).norm() / ref.norm() < 0.03, pos


def test_same_block_types_fuse_into_one_weight(tmp_path: Path) -> None:
    hf = tiny_hf(tied=True)
    path = tmp_path / "q8.gguf"
    write_gguf(path, hf, {}, default=T.Q8_0)
    model = load_model(path, torch.float32, "cpu", "gguf")
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    assert isinstance(qkv, quant.QuantWeight) and qkv.out_features == 256 + 2 * 128
    ref = load_model(path, torch.float32, "cpu").model.layers[1].self_attn.qkv_proj.weight
    assert torch.equal(quant.dequantize(qkv), ref)  # q, k un-permuted; v as stored


def _engine_run(path: Path, prompts: list[list[int]], **fields: int) -> list[list[int]]:
    """Greedy tokens of `prompts` through a running engine; every slot and page free after."""
    config = EngineConfig(**{"kv_tokens": 2048, "page_size": 4, **fields})
    ex = ModelExecutor.from_pretrained(path, config, dtype="auto", threads=1)
    engine = Engine(config, ex).start()
    try:
        outs = run_all(engine, prompts)  # STEPS (6) tokens each
        assert_all_free(engine)
        return outs
    finally:
        engine.stop()


def test_engine_decodes_the_quantized_model(written, make_harness) -> None:
    """One request at a time the engine's greedy tokens are the executor's; batched and
    chunked every request runs to its length and everything comes back. (Batched tokens are
    not compared: quant_matmul may take another path for many rows, and a random model's
    greedy choices are near ties.)"""
    path, _ = written
    h = make_harness(path, dtype="auto")
    expected = []
    for p in PROMPTS:
        req = h.new(p)
        h.prefill([req])
        h.decode([req], 5)
        expected.append(req.output_ids)
    assert _engine_run(path, PROMPTS, max_running=1, max_prefill_tokens=512) == expected
    outs = _engine_run(path, PROMPTS, max_running=8, max_prefill_tokens=24)
    assert [len(o) for o in outs] == [6] * len(PROMPTS)
    assert all(0 <= t < 320 for o in outs for t in o)


def test_describe_says_how_it_runs(written) -> None:
    path, _ = written
    ex = ModelExecutor.from_pretrained(path, EngineConfig(kv_tokens=64), dtype="auto", threads=1)
    text = ex.describe()
    assert text.startswith("llama: GGUF ") and " MB" in text and "kernels" in text
    assert "Q4_K" in text and "Q6_K" in text
    flt = ModelExecutor.from_pretrained(path, EngineConfig(kv_tokens=64), dtype="float32",
                                        threads=1)
    assert flt.describe().startswith("llama: GGUF dequantised to float32, ")


def test_quantize_a_float_folder_at_load(tiny_models, make_harness) -> None:
    tiny = tiny_models["llama3"]  # tied head, biases
    h = make_harness(tiny.path, dtype="auto")
    assert not h.executor.model.quantized  # a folder runs as float unless asked
    for name in ("q8_0", "q4_0"):
        model = load_model(tiny.path, torch.float32, "cpu", name)
        assert model.quantized and model.lm_head.weight is model.model.embed_tokens.weight
    config = EngineConfig(page_size=4, kv_tokens=8192, max_running=64)  # as make_harness's
    ex = ModelExecutor.from_pretrained(tiny.path, config, threads=1, quantize="q8_0")
    assert "quantized to Q8_0 at load" in ex.describe()
    hq = make_harness(tiny.path)
    hq.executor = ex
    req = hq.new(PROMPTS[2])
    hq.prefill([req])
    row = hq.logits[req.id][len(PROMPTS[2]) - 1]
    ref = tiny.hf_logits(PROMPTS[2])
    assert (row - ref[-1]).norm() / ref[-1].norm() < 0.05


# --- bad files ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("good") / "good.gguf"
    write_gguf(path, tiny_hf(tied=False), {}, default=T.Q4_0)
    return path


def test_truncated_file(good: Path, tmp_path: Path) -> None:
    bad = tmp_path / "cut.gguf"
    data = good.read_bytes()
    bad.write_bytes(data[:len(data) - 1000])
    with pytest.raises(ModelFileError, match=r"cut\.gguf: tensor output\.weight ends at byte"):
        load_model(bad, torch.float32, "cpu", "gguf")
    bad.write_bytes(data[:100])
    with pytest.raises(ModelFileError, match=r"cut\.gguf: not a readable GGUF"):
        load_model(bad)


def test_unknown_and_unsupported_block_types(good: Path, tmp_path: Path) -> None:
    data = bytearray(good.read_bytes())
    name = b"blk.1.ffn_down.weight"
    at = data.index(name) + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    assert int.from_bytes(data[at:at + 4], "little") == T.Q4_0
    data[at:at + 4] = (99).to_bytes(4, "little")
    bad = tmp_path / "type.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"type\.gguf: tensor blk\.1\.ffn_down\.weight has "
                                             r"block type 99"):
        load_model(bad, torch.float32, "cpu", "gguf")
    q2 = tmp_path / "q2k.gguf"
    write_gguf(q2, tiny_hf(tied=False), {"ffn_up": T.Q2_K})
    with pytest.raises(ModelFileError, match=r"q2k\.gguf: tensor blk\.0\.ffn_up\.weight is in "
                                             r"block type Q2_K"):
        load_model(q2, torch.float32, "cpu", "gguf")


def test_other_architecture_shapes_and_missing_tensors(tmp_path: Path) -> None:
    hf = tiny_hf(tied=False)
    write_gguf(tmp_path / "arch.gguf", hf, {}, arch="falcon")
    with pytest.raises(ModelFileError, match=r"arch\.gguf: architecture 'falcon' is not one"):
        load_model(tmp_path / "arch.gguf", torch.float32, "cpu", "gguf")
    write_gguf(tmp_path / "shape.gguf", hf, {}, tweak={"feed_forward_length": 768})
    with pytest.raises(ModelFileError, match=r"shape\.gguf: tensor blk\.0\.ffn_gate\.weight has "
                                             r"shape \[512, 256\], but the metadata implies "
                                             r"\[768, 256\]"):
        load_model(tmp_path / "shape.gguf")
    write_gguf(tmp_path / "gone.gguf", hf, {}, drop="blk.1.attn_v.weight")
    with pytest.raises(ModelFileError, match=r"gone\.gguf: 1 tensors are missing, e\.g\. "
                                             r"blk\.1\.attn_v\.weight"):
        load_model(tmp_path / "gone.gguf", torch.float32, "cpu", "gguf")


# --- a 1B-class file --------------------------------------------------------------------------

def write_big(path: Path, hidden: int = 2048, layers: int = 16, ff: int = 5632,
              vocab: int = 32000, heads: int = 32, kv: int = 8) -> None:
    """A Llama GGUF of Q4_0 blocks, written fast: one random block row pattern per shape,
    repeated (the weights are nonsense; the file is for load time and memory)."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": layers, "context_length": 2048, "embedding_length": hidden,
                       "feed_forward_length": ff, "attention.head_count": heads,
                       "attention.head_count_kv": kv, "vocab_size": vocab}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_eos_token_id(2)

    def blocks(rows: int, cols: int) -> np.ndarray:
        pattern = gguf.quants.quantize(rng.normal(0, 0.02, (64, cols)).astype(np.float32),
                                       T.Q4_0)
        return np.tile(pattern, (rows // 64, 1))

    norm = np.ones(hidden, dtype=np.float32)
    w.add_tensor("token_embd.weight", blocks(vocab, hidden), raw_dtype=T.Q4_0)
    w.add_tensor("output_norm.weight", norm)
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv * hidden // heads, hidden),
              "attn_v": (kv * hidden // heads, hidden), "attn_output": (hidden, hidden),
              "ffn_gate": (ff, hidden), "ffn_up": (ff, hidden), "ffn_down": (hidden, ff)}
    made = {s: blocks(*s) for s in set(shapes.values())}
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm)
        for name, shape in shapes.items():
            w.add_tensor(f"blk.{i}.{name}.weight", made[shape], raw_dtype=T.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_1b_class_gguf_loads_fast_in_little_memory_and_decodes(tmp_path: Path) -> None:
    path = tmp_path / "big-q4_0.gguf"
    write_big(path)
    size = path.stat().st_size
    assert size > 400e6  # ~0.8B parameters in Q4_0
    from engine.kernels import native

    native.library()  # a first build of the C kernels is not load time
    before = rss_bytes()
    start = time.monotonic()
    config = EngineConfig(max_running=2, kv_tokens=1024, page_size=16)
    ex = ModelExecutor.from_pretrained(path, config, dtype="auto", threads=os.cpu_count())
    load_s = time.monotonic() - start
    engine = Engine(config, ex).start()
    try:
        handle = engine.submit([1, 15, 300, 4000, 77], SamplingParams(max_tokens=4,
                                                                    ignore_eos=True))
        toks = [t for ev in handle.events(timeout=300) if isinstance(ev, TextDelta)
                for t in ev.token_ids]
        assert len(toks) == 4
        grown = rss_bytes() - before
        kv = ex.kv_bytes_per_token() * config.kv_tokens
        assert load_s < 30, load_s
        assert grown < size + kv + 0.6e9, (grown, size, kv)
        assert engine.wait_idle(30)
        snap = engine.snapshot()
        assert snap.free_slots == snap.max_running and snap.kv.used == 0
    finally:
        engine.stop()

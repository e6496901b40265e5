"""`ferry bench` end to end: a real engine and Hugging Face `generate` on a tiny random Llama.

The figures themselves are machine-dependent and not asserted (speed is measured by running
the command, not in tests); what is checked is that every system ran the whole workload, the
report has its rows and ratios, and bad arguments fail at once with a clear message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.bench.profile import MOE, OTHER, PARTS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-llama")
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    return path


def bench(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FERRY_HOME": str(home)}
    ferry = Path(sys.executable).with_name("ferry")  # the venv's entry point
    return subprocess.run([str(ferry), "bench", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_bench_with_hf_baseline_reports_every_system(tiny_llama: Path, tmp_path: Path) -> None:
    done = bench(tmp_path, "--model", str(tiny_llama), "--requests", "4", "--concurrency", "2",
                 "--prompt", "8", "--output", "6", "--baseline", "hf", "--baseline-requests",
                 "2", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # auto: bfloat16 where the CPU has bf16 arithmetic, else float32 (loading.loader)
    from engine.host import cpu_has_native_bf16
    auto = "bfloat16" if cpu_has_native_bf16() else "float32"
    assert report["workload"]["requests"] == 4 and report["dtype"] == auto
    assert report["kernels"]
    systems = [r["system"] for r in report["results"]]
    assert systems[0] == "ferry (continuous batching)"
    assert "ferry, one request alone" in systems
    assert any(s.startswith("hf generate, one at a time") for s in systems)
    assert any(s.startswith("hf generate, static batches") for s in systems)
    for row in report["results"]:
        assert row["output_tok_s"] > 0 and row["itl_p50_ms"] > 0, row
    ferry = report["results"][0]
    assert ferry["requests"] == 4 and 0 <= ferry["scheduler_share_pct"] < 100
    assert set(report["ratios"]) == {"ferry / hf one-at-a-time (output tok/s)",
                                     "single request / hf batch 1 (decode tok/s)",
                                     "ferry / hf static batches (output tok/s)"}
    assert all(v > 0 for v in report["ratios"].values())


def test_bench_table_in_bf16(tiny_llama: Path, tmp_path: Path) -> None:
    done = bench(tmp_path, "--model", str(tiny_llama), "--requests", "3", "--concurrency", "3",
                 "--prompt", "5", "--output", "4", "--dtype", "bfloat16", "--profile")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # --profile: the engine thread's busy samples by part, after the table
    at = next(i for i, line in enumerate(lines) if line.startswith("engine thread, "))
    shares = [float(line.split("%")[0]) for line in lines[at + 1:]]
    parts = [line.split("%", 1)[1].strip() for line in lines[at + 1:]]
    # a run this short is a handful of samples: which parts they fall in is chance (the
    # filing itself: test_bench_profile.py), that they are the profiler's parts is not
    known = {name for name, _ in PARTS} | {MOE, OTHER}
    assert parts and set(parts) <= known and abs(sum(shares) - 100) < 1, lines[at:]
    assert lines[0].startswith("workload: 3 requests, prompt 5, output 4") and \
        "dtype bfloat16" in lines[0] and "CPU kernels" in lines[0]
    assert lines[1].startswith("| system | out tok/s |")
    assert any(line.startswith("| ferry (continuous batching) |") for line in lines)
    assert not any("hf generate" in line for line in lines)  # no baseline asked for


@pytest.mark.parametrize(("args", "message"), [
    (["--requests", "0"], "--requests must be >= 1"),
    (["--concurrency", "-1"], "--concurrency must be >= 1"),
    (["--model", "/no/such/model"], "neither a local path nor a hub id"),
    (["--structured-fraction", "1.5"], "--structured-fraction must be within [0, 1]"),
    (["--speculative", "draft"], "--speculative draft needs --draft-model PATH"),
])
def test_bench_refuses_bad_arguments(args: list[str], message: str, tmp_path: Path) -> None:
    done = bench(tmp_path, *args)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_structured_share_is_spread_evenly() -> None:
    from app.bench.structured import constrained_indices

    assert constrained_indices(32, 0.5) == set(range(0, 32, 2))
    assert constrained_indices(4, 0.0) == set() and constrained_indices(3, 1.0) == {0, 1, 2}
    assert len(constrained_indices(10, 0.25)) == 2


@pytest.mark.model
def test_bench_with_a_structured_share(tmp_path: Path) -> None:
    """The default model (grammars need a real tokenizer), a tiny workload: both runs report,
    with the ratio and the mask times."""
    done = bench(tmp_path, "--requests", "4", "--concurrency", "4", "--prompt", "8",
                 "--output", "6", "--structured-fraction", "0.5", "--no-single", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {r["system"]: r for r in report["results"]}
    structured = rows["ferry, 2 of 4 under a JSON schema"]
    assert structured["output_tok_s"] > 0 and "mask per token p50" in structured["note"]
    assert "None" not in structured["note"]
    assert report["ratios"]["structured / unconstrained (output tok/s)"] > 0


@pytest.mark.model
def test_bench_chat_compares_speculation_on_and_off(tmp_path: Path) -> None:
    """The default model, one short repetition-heavy chat, one round: a row with speculation
    (drafts kept, more than one token per step) and one without (none drafted)."""
    text = ("Repeat exactly: the red fox ran over the hill, the red fox ran over the hill, "
            "the red fox ran over the hill.")
    done = bench(tmp_path, "--chat", text, "--output", "24", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["system"]: r for r in json.loads(done.stdout)["results"]}
    on, off = rows["chat 1, speculative on"], rows["chat 1, speculative off"]
    assert on["accepted_pct"] is not None and on["tokens_per_step"] > 1
    assert off["accepted_pct"] is None and off["tokens_per_step"] == 1
    assert on["output_tok_s"] > 0 and off["output_tok_s"] > 0
    assert on["note"] == "drafter: ngram"


def test_bench_chat_with_a_draft_model(tmp_path: Path) -> None:
    """--speculative draft --draft-model: a small synthetic GGUF (the default model's
    tokenizer and chat template) drafting for itself; the row names the drafter."""
    from gguf import GGMLQuantizationType

    from tests.tools import synthetic_gguf

    model = tmp_path / "small.gguf"
    synthetic_gguf.write(model, hidden=64, layers=2, ff=128, heads=4, kv_heads=2,
                         qtype=GGMLQuantizationType.F16, untied=False)
    done = bench(tmp_path, "--model", str(model), "--speculative", "draft", "--draft-model",
                 str(model), "--chat", "Say hello.", "--output", "16", "--repeats", "1",
                 "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["system"]: r for r in json.loads(done.stdout)["results"]}
    on = rows["chat 1, speculative on"]
    assert on["note"] == "drafter: draft" and on["accepted_pct"] == 100.0
    assert on["tokens_per_step"] > 1

"""Opt-in (`-m slow`, FERRY_LLAMA_CPP=<a llama.cpp source checkout with build/bin>): the files
people have come from llama.cpp's own converter, not from Ferry's test writer. Each family's
tiny seeded model (test_families' configs, with the default model's 49,152-token vocabulary so
the converter has a real tokenizer to write) is saved by transformers and converted by the
checkout's `convert_hf_to_gguf.py`, run in a venv of its own (its pinned transformers 4 and
sentencepiece never enter Ferry's). On llama.cpp's file:

* F32: Ferry's logits equal transformers float32 on the same weights (prefill, a chunked
  prefill past the window, decode);
* F32 and Q8_0: Ferry's perplexity through the API (echo + logprobs, max_tokens 0) is within
  1% of `llama-perplexity` on the same file, over the very tokens llama.cpp scored (read back
  from its `--kl-divergence-base` dump) and by its method: chunks of N_CTX, BOS in front where
  the file asks for one, the second half of each chunk scored.

The converter venv is built once under FERRY_CONVERT_VENV (default: a folder in the temp dir).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.engine.execution.model.test_families import FAMILIES, _compare, _config, _run
from tests.tools import peer_perplexity as peer
from tests.tools.random_hf import random_hf

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
N_CTX = 128
CHUNKS = 6
# sentencepiece 0.2.0: later releases' model protobuf module needs protobuf 5, which the
# converter's transformers 4 does not take (XLM-RoBERTa's conversion imports that module)
CONVERTER_PACKAGES = ["torch==2.13.0", "transformers==4.57.6", "sentencepiece==0.2.0",
                      "protobuf<5", "safetensors", "numpy"]


@pytest.fixture(scope="session")
def llama_cpp() -> Path:
    root = os.environ.get("FERRY_LLAMA_CPP")
    if not root:
        pytest.skip("FERRY_LLAMA_CPP (a llama.cpp checkout with build/bin) is not set")
    path = Path(root)
    for need in ("convert_hf_to_gguf.py", "build/bin/llama-perplexity"):
        if not (path / need).exists():
            pytest.fail(f"{path / need} is missing (tools/build-llama-server.sh builds it)")
    return path


@pytest.fixture(scope="session")
def converter_python() -> Path:
    venv = Path(os.environ.get("FERRY_CONVERT_VENV")
                or Path(tempfile.gettempdir()) / "ferry-convert-venv")
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *CONVERTER_PACKAGES],
                       check=True)
        (venv / ".ready").touch()
    return python


@pytest.fixture(scope="session")
def hf_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer
    gguf = next(model_dir.glob("*.gguf")) if model_dir.is_dir() else model_dir
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request: pytest.FixtureRequest, hf_tokenizer: Any, llama_cpp: Path,
              converter_python: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[str, Any, dict[str, Path]]:
    """The family's model (vocabulary 49,152) and llama.cpp's F32 and Q8_0 files of it."""
    cfg = _config(request.param)
    if request.param in ("mistral", "phi3"):
        # llama.cpp's llama architecture has no window (Mistral v0.2 style); its Phi-3 window
        # is not transformers' (Ferry follows transformers: test_families)
        cfg.sliding_window = None  # type: ignore[attr-defined]
    if request.param == "qwen3_moe":  # its qwen3moe has no dense (mlp_only) layers
        cfg.mlp_only_layers = []  # type: ignore[attr-defined]
    cfg.vocab_size = len(hf_tokenizer)  # type: ignore[attr-defined]
    cfg.bos_token_id, cfg.eos_token_id = (  # type: ignore[attr-defined]
        hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id)
    hf = random_hf(cfg)
    # a neutral name: the file's general.name comes from it, and llama.cpp sets Phi-3's
    # special-token attributes by name ("phi3"), looking up tokens this vocabulary lacks
    folder = tmp_path_factory.mktemp("tiny")
    hf.save_pretrained(folder)
    hf_tokenizer.save_pretrained(folder)
    # as SmolLM2 ships it: transformers 5 names its own backend, which the converter's
    # transformers 4 does not know
    config_file = folder / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()),
                                       "tokenizer_class": "GPT2Tokenizer"}))
    files = {}
    for outtype in ("f32", "q8_0"):
        out = folder / f"{request.param}-{outtype}.gguf"
        done = subprocess.run(
            [str(converter_python), str(llama_cpp / "convert_hf_to_gguf.py"), str(folder),
             "--outtype", outtype, "--outfile", str(out)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        files[outtype] = out
    return request.param, hf, files


def llama_perplexity(llama_cpp: Path, gguf: Path, dump: Path) -> tuple[float, list[int]]:
    """llama-perplexity's final estimate and the tokens it read (from its logits dump)."""
    return peer.llama_perplexity(llama_cpp / "build/bin/llama-perplexity", gguf, N_CTX, CHUNKS,
                                 2, dump)


def ferry_perplexity(url: str, tokens: list[int], bos: int | None) -> float:
    return peer.ferry_perplexity(url, tokens[:CHUNKS * N_CTX], bos, N_CTX)


def test_llama_cpp_converted_file_matches(converted: tuple[str, Any, dict[str, Path]],
                                          llama_cpp: Path, make_harness: Any, make_server: Any,
                                          idle_check: Any, tmp_path: Path) -> None:
    from engine import EngineConfig, ModelExecutor
    name, hf, files = converted

    h = make_harness(files["f32"])  # float32: llama.cpp's layout read back exactly
    _compare(h, copy.deepcopy(hf), _run(h))

    report, ppl = [], {}
    for outtype, gguf in files.items():
        ppl_llama, tokens = llama_perplexity(llama_cpp, gguf, tmp_path / f"{outtype}.bin")
        config = EngineConfig(kv_tokens=4096, max_context=256, max_running=2)
        executor = ModelExecutor.from_pretrained(gguf, config, dtype="auto", progress=False)
        server = make_server(executor=executor, kv_tokens=4096, max_context=256,
                             max_running=2)
        ppl_ferry = ferry_perplexity(server.url, tokens, peer.bos_in_front(gguf))
        idle_check(server.engine)
        server.stop()
        ppl[outtype] = ppl_llama, ppl_ferry
        report.append(f"{name} {outtype}: llama-perplexity {ppl_llama:.4f}, Ferry "
                      f"{ppl_ferry:.4f} ({ppl_ferry / ppl_llama - 1:+.3%})")
    print("\n" + "\n".join(report))
    (llama_f32, ferry_f32), (llama_q8, ferry_q8) = ppl["f32"], ppl["q8_0"]
    assert abs(ferry_f32 / llama_f32 - 1) < 0.01, report
    # Q8_0: both quantize activations to int8 blocks, each its own way; within 1% of
    # llama.cpp, or nearer than llama.cpp to the float file's perplexity
    assert (abs(ferry_q8 / llama_q8 - 1) < 0.01
            or abs(ferry_q8 / ferry_f32 - 1) <= abs(llama_q8 / llama_f32 - 1)), report

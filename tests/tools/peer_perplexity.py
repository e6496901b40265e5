"""Perplexity of one GGUF file by llama.cpp's `llama-perplexity` and by Ferry's API, over the
very tokens llama.cpp scored (read back from its `--kl-divergence-base` dump) and by its
method: chunks of CTX, BOS in front where the file asks for one, each chunk's second half
scored. Ferry runs as `ferry serve --model FILE` (a real server, echo + logprobs,
max_tokens 0). For the benchmark-size files of docs/benchmarks.md:

  .venv/bin/python -m tests.tools.peer_perplexity FILE.gguf \\
      --llama-cpp LLAMA_CPP_DIR [--ctx 1024 --chunks 4 --threads 2]
"""
from __future__ import annotations

import argparse
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from gguf import GGUFReader

from app.paths import HOME_ENV
from tests.tools.waiting import wait_healthy

TEXT = Path(__file__).parents[1] / "data" / "gpl-3.0.txt"


def llama_perplexity(binary: Path, gguf: Path, ctx: int, chunks: int, threads: int,
                     dump: Path) -> tuple[float, list[int]]:
    """llama-perplexity's final estimate and the tokens it read (from its logits dump)."""
    done = subprocess.run(
        [str(binary), "-m", str(gguf), "-f", str(TEXT), "-c", str(ctx), "-b", str(ctx),
         "--chunks", str(chunks), "-t", str(threads), "--kl-divergence-base", str(dump)],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", done.stdout + done.stderr)
    assert found, done.stderr[-3000:]
    with dump.open("rb") as f:
        assert f.read(8) == b"_logits_"
        n_ctx, _n_vocab, n_chunk = struct.unpack("<iii", f.read(12))
        assert (n_ctx, n_chunk) == (ctx, chunks)
        tokens = list(struct.unpack(f"<{n_ctx * n_chunk}i", f.read(4 * n_ctx * n_chunk)))
    return float(found.group(1)), tokens


def bos_in_front(gguf: Path) -> int | None:
    """The BOS id llama.cpp puts at each chunk's start, or None where the file adds none."""
    reader = GGUFReader(str(gguf))

    def value(key: str) -> Any:
        field = reader.fields.get(key)
        return None if field is None else field.contents()

    add = value("tokenizer.ggml.add_bos_token")
    if add is None:  # llama.cpp's default: SentencePiece vocabularies add one, BPE ones do not
        add = value("tokenizer.ggml.model") == "llama"
    return int(value("tokenizer.ggml.bos_token_id")) if add else None


def ferry_perplexity(url: str, tokens: list[int], bos: int | None, ctx: int) -> float:
    first, nll, count = ctx // 2, 0.0, 0
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    for c in range(len(tokens) // ctx):
        chunk = tokens[c * ctx:(c + 1) * ctx]
        if bos is not None:
            chunk[0] = bos
        r = httpx.post(url + "/v1/completions", timeout=1800, json={
            "model": model, "prompt": chunk, "echo": True, "logprobs": 0, "max_tokens": 0})
        assert r.status_code == 200, r.text
        scores = r.json()["choices"][0]["logprobs"]["token_logprobs"]
        # the logits at positions first .. ctx-2 score the tokens after them
        nll -= sum(scores[first + 1:])
        count += ctx - 1 - first
    return math.exp(nll / count)


def serve(gguf: Path, port: int, log: Path, home: Path) -> subprocess.Popen[bytes]:
    ferry = Path(sys.executable).parent / "ferry"
    return subprocess.Popen(
        [str(ferry), "serve", "--model", str(gguf), "--port", str(port), "--no-open",
         "--max-running", "2", "--speculative", "off"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, HOME_ENV: str(home)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--llama-cpp", type=Path, required=True,
                        help="a llama.cpp checkout with build/bin")
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ppl_llama, tokens = llama_perplexity(args.llama_cpp / "build/bin/llama-perplexity",
                                             args.gguf, args.ctx, args.chunks, args.threads,
                                             work / "base.bin")
        url = f"http://127.0.0.1:{args.port}"
        proc = serve(args.gguf, args.port, work / "ferry.log", work)
        try:
            wait_healthy(url + "/v1/models", proc, work / "ferry.log", 600, "ferry", 0.5)
            ppl_ferry = ferry_perplexity(url, tokens, bos_in_front(args.gguf), args.ctx)
        finally:
            proc.terminate()
            proc.wait(60)
    print(f"{args.gguf.name}: {args.chunks} x {args.ctx} tokens (second halves): "
          f"llama-perplexity {ppl_llama:.4f}, Ferry {ppl_ferry:.4f} "
          f"({ppl_ferry / ppl_llama - 1:+.3%})")


if __name__ == "__main__":
    main()

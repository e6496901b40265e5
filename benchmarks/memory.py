"""Resident memory after one chat: Ferry's server, and llama.cpp's beside it, on one model file.

Each server runs alone (one after the other), on a loopback port, with the same context
(Ferry's --kv-tokens, llama-server's -c) and one slot's worth of work: one chat of
--max-tokens tokens. Then its resident size (Rss), anonymous and file-backed parts
(/proc/PID/smaps_rollup) and its peak (VmHWM) are read, and the server is stopped. Ferry's
own split by part (GET /v1/models, `memory`) goes into the record's extra figures.

  python -m benchmarks.memory MODEL.gguf [--context 1024] [--llama-server PATH]
      [--model-name TEXT] [--peer-build TEXT] [--repeat 1] [--record]

Without --record the figures are printed only; with it one record is appended to
benchmarks/records.jsonl (metric "resident MB after one chat"; the peer's figures when
--llama-server is given). Linux only (it reads /proc).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.processes import end, free_port
from benchmarks.records import Record, append, this_cpu
from engine.runtime.engine import FOOTPRINT_TTL

PROMPT = "Tell me, in a few sentences, how a river ferry crosses a strong current."
MB = 1e6


def resident(pid: int) -> dict[str, float]:
    """MB: rss, anonymous, file-backed (rss less anonymous) and the peak (VmHWM)."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    with open(f"/proc/{pid}/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    return {"rss": fields["Rss"] / MB, "anonymous": fields["Anonymous"] / MB,
            "file": (fields["Rss"] - fields["Anonymous"]) / MB, "peak": peak / MB}


def get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(proc: subprocess.Popen[bytes], base: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering")
        try:
            return get(f"{base}/v1/models")
        except (OSError, ValueError):
            time.sleep(0.5)
    raise RuntimeError(f"no answer from {base} in {timeout:.0f} s")


def chat(base: str, model: str, max_tokens: int) -> None:
    body = json.dumps({"model": model, "max_tokens": max_tokens, "temperature": 0,
                       "messages": [{"role": "user", "content": PROMPT}]}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        json.loads(r.read())


def measure(command: list[str], port: int, max_tokens: int, env: dict[str, str],
            timeout: float = 600.0) -> tuple[dict[str, float], Any]:
    """Start a server, one chat, read its memory, stop it -> (figures, its /v1/models)."""
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                models = wait_ready(proc, base, timeout)
            except RuntimeError as exc:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{exc}; its output ended with:\n{tail}") from None
            name = models["data"][0]["id"] if models.get("data") else "default"
            chat(base, name, max_tokens)
            # let freed buffers settle, and outlast the parts' reading that /v1/models
            # reuses for FOOTPRINT_TTL (wait_ready's was taken before the chat read the weights)
            time.sleep(FOOTPRINT_TTL + 0.5)
            figures = resident(proc.pid)
            with contextlib.suppress(OSError, ValueError):
                models = get(f"{base}/v1/models")
            return figures, models
        finally:
            end(proc, 30)


def warm_caches(model: str, env: dict[str, str]) -> None:
    """Build the GGUF's tokenizer folder in the fresh FERRY_HOME first, as a user's first
    start did long ago: converting it is a one-off that is not what a server holds."""
    from app.paths import get_paths
    from engine import gguf_tokenizer_dir, resolve_model_files

    paths = get_paths(env)
    path = resolve_model_files(None if model == "default" else model, paths.models_cache, False)
    if path.is_file():
        gguf_tokenizer_dir(path, paths.tokenizer_cache)


def ferry_command(model: str, context: int, port: int) -> list[str]:
    return [sys.executable, "-c", "from app.cli import main; main()", "serve",
            "--model", model, "--port", str(port), "--kv-tokens", str(context),
            "--no-open", "--no-discover", "--max-running", "1"]


def peer_command(binary: str, model: str, context: int, port: int, threads: int) -> list[str]:
    return [binary, "-m", model, "-c", str(context), "--port", str(port),
            "--host", "127.0.0.1", "-np", "1", "-t", str(threads)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a .gguf file (or 'default')")
    p.add_argument("--context", type=int, default=1024, help="KV positions for both servers")
    p.add_argument("--max-tokens", type=int, default=64, help="the chat's reply length")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary: measure it too")
    p.add_argument("--peer-build", help="the peer's build, e.g. 'b10470, native flags'")
    p.add_argument("--model-name", help="the model as records name it (default: the file)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=1, help="runs of each server")
    p.add_argument("--record", action="store_true", help="append to benchmarks/records.jsonl")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = str(Path(__file__).resolve().parents[1])
    ferry_runs: list[dict[str, float]] = []
    peer_runs: list[dict[str, float]] = []
    parts: Any = None
    with tempfile.TemporaryDirectory(prefix="ferry-memory-") as home:
        env = {**os.environ, "FERRY_HOME": home,
               "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        warm_caches(args.model, env)
        for _ in range(args.repeat):
            port = free_port()
            figures, models = measure(ferry_command(args.model, args.context, port), port,
                                      args.max_tokens, env)
            ferry_runs.append(figures)
            parts = (models.get("data") or [{}])[0].get("memory", parts)
            print("ferry", json.dumps(figures), flush=True)
            if args.llama_server:
                port = free_port()
                figures, _ = measure(peer_command(args.llama_server, args.model, args.context,
                                                  port, args.threads), port, args.max_tokens,
                                     dict(os.environ))
                peer_runs.append(figures)
                print("peer", json.dumps(figures), flush=True)
    if parts:
        print("ferry by part (MB):", {k: round(v / MB, 1) for k, v in parts.items()
                                     if isinstance(v, (int, float))})
    if args.record:
        append(make_record(args, ferry_runs, peer_runs, parts))
    return 0


def make_record(args: argparse.Namespace, ferry: list[dict[str, float]],
                peer: list[dict[str, float]], parts: Any) -> Record:
    cpu, flags = this_cpu(args.threads)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    extra: dict[str, object] = {
        "ferry_peak_mb": [round(r["peak"], 1) for r in ferry],
        "ferry_anonymous_mb": [round(r["anonymous"], 1) for r in ferry],
        "ferry_file_mb": [round(r["file"], 1) for r in ferry]}
    if parts:
        extra["ferry_parts_mb"] = {k: round(v / MB, 1) for k, v in parts.items()
                                   if isinstance(v, (int, float))}
    if peer:
        extra["peer_peak_mb"] = [round(r["peak"], 1) for r in peer]
        extra["peer_anonymous_mb"] = [round(r["anonymous"], 1) for r in peer]
    return Record(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        commit=commit or None, cpu=cpu, cpu_flags=flags,
        ferry_cpu=os.environ.get("FERRY_CPU", "native"),
        model=args.model_name or Path(args.model).name,
        workload=f"one chat of {args.max_tokens} tokens, context {args.context}, one slot",
        metric="resident MB after one chat",
        method="python -m benchmarks.memory (each server alone; /proc/PID/smaps_rollup)",
        ferry=tuple(round(r["rss"], 1) for r in ferry),
        peer="llama.cpp llama-server" if peer else None,
        peer_build=args.peer_build if peer else None,
        peer_figures=tuple(round(r["rss"], 1) for r in peer), extra=extra)


if __name__ == "__main__":
    raise SystemExit(main())

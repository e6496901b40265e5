"""embed: embedding throughput of Ferry against llama.cpp's server on the same GGUF.

  python -m benchmarks.embed --gguf FILE --llama-server PATH [--threads T] [--batch N]
      [--clients C] [--reps R] [--repeat K] [--model-name TEXT] [--peer-build TEXT]
      [--notes TEXT] [--record]

Runs R repetitions; in each, starts each server fresh on loopback in turn (Ferry: `ferry
serve --model FILE`; llama.cpp: `llama-server --embeddings -m FILE`), pinned to the same T
CPUs with T threads, warms it up, runs every workload and stops it; the first server of a
repetition alternates, so that a machine's drift touches both alike. Only one server is up at
a time, and neither carries state from one repetition to the next (llama.cpp's server slows
over a long run).

Workloads, each through /v1/embeddings (float vectors, OpenAI's shape, which both serve):
  * one short text per request (batch 1), K requests one after another;
  * one short text per request from C clients at once (a RAG ingest's many small calls),
    C x K requests, each client sending its next as soon as its last is answered;
  * N short texts in one request (batch N), K requests one after another;
  * one long text per request (~400 tokens, within a BERT model's 512), K requests.
The figure of a repetition is embeddings per second: texts embedded over the wall time of
its K requests. Every short text is distinct (a nonce and its index).

--record appends one record per workload to benchmarks/records.jsonl (benchmarks/records.py);
then `python -m benchmarks.render` updates docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.processes import end, free_port
from benchmarks.records import Record, append, this_commit, this_cpu

PEER = "llama.cpp llama-server --embeddings"
METRIC = "embeddings/s"
WORDS = ("river", "market", "station", "garden", "engine", "window", "letter", "harbor",
         "mountain", "kitchen", "library", "bridge", "forest", "signal", "teacher", "winter")
LONG_WORDS = 300  # ~400 WordPiece tokens: within a BERT model's 512 positions


@dataclass(frozen=True, slots=True)
class Workload:
    name: str  # as the record's workload
    texts: Callable[[int], list[str]]  # request index -> its inputs
    clients: int = 1  # requests in flight at once


def short_text(nonce: str, i: int) -> str:
    words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(8))
    return f"Note {nonce}-{i}: the {words} by the old road."


def long_text(nonce: str, i: int) -> str:
    body = " ".join(WORDS[(i + k * 5) % len(WORDS)] for k in range(LONG_WORDS - 2))
    return f"Report {nonce}-{i}: {body}."


def workloads(batch: int, nonce: str, clients: int = 16) -> list[Workload]:
    return [
        Workload("1 short text a request", lambda r: [short_text(nonce, r)]),
        Workload(f"1 short text a request, {clients} clients at once",
                 lambda r: [short_text(nonce, 10 ** 7 + r)], clients),
        Workload(f"{batch} short texts a request",
                 lambda r: [short_text(nonce, r * batch + i) for i in range(batch)]),
        Workload(f"1 long text (~{LONG_WORDS} words) a request",
                 lambda r: [long_text(nonce, r)]),
    ]


def measure(post: Callable[[list[str]], None], work: Workload, repeat: int,
            offset: int) -> float:
    """Embeddings per second over `repeat` requests of `work` from each of its clients
    (request indexes from `offset`, so no two requests of a run send the same texts)."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [work.texts(r) for r in range(offset * work.clients,
                                            (offset + repeat) * work.clients)]
    start = time.perf_counter()
    if work.clients == 1:
        for texts in batches:
            post(texts)
    else:
        with ThreadPoolExecutor(work.clients) as pool:
            list(pool.map(post, batches))
    return sum(map(len, batches)) / (time.perf_counter() - start)


# --- servers --------------------------------------------------------------------------------

def pinned(threads: int) -> Callable[[], None]:
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    return lambda: os.sched_setaffinity(0, cpus)


@contextlib.contextmanager
def server(command: list[str], ready_url: str, threads: int, env: dict[str, str],
           log: Path, timeout: float = 300.0) -> Iterator[int]:
    """The command running (pinned to `threads` CPUs) until `ready_url` answers 200 (its
    process id); stopped (terminated, then killed) on leaving."""
    import httpx

    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=pinned(threads))
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{command[0]} exited with {proc.returncode}; see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"{command[0]} did not answer within {timeout:.0f} s")
            time.sleep(0.5)
        yield proc.pid
    finally:
        end(proc, 20)


def poster(base: str, model: str) -> Callable[[list[str]], None]:
    import httpx

    client = httpx.Client(base_url=base, timeout=600)

    def post(texts: list[str]) -> None:
        r = client.post("/v1/embeddings", json={"model": model, "input": texts,
                                                "encoding_format": "float"})
        r.raise_for_status()
        data = r.json()["data"]
        if len(data) != len(texts):
            raise SystemExit(f"{base}: {len(data)} vectors for {len(texts)} inputs")
    return post


def peer_version(binary: Path) -> str:
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown build"
    line = next((x for x in (done.stdout + done.stderr).splitlines() if "version" in x), "")
    return line.strip() or "unknown build"


# --- records --------------------------------------------------------------------------------

def make_records(results: dict[str, tuple[list[float], list[float]]], *, model: str,
                 threads: int, batch: int, repeat: int, peer_build: str, notes: str,
                 cpu: tuple[str, tuple[str, ...]] | None = None) -> list[Record]:
    """One record per workload: Ferry's and the peer's figure of each repetition."""
    name, flags = cpu or this_cpu(threads)
    slots = max(8, batch)
    method = (f"benchmarks/embed.py: /v1/embeddings (float), {repeat} requests a "
              f"repetition one after another (from each client where several), batch "
              f"{batch} for the batched workload; "
              f"Ferry --max-running {slots} --max-prefill-tokens 8192, llama-server -np "
              f"{slots} -c/-b/-ub {512 * slots}; both pinned to the same {threads} CPUs "
              f"with {threads} threads; each server started fresh for each repetition, one "
              f"up at a time, alternating")
    date = _dt.datetime.now(_dt.UTC).date().isoformat()
    return [Record(date=date, commit=this_commit(), cpu=name, cpu_flags=flags,
                   ferry_cpu=os.environ.get("FERRY_CPU", "native"), model=model,
                   workload=workload, metric=METRIC, method=method,
                   ferry=tuple(round(x, 2) for x in ferry), peer=PEER, peer_build=peer_build,
                   peer_figures=tuple(round(x, 2) for x in peer), notes=notes)
            for workload, (ferry, peer) in results.items()]


# --- main -----------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.embed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, required=True, help="the embedding model's GGUF file")
    p.add_argument("--llama-server", type=Path, required=True, help="llama.cpp's llama-server")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--batch", type=int, default=64, help="texts in a batched request")
    p.add_argument("--clients", type=int, default=16,
                   help="clients at once in the concurrent workload")
    p.add_argument("--reps", type=int, default=3, help="repetitions on each server")
    p.add_argument("--repeat", type=int, default=5, help="requests in a repetition")
    p.add_argument("--model-name", default=None, help="the model, as the record names it")
    p.add_argument("--peer-build", default=None, help="default: llama-server --version")
    p.add_argument("--notes", default="")
    p.add_argument("--record", action="store_true", help="append to benchmarks/records.jsonl")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, tuple[list[float], list[float]]]:
    root = Path(__file__).resolve().parents[1]
    home = Path(tempfile.mkdtemp(prefix="ferry-embed-bench-"))
    ferry_port, peer_port = free_port(), free_port()
    env = {**os.environ, "FERRY_HOME": str(home), "PYTHONPATH": str(root)}
    ferry_cmd = [sys.executable, "-c", "import sys; from app.cli import main; "
                 "sys.exit(main(sys.argv[1:]))", "serve", "--model", str(args.gguf),
                 "--port", str(ferry_port), "--no-open", "--no-discover",
                 "--max-running", str(max(8, args.batch)), "--kv-tokens", "16384",
                 "--max-prefill-tokens", "8192"]
    ctx = 512 * max(8, args.batch)
    peer_cmd = [str(args.llama_server), "--embeddings", "-m", str(args.gguf), "--host",
                "127.0.0.1", "--port", str(peer_port), "-t", str(args.threads), "-tb",
                str(args.threads), "-c", str(ctx), "-b", str(ctx), "-ub", str(ctx), "-np",
                str(max(8, args.batch))]
    model = args.gguf.stem
    nonce = secrets.token_hex(3)
    works = workloads(args.batch, nonce, args.clients)
    results: dict[str, tuple[list[float], list[float]]] = {w.name: ([], []) for w in works}
    sides = [(ferry_cmd, f"http://127.0.0.1:{ferry_port}", "/v1/models", "ferry"),
             (peer_cmd, f"http://127.0.0.1:{peer_port}", "/health", "llama.cpp")]
    for rep in range(args.reps):
        # each server fresh for each repetition (llama.cpp's slows over a long run), one up
        # at a time, the first alternating
        for side in (0, 1) if rep % 2 == 0 else (1, 0):
            command, base, ready, name = sides[side]
            with server(command, base + ready, args.threads, env, home / f"{name}.log"):
                post = poster(base, model)
                for w in works:  # warm-up: one request of each workload, not counted
                    post(w.texts(10 ** 6 + rep))
                for w in works:
                    figure = measure(post, w, args.repeat, (rep * 2 + side) * args.repeat)
                    results[w.name][side].append(figure)
                    print(f"rep {rep + 1} {name} {w.name}: {figure:.1f} {METRIC}", flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    records = make_records(results, model=args.model_name or args.gguf.name,
                           threads=args.threads, batch=args.batch, repeat=args.repeat,
                           peer_build=args.peer_build or peer_version(args.llama_server),
                           notes=args.notes)
    for record in records:
        print(record.to_json())
        if args.record:
            append(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())


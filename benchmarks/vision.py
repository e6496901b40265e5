"""vision: one picture and a short question, Ferry against llama.cpp's server with `--mmproj`
on the same text GGUF and projector file.

  python -m benchmarks.vision --gguf TEXT.gguf --mmproj MMPROJ.gguf --llama-server PATH
      [--threads T] [--reps R] [--tokens N] [--beside] [--model-name TEXT]
      [--peer-build TEXT] [--notes TEXT] [--mmproj-quantize q8_0|none] [--record]

Starts both servers on loopback, each pinned to the same T CPUs with T threads and one slot
(Ferry: `ferry serve --model TEXT.gguf --mmproj MMPROJ.gguf`; llama.cpp: `llama-server -m
TEXT.gguf --mmproj MMPROJ.gguf`), warms each up with one picture, then alternates one request
on Ferry and one on llama.cpp, R times each, so that a machine's drift touches both alike.
Each request is a new picture (a 640 x 480 PNG of its own; nothing cached from an earlier
one) and a short question, streamed, greedy, N tokens (ignore_eos). Ferry's requests run with
speculative decoding off: the figures are plain decoding's, as llama.cpp's.

Figures: time to first token (the picture encoded and the prompt read), decode tokens/s
after it (N - 1 tokens over the time from the first to the last), and each server's peak
resident memory (VmHWM) at the end.

With --beside, each server has two slots and the figure is what a picture costs the other
user: a text reply streams (long enough to outlast the picture), a picture request is sent
once it does, and the figure is the longest gap between the text reply's tokens from then to
the picture's first token. Each server runs its default scheduling.

--record appends three records (one with --beside; benchmarks/records.py); `python -m
benchmarks.render` then updates docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import base64
import datetime as _dt
import io
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.embed import peer_version, server
from benchmarks.processes import free_port
from benchmarks.records import Record, append, this_commit, this_cpu

PEER = "llama.cpp llama-server --mmproj"
QUESTION = "What is in this picture? Describe it in one sentence."
CONTEXT = 4096


def picture(seed: int) -> str:
    """A 640 x 480 PNG of smooth random colour (a photo's size class), as a data URL."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((640, 480), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def stream(base: str, content: object, tokens: int, ferry: bool,
           stop: threading.Event | None = None) -> Iterator[float]:
    """The arrival time of each piece of a streamed greedy chat reply (closed early, which
    cancels it, once `stop` is set)."""
    import httpx

    body: dict[str, object] = {
        "model": "", "stream": True, "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True, "messages": [{"role": "user", "content": content}]}
    if ferry:
        body["speculative"] = False
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise SystemExit(f"{base}: {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            if stop is not None and stop.is_set():
                return
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                yield time.perf_counter()


def with_picture(seed: int) -> list[dict[str, object]]:
    return [{"type": "image_url", "image_url": {"url": picture(seed)}},
            {"type": "text", "text": QUESTION}]


def ask(base: str, seed: int, tokens: int, ferry: bool) -> tuple[float, float]:
    """(seconds to the first token, decode tokens/s after it) of one streamed request."""
    start = time.perf_counter()
    times = list(stream(base, with_picture(seed), tokens, ferry))
    if len(times) < 2:
        raise SystemExit(f"{base}: the reply streamed {len(times)} pieces")
    return times[0] - start, (tokens - 1) / (times[-1] - times[0])


def beside(base: str, seed: int, ferry: bool) -> float:
    """The longest gap (s) between a text reply's tokens from sending a picture request,
    once that reply streams, to the reply's first token after the picture's first token."""
    stop, times, ended = threading.Event(), [], threading.Event()

    def text() -> None:
        for t in stream(base, "Tell a long story about a ship and its crew.", 3000, ferry,
                        stop):
            times.append(t)
        if not stop.is_set():
            ended.set()

    worker = threading.Thread(target=text)
    worker.start()
    while len(times) < 8 and worker.is_alive():
        time.sleep(0.05)
    sent = time.perf_counter()
    first = next(stream(base, with_picture(seed), 2, ferry))
    while (not times or times[-1] <= first) and worker.is_alive():  # the reply's next token
        time.sleep(0.01)
    stop.set()
    worker.join()
    if ended.is_set():
        raise SystemExit(f"{base}: the text reply ended before the picture's first token")
    seen = [sent] + [t for t in times if t > sent]
    upto = next((i for i, t in enumerate(seen) if t > first), len(seen) - 1)
    return max(b - a for a, b in itertools.pairwise(seen[:upto + 1]))


def peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1e3


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vision", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, required=True, help="the text model's GGUF file")
    p.add_argument("--mmproj", type=Path, required=True, help="its projector file")
    p.add_argument("--llama-server", type=Path, required=True, help="llama.cpp's llama-server")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--reps", type=int, default=3, help="requests on each server")
    p.add_argument("--tokens", type=int, default=32, help="tokens each reply decodes")
    p.add_argument("--beside", action="store_true",
                   help="measure the gap a picture makes in another reply's tokens instead")
    p.add_argument("--model-name", default=None, help="the model, as the records name it")
    p.add_argument("--peer-build", default=None, help="default: llama-server --version")
    p.add_argument("--notes", default="")
    p.add_argument("--mmproj-quantize", default="q8_0", choices=("q8_0", "none"),
                   help="Ferry's tower: quantized to Q8_0 at load (its default) or as the "
                        "projector file stores it")
    p.add_argument("--record", action="store_true", help="append to benchmarks/records.jsonl")
    return p.parse_args(argv)


Figures = dict[str, list[float]]


def run(args: argparse.Namespace) -> tuple[Figures, Figures]:
    root = Path(__file__).resolve().parents[1]
    home = Path(tempfile.mkdtemp(prefix="ferry-vision-bench-"))
    ferry_port, peer_port = free_port(), free_port()
    env = {**os.environ, "FERRY_HOME": str(home), "PYTHONPATH": str(root)}
    slots = 2 if args.beside else 1
    ferry_cmd = [sys.executable, "-c", "import sys; from app.cli import main; "
                 "sys.exit(main(sys.argv[1:]))", "serve", "--model", str(args.gguf),
                 "--mmproj", str(args.mmproj), "--port", str(ferry_port), "--no-open",
                 "--no-discover", "--max-running", str(slots),
                 "--kv-tokens", str(CONTEXT * slots), "--mmproj-quantize", args.mmproj_quantize]
    peer_cmd = [str(args.llama_server), "-m", str(args.gguf), "--mmproj", str(args.mmproj),
                "--host", "127.0.0.1", "--port", str(peer_port), "-t", str(args.threads),
                "-tb", str(args.threads), "-c", str(CONTEXT * slots), "-np", str(slots)]
    ferry_base, peer_base = f"http://127.0.0.1:{ferry_port}", f"http://127.0.0.1:{peer_port}"
    figures: tuple[Figures, Figures] = ({"ttft": [], "decode": [], "gap": []},
                                        {"ttft": [], "decode": [], "gap": []})
    with server(ferry_cmd, ferry_base + "/healthz", args.threads, env, home / "ferry.log",
                timeout=900) as ferry_pid, \
            server(peer_cmd, peer_base + "/health", args.threads, env, home / "peer.log",
                   timeout=900) as peer_pid:
        for base, is_ferry in ((ferry_base, True), (peer_base, False)):  # warm-up
            ask(base, 10_000 + is_ferry, 4, is_ferry)
        for rep in range(args.reps):
            for (base, is_ferry), into in zip(((ferry_base, True), (peer_base, False)),
                                              figures):
                if args.beside:
                    into["gap"].append(beside(base, rep, is_ferry))
                    print(f"{'ferry' if is_ferry else 'llama'} rep {rep}: longest gap "
                          f"{into['gap'][-1]:.2f} s", flush=True)
                    continue
                ttft, rate = ask(base, rep, args.tokens, is_ferry)
                into["ttft"].append(ttft)
                into["decode"].append(rate)
                print(f"{'ferry' if is_ferry else 'llama'} rep {rep}: first token "
                      f"{ttft:.2f} s, decode {rate:.2f} tok/s", flush=True)
        for pid, into in ((ferry_pid, figures[0]), (peer_pid, figures[1])):
            into["peak"] = [peak_mb(pid)]
    return figures


def make_records(ferry: Figures, peer: Figures, *, model: str, threads: int, tokens: int,
                 peer_build: str, notes: str, beside: bool = False,
                 tower: str = "q8_0") -> list[Record]:
    name, flags = this_cpu(threads)
    method = (f"benchmarks/vision.py: one new 640x480 PNG and a short question a request, "
              f"streamed, greedy, {tokens} tokens (ignore_eos), Ferry with speculative "
              f"decoding off; one slot, context {CONTEXT}; both pinned to the same {threads} "
              f"CPUs with {threads} threads, one working at a time, alternating")
    rows: tuple[tuple[str, str, str, int], ...] = (
        ("time to first token (s)", "ttft", "one picture + a short question", 3),
        ("decode tok/s", "decode", "after one picture", 2),
        ("peak resident MB", "peak", "one picture + a short question, VmHWM at the end", 0))
    if beside:
        method = (f"benchmarks/vision.py --beside: a text reply streams (greedy, up to 3000 "
                  f"tokens) and a new 640x480 PNG with a short question is sent once it does; "
                  f"the longest gap between the text reply's tokens until the picture's first "
                  f"token; two slots, context {CONTEXT} each, each server's default "
                  f"scheduling; both pinned to the same {threads} CPUs with {threads} "
                  f"threads, one working at a time, alternating")
        rows = (("longest gap between tokens (s)", "gap",
                 "another reply while a picture is read", 2),)
    said = ", Ferry's tower in Q8_0 (default)" if tower == "q8_0" else \
        ", Ferry's tower as the file stores it (--mmproj-quantize none)"
    date = _dt.datetime.now(_dt.UTC).date().isoformat()
    return [Record(date=date, commit=this_commit(), cpu=name, cpu_flags=flags,
                   ferry_cpu=os.environ.get("FERRY_CPU", "native"), model=model,
                   workload=workload + said, metric=metric, method=method,
                   ferry=tuple(round(x, digits) for x in ferry[key]), peer=PEER,
                   peer_build=peer_build,
                   peer_figures=tuple(round(x, digits) for x in peer[key]), notes=notes)
            for metric, key, workload, digits in rows]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ferry, peer = run(args)
    for key in ("gap",) if args.beside else ("ttft", "decode", "peak"):
        print(key, "ferry", [round(x, 2) for x in ferry[key]], "llama.cpp",
              [round(x, 2) for x in peer[key]])
    if args.record:
        for record in make_records(ferry, peer, model=args.model_name or args.gguf.stem,
                                   threads=args.threads, tokens=args.tokens,
                                   peer_build=args.peer_build or peer_version(
                                       args.llama_server), notes=args.notes,
                                   beside=args.beside, tower=args.mmproj_quantize):
            append(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""peerbench: streaming load benchmark for any OpenAI-compatible HTTP server.

Runs the same workload against Ferry, llama.cpp's llama-server, vLLM, ... so they can be
compared side by side, and keeps the comparison as a record in benchmarks/records.jsonl.

  python -m benchmarks.peerbench --base http://127.0.0.1:PORT [--endpoint completions|chat]
      [--model NAME] -n REQUESTS -c CONCURRENCY --max-tokens N --prompt-tokens P
      [--ignore-eos] [--rate R] [--seed S] [--shared-prefix K]
      [--tokenizer-dir DIR] [--timeout SECS] [--warmup W] [--label TEXT] [--json OUT]
  python -m benchmarks.peerbench --compare A.json B.json ...
  python -m benchmarks.peerbench --record --ferry F1.json F2.json --peer P1.json P2.json
      --model-name TEXT --workload TEXT --peer-name TEXT --peer-build TEXT [--ferry-cpu avx2]

--record appends one record (benchmarks/records.py) made of alternating runs: one figure per
run file, decode tok/s per stream when the runs had one request in flight, else aggregate
output tok/s; the CPU, its flags and Ferry's commit are read from this machine. Then
`python -m benchmarks.render` updates the tables in README.md and docs/benchmarks.md.

Workload
  * Prompts are English filler text of about P tokens (1 token ~ 4 chars, or counted
    exactly with a local transformers tokenizer given by --tokenizer-dir).  Each prompt
    starts with a fresh random nonce so no server can reuse a cached prefix, not even one
    left by an earlier run.  --shared-prefix K gives all prompts of a run a common first
    ~K tokens instead (itself opened by a run nonce) to measure prefix caching.
  * --seed fixes the filler text and the Poisson arrival times, so every peer gets the
    same workload; the nonces are always fresh.
  * Every request streams (stream=true, temperature 0, stream_options.include_usage unless
    the server rejects it during warm-up, or --no-stream-usage).  --ignore-eos adds
    "ignore_eos": true (llama.cpp and vLLM accept it).
  * --rate R submits requests as a Poisson process of R req/s; default: all at once.
    At most -c requests are in flight; TTFT counts from the moment a request is sent.

Figures
  wall time (first arrival -> last stream end), aggregate output tok/s, req/s,
  TTFT p50/p95/max, ITL p50/p95 (gaps between content chunks, pooled over requests),
  TPOT = (t_last_chunk - t_first_chunk) / (completion_tokens - 1) per request,
  per-stream decode tok/s mean (mean of 1/TPOT), tokens/s/user (1 / mean TPOT),
  E2E latency, errors and HTTP status codes, finish reasons.  Completion tokens come from
  the server's usage when present, else from the number of content chunks.

Safety: loopback only (host must be 127.0.0.1, localhost or ::1); every request has a
total timeout (--timeout); all loops are bounded by -n.

Needs Python 3.11 and httpx (not needed for --compare).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import ipaddress
import json
import math
import os
import platform
import random
import secrets
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from benchmarks.records import Record, append, this_commit, this_cpu

httpx: Any
try:
    import httpx
except ImportError:  # --compare works without it
    httpx = None

TOOL_VERSION = 1
Counter = Callable[[str], int]  # text -> its token count
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

SENTENCES = (
    "The morning train left the valley station a few minutes after sunrise.",
    "A fisherman mended his nets on the pier while gulls circled overhead.",
    "Most of the village gathered in the square when the market opened.",
    "The old library kept its maps in wide wooden drawers near the window.",
    "Rain had softened the path, so the walkers moved slowly up the hill.",
    "She wrote the figures in a small notebook and checked them twice.",
    "By noon the wind had turned, carrying the smell of salt from the coast.",
    "The baker sold the last loaf of rye bread before the church bells rang.",
    "Two students argued about the best route across the northern mountains.",
    "A lantern swung from the beam above the door of the quiet inn.",
    "The river was high that spring, and the ferry ran only in daylight.",
    "He repaired the clock in the hall, though it still ran a little fast.",
    "Children chased a red kite across the field behind the school.",
    "The engineer measured the bridge again and found the same small error.",
    "Every evening the keeper climbed the tower to light the great lamp.",
    "Snow covered the roofs, and smoke rose straight up from every chimney.",
    "The letter arrived a week late, folded twice and sealed with green wax.",
    "In the garden, the apple trees bent under the weight of their fruit.",
    "A traveller asked for directions to the harbour and a cheap room.",
    "The committee met in the long room upstairs to discuss the new road.",
    "Her brother kept bees at the edge of the orchard near the stone wall.",
    "The ship's cook complained that the flour had gone damp in the hold.",
    "At the crossroads stood a signpost whose arrows pointed four ways.",
    "They counted the sheep at dusk and found that one was still missing.",
    "The teacher drew a map of the continent on the board in white chalk.",
    "A thin mist lay over the marsh until the sun climbed above the trees.",
    "The carpenter chose oak for the table because it would last for years.",
    "Music drifted from an open window as the band rehearsed for the fair.",
    "The doctor walked from farm to farm with a leather bag and a lantern.",
    "On the last day of summer the whole town went down to the lake.",
    "The merchant weighed the tea carefully and wrapped it in brown paper.",
    "A stray dog followed the postman all the way to the end of the lane.",
)


# ----------------------------------------------------------------------------- helpers
def pct(xs: Sequence[float], p: float) -> float | None:
    """Percentile with linear interpolation; None for an empty list."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def scale(x: float | None, f: float) -> float | None:
    return None if x is None else x * f


def rnd(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(x, nd)


def check_loopback(base: str) -> None:
    u = urlsplit(base)
    if u.scheme not in ("http", "https"):
        raise SystemExit(f"peerbench: --base must be an http(s) URL, got {base!r}")
    host = (u.hostname or "").lower()
    if host not in LOOPBACK_HOSTS:
        raise SystemExit(f"peerbench: refusing --base {base!r}: host must be one of "
                         f"{', '.join(LOOPBACK_HOSTS)} (loopback only)")
    try:
        port = u.port
    except ValueError as e:
        raise SystemExit(f"peerbench: bad port in --base: {e}") from None
    if host == "localhost":  # make sure the name really means loopback here
        try:
            infos = socket.getaddrinfo(host, port or 80, proto=socket.IPPROTO_TCP)
        except OSError as e:
            raise SystemExit(f"peerbench: cannot resolve localhost: {e}") from None
        for info in infos:
            if not ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback:
                raise SystemExit(f"peerbench: localhost resolves to {info[4][0]}, not loopback")


def api_root(base: str) -> str:
    b = base.rstrip("/")
    return b if b.endswith("/v1") else b + "/v1"


# ----------------------------------------------------------------------------- prompts
class TokenCounter:
    def __init__(self, tokenizer_dir: str | None) -> None:
        self.tok = None
        self.mode = "estimate: 1 token ~ 4 chars"
        if tokenizer_dir:
            try:
                from transformers import AutoTokenizer  # optional
                self.tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
                self.mode = "tokenizer: " + os.path.basename(os.path.normpath(tokenizer_dir))
            except Exception as e:
                print(f"peerbench: warning: --tokenizer-dir not usable ({type(e).__name__}: "
                      f"{str(e)[:120]}); using the 4-chars/token estimate", file=sys.stderr)

    def __call__(self, text: str) -> int:
        if self.tok is None:
            return math.ceil(len(text) / 4)
        return len(self.tok(text, add_special_tokens=False)["input_ids"])


def filler_words(rng: random.Random, n_chars: int) -> list[str]:
    words, total = [], 0
    while total < n_chars:
        for w in rng.choice(SENTENCES).split():
            words.append(w)
            total += len(w) + 1
    return words


def fit(count: Counter, head: str, words: list[str], target: int) -> str:
    """head + the longest run of words whose token count stays <= target."""
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(head + " ".join(words[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    return head + " ".join(words[:lo])


def nonce() -> str:
    return secrets.token_hex(6) + ": "


def build_prompts(n: int, prompt_tokens: int, shared_prefix: int, count: Counter,
                  rng: random.Random) -> tuple[list[str], str]:
    """n prompts of ~prompt_tokens tokens; returns (prompts, shared_prefix_text)."""
    prefix = ""
    if shared_prefix > 0:
        words = filler_words(rng, 8 * shared_prefix + 64)
        prefix = fit(count, nonce(), words, shared_prefix) + "\n"
    out = []
    for _ in range(n):
        words = filler_words(rng, 8 * prompt_tokens + 64)
        out.append(fit(count, prefix + nonce(), words, prompt_tokens))
    return out, prefix


# ----------------------------------------------------------------------------- requests
def make_body(args: argparse.Namespace, model: str, prompt: str, max_tokens: int,
              stream_usage: bool) -> dict[str, Any]:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if args.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream_usage:
        body["stream_options"] = {"include_usage": True}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.extra_body:
        body.update(args.extra_body)
    return body


async def do_request(client: Any, url: str, body: dict[str, Any], endpoint: str,
                     timeout: float, t0: float) -> dict[str, Any]:
    """One streamed request.  All times are seconds relative to t0 (perf_counter)."""
    now = time.perf_counter
    t_submit = now()
    times: list[float] = []
    usage = finish = status = err = None
    n_events = 0
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url, json=body) as resp:
                status = resp.status_code
                if status != 200:
                    raw = await resp.aread()
                    err = f"HTTP {status}: " + raw[:300].decode("utf-8", "replace").strip()
                else:
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue  # blank, comment, event:, id:
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        t = now()
                        n_events += 1
                        try:
                            obj = json.loads(data)
                        except ValueError:
                            err = "bad SSE data: " + data[:120]
                            continue
                        if not isinstance(obj, dict):
                            continue
                        if obj.get("error"):
                            err = "stream error: " + json.dumps(obj["error"])[:300]
                            break
                        if obj.get("usage"):
                            usage = obj["usage"]
                        got = False
                        for ch in obj.get("choices") or ():
                            if endpoint == "chat":
                                d = ch.get("delta") or {}
                                piece = (d.get("content") or d.get("reasoning_content")
                                         or d.get("reasoning"))
                            else:
                                piece = ch.get("text")
                            if piece:
                                got = True
                            if ch.get("finish_reason"):
                                finish = ch["finish_reason"]
                        if got:
                            times.append(t)
    except TimeoutError:
        err = f"timeout after {timeout:g}s"
    except Exception as e:
        err = f"{type(e).__name__}: {str(e)[:200]}"
    t_end = now()
    if err is None and not times:
        err = "no content chunks" if status == 200 else f"HTTP {status}"
    ok = err is None
    ct = usage.get("completion_tokens") if isinstance(usage, dict) else None
    n_tok = ct if isinstance(ct, int) else len(times)
    rec = {
        "ok": ok,
        "status": status,
        "error": err,
        "t_submit": rnd(t_submit - t0),
        "t_first": rnd(times[0] - t0) if times else None,
        "t_last": rnd(times[-1] - t0) if times else None,
        "t_end": rnd(t_end - t0),
        "chunk_times": [rnd(x - t0) for x in times],
        "n_chunks": len(times),
        "n_events": n_events,
        "completion_tokens": n_tok,
        "tokens_from": "usage" if isinstance(ct, int) else "chunks",
        "prompt_tokens_server": usage.get("prompt_tokens") if isinstance(usage, dict) else None,
        "cached_tokens_server": cached_tokens(usage),
        "finish_reason": finish,
        "ttft_s": rnd(times[0] - t_submit) if times else None,
        "e2e_s": rnd(t_end - t_submit),
        "tpot_s": None,
    }
    if times and n_tok >= 2 and times[-1] > times[0]:
        rec["tpot_s"] = rnd((times[-1] - times[0]) / (n_tok - 1), 7)
    return rec


def cached_tokens(usage: Any) -> int | None:
    """usage.prompt_tokens_details.cached_tokens (llama.cpp, vLLM with prefix caching)."""
    d = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    v = d.get("cached_tokens") if isinstance(d, dict) else None
    return v if isinstance(v, int) else None


async def detect_model(client: Any, root: str) -> tuple[str, str]:
    try:
        r = await client.get(root + "/models", timeout=10.0)
        if r.status_code == 200:
            data = r.json().get("data") or []
            if data and isinstance(data[0], dict) and data[0].get("id"):
                return str(data[0]["id"]), "GET /v1/models"
    except Exception:
        pass
    return "default", "fallback (no /v1/models)"


async def run(args: argparse.Namespace, prompts: list[str],
              warm_prompts: list[str]) -> dict[str, Any]:
    root = api_root(args.base)
    url = root + ("/chat/completions" if args.endpoint == "chat" else "/completions")
    limits = httpx.Limits(max_connections=args.concurrency + 2,
                          max_keepalive_connections=args.concurrency + 2)
    timeout = httpx.Timeout(args.timeout, connect=min(10.0, args.timeout))
    notes = []
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False,
                                 follow_redirects=False) as client:
        if args.model:
            model, model_src = args.model, "--model"
        else:
            model, model_src = await detect_model(client, root)
        stream_usage = not args.no_stream_usage
        warm_max = min(8, args.max_tokens)
        for wp in warm_prompts:  # unmeasured; also probes stream_options support
            t = time.perf_counter()
            rec = await do_request(client, url, make_body(args, model, wp, warm_max, stream_usage),
                                   args.endpoint, args.timeout, t)
            if not rec["ok"] and stream_usage and rec["status"] in (400, 404, 415, 422):
                rec2 = await do_request(client, url, make_body(args, model, wp, warm_max, False),
                                        args.endpoint, args.timeout, t)
                if rec2["ok"]:
                    stream_usage = False
                    notes.append("server rejected stream_options; sent without it "
                                 f"({rec['error'][:100]})")
                    rec = rec2
            if not rec["ok"]:
                raise SystemExit(f"peerbench: warm-up request to {url} failed: {rec['error']}")
        if warm_prompts and args.pause > 0:
            await asyncio.sleep(args.pause)

        n = len(prompts)
        arr_rng = random.Random(f"{args.seed}-arrivals")
        arrivals, t = [], 0.0
        for _ in range(n):
            arrivals.append(t)
            if args.rate:
                t += arr_rng.expovariate(args.rate)
        sem = asyncio.Semaphore(args.concurrency)
        done = 0
        progress = sys.stderr.isatty()

        async def one(i: int) -> dict[str, Any]:
            nonlocal done
            delay = t0 + arrivals[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t_arrive = time.perf_counter() - t0
            async with sem:
                body = make_body(args, model, prompts[i], args.max_tokens, stream_usage)
                rec = await do_request(client, url, body, args.endpoint, args.timeout, t0)
            rec = {"i": i, "t_sched": rnd(arrivals[i]), "t_arrive": rnd(t_arrive), **rec}
            done += 1
            if progress:
                print(f"\rpeerbench: {done}/{n} done", end="", file=sys.stderr, flush=True)
            return rec

        cpu0 = os.times()
        t0 = time.perf_counter()
        recs = await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
        cpu1 = os.times()
        if progress:
            print(file=sys.stderr)
    client_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"url": url, "model": model, "model_source": model_src, "stream_usage": stream_usage,
            "notes": notes, "records": list(recs), "wall": wall, "client_cpu": client_cpu}


# ----------------------------------------------------------------------------- figures
def summarize(recs: list[dict[str, Any]], wall: float, client_cpu: float,
              prompt_est: list[int]) -> dict[str, Any]:
    ok = [r for r in recs if r["ok"]]
    status: dict[str, int] = {}
    errs: dict[str, int] = {}
    fins: dict[str, int] = {}
    for r in recs:
        k = str(r["status"]) if r["status"] is not None else "none"
        status[k] = status.get(k, 0) + 1
        if r["error"]:
            e = r["error"][:80]
            errs[e] = errs.get(e, 0) + 1
        f = str(r["finish_reason"])
        fins[f] = fins.get(f, 0) + 1
    ttft = [r["ttft_s"] for r in ok]
    e2e = [r["e2e_s"] for r in ok]
    gaps = [b - a for r in ok for a, b in zip(r["chunk_times"], r["chunk_times"][1:])]
    tpot = [r["tpot_s"] for r in ok if r["tpot_s"]]
    out_tok = sum(r["completion_tokens"] for r in ok)
    chunks = sum(r["n_chunks"] for r in ok)
    ps = [r["prompt_tokens_server"] for r in ok if isinstance(r["prompt_tokens_server"], int)]
    cached = [r["cached_tokens_server"] for r in ok if r["cached_tokens_server"] is not None]
    wait = [r["t_submit"] - r["t_arrive"] for r in recs]
    tpot_mean = mean(tpot)
    return {
        "requests": len(recs),
        "requests_ok": len(ok),
        "errors": len(recs) - len(ok),
        "status_codes": status,
        "error_kinds": errs,
        "finish_reasons": fins,
        "wall_s": rnd(wall),
        "output_tokens": out_tok,
        "agg_output_tok_s": rnd(out_tok / wall if wall > 0 else None, 3),
        "req_per_s": rnd(len(ok) / wall if wall > 0 else None, 4),
        "ttft_p50_s": rnd(pct(ttft, 50)),
        "ttft_p95_s": rnd(pct(ttft, 95)),
        "ttft_max_s": rnd(max(ttft) if ttft else None),
        "ttft_mean_s": rnd(mean(ttft)),
        "itl_p50_ms": rnd(scale(pct(gaps, 50), 1e3), 3),
        "itl_p95_ms": rnd(scale(pct(gaps, 95), 1e3), 3),
        "itl_max_ms": rnd(scale(max(gaps) if gaps else None, 1e3), 3),
        "itl_mean_ms": rnd(scale(mean(gaps), 1e3), 3),
        "itl_gaps": len(gaps),
        "tpot_mean_ms": rnd(scale(tpot_mean, 1e3), 3),
        "tpot_p50_ms": rnd(scale(pct(tpot, 50), 1e3), 3),
        "tpot_p95_ms": rnd(scale(pct(tpot, 95), 1e3), 3),
        "decode_tok_s_mean": rnd(mean([1.0 / x for x in tpot]), 3),
        "tok_s_per_user": rnd(1.0 / tpot_mean if tpot_mean else None, 3),
        "e2e_p50_s": rnd(pct(e2e, 50)),
        "e2e_p95_s": rnd(pct(e2e, 95)),
        "e2e_max_s": rnd(max(e2e) if e2e else None),
        "completion_tokens_mean": rnd(mean([r["completion_tokens"] for r in ok]), 2),
        "chunks_per_token": rnd(chunks / out_tok if out_tok else None, 4),
        "usage_reported": sum(1 for r in ok if r["tokens_from"] == "usage"),
        "prompt_tokens_est_mean": rnd(mean(prompt_est), 2),
        "prompt_tokens_server_mean": rnd(mean(ps), 2),
        "cached_tokens_server_mean": rnd(mean(cached), 2),
        "client_wait_max_s": rnd(max(wait) if wait else None),
        "client_cpu_s": rnd(client_cpu, 3),
    }


# (key, row label, format, better: "hi" | "lo" | None)
ROWS = (
    ("requests_ok", "ok requests", "{:.0f}", "hi"),
    ("errors", "errors", "{:.0f}", "lo"),
    ("wall_s", "wall s", "{:.3f}", "lo"),
    ("output_tokens", "output tokens", "{:.0f}", None),
    ("agg_output_tok_s", "agg output tok/s", "{:.1f}", "hi"),
    ("req_per_s", "req/s", "{:.2f}", "hi"),
    ("ttft_p50_s", "TTFT p50 s", "{:.3f}", "lo"),
    ("ttft_p95_s", "TTFT p95 s", "{:.3f}", "lo"),
    ("ttft_max_s", "TTFT max s", "{:.3f}", "lo"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}", "lo"),
    ("itl_p95_ms", "ITL p95 ms", "{:.1f}", "lo"),
    ("itl_max_ms", "ITL max ms", "{:.1f}", "lo"),
    ("tpot_mean_ms", "TPOT mean ms", "{:.1f}", "lo"),
    ("decode_tok_s_mean", "decode tok/s/stream", "{:.1f}", "hi"),
    ("tok_s_per_user", "tok/s/user 1/TPOT", "{:.1f}", "hi"),
    ("e2e_p50_s", "E2E p50 s", "{:.3f}", "lo"),
    ("e2e_p95_s", "E2E p95 s", "{:.3f}", "lo"),
    ("prompt_tokens_server_mean", "prompt tok (server)", "{:.1f}", None),
    ("cached_tokens_server_mean", "cached prompt tok", "{:.1f}", None),
    ("completion_tokens_mean", "compl tok/req", "{:.1f}", None),
    ("chunks_per_token", "chunks/token", "{:.2f}", None),
    ("client_cpu_s", "client CPU s", "{:.2f}", None),
)


def fmt(v: Any, f: str) -> str:
    if v is None:
        return "-"
    try:
        return f.format(v)
    except (ValueError, TypeError):
        return str(v)


def workload_line(w: dict[str, Any]) -> str:
    rate = "all-at-once" if not w.get("rate") else f"{w['rate']:g}/s"
    bits = [f"{w.get('endpoint')}", f"n={w.get('n')}", f"c={w.get('concurrency')}", f"rate={rate}",
            f"max_tokens={w.get('max_tokens')}", f"prompt~{w.get('prompt_tokens')}"]
    if w.get("shared_prefix"):
        bits.append(f"shared_prefix~{w['shared_prefix']}")
    if w.get("ignore_eos"):
        bits.append("ignore_eos")
    bits.append(f"seed={w.get('seed')}")
    return " ".join(bits)


def short(s: str, n: int = 48) -> str:
    s = str(s)
    if s.startswith("/"):  # llama-server reports the model file path as its id
        s = os.path.basename(s)
    return s if len(s) <= n else "..." + s[-(n - 3):]


def print_single(res: dict[str, Any]) -> None:
    m, w, s = res["meta"], res["workload"], res["summary"]
    print(f"peerbench  {m['label']}  {m['url']}  model={short(m['model'])}")
    print(f"workload   {workload_line(w)}  (prompt {m['prompt_counter']})")
    print(f"status     ok {s['requests_ok']}/{s['requests']}  codes {s['status_codes']}  "
          f"finish {s['finish_reasons']}  usage {s['usage_reported']}/{s['requests_ok']}")
    for e, k in s["error_kinds"].items():
        print(f"error      {k} x {e}")
    for note in m.get("notes", []):
        print(f"note       {note}")
    width = max(len(r[1]) for r in ROWS)
    for key, label, f, _ in ROWS:
        print(f"  {label:<{width}}  {fmt(s.get(key), f):>10}")


def compare(paths: list[str]) -> None:
    runs = []
    for p in paths:
        with open(p) as fh:
            d = json.load(fh)
        if "summary" not in d:
            raise SystemExit(f"peerbench: {p} is not a peerbench --json file")
        runs.append((p, d))
    tags = [chr(ord("A") + i) if i < 26 else f"R{i}" for i in range(len(runs))]
    print("runs:")
    for tag, (p, d) in zip(tags, runs):
        m = d.get("meta", {})
        print(f"  [{tag}] {os.path.basename(p)}  {m.get('label', '')}  {m.get('url', '')}  "
              f"model={short(m.get('model', ''), 40)}")
        print(f"       {workload_line(d.get('workload', {}))}")
    keys = ("endpoint", "n", "concurrency", "rate", "max_tokens", "prompt_tokens",
            "shared_prefix", "ignore_eos", "seed")
    w0 = runs[0][1].get("workload", {})
    for tag, (_, d) in zip(tags[1:], runs[1:]):
        diff = [k for k in keys if d.get("workload", {}).get(k) != w0.get(k)]
        if diff:
            print(f"  warning: [{tag}] workload differs from [A] in: {', '.join(diff)}")
    width = max(len(r[1]) for r in ROWS)
    colw = 18
    print(f"{'metric':<{width}}  " + "".join(f"{t:>{colw}}" for t in tags) + "  better")
    for key, label, f, better in ROWS:
        base = runs[0][1]["summary"].get(key)
        cells = []
        for i, (_, d) in enumerate(runs):
            v = d["summary"].get(key)
            cell = fmt(v, f)
            if i > 0:
                if isinstance(v, (int, float)) and isinstance(base, (int, float)) and base:
                    cell += f" ({v / base:.2f}x)"
                else:
                    cell += " (   -  )"
            cells.append(f"{cell:>{colw}}")
        hint = {"hi": "higher", "lo": "lower"}.get(better or "", "")
        print(f"{label:<{width}}  " + "".join(cells) + f"  {hint}")
    print("ratios are value / [A]")


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="peerbench.py",
        description="Streaming load benchmark for OpenAI-compatible servers (loopback only).")
    ap.add_argument("--compare", nargs="+", metavar="RUN.json",
                    help="print saved --json runs side by side, ratios vs the first; no traffic")
    ap.add_argument("--base",
                    help="server base URL, e.g. http://127.0.0.1:8080 (a trailing /v1 is fine)")
    ap.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    ap.add_argument("--model", help="model name to send (default: first id of GET /v1/models)")
    ap.add_argument("-n", "--requests", dest="n", type=int, default=8,
                    help="number of requests (8)")
    ap.add_argument("-c", "--concurrency", type=int, default=8, help="max requests in flight (8)")
    ap.add_argument("--max-tokens", type=int, default=128,
                    help="max output tokens per request (128)")
    ap.add_argument("--prompt-tokens", type=int, default=128,
                    help="approximate prompt length in tokens (128)")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="K",
                    help="give all prompts a common first ~K tokens (prefix-cache test)")
    ap.add_argument("--ignore-eos", action="store_true", help='send "ignore_eos": true')
    ap.add_argument("--rate", type=float, default=None, metavar="R",
                    help="Poisson arrivals at R req/s (default: all at once)")
    ap.add_argument("--seed", type=int, default=0, help="seed for filler text and arrivals (0)")
    ap.add_argument("--tokenizer-dir", metavar="DIR",
                    help="local HF tokenizer folder to size prompts exactly (needs transformers)")
    ap.add_argument("--timeout", type=float, default=300.0, help="total seconds per request (300)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up requests first (1)")
    ap.add_argument("--pause", type=float, default=0.5, help="seconds to wait after warm-up (0.5)")
    ap.add_argument("--no-stream-usage", action="store_true", help="never send stream_options")
    ap.add_argument("--extra-body", type=json.loads, metavar="JSON",
                    help="JSON object merged into every request body")
    ap.add_argument("--label", help="name of this peer in tables (default: host:port)")
    ap.add_argument("--json", metavar="OUT", help="write all figures and per-request records here")
    rec = ap.add_argument_group("--record: append a comparison to benchmarks/records.jsonl")
    rec.add_argument("--record", action="store_true")
    rec.add_argument("--ferry", nargs="+", metavar="RUN.json", help="Ferry's runs (--json)")
    rec.add_argument("--peer", nargs="+", metavar="RUN.json", help="the peer's runs")
    rec.add_argument("--model-name", help="the model, with its format and quantization")
    rec.add_argument("--workload", help='e.g. "one chat (-np 1)", "32 at once (-np 32)"')
    rec.add_argument("--peer-name", help='e.g. "llama.cpp llama-server"')
    rec.add_argument("--peer-build", help='e.g. "b10470, native flags"')
    rec.add_argument("--ferry-cpu", default="native", help="the FERRY_CPU cap of Ferry's runs")
    rec.add_argument("--threads", type=int, help="threads each server used (default: all)")
    rec.add_argument("--notes", default="")
    args = ap.parse_args(argv)
    if args.compare:
        return args
    if args.record:
        missing = [f"--{n.replace('_', '-')}" for n in ("ferry", "model_name", "workload")
                   if not getattr(args, n)]
        if args.peer and not (args.peer_name and args.peer_build):
            missing.append("--peer-name and --peer-build")
        if missing:
            ap.error(f"--record needs {', '.join(missing)}")
        return args
    if not args.base:
        ap.error("--base is required (or use --compare)")
    for name in ("n", "concurrency", "max_tokens", "prompt_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.shared_prefix < 0 or args.warmup < 0 or args.pause < 0:
        ap.error("--shared-prefix, --warmup and --pause must be >= 0")
    if args.rate is not None and not args.rate > 0:
        ap.error("--rate must be > 0")
    if not args.timeout > 0:
        ap.error("--timeout must be > 0")
    if args.extra_body is not None and not isinstance(args.extra_body, dict):
        ap.error("--extra-body must be a JSON object")
    return args


def make_record(args: argparse.Namespace) -> Record:
    """One record from the run files of --ferry and --peer (alternating runs, same workload)."""
    def runs(paths: list[str]) -> list[dict[str, Any]]:
        out = []
        for path in paths:
            with open(path) as fh:
                out.append(json.load(fh))
        return out
    ferry, peer = runs(args.ferry), runs(args.peer or [])
    first = ferry[0]["workload"]
    for run_ in ferry + peer:
        w = run_["workload"]
        if (w["n"], w["concurrency"], w["max_tokens"], w["endpoint"]) != \
                (first["n"], first["concurrency"], first["max_tokens"], first["endpoint"]):
            raise SystemExit("peerbench: --record needs runs of one workload: "
                             f"{w} differs from {first}")
    key = "decode_tok_s_mean" if first["concurrency"] == 1 else "agg_output_tok_s"
    metric = "decode tok/s per stream" if key == "decode_tok_s_mean" else "output tok/s"
    cpu, flags = this_cpu(args.threads)
    return Record(
        date=_dt.datetime.now(_dt.UTC).date().isoformat(), commit=this_commit(),
        cpu=cpu, cpu_flags=flags, ferry_cpu=args.ferry_cpu, model=args.model_name,
        workload=args.workload, metric=metric,
        method=(f"benchmarks/peerbench.py: streaming /v1/{first['endpoint']}, temperature 0, "
                f"{'ignore_eos, ' if first['ignore_eos'] else ''}~{first['prompt_tokens']} "
                f"prompt tokens, {first['max_tokens']} out, {first['n']} requests, "
                f"{first['concurrency']} in flight; one server at a time, alternating"),
        ferry=tuple(r["summary"][key] for r in ferry), peer=args.peer_name,
        peer_build=args.peer_build, peer_figures=tuple(r["summary"][key] for r in peer),
        notes=args.notes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compare:
        compare(args.compare)
        return 0
    if args.record:
        record = make_record(args)
        append(record)
        print(record.to_json())
        return 0
    check_loopback(args.base)
    if httpx is None:
        raise SystemExit("peerbench: httpx is required (pip install httpx)")
    count = TokenCounter(args.tokenizer_dir)
    rng = random.Random(f"{args.seed}-prompts")
    prompts, prefix = build_prompts(args.n, args.prompt_tokens, args.shared_prefix, count, rng)
    warm_rng = random.Random(f"{args.seed}-warmup")
    warm: list[str] = []
    if args.warmup:
        warm, _ = build_prompts(args.warmup, args.prompt_tokens, 0, count, warm_rng)
    u = urlsplit(args.base)
    label = args.label or f"{u.hostname}:{u.port or ''}"
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    print(f"peerbench: {args.n} requests, c={args.concurrency}, -> {args.base} ...",
          file=sys.stderr)
    r = asyncio.run(run(args, prompts, warm))
    est = [count(p) for p in prompts]
    summary = summarize(r["records"], r["wall"], r["client_cpu"], est)
    res = {
        "tool": "peerbench",
        "version": TOOL_VERSION,
        "meta": {
            "label": label,
            "base": args.base,
            "url": r["url"],
            "model": r["model"],
            "model_source": r["model_source"],
            "started_utc": started,
            "stream_usage_sent": r["stream_usage"],
            "prompt_counter": count.mode,
            "shared_prefix_est_tokens": count(prefix) if prefix else 0,
            "notes": r["notes"],
            "python": platform.python_version(),
            "httpx": httpx.__version__,
            "cpu_count": os.cpu_count(),
            "loadavg_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "workload": {
            "endpoint": args.endpoint, "n": args.n, "concurrency": args.concurrency,
            "rate": args.rate, "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
            "shared_prefix": args.shared_prefix, "ignore_eos": args.ignore_eos, "seed": args.seed,
            "timeout_s": args.timeout, "warmup": args.warmup, "extra_body": args.extra_body,
        },
        "definitions": {
            "time_origin": "t=0 is the first scheduled arrival; t_* fields are seconds from it",
            "ttft_s": "first content chunk - request sent (t_submit), excludes client-side wait",
            "itl": "gaps between consecutive content chunks, pooled over ok requests",
            "tpot_s": "(t_last - t_first) / (completion_tokens - 1)",
            "decode_tok_s_mean": "mean over ok requests of 1/TPOT",
            "tok_s_per_user": "1 / mean TPOT",
            "agg_output_tok_s": "sum completion_tokens of ok requests / wall_s",
        },
        "summary": summary,
        "requests": r["records"],
    }
    print_single(res)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")
        print(f"peerbench: wrote {args.json}", file=sys.stderr)
    return 0 if summary["requests_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

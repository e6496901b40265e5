"""`ferry bench`: drive the engine with a synthetic workload, optionally beside HF generate.

Prompts are random token ids (ignore_eos, so every request makes exactly --output tokens);
clients are threads that each stream one request at a time.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from itertools import pairwise

from engine import POLICIES, EngineConfig


@dataclass(slots=True)
class Workload:
    requests: int = 32
    concurrency: int = 32
    prompt: int = 64
    output: int = 128
    rate: float = 0.0  # requests/s (Poisson arrivals); 0 = all at once
    shared_prefix: int = 0  # tokens common to every prompt
    seed: int = 0

    def prompts(self, vocab: int, special: int = 64) -> list[list[int]]:
        rng = random.Random(self.seed)
        shared = min(self.shared_prefix, self.prompt)
        prefix = [rng.randrange(special, vocab) for _ in range(shared)]
        return [prefix + [rng.randrange(special, vocab) for _ in range(self.prompt - len(prefix))]
                for _ in range(self.requests)]


@dataclass(slots=True)
class Result:
    system: str
    requests: int
    wall: float
    output_tokens: int
    prompt_tokens: int
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    scheduler_share: float | None = None
    note: str = ""
    # speculative decoding over the run: drafts made and kept, decoding steps and their tokens
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    step_tokens: int = 0

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.wall if self.wall else 0.0

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.wall if self.wall else 0.0

    def row(self) -> dict[str, object]:
        tpot = pct(self.tpot, 0.5)
        return {"system": self.system, "requests": self.requests, "wall_s": round(self.wall, 2),
                "output_tok_s": round(self.output_tps, 1),
                "prefill_tok_s": round(self.prefill_tps, 1),
                "ttft_p50_ms": ms(pct(self.ttft, 0.5)), "ttft_p95_ms": ms(pct(self.ttft, 0.95)),
                "itl_p50_ms": ms(pct(self.itl, 0.5)), "itl_p95_ms": ms(pct(self.itl, 0.95)),
                "tok_s_user": round(1 / tpot, 1) if tpot else None,
                "scheduler_share_pct": None if self.scheduler_share is None
                else round(100 * self.scheduler_share, 2),
                "accepted_pct": round(100 * self.accepted / self.drafted, 1) if self.drafted
                else None,
                "tokens_per_step": round(self.step_tokens / self.steps, 2) if self.steps
                else None,
                "note": self.note}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)


def run_engine(engine: object, work: Workload, prompts: list[list[int]], name: str,
               constrained: set[int] | None = None, constraint: object = None,
               params: object = None) -> Result:
    """Closed-loop clients (at most `concurrency` in flight), Poisson arrivals when rate > 0;
    the prompts whose index is in `constrained` run under `constraint`. `params`: the
    requests' SamplingParams (default: work.output tokens, EOS ignored)."""
    from engine import SamplingParams

    params = params or SamplingParams(max_tokens=work.output, ignore_eos=True)
    grammar = SamplingParams(max_tokens=work.output, ignore_eos=True,
                             constraint=constraint)  # type: ignore[arg-type]
    result = Result(name, len(prompts), 0.0, 0, 0)
    lock = threading.Lock()
    slots = threading.Semaphore(work.concurrency)
    rng = random.Random(work.seed + 1)
    round0, exec0 = engine.round_time, engine.executor_time  # type: ignore[attr-defined]
    m0 = engine.snapshot().metrics  # type: ignore[attr-defined]

    def client(ids: list[int], p: object) -> None:
        try:
            sent = time.perf_counter()
            handle = engine.submit(ids, p)  # type: ignore[attr-defined]
            times = []
            final = None
            for ev in handle.events(timeout=600):
                if hasattr(ev, "token_ids"):  # emitted by the engine, not when read here
                    times.extend([ev.emitted or time.perf_counter()] * len(ev.token_ids))
                else:
                    final = ev
            with lock:
                result.output_tokens += final.usage.completion_tokens  # type: ignore[union-attr]
                result.prompt_tokens += len(ids)
                if times:
                    result.ttft.append(times[0] - sent)
                    result.itl.extend(b - a for a, b in pairwise(times))
                    if len(times) > 1:
                        result.tpot.append((times[-1] - times[0]) / (len(times) - 1))
        finally:
            slots.release()

    threads = []
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        slots.acquire()
        p = grammar if constrained and i in constrained else params
        t = threading.Thread(target=client, args=(ids, p), daemon=True)
        t.start()
        threads.append(t)
        if work.rate > 0:
            time.sleep(rng.expovariate(work.rate))
    for t in threads:
        t.join()
    result.wall = time.perf_counter() - start
    rounds = engine.round_time - round0  # type: ignore[attr-defined]
    execs = engine.executor_time - exec0  # type: ignore[attr-defined]
    result.scheduler_share = (rounds - execs) / rounds if rounds else None
    engine.wait_idle()  # type: ignore[attr-defined]  # the snapshot has the last round then
    m1 = engine.snapshot().metrics  # type: ignore[attr-defined]
    result.drafted = m1.drafted_tokens - m0.drafted_tokens
    result.accepted = m1.accepted_tokens - m0.accepted_tokens
    result.steps = m1.decode_steps - m0.decode_steps
    result.step_tokens = m1.decode_tokens - m0.decode_tokens
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ferry bench",
        description="Measure Ferry's engine under a synthetic workload: output and prefill "
                    "tokens/s, TTFT and ITL p50/p95, tokens/s per user, and the scheduler's own "
                    "share of each round. With --baseline hf the same prompts also run through "
                    "Hugging Face generate (one at a time, and as padded static batches) in the "
                    "same run, and the ratios are printed.")
    p.add_argument("--model", default=None, help="model folder, .gguf or hub id (default: the "
                                                 "embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=32, help="number of requests (32)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight (32)")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per request (64)")
    p.add_argument("--output", type=int, default=128, help="output tokens per request (128)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="arrival rate in requests/s, Poisson; 0 = all at once (default)")
    p.add_argument("--shared-prefix", type=int, default=0,
                   help="tokens of a prefix common to all prompts (exercises the prefix cache)")
    p.add_argument("--policy", choices=POLICIES, default="prefill-first")
    p.add_argument("--max-running", type=int, default=None, help="slots (default: concurrency)")
    p.add_argument("--max-prefill-tokens", type=int, default=2048)
    p.add_argument("--no-single", action="store_true",
                   help="skip the single-request decode measurement")
    p.add_argument("--baseline", choices=("hf",), default=None,
                   help="also run Hugging Face generate on the same prompts")
    p.add_argument("--baseline-requests", type=int, default=4,
                   help="requests for the slow one-at-a-time baseline (default 4; its tokens/s "
                        "is a rate, so a subset measures it)")
    p.add_argument("--stall", type=int, default=0, metavar="TOKENS",
                   help="instead of the throughput run: measure how long a TOKENS-long prompt "
                        "from one user stalls four others' replies under each policy")
    p.add_argument("--structured-fraction", type=float, default=0.0, metavar="F",
                   help="also run the workload with this fraction of the requests under a "
                        "JSON schema, and print its output tok/s against the unconstrained "
                        "run and the per-token mask time p50/p99")
    p.add_argument("--speculative", choices=("ngram", "draft", "off"), default="ngram",
                   help="speculative decoding in the engine (default ngram: prompt lookup; "
                        "draft: with --draft-model)")
    p.add_argument("--draft-model", metavar="PATH",
                   help="--speculative draft: the draft model (a .gguf file or a model "
                        "folder with the model's tokenizer)")
    p.add_argument("--chat", metavar="TEXT",
                   help="instead of the throughput run: one chat with TEXT at temperature 0, "
                        "speculative decoding on and off alternating (--repeats times each, "
                        "--output tokens at most)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of --chat (default 2)")
    p.add_argument("--profile", action="store_true",
                   help="sample the engine thread during the throughput run and print where "
                        "its time goes (products, attention, sampling, scheduling, ...)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def _validate(args: argparse.Namespace) -> str | None:
    for name in ("requests", "concurrency", "prompt", "output", "max_prefill_tokens",
                 "baseline_requests", "repeats"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if not 0 <= args.structured_fraction <= 1:
        return "--structured-fraction must be within [0, 1]"
    if args.rate < 0 or args.shared_prefix < 0:
        return "--rate and --shared-prefix must be >= 0"
    if args.shared_prefix > args.prompt:
        return "--shared-prefix cannot exceed --prompt"
    if args.speculative == "draft" and not args.draft_model:
        return "--speculative draft needs --draft-model PATH"
    return None


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    problem = _validate(args)
    if problem:
        print(f"ferry bench: {problem}", file=sys.stderr)
        return 2
    from app.paths import get_paths
    from engine import (
        Engine,
        ModelExecutor,
        ModelNotFound,
        describe_cpu_level,
        kernel_status,
        set_kernel_build_dir,
    )

    work = Workload(args.requests, args.concurrency, args.prompt, args.output, args.rate,
                    args.shared_prefix, args.seed)
    slots = args.max_running or args.concurrency
    config = EngineConfig(max_running=slots, max_prefill_tokens=args.max_prefill_tokens,
                          kv_tokens=max(4096, slots * (args.prompt + args.output + 32),
                                        args.stall + 8192),
                          policy=args.policy, speculative=args.speculative)
    paths = get_paths()
    set_kernel_build_dir(paths.kernels_cache)
    try:
        executor = ModelExecutor.from_pretrained(args.model, config, dtype=args.dtype,
                                                 device=args.device,
                                                 cache_dir=paths.models_cache)
    except ModelNotFound as exc:
        print(f"ferry bench: {exc}", file=sys.stderr)
        return 2
    dtype = str(executor.dtype).removeprefix("torch.")
    if args.stall:
        from app.bench import stall as bench_stall

        bench_stall.report(executor, args.stall, args.max_prefill_tokens)
        return 0
    prompts = work.prompts(executor.vocab_size)
    tokenizer = None
    # grammars and chats need the tokenizer; a draft model is checked against it
    if args.structured_fraction or args.chat or args.speculative == "draft":
        from engine import Tokenizer

        assert executor.tokenizer_path is not None
        tokenizer = Tokenizer(executor.tokenizer_path, paths.models_cache)
    draft = None
    if args.speculative == "draft":
        from engine import DraftModelError, DraftRunner

        assert tokenizer is not None
        try:
            draft = DraftRunner.load(args.draft_model, executor, tokenizer.hf.get_vocab(),
                                     dtype=args.dtype, device=args.device,
                                     cache_dir=paths.models_cache)
        except (DraftModelError, ModelNotFound) as exc:
            print(f"ferry bench: draft model: {exc}", file=sys.stderr)
            return 2
    engine = Engine(config, executor, tokenizer, draft_model=draft).start()
    results: list[Result] = []
    profile = ""
    try:
        run_engine(engine, Workload(2, 2, 8, 4), prompts[:2], "warm-up")
        if args.chat:
            from app.bench import speculative as bench_speculative

            results = bench_speculative.compare(engine, tokenizer, args.chat, args.output,
                                                args.repeats)
            work = Workload(1, 1, results[0].prompt_tokens, args.output)
            args.no_single = True
            args.baseline = None
        elif args.profile:
            from app.bench.profile import StackSampler

            with StackSampler() as sampler:
                results.append(run_engine(engine, work, prompts, "ferry (continuous batching)"))
            profile = sampler.report()
        else:
            results.append(run_engine(engine, work, prompts, "ferry (continuous batching)"))
        if args.structured_fraction and not args.chat:
            from app.bench import structured as bench_structured

            picked = bench_structured.constrained_indices(len(prompts),
                                                          args.structured_fraction)
            grammar = bench_structured.constraint()
            run_engine(engine, Workload(2, 2, 8, 4), prompts[:2], "warm-up", {0}, grammar)
            run = run_engine(engine, work, prompts,
                             f"ferry, {len(picked)} of {len(prompts)} under a JSON schema",
                             picked, grammar)
            p50, p99 = bench_structured.mask_percentiles(engine)
            run.note = f"mask per token p50 {p50} us, p99 {p99} us"
            results.append(run)
        if not args.no_single:
            single = Workload(1, 1, args.prompt, args.output)
            results.append(run_engine(engine, single, prompts[:1], "ferry, one request alone"))
    finally:
        engine.stop()
    if args.baseline == "hf":
        from app.bench import hf as bench_hf

        if executor.model_path is None:  # from_pretrained always records it
            print("ferry bench: --baseline hf needs the model's path", file=sys.stderr)
            return 2
        model, torch = bench_hf.load(executor.model_path, dtype)
        pad = next(iter(executor.eos_ids), 0)
        bench_hf._generate(model, torch, [prompts[0][:8]], Workload(1, 1, 8, 4), pad)  # warm-up
        subset = prompts[:min(args.baseline_requests, len(prompts))]
        results.append(bench_hf.one_at_a_time(model, torch, subset, work, pad, len(prompts)))
        results.append(bench_hf.static_batches(model, torch, prompts, work, pad))
    kernels = kernel_status().split(" (")[0]  # native / off / unavailable: why
    if executor.fused is not None:
        kernels += ", fused decode layers"
    kernels += f"; CPU {describe_cpu_level()}"  # every figure says which CPU it came from
    report(results, work, dtype, args.json, kernels, executor.describe())
    if profile:
        print(profile, file=sys.stderr if args.json else sys.stdout)
    return 0


def report(results: list[Result], work: Workload, dtype: str, as_json: bool,
           kernels: str = "", runs: str = "") -> None:
    rows = [r.row() for r in results]
    by = {r.system: r for r in results}
    ratios = {}
    ferry, single = results[0], by.get("ferry, one request alone")
    for r in results:
        if "under a JSON schema" in r.system:
            ratios["structured / unconstrained (output tok/s)"] = r.output_tps / ferry.output_tps
        if r.system.startswith("hf generate, one"):
            ratios["ferry / hf one-at-a-time (output tok/s)"] = ferry.output_tps / r.output_tps
            hf_tpot, one_tpot = pct(r.tpot, 0.5), single and pct(single.tpot, 0.5)
            if hf_tpot and one_tpot:  # per-token time: a speculative step writes several
                ratios["single request / hf batch 1 (decode tok/s)"] = hf_tpot / one_tpot
        elif r.system.startswith("hf generate, static"):
            ratios["ferry / hf static batches (output tok/s)"] = ferry.output_tps / r.output_tps
    if as_json:
        json.dump({"workload": asdict(work), "dtype": dtype, "kernels": kernels, "runs": runs,
                   "results": rows,
                   "ratios": {k: round(v, 2) for k, v in ratios.items()}}, sys.stdout, indent=1)
        print()
        return
    print(f"workload: {work.requests} requests, prompt {work.prompt}, output {work.output}, "
          f"concurrency {work.concurrency}, rate {work.rate or 'all at once'}, "
          f"shared prefix {work.shared_prefix}, dtype {dtype}"
          + (f", CPU kernels {kernels}" if kernels else "")
          + (f"; model runs as {runs}" if runs else ""))  # e.g. GGUF Q4_1 + Q8_0 head, ...
    cols = ["system", "output_tok_s", "prefill_tok_s", "ttft_p50_ms", "ttft_p95_ms",
            "itl_p50_ms", "itl_p95_ms", "tok_s_user", "scheduler_share_pct", "accepted_pct",
            "tokens_per_step"]
    heads = ["system", "out tok/s", "prefill tok/s", "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms",
             "ITL p95 ms", "tok/s/user", "sched %", "drafts kept %", "tok/step"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join("---" for _ in heads) + "|")
    for row in rows:
        cells = ["-" if row[c] is None else str(row[c]) for c in cols]
        note = f" ({row['note']})" if row["note"] else ""
        print("| " + cells[0] + note + " | " + " | ".join(cells[1:]) + " |")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x")

"""`ferry bench`: drive the engine with a synthetic workload, optionally beside HF generate.

The command line and the run's order; the workload and its client threads are in
`app.bench.workload`, the table in `app.bench.report`.
"""
from __future__ import annotations

import argparse
import sys

from app.bench.report import report
from app.bench.workload import Result, Workload, run_engine
from engine import POLICIES, EngineConfig


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
    p.add_argument("--max-draft", type=int, default=EngineConfig().max_draft, metavar="K",
                   help="drafted tokens per request and round, at most (default "
                        f"{EngineConfig().max_draft})")
    p.add_argument("--profile", action="store_true",
                   help="sample the engine thread during the throughput run and print where "
                        "its time goes (products, attention, sampling, scheduling, ...)")
    p.add_argument("--deterministic", action="store_true",
                   help="batch invariance on, as `ferry serve --deterministic` (its cost)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def _validate(args: argparse.Namespace) -> str | None:
    for name in ("requests", "concurrency", "prompt", "output", "max_prefill_tokens",
                 "baseline_requests", "repeats", "max_draft"):
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
    from app.serve import LoadOptions, assemble, load_model
    from engine import ModelNotFound
    from engine.host import describe_cpu_level, kernel_status, set_kernel_build_dir

    work = Workload(args.requests, args.concurrency, args.prompt, args.output, args.rate,
                    args.shared_prefix, args.seed)
    slots = args.max_running or args.concurrency
    config = EngineConfig(max_running=slots, max_prefill_tokens=args.max_prefill_tokens,
                          kv_tokens=max(4096, slots * (args.prompt + args.output + 32),
                                        args.stall + 8192),
                          policy=args.policy, speculative=args.speculative,
                          max_draft=args.max_draft)
    paths = get_paths()
    set_kernel_build_dir(paths.kernels_cache)
    if args.deterministic:
        from app.serve import turn_deterministic_on

        if error := turn_deterministic_on(args.device):
            print(f"ferry bench: {error}", file=sys.stderr)
            return 2
    how = LoadOptions(args.dtype, args.device, paths.models_cache,
                      tokenizer_cache=paths.tokenizer_cache)
    try:
        executor, config = load_model(args.model, config, how)
    except ModelNotFound as exc:
        print(f"ferry bench: {exc}", file=sys.stderr)
        return 2
    dtype = str(executor.dtype).removeprefix("torch.")
    if args.stall:
        from app.bench import stall as bench_stall

        bench_stall.report(executor, args.stall, args.max_prefill_tokens)
        return 0
    prompts = work.prompts(executor.vocab_size)
    from engine import DraftModelError

    draft = args.draft_model if args.speculative == "draft" else None
    try:
        # grammars and chats need the tokenizer; a draft model is checked against it
        built = assemble(executor, config, how,
                         tokenizer=bool(args.structured_fraction or args.chat),
                         tokenizer_cache=paths.tokenizer_cache, draft=draft)
    except (DraftModelError, ModelNotFound) as exc:
        print(f"ferry bench: draft model: {exc}", file=sys.stderr)
        return 2
    tokenizer, engine = built.tokenizer, built.engine.start()
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
    if args.deterministic:
        kernels += "; deterministic (batch invariant)"
    report(results, work, dtype, args.json, kernels, executor.describe())
    if profile:
        print(profile, file=sys.stderr if args.json else sys.stdout)
    return 0

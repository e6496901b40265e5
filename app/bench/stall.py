"""`ferry bench --stall`: how long one user's long prompt stalls another user's replies.

User "b" streams replies; once they decode, user "a" submits a long prompt. The worst gap
between b's tokens is the stall; under `interleave` and `mixed` it should stay near one
prefill chunk, while `prefill-first` stalls b for the whole prompt.
"""
from __future__ import annotations

import random
import threading
import time
from itertools import pairwise

from engine import Engine, EngineConfig, Policy, SamplingParams


def measure(executor: object, policy: Policy, long_prompt: int, budget: int,
            decoders: int = 4, output: int = 64) -> dict[str, float]:
    pool = executor.config  # type: ignore[attr-defined]  # the KV pool was sized from it
    config = EngineConfig(max_running=decoders + 1, max_prefill_tokens=budget,
                          kv_tokens=pool.kv_tokens, page_size=pool.page_size, policy=policy,
                          prefix_cache=False)
    engine = Engine(config, executor).start()  # type: ignore[arg-type]
    rng = random.Random(0)
    gaps: list[float] = []
    lock = threading.Lock()
    decoding = threading.Event()

    def reader(prompt: list[int]) -> None:
        handle = engine.submit(prompt, SamplingParams(max_tokens=output, ignore_eos=True),
                               owner="b")
        times = []
        for ev in handle.events(timeout=600):
            if getattr(ev, "token_ids", None):
                times.append(time.perf_counter())
                if len(times) == 3:
                    decoding.set()
        with lock:
            gaps.extend(b - a for a, b in pairwise(times[2:]))

    try:
        threads = [threading.Thread(target=reader, args=([rng.randrange(100, 40000)
                                                           for _ in range(16)],))
                   for _ in range(decoders)]
        for t in threads:
            t.start()
        decoding.wait(120)
        start = time.perf_counter()
        long = engine.submit([rng.randrange(100, 40000) for _ in range(long_prompt)],
                             SamplingParams(max_tokens=1, ignore_eos=True), owner="a")
        list(long.events(timeout=600))
        prefill_time = time.perf_counter() - start
        for t in threads:
            t.join()
    finally:
        engine.stop()
    chunk_rounds = [r.duration for r in engine.snapshot().rounds if r.phase != "decode"]
    return {"worst_stall_s": max(gaps), "median_itl_s": sorted(gaps)[len(gaps) // 2],
            "long_prompt_ttft_s": prefill_time,
            "max_prefill_round_s": max(chunk_rounds, default=0.0)}


def report(executor: object, long_prompt: int, budget: int) -> None:
    print(f"stall: 4 users decoding while another submits a {long_prompt}-token prompt "
          f"(prefill budget {budget})")
    print("| policy | worst stall ms | median ITL ms | longest prefill round ms "
          "| long prompt TTFT s |")
    print("|---|---|---|---|---|")
    policies: tuple[Policy, ...] = ("prefill-first", "interleave", "mixed")
    for policy in policies:
        m = measure(executor, policy, long_prompt, budget)
        print(f"| {policy} | {m['worst_stall_s'] * 1000:.0f} | {m['median_itl_s'] * 1000:.0f} | "
              f"{m['max_prefill_round_s'] * 1000:.0f} | {m['long_prompt_ttft_s']:.2f} |")

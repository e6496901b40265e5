"""`ferry bench`'s workload and its run: random-token prompts (ignore_eos, so every request
makes exactly `output` tokens), closed-loop client threads that each stream one request at a
time, and the figures of one system's run (`Result`)."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise


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

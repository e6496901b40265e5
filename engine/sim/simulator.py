"""`ferry simulate`: the real scheduler against a simulated executor in virtual time.

Round k runs from boundary k to k + 1; arrivals and cancels are seen at boundaries; a
boundary where nothing can run prints no round (idle time is skipped).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from engine.config import POLICIES, EngineConfig
from engine.runtime.core import EngineCore, RoundRecord
from engine.scheduling.admission import image_ahead
from engine.scheduling.batch import Batch, BatchItem, Sampled
from engine.scheduling.request import Request, RequestError, SamplingParams
from engine.sim.scenario import Scenario, ScenarioError, SimRequest, load
from engine.speculative import DraftPolicy, Speculator
from engine.vision import ImageInput, cache_ids

SIM_EOS = -1  # never a prompt id
SIM_TOKEN = 0


class SimExecutor:
    """Samples SIM_TOKEN, or SIM_EOS as the request's `eos_at`-th output token. A speculative
    item keeps the next number of drafts its request's `accept` script gives (at most those
    drafted) and emits them and one more token, each SIM_EOS where `eos_at` falls."""

    def __init__(self, eos_at: dict[str, int], accept: dict[str, tuple[int, ...]] | None = None,
                 encode_rounds: dict[str, int] | None = None) -> None:
        self.eos_at = eos_at
        self.accept = accept or {}
        self.used: dict[str, int] = {}  # speculative rounds run per request
        # by image digest: rounds its encoder takes ahead of its chunk, and those run
        self.encode_rounds = encode_rounds or {}
        self.encoded: dict[str, int] = {}

    @property
    def image_ready(self) -> Callable[[str], bool] | None:
        """As a vision executor's (Scheduler.image_ready), where some image's encoder runs
        ahead; None keeps every image inline, as before."""
        if not self.encode_rounds:
            return None
        return lambda digest: self.encoded.get(digest, 0) >= self.encode_rounds.get(digest, 0)

    @property
    def image_progress(self) -> Callable[[str], str | None] | None:
        if not self.encode_rounds:
            return None

        def progress(digest: str) -> str | None:
            rounds = self.encode_rounds.get(digest, 0)
            done = self.encoded.get(digest, 0)
            return f"round {done + 1} of {rounds}" if rounds > 0 and done < rounds else None
        return progress

    def scripted(self, req: Request, k: int) -> list[int]:
        """The drafter's source: k drafts while the request's script lasts."""
        return [SIM_TOKEN] * k if self.used.get(req.id, 0) < len(self.accept.get(req.id, ())) \
            else []

    def _token(self, req: Request, nth: int) -> int:
        return SIM_EOS if self.eos_at.get(req.id) == nth else SIM_TOKEN

    def run(self, batch: Batch) -> list[Sampled]:
        out: list[Sampled] = []
        for it in batch.items:
            req = it.request
            if not it.sample:
                out.append(None)
            elif it.drafts:
                i = self.used.get(req.id, 0)
                self.used[req.id] = i + 1
                script = self.accept.get(req.id, ())  # unscripted drafts (another drafter's)
                kept = min(script[i] if i < len(script) else 0, len(it.drafts))
                out.append(tuple(self._token(req, req.num_outputs + n)
                                 for n in range(1, kept + 2)))
            else:
                out.append(self._token(req, req.num_outputs + 1))
        ready = self.image_ready
        for req in batch.encodes:  # a round of encoder work on each one's next image
            assert ready is not None
            image = image_ahead(req, ready)
            if image is not None:
                self.encoded[image.digest] = self.encoded.get(image.digest, 0) + 1
        return out

    def release(self, request: Request) -> None:
        pass


def _digest(image_id: str) -> str:
    return hashlib.sha256(image_id.encode()).hexdigest()


def cancel_time(req: SimRequest) -> float:
    """When a cancel takes effect: never before its request arrives."""
    assert req.cancel_at is not None
    return max(req.cancel_at, req.arrive)


class Simulation:
    def __init__(self, scenario: Scenario, detail: bool = True) -> None:
        self.scenario = scenario
        self.detail = detail
        self.boundary = 0
        executor = SimExecutor({r.id: r.eos_at for r in scenario.requests if r.eos_at},
                               {r.id: r.accept for r in scenario.requests if r.accept},
                               {_digest(key): rounds for r in scenario.requests
                                for _, _, key, _, rounds in r.images if rounds})
        # the real drafter's policy (adaptive length, pauses) over the scripted drafts
        drafter = Speculator(DraftPolicy(max_len=scenario.engine.max_draft), executor.scripted)
        self.core = EngineCore(scenario.engine, executor, clock=lambda: float(self.boundary),
                               cache_outputs=False, drafter=drafter)
        self.requests: dict[str, Request] = {}
        self.result: dict[str, dict[str, Any]] = {}
        self.rounds: list[dict[str, Any]] = []
        self._pending_finished: list[str] = []

    def run(self) -> dict[str, Any]:
        arrivals = sorted(self.scenario.requests, key=lambda r: r.arrive)  # stable: file order
        # By the time a cancel takes effect (never before its request arrives), so that a
        # cancel sent before a late arrival does not hold back the cancels after it.
        cancels = sorted((r for r in arrivals if r.cancel_at is not None), key=cancel_time)
        a = c = 0
        num_rounds = 0
        while True:
            k = self.boundary
            while a < len(arrivals) and arrivals[a].arrive <= k:
                self._submit(arrivals[a])
                a += 1
            while c < len(cancels) and cancel_time(cancels[c]) <= k:
                if self.core.cancel(cancels[c].id) is not None:
                    self._pending_finished.append(cancels[c].id)
                c += 1
            record = self.core.step()
            if record is None:
                times = [arrivals[a].arrive] if a < len(arrivals) else []
                if c < len(cancels):
                    times.append(cancel_time(cancels[c]))
                if not times:
                    break
                assert not self.core.scheduler.running, "idle with running requests"
                self.boundary = max(k + 1, math.ceil(min(times)))
                continue
            num_rounds += 1
            finished = self._pending_finished + [r.id for r in record.finished]
            self._pending_finished = []
            if self.detail:
                self.rounds.append(self._round_json(k, record, finished, arrivals, a))
            self.boundary = k + 1
        self.core.scheduler.check_accounting()
        for rid, req in self.requests.items():
            # The clock reads the boundary index during a round, so times are round numbers.
            self.result[rid].update(
                first_token_round=None if req.first_token_at is None else int(req.first_token_at),
                finish_round=None if req.finished_at is None else int(req.finished_at),
                finish_reason=req.finish_reason, output_tokens=req.num_outputs)
        out: dict[str, Any] = {"rounds": self.rounds if self.detail else num_rounds}
        out["requests"] = self.result
        return out

    def _submit(self, sim: SimRequest) -> None:
        params = SamplingParams(max_tokens=sim.output, ignore_eos=sim.ignore_eos)
        req = Request(list(sim.prompt_ids), params, id=sim.id, owner=sim.user,
                      arrival=sim.arrive, eos_ids=frozenset({SIM_EOS}))
        if sim.images:  # positions the encoder fills; the prefix cache keys them by image
            req.images = tuple(ImageInput(_digest(key), None, at, n, whole)
                               for at, n, key, whole, _ in sim.images)
            req.cache_key = cache_ids(req.prompt_ids, req.images)
        self.requests[sim.id] = req
        self.result[sim.id] = {}
        try:
            self.core.submit(req)
        except RequestError as exc:  # could never run: fail at once, never block the queue
            req.finish_reason, req.finished_at, req.error = "error", float(self.boundary), str(exc)
            self.result[sim.id]["error"] = str(exc)
            self._pending_finished.append(sim.id)

    def _round_json(self, k: int, record: RoundRecord, finished: list[str],
                    arrivals: list[SimRequest], visible: int) -> dict[str, Any]:
        sched = self.core.scheduler
        batch = record.batch
        waiting = [r.id for r in sched.ordered_waiting()]
        # Requests arriving during the round join the queue at the next boundary.
        waiting += [r.id for r in arrivals[visible:] if r.arrive < k + 1]
        reasons = {rid: {"code": w.code, "text": w.text} for rid, w in sched.wait_reasons().items()}
        for rid in waiting:
            reasons.setdefault(rid, {"code": "arriving", "text": f"arrived during round {k}"})
        encodes = {"encodes": [r.id for r in batch.encodes]} if batch.encodes else {}
        return {
            "round": k, "phase": batch.phase,
            "batch": [_item_json(it, token, emitted) for it, token, emitted
                      in zip(batch.items, record.tokens, record.emitted)],
            **encodes,
            "outputs": {r.id: (self.requests[r.id].num_outputs if r.id in self.requests else 0)
                        for r in self.scenario.requests},
            "finished": finished,
            "running": [r.id for r in sched.running],
            "waiting": waiting, "waiting_reasons": reasons,
            "free_slots": sched.slots.num_free, "kv_used": sched.kv.held,
        }


def _item_json(item: BatchItem, token: Sampled, emitted: tuple[int, ...]) -> dict[str, Any]:
    """A batch entry; a speculative one adds its drafts, those kept and the tokens emitted
    (fewer than kept + 1 when EOS or max_tokens ended the request inside the run)."""
    out: dict[str, Any] = {"id": item.request.id, "tokens": item.num_tokens}
    if item.drafts:
        out.update(drafts=len(item.drafts),
                   accepted=len(token) - 1 if isinstance(token, tuple) else 0,
                   emitted=len(emitted))
    return out


def simulate(scenario: Scenario, detail: bool = True) -> dict[str, Any]:
    return Simulation(scenario, detail).run()


def format_table(result: dict[str, Any]) -> str:
    """A table of rounds, one line each (as in docs/architecture.md)."""
    head = (f"{'round':>5}  {'phase':<8} {'batch':<24} {'running':<14} {'waiting (why)':<30} "
            "finished")
    lines = [head, "-" * len(head)]
    for r in result["rounds"]:
        # a speculative entry: id:1+drafts(kept)
        batch = " ".join([f"{b['id']}:1+{b['drafts']}({b['accepted']})" if "drafts" in b
                          else f"{b['id']}:{b['tokens']}" for b in r["batch"]]
                         + [f"{rid}:E" for rid in r.get("encodes", ())])
        waiting = " ".join(f"{w}({r['waiting_reasons'][w]['code']})" for w in r["waiting"])
        running = " ".join(r["running"]) or "-"
        lines.append(f"{r['round']:>5}  {r['phase']:<8} {batch:<24} {running:<14} "
                     f"{waiting or '-':<30} {' '.join(r['finished']) or '-'}")
    lines.append("")
    lines.append(f"{'request':<10} {'first token':>11} {'finished':>8}  reason     outputs")
    for rid, q in result["requests"].items():
        ftr = "-" if q["first_token_round"] is None else q["first_token_round"]
        fin = "-" if q["finish_round"] is None else q["finish_round"]
        lines.append(f"{rid:<10} {ftr:>11} {fin:>8}  {q['finish_reason'] or '-':<10} "
                     f"{q['output_tokens']}")
    return "\n".join(lines)


def _defaults() -> str:
    d = EngineConfig()
    return ", ".join(f"{f.name}={getattr(d, f.name)!r}" for f in fields(EngineConfig))


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="ferry simulate")
    parser.description = (
        "Run a scenario file through the real scheduler, KV accounting and prefix cache with a "
        "simulated executor (one round = one unit of virtual time; no model, no torch). "
        f"Engine fields left out of the file take the defaults: {_defaults()}.")
    parser.add_argument("file", help="scenario JSON: {\"engine\": {...}, \"requests\": [...]}")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print every round as JSON")
    out.add_argument("--summary", action="store_true",
                     help="print only the round count and per-request results (large runs)")
    parser.add_argument("--policy", choices=POLICIES, help="override the file's policy")
    return parser


def run_cli(args: argparse.Namespace) -> int:
    try:
        scenario = load(args.file, args.policy)
    except ScenarioError as exc:
        print(f"ferry simulate: {exc}", file=sys.stderr)
        return 2
    result = simulate(scenario, detail=not args.summary)
    if args.json or args.summary:
        json.dump(result, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(result))
    return 0


def cli(argv: list[str]) -> int:
    return run_cli(build_parser().parse_args(argv))

"""One engine round: select -> run -> process, over any executor.

The engine thread and the simulator both drive this; neither knows the other exists.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.scheduling.batch import Batch, Drafter, Executor, Sampled
from engine.scheduling.request import FinishReason, Request
from engine.scheduling.scheduler import Scheduler
from engine.speculative import DraftModel, DraftModelError, DraftPolicy, Speculator

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RoundRecord:
    batch: Batch
    tokens: list[Sampled]  # what the executor returned
    emitted: list[tuple[int, ...]]  # per item, the tokens appended to its output
    finished: list[Request]  # ended in this round (error included)
    error: str | None
    started: float
    duration: float  # executor time
    schedule_time: float  # select + process time


class EngineCore:
    def __init__(self, config: EngineConfig, executor: Executor, clock: Callable[[], float],
                 cache_outputs: bool = True, drafter: Drafter | None = None,
                 draft_model: DraftModel | None = None) -> None:
        if drafter is None and config.speculative == "ngram":
            drafter = Speculator(DraftPolicy(max_len=config.max_draft))
        elif drafter is None and config.speculative == "draft":
            if draft_model is None:
                raise DraftModelError("speculative 'draft' needs a draft model")
            drafter = Speculator(DraftPolicy(max_len=config.max_draft), model=draft_model)
        self.drafter = drafter
        self.scheduler = Scheduler(config, cache_outputs=cache_outputs, drafter=drafter)
        # the executor's few-row decode path, where it has one: drafts stay within it
        self.scheduler.decode_rows = getattr(executor, "decode_rows", None)
        # a vision executor encodes images ahead of their chunks, a slice a round
        self.scheduler.image_ready = getattr(executor, "image_ready", None)
        self.scheduler.image_progress = getattr(executor, "image_progress", None)
        self.executor = executor
        self.clock = clock

    @property
    def config(self) -> EngineConfig:
        return self.scheduler.config

    def submit(self, req: Request) -> None:
        """Queue `req`; raises RequestError when it could never run."""
        self.scheduler.add(req)

    def cancel(self, request_id: str, reason: FinishReason = "cancelled") -> Request | None:
        req = self.scheduler.cancel(request_id, self.clock(), reason)
        if req is not None:
            self.executor.release(req)
        return req

    def step(self) -> RoundRecord | None:
        """Run one round; None when nothing can run."""
        t0 = self.clock()
        batch = self.scheduler.select(t0)
        if batch is None:
            return None
        t1 = self.clock()
        error = None
        tokens: list[Sampled]
        try:
            tokens = list(self.executor.run(batch))
        except Exception as exc:  # a failed round fails only its batch
            log.exception("round failed")
            error = f"{type(exc).__name__}: {exc}"
            tokens = [None] * len(batch.items)
        t2 = self.clock()
        before = [it.request.num_outputs for it in batch.items]
        if error is None:
            finished = self.scheduler.process(batch, tokens, t2)
        else:
            finished = self.scheduler.fail(batch, error, t2)
        emitted = [tuple(it.request.output_ids[n:]) for it, n in zip(batch.items, before)]
        for req in finished:
            self.executor.release(req)
        t3 = self.clock()
        return RoundRecord(batch, tokens, emitted, finished, error, t0, t2 - t1,
                           (t1 - t0) + (t3 - t2))

"""The engine facade: a scheduler thread that owns all state, an inbox, and snapshots.

Other threads call submit / cancel / snapshot; only the scheduler thread touches the
scheduler. Events go out per request through its handle (docs/architecture.md, The engine thread).
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from engine.config import ADMISSIONS, POLICIES, EngineConfig
from engine.runtime.core import EngineCore, RoundRecord
from engine.runtime.events import (
    Cancel,
    FinalEvent,
    Reconfigure,
    Stop,
    Submit,
    Timings,
    TokenEvent,
    Usage,
)
from engine.runtime.handle import RequestHandle
from engine.runtime.metrics import MetricsRecorder
from engine.runtime.snapshot import EngineSnapshot, RequestView, RoundView
from engine.runtime.snapshot_builder import build_snapshot, request_view, round_view
from engine.scheduling.batch import BatchItem, Executor
from engine.scheduling.constraint import Constraint
from engine.scheduling.request import (
    Request,
    RequestError,
    SamplingParams,
    TokenLogprob,
    new_request_id,
)
from engine.text.reasoning import Reasoning
from engine.vision import ImageInput, cache_ids

if TYPE_CHECKING:
    from engine.execution.model.vision import VisionConfig
    from engine.execution.residency import Footprint
    from engine.execution.text.tokenizer import Tokenizer
    from engine.speculative import DraftModel
    from engine.structured.compiler import GrammarCompiler

log = logging.getLogger(__name__)
FOOTPRINT_TTL = 2.0  # seconds a reading of the model's resident parts is reused
Message = Submit | Cancel | Reconfigure | Stop


class QueueFull(RuntimeError):
    """A bound on queued work was hit; answer 429 with `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int = 2) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Engine:
    def __init__(self, config: EngineConfig, executor: Executor,
                 tokenizer: Tokenizer | None = None, eos_ids: frozenset[int] = frozenset(),
                 clock: Callable[[], float] = time.monotonic,
                 turns: Callable[[], AbstractContextManager[object]] | None = None,
                 draft_model: DraftModel | None = None) -> None:
        # a model executor tells the widest window of the model's local (sliding-window)
        # layers; those keep KV for it only (sliding_kv.py), and the scheduler runs such a
        # model without the prefix cache or speculative decoding (Scheduler's guard)
        window = int(getattr(executor, "sliding_window", 0) or 0)
        if window:
            config = dataclasses.replace(config, sliding_window=window)
        # a GPU executor may hold fewer KV positions than asked (its memory): book those
        kv_tokens = int(getattr(executor, "kv_tokens", 0) or 0)
        if 0 < kv_tokens < config.kv_tokens:
            config = dataclasses.replace(config, kv_tokens=kv_tokens)
        self.config = config
        # several models on one CPU: each round is taken inside a turn that engines share
        # (engine.models.FairTurns); one model alone runs its rounds back to back
        self._turns = turns
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids or (tokenizer.eos_ids if tokenizer is not None else frozenset())
        self.clock = clock
        self._core = EngineCore(config, executor, clock, draft_model=draft_model)
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._handles: dict[str, RequestHandle] = {}  # live; written by callers, popped by thread
        self._lock = threading.Lock()  # guards _handles and _per_owner across threads
        self._per_owner: dict[str, int] = {}
        self._metrics = MetricsRecorder()
        self._rounds: deque[RoundView] = deque(maxlen=config.rounds_kept)
        self._finished: deque[RequestView] = deque(maxlen=64)  # for inspection after the end
        self._round_index = 0
        self._snapshot = build_snapshot(self._core.scheduler, self._metrics, (), clock())
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        # Busy-round totals (seconds): whole round vs executor, for the scheduler's share.
        self.round_time = 0.0
        self.executor_time = 0.0
        self._grammars: GrammarCompiler | None = None
        self._grammar_lock = threading.Lock()
        self._grammar_bytes = 0  # what the compiler's view of the vocabulary holds
        self._footprint: tuple[float, Footprint] | None = None  # (when read, the parts)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Engine:
        if self.config.grammars_at_start and self.tokenizer is not None \
                and self.task == "generate":
            try:
                self.grammars()
            except RequestError as exc:  # constrained requests will say why; serving goes on
                log.warning("constrained output unavailable: %s", exc)
        self._thread = threading.Thread(target=self._run, name="ferry-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop admitting, cancel what is live (partial output is kept), join the thread."""
        if self._thread is None:
            return
        self._inbox.put(Stop())
        self._thread.join(timeout)
        self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- caller API (any thread) -------------------------------------------------------------
    def submit(self, prompt_ids: list[int], params: SamplingParams, owner: str = "local",
               request_id: str | None = None, owner_limit: int | None = None,
               reasoning: Reasoning | None = None,
               handle: RequestHandle | None = None,
               images: tuple[ImageInput, ...] = ()) -> RequestHandle:
        """Queue a request. Raises RequestError (bad input, never fits) or QueueFull.
        `reasoning`: split a thinking model's reasoning from its answer (chat requests);
        `handle`: one made earlier (a request that waited for its model to load); `images`:
        a vision model's images, placed in the prompt (engine.vision.expand)."""
        if not self.alive:
            raise RuntimeError("the engine is not running")
        req = Request(list(prompt_ids), params, id=request_id or new_request_id(), owner=owner,
                      arrival=self.clock(), eos_ids=self.eos_ids)
        if images or self.vision is not None:
            self._place_images(req, images)
        self._core.scheduler.validate(req)  # read-only: config and pool size
        if params.embed != (self.task != "generate"):
            raise RequestError("this model makes embeddings only" if not params.embed
                               else "this model does not make embeddings")
        if params.constraint is not None:  # a copy of the checked compile, else compiled now
            req.matcher = self.grammars().matcher(params.constraint)
        if handle is None:
            handle = RequestHandle(req.id, owner, req.prompt_ids, self.tokenizer, params.stop,
                                   self.cancel, reasoning)
        with self._lock:
            if len(self._handles) >= self.config.max_waiting + self.config.max_running:
                self._metrics.rejected += 1
                raise QueueFull(f"the queue is full ({self.config.max_waiting} waiting)")
            if owner_limit is not None and self._per_owner.get(owner, 0) >= owner_limit:
                self._metrics.rejected += 1
                raise QueueFull(f"{owner} already has {owner_limit} requests queued or running")
            if req.id in self._handles:
                raise RequestError(f"request id {req.id} is in use")
            self._handles[req.id] = handle
            self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
            self._idle.clear()
        self._inbox.put(Submit(req))
        return handle

    @property
    def vision(self) -> VisionConfig | None:
        """A vision model's image side (engine.execution.model.vision); None: text only."""
        vision: VisionConfig | None = getattr(self._core.executor, "vision", None)
        return vision

    @property
    def takes_images(self) -> bool:
        return self.vision is not None

    def _place_images(self, req: Request, images: tuple[ImageInput, ...]) -> None:
        """Check that `images` fill exactly the prompt's image-token positions (a prompt
        holding the image token without its image would run on the placeholder's
        embedding: refused), and key the prefix cache by them."""
        vision = self.vision
        if vision is None:
            raise RequestError("this model takes no images")
        per_image = vision.tokens_per_image  # 0: each image its own (dynamic resolution)
        if sum(1 for t in req.prompt_ids if t == vision.image_token_id) != \
                sum(image.length for image in images):
            raise RequestError("the prompt holds the model's image token without an image "
                               "for it (send images as image_url content parts)")
        if not images:
            return
        for image in images:
            if image.offset < 0 or image.end > req.prompt_len or (
                    per_image and image.length != per_image) or any(
                        t != vision.image_token_id for t in req.prompt_ids[image.offset:image.end]):
                raise RequestError("an image's positions must hold the model's image token"
                                   + (f", {per_image} of them" if per_image else ""))
            if image.grid is not None and image.grid[0] * image.grid[1] != image.length:
                raise RequestError(f"an image's grid {image.grid} does not lay out its "
                                   f"{image.length} positions")
        req.images = tuple(images)
        req.cache_key = cache_ids(req.prompt_ids, images)

    @property
    def executor(self) -> Executor:
        """The model side (read-only use: its sizes and what it supports)."""
        return self._core.executor

    @property
    def task(self) -> str:
        """"embed" for an embedding model, "score" for a cross-encoder (its executor says),
        else "generate"."""
        return str(getattr(self._core.executor, "task", "generate"))

    @property
    def grammars_built(self) -> bool:
        """Whether the grammar compiler (its view of the vocabulary) exists yet."""
        return self._grammars is not None

    def grammars(self) -> GrammarCompiler:
        """The model's grammar compiler, built on first use (about a second)."""
        with self._grammar_lock:  # not _lock: building takes a second, submits go on
            if self._grammars is None:
                if self.tokenizer is None:
                    raise RequestError("constrained output needs the model's tokenizer")
                from engine.execution.residency import Measured
                from engine.structured.compiler import GrammarCompiler

                vocab = getattr(self._core.executor, "vocab_size", None)
                try:
                    with Measured() as grew:
                        self._grammars = GrammarCompiler(self.tokenizer.hf, vocab)
                    self._grammar_bytes = grew.bytes
                except (ValueError, TypeError, RuntimeError) as exc:  # e.g. a slow tokenizer
                    raise RequestError("constrained output is unavailable with this model's "
                                       f"tokenizer: {exc}") from exc
            return self._grammars

    def footprint(self) -> Footprint | None:
        """The model's resident bytes by part (None for an executor that cannot tell)."""
        measure = getattr(self._core.executor, "footprint", None)
        if measure is None:
            return None
        now = time.monotonic()
        if self._footprint is None or now - self._footprint[0] > FOOTPRINT_TTL:
            # reading the pages takes milliseconds: the dashboard and API share one reading
            parts = measure(getattr(self.tokenizer, "resident", 0), self._grammar_bytes)
            self._footprint = (now, parts)
        return self._footprint[1]

    def check_constraint(self, constraint: Constraint) -> Constraint:
        """Raise RequestError (saying why) when `constraint` does not compile; else it,
        compiled (submitting it then compiles nothing). Blocks: call it off the event loop."""
        return self.grammars().check(constraint)

    def cancel(self, request_id: str, reason: str = "cancelled") -> bool:
        """Ask to end a request; True when it was live. Applied at the next round boundary."""
        with self._lock:
            live = request_id in self._handles
        if live:
            self._inbox.put(Cancel(request_id, reason))  # type: ignore[arg-type]
        return live

    def reconfigure(self, policy: str | None = None, admission: str | None = None) -> None:
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        if admission is not None and admission not in ADMISSIONS:
            raise ValueError(f"unknown admission order {admission!r}")
        self._inbox.put(Reconfigure(policy, admission))

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def handle(self, request_id: str) -> RequestHandle | None:
        with self._lock:
            return self._handles.get(request_id)

    def live_ids(self, owner: str | None = None) -> list[str]:
        with self._lock:
            return [h.id for h in self._handles.values() if owner is None or h.owner == owner]

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until nothing is live and the accounting was checked (tests, shutdown)."""
        return self._idle.wait(timeout)

    # -- the scheduler thread ----------------------------------------------------------------
    def _run(self) -> None:
        scheduler = self._core.scheduler
        while True:
            messages = self._receive(block=not scheduler.has_work)
            started = self.clock()
            if any(isinstance(m, Stop) for m in messages):
                self._shutdown(messages)
                return
            for message in messages:
                self._apply(message)
            turn = self._turns() if self._turns is not None and scheduler.has_work \
                else nullcontext()
            with turn:
                record = self._core.step()
            if record is not None:
                self._after_round(record)
            self._publish()  # before idle is signalled: wait_idle() then sees the last round
            if not scheduler.has_work:
                self._check_idle()
            if record is not None:
                self.round_time += self.clock() - started
                self.executor_time += record.duration

    def _receive(self, block: bool) -> list[Message]:
        messages: list[Message] = []
        if block:
            messages.append(self._inbox.get())
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def _apply(self, message: Message) -> None:
        if isinstance(message, Submit):
            try:
                self._core.submit(message.request)
            except RequestError as exc:
                self._end(message.request, "error", str(exc))
        elif isinstance(message, Cancel):
            req = self._core.cancel(message.request_id, message.reason)
            if req is not None:
                self._end(req, req.finish_reason or "cancelled", None)
        elif isinstance(message, Reconfigure):
            changes: dict[str, Any] = {k: v for k, v in (("policy", message.policy),
                                                         ("admission", message.admission)) if v}
            if changes:
                # frozen config: the scheduler and this facade share the new value
                self.config = dataclasses.replace(self.config, **changes)
                self._core.scheduler.config = self.config

    def _after_round(self, record: RoundRecord) -> None:
        self._rounds.append(round_view(self._round_index, record))
        self._round_index += 1
        now = self.clock()
        out = prefill = 0
        for item, token, emitted in zip(record.batch.items, record.tokens, record.emitted):
            if not item.is_decode:
                prefill += item.num_tokens
            if record.error is not None:
                continue
            req = item.request
            if item.is_decode:
                self._metrics.on_decode(len(emitted), len(item.drafts),
                                        len(token) - 1 if isinstance(token, tuple) else 0)
            scored = prompt_logprobs(req, item)
            if emitted or scored is not None:
                if emitted:
                    out += len(emitted)
                    self._metrics.on_token(req, now)
                    if req.mask_time is not None:
                        self._metrics.on_mask(req.mask_time)
                        req.mask_time = None
                handle = self.handle(req.id)
                if handle is not None:
                    lps = tuple(req.output_logprobs[-len(emitted):]) if emitted and \
                        req.params.logprobs is not None and req.output_logprobs else ()
                    handle.put(TokenEvent(emitted, lps, scored))
        self._metrics.on_round(now, out, prefill)
        for req in record.finished:
            self._end(req, req.finish_reason or "error", req.error)
        if record.error is not None:
            self.last_error = record.error

    def _end(self, req: Request, reason: str, error: str | None) -> None:
        req.finish_reason = reason  # type: ignore[assignment]
        if req.finished_at is None:
            req.finished_at = self.clock()
        self._metrics.on_finish(req)
        self._finished.append(request_view(req, self.clock(), self.config.max_prefill_tokens))
        with self._lock:
            handle = self._handles.pop(req.id, None)
            if handle is not None:
                self._per_owner[handle.owner] -= 1
                if not self._per_owner[handle.owner]:
                    del self._per_owner[handle.owner]
        if handle is not None:
            handle.put(final_event(req, error))

    def _check_idle(self) -> None:
        self._core.scheduler.check_accounting()
        with self._lock:
            if not self._handles:
                self._idle.set()

    def _publish(self) -> None:
        self._snapshot = build_snapshot(self._core.scheduler, self._metrics,
                                        tuple(self._rounds), self.clock(), tuple(self._finished))

    def _shutdown(self, messages: list[Message]) -> None:
        for message in messages:  # submits that raced the stop are refused, not lost
            if isinstance(message, Submit):
                self._end(message.request, "cancelled", "the server is shutting down")
        for req in list(self._core.scheduler.live.values()):
            self._core.cancel(req.id)
            self._end(req, "cancelled", None)
        self._check_idle()
        self._publish()


def prompt_logprobs(req: Request, item: BatchItem) -> tuple[TokenLogprob | None, ...] | None:
    """The prompt's log-probabilities, once, in the round that completes a scored prompt."""
    if req.params.prompt_logprobs is None or item.start + item.num_tokens != req.prompt_len:
        return None
    return tuple(req.prompt_logprobs) if req.prompt_logprobs else (None,)


def final_event(req: Request, error: str | None) -> FinalEvent:
    start = req.arrival
    end = req.finished_at if req.finished_at is not None else start
    tpot = None
    if req.first_token_at is not None and req.num_outputs > 1:
        tpot = ((req.last_token_at or end) - req.first_token_at) / (req.num_outputs - 1)
    timings = Timings(
        queued=(req.admitted_at if req.admitted_at is not None else end) - start,
        ttft=None if req.first_token_at is None else req.first_token_at - start,
        tpot=tpot, total=end - start)
    usage = Usage(req.prompt_len, req.num_outputs, req.num_cached)
    extra: dict[str, object] = {} if req.embedding is None else {"embedding": req.embedding}
    return FinalEvent(req.finish_reason or "error", usage, timings, error, extra)

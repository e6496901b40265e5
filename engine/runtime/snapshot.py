"""Immutable views of the engine state, published by the scheduler thread after each round."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.scheduling.admission import WaitReason


@dataclass(frozen=True, slots=True)
class RequestView:
    id: str
    owner: str
    state: str  # waiting | chunked | running | finished
    position: int | None  # 1-based place in the waiting queue
    reason: WaitReason | None
    slot: int | None
    prompt_tokens: int
    cached_tokens: int
    prefill_done: int  # prompt positions computed
    chunk: int  # chunks done so far
    num_chunks: int  # chunks expected in all (1 when the prompt fits one budget)
    output_tokens: int
    max_tokens: int
    arrival: float  # engine clock seconds
    waited: float  # seconds since arrival (to admission when admitted)
    ttft: float | None
    itl: float | None
    finish_reason: str | None = None
    total: float | None = None  # seconds from arrival to the end, once finished
    constraint: str | None = None  # grammar kind of a constrained request (json_schema, ...)
    model: str | None = None  # the model serving it, where one process serves several

    @property
    def phase(self) -> str:
        if self.state == "running":
            return "decoding"
        if self.state == "chunked":
            return f"prefill chunk {self.chunk + 1} of {self.num_chunks}"
        return self.state


@dataclass(frozen=True, slots=True)
class RoundView:
    index: int
    phase: str
    batch: tuple[tuple[str, int], ...]  # (request id, tokens computed)
    finished: tuple[str, ...]
    started: float
    duration: float  # seconds the executor took
    schedule_time: float  # seconds the scheduler's own bookkeeping took
    decodes: tuple[str, ...] = ()  # ids that decoded this round (the rest prefilled)
    encodes: tuple[str, ...] = ()  # ids whose next image's encoder ran a slice this round


@dataclass(frozen=True, slots=True)
class KVView:
    total: int  # positions in the pool
    used: int  # held by live requests (page-rounded, locked prefixes included)
    reserved: int  # promised to admitted requests but not yet written
    cached: int  # evictable prefix-cache positions
    free: int

    @property
    def usage(self) -> float:
        return self.used / self.total if self.total else 0.0


@dataclass(frozen=True, slots=True)
class MetricsView:
    output_tokens_per_s: float  # over the recent window
    prefill_tokens_per_s: float
    ttft_p50: float | None
    ttft_p95: float | None
    itl_p50: float | None
    itl_p95: float | None
    completed: int
    cancelled: int
    errors: int
    rejected: int
    output_tokens_total: int
    prefill_tokens_total: int
    # (time, output tok/s, ttft, itl) samples over the last minutes for the charts
    history: tuple[tuple[float, float, float | None, float | None], ...] = ()
    # cumulative (upper bound, count) pairs, for the Prometheus histograms
    ttft_buckets: tuple[tuple[float, int], ...] = ()
    ttft_sum: float = 0.0
    itl_buckets: tuple[tuple[float, int], ...] = ()
    itl_sum: float = 0.0
    # constrained decoding: per-token mask time (histogram, recent p50 / p99) and finished
    # constrained requests by kind
    mask_buckets: tuple[tuple[float, int], ...] = ()
    mask_sum: float = 0.0
    mask_p50: float | None = None
    mask_p99: float | None = None
    structured_requests: tuple[tuple[str, int], ...] = ()
    # decoding since start: request-rounds and their tokens; speculative drafts made and kept
    decode_steps: int = 0
    decode_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per decoding request-round (1.0 without speculation)."""
        return self.decode_tokens / self.decode_steps if self.decode_steps else 0.0

    @property
    def acceptance(self) -> float:
        """Share of drafted tokens the target kept."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    time: float
    busy: bool
    policy: str
    admission: str
    max_running: int
    max_prefill_tokens: int
    page_size: int
    waiting: tuple[RequestView, ...]
    running: tuple[RequestView, ...]  # admitted (chunked ones included), by arrival
    slots: tuple[str | None, ...]  # request id per slot, None when free
    kv: KVView
    rounds: tuple[RoundView, ...]  # most recent last
    metrics: MetricsView
    recent_finished: tuple[RequestView, ...] = field(default=())
    # the local (sliding-window) layers' pool, None when the model has none; `kv` is then
    # the global layers' pool
    local_kv: KVView | None = None
    sliding_window: int = 0
    speculative: str = "off"  # the engine's drafter: ngram | draft | off
    prefix_cache: bool = False  # whether the scheduler caches prefixes (never with local layers)

    @property
    def free_slots(self) -> int:
        return sum(1 for s in self.slots if s is None)

    def find(self, request_id: str) -> RequestView | None:
        for view in (*self.waiting, *self.running, *self.recent_finished):
            if view.id == request_id:
                return view
        return None

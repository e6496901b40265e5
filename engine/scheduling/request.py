"""Requests and their sampling parameters: the unit the scheduler moves between queues."""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from engine.scheduling.constraint import Constraint

if TYPE_CHECKING:
    from engine.vision import ImageInput

FinishReason = Literal["length", "stop", "cancelled", "error"]
MAX_LOGPROBS = 20  # top alternatives per position, as OpenAI's and vLLM's limit
# torch.Generator.manual_seed takes a signed or unsigned 64-bit integer
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 64 - 1


class RequestError(ValueError):
    """A request is malformed or can never run (refused at submit, reason `error`)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # log-probabilities of the model's raw distribution (before temperature, top-k, top-p):
    # None = not wanted; n = the chosen token's plus the n most likely alternatives
    logprobs: int | None = None  # for each output token
    prompt_logprobs: int | None = None  # for each prompt token after the first
    constraint: Constraint | None = None  # grammar the output must match (engine.structured)
    speculative: bool = True  # may draft tokens (when the engine speculates; False: never)
    # an embedding: the prompt is encoded whole in one round and pooled (max_tokens 0)
    embed: bool = False

    def __post_init__(self) -> None:
        # max_tokens 0 is a prefill-only request: it exists to score the prompt
        least = 0 if self.prompt_logprobs is not None or self.embed else 1
        if not isinstance(self.max_tokens, int) or self.max_tokens < least:
            what = "a positive integer" if least else "an integer >= 0"
            raise RequestError(f"max_tokens must be {what}, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise RequestError(f"temperature must be within [0, 2], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be within (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0, got {self.top_k!r}")
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise RequestError(f"seed must be within [{SEED_MIN}, {SEED_MAX}], got {self.seed}")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise RequestError(f"{name} must be within [0, {MAX_LOGPROBS}], got {n}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One position's log-probability: of `token_id`, and the `top` (id, logprob) pairs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class RequestState(enum.Enum):
    WAITING = "waiting"  # in the waiting queue, holds nothing
    CHUNKED = "chunked"  # mid-chunk: back at the queue head, holds slot, KV and reservation
    RUNNING = "running"  # prefill done, decoding
    FINISHED = "finished"


_ids = itertools.count(1)


def new_request_id() -> str:
    return f"req-{next(_ids)}"


@dataclass(eq=False, slots=True)
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    id: str = field(default_factory=new_request_id)
    owner: str = "local"
    arrival: float = 0.0  # engine clock (virtual time in the simulator)
    eos_ids: frozenset[int] = frozenset()
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    # KV bookkeeping, set by the scheduler
    slot: int | None = None
    pages: list[int] = field(default_factory=list)  # page table: logical page -> pool page
    # the local (sliding-window) layers' pages: local_pages[i] holds logical page
    # local_first + i; pages before local_first lie outside the window and are released
    local_pages: list[int] = field(default_factory=list)
    local_first: int = 0
    num_cached: int = 0  # prompt positions reused from the prefix cache
    num_computed: int = 0  # positions whose KV is in the pool
    cache_node: object | None = None  # deepest locked prefix-cache node
    num_chunks: int = 0  # prefill chunks run so far
    finish_reason: FinishReason | None = None
    error: str | None = None
    # written by the executor when params ask: prompt_logprobs[p] scores prompt token p
    # (None for p == 0, which nothing predicts); output_logprobs[i] scores output token i
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    embedding: list[float] | None = None  # written by an encoder when params.embed
    # a vision model's images: each one's positions hold its encoder output, not its tokens
    images: tuple[ImageInput, ...] = ()
    # the prompt as the prefix cache keys it (engine.vision.cache_ids); None: prompt_ids
    cache_key: list[int] | None = None
    # grammar-constrained decoding: the request's own matcher (made at submit, advanced by the
    # executor on every sampled token), set done once the grammar is complete
    matcher: object | None = None
    grammar_done: bool = False
    mask_time: float | None = None  # seconds its last token's mask took
    # timings (engine clock)
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    itl: float | None = None  # last inter-token gap

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def cache_prompt(self) -> list[int]:
        """The prompt as the prefix cache keys its pages (an image's positions by its
        digest, so that different images never share KV)."""
        return self.cache_key if self.cache_key is not None else self.prompt_ids

    @property
    def num_outputs(self) -> int:
        return len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefill_left(self) -> int:
        """Prompt positions still to compute (the chunk work left)."""
        return max(0, self.prompt_len - self.num_computed)

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED

    def token_at(self, pos: int) -> int:
        n = len(self.prompt_ids)
        return self.prompt_ids[pos] if pos < n else self.output_ids[pos - n]


def append_output(req: Request, token: int, now: float) -> FinishReason | None:
    """Append one output token; the reason the request ends with it, if it does."""
    if req.first_token_at is None:
        req.first_token_at = now
    else:
        req.itl = now - (req.last_token_at or now)
    req.last_token_at = now
    req.output_ids.append(token)
    if token in req.eos_ids and not req.params.ignore_eos:
        return "stop"
    if req.grammar_done:  # the constrained output is complete (before length: it is whole)
        return "stop"
    if req.num_outputs >= req.params.max_tokens:
        return "length"
    return None

"""Admission checks in order (budget, slot, KV) and why a request waits.

The rules are written out in docs/architecture.md, Scheduling."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.scheduling.kv_accounting import KVAccounting, PrefixMatch
from engine.scheduling.request import Request, RequestState
from engine.scheduling.sliding_kv import SlidingKV
from engine.scheduling.slots import SlotTable
from engine.vision.placement import ImageInput, chunk_end


@dataclass(frozen=True, slots=True)
class WaitReason:
    code: str  # budget | slot | kv | behind | chunk | image
    text: str


def image_reason(req: Request, start: int, count: int) -> WaitReason | None:
    """`encoding image 1 of 2` when the chunk of `count` positions from `start` first reaches
    one of the request's images (its encoder runs in that round), else None."""
    for i, image in enumerate(req.images):
        if start <= image.offset < start + count:
            return WaitReason("image", f"encoding image {i + 1} of {len(req.images)}")
    return None


ImageReady = Callable[[str], bool]  # has this image (by digest) its encoder output ready?
ImageProgress = Callable[[str], "str | None"]  # how far its encoder has got, for the reason


def next_unready(req: Request, ready: ImageReady, at: int | None = None) -> int | None:
    """The index of the request's next image (the first not wholly computed by position
    `at`, by default what is computed now) when its encoder output is not ready, else None.
    Only the next: encoding a later one ahead could push this one's rows out of a small
    encoder cache while its chunks still need them."""
    done = req.num_computed if at is None else at
    for i, image in enumerate(req.images):
        if image.end > done:
            return None if ready(image.digest) else i
    return None


def image_ahead(req: Request, ready: ImageReady) -> ImageInput | None:
    """The image a round's encoder work for `req` (Batch.encodes) is for: the first not
    wholly computed whose output is not ready. Read by an executor before the round's
    results are applied, so an image this round's chunk finishes is ready and passed over."""
    for image in req.images:
        if image.end > req.num_computed and not ready(image.digest):
            return image
    return None


def encoded_end(req: Request, start: int, end: int, ready: ImageReady | None) -> int:
    """`end` of a chunk from `start`, cut before the first image in it whose encoder output
    is not ready (`start` itself when the chunk begins inside one); as it is without
    `ready` (images encoded inline by the round that reaches them)."""
    if ready is None:
        return end
    for image in req.images:
        if image.offset < end and start < image.end and not ready(image.digest):
            return max(start, image.offset)
    return end


def reservation(req: Request, page_size: int) -> int:
    """KV positions promised to an admitted request: what it may still write, page slack
    included."""
    return (max(0, len(req.prompt_ids) - req.num_computed) + req.params.max_tokens
            - len(req.output_ids) + page_size - 1)


def kv_need(req: Request, match: PrefixMatch, page_size: int) -> int:
    """A candidate's estimate: uncached prompt + max output (+ page slack, 0 when page_size=1)."""
    return req.prompt_len - match.num_tokens + req.params.max_tokens + page_size - 1


class Admission:
    """The checks of one round. `reserved` grows as requests are admitted in the round."""

    def __init__(self, config: EngineConfig, kv: KVAccounting, slots: SlotTable,
                 admitted: list[Request], local: SlidingKV | None = None,
                 image_ready: ImageReady | None = None,
                 image_progress: ImageProgress | None = None) -> None:
        self.config = config
        self.image_ready = image_ready
        self.image_progress = image_progress
        self.kv = kv
        self.local = local
        self.free_slots = slots.num_free
        self.reserved = sum(reservation(r, config.page_size) for r in admitted)
        # the local layers' pool, in pages: each admitted request's cap minus what it holds
        self.local_reserved = sum(local.reservation(r) for r in admitted) if local else 0
        self.held_back = 0  # dry runs: positions a would-be-admitted request would take

    def refuse(self, req: Request, match: PrefixMatch, budget: int) -> WaitReason | None:
        """The first failing check for a not-yet-admitted request, or None if it may enter."""
        cfg = self.config
        if budget <= 0:
            return WaitReason("budget", f"prefill budget of {cfg.max_prefill_tokens} tokens "
                                        "is used up this round")
        if self.free_slots <= 0:
            return WaitReason("slot", f"{cfg.max_running} of {cfg.max_running} slots in use")
        own = kv_need(req, match, cfg.page_size)
        available = self.kv.available_with(match) - self.held_back
        if own + self.reserved > available:
            free = max(0, available - self.reserved)
            return WaitReason("kv", f"needs {own} KV positions, {free} free ({available} "
                                    f"available, {self.reserved} of them reserved for admitted "
                                    f"requests: {own + self.reserved} asked in all)")
        if self.local is not None:
            ps = cfg.page_size
            own, free, held = self.local.cap(req), self.local.free_pages, self.local_reserved
            if own + held > free:
                return WaitReason("kv", f"needs {own * ps} local-layer KV positions (window "
                                        f"{self.local.window}), {max(0, free - held) * ps} "
                                        f"free ({free * ps} free, {held * ps} of them "
                                        "reserved for admitted requests)")
        return None

    def admitted(self, req: Request) -> None:
        self.free_slots -= 1
        self.reserved += reservation(req, self.config.page_size)
        if self.local is not None:
            self.local_reserved += self.local.reservation(req)

    def _encoding(self, req: Request, index: int) -> WaitReason:
        text = f"encoding image {index + 1} of {len(req.images)}"
        where = self.image_progress(req.images[index].digest) if self.image_progress else None
        return WaitReason("image", text if where is None else f"{text}, {where}")

    def explain(self, order: Iterable[Request], budget: int,
                decode_turn: bool) -> dict[str, WaitReason]:
        """Dry run of the next round's admission (no state changes) for the dashboard."""
        reasons: dict[str, WaitReason] = {}
        blocker: Request | None = None
        for req in order:
            if req.state is RequestState.CHUNKED:
                chunks = req.num_chunks + -(-req.prefill_left // self.config.max_prefill_tokens)
                start = req.num_computed
                step = chunk_end(req.images, start,
                                 start + min(max(budget, 0), req.prefill_left)) - start
                reason: WaitReason | None
                if self.image_ready is not None:  # as Scheduler._admit and _encodes see it
                    step = encoded_end(req, start, start + step, self.image_ready) - start
                    ahead = next_unready(req, self.image_ready, start + step)
                    reason = None if ahead is None else self._encoding(req, ahead)
                else:  # encoded inline: by the round whose chunk reaches the image
                    reason = image_reason(req, start, step)
                reasons[req.id] = reason or WaitReason(
                    "chunk", f"prefill chunk {req.num_chunks + 1} of {chunks}: "
                             f"{req.num_computed} of {req.prompt_len} prompt tokens done")
                budget -= step
                continue
            if blocker is not None:
                reasons[req.id] = WaitReason("behind", f"behind {blocker.id}")
                continue
            if decode_turn:
                reasons[req.id] = WaitReason("turn", "a decode round of the running requests "
                                                     "comes first (interleave policy)")
                blocker = req
                continue
            match = self.kv.match(req, touch=False)
            reason = self.refuse(req, match, budget)
            if reason is None:
                first = chunk_end(req.images, match.num_tokens, match.num_tokens + min(
                    budget, req.prompt_len - match.num_tokens)) - match.num_tokens
                reasons[req.id] = image_reason(req, match.num_tokens, first) or WaitReason(
                    "next", "fits: admitted at the next round")
                self.admitted(req)
                self.held_back += self.kv.available_with(PrefixMatch(None, [], 0)) \
                    - self.kv.available_with(match)
                budget -= req.prompt_len - match.num_tokens
                continue
            reasons[req.id] = reason
            blocker = req
        return reasons

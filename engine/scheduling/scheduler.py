"""The scheduler: waiting queue, running set, admission, and result processing.

Pure bookkeeping over ints (no torch): `select` forms a round's batch, the executor runs it,
`process` applies the sampled tokens. The rules are written out in docs/architecture.md, Scheduling.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from engine.config import EngineConfig
from engine.scheduling.admission import (
    Admission,
    ImageProgress,
    ImageReady,
    WaitReason,
    encoded_end,
    next_unready,
    reservation,
)
from engine.scheduling.batch import Batch, BatchItem, Drafter, Phase, Sampled
from engine.scheduling.kv_accounting import KVAccounting
from engine.scheduling.request import (
    FinishReason,
    Request,
    RequestError,
    RequestState,
    append_output,
)
from engine.scheduling.sliding_kv import SlidingKV
from engine.scheduling.slots import SlotTable
from engine.scheduling.speculation import apply_run, decode_items
from engine.vision.placement import chunk_end


class Scheduler:
    def __init__(self, config: EngineConfig, cache_outputs: bool = True,
                 drafter: Drafter | None = None) -> None:
        self.config = config
        # The one guard for models with local (sliding-window) layers; the snapshot reads
        # its outcome here. No speculative drafts: rolling back a rejected draft would have
        # to give back local pages already trimmed. No prefix cache: a hit would need the
        # local layers' KV of the window before it, which those layers do not keep.
        self.drafter = None if config.sliding_window else drafter  # None: never drafts
        self.decode_rows: int | None = None  # rows a decode round may take with drafts
        # an executor that encodes images ahead of their chunk (a vision model's): a chunk
        # stops before an image whose encoder output is not ready, and each round carries
        # that encoder work (Batch.encodes), a slice at a time, so a picture's encoder never
        # holds up other requests' rounds for long. None: the round that reaches an image
        # encodes it whole.
        self.image_ready: ImageReady | None = None
        self.image_progress: ImageProgress | None = None  # "layer 3 of 27", for the reason
        self.kv = KVAccounting(config.num_pages, config.page_size,
                               config.prefix_cache and not config.sliding_window, cache_outputs,
                               config.prefix_cache_per_owner)
        self.local = SlidingKV(config) if config.sliding_window else None
        self.slots = SlotTable(config.max_running)
        self.waiting: list[Request] = []  # arrival order; mid-chunk requests kept in front
        self.running: list[Request] = []  # prefill done, decoding; by admission
        self.chunked: list[Request] = []  # admitted, prompt not done (also in `waiting`)
        self.live: dict[str, Request] = {}
        self.last_phase: str | None = None
        self._last_owner: str | None = None  # for fair round-robin

    # -- messages --------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        """Queue a request, or refuse it at once if it could never run."""
        self.validate(req)
        if req.id in self.live:
            raise RequestError(f"duplicate request id {req.id}")
        req.state = RequestState.WAITING
        self.waiting.append(req)
        self.live[req.id] = req

    def validate(self, req: Request) -> None:
        """Raise RequestError when `req` could never run (reads only the configuration)."""
        cfg = self.config
        need = req.prompt_len + req.params.max_tokens
        if req.prompt_len == 0:
            raise RequestError("the prompt is empty")
        if need > cfg.max_context:
            raise RequestError(
                f"prompt ({req.prompt_len} tokens) + max_tokens ({req.params.max_tokens}) = "
                f"{need} exceeds the context of {cfg.max_context} tokens")
        if req.params.embed and req.prompt_len > cfg.max_prefill_tokens:
            raise RequestError(f"the input ({req.prompt_len} tokens) exceeds the prefill "
                               f"budget of {cfg.max_prefill_tokens} tokens a round")
        if need + cfg.page_size - 1 > self.kv.total:
            raise RequestError(
                f"prompt ({req.prompt_len} tokens) + max_tokens ({req.params.max_tokens}) = "
                f"{need} can never fit the KV pool of {self.kv.total} positions")

    def cancel(self, request_id: str, now: float,
               reason: FinishReason = "cancelled") -> Request | None:
        """Finish a live request; returns it, or None when there was nothing to cancel."""
        req = self.live.get(request_id)
        if req is None:
            return None
        self.finish(req, reason, now)
        return req

    @property
    def has_work(self) -> bool:
        return bool(self.live)

    # -- select ----------------------------------------------------------------------------
    def select(self, now: float) -> Batch | None:
        batch = self._select(now)
        encodes = self._encodes(() if batch is None else batch.items)
        if batch is None and not encodes:
            return None
        batch = Batch("encode", (), encodes) if batch is None else replace(batch,
                                                                           encodes=encodes)
        return self._finalize(batch)

    def _encodes(self, items: tuple[BatchItem, ...]) -> tuple[Request, ...]:
        """Admitted requests whose next image after this round's `items` has no encoder
        output ready: the round runs a slice of its encoder (after its forward, so that the
        rows this round's chunks take stay cached)."""
        ready = self.image_ready
        if ready is None:
            return ()
        after = {it.request.id: it.start + it.num_tokens for it in items}
        return tuple(r for r in self._by_arrival(self.chunked)
                     if next_unready(r, ready, after.get(r.id)) is not None)

    def _select(self, now: float) -> Batch | None:
        cfg = self.config
        running = self._by_arrival(self.running)
        if cfg.policy == "interleave" and self.last_phase == "prefill" and running:
            return Batch("decode", self._decodes(running))
        if cfg.policy == "mixed":
            decodes = self._decodes(running)
            prefills = self._admit(cfg.max_prefill_tokens - sum(d.num_tokens for d in decodes),
                                   now)
            if not (decodes or prefills):
                return None
            phase: Phase = "mixed" if decodes and prefills else \
                ("decode" if decodes else "prefill")
            return Batch(phase, decodes + prefills)
        prefills = self._admit(cfg.max_prefill_tokens, now)
        if prefills:
            return Batch("prefill", prefills)
        if running:  # drafted only here: a round that runs them
            return Batch("decode", self._decodes(running))
        return None

    def _decodes(self, running: list[Request]) -> tuple[BatchItem, ...]:
        return decode_items(running, self.config, self.drafter, self.decode_rows)

    def _admit(self, budget: int, now: float) -> tuple[BatchItem, ...]:
        """Walk the waiting queue from its head; stop at the first request that fails a check."""
        check = Admission(self.config, self.kv, self.slots, self._admitted(), self.local,
                          self.image_ready)
        items: list[BatchItem] = []
        for req in self._ordered_waiting():
            if budget <= 0:
                break
            if req.state is RequestState.WAITING:
                if req.params.embed and req.prompt_len > budget:
                    break  # an encoder's input runs whole: it waits for a round with room
                match = self.kv.match(req)
                if check.refuse(req, match, budget) is not None:
                    break
                self.kv.admit(req, match)
                req.slot = self.slots.allocate(req.id)
                req.state = RequestState.CHUNKED
                self.chunked.append(req)
                req.admitted_at = now
                self._last_owner = req.owner
                check.admitted(req)
            start = req.num_computed
            end = chunk_end(req.images, start, start + min(budget, req.prefill_left))
            take = encoded_end(req, start, end, self.image_ready) - start
            if take == 0:
                continue  # waits for its image's encoder output (Batch.encodes)
            budget -= take
            last = take == req.prefill_left
            # a prefill-only request (max_tokens 0) samples nothing, even on its last chunk
            items.append(BatchItem(req, req.num_computed, take,
                                   last and req.params.max_tokens > 0))
        return tuple(items)

    def _finalize(self, batch: Batch) -> Batch:
        # Pages are allocated once selection is done, so admission sees one consistent state.
        for item in batch.items:
            self.kv.grow(item.request, item.start + item.num_tokens)
            if self.local is not None:
                self.local.grow(item.request, item.start + item.num_tokens)
        return batch

    # -- process ---------------------------------------------------------------------------
    def process(self, batch: Batch, tokens: Sequence[Sampled], now: float) -> list[Request]:
        """Apply one round's results; returns the requests that finished in it."""
        finished: list[Request] = []
        for item, token in zip(batch.items, tokens, strict=True):
            req = item.request
            if item.drafts:  # a speculative decode: its run, then rejected pages back
                reason = apply_run(item, token, now, self.drafter)
                if reason is None:
                    self.kv.shrink(req, req.num_computed)
                else:
                    self.finish(req, reason, now)
                    finished.append(req)
                continue
            assert not isinstance(token, tuple), f"{req.id}: several tokens, no drafts"
            req.num_computed = item.start + item.num_tokens
            if self.local is not None:
                self.local.trim(req)
            if req.state is RequestState.CHUNKED:
                req.num_chunks += 1
                if req.num_computed >= req.prompt_len:
                    self._prompt_done(req)
                    if req.params.max_tokens == 0:  # prefill only: done once scored
                        self.finish(req, "length", now)
                        finished.append(req)
                        continue
            if item.sample:
                assert token is not None, f"executor sampled nothing for {req.id}"
                reason = append_output(req, token, now)
                if reason is not None:
                    self.finish(req, reason, now)
                    finished.append(req)
        self.last_phase = batch.phase
        return finished

    def fail(self, batch: Batch, error: str, now: float) -> list[Request]:
        """A round raised: its requests end with reason `error`; nothing of it is cached."""
        failed = []
        for req in [*(item.request for item in batch.items), *batch.encodes]:
            if not req.is_finished:
                req.error = error
                self.finish(req, "error", now)
                failed.append(req)
        self.last_phase = batch.phase
        return failed

    def _prompt_done(self, req: Request) -> None:
        self.waiting.remove(req)
        self.chunked.remove(req)
        req.state = RequestState.RUNNING
        self.running.append(req)
        self.kv.prompt_done(req)

    def finish(self, req: Request, reason: FinishReason, now: float) -> None:
        """End a request in this round: slot, pages and reservation are released."""
        if req.state is RequestState.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
            if req.state is RequestState.CHUNKED:
                self.chunked.remove(req)
        if self.drafter is not None:
            self.drafter.release(req)
        if req.slot is not None:
            self.slots.free(req.slot)
            req.slot = None
            self.kv.release(req, keep=reason != "error")
            if self.local is not None:
                self.local.release(req)
        req.state = RequestState.FINISHED
        req.finish_reason = reason
        req.finished_at = now
        del self.live[req.id]

    # -- order and explanations ------------------------------------------------------------
    def _admitted(self) -> list[Request]:
        return self.running + self.chunked

    @staticmethod
    def _by_arrival(reqs: list[Request]) -> list[Request]:
        return sorted(reqs, key=lambda r: r.arrival)  # stable: ties keep admission order

    def _ordered_waiting(self) -> Iterator[Request]:
        """Mid-chunk requests first, then FIFO or round-robin across owners."""
        if self.config.admission == "fifo":
            yield from self.waiting  # mid-chunk requests are already in front
            return
        queues: dict[str, list[Request]] = {}
        for req in self.waiting:
            if req.state is RequestState.CHUNKED:
                yield req
            else:
                queues.setdefault(req.owner, []).append(req)
        owners = list(queues)
        if self._last_owner in queues:  # start after the owner served last
            i = owners.index(self._last_owner) + 1
            owners = owners[i:] + owners[:i]
        depth = 0
        while owners:
            owners = [o for o in owners if depth < len(queues[o])]
            for owner in owners:
                yield queues[owner][depth]
            depth += 1

    def ordered_waiting(self) -> list[Request]:
        return list(self._ordered_waiting())

    def wait_reasons(self) -> dict[str, WaitReason]:
        """Why each waiting request waits now: a dry run of the next round's admission."""
        cfg = self.config
        check = Admission(cfg, self.kv, self.slots, self._admitted(), self.local,
                          self.image_ready, self.image_progress)
        decode_turn = (cfg.policy == "interleave" and self.last_phase == "prefill"
                       and bool(self.running))
        budget = cfg.max_prefill_tokens - (len(self.running) if cfg.policy == "mixed" else 0)
        return check.explain(self._ordered_waiting(), budget, decode_turn)

    def check_accounting(self) -> None:
        admitted = self._admitted()
        assert len(admitted) + self.slots.num_free == self.config.max_running, "slot leak"
        assert all(not r.is_finished for r in admitted), "a finished request holds a slot"
        self.kv.check(admitted)
        if self.local is not None:
            self.local.check(admitted)

    def reservations(self) -> int:
        return sum(reservation(r, self.config.page_size) for r in self._admitted())

    def local_reservations(self) -> int:
        """Local-layer positions promised to admitted requests (0 without local layers)."""
        if self.local is None:
            return 0
        return sum(self.local.reservation(r) for r in self._admitted()) * self.config.page_size

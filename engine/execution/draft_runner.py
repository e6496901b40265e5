"""The draft model's side of speculative decoding: a small model, its own KV pool, greedy
proposals (implements `engine.speculative.draft_model.DraftModel`).

The draft model is a `ModelExecutor` of its own (the same loaders and forward), with its own
pool and page free list; the target's scheduler never sees those pages. Per request it
keeps a shadow sequence: the tokens its K/V holds (the target's prefix it last saw, then its
own drafts). A proposal first finds how much of that K/V still matches the request's
sequence (the target keeps a prefix of the drafts), gives back the pages past it, computes
the positions it lacks in one forward for every request of the round, then runs k - 1
single-token decode steps, each over all the requests still drafting.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.scheduling.batch import Batch, BatchItem
from engine.scheduling.page_allocator import PageAllocator
from engine.scheduling.request import Request, SamplingParams
from engine.speculative.draft_model import DraftModelError, check_vocabularies

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Shadow:
    """One request's draft K/V: positions [0, computed) of `seq.prompt_ids` are in the pool."""

    seq: Request  # prompt_ids: the sequence the K/V was computed for (+ the last drafts)
    base: int = 0  # the target's sequence length at the last proposal (all of it matches)
    computed: int = 0
    pages: list[int] = field(default_factory=list)


class DraftRunner:
    def __init__(self, executor: ModelExecutor, target_vocab_size: int) -> None:
        self.executor = executor
        self.page_size = executor.page_size
        self.num_pages = executor.pool.num_pages
        self.pages = PageAllocator(self.num_pages)
        # argmax over the ids both models have (a padded embedding's extra rows are no token)
        self.vocab = min(executor.vocab_size, target_vocab_size)
        self.shadows: dict[str, Shadow] = {}
        # positions computed per request and round at most: a long prompt's K/V is built
        # over several rounds (like the target's chunked prefill), drafting once it is done
        self.chunk = executor.config.max_prefill_tokens

    @classmethod
    def load(cls, path: str | Path, target: ModelExecutor, target_vocab: dict[str, int],
             *, dtype: str = "auto", device: str = "cpu", cache_dir: str | Path | None = None,
             quantize: str | None = None) -> DraftRunner:
        """Load the draft model beside `target` (whose tokenizer's vocabulary is
        `target_vocab`); raises DraftModelError when it cannot draft for it."""
        from engine.execution.loading.loader import resolve_model
        from engine.execution.text.tokenizer import Tokenizer

        if target.sliding_window:
            raise DraftModelError("the model has sliding-window layers, which do not "
                                  "speculate: use speculative ngram or off")
        # the vocabulary first: a draft with another tokenizer fails before its weights load
        files = resolve_model(path, cache_dir, False)
        try:
            vocab = Tokenizer(files, cache_dir).hf.get_vocab()
        except Exception as exc:  # missing or unreadable: tokenizers says why
            raise DraftModelError(f"cannot read the draft model's tokenizer: {exc}") from exc
        check_vocabularies(target_vocab, vocab)
        cfg = target.config
        config = EngineConfig(kv_tokens=cfg.kv_tokens, page_size=cfg.page_size,
                              max_context=cfg.max_context,
                              max_prefill_tokens=cfg.max_prefill_tokens, speculative="off")
        draft = ModelExecutor.from_pretrained(files, config, dtype=dtype, device=device,
                                              cache_dir=cache_dir, threads=target.threads,
                                              progress=False, quantize=quantize)
        if draft.sliding_window:
            raise DraftModelError("the draft model has sliding-window layers: choose one "
                                  "without")
        log.info("draft model %s: %s", path, draft.describe())
        return cls(draft, target.vocab_size)

    @property
    def free_pages(self) -> int:
        return self.pages.num_free

    def propose(self, asks: Sequence[tuple[Request, int]]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in asks]
        live: list[tuple[int, Shadow, int]] = []  # (ask index, shadow, k)
        items: list[BatchItem] = []
        catch_up: list[BatchItem] = []  # chunks of long prompts: K/V only, no token
        for i, (req, k) in enumerate(asks):
            seq = req.prompt_ids + req.output_ids
            k = min(k, self.executor.max_context - len(seq) + 1)
            shadow = self._sync(req, seq)
            if k <= 0 or not self._cover(shadow, len(seq) + k - 1):
                continue
            start = min(shadow.computed, len(seq) - 1)  # the last token is always new
            if len(seq) - start > self.chunk:  # a long prompt: in chunks, no drafts yet
                catch_up.append(BatchItem(shadow.seq, start, self.chunk, False))
                shadow.computed = start + self.chunk
                continue
            items.append(BatchItem(shadow.seq, start, len(seq) - start, True))
            live.append((i, shadow, k))
        items += catch_up
        while items:
            tokens = self._run(items)  # the sampling items come first, in `live` order
            items, still = [], []
            for (i, shadow, k), tok in zip(live, tokens):
                out[i].append(tok)
                # the K/V now holds every position before the new draft, which goes next
                shadow.computed = len(shadow.seq.prompt_ids)
                shadow.seq.prompt_ids.append(tok)
                if len(out[i]) < k:
                    items.append(BatchItem(shadow.seq, shadow.computed, 1, True))
                    still.append((i, shadow, k))
            live = still
        return out

    def release(self, request: Request) -> None:
        shadow = self.shadows.pop(request.id, None)
        if shadow is not None:
            self._trim(shadow, 0)

    # --- helpers -----------------------------------------------------------------------------

    def _sync(self, req: Request, seq: list[int]) -> Shadow:
        """The request's shadow, its valid K/V cut to what still matches `seq`."""
        shadow = self.shadows.get(req.id)
        if shadow is None:
            shadow = self.shadows[req.id] = Shadow(Request([], SamplingParams(),
                                                           id=f"draft:{req.id}"))
        old = shadow.seq.prompt_ids
        valid = shadow.base  # the drafts after it: valid while the target kept them
        while valid < min(len(old), len(seq)) and old[valid] == seq[valid]:
            valid += 1
        shadow.computed = min(shadow.computed, valid)
        shadow.seq.prompt_ids = list(seq)
        shadow.base = len(seq)
        self._trim(shadow, shadow.computed)
        return shadow

    def _cover(self, shadow: Shadow, positions: int) -> bool:
        """Pages for positions [0, positions); False (and nothing taken) when the pool is
        short: the request drafts nothing this round."""
        need = -(-positions // self.page_size) - len(shadow.pages)
        if need > self.pages.num_free:
            return False
        shadow.pages.extend(self.pages.allocate() for _ in range(max(0, need)))
        shadow.seq.pages = shadow.pages
        return True

    def _trim(self, shadow: Shadow, positions: int) -> None:
        keep = -(-positions // self.page_size)
        while len(shadow.pages) > keep:
            self.pages.free(shadow.pages.pop())

    def _run(self, items: list[BatchItem]) -> list[int]:
        """One forward over `items` -> the greedy next token of each item that samples, in
        item order."""
        logits, rows = self.executor.compute_logits(Batch("mixed", tuple(items)))
        best = logits[:, :self.vocab].argmax(dim=-1).tolist()
        by_item = dict(zip(rows, best))
        return [int(by_item[i]) for i, it in enumerate(items) if it.sample]

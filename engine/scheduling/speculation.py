"""A speculative decode round's scheduling: drafts within the reservation, and the emitted run
applied one token at a time.

A request's decode item normally computes its last token's position. With k drafts it
computes k more (the drafts' positions), all inside what admission reserved: the last output
token is never fed back, so k <= max_tokens - outputs - 1 keeps every position below
prompt + max_tokens - 1 (and inside the context, which `Scheduler.validate` checked). The
executor's few-row decode path (`decode_rows`) bounds a round's drafts, so each row runs as
plain decoding would. The run the executor verified is applied as plain decoding would apply
it: EOS, a complete grammar or max_tokens end the request at that token, the rest is dropped.
The scheduler then frees the pages of the rejected positions (`KVAccounting.shrink`).
"""
from __future__ import annotations

from engine.config import EngineConfig
from engine.scheduling.batch import BatchItem, Drafter, Sampled
from engine.scheduling.request import FinishReason, Request, append_output


def decode_items(running: list[Request], cfg: EngineConfig, drafter: Drafter | None,
                 decode_rows: int | None) -> tuple[BatchItem, ...]:
    """One item per running request: its last token, and drafts where it speculates (off
    above `cfg.speculative_batch` running requests: a big batch is already compute-bound)."""
    speculate = drafter is not None and cfg.speculative != "off" \
        and len(running) <= cfg.speculative_batch
    spare = (decode_rows or len(running) * (1 + cfg.max_draft)) - len(running)
    limits = [min(cfg.max_draft, r.params.max_tokens - r.num_outputs - 1) for r in running]
    if speculate and drafter is not None:
        drafter.prepare(running, limits, spare)
    items = []
    for r, most in zip(running, limits):
        limit = min(most, spare)
        drafts = drafter.draft(r, limit) if speculate and limit > 0 and drafter else []
        spare -= len(drafts)
        items.append(BatchItem(r, r.num_computed, 1 + len(drafts), True, tuple(drafts)))
    return tuple(items)


def apply_run(item: BatchItem, token: Sampled, now: float, drafter: Drafter | None
              ) -> FinishReason | None:
    """Append a speculative item's emitted run (kept drafts + the target's token) and set
    the positions computed; the finish reason where a token ended the request."""
    req = item.request
    run = (token,) if isinstance(token, int) else token
    assert run is not None and 1 <= len(run) <= len(item.drafts) + 1, \
        f"{req.id}: {run!r} for {len(item.drafts)} drafts"
    if drafter is not None:
        drafter.record(req, len(item.drafts), len(run) - 1)
    req.num_computed = item.start
    previous = req.last_token_at
    reason = None
    for tok in run:
        req.num_computed += 1  # the position before `tok` holds valid K/V now
        reason = append_output(req, tok, now)
        if reason is not None:
            del req.output_logprobs[req.num_outputs:]  # rows scored past the end
            break
    if previous is not None:  # the round's gap, shared by the tokens it wrote
        req.itl = (now - previous) / (req.num_computed - item.start)
    return reason

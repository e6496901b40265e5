"""Verification of drafted tokens: which of k drafts the target keeps, and the token after.

A speculative round gives the target's logits at 1 + k positions of one sequence: after the
last accepted token and after each draft. Greedy: drafts are kept while each equals the
target's argmax, then the argmax at the first mismatch (or after the last draft) is added,
so the output is token for token what plain greedy decoding writes. Sampled: the standard
rejection rule (Leviathan et al., Chen et al.): draft d drawn from q is kept with probability
min(1, p(d) / q(d)); at the first rejection a token is drawn from max(p - q, 0) renormalised;
after k kept drafts one more is drawn from p. Each emitted token is then distributed as p,
the distribution plain sampling draws from (temperature, top-k, top-p applied as
`Sampler` applies them). Prompt lookup's drafts are a point mass (q(d) = 1).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.kernels import ops
from engine.scheduling.batch import BatchItem, Sampled
from engine.scheduling.request import SamplingParams, TokenLogprob


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [n, vocab] -> [n, vocab] float32: the distribution one sampling step draws
    from (temperature, then top-k, then top-p with Hugging Face's rule, as Sampler)."""
    logits = logits.float() / params.temperature
    vocab = logits.shape[1]
    if params.top_k == 0 and params.top_p >= 1.0:
        return torch.softmax(logits, dim=-1)
    vals, order = torch.sort(logits, dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    if params.top_k > 0:
        vals = vals.masked_fill(rank[None, :] >= params.top_k, float("-inf"))
    probs = torch.softmax(vals, dim=-1)
    keep = (probs.cumsum(dim=-1) - probs) < params.top_p
    keep[:, 0] = True
    probs = probs * keep
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, order, probs)


def _draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    """One token from `probs` (unnormalised) by inverse CDF. The uniform number comes from
    the request's CPU generator (a seed gives the same tokens on any device) and moves to the
    distribution's device as a plain number."""
    cdf = probs.cumsum(dim=0)
    u = float(torch.rand(1, generator=gen, device="cpu"))
    point = (cdf[-1] * u).reshape(1)
    return int(torch.searchsorted(cdf, point, right=True).clamp_(max=probs.shape[0] - 1))


def verify(logits: torch.Tensor, drafts: Sequence[int], params: SamplingParams,
           gen: torch.Generator | None = None, draft_probs: torch.Tensor | None = None
           ) -> list[int]:
    """logits [k + 1, vocab] of one sequence, drafts [k] -> the tokens it emits (the kept
    drafts and one more: 1 to k + 1 tokens). draft_probs [k, vocab]: the drafter's
    distributions (a draft model's); None: each draft was certain (prompt lookup)."""
    k = len(drafts)
    if logits.shape[0] != k + 1:
        raise ValueError(f"verify: {k} drafts need {k + 1} logits rows, got {logits.shape[0]}")
    if params.greedy:  # the argmax plain decoding takes (Sampler: first maximum)
        best = ops.argmax(logits) if ops.usable(logits) else logits.argmax(dim=-1).tolist()
        out = []
        for i, d in enumerate(drafts):
            if best[i] != d:
                break
            out.append(d)
        out.append(best[len(out)])
        return out
    if gen is None:
        raise ValueError("verify: sampled verification needs the request's generator")
    p = target_probs(logits, params)
    out = []
    for i, d in enumerate(drafts):
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        u = float(torch.rand(1, generator=gen, device="cpu"))
        if q_d > 0 and u * q_d < float(p[i, d]):  # u < p/q, without dividing
            out.append(d)
            continue
        if draft_probs is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - draft_probs[i].float()).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q (rounding): p itself is the residual
            residual = p[i]
        out.append(_draw(residual, gen))
        return out
    out.append(_draw(p[k], gen))
    return out


def verify_items(logits: torch.Tensor, rows: Sequence[int], items: Sequence[BatchItem],
                 out: list[Sampled], generator: Callable[[str, int | None], torch.Generator],
                 score: Callable[[torch.Tensor, list[int], int], list[TokenLogprob]]
                 ) -> tuple[torch.Tensor, list[int]]:
    """A round's logits, `rows[r]` the item of row r (a speculative item has 1 + k rows in a
    row) -> each speculative item's emitted run into `out` (and, where its request asks, the
    log-probabilities `score` gives each kept token from its own row); returns the other
    rows and their items, for plain sampling."""
    plain: list[int] = []
    first = 0
    while first < len(rows):
        i = rows[first]
        drafts = items[i].drafts
        if not drafts:
            plain.append(first)
            first += 1
            continue
        req = items[i].request
        gen = None if req.params.greedy else generator(req.id, req.params.seed)
        run = verify(logits[first:first + len(drafts) + 1], drafts, req.params, gen)
        out[i] = tuple(run)
        if req.params.logprobs is not None:
            req.output_logprobs.extend(score(logits[first:first + len(run)], run,
                                             req.params.logprobs))
        first += len(drafts) + 1
    return logits[plain], [rows[r] for r in plain]

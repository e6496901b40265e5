"""Verification of drafts (engine/execution/sampling/verify.py): greedy keeps exactly what plain
greedy decoding writes; sampled verification leaves every emitted token distributed as plain
sampling's (chi-square over a small vocabulary, fixed seeds)."""
from __future__ import annotations

import pytest
import torch

from engine.execution.sampling.sampler import Sampler
from engine.execution.sampling.verify import target_probs, verify
from engine.scheduling.request import SamplingParams

VOCAB = 6
CHI2_DF5_P001 = 20.52  # chi-square critical value, 5 degrees of freedom, p = 0.001
TRIALS = 3000


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token the distribution excludes was emitted"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum())


def test_greedy_keeps_the_argmax_run() -> None:
    logits = torch.tensor([[0, 5, 1.0], [3, 0, 1], [0, 0, 9], [7, 1, 0]])
    params = SamplingParams(temperature=0.0)
    assert verify(logits, [1, 0, 2], params) == [1, 0, 2, 0]  # all kept, then one more
    assert verify(logits, [1, 2, 2], params) == [1, 0]  # second draft wrong: the argmax
    assert verify(logits[:1], [], params) == [1]  # no drafts: a plain step


def test_rows_must_match_drafts() -> None:
    with pytest.raises(ValueError, match="2 drafts need 3"):
        verify(torch.zeros(2, VOCAB), [1, 2], SamplingParams())


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8),
])
def test_target_probs_is_what_the_sampler_draws(params: SamplingParams) -> None:
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(3)) * 2
    p = target_probs(logits, params)[0]
    sampler, counts = Sampler(), torch.zeros(VOCAB)
    for _ in range(TRIALS):
        counts[sampler.sample(logits, [params], ["r"])[0]] += 1
    assert chi2(counts, p) < CHI2_DF5_P001


@pytest.mark.parametrize("use_draft_model", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.8, top_k=4, top_p=0.9)])
def test_rejection_rule_keeps_the_distribution(use_draft_model: bool,
                                               params: SamplingParams) -> None:
    """Two drafts per round: the first and the second emitted token are each distributed
    as the target's distribution at their position, whatever the drafts were."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5)) * 1.5
    p = target_probs(logits, params)
    q = torch.softmax(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(6)), -1)
    first, second = torch.zeros(VOCAB), torch.zeros(VOCAB)
    second_given_kept = 0
    for _ in range(TRIALS):
        if use_draft_model:
            drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
            out = verify(logits, drafts, params, gen, q)
        else:
            # prompt lookup: fixed guesses, the first a likely token (often kept), the
            # second the least likely one the filters leave (mostly rejected)
            drafts = [int(p[0].argmax()), int(torch.where(p[1] > 0, p[1], 2.0).argmin())]
            out = verify(logits, drafts, params, gen)
        assert 1 <= len(out) <= 3
        first[out[0]] += 1
        if len(out) >= 2 and out[0] == drafts[0]:
            second[out[1]] += 1
            second_given_kept += 1
    assert chi2(first, p[0]) < CHI2_DF5_P001
    # given the first draft was kept, the next token follows row 1 (the logits after it)
    assert second_given_kept > 300
    assert chi2(second, p[1]) < CHI2_DF5_P001


def test_sampled_needs_a_generator() -> None:
    with pytest.raises(ValueError, match="generator"):
        verify(torch.zeros(2, VOCAB), [1], SamplingParams(temperature=1.0))

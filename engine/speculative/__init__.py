"""Speculative decoding's bookkeeping (torch-free): drafting from the sequence itself
(prompt lookup) or with a draft model (the interface; the model runs in engine.execution),
and the adaptive draft length. Verification (the rejection rule) is torch
work and lives in engine.execution.sampling.verify. `Speculator` is the scheduler's drafter."""
from engine.speculative.adaptive import DraftLength, DraftPolicy
from engine.speculative.draft_model import (
    DraftModel,
    DraftModelError,
    PreparedDrafts,
    check_vocabularies,
)
from engine.speculative.ngram import NgramIndex
from engine.speculative.speculator import Speculator, eligible

__all__ = ["DraftLength", "DraftModel", "DraftModelError", "DraftPolicy", "NgramIndex",
           "PreparedDrafts", "Speculator", "check_vocabularies", "eligible"]

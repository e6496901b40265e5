"""How many tokens to draft for one request: the draft length follows its acceptance.

A speculative round costs the target one forward over 1 + k positions per sequence instead
of 1; it pays when enough drafted tokens are accepted. Per request: the length doubles after
a round that accepted every draft and falls to what was accepted plus one after a round that
did not; a request whose drafts keep failing (`patience` rounds in a row with
nothing accepted) stops drafting for `cooldown` tokens, then tries again at length 1. The
batch-size gate lives with the caller (the scheduler), which knows the round.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DraftPolicy:
    max_len: int = 8
    patience: int = 3  # rounds with nothing accepted before drafting pauses
    cooldown: int = 32  # tokens decoded plainly before drafting again

    def __post_init__(self) -> None:
        if self.max_len < 1 or self.patience < 1 or self.cooldown < 0:
            raise ValueError("max_len and patience must be >= 1, cooldown >= 0")


class DraftLength:
    """One request's draft length and acceptance record."""

    def __init__(self, policy: DraftPolicy = DraftPolicy()) -> None:
        self.policy = policy
        self.length = min(4, policy.max_len)
        self.drafted = 0  # tokens proposed so far
        self.accepted = 0  # of those, accepted
        self.rounds = 0  # speculative rounds (with at least one draft)
        self._misses = 0
        self._paused_for = 0

    @property
    def active(self) -> bool:
        return self._paused_for == 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def wanted(self) -> int:
        """Tokens to draft this round (0: decode plainly)."""
        return self.length if self.active else 0

    def record(self, drafted: int, accepted: int) -> None:
        """A round's outcome: `drafted` proposed (0 for a plain round), `accepted` kept."""
        if drafted == 0:
            self._paused_for = max(0, self._paused_for - 1)
            return
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted {accepted} of {drafted} drafted")
        self.drafted += drafted
        self.accepted += accepted
        self.rounds += 1
        if accepted == drafted:  # double: a reply that copies runs long
            self.length = min(self.policy.max_len, 2 * self.length)
        else:
            self.length = max(1, accepted + 1)
        self._misses = self._misses + 1 if accepted == 0 else 0
        if self._misses >= self.policy.patience:
            self._misses, self._paused_for, self.length = 0, self.policy.cooldown, 1

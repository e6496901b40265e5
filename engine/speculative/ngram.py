"""Prompt-lookup drafting: propose the tokens that followed the last earlier occurrence of the
sequence's own ending (its longest suffix n-gram, `max_n` down to `min_n`).

No second model: a reply that repeats its prompt (an edited paragraph, fixed code, a
reformatted list) drafts itself. The index maps each n-gram to where its latest occurrence
ended, for occurrences that have at least one token after them, so `propose` is a few dict
lookups whatever the length, and `extend` costs `max_n - min_n + 1` inserts per token.
"""
from __future__ import annotations

from collections.abc import Iterable


class NgramIndex:
    def __init__(self, tokens: Iterable[int] = (), min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n, got {min_n}, "
                             f"{max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest occurrence
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new: Iterable[int]) -> None:
        """Append tokens (prompt, accepted outputs); each end they give a successor to is
        indexed (the latest occurrence wins: nearby text predicts best)."""
        toks = self.tokens
        for tok in new:
            end = len(toks)  # the n-grams ending here now have `tok` after them
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[tuple(toks[end - n:end])] = end
            toks.append(tok)

    def propose(self, k: int) -> list[int]:
        """Up to k draft tokens continuing the sequence; [] when its ending was not seen."""
        toks = self.tokens
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            end = self._ends.get(tuple(toks[len(toks) - n:]))
            if end is not None:
                return toks[end:end + k]
        return []

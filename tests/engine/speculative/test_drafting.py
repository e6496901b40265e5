"""Prompt-lookup drafting and the adaptive draft length (engine/speculative), torch-free."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.speculative import DraftLength, DraftPolicy, NgramIndex


def naive_propose(toks: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition, by search: the longest suffix n-gram's latest earlier occurrence that
    has a token after it, and up to k tokens that followed it."""
    for n in range(min(max_n, len(toks)), min_n - 1, -1):
        suffix = toks[len(toks) - n:]
        for end in range(len(toks) - 1, n - 1, -1):
            if toks[end - n:end] == suffix:
                return toks[end:end + k]
    return []


def test_repeated_text_drafts_what_followed() -> None:
    prompt = [5, 6, 7, 8, 9, 10, 11]
    index = NgramIndex(prompt + [1, 5, 6])
    assert index.propose(3) == [7, 8, 9]
    index.extend([7, 8])
    assert index.propose(4) == [9, 10, 11, 1]  # runs on into what came after the prompt


def test_nothing_seen_drafts_nothing() -> None:
    assert NgramIndex([1, 2, 3, 4]).propose(4) == []
    assert NgramIndex([]).propose(4) == []
    assert NgramIndex([1, 2, 1, 2]).propose(0) == []


def test_latest_occurrence_wins() -> None:
    index = NgramIndex([1, 2, 3, 9, 1, 2, 4, 9, 1, 2], min_n=2, max_n=2)
    assert index.propose(1) == [4]


def test_longest_suffix_first() -> None:
    # "2 3" last continued with 7, but "1 2 3" (longer) continued with 4
    index = NgramIndex([1, 2, 3, 4, 0, 2, 3, 7, 0, 1, 2, 3], min_n=2, max_n=3)
    assert index.propose(1) == [4]


@given(st.lists(st.integers(0, 4), max_size=60), st.integers(1, 6), st.integers(1, 3),
       st.integers(0, 2))
def test_index_equals_the_search(toks: list[int], k: int, min_n: int, extra: int) -> None:
    max_n = min_n + extra
    index = NgramIndex(toks[: len(toks) // 2], min_n=min_n, max_n=max_n)
    index.extend(toks[len(toks) // 2:])  # built in two steps: the same index
    assert index.propose(k) == naive_propose(toks, k, min_n, max_n)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="min_n"):
        NgramIndex([], min_n=3, max_n=2)


def test_length_follows_acceptance() -> None:
    d = DraftLength(DraftPolicy(max_len=10))
    assert d.wanted() == 4
    d.record(4, 4)
    assert d.wanted() == 8  # doubled
    d.record(8, 8)
    assert d.wanted() == 10  # capped
    d.record(10, 2)
    assert d.wanted() == 3  # what was accepted, plus one
    d.record(3, 3)
    assert d.wanted() == 6
    assert d.drafted == 25 and d.accepted == 17 and d.rounds == 4
    assert d.acceptance == pytest.approx(17 / 25)


def test_failing_drafts_pause_then_retry() -> None:
    d = DraftLength(DraftPolicy(max_len=8, patience=2, cooldown=3))
    d.record(4, 0)
    d.record(1, 0)
    assert not d.active and d.wanted() == 0
    for _ in range(3):
        d.record(0, 0)  # plain rounds
    assert d.active and d.wanted() == 1


def test_bad_record_is_refused() -> None:
    with pytest.raises(ValueError):
        DraftLength().record(2, 3)

"""The dashboard's rounds timeline from the engine's round views: P and D for the positions
a request computed, E for a round that ran its next image's encoder, x for one that ended
outside a batch."""
from __future__ import annotations

from engine.runtime.snapshot import RoundView
from web.pages.dashboard.board import timeline


def test_encoder_rounds_are_marked_e() -> None:
    rounds = (
        RoundView(0, "mixed", (("text", 1), ("pic", 12)), (), 0.0, 0.3, 0.001, ("text",),
                  ("pic",)),
        RoundView(1, "decode", (("text", 1),), (), 0.3, 0.3, 0.001, ("text",), ("pic",)),
        RoundView(2, "encode", (), ("text",), 0.6, 0.2, 0.001, (), ("pic",)),
        RoundView(3, "prefill", (("pic", 300),), (), 0.8, 2.0, 0.001, ()),
    )
    rows = dict(timeline(rounds)["rows"])
    assert rows["text"] == [("D", 1, False), ("D", 1, False), ("×", 0, True), None]
    # a round that computed positions says so; one that only encoded says E
    assert rows["pic"] == [("P", 12, False), ("E", 0, False), ("E", 0, False),
                           ("P", 300, False)]

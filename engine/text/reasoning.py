"""Thinking models' reasoning, split from the answer as the text streams.

Qwen3, QwQ and the DeepSeek-R1 distills write `<think>...</think>` before their answer. The
splitter works on the detokenized text, so a tag split over tokens or over deltas (`<th` at
the end of one, `ink>` at the start of the next) is still found: whatever could be the start
of the tag it waits for is held back until the next text decides it.

Only a think block at the very start of the output counts (after whitespace): a model that
mentions `<think>` later in its answer is left alone. When the prompt itself opens the block
(the R1 distills, and Qwen3's thinking templates, end the generation prompt with
`<think>\\n`) the output starts inside it and only `</think>` appears. Whitespace around the
reasoning and between it and the answer is dropped, as the chat templates drop it when they
render an earlier turn.
"""
from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True, slots=True)
class Reasoning:
    """How one request's output carries its reasoning."""

    open: str = OPEN
    close: str = CLOSE
    started: bool = False  # the prompt ends inside an open think block
    fresh: bool = True  # False: the prompt ends mid-reasoning (a reply continued), keep spaces

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.open, self.close, self.started, self.fresh)


def _partial(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    """push(text) -> (reasoning, content) deltas; flush() -> what was held back at the end."""

    def __init__(self, open_tag: str = OPEN, close_tag: str = CLOSE,
                 started: bool = False, fresh: bool = True) -> None:
        self.open, self.close = open_tag, close_tag
        # before: may still open a block; inside: reasoning; after: the answer
        self.state = "inside" if started else "before"
        self._held = ""
        self._fresh = fresh  # nothing of this part emitted yet (strip its leading space)

    def push(self, text: str) -> tuple[str, str]:
        reasoning, content = "", ""
        buf = self._held + text
        self._held = ""
        while buf:
            if self.state == "before":
                head = buf.lstrip()
                if head.startswith(self.open):
                    self.state, buf, self._fresh = "inside", head[len(self.open):], True
                elif self.open.startswith(head):  # all whitespace, or a part of the tag
                    self._held = buf
                    return reasoning, content
                else:  # no think block: the answer from here on, as written
                    self.state, self._fresh = "after", False
            elif self.state == "inside":
                if self._fresh:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    self._fresh = False
                end = buf.find(self.close)
                if end >= 0:
                    reasoning += buf[:end].rstrip()
                    self.state, buf, self._fresh = "after", buf[end + len(self.close):], True
                    continue
                keep = _partial(buf, self.close)
                body = buf[:len(buf) - keep]
                core = body.rstrip()  # trailing space may come right before the tag
                self._held = body[len(core):] + buf[len(buf) - keep:]
                reasoning += core
                return reasoning, content
            else:
                if self._fresh:
                    buf = buf.lstrip()
                    if not buf:
                        break
                    self._fresh = False
                content += buf
                break
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        """The held-back text when the output ends (a cut tag is text after all)."""
        held, self._held = self._held, ""
        if self.state == "inside":
            return held.rstrip() if not self._fresh else "", ""
        if self.state == "before":
            return "", held
        return "", held if not self._fresh else held.lstrip()

    @property
    def in_reasoning(self) -> bool:
        return self.state == "inside"


def continuation(reasoning: Reasoning, reasoning_text: str, content: str) -> tuple[str, bool]:
    """What to append to the prompt to continue a cut reply, and whether the output then
    goes on inside the think block. `reasoning.started`: the prompt already opened it."""
    opening = "" if reasoning.started else f"{reasoning.open}\n"
    if not reasoning_text:
        return (content, False) if not reasoning.started else \
            (f"{reasoning.close}\n\n{content}", False)
    if not content:
        return f"{opening}{reasoning_text}", True
    return f"{opening}{reasoning_text}\n{reasoning.close}\n\n{content}", False

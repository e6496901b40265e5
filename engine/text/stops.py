"""Stop strings over streamed text: StopMatcher finds stop strings that may span tokens (and
deltas): it holds back any suffix that could start a stop string and, on a match, returns
the text before it."""
from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """push(text) -> (text safe to emit, stopped). After a stop, everything else is dropped."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return buf[:min(hits)], True
        keep = 0  # longest suffix of buf that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """Text held back when the stream ends without a match."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

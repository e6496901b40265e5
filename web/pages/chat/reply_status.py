"""A chat reply's standing in words: where it waits and why, how far its prompt is read,
and, once it ended, its figures and why it ended."""
from __future__ import annotations

from engine import EngineSnapshot, FinalEvent, RequestView
from web.storage.store import ReplyFigures


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def find(snap: EngineSnapshot, request_id: str) -> RequestView | None:
    for view in (*snap.waiting, *snap.running):
        if view.id == request_id:
            return view
    return None


def standing(snap: EngineSnapshot, request_id: str) -> str | None:
    """"Waiting: 3rd in line · 2 of 2 slots in use", "Reading your message: chunk 2 of 5",
    "Encoding image 1 of 2 · reading your message (40 tokens)", or None once tokens flow
    (or the engine does not know the request yet)."""
    view = find(snap, request_id)
    if view is None:
        return None
    image = view.reason if view.reason is not None and view.reason.code == "image" else None
    if view.state == "waiting" and image is None:
        in_use = sum(owner is not None for owner in snap.slots)
        words = [f"Waiting: {ordinal(view.position or 1)} in line",
                 f"{in_use} of {snap.max_running} slots in use"]
        if view.reason is not None and view.reason.code != "slot":
            words.append(view.reason.text)
        return " · ".join(words)
    if view.output_tokens == 0:
        reading = _reading(view)
        if image is not None:  # its next round runs the image encoder: say which image
            return f"{image.text[:1].upper()}{image.text[1:]} · {reading[:1].lower()}{reading[1:]}"
        return reading
    return None


def _reading(view: RequestView) -> str:
    if view.num_chunks > 1:
        chunk = min(view.chunk + 1, view.num_chunks)
        return (f"Reading your message: chunk {chunk} of {view.num_chunks} "
                f"({view.prefill_done} of {view.prompt_tokens} tokens)")
    return f"Reading your message ({view.prompt_tokens} tokens)"


def figures(final: FinalEvent | None, earlier_tokens: int = 0) -> ReplyFigures:
    """Tokens, time to first token and tokens/s from the engine's report."""
    if final is None:
        return ReplyFigures()
    t = final.timings
    out = final.usage.completion_tokens
    rate = None
    if t.tpot:
        rate = 1.0 / t.tpot
    elif t.ttft is not None and t.total > t.ttft and out > 1:
        rate = (out - 1) / (t.total - t.ttft)
    return ReplyFigures(final.usage.prompt_tokens, out + earlier_tokens, t.ttft, rate)


def ended_words(final: FinalEvent | None, max_tokens: int | None, stopped_by_owner: bool,
                shut_down: bool, canceller: str | None) -> str | None:
    """Why a reply ended, in words (None for a plain end of text)."""
    reason = final.finish_reason if final is not None else "cancelled"
    if reason == "stop":
        return None
    if reason == "length":
        return f"cut at the {max_tokens}-token limit" if max_tokens else "cut at the token limit"
    if reason == "error":
        return f"failed: {final.error}" if final is not None and final.error else "failed"
    if stopped_by_owner:
        return "stopped by you"
    if shut_down:
        return "the server shut down"
    if canceller:
        return f"cancelled by {canceller} from the dashboard"
    return "cancelled"

"""Log-probabilities in OpenAI's two shapes: legacy completions' parallel lists and chat's
per-token entries. The numbers are the engine's: the model's raw distribution, before
temperature, top-k and top-p (vLLM's default "raw" logprobs)."""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from engine import Tokenizer, TokenLogprob
from engine.execution.text.compact_bpe import bytes_to_unicode
from web.api.schemas import ChatTokenLogprob, CompletionLogprobs, TopLogprob


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character -> the byte it stands for."""
    return {c: b for b, c in bytes_to_unicode().items()}


class TokenTexts:
    """Token id -> (text, UTF-8 bytes), cached. Byte-level BPE tokens give their exact bytes
    (a token may hold part of a character: its text then shows U+FFFD)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer.hf, "backend_tokenizer", None)
        byte_level = getattr(backend, "byte_level", None)  # the compact tables say
        if byte_level is None:
            byte_level = type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"
        self.byte_level = bool(byte_level)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._lookup(token_id)
            self._cache[token_id] = hit
        return hit

    def _lookup(self, token_id: int) -> tuple[str, bytes]:
        if self.byte_level:
            piece = self.tokenizer.hf.convert_ids_to_tokens(token_id)
            table = _byte_decoder()
            if isinstance(piece, str) and all(c in table for c in piece):
                raw = bytes(table[c] for c in piece)
                return raw.decode("utf-8", errors="replace"), raw
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text, text.encode()


class CompletionLogprobsBuilder:
    """Builds legacy completions' logprobs, chunk by chunk for streams; text_offset counts
    characters into the choice's text (which starts with the prompt when echoing)."""

    def __init__(self, texts: TokenTexts, top: int) -> None:
        self.texts = texts
        self.top = top
        self.offset = 0

    def build(self, ids: Sequence[int],
              scores: Sequence[TokenLogprob | None]) -> CompletionLogprobs:
        out = CompletionLogprobs([], [], [], [])
        for token_id, score in zip(ids, scores, strict=True):
            text = self.texts(token_id)[0]
            out.tokens.append(text)
            out.text_offset.append(self.offset)
            self.offset += len(text)
            if score is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(score.logprob)
            # as vLLM: the n best, and the chosen token (so logprobs=0 still names it)
            top = {self.texts(t)[0]: lp for t, lp in score.top[:self.top]}
            top.setdefault(text, score.logprob)
            out.top_logprobs.append(top)
        return out


def chat_logprobs(texts: TokenTexts, scores: Sequence[TokenLogprob],
                  top: int) -> list[ChatTokenLogprob]:
    out = []
    for score in scores:
        text, raw = texts(score.token_id)
        alternatives = []
        for token_id, logprob in score.top[:top]:
            alt_text, alt_raw = texts(token_id)
            alternatives.append(TopLogprob(alt_text, logprob, list(alt_raw)))
        out.append(ChatTokenLogprob(text, score.logprob, list(raw), alternatives))
    return out

"""Prompts in upstream mode: the upstream applies the chat template and counts the tokens.

The web layer builds prompts through a tokenizer (chat template -> ids, text -> ids) and
checks lengths with len(ids). In upstream mode no model, hence no tokenizer, is here:
GatewayTokenizer hands back an UpstreamPrompt instead, a list whose length is a cautious
estimate of the token count and which carries what the upstream is sent (the messages for
/v1/chat/completions, the text for /v1/completions). The real counts come back in the
upstream's usage.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

BYTES_PER_TOKEN = 3  # BPE tokenizers average ~4 bytes a token in English: over-estimate
TOKENS_PER_MESSAGE = 6  # role markers the template adds per message


def estimate_tokens(text: str) -> int:
    return max(1, -(-len(text.encode()) // BYTES_PER_TOKEN))


class UpstreamPrompt(list[int]):
    """A prompt for an upstream: `messages` (chat) or `text`/`ids` (completion), plus
    `continued` (an assistant reply the upstream should continue). len() estimates tokens."""

    def __init__(self, messages: Sequence[dict[str, Any]] | None = None,
                 text: str | None = None, ids: Iterable[int] | None = None,
                 continued: str = "") -> None:
        self.messages = [dict(m) for m in messages] if messages is not None else None
        self.text = text
        self.continued = continued
        if ids is not None:
            super().__init__(ids)
            self.token_ids: list[int] | None = list(self)
            return
        self.token_ids = None
        count = 0
        for m in self.messages or ():
            count += TOKENS_PER_MESSAGE + estimate_tokens(str(m.get("content") or ""))
        if text:
            count += estimate_tokens(text)
        if continued:
            count += estimate_tokens(continued)
        super().__init__([0] * max(1, count))

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def __add__(self, other: Any) -> UpstreamPrompt:  # type: ignore[override]
        """chat prompt + encoded tail: continue the reply `tail` (Continue in the chat)."""
        if isinstance(other, UpstreamPrompt) and other.text is not None:
            tail = other.text
        elif not other:
            return self
        else:
            raise TypeError("an upstream prompt can only be extended by text")
        if self.messages is not None:
            return UpstreamPrompt(self.messages, continued=self.continued + tail)
        return UpstreamPrompt(text=(self.text or "") + tail)


class GatewayTokenizer:
    """The Tokenizer surface the web layer uses, without a vocabulary."""

    vocab_size = 1 << 31  # token-id prompts are checked by the upstream
    hf = None  # no Hugging Face tokenizer behind it
    eos_ids: frozenset[int] = frozenset()
    has_chat_template = True
    chat_stops: tuple[str, ...] = ()
    takes_enable_thinking = False  # the upstream's template decides

    def encode(self, text: str, add_special_tokens: bool = True) -> UpstreamPrompt:
        return UpstreamPrompt(text=text)

    def apply_chat_template(self, messages: Sequence[dict[str, Any]],
                            add_generation_prompt: bool = True,
                            enable_thinking: bool | None = None) -> UpstreamPrompt:
        return UpstreamPrompt(messages)

    def reasoning_for(self, prompt_ids: object) -> None:
        return None  # the upstream splits reasoning itself

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if isinstance(ids, UpstreamPrompt) and ids.text is not None:
            return ids.text  # echo of a text prompt
        raise ValueError("upstream mode has no tokenizer to turn token ids into text")

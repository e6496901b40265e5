"""An embedding call's inputs as token ids, with 400s that name the field."""
from __future__ import annotations

from collections.abc import Sequence

from engine import Tokenizer
from web.api.errors import APIError

MAX_INPUTS = 2048  # inputs per call, as OpenAI's limit


def token_lists(value: object, tokenizer: Tokenizer, vocab: int, limit: int,
                truncate: bool = False, field: str = "input") -> list[list[int]]:
    """`value` (a text, texts, token ids or lists of them) -> one id list per input. Empty
    inputs, unknown ids and inputs over `limit` tokens are 400s (over the limit: cut to it
    instead when `truncate`, keeping the tokenizer's closing special token)."""
    if isinstance(value, str) or (isinstance(value, list) and value
                                  and all(isinstance(v, int) for v in value)):
        items: Sequence[object] = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise APIError(f"{field} must be a string, a list of strings or token ids", param=field)
    if not items:
        raise APIError(f"{field} must not be empty", param=field)
    if len(items) > MAX_INPUTS:
        raise APIError(f"{field} holds {len(items)} inputs; at most {MAX_INPUTS} per call",
                       param=field)
    out = []
    for i, item in enumerate(items):
        where = field if len(items) == 1 else f"{field}[{i}]"
        if isinstance(item, str):
            if not item:
                raise APIError(f"{where} is an empty string", param=field)
            ids = tokenizer.encode_truncated(item, limit) if truncate else tokenizer.encode(item)
        elif isinstance(item, list) and all(isinstance(t, int) for t in item):
            if not item:
                raise APIError(f"{where} is an empty list of tokens", param=field)
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise APIError(f"{where} holds token id {bad}, outside the model's "
                               f"vocabulary of {vocab}", param=field)
            ids = item[:limit] if truncate else list(item)
        else:
            raise APIError(f"{where} must be a string or a list of token ids", param=field)
        if len(ids) > limit:
            raise APIError(f"{where} has {len(ids)} tokens; the model takes at most {limit}",
                           param=field, code="context_length_exceeded")
        out.append(ids)
    return out

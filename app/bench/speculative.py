"""`ferry bench --chat TEXT`: one chat at temperature 0, with speculative decoding and without,
alternating on one engine in one run (the request's `speculative` field switches it), so
both see the same machine load. Greedy outputs are the same tokens either way; the rows give
decode tok/s and the share of drafted tokens kept; a speculative row names its drafter
(`--speculative ngram` or `draft` with `--draft-model`)."""
from __future__ import annotations

from typing import Any

from app.bench.workload import Result, Workload, run_engine


def compare(engine: Any, tokenizer: Any, text: str, output: int, repeats: int) -> list[Result]:
    from engine import SamplingParams

    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    work = Workload(1, 1, len(ids), output)
    results = []
    for i in range(repeats):
        for speculative in (True, False):
            params = SamplingParams(max_tokens=output, speculative=speculative)
            name = f"chat {i + 1}, speculative {'on' if speculative else 'off'}"
            result = run_engine(engine, work, [ids], name, params=params)
            if speculative:  # what drafted: prompt lookup (ngram) or a draft model (draft)
                result.note = f"drafter: {engine.snapshot().speculative}"
            results.append(result)
    return results

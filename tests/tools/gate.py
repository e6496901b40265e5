"""An executor wrapper for cancel tests: the first round with drafts waits inside the forward
until the test releases it (test_speculative_decoding, test_draft_model)."""
from __future__ import annotations

import threading
from collections.abc import Sequence

from engine.execution.executor import ModelExecutor
from engine.scheduling.batch import Batch, Sampled
from engine.scheduling.request import Request


class Gate:
    """Wraps an executor: the first round with drafts waits inside until released."""

    def __init__(self, inner: ModelExecutor) -> None:
        self.inner = inner
        self.inside = threading.Event()
        self.release_gate = threading.Event()
        self.decode_rows = inner.decode_rows

    def run(self, batch: Batch) -> Sequence[Sampled]:
        if not self.inside.is_set() and any(it.drafts for it in batch.items):
            self.inside.set()
            assert self.release_gate.wait(60)
        return self.inner.run(batch)

    def release(self, request: Request) -> None:
        self.inner.release(request)

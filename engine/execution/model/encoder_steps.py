"""A vision tower's forward as steps: a generator that yields after each layer and returns
the rows, so that the engine can run an image's encoder a few layers a round, with other
users' decode rounds between, and `run_through` runs it in one go."""
from __future__ import annotations

from collections.abc import Generator

import torch

EncoderSteps = Generator[None, None, torch.Tensor]  # yields between layers, returns the rows


def run_through(steps: EncoderSteps) -> torch.Tensor:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            out: torch.Tensor = done.value
            return out

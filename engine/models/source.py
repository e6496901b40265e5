"""What the model set is given per model: a name, how to open its tokenizer, how to load it.

The loading itself (files, torch, kernels) is app's: it passes callables in, so this package
stays torch-free and a test can hand in any loader.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import EngineConfig
from engine.scheduling.batch import Executor

if TYPE_CHECKING:
    from engine.execution.text.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """One model in memory: its executor (weights and KV pool) and the config its engine runs
    with (max_context clipped to the model's)."""

    executor: Executor
    config: EngineConfig
    runs: str = ""  # how it runs, in one line (architecture, block types, kernels, size)
    # bytes it holds, measured after the load (weights, KV pool, what loading left; not the
    # tokenizer, kept while unloaded): the budget counts this
    size: int = 0


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    # the tokenizer and chat template; opened once and kept (small) so that a request for a
    # model not yet loaded can be tokenized and accepted at once
    open_tokenizer: Callable[[], Tokenizer]
    load: Callable[[], LoadedModel]  # run on a loader thread of its own
    size: int = 0  # bytes expected once loaded (the file's size): the budget's estimate
    # what /v1/models lists before it is loaded: architecture, blocks, format, path
    details: Mapping[str, Any] = field(default_factory=dict)
    # a vision model's image side, read from its files (engine.model_vision): its requests
    # can be prepared before it loads; None: text only
    vision: Any = None

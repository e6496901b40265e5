"""Ferry's continuous-batching engine. This module is the surface `web/` and `app/` use.

Torch-free names (config, requests, the facade, events, snapshots) import at once; the
execution side (model executor, tokenizer, kernels) loads on first use, so the scheduler and
the simulator stay importable without torch (docs/development.md, Layout).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engine import structured
from engine.config import (
    ADMISSIONS,
    KV_DTYPES,
    POLICIES,
    SPECULATIVE,
    AdmissionOrder,
    ConfigError,
    EngineConfig,
    Policy,
)
from engine.kernels.cpu_level import CpuLevelError
from engine.kernels.cpu_level import apply_torch_env as apply_cpu_cap
from engine.kernels.cpu_level import describe as describe_cpu_level
from engine.models import (
    DEFAULT_KEEP_ALIVE,
    KEEP,
    Budget,
    LoadedModel,
    LoadRefused,
    ModelEvent,
    ModelInfo,
    ModelSet,
    ModelSource,
    ModelView,
    SharingRules,
    UnknownModel,
    parse_keep_alive,
    rss_bytes,
)
from engine.runtime.engine import Engine, QueueFull
from engine.runtime.events import FinalEvent, Timings, TokenEvent, Usage
from engine.runtime.handle import RequestHandle, TextDelta
from engine.runtime.metrics import Histogram, Window
from engine.runtime.snapshot import EngineSnapshot, KVView, MetricsView, RequestView, RoundView
from engine.scheduling.admission import WaitReason
from engine.scheduling.constraint import Constraint, ConstraintKind
from engine.scheduling.request import (
    MAX_LOGPROBS,
    SEED_MAX,
    SEED_MIN,
    FinishReason,
    RequestError,
    SamplingParams,
    TokenLogprob,
)
from engine.speculative import DraftModelError
from engine.text.reasoning import Reasoning, ReasoningSplitter, continuation

if TYPE_CHECKING:
    from engine.execution.attention.choice import flashinfer_missing, flashinfer_version
    from engine.execution.cpu import cpu_has_native_bf16
    from engine.execution.devices import flashinfer_kernels, pick_device, torch_build
    from engine.execution.draft_runner import DraftRunner
    from engine.execution.executor import ModelExecutor
    from engine.execution.footprint import gpu_room
    from engine.execution.loading.loader import ModelNotFound
    from engine.execution.loading.loader import resolve_model as resolve_model_files
    from engine.execution.model.describe import describe_file as describe_model_file
    from engine.execution.model.describe import model_architecture
    from engine.execution.model.linear_kernels import onednn_works
    from engine.execution.text.template_files import describe_chat_template
    from engine.execution.text.tokenizer import Tokenizer, gguf_tokenizer_dir
    from engine.kernels.native import set_build_dir as set_kernel_build_dir
    from engine.kernels.native import status as kernel_status

# name -> "module:attribute", imported on first access (PEP 562)
_LAZY: dict[str, str] = {
    "ModelExecutor": "engine.execution.executor:ModelExecutor",
    "DraftRunner": "engine.execution.draft_runner:DraftRunner",
    "ModelNotFound": "engine.execution.loading.loader:ModelNotFound",
    "Tokenizer": "engine.execution.text.tokenizer:Tokenizer",
    "gguf_tokenizer_dir": "engine.execution.text.tokenizer:gguf_tokenizer_dir",
    "resolve_model_files": "engine.execution.loading.loader:resolve_model",
    "cpu_has_native_bf16": "engine.execution.cpu:cpu_has_native_bf16",
    "pick_device": "engine.execution.devices:pick_device",
    "flashinfer_kernels": "engine.execution.devices:flashinfer_kernels",
    "flashinfer_missing": "engine.execution.attention.choice:flashinfer_missing",
    "flashinfer_version": "engine.execution.attention.choice:flashinfer_version",
    "gpu_room": "engine.execution.footprint:gpu_room",
    "torch_build": "engine.execution.devices:torch_build",
    "describe_chat_template": "engine.execution.text.template_files:describe_chat_template",
    "describe_model_file": "engine.execution.model.describe:describe_file",
    "model_architecture": "engine.execution.model.describe:model_architecture",
    "onednn_works": "engine.execution.model.linear_kernels:onednn_works",
    "set_kernel_build_dir": "engine.kernels.native:set_build_dir",
    "kernel_status": "engine.kernels.native:status",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    module, attr = _LAZY[name].split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


__all__ = [
    "ADMISSIONS",
    "DEFAULT_KEEP_ALIVE",
    "KEEP",
    "KV_DTYPES",
    "MAX_LOGPROBS",
    "POLICIES",
    "SEED_MAX",
    "SEED_MIN",
    "SPECULATIVE",
    "AdmissionOrder",
    "Budget",
    "ConfigError",
    "Constraint",
    "ConstraintKind",
    "CpuLevelError",
    "DraftModelError",
    "DraftRunner",
    "Engine",
    "EngineConfig",
    "EngineSnapshot",
    "FinalEvent",
    "FinishReason",
    "Histogram",
    "KVView",
    "LoadRefused",
    "LoadedModel",
    "MetricsView",
    "ModelEvent",
    "ModelExecutor",
    "ModelInfo",
    "ModelNotFound",
    "ModelSet",
    "ModelSource",
    "ModelView",
    "Policy",
    "QueueFull",
    "Reasoning",
    "ReasoningSplitter",
    "RequestError",
    "RequestHandle",
    "RequestView",
    "RoundView",
    "SamplingParams",
    "SharingRules",
    "TextDelta",
    "Timings",
    "TokenEvent",
    "TokenLogprob",
    "Tokenizer",
    "UnknownModel",
    "Usage",
    "WaitReason",
    "Window",
    "apply_cpu_cap",
    "continuation",
    "cpu_has_native_bf16",
    "describe_chat_template",
    "describe_cpu_level",
    "describe_model_file",
    "flashinfer_kernels",
    "flashinfer_missing",
    "flashinfer_version",
    "gguf_tokenizer_dir",
    "gpu_room",
    "kernel_status",
    "model_architecture",
    "onednn_works",
    "parse_keep_alive",
    "pick_device",
    "resolve_model_files",
    "rss_bytes",
    "set_kernel_build_dir",
    "structured",
    "torch_build",
]

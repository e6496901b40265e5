"""Ferry's continuous-batching engine. This module is the surface `web/` and `app/` use.

Torch-free names (config, requests, the facade, events, snapshots) import at once; the
execution side (model executor, tokenizer, kernels) loads on first use, so the scheduler and
the simulator stay importable without torch (docs/development.md, Layout). What the host's
tools ask of the machine (CPU level, devices, kernels' build, memory) is in `engine.host`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

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
from engine.lazy import lazy_getattr
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
from engine.vision import ImageInput, expand, runs, tile_digest

if TYPE_CHECKING:
    from engine.execution.draft_runner import DraftRunner
    from engine.execution.encoder import EncoderExecutor
    from engine.execution.executor import ModelExecutor
    from engine.execution.loading.loader import ModelNotFound
    from engine.execution.loading.loader import resolve_model as resolve_model_files
    from engine.execution.loading.loader import vision_of as model_vision
    from engine.execution.loading.projector_gguf import projector_for
    from engine.execution.model.describe import describe_file as describe_model_file
    from engine.execution.model.describe import model_architecture
    from engine.execution.model.registry import (
        embedding_task,
        is_embedding_model,
        is_encoder_folder,
    )
    from engine.execution.text.template_files import describe_chat_template
    from engine.execution.text.tokenizer import Tokenizer, gguf_tokenizer_dir
    from engine.vision.anyres import AnyresConfig
    from engine.vision.anyres import layout as anyres_layout
    from engine.vision.anyres import split as split_anyres
    from engine.vision.decode import ImageError, data_url_bytes
    from engine.vision.decode import decode as decode_image
    from engine.vision.fit import FitConfig
    from engine.vision.fit import fit as fit_image
    from engine.vision.patches import PatchConfig
    from engine.vision.patches import patchify as patchify_image
    from engine.vision.processor import ProcessorConfig
    from engine.vision.processor import preprocess as preprocess_image
    from engine.vision.tiling import TilingConfig, tile_text
    from engine.vision.tiling import split as split_image

# name -> "module:attribute", imported on first access (PEP 562)
_LAZY: dict[str, str] = {
    "ModelExecutor": "engine.execution.executor:ModelExecutor",
    "EncoderExecutor": "engine.execution.encoder:EncoderExecutor",
    "is_encoder_folder": "engine.execution.model.registry:is_encoder_folder",
    "is_embedding_model": "engine.execution.model.registry:is_embedding_model",
    "embedding_task": "engine.execution.model.registry:embedding_task",
    "DraftRunner": "engine.execution.draft_runner:DraftRunner",
    "ModelNotFound": "engine.execution.loading.loader:ModelNotFound",
    "Tokenizer": "engine.execution.text.tokenizer:Tokenizer",
    "gguf_tokenizer_dir": "engine.execution.text.tokenizer:gguf_tokenizer_dir",
    "resolve_model_files": "engine.execution.loading.loader:resolve_model",
    "describe_chat_template": "engine.execution.text.template_files:describe_chat_template",
    "describe_model_file": "engine.execution.model.describe:describe_file",
    "model_architecture": "engine.execution.model.describe:model_architecture",
    "model_vision": "engine.execution.loading.loader:vision_of",
    "projector_for": "engine.execution.loading.projector_gguf:projector_for",
    "AnyresConfig": "engine.vision.anyres:AnyresConfig",
    "anyres_layout": "engine.vision.anyres:layout",
    "split_anyres": "engine.vision.anyres:split",
    "ImageError": "engine.vision.decode:ImageError",
    "data_url_bytes": "engine.vision.decode:data_url_bytes",
    "decode_image": "engine.vision.decode:decode",
    "FitConfig": "engine.vision.fit:FitConfig",
    "fit_image": "engine.vision.fit:fit",
    "ProcessorConfig": "engine.vision.processor:ProcessorConfig",
    "preprocess_image": "engine.vision.processor:preprocess",
    "TilingConfig": "engine.vision.tiling:TilingConfig",
    "PatchConfig": "engine.vision.patches:PatchConfig",
    "patchify_image": "engine.vision.patches:patchify",
    "split_image": "engine.vision.tiling:split",
    "tile_text": "engine.vision.tiling:tile_text",
}
expand_image_tokens = expand  # a prompt's image placeholders, each repeated to its count
image_tile_runs = runs  # a tiled prompt's runs of image tokens, one per tile


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


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
    "AnyresConfig",
    "Budget",
    "ConfigError",
    "Constraint",
    "ConstraintKind",
    "DraftModelError",
    "DraftRunner",
    "EncoderExecutor",
    "Engine",
    "EngineConfig",
    "EngineSnapshot",
    "FinalEvent",
    "FinishReason",
    "FitConfig",
    "Histogram",
    "ImageError",
    "ImageInput",
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
    "PatchConfig",
    "Policy",
    "ProcessorConfig",
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
    "TilingConfig",
    "Timings",
    "TokenEvent",
    "TokenLogprob",
    "Tokenizer",
    "UnknownModel",
    "Usage",
    "WaitReason",
    "Window",
    "anyres_layout",
    "continuation",
    "data_url_bytes",
    "decode_image",
    "describe_chat_template",
    "describe_model_file",
    "embedding_task",
    "expand_image_tokens",
    "fit_image",
    "gguf_tokenizer_dir",
    "image_tile_runs",
    "is_embedding_model",
    "is_encoder_folder",
    "model_architecture",
    "model_vision",
    "parse_keep_alive",
    "patchify_image",
    "preprocess_image",
    "projector_for",
    "resolve_model_files",
    "split_anyres",
    "split_image",
    "structured",
    "tile_digest",
    "tile_text",
]

"""Ferry's settings: one validated dataclass, and the record of where each value came from.

Sources, lowest to highest: defaults < ferry.toml in the config dir < FERRY_* environment
variables < command-line flags. Loading lives in app/config_sources.py.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, fields

from engine import (
    ADMISSIONS,
    KV_DTYPES,
    POLICIES,
    SPECULATIVE,
    ConfigError,
    EngineConfig,
    RequestError,
    parse_keep_alive,
)

DTYPES = ("auto", "bfloat16", "float32")
QUANTIZE = ("none", "q8_0", "q4_0")  # a float folder's weights quantized once at load
MMPROJ_QUANTIZE = ("q8_0", "none")  # a GGUF vision tower's float matrices, where its text runs
# in blocks
DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
MIB = 1024 * 1024

# Fixed choices per setting; policy and admission also accept "" (= pick by host).
CHOICES: dict[str, tuple[str, ...]] = {
    "dtype": DTYPES,
    "quantize": QUANTIZE,
    "mmproj_quantize": MMPROJ_QUANTIZE,
    "policy": POLICIES,
    "admission": ADMISSIONS,
    "speculative": SPECULATIVE,
    "kv_dtype": KV_DTYPES,
}
# Inclusive lower (and optional upper) bounds for integer settings.
INT_RANGES: dict[str, tuple[int, int | None]] = {
    "port": (1, 65535),
    "max_loaded": (0, None),
    "max_running": (1, None),
    "max_prefill_tokens": (1, None),
    "kv_tokens": (1, None),
    "page_size": (1, None),
    "local_kv_tokens": (0, None),
    "max_waiting": (1, None),
    "per_user_limit": (1, None),
    "max_body_bytes": (1024, None),
    "max_messages": (1, None),
    "max_images": (0, None),
    "max_image_pixels": (1, None),
    "max_stop": (0, None),
    "max_tokens_limit": (1, None),
    "default_max_tokens": (1, None),
    "chat_image_bytes": (1024, None),
    "chat_conversation_image_bytes": (1024, None),
    "image_fetch_bytes": (1024, None),
}


FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "chat_temperature": (0.0, 2.0),
    "chat_top_p": (0.0, 1.0),
    "image_fetch_seconds": (0.1, 300.0),
}


class SettingsError(ValueError):
    """A setting is unknown or has a value Ferry cannot use; the message names key and source."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


def is_loopback(host: str) -> bool:
    """True when only this machine can connect (127.x, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname other than localhost resolves to something reachable


@dataclass(slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "default"  # "default" | folder | HF id | .gguf file
    # a GGUF vision model's projector file (llama.cpp's mmproj); "": the one beside the model
    mmproj: str = ""
    # a GGUF vision model's image tower where its text model runs in its blocks (CPU, dtype
    # auto): the projector file's float matrices quantized to Q8_0 at load, its products
    # with int8 activations (none: float, as the file stores them)
    mmproj_quantize: str = "q8_0"
    # several models in one process (first = the chat's default); when set, `model` is unused
    models: list[str] = field(default_factory=list)
    max_loaded: int = 0  # models loaded at once; 0: from the machine's memory
    max_memory: str = ""  # bytes the loaded models may hold ("8G", "512M"); "": 3/4 of RAM
    keep_alive: str = "5m"  # idle time before a model other than the default unloads
    # shared mode: a normal user's request for a model not loaded loads it (off: only an
    # admin's request or the dashboard's Load does; the others get 409 naming the model)
    users_load_models: bool = True
    dtype: str = "auto"  # auto on CPU: a GGUF in its own quantization, a folder as float
    quantize: str = "none"
    device: str = "auto"
    policy: str = ""  # "" -> prefill-first when local, interleave when shared
    admission: str = ""  # "" -> fifo when local, fair when shared
    max_running: int = 32
    max_prefill_tokens: int = 512
    kv_tokens: int = 16384  # 0.35 GB of KV for SmolLM2 in float16, allocated at start
    # the KV cache's element type: auto (the model's, float16 for block-quantized GGUF
    # files), float32, bfloat16, float16
    kv_dtype: str = "auto"
    page_size: int = 16
    # positions in the sliding-window layers' own pool (models with local layers); 0: enough
    # for every slot's window plus one round
    local_kv_tokens: int = 0
    prefix_cache: bool = True
    # every row of a round computed as it would be alone (engine.kernels.invariance): the same
    # greedy reply whatever shares its rounds or the prefix cache held; CPU, Ferry's kernels
    deterministic: bool = False
    speculative: str = "ngram"  # ngram (prompt lookup) | draft (draft_model drafts) | off
    # the draft model of speculative "draft": a GGUF file or a safetensors folder whose
    # tokenizer is the model's (checked when it loads)
    draft_model: str = ""
    max_waiting: int = 256
    per_user_limit: int = 8  # waiting + running requests per user
    max_body_bytes: int = MIB
    max_messages: int = 200
    max_images: int = 8  # images in one request to a vision model, and in a chat message
    max_image_pixels: int = 25_000_000  # width x height of one image, checked before decoding
    # fetch remote http(s) image URLs in requests (off: a 400); in shared mode admins' only
    fetch_image_urls: bool = False
    image_fetch_bytes: int = 20 * MIB  # one fetched image's size limit
    image_fetch_seconds: float = 10.0  # one fetch's time limit
    max_stop: int = 4
    max_tokens_limit: int = 4096
    default_max_tokens: int = 512  # a reply's limit when the request (or chat) sets none
    # the chat page's defaults; each conversation may set its own
    chat_system_prompt: str = ""  # "" -> the chat template's own default
    chat_temperature: float = 0.7
    chat_top_p: float = 0.95
    # pictures attached in the chat: the largest one file, and all of one conversation's
    chat_image_bytes: int = 10 * MIB
    chat_conversation_image_bytes: int = 50 * MIB
    open: bool = False  # open the browser once serving
    model_folders: list[str] = field(default_factory=list)
    # serve the models found on disk too (model_folders, Ollama, LM Studio, the HF cache)
    discover_models: bool = True
    # names served besides loopback, the bound address and (shared) this machine's names:
    # `name` (any port), `name:port`, `.domain` (and subdomains); a reverse proxy, a DNS name
    allowed_hosts: list[str] = field(default_factory=list)
    # upstream mode: serve in front of these servers, load no model (app/upstreams.py)
    upstreams: list[dict[str, object]] = field(default_factory=list)
    # where each value came from: "default", "file <path>", "env FERRY_X", "flag --x"
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "sources":
                _check_type(f.name, f.type, getattr(self, f.name))
        for name, (low, high) in INT_RANGES.items():
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                upto = f" to {high}" if high is not None else " or more"
                raise SettingsError(name, f"{name} must be {low}{upto}, got {value}")
        for name, (least, most) in FLOAT_RANGES.items():
            value = getattr(self, name)
            if not least <= value <= most:
                raise SettingsError(name, f"{name} must be {least:g} to {most:g}, got {value}")
        if self.chat_top_p <= 0:
            raise SettingsError("chat_top_p", "chat_top_p must be above 0")
        if not self.host.strip():
            raise SettingsError("host", "host must not be empty")
        if not self.model.strip():
            raise SettingsError("model", "model must not be empty")
        if any(not m.strip() for m in self.models) or len(set(self.models)) < len(self.models):
            raise SettingsError("models", "models must be distinct and not empty")
        try:
            parse_keep_alive(self.keep_alive)
        except RequestError as exc:
            raise SettingsError("keep_alive", str(exc)) from None
        if self.max_memory and parse_bytes(self.max_memory) is None:
            raise SettingsError("max_memory", "max_memory must be bytes or a size like 8G or "
                                              f"512M, got {self.max_memory!r}")
        if not DEVICE_RE.match(self.device):
            raise SettingsError(
                "device", f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        shared = self.shared
        if not self.policy:
            self.policy = "interleave" if shared else "prefill-first"
            self.sources.setdefault("policy", _derived_source(shared))
        if not self.admission:
            self.admission = "fair" if shared else "fifo"
            self.sources.setdefault("admission", _derived_source(shared))
        for name, choices in CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise SettingsError(
                    name, f"{name} must be one of {', '.join(choices)}, got {value!r}")
        if self.mmproj and len(self.served_models) > 1:
            raise SettingsError("mmproj", "mmproj pairs a projector with one model: with "
                                          "several, keep each one's mmproj*.gguf beside it")
        if self.speculative == "draft" and not self.draft_model.strip():
            raise SettingsError("draft_model", "speculative 'draft' needs a draft model: set "
                                               "draft_model (--draft-model PATH: a GGUF file "
                                               "or a safetensors folder with the model's "
                                               "tokenizer)")
        if self.speculative == "draft" and len(self.served_models) > 1:
            raise SettingsError("speculative", "speculative 'draft' serves one model: its "
                                               "draft model matches that model's tokenizer")
        if self.upstreams:
            from app.upstreams import normalize
            try:
                self.upstreams = normalize(self.upstreams)
            except ValueError as exc:
                raise SettingsError("upstreams", str(exc)) from None
        if self.quantize != "none" and self.dtype == "bfloat16":
            raise SettingsError("quantize", "quantize keeps float32 activations: use dtype "
                                            "auto or float32 with it")
        from web.access.hosts import HostError, check_allowed_host
        try:
            self.allowed_hosts = [check_allowed_host(h) for h in self.allowed_hosts]
        except HostError as exc:
            raise SettingsError("allowed_hosts", str(exc)) from None
        if self.kv_tokens < self.page_size:
            raise SettingsError("kv_tokens", "kv_tokens must hold at least one page (page_size)")

    @property
    def served_models(self) -> list[str]:
        """The models to serve, the default first: `models`, else the one `model`."""
        return list(self.models) or [self.model]

    @property
    def shared(self) -> bool:
        """Listening beyond loopback: access tokens are required and fairness matters."""
        return not is_loopback(self.host)

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "sources"]

    @classmethod
    def kinds(cls) -> dict[str, str]:
        """Setting name -> its type as written ("int", "str", "bool", "list[str]")."""
        return {f.name: str(f.type) for f in fields(cls) if f.name != "sources"}


def _derived_source(shared: bool) -> str:
    return "default (shared: host is not loopback)" if shared else "default (local)"


def _check_type(name: str, kind: object, value: object) -> None:
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "list[dict[str, object]]": isinstance(value, list)
        and all(isinstance(v, (str, dict)) for v in value),
    }[str(kind)]
    if not ok:
        wanted = {"int": "an integer", "float": "a number", "bool": "true or false",
                  "str": "a string",
                  "list[str]": "a list of strings",
                  "list[dict[str, object]]": "a list of URLs or tables"}[str(kind)]
        raise SettingsError(name, f"{name} must be {wanted}, got {value!r}")


def engine_config(settings: Settings, *, max_context: int | None = None) -> EngineConfig:
    """The engine's config from settings; max_context comes from the loaded model if known."""
    extra = {} if max_context is None else {"max_context": max_context}
    try:
        return EngineConfig(
            max_running=settings.max_running,
            max_prefill_tokens=settings.max_prefill_tokens,
            kv_tokens=settings.kv_tokens,
            page_size=settings.page_size,
            local_kv_tokens=settings.local_kv_tokens,
            policy=settings.policy,  # type: ignore[arg-type]  # validated against POLICIES
            admission=settings.admission,  # type: ignore[arg-type]
            prefix_cache=settings.prefix_cache,
            # a shared server keeps each user's prefixes apart (no hit on another's prompt)
            prefix_cache_per_owner=settings.shared,
            grammars_at_start=settings.shared,  # no user's first grammar holds the others
            speculative=settings.speculative,  # type: ignore[arg-type]  # in SPECULATIVE
            kv_dtype=settings.kv_dtype,  # type: ignore[arg-type]  # in KV_DTYPES
            max_waiting=settings.max_waiting,
            **extra,
        )
    except ConfigError as exc:
        raise SettingsError(None, f"engine settings: {exc}") from exc


def parse_bytes(text: str) -> int | None:
    """"8G", "512M", "1.5GB", "1000000" -> bytes (binary units); None when unreadable."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        return None
    power = " KMGT".index(match.group(2).upper() or " ")
    value = int(float(match.group(1)) * (1024 ** power))
    return value if value > 0 else None

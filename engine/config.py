"""Engine configuration: one validated dataclass, built by `app` from settings."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, get_args

Policy = Literal["prefill-first", "interleave", "mixed"]
AdmissionOrder = Literal["fifo", "fair"]
Speculative = Literal["ngram", "draft", "off"]
KVDtype = Literal["auto", "float32", "bfloat16", "float16"]
POLICIES: tuple[str, ...] = get_args(Policy)
ADMISSIONS: tuple[str, ...] = get_args(AdmissionOrder)
SPECULATIVE: tuple[str, ...] = get_args(Speculative)
KV_DTYPES: tuple[str, ...] = get_args(KVDtype)


class ConfigError(ValueError):
    """A setting has a value the engine cannot run with."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_running: int = 16  # slots in the request table
    max_prefill_tokens: int = 512  # prefill budget per round
    kv_tokens: int = 65536  # KV positions in the pool (all layers)
    page_size: int = 16
    policy: Policy = "prefill-first"
    admission: AdmissionOrder = "fifo"
    prefix_cache: bool = True
    # one prefix cache per request owner (a shared server: no user hits, or times, another's
    # prompt); False: every request shares one cache
    prefix_cache_per_owner: bool = False
    # build the grammar compiler's view of the vocabulary when the engine starts, not at the
    # first constrained request: llguidance holds Python's lock while it builds it (half a
    # second for 49k tokens), which would stall every other user's requests; local mode
    # builds it on first use and saves its memory until then
    grammars_at_start: bool = False
    max_context: int = 8192  # prompt + output limit per request (the model's context)
    max_waiting: int = 256  # global queue bound; submit beyond it is refused
    rounds_kept: int = 64  # recent rounds kept for the dashboard timeline
    # the local (sliding-window) layers' widest window, 0 when the model has none; set by the
    # Engine from its executor. Local layers keep KV for that window only, in a pool of
    # their own (`num_local_pages`)
    sliding_window: int = 0
    local_kv_tokens: int = 0  # positions in the local layers' pool; 0: every slot's reservation
    # speculative decoding: "ngram" drafts by prompt lookup, "draft" with a draft model (the
    # Engine is given it: engine.execution.draft_runner); off above `speculative_batch`
    # decoding requests (a CPU's big batch is compute-bound: verifying drafts costs throughput)
    speculative: Speculative = "ngram"
    speculative_batch: int = 8
    max_draft: int = 16  # drafted tokens per request and round, at most
    # the KV pools' element type; auto: the model's own, but float16 where block-quantized
    # weights run with float32 activations (half the memory, as llama.cpp's cache)
    kv_dtype: KVDtype = "auto"

    def __post_init__(self) -> None:
        for name in ("max_running", "max_prefill_tokens", "kv_tokens", "page_size",
                     "max_context", "max_waiting", "rounds_kept", "speculative_batch",
                     "max_draft"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.admission not in ADMISSIONS:
            raise ConfigError(
                f"admission must be one of {', '.join(ADMISSIONS)}, got {self.admission!r}")
        if self.speculative not in SPECULATIVE:
            raise ConfigError(f"speculative must be one of {', '.join(SPECULATIVE)}, "
                              f"got {self.speculative!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, "
                              f"got {self.kv_dtype!r}")
        if self.kv_tokens < self.page_size:
            raise ConfigError("kv_tokens must hold at least one page")
        for name in ("sliding_window", "local_kv_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be 0 or a positive integer, got {value!r}")

    @property
    def num_pages(self) -> int:
        return self.kv_tokens // self.page_size

    @property
    def local_pages_per_request(self) -> int:
        """The most local-layer pages one request holds at once: its window plus one round's
        new tokens (at most `max_prefill_tokens`), unaligned to pages."""
        return -(-(self.sliding_window - 1 + self.max_prefill_tokens) // self.page_size) + 1

    @property
    def num_local_pages(self) -> int:
        """Pages in the local layers' pool: every slot's most, or `local_kv_tokens` when
        set (but at least one request's most: the window is not known until a model loads);
        never more than the global pool (0 when the model has no local layers)."""
        if not self.sliding_window:
            return 0
        most = self.max_running * self.local_pages_per_request
        if self.local_kv_tokens:
            most = min(most, max(self.local_pages_per_request,
                                 self.local_kv_tokens // self.page_size))
        return min(self.num_pages, most)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

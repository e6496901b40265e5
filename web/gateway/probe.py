"""Reading an upstream's own state: its Prometheus /metrics by kind, its model list, and the
extra endpoints some kinds have (llama.cpp /slots, Ferry /v1/requests)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import httpx

# kind -> (metric prefix, running, waiting, KV usage names (first found wins))
GAUGES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "vllm": ("vllm:", ("vllm:num_requests_running",), ("vllm:num_requests_waiting",),
             ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "sglang": ("sglang:", ("sglang:num_running_reqs",), ("sglang:num_queue_reqs",),
               ("sglang:token_usage",)),
    "llamacpp": ("llamacpp:", ("llamacpp:requests_processing",),
                 ("llamacpp:requests_deferred",), ("llamacpp:kv_cache_usage_ratio",)),
    "ferry": ("ferry:", ("ferry:num_requests_running",), ("ferry:num_requests_waiting",),
              ("ferry:kv_cache_usage_perc",)),
}
GENERATED = ("generation_tokens_total", "tokens_predicted_total")
TTFT = ("time_to_first_token_seconds",)
ITL = ("inter_token_latency_seconds", "time_per_output_token_seconds")


@dataclass(frozen=True, slots=True)
class Figures:
    """What one scrape of an upstream said (None: it does not report that)."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1
    generated_total: float | None = None  # output tokens so far (a counter)
    ttft_sum: float | None = None
    ttft_count: float | None = None
    itl_sum: float | None = None
    itl_count: float | None = None
    slots_busy: int | None = None  # llama.cpp /slots, Ferry's slot gauges
    slots_total: int | None = None


NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> sample name -> value summed over labels (buckets left out).
    Raises ValueError on text that is not the exposition format.

    A line at a time, by hand: this runs on the server's event loop every scrape interval,
    and vLLM's page is hundreds of histogram lines (prometheus_client's parser is ~30x
    slower, and the loop waits for it)."""
    out: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:  # name{labels} value [timestamp]; label values may hold any text
            name, rest = line[:brace], line[line.rfind("}") + 1:].split()
        else:
            name, *rest = line.split()
        if not NAME.fullmatch(name) or not rest or len(rest) > 2:
            raise ValueError(f"not a Prometheus sample: {line[:80]!r}")
        value = float(rest[0])  # ValueError on garbage; NaN and +Inf parse
        if name.endswith("_bucket") or name.endswith("_created") or math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def detect_kind(samples: dict[str, float]) -> str | None:
    for kind, (prefix, *_rest) in GAUGES.items():
        if any(name.startswith(prefix) for name in samples):
            return kind
    return None


def _first(samples: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in samples:
            return samples[name]
    return None


def figures(kind: str, samples: dict[str, float]) -> Figures:
    if kind not in GAUGES:
        return Figures()
    prefix, running, waiting, kv = GAUGES[kind]
    kv_usage = _first(samples, kv)
    if kv_usage is not None and kv_usage > 1.0:  # some report percent
        kv_usage /= 100.0
    busy = _first(samples, running)
    slots_busy = slots_total = None  # Ferry says its slots: running + free
    if kind == "ferry" and busy is not None and \
            (free := _first(samples, ("ferry:num_free_slots",))) is not None:
        slots_busy, slots_total = int(busy), int(busy + free)
    return Figures(
        slots_busy=slots_busy, slots_total=slots_total, running=busy,
        waiting=_first(samples, waiting), kv_usage=kv_usage,
        generated_total=_first(samples, tuple(prefix + n for n in GENERATED)),
        ttft_sum=_first(samples, tuple(prefix + n + "_sum" for n in TTFT)),
        ttft_count=_first(samples, tuple(prefix + n + "_count" for n in TTFT)),
        itl_sum=_first(samples, tuple(prefix + n + "_sum" for n in ITL)),
        itl_count=_first(samples, tuple(prefix + n + "_count" for n in ITL)))


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str | None  # the first model's id
    max_context: int | None  # the first model's context length
    ids: tuple[str, ...] = ()  # every model it lists, in its order


def model_info(data: Any) -> ModelInfo:
    """/v1/models -> the models' ids, and the first one's context length (vLLM's
    max_model_len, llama.cpp's meta.n_ctx_train)."""
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise ValueError("/v1/models did not list a model")
    first = models[0]
    context = first.get("max_model_len") or first.get("context_length")
    meta = first.get("meta")
    if context is None and isinstance(meta, dict):
        context = meta.get("n_ctx") or meta.get("n_ctx_train")
    ids = tuple(dict.fromkeys(str(m["id"]) for m in models if isinstance(m, dict) and m.get("id")))
    return ModelInfo(str(first.get("id")) if first.get("id") else None,
                     int(context) if isinstance(context, (int, float)) and context > 0 else None,
                     ids)


async def slots(client: httpx.AsyncClient, base: str, headers: dict[str, str]
                ) -> tuple[int, int] | None:
    """llama.cpp's /slots -> (busy, total), None when it has none."""
    try:
        r = await client.get(base + "/slots", headers=headers)
        items = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(items, list):
        return None
    busy = sum(1 for s in items if isinstance(s, dict) and (s.get("is_processing")
                                                             or s.get("state") == 1))
    return busy, len(items)


async def guess_kind_without_metrics(client: httpx.AsyncClient, base: str,
                                     headers: dict[str, str]) -> str:
    """Kinds whose /metrics is off: SGLang answers /get_server_info, llama.cpp /props."""
    for path, kind in (("/get_server_info", "sglang"), ("/props", "llamacpp")):
        try:
            r = await client.get(base + path, headers=headers)
        except httpx.HTTPError:
            continue
        if r.status_code == 200:
            return kind
    return "openai"


def first_model_name(config: Any, wait: float = 0.0, timeout: float = 3.0) -> str | None:
    """At start-up: the model id the first reachable upstream serves (the name the front's
    /v1/models shows and its API expects), asking again for up to `wait` seconds."""
    import time

    from web.gateway.client import auth_headers
    deadline = time.monotonic() + wait
    while True:
        for up in config.upstreams:
            try:
                r = httpx.get(up.url + "/v1/models", headers=auth_headers(up.api_key),
                              timeout=timeout)
                name = model_info(r.json()).name if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue
            if name:
                return name
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)

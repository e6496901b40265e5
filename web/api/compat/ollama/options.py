"""Ollama's `options`, `format`, `think` and model names -> the chat request's fields."""
from __future__ import annotations

from typing import Any

import msgspec

from web.api.compat.ollama.schemas import Sampled, SamplingOptions
from web.api.errors import APIError, unsupported

TAG = ":latest"
# how the sampling options are named on the chat path
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
            "stop": "stop", "num_predict": "max_tokens"}
# options about how a runner loads and runs a model, which Ferry sets server-wide: ignored
RUNTIME = frozenset({"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap",
                     "use_mlock", "numa", "low_vram", "f16_kv", "vocab_only", "num_keep",
                     "num_gqa", "logits_all", "embedding_only"})
# sampling Ferry does not do: accepted at the value that changes nothing
NEUTRAL = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
           "min_p": 0.0, "typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "repeat_last_n": 64,
           "mirostat_tau": 5.0, "mirostat_eta": 0.1, "penalize_newline": False}


def model_name(name: str) -> str:
    """The server's model id for a name as Ollama clients write it (`:latest` optional)."""
    return name.removesuffix(TAG)


def tagged(name: str) -> str:
    return name if ":" in name else name + TAG


def sampling(body: Sampled) -> dict[str, Any]:
    """The chat request's fields from `options`, `format`, `think` and `keep_alive`."""
    out: dict[str, Any] = {"model": model_name(body.model), "keep_alive": body.keep_alive}
    options = body.options or {}
    for key, value in options.items():
        try:  # each sampling option checked on its own, so that the 400 names it
            msgspec.convert({key: value}, SamplingOptions)
        except msgspec.ValidationError as exc:
            raise APIError(f"options.{key}: {exc}", param=f"options.{key}") from None
    for key, value in options.items():
        where = f"options.{key}"
        if key in SAMPLING:
            if key == "num_predict" and isinstance(value, int) and value < 0:
                continue  # -1: until the end (the server's default cap)
            out[SAMPLING[key]] = value
        elif key in NEUTRAL:
            if value not in (None, NEUTRAL[key]) and not (key == "repeat_last_n"):
                raise unsupported(where, f"{key} {value!r}")
        elif key not in RUNTIME:
            raise unsupported(where, f"the option {key!r}")
    fmt = body.format
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise APIError(f"format must be \"json\" or a JSON schema, got {fmt!r}", param="format")
    if body.think is not None:
        out["chat_template_kwargs"] = {"enable_thinking": body.think not in (False, "false")}
    return out

"""Write docs/configuration.md from `Settings` (app/settings.py) and `ferry serve`'s flags.

    python scripts/gen_config_docs.py           # rewrite the page
    python scripts/gen_config_docs.py --check   # exit 1 when the page is stale

Names, types, defaults, choices, bounds, environment variables and flags come from the code;
HELP below says what each setting means. tests/app/test_config_docs.py fails when the page
differs from what this writes, or when a setting has no words here.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from app.cli import build_parser  # noqa: E402  (after the path line above)
from app.config_sources import env_name, toml_value  # noqa: E402
from app.settings import CHOICES, FLOAT_RANGES, INT_RANGES, Settings  # noqa: E402

PAGE = ROOT / "docs" / "configuration.md"

# What each setting means, for a person choosing a value. Keep to one or two sentences.
HELP: dict[str, str] = {
    "host": "Address to listen on. Any address other than loopback shares Ferry on the network "
            "and needs users (`ferry users add`); see [sharing](sharing.md).",
    "port": "TCP port.",
    "model": "The model: `default` (the embedded SmolLM2-135M-Instruct), a Hugging Face "
             "folder, a `.gguf` file, `ollama:NAME[:TAG]`, or a hub id (downloaded only then).",
    "mmproj": "A GGUF vision model's projector file (llama.cpp's `mmproj-*.gguf`); empty "
              "takes the one beside the model file. See [vision](vision.md).",
    "mmproj_quantize": "A GGUF vision model's image tower where its text model runs in its "
                       "blocks (on the CPU, `dtype` auto): `q8_0` quantizes the projector "
                       "file's float matrices to Q8_0 once at load, and the tower multiplies "
                       "with int8 activations, as the text model does (about twice as fast "
                       "on a CPU without bf16 arithmetic, in half the memory of F16); "
                       "`none` keeps them as the file stores them. A projector file in "
                       "blocks keeps its own. See [vision](vision.md#speed-and-memory).",
    "models": "Several models in one process, the first the chat's default (`--model` "
              "repeated; `FERRY_MODELS` comma separated). See [models](models.md).",
    "max_loaded": "Several models: how many may be loaded at once; 0 picks one per 4 GB of "
                  "the memory budget, 1 to 4.",
    "max_memory": "Several models: bytes the loaded models may hold (`8G`, `512M`); empty "
                  "means 3/4 of RAM. A load beyond it unloads the least recently used idle "
                  "model first.",
    "keep_alive": "Several models: idle time before a model other than the default unloads "
                  "(`30s`, `5m`, `1h`, `0`).",
    "dtype": "`auto`: a GGUF runs in its own quantization on CPU, a float folder as bfloat16 on "
             "CUDA and on CPUs with native bf16, else float32. `float32`/`bfloat16` "
             "dequantize a GGUF in memory (the reference path).",
    "quantize": "Quantize a float safetensors model once at load (`q8_0`, `q4_0`); needs "
                "float32 activations (`dtype` auto or float32).",
    "device": "`auto`, `cpu`, `cuda` or `cuda:N`.",
    "policy": "Scheduling policy: `prefill-first`, `interleave` or `mixed` (see "
              "[architecture](architecture.md#policies)). Empty picks `prefill-first` on "
              "loopback and `interleave` when shared.",
    "admission": "Order of the waiting queue: `fifo`, or `fair` (round-robin across users). "
                 "Empty picks `fifo` on loopback and `fair` when shared.",
    "max_running": "Slots: requests admitted at once. A slot costs nothing until used (KV "
                   "pages are shared).",
    "max_prefill_tokens": "Prefill budget per round: prompt tokens computed in one round; "
                          "longer prompts go in chunks of this size.",
    "kv_tokens": "KV pool positions, allocated at start (22.5 KB each for SmolLM2 in "
                 "float16).",
    "kv_dtype": "The KV cache's element type: `auto` is the model's own, but float16 for "
                "block-quantized GGUF files (half float32's memory).",
    "page_size": "Positions per KV page.",
    "local_kv_tokens": "Positions in the sliding-window layers' own pool (Gemma 3, windowed "
                       "Mistral). 0 holds every slot's window plus one round, so admission "
                       "never waits on it; less saves memory and makes admission wait.",
    "prefix_cache": "Reuse the KV of earlier prompts (off by itself for models with "
                    "sliding-window layers).",
    "deterministic": "The same reply at temperature 0 whatever shares a request's rounds, "
                     "however its prompt is chunked and whatever part of it the prefix cache "
                     "held: every product of a model in blocks runs in lanes and every prefill "
                     "chunk attends in the decode kernel, row by row. CPU only, with Ferry's "
                     "kernels (`ferry serve` refuses it elsewhere); a float model's products "
                     "stay torch's. Costs prefill speed, most on CPUs with AMX. See "
                     "[kernels](kernels.md#reproducibility).",
    "speculative": "Speculative decoding: `ngram` (prompt lookup, adaptive), `draft` (a draft "
                   "model drafts: `draft_model`), `off`.",
    "draft_model": "With `speculative = \"draft\"`: the draft model, a `.gguf` file or a "
                   "safetensors folder with the model's tokenizer (`default`: the embedded "
                   "SmolLM2-135M).",
    "users_load_models": "Shared mode: whether a normal user's request may load a model that "
                         "is not loaded (off: 409 `model_not_loaded`; admins always may).",
    "max_waiting": "Bound of the waiting queue; beyond it requests get 429 with Retry-After.",
    "per_user_limit": "Waiting plus running requests per user (429 beyond it; an API call "
                      "whose `n` alone exceeds it gets 400).",
    "max_body_bytes": "Largest request body; a larger one gets 400.",
    "max_messages": "Most messages in one chat request.",
    "max_images": "Most images in one request to a vision model (400 `too_many_images` "
                  "beyond it; 0 refuses images); also the most pictures a chat message "
                  "may carry and one chat reply's prompt sends (the newest).",
    "max_image_pixels": "Largest image (width x height) a request may send, checked before "
                        "decoding (400 `image_too_large` beyond it); the chat refuses a "
                        "larger attachment (413) and never sends a larger stored one.",
    "fetch_image_urls": "Fetch remote `http(s)` image URLs in requests to a vision model; "
                        "off, they are a 400 (`image_fetch_disabled`). In shared mode only "
                        "admins' URLs are fetched: a normal user's could reach what only the "
                        "server can. See [vision](vision.md).",
    "image_fetch_bytes": "Largest image one fetch may bring (bytes); a larger one is a 400 "
                         "(`image_fetch_failed`).",
    "image_fetch_seconds": "Time one fetch may take, redirects included (at most 3); a slower "
                           "one is a 400 (`image_fetch_failed`).",
    "max_stop": "Most stop strings in one request.",
    "max_tokens_limit": "Largest `max_tokens` a request may ask for.",
    "default_max_tokens": "A reply's token limit when the request (or the conversation) sets "
                          "none.",
    "chat_system_prompt": "The chat's default system prompt; empty uses the chat template's "
                          "own. Each conversation may set its own.",
    "chat_temperature": "The chat's default temperature; each conversation may set its own.",
    "chat_top_p": "The chat's default top_p; each conversation may set its own.",
    "chat_image_bytes": "Largest picture one may attach in the chat (bytes); a larger one "
                        "is refused with 413 and nothing is sent. See [chat](chat.md).",
    "chat_conversation_image_bytes": "Bytes of pictures one conversation may hold, in the "
                                     "chat and in an imported file; beyond it an attachment "
                                     "is refused with 413.",
    "open": "Open the chat in the default browser once serving.",
    "model_folders": "Extra folders `ferry models` lists and `ferry serve` serves from "
                     "(`FERRY_MODEL_FOLDERS` separated like PATH).",
    "discover_models": "Also serve the runnable models found on disk (`model_folders`, "
                       "Ollama's store, LM Studio's folders, the Hugging Face cache), each "
                       "loaded when picked.",
    "allowed_hosts": "Host names served besides loopback, the bound address and (shared) the "
                     "machine's own: `name` (any port), `name:port`, `.domain` (and its "
                     "subdomains). `FERRY_ALLOWED_HOSTS` comma or space separated.",
    "upstreams": "Upstream mode: serve in front of these OpenAI-compatible servers and load no "
                 "model. URLs or tables `{url, api_key, kind, max_in_flight}`; "
                 "`FERRY_UPSTREAMS` space or comma separated. See [upstreams](upstreams.md).",
}

# Variables read outside Settings: by the kernels of every `ferry` command, and by the paths.
OTHER_ENV: tuple[tuple[str, str], ...] = (
    ("FERRY_HOME", "Puts the data, config, cache and log folders under one folder (tests, "
                   "portable installs)."),
    ("FERRY_KERNEL_CACHE", "Folder of the compiled C kernels instead of `cache/kernels`, so "
                           "several FERRY_HOMEs share one build."),
    ("FERRY_TOKENIZER_CACHE", "Folder of the tokenizers built from GGUF files instead of "
                              "`cache/models`, so several FERRY_HOMEs build each once."),
    ("FERRY_NATIVE_KERNELS", "`0` turns Ferry's C kernels off: plain torch ops, much slower."),
    ("FERRY_CPU", "`avx2`, `avx-vnni`, `avx512` or `amx`: run as that smaller x86 CPU would "
                  "(Ferry's kernel paths, the C build flags, and torch's own kernels capped); "
                  "see [kernels](kernels.md#cpu-levels)."),
)


def _flags() -> dict[str, str]:
    """Setting name -> `ferry serve` flags that set it."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    out: dict[str, str] = {}
    for action in serve._actions:
        names = ", ".join(f"`{s}`" for s in action.option_strings)
        if action.dest == "model":
            out["model"] = names
            out["models"] = f"{names} (repeated)"
        elif action.dest in Settings.kinds():
            repeat = " (repeatable)" if isinstance(action, argparse._AppendAction) else ""
            out[action.dest] = names + repeat
    return out


def _default(name: str) -> str:
    field = next(f for f in fields(Settings) if f.name == name)
    factory: Callable[[], object] | None = None if field.default_factory is MISSING \
        else field.default_factory
    value = field.default if factory is None else factory()
    if name in ("policy", "admission") and value == "":
        return '`""` (by host)'
    return f"`{toml_value(value)}`"


def _values(name: str, kind: str) -> str:
    if name in CHOICES:
        return ", ".join(f"`{c}`" for c in CHOICES[name])
    if name in INT_RANGES:
        low, high = INT_RANGES[name]
        return f"integer, {low} to {high}" if high is not None else f"integer, {low} or more"
    if name in FLOAT_RANGES:
        least, most = FLOAT_RANGES[name]
        return f"number, {least:g} to {most:g}"
    return {"bool": "true or false", "str": "text", "list[str]": "list of text",
            "int": "integer", "float": "number"}.get(kind, "list of URLs or tables")


def render() -> str:
    flags = _flags()
    missing = [n for n in Settings.names() if n not in HELP]
    if missing:
        raise SystemExit(f"scripts/gen_config_docs.py: no words for {', '.join(missing)}: "
                         "add them to HELP")
    lines = [
        "# Configuration",
        "",
        "<!-- Written by scripts/gen_config_docs.py from app/settings.py; edit those, then run",
        "     `python scripts/gen_config_docs.py`. A test fails when this page is stale. -->",
        "",
        "Settings come from, lowest to highest: the defaults below, `ferry.toml` in the user",
        "config folder (`ferry doctor` shows where), environment variables `FERRY_<NAME>`, and",
        "the flags of `ferry serve`. `ferry serve --print-config` prints the effective values",
        "and where each came from, as TOML you can paste into `ferry.toml`. Bad values stop",
        "Ferry at start with a message that names the setting and where it came from.",
        "",
        "| setting | default | values | environment | flag | meaning |",
        "|---|---|---|---|---|---|",
    ]
    kinds = Settings.kinds()
    for name in Settings.names():
        lines.append(f"| `{name}` | {_default(name)} | {_values(name, kinds[name])} | "
                     f"`{env_name(name)}` | {flags.get(name, '(ferry.toml or environment)')} | "
                     f"{HELP[name]} |")
    lines += [
        "",
        "Lists in the environment: `FERRY_MODELS` comma separated, `FERRY_ALLOWED_HOSTS` and",
        "`FERRY_UPSTREAMS` comma or space separated, other lists separated like PATH. Booleans",
        "take `1`, `true`, `yes`, `on` and `0`, `false`, `no`, `off`.",
        "",
        "## Other environment variables",
        "",
        "These act below the settings, on every `ferry` command (serve, bench, doctor).",
        "",
        "| variable | what it does |",
        "|---|---|",
    ]
    lines += [f"| `{var}` | {text} |" for var, text in OTHER_ENV]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE.name} is stale: run python scripts/gen_config_docs.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

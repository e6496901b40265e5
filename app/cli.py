"""The `ferry` command: serve, simulate, bench, users, models, doctor."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from app.commands import users as users_cli
from app.config_sources import format_config, load_settings
from app.paths import HOME_ENV, get_paths
from app.settings import DTYPES, QUANTIZE, Settings, SettingsError
from engine import ADMISSIONS, POLICIES
from engine.host import CpuLevelError, apply_cpu_cap

EXIT_USAGE = 2  # bad settings or a serve that cannot start (argparse uses 2 as well)
# These hand their whole argv to code that owns its own parser (and --help).
PASSTHROUGH: dict[str, tuple[str, str]] = {
    "simulate": ("engine.sim.simulator", "cli"),
    "bench": ("app.bench.run", "main"),
}


def _version() -> str:
    try:
        return version("ferry")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="Ferry: a desktop local-chat server with a continuous-batching engine "
                    "and a live queue dashboard.",
        epilog=f"Settings come from defaults < ferry.toml in the config dir < FERRY_* "
               f"environment variables < flags. {HOME_ENV}=DIR keeps all files under DIR.")
    parser.add_argument("--version", action="version", version=f"ferry {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    add_serve_parser(sub)

    sub.add_parser(
        "simulate", add_help=False, help="replay a scenario file through the real scheduler",
        description="ferry simulate FILE [--json | --summary] [--policy P]: run the scheduler, "
                    "KV accounting and prefix cache on a JSON scenario with virtual time "
                    "(no model); `ferry simulate --help` for details.")
    sub.add_parser(
        "bench", add_help=False, help="measure throughput and latency under a workload",
        description="ferry bench [workload options] [--baseline hf]: drive the engine with a "
                    "synthetic workload; `ferry bench --help` for details.")
    users_cli.add_parser(sub)
    sub.add_parser(
        "models", help="list the default model, converted copies and configured folders",
        description="Show the embedded default model (its GGUF file and whether a converted "
                    "safetensors copy is cached), models found in the configured "
                    "model_folders, and which model `ferry serve` would use.")
    sub.add_parser(
        "doctor", help="check the installation: torch, device, model, folders, port",
        description="Check everything `ferry serve` needs, one line each: torch build, "
                    "device, bfloat16, flashinfer, model files, data/config/cache/log folders, "
                    "whether the port is free. Exits 1 if any check fails.",
    ).add_argument("--port", type=int, help="check this port instead of the configured one")
    return parser


def add_serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = sub.add_parser(
        "serve", help="load the model and serve the chat, dashboard and API",
        description="Load the model, start the engine and serve the browser chat, the live "
                    "queue dashboard and the OpenAI-compatible API. Listens on 127.0.0.1 by "
                    "default; any other --host shares Ferry on the network and requires users "
                    "(see `ferry users`). Unset flags fall back to FERRY_* variables, then "
                    "ferry.toml, then defaults.")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 = LAN)")
    serve.add_argument("--port", type=int, help="TCP port (default 8000)")
    serve.add_argument("--model", metavar="PATH|HF_ID|GGUF", action="append",
                       help="'default' (embedded SmolLM2-135M-Instruct), a Hugging Face "
                            "folder, an HF id (org/name), a .gguf file or ollama:NAME[:TAG]; "
                            "repeat it to serve several models (the first is the chat's "
                            "default; the others load when a request names them)")
    serve.add_argument("--max-loaded", type=int, metavar="N",
                       help="several models: how many stay loaded at once (default: from "
                            "the machine's memory)")
    serve.add_argument("--max-memory", metavar="SIZE",
                       help="several models: memory the loaded models may hold, e.g. 8G "
                            "(default 3/4 of RAM); the least recently used idle one unloads")
    serve.add_argument("--keep-alive", metavar="DURATION",
                       help="several models: idle time before a model (not the default) "
                            "unloads, e.g. 5m, 30s, 0 (default 5m)")
    serve.add_argument("--users-load-models", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="several models, shared: a normal user's request for a model not "
                            "loaded loads it (default on); off: only admins load models, "
                            "the others' requests for one are refused (409)")
    serve.add_argument("--discover", action=argparse.BooleanOptionalAction, default=None,
                       dest="discover_models",
                       help="also serve the models found on disk (Ollama, LM Studio, the "
                            "Hugging Face cache, model_folders), loaded when picked "
                            "(default on)")
    serve.add_argument("--dtype", metavar="|".join(DTYPES),
                       help="weight dtype (default auto: a GGUF runs in its own quantization "
                            "on CPU; float32|bfloat16 dequantise it)")
    serve.add_argument("--quantize", metavar="|".join(QUANTIZE),
                       help="quantize a float safetensors model once at load (CPU; default "
                            "none)")
    serve.add_argument("--device", metavar="auto|cpu|cuda", help="where to run (default auto)")
    serve.add_argument("--policy", metavar="|".join(POLICIES),
                       help="scheduling policy (default prefill-first; interleave when shared)")
    serve.add_argument("--admission", metavar="|".join(ADMISSIONS),
                       help="admission order of the waiting queue (default fifo; fair when "
                            "shared)")
    serve.add_argument("--speculative", metavar="ngram|draft|off",
                       help="speculative decoding: ngram drafts from the prompt and reply "
                            "(prompt lookup; default), draft drafts with --draft-model, off")
    serve.add_argument("--draft-model", metavar="PATH",
                       help="speculative draft: the small model that drafts (a .gguf file or "
                            "a safetensors folder) with the model's tokenizer")
    serve.add_argument("--mmproj", metavar="PATH",
                       help="a GGUF vision model's projector file (llama.cpp's mmproj-*.gguf; "
                            "default: the one beside the model file)")
    serve.add_argument("--mmproj-quantize", metavar="q8_0|none",
                       help="the projector's float matrices quantized to Q8_0 at load where "
                            "the text model runs in its blocks (default q8_0; none: as the "
                            "file stores them)")
    serve.add_argument("--max-running", type=int, metavar="N",
                       help="requests decoding at once: the engine's slots (default 32)")
    serve.add_argument("--kv-tokens", type=int, metavar="N",
                       help="KV cache positions, allocated at start (default 16384)")
    serve.add_argument("--kv-dtype", metavar="auto|float32|bfloat16|float16",
                       help="the KV cache's element type (default auto: the model's own, "
                            "float16 for block-quantized GGUF files)")
    serve.add_argument("--max-prefill-tokens", type=int, metavar="N",
                       help="prompt tokens computed per round; longer prompts go in chunks "
                            "(default 512)")
    serve.add_argument("--upstream", action="append", metavar="URL", dest="upstreams",
                       help="serve in front of this OpenAI-compatible server (vLLM, SGLang, "
                            "llama.cpp, Ferry) instead of loading a model; repeatable")
    serve.add_argument("--allowed-host", action="append", metavar="NAME[:PORT]",
                       dest="allowed_hosts",
                       help="also answer requests for this host name (a reverse proxy's or a "
                            "DNS name; .example.com covers its subdomains); repeatable. Other "
                            "Host names are refused (DNS rebinding)")
    serve.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                       help="the same reply at temperature 0 whatever shares its rounds or the "
                            "prefix cache held (CPU only; prefill slower on CPUs with AMX)")
    serve.add_argument("--open", action=argparse.BooleanOptionalAction, default=None,
                       help="open the chat in the default browser once serving")
    serve.add_argument("--config", type=Path, metavar="FILE",
                       help="read settings from FILE instead of <config dir>/ferry.toml")
    serve.add_argument("--print-config", action="store_true",
                       help="print the effective settings and where each came from, then exit")


def fail(command: str, message: str, code: int = EXIT_USAGE) -> int:
    print(f"ferry {command}: error: {message}", file=sys.stderr)
    return code


def passthrough(command: str, argv: list[str]) -> int:
    module_name, function = PASSTHROUGH[command]
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return fail(command, f"{module_name} is not available in this build", 1)
        raise
    entry: Callable[[list[str]], int] = getattr(module, function)
    return int(entry(argv) or 0)


def serve_flags(args: argparse.Namespace) -> dict[str, object]:
    flags: dict[str, object] = {name: getattr(args, name) for name in
                                ("host", "port", "dtype", "quantize", "device", "policy",
                                 "admission", "speculative", "draft_model", "mmproj",
                                 "mmproj_quantize",
                                 "max_running",
                                 "kv_tokens", "kv_dtype",
                                 "max_prefill_tokens", "open", "upstreams", "allowed_hosts",
                                 "max_loaded", "max_memory", "keep_alive",
                                 "users_load_models", "discover_models", "deterministic")}
    named: list[str] = args.model or []
    flags["model"] = named[0] if named else None  # one --model: exactly as before
    flags["models"] = named if len(named) > 1 else None
    return flags


def cmd_serve(args: argparse.Namespace) -> int:
    from app.preflight import PreflightError, check_serve

    paths = get_paths()
    try:
        settings = load_settings(serve_flags(args), config_file=args.config)
    except SettingsError as exc:
        return fail("serve", str(exc))
    if args.print_config:
        print(format_config(settings, args.config or paths.config_file))
        return 0
    try:
        model = check_serve(settings, paths)
    except PreflightError as exc:
        return fail("serve", str(exc))

    from app import serve
    from app.logs import configure_logging, quiet_progress_bars

    paths.ensure()
    configure_logging(paths.log_file)
    quiet_progress_bars(sys.stderr)  # no bar escape codes in a log the output goes to
    return int(serve.run(settings, paths, model) or 0)


def cmd_with_settings(args: argparse.Namespace) -> int:
    paths = get_paths()
    try:
        # doctor --port: check that port (a flag, above every other source)
        settings: Settings | None = load_settings({"port": getattr(args, "port", None)})
        error = None
    except SettingsError as exc:
        settings, error = None, str(exc)
    if args.command == "doctor":
        from app.commands import doctor
        return doctor.main(settings, paths, error)
    if settings is None:
        return fail(args.command, str(error))
    if args.command == "models":
        from app.commands import models as models_cli
        return models_cli.main(settings, paths)
    return users_cli.run(args, paths)


def main(argv: list[str] | None = None) -> int:
    try:
        return dispatch(sys.argv[1:] if argv is None else list(argv))
    except BrokenPipeError:
        # output piped into `head` and cut short: not an error worth a traceback
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  # keeps interpreter exit quiet
        return 141


def dispatch(argv: list[str]) -> int:
    try:
        apply_cpu_cap()  # FERRY_CPU: torch reads its ISA variables when it loads, so first
    except CpuLevelError as exc:
        return fail(argv[0] if argv else "", str(exc))
    if argv and argv[0] in PASSTHROUGH:
        return passthrough(argv[0], argv[1:])
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: return, so tests can call main
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command == "serve":
        return cmd_serve(args)
    return cmd_with_settings(args)


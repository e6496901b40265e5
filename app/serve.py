"""Launching the server: model -> engine -> web app -> uvicorn (the composition root)."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.banner import banner, local_url, open_browser
from app.discovery import FoundModel, models_to_serve, start_discovery
from app.models import ModelRef
from app.paths import Paths
from app.settings import Settings, engine_config

if TYPE_CHECKING:
    from litestar import Litestar

    from engine import (
        DraftRunner,
        EncoderExecutor,
        Engine,
        EngineConfig,
        ModelExecutor,
        ModelSource,
        Tokenizer,
    )
    from web.config import WebConfig

log = logging.getLogger(__name__)


def web_config(settings: Settings, paths: Paths, model_name: str) -> WebConfig:
    """The web layer's config from the settings; the chat defaults come from the settings file
    (each conversation may override them)."""
    from web.config import WebConfig

    return WebConfig(data_dir=paths.data, model_name=model_name, shared=settings.shared,
                     per_user_limit=settings.per_user_limit,
                     max_body_bytes=settings.max_body_bytes, max_messages=settings.max_messages,
                     max_images=settings.max_images, max_image_pixels=settings.max_image_pixels,
                     fetch_image_urls=settings.fetch_image_urls,
                     image_fetch_bytes=settings.image_fetch_bytes,
                     image_fetch_seconds=float(settings.image_fetch_seconds),
                     max_stop=settings.max_stop, max_tokens_limit=settings.max_tokens_limit,
                     default_max_tokens=settings.default_max_tokens,
                     chat_system_prompt=settings.chat_system_prompt or None,
                     chat_temperature=float(settings.chat_temperature),
                     chat_top_p=float(settings.chat_top_p),
                     chat_image_bytes=settings.chat_image_bytes,
                     chat_conversation_image_bytes=settings.chat_conversation_image_bytes,
                     allowed_hosts=tuple(settings.allowed_hosts))


def pick_device(name: str) -> str:
    """The device to load on (a CUDA device asked for but unusable: ValueError, with why)."""
    from engine.host import pick_device as pick

    return pick(name).device


def device_line(name: str) -> tuple[str, str]:
    """(the device `name` resolves to, the banner's line about it: the device and why, the
    torch build); auto on a machine whose GPU torch cannot use says why, never silently."""
    from engine.host import pick_device as pick
    from engine.host import torch_build

    chosen = pick(name)
    return chosen.device, f"{chosen.device} ({chosen.why}), torch {torch_build()}"


def turn_deterministic_on(device: str) -> str | None:
    """Turn batch invariance on (settings' `deterministic`) for every model this process
    serves; None, or why it cannot be (it is then left off)."""
    if device != "cpu":
        return (f"deterministic runs on the CPU only (Ferry's kernels); this server runs on "
                f"{device}")
    from engine.host import kernel_status, set_batch_invariant

    if not set_batch_invariant(True):
        return f"deterministic needs Ferry's CPU kernels, which did not load: {kernel_status()}"
    return None


def attention_line(executor: object) -> str:
    """How attention runs, and why that backend (FlashInfer's self-test, or its absence)."""
    choice = getattr(executor, "attention", None)
    return "" if choice is None else f"; attention {choice.name} ({choice.reason})"


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How a model (and its draft model) is loaded: ModelExecutor.from_pretrained's options."""

    dtype: str
    device: str
    cache_dir: Path
    progress: bool = True
    quantize: str | None = None
    tokenizer_cache: Path | None = None  # GGUF tokenizers' folders (None: cache_dir)
    mmproj_quantize: str = "q8_0"  # a GGUF vision tower's float matrices (Settings')


@dataclass(frozen=True, slots=True)
class Assembly:
    """What assemble built: the engine (not started) and the parts it runs on."""

    executor: ModelExecutor | EncoderExecutor
    tokenizer: Tokenizer | None
    draft: DraftRunner | None
    engine: Engine


def load_model(spec: str | Path | None, config: EngineConfig, how: LoadOptions,
               projector: Path | None = None
               ) -> tuple[ModelExecutor | EncoderExecutor, EngineConfig]:
    """The model loaded (a BERT-family folder: an embedding model's encoder; a GGUF vision
    model with `projector`, or the projector file beside it), and `config` with its context
    held to what the model takes."""
    from engine import EncoderExecutor, ModelExecutor, is_embedding_model

    executor: ModelExecutor | EncoderExecutor
    if spec is not None and is_embedding_model(Path(spec)):
        executor = EncoderExecutor.from_pretrained(
            spec, config, dtype=how.dtype, device=how.device,
            cache_dir=how.tokenizer_cache or how.cache_dir)
    else:
        executor = ModelExecutor.from_pretrained(spec, config, dtype=how.dtype,
                                                 device=how.device, cache_dir=how.cache_dir,
                                                 progress=how.progress, quantize=how.quantize,
                                                 tokenizer_cache=how.tokenizer_cache,
                                                 projector=projector,
                                                 projector_quantize=how.mmproj_quantize)
    return executor, dataclasses.replace(config, max_context=min(config.max_context,
                                                                 executor.max_context))


def is_encoder(executor: object) -> bool:
    """An embedding model's executor: no KV, no drafts, no grammar."""
    from engine import EncoderExecutor

    return isinstance(executor, EncoderExecutor)


def assemble(executor: ModelExecutor | EncoderExecutor, config: EngineConfig,
             how: LoadOptions, *,
             tokenizer: bool = True, tokenizer_cache: Path | None = None,
             draft: str | Path | None = None,
             draft_quantize: str | None = None, opened: Tokenizer | None = None) -> Assembly:
    """The one way a loaded model (load_model) becomes an Engine: its tokenizer (`opened`,
    or opened here unless `tokenizer` is False: raw ids in, raw ids out), the draft model at
    `draft` (checked against the tokenizer's vocabulary: DraftModelError), then the Engine
    over them."""
    from engine import DraftRunner, Engine, ModelExecutor, Tokenizer

    if opened is None and (tokenizer or draft is not None):
        assert executor.tokenizer_path is not None, "a loaded model has its tokenizer's path"
        opened = Tokenizer(executor.tokenizer_path, tokenizer_cache)
    runner = None
    if draft is not None:
        assert opened is not None and isinstance(executor, ModelExecutor)
        runner = DraftRunner.load(draft, executor, opened.hf.get_vocab(), dtype=how.dtype,
                                  device=how.device, cache_dir=how.cache_dir,
                                  quantize=draft_quantize)
    return Assembly(executor, opened, runner,
                    Engine(config, executor, opened, draft_model=runner))


def tokenizer_first(model: ModelRef, paths: Paths) -> Tokenizer | None:
    """The model's tokenizer, opened before its weights load: opening one briefly takes 3-4
    times what it keeps (parsing tokenizer.json; ~450 MB for Gemma 3's 262k tokens), and
    before the weights that passing peak is not on top of them. None for a model not on
    disk yet (a hub id: opened after its download, by assemble)."""
    from engine import Tokenizer, gguf_tokenizer_dir, is_embedding_model
    from engine.execution.residency import trim

    if model.path is None or is_embedding_model(model.path):
        return None
    path = model.path
    if path.is_file():  # a GGUF: its tokenizer folder, built once and cached
        path = gguf_tokenizer_dir(path, paths.tokenizer_cache)
    opened = Tokenizer(path)
    trim()  # the parse's freed heap back before the weights come
    return opened


def build(settings: Settings, paths: Paths, model: ModelRef,
          progress: bool = True) -> tuple[Litestar, str, str, str]:
    """Load the model and build the Litestar app (the engine starts with the app's lifespan);
    also how it runs and its chat template, for the banner."""
    from engine.host import set_kernel_build_dir
    from web.app import create_app

    device = pick_device(settings.device)
    spec = None if model.kind == "default" else (str(model.path) if model.path else model.name)
    set_kernel_build_dir(paths.kernels_cache)
    how = LoadOptions(settings.dtype, device, paths.models_cache, progress, settings.quantize,
                      paths.tokenizer_cache, settings.mmproj_quantize)
    opened = tokenizer_first(model, paths)
    executor, config = load_model(spec, engine_config(settings), how, model.projector)
    draft_ref = None
    # refused (DraftModelError) when it cannot draft; an encoder has nothing to draft for
    if settings.speculative == "draft" and not is_encoder(executor):
        from app.preflight import draft_model

        draft_ref = draft_model(settings)
        assert draft_ref.path is not None
    built = assemble(executor, config, how, draft=draft_ref.path if draft_ref else None,
                     draft_quantize=None if settings.quantize == "none" else settings.quantize,
                     opened=opened)
    engine, tokenizer, draft = built.engine, built.tokenizer, built.draft
    assert tokenizer is not None
    # the grammar compiler (llguidance's view of the vocabulary: 38 MB for SmolLM2's 49k
    # tokens, more for wider vocabularies) is built by the first structured request, so
    # that chats that never constrain their output never hold it
    runs = executor.describe() + attention_line(executor)
    if engine.config.sliding_window:  # the scheduler runs it without the prefix cache
        cfg = engine.config
        runs += (f"; sliding-window KV: local layers keep {cfg.sliding_window} positions "
                 f"({cfg.num_local_pages * cfg.page_size:,} in their pool), prefix cache off")
    if draft is not None and draft_ref is not None:
        runs += f"; drafts with {draft_ref.name} ({draft.executor.describe()})"
    web = dataclasses.replace(web_config(settings, paths, model.name), model_runs=runs)
    app = create_app(engine, tokenizer, web)
    app.state.serving = engine  # for the banner's memory line, before the lifespan starts
    return app, device, runs, tokenizer.chat_template_name


def model_source(settings: Settings, paths: Paths, model: ModelRef, config: EngineConfig,
                 device: str, store: str = "configured") -> ModelSource:
    """How the model set opens `model`'s tokenizer and loads it (on its loader thread)."""
    from app.models import folder_size
    from engine import (
        LoadedModel,
        ModelExecutor,
        ModelSource,
        Tokenizer,
        embedding_task,
        gguf_tokenizer_dir,
        resolve_model_files,
    )

    spec = None if model.kind == "default" else (str(model.path) if model.path else model.name)
    size = folder_size(model.path) if model.path is not None else 0

    def open_tokenizer() -> Tokenizer:
        path = resolve_model_files(spec, paths.models_cache, False)
        if path.is_file():  # a GGUF: its tokenizer as a folder, built once and cached
            path = gguf_tokenizer_dir(path, paths.tokenizer_cache)
        return Tokenizer(path)

    def load() -> LoadedModel:
        how = LoadOptions(settings.dtype, device, paths.models_cache, False, settings.quantize,
                          paths.tokenizer_cache, settings.mmproj_quantize)
        executor, clipped = load_model(spec, config, how, model.projector)
        # what a budget counts: every weight read and KV page written (an encoder: its weights)
        size = executor.footprint(in_use=True).total if isinstance(executor, ModelExecutor) \
            else executor.memory_bytes()
        return LoadedModel(executor, clipped, executor.describe() + attention_line(executor),
                           size)

    details: dict[str, object] = {"kind": model.kind, "source": store,
                                  "path": str(model.path) if model.path else None}
    task = embedding_task(model.path) if model.path is not None else None
    # what the model set's view of it says it does before it loads (engine.Engine.task)
    details["task"] = task or "generate"
    if model.path is not None and task is not None:
        details["runs"] = ("embedding model: " +
                           ("GGUF" if model.path.is_file() else "safetensors"))
    elif model.path is not None:  # listed before it loads: architecture, blocks, kernels
        from engine import describe_model_file

        quant = None if settings.quantize == "none" else settings.quantize
        try:
            details["runs"] = describe_model_file(model.path, settings.dtype, device, quant,
                                                  model.projector)
        except Exception as exc:  # a file Ferry cannot run: listed with the reason
            details["runs"] = f"cannot run: {exc}"
    vision = None
    if model.path is not None:  # a vision model takes images before it loads
        from engine import model_vision

        vision = model_vision(model.path, model.projector)
    return ModelSource(model.name, open_tokenizer, load, size, details, vision)


def build_several(settings: Settings, paths: Paths, models: list[ModelRef],
                  progress: bool = True, found: list[FoundModel] | None = None
                  ) -> tuple[Litestar, str, str, str]:
    """Several models: the default loads now (the banner, and a bad file fails at start),
    the others when a request names them (engine.ModelSet); `found`: models on disk, checked
    and added after the start (app.discovery)."""
    from app.settings import parse_bytes
    from engine import Budget, ModelSet, SharingRules, parse_keep_alive
    from engine.host import gpu_room, set_kernel_build_dir
    from web.app import create_app

    config = engine_config(settings)
    device = pick_device(settings.device)
    set_kernel_build_dir(paths.kernels_cache)
    sources = [model_source(settings, paths, m, config, device) for m in models]
    first = sources[0]
    loaded, tokenizer = first.load(), first.open_tokenizer()
    budget = Budget.for_machine(settings.max_loaded or None,
                                parse_bytes(settings.max_memory) if settings.max_memory
                                else None, gpu_room(device, loaded.size))
    model_set = ModelSet(sources, loaded.config, budget,
                         keep_alive=parse_keep_alive(settings.keep_alive),
                         preloaded={first.name: (loaded, tokenizer)},
                         rules=SharingRules(users_load=settings.users_load_models))
    web = dataclasses.replace(web_config(settings, paths, first.name), model_runs=loaded.runs)
    app = create_app(model_set, tokenizer, web)
    app.state.serving = model_set  # for the banner's memory line

    def add(model: FoundModel) -> str | None:
        source = model_source(settings, paths, model.ref, config, device, model.store)
        runs = str(source.details.get("runs") or "")
        if runs.startswith("cannot run: "):
            return runs.removeprefix("cannot run: ")
        model_set.add(source)
        return None

    if found:
        start_discovery(found, add)
    return app, device, loaded.runs, tokenizer.chat_template_name


def build_upstream(settings: Settings, paths: Paths) -> tuple[Litestar, str]:
    """Upstream mode: no model, the web app over a gateway to the configured upstreams."""
    from app.upstreams import gateway_config
    from web.app import create_app
    from web.gateway import Gateway, GatewayTokenizer
    from web.gateway.probe import first_model_name

    config = gateway_config(settings.upstreams, settings.max_waiting, settings.shared)
    name = first_model_name(config, wait=10.0)
    if name is None:
        log.warning("no upstream answered /v1/models: the API serves the model name "
                    "'upstream'")
        name = "upstream"
    gateway = Gateway(config, name)
    web = web_config(settings, paths, name)
    return create_app(gateway, GatewayTokenizer(), web), name  # type: ignore[arg-type]


def serving_floor() -> int:
    """The resident size before any model loads, with what serving imports imported (the
    web server, torch, the loader and the native kernels): the part no model frees.
    transformers and the Rust tokenizer's package are not among them: a GGUF's tokenizer
    serves from Ferry's compact tables where they were checked to agree
    (engine.execution.text.compact_bpe), else from the Rust tokenizer without transformers
    (engine.execution.text.plain); a tokenizer that needs either imports it when it opens."""
    import gguf  # noqa: F401 (what loading a model imports)

    import engine.execution.executor  # noqa: F401
    import web.app  # noqa: F401
    from engine.execution.residency import rollup, trim
    from engine.kernels import native

    native.library()

    trim()
    return rollup()["rss"]


def served_memory(app: Litestar, floor: int) -> str:
    """The banner's memory line: the process, the floor and each loaded model's parts."""
    from app.banner import memory_line
    from engine.execution.residency import rollup

    engine = app.state.serving
    if hasattr(engine, "models"):  # several models: those loaded
        models = [(m.name, m.memory) for m in engine.models() if m.memory]
    else:
        parts = engine.footprint()
        models = [(app.state.config.model_name, parts.as_dict())] if parts else []
    rss = rollup()["rss"]
    return memory_line(rss, floor, models) if rss and models else ""


def run(settings: Settings, paths: Paths, model: ModelRef) -> int:
    """Serve until SIGINT/SIGTERM; uvicorn's shutdown runs the app's lifespan, which stops the
    engine (running requests end, partial replies are saved) and closes the database."""
    import uvicorn

    from engine import DraftModelError, ModelNotFound

    if settings.upstreams:
        app, name = build_upstream(settings, paths)
        urls = ", ".join(str(u["url"]) for u in settings.upstreams)
        print(banner(settings, name, "upstream", urls), flush=True)
    else:
        print(f"Loading {model.name} ...", file=sys.stderr)
        floor = serving_floor()
        try:
            device, where = device_line(settings.device)
        except ValueError as exc:
            print(f"ferry serve: error: {exc}", file=sys.stderr)
            return 2
        settings = dataclasses.replace(settings, device=device)  # decided once, said once
        if settings.deterministic and (error := turn_deterministic_on(device)):
            print(f"ferry serve: error: {error}", file=sys.stderr)
            return 2
        try:
            refs, found = models_to_serve(settings)
            if found:
                print(f"Found {len(found)} more model{'s' if len(found) > 1 else ''} on disk; "
                      "those Ferry runs join the picker once checked (--no-discover: off)",
                      file=sys.stderr)
            if len(refs) > 1 or found:
                app, device, dtype, template = build_several(settings, paths, refs,
                                                             found=found)
            else:
                app, device, dtype, template = build(settings, paths, model)
        except ModelNotFound as exc:
            print(f"ferry serve: {exc}", file=sys.stderr)
            return 2
        except DraftModelError as exc:
            print(f"ferry serve: error: draft model: {exc}", file=sys.stderr)
            return 2
        except ValueError as exc:  # a file Ferry reads but cannot run (UnsupportedModel),
            # a tokenizer it cannot read: what is wrong with the file, in one line
            print(f"ferry serve: error: {exc}", file=sys.stderr)
            return 2
        print(banner(settings, model.name, device, dtype, template, device_info=where,
                     memory=served_memory(app, floor)), flush=True)
    if settings.open:
        open_browser(local_url(settings))
    with exit_quietly_after_shutdown():
        # log_config=None: uvicorn's loggers go through Ferry's (console and ferry.log), so an
        # error it catches (one raised after a response started, in a stream) keeps its
        # traceback in the log file too
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning",
                    log_config=None, timeout_graceful_shutdown=5)
    return 0


@contextlib.contextmanager
def exit_quietly_after_shutdown() -> Iterator[None]:
    """uvicorn re-raises SIGINT/SIGTERM once its graceful shutdown is done, so the default
    action would follow: for SIGTERM, death by the signal (exit status -15 / 143) after a
    clean shutdown. By then the lifespan has saved the replies and stopped the engine, so
    `ferry serve` exits 0 instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""Fixtures for the whole suite (one conftest):

* kernel switches and torch thread hygiene;
* tiny random Llama-family checkpoints and a harness that drives ModelExecutor round by round
  (each tiny model is built with transformers, given non-trivial biases and norm weights, which
  HF initialises to 0 and 1 and would hide mapping mistakes, saved with save_pretrained and
  loaded both by HF, the reference, and by our loader, in float32);
* web servers around the real default model (float32, CPU): the engine thread and uvicorn on a
  free loopback port in a background thread. The model is converted once per machine into a
  cache under the temp dir (or FERRY_TEST_MODEL_CACHE) and its weights are loaded once per
  session; each module builds its own engine (its own KV pool and slots) and server.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.kernels import native
from engine.scheduling.batch import Batch
from engine.scheduling.request import Request
from tests.tools.harness import Harness
from tests.tools.random_hf import random_hf

# Every `ferry` process a test starts (each with its own FERRY_HOME) loads the kernels this
# process builds instead of compiling its own copy.
KERNEL_CACHE = "FERRY_KERNEL_CACHE"
os.environ.setdefault(KERNEL_CACHE, str(native.default_build_dir()))
# every test's FERRY_HOME (and every server a test starts) builds a GGUF's tokenizer folder
# once per file for the whole run, not once per home (seconds each, ~50 homes)
TOKENIZER_CACHE = "FERRY_TOKENIZER_CACHE"
if TOKENIZER_CACHE not in os.environ:  # the first pytest process (xdist's workers inherit it)
    os.environ[TOKENIZER_CACHE] = tempfile.mkdtemp(prefix="ferry-tokenizers-")
    atexit.register(shutil.rmtree, os.environ[TOKENIZER_CACHE], True)
SHARED_ENV = (KERNEL_CACHE, TOKENIZER_CACHE)


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> object:
    """from_pretrained sets the process-wide torch thread count; undo it after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _restore_log_handlers() -> object:
    """`ferry serve` run in process (app.logs.configure_logging) hands the root logger a
    handler on the test's captured stderr and one on a log file in its tmp_path; both are
    gone after the test, so the handlers are taken off again rather than failing on every
    later record."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if getattr(h, "_ferry_handler", False)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def skip_without_native_kernels() -> None:
    from engine.kernels import native
    if native.library() is None:
        pytest.skip(f"native kernels: {native.status()}")


@pytest.fixture
def native_kernels() -> None:
    """Ferry's fused CPU kernels are loaded (the test is skipped, with the reason, if not)."""
    skip_without_native_kernels()


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat bf16 as emulated on any CPU, so the paths meant for such CPUs (widening, Ferry's
    bf16 product, fused decode layers) run here even where bf16 is native."""
    from engine.execution.model import linear_kernels
    monkeypatch.setattr(linear_kernels, "emulated_bf16", lambda dtype, device:
                        dtype == torch.bfloat16 and device.type == "cpu")


@pytest.fixture(params=["native", "torch"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with Ferry's fused CPU kernels and again on the plain torch path."""
    from engine.kernels import ops
    if request.param == "torch":
        monkeypatch.setattr(ops, "usable", lambda t: False)
    else:
        skip_without_native_kernels()
    return request.param


VOCAB = 320
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "initializer_range": 0.2,
          "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _configs() -> dict[str, object]:
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )
    return {
        "llama": LlamaConfig(**COMMON, tie_word_embeddings=False),
        # llama3 rope scaling, biases everywhere, MQA, tied embeddings (SmolLM2-like)
        "llama3": LlamaConfig(**{**COMMON, "num_key_value_heads": 1}, attention_bias=True,
                              mlp_bias=True, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0,
                                               "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 32}),
        "mistral": MistralConfig(**COMMON, sliding_window=None),
        "qwen2": Qwen2Config(**COMMON, tie_word_embeddings=False),
        "qwen3": Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False),
        # 4 experts, 2 per token, every layer MoE
        "qwen3_moe": Qwen3MoeConfig(**COMMON, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                    moe_intermediate_size=32, norm_topk_prob=True,
                                    tie_word_embeddings=False),
        # sandwich norms, GELU-tanh, a window shorter than the prompts, a rope per layer kind
        "gemma3": Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 3}, head_dim=16, query_pre_attn_scalar=16,
            sliding_window=4, layer_types=["sliding_attention", "full_attention",
                                           "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
    }


ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]


@dataclass
class TinyModel:
    name: str
    path: Path
    hf: torch.nn.Module

    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return self.hf(torch.tensor([ids])).logits[0].float().cpu()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    out = {}
    for name, cfg in _configs().items():
        hf = random_hf(cfg)
        path = tmp_path_factory.mktemp(name)
        hf.save_pretrained(path)
        out[name] = TinyModel(name, path, hf)
    return out


@pytest.fixture(params=ARCHS)
def tiny(request: pytest.FixtureRequest, tiny_models: dict[str, TinyModel]) -> TinyModel:
    return tiny_models[request.param]


def make_executor(path: Path, page_size: int = 4, kv_tokens: int = 8192,
                  dtype: torch.dtype = torch.float32, device: str = "cpu",
                  backend: str | None = None, kv_dtype: str | None = None) -> ModelExecutor:
    # the cache in the model's own type (bf16 models) or float32, never auto's float16 for
    # quantized files: these checks hold the model's arithmetic to transformers' float32; the
    # float16 cache has its own test (test_kv_dtype), since a tiny random MoE's router can
    # flip on its rounding
    if kv_dtype is None:
        kv_dtype = "bfloat16" if dtype == torch.bfloat16 else "float32"
    cfg = EngineConfig(page_size=page_size, kv_tokens=kv_tokens, max_running=64,
                       kv_dtype=kv_dtype)  # type: ignore[arg-type]
    # one thread: tiny models are overhead-bound, and a busy machine cannot starve a team
    return ModelExecutor.from_pretrained(path, cfg, dtype=dtype, device=device, backend=backend,
                                         threads=1)


@pytest.fixture
def harness(tiny: TinyModel, kernels: str) -> Harness:
    return Harness(make_executor(tiny.path))


def check_against_hf(tiny: TinyModel, h: Harness, reqs: list[Request],
                     atol: float = 1e-4) -> None:
    """Every recorded logits row equals HF's at that position; greedy tokens are HF's argmax."""
    for req in reqs:
        full = req.prompt_ids + req.output_ids
        ref = tiny.hf_logits(full)
        recorded = h.logits[req.id]
        assert recorded, f"{req.id} recorded no logits"
        for pos, row in recorded.items():
            where = f"{req.id} position {pos}"
            torch.testing.assert_close(row, ref[pos], atol=atol, rtol=1e-4,
                                       msg=lambda m, where=where: f"{where}: {m}")
        for i, tok in enumerate(req.output_ids):
            assert tok == int(ref[req.prompt_len - 1 + i].argmax()), (req.id, i)


@pytest.fixture
def check() -> object:
    return check_against_hf


@pytest.fixture
def make_harness() -> object:
    return lambda path, **kw: Harness(make_executor(path, **kw))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from engine.execution.loading.loader import ModelNotFound, resolve_model
    cache = os.environ.get("FERRY_TEST_MODEL_CACHE") or \
        Path(tempfile.gettempdir()) / "ferry-test-model-cache"
    try:
        return resolve_model(None, cache, progress=False)
    except ModelNotFound as exc:
        pytest.fail(f"the default model must be installed (make test does it): {exc}")


@pytest.fixture(scope="session")
def weights(model_dir: Path) -> Any:
    import torch

    from engine.execution.loading.loader import load_model
    return load_model(model_dir, torch.float32, "cpu")


@pytest.fixture(scope="session")
def deeper_gguf(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model with two more layers (tests/tools/deeper_gguf.py): a speculative
    target the default model drafts for, agreeing mostly, not always. Written once a
    session."""
    from tests.tools.deeper_gguf import write_deeper
    return write_deeper(tmp_path_factory.mktemp("deeper") / "deeper.gguf", extra=2,
                        scale=0.01, source=model_dir)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from engine.execution.text.tokenizer import Tokenizer
    return Tokenizer(model_dir)


@pytest.fixture
def ferry_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own FERRY_HOME (its tmp_path) and no FERRY_* variables from outside."""
    for name in [n for n in os.environ if n.startswith("FERRY_") and n not in SHARED_ENV]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FERRY_HOME", str(tmp_path))
    return tmp_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def port_picker() -> Any:
    """free_port for fixtures and tests outside this file: a free loopback port."""
    return free_port


@dataclass
class Server:
    url: str
    app: Any
    engine: Any
    uvicorn: Any
    thread: threading.Thread

    @property
    def services(self) -> Any:
        return self.app.state.services

    @property
    def gateway(self) -> Any:  # upstream mode: what the lifespan runs is the gateway
        return self.engine

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive(), "uvicorn did not stop"
        assert not self.engine.alive, "the lifespan did not stop the engine (or gateway)"


def serve_in_thread(app: Any, engine: Any, name: str, timeout: float) -> Server:
    """uvicorn serving `app` on a free loopback port in a daemon thread, once it is started;
    `engine` is what the app's lifespan runs (the engine, or the gateway of upstream mode)."""
    import uvicorn

    port = free_port()
    # keep-alive longer than the clients' own (httpx retires an idle connection after 5 s):
    # at uvicorn's 5 s a client could reuse a connection the server was just closing, and a
    # test client that does not retry (max_retries=0) saw "connection reset by peer"
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="on",
                                           timeout_keep_alive=30,
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.05)
    return Server(f"http://127.0.0.1:{port}", app, engine, server, thread)


@pytest.fixture(scope="session")
def in_thread_server() -> Any:
    """serve_in_thread for fixtures outside this file (the gateway's front)."""
    return serve_in_thread


@pytest.fixture(scope="module")
def make_server(model_dir: Path, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory: make_server(engine fields..., web=WebConfig fields, executor=None) -> a
    running Server; `executor` replaces the model (a stand-in, for tests about access),
    `tokenizer_override` the default model's tokenizer (its chat template, say)."""

    from engine.config import EngineConfig
    from engine.execution.executor import ModelExecutor
    from engine.execution.text.tokenizer import read_eos_ids
    from engine.runtime.engine import Engine
    from web.app import create_app
    from web.config import WebConfig

    servers: list[Server] = []

    def make(web: dict[str, Any] | None = None, executor: Any = None,
             data_dir: Path | None = None, tokenizer_override: Any = None,
             **engine_fields: Any) -> Server:
        config = EngineConfig(**{"kv_tokens": 8192, "max_context": 2048, **engine_fields})
        if executor is None:
            executor = ModelExecutor(request.getfixturevalue("weights"), config, "cpu", None,
                                     read_eos_ids(model_dir), model_dir)
        tok = tokenizer_override or tokenizer  # e.g. the same vocabulary, another template
        engine = Engine(config, executor, tok)
        web_config = WebConfig(data_dir=data_dir or tmp_path_factory.mktemp("data"),
                               **(web or {}))
        app = create_app(engine, tok, web_config)
        running = serve_in_thread(app, engine, "uvicorn", 60)
        servers.append(running)
        return running

    yield make
    for server in servers:
        server.stop()


class StandInExecutor:
    """Replaces the model where a test is about access, wiring or what the pages report: samples
    the same ordinary token every round, one round per `delay` seconds."""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay

    def run(self, batch: Batch) -> list[int | None]:
        time.sleep(self.delay)
        return [28 if item.sample else None for item in batch.items]

    def release(self, request: Request) -> None:
        pass


@pytest.fixture(scope="session")
def stand_in() -> Any:
    """The StandInExecutor class (tests build one with the delay they need)."""
    return StandInExecutor


@pytest.fixture(scope="module")
def make_shared_server(make_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A factory: make_shared_server(name, {user: is_admin}, delay, web=..., engine fields...)
    -> (Server in shared mode around a StandInExecutor, {user: token}); the users are in the
    server's own data dir."""
    from web.access.users import UserStore

    def make(name: str, users: dict[str, bool], delay: float = 0.02,
             web: dict[str, Any] | None = None, **engine_fields: Any) -> tuple[Any, dict]:
        data = tmp_path_factory.mktemp(name)
        store = UserStore(data / "users.json")
        tokens = {user: store.add(user, admin=admin) for user, admin in users.items()}
        server = make_server(executor=StandInExecutor(delay), data_dir=data,
                             web={"shared": True, **(web or {})}, **engine_fields)
        return server, tokens

    return make


@contextmanager
def long_chat_stream(url: str, model: str) -> Iterator[tuple[str, Iterator[str]]]:
    """A streamed chat completion long enough to act on while it runs (400 tokens, EOS
    ignored), entered once its first text arrived: (its request id, the rest of its lines)."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": "Count to a thousand."}],
            "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
        rid = response.headers["x-request-id"]
        lines = response.iter_lines()
        next(line for line in lines if '"content":"' in line and '"content":""' not in line)
        yield rid, lines


@pytest.fixture(scope="session")
def long_stream() -> Any:
    return long_chat_stream


def browser_sign_in(context: Any, url: str, token: str) -> Any:
    """A new page in the browser context, signed in with the token through /login."""
    import re

    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(url + "/login")
    page.fill("input[name=token]", token)
    page.locator("form button, form input[type=submit]").first.click()
    page.wait_for_url(re.compile(r"/$"))
    return page


@pytest.fixture(scope="session")
def sign_in() -> Any:
    return browser_sign_in


@contextmanager
def page_under_csp(browser: Any, **context_options: Any) -> Iterator[Any]:
    """A page in a new browser context; the test fails on any Content-Security-Policy
    violation its console reports (Ferry's pages run under a strict CSP)."""
    context = browser.new_context(**{"viewport": {"width": 1280, "height": 800},
                                     **context_options})
    page = context.new_page()
    page.set_default_timeout(30_000)
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text)
            if "Content Security Policy" in m.text else None)
    yield page
    context.close()
    assert not violations, violations


@pytest.fixture(scope="session")
def csp_page() -> Any:
    """page_under_csp for the browser tests."""
    return page_under_csp


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05,
             message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message}")
        time.sleep(interval)


def assert_engine_idle(engine: Any) -> None:
    """Every slot and KV page is free once the engine went idle."""
    assert engine.wait_idle(60), "the engine did not go idle"
    snap = wait_for(lambda: (s := engine.snapshot()).busy is False and s, message="idle snapshot")
    assert snap.free_slots == snap.max_running
    assert snap.kv.used == 0 and snap.kv.reserved == 0
    assert not snap.waiting and not snap.running


@pytest.fixture(scope="session")
def waiter() -> Any:
    return wait_for


@pytest.fixture(scope="session")
def idle_check() -> Any:
    return assert_engine_idle


CHROMIUM = "/usr/bin/chromium"  # Debian's; playwright never downloads a browser here
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]


@pytest.fixture(scope="module")
def browser(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Headless Debian Chromium driven by playwright (one per test module); a module's
    CHROMIUM_EXTRA_ARGS are added to its command line."""
    if not Path(CHROMIUM).exists():
        # make test installs it: absent under CI is a failure, not a skip
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        extra = list(getattr(request.module, "CHROMIUM_EXTRA_ARGS", []))
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS + extra)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def make_models_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[Any]:
    """A factory: make_models_server(names, web=..., budget=..., rules=..., data_dir=...,
    **engine fields) -> a running Server over an engine.ModelSet of real models: the first
    name is the default SmolLM2 GGUF (loaded at start), the others copies of it under their
    own names (loaded on demand); `rules`: engine.SharingRules; `data_dir`: the web layer's
    (a shared server's users file in it)."""
    from engine.config import EngineConfig
    from engine.models import Budget, ModelSet
    from tests.tools.model_sources import copy_model, gguf_source
    from web.app import create_app
    from web.config import WebConfig

    servers: list[Server] = []
    cache = tmp_path_factory.mktemp("models-cache")
    folder = tmp_path_factory.mktemp("models")

    def make(names: tuple[str, ...] = ("alpha", "beta"), web: dict[str, Any] | None = None,
             budget: Any = None, rules: Any = None, data_dir: Path | None = None,
             **engine_fields: Any) -> Server:
        config = EngineConfig(**{"kv_tokens": 4096, "max_context": 2048, **engine_fields})
        files = [model_dir] + [copy_model(model_dir, folder, n) for n in names[1:]]
        sources = [gguf_source(n, f, config, cache) for n, f in zip(names, files, strict=True)]
        loaded, tokenizer = sources[0].load(), sources[0].open_tokenizer()
        models = ModelSet(sources, loaded.config, budget or Budget(2, 8 << 30),
                          preloaded={names[0]: (loaded, tokenizer)}, poll=0.05, rules=rules)
        web_config = WebConfig(data_dir=data_dir or tmp_path_factory.mktemp("data"),
                               model_name=names[0],
                               model_runs=loaded.runs, **(web or {}))
        running = serve_in_thread(create_app(models, tokenizer, web_config), models,
                                  "uvicorn-models", 60)
        servers.append(running)
        return running

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def embedding_dir() -> Path:
    """all-MiniLM-L6-v2's folder (tests/tools/embedding_model.py), as the default model is
    required: installed by `make test`."""
    from tests.tools.embedding_model import INSTALL, embedding_model_dir

    folder = embedding_model_dir()
    if folder is None:
        pytest.fail(f"the embedding test model must be installed (make test does it): {INSTALL}")
    return folder

"""Web tests drive the real server: the default model (float32, CPU), the engine thread and
uvicorn on a free loopback port in a background thread.

The model is converted once per machine into a cache under the temp dir (or
FERRY_TEST_MODEL_CACHE) and its weights are loaded once per session; each module builds
its own engine (its own KV pool and slots) and server around them.
"""
from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from engine.execution.loader import ModelNotFound, resolve_model
    cache = os.environ.get("FERRY_TEST_MODEL_CACHE") or \
        Path(tempfile.gettempdir()) / "ferry-test-model-cache"
    try:
        return resolve_model(None, cache, progress=False)
    except ModelNotFound as exc:
        pytest.fail(f"the default model must be installed (make test does it): {exc}")


@pytest.fixture(scope="session")
def weights(model_dir: Path) -> Any:
    import torch

    from engine.execution.loader import load_model
    return load_model(model_dir, torch.float32, "cpu")


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from engine.execution.tokenizer import Tokenizer
    return Tokenizer(model_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive(), "uvicorn did not stop"
        assert not self.engine.alive, "the lifespan did not stop the engine"


@pytest.fixture(scope="module")
def make_server(model_dir: Path, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory: make_server(engine fields..., web=WebConfig fields, executor=None) -> a
    running Server; `executor` replaces the model (a stand-in, for tests about access)."""
    import uvicorn

    from engine.config import EngineConfig
    from engine.execution.executor import ModelExecutor
    from engine.execution.tokenizer import read_eos_ids
    from engine.runtime.engine import Engine
    from web.app import create_app
    from web.config import WebConfig

    servers: list[Server] = []

    def make(web: dict[str, Any] | None = None, executor: Any = None,
             data_dir: Path | None = None, **engine_fields: Any) -> Server:
        config = EngineConfig(**{"kv_tokens": 8192, "max_context": 2048, **engine_fields})
        if executor is None:
            executor = ModelExecutor(request.getfixturevalue("weights"), config, "cpu", None,
                                     read_eos_ids(model_dir), model_dir)
        engine = Engine(config, executor, tokenizer)
        web_config = WebConfig(data_dir=data_dir or tmp_path_factory.mktemp("data"),
                               **(web or {}))
        app = create_app(engine, tokenizer, web_config)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="on",
                                               timeout_graceful_shutdown=2))
        thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        running = Server(f"http://127.0.0.1:{port}", app, engine, server, thread)
        servers.append(running)
        return running

    yield make
    for server in servers:
        server.stop()


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
def browser() -> Iterator[Any]:
    """Headless Debian Chromium driven by playwright (one per test module)."""
    if not Path(CHROMIUM).exists():
        # make test installs it: absent under CI is a failure, not a skip
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()

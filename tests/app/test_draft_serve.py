"""`ferry serve --speculative draft --draft-model PATH`: the refusals (no draft model, a
missing one, another tokenizer, a target with sliding-window layers) exit with a message and
no traceback; a served draft drafts, /metrics names the drafter, and every page of both
pools comes back. Small synthetic GGUFs with the default model's tokenizer keep it fast."""
from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf import GGMLQuantizationType

from app import cli
from app.models import resolve_model
from app.paths import get_paths
from app.serve import build
from app.settings import Settings
from tests.tools import synthetic_gguf
from tests.tools.deeper_gguf import write_deeper


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The module's models, written once: their tokenizer folders are built once too."""
    folder = tmp_path_factory.mktemp("draft-models")

    def small(name: str, window: int = 0) -> Path:
        synthetic_gguf.write(folder / name, hidden=64, layers=2, ff=128, heads=4, kv_heads=2,
                             qtype=GGMLQuantizationType.F16, untied=False, window=window)
        return folder / name

    base = small("small.gguf")
    other = write_deeper(folder / "other.gguf", extra=0, source=base,
                         renamed={10: "<not-the-target>"})
    return {"small": base, "windowed": small("windowed.gguf", window=32), "other": other,
            "cache": folder / "cache"}


@pytest.fixture(autouse=True)
def shared_cache(ferry_home: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
                 ) -> None:
    """Each test's own FERRY_HOME, but one cache (tokenizer folders, kernels) for the
    module; serve's log handlers are undone after each test."""
    files["cache"].mkdir(exist_ok=True)
    (ferry_home / "cache").symlink_to(files["cache"])
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["serve", "--port", str(free_port()), *argv])
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, err


def test_draft_without_a_draft_model(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = serve(capsys, "--speculative", "draft")
    assert code == 2 and "needs a draft model" in err and "--draft-model" in err


def test_missing_draft_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, err = serve(capsys, "--speculative", "draft", "--draft-model",
                      str(tmp_path / "none.gguf"))
    assert code == 2 and "draft model" in err and "not found" in err


def test_draft_with_another_tokenizer(capsys: pytest.CaptureFixture[str],
                                      files: dict[str, Path]) -> None:
    code, err = serve(capsys, "--model", str(files["small"]), "--speculative", "draft",
                      "--draft-model", str(files["other"]))
    assert code == 2
    assert "draft model" in err and "tokenizer differs from the target's" in err


def test_draft_for_a_sliding_window_target(capsys: pytest.CaptureFixture[str],
                                           files: dict[str, Path]) -> None:
    code, err = serve(capsys, "--model", str(files["windowed"]), "--speculative", "draft",
                      "--draft-model", str(files["small"]))
    assert code == 2 and "sliding-window layers" in err and "ngram or off" in err


def test_served_draft_drafts_and_gives_every_page_back(
        files: dict[str, Path], in_thread_server: Any, idle_check: Any) -> None:
    # the model drafts for itself (tests/engine/speculative drafts for a deeper target)
    settings = Settings(model=str(files["small"]), speculative="draft",
                        draft_model=str(files["small"]), max_running=2, kv_tokens=2048,
                        default_max_tokens=12)
    model = resolve_model(str(files["small"]))
    app, _, runs, _ = build(settings, get_paths(), model, progress=False)
    assert "; drafts with small (" in runs
    server = in_thread_server(app, None, "uvicorn-draft", 120)
    engine = server.engine = app.state.services.engine
    try:
        body = {"model": model.name, "max_tokens": 30, "temperature": 0, "ignore_eos": True,
                "prompt": "one two three four"}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 30
        idle_check(engine)
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'drafter="draft"' in metrics
        snap = engine.snapshot()
        assert snap.speculative == "draft"
        assert snap.metrics.accepted_tokens == snap.metrics.drafted_tokens > 0
        runner = engine._core.drafter.prepared.model  # type: ignore[union-attr]
        assert runner.free_pages == runner.num_pages
    finally:
        server.stop()

"""docs/configuration.md is what scripts/gen_config_docs.py writes from Settings today."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from app.settings import Settings

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gen_config_docs.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_page_is_current() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == _generator().render(), (
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py")


def test_every_setting_is_on_the_page_with_its_env_and_flag() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name in Settings.names():
        assert f"| `{name}` |" in page and f"`FERRY_{name.upper()}`" in page, name
    for flag in ("`--max-running`", "`--discover`, `--no-discover`", "`--upstream`"):
        assert flag in page


def test_a_setting_without_words_stops_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = _generator()
    monkeypatch.delitem(generator.HELP, "kv_tokens")
    with pytest.raises(SystemExit, match="kv_tokens"):
        generator.render()


def test_check_mode_reports_a_stale_page(tmp_path: Path) -> None:
    generator = _generator()
    assert generator.main(["--check"]) == 0
    stale = tmp_path / "configuration.md"
    stale.write_text("# Configuration\n")
    generator.PAGE = stale
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0 and generator.main(["--check"]) == 0  # rewritten


def test_runs_as_a_script() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr

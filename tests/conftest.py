"""Fixtures shared by the top-level app tests."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def ferry_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Its own FERRY_HOME and no FERRY_* variables from outside, so nothing touches the real
    home. Modules opt in with `pytestmark = pytest.mark.usefixtures("ferry_home")`."""
    for name in [n for n in os.environ if n.startswith("FERRY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("FERRY_HOME", str(tmp_path))
    return tmp_path

"""Where the browser tests write their screenshots: README's (docs/screenshots) when
FERRY_UPDATE_SCREENSHOTS=1 or the file is missing, else the test's own tmp_path."""
from __future__ import annotations

import os
from pathlib import Path

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def screenshot_path(name: str, tmp_path: Path) -> Path:
    target = SCREENSHOTS / name
    if os.environ.get("FERRY_UPDATE_SCREENSHOTS") == "1" or not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        return target
    return tmp_path / name

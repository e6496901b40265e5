"""Scenario files: unknown fields and malformed scenarios are refused with clear errors, by
parse() and by the simulate command line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.sim.scenario import ScenarioError, parse
from engine.sim.simulator import cli

# -- scenario validation ---------------------------------------------------------------------
GOOD_ENGINE = {"max_running": 2, "max_prefill_tokens": 8, "kv_tokens": 100, "page_size": 1}


@pytest.mark.parametrize("data, field", [
    ({"engine": GOOD_ENGINE, "requests": [], "bogus": 1}, "bogus"),
    ({"engine": {**GOOD_ENGINE, "max_runing": 3}, "requests": []}, "max_runing"),
    ({"engine": GOOD_ENGINE, "requests": [{"id": "A", "prompt": 3, "output": 1, "promt": 3}]},
     "promt"),
])
def test_unknown_fields_are_refused(data: dict, field: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ScenarioError, match=field):
        parse(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    assert cli([str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert field in captured.err and "ferry simulate" in captured.err


@pytest.mark.parametrize("data, words", [
    ({"engine": {**GOOD_ENGINE, "policy": "lifo"}, "requests": []}, "policy"),
    ({"requests": [{"id": "A", "output": 1}]}, "prompt"),
    ({"requests": [{"id": "A", "prompt": 2, "prompt_ids": [1], "output": 1}]}, "prompt"),
    ({"requests": [{"id": "A", "prompt": 0, "output": 1}]}, "prompt"),
    ({"requests": [{"id": "A", "prompt": 2}]}, "output"),
    ({"requests": [{"id": "A", "prompt": 2, "output": 1}, {"id": "A", "prompt": 1, "output": 1}]},
     "twice"),
    ({"requests": [{"id": "A", "prompt": 2, "output": 1, "arrive": -1}]}, "arrive"),
    ({"requests": "A"}, "requests"),
])
def test_malformed_scenarios_are_refused(data: dict, words: str) -> None:
    with pytest.raises(ScenarioError, match=words):
        parse(data)


def test_cli_reports_unreadable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli([str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err

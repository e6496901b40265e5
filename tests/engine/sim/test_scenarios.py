"""The worked scheduling examples (tests/data/scenarios, described in docs/architecture.md)
reproduce their expected rounds exactly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.sim.scenario import load
from engine.sim.simulator import cli, simulate

REPO = Path(__file__).resolve().parents[3]
SCENARIOS = REPO / "tests" / "data" / "scenarios"
# Listed by name, so a lost file fails its own test instead of silently leaving the set.
NAMES = ("chunked-prefill", "fig3-abc", "fig8-abcde")
FILES = [SCENARIOS / f"{name}.json" for name in NAMES]
COMPARED = ("round", "phase", "batch", "outputs", "finished")


def _expected(path: Path) -> dict:
    return json.loads(path.with_name(path.stem + ".expected.json").read_text())


def _compare(actual: dict, expected: dict, name: str) -> None:
    got = [{k: r[k] for k in COMPARED} for r in actual["rounds"]]
    want = [{k: r[k] for k in COMPARED} for r in expected["rounds"]]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"{name}: round entry {i} differs\n got: {g}\nwant: {w}"
    assert len(got) == len(want), f"{name}: {len(got)} rounds, expected {len(want)}"
    for rid, want_req in expected.get("requests", {}).items():
        got_req = actual["requests"][rid]
        assert {k: got_req.get(k) for k in want_req} == want_req, f"{name}: request {rid}"


def test_scenario_files_are_present() -> None:
    """The data ships in the repository: a missing file is a failure, never a skip."""
    for path in FILES:
        assert path.is_file(), f"{path} is missing"
        expected = path.with_name(path.stem + ".expected.json")
        assert expected.is_file(), f"{path.name} has no expected rounds ({expected.name})"
    inputs = {p.stem for p in SCENARIOS.glob("*.json") if not p.name.endswith(".expected.json")}
    assert inputs == set(NAMES), f"scenario files not listed in NAMES: {inputs - set(NAMES)}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario_matches_expected(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ferry simulate FILE --json` gives the expected rounds, round for round."""
    assert cli([str(path), "--json"]) == 0
    out = capsys.readouterr().out
    actual = json.loads(out)
    _compare(actual, _expected(path), path.name)
    # The library call and the CLI agree.
    assert simulate(load(path)) == actual
    # Every request in the file ended normally (these scenarios have no cancels or errors).
    for rid, req in actual["requests"].items():
        assert req["finish_reason"] in ("length", "stop"), rid


def test_cli_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    path = FILES[0]
    assert cli([str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    result = json.loads(captured.out)
    assert set(result) == {"rounds", "requests"}
    keys = {"round", "phase", "batch", "outputs", "finished", "running", "waiting",
            "waiting_reasons", "free_slots", "kv_used"}
    for r in result["rounds"]:
        assert keys <= set(r), r
        assert set(r["waiting_reasons"]) == set(r["waiting"])
    for req in result["requests"].values():
        assert {"first_token_round", "finish_round", "finish_reason", "output_tokens"} <= set(req)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_cli_table_lists_every_round(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli([str(path)]) == 0
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert "round" in lines[0] and "phase" in lines[0]
    rows = {}
    for line in lines[2:]:
        parts = line.split()
        if not parts or not parts[0].isdigit():
            break
        rows[int(parts[0])] = parts
    expected = _expected(path)["rounds"]
    assert sorted(rows) == [r["round"] for r in expected]
    for r in expected:
        row = rows[r["round"]]
        assert row[1] == r["phase"]
        assert row[2:2 + len(r["batch"])] == [f"{b['id']}:{b['tokens']}" for b in r["batch"]]
    # The per-request summary follows the rounds.
    for spec in json.loads(path.read_text())["requests"]:
        assert any(line.split()[:1] == [spec["id"]] for line in lines), spec


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_cli_summary(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli([str(path), "--summary"]) == 0
    result = json.loads(capsys.readouterr().out)
    expected = _expected(path)["rounds"]
    assert result["rounds"] == len(expected)
    full = simulate(load(path))
    assert result["requests"] == full["requests"]

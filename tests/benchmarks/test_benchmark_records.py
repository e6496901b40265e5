"""Benchmark records: the rendered tables in README.md and docs/benchmarks.md match
benchmarks/records.jsonl, and peerbench's --record appends a well-formed record."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks import peerbench, render
from benchmarks.records import RECORDS, Record, append, load


def test_pages_match_the_records() -> None:
    records = load()
    for name, (page, make) in render.PAGES.items():
        text = page.read_text(encoding="utf-8")
        assert render.rendered(text, name, make(records)) == text, (
            f"{page.name}: the table differs from benchmarks/records.jsonl: "
            "run python -m benchmarks.render")
    assert render.main(["--check"]) == 0


def test_every_record_names_cpu_method_and_runs() -> None:
    records = load()
    assert records
    for record in records:
        assert record.cpu and record.method and record.metric and record.model, record
        assert all(isinstance(x, float | int) for x in record.ferry + record.peer_figures)
        if record.peer_figures:
            assert record.peer, record
    headline = [r for r in records if r.headline]
    assert headline and all(r.peer_figures and r.peer_build and r.date for r in headline)


def test_a_changed_record_makes_the_pages_stale(tmp_path: Path) -> None:
    lines = RECORDS.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["ferry"] = [x + 1 for x in first["ferry"]]
    changed = tmp_path / "records.jsonl"
    changed.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n", encoding="utf-8")
    assert render.main(["--check", "--records", str(changed)]) == 1


def test_markers_must_be_whole() -> None:
    with pytest.raises(ValueError, match="benchmarks:all:start"):
        render.rendered("no markers here", "all", "x")
    text = "a\n<!-- benchmarks:all:start -->\nold\n<!-- benchmarks:all:end -->\nb"
    assert render.rendered(text, "all", "new") == (
        "a\n<!-- benchmarks:all:start -->\nnew\n<!-- benchmarks:all:end -->\nb")


def test_readme_keeps_one_cpu_name_with_other_flags_apart() -> None:
    """Two CPUs sold under one name, one with AVX-512 and one without, are two machines in
    the README, each named with its flags; a name of its own stays as it is."""
    base = dataclasses.replace(load()[0], headline=True, cpu="AMD EPYC, 2 threads")
    wide = dataclasses.replace(base, cpu_flags=("avx2", "avx512f"), workload="wide")
    narrow = dataclasses.replace(base, cpu_flags=("avx2",), workload="narrow")
    other = dataclasses.replace(base, cpu="Intel Xeon, 2 vCPUs", workload="other")
    table = render.readme_table([wide, narrow, other, dataclasses.replace(wide, headline=False)])
    machines = [line for line in table.splitlines() if line.startswith("- Machine:")]
    assert [m.split(";")[0] for m in machines] == [
        "- Machine: AMD EPYC, 2 threads (avx2 avx512f)", "- Machine: AMD EPYC, 2 threads (avx2)",
        "- Machine: Intel Xeon, 2 vCPUs"]
    sections = table.split("- Machine:")[1:]
    assert ["| wide |" in s for s in sections] == [True, False, False]
    assert ["| narrow |" in s for s in sections] == [False, True, False]


def test_unknown_fields_and_empty_figures_are_refused() -> None:
    good = load()[0].to_json()
    with pytest.raises(ValueError, match="unknown"):
        Record.from_json(json.dumps({**json.loads(good), "speed": 1}))
    with pytest.raises(ValueError, match="without Ferry"):
        Record.from_json(json.dumps({**json.loads(good), "ferry": []}))


def _run(path: Path, concurrency: int, decode: float, aggregate: float) -> str:
    workload = {"endpoint": "completions", "n": 4, "concurrency": concurrency,
                "max_tokens": 128, "prompt_tokens": 115, "ignore_eos": True}
    summary = {"decode_tok_s_mean": decode, "agg_output_tok_s": aggregate}
    path.write_text(json.dumps({"workload": workload, "summary": summary}))
    return str(path)


def test_peerbench_record_appends_one_comparison(tmp_path: Path) -> None:
    ferry = [_run(tmp_path / f"f{i}.json", 1, 100.0 + i, 90.0) for i in range(2)]
    peer = [_run(tmp_path / f"p{i}.json", 1, 50.0 + i, 45.0) for i in range(2)]
    args = peerbench.parse_args(
        ["--record", "--ferry", *ferry, "--peer", *peer, "--model-name", "default",
         "--workload", "one chat (-np 1)", "--peer-name", "llama.cpp llama-server",
         "--peer-build", "b10470, native flags", "--threads", "2"])
    record = peerbench.make_record(args)
    assert record.ferry == (100.0, 101.0) and record.peer_figures == (50.0, 51.0)
    assert record.metric == "decode tok/s per stream" and "2 threads" in record.cpu
    assert "ignore_eos" in record.method and record.date
    target = tmp_path / "records.jsonl"
    append(record, target)
    append(record, target)
    assert load(target) == [record, record]
    assert render.ratio(record) == "1.99x"  # 100.5 / 50.5


def test_peerbench_record_refuses_mixed_workloads(tmp_path: Path) -> None:
    args = peerbench.parse_args(
        ["--record", "--ferry", _run(tmp_path / "a.json", 1, 1.0, 1.0),
         _run(tmp_path / "b.json", 32, 1.0, 1.0), "--model-name", "m", "--workload", "w"])
    with pytest.raises(SystemExit, match="one workload"):
        peerbench.make_record(args)
    with pytest.raises(SystemExit):
        peerbench.parse_args(["--record", "--ferry", "x.json"])  # no model or workload

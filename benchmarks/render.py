"""Render the benchmark tables in README.md and docs/benchmarks.md from benchmarks/records.jsonl.

    python -m benchmarks.render           # rewrite the tables between their marker comments
    python -m benchmarks.render --check   # exit 1 when a page differs from the records

Each page holds its table between `<!-- benchmarks:NAME:start -->` and
`<!-- benchmarks:NAME:end -->`; everything outside the markers is left as written.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from benchmarks.records import RECORDS, Record, load

ROOT = Path(__file__).resolve().parents[1]


def _mean(values: Iterable[float]) -> float:
    return statistics.fmean(values)


def _num(value: float) -> str:
    if abs(value) >= 1e5 or (value and abs(value) < 1e-2):
        return f"{value:.4g}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _figures(values: tuple[float, ...]) -> str:
    """The mean, with the number of runs and their range when there are several."""
    if not values:
        return ""
    if len(values) == 1:
        return _num(values[0])
    return f"{_num(_mean(values))} ({len(values)} runs, {_num(min(values))}-{_num(max(values))})"


def ratio(record: Record) -> str:
    """Ferry's mean over the peer's; for perplexity, the relative difference; for a time
    (lower is better), the peer's over Ferry's, "sooner" (a longest gap: "shorter")."""
    if not record.peer_figures:
        return ""
    ours, theirs = _mean(record.ferry), _mean(record.peer_figures)
    if record.metric.startswith("perplexity"):
        return f"{(ours / theirs - 1) * 100:+.2f}%"
    if record.metric.startswith("time to"):  # lower is better: how many times sooner
        return f"{theirs / ours:.2f}x sooner"
    if record.metric.startswith("longest gap"):  # lower is better too
        return f"{theirs / ours:.2f}x shorter"
    return f"{ours / theirs:.2f}x"


def _level(record: Record) -> str:
    return "" if record.ferry_cpu == "native" else f", FERRY_CPU={record.ferry_cpu}"


def _joined(records: list[Record], attribute: Callable[[Record], str | None]) -> str:
    seen: list[str] = []
    for record in records:
        value = attribute(record)
        if value and value not in seen:
            seen.append(value)
    return "; ".join(seen)


def _legend(values: list[str], prefix: str) -> dict[str, str]:
    """Each distinct value -> a short key (B1, B2 ...), in order of first use."""
    keys: dict[str, str] = {}
    for value in values:
        if value and value not in keys:
            keys[value] = f"{prefix}{len(keys) + 1}"
    return keys


def _notes(record: Record) -> str:
    """The notes, then the extra figures ("ferry_ttft_p50_s: 0.87")."""
    parts = [record.notes] if record.notes else []
    parts += [f"{key.replace('_', ' ')}: {value}" for key, value in record.extra.items()]
    return "; ".join(parts)


def readme_table(records: list[Record]) -> str:
    """The headline records, a table a machine: one line each, and where, against what and
    how. A machine is its CPU's name and flags (one name covers CPUs with and without
    AVX-512), the flags named where a name alone does not tell them apart."""
    machines: dict[tuple[str, tuple[str, ...]], list[Record]] = {}
    for record in records:
        if record.headline:
            machines.setdefault((record.cpu, tuple(record.cpu_flags)), []).append(record)
    names = Counter(cpu for cpu, _ in machines)
    out: list[str] = []
    for (cpu, flags), chosen in machines.items():
        which = f" ({' '.join(flags) or 'flags not written down'})" if names[cpu] > 1 else ""
        out += [
            f"- Machine: {cpu}{which}; measured {_joined(chosen, lambda r: r.date)}.",
            f"- Peer: {_joined(chosen, lambda r: r.peer)}, build "
            f"{_joined(chosen, lambda r: f'{r.peer_build} (against Ferry {r.ferry_cpu})')}.",
            f"- Method: {_joined(chosen, lambda r: r.method)}.",
            "",
            "| model | workload | unit | Ferry | llama.cpp | Ferry / llama.cpp |",
            "|---|---|---|---|---|---|",
        ]
        out += [f"| {r.model}{_level(r)} | {r.workload} | {r.metric} | {_figures(r.ferry)} | "
                f"{_figures(r.peer_figures)} | **{ratio(r)}** |" for r in chosen]
        out.append("")
    return "\n".join(out).rstrip("\n")


def all_tables(records: list[Record]) -> str:
    """Every record, grouped by day and CPU (its name and flags: one name covers CPUs with
    and without AVX-512), the newest day first (undated ones last)."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[Record]] = {}
    for record in records:
        key = (record.date or "", record.cpu, tuple(record.cpu_flags))
        groups.setdefault(key, []).append(record)
    order = sorted(groups, key=lambda key: key[0], reverse=True)
    builds = _legend([r.peer_build or "" for r in records], "B")
    methods = _legend([r.method for r in records], "M")
    out: list[str] = []
    for date, cpu, cpu_flags in order:
        group = groups[(date, cpu, cpu_flags)]
        flags = " ".join(cpu_flags) or "not written down"
        commits = _joined(group, lambda r: r.commit) or "not written down"
        out += [f"### {date or 'Undated'}: {cpu}", "",
                f"CPU flags: {flags}. Ferry commits: {commits}.", "",
                "| model | workload | unit | Ferry | peer | ratio | build | method | notes |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in group:
            peer = f"{r.peer}: {_figures(r.peer_figures)}" if r.peer_figures else (r.peer or "")
            out.append(f"| {r.model}{_level(r)} | {r.workload or '-'} | {r.metric} | "
                       f"{_figures(r.ferry)} | {peer} | {ratio(r)} | "
                       f"{builds.get(r.peer_build or '', '')} | {methods[r.method]} | "
                       f"{_notes(r)} |")
        out.append("")
    out += ["### Peer builds", ""] + [f"- {key}: {value}" for value, key in builds.items()]
    out += ["", "### Methods", ""] + [f"- {key}: {value}" for value, key in methods.items()]
    return "\n".join(out)


PAGES: dict[str, tuple[Path, Callable[[list[Record]], str]]] = {
    "readme": (ROOT / "README.md", readme_table),
    "all": (ROOT / "docs" / "benchmarks.md", all_tables),
}


def rendered(text: str, name: str, body: str) -> str:
    """text with the block named `name` replaced by body; ValueError when its markers are off."""
    start, end = f"<!-- benchmarks:{name}:start -->", f"<!-- benchmarks:{name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"the page needs one {start} before one {end}")
    head, rest = text.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="report stale pages, write nothing")
    parser.add_argument("--records", type=Path, default=RECORDS)
    args = parser.parse_args(argv)
    records = load(args.records)
    stale = []
    for name, (page, render) in PAGES.items():
        text = page.read_text(encoding="utf-8")
        new = rendered(text, name, render(records))
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new, encoding="utf-8")
    for page in stale:
        verb = "differs from the records" if args.check else "rewritten"
        print(f"{page.relative_to(ROOT)}: {verb}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

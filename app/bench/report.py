"""`ferry bench`'s report: the table (or JSON) of every system's figures and their ratios."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

from app.bench.workload import Result, Workload, pct


def report(results: list[Result], work: Workload, dtype: str, as_json: bool,
           kernels: str = "", runs: str = "") -> None:
    rows = [r.row() for r in results]
    by = {r.system: r for r in results}
    ratios = {}
    ferry, single = results[0], by.get("ferry, one request alone")
    for r in results:
        if "under a JSON schema" in r.system:
            ratios["structured / unconstrained (output tok/s)"] = r.output_tps / ferry.output_tps
        if r.system.startswith("hf generate, one"):
            ratios["ferry / hf one-at-a-time (output tok/s)"] = ferry.output_tps / r.output_tps
            hf_tpot, one_tpot = pct(r.tpot, 0.5), single and pct(single.tpot, 0.5)
            if hf_tpot and one_tpot:  # per-token time: a speculative step writes several
                ratios["single request / hf batch 1 (decode tok/s)"] = hf_tpot / one_tpot
        elif r.system.startswith("hf generate, static"):
            ratios["ferry / hf static batches (output tok/s)"] = ferry.output_tps / r.output_tps
    if as_json:
        json.dump({"workload": asdict(work), "dtype": dtype, "kernels": kernels, "runs": runs,
                   "results": rows,
                   "ratios": {k: round(v, 2) for k, v in ratios.items()}}, sys.stdout, indent=1)
        print()
        return
    print(f"workload: {work.requests} requests, prompt {work.prompt}, output {work.output}, "
          f"concurrency {work.concurrency}, rate {work.rate or 'all at once'}, "
          f"shared prefix {work.shared_prefix}, dtype {dtype}"
          + (f", CPU kernels {kernels}" if kernels else "")
          + (f"; model runs as {runs}" if runs else ""))  # e.g. GGUF Q4_1 + Q8_0 head, ...
    cols = ["system", "output_tok_s", "prefill_tok_s", "ttft_p50_ms", "ttft_p95_ms",
            "itl_p50_ms", "itl_p95_ms", "tok_s_user", "scheduler_share_pct", "accepted_pct",
            "tokens_per_step"]
    heads = ["system", "out tok/s", "prefill tok/s", "TTFT p50 ms", "TTFT p95 ms", "ITL p50 ms",
             "ITL p95 ms", "tok/s/user", "sched %", "drafts kept %", "tok/step"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "|".join("---" for _ in heads) + "|")
    for row in rows:
        cells = ["-" if row[c] is None else str(row[c]) for c in cols]
        note = f" ({row['note']})" if row["note"] else ""
        print("| " + cells[0] + note + " | " + " | ".join(cells[1:]) + " |")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x")

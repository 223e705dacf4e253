"""Does restating the reply's keys after the input move quality? Per spec, on its test records.

Four prompts per spec, each scored on the same test records (the optimizer's split, seed 0):
the spec as written, the same with the reply reminder (``optimize.variants.with_reply_reminder``),
and both without examples. Reported: each mean and its paired difference from the spec as
written, with a 95% bootstrap interval. The optimizer races the reminder like any candidate;
this shows why it is a candidate and not a default (it helps some tasks and hurts others).

Usage:
    python -m bench.bench_reply_reminder [SPEC ...] [--records 100]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import bundled_specs, progress, setup, write_report


def measure(engine: Any, name: str, n: int) -> dict[str, Any]:
    from promptdistill.core.stats import bootstrap_ci, paired_diffs
    from promptdistill.evaluate.evaluator import evaluate
    from promptdistill.optimize.variants import reply_reminder, with_reply_reminder
    from promptdistill.search.splits import split_records
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.prompt import examples_for

    spec = load_spec(name)
    reminded = with_reply_reminder(spec)
    if reminded is None:
        return {"spec": name, "skipped": "no fixed object schema: nothing to restate"}
    records = split_records(spec, seed=0, screen_size=16, dev_size=1, test_size=n).test
    examples = examples_for(spec)
    prompts = {"as written": (spec, examples), "with reminder": (reminded, examples),
               "no examples": (spec, []), "no examples, with reminder": (reminded, [])}
    reports = {}
    for label, (variant, shots) in prompts.items():
        started = time.monotonic()
        reports[label] = evaluate(engine, variant, records, examples=shots)
        progress(f"[{name}] {label}: {reports[label].mean:.3f} on {reports[label].n} records "
                 f"({time.monotonic() - started:.0f} s)")
    base = reports["as written"]
    rows = []
    for label, report in reports.items():
        diff = bootstrap_ci(paired_diffs(report.scores, base.scores).tolist(), seed=0)
        rows.append({"prompt": label, "mean": report.mean, "n": report.n, "diff": diff.mean,
                     "diff_low": diff.low, "diff_high": diff.high})
    return {"spec": name, "reminder": reply_reminder(spec), "rows": rows}


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["# The reply reminder, per spec (test records, paired with the spec as written)", "",
             "| spec | prompt | mean (n) | minus the spec as written [95% CI] |", "|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['spec']} | - | {r['skipped']} | - |")
            continue
        for row in r["rows"]:
            lines.append(f"| {r['spec']} | {row['prompt']} | {row['mean']:.3f} ({row['n']}) | "
                         f"{row['diff']:+.3f} [{row['diff_low']:+.3f}, {row['diff_high']:+.3f}] |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    setup()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="*", help="spec names (default: every spec in prompts/)")
    p.add_argument("--records", type=int, default=100, help="test records per spec")
    args = p.parse_args(argv)
    from promptdistill.core.config import load_settings
    from promptdistill.engine import load_engine

    with load_engine(load_settings().engine) as engine:
        results = [measure(engine, name, args.records) for name in (args.specs or bundled_specs())]
    return {"path": str(write_report("reply_reminder", {"records": args.records, "specs": results},
                                     markdown(results)))}


if __name__ == "__main__":
    main()

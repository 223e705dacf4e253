"""The engine's dtype on the CPU build: one evaluation workload in float32 and in bfloat16.

Each dtype runs in a process of its own (one engine at a time), on the same records of
three bundled specs (the evaluator's batched call, prefix cache reset per spec), and the
sides alternate over ``--rounds`` so drift hits both. Reports wall seconds per spec (median
over rounds), the bfloat16/float32 throughput ratio and each side's mean score: what
``core.config.default_dtype`` chooses from.

Usage:
    python -m bench.bench_dtype [--records 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace

from bench.common import progress, setup, write_report

setup()

SPECS = ("invoice_extraction", "ticket_triage", "format_rules")
DTYPES = ("float32", "bfloat16")


def one_side(dtype: str, records: int) -> dict:
    """Evaluate ``SPECS`` on their first dev records in ``dtype`` (run in a child process)."""
    from promptdistill.core.config import load_settings
    from promptdistill.engine import GenerationRequest, load_engine
    from promptdistill.evaluate.evaluator import evaluate
    from promptdistill.specs import load_specs
    from promptdistill.specs.datasets import dataset_for
    from promptdistill.specs.datasets import records as split_records

    specs = {s.name: s for s in load_specs("prompts")}
    out: dict = {"dtype": dtype}
    with load_engine(replace(load_settings().engine, backend="local", dtype=dtype)) as engine:
        engine.generate([GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4)])
        for name in SPECS:
            recs = split_records(dataset_for(specs[name]), "dev")[:records]
            engine.reset_prefix_cache()
            started = time.perf_counter()
            report = evaluate(engine, specs[name], recs)
            out[name] = {"s": time.perf_counter() - started, "records": len(recs),
                         "mean_score": sum(report.scores) / len(report.scores),
                         "completion_tokens": sum(report.completion_tokens)}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--side", choices=DTYPES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        print(json.dumps(one_side(args.side, args.records)))
        return {}
    runs: dict[str, list[dict]] = {d: [] for d in DTYPES}
    for k in range(args.rounds):
        for dtype in DTYPES if k % 2 == 0 else DTYPES[::-1]:
            progress(f"dtype round {k + 1}/{args.rounds}: {dtype}")
            proc = subprocess.run([sys.executable, "-m", "bench.bench_dtype", "--side", dtype, "--records", str(args.records)],
                                  capture_output=True, text=True, check=True)
            runs[dtype].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    rows = []
    for name in SPECS:
        f32 = statistics.median(r[name]["s"] for r in runs["float32"])
        b16 = statistics.median(r[name]["s"] for r in runs["bfloat16"])
        rows.append({"spec": name, "records": runs["float32"][0][name]["records"],
                     "float32_s": round(f32, 1), "bfloat16_s": round(b16, 1), "speedup": round(f32 / b16, 2),
                     "float32_score": round(runs["float32"][0][name]["mean_score"], 3),
                     "bfloat16_score": round(runs["bfloat16"][0][name]["mean_score"], 3)})
    total = sum(r["float32_s"] for r in rows) / sum(r["bfloat16_s"] for r in rows)
    result = {"rounds": args.rounds, "rows": rows, "speedup_total": round(total, 2)}
    lines = ["# Engine dtype on the CPU build", "",
             f"The same evaluation (first {args.records} dev records per spec, one batched call) in float32 and in "
             f"bfloat16, each in its own process, alternating over {args.rounds} rounds; medians. "
             f"Overall bfloat16 is **{total:.2f}x** as fast. Scores are each side's mean on the same records "
             "(the model's replies differ slightly between dtypes).", "",
             "| spec | records | float32 s | bfloat16 s | speedup | float32 score | bfloat16 score |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['spec']} | {r['records']} | {r['float32_s']} | {r['bfloat16_s']} | {r['speedup']}x | "
              f"{r['float32_score']} | {r['bfloat16_score']} |" for r in rows]
    write_report("dtype", result, "\n".join(lines) + "\n")
    return result


if __name__ == "__main__":
    main()

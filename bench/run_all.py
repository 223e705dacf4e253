"""``make bench``: the benchmarks at a budget that fits an hour on a 2-core CPU machine;
``make bench-full`` (``--full``): every benchmark at its full budget (about four hours).

Each runs in its own process (one engine at a time: they would fight for the core vLLM
binds) and writes its JSON/markdown report into artifacts/bench/. Each script also runs
alone with its own budget flags.

The terminal shows each benchmark's own progress lines (``bench.common.progress``) and
its outcome, and at the end each one's minutes against its estimate; everything else it
prints (vLLM, DSPy, torch) goes to ``artifacts/bench/logs/<benchmark>.log``, whose tail is
shown when a benchmark fails. ``--verbose`` shows everything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import NamedTuple

from bench.common import PROGRESS_MARK, REPORT_DIR


class Benchmark(NamedTuple):
    """One benchmark: its module and arguments, and about how many minutes it takes on an idle
    2-core machine (the source of each figure is in the comment beside it)."""

    module: str
    args: tuple[str, ...]
    minutes: float

    @property
    def name(self) -> str:
        return self.module.rsplit(".", 1)[-1]


# Minutes: "measured" figures come from the reports in docs/bench/ and the README; engine
# start-up is 0.7 min (README, make run at ed0d6a4). bench_ttft_model publishes the TTFT model
# that bench_optimize and bench_peers load from the registry, so it runs before them.
DEFAULT = [
    # estimate: a few 20,000-iteration loops of client calls at ~20 us each (README), no engine.
    Benchmark("bench.bench_client", ("--iterations", "20000"), 0.5),
    # estimate: 4 engine processes (2.8 min of start-up) + half the evaluation measured at 48
    # records (docs/bench/dtype.json: 52 s float32 + 33 s bfloat16 a round, x 2 rounds / 2).
    Benchmark("bench.bench_dtype", ("--records", "24", "--rounds", "2"), 4.0),
    # estimate: the timed runs took 111 s (docs/bench/batching.json, 656d49e) + engine and server start,
    # + the block sizes 32 and 128 (two more engines, 3 batched runs each: ~1.5 min).
    Benchmark("bench.bench_batching", ("--requests", "64", "--max-tokens", "24", "--server"), 5.5),
    # estimate: 3 engine processes (2.1 min) + ~1.2 min a block size for 5 specs x 2 templates x
    # 4 records x 2 repeats, cold and warm (TTFT 85-840 ms, docs/bench/prefix_cache.md).
    Benchmark("bench.bench_prefix_cache", ("--block-sizes", "32,64,128", "--records", "4", "--repeats", "2"), 6.0),
    # estimate: the 4-minute profile + start-up + fit and cross-validation (make run's own
    # 4.5-minute profile and fit took 4.7, README).
    Benchmark("bench.bench_ttft_model", ("--budget-s", "240"), 6.0),
    # estimate: make run at ed0d6a4 (README): ticket_triage's optimize 2.1 min, distill ~1.3
    # (6.5 for 5 specs), start-up 0.7.
    # estimate: make run at ed0d6a4 (README): optimize 2.1 (ticket_triage) and 2.6 (invoice_extraction)
    # min, distill ~1.3 each, start-up 0.7. Published: bench_load compares them at load.
    Benchmark("bench.bench_optimize", ("ticket_triage", "invoice_extraction", "--budget", "quick", "--publish"), 7.0),
    # estimate: a short load profile (2 specs x 2 templates, 24 requests a cell, 2 rounds) and the
    # two published winners against their baselines at 3 rates x 2 blocks x 40 requests, one server.
    Benchmark("bench.bench_load", ("ticket_triage", "invoice_extraction", "--requests", "40", "--blocks", "2",
                                   "--profile-requests", "24", "--profile-specs", "ticket_triage,invoice_extraction"),
              9.0),
    # measured: 21.7 min for ticket_triage at 100/100/100 in bfloat16 on the slower of two machines
    # (docs/bench/make_bench.md, 45c4204; 13.4 at 57bf86d on a faster one) + start-up.
    Benchmark("bench.bench_peers", ("ticket_triage", "--train", "100", "--dev", "100", "--test", "100"), 22.0),
]

FULL = [
    Benchmark("bench.bench_client", ("--iterations", "20000"), 0.5),  # estimate, as above
    # estimate: 2.8 min of start-up + 2 rounds x (52 + 33) s measured (docs/bench/dtype.json).
    Benchmark("bench.bench_dtype", ("--records", "48", "--rounds", "2"), 5.5),
    Benchmark("bench.bench_batching", ("--requests", "64", "--max-tokens", "24", "--server"), 5.5),  # as above
    # estimate: as above with 6 records.
    Benchmark("bench.bench_prefix_cache", ("--records", "6", "--repeats", "2"), 8.0),
    # estimate: the 7-minute profile + start-up + fit.
    Benchmark("bench.bench_ttft_model", ("--budget-s", "420"), 8.5),
    # estimate: make run at ed0d6a4 (README): the same 5 specs at the quick preset, 0.7 start,
    # 6.5 distill, 50 optimize (docs/bench/optimize.md's 15.9 min was at the older 0.08 margins).
    Benchmark("bench.bench_optimize", ("--budget", "quick", "--publish"), 57.0),
    # estimate: the full load profile (5 specs x 2 templates, 40 requests a cell, 2 rounds) and
    # every published winner at 3 rates x 3 blocks x 60 requests.
    Benchmark("bench.bench_load", (), 45.0),
    # measured: 6.1 min in all, start-up included (docs/bench/reply_reminder.md, 7f05632;
    # summarize's prompts 41-51 s each, the rest 5-24 s).
    Benchmark("bench.bench_reply_reminder", ("--records", "100"), 6.5),
    # Ours (the nightly's quick preset) against MIPROv2 and GEPA (auto="light"), three specs.
    # measured: 142.6 min (docs/bench/peers.md: 32.8 + 44.7 + 65.1 a spec, float32).
    Benchmark("bench.bench_peers", ("--train", "100", "--dev", "100", "--test", "100"), 143.0),
    # The same night's specs over one vLLM endpoint, then two (Dask workers, a Prefect server).
    # estimate: the two sides' timed nights took 3.5 + 9.9 min (docs/bench/endpoints.json,
    # 1d29289) + server starts and the TTFT model fitted in the first night.
    Benchmark("bench.bench_endpoints", ("--budget", "smoke"), 17.0),
]

TAIL_LINES = 40


def run(command: list[str], log_path: Path, *, verbose: bool) -> int:
    """Run one benchmark, its output into ``log_path``; echo its progress lines (all: verbose)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with open(log_path, "w", encoding="utf-8") as log, subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            tail.append(line)
            if verbose:
                print(line, end="", flush=True)
            elif line.startswith(PROGRESS_MARK):
                print("  " + line[len(PROGRESS_MARK):], end="", flush=True)
    if proc.returncode != 0 and not verbose:
        print(f"  --- last {len(tail)} lines of {log_path}", file=sys.stderr)
        print("".join(tail), end="", file=sys.stderr)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run the benchmarks, one at a time.")
    p.add_argument("--full", action="store_true",
                   help="every benchmark at its full budget (make bench-full, about four hours); "
                        "default: the set that fits an hour (make bench)")
    p.add_argument("--verbose", action="store_true", help="show the benchmarks' whole output, not only progress")
    p.add_argument("--only", nargs="+", metavar="MODULE", help="run only these (e.g. bench.bench_client)")
    args = p.parse_args(argv)
    benchmarks = FULL if args.full else DEFAULT
    known = {b.module for b in benchmarks}
    unknown = set(args.only or ()) - known
    if unknown:
        hint = "" if args.full else " (--full runs the whole list)"
        p.error(f"unknown benchmarks {sorted(unknown)}{hint}; known: {', '.join(b.module for b in benchmarks)}")
    chosen = [b for b in benchmarks if not args.only or b.module in args.only]
    print(f"=== {len(chosen)} benchmark(s), about {sum(b.minutes for b in chosen):.0f} minutes estimated "
          f"on an idle 2-core machine", flush=True)
    failed = []
    took: list[tuple[Benchmark, float, int]] = []
    for bench in chosen:
        log_path = REPORT_DIR / "logs" / f"{bench.name}.log"
        print(f"\n=== {bench.module} {' '.join(bench.args)}  (log: {log_path})", flush=True)
        started = time.monotonic()
        code = run([sys.executable, "-m", bench.module, *bench.args], log_path, verbose=args.verbose)
        minutes = (time.monotonic() - started) / 60.0
        took.append((bench, minutes, code))
        if code == 0:
            print(f"=== {bench.name}: done in {minutes:.1f} min; reports in {REPORT_DIR}/", flush=True)
        else:
            print(f"=== {bench.name}: FAILED (exit {code}) after {minutes:.1f} min; see {log_path}", flush=True)
            failed.append(bench.module)
    print(summary(took), flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def summary(took: list[tuple[Benchmark, float, int]]) -> str:
    """Each benchmark's minutes against its estimate, and the total."""
    width = max((len(b.name) for b, _, _ in took), default=0)
    lines = [f"\n=== {sum(m for _, m, _ in took):.1f} minutes in all (estimated {sum(b.minutes for b, _, _ in took):.1f})"]
    for bench, minutes, code in took:
        outcome = "" if code == 0 else f"  FAILED (exit {code})"
        lines.append(f"  {bench.name:<{width}}  {minutes:6.1f} min  (estimated {bench.minutes:.1f}){outcome}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

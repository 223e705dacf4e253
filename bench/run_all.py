"""``make bench``: every benchmark at a budget that fits a 2-core CPU machine.

Each runs in its own process (one engine at a time: they would fight for the core vLLM
binds) and writes its JSON/markdown report into artifacts/bench/. Each script also runs
alone with its own budget flags.

The terminal shows each benchmark's own progress lines (``bench.common.progress``) and
its outcome; everything else it prints (vLLM, DSPy, torch) goes to
``artifacts/bench/logs/<benchmark>.log``, whose tail is shown when a benchmark fails.
``--verbose`` shows everything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from bench.common import PROGRESS_MARK, REPORT_DIR

BENCHMARKS = [
    ["bench.bench_client", "--iterations", "20000"],
    ["bench.bench_dtype", "--records", "48", "--rounds", "2"],
    ["bench.bench_batching", "--requests", "64", "--max-tokens", "24", "--server"],
    ["bench.bench_prefix_cache", "--records", "6", "--repeats", "2"],
    ["bench.bench_ttft_model", "--budget-s", "420"],
    ["bench.bench_optimize", "--budget", "quick"],
    # Ours (the nightly's quick preset) against MIPROv2 and GEPA (auto="light"), three specs.
    ["bench.bench_peers", "--train", "100", "--dev", "100", "--test", "100"],
    # The same night's specs over one vLLM endpoint, then two (Dask workers, a Prefect server).
    ["bench.bench_endpoints", "--budget", "smoke"],
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
    p = argparse.ArgumentParser(description="Run every benchmark, one at a time.")
    p.add_argument("--verbose", action="store_true", help="show the benchmarks' whole output, not only progress")
    p.add_argument("--only", nargs="+", metavar="MODULE", help="run only these (e.g. bench.bench_client)")
    args = p.parse_args(argv)
    chosen = [b for b in BENCHMARKS if not args.only or b[0] in args.only]
    unknown = set(args.only or ()) - {b[0] for b in BENCHMARKS}
    if unknown:
        p.error(f"unknown benchmarks {sorted(unknown)}; known: {', '.join(b[0] for b in BENCHMARKS)}")
    failed = []
    for module, *bench_args in chosen:
        name = module.rsplit(".", 1)[-1]
        log_path = REPORT_DIR / "logs" / f"{name}.log"
        print(f"\n=== {module} {' '.join(bench_args)}  (log: {log_path})", flush=True)
        started = time.monotonic()
        code = run([sys.executable, "-m", module, *bench_args], log_path, verbose=args.verbose)
        minutes = (time.monotonic() - started) / 60.0
        if code == 0:
            print(f"=== {name}: done in {minutes:.1f} min; reports in {REPORT_DIR}/", flush=True)
        else:
            print(f"=== {name}: FAILED (exit {code}) after {minutes:.1f} min; see {log_path}", flush=True)
            failed.append(module)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

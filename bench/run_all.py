"""``make bench``: every benchmark at a budget that fits a 2-core CPU machine.

Each runs in its own process (one engine at a time: they would fight for the core vLLM
binds) and writes its JSON/markdown report into artifacts/bench/. Each script also runs
alone with its own budget flags.
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = [
    ["bench.bench_client", "--iterations", "20000"],
    ["bench.bench_batching", "--requests", "64", "--max-tokens", "24", "--server"],
    ["bench.bench_prefix_cache", "--records", "5"],
    ["bench.bench_ttft_model", "--budget-s", "420"],
    ["bench.bench_optimize", "--budget", "quick"],
    # Ours (the nightly's quick preset) against MIPROv2 and GEPA (auto="light"), three specs.
    ["bench.bench_peers", "--train", "100", "--dev", "100", "--test", "100"],
    # The same night's specs over one vLLM endpoint, then two (Dask workers, a Prefect server).
    ["bench.bench_endpoints", "--budget", "smoke"],
]


def main() -> int:
    failed = []
    for module, *args in BENCHMARKS:
        print(f"\n=== {module} {' '.join(args)}", flush=True)
        if subprocess.run([sys.executable, "-m", module, *args]).returncode != 0:
            failed.append(module)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""What every benchmark records beside its figures (machine, commit, engine identity), and the
helpers they share (progress lines, process defaults, draining Prefect before its server stops)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Sequence

from promptdistill.core.env import apply_defaults
from promptdistill.core.jsonio import atomic_write, write_json
from promptdistill.engine.base import hardware_fingerprint
from promptdistill.pipeline.jobs import select_spec_files

REPORT_DIR = Path(os.environ.get("PROMPTDISTILL_BENCH_DIR", "artifacts/bench"))
PROGRESS_MARK = "» "
"""Starts the lines ``make bench`` shows on the terminal (the rest goes to its log)."""


def progress(message: str) -> None:
    """A line for the person waiting on a benchmark (``make bench`` shows only these)."""
    print(f"{PROGRESS_MARK}{message}", flush=True)


def setup() -> None:
    """The process defaults every benchmark runs with (offline, quiet), before heavy imports."""
    apply_defaults()


def bundled_specs(prompts_dir: str = "prompts") -> list[str]:
    """The names of the specs in ``prompts_dir`` (every one, as the nightly flow runs them)."""
    return [path.stem for path in select_spec_files(prompts_dir)]


def machine() -> dict[str, Any]:
    return {
        "hardware": hardware_fingerprint(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 2) if values else float("nan"),
        "p95": round(percentile(values, 95), 2),
        "n": len(values),
    }


def write_report(name: str, result: dict[str, Any], markdown: str | None = None) -> Path:
    """Stamp ``result`` with machine and commit, print it, and save JSON (+ markdown)."""
    result = {"benchmark": name, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "commit": commit(), "machine": machine(), **result}
    path = write_json(REPORT_DIR / f"{name}.json", result)
    if markdown:
        atomic_write(REPORT_DIR / f"{name}.md", markdown)
    print(json.dumps(result, indent=2, default=str))
    progress(f"report: {path}" + (f" and {path.with_suffix('.md').name}" if markdown else ""))
    return path


def drain_prefect() -> None:
    """Send Prefect's queued logs and events now, while the API server still runs (as
    ``prefect_test_harness`` does): a process that stops its own server first would retry
    the stopped server at exit for minutes."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        for result in (APILogWorker.instance().drain(), EventsWorker.drain_all()):
            if isinstance(result, Awaitable):
                await result

    run_coro_as_sync(drain())

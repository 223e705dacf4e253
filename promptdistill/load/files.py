"""A load run's report files: ``report.json`` (figures, plan, every request) and ``report.md``.

Both are written atomically, and only once the run has ended: an interrupted run leaves
the previous report as it was, never a half-written one.
"""

from __future__ import annotations

from pathlib import Path

from promptdistill.core.jsonio import atomic_write, canonical_json, to_json_value
from promptdistill.load.report import markdown_tables
from promptdistill.load.run import LoadRun

__all__ = ["write_load_report"]


def write_load_report(folder: str | Path, run: LoadRun) -> str:
    """Write the report of ``run`` into ``folder``; returns its markdown."""
    folder = Path(folder)
    body = {**run.to_dict(), "requests": run.rows}
    markdown = (f"# Load: {run.spec}\n\n"
                + (f"Capacity of the first template: {run.capacity_rps:.2f} req/s (closed loop).\n\n"
                   if run.capacity_rps else "")
                + markdown_tables(run.figures)
                + f"\n{run.plan.requests * len(run.templates)} requests in {run.minutes:.1f} minutes; "
                  f"intervals 95%, moving-block bootstrap within blocks; n counts requests after each block's "
                  f"first {run.plan.warmup}.\n")
    atomic_write(folder / "report.json", canonical_json(to_json_value(body)))
    atomic_write(folder / "report.md", markdown)
    return markdown

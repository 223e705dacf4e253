"""The nightly on a busy machine: a CPU-bound process runs for the whole night.

A refresh on a machine busy with other work used to stop at its time budget short of the
prompts the fit needs, and the whole night failed before any spec. Here, with an empty
registry and one core taken by another process, the TTFT profile measures its design
under load until the fit's minimum is met (or the night goes on without a model and says
so per spec), and the spec is decided. The budgets are the ``smoke`` preset's, smaller
still: this checks that the night reaches its decisions, not their quality.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from promptdistill.core.config import EngineConfig
from tests.processes import background

pytestmark = [pytest.mark.engine, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SPEC = "ticket_triage"


@pytest.fixture
def workspace(tmp_path, engine, model_dir, monkeypatch):
    """A private registry (no TTFT model), state folder and copy of the bundled specs; the
    session's engine handed to the flow."""
    from promptdistill.pipeline.session import adopt_engine, forget_engine

    shutil.copytree(REPO / "prompts", tmp_path / "prompts")
    shutil.copytree(REPO / "datasets", tmp_path / "datasets", ignore=shutil.ignore_patterns("generators"))
    monkeypatch.setenv("PROMPTDISTILL_REGISTRY", str(tmp_path / "registry"))
    monkeypatch.setenv("PROMPTDISTILL_STATE_DIR", str(tmp_path / "state"))
    config = EngineConfig(backend="local", model=str(model_dir))
    adopt_engine(engine, config)
    try:
        yield tmp_path
    finally:
        forget_engine(config)


def test_the_nightly_on_a_busy_machine_decides_every_spec_and_states_the_ttft_model(workspace, engine):
    from prefect.testing.utilities import prefect_test_harness

    from promptdistill.flows.nightly import nightly
    from promptdistill.pipeline.budgets import budget_preset
    from promptdistill.pipeline.report import nightly_report_markdown, ttft_model_line
    from promptdistill.registry import Registry

    smoke = budget_preset("smoke")
    with prefect_test_harness(server_startup_timeout=120), \
            background([sys.executable, "-c", "while True: pass"], dict(os.environ), workspace / "hog.log") as hog:
        state = nightly(specs=[SPEC], prompts_dir=str(workspace / "prompts"), preset="smoke",
                        distill_instructions=False,
                        budget=replace(smoke["budget"], max_minutes=1.0, max_lm_calls=80), return_state=True)
        assert hog.poll() is None, "the CPU-bound process ended before the night did"
    outcome = state.result(raise_on_failure=False)
    summary = getattr(outcome, "summary", outcome)  # a failed spec ends the run Failed, with its summary
    assert isinstance(summary, dict) and "rows" in summary, f"{state.name}: the night ended whole: {outcome}"

    (row,) = summary["rows"]
    ttft = summary["ttft"]
    # Every spec decided, or stopped with a reason of its own.
    assert row["template"] == SPEC
    assert row["status"] in ("optimized", "baseline kept") or (row["status"] == "failed" and row["error"]), row
    # The TTFT model's state is stated; an empty registry leaves a new model or none.
    assert ttft["state"] in ("refreshed", "none"), ttft
    assert ttft_model_line(ttft) in nightly_report_markdown(summary["rows"], ttft=ttft)
    if ttft["state"] == "none":
        assert row["status"] == "failed" and row["error"] == ttft["reason"] and "fit needs" in ttft["reason"]
        return
    assert row["status"] != "failed", row
    # The profile ran under load: measurements were contended, and still the fit's minimum was met.
    measurements = Registry(workspace / "registry").read_run_log(summary["run_id"], part="ttft-measurements")
    assert measurements["contended"].any(), "the CPU-bound process never showed as contention"
    usable = measurements[measurements["error"].isna() & (measurements["ttft_ms"] > 0)]
    assert usable["prompt_id"].nunique() >= 10

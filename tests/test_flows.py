"""The nightly flow end to end on the real engine under ``prefect_test_harness``.

First night (empty registry): the TTFT model is profiled and fitted, one spec is distilled,
optimized, verified and published, artifacts and run logs are written. Second night: the
model is fresh, the spec's work comes from the cache (no new version), and a broken spec
added meanwhile fails alone: the run ends Failed and its summary lists it.

The budgets are the ``smoke`` preset made smaller still: this checks the plumbing on the
real engine, not the quality of the figures.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from promptdistill.core.config import EngineConfig

pytestmark = [pytest.mark.engine, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SPEC = "ticket_triage"


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, engine, model_dir):
    """A private registry, state folder and copy of the bundled specs; the session's engine
    handed to the flows (they reuse it instead of loading a second vLLM)."""
    import os

    from promptdistill.pipeline.session import adopt_engine, forget_engine

    root = tmp_path_factory.mktemp("nightly")
    shutil.copytree(REPO / "prompts", root / "prompts")
    shutil.copytree(REPO / "datasets", root / "datasets", ignore=shutil.ignore_patterns("generators"))
    saved = {k: os.environ.get(k) for k in ("PROMPTDISTILL_REGISTRY", "PROMPTDISTILL_STATE_DIR")}
    os.environ["PROMPTDISTILL_REGISTRY"] = str(root / "registry")
    os.environ["PROMPTDISTILL_STATE_DIR"] = str(root / "state")
    config = EngineConfig(backend="local", model=str(model_dir))
    adopt_engine(engine, config)
    try:
        yield root
    finally:
        forget_engine(config)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _params(root: Path, specs: list[str]) -> dict:
    from promptdistill.pipeline.budgets import budget_preset

    smoke = budget_preset("smoke")
    return dict(
        specs=specs,
        prompts_dir=str(root / "prompts"),
        # `minutes` is a cap: an idle machine measures the whole design (~30 requests) in
        # about a minute; a shared, busy one needs longer to reach the 10 prompts a fit
        # needs, and keeps rows measured under contention.
        ttft_budget=replace(smoke["ttft_budget"], points=10, max_minutes=12.0, keep_contended=True),
        distill=replace(smoke["distill"], max_minutes=1.0, max_lm_calls=40),
        budget=replace(smoke["budget"], max_minutes=1.0, max_lm_calls=80),
        selection=smoke["selection"],
    )


def _artifacts() -> dict[str, object]:
    """The latest data of every keyed Prefect artifact."""
    from prefect.client.orchestration import get_client

    latest: dict[str, object] = {}
    with get_client(sync_client=True) as client:
        for a in client.read_artifacts(sort="CREATED_DESC"):
            if a.key:
                latest.setdefault(a.key, a.data)
    return latest


@pytest.fixture(scope="module")
def first_night(harness, workspace):
    from promptdistill.flows.nightly import nightly

    state = nightly(**_params(workspace, [SPEC]), return_state=True)
    return state, state.result(raise_on_failure=False)


def test_first_night_publishes_and_reports(first_night, workspace, engine):
    from promptdistill.client import Templates
    from promptdistill.pipeline.ttft_models import TTFT_ARTIFACT_KIND
    from promptdistill.pipeline.report import artifact_key
    from promptdistill.registry import Registry

    state, summary = first_night
    assert state.is_completed(), f"{state.name}: {state.message}: {summary}"
    (row,) = summary["rows"]
    assert row["template"] == SPEC and row["status"] in ("optimized", "baseline kept") and not row["cached"]
    assert row["tokens_before"] > 0 and row["lm_calls"] > 0 and row["quality_before"] is not None
    assert summary["ttft"]["refreshed"], summary["ttft"]

    registry = Registry(workspace / "registry")
    assert registry.versions(SPEC) == [row["version"]]
    labels = registry.labels(SPEC)
    assert labels["candidate"] == row["version"]
    # First night: production is set either way (a passing gate, or the verified baseline).
    assert labels["production"] == row["version"]
    template = Templates(workspace / "registry").get(f"{SPEC}@production")
    assert template.render({"ticket": "I was charged twice for my order"})

    engine_key = engine.identity.key()
    assert registry.artifact_names(TTFT_ARTIFACT_KIND) == [engine_key]
    parts = {p.stem for p in (workspace / "registry" / "runs" / summary["run_id"]).glob("*.parquet")}
    assert {f"{SPEC}-candidates", f"{SPEC}-summary", "summary", "ttft-measurements"} <= parts
    log = registry.read_run_log(summary["run_id"], part=f"{SPEC}-candidates")
    assert len(log) >= 1 and {"screen_quality", "verdict", "diff_lower"} <= set(log.columns)
    # Prefect persisted the stages' results as JSON, never as pickles.
    results = list((workspace / "state" / "prefect-results").glob("*"))
    assert results and all(p.read_bytes().lstrip().startswith(b"{") for p in results if p.is_file())

    artifacts = _artifacts()
    assert {"nightly-summary", "nightly-report", artifact_key(SPEC, "candidates"), artifact_key(SPEC, "report"),
            artifact_key("ttft-model", engine_key, "report"), artifact_key("ttft-model", engine_key, "scores")} <= set(artifacts)
    report = artifacts[artifact_key(SPEC, "report")]
    assert "| prompt tokens |" in report and "## Pareto front" in report and "## TTFT model: predicted vs measured" in report
    assert report.count("data:image/png;base64,") == 2
    assert SPEC in str(artifacts["nightly-summary"])


def test_second_night_hits_the_cache_and_a_broken_spec_fails_alone(first_night, workspace):
    from promptdistill.flows.nightly import nightly
    from promptdistill.pipeline.jobs import SpecsFailedError
    from promptdistill.registry import Registry

    _, first = first_night
    version = first["rows"][0]["version"]
    broken = (workspace / "prompts" / f"{SPEC}.yaml").read_text().replace("user: \"Ticket: {ticket}\"",
                                                                          "user: \"Ticket: {tiket}\"")
    assert "{tiket}" in broken
    (workspace / "prompts" / "broken.yaml").write_text(broken.replace(f"name: {SPEC}", "name: broken"))

    state = nightly(**_params(workspace, [SPEC, "broken"]), return_state=True)
    outcome = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(outcome, SpecsFailedError), f"{state.name}: {outcome}"
    assert "1 of 2 specs failed: broken" in str(outcome)
    rows = {r["template"]: r for r in outcome.summary["rows"]}
    assert rows[SPEC]["cached"] is True and rows[SPEC]["version"] == version
    assert rows["broken"]["status"] == "failed" and "broken.yaml" in rows["broken"]["error"]
    assert outcome.summary["ttft"]["refreshed"] is False
    assert Registry(workspace / "registry").versions(SPEC) == [version]  # nothing published twice

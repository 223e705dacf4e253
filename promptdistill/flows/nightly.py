"""The ``nightly`` flow: refresh the TTFT model if stale, optimize every spec, publish, report.

The outline (each step a task run in the Prefect UI):

1. start the engine once for the run (or reuse the process's);
2. TTFT model: refresh it when there is none for this engine identity or it is older
   than ``ttft_max_age_hours`` (``pipeline.ttft_models.ttft_status``); when the refresh
   fails, go on with the last model for this engine (``stale``), or without one let each
   spec stop with the reason (the night never fails whole before its specs);
3. per spec (one at a time on an in-process engine; side by side with ``parallel=True``
   on the flow's task runner, or with ``dask=...`` on Dask worker processes, a
   ``nightly-specs`` subflow): prepare (validate, hash), distill and optimize (each cached
   on its work key), publish (``candidate``; ``production`` when the gate passed and
   ``allow_promotion``), record (artifacts, run logs); on the server backend each
   endpoint's share of the work is recorded (``result["endpoints"]``);
4. the night's report: a summary table across specs and the versions published, and the
   HTML night report beside the run logs (``result["report"]``).

A failing spec fails its own tasks and shows up as ``failed`` in the summary; the others
go on. The run ends Failed when any spec failed, after the report is written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from promptdistill.distill.loop import DistillConfig
from promptdistill.flows.dask_runner import dask_task_runner
from promptdistill.flows.tasks import ensure_ttft_model, report_night, run_spec, spec_arguments, start_run
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule
from promptdistill.pipeline.budgets import TTFTBudget, stage_settings
from promptdistill.pipeline.presets import DEFAULT_PRESET
from promptdistill.pipeline.events import step_events
from promptdistill.pipeline.jobs import SpecsFailedError, dask_worker_count, parallel_specs, select_spec_files
from promptdistill.pipeline.report import endpoint_load_rows, format_summary_table
from promptdistill.pipeline.session import engine_session
from promptdistill.pipeline.ttft_models import TTFTFreshness

run_spec_task = task(run_spec, name="spec", cache_policy=NO_CACHE)
"""One spec's chain as a task of its own: what ``parallel=True`` submits to the task runner."""


@flow(name="nightly-specs")
def run_specs(paths: list[str], common: dict[str, Any]) -> list[dict[str, Any]]:
    """Every spec submitted at once to this flow's task runner (the nightly gives this
    subflow a Dask runner when asked: a flow's runner is fixed when it starts)."""
    futures = [run_spec_task.with_options(task_run_name=f"spec-{Path(p).stem}").submit(p, **common) for p in paths]
    return [f.result() for f in futures]


@flow(name="nightly")
def nightly(
    specs: list[str] | None = None,
    preset: str = DEFAULT_PRESET,
    budget: OptimizeBudget | None = None,
    selection: SelectionRule | None = None,
    distill: DistillConfig | None = None,
    ttft_budget: TTFTBudget | None = None,
    distill_instructions: bool = True,
    ttft_max_age_hours: float = TTFTFreshness.max_age_hours,
    allow_promotion: bool = True,
    seed: int = 0,
    prompts_dir: str = "prompts",
    parallel: bool = False,
    dask: str | None = None,
    dask_workers: int | None = None,
) -> Any:
    """Optimize every spec (or the ones named) and publish the results.

    Args:
        specs: spec names (file stems in ``prompts_dir``); None: every spec.
        preset: the stages' settings (``pipeline.budgets.stage_settings``: smoke, quick,
            full); each of the four settings below replaces the preset's when given.
        budget: one spec's optimization budget (part of the cache key).
        selection: how the optimizer picks the winner (part of the cache key).
        distill: the distiller's settings (its seed is the run's).
        ttft_budget: how much to measure when the TTFT model is refreshed.
        distill_instructions: False optimizes the instruction as written, without
            distilled variants.
        ttft_max_age_hours: refresh a TTFT model older than this.
        allow_promotion: move ``production`` to a result whose gate passed.
        seed: the optimizer's seed (part of the cache key).
        prompts_dir: where the specs live.
        parallel: submit specs to the flow's task runner at once (server backend only:
            the engine's global concurrency limit still bounds how many run together).
        dask: run the specs on Dask: ``"local"`` starts a cluster of worker processes on
            this machine for the run, ``"tcp://host:8786"`` uses a running scheduler (its
            workers need this project's config and the Prefect API URL). Needs the
            ``dask`` extra and a Prefect server (``PREFECT_API_URL``) the workers reach.
        dask_workers: local Dask workers; None: one per endpoint (each endpoint serves one
            spec at a time, so more only wait for a slot).

    Returns:
        ``{"run_id", "rows", "ttft", "report", "failed", "endpoints", "specs_s"}``
        (``report``: the night report's path; ``endpoints``: each server's requests, tokens
        and share during the specs, empty for the in-process engine; ``specs_s``: the specs'
        wall time, TTFT refresh and report excluded); the run is Failed if any spec failed.
    """
    logger = get_run_logger()
    settings, run_id = start_run()
    stages = stage_settings(preset, budget=budget, selection=selection, distill=distill, ttft_budget=ttft_budget,
                            distill_instructions=distill_instructions)
    paths = select_spec_files(prompts_dir, specs)
    with engine_session(settings.engine) as engine:
        ttft = ensure_ttft_model(settings.engine, engine, registry_root=settings.registry, max_age_hours=ttft_max_age_hours,
                                 budget=stages["ttft_budget"], prompts_dir=prompts_dir, seed=seed, run_id=run_id)
        common = spec_arguments(settings, engine, stages, ttft, seed=seed, allow_promotion=allow_promotion, run_id=run_id)
        load_before, started = _endpoint_load(engine), time.monotonic()
        if dask:
            # The specs' progress events stay in the Dask worker processes: the CLI's display does not see them.
            workers = dask_worker_count(dask_workers, settings.engine.server_urls)
            logger.info("running %d specs on Dask (%s, %d workers)", len(paths), dask, workers)
            runner = dask_task_runner(dask, workers)
            rows = run_specs.with_options(task_runner=runner)([str(p) for p in paths], common)
        else:
            parallel, refused = parallel_specs(parallel, settings.engine.backend)
            if refused:
                logger.warning(refused)
            if parallel:
                rows = run_specs([str(p) for p in paths], common)
            else:
                rows = [run_spec(str(p), **common) for p in paths]
        specs_s = time.monotonic() - started
        endpoints = _record_endpoint_load(engine, load_before, specs_s)
    with step_events("report"):
        report = report_night(rows, ttft, settings.registry, run_id)
    logger.info("summary:\n%s", format_summary_table(rows))
    result = {"run_id": run_id, "rows": rows, "ttft": ttft, "report": report["report"],
              "failed": [r["template"] for r in rows if r["status"] == "failed"], "endpoints": endpoints,
              "specs_s": round(specs_s, 1)}
    if result["failed"]:
        raise SpecsFailedError(f"{len(result['failed'])} of {len(rows)} specs failed: {', '.join(result['failed'])}", result)
    return result


def _endpoint_load(engine: Any) -> dict[str, Any] | None:
    """The servers' counters now (None for an engine without endpoints)."""
    return engine.endpoint_load() if hasattr(engine, "endpoint_load") else None


def _record_endpoint_load(engine: Any, before: dict[str, Any] | None, seconds: float) -> list[dict[str, Any]]:
    """Each endpoint's share of the specs' work: logged, and a table artifact."""
    if before is None:
        return []
    rows = endpoint_load_rows(before, engine.endpoint_load(), seconds)
    for row in rows:
        get_run_logger().info("endpoint %s: %s requests (%s of the night's), %s prompt tokens", row["endpoint"],
                              row["requests"], "?" if row["share"] is None else f"{row['share']:.0%}",
                              row["prompt_tokens"])
    create_table_artifact(table=rows, key="nightly-endpoints",
                          description="Nightly: each vLLM endpoint's requests and tokens while the specs ran")
    return rows


if __name__ == "__main__":
    nightly()

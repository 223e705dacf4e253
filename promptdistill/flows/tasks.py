"""The Prefect tasks the three flows share: decorators around :mod:`promptdistill.pipeline` calls.

Engine-bound tasks never receive the engine object: they get the (frozen, small)
``EngineConfig`` and take the process's engine from
:func:`promptdistill.pipeline.session.shared_engine`, so Prefect never hashes or
serializes it, and each process (the flow's, or a distributed runner's worker) has
exactly one. They hold a slot of the engine's global concurrency limit while they use
it, so flow runs sharing an engine take turns.

Caching: ``distill-spec`` and ``optimize-spec`` are cached on
:func:`promptdistill.pipeline.jobs.distill_key` and :func:`~promptdistill.pipeline.jobs.optimize_key`
(spec hash, dataset hash, engine identity, budget, seed, judge engine, the judge
definitions' content, and for the optimizer the TTFT model version). Their results are plain
JSON (the stage's summary and the folder of its files), persisted with Prefect's JSON
serializer under ``<state_dir>/prefect-results``: nothing there is unpickled, and a
rerun after a crash skips finished work. Under that, every LM request goes through the
LM result cache (``<state_dir>/lm_cache.sqlite``), so even a half-finished stage replays
for free. Publishing is idempotent on the same key: a rerun never adds a duplicate version.

Progress: each step of a run (the TTFT model, a spec's distill and optimize steps; the
report is the flow's) emits its events (:mod:`promptdistill.pipeline.events`) when it
starts and ends, for the CLI's progress display.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run
from prefect.tasks import exponential_backoff

from promptdistill.core.config import EngineConfig, Settings, load_settings
from promptdistill.core.env import apply_defaults
from promptdistill.core.errors import EngineTimeoutError, EngineUnavailableError
from promptdistill.core.jsonio import json_records
from promptdistill.distill.loop import DistillConfig
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule
from promptdistill.pipeline import events, stages
from promptdistill.pipeline.budgets import TTFTBudget, task_timeout_s
from promptdistill.pipeline.jobs import SpecJob, SpecOutcome, distill_key, optimize_key, prepare_job, run_id_for
from promptdistill.pipeline.night_report import REPORT_PART, prompt_rows, write_night_report
from promptdistill.pipeline.publish import promote_and_publish
from promptdistill.pipeline.report import (
    artifact_key,
    nightly_report_markdown,
    spec_report_markdown,
    summary_frame,
    ttft_report_markdown,
    ttft_score_rows,
)
from promptdistill.pipeline.session import engine_limit, shared_engine
from promptdistill.pipeline.ttft_models import (
    TTFTStatus,
    fit_and_publish,
    keep_ttft_model_fresh,
    load_ttft_model,
    ttft_figure,
)
from promptdistill.registry.store import Registry
from promptdistill.ttft.profile import run_profile

ENGINE_SLOT_WAIT_S = 6 * 3600.0
"""Longest a task waits for its engine's concurrency slot before failing."""
ENGINE_SLOT_LEASE_S = 60.0
"""A held slot's lease, renewed while its task runs: a worker that dies holding one frees
it this long after (Prefect's default, 300 s, would stall the retried spec that long)."""


def transient_engine_error(task: Any, task_run: Any, state: Any) -> bool:
    """Retry only what can heal by itself: an unreachable server or a timed-out batch."""
    try:
        state.result()
    except (EngineUnavailableError, EngineTimeoutError):
        return True
    except Exception:  # noqa: BLE001 - anything else is a real failure: don't retry
        return False
    return False


ENGINE_RETRIES: dict[str, Any] = dict(
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=15),
    retry_jitter_factor=0.5,
    retry_condition_fn=transient_engine_error,
)
CACHED: dict[str, Any] = dict(cache_key_fn=lambda context, parameters: parameters["key"], persist_result=True,
                              result_serializer="json")
"""Cached on the ``key`` parameter, results as JSON; ``persisted()`` adds the storage when called."""


def start_run() -> tuple[Settings, str]:
    """How every flow run starts: the process defaults applied, the settings, the run's registry id."""
    apply_defaults()
    return load_settings(), run_id_for(flow_run.get_id())


def state_dir() -> Path:
    """The project's state folder (read from the settings at call time, as an absolute path)."""
    return Path(load_settings().state_dir).resolve()


def judge_engine() -> Any:
    """The ``[judge]`` engine when the config has one (shared like the task engine), else None."""
    judge = load_settings().judge
    return shared_engine(judge) if judge is not None else None


def persisted(task_: Any, **options: Any) -> Any:
    """``task_`` with its results persisted under ``<state_dir>/prefect-results`` (the cache
    that makes a rerun resume) and the given run options."""
    return task_.with_options(result_storage=state_dir() / "prefect-results", **options)


def engine_slot(config: EngineConfig, engine: Any) -> Any:
    """Hold one slot of the engine's global concurrency limit (created on first use; an
    operator's change to its size is kept)."""
    name, slots = engine_limit(config, engine.identity)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots))
            except ObjectAlreadyExists:
                pass
    get_run_logger().info("taking a slot of concurrency limit %r (%d slots)", name, slots)
    return concurrency(name, occupy=1, timeout_seconds=ENGINE_SLOT_WAIT_S, lease_duration=ENGINE_SLOT_LEASE_S, strict=True,
                       raise_on_lease_renewal_failure=False)


# ------------------------------------------------------------------ TTFT model
@task(name="measure-ttft", cache_policy=NO_CACHE, **ENGINE_RETRIES)
def measure_ttft(engine_config: EngineConfig, budget: TTFTBudget, prompts_dir: str, seed: int, out_dir: str) -> str:
    """Profile the engine; returns the measurements' Parquet path.

    Raises:
        RuntimeError: the profile stopped short of the prompts the fit needs; the message
            has its figures (how many rows, how many contended, how many prompts).
    """
    engine = shared_engine(engine_config)
    with engine_slot(engine_config, engine):
        result = run_profile(engine, budget.profile_config(prompts_dir=prompts_dir, seed=seed), out=out_dir, progress=False)
    if not result.minimum_met or result.path is None:
        raise RuntimeError(result.note)
    logger = get_run_logger()
    (logger.info if result.stopped == "complete" else logger.warning)("%s -> %s", result.note, result.path)
    return str(result.path)


@task(name="fit-ttft-model", cache_policy=NO_CACHE)
def fit_and_publish_ttft(measurements: str, registry_root: str, run_id: str, seed: int, report_dir: str,
                         keep_contended: bool = False) -> dict[str, Any]:
    """Fit and select the TTFT model, publish it, report it (table + markdown artifacts)."""
    registry = Registry(registry_root)
    frame = pd.read_parquet(measurements)
    info, model, fit, record = fit_and_publish(registry, frame, seed=seed, source=measurements, report_dir=report_dir,
                                               keep_contended=keep_contended, extra={"run_id": run_id})
    logger = get_run_logger()
    for problem in ("contended_rows_kept", "report_error"):
        if info.get(problem):
            logger.warning("TTFT fit: %s", info[problem])
    registry.put_run_log(run_id, frame, part="ttft-measurements")
    key = info["engine_key"]
    create_table_artifact(table=ttft_score_rows(fit), key=artifact_key("ttft-model", key, "scores"),
                          description=f"TTFT model candidates on engine {key}: cross-validated and held-out scores")
    create_markdown_artifact(
        markdown=ttft_report_markdown(model, fit, record, info["figures"])
        + (f"\n\nFull report: `{info['report']}`" if info.get("report") else ""),
        key=artifact_key("ttft-model", key, "report"), description=f"TTFT model {record.version} for engine {key}",
    )
    return {**info, "refreshed": True}


def ensure_ttft_model(engine_config: EngineConfig, engine: Any, *, registry_root: str, max_age_hours: float | None,
                      budget: TTFTBudget, prompts_dir: str, seed: int, run_id: str) -> dict[str, Any]:
    """The run's TTFT model (:func:`~promptdistill.pipeline.ttft_models.keep_ttft_model_fresh`),
    refreshed by the measure and fit tasks when stale; returns the model's status."""

    def refresh(status: TTFTStatus) -> str | None:
        events.emit("ttft", events.RUNNING)
        state = measure_ttft(engine_config, budget, prompts_dir, seed, str(state_dir() / "ttft" / "measurements"),
                             return_state=True)
        if state.is_completed():
            state = fit_and_publish_ttft(state.result(), registry_root, run_id, seed,
                                         str(state_dir() / "ttft" / "reports"), budget.keep_contended, return_state=True)
        if state.is_completed():
            events.emit("ttft", events.DONE)
            return None
        error = _error(state)
        events.emit("ttft", events.FAILED, error=error)
        return error

    return keep_ttft_model_fresh(Registry(registry_root), engine.identity, max_age_hours=max_age_hours, refresh=refresh,
                                 logger=get_run_logger())


# -------------------------------------------------------------------- one spec
@task(name="prepare-spec", cache_policy=NO_CACHE)
def prepare_spec(path: str) -> SpecJob:
    """Load and validate the spec, hash its dataset (a broken spec fails here, alone)."""
    return prepare_job(path)


@task(name="distill-spec", **CACHED, **ENGINE_RETRIES)
def distill_spec(engine_config: EngineConfig, job: SpecJob, config: DistillConfig, seed: int, key: str) -> dict[str, Any]:
    """Distill the spec's instruction. Cached on ``key``."""
    engine = shared_engine(engine_config)
    with engine_slot(engine_config, engine):
        return stages.distill_stage(engine, job, config=config, seed=seed, out_dir=stages.stage_dir(state_dir(), "distill", key),
                                    cache_path=stages.lm_cache_path(state_dir()), judge_engine=judge_engine())


@task(name="optimize-spec", **CACHED, **ENGINE_RETRIES)
def optimize_spec(engine_config: EngineConfig, job: SpecJob, budget: OptimizeBudget, selection: SelectionRule,
                  seed: int, distilled: dict[str, Any] | None, registry_root: str, key: str) -> dict[str, Any]:
    """Optimize one spec on the engine. Cached on ``key``."""
    engine = shared_engine(engine_config)
    ttft_model = load_ttft_model(Registry(registry_root), engine.identity)
    with engine_slot(engine_config, engine):
        return stages.optimize_stage(engine, job, ttft_model=ttft_model, budget=budget, selection=selection, seed=seed,
                                     distilled=distilled, out_dir=stages.stage_dir(state_dir(), "optimize", key),
                                     cache_path=stages.lm_cache_path(state_dir()), judge_engine=judge_engine(),
                                     registry=Registry(registry_root))


@task(name="publish-template", cache_policy=NO_CACHE)
def publish_template(result: dict[str, Any], key: str, registry_root: str, allow_promotion: bool) -> dict[str, Any]:
    """Publish as ``candidate`` (and ``production`` when the rule says so). Idempotent on ``key``."""
    record, created, decision = promote_and_publish(Registry(registry_root), result, run_key=key,
                                                    allow_promotion=allow_promotion)
    get_run_logger().info("%s %s:%d labels %s (%s)", "published" if created else "already published", record.name,
                          record.version, ",".join(decision.labels), decision.reason)
    return {"version": record.version, "labels": list(decision.labels), "promotion": decision.reason, "created": created}


@task(name="record-spec", cache_policy=NO_CACHE)
def record_spec(result: dict[str, Any], row: dict[str, Any], registry_root: str, run_id: str) -> None:
    """Artifacts (candidates table, baseline-vs-winner report) and run logs for one spec."""
    registry = Registry(registry_root)
    name, folder = row["template"], result["folder"]
    table = stages.candidate_table(folder, result["ttft_kind"])
    log_url = registry.put_run_log(run_id, pd.read_parquet(Path(folder) / "candidates.parquet"),
                                   part=f"{name}-candidates")
    registry.put_run_log(run_id, summary_frame([row]), part=f"{name}-summary")
    create_table_artifact(table=table.to_dict("records"), key=artifact_key(name, "candidates"),
                          description=f"{name}: every candidate, the Pareto front (quality vs predicted TTFT) first")
    plots = stages.result_plots(folder)
    ttft = result["provenance"].get("ttft_model", {})
    if ttft.get("engine_key") and ttft.get("version"):
        plots["TTFT model: predicted vs measured (held-out prompts)"] = ttft_figure(
            registry, ttft["engine_key"], ttft["version"], folder)
    create_markdown_artifact(markdown=spec_report_markdown(row, kind=result["ttft_kind"], plots=plots,
                                                           links={"candidate log": log_url}),
                             key=artifact_key(name, "report"), description=f"{name}: baseline vs winner")


class SpecSteps:
    """A spec's steps on the run's progress display: ``distill`` (when there is one) then
    ``optimize``, which includes publishing and recording; preparing the spec belongs to
    its first step. Events only: the row's rules are :class:`SpecOutcome`'s.

    In a Dask worker process the events stay in that process: the CLI's display does not see them.
    """

    def __init__(self, spec: str) -> None:
        self.spec = spec
        """The spec's file stem, as the run's plan names it."""
        self.stage: str | None = None

    def begin(self, stage: str) -> None:
        self.stage = stage
        events.emit(stage, events.RUNNING, spec=self.spec)

    def end(self, state: str, **info: Any) -> None:
        """The running step ended (nothing when none runs)."""
        if self.stage is not None:
            events.emit(self.stage, state, spec=self.spec, **info)

    def failed(self, row: dict[str, Any]) -> dict[str, Any]:
        """The running step failed with the spec's failure ``row``; returns the row."""
        self.end(events.FAILED, error=row["error"])
        return row


def spec_arguments(settings: Settings, engine: Any, stages: dict[str, Any], ttft: dict[str, Any],
                   **run: Any) -> dict[str, Any]:
    """:func:`run_spec`'s arguments but the spec's path (the same for every spec of a run):
    the stages' settings, the engine, the TTFT model the run uses, and ``run`` (seed, run id...)."""
    return dict(engine_config=settings.engine, engine_key=engine.identity.key(), budget=stages["budget"],
                selection=stages["selection"], distill=stages["distill"], ttft_version=ttft.get("model_version"),
                no_ttft_model=ttft["reason"] if ttft.get("state") == "none" else None,
                registry_root=settings.registry, **run)


def run_spec(path: str, **kwargs: Any) -> dict[str, Any]:
    """One spec end to end (prepare, distill, optimize, publish, record) as task runs.

    Never raises: a failure fails its own task and comes back as a ``failed`` summary row
    (an error between tasks, too), so the other specs go on.
    """
    steps = SpecSteps(Path(path).stem)
    try:
        return _run_spec(path, steps, **kwargs)
    except Exception as e:  # noqa: BLE001 - one spec must not stop the night
        get_run_logger().exception("%s: failed between tasks", Path(path).stem)
        return steps.failed(SpecOutcome(Path(path).stem).failed(f"{type(e).__name__}: {e}"))


def _run_spec(path: str, steps: SpecSteps, *, engine_config: EngineConfig, engine_key: str, budget: OptimizeBudget,
              selection: SelectionRule, distill: DistillConfig | None, seed: int, ttft_version: str | None,
              no_ttft_model: str | None, registry_root: str, allow_promotion: bool, run_id: str) -> dict[str, Any]:
    """The chain's tasks; what each did goes to the spec's :class:`SpecOutcome`, which makes
    its row, and to its :class:`SpecSteps`, which tell the progress display. Without a TTFT
    model (``no_ttft_model``: why) the spec stops before any work, with that reason."""
    stem = Path(path).stem
    steps.begin("distill" if distill is not None else "optimize")
    if no_ttft_model is not None:
        return steps.failed(SpecOutcome(stem).failed(no_ttft_model))
    state = prepare_spec.with_options(task_run_name=f"prepare-{stem}")(path, return_state=True)
    if not state.is_completed():
        return steps.failed(SpecOutcome(stem).failed(_error(state)))
    job = state.result()
    outcome, distilled, settings = SpecOutcome(job.name), None, load_settings()
    if distill is not None:
        outcome.stage(distill_key(job, engine_key=engine_key, seed=seed, distill=distill, settings=settings))
        state = persisted(distill_spec, task_run_name=f"distill-{job.name}",
                          timeout_seconds=task_timeout_s(distill.max_minutes))(
            engine_config, job, distill, seed, outcome.run_key, return_state=True)
        if not state.is_completed():
            return steps.failed(outcome.failed(_error(state)))
        distilled, cached = state.result(), state.name == "Cached"
        outcome.stage_done(cached=cached)
        steps.end(events.CACHED if cached else events.DONE)
        steps.begin("optimize")
    key = optimize_key(job, engine_key=engine_key, seed=seed, budget=budget, selection=selection, distill=distill,
                       ttft_model=ttft_version, settings=settings)
    outcome.stage(key)
    state = persisted(optimize_spec, task_run_name=f"optimize-{job.name}",
                      timeout_seconds=task_timeout_s(budget.max_minutes))(
        engine_config, job, budget, selection, seed, distilled, registry_root, key, return_state=True)
    if not state.is_completed():
        return steps.failed(outcome.failed(_error(state)))
    result, cached = state.result(), state.name == "Cached"
    outcome.stage_done(cached=cached)
    figures = stages.result_figures(result)
    state = publish_template.with_options(task_run_name=f"publish-{job.name}")(
        result, key, registry_root, allow_promotion, return_state=True)
    if not state.is_completed():
        return steps.failed(outcome.publish_failed(_error(state)))
    row = outcome.published(result, figures, state.result())
    state = record_spec.with_options(task_run_name=f"record-{job.name}")(result, row, registry_root, run_id,
                                                                        return_state=True)
    if not state.is_completed():
        return steps.failed(outcome.reporting_failed(row, _error(state)))
    steps.end(events.CACHED if cached else events.DONE)
    return row


@task(name="report-night", cache_policy=NO_CACHE)
def report_night(rows: list[dict[str, Any]], ttft: dict[str, Any], registry_root: str, run_id: str) -> dict[str, Any]:
    """The night's summary table, its run logs and report artifacts, and the HTML night report.

    Returns:
        ``{"summary": <summary run log URL>, "report": <night report path, or None when it failed>}``;
        a report that fails to build is a warning, not a failed night.
    """
    registry = Registry(registry_root)
    frame = summary_frame(rows)
    url = registry.put_run_log(run_id, frame, part="summary")
    create_table_artifact(table=json_records(frame), key="nightly-summary",
                          description="Nightly: one row per spec (tokens, TTFT, quality before and after; published version)")
    report = None
    try:
        registry.put_run_log(run_id, prompt_rows(rows, state_dir=state_dir(), ttft=ttft), part=REPORT_PART)
        report = write_night_report(registry, run_id, state_dir=state_dir())
    except Exception as e:  # noqa: BLE001 - the night's work is done and published: a report problem must not fail it
        get_run_logger().warning("the night report could not be built: %s: %s", type(e).__name__, e, exc_info=True)
    markdown = nightly_report_markdown(rows, ttft=ttft, run_id=run_id, registry_root=registry_root)
    if report:
        link = Path(report).as_uri() if Path(report).is_absolute() else report
        markdown += f"\n\n**Night report** (one HTML page, opens offline): [{report}]({link})"
    create_markdown_artifact(markdown=markdown, key="nightly-report",
                             description="Nightly: summary across specs and registry versions published")
    return {"summary": url, "report": report}


def _error(state: Any) -> str:
    """The exception behind a failed task state as ``TypeName: message``."""
    exc = state.result(raise_on_failure=False)
    if isinstance(exc, BaseException):
        return f"{type(exc).__name__}: {exc}"
    return state.message or state.name

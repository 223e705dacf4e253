"""The stages a pipeline run calls, and what the flows read from their outputs (no Prefect).

Each stage writes its full output to a folder (Parquet tables, ``result.json``, plots)
and returns plain JSON: what Prefect persists and caches (never a pickled object), and
all a later task needs. The flows never reach into a stage's internals.

* :func:`run_distill`, :func:`run_optimize`: one stage on one spec, behind the LM result
  cache, its files written: the one way a stage runs (the flows' tasks below and the
  ``distill``/``optimize`` commands, which print the result object);
* :func:`distill_stage`: the distiller on one spec; its finalists feed the optimizer;
* :func:`optimize_stage`: the optimizer on one spec, with the distiller's finalists;
* :func:`result_figures`, :func:`candidate_table`, :func:`result_plots`: what the
  summary row, the table artifact and the report show.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import pandas as pd

from promptdistill.core.errors import ConfigError, TemplateNotFoundError
from promptdistill.core.jsonio import json_records, json_safe
from promptdistill.distill.loop import DistillConfig, distill
from promptdistill.distill.result import DistillResult
from promptdistill.engine.base import Engine
from promptdistill.engine.cache import CachedEngine
from promptdistill.optimize.optimizer import optimize
from promptdistill.optimize.result import OptimizationResult
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule
from promptdistill.optimize.variants import variants_from_parquet
from promptdistill.pipeline.jobs import SpecJob
from promptdistill.pipeline.publish import gate
from promptdistill.search.selection import SelectionRecord
from promptdistill.specs.load import load_spec
from promptdistill.specs.model import Spec
from promptdistill.ttft.model import TTFTModel

__all__ = ["cached", "candidate_table", "distill_stage", "lm_cache_path", "optimize_stage", "result_figures", "result_plots",
           "run_distill", "run_optimize", "stage_dir"]

logger = logging.getLogger(__name__)


def stage_dir(state_dir: str | Path, stage: str, key: str) -> Path:
    """Where a stage run writes its files: ``<state_dir>/<stage>/<key>`` (the flows' key is the
    work key, the commands' ``NAME-seedS``); the night report reads them from there."""
    return Path(state_dir) / stage / key


def lm_cache_path(state_dir: str | Path) -> Path:
    """The one LM result cache of a project, which the flows' stages and the commands share."""
    return Path(state_dir) / "lm_cache.sqlite"


@contextmanager
def cached(engine: Engine | None, cache_path: str | Path | None) -> Iterator[Engine | None]:
    """The engine behind the LM result cache (a rerun with the same seed makes no LM calls).

    Results are keyed by the engine's identity, so a task engine and a judge engine share
    one cache file safely. None stays None.
    """
    if cache_path is None or engine is None:
        yield engine
        return
    lm = CachedEngine(engine, cache_path)
    try:
        yield lm
    finally:
        lm.close()
        logger.info("LM cache (%s): %d real calls, %d cache hits", engine.identity.model, lm.real_calls, lm.cache_hits)


def run_distill(engine: Engine, spec: Spec, *, config: DistillConfig, out_dir: str | Path,
                cache_path: str | Path | None = None, judge_engine: Engine | None = None) -> tuple[DistillResult, Path]:
    """The distiller on ``spec`` behind the LM result cache; returns the result and the
    folder its files were written to.

    ``judge_engine`` (default: ``engine``) answers every judge call; TTFT and the task's
    replies always come from ``engine``.
    """
    with cached(engine, cache_path) as lm, cached(judge_engine, cache_path) as judge:
        result = distill(lm, spec, config=config, judge_engine=judge)
    return result, result.write(out_dir)


def run_optimize(engine: Engine, spec: Spec, *, ttft_model: TTFTModel, budget: OptimizeBudget,
                 selection: SelectionRule, seed: int, out_dir: str | Path, variants: Any = None,
                 cache_path: str | Path | None = None, judge_engine: Engine | None = None,
                 load_pricing: Any = None) -> OptimizationResult:
    """The optimizer on ``spec`` behind the LM result cache, its files written to ``out_dir``.

    ``variants`` are the instruction variants (the distiller's finalists; None: the
    instruction as written).
    """
    with cached(engine, cache_path) as lm, cached(judge_engine, cache_path) as judge:
        result = optimize(lm, spec, ttft_model=ttft_model, budget=budget, seed=seed, distill_candidates=variants,
                          selection=selection, judge_engine=judge, load_pricing=load_pricing)
    result.write(out_dir)
    return result


def distill_stage(engine: Engine, job: SpecJob, *, config: DistillConfig, seed: int, out_dir: str | Path,
                  cache_path: str | Path | None = None, judge_engine: Engine | None = None) -> dict[str, Any]:
    """Distill the spec's instruction (:func:`run_distill`); returns ``{"folder", "summary"}``
    (the files are in ``folder``)."""
    result, folder = run_distill(engine, load_spec(Path(job.path)), config=replace(config, seed=seed), out_dir=out_dir,
                                 cache_path=cache_path, judge_engine=judge_engine)
    return {"folder": str(folder), "summary": result.summary()}


def optimize_stage(engine: Engine, job: SpecJob, *, ttft_model: TTFTModel, budget: OptimizeBudget,
                   selection: SelectionRule, seed: int, out_dir: str | Path, distilled: Mapping[str, Any] | None = None,
                   cache_path: str | Path | None = None, judge_engine: Engine | None = None,
                   registry: Any = None) -> dict[str, Any]:
    """Optimize the spec (:func:`run_optimize`, with the distiller's finalists as variants, when given).

    A spec that declares ``slo.load`` is priced at that load with the registry's load TTFT
    model for this engine (:func:`load_pricing_for`).

    Returns:
        ``OptimizationResult.to_json()`` plus ``folder``: everything publishing and
        reporting need; the tables and the plot are in ``folder``.
    """
    spec = load_spec(Path(job.path))
    variants = None
    if distilled is not None:
        variants = variants_from_parquet(spec, Path(distilled["folder"]) / "candidates.parquet")
    pricing = load_pricing_for(registry, engine, spec) if spec.slo.load is not None else None
    result = run_optimize(engine, spec, ttft_model=ttft_model, budget=budget, selection=selection, seed=seed,
                          out_dir=out_dir, variants=variants, cache_path=cache_path, judge_engine=judge_engine,
                          load_pricing=pricing)
    return {**result.to_json(), "folder": str(out_dir)}


def load_pricing_for(registry: Any, engine: Engine, spec: Spec) -> Any:
    """The spec's declared load priced with the registry's load TTFT model for the weights
    ``engine`` serves (its held-out errors give the resolution).

    Raises:
        ConfigError: no registry, or no load model for this engine (how to fit one is named).
    """
    from promptdistill.load.store import load_load_model
    from promptdistill.optimize.predict import LoadPricing

    if registry is None:
        raise ConfigError(f"{spec.name}: slo.load: pricing a load needs the registry's load TTFT model")
    try:
        model, meta = load_load_model(registry, engine.identity, _served_weights(engine))
    except TemplateNotFoundError as e:
        raise ConfigError(f"{spec.name}: slo.load: {e}") from None
    return LoadPricing.from_model(model, spec.slo, meta.get("errors") or ())


def _served_weights(engine: Engine) -> str:
    """The model folder's name behind ``engine`` (a server's served name hides it)."""
    from promptdistill.engine.base import unwrap_engine

    from promptdistill.engine import resolve_model

    inner = unwrap_engine(engine)
    path = getattr(inner, "model_path", None) or getattr(getattr(inner, "config", None), "model", None)
    if path is None:
        return str(inner.identity.model)
    return Path(resolve_model(str(path)) if path == "embedded" else str(path)).name


def _first(figs: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if figs.get(k) is not None:
            return figs[k]
    return None


def result_figures(result: Mapping[str, Any]) -> dict[str, Any]:
    """The summary-row figures (``report.SUMMARY_COLUMNS``) of an optimizer result.

    Quality is the held-out test mean with its 95% interval (dev when the dataset has no
    test records); TTFT is measured on the engine and predicted, for the prefix state the
    selection rule used (by default the expected TTFT).
    """
    kind = result["ttft_kind"]
    selection = SelectionRecord.from_result(result)
    out: dict[str, Any] = {}
    for who, suffix in (("baseline", "before"), ("winner", "after")):
        figs = result[who]
        test = figs.get("test_mean") is not None
        out[f"tokens_{suffix}"] = figs.get("total_tokens")
        out[f"instruction_tokens_{suffix}"] = figs.get("instruction_tokens")
        out[f"ttft_ms_{suffix}"] = _first(figs, f"measured_{kind}_ms")
        out[f"ttft_cold_ms_{suffix}"] = figs.get("measured_cold_ms")
        out[f"ttft_warm_ms_{suffix}"] = figs.get("measured_warm_ms")
        out[f"ttft_ms_predicted_{suffix}"] = _first(figs, f"ttft_{kind}_ms", f"predicted_{kind}_ms")
        for cache in ("cold", "warm"):  # predicted for the timed prompts, so it compares with the measured
            out[f"ttft_{cache}_ms_predicted_{suffix}"] = _first(figs, f"predicted_{cache}_ms", f"ttft_{cache}_ms")
        out[f"static_cached_share_{suffix}"] = figs.get("static_cached_share")
        out[f"quality_{suffix}"] = figs.get("test_mean" if test else "dev_mean")
        out[f"quality_{suffix}_low"] = figs.get("test_ci_low" if test else "dev_ci_low")
        out[f"quality_{suffix}_high"] = figs.get("test_ci_high" if test else "dev_ci_high")
        out[f"valid_json_rate_{suffix}"] = _first(figs, "test_valid_json_rate", "dev_valid_json_rate")
        # At a declared load: the predicted percentile there and the sustainable rate at slo.ttft_ms.
        out[f"load_ttft_ms_predicted_{suffix}"] = figs.get("ttft_load_ms")
        out[f"sustainable_rps_{suffix}"] = figs.get("sustainable_rps")
    winner = result["winner"]
    check = (result.get("verification") or {}).get("load_check") or {}
    out.update(latency=selection.latency, load_ttft_ms_before=check.get("baseline_ms"),
               load_ttft_ms_after=check.get("winner_ms"), load_diff_ms=check.get("difference_ms"),
               load_diff_low_ms=check.get("low_ms"), load_diff_high_ms=check.get("high_ms"))
    out.update(ttft_diff_ms=winner.get(f"measured_{kind}_diff_ms"), ttft_diff_low_ms=winner.get(f"measured_{kind}_diff_low_ms"),
               ttft_diff_high_ms=winner.get(f"measured_{kind}_diff_high_ms"), kept_baseline=selection.kept,
               clause=selection.clause,
               ttft_timing=winner.get("timing_interval") or (f"{winner['timing_n']} test records x "
                                                              f"{winner.get('timing_repeats')} repeats"
                                                              if winner.get("timing_n") else None))
    passed, reason = gate(result)
    decision = result["winner"].get("decision") or {}
    out.update(gate_passed=passed, gate_reason=reason, lm_calls=result["lm_calls"],
               tokens_processed=(result.get("prompt_tokens") or 0) + (result.get("completion_tokens") or 0),
               test_n=result["winner"].get("test_n"), race_n=decision.get("n"), diff_lower=decision.get("lower"),
               plan=result.get("plan_text"), warm_share=result.get("warm_share"),
               warm_share_source=result.get("warm_share_source"), minutes=round(result["minutes"], 2))
    return json_safe(out)


def candidate_table(folder: str | Path, ttft_kind: str) -> pd.DataFrame:
    """Every candidate, the Pareto front first (cheapest first), then the rest by quality.

    Columns are the ones a reader compares; cells are JSON-safe (NaN becomes None).
    """
    df = pd.read_parquet(Path(folder) / "candidates.parquet")
    cost = f"ttft_{ttft_kind}_ms"
    df["_order"] = (~df["pareto"].astype(bool)).astype(int)
    df["_q"] = -df["screen_quality"].astype(float).fillna(-1.0)
    df["_c"] = df[cost].astype(float)
    df.loc[df["_order"] == 1, "_c"] = 0.0
    df = df.sort_values(["_order", "_c", "_q", "candidate_id"]).drop(columns=["_order", "_q", "_c"])
    wanted = ["candidate_id", "pareto", "is_winner", "is_baseline", "finalist", "strategy", "k", "total_tokens",
              "semantic_density", "ttft_cold_ms", "ttft_warm_ms", "screen_quality", "race_n", "quality", "ci_low",
              "ci_high", "diff_lower", "diff_upper", "verdict", "decision", "notes"]
    df = df[[c for c in wanted if c in df.columns]]
    return pd.DataFrame(json_records(df), columns=df.columns, dtype=object)


def result_plots(folder: str | Path) -> dict[str, Path]:
    """{title: PNG} of a result's plots: the Pareto front (with the density curve)."""
    return {"Pareto front (quality vs predicted TTFT) and density curve": Path(folder) / "pareto.png"}

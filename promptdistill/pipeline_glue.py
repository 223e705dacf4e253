"""Adapters between the pipeline and the library's stages (no Prefect).

* TTFT ([C]): fit and select the model on measurements, stamped with the engine identity
  the profiler recorded on every row; write its report and figures;
* distiller ([D]) and optimizer ([E]): run them on a :class:`~promptdistill.pipeline.SpecJob`
  through the LM result cache, and read what the flows need from the result (summary
  figures, the gate, candidate table and log, plots), and publish it idempotently.

Keeping these here means the flows never reach into a stage's internals, and a change in
a stage's interface is absorbed in one place.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from promptdistill.engine.base import Engine
from promptdistill.pipeline import json_safe, publish_once

__all__ = [
    "candidate_log",
    "candidate_table",
    "distill_job",
    "fit_ttft_model",
    "gate",
    "optimize_job",
    "publish_result",
    "result_figures",
    "result_plots",
    "ttft_report",
]


# ------------------------------------------------------------------------- TTFT
def fit_ttft_model(frame: Any, *, seed: int = 0, source: str = "", keep_contended: bool = False) -> tuple[Any, Any, Any]:
    """Select and fit the TTFT model on a measurement frame of one engine.

    Rows measured under CPU contention are left out unless ``keep_contended``; when too
    few prompts remain without them, the fit keeps them and says so in
    ``model.training["contended_rows_kept"]``.

    Returns:
        (TTFTModel, FitResult, the rows it was fitted on).

    Raises:
        ValueError: the frame mixes engines, lacks identity columns or has too few prompts.
    """
    from promptdistill.ttft import TTFTModel, engine_rows, fit_models

    rows = engine_rows(frame, where=source or "measurements")
    fallback = None
    try:
        fit = fit_models(rows, seed=seed, drop_contended=not keep_contended)
    except ValueError as e:
        if keep_contended:
            raise
        # A machine that is never idle: rather a noisier model than none.
        fit, fallback = fit_models(rows, seed=seed, drop_contended=False), str(e)
    model = TTFTModel.from_fit(fit, rows, sources=[source] if source else [])
    if fallback:
        model.training["contended_rows_kept"] = f"too few uncontended prompts ({fallback}); fitted on every row"
    return model, fit, rows


def ttft_report(rows: Any, fit: Any, model: Any, out_dir: str | Path, *, seed: int = 0,
                keep_contended: bool = False) -> dict[str, Path]:
    """The TTFT report ([C]'s ``build_report``: markdown, JSON, PNGs) in ``out_dir``.

    Returns:
        ``{"report": report.md, <figure title>: png, ...}``.
    """
    from promptdistill.ttft.report import build_report

    out = Path(out_dir)
    md = build_report(rows, out, fit=fit, seed=seed, model_version=model.version, drop_contended=not keep_contended)
    figures = {p.stem.replace("_", " "): p for p in sorted(out.glob("*.png"))}
    return {"report": md, **figures}


# ------------------------------------------------------------ distill, optimize
@contextmanager
def _cached(engine: Engine, cache_path: str | Path | None) -> Iterator[Engine]:
    """The engine behind the LM result cache (a rerun with the same seed makes no LM calls)."""
    if cache_path is None:
        yield engine
        return
    from promptdistill.lm_cache import CachedEngine

    Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
    cached = CachedEngine(engine, cache_path)
    try:
        yield cached
    finally:
        cached.close()


def distill_job(engine: Engine, job: Any, *, config: Any, seed: int, cache_path: str | Path | None = None) -> Any:
    """Distill the spec's instruction ([D]); the result feeds the optimizer's variants."""
    from promptdistill.distill import distill
    from promptdistill.specs import load_spec

    spec = load_spec(Path(job.path))
    with _cached(engine, cache_path) as lm:
        return distill(lm, spec, config=replace(config, seed=seed))


def optimize_job(engine: Engine, job: Any, *, ttft_model: Any, budget: Any, selection: Any, seed: int,
                 distilled: Any = None, out_dir: str | Path | None = None, cache_path: str | Path | None = None) -> Any:
    """Optimize the spec ([E]); with ``out_dir``, the result's tables, JSON and plot are written there."""
    from promptdistill.optimize import optimize
    from promptdistill.specs import load_spec

    spec = load_spec(Path(job.path))
    with _cached(engine, cache_path) as lm:
        result = optimize(lm, spec, ttft_model=ttft_model, budget=budget, seed=seed,
                          distill_candidates=distilled, selection=selection)
    if out_dir is not None:
        result.write(out_dir)
    return result


# ----------------------------------------------------------- reading a result
def gate(result: Any) -> tuple[bool, str]:
    """The run's gate: a winner other than the baseline qualified (non-inferior on dev,
    within the SLO) and survived verification on the held-out test split."""
    return (not result.kept_baseline), result.reason


def _first(figs: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if figs.get(k) is not None:
            return figs[k]
    return None


def result_figures(result: Any) -> dict[str, Any]:
    """The summary-row figures (``pipeline_report.SUMMARY_COLUMNS``) of an optimization result.

    Quality is the held-out test mean with its bootstrap interval (dev when the dataset
    has no test records); TTFT is measured on the engine and predicted, for the prefix
    state the selection rule used (by default the expected TTFT: 80% of requests warm).
    """
    kind = result.ttft_kind
    out: dict[str, Any] = {}
    for who, suffix in (("baseline", "before"), ("winner", "after")):
        figs = getattr(result, who)
        test = figs.get("test_mean") is not None
        out[f"tokens_{suffix}"] = figs.get("total_tokens")
        out[f"ttft_ms_{suffix}"] = _first(figs, f"measured_{kind}_ms")
        out[f"ttft_ms_predicted_{suffix}"] = _first(figs, f"ttft_{kind}_ms", f"predicted_{kind}_ms")
        out[f"quality_{suffix}"] = figs.get("test_mean" if test else "dev_mean")
        out[f"quality_{suffix}_low"] = figs.get("test_ci_low" if test else "dev_ci_low")
        out[f"quality_{suffix}_high"] = figs.get("test_ci_high" if test else "dev_ci_high")
        out[f"valid_json_rate_{suffix}"] = _first(figs, "test_valid_json_rate", "dev_valid_json_rate")
    passed, reason = gate(result)
    out.update(gate_passed=passed, gate_reason=reason, lm_calls=result.lm_calls, minutes=round(result.minutes, 2))
    return json_safe(out)


def candidate_log(result: Any) -> Any:
    """The full candidate log (one row per candidate) as a DataFrame."""
    return result.candidates


def candidate_table(result: Any) -> Any:
    """Every candidate, the Pareto front first (cheapest first), then the rest by quality.

    Columns are the ones a reader compares; cells are JSON-safe (NaN becomes None).
    """
    import pandas as pd

    df = result.candidates.copy()
    cost = f"ttft_{result.ttft_kind}_ms"
    df["_order"] = (~df["pareto"].astype(bool)).astype(int)
    df["_q"] = -df["quality"].astype(float).fillna(-1.0)
    df["_c"] = df[cost].astype(float)
    df.loc[df["_order"] == 1, "_c"] = 0.0
    df = df.sort_values(["_order", "_c", "_q", "candidate_id"]).drop(columns=["_order", "_q", "_c"])
    wanted = ["candidate_id", "pareto", "is_winner", "is_baseline", "strategy", "k", "total_tokens",
              "semantic_density", "ttft_cold_ms", "ttft_warm_ms", "n_dev", "quality", "ci_low", "ci_high",
              "diff_lower", "verdict"]
    df = df[[c for c in wanted if c in df.columns]].reset_index(drop=True)
    return df.astype(object).where(pd.notna(df), None)


def result_plots(result: Any, out_dir: str | Path) -> dict[str, Path]:
    """{title: PNG} of the result's plots: the Pareto front (with the density curve)."""
    path = Path(out_dir) / "pareto.png"
    if not path.is_file():
        result.plot(path)
    return {"Pareto front (quality vs predicted TTFT) and density curve": path}


def publish_result(registry: Any, result: Any, *, run_key: str, labels: Sequence[str], reason: str) -> tuple[Any, bool]:
    """Publish the result's template (content, provenance, metrics) once per ``run_key``.

    Returns:
        (VersionRecord, created): created is False when a rerun found it already published.
    """
    why = ("baseline kept: " if result.kept_baseline else f"optimized ({result.winner_id}): ") + result.reason
    return publish_once(registry, result.spec_name, result.content, run_key=run_key, labels=labels,
                        provenance=result.provenance, metrics=json_safe(result.metrics()),
                        reason=f"{reason}; {why}"[:500])

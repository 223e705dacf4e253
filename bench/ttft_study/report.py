"""The TTFT study's report: markdown with the numbers, PNG figures, and a JSON of the same numbers.

Everything is computed from the profile rows: model comparison (grouped CV and
held-out, against single measurements and against medians of repeats), the noise floor
those scores are bounded by, the engine mechanics and the queue probe, prefill
throughput against the machine's matmul peak, the linear model's coefficients with
bootstrap intervals, the density question and the few-shot table.

``build_report`` writes one engine's report; ``build_overview`` one report over several
engines (the in-process and server backends): a summary table, then each engine's
report in a subfolder named after its backend; ``write_study`` picks between them, as
``promptdistill ttft report`` and ``python -m bench.ttft_study`` do. The nightly never
builds this report: its TTFT refresh publishes the model, its held-out error, its noise
floor and its fit figure only (``promptdistill.pipeline.ttft_models``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.ttft_study.analysis import (
    bootstrap_coefficients,
    density_effect,
    fewshot_table,
    prefill_throughput,
    queue_table,
)
from bench.ttft_study.figures import write_figures
from bench.ttft_study.report_text import engine_markdown, overview_markdown
from promptdistill.core.errors import IntegrityError, TemplateNotFoundError
from promptdistill.core.jsonio import atomic_write, write_json
from promptdistill.pipeline.ttft_models import load_ttft_model
from promptdistill.registry.store import Registry
from promptdistill.ttft.fit import FitResult, check_frame, engine_rows, fit_models, identity_of
from promptdistill.ttft.hardware import ModelFlops
from promptdistill.ttft.noise import noise_floor

__all__ = ["FLOOR_FACTOR", "GOAL_MAPE", "build_overview", "build_report", "target_verdict", "write_figures", "write_study"]

GOAL_MAPE = 0.05
"""Held-out MAPE against medians the model should reach."""
FLOOR_FACTOR = 1.2
"""When the noise floor makes the goal impossible: how close to the floor is close enough."""


def target_verdict(model_mape: float, floor: float, *, goal: float = GOAL_MAPE, factor: float = FLOOR_FACTOR) -> dict[str, Any]:
    """Met when ``model_mape <= goal``, or (when the floor itself is above ``goal / factor``)
    within ``factor`` times the floor."""
    known = floor is not None and bool(np.isfinite(floor))
    ratio = model_mape / floor if known and floor > 0 else float("nan")
    if model_mape <= goal:
        return {"met": True, "how": f"<= {goal:.0%}", "ratio_to_floor": ratio}
    if known and floor * factor > goal and ratio <= factor:
        return {"met": True, "how": f"within {factor}x the noise floor ({goal:.0%} is below what the noise allows)",
                "ratio_to_floor": ratio}
    return {"met": False, "how": f"above {goal:.0%} and above {factor}x the noise floor", "ratio_to_floor": ratio}


def build_report(
    df: pd.DataFrame,
    out: str | os.PathLike[str] = "artifacts/ttft",
    *,
    fit: FitResult | None = None,
    n_boot: int = 500,
    seed: int = 0,
    model_version: str | None = None,
    drop_contended: bool = True,
) -> Path:
    """Write ``report.md``, ``report.json`` and the PNGs into ``out``; returns the markdown path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    numbers = report_numbers(df, fit=fit, n_boot=n_boot, seed=seed, model_version=model_version,
                             drop_contended=drop_contended, out=out)
    write_json(out / "report.json", numbers)  # a missing figure (NaN, infinity) as null
    _atomic_write(out / "report.md", engine_markdown(numbers))
    return out / "report.md"


def report_numbers(df: pd.DataFrame, *, fit: FitResult | None, n_boot: int, seed: int, model_version: str | None,
                   drop_contended: bool, out: Path) -> dict[str, Any]:
    """Every number of one engine's report (and its figures, written to ``out``)."""
    fit = fit or fit_models(df, seed=seed, drop_contended=drop_contended)
    rows, counts = check_frame(df, drop_contended=drop_contended)
    alone = rows[rows["batch_size"].fillna(1) <= 1] if "batch_size" in rows.columns else rows
    noise = noise_floor(rows, n_boot=n_boot, seed=seed)
    throughput = prefill_throughput(rows, n_boot=n_boot, seed=seed)
    queue, queue_scores = queue_table(rows, fit.estimator)
    figures = write_figures(rows, fit, out, throughput=throughput)
    held = fit.heldout[fit.chosen]
    test = fit.heldout_predictions
    spec_rows = test[test["design"] == "spec"] if "design" in test else pd.DataFrame()
    spec_mape = (float(np.mean(np.abs(spec_rows[f"pred_{fit.chosen}"] - spec_rows["ttft_ms"]) / spec_rows["ttft_ms"]))
                 if len(spec_rows) else None)
    flops = ModelFlops.from_columns(rows.iloc[0])
    return {
        "engine": {c: rows[c].iloc[0] for c in rows.columns if c.startswith("engine_")},
        "rows": counts,
        "runs": sorted(str(r) for r in rows["run_id"].unique()) if "run_id" in rows else [],
        "conditions": {
            "loadavg_1m_median_used": float(rows["loadavg_1m"].median()) if "loadavg_1m" in rows else None,
            "foreign_cpu_share_median_all": float(df["foreign_cpu_share"].median()) if "foreign_cpu_share" in df else None,
            "foreign_cpu_share_median_used": float(rows["foreign_cpu_share"].median()) if "foreign_cpu_share" in rows else None,
        },
        "drop_contended": drop_contended,
        "model_version": model_version,
        "fit": fit.summary(),
        "heldout_mape_chosen": held["mape"],
        "heldout_mape_median_chosen": held.get("mape_median"),
        "heldout_mape_spec_rows": spec_mape,
        "noise": noise,
        "target": {
            "vs_medians": target_verdict(held.get("mape_median", np.nan), noise["floor_vs_medians"]),
            # Like for like: a perfect model's expected MAPE on new single measurements.
            "vs_singles": target_verdict(held["mape"], noise["floor_vs_singles_pooled"]),
        },
        "mechanics": {**fit.mechanics, "max_model_len": int(rows["engine_max_model_len"].iloc[0])
                      if "engine_max_model_len" in rows else None,
                      "longest_prompt": int(alone["total_tokens"].max()) if "total_tokens" in alone else None},
        "queue": {"table": queue.to_dict("records"), **queue_scores},
        "hardware": {
            "matmul_gflops": _col(rows, "hw_matmul_gflops"),
            "matmul_gflops_start": _col(rows, "hw_matmul_gflops_start"),
            "matmul_gflops_end": _col(rows, "hw_matmul_gflops_end"),
            "matmul_gflops_1t": _col(rows, "hw_matmul_gflops_1t"),
            "matmul_threads": _col(rows, "hw_matmul_threads"),
            "matmul_kernel": str(rows["hw_matmul_kernel"].dropna().iloc[0]) if "hw_matmul_kernel" in rows
            and rows["hw_matmul_kernel"].notna().any() else None,
            "model": flops.__dict__ if flops else None,
            "gflop_per_token_linear": 2 * flops.matmul_params / 1e9 if flops else None,
            "throughput": throughput.to_dict("records"),
        },
        "density": density_effect(rows, n_boot=n_boot, seed=seed),
        "coefficients": bootstrap_coefficients(rows, n_boot=n_boot, seed=seed).to_dict("records"),
        "fewshot": fewshot_table(rows).to_dict("records"),
        "figures": figures,
    }


def _col(rows: pd.DataFrame, name: str) -> float | None:
    """A per-run constant column: its median over runs (None when not recorded)."""
    if name not in rows.columns or rows[name].isna().all():
        return None
    return float(rows.groupby("run_id")[name].first().median()) if "run_id" in rows else float(rows[name].median())


def _slug(rows: pd.DataFrame, taken: set[str]) -> str:
    name = str(rows["engine_backend"].iloc[0]) if "engine_backend" in rows else "engine"
    return name if name not in taken else f"{name}-{rows['engine_key'].iloc[0]}"


def build_overview(
    df: pd.DataFrame,
    out: str | os.PathLike[str],
    *,
    n_boot: int = 500,
    seed: int = 0,
    model_versions: dict[str, str | None] | None = None,
    drop_contended: bool = True,
    note: str = "",
) -> Path:
    """One report over every engine in ``df``: a summary table in ``out/report.md`` and
    each engine's full report in ``out/<backend>/``. Returns the markdown path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    engines: dict[str, dict[str, Any]] = {}
    for key in sorted(df["engine_key"].dropna().unique(), key=lambda k: str(df.loc[df["engine_key"] == k, "engine_backend"].iloc[0])):
        rows = engine_rows(df, key)
        slug = _slug(rows, set(engines))
        (out / slug).mkdir(parents=True, exist_ok=True)
        numbers = report_numbers(rows, fit=None, n_boot=n_boot, seed=seed, drop_contended=drop_contended,
                                 model_version=(model_versions or {}).get(key), out=out / slug)
        write_json(out / slug / "report.json", numbers)
        _atomic_write(out / slug / "report.md", engine_markdown(numbers))
        engines[slug] = numbers
    summary = {slug: _summary(n) for slug, n in engines.items()}
    write_json(out / "report.json", {"engines": summary, "note": note})
    _atomic_write(out / "report.md", overview_markdown(engines, note=note))
    return out / "report.md"


def write_study(df: pd.DataFrame, out: str | os.PathLike[str], *, registry: Registry, engine_key: str | None = None,
                n_boot: int = 500, seed: int = 0, keep_contended: bool = False, note: str = "") -> Path:
    """The study over profile rows: one engine's report, or (rows of several engines and no
    ``engine_key``) the overview with a report per engine. Each names the version of the
    model its engine's runs use, when ``registry`` holds one. Returns the markdown path.

    Raises:
        ValueError: no rows for ``engine_key``, or too few usable prompts.
    """
    if engine_key is None and df["engine_key"].nunique() > 1:
        versions = {key: _model_version(registry, engine_rows(df, key)) for key in df["engine_key"].dropna().unique()}
        return build_overview(df, out, n_boot=n_boot, seed=seed, model_versions=versions,
                              drop_contended=not keep_contended, note=note)
    df = engine_rows(df, engine_key)
    fit = fit_models(df, seed=seed, drop_contended=not keep_contended)
    return build_report(df, out, fit=fit, n_boot=n_boot, seed=seed, model_version=_model_version(registry, df),
                        drop_contended=not keep_contended)


def _model_version(registry: Registry, rows: pd.DataFrame) -> str | None:
    """The version of the model this engine's runs use, if one was published."""
    try:
        return load_ttft_model(registry, identity_of(rows)).version
    except (TemplateNotFoundError, IntegrityError):
        return None


def _summary(n: dict[str, Any]) -> dict[str, Any]:
    """The figures the overview table shows for one engine."""
    return {
        "engine_key": n["engine"].get("engine_key"), "backend": n["engine"].get("engine_backend"),
        "chosen": n["fit"]["chosen"], "heldout_mape": n["heldout_mape_chosen"],
        "heldout_mape_median": n["heldout_mape_median_chosen"], "noise": n["noise"], "target": n["target"],
        "mechanics": n["mechanics"], "queue": {k: v for k, v in n["queue"].items() if k != "table"},
        "hardware": n["hardware"], "rows": n["rows"],
    }


def _atomic_write(path: Path, text: str) -> None:
    atomic_write(path, text)

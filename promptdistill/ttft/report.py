"""The TTFT report: markdown with the numbers, PNG figures, and a JSON of the same numbers.

Everything is computed from the profile rows: model comparison (grouped CV and
held-out), the linear model's coefficients with bootstrap intervals, the density
question, the few-shot table, and the figures (predicted vs measured, TTFT against
uncached tokens cold and warm, residuals, density partial residuals).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from promptdistill.ttft.analysis import (
    CLAIMED_DENSITY_BETA,
    bootstrap_coefficients,
    density_effect,
    fewshot_table,
    token_only_residuals,
)
from promptdistill.ttft.estimators import DENSITY_HINGE, MODEL_FEATURES
from promptdistill.ttft.fit import FitResult, check_frame, fit_models

__all__ = ["build_report", "write_figures"]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_figures(df: pd.DataFrame, fit: FitResult, out: Path) -> dict[str, str]:
    """The PNGs; returns {figure name: file name}."""
    plt = _plt()
    files: dict[str, str] = {}
    test = fit.heldout_predictions
    pred = test[f"pred_{fit.chosen}"].to_numpy()
    y = test["ttft_ms"].to_numpy()

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for warm, colour in ((False, "tab:blue"), (True, "tab:orange")):
        sel = test["warm"].to_numpy() == warm if "warm" in test else np.ones(len(test), bool)
        ax.scatter(y[sel], pred[sel], s=14, alpha=0.7, c=colour, label="warm" if warm else "cold")
    lo, hi = float(min(y.min(), pred.min())), float(max(y.max(), pred.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax.set(xscale="log", yscale="log", xlabel="measured TTFT (ms)", ylabel="predicted TTFT (ms)",
           title=f"held-out prompts: {fit.chosen} (MAPE {fit.heldout[fit.chosen]['mape']:.1%})")
    ax.legend()
    files["pred_vs_measured"] = _save(fig, out, "pred_vs_measured.png")

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for warm, colour in ((False, "tab:blue"), (True, "tab:orange")):
        sel = df["warm"] == warm
        ax.scatter(df.loc[sel, "uncached_tokens"], df.loc[sel, "ttft_ms"], s=12, alpha=0.6, c=colour,
                   label=f"{'warm' if warm else 'cold'} (n={int(sel.sum())})")
    grid = np.linspace(df["uncached_tokens"].min(), df["uncached_tokens"].max(), 100)
    typical = df[list(MODEL_FEATURES)].median()
    for warm, colour in ((False, "tab:blue"), (True, "tab:orange")):
        part = df[df["warm"] == warm]
        if part.empty:
            continue
        probe = np.tile(typical.to_numpy(dtype=float), (len(grid), 1))
        probe[:, MODEL_FEATURES.index("uncached_tokens")] = grid
        probe[:, MODEL_FEATURES.index("cached_tokens")] = float(part["cached_tokens"].median())
        ax.plot(grid, fit.estimator.predict(probe), c=colour, lw=2,
                label=f"{fit.chosen}, cached={int(part['cached_tokens'].median())}")
    ax.set(xlabel="uncached prompt tokens", ylabel="TTFT (ms)", title="TTFT against uncached tokens")
    ax.legend(fontsize=8)
    files["ttft_vs_uncached"] = _save(fig, out, "ttft_vs_uncached.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    resid = y - pred
    axes[0].scatter(pred, resid, s=12, alpha=0.7)
    axes[0].axhline(0, c="k", lw=1)
    axes[0].set(xlabel="predicted TTFT (ms)", ylabel="measured - predicted (ms)", title="held-out residuals")
    axes[1].hist(resid / y * 100, bins=30)
    axes[1].set(xlabel="relative error (%)", ylabel="measurements", title="relative residuals")
    files["residuals"] = _save(fig, out, "residuals.png")

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    partial = token_only_residuals(df)
    d = df["semantic_density"].to_numpy()
    ax.scatter(d, partial, s=12, alpha=0.5, label="measurement")
    bins = np.quantile(d, np.linspace(0, 1, 7))
    centres, means = [], []
    for a, b in zip(bins[:-1], bins[1:]):
        sel = (d >= a) & (d <= b)
        if sel.sum() >= 3:
            centres.append(d[sel].mean())
            means.append(np.median(partial[sel]))
    ax.plot(centres, means, "o-", c="tab:red", label="bin median")
    ax.axvline(DENSITY_HINGE, c="grey", ls=":", label=f"claimed knee ({DENSITY_HINGE})")
    ax.axhline(0, c="k", lw=1)
    ax.set(xlabel="semantic density", ylabel="TTFT not explained by tokens (ms)",
           title="Density after controlling for tokens")
    ax.legend(fontsize=8)
    files["density_partial"] = _save(fig, out, "density_partial.png")
    return files


def _save(fig: Any, out: Path, name: str) -> str:
    fig.tight_layout()
    tmp = out / f".{name}.tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, out / name)
    _plt().close(fig)
    return name


def _cell(column: str, value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return ""
        if "mape" in column:
            return f"{value:.1%}"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_cell(c, v) for c, v in zip(cols, row)) + " |")
    return "\n".join(lines)


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
    fit = fit or fit_models(df, seed=seed, drop_contended=drop_contended)
    rows, counts = check_frame(df, drop_contended=drop_contended)
    coefs = bootstrap_coefficients(rows, n_boot=n_boot, seed=seed)
    density = density_effect(rows, n_boot=n_boot, seed=seed)
    fewshot = fewshot_table(rows)
    figures = write_figures(rows, fit, out)
    spec_rows = fit.heldout_predictions[fit.heldout_predictions.get("design", "") == "spec"] if "design" in fit.heldout_predictions else pd.DataFrame()
    spec_mape = (
        float(np.mean(np.abs(spec_rows[f"pred_{fit.chosen}"] - spec_rows["ttft_ms"]) / spec_rows["ttft_ms"]))
        if len(spec_rows) else None
    )
    identity = {c: rows[c].iloc[0] for c in rows.columns if c.startswith("engine_")}
    conditions = {
        "loadavg_1m_median_used": float(rows["loadavg_1m"].median()) if "loadavg_1m" in rows else None,
        "foreign_cpu_share_median_all": float(df["foreign_cpu_share"].median()) if "foreign_cpu_share" in df else None,
        "foreign_cpu_share_median_used": float(rows["foreign_cpu_share"].median()) if "foreign_cpu_share" in rows else None,
    }
    numbers = {
        "engine": identity,
        "rows": counts,
        "conditions": conditions,
        "drop_contended": drop_contended,
        "model_version": model_version,
        "fit": fit.summary(),
        "heldout_mape_chosen": fit.heldout[fit.chosen]["mape"],
        "heldout_mape_spec_rows": spec_mape,
        "density": density,
        "coefficients": coefs.to_dict("records"),
        "fewshot": fewshot.to_dict("records"),
        "figures": figures,
    }
    _atomic_write(out / "report.json", json.dumps(numbers, indent=2, default=_jsonable) + "\n")
    _atomic_write(out / "report.md", _markdown(numbers, fit, coefs, fewshot, density, figures))
    return out / "report.md"


def _markdown(numbers: dict, fit: FitResult, coefs: pd.DataFrame, fewshot: pd.DataFrame, dens: dict, figures: dict) -> str:
    e = numbers["engine"]
    r = numbers["rows"]
    h = fit.heldout[fit.chosen]
    comparison = pd.DataFrame(
        [
            {"model": n, "cv_mape": fit.cv[n]["mape"], "heldout_r2": s["r2"], "heldout_mape": s["mape"],
             "p50_abs_err_ms": s["p50_abs_err_ms"], "p95_abs_err_ms": s["p95_abs_err_ms"],
             "monotonic": fit.monotonic[n], "chosen": "yes" if n == fit.chosen else ""}
            for n, s in fit.heldout.items()
        ]
    )
    verdict = (
        "**No measurable effect.** The 95% interval of the density coefficient includes zero."
        if not dens["ci_excludes_zero"]
        else f"**A measurable effect**: {dens['effect_over_range_ms']:+.1f} ms across the measured density range "
        f"({dens['effect_share_of_median_ttft']:+.1%} of the median TTFT)."
    )
    spec_line = (
        f" On held-out rows of the bundled specs as rendered over their datasets, MAPE is {numbers['heldout_mape_spec_rows']:.1%}."
        if numbers["heldout_mape_spec_rows"] is not None else ""
    )
    fs = fewshot.copy()
    return f"""# TTFT profile and models

Engine: `{e.get('engine_model')}` on `{e.get('engine_backend')}` ({e.get('engine_dtype')}, max_model_len {e.get('engine_max_model_len')}, {e.get('engine_engine_version')}), hardware `{e.get('engine_hardware')}`, engine key `{e.get('engine_key')}`.
Model version: `{numbers['model_version'] or 'not saved'}`.

Rows: {r['rows_total']} measurements, {r['rows_failed']} failed, {r['rows_contended'] if numbers['drop_contended'] else 'no rows'} left out as measured under CPU contention{'' if numbers['drop_contended'] else ' (contended rows kept on request)'}, {r['rows_used']} used ({r['prompts_used']} distinct prompts).{_conditions(numbers['conditions'])}

## Result

Chosen model: **{fit.chosen}**. Held-out MAPE **{h['mape']:.1%}** (target 10%, goal 5%), R² {h['r2']:.3f}, absolute error p50 {h['p50_abs_err_ms']:.0f} ms, p95 {h['p95_abs_err_ms']:.0f} ms, on {len(fit.test_groups)} held-out prompts ({h['n']} measurements).{spec_line}
{'The shipped model is refitted on all rows; the held-out figures are for the same specification fitted on the training prompts only.' if fit.refit_on_all else ''}

## Model comparison (grouped by prompt)

{_md_table(comparison)}

![predicted vs measured]({figures['pred_vs_measured']})
![TTFT against uncached tokens]({figures['ttft_vs_uncached']})
![residuals]({figures['residuals']})

## Linear model coefficients (ms per unit; 95% grouped-bootstrap intervals, {dens['n_boot']} resamples)

{_md_table(_p_column(coefs, dens['n_boot']))}

`std_beta` is the coefficient in standard deviations of TTFT per standard deviation of the term.

## Does semantic density change TTFT once tokens are controlled?

{verdict}

- Density coefficient: {dens['coef_ms_per_unit']:+.1f} ms per unit density, 95% CI [{dens['ci_low']:+.1f}, {dens['ci_high']:+.1f}], bootstrap p {'< ' + format(1 / dens['n_boot'], '.2g') if dens['p_boot'] == 0 else '= ' + format(dens['p_boot'], '.2f')}.
- Across the measured range (density {dens['density_p5']:.2f} to {dens['density_p95']:.2f}): {dens['effect_over_range_ms']:+.1f} ms, CI [{dens['effect_over_range_ms_ci'][0]:+.1f}, {dens['effect_over_range_ms_ci'][1]:+.1f}] ms, that is {dens['effect_share_of_median_ttft']:+.1%} of the median TTFT ({dens['median_ttft_ms']:.0f} ms).
- Standardised beta: {dens['std_beta']:+.3f}, against the claimed +{CLAIMED_DENSITY_BETA}.
- "Steep above {DENSITY_HINGE}": the extra slope above {DENSITY_HINGE} is {dens['hinge_coef_ms_per_unit']:+.1f} ms per unit, CI [{dens['hinge_ci'][0]:+.1f}, {dens['hinge_ci'][1]:+.1f}] ({dens['rows_above_hinge']} measurements above {DENSITY_HINGE}).

Density is measured by `promptdistill.ttft.features.semantic_density` on the instruction text. The coefficient is read from the linear model, which holds uncached tokens (and their square), cached tokens, few-shot count and entropy fixed while density varies; the figure plots what the token terms alone leave unexplained against density.

![density partial residuals]({figures['density_partial']})

## Few-shot count (cold, ~512-token base, examples of ~64 tokens)

{_md_table(fs) if len(fs) else '_No few-shot probe in these profiles._'}

`claimed_ms` is the shared claim's figure for 1, 4 and 8 examples; `increment_over_0_ms` is this engine's added TTFT over the same base without examples.
"""


def _conditions(c: dict) -> str:
    if any(v is None or v != v for v in c.values()):  # missing or NaN: nothing to say
        return ""
    return (
        f" Other processes used a median {c['foreign_cpu_share_median_all']:.0%} of the CPU during all measurements "
        f"and {c['foreign_cpu_share_median_used']:.0%} during the ones used (1-minute load average "
        f"{c['loadavg_1m_median_used']:.1f} on {os.cpu_count()} cores)."
    )


def _p_column(coefs: pd.DataFrame, n_boot: int) -> pd.DataFrame:
    """Bootstrap p-values as text: 0 means smaller than the resolution 1/n_boot."""
    out = coefs.copy()
    out["p_boot"] = [f"<{1 / n_boot:.2g}" if p == 0 else f"{p:.2f}" for p in coefs["p_boot"]]
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if np.isnan(value) else float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, (pd.Timestamp,)):
        return value.isoformat()
    return str(value)

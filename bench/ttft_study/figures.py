"""The TTFT study's figures (PNG): every one states its n, and intervals where it has them.

* ``pred_vs_measured``: held-out predictions against single measurements and medians
  (the model's fit figure, ``promptdistill.ttft.figures.fit_figure``, the same picture the
  registry stores beside the model);
* ``ttft_vs_uncached``: measurements of requests sent alone, cold and warm, with the model;
* ``residuals``: held-out residuals, absolute and relative;
* ``density_partial``: what the token terms leave unexplained, against density;
* ``noise``: each repeated unit's spread, and every repeat's deviation over the run
  (drift shows as runs of same-sign deviations);
* ``throughput``: cold prefill as a share of the measured matmul peak, by prompt size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.ttft_study.analysis import DENSITY_HINGE, token_only_residuals
from promptdistill.ttft.estimators import MODEL_FEATURES
from promptdistill.ttft.figures import fit_figure, pyplot, requests_alone, save_figure
from promptdistill.ttft.fit import FitResult, model_inputs
from promptdistill.ttft.noise import repeat_key

__all__ = ["write_figures"]


def write_figures(df: pd.DataFrame, fit: FitResult, out: Path, *, throughput: pd.DataFrame | None = None) -> dict[str, str]:
    """The PNGs in ``out``; returns {figure name: file name}."""
    plt = pyplot()
    files: dict[str, str] = {"pred_vs_measured": fit_figure(fit, out)}
    test = fit.heldout_predictions
    pred = test[f"pred_{fit.chosen}"].to_numpy()
    y = test["ttft_ms"].to_numpy()

    files["ttft_vs_uncached"] = _ttft_vs_uncached(plt, df[requests_alone(df)], fit, out)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    resid = y - pred
    axes[0].scatter(pred, resid, s=12, alpha=0.7)
    axes[0].axhline(0, c="k", lw=1)
    axes[0].set(xlabel="predicted TTFT (ms)", ylabel="measured - predicted (ms)", title=f"held-out residuals (n={len(y)})")
    axes[1].hist(resid / y * 100, bins=30)
    axes[1].set(xlabel="relative error (%)", ylabel="measurements", title="relative residuals")
    files["residuals"] = save_figure(fig, out, "residuals.png")

    files["density_partial"] = _density_partial(plt, df, out)
    noise = _noise(plt, df, out)
    if noise:
        files["noise"] = noise
    if throughput is not None and len(throughput) and throughput["share_of_peak"].notna().any():
        files["throughput"] = _throughput(plt, throughput, float(df["hw_matmul_gflops"].max()), out)
    return files


def _ttft_vs_uncached(plt: Any, df: pd.DataFrame, fit: FitResult, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for warm, colour in ((False, "tab:blue"), (True, "tab:orange")):
        sel = df["warm"] == warm
        ax.scatter(df.loc[sel, "uncached_tokens"], df.loc[sel, "ttft_ms"], s=12, alpha=0.6, c=colour,
                   label=f"{'warm' if warm else 'cold'} (n={int(sel.sum())})")
    grid = np.linspace(df["uncached_tokens"].min(), df["uncached_tokens"].max(), 100)
    typical = np.median(model_inputs(df), axis=0)
    for warm, colour in ((False, "tab:blue"), (True, "tab:orange")):
        part = df[df["warm"] == warm]
        if part.empty:
            continue
        probe = np.tile(typical, (len(grid), 1))
        probe[:, MODEL_FEATURES.index("uncached_tokens")] = grid
        probe[:, MODEL_FEATURES.index("cached_tokens")] = float(part["cached_tokens"].median())
        probe[:, MODEL_FEATURES.index("tokens_ahead")] = 0.0
        probe[:, MODEL_FEATURES.index("batch_tokens")] = 0.0
        ax.plot(grid, fit.estimator.predict(probe), c=colour, lw=2,
                label=f"{fit.chosen}, cached={int(part['cached_tokens'].median())}")
    ax.set(xlabel="uncached prompt tokens", ylabel="TTFT (ms)", title="TTFT against uncached tokens (requests alone)")
    ax.legend(fontsize=8)
    return save_figure(fig, out, "ttft_vs_uncached.png")


def _density_partial(plt: Any, df: pd.DataFrame, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    partial = token_only_residuals(df)
    d = df["semantic_density"].to_numpy()
    ax.scatter(d, partial, s=12, alpha=0.5, label=f"measurement (n={len(d)})")
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
    return save_figure(fig, out, "density_partial.png")


def _noise(plt: Any, df: pd.DataFrame, out: Path) -> str | None:
    key = repeat_key(df)
    med = df.groupby(key)["ttft_ms"].transform("median")
    counts = df.groupby(key)["ttft_ms"].transform("size")
    rep = df[counts >= 2]
    if rep.empty:
        return None
    dev = (rep["ttft_ms"] / med[counts >= 2] - 1) * 100
    stats = rep.groupby(key[counts >= 2])["ttft_ms"].agg(["mean", "std", "median"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].scatter(stats["median"], stats["std"] / stats["mean"] * 100, s=12, alpha=0.7)
    axes[0].set(xscale="log", xlabel="median TTFT of the unit (ms)", ylabel="CV of its repeats (%)",
                title=f"spread of repeats (n={len(stats)} units)")
    order = rep["timestamp"].rank(method="first") if "timestamp" in rep.columns else np.arange(len(rep))
    runs = rep["run_id"].astype(str) if "run_id" in rep.columns else pd.Series("run", index=rep.index)
    for run in sorted(runs.unique()):
        sel = (runs == run).to_numpy()
        axes[1].scatter(np.asarray(order)[sel], dev.to_numpy()[sel], s=6, alpha=0.6, label=run[:15])
        smooth = pd.Series(dev.to_numpy()[sel][np.argsort(np.asarray(order)[sel])]).rolling(25, center=True).median()
        axes[1].plot(np.sort(np.asarray(order)[sel]), smooth, c="k", lw=1)
    axes[1].axhline(0, c="grey", lw=1)
    axes[1].set(xlabel="measurement order", ylabel="deviation from the unit's median (%)",
                title=f"repeats over time (n={len(rep)}; line: rolling median of 25)")
    axes[1].legend(fontsize=7)
    return save_figure(fig, out, "noise.png")


def _throughput(plt: Any, table: pd.DataFrame, peak: float, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    share = table["share_of_peak"] * 100
    err = np.vstack([share - table["share_of_peak_lo"] * 100, table["share_of_peak_hi"] * 100 - share])
    ax.errorbar(table["tokens"], share, yerr=np.clip(err, 0, None), fmt="o-", capsize=3,
                label="median, 95% bootstrap interval")
    for _, row in table.iterrows():
        ax.annotate(f"n={int(row['n'])}\n{row['tokens_per_s']:.0f} tok/s", (row["tokens"], row["share_of_peak"] * 100),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    ax.axhline(100, c="grey", ls=":", label=f"matmul peak {peak:.0f} GFLOP/s")
    ax.set(xscale="log", xlabel="prompt tokens (cold, alone)", ylabel="prefill FLOP/s, % of matmul peak",
           title="Prefill against the hardware's limit", ylim=(0, 110))
    ax.set_xticks(table["tokens"], [str(int(t)) for t in table["tokens"]])
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, out, "throughput.png")

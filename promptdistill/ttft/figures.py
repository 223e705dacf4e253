"""The TTFT model's fit figure: the one picture stored beside every model in the registry.

``fit_figure`` draws held-out predictions against single measurements and against the
medians of repeats (``pred_vs_measured.png``); the night report and each spec's report
show it. The study's figures (``bench/ttft_study/figures.py``: TTFT against tokens,
residuals, density, noise, throughput) are drawn with the same helpers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from promptdistill.core.jsonio import atomic_write
from promptdistill.ttft.fit import FitResult
from promptdistill.ttft.noise import group_medians

__all__ = ["FIT_FIGURE", "fit_figure", "pyplot", "requests_alone", "save_figure"]

FIT_FIGURE = "pred_vs_measured"
"""The fit figure's name (``figure-pred_vs_measured.png`` beside the model in the registry)."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, imported only when a figure is drawn (slow to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out: Path, name: str) -> str:
    """Write ``fig`` to ``out / name`` atomically, close it, and return ``name``."""
    fig.tight_layout()
    # The temporary name does not end in .png: name the format.
    atomic_write(out / name, lambda tmp: fig.savefig(tmp, dpi=110, format=Path(name).suffix.lstrip(".") or "png"))
    pyplot().close(fig)
    return name


def requests_alone(df: pd.DataFrame) -> pd.Series:
    """True for rows of requests sent alone (not part of a queue probe's group)."""
    return df["batch_size"].fillna(1) <= 1 if "batch_size" in df.columns else pd.Series(True, index=df.index)


def fit_figure(fit: FitResult, out: Path) -> str:
    """``pred_vs_measured.png`` in ``out``: the chosen model on the held-out prompts; returns the file name."""
    plt = pyplot()
    test = fit.heldout_predictions
    pred = test[f"pred_{fit.chosen}"].to_numpy()
    y = test["ttft_ms"].to_numpy()
    h = fit.heldout[fit.chosen]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    alone = requests_alone(test).to_numpy()
    warm = test["warm"].to_numpy(bool)
    for name, sel, colour in (("cold", alone & ~warm, "tab:blue"), ("warm", alone & warm, "tab:orange"),
                              ("queued", ~alone, "tab:green")):
        if sel.any():
            ax.scatter(y[sel], pred[sel], s=12, alpha=0.5, c=colour, label=f"{name} (n={int(sel.sum())})")
    med = group_medians(test, pred)
    ax.scatter(med["ttft_ms"], med["pred"], s=30, facecolors="none", edgecolors="k", lw=0.8,
               label=f"median of repeats (n={len(med)})")
    lo, hi = float(min(y.min(), pred.min())), float(max(y.max(), pred.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax.set(xscale="log", yscale="log", xlabel="measured TTFT (ms)", ylabel="predicted TTFT (ms)",
           title=f"held-out prompts: {fit.chosen}\nMAPE {h['mape']:.1%} vs single, {h.get('mape_median', np.nan):.1%} vs medians")
    ax.legend(fontsize=8)
    return save_figure(fig, out, f"{FIT_FIGURE}.png")

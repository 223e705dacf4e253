"""The Pareto plot: dev quality against predicted TTFT, baseline and winner marked.

Left: every screened candidate's screen quality (colour: how examples are chosen; filled:
raced on the certify records, hollow: screened only) at its predicted TTFT, with a grey segment to its other
prediction (cold or warm): long for fixed examples the prefix cache serves, short for
per-request ones. The Pareto front is a step line, the SLO a vertical line.
Right: quality against the instruction's semantic density (the density curve).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["plot_pareto"]

_COLOURS = {"baseline": "black", "none": "tab:gray", "fixed": "tab:blue", "similar": "tab:orange"}


def plot_pareto(result: Any, path: str | os.PathLike[str]) -> None:
    """Draw ``result``'s Pareto front and density curve into a PNG at ``path``."""
    from promptdistill.ttft.figures import pyplot

    plt = pyplot()
    df = result.candidates[result.candidates["screen_quality"].notna()]
    cost = f"ttft_{result.ttft_kind}_ms"
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
    other = "ttft_cold_ms" if cost == "ttft_warm_ms" else "ttft_warm_ms"
    # What the prefix cache buys: a segment from each candidate's cold to its warm prediction.
    ax.hlines(df["screen_quality"], df[["ttft_cold_ms", "ttft_warm_ms"]].min(axis=1), df[["ttft_cold_ms", "ttft_warm_ms"]].max(axis=1),
              colors="lightgray", lw=1, zorder=0, label="cold <-> warm prediction")
    ax.scatter(df[other], df["screen_quality"], marker="|", c="gray", s=30, zorder=0)
    for strategy, part in df.groupby("strategy"):
        colour = _COLOURS.get(strategy, "tab:green")
        full = part[part["race_n"] > 0]
        partial = part[part["race_n"] == 0]
        if not full.empty:
            ax.scatter(full[cost], full["screen_quality"], c=colour, s=36, label=f"{strategy} (raced)")
        if not partial.empty:
            ax.scatter(partial[cost], partial["screen_quality"], facecolors="none", edgecolors=colour, s=36,
                       label=f"{strategy} (screened only)")
    front = result.pareto.sort_values(cost)
    if not front.empty:
        ax.step(front[cost], front["screen_quality"], where="post", color="tab:red", lw=1.2, label="Pareto front")
    for flag, marker, name in (("is_baseline", "s", "baseline"), ("is_winner", "*", "winner")):
        row = result.candidates[result.candidates[flag]]
        if not row.empty:
            ax.scatter(row[cost], row["screen_quality"], marker=marker, s=220, facecolors="none", edgecolors="crimson",
                       linewidths=2, label=f"{name}: {row['candidate_id'].iloc[0]}")
    if result.slo_ttft_ms is not None:
        ax.axvline(result.slo_ttft_ms, color="tab:purple", ls="--", lw=1, label=f"SLO {result.slo_ttft_ms:g} ms")
    ax.set_xlabel(f"predicted TTFT, {result.ttft_kind} prefix cache (ms)")
    ax.set_ylabel("screen quality (mean score)")
    ax.set_title(f"{result.spec_name}: quality vs predicted TTFT")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    curve = result.density_curve
    if not curve.empty:
        ax2.plot(curve["semantic_density"], curve["quality"], "o-", color="tab:blue", label="mean over example settings")
        ax2.plot(curve["semantic_density"], curve["best_quality"], "^--", color="tab:green", label="best candidate")
        peak = curve[curve["peak"]]
        ax2.scatter(peak["semantic_density"], peak["quality"], s=160, facecolors="none", edgecolors="crimson", label="peak")
        ax2.legend(fontsize=7)
    ax2.set_xlabel("semantic density of the instruction")
    ax2.set_ylabel("screen quality")
    ax2.set_title("quality vs density")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)

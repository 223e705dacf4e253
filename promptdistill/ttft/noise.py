"""The noise floor: how much repeated measurements of the same prompt disagree.

The profiler measures every (prompt, cold/warm) unit in several rounds, each round a
fresh permutation spread over minutes, so repeats see whatever drifts on the machine in
the meantime. Those repeats say how well *any* model could do:

* per-prompt spread: the coefficient of variation (std / mean) and the relative median
  absolute deviation (MAD / median) of each unit's repeats;
* ``floor_vs_singles``: the MAPE of a perfect model against single measurements, taken
  as predicting each unit's own median. In-sample, so optimistic: with three repeats one
  of them *is* the median. Beside it the leave-one-out version (each repeat predicted by
  the median of the others, pessimistic) and ``floor_vs_singles_pooled``, a perfect
  model's expected MAPE on new single measurements, from the pooled deviations below;
* ``floor_vs_medians``: the error of the per-unit median itself: even a perfect model
  is this far, on average, from the median of the few repeats a held-out prompt has.
  The noise is multiplicative (the machine runs faster or slower for a while, whatever
  the prompt), so every unit's relative deviations from its own mean are pooled (scaled
  by sqrt(n / (n - 1)) for the mean they were taken from) and the median of ``n`` draws
  from that pool is simulated for each unit's ``n``. Resampling a unit's own two or three
  repeats instead would understate it: a bootstrap median of three values can only ever
  be one of them.

A model scored against medians can get close to ``floor_vs_medians`` only if it captures
everything systematic; the same holds for ``floor_vs_singles`` against single rows.
Intervals are 95% bootstrap intervals over units (prompts), never over rows: repeats of
one prompt are not independent evidence.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

__all__ = ["group_medians", "noise_floor", "repeat_key"]


def repeat_key(df: pd.DataFrame) -> pd.Series:
    """Which rows are repeats of the same measurement: prompt, cold/warm, place in a queue."""
    key = df["prompt_id"].astype(str)
    for col in ("warm", "tokens_ahead", "batch_tokens"):
        if col in df.columns:
            key = key + "|" + df[col].astype(str)
    return key


def group_medians(df: pd.DataFrame, pred: np.ndarray | None = None) -> pd.DataFrame:
    """Per repeated unit: its median TTFT (and median prediction), and how many repeats."""
    frame = pd.DataFrame({"key": repeat_key(df).to_numpy(), "ttft_ms": df["ttft_ms"].to_numpy(dtype=np.float64)})
    if pred is not None:
        frame["pred"] = np.asarray(pred, dtype=np.float64)
    out = frame.groupby("key", sort=True).median()
    out["n"] = frame.groupby("key", sort=True).size()
    return out


def _units(df: pd.DataFrame, min_repeats: int) -> list[np.ndarray]:
    values = df["ttft_ms"].to_numpy(dtype=np.float64)
    keys = repeat_key(df).to_numpy()
    order = np.argsort(keys, kind="stable")
    splits = np.flatnonzero(keys[order][1:] != keys[order][:-1]) + 1
    return [values[idx] for idx in np.split(order, splits) if len(idx) >= min_repeats]


def _unit_stats(y: np.ndarray) -> dict[str, Any]:
    med, mean = float(np.median(y)), float(np.mean(y))
    loo = [abs(y[i] - np.median(np.delete(y, i))) / y[i] for i in range(len(y))]
    return {
        "n": len(y),
        "cv": float(np.std(y, ddof=1) / mean),
        "rel_mad": float(np.median(np.abs(y - med)) / med),
        "ape_own_median_sum": float(np.sum(np.abs(y - med) / y)),
        "ape_loo_sum": float(np.sum(loo)),
        # Relative deviations from the unit's mean, scaled for the mean being their own.
        "deviations": (y / mean - 1.0) * np.sqrt(len(y) / (len(y) - 1)),
    }


def _single_error(stats: pd.DataFrame) -> float:
    """E|y - m| / y for a new measurement y of a unit whose true median is m (pooled)."""
    pool = np.concatenate(stats["deviations"].to_list())
    centre = float(np.median(pool))
    return float(np.mean(np.abs(pool - centre) / np.maximum(1 + pool, 1e-9)))


def _median_error(stats: pd.DataFrame, rng: np.random.Generator, draws: int) -> float:
    """Mean over units of E|median of n draws from the pooled deviations - their median|."""
    pool = np.concatenate(stats["deviations"].to_list())
    centre = float(np.median(pool))
    error = {n: float(np.mean(np.abs(np.median(rng.choice(pool, size=(draws, n)), axis=1) - centre))) / (1 + centre)
             for n in stats["n"].unique()}
    return float(stats["n"].map(error).mean())


def noise_floor(df: pd.DataFrame, *, n_boot: int = 500, seed: int = 0, min_repeats: int = 2) -> dict[str, Any]:
    """The noise floor of measurement rows (usable rows: see ``fit.check_frame``).

    Returns:
        ``units`` and ``rows`` (with at least ``min_repeats`` repeats), ``repeats_median``,
        ``cv_median``, ``cv_mean``, ``rel_mad_median``, ``floor_vs_singles``,
        ``floor_vs_singles_loo``, ``floor_vs_singles_pooled``, ``floor_vs_medians``, each figure with a ``*_ci``
        95% interval over units; all NaN when no unit was repeated.
    """
    units = _units(df, min_repeats)
    keys = ("cv_median", "cv_mean", "rel_mad_median", "floor_vs_singles", "floor_vs_singles_loo",
            "floor_vs_singles_pooled", "floor_vs_medians")
    if not units:
        return {"units": 0, "rows": 0, "repeats_median": 0, **{k: float("nan") for k in keys},
                **{f"{k}_ci": (float("nan"), float("nan")) for k in keys}, "n_boot": n_boot}
    rng = np.random.default_rng(seed)
    stats = pd.DataFrame([_unit_stats(y) for y in units])

    def figures(s: pd.DataFrame, draws: int = 400) -> dict[str, float]:
        rows = s["n"].sum()
        return {
            "cv_median": float(s["cv"].median()),
            "cv_mean": float(s["cv"].mean()),
            "rel_mad_median": float(s["rel_mad"].median()),
            "floor_vs_singles": float(s["ape_own_median_sum"].sum() / rows),
            "floor_vs_singles_loo": float(s["ape_loo_sum"].sum() / rows),
            "floor_vs_singles_pooled": _single_error(s),
            "floor_vs_medians": _median_error(s, rng, draws),
        }

    point = figures(stats, draws=20_000)
    draws = [figures(stats.iloc[rng.integers(0, len(stats), len(stats))]) for _ in range(n_boot)]
    out: dict[str, Any] = {"units": len(units), "rows": int(stats["n"].sum()),
                           "repeats_median": float(stats["n"].median()), **point, "n_boot": n_boot}
    for k in keys:
        values = [d[k] for d in draws]
        out[f"{k}_ci"] = (float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5)))
    return out

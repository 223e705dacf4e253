"""Fit the load TTFT model and measure its held-out error against the noise floor.

* **Held-out error**: leave one prompt out: the model fitted on every other prompt
  predicts each of its cells; the error is the absolute percentage error against each
  repeat's measured percentile (single runs, as a decision meets them).
* **Noise floor**: what a perfect model would score against single runs: per cell, each
  repeat's deviation from the cell's mean, scaled by ``sqrt(n / (n - 1))`` for the mean
  it was taken from (for two repeats, ``|a - b| / sqrt(2)`` of each), relative to the
  repeat, averaged.

Both per load (``concurrency 8``, ``2.5 req/s``...), with 95% bootstrap intervals over
prompts (repeats of one prompt are not independent evidence), and the ratio error /
floor that the acceptance rule reads (at most 1.2 at concurrency 8 and 32).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from promptdistill.load.model import LoadTTFTModel
from promptdistill.specs.model import Load

__all__ = ["held_out_errors", "load_error_table", "noise_floor"]


def _load_name(kind: str, value: float) -> str:
    return Load(rate_rps=value).describe() if kind == "rate" else Load(concurrency=int(value)).describe()


def _group(cell: Mapping[str, Any]) -> tuple[str, float]:
    """Which row of the error table a cell counts in: its concurrency, or for a rate the
    share of the template's capacity it was measured at (each template has its own rates)."""
    if cell["load_kind"] == "rate" and cell.get("rate_share") is not None:
        return "share", float(cell["rate_share"])
    return cell["load_kind"], float(cell["load_value"])


def _group_name(key: tuple[str, float]) -> str:
    return f"rate at {key[1]:.0%} of capacity" if key[0] == "share" else _load_name(*key)


def _ci(per_prompt: Mapping[str, list[float]], seed: int = 0, n_boot: int = 2000) -> tuple[float, float, float]:
    groups = [np.asarray(v) for v in per_prompt.values() if v]
    allv = np.concatenate(groups)
    if len(groups) < 2:
        return float(allv.mean()), math.nan, math.nan
    rng = np.random.default_rng(seed)
    boots = [np.concatenate([groups[i] for i in rng.integers(0, len(groups), len(groups))]).mean()
             for _ in range(n_boot)]
    low, high = np.quantile(boots, [0.025, 0.975])
    return float(allv.mean()), float(low), float(high)


def held_out_errors(cells: Sequence[Mapping[str, Any]], percentile: float = 95.0) -> list[dict[str, Any]]:
    """Per cell (each repeat): the leave-one-prompt-out prediction and its error. A held-out
    rate cell the model calls unsustainable is reported with ``predicted_ms`` inf."""
    out = []
    prompts = sorted({c["prompt_id"] for c in cells})
    for pid in prompts:
        train = [c for c in cells if c["prompt_id"] != pid]
        try:
            model = LoadTTFTModel(percentile).fit(train)
        except ValueError:  # too few other prompts to fit without this one: no held-out figure for it
            continue
        for c in (c for c in cells if c["prompt_id"] == pid):
            if c["load_kind"] not in model.coef_:
                continue
            pred = model.predict_one(c, c["load_kind"], float(c["load_value"]))
            out.append({"prompt_id": pid, "load_kind": c["load_kind"], "load_value": float(c["load_value"]),
                        "group": _group(c), "repeat": c.get("repeat", 0), "measured_ms": float(c["ttft_ms"]), "predicted_ms": pred,
                        "abs_pct_err": abs(pred - c["ttft_ms"]) / c["ttft_ms"] if math.isfinite(pred) else None})
    return out


def noise_floor(cells: Sequence[Mapping[str, Any]]) -> dict[tuple[str, float], dict[str, list[float]]]:
    """Per load (a concurrency, or a rate's share of capacity), per prompt: each repeat's
    scaled relative deviation from its cell's mean."""
    by_cell: dict[tuple[str, str, float], list[float]] = {}
    keys: dict[tuple[str, str, float], tuple[str, float]] = {}
    for c in cells:
        cell = (c["prompt_id"], c["load_kind"], float(c["load_value"]))
        by_cell.setdefault(cell, []).append(float(c["ttft_ms"]))
        keys[cell] = _group(c)
    out: dict[tuple[str, float], dict[str, list[float]]] = {}
    for (pid, kind, value), xs in by_cell.items():
        if len(xs) < 2:
            continue
        mean, scale = float(np.mean(xs)), math.sqrt(len(xs) / (len(xs) - 1))
        out.setdefault(keys[pid, kind, value], {}).setdefault(pid, []).extend(abs(x - mean) * scale / x for x in xs)
    return out


def load_error_table(cells: Sequence[Mapping[str, Any]], percentile: float = 95.0) -> list[dict[str, Any]]:
    """Per load: held-out MAPE and the noise floor, each with its interval and n, and their ratio."""
    errors = held_out_errors(cells, percentile)
    floor = noise_floor(cells)
    rows = []
    for kind, value in sorted({e["group"] for e in errors}):
        per_prompt: dict[str, list[float]] = {}
        unsustainable = 0
        for e in errors:
            if e["group"] == (kind, value):
                if e["abs_pct_err"] is None:
                    unsustainable += 1
                else:
                    per_prompt.setdefault(e["prompt_id"], []).append(e["abs_pct_err"])
        if not per_prompt:
            continue
        err, err_lo, err_hi = _ci(per_prompt)
        row = {"load": _group_name((kind, value)), "load_kind": "rate" if kind == "share" else kind,
               "load_value": value, "rate_share": value if kind == "share" else None,
               "mape": err, "mape_low": err_lo, "mape_high": err_hi,
               "cells": sum(len(v) for v in per_prompt.values()), "prompts": len(per_prompt),
               "called_unsustainable": unsustainable}
        if (kind, value) in floor:
            f, f_lo, f_hi = _ci(floor[kind, value])
            row.update({"floor": f, "floor_low": f_lo, "floor_high": f_hi, "ratio": err / f if f > 0 else None})
        rows.append(row)
    return rows

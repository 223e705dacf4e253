"""The TTFT study's questions: coefficients with confidence intervals, whether semantic
density moves TTFT once tokens are accounted for, the few-shot table, prefill throughput
against the hardware's matmul peak (and the ceiling it sets on batching), and what
requests sent together wait for.

FLOPs are counted from the model's shape (``hardware.ModelFlops``, recorded with every
profile):

* linear layers: ``2 x matmul_params`` per token (one multiply and one add per weight);
  the embedding lookup does no arithmetic, and the LM head runs only for the token being
  sampled (vLLM computes logits for the last prompt token only);
* attention: for a token at position ``i``, ``QK^T`` and ``AV`` cost ``2 x 2 x i x width``
  per layer, so a causal prefill of ``n`` new tokens after ``c`` cached ones costs
  ``2 x layers x width x (n^2 + 2nc)`` (up to terms linear in ``n``).

Uncertainty comes from a grouped bootstrap: prompts are resampled with replacement
(all repeats of a drawn prompt come along), the linear model is refitted on each
resample, and the 2.5th/97.5th percentiles of each coefficient form its 95% interval.
Resampling prompts rather than rows keeps repeats from posing as independent evidence.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
from sklearn.base import clone

from promptdistill.ttft.estimators import (
    DERIVED_FEATURES,
    MECHANICS_TERMS,
    MonomialRegressor,
    with_mechanics,
)
from promptdistill.ttft.fit import mechanics_of, model_inputs
from promptdistill.ttft.hardware import ModelFlops

__all__ = [
    "ANALYSIS_TERMS",
    "CLAIMED_DENSITY_BETA",
    "CLAIMED_FEWSHOT_MS",
    "DENSITY_HINGE",
    "LADDER_SIZES",
    "batched_ceiling",
    "bootstrap_coefficients",
    "decode_flops",
    "density_effect",
    "fewshot_table",
    "prefill_flops",
    "prefill_throughput",
    "queue_table",
    "request_flops",
    "term_names",
    "token_only_residuals",
]

CLAIMED_DENSITY_BETA = 0.87
"""The shared claim: standardised density coefficient +0.87 (p < 0.001), steep above 0.65."""
CLAIMED_FEWSHOT_MS = {1: 127.0, 4: 316.0, 8: 492.0}
"""The same source's TTFT for 1/4/8 examples of ~64 tokens on a 512-token base."""

DENSITY_HINGE = 0.65
"""The density above which the same claim says TTFT rises steeply."""

_TOKEN_TERMS = MECHANICS_TERMS  # the token mechanics alone: no text features
ANALYSIS_TERMS: tuple[tuple[int, ...], ...] = (
    *MECHANICS_TERMS,
    *((DERIVED_FEATURES.index(name),) for name in ("fewshot_count", "semantic_density", "entropy_bits")),
)
"""The mechanics plus the prompt's shape and text: the model the coefficient table and the
density question are read from (the TTFT model leaves the text out)."""


def term_names(terms: Sequence[Sequence[int]], features: Sequence[str] = DERIVED_FEATURES) -> list[str]:
    """Readable names: ``uncached_tokens^2``, ``uncached_tokens*cached_tokens``."""
    names = []
    for term in terms:
        parts = []
        for i in sorted(set(term)):
            power = list(term).count(i)
            parts.append(features[i] if power == 1 else f"{features[i]}^{power}")
        names.append("*".join(parts))
    return names


def _X(df: pd.DataFrame, extra: dict[str, np.ndarray] | None = None) -> np.ndarray:
    X = model_inputs(df)
    if extra:
        X = np.column_stack([X, *extra.values()])
    return X


def _hinge(df: pd.DataFrame) -> np.ndarray:
    return np.maximum(0.0, df["semantic_density"].to_numpy(dtype=np.float64) - DENSITY_HINGE)


def _linear(df: pd.DataFrame, terms: tuple) -> object:
    """The linear model with the engine mechanics of these rows (extra columns pass through)."""
    return with_mechanics(MonomialRegressor(terms=terms), **mechanics_of(df))


def _fit_coef(df: pd.DataFrame, terms: tuple, with_hinge: bool, mechanics: dict) -> tuple[np.ndarray, float]:
    X = _X(df, {"hinge": _hinge(df)} if with_hinge else None)
    model = with_mechanics(MonomialRegressor(terms=terms), **mechanics).fit(X, df["ttft_ms"].to_numpy(dtype=np.float64))
    reg = model.steps[-1][1]
    return reg.coef_, reg.intercept_


def bootstrap_coefficients(
    df: pd.DataFrame, *, n_boot: int = 500, seed: int = 0, with_hinge: bool = False
) -> pd.DataFrame:
    """The linear model's coefficients with grouped-bootstrap 95% intervals.

    Args:
        df: measurement rows with the model features, ``ttft_ms`` and ``prompt_id``.
        n_boot: bootstrap resamples.
        with_hinge: add ``max(0, density - 0.65)``, the claim's "steep above 0.65" term.

    Returns:
        One row per term (and the intercept): ``term, coef, ci_low, ci_high, p_boot,
        std_beta`` (coefficient in standard deviations of TTFT per standard deviation
        of the term, comparable with a "beta"), in milliseconds per unit.
        ``p_boot`` is the two-sided bootstrap share of resamples on the other side of 0.
    """
    terms = ANALYSIS_TERMS + (((len(DERIVED_FEATURES),),) if with_hinge else ())
    names = term_names(terms, (*DERIVED_FEATURES, f"max(0, semantic_density - {DENSITY_HINGE})"))
    mechanics = mechanics_of(df)
    coef, intercept = _fit_coef(df, terms, with_hinge, mechanics)
    groups = df["prompt_id"].astype(str).to_numpy()
    unique = np.unique(groups)
    index_of = {g: np.flatnonzero(groups == g) for g in unique}
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        picked = rng.choice(unique, size=len(unique), replace=True)
        rows = np.concatenate([index_of[g] for g in picked])
        c, b = _fit_coef(df.iloc[rows], terms, with_hinge, mechanics)
        draws.append(np.append(c, b))
    draws = np.asarray(draws)
    design = _linear(df, terms).steps[0][1].fit_transform(_X(df, {"hinge": _hinge(df)} if with_hinge else None))
    term_sd = np.array([np.std(np.prod(design[:, list(t)], axis=1)) for t in terms])
    y_sd = float(np.std(df["ttft_ms"]))
    estimates = np.append(coef, intercept)
    low, high = np.percentile(draws, [2.5, 97.5], axis=0)
    p = np.minimum(1.0, 2 * np.minimum((draws <= 0).mean(axis=0), (draws >= 0).mean(axis=0)))
    return pd.DataFrame(
        {
            "term": [*names, "intercept"],
            "coef": estimates,
            "ci_low": low,
            "ci_high": high,
            "p_boot": p,
            "std_beta": np.append(coef * term_sd / y_sd, np.nan),
        }
    )


def token_only_residuals(df: pd.DataFrame) -> np.ndarray:
    """TTFT minus what the token terms alone predict (for the density partial-residual plot)."""
    X = _X(df)
    y = df["ttft_ms"].to_numpy(dtype=np.float64)
    return y - _linear(df, _TOKEN_TERMS).fit(X, y).predict(X)


def density_effect(df: pd.DataFrame, *, n_boot: int = 500, seed: int = 0) -> dict[str, Any]:
    """Does semantic density change TTFT once token counts are controlled?

    Returns the density coefficient of the full linear model (ms per unit density) with
    its interval, the effect across the measured density range (5th to 95th
    percentile) in ms and as a share of the median TTFT, the standardised beta to set
    against the claimed +0.87, and the hinge coefficient above 0.65 with its interval.
    """
    table = bootstrap_coefficients(df, n_boot=n_boot, seed=seed).set_index("term")
    hinge = bootstrap_coefficients(df, n_boot=n_boot, seed=seed + 1, with_hinge=True).set_index("term")
    row = table.loc["semantic_density"]
    hinge_row = hinge.loc[f"max(0, semantic_density - {DENSITY_HINGE})"]
    d = df["semantic_density"].to_numpy(dtype=np.float64)
    span = float(np.percentile(d, 95) - np.percentile(d, 5))
    median_ttft = float(np.median(df["ttft_ms"]))
    effect_ms = float(row["coef"]) * span
    excludes_zero = bool(row["ci_low"] > 0 or row["ci_high"] < 0)
    return {
        "coef_ms_per_unit": float(row["coef"]),
        "ci_low": float(row["ci_low"]),
        "ci_high": float(row["ci_high"]),
        "p_boot": float(row["p_boot"]),
        "std_beta": float(row["std_beta"]),
        "claimed_std_beta": CLAIMED_DENSITY_BETA,
        "density_p5": float(np.percentile(d, 5)),
        "density_p95": float(np.percentile(d, 95)),
        "effect_over_range_ms": effect_ms,
        "effect_over_range_ms_ci": (float(row["ci_low"]) * span, float(row["ci_high"]) * span),
        "effect_share_of_median_ttft": effect_ms / median_ttft if median_ttft else float("nan"),
        "median_ttft_ms": median_ttft,
        "ci_excludes_zero": excludes_zero,
        "hinge_coef_ms_per_unit": float(hinge_row["coef"]),
        "hinge_ci": (float(hinge_row["ci_low"]), float(hinge_row["ci_high"])),
        "rows_above_hinge": int((d > DENSITY_HINGE).sum()),
        "n_rows": int(len(df)),
        "n_prompts": int(df["prompt_id"].nunique()),
        "n_boot": n_boot,
    }


def fewshot_table(df: pd.DataFrame) -> pd.DataFrame:
    """TTFT by few-shot count for the dedicated few-shot probe (cold, 512-token base).

    Uses rows whose ``design`` is ``fewshot_probe``. Returns one row per count with the
    median and IQR of TTFT, the increment over zero examples, the measured tokens, and
    the claimed figure where the claim gives one.
    """
    probe = df[df.get("design", pd.Series("", index=df.index)) == "fewshot_probe"]
    if probe.empty:
        return pd.DataFrame(columns=["fewshot_count", "n", "total_tokens", "fewshot_tokens", "ttft_ms_median"])
    rows = []
    for k, g in probe.groupby("fewshot_count"):
        rows.append(
            {
                "fewshot_count": int(k),
                "n": int(len(g)),
                "total_tokens": float(g["total_tokens"].median()),
                "fewshot_tokens": float(g["fewshot_tokens"].median()) if "fewshot_tokens" in g else float("nan"),
                "ttft_ms_median": float(g["ttft_ms"].median()),
                "ttft_ms_p25": float(g["ttft_ms"].quantile(0.25)),
                "ttft_ms_p75": float(g["ttft_ms"].quantile(0.75)),
                "claimed_ms": CLAIMED_FEWSHOT_MS.get(int(k), float("nan")),
            }
        )
    out = pd.DataFrame(rows).sort_values("fewshot_count").reset_index(drop=True)
    base = out.loc[out["fewshot_count"] == 0, "ttft_ms_median"]
    out["increment_over_0_ms"] = out["ttft_ms_median"] - (float(base.iloc[0]) if len(base) else np.nan)
    return out


# --- the hardware's limit and the queue ---------------------------------------------------------

LADDER_SIZES = (128, 256, 512, 1024, 2048)
"""Prompt sizes the throughput table reports (the ladder design measures them exactly)."""


def prefill_flops(model: ModelFlops, new_tokens: Any, cached_tokens: Any = 0) -> Any:
    """FLOPs of a prefill of ``new_tokens`` after ``cached_tokens`` (arrays work too)."""
    n, c = new_tokens, cached_tokens
    linear = 2.0 * model.matmul_params * n
    attention = 2.0 * model.layers * model.attn_width * (n * n + 2 * n * c)
    head = 2.0 * model.vocab * model.hidden  # logits of the last token only
    return linear + attention + head


def decode_flops(model: ModelFlops, context_tokens: Any) -> Any:
    """FLOPs of one decoded token over ``context_tokens`` of context."""
    return 2.0 * model.matmul_params + 4.0 * model.layers * model.attn_width * context_tokens + 2.0 * model.vocab * model.hidden


def request_flops(model: ModelFlops, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
    """A whole request: prefill of the tokens the prefix cache did not hold (each over its
    causal context), then each generated token after the first over its context."""
    cached = min(max(0, cached_tokens), prompt_tokens)
    total = float(prefill_flops(model, prompt_tokens - cached, cached))
    for i in range(1, max(0, completion_tokens)):
        total += float(decode_flops(model, prompt_tokens + i))
    return total


def _alone_cold(df: pd.DataFrame) -> pd.DataFrame:
    rows = df[df["cached_tokens"] == 0]
    if "batch_size" in rows.columns:
        rows = rows[rows["batch_size"].fillna(1) <= 1]
    return rows


def _boot_median(values: np.ndarray, rng: np.random.Generator, n_boot: int) -> tuple[float, float]:
    draws = np.median(rng.choice(values, size=(n_boot, len(values)), replace=True), axis=1)
    return float(np.percentile(draws, 2.5)), float(np.percentile(draws, 97.5))


def prefill_throughput(df: pd.DataFrame, *, sizes: tuple[int, ...] = LADDER_SIZES, tolerance: float = 0.1,
                       n_boot: int = 500, seed: int = 0) -> pd.DataFrame:
    """Cold prefill throughput at fixed sizes, and its share of the measured matmul peak.

    Uses cold rows of requests sent alone whose uncached tokens lie within
    ``tolerance`` of each size (the largest size also takes the longest prompts the
    context allows). FLOPs per request come from the profile's ``model_*`` columns
    (``hardware.ModelFlops``), the peak from ``hw_matmul_gflops``; figures are medians
    over measurements with 95% bootstrap intervals (resampling measurements).

    Returns:
        One row per size with measurements: ``tokens``, ``n``, ``prompts``,
        ``ttft_ms`` (+ ``_lo``/``_hi``), ``tokens_per_s`` (+ interval), ``gflops``,
        ``share_of_peak`` (+ interval; NaN without a peak or model columns).
    """
    rows = _alone_cold(df)
    flops = ModelFlops.from_columns(df.iloc[0]) if len(df) else None
    peak = float(df["hw_matmul_gflops"].max()) if "hw_matmul_gflops" in df.columns else float("nan")
    longest = float(rows["uncached_tokens"].max()) if len(rows) else 0.0
    rng = np.random.default_rng(seed)
    out = []
    for size in sizes:
        lo, hi = size * (1 - tolerance), size * (1 + tolerance)
        if size > longest >= lo * 0.9:  # the context limit caps the largest size: take the longest prompts
            lo = longest * (1 - tolerance / 2)
        sel = rows[(rows["uncached_tokens"] >= lo) & (rows["uncached_tokens"] <= hi)]
        if sel.empty:
            continue
        n = sel["uncached_tokens"].to_numpy(dtype=np.float64)
        t = sel["ttft_ms"].to_numpy(dtype=np.float64) / 1000.0
        tps = n / t
        gflops = (prefill_flops(flops, n) / t / 1e9) if flops else np.full(len(t), np.nan)
        share = gflops / peak
        row = {"tokens": size, "tokens_measured": float(np.median(n)), "n": int(len(sel)),
               "prompts": int(sel["prompt_id"].nunique()), "ttft_ms": float(np.median(t) * 1000)}
        for name, values in (("tokens_per_s", tps), ("gflops", gflops), ("share_of_peak", share)):
            row[name] = float(np.median(values))
            row[f"{name}_lo"], row[f"{name}_hi"] = _boot_median(values, rng, n_boot) if np.isfinite(values).all() else (np.nan, np.nan)
        out.append(row)
    return pd.DataFrame(out)


def batched_ceiling(serial_wall_s: float, total_flops: float, peak_gflops: float) -> dict[str, float]:
    """How much faster than the serial run any batching could be on this machine.

    A batch can do its arithmetic no faster than the matmul peak, so its wall time is at
    least ``total_flops / peak``; the batched/serial throughput ratio is therefore at most
    ``serial_wall_s / (total_flops / peak)``, which is ``1 / (the serial run's share of
    peak)``.
    """
    floor_s = total_flops / (peak_gflops * 1e9)
    serial_share = floor_s / serial_wall_s if serial_wall_s > 0 else float("nan")
    return {"compute_floor_s": floor_s, "serial_share_of_peak": serial_share,
            "ceiling_ratio": serial_wall_s / floor_s if floor_s > 0 else float("nan")}


def queue_table(df: pd.DataFrame, estimator: object) -> tuple[pd.DataFrame, dict[str, float]]:
    """Requests sent together (the queue probe), each batch predicted by the model fitted
    without it (leave one batch out), and by the same model told the request was alone.

    Returns:
        One row per (batch, position): the tokens ahead and in the batch, the median
        measured TTFT, the prediction with the queue features and alone; and the MAPE
        of both against the medians (``mape_queue``, ``mape_alone``, ``n``).
    """
    if "batch_size" not in df.columns or not (df["batch_size"].fillna(1) > 1).any():
        return pd.DataFrame(), {}
    queued = df["batch_size"].fillna(1) > 1
    X, y = _X(df), df["ttft_ms"].to_numpy(dtype=np.float64)
    alone = X.copy()
    alone[:, -2:] = 0.0  # tokens_ahead, batch_tokens: as if each request came alone
    rows = []
    for batch, idx in df[queued].groupby("split_group").groups.items():
        train = ~df.index.isin(idx)
        model = clone(estimator).fit(X[train], y[train])
        pos = df.index.get_indexer(idx)
        part = df.loc[idx].assign(pred=model.predict(X[pos]), pred_alone=model.predict(alone[pos]))
        for p, g in part.groupby("batch_position"):
            rows.append({"batch": batch, "position": int(p), "uncached_tokens": float(g["uncached_tokens"].median()),
                         "tokens_ahead": float(g["tokens_ahead"].median()), "batch_tokens": float(g["batch_tokens"].median()),
                         "n": int(len(g)), "ttft_ms": float(g["ttft_ms"].median()), "predicted_ms": float(g["pred"].median()),
                         "predicted_alone_ms": float(g["pred_alone"].median())})
    table = pd.DataFrame(rows).sort_values(["batch", "position"]).reset_index(drop=True)
    err = lambda col: float(np.mean(np.abs(table[col] - table["ttft_ms"]) / table["ttft_ms"]))  # noqa: E731
    return table, {"mape_queue": err("predicted_ms"), "mape_alone": err("predicted_alone_ms"), "n": int(len(table))}

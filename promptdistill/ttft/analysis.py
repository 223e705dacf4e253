"""Questions the measurements answer: coefficients with confidence intervals, whether
semantic density moves TTFT once tokens are accounted for, and the few-shot table.

Uncertainty comes from a grouped bootstrap: prompts are resampled with replacement
(all repeats of a drawn prompt come along), the linear model is refitted on each
resample, and the 2.5th/97.5th percentiles of each coefficient form its 95% interval.
Resampling prompts rather than rows keeps repeats from posing as independent evidence.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from promptdistill.ttft.estimators import (
    DENSITY_HINGE,
    LINEAR_TERMS,
    MODEL_FEATURES,
    MonomialRegressor,
    term_names,
)

__all__ = [
    "CLAIMED_DENSITY_BETA",
    "CLAIMED_FEWSHOT_MS",
    "bootstrap_coefficients",
    "density_effect",
    "fewshot_table",
    "token_only_residuals",
]

CLAIMED_DENSITY_BETA = 0.87
"""The shared claim: standardised density coefficient +0.87 (p < 0.001), steep above 0.65."""
CLAIMED_FEWSHOT_MS = {1: 127.0, 4: 316.0, 8: 492.0}
"""The same source's TTFT for 1/4/8 examples of ~64 tokens on a 512-token base."""

_TOKEN_TERMS = LINEAR_TERMS[:4]  # uncached, uncached², cached, uncached·cached
_D = MODEL_FEATURES.index("semantic_density")


def _X(df: pd.DataFrame, extra: dict[str, np.ndarray] | None = None) -> np.ndarray:
    X = df[list(MODEL_FEATURES)].to_numpy(dtype=np.float64)
    if extra:
        X = np.column_stack([X, *extra.values()])
    return X


def _hinge(df: pd.DataFrame) -> np.ndarray:
    return np.maximum(0.0, df["semantic_density"].to_numpy(dtype=np.float64) - DENSITY_HINGE)


def _fit_coef(df: pd.DataFrame, terms: tuple, with_hinge: bool) -> tuple[np.ndarray, float]:
    X = _X(df, {"hinge": _hinge(df)} if with_hinge else None)
    model = MonomialRegressor(terms=terms).fit(X, df["ttft_ms"].to_numpy(dtype=np.float64))
    return model.coef_, model.intercept_


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
    terms = LINEAR_TERMS + (((len(MODEL_FEATURES),),) if with_hinge else ())
    names = term_names(terms, (*MODEL_FEATURES, f"max(0, semantic_density - {DENSITY_HINGE})"))
    coef, intercept = _fit_coef(df, terms, with_hinge)
    groups = df["prompt_id"].astype(str).to_numpy()
    unique = np.unique(groups)
    index_of = {g: np.flatnonzero(groups == g) for g in unique}
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        picked = rng.choice(unique, size=len(unique), replace=True)
        rows = np.concatenate([index_of[g] for g in picked])
        c, b = _fit_coef(df.iloc[rows], terms, with_hinge)
        draws.append(np.append(c, b))
    draws = np.asarray(draws)
    design = _X(df, {"hinge": _hinge(df)} if with_hinge else None)
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
    return y - MonomialRegressor(terms=_TOKEN_TERMS).fit(X, y).predict(X)


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

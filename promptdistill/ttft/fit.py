"""Model selection for TTFT: grouped cross-validation, a held-out split, one winner.

Rows are single measurements; repeats of one prompt share a ``prompt_id``. Every split
here is by prompt (``GroupShuffleSplit`` for the held-out set, ``GroupKFold`` for
cross-validation), so a prompt's repeats never sit on both sides of a split and the
scores measure prediction on prompts the model has not seen. Requests measured together
(the profiler's queue probe) share a ``split_group`` and stay on one side together.

Every score is given twice: MAPE against single measurements (``mape``), which the
measurement noise bounds from below (see :mod:`promptdistill.ttft.noise`), and against
each repeated unit's median (``mape_median``), which says how well the model captures
the systematic part.

The winner is the candidate with the lowest cross-validated MAPE against medians among
those that respect the two facts the optimizer relies on, checked over the measured
range: fewer uncached tokens are never predicted slower, and a prompt whose prefix is
served from the cache is never predicted slower than the same prompt computed whole.

The candidates model the engine's mechanics (``estimators.EngineMechanics``) with the
cache block and prefill chunk sizes the profiler recorded (``cache_block_tokens``,
``prefill_chunk_tokens`` columns); without them the block is the gcd of the cached
counts seen, and prefill is taken as one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.metrics import mean_absolute_percentage_error, r2_score
from sklearn.model_selection import GroupKFold, GroupShuffleSplit
from threadpoolctl import threadpool_limits

from promptdistill.engine.base import EngineIdentity
from promptdistill.ttft.estimators import (
    BASE_FEATURES,
    MODEL_FEATURES,
    candidate_estimators,
)
from promptdistill.ttft.noise import repeat_key

__all__ = [
    "FitResult",
    "MIN_FIT_PROMPTS",
    "check_frame",
    "engine_rows",
    "fit_models",
    "flag_contended",
    "identity_of",
    "is_monotonic_in_uncached",
    "never_slower_when_cached",
    "mechanics_of",
    "model_inputs",
    "score",
]

REQUIRED_COLUMNS = (*BASE_FEATURES, "ttft_ms", "prompt_id")
MIN_FIT_PROMPTS = 10
"""Distinct prompts with a usable TTFT a fit needs (grouped cross-validation and a held-out
split by prompt); the profiler measures until it has them (``ProfileConfig.min_prompts``)."""
OPTIONAL_INPUTS = {"tokens_ahead": 0.0, "batch_tokens": 0.0}
"""Model inputs a profile may lack (older profiles; rows of requests sent alone)."""


def model_inputs(df: pd.DataFrame) -> np.ndarray:
    """The ``MODEL_FEATURES`` matrix of a frame (the queue columns default to "alone")."""
    cols = []
    for name in MODEL_FEATURES:
        if name in OPTIONAL_INPUTS:
            col = df[name].fillna(OPTIONAL_INPUTS[name]) if name in df.columns else pd.Series(OPTIONAL_INPUTS[name], index=df.index)
        else:
            col = df[name]
        cols.append(col.to_numpy(dtype=np.float64))
    return np.column_stack(cols).reshape(len(df), len(MODEL_FEATURES))


def mechanics_of(df: pd.DataFrame) -> dict[str, int | None]:
    """The engine's cache block and prefill chunk sizes, as the profile recorded them.

    Falls back to the gcd of the cached-token counts seen (prefix caches hold whole
    blocks) and to no chunk limit.
    """
    def recorded(col: str) -> int | None:
        if col in df.columns and df[col].notna().any():
            return int(df[col].dropna().mode().iloc[0])
        return None

    block = recorded("cache_block_tokens")
    if block is None and "cached_tokens" in df.columns:
        cached = df.loc[df["cached_tokens"] > 0, "cached_tokens"].astype(int).to_numpy()
        block = int(np.gcd.reduce(cached)) if len(cached) else None
    return {"block_tokens": block, "chunk_tokens": recorded("prefill_chunk_tokens")}


def split_groups(df: pd.DataFrame) -> np.ndarray:
    """What must stay on one side of a split: the prompt, or the queue batch it was in."""
    groups = df["prompt_id"].astype(str)
    if "split_group" in df.columns:
        groups = df["split_group"].where(df["split_group"].notna() & (df["split_group"] != ""), groups).astype(str)
    return groups.to_numpy()


def flag_contended(df: pd.DataFrame, *, max_foreign_cpu_share: float = 0.2) -> pd.Series:
    """True for rows measured while other processes took the CPU (see ``ttft.profile``).

    A row is contended when its ``foreign_cpu_share`` (other processes' CPU time during
    the request, as a share of the machine) exceeds ``max_foreign_cpu_share``. Rows
    without the measurement (server backend, no /proc/stat) are never flagged.
    """
    if "foreign_cpu_share" not in df.columns:
        return pd.Series(False, index=df.index)
    share = df["foreign_cpu_share"]
    return share.notna() & (share > max_foreign_cpu_share)


def check_frame(
    df: pd.DataFrame, *, where: str = "measurements", drop_contended: bool = True, max_foreign_cpu_share: float = 0.2
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Validate a measurement frame; keep the rows a model should learn from.

    Drops failed requests and, with ``drop_contended``, rows measured under CPU
    contention (``flag_contended``).

    Returns:
        The usable rows and the counts: ``rows_total``, ``rows_failed``,
        ``rows_contended``, ``rows_used``, ``prompts_used``.

    Raises:
        ValueError: a required column is missing or too few prompts remain.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}; a measurement frame needs {list(REQUIRED_COLUMNS)}")
    ok = df["ttft_ms"].notna() & (df["ttft_ms"] > 0)
    if "error" in df.columns:
        ok &= df["error"].isna()
    contended = flag_contended(df, max_foreign_cpu_share=max_foreign_cpu_share) & ok if drop_contended else pd.Series(False, index=df.index)
    out = df.loc[ok & ~contended].reset_index(drop=True)
    counts = {
        "rows_total": int(len(df)),
        "rows_failed": int((~ok).sum()),
        "rows_contended": int(contended.sum()),
        "rows_used": int(len(out)),
        "prompts_used": int(out["prompt_id"].nunique()),
    }
    if out["prompt_id"].nunique() < MIN_FIT_PROMPTS:
        raise ValueError(
            f"{where}: only {out['prompt_id'].nunique()} distinct prompts with a usable TTFT "
            f"({counts['rows_failed']} failed, {counts['rows_contended']} contended rows left out); "
            f"fitting needs at least {MIN_FIT_PROMPTS} (run a larger profile)"
        )
    return out, counts


def score(y_true: np.ndarray, y_pred: np.ndarray, keys: np.ndarray | None = None) -> dict[str, float]:
    """R², MAPE (a fraction: 0.05 is 5%) and the p50/p95 absolute error in ms.

    With ``keys`` (which rows repeat one measurement: ``noise.repeat_key``), also
    ``mape_median``: the MAPE of each unit's median prediction against its median
    measurement, over ``n_medians`` units.
    """
    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    abs_err = np.abs(y_pred - y_true)
    out = {
        "r2": float(r2_score(y_true, y_pred)),
        "mape": float(mean_absolute_percentage_error(y_true, y_pred)),
        "p50_abs_err_ms": float(np.percentile(abs_err, 50)),
        "p95_abs_err_ms": float(np.percentile(abs_err, 95)),
        "n": int(len(abs_err)),
    }
    if keys is not None:
        medians = pd.DataFrame({"key": keys, "y": y_true, "p": y_pred}).groupby("key").median()
        out["mape_median"] = float(np.mean(np.abs(medians["p"] - medians["y"]) / medians["y"]))
        out["n_medians"] = int(len(medians))
    return out


def is_monotonic_in_uncached(estimator: Any, X: np.ndarray, *, n_grid: int = 40, n_rows: int = 40, seed: int = 0) -> bool:
    """Do predictions never decrease as uncached tokens grow over the range seen in ``X``?

    Checked on a grid of uncached-token values for up to ``n_rows`` measured rows (the
    other columns held at each row's values). A tolerance of 0.01 ms absorbs rounding.
    """
    col = MODEL_FEATURES.index("uncached_tokens")
    grid = np.linspace(X[:, col].min(), X[:, col].max(), n_grid)
    rng = np.random.default_rng(seed)
    rows = X[rng.choice(len(X), size=min(n_rows, len(X)), replace=False)]
    for row in rows:
        probe = np.repeat(row[None, :], n_grid, axis=0)
        probe[:, col] = grid
        if np.any(np.diff(estimator.predict(probe)) < -0.01):
            return False
    return True


def never_slower_when_cached(estimator: Any, X: np.ndarray, *, n_grid: int = 20, n_rows: int = 40, seed: int = 0) -> bool:
    """Is a prompt never predicted slower with part of it served from the prefix cache than
    computed whole?

    For up to ``n_rows`` measured rows the prompt length (uncached + cached tokens) is held
    and its cached part set to each cached amount the profile measured (whole cache blocks,
    never the last token): a prefix cache skips work, so none may be predicted above the
    prompt with nothing cached (a tree's small steps between them are allowed). Fitted on
    a short profile, the cached-token terms alone can break this: a model that put a warm
    request 88 ms above its cold one was chosen before this check. Tolerance 0.01 ms.
    """
    u, c = MODEL_FEATURES.index("uncached_tokens"), MODEL_FEATURES.index("cached_tokens")
    seen = np.unique(X[:, c])
    seen = seen[seen > 0]
    if seen.size > n_grid:
        seen = seen[np.linspace(0, seen.size - 1, n_grid).round().astype(int)]
    # Rows of requests measured alone: in a queue the prefill others bring is held fixed.
    alone = X[(X[:, MODEL_FEATURES.index("tokens_ahead")] == 0) & (X[:, MODEL_FEATURES.index("batch_tokens")] <= X[:, u])]
    rng = np.random.default_rng(seed)
    rows = alone[rng.choice(len(alone), size=min(n_rows, len(alone)), replace=False)]
    for row in rows:
        total = row[u] + row[c]
        cached = np.concatenate([[0.0], seen[seen <= total - 1]])
        if cached.size < 2:
            continue
        probe = np.repeat(row[None, :], cached.size, axis=0)
        probe[:, c], probe[:, u] = cached, total - cached
        predicted = estimator.predict(probe)
        if np.any(predicted[1:] > predicted[0] + 0.01):
            return False
    return True


@dataclass
class FitResult:
    """Everything model selection learned. ``estimator`` is the winner, fitted."""

    chosen: str
    estimator: Any
    cv: dict[str, dict[str, float]]
    """Per candidate: mean cross-validated scores on the training prompts."""
    heldout: dict[str, dict[str, float]]
    """Per candidate: scores on held-out prompts, fitted on the training prompts."""
    monotonic: dict[str, bool]
    """Per candidate: ``is_monotonic_in_uncached``."""
    train_groups: list[str]
    test_groups: list[str]
    heldout_predictions: pd.DataFrame
    """Held-out rows with one ``pred_<candidate>`` column per candidate."""
    refit_on_all: bool = True
    rows: dict[str, int] = field(default_factory=dict)
    """Row counts: total, failed, contended (left out), used."""
    mechanics: dict[str, int | None] = field(default_factory=dict)
    """The cache block and prefill chunk sizes the candidates were built with."""
    cache_consistent: dict[str, bool] = field(default_factory=dict)
    """Per candidate: ``never_slower_when_cached``."""

    def summary(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "mechanics": self.mechanics,
            "cv": self.cv,
            "heldout": self.heldout,
            "monotonic": self.monotonic,
            "cache_consistent": self.cache_consistent,
            "n_train_prompts": len(self.train_groups),
            "n_test_prompts": len(self.test_groups),
            "refit_on_all": self.refit_on_all,
            "rows": self.rows,
        }


def _xy(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    return model_inputs(df), df["ttft_ms"].to_numpy(dtype=np.float64)


def fit_models(
    df: pd.DataFrame,
    *,
    test_size: float = 0.2,
    n_splits: int = 5,
    seed: int = 0,
    candidates: dict[str, Any] | None = None,
    refit_on_all: bool = True,
    drop_contended: bool = True,
) -> FitResult:
    """Compare the candidates and return the winner.

    Args:
        df: measurement rows (see ``check_frame``).
        test_size: share of prompts held out for the final scores.
        n_splits: folds of grouped cross-validation on the training prompts.
        candidates: name -> unfitted estimator; default ``candidate_estimators()`` with
            the engine's mechanics (``mechanics_of(df)``).
        refit_on_all: refit the winner on every row (train and held-out) before
            returning it; the held-out scores describe the same specification fitted
            on the training prompts only. A refit that breaks a check the winner passed
            is dropped for the training-prompts fit (the result's ``refit_on_all`` False).
        drop_contended: leave out rows measured under CPU contention.
    """
    df, counts = check_frame(df, drop_contended=drop_contended)
    mechanics = mechanics_of(df)
    candidates = candidate_estimators(seed=seed, **mechanics) if candidates is None else candidates
    # One OpenMP thread: the data are small, and on a shared 2-core machine the tree
    # ensemble's default thread pool oversubscribes the CPU (100x slower under load).
    with threadpool_limits(1):
        result = _fit_models(df, candidates, test_size=test_size, n_splits=n_splits, seed=seed, refit_on_all=refit_on_all)
    result.rows = counts
    result.mechanics = mechanics
    return result


def _fit_models(
    df: pd.DataFrame, candidates: dict[str, Any], *, test_size: float, n_splits: int, seed: int, refit_on_all: bool
) -> FitResult:
    groups = split_groups(df)
    keys = repeat_key(df).to_numpy()
    train_idx, test_idx = next(GroupShuffleSplit(n_splits=1, test_size=test_size, random_state=seed).split(df, groups=groups))
    train, test = df.iloc[train_idx], df.iloc[test_idx].copy()
    X_train, y_train = _xy(train)
    X_test, y_test = _xy(test)
    k_train, k_test = keys[train_idx], keys[test_idx]
    folds = min(n_splits, len(set(groups[train_idx])))

    cv: dict[str, dict[str, float]] = {}
    heldout: dict[str, dict[str, float]] = {}
    monotonic: dict[str, bool] = {}
    cache_consistent: dict[str, bool] = {}
    fitted: dict[str, Any] = {}
    for name, est in candidates.items():
        fold_scores = []
        splitter = GroupKFold(n_splits=folds, shuffle=True, random_state=seed)
        for a, b in splitter.split(X_train, y_train, groups=groups[train_idx]):
            model = clone(est).fit(X_train[a], y_train[a])
            fold_scores.append(score(y_train[b], model.predict(X_train[b]), k_train[b]))
        cv[name] = {k: float(np.mean([s[k] for s in fold_scores])) for k in fold_scores[0]}
        model = clone(est).fit(X_train, y_train)
        fitted[name] = model
        pred = model.predict(X_test)
        heldout[name] = score(y_test, pred, k_test)
        test[f"pred_{name}"] = pred
        monotonic[name] = is_monotonic_in_uncached(model, X_train, seed=seed)
        cache_consistent[name] = never_slower_when_cached(model, X_train, seed=seed)

    # Both facts if any candidate keeps them, else the first (the optimizer's cost order
    # rests on it; a warm prediction above the cold one is clipped there), else any.
    eligible = ([n for n in candidates if monotonic[n] and cache_consistent[n]]
                or [n for n in candidates if monotonic[n]] or list(candidates))
    chosen = min(eligible, key=lambda n: cv[n]["mape_median"])
    estimator = fitted[chosen]
    if refit_on_all:
        X_all, y_all = _xy(df)
        refit = clone(candidates[chosen]).fit(X_all, y_all)
        # The refit is what the optimizer uses: it must keep what selection checked, else
        # the model fitted on the training prompts is returned.
        keeps = ((not monotonic[chosen] or is_monotonic_in_uncached(refit, X_all, seed=seed))
                 and (not cache_consistent[chosen] or never_slower_when_cached(refit, X_all, seed=seed)))
        estimator, refit_on_all = (refit, True) if keeps else (estimator, False)
    return FitResult(
        chosen=chosen,
        estimator=estimator,
        cv=cv,
        heldout=heldout,
        monotonic=monotonic,
        cache_consistent=cache_consistent,
        train_groups=sorted(set(groups[train_idx])),
        test_groups=sorted(set(groups[test_idx])),
        heldout_predictions=test.reset_index(drop=True),
        refit_on_all=refit_on_all,
    )


def engine_rows(df: pd.DataFrame, engine_key: str | None = None, *, where: str = "profiles") -> pd.DataFrame:
    """The rows of one engine identity.

    Args:
        engine_key: the identity to keep; None: the frame must hold exactly one.

    Raises:
        ValueError: no identity columns, an unknown key, or several identities and no key.
    """
    if "engine_key" not in df.columns:
        raise ValueError(f"{where}: no engine_key column; these are not TTFT profile rows")
    keys = sorted(df["engine_key"].dropna().unique())
    if engine_key is None:
        if len(keys) != 1:
            raise ValueError(f"{where}: rows from {len(keys)} engine identities {keys}; choose one with --engine-key")
        engine_key = keys[0]
    if engine_key not in keys:
        raise ValueError(f"{where}: no rows for engine_key {engine_key!r} (present: {keys})")
    return df[df["engine_key"] == engine_key].reset_index(drop=True)


def identity_of(df: pd.DataFrame) -> EngineIdentity:
    """The engine identity stamped on profile rows (they must all share it)."""
    rows = engine_rows(df)
    values = {k: rows[f"engine_{k}"].iloc[0] for k in EngineIdentity.__dataclass_fields__ if f"engine_{k}" in rows}
    return EngineIdentity.from_dict({k: v.item() if hasattr(v, "item") else v for k, v in values.items()})

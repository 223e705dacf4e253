"""The regressors that predict TTFT, as scikit-learn estimators.

Every model takes the same input columns (``MODEL_FEATURES``):

* ``uncached_tokens``: prompt tokens the engine has to prefill;
* ``cached_tokens``: prompt tokens served from the prefix cache (they still cost
  attention for the new tokens, so they are a feature, not an omission);
* ``fewshot_count``, ``semantic_density``, ``entropy_bits``: the prompt's shape and text;
* ``tokens_ahead`` and ``batch_tokens``: for requests that arrive together, the uncached
  tokens of the requests ahead of this one, and of the whole group including it (both 0
  for a request alone, which is what the optimizer asks about).

The first step of every model is ``EngineMechanics``: it turns those inputs into what the
engine actually does (``DERIVED_FEATURES``), with the cache block and prefill chunk sizes
recorded when the engine was profiled:

* the prefix cache serves whole blocks and never the last prompt token, so cached tokens
  are rounded down to blocks (a static prefix shorter than a block caches nothing);
* chunked prefill runs at most ``chunk_tokens`` prompt tokens per engine step, first come
  first served, and a request's first token appears at the end of the step that finishes
  its prefill. So a request computes ``prefill_tokens`` (its own, plus everything that
  shares those steps with it) over ``prefill_steps`` steps, and ``step_tokens_sq``, the
  sum over those steps of each step's token count squared (a step's cost grows faster
  than its token count: activations outgrow the caches). Alone, these are its uncached
  tokens, one step (up to ``chunk_tokens`` per step) and the uncached tokens squared.

The first five derived columns are the base features (cached tokens rounded to blocks,
uncached tokens adjusted to match), in the order of ``BASE_FEATURES``, so a term list
over the base features means the same over the derived ones.

``MonomialRegressor`` is a least-squares model on chosen products of the derived columns.
It covers both the interpretable linear model (``MECHANICS_TERMS``: prefill tokens,
prefill x uncached tokens, step tokens², cached, uncached x cached, steps, with
coefficients in milliseconds per unit; the prompt's text does not enter: the arithmetic
of a prefill depends on token counts only) and the regularised polynomial model (every
monomial up to a degree of every derived column, text features included, ridge
penalty). Its fitted state is a list of plain floats, so it persists as JSON and
predicts with exactly the same arithmetic after loading.

The tree ensemble is scikit-learn's ``HistGradientBoostingRegressor`` with monotonic
constraints on the token columns: more tokens never predict a faster first token.
"""

from __future__ import annotations

from itertools import combinations_with_replacement
from typing import Any, Sequence

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import (
    _check_sample_weight,
    check_is_fitted,
    validate_data,
)

__all__ = [
    "BASE_FEATURES",
    "DERIVED_FEATURES",
    "EngineMechanics",
    "MECHANICS_TERMS",
    "MODEL_FEATURES",
    "MonomialRegressor",
    "candidate_estimators",
    "warm_cached_tokens",
    "with_mechanics",
]

BASE_FEATURES: tuple[str, ...] = (
    "uncached_tokens",
    "cached_tokens",
    "fewshot_count",
    "semantic_density",
    "entropy_bits",
)
"""The inputs of format-1 models (before the engine's mechanics were modelled)."""

MODEL_FEATURES: tuple[str, ...] = (*BASE_FEATURES, "tokens_ahead", "batch_tokens")
"""The inputs every model takes (``feature_row`` builds them from a features dict)."""

DERIVED_FEATURES: tuple[str, ...] = (*BASE_FEATURES, "prefill_tokens", "prefill_steps", "step_tokens_sq")
"""What ``EngineMechanics`` hands the regressor."""

_U, _C, _K, _D, _H, _P, _S, _Q = range(len(DERIVED_FEATURES))

# Terms as tuples of column indices (a repeated index is a power).
MECHANICS_TERMS: tuple[tuple[int, ...], ...] = (
    (_P,),  # prefill work: every token computed up to this request's first token (alone: its own)
    (_P, _U),  # attention among new tokens: alone u², in a group of similar requests the sum of their squares
    (_Q,),  # each step's cost beyond linear in its tokens (memory traffic)
    (_C,),  # cached tokens: cache lookup and KV reads
    (_U, _C),  # attention of each new token over the cached context
    (_S,),  # per engine step: scheduling, sampling, the step's fixed cost
)
"""The linear model with the engine's mechanics: ``prefill_tokens`` in place of the
uncached tokens (the same number for a request alone), one term per prefill step,
attention as ``prefill_tokens x uncached_tokens`` (alone ``u²``; in a group of ``P / u``
requests of about this one's size, their summed ``u²``) and the steps' squared sizes.
For a request alone the last two are both ``u²``: only requests measured together tell
them apart."""


def warm_cached_tokens(static_prefix_tokens: Any, total_tokens: Any, block_tokens: int | None) -> Any:
    """Prompt tokens a prefix cache holding the static prefix serves: whole blocks of it,
    never the last prompt token (it must be computed to sample the first output token).

    The one place this rule lives: the TTFT models' mechanics, their warm features and the
    optimizer's warm predictions all call it. Scalars give an int, arrays an array.

    Args:
        static_prefix_tokens: tokens asked to be cached (the static prefix, or cached_tokens).
        total_tokens: the prompt's tokens.
        block_tokens: the cache's block size (``engine_info.engine_block_size``); None: 1.

    Example:
        >>> warm_cached_tokens(300, 400, 128), warm_cached_tokens(256, 256, 128)
        (256, 128)
    """
    block = 1 if block_tokens is None else block_tokens
    if block < 1:
        raise ValueError(f"block_tokens must be at least 1, got {block_tokens}")
    usable = np.clip(np.minimum(np.asarray(static_prefix_tokens, dtype=np.float64),
                                np.asarray(total_tokens, dtype=np.float64) - 1), 0, None)
    cached = np.floor(usable / block) * block
    return int(cached) if cached.ndim == 0 else cached


class EngineMechanics(TransformerMixin, BaseEstimator):
    """``MODEL_FEATURES`` columns -> ``DERIVED_FEATURES`` columns (stateless).

    Args:
        block_tokens: the prefix cache's block size (None or 1: no rounding).
        chunk_tokens: the most prompt tokens one engine step prefills (None: unlimited,
            every prefill is one step).

    Columns beyond the seven inputs are passed through after the derived ones (the
    analysis appends a density hinge that way).

    Example:
        >>> m = EngineMechanics(block_tokens=128, chunk_tokens=4096)
        >>> # 300 static tokens are asked for: 2 blocks (256) are cached; 8 requests of
        >>> # 768 tokens arrive together, this one 6th (5 x 768 ahead): its prefill ends in step 2.
        >>> m.fit_transform([[100, 300, 0, 0.5, 7.0, 0, 0], [768, 0, 0, 0.5, 7.0, 3840, 6144]]).tolist()
        [[144.0, 256.0, 0.0, 0.5, 7.0, 144.0, 1.0, 20736.0], [768.0, 0.0, 0.0, 0.5, 7.0, 6144.0, 2.0, 20971520.0]]
    """

    def __init__(self, block_tokens: int | None = None, chunk_tokens: int | None = None):
        self.block_tokens = block_tokens
        self.chunk_tokens = chunk_tokens

    def fit(self, X: Any, y: Any = None) -> "EngineMechanics":
        X = validate_data(self, X, dtype=np.float64)
        if X.shape[1] < len(MODEL_FEATURES):
            raise ValueError(f"EngineMechanics needs the {len(MODEL_FEATURES)} columns {list(MODEL_FEATURES)}, got {X.shape[1]}")
        for name in ("block_tokens", "chunk_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"The '{name}' parameter of EngineMechanics must be >= 1 or None. Got {value!r} instead.")
        return self

    def transform(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "n_features_in_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        u, c, k, d, h, ahead, batch = (X[:, i] for i in range(len(MODEL_FEATURES)))
        total = u + c
        cached = warm_cached_tokens(c, total, self.block_tokens)
        new = total - cached
        through = ahead + new  # tokens scheduled up to the end of this request's prefill
        if self.chunk_tokens:
            steps = np.maximum(1.0, np.ceil(through / self.chunk_tokens))
            # Everything that shares those steps is computed with this request.
            prefill = np.minimum(np.maximum(batch, through), steps * self.chunk_tokens)
            last = prefill - (steps - 1) * self.chunk_tokens  # every step but the last is full
            step_sq = (steps - 1) * float(self.chunk_tokens) ** 2 + last**2
        else:
            steps = np.ones_like(through)
            prefill = np.maximum(batch, through)
            step_sq = prefill**2
        out = np.column_stack([new, cached, k, d, h, prefill, steps, step_sq])
        return np.column_stack([out, X[:, len(MODEL_FEATURES):]]) if X.shape[1] > len(MODEL_FEATURES) else out

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        return np.asarray(DERIVED_FEATURES, dtype=object)


def with_mechanics(regressor: BaseEstimator, *, block_tokens: int | None = None,
                   chunk_tokens: int | None = None) -> Pipeline:
    """``regressor`` behind an ``EngineMechanics`` step: a model taking ``MODEL_FEATURES``."""
    return Pipeline([("mechanics", EngineMechanics(block_tokens, chunk_tokens)), ("regressor", regressor)])


def _all_terms(n_features: int, degree: int) -> tuple[tuple[int, ...], ...]:
    return tuple(
        term for d in range(1, degree + 1) for term in combinations_with_replacement(range(n_features), d)
    )


def _design(X: np.ndarray, terms: Sequence[Sequence[int]]) -> np.ndarray:
    """The monomial columns: one product of input columns per term."""
    out = np.ones((X.shape[0], len(terms)), dtype=np.float64)
    for j, term in enumerate(terms):
        for i in term:
            out[:, j] *= X[:, i]
    return out


class MonomialRegressor(RegressorMixin, BaseEstimator):
    """Least squares on monomials of the input columns (ordinary or ridge).

    Args:
        terms: the monomials, each a tuple of column indices (``(0, 0)`` is column 0
            squared). None: every monomial up to ``degree``.
        degree: used when ``terms`` is None.
        alpha: ridge penalty on the standardised monomials; 0 is ordinary least squares.
        relative_error: weight each row by 1/y², so the fit minimises squared relative
            error (what MAPE measures) rather than squared milliseconds.

    Learned attributes: ``terms_`` (the monomials used), ``coef_`` (one per term, in the
    units of the raw columns), ``intercept_``, ``n_features_in_``.

    Example:
        >>> import numpy as np
        >>> X = np.array([[1.0], [2.0], [3.0]]); y = 1 + 2 * X[:, 0] ** 2
        >>> m = MonomialRegressor(terms=((0,), (0, 0))).fit(X, y)
        >>> round(float(m.predict([[4.0]])[0]), 6)
        33.0
    """

    def __init__(
        self,
        terms: tuple[tuple[int, ...], ...] | None = None,
        degree: int = 2,
        alpha: float = 0.0,
        relative_error: bool = False,
    ):
        self.terms = terms
        self.degree = degree
        self.alpha = alpha
        self.relative_error = relative_error

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> "MonomialRegressor":
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True)
        if self.alpha < 0:
            raise ValueError(f"The 'alpha' parameter of MonomialRegressor must be >= 0. Got {self.alpha!r} instead.")
        terms = _all_terms(X.shape[1], self.degree) if self.terms is None else tuple(tuple(t) for t in self.terms)
        for term in terms:
            if not term or any(not 0 <= i < X.shape[1] for i in term):
                raise ValueError(
                    f"The 'terms' parameter of MonomialRegressor has a term {term!r} that does not "
                    f"index the {X.shape[1]} input columns."
                )
        design = _design(X, terms)
        weight = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        if self.relative_error:
            weight = weight / np.maximum(np.abs(y), 1e-9) ** 2
        # Standardise the monomials so the solver and the ridge penalty see comparable
        # scales (uncached² reaches millions), then fold the scaling back into raw units.
        mean = np.average(design, axis=0, weights=weight)
        scale = np.sqrt(np.average((design - mean) ** 2, axis=0, weights=weight))
        # A term that never varies (prefill steps of requests alone) carries nothing: it gets
        # a zero column and coefficient 0, rather than a rounding residue scaled up to noise.
        constant = np.ptp(design, axis=0) == 0
        scale[constant | (scale == 0)] = 1.0
        centred = (design - mean) / scale
        centred[:, constant] = 0.0
        solver = LinearRegression() if self.alpha == 0 else Ridge(alpha=self.alpha)
        solver.fit(centred, y, sample_weight=weight)
        coef = np.where(constant, 0.0, solver.coef_ / scale)
        self.terms_ = terms
        self.coef_ = coef
        self.intercept_ = float(solver.intercept_ - np.dot(coef, mean))
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "coef_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return _design(X, self.terms_) @ self.coef_ + self.intercept_

    def get_state(self) -> dict[str, Any]:
        """The fitted state as JSON-ready values (floats round-trip exactly through JSON)."""
        check_is_fitted(self, "coef_")
        return {
            "params": {
                "terms": None if self.terms is None else [list(t) for t in self.terms],
                "degree": self.degree,
                "alpha": self.alpha,
                "relative_error": self.relative_error,
            },
            "terms": [list(t) for t in self.terms_],
            "coef": [float(c) for c in self.coef_],
            "intercept": self.intercept_,
            "n_features_in": int(self.n_features_in_),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "MonomialRegressor":
        """Rebuild a fitted regressor from ``get_state()`` output."""
        params = dict(state["params"])
        if params["terms"] is not None:
            params["terms"] = tuple(tuple(t) for t in params["terms"])
        self = cls(**params)
        self.terms_ = tuple(tuple(int(i) for i in t) for t in state["terms"])
        self.coef_ = np.asarray(state["coef"], dtype=np.float64)
        self.intercept_ = float(state["intercept"])
        self.n_features_in_ = int(state["n_features_in"])
        if len(self.coef_) != len(self.terms_):
            raise ValueError(f"state has {len(self.coef_)} coefficients for {len(self.terms_)} terms")
        return self


def candidate_estimators(*, seed: int = 0, block_tokens: int | None = None,
                         chunk_tokens: int | None = None) -> dict[str, BaseEstimator]:
    """The models model selection compares, by name: each an ``EngineMechanics`` step
    (with the profiled engine's block and chunk sizes) and a regressor.

    ``linear`` is the interpretable model the report's coefficient table comes from.
    The polynomial models are ridge fits of every monomial up to degree 2 of the derived
    columns, at three penalties. ``hgb`` is a gradient-boosted tree ensemble,
    constrained to be non-decreasing in the token and step columns.
    """
    tokens = ("prefill_tokens", "uncached_tokens", "cached_tokens", "prefill_steps", "step_tokens_sq")
    monotone = [1 if name in tokens else 0 for name in DERIVED_FEATURES]
    regressors: dict[str, BaseEstimator] = {
        "linear": MonomialRegressor(terms=MECHANICS_TERMS),
        "linear_rel": MonomialRegressor(terms=MECHANICS_TERMS, relative_error=True),
        "poly2_a0.1": MonomialRegressor(degree=2, alpha=0.1),
        "poly2_a1": MonomialRegressor(degree=2, alpha=1.0),
        "poly2_a10": MonomialRegressor(degree=2, alpha=10.0),
        "hgb": HistGradientBoostingRegressor(
            max_iter=200,
            learning_rate=0.05,
            min_samples_leaf=5,
            monotonic_cst=monotone,
            early_stopping=False,
            random_state=seed,
        ),
    }
    return {name: with_mechanics(reg, block_tokens=block_tokens, chunk_tokens=chunk_tokens)
            for name, reg in regressors.items()}

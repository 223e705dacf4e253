"""The regressors that predict TTFT, as scikit-learn estimators.

Every model works on the same base feature columns (``MODEL_FEATURES``):

* ``uncached_tokens``: prompt tokens the engine has to prefill;
* ``cached_tokens``: prompt tokens served from the prefix cache (they still cost
  attention for the new tokens, so they are a feature, not an omission);
* ``fewshot_count``, ``semantic_density``, ``entropy_bits``: the prompt's shape and text.

``MonomialRegressor`` is a least-squares model on chosen products of those columns.
It covers both the interpretable linear model (``LINEAR_TERMS``: uncached, uncached²,
cached, uncached·cached, few-shot count, density, entropy, with coefficients in
milliseconds per unit) and the regularised polynomial model (every monomial up to a
degree, ridge penalty). Its fitted state is a list of plain floats, so it persists as
JSON and predicts with exactly the same arithmetic after loading.

The tree ensemble is scikit-learn's ``HistGradientBoostingRegressor`` with monotonic
constraints on the token columns: more tokens never predict a faster first token.
"""

from __future__ import annotations

from itertools import combinations_with_replacement
from typing import Any, Sequence

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

__all__ = [
    "DENSITY_HINGE",
    "LINEAR_TERMS",
    "MODEL_FEATURES",
    "MonomialRegressor",
    "candidate_estimators",
    "term_names",
]

MODEL_FEATURES: tuple[str, ...] = (
    "uncached_tokens",
    "cached_tokens",
    "fewshot_count",
    "semantic_density",
    "entropy_bits",
)
_U, _C, _K, _D, _H = range(len(MODEL_FEATURES))

# Terms as tuples of column indices (a repeated index is a power).
LINEAR_TERMS: tuple[tuple[int, ...], ...] = (
    (_U,),  # prefill work per new token
    (_U, _U),  # attention among the new tokens: the quadratic term
    (_C,),  # cached tokens: cache lookup and KV reads
    (_U, _C),  # attention of each new token over the cached context
    (_K,),
    (_D,),
    (_H,),
)

DENSITY_HINGE = 0.65
"""The density above which a widely shared claim says TTFT rises steeply."""


def term_names(terms: Sequence[Sequence[int]], features: Sequence[str] = MODEL_FEATURES) -> list[str]:
    """Readable names: ``uncached_tokens^2``, ``uncached_tokens*cached_tokens``."""
    names = []
    for term in terms:
        parts = []
        for i in sorted(set(term)):
            power = list(term).count(i)
            parts.append(features[i] if power == 1 else f"{features[i]}^{power}")
        names.append("*".join(parts))
    return names


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
        scale[scale == 0] = 1.0
        solver = LinearRegression() if self.alpha == 0 else Ridge(alpha=self.alpha)
        solver.fit((design - mean) / scale, y, sample_weight=weight)
        coef = solver.coef_ / scale
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


def candidate_estimators(*, seed: int = 0) -> dict[str, BaseEstimator]:
    """The models model selection compares, by name.

    ``linear`` is the interpretable model the report's coefficient table comes from.
    The polynomial models are ridge fits of every monomial up to degree 2 of the five
    base columns, at three penalties. ``hgb`` is a gradient-boosted tree ensemble,
    constrained to be non-decreasing in uncached and cached tokens.
    """
    monotone = [1 if name in ("uncached_tokens", "cached_tokens") else 0 for name in MODEL_FEATURES]
    return {
        "linear": MonomialRegressor(terms=LINEAR_TERMS),
        "linear_rel": MonomialRegressor(terms=LINEAR_TERMS, relative_error=True),
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

"""Predict a template's P95 TTFT at a load from its prompt's features.

What a request costs the engine under load is its uncached prompt tokens (prefill),
its cached ones (a little attention), and the tokens it generates (decode steps that
share every batch with the other requests). So the features of a template are

* ``uncached_tokens``: prompt tokens a warm prefix cache does not serve;
* ``cached_tokens``: those it serves (the static prefix, in whole blocks);
* ``completion_tokens``: the mean reply length;

and the load is a concurrency ``c`` (closed loop) or a rate ``r`` (open loop, Poisson).

The model, fitted from a load profile (``load.profile``):

1. **Capacity.** Engine seconds per request at saturation, linear and non-negative in
   the features (``1 / throughput`` at the profile's highest concurrency):
   ``s(x) = s0 + s1 uncached + s2 cached + s3 completion``. A rate's utilization is
   ``rho = r s(x)``; at ``rho >= 1`` the queue grows without bound and the model
   predicts no percentile (infinite: the template cannot sustain the rate).
2. **The percentile**, one linear model (ridge) of ``log P95`` per load kind:
   concurrency on ``log1p`` of the features, ``log c`` and their products; rate on the
   same features, ``log r``, ``rho`` and ``log(1 / (1 - rho))``, the queueing delay's
   growth towards the knee.

Its error is measured held out by prompt (``load.fit``), against the noise floor of
repeated runs. Persisted as JSON (coefficients), never pickled.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["FEATURES", "LoadTTFTModel", "MAX_RHO"]

FEATURES = ("uncached_tokens", "cached_tokens", "completion_tokens")
MAX_RHO = 0.97
"""Utilization above which a rate counts as unsustainable for the percentile model."""
_RIDGE_ALPHA = 1e-3


def _base(x: Mapping[str, Any]) -> list[float]:
    return [math.log1p(max(0.0, float(x[f]))) for f in FEATURES]


class LoadTTFTModel:
    """P95 TTFT at a load. ``fit(cells)`` then ``predict(rows)``; scikit-learn's shape.

    Args:
        percentile: which percentile the cells' ``ttft_ms`` is (95 by default).
    """

    def __init__(self, percentile: float = 95.0):
        self.percentile = percentile

    # -- features -------------------------------------------------------------------
    def seconds_per_request(self, x: Mapping[str, Any]) -> float:
        """Engine seconds one request of features ``x`` costs at saturation."""
        c = self.capacity_coef_
        return float(c[0] + sum(c[i + 1] * float(x[f]) for i, f in enumerate(FEATURES)))

    def utilization(self, x: Mapping[str, Any], rate_rps: float) -> float:
        return rate_rps * self.seconds_per_request(x)

    def _design(self, x: Mapping[str, Any], kind: str, value: float) -> list[float]:
        base = _base(x)
        if kind == "concurrency":
            lc = math.log(max(1.0, value))
            return [1.0, *base, lc, *(lc * b for b in base)]
        rho = min(self.utilization(x, value), MAX_RHO)
        return [1.0, *base, math.log(value), rho, math.log(1.0 / (1.0 - rho)), *(rho * b for b in base)]

    # -- fit / predict --------------------------------------------------------------
    def fit(self, cells: Sequence[Mapping[str, Any]]) -> "LoadTTFTModel":
        """Fit from profile cells: features, ``load_kind``, ``load_value``, ``ttft_ms`` (the
        percentile), and ``throughput_rps`` on the concurrency cells."""
        from scipy.optimize import nnls

        cells = list(cells)
        conc = [c for c in cells if c["load_kind"] == "concurrency"]
        if not conc:
            raise ValueError("a load TTFT model needs concurrency cells (the capacity comes from them)")
        top = max(float(c["load_value"]) for c in conc)
        sat = [c for c in conc if float(c["load_value"]) == top and c.get("throughput_rps")]
        if len({c.get("prompt_id", i) for i, c in enumerate(sat)}) < 2:
            raise ValueError(f"a load TTFT model needs throughput at concurrency {top:g} for 2 or more prompts")
        a = np.asarray([[1.0, *(float(c[f]) for f in FEATURES)] for c in sat])
        b = np.asarray([1.0 / float(c["throughput_rps"]) for c in sat])
        scale = np.maximum(a.max(axis=0), 1e-9)
        coef, _ = nnls(a / scale, b)
        self.capacity_coef_ = (coef / scale).tolist()
        self.saturation_concurrency_ = top
        self.coef_: dict[str, list[float]] = {}
        for kind in ("concurrency", "rate"):
            mine = [c for c in cells if c["load_kind"] == kind and c.get("ttft_ms")]
            if kind == "rate":
                mine = [c for c in mine if self.utilization(c, float(c["load_value"])) < MAX_RHO]
            if len(mine) < 3:
                continue
            x = np.asarray([self._design(c, kind, float(c["load_value"])) for c in mine])
            y = np.log(np.asarray([float(c["ttft_ms"]) for c in mine]))
            penalty = _RIDGE_ALPHA * len(mine) * np.eye(x.shape[1])
            penalty[0, 0] = 0.0  # the intercept is not shrunk
            self.coef_[kind] = np.linalg.solve(x.T @ x + penalty, x.T @ y).tolist()
        if not self.coef_:
            raise ValueError("a load TTFT model needs 3 or more cells with a percentile for some load kind")
        self.n_cells_ = len(cells)
        return self

    def _check(self) -> None:
        if not hasattr(self, "coef_"):
            raise RuntimeError("this LoadTTFTModel is not fitted yet: call fit(cells) first")

    def predict_one(self, x: Mapping[str, Any], kind: str, value: float) -> float:
        """The percentile in ms at one load; ``inf`` when the rate is past the template's capacity."""
        self._check()
        if kind not in self.coef_:
            raise ValueError(f"this load TTFT model was fitted without {kind} loads; refit with a profile that has them")
        if kind == "rate" and self.utilization(x, value) >= MAX_RHO:
            return math.inf
        return float(math.exp(float(np.dot(self.coef_[kind], self._design(x, kind, value)))))

    def predict(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Per row (features, ``load_kind``, ``load_value``): the percentile in ms."""
        return np.asarray([self.predict_one(r, str(r["load_kind"]), float(r["load_value"])) for r in rows])

    def sustainable_rate(self, x: Mapping[str, Any], target_ms: float, *, top_rps: float | None = None) -> float:
        """The highest rate at which the predicted percentile stays at or under ``target_ms``
        (bisection; 0 when even a light load misses it)."""
        self._check()
        cap = 1.0 / max(self.seconds_per_request(x), 1e-9)
        lo, hi = 0.0, min(cap * MAX_RHO, top_rps or math.inf)
        if self.predict_one(x, "rate", max(hi * 1e-3, 1e-6)) > target_ms:
            return 0.0
        if self.predict_one(x, "rate", hi * (1 - 1e-9)) <= target_ms:
            return hi
        for _ in range(60):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if self.predict_one(x, "rate", mid) <= target_ms else (lo, mid)
        return lo

    # -- persistence ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        self._check()
        return {"kind": "load-ttft-model", "percentile": self.percentile, "capacity_coef": self.capacity_coef_,
                "saturation_concurrency": self.saturation_concurrency_, "coef": self.coef_,
                "n_cells": self.n_cells_, "features": list(FEATURES)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LoadTTFTModel":
        if data.get("kind") != "load-ttft-model" or list(data.get("features", [])) != list(FEATURES):
            raise ValueError("not a load TTFT model of this version (kind/features differ); refit it")
        model = cls(percentile=float(data["percentile"]))
        model.capacity_coef_ = [float(v) for v in data["capacity_coef"]]
        model.saturation_concurrency_ = float(data["saturation_concurrency"])
        model.coef_ = {k: [float(v) for v in vs] for k, vs in data["coef"].items()}
        model.n_cells_ = int(data["n_cells"])
        return model

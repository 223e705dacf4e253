"""Percentiles of TTFT at a load, their intervals, and the highest rate that meets a target.

Requests of one load block are not independent: a slow request delays those queued
behind it. A percentile's interval therefore inverts the empirical distribution
function at an **effective sample size**: the variance of the share of requests at or
under the percentile is ``p (1 - p) / n_eff``, where ``n_eff = n / tau`` and ``tau`` is
the integrated autocorrelation of that indicator in arrival order (initial positive
sequence, pooled over blocks). The interval is the order statistics at ``p -+ z sd``,
taken outward. With too few requests for the tail (``p + z sd`` past the last one) the
upper bound is unknown (None), never the maximum passed off as a bound. (A moving-block
percentile bootstrap was tried first: it covered a P95 of correlated queues 84% of the
time at a nominal 95%; this interval covers it at 93% or more, tests/test_load_unit.py.)

Two templates' difference combines their intervals by MOVER (Zou and Donner's method
of variance estimates recovery): each side's distance to its bounds, added in
quadrature. It ignores the pairing of blocks, which only makes it wider.

All pure (numpy only).

Example:
    >>> est = percentile_ci([[100.0 + i for i in range(400)]], 50)
    >>> round(est.value, 1), est.n, est.low < est.value < est.high
    (299.5, 400, True)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

__all__ = ["Estimate", "indicator_tau", "percentile_ci", "percentile_diff_ci", "sustainable_rate"]

CONFIDENCE = 0.95
MAX_LAG = 40


@dataclass(frozen=True)
class Estimate:
    """A figure with its interval and the number of measurements it rests on (a bound
    that the data cannot give is None)."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clean(blocks: Sequence[Sequence[float | None]]) -> list[np.ndarray]:
    return [np.asarray([v for v in b if v is not None and math.isfinite(v)], dtype=np.float64) for b in blocks]


def indicator_tau(blocks: Sequence[np.ndarray], threshold: float) -> float:
    """Integrated autocorrelation time (at least 1) of ``x <= threshold`` in each block's
    order: 1 + 2 x the sum of the pooled autocorrelations up to the first that is not positive."""
    acf, weight = np.zeros(MAX_LAG + 1), 0
    for b in blocks:
        ind = (b <= threshold).astype(np.float64)
        ind -= ind.mean()
        var = float((ind * ind).mean())
        if b.size < 3 or var == 0.0:
            continue
        lags = min(MAX_LAG, b.size - 2)
        acf[: lags + 1] += b.size * np.asarray([1.0] + [float((ind[:-k] * ind[k:]).mean()) / var
                                                        for k in range(1, lags + 1)])
        weight += b.size
    if weight == 0:
        return 1.0
    acf /= weight
    total = 0.0
    for k in range(1, MAX_LAG + 1):
        if acf[k] <= 0.0:
            break
        total += acf[k]
    return max(1.0, 1.0 + 2.0 * total)


def percentile_ci(blocks: Sequence[Sequence[float | None]], q: float, *, confidence: float = CONFIDENCE) -> Estimate:
    """The ``q``-th percentile of the values of every block pooled, with its interval.

    Args:
        blocks: per block, the measurements in arrival order (None: a failed request,
            left out; count failures apart).
        q: the percentile, in (0, 100).
    """
    arrays = [a for a in _clean(blocks) if a.size]
    n = int(sum(a.size for a in arrays))
    if n == 0:
        return Estimate(None, None, None, 0)
    pooled = np.sort(np.concatenate(arrays))
    value = float(np.percentile(pooled, q))
    if n < 2:
        return Estimate(value, None, None, n)
    p = q / 100.0
    n_eff = n / indicator_tau(arrays, value)
    half = NormalDist().inv_cdf(0.5 + confidence / 2.0) * math.sqrt(p * (1.0 - p) / n_eff)
    lo_rank, hi_rank = math.floor((p - half) * n) - 1, math.ceil((p + half) * n)
    low = float(pooled[lo_rank]) if lo_rank >= 0 else None
    high = float(pooled[hi_rank]) if hi_rank <= n - 1 else None
    return Estimate(value, low, high, n)


def percentile_diff_ci(first: Sequence[Sequence[float | None]], second: Sequence[Sequence[float | None]], q: float,
                       *, confidence: float = CONFIDENCE) -> Estimate:
    """``percentile(second) - percentile(first)``, with its MOVER interval."""
    a, b = percentile_ci(first, q, confidence=confidence), percentile_ci(second, q, confidence=confidence)
    if a.value is None or b.value is None:
        return Estimate(None, None, None, min(a.n, b.n))
    d = b.value - a.value
    low = high = None
    if b.low is not None and a.high is not None:
        low = d - math.hypot(b.value - b.low, a.high - a.value)
    if b.high is not None and a.low is not None:
        high = d + math.hypot(b.high - b.value, a.value - a.low)
    return Estimate(d, low, high, min(a.n, b.n))


def sustainable_rate(points: Sequence[tuple[float, Estimate]], target_ms: float) -> Estimate:
    """The highest request rate at which the percentile stays at or under ``target_ms``.

    ``points`` are (rate, the percentile at that rate) from a sweep. Between the last rate
    under the target and the first above it the crossing is interpolated linearly; the
    interval is where the upper and the lower bounds of the percentile cross the target.
    A sweep that never crosses gives its highest rate as a lower bound only (``high``
    None); one that is above the target at its lowest rate gives 0 as the upper... value
    None with ``high`` that lowest rate.
    """
    pts = sorted((r, e) for r, e in points if e.value is not None)
    n = int(sum(e.n for _, e in pts))

    def crossing(values: list[float | None]) -> float | None:
        # The rate where the curve first rises through the target (None: never in the sweep).
        prev_r, prev_v = None, None
        for (r, _), v in zip(pts, values):
            if v is None:
                continue
            if v > target_ms:
                if prev_v is None:
                    return 0.0
                return prev_r + (target_ms - prev_v) * (r - prev_r) / (v - prev_v)
            prev_r, prev_v = r, v
        return None

    if not pts:
        return Estimate(None, None, None, 0)
    top = pts[-1][0]
    value = crossing([e.value for _, e in pts])
    low = crossing([e.high if e.high is not None else e.value for _, e in pts])
    high = crossing([e.low if e.low is not None else e.value for _, e in pts])
    if value is None:  # never above the target: at least the highest rate swept
        return Estimate(top, low if low is not None else top, None, n)
    if value == 0.0:
        return Estimate(None, 0.0, pts[0][0] if high in (None, 0.0) else high, n)
    return Estimate(value, low if low is not None else value, high, n)

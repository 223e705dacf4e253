"""A group-sequential non-inferiority test on a race's planned looks, for discrete scores.

A race looks at the paired differences ``d_i = candidate_i - baseline_i`` after 50, 100,
200, ... certify records, looks fixed before any record is scored. Validity at *every*
record (what a confidence sequence buys) is not needed then; validity over these few
looks is, and it is much cheaper: on 384 records at 20% discordant pairs and one-sided
0.025 the betting confidence sequence certifies a drop of 0.0775 with 80% power, this test
0.0661 (the plans; ``tests/test_stat_checks.py`` simulates both races at those margins).

The test, for ``H0: mean(d) <= -margin`` against ``H1: mean(d) > -margin``:

* **Statistic**: a score statistic with the variance estimated *under the null*
  (Tango 1998 for paired binary data, "Equivalence test and confidence interval for
  the difference in proportions for the paired-sample design", Stat. Med. 17:891-908;
  Nam 1997). The null variance is that of ``d`` under the multinomial maximising the
  likelihood subject to ``mean = -margin`` (:func:`null_variance`); for 0/1 scores it
  is Tango's closed form. With the plug-in variance the test is anti-conservative at
  few discordant pairs (simulated size 0.028-0.037 at a nominal 0.025); with the null
  variance it holds (0.024).
* **Boundaries**: a Lan-DeMets spending function of the O'Brien-Fleming type,
  ``alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))``, at information fractions
  ``t_k = n_k / N`` (``N`` the certify pool). The boundaries ``c_k`` solve
  ``P0(Z_1 < c_1, ..., Z_{k-1} < c_{k-1}, Z_k >= c_k) = alpha(t_k) - alpha(t_{k-1})``
  by numerical integration over the Brownian-motion recursion (Jennison & Turnbull,
  "Group Sequential Methods", 2000, chapter 19). Checked against the published
  values: five equal looks, one-sided 0.025: 4.877, 3.357, 2.680, 2.290, 2.031.
* **Decisions**: non-inferior at look ``k`` when ``Z_k(-margin) >= c_k``; inferior when
  the mirror test of ``mean >= -margin`` rejects (``Z_k <= -c_k``), with the same error
  rate. A race cut short by its budget has spent less than its alpha (stopping early
  without rejecting can only lower the error rate).
* **Futility** (non-binding): from 40% of the pool on, a race whose conditional power
  (the chance of crossing at the last look if the trend so far continues) is below 2%
  stops: it could only spend records on a decision it will not reach. Stopping without
  rejecting lowers the error rate, so the boundaries above keep their alpha; the plan's
  power includes these stops (the simulation in the tests checks it).
* **Bounds**: the repeated confidence interval, ``{m : -c_k < Z_k(m) < c_k}``, so the
  bounds reported at a look agree with the decision made there. With one look and
  ``c = z_{(1 + confidence) / 2}`` it is the score interval (:func:`score_interval`;
  Tango's for paired 0/1 scores), which the test split's first look uses: a percentile
  bootstrap under-covers on a hundred paired 0/1 records with few discordant pairs.

Why written here: the Python options are thin (``spotify-confidence`` has Lan-DeMets
spending but pins pandas<3 and pulls plotting packages; ``gsdesign`` 0.1.5 exposes only
integration primitives; ``confseq`` needs Boost to build). The recursion is a few lines
of numpy and scipy, and ``tests/test_search.py`` checks it against published boundaries
and by simulation.

Example:
    >>> [round(float(c), 3) for c in obf_boundaries([0.2, 0.4, 0.6, 0.8, 1.0], alpha=0.025)]
    [4.877, 3.357, 2.68, 2.29, 2.031]
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np
from scipy import optimize as sopt
from scipy import stats

from promptdistill.core.stats import MeanCI

__all__ = [
    "FUTILITY_CP",
    "FUTILITY_FROM",
    "conditional_power",
    "crossing_probability",
    "futility_bounds",
    "null_variance",
    "obf_boundaries",
    "obf_spending",
    "repeated_interval",
    "score_interval",
    "score_statistic",
    "tango_variance",
]

FUTILITY_CP = 0.02
"""Conditional power below which a race stops for futility."""
FUTILITY_FROM = 0.4
"""Information fraction from which futility is checked (earlier trends are too noisy)."""

_GRID = 301
"""Grid points per look of the numerical integration (boundaries within 1e-4 of the published
boundaries)."""


def obf_spending(t: float | np.ndarray, alpha: float) -> np.ndarray:
    """Lan-DeMets O'Brien-Fleming-type spending: the one-sided alpha spent by information fraction ``t``."""
    t = np.clip(np.asarray(t, dtype=np.float64), 1e-12, 1.0)
    return 2.0 - 2.0 * stats.norm.cdf(stats.norm.ppf(1.0 - alpha / 2.0) / np.sqrt(t))


class _Recursion:
    """The sub-density of ``W(t_k)`` on the continuation region, look by look, for
    ``W(t) = drift t + scale B(t)`` and ``Z_k = W(t_k) / sqrt(t_k)`` against upper bounds."""

    def __init__(self, drift: float = 0.0, scale: float = 1.0) -> None:
        self.drift, self.scale = drift, scale
        self.t = 0.0
        self.grid: np.ndarray | None = None
        self.mass: np.ndarray | None = None  # density times quadrature weight

    def _moments(self, t: float) -> tuple[np.ndarray | float, float]:
        dt = t - self.t
        base = 0.0 if self.grid is None else self.grid
        return base + self.drift * dt, self.scale * math.sqrt(dt)

    def crossing(self, c: float, t: float) -> float:
        """P(no crossing so far, ``Z >= c`` at fraction ``t``)."""
        if not math.isfinite(c):
            return 0.0
        mean, sd = self._moments(t)
        tail = stats.norm.sf((c * math.sqrt(t) - mean) / sd)
        return float(tail) if self.mass is None else float(np.sum(self.mass * tail))

    def advance(self, c: float, t: float, lower: float = -math.inf) -> None:
        """Condition on no crossing at fraction ``t`` (``lower < Z < c``) and move there."""
        mean, sd = self._moments(t)
        spread = self.scale * math.sqrt(t)
        top = c * math.sqrt(t) if math.isfinite(c) else self.drift * t + 9.0 * spread
        bottom = min(top, self.drift * t) - 9.0 * spread
        if math.isfinite(lower):
            bottom = max(bottom, min(lower * math.sqrt(t), top - 1e-9))
        w = np.linspace(bottom, top, _GRID)
        if self.mass is None:
            f = stats.norm.pdf((w - mean) / sd) / sd
        else:
            f = stats.norm.pdf((w[:, None] - np.asarray(mean)[None, :]) / sd) @ self.mass / sd
        weights = np.full(w.size, w[1] - w[0])
        weights[[0, -1]] *= 0.5
        self.grid, self.mass, self.t = w, f * weights, t


def _crossings(bounds: Sequence[float], fractions: Sequence[float], drift: float = 0.0,
               scale: float = 1.0, lowers: Sequence[float] | None = None) -> np.ndarray:
    """P(first crossing at look k), k = 1..K (bounds may be inf: no boundary at that look);
    ``lowers``: stop without crossing below these (futility)."""
    rec, out = _Recursion(drift, scale), np.zeros(len(bounds))
    lowers = [-math.inf] * len(bounds) if lowers is None else list(lowers)
    for k, (c, t) in enumerate(zip(bounds, fractions)):
        out[k] = rec.crossing(c, t)
        rec.advance(c, t, lowers[k])
    return out


@functools.lru_cache(maxsize=256)
def _boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    spent = obf_spending(np.array(fractions), alpha)
    rec, bounds = _Recursion(), []
    for k, t in enumerate(fractions):
        target = float(spent[k] - (spent[k - 1] if k else 0.0))
        c = math.inf
        if target > 1e-15:
            c = float(sopt.brentq(lambda c: rec.crossing(c, t) - target, 0.0, 40.0, xtol=1e-10))
        bounds.append(c)
        rec.advance(c, t)
    return tuple(bounds)


def obf_boundaries(fractions: Sequence[float], *, alpha: float) -> np.ndarray:
    """Upper z-boundaries at information ``fractions`` (increasing, the last 1 for a full
    race), one-sided ``alpha``, Lan-DeMets O'Brien-Fleming-type spending.

    Raises:
        ValueError: fractions not increasing in (0, 1], or alpha not in (0, 0.5).
    """
    fr = tuple(round(float(t), 12) for t in fractions)
    if not fr or any(not 0.0 < t <= 1.0 for t in fr) or any(b <= a for a, b in zip(fr, fr[1:])):
        raise ValueError(f"information fractions must increase within (0, 1], got {list(fractions)}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    return np.array(_boundaries(fr, float(alpha)))


def crossing_probability(bounds: Sequence[float], fractions: Sequence[float], *, drift: float,
                         scale: float = 1.0, lowers: Sequence[float] | None = None) -> float:
    """P(``Z_k >= bounds[k]`` at some look, never below ``lowers`` before) when
    ``W(t) = drift t + scale B(t)``: the power of the design (``drift = 0, scale = 1``: its size)."""
    return float(np.sum(_crossings(list(bounds), list(fractions), drift, scale, lowers)))


def futility_bounds(bounds: Sequence[float], fractions: Sequence[float]) -> list[float]:
    """The z below which a look stops for futility: where :func:`conditional_power` falls
    under ``FUTILITY_CP``, ``sqrt(t) (c_K - z_{1-p} sqrt(1 - t))`` (-inf where not checked)."""
    final, z_p = bounds[-1], stats.norm.ppf(1.0 - FUTILITY_CP)
    return [math.sqrt(t) * (final - z_p * math.sqrt(1.0 - t)) if FUTILITY_FROM <= t < 1.0 else -math.inf
            for t in fractions]


def tango_variance(wins: np.ndarray | float, losses: np.ndarray | float, n: np.ndarray | float,
                   null_mean: float) -> np.ndarray:
    """Tango's null variance of a paired 0/1 difference: ``wins`` (+1) and ``losses`` (-1)
    among ``n`` pairs, at ``mean = null_mean`` (vectorised over runs).

    The restricted MLE of the loss probability ``q`` under ``p - q = null_mean`` is the
    root of ``2n q^2 - B q + losses * delta (1 + delta) = 0`` with ``delta = -null_mean``
    and ``B = (wins + losses)(1 + delta) + 2 delta (n - wins)``... for ``delta >= 0``;
    the variance is ``p + q - delta^2``.
    """
    b, c, n = (np.asarray(x, dtype=np.float64) for x in (wins, losses, n))
    delta = -null_mean
    if delta < 0:  # mirror: a null above 0 is the same problem with wins and losses swapped
        return tango_variance(c, b, n, -null_mean)
    big_b = (b + c) * (1.0 + delta) + 2.0 * delta * (n - b)
    q = (big_b + np.sqrt(np.maximum(big_b ** 2 - 8.0 * n * c * delta * (1.0 + delta), 0.0))) / (4.0 * n)
    p = q - delta
    return np.maximum(p + q - delta * delta, 0.0)


def conditional_power(z: np.ndarray | float, t: float, final_bound: float) -> np.ndarray:
    """P(``Z`` at the last look >= ``final_bound`` | ``Z = z`` at information fraction ``t``),
    if the trend so far continues (drift ``z / sqrt(t)`` per unit of information).

    Only the last look is counted, so this is a slight underestimate of the chance of
    crossing at any later look: a futility stop based on it errs on the side of stopping,
    which never raises the error rate.
    """
    z = np.asarray(z, dtype=np.float64)
    w = z * math.sqrt(t)
    drift = w / t
    rest = 1.0 - t
    return stats.norm.sf((final_bound - w - drift * rest) / math.sqrt(rest))


def null_variance(diffs: np.ndarray, null_mean: float, weights: np.ndarray | None = None) -> float:
    """Variance of ``d`` under the restricted maximum-likelihood multinomial with ``mean = null_mean``.

    ``weights`` makes ``diffs`` a population (its values with their probabilities). The
    support is the observed values plus the ends -1 and +1 (a null the data lie
    entirely on one side of puts its mass there). Observed values get the
    empirical-likelihood weights ``n_j / (n (1 + lam u_j))``, ``u_j = v_j - null_mean``;
    when those would make an end's weight negative, the end takes the rest of the mass
    (``lam = -1 / u_end``). For 0/1 scores this is Tango's score-test variance.

    Example:
        >>> round(null_variance(np.array([1.0] * 10 + [-1.0] * 10 + [0.0] * 80), -0.05), 4)  # Tango
        0.207
    """
    d = np.asarray(diffs, dtype=np.float64)
    if weights is None:
        values, counts = np.unique(d, return_counts=True)
    else:  # a population: values with their probabilities
        keep = np.asarray(weights, dtype=np.float64) > 0
        values, counts = d[keep], np.asarray(weights, dtype=np.float64)[keep]
    if np.all(np.isin(values, (-1.0, 0.0, 1.0))):  # paired 0/1 scores: Tango's closed form
        total = float(np.sum(counts))
        wins, losses = (float(np.sum(counts[values == v])) for v in (1.0, -1.0))
        return float(tango_variance(wins / total, losses / total, 1.0, null_mean))
    u = values - null_mean
    p_obs = counts / counts.sum()
    lo_end, hi_end = -1.0 - null_mean, 1.0 - null_mean

    def ends(lam: float) -> tuple[np.ndarray, float, float]:
        w = p_obs / (1.0 + lam * u)
        rest = max(0.0, 1.0 - float(w.sum()))
        return w, rest, (lo_end if lam > 0 else hi_end)

    if np.all(np.abs(u) < 1e-12):
        return 0.0
    if u.min() < 0.0 < u.max():
        g = lambda lam: float(np.sum(p_obs * u / (1.0 + lam * u)))  # noqa: E731
        lam_lo, lam_hi = -(1.0 - 1e-10) / u.max(), -(1.0 - 1e-10) / u.min()
        lam = sopt.brentq(g, lam_lo, lam_hi, xtol=1e-14)
        # The ends must keep a non-negative weight: 1 + lam u_end >= 0.
        if 1.0 + lam * lo_end >= 0.0 and 1.0 + lam * hi_end >= 0.0:
            w = p_obs / (1.0 + lam * u)
            return float(np.sum(w * u * u))
    # Boundary solution: all observed on one side of the null, or an end's weight binds.
    lam = -1.0 / lo_end if float(np.sum(p_obs * u)) > 0.0 else -1.0 / hi_end
    w, rest, end = ends(lam)
    return float(np.sum(w * u * u) + rest * end * end)


def _statistic(diffs: np.ndarray) -> Callable[[float], float]:
    """``null_mean -> Z(null_mean)`` for these differences, the sample reduced once to its
    values and their counts (an interval solves for many null means)."""
    values, counts = np.unique(diffs, return_counts=True)
    n, mean = diffs.size, float(diffs.mean())

    def z(null_mean: float) -> float:
        gap = mean - null_mean
        v0 = null_variance(values, null_mean, weights=counts)
        if v0 <= 1e-15:
            return math.copysign(math.inf, gap) if abs(gap) > 1e-12 else 0.0
        return gap / math.sqrt(v0 / n)

    return z


def score_statistic(diffs: Sequence[float], null_mean: float) -> float:
    """``(mean(d) - null_mean) / sqrt(V0 / n)``, ``V0`` the null variance (0 when n = 0)."""
    d = np.asarray(diffs, dtype=np.float64)
    return _statistic(d)(null_mean) if d.size else 0.0


def repeated_interval(diffs: Sequence[float], bound: float) -> tuple[float, float]:
    """``{m : -bound < Z(m) < bound}``: the repeated confidence interval at a look with z-boundary ``bound``."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0 or not math.isfinite(bound):
        return -1.0, 1.0
    mean = float(d.mean())
    z = _statistic(d)

    def solve(target: float, a: float, b: float) -> float:
        fa = z(a) - target
        fb = z(b) - target
        if fa * fb > 0:  # no crossing inside: the interval reaches the end of the range
            return a if abs(fa) < abs(fb) else b
        return float(sopt.brentq(lambda m: z(m) - target, a, b, xtol=1e-9))

    lower = solve(bound, -1.0 + 1e-9, mean) if mean > -1.0 + 1e-9 else -1.0
    upper = solve(-bound, mean, 1.0 - 1e-9) if mean < 1.0 - 1e-9 else 1.0
    return round(lower, 6), round(upper, 6)


def score_interval(diffs: Sequence[float], *, confidence: float) -> MeanCI:
    """The mean paired difference with its two-sided score interval at ``confidence``:
    ``{m : |Z(m)| < z_{(1 + confidence) / 2}}``, ``Z`` the score statistic with the null
    variance (Tango's interval for paired 0/1 scores, the restricted-MLE score interval for
    other scores). Each tail holds about ``(1 - confidence) / 2`` also with a few discordant
    pairs among a hundred records, where a percentile bootstrap of the mean does not
    (``tests/test_stat_checks.py`` computes its tails exactly).

    Example:
        >>> ci = score_interval([1.0] * 3 + [-1.0] * 2 + [0.0] * 95, confidence=0.95)
        >>> bool(ci.low < 0.01 < ci.high), ci.n
        (True, 100)

    Raises:
        ValueError: confidence not in (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return MeanCI(None, None, None, 0)
    low, high = repeated_interval(d, float(stats.norm.ppf(0.5 + confidence / 2.0)))
    return MeanCI(float(d.mean()), low, high, int(d.size))

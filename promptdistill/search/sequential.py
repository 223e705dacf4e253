"""Anytime-valid bounds on a paired quality difference, and how many records a decision needs.

A candidate prompt and the baseline are scored on the same records; ``d_i = candidate_i -
baseline_i`` lies in [-1, 1]. :func:`confidence_sequence` gives, after every record,
bounds ``L_t <= mean(d) <= U_t`` that hold *simultaneously for every t* with probability
at least ``1 - 2 alpha`` (each side at most ``alpha``). So the race may look after every
batch and stop as soon as a bound decides, without the error rate growing with the
number of looks: this is what "anytime-valid" buys over a bootstrap interval recomputed
at every look.

The bound is the predictable plug-in empirical-Bernstein confidence sequence of
Waudby-Smith & Ramdas ("Estimating means of bounded random variables by betting",
JRSS-B 2024, Theorem 2), applied to ``x_i = (d_i + 1) / 2`` in [0, 1]. It adapts to the
variance: with few discordant pairs (most records scored the same) it narrows fast, and
a run with no discordant pair is still bounded by its prior variance, never [0, 0].

Why written here and not taken from a library: ``confseq`` (the authors' package) ships
only as a C++ source distribution that needs Boost headers to build, and
``expectation`` is not served by PyPI; the closed form is a few lines of numpy, and
``tests/test_sequential.py`` checks its error rate by simulation.

Example:
    >>> lo, hi = confidence_sequence([0.0] * 300 + [1.0] * 30 + [-1.0] * 30, alpha=0.05)
    >>> bool(lo[-1] > -0.1 and hi[-1] < 0.1)
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Plan", "confidence_sequence", "plan_records"]

_LAMBDA_CAP = 0.5
"""Largest bet (the paper's c); 1/2 keeps psi_E finite and the bound stable early on."""


def confidence_sequence(diffs: Sequence[float], *, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on the mean paired difference after each record.

    Args:
        diffs: paired differences in [-1, 1], in the order the records were evaluated.
        alpha: the miscoverage of *each* side, over all t at once.

    Returns:
        (lower, upper), arrays of ``len(diffs)``, clipped to [-1, 1].

    Raises:
        ValueError: alpha not in (0, 0.5], or a difference outside [-1, 1].
    """
    if not 0.0 < alpha <= 0.5:
        raise ValueError(f"alpha must be in (0, 0.5], got {alpha}")
    d = np.asarray(diffs, dtype=np.float64)
    if d.size == 0:
        return np.zeros(0), np.zeros(0)
    if np.any(np.abs(d) > 1.0 + 1e-9) or not np.all(np.isfinite(d)):
        raise ValueError("paired differences must be finite and in [-1, 1]")
    x = (np.clip(d, -1.0, 1.0) + 1.0) / 2.0
    t = np.arange(1, x.size + 1, dtype=np.float64)
    # Running mean and variance with the paper's priors (1/2 and 1/4), indexed so that
    # mu_prev[i] and var_prev[i] use records before i only (predictable).
    mu = (0.5 + np.cumsum(x)) / (t + 1.0)
    mu_prev = np.concatenate(([0.5], mu[:-1]))
    var = (0.25 + np.cumsum((x - mu) ** 2)) / (t + 1.0)
    var_prev = np.concatenate(([0.25], var[:-1]))
    log_term = math.log(1.0 / alpha)
    lam = np.minimum(np.sqrt(2.0 * log_term / (var_prev * t * np.log1p(t))), _LAMBDA_CAP)
    v = 4.0 * (x - mu_prev) ** 2
    psi = (-np.log1p(-lam) - lam) / 4.0
    sum_lam = np.cumsum(lam)
    centre = np.cumsum(lam * x) / sum_lam
    radius = (log_term + np.cumsum(v * psi)) / sum_lam
    lower_x, upper_x = np.maximum(centre - radius, 0.0), np.minimum(centre + radius, 1.0)
    # A CS may be intersected over time: the running max/min stays valid and never widens.
    lower_x, upper_x = np.maximum.accumulate(lower_x), np.minimum.accumulate(upper_x)
    return 2.0 * lower_x - 1.0, 2.0 * upper_x - 1.0


@dataclass(frozen=True)
class Plan:
    """What a spec's data can decide, before any candidate is evaluated."""

    pool: int
    """Dev records available to the race."""
    discordance: float
    """Assumed share of records where candidate and baseline score differently."""
    alpha: float
    """Per-candidate error rate (after the correction across candidates)."""
    margin: float
    """The spec's allowed quality drop."""
    certifiable_margin: float
    """The smallest margin the whole pool certifies for a candidate exactly as good as the
    baseline, in at least half of the runs (the median lower bound's distance below 0)."""
    needed: int | None
    """Records at which that median lower bound clears ``-margin`` (None: beyond ``max_records``)."""

    def sentence(self) -> str:
        """The plan in one line, for logs and summaries."""
        need = f"~{self.needed} needed" if self.needed is not None else "more than the simulated maximum needed"
        verdict = "can" if self.certifiable_margin <= self.margin else "cannot"
        return (f"{self.pool} dev records {verdict} certify a drop of at most {self.margin:g} "
                f"(certifiable margin {self.certifiable_margin:.3f} at {self.discordance:.0%} discordant pairs, "
                f"alpha {self.alpha:.3g} per candidate; {need})")


def plan_records(pool: int, *, discordance: float, margin: float, alpha: float, max_records: int = 5000,
                 simulations: int = 200, seed: int = 0) -> Plan:
    """Simulate races of a candidate exactly as good as the baseline.

    Each record is discordant with probability ``discordance`` (then +1 or -1 with equal
    odds), else a tie. Returns the margin the pool can certify and the records the
    spec's ``margin`` needs, both from the median lower bound over ``simulations`` runs.
    """
    if pool < 0:
        raise ValueError(f"pool must be at least 0, got {pool}")
    if not 0.0 <= discordance <= 1.0:
        raise ValueError(f"discordance must be in [0, 1], got {discordance}")
    n = max(pool, max_records)
    rng = np.random.default_rng(seed)
    u = rng.random((simulations, n))
    signs = np.where(rng.random((simulations, n)) < 0.5, -1.0, 1.0)
    d = np.where(u < discordance, signs, 0.0)
    lowers = np.stack([confidence_sequence(row, alpha=alpha)[0] for row in d])
    median_lower = np.median(lowers, axis=0)
    certifiable = float(-median_lower[pool - 1]) if pool > 0 else 1.0
    ok = np.flatnonzero(median_lower > -margin)
    needed = int(ok[0]) + 1 if ok.size else None
    return Plan(pool=pool, discordance=discordance, alpha=alpha, margin=margin,
                certifiable_margin=max(0.0, certifiable), needed=needed)

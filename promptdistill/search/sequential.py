"""The race's two non-inferiority tests, and how many records a decision needs.

* Discrete scores (0/1, shares of a few checks) on a pool of at least 100 records:
  :class:`GroupSequentialTest`, a group-sequential test on the race's planned looks
  (:mod:`promptdistill.search.group_sequential`).
* Continuous scores (judges, python metrics), and smaller pools: :class:`ConfidenceSequenceTest`,
  the anytime-valid betting bound below with its bet tuned to the records the plan expects
  the race to need (fixed from the screen records before any certify record is scored).

:func:`plan_records` says, before a race, what margin its pool certifies with 80% power
and how many records the spec's margin needs. The rest of this docstring is the betting
bound.

A candidate prompt and the baseline are scored on the same records; ``d_i = candidate_i -
baseline_i`` lies in [-1, 1]. :func:`confidence_sequence` gives, after every record,
bounds ``L_t <= mean(d) <= U_t`` that hold *simultaneously for every t* with probability
at least ``1 - 2 alpha`` (each side at most ``alpha``). So the race may look after every
batch and stop as soon as a bound decides, without the error rate growing with the
number of looks: this is what "anytime-valid" buys over a bootstrap interval recomputed
at every look.

The bound is a betting confidence sequence (Waudby-Smith & Ramdas, "Estimating means of
bounded random variables by betting", JRSS-B 2024, section 4) on ``x_i = (d_i + 1) / 2``
in [0, 1]. For each candidate mean ``m`` a gambler bets a fraction ``lambda_t`` of its
wealth that ``x_t`` exceeds ``m``: ``K_t(m) = prod(1 + lambda_i (x_i - m))``. Under
``mean <= m`` the wealth is a nonnegative supermartingale, so by Ville's inequality it
reaches ``1/alpha`` with probability at most ``alpha``; every ``m`` whose wealth ever got
there is ruled out, and the lower bound is the largest ruled-out ``m``. The bet is the
paper's predictable plug-in, ``sqrt(2 log(1/alpha) / (sigma_{t-1}^2 t log(1 + t)))``,
capped at 0.9 and the same for every ``m``, so the wealth falls as ``m`` rises and the
ruled-out set is an interval (computed on a grid of 801 values, rounded towards the safe
side). The upper bound is the same construction on ``1 - x``. Betting adapts to the
variance like an empirical-Bernstein bound but is tighter on the discrete differences a
metric gives (measured: 1.3-1.9x fewer records at 5-20% discordant pairs and margins
0.05-0.1), and a run with no discordant pair is still bounded, never [0, 0] (with no
discordant pair in ``n`` records a drop of ``m`` is ruled out only once ``n`` is large
enough that ``(1 - m/2)^n`` would be unlikely: the rule of three, not a degenerate interval).

Why written here and not taken from a library: ``confseq`` (the authors' package) ships
only as a C++ source distribution that needs Boost headers to build, and
``expectation`` is not served by PyPI; the construction is a few lines of numpy, and
``tests/test_search.py`` checks its error rate by simulation.

Example:
    >>> lo, hi = confidence_sequence([0.0, 1.0, 0.0, -1.0, 0.0] * 80, alpha=0.05)
    >>> bool(-0.15 < lo[-1] < 0.0 < hi[-1] < 0.15)
    True
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import optimize as sopt
from scipy import stats

from promptdistill.core.settings import check, setting
from promptdistill.search import group_sequential as gs

__all__ = [
    "ConfidenceSequenceTest",
    "GroupSequentialTest",
    "Plan",
    "confidence_sequence",
    "discordance_upper_bound",
    "group_sequential_power",
    "last_bounds",
    "looks",
    "make_test",
    "plan_records",
]

_BET_CAP = 0.9
"""Largest fraction of wealth bet per record: below 1, so one adverse record never ruins the
gambler, and independent of ``m``, so the ruled-out means form an interval."""
_GRID = np.linspace(0.0, 1.0, 801)


def _bets(x: np.ndarray, alpha: float, horizon: int | None = None) -> np.ndarray:
    """Predictable bets: each uses the records before it only. With a ``horizon`` (fixed
    before the race: the records the plan expects it to need, at most the pool) the bet is
    tuned to be tightest there, ``sqrt(2 log(1/alpha) / (sigma^2 horizon))``, instead of
    shrinking with ``t log t``: still valid at every t (any predictable bet is), and about
    15% tighter at the horizon. ``x`` may hold one run per row (the bets run along the last axis)."""
    t = np.arange(1, x.shape[-1] + 1, dtype=np.float64)
    mu = (0.5 + np.cumsum(x, axis=-1)) / (t + 1.0)
    var = (0.25 + np.cumsum((x - mu) ** 2, axis=-1)) / (t + 1.0)
    var_prev = np.concatenate((np.full(x.shape[:-1] + (1,), 0.25), var[..., :-1]), axis=-1)
    scale = t * np.log1p(t) if horizon is None else float(max(horizon, 1))
    return np.minimum(np.sqrt(2.0 * math.log(1.0 / alpha) / (var_prev * scale)), _BET_CAP)


def _lower_x(x: np.ndarray, alpha: float, horizon: int | None = None) -> np.ndarray:
    """Anytime-valid lower bounds on the mean of ``x`` in [0, 1] after each observation."""
    log_threshold = math.log(1.0 / alpha)
    bet = _bets(x, alpha, horizon)
    log_wealth = np.cumsum(np.log1p(bet[:, None] * (x[:, None] - _GRID[None, :])), axis=0)
    ruled_out = np.maximum.accumulate(log_wealth >= log_threshold, axis=0)
    # The wealth falls as m rises, so the ruled-out means are [0, m*]: take the largest.
    count = ruled_out.sum(axis=1)
    return np.where(count > 0, _GRID[np.maximum(count - 1, 0)], 0.0)


def _final_lower_x(runs: np.ndarray, alpha: float, horizon: int | None = None) -> np.ndarray:
    """``_lower_x(row, alpha, horizon)[-1]`` for each row of ``runs``, by bisection on the grid.

    The log wealth falls as m rises at every record (the bets do not depend on m), so "ruled
    out by the last record" is monotone in m: ten passes over the runs find the largest mean
    ruled out, where the grid takes 801 (a plan's 1,000 runs: 0.2 s instead of 8 s). The
    same sums in the same order as on the grid, so the same bound."""
    log_threshold = math.log(1.0 / alpha)
    bet = _bets(runs, alpha, horizon)
    lo = np.full(runs.shape[0], -1)  # the largest grid index known ruled out (-1: none yet)
    hi = np.full(runs.shape[0], _GRID.size)  # the smallest known not ruled out
    while np.any(hi - lo > 1):
        open_ = hi - lo > 1
        mid = (lo + hi) // 2
        m = _GRID[np.clip(mid, 0, _GRID.size - 1)][:, None]
        out = (np.cumsum(np.log1p(bet * (runs - m)), axis=1) >= log_threshold).any(axis=1)
        lo = np.where(open_ & out, mid, lo)
        hi = np.where(open_ & ~out, mid, hi)
    return np.where(lo >= 0, _GRID[np.maximum(lo, 0)], 0.0)


def _checked_x(diffs: Sequence[float], alpha: float) -> np.ndarray:
    """``x = (d + 1) / 2`` in [0, 1]; ValueError for an alpha outside (0, 0.5] or a difference outside [-1, 1]."""
    if not 0.0 < alpha <= 0.5:
        raise ValueError(f"alpha must be in (0, 0.5], got {alpha}")
    d = np.asarray(diffs, dtype=np.float64)
    if not np.all(np.isfinite(d)) or np.any(np.abs(d) > 1.0 + 1e-9):
        raise ValueError("paired differences must be finite and in [-1, 1]")
    return (np.clip(d, -1.0, 1.0) + 1.0) / 2.0


def confidence_sequence(diffs: Sequence[float], *, alpha: float,
                        horizon: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on the mean paired difference after each record.

    The lower bound is the largest mean ruled out from below (every mean at or under it
    is ruled out), the upper bound the smallest ruled out from above: a candidate is
    certified non-inferior at a margin when ``lower >= -margin``.

    Args:
        diffs: paired differences in [-1, 1], in the order the records were evaluated.
        alpha: the miscoverage of *each* side, over all t at once.
        horizon: the record count the bets are tuned for, fixed before the first record
            (None: no known end).

    Returns:
        (lower, upper), arrays of ``len(diffs)`` in [-1, 1].

    Raises:
        ValueError: alpha not in (0, 0.5], or a difference outside [-1, 1].
    """
    x = _checked_x(diffs, alpha)
    if x.size == 0:
        return np.zeros(0), np.zeros(0)
    lower_x = _lower_x(x, alpha, horizon)
    upper_x = 1.0 - _lower_x(1.0 - x, alpha, horizon)
    # Rounded to the grid's own precision: -0.03 must read -0.03, not -0.030000000000000027.
    return np.round(2.0 * lower_x - 1.0, 9), np.round(2.0 * upper_x - 1.0, 9)


def last_bounds(diffs: Sequence[float], *, alpha: float, horizon: int | None = None) -> tuple[float, float]:
    """``confidence_sequence(diffs)``'s bounds after the last record, by the plan's bisection
    (the same sums as the grid, so the same bounds, without those after every earlier record)."""
    x = _checked_x(diffs, alpha)
    if x.size == 0:
        raise ValueError("bounds after the last record need at least one record")
    lower_x = _final_lower_x(x[None, :], alpha, horizon)[0]
    upper_x = 1.0 - _final_lower_x(1.0 - x[None, :], alpha, horizon)[0]
    return float(np.round(2.0 * lower_x - 1.0, 9)), float(np.round(2.0 * upper_x - 1.0, 9))


def looks(pool: int, *, first: int = 50) -> list[int]:
    """Certify records seen at each look: ``first``, doubling, ending at ``pool``.

    Example:
        >>> looks(300, first=50)
        [50, 100, 200, 300]
    """
    if pool <= 0:
        return []
    sizes = [min(first, pool)]
    while sizes[-1] < pool:
        sizes.append(min(2 * sizes[-1], pool))
    return sizes


@dataclass(frozen=True)
class GroupSequentialTest:
    """Discrete scores: the group-sequential test on the planned looks ``looks(pool, first)``.

    Each side (non-inferior, inferior) has error rate at most ``alpha`` over all looks.
    """

    pool: int
    alpha: float
    first_look: int = 50
    name = "group-sequential"

    def looks(self) -> list[int]:
        """Certify records seen at each look: the planned ``first``, doubling, to the pool."""
        return looks(self.pool, first=self.first_look)

    def boundary(self, n: int) -> float:
        """The z-boundary at the look after ``n`` records (a look of the plan, else ValueError)."""
        planned = self.looks()
        if n not in planned:
            raise ValueError(f"{n} records is not a planned look of this race ({planned})")
        return float(gs.obf_boundaries([k / self.pool for k in planned], alpha=self.alpha)[planned.index(n)])

    def verdict(self, diffs: Sequence[float], margin: float) -> str | None:
        """'non-inferior', 'inferior', 'futile' (stop: a certification is out of reach) or
        None (go on) after ``len(diffs)`` records."""
        n = len(diffs)
        c = self.boundary(n)
        z = gs.score_statistic(diffs, -margin)
        if z >= c:
            return "non-inferior"
        if z <= -c:
            return "inferior"
        t = n / self.pool
        if gs.FUTILITY_FROM <= t < 1.0 and gs.conditional_power(z, t, self.boundary(self.pool)) < gs.FUTILITY_CP:
            return "futile"
        return None

    def decide(self, diffs: Sequence[float], margin: float) -> tuple[str | None, float, float]:
        """The verdict with the repeated confidence interval at this look, (verdict, lower, upper)."""
        lower, upper = gs.repeated_interval(diffs, self.boundary(len(diffs)))
        return self.verdict(diffs, margin), lower, upper


@dataclass(frozen=True)
class ConfidenceSequenceTest:
    """Continuous scores: the betting confidence sequence, its bets tuned to ``horizon`` records."""

    pool: int
    alpha: float
    first_look: int = 50
    horizon: int | None = None
    """The records the bets are tuned for, fixed before the race (:attr:`Plan.horizon`); None: the pool."""
    name = "confidence sequence"

    def looks(self) -> list[int]:
        """A look every ``first_look`` records: the bound is valid at every record, so looking
        more often costs no error rate and stops a race as soon as a batch decides it
        (doubling looks made summarize race 400 records where fewer may have decided)."""
        if self.pool <= 0:
            return []
        step = max(1, min(self.first_look, self.pool))
        return list(range(step, self.pool, step)) + [self.pool]

    def decide(self, diffs: Sequence[float], margin: float) -> tuple[str | None, float, float]:
        """'non-inferior', 'inferior', 'futile' or None (go on), with the bounds after ``len(diffs)`` records."""
        lo, hi = last_bounds(diffs, alpha=self.alpha, horizon=self.horizon or self.pool)
        verdict = "non-inferior" if lo >= -margin else "inferior" if hi <= -margin else None
        # Only a race whose bound already shows the candidate below the baseline is checked.
        if verdict is None and hi < 0.0 and self.futile(diffs, margin):
            verdict = "futile"
        return verdict, lo, hi

    def futile(self, diffs: Sequence[float], margin: float) -> bool:
        """Is a certification out of reach by the pool's end, were the trend so far to continue?

        The group-sequential test's rule, by simulation: from ``FUTILITY_FROM`` of the pool,
        the rest of the pool is drawn ``FUTILITY_RUNS`` times from the differences seen so
        far, and the race stops when fewer than ``FUTILITY_CP`` of the continued races end
        with the bound certifying. Seeded by the records seen, so the same records give the
        same verdict. A stop only withholds a certification, so it never raises the error
        rate. Without it, a candidate clearly below the margin raced the whole pool to end
        undecided (docs/bench/make_run.md).
        """
        d = np.asarray(diffs, dtype=np.float64)
        n, pool = d.size, self.pool
        if n < 2 or not gs.FUTILITY_FROM <= n / pool < 1.0:
            return False
        rng = np.random.default_rng(n)
        runs = np.concatenate([np.broadcast_to(d, (FUTILITY_RUNS, n)),
                               rng.choice(d, size=(FUTILITY_RUNS, pool - n))], axis=1)
        lower = 2.0 * _final_lower_x((np.clip(runs, -1.0, 1.0) + 1.0) / 2.0, self.alpha, self.horizon or pool) - 1.0
        return float(np.mean(lower >= -margin - 1e-9)) < gs.FUTILITY_CP


FUTILITY_RUNS = 200
"""Continued races a confidence-sequence futility check draws (a share under 0.02 is at most 3 of them)."""


MIN_GROUP_SEQUENTIAL_POOL = 100
"""Below this many certify records the score statistic's normal approximation is not to be
trusted (16 tied pairs give z = 1.33 against a 0.1 drop, while a true 0.1 drop leaves all
16 tied with probability 0.9^16 = 0.19): small pools use the confidence sequence, which is
valid at any n."""


def make_test(*, discrete: bool, pool: int, alpha: float, first_look: int = 50,
              horizon: int | None = None) -> GroupSequentialTest | ConfidenceSequenceTest:
    """The race's test for this kind of score and pool size (see the module docstring);
    ``horizon`` tunes the confidence sequence's bets (:attr:`Plan.horizon`)."""
    if discrete and pool >= MIN_GROUP_SEQUENTIAL_POOL:
        return GroupSequentialTest(pool=pool, alpha=alpha, first_look=first_look)
    return ConfidenceSequenceTest(pool=pool, alpha=alpha, first_look=first_look, horizon=horizon)


PLAN_POWER = 0.8
"""Plans say what a race achieves in 4 runs out of 5 for a candidate exactly as good as the baseline."""
PLAN_CONFIDENCE = 0.9
"""Plans assume the discordance at the upper 90% bound of what the screen records show."""


@dataclass(frozen=True)
class PlanAssumption:
    """What a plan assumes when nothing was measured (``promptdistill plan``, a race whose screen
    gave no pairs)."""

    discordance: float = setting(0.2, "assumed share of records where candidate and baseline differ",
                                 at_least=0, at_most=1)

    def __post_init__(self) -> None:
        check(self)


def discordance_upper_bound(discordant: float, n: int, *, confidence: float = PLAN_CONFIDENCE) -> float | None:
    """Upper Clopper-Pearson bound on the share of discordant pairs (None without pairs).

    ``discordant`` may be a sum of squared differences (continuous scores): the bound on
    ``E[d^2]``, which plays the discordance's part in the plan.

    Example:
        >>> round(discordance_upper_bound(0, 16), 3)  # none of 16 differ: still up to 13.4%
        0.134
    """
    if n <= 0:
        return None
    if discordant >= n:
        return 1.0
    return float(stats.beta.ppf(confidence, discordant + 1.0, n - discordant))


@dataclass(frozen=True)
class Plan:
    """What a spec's data can decide, before any candidate is evaluated."""

    pool: int
    """Certify records available to the race."""
    discordance: float
    """Assumed share of records where candidate and baseline score differently."""
    alpha: float
    """Per-candidate error rate (after the correction across candidates)."""
    margin: float
    """The spec's allowed quality drop (negative: the gain a superiority race must certify)."""
    certifiable_margin: float
    """The smallest drop the whole pool certifies with 80% power for a candidate exactly
    as good as the baseline."""
    needed: int | None
    """Records with which the race certifies ``margin`` with 80% power (None: more than ``max_records``)."""
    test: str = "group-sequential"
    """Which test the race runs (group-sequential for discrete scores, confidence sequence for continuous)."""
    basis: str = ""
    """Where the discordance comes from (assumed, or the screen records' upper bound)."""
    power: float = PLAN_POWER
    horizon: int | None = None
    """The confidence sequence's bets are tuned to this many records (None: the group-sequential
    test, which has no bets): the records a race with bets tuned to the whole pool would need
    with 80% power, at most the pool. Tighter where the race is expected to end, ~5% looser
    at the pool's end; fixed before any certify record is scored, so the error rate holds."""

    def sentence(self) -> str:
        """The plan in one line, for logs and summaries. The power is the race's, for a finalist
        (one that passed the screen: :func:`~promptdistill.search.racing.screen_pass_chance`)."""
        basis = f", {self.basis}" if self.basis else ""
        tuned = f" tuned to {self.horizon} records" if self.horizon and self.pool else ""
        if self.margin < 0:
            # Superiority by -margin (the quality-first objective): the test moves with its null, so a
            # candidate gaining -margin + m is certified about as often as a tie is at margin m.
            gain = -self.margin
            return (f"{self.pool} certify records certify a gain above {gain:g} with {self.power:.0%} power once "
                    f"raced for a candidate about {gain + self.certifiable_margin:.3f} better than the baseline "
                    f"(certifiable margin {self.certifiable_margin:.3f} at {self.discordance:.0%} discordant "
                    f"pairs{basis}; {self.test}{tuned}, alpha {self.alpha:.3g} per candidate)")
        need = f"~{self.needed} records needed" if self.needed is not None else "more records than planned for"
        verdict = "can" if self.certifiable_margin <= self.margin else "cannot"
        return (f"{self.pool} certify records {verdict} certify a drop of at most {self.margin:g} with "
                f"{self.power:.0%} power once raced (certifiable margin {self.certifiable_margin:.3f} at "
                f"{self.discordance:.0%} discordant pairs{basis}; {self.test}{tuned}, alpha {self.alpha:.3g} per "
                f"candidate; {need} for {self.margin:g})")


def group_sequential_power(delta: float, n: int, discordance: float, alpha: float, first_look: int) -> float:
    """Power of the group-sequential test on ``n`` records at a true tie (normal approximation,
    the null variance at its population value), its futility stops included."""
    planned = looks(n, first=first_look)
    fractions = [k / n for k in planned]
    bounds = gs.obf_boundaries(fractions, alpha=alpha)
    d = max(discordance, 1e-9)
    v0 = gs.null_variance(np.array([-1.0, 0.0, 1.0]), -delta, weights=np.array([d / 2, 1.0 - d, d / 2]))
    return gs.crossing_probability(bounds, fractions, drift=delta * math.sqrt(n / v0), scale=math.sqrt(d / v0),
                                   lowers=gs.futility_bounds(bounds, fractions))


def _gs_plan(pool: int, discordance: float, margin: float, alpha: float, first_look: int,
             max_records: int) -> tuple[float, int | None]:
    certifiable = 1.0
    if pool > 0 and group_sequential_power(0.999, pool, discordance, alpha, first_look) >= PLAN_POWER:
        certifiable = float(sopt.brentq(lambda m: group_sequential_power(m, pool, discordance, alpha, first_look) - PLAN_POWER,
                                        1e-4, 0.999, xtol=1e-5))
    if group_sequential_power(margin, max_records, discordance, alpha, first_look) < PLAN_POWER:
        return certifiable, None
    lo, hi = 1, max_records  # power(lo) < 0.8 <= power(hi)
    while hi - lo > max(1, hi // 200):  # to 0.5%: plenty for a plan
        mid = (lo + hi) // 2
        if group_sequential_power(margin, mid, discordance, alpha, first_look) >= PLAN_POWER:
            hi = mid
        else:
            lo = mid
    return certifiable, hi


def _cs_runs(rng: np.random.Generator, simulations: int, n: int, discordance: float) -> np.ndarray:
    """``simulations`` runs of ``x = (d + 1) / 2`` at a true tie: ``d`` is +-1 on a ``discordance`` share."""
    signs = np.where(rng.random((simulations, n)) < 0.5, -1.0, 1.0)
    return (np.where(rng.random((simulations, n)) < discordance, signs, 0.0) + 1.0) / 2.0


def _cs_needed(x: np.ndarray, alpha: float, margin: float, horizon: int) -> int | None:
    """Records by which 80% of the runs ``x`` have certified ``margin``: the first record where
    the wealth against "the drop is at least the margin" reaches 1/alpha (None: beyond the runs)."""
    n, m0 = x.shape[1], (1.0 - margin) / 2.0
    crossings = []
    for chunk in np.array_split(x, max(1, x.shape[0] // 200)):  # bounded memory: 200 runs at a time
        hit = np.cumsum(np.log1p(_bets(chunk, alpha, horizon) * (chunk - m0)), axis=1) >= math.log(1.0 / alpha)
        crossings.append(np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, n + 1))
    needed = int(np.quantile(np.concatenate(crossings), PLAN_POWER))
    return needed if needed <= n else None


def _cs_plan(pool: int, discordance: float, margin: float, alpha: float, max_records: int, simulations: int,
             seed: int, first_look: int) -> tuple[float, int | None, int]:
    """(certifiable margin, records needed, horizon) for the confidence sequence, by simulation
    with a fixed seed; the race tunes its bets to the horizon, and so does the plan."""
    rng = np.random.default_rng(seed)
    runs = _cs_runs(rng, simulations, max_records, discordance)
    untuned = _cs_needed(runs, alpha, margin, pool if pool > 0 else max_records)
    if pool > 0:
        horizon = min(pool, max(untuned or pool, min(first_look, pool)))
    else:
        horizon = untuned or max_records
    certifiable = 1.0
    if pool > 0:
        drops = -(2.0 * _final_lower_x(_cs_runs(rng, simulations, pool, discordance), alpha, horizon) - 1.0)
        certifiable = max(0.0, float(np.quantile(drops, PLAN_POWER)))
    return certifiable, _cs_needed(runs, alpha, margin, horizon), horizon


@functools.lru_cache(maxsize=128)  # screening, finalist planning and the summary ask the same plan
def plan_records(pool: int, *, discordance: float, margin: float, alpha: float, discrete: bool = True,
                 first_look: int = 50, max_records: int = 20000, simulations: int = 1000, seed: int = 0,
                 basis: str = "") -> Plan:
    """What a race of ``pool`` certify records decides for a candidate exactly as good as the baseline.

    Each record is discordant with probability ``discordance`` (then +1 or -1 with equal
    odds), else a tie. Returns the margin the pool certifies with 80% power and the
    records with which the spec's ``margin`` is certified with 80% power. Discrete scores
    (the group-sequential test): computed by numerical integration, so the same inputs
    give the same plan. Continuous scores (the confidence sequence): ``simulations`` runs
    with a fixed seed.
    """
    if pool < 0:
        raise ValueError(f"pool must be at least 0, got {pool}")
    if not 0.0 <= discordance <= 1.0:
        raise ValueError(f"discordance must be in [0, 1], got {discordance}")
    small = pool < MIN_GROUP_SEQUENTIAL_POOL
    if discrete:  # the records needed are many, so the group-sequential test would decide them
        gs_certifiable, needed = _gs_plan(pool if not small else 0, discordance, margin, alpha, first_look,
                                          max_records)
        if needed is not None and needed < MIN_GROUP_SEQUENTIAL_POOL:
            needed = MIN_GROUP_SEQUENTIAL_POOL
    if not discrete or small:
        certifiable, cs_needed, horizon = _cs_plan(pool, discordance, margin, alpha, min(max_records, 5000),
                                                   simulations, seed, first_look)
        test = ConfidenceSequenceTest.name
        if not discrete:
            needed = cs_needed
    else:
        certifiable, test, horizon = gs_certifiable, GroupSequentialTest.name, None
    return Plan(pool=pool, discordance=discordance, alpha=alpha, margin=margin, certifiable_margin=certifiable,
                needed=needed, test=test, basis=basis, horizon=horizon)

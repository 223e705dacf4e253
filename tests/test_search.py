"""The search kernel (``promptdistill.search``): pure, deterministic, no engine.

* the confidence sequence: its error rate by simulation (discrete and continuous paired
  differences at exactly ``-margin``), a control showing the simulation catches a bound that
  is not anytime-valid, coverage, shrinking, no degenerate bound, input checks;
* the group-sequential test: boundaries against published values, the null variance
  against a brute-force restricted MLE, futility, decisions that depend only on the records
  before each look (its size and power by simulation through ``race()``, and those of the
  confidence sequence and the test split: ``tests/test_stat_checks.py``);
* the race's family-wise error rate by simulation through ``race()`` itself;
* ``looks``, ``can_beat``, ``screen``, ``race``, ``select`` on scripted scores
  (``fakes.FakeEvaluator``), ``plan_records``, ``Budget``, ``split_records``.

Monte Carlo tolerance: a simulated rate is compared with its bound plus three binomial
standard errors at the bound, ``3 sqrt(a (1 - a) / runs)``. The seeds are fixed, so every
run draws the same numbers; the tolerance only says how far a correct bound could land
above alpha by chance with these many runs (the measured rates are far below it).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from bundled_specs import load_spec
from fakes import FakeClock, FakeEngine, FakeEvaluator, FakeMeter, fake_report, numbered_records
from promptdistill.engine.meter import CallMeter
from promptdistill.search.budget import Budget
from promptdistill.search import group_sequential as gs
from promptdistill.search import racing
from promptdistill.search.racing import (
    Candidate,
    Decision,
    RaceSettings,
    SCREEN_ONLY,
    can_beat,
    clearly_better,
    looks,
    paired_mean,
    plan_finalists,
    plan_from_screen,
    preference_order,
    race,
    screen,
    screen_then_race,
    select,
)
from promptdistill.search.selection import FASTER, KEPT, TIE
from promptdistill.search.sequential import (
    ConfidenceSequenceTest,
    GroupSequentialTest,
    confidence_sequence,
    discordance_upper_bound,
    plan_records,
)
from promptdistill.search.splits import split_records
from promptdistill.specs.datasets import dataset_for, records, write_records

SPEC = load_spec("ticket_triage")
EXACT = lambda a, b: 0.0  # noqa: E731 - every cost difference counts
GENEROUS = dict(max_calls=10**9, max_minutes=600.0)


def tolerance(rate: float, runs: int) -> float:
    """Three binomial standard errors of a simulated rate whose true value is ``rate``."""
    return 3.0 * math.sqrt(rate * (1.0 - rate) / runs)


def discrete_diffs(rng: np.random.Generator, runs: int, n: int, *, mean: float, discordance: float) -> np.ndarray:
    """Paired differences in {-1, 0, 1}: +1 or -1 on a ``discordance`` share of records, mean ``mean``."""
    up, down = (discordance + mean) / 2.0, (discordance - mean) / 2.0
    u = rng.random((runs, n))
    return np.where(u < up, 1.0, np.where(u < up + down, -1.0, 0.0))


def bounds(diffs: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """The confidence sequence of every run (rows), after every record (columns)."""
    pairs = [confidence_sequence(row, alpha=alpha) for row in diffs]
    return np.stack([lo for lo, _ in pairs]), np.stack([hi for _, hi in pairs])


# --- the confidence sequence: error rate by simulation -------------------------------------

MARGIN, ALPHA = 0.05, 0.05
LOOKS = list(range(50, 401, 50))


@pytest.fixture(scope="module")
def at_the_margin():
    """1,000 runs of 400 paired 0/1 scores whose mean difference is exactly -MARGIN:
    20% discordant pairs (12.5% of records where the candidate is worse, 7.5% better)."""
    diffs = discrete_diffs(np.random.default_rng(2024), 1000, 400, mean=-MARGIN, discordance=0.2)
    lower, upper = bounds(diffs, ALPHA)
    return diffs, lower, upper


def test_false_certification_rate_at_the_margin_is_at_most_alpha_at_every_look(at_the_margin):
    diffs, lower, upper = at_the_margin
    runs = len(diffs)
    assert diffs.mean() == pytest.approx(-MARGIN, abs=0.003)  # the simulation is at the margin
    # "Ever": a run that crossed once counts at every later look (the race would have stopped).
    certified = np.maximum.accumulate(lower >= -MARGIN, axis=1)
    called_inferior = np.maximum.accumulate(upper <= -MARGIN, axis=1)
    rates = {t: float(certified[:, t - 1].mean()) for t in LOOKS}
    print("false certification share by look:", rates)  # measured: 0.007 at 50 up to 0.030 at 400
    for t in LOOKS:
        assert rates[t] <= ALPHA + tolerance(ALPHA, runs), (t, rates[t])
        # The other side: "inferior" for a candidate exactly at the margin is wrong too.
        assert called_inferior[:, t - 1].mean() <= ALPHA + tolerance(ALPHA, runs)
    # The race reads the bound at its looks only: that is the same as "ever crossed" because
    # the bounds are intersected over time (a crossing between looks is still seen at the next).
    for t in LOOKS:
        assert np.array_equal(certified[:, t - 1], lower[:, t - 1] >= -MARGIN)


def test_the_simulation_catches_a_bound_that_is_not_anytime_valid(at_the_margin):
    """Control: the same runs with a fixed-n one-sided normal bound recomputed at every look
    (what a bootstrap or t interval per look does) exceed alpha, so the test above can fail."""
    diffs, _, _ = at_the_margin
    z = norm.ppf(1.0 - ALPHA)
    crossed = np.zeros(len(diffs), dtype=bool)
    for t in LOOKS:
        head = diffs[:, :t]
        crossed |= head.mean(axis=1) - z * head.std(axis=1, ddof=1) / math.sqrt(t) > -MARGIN
    naive = float(crossed.mean())
    print("naive per-look bound, share ever certified:", naive)  # measured: 0.175
    assert naive > ALPHA + tolerance(ALPHA, len(diffs))


def test_false_certification_rate_with_continuous_scores():
    """Judge-like scores in [0, 1]: baseline Beta(0.5, 0.5) (mean 0.5), candidate
    Beta(0.45, 0.55) (mean 0.45): a mean difference of exactly -MARGIN, high variance."""
    rng = np.random.default_rng(7)
    runs, n = 300, 400
    diffs = rng.beta(0.45, 0.55, (runs, n)) - rng.beta(0.5, 0.5, (runs, n))
    lower, upper = bounds(diffs, ALPHA)
    certified = np.maximum.accumulate(lower >= -MARGIN, axis=1)
    rates = [float(certified[:, t - 1].mean()) for t in LOOKS]
    print("continuous: false certification share by look:", rates)
    assert max(rates) <= ALPHA + tolerance(ALPHA, runs)
    assert np.maximum.accumulate(upper <= -MARGIN, axis=1)[:, -1].mean() <= ALPHA + tolerance(ALPHA, runs)


def test_bounds_contain_the_running_truth():
    """A better candidate (mean +0.3, half the pairs discordant): over 300 runs, the share
    whose bounds ever exclude the true mean is at most alpha per side."""
    truth, alpha, runs = 0.3, 0.1, 300
    diffs = discrete_diffs(np.random.default_rng(11), runs, 200, mean=truth, discordance=0.5)
    lower, upper = bounds(diffs, alpha)
    assert np.all(lower <= upper)
    above = (lower > truth).any(axis=1).mean()
    below = (upper < truth).any(axis=1).mean()
    assert above <= alpha + tolerance(alpha, runs) and below <= alpha + tolerance(alpha, runs)
    assert (above + below) <= 2 * alpha + tolerance(2 * alpha, runs)
    # ...and informative: after 200 records most runs show the candidate is better.
    assert (lower[:, -1] > 0.0).mean() > 0.9


def test_bounds_shrink_with_n_and_never_widen():
    rng = np.random.default_rng(3)
    diffs = rng.choice([-1.0, 0.0, 1.0], p=[0.1, 0.8, 0.1], size=1600)
    lower, upper = confidence_sequence(diffs, alpha=ALPHA)
    width = upper - lower
    checkpoints = [25, 50, 100, 200, 400, 800, 1600]
    widths = [width[n - 1] for n in checkpoints]
    assert all(a > b for a, b in zip(widths, widths[1:])), widths
    assert widths[-1] < widths[2] / 2  # 16 times the records: less than half the width
    assert np.all(np.diff(lower) >= 0) and np.all(np.diff(upper) <= 0)  # intersected over time
    assert np.all(lower >= -1.0) and np.all(upper <= 1.0)
    assert lower[-1] < diffs.mean() < upper[-1]


@pytest.mark.parametrize("alpha", [0.05, 0.1 / 3, 0.2])
def test_a_run_without_discordant_pairs_is_not_a_degenerate_bound(alpha):
    """n ties are (1 - m)^n likely under a true drop of m (every discordant pair a loss), so
    a valid bound must still allow any m with (1 - m)^n > alpha: lower <= -(1 - alpha^(1/n))."""
    n = np.arange(1, 401)
    lower, upper = confidence_sequence(np.zeros(400), alpha=alpha)
    must_allow = 1.0 - alpha ** (1.0 / n)
    assert np.all(lower <= -must_allow + 1e-12) and np.all(upper >= must_allow - 1e-12)
    assert lower[9] < -0.2 < 0.2 < upper[9]  # 10 ties: not [0, 0]
    assert lower[-1] == pytest.approx(-upper[-1])  # ties favour neither side


@pytest.mark.parametrize("horizon", [None, 40, 542])
def test_the_plans_end_of_run_bound_is_the_grids_bound(horizon):
    """The plan bisects for each run's last lower bound: it must be the grid's, exactly, on
    runs with ties, all-discordant runs, continuous scores and a one-record run."""
    from promptdistill.search.sequential import _cs_runs, _final_lower_x, _lower_x

    rng = np.random.default_rng(7)
    runs = np.vstack([_cs_runs(rng, 20, 300, d) for d in (0.0, 0.16, 1.0)] + [rng.random((10, 300))])
    expected = np.array([_lower_x(row, 0.05, horizon)[-1] for row in runs])
    assert np.array_equal(_final_lower_x(runs, 0.05, horizon), expected)
    assert len(set(expected.tolist())) > 10  # the runs span many grid points
    one = rng.random((5, 1))
    assert np.array_equal(_final_lower_x(one, 0.2), [_lower_x(row, 0.2)[-1] for row in one])


def test_confidence_sequence_rejects_invalid_input():
    for alpha in (0.0, -0.1, 0.51, 1.0):
        with pytest.raises(ValueError, match="alpha"):
            confidence_sequence([0.0, 1.0], alpha=alpha)
    for bad in ([1.5], [0.0, -1.01], [float("nan")], [float("inf")]):
        with pytest.raises(ValueError, match=r"\[-1, 1\]"):
            confidence_sequence(bad, alpha=0.05)
    lo, hi = confidence_sequence([], alpha=0.05)
    assert lo.size == 0 and hi.size == 0
    lo, hi = confidence_sequence([1.0, -1.0, 1.0], alpha=0.5)  # the ends of the range are valid
    assert lo.shape == hi.shape == (3,)


# --- the group-sequential test (discrete scores) ---------------------------------------------


def test_boundaries_match_published_obrien_fleming_values():
    """Lan-DeMets O'Brien-Fleming-type spending, five equal looks, one-sided 0.025 (Jennison &
    Turnbull table; gsDesign's sfLDOF gives the same): 4.877 / 3.357 / 2.680 / 2.290 / 2.031."""
    c = gs.obf_boundaries([0.2, 0.4, 0.6, 0.8, 1.0], alpha=0.025)
    assert c == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=6e-4)
    # One look is the fixed-n test; the design spends exactly alpha at a tie.
    assert gs.obf_boundaries([1.0], alpha=0.05)[0] == pytest.approx(norm.ppf(0.95), abs=1e-6)
    fractions = [50 / 984, 100 / 984, 200 / 984, 400 / 984, 800 / 984, 1.0]
    c = gs.obf_boundaries(fractions, alpha=0.05)
    assert gs.crossing_probability(c, fractions, drift=0.0) == pytest.approx(0.05, abs=1e-6)
    assert all(a > b for a, b in zip(c, c[1:]))  # early looks need overwhelming evidence
    with pytest.raises(ValueError, match="increase"):
        gs.obf_boundaries([0.5, 0.4, 1.0], alpha=0.05)


def test_null_variance_is_tangos_for_binary_and_the_restricted_mle_otherwise():
    from scipy.optimize import minimize

    # Binary: the closed form against a brute-force maximum of the constrained likelihood.
    wins, losses, n, delta = 10, 14, 100, 0.05
    d = np.array([1.0] * wins + [-1.0] * losses + [0.0] * (n - wins - losses))

    def nll(q):
        p = q[0] - delta
        return -(wins * np.log(p) + losses * np.log(q[0]) + (n - wins - losses) * np.log(1 - p - q[0]))

    q = minimize(nll, [0.15], bounds=[(delta + 1e-9, (1 + delta) / 2 - 1e-9)]).x[0]
    assert gs.null_variance(d, -delta) == pytest.approx(q + (q - delta) - delta ** 2, abs=1e-6)
    # Shares of five checks (json_field): the restricted MLE over the support plus the ends.
    values = np.array([-0.4, -0.2, 0.0, 0.2, 0.6])
    counts = np.array([5, 12, 60, 18, 5])
    d = np.repeat(values, counts)
    support = np.array([-1.0, *values, 1.0])
    full = np.array([0, *counts, 0])
    cons = [{"type": "eq", "fun": lambda w: w.sum() - 1}, {"type": "eq", "fun": lambda w: w @ support + 0.05}]
    w0 = np.full(support.size, 1 / support.size)
    res = minimize(lambda w: -np.sum(full * np.log(np.maximum(w, 1e-12))), w0, constraints=cons,
                   bounds=[(0, 1)] * support.size, method="SLSQP", options={"ftol": 1e-12, "maxiter": 500})
    brute = float(res.x @ (support + 0.05) ** 2)
    assert gs.null_variance(d, -0.05) == pytest.approx(brute, rel=2e-3)


def test_futility_stops_a_trend_that_cannot_certify():
    """A trend far below the margin at the fifth of the pool is inferior; one drifting below it
    at half the pool has no conditional power left (futile), and the same trend at a quarter
    is too early to tell. (Size and power by simulation: tests/test_stat_checks.py.)"""
    bad = np.array([-1.0] * 30 + [0.0] * 70)
    assert GroupSequentialTest(pool=400, alpha=0.05).verdict(bad, 0.05) == "inferior"
    drifting = np.array(([-1.0] * 2 + [0.0] * 7 + [1.0]) * 20)  # 200 records (half the pool), mean -0.1
    assert GroupSequentialTest(pool=400, alpha=0.05).verdict(drifting, 0.05) == "futile"
    assert GroupSequentialTest(pool=400, alpha=0.05).verdict(drifting[:100], 0.05) is None  # too early to tell
    assert gs.conditional_power(0.0, 0.5, 1.96) < gs.conditional_power(1.5, 0.5, 1.96)
    # The futility boundary is where the conditional power is exactly FUTILITY_CP.
    bounds = gs.obf_boundaries([0.25, 0.5, 1.0], alpha=0.05)
    f = gs.futility_bounds(bounds, [0.25, 0.5, 1.0])
    assert f[0] == f[2] == -np.inf
    assert gs.conditional_power(f[1], 0.5, bounds[-1]) == pytest.approx(gs.FUTILITY_CP, abs=1e-9)


def test_the_test_decides_from_the_records_before_each_look_only():
    """Changing record t changes no decision made at a look before t (both tests), and the
    confidence sequence's bound after record t - 1 does not move either (its bets are
    predictable: a bet that looked at the current record would move it)."""
    rng = np.random.default_rng(5)
    diffs = rng.choice([-1.0, 0.0, 1.0], p=[0.15, 0.7, 0.15], size=400)
    gst = GroupSequentialTest(pool=400, alpha=0.05)
    planned = looks(400)
    before = [gst.decide(diffs[:n], 0.05) for n in planned]
    for t in (60, 150, 300):
        changed = diffs.copy()
        changed[t] = -changed[t] if changed[t] else 1.0
        after = [gst.decide(changed[:n], 0.05) for n in planned]
        for n, a, b in zip(planned, before, after):
            if n <= t:
                assert a == b, (t, n)
        lo, hi = confidence_sequence(diffs, alpha=0.05, horizon=400)
        lo2, hi2 = confidence_sequence(changed, alpha=0.05, horizon=400)
        assert np.array_equal(lo[:t], lo2[:t]) and np.array_equal(hi[:t], hi2[:t])
        assert not (np.array_equal(lo[t:], lo2[t:]) and np.array_equal(hi[t:], hi2[t:]))


def test_the_repeated_interval_agrees_with_the_decision():
    gst = GroupSequentialTest(pool=400, alpha=0.05)
    rng = np.random.default_rng(8)
    for _ in range(30):
        diffs = rng.choice([-1.0, 0.0, 1.0], p=[0.1, 0.8, 0.1], size=200)
        verdict, lo, hi = gst.decide(diffs, 0.05)
        assert lo < diffs.mean() < hi
        assert (verdict == "non-inferior") == (lo >= -0.05 - 1e-6)
        assert (verdict == "inferior") == (hi <= -0.05 + 1e-6)
    with pytest.raises(ValueError, match="planned look"):
        gst.boundary(150)


@pytest.mark.parametrize("horizon", [None, 100])
def test_continuous_scores_keep_an_anytime_valid_bound_whatever_its_fixed_horizon(horizon):
    """Judge-like scores at exactly -margin, every look of the race (every 50 records): the
    confidence sequence's false certification share is at most alpha over 600 runs (a limit
    below 2 x alpha), with its bets tuned to the pool or to a horizon a quarter of it (any
    horizon fixed before the race keeps the error rate); tuned to the pool, it is tighter at
    the pool's end than the untuned bound."""
    rng = np.random.default_rng(17)
    runs, n, alpha = 600, 400, 0.05
    assert alpha + tolerance(alpha, runs) < 2 * alpha
    diffs = rng.beta(0.45, 0.55, (runs, n)) - rng.beta(0.5, 0.5, (runs, n))
    test = ConfidenceSequenceTest(pool=n, alpha=alpha, horizon=horizon)
    looks_at = np.array(test.looks()) - 1
    # The bound after record k is the same whether the run stops there or goes on (its bets are
    # predictable), so one pass per run gives the decision at every look.
    certified = [bool(np.any(confidence_sequence(row, alpha=alpha, horizon=horizon or n)[0][looks_at] >= -MARGIN))
                 for row in diffs]
    share = float(np.mean(certified))
    print(f"continuous, horizon {horizon or n}: false certification {share:.4f} over {runs} runs")
    assert share <= alpha + tolerance(alpha, runs)
    row = discrete_diffs(np.random.default_rng(1), 1, n, mean=0.0, discordance=0.2)[0]
    tuned, _ = confidence_sequence(row, alpha=alpha, horizon=n)
    plain, _ = confidence_sequence(row, alpha=alpha)
    assert tuned[-1] > plain[-1]


def test_the_confidence_sequence_stops_for_futility_a_candidate_it_already_shows_worse():
    """Continuous scores (sd 0.25), a 984-record pool, margin 0.05, alpha 0.1, 30 simulated
    races each: a candidate 0.065 below the baseline (summarize's described variant ended at
    [-0.077, -0.043] after all 984) stops for futility, never before 40% of the pool, in most
    races and by 450 records in half; a tie is never stopped, and one 0.03 below (inside the
    margin) is certified in as many races as without the stop, but one."""
    def run(mean, *, futility=True):
        rng = np.random.default_rng(5)
        test = ConfidenceSequenceTest(pool=984, alpha=0.1)
        out = []
        for _ in range(30):
            row = np.clip(rng.normal(mean, 0.25, 984), -1, 1)
            for size in test.looks():
                verdict, lo, hi = test.decide(row[:size], MARGIN)
                if verdict == "futile" and not futility:
                    verdict = None
                if verdict:
                    break
            out.append((verdict, size, hi))
        return out

    worse = run(-0.065)
    futile = [(size, hi) for verdict, size, hi in worse if verdict == "futile"]
    assert len(futile) >= 22 and all(size >= 0.4 * 984 and hi < 0 for size, hi in futile)
    assert np.median([size for _, size, _ in worse]) <= 450
    assert {verdict for verdict, _, _ in run(0.0)} == {"non-inferior"}
    certified = [sum(v == "non-inferior" for v, _, _ in run(-0.03, futility=f)) for f in (True, False)]
    assert certified[0] >= certified[1] - 1, certified


def test_the_confidence_sequence_plan_promises_its_power_and_its_horizon_ends_races_sooner():
    """Continuous-score plans: in 400 simulated races at a true tie (16% and 30% discordant
    pairs, alpha 0.1, a 984-record pool), the bound with the bets tuned to the plan's horizon
    certifies the margin within the plan's ``needed`` records in 80% (+-0.06) of them; the
    horizon is below the pool, and tuned to it the races need fewer records than with the
    bets tuned to the whole pool (median of the same 400 races)."""
    for discordance in (0.16, 0.3):
        plan = plan_records(984, discordance=discordance, margin=MARGIN, alpha=0.1, discrete=False)
        assert plan.test == "confidence sequence" and plan.needed is not None
        assert plan.needed < plan.horizon < 984, plan
        assert f"tuned to {plan.horizon} records" in plan.sentence()
        diffs = discrete_diffs(np.random.default_rng(11), 400, 984, mean=0.0, discordance=discordance)

        def first_certified(horizon: int) -> np.ndarray:
            lower = np.array([confidence_sequence(row, alpha=0.1, horizon=horizon)[0] for row in diffs])
            ok = lower >= -MARGIN
            return np.where(ok.any(axis=1), ok.argmax(axis=1) + 1, 985)

        tuned, pooled = first_certified(plan.horizon), first_certified(984)
        power = float(np.mean(tuned <= plan.needed))
        print(f"discordance {discordance}: horizon {plan.horizon}, needed {plan.needed}, simulated power "
              f"{power:.3f}; median records tuned {np.median(tuned):.0f} vs pool-tuned {np.median(pooled):.0f}")
        assert abs(power - 0.8) <= 0.06, (discordance, power)
        assert np.median(tuned) < np.median(pooled)


# --- plan_records ------------------------------------------------------------------------------


def test_plan_needs_more_records_for_more_discordance_or_a_smaller_margin():
    def needed(**kw):  # the records needed do not depend on the pool: pool 0 skips its bound
        return plan_records(0, **{"discordance": 0.2, "margin": 0.05, "alpha": 0.05, **kw}).needed

    assert needed(discordance=0.05) < needed(discordance=0.2) < needed(discordance=0.4)
    assert needed(margin=0.1) < needed(margin=0.05) < needed(margin=0.03)
    assert needed(alpha=0.1) < needed(alpha=0.01)
    small = plan_records(100, discordance=0.2, margin=0.05, alpha=0.05)
    quiet = plan_records(984, discordance=0.05, margin=0.05, alpha=0.05)
    noisy = plan_records(984, discordance=0.6, margin=0.05, alpha=0.05)
    assert small.needed == needed()
    assert quiet.certifiable_margin < noisy.certifiable_margin  # more discordance, wider bounds
    assert plan_records(400, discordance=0.2, margin=0.05, alpha=0.05).certifiable_margin < small.certifiable_margin
    assert "can certify" in quiet.sentence() and "cannot certify" in noisy.sentence()
    assert "80% power" in quiet.sentence()


def test_plan_is_stable_and_matches_the_published_design_figures():
    """Discrete plans are computed, not simulated: the same inputs give the same figures.
    At a tie, 20% discordance, one-sided 0.025, looks 50/100/200/384 the group-sequential
    design certifies about 0.064 with 80% power (FINDINGS: 0.0641 by simulation, without
    futility stops); ours stops for futility at 200 of 384 records, which costs a little."""
    a = plan_records(384, discordance=0.2, margin=0.03, alpha=0.025)
    b = plan_records(384, discordance=0.2, margin=0.03, alpha=0.025)
    assert a == b
    assert 0.0635 <= a.certifiable_margin <= 0.068, a.certifiable_margin
    assert a.needed == pytest.approx(1750, rel=0.08)  # FINDINGS: ~1,750 for 0.03
    cs = plan_records(384, discordance=0.2, margin=0.05, alpha=0.025, discrete=False)
    assert cs.certifiable_margin == pytest.approx(0.0775, abs=0.005)  # the pool-tuned bound (FINDINGS)
    assert cs.test == "confidence sequence" and a.test == "group-sequential"


def test_plan_edge_cases():
    empty = plan_records(0, discordance=0.2, margin=0.05, alpha=0.05)
    assert empty.certifiable_margin == 1.0 and "0 certify records cannot certify" in empty.sentence()
    hopeless = plan_records(50, discordance=1.0, margin=0.001, alpha=0.01, max_records=200)
    assert hopeless.needed is None and "more records than planned for" in hopeless.sentence()
    with pytest.raises(ValueError, match="pool"):
        plan_records(-1, discordance=0.2, margin=0.05, alpha=0.05)
    with pytest.raises(ValueError, match="discordance"):
        plan_records(10, discordance=1.5, margin=0.05, alpha=0.05)


def test_the_plan_uses_an_upper_bound_on_the_screens_discordance():
    """No discordant pair in 16 screen records does not mean none in the pool: the plan
    assumes the upper 90% bound (13.4%), not 0%."""
    assert discordance_upper_bound(0, 16) == pytest.approx(1 - 0.1 ** (1 / 16), abs=1e-9)
    assert discordance_upper_bound(16, 16) == 1.0 and discordance_upper_bound(0, 0) is None
    base, quiet = cand("baseline", 100.0), cand("quiet", 50.0)
    base.screen, quiet.screen = fake_report("baseline", [1.0, 0.0] * 8), fake_report("quiet", [1.0, 0.0] * 8)
    plan = plan_from_screen(base, [quiet], pool=984, settings=RaceSettings(margin=0.05, alpha=0.1))
    assert plan.discordance == pytest.approx(0.134, abs=0.001)
    assert "upper 90% bound from 0 discordance in 16 screen pairs" in plan.sentence()
    assert plan.alpha == 0.1


# --- the race's family-wise error rate by simulation -----------------------------------------


def simulate_races(runs: int, *, true_diff: float, seed: int, k: int = 3, pool: int = 100, margin: float = 0.2,
                   discordance: float = 0.4, alpha: float = 0.1, discrete: bool = True) -> tuple[float, np.ndarray]:
    """``runs`` races of ``k`` finalists against a baseline on 0/1 scores; returns the share
    of races that certified any finalist, and each finalist's certification share.

    Baseline scores are Bernoulli(0.5); each finalist differs from the baseline on a
    ``discordance`` share of records, so that its mean difference is ``true_diff``.
    ``discrete=False`` races them with the confidence sequence, as a judge's scores are.
    """
    rng = np.random.default_rng(seed)
    up, down = (discordance + true_diff) / 2.0, (discordance - true_diff) / 2.0
    settings = RaceSettings(margin=margin, alpha=alpha, finalists=k, first_look=25, discrete=discrete)
    recs = numbered_records(pool)
    any_certified, each = 0, np.zeros(k)
    for _ in range(runs):
        base_scores = (rng.random(pool) < 0.5).astype(float)
        scores = {"baseline": base_scores.tolist()}
        for j in range(k):
            u = rng.random(pool)  # flip a baseline 0 with probability 2 up, a 1 with 2 down
            flip = np.where(base_scores == 0.0, u < 2 * up, u < 2 * down)
            scores[f"c{j}"] = np.where(flip, 1.0 - base_scores, base_scores).tolist()
        base = Candidate("baseline", SPEC, cost=100.0)
        finalists = [Candidate(f"c{j}", SPEC, cost=10.0 * (j + 1)) for j in range(k)]
        race(base, finalists, recs, FakeEvaluator(scores), budget=Budget(CallMeter(FakeEngine()), **GENEROUS),
             settings=settings, resolution=EXACT)
        certified = [c.decision.certified for c in finalists]
        any_certified += any(certified)
        each += certified
    return any_certified / runs, each / runs


def test_race_family_wise_error_rate_with_every_finalist_at_the_margin():
    """3 finalists exactly at -margin, looks at 25, 50 and 100 records, alpha 0.1 for the
    family, through ``race()`` itself: the share of races that certify any of them is at most alpha."""
    runs, alpha = 600, 0.1
    fwer, each = simulate_races(runs, true_diff=-0.2, seed=5, alpha=alpha)
    print(f"race FWER {fwer:.4f} over {runs} races; per finalist {each.round(4).tolist()}")
    assert fwer <= alpha + tolerance(alpha, runs)
    assert np.all(each <= alpha / 3 + tolerance(alpha / 3, runs))


def test_race_family_wise_error_rate_with_the_confidence_sequence_looking_every_25_records():
    """The same races through the confidence sequence (continuous scores' test), which looks
    every ``first_look`` records (25, 50, 75, 100) with its bets tuned to the pool: still
    at most alpha, and the same races without a drop are certified, so it is not vacuous."""
    runs, alpha = 600, 0.1
    fwer, each = simulate_races(runs, true_diff=-0.2, seed=7, alpha=alpha, discrete=False)
    print(f"confidence-sequence race FWER {fwer:.4f} over {runs} races; per finalist {each.round(4).tolist()}")
    assert fwer <= alpha + tolerance(alpha, runs)
    assert np.all(each <= alpha / 3 + tolerance(alpha / 3, runs))
    assert simulate_races(100, true_diff=0.1, seed=8, discrete=False)[0] > 0.5


def test_race_certifies_finalists_that_are_as_good_as_the_baseline():
    """Power control for the test above: the same races with no true drop certify most of the
    time, so a low false-certification share is not a race that never certifies."""
    share, _ = simulate_races(100, true_diff=0.0, seed=6)
    assert share > 0.6


# --- looks and can_beat ----------------------------------------------------------------------


def test_looks_double_up_to_the_pool():
    assert looks(300, first=50) == [50, 100, 200, 300]
    assert looks(400, first=50) == [50, 100, 200, 400]
    assert looks(1000, first=100) == [100, 200, 400, 800, 1000]
    assert looks(101, first=50) == [50, 100, 101]
    assert looks(50, first=50) == [50]
    assert looks(30, first=50) == [30]
    assert looks(0) == [] and looks(-3) == []


def cand(cid: str, cost: float, static: int = 100, **kw) -> Candidate:
    return Candidate(cid, SPEC, cost=cost, static_tokens=static, **kw)


def test_can_beat_needs_a_lower_cost_beyond_the_resolution_or_a_tie():
    best = cand("best", 100.0, static=300)
    five = lambda a, b: 5.0  # noqa: E731
    assert can_beat(cand("a", 90.0, static=900), best, five)  # clearly cheaper: static tokens do not matter
    assert not can_beat(cand("b", 110.0, static=10), best, five)  # clearly dearer, whatever its static tokens
    # Within the resolution (both sides, the edge included) it is a tie: quality will decide.
    for cost in (97.0, 95.0, 103.0, 105.0):
        assert can_beat(cand("t", cost, static=301), best, five), cost
    # Against the baseline a tie may not be more than 5% dearer.
    assert can_beat(cand("t", 105.0), best, five, best_is_baseline=True)
    assert not can_beat(cand("t", 105.01), best, lambda a, b: 20.0, best_is_baseline=True)
    assert can_beat(cand("c", 100.0, static=300), best, EXACT)  # equal cost: a tie
    assert not can_beat(cand("d", 100.1, static=3), best, EXACT)


# --- screen ---------------------------------------------------------------------------------


def screen_setup(meter: FakeMeter | None = None):
    """Baseline 0.75 on 8 screen records; margin 0.25; candidates with constant differences."""
    n = 8
    scores = {"baseline": [0.75] * n, "cheap_bad": [0.25] * n, "cheap_ok": [0.75] * n, "edge": [0.5] * n,
              "mid_ok": [0.625] * n, "slow": [1.0] * n, "tie_fewer": [0.75] * n}
    base = cand("baseline", 100.0, static=300)
    cands = [cand("slow", 150.0, static=400), cand("mid_ok", 60.0), cand("edge", 80.0), cand("cheap_ok", 40.0),
             cand("cheap_bad", 30.0), cand("tie_fewer", 100.0, static=200)]
    return base, cands, numbered_records(n), FakeEvaluator(scores, meter=meter)


def test_screen_keeps_plausible_candidates_that_can_beat_the_baseline_cheapest_first():
    base, cands, recs, ev = screen_setup()
    by_id = {c.id: c for c in cands}
    settings = RaceSettings(margin=0.25, finalists=3)
    finalists = screen(base, cands, recs, ev, budget=Budget(FakeMeter(), **GENEROUS), settings=settings,
                       resolution=EXACT)
    assert [c.id for c in finalists] == ["cheap_ok", "mid_ok", "edge"]  # edge: exactly -margin is plausible
    # One evaluation, baseline first, then by cost.
    assert ev.calls == [(["baseline", "cheap_bad", "cheap_ok", "mid_ok", "edge", "tie_fewer", "slow"],
                         [str(i) for i in range(8)])]
    assert by_id["cheap_bad"].notes == ["screening: mean difference -0.500 on 8 records, 80% upper bound -0.500, "
                                        "is below -0.25"]
    assert by_id["slow"].notes == ["screening: cannot beat the baseline (cost 150.0 vs 100.0, resolution 0.0)"]
    assert by_id["tie_fewer"].notes == ["screening: not among the 3 finalists"]  # same cost: a tie, could win
    assert all(not c.notes for c in finalists)
    assert paired_mean(by_id["mid_ok"].screen, base.screen) == -0.125
    assert by_id["cheap_ok"].lm_calls == 8 and by_id["cheap_ok"].mean == 0.75
    # keep= overrides the number of finalists; screened candidates are not evaluated again.
    again = screen(base, cands, recs, ev, budget=Budget(FakeMeter(), **GENEROUS), settings=settings,
                   resolution=EXACT, keep=10)
    assert [c.id for c in again] == ["cheap_ok", "mid_ok", "edge", "tie_fewer"]
    assert len(ev.calls) == 1


def test_screen_does_not_race_a_tie_that_screens_below_the_baseline():
    """A candidate within the resolution of the baseline's cost can win only at the
    baseline's quality or better: screening below it (even inside the margin), it is not
    raced; at the baseline's quality it is; a faster one below it (inside the margin) is."""
    base = cand("baseline", 100.0, static=300)
    cands = [cand("tie_worse", 98.0, static=100), cand("tie_equal", 99.0, static=150),
             cand("fast_worse", 60.0, static=100)]
    ev = FakeEvaluator({"baseline": [0.75] * 8, "tie_worse": [0.625] * 8, "tie_equal": [0.75] * 8,
                        "fast_worse": [0.625] * 8})
    finalists = screen(base, cands, numbered_records(8), ev, budget=Budget(FakeMeter(), **GENEROUS),
                       settings=RaceSettings(margin=0.25, finalists=3), resolution=lambda a, b: 5.0)
    assert [c.id for c in finalists] == ["fast_worse", "tie_equal"]
    worse = cands[0]
    assert worse.notes == ["screening: not faster than the baseline beyond the resolution (cost 98.0 vs 100.0, "
                           "resolution 5.0) and below its quality on the screen records (-0.125 on 8); a tie "
                           "wins only at the baseline's quality or better"]


def test_screen_drops_only_candidates_the_screen_shows_worse_than_the_margin():
    """16 binary screen records and a 0.05 margin: one discordant pair moves the mean by
    0.0625, so the point estimate alone would drop a candidate as good as the baseline by
    chance. Screened out is only what the 80% upper bound puts below -margin."""
    base = cand("baseline", 100.0, static=300)
    base_scores = [1.0] * 8 + [0.0] * 8
    one_loss = [0.0] + [1.0] * 7 + [0.0] * 8            # -1/16: within noise, raced
    many_losses = [0.0] * 4 + [1.0] * 4 + [0.0] * 8     # -4/16, bound -0.13: screened out
    mixed = [0.0] * 3 + [1.0] * 5 + [1.0] * 2 + [0.0] * 6  # -1/16 from 3 losses, 2 wins: raced
    cands = [cand("one_loss", 60.0), cand("many_losses", 50.0), cand("mixed", 70.0)]
    ev = FakeEvaluator({"baseline": base_scores, "one_loss": one_loss, "many_losses": many_losses, "mixed": mixed})
    finalists = screen(base, cands, numbered_records(16), ev, budget=Budget(FakeMeter(), **GENEROUS),
                       settings=RaceSettings(margin=0.05, finalists=3), resolution=EXACT)
    assert [c.id for c in finalists] == ["one_loss", "mixed"]
    upper = racing.screen_upper(cands[1], base)
    # mean -0.25, sd of the diffs sqrt(4/15 - ...) -> bound = -0.25 + 0.8416 * sd / 4
    diffs = np.array(many_losses) - np.array(base_scores)
    assert upper == pytest.approx(diffs.mean() + norm.ppf(0.80) * diffs.std(ddof=1) / 4)
    assert upper < -0.05
    assert cands[1].notes == [f"screening: mean difference -0.250 on 16 records, 80% upper bound {upper:+.3f}, is below -0.05"]
    assert racing.screen_upper(cands[0], base) > -0.05


def test_screen_under_a_budget_screens_the_cheapest_and_notes_the_rest():
    meter = FakeMeter()
    base, cands, recs, ev = screen_setup(meter)
    budget = Budget(meter, max_calls=3 * 8, max_minutes=60)  # the baseline and two candidates
    finalists = screen(base, cands, recs, ev, budget=budget, settings=RaceSettings(margin=0.25), resolution=EXACT)
    assert ev.calls[0][0] == ["baseline", "cheap_bad", "cheap_ok"]
    assert [c.id for c in finalists] == ["cheap_ok"]
    reason = "budget: LM calls (24) allowed 3 of 7 candidates screened"
    assert budget.reason == reason
    for c in cands:
        if c.id not in ("cheap_bad", "cheap_ok"):
            assert c.screen is None and c.notes == [reason], c.id


def test_screen_without_the_baseline_has_no_finalists():
    base, cands, recs, ev = screen_setup(FakeMeter())
    budget = Budget(ev.meter, max_calls=5, max_minutes=60)  # not even the baseline's 8 records
    assert screen(base, cands, recs, ev, budget=budget, settings=RaceSettings(margin=0.25), resolution=EXACT) == []
    assert ev.calls == [] and base.screen is None
    assert all(c.notes == ["budget: LM calls (5) allowed 0 of 7 candidates screened"] for c in cands)


def test_screen_orders_finalists_the_same_whatever_the_input_order():

    orders = set()
    for perm in itertools.permutations([("a", 100.0, 300), ("b", 104.0, 200), ("c", 108.0, 100)]):
        base = cand("baseline", 200.0, static=400)
        cands = [cand(cid, cost, static=static) for cid, cost, static in perm]
        ev = FakeEvaluator({cid: [0.5] * 4 for cid in ("baseline", "a", "b", "c")})
        finalists = screen(base, cands, numbered_records(4), ev, budget=Budget(FakeMeter(), **GENEROUS),
                           settings=RaceSettings(margin=0.05), resolution=lambda a, b: 5.0)
        orders.add(tuple(c.id for c in finalists))
    assert len(orders) == 1, orders


def test_screening_only_open_candidates_finds_the_same_finalists_with_fewer_evaluations():
    """``every=False`` leaves out candidates that could not be finalists whatever their
    quality: over random grids (costs, resolutions, scores, finalists, an ineligible
    candidate) the finalists are exactly those of screening everything, in the same order."""
    rng = np.random.default_rng(7)
    saved = 0
    for trial in range(300):
        n_cands, n_rec = int(rng.integers(1, 9)), 8
        res = float(rng.choice([0.0, 5.0, 20.0, -0.1]))  # -0.1: 10% of the dearer one's cost (the optimizer's kind)
        resolution = (lambda a, b: 0.1 * max(a.cost, b.cost)) if res < 0 else (lambda a, b, r=res: r)
        limit = int(rng.integers(1, 4))
        carried = {f"c{i}" for i in range(n_cands) if rng.random() < 0.2}  # screened before (a distiller round)
        costs = rng.choice(np.arange(40.0, 130.0, 3.0), size=n_cands)
        statics = rng.integers(50, 400, size=n_cands)  # independent of cost: the tie-break is exercised
        scores = {"baseline": rng.integers(0, 2, n_rec).astype(float).tolist()}
        for i in range(n_cands):
            scores[f"c{i}"] = rng.integers(0, 2, n_rec).astype(float).tolist()
        excluded = f"c{int(rng.integers(0, n_cands))}" if trial % 3 == 0 else None

        def run(every: bool) -> tuple[list[str], FakeEvaluator, list[Candidate]]:
            base = cand("baseline", 100.0, static=300)
            cands = [cand(f"c{i}", float(c), static=int(statics[i])) for i, c in enumerate(costs)]
            for c in cands:
                if c.id in carried:
                    c.screen = fake_report(c.id, scores[c.id], ids=[str(i) for i in range(n_rec)])
            ev = FakeEvaluator(scores)
            finalists = screen(base, cands, numbered_records(n_rec), ev, budget=Budget(FakeMeter(), **GENEROUS),
                               settings=RaceSettings(margin=0.125, finalists=limit), resolution=resolution,
                               eligible=lambda c: c.id != excluded, every=every)
            return [c.id for c in finalists], ev, cands

        every_ids, every_ev, _ = run(True)
        open_ids, open_ev, cands = run(False)
        assert open_ids == every_ids, (trial, costs, res, limit)
        evaluated = sum(len(ids) for ids, _ in open_ev.calls)
        assert evaluated <= sum(len(ids) for ids, _ in every_ev.calls)
        saved += sum(len(ids) for ids, _ in every_ev.calls) - evaluated
        for c in cands:
            if c.screen is None and c.id != excluded:
                assert len(c.notes) == 1 and c.notes[0].startswith("screening: "), c.notes
    assert saved > 100  # it does leave candidates out


def test_screening_only_open_candidates_stops_at_the_first_window_that_settles_the_finalist():
    """Cheapest first, a window of candidates within the resolution at a time: once the
    finalist is found, a candidate dearer than it beyond the resolution is not screened."""
    base = cand("baseline", 100.0, static=300)
    cands = [cand("a", 40.0), cand("b", 44.0), cand("c", 60.0), cand("d", 99.0), cand("slow", 150.0)]
    ev = FakeEvaluator({"baseline": [0.5] * 8, "a": [0.25] * 8, "b": [0.5] * 8, "c": [1.0] * 8, "d": [1.0] * 8,
                        "slow": [1.0] * 8})
    finalists = screen(base, cands, numbered_records(8), ev, budget=Budget(FakeMeter(), **GENEROUS),
                       settings=RaceSettings(margin=0.3, finalists=1), resolution=lambda a, b: 5.0, every=False)
    # a (plausible: -0.25 within the 0.3 margin) and b tie within 5: b's better quality wins.
    assert [c.id for c in finalists] == ["b"]
    assert [ids for ids, _ in ev.calls] == [["baseline", "a", "b"]]
    by_id = {c.id: c for c in cands}
    assert by_id["c"].screen is None and by_id["c"].notes == [
        "screening: not screened: it could not be among the 1 finalist(s) whatever its quality (cost 60.0; the "
        "cheaper candidates screened first)"]
    assert by_id["slow"].notes == ["screening: cannot beat the baseline (cost 150.0 vs 100.0, resolution 5.0)"]
    # With three finalists the next window (c) is screened too, and only it: d is dearer than c beyond 5.
    for c in cands:
        c.screen, c.notes, c.lm_calls = None, [], 0
    base.screen = None
    ev = FakeEvaluator(ev.scores)
    finalists = screen(base, cands, numbered_records(8), ev, budget=Budget(FakeMeter(), **GENEROUS),
                       settings=RaceSettings(margin=0.3, finalists=3), resolution=lambda a, b: 5.0, every=False)
    assert [c.id for c in finalists] == ["b", "a", "c"]
    assert [ids for ids, _ in ev.calls] == [["baseline", "a", "b"], ["c"]]


def test_screening_only_open_candidates_under_a_budget_notes_what_it_cut():
    meter = FakeMeter()
    base = cand("baseline", 100.0, static=300)
    cands = [cand("a", 40.0), cand("b", 60.0), cand("c", 80.0)]
    ev = FakeEvaluator({"baseline": [0.5] * 8, "a": [0.0] * 8, "b": [0.0] * 8, "c": [0.5] * 8}, meter=meter)
    budget = Budget(meter, max_calls=3 * 8, max_minutes=60)  # the baseline and two candidates
    finalists = screen(base, cands, numbered_records(8), ev, budget=budget, settings=RaceSettings(margin=0.25),
                       resolution=EXACT, every=False)
    assert finalists == [] and [ids for ids, _ in ev.calls] == [["baseline", "a"], ["b"]]
    assert cands[2].screen is None and cands[2].notes == ["budget: LM calls (24) allowed 0 of 1 candidates screened"]


# --- race -----------------------------------------------------------------------------------

N_POOL = 400
ALTERNATE = [1.0 if i % 2 == 0 else 0.0 for i in range(N_POOL)]  # the baseline: right on every other record


def as_good(n: int = N_POOL) -> list[float]:
    """The baseline's scores with 20% of the pairs discordant, half each way: mean difference 0."""
    out = list(ALTERNATE[:n])
    for i in range(n):
        if i % 10 in (1, 6):  # odd i: baseline 0 -> 1 (+1); i % 10 == 6: baseline 1 -> 0 (-1)
            out[i] = 1.0 - out[i]
    return out


def run_race(cands, scores, *, pool=N_POOL, budget=None, margin=0.05, alpha=0.1, log=None):
    base = cand("baseline", 100.0, static=300)
    ev = FakeEvaluator({"baseline": ALTERNATE[:pool], **scores}, meter=budget.meter if budget else None)
    kw = {"log": log} if log else {}
    race(base, cands, numbered_records(pool), ev, budget=budget or Budget(FakeMeter(), **GENEROUS),
         settings=RaceSettings(margin=margin, alpha=alpha, finalists=max(1, len(cands))), resolution=EXACT, **kw)
    return base, ev


def test_race_decides_clear_cases_early_and_races_the_next_finalist_only_after_one_fails():
    """O'Brien-Fleming boundaries ask for overwhelming evidence at the first look (50 of 400
    records: z >= 6.1) and decide these at the second (100: z >= 4.2). Finalists go in
    turn: ``better`` is raced only once ``worse`` is decided, on the same records, and the
    baseline's scores are reused."""
    worse, better = cand("worse", 10.0), cand("better", 20.0)
    lines = []
    base, ev = run_race([worse, better], {"better": [1.0] * N_POOL, "worse": [0.0] * N_POOL}, log=lines.append)
    first, second = [str(i) for i in range(50)], [str(i) for i in range(50, 100)]
    assert ev.calls == [(["baseline", "worse"], first), (["baseline", "worse"], second),
                        (["better"], first), (["better"], second)]
    b, w = better.decision, worse.decision
    assert (b.verdict, b.n, b.diff_mean, b.alpha) == ("non-inferior", 100, 0.5, 0.05)
    assert (w.verdict, w.n, w.diff_mean, w.alpha) == ("inferior", 100, -0.5, 0.05)
    assert b.certified and not w.certified
    assert -0.05 < b.lower <= 0.5 <= b.upper and w.lower <= -0.5 <= w.upper < -0.05
    assert b.reason == f"certified non-inferior: bounds [{b.lower:+.3f}, {b.upper:+.3f}] after 100 records " \
                       "(group-sequential, alpha 0.05), a drop of 0.05 or more ruled out"
    assert w.reason.startswith("certified inferior: bounds [") and w.reason.endswith("a drop of less than 0.05 ruled out")
    assert b.to_dict()["verdict"] == "non-inferior" and b.to_dict()["n"] == 100
    assert [line.split(";")[0] for line in lines] == ["race: worse: 50 of 400 certify records",
                                                      "race: worse: 100 of 400 certify records",
                                                      "race: better: 50 of 400 certify records",
                                                      "race: better: 100 of 400 certify records"]
    assert lines[-1].startswith("race: better: 100 of 400 certify records; non-inferior [")
    assert base.raced.n == 100 and better.mean == 1.0


def test_a_continuous_race_looks_every_first_look_records_not_at_doubling_looks():
    """The confidence sequence is valid at every record, so a race on continuous scores looks
    every 50 records: a tie with a 0.04 margin is certified at 150 (its bound there is
    [-0.0375, +0.0375]; at 100, [-0.055, +0.055]), where doubling looks went on to 200."""
    base, tie = cand("baseline", 100.0, static=300), cand("tie", 10.0)
    ev = FakeEvaluator({"baseline": [0.5] * 400, "tie": [0.5] * 400})
    race(base, [tie], numbered_records(400), ev, budget=Budget(FakeMeter(), **GENEROUS),
         settings=RaceSettings(margin=0.04, alpha=0.1, finalists=1, discrete=False), resolution=EXACT)
    assert (tie.decision.verdict, tie.decision.n) == ("non-inferior", 150)
    assert "(confidence sequence, alpha 0.1)" in tie.decision.reason
    assert [records for _, records in ev.calls] == [[str(i) for i in range(lo, lo + 50)] for lo in (0, 50, 100)]
    assert ConfidenceSequenceTest(pool=120, alpha=0.1).looks() == [50, 100, 120]
    assert GroupSequentialTest(pool=400, alpha=0.1).looks() == [50, 100, 200, 400]


def test_race_ends_at_the_first_certified_finalist():
    """The finalists come in selection's order, so a later one could win only by a quality
    tie-break: none is raced once one selection would take is certified."""
    cheap, pricey = cand("cheap", 10.0), cand("pricey", 50.0)
    _, ev = run_race([cheap, pricey], {"cheap": [1.0] * N_POOL, "pricey": [1.0] * N_POOL})
    assert (cheap.decision.verdict, cheap.decision.n) == ("non-inferior", 100)
    assert pricey.decision == Decision("not raced", alpha=0.05,
                                       reason="not raced: cheap, raced before it, was certified and would be selected")
    assert ev.evaluated("pricey") == 0 and len(ev.calls) == 2


def test_a_finalist_that_fails_late_hands_over_the_pool():
    """A tie at 20% discordance runs on (no futility stop, no certificate by 400 at alpha
    0.05 with margin 0.01); the next finalist then gets the whole pool."""
    tie, good = cand("tie", 10.0), cand("good", 50.0)
    _, ev = run_race([tie, good], {"tie": as_good(), "good": [1.0] * N_POOL}, margin=0.01)
    assert tie.decision.verdict in ("undecided", "stopped") and not tie.decision.certified
    assert good.decision.certified and ev.evaluated("baseline") == tie.decision.n
    assert ev.evaluated("good") == good.decision.n


def screened(cid: str, cost: float, scores: list[float]) -> Candidate:
    return cand(cid, cost, screen=fake_report(cid, scores))


def test_the_plan_admits_as_many_finalists_as_the_pool_certifies_the_margin_for():
    """k finalists share alpha; the plan takes the most whose share leaves the first one 80%
    power for a candidate a fifth of the margin worse than the baseline (certifiable margin
    at a tie <= 0.04 for 0.05), at the discordance its screen cannot rule out; at least
    one, which then keeps all of alpha."""
    base = screened("baseline", 100.0, [1.0, 0.0] * 8)
    quiet = screened("quiet", 10.0, [1.0, 0.0] * 8)  # no discordant pair in 16: up to 13.4%
    noisy = screened("noisy", 10.0, [0.0, 1.0] * 8)  # all 16 discordant
    settings = RaceSettings(margin=0.05, alpha=0.1, finalists=3)
    k, plan = plan_finalists(base, quiet, pool=984, settings=settings)
    assert k == 3 and plan.alpha == pytest.approx(0.1 / 3) and plan.certifiable_margin <= 0.04
    assert plan.sentence().startswith("984 certify records can certify a drop of at most 0.05")
    k, plan = plan_finalists(base, noisy, pool=984, settings=settings)
    assert k == 1 and plan.alpha == 0.1 and plan.certifiable_margin > 0.05
    # 600 records: room for two at alpha 0.05 each (certifiable 0.0385), not three at 0.033
    # (0.0414), though 0.0414 still certifies 0.05 at a tie; a rule of one finalist admits one.
    k, plan = plan_finalists(base, quiet, pool=600, settings=settings)
    assert k == 2 and plan.alpha == 0.05 and plan.certifiable_margin <= 0.04
    assert 0.04 < plan_records(600, discordance=plan.discordance, margin=0.05, alpha=0.1 / 3).certifiable_margin < 0.05
    assert plan_finalists(base, quiet, pool=600, settings=RaceSettings(margin=0.05, finalists=1))[0] == 1


def test_screen_then_race_screens_for_the_next_finalist_only_when_one_fails():
    """The first finalist (cheapest, plausible on the screen) fails on the certify records;
    only then is the next one screened for, and raced on the same certify records at the
    alpha share fixed before the race. The dearest candidate is never screened."""
    recs = numbered_records(416)
    screen_recs, certify = recs[:16], recs[16:]
    base_scores = [float(i % 2 == 0) for i in range(416)]
    scores = {"baseline": base_scores,
              "c1": base_scores[:16] + [0.0] * 400,  # ties on the screen, worse on every certify record
              "c2": base_scores[:16] + [1.0] * 400, "c3": [1.0] * 416}
    ev = FakeEvaluator(scores)
    base = cand("baseline", 100.0, static=300)
    c1, c2, c3 = cand("c1", 10.0), cand("c2", 20.0), cand("c3", 30.0)
    lines = []
    raced, plan = screen_then_race(base, [c3, c2, c1], screen_recs, certify, ev, budget=Budget(FakeMeter(), **GENEROUS),
                                   settings=RaceSettings(margin=0.1, alpha=0.1, finalists=3), resolution=EXACT,
                                   every=False, log=lines.append)
    ids = lambda lo, hi: [str(i) for i in range(lo, hi)]  # noqa: E731
    assert ev.calls == [(["baseline", "c1"], ids(0, 16)), (["baseline", "c1"], ids(16, 66)),
                        (["baseline", "c1"], ids(66, 116)), (["c2"], ids(0, 16)), (["c2"], ids(16, 66)),
                        (["c2"], ids(66, 116))]
    assert raced == [c1, c2] and c3.screen is None
    assert plan.alpha == pytest.approx(0.1 / 3)
    assert (c1.decision.verdict, c1.decision.alpha) == ("inferior", pytest.approx(0.1 / 3))
    assert (c2.decision.verdict, c2.decision.n) == ("non-inferior", 100)
    assert select(base, raced, resolution=EXACT).winner is c2
    assert len(lines) == 4


def fallback_setup(first_certify: list[float], *, costs=(100.0, 109.0, 118.0), second=(-1, +1)):
    """A baseline (cost 200) and three candidates on 16 screen + 984 certify records: ``a``
    ties on the screen and scores ``first_certify`` after; ``b`` and ``e`` screen ``second``
    records net away from the baseline (-1, 0 or +1) and match it on the certify records."""
    base_scores = [float(i % 2 == 0) for i in range(1000)]

    def nudged(sign: int) -> list[float]:
        out = list(base_scores)
        if sign:
            j = 1 if sign > 0 else 0  # record 1 (baseline 0) up, record 0 (baseline 1) down
            out[j] = 1.0 - out[j]
        return out

    scores = {"baseline": base_scores, "a": base_scores[:16] + first_certify, "b": nudged(second[0]),
              "e": nudged(second[1])}
    recs = numbered_records(1000)
    cands = [cand(cid, cost) for cid, cost in zip("abe", costs)]
    return cand("baseline", 200.0, static=300), cands, recs[:16], recs[16:], FakeEvaluator(scores)


def worse_on(share: int) -> list[float]:
    """The baseline's certify scores, with one record in ``share`` (where it scores 1) turned to 0."""
    return [0.0 if i % share == 0 else float(i % 2 == 0) for i in range(16, 1000)]


def test_the_next_finalist_does_not_depend_on_how_the_first_failed():
    """With a relative resolution (10% of the dearer cost) ties are not transitive: a (100)
    ties b (109), b ties e (118), a does not tie e. Ranked by screen quality the order is
    a, e, b, however a scores on the certify records. Ranked by a's certify scores (as
    before the fix) it was b after a bad failure (-0.5), e after a mild one (-0.04)."""
    tenth = lambda x, y: 0.1 * max(x.cost, y.cost)  # noqa: E731
    seconds = []
    for first in ([0.0] * 984, worse_on(26)):
        base, cands, screen_recs, certify, ev = fallback_setup(first)
        raced, plan = screen_then_race(base, cands, screen_recs, certify, ev, budget=Budget(FakeMeter(), **GENEROUS),
                                       settings=RaceSettings(margin=0.05, alpha=0.1, finalists=3), resolution=tenth,
                                       every=False)
        assert raced[0].id == "a" and not raced[0].decision.certified and plan.alpha == pytest.approx(0.1 / 3)
        seconds.append(raced[1].id)
    assert seconds == ["e", "e"]


def test_a_budget_refusal_before_the_race_does_not_stop_the_fallbacks():
    base, cands, screen_recs, certify, ev = fallback_setup([0.0] * 984)
    budget = Budget(FakeMeter(), **GENEROUS)
    assert budget.affordable(2, 10**10, "example sets") == 0 and budget.reason  # an earlier step was cut
    raced, plan = screen_then_race(base, cands, screen_recs, certify, ev, budget=budget,
                                   settings=RaceSettings(margin=0.05, alpha=0.1, finalists=3), resolution=EXACT,
                                   every=False)
    assert [c.id for c in raced] == ["a", "b"] and raced[1].decision.certified and plan.alpha < 0.1


def test_no_alpha_goes_to_a_fallback_the_call_budget_cannot_race():
    """Room for the baseline and two finalists over the whole pool: two share alpha, not three."""
    base, cands, screen_recs, certify, ev = fallback_setup([0.0] * 984)
    meter = FakeMeter()
    budget = Budget(meter, max_calls=2 * 16 + 3 * 984 + 500, max_minutes=60)
    ev.meter = meter
    raced, plan = screen_then_race(base, cands, screen_recs, certify, ev, budget=budget,
                                   settings=RaceSettings(margin=0.05, alpha=0.1, finalists=3), resolution=EXACT,
                                   every=False)
    assert plan.alpha == 0.05 and [c.id for c in raced] == ["a", "b"] and raced[1].decision.alpha == 0.05


def test_a_certified_finalist_selection_would_not_take_does_not_end_the_race():
    """a is within the resolution of the baseline's cost (a tie) and certified, but below the
    baseline's quality on the certify records, so selection keeps the baseline: the next
    finalist, as good as the baseline, is raced and wins the tie."""
    base, cands, screen_recs, certify, ev = fallback_setup(worse_on(40), costs=(199.0, 199.5, 199.8), second=(0, 0))
    five = lambda x, y: 5.0  # noqa: E731
    raced, _ = screen_then_race(base, cands, screen_recs, certify, ev, budget=Budget(FakeMeter(), **GENEROUS),
                                settings=RaceSettings(margin=0.1, alpha=0.1, finalists=3), resolution=five,
                                every=False)
    assert [c.id for c in raced] == ["a", "b"] and all(c.decision.certified for c in raced)
    chosen = select(base, raced, resolution=five)
    assert chosen.winner is raced[1] and chosen.clause == TIE and chosen.reason.startswith("tie, no worse: b")


def test_screen_then_race_with_one_admitted_finalist_races_no_fallback():
    recs = numbered_records(116)
    base_scores = [float(i % 2 == 0) for i in range(116)]
    scores = {"baseline": base_scores, "c1": [1.0 - b for b in base_scores[:16]] + [0.0] * 100,
              "c2": [1.0] * 116}
    ev = FakeEvaluator(scores)
    base, c1, c2 = cand("baseline", 100.0), cand("c1", 10.0), cand("c2", 20.0)
    # c1 differs from the baseline on all 16 screen records (mean 0): the plan admits one finalist.
    raced, plan = screen_then_race(base, [c1, c2], recs[:16], recs[16:], ev, budget=Budget(FakeMeter(), **GENEROUS),
                                   settings=RaceSettings(margin=0.1, alpha=0.1, finalists=3), resolution=EXACT,
                                   every=False)
    assert raced == [c1] and plan.alpha == 0.1 and c2.screen is None
    assert c1.decision.verdict == "inferior" and c2.decision.verdict == "not raced"
    assert screen_then_race(base, [], recs[:16], recs[16:], ev, budget=Budget(FakeMeter(), **GENEROUS),
                            settings=RaceSettings(margin=0.1), resolution=EXACT) == ([], None)


def test_a_continuous_race_tunes_its_bets_to_the_plans_horizon(monkeypatch):
    """screen_then_race hands the plan's horizon (fixed from the screen records) to the race's
    confidence sequence, at the plan's alpha share and pool, with one finalist admitted or
    several; the group-sequential test of a discrete race has none."""
    made, original = [], racing.make_test

    def recording(**kw):
        made.append(original(**kw))
        return made[-1]

    monkeypatch.setattr(racing, "make_test", recording)
    for discrete, finalists in ((False, 1), (False, 3), (True, 1)):
        base, cands, screen_recs, certify, ev = fallback_setup([float(i % 2 == 0) for i in range(16, 1000)])
        settings = RaceSettings(margin=0.05, alpha=0.1, finalists=finalists, discrete=discrete)
        raced, plan = screen_then_race(base, cands, screen_recs, certify, ev, budget=Budget(FakeMeter(), **GENEROUS),
                                       settings=settings, resolution=EXACT, every=False)
        test = made[-1]
        assert test.alpha == pytest.approx(plan.alpha) and test.pool == plan.pool == 984
        if discrete:
            assert isinstance(test, GroupSequentialTest) and plan.horizon is None
        else:
            assert isinstance(test, ConfidenceSequenceTest) and plan.test == "confidence sequence"
            assert test.horizon == plan.horizon and 50 <= plan.horizon < 984
        assert raced[0].decision.certified


def test_race_leaves_a_candidate_undecided_when_the_pool_runs_out():
    unsure = cand("unsure", 10.0)
    run_race([unsure], {"unsure": as_good(100)}, pool=100)
    d = unsure.decision
    assert (d.verdict, d.n, d.diff_mean, d.alpha) == ("undecided", 100, 0.0, 0.1)
    assert d.lower < -0.05 < d.upper
    assert d.reason == (f"undecided: the certify pool is exhausted; bounds [{d.lower:+.3f}, {d.upper:+.3f}] "
                        "after 100 records (group-sequential, alpha 0.1)")


def test_race_under_a_budget_says_the_budget_ended_it_and_races_no_one_after():
    meter = FakeMeter()
    budget = Budget(meter, max_calls=250, max_minutes=60)
    a, b = cand("a", 10.0), cand("b", 20.0)
    base, ev = run_race([a, b], {"a": as_good(200), "b": as_good(200)}, pool=200, budget=budget)
    # Looks at 50 and 100: the baseline and a, 200 calls; the look at 200 needs 200 more.
    assert [(c, len(ids)) for c, ids in ev.calls] == [(["baseline", "a"], 50), (["baseline", "a"], 50)]
    assert meter.calls == 200 and base.raced.n == 100
    reason = "budget: LM calls (250) allowed 0 of 2 race evaluations"
    assert budget.reason == reason
    assert (a.decision.verdict, a.decision.n) == ("undecided", 100)
    assert a.decision.reason.startswith(f"undecided: {reason} after 100 of 200 certify records; bounds")
    assert b.decision == Decision("not raced", alpha=0.05, reason=f"not raced: {reason}")
    chosen = select(base, [a, b], resolution=EXACT)
    winner, why = chosen.winner, chosen.reason
    assert chosen.kept and winner is base and why == (f"kept: no candidate certified non-inferior (a: undecided: {reason} after 100 of "
                                      f"200 certify records; bounds [{a.decision.lower:+.3f}, {a.decision.upper:+.3f}] "
                                      f"after 100 records (group-sequential, alpha 0.05); b: not raced: {reason}); "
                                      "keeping the baseline")


def test_a_finalist_cut_by_the_budget_at_the_last_look_says_so():
    budget = Budget(FakeMeter(), max_calls=150, max_minutes=60)
    a = cand("a", 10.0)
    run_race([a], {"a": as_good(100)}, pool=100, budget=budget)
    assert a.decision.n == 50
    assert "budget" in a.decision.reason and "exhausted" not in a.decision.reason


def test_finalists_with_no_certify_records_are_not_raced_for_that_reason():
    only = cand("only", 10.0)
    run_race([only], {"only": []}, pool=0)
    assert only.decision.verdict == "not raced"
    assert "cheaper finalist" not in only.decision.reason


def test_race_without_finalists_evaluates_nothing():
    _, ev = run_race([], {})
    assert ev.calls == []


# --- select ---------------------------------------------------------------------------------


def certified(cid: str, cost: float, static: int = 100, mean: float = 0.5) -> Candidate:
    c = cand(cid, cost, static=static)
    c.raced = fake_report(cid, [mean] * 4)
    c.decision = Decision("non-inferior", 4, 0.0, -0.01, 0.01, 0.05, f"certified non-inferior ({cid})")
    return c


def test_select_keeps_the_baseline_when_nothing_is_certified():
    base = cand("baseline", 100.0, static=300)
    undecided = cand("u", 10.0)
    undecided.decision = Decision("undecided", 50, 0.0, -0.2, 0.2, 0.05, "undecided")
    chosen = select(base, [undecided], resolution=EXACT)
    assert chosen.winner is base and chosen.clause == KEPT and chosen.kept
    assert chosen.reason == "kept: no candidate certified non-inferior; keeping the baseline"
    assert (chosen.resolution, chosen.bounds, chosen.reverted_from) == (None, None, None)
    assert select(base, [], resolution=EXACT).winner is base
    # A finalist that was raced and failed says how, in numbers.
    stopped = cand("s", 10.0)
    stopped.raced = fake_report("s", [0.0] * 4)
    stopped.decision = Decision("stopped", 400, -0.08, -0.126, -0.021, 0.1, "stopped for futility: bounds [...]")
    assert select(base, [stopped, undecided], resolution=EXACT).reason == (
        "kept: no candidate certified non-inferior (s: stopped for futility: bounds [...]); keeping the baseline")


def test_select_takes_the_lowest_cost_certified_candidate():
    base = cand("baseline", 100.0, static=300)
    cheapest_inferior = cand("inf", 20.0)
    cheapest_inferior.decision = Decision("inferior", 50, -0.5, -0.7, -0.3, 0.05, "certified inferior")
    chosen = select(base, [certified("b", 70.0), cheapest_inferior, certified("a", 50.0)], resolution=EXACT,
                    latency="instruction tokens")
    winner, reason = chosen.winner, chosen.reason
    assert winner.id == "a" and chosen.clause == FASTER and not chosen.kept
    assert (chosen.resolution, chosen.bounds, chosen.latency) == (0.0, (winner.decision.lower, winner.decision.upper),
                                                                  "instruction tokens")
    assert chosen.record().to_dict()["winner"] == "a" and chosen.record().clause == FASTER
    # The reason names the latency that decided beside its figures.
    assert reason == ("faster: a: certified non-inferior (a); instruction tokens 50.0 vs baseline 100.0, lower by "
                      "more than the "
                      "resolution (0.0)")


def certified_vs(base: Candidate, cid: str, cost: float, *, static: int = 100, gap: float = 0.0) -> Candidate:
    """A certified candidate whose certify-record scores differ from the baseline's by ``gap``."""
    c = certified(cid, cost, static=static)
    c.raced = fake_report(cid, [s + gap for s in base.raced.scores])
    return c


def baseline_at(cost: float, static: int = 300, mean: float = 0.5) -> Candidate:
    base = cand("baseline", cost, static=static)
    base.raced = fake_report("baseline", [mean] * 4)
    return base


def test_select_breaks_ties_among_candidates_by_quality_then_static_tokens():
    base = baseline_at(100.0)
    base.raced = fake_report("baseline", [0.5] * 8)  # 8 records all one way: a clear difference (sign test)
    five = lambda a, b: 5.0  # noqa: E731
    # 50 and 53 tie: the higher quality wins, although the other is cheaper and shorter.
    winner = select(base, [certified_vs(base, "a", 50.0, static=100, gap=-0.02),
                           certified_vs(base, "b", 53.0, static=150, gap=0.01)], resolution=five).winner
    assert winner.id == "b"
    # Same quality: fewer static tokens, in either order of cost.
    for costs in ((50.0, 53.0), (53.0, 50.0)):
        winner = select(base, [certified_vs(base, "long", costs[0], static=200),
                               certified_vs(base, "short", costs[1], static=150)], resolution=five).winner
        assert winner.id == "short", costs
    # Beyond the resolution, cost wins over quality and static tokens.
    winner = select(base, [certified_vs(base, "a", 50.0, static=200, gap=-0.03),
                           certified_vs(base, "b", 56.0, static=150, gap=0.1)], resolution=five).winner
    assert winner.id == "a"


def test_a_quality_lead_within_noise_does_not_outweigh_fewer_static_tokens():
    """Three prunes of invoice_extraction tied on cost and scored 0.350-0.375 on 16 screen
    records; the longest led and was raced. A lead the records cannot tell from noise now
    leaves the tie to fewer static tokens; a clear lead still decides."""
    base = baseline_at(100.0)
    base.raced = fake_report("baseline", [0.5] * 16)
    five = lambda a, b: 5.0  # noqa: E731
    noisy = [0.0, 1.0] * 8

    def scored(cid, cost, static, scores):
        c = certified(cid, cost, static=static)
        c.raced = fake_report(cid, scores)
        return c

    short = scored("short", 52.0, 150, noisy)
    long_lead = scored("long", 50.0, 200, [1.0, 1.0] + noisy[2:])  # one record better: noise
    assert not clearly_better(long_lead, short)
    assert select(base, [long_lead, short], resolution=five).winner.id == "short"
    assert select(base, [short, long_lead], resolution=five).winner.id == "short"
    clear_lead = scored("clear", 50.0, 200, [1.0] * 16)
    assert clearly_better(clear_lead, short) and not clearly_better(short, clear_lead)
    assert select(base, [clear_lead, short], resolution=five).winner.id == "clear"
    # The screen's finalists follow the same rule (the screen records alone).
    for c, scores in ((short, noisy), (long_lead, [1.0, 1.0] + noisy[2:])):
        c.screen, c.raced = fake_report(c.id, scores), None
    assert preference_order([long_lead, short], five, parts=SCREEN_ONLY)[0].id == "short"
    # Fewest static tokens among the candidates no tied one clearly beats: B beats C (5 records
    # to none), A (top quality) beats neither clearly, so B, not C; then C before A (no clear lead).
    def screened(cid, static, ones):
        c = cand(cid, 50.0, static=static)
        c.screen = fake_report(cid, [1.0 if i in ones else 0.0 for i in range(16)])
        return c

    a, b, c = screened("A", 300, set(range(2, 12))), screened("B", 200, set(range(9))), screened("C", 100, set(range(4)))
    assert clearly_better(b, c, SCREEN_ONLY) and not clearly_better(a, c, SCREEN_ONLY)
    assert not clearly_better(a, b, SCREEN_ONLY) and not clearly_better(b, a, SCREEN_ONLY)
    for order in itertools.permutations([a, b, c]):
        assert [x.id for x in preference_order(list(order), five, parts=SCREEN_ONLY)] == ["B", "C", "A"]
    # A candidate with scores beats one without; the best case (not screened yet) beats all.
    unscored = cand("unscored", 50.0, static=10)
    assert clearly_better(short, unscored, parts=SCREEN_ONLY) and not clearly_better(unscored, short)
    assert clearly_better(unscored, short, best_case=unscored)


def test_select_never_replaces_the_baseline_with_a_prompt_that_is_no_faster_and_worse():
    """The defect of af0b1f5: a certified candidate predicted slower within the resolution,
    with fewer static tokens, won against a better baseline. Within the resolution the
    baseline now stays unless the candidate's certify-record quality is at least its own."""
    base = baseline_at(124.4, static=398, mean=0.37)
    res = lambda a, b: 16.9  # noqa: E731 - the TTFT model's error at this cost
    slower_worse = certified_vs(base, "r1/fixed2", 127.6, static=205, gap=-0.065)
    chosen = select(base, [slower_worse], resolution=res)
    winner, reason = chosen.winner, chosen.reason
    assert winner is base and chosen.clause == KEPT
    assert reason.startswith("kept: 1 candidate(s) certified non-inferior (r1/fixed2 cost 127.6, quality -0.065)")
    # The same at equal cost with quality 0.20 against 0.37 (the FINDINGS' select() probe).
    equal_cost = certified_vs(base, "same_cost", 124.4, static=100, gap=-0.17)
    assert select(base, [equal_cost], resolution=res).winner is base
    # Within the resolution and at least as good: replaced, and the reason names the clause.
    no_worse = certified_vs(base, "no_worse", 120.0, static=250, gap=0.0)
    chosen = select(base, [slower_worse, no_worse], resolution=res)
    winner, reason = chosen.winner, chosen.reason
    assert winner.id == "no_worse" and chosen.clause == TIE and reason.startswith("tie, no worse: no_worse: ")
    assert chosen.resolution == 16.9
    assert "within the resolution (16.9) and its quality on the certify records is at least the baseline's (+0.000)" \
        in reason
    # Faster beyond the resolution: replaced even at a (certified non-inferior) lower quality.
    fast = certified_vs(base, "fast", 100.0, gap=-0.03)
    chosen = select(base, [no_worse, fast], resolution=res)
    assert chosen.winner.id == "fast" and chosen.clause == FASTER and chosen.reason.startswith("faster: fast: ")
    # A tie more than 5% dearer than the baseline never replaces it, whatever its quality.
    dearer = certified_vs(base, "dearer", 124.4 * 1.06, gap=0.1)
    assert select(base, [dearer], resolution=lambda a, b: 20.0).winner is base


def test_select_does_not_chain_ties_past_the_resolution():
    base = baseline_at(200.0)
    rel = lambda a, b: 0.05 * max(a.cost, b.cost)  # noqa: E731 - 5% of the larger cost, as the optimizer
    a = certified_vs(base, "a", 100.0, static=200)
    b = certified_vs(base, "b", 103.0, static=150)
    c = certified_vs(base, "c", 107.0, static=100)
    winner = select(base, [a, b, c], resolution=rel).winner
    # a and b tie (3 < 5.15), b wins on static tokens (same quality); c is 7 above a (> 5.35): c must not win.
    assert winner.id == "b"


# --- Budget ---------------------------------------------------------------------------------


def test_budget_calls_keep_the_reserved_calls_and_the_first_reason():
    meter = FakeMeter()
    budget = Budget(meter, max_calls=100, max_minutes=60, reserved_calls=20)
    assert budget.calls_left == 80
    assert budget.affordable(5, 10, "rungs") == 5 and budget.reason is None
    assert budget.affordable(10, 10, "rungs") == 8
    assert budget.reason == "budget: LM calls (100) allowed 8 of 10 rungs"
    meter.calls = 75
    assert budget.calls_left == 5
    assert budget.affordable(3, 2, "looks") == 2
    assert budget.reason == "budget: LM calls (100) allowed 8 of 10 rungs"  # the first one is kept
    assert budget.afford(5, "x") and not budget.afford(6, "x")
    assert budget.affordable(0, 10, "nothing") == 0
    assert budget.affordable(10, 0, "free") == 5  # a step costs at least one call
    meter.calls = 90
    assert budget.calls_left == -10 and budget.affordable(3, 1, "any") == 0


def test_budget_time_is_a_cap_never_a_projection():
    """A slow pace does not shrink the search (the decisions do not depend on the machine's
    speed); only a cap that has passed stops it, and the reason says so."""
    clock = FakeClock(1000.0)
    meter = FakeMeter()
    budget = Budget(meter, max_calls=10**6, max_minutes=1.0, reserved_calls=5, clock=clock.monotonic)
    assert budget.pace_s == 0.0
    clock.advance(50.0)
    meter.calls = 10
    assert budget.pace_s == 5.0  # 10 more calls would overrun the minute: still affordable
    assert budget.affordable(10, 3, "looks") == 10 and budget.reason is None
    clock.advance(11.0)  # past the cap
    assert budget.affordable(10, 3, "looks") == 0
    assert budget.reason == "stopped by the 1-minute cap (6.10 s per LM call) before 10 looks"


def test_a_race_reaches_the_same_decision_on_a_slow_machine():
    """The quick preset's race (984 certify records, its optimizer's cap) with two finalists
    in turn at 0.01 s and at 0.5 s per evaluated record (a 50x slower engine: 25 minutes of
    records) reaches the same decisions at the same looks. At af0b1f5 the quick preset's 6
    minutes were projected at the pace seen, and the slow race stopped early. A cap that
    does pass stops the race and says after how many records."""
    from promptdistill.pipeline.budgets import budget_preset

    quick = budget_preset("quick")
    pool = quick["budget"].dev_size - quick["budget"].screen_size
    base_scores = [float(i % 2 == 0) for i in range(pool)]
    as_good_long = [1.0 - b if i % 10 in (1, 6) else b for i, b in enumerate(base_scores)]
    settings = RaceSettings(margin=0.05, alpha=quick["selection"].alpha, finalists=2)
    outcomes = []
    for per_record_s, cap in ((0.01, quick["budget"].max_minutes), (0.5, quick["budget"].max_minutes), (0.5, 6.0)):
        clock = FakeClock(0.0)
        meter = FakeMeter()
        ev = FakeEvaluator({"baseline": base_scores, "w": [0.0] * pool, "a": as_good_long}, meter=meter)

        def slow(cands, recs, ev=ev, clock=clock, per_record_s=per_record_s):
            clock.advance(per_record_s * len(cands) * len(recs))
            return ev(cands, recs)

        w, a = cand("w", 10.0), cand("a", 50.0)
        budget = Budget(meter, max_calls=quick["budget"].max_lm_calls, max_minutes=cap, clock=clock.monotonic)
        race(cand("baseline", 100.0), [w, a], numbered_records(pool), slow, budget=budget, settings=settings,
             resolution=EXACT)
        outcomes.append([(c.decision.verdict, c.decision.n) for c in (w, a)])
        last = a
    assert outcomes[0] == outcomes[1] == [("inferior", 100), ("non-inferior", 800)]
    # A 6-minute cap (the old quick budget, now only as a cap): w's looks take 100 s, a's
    # looks starting at 100, 125, 150 and 250 s run, the one at 450 s does not.
    assert outcomes[2] == [("inferior", 100), ("undecided", 400)]
    assert last.decision.reason.startswith("undecided: stopped by the 6-minute cap")
    assert f"after 400 of {pool} certify records" in last.decision.reason


def test_budget_restart_clock_leaves_set_up_out_of_the_pace():
    clock = FakeClock(0.0)
    meter = FakeMeter(calls=4)  # calls made before the search
    budget = Budget(meter, max_calls=100, max_minutes=1.0, clock=clock.monotonic)
    clock.advance(30.0)  # set-up: no search calls
    budget.restart_clock()
    clock.advance(10.0)
    meter.calls = 14
    assert budget.pace_s == 1.0  # 10 calls in 10 s, not 14 calls in 40 s
    assert budget.deadline == 90.0
    assert budget.calls_left == 86  # calls made before the restart still count against the budget


# --- split_records --------------------------------------------------------------------------


def ids(recs):
    return [str(r["id"]) for r in recs]


def test_split_records_screen_and_certify_are_disjoint_dev_records():
    s = split_records(SPEC, seed=0, screen_size=16, dev_size=100, test_size=50)
    df = dataset_for(SPEC)
    dev_ids, test_ids = set(ids(records(df, "dev"))), set(ids(records(df, "test")))
    assert s.sizes() == {"train": len(records(df, "train")), "screen": 16, "certify": 84, "test": 50}
    assert set(ids(s.screen)) | set(ids(s.certify)) <= dev_ids
    assert not set(ids(s.screen)) & set(ids(s.certify))
    assert set(ids(s.test)) <= test_ids
    assert ids(s.dev) == ids(s.screen) + ids(s.certify)
    assert ids(s.screen) != ids(records(df, "dev"))[:16]  # shuffled, not the file's first records


def test_split_records_is_seeded():
    a = split_records(SPEC, seed=0, screen_size=16, dev_size=100, test_size=50)
    b = split_records(SPEC, seed=0, screen_size=16, dev_size=100, test_size=50)
    c = split_records(SPEC, seed=1, screen_size=16, dev_size=100, test_size=50)
    assert ids(a.screen) == ids(b.screen) and ids(a.certify) == ids(b.certify) and ids(a.test) == ids(b.test)
    assert ids(a.screen) != ids(c.screen) and ids(a.test) != ids(c.test)


def test_split_records_sizes():
    n_dev = len(records(dataset_for(SPEC), "dev"))
    small = split_records(SPEC, seed=0, screen_size=16, dev_size=10, test_size=0)
    assert (len(small.screen), len(small.certify), len(small.test)) == (5, 5, 0)  # at most half screens
    whole = split_records(SPEC, seed=0, screen_size=16, dev_size=10**6, test_size=10**6)
    assert len(whole.screen) == 16 and len(whole.dev) == n_dev
    one = split_records(SPEC, seed=0, screen_size=16, dev_size=1, test_size=1)
    assert (len(one.screen), len(one.certify)) == (1, 0)


def test_split_records_without_dev_records_raises(tmp_path):
    rows = [{"id": f"r{i}", "split": split, "inputs": {"ticket": f"ticket {i}"}, "expected": {"label": "billing"}}
            for i, split in enumerate(["train", "train", "test"])]
    spec = SPEC.with_changes(dataset=write_records(tmp_path / "no_dev.jsonl", rows))
    with pytest.raises(ValueError, match="no dev records"):
        split_records(spec, seed=0, screen_size=4, dev_size=10, test_size=10)

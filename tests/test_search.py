"""The search kernel (``promptdistill.search``): pure, deterministic, no engine.

* the confidence sequence: its error rate by simulation (discrete and continuous paired
  differences at exactly ``-margin``), a control showing the simulation catches a bound that
  is not anytime-valid, coverage, shrinking, no degenerate bound, input checks;
* the race's family-wise error rate by simulation through ``race()`` itself;
* ``looks``, ``can_beat``, ``screen``, ``race``, ``select`` on scripted scores
  (``fakes.FakeEvaluator``), ``plan_records``, ``Budget``, ``split_records``.

Monte Carlo tolerance: a simulated rate is compared with its bound plus three binomial
standard errors at the bound, ``3 sqrt(a (1 - a) / runs)``. The seeds are fixed, so every
run draws the same numbers; the tolerance only says how far a correct bound could land
above alpha by chance with these many runs (the measured rates are far below it).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from bundled_specs import load_spec
from fakes import FakeClock, FakeEngine, FakeEvaluator, FakeMeter, fake_report, numbered_records
from promptdistill.engine.meter import CallMeter
from promptdistill.search import budget as budget_module
from promptdistill.search.budget import Budget
from promptdistill.search.racing import (
    Candidate,
    Decision,
    RaceSettings,
    can_beat,
    looks,
    paired_mean,
    race,
    screen,
    select,
)
from promptdistill.search.sequential import confidence_sequence, plan_records
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


# --- plan_records ------------------------------------------------------------------------------


def test_plan_needs_more_records_for_more_discordance_or_a_smaller_margin():
    def needed(**kw):  # the records needed do not depend on the pool: pool 0 skips its bound
        return plan_records(0, **{"discordance": 0.2, "margin": 0.05, "alpha": 0.05, **kw}).needed

    assert needed(discordance=0.05) < needed(discordance=0.2) < needed(discordance=0.4)
    assert needed(margin=0.1) < needed(margin=0.05) < needed(margin=0.03)
    assert needed(alpha=0.1) < needed(alpha=0.01)
    small = plan_records(100, discordance=0.2, margin=0.05, alpha=0.05)
    quiet = plan_records(400, discordance=0.05, margin=0.05, alpha=0.05)
    noisy = plan_records(400, discordance=0.4, margin=0.05, alpha=0.05)
    assert small.needed == needed()  # the same simulated runs
    assert quiet.certifiable_margin < noisy.certifiable_margin  # more discordance, wider bounds
    assert plan_records(400, discordance=0.2, margin=0.05, alpha=0.05).certifiable_margin < small.certifiable_margin
    assert "can certify" in quiet.sentence() and "cannot certify" in noisy.sentence()


def test_plan_edge_cases():
    empty = plan_records(0, discordance=0.2, margin=0.05, alpha=0.05)
    assert empty.certifiable_margin == 1.0 and "0 dev records cannot certify" in empty.sentence()
    hopeless = plan_records(50, discordance=1.0, margin=0.001, alpha=0.01, max_records=200)
    assert hopeless.needed is None and "more than the simulated maximum" in hopeless.sentence()
    with pytest.raises(ValueError, match="pool"):
        plan_records(-1, discordance=0.2, margin=0.05, alpha=0.05)
    with pytest.raises(ValueError, match="discordance"):
        plan_records(10, discordance=1.5, margin=0.05, alpha=0.05)


@pytest.mark.parametrize("margin", [
    0.05,
    0.1,
    0.03,
])
def test_the_race_certifies_where_the_plan_says_it_can(margin):
    """No discordant pair (the candidate always scores as the baseline): every simulated run
    is the same, so the plan's ``needed`` is exact, and a race with that many certify records
    must certify the candidate."""
    plan = plan_records(400, discordance=0.0, margin=margin, alpha=0.05)
    n = plan.needed
    scores = [float(i % 2) for i in range(n)]
    base, same = Candidate("baseline", SPEC, cost=100.0), Candidate("same", SPEC, cost=10.0)
    race(base, [same], numbered_records(n), FakeEvaluator({"baseline": scores, "same": scores}),
         budget=Budget(FakeMeter(), **GENEROUS), settings=RaceSettings(margin=margin, alpha=0.05, first_look=n),
         resolution=EXACT)
    assert same.decision.n == n
    assert same.decision.verdict == "non-inferior", same.decision.reason


# --- the race's family-wise error rate by simulation -----------------------------------------


def simulate_races(runs: int, *, true_diff: float, seed: int, k: int = 3, pool: int = 100, margin: float = 0.2,
                   discordance: float = 0.4, alpha: float = 0.1) -> tuple[float, np.ndarray]:
    """``runs`` races of ``k`` finalists against a baseline on 0/1 scores; returns the share
    of races that certified any finalist, and each finalist's certification share.

    Baseline scores are Bernoulli(0.5); each finalist differs from the baseline on a
    ``discordance`` share of records, so that its mean difference is ``true_diff``.
    """
    rng = np.random.default_rng(seed)
    up, down = (discordance + true_diff) / 2.0, (discordance - true_diff) / 2.0
    settings = RaceSettings(margin=margin, alpha=alpha, finalists=k, first_look=25)
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
    family: the share of races that certify any of them is at most alpha."""
    runs, alpha = 600, 0.1
    fwer, each = simulate_races(runs, true_diff=-0.2, seed=5, alpha=alpha)
    print(f"race FWER {fwer:.4f} over {runs} races; per finalist {each.round(4).tolist()}")  # measured 0.027
    assert fwer <= alpha + tolerance(alpha, runs)
    assert np.all(each <= alpha / 3 + tolerance(alpha / 3, runs))


def test_race_certifies_finalists_that_are_as_good_as_the_baseline():
    """Power control for the test above: the same races with no true drop certify most of the
    time, so a low false-certification share is not a race that never certifies."""
    share, _ = simulate_races(100, true_diff=0.0, seed=6)
    assert share > 0.6  # measured 0.93


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


def test_can_beat_needs_a_lower_cost_beyond_the_resolution_or_a_tie_with_fewer_static_tokens():
    best = cand("best", 100.0, static=300)
    five = lambda a, b: 5.0  # noqa: E731
    assert can_beat(cand("a", 90.0, static=900), best, five)  # clearly cheaper: static tokens do not matter
    assert not can_beat(cand("b", 110.0, static=10), best, five)  # clearly dearer
    # Within the resolution (both sides, the edge included) it is a tie: fewer static tokens win.
    for cost in (97.0, 95.0, 103.0, 105.0):
        assert can_beat(cand("t", cost, static=299), best, five), cost
        assert not can_beat(cand("t", cost, static=300), best, five), cost
        assert not can_beat(cand("t", cost, static=301), best, five), cost
    assert not can_beat(cand("c", 100.0, static=300), best, EXACT)
    assert can_beat(cand("d", 99.9, static=300), best, EXACT)


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
    assert by_id["cheap_bad"].notes == ["screening: mean difference -0.500 on 8 records is below -0.25"]
    assert by_id["slow"].notes == ["screening: cannot beat the baseline (cost 150.0 vs 100.0, 400 vs 300 static tokens)"]
    assert by_id["tie_fewer"].notes == ["screening: not among the 3 finalists"]  # same cost, fewer static tokens
    assert all(not c.notes for c in finalists)
    assert paired_mean(by_id["mid_ok"].screen, base.screen) == -0.125
    assert by_id["cheap_ok"].lm_calls == 8 and by_id["cheap_ok"].mean == 0.75
    # keep= overrides the number of finalists; screened candidates are not evaluated again.
    again = screen(base, cands, recs, ev, budget=Budget(FakeMeter(), **GENEROUS), settings=settings,
                   resolution=EXACT, keep=10)
    assert [c.id for c in again] == ["cheap_ok", "mid_ok", "edge", "tie_fewer"]
    assert len(ev.calls) == 1


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
    import itertools

    orders = set()
    for perm in itertools.permutations([("a", 100.0, 300), ("b", 104.0, 200), ("c", 108.0, 100)]):
        base = cand("baseline", 200.0, static=400)
        cands = [cand(cid, cost, static=static) for cid, cost, static in perm]
        ev = FakeEvaluator({cid: [0.5] * 4 for cid in ("baseline", "a", "b", "c")})
        finalists = screen(base, cands, numbered_records(4), ev, budget=Budget(FakeMeter(), **GENEROUS),
                           settings=RaceSettings(margin=0.05), resolution=lambda a, b: 5.0)
        orders.add(tuple(c.id for c in finalists))
    assert len(orders) == 1, orders


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


def test_race_decides_clear_cases_at_the_first_look_and_stops():
    better, worse = cand("better", 10.0), cand("worse", 20.0)
    lines = []
    base, ev = run_race([better, worse], {"better": [1.0] * N_POOL, "worse": [0.0] * N_POOL}, log=lines.append)
    assert ev.calls == [(["baseline", "better", "worse"], [str(i) for i in range(50)])]  # one look, then done
    b, w = better.decision, worse.decision
    assert (b.verdict, b.n, b.diff_mean, b.alpha) == ("non-inferior", 50, 0.5, 0.05)
    assert (w.verdict, w.n, w.diff_mean, w.alpha) == ("inferior", 50, -0.5, 0.05)
    assert b.certified and not w.certified
    assert -0.05 < b.lower <= 0.5 <= b.upper and w.lower <= -0.5 <= w.upper < -0.05
    assert b.reason == f"certified non-inferior: bounds [{b.lower:+.3f}, {b.upper:+.3f}] after 50 records " \
                       "(alpha 0.05), a drop of 0.05 or more ruled out"
    assert w.reason.startswith("certified inferior: bounds [") and w.reason.endswith("a drop of less than 0.05 ruled out")
    assert b.to_dict()["verdict"] == "non-inferior" and b.to_dict()["n"] == 50
    assert len(lines) == 1 and lines[0].startswith("race: 50 of 400 certify records; better non-inferior [")
    assert base.raced.n == 50 and better.mean == 1.0


def test_race_stops_a_candidate_a_cheaper_certified_one_makes_useless():
    cheap, pricey = cand("cheap", 10.0), cand("pricey", 50.0)
    _, ev = run_race([cheap, pricey], {"cheap": [1.0] * N_POOL, "pricey": as_good()})
    assert cheap.decision.verdict == "non-inferior"
    d = pricey.decision
    assert (d.verdict, d.n) == ("stopped", 50)
    assert d.reason.startswith("stopped: a certified rival would be selected over it; bounds [")
    assert ev.evaluated("pricey") == 50 and len(ev.calls) == 1


def test_race_goes_on_with_a_cheaper_candidate_when_a_dearer_one_is_certified():
    cheap, pricey = cand("cheap", 10.0), cand("pricey", 50.0)
    _, ev = run_race([cheap, pricey], {"cheap": as_good(), "pricey": [1.0] * N_POOL})
    assert pricey.decision.verdict == "non-inferior" and pricey.decision.n == 50
    assert ev.evaluated("cheap") == N_POOL and ev.evaluated("pricey") == 50
    assert [len(ids) for _, ids in ev.calls] == [50, 50, 100, 200]  # looks at 50, 100, 200, 400


def test_race_leaves_a_candidate_undecided_when_the_pool_runs_out():
    unsure = cand("unsure", 10.0)
    run_race([unsure], {"unsure": as_good(100)}, pool=100)
    d = unsure.decision
    assert (d.verdict, d.n, d.diff_mean, d.alpha) == ("undecided", 100, 0.0, 0.1)
    assert d.lower < -0.05 < d.upper
    assert d.reason == (f"undecided: the dev pool is exhausted; bounds [{d.lower:+.3f}, {d.upper:+.3f}] "
                        "after 100 records (alpha 0.1)")


def test_race_under_a_budget_races_the_cheapest_and_says_the_budget_ended_it():
    meter = FakeMeter()
    budget = Budget(meter, max_calls=250, max_minutes=60)
    a, b = cand("a", 10.0), cand("b", 20.0)
    base, ev = run_race([b, a], {"a": as_good(200), "b": as_good(200)}, pool=200, budget=budget)
    # Look 1 (50 records): baseline, a, b = 150 calls; look 2: 100 calls left, the baseline and a.
    assert [(c, len(ids)) for c, ids in ev.calls] == [(["baseline", "b", "a"], 50), (["baseline", "a"], 50)]
    assert meter.calls == 250 and base.raced.n == 100
    reason = "budget: LM calls (250) allowed 2 of 3 race evaluations"
    assert budget.reason == reason
    assert (a.decision.verdict, a.decision.n) == ("undecided", 100)
    assert (b.decision.verdict, b.decision.n) == ("undecided", 50)
    assert a.decision.reason.startswith(f"undecided: {reason}; bounds")
    assert b.decision.reason.startswith(f"undecided: {reason}; bounds")


def test_a_finalist_cut_by_the_budget_at_the_last_look_says_so():
    budget = Budget(FakeMeter(), max_calls=250, max_minutes=60)
    a, b = cand("a", 10.0), cand("b", 20.0)
    run_race([a, b], {"a": as_good(100), "b": as_good(100)}, pool=100, budget=budget)
    assert b.decision.n == 50
    assert "budget" in b.decision.reason and "exhausted" not in b.decision.reason


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
    winner, reason = select(base, [undecided], resolution=EXACT)
    assert winner is base and reason == "no candidate certified non-inferior; keeping the baseline"
    assert select(base, [], resolution=EXACT)[0] is base


def test_select_takes_the_lowest_cost_certified_candidate():
    base = cand("baseline", 100.0, static=300)
    cheapest_inferior = cand("inf", 20.0)
    cheapest_inferior.decision = Decision("inferior", 50, -0.5, -0.7, -0.3, 0.05, "certified inferior")
    winner, reason = select(base, [certified("b", 70.0), cheapest_inferior, certified("a", 50.0)],
                            resolution=EXACT)
    assert winner.id == "a"
    assert reason == "a: certified non-inferior (a); cost 50.0 vs baseline 100.0 (resolution 0.0)"


def test_select_breaks_ties_within_the_resolution_by_static_tokens_then_quality():
    base = cand("baseline", 100.0, static=300)
    five = lambda a, b: 5.0  # noqa: E731
    # 50 and 53 tie: fewer static tokens win, although the other is cheaper.
    winner, _ = select(base, [certified("a", 50.0, static=200), certified("b", 53.0, static=150)], resolution=five)
    assert winner.id == "b"
    # Same static tokens too: the higher quality wins, in either order of cost.
    for costs in ((50.0, 53.0), (53.0, 50.0)):
        winner, _ = select(base, [certified("lo", costs[0], mean=0.6), certified("hi", costs[1], mean=0.8)],
                           resolution=five)
        assert winner.id == "hi", costs
    # Beyond the resolution, cost wins over static tokens and quality.
    winner, _ = select(base, [certified("a", 50.0, static=200, mean=0.1), certified("b", 56.0, static=150)],
                       resolution=five)
    assert winner.id == "a"


def test_select_against_the_baseline_within_the_resolution():
    base = cand("baseline", 100.0, static=300)
    five = lambda a, b: 5.0  # noqa: E731
    winner, reason = select(base, [certified("more_static", 97.0, static=400)], resolution=five)
    assert winner is base
    assert reason == ("1 candidate(s) certified non-inferior, none cheaper than the baseline beyond the "
                      "resolution nor with fewer static tokens; keeping the baseline")
    winner, reason = select(base, [certified("fewer_static", 97.0, static=250)], resolution=five)
    assert winner.id == "fewer_static"
    assert reason.endswith("cost 97.0 vs baseline 100.0 is within the resolution (5.0): a tie, broken by fewer "
                           "static tokens (250 vs 300)")


def test_select_does_not_chain_ties_past_the_resolution():
    base = cand("baseline", 200.0, static=300)
    rel = lambda a, b: 0.05 * max(a.cost, b.cost)  # noqa: E731 - 5% of the larger cost, as the optimizer
    a, b, c = certified("a", 100.0, static=200), certified("b", 103.0, static=150), certified("c", 107.0, static=100)
    winner, _ = select(base, [a, b, c], resolution=rel)
    # a and b tie (3 < 5.15), b wins on static tokens; c is 7 above a (> 5.35): c must not win.
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


def test_budget_projects_time_at_the_pace_so_far(monkeypatch):
    clock = FakeClock(1000.0)
    monkeypatch.setattr(budget_module, "time", clock)
    meter = FakeMeter()
    budget = Budget(meter, max_calls=10**6, max_minutes=1.0, reserved_calls=5)  # deadline 1060
    assert budget.pace_s == 0.0
    assert budget.affordable(100, 10, "steps") == 100  # no pace yet: nothing to project
    clock.advance(20.0)
    meter.calls = 10
    assert budget.pace_s == 2.0
    # 40 s left, 5 reserved calls x 2 s = 10 s kept back: 30 s / (3 calls x 2 s) = 5 steps.
    assert budget.affordable(10, 3, "looks") == 5
    assert budget.reason == "budget: time (1 min at 2.00 s per LM call) allowed 5 of 10 looks"
    budget.reserved_s = 6.0
    assert budget.affordable(10, 3, "looks") == 4  # (30 - 6) / 6
    clock.advance(41.0)  # past the deadline
    assert budget.affordable(1, 1, "one more") == 0
    assert budget.reason == "budget: time (1 min at 2.00 s per LM call) allowed 5 of 10 looks"


def test_budget_restart_clock_leaves_set_up_out_of_the_pace(monkeypatch):
    clock = FakeClock(0.0)
    monkeypatch.setattr(budget_module, "time", clock)
    meter = FakeMeter(calls=4)  # calls made before the search
    budget = Budget(meter, max_calls=100, max_minutes=1.0)
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

"""One check suite for every test that certifies, run over each (as scikit-learn runs
``check_estimator`` over every estimator).

The designs checked are the shipped ones: :class:`GroupSequentialTest` and
:class:`ConfidenceSequenceTest`, each driven through ``race()`` itself (the race entry point:
its looks, its futility stops, its bounds), and the test split's first look
(:func:`group_sequential.score_interval`, the interval ``optimize/verify.py: score_test``
stops on). The checks:

* **size**: a candidate exactly at the line is certified at most ``alpha`` of the time (and
  called inferior at most ``alpha``), at several discordances;
* **predictability**: a record changed at index ``t`` changes nothing the race reported at a
  look before ``t``;
* **monotone bounds**: at every look ``lower <= mean <= upper``, the verdict agrees with the
  bounds, a record changed for the better never lowers a bound (and the confidence
  sequence's bounds never widen from look to look);
* **power against the plan**: at a true tie a race certifies the plan's certifiable margin
  in 80% of runs (the test split has no plan: it is checked for size and bounds).

Each check is also run, below, against a deliberately broken design, and must fail there: a
check that cannot fail checks nothing. The group-sequential test at twice alpha fails size
and power; the confidence sequence whose bet sees the record it bets on fails size, bounds
and power; the confidence sequence at twice alpha (conservative: its size stays under the
limit) fails power; the test split's percentile bootstrap, and its interval at 95% instead
of 97.5%, fail size.

Monte Carlo tolerance, as in ``test_search.py``: a simulated rate is compared with its bound
plus three binomial standard errors at the bound; the seeds are fixed. The test split's
rates are computed exactly (every count of wins and losses, weighted by its probability).
"""

from __future__ import annotations

import functools
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from unittest import mock

import numpy as np
import pytest
from scipy import special

from bundled_specs import load_spec
from fakes import FakeEngine, FakeEvaluator, numbered_records
from promptdistill.core.stats import MeanCI, bootstrap_ci
from promptdistill.engine.meter import CallMeter
from promptdistill.search import group_sequential as gs
from promptdistill.search import racing
from promptdistill.search import sequential
from promptdistill.search.budget import Budget
from promptdistill.search.racing import Candidate, RaceSettings, race
from promptdistill.search.sequential import ConfidenceSequenceTest, GroupSequentialTest, plan_records

SPEC = load_spec("ticket_triage")
MARGIN = 0.05


def tolerance(rate: float, runs: int) -> float:
    """Three binomial standard errors of a simulated rate whose true value is ``rate``."""
    return 3.0 * math.sqrt(rate * (1.0 - rate) / runs)


def paired_scores(rng: np.random.Generator, runs: int, n: int, *, mean: float, discordance: float,
                  continuous: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) scores, one run per row, whose paired difference has mean ``mean``.

    0/1 scores: the pair differs on a ``discordance`` share of records (the candidate up on
    ``(discordance + mean) / 2``, down on ``(discordance - mean) / 2``). Continuous (a judge's):
    the baseline Beta(0.5, 0.5), the candidate Beta(0.5 + mean, 0.5 - mean)."""
    if continuous:
        return rng.beta(0.5, 0.5, (runs, n)), rng.beta(0.5 + mean, 0.5 - mean, (runs, n))
    up, down = (discordance + mean) / 2.0, (discordance - mean) / 2.0
    u = rng.random((runs, n))
    diffs = np.where(u < up, 1.0, np.where(u < up + down, -1.0, 0.0))
    tie_scores = (rng.random((runs, n)) < 0.5).astype(float)
    baseline = np.where(diffs == 1.0, 0.0, np.where(diffs == -1.0, 1.0, tie_scores))
    return baseline, baseline + diffs


# --- the designs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RaceDesign:
    """A race's test, as ``race()`` runs it. ``make`` builds the test the race uses
    (default: the shipped ``make_test``); a broken design returns a subclass of the shipped
    class, and the race runs it in place of the shipped one."""

    name: str
    discrete: bool
    pool: int
    alpha: float = 0.1
    make: Callable[..., Any] = sequential.make_test
    nested: bool = False
    """Bounds that never widen from look to look (the confidence sequence's, intersected over time)."""

    def plan(self, discordance: float) -> sequential.Plan:
        return plan_records(self.pool, discordance=discordance, margin=MARGIN, alpha=self.alpha,
                            discrete=self.discrete)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """``race()`` builds this design's test, which must be the class the shipped
        ``make_test`` picks for these scores (or a subclass of it: a broken variant)."""
        def make_test(**kw: Any) -> Any:
            test = self.make(**kw)
            assert isinstance(test, type(sequential.make_test(**kw))), (type(test), kw)
            return test

        with mock.patch.object(racing, "make_test", make_test):
            yield

    def race(self, baseline: np.ndarray, candidate: np.ndarray, *, margin: float,
             horizon: int | None = None) -> tuple[racing.Decision, list[str]]:
        """One race of one finalist through ``race()``: its decision and what it logged at each look."""
        scores = {"baseline": baseline.tolist(), "c": candidate.tolist()}
        base, cand = Candidate("baseline", SPEC, cost=100.0), Candidate("c", SPEC, cost=50.0)
        lines: list[str] = []
        with self.installed():
            race(base, [cand], numbered_records(len(baseline)), FakeEvaluator(scores),
                 budget=Budget(CallMeter(FakeEngine()), max_calls=10**9, max_minutes=600.0),
                 settings=RaceSettings(margin=margin, alpha=self.alpha, finalists=1, discrete=self.discrete),
                 resolution=lambda a, b: 0.0, log=lines.append, alpha_each=self.alpha, horizon=horizon)
        return cand.decision, lines

    def verdicts(self, baseline: np.ndarray, candidate: np.ndarray, *, margin: float,
                 horizon: int | None = None) -> list[str]:
        return [self.race(b, c, margin=margin, horizon=horizon)[0].verdict for b, c in zip(baseline, candidate)]


GROUP_SEQUENTIAL = RaceDesign("group-sequential", discrete=True, pool=200)
CONFIDENCE_SEQUENCE = RaceDesign("confidence sequence", discrete=False, pool=200, nested=True)
RACES = [GROUP_SEQUENTIAL, CONFIDENCE_SEQUENCE]


@dataclass(frozen=True)
class SplitDesign:
    """The test split's first look (``optimize/verify.py: score_test``): a winner stands
    after the first half when the interval's lower end lies above the revert line. Each
    tail of the interval is ``alpha``; the interval is ``interval(diffs, confidence)``."""

    name: str
    half: int = 100
    alpha: float = (1.0 - 0.975) / 2.0  # two looks: each interval at 97.5%, each tail 1.25%
    interval: Callable[[np.ndarray, float], MeanCI] = lambda d, c: gs.score_interval(d, confidence=c)

    @functools.cached_property
    def _by_counts(self) -> Callable[[int, int], MeanCI]:
        @functools.lru_cache(maxsize=None)
        def ci(wins: int, losses: int) -> MeanCI:
            d = np.array([1.0] * wins + [-1.0] * losses + [0.0] * (self.half - wins - losses))
            return self.interval(d, 1.0 - 2.0 * self.alpha)
        return ci

    def tails(self, *, mean: float, discordance: float) -> tuple[float, float]:
        """Exact chances that the interval lies wholly above ``mean`` and wholly below it, for 0/1
        scores whose difference has that mean at that discordance: every (wins, losses) count
        of the first half, weighted by its multinomial probability."""
        up, down = (discordance + mean) / 2.0, (discordance - mean) / 2.0
        wins, losses = np.meshgrid(np.arange(self.half + 1), np.arange(self.half + 1), indexing="ij")
        ties = self.half - wins - losses
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = (special.gammaln(self.half + 1) - special.gammaln(wins + 1) - special.gammaln(losses + 1)
                     - special.gammaln(np.maximum(ties, 0) + 1) + special.xlogy(wins, up) + special.xlogy(losses, down)
                     + special.xlogy(ties, 1.0 - up - down))
        p = np.where(ties >= 0, np.exp(log_p), 0.0)
        above = below = 0.0
        for w, l in zip(*np.nonzero(p > 1e-9)):
            ci = self._by_counts(int(w), int(l))
            above += p[w, l] * (ci.low > mean)
            below += p[w, l] * (ci.high < mean)
        return float(above), float(below)


SPLIT = SplitDesign("test split, score interval")


# --- the checks ----------------------------------------------------------------------------------

SIZE_RUNS = 400


def check_size(design: RaceDesign | SplitDesign, discordances: tuple[float, ...] = (0.1, 0.2, 0.4)) -> dict:
    """A candidate exactly ``MARGIN`` below the baseline is certified at most ``alpha`` of the
    time, and called inferior at most ``alpha``: 400 races per discordance (a limit below
    1.5 x alpha), or the test split's exact tails at both of its lines (-margin and 0)."""
    out = {}
    if isinstance(design, SplitDesign):
        for discordance in (0.05, 0.1, 0.2):
            for line in (-MARGIN, 0.0):
                above, below = design.tails(mean=line, discordance=discordance)
                out[discordance, line] = (round(above, 4), round(below, 4))
                # The score interval is asymptotic: a discrete tail may land a little over its nominal
                # rate; a tenth over is allowed, twice is not. The lower tail is the claim (a winner at
                # the line clears the first half); both tails together, the reported coverage.
                assert above <= 1.1 * design.alpha, (design.name, discordance, line, above)
                assert above + below <= 1.1 * 2.0 * design.alpha, (design.name, discordance, line, above, below)
        return out
    limit = design.alpha + tolerance(design.alpha, SIZE_RUNS)
    assert limit < 1.5 * design.alpha
    for discordance in discordances:
        rng = np.random.default_rng(int(discordance * 1000))
        baseline, candidate = paired_scores(rng, SIZE_RUNS, design.pool, mean=-MARGIN, discordance=discordance,
                                            continuous=not design.discrete)
        verdicts = design.verdicts(baseline, candidate, margin=MARGIN, horizon=design.plan(discordance).horizon)
        certified = verdicts.count(racing.NON_INFERIOR) / SIZE_RUNS
        inferior = verdicts.count(racing.INFERIOR) / SIZE_RUNS
        out[discordance] = (certified, inferior)
        assert certified <= limit and inferior <= limit, (design.name, discordance, certified, inferior)
        if not design.discrete:
            break  # continuous scores: one discordance (the Beta scores do not depend on it)
    return out


def check_predictability(design: RaceDesign) -> None:
    """A record changed at index ``t`` changes nothing the race reported at a look with at
    most ``t`` records (it had not been scored), and does change a later look."""
    rng = np.random.default_rng(5)
    baseline, candidate = paired_scores(rng, 6, design.pool, mean=-0.02, discordance=0.3,
                                        continuous=not design.discrete)
    for b, c in zip(baseline, candidate):
        _, before = design.race(b, c, margin=MARGIN)
        for t in (design.pool // 4, design.pool // 2 + 1):
            changed = c.copy()
            changed[t] = 1.0 - changed[t] if design.discrete else 0.0 if changed[t] > 0.5 else 1.0
            _, after = design.race(b, changed, margin=MARGIN)
            seen = lambda lines: [line for line in lines if int(re.search(r": (\d+) of", line).group(1)) <= t]
            assert seen(after) == seen(before), (design.name, t)


def check_monotone_bounds(design: RaceDesign | SplitDesign) -> None:
    """At every look ``lower <= mean <= upper`` and the verdict agrees with the bounds; a
    record changed for the better (a loss made a tie) never lowers either bound; the
    confidence sequence's bounds never widen from look to look."""
    rng = np.random.default_rng(8)
    n = design.half if isinstance(design, SplitDesign) else design.pool
    for disc, mean in ((0.1, 0.0), (0.2, -0.05), (0.4, 0.05)):
        baseline, candidate = paired_scores(rng, 4, n, mean=mean, discordance=disc)
        for b, c in zip(baseline, candidate):
            diffs = c - b
            better = diffs.copy()
            better[np.flatnonzero(diffs < 0)[:3]] = 0.0
            if isinstance(design, SplitDesign):
                confidence = 1.0 - 2.0 * design.alpha
                ci, up = design.interval(diffs, confidence), design.interval(better, confidence)
                assert ci.low <= diffs.mean() <= ci.high
                assert up.low >= ci.low - 1e-9 and up.high >= ci.high - 1e-9, (ci, up)
                wider = design.interval(diffs, 1.0 - design.alpha)
                assert wider.low <= ci.low + 1e-9 and wider.high >= ci.high - 1e-9
                continue
            test = design.make(discrete=design.discrete, pool=n, alpha=design.alpha)
            last = (-1.0, 1.0)
            for size in test.looks():
                verdict, lo, hi = test.decide(diffs[:size], MARGIN)
                assert lo <= diffs[:size].mean() + 1e-9 <= hi + 2e-9, (design.name, size, lo, hi)
                assert (verdict == racing.NON_INFERIOR) == (lo >= -MARGIN - 1e-6), (design.name, size, verdict, lo)
                assert (verdict == racing.INFERIOR) == (hi <= -MARGIN + 1e-6), (design.name, size, verdict, hi)
                _, lo2, hi2 = test.decide(better[:size], MARGIN)
                assert lo2 >= lo - 1e-9 and hi2 >= hi - 1e-9, (design.name, size, (lo, hi), (lo2, hi2))
                if design.nested:
                    assert lo >= last[0] - 1e-9 and hi <= last[1] + 1e-9, (design.name, size, last, (lo, hi))
                last = (lo, hi)


POWER_RUNS = 400


def check_power(design: RaceDesign, discordance: float = 0.2) -> tuple[float, float]:
    """At a true tie, races on the pool certify the plan's certifiable margin in 80% of runs
    (within three standard errors, at least 0.05), futility stops included."""
    plan = design.plan(discordance)
    assert plan.test == design.name
    rng = np.random.default_rng(3)  # the plan's model: 0/1 scores at that discordance, for both tests
    baseline, candidate = paired_scores(rng, POWER_RUNS, design.pool, mean=0.0, discordance=discordance)
    verdicts = design.verdicts(baseline, candidate, margin=plan.certifiable_margin, horizon=plan.horizon)
    power = verdicts.count(racing.NON_INFERIOR) / POWER_RUNS
    assert abs(power - plan.power) <= max(0.05, tolerance(plan.power, POWER_RUNS)), (design.name, plan, power)
    return plan.certifiable_margin, power


# --- the suite over the shipped designs ----------------------------------------------------------


@pytest.mark.parametrize("design", [*RACES, SPLIT], ids=lambda d: d.name)
def test_size_is_at_most_alpha(design):
    print(design.name, check_size(design))


@pytest.mark.parametrize("design", RACES, ids=lambda d: d.name)
def test_decisions_depend_only_on_the_records_before_each_look(design):
    check_predictability(design)


@pytest.mark.parametrize("design", [*RACES, SPLIT], ids=lambda d: d.name)
def test_bounds_agree_with_the_verdict_and_move_with_the_data(design):
    check_monotone_bounds(design)


@pytest.mark.parametrize("design", RACES, ids=lambda d: d.name)
def test_a_race_has_the_power_its_plan_promises(design):
    print(design.name, check_power(design))


def test_the_races_run_the_shipped_classes():
    """The designs above are the classes ``race()`` picks: group-sequential for discrete
    scores on a pool of 100 or more, the confidence sequence otherwise."""
    b, c = paired_scores(np.random.default_rng(1), 1, 400, mean=0.05, discordance=0.2)
    for design, cls in ((GROUP_SEQUENTIAL, GroupSequentialTest), (CONFIDENCE_SEQUENCE, ConfidenceSequenceTest)):
        decision, lines = design.race(b[0, : design.pool], c[0, : design.pool], margin=MARGIN)
        assert f"({cls.name}, alpha" in decision.reason and lines


def test_end_to_end_a_tie_is_certified_as_often_as_the_screen_passes_it_times_the_races_power():
    """Through ``screen_then_race``: a candidate exactly as good as the baseline (0/1 scores,
    40% discordance) is screened on 16 records and, when its 80% upper bound is not below
    -margin, raced on 200 certify records. It is certified with the screen's pass chance times
    the race's computed power (within three standard errors): the plan's 80% is a finalist's."""
    runs, pool, discordance = 300, 200, 0.4
    settings = RaceSettings(margin=MARGIN, alpha=0.1, finalists=1)
    rng = np.random.default_rng(12)
    baseline, candidate = paired_scores(rng, runs, 16 + pool, mean=0.0, discordance=discordance)
    records = numbered_records(16 + pool)
    certified = screened = 0
    for b, c in zip(baseline, candidate):
        base, cand = Candidate("baseline", SPEC, cost=100.0), Candidate("c", SPEC, cost=50.0)
        raced, _ = racing.screen_then_race(base, [cand], records[:16], records[16:],
                                           FakeEvaluator({"baseline": b.tolist(), "c": c.tolist()}),
                                           budget=Budget(CallMeter(FakeEngine()), max_calls=10**9, max_minutes=600.0),
                                           settings=settings, resolution=lambda a, b: 0.0)
        screened += bool(raced)
        certified += cand.decision.certified
    passes = racing.screen_pass_chance(16, discordance=discordance, margin=MARGIN)
    expected = passes * sequential.group_sequential_power(MARGIN, pool, discordance, 0.1, 50)
    print(f"screened {screened / runs:.3f} (exact {passes:.3f}), certified {certified / runs:.3f} "
          f"(expected {expected:.3f})")
    assert abs(screened / runs - passes) <= tolerance(passes, runs)
    assert abs(certified / runs - expected) <= tolerance(expected, runs)


# --- each check fails on a broken design ---------------------------------------------------------


class TwiceAlphaGroupSequential(GroupSequentialTest):
    """Broken: the boundaries of twice the stated alpha."""

    def boundary(self, n: int) -> float:
        return GroupSequentialTest(pool=self.pool, alpha=2.0 * self.alpha, first_look=self.first_look).boundary(n)


class LookAheadConfidenceSequence(ConfidenceSequenceTest):
    """Broken: each bet sees the record it bets on (bets only on a record at or above the mean tested)."""

    def decide(self, diffs, margin):
        def peeking(x, alpha, horizon=None):
            return np.where(x >= 0.5, sequential._BET_CAP, 0.0)

        with mock.patch.object(sequential, "_bets", peeking):
            return super().decide(diffs, margin)


class TwiceAlphaConfidenceSequence(ConfidenceSequenceTest):
    """Broken: the bounds of twice the stated alpha."""

    def decide(self, diffs, margin):
        return ConfidenceSequenceTest(pool=self.pool, alpha=2.0 * self.alpha, first_look=self.first_look,
                                      horizon=self.horizon).decide(diffs, margin)


def broken(design: RaceDesign, cls: type) -> RaceDesign:
    def make(*, discrete: bool, pool: int, alpha: float, first_look: int = 50, horizon: int | None = None) -> Any:
        if issubclass(cls, ConfidenceSequenceTest):
            return cls(pool=pool, alpha=alpha, first_look=first_look, horizon=horizon)
        return cls(pool=pool, alpha=alpha, first_look=first_look)

    return RaceDesign(f"{design.name}, broken: {cls.__name__}", design.discrete, design.pool, design.alpha, make,
                      design.nested)


def test_the_size_check_fails_a_group_sequential_test_at_twice_its_alpha():
    with pytest.raises(AssertionError):
        check_size(broken(GROUP_SEQUENTIAL, TwiceAlphaGroupSequential), discordances=(0.2,))


def test_the_size_check_fails_a_confidence_sequence_whose_bet_sees_the_record():
    with pytest.raises(AssertionError):
        check_size(broken(CONFIDENCE_SEQUENCE, LookAheadConfidenceSequence))


def test_the_power_check_fails_a_confidence_sequence_at_twice_its_alpha():
    """The confidence sequence is conservative (its size at twice alpha stays under the size
    check's limit), but twice alpha certifies more often than its plan says."""
    with pytest.raises(AssertionError):
        check_power(broken(CONFIDENCE_SEQUENCE, TwiceAlphaConfidenceSequence))


def test_the_size_check_fails_the_percentile_bootstrap_the_test_split_used():
    """The first half's percentile bootstrap lets a winner exactly at the line clear it more
    than twice as often as its 1.25% tail allows at 5% discordance."""
    bootstrap = SplitDesign("test split, percentile bootstrap",
                            interval=lambda d, c: bootstrap_ci(d.tolist(), confidence=c, seed=0))
    with pytest.raises(AssertionError):
        check_size(bootstrap)

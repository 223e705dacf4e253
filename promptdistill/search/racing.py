"""The one search kernel: screen candidates cheaply, race the finalists, select the winner.

The distiller (instruction variants) and the optimizer (variants x few-shot settings) both
search this way; only their candidates, their evaluation and their cost differ.

1. **Screen** (:func:`screen`): the baseline and every candidate on the screen records
   (``splits.screen``). A candidate is *plausible* when the screen records do not show it
   worse than the margin (the 80% upper bound of its mean difference from the baseline
   is at least ``-margin``: on 16 records one discordant pair moves the mean by 0.06,
   more than a 0.05 margin, so the point estimate alone drops sound candidates by
   chance), and, when it is not faster than the baseline
   beyond the resolution (so only the *tie* clause below could pick it), at least zero:
   records are spent only on decisions still open. The finalists are the plausible candidates that
   could beat the baseline, cheapest first, then the rest by difference; at most
   ``finalists`` of them, in the order selection would prefer them. Screening only chooses
   what to race: it never certifies. With ``every=False`` (the optimizer's default) it
   screens cheapest first and stops once no candidate left could be a finalist whatever
   its quality: the same finalists for fewer LM calls.
2. **Race** (:func:`race`, :func:`screen_then_race`): the finalists one at a time, in
   the order selection prefers them, each against the baseline on growing batches of the
   certify records (the test's ``looks()``: 50, 100, 200, ... up to the pool for the
   group-sequential test, every 50 records for the confidence sequence; planned before
   any record is scored). After each batch the test for the metric's kind of score
   (:mod:`promptdistill.search.sequential`: group-sequential for discrete scores, an
   anytime-valid confidence sequence for continuous ones) decides: ``non-inferior`` (a
   drop of ``margin`` or more ruled out), ``inferior`` (a drop of less than ``margin``
   ruled out), ``stopped`` for futility, or it goes on; when the pool is exhausted it is
   ``undecided`` (never published as a win). The next finalist is screened for and raced
   (on the same certify records, the baseline's scores reused) only while selection would
   keep the baseline (the finalists before were not certified, or a certified one is no
   faster and below the baseline's quality); a winner ends the race. Screening ranks by
   the screen records alone, so which candidate is the next finalist never depends on the
   certify records. How many may be
   raced (``k``, at most ``finalists``) is fixed from the first finalist's screen before
   any certify record is scored (:func:`admitted_finalists`: the most for which the
   first keeps 80% power at ``alpha / k``, with ``FALLBACK_SLACK``). The error rate:
   each finalist is tested at ``alpha / k`` (Bonferroni over the finalists, which were
   chosen on other records), and each test holds over all of its looks, so the chance
   that *any* finalist is certified non-inferior while it is worse than the margin is at
   most ``alpha`` (docs/decisions.md).
3. **Select** (:func:`select`), the one rule every stage uses:

   a. *faster*: a certified candidate whose cost is lower than the baseline's by more
      than the resolution (the TTFT model's error, for example) replaces it; among such
      candidates the cheapest, costs within the resolution of it tie, broken by higher
      quality on the certify records where they show a difference (``clearly_better``),
      else fewer static tokens;
   b. *tie, no worse*: otherwise a certified candidate within the resolution of the
      baseline (and at most ``TIE_MAX_SLOWDOWN`` dearer) replaces it only when its quality
      on the certify records is at least the baseline's; among such, the same tie-break;
   c. otherwise the baseline stays. The reason always names the clause that decided.

   :func:`select` returns a :class:`Selection`: the winner, the clause, the resolution and
   the winner's bounds as typed fields (the reason is for people). After the race, both
   stages check the winner on the test split and revert it there if it fails
   (:func:`promptdistill.search.held_out.check_on_test`).

   Screening orders finalists by the same rule on the screen records.

   So a published candidate is never dearer *and* worse than the baseline it replaces.

4. **The quality-first objective** (``slo.objective: quality``, :class:`QualityGoal`):
   the race runs at the margin negated (``-min_gain``), the same test certifying
   *superiority* by ``min_gain``; screening ranks finalists by screen gain among the
   candidates whose cost is no higher than the baseline's beyond the resolution (or within
   ``slo.ttft_ms``); :func:`select_better` publishes the highest certified gain by the
   *better* clause, or keeps the baseline. A candidate certified only non-inferior is never
   *better*.

Example:
    >>> looks(300, first=50)
    [50, 100, 200, 300]
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from scipy.stats import binomtest, multinomial, norm

from promptdistill.core.display import format_number
from promptdistill.core.settings import check, setting
from promptdistill.core.stats import paired_diffs
from promptdistill.engine.meter import phase
from promptdistill.evaluate.evaluator import EvalReport
from promptdistill.search.budget import Budget
from promptdistill.search.selection import BETTER, FASTER, KEPT, TIE, SelectionRecord
from promptdistill.search.sequential import (
    PLAN_CONFIDENCE,
    Plan,
    PlanAssumption,
    discordance_upper_bound,
    looks,
    make_test,
    plan_records,
)
from promptdistill.specs.model import Spec

__all__ = [
    "Candidate",
    "Decision",
    "NON_INFERIOR",
    "QualityGoal",
    "RaceKnobs",
    "RaceSettings",
    "Selection",
    "BETTER",
    "FASTER",
    "KEPT",
    "TIE",
    "TIE_MAX_SLOWDOWN",
    "can_beat",
    "clearly_better",
    "looks",
    "admitted_finalists",
    "plan_finalists",
    "plan_from_screen",
    "raceable",
    "preference_order",
    "race",
    "screen",
    "screen_pass_chance",
    "screen_then_race",
    "select",
    "select_better",
]

Record = Mapping[str, Any]
Evaluate = Callable[[list["Candidate"], Sequence[Record]], list[EvalReport]]
"""``evaluate(candidates, records)``: one report per candidate, all in as few batches as possible."""
Resolution = Callable[["Candidate", "Candidate"], float]
"""The smallest cost difference between two candidates that counts as a difference."""

NON_INFERIOR = "non-inferior"
INFERIOR = "inferior"
SUPERIOR = "superior"
NOT_SUPERIOR = "not superior"
"""The verdicts of a race at a negative margin: superiority by ``-margin`` (the quality-first
objective), the same test with its null moved above 0."""
UNDECIDED = "undecided"
NOT_RACED = "not raced"
STOPPED = "stopped"

SCREEN_Z = float(norm.ppf(0.80))
"""The screen's one-sided 80% bound: a candidate is screened out as worse than the margin
only when the upper bound of its paired difference is below ``-margin``."""
SCREEN_ONLY = ("screen",)
"""Screening ranks by the screen records alone."""
FALLBACK_SLACK = 0.2
"""A race admits fallback finalists (splitting alpha) only while its first one keeps 80%
power for a candidate a fifth of the margin worse than the baseline: at 20% discordant
pairs and a 0.05 margin, a tie needs ~525 of 984 records at alpha 0.05, a candidate 0.01
worse ~(0.05 / 0.04)^2 as many, ~820."""
TIE_BREAK_ALPHA = 0.05
"""Among candidates whose costs tie, quality decides only when a one-sided sign test on their
paired records is significant at this level: otherwise fewer static tokens do."""
TIE_MAX_SLOWDOWN = 0.05
"""Within the resolution, a candidate whose cost is more than 5% above the baseline's
never replaces it: a tie may not hide a slowdown a service would notice."""


@dataclass(frozen=True)
class RaceKnobs:
    """How a race decides, as a user sets it, declared once: the distiller's ``DistillConfig``
    and the optimizer's ``SelectionRule`` inherit these fields; :class:`RaceSettings` adds
    what the spec fixes (the margin, the kind of score)."""

    alpha: float = setting(0.1, "chance of certifying any finalist whose quality drop exceeds the allowed one "
                           "(family-wise over the finalists)", above=0, below=0.5)
    finalists: int = setting(3, "most candidates raced in turn on the certify records after screening (alpha is split "
                             "among those the pool has room for); the distiller hands as many to the optimizer",
                             at_least=1)
    first_look: int = setting(50, "certify records of the race's first look (then doubling up to the pool; every this "
                              "many for the confidence sequence: continuous scores or pools under 100)", at_least=1)

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True, kw_only=True)
class RaceSettings(RaceKnobs):
    """A race as it runs on one spec: the knobs (:class:`RaceKnobs`), the margin and the kind of score."""

    margin: float
    """Largest allowed drop of the mean score (the spec's ``slo.max_quality_drop``). Negative:
    the race certifies superiority by ``-margin`` instead (``slo.min_quality_gain``, the
    quality-first objective): the same test of ``H0: mean(d) <= -margin``."""
    discrete: bool = True
    """Scores on a small grid (0/1, shares of a few checks): the group-sequential test;
    False (judge, python metrics): the confidence sequence (also on discrete pools under
    ``MIN_GROUP_SEQUENTIAL_POOL``, which look every ``first_look`` records)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not -1.0 <= self.margin <= 1.0:
            raise ValueError(f"margin must be in [-1, 1], got {self.margin}.")

    @classmethod
    def of(cls, knobs: RaceKnobs, *, margin: float, discrete: bool) -> "RaceSettings":
        """The race ``knobs`` (any settings class that inherits them) on a spec's margin and kind of score."""
        return cls(**{f.name: getattr(knobs, f.name) for f in fields(RaceKnobs)}, margin=margin, discrete=discrete)


@dataclass(frozen=True)
class QualityGoal:
    """The quality-first objective (``slo.objective: quality``): what may replace the baseline.

    A candidate wins only when its race, run at margin ``-min_gain``, certified it superior
    (a gain of ``min_gain`` or less ruled out), and its cost is no higher than the
    baseline's beyond the resolution, or at most ``latency_cap``. Among such candidates,
    the one with the highest certified gain (the lower bound) wins (:func:`select`).
    Screening ranks the finalists by their screen gain, not their cost.
    """

    min_gain: float
    """The gain in mean score a winner is certified to exceed (``slo.min_quality_gain``)."""
    latency_cap: float | None = None
    """``slo.ttft_ms``: a candidate dearer than the baseline beyond the resolution may still
    win when its cost is within it (None: no cap, so only the resolution)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.min_gain <= 1.0:
            raise ValueError(f"min_gain must be in (0, 1], got {self.min_gain}.")

    @property
    def margin(self) -> float:
        """The race's margin: superiority by ``min_gain`` is non-inferiority at ``-min_gain``."""
        return -self.min_gain

    def affordable(self, cand: "Candidate", baseline: "Candidate", resolution: "Resolution") -> bool:
        """Is ``cand``'s cost allowed: no higher than the baseline's beyond the resolution, or within the cap?"""
        if not np.isfinite(cand.cost):
            return False
        return (cand.cost - baseline.cost <= resolution(cand, baseline)
                or self.latency_cap is not None and cand.cost <= self.latency_cap)

    def latency_words(self, cand: "Candidate", baseline: "Candidate", resolution: "Resolution", latency: str) -> str:
        """Why ``cand``'s cost is allowed or not, in numbers, naming the latency."""
        shown = f"{latency} {cand.cost:.1f} vs baseline {baseline.cost:.1f}"
        tol = resolution(cand, baseline)
        if cand.cost - baseline.cost <= tol:
            return f"{shown}, no higher beyond the resolution ({tol:.1f})"
        if self.latency_cap is None:
            return f"{shown}, higher beyond the resolution ({tol:.1f}) and no slo.ttft_ms allows it"
        within = "but within" if self.affordable(cand, baseline, resolution) else "and above"
        return f"{shown}, higher beyond the resolution ({tol:.1f}) {within} slo.ttft_ms ({self.latency_cap:g})"


@dataclass(frozen=True)
class Decision:
    """What the race concluded about one candidate, with the numbers behind it."""

    verdict: str
    """'non-inferior' (certified), 'inferior' (certified), 'undecided', 'stopped' or 'not raced';
    at a negative margin 'superior' (certified) and 'not superior' in place of the first two."""
    n: int = 0
    """Paired certify records it was evaluated on."""
    diff_mean: float | None = None
    lower: float | None = None
    upper: float | None = None
    """Bounds on the mean difference from the baseline (each side at ``alpha`` over all looks:
    the repeated confidence interval of the group-sequential test, or the confidence sequence)."""
    alpha: float | None = None
    """This candidate's error rate (the race's alpha over the finalists)."""
    reason: str = ""

    @property
    def certified(self) -> bool:
        return self.verdict in (NON_INFERIOR, SUPERIOR)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "n": self.n, "diff_mean": self.diff_mean, "lower": self.lower,
                "upper": self.upper, "alpha": self.alpha, "reason": self.reason}


@dataclass(eq=False)
class Candidate:
    """One prompt the search considered: its spec and examples, its cost, what was measured."""

    id: str
    spec: Spec
    examples: list[Record] = field(default_factory=list)
    """Few-shot examples of the static system part (empty: none)."""
    cost: float = 0.0
    """What selection minimises (instruction tokens, predicted TTFT in ms...)."""
    static_tokens: int = 0
    """Tokens of the static prefix: the tie-break when quality shows no clear difference (less KV
    cache, lower cold TTFT)."""
    screen: EvalReport | None = None
    """On the screen records."""
    raced: EvalReport | None = None
    """On the certify records, merged over every look."""
    decision: Decision = field(default_factory=lambda: Decision(NOT_RACED))
    lm_calls: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float | None:
        """Mean score on the certify records when raced, else on the screen records."""
        report = self.raced if self.raced is not None else self.screen
        return None if report is None else report.mean

    def add(self, part: str, report: EvalReport) -> None:
        """Merge a report on the next records of ``part`` ('screen' or 'raced')."""
        old = getattr(self, part)
        setattr(self, part, report if old is None else old.merged(report))
        self.lm_calls += report.lm_calls


@dataclass(frozen=True)
class Selection:
    """What :func:`select` decided: the winner, by which clause, with the numbers behind it.

    The one decision both stages make; publishing and the reports read its stored form
    (:meth:`record`, :class:`~promptdistill.search.selection.SelectionRecord`), never the
    reason's text.
    """

    winner: Candidate
    """The candidate to publish: the baseline when ``clause`` is KEPT."""
    baseline: Candidate
    clause: str
    """FASTER, TIE, BETTER or KEPT (:mod:`promptdistill.search.selection`)."""
    reason: str
    """The decision in words and numbers, starting with the clause."""
    latency: str = "cost"
    """What the cost measures ("instruction tokens", "expected TTFT"): the latency that decided."""
    resolution: float | None = None
    """The cost difference between the winner and the baseline below which they tie (None: kept)."""
    bounds: tuple[float | None, float | None] | None = None
    """The winner's certified bounds on its mean difference from the baseline (None: kept)."""
    reverted_from: Candidate | None = None
    """The candidate the rule chose and the test split reverted (``clause`` is then KEPT)."""
    chosen_clause: str | None = None
    """The clause that chose ``reverted_from``."""
    gain: float | None = None
    """BETTER: the quality gain over the baseline the winner was certified to exceed (None otherwise)."""

    @property
    def kept(self) -> bool:
        """The baseline stays (nothing chosen, or the test split reverted the choice)."""
        return self.clause == KEPT

    def reverted(self, why: str) -> "Selection":
        """The baseline instead of this winner, ``why`` appended to the reason."""
        return replace(self, winner=self.baseline, clause=KEPT, reason=f"{self.reason}; {why}", resolution=None,
                       bounds=None, reverted_from=self.winner, chosen_clause=self.clause, gain=None)

    def record(self) -> SelectionRecord:
        """The decision as a result stores it (ids instead of candidates)."""
        return SelectionRecord(winner=self.winner.id, baseline=self.baseline.id, clause=self.clause,
                               reason=self.reason, latency=self.latency, resolution=self.resolution,
                               bounds=self.bounds, chosen_clause=self.chosen_clause, gain=self.gain,
                               reverted_from=self.reverted_from.id if self.reverted_from is not None else None)


def paired_mean(candidate: EvalReport, baseline: EvalReport) -> float | None:
    """Mean of candidate - baseline over the records both scored (the first ``candidate.n``)."""
    diffs = paired_diffs(candidate.scores, baseline.scores[: candidate.n])
    return float(diffs.mean()) if diffs.size else None


def can_beat(cand: Candidate, best: Candidate, resolution: Resolution, *, best_is_baseline: bool = False) -> bool:
    """Could ``cand`` be selected over ``best`` if both were certified? Yes when it is
    cheaper beyond the resolution, or within it (then quality decides); against the
    baseline, within the resolution only if at most ``TIE_MAX_SLOWDOWN`` dearer."""
    gap = best.cost - cand.cost
    tol = resolution(cand, best)
    if gap > tol:
        return True
    if best_is_baseline and cand.cost > best.cost * (1.0 + TIE_MAX_SLOWDOWN):
        return False
    return abs(gap) <= tol


def _evaluate(cands: list[Candidate], records: Sequence[Record], part: str, evaluate: Evaluate) -> None:
    if not cands or not records:
        return
    for cand, report in zip(cands, evaluate(cands, records)):
        cand.add(part, report)


@phase("screening")
def screen(baseline: Candidate, candidates: Sequence[Candidate], records: Sequence[Record], evaluate: Evaluate, *,
           budget: Budget, settings: RaceSettings, resolution: Resolution, calls_per_record: int = 1,
           keep: int | None = None, eligible: Callable[[Candidate], bool] | None = None,
           every: bool = True, goal: QualityGoal | None = None) -> list[Candidate]:
    """Evaluate on the screen records and return the finalists, best first (see the module docstring).

    Candidates already screened (a report covering every screen record) are not evaluated
    again. When the budget cannot cover every candidate, the cheapest are screened and the
    rest are noted as not screened. Only ``eligible`` candidates (default: all) can be
    finalists.

    ``every=False`` screens only what could still change the finalists: cheapest first, a
    window of candidates within the resolution of each other at a time, until every
    candidate left either could not beat the baseline at all or could not be among the
    finalists even with the best quality possible (selection would take ``limit`` screened
    candidates before it). Unless the budget cuts the screen short, the finalists are
    those of ``every=True`` (for a candidate's replies that do not depend on the batch it
    is in: deterministic, or from the LM cache); the candidates left out have no screen
    quality (the trade-off table shows fewer points).

    ``goal`` (the quality-first objective): a finalist is a candidate whose cost ``goal``
    allows and whose screen's 80% upper bound reaches the required gain; finalists come
    by screen gain, highest first, and every candidate is screened (a gain cannot be
    bounded by a cost, so ``every`` is ignored).
    """
    limit = settings.finalists if keep is None else keep
    can_final = eligible or (lambda c: True)
    n = len(records)
    old_budget_notes = {budget.reason, "not screened (budget)"}
    for cand in candidates:  # what an earlier screening said (a distiller round) is superseded
        cand.notes[:] = [note for note in cand.notes if not note.startswith("screening: ")
                         and note not in old_budget_notes]

    def pending() -> list[Candidate]:
        return sorted((c for c in candidates if c.screen is None or c.screen.n < n), key=lambda c: (c.cost, c.id))

    cut: list[Candidate] = []
    """Left out by the budget."""

    def batch(cands: list[Candidate]) -> bool:
        """Screen ``cands`` (the baseline first when it still needs it); False when the budget cut them short."""
        todo = ([baseline] if baseline.screen is None or baseline.screen.n < n else []) + cands
        can = budget.affordable(len(todo), calls_per_record * n, "candidates screened")
        cut.extend(todo[can:])
        _evaluate(todo[:can], records, "screen", evaluate)
        return can == len(todo)

    def still_open() -> list[Candidate]:
        """Not screened, and could be a finalist (all of them while the baseline is unscreened)."""
        contenders = [c for c in candidates if c.screen is not None and c.screen.n >= n and can_final(c)
                      and _screen_tier(c, baseline, settings.margin, resolution, goal) == 0]
        return [c for c in pending() if c not in cut and can_final(c) and (
            baseline.screen is None or _could_be_finalist(c, baseline, contenders, limit, resolution))]

    if every or not n or goal is not None:
        batch(pending())
    else:
        while True:
            open_ = still_open()
            window = [c for c in open_ if c.cost - open_[0].cost <= resolution(c, open_[0])] if open_ else []
            # An empty window still screens the baseline when it needs it.
            if not batch(window) or not window:
                break
        if cut:
            cut.extend(still_open())
        for cand in pending():
            if cand in cut or not can_final(cand):
                continue
            cand.notes.append(_screen_note(cand, baseline, settings.margin, resolution)
                              if not can_beat(cand, baseline, resolution, best_is_baseline=True) else
                              f"screening: not screened: it could not be among the {limit} finalist(s) whatever "
                              f"its quality (cost {cand.cost:.1f}; the cheaper candidates screened first)")
    for cand in cut:
        if cand is baseline or can_final(cand):  # an ineligible one says why it is anyway
            cand.notes.append(budget.reason or "not screened (budget)")
    if baseline.screen is None:
        return []
    screened = [c for c in candidates if c.screen is not None and c.screen.n >= n]
    tiers = {id(c): _screen_tier(c, baseline, settings.margin, resolution, goal) for c in screened}
    # Screen quality only: a finalist raced before must not move on its certify scores, or the
    # next finalist's identity would depend on the certify records (docs/decisions.md).
    open_ = [c for c in screened if tiers[id(c)] == 0 and can_final(c)]
    finalists = (preference_order(open_, resolution, baseline, parts=SCREEN_ONLY) if goal is None
                 else sorted(open_, key=lambda c: (-round(_screen_diff(c, baseline), 9), c.cost, c.static_tokens, c.id)))
    ranked = finalists + sorted((c for c in screened if c not in finalists),
                                key=lambda c: (tiers[id(c)], -_screen_diff(c, baseline), c.id))
    for cand in ranked:
        if cand not in finalists and can_final(cand):
            cand.notes.append(_screen_note(cand, baseline, settings.margin, resolution, goal))
    for cand in finalists[limit:]:
        cand.notes.append(f"screening: not among the {limit} finalists")
    return finalists[:limit]


def _could_be_finalist(cand: Candidate, baseline: Candidate, contenders: Sequence[Candidate], limit: int,
                       resolution: Resolution) -> bool:
    """Could ``cand``, not yet screened, be among the first ``limit`` finalists? Only if it can
    beat the baseline and, given the best quality possible, selection would prefer it before
    ``limit`` of the screened ``contenders`` (with any lower quality it joins the same ties
    or none, so the contenders' order does not change without it)."""
    if not can_beat(cand, baseline, resolution, best_is_baseline=True):
        return False
    return cand in preference_order([*contenders, cand], resolution, baseline, best_case=cand,
                                    parts=SCREEN_ONLY)[:limit]


def _screen_diff(cand: Candidate, base: Candidate) -> float:
    diff = paired_mean(cand.screen, base.screen) if cand.screen is not None and base.screen is not None else None
    return -2.0 if diff is None else diff


def screen_upper(cand: Candidate, base: Candidate) -> float:
    """The screen's one-sided 80% upper bound on ``cand - base`` (normal approximation over
    the paired differences; the mean itself when they do not vary): -2 without pairs."""
    if cand.screen is None or base.screen is None:
        return -2.0
    diffs = paired_diffs(cand.screen.scores, base.screen.scores[: cand.screen.n])
    return _screen_bound(diffs) if diffs.size else -2.0


def _screen_bound(diffs: np.ndarray) -> float:
    spread = float(diffs.std(ddof=1)) / np.sqrt(diffs.size) if diffs.size > 1 else 0.0
    return float(diffs.mean()) + SCREEN_Z * spread


@lru_cache(maxsize=64)
def screen_pass_chance(n: int, *, discordance: float, margin: float) -> float:
    """The chance that a candidate exactly as good as the baseline, on 0/1 scores differing on
    a ``discordance`` share of records, passes a screen of ``n`` records (its 80% upper bound
    not below ``-margin``; the candidate faster than the baseline). A plan's power is the
    race's, for a finalist: end to end, a tie is certified with this chance times it.

    Example:
        >>> round(screen_pass_chance(16, discordance=0.2, margin=0.05), 3)
        0.873
    """
    if n <= 0:
        return 1.0
    wins, losses = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    ok = wins + losses <= n
    p = np.zeros(wins.shape)
    p[ok] = multinomial.pmf(np.stack([wins[ok], losses[ok], n - wins[ok] - losses[ok]], axis=1), n,
                            [discordance / 2.0, discordance / 2.0, 1.0 - discordance])
    passed = [_screen_bound(np.array([1.0] * w + [-1.0] * l + [0.0] * (n - w - l))) >= -margin - 1e-12
              for w, l in zip(wins[ok], losses[ok])]
    return float(np.sum(p[ok][passed]))


def _screen_tier(cand: Candidate, base: Candidate, margin: float, resolution: Resolution,
                 goal: QualityGoal | None = None) -> int:
    """0: plausible and able to beat the baseline; 1: could beat it but looks worse; 2: cannot beat it.

    A candidate within the resolution of the baseline's cost wins only at the baseline's
    quality or better (the *tie* clause), so it is raced only when its screen records do not
    already show it below the baseline: a race it can win only by noise is not an open
    decision worth its records. With ``goal`` (``margin`` is then ``-goal.min_gain``): 2 when
    its cost is not allowed, 1 when its screen's 80% upper bound is below the required gain."""
    if goal is not None:
        if not goal.affordable(cand, base, resolution):
            return 2
        return 1 if screen_upper(cand, base) < -margin - 1e-12 else 0
    if not can_beat(cand, base, resolution, best_is_baseline=True):
        return 2
    if screen_upper(cand, base) < -margin - 1e-12 or (not _faster(cand, base, resolution) and _screen_diff(cand, base) < 0):
        return 1
    return 0


def _faster(cand: Candidate, base: Candidate, resolution: Resolution) -> bool:
    """The *faster* clause: cheaper than the baseline by more than the resolution."""
    return base.cost - cand.cost > resolution(cand, base)


def _screen_note(cand: Candidate, base: Candidate, margin: float, resolution: Resolution,
                 goal: QualityGoal | None = None) -> str:
    if goal is not None:
        if not goal.affordable(cand, base, resolution):
            return f"screening: cannot win on quality at its cost ({goal.latency_words(cand, base, resolution, 'cost')})"
        return (f"screening: mean difference {format_number(paired_mean(cand.screen, base.screen), '+.3f')} on "
                f"{cand.screen.n} records, 80% upper bound {screen_upper(cand, base):+.3f}, is below the required "
                f"gain +{goal.min_gain:g}")
    if not can_beat(cand, base, resolution, best_is_baseline=True):
        return (f"screening: cannot beat the baseline (cost {cand.cost:.1f} vs {base.cost:.1f}, "
                f"resolution {resolution(cand, base):.1f})")
    diff = paired_mean(cand.screen, base.screen)
    shown = format_number(diff, "+.3f")
    if diff is not None and screen_upper(cand, base) >= -margin - 1e-12:
        return (f"screening: not faster than the baseline beyond the resolution (cost {cand.cost:.1f} vs "
                f"{base.cost:.1f}, resolution {resolution(cand, base):.1f}) and below its quality on the screen "
                f"records ({shown} on {cand.screen.n}); a tie wins only at the baseline's quality or better")
    return (f"screening: mean difference {shown} on {cand.screen.n} records, 80% upper bound "
            f"{screen_upper(cand, base):+.3f}, is below -{margin:g}")


def raceable(finalists: int, calls_left: int, pool: int, calls_per_record: int = 1) -> int:
    """At most ``finalists``, no more than ``calls_left`` LM calls race over the whole pool
    with the baseline (at least one): no alpha for a fallback the budget could not pay for.

    Example:
        >>> raceable(3, 3_500, 984), raceable(3, 10_000, 984), raceable(3, 500, 984)
        (2, 3, 1)
    """
    return max(1, min(finalists, calls_left // max(1, pool * calls_per_record) - 1))


def plan_finalists(baseline: Candidate, first: Candidate, *, pool: int, settings: RaceSettings) -> tuple[int, Plan]:
    """:func:`admitted_finalists` at the discordance ``first``'s screen records cannot rule out."""
    discordance, basis = _screen_discordance(baseline, [first])
    return admitted_finalists(pool, discordance=discordance, settings=settings, basis=basis)


def admitted_finalists(pool: int, *, discordance: float, settings: RaceSettings, basis: str = "") -> tuple[int, Plan]:
    """How many finalists a race may test in turn (``k``, each at ``alpha / k``), and its plan.

    The most, up to ``settings.finalists``, whose share of alpha still leaves the first one
    80% power at ``discordance`` for a candidate ``FALLBACK_SLACK`` of the margin worse than
    the baseline (a pruned prompt is seldom an exact tie); at least one, which then keeps
    all of alpha. The race fixes ``k`` from the screen records before any certify record is
    scored, so each finalist's share of alpha is fixed too. A spec whose pool has room
    spends it on fallbacks (a second finalist when the first fails); one near the edge
    keeps alpha for one.

    At a negative margin (superiority by ``s = -margin``) the same rule is read for a gain:
    the first keeps 80% power for a candidate that truly gains ``2 s``, its distance ``s``
    from the null at least the margin the pool certifies at a tie (the test moves with its
    null, up to the null variance).
    """
    target = (1.0 - FALLBACK_SLACK) * settings.margin if settings.margin >= 0 else -settings.margin
    for k in range(settings.finalists, 0, -1):
        plan = plan_records(pool, discordance=discordance, margin=settings.margin, alpha=settings.alpha / k,
                            discrete=settings.discrete, first_look=settings.first_look, basis=basis)
        if k == 1 or plan.certifiable_margin <= target:
            return k, plan
    raise AssertionError("unreachable: k == 1 always returns")


@phase("race")
def race(baseline: Candidate, finalists: Sequence[Candidate], records: Sequence[Record], evaluate: Evaluate, *,
         budget: Budget, settings: RaceSettings, resolution: Resolution, calls_per_record: int = 1,
         log: Callable[[str], None] = lambda message: None, alpha_each: float | None = None,
         horizon: int | None = None, goal: QualityGoal | None = None) -> None:
    """Race ``finalists`` against ``baseline`` on ``records`` in turn; sets each one's ``decision``.

    One at a time, in the order given (selection's preference): the next only when selection
    would still keep the baseline (the one before ended without being certified, or was
    certified but is no faster and below the baseline's quality), on the same certify
    records (the baseline's scores are reused). A certified finalist selection would take
    ends the race: a later one could only be selected over it by the tie-break (within the
    resolution of its cost), which is no reason to spend another race.
    Each is tested at ``alpha_each`` (default ``alpha / len(finalists)``). The looks are
    planned from ``len(records)`` before any record is scored; a look runs only when the
    budget (LM calls, then the wall-clock cap) covers it. A race the budget cuts short
    says so, with the records it reached. ``horizon``: the records the confidence sequence's
    bets are tuned for (:attr:`Plan.horizon`, fixed before any certify record; None: the pool).
    ``goal``: the quality-first objective, whose selection decides when the race is over
    (``settings.margin`` is then ``-goal.min_gain``).
    """
    alpha = settings.alpha / max(1, len(finalists)) if alpha_each is None else alpha_each
    test = make_test(discrete=settings.discrete, pool=len(records), alpha=alpha, first_look=settings.first_look,
                     horizon=horizon)
    ended: str | None = None
    """Why no later finalist is raced."""
    raced: list[Candidate] = []
    for cand in finalists:
        if not records:
            ended = "no certify records (the dev split has only screen records)"
        if ended:
            cand.decision = Decision(NOT_RACED, alpha=alpha, reason=f"not raced: {ended}")
            continue
        refusals = budget.refusals
        _race_one(baseline, cand, records, evaluate, budget=budget, settings=settings, test=test, alpha=alpha,
                  calls_per_record=calls_per_record, log=log)
        raced.append(cand)
        ended = _race_over(baseline, raced, budget, refusals, resolution, goal)


def _race_over(baseline: Candidate, raced: Sequence[Candidate], budget: Budget, refusals: int,
               resolution: Resolution, goal: QualityGoal | None = None) -> str | None:
    """Why no later finalist is raced after ``raced[-1]``, or None: selection would take a
    certified finalist, or the budget refused a step since ``refusals`` was read."""
    if raced[-1].decision.certified and not select(baseline, raced, resolution=resolution, goal=goal).kept:
        return f"{raced[-1].id}, raced before it, was certified and would be selected"
    if budget.refusals > refusals:
        return budget.reason or "budget"
    return None


def _race_one(baseline: Candidate, cand: Candidate, records: Sequence[Record], evaluate: Evaluate, *,
              budget: Budget, settings: RaceSettings, test: Any, alpha: float, calls_per_record: int,
              log: Callable[[str], None]) -> None:
    """One finalist against the baseline, look by look, until its test decides or the records or budget end."""
    seen = 0
    cand.decision = Decision(UNDECIDED, alpha=alpha)
    for size in test.looks():
        new = records[seen:size]
        todo = ([baseline] if baseline.raced is None or baseline.raced.n < size else []) + [cand]
        if budget.affordable(len(todo), calls_per_record * len(new), "race evaluations") < len(todo):
            break
        _evaluate(todo, new, "raced", evaluate)
        seen = size
        cand.decision = _decide(cand, baseline, settings.margin, alpha, test, final=False)
        d = cand.decision
        log(f"race: {cand.id}: {size} of {len(records)} certify records; {d.verdict} "
            f"[{format_number(d.lower, '+.3f')}, {format_number(d.upper, '+.3f')}]")
        if d.verdict != UNDECIDED:
            return
    if cand.raced is None:
        cand.decision = Decision(NOT_RACED, alpha=alpha, reason=f"not raced: {budget.reason or 'budget'}")
        return
    exhausted = cand.raced.n >= len(records)
    cut = None if exhausted else f"{budget.reason or 'budget'} after {seen} of {len(records)} certify records"
    cand.decision = _decide(cand, baseline, settings.margin, alpha, test, final=True, budget_cut=cut)


def _decide(cand: Candidate, baseline: Candidate, margin: float, alpha: float, test: Any, *, final: bool,
            budget_cut: str | None = None) -> Decision:
    diffs = paired_diffs(cand.raced.scores, baseline.raced.scores[: cand.raced.n])
    n = int(diffs.size)
    if n == 0:
        return Decision(UNDECIDED, 0, None, None, None, alpha, "no record scored by both")
    verdict, lo, hi = test.decide(diffs, margin)
    mean = float(np.mean(diffs))
    bounds = f"[{lo:+.3f}, {hi:+.3f}] after {n} records ({test.name}, alpha {alpha:.3g})"
    if margin < 0 and verdict in (NON_INFERIOR, INFERIOR, "futile"):
        # Superiority by -margin: the same test of H0: mean(d) <= -margin, its null above 0.
        gain = -margin
        if verdict == NON_INFERIOR:
            return Decision(SUPERIOR, n, mean, lo, hi, alpha, f"certified superior: bounds {bounds}, "
                            f"a gain of {gain:g} or less ruled out")
        if verdict == INFERIOR:
            return Decision(NOT_SUPERIOR, n, mean, lo, hi, alpha, f"certified not superior: bounds {bounds}, "
                            f"a gain of {gain:g} or more ruled out")
        return Decision(STOPPED, n, mean, lo, hi, alpha, f"stopped for futility: a gain of more than {gain:g} "
                        f"cannot be shown by the last look if the trend so far continues; bounds {bounds}")
    if verdict == NON_INFERIOR:
        return Decision(NON_INFERIOR, n, mean, lo, hi, alpha, f"certified non-inferior: bounds {bounds}, "
                        f"a drop of {margin:g} or more ruled out")
    if verdict == INFERIOR:
        return Decision(INFERIOR, n, mean, lo, hi, alpha, f"certified inferior: bounds {bounds}, "
                        f"a drop of less than {margin:g} ruled out")
    if verdict == "futile":
        return Decision(STOPPED, n, mean, lo, hi, alpha, f"stopped for futility: a drop of {margin:g} cannot be "
                        f"ruled out by the last look if the trend so far continues; bounds {bounds}")
    if not final:
        return Decision(UNDECIDED, n, mean, lo, hi, alpha, f"undecided so far: bounds {bounds}")
    why = f"undecided: {budget_cut}" if budget_cut else "undecided: the certify pool is exhausted"
    return Decision(UNDECIDED, n, mean, lo, hi, alpha, f"{why}; bounds {bounds}")


def screen_then_race(baseline: Candidate, candidates: Sequence[Candidate], screen_records: Sequence[Record],
                     certify_records: Sequence[Record], evaluate: Evaluate, *, budget: Budget, settings: RaceSettings,
                     resolution: Resolution, calls_per_record: int = 1,
                     eligible: Callable[[Candidate], bool] | None = None, every: bool = True,
                     log: Callable[[str], None] = lambda message: None,
                     goal: QualityGoal | None = None) -> tuple[list[Candidate], Plan | None]:
    """Screen for the first finalist, plan, and race finalists in turn; returns those raced and the plan.

    :func:`plan_finalists` fixes from the first finalist's screen how many may be raced
    (``k``, each at ``alpha / k``; no more than the LM-call budget can race over the whole
    pool). The next finalist is screened for only when selection would still keep the
    baseline (the one before failed, or was certified but is no faster and below the
    baseline's quality), so a race whose first finalist wins screens
    no more than it would for one. Which candidate is the i-th finalist depends on the
    screen records only (screening ranks by screen quality; a screen or race the budget
    cut short ends the race), so the family-wise error rate is at most ``k * alpha / k =
    alpha`` (docs/decisions.md). ``goal``: the quality-first objective (``settings.margin``
    is then ``-goal.min_gain``): finalists by screen gain, selection by :class:`QualityGoal`.
    """
    if goal is not None and settings.margin != goal.margin:
        raise ValueError(f"a quality goal of {goal.min_gain:g} races at margin {goal.margin:g}, not {settings.margin:g}")

    def finalists(keep: int) -> list[Candidate]:
        return screen(baseline, candidates, screen_records, evaluate, budget=budget, settings=settings,
                      resolution=resolution, calls_per_record=calls_per_record, keep=keep, eligible=eligible,
                      every=every, goal=goal)

    found = finalists(1)
    if not found:
        return [], None
    k, plan = plan_finalists(baseline, found[0], pool=len(certify_records), settings=replace(
        settings, finalists=raceable(settings.finalists, budget.calls_left, len(certify_records), calls_per_record)))
    raced: list[Candidate] = []
    for i in range(k):
        refusals = budget.refusals
        if i:
            found = finalists(i + 1)
            if budget.refusals > refusals:  # a finalist from a screen the budget cut short is not raced
                break
        nxt = next((c for c in found if c not in raced), None)
        if nxt is None:
            break
        raced.append(nxt)
        race(baseline, [nxt], certify_records, evaluate, budget=budget, settings=settings, resolution=resolution,
             calls_per_record=calls_per_record, log=log, alpha_each=settings.alpha / k, horizon=plan.horizon,
             goal=goal)
        if _race_over(baseline, raced, budget, refusals, resolution, goal):
            break
    return raced, plan


def quality_gap(cand: Candidate, baseline: Candidate, parts: tuple[str, ...] = ("raced", "screen")) -> float | None:
    """Candidate minus baseline mean score on the records both were scored on: the certify
    records when raced, else the screen records (``parts``: which to look at, in order)."""
    for part in parts:
        mine, theirs = getattr(cand, part), getattr(baseline, part)
        if mine is not None and theirs is not None:
            return paired_mean(mine, theirs)
    return None


def _preferred(pool: Sequence[Candidate], resolution: Resolution, baseline: Candidate | None,
               best_case: Candidate | None = None, parts: tuple[str, ...] = ("raced", "screen")) -> Candidate:
    """The candidate selection takes from ``pool`` (the baseline not in it): the cheapest,
    or within the resolution of it, among those no tied candidate clearly beats on ``parts``
    (:func:`clearly_better`), the fewest static tokens, then the higher quality, then the id
    (the result does not depend on the order of ``pool``). ``best_case``: a candidate taken at the
    highest quality possible (not screened yet)."""
    cheapest = min(pool, key=lambda c: (c.cost, c.static_tokens, c.id))
    ties = [c for c in pool if c.cost - cheapest.cost <= resolution(c, cheapest)]

    def quality(c: Candidate) -> float:
        if c is best_case:
            return float("inf")
        value = quality_gap(c, baseline, parts) if baseline is not None else None
        if value is None:
            report = next((getattr(c, p) for p in parts if getattr(c, p) is not None), None)
            value = None if report is None else report.mean
        return -2.0 if value is None else value

    # A lead the records cannot tell from noise is no reason to keep more static tokens (on
    # 16 screen records, three prunes of invoice_extraction scored 0.350-0.375). Those left
    # are the ones no tied candidate clearly beats.
    unbeaten = [c for c in ties if not any(clearly_better(d, c, parts, best_case) for d in ties if d is not c)]
    level = unbeaten or [min(ties, key=lambda c: (-round(quality(c), 9), c.static_tokens, c.id))]
    return min(level, key=lambda c: (c.static_tokens, -round(quality(c), 9), c.id))


def clearly_better(a: Candidate, b: Candidate, parts: tuple[str, ...] = ("raced", "screen"),
                   best_case: Candidate | None = None) -> bool:
    """Do ``a``'s scores beat ``b``'s beyond noise? On the first of ``parts`` both were scored
    on, a one-sided sign test on the paired records (those where ``a`` scored higher against
    those where ``b`` did) at ``TIE_BREAK_ALPHA``: exact for any score, whatever the number of
    records. A candidate with scored records beats one without; ``best_case`` beats every other.

    On 16 screen records of 0/1 scores that takes 5 discordant pairs all one way (p 0.031),
    or 6 to 1 (p 0.0625 is not enough; 7 to 1 is, p 0.035).
    """
    if a is best_case or b is best_case:
        return a is best_case
    for part in parts:
        mine, theirs = getattr(a, part), getattr(b, part)
        if mine is not None and theirs is not None:
            n = min(mine.n, theirs.n)
            diffs = paired_diffs(mine.scores[:n], theirs.scores[:n])
            if not diffs.size:
                return _scored(mine) and not _scored(theirs)
            wins, losses = int((diffs > 1e-12).sum()), int((diffs < -1e-12).sum())
            return wins > losses and _sign_test_p(wins, wins + losses) <= TIE_BREAK_ALPHA
    return any(_scored(getattr(a, p)) for p in parts) and not any(_scored(getattr(b, p)) for p in parts)


@lru_cache(maxsize=4096)
def _sign_test_p(wins: int, pairs: int) -> float:
    """One-sided p-value of ``wins`` of ``pairs`` discordant records (cached: screening asks often)."""
    return float(binomtest(wins, pairs, 0.5, alternative="greater").pvalue)


def _scored(report: EvalReport | None) -> bool:
    return report is not None and any(s is not None for s in report.scores)


def preference_order(cands: Sequence[Candidate], resolution: Resolution,
                     baseline: Candidate | None = None, best_case: Candidate | None = None,
                     parts: tuple[str, ...] = ("raced", "screen")) -> list[Candidate]:
    """``cands`` in the order selection prefers them (the preferred one, then the preferred
    of the rest, and so on), quality taken on ``parts``."""
    rest, out = list(cands), []
    while rest:
        best = _preferred(rest, resolution, baseline, best_case, parts)
        out.append(best)
        rest.remove(best)
    return out


def select(baseline: Candidate, candidates: Sequence[Candidate], *, resolution: Resolution,
           latency: str = "cost", goal: QualityGoal | None = None) -> Selection:
    """The winner among the certified candidates and the baseline, and why: the clause of
    the rule that decided (see the module docstring), in numbers. ``latency``: what the
    candidates' cost measures ("expected TTFT", "P95 TTFT at 4 req/s"), named in the
    reason beside the figures and recorded with the decision. ``goal``: the quality-first
    objective's rule instead (:func:`select_better`)."""
    if goal is not None:
        return select_better(baseline, candidates, resolution=resolution, goal=goal, latency=latency)

    def chosen(best: Candidate, clause: str, reason: str) -> Selection:
        return Selection(best, baseline, clause, reason, latency, resolution(best, baseline),
                         (best.decision.lower, best.decision.upper))

    def kept(reason: str) -> Selection:
        return Selection(baseline, baseline, KEPT, reason, latency)

    certified = [c for c in candidates if c.decision.certified]
    if not certified:
        # What each raced finalist's test said (a futility stop after 400 records is not
        # "nothing happened"), and a race the budget cut short.
        said = [f"{c.id}: {c.decision.reason}" for c in candidates if c.raced is not None
                or c.decision.verdict == NOT_RACED and any(w in c.decision.reason for w in ("budget", "cap"))]
        shown = f" ({'; '.join(said)})" if said else ""
        return kept(f"{KEPT}: no candidate certified non-inferior{shown}; keeping the baseline")
    faster = [c for c in certified if _faster(c, baseline, resolution)]
    if faster:
        best = _preferred(faster, resolution, baseline)
        return chosen(best, FASTER, f"{FASTER}: {best.id}: {best.decision.reason}; {latency} {best.cost:.1f} vs baseline "
                      f"{baseline.cost:.1f}, lower by more than the resolution ({resolution(best, baseline):.1f})")
    ties = [c for c in certified if can_beat(c, baseline, resolution, best_is_baseline=True)]
    no_worse = [c for c in ties if (gap := quality_gap(c, baseline)) is not None and gap >= -1e-12]
    if no_worse:
        best = _preferred(no_worse, resolution, baseline)
        return chosen(best, TIE, f"{TIE}: {best.id}: {best.decision.reason}; {latency} {best.cost:.1f} vs baseline "
                      f"{baseline.cost:.1f} is within the resolution ({resolution(best, baseline):.1f}) and its "
                      f"quality on the certify records is at least the baseline's "
                      f"({quality_gap(best, baseline):+.3f})")
    shown = ", ".join(f"{c.id} {latency} {c.cost:.1f}, quality {format_number(quality_gap(c, baseline), '+.3f')}"
                      for c in certified)
    return kept(f"{KEPT}: {len(certified)} candidate(s) certified non-inferior ({shown}) but none is faster "
                f"than the baseline ({baseline.cost:.1f}) beyond the resolution, nor within it at the "
                "baseline's quality or better; keeping the baseline")


def select_better(baseline: Candidate, candidates: Sequence[Candidate], *, resolution: Resolution,
                  goal: QualityGoal, latency: str = "cost") -> Selection:
    """The quality-first objective's rule (``slo.objective: quality``), one clause and *kept*:

    * *better*: among the candidates certified superior by ``goal.min_gain`` (a race at
      margin ``-min_gain`` whose lower bound reaches the gain: a candidate certified only
      non-inferior is never one) whose cost ``goal`` allows (no higher than the baseline's
      beyond the resolution, or within ``slo.ttft_ms``), the highest certified gain (lower
      bound), then the lower cost, fewer static tokens, the id;
    * *kept*: otherwise the baseline stays.

    The reason names the clause, the bounds, the gain and the latency."""
    superior = [c for c in candidates if c.decision.verdict == SUPERIOR and c.decision.lower is not None
                and c.decision.lower >= goal.min_gain - 1e-6]
    allowed = [c for c in superior if goal.affordable(c, baseline, resolution)]
    if allowed:
        best = min(allowed, key=lambda c: (-round(c.decision.lower, 9), c.cost, c.static_tokens, c.id))
        d = best.decision
        return Selection(best, baseline, BETTER,
                         f"{BETTER}: {best.id}: {d.reason}; its gain over the baseline is certified above "
                         f"{goal.min_gain:g} (lower bound {d.lower:+.3f}, mean {d.diff_mean:+.3f} on {d.n} certify "
                         f"records); {goal.latency_words(best, baseline, resolution, latency)}",
                         latency, resolution(best, baseline), (d.lower, d.upper), gain=goal.min_gain)
    if superior:
        shown = "; ".join(f"{c.id}: {goal.latency_words(c, baseline, resolution, latency)}" for c in superior)
        return Selection(baseline, baseline, KEPT, f"{KEPT}: {len(superior)} candidate(s) certified better by more "
                         f"than {goal.min_gain:g} but none at an allowed latency ({shown}); keeping the baseline",
                         latency)
    said = [f"{c.id}: {c.decision.reason}" for c in candidates if c.raced is not None
            or c.decision.verdict == NOT_RACED and any(w in c.decision.reason for w in ("budget", "cap"))]
    shown = f" ({'; '.join(said)})" if said else ""
    return Selection(baseline, baseline, KEPT, f"{KEPT}: no candidate certified better than the baseline by more than "
                     f"{goal.min_gain:g}{shown}; keeping the baseline", latency)


def plan_from_screen(baseline: Candidate, finalists: Sequence[Candidate], *, pool: int,
                     settings: RaceSettings) -> Plan:
    """What a race of ``pool`` certify records can decide for these finalists, each tested at
    ``alpha / len(finalists)``, at the discordance their screen records cannot rule out."""
    discordance, basis = _screen_discordance(baseline, finalists)
    return plan_records(pool, discordance=discordance, margin=settings.margin,
                        alpha=settings.alpha / max(1, len(finalists)), discrete=settings.discrete,
                        first_look=settings.first_look, basis=basis)


def _screen_discordance(baseline: Candidate, finalists: Sequence[Candidate]) -> tuple[float, str]:
    """The upper 90% bound of the discordance the finalists' screen records show (the squared
    paired differences' mean: the share of discordant pairs for 0/1 scores), never its point
    estimate, so a quiet screen does not promise a cheap race; and where it comes from."""
    squares: list[float] = []
    if baseline.screen is not None:
        for cand in finalists:
            if cand.screen is not None:
                squares += (paired_diffs(cand.screen.scores, baseline.screen.scores[: cand.screen.n]) ** 2).tolist()
    bound = discordance_upper_bound(sum(squares), len(squares))
    if bound is None:
        return PlanAssumption.discordance, "assumed: no screen pairs"
    return bound, (f"the upper {PLAN_CONFIDENCE:.0%} bound from {sum(squares):.3g} discordance in "
                   f"{len(squares)} screen pairs")

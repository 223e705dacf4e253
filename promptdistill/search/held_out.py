"""The test split's check, one for both stages: the baseline and the winner on held-out records, and the revert.

After :func:`~promptdistill.search.racing.select`, the distiller and the optimizer both
call :func:`check_on_test`. It scores the baseline and the winner on the test split
(:func:`score_test`: two looks of half the records, the second unless the first already
clears the winner) and reverts the winner to the baseline when the paired mean difference
falls below what its clause allows: the allowed drop (``slo.max_quality_drop``) for a
*faster* winner, nothing for a *tie* (chosen for being at least as good, it must stay so
on held-out records, or it would ship no faster and worse), and for a *better* winner (the
quality-first objective) the gain it was certified to exceed: it is held to its claim, so
a held-out mean gain below ``slo.min_quality_gain`` reverts it. The reverted
:class:`~promptdistill.search.racing.Selection` keeps the clause that chose the winner
(``chosen_clause``) and says why in its reason (``REVERTED on test``).

The intervals on the paired test differences come from one call,
:func:`difference_interval`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from promptdistill.core.stats import MeanCI, paired_diffs
from promptdistill.engine.base import Engine
from promptdistill.evaluate.evaluator import EvalItem, EvalReport, evaluate_many
from promptdistill.search.group_sequential import score_interval
from promptdistill.search.racing import Selection
from promptdistill.search.selection import BETTER, TIE

__all__ = ["MIN_LOOK", "TEST_CONFIDENCE", "TestCheck", "allowed_test_drop", "check_on_test", "difference_interval",
           "score_test"]

TEST_CONFIDENCE = 0.95
"""Coverage of the test split's intervals, whichever look they come from."""
MIN_LOOK = 50
"""Test records a look needs: a smaller split is scored whole, in one look (on a few 0/1
records a first half where both prompts agree everywhere gives the interval [0, 0])."""


def difference_interval(diffs: Sequence[float], *, confidence: float, seed: int) -> MeanCI:
    """The mean paired difference (winner - baseline) on test records, with its two-sided
    score interval (Tango's for 0/1 scores: a percentile bootstrap under-covers on a few
    discordant pairs among a hundred records). ``seed`` is unused: the interval is exact."""
    del seed
    return score_interval(list(diffs), confidence=confidence)


def score_test(engine: Engine, items: Callable[[Sequence[Any]], list[EvalItem]], records: Sequence[Any], *,
               line: float | None, judge_runner: Any, seed: int) -> tuple[tuple[EvalReport, EvalReport], float, str]:
    """The baseline and the winner on the test records, in two looks of half the records each.

    ``items(records)`` gives the baseline's item and, when the winner renders another
    prompt, the winner's. ``line`` is the paired difference (winner - baseline) below which
    the winner is reverted; None when nothing can be reverted (a kept baseline, or
    ``verify_on_test`` off), and then the first half alone is scored, for the report. A
    split of fewer than ``2 * MIN_LOOK`` records is scored whole, in one look. Otherwise the
    second half is scored unless the first half's interval on the difference lies above
    the line: a winner the first half already clears spends no more records. Only that
    stop is early, so a revert (the mean difference of every record below the line)
    happens exactly as often as when every record is scored, or less; the price is that a
    winner truly worse than the line clears the first half with a chance of at most 1.25%
    (its interval's lower tail). With two looks each interval is at 97.5%, so the one
    reported covers at 95% or more whichever look it came from (Bonferroni).

    Returns:
        (the baseline's report, the winner's: the baseline's again with one item), the
        intervals' confidence, and which look stopped the scoring and why.
    """
    split = len(records) >= 2 * MIN_LOOK
    looks = 2 if split and line is not None else 1
    confidence = 1.0 - (1.0 - TEST_CONFIDENCE) / looks
    half = (len(records) + 1) // 2 if split else len(records)
    first = evaluate_many(engine, items(records[:half]), judge_runner=judge_runner, seed=seed)
    if not split:
        return (first[0], first[-1]), confidence, (f"all {half} records in one look (fewer than {2 * MIN_LOOK}: "
                                                   "too few to split)")
    if line is None:
        return (first[0], first[-1]), confidence, (f"nothing to revert: the first {half} of {len(records)} "
                                                   "records are scored, for the report")
    diffs = paired_diffs(first[-1].scores, first[0].scores)
    ci = difference_interval(diffs.tolist(), confidence=confidence, seed=seed) if diffs.size else None
    where = f"[{ci.low:+.3f}, {ci.high:+.3f}]" if ci is not None else "(no pair scored)"
    if ci is not None and ci.low > line:
        return (first[0], first[-1]), confidence, (f"decided after the first {half} of {len(records)} records: "
                                                   f"the difference's {confidence:.1%} interval {where} lies above "
                                                   f"{line:+.3f}")
    second = evaluate_many(engine, items(records[half:]), judge_runner=judge_runner, seed=seed)
    merged = [a.merged(b) for a, b in zip(first, second)]
    return (merged[0], merged[-1]), confidence, (f"all {len(records)} records: the first {half} left the difference's "
                                                 f"{confidence:.1%} interval {where} not above {line:+.3f}")



@dataclass(frozen=True)
class TestCheck:
    """What the test split said about a selection."""

    selection: Selection
    """The decision after the check: the one checked, or the baseline when it was reverted."""
    baseline: EvalReport
    winner: EvalReport
    """The checked winner's report (the baseline's again when the winner renders the baseline's prompt)."""
    confidence: float
    """Coverage of the intervals on these records (:func:`score_test`)."""
    stop: str
    """Which look stopped the scoring, and why."""
    diff_mean: float | None
    """Mean paired difference, checked winner - baseline (None: no record scored by both)."""
    allowed_drop: float
    """The drop the checked winner's clause allowed (:func:`allowed_test_drop`)."""

    @property
    def reverted(self) -> bool:
        return self.selection.reverted_from is not None


def allowed_test_drop(selection: Selection, max_drop: float) -> float:
    """How far below the baseline a winner may score on the test split: a tie, chosen for
    being at least as good, not at all; a faster winner, the allowed drop; a better winner
    must stay above the baseline by its certified gain (a negative drop)."""
    if selection.clause == BETTER:
        return -float(selection.gain or 0.0)
    return 0.0 if selection.clause == TIE else max_drop


def check_on_test(selection: Selection, items: Callable[[Sequence[Any]], list[EvalItem]], records: Sequence[Any], *,
                  engine: Engine, judge_runner: Any, seed: int, max_drop: float, revert: bool = True) -> TestCheck:
    """Score the baseline and ``selection``'s winner on the test ``records``; revert a winner
    that falls below the line (see the module docstring).

    Args:
        items: ``items(records)``: the baseline's item and, when the winner renders another
            prompt, the winner's (:func:`score_test`).
        max_drop: the allowed quality drop (the spec's ``slo.max_quality_drop``).
        revert: False scores only, for the report (the optimizer's ``verify_on_test`` off).
    """
    allowed = allowed_test_drop(selection, max_drop)
    revertible = revert and not selection.kept
    (base, win), confidence, stop = score_test(engine, items, records, line=-allowed if revertible else None,
                                               judge_runner=judge_runner, seed=seed)
    diffs = paired_diffs(win.scores, base.scores)
    diff = float(diffs.mean()) if diffs.size else None
    checked = selection
    if revertible and diff is not None and diff < -allowed - 1e-12:
        why = (f"a tie on {selection.latency} must be at least as good as the baseline" if selection.clause == TIE
               else f"a better winner must keep its certified gain of more than {-allowed:g}"
               if selection.clause == BETTER else f"allowed drop {max_drop:g}")
        checked = selection.reverted(f"REVERTED on test: {selection.winner.id} scored {diff:+.3f} against the "
                                     f"baseline on {base.n} records ({why}); keeping the baseline")
    return TestCheck(checked, base, win, confidence, stop, diff, allowed)

"""The distiller's pure parts: clause scores, pruned candidates, successive halving, selection.

Nothing here calls an engine; ``promptdistill.distill`` wires these to one. Quality
scores are in [0, 1]; a candidate is *feasible* when its mean is at least the
baseline's mean on the same records minus ``max_drop``. Among feasible candidates the
shortest instruction wins (the point of distilling); ties go to the higher score.

Example:
    >>> rung_sizes(8, 30, eta=2)
    [8, 16, 30]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from promptdistill.clauses import Clause
from promptdistill.evaluate import EvalReport, mean_of

__all__ = [
    "Candidate",
    "ClauseScore",
    "agreement_rate",
    "is_feasible",
    "prune_keep_sets",
    "rank_key",
    "rung_sizes",
    "select_winner",
    "successive_halving",
]


@dataclass(frozen=True)
class ClauseScore:
    """How necessary one clause looked to the judge and to ablation."""

    clause: Clause
    judge_score: int | None = None
    """The judge's 1-5 score; None when the judge reply was invalid or not asked."""
    judge_reason: str | None = None
    judge_error: str | None = None
    ablation_delta: float | None = None
    """Mean score without the clause minus mean score with it, on the dev minibatch."""

    @property
    def judge_necessity(self) -> float | None:
        return None if self.judge_score is None else (self.judge_score - 1) / 4

    @property
    def ablation_necessity(self) -> float | None:
        """1 when dropping the clause hurt, 0.5 when it changed nothing, 0 when it helped."""
        if self.ablation_delta is None:
            return None
        return 1.0 if self.ablation_delta < -1e-9 else 0.5 if abs(self.ablation_delta) <= 1e-9 else 0.0

    @property
    def combined(self) -> float | None:
        """Mean of the judge's and ablation's necessity (whichever exist)."""
        return mean_of([self.judge_necessity, self.ablation_necessity])


def agreement_rate(scores: Sequence[ClauseScore]) -> float | None:
    """How often judge and ablation agree on 'necessary' (judge >= 0.5 vs. delta < 0)."""
    pairs = [
        (s.judge_necessity >= 0.5, s.ablation_delta < -1e-9)
        for s in scores
        if not s.clause.protected and s.judge_necessity is not None and s.ablation_delta is not None
    ]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def prune_keep_sets(scores: Sequence[ClauseScore], thresholds: Sequence[float]) -> dict[str, tuple[str, ...]]:
    """Kept clause ids per pruning rule: judge and combined at each threshold, and ablation.

    A clause without a score under a rule is kept (pruning needs evidence). Protected
    clauses are always kept. Rules that keep the same set appear once (first name wins).
    """
    rules: dict[str, Callable[[ClauseScore], float | None]] = {}
    for t in thresholds:
        rules[f"judge@{t:.2f}"] = lambda s, t=t: None if s.judge_necessity is None else float(s.judge_necessity >= t)
    rules["ablation"] = lambda s: None if s.ablation_delta is None else float(s.ablation_delta < -1e-9)
    for t in thresholds:
        rules[f"combined@{t:.2f}"] = lambda s, t=t: None if s.combined is None else float(s.combined >= t)
    out: dict[str, tuple[str, ...]] = {}
    seen: set[tuple[str, ...]] = set()
    for name, rule in rules.items():
        keep = tuple(s.clause.id for s in scores if s.clause.protected or rule(s) in (None, 1.0))
        if keep not in seen and any(rule(s) is not None for s in scores):
            seen.add(keep)
            out[name] = keep
    return out


@dataclass
class Candidate:
    """One instruction the distiller considered."""

    id: str
    origin: str
    """'baseline', 'prune:<rule>', 'rewrite:<rule>@<ratio>' or 'proposal'."""
    round: int
    spec: Any
    instruction_tokens: int
    density: float | None = None
    parent: str | None = None
    kept: tuple[str, ...] = ()
    """Clause ids of the parent that this candidate kept (or rewrote)."""
    report: EvalReport | None = None
    """Merged over every rung it was evaluated on."""
    rung: int = -1
    """Index of the last successive-halving rung it reached (-1: not evaluated)."""
    lm_calls: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.spec.instruction_text()

    @property
    def mean(self) -> float | None:
        return None if self.report is None else self.report.mean


def rung_sizes(minibatch: int, full: int, *, eta: int = 2) -> list[int]:
    """Record counts per rung: the minibatch, times ``eta`` each rung, ending at ``full``."""
    if minibatch < 1 or full < 1 or eta < 2:
        raise ValueError(f"need minibatch >= 1, full >= 1 and eta >= 2, got {minibatch}, {full}, {eta}")
    sizes = [min(minibatch, full)]
    while sizes[-1] * eta < full:
        sizes.append(sizes[-1] * eta)
    if sizes[-1] != full:
        sizes.append(full)
    return sizes


def _prefix_mean(scores: Sequence[float | None], n: int) -> float | None:
    return mean_of(list(scores[:n]))


def rank_key(mean: float | None, base_mean: float | None, max_drop: float, tokens: int) -> tuple:
    """Sort key (ascending = better): feasible first, then shorter, then higher score.

    Infeasible candidates rank by how far they fall short.
    """
    if mean is None:
        return (math.inf, tokens, 0.0)
    floor = (base_mean if base_mean is not None else 0.0) - max_drop
    shortfall = max(0.0, floor - mean)
    return (round(shortfall, 9), tokens, -mean)


def is_feasible(candidate: Candidate, base_scores: Sequence[float | None], max_drop: float) -> bool:
    """Mean >= baseline mean on the same records - max_drop (and, for judge-scored
    specs compared with the baseline, equivalence >= 0.5 - max_drop)."""
    report = candidate.report
    if report is None or report.mean is None:
        return False
    base = _prefix_mean(base_scores, report.n)
    if base is not None and report.mean < base - max_drop - 1e-9:
        return False
    eq = report.equivalence_mean
    return eq is None or eq >= 0.5 - max_drop - 1e-9


def successive_halving(
    candidates: list[Candidate],
    records: Sequence[Any],
    sizes: Sequence[int],
    evaluate_fn: Callable[[list[Candidate], Sequence[Any], bool], list[EvalReport]],
    *,
    base_scores: Sequence[float | None],
    max_drop: float,
    eta: int = 2,
    can_afford: Callable[[int, int, bool], bool] = lambda n_cands, n_records, last: True,
) -> tuple[list[Candidate], bool]:
    """Evaluate every candidate on the first rung, the best 1/eta on the next, and so on.

    Rungs are prefixes of ``records``: a rung only evaluates the records the previous
    rung did not, and reports are merged. ``evaluate_fn(candidates, new_records, last)``
    returns one report per candidate; ``last`` marks the final (full) rung.

    Returns:
        (the candidates alive at the last rung reached, whether the budget cut it short).
    """
    alive = list(candidates)
    done = 0
    for rung, size in enumerate(sizes):
        last = rung == len(sizes) - 1
        new = records[done:size]
        if not alive:
            break
        if not can_afford(len(alive), len(new), last):
            return alive, True
        for cand, report in zip(alive, evaluate_fn(alive, new, last)):
            cand.report = report if cand.report is None else cand.report.merged(report)
            cand.lm_calls += report.lm_calls
            cand.rung = rung
        done = size
        if last:
            break
        keep = max(1, math.ceil(len(alive) / eta))
        base = _prefix_mean(base_scores, size)
        alive = sorted(alive, key=lambda c: rank_key(c.mean, base, max_drop, c.instruction_tokens))[:keep]
    return alive, False


def select_winner(current: Candidate, finalists: Sequence[Candidate], base_scores: Sequence[float | None],
                  max_drop: float) -> Candidate:
    """The shortest feasible finalist evaluated on every record, if shorter or better than ``current``."""
    n = current.report.n if current.report is not None else 0
    pool = [c for c in finalists if c.report is not None and c.report.n == n and is_feasible(c, base_scores, max_drop)]
    best = current
    for cand in sorted(pool, key=lambda c: (c.instruction_tokens, -(c.mean or 0.0), c.id)):
        shorter = cand.instruction_tokens < best.instruction_tokens
        better = cand.instruction_tokens == best.instruction_tokens and (cand.mean or 0.0) > (best.mean or 0.0) + 1e-9
        if shorter or better:
            best = cand
            break
    return best

"""The distiller's candidates and clause scores (pure: nothing here calls an engine).

A clause's necessity is scored by the ``clause_necessity`` judge (1-5, mapped to [0, 1])
and, where the judge is unsure (unless ``ablate_clear``), by ablation (the change in mean
score on the screen records when the clause is dropped). ``prune_keep_sets`` turns the
scores into the clause sets each pruning rule keeps; each set becomes one
:class:`DistillCandidate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from promptdistill.core.stats import mean_of
from promptdistill.specs.clauses import Clause
from promptdistill.search.racing import Candidate

__all__ = ["ClauseScore", "DistillCandidate", "agreement_rate", "prune_keep_sets"]


@dataclass(eq=False, kw_only=True)
class DistillCandidate(Candidate):
    """One instruction the distiller considered; its cost is its instruction tokens."""

    origin: str = "baseline"
    """'baseline', 'prune:<rule>', 'rewrite:<rule>@<ratio>' or 'proposal'."""
    round: int = 0
    parent: str | None = None
    kept: tuple[str, ...] = ()
    """Clause ids of the parent that this candidate kept (or rewrote)."""
    density: float | None = None

    @property
    def instruction_tokens(self) -> int:
        return int(self.cost)

    @property
    def text(self) -> str:
        return self.spec.instruction_text()


@dataclass(frozen=True)
class ClauseScore:
    """How necessary one clause looked to the judge and to ablation."""

    clause: Clause
    judge_score: int | None = None
    """The judge's 1-5 score; None when the judge reply was invalid or not asked."""
    judge_reason: str | None = None
    judge_error: str | None = None
    ablation_delta: float | None = None
    """Mean score without the clause minus mean score with it, on the screen records; None
    when not ablated (ablation off, the judge's score clear, or no budget left)."""

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

"""What a distillation run produced, as tables and files.

``DistillResult.write(folder)`` writes, each atomically:

* ``candidates.parquet``: one row per candidate: its text, instruction tokens, density,
  screen and race scores, the race's decision with its bounds, the LM calls it cost,
  whether it was a finalist and whether it won;
* ``clauses.parquet``: one row per clause per round: text, protection, judge score and
  reason, ablation delta, kept or pruned;
* ``judges.parquet``: the statistics of every judge used;
* ``result.json``: the summary (winner, the decision as ``selection``, reason, plan, test
  figures, calls).

The optimizer reads the finalists back from ``candidates.parquet``
(:func:`promptdistill.optimize.variants.variants_from_parquet`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from promptdistill.core.jsonio import json_safe, write_json, write_parquet
from promptdistill.core.stats import bootstrap_ci
from promptdistill.distill.candidates import ClauseScore, DistillCandidate
from promptdistill.evaluate.evaluator import EvalReport
from promptdistill.search.selection import SelectionRecord
from promptdistill.search.sequential import Plan

__all__ = ["DistillResult", "clause_rows"]


def clause_rows(scored: Sequence[tuple[int, ClauseScore, bool]]) -> list[dict[str, Any]]:
    """Rows of the per-clause table from (round, score, kept) triples."""
    rows = []
    for rnd, s, kept in scored:
        c = s.clause
        rows.append({
            "round": rnd, "clause_id": c.id, "source": c.source, "text": c.text,
            "protected": c.protected, "protected_reason": c.reason,
            "judge_score": s.judge_score, "judge_reason": s.judge_reason, "judge_error": s.judge_error,
            "ablation_delta": s.ablation_delta, "combined": s.combined, "kept": kept,
        })
    return rows


@dataclass
class DistillResult:
    """The outcome of ``distill``: the winner, every candidate, and how it was decided."""

    spec_name: str
    seed: int
    config: Any
    original: DistillCandidate
    winner: DistillCandidate
    candidates: list[DistillCandidate]
    finalists: list[str]
    """Ids of the candidates raced (chosen on the screen records): the optimizer's variants."""
    reason: str
    """Why the winner won, or why the original was kept, in numbers."""
    plan: Plan
    clause_rows: list[dict[str, Any]]
    judge_stats: list[dict[str, Any]]
    agreement_rate: float | None
    """How often the judge and ablation agreed on which clauses are necessary (on the clauses
    ablated: by default those the judge was unsure of; None when none was)."""
    calibration: dict[str, Any] | None
    """answer_equivalence against the metric (programmatic metrics only)."""
    test: dict[str, EvalReport]
    rounds: int
    stop_reason: str
    search_lm_calls: int
    """LM calls before the held-out test."""
    total_lm_calls: int
    elapsed_s: float
    max_quality_drop: float
    splits: dict[str, int] = field(default_factory=dict)
    tokens_processed: int = 0
    """Prompt and completion tokens of every LM request (what a GPU spends)."""
    engines: dict[str, Any] = field(default_factory=dict)
    """The identities of the task engine and the judge engine."""
    selection: SelectionRecord | None = None
    """The decision: winner, clause, bounds, a revert on the test split (``reason`` says it too)."""
    test_stop: str | None = None
    """Which look of the test split stopped its scoring, and why (None: not scored)."""

    @property
    def token_reduction(self) -> float:
        """1 - winner tokens / original tokens (instruction plus rules)."""
        return 1.0 - self.winner.instruction_tokens / max(1, self.original.instruction_tokens)

    def test_figures(self) -> dict[str, Any]:
        """Test means with 95% bootstrap intervals, for the original and the winner (and a
        winner the test split reverted, as ``reverted``)."""
        out: dict[str, Any] = {}
        for who, report in self.test.items():
            out.update(bootstrap_ci(report.scores, seed=self.seed).to_dict(f"test_{who}_"))
        return out

    def candidate_rows(self) -> list[dict[str, Any]]:
        rows = []
        for c in self.candidates:
            rows.append({
                "spec": self.spec_name, "seed": self.seed, "round": c.round, "candidate_id": c.id,
                "origin": c.origin, "parent": c.parent, "instruction": c.spec.instruction,
                "constraints": json.dumps(list(c.spec.constraints), ensure_ascii=False),
                "text": c.text, "instruction_tokens": c.instruction_tokens, "density": c.density,
                "kept": ",".join(c.kept),
                "screen_n": c.screen.n if c.screen else 0, "screen_mean": c.screen.mean if c.screen else None,
                "race_n": c.raced.n if c.raced else 0, "race_mean": c.raced.mean if c.raced else None,
                "valid_json_rate": c.screen.valid_json_rate if c.screen else None,
                "finalist": c.id in self.finalists, "verdict": c.decision.verdict,
                "diff_lower": c.decision.lower, "diff_upper": c.decision.upper, "decision": c.decision.reason,
                "notes": "; ".join(c.notes), "lm_calls": c.lm_calls, "winner": c is self.winner,
            })
        return rows

    def summary(self) -> dict[str, Any]:
        return json_safe({
            "spec": self.spec_name, "seed": self.seed, "winner": self.winner.id, "reason": self.reason,
            "original_tokens": self.original.instruction_tokens, "winner_tokens": self.winner.instruction_tokens,
            "token_reduction": self.token_reduction, "finalists": self.finalists,
            "screen_original": self.original.screen.mean if self.original.screen else None,
            "decision": self.winner.decision.to_dict(), "plan": asdict(self.plan), "plan_text": self.plan.sentence(),
            **self.test_figures(), "agreement_rate": self.agreement_rate,
            "calibration_agreement": (self.calibration or {}).get("agreement_rate"), "rounds": self.rounds,
            "stop_reason": self.stop_reason, "search_lm_calls": self.search_lm_calls,
            "total_lm_calls": self.total_lm_calls, "tokens_processed": self.tokens_processed,
            "budget_lm_calls": self.config.max_lm_calls,
            "elapsed_s": self.elapsed_s, "max_quality_drop": self.max_quality_drop, "splits": self.splits,
            "engines": self.engines, "test_stop": self.test_stop,
            "selection": self.selection.to_dict() if self.selection is not None else None,
        })

    def write(self, folder: str | os.PathLike[str]) -> Path:
        """Write the tables and ``result.json`` into ``folder`` (see the module docstring)."""
        out = Path(folder)
        write_parquet(out / "candidates.parquet", pd.DataFrame(self.candidate_rows()))
        write_parquet(out / "clauses.parquet", pd.DataFrame(self.clause_rows or [{"round": 0}]))
        write_parquet(out / "judges.parquet", pd.DataFrame(self.judge_stats or [{"judge": None}]))
        write_json(out / "result.json", {**self.summary(), "calibration": self.calibration})
        return out

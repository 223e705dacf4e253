"""What a distillation run produced, as tables and as Parquet files.

``DistillResult.write(path)`` writes three files atomically (temp file, then rename):

* ``path``: one row per candidate: its text, instruction tokens, density, scores on the
  minibatch and the full dev split, feasibility, the LM calls it cost, and which one won;
* ``path`` with ``.clauses.parquet``: one row per clause per round: text, protection,
  judge score and reason, ablation delta, kept or pruned;
* ``path`` with ``.judges.parquet``: the statistics of every judge used.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from promptdistill.distill_search import Candidate, ClauseScore, is_feasible
from promptdistill.evaluate import EvalReport

__all__ = ["DistillResult", "clause_rows", "write_result"]


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
    """The outcome of ``distill``: the winner, every candidate, and how it was found."""

    spec_name: str
    seed: int
    config: Any
    original: Candidate
    winner: Candidate
    candidates: list[Candidate]
    clause_rows: list[dict[str, Any]]
    judge_stats: list[dict[str, Any]]
    agreement_rate: float | None
    """How often the judge and ablation agreed on which clauses are necessary."""
    calibration: dict[str, Any] | None
    """answer_equivalence against the metric (programmatic metrics only)."""
    test: dict[str, EvalReport]
    rounds: int
    stop_reason: str
    search_lm_calls: int
    """LM calls of the search (what the budget bounds)."""
    total_lm_calls: int
    """Search + held-out test + calibration."""
    elapsed_s: float
    max_quality_drop: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def token_reduction(self) -> float:
        """1 - winner tokens / original tokens (instruction plus rules)."""
        return 1.0 - self.winner.instruction_tokens / max(1, self.original.instruction_tokens)

    @property
    def dev_delta(self) -> float | None:
        a, b = self.original.mean, self.winner.mean
        return None if a is None or b is None else b - a

    @property
    def test_delta(self) -> float | None:
        if "winner" not in self.test:
            return None
        a, b = self.test["original"].mean, self.test["winner"].mean
        return None if a is None or b is None else b - a

    def candidate_rows(self) -> list[dict[str, Any]]:
        base_scores = self.original.report.scores if self.original.report else []
        rows = []
        for c in self.candidates:
            r = c.report
            rows.append({
                "spec": self.spec_name, "seed": self.seed, "round": c.round, "candidate_id": c.id,
                "origin": c.origin, "parent": c.parent, "instruction": c.spec.instruction,
                "constraints": json.dumps(list(c.spec.constraints), ensure_ascii=False),
                "text": c.text, "instruction_tokens": c.instruction_tokens, "density": c.density,
                "kept": ",".join(c.kept), "rung": c.rung,
                "n_evaluated": r.n if r else 0,
                "minibatch_mean": _mean(r.scores[: self.config.minibatch_size]) if r else None,
                "dev_mean": r.mean if r else None,
                "valid_json_rate": r.valid_json_rate if r else None,
                "equivalence": r.equivalence_mean if r else None,
                # Feasibility is only claimed on the full dev split, where the winner is chosen.
                "feasible": bool(r is not None and r.n == len(base_scores) and is_feasible(c, base_scores, self.max_quality_drop)),
                "lm_calls": c.lm_calls, "winner": c is self.winner,
                "test_mean": self._test_mean(c),
            })
        return rows

    def _test_mean(self, c: Candidate) -> float | None:
        if c is self.winner and "winner" in self.test:
            return self.test["winner"].mean
        if c is self.original and "original" in self.test:
            return self.test["original"].mean
        return None

    def summary(self) -> dict[str, Any]:
        return {
            "spec": self.spec_name, "seed": self.seed, "winner": self.winner.id,
            "original_tokens": self.original.instruction_tokens, "winner_tokens": self.winner.instruction_tokens,
            "token_reduction": self.token_reduction, "dev_original": self.original.mean,
            "dev_winner": self.winner.mean, "dev_delta": self.dev_delta,
            "test_original": self.test["original"].mean if "original" in self.test else None,
            "test_winner": self.test["winner"].mean if "winner" in self.test else None,
            "test_delta": self.test_delta, "agreement_rate": self.agreement_rate,
            "calibration_agreement": (self.calibration or {}).get("agreement_rate"),
            "rounds": self.rounds, "stop_reason": self.stop_reason,
            "search_lm_calls": self.search_lm_calls, "total_lm_calls": self.total_lm_calls,
            "budget_lm_calls": self.config.max_lm_calls, "elapsed_s": self.elapsed_s,
        }

    def write(self, path: str | os.PathLike[str]) -> Path:
        return write_result(self, path)


def _mean(values: Sequence[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def _sibling(path: Path, suffix: str) -> Path:
    stem = path.name[: -len(".parquet")] if path.name.endswith(".parquet") else path.name
    return path.with_name(f"{stem}.{suffix}.parquet")


def _write_frame(rows: list[dict[str, Any]], path: Path, metadata: dict[str, str]) -> None:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **{k.encode(): v.encode() for k, v in metadata.items()}})
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_result(result: DistillResult, path: str | os.PathLike[str]) -> Path:
    """Write the candidates (and beside them the clause table and judge stats) to Parquet."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"promptdistill.summary": json.dumps(result.summary(), default=str),
            "promptdistill.calibration": json.dumps(result.calibration, default=str)}
    _write_frame(result.candidate_rows(), path, meta)
    _write_frame(result.clause_rows or [{"round": 0}], _sibling(path, "clauses"), meta)
    _write_frame(result.judge_stats or [{"judge": None}], _sibling(path, "judges"), meta)
    return path

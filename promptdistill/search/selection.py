"""The selection rule's clauses, and a decision as stored: what publishing and reports read.

:func:`promptdistill.search.racing.select` decides with live candidates and returns a
:class:`~promptdistill.search.racing.Selection`; a stage stores ``Selection.to_dict()`` in
its result (``result.json``'s ``selection``). Everything downstream (the publishing gate,
the night report, the benchmarks) reads that back as a :class:`SelectionRecord`: typed
fields, never the reason's text. No heavy imports: the registry side and the reports load it.

Example:
    >>> record = SelectionRecord.from_dict({"winner": "short/none", "baseline": "baseline", "clause": FASTER,
    ...                                     "reason": "faster: ...", "latency": "expected TTFT"})
    >>> record.kept, record.clause
    (False, 'faster')
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

__all__ = ["BETTER", "CLAUSES", "FASTER", "KEPT", "SelectionRecord", "TIE"]

FASTER, TIE, KEPT = "faster", "tie, no worse", "kept"
"""The clauses of the selection rule (:mod:`promptdistill.search.racing`); every reason starts with its clause."""
BETTER = "better"
"""The quality-first objective's clause (``slo.objective: quality``): certified superior to the
baseline by ``slo.min_quality_gain``, at a latency no higher beyond the resolution or within the SLO."""
CLAUSES = (FASTER, TIE, BETTER, KEPT)


@dataclass(frozen=True)
class SelectionRecord:
    """A stage's decision as stored in its result: which candidate, by which clause, and why."""

    winner: str
    """The published candidate's id (the baseline's when kept)."""
    baseline: str
    clause: str | None
    """FASTER, TIE, BETTER or KEPT (a reverted winner is KEPT); None: a result stored before this field
    existed, whose winner was not the baseline."""
    reason: str
    """The decision in words and numbers, for people: reports quote it, nothing parses it."""
    latency: str = "cost"
    """What the cost that decided measures: "instruction tokens", "expected TTFT"..."""
    resolution: float | None = None
    """Cost difference between the winner and the baseline below which the two tie (None: kept)."""
    bounds: tuple[float | None, float | None] | None = None
    """The winner's certified bounds on its mean difference from the baseline (None: kept)."""
    reverted_from: str | None = None
    """The candidate the rule chose and the test split reverted (the clause is then KEPT)."""
    chosen_clause: str | None = None
    """The clause that chose ``reverted_from`` (None when nothing was reverted)."""
    gain: float | None = None
    """BETTER: the quality gain over the baseline the winner was certified to exceed
    (``slo.min_quality_gain``); None for the other clauses."""

    @property
    def kept(self) -> bool:
        """The baseline stays: nothing was certified and chosen, or the test split reverted it."""
        return self.clause == KEPT

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bounds": list(self.bounds) if self.bounds is not None else None, "kept": self.kept}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SelectionRecord":
        bounds = data.get("bounds")
        return cls(winner=str(data["winner"]), baseline=str(data.get("baseline", "baseline")),
                   clause=data.get("clause"), reason=str(data.get("reason", "")), latency=data.get("latency", "cost"),
                   resolution=data.get("resolution"), bounds=tuple(bounds) if bounds is not None else None,
                   reverted_from=data.get("reverted_from"), chosen_clause=data.get("chosen_clause"),
                   gain=data.get("gain"))

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> "SelectionRecord":
        """The decision of an optimizer result (``OptimizationResult.to_json()``). A result
        stored before it carried ``selection`` gives its winner and reason, the clause only
        when the baseline was kept (the reason's text is never read for it)."""
        if result.get("selection"):
            return cls.from_dict(result["selection"])
        kept = bool(result["kept_baseline"])
        return cls(winner=str(result["winner_id"]), baseline="baseline", clause=KEPT if kept else None,
                   reason=str(result.get("reason", "")),
                   reverted_from=(result.get("verification") or {}).get("reverted_from"))

"""The search space and successive halving, independent of any engine.

A candidate is one instruction variant x one way of choosing examples x one count:

* ``fixed``: ``k`` train records chosen once by dev score, in the system part (cacheable);
* ``similar``: the ``k`` nearest train records of each request, in the user part (not cacheable);
* ``none``: no examples (``k`` = 0).

``successive_halving`` evaluates every candidate on the first rung's records, keeps the
best ``1/eta`` by a rank key, evaluates those on the next rung's records, and so on up
to the full dev split. Rungs are prefixes of the dev records, so every candidate that
reaches a rung has been scored on exactly the same records as the baseline there.

Example:
    >>> rung_sizes(8, 48, eta=3)
    [8, 24, 48]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from promptdistill.distill_search import rung_sizes
from promptdistill.engine.base import GenerationResult
from promptdistill.evaluate import EvalReport, mean_of

__all__ = ["OptCandidate", "rank_key", "rung_sizes", "successive_halving"]

STRATEGIES = ("baseline", "none", "fixed", "similar")


@dataclass(eq=False)
class OptCandidate:
    """One point of the search space and everything measured about it."""

    id: str
    variant: str
    """Instruction variant: 'original' or the distiller's candidate id."""
    strategy: str
    """'baseline', 'none', 'fixed' or 'similar'."""
    k: int
    spec: Any
    """The spec as evaluated and published (fixed: examples.ids set; similar: ``{fewshot}`` in the user part)."""
    examples: list[Mapping[str, Any]] = field(default_factory=list)
    """Fixed examples (system part); empty for 'none' and 'similar'."""
    subset: str = ""
    """How the fixed set was drawn ('balanced', 'random2', ...)."""
    prediction: dict[str, Any] = field(default_factory=dict)
    """``predict_candidate`` output: ttft_cold_ms, ttft_warm_ms, tokens, density."""
    report: EvalReport | None = None
    """Merged over every rung it was evaluated on (dev records, in order)."""
    results: list[GenerationResult] = field(default_factory=list)
    """The generation result of every evaluated dev record (tokens, finish reason)."""
    rung: int = -1
    lm_calls: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return 0 if self.report is None else self.report.n

    @property
    def mean(self) -> float | None:
        return None if self.report is None else self.report.mean

    @property
    def publishable(self) -> bool:
        return self.strategy != "similar"

    def ttft(self, kind: str) -> float:
        return float(self.prediction.get(f"ttft_{kind}_ms", math.nan))

    def add(self, report: EvalReport, results: Sequence[GenerationResult]) -> None:
        """Merge a report on the next dev records (they follow the ones already evaluated)."""
        self.report = report if self.report is None else self.report.merged(report)
        self.results = self.results + list(results)
        self.lm_calls += report.lm_calls


def rank_key(cand: OptCandidate, base_scores: Sequence[float | None], max_drop: float, *,
             ttft_kind: str = "warm", slo_ttft_ms: float | None = None, publishable_only: bool = True) -> tuple:
    """Sort key for promotion (ascending = better).

    Candidates that can still win come first: those within the SLO (and publishable,
    with ``publishable_only``), then by how far their mean falls short of
    ``baseline - max_drop`` on the same records, then by predicted TTFT, then by higher mean.
    """
    ttft = cand.ttft(ttft_kind)
    misses_slo = slo_ttft_ms is not None and not ttft <= slo_ttft_ms
    cannot_win = misses_slo or (publishable_only and not cand.publishable)
    if cand.mean is None:
        return (cannot_win, math.inf, ttft, 0.0, cand.id)
    base = mean_of(list(base_scores[: cand.n]))
    floor = (base if base is not None else 0.0) - max_drop
    shortfall = round(max(0.0, floor - cand.mean), 9)
    return (cannot_win, shortfall, ttft, -cand.mean, cand.id)


def successive_halving(
    candidates: Sequence[OptCandidate],
    records: Sequence[Mapping[str, Any]],
    sizes: Sequence[int],
    evaluate_fn: Callable[[OptCandidate, Sequence[Mapping[str, Any]]], None],
    key: Callable[[OptCandidate], tuple],
    *,
    eta: int = 3,
    affordable: Callable[[int, int], int] = lambda n_cands, n_records: n_cands,
) -> tuple[list[OptCandidate], str | None]:
    """Evaluate on growing prefixes of ``records``; keep the best ``1/eta`` after each rung.

    Args:
        candidates: the pool (none evaluated, or some already on a prefix of ``records``).
        records: the dev records, in the order rungs take them.
        sizes: records per rung (increasing; the last is the full dev split).
        evaluate_fn: ``evaluate_fn(candidate, new_records)`` scores the candidate on
            records that follow the ones it has and merges the report into it.
        key: promotion sort key (ascending = better), see ``rank_key``.
        eta: keep ``ceil(n / eta)`` after each rung.
        affordable: ``affordable(n_candidates, n_new_records)`` says how many candidates
            the budget can still evaluate on a rung; fewer than asked keeps the
            best-ranked, 0 stops the search.

    Returns:
        (the candidates alive after the last rung run, why it stopped early or None).
    """
    if eta < 2:
        raise ValueError(f"eta must be at least 2, got {eta}")
    alive = list(candidates)
    for rung, size in enumerate(sizes):
        if not alive:
            break
        todo = [c for c in alive if c.n < size]
        n_new = size - min((c.n for c in todo), default=size)
        can = affordable(len(todo), n_new) if todo else 0
        stop = None
        if todo and can < len(todo):
            if can <= 0:
                return alive, f"budget: rung {rung} ({size} records) could not start"
            todo = sorted(todo, key=key)[:can]
            keep = {id(c) for c in todo}
            alive = [c for c in alive if c.n >= size or id(c) in keep]
            stop = f"budget: rung {rung} ({size} records) ran only the best {can} of its candidates"
        for cand in todo:
            evaluate_fn(cand, records[cand.n : size])
        for cand in alive:
            cand.rung = rung
        if stop:
            return alive, stop
        if rung < len(sizes) - 1:
            alive = sorted(alive, key=key)[: max(1, math.ceil(len(alive) / eta))]
    return alive, None

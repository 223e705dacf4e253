"""Choosing the winner: the Pareto front, the explicit selection rule, the token budget.

All pure. The rule (``SelectionRule``), in words:

1. A candidate *qualifies* when it was evaluated on every dev record, can be published
   as a static template, is non-inferior to the baseline (the paired bootstrap lower
   bound of ``candidate - baseline`` is at least ``-slo.max_quality_drop``) and its
   predicted TTFT meets ``slo.ttft_ms``. The TTFT is the *expected* one by default:
   ``warm_share`` of the requests find the static prefix cached, the rest start cold.
   (Warm alone hides what a shorter prompt saves: with 128-token cache blocks a pruned
   instruction can leave a few more tokens uncached than the original.)
2. Among qualifying candidates (the baseline included: it is trivially non-inferior)
   the winner has the lowest predicted TTFT (``objective="min_ttft"``) or the highest
   ``quality - lam_per_ms * ttft_ms`` (``objective="quality_minus_lambda_ttft"``).
   Ties go to higher quality, then to the id.
3. When nothing qualifies, the baseline is kept and the reason says what failed.

Example:
    >>> token_budget([10, 12, 12, 14]).max_tokens  # p95 13.7, plus 15%: 15.76
    16
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

__all__ = ["Scored", "SelectionRule", "TokenBudget", "assess", "expected_ttft", "pareto_front", "pareto_mask", "select_winner", "token_budget", "unmeasured_quality"]

OBJECTIVES = ("min_ttft", "quality_minus_lambda_ttft")
TTFT_KINDS = ("expected", "warm", "cold")


@dataclass(frozen=True)
class SelectionRule:
    """How the winner is picked. Every field has a default; see the module docstring."""

    objective: str = "min_ttft"
    """'min_ttft' or 'quality_minus_lambda_ttft'."""
    lam_per_ms: float = 0.0
    """Quality points traded per millisecond (quality_minus_lambda_ttft only)."""
    ttft: str = "expected"
    """Which prediction the SLO and the objective use: 'expected' (the mix below), 'warm'
    (static prefix cached) or 'cold'."""
    warm_share: float = 0.8
    """Share of production requests whose static prefix is already in the prefix cache
    (the 'expected' TTFT is ``warm_share * warm + (1 - warm_share) * cold``)."""
    confidence: float = 0.9
    """One-sided level of the paired bootstrap lower bound (non-inferiority)."""
    n_boot: int = 2000
    allow_per_request_examples: bool = False
    """Let candidates with per-request (retrieved) examples win. Their template needs
    the caller to retrieve examples for every request, so by default they are shown
    (Pareto front, trade-off table) but not published."""
    verify_on_test: bool = True
    """Keep the baseline when the winner's mean on the test split falls more than the
    allowed drop below the baseline's."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}.")
        if self.ttft not in TTFT_KINDS:
            raise ValueError(f"ttft must be one of {TTFT_KINDS}, got {self.ttft!r}.")
        if not 0.0 <= self.warm_share <= 1.0:
            raise ValueError(f"warm_share must be in [0, 1], got {self.warm_share}.")
        if self.lam_per_ms < 0:
            raise ValueError(f"lam_per_ms must be at least 0, got {self.lam_per_ms}.")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Scored:
    """What the rule needs to know about one candidate."""

    id: str
    quality: float | None
    """Mean dev score."""
    diff_lower: float | None
    """Paired bootstrap lower bound of (candidate - baseline) on the same dev records."""
    ttft_cold_ms: float
    ttft_warm_ms: float
    complete: bool = True
    """Evaluated on every dev record."""
    publishable: bool = True
    """False for per-request example candidates (unless the rule allows them)."""

    def ttft(self, kind: str, warm_share: float) -> float:
        """The prediction of ``kind``; ``warm_share`` is the rule's (used for 'expected')."""
        if kind == "expected":
            return expected_ttft(self.ttft_cold_ms, self.ttft_warm_ms, warm_share)
        return self.ttft_warm_ms if kind == "warm" else self.ttft_cold_ms


def expected_ttft(cold_ms: float, warm_ms: float, warm_share: float) -> float:
    """Mean TTFT when ``warm_share`` of the requests find the static prefix cached.

    Example:
        >>> expected_ttft(600.0, 100.0, 0.75)
        225.0
    """
    return warm_share * warm_ms + (1.0 - warm_share) * cold_ms


def assess(cand: Scored, rule: SelectionRule, max_drop: float, slo_ttft_ms: float | None) -> tuple[bool, str]:
    """Does ``cand`` qualify, and why (or why not)? The reason is one short phrase."""
    if not cand.complete:
        return False, "not evaluated on every dev record (eliminated by successive halving)"
    if not cand.publishable and not rule.allow_per_request_examples:
        return False, "per-request examples: not publishable as a static template"
    if cand.quality is None or cand.diff_lower is None:
        return False, "no scored records"
    if cand.diff_lower < -max_drop - 1e-12:
        return False, f"inferior: paired lower bound {cand.diff_lower:+.3f} < -{max_drop:g}"
    ttft = cand.ttft(rule.ttft, rule.warm_share)
    if slo_ttft_ms is not None and ttft > slo_ttft_ms:
        return False, f"misses the SLO: predicted {rule.ttft} TTFT {ttft:.0f} ms > {slo_ttft_ms:g} ms"
    return True, "qualifies"


def _objective_key(cand: Scored, rule: SelectionRule) -> tuple:
    ttft = cand.ttft(rule.ttft, rule.warm_share)
    quality = cand.quality or 0.0
    if rule.objective == "min_ttft":
        return (ttft, -quality, cand.id)
    return (-(quality - rule.lam_per_ms * ttft), ttft, cand.id)


def unmeasured_quality(baseline_scores: Sequence[float | None]) -> str | None:
    """Why the metric cannot show a candidate non-inferior on these records, or None.

    When the baseline scores 0 on every dev record (or none could be scored), any
    candidate is trivially "no worse": the metric (often a judge too small for the
    task) measures nothing, so shorter prompts would win on TTFT alone.

    Example:
        >>> unmeasured_quality([0.0, 0.0, None])
        'the baseline scores 0 on every scored dev record (2 of 3): the metric does not measure quality here'
        >>> unmeasured_quality([0.0, 0.5]) is None
        True
    """
    scored = [s for s in baseline_scores if s is not None]
    if not scored:
        return "no dev record of the baseline could be scored: the metric does not measure quality here"
    if all(s == 0.0 for s in scored):
        return (f"the baseline scores 0 on every scored dev record ({len(scored)} of {len(baseline_scores)}): "
                "the metric does not measure quality here")
    return None


def select_winner(
    candidates: Sequence[Scored], baseline: Scored, rule: SelectionRule, *, max_drop: float, slo_ttft_ms: float | None,
    baseline_scores: Sequence[float | None] | None = None,
) -> tuple[Scored, str]:
    """Apply the rule. Returns (winner, reason); the winner is ``baseline`` when nothing qualifies.

    Args:
        candidates: every candidate (the baseline may be among them or not).
        baseline: the spec as written, evaluated on every dev record.
        rule: the selection rule.
        max_drop: the spec's allowed quality drop (``slo.max_quality_drop``).
        slo_ttft_ms: the spec's TTFT target; None: no target.
        baseline_scores: the baseline's per-record dev scores; when they show the metric
            measures nothing (``unmeasured_quality``), the baseline is kept.
    """
    unmeasured = unmeasured_quality(baseline_scores) if baseline_scores is not None else None
    if unmeasured:
        return baseline, f"{unmeasured}; keeping the baseline"
    pool = {c.id: c for c in candidates}
    pool.setdefault(baseline.id, baseline)
    verdicts = {cid: assess(c, rule, max_drop, slo_ttft_ms) for cid, c in pool.items()}
    qualifying = [c for cid, c in pool.items() if verdicts[cid][0]]
    kind = _kind_label(rule)
    what = f"lowest predicted {kind} TTFT" if rule.objective == "min_ttft" else (
        f"best quality - {rule.lam_per_ms:g} x {kind} TTFT (ms)")
    slo = "no TTFT SLO" if slo_ttft_ms is None else f"SLO {kind} TTFT <= {slo_ttft_ms:g} ms"
    if qualifying:
        winner = min(qualifying, key=lambda c: _objective_key(c, rule))
        if winner.id == baseline.id:
            return baseline, (f"the baseline has the {what} of the {len(qualifying)} qualifying candidate(s) "
                              f"(non-inferior at {rule.confidence:.0%}, drop <= {max_drop:g}, {slo}); keeping it")
        return winner, (f"{winner.id}: {what} ({winner.ttft(rule.ttft, rule.warm_share):.0f} ms vs baseline "
                        f"{baseline.ttft(rule.ttft, rule.warm_share):.0f} ms) among {len(qualifying)} qualifying candidate(s) "
                        f"(non-inferior at {rule.confidence:.0%}, drop <= {max_drop:g}, {slo})")
    return baseline, _no_winner_reason(pool, verdicts, baseline, rule, max_drop, slo_ttft_ms)


def _kind_label(rule: SelectionRule) -> str:
    return f"expected ({rule.warm_share:.0%} warm)" if rule.ttft == "expected" else rule.ttft


def _no_winner_reason(pool: dict[str, Scored], verdicts: dict[str, tuple[bool, str]], baseline: Scored,
                      rule: SelectionRule, max_drop: float, slo_ttft_ms: float | None) -> str:
    complete = [c for c in pool.values() if c.complete]
    noninferior = [c for c in complete if c.diff_lower is not None and c.diff_lower >= -max_drop - 1e-12
                   and (c.publishable or rule.allow_per_request_examples)]
    parts = [f"no candidate qualifies: {len(complete)} of {len(pool)} evaluated on every dev record, "
             f"{len(noninferior)} non-inferior (paired {rule.confidence:.0%} lower bound >= -{max_drop:g})"]
    if slo_ttft_ms is not None and noninferior:
        fastest = min(noninferior, key=lambda c: c.ttft(rule.ttft, rule.warm_share))
        parts.append(f"none of them meets the SLO {_kind_label(rule)} TTFT <= {slo_ttft_ms:g} ms "
                     f"(fastest: {fastest.id} at {fastest.ttft(rule.ttft, rule.warm_share):.0f} ms)")
    elif not noninferior:
        parts.append(f"the baseline itself: {verdicts[baseline.id][1]}")
    return "; ".join(parts) + "; keeping the baseline"


def pareto_mask(quality: Sequence[float], cost: Sequence[float]) -> np.ndarray:
    """True for points no other point dominates (cost <= and quality >=, one strictly).

    NaN points are never on the front.
    """
    q = np.asarray(quality, dtype=np.float64)
    c = np.asarray(cost, dtype=np.float64)
    ok = ~(np.isnan(q) | np.isnan(c))
    mask = np.zeros(len(q), dtype=bool)
    for i in np.flatnonzero(ok):
        dominated = ok & (c <= c[i]) & (q >= q[i]) & ((c < c[i]) | (q > q[i]))
        mask[i] = not dominated.any()
    return mask


def pareto_front(df: pd.DataFrame, *, quality: str = "quality", cost: str = "ttft_warm_ms") -> pd.DataFrame:
    """The rows of ``df`` on the quality-vs-cost Pareto front, sorted by cost (lowest first).

    Example:
        >>> df = pd.DataFrame({"quality": [0.5, 0.7, 0.6], "ttft_warm_ms": [100, 200, 300]})
        >>> pareto_front(df).index.tolist()
        [0, 1]
    """
    if df.empty:
        return df.copy()
    mask = pareto_mask(df[quality].astype(float).to_numpy(), df[cost].astype(float).to_numpy())
    return df.loc[mask].sort_values([cost, quality], ascending=[True, False])


@dataclass(frozen=True)
class TokenBudget:
    """``max_tokens`` for the published template and what it would have cut."""

    max_tokens: int
    p95_tokens: float
    truncation_rate: float
    """Share of dev replies longer than ``max_tokens`` (or already cut at the search limit)."""
    already_truncated_rate: float
    """Share of dev replies that hit the search's own limit (their true length is unknown)."""
    n: int
    quantile: float
    headroom: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def token_budget(
    completion_tokens: Sequence[int],
    *,
    truncated: Sequence[bool] | None = None,
    quantile: float = 0.95,
    headroom: float = 0.15,
) -> TokenBudget:
    """``max_tokens = ceil(p95(completion tokens) * (1 + headroom))``, at least 1.

    Args:
        completion_tokens: the winner's completion tokens per dev reply.
        truncated: per reply, whether it already stopped at the search's token limit
            (``finish_reason == "length"``); such a reply counts as truncated under any budget.
        quantile: the percentile (linear interpolation, numpy's default).
        headroom: the margin on top, 0.15 for 15%.

    Raises:
        ValueError: no replies, or a flag list of another length.
    """
    tokens = np.asarray(list(completion_tokens), dtype=np.float64)
    if tokens.size == 0:
        raise ValueError("token_budget needs at least one reply's completion tokens")
    cut = np.zeros(tokens.size, dtype=bool) if truncated is None else np.asarray(list(truncated), dtype=bool)
    if cut.size != tokens.size:
        raise ValueError(f"truncated has {cut.size} flags for {tokens.size} replies")
    p95 = float(np.percentile(tokens, 100.0 * quantile))
    # round() first: 20 * 1.15 is 22.999999999999996 in floating point, and must give 23.
    max_tokens = max(1, math.ceil(round(p95 * (1.0 + headroom), 9)))
    would_cut = (tokens > max_tokens) | cut
    return TokenBudget(
        max_tokens=max_tokens, p95_tokens=p95, truncation_rate=float(would_cut.mean()),
        already_truncated_rate=float(cut.mean()), n=int(tokens.size), quantile=quantile, headroom=headroom,
    )

"""The optimizer's selection rule: which TTFT counts, what resolves a difference, the token budget.

All pure. The rule (``SelectionRule``), in words:

1. A candidate can win only when the race certified it non-inferior to the baseline
   (:mod:`promptdistill.search.racing`: a drop of ``slo.max_quality_drop`` or more ruled
   out, error rate ``alpha`` over the finalists),
   it can be published as a static template, and its predicted TTFT meets ``slo.ttft_ms``.
2. Its cost is its predicted TTFT of the rule's kind: by default the *expected* TTFT,
   ``warm_share * warm + (1 - warm_share) * cold``, where ``warm_share`` is the share of
   requests that find the static prefix cached: measured from a vLLM server's prefix-cache
   hit rate when the engine is one, else assumed (0.8, and every report says so).
3. The rule of :func:`promptdistill.search.racing.select`, with the TTFT model's error at
   that point (its held-out mean absolute percentage error times the larger prediction)
   as the resolution: a certified candidate replaces the baseline when it is faster by
   more than the resolution; within it, only when its quality on the certify records is
   at least the baseline's (and the test split agrees, ``finish.py``). Among candidates
   within the resolution of each other, quality breaks a tie where the records show a
   clear difference, else fewer static prefix tokens do. The reason names the clause.

Example:
    >>> token_budget([10, 12, 12, 14]).max_tokens  # p95 13.7, plus 15%: 15.76
    16
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from promptdistill.core.settings import check, setting
from promptdistill.search.racing import RaceKnobs

__all__ = [
    "ASSUMED_WARM_SHARE",
    "SelectionRule",
    "TokenBudget",
    "expected_ttft",
    "pareto_mask",
    "token_budget",
    "unmeasured_quality",
]

TTFT_KINDS = ("expected", "warm", "cold")
ASSUMED_WARM_SHARE = 0.8
"""The warm share used when it cannot be measured (an in-process engine)."""


@dataclass(frozen=True)
class SelectionRule(RaceKnobs):
    """How the winner is picked: the race's knobs (:class:`RaceKnobs`: alpha, finalists,
    first look) and the optimizer's own. Every field has a default; see the module docstring."""

    ttft: str = setting("expected", "which TTFT prediction the SLO and the cost use: the mix of warm and cold "
                        "(expected), the static prefix cached (warm) or not (cold)", choices=TTFT_KINDS)
    warm_share: float | None = setting(None, "share of production requests whose static prefix is cached; unset: "
                                       "measured from the prefix-cache hit rate when the engine is a vLLM server, "
                                       f"else {ASSUMED_WARM_SHARE:g} (assumed)", at_least=0, at_most=1)
    # Their template needs the caller to retrieve examples for every request, so by default
    # they are shown (Pareto front, trade-off table) but not published.
    allow_per_request_examples: bool = setting(False, "let candidates with per-request (retrieved) examples win")
    verify_on_test: bool = setting(True, "keep the baseline when the winner's paired mean difference on the test "
                                   "split falls more than the allowed drop below the baseline's")

    def __post_init__(self) -> None:
        check(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def expected_ttft(cold_ms: float, warm_ms: float, warm_share: float) -> float:
    """Mean TTFT when ``warm_share`` of the requests find the static prefix cached.

    Example:
        >>> expected_ttft(600.0, 100.0, 0.75)
        225.0
    """
    return warm_share * warm_ms + (1.0 - warm_share) * cold_ms


def unmeasured_quality(baseline_scores: Sequence[float | None]) -> str | None:
    """Why the metric cannot show a candidate non-inferior on these records, or None.

    When the baseline scores 0 on every record (or none could be scored), any candidate
    is trivially "no worse": the metric (often a judge too small for the task) measures
    nothing, so shorter prompts would win on TTFT alone.

    Example:
        >>> unmeasured_quality([0.0, 0.0, None])
        'the baseline scores 0 on every scored screen record (2 of 3): the metric does not measure quality here'
        >>> unmeasured_quality([0.0, 0.5]) is None
        True
    """
    scored = [s for s in baseline_scores if s is not None]
    if not scored:
        return "no screen record of the baseline could be scored: the metric does not measure quality here"
    if all(s == 0.0 for s in scored):
        return (f"the baseline scores 0 on every scored screen record ({len(scored)} of {len(baseline_scores)}): "
                "the metric does not measure quality here")
    return None


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


@dataclass(frozen=True)
class TokenBudget:
    """``max_tokens`` for the published template and what it would have cut."""

    max_tokens: int
    p95_tokens: float
    truncation_rate: float
    """Share of replies longer than ``max_tokens`` (or already cut at the search limit)."""
    already_truncated_rate: float
    """Share of replies that hit the search's own limit (their true length is unknown)."""
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
        completion_tokens: the winner's completion tokens per reply.
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

"""What ours must reach against each peer, and the paired comparison it is judged on.

The goal is the benchmark's, and stricter than the product's own selection rule
(``promptdistill.optimize.select``): the product takes a candidate certified within
``max_quality_drop`` of the baseline and faster by *predicted expected* TTFT beyond the
TTFT model's resolution. Here every part must hold on its own: quality at least the peer's
(inside or above its 95% interval, no margin), strictly fewer prompt tokens, a strictly lower
*measured cold* TTFT (no resolution band), and at most a third of the peer's search tokens
computed. A run can meet the product's rule and miss this goal.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["GOAL_TOKENS_SHARE", "RATIO_FIELDS", "better_side", "compare_sides", "goal", "ours_beside"]

GOAL_TOKENS_SHARE = 1 / 3
"""Ours may compute at most this share of a peer's search tokens (``search_tokens``)."""
RATIO_FIELDS = ("lm_calls", "tokens_processed", "search_tokens", "computed_tokens", "minutes", "prompt_tokens",
                "instruction_tokens", "ttft_cold_ms",
                "ttft_warm_ms")
"""The figures reported as ours over the peer's."""


def better_side(peer: Mapping[str, Any]) -> str:
    """Which of a peer's two scores is higher: its exported ``template`` (``test_``) or its DSPy
    ``program`` (``program_test_``); a team may serve either, so ours is measured against the better."""
    template, program = peer.get("test_mean"), peer.get("program_test_mean")
    return "program" if program is not None and (template is None or program > template) else "template"


def goal(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """The goal against one peer (see the module docstring: stricter than the product's rule): quality
    at least the peer's template's and its program's (each, or inside its interval), a shorter
    prompt, a lower cold TTFT, and at most a third of the peer's search tokens computed
    (``search_tokens``: prefilled, not served by the prefix cache, + completion; the same count
    for every side)."""

    def known(*values: Any) -> bool:
        return all(v is not None for v in values)

    if peer.get("error"):  # a peer that failed part-way has no result to measure against
        return {"quality": None, "prompt_tokens": None, "ttft_cold": None, "computed_tokens": None, "met": False}

    # Inside or above the interval of each of the peer's template and program: the better one
    # by mean may have the wider interval, so both are checked.
    q = ours.get("test_mean")
    lows = [low for p in ("", "program_") if known(peer.get(f"{p}test_mean"), low := peer.get(f"{p}test_ci_low"))]
    checks = {
        "quality": all(q >= low for low in lows) if q is not None and lows else None,
        "prompt_tokens": ours["prompt_tokens"] < peer["prompt_tokens"] if known(ours.get("prompt_tokens"),
                                                                                peer.get("prompt_tokens")) else None,
        "ttft_cold": ours["ttft_cold_ms"] < peer["ttft_cold_ms"] if known(ours.get("ttft_cold_ms"),
                                                                          peer.get("ttft_cold_ms")) else None,
        "computed_tokens": ours["computed_tokens"] <= GOAL_TOKENS_SHARE * peer["computed_tokens"]
        if known(ours.get("computed_tokens"), peer.get("computed_tokens")) else None,
    }
    checks["met"] = all(v is True for v in checks.values())
    return checks


def compare_sides(ours: Mapping[str, Any], peer: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Ours against one peer: the ratios (``RATIO_FIELDS``), the paired quality differences on the
    test records (against the peer's template and its program, each with its 95% interval),
    which of the peer's two is better, and the goal. Both sides still hold their per-record
    ``scores`` (and the peer its ``program_scores``)."""
    from promptdistill.core.stats import bootstrap_ci, paired_diffs

    c: dict[str, Any] = {}
    for key in RATIO_FIELDS:
        a, b = ours.get(key), peer.get(key)
        c[f"{key}_ours_over_peer"] = round(a / b, 3) if a is not None and b else None
    if peer.get("scores") is not None:
        d = bootstrap_ci(paired_diffs(ours["scores"], peer["scores"]).tolist(), seed=seed)
        c.update(quality_diff=d.mean, quality_diff_ci_low=d.low, quality_diff_ci_high=d.high, quality_diff_n=d.n)
    if peer.get("program_scores") is not None:
        d = bootstrap_ci(paired_diffs(ours["scores"], peer["program_scores"]).tolist(), seed=seed)
        c.update(program_quality_diff=d.mean, program_quality_diff_ci_low=d.low,
                 program_quality_diff_ci_high=d.high, program_quality_diff_n=d.n)
    c["peer_better"] = better_side(peer)
    c["goal"] = goal(ours, peer)
    return c


def ours_beside(r: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Ours as measured in the run of peer ``kind`` (a peer joined from another run keeps that run's timings)."""
    return {**r["sides"]["ours"], **(r["sides"][kind].get("ours_in_run") or {})}

"""Calibrating a judge against a programmatic metric: how often do they agree?

On tasks with a programmatic metric the truth is known, so ``answer_equivalence`` can be
checked: for each record the judge compares the model's reply with the expected output
(reference), in both orders. The judge says the reply is *as good* when its verdict is
'better' or 'same'; the metric says so when the score is 1. The agreement rate is the
share of records where the two say the same thing.

A coin flip agrees half the time; a judge that always says "as good" agrees as often
as the metric passes. Both are reported beside the agreement rate, together with
Cohen's kappa (0: no better than chance given both sides' rates), so a judge that is
no better than chance is visible, not hidden.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from promptdistill.specs.render import render_text, value_text

__all__ = ["agreement_stats", "equivalence_agreement"]


def agreement_stats(judge: Sequence[bool], metric: Sequence[bool]) -> dict[str, Any]:
    """Agreement rate, majority-class rate, Cohen's kappa and the confusion counts."""
    n = len(judge)
    if n != len(metric):
        raise ValueError(f"judge has {n} verdicts, metric {len(metric)}")
    if n == 0:
        return {"n_valid": 0, "agreement_rate": None, "majority_rate": None, "kappa": None,
                "judge_as_good_rate": None, "metric_pass_rate": None, "confusion": {}}
    both = sum(j and m for j, m in zip(judge, metric))
    neither = sum((not j) and (not m) for j, m in zip(judge, metric))
    agree = (both + neither) / n
    pj, pm = sum(judge) / n, sum(metric) / n
    chance = pj * pm + (1 - pj) * (1 - pm)
    kappa = None if chance >= 1 else (agree - chance) / (1 - chance)
    return {
        "n_valid": n,
        "agreement_rate": agree,
        "majority_rate": max(pm, 1 - pm),
        "kappa": kappa,
        "judge_as_good_rate": pj,
        "metric_pass_rate": pm,
        "below_coin_flip": agree < 0.5,
        "confusion": {
            "judge_good_metric_pass": both,
            "judge_good_metric_fail": sum(j and not m for j, m in zip(judge, metric)),
            "judge_worse_metric_pass": sum((not j) and m for j, m in zip(judge, metric)),
            "judge_worse_metric_fail": neither,
        },
    }


def equivalence_agreement(
    runner: Any,
    spec: Any,
    records: Sequence[Mapping[str, Any]],
    replies: Sequence[str],
    scores: Sequence[float | None],
    *,
    pass_score: float = 1.0,
) -> dict[str, Any]:
    """Compare ``answer_equivalence`` (reply vs. expected output) with the metric's scores.

    Args:
        runner: A ``JudgeRunner``.
        spec: The spec the replies answer (its description is the judge's task).
        records: The records replied to (``inputs``, ``expected``).
        replies: The model's replies, one per record.
        scores: The metric's scores of those replies (None: not scored, left out).
        pass_score: A score at or above this counts as a pass for the metric.

    Returns:
        ``agreement_stats`` plus n, the judge's swap consistency on these records and
        the LM calls spent.
    """
    items = [
        (render_text(spec.user, r["inputs"]), value_text(r["expected"]), reply)
        for r, reply in zip(records, replies)
    ]
    before = runner.total_calls
    comparisons = runner.compare(spec.description, items)
    pairs = [(c.as_good, s >= pass_score - 1e-9) for c, s in zip(comparisons, scores) if c.as_good is not None and s is not None]
    consistent = [c.consistent for c in comparisons if c.consistent is not None]
    out = agreement_stats([j for j, _ in pairs], [m for _, m in pairs])
    out.update({
        "judge": "answer_equivalence",
        "n": len(items),
        "swap_consistency": sum(consistent) / len(consistent) if consistent else None,
        "lm_calls": runner.total_calls - before,
    })
    return out

"""The nightly's budgets: named presets of the TTFT profile's, the distiller's and the optimizer's sizes.

``promptdistill nightly --budget NAME`` and the deployments pick one; each maps onto the
stages' own configs (``ProfileConfig``, ``DistillConfig``, ``OptimizeBudget``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from promptdistill.core.settings import check, setting
from promptdistill.distill.loop import DistillConfig
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule
from promptdistill.pipeline.presets import BUDGET_PRESETS
from promptdistill.ttft.profile import ProfileConfig

__all__ = ["BUDGET_PRESETS", "TTFTBudget", "budget_preset", "expected_minutes", "seconds_per_lm_call", "stage_settings",
           "task_timeout_s", "ttft_expected_minutes"]


def _profile_knob(name: str) -> Any:
    """A ``ProfileConfig`` setting as a ``TTFTBudget`` field: its declaration (default, bounds, help) reused."""
    declared = {f.name: f for f in fields(ProfileConfig)}[name]
    return field(default=declared.default, metadata=declared.metadata)


@dataclass(frozen=True)
class TTFTBudget:
    """How much a TTFT refresh measures: the profiler's knobs, declared (with their defaults)
    on ``ProfileConfig``, and whether the fit keeps contended rows. The presets set their own
    values in ``budget_preset``."""

    points: int = _profile_knob("points")
    repeats: int = _profile_knob("repeats")
    spec_records: int = _profile_knob("spec_records")
    max_minutes: float = _profile_knob("max_minutes")
    density_probe_tokens: tuple[int, ...] = _profile_knob("density_probe_tokens")
    fewshot_probe: bool = _profile_knob("fewshot_probe")
    queue_batches: tuple[tuple[int, int], ...] = _profile_knob("queue_batches")
    matmul_probe: bool = _profile_knob("matmul_probe")
    keep_contended: bool = setting(False, "fit on rows measured while other work took the CPU too (by default they "
                                   "are left out while 10 quiet prompts remain; keep them on a machine that is "
                                   "never idle)")

    def __post_init__(self) -> None:
        check(self)

    def profile_config(self, *, prompts_dir: str | Path = "prompts", seed: int = 0) -> ProfileConfig:
        """The profiler's ``ProfileConfig`` for this budget."""
        knobs = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "keep_contended"}
        return ProfileConfig(**knobs, prompts_dir=str(prompts_dir), seed=seed).validate()


def ttft_expected_minutes(budget: TTFTBudget, specs: int) -> float:
    """A TTFT refresh's expected length on an idle 2-core CPU, for the progress display only:
    its planned measurements (half the sweep and spec points also warm; the design's five
    ladder sizes and four densities per probe size) at about a second each (the default design
    measured 301 rows in 360 s), at most the safety stop."""
    per_round = (1.5 * budget.points + 4 * len(budget.density_probe_tokens) + 4 * budget.fewshot_probe
                 + 1.5 * 2 * specs * budget.spec_records + 5 + sum(n for n, _ in budget.queue_batches))
    return min(budget.max_minutes, budget.repeats * per_round / 60.0)


def seconds_per_lm_call(max_tokens: int | None) -> float:
    """The embedded model's pace per LM call on a 2-core CPU, batched, by the spec's reply
    budget (``output.max_tokens``; None: 256): 0.03 s + 1.6 ms per token, the least-squares
    line through the five bundled specs' optimize stages in ``make run`` at 0101013 (measured:
    0.07 s a call at 40 tokens, 0.08 at 16, 0.24 at 128, 0.53 at 320). Only for the progress
    display, never for a decision."""
    return 0.03 + 0.0016 * (256 if max_tokens is None else max_tokens)


SPENT_SHARE = {"distill": 0.5, "optimize": 0.3}
"""The share of its LM-call budget a stage typically spends (races stop early): in ``make run``
at 0101013 the distiller spent 103-188 of its 300 calls, the optimizer 848-1,480 of 4,000."""


def expected_minutes(stage: str, max_lm_calls: int, cap_minutes: float, max_tokens: int | None) -> float:
    """A stage's expected length on one spec, for the progress display: the calls it typically
    spends at the spec's pace, at most its cap. The display corrects it by the finished steps."""
    return min(cap_minutes, SPENT_SHARE[stage] * max_lm_calls * seconds_per_lm_call(max_tokens) / 60.0)


def task_timeout_s(*max_minutes: float) -> float:
    """The safety net on one spec's task: its stages' own time limits three times over,
    plus 20 minutes for verification and start-up. The stages stop themselves well before."""
    return sum(max_minutes) * 60.0 * 3 + 1200.0




def budget_preset(name: str) -> dict[str, Any]:
    """The stages' settings of a preset: ``ttft_budget``, ``distill``, ``budget`` and ``selection``.

    In every preset the distiller only proposes (``race=False``): the optimizer races its
    finalists against the baseline once, on the certify records, so one race's error
    rate covers the night (docs/decisions.md). The optimizer's race is sized in records
    (``dev_size``: what ``promptdistill plan`` asks for a 0.05 margin) and LM calls; its
    minutes are a safety cap, so a slower machine reaches the same decision later.

    Raises:
        ValueError: an unknown preset name.
    """
    if name == "full":
        return {"ttft_budget": TTFTBudget(points=24, repeats=2, matmul_probe=False),
                "distill": DistillConfig(race=False), "budget": OptimizeBudget(),
                "selection": SelectionRule()}
    if name == "quick":
        return {
            # No queue probe: its 30 requests took 100 of a 241-second profile, and no decision
            # prices a queue (held-out error without them 3.8-3.9% against 2.9-5.1% with them).
            # The profile is sized in measurements (about 2 minutes on an idle machine); its
            # minutes are a safety stop, so a busy machine measures the same design, later.
            "ttft_budget": TTFTBudget(points=24, repeats=2, max_minutes=20.0, queue_batches=(), matmul_probe=False),
            "distill": DistillConfig(screen_size=16, dev_size=1000, test_size=0, max_rounds=1, max_lm_calls=300,
                                     max_minutes=10.0, thresholds=(0.5,), target_ratios=(0.5,), calibrate=False,
                                     finalists=1, race=False),
            # Per-request (similar) examples are left out: they are not publishable as a static
            # template, and screening them would only draw the trade-off table. So is the output
            # format table: constrained decoding is published unless it gives less valid JSON.
            "budget": OptimizeBudget(max_lm_calls=4000, max_minutes=30.0, screen_size=16, dev_size=1000,
                                     test_size=200, fewshot_counts=(0, 2, 4), similar_counts=(), fixed_subsets=1,
                                     max_variants=3, feature_records=3, timing_records=2, formats=False),
            # One finalist, with all of alpha. A fallback (raced only when the first fails) costs
            # the first its half of alpha whether or not it is raced: in four make runs (20
            # spec-nights) one was admitted 8 times, raced 3 times (format_rules, stopped for
            # futility at 400 records like its first, 316-416 LM calls each) and won none, and
            # summarize's first finalist at alpha 0.05 needed 400 records instead of 350. The
            # full preset (the deployment's) keeps fallbacks where its budget has room.
            "selection": SelectionRule(finalists=1),
        }
    if name == "smoke":
        return {
            "ttft_budget": TTFTBudget(points=8, repeats=1, spec_records=1, max_minutes=10.0, density_probe_tokens=(),
                                      fewshot_probe=False, matmul_probe=False),
            "distill": DistillConfig(screen_size=4, dev_size=12, test_size=0, max_rounds=1, max_lm_calls=60,
                                     max_minutes=5.0, thresholds=(0.5,), target_ratios=(0.5,), calibrate=False,
                                     judge_examples=1, finalists=1, race=False),
            "budget": OptimizeBudget(max_lm_calls=150, max_minutes=5.0, screen_size=4, dev_size=12, test_size=6,
                                     fewshot_counts=(0, 2), similar_counts=(), fixed_subsets=1, max_variants=2,
                                     feature_records=2, timing_records=1, formats=False, format_size=4),
            "selection": SelectionRule(finalists=1, first_look=8),
        }
    raise ValueError(f"unknown budget preset {name!r}; known: {', '.join(BUDGET_PRESETS)}")


def stage_settings(preset: str, *, ttft_budget: TTFTBudget | None = None, distill: DistillConfig | None = None,
                   budget: OptimizeBudget | None = None, selection: SelectionRule | None = None,
                   distill_instructions: bool = True) -> dict[str, Any]:
    """The one place a night's stage settings come from: the named preset, with any setting
    given explicitly in its place (the deployments, ``make run``, ``promptdistill nightly``
    and the benchmarks all call this).

    Args:
        preset: ``smoke``, ``quick`` or ``full``.
        distill_instructions: False optimizes the instruction as written (``distill`` is None).
    """
    out = budget_preset(preset)
    given = {"ttft_budget": ttft_budget, "distill": distill, "budget": budget, "selection": selection}
    out.update({k: v for k, v in given.items() if v is not None})
    if not distill_instructions:
        out["distill"] = None
    return out

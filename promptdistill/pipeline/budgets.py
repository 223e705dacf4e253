"""The nightly's budgets: named presets of the TTFT profile's, the distiller's and the optimizer's sizes.

``promptdistill nightly --budget NAME`` and the deployments pick one; each maps onto the
stages' own configs (``ProfileConfig``, ``DistillConfig``, ``OptimizeBudget``,
``SelectionRule``). The presets are data, one table (:mod:`promptdistill.pipeline.presets`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from promptdistill.core.settings import check, setting
from promptdistill.distill.loop import DistillConfig
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule
from promptdistill.pipeline.presets import BUDGET_PRESETS, PRESETS
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
    budget (``output.max_tokens``; None: 256): the least-squares line through the five bundled
    specs' optimize stages in one ``make run`` (the figures: docs/bench/make_run.md). Only for
    the progress display, never for a decision."""
    return 0.03 + 0.0016 * (256 if max_tokens is None else max_tokens)


SPENT_SHARE = {"distill": 0.5, "optimize": 0.3}
"""The share of its LM-call budget a stage typically spends (races stop early), for the
progress display; what one ``make run`` spent: docs/bench/make_run.md."""


def expected_minutes(stage: str, max_lm_calls: int, cap_minutes: float, max_tokens: int | None) -> float:
    """A stage's expected length on one spec, for the progress display: the calls it typically
    spends at the spec's pace, at most its cap. The display corrects it by the finished steps."""
    return min(cap_minutes, SPENT_SHARE[stage] * max_lm_calls * seconds_per_lm_call(max_tokens) / 60.0)


def task_timeout_s(*max_minutes: float) -> float:
    """The safety net on one spec's task: its stages' own time limits three times over,
    plus 20 minutes for verification and start-up. The stages stop themselves well before."""
    return sum(max_minutes) * 60.0 * 3 + 1200.0




def budget_preset(name: str) -> dict[str, Any]:
    """The stages' settings of a preset: ``ttft_budget``, ``distill``, ``budget`` and ``selection``,
    built from its row of the table (:data:`promptdistill.pipeline.presets.PRESETS`).

    Raises:
        ValueError: an unknown preset name.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown budget preset {name!r}; known: {', '.join(BUDGET_PRESETS)}")
    row = PRESETS[name]
    return {"ttft_budget": TTFTBudget(**row["ttft_budget"]), "distill": DistillConfig(**row["distill"]),
            "budget": OptimizeBudget(**row["budget"]), "selection": SelectionRule(**row["selection"])}


def stage_settings(preset: str, *, ttft_budget: TTFTBudget | None = None, distill: DistillConfig | None = None,
                   budget: OptimizeBudget | None = None, selection: SelectionRule | None = None,
                   distill_instructions: bool = True) -> dict[str, Any]:
    """The one place a night's stage settings come from: the named preset, with any setting
    given explicitly in its place (the deployments, ``make run``, ``promptdistill nightly``
    and the benchmarks all call this).

    Args:
        preset: a name of :data:`~promptdistill.pipeline.presets.PRESETS` (``smoke``, ``quick``, ``full``).
        distill_instructions: False optimizes the instruction as written (``distill`` is None).
    """
    out = budget_preset(preset)
    given = {"ttft_budget": ttft_budget, "distill": distill, "budget": budget, "selection": selection}
    out.update({k: v for k, v in given.items() if v is not None})
    if not distill_instructions:
        out["distill"] = None
    return out

"""The ``optimize-prompt`` flow: one spec, published as a new version labelled ``candidate``.

``production`` moves to it only when the run's gate passed and ``allow_promotion`` is
true (off by default for ad hoc runs). Uses the TTFT model for the current engine;
fits one first when there is none.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from promptdistill.distill.loop import DistillConfig
from promptdistill.flows.tasks import ensure_ttft_model, run_spec, spec_arguments, start_run
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule
from promptdistill.pipeline.budgets import TTFTBudget, stage_settings
from promptdistill.pipeline.presets import DEFAULT_PRESET
from promptdistill.pipeline.jobs import SpecsFailedError, select_spec_files
from promptdistill.pipeline.report import format_summary_table
from promptdistill.pipeline.session import engine_session


@flow(name="optimize-prompt")
def optimize_prompt(
    spec: str,
    preset: str = DEFAULT_PRESET,
    budget: OptimizeBudget | None = None,
    selection: SelectionRule | None = None,
    distill: DistillConfig | None = None,
    allow_promotion: bool = False,
    seed: int = 0,
    prompts_dir: str = "prompts",
    ttft_budget: TTFTBudget | None = None,
    distill_instructions: bool = True,
) -> Any:
    """Optimize one spec and publish the result.

    Args:
        spec: the spec's name (its file stem in ``prompts_dir``).
        preset: the stages' settings (``pipeline.budgets.stage_settings``), as the nightly's;
            each setting below replaces the preset's when given.
        budget: the optimization budget (part of the cache key).
        selection: how the optimizer picks the winner (part of the cache key).
        distill: the distiller's settings.
        allow_promotion: move ``production`` to the result when its gate passed.
        seed: the optimizer's seed (part of the cache key).
        prompts_dir: where the specs live.
        ttft_budget: how much to measure if this engine has no TTFT model yet.
        distill_instructions: False: no distilled instruction variants.

    Returns:
        The spec's summary row; the run is Failed when the spec failed.
    """
    settings, run_id = start_run()
    stages = stage_settings(preset, budget=budget, selection=selection, distill=distill, ttft_budget=ttft_budget,
                            distill_instructions=distill_instructions)
    (path,) = select_spec_files(prompts_dir, [spec])
    with engine_session(settings.engine) as engine:
        ttft = ensure_ttft_model(settings.engine, engine, registry_root=settings.registry, max_age_hours=None,
                                 budget=stages["ttft_budget"], prompts_dir=prompts_dir, seed=seed, run_id=run_id)
        row = run_spec(str(path), **spec_arguments(settings, engine, stages, ttft, seed=seed,
                                                   allow_promotion=allow_promotion, run_id=run_id))
    get_run_logger().info("summary:\n%s", format_summary_table([row]))
    if row["status"] == "failed":
        raise SpecsFailedError(f"{spec}: {row['error']}", {"run_id": run_id, "rows": [row], "ttft": ttft, "failed": [spec]})
    return row


if __name__ == "__main__":
    import sys

    optimize_prompt(sys.argv[1])

"""The ``profile-ttft`` flow: measure TTFT on the configured engine, fit the model, publish it.

Run it ad hoc (``prefect deployment run 'profile-ttft/profile-ttft'``) after changing the
engine (model, dtype, hardware); the nightly flow calls the same tasks when the model for
the current engine is missing or too old.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from promptdistill.flows.tasks import fit_and_publish_ttft, measure_ttft, start_run, state_dir
from promptdistill.pipeline.budgets import TTFTBudget
from promptdistill.pipeline.session import engine_session


@flow(name="profile-ttft")
def profile_ttft(budget: TTFTBudget = TTFTBudget(), prompts_dir: str = "prompts", seed: int = 0) -> dict[str, Any]:
    """Profile the engine, fit and select the TTFT model, publish it to the registry.

    Args:
        budget: how much to measure (sweep points, repeats, minutes).
        prompts_dir: the specs whose prompts and datasets the profile is built from.
        seed: the design's and the model selection's seed.

    Returns:
        The published model: engine key, registry version, chosen estimator, held-out scores.
    """
    settings, run_id = start_run()
    with engine_session(settings.engine):
        measurements = measure_ttft(settings.engine, budget, prompts_dir, seed, str(state_dir() / "ttft" / "measurements"))
    return fit_and_publish_ttft(measurements, settings.registry, run_id, seed, str(state_dir() / "ttft" / "reports"),
                                budget.keep_contended)


if __name__ == "__main__":
    profile_ttft()

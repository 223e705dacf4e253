"""``optimize(engine, spec, ...)``: the optimizer's steps in order (see ``run.py`` and ``finish.py``)."""

from __future__ import annotations

from typing import Any

from promptdistill.engine.base import Engine
from promptdistill.optimize.finish import finish
from promptdistill.optimize.result import OptimizationResult
from promptdistill.optimize.run import OptimizeBudget, OptimizeRun
from promptdistill.optimize.select import SelectionRule
from promptdistill.specs.model import Spec

__all__ = ["optimize"]


def optimize(
    engine: Engine,
    spec: Spec,
    *,
    ttft_model: Any,
    budget: OptimizeBudget = OptimizeBudget(),
    seed: int = 0,
    distill_candidates: Any = None,
    selection: SelectionRule = SelectionRule(),
    timing_engine: Engine | None = None,
    judge_engine: Engine | None = None,
    load_pricing: Any = None,
) -> OptimizationResult:
    """Tune few-shot examples and instruction density of ``spec``; verify the winner on test.

    Args:
        engine: the target model, ideally a ``CachedEngine`` (re-runs are then free).
        spec: the spec as written: the baseline. It is not changed.
        ttft_model: a fitted ``TTFTModel`` for this engine (``ModelIdentityError`` otherwise).
        budget: sizes and limits.
        seed: shuffles dev/test, draws example sets, seeds every request.
        distill_candidates: instruction variants: a ``DistillResult``, specs, (id, spec) pairs, or None.
        selection: the rule that picks the winner.
        timing_engine: where TTFT is measured (default: the engine behind a cache).
        judge_engine: where judge calls go (default: ``engine``).
        load_pricing: a ``LoadPricing`` for a spec that declares ``slo.load``: its predicted
            percentile at that load is then the cost (required for such a spec).

    Returns:
        An ``OptimizationResult`` with the publishable template, the figures, the Pareto
        table and the candidate log.
    """
    run = OptimizeRun(engine, spec, ttft_model, budget, seed, selection, distill_candidates, timing_engine, judge_engine,
                      load_pricing)
    run.evaluate_baseline()
    fixed = run.choose_fixed_sets()
    run.grid = run.build_grid(fixed)
    run.search()
    return finish(run)

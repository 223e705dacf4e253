"""The optimizer: tune few-shot examples and instruction density against quality and TTFT.

``optimize(engine, spec, ttft_model=...)`` searches instruction variants (the original
and the distiller's), fixed and per-request few-shot examples, predicts each
candidate's TTFT cold and warm, bounds the LM calls with successive halving, picks the
winner by an explicit rule (``SelectionRule``), sets ``max_tokens`` and the output
format, verifies on the held-out test split and returns an ``OptimizationResult``
ready to publish.

Modules: ``stats`` (bootstrap), ``select`` (Pareto front, rule, token budget),
``search`` (candidates, successive halving), ``examples`` (fixed and per-request
examples), ``predict`` (TTFT predictions), ``variants``, ``run`` (the run), ``verify``,
``finish``, ``result``, ``plot``.
"""

from promptdistill.optimize.examples import SimilarExamples, fixed_subsets, per_request_spec
from promptdistill.optimize.finish import cache_tradeoff, density_curve
from promptdistill.optimize.predict import prefix_block_tokens, warm_cached_tokens
from promptdistill.optimize.result import OptimizationResult
from promptdistill.optimize.run import OptimizeBudget, optimize
from promptdistill.optimize.search import OptCandidate, successive_halving
from promptdistill.optimize.select import (
    Scored,
    SelectionRule,
    TokenBudget,
    assess,
    pareto_front,
    pareto_mask,
    select_winner,
    token_budget,
)
from promptdistill.optimize.stats import MeanCI, bootstrap_ci, paired_bootstrap_lower_bound
from promptdistill.optimize.variants import instruction_variants, variants_from_parquet

__all__ = [
    "MeanCI",
    "OptCandidate",
    "OptimizationResult",
    "OptimizeBudget",
    "Scored",
    "SelectionRule",
    "SimilarExamples",
    "TokenBudget",
    "assess",
    "bootstrap_ci",
    "cache_tradeoff",
    "density_curve",
    "fixed_subsets",
    "instruction_variants",
    "optimize",
    "paired_bootstrap_lower_bound",
    "pareto_front",
    "pareto_mask",
    "per_request_spec",
    "prefix_block_tokens",
    "select_winner",
    "successive_halving",
    "token_budget",
    "variants_from_parquet",
    "warm_cached_tokens",
]

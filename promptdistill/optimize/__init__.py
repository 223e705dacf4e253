"""The optimizer: tune few-shot examples and instruction density against quality and TTFT.

``optimize(engine, spec, ttft_model=...)`` searches instruction variants (the original
and the distiller's finalists) x fixed and per-request few-shot examples, predicts each
candidate's TTFT cold and warm, screens and races them against the baseline with the
shared search kernel (:mod:`promptdistill.search`), picks the winner by an explicit rule
(``SelectionRule``), sets ``max_tokens`` and the output format, verifies on the held-out
test split and returns an ``OptimizationResult`` ready to publish.

Modules: ``candidates``, ``examples`` (fixed and per-request examples), ``variants``,
``predict`` (TTFT predictions), ``select`` (the rule, Pareto front, token budget), ``run``
(the run's state and search steps), ``finish`` (selection, verification, the result),
``verify``, ``result``, ``plot``, ``optimizer`` (``optimize`` itself).
"""

from promptdistill.optimize.candidates import ExampleCandidate
from promptdistill.optimize.examples import SimilarExamples, fixed_subsets, per_request_spec
from promptdistill.optimize.optimizer import optimize
from promptdistill.optimize.predict import prefix_block_tokens, warm_cached_tokens
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule, expected_ttft, pareto_mask, token_budget
from promptdistill.optimize.variants import instruction_variants, variants_from_parquet

__all__ = [
    "ExampleCandidate",
    "OptimizeBudget",
    "SelectionRule",
    "SimilarExamples",
    "expected_ttft",
    "fixed_subsets",
    "instruction_variants",
    "optimize",
    "pareto_mask",
    "per_request_spec",
    "prefix_block_tokens",
    "token_budget",
    "variants_from_parquet",
    "warm_cached_tokens",
]

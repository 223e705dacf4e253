"""The nightly's budget presets, as one data table: each preset's purpose and every stage
setting it changes from the settings classes' declared defaults.

No imports: the CLI's ``--help`` lists the presets without loading the pipeline.
:func:`promptdistill.pipeline.budgets.budget_preset` builds the stages' settings from a row
(``TTFTBudget``, ``DistillConfig``, ``OptimizeBudget``, ``SelectionRule``).

In every preset the distiller only proposes (``race: False``): the optimizer races its
finalists against the baseline once, on the certify records, so one race's error rate
covers the night (docs/decisions.md). The optimizer's race is sized in records
(``dev_size``: what ``promptdistill plan`` asks for a 0.05 margin) and LM calls; its minutes
are a safety cap, so a slower machine reaches the same decision later.
"""

__all__ = ["BUDGET_PRESETS", "DEFAULT_PRESET", "LOCAL_PRESET", "PRESETS"]

PRESETS = {
    "smoke": {
        "about": "a few minutes for one small spec: plumbing checks and tests, figures not meaningful",
        "ttft_budget": {"points": 8, "repeats": 1, "spec_records": 1, "max_minutes": 10.0,
                        "density_probe_tokens": (), "fewshot_probe": False, "matmul_probe": False},
        "distill": {"screen_size": 4, "dev_size": 12, "test_size": 0, "max_rounds": 1, "max_lm_calls": 60,
                    "max_minutes": 5.0, "thresholds": (0.5,), "target_ratios": (0.5,), "calibrate": False,
                    "judge_examples": 1, "finalists": 1, "race": False},
        "budget": {"max_lm_calls": 150, "max_minutes": 5.0, "screen_size": 4, "dev_size": 12, "test_size": 6,
                   "fewshot_counts": (0, 2), "similar_counts": (), "fixed_subsets": 1, "max_variants": 2,
                   "feature_records": 2, "timing_records": 1, "formats": False, "format_size": 4},
        "selection": {"finalists": 1, "first_look": 8},
    },
    "quick": {
        "about": "about 26 minutes for the 5 bundled specs on a 2-core CPU at the first run (`make run`; later "
                 "nights reuse cached LM calls)",
        # No queue probe: its 30 requests took 100 of a 241-second profile, and the solo model
        # prices no queue (load is the load TTFT model's: promptdistill.load). The profile is
        # sized in measurements; its minutes are a safety stop, so a busy machine measures the
        # same design, later.
        "ttft_budget": {"points": 24, "repeats": 2, "max_minutes": 20.0, "queue_batches": (), "matmul_probe": False},
        "distill": {"screen_size": 16, "dev_size": 1000, "test_size": 0, "max_rounds": 1, "max_lm_calls": 300,
                    "max_minutes": 10.0, "thresholds": (0.5,), "target_ratios": (0.5,), "calibrate": False,
                    "finalists": 1, "race": False},
        # Per-request (similar) examples are left out: they are not publishable as a static
        # template, and screening them would only draw the trade-off table. So is the output
        # format table: constrained decoding is published unless it gives less valid JSON.
        "budget": {"max_lm_calls": 4000, "max_minutes": 30.0, "screen_size": 16, "dev_size": 1000, "test_size": 200,
                   "fewshot_counts": (0, 2, 4), "similar_counts": (), "fixed_subsets": 1, "max_variants": 3,
                   "feature_records": 3, "timing_records": 2, "formats": False},
        # One finalist, with all of alpha. A fallback (raced only when the first fails) costs
        # the first its half of alpha whether or not it is raced: in four make runs (20
        # spec-nights) one was admitted 8 times, raced 3 times (format_rules, stopped for
        # futility at 400 records like its first, 316-416 LM calls each) and won none, and
        # summarize's first finalist at alpha 0.05 needed 400 records instead of 350. The
        # full preset (the deployment's) keeps fallbacks where its budget has room.
        "selection": {"finalists": 1},
    },
    "full": {
        "about": "the library defaults (what the deployments use): an hour or more per spec on a CPU",
        "ttft_budget": {"points": 24, "repeats": 2, "matmul_probe": False},
        "distill": {"race": False},
        "budget": {},
        "selection": {},
    },
}
"""Per preset: ``about`` (what it is for) and, per stage, the settings that differ from the
declared defaults (``ttft_budget``: ``TTFTBudget``; ``distill``: ``DistillConfig``;
``budget``: ``OptimizeBudget``; ``selection``: ``SelectionRule``)."""

BUDGET_PRESETS = {name: row["about"] for name, row in PRESETS.items()}
"""Named budgets of the nightly flow's parameters (``promptdistill nightly --budget NAME``)."""

DEFAULT_PRESET = "full"
"""The preset of the flows (the deployments) and ``promptdistill plan``: the library defaults."""

LOCAL_PRESET = "quick"
"""The preset of runs on the machine at hand, where ``full`` takes an hour or more per spec on
a CPU: ``promptdistill nightly``'s default (``make run`` runs it) and ``bench_optimize``'s,
which measures what ``make run`` does (``bench_distill`` takes ``DEFAULT_PRESET``: the quick
preset's distiller has no test split to report)."""

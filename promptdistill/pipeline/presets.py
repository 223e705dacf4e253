"""The names of the nightly's budget presets and what each is for (no imports: the CLI's
``--help`` lists them without loading the pipeline)."""

__all__ = ["BUDGET_PRESETS"]

BUDGET_PRESETS = {
    "smoke": "a few minutes for one small spec: plumbing checks and tests, figures not meaningful",
    "quick": "about 26 minutes for the 5 bundled specs on a 2-core CPU at the first run (`make run`; later nights reuse cached LM calls)",
    "full": "the library defaults (what the deployments use): an hour or more per spec on a CPU",
}
"""Named budgets of the nightly flow's parameters (``promptdistill nightly --budget NAME``)."""

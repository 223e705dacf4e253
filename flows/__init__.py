"""Prefect flows around promptdistill: thin orchestration over library calls.

* ``profile-ttft`` (:mod:`flows.profile_ttft`): measure TTFT, fit the model, publish it;
* ``optimize-prompt`` (:mod:`flows.optimize_prompt`): one spec, published as a candidate;
* ``nightly`` (:mod:`flows.nightly`): refresh the TTFT model when stale, optimize every
  spec, publish, report.

Deployments are declared in ``prefect.yaml`` at the repository root. The rules the flows
follow (staleness, cache keys, promotion, summaries) live in :mod:`promptdistill.pipeline`
and :mod:`promptdistill.pipeline_report`, testable without Prefect.
"""

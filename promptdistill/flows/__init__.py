"""Prefect flows around promptdistill: thin orchestration over :mod:`promptdistill.pipeline`.

* ``profile-ttft`` (:mod:`~promptdistill.flows.profile_ttft`): measure TTFT, fit the model, publish it;
* ``optimize-prompt`` (:mod:`~promptdistill.flows.optimize_prompt`): one spec, published as a candidate;
* ``nightly`` (:mod:`~promptdistill.flows.nightly`): refresh the TTFT model when stale,
  optimize every spec, publish, report.

They ship with the package, so a project that installed promptdistill deploys them from
its own folder (``prefect.yaml`` entrypoints point here). The rules the flows follow
(staleness, cache keys, promotion, summaries) live in :mod:`promptdistill.pipeline`,
testable without Prefect.
"""

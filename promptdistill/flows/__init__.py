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

import inspect

__all__ = ["drain_prefect"]


def drain_prefect() -> None:
    """Send Prefect's queued logs and events now, while the API server still runs (as
    ``prefect_test_harness`` does): a process that stops its own server first would retry
    the stopped server at exit for minutes."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        for result in (APILogWorker.instance().drain(), EventsWorker.drain_all()):
            if inspect.isawaitable(result):
                await result

    run_coro_as_sync(drain())

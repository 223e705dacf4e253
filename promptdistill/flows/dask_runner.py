"""The Dask task runner the nightly uses to run specs on several worker processes or machines.

``prefect-dask`` is an extra (``pip install 'promptdistill[dask]'``): it is imported here
only when a flow asks for Dask. Each Dask worker is its own process: it opens its own
client to the vLLM servers (``pipeline.session.shared_engine``) and takes a slot of the
engine's global concurrency limit (one per endpoint) for every engine-bound task, so
however many workers there are, each endpoint serves one spec at a time. A worker that
dies mid-spec is replaced by its nanny and Dask runs the spec again elsewhere: finished
stages come back from Prefect's result cache, finished LM requests from the LM cache, and
publishing is idempotent on the work key, so nothing is published twice or half-way.

Dask ships task arguments between processes with its own serialization; our arguments are
frozen dataclasses and plain JSON-like values, and nothing is persisted that way.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LOCAL", "dask_task_runner"]

LOCAL = "local"
"""``dask="local"``: a Dask cluster of worker processes on this machine, started for the run."""


def dask_task_runner(address: str, n_workers: int) -> Any:
    """A ``DaskTaskRunner`` on the scheduler at ``address`` (``tcp://host:8786``), or on a
    local cluster of ``n_workers`` single-threaded worker processes when ``address`` is
    ``"local"``."""
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:  # an extra: say which
        raise ImportError("dask=... needs prefect-dask: pip install 'promptdistill[dask]'") from None
    # The scheduler and client live in the flow's process: their INFO lines (workers
    # registering, connections opening) are Dask's bookkeeping, not the night's news.
    logging.getLogger("distributed").setLevel(max(logging.WARNING, logging.getLogger("distributed").level))
    if address != LOCAL:
        return DaskTaskRunner(address=address)
    # One thread per worker: a spec's stages are sequential, and the engine clients are
    # per process. The workers' INFO lines stay out of the terminal too; warnings and
    # errors still show.
    return DaskTaskRunner(cluster_kwargs={"n_workers": max(1, n_workers), "threads_per_worker": 1, "processes": True,
                                          "dashboard_address": None, "silence_logs": logging.WARNING})

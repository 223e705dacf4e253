"""A run's progress as explicit events: each step says when it starts and how it ends.

The flows' tasks call :func:`emit` at the start and end of each step of a run (the TTFT
model, ``distill`` and ``optimize`` per spec, the report); the terminal's progress
display (:class:`~promptdistill.pipeline.console.RunProgress`) follows these events, and
nothing else: renaming a task, or Prefect rewording its messages, cannot stall it.

Each event is a log record of the logger ``promptdistill.progress`` carrying a
:class:`ProgressEvent` (``record.progress``). That logger does not propagate: nobody
sees the events but the handlers attached to it (the CLI's display), so a flow run
without a display (a deployment, ``promptdistill optimize``) prints nothing more.
Events are per process: a step run in a Dask worker process emits there, out of reach
of the CLI's display (as Prefect's own task-run records were).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CACHED", "DONE", "FAILED", "PROGRESS_LOGGER", "RUNNING", "ProgressEvent", "emit", "step_events", "step_key"]

RUNNING, DONE, CACHED, FAILED = "running", "done", "cached", "failed"
"""What a step can report: it runs, or it ended computed, from an earlier run's cache, or failed."""
_STATES = (RUNNING, DONE, CACHED, FAILED)

PROGRESS_LOGGER = logging.getLogger("promptdistill.progress")
PROGRESS_LOGGER.propagate = False  # only the display listens: no extra lines in other runs' output
PROGRESS_LOGGER.setLevel(logging.INFO)  # whatever level Prefect gives the root logger


def step_key(stage: str, spec: str = "") -> str:
    """A step's key in the run's plan: ``optimize:ticket_triage`` for a spec's stage, ``ttft`` for the run's."""
    return f"{stage}:{spec}" if spec else stage


@dataclass(frozen=True)
class ProgressEvent:
    """One step's change: ``stage`` (``ttft``, ``distill``, ``optimize``, ``report``), for
    ``spec`` when the stage is per spec, now in ``state``; ``info`` says more (an error)."""

    stage: str
    state: str
    spec: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The step's key in the run's plan (:func:`step_key`)."""
        return step_key(self.stage, self.spec)


def emit(stage: str, state: str, *, spec: str = "", **info: Any) -> ProgressEvent:
    """Tell the run's listeners that a step runs or ended.

    Raises:
        ValueError: ``state`` is not one of :data:`RUNNING`, :data:`DONE`, :data:`CACHED`, :data:`FAILED`.
    """
    if state not in _STATES:
        raise ValueError(f"progress event {stage} {spec}: unknown state {state!r} (known: {', '.join(_STATES)})")
    event = ProgressEvent(stage, state, spec, info)
    PROGRESS_LOGGER.info("%s: %s", f"{stage} {spec}".rstrip(), state, extra={"progress": event})
    return event


@contextmanager
def step_events(stage: str, *, spec: str = "") -> Iterator[None]:
    """A step as a block: it runs on entry, is done on exit, failed when the block raises."""
    emit(stage, RUNNING, spec=spec)
    try:
        yield
    except BaseException as e:
        emit(stage, FAILED, spec=spec, error=f"{type(e).__name__}: {e}")
        raise
    emit(stage, DONE, spec=spec)

"""Counting what reaches the engine: requests and tokens, for budgets and cost reports.

A :class:`CallMeter` counts every request sent through it, in all and per **phase**: the
step of a run that asked for it. A step names itself with ``phase``::

    with meter.phase("screening"):      # or @phase("screening") on the step's function
        evaluate(...)

A phase belongs to the calls being made, not to one meter: it is held in a context
variable, so every meter those calls pass through counts them under it (a stage's own
meter, and a benchmark's meter below the stage's LM cache). Phases nest: calls inside
``"optimize"`` then ``"race"`` count under ``"optimize: race"``. A thread started inside a
phase does not inherit it (Python starts threads in an empty context): its calls count
under the phases it sets itself, or :data:`NO_PHASE`.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult

__all__ = ["NO_PHASE", "CallCounts", "CallMeter", "current_phase", "phase"]

NO_PHASE = "(no phase)"
"""The phase of calls made outside any ``phase``."""

_PHASES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("promptdistill_meter_phases", default=())


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Count every request made inside under ``name`` (nested: ``"outer: name"``), in every meter.

    Usable as a decorator too: ``@phase("race")`` tags each call of the function.
    """
    if not name or ": " in name:
        raise ValueError(f"a phase name must be non-empty and without ': ' (it joins nested phases), got {name!r}.")
    token = _PHASES.set((*_PHASES.get(), name))
    try:
        yield
    finally:
        _PHASES.reset(token)


def current_phase() -> str:
    """The phase a request made now counts under: the nested names joined by ': ', or :data:`NO_PHASE`."""
    return ": ".join(_PHASES.get()) or NO_PHASE


@dataclass
class CallCounts:
    """Requests and the tokens of their results."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Of ``prompt_tokens``, those served by the engine's prefix cache (not prefilled)."""
    completion_tokens: int = 0

    def add(self, results: Sequence[GenerationResult]) -> None:
        """Count ``results``, one per request."""
        self.calls += len(results)
        self.prompt_tokens += sum(r.prompt_tokens for r in results)
        self.cached_tokens += sum(r.cached_tokens for r in results)
        self.completion_tokens += sum(r.completion_tokens for r in results)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class CallMeter(EngineWrapper):
    """Counts every request sent through it, and the tokens processed, in all and per phase.

    Token counts go to the wrapped engine, so a stage counts exactly as the engine that
    serves it. Behind a ``CachedEngine`` the meter counts requests asked for; the cache
    counts which of them reached the model (``real_calls``). A batch the engine refuses
    (it raises) is not counted.

    Attributes:
        counts: every request sent (``calls``, ``prompt_tokens``, ``cached_tokens``,
            ``completion_tokens``; also read as the meter's own attributes).
        phases: the same counts per phase (:func:`current_phase` when the request was made).
    """

    phase = staticmethod(phase)
    """``with meter.phase("screening"):``: :func:`phase`, at hand where a meter is."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.counts = CallCounts()
        self.phases: dict[str, CallCounts] = {}

    @property
    def calls(self) -> int:
        """Requests sent."""
        return self.counts.calls

    @property
    def prompt_tokens(self) -> int:
        return self.counts.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the engine's prefix cache served."""
        return self.counts.cached_tokens

    @property
    def completion_tokens(self) -> int:
        return self.counts.completion_tokens

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        name = current_phase()
        results = self.engine.generate(requests, progress=progress)
        self.counts.add(results)
        self.phases.setdefault(name, CallCounts()).add(results)
        return results

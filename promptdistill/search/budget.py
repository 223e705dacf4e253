"""The search budget: LM calls as the bound, wall-clock time as a safety cap only.

Every stage counts the requests that reach the engine with one :class:`CallMeter`
(:mod:`promptdistill.engine.meter`) and asks one :class:`Budget` before each step:

* calls: a step starts only if its worst case fits what is left after the calls
  reserved for the steps that must follow (verification, timing);
* time: a step starts unless the cap has already passed. Time is never projected into
  what the search may do: a slower or busier machine reaches the same decisions, only
  later. The cap is for a hung or pathologically slow engine, and a search it stops says
  so ("stopped by the 20-minute cap").

The first refusal is kept as :attr:`Budget.reason`: it is what ended the search.

:class:`SearchBudget` declares the sizes and limits both searches take (records, LM calls,
minutes, how much to screen), once: the distiller's ``DistillConfig`` and the optimizer's
``OptimizeBudget`` inherit them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from promptdistill.core.settings import check, setting
from promptdistill.engine.meter import CallMeter

__all__ = ["Budget", "SearchBudget"]


@dataclass(frozen=True)
class SearchBudget:
    """The records and limits of one stage's search, declared once for the distiller and the
    optimizer (each states its own defaults where they differ: ``core.settings.restated``)."""

    max_lm_calls: int = setting(4000, "every LM request of the stage (generation, judges, repairs), the test split's "
                                "included", at_least=1)
    # A safety net: the search is sized by records and LM calls, so a slower machine reaches
    # the same decision later; a search the cap stops says so in its reason.
    max_minutes: float = setting(60.0, "wall-clock cap of the search: no step starts once it has passed (time is "
                                 "never projected: a slower machine reaches the same decisions later)", above=0)
    screen_size: int = setting(16, "dev records that screen the candidates (and ablate clauses, choose example sets); "
                               "never used to certify", at_least=1)
    dev_size: int = setting(1000, "dev records in all: the screen records, then the race's certify pool", at_least=1)
    test_size: int = setting(200, "held-out test records: the winner is checked on them and reverted if it fails there",
                             at_least=0)
    screen_every: bool = setting(False, "screen every candidate, so the tables show each one's quality; off: only "
                                 "those that could still be chosen (the same choice, fewer LM calls)")

    def __post_init__(self) -> None:
        check(self)


class Budget:
    """LM calls and minutes for one stage.

    Args:
        meter: counts the stage's requests.
        max_calls: every LM request of the stage, reserved ones included.
        max_minutes: the wall-clock cap of the search (a safety net, see the module docstring).
        reserved_calls: calls kept back for the steps after the search.
        clock: seconds, monotonic (default ``time.monotonic``; a test's clock may be scripted).
    """

    def __init__(self, meter: CallMeter, *, max_calls: int, max_minutes: float, reserved_calls: int = 0,
                 clock: Callable[[], float] | None = None) -> None:
        self.meter = meter
        self.max_calls = max_calls
        self.max_minutes = max_minutes
        self.reserved_calls = reserved_calls
        self.clock = clock or (lambda: time.monotonic())  # looked up at each call, so a test may patch it
        self.reason: str | None = None
        self.refusals = 0
        """Steps refused so far (``reason`` keeps only the first): a caller tells whether its
        own step was cut by comparing the count before and after."""
        self.restart_clock()

    def restart_clock(self) -> None:
        """Start the clock now (after set-up that is not search time)."""
        self.started = self.clock()
        self.deadline = self.started + 60.0 * self.max_minutes
        self._calls_at_start = self.meter.calls

    @property
    def pace_s(self) -> float:
        """Seconds per LM call so far (0 before the first call): reported, never used to decide."""
        calls = self.meter.calls - self._calls_at_start
        return (self.clock() - self.started) / calls if calls > 0 else 0.0

    @property
    def calls_left(self) -> int:
        return self.max_calls - self.reserved_calls - self.meter.calls

    def release(self) -> None:
        """The reserved steps are starting now: their calls are no longer held back."""
        self.reserved_calls = 0

    def affordable(self, n_items: int, calls_each: int, what: str) -> int:
        """How many of ``n_items`` steps of ``calls_each`` calls can still run (0 to ``n_items``).

        Fewer than asked records why in :attr:`reason` (the first such reason is kept).
        """
        if n_items <= 0:
            return 0
        calls_each = max(1, calls_each)
        by_calls = max(0, self.calls_left // calls_each)
        if self.clock() > self.deadline:
            self.refusals += 1
            if self.reason is None:
                self.reason = (f"stopped by the {self.max_minutes:g}-minute cap ({self.pace_s:.2f} s per LM call) "
                               f"before {n_items} {what}")
            return 0
        can = min(n_items, by_calls)
        if can < n_items:
            self.refusals += 1
            if self.reason is None:
                self.reason = f"budget: LM calls ({self.max_calls}) allowed {can} of {n_items} {what}"
        return can

    def afford(self, calls: int, what: str) -> bool:
        """May one step costing at most ``calls`` start?"""
        return self.affordable(1, calls, what) == 1

"""The search budget: LM calls as a hard bound, wall-clock time by projection.

Every stage counts the requests that reach the engine with one :class:`CallMeter`
(:mod:`promptdistill.engine.meter`) and asks one :class:`Budget` before each step:

* calls: a step starts only if its worst case fits what is left after the calls
  reserved for the steps that must follow (verification, timing);
* time: a step starts only if, at the seconds per call seen so far, it and the reserved
  steps end before the deadline.

The first refusal is kept as :attr:`Budget.reason`: it is what ended the search.
"""

from __future__ import annotations

import time

from promptdistill.engine.meter import CallMeter

__all__ = ["Budget"]


class Budget:
    """LM calls and minutes for one stage.

    Args:
        meter: counts the stage's requests.
        max_calls: every LM request of the stage, reserved ones included.
        max_minutes: wall-clock limit of the stage.
        reserved_calls: calls kept back for the steps after the search.
        reserved_s: seconds kept back besides the reserved calls' time (work that is not
            LM calls, such as TTFT timing requests sent one at a time).
    """

    def __init__(self, meter: CallMeter, *, max_calls: int, max_minutes: float, reserved_calls: int = 0,
                 reserved_s: float = 0.0) -> None:
        self.meter = meter
        self.max_calls = max_calls
        self.max_minutes = max_minutes
        self.reserved_calls = reserved_calls
        self.reserved_s = reserved_s
        self.reason: str | None = None
        self.restart_clock()

    def restart_clock(self) -> None:
        """Start the clock now (after set-up that is not search time)."""
        self.started = time.monotonic()
        self.deadline = self.started + 60.0 * self.max_minutes
        self._calls_at_start = self.meter.calls

    @property
    def pace_s(self) -> float:
        """Seconds per LM call so far (0 before the first call)."""
        calls = self.meter.calls - self._calls_at_start
        return (time.monotonic() - self.started) / calls if calls > 0 else 0.0

    @property
    def calls_left(self) -> int:
        return self.max_calls - self.reserved_calls - self.meter.calls

    def release(self) -> None:
        """The reserved steps are starting now: their calls are no longer held back."""
        self.reserved_calls = 0
        self.reserved_s = 0.0

    def affordable(self, n_items: int, calls_each: int, what: str) -> int:
        """How many of ``n_items`` steps of ``calls_each`` calls can still run (0 to ``n_items``).

        Fewer than asked records why in :attr:`reason` (the first such reason is kept).
        """
        if n_items <= 0:
            return 0
        calls_each = max(1, calls_each)
        by_calls = max(0, self.calls_left // calls_each)
        now = time.monotonic()
        pace = self.pace_s
        after_s = pace * self.reserved_calls + self.reserved_s
        if now > self.deadline:
            by_time = 0
        elif pace == 0.0:
            by_time = n_items
        else:
            by_time = max(0, int((self.deadline - now - after_s) // (pace * calls_each)))
        can = min(n_items, by_calls, by_time)
        if can < n_items and self.reason is None:
            if by_time < min(n_items, by_calls):
                self.reason = (f"budget: time ({self.max_minutes:g} min at {pace:.2f} s per LM call) allowed "
                               f"{can} of {n_items} {what}")
            else:
                self.reason = f"budget: LM calls ({self.max_calls}) allowed {can} of {n_items} {what}"
        return can

    def afford(self, calls: int, what: str) -> bool:
        """May one step costing at most ``calls`` start?"""
        return self.affordable(1, calls, what) == 1

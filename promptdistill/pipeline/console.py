"""A quiet terminal for long runs: third-party output to a log file, our progress on screen.

A nightly run loads vLLM, torch, transformers and Prefect, which print hundreds of lines
(FutureWarnings, INFO/WARNING logs, checkpoint-loading bars, NUMA-binding lines written
by C++ straight to file descriptor 2). Two parts keep the terminal for our own work:

* :func:`capture_output`: points file descriptors 1 and 2 at a log file (``os.dup2``,
  so C-level writes and child processes are caught too) and hands back streams on the
  real terminal; everything is restored on exit.
* :class:`RunProgress` (pure: the clock is injected) follows a run's steps (start-up,
  TTFT model, distill and optimize per spec, report) from the events the flows' tasks
  emit (:mod:`promptdistill.pipeline.events`), and estimates what is left from the
  budget's minutes, corrected by what has run; :class:`ProgressDisplay` shows it (a live
  table on a terminal, one line per change otherwise) and :class:`ProgressHandler`
  feeds it the events and echoes errors, and our own warnings, in full.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from promptdistill.pipeline.events import CACHED, DONE, FAILED, PROGRESS_LOGGER, RUNNING, ProgressEvent, step_key

__all__ = [
    "ProgressDisplay",
    "ProgressHandler",
    "RunProgress",
    "Step",
    "Terminal",
    "capture_output",
    "format_duration",
    "is_ours",
    "listening",
    "plan_night",
]

PENDING, SKIPPED = "pending", "skipped"
"""A step's states before and instead of running (the others are the events': running, done, cached, failed)."""
_ENDED = (DONE, CACHED, FAILED, SKIPPED)
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
"""Log records whose caller lives here are ours (the flows' and the stages' messages)."""


# ------------------------------------------------------------- output capture
@dataclass
class Terminal:
    """Where our own output goes: the real terminal, whatever fds 1 and 2 point at."""

    out: TextIO
    err: TextIO
    log_path: Path | None = None
    """The file third-party output goes to (None: it stays on the terminal, ``--verbose``)."""


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def _point_std_fds_at(path: str | Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for target in (1, 2):
            os.dup2(fd, target)
    finally:
        os.close(fd)


def _quiet_exit(path: str) -> None:
    """At interpreter exit: libraries' shutdown messages go to the log too."""
    _flush_std()
    _point_std_fds_at(path)


def _silence_at_exit(path: str) -> None:
    atexit.register(_quiet_exit, path)
    # Thread exit hooks run before atexit's: Prefect drains its event and log queues there
    # ("Still processing items..."). This private hook is the one Prefect itself uses.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_quiet_exit, path)
        except RuntimeError:  # the interpreter is already shutting down its threads
            pass


@contextmanager
def capture_output(log_path: str | Path | None, *, silence_at_exit: bool = False) -> Iterator[Terminal]:
    """Send everything written to fds 1 and 2 (Python, C, child processes) to ``log_path``.

    Our own output goes to the yielded :class:`Terminal`'s streams, duplicates of the
    original fds. On exit the fds are restored. With ``log_path=None`` nothing is
    redirected (``--verbose``) and the terminal is ``sys.stdout``/``sys.stderr``.

    Args:
        log_path: the log file (appended to; its folder is created).
        silence_at_exit: point fds 1 and 2 at the log again when the interpreter exits:
            the shutdown messages of libraries loaded meanwhile (their exit hooks run
            after this one's, registered later) stay out of the terminal.
    """
    if log_path is None:
        yield Terminal(sys.stdout, sys.stderr, None)
        return
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _flush_std()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    out = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    err = os.fdopen(os.dup(saved[2]), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        _point_std_fds_at(path)
        yield Terminal(out, err, path)
    finally:
        _flush_std()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        for stream in (out, err):
            stream.close()
        if silence_at_exit:
            _silence_at_exit(str(path))


def is_ours(record: logging.LogRecord) -> bool:
    """Whether a log record was emitted by promptdistill's code (not a library's)."""
    return str(record.pathname).startswith(_PACKAGE_DIR)


# ---------------------------------------------------------------- the run's steps
def format_duration(seconds: float | None) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour); ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


@dataclass
class Step:
    """One row of the progress display: a stage, for one spec or for the whole run."""

    stage: str
    spec: str = ""
    estimate_s: float = 0.0
    """What the budget allows for it (its minutes plus a fixed overhead)."""
    state: str = PENDING
    started: float | None = None
    ended: float | None = None
    cached: bool = False
    """Its result came from the cache of an earlier run (its time says nothing about the budget)."""

    @property
    def key(self) -> str:
        return step_key(self.stage, self.spec)


def plan_night(specs: Sequence[str], *, ttft_minutes: float, distill_minutes: Mapping[str, float] | None,
               optimize_minutes: Mapping[str, float], startup_s: float = 60.0, overhead_s: float = 5.0,
               report_s: float = 15.0) -> list[Step]:
    """The steps of a nightly run, in order, with the budget's estimates.

    Args:
        specs: the spec names, in the order the flow runs them.
        ttft_minutes: the TTFT profile's expected minutes (the step is skipped when the model is fresh).
        distill_minutes: the distiller's expected minutes per spec (specs differ tenfold in
            reply length); None: no distill step.
        optimize_minutes: the optimizer's expected minutes per spec.
        startup_s: Prefect's server and the engine's start-up.
        overhead_s: added to each stage's minutes (the task's own start and publishing; the
            expected minutes already hold the verification, measured with it).
        report_s: the night's report.
    """
    steps = [Step("start-up", estimate_s=startup_s), Step("ttft", estimate_s=ttft_minutes * 60 + overhead_s)]
    for spec in specs:
        if distill_minutes is not None:
            steps.append(Step("distill", spec, distill_minutes[spec] * 60 + overhead_s))
        steps.append(Step("optimize", spec, optimize_minutes[spec] * 60 + overhead_s))
    return steps + [Step("report", estimate_s=report_s)]


class RunProgress:
    """The run's steps, moved on by events; thread-safe; pure but for the injected clock.

    Steps run one after another: when a step starts, every earlier running step is done
    and every earlier pending one was skipped (a fresh TTFT model, a spec that failed).
    """

    def __init__(self, steps: Sequence[Step], clock: Callable[[], float] = time.monotonic) -> None:
        self.steps = list(steps)
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        self._by_key = {s.key: s for s in self.steps}

    def step(self, key: str) -> Step | None:
        return self._by_key.get(key)

    # -- events ---------------------------------------------------------------------
    def begin(self, key: str) -> list[str]:
        """Step ``key`` runs from now. Returns the keys of the steps that changed, in order."""
        with self._lock:
            step = self._by_key.get(key)
            if step is None or step.state != PENDING:
                return []
            now = self.clock()
            changed = []
            for earlier in self.steps[: self.steps.index(step)]:
                if earlier.state == RUNNING:
                    earlier.state, earlier.ended = (CACHED if earlier.cached else DONE), now
                elif earlier.state == PENDING:
                    earlier.state = SKIPPED
                else:
                    continue
                changed.append(earlier.key)
            step.state, step.started = RUNNING, now
            return changed + [key]

    def end(self, key: str, state: str = DONE) -> list[str]:
        """Step ``key`` ended (``done``, ``cached`` or ``failed``). Returns the keys that changed."""
        changed = self.begin(key)  # a step can end before we saw it run
        with self._lock:
            step = self._by_key.get(key)
            if step is None or step.state != RUNNING:
                return changed
            step.cached = step.cached or state == CACHED
            step.state, step.ended = (CACHED if step.cached and state != FAILED else state), self.clock()
            return [k for k in changed if k != key] + [key]

    def on_event(self, event: ProgressEvent) -> list[str]:
        """A step's event: it runs, or it ended (``done``, ``cached``, ``failed``).

        Returns the keys of the steps that changed; an event of a step not in the plan
        changes nothing.
        """
        if event.key not in self._by_key:
            return []
        return self.begin(event.key) if event.state == RUNNING else self.end(event.key, event.state)

    # -- figures --------------------------------------------------------------------
    def scale(self, stage: str) -> float:
        """Actual over budgeted time of the stage's finished, uncached steps (1 before any)."""
        done = [s for s in self.steps if s.stage == stage and s.state == DONE and s.started is not None
                and s.ended is not None and s.estimate_s > 0]
        if not done:
            return 1.0
        ratio = sum(s.ended - s.started for s in done) / sum(s.estimate_s for s in done)
        return min(5.0, max(0.2, ratio))

    def elapsed(self, step: Step, now: float | None = None) -> float | None:
        if step.started is None:
            return None
        return (step.ended if step.ended is not None else (now if now is not None else self.clock())) - step.started

    def left(self, step: Step, now: float | None = None) -> float:
        """Seconds the step still needs, by the corrected budget (0 once it ended)."""
        if step.state in _ENDED:
            return 0.0
        expected = step.estimate_s * self.scale(step.stage)
        return expected if step.state == PENDING else max(0.0, expected - (self.elapsed(step, now) or 0.0))

    def total_left(self, now: float | None = None) -> float:
        now = self.clock() if now is None else now
        return sum(self.left(s, now) for s in self.steps)

    def finish(self) -> None:
        """The run is over: a running step ended, pending ones were skipped."""
        with self._lock:
            now = self.clock()
            for s in self.steps:
                if s.state == RUNNING:
                    s.state, s.ended = DONE, now
                elif s.state == PENDING:
                    s.state = SKIPPED

    def line(self, step: Step, now: float | None = None) -> str:
        """One plain line on a step's state (the display without a terminal)."""
        now = self.clock() if now is None else now
        what = f"{step.stage} {step.spec}".rstrip()
        if step.state == RUNNING:
            status = "running"
        elif step.state == SKIPPED:
            status = "skipped"
        else:
            status = f"{step.state} in {format_duration(self.elapsed(step, now))}"
        return f"[{format_duration(now - self.started):>5}] {what}: {status}; about {format_duration(self.total_left(now))} left"

    def table(self, now: float | None = None) -> Table:
        """The live display: one row per step (:meth:`footer` goes under it)."""
        now = self.clock() if now is None else now
        styles = {PENDING: "dim", RUNNING: "bold yellow", DONE: "green", CACHED: "cyan", FAILED: "bold red",
                  SKIPPED: "dim"}
        table = Table(box=None, pad_edge=False, header_style="bold")
        for name, justify in (("stage", "left"), ("spec", "left"), ("state", "left"), ("elapsed", "right"),
                              ("left", "right")):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for s in self.steps:
            left = self.left(s, now)
            table.add_row(s.stage, s.spec, Text(s.state, style=styles[s.state]), format_duration(self.elapsed(s, now)),
                          f"~{format_duration(left)}" if s.state in (PENDING, RUNNING) else "")
        return table

    def footer(self, now: float | None = None) -> str:
        """The line under the table: the run's elapsed time and what is left."""
        now = self.clock() if now is None else now
        return (f"elapsed {format_duration(now - self.started)}, about {format_duration(self.total_left(now))} left "
                "(the budget's minutes, corrected by what has run)")


# ------------------------------------------------------------------ the display
@dataclass
class ProgressDisplay:
    """Shows a :class:`RunProgress` on our terminal: a live table, or lines when not a terminal."""

    progress: RunProgress
    terminal: Terminal
    live: bool | None = None
    """None: live when the terminal's stderr is a terminal."""
    console: Console = field(init=False)
    _live: Live | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.live is None:
            self.live = bool(getattr(self.terminal.err, "isatty", lambda: False)())
        self.console = Console(file=self.terminal.err, force_terminal=self.live, highlight=False,
                               soft_wrap=not self.live)

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            # redirect_*=False: rich would otherwise route sys.stdout/sys.stderr (the libraries'
            # Python-level writes, meant for the log) through the terminal.
            self._live = Live(get_renderable=self._render, console=self.console,
                              refresh_per_second=1, transient=False, redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        return self

    def _render(self) -> Group:
        now = self.progress.clock()
        return Group(self.progress.table(now), Text(self.progress.footer(now), style="dim"))

    def __exit__(self, *exc: Any) -> None:
        self.progress.finish()
        if self._live is not None:
            self._live.stop()
            self._live = None

    def changed(self, keys: Sequence[str]) -> None:
        """Steps changed state: one line each without a terminal (the live table redraws itself)."""
        if self.live:
            return
        for key in keys:
            step = self.progress.step(key)
            if step is not None:
                self.console.print(self.progress.line(step), markup=False)

    def begin(self, key: str) -> None:
        """Step ``key`` runs from now (the CLI starts ``start-up`` itself)."""
        self.changed(self.progress.begin(key))

    def message(self, text: str, *, style: str | None = None) -> None:
        """Print a message (an error, our warning) above the live table."""
        self.console.print(Text(text, style=style or ""))


class ProgressHandler(logging.Handler):
    """Moves the display on from the run's progress events, and shows errors and our warnings.

    Attach it with :func:`listening` after Prefect has configured logging. Progress
    events (records carrying a :class:`~promptdistill.pipeline.events.ProgressEvent`)
    move the steps on; any ERROR record, and WARNING records emitted by promptdistill's
    code, are printed in full.
    """

    def __init__(self, display: ProgressDisplay | None, terminal: Terminal, *, echo: bool = True) -> None:
        super().__init__(level=logging.DEBUG)
        self.display = display
        self.terminal = terminal
        self.echo = echo

    def format(self, record: logging.LogRecord) -> str:
        """``LEVEL where: message`` and the traceback, if any; ``where`` is the task run when there is one."""
        where = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None) or record.name
        text = f"{record.levelname} {where}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        return text

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = getattr(record, "progress", None)
            if isinstance(event, ProgressEvent):
                if self.display is not None:
                    self.display.changed(self.display.progress.on_event(event))
                return
            if self.echo and (record.levelno >= logging.ERROR or (record.levelno >= logging.WARNING and is_ours(record))):
                text = self.format(record)
                if self.display is not None:
                    self.display.message(text, style="red" if record.levelno >= logging.ERROR else "yellow")
                else:
                    print(text, file=self.terminal.err, flush=True)
        except Exception:  # noqa: BLE001 - a display problem must never fail the run
            self.handleError(record)


@contextmanager
def listening(handler: logging.Handler) -> Iterator[logging.Handler]:
    """``handler`` on the root logger (where Prefect's and the libraries' records end up)
    and on the progress events' logger (which does not propagate), until the block ends.

    Attach after Prefect has configured logging: its set-up replaces the root logger's handlers.
    """
    root = logging.getLogger()
    root.addHandler(handler)
    PROGRESS_LOGGER.addHandler(handler)
    try:
        yield handler
    finally:
        PROGRESS_LOGGER.removeHandler(handler)
        root.removeHandler(handler)

"""The quiet terminal: capturing third-party output, the progress model, and a real run's noise.

The pure parts (the steps, the estimates, the progress events moving the steps on, the
display's lines) run on a fake clock. ``capture_output`` is tested in a child process,
where C-level writes to fd 2 can be made for real. The last test runs
``promptdistill nightly`` on the real engine (smoke budget, one spec, a fresh state) and
counts the lines on its stdout and stderr that are not ours.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from promptdistill.pipeline import events
from promptdistill.pipeline.console import (
    ProgressDisplay,
    ProgressHandler,
    RunProgress,
    Terminal,
    format_duration,
    is_ours,
    listening,
    plan_night,
)
from promptdistill.pipeline.events import ProgressEvent

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def night(clock: Clock, distill: float | None = 2.0) -> RunProgress:
    steps = plan_night(["a", "b"], ttft_minutes=4.0, distill_minutes=None if distill is None else
                       {"a": distill, "b": distill}, optimize_minutes={"a": 2.0, "b": 2.0}, startup_s=60,
                       overhead_s=30, report_s=15)
    return RunProgress(steps, clock=clock)


def event(stage: str, state: str, spec: str = "") -> ProgressEvent:
    return ProgressEvent(stage, state, spec)


# --- the steps and their estimates ---------------------------------------------------------


def test_the_plan_follows_the_flow_and_the_budget():
    steps = plan_night(["a", "b"], ttft_minutes=4.0, distill_minutes={"a": 2.0, "b": 1.0},
                       optimize_minutes={"a": 3.0, "b": 6.0})
    assert [s.key for s in steps] == ["start-up", "ttft", "distill:a", "optimize:a", "distill:b", "optimize:b", "report"]
    assert [s.estimate_s for s in steps[1:]] == [245.0, 125.0, 185.0, 65.0, 365.0, 15.0]
    no_distill = plan_night(["a"], ttft_minutes=1.0, distill_minutes=None, optimize_minutes={"a": 1.0})
    assert [s.key for s in no_distill] == ["start-up", "ttft", "optimize:a", "report"]


def test_each_spec_is_expected_at_its_own_pace():
    """A spec's stage is expected to take its typical share of the LM-call budget at its reply
    budget's pace (summarize's 320 tokens against ticket_triage's 16), at most the stage's cap;
    after one spec ran, the others are corrected by the same ratio, so a fast first spec no
    longer makes a slow one look fast (the bundled specs' 0101013 make run: format_rules' optimize
    took 1.7 minutes, summarize's 10.3)."""
    from promptdistill.pipeline.budgets import expected_minutes, seconds_per_lm_call

    assert seconds_per_lm_call(320) > 3 * seconds_per_lm_call(48) > seconds_per_lm_call(16)
    assert seconds_per_lm_call(None) == seconds_per_lm_call(256)
    minutes = {name: expected_minutes("optimize", 4000, 30.0, tokens)
               for name, tokens in {"format_rules": 40, "summarize": 320}.items()}
    assert minutes["summarize"] > 4 * minutes["format_rules"]
    assert expected_minutes("optimize", 40000, 30.0, 320) == 30.0
    clock = Clock()
    p = RunProgress(plan_night(list(minutes), ttft_minutes=1.0, distill_minutes=None, optimize_minutes=minutes,
                               overhead_s=0), clock=clock)
    p.on_event(event("optimize", "running", "format_rules"))
    clock.now += 1.7 * 60
    p.on_event(event("optimize", "done", "format_rules"))
    ratio = p.left(p.step("optimize:summarize")) / (1.7 * 60)
    assert ratio == pytest.approx(minutes["summarize"] / minutes["format_rules"])
    assert 3.0 < ratio < 12.0


def test_events_name_their_step_and_refuse_unknown_states():
    assert event("optimize", "running", "ticket_triage").key == "optimize:ticket_triage"
    assert event("ttft", "done").key == "ttft"
    with pytest.raises(ValueError, match="unknown state 'finished'"):
        events.emit("report", "finished")


def test_events_reach_the_listening_handler_only_whatever_the_root_level():
    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[ProgressEvent] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.events.append(record.progress)

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # as Prefect's logging set-up leaves it
    bystander = Keep()
    root.addHandler(bystander)  # e.g. Prefect's console handler: events are not its business
    try:
        with listening(Keep()) as listener:
            sent = events.emit("distill", "running", spec="a")
        events.emit("distill", "done", spec="a")  # nobody listens any more
    finally:
        root.removeHandler(bystander)
        root.setLevel(level)
    assert listener.events == [sent] and bystander.events == []


def test_a_fresh_ttft_model_is_skipped_and_steps_end_in_order():
    clock = Clock()
    p = night(clock)
    assert p.begin("start-up") == ["start-up"]
    clock.now += 50
    # Spec a's first step starts: start-up is over, the TTFT step never ran.
    assert p.on_event(event("distill", "running", "a")) == ["start-up", "ttft", "distill:a"]
    assert [p.step(k).state for k in ("start-up", "ttft", "distill:a")] == ["done", "skipped", "running"]
    clock.now += 100
    assert p.on_event(event("distill", "done", "a")) == ["distill:a"]
    assert p.step("distill:a").state == "done" and p.elapsed(p.step("distill:a")) == 100
    assert p.on_event(event("optimize", "running", "a")) == ["optimize:a"]
    clock.now += 90
    assert p.on_event(event("optimize", "done", "a")) == ["optimize:a"]
    assert p.elapsed(p.step("optimize:a")) == 90
    # An ended step's repeated event, or a step the plan does not have, changes nothing.
    assert p.on_event(event("distill", "done", "a")) == []
    assert p.on_event(event("optimize", "running", "not-planned")) == []


def test_estimates_come_from_the_budget_then_from_what_has_run():
    clock = Clock()
    p = night(clock)
    p.begin("start-up")
    assert p.total_left() == 60 + 270 + 2 * (150 + 150) + 15
    clock.now += 60
    p.begin("distill:a")
    clock.now += 75  # half its budget
    assert p.left(p.step("distill:a")) == 75
    p.end("distill:a")
    # Distilling took half its budget: spec b's distill step is expected to as well.
    assert p.scale("distill") == 0.5 and p.left(p.step("distill:b")) == 75
    assert p.scale("optimize") == 1.0 and p.left(p.step("optimize:b")) == 150
    # A running step past its estimate has nothing left, never a negative time.
    p.begin("optimize:a")
    clock.now += 1000
    assert p.left(p.step("optimize:a")) == 0.0


def test_cached_steps_do_not_teach_the_estimate_and_failures_end_a_step():
    clock = Clock()
    p = night(clock)
    p.on_event(event("distill", "cached", "a"))  # a step can end before we saw it run
    p.on_event(event("optimize", "running", "a"))
    clock.now += 5
    p.on_event(event("optimize", "cached", "a"))
    assert p.step("distill:a").state == "cached" and p.step("optimize:a").state == "cached"
    assert p.scale("optimize") == 1.0
    assert p.on_event(event("distill", "failed", "b")) == ["distill:b"]
    assert p.step("distill:b").state == "failed"
    # The flow moves on to the report: spec b's optimize step never ran.
    p.on_event(event("report", "running"))
    p.on_event(event("report", "done"))
    assert p.step("optimize:b").state == "skipped" and p.step("report").state == "done"
    assert p.total_left() == 0


def test_durations_read_as_clock_times():
    assert [format_duration(s) for s in (None, 0, 59.6, 61, 3600 + 62)] == ["-", "0:00", "1:00", "1:01", "1:01:02"]


# --- the display and the log handler --------------------------------------------------------


def _record(msg: str, level: int = logging.INFO, *, pathname: str = "/elsewhere/lib.py", **extra) -> logging.LogRecord:
    record = logging.LogRecord("prefect.task_runs", level, pathname, 1, msg, (), None)
    record.__dict__.update(extra)
    return record


def test_without_a_terminal_the_display_prints_one_line_per_change():
    clock = Clock()
    err = io.StringIO()
    terminal = Terminal(io.StringIO(), err, Path("x.log"))
    display = ProgressDisplay(night(clock), terminal)
    assert display.live is False  # a StringIO is no terminal
    with listening(ProgressHandler(display, terminal)) as handler, display:
        display.begin("start-up")
        clock.now += 42
        events.emit("distill", "running", spec="a")
        handler.emit(_record("loading weights", logging.WARNING))  # a library's warning: not shown
        handler.emit(_record("the night report could not be built", logging.WARNING,
                             pathname=str(REPO / "promptdistill" / "flows" / "nightly.py"), flow_run_name="brave-fox"))
        handler.emit(_record("EngineTimeoutError: no reply in 600 s", logging.ERROR, task_run_name="distill-a"))
        events.emit("distill", "failed", spec="a", error="EngineTimeoutError: no reply in 600 s")
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("[ 0:00] start-up: running; about ")
    assert lines[1].startswith("[ 0:42] start-up: done in 0:42")
    assert lines[2].startswith("[ 0:42] ttft: skipped") and lines[3].startswith("[ 0:42] distill a: running")
    assert "WARNING brave-fox: the night report could not be built" in lines  # our warning
    assert "loading weights" not in err.getvalue()
    assert any(line.startswith("[ 0:42] distill a: failed in 0:00") for line in lines)
    assert "ERROR distill-a: EngineTimeoutError: no reply in 600 s" in lines  # errors in full
    # One line per step change (start-up twice, ttft, distill a twice), and the events print nothing else.
    assert len([line for line in lines if line.startswith("[")]) == 5, lines
    assert [line for line in lines if not line.startswith("[")] == [
        "WARNING brave-fox: the night report could not be built", "ERROR distill-a: EngineTimeoutError: no reply in 600 s"]


def test_records_from_our_package_are_ours():
    assert is_ours(_record("x", pathname=str(REPO / "promptdistill" / "flows" / "nightly.py")))
    assert not is_ours(_record("x", pathname="/venv/lib/python3.11/site-packages/vllm/config.py"))


def test_the_live_table_lists_every_step():
    from rich.console import Console

    clock = Clock()
    p = night(clock)
    p.begin("ttft")
    clock.now += 30
    out = io.StringIO()
    Console(file=out, width=100, force_terminal=False).print(p.table())
    text = out.getvalue()
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["start-up", "ttft", "distill", "optimize", "distill",
                                                                    "optimize", "report"]
    assert re.search(r"ttft\s+running\s+0:30\s+~4:00", text), text
    assert p.footer().startswith("elapsed 0:30, about 14:15 left")  # 4:00 + 2 x (2:30 + 2:30) + 0:15


# --- capturing output: Python, C-level and child-process writes -------------------------------

CHILD = textwrap.dedent("""
    import ctypes, os, subprocess, sys, warnings
    from pathlib import Path
    from promptdistill.pipeline.console import capture_output

    print("before", flush=True)
    with capture_output(Path(sys.argv[1])) as term:
        print("python stdout")
        print("python stderr", file=sys.stderr)
        warnings.warn("a FutureWarning from a library", FutureWarning)
        libc = ctypes.CDLL(None)
        libc.write(2, b"C-level NUMA binding line\\n", 26)
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('child process line\\\\n')"])
        print("ours on the terminal", file=term.err, flush=True)
    print("after", flush=True)
""")


def test_capture_sends_every_kind_of_write_to_the_log(tmp_path):
    log = tmp_path / "logs" / "run.log"
    out = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["before", "after"]
    assert out.stderr.splitlines() == ["ours on the terminal"]
    text = log.read_text()
    for line in ("python stdout", "python stderr", "a FutureWarning from a library", "C-level NUMA binding line",
                 "child process line"):
        assert line in text


EXITING = textwrap.dedent("""
    import atexit, sys, threading
    from promptdistill.pipeline.console import capture_output

    # Registered before the capture, as Prefect's queue services and vLLM's clean-up are.
    threading._register_atexit(lambda: print("Still processing items: 1 items remaining...", file=sys.stderr))
    atexit.register(lambda: print("Stopping temporary server", file=sys.stderr))
    with capture_output(sys.argv[1], silence_at_exit=True):
        pass
    print("the summary table", flush=True)
""")


def test_shutdown_messages_after_the_run_go_to_the_log(tmp_path):
    log = tmp_path / "run.log"
    out = subprocess.run([sys.executable, "-c", EXITING, str(log)], capture_output=True, text=True, timeout=60)
    assert (out.stdout, out.stderr) == ("the summary table\n", "")
    assert "Still processing items" in log.read_text() and "Stopping temporary server" in log.read_text()


def test_verbose_leaves_the_terminal_alone():
    from promptdistill.pipeline.console import capture_output

    with capture_output(None) as term:
        assert term.out is sys.stdout and term.err is sys.stderr and term.log_path is None


# --- a real nightly: how much third-party output reaches the terminal -------------------------

OURS = [
    re.compile(r"^third-party output \(engine, libraries\): "),
    re.compile(r"^\[\s*\d+:\d\d(:\d\d)?\] "),             # the progress lines
    re.compile(r"^(template\s+status|[- ]+$|ticket_triage\s)"),  # the summary table
    re.compile(r"^(TTFT model|registry|night report|failed): "),
    re.compile(r"^$"),
]


def third_party_lines(text: str) -> list[str]:
    """Lines of a run's terminal output that none of our outputs printed."""
    return [line for line in text.splitlines() if not any(p.match(line) for p in OURS)]


def test_the_classifier_counts_what_is_not_ours():
    text = ("third-party output (engine, libraries): /x/nightly.log  (--verbose shows it here)\n"
            "[ 0:00] start-up: running; about 9:00 left\n"
            "INFO 12-01 22:00:00 [config.py:1] This model supports multiple tasks\n"
            "template       status\n-------------  ------\nticket_triage  optimized\n\nTTFT model: fresh\n"
            "/venv/site-packages/torch/_utils.py:1: FutureWarning: ...\n")
    assert third_party_lines(text) == ["INFO 12-01 22:00:00 [config.py:1] This model supports multiple tasks",
                                       "/venv/site-packages/torch/_utils.py:1: FutureWarning: ..."]


_RUN: dict[str, object] = {}


def real_nightly(root: Path) -> dict[str, object]:
    """``promptdistill nightly --budget smoke`` on ticket_triage, as ``make run`` calls it, in a
    fresh project folder (empty state and registry: the TTFT model is profiled too).

    Run once per test session (the browser test reads the same run's report). The caller
    holds the engine lock: run pytest under ``flock /tmp/pd-engine.lock``.
    """
    if not _RUN:
        shutil.copytree(REPO / "prompts", root / "prompts")
        shutil.copytree(REPO / "datasets", root / "datasets", ignore=shutil.ignore_patterns("generators"))
        env = {**os.environ, "PROMPTDISTILL_STATE_DIR": str(root / "state"), "PROMPTDISTILL_REGISTRY": str(root / "registry"),
               "PREFECT_HOME": str(root / "prefect"), "PYTHONUNBUFFERED": "1"}
        env.pop("PREFECT_API_URL", None)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "promptdistill", "nightly", "--budget", "smoke", "--specs",
                               "ticket_triage"], cwd=root, env=env, capture_output=True, text=True, timeout=3600)
        _RUN.update(root=root, returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                    minutes=(time.monotonic() - started) / 60)
    return _RUN


@pytest.fixture(scope="session")
def nightly_run(tmp_path_factory):
    return real_nightly(tmp_path_factory.mktemp("nightly-cli"))


@pytest.mark.engine
@pytest.mark.slow
def test_a_real_nightly_shows_our_work_not_third_party_noise(nightly_run):
    run = nightly_run
    both = f"{run['stdout']}\n{run['stderr']}"
    assert run["returncode"] == 0, both
    noise = third_party_lines(both)
    print(f"{len(noise)} third-party lines in {run['minutes']:.1f} min:\n" + "\n".join(noise))
    assert len(noise) < 20, "\n".join(noise)
    # What we print: the log's path once, progress, the table, the report's path.
    log = re.search(r"^third-party output \(engine, libraries\): (\S+)", run["stderr"], re.MULTILINE)
    assert log and both.count("third-party output") == 1
    log_text = Path(log.group(1)).read_text(errors="replace")
    assert "vllm" in log_text.lower() or "prefect" in log_text.lower()  # the noise went there
    assert re.search(r"optimize ticket_triage: done in", run["stderr"])
    assert re.search(r"^ticket_triage\s+(optimized|baseline kept)", run["stdout"], re.MULTILINE)
    assert re.search(r"^night report: .*report\.html$", run["stdout"], re.MULTILINE)

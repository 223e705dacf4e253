"""``promptdistill nightly``: run the nightly Prefect flow here and print the summary table.

    promptdistill nightly                              # every spec, the 'quick' budget
    promptdistill nightly --specs ticket_triage,summarize --budget smoke
    promptdistill nightly --budget full --no-promote

Without ``PREFECT_API_URL`` the flow runs in Prefect's ephemeral mode (a temporary local
server, state in ``PREFECT_HOME``); with it, the run is recorded on that server and shows
in its UI. Run it from any project folder that holds ``prompts/`` and ``datasets/`` (or
pass ``--prompts-dir``): the flows ship with the package. Exit code 1 when a spec failed
(the others are still published and in the table).

The terminal shows our work: a live progress display per stage and spec (elapsed time,
an estimate of what is left), each error as its reason (tracebacks go to the log), then
the summary table with each failed spec's reason and the night report's path.
Third-party output (vLLM, torch, Prefect, C-level writes to stderr) goes to
``<state_dir>/logs/nightly-<time>.log``, printed once; ``--verbose`` shows it instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from promptdistill.core.env import apply_defaults
from promptdistill.core.settings import DeclaredHelp, SettingsHelpFormatter
from promptdistill.pipeline.presets import BUDGET_PRESETS, DEFAULT_PRESET, LOCAL_PRESET

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser("nightly", help="run the nightly flow (profile if stale, distill, optimize, publish)",
                              formatter_class=SettingsHelpFormatter)
    p.add_argument("--specs", help="comma-separated spec names (default: every spec in --prompts-dir)")
    p.add_argument("--budget", choices=sorted(BUDGET_PRESETS), default=LOCAL_PRESET,
                   help="how much work per spec: " + "; ".join(f"{k}: {v}" for k, v in BUDGET_PRESETS.items())
                   + f" (default {LOCAL_PRESET}: this command runs on the machine at hand; the deployed flows "
                   f"and `promptdistill plan` default to {DEFAULT_PRESET})")
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-promote", action="store_true", help="publish as 'candidate' only; never move 'production'")
    p.add_argument("--no-distill", action="store_true", help="skip the distiller (optimize the instruction as written)")
    # Unset: the declared age, read in _run (its module loads pandas, which building the parser must not).
    p.add_argument("--ttft-max-age-hours", type=float,
                   help=DeclaredHelp("promptdistill.pipeline.ttft_models:TTFTFreshness", "max_age_hours"))
    # SUPPRESS: `promptdistill --verbose nightly` (the global flag) is not reset by this one's default.
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="show third-party output on the terminal instead of in the log file")
    p.set_defaults(func=_nightly)


def _nightly(args: argparse.Namespace) -> int:
    if args.config:
        os.environ["PROMPTDISTILL_CONFIG"] = args.config  # the flow reads the settings itself
    verbose = bool(getattr(args, "verbose", False))
    apply_defaults()
    # Imports in the functions keep the pipeline (rich, pandas, Prefect, vLLM) out of the CLI's start-up.
    from promptdistill.core.config import load_settings
    from promptdistill.pipeline.console import capture_output

    settings = load_settings()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    log_path = None if verbose else Path(settings.state_dir).resolve() / "logs" / f"nightly-{stamp}.log"
    if log_path is not None:
        print(f"third-party output (engine, libraries): {log_path}  (--verbose shows it here)", file=sys.stderr)
    # From here until the run ends, fds 1 and 2 point at the log: the imports below load
    # Prefect, torch and vLLM, whose import-time warnings belong there too.
    with capture_output(log_path, silence_at_exit=log_path is not None) as terminal:
        outcome, state = _run(args, terminal)
    return _report(outcome, state, settings.registry, log_path)


def _max_tokens(path: Any) -> int | None:
    """The spec's reply budget, for the progress estimate only: a spec that does not load, for
    whatever reason, gets the default, and the flow reports its error for that spec alone."""
    from promptdistill.specs.load import load_spec

    try:
        return load_spec(path).max_tokens
    except Exception:  # noqa: BLE001 - an estimate must never stop the night
        return None


def _run(args: argparse.Namespace, terminal: Any) -> tuple[Any, Any]:
    """Run the flow with the progress display on ``terminal``; returns (outcome, final state)."""
    from promptdistill.flows.nightly import nightly
    from promptdistill.pipeline.budgets import expected_minutes, stage_settings, ttft_expected_minutes
    from promptdistill.pipeline.console import ProgressDisplay, RunProgress, listening, plan_night
    from promptdistill.pipeline.jobs import select_spec_files
    from promptdistill.pipeline.ttft_models import TTFTFreshness

    params = stage_settings(args.budget, distill_instructions=not args.no_distill)
    max_age = TTFTFreshness.max_age_hours if args.ttft_max_age_hours is None else args.ttft_max_age_hours
    specs = [s.strip() for s in args.specs.split(",") if s.strip()] if args.specs else None
    reply_tokens = {p.stem: _max_tokens(p) for p in select_spec_files(args.prompts_dir, specs)}
    distill, budget = params["distill"], params["budget"]
    # The profile draws on every spec in the folder, not only the night's.
    ttft_minutes = ttft_expected_minutes(params["ttft_budget"], len(select_spec_files(args.prompts_dir, None)))
    steps = plan_night(list(reply_tokens), ttft_minutes=ttft_minutes,
                       distill_minutes=None if distill is None else
                       {name: expected_minutes("distill", distill.max_lm_calls, distill.max_minutes, tokens)
                        for name, tokens in reply_tokens.items()},
                       optimize_minutes={name: expected_minutes("optimize", budget.max_lm_calls, budget.max_minutes,
                                                                tokens) for name, tokens in reply_tokens.items()})
    # --verbose: library output shares the terminal, so plain lines instead of a live table.
    display = ProgressDisplay(RunProgress(steps), terminal, live=None if terminal.log_path else False)
    # After the imports above: Prefect's logging set-up replaces the root logger's handlers.
    # The flow's tasks emit each step's events (pipeline.events): they move the display on.
    with listening(_night_handler(display, terminal)), display:
        display.begin("start-up")
        state = nightly(specs=specs, preset=args.budget, distill_instructions=not args.no_distill,
                        prompts_dir=args.prompts_dir, seed=args.seed, allow_promotion=not args.no_promote,
                        ttft_max_age_hours=max_age, return_state=True)
    return state.result(raise_on_failure=False), state


def _night_handler(display: Any, terminal: Any) -> logging.Handler:
    """The progress display's log handler, where a failure reads as its reason, never a traceback.

    Prefect logs a failed task and a failed flow with their tracebacks; the log file has
    them (Prefect's own handler writes there). On the terminal, an error shows its message
    and, when it is not one of ours (a bug), where its traceback is; the flow's
    ``SpecsFailedError`` is left out: the summary that follows lists each failure's reason.
    """
    from promptdistill.core.errors import PromptDistillError
    from promptdistill.pipeline.console import ProgressHandler
    from promptdistill.pipeline.jobs import SpecsFailedError

    class NightHandler(ProgressHandler):
        def filter(self, record: logging.LogRecord) -> bool:
            exc = record.exc_info[1] if record.exc_info else None
            return not isinstance(exc, SpecsFailedError) and super().filter(record)

        def format(self, record: logging.LogRecord) -> str:
            exc = record.exc_info[1] if record.exc_info else None
            # A copy without the exception: the record itself still goes to other handlers.
            text = super().format(logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None}))
            if exc is not None and not isinstance(exc, PromptDistillError) and self.terminal.log_path is not None:
                text += f" (traceback in {self.terminal.log_path})"
            return text

    return NightHandler(display, terminal, echo=terminal.log_path is not None)


def _report(outcome: Any, state: Any, registry: str, log_path: Path | None) -> int:
    """Print the summary table, the night report's path and what failed; the exit code."""
    from promptdistill.core.errors import PromptDistillError
    from promptdistill.pipeline.jobs import SpecsFailedError
    from promptdistill.pipeline.report import format_summary_table, ttft_model_line

    summary = outcome.summary if isinstance(outcome, SpecsFailedError) else outcome
    see_log = f" (details in {log_path})" if log_path is not None else ""
    if not isinstance(summary, dict) or "rows" not in summary:  # the run failed before or between specs
        if isinstance(outcome, PromptDistillError):
            raise outcome
        reason = f"{type(outcome).__name__}: {outcome}" if isinstance(outcome, BaseException) else state.message
        print(f"nightly ended {state.name}: {reason}{see_log}", file=sys.stderr)
        return 1
    print(format_summary_table(summary["rows"]))
    print(f"\n{ttft_model_line(summary['ttft'])}")
    print(f"registry: {registry} (run logs under runs/{summary['run_id']}); load a template with "
          f"`Templates({registry!r}).get('NAME@production')`")
    if summary.get("report"):
        print(f"night report: {summary['report']}")
    else:
        print(f"night report: not built{see_log}; retry with `promptdistill report {summary['run_id']}`", file=sys.stderr)
    if summary["failed"]:
        print(f"failed: {', '.join(summary['failed'])}{see_log}", file=sys.stderr)
        return 1
    return 0

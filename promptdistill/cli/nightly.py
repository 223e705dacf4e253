"""``promptdistill nightly``: run the nightly Prefect flow here and print the summary table.

    promptdistill nightly                              # every spec, the 'quick' budget
    promptdistill nightly --specs ticket_triage,summarize --budget smoke
    promptdistill nightly --budget full --no-promote

Without ``PREFECT_API_URL`` the flow runs in Prefect's ephemeral mode (a temporary local
server, state in ``PREFECT_HOME``); with it, the run is recorded on that server and shows
in its UI. Run it from any project folder that holds ``prompts/`` and ``datasets/`` (or
pass ``--prompts-dir``): the flows ship with the package. Exit code 1 when a spec failed
(the others are still published and in the table).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from promptdistill.core.env import apply_defaults
from promptdistill.pipeline.presets import BUDGET_PRESETS

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser("nightly", help="run the nightly flow (profile if stale, distill, optimize, publish)")
    p.add_argument("--specs", help="comma-separated spec names (default: every spec in --prompts-dir)")
    p.add_argument("--budget", choices=sorted(BUDGET_PRESETS), default="quick",
                   help="how much work per spec: " + "; ".join(f"{k}: {v}" for k, v in BUDGET_PRESETS.items()))
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-promote", action="store_true", help="publish as 'candidate' only; never move 'production'")
    p.add_argument("--no-distill", action="store_true", help="skip the distiller (optimize the instruction as written)")
    p.add_argument("--ttft-max-age-hours", type=float, default=168.0, help="refresh an older TTFT model (default 168)")
    p.set_defaults(func=_nightly)


def _nightly(args: argparse.Namespace) -> int:
    if args.config:
        os.environ["PROMPTDISTILL_CONFIG"] = args.config  # the flow reads the settings itself
    # vLLM's start-up warnings (no tcmalloc, no Triton on CPU) would bury the summary
    # table on stdout; errors still show. Set before Prefect and vLLM are imported.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    apply_defaults()
    from promptdistill.core.config import load_settings
    from promptdistill.core.errors import PromptDistillError
    from promptdistill.flows.nightly import nightly
    from promptdistill.pipeline.budgets import budget_preset
    from promptdistill.pipeline.jobs import SpecsFailedError
    from promptdistill.pipeline.report import format_summary_table

    params: dict[str, Any] = dict(budget_preset(args.budget))
    if args.no_distill:
        params["distill"] = None
    specs = [s.strip() for s in args.specs.split(",") if s.strip()] if args.specs else None
    state = nightly(specs=specs, prompts_dir=args.prompts_dir, seed=args.seed, allow_promotion=not args.no_promote,
                    ttft_max_age_hours=args.ttft_max_age_hours, return_state=True, **params)
    outcome = state.result(raise_on_failure=False)
    summary = outcome.summary if isinstance(outcome, SpecsFailedError) else outcome
    if not isinstance(summary, dict) or "rows" not in summary:  # the run failed before or between specs
        if isinstance(outcome, PromptDistillError):
            raise outcome
        reason = f"{type(outcome).__name__}: {outcome}" if isinstance(outcome, BaseException) else state.message
        print(f"nightly ended {state.name}: {reason}", file=sys.stderr)
        return 1
    print(format_summary_table(summary["rows"]))
    print(f"\nTTFT model: {summary['ttft'].get('reason', '')}")
    registry = load_settings().registry
    print(f"registry: {registry} (run logs under runs/{summary['run_id']}); load a template with "
          f"`Templates({registry!r}).get('NAME@production')`")
    if summary["failed"]:
        print(f"failed: {', '.join(summary['failed'])}", file=sys.stderr)
        return 1
    return 0

"""``promptdistill report [RUN_ID]``: rebuild a nightly run's HTML night report from its stored files.

    promptdistill report                        # the newest run in the registry
    promptdistill report 20250101T020000Z-1a2b3c4d
    promptdistill report --list                 # the runs the registry holds

The report is built from the run's logs in the registry (``runs/<run_id>/``) and the
stage folders under the state folder, and stored beside the run logs
(``runs/<run_id>/report.html``); its path is printed. One page, no external assets: it
opens offline in any browser.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="rebuild a nightly run's HTML night report from its run logs")
    p.add_argument("run_id", nargs="?", help="the run (default: the newest run with a summary)")
    p.add_argument("--root", help="registry folder or fsspec URL (default: the configured [paths] registry)")
    p.add_argument("--list", action="store_true", help="list the registry's run ids, newest last")
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    # The pipeline (pandas, the registry) loads only when the command runs: `--help` stays instant.
    from promptdistill.core.config import load_settings
    from promptdistill.pipeline.night_report import latest_run_id, write_night_report
    from promptdistill.registry.store import Registry

    settings = load_settings(args.config)
    registry = Registry(args.root or settings.registry)
    if args.list:
        for run_id in registry.run_ids():
            print(run_id)
        return 0
    run_id = args.run_id or latest_run_id(registry)
    print(write_night_report(registry, run_id, state_dir=settings.state_dir))
    return 0

"""``promptdistill plan NAME``: what a spec's data can certify, before any LM call.

Prints the dataset's split sizes, the certify pool the search would race on, and, at
an assumed share of discordant records (a candidate and the baseline scoring
differently), the smallest quality drop that pool can certify and the records the
spec's own ``slo.max_quality_drop`` would need. The searches print the same plan with
the discordance they measured on the screen records.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="how many records a certified decision needs for a spec (no LM calls)")
    p.add_argument("name", help="spec name (prompts/NAME.yaml) or path")
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--discordance", type=float, default=0.2,
                   help="assumed share of records where candidate and baseline differ (default 0.2)")
    p.add_argument("--alpha", type=float, default=0.1, help="family-wise error rate of the race (default 0.1)")
    p.add_argument("--finalists", type=int, default=3, help="candidates raced (alpha is split among them; default 3)")
    p.add_argument("--screen", type=int, default=16, help="dev records used for screening (default 16)")
    p.add_argument("--dev", type=int, default=400, help="dev records the search may use (default 400)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from promptdistill.search.sequential import plan_records
    from promptdistill.search.splits import split_records
    from promptdistill.specs.load import load_spec

    spec = load_spec(args.name, prompts_dir=args.prompts_dir)
    splits = split_records(spec, seed=0, screen_size=args.screen, dev_size=args.dev, test_size=10**9)
    plan = plan_records(len(splits.certify), discordance=args.discordance, margin=spec.slo.max_quality_drop,
                        alpha=args.alpha / args.finalists)
    if args.json:
        print(json.dumps({"spec": spec.name, "splits": splits.sizes(), **asdict(plan)}, indent=2))
        return 0
    sizes = splits.sizes()
    print(f"{spec.name}: {sizes['train']} train, {sizes['screen']} screen + {sizes['certify']} certify dev, "
          f"{sizes['test']} test records")
    print(f"  {plan.sentence()}")
    return 0

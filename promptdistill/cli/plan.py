"""``promptdistill plan NAME``: what a spec's data can certify, before any LM call.

Prints the dataset's split sizes, the certify pool the night's race would run on (from
the budget preset: its screen and dev sizes, finalists and first look), and, at an
assumed share of discordant records (a candidate and the baseline scoring differently),
the smallest quality drop that pool certifies with 80% power and the records the spec's
own ``slo.max_quality_drop`` needs. The searches print the same plan at the upper 90%
bound of the discordance their screen records show.
"""

from __future__ import annotations

import argparse
import json

from promptdistill.core.settings import DeclaredHelp, SettingsHelpFormatter

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from promptdistill.pipeline.presets import BUDGET_PRESETS, DEFAULT_PRESET  # no pandas: the parser builds without the pipeline

    p = sub.add_parser("plan", help="how many records a certified decision needs for a spec (no LM calls)",
                       formatter_class=SettingsHelpFormatter)
    p.add_argument("name", help="spec name (prompts/NAME.yaml) or path")
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--budget", default=DEFAULT_PRESET, choices=list(BUDGET_PRESETS),
                   help="the night's preset whose race is planned (default %(default)s, as the deployed flows run)")
    p.add_argument("--discordance", type=float, default=None,
                   help=DeclaredHelp("promptdistill.search.sequential:PlanAssumption", "discordance"))
    p.add_argument("--alpha", type=float, default=None, help="family-wise error rate of the race (default: the preset's)")
    p.add_argument("--finalists", type=int, default=None,
                   help="most candidates raced in turn, alpha split among those the pool has room for "
                        "(default: the preset's)")
    p.add_argument("--dev", type=int, default=None, help="dev records the search may use (default: the preset's)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from promptdistill.pipeline.budgets import stage_settings
    from promptdistill.evaluate.evaluator import judge_cost
    from promptdistill.search.racing import RaceSettings, admitted_finalists, raceable, screen_pass_chance
    from promptdistill.search.sequential import PlanAssumption, group_sequential_power
    from promptdistill.search.splits import split_records
    from promptdistill.specs.load import load_spec

    spec = load_spec(args.name, prompts_dir=args.prompts_dir)
    stages = stage_settings(args.budget)
    budget, rule = stages["budget"], stages["selection"]
    alpha = rule.alpha if args.alpha is None else args.alpha
    finalists = rule.finalists if args.finalists is None else args.finalists
    dev = budget.dev_size if args.dev is None else args.dev
    splits = split_records(spec, seed=0, screen_size=budget.screen_size, dev_size=dev, test_size=10**9)
    discordance = PlanAssumption.discordance if args.discordance is None else args.discordance
    # The optimizer's calls left once the baseline and a candidate are screened, the test
    # verification of both held back.
    per_record = judge_cost(spec, 1)
    calls_left = budget.max_lm_calls - per_record * (2 * len(splits.screen) + 2 * min(len(splits.test), budget.test_size))
    knobs = replace(rule, alpha=alpha, finalists=raceable(finalists, calls_left, len(splits.certify), per_record))
    settings = RaceSettings.of(knobs, margin=spec.slo.max_quality_drop, discrete=spec.metric.discrete)
    admitted, plan = admitted_finalists(len(splits.certify), discordance=discordance, settings=settings,
                                        basis="assumed")
    if args.json:
        print(json.dumps({"spec": spec.name, "budget": args.budget, "splits": splits.sizes(),
                          "finalists_admitted": admitted, **asdict(plan)}, indent=2))
        return 0
    sizes = splits.sizes()
    print(f"{spec.name}: {sizes['train']} train, {sizes['screen']} screen + {sizes['certify']} certify dev, "
          f"{sizes['test']} test records ({args.budget} preset: up to {finalists} finalists raced in turn, "
          f"alpha {alpha:g})")
    print(f"  {admitted} finalist(s) at alpha {alpha:g} / {admitted} each: {plan.sentence()}")
    print(f"  discordance {discordance:.0%} is {'assumed' if args.discordance is None else 'given'} "
          "(--discordance sets it); a race plans from the upper 90% bound its screen records show")
    if plan.test == "group-sequential":  # the race's power is computed, not simulated
        screened = screen_pass_chance(len(splits.screen), discordance=discordance, margin=settings.margin)
        power = group_sequential_power(settings.margin, len(splits.certify), discordance, plan.alpha,
                                       settings.first_look)
        print(f"  end to end: a candidate exactly as good as the baseline passes the {len(splits.screen)}-record "
              f"screen {screened:.0%} of the time, and is then certified at {settings.margin:g} with "
              f"{power:.0%} power: {screened * power:.0%}")
    return 0

"""``promptdistill optimize NAME``: tune few-shot examples and density, verify, print a summary.

Instruction variants come from the distiller's finalists when it ran
(``STATE_DIR/distill/NAME-seedS``, written by ``promptdistill distill``) or from
``--distilled FOLDER``; otherwise only the original instruction is searched. The TTFT
model is the registry's for this engine (fitted by ``promptdistill ttft fit`` or the
nightly flow): one place, whoever fitted it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from promptdistill.cli.search_args import add_search_arguments, budget_values, flag_errors, open_search, stage_folder
from promptdistill.core.settings import SettingsHelpFormatter, add_setting_options, setting_values

__all__ = ["register"]

BUDGET = "promptdistill.optimize.run:OptimizeBudget"
RULE = "promptdistill.optimize.select:SelectionRule"
RULE_FLAGS = {"--ttft": "ttft", "--warm-share": "warm_share"}

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="tune few-shot examples and density against quality and predicted TTFT",
                       formatter_class=SettingsHelpFormatter)
    add_search_arguments(p, budget=BUDGET, race=RULE)
    p.add_argument("--distilled", help="the distiller's output folder (its finalists are the instruction variants)")
    add_setting_options(p, RULE, RULE_FLAGS)
    p.add_argument("--no-cache", action="store_true", help="do not use the LM result cache")
    p.add_argument("--out", help="output folder (default: STATE_DIR/optimize/NAME-seedS)")
    p.add_argument("--publish", action="store_true", help="publish the winner to the registry, labelled 'candidate'")
    p.set_defaults(func=_optimize)


def _budget(args: argparse.Namespace) -> Any:
    from promptdistill.optimize import OptimizeBudget, SelectionRule

    with flag_errors("optimize"):
        budget = OptimizeBudget(**budget_values(args))
        race = {k: v for k, v in dict(alpha=args.alpha, finalists=args.finalists).items() if v is not None}
        rule = SelectionRule(**race, **setting_values(args, RULE_FLAGS))
    return budget, rule


def _variants(args: argparse.Namespace, spec: Any, state_dir: Path) -> Any:
    from promptdistill.optimize import variants_from_parquet

    folder = Path(args.distilled) if args.distilled else stage_folder(state_dir, "distill", spec.name, args.seed)
    path = folder / "candidates.parquet"
    if path.is_file():
        print(f"instruction variants: the distiller's finalists in {folder}", file=sys.stderr)
        return variants_from_parquet(spec, path)
    if args.distilled:
        from promptdistill.core.errors import ConfigError

        raise ConfigError(f"optimize: --distilled: {path} does not exist")
    print(f"no distiller output in {folder}: searching the original instruction only "
          f"(run `promptdistill distill {spec.name}` first for density variants)", file=sys.stderr)
    return None


def _optimize(args: argparse.Namespace) -> int:
    from promptdistill.pipeline.publish import CANDIDATE_LABEL, publish_result
    from promptdistill.pipeline.session import open_engines
    from promptdistill.pipeline.stages import run_optimize
    from promptdistill.pipeline.ttft_models import load_ttft_model
    from promptdistill.registry.store import Registry

    settings, spec, out, cache = open_search(args, "optimize")
    budget, rule = _budget(args)
    variants = _variants(args, spec, settings.state_dir)
    registry = Registry(settings.registry)
    with open_engines(settings) as (engine, judge_engine):
        model = load_ttft_model(registry, engine.identity)
        print(f"optimizing {spec.name} on {engine.identity.model} (budget {budget.max_lm_calls} LM calls, "
              f"{budget.max_minutes:g} min; TTFT model {model.version} from {settings.registry})", file=sys.stderr)
        result = run_optimize(engine, spec, ttft_model=model, budget=budget, selection=rule, seed=args.seed, out_dir=out,
                              variants=variants, cache_path=cache, judge_engine=judge_engine)
    print(result.to_summary())
    print(f"\nwritten: {out} (candidates.parquet, result.json, pareto.png)")
    if args.publish:
        record, _ = publish_result(registry, result.to_json(), run_key=f"cli-{out.name}-{result.provenance['spec']['spec_hash'][:12]}",
                                   labels=(CANDIDATE_LABEL,))
        print(f"published {record.ref} (labelled {CANDIDATE_LABEL})")
    return 0

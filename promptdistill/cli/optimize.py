"""``promptdistill optimize NAME``: tune few-shot examples and density, verify, print a summary.

Instruction variants come from the distiller's candidate table when one exists
(``STATE_DIR/distill/NAME-seedS.parquet``, written by ``promptdistill distill``) or from
``--distilled PATH``; otherwise only the original instruction is searched. The TTFT
model is ``--ttft-model``, else the latest under ``artifacts/ttft/models`` or
``STATE_DIR/ttft/models``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from promptdistill.cli.search_args import add_search_arguments, budget_values

__all__ = ["register"]

MODEL_ROOTS = ("artifacts/ttft/models",)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="tune few-shot examples and density against quality and predicted TTFT")
    add_search_arguments(
        p, calls_help="most LM calls for the whole run (default 1200)",
        minutes_help="wall-clock limit of the run (default 8); the search shrinks to fit it",
        dev_help="dev records of the last rung (default 40)", test_help="held-out test records (default 40)",
    )
    p.add_argument("--ttft-model", help="TTFT model folder (or a root with a LATEST pointer)")
    p.add_argument("--distilled", help="the distiller's candidate Parquet (instruction variants)")
    p.add_argument("--objective", choices=("min_ttft", "quality_minus_lambda_ttft"), default="min_ttft")
    p.add_argument("--lam", type=float, default=0.0, help="quality per ms for quality_minus_lambda_ttft")
    p.add_argument("--ttft", choices=["expected", "warm", "cold"], default="expected",
                   help="which TTFT prediction the SLO and the objective use (default: expected, the mix below)")
    p.add_argument("--warm-share", type=float, default=0.8,
                   help="share of requests whose static prefix is cached, for the expected TTFT (default 0.8)")
    p.add_argument("--no-cache", action="store_true", help="do not use the LM result cache")
    p.add_argument("--out", help="output folder (default: STATE_DIR/optimize/NAME-seedS)")
    p.add_argument("--publish", action="store_true", help="publish the winner to the registry, labelled 'candidate'")
    p.set_defaults(func=_optimize)


def _budget(args: argparse.Namespace) -> Any:
    from promptdistill.errors import ConfigError
    from promptdistill.optimize import OptimizeBudget, SelectionRule

    try:
        budget = OptimizeBudget(**budget_values(args))
        rule = SelectionRule(objective=args.objective, lam_per_ms=args.lam, ttft=args.ttft,
                             warm_share=args.warm_share)
    except ValueError as e:
        raise ConfigError(f"optimize: {e}") from None
    return budget, rule


def find_ttft_model(explicit: str | None, state_dir: Path) -> Path:
    """The TTFT model folder to use, or ConfigError saying how to make one."""
    from promptdistill.errors import ConfigError

    if explicit:
        return Path(explicit)
    for root in (*MODEL_ROOTS, str(state_dir / "ttft" / "models")):
        path = Path(root)
        if (path / "LATEST").is_file() or (path / "model.json").is_file():
            return path
    raise ConfigError(
        f"optimize: no fitted TTFT model in {', '.join(MODEL_ROOTS)} or {state_dir / 'ttft' / 'models'}; "
        "run `promptdistill ttft profile` and `promptdistill ttft fit`, or pass --ttft-model PATH"
    )


def _variants(args: argparse.Namespace, spec: Any, state_dir: Path) -> Any:
    from promptdistill.optimize import variants_from_parquet

    path = Path(args.distilled) if args.distilled else state_dir / "distill" / f"{spec.name}-seed{args.seed}.parquet"
    if path.is_file():
        print(f"instruction variants from {path}", file=sys.stderr)
        return variants_from_parquet(spec, path)
    if args.distilled:
        from promptdistill.errors import ConfigError

        raise ConfigError(f"optimize: --distilled: {path} does not exist")
    print(f"no distiller output at {path}: searching the original instruction only "
          f"(run `promptdistill distill {spec.name}` first for density variants)", file=sys.stderr)
    return None


def _optimize(args: argparse.Namespace) -> int:
    from promptdistill.config import load_settings
    from promptdistill.engine import load_engine
    from promptdistill.lm_cache import CachedEngine
    from promptdistill.optimize import optimize
    from promptdistill.specs import load_spec
    from promptdistill.ttft.model import TTFTModel

    settings = load_settings(args.config)
    spec = load_spec(args.name, prompts_dir=args.prompts_dir)
    budget, rule = _budget(args)
    model_path = find_ttft_model(args.ttft_model, settings.state_dir)
    variants = _variants(args, spec, settings.state_dir)
    out = Path(args.out) if args.out else settings.state_dir / "optimize" / f"{spec.name}-seed{args.seed}"
    with load_engine(settings.engine) as engine:
        model = TTFTModel.load(model_path, engine_identity=engine.identity)
        lm = engine if args.no_cache else CachedEngine(engine, settings.state_dir / "lm_cache.sqlite")
        print(f"optimizing {spec.name} on {engine.identity.model} (budget {budget.max_lm_calls} LM calls, "
              f"{budget.max_minutes:g} min; TTFT model {model.version})", file=sys.stderr)
        try:
            result = optimize(lm, spec, ttft_model=model, budget=budget, seed=args.seed,
                              distill_candidates=variants, selection=rule)
        finally:
            if isinstance(lm, CachedEngine):
                lm.close()
    paths = result.write(out)
    print(result.to_summary())
    print(f"\nwritten: {paths['candidates'].parent} (candidates.parquet, result.json, pareto.png)")
    if args.publish:
        from promptdistill.registry import Registry

        record = result.publish(Registry(settings.registry), labels=("candidate",))
        print(f"published {record.ref} (labelled candidate)")
    return 0

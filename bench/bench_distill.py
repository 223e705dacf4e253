"""Instruction distillation on the bundled specs: what pruning and rewriting buy here.

For each spec: instruction tokens before and after, dev and held-out test quality before
and after, the judges' valid share, repairs and swap consistency, how often the
necessity judge agreed with ablation, and (programmatic metrics) how often
``answer_equivalence`` agreed with the metric, with the majority-class rate and kappa
beside it. LM results are cached in the state dir, so a re-run costs no LM calls.

The distiller runs with a budget preset's settings (``--budget``, default ``full``: the
library defaults; the flags below replace single settings), with its own race on and every
clause ablated: the nightly's presets leave the race to the optimizer, and this benchmark
measures the distiller's decision and the judge against ablation.

Usage:
    python -m bench.bench_distill [ticket_triage word_problems ...] [--budget full] [--budget-calls 600]
        [--dev 24] [--test 24] [--seed 0]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from bench.common import bundled_specs, setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.core.display import format_number  # noqa: E402
from promptdistill.pipeline.presets import BUDGET_PRESETS, DEFAULT_PRESET  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", help="spec names (default: every spec in prompts/)")
    parser.add_argument("--budget", default=DEFAULT_PRESET, choices=list(BUDGET_PRESETS),
                        help=f"budget preset whose distiller settings are used (default {DEFAULT_PRESET})")
    parser.add_argument("--budget-calls", type=int, help="max_lm_calls (default: the preset's)")
    parser.add_argument("--budget-minutes", type=float, help="max_minutes (default: the preset's)")
    parser.add_argument("--dev", type=int, help="dev records: screen, then the race's pool (default: the preset's)")
    parser.add_argument("--test", type=int, help="test records (default: the preset's)")
    parser.add_argument("--screen", type=int, help="screen records (default: the preset's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.specs = args.specs or bundled_specs()

    from promptdistill.cli.distill import format_result
    from promptdistill.cli.search_args import stage_folder
    from promptdistill.distill import distill
    from promptdistill.pipeline.budgets import budget_preset
    from promptdistill.engine import load_engine
    from promptdistill.engine.cache import CachedEngine
    from promptdistill.pipeline.stages import lm_cache_path
    from promptdistill.specs.load import load_spec

    settings = load_settings()
    # ablate_clear: the agreement column needs every clause ablated, not only the judge's unsure ones.
    given = {"max_lm_calls": args.budget_calls, "max_minutes": args.budget_minutes, "dev_size": args.dev,
             "test_size": args.test, "screen_size": args.screen}
    config = replace(budget_preset(args.budget)["distill"], seed=args.seed, race=True, ablate_clear=True,
                     **{k: v for k, v in given.items() if v is not None})
    rows, judges = [], {}
    with load_engine(settings.engine) as engine:
        cached = CachedEngine(engine, lm_cache_path(settings.state_dir))
        for name in args.specs:
            spec = load_spec(name)
            real_before = cached.real_calls
            result = distill(cached, spec, config=config)
            result.write(stage_folder(settings.state_dir, "distill", name, args.seed))  # where `optimize` looks
            print(f"\n===== {name}")
            print(format_result(result))
            row = result.summary()
            row["real_lm_calls"] = cached.real_calls - real_before
            row["calibration"] = result.calibration
            rows.append(row)
            judges[name] = result.judge_stats
        cached.close()

    lines = ["| spec | tokens | reduction | decision | test | judge/ablation agree | equivalence/metric agree (kappa) "
             "| LM calls |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cal = r["calibration"] or {}
        agree = "-" if cal.get("agreement_rate") is None else f"{cal['agreement_rate']:.2f} ({_f(cal.get('kappa'))})"
        lines.append(
            f"| {r['spec']} | {r['original_tokens']} -> {r['winner_tokens']} | {100 * r['token_reduction']:.0f}% | "
            f"{r['decision']['verdict']} | {_f(r.get('test_original_mean'))} -> {_f(r.get('test_winner_mean'))} | "
            f"{_f(r['agreement_rate'])} | {agree} | {r['total_lm_calls']} |"
        )
    markdown = "\n".join(lines)
    print("\n" + markdown)
    write_report("distill", {"budget": args.budget,
                             "config": {k: getattr(config, k) for k in ("seed", "max_lm_calls", "dev_size", "test_size",
                                                                         "screen_size", "max_rounds", "alpha")},
                             "specs": rows, "judges": judges}, markdown)


def _f(value: Any, spec: str = ".3f") -> str:
    return format_number(value, spec)


if __name__ == "__main__":
    main()

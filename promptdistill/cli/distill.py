"""``promptdistill distill NAME``: distill a spec's instruction and print what happened.

Prints the per-clause table (text, judge score, ablation delta, kept or pruned), the
candidates, the winner with its token reduction and quality deltas, the judges'
statistics and calibration, and writes everything to Parquet.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from promptdistill.cli.search_args import add_search_arguments, budget_values, flag_errors, open_search
from promptdistill.core.display import format_number
from promptdistill.core.settings import SettingsHelpFormatter, add_setting_options, setting_values

__all__ = ["register"]

CONFIG = "promptdistill.distill.loop:DistillConfig"
CONFIG_FLAGS = {"--rounds": "max_rounds"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="prune and rewrite a spec's instruction; print clauses, candidates, winner",
                       formatter_class=SettingsHelpFormatter)
    add_search_arguments(p, budget=CONFIG, race=CONFIG)
    add_setting_options(p, CONFIG, CONFIG_FLAGS)
    p.add_argument("--no-ablation", action="store_true", help="score clauses with the judge only")
    p.add_argument("--ablate-clear", action="store_true",
                   help="ablate every clause; by default only those the judge scored 2-4 (or could not score). "
                        "No effect with --no-ablation")
    p.add_argument("--no-rewrite", action="store_true", help="prune only; skip distill_rewrite")
    p.add_argument("--no-calibrate", action="store_true", help="skip the judge-vs-metric calibration")
    p.add_argument("--no-cache", action="store_true", help="do not use the LM result cache")
    p.add_argument("--out", help="output folder (default: STATE_DIR/distill/NAME-seedS; `optimize` reads it)")
    p.set_defaults(func=_distill)


def _config(args: argparse.Namespace) -> Any:
    from promptdistill.distill import DistillConfig

    values = budget_values(args, seed=args.seed, alpha=args.alpha, finalists=args.finalists,
                           **setting_values(args, CONFIG_FLAGS))
    values.update(ablation=not args.no_ablation, ablate_clear=args.ablate_clear, rewrite=not args.no_rewrite,
                  calibrate=not args.no_calibrate)
    with flag_errors("distill"):
        return DistillConfig(**values)


def _distill(args: argparse.Namespace) -> int:
    from promptdistill.pipeline.session import open_engines
    from promptdistill.pipeline.stages import run_distill

    settings, spec, out, cache = open_search(args, "distill")
    config = _config(args)
    _log_progress()
    with open_engines(settings) as (engine, judge_engine):
        print(f"distilling {spec.name} on {engine.identity.model} (budget {config.max_lm_calls} LM calls, "
              f"{config.max_minutes:g} min; dev {config.dev_size} (screen {config.screen_size}), "
              f"test {config.test_size}, alpha {config.alpha:g}"
              + (f"; judge {judge_engine.identity.model}" if judge_engine else "") + ")", file=sys.stderr)
        result, path = run_distill(engine, spec, config=config, out_dir=out, cache_path=cache, judge_engine=judge_engine)
    print(format_result(result))
    print(f"\nwritten: {path}")
    return 0


def _log_progress() -> None:
    """The loop's progress lines and the LM cache's counts on stderr (our loggers only, not vLLM's)."""
    import logging

    for name in ("promptdistill.distill", "promptdistill.pipeline.stages"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("  [distill %(asctime)s] %(message)s", "%H:%M:%S"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False


def _cut(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def format_result(result: Any) -> str:
    """The report ``promptdistill distill`` prints."""
    lines = ["", "Clauses (ablation '-': not ablated; by default only those the judge scored 2-4 or not at all are, "
                 "see --ablate-clear)"]
    lines.append(f"  {'rnd':>3} {'id':<4} {'prot':<4} {'judge':>5} {'ablation':>8} {'kept':<6} text")
    for r in result.clause_rows:
        judge = str(r["judge_score"]) if r["judge_score"] is not None else ("inv" if r["judge_error"] else "-")
        lines.append(f"  {r['round']:>3} {r['clause_id']:<4} {'P' if r['protected'] else '':<4} {judge:>5} "
                     f"{format_number(r['ablation_delta'], '+.3f'):>8} {'kept' if r['kept'] else 'pruned':<6} {_cut(r['text'], 70)}")
    lines += ["", "Candidates (scr: screen records; race: certify records; bounds: anytime-valid, vs the original)"]
    lines.append(f"  {'id':<34} {'tokens':>6} {'density':>7} {'scr':>5} {'race':>4} {'mean':>6} {'bounds':>15}  verdict")
    for r in result.candidate_rows():
        mark = " <- winner" if r["winner"] else ""
        bounds = "" if r["diff_lower"] is None else f"[{r['diff_lower']:+.3f},{r['diff_upper']:+.3f}]"
        lines.append(f"  {_cut(r['candidate_id'], 34):<34} {r['instruction_tokens']:>6} {format_number(r['density'], '.2f'):>7} "
                     f"{format_number(r['screen_mean'], '.2f'):>5} {r['race_n']:>4} {format_number(r['race_mean'], '.3f'):>6} {bounds:>15}  "
                     f"{r['verdict']}{mark}")
    s = result.summary()
    lines += [
        "",
        f"Plan: {s['plan_text']}",
        f"Winner: {result.winner.id}",
        f"  {result.reason}",
        f"  instruction tokens {s['original_tokens']} -> {s['winner_tokens']} "
        f"({100 * s['token_reduction']:.1f}% fewer; allowed quality drop {result.max_quality_drop:g})",
        f"  test quality {format_number(s.get('test_original_mean'), '.3f')} [{format_number(s.get('test_original_ci_low'), '.3f')}, "
        f"{format_number(s.get('test_original_ci_high'), '.3f')}] -> {format_number(s.get('test_winner_mean'), '.3f')} "
        f"[{format_number(s.get('test_winner_ci_low'), '.3f')}, {format_number(s.get('test_winner_ci_high'), '.3f')}] "
        f"on {s.get('test_original_n') or 0} held-out records",
        f"  judge/ablation agreement on necessary clauses (those ablated): {format_number(s['agreement_rate'], '.2f')}",
        f"  rounds {s['rounds']}, stopped: {s['stop_reason']}",
        f"  LM calls: search {s['search_lm_calls']}, total {s['total_lm_calls']} of {s['budget_lm_calls']}; "
        f"{s['elapsed_s']:.0f} s",
        "", "Winner text:", *["  " + line for line in result.winner.text.splitlines()],
        "", "Judges",
        f"  {'judge':<20} {'items':>5} {'calls':>5} {'valid':>6} {'repairs':>7} {'swap':>5} {'prompt_tok':>10} {'compl_tok':>9}",
    ]
    for j in result.judge_stats:
        lines.append(f"  {j['judge']:<20} {j['items']:>5} {j['calls']:>5} {format_number(j['valid_share'], '.2f'):>6} "
                     f"{j['repairs']:>7} {format_number(j['swap_consistency'], '.2f'):>5} {j['prompt_tokens']:>10} "
                     f"{j['completion_tokens']:>9}")
    cal = result.calibration
    if cal:
        flag = "  BELOW A COIN FLIP" if cal.get("below_coin_flip") else ""
        lines += ["", "Calibration of answer_equivalence against the metric (baseline screen replies vs expected)",
                  f"  agreement {format_number(cal['agreement_rate'], '.2f')} on {cal['n_valid']} of {cal['n']} records "
                  f"(majority-class rate {format_number(cal['majority_rate'], '.2f')}, kappa {format_number(cal['kappa'], '+.2f')}, "
                  f"swap consistency {format_number(cal['swap_consistency'], '.2f')}){flag}"]
    return "\n".join(lines)

"""The optimizer on the bundled specs, run as the nightly runs it: what it picks and what it costs.

Per spec, the distiller then the optimizer with a budget preset (``quick`` by default,
what ``make run`` uses), through the same pipeline stages as the flow
(:mod:`promptdistill.pipeline.stages`), on the same LM cache. Reported per spec:

* the outcome: the winner, or the baseline with the reason in numbers; the decision's
  anytime-valid bounds on the quality difference and the certify records it took; the
  record plan (what the pool could certify at the measured discordance);
* test quality of baseline and winner with 95% intervals (the held-out split);
* instruction and prompt tokens, measured cold and warm TTFT, before and after;
* the cost: LM calls, tokens processed, minutes.

The TTFT model comes from the registry (``bench_ttft_model`` or the nightly puts it there).

Usage:
    python -m bench.bench_optimize [ticket_triage ...] [--budget quick] [--seed 0] [--no-distill]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench.common import bundled_specs, commit, progress, setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402 - after the process defaults
from promptdistill.core.display import format_number  # noqa: E402
from promptdistill.engine import load_engine  # noqa: E402
from promptdistill.optimize.select import SelectionRule  # noqa: E402
from promptdistill.pipeline.budgets import budget_preset  # noqa: E402
from promptdistill.pipeline.presets import BUDGET_PRESETS, LOCAL_PRESET  # noqa: E402
from promptdistill.pipeline.jobs import prepare_job  # noqa: E402
from promptdistill.pipeline.stages import distill_stage, lm_cache_path, optimize_stage, result_figures  # noqa: E402
from promptdistill.pipeline.ttft_models import load_ttft_model  # noqa: E402
from promptdistill.pipeline.publish import promote_and_publish  # noqa: E402
from promptdistill.registry.store import Registry  # noqa: E402
from promptdistill.search.selection import SelectionRecord  # noqa: E402


def run_spec(engine: Any, name: str, preset: dict[str, Any], model: Any, state: Path, seed: int,
             distill_first: bool, publish_to: Registry | None = None) -> dict[str, Any]:
    job = prepare_job(Path("prompts") / f"{name}.yaml")
    cache = lm_cache_path(state)
    started = time.monotonic()
    distilled = None
    if distill_first:
        progress(f"[{name}] distill")
        distilled = distill_stage(engine, job, config=preset["distill"], seed=seed,
                                  out_dir=state / "bench" / "distill" / name, cache_path=cache)
    progress(f"[{name}] optimize")
    result = optimize_stage(engine, job, ttft_model=model, budget=preset["budget"],
                            selection=preset.get("selection", SelectionRule()),
                            seed=seed, distilled=distilled, out_dir=state / "bench" / "optimize" / name,
                            cache_path=cache)
    minutes = (time.monotonic() - started) / 60.0
    if publish_to is not None:  # as the nightly publishes: production moves only to a certified winner
        record, _, decision = promote_and_publish(publish_to, result, run_key=f"bench-optimize-{commit()}-{name}",
                                                  allow_promotion=True)
        progress(f"[{name}] published {record.ref}: {decision.reason}")
    figures = result_figures(result)
    b, w = result["baseline"], result["winner"]
    decision = w.get("decision") or {}
    selection = SelectionRecord.from_result(result)
    row = {
        "spec": name, "winner": selection.winner, "kept_baseline": selection.kept, "clause": selection.clause,
        "reverted_from": selection.reverted_from,
        "reason": selection.reason, "plan": result.get("plan_text"), "margin": result["max_quality_drop"],
        # Kept: the records the race spent on its finalists (the baseline was scored on all of them).
        "race_records": decision.get("n") if not selection.kept else b.get("race_n", 0),
        "diff_lower": decision.get("lower"), "diff_upper": decision.get("upper"),
        "alpha": decision.get("alpha"), "warm_share": result["warm_share"],
        "warm_share_source": result["warm_share_source"], "minutes": round(minutes, 2),
        "lm_calls": result["lm_calls"] + (distilled["summary"]["total_lm_calls"] if distilled else 0),
        "tokens_processed": figures["tokens_processed"] + (distilled["summary"]["tokens_processed"] if distilled else 0),
        "distill_winner": distilled["summary"]["winner"] if distilled else None,
    }
    for who, figs in (("baseline", b), ("winner", w)):
        for key in ("instruction_tokens", "total_tokens", "test_mean", "test_ci_low", "test_ci_high", "test_n",
                    "measured_cold_ms", "measured_warm_ms", "ttft_cold_ms", "ttft_warm_ms", "predicted_cold_ms",
                    "predicted_warm_ms", "static_cached_share", "static_cached_share_predicted", "timing_n",
                    "timing_repeats"):
            row[f"{who}_{key}"] = figs.get(key)
    for cache in ("cold", "warm", "expected"):  # measured winner - baseline, interleaved, with its interval
        row[f"ttft_{cache}_diff_ms"] = w.get(f"measured_{cache}_diff_ms")
        row[f"ttft_{cache}_diff_ci"] = [w.get(f"measured_{cache}_diff_low_ms"), w.get(f"measured_{cache}_diff_high_ms")]
    row["timing_interval"], row["timing_requests"] = w.get("timing_interval"), result.get("timing_requests")
    row["test_diff_mean"], row["test_diff_ci"] = w.get("test_diff_mean"), [w.get("test_diff_ci_low"),
                                                                           w.get("test_diff_ci_high")]
    progress(f"[{name}] {row['winner']}: {row['reason']}")
    return row


def _f(value: Any, spec: str = ".3f") -> str:
    return format_number(value, spec)


def _change(a: Any, b: Any) -> str:
    if a is None or b is None or not a:
        return ""
    return f" ({100 * (b - a) / a:+.0f}%)"


def _ttft(r: dict[str, Any], cache: str) -> str:
    """``baseline (pred) -> winner (pred)``; a kept baseline is one measurement, shown once."""
    def side(who: str) -> str:
        return f"{_f(r[f'{who}_measured_{cache}_ms'], '.0f')} ({_f(r[f'{who}_predicted_{cache}_ms'], '.0f')})"
    if r["kept_baseline"]:
        return f"{side('baseline')} kept"
    return (f"{side('baseline')} -> {side('winner')}"
            f"{_change(r[f'baseline_measured_{cache}_ms'], r[f'winner_measured_{cache}_ms'])}")


def _diff(r: dict[str, Any], cache: str) -> str:
    low, high = r[f"ttft_{cache}_diff_ci"]
    if r[f"ttft_{cache}_diff_ms"] is None:
        return "-"
    return f"{_f(r[f'ttft_{cache}_diff_ms'], '+.0f')} [{_f(low, '+.0f')}, {_f(high, '+.0f')}]"


def markdown(rows: list[dict[str, Any]], preset_name: str) -> str:
    lines = [f"# Optimization outcome per bundled spec (`{preset_name}` budget: distiller, then optimizer)", "",
             "| spec | outcome | margin | certify records | bound on the drop | instruction tokens | "
             "cold TTFT ms, measured (predicted) | warm TTFT ms, measured (predicted) | measured difference "
             "[95% CI], cold / warm | static prefix cached (warm) | test quality [95% CI] | LM calls | tokens | minutes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        outcome = (f"baseline kept ({r['reverted_from']} reverted on test)" if r.get("reverted_from") else
                   "baseline kept" if r["kept_baseline"] else f"{r['clause']}: {r['winner']}")
        lines.append(
            f"| {r['spec']} | {outcome} | {r['margin']:g} | {_f(r['race_records'], 'd')} | "
            f"{_f(r['diff_lower'], '+.3f')} | "
            f"{_f(r['baseline_instruction_tokens'], '.0f')} -> {_f(r['winner_instruction_tokens'], '.0f')}"
            f"{_change(r['baseline_instruction_tokens'], r['winner_instruction_tokens'])} | "
            f"{_ttft(r, 'cold')} | {_ttft(r, 'warm')} | {_diff(r, 'cold')} / {_diff(r, 'warm')} | "
            f"{_f(r['baseline_static_cached_share'], '.0%')}"
            f"{'' if r['kept_baseline'] else ' -> ' + _f(r['winner_static_cached_share'], '.0%')} | "
            f"{_f(r['baseline_test_mean'])} [{_f(r['baseline_test_ci_low'])}, {_f(r['baseline_test_ci_high'])}] -> "
            f"{_f(r['winner_test_mean'])} [{_f(r['winner_test_ci_low'])}, {_f(r['winner_test_ci_high'])}] "
            f"(n={_f(r['winner_test_n'], 'd')}) | {r['lm_calls']} | {r['tokens_processed']} | {r['minutes']:.1f} |")
    lines += ["", "Why, per spec:", ""] + [f"- **{r['spec']}**: {r['reason']}" for r in rows]
    lines += ["", "TTFT: measured on the first test records, baseline and winner interleaved (alternating which goes "
              "first, so drift and contention hit both); the difference is the median of the paired differences with a "
              "95% percentile-bootstrap interval over the pairs, resampled within each record. Timing requests per spec: "
              + ", ".join(f"{r['spec']} {r['timing_requests']} ({_f(r['baseline_timing_n'], 'd')} records x "
                          f"{_f(r['baseline_timing_repeats'], 'd')} repeats)" for r in rows) + "."]
    total = sum(r["minutes"] for r in rows)
    lines.append(f"\nTotal: {total:.1f} minutes for {len(rows)} specs (engine start and TTFT model not included).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", help="spec names (default: every spec in prompts/)")
    parser.add_argument("--budget", default=LOCAL_PRESET, choices=list(BUDGET_PRESETS),
                        help=f"budget preset (default {LOCAL_PRESET}, what `make run` runs)")
    parser.add_argument("--no-distill", action="store_true", help="optimize the instruction as written")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--publish", action="store_true",
                        help="publish each result to the configured registry as the nightly does (bench_load compares "
                             "the published winner with the baseline at load)")
    args = parser.parse_args(argv)
    specs = args.specs or bundled_specs()
    settings = load_settings()
    preset = budget_preset(args.budget)
    rows = []
    with load_engine(settings.engine) as engine:
        model = load_ttft_model(Registry(settings.registry), engine.identity)
        for name in specs:
            rows.append(run_spec(engine, name, preset, model, Path(settings.state_dir), args.seed, not args.no_distill,
                                 Registry(settings.registry) if args.publish else None))
    result = {"budget": args.budget, "specs": rows, "total_minutes": round(sum(r["minutes"] for r in rows), 2)}
    write_report("optimize", result, markdown(rows, args.budget))
    return result


if __name__ == "__main__":
    main()

"""The optimizer on the bundled specs: what it costs and what it picks.

For each spec: minutes and LM calls (and how many the cache could not answer), the
candidates searched and how far successive halving took them, the winner (or why the
baseline was kept), dev/test quality of baseline and winner, predicted vs measured TTFT
cold and warm, the valid-JSON rate of free text / schema in the prompt / constrained
decoding, and the token budget. Instruction variants come from the distiller's tables
in the state dir when present (`promptdistill distill`); otherwise the distiller runs first
with the nightly's quick budget, as the flow does (`--no-distill` skips it). This is how the nightly budget is sized: the nightly
flow runs every spec, and the target is about 20-30 minutes for all of them.

Usage:
    python -m bench.bench_optimize [ticket_triage ...] [--budget-calls 1200] [--budget-minutes 8]
        [--dev 40] [--test 40] [--ttft-model artifacts/ttft/models] [--seed 0] [--no-distill]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from bench.common import bundled_specs, write_report  # noqa: E402
from promptdistill.core.config import load_settings  # noqa: E402

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", help="spec names (default: every spec in prompts/)")
    parser.add_argument("--budget-calls", type=int, default=1200)
    parser.add_argument("--budget-minutes", type=float, default=8.0)
    parser.add_argument("--dev", type=int, default=40, help="dev records of the last rung")
    parser.add_argument("--test", type=int, default=40, help="held-out test records")
    parser.add_argument("--ttft-model", default=None)
    parser.add_argument("--no-distill", action="store_true",
                        help="optimize the instruction as written (default: distill first, as the nightly flow does)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.specs = args.specs or bundled_specs()

    from promptdistill.cli.optimize import find_ttft_model
    from promptdistill.distill import distill
    from promptdistill.pipeline import budget_preset
    from promptdistill.engine import load_engine
    from promptdistill.engine.cache import CachedEngine
    from promptdistill.optimize import OptimizeBudget, optimize, variants_from_parquet
    from promptdistill.specs import load_spec
    from promptdistill.ttft.model import TTFTModel

    settings = load_settings()
    budget = OptimizeBudget(max_lm_calls=args.budget_calls, max_minutes=args.budget_minutes, dev_size=args.dev,
                            test_size=args.test)
    rows = []
    with load_engine(settings.engine) as engine:
        model = TTFTModel.load(find_ttft_model(args.ttft_model, settings.state_dir), engine_identity=engine.identity)
        for name in args.specs:
            spec = load_spec(name)
            distilled = settings.state_dir / "distill" / f"{name}-seed{args.seed}.parquet"
            variants = variants_from_parquet(spec, distilled) if distilled.is_file() else None
            cached = CachedEngine(engine, settings.state_dir / "lm_cache.sqlite")
            started = time.monotonic()
            try:
                if variants is None and not args.no_distill:  # as the nightly flow: distill, then optimize
                    config = budget_preset("quick")["distill"]
                    print(f"[{name}] distill (quick budget)", flush=True)
                    variants = distill(cached, spec, config=dataclasses.replace(config, seed=args.seed))
                result = optimize(cached, spec, ttft_model=model, budget=budget, seed=args.seed,
                                  distill_candidates=variants)
            finally:
                cached.close()
            total_minutes = (time.monotonic() - started) / 60.0
            result.write(settings.state_dir / "optimize" / f"{name}-seed{args.seed}")
            print(result.to_summary(), flush=True)
            fmt = {r.format: r.valid_json_rate for r in result.formats.itertuples()} if not result.formats.empty else {}
            b, w = result.baseline, result.winner
            rows.append({
                "spec": name, "minutes": round(total_minutes, 2), "optimize_minutes": round(result.minutes, 2),
                "lm_calls": result.lm_calls,
                "real_lm_calls": result.real_lm_calls, "timing_requests": result.timing_requests,
                "candidates": int(len(result.candidates)),
                "complete": int(result.candidates["complete"].sum()), "variants": int(result.candidates["variant"].nunique()),
                "winner": result.winner_id, "kept_baseline": result.kept_baseline, "reason": result.reason,
                "stop": result.stop_reason,
                "baseline_instruction_tokens": b.get("instruction_tokens"),
                "winner_instruction_tokens": w.get("instruction_tokens"),
                "baseline_total_tokens": b.get("total_tokens"), "winner_total_tokens": w.get("total_tokens"),
                **{f"baseline_{k}": b.get(k) for k in ("dev_mean", "test_mean", "ttft_warm_ms", "measured_warm_ms",
                                                      "measured_cold_ms", "ttft_cold_ms")},
                **{f"winner_{k}": w.get(k) for k in ("dev_mean", "test_mean", "ttft_warm_ms", "measured_warm_ms",
                                                    "measured_cold_ms", "ttft_cold_ms", "test_equivalence")},
                "max_tokens": result.token_budget.max_tokens, "truncation_rate": result.token_budget.truncation_rate,
                **{f"valid_{k}": v for k, v in fmt.items()},
            })
    total = sum(r["minutes"] for r in rows)
    lines = ["| spec | min | LM calls | winner | instruction tokens | prompt tokens | cold TTFT meas. ms | "
             "warm TTFT meas. ms | test quality | valid free/prompt/constr |", "|---|---|---|---|---|---|---|---|---|---|"]

    def f(v: object, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        lines.append(
            f"| {r['spec']} | {r['minutes']:.1f} | {r['lm_calls']} | {r['winner']} | "
            f"{f(r['baseline_instruction_tokens'], '.0f')} -> {f(r['winner_instruction_tokens'], '.0f')} | "
            f"{f(r['baseline_total_tokens'], '.0f')} -> {f(r['winner_total_tokens'], '.0f')} | "
            f"{f(r['baseline_measured_cold_ms'], '.0f')} -> {f(r['winner_measured_cold_ms'], '.0f')} | "
            f"{f(r['baseline_measured_warm_ms'], '.0f')} -> {f(r['winner_measured_warm_ms'], '.0f')} | "
            f"{f(r['baseline_test_mean'])} -> {f(r['winner_test_mean'])} | "
            f"{f(r.get('valid_free'))}/{f(r.get('valid_schema_in_prompt'))}/{f(r.get('valid_constrained'))} |")
    lines.append(f"\nTotal: {total:.1f} minutes for {len(rows)} specs.")
    write_report("optimize", {"specs": rows, "total_minutes": total, "budget": budget.to_dict()}, "\n".join(lines))


if __name__ == "__main__":
    main()

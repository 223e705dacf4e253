"""TTFT models: held-out accuracy of the chosen model, by backend.

Profiles the engine (in-process, and a vLLM server with ``--server``) within a time
budget, fits the candidate models with grouped cross-validation, and prints the chosen
model's held-out MAPE, R² and p50/p95 absolute error per backend, plus every
candidate's scores. Targets: held-out MAPE of 10% or better on the CPU engine (5% the
goal). The rows left out as measured under CPU contention are counted in the output.
Each profiled backend's model is published to the registry (``ttft-model/<engine key>``),
where the optimizer benchmarks, ``promptdistill optimize`` and the nightly look for it.

Usage:
    python -m bench.bench_ttft_model [--budget-s 420] [--points 40] [--repeats 2] [--server]
    python -m bench.bench_ttft_model --profiles artifacts/ttft/profiles   # fit existing profiles only
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bench.common import setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.engine import load_engine, resolve_model  # noqa: E402
from promptdistill.pipeline.ttft_models import fit_and_publish  # noqa: E402
from promptdistill.registry.store import Registry  # noqa: E402
from promptdistill.ttft import ProfileConfig, fit_models, run_profile  # noqa: E402
from promptdistill.ttft.fit import engine_rows  # noqa: E402


def evaluate(df, seed: int, *, publish: bool = False) -> dict:
    """The chosen model's held-out figures; with ``publish``, the model goes to the registry
    (where ``promptdistill optimize``, the nightly and the other benchmarks look)."""
    if publish:
        settings = load_settings()
        info, _, fit, _ = fit_and_publish(Registry(settings.registry), df, seed=seed, source="bench_ttft_model",
                                          report_dir=Path(settings.state_dir) / "ttft" / "reports")
    else:
        fit = fit_models(df, seed=seed)
    best = fit.heldout[fit.chosen]
    return {
        "chosen": fit.chosen,
        "heldout_mape": round(best["mape"], 4),
        "heldout_r2": round(best["r2"], 4),
        "p50_abs_err_ms": round(best["p50_abs_err_ms"], 1),
        "p95_abs_err_ms": round(best["p95_abs_err_ms"], 1),
        "meets_target_10pct": best["mape"] <= 0.10,
        "meets_goal_5pct": best["mape"] <= 0.05,
        "rows": fit.rows,
        "candidates": {n: {k: round(v, 4) for k, v in s.items()} for n, s in fit.heldout.items()},
    }


def profile_backend(engine, config: ProfileConfig, out: str) -> tuple[object, dict]:
    result = run_profile(engine, config, out=out)
    return result.frame, {"stopped": result.stopped, "measurements": len(result.frame),
                          "planned": result.planned_units, "elapsed_s": round(result.elapsed_s, 1),
                          "path": str(result.path)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=420.0, help="profiling budget per backend (s)")
    p.add_argument("--points", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--server", action="store_true", help="also profile through a vLLM server")
    p.add_argument("--profiles", help="skip profiling: fit these Parquet files/folder (one result per engine)")
    p.add_argument("--out", default="artifacts/ttft/profiles")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    result: dict = {"budget_s": args.budget_s, "points": args.points, "repeats": args.repeats, "by_backend": {}}
    if args.profiles:
        from promptdistill.cli.ttft import read_profiles

        df, _ = read_profiles([args.profiles])
        for key in sorted(df["engine_key"].unique()):
            rows = engine_rows(df, key)
            result["by_backend"][f"{rows['engine_backend'].iloc[0]} ({key})"] = evaluate(rows, args.seed)
    else:
        config = ProfileConfig(points=args.points, repeats=args.repeats, budget_s=args.budget_s, seed=args.seed)
        engine_config = load_settings().engine
        with load_engine(replace(engine_config, backend="local")) as engine:
            df, info = profile_backend(engine, config, args.out)
        result["by_backend"]["vllm-local"] = {"profile": info, **evaluate(df, args.seed, publish=True)}
        if args.server:
            from promptdistill.engine.launcher import VLLMServer
            from promptdistill.engine.server import ServerEngine

            with VLLMServer(resolve_model(engine_config.model), engine_config, startup_timeout_s=600) as server:
                server_engine = ServerEngine(replace(engine_config, backend="server", server_urls=(server.url,)))
                df, info = profile_backend(server_engine, config, args.out)
            result["by_backend"]["vllm-server"] = {"profile": info, **evaluate(df, args.seed, publish=True)}

    md = ["# TTFT model accuracy (held-out prompts)", "",
          "| backend | chosen | MAPE | R² | p50 abs err ms | p95 abs err ms | rows used / contended |",
          "|---|---|---|---|---|---|---|"]
    for name, r in result["by_backend"].items():
        md.append(f"| {name} | {r['chosen']} | {r['heldout_mape']:.1%} | {r['heldout_r2']:.3f} | {r['p50_abs_err_ms']} | "
                  f"{r['p95_abs_err_ms']} | {r['rows']['rows_used']} / {r['rows']['rows_contended']} |")
    write_report("ttft_model", result, "\n".join(md) + "\n")
    return result


if __name__ == "__main__":
    main()

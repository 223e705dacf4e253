"""TTFT models: held-out accuracy of the chosen model, by backend, against the noise floor.

Profiles the engine (in-process, and through a vLLM server on 127.0.0.1 with
``--server``: TTFT at the client, HTTP included) within a time budget, fits the candidate
models with grouped cross-validation, and prints per backend the chosen model's held-out
MAPE against single measurements and against per-prompt medians of repeats, next to the
noise floor (the MAPE a perfect model would have), plus R², p50/p95 absolute error, every
candidate's scores, and cold prefill throughput as a share of the machine's matmul peak.
Target: 5% against medians, or within 1.2x the noise floor where the noise makes 5%
impossible. The rows left out as measured under CPU contention are counted.

Each profiled backend's model is published to the registry (``ttft-model/<engine key>``),
where the optimizer benchmarks, ``promptdistill optimize`` and the nightly look for it;
for the server, a freshly built server engine (as production would build one) must find
it by its identity.

Usage:
    python -m bench.bench_ttft_model [--budget-s 420] [--points 40] [--repeats 3] [--server]
    python -m bench.bench_ttft_model --profiles docs/ttft/profiles   # fit existing profiles only
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from bench.common import setup, write_report

setup()

from bench.ttft_study.analysis import prefill_throughput  # noqa: E402
from bench.ttft_study.report import target_verdict  # noqa: E402
from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.engine import load_engine, resolve_model  # noqa: E402
from promptdistill.pipeline.ttft_models import fit_and_publish, load_ttft_model  # noqa: E402
from promptdistill.registry.store import Registry  # noqa: E402
from promptdistill.ttft import ProfileConfig, check_frame, fit_models, run_profile  # noqa: E402
from promptdistill.ttft.fit import engine_rows  # noqa: E402
from promptdistill.ttft.noise import noise_floor  # noqa: E402


def evaluate(df, seed: int, *, publish: bool = False) -> dict:
    """The chosen model's held-out figures beside the noise floor and the hardware's limit;
    with ``publish``, the model goes to the registry (where ``promptdistill optimize``, the
    nightly and the other benchmarks look)."""
    if publish:
        settings = load_settings()
        info, _, fit, _ = fit_and_publish(Registry(settings.registry), df, seed=seed, source="bench_ttft_model",
                                          report_dir=Path(settings.state_dir) / "ttft" / "reports")
    else:
        fit = fit_models(df, seed=seed)
    rows, _ = check_frame(df)
    best = fit.heldout[fit.chosen]
    floor = noise_floor(rows, n_boot=200, seed=seed)
    throughput = prefill_throughput(rows, n_boot=200, seed=seed)
    return {
        "chosen": fit.chosen,
        "heldout_mape": round(best["mape"], 4),
        "heldout_mape_median": round(best["mape_median"], 4),
        "heldout_r2": round(best["r2"], 4),
        "p50_abs_err_ms": round(best["p50_abs_err_ms"], 1),
        "p95_abs_err_ms": round(best["p95_abs_err_ms"], 1),
        "noise_floor": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in floor.items()
                        if not k.endswith("_ci")},
        "target_vs_medians": target_verdict(best["mape_median"], floor["floor_vs_medians"]),
        "target_vs_singles": target_verdict(best["mape"], floor["floor_vs_singles"]),
        "meets_target_10pct": best["mape"] <= 0.10,
        "meets_goal_5pct": best["mape_median"] <= 0.05,
        "mechanics": fit.mechanics,
        "matmul_gflops": float(rows["hw_matmul_gflops"].max()) if "hw_matmul_gflops" in rows else None,
        "prefill_share_of_peak": {str(int(r["tokens"])): round(r["share_of_peak"], 3) for _, r in throughput.iterrows()},
        "prefill_tokens_per_s": {str(int(r["tokens"])): round(r["tokens_per_s"], 1) for _, r in throughput.iterrows()},
        "rows": fit.rows,
        "candidates": {n: {k: round(v, 4) for k, v in s.items()} for n, s in fit.heldout.items()},
    }


def profile_backend(engine, config: ProfileConfig, out: str, own_pids: tuple[int, ...] = ()) -> tuple[object, dict]:
    result = run_profile(engine, config, out=out, own_pids=own_pids)
    return result.frame, {"stopped": result.stopped, "measurements": len(result.frame),
                          "planned": result.planned_units, "elapsed_s": round(result.elapsed_s, 1),
                          "path": str(result.path), "queue_probe": result.info.get("queue_probe"),
                          "matmul_gflops": result.info.get("matmul_gflops")}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=420.0, help="profiling budget per backend (s)")
    p.add_argument("--points", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--server", action="store_true", help="also profile through a vLLM server")
    p.add_argument("--server-only", action="store_true", help="profile through a vLLM server only")
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
        config = ProfileConfig(points=args.points, repeats=args.repeats, max_minutes=args.budget_s / 60.0, seed=args.seed)
        engine_config = load_settings().engine
        if not args.server_only:
            with load_engine(replace(engine_config, backend="local")) as engine:
                df, info = profile_backend(engine, config, args.out)
            result["by_backend"]["vllm-local"] = {"profile": info, **evaluate(df, args.seed, publish=True)}
        if args.server or args.server_only:
            result["by_backend"]["vllm-server"] = profile_server(engine_config, config, args)

    md = ["# TTFT model accuracy (held-out prompts)", "",
          "| backend | chosen | MAPE vs medians (floor) | MAPE vs singles (floor) | target | R² | p95 abs err ms "
          "| prefill share of matmul peak | rows used / contended |",
          "|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["by_backend"].items():
        nf, t = r["noise_floor"], r["target_vs_medians"]
        shares = ", ".join(f"{k}: {v:.0%}" for k, v in r["prefill_share_of_peak"].items()) or "n/a"
        md.append(f"| {name} | {r['chosen']} | {r['heldout_mape_median']:.1%} ({nf['floor_vs_medians']:.1%}) | "
                  f"{r['heldout_mape']:.1%} ({nf['floor_vs_singles']:.1%}) | {'met' if t['met'] else 'not met'} | "
                  f"{r['heldout_r2']:.3f} | {r['p95_abs_err_ms']} | {shares} | "
                  f"{r['rows']['rows_used']} / {r['rows']['rows_contended']} |")
    write_report("ttft_model", result, "\n".join(md) + "\n")
    return result


def profile_server(engine_config, config: ProfileConfig, args: argparse.Namespace) -> dict:
    """Profile and fit through a vLLM server on 127.0.0.1; then check that a server engine
    built afresh for the same server finds the published model by its identity."""
    from promptdistill.engine.launcher import VLLMServer
    from promptdistill.engine.server import ServerEngine

    server_config = replace(engine_config, backend="server")
    with VLLMServer(resolve_model(engine_config.model), engine_config, startup_timeout_s=600) as server:
        engine = ServerEngine(replace(server_config, server_urls=(server.url,)))
        proc = getattr(server, "_proc", None)  # the server's processes: their CPU is the engine's work
        df, info = profile_backend(engine, config, args.out, (proc.pid,) if proc else ())
        out = {"profile": info, **evaluate(df, args.seed, publish=True)}
        fresh = ServerEngine(replace(server_config, server_urls=(server.url,)))
        model = load_ttft_model(Registry(load_settings().registry), fresh.identity)
        out["server_identity_finds_model"] = {"engine_key": fresh.identity.key(), "model_version": model.version}
    return out


if __name__ == "__main__":
    main()

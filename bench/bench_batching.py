"""Engine batching: the same evaluation workload batched vs one request at a time.

The workload is the bundled specs rendered over their dev records (what the evaluator
and the judges send). Both sides run in one process on the same engine, with the prefix
cache reset before each side, so only the batching differs. Reports throughput
(requests/s), the batched/serial ratio and p50/p95 per-request latency.

Beside the ratio stands the ceiling the hardware allows. The machine's dense matmul peak
is measured in this process first (``promptdistill.ttft.hardware``), the workload's
arithmetic is counted from the model's parameters (prefill and every decoded token), and
no batch can finish faster than ``FLOPs / peak``: so the batched/serial ratio is at most
``serial time / (FLOPs / peak)``, one over the serial run's share of the peak. A target
above that ceiling (5x was the guess) cannot be met on this machine by batching alone.

Usage:
    python -m bench.bench_batching [--requests 32] [--max-tokens 24] [--server]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from bench.common import setup, summary_ms, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.engine import GenerationRequest, load_engine, resolve_model  # noqa: E402
from bench.ttft_study.analysis import batched_ceiling  # noqa: E402
from promptdistill.ttft.hardware import ModelFlops, measure_matmul_peak  # noqa: E402

TARGET_RATIO = 5.0


def workload(n: int, max_tokens: int) -> list[GenerationRequest]:
    """Dev records of every bundled spec, round-robin, rendered by the one render path."""
    from promptdistill.specs import load_specs, spec_messages
    from promptdistill.specs.datasets import dataset_for, records

    per_spec = []
    for spec in load_specs("prompts"):
        recs = records(dataset_for(spec), "dev")
        per_spec.append([
            GenerationRequest(messages=spec_messages(spec, r["inputs"]), max_tokens=max_tokens,
                              json_schema=spec.output_schema)
            for r in recs
        ])
    out: list[GenerationRequest] = []
    i = 0
    while len(out) < n:
        bucket = per_spec[i % len(per_spec)]
        out.append(bucket[(i // len(per_spec)) % len(bucket)])
        i += 1
    return out


def run_side(engine, requests, *, batched: bool, flops: ModelFlops | None = None, peak_gflops: float | None = None) -> dict:
    engine.reset_prefix_cache()
    start = time.perf_counter()
    if batched:
        results = engine.generate(requests)
    else:
        results = [engine.generate([r])[0] for r in requests]
    wall_s = time.perf_counter() - start
    # Only what was computed: requests of one spec share its static prefix, served from the
    # prefix cache after the first (counting it again put the batch above the matmul peak).
    work = sum(flops.request_flops(r.prompt_tokens, r.completion_tokens, r.cached_tokens) for r in results) \
        if flops else None
    return {
        "gflop": round(work / 1e9, 1) if work else None,
        "gflops_achieved": round(work / wall_s / 1e9, 1) if work else None,
        "share_of_peak": round(work / wall_s / 1e9 / peak_gflops, 3) if work and peak_gflops else None,
        "wall_s": round(wall_s, 2),
        "requests_per_s": round(len(requests) / wall_s, 3),
        "completion_tokens": sum(r.completion_tokens for r in results),
        "latency_ms": summary_ms([r.e2e_ms for r in results]),
        "ttft_ms": summary_ms([r.ttft_ms for r in results]),
        "valid_share": round(sum(bool(r.valid) for r in results if r.valid is not None)
                             / max(1, sum(r.valid is not None for r in results)), 3),
    }


def compare(engine, requests, *, flops: ModelFlops | None = None, peak_gflops: float | None = None) -> dict:
    engine.generate(requests[:2])  # warm-up, discarded
    serial = run_side(engine, requests, batched=False, flops=flops, peak_gflops=peak_gflops)
    batched = run_side(engine, requests, batched=True, flops=flops, peak_gflops=peak_gflops)
    ratio = round(batched["requests_per_s"] / serial["requests_per_s"], 2)
    out = {
        "identity": engine.identity.to_dict(),
        "serial": serial,
        "batched": batched,
        "throughput_ratio": ratio,
    }
    if serial["gflop"] and peak_gflops:
        ceiling = batched_ceiling(serial["wall_s"], serial["gflop"] * 1e9, peak_gflops)
        out["compute_bound"] = {
            "ceiling_ratio": round(ceiling["ceiling_ratio"], 2),
            "serial_share_of_peak": round(ceiling["serial_share_of_peak"], 3),
            "compute_floor_s": round(ceiling["compute_floor_s"], 2),
            "ratio_share_of_ceiling": round(ratio / ceiling["ceiling_ratio"], 3),
            "target_ratio": TARGET_RATIO,
            "target_within_ceiling": ceiling["ceiling_ratio"] >= TARGET_RATIO,
        }
    return out


def hardware(config) -> tuple[ModelFlops | None, dict]:
    """The model's arithmetic and this machine's matmul peak, measured here before the engine starts."""
    try:
        flops = ModelFlops.from_folder(resolve_model(config.model))
    except (OSError, KeyError, ValueError):
        flops = None
    peak = measure_matmul_peak()
    return flops, {"matmul_gflops": round(peak.gflops, 1), "matmul_threads": peak.threads,
                   "matmul_gflops_1t": round(peak.gflops_1t, 1), "foreign_cpu_share": round(peak.foreign_cpu_share, 3),
                   "model_params": flops.total_params if flops else None,
                   "gflop_per_token_linear": round(2 * flops.matmul_params / 1e9, 4) if flops else None}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--server", action="store_true", help="also measure concurrent server requests")
    args = p.parse_args(argv)

    config = load_settings().engine
    requests = workload(args.requests, args.max_tokens)
    flops, hw = hardware(config)
    result: dict = {"requests": len(requests), "max_tokens": args.max_tokens, "hardware": hw}
    with load_engine(replace(config, backend="local")) as engine:
        result["in_process"] = compare(engine, requests, flops=flops, peak_gflops=hw["matmul_gflops"])
    if args.server:
        from promptdistill.engine.launcher import VLLMServer
        from promptdistill.engine.server import ServerEngine

        with VLLMServer(resolve_model(config.model), config, startup_timeout_s=600) as server:
            server_config = replace(config, backend="server", server_urls=(server.url,),
                                    max_concurrency=args.requests)
            result["server"] = compare(ServerEngine(server_config), requests, flops=flops, peak_gflops=hw["matmul_gflops"])
    md = ["# Engine batching", "",
          f"Matmul peak {hw['matmul_gflops']} GFLOP/s ({hw['matmul_threads']} threads, measured in this process); "
          f"the ceiling is the ratio the compute limit allows (serial time over FLOPs / peak).", "",
          "| path | serial req/s | batched req/s | ratio | compute-bound ceiling | serial / batched share of peak "
          "| batched p50 / p95 latency ms |",
          "|---|---|---|---|---|---|---|"]
    for key in ("in_process", "server"):
        if key in result:
            r = result[key]
            c = r.get("compute_bound") or {}
            md.append(f"| {key} | {r['serial']['requests_per_s']} | {r['batched']['requests_per_s']} | "
                      f"{r['throughput_ratio']}x | {c.get('ceiling_ratio', 'n/a')}x | "
                      f"{r['serial']['share_of_peak']} / {r['batched']['share_of_peak']} | "
                      f"{r['batched']['latency_ms']['p50']} / {r['batched']['latency_ms']['p95']} |")
    write_report("batching", result, "\n".join(md) + "\n")
    return result


if __name__ == "__main__":
    main()

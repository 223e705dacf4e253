"""Engine batching: the same evaluation workload batched vs one request at a time.

The workload is the bundled specs rendered over their dev records (what the evaluator
and the judges send). Both sides run in one process on the same engine, with the prefix
cache reset before each side, so only the batching differs. Reports throughput
(requests/s), the batched/serial ratio and p50/p95 per-request latency.

Beside the ratio stands the ceiling the hardware allows. The machine's dense matmul peak
is measured in this process first (``promptdistill.ttft.hardware``), the workload's
arithmetic is counted from the model's parameters (prefill and every decoded token, by
``bench.ttft_study.analysis.request_flops``), and no batch can finish faster than
``FLOPs / peak``: so the batched/serial ratio is at most ``serial time / (FLOPs / peak)``,
one over the serial run's share of the peak. A target above that ceiling (5x was the
guess) cannot be met on this machine by batching alone.

``--block-sizes`` also times the batched workload at each KV block size, one in-process
engine per size in this process, the sizes alternating: the throughput side of the block
size, whose warm-TTFT side ``bench_prefix_cache`` measures (requests of one template share
their static prefix, so smaller blocks let a batch reuse more of it).

Usage:
    python -m bench.bench_batching [--requests 32] [--max-tokens 24] [--server] [--block-sizes 32,128]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from dataclasses import replace

from bench.common import setup, summary_ms, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.engine import GenerationRequest, load_engine, resolve_model  # noqa: E402
from bench.ttft_study.analysis import batched_ceiling, request_flops  # noqa: E402
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
    work = sum(request_flops(flops, r.prompt_tokens, r.completion_tokens, r.cached_tokens) for r in results) \
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


def compare_block_sizes(config, requests, sizes: list[int], *, repeats: int = 3, cold_requests: int = 10) -> dict:
    """The same batched workload on one in-process engine per KV block size, in this process,
    the sizes alternating (ABBA: drift and contention hit every size alike). Per size: the
    median wall time of the batch and its requests/s, the ratio to the last size (vLLM's CPU
    default, 128, when listed last), and the median cold TTFT of single requests (prefix cache
    reset before each)."""
    walls: dict[int, list[float]] = {b: [] for b in sizes}
    cold: dict[int, list[float]] = {b: [] for b in sizes}
    completion: dict[int, int] = {}
    with contextlib.ExitStack() as stack:
        engines = {b: stack.enter_context(load_engine(replace(config, backend="local", block_size=b))) for b in sizes}
        for engine in engines.values():
            engine.generate(requests[:2])  # warm-up, discarded
        for rep in range(repeats):
            for b in (sizes if rep % 2 == 0 else sizes[::-1]):
                engine = engines[b]
                engine.reset_prefix_cache()
                start = time.perf_counter()
                results = engine.generate(requests)
                walls[b].append(time.perf_counter() - start)
                completion[b] = sum(r.completion_tokens for r in results)
                for r in requests[:cold_requests]:
                    engine.reset_prefix_cache()
                    cold[b].append(engine.generate([r])[0].ttft_ms)
        identities = {b: engines[b].identity.block_size for b in sizes}
    ref = statistics.median(walls[sizes[-1]])
    return {
        "requests": len(requests), "repeats": repeats, "cold_requests": cold_requests,
        "sizes": [{
            "block_size": b, "engine_block_size": identities[b],
            "wall_s": [round(w, 2) for w in walls[b]], "median_wall_s": round(statistics.median(walls[b]), 2),
            "requests_per_s": round(len(requests) / statistics.median(walls[b]), 3),
            "wall_ratio_to_last": round(statistics.median(walls[b]) / ref, 3),
            "completion_tokens": completion[b],
            "cold_ttft_ms": summary_ms(cold[b]),
        } for b in sizes],
    }


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
    p.add_argument("--block-sizes", default="32,128",
                   help="also time the batched workload on one engine per KV block size, alternating "
                        "(comma-separated; the last is the reference; empty: skip)")
    p.add_argument("--repeats", type=int, default=3, help="batched runs per block size")
    args = p.parse_args(argv)
    sizes = [int(b) for b in args.block_sizes.split(",") if b.strip()]

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
    if sizes:
        result["block_sizes"] = compare_block_sizes(config, requests, sizes, repeats=args.repeats)
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
    if sizes:
        bs = result["block_sizes"]
        md += ["", "## KV block size", "",
               f"The batched workload ({bs['requests']} requests, prefix cache reset before each run) on one "
               f"in-process engine per block size in this process, the sizes alternating, {bs['repeats']} runs "
               f"each; cold TTFT: {bs['cold_requests']} single requests per run, the cache reset before each.", "",
               f"| block | median batch s (runs) | req/s | batch time / block {sizes[-1]} | completion tokens | "
               "cold TTFT p50 ms |",
               "|---|---|---|---|---|---|"]
        for r in bs["sizes"]:
            md.append(f"| {r['block_size']} (engine: {r['engine_block_size']}) | {r['median_wall_s']} "
                      f"({', '.join(map(str, r['wall_s']))}) | {r['requests_per_s']} | {r['wall_ratio_to_last']} | "
                      f"{r['completion_tokens']} | {r['cold_ttft_ms']['p50']} |")
    write_report("batching", result, "\n".join(md) + "\n")
    return result


if __name__ == "__main__":
    main()

"""Engine batching: the same evaluation workload batched vs one request at a time.

The workload is the bundled specs rendered over their dev records (what the evaluator
and the judges send). Both sides run in one process on the same engine, with the prefix
cache reset before each side, so only the batching differs. Reports throughput
(requests/s), the batched/serial ratio (target: at least 5x on the CPU engine) and
p50/p95 per-request latency.

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


def run_side(engine, requests, *, batched: bool) -> dict:
    engine.reset_prefix_cache()
    start = time.perf_counter()
    if batched:
        results = engine.generate(requests)
    else:
        results = [engine.generate([r])[0] for r in requests]
    wall_s = time.perf_counter() - start
    return {
        "wall_s": round(wall_s, 2),
        "requests_per_s": round(len(requests) / wall_s, 3),
        "completion_tokens": sum(r.completion_tokens for r in results),
        "latency_ms": summary_ms([r.e2e_ms for r in results]),
        "ttft_ms": summary_ms([r.ttft_ms for r in results]),
        "valid_share": round(sum(bool(r.valid) for r in results if r.valid is not None)
                             / max(1, sum(r.valid is not None for r in results)), 3),
    }


def compare(engine, requests) -> dict:
    engine.generate(requests[:2])  # warm-up, discarded
    serial = run_side(engine, requests, batched=False)
    batched = run_side(engine, requests, batched=True)
    return {
        "identity": engine.identity.to_dict(),
        "serial": serial,
        "batched": batched,
        "throughput_ratio": round(batched["requests_per_s"] / serial["requests_per_s"], 2),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--server", action="store_true", help="also measure concurrent server requests")
    args = p.parse_args(argv)

    config = load_settings().engine
    requests = workload(args.requests, args.max_tokens)
    result: dict = {"requests": len(requests), "max_tokens": args.max_tokens}
    with load_engine(replace(config, backend="local")) as engine:
        result["in_process"] = compare(engine, requests)
    if args.server:
        from promptdistill.engine.launcher import VLLMServer
        from promptdistill.engine.server import ServerEngine

        with VLLMServer(resolve_model(config.model), config, startup_timeout_s=600) as server:
            server_config = replace(config, backend="server", server_urls=(server.url,),
                                    max_concurrency=args.requests)
            result["server"] = compare(ServerEngine(server_config), requests)
    md = ["# Engine batching", "", "| path | serial req/s | batched req/s | ratio | batched p50 / p95 latency ms |",
          "|---|---|---|---|---|"]
    for key in ("in_process", "server"):
        if key in result:
            r = result[key]
            md.append(f"| {key} | {r['serial']['requests_per_s']} | {r['batched']['requests_per_s']} | "
                      f"{r['throughput_ratio']}x | {r['batched']['latency_ms']['p50']} / {r['batched']['latency_ms']['p95']} |")
    write_report("batching", result, "\n".join(md) + "\n")
    return result


if __name__ == "__main__":
    main()

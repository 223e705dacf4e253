"""What a second vLLM endpoint buys: the same night's specs over one endpoint, then two.

Two OpenAI-compatible vLLM servers start on 127.0.0.1, each bound to a core of its own
(``VLLM_CPU_OMP_THREADS_BIND``), beside a Prefect server of the benchmark's own. The
nightly flow runs the specs on a local Dask cluster (``dask="local"``, one worker per
endpoint) twice: with ``server_urls`` = the first server, then both. Each side has its own
state folder (no LM or result cache carried over) and starts with the servers' prefix
caches reset; the TTFT model is fitted in the first side's night (the sides share one
registry) and its profile is left out of the timings and the endpoints' counts. Reports specs per hour, LM requests per second per endpoint and the two/one ratio.

On this 2-core machine the second endpoint takes the core the first one leaves free, and
the flow, the Dask workers and the Prefect server share both cores with the servers: the
ratio is what a second endpoint buys *here*, a lower bound for N GPU servers, where each
endpoint brings its own accelerator and the orchestration runs elsewhere.

Usage:
    python -m bench.bench_endpoints [--budget smoke] [--specs a b ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from bench.common import bundled_specs, drain_prefect, progress, setup, write_report

setup()

import httpx  # noqa: E402

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.engine import resolve_model  # noqa: E402
from promptdistill.engine.launcher import VLLMServer, free_port  # noqa: E402

SERVED = "smollm2-bench"
ENV_KEYS = ("PROMPTDISTILL_BACKEND", "PROMPTDISTILL_SERVER_URLS", "PROMPTDISTILL_SERVED_MODEL_NAME",
            "PROMPTDISTILL_REGISTRY", "PROMPTDISTILL_STATE_DIR", "PREFECT_API_URL")


@contextmanager
def prefect_server(home: Path, timeout_s: float = 240) -> Iterator[str]:
    """A Prefect server the Dask workers (separate processes) share; bounded start, always stopped."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with open(home / "server.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                 str(port), "--no-ui"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect server did not start; see {home / 'server.log'}")
            try:
                if httpx.get(f"{api}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def night(servers: list[VLLMServer], root: Path, side: str, specs: list[str], params: dict) -> dict:
    """One side: the nightly over ``servers``, its own state folder; returns its figures."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from promptdistill.engine.server import ServerEngine
    from promptdistill.flows.nightly import nightly

    os.environ["PROMPTDISTILL_SERVER_URLS"] = ",".join(s.url for s in servers)
    os.environ["PROMPTDISTILL_STATE_DIR"] = str(root / f"state-{side}")
    ServerEngine(load_settings().engine).reset_prefix_cache()
    with temporary_settings(updates={PREFECT_API_URL: os.environ["PREFECT_API_URL"]}):
        state = nightly(specs=specs, dask="local", return_state=True, **params)
    result = state.result(raise_on_failure=False)
    if not isinstance(result, dict) or "rows" not in result:
        raise RuntimeError(f"{side}: the night ended {state.name}: {result}")
    seconds = result["specs_s"]
    requests = sum(e["requests"] or 0 for e in result["endpoints"])
    return {
        "endpoints": len(servers),
        "specs": len(result["rows"]),
        "failed": result["failed"],
        "specs_s": seconds,
        "specs_per_hour": round(len(result["rows"]) / seconds * 3600, 1),
        "lm_requests": requests,
        "lm_requests_per_s": round(requests / seconds, 2),
        "per_endpoint": [{**e, "requests_per_s": round(e["requests_per_s"] or 0, 2),
                          "share": round(e["share"] or 0, 3)} for e in result["endpoints"]],
    }


def main(argv: list[str] | None = None) -> dict:
    from promptdistill.pipeline.budgets import budget_preset

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", default="smoke", help="budget preset for each spec (default: smoke)")
    p.add_argument("--specs", nargs="*", default=None, help="spec names (default: every bundled spec)")
    args = p.parse_args(argv)
    specs = args.specs or bundled_specs()
    preset = budget_preset(args.budget)
    params = {k: preset[k] for k in ("budget", "selection", "distill")}
    # The TTFT model is fitted on the first call and reused: the sides share one registry.
    params["ttft_budget"] = replace(preset["ttft_budget"], keep_contended=True)

    config = load_settings().engine
    root = Path(tempfile.mkdtemp(prefix="bench-endpoints-"))
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    server_config = replace(config, backend="server", served_model_name=SERVED)
    servers = [VLLMServer(resolve_model(config.model), server_config, startup_timeout_s=900,
                          log_path=root / f"vllm{core}.log", env={"VLLM_CPU_OMP_THREADS_BIND": str(core)})
               for core in (0, 1)]
    (root / "prefect").mkdir()
    try:
        for server in servers:
            server.start(wait=False)
        for server in servers:
            server.wait_ready()
        with prefect_server(root / "prefect") as api:
            os.environ.update({"PROMPTDISTILL_BACKEND": "server", "PROMPTDISTILL_SERVED_MODEL_NAME": SERVED,
                               "PROMPTDISTILL_REGISTRY": str(root / "registry"), "PREFECT_API_URL": api})
            progress(f"one endpoint, {len(specs)} specs ({args.budget}) ...")
            one = night(servers[:1], root, "one", specs, params)
            progress(f"{one['specs_per_hour']} specs/h; two endpoints ...")
            two = night(servers, root, "two", specs, params)
            drain_prefect()  # while its server runs: at exit Prefect would retry a stopped one for minutes
    finally:
        for server in servers:
            server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    ratio = round(two["specs_per_hour"] / one["specs_per_hour"], 2)
    result = {"budget": args.budget, "spec_names": specs, "cores": os.cpu_count(), "one": one, "two": two,
              "specs_per_hour_ratio": ratio,
              "lm_requests_per_s_ratio": round(two["lm_requests_per_s"] / one["lm_requests_per_s"], 2),
              "tokens_per_s_ratio": round(tokens_per_s(two) / tokens_per_s(one), 2)}
    write_report("endpoints", result, markdown(result))
    return result


def tokens_per_s(side: dict) -> float:
    """Prompt and generated tokens the endpoints processed per second of the night's specs:
    the throughput figure (the stages' time budgets cut a slow side's search short, so
    specs per hour flatters it)."""
    tokens = sum((e["prompt_tokens"] or 0) + (e["generation_tokens"] or 0) for e in side["per_endpoint"])
    return tokens / side["specs_s"]


def markdown(result: dict) -> str:
    one, two = result["one"], result["two"]
    md = ["# One endpoint or two", "",
          f"The nightly's {len(result['spec_names'])} specs (`{result['budget']}` budget) on a local Dask cluster, "
          f"one worker per endpoint; each vLLM server bound to its own core of this {result['cores']}-core machine, "
          "which the flow, the Dask workers and the Prefect server share. One run per side: a ratio measured in one "
          "session. Tokens per second is the throughput figure: the stages' time budgets cut a slower side's "
          "search short, so it does less work per spec and specs per hour flatter it.", "",
          "| endpoints | specs/h | tokens/s (prompt + generated) | LM requests | LM req/s (all) | LM req/s per endpoint "
          "| share per endpoint | failed |",
          "|---|---|---|---|---|---|---|---|"]
    for side in (one, two):
        md.append(f"| {side['endpoints']} | {side['specs_per_hour']} | {tokens_per_s(side):.0f} | {side['lm_requests']} | "
                  f"{side['lm_requests_per_s']} | "
                  + " / ".join(str(e["requests_per_s"]) for e in side["per_endpoint"]) + " | "
                  + " / ".join(f"{e['share']:.0%}" for e in side["per_endpoint"]) + f" | {len(side['failed'])} |")
    md += ["", f"Two endpoints / one: **{tokens_per_s(two) / tokens_per_s(one):.2f}x** tokens per second, "
           f"{result['lm_requests_per_s_ratio']}x LM requests per second, {result['specs_per_hour_ratio']}x specs per hour."]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()

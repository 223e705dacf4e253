"""Baseline against the published winner at load, through one vLLM server; and the load TTFT model.

Two parts, one server (one engine on the machine):

1. **The load profile and model** (skipped with ``--no-profile``): every given spec as
   written and its described variant, at concurrency 1, 8 and 32 and two rates, in two
   rounds (``promptdistill.load.profile``); the load TTFT model's held-out error per load
   against the noise floor of the rounds, and the model published to the registry
   (``load-ttft-model``), where the optimizer finds it for specs that declare ``slo.load``.
2. **The comparison**, per spec with a published winner (``NAME@production`` in the
   registry, other than the spec as written): the baseline's capacity (closed loop at
   concurrency 16), then both templates at rates of 0.3, 0.85 and 1.2 of it (light,
   near the knee, past it), interleaved in paired blocks; P50/P95/P99 TTFT and
   throughput with intervals and n, the winner's P95 minus the baseline's, and each
   template's sustainable rate at the spec's ``slo.ttft_ms`` (the P95 target), with the
   winner's as a ratio to the baseline's.

Usage:
    python -m bench.bench_load [ticket_triage invoice_extraction ...] [--registry R]
        [--requests 60] [--blocks 3] [--no-profile | --profile-only]
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from typing import Any

from bench.common import bundled_specs, progress, setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402 - after the process defaults
from promptdistill.core.errors import TemplateNotFoundError  # noqa: E402
from promptdistill.engine.base import hardware_fingerprint  # noqa: E402
from promptdistill.load.fit import load_error_table  # noqa: E402
from promptdistill.load.model import LoadTTFTModel  # noqa: E402
from promptdistill.load.profile import LoadProfileConfig, profile_cells, profile_templates, run_load_profile  # noqa: E402
from promptdistill.load.report import markdown_tables  # noqa: E402
from promptdistill.load.run import load_server, measure_spec_load  # noqa: E402
from promptdistill.load.store import publish_load_model  # noqa: E402
from promptdistill.registry.store import Registry  # noqa: E402
from promptdistill.search.splits import split_records  # noqa: E402
from promptdistill.specs.load import load_spec  # noqa: E402
from promptdistill.specs.model import Load  # noqa: E402
from promptdistill.specs.prompt import select_examples, template_content  # noqa: E402

SHARES = {"light": 0.3, "near the knee": 0.85, "past the knee": 1.2}
"""The rates measured, as shares of the baseline's capacity."""


def baseline_content(spec: Any) -> dict[str, Any]:
    train = split_records(spec, seed=0, screen_size=1, dev_size=2, test_size=0).train
    return template_content(spec, select_examples(spec, train, seed=0))


def profile_variants(names: list[str]) -> list[tuple[str, Any, list]]:
    """Each spec as written (its own examples) and its described variant (no examples)."""
    from promptdistill.optimize.examples import fixed_spec
    from promptdistill.optimize.variants import described_variant

    out = []
    for name in names:
        spec = load_spec(name)
        train = split_records(spec, seed=0, screen_size=1, dev_size=2, test_size=0).train
        out.append((f"{name}/baseline", spec, list(select_examples(spec, train, seed=0))))
        described = described_variant(spec)
        if described is not None:
            out.append((f"{name}/described", fixed_spec(described, []), []))
    return out


def run_profile(url: str, engine: Any, names: list[str], registry: Registry, config: LoadProfileConfig,
                model_name: str) -> dict:
    from promptdistill.ttft.engine_info import engine_block_size

    # The server's own tokenizer and chat template give the features (``ServerEngine``).
    templates = profile_templates(profile_variants(names), tokenizer=engine, block_tokens=engine_block_size(engine) or 16,
                                  model=engine.model, records=config.records, seed=config.seed)
    progress(f"load profile: {len(templates)} templates x {len(config.concurrencies)} concurrencies + "
             f"{len(config.rate_shares) + len(config.extra_rates)} rates x {config.repeats} rounds")
    t0 = time.monotonic()
    rows = run_load_profile(url, templates, config, progress=progress)
    cells = profile_cells(rows)
    table = load_error_table(cells, config.percentile)
    model = LoadTTFTModel(config.percentile).fit(cells)
    publish_load_model(registry, model, engine.identity, model_name=model_name,
                       metadata={"errors": table, "config": config.to_dict()})
    for r in table:
        progress(f"load model {r['load']}: held-out MAPE {r['mape']:.1%} vs floor {r.get('floor', float('nan')):.1%}"
                 f" (ratio {r.get('ratio') or float('nan'):.2f}, {r['cells']} cells)")
    return {"config": config.to_dict(), "cells": rows, "errors": table, "model": model.to_dict(),
            "minutes": round((time.monotonic() - t0) / 60.0, 2)}


def compare_spec(url: str, name: str, registry: Registry, served: str, requests: int, blocks: int) -> dict | None:
    spec = load_spec(name)
    try:
        published = registry.get(f"{name}@production")
    except TemplateNotFoundError:
        progress(f"[{name}] no production version in {registry.root}: skipped (run make run first)")
        return None
    base = baseline_content(spec)
    if published.content.get("system") == base["system"] and published.content.get("user") == base["user"]:
        progress(f"[{name}] production is the spec as written (baseline kept): nothing to compare")
        return None
    from promptdistill.load.run import capacity_rps, chat_requests, spec_records

    recs = spec_records(spec, n=200)
    capacity = capacity_rps(url, chat_requests("baseline", base, recs, model=served))
    progress(f"[{name}] baseline capacity {capacity:.2f} req/s (concurrency 16)")
    loads = [Load(rate_rps=round(capacity * s, 3)) for s in SHARES.values()]
    run = measure_spec_load(url, spec, {"baseline": base, "winner": published.content}, model=served, loads=loads,
                            requests_per_block=requests, blocks=blocks, progress=lambda m: progress(f"[{name}] {m}"))
    figures = run.figures
    out: dict[str, Any] = {"spec": name, "winner_ref": published.ref, "capacity_rps": capacity,
                           "target_ms": figures.target_ms, "minutes": round(run.minutes, 2), "rates": {},
                           "figures": figures.to_dict(), "markdown": markdown_tables(figures)}
    for label, share in SHARES.items():
        at = figures.at(Load(rate_rps=round(capacity * share, 3)))
        if at is None:
            continue
        out["rates"][label] = {"rate_rps": at["load_value"], "share_of_capacity": share,
                               "baseline_p95": at["templates"]["baseline"]["p95_ttft_ms"],
                               "winner_p95": at["templates"]["winner"]["p95_ttft_ms"],
                               "difference_p95": at.get("difference", {}).get("p95_ttft_ms")}
    sus = figures.sustainable
    if sus.get("baseline", {}).get("value") and sus.get("winner", {}).get("value"):
        out["sustainable_ratio"] = sus["winner"]["value"] / sus["baseline"]["value"]
    return out


def _f(e: dict | None, fmt: str = ".0f") -> str:
    if not e or e.get("value") is None:
        return "-"
    lo = "-" if e.get("low") is None else f"{e['low']:{fmt}}"
    hi = "-" if e.get("high") is None else f"{e['high']:{fmt}}"
    return f"{e['value']:{fmt}} [{lo}, {hi}]"


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Baseline against the published winner at load (one vLLM server, interleaved paired blocks)", ""]
    prof = result.get("profile")
    if prof:
        lines += ["## The load TTFT model (held out by prompt)", "",
                  "| load | held-out MAPE [95% CI] | noise floor [95% CI] | ratio | cells | prompts |", "|---|---|---|---|---|---|"]
        for r in prof["errors"]:
            lines.append(f"| {r['load']} | {r['mape']:.1%} [{r['mape_low']:.1%}, {r['mape_high']:.1%}] | "
                         + (f"{r['floor']:.1%} [{r['floor_low']:.1%}, {r['floor_high']:.1%}] | {r['ratio']:.2f}"
                            if r.get("floor") is not None else "- | -")
                         + f" | {r['cells']} | {r['prompts']} |")
        lines += ["", f"Profile: {prof['minutes']} minutes.", ""]
    rows = result.get("specs", [])
    if rows:
        lines += ["## P95 TTFT at three rates and the sustainable rate", "",
                  "| spec | rate (share of baseline capacity) | baseline P95 ms | winner P95 ms | winner - baseline ms |",
                  "|---|---|---|---|---|"]
        for r in rows:
            for label, x in r["rates"].items():
                lines.append(f"| {r['spec']} | {x['rate_rps']:.2f} req/s ({label}, {x['share_of_capacity']:g}) | "
                             f"{_f(x['baseline_p95'])} | {_f(x['winner_p95'])} | {_f(x['difference_p95'], '+.0f')} |")
        lines += ["", "| spec | P95 target ms | baseline sustainable req/s | winner sustainable req/s | ratio |",
                  "|---|---|---|---|---|"]
        for r in rows:
            sus = r["figures"]["sustainable"]
            ratio = f"{r['sustainable_ratio']:.2f}x" if r.get("sustainable_ratio") else "-"
            lines.append(f"| {r['spec']} | {r['target_ms']:g} | {_f(sus.get('baseline'), '.2f')} | "
                         f"{_f(sus.get('winner'), '.2f')} | {ratio} |")
        lines += ["", "Intervals 95% (n in the JSON): a percentile's inverts the empirical distribution at an effective "
                  "sample size (queue correlation); a difference's combines both (MOVER); a sustainable rate's is where "
                  "the percentile's bounds cross the target. '-' for a bound the requests cannot give.", ""]
        for r in rows:
            lines += [f"### {r['spec']} (winner {r['winner_ref']}, {r['minutes']} minutes)", "", r["markdown"]]
    return "\n".join(lines) + "\n"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> dict[str, Any]:
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated run stops the server it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", help="specs to compare (default: every bundled spec)")
    parser.add_argument("--registry", default=None, help="registry with the published winners (default: the config's)")
    parser.add_argument("--requests", type=int, default=60, help="requests per template, rate and block")
    parser.add_argument("--blocks", type=int, default=3, help="paired blocks per rate")
    parser.add_argument("--no-profile", action="store_true", help="skip the load profile and model")
    parser.add_argument("--profile-only", action="store_true", help="only the load profile and model")
    parser.add_argument("--profile-requests", type=int, default=40, help="requests per profile cell")
    parser.add_argument("--profile-specs", default=None, help="comma-separated specs of the profile (default: all)")
    args = parser.parse_args(argv)
    settings = load_settings()
    registry = Registry(args.registry or settings.registry)
    names = args.specs or bundled_specs()
    result: dict[str, Any] = {"hardware": hardware_fingerprint(), "specs": []}
    from dataclasses import replace

    from promptdistill.engine.server import ServerEngine

    t0 = time.monotonic()
    with load_server(settings.engine) as url:
        engine = ServerEngine(replace(settings.engine, backend="server", server_urls=(url,)))
        if not args.no_profile:
            profile_names = args.profile_specs.split(",") if args.profile_specs else bundled_specs()
            config = LoadProfileConfig(requests=args.profile_requests)
            from promptdistill.engine import resolve_model

            model_name = Path(resolve_model(settings.engine.model)).name
            result["profile"] = run_profile(url, engine, profile_names, Registry(settings.registry), config, model_name)
        if not args.profile_only:
            for name in names:
                row = compare_spec(url, name, registry, settings.engine.served_model_name, args.requests, args.blocks)
                if row is not None:
                    result["specs"].append(row)
    result["total_minutes"] = round((time.monotonic() - t0) / 60.0, 2)
    write_report("load", result, markdown(result))
    return result


if __name__ == "__main__":
    main()

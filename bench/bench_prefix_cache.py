"""The prefix cache and the KV block size: warm and cold TTFT of each baseline and its winner.

vLLM caches whole KV blocks (by default 128 tokens on the CPU build, 16 on GPUs; promptdistill
starts the CPU build with 32, ``core.config.CPU_BLOCK_SIZE``), so a
warm request recomputes the tail of the static prefix that does not fill a block. For
each bundled spec, the baseline (the spec as written, with its examples) and, when the
registry's ``production`` template differs from it, the published winner are timed with
``optimize.verify.measure_ttft_interleaved`` (per record and repeat, each template cold,
then warm on the next record, which the cold request primed with the static part, the
order alternating), on the in-process engine at each ``--block-sizes`` value (multiples of 32 on the CPU build), one engine (a
child process) at a time. Reported per block size and spec: each side's mean cold and warm
TTFT, the share of its static prefix a warm request found cached, and the winner minus
baseline median paired difference with its 95% bootstrap interval
(``optimize.verify.ttft_difference``).

Usage:
    python -m bench.bench_prefix_cache [--block-sizes 32,64,128] [--records 6] [--repeats 2]
        [--registry artifacts/registry]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from typing import Any

from bench.common import PROGRESS_MARK, progress, setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402


def _published(registry_root: str) -> dict[str, dict]:
    """Spec name -> the registry's ``production`` content (nothing for a missing registry)."""
    from promptdistill.registry import Registry

    out = {}
    try:
        reg = Registry(registry_root)
        for name in reg.names():
            if "production" in reg.labels(name):
                out[name] = dict(reg.get(f"{name}@production").content)
    except Exception as e:  # noqa: BLE001 - an empty or missing registry: baselines only
        progress(f"registry {registry_root} not used ({type(e).__name__}: {e}); timing the baselines only")
    return out


def content_spec(spec: Any, content: dict) -> Any:
    """A spec that renders ``content`` exactly: its whole system text as the instruction (what
    the timing's static-prefix count needs; ``check_rendering`` proves the match)."""
    from promptdistill.specs.render import unescape_braces

    return spec.with_changes(instruction=unescape_braces(content["system"]), context=None, constraints=(),
                             user=content["user"])


def one_block_size(block: int | None, registry_root: str, n_records: int, repeats: int) -> dict[str, Any]:
    """Time every spec's baseline (and published winner) on an engine with ``block`` (in a child process)."""
    from promptdistill.engine import GenerationRequest, load_engine
    from promptdistill.optimize.select import ASSUMED_WARM_SHARE
    from promptdistill.optimize.verify import (
        TimedTemplate,
        check_rendering,
        measure_ttft_interleaved,
        timing_summary,
        ttft_difference,
    )
    from promptdistill.specs import examples_for, load_specs, template_content
    from promptdistill.specs.datasets import dataset_for, records

    published = _published(registry_root)
    out: dict[str, Any] = {"specs": {}}
    with load_engine(replace(load_settings().engine, backend="local", block_size=block)) as engine:
        engine.generate([GenerationRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=4)])
        out["block_size"] = engine.identity.block_size  # what vLLM settled on
        out["identity"] = engine.identity.to_dict()
        for spec in load_specs("prompts"):
            examples = examples_for(spec)
            recs = records(dataset_for(spec), "test")[: n_records + 1]
            base = template_content(spec, examples)
            templates = [TimedTemplate("baseline", base, spec, examples, recs)]
            winner = published.get(spec.name)
            if winner and (winner["system"], winner["user"]) != (base["system"], base["user"]):
                winner_spec = content_spec(spec, winner)
                check_rendering(winner, winner_spec, (), recs)
                templates.append(TimedTemplate("winner", winner, winner_spec, (), recs))
            rows = measure_ttft_interleaved(engine, templates, model=None, n=n_records, repeats=repeats,
                                            block_tokens=out["block_size"])
            row: dict[str, Any] = {t.label: timing_summary(rows, t.label, ASSUMED_WARM_SHARE) for t in templates}
            if len(templates) == 2:
                row["difference"] = ttft_difference(rows, warm_share=ASSUMED_WARM_SHARE)
            out["specs"][spec.name] = row
            progress(f"block {out['block_size']}: {spec.name}: " + ", ".join(
                f"{t.label} cold {row[t.label]['measured_cold_ms']:.0f} warm {row[t.label]['measured_warm_ms']:.0f} ms"
                for t in templates))
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _diff(d: dict, cache: str) -> str:
    mid, low, high = (d.get(f"measured_{cache}_diff{s}_ms") for s in ("", "_low", "_high"))
    if mid is None:
        return "-"
    return f"{mid:+.0f}" + ("" if low is None else f" [{low:+.0f}, {high:+.0f}]")


def _pair(sides: tuple[dict, dict | None], key: str, fmt: Any = _ms) -> str:
    """'baseline -> winner', or the baseline alone when nothing was published."""
    base, winner = sides
    return fmt(base[key]) + ("" if winner is None else f" -> {fmt(winner[key])}")


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Prefix cache and KV block size: warm and cold TTFT, baseline and winner", "",
             f"In-process engine, one per block size; {result['records']} test records x {result['repeats']} repeats "
             "per spec, baseline and winner timed interleaved (each cold, then warm on the next record, which the "
             "cold request primed with the static part). TTFT in ms: each side's mean; the difference is winner minus baseline, the median of the "
             "paired measurements with its 95% bootstrap interval. Cached share: a warm request's cached tokens over "
             "the template's static prefix tokens.", "",
             "| block | spec | static tokens (base -> winner) | cold ms (base -> winner) | cold diff | "
             "warm ms (base -> winner) | warm diff | cached share of static prefix |",
             "|---|---|---|---|---|---|---|---|"]
    for run in result["block_sizes"]:
        for name, row in run["specs"].items():
            sides, d = (row["baseline"], row.get("winner")), row.get("difference", {})
            lines.append(f"| {run['block_size']} | {name} | {_pair(sides, 'static_prefix_tokens_timed')} | "
                         f"{_pair(sides, 'measured_cold_ms')} | {_diff(d, 'cold')} | "
                         f"{_pair(sides, 'measured_warm_ms')} | {_diff(d, 'warm')} | "
                         f"{_pair(sides, 'static_cached_share', _share)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--block-sizes", default="32,64,128",
                   help="comma-separated KV block sizes in tokens; 'default' is vLLM's own; the CPU build's "
                        "attention takes multiples of 32 only (default 32,64,128)")
    p.add_argument("--records", type=int, default=6, help="test records per spec (default 6)")
    p.add_argument("--repeats", type=int, default=2, help="timings per record, template and cache state (default 2)")
    p.add_argument("--registry", default=str(load_settings().registry))
    p.add_argument("--side", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side is not None:
        block = None if args.side == "default" else int(args.side)
        print(json.dumps(one_block_size(block, args.registry, args.records, args.repeats)))
        return {}
    runs = []
    for size in args.block_sizes.split(","):
        progress(f"prefix cache: block size {size}")
        cmd = [sys.executable, "-m", "bench.bench_prefix_cache", "--side", size.strip(), "--records",
               str(args.records), "--repeats", str(args.repeats), "--registry", args.registry]
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
            last = ""
            for line in proc.stdout:  # the child's progress lines as they come; its result is the last line
                if line.startswith(PROGRESS_MARK):
                    print(line, end="", flush=True)
                elif line.strip():
                    last = line
            if proc.wait() != 0:
                err.seek(0)
                raise SystemExit(f"block size {size}: the engine run failed (exit {proc.returncode}):\n{err.read()[-3000:]}")
        runs.append(json.loads(last))
    result = {"records": args.records, "repeats": args.repeats, "identity": runs[0]["identity"], "block_sizes": runs}
    write_report("prefix_cache", result, markdown(result))
    return result


if __name__ == "__main__":
    main()

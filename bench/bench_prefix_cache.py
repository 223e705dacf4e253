"""Where the prefix cache matters: a template's TTFT with its static part cached vs cold.

For each template (published ones from the registry, else the bundled specs with their
few-shot examples), over a few test records: cold TTFT (prefix cache reset), warm TTFT
(the same static part already served once, a different user input), and the share of
prompt tokens a production request gets from the cache. Both are measured in one run,
interleaved per record; medians reported.

Usage:
    python -m bench.bench_prefix_cache [--records 5] [--registry artifacts/registry]
"""

from __future__ import annotations

import argparse
import statistics

from bench.common import setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.engine import GenerationRequest, load_engine  # noqa: E402
from promptdistill.specs.render import render_messages  # noqa: E402


def templates_to_measure(registry_root: str | None) -> list[tuple[str, dict, str]]:
    """(ref, content, spec name) for each template: published production/candidate, else from specs."""
    from promptdistill.specs import examples_for, load_specs, template_content

    specs = {s.name: s for s in load_specs("prompts")}
    out = []
    if registry_root:
        try:
            from promptdistill.registry import Registry

            reg = Registry(registry_root)
            for name in reg.names():
                labels = reg.labels(name)
                label = "production" if "production" in labels else ("candidate" if "candidate" in labels else None)
                if label and name in specs:
                    rec = reg.get(f"{name}@{label}")
                    out.append((f"{name}@{label}", rec.content, name))
        except Exception as e:  # noqa: BLE001 - an empty or missing registry falls back to specs
            print(f"registry not used ({type(e).__name__}: {e}); measuring the bundled specs")
    if not out:
        for spec in specs.values():
            out.append((f"{spec.name} (spec)", template_content(spec, examples_for(spec)), spec.name))
    return out


def measure(engine, content: dict, inputs_list: list[dict]) -> dict:
    cold, warm, cached_share = [], [], []
    for i, inputs in enumerate(inputs_list):
        other = inputs_list[(i + 1) % len(inputs_list)]
        msgs = render_messages(content["system"], content["user"], inputs)
        engine.reset_prefix_cache()
        c = engine.generate([GenerationRequest(messages=msgs, max_tokens=1)])[0]
        # Serve the static part once through another request, then measure this one warm.
        engine.reset_prefix_cache()
        engine.generate([GenerationRequest(messages=render_messages(content["system"], content["user"], other), max_tokens=1)])
        w = engine.generate([GenerationRequest(messages=msgs, max_tokens=1)])[0]
        cold.append(c.ttft_ms)
        warm.append(w.ttft_ms)
        cached_share.append(w.cached_tokens / max(1, w.prompt_tokens))
        prompt_tokens = c.prompt_tokens
    cold_ms, warm_ms = statistics.median(cold), statistics.median(warm)
    return {
        "prompt_tokens": prompt_tokens,
        "cold_ttft_ms_p50": round(cold_ms, 1),
        "warm_ttft_ms_p50": round(warm_ms, 1),
        "warm_over_cold": round(warm_ms / cold_ms, 3),
        "cached_share_p50": round(statistics.median(cached_share), 3),
        "records": len(inputs_list),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=5)
    p.add_argument("--registry", default=load_settings().registry)
    args = p.parse_args(argv)

    from promptdistill.specs import load_spec
    from promptdistill.specs.datasets import dataset_for, records

    rows = {}
    with load_engine() as engine:
        for ref, content, spec_name in templates_to_measure(args.registry):
            recs = records(dataset_for(load_spec(spec_name)), "test")[: max(2, args.records)]
            rows[ref] = measure(engine, content, [r["inputs"] for r in recs])
            print(ref, rows[ref])
        identity = engine.identity.to_dict()
    md = ["# Prefix cache: static part cached vs cold", "",
          "| template | prompt tokens | cold TTFT p50 ms | warm TTFT p50 ms | warm/cold | cached share |",
          "|---|---|---|---|---|---|"]
    for ref, r in rows.items():
        md.append(f"| {ref} | {r['prompt_tokens']} | {r['cold_ttft_ms_p50']} | {r['warm_ttft_ms_p50']} | "
                  f"{r['warm_over_cold']} | {r['cached_share_p50']:.0%} |")
    result = {"identity": identity, "templates": rows}
    write_report("prefix_cache", result, "\n".join(md) + "\n")
    return result


if __name__ == "__main__":
    main()

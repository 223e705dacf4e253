"""Benchmark of the registry client: ``get`` + ``render`` from a warm cache.

Prints one JSON object: percentiles in microseconds for

* ``get_render_warm``: ``templates.get("bench@production")`` then ``.render(**inputs)``
  (the hot path of a service; the goal is p99 < 1 ms);
* ``get_warm`` and ``render`` alone;
* ``request_body`` and ``parse`` (a full request/reply round of client work);
* ``get_label_refresh``: a label re-check against the store (``ttl_s=0``), i.e. what one
  request pays every ``ttl_s`` seconds (the read runs in its own thread, so the client
  can stop waiting for a store that hangs);
* ``get_stale_store_hanging``: ``get`` while the store hangs (``ttl_s=0``), after the one
  caller who waited ``timeout_s``: the last good copy, served without waiting again;
* ``get_cold``: a fresh client loading and verifying a version.

Usage:
    python bench/bench_client.py [--iterations 100000] [--root DIR_OR_URL] [--examples 4]

Without ``--root`` a template with inline examples is published to a temporary folder.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time

from bench.common import write_report
from promptdistill.client import Templates
from promptdistill.registry import Registry

SCHEMA = {
    "type": "object",
    "properties": {"category": {"enum": ["billing", "bug", "account", "other"]}, "urgent": {"type": "boolean"},
                   "summary": {"type": "string", "maxLength": 200}},
    "required": ["category", "urgent", "summary"],
    "additionalProperties": False,
}


def bench_content(examples: int) -> dict:
    shots = "\n\n".join(
        f"Ticket: My card was charged twice for order #{1000 + i}, please refund.\n"
        f'Answer: {{{{"category": "billing", "urgent": {str(i % 2 == 0).lower()}, "summary": "double charge {i}"}}}}'
        for i in range(examples)
    )
    system = ("Classify the support ticket. Reply with JSON: category, urgent, summary.\n\n"
              "Rules:\n- Use 'other' when unsure.\n- urgent means money lost or account locked.\n\n"
              f"Examples:\n\n{shots}")
    return {"name": "bench", "system": system, "user": "Ticket: {ticket}\nCustomer tier: {tier}",
            "inputs": ["ticket", "tier"], "output_schema": SCHEMA, "response_format": "json_schema",
            "max_tokens": 96, "sampling": {"temperature": 0.0}}


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] / 1000, 2)

    return {"n": len(s), "p50_us": at(0.50), "p90_us": at(0.90), "p99_us": at(0.99), "p999_us": at(0.999),
            "max_us": round(s[-1] / 1000, 2), "mean_us": round(sum(s) / len(s) / 1000, 2)}


def timed(fn, iterations: int) -> list[int]:
    clock = time.perf_counter_ns
    out = [0] * iterations
    for i in range(iterations):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--root", help="an existing registry (default: a temporary one)")
    parser.add_argument("--ref", default="bench@production", help="template to load from --root")
    parser.add_argument("--examples", type=int, default=4, help="inline examples in the generated template")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or tmp
        ref = args.ref
        if not args.root:
            Registry(root).publish("bench", bench_content(args.examples), labels=["production"], actor="bench")
        inputs = {"ticket": "I was locked out of my account after a password reset {twice}.", "tier": "gold"}
        if args.root:  # the template's own inputs, with placeholder values
            inputs = {n: f"value of {n}" for n in Templates(root).get(ref).inputs}

        cold = []
        for _ in range(20):
            t0 = time.perf_counter_ns()
            Templates(root).get(ref)
            cold.append(time.perf_counter_ns() - t0)

        templates = Templates(root, ttl_s=60)
        template = templates.get(ref)
        reply = json.dumps({"category": "account", "urgent": True, "summary": "locked out"})
        refresh = Templates(root, ttl_s=0)
        refresh.get(ref)
        hanging = Templates(root, ttl_s=0, timeout_s=0.05)
        hanging.get(ref)
        store_back = threading.Event()
        hanging.registry.split = lambda *a: store_back.wait(600)  # an endpoint that never answers
        t0 = time.perf_counter_ns()
        hanging.get(ref)  # the one caller that waits timeout_s
        first_wait_us = round((time.perf_counter_ns() - t0) / 1000, 1)

        gc.collect()
        results = {
            "get_render_warm": percentiles(timed(lambda: templates.get(ref).render(inputs), args.iterations)),
            "get_warm": percentiles(timed(lambda: templates.get(ref), args.iterations)),
            "render": percentiles(timed(lambda: template.render(inputs), args.iterations)),
            "request_body": percentiles(timed(lambda: template.request_body(inputs, model="m"), args.iterations // 10 or 1)),
            "parse": percentiles(timed(lambda: template.parse(reply), args.iterations // 10 or 1)),
            "get_label_refresh": percentiles(timed(lambda: refresh.get(ref), min(2000, args.iterations))),
            "get_stale_store_hanging": percentiles(timed(lambda: hanging.get(ref), min(20000, args.iterations))),
            "get_cold": percentiles(cold),
        }
        store_back.set()
        report = {
            "goal": "get_render_warm p99 < 1000 us",
            "met": results["get_render_warm"]["p99_us"] < 1000,
            "root": "temporary local folder" if not args.root else root,
            "template": {"ref": template.ref, "system_chars": len(template.content["system"]),
                         "inputs": list(template.inputs)},
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "store_hanging_first_wait_us": first_wait_us,
            "results": results,
        }
    lines = ["# Registry client: get + render", "", "| operation | p50 us | p99 us | n |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['p50_us']} | {r['p99_us']} | {r['n']} |" for name, r in results.items()]
    write_report("client", report, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

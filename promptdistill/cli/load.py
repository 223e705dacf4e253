"""``promptdistill load NAME``: the baseline and the published template at load, through a vLLM server.

Measures P50/P95/P99 TTFT and throughput at the spec's declared ``slo.load`` and at a
sweep of rates (or the ``--rate``/``--concurrency`` given), both templates interleaved in
one run, and the sustainable rate at the spec's target. Writes ``report.json`` and
``report.md`` (nothing when interrupted) and prints the tables.
"""

from __future__ import annotations

import argparse
import signal
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("load", help="P95 TTFT and the sustainable request rate of the baseline and the published "
                                    "template, measured through a vLLM server")
    p.add_argument("name", help="spec name (prompts/NAME.yaml) or path")
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--template", default=None,
                   help="the template to compare with the spec as written: a registry ref (default NAME@production)")
    p.add_argument("--rate", type=float, action="append", default=None,
                   help="an open-loop request rate (req/s) to measure; repeatable (default: the declared load and a "
                        "sweep around the baseline's capacity)")
    p.add_argument("--concurrency", type=int, action="append", default=None,
                   help="a closed-loop concurrency to measure; repeatable")
    p.add_argument("--requests", type=int, default=48, help="requests per template, load and block (default 48)")
    p.add_argument("--blocks", type=int, default=2, help="blocks per template and load, interleaved (default 2)")
    p.add_argument("--target-ms", type=float, default=None, help="the percentile's target (default slo.ttft_ms)")
    p.add_argument("--out", default=None, help="report folder (default STATE_DIR/load/NAME)")
    p.set_defaults(func=_load)


def _load(args: argparse.Namespace) -> int:
    from pathlib import Path

    from promptdistill.core.config import load_settings
    from promptdistill.core.errors import ConfigError
    from promptdistill.load.files import write_load_report
    from promptdistill.load.measure import WARMUP
    from promptdistill.load.run import load_server, measure_spec_load
    from promptdistill.registry.store import Registry
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.model import Load
    from promptdistill.specs.prompt import select_examples, template_content
    from promptdistill.search.splits import split_records

    loads = []
    for r in args.rate or ():
        if not r > 0:
            raise ConfigError(f"--rate: must be above 0 requests per second, got {r:g}")
        loads.append(Load(rate_rps=r))
    for c in args.concurrency or ():
        if c < 1:
            raise ConfigError(f"--concurrency: must be at least 1, got {c}")
        loads.append(Load(concurrency=c))
    if args.requests <= WARMUP or args.blocks < 1:
        raise ConfigError(f"--requests must be more than the {WARMUP} warm-up requests of a block, and --blocks at "
                          f"least 1; got {args.requests} and {args.blocks}")
    # A terminated run stops the server it started (the context managers run) and writes nothing.
    signal.signal(signal.SIGTERM, _interrupt)
    settings = load_settings(args.config)
    spec = load_spec(args.name, prompts_dir=args.prompts_dir)
    ref = args.template or f"{spec.name}@production"
    published = Registry(settings.registry).get(ref)
    train = split_records(spec, seed=0, screen_size=1, dev_size=2, test_size=0).train
    contents = {"baseline": template_content(spec, select_examples(spec, train, seed=0)),
                published.ref: published.content}
    out = Path(args.out) if args.out else settings.state_dir / "load" / spec.name
    with load_server(settings.engine) as url:
        print(f"{spec.name}: baseline against {published.ref} at {url}", file=sys.stderr)
        run = measure_spec_load(url, spec, contents, model=settings.engine.served_model_name, loads=loads or None,
                                requests_per_block=args.requests, blocks=args.blocks, target_ms=args.target_ms,
                                progress=lambda m: print(f"  {m}", file=sys.stderr))
    markdown = write_load_report(out, run)
    print(markdown)
    print(f"written: {out / 'report.json'}, {out / 'report.md'}", file=sys.stderr)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt

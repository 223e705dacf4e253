"""Side by side with DSPy's strongest optimizers: MIPROv2 and GEPA, same engine, records and metric.

The question a user asks: does ours reach the peers' quality with a shorter, faster prompt
and a fraction of the GPU work? Per spec (default ``invoice_extraction``, ``ticket_triage``,
``word_problems``), four sides run one after the other on the same engine:

* **ours**, as the nightly runs it: :func:`promptdistill.pipeline.stages.distill_stage`
  then :func:`~promptdistill.pipeline.stages.optimize_stage` with
  ``budget_preset(--budget)`` (default ``quick``), on a fresh LM cache;
* **mipro**: ``dspy.MIPROv2(auto="light")`` (instruction and demos);
* **gepa**: ``dspy.GEPA(auto="light")`` (instruction), the reflection LM being the same
  engine, the metric returning the spec's score with textual feedback (the expected and the
  produced output), as DSPy's GEPA documentation asks for;
* **gepa_ttft**: the same GEPA, its metric also returning ``objective_scores``: quality
  and minus the predicted expected TTFT of the instruction's template (the registry's TTFT
  model, as ours predicts it), with ``frontier_type="hybrid"``. Run only where the
  installed DSPy passes objective scores to GEPA (checked, and said in the report).

One split for every side (``search.splits.split_records``, the only split): the first
``--train`` train records (ours: the example pool; the peers: the trainset), ``--dev`` dev
records (ours: screening and the race; the peers: the valset) and ``--test`` test records,
drawn as the optimizer draws them. Ours runs on a copy of the spec whose dataset holds
exactly these records, so no side sees more data than another.

Ours is scored as a template on the test records by ``promptdistill.evaluate``
(constrained decoding, as the content says): what a service gets. A peer's program is
exported by ``bench.peer_export``: the messages JSONAdapter sends (its system message,
the demos as user/assistant turns, the user message with the inputs as placeholders),
its structured-output schema and the task LM's ``max_tokens``; the template's replies are
parsed as JSONAdapter parses them and scored by the program's metric. The template sends
the program's requests exactly: every run checks, on every test record, that the template
renders byte for byte the messages the adapter sent (``export_identical`` of
``export_checked``). Its score should then equal the program's own (reported beside it); a
difference left is the engine's (batches made differently) or the parse's. Ours is paired
with each of the two on the test records, and the goal asks ours to reach both. Its demo turns make it more than our registry's system +
user template: it is scored and timed here, not published.

Per side: test quality with a 95% bootstrap interval (and ours minus the peer, paired, with
its interval); LM calls and prompt/completion tokens processed (the peers: counted by the
engine's meter, below DSPy's cache; ours: from the stage results, and below our LM cache by
the engine's meter, split by the phases the stages name); the search's tokens counted the same way for every
side at the engine (``search_tokens``: computed, i.e. prefilled past vLLM's prefix cache
plus completion, and prompt + completion; ours' held-out verification apart); wall
minutes; the resulting prompt's total tokens (the rendered chat prompt, served tokenizer,
mean over the test records) and instruction tokens (``Spec.instruction_text()``); measured
TTFT cold and warm (``optimize.verify.measure_ttft_interleaved``, one template at a time; a peer's by
``bench.peer_export.measure_ttft``, which renders its demo turns; every template one after
the other, after all runs).
Scoring the peers' programs and templates on test is not part of their cost, nor is ours'
held-out verification of the goal's count (it is reported beside it: the nightly does it).

A peer that fails or writes nonsense is reported as it is, with its own instruction.

Usage:
    python -m bench.bench_peers [invoice_extraction ticket_triage ...] [--budget quick]
        [--train 100] [--dev 100] [--test 100] [--peers mipro,gepa,gepa_ttft]
        [--gepa-metric-calls N] [--num-threads 16] [--timing-records 3] [--seed 0]
    python -m bench.bench_peers --merge run1/peers.json run2/peers.json   # one table from runs
        # made at different times (each spec keeps its commit); no LM call. One spec's peers
        # may come from separate runs (--peers mipro, then --peers gepa) when ours agrees

The work is done by the package ``bench.peers`` (one module per job); this module is its
command line.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from bench.common import REPORT_DIR, commit, progress, setup, write_report

setup()

from bench.peers import PEERS  # noqa: E402 - after the process defaults
from bench.peers.compare import compare_spec  # noqa: E402
from bench.peers.dspy_side import gepa_objectives_supported  # noqa: E402
from bench.peers.merge import merge_reports  # noqa: E402
from bench.peers.ours import sized_preset  # noqa: E402
from bench.peers.report import markdown  # noqa: E402
from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.core.jsonio import atomic_write, write_json  # noqa: E402

DEFAULT_SPECS = ("invoice_extraction", "ticket_triage", "word_problems")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="*", default=list(DEFAULT_SPECS))
    p.add_argument("--budget", default="quick", help="ours: the nightly's budget preset (smoke, quick, full)")
    p.add_argument("--train", type=int, default=100, help="train records (ours: example pool; peers: trainset)")
    # 100 dev records, not the nightly's 400: GEPA's light budget is about 4 x valset + 380 metric
    # calls, made mostly in sequential 3-record steps; at 400 one GEPA run alone takes ~half an hour here.
    p.add_argument("--dev", type=int, default=100, help="dev records (ours: screen + race; peers: valset)")
    p.add_argument("--test", type=int, default=100, help="held-out test records every template is scored on")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    p.add_argument("--gepa-metric-calls", type=int, default=None,
                   help="GEPA's max_metric_calls instead of auto='light' (the smoke test's size)")
    p.add_argument("--num-threads", type=int, default=16, help="DSPy's threads (their calls are batched)")
    p.add_argument("--max-bootstrapped-demos", type=int, default=4, help="MIPROv2's (DSPy's default 4)")
    p.add_argument("--max-labeled-demos", type=int, default=4, help="MIPROv2's (DSPy's default 4)")
    p.add_argument("--mipro-metric-threshold", type=float, default=None, metavar="BAR",
                   help="MIPROv2's metric_threshold: bootstrapping keeps a trace scoring at least BAR "
                        "(default: only a score of 1.0, DSPy's convention)")
    p.add_argument("--proposer-max-tokens", type=int, default=512,
                   help="max_tokens of MIPROv2's proposer and GEPA's reflection calls")
    p.add_argument("--timing-records", type=int, default=3, help="test records timed cold and warm per template")
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--merge", nargs="+", type=Path, metavar="REPORT_JSON",
                   help="join the JSON reports of separate runs into one report (no LM call); specs are ignored")
    args = p.parse_args(argv)
    if args.merge:
        merged = merge_reports(args.merge)
        path = write_json(REPORT_DIR / "peers.json", merged)
        atomic_write(REPORT_DIR / "peers.md", markdown(merged["specs"], merged["config"], merged["total_minutes"]))
        print(f"{len(merged['specs'])} specs from {len(args.merge)} reports -> {path} and peers.md", flush=True)
        return merged
    args.peers = [k.strip() for k in args.peers.split(",") if k.strip()]
    unknown = [k for k in args.peers if k not in PEERS]
    if unknown:
        p.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    if args.train < 1 or args.dev < 2 or args.test < 2:
        p.error("--train must be at least 1, --dev and --test at least 2")
    if args.mipro_metric_threshold is not None and not 0 < args.mipro_metric_threshold <= 1:
        p.error(f"--mipro-metric-threshold must be in (0, 1], not {args.mipro_metric_threshold}")
    supported, why = gepa_objectives_supported()
    if "gepa_ttft" in args.peers and not supported:
        progress(f"gepa_ttft skipped: {why}")
        args.peers.remove("gepa_ttft")

    import dspy

    from promptdistill.engine import load_engine
    from promptdistill.pipeline.ttft_models import load_ttft_model
    from promptdistill.registry.store import Registry

    settings = load_settings()
    work = Path(settings.state_dir) / "bench" / "peers"
    rows: dict[str, Any] = {}
    started = time.monotonic()
    with load_engine(settings.engine) as engine:
        model = load_ttft_model(Registry(settings.registry), engine.identity)
        for name in args.specs:
            rows[name] = compare_spec(engine, model, name, args, work)
        identity = engine.identity.to_dict()
    total = (time.monotonic() - started) / 60.0
    config = {k: getattr(args, k) for k in ("budget", "train", "dev", "test", "peers", "gepa_metric_calls",
                                             "num_threads", "max_bootstrapped_demos", "max_labeled_demos",
                                             "proposer_max_tokens", "timing_records", "seed")}
    from promptdistill.pipeline.jobs import settings_key

    preset = sized_preset(args.budget, args.dev, args.test)
    config["ours_preset"] = {k: settings_key(v) for k, v in preset.items() if k != "ttft_budget"}
    config.update({"mipro_auto": "light", "gepa_auto": "light" if args.gepa_metric_calls is None else None,
                   "dspy_version": dspy.__version__, "adapter": "JSONAdapter", "ttft_model": model.version,
                   "gepa_objectives": why, "gepa_objectives_supported": supported})
    stamp = {"commit": commit(), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = {name: {**row, **stamp} for name, row in rows.items()}
    result = {"config": config, "identity": identity, "total_minutes": round(total, 2), "specs": rows}
    write_report("peers", result, markdown(rows, config, total))
    return result


if __name__ == "__main__":
    main()

"""One spec, every side: ours and each peer run, scored, timed and compared on the same records."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.common import progress
from bench.peers.dspy_side import run_peer
from bench.peers.goal import compare_sides
from bench.peers.ours import run_ours, sized_preset
from bench.peers.records import bench_split, subset_job
from bench.peers.templates import peer_template_scores, template_scores, ttft_figures
from promptdistill.engine.base import Engine, GenerationRequest

__all__ = ["compare_spec"]


def compare_spec(engine: Engine, model: Any, name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Ours, then each of ``args.peers``, on spec ``name``; every template scored on test, then timed.

    Returns the spec's report row: ``split`` sizes, ``minutes``, ``sides`` (ours and each
    peer) and ``comparisons`` (per peer: ratios, paired differences and the goal).
    """
    from bench.peer_export import measure_ttft as peer_ttft
    from promptdistill.engine.cache import CachedEngine
    from promptdistill.optimize import prefix_block_tokens
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.render import render_messages

    spec = load_spec(Path(args.prompts_dir) / f"{name}.yaml")
    if spec.metric.kind == "judge_rubric":
        raise SystemExit(f"{name}: judge-scored; the peers' metric would be our judge on this model (pick another spec)")
    folder = work / name
    split = bench_split(spec, args.train, args.dev, args.test, args.seed)
    sizes = {k: len(v) for k, v in split.items()}
    job = subset_job(spec, split, folder / "data")
    sub = load_spec(Path(job.path))
    test = split["test"]
    block = prefix_block_tokens(engine)
    progress(f"{name}: train {sizes['train']}, dev {sizes['dev']}, test {sizes['test']}")
    started = time.monotonic()

    progress(f"[{name}] ours: distill then optimize ({args.budget} preset)")
    ours, result = run_ours(engine, model, job, sized_preset(args.budget, sizes["dev"], sizes["test"]), args.seed,
                            folder / "ours")
    sides: dict[str, dict[str, Any]] = {"ours": {**ours, "content": result["content"]}}
    progress(f"[{name}] ours: {ours['winner']} ({ours['reason'][:160]}); {ours['lm_calls']} LM calls, "
             f"{ours['tokens_processed']} tokens ({ours['computed_tokens']} search tokens computed), "
             f"{ours['minutes']:.1f} min")
    for kind in args.peers:
        progress(f"[{name}] {kind}: compile")
        sides[kind] = run_peer(kind, engine, model, sub, split, args, folder, block)
        s = sides[kind]
        progress(f"[{name}] {kind}: {s.get('error') or 'done'}; {s['lm_calls']} LM calls, {s['tokens_processed']} tokens "
                 f"({s['computed_tokens']} computed), "
                 f"{s['minutes']:.1f} min; instruction: {str(s.get('instruction'))[:200]!r}")

    # Every template scored on test the same way; ours through its own LM cache (the
    # optimizer verified this very template on these records: the same requests).
    ours_lm = CachedEngine(engine, Path(ours["folder"]) / "lm_cache.sqlite")
    try:
        for side, s in sides.items():
            if "content" in s and "turns" in s["content"]:  # a peer's program, exported by bench.peer_export
                s.update(peer_template_scores(engine, sub, s["content"], test, args.seed))
            elif "content" in s:
                s.update(template_scores(ours_lm if side == "ours" else engine, sub, s["content"], test, args.seed))
    finally:
        ours_lm.close()

    # Then every template timed, one after the other, by the optimizer's own function.
    progress(f"[{name}] timing every template ({args.timing_records} test records, cold and warm)")
    first = sides["ours"]["content"]
    engine.generate([GenerationRequest(messages=render_messages(first["system"], first["user"], test[0]["inputs"]),
                                       max_tokens=1)])  # discarded: the first timing after a pause runs slow
    for side, s in sides.items():
        if "content" in s and "turns" in s["content"]:
            s.update(peer_ttft(engine, s["content"], test, n=args.timing_records, seed=args.seed))
        elif "content" in s:
            s.update(ttft_figures(engine, model, sub, s["content"], test, n=args.timing_records, block_tokens=block,
                                  label=side, seed=args.seed))

    comparisons = {kind: compare_sides(sides["ours"], sides[kind], args.seed) for kind in args.peers}
    for s in sides.values():
        s.pop("scores", None)
        s.pop("program_scores", None)
    minutes = (time.monotonic() - started) / 60.0
    print(f"[{name}] done in {minutes:.1f} min: " + json.dumps({k: v["goal"] for k, v in comparisons.items()}),
          flush=True)
    return {"split": sizes, "minutes": round(minutes, 2), "sides": sides, "comparisons": comparisons}

"""Ours, as the nightly runs it: the distiller then the optimizer, through the pipeline stages.

The engine the stages get is a :class:`~promptdistill.engine.meter.CallMeter` below their
LM cache: it counts what reached the engine, per phase. The stages name their own steps
(``screening``, ``race``, ``test verification``, the distiller's ``clause judge``,
``ablations``, ``rewrites``...); this module names the stage around them, so a phase reads
``optimize: race``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Mapping

from bench.peers.counting import search_tokens
from bench.peers.records import fresh
from promptdistill.engine.base import Engine
from promptdistill.engine.meter import CallMeter

__all__ = ["VERIFICATION_PHASE", "run_ours", "sized_preset"]

VERIFICATION_PHASE = "optimize: test verification"
"""Ours' held-out verification: reported apart, as the peers' test scoring is."""


def sized_preset(name: str, n_dev: int, n_test: int) -> dict[str, Any]:
    """The nightly's budget preset, its record counts set to the benchmark's split (everything else as is)."""
    from promptdistill.pipeline.budgets import budget_preset

    preset = budget_preset(name)
    return {**preset, "distill": dataclasses.replace(preset["distill"], dev_size=n_dev),
            "budget": dataclasses.replace(preset["budget"], dev_size=n_dev, test_size=n_test)}


def run_ours(engine: Engine, model: Any, job: Any, preset: Mapping[str, Any], seed: int,
             folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Distill then optimize through the pipeline stages; returns (figures, the optimizer's result)."""
    from promptdistill.optimize.select import SelectionRule
    from promptdistill.pipeline.stages import distill_stage, optimize_stage

    meter = CallMeter(engine)
    cache = fresh(folder / "lm_cache.sqlite")
    started = time.monotonic()
    with meter.phase("distill"):
        distilled = distill_stage(meter, job, config=preset["distill"], seed=seed, out_dir=fresh(folder / "distill"),
                                  cache_path=cache)
    with meter.phase("optimize"):
        result = optimize_stage(meter, job, ttft_model=model, budget=preset["budget"],
                                selection=preset.get("selection", SelectionRule()), seed=seed, distilled=distilled,
                                out_dir=fresh(folder / "optimize"), cache_path=cache)
    minutes = (time.monotonic() - started) / 60.0
    d, w = distilled["summary"], result["winner"]
    if "{fewshot}" in result["content"]["user"]:
        raise RuntimeError("the winner has per-request examples; this benchmark scores static templates only")
    stage_tokens = {"distill": d["tokens_processed"], "optimize": result["prompt_tokens"] + result["completion_tokens"]}
    phases = {name: counts.to_dict() for name, counts in sorted(meter.phases.items())}
    figures = {
        "winner": result["winner_id"], "kept_baseline": result["kept_baseline"], "reason": result["reason"],
        "distill_winner": d["winner"], "distill_finalists": d["finalists"],
        "minutes": round(minutes, 3), "stage_minutes": {"distill": round(d["elapsed_s"] / 60.0, 3),
                                                         "optimize": round(result["minutes"], 3)},
        # The stage results count every request asked for (through the LM cache): the headline.
        "lm_calls": d["total_lm_calls"] + result["lm_calls"],
        "tokens_processed": sum(stage_tokens.values()), "stage_tokens": stage_tokens,
        # What reached the engine (cache misses), split by phase: prompt and completion apart.
        "engine_calls": meter.calls, "prompt_tokens_processed": meter.prompt_tokens,
        "completion_tokens_processed": meter.completion_tokens,
        "engine_tokens_processed": meter.prompt_tokens + meter.completion_tokens,
        # The search alone (the peers' cost is their compile): every phase but the verification.
        **search_tokens([row for name, row in phases.items() if name != VERIFICATION_PHASE]),
        "verification_tokens": search_tokens([phases.get(VERIFICATION_PHASE, {"prompt_tokens": 0,
                                                                              "completion_tokens": 0})]),
        "timing_requests": result["timing_requests"], "phases": phases,
        "instruction_tokens": None if w.get("instruction_tokens") is None else round(w["instruction_tokens"]),
        "stage_test_mean": w.get("test_mean"), "stage_test_n": w.get("test_n"),
        "stop": result.get("stop_reason"), "folder": str(folder),
    }
    return figures, result

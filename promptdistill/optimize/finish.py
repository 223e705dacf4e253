"""After the search: select, pick the output format and token budget, verify, assemble.

Called by ``optimize`` with the run's state (``OptimizeRun``); see ``run.py`` for the
search itself.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from promptdistill.core.stats import MeanCI, bootstrap_ci, paired_diffs
from promptdistill.engine.meter import CallMeter, phase
from promptdistill.evaluate.evaluator import EvalItem, EvalReport, evaluate_many
from promptdistill.optimize.candidates import ExampleCandidate
from promptdistill.optimize.predict import MIN_TTFT_MS
from promptdistill.optimize.result import OptimizationResult
from promptdistill.optimize.run import OptimizeRun, format_variants
from promptdistill.optimize.select import TokenBudget, pareto_mask, token_budget
from promptdistill.optimize.variants import REMINDER_TAG
from promptdistill.optimize.verify import (
    TimedTemplate,
    check_rendering,
    measure_ttft_interleaved,
    timing_repeats,
    timing_summary,
    ttft_difference,
)
from promptdistill.search.held_out import check_on_test, difference_interval
from promptdistill.search.racing import Selection
from promptdistill.specs.datasets import dataset_hash
from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import template_content

__all__ = ["cache_tradeoff", "candidate_rows", "choose_format", "density_curve", "finish", "preferred_format"]

_FORMAT_PREFERENCE = {"constrained": 2, "schema_in_prompt": 1, "free": 0}
SAMPLING = {"temperature": 0.0}


def candidate_rows(run: OptimizeRun, winner_id: str) -> pd.DataFrame:
    """One row per candidate: prompt shape, predicted TTFT, screen and race figures, the decision."""
    base = run.baseline
    rows = []
    for c in [base, *run.grid]:
        p, d = c.prediction, c.decision
        ci = bootstrap_ci(c.raced.scores, seed=run.seed) if c.raced is not None else None
        screen_diffs = paired_diffs(c.screen.scores, base.screen.scores[: c.screen.n]) \
            if c.screen is not None and base.screen is not None else np.zeros(0)
        tokens = (c.raced or c.screen).completion_tokens if (c.raced or c.screen) is not None else []
        rows.append({
            "candidate_id": c.id, "variant": c.variant, "strategy": c.strategy, "k": c.k, "subset": c.subset,
            "example_ids": json.dumps([str(r["id"]) for r in c.examples]),
            "instruction_tokens": p.get("instruction_tokens"), "semantic_density": p.get("semantic_density"),
            "total_tokens": p.get("total_tokens"), "static_prefix_tokens": p.get("static_prefix_tokens"),
            "warm_cached_tokens": p.get("warm_cached_tokens"), "fewshot_tokens": p.get("fewshot_tokens"),
            "longest_prompt_tokens": p.get("longest_prompt_tokens"),
            "ttft_cold_ms": p.get("ttft_cold_ms"), "ttft_warm_ms": p.get("ttft_warm_ms"),
            "ttft_expected_ms": p.get("ttft_expected_ms"), "ttft_load_ms": p.get("ttft_load_ms"),
            "load_reply_tokens": p.get("load_reply_tokens"), "load_utilization": p.get("load_utilization"),
            "screen_n": c.screen.n if c.screen else 0, "screen_quality": c.screen.mean if c.screen else None,
            "screen_diff": float(screen_diffs.mean()) if screen_diffs.size else None,
            "race_n": c.raced.n if c.raced else 0, "quality": c.mean,
            "ci_low": ci.low if ci else None, "ci_high": ci.high if ci else None,
            "verdict": "baseline" if c is base else d.verdict, "diff_mean": d.diff_mean, "diff_lower": d.lower,
            "diff_upper": d.upper, "alpha": d.alpha, "decision": d.reason,
            "finalist": c in run.finalists, "valid_json_rate": (c.raced or c.screen).valid_json_rate
            if (c.raced or c.screen) is not None else None,
            "completion_tokens_p95": float(np.percentile(tokens, 95)) if tokens else None,
            "lm_calls": c.lm_calls, "publishable": c.publishable, "is_baseline": c is base,
            "is_winner": c.id == winner_id, "notes": "; ".join(c.notes),
        })
    df = pd.DataFrame(rows)
    cost = run.cost_column
    df["pareto"] = pareto_mask(df["screen_quality"].astype(float).to_numpy(), df[cost].astype(float).to_numpy())
    return df


def density_curve(df: pd.DataFrame) -> pd.DataFrame:
    """Quality against the instruction's semantic density, one row per instruction variant.

    ``quality`` is the mean screen score over the variant's screened candidates (every
    screened candidate saw the same records); ``best_quality`` is its best candidate there;
    ``candidates``: how many were screened. A search that screens only possible finalists
    (``OptimizeBudget.screen_every`` off) screens a cost-ordered few, so the curve compares
    variants over different example settings: set it on to read this curve.
    """
    # A reply-reminder twin has its instruction's density: it is not another point of the curve.
    ev = df[df["screen_quality"].notna() & ~df["variant"].str.contains(f"+{REMINDER_TAG}", regex=False)]
    if ev.empty:
        return pd.DataFrame(columns=["variant", "semantic_density", "instruction_tokens", "quality", "best_quality", "peak"])
    g = ev.groupby("variant").agg(semantic_density=("semantic_density", "first"),
                                  instruction_tokens=("instruction_tokens", "first"),
                                  quality=("screen_quality", "mean"), best_quality=("screen_quality", "max"),
                                  candidates=("candidate_id", "count")).reset_index()
    g = g.sort_values("semantic_density").reset_index(drop=True)
    g["peak"] = g["quality"] == g["quality"].max()
    return g


def cache_tradeoff(df: pd.DataFrame) -> pd.DataFrame:
    """Fixed (cacheable) against per-request examples: predicted TTFT cold vs warm, and the
    quality of those screened (a search that screens only possible finalists leaves some out)."""
    ev = df[df["strategy"] != "baseline"]
    if ev.empty:
        return pd.DataFrame()
    ev = ev.assign(screen_quality=ev["screen_quality"].astype(float))
    g = ev.groupby(["strategy", "k"]).agg(
        screen_quality=("screen_quality", "mean"), screened=("screen_quality", "count"),
        ttft_cold_ms=("ttft_cold_ms", "mean"),
        ttft_warm_ms=("ttft_warm_ms", "mean"), warm_cached_tokens=("warm_cached_tokens", "mean"),
        total_tokens=("total_tokens", "mean"), candidates=("candidate_id", "count")).reset_index()
    g["warm_saving_ms"] = g["ttft_cold_ms"] - g["ttft_warm_ms"]
    return g


def preferred_format(rows: Sequence[Mapping[str, Any]]) -> str:
    """The format to publish: the highest valid-JSON rate, ties to constrained decoding.

    Quality is shown, not used: a few screen records cannot certify that an unconstrained
    format answers better, and constrained decoding is what guarantees a service a reply it
    can parse. Another format wins only when constrained replies were cut off more often.
    """
    return max(rows, key=lambda r: (r["valid_json_rate"] or 0.0, _FORMAT_PREFERENCE[r["format"]]))["format"]


@phase("output formats")
def choose_format(run: OptimizeRun, winner: ExampleCandidate) -> tuple[pd.DataFrame, str, Spec, bool, EvalReport]:
    """Valid-JSON rate (and quality, for the table) three ways on the first ``format_size``
    screen records.

    Returns the table, the chosen format (:func:`preferred_format`), its spec, whether
    decoding is constrained, and the report whose completion tokens size ``max_tokens``.
    """
    own = winner.raced if winner.raced is not None else winner.screen
    if run.spec.schema_from is not None:
        # Each request brings its own schema: decoding is constrained to it (the evaluation
        # was); there is no one schema to declare in the prompt instead.
        return pd.DataFrame(), "constrained", winner.spec, True, own
    if run.spec.output_schema is None:
        return pd.DataFrame(), "none", winner.spec, False, own
    n = min(run.budget.format_size, winner.screen.n)
    modes = {"constrained": (winner.spec, True, winner.screen.head(n))}
    if run.budget.formats and n > 0:
        others = {name: v for name, v in format_variants(winner.spec).items() if name != "constrained"}
        items = [run.item(winner, run.splits.screen[:n], spec=spec, constrained=constrained)
                 for spec, constrained in others.values()]
        for (name, (spec, constrained)), report in zip(others.items(),
                                                        evaluate_many(run.meter, items, judge_runner=run.runner,
                                                                      seed=run.seed)):
            modes[name] = (spec, constrained, report)
    rows = [{"format": name, "constrained": constrained, "valid_json_rate": report.valid_json_rate,
             "quality": report.mean, "n": report.n,
             "completion_tokens_mean": float(np.mean(report.completion_tokens)) if report.completion_tokens else None,
             "truncated_rate": float(np.mean(report.truncated)) if report.truncated else None}
            for name, (spec, constrained, report) in modes.items()]
    best = preferred_format(rows)
    df = pd.DataFrame(rows)
    df["chosen"] = df["format"] == best
    spec, constrained, report = modes[best]
    return df, best, spec, constrained, own if constrained else report


def _budget_from(report: EvalReport) -> TokenBudget:
    return token_budget(report.completion_tokens, truncated=report.truncated)


def _content(spec: Spec, cand: ExampleCandidate, tb: TokenBudget, constrained: bool) -> dict[str, Any]:
    fmt = "json_schema" if constrained and (spec.output_schema is not None or spec.schema_from is not None) else "none"
    return template_content(spec, cand.examples, max_tokens=tb.max_tokens, response_format=fmt, sampling=SAMPLING)


def _test_figures(run: OptimizeRun, report: EvalReport, base_report: EvalReport | None,
                  confidence: float) -> dict[str, Any]:
    ci = bootstrap_ci(report.scores, confidence=confidence, seed=run.seed)
    out = {**ci.to_dict("test_"), "test_valid_json_rate": report.valid_json_rate}
    if base_report is not None:
        diffs = paired_diffs(report.scores, base_report.scores)
        diff_ci = difference_interval(diffs.tolist(), confidence=confidence, seed=run.seed) if diffs.size else None
        out.update({"test_diff_mean": diff_ci.mean if diff_ci else None,
                    "test_diff_ci_low": diff_ci.low if diff_ci else None,
                    "test_diff_ci_high": diff_ci.high if diff_ci else None})
    return out


def _dev_figures(cand: ExampleCandidate, run: OptimizeRun) -> dict[str, Any]:
    report = cand.raced if cand.raced is not None else cand.screen
    ci = bootstrap_ci(report.scores, seed=run.seed) if report is not None else MeanCI(None, None, None, 0)
    p = cand.prediction
    return {"candidate_id": cand.id, "variant": cand.variant, "strategy": cand.strategy, "k": cand.k,
            **ci.to_dict("dev_"),
            "race_n": cand.raced.n if cand.raced is not None else 0,
            "dev_valid_json_rate": report.valid_json_rate if report is not None else None,
            "decision": cand.decision.to_dict(),
            **{k: p.get(k) for k in ("ttft_cold_ms", "ttft_warm_ms", "ttft_expected_ms", "total_tokens",
                                     "static_prefix_tokens", "warm_cached_tokens", "instruction_tokens",
                                     "semantic_density", "ttft_load_ms", "load_latency", "sustainable_rps")}}


def finish(run: OptimizeRun) -> OptimizationResult:
    """Select the winner, verify it on the test split, measure it, assemble the result."""
    base = run.baseline
    clipped = sum(int(c.prediction.get("clipped_predictions", 0)) for c in [base, *run.grid])
    if clipped:
        run.notes.append(f"{clipped} TTFT predictions fell below {MIN_TTFT_MS:g} ms or put a cached prefix above the "
                         "same prompt uncached, and were clipped: the TTFT model extrapolates for these prompts; "
                         "profile and refit it on a larger design")
    selection = run.select()
    winner = selection.winner
    formats, fmt, final_spec, constrained, fmt_report = choose_format(run, winner)
    tb = _budget_from(fmt_report)
    content = _content(final_spec, winner, tb, constrained)
    verification: dict[str, Any] = {"test_records": len(run.splits.test)}
    baseline_fig, winner_fig = _dev_figures(base, run), _dev_figures(winner, run)
    timing_rows: list[dict[str, Any]] = []
    timing_requests = 0
    kept = selection.kept
    test = run.splits.test
    if test:
        test_w = run.records_for(winner, test)
        verification["rendering_checked"] = check_rendering(content, final_spec, winner.examples, test_w)

        def items(records: Sequence[Any]) -> list[EvalItem]:
            out = [run.item(base, records)]
            if not (kept and final_spec == base.spec):
                out.append(run.item(winner, records, spec=final_spec, constrained=constrained,
                                    max_tokens=tb.max_tokens))
            return out

        with run.meter.phase("test verification"):
            check = check_on_test(selection, items, test, engine=run.meter, judge_runner=run.runner, seed=run.seed,
                                  max_drop=run.max_drop, revert=run.rule.verify_on_test)
        base_rep, confidence = check.baseline, check.confidence
        verification.update(test_scored=base_rep.n, test_confidence=confidence, test_stop=check.stop)
        baseline_fig.update(_test_figures(run, base_rep, None, confidence))
        winner_fig.update(_test_figures(run, check.winner, base_rep, confidence))
        def keep_baseline(reverted: Selection) -> None:
            # The baseline as published when nothing was chosen: its own format and token budget.
            nonlocal selection, winner, kept, final_spec, constrained, fmt, fmt_report, tb, content, winner_fig
            selection = reverted
            verification["reverted_from"] = selection.reverted_from.id
            winner, kept, final_spec = base, True, base.spec
            constrained = run.spec.output_schema is not None
            fmt = "constrained" if constrained else "none"
            fmt_report = base.raced if base.raced is not None else base.screen
            tb = _budget_from(fmt_report)
            content = _content(final_spec, winner, tb, constrained)
            verification["rendering_checked"] = check_rendering(content, final_spec, winner.examples, test)
            winner_fig = {**_dev_figures(base, run), **_test_figures(run, base_rep, base_rep, confidence)}

        if check.reverted:
            keep_baseline(check.selection)
        if run.load is not None and not kept and run.budget.timing_records > 0:
            load_check = _check_at_load(run, content)
            verification["load_check"] = load_check.to_dict()
            winner_fig["load_check"] = load_check.sentence()
            if load_check.slower:
                keep_baseline(selection.reverted(f"REVERTED at load: {load_check.sentence()}: slower than the "
                                                 "baseline beyond the interval; keeping the baseline"))
        if run.budget.timing_records > 0:
            timing_rows, timing_requests = _timing(run, winner, final_spec, content, kept)
            baseline_fig.update(timing_summary(timing_rows, "baseline", run.warm_share))
            # A kept baseline is one prompt: timed once, the same figures on both sides.
            winner_fig.update(timing_summary(timing_rows, "baseline" if kept else "winner", run.warm_share))
            if not kept:
                winner_fig.update(ttft_difference(timing_rows, warm_share=run.warm_share, seed=run.seed))
    else:
        verification["note"] = "the dataset has no test records: nothing verified"
    winner_fig.update({"max_tokens": tb.max_tokens, "truncation_rate": tb.truncation_rate, "format": fmt})
    baseline_fig["max_tokens"] = run.spec.max_tokens
    df = candidate_rows(run, winner.id)
    cost = run.cost_column
    pareto = df[df["pareto"]].sort_values([cost, "screen_quality"], ascending=[True, False]).reset_index(drop=True)
    real = getattr(run.outer, "real_calls", None)
    return OptimizationResult(
        spec_name=run.spec.name, seed=run.seed, content=content, winner_id=winner.id, reason=selection.reason,
        kept_baseline=selection.kept, selection=selection.record(), baseline=baseline_fig, winner=winner_fig, candidates=df, pareto=pareto,
        density_curve=density_curve(df), tradeoff=cache_tradeoff(df), formats=formats, token_budget=tb,
        timing=pd.DataFrame(timing_rows), lm_calls=run.meter.calls, real_lm_calls=real,
        prompt_tokens=run.meter.prompt_tokens, completion_tokens=run.meter.completion_tokens,
        timing_requests=timing_requests, minutes=(time.monotonic() - run.search_budget.started) / 60.0,
        stop_reason=run.search_budget.reason, provenance=_provenance(run, winner, final_spec, selection.reason),
        budget=run.budget, rule=run.rule, winner_spec=final_spec, winner_examples=list(winner.examples),
        verification=verification, notes=list(run.notes), plan=run.plan,
        warm_share=run.warm_share, warm_share_source=run.warm_share_source, ttft_resolution=run.resolution_rel,
        dev_completion_tokens=list(fmt_report.completion_tokens), dev_truncated=list(fmt_report.truncated),
        ttft_kind=run.rule.ttft, slo_ttft_ms=run.spec.slo.ttft_ms, max_quality_drop=run.max_drop,
        splits=run.splits.sizes(), references=dict(run.references),
    )


def _check_at_load(run: OptimizeRun, content: dict[str, Any]) -> Any:
    """The winner's content against the baseline's at ``slo.load``, through a vLLM server:
    the engine's own when it is one, else one started for the measurement."""
    from promptdistill.load.verify import check_at_load, server_for

    base = run.baseline
    base_content = template_content(base.spec, base.examples, max_tokens=run.spec.max_tokens, sampling=SAMPLING)
    if run.load.server is not None:
        url, served = run.load.server
        return check_at_load(url, run.spec, base_content, content, model=served, seed=run.seed)
    with server_for(run.timing_engine) as (url, served):
        return check_at_load(url, run.spec, base_content, content, model=served, seed=run.seed)


def _timing(run: OptimizeRun, winner: ExampleCandidate, final_spec: Spec, content: dict, kept: bool) -> tuple[list[dict], int]:
    """The baseline and the winner timed interleaved on the first ``timing_records`` test
    records, repeated to at least ``MIN_TIMING_PAIRS`` pairs; a kept baseline alone. Returns
    the rows and the requests sent."""
    base = run.baseline
    n = run.budget.timing_records
    base_content = template_content(base.spec, base.examples, max_tokens=run.spec.max_tokens, sampling=SAMPLING)
    templates = [TimedTemplate("baseline", base_content, base.spec, base.examples, run.splits.test)]
    if not kept:
        templates.append(TimedTemplate("winner", content, final_spec, winner.examples,
                                       run.records_for(winner, run.splits.test),
                                       fewshot_count=winner.k if winner.strategy == "similar" else None))
    meter = CallMeter(run.timing_engine)
    rows = measure_ttft_interleaved(meter, templates, model=run.model, n=n, repeats=timing_repeats(n),
                                    block_tokens=run.block_tokens, seed=run.seed)
    return rows, meter.calls


def _ids_hash(records: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps([str(r["id"]) for r in records]).encode()).hexdigest()[:16]


def _provenance(run: OptimizeRun, winner: ExampleCandidate, final_spec: Spec, reason: str) -> dict[str, Any]:
    judges = set(run.runner.stats)
    if run.spec.metric.kind == "judge_rubric":
        judges.add("rubric_score")
    model = run.model
    return {
        "optimizer": {"module": "promptdistill.optimize", "seed": run.seed, "budget": run.budget.to_dict(),
                      "rule": run.rule.to_dict(), "block_tokens": run.block_tokens, "warm_share": run.warm_share,
                      "warm_share_source": run.warm_share_source},
        "engine": {**run.meter.identity.to_dict(), "key": run.meter.identity.key()},
        "judge_engine": {**run.runner.engine.identity.to_dict(), "key": run.runner.engine.identity.key()},
        "spec": {"name": run.spec.name, "spec_hash": run.spec.spec_hash(), "winner_spec_hash": final_spec.spec_hash(),
                 "source": str(run.spec.source_path) if run.spec.source_path else None},
        "dataset": {"file": run.spec.dataset.name, "sha256": dataset_hash(run.spec.dataset),
                    "screen_ids_sha": _ids_hash(run.splits.screen), "certify_ids_sha": _ids_hash(run.splits.certify),
                    "test_ids_sha": _ids_hash(run.splits.test), **run.splits.sizes()},
        "judges": {name: run.runner.definition(name).version for name in sorted(judges)},
        "ttft_model": {"version": model.version, "name": model.name, "kind": model.kind,
                       "engine_key": model.engine_identity.key(), "relative_error": model.relative_error},
        "latency": run.latency, "resolution": run.resolution_rel,
        "load": None if run.load is None else {"load": run.load.load.to_dict(), "percentile": run.load.percentile,
                                               "relative_error": run.load.relative_error},
        "candidate": {"id": winner.id, "variant": winner.variant, "strategy": winner.strategy, "k": winner.k,
                      "example_ids": [str(r["id"]) for r in winner.examples],
                      "decision": winner.decision.to_dict()},
        "selection_reason": reason,
    }

"""After the search: score, select, pick the output format and token budget, verify, assemble.

Called by ``optimize`` with the run state; see ``run.py`` for the whole sequence.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Sequence

import numpy as np
import pandas as pd

from promptdistill.evaluate import mean_of
from promptdistill.optimize.predict import MIN_TTFT_MS
from promptdistill.optimize.result import OptimizationResult
from promptdistill.optimize.run import _Run, format_variants, prefix_report
from promptdistill.optimize.search import OptCandidate
from promptdistill.optimize.select import Scored, TokenBudget, assess, pareto_mask, select_winner, token_budget
from promptdistill.optimize.stats import bootstrap_ci, paired_bootstrap_lower_bound, paired_diffs
from promptdistill.optimize.verify import check_rendering, measure_ttft, timing_summary
from promptdistill.specs import Spec, template_content

__all__ = ["cache_tradeoff", "candidate_rows", "choose_format", "density_curve", "finish"]

_FORMAT_PREFERENCE = {"constrained": 2, "schema_in_prompt": 1, "free": 0}
SAMPLING = {"temperature": 0.0}


def _scored(run: _Run, cand: OptCandidate, base: OptCandidate) -> Scored:
    complete = cand.n >= len(run.dev)
    lower = None
    if cand.report is not None:
        lower = 0.0 if cand is base else paired_bootstrap_lower_bound(
            cand.report.scores, base.report.scores[: cand.n], confidence=run.rule.confidence,
            n_boot=run.rule.n_boot, seed=run.seed)
    return Scored(cand.id, cand.mean, lower, cand.ttft("cold"), cand.ttft("warm"), complete=complete,
                  publishable=cand.publishable)


def candidate_rows(run: _Run, cands: Sequence[OptCandidate], base: OptCandidate, scored: dict[str, Scored],
                   winner_id: str) -> pd.DataFrame:
    mb = run.minibatch
    rows = []
    for c in cands:
        s, p = scored[c.id], c.prediction
        ci = bootstrap_ci(c.report.scores, seed=run.seed) if c.report is not None else None
        diffs = paired_diffs(c.report.scores, base.report.scores[: c.n]) if c.report is not None else np.zeros(0)
        ok, verdict = assess(s, run.rule, run.max_drop, run.spec.slo.ttft_ms)
        if c.report is None:
            verdict = "; ".join(c.notes) or "not evaluated (budget)"
        tokens = [r.completion_tokens for r in c.results]
        rows.append({
            "candidate_id": c.id, "variant": c.variant, "strategy": c.strategy, "k": c.k, "subset": c.subset,
            "example_ids": json.dumps([str(r["id"]) for r in c.examples]),
            "instruction_tokens": p.get("instruction_tokens"), "semantic_density": p.get("semantic_density"),
            "total_tokens": p.get("total_tokens"), "static_prefix_tokens": p.get("static_prefix_tokens"),
            "warm_cached_tokens": p.get("warm_cached_tokens"), "fewshot_tokens": p.get("fewshot_tokens"),
            "longest_prompt_tokens": p.get("longest_prompt_tokens"),
            "ttft_cold_ms": p.get("ttft_cold_ms"), "ttft_warm_ms": p.get("ttft_warm_ms"),
            "ttft_expected_ms": p.get("ttft_expected_ms"),
            "rung": c.rung, "n_dev": c.n, "minibatch_quality": mean_of(c.report.scores[:mb]) if c.report else None,
            "quality": c.mean, "ci_low": ci.low if ci else None, "ci_high": ci.high if ci else None,
            "diff_mean": float(diffs.mean()) if diffs.size else None, "diff_lower": s.diff_lower,
            "valid_json_rate": c.report.valid_json_rate if c.report else None,
            "completion_tokens_p95": float(np.percentile(tokens, 95)) if tokens else None,
            "lm_calls": c.lm_calls, "complete": s.complete, "publishable": c.publishable, "qualifies": ok,
            "verdict": verdict, "is_baseline": c is base, "is_winner": c.id == winner_id,
            "notes": "; ".join(c.notes),
        })
    df = pd.DataFrame(rows)
    cost = f"ttft_{run.rule.ttft}_ms"
    df["pareto"] = pareto_mask(df["quality"].astype(float).to_numpy(), df[cost].astype(float).to_numpy())
    return df


def density_curve(df: pd.DataFrame) -> pd.DataFrame:
    """Quality against the instruction's semantic density, one row per instruction variant.

    ``quality`` is the mean minibatch score over the variant's candidates (every
    evaluated candidate saw the minibatch), so variants are compared on the same records
    and averaged over example settings; ``best_quality`` is its best candidate there.
    """
    ev = df[df["minibatch_quality"].notna()]
    if ev.empty:
        return pd.DataFrame(columns=["variant", "semantic_density", "instruction_tokens", "quality", "best_quality", "peak"])
    g = ev.groupby("variant").agg(semantic_density=("semantic_density", "first"),
                                  instruction_tokens=("instruction_tokens", "first"),
                                  quality=("minibatch_quality", "mean"), best_quality=("minibatch_quality", "max"),
                                  candidates=("candidate_id", "count")).reset_index()
    g = g.sort_values("semantic_density").reset_index(drop=True)
    g["peak"] = g["quality"] == g["quality"].max()
    return g


def cache_tradeoff(df: pd.DataFrame) -> pd.DataFrame:
    """Fixed (cacheable) against per-request examples: quality and predicted TTFT cold vs warm."""
    ev = df[df["minibatch_quality"].notna() & (df["strategy"] != "baseline")]
    if ev.empty:
        return pd.DataFrame()
    g = ev.groupby(["strategy", "k"]).agg(
        minibatch_quality=("minibatch_quality", "mean"), ttft_cold_ms=("ttft_cold_ms", "mean"),
        ttft_warm_ms=("ttft_warm_ms", "mean"), warm_cached_tokens=("warm_cached_tokens", "mean"),
        total_tokens=("total_tokens", "mean"), candidates=("candidate_id", "count")).reset_index()
    g["warm_saving_ms"] = g["ttft_cold_ms"] - g["ttft_warm_ms"]
    return g


def choose_format(run: _Run, winner: OptCandidate) -> tuple[pd.DataFrame, str, Spec, bool, list]:
    """Valid-JSON rate three ways on the first ``format_size`` dev records; the best
    (ties: constrained decoding) with its spec and its dev results (all dev records for
    constrained decoding, which the search already ran)."""
    if run.spec.output_schema is None:
        return pd.DataFrame(), "none", winner.spec, False, winner.results
    n = min(run.budget.format_size, winner.n)
    modes = {"constrained": (winner.spec, True, prefix_report(winner.report, n), winner.results[:n])}
    if run.budget.formats and n > 0:
        records = run.records_for(winner, run.dev[:n])
        for name, (spec, constrained) in format_variants(winner.spec).items():
            if name != "constrained":
                report, results = run.run_eval(spec, winner.examples, records, constrained=constrained)
                modes[name] = (spec, constrained, report, results)
    rows = []
    for name, (spec, constrained, report, results) in modes.items():
        rows.append({"format": name, "constrained": constrained, "valid_json_rate": report.valid_json_rate,
                     "quality": report.mean, "n": report.n,
                     "completion_tokens_mean": float(np.mean([r.completion_tokens for r in results])),
                     "truncated_rate": float(np.mean([r.finish_reason == "length" for r in results]))})
    best = max(rows, key=lambda r: (r["valid_json_rate"] or 0.0, r["quality"] or 0.0, _FORMAT_PREFERENCE[r["format"]]))
    df = pd.DataFrame(rows)
    df["chosen"] = df["format"] == best["format"]
    spec, constrained, _report, results = modes[best["format"]]
    return df, best["format"], spec, constrained, winner.results if constrained else results


def _budget_from(results: Sequence[Any]) -> TokenBudget:
    return token_budget([r.completion_tokens for r in results], truncated=[r.finish_reason == "length" for r in results])


def _content(spec: Spec, cand: OptCandidate, tb: TokenBudget, constrained: bool) -> dict[str, Any]:
    fmt = "json_schema" if constrained and spec.output_schema is not None else "none"
    return template_content(spec, cand.examples, max_tokens=tb.max_tokens, response_format=fmt, sampling=SAMPLING)


def _test_figures(run: _Run, report: Any, base_report: Any | None) -> dict[str, Any]:
    ci = bootstrap_ci(report.scores, seed=run.seed)
    out = {"test_mean": ci.mean, "test_ci_low": ci.low, "test_ci_high": ci.high, "test_n": ci.n,
           "test_valid_json_rate": report.valid_json_rate, "test_equivalence": report.equivalence_mean}
    if base_report is not None:
        diffs = paired_diffs(report.scores, base_report.scores)
        out["test_diff_mean"] = float(diffs.mean()) if diffs.size else None
        out["test_diff_lower"] = paired_bootstrap_lower_bound(report.scores, base_report.scores, confidence=run.rule.confidence,
                                                              n_boot=run.rule.n_boot, seed=run.seed)
    return out


def _dev_figures(cand: OptCandidate, run: _Run) -> dict[str, Any]:
    ci = bootstrap_ci(cand.report.scores, seed=run.seed)
    p = cand.prediction
    return {"candidate_id": cand.id, "variant": cand.variant, "strategy": cand.strategy, "k": cand.k,
            "dev_mean": ci.mean, "dev_ci_low": ci.low, "dev_ci_high": ci.high, "dev_n": ci.n,
            "dev_valid_json_rate": cand.report.valid_json_rate,
            **{k: p.get(k) for k in ("ttft_cold_ms", "ttft_warm_ms", "ttft_expected_ms", "total_tokens", "static_prefix_tokens",
                                     "warm_cached_tokens", "instruction_tokens", "semantic_density")}}


def finish(run: _Run, base: OptCandidate, grid: list[OptCandidate]) -> OptimizationResult:
    cands = [base] + grid
    clipped = sum(int(c.prediction.get("clipped_predictions", 0)) for c in cands)
    if clipped:
        run.notes.append(f"{clipped} TTFT predictions fell below {MIN_TTFT_MS:g} ms and were clipped: the TTFT model "
                         "extrapolates for these prompts; profile and refit it on a larger design")
    scored = {c.id: _scored(run, c, base) for c in cands}
    pick, reason = select_winner([scored[c.id] for c in grid], scored[base.id], run.rule,
                                 max_drop=run.max_drop, slo_ttft_ms=run.spec.slo.ttft_ms,
                                 baseline_scores=base.report.scores if base.report else None)
    winner = next(c for c in cands if c.id == pick.id)
    formats, fmt, final_spec, constrained, fmt_results = choose_format(run, winner)
    tb = _budget_from(fmt_results)
    content = _content(final_spec, winner, tb, constrained)
    test_w = run.records_for(winner, run.test)
    verification: dict[str, Any] = {"test_records": len(run.test)}
    baseline_fig, winner_fig = _dev_figures(base, run), _dev_figures(winner, run)
    timing_rows: list[dict[str, Any]] = []
    kept = winner is base
    if run.test:
        verification["rendering_checked"] = check_rendering(content, final_spec, winner.examples, test_w)
        base_rep, _ = run.run_eval(base.spec, base.examples, run.test)
        same = kept and final_spec == base.spec
        win_rep, _ = run.run_eval(final_spec, winner.examples, test_w, constrained=constrained, max_tokens=tb.max_tokens,
                                  baseline_replies=None if same else base_rep.replies)
        baseline_fig.update(_test_figures(run, base_rep, None))
        winner_fig.update(_test_figures(run, win_rep, base_rep))
        diff = winner_fig.get("test_diff_mean")
        if run.rule.verify_on_test and not kept and diff is not None and diff < -run.max_drop - 1e-12:
            reason += (f"; REVERTED on test: {winner.id} scored {diff:+.3f} against the baseline "
                       f"(allowed drop {run.max_drop:g}); keeping the baseline")
            verification["reverted_from"] = winner.id
            winner, kept, final_spec, constrained, fmt = base, True, base.spec, run.spec.output_schema is not None, (
                "constrained" if run.spec.output_schema is not None else "none")
            fmt_results = base.results
            tb = _budget_from(fmt_results)
            content = _content(final_spec, winner, tb, constrained)
            test_w = run.test
            verification["rendering_checked"] = check_rendering(content, final_spec, winner.examples, test_w)
            win_rep, _ = run.run_eval(final_spec, winner.examples, test_w, constrained=constrained, max_tokens=tb.max_tokens)
            winner_fig = {**_dev_figures(base, run), **_test_figures(run, win_rep, base_rep)}
        if run.budget.timing_records > 0:
            timing_rows = _timing(run, base, winner, final_spec, content)
            baseline_fig.update(timing_summary(timing_rows, "baseline", run.rule.warm_share))
            winner_fig.update(timing_summary(timing_rows, "winner", run.rule.warm_share))
    else:
        verification["note"] = "the dataset has no test records: nothing verified"
    winner_fig.update({"max_tokens": tb.max_tokens, "truncation_rate": tb.truncation_rate, "format": fmt})
    baseline_fig["max_tokens"] = run.spec.max_tokens
    df = candidate_rows(run, cands, base, scored, winner.id)
    cost = f"ttft_{run.rule.ttft}_ms"
    pareto = df[df["pareto"]].sort_values([cost, "quality"], ascending=[True, False]).reset_index(drop=True)
    real = getattr(run.outer, "real_calls", None)
    return OptimizationResult(
        spec_name=run.spec.name, seed=run.seed, content=content, winner_id=winner.id, reason=reason,
        kept_baseline=kept, baseline=baseline_fig, winner=winner_fig, candidates=df, pareto=pareto,
        density_curve=density_curve(df), tradeoff=cache_tradeoff(df), formats=formats, token_budget=tb,
        timing=pd.DataFrame(timing_rows), lm_calls=run.lm.calls, real_lm_calls=real,
        timing_requests=3 * len(timing_rows) // 2, minutes=(time.monotonic() - run.started) / 60.0,
        stop_reason=run.stop_reason, provenance=_provenance(run, winner, final_spec, reason),
        budget=run.budget, rule=run.rule, winner_spec=final_spec, winner_examples=list(winner.examples),
        verification=verification, notes=list(run.notes),
        dev_completion_tokens=[r.completion_tokens for r in fmt_results],
        dev_truncated=[r.finish_reason == "length" for r in fmt_results], ttft_kind=run.rule.ttft,
        slo_ttft_ms=run.spec.slo.ttft_ms, max_quality_drop=run.max_drop,
    )


def _timing(run: _Run, base: OptCandidate, winner: OptCandidate, final_spec: Spec, content: dict) -> list[dict]:
    n = run.budget.timing_records
    base_content = template_content(base.spec, base.examples, max_tokens=run.spec.max_tokens, sampling=SAMPLING)
    rows = measure_ttft(run.timing_engine, base_content, base.spec, base.examples, run.test, model=run.model, n=n,
                        block_tokens=run.block_tokens, label="baseline", seed=run.seed)
    rows += measure_ttft(run.timing_engine, content, final_spec, winner.examples, run.records_for(winner, run.test),
                         model=run.model, n=n, block_tokens=run.block_tokens, label="winner", seed=run.seed,
                         fewshot_count=winner.k if winner.strategy == "similar" else None)
    return rows


def _ids_hash(records: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps([str(r["id"]) for r in records]).encode()).hexdigest()[:16]


def _provenance(run: _Run, winner: OptCandidate, final_spec: Spec, reason: str) -> dict[str, Any]:
    from promptdistill.datasets import dataset_hash

    judges = set(run.runner.stats)
    if run.spec.metric.kind == "judge_rubric":
        judges.add("rubric_score")
    model = run.model
    return {
        "optimizer": {"module": "promptdistill.optimize", "seed": run.seed, "budget": run.budget.to_dict(),
                      "rule": run.rule.to_dict(), "block_tokens": run.block_tokens},
        "engine": {**run.lm.identity.to_dict(), "key": run.lm.identity.key()},
        "spec": {"name": run.spec.name, "spec_hash": run.spec.spec_hash(), "winner_spec_hash": final_spec.spec_hash(),
                 "source": str(run.spec.source_path) if run.spec.source_path else None},
        "dataset": {"file": run.spec.dataset.name, "sha256": dataset_hash(run.spec.dataset),
                    "dev_ids_sha": _ids_hash(run.dev), "test_ids_sha": _ids_hash(run.test),
                    "dev_n": len(run.dev), "test_n": len(run.test)},
        "judges": {name: run.runner.definition(name).version for name in sorted(judges)},
        "ttft_model": {"version": model.version, "name": model.name, "kind": model.kind,
                       "engine_key": model.engine_identity.key()},
        "candidate": {"id": winner.id, "variant": winner.variant, "strategy": winner.strategy, "k": winner.k,
                      "example_ids": [str(r["id"]) for r in winner.examples]},
        "selection_reason": reason,
    }

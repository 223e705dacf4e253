"""A peer's side: MIPROv2 or GEPA compiled on the same engine, its program scored and exported.

Its requests reach the engine through the DSPy bridge (``bench.dspy_bridge``), then
:class:`~bench.peers.counting.FitToContext`, then a :class:`CallMeter`: the meter counts
what reached the engine below DSPy's cache, every attempt included.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bench.peers.counting import FitToContext, search_tokens
from bench.peers.dspy_program import (
    BootstrapTally,
    TTFTObjective,
    make_gepa_metric,
    make_metric,
    make_signature,
    tagged_program,
    to_example,
)
from bench.peers.records import fresh
from promptdistill.engine.base import Engine
from promptdistill.engine.meter import CallMeter

__all__ = ["gepa_details", "gepa_objectives_supported", "run_peer", "run_with_retries"]


def gepa_objectives_supported() -> tuple[bool, str]:
    """Does the installed DSPy pass a metric's ``objective_scores`` on to GEPA's Pareto frontier?

    Read from the declared fields: ``ScoreWithFeedback.objective_scores`` and the
    ``frontier_type`` parameter of ``gepa.optimize`` (both annotated where they exist).
    """
    try:
        from dspy.teleprompt.gepa.gepa_utils import ScoreWithFeedback
        from gepa import optimize as gepa_optimize
    except ImportError as e:
        return False, f"dspy.GEPA is not importable: {e}"
    has_field = "objective_scores" in getattr(ScoreWithFeedback, "__annotations__", {})
    has_frontier = "frontier_type" in getattr(gepa_optimize, "__annotations__", {})
    if has_field and has_frontier:
        return True, ("DSPy's GEPA takes objective_scores from the metric's Prediction (ScoreWithFeedback) and gepa's "
                      "frontier_type='hybrid' keeps per-objective fronts; the returned program is still the best by "
                      "the scalar score (quality)")
    return False, (f"objective scores are not supported: ScoreWithFeedback.objective_scores {has_field}, "
                   f"gepa.optimize(frontier_type=...) {has_frontier}")


def run_with_retries(compile_once: Callable[[Any, int | None], Any], adapters: Sequence[Any], seed: int | None,
                     retry_on: tuple[type[BaseException], ...] | None = None) -> tuple[Any, dict[str, Any]]:
    """A peer run as a competent DSPy user runs it: ``compile_once(adapter, seed)``, retried on a parse failure.

    The first adapter with ``seed``; on an adapter parse error (``retry_on``, default DSPy's
    ``AdapterParseError``) once more with the same adapter and ``seed + 1`` (skipped when
    the peer takes no seed: the same calls would come back from DSPy's cache), then each
    other adapter with ``seed``. Any other exception ends the run at once.

    Returns:
        (the result or None, the record for the peer's side): ``attempts`` (adapter, seed,
        seconds, error type and message), ``adapter`` (the one that succeeded) and, when
        every attempt failed, ``error`` and ``traceback`` of the last.
    """
    if retry_on is None:
        from dspy.utils.exceptions import AdapterParseError

        retry_on = (AdapterParseError,)
    plan = [(adapters[0], seed), *([(adapters[0], seed + 1)] if seed is not None else []),
            *((a, seed) for a in adapters[1:])]
    attempts: list[dict[str, Any]] = []
    error: Exception | None = None
    for adapter, s in plan:
        row: dict[str, Any] = {"adapter": type(adapter).__name__, "seed": s, "error_type": None, "error": None}
        attempts.append(row)
        started = time.monotonic()
        try:
            result = compile_once(adapter, s)
        except Exception as e:  # noqa: BLE001 - a failing peer is a result to report, not a crash
            row.update(seconds=round(time.monotonic() - started, 1), error_type=type(e).__name__,
                       error=str(e).strip()[:500])
            error = e
            if not isinstance(e, retry_on):
                break
            continue
        row["seconds"] = round(time.monotonic() - started, 1)
        return result, {"attempts": attempts, "adapter": row["adapter"]}
    assert error is not None
    return None, {"attempts": attempts, "adapter": None, "error": f"{type(error).__name__}: {error}",
                  "traceback": "".join(traceback.format_exception(error, limit=6))}


def run_peer(kind: str, engine: Engine, model: Any, spec: Any, split: Mapping[str, Sequence[dict]],
             args: argparse.Namespace, folder: Path, block_tokens: int) -> dict[str, Any]:
    """Compile one peer (``run_with_retries``: its cost counts every attempt), score its program on test,
    export it as a template (content included)."""
    import dspy

    from bench.dspy_bridge import make_dspy_lm
    from bench.peer_export import export_program, render
    from promptdistill.core.stats import bootstrap_ci

    meter = CallMeter(engine)
    fitted = FitToContext(meter)  # an over-long prompt is answered here, never counted by the meter
    temperature = 1.0 if kind.startswith("gepa") else 0.0  # GEPA's docs: a sampling reflection LM
    prompt_lm = make_dspy_lm(fitted, cache_dir=fresh(folder / f"dspy_cache_{kind}"), temperature=temperature,
                             max_tokens=args.proposer_max_tokens, max_batch=32)
    bridge = prompt_lm.bridge
    task_lm = prompt_lm.copy(max_tokens=2 * (spec.max_tokens or 128) + 16, temperature=0.0)  # JSONAdapter's spacing
    trainset = [to_example(spec, r) for r in split["train"]]
    valset = [to_example(spec, r) for r in split["dev"]]
    out: dict[str, Any] = {"kind": kind}
    tally = BootstrapTally()

    def compile_once(adapter: Any, seed: int | None) -> Any:
        dspy.configure(lm=task_lm, adapter=adapter)  # global: every DSPy thread uses it
        if kind == "mipro":
            from dspy.teleprompt import MIPROv2

            bar = args.mipro_metric_threshold
            optimizer = MIPROv2(metric=make_metric(spec, bar, tally), prompt_model=prompt_lm, task_model=task_lm,
                                auto="light", metric_threshold=bar,
                                max_bootstrapped_demos=args.max_bootstrapped_demos,
                                max_labeled_demos=args.max_labeled_demos, num_threads=args.num_threads,
                                max_errors=10**6, seed=seed, verbose=False)
            with tally.watching():
                return optimizer.compile(dspy.Predict(make_signature(spec)), trainset=trainset, valset=valset,
                                         minibatch_size=min(35, len(valset)))
        ttft = TTFTObjective(engine, model, spec, split["dev"][:3], block_tokens) if kind == "gepa_ttft" else None
        budget = {"auto": "light"} if args.gepa_metric_calls is None else {"max_metric_calls": args.gepa_metric_calls}
        optimizer = dspy.GEPA(metric=make_gepa_metric(spec, ttft), reflection_lm=prompt_lm,
                              num_threads=args.num_threads, track_stats=True, seed=seed,
                              gepa_kwargs={"frontier_type": "hybrid"} if ttft is not None else None, **budget)
        program = optimizer.compile(tagged_program(make_signature(spec)), trainset=trainset, valset=valset)
        out.update(gepa_details(program, ttft))
        return program

    # JSONAdapter first; ChatAdapter without its JSON fallback, so its program (and its export) is ChatAdapter's.
    adapters = (dspy.JSONAdapter(), dspy.ChatAdapter(use_json_adapter_fallback=False))
    started = time.monotonic()
    program, record = run_with_retries(compile_once, adapters, args.seed + 9 if kind == "mipro" else args.seed)
    out.update(record)
    if kind == "mipro":  # every attempt's bootstrapping, like the cost
        out.update(metric_threshold=args.mipro_metric_threshold, bootstrap_traces_tried=tally.tried,
                   bootstrap_traces_kept=tally.kept, bootstrap_traces_failed=tally.failed)
    adapter = next((a for a in adapters if type(a).__name__ == record["adapter"]), adapters[0])
    out.update(minutes=round((time.monotonic() - started) / 60.0, 3), lm_calls=meter.calls,
               rejected_too_long=fitted.rejected, prompt_tokens_processed=meter.prompt_tokens,
               completion_tokens_processed=meter.completion_tokens,
               tokens_processed=meter.prompt_tokens + meter.completion_tokens,
               bridge_calls=meter.calls + fitted.rejected, **search_tokens([meter.counts.to_dict()]))
    if program is None:
        bridge.close()
        return out

    # Its own program on test (DSPy's prompt, the adapter it compiled with): counted apart from its cost.
    before = meter.calls
    evaluation = dspy.Evaluate(devset=[to_example(spec, r) for r in split["test"]], metric=make_metric(spec),
                               num_threads=args.num_threads, max_errors=10**6, failure_score=0.0,
                               display_progress=False)(program)
    program_scores = [float(s) for _, _, s in evaluation.results]  # in test order, for the paired difference
    ci = bootstrap_ci(program_scores, seed=args.seed)
    bridge.close()
    predictor = program.predictors()[0]
    instruction = predictor.signature.instructions
    # What the adapter sends for each test record: counted, and the export checked against it.
    formatted = [adapter.format(predictor.signature, predictor.demos, dict(r["inputs"])) for r in split["test"]]
    sent = [engine.count_tokens(messages) for messages in formatted]
    # The program's own requests as a template (bench.peer_export): same messages, schema and max_tokens.
    content = export_program(spec.name, predictor.signature, predictor.demos, adapter,
                             max_tokens=task_lm.kwargs["max_tokens"], sampling={"temperature": 0.0})
    # The byte-for-byte check, on every test record: the template renders what the adapter sent.
    differing = [str(r["id"]) for r, messages in zip(split["test"], formatted) if render(content, r["inputs"]) != messages]
    out.update(program_test_mean=ci.mean, program_test_ci_low=ci.low, program_test_ci_high=ci.high,
               program_test_n=ci.n, program_scores=program_scores,
               export_checked=len(split["test"]), export_identical=len(split["test"]) - len(differing),
               export_differing=differing[:5],
               test_eval_calls=meter.calls - before, instruction=instruction,
               examples=len(content["turns"]) // 2,
               dspy_prompt_tokens=round(statistics.fmean(sent), 1) if sent else None,
               # Spec.instruction_text() of the spec the instruction makes: the instruction alone.
               instruction_tokens=len(engine.tokenize(instruction.strip())), content=content)
    return out


def gepa_details(program: Any, ttft: TTFTObjective | None) -> dict[str, Any]:
    """What GEPA explored: candidates, metric calls, the chosen one's validation scores (and objectives)."""
    r = getattr(program, "detailed_results", None)
    if r is None:
        return {}
    best = r.best_idx
    out: dict[str, Any] = {"candidates": len(r.candidates), "total_metric_calls": r.total_metric_calls,
                           "full_val_evals": r.num_full_val_evals, "val_score": r.val_aggregate_scores[best],
                           "val_score_seed": r.val_aggregate_scores[0]}
    if ttft is not None and r.val_aggregate_subscores:
        out["val_objectives"] = r.val_aggregate_subscores[best]
        out["objective_best_candidates"] = {k: sorted(v) for k, v in (r.per_objective_best_candidates or {}).items()}
        out["predicted_ttft_ms"] = {"chosen": ttft(r.candidates[best].predictors()[0].signature.instructions),
                                    "seed": ttft(r.candidates[0].predictors()[0].signature.instructions)}
    return out

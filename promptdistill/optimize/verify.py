"""Verification helpers: the published rendering, and TTFT measured on the real engine.

* ``score_test`` (now in :mod:`promptdistill.search.held_out`, with the revert both stages
  share): the baseline and the winner on the test split, in two looks of half the records
  each; the second unless the first already clears the winner.
* ``check_rendering``: the template content, rendered with ``render_messages`` (the
  function the registry client's ``Template.render`` calls), gives exactly the messages
  the evaluator sent (``spec_messages``). What was verified is what gets published.
* ``measure_ttft_interleaved``: prefill-only requests (``max_tokens`` 1, no schema, as the
  TTFT profiler measures) rendered from each template's content, one at a time. Cold:
  after ``reset_prefix_cache()``; warm: right after that cold request, for the next
  record with the same template, so only the shared static prefix is in the cache, as in
  production (the cold request is the warm one's primer). The templates (baseline and
  winner) are timed **interleaved**: for each record and repeat, one template's cold and
  warm, then the other's, the one that goes first alternating, so drift and contention
  on the machine hit both alike. Every record is timed cold and warm. Each row carries
  the predicted TTFT for the same prompt.
* ``timing_summary``: one template's measured and predicted TTFT, cold, warm and
  expected, and how much of its static prefix a warm cache served.
* ``ttft_difference``: winner minus baseline from the interleaved pairs: the **median
  of the paired differences** with a 95% **percentile-bootstrap** interval that
  resamples the pairs within each record (records are the design, the repeats the
  noise), per cache state and for the expected TTFT.

Cost: ``2 x repeats`` requests per record and template (with a single record, 3: its warm
request needs a primer of its own); ``timing_repeats`` makes at least ``MIN_TIMING_PAIRS`` pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from promptdistill.engine.base import Engine, GenerationRequest, GenerationResult
from promptdistill.optimize.predict import clip_ttft, warm_cached_tokens
from promptdistill.optimize.select import expected_ttft
from promptdistill.search.held_out import MIN_LOOK, TEST_CONFIDENCE, score_test  # moved there; kept importable here
from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import spec_messages
from promptdistill.specs.render import render_messages
from promptdistill.ttft.features import prompt_features

__all__ = ["MIN_LOOK", "MIN_TIMING_PAIRS", "TEST_CONFIDENCE", "TimedTemplate", "check_rendering", "cold_then_warm",
           "measure_ttft_interleaved", "score_test", "timing_repeats", "timing_summary", "ttft_difference"]

T = TypeVar("T")

MIN_TIMING_PAIRS = 12
"""Paired measurements per cache state the interval is built on (records x repeats)."""
TIMING_CONFIDENCE = 0.95


def check_rendering(content: Mapping[str, Any], spec: Spec, examples: Sequence[Mapping[str, Any]],
                    records: Sequence[Mapping[str, Any]]) -> int:
    """Raise RuntimeError unless the content renders every record as the evaluator did.

    Returns:
        The number of records checked.
    """
    for r in records:
        published = render_messages(content["system"], content["user"], r["inputs"])
        evaluated = spec_messages(spec, r["inputs"], examples=examples)
        if published != evaluated:
            raise RuntimeError(f"{spec.name}: record {r['id']}: the template content renders differently from the "
                               "evaluated prompt; refusing to publish what was not verified")
    return len(records)


@dataclass(frozen=True)
class TimedTemplate:
    """One template to time: its content (what is published) and how to predict it."""

    label: str
    """'baseline' or 'winner': the rows' ``template``."""
    content: Mapping[str, Any]
    spec: Spec
    examples: Sequence[Mapping[str, Any]]
    records: Sequence[Mapping[str, Any]]
    """The records to render, in the same order for every template (pairs share an index)."""
    fewshot_count: int | None = None
    """Overrides the feature (per-request examples are not in ``examples``)."""


def timing_repeats(n_records: int, min_pairs: int = MIN_TIMING_PAIRS) -> int:
    """Repeats per record so that ``n_records x repeats >= min_pairs`` (0 without records).

    Example:
        >>> timing_repeats(2), timing_repeats(5), timing_repeats(20)
        (6, 3, 1)
    """
    return 0 if n_records <= 0 else max(1, math.ceil(min_pairs / n_records))


def measure_ttft_interleaved(
    engine: Engine,
    templates: Sequence[TimedTemplate],
    *,
    model: Any,
    n: int,
    repeats: int,
    block_tokens: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time every template on its first ``n`` records, ``repeats`` times each, interleaved.

    For record i and repeat j each template is timed cold on record i, then warm on record
    ``(i + 1) % n`` (the cold request primed its static prefix), before the next template;
    which template goes first alternates with ``i * repeats + j``. With ``n`` 1 the warm
    request is record 0 again, after a reset and a primer on the pool's next record.

    Args:
        model: the TTFT model for ``predicted_ms``; None leaves it NaN.

    Returns:
        One row per measurement: template, record_id, repeat, first (did this template
        go first), cache ('cold'/'warm'), ttft_ms, prompt_tokens, cached_tokens,
        static_prefix_tokens, predicted_ms, predicted_cached_tokens, reset_ok.
    """
    pools = [list(t.records[: n + 1]) for t in templates]
    if n <= 0 or repeats <= 0 or not templates or min(len(p) for p in pools) < 2:
        return []
    n = min([n, *(len(p) - 1 for p in pools)])

    def request(t: TimedTemplate, r: Mapping[str, Any]) -> GenerationRequest:
        messages = render_messages(t.content["system"], t.content["user"], r["inputs"])
        return GenerationRequest(messages=messages, max_tokens=1, temperature=0.0, seed=seed)

    predictions: dict[tuple[int, int], dict[str, float]] = {}

    def row(k: int, i: int, j: int, cache: str, result: GenerationResult, first: bool,
            reset_ok: bool) -> dict[str, Any]:
        t, r = templates[k], pools[k][i]
        if (k, i) not in predictions:
            predictions[k, i] = _prediction(engine, model, t, r, block_tokens)
        p = predictions[k, i]
        return {"template": t.label, "record_id": str(r["id"]), "repeat": j, "first": first, "cache": cache,
                "ttft_ms": result.ttft_ms, "prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens,
                "static_prefix_tokens": p["static_prefix_tokens"], "predicted_ms": p[cache],
                "predicted_cached_tokens": 0 if cache == "cold" else p["warm_cached"], "reset_ok": reset_ok}

    rows = []
    for i in range(n):
        for j in range(repeats):
            order = list(range(len(templates)))
            if (i * repeats + j) % 2:
                order.reverse()
            for place, k in enumerate(order):
                t, pool = templates[k], pools[k]
                cold, warm, w, reset_ok = cold_then_warm(engine, lambda x: engine.generate([request(t, pool[x])])[0],
                                                         i, n)
                rows.append(row(k, i, j, "cold", cold, place == 0, reset_ok))
                rows.append(row(k, w, j, "warm", warm, place == 0, reset_ok))
    return rows


def cold_then_warm(engine: Engine, send: Callable[[int], T], i: int, n: int) -> tuple[T, T, int, bool]:
    """Time record ``i`` of ``n`` cold, then the next record warm, with ``send(index)``.

    Cold: after ``reset_prefix_cache()``. Warm: record ``(i + 1) % n`` right after, so the
    cold request has cached the shared static prefix and nothing else of it. With one
    record (``n`` 1) record 0 is timed warm after a second reset and a primer on the
    pool's spare record 1. Returns (cold, warm, the warm record's index, reset_ok).
    """
    reset_ok = bool(engine.reset_prefix_cache())
    cold = send(i)
    if n == 1:
        reset_ok = bool(engine.reset_prefix_cache())
        send(1)
    warm_index = 0 if n == 1 else (i + 1) % n
    return cold, send(warm_index), warm_index, reset_ok


def _prediction(engine: Engine, model: Any, t: TimedTemplate, record: Mapping[str, Any],
                block_tokens: int) -> dict[str, float]:
    f = dict(prompt_features(t.spec, record["inputs"], engine, examples=t.examples))
    if t.fewshot_count is not None:
        f["fewshot_count"] = t.fewshot_count
    warm = warm_cached_tokens(f["static_prefix_tokens"], f["total_tokens"], block_tokens)
    if model is None:  # measured only (bench_prefix_cache times block sizes no model was fitted for)
        cold_ms = warm_ms = math.nan
    else:
        cold_ms, warm_ms = clip_ttft(model.predict_many([{**f, "cached_tokens": 0}, {**f, "cached_tokens": warm}],
                                                        engine_identity=engine.identity))
    return {"cold": float(cold_ms), "warm": float(warm_ms), "warm_cached": warm,
            "static_prefix_tokens": int(f["static_prefix_tokens"])}


def timing_summary(rows: Sequence[Mapping[str, Any]], label: str, warm_share: float = 0.8) -> dict[str, Any]:
    """Mean measured and predicted TTFT, cold, warm and expected (``warm_share`` warm),
    for one template's rows, and the share of its static prefix a warm cache served
    (``static_cached_share``: cached tokens the engine reported over static prefix tokens;
    ``static_cached_share_predicted``: what the prediction assumed, whole blocks)."""
    out: dict[str, Any] = {}
    mine = [r for r in rows if r["template"] == label]
    for cache in ("cold", "warm"):
        sel = [r for r in mine if r["cache"] == cache]
        if not sel:
            out.update({f"measured_{cache}_ms": None, f"predicted_{cache}_ms": None, f"abs_pct_err_{cache}": None})
            continue
        measured = sum(r["ttft_ms"] for r in sel) / len(sel)
        predicted = sum(r["predicted_ms"] for r in sel) / len(sel)
        errs = [abs(r["predicted_ms"] - r["ttft_ms"]) / r["ttft_ms"] for r in sel if r["ttft_ms"] > 0]
        out.update({
            f"measured_{cache}_ms": measured, f"predicted_{cache}_ms": predicted,
            f"abs_pct_err_{cache}": sum(errs) / len(errs) if errs else None,
            f"cached_tokens_{cache}": sum(r["cached_tokens"] for r in sel) / len(sel),
        })
    for kind in ("measured", "predicted"):
        cold, warm = out[f"{kind}_cold_ms"], out[f"{kind}_warm_ms"]
        out[f"{kind}_expected_ms"] = None if cold is None or warm is None else expected_ttft(cold, warm, warm_share)
    warm_rows = [r for r in mine if r["cache"] == "warm" and r.get("static_prefix_tokens") is not None]
    static = sum(r["static_prefix_tokens"] for r in warm_rows) / len(warm_rows) if warm_rows else None
    out["static_prefix_tokens_timed"] = static
    out["static_cached_share"] = (sum(r["cached_tokens"] for r in warm_rows) / len(warm_rows) / static) if static else None
    out["static_cached_share_predicted"] = (sum(r["predicted_cached_tokens"] for r in warm_rows) / len(warm_rows) / static
                                            if static else None)
    out["timing_n"] = len({r["record_id"] for r in mine})
    out["timing_repeats"] = len({r.get("repeat", 0) for r in mine})
    return out


def ttft_difference(
    rows: Sequence[Mapping[str, Any]],
    *,
    warm_share: float,
    first: str = "baseline",
    second: str = "winner",
    confidence: float = TIMING_CONFIDENCE,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Measured ``second - first`` TTFT from interleaved rows, with an interval.

    A pair is the two templates' measurements of one record in one repeat and cache state
    (taken back to back). Per cache state, and for the expected TTFT (``warm_share`` of
    each pair's warm difference plus the rest of its cold one): the median of the paired
    differences and a two-sided percentile-bootstrap interval that resamples the pairs
    within each record. Fewer than two pairs give the median and no interval.

    Returns:
        ``measured_{cold,warm,expected}_diff_ms`` with ``_low_ms``/``_high_ms``,
        ``timing_pairs`` (pairs per cache state), ``timing_interval`` (how it was made).
    """
    by_key: dict[tuple[str, str, int, str], float] = {}
    for r in rows:
        by_key[(r["template"], r["record_id"], int(r.get("repeat", 0)), r["cache"])] = float(r["ttft_ms"])
    diffs: dict[str, dict[str, list[float]]] = {"cold": {}, "warm": {}, "expected": {}}
    keys = sorted({(rec, rep) for (t, rec, rep, _c) in by_key if t == first})
    for rec, rep in keys:
        pair = {}
        for cache in ("cold", "warm"):
            a, b = by_key.get((first, rec, rep, cache)), by_key.get((second, rec, rep, cache))
            if a is not None and b is not None:
                pair[cache] = b - a
                diffs[cache].setdefault(rec, []).append(b - a)
        if len(pair) == 2:
            diffs["expected"].setdefault(rec, []).append(warm_share * pair["warm"] + (1 - warm_share) * pair["cold"])
    out: dict[str, Any] = {}
    rng = np.random.default_rng(seed)
    for cache, per_record in diffs.items():
        pooled = np.concatenate([np.asarray(v) for v in per_record.values()]) if per_record else np.zeros(0)
        median = float(np.median(pooled)) if pooled.size else None
        low = high = None
        if pooled.size >= 2:
            groups = [np.asarray(v) for v in per_record.values()]
            boots = np.empty(n_boot)
            for b in range(n_boot):
                boots[b] = np.median(np.concatenate([g[rng.integers(0, g.size, g.size)] for g in groups]))
            tail = (1.0 - confidence) / 2.0
            low, high = (float(x) for x in np.quantile(boots, [tail, 1.0 - tail]))
        out.update({f"measured_{cache}_diff_ms": median, f"measured_{cache}_diff_low_ms": low,
                    f"measured_{cache}_diff_high_ms": high})
    out["timing_pairs"] = sum(len(v) for v in diffs["cold"].values())
    out["timing_interval"] = (f"median of {out['timing_pairs']} interleaved pairs ({second} - {first}), "
                              f"{confidence:.0%} percentile bootstrap within records")
    return out

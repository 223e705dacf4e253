"""Verification helpers: the published rendering, and TTFT measured on the real engine.

* ``check_rendering``: the template content, rendered with ``render_messages`` (the
  function the registry client's ``Template.render`` calls), gives exactly the messages
  the evaluator sent (``spec_messages``). What was verified is what gets published.
* ``measure_ttft``: prefill-only requests (``max_tokens`` 1, no schema, as the TTFT
  profiler measures) rendered from the template content, one at a time:
  cold after ``reset_prefix_cache()``; warm after a reset and one request for another
  record with the same template, so only the shared static prefix is in the cache, as
  in production. Each row carries the predicted TTFT for the same prompt.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from promptdistill.engine.base import Engine, GenerationRequest
from promptdistill.optimize.predict import clip_ttft, warm_cached_tokens
from promptdistill.optimize.select import expected_ttft
from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import spec_messages
from promptdistill.specs.render import render_messages
from promptdistill.ttft.features import prompt_features

__all__ = ["check_rendering", "measure_ttft", "timing_summary"]


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


def measure_ttft(
    engine: Engine,
    content: Mapping[str, Any],
    spec: Spec,
    examples: Sequence[Mapping[str, Any]],
    records: Sequence[Mapping[str, Any]],
    *,
    model: Any,
    n: int,
    block_tokens: int,
    fewshot_count: int | None = None,
    label: str = "",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Measure TTFT cold and warm for the first ``n`` records (another record primes the warm run).

    Returns:
        One row per measurement: template, record_id, cache ('cold'/'warm'), ttft_ms,
        prompt_tokens, cached_tokens, predicted_ms, reset_ok.
    """
    pool = list(records[: n + 1])
    if n <= 0 or len(pool) < 2:
        return []

    def request(r: Mapping[str, Any]) -> GenerationRequest:
        messages = render_messages(content["system"], content["user"], r["inputs"])
        return GenerationRequest(messages=messages, max_tokens=1, temperature=0.0, seed=seed)

    rows = []
    for i, r in enumerate(pool[:n]):
        f = dict(prompt_features(spec, r["inputs"], engine, examples=examples))
        if fewshot_count is not None:
            f["fewshot_count"] = fewshot_count
        warm_assumed = warm_cached_tokens(f["static_prefix_tokens"], f["total_tokens"], block_tokens)
        cold, warm = clip_ttft(model.predict_many([{**f, "cached_tokens": 0}, {**f, "cached_tokens": warm_assumed}],
                                                  engine_identity=engine.identity))
        predicted = {"cold": float(cold), "warm": float(warm)}
        for cache in ("cold", "warm"):
            reset_ok = bool(engine.reset_prefix_cache())
            if cache == "warm":
                engine.generate([request(pool[(i + 1) % len(pool)])])
            result = engine.generate([request(r)])[0]
            rows.append({
                "template": label, "record_id": str(r["id"]), "cache": cache, "ttft_ms": result.ttft_ms,
                "prompt_tokens": result.prompt_tokens, "cached_tokens": result.cached_tokens,
                "predicted_ms": predicted[cache], "predicted_cached_tokens": 0 if cache == "cold" else warm_assumed,
                "reset_ok": reset_ok,
            })
    return rows


def timing_summary(rows: Sequence[Mapping[str, Any]], label: str, warm_share: float = 0.8) -> dict[str, Any]:
    """Mean measured and predicted TTFT, cold, warm and expected (``warm_share`` warm),
    for one template's rows."""
    out: dict[str, Any] = {}
    for cache in ("cold", "warm"):
        sel = [r for r in rows if r["template"] == label and r["cache"] == cache]
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
    out["timing_n"] = len({r["record_id"] for r in rows if r["template"] == label})
    return out

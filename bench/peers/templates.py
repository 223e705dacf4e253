"""Every side's template scored and timed the same way, on the test records.

Ours is a registry template (system + user), scored by ``promptdistill.evaluate`` as a
service would use it and timed by the optimizer's own function. A peer's program is
exported by ``bench.peer_export`` (its adapter's messages, demo turns included): it is
scored by its own requests, parsed as its adapter parses them, and timed by
``bench.peer_export.measure_ttft``.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Mapping, Sequence

from promptdistill.engine.base import Engine
from promptdistill.specs.render import unescape_braces

__all__ = ["content_spec", "peer_template_scores", "template_scores", "ttft_figures"]


def content_spec(spec: Any, content: Mapping[str, Any]) -> Any:
    """The spec that renders exactly ``content``: its system text as the instruction (system text
    is literal), no context, rules or separate examples, the content's user part, schema and
    ``max_tokens``."""
    system = unescape_braces(content["system"])  # build_system's escaping, undone
    examples = dataclasses.replace(spec.examples, count=0, selection="first", ids=())
    return spec.with_changes(instruction=system, context=None, constraints=(), examples=examples,
                             user=content["user"], output_schema=content["output_schema"],
                             max_tokens=content["max_tokens"])


def template_scores(engine: Engine, spec: Any, content: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                    seed: int) -> dict[str, Any]:
    """The template scored on ``records`` as a service would use it, and its prompt tokens.

    Rendering is checked first: the spec evaluated renders every record exactly as the
    content does (``render_messages``, the client's path).
    """
    from promptdistill.core.stats import bootstrap_ci
    from promptdistill.evaluate import evaluate
    from promptdistill.optimize.verify import check_rendering
    from promptdistill.specs.render import render_messages

    cspec = content_spec(spec, content)
    check_rendering(content, cspec, [], records)
    report = evaluate(engine, cspec, records, constrained=content["response_format"] == "json_schema",
                      max_tokens=content["max_tokens"], seed=seed)
    ci = bootstrap_ci(report.scores, seed=seed)
    tokens = [engine.count_tokens(render_messages(content["system"], content["user"], r["inputs"])) for r in records]
    return {"test_mean": ci.mean, "test_ci_low": ci.low, "test_ci_high": ci.high, "test_n": ci.n,
            "test_valid_json_rate": report.valid_json_rate,
            "prompt_tokens": round(statistics.fmean(tokens), 1) if tokens else None, "scores": report.scores}


def peer_template_scores(engine: Engine, spec: Any, content: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                         seed: int) -> dict[str, Any]:
    """A peer's exported program (``bench.peer_export``) scored on ``records``: its requests,
    its replies parsed as its adapter parses them, and the program's metric (``spec_score``:
    a reply the adapter refuses scores 0, as the program's failure score)."""
    from bench.peer_export import ParseError, parse_reply, render, requests
    from bench.peers.counting import FitToContext
    from bench.peers.dspy_program import spec_score, to_example
    from promptdistill.core.stats import bootstrap_ci
    from promptdistill.evaluate.evaluator import BATCH_TIMEOUT_S

    # Through FitToContext as the program's evaluation was: a prompt over the context window
    # gets an empty reply (0, as the program's failed call) instead of failing the batch.
    results = FitToContext(engine).generate(requests(content, records, seed=seed, timeout_s=BATCH_TIMEOUT_S))
    scores, parsed = [], []
    for r, res in zip(records, results):
        try:
            fields: Mapping[str, Any] = parse_reply(content, res.text)
        except ParseError:
            fields = {}
        parsed.append(bool(fields))
        scores.append(spec_score(spec, to_example(spec, r), fields)[0])
    ci = bootstrap_ci(scores, seed=seed)
    tokens = [engine.count_tokens(render(content, r["inputs"])) for r in records]
    return {"test_mean": ci.mean, "test_ci_low": ci.low, "test_ci_high": ci.high, "test_n": ci.n,
            "test_valid_json_rate": statistics.fmean(parsed) if parsed else None,
            "prompt_tokens": round(statistics.fmean(tokens), 1) if tokens else None, "scores": scores}


def ttft_figures(engine: Engine, model: Any, spec: Any, content: Mapping[str, Any],
                 records: Sequence[Mapping[str, Any]], *, n: int, block_tokens: int, label: str,
                 seed: int) -> dict[str, Any]:
    """Measured TTFT cold and warm (``measure_ttft_interleaved``, the optimizer's own function, on this one
    template), means over ``n`` records."""
    from promptdistill.optimize.verify import TimedTemplate, measure_ttft_interleaved

    template = TimedTemplate(label, content, content_spec(spec, content), [], records)
    rows = measure_ttft_interleaved(engine, [template], model=model, n=n, repeats=1, block_tokens=block_tokens,
                                    seed=seed)

    def mean(cache: str) -> float | None:
        sel = [r["ttft_ms"] for r in rows if r["cache"] == cache]
        return round(statistics.fmean(sel), 1) if sel else None

    return {"ttft_cold_ms": mean("cold"), "ttft_warm_ms": mean("warm"), "timing_n": len(rows) // 2}

"""The shared evaluator: run a spec over records on the engine and score every reply.

Used by the distiller and the optimizer alike, so both measure quality the same way:

* rendering goes through ``spec_messages`` only (what is evaluated is what is published);
* all requests of an evaluation go to the engine as ONE ``generate`` batch
  (``evaluate_many`` puts several specs into that one batch);
* decoding is constrained to ``spec.output_schema`` when ``constrained`` (the default);
* replies are scored with ``metrics.score_reply``; ``judge_rubric`` specs are scored by
  the ``rubric_score`` judge, whose 1-5 score is mapped to [0, 1] as (score - 1) / 4;
* with ``baseline_replies``, every reply is also compared with the baseline's reply by
  ``answer_equivalence`` (both orders); 1 better, 0.5 as good, 0 worse.

A reply the judge could not score (invalid twice) has score None and is left out of the
mean; ``n_scored`` says how many counted. Nothing is filled in by default.

Example:
    >>> report = evaluate(engine, spec, records(dataset_for(spec), "dev")[:8])  # doctest: +SKIP
    >>> report.mean, report.valid_json_rate, report.lm_calls                   # doctest: +SKIP
    (0.75, 1.0, 8)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from promptdistill.engine.base import Engine, GenerationRequest, validate_reply
from promptdistill.metrics import score_reply
from promptdistill.render import render_text
from promptdistill.specs import Spec, spec_messages

__all__ = ["BATCH_TIMEOUT_S", "EvalReport", "evaluate", "evaluate_many", "judge_cost", "mean_of"]

BATCH_TIMEOUT_S = 3600.0
"""Timeout of evaluation and judge requests. The engine bounds a whole batch by its
longest request timeout, and a batch of a hundred requests on a busy 2-core CPU takes
many minutes: the engine's 120 s default is a per-call bound, not a batch bound. Fixed
(not scaled with the batch) so equal requests stay equal; budgets bound the run."""


def mean_of(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are not None; None when there are none."""
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


@dataclass
class EvalReport:
    """One spec evaluated on a list of records; per-record lists are in record order."""

    spec_name: str
    record_ids: list[str]
    scores: list[float | None]
    replies: list[str]
    valid: list[bool | None]
    """Did each reply match the output schema? None when the spec has none."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_calls: int = 0
    judge_calls: int = 0
    """LM requests the judges made for this evaluation (repairs included)."""
    equivalence: list[float | None] | None = None
    """answer_equivalence against the baseline's replies (1/0.5/0), when asked for."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.record_ids)

    @property
    def mean(self) -> float | None:
        """Mean score of the scored records (None when nothing was scored)."""
        return mean_of(self.scores)

    @property
    def n_scored(self) -> int:
        return sum(s is not None for s in self.scores)

    @property
    def valid_json_rate(self) -> float | None:
        return mean_of([None if v is None else float(v) for v in self.valid])

    @property
    def equivalence_mean(self) -> float | None:
        return None if self.equivalence is None else mean_of(self.equivalence)

    @property
    def lm_calls(self) -> int:
        return self.generation_calls + self.judge_calls

    def merged(self, other: "EvalReport") -> "EvalReport":
        """This report followed by ``other`` (same spec, disjoint records)."""
        eq = None
        if self.equivalence is not None or other.equivalence is not None:
            eq = (self.equivalence or [None] * self.n) + (other.equivalence or [None] * other.n)
        return EvalReport(
            spec_name=self.spec_name,
            record_ids=self.record_ids + other.record_ids,
            scores=self.scores + other.scores,
            replies=self.replies + other.replies,
            valid=self.valid + other.valid,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            generation_calls=self.generation_calls + other.generation_calls,
            judge_calls=self.judge_calls + other.judge_calls,
            equivalence=eq,
        )

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a flat dict."""
        return {
            "spec": self.spec_name, "n": self.n, "n_scored": self.n_scored, "mean": self.mean,
            "valid_json_rate": self.valid_json_rate, "equivalence": self.equivalence_mean,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "lm_calls": self.lm_calls,
        }


def judge_cost(spec: Spec, n_records: int, *, with_equivalence: bool = False) -> int:
    """Most LM calls ``evaluate`` can make on ``n_records`` (every judge repair included)."""
    calls = n_records
    if spec.metric.kind == "judge_rubric":
        calls += 2 * n_records
    if with_equivalence:
        calls += 4 * n_records
    return calls


def _expected_text(expected: Any) -> str:
    return expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)


def evaluate(
    engine: Engine,
    spec: Spec,
    records: Sequence[Mapping[str, Any]],
    *,
    examples: Sequence[Mapping[str, Any]] = (),
    constrained: bool = True,
    judge_runner: Any = None,
    max_tokens: int | None = None,
    seed: int = 0,
    baseline_replies: Sequence[str] | None = None,
) -> EvalReport:
    """Evaluate one spec on ``records`` with one batched ``generate`` call.

    Args:
        engine: Any engine (wrap it in ``CachedEngine`` to make re-runs free).
        spec: The spec to evaluate.
        records: Dataset records (``id``, ``inputs``, ``expected``).
        examples: Few-shot examples rendered into the system part.
        constrained: Constrain decoding to ``spec.output_schema`` (if it has one).
        judge_runner: The ``JudgeRunner`` for judge-scored specs and equivalence; one on
            ``engine`` is made when needed and not given.
        max_tokens: Overrides ``spec.max_tokens`` (default 256 when the spec has none).
        seed: Sampling seed of every request.
        baseline_replies: The baseline's replies to the same records, to compare with.
    """
    return evaluate_many(
        engine, [spec], records, examples=examples, constrained=constrained, judge_runner=judge_runner,
        max_tokens=max_tokens, seed=seed, baseline_replies=baseline_replies,
    )[0]


def evaluate_many(
    engine: Engine,
    specs: Sequence[Spec],
    records: Sequence[Mapping[str, Any]],
    *,
    examples: Sequence[Mapping[str, Any]] = (),
    constrained: bool = True,
    judge_runner: Any = None,
    max_tokens: int | None = None,
    seed: int = 0,
    baseline_replies: Sequence[str] | None = None,
) -> list[EvalReport]:
    """Evaluate several specs on the same records; every generation goes in ONE batch.

    Judge calls (rubric scores, equivalence) are batched across all specs as well.
    Returns one ``EvalReport`` per spec, in order.
    """
    if baseline_replies is not None and len(baseline_replies) != len(records):
        raise ValueError(f"baseline_replies has {len(baseline_replies)} replies for {len(records)} records")
    requests = []
    for spec in specs:
        schema = spec.output_schema if constrained else None
        limit = max_tokens or spec.max_tokens or 256
        for r in records:
            messages = spec_messages(spec, r["inputs"], examples=examples)
            requests.append(
                GenerationRequest(messages=messages, json_schema=schema, max_tokens=limit, temperature=0.0, seed=seed,
                                  timeout_s=BATCH_TIMEOUT_S)
            )
    results = engine.generate(requests) if requests else []
    reports = []
    for k, spec in enumerate(specs):
        chunk = results[k * len(records) : (k + 1) * len(records)]
        replies = [res.text for res in chunk]
        valid: list[bool | None] = [None] * len(records)
        if spec.output_schema is not None:
            valid = [validate_reply(text, spec.output_schema)[1] is None for text in replies]
        scores = [
            score_reply(spec.metric, text, r["expected"], output_schema=spec.output_schema)
            for text, r in zip(replies, records)
        ]
        reports.append(EvalReport(
            spec_name=spec.name,
            record_ids=[str(r["id"]) for r in records],
            scores=scores,
            replies=replies,
            valid=valid,
            prompt_tokens=sum(res.prompt_tokens for res in chunk),
            completion_tokens=sum(res.completion_tokens for res in chunk),
            generation_calls=len(chunk),
        ))

    needs_rubric = [k for k, s in enumerate(specs) if s.metric.kind == "judge_rubric"]
    if (needs_rubric or baseline_replies is not None) and records:
        if judge_runner is None:
            from promptdistill.judge_runner import JudgeRunner

            judge_runner = JudgeRunner(engine, seed=seed)
        _rubric_scores(judge_runner, specs, records, reports, needs_rubric)
        if baseline_replies is not None:
            _equivalence(judge_runner, specs, records, reports, baseline_replies)
    return reports


def _input_text(spec: Spec, record: Mapping[str, Any]) -> str:
    return render_text(spec.user, record["inputs"])


def _rubric_scores(runner: Any, specs: Sequence[Spec], records: Sequence[Mapping[str, Any]],
                   reports: list[EvalReport], which: list[int]) -> None:
    items = []
    for k in which:
        spec = specs[k]
        for r, reply in zip(records, reports[k].replies):
            items.append({
                "task": spec.description, "rubric": spec.metric.rubric or spec.description,
                "input": _input_text(spec, r), "reference": _expected_text(r["expected"]), "answer": reply,
            })
    if not items:
        return
    verdicts = runner.run("rubric_score", items)
    for n, k in enumerate(which):
        chunk = verdicts[n * len(records) : (n + 1) * len(records)]
        reports[k].scores = [(v.value["score"] - 1) / 4 if v.valid else None for v in chunk]
        # One batch served every spec; each verdict knows the calls it took.
        reports[k].judge_calls += sum(v.attempts for v in chunk)


def _equivalence(runner: Any, specs: Sequence[Spec], records: Sequence[Mapping[str, Any]],
                 reports: list[EvalReport], baseline_replies: Sequence[str]) -> None:
    items = []
    for spec, report in zip(specs, reports):
        items += [(_input_text(spec, r), base, reply) for r, base, reply in zip(records, baseline_replies, report.replies)]
    comparisons = runner.compare(specs[0].description, items)
    for k, report in enumerate(reports):
        chunk = comparisons[k * len(records) : (k + 1) * len(records)]
        report.equivalence = [c.score for c in chunk]
        report.judge_calls += sum(c.forward.attempts + c.backward.attempts for c in chunk)

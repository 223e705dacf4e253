"""The shared evaluator: run specs over records on the engine and score every reply.

Used by the distiller and the optimizer alike, so both measure quality the same way:

* rendering goes through ``spec_messages`` only (what is evaluated is what is published);
* every generation of an evaluation goes to the engine as ONE ``generate`` batch
  (``evaluate_many`` puts several items, each a spec with its examples and records,
  into that one batch);
* decoding is constrained to ``spec.output_schema`` when ``constrained`` (the default);
* replies are scored with ``metrics.score_reply``; ``judge_rubric`` specs are scored by
  the ``rubric_score`` judge, whose 1-5 score is mapped to [0, 1] as (score - 1) / 4;
* a record's ``reference`` (scoring data) goes to the metric and to the judge's rubric,
  never into the rendered prompt.

A reply that fails the spec's output schema (truncated at ``max_tokens``, or free text
where JSON was asked for) scores 0, whatever the metric gives it: a service cannot parse it.
A reply the judge could not score (invalid twice) has score None and is left out of the
mean; ``n_scored`` says how many counted. Nothing else is filled in.

Example:
    >>> report = evaluate(engine, spec, splits.screen)       # doctest: +SKIP
    >>> report.mean, report.valid_json_rate, report.lm_calls # doctest: +SKIP
    (0.75, 1.0, 8)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from promptdistill.core.stats import mean_of
from promptdistill.engine.base import Engine, GenerationRequest, validate_reply
from promptdistill.judges.runner import JudgeRunner
from promptdistill.specs.metrics import score_reply
from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import output_schema_for, spec_messages
from promptdistill.specs.render import render_text, value_text

__all__ = ["BATCH_TIMEOUT_S", "EvalItem", "EvalReport", "evaluate", "evaluate_many", "judge_cost"]

BATCH_TIMEOUT_S = 3600.0
"""Timeout of evaluation and judge requests. The engine bounds a whole batch by its
longest request timeout, and a batch of a hundred requests on a busy 2-core CPU takes
many minutes: the engine's 120 s default is a per-call bound, not a batch bound. Fixed
(not scaled with the batch) so equal requests stay equal; budgets bound the run."""

Record = Mapping[str, Any]


@dataclass
class EvalReport:
    """One spec evaluated on a list of records; per-record lists are in record order."""

    spec_name: str
    record_ids: list[str]
    scores: list[float | None]
    replies: list[str]
    valid: list[bool | None]
    """Did each reply match the output schema? None when the spec has none."""
    completion_tokens: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    """Did each reply stop at ``max_tokens``?"""
    prompt_tokens: int = 0
    generation_calls: int = 0
    judge_calls: int = 0
    """LM requests the judges made for this evaluation (repairs included)."""

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
    def lm_calls(self) -> int:
        return self.generation_calls + self.judge_calls

    def merged(self, other: "EvalReport") -> "EvalReport":
        """This report followed by ``other`` (same spec, disjoint records)."""
        return EvalReport(
            spec_name=self.spec_name,
            record_ids=self.record_ids + other.record_ids,
            scores=self.scores + other.scores,
            replies=self.replies + other.replies,
            valid=self.valid + other.valid,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            truncated=self.truncated + other.truncated,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            generation_calls=self.generation_calls + other.generation_calls,
            judge_calls=self.judge_calls + other.judge_calls,
        )

    def head(self, n: int) -> "EvalReport":
        """The first ``n`` records (token totals are not split: prompt_tokens is left at 0)."""
        return EvalReport(
            spec_name=self.spec_name, record_ids=self.record_ids[:n], scores=self.scores[:n],
            replies=self.replies[:n], valid=self.valid[:n], completion_tokens=self.completion_tokens[:n],
            truncated=self.truncated[:n],
        )


@dataclass(frozen=True)
class EvalItem:
    """One spec to evaluate on its records, with the few-shot examples of its system part."""

    spec: Spec
    records: Sequence[Record]
    examples: Sequence[Record] = ()
    constrained: bool = True
    """Constrain decoding to ``spec.output_schema`` (if it has one)."""
    max_tokens: int | None = None
    """Overrides ``spec.max_tokens`` (256 when the spec has none)."""

    def requests(self, seed: int) -> list[GenerationRequest]:
        limit = self.max_tokens or self.spec.max_tokens or 256
        return [
            GenerationRequest(messages=spec_messages(self.spec, r["inputs"], examples=self.examples),
                              json_schema=output_schema_for(self.spec, r["inputs"]) if self.constrained else None,
                              max_tokens=limit, temperature=0.0, seed=seed, timeout_s=BATCH_TIMEOUT_S)
            for r in self.records
        ]


def judge_cost(spec: Spec, n_records: int) -> int:
    """Most LM calls ``evaluate`` can make on ``n_records`` (every judge repair included)."""
    # One generation per record; a judge-scored one adds the rubric judge's ask and one repair.
    return 3 * n_records if spec.metric.kind == "judge_rubric" else n_records


def evaluate(engine: Engine, spec: Spec, records: Sequence[Record], *, examples: Sequence[Record] = (),
             constrained: bool = True, judge_runner: JudgeRunner | None = None, max_tokens: int | None = None,
             seed: int = 0) -> EvalReport:
    """Evaluate one spec on ``records`` with one batched ``generate`` call (see ``EvalItem``)."""
    item = EvalItem(spec, records, examples, constrained, max_tokens)
    return evaluate_many(engine, [item], judge_runner=judge_runner, seed=seed)[0]


def evaluate_many(engine: Engine, items: Sequence[EvalItem], *, judge_runner: JudgeRunner | None = None,
                  seed: int = 0) -> list[EvalReport]:
    """Evaluate several items; every generation goes in ONE batch, judge calls in one more.

    Args:
        engine: any engine (wrap it in ``CachedEngine`` to make re-runs free).
        items: what to evaluate; each item's report comes back in order.
        judge_runner: the ``JudgeRunner`` for judge-scored specs; one on ``engine`` is made
            when needed and not given.
        seed: sampling seed of every request.
    """
    batches = [item.requests(seed) for item in items]
    results = engine.generate([req for batch in batches for req in batch]) if any(batches) else []
    reports, start = [], 0
    for item, batch in zip(items, batches):
        chunk = results[start : start + len(batch)]
        start += len(batch)
        spec = item.spec
        replies = [res.text for res in chunk]
        schemas = [output_schema_for(spec, r["inputs"]) for r in item.records]
        valid = [None if schema is None else validate_reply(text, schema)[1] is None
                 for text, schema in zip(replies, schemas)]
        reports.append(EvalReport(
            spec_name=spec.name,
            record_ids=[str(r["id"]) for r in item.records],
            scores=[score_reply(spec.metric, text, r["expected"], output_schema=schema, inputs=r["inputs"],
                                record_id=r["id"], where=spec.where, reference=r.get("reference"))
                    for text, r, schema in zip(replies, item.records, schemas)],
            replies=replies,
            valid=valid,
            completion_tokens=[res.completion_tokens for res in chunk],
            truncated=[res.finish_reason == "length" for res in chunk],
            prompt_tokens=sum(res.prompt_tokens for res in chunk),
            generation_calls=len(chunk),
        ))
    rubric = [k for k, item in enumerate(items) if item.spec.metric.kind == "judge_rubric" and item.records]
    if rubric:
        runner = judge_runner if judge_runner is not None else JudgeRunner(engine, seed=seed)
        _rubric_scores(runner, items, reports, rubric)
    for report in reports:
        # A reply that fails its output schema is a request the service cannot parse: it
        # scores 0 whatever its text earns from a lenient metric (truncated JSON must not pass).
        report.scores = [0.0 if ok is False else score for score, ok in zip(report.scores, report.valid)]
    return reports


def _input_text(spec: Spec, record: Record) -> str:
    return render_text(spec.user, record["inputs"])


def _rubric_text(spec: Spec, record: Record) -> str:
    """The spec's rubric, and the record's ``reference`` (scoring data the prompt never shows)."""
    rubric = spec.metric.rubric or spec.description
    reference = record.get("reference")
    return rubric if reference is None else f"{rubric}\nFor this input: {value_text(reference)}"


def _rubric_scores(runner: JudgeRunner, items: Sequence[EvalItem], reports: list[EvalReport], which: list[int]) -> None:
    # A reply that fails its output schema scores 0 whatever the judge says (evaluate_many),
    # so the judge is asked about the others only.
    asks, spans = [], []
    for k in which:
        spec, report = items[k].spec, reports[k]
        judged = [i for i, ok in enumerate(report.valid) if ok is not False]
        spans.append((k, judged, len(asks)))
        asks += [{"task": spec.description, "rubric": _rubric_text(spec, r), "input": _input_text(spec, r),
                  "reference": value_text(r["expected"]), "answer": reply}
                 for r, reply in ((items[k].records[i], report.replies[i]) for i in judged)]
    verdicts = runner.run("rubric_score", asks) if asks else []
    for k, judged, lo in spans:
        chunk = verdicts[lo : lo + len(judged)]
        scores: list[float | None] = [0.0] * reports[k].n
        for i, v in zip(judged, chunk):
            scores[i] = (v.value["score"] - 1) / 4 if v.valid else None
        reports[k].scores = scores
        # One batch served every item; each verdict knows the calls it took.
        reports[k].judge_calls += sum(v.attempts for v in chunk)

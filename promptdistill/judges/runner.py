"""Running judges: one code path for calling, validating, repairing and recording.

Every judge call goes through ``JudgeRunner.run``:

1. render each item with the judge's definition (values cut to their ``max_chars``);
   an item whose prompt would not fit the context is recorded invalid without a call;
2. send all items as ONE batch, decoding constrained to the judge's output schema
   (temperature 0, the runner's seed);
3. validate every reply with jsonschema (and an optional extra ``check``);
4. re-ask every invalid reply once, in one batch, with the error shown and twice the
   token allowance (the repair retry);
5. record what is still invalid as invalid (``Verdict.valid`` False, ``value`` None):
   never a crash, never a silent default.

``compare`` runs ``answer_equivalence`` with the two answers in both orders; a verdict
that changes with the order counts as ``same`` and lowers the swap-consistency rate.

Example:
    >>> runner = JudgeRunner(engine, seed=0)                                # doctest: +SKIP
    >>> [v.value for v in runner.run("rubric_score", [{"task": ..., ...}])]  # doctest: +SKIP
    [{'score': 4}]
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

from promptdistill.core.jsonio import canonical_json
from promptdistill.engine.base import Engine, GenerationRequest, validate_reply
from promptdistill.judges.definitions import JudgeDefinition, load_judge

__all__ = ["Comparison", "JudgeRunner", "JudgeStats", "Verdict"]

_REPAIR = "That reply is invalid: {error}. Reply again with only the JSON object, matching the schema exactly."
_MAX_REPAIR_TOKENS = 1024
_BATCH_TIMEOUT_S = 3600.0  # a batch bound, as evaluate.evaluator.BATCH_TIMEOUT_S explains

Check = Callable[[Any], "str | None"]


@dataclass
class JudgeStats:
    """What one judge cost and how reliable it was, over the runner's life."""

    judge: str
    version: int
    items: int = 0
    """Verdicts asked for."""
    calls: int = 0
    """LM requests sent, repairs included."""
    valid: int = 0
    invalid: int = 0
    repairs: int = 0
    """Items re-asked after an invalid first reply."""
    repaired: int = 0
    """Items whose repair reply was valid."""
    too_long: int = 0
    """Items recorded invalid without a call: the prompt did not fit the context."""
    pairs: int = 0
    """Order-swapped comparisons with both orders valid."""
    swap_consistent: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def valid_share(self) -> float | None:
        return self.valid / self.items if self.items else None

    @property
    def swap_consistency(self) -> float | None:
        return self.swap_consistent / self.pairs if self.pairs else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["valid_share"] = self.valid_share
        data["swap_consistency"] = self.swap_consistency
        return data


@dataclass(frozen=True)
class Verdict:
    """One judge reply: valid with its parsed value, or invalid with the reason."""

    judge: str
    version: int
    valid: bool
    value: Any
    error: str | None
    attempts: int
    """LM calls spent on this item: 0 (too long), 1, or 2 (repaired)."""
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


_CANDIDATE_VIEW = {  # (order, raw verdict) -> the candidate's standing against the reference
    ("forward", "B"): "better", ("forward", "A"): "worse", ("forward", "same"): "same",
    ("backward", "A"): "better", ("backward", "B"): "worse", ("backward", "same"): "same",
}
_SCORE = {"better": 1.0, "same": 0.5, "worse": 0.0}


@dataclass(frozen=True)
class Comparison:
    """A candidate answer against a reference, judged in both orders.

    ``forward`` shows (A=reference, B=candidate), ``backward`` (A=candidate, B=reference).
    """

    verdict: str | None
    """'better', 'same' or 'worse' for the candidate; None when either order was invalid."""
    consistent: bool | None
    """Did both orders agree? None when either order was invalid."""
    forward: Verdict
    backward: Verdict

    @property
    def score(self) -> float | None:
        """1 better, 0.5 same, 0 worse, None invalid."""
        return None if self.verdict is None else _SCORE[self.verdict]

    @property
    def as_good(self) -> bool | None:
        """Is the candidate at least as good as the reference?"""
        return None if self.verdict is None else self.verdict != "worse"


@dataclass
class _Item:
    index: int
    messages: list[dict[str, str]]
    max_tokens: int
    attempts: int = 0
    text: str = ""
    value: Any = None
    error: str | None = "not run"
    prompt_tokens: int = 0
    completion_tokens: int = 0


class JudgeRunner:
    """Runs judge definitions on an engine, batched, validated, repaired and recorded.

    Args:
        engine: The engine to call (a ``CachedEngine`` makes re-runs free).
        judges_dir: Where the YAML definitions live (default: ``judges/``).
        seed: Sampling seed of every judge request.

    Attributes:
        stats: ``JudgeStats`` per judge name.
        records: One dict per verdict (judge, version, input hash, valid, error, ...).
    """

    def __init__(self, engine: Engine, *, judges_dir: str | os.PathLike[str] | None = None, seed: int = 0):
        self.engine = engine
        self.judges_dir = judges_dir
        self.seed = seed
        self.stats: dict[str, JudgeStats] = {}
        self.records: list[dict[str, Any]] = []
        self._definitions: dict[str, JudgeDefinition] = {}

    def definition(self, name: str) -> JudgeDefinition:
        """The loaded (and cached) definition of judge ``name``."""
        if name not in self._definitions:
            self._definitions[name] = load_judge(name, self.judges_dir)
        return self._definitions[name]

    @property
    def total_calls(self) -> int:
        """LM requests sent by every judge so far."""
        return sum(s.calls for s in self.stats.values())

    def run(
        self,
        name: str,
        items: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int | None = None,
        check: Check | None = None,
    ) -> list[Verdict]:
        """Ask judge ``name`` about every item; verdicts come back in input order.

        Args:
            name: A judge definition's name.
            items: Input values, one mapping per verdict.
            max_tokens: Overrides the definition's ``max_tokens``.
            check: An extra test of a schema-valid value; it returns an error message or
                None. A failed check is treated like a schema error (repaired once).
        """
        judge = self.definition(name)
        stats = self.stats.setdefault(name, JudgeStats(judge=name, version=judge.version))
        limit = max_tokens or judge.max_tokens
        work = [_Item(i, judge.messages(values), limit) for i, values in enumerate(items)]
        pending = self._call(judge, work, check, stats)
        for item in pending:
            item.messages = item.messages + [
                {"role": "assistant", "content": item.text},
                {"role": "user", "content": _REPAIR.format(error=item.error)},
            ]
            item.max_tokens = min(2 * item.max_tokens, _MAX_REPAIR_TOKENS)
        stats.repairs += len(pending)
        still_invalid = self._call(judge, pending, check, stats)
        stats.repaired += len(pending) - len(still_invalid)

        verdicts = []
        for item, values in zip(work, items):
            valid = item.error is None
            stats.items += 1
            stats.valid += valid
            stats.invalid += not valid
            verdict = Verdict(
                judge=name, version=judge.version, valid=valid, value=item.value if valid else None,
                error=item.error, attempts=item.attempts, text=item.text,
                prompt_tokens=item.prompt_tokens, completion_tokens=item.completion_tokens,
            )
            verdicts.append(verdict)
            self.records.append({
                "judge": name, "version": judge.version,
                "input_sha": hashlib.sha256(canonical_json(dict(values)).encode()).hexdigest()[:16],
                "valid": valid, "error": item.error, "attempts": item.attempts, "text": item.text,
                "prompt_tokens": item.prompt_tokens, "completion_tokens": item.completion_tokens,
            })
        return verdicts

    def _call(self, judge: JudgeDefinition, work: list[_Item], check: Check | None, stats: JudgeStats) -> list[_Item]:
        """Send every item that fits the context in one batch; return those still invalid."""
        context = self.engine.identity.max_model_len
        ready: list[_Item] = []
        for item in work:
            n_prompt = self.engine.count_tokens(item.messages)
            if n_prompt + item.max_tokens > context:
                stats.too_long += item.attempts == 0
                item.error = f"prompt too long: {n_prompt} tokens + {item.max_tokens} to generate > {context}"
            else:
                ready.append(item)
        requests = [
            GenerationRequest(
                messages=item.messages, json_schema=judge.schema_json, max_tokens=item.max_tokens,
                temperature=0.0, seed=self.seed, timeout_s=_BATCH_TIMEOUT_S,
            )
            for item in ready
        ]
        results = self.engine.generate(requests) if requests else []
        stats.calls += len(requests)
        for item, result in zip(ready, results):
            item.attempts += 1
            item.text = result.text
            item.prompt_tokens += result.prompt_tokens
            item.completion_tokens += result.completion_tokens
            stats.prompt_tokens += result.prompt_tokens
            stats.completion_tokens += result.completion_tokens
            # Validate here too: a backend's own validation is not trusted blindly.
            value, error = validate_reply(result.text, judge.output_schema)
            if error is None and result.finish_reason == "length":
                error = "reply cut off at max_tokens"
            if error is None and check is not None:
                error = check(value)
            item.value, item.error = value, error
        # Too-long items are not repaired: a repair would be longer still.
        return [item for item in ready if item.error is not None]

    def compare(self, task: str, items: Sequence[tuple[str, str, str]]) -> list[Comparison]:
        """Judge candidates against references with ``answer_equivalence``, in both orders.

        Args:
            task: What the answers are for.
            items: (input, reference, candidate) triples.

        Returns:
            One ``Comparison`` per triple, in order. Both orders of every triple are sent
            in one batch.
        """
        forward = [{"task": task, "input": i, "answer_a": ref, "answer_b": cand} for i, ref, cand in items]
        backward = [{"task": task, "input": i, "answer_a": cand, "answer_b": ref} for i, ref, cand in items]
        verdicts = self.run("answer_equivalence", forward + backward)
        stats = self.stats["answer_equivalence"]
        out = []
        for fwd, bwd in zip(verdicts[: len(items)], verdicts[len(items) :]):
            if not (fwd.valid and bwd.valid):
                out.append(Comparison(None, None, fwd, bwd))
                continue
            a = _CANDIDATE_VIEW[("forward", fwd.value["verdict"])]
            b = _CANDIDATE_VIEW[("backward", bwd.value["verdict"])]
            stats.pairs += 1
            stats.swap_consistent += a == b
            out.append(Comparison(a if a == b else "same", a == b, fwd, bwd))
        return out

    def stats_rows(self) -> list[dict[str, Any]]:
        """One dict per judge used so far (for tables and Parquet)."""
        return [self.stats[name].to_dict() for name in sorted(self.stats)]

"""A spec as a DSPy program: its signature, examples and metric, for MIPROv2 and GEPA.

The peers start where ours starts (the spec's system text without examples) and are
scored by the spec's own metric (``spec_score``: the one metric of every side).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

from promptdistill.engine.base import Engine

__all__ = ["BootstrapTally", "TTFTObjective", "instruction_spec", "make_gepa_metric", "make_metric",
           "make_signature", "output_fields", "reply_of", "spec_score", "start_instruction", "tagged_program",
           "to_example"]

_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def output_fields(spec: Any) -> dict[str, Any] | None:
    """name -> Python type of the spec's output schema properties; None: a free-text ``answer``."""
    schema = spec.output_schema or {}
    props = schema.get("properties") if schema.get("type") == "object" else None
    if not props:
        return None
    return {name: Literal[tuple(prop["enum"])] if "enum" in prop else _JSON_TYPES.get(prop.get("type"), str)  # type: ignore[misc]
            for name, prop in props.items()}


def start_instruction(spec: Any) -> str:
    """The spec's system text without examples (instruction, context, rules): where the peers start, as ours does."""
    from promptdistill.specs import build_system
    from promptdistill.specs.render import render_text

    return render_text(build_system(spec, ()), {})


def make_signature(spec: Any) -> Any:
    import dspy

    fields: dict[str, Any] = {n: (str, dspy.InputField(desc=spec.input_descriptions.get(n) or n)) for n in spec.inputs}
    for name, typ in (output_fields(spec) or {"answer": str}).items():
        fields[name] = (typ, dspy.OutputField())
    return dspy.Signature(fields, start_instruction(spec))


def to_example(spec: Any, record: Mapping[str, Any]) -> Any:
    import dspy

    outs = output_fields(spec)
    expected = record["expected"]
    labels = {k: expected[k] for k in outs if k in expected} if outs and isinstance(expected, Mapping) else {
        "answer": expected if isinstance(expected, str) else json.dumps(expected)}
    return dspy.Example(**record["inputs"], **labels).with_inputs(*spec.inputs)


def reply_of(spec: Any, pred: Any) -> str:
    """A DSPy prediction as the reply text the spec's metric scores (the output fields' JSON)."""
    outs = output_fields(spec)
    try:
        if outs:
            return json.dumps({k: pred[k] for k in outs}, ensure_ascii=False)
        return str(pred["answer"])
    except (KeyError, AttributeError, TypeError):
        return ""


def expected_of(spec: Any, example: Any) -> Any:
    outs = output_fields(spec)
    return {k: example[k] for k in outs if k in example} if outs else example["answer"]


def spec_score(spec: Any, example: Any, pred: Any) -> tuple[float, str, Any]:
    """(the spec's score, the reply scored, the expected output): the one metric of every side."""
    from promptdistill.specs.metrics import score_reply

    reply, expected = reply_of(spec, pred), expected_of(spec, example)
    score = score_reply(spec.metric, reply, expected, output_schema=spec.output_schema)
    return float(score or 0.0), reply, expected


class BootstrapTally(logging.Handler):
    """How many traces MIPROv2's bootstrapping tried, and how many it kept.

    The metric counts the traces it scores (it is called with a trace only while bootstrapping).
    An attempt whose program raised, such as a reply the adapter cannot parse, never reaches the
    metric: DSPy's ``BootstrapFewShot`` logs it as an error, and this handler, attached to that
    logger by ``watching``, counts it as ``failed``. ``tried`` is both.
    """

    LOGGER = "dspy.teleprompt.bootstrap"

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.scored = 0
        self.kept = 0
        self.failed = 0

    @property
    def tried(self) -> int:
        return self.scored + self.failed

    def emit(self, record: logging.LogRecord) -> None:
        if record.funcName == "_bootstrap_one_example":  # its one error: "Failed to run or to evaluate example"
            self.failed += 1

    @contextlib.contextmanager
    def watching(self) -> Iterator[BootstrapTally]:
        logger = logging.getLogger(self.LOGGER)
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)


def make_metric(spec: Any, bar: float | None = None, tally: BootstrapTally | None = None) -> Callable[..., Any]:
    """The spec's metric for MIPROv2 and for scoring programs.

    Called with a trace (bootstrapping), it passes a fully correct reply (score 1.0, DSPy's
    convention) or, with ``bar``, returns the score for MIPROv2's ``metric_threshold=bar`` to
    compare: what a DSPy user does with a continuous metric that a small model never scores
    1.0 on. ``tally`` counts the traces scored and kept.
    """

    def metric(example: Any, pred: Any, trace: Any = None, *_: Any) -> float | bool:
        score = spec_score(spec, example, pred)[0]
        if trace is None:
            return score
        passed = score >= (1.0 if bar is None else bar)
        if tally is not None:
            tally.scored += 1
            tally.kept += passed
        return passed if bar is None else score

    return metric


def make_gepa_metric(spec: Any, ttft: Callable[[str], float] | None = None) -> Callable[..., Any]:
    """The spec's metric as GEPA wants it: the score, textual feedback and, with ``ttft``, objective scores.

    The feedback says what the expected output was and what came out (DSPy's GEPA
    documentation: a bare score gives the reflection LM nothing to work with). With
    ``ttft``, ``objective_scores`` holds the quality and minus the predicted expected TTFT
    in seconds of the instruction that produced the prediction (higher is better for both).
    """
    import dspy

    def metric(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None) -> Any:
        score, reply, expected = spec_score(spec, gold, pred)
        shown = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
        out = dspy.Prediction(score=score, feedback=f"Score {score:.2f} out of 1. The expected output is {shown}; "
                                                    f"the output was {reply or '(nothing)'}.")
        instruction = getattr(pred, "_pd_instruction", None)
        if ttft is not None and instruction is not None:
            out["objective_scores"] = {"quality": score, "neg_ttft_s": -ttft(instruction) / 1000.0}
        return out

    return metric


def tagged_program(signature: Any) -> Any:
    """A ``dspy.Predict`` whose predictions carry the instruction that made them (for the TTFT objective)."""
    import dspy

    class TaggedPredict(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.predict = dspy.Predict(signature)

        def forward(self, **inputs: Any) -> Any:
            pred = self.predict(**inputs)
            pred._pd_instruction = self.predict.signature.instructions  # an attribute, not an output field
            return pred

    return TaggedPredict()


def instruction_spec(spec: Any, instruction: str) -> Any:
    """The spec whose whole system text is ``instruction`` (no context, rules or examples): the
    template an instruction makes, as ``TTFTObjective`` predicts it.

    The spec checks read a declared input's name in braces in system text as a misplaced
    input, and refuse an empty instruction; a peer's text is literal, so such braces are
    dropped and an empty text becomes ``"."`` (a token or two off, for a prediction).
    """
    from promptdistill.core.errors import SpecError

    examples = dataclasses.replace(spec.examples, count=0, selection="first", ids=())
    try:
        return spec.with_changes(instruction=instruction, context=None, constraints=(), examples=examples)
    except SpecError:
        for name in spec.inputs:
            instruction = instruction.replace("{" + name + "}", name)
        return spec.with_changes(instruction=instruction if instruction.strip() else ".", context=None,
                                 constraints=(), examples=examples)


class TTFTObjective:
    """Predicted expected TTFT (ms) of the template an instruction makes, as our optimizer predicts it.

    Mean over a few dev records of the TTFT model's cold and warm predictions, mixed with
    the optimizer's assumed warm share; cached per instruction. DSPy calls the metric from
    its threads while the engine runs: tokenizing uses a tokenizer of its own, under a lock.
    """

    def __init__(self, engine: Engine, model: Any, spec: Any, records: Sequence[Mapping[str, Any]], block_tokens: int):
        from promptdistill.engine.tokenizer import HFTokenizer

        path = getattr(engine, "model_path", None)
        self.tokenizer = HFTokenizer(path) if path else engine
        self.identity = engine.identity
        self.model, self.spec, self.records, self.block_tokens = model, spec, list(records), block_tokens
        self._lock = threading.Lock()
        self._cache: dict[str, float] = {}

    # the Tokenizer protocol predict_candidate needs, plus the identity the model checks
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text)

    def apply_chat_template(self, messages: Any) -> str:
        return self.tokenizer.apply_chat_template(messages)

    def __call__(self, instruction: str) -> float:
        from promptdistill.optimize.predict import predict_candidate
        from promptdistill.optimize.select import ASSUMED_WARM_SHARE, expected_ttft

        with self._lock:
            if instruction not in self._cache:
                p = predict_candidate(self, self.model, instruction_spec(self.spec, instruction), self.records,  # type: ignore[arg-type]
                                      block_tokens=self.block_tokens)
                self._cache[instruction] = expected_ttft(p["ttft_cold_ms"], p["ttft_warm_ms"], ASSUMED_WARM_SHARE)
            return self._cache[instruction]

"""A spec rendered into a prompt: few-shot examples, the static system text, chat messages.

Everything that renders a spec goes through :func:`spec_messages`, which is
``render_messages(build_system(spec, examples), spec.user, inputs)``: the optimizer, the
evaluator and the published template (:func:`template_content`) share that one path.
"""

from __future__ import annotations

import random
from typing import Any, Iterable, Mapping, Sequence

from promptdistill.core.errors import SpecError
from promptdistill.core.jsonio import canonical_json
from promptdistill.specs.datasets import dataset_for, records
from promptdistill.specs.model import Spec, rules_block
from promptdistill.specs.render import escape_braces, placeholders, render_messages, render_text
from promptdistill.specs.schema_from import request_schema

__all__ = [
    "build_system",
    "check_inputs",
    "default_example_format",
    "example_values",
    "examples_for",
    "format_example",
    "select_examples",
    "output_schema_for",
    "spec_messages",
    "template_content",
]


def _label_key(spec: Spec, expected: Any) -> str:
    if isinstance(expected, Mapping) and spec.metric.field and spec.metric.field in expected:
        expected = expected[spec.metric.field]
    return canonical_json(expected)


def select_examples(
    spec: Spec, train_records: Sequence[Mapping[str, Any]], count: int | None = None, seed: int = 0
) -> list[Mapping[str, Any]]:
    """Pick few-shot examples from the train split by the spec's selection rule.

    Args:
        spec: whose ``examples.selection`` (and ``ids``) decide.
        train_records: records with ``id``, ``inputs`` and ``expected``, in file order.
        count: how many; None takes ``spec.examples.count``.
        seed: for 'random' and 'balanced' (which shuffles within each label).

    Raises:
        SpecError: fewer train records than asked for, or an unknown fixed id.
    """
    n = spec.examples.count if count is None else count
    if n < 0:
        raise ValueError(f"count must be at least 0, got {n}")
    if n == 0:
        return []
    pool = [r for r in train_records if r.get("expected") is not None]  # an example shows its answer
    rule = spec.examples.selection
    if rule == "fixed":
        by_id = {r["id"]: r for r in pool}
        missing = [i for i in spec.examples.ids if i not in by_id]
        if missing:
            raise SpecError(f"{spec.where}: template.system.examples.ids: not in the train split: {missing}")
        if n > len(spec.examples.ids):
            raise SpecError(f"{spec.where}: template.system.examples.ids: {n} examples asked, {len(spec.examples.ids)} ids listed")
        return [by_id[i] for i in spec.examples.ids[:n]]
    if n > len(pool):
        raise SpecError(f"{spec.where}: template.system.examples.count: {n} examples asked, the train split has {len(pool)}")
    if rule == "first":
        return pool[:n]
    rng = random.Random(seed)
    if rule == "random":
        return rng.sample(pool, n)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in pool:
        groups.setdefault(_label_key(spec, r["expected"]), []).append(r)
    for g in groups.values():
        rng.shuffle(g)
    picked: list[Mapping[str, Any]] = []
    while len(picked) < n:
        for g in groups.values():
            if g and len(picked) < n:
                picked.append(g.pop(0))
    return picked


def examples_for(spec: Spec, count: int | None = None, seed: int = 0) -> list[Mapping[str, Any]]:
    """The spec's default few-shot examples, read from its dataset's train split."""
    n = spec.examples.count if count is None else count
    if n == 0:
        return []
    return select_examples(spec, records(dataset_for(spec), "train"), n, seed)


def default_example_format(inputs: Iterable[str]) -> str:
    """``Name: {name}`` per input, then ``Answer: {expected}``."""
    lines = [f"{n.replace('_', ' ').capitalize()}: {{{n}}}" for n in inputs]
    return "\n".join(lines + ["Answer: {expected}"])


def example_values(record: Mapping[str, Any]) -> dict[str, Any]:
    """Placeholder values of one example: its inputs, ``expected`` and, when ``expected``
    is an object, ``expected_<field>`` for each of its fields."""
    expected = record["expected"]
    values = {**record["inputs"], "expected": expected}
    if isinstance(expected, Mapping):
        values.update({f"expected_{k}": v for k, v in expected.items()})
    return values


def format_example(spec: Spec, record: Mapping[str, Any]) -> str:
    """One few-shot example as text (objects in ``expected`` are written as JSON).

    An object ``expected`` shows only the output schema's properties: the example is the
    reply the model should give, and other keys are the metric's (summarize's ``facts``).
    """
    fmt = spec.examples.format or default_example_format(spec.inputs)
    expected, props = record["expected"], (spec.output_schema or {}).get("properties")
    if isinstance(expected, Mapping) and isinstance(props, Mapping) and props:
        record = {**record, "expected": {k: v for k, v in expected.items() if k in props}}
    return render_text(fmt, example_values(record)).strip()


def build_system(spec: Spec, examples: Sequence[Mapping[str, Any]] = ()) -> str:
    """The static system text, escaped so that ``render_messages`` passes it through literally.

    Order: instruction, context, constraints (as a ``Rules:`` list), then the examples.
    """
    parts = [spec.instruction.strip()]
    if spec.context and spec.context.strip():
        parts.append(spec.context.strip())
    if spec.constraints:
        parts.append(rules_block(spec.constraints))
    if examples:
        shown = "\n\n".join(format_example(spec, r) for r in examples)
        parts.append(f"{spec.examples.header}\n\n{shown}" if spec.examples.header else shown)
    return escape_braces("\n\n".join(parts))


def check_inputs(spec: Spec, inputs: Mapping[str, Any]) -> None:
    """Raise SpecError when a declared input has no value."""
    missing = [n for n in placeholders(spec.user) if n not in inputs]
    if missing:
        raise SpecError(f"{spec.where}: inputs: no value for {missing} (the spec declares {list(spec.inputs)})")


def output_schema_for(spec: Spec, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The reply's JSON Schema for one request: the spec's, or the one its ``schema_from``
    input carries (see :mod:`promptdistill.specs.schema_from`).

    Raises:
        SpecError: the request's schema input is not a schema or a function definition.
    """
    if spec.schema_from is None:
        return spec.output_schema
    try:
        return request_schema(inputs.get(spec.schema_from), where=f"inputs.{spec.schema_from}")
    except ValueError as e:
        raise SpecError(f"{spec.where}: {e}") from None


def spec_messages(spec: Spec, inputs: Mapping[str, Any], *, examples: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, str]]:
    """Chat messages for one request: the one rendering path (see the module docstring)."""
    check_inputs(spec, inputs)
    return render_messages(build_system(spec, examples), spec.user, inputs)


def template_content(
    spec: Spec,
    examples: Sequence[Mapping[str, Any]] = (),
    *,
    max_tokens: int | None = None,
    response_format: str = "json_schema",
    sampling: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The publishable template: ``render_messages(c["system"], c["user"], inputs)``
    reproduces ``spec_messages(spec, inputs, examples=examples)`` exactly.

    ``response_format`` is 'json_schema' (constrained decoding to ``output_schema``, or to
    each request's schema with ``schema_from``) or 'none'; a spec without either always
    gets 'none'.
    """
    if response_format not in ("json_schema", "none"):
        raise ValueError(f"response_format must be 'json_schema' or 'none', got {response_format!r}")
    structured = spec.output_schema is not None or spec.schema_from is not None
    content = {
        "name": spec.name,
        "system": build_system(spec, examples),
        "user": spec.user,
        "inputs": list(spec.inputs),
        "output_schema": spec.output_schema,
        "response_format": response_format if structured else "none",
        "max_tokens": max_tokens if max_tokens is not None else spec.max_tokens,
        "sampling": dict(sampling) if sampling is not None else {"temperature": 0.0},
    }
    if spec.schema_from is not None:
        content["schema_from"] = spec.schema_from
    return content


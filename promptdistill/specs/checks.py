"""Validation of prompt spec files: safe YAML, the shipped JSON Schema, then meaning.

Every problem is reported, not just the first, as ``file: path.to.field: reason``.
Three layers:

1. :func:`read_spec_data` parses the YAML safely (:func:`read_yaml`: UTF-8 only, at most
   ``MAX_SPEC_BYTES``, no language tags, no duplicate keys, a bounded number of aliases
   and of nodes once aliases are expanded, so an alias bomb is refused at load time
   instead of exhausting memory later), validates it against
   ``schemas/prompt_spec.schema.json`` and checks what the file implies on disk
   (``name`` equals the stem, the dataset file exists);
2. :func:`spec_errors` checks what a schema cannot express on a built ``Spec``
   (placeholders declared and used, a static system part, a valid output schema, a
   metric that fits the output); ``Spec.__post_init__`` calls it, so a spec changed in
   code is checked as strictly as one read from a file;
3. :func:`validate_spec_file` adds the dataset: every line loads, inputs match the spec,
   expected values fit the metric, and the train split can supply the examples; and
   :func:`record_errors` what only a record can show: each record's per-request schema
   (``output.schema_from``) is a valid JSON Schema, and a python metric, called on a few
   records with their own expected output as the reply, returns a score.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import regex
import yaml

from promptdistill.core.errors import SpecError
from promptdistill.core.jsonio import TextFileError, read_text
from promptdistill.specs.plugins import load_problem
from promptdistill.specs.render import TemplateSyntaxError, check_template, mask_escapes, placeholders
from promptdistill.specs.schema_from import request_schema, schema_location
from promptdistill.specs.text import WORD

if TYPE_CHECKING:
    from promptdistill.specs.model import Spec

__all__ = ["MAX_SPEC_BYTES", "MAX_YAML_ALIASES", "MAX_YAML_NODES", "METRIC_PROBE_RECORDS", "layout_warnings",
           "load_schema", "pattern_problem", "read_spec_data", "read_yaml", "record_errors", "spec_errors"]

_NAME = re.compile(r"^[a-z0-9_]+$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_SPEC_BYTES = 1024 * 1024
"""A spec (or judge) file larger than this is refused: the biggest bundled one is ~3 KB."""
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000
"""Nodes of a YAML document counted with every alias expanded (what a consumer walks)."""
MAX_YAML_DEPTH = 64
MAX_PATTERN_CHARS = 1000
PATTERN_PROBE_S = 0.05
"""How long ``metric.pattern`` may take on one probe string before it is refused."""
METRIC_PROBE_RECORDS = 3
"""How many labelled records a python metric is called on at validation."""


@lru_cache(maxsize=1)
def load_schema() -> dict[str, Any]:
    """The JSON Schema for spec files, shipped in ``promptdistill/schemas``."""
    text = resources.files("promptdistill").joinpath("specs/schema/prompt_spec.schema.json").read_text("utf-8")
    return json.loads(text)


class _StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that also refuses duplicate keys (PyYAML silently keeps the last one)
    and counts aliases as it composes (see :func:`read_yaml` for the other limits)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_YAML_ALIASES} aliases (*name)", self.peek_event().start_mark
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the constructor refuses it below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def _expanded_size(root: yaml.Node) -> tuple[int, int]:
    """(nodes, depth) of a composed document with aliases expanded, without expanding
    them (sizes are memoised per node), refusing a recursive alias."""
    sizes: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def walk(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ValueError("a recursive alias (an anchor used inside itself)")
        active.add(key)
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        count, depth = 1, 0
        for child in children:
            c, d = walk(child)
            count, depth = count + c, max(depth, d)
            if count > MAX_YAML_NODES:
                break
        active.discard(key)
        sizes[key] = (count, depth + 1)
        return sizes[key]

    return walk(root)


def read_yaml(path: str | Path, *, max_bytes: int = MAX_SPEC_BYTES) -> tuple[Any, str | None]:
    """Parse a YAML file safely and within bounds. Returns (data, None) or (None, problem).

    ``problem`` is ``where: reason`` without the file (``line 3: not valid YAML: ...``).
    Refused: unreadable or non-UTF-8 bytes, files over ``max_bytes``, language tags,
    duplicate keys, more than ``MAX_YAML_ALIASES`` aliases, more than ``MAX_YAML_NODES``
    nodes with aliases expanded, nesting deeper than ``MAX_YAML_DEPTH``.
    """
    try:
        text = read_text(path, max_bytes=max_bytes)
    except TextFileError as e:
        return None, f"line {e.line}: {e}" if e.line else f"(file): {e}"
    try:
        loader = _StrictSafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, None
            nodes, depth = _expanded_size(node)
            if nodes > MAX_YAML_NODES:
                return None, f"(root): more than {MAX_YAML_NODES} values once aliases are expanded (an alias bomb?)"
            if depth > MAX_YAML_DEPTH:
                return None, f"(root): nested deeper than {MAX_YAML_DEPTH} levels"
            return loader.construct_document(node), None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(root)"
        problem = getattr(e, "problem", None) or str(e)
        if isinstance(e, yaml.constructor.ConstructorError) and "tag" in str(problem):
            problem = f"{problem} (only plain YAML is allowed: no language-specific tags)"
        return None, f"{where}: not valid YAML: {problem}"
    except ValueError as e:  # a recursive alias
        return None, f"(root): not valid YAML: {e}"
    except RecursionError:
        return None, f"(root): nested deeper than {MAX_YAML_DEPTH} levels"


def pattern_problem(pattern: Any) -> str | None:
    """Why ``pattern`` cannot be a ``metric.pattern`` (None when it can).

    Patterns run with the ``regex`` module under a timeout when scoring (see
    ``promptdistill.specs.metrics``); here they are also tried on a few probe strings
    built from their own characters, so a catastrophic one such as ``(a|a)+b`` is
    refused at validation instead of costing a timeout per reply.
    """
    if not isinstance(pattern, str):
        return f"must be a string, got {type(pattern).__name__}"
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    try:
        compiled = regex.compile(pattern)
    except (regex.error, OverflowError, RecursionError) as e:
        return f"not a valid regular expression: {e}"
    chars = list(dict.fromkeys(c for c in pattern if c.isalnum() or c in " _-.@"))[:6] or ["a"]
    probes = [c * 28 + "\x00" for c in chars] + ["".join(chars) * 6 + "\x00"]
    for probe in probes:
        try:
            compiled.fullmatch(probe, timeout=PATTERN_PROBE_S)
            compiled.search(probe, timeout=PATTERN_PROBE_S)
        except TimeoutError:
            return (f"takes longer than {PATTERN_PROBE_S * 1000:.0f} ms on the {len(probe)}-character probe "
                    f"{probe!r} (catastrophic backtracking); rewrite it without nested repetition")
    return None


def _field(path: Any) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(root)"


def _schema_errors(data: Any) -> list[str]:
    schema = load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = []
    for e in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        path = list(e.absolute_path)
        if e.validator == "required":
            for name in e.validator_value:
                if isinstance(e.instance, dict) and name not in e.instance:
                    errors.append(f"{_field(path + [name])}: required field is missing")
        elif e.validator == "additionalProperties" and isinstance(e.schema.get("properties"), dict):
            allowed = sorted(e.schema["properties"])
            for name in sorted(set(e.instance) - set(allowed)):
                errors.append(f"{_field(path + [name])}: unknown field (allowed: {', '.join(allowed)})")
        else:
            errors.append(f"{_field(path)}: {e.message}")
    return list(dict.fromkeys(errors))


def read_spec_data(path: str | Path) -> tuple[dict[str, Any] | None, list[str]]:
    """Parse and schema-check a spec file. Returns (data or None, ``field: reason`` errors)."""
    path = Path(path)
    data, problem = read_yaml(path)
    if problem:
        return None, [problem]
    if not isinstance(data, dict):
        return None, [f"(root): must be a mapping of fields, got {type(data).__name__}"]
    try:
        errors = _schema_errors(data)
    except RecursionError:
        return None, [f"(root): nested deeper than {MAX_YAML_DEPTH} levels"]
    name = data.get("name")
    if isinstance(name, str) and name != path.stem:
        errors.append(f"name: {name!r} must equal the file's stem {path.stem!r}")
    dataset = data.get("dataset")
    if isinstance(dataset, str) and not any(e.startswith("dataset:") for e in errors):
        ds = path.parent.parent / "datasets" / dataset
        if not ds.is_file():
            errors.append(f"dataset: file not found: {ds}")
    return (None if errors else data), errors


def _system_texts(spec: "Spec") -> list[tuple[str, str]]:
    """The static system part's texts, each with its field: instruction, context, constraints."""
    texts = [("template.system.instruction", spec.instruction)]
    if spec.context:
        texts.append(("template.system.context", spec.context))
    return texts + [(f"template.system.constraints[{i}]", c) for i, c in enumerate(spec.constraints)]


def _static_text_errors(spec: "Spec") -> list[str]:
    """System text is static: a declared input in it would defeat the prefix cache."""
    errors = []
    for where, text in _system_texts(spec):
        used = [p for p in placeholders(text) if p in spec.inputs]
        if used:
            errors.append(
                f"{where}: uses input(s) {', '.join('{' + u + '}' for u in used)}; the system part is static "
                "(served from the prefix cache), so put inputs in template.user"
            )
    return errors


def _template_errors(spec: "Spec") -> list[str]:
    errors = []
    try:
        check_template(spec.user, spec.inputs, where="template.user")
    except TemplateSyntaxError as e:
        errors.append(str(e))
    used = set(placeholders(spec.user))
    errors += [f"inputs.{n}: declared but never used in template.user" for n in spec.inputs if n not in used]
    ex = spec.examples
    if ex.count < 0:
        errors.append(f"template.system.examples.count: must be at least 0, got {ex.count}")
    if ex.selection not in ("first", "random", "balanced", "fixed"):
        errors.append(f"template.system.examples.selection: must be first, random, balanced or fixed, got {ex.selection!r}")
    if ex.selection == "fixed" and len(ex.ids) < ex.count:
        errors.append(f"template.system.examples.ids: the 'fixed' selection needs at least count={ex.count} ids, got {len(ex.ids)}")
    if ex.format is not None:
        fields = [p for p in placeholders(ex.format) if p.startswith("expected_")]
        try:
            check_template(ex.format, [*spec.inputs, "expected", *fields], where="template.system.examples.format")
        except TemplateSyntaxError as e:
            errors.append(str(e))
    return errors


def _output_metric_errors(spec: "Spec") -> list[str]:
    errors = []
    props: dict[str, Any] = {}
    if spec.output_schema is not None:
        try:
            jsonschema.Draft202012Validator.check_schema(spec.output_schema)
            props = spec.output_schema.get("properties") or {}
        except jsonschema.SchemaError as e:
            errors.append(f"{_field(['output', 'schema', *e.absolute_path])}: not a valid JSON Schema: {e.message}")
    if spec.max_tokens is not None and spec.max_tokens < 1:
        errors.append(f"output.max_tokens: must be at least 1, got {spec.max_tokens}")
    if spec.schema_from is not None:
        if spec.schema_from not in spec.inputs:
            errors.append(f"output.schema_from: {spec.schema_from!r} is not a declared input "
                          f"({', '.join(spec.inputs)})")
        if spec.output_schema is not None:
            errors.append("output.schema_from: give output.schema (one schema) or output.schema_from "
                          "(a schema per request), not both")
    m = spec.metric
    kinds = ("exact", "json_field", "numeric", "contains", "judge_rubric", "python")
    if m.kind not in kinds:
        errors.append(f"metric.kind: must be one of {', '.join(kinds)}, got {m.kind!r}")
    if m.kind == "judge_rubric" and not (m.rubric and m.rubric.strip()):
        errors.append("metric.rubric: a judge_rubric metric needs a rubric (what the judge looks for)")
    if m.kind == "python":
        if not m.function:
            errors.append("metric.function: a python metric needs its function, 'module:callable' "
                          "(for example 'metrics.args:score' for metrics/args.py in the project)")
        else:
            problem = load_problem(m.function, m.project_dir)  # imported in a child process, within a bound
            if problem:
                errors.append(problem)
    elif m.function is not None:
        errors.append("metric.function: only a python metric calls a function; set metric.kind: python")
    if m.scores is not None and m.kind != "python":
        errors.append(f"metric.scores: only a python metric declares its scores ({m.kind}'s are known)")
    if m.tolerance < 0:
        errors.append(f"metric.tolerance: must be at least 0, got {m.tolerance}")
    if m.pattern is not None:
        problem = pattern_problem(m.pattern)
        if problem:
            errors.append(f"metric.pattern: {problem}")
    if props:
        if m.field and m.field not in props:
            errors.append(f"metric.field: {m.field!r} is not a property of output.schema ({', '.join(props)})")
        errors += [f"metric.fields: {f!r} is not a property of output.schema" for f in m.fields if f not in props]
    if m.kind == "json_field" and m.pattern is not None:
        errors.append("metric.pattern: a json_field metric compares fields, not one answer; put format rules in output.schema")
    if m.kind != "json_field" and m.fields:
        errors.append("metric.fields: only a json_field metric compares several fields; use metric.field")
    if not 0 <= spec.slo.max_quality_drop <= 1:
        errors.append(f"slo.max_quality_drop: must be in [0, 1], got {spec.slo.max_quality_drop}")
    if spec.slo.ttft_ms is not None and spec.slo.ttft_ms <= 0:
        errors.append(f"slo.ttft_ms: must be positive, got {spec.slo.ttft_ms}")
    if spec.slo.objective not in ("latency", "quality"):
        errors.append(f"slo.objective: must be 'latency' or 'quality', got {spec.slo.objective!r}")
    if not 0 < spec.slo.min_quality_gain <= 1:
        errors.append(f"slo.min_quality_gain: must be in (0, 1], got {spec.slo.min_quality_gain}")
    return errors


def spec_errors(spec: "Spec") -> list[str]:
    """Every ``field: reason`` a built Spec violates (empty when valid)."""
    errors = []
    if not _NAME.match(spec.name):
        errors.append(f"name: must match [a-z0-9_]+, got {spec.name!r}")
    if not spec.inputs:
        errors.append("inputs: at least one input is required")
    errors += [f"inputs.{n}: not a valid input name (letters, digits, _)" for n in spec.inputs if not _IDENT.match(n)]
    errors += [
        f"inputs.{n}: the name is reserved for the expected output in example formats"
        for n in spec.inputs if n == "expected" or n.startswith("expected_")
    ]
    if not spec.instruction.strip():
        errors.append("template.system.instruction: must not be empty")
    return (errors + _static_text_errors(spec) + _template_errors(spec) + _output_metric_errors(spec)
            + _rollout_errors(spec))


def _rollout_errors(spec: "Spec") -> list[str]:
    """The canary's shares: a start in (0, 1), steps increasing from it to 1.0."""
    r = spec.rollout
    if r is None:
        return []
    errors = []
    if not 0 < r.canary_share < 1:
        errors.append(f"rollout.canary_share: must be in (0, 1), got {r.canary_share}")
    steps = list(r.steps)
    if any(not 0 < x <= 1 for x in steps):
        errors.append(f"rollout.steps: each share must be in (0, 1], got {steps}")
    elif any(b <= a for a, b in zip(steps, steps[1:])):
        errors.append(f"rollout.steps: shares must increase, got {steps}")
    elif steps[-1] != 1:
        errors.append(f"rollout.steps: must end at 1.0 (the canary becomes production), got {steps}")
    elif steps[0] != r.canary_share:
        errors.append(f"rollout.steps: must start at rollout.canary_share ({r.canary_share}), got {steps}")
    return errors


# --- records: per-request schemas and the python metric ----------------------------------


def _function_without_parameters(value: Any) -> str | None:
    """Why ``value`` is a function definition with no ``parameters`` (None when it is not
    one): read as a schema, ``{"name": ...}`` would accept any reply."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(value, dict):
        return None
    if value.get("type") == "function" and isinstance(value.get("function"), dict):
        value, where = value["function"], "function.parameters"
    elif "name" in value:
        where = "parameters"
    else:
        return None
    if "parameters" in value:
        return None
    return (f"a function definition without {where}: read as a schema it would accept any reply; give the "
            "function's parameters (a JSON Schema object)")


def _request_schema_problem(value: Any) -> str | None:
    """Why a ``schema_from`` value is not a usable JSON Schema (None when it is), with the
    path inside the value (``parameters.properties.unit.type``)."""
    problem = _function_without_parameters(value)
    if problem:
        return problem
    try:
        location = schema_location(value, where="(value)")
        jsonschema.Draft202012Validator.check_schema(request_schema(value, where="(value)"))
    except ValueError as e:  # the caller names the record instead of "(value)"
        return str(e).removeprefix("(value): ")
    except jsonschema.SchemaError as e:
        path = ".".join(str(p) for p in (*location, *e.absolute_path)) or "(root)"
        return f"not a valid JSON Schema at {path}: {e.message}"
    except RecursionError:
        return "nested too deeply"
    return None


def _schema_from_errors(spec: "Spec", rows: list[dict[str, Any]]) -> list[str]:
    name, seen, errors = spec.schema_from, {}, []
    for row in rows:
        value = row["inputs"].get(name)
        try:
            key = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            key = None
        problem = seen[key] if key in seen else _request_schema_problem(value)
        if key is not None:
            seen[key] = problem  # records share a few functions: check each once
        if problem:
            errors.append(f"{spec.dataset}:{row['line']}: inputs.{name}: record {row['id']!r}: {problem}")
    return errors


def record_errors(spec: "Spec", rows: list[dict[str, Any]]) -> list[str]:
    """What only the dataset's records show, as ``file: field: reason`` naming the record.

    With ``output.schema_from``: every record's schema value is a JSON Schema, or a
    function definition whose parameters are one (Python-style type names mapped, as
    constrained decoding will get them): named with the path inside the value. A function
    definition without ``parameters`` is refused: read as a schema it accepts anything. (A python
    metric called on records is checked by ``load.validate_spec_file``: scoring imports the
    spec model, which imports this module.)

    Args:
        spec: a valid spec.
        rows: the dataset's records (``id``, ``line``, ``inputs``, ``expected``), in file order.
    """
    return _schema_from_errors(spec, rows) if spec.schema_from is not None else []


# --- prefix-cache layout ------------------------------------------------------------------

_VOLATILE = (
    ("a date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? \d{1,2},? \d{4}\b|\b\d{1,2} (?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]* \d{4}\b|\btoday(?:'s date)? is\b", re.I)),
    ("a time of day", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b")),
    ("a UUID", re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)),
    ("a long hex id", re.compile(r"\b[0-9a-f]{16,}\b", re.I)),
    ("a counter", re.compile(r"(?:#\s?\d+\b|\b(?:request|session|run|attempt|call|batch|turn|message)\s+(?:no\.?\s*|number\s+)?\d+\b)", re.I)),
)
_MAX_STATIC_AFTER_INPUT_WORDS = 4


def layout_warnings(spec: "Spec") -> list[str]:
    """Prefix-cache problems in a spec's layout, as ``file: field: reason`` lines.

    Warns when static text comes after the first input value in ``template.user`` (it is
    recomputed on every request), and when the static system part (instruction, context,
    rules) holds something volatile: a date, a time, a UUID, a hex id or a counter. Few-shot
    examples are not checked: they are fixed records, not values that change per request.
    """
    out = []
    masked = mask_escapes(spec.user)
    names = placeholders(spec.user)
    first = re.search(r"\{[A-Za-z_][A-Za-z0-9_]*\}", masked)
    if first:
        after = re.sub(r"\{[A-Za-z_][A-Za-z0-9_]*\}", " ", masked[first.end():])
        words = WORD.findall(after)
        if len(words) > _MAX_STATIC_AFTER_INPUT_WORDS:
            out.append(
                f"{spec.where}: template.user: {len(words)} words of static text come after the first input "
                f"{{{names[0]}}}; the prefix cache stops at the first input, so they are recomputed on every "
                "request: move them into the system part"
            )
    for where, text in _system_texts(spec):
        for what, pattern in _VOLATILE:
            m = pattern.search(text)
            if m:
                out.append(
                    f"{spec.where}: {where}: holds {what} ({m.group(0)!r}) in the static part; if it changes, "
                    "every change invalidates the cached prefix: pass it as an input in template.user"
                )
    return out


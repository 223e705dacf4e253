"""A DSPy program exported as a template that sends what the program sends.

``bench_peers`` scores each peer (MIPROv2, GEPA) twice: the DSPy program itself, and the
program exported as a template. The export used to re-render the program in our own
layout (its instruction as the whole system text, its demos as examples in the spec's
format, the spec's schema and ``max_tokens``), so the template was a different prompt and
its score differed from the program's by up to 0.12. Here the template is cut from the
adapter's own output instead:

* ``system``: the adapter's system message (field descriptions, field structure, the
  program's instruction), static, braces escaped as in every template;
* ``turns``: the adapter's demo messages (user/assistant pairs: ``[[ ## field ## ]]``
  markers, the assistant's JSON with ``indent=2``), static literal text;
* ``user``: the adapter's last user message with each input's value replaced by its
  ``{placeholder}`` (the output-format reminder included);
* ``output_schema``: the schema DSPy's JSONAdapter asks the engine for (structured
  outputs from the signature: no ``maxLength``, ``pattern`` or other spec constraints),
  and ``max_tokens``: the task LM's;
* ``output_fields``: the signature's output types, for :func:`parse_reply`, which parses
  a reply as ``JSONAdapter.parse`` (or ``ChatAdapter.parse``) does.

:func:`render` gives ``[system, *turns, user]``, equal to ``adapter.format(signature,
demos, inputs)`` for inputs whose values are strings (a list value would be a numbered
list in DSPy and JSON here; the bundled specs' inputs are all strings).

Our registry templates have no ``turns`` (a system and a user message only): a program
with demos cannot be published as one of them without changing the prompt; this content
is scored and timed by ``bench_peers`` through :func:`requests`, not through the spec path.

Only :func:`export_program` and :func:`response_schema` import DSPy; rendering and
parsing need ``json_repair`` and ``pydantic`` (DSPy's own parsing libraries).
"""

from __future__ import annotations

import ast
import json
import statistics
import types
from typing import Any, Literal, Mapping, Sequence, Union, get_args, get_origin

from promptdistill.engine.base import Engine, GenerationRequest
from promptdistill.optimize.verify import cold_then_warm
from promptdistill.specs.render import escape_braces, render_messages

__all__ = ["ParseError", "export_program", "measure_ttft", "parse_reply", "render", "reply_text", "requests",
           "response_schema"]

_SENTINEL = "\x00pd-input:{}\x00"
_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
_PY = {v: k for k, v in _TYPES.items()}


class ParseError(ValueError):
    """The reply does not parse as the adapter would parse it (DSPy raises AdapterParseError)."""


# -- export ------------------------------------------------------------------------------------------------


def _field_type(annotation: Any) -> dict[str, Any]:
    if get_origin(annotation) is Literal:
        return {"enum": list(get_args(annotation))}
    if annotation in _TYPES:
        return {"type": _TYPES[annotation]}
    raise ValueError(f"output type {annotation!r} is not exported (str, int, float, bool, list, dict or Literal)")


def _annotation(field: Mapping[str, Any]) -> Any:
    return Literal[tuple(field["enum"])] if "enum" in field else _PY[field["type"]]  # type: ignore[misc]


def response_schema(signature: Any, adapter: Any) -> dict[str, Any] | None:
    """The JSON Schema the adapter has the engine constrain replies to (None: unconstrained).

    JSONAdapter with an LM that supports response schemas (our DSPy bridge does) sends the
    signature's structured-output schema, or ``json_object`` (which the bridge leaves
    unconstrained) when an output is an open-ended mapping; ChatAdapter sends none.
    """
    from dspy.adapters.json_adapter import JSONAdapter, _get_structured_outputs_response_format, _has_open_ended_mapping

    if not isinstance(adapter, JSONAdapter) or _has_open_ended_mapping(signature):
        return None
    return _get_structured_outputs_response_format(signature, adapter.use_native_function_calling).model_json_schema()


def export_program(name: str, signature: Any, demos: Sequence[Any], adapter: Any, *, max_tokens: int,
                   sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The template content that renders what ``adapter.format(signature, demos, inputs)`` renders.

    Args:
        name: the template's name (the spec's).
        signature, demos: the optimized predictor's (``predictor.signature``, ``predictor.demos``).
        adapter: the adapter the program ran with (``dspy.JSONAdapter()`` in ``bench_peers``).
        max_tokens: the task LM's ``max_tokens``.

    Raises:
        ValueError: the adapter's user message is not one static text with each input's
            value inserted once as is (an adapter this export does not know).
    """
    inputs = list(signature.input_fields)
    marked = {n: _SENTINEL.format(n) for n in inputs}
    messages = adapter.format(signature, list(demos), marked)
    if messages[0]["role"] != "system" or messages[-1]["role"] != "user":
        raise ValueError(f"{type(adapter).__name__}: expected a system message first and a user message last")
    system, turns, last = messages[0]["content"], messages[1:-1], messages[-1]["content"]
    if any(s in m["content"] for m in (messages[0], *turns) for s in marked.values()):
        raise ValueError(f"{type(adapter).__name__}: an input's value appears outside the last user message")
    user, rest = "", last
    for n in sorted(inputs, key=lambda k: last.find(marked[k])):
        if last.count(marked[n]) != 1:
            raise ValueError(f"{type(adapter).__name__}: input {n!r} appears {last.count(marked[n])} times")
        before, rest = rest.split(marked[n])
        user += escape_braces(before) + "{" + n + "}"
    user += escape_braces(rest)
    schema = response_schema(signature, adapter)
    return {
        "name": name,
        "system": escape_braces(system),
        "turns": [{"role": m["role"], "content": m["content"]} for m in turns],
        "user": user,
        "inputs": inputs,
        "output_schema": schema,
        "response_format": "json_schema" if schema is not None else "none",
        "max_tokens": max_tokens,
        "sampling": dict(sampling) if sampling is not None else {"temperature": 0.0},
        "adapter": type(adapter).__name__,
        "output_fields": {n: _field_type(f.annotation) for n, f in signature.output_fields.items()},
        "instruction": signature.instructions,
    }


# -- the requests ------------------------------------------------------------------------------------------


def render(content: Mapping[str, Any], inputs: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[system, *turns, user]`` for one record (``render_messages`` for the system and user parts)."""
    system, user = render_messages(content["system"], content["user"], inputs)
    return [system, *({"role": t["role"], "content": t["content"]} for t in content["turns"]), user]


def requests(content: Mapping[str, Any], records: Sequence[Mapping[str, Any]], *, seed: int = 0,
             timeout_s: float | None = None) -> list[GenerationRequest]:
    """What the program sends through the DSPy bridge, one request per record (the schema
    as the bridge writes it, ``json.dumps`` with default separators: the same text)."""
    schema = json.dumps(content["output_schema"]) if content["response_format"] == "json_schema" else None
    return [GenerationRequest(messages=render(content, r["inputs"]), json_schema=schema,
                              max_tokens=content["max_tokens"], temperature=content["sampling"].get("temperature", 0.0),
                              seed=seed, timeout_s=timeout_s) for r in records]


def measure_ttft(engine: Engine, content: Mapping[str, Any], records: Sequence[Mapping[str, Any]], *, n: int,
                 seed: int = 0) -> dict[str, Any]:
    """Measured TTFT cold and warm, as ``optimize.verify.measure_ttft_interleaved`` measures a template
    (prefill only, in the order of ``optimize.verify.cold_then_warm``), means over the first
    ``n`` records."""
    pool = list(records[: n + 1])
    n = min(n, len(pool) - 1)
    rows: dict[str, list[float]] = {"cold": [], "warm": []}

    def one(r: Mapping[str, Any]) -> float:
        req = GenerationRequest(messages=render(content, r["inputs"]), max_tokens=1, temperature=0.0, seed=seed)
        return engine.generate([req])[0].ttft_ms

    for i in range(max(n, 0)):
        cold, warm, _, _ = cold_then_warm(engine, lambda k: one(pool[k]), i, n)
        rows["cold"].append(cold)
        rows["warm"].append(warm)

    def mean(xs: list[float]) -> float | None:
        return round(statistics.fmean(xs), 1) if xs else None

    return {"ttft_cold_ms": mean(rows["cold"]), "ttft_warm_ms": mean(rows["warm"]), "timing_n": max(n, 0)}


# -- parsing, as the adapter parses ------------------------------------------------------------------------


def _parse_value(value: Any, annotation: Any) -> Any:
    """``dspy.adapters.utils.parse_value`` for the exported types."""
    import json_repair
    from pydantic import TypeAdapter

    if annotation is str:
        return str(value)
    if get_origin(annotation) is Literal:
        allowed = get_args(annotation)
        if value in allowed:
            return value
        if isinstance(value, str):
            v = value.strip()
            if v.startswith(("Literal[", "str[")) and v.endswith("]"):
                v = v[v.find("[") + 1 : -1]
            if len(v) > 1 and v[0] == v[-1] and v[0] in "\"'":
                v = v[1:-1]
            if v in allowed:
                return v
            value = v
    if not isinstance(value, str):
        return TypeAdapter(annotation).validate_python(value)
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType) and type(None) in get_args(annotation) and str in get_args(annotation):
        return TypeAdapter(annotation).validate_python(value)
    candidate = json_repair.loads(value)
    if candidate == "" and value != "":
        try:
            candidate = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            candidate = value
    return TypeAdapter(annotation).validate_python(candidate)


def _typed(fields: Mapping[str, Any], outputs: Mapping[str, Mapping[str, Any]], reply: str) -> dict[str, Any]:
    out = {}
    for k, v in fields.items():
        try:
            out[k] = _parse_value(v, _annotation(outputs[k]))
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ParseError(f"field {k}: {e}") from None
    if out.keys() != outputs.keys():
        raise ParseError(f"fields {sorted(out)} instead of {list(outputs)}: {reply[:200]!r}")
    return {k: out[k] for k in outputs}


def _parse_json(outputs: Mapping[str, Mapping[str, Any]], reply: str) -> dict[str, Any]:
    import json_repair
    import regex

    fields = json_repair.loads(reply)
    if not isinstance(fields, dict):
        match = regex.search(r"\{(?:[^{}]|(?R))*\}", reply, regex.DOTALL)
        if match:
            fields = json_repair.loads(match.group(0))
    if not isinstance(fields, dict):
        raise ParseError(f"not a JSON object: {reply[:200]!r}")
    return _typed({k: v for k, v in fields.items() if k in outputs}, outputs, reply)


def _parse_chat(outputs: Mapping[str, Mapping[str, Any]], reply: str) -> dict[str, Any]:
    import re

    header = re.compile(r"\[\[ ## (\w+) ## \]\]")
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in reply.splitlines():
        m = header.match(line.strip())
        if m:
            rest = line[m.end():].strip()
            sections.append((m.group(1), [rest] if rest else []))
        else:
            sections[-1][1].append(line)
    fields: dict[str, Any] = {}
    for k, lines in sections:
        if k in outputs and k not in fields:
            fields[k] = "\n".join(lines).strip()
    return _typed(fields, outputs, reply)


def parse_reply(content: Mapping[str, Any], reply: str) -> dict[str, Any]:
    """The reply's output fields, typed, as the content's adapter parses them.

    Raises:
        ParseError: where the adapter raises AdapterParseError (the program's prediction
            fails, which DSPy's Evaluate scores as its failure score).
    """
    outputs, adapter = content["output_fields"], content["adapter"]
    if adapter == "JSONAdapter":
        return _parse_json(outputs, reply)
    if adapter == "ChatAdapter":
        return _parse_chat(outputs, reply)
    raise ValueError(f"no parser for {adapter}")


def reply_text(content: Mapping[str, Any], reply: str, answer_field: str | None = None) -> str:
    """The text our metric scores: the parsed fields' JSON (``bench.peers.dspy_program.reply_of`` of the
    program's prediction), the ``answer_field``'s value as text for a free-text spec, or
    ``""`` when the reply does not parse."""
    try:
        fields = parse_reply(content, reply)
    except ParseError:
        return ""
    if answer_field is not None:
        return str(fields[answer_field])
    return json.dumps(fields, ensure_ascii=False)

"""Per-request output schemas: ``output: {schema_from: INPUT}`` (stdlib only; the client uses it).

A tool-calling prompt's reply schema depends on the request: the function it calls. The
input named by ``schema_from`` carries, per request, one of:

* a JSON Schema (an object, or its JSON text);
* a function definition whose ``parameters`` are the schema (``{"name", "parameters"}``);
* an OpenAI tool (``{"type": "function", "function": {"name", "parameters"}}``).

:func:`request_schema` turns that value into the schema used for constrained decoding,
validation and the published template's ``request_body``. Public function-calling sets
(BFCL and others) write parameter types the way Python does; those names are mapped to
JSON Schema (``PYTHON_TYPES``: ``dict`` -> ``object``, ``float`` -> ``number``, ``tuple``
-> ``array``...; ``any`` drops the type constraint), wherever a schema may sit (properties,
items, ``anyOf``...). Any other type name is left as written, for validation to refuse.

Example:
    >>> request_schema({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
    {'type': 'object'}
    >>> request_schema({"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "float"}}}})
    {'type': 'object', 'properties': {'x': {'type': 'number'}}}
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["PYTHON_TYPES", "request_schema", "schema_location"]

PYTHON_TYPES: dict[str, str | None] = {
    "dict": "object", "float": "number", "tuple": "array", "list": "array", "str": "string", "int": "integer",
    "bool": "boolean", "any": None,
}
"""Python-style type names and their JSON Schema type (None: no type constraint)."""

_ONE_SCHEMA = ("additionalProperties", "additionalItems", "items", "not", "contains", "if", "then", "else",
               "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _unwrap(value: Any, where: str) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """The schema a ``schema_from`` value holds, and where it sits in that value."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg}); expected a JSON Schema or a function definition") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a JSON Schema or a function definition, got {type(value).__name__}")
    location: tuple[str, ...] = ()
    if value.get("type") == "function" and isinstance(value.get("function"), Mapping):
        value, location = value["function"], ("function",)
    if "parameters" in value and ("name" in value or "description" in value):
        value, location = value["parameters"], (*location, "parameters")
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{where}: the function's parameters are not a JSON Schema object")
    return value, location


def _json_type(name: Any) -> Any:
    return PYTHON_TYPES.get(name, name) if isinstance(name, str) else name


def _json_schema(schema: Any) -> Any:
    """A copy of ``schema`` with Python-style type names mapped, in every subschema."""
    if not isinstance(schema, Mapping):
        return schema  # true/false schemas, or a value validation will refuse
    out = dict(schema)
    kind = out.get("type")
    if isinstance(kind, str) or (isinstance(kind, list) and all(isinstance(k, str) for k in kind)):
        names = [_json_type(k) for k in ([kind] if isinstance(kind, str) else kind)]
        if None in names:
            del out["type"]
        else:
            out["type"] = names[0] if isinstance(kind, str) else list(dict.fromkeys(names))
    for key in _ONE_SCHEMA:
        if isinstance(out.get(key), Mapping):
            out[key] = _json_schema(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_json_schema(s) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: _json_schema(s) for name, s in out[key].items()}
    return out


def request_schema(value: Any, *, where: str = "input") -> dict[str, Any]:
    """The JSON Schema a per-request ``schema_from`` value stands for (a new dict: ``value``
    is not changed), with Python-style type names mapped (see ``PYTHON_TYPES``).

    Raises:
        ValueError: the value is none of the accepted shapes, or nests deeper than the
            interpreter's recursion limit (the message names ``where``).
    """
    schema = _unwrap(value, where)[0]
    try:
        return _json_schema(schema)
    except RecursionError:
        raise ValueError(f"{where}: the schema is nested too deeply") from None


def schema_location(value: Any, *, where: str = "input") -> tuple[str, ...]:
    """Where the schema sits in a ``schema_from`` value: ``()`` for a schema,
    ``("parameters",)`` for a function definition, ``("function", "parameters")`` for a tool.

    Raises:
        ValueError: as :func:`request_schema`.
    """
    return _unwrap(value, where)[1]

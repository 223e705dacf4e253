"""Per-request output schemas: ``output: {schema_from: INPUT}`` (stdlib only; the client uses it).

A tool-calling prompt's reply schema depends on the request: the function it calls. The
input named by ``schema_from`` carries, per request, one of:

* a JSON Schema (an object, or its JSON text);
* a function definition whose ``parameters`` are the schema (``{"name", "parameters"}``);
* an OpenAI tool (``{"type": "function", "function": {"name", "parameters"}}``).

:func:`request_schema` turns that value into the schema used for constrained decoding,
validation and the published template's ``request_body``.

Example:
    >>> request_schema({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
    {'type': 'object'}
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["request_schema"]


def request_schema(value: Any, *, where: str = "input") -> dict[str, Any]:
    """The JSON Schema a per-request ``schema_from`` value stands for.

    Raises:
        ValueError: the value is none of the accepted shapes (the message names ``where``).
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e.msg}); expected a JSON Schema or a function definition") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a JSON Schema or a function definition, got {type(value).__name__}")
    if value.get("type") == "function" and isinstance(value.get("function"), Mapping):
        value = value["function"]
    if "parameters" in value and ("name" in value or "description" in value):
        value = value["parameters"]
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{where}: the function's parameters are not a JSON Schema object")
    return dict(value)

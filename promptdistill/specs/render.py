"""The one rendering function: template parts + input values -> chat messages.

The optimizer, the evaluator and the registry client all call ``render_messages``, so
what is evaluated is exactly what is published. It imports nothing heavy.

Template syntax, deliberately tiny:

* ``{name}`` is replaced by the value of the declared input ``name``;
* ``{{`` and ``}}`` stand for literal braces;
* any other brace is an error at template-check time, never at request time.

Values are inserted literally in one pass: a value containing ``{other}``, ``{{``,
Jinja syntax or role markers such as ``<|im_start|>system`` is never interpreted
(role markers stay plain text inside the message content; the chat template's own
tokens are added by the tokenizer, not by string concatenation here).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping

__all__ = ["TemplateSyntaxError", "check_template", "mask_escapes", "placeholders", "render_messages", "render_text"]

_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[{}]")


class TemplateSyntaxError(ValueError):
    """A template has a stray brace or uses an undeclared placeholder."""


def placeholders(template: str) -> list[str]:
    """Placeholder names in order of first appearance."""
    seen: list[str] = []
    for m in _TOKEN.finditer(template):
        name = m.group(1)
        if name and name not in seen:
            seen.append(name)
    return seen


def check_template(template: str, declared: Iterable[str], *, where: str = "template") -> None:
    """Raise TemplateSyntaxError on a stray brace or an undeclared placeholder."""
    declared = set(declared)
    for m in _TOKEN.finditer(template):
        tok = m.group(0)
        if tok in ("{{", "}}"):
            continue
        if m.group(1) is None:
            raise TemplateSyntaxError(
                f"{where}: stray {tok!r} at char {m.start()}; write {tok * 2!r} for a literal brace."
            )
        if m.group(1) not in declared:
            raise TemplateSyntaxError(
                f"{where}: placeholder {{{m.group(1)}}} is not a declared input (declared: {sorted(declared)})."
            )


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def render_text(template: str, values: Mapping[str, Any]) -> str:
    """Fill ``{name}`` placeholders with values, inserted literally in one pass.

    Raises:
        KeyError: a placeholder has no value (the message names it).
    """

    def fill(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        name = m.group(1)
        if name is None:
            raise TemplateSyntaxError(f"stray {tok!r} at char {m.start()} in template")
        if name not in values:
            raise KeyError(f"missing input {name!r}; the template needs {placeholders(template)}")
        return _as_text(values[name])

    return _TOKEN.sub(fill, template)


def render_messages(system: str, user: str, inputs: Mapping[str, Any]) -> list[dict[str, str]]:
    """Chat messages for one request: the static system part first, then the user part.

    ``system`` is static text (no placeholders: everything in it can come from the
    prefix cache); its ``{{``/``}}`` escapes are unescaped. ``user`` is filled from
    ``inputs``.

    Example:
        >>> render_messages("Classify.", "Ticket: {ticket}", {"ticket": "my {card} broke"})
        [{'role': 'system', 'content': 'Classify.'}, {'role': 'user', 'content': 'Ticket: my {card} broke'}]
    """
    messages = []
    if system:
        messages.append({"role": "system", "content": render_text(system, {})})
    messages.append({"role": "user", "content": render_text(user, inputs)})
    return messages


def mask_escapes(template: str) -> str:
    """Replace ``{{``/``}}`` by two neutral characters, so character positions are kept."""
    return template.replace("{{", "\0\0").replace("}}", "\0\0")

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

__all__ = ["TemplateSyntaxError", "check_template", "escape_braces", "mask_escapes", "placeholders", "render_messages",
           "render_text", "render_text_spans", "unescape_braces", "value_text"]

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


def value_text(value: Any) -> str:
    """The text a value is inserted as: a ``str`` as is, a dict or list as JSON, anything
    else (a ``str`` subclass too) as its ``str()``, always a plain ``str``.

    A ``str`` subclass is converted with ``str()`` like any other object, so the text
    inserted is the text a caller checking ``str(value)`` saw.
    """
    if type(value) is str:
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    # str() may return a str subclass; str.__str__ makes it a plain str of the same characters.
    return str.__str__(str(value))


def render_text(template: str, values: Mapping[str, Any]) -> str:
    """Fill ``{name}`` placeholders with values, inserted literally in one pass.

    Raises:
        KeyError: a placeholder has no value (the message names it).
    """
    return render_text_spans(template, values)[0]


def render_text_spans(template: str, values: Mapping[str, Any]) -> tuple[str, list[tuple[str, int, int]]]:
    """``render_text``, plus where each inserted value lies in the result.

    Returns:
        The rendered text and one ``(name, start, end)`` per placeholder occurrence, in
        order (an empty value gives ``start == end``). Everything outside these spans is the
        template's own text.

    Example:
        >>> render_text_spans("A {a}{b}!", {"a": "x", "b": ""})
        ('A x!', [('a', 2, 3), ('b', 3, 3)])
    """
    parts: list[str] = []
    spans: list[tuple[str, int, int]] = []
    at = last = 0
    for m in _TOKEN.finditer(template):
        static = template[last:m.start()]
        parts.append(static)
        at += len(static)
        last = m.end()
        tok = m.group(0)
        if tok in ("{{", "}}"):
            parts.append(tok[0])
            at += 1
            continue
        name = m.group(1)
        if name is None:
            raise TemplateSyntaxError(f"stray {tok!r} at char {m.start()} in template")
        if name not in values:
            raise KeyError(f"missing input {name!r}; the template needs {placeholders(template)}")
        text = value_text(values[name])
        parts.append(text)
        spans.append((name, at, at + len(text)))
        at += len(text)
    parts.append(template[last:])
    return "".join(parts), spans


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


def escape_braces(text: str) -> str:
    """``text`` as static template text: every brace doubled, so nothing in it is a placeholder.

    Example:
        >>> escape_braces('Reply {"label": "x"}')
        'Reply {{"label": "x"}}'
    """
    return text.replace("{", "{{").replace("}", "}}")


def unescape_braces(template: str) -> str:
    """The text a static template part stands for: ``{{``/``}}`` back to ``{``/``}``
    (the inverse of :func:`escape_braces`; placeholders are left as they are).

    Example:
        >>> unescape_braces('Reply {{"label": "x"}}')
        'Reply {"label": "x"}'
    """
    return template.replace("{{", "{").replace("}}", "}")


def mask_escapes(template: str) -> str:
    """Replace ``{{``/``}}`` by two neutral characters, so character positions are kept."""
    return template.replace("{{", "\0\0").replace("}}", "\0\0")

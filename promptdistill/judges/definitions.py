"""Judge definitions: YAML files in ``judges/``, loaded and validated.

A judge (or generator, such as ``distill_rewrite``) is data, not code::

    name: clause_necessity          # equals the file name
    version: 1                      # bump when the prompt or schema changes
    kind: judge                     # or generator
    description: One line.
    instruction: The system prompt: the rubric (static text; write {{ }} for braces).
    inputs:                         # the fields the user template may use
      - {name: task, description: ..., max_chars: 200}
    user: "Task: {task} ..."        # promptdistill.specs.render syntax
    output_schema: {...}            # JSON Schema of the reply (decoding is constrained to it)
    max_tokens: 64

``load_judge`` checks every field and raises ``SpecError`` naming the file and the field.
Running judges (batching, validation, repair, statistics) lives in
``promptdistill.judges.runner``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from promptdistill.core.config import load_settings
from promptdistill.core.errors import SchemaError, SpecError
from promptdistill.engine.base import check_schema
from promptdistill.specs.checks import read_yaml
from promptdistill.specs.render import TemplateSyntaxError, check_template, render_messages

__all__ = [
    "BUILTIN_DIR",
    "JudgeDefinition",
    "JudgeInput",
    "judge_dirs",
    "list_judges",
    "load_judge",
    "parse_judge",
]

_KINDS = ("judge", "generator")
_KEYS = {"name", "version", "kind", "description", "instruction", "inputs", "user", "output_schema", "max_tokens"}
_ELLIPSIS = " [...]"
MAX_JUDGE_BYTES = 256 * 1024
"""A judge file larger than this is refused (the built-ins are ~2 KB)."""


BUILTIN_DIR = Path(str(resources.files("promptdistill.judges").joinpath("builtin")))
"""The judge definitions shipped with the package."""


def judge_dirs(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where definitions are looked up, in order: ``directory`` (default: the configured
    project folder, ``[paths] judges`` / ``$PROMPTDISTILL_JUDGES_DIR``), then the built-ins."""
    project = Path(directory) if directory is not None else load_settings().judges_dir
    return [project, BUILTIN_DIR] if project.resolve() != BUILTIN_DIR.resolve() else [BUILTIN_DIR]


@dataclass(frozen=True)
class JudgeInput:
    """One input field of a judge."""

    name: str
    description: str
    max_chars: int
    """Longer values are cut to this many characters (prompts must fit a small context)."""


@dataclass(frozen=True)
class JudgeDefinition:
    """A judge or generator as defined in its YAML file. Frozen: edit by copying."""

    name: str
    version: int
    kind: str
    description: str
    instruction: str
    inputs: tuple[JudgeInput, ...]
    user: str
    output_schema: Mapping[str, Any]
    max_tokens: int
    source: str = "<memory>"

    @property
    def schema_json(self) -> str:
        """The output schema as JSON text, properties in file order (decoding follows it)."""
        return json.dumps(self.output_schema, ensure_ascii=False, separators=(",", ":"))

    def messages(self, values: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat messages for one call, each value cut to its field's ``max_chars``.

        Raises:
            SpecError: a declared input is missing from ``values``.
        """
        cut: dict[str, str] = {}
        for field in self.inputs:
            if field.name not in values:
                raise SpecError(f"{self.source}: inputs: judge {self.name!r} needs input {field.name!r}")
            text = values[field.name]
            text = text if isinstance(text, str) else str(text)
            if len(text) > field.max_chars:
                text = text[: max(0, field.max_chars - len(_ELLIPSIS))] + _ELLIPSIS
            cut[field.name] = text
        return render_messages(self.instruction, self.user, cut)


def list_judges(directory: str | os.PathLike[str] | None = None) -> list[str]:
    """Names of every judge definition found (project folder and built-ins)."""
    return sorted({p.stem for root in judge_dirs(directory) for p in root.glob("*.yaml")})


def load_judge(name: str, directory: str | os.PathLike[str] | None = None) -> JudgeDefinition:
    """Load and validate ``<name>.yaml``: the project's copy if it has one, else the built-in.

    Raises:
        SpecError: no such definition, or a field is invalid (the message names both).
    """
    roots = judge_dirs(directory)
    path = next((root / f"{name}.yaml" for root in roots if (root / f"{name}.yaml").is_file()), None)
    if path is None:
        known = ", ".join(list_judges(directory)) or "none"
        raise SpecError(f"{roots[0] / (name + '.yaml')}: no such judge definition (known: {known})")
    # The spec files' loader: UTF-8 only, bounded size, aliases and expanded nodes.
    data, problem = read_yaml(path, max_bytes=MAX_JUDGE_BYTES)
    if problem:
        raise SpecError(f"{path}: {problem}")
    return parse_judge(data, source=str(path), expected_name=name)


def parse_judge(data: Any, *, source: str, expected_name: str | None = None) -> JudgeDefinition:
    """Validate a parsed YAML mapping into a ``JudgeDefinition`` (errors name ``source``)."""

    def bad(field: str, reason: str) -> SpecError:
        return SpecError(f"{source}: {field}: {reason}")

    if not isinstance(data, Mapping):
        raise bad("(root)", f"must be a mapping, got {type(data).__name__}")
    unknown = set(data) - _KEYS
    if unknown:
        raise bad(sorted(unknown)[0], f"unknown key; known keys: {sorted(_KEYS)}")
    for key in ("name", "version", "instruction", "inputs", "user", "output_schema"):
        if key not in data:
            raise bad(key, "missing")
    name = data["name"]
    if not isinstance(name, str) or not name.isidentifier():
        raise bad("name", f"must be an identifier, got {name!r}")
    if expected_name is not None and name != expected_name:
        raise bad("name", f"must equal the file name {expected_name!r}, got {name!r}")
    version = data["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise bad("version", f"must be a positive integer, got {version!r}")
    kind = data.get("kind", "judge")
    if kind not in _KINDS:
        raise bad("kind", f"must be one of {_KINDS}, got {kind!r}")
    for key in ("instruction", "user"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise bad(key, "must be a non-empty string")
    max_tokens = data.get("max_tokens", 64)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 1024:
        raise bad("max_tokens", f"must be an integer in [1, 1024], got {max_tokens!r}")

    inputs = _parse_inputs(data["inputs"], bad)
    try:
        check_template(data["instruction"], (), where=f"{source}: instruction")
        check_template(data["user"], [i.name for i in inputs], where=f"{source}: user")
    except TemplateSyntaxError as e:
        raise SpecError(str(e)) from None

    schema = data["output_schema"]
    if not isinstance(schema, Mapping) or schema.get("type") != "object" or not schema.get("properties"):
        raise bad("output_schema", "must be a JSON Schema of type object with properties")
    try:
        check_schema(schema)
    except SchemaError as e:
        raise bad("output_schema", str(e)) from None
    return JudgeDefinition(
        name=name,
        version=version,
        kind=kind,
        description=str(data.get("description", "")),
        instruction=data["instruction"],
        inputs=inputs,
        user=data["user"],
        output_schema=schema,
        max_tokens=max_tokens,
        source=source,
    )


def _parse_inputs(raw: Any, bad) -> tuple[JudgeInput, ...]:
    if not isinstance(raw, list) or not raw:
        raise bad("inputs", "must be a non-empty list of {name, description, max_chars}")
    out: list[JudgeInput] = []
    for i, item in enumerate(raw):
        where = f"inputs[{i}]"
        if not isinstance(item, Mapping):
            raise bad(where, "must be a mapping with name, description, max_chars")
        name = item.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise bad(f"{where}.name", f"must be an identifier, got {name!r}")
        if name in {x.name for x in out}:
            raise bad(f"{where}.name", f"duplicate input {name!r}")
        max_chars = item.get("max_chars", 1000)
        if not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 8:
            raise bad(f"{where}.max_chars", f"must be an integer >= 8, got {max_chars!r}")
        out.append(JudgeInput(name=name, description=str(item.get("description", "")), max_chars=max_chars))
    return tuple(out)

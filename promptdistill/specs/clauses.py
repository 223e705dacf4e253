"""Clauses: an instruction and its constraints cut into the pieces the distiller prunes.

``split_text_clauses(text)`` cuts free text at sentence ends, line breaks, bullets and
numbered rules. Nothing is ever cut inside braces or double quotes (a placeholder or a
JSON example stays whole), nor after an abbreviation ("e.g.", "etc."), a URL's dot or a
decimal point. Lossless: each :class:`Clause` records the text between the previous
clause and itself (``sep``: whitespace, line breaks, a bullet marker), so the clauses'
``sep + text`` concatenated give the text back, trailing whitespace aside.

``split_clauses(spec)`` cuts ``spec.instruction`` this way and takes every constraint as
one clause. A clause is *protected* (never pruned, never rewritten) when it states an
output-format rule or carries a literal template fragment:

* it contains a brace (a placeholder or a JSON example);
* it mentions JSON, or says "reply only", "of the form", "nothing else";
* it names two or more of the values the output schema allows (an enum: the labels);
* it is a rule about an output field: it starts with the field's name ("total must
  be ...", "The summary must ...") or names a field whose name has an underscore.

``apply_clauses(spec, keep)`` builds the spec with only the kept clauses (the spec's
context and examples are untouched); protected clauses are kept whatever ``keep`` says.
The distiller prunes with it, the optimizer restores a pruned clause with it
(:mod:`promptdistill.optimize.blocks`), the prompt diff cuts with ``split_text_clauses``.

Light on purpose (``re`` and dataclasses only), so the CLI and the night report can use it.

Example:
    >>> [c.text for c in split_text_clauses("Be kind, e.g. Smile. Rules:\\n- Be brief")]
    ['Be kind, e.g. Smile.', 'Rules:', 'Be brief']
    >>> "".join(c.sep + c.text for c in split_text_clauses("A. B.\\n- c"))
    'A. B.\\n- c'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "Clause",
    "apply_clauses",
    "join_clauses",
    "mark_clause",
    "protection_reason",
    "split_clauses",
    "split_text_clauses",
]

_BULLET = re.compile(r"^(\s*)((?:[-*\u2022]|\d{1,3}[.)])\s+)")
_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf", "mr", "mrs", "ms", "dr", "no", "approx", "incl", "fig"}


@dataclass(frozen=True)
class Clause:
    """One prunable (or protected) piece of an instruction."""

    id: str
    """'i3' for the 4th instruction clause, 'c0' for the first constraint."""
    text: str
    source: str
    """'instruction' or 'constraint'."""
    index: int
    """Position within its source."""
    sep: str = ""
    """Text between the previous clause and this one in the original (bullet markers included)."""
    protected: bool = False
    reason: str | None = None
    """Why the clause is protected."""


def _sentence_ends(line: str) -> list[int]:
    """Offsets just after each sentence end in ``line`` (outside braces and double quotes)."""
    ends, depth, quoted = [], 0, False
    for i, ch in enumerate(line):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        elif ch == '"':
            quoted = not quoted
        elif ch in ".!?" and depth == 0 and not quoted:
            j = i + 1
            while j < len(line) and line[j] in "\"')]":
                j += 1
            if j >= len(line) or not line[j].isspace():
                continue  # "shop.example/products", "3.5", or the end of the line
            rest = line[j:].lstrip()
            if not rest or not (rest[0].isupper() or rest[0].isdigit() or rest[0] in "\"'(["):
                continue
            word = re.findall(r"[A-Za-z.]+$", line[: i])
            if word and word[0].lower().strip(".") in _ABBREVIATIONS:
                continue
            ends.append(j)
    return ends


def split_text_clauses(text: str, *, source: str = "instruction", prefix: str = "i") -> list[Clause]:
    """Cut free text into clauses at sentence ends, line breaks and bullet markers.

    The clauses' ``sep`` + ``text`` concatenated give ``text`` back (trailing whitespace
    aside), so the cut is lossless.
    """
    pieces: list[tuple[str, str]] = []  # (separator, clause text)
    pending = ""
    for line in re.split(r"(\n)", text):
        if line == "\n":
            pending += line
            continue
        bullet = _BULLET.match(line)
        if bullet:
            pending += bullet.group(0)
            line = line[bullet.end() :]
        start = 0
        for end in _sentence_ends(line) + [len(line)]:
            chunk = line[start:end]
            lead = chunk[: len(chunk) - len(chunk.lstrip())]
            body = chunk.strip()
            if body:
                pieces.append((pending + lead, body))
                pending = chunk[len(lead) + len(body) :]
            else:
                pending += chunk
            start = end
    return [Clause(f"{prefix}{n}", body, source, n, sep) for n, (sep, body) in enumerate(pieces)]


_FORMAT_WORDS = re.compile(r"\bjson\b|\breply only\b|\brespond only\b|\bof the form\b|\bnothing else\b", re.I)


def _enum_values(schema: Mapping[str, Any] | None) -> list[str]:
    values: list[str] = []
    if not isinstance(schema, Mapping):
        return values
    for prop in (schema.get("properties") or {}).values():
        if isinstance(prop, Mapping):
            values += [str(v) for v in prop.get("enum", ()) if isinstance(v, (str, int))]
    return values


def protection_reason(text: str, output_schema: Mapping[str, Any] | None = None) -> str | None:
    """Why a clause must not be pruned, or None (see the module docstring for the rules)."""
    if "{" in text or "}" in text:
        return "contains a placeholder or a literal JSON fragment"
    if _FORMAT_WORDS.search(text):
        return "states the output format"
    lowered = text.lower()
    named = [v for v in _enum_values(output_schema) if re.search(rf"\b{re.escape(v.lower())}\b", lowered)]
    if len(named) >= 2:
        return f"lists the allowed output values ({', '.join(named)})"
    props = (output_schema or {}).get("properties") or {}
    for name in props:
        starts = re.match(rf"^(?:the\s+)?{re.escape(name)}\b", text.strip(), re.I)
        if starts or ("_" in name and re.search(rf"\b{re.escape(name)}\b", text)):
            return f"a rule for the output field {name!r}"
    return None


def split_clauses(spec: Any) -> tuple[Clause, ...]:
    """The spec's instruction clauses, then one clause per constraint, protection marked."""
    schema = spec.output_schema
    out: list[Clause] = []
    for c in split_text_clauses(spec.instruction, source="instruction", prefix="i"):
        reason = protection_reason(c.text, schema)
        out.append(Clause(c.id, c.text, c.source, c.index, c.sep, reason is not None, reason))
    for n, text in enumerate(spec.constraints):
        reason = protection_reason(text, schema)
        out.append(Clause(f"c{n}", text.strip(), "constraint", n, "", reason is not None, reason))
    return tuple(out)


def join_clauses(clauses: Sequence[Clause], keep: Iterable[str] | None = None) -> str:
    """Rebuild one source's free text from its clauses, keeping only ids in ``keep``.

    Args:
        clauses: All clauses of one source, as ``split_text_clauses`` made them.
        keep: Ids to keep (protected clauses are not special here); None keeps all.

    Between two kept clauses goes the strongest separator of the run they span (the one
    with the most line breaks, the later one on ties): dropping the first sentence of a
    paragraph keeps the paragraph break, dropping a bullet keeps the next bullet marker.
    Before the first kept clause goes that separator without leading whitespace.
    """
    keep_set = None if keep is None else set(keep)
    ordered = sorted(clauses, key=lambda c: c.index)
    parts: list[str] = []
    run: list[str] = []
    for c in ordered:
        run.append(c.sep)
        if keep_set is not None and c.id not in keep_set:
            continue
        best = run[max(range(len(run)), key=lambda i: (run[i].count("\n"), i))]
        # Before the first kept clause only a bullet marker survives, not the whitespace.
        parts.append((best or " ") if parts else best.lstrip())
        parts.append(c.text)
        run = []
    return "".join(parts)


def apply_clauses(spec: Any, keep: Iterable[str], *, all_clauses: Sequence[Clause] | None = None) -> Any:
    """The spec with only the kept clause ids (protected clauses are always kept).

    The instruction is rebuilt from its kept clauses; constraints keep their order. If
    no instruction clause survives, the first kept constraint becomes the instruction
    (a spec's instruction must not be empty).
    """
    clauses = tuple(all_clauses) if all_clauses is not None else split_clauses(spec)
    keep_ids = {c.id for c in clauses if c.protected or c.id in set(keep)}
    instruction = join_clauses([c for c in clauses if c.source == "instruction"], keep_ids)
    constraints = [c.text for c in clauses if c.source == "constraint" and c.id in keep_ids]
    if not instruction.strip():
        instruction = constraints.pop(0) if constraints else spec.instruction
    return spec.with_changes(instruction=instruction, constraints=tuple(constraints))


def mark_clause(spec: Any, clause: Clause, *, clauses: Sequence[Clause] | None = None) -> str:
    """The instruction text (instruction plus rules) with ``clause`` wrapped in >>> <<<."""
    clauses = tuple(clauses) if clauses is not None else split_clauses(spec)
    marked = [c if c.id != clause.id else Clause(c.id, f">>>{c.text}<<<", c.source, c.index, c.sep) for c in clauses]
    instruction = join_clauses([c for c in marked if c.source == "instruction"])
    rules = [c.text for c in marked if c.source == "constraint"]
    return instruction + ("\n\nRules:\n" + "\n".join(f"- {r}" for r in rules) if rules else "")

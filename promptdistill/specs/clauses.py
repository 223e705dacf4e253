"""Cutting free text into clauses: the one cutter for the distiller and the prompt diff.

``split_text_clauses(text)`` cuts at sentence ends, line breaks, bullets and numbered
rules. Nothing is ever cut inside braces or double quotes (a placeholder or a JSON example
stays whole), nor after an abbreviation ("e.g.", "etc."), a URL's dot or a decimal point.

Lossless: each :class:`Clause` records the text between the previous clause and itself
(``sep``: whitespace, line breaks, a bullet marker), so the clauses' ``sep + text``
concatenated give the text back, trailing whitespace aside.

Light on purpose (``re`` and dataclasses only): the CLI and the night report use it
through :mod:`promptdistill.specs.diff`; :mod:`promptdistill.distill.clauses` adds the
protection rules and the rebuilding on top.

Example:
    >>> [c.text for c in split_text_clauses("Be kind, e.g. Smile. Rules:\\n- Be brief")]
    ['Be kind, e.g. Smile.', 'Rules:', 'Be brief']
    >>> "".join(c.sep + c.text for c in split_text_clauses("A. B.\\n- c"))
    'A. B.\\n- c'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Clause", "split_text_clauses"]

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

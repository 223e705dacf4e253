"""The clause-level diff of two prompts: what the night report and ``templates diff`` show.

Both texts are cut with the one clause cutter (:func:`promptdistill.specs.clauses.split_text_clauses`);
a diff unit is a clause with the text before it (its ``sep``: whitespace, line breaks, a
bullet marker), the last unit also takes the text's trailing whitespace. Joining the
units gives the text back, so each side of a diff is the prompt as written:
``"".join(op.before for op in ops) == before`` and the same for ``after``.

Light on purpose (``difflib`` and ``re``): the CLI imports it at start-up.

Example:
    >>> ops = prompt_diff("Be kind. Be brief. Answer.", "Be brief. Answer now.")
    >>> diff_text(ops)
    '[-Be kind.-] Be brief. [~Answer.~>Answer now.~]'
    >>> diff_counts(ops)
    {'removed': 1, 'added': 0, 'rewritten': 1}
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from promptdistill.specs.clauses import split_text_clauses

__all__ = ["DiffOp", "diff_counts", "diff_text", "diff_units", "mark", "prompt_diff"]


@dataclass(frozen=True)
class DiffOp:
    """One stretch of a prompt diff: ``same``, ``removed``, ``added`` or ``rewritten`` (old -> new)."""

    kind: str
    before: str
    after: str


def diff_units(text: str) -> list[str]:
    """``text`` cut into diff units: each clause with its ``sep`` in front.

    Lossless: ``"".join(diff_units(t)) == t`` (the trailing whitespace goes with the last
    unit; a text of whitespace only is one unit).
    """
    units = [c.sep + c.text for c in split_text_clauses(text)]
    tail = text[sum(map(len, units)):]
    if tail and units:
        units[-1] += tail
    elif tail:
        units.append(tail)
    return units


def _similar(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a.lower().split(), b.lower().split(), autojunk=False).ratio()


def _refine(old: list[str], new: list[str]) -> list[DiffOp]:
    """A replaced run of clauses: pair each new clause, in order, with the most similar old
    one after the last pair (``rewritten``); the rest were ``removed`` or ``added``. With no
    pair at all, the run was rewritten as a whole."""
    ops: list[DiffOp] = []
    start = 0
    for unit in new:
        scores = [(_similar(o, unit), i) for i, o in enumerate(old[start:], start) if o.strip()]
        score, best = max(scores, default=(0.0, -1))
        if not unit.strip() or score < 0.5:
            ops.append(DiffOp("added", "", unit))
            continue
        if best > start:
            ops.append(DiffOp("removed", "".join(old[start:best]), ""))
        ops.append(DiffOp("rewritten", old[best], unit))
        start = best + 1
    if start < len(old):
        ops.append(DiffOp("removed", "".join(old[start:]), ""))
    if not any(o.kind == "rewritten" for o in ops):
        return [DiffOp("rewritten", "".join(old), "".join(new))]
    return ops


def _merge(ops: Iterable[DiffOp]) -> list[DiffOp]:
    out: list[DiffOp] = []
    for o in ops:
        if out and out[-1].kind == o.kind and o.kind != "rewritten":
            out[-1] = DiffOp(o.kind, out[-1].before + o.before, out[-1].after + o.after)
        else:
            out.append(o)
    return out


def prompt_diff(before: str, after: str) -> list[DiffOp]:
    """The clause-level diff of two prompts (``difflib`` on clauses, whitespace ignored).

    A clause only in ``before`` is ``removed``, only in ``after`` ``added``; a clause
    replaced by a similar one (half its words or more in common) is ``rewritten``, and so
    is a run of clauses replaced by unrelated ones. The one diff both the night report and
    ``promptdistill templates diff`` use.

    Example:
        >>> [op.kind for op in prompt_diff("Be kind. Be brief. Answer.", "Be brief. Answer now.")]
        ['removed', 'same', 'rewritten']
    """
    a, b = diff_units(before), diff_units(after)
    matcher = difflib.SequenceMatcher(None, [u.strip() for u in a], [u.strip() for u in b], autojunk=False)
    ops: list[DiffOp] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "replace":
            ops += _refine(a[i1:i2], b[j1:j2])
        else:
            ops.append(DiffOp({"equal": "same", "delete": "removed", "insert": "added"}[tag],
                              "".join(a[i1:i2]), "".join(b[j1:j2])))
    return _merge(ops)


def mark(text: str, left: str, right: str, escape: Callable[[str], str] = str) -> str:
    """``text`` inside the marks, its leading and trailing whitespace (a clause's
    separator: spaces, line breaks) outside them, so no blank is marked.

    Each piece of ``text`` goes through ``escape`` (the night report's HTML escaping);
    the marks do not. Text of whitespace only is returned (escaped) without marks.
    """
    core = text.strip()
    if not core:
        return escape(text)
    start = len(text) - len(text.lstrip())
    return f"{escape(text[:start])}{left}{escape(core)}{right}{escape(text[start + len(core):])}"


def diff_text(ops: Sequence[DiffOp]) -> str:
    """The diff for a terminal: ``[-removed-]``, ``{+added+}``, ``[~old~>new~]``.

    Reads as the new text with the changes marked; whitespace around a change stays
    outside its marks, and a removed stretch keeps the old text's break after it.
    """
    out = []
    for n, o in enumerate(ops):
        if o.kind == "same":
            out.append(o.after)
        elif o.kind == "removed":
            nxt = ops[n + 1] if n + 1 < len(ops) else None
            gap = ""
            if nxt is not None and o.before == o.before.rstrip() and diff_text([nxt])[:1].strip():
                gap = nxt.before[: len(nxt.before) - len(nxt.before.lstrip())]
            out.append(mark(o.before, "[-", "-]") + gap)
        elif o.kind == "added":
            out.append(mark(o.after, "{+", "+}"))
        else:
            out.append(mark(o.after or o.before, f"[~{o.before.strip()}~>", "~]"))
    return "".join(out)


def diff_counts(ops: Sequence[DiffOp]) -> dict[str, int]:
    """Clauses per kind: what the diff's heading says (a rewrite counts the new clauses)."""
    out = {"removed": 0, "added": 0, "rewritten": 0}
    for o in ops:
        if o.kind in out:
            out[o.kind] += len(split_text_clauses(o.before if o.kind == "removed" else o.after))
    return out

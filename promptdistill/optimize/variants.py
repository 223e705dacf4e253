"""Prompt variants for the optimizer: the original instruction plus the distiller's
candidates, and each with its reply format restated after the input.

The distiller returns candidates of several lengths and densities; the optimizer takes its
finalists (chosen on the screen records only, so the optimizer's race on the certify
records stays unbiased), shortest first, so the search sweeps density and length with
real rewrites.

A reply reminder (``with_reply_reminder``) repeats the reply's keys at the end of the user
part, where a small model reads them last. Whether it helps depends on the task (it helps
some specs and costs others: docs/bench/reply_reminder.md), so it is a candidate the race
decides, never a default.

The described variant (``described_variant``) is the spec's one-line ``description`` as
the whole instruction, without its rules: the part a DSPy signature's docstring plays. On
a small model the rules can cost quality where constrained decoding already enforces the
reply's format (docs/bench/peers_invoice_tokens.md, docs/bench/history.md). Also a
candidate the race decides.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from promptdistill.specs.model import Spec
from promptdistill.specs.render import escape_braces

__all__ = ["DESCRIBED", "REMINDER_TAG", "described_variant", "instruction_variants", "reply_reminder",
           "variants_from_parquet", "with_reply_reminder"]

REMINDER_TAG = "remind"
"""Marks a variant whose user part ends with the reply reminder (``r1-prune+remind``)."""
DESCRIBED = "described"
"""The id of the variant whose instruction is the spec's description (``described/none``)."""


def reply_reminder(spec: Spec) -> str | None:
    """The sentence that restates the reply's keys (the required ones, else every property),
    from the spec's output schema; None when it has no fixed object schema (none, or one per
    request).

    Example:
        >>> reply_reminder(spec)  # doctest: +SKIP
        'Reply with one JSON object with the keys vendor, total and currency.'
    """
    schema = spec.output_schema
    if spec.schema_from is not None or not isinstance(schema, dict) or not schema.get("properties"):
        return None
    # The required keys when the schema names them: listing optional ones invites the model to fill them.
    keys = [str(k) for k in (schema.get("required") or schema["properties"])]
    names = keys[0] if len(keys) == 1 else f"{', '.join(keys[:-1])} and {keys[-1]}"
    return f"Reply with one JSON object with the key{'s' if len(keys) > 1 else ''} {names}."


def with_reply_reminder(spec: Spec) -> Spec | None:
    """``spec`` with :func:`reply_reminder` after its user template; None when it has none or
    already ends with it."""
    text = reply_reminder(spec)
    if text is None:
        return None
    tail = "\n\n" + escape_braces(text)
    return None if spec.user.endswith(tail) else spec.with_changes(user=spec.user + tail)


def described_variant(spec: Spec) -> Spec | None:
    """``spec`` with its ``description`` as the whole instruction and no rules (constraints);
    its context, examples, user template and output unchanged. None when the description is
    empty or already the instruction text, or when the spec has no output schema: constrained
    decoding then enforces no format, and the rules may be the only statement of the reply's.

    Example:
        >>> described_variant(spec).instruction_text()  # doctest: +SKIP
        'Route an incoming customer support ticket to the team that should handle it.'
    """
    text = spec.description.strip()
    if not text or text == spec.instruction_text() or (spec.output_schema is None and spec.schema_from is None):
        return None
    return spec.with_changes(instruction=text, constraints=())


def _finalists(result: Any) -> list[tuple[str, Spec]]:
    by_id = {c.id: c for c in result.candidates}
    return [(cid, by_id[cid].spec) for cid in result.finalists if cid in by_id]


def instruction_variants(spec: Spec, distilled: Any = None, *, max_variants: int = 3,
                         described: bool = False) -> list[tuple[str, Spec]]:
    """``[("original", spec), (id, variant_spec), ...]``, at most ``max_variants``, distinct texts,
    then ``(DESCRIBED, described_variant(spec))`` when ``described`` and its text is new.

    Args:
        spec: the spec as written.
        distilled: a ``DistillResult`` (its finalists), or a sequence of specs or (id, spec) pairs, or None.
        max_variants: the original and the distiller's, not the described one.
        described: add the described variant (a different source: it does not take a distiller's place).

    Each variant keeps ``spec``'s examples, user template, output and metric: only the
    instruction and constraints come from the distiller.
    """
    pairs: list[tuple[str, Spec]] = []
    if distilled is None:
        pass
    elif hasattr(distilled, "finalists"):
        pairs = _finalists(distilled)
    else:
        for n, item in enumerate(distilled):
            pairs.append(item if isinstance(item, tuple) else (f"variant{n + 1}", item))
    out = [("original", spec)]
    seen = {spec.instruction_text()}
    for vid, v in pairs:
        if len(out) >= max_variants:
            break
        text = v.instruction_text()
        if text in seen or not text.strip():
            continue
        seen.add(text)
        out.append((str(vid), spec.with_changes(instruction=v.instruction, constraints=tuple(v.constraints))))
    short = described_variant(spec) if described else None
    if short is not None and short.instruction_text() not in seen:
        out.append((DESCRIBED, short))
    return out


def variants_from_parquet(spec: Spec, path: str | os.PathLike[str]) -> list[tuple[str, Spec]]:
    """The finalists from the candidate table ``DistillResult.write`` leaves (shortest first)."""
    df = pd.read_parquet(path)
    df = df[df["finalist"]].sort_values(["instruction_tokens", "candidate_id"])
    return [(str(row.candidate_id), spec.with_changes(instruction=row.instruction,
                                                      constraints=tuple(json.loads(row.constraints))))
            for row in df.itertuples()]

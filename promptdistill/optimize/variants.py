"""Instruction variants for the optimizer: the original plus the distiller's candidates.

The distiller returns candidates of several lengths and densities; the optimizer takes its
finalists (chosen on the screen records only, so the optimizer's race on the certify
records stays unbiased), shortest first, so the search sweeps density and length with
real rewrites.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pandas as pd

from promptdistill.specs.model import Spec

__all__ = ["instruction_variants", "variants_from_parquet"]


def _finalists(result: Any) -> list[tuple[str, Spec]]:
    by_id = {c.id: c for c in result.candidates}
    return [(cid, by_id[cid].spec) for cid in result.finalists if cid in by_id]


def instruction_variants(spec: Spec, distilled: Any = None, *, max_variants: int = 3) -> list[tuple[str, Spec]]:
    """``[("original", spec), (id, variant_spec), ...]``, at most ``max_variants``, distinct texts.

    Args:
        spec: the spec as written.
        distilled: a ``DistillResult`` (its finalists), or a sequence of specs or (id, spec) pairs, or None.
        max_variants: the original included.

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
    return out


def variants_from_parquet(spec: Spec, path: str | os.PathLike[str]) -> list[tuple[str, Spec]]:
    """The finalists from the candidate table ``DistillResult.write`` leaves (shortest first)."""
    df = pd.read_parquet(path)
    df = df[df["finalist"]].sort_values(["instruction_tokens", "candidate_id"])
    return [(str(row.candidate_id), spec.with_changes(instruction=row.instruction,
                                                      constraints=tuple(json.loads(row.constraints))))
            for row in df.itertuples()]

"""Instruction variants for the optimizer: the original plus the distiller's candidates.

The distiller ([D]) returns candidates of several lengths and densities; the optimizer
takes a few of them (the distiller's winner first, then the best of those evaluated
furthest), so the search sweeps density and length with real rewrites.
"""

from __future__ import annotations

import json
import os
from typing import Any

from promptdistill.specs import Spec

__all__ = ["instruction_variants", "variants_from_parquet"]


def _ranked_distill_candidates(result: Any) -> list[tuple[str, Spec]]:
    winner = getattr(result, "winner", None)
    cands = [c for c in getattr(result, "candidates", []) if getattr(c, "report", None) is not None]
    cands.sort(key=lambda c: (c is not winner, -getattr(c, "rung", -1), -(c.report.mean or 0.0), c.id))
    return [(c.id, c.spec) for c in cands]


def instruction_variants(spec: Spec, distilled: Any = None, *, max_variants: int = 3) -> list[tuple[str, Spec]]:
    """``[("original", spec), (id, variant_spec), ...]``, at most ``max_variants``, distinct texts.

    Args:
        spec: the spec as written.
        distilled: a ``DistillResult``, or a sequence of specs or (id, spec) pairs, or None.
        max_variants: the original included.

    Each variant keeps ``spec``'s examples, user template, output and metric: only the
    instruction and constraints come from the distiller.
    """
    pairs: list[tuple[str, Spec]] = []
    if distilled is None:
        pass
    elif hasattr(distilled, "candidates"):
        pairs = _ranked_distill_candidates(distilled)
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
    """Variants from the candidate table ``promptdistill distill`` writes (winner first).

    Only rows that were evaluated (``dev_mean`` present) are used.
    """
    import pandas as pd

    df = pd.read_parquet(path)
    df = df[df["dev_mean"].notna() & (df["origin"] != "baseline")]
    df = df.sort_values(["winner", "rung", "dev_mean", "candidate_id"], ascending=[False, False, False, True])
    out = []
    for row in df.itertuples():
        constraints = tuple(json.loads(row.constraints)) if isinstance(row.constraints, str) else ()
        out.append((str(row.candidate_id), spec.with_changes(instruction=row.instruction, constraints=constraints)))
    return out

"""Block-aligned variants: restore one pruned clause when it ends the static prefix on a KV block edge.

vLLM caches whole blocks: of a static prefix of ``s`` tokens, ``block * floor(s / block)``
are served from the cache on a warm request, and the tail ``s mod block`` is computed
again on every request. A pruned variant whose static prefix ends just past a block
edge pays that tail on every warm request. Restoring one of the clauses the distiller
pruned (text the baseline already said, in its own place) lengthens the prefix; when the
new end lies at or just past the next edge, warm requests compute fewer tokens while
cold ones compute the restored clause too. The TTFT model predicts both, so the
optimizer adds, per pruned candidate, the restore whose predicted cost is lowest, when it
caches more of the prefix warm *and* its predicted cost (expected TTFT by default) is
lower than its source's. The screen, the race and the selection rule then decide as for
any candidate: a restored clause can only make the prompt say more of what the baseline
said.

Trimming to the edge below would cut text the distiller kept: that is pruning, the
distiller's decision, not a layout change, so it is not done here. A rewritten variant
(not the baseline with clauses dropped) has no clause to restore.

Example:
    >>> from promptdistill.specs.model import Spec
    >>> base = Spec(name="t", description="d", dataset="t.jsonl", inputs=("q",), user="{q}",
    ...             instruction="Answer the question. Be brief. Be kind.")
    >>> pruned = base.with_changes(instruction="Answer the question. Be kind.")
    >>> [(cid, s.instruction) for cid, s in restored_variants(base, pruned)]
    [('i1', 'Answer the question. Be brief. Be kind.')]
"""

from __future__ import annotations

from promptdistill.specs.clauses import Clause, apply_clauses, split_clauses
from promptdistill.specs.model import Spec

__all__ = ["pruned_clauses", "restored_variants", "static_tail"]


def pruned_clauses(baseline: Spec, variant: Spec) -> tuple[tuple[Clause, ...], list[Clause], set[str]] | None:
    """``(baseline clauses, the clauses the variant dropped, the kept ids)``, or None when
    ``variant`` is not the baseline with some clauses dropped (a rewrite, another spec)."""
    clauses = split_clauses(baseline)
    kept_texts = {c.text for c in split_clauses(variant)}
    keep = {c.id for c in clauses if c.protected or c.text in kept_texts}
    if apply_clauses(baseline, keep, all_clauses=clauses).instruction_text() != variant.instruction_text():
        return None
    return clauses, [c for c in clauses if c.id not in keep], keep


def restored_variants(baseline: Spec, variant: Spec) -> list[tuple[str, Spec]]:
    """``(clause id, variant with that clause restored)`` for each clause ``variant`` pruned
    from ``baseline``, in the baseline's order (empty for a rewrite). The variant's
    examples, user template and output are kept: only the instruction and rules change."""
    found = pruned_clauses(baseline, variant)
    if found is None:
        return []
    clauses, pruned, keep = found
    return [(c.id, apply_clauses(variant, keep | {c.id}, all_clauses=clauses)) for c in pruned]


def static_tail(static_tokens: float, block: int) -> int:
    """Tokens of the static prefix past its last full block (computed on every warm request).

    Example:
        >>> static_tail(205, 32), static_tail(224, 32)
        (13, 0)
    """
    return round(static_tokens) % block if block > 0 else 0

"""The optimizer's candidates: an instruction variant x a way of choosing examples x a count.

* ``fixed``: ``k`` train records chosen once on the screen records, in the system part
  (cacheable);
* ``similar``: the ``k`` nearest train records of each request, in the user part (not
  cacheable, so not publishable as a static template by default);
* ``none``: no examples (``k`` = 0); ``baseline``: the spec as written.

A candidate's cost is its predicted TTFT of the selection rule's kind; its static tokens
are the predicted static prefix (the tie-break).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from promptdistill.search.racing import Candidate
from promptdistill.specs.model import Spec

__all__ = ["ExampleCandidate"]


@dataclass(eq=False, kw_only=True)
class ExampleCandidate(Candidate):
    """One point of the optimizer's search space and everything measured about it."""

    variant: str = "original"
    """Instruction variant: 'original' or the distiller's candidate id."""
    strategy: str = "baseline"
    """'baseline', 'none', 'fixed' or 'similar'."""
    k: int = 0
    subset: str = ""
    """How the fixed set was drawn ('balanced', 'random2', ...)."""
    prediction: dict[str, Any] = field(default_factory=dict)
    """``predict_candidate`` output: ttft_cold_ms, ttft_warm_ms, ttft_expected_ms, tokens, density."""

    @property
    def publishable(self) -> bool:
        return self.strategy != "similar"

    def derived(self, tag: str, spec: Spec) -> "ExampleCandidate":
        """A new candidate with ``spec`` and this one's examples, its variant tagged
        (``r1-prune`` -> ``r1-prune+tag``; id ``r1-prune+tag/none``): a restored clause, a
        reply reminder. Nothing measured is carried over."""
        variant = f"{self.variant}+{tag}"
        return ExampleCandidate(id=f"{variant}/{self.id.rsplit('/', 1)[-1]}", spec=spec, examples=self.examples,
                                variant=variant, strategy=self.strategy, k=self.k, subset=self.subset)

    def ttft(self, kind: str) -> float:
        return float(self.prediction.get(f"ttft_{kind}_ms", math.nan))

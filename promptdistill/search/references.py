"""Label-free records: the baseline prompt's own reply is the reference.

Most teams have production traffic (requests, and the replies the current prompt gave),
not labelled data. A dataset record without ``expected`` is label-free: before a search,
the spec as served (its own examples) answers every label-free record once, and that reply
becomes the record's ``expected``. The spec's metric then scores a candidate by how well
it agrees with the baseline (a label's ``exact`` match, a JSON reply's fields, a python
metric's own comparison, or the rubric judge against the baseline's reply as the
reference). The baseline scores itself perfectly where the metric is exact, so
"non-inferior" reads "agrees with the current prompt on all but ``margin`` of requests".

The references are generated in one batch (through the LM cache, so the distiller and the
optimizer share them), and written with the run's outputs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from promptdistill.engine.base import Engine
from promptdistill.evaluate.evaluator import EvalItem
from promptdistill.search.splits import Splits
from promptdistill.specs.metrics import parse_reply
from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import select_examples

__all__ = ["fill_references"]

Record = Mapping[str, Any]


def _reference(spec: Spec, reply: str) -> Any:
    if spec.output_schema is not None or spec.schema_from is not None:
        parsed = parse_reply(reply)
        if parsed is not None:
            return parsed
    return reply.strip()


def fill_references(engine: Engine, spec: Spec, splits: Splits, *, seed: int = 0) -> tuple[Splits, dict[str, Any]]:
    """``splits`` with every label-free record's ``expected`` set to the baseline's reply.

    Returns:
        (the splits, ``{record id: reference}`` for the records that had no label).
    """
    free = [r for part in (splits.screen, splits.certify, splits.test) for r in part if r.get("expected") is None]
    if not free:
        return splits, {}
    examples = select_examples(spec, splits.train, seed=0)  # the spec as served
    # Generated, not scored: there is nothing to score them against yet.
    results = engine.generate(EvalItem(spec, free, examples).requests(seed))
    refs = {str(r["id"]): _reference(spec, result.text) for r, result in zip(free, results)}

    def filled(part: Sequence[Record]) -> list[Record]:
        # The record's own ``reference`` (scoring data) is kept; this marks where expected came from.
        return [{**r, "expected": refs[str(r["id"])], "expected_from": "baseline"} if r.get("expected") is None else r
                for r in part]

    return replace(splits, screen=filled(splits.screen), certify=filled(splits.certify), test=filled(splits.test)), refs

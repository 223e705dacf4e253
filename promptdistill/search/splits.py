"""The one way a spec's records are split for a search: train, screen, certify, test.

The dataset's own ``split`` field says which records are train, dev and test. The dev
records are shuffled by the seed and cut in two:

* ``screen``: the first ``screen_size``: cheap comparisons that choose what to race
  (ablations, example sets, the finalists of a grid);
* ``certify``: the rest, up to ``dev_size``: the race's paired evaluations. Finalists are
  chosen without looking at them, so the error rate of a certified decision holds.

``test`` (shuffled, cut to ``test_size``) is only evaluated after the search, on the
winner and the baseline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Mapping

from promptdistill.specs.datasets import dataset_for, records
from promptdistill.specs.model import Spec

__all__ = ["Splits", "split_records"]

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Splits:
    """Records of one search, each list in the order it is evaluated."""

    train: list[Record] = field(default_factory=list)
    screen: list[Record] = field(default_factory=list)
    certify: list[Record] = field(default_factory=list)
    test: list[Record] = field(default_factory=list)

    @property
    def dev(self) -> list[Record]:
        """Screen then certify records: every dev record the search may use."""
        return self.screen + self.certify

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "screen": len(self.screen), "certify": len(self.certify),
                "test": len(self.test)}


def split_records(spec: Spec, *, seed: int, screen_size: int, dev_size: int, test_size: int) -> Splits:
    """The spec's dataset split for a search (see the module docstring).

    Raises:
        SpecError: the dataset does not load.
        ValueError: it has no dev records.
    """
    df = dataset_for(spec)
    rng = random.Random(seed)
    dev, test = records(df, "dev"), records(df, "test")
    rng.shuffle(dev)
    rng.shuffle(test)
    if not dev:
        raise ValueError(f"{spec.dataset}: no dev records to search on")
    dev = dev[:dev_size]
    screen_n = min(screen_size, max(1, len(dev) // 2)) if len(dev) > 1 else len(dev)
    return Splits(train=records(df, "train"), screen=dev[:screen_n], certify=dev[screen_n:], test=test[:test_size])


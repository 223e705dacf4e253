"""Shared helpers of the dataset generators: split assignment and writing.

Every generator is deterministic (a fixed seed) and computes its expected answers from
the same values it writes into the inputs, so they are right by construction. Run one
with ``python datasets/generators/<name>.py`` (writes ``datasets/<name>.jsonl``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterable, Mapping

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from promptdistill.specs.datasets import write_records  # noqa: E402

SPLIT_SIZES = {"train": 100, "dev": 400, "test": 200}
"""The first 700 records, as the datasets were first published: 100 train (the example
pool the bundled prompts' examples come from), 400 dev, 200 held-out test (scored in two
halves of 100: a 95% interval of about +-0.07 on a mean score over all 200)."""
EXTRA_DEV = 600
"""Dev records appended after them, so the first 700 (and so every prompt's examples and
the test split) stay as they were: 1,000 dev records in all, 16 screen and 984 a race's
certify pool, which is what ``promptdistill plan`` asks for a 0.05 margin at 30-40%
discordant pairs (group-sequential test, 80% power)."""
TOTAL = sum(SPLIT_SIZES.values()) + EXTRA_DEV


def assign_splits(prefix: str, items: Iterable[tuple[Mapping, object]]) -> list[dict]:
    """Number records ``<prefix>-0001``... and split them: train, dev, test (``SPLIT_SIZES``), then ``EXTRA_DEV`` more dev."""
    out = []
    order = [s for s, n in [*SPLIT_SIZES.items(), ("dev", EXTRA_DEV)] for _ in range(n)]
    for i, ((inputs, expected), split) in enumerate(zip(items, order), start=1):
        out.append({"id": f"{prefix}-{i:04d}", "split": split, "inputs": dict(inputs), "expected": expected})
    if len(out) != len(order):
        raise RuntimeError(f"generator produced {len(out)} records, {len(order)} needed")
    return out


def unique(gen: Callable[[], tuple[Mapping, object]], n: int, key: str) -> list[tuple[Mapping, object]]:
    """Draw from ``gen`` until ``n`` records with distinct ``inputs[key]``."""
    seen, out = set(), []
    for _ in range(n * 200):
        inputs, expected = gen()
        if inputs[key] not in seen:
            seen.add(inputs[key])
            out.append((inputs, expected))
            if len(out) == n:
                return out
    raise RuntimeError(f"could not draw {n} distinct records")


def main(name: str, build: Callable[[], list[dict]]) -> None:
    parser = argparse.ArgumentParser(description=f"Generate datasets/{name}.jsonl")
    parser.add_argument("--out", default=str(ROOT / "datasets" / f"{name}.jsonl"))
    args = parser.parse_args()
    path = write_records(args.out, build())
    print(f"wrote {path}")

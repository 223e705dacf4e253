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
"""Sized so a race can certify a few-point margin on the embedded model: 400 dev records
(16 screen, the rest a certify pool) and 200 held-out test records (a 95% interval of
about +-0.07 on a mean score)."""
TOTAL = sum(SPLIT_SIZES.values())


def assign_splits(prefix: str, items: Iterable[tuple[Mapping, object]]) -> list[dict]:
    """Number records ``<prefix>-0001``... and give the first ``SPLIT_SIZES["train"]`` to train, then dev, then test."""
    out = []
    order = [s for s, n in SPLIT_SIZES.items() for _ in range(n)]
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

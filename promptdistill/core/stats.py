"""Statistics for quality scores in [0, 1]: means and bootstrap intervals (pure, numpy only).

Sequential decisions (anytime-valid bounds) are in :mod:`promptdistill.search.sequential`.

* ``bootstrap_ci``: the mean of one candidate's per-record scores with a percentile
  bootstrap interval;
* ``paired_diffs``: ``candidate - baseline`` per record, for the records both scored.

Records whose score is None in either list (a judge that could not score them) are
left out of the pairs. Every function takes a ``seed``: same inputs, same bounds.

Example:
    >>> paired_diffs([1, None, 0], [0, 1, 0]).tolist()
    [1.0, 0.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["MeanCI", "bootstrap_ci", "mean_of", "paired_diffs"]


def mean_of(values: Sequence[float | None]) -> float | None:
    """Mean of the values that are not None; None when there are none."""
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


@dataclass(frozen=True)
class MeanCI:
    """A mean with its bootstrap interval; all None when there was nothing to score."""

    mean: float | None
    low: float | None
    high: float | None
    n: int

    def to_dict(self, prefix: str = "") -> dict[str, float | int | None]:
        return {f"{prefix}mean": self.mean, f"{prefix}ci_low": self.low, f"{prefix}ci_high": self.high, f"{prefix}n": self.n}


def _check(confidence: float, n_boot: int) -> None:
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    if n_boot < 100:
        raise ValueError(f"n_boot must be at least 100, got {n_boot}")


def _boot_means(values: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))
    return values[idx].mean(axis=1)


def bootstrap_ci(
    scores: Sequence[float | None], *, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> MeanCI:
    """Mean of the scored values with a two-sided percentile bootstrap interval.

    Args:
        scores: per-record scores (None: not scored, left out).
        confidence: two-sided coverage, e.g. 0.95.
        n_boot: bootstrap resamples.
        seed: resampling seed.
    """
    _check(confidence, n_boot)
    values = np.asarray([s for s in scores if s is not None], dtype=np.float64)
    if values.size == 0:
        return MeanCI(None, None, None, 0)
    means = _boot_means(values, n_boot, seed)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return MeanCI(float(values.mean()), float(low), float(high), int(values.size))


def paired_diffs(candidate: Sequence[float | None], baseline: Sequence[float | None]) -> np.ndarray:
    """``candidate - baseline`` per record, for the records both scored.

    Raises:
        ValueError: the lists have different lengths (they must cover the same records).
    """
    if len(candidate) != len(baseline):
        raise ValueError(
            f"paired scores need the same records: candidate has {len(candidate)}, baseline {len(baseline)}"
        )
    pairs = [(a, b) for a, b in zip(candidate, baseline) if a is not None and b is not None]
    return np.asarray([a - b for a, b in pairs], dtype=np.float64)

"""Predicted TTFT of a candidate, cold and with a warm prefix cache.

Features come from ``prompt_features`` on the candidate's real prompts (the served
model's tokenizer and chat template). Two predictions per prompt:

* **cold**: nothing cached: ``cached_tokens = 0``;
* **warm**: the static prefix (everything before the first input value) is in the
  cache, as in production where every request shares it. vLLM caches whole blocks and
  always computes the last prompt token, so
  ``cached_tokens = block * floor(min(static_prefix_tokens, total_tokens - 1) / block)``
  (``ttft.estimators.warm_cached_tokens``, the rule the TTFT model applies too), with
  the engine's own block size (``ttft.engine_info.engine_block_size``: 32 on the CPU
  build as promptdistill starts it, 128 on a CPU server started with vLLM's defaults,
  16 by default on GPUs).

Per-request examples sit after the first input (``{fewshot}`` leads the user part), so
their tokens are never in the static prefix: their warm and cold predictions are close,
which is the trade-off against a fixed, cacheable example set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from promptdistill.engine.base import Engine
from promptdistill.specs.model import Load, Slo, Spec
from promptdistill.ttft.engine_info import engine_block_size
from promptdistill.ttft.estimators import warm_cached_tokens
from promptdistill.ttft.features import prompt_features

__all__ = ["DEFAULT_BLOCK_TOKENS", "MIN_TTFT_MS", "LoadPricing", "TTFTPrediction", "clip_ttft", "predict_candidate", "prefix_block_tokens", "warm_cached_tokens"]

DEFAULT_BLOCK_TOKENS = 16
"""vLLM's default KV block size (GPU builds), for an engine that does not say its own."""
MIN_TTFT_MS = 1.0
"""Predictions are clipped from below here: a regression fitted on few points can
extrapolate to zero or negative times, and no request gets its first token faster."""


def clip_ttft(values: Any) -> np.ndarray:
    """Predictions in ms with the physical floor ``MIN_TTFT_MS`` applied."""
    return np.maximum(np.asarray(values, dtype=np.float64), MIN_TTFT_MS)


def prefix_block_tokens(engine: Any, default: int = DEFAULT_BLOCK_TOKENS) -> int:
    """The prefix cache's block size of the engine behind ``engine`` (in-process or a
    server: ``engine_block_size``), or ``default`` when the engine does not say."""
    size = engine_block_size(engine)
    return default if size is None else size


class TTFTPrediction(dict):
    """Mean features and predictions of one candidate over its sample prompts (a plain dict).

    Keys: ``ttft_cold_ms``, ``ttft_warm_ms``, ``total_tokens``, ``static_prefix_tokens``,
    ``warm_cached_tokens``, ``fewshot_count``, ``fewshot_tokens``, ``instruction_tokens``,
    ``semantic_density``, ``max_total_tokens``, ``n_prompts``, ``clipped_predictions``
    (raw predictions below ``MIN_TTFT_MS``, and warm ones above their cold ones: signs the
    model extrapolates).
    """


def predict_candidate(
    engine: Engine,
    model: Any,
    spec: Spec,
    records: Sequence[Mapping[str, Any]],
    *,
    examples: Sequence[Mapping[str, Any]] = (),
    fewshot_count: int | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> TTFTPrediction:
    """Predict cold and warm TTFT for ``spec`` on ``records`` (means over the records).

    Args:
        engine: its tokenizer and chat template are used; its identity must match the model's.
        model: a fitted ``TTFTModel``.
        spec: the candidate's spec.
        records: sample records (their ``inputs`` are rendered).
        examples: the fixed examples in the system part.
        fewshot_count: overrides the feature (per-request examples are not in ``examples``).
        block_tokens: the prefix cache's block size.
    """
    if not records:
        raise ValueError("predict_candidate needs at least one record")
    rows = []
    for r in records:
        f = dict(prompt_features(spec, r["inputs"], engine, examples=examples))
        if fewshot_count is not None:
            f["fewshot_count"] = fewshot_count
        warm = warm_cached_tokens(f["static_prefix_tokens"], f["total_tokens"], block_tokens)
        rows.append((f, {**f, "cached_tokens": 0}, {**f, "cached_tokens": warm}, warm))
    raw_cold = model.predict_many([c for _, c, _, _ in rows], engine_identity=engine.identity)
    raw_warm = model.predict_many([w for _, _, w, _ in rows], engine_identity=engine.identity)
    cold, warm = clip_ttft(raw_cold), clip_ttft(raw_warm)
    # A prefix served from the cache skips work: a warm prediction above the cold one is the
    # model extrapolating, so it is held at the cold one and counted with the clipped.
    clipped = int(np.sum(np.asarray(raw_cold) < MIN_TTFT_MS) + np.sum(np.asarray(raw_warm) < MIN_TTFT_MS)
                  + np.sum(warm > cold))
    warm = np.minimum(warm, cold)

    def mean(key: str) -> float:
        return float(np.mean([f[key] for f, _, _, _ in rows]))

    return TTFTPrediction(
        ttft_cold_ms=float(np.mean(cold)), ttft_warm_ms=float(np.mean(warm)),
        total_tokens=mean("total_tokens"), static_prefix_tokens=mean("static_prefix_tokens"),
        warm_cached_tokens=float(np.mean([w for *_, w in rows])), fewshot_count=mean("fewshot_count"),
        fewshot_tokens=mean("fewshot_tokens"), instruction_tokens=mean("instruction_tokens"),
        semantic_density=mean("semantic_density"), max_total_tokens=int(max(f["total_tokens"] for f, *_ in rows)),
        n_prompts=len(rows), clipped_predictions=clipped,
    )


@dataclass(frozen=True)
class LoadPricing:
    """A candidate's latency at the spec's declared load (``slo.load``): the load TTFT
    model's percentile for its prompt features and reply length.

    Built by :meth:`from_model` with the model's held-out error at that load kind as the
    resolution, so a difference the model cannot tell apart is a tie, as for solo TTFT.
    """

    model: Any
    """A fitted ``promptdistill.load.model.LoadTTFTModel``."""
    load: Load
    percentile: float
    relative_error: float
    """The model's held-out error (MAPE): at the profiled concurrency nearest a declared one;
    for a declared rate, the largest over the profiled rates."""
    server: tuple[str, str] | None = None
    """Where verification measures at the load: (a vLLM server's ``.../v1`` URL, its served
    model name); None: the engine's own server, or one started for the measurement."""

    @classmethod
    def from_model(cls, model: Any, slo: Slo, errors: Sequence[Mapping[str, Any]] = (), *,
                   server: tuple[str, str] | None = None) -> "LoadPricing":
        """``errors``: the model's held-out error table (``load.fit.load_error_table``);
        without it the error is unknown and taken as 0.25 (a wide tie, never a false "faster")."""
        if slo.load is None:
            raise ValueError("LoadPricing needs a spec that declares slo.load")
        same = [e for e in errors if e.get("load_kind") == slo.load.kind and e.get("mape") is not None]
        if not same:
            return cls(model, slo.load, slo.ttft_percentile, UNKNOWN_LOAD_ERROR, server)
        if slo.load.kind == "rate":
            # The profile's rates are shares of each template's capacity, not the declared
            # rate's: the largest of their errors, never a flattering one.
            return cls(model, slo.load, slo.ttft_percentile, max(float(e["mape"]) for e in same), server)
        nearest = min(same, key=lambda e: abs(math.log(float(e["load_value"]) / slo.load.value)))
        return cls(model, slo.load, slo.ttft_percentile, float(nearest["mape"]), server)

    @property
    def latency(self) -> str:
        """The latency that decides, as reasons name it: 'P95 TTFT at 4 req/s'."""
        return f"P{self.percentile:g} TTFT at {self.load.describe()}"

    def price(self, prediction: Mapping[str, Any], completion_tokens: float) -> float:
        """The predicted percentile (ms) for a candidate's mean prediction features; ``inf``
        when the template cannot sustain the load at all."""
        return float(self.model.predict_one(self._features(prediction, completion_tokens), self.load.kind,
                                            self.load.value))

    def sustainable_rps(self, prediction: Mapping[str, Any], completion_tokens: float,
                        target_ms: float | None) -> float | None:
        """The highest rate at which the predicted percentile meets ``target_ms`` (None without one)."""
        if target_ms is None:
            return None
        return float(self.model.sustainable_rate(self._features(prediction, completion_tokens), target_ms))

    @staticmethod
    def _features(prediction: Mapping[str, Any], completion_tokens: float) -> dict[str, float]:
        cached = float(prediction["warm_cached_tokens"])
        return {"uncached_tokens": float(prediction["total_tokens"]) - cached, "cached_tokens": cached,
                "completion_tokens": float(completion_tokens)}

    def utilization(self, prediction: Mapping[str, Any], completion_tokens: float) -> float | None:
        """Predicted engine utilization at a rate (None for a concurrency)."""
        if self.load.rate_rps is None:
            return None
        return float(self.model.utilization(self._features(prediction, completion_tokens), self.load.rate_rps))


UNKNOWN_LOAD_ERROR = 0.25
"""The resolution taken when a load model carries no held-out error for the load's kind."""

"""``TTFTModel``: a fitted TTFT predictor stamped with the engine it was fitted on.

Persistence never executes code on load:

* monomial models (linear, polynomial) are one JSON file, ``model.json``, holding the
  engine mechanics (cache block and prefill chunk sizes), the terms, coefficients and
  intercept; predictions after loading are bit-identical;
* the tree ensemble is ``estimator.skops`` (skops' safe format, loaded with an explicit
  allowlist of types) next to ``model.json``, which records its sha256 and the mechanics.

Format 2 models take ``MODEL_FEATURES`` and derive the engine's mechanics inside
(``estimators.EngineMechanics``); format 1 models (the five base features, no
mechanics) still load and predict as they did.

No pickle, no joblib. ``to_files()``/``from_files()`` give the artifact as a
``{filename: bytes}`` dict: the registry stores it (``ttft-model/<engine key>``, see
:mod:`promptdistill.pipeline.ttft_models`), the one place models live.

A model answers for one engine identity (model, backend, dtype, context length,
hardware, engine version). ``predict(..., engine_identity=other)`` raises
``ModelIdentityError``; ``allow_other_engine=True`` downgrades that to a loud warning.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import skops.io as sio
from sklearn.pipeline import Pipeline
from threadpoolctl import threadpool_limits

from promptdistill.core.errors import IntegrityError, ModelIdentityError
from promptdistill.core.jsonio import canonical_json, json_safe
from promptdistill.engine.base import EngineIdentity
from promptdistill.ttft.estimators import (
    BASE_FEATURES,
    DERIVED_FEATURES,
    MODEL_FEATURES,
    MonomialRegressor,
    with_mechanics,
)
from promptdistill.ttft.fit import OPTIONAL_INPUTS, identity_of

__all__ = ["FORMAT", "TTFTModel", "feature_row"]

FORMAT = "promptdistill.ttft-model"
_FEATURES_OF_VERSION = {1: BASE_FEATURES, 2: MODEL_FEATURES}
_JSON = "model.json"
_SKOPS = "estimator.skops"

# Types skops does not trust by default that a stored tree ensemble may contain; any
# other untrusted type in an estimator file is refused before loading.
_SKOPS_ALLOWED = frozenset(
    {
        "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
        "sklearn.ensemble._hist_gradient_boosting.binning._BinMapper",
        "sklearn._loss.loss.HalfSquaredError",
        "sklearn._loss.link.IdentityLink",
        "sklearn._loss.link.Interval",
    }
)


def feature_row(features: Mapping[str, Any], names: tuple[str, ...] = MODEL_FEATURES) -> list[float]:
    """The model's feature vector from a features dict.

    ``uncached_tokens`` may be omitted when ``total_tokens`` and ``cached_tokens`` are
    given (it is their difference). ``cached_tokens`` is required: a cold prompt has 0,
    a warm one the tokens its static prefix gets from the cache (the model rounds it
    down to whole cache blocks itself). ``tokens_ahead`` and ``batch_tokens`` default
    to 0: a request sent alone.

    Raises:
        KeyError: naming the missing feature.
    """
    values = {**OPTIONAL_INPUTS, **{k: v for k, v in features.items() if v is not None}}
    if "uncached_tokens" not in values and "total_tokens" in values and "cached_tokens" in values:
        values["uncached_tokens"] = values["total_tokens"] - values["cached_tokens"]
    missing = [name for name in names if name not in values]
    if missing:
        raise KeyError(
            f"features: missing {missing}; a TTFT prediction needs {list(names)} "
            "(uncached_tokens may be given as total_tokens and cached_tokens)"
        )
    return [float(values[name]) for name in names]


@dataclass
class TTFTModel:
    """A fitted estimator plus what it was fitted on and how well it predicts.

    Example:
        >>> model = load_ttft_model(Registry("artifacts/registry"), engine.identity)  # doctest: +SKIP
        >>> model.predict({"uncached_tokens": 400, "cached_tokens": 0, "fewshot_count": 2,
        ...                "semantic_density": 0.5, "entropy_bits": 9.1},
        ...               engine_identity=engine.identity)              # doctest: +SKIP
        612.4
    """

    estimator: Any
    kind: str
    """'monomial' (JSON) or 'hgb' (skops)."""
    name: str
    """The candidate's name in model selection, e.g. 'linear' or 'hgb'."""
    engine_identity: EngineIdentity
    metrics: dict[str, Any] = field(default_factory=dict)
    """Model-selection summary: chosen model, CV and held-out scores per candidate."""
    training: dict[str, Any] = field(default_factory=dict)
    """What the data covered: rows, prompts, feature ranges, profile file."""
    features: tuple[str, ...] | None = None
    """The inputs the estimator takes: ``MODEL_FEATURES`` for a mechanics pipeline
    (format 2), ``BASE_FEATURES`` for a bare regressor (format 1). None: inferred."""
    fitted_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    _blob: bytes | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.features is None:
            self.features = MODEL_FEATURES if isinstance(self.estimator, Pipeline) else BASE_FEATURES

    @classmethod
    def from_fit(cls, fit: Any, df: pd.DataFrame, *, sources: Iterable[str] = ()) -> "TTFTModel":
        """Wrap a ``fit_models`` result, stamped with the identity of the rows it was fitted on."""
        rows = df  # every profiled row: ranges and the cache block describe what was measured
        mechanics = _mechanics_params(fit.estimator)
        training = {
            "rows": fit.rows,
            "cache_block_tokens": mechanics.get("block_tokens"),
            "prefill_chunk_tokens": mechanics.get("chunk_tokens"),
            "runs": sorted(str(r) for r in rows["run_id"].unique()) if "run_id" in rows else [],
            "sources": list(sources),
            "ranges": {
                name: [float(rows[name].min()), float(rows[name].max())] for name in MODEL_FEATURES if name in rows
            },
        }
        return cls(
            estimator=fit.estimator,
            kind="monomial" if isinstance(_regressor(fit.estimator), MonomialRegressor) else "hgb",
            name=fit.chosen,
            engine_identity=identity_of(rows),
            metrics=fit.summary(),
            training=training,
        )

    @property
    def mechanics(self) -> dict[str, int | None]:
        """The cache block and prefill chunk sizes the model derives its features with."""
        return _mechanics_params(self.estimator)

    @property
    def relative_error(self) -> float:
        """The held-out mean absolute percentage error of the chosen model (0.1 is 10%).

        Two predictions closer than this share of the larger one are not told apart.
        """
        heldout = (self.metrics.get("heldout") or {}).get(self.name) or {}
        return float(heldout.get("mape", 0.1))

    # -- prediction -----------------------------------------------------------------

    def check_engine(self, engine_identity: EngineIdentity | None, *, allow_other_engine: bool = False) -> None:
        """Raise ModelIdentityError (or warn) when ``engine_identity`` is not the fitted one."""
        if engine_identity is None or engine_identity.key() == self.engine_identity.key():
            return
        mine, theirs = self.engine_identity.to_dict(), engine_identity.to_dict()
        diff = ", ".join(f"{k}: fitted on {mine[k]!r}, asked for {theirs[k]!r}" for k in mine if mine[k] != theirs[k])
        message = (
            f"TTFT model {self.version} was fitted on engine {self.engine_identity.key()} and is asked to "
            f"predict for engine {engine_identity.key()} ({diff}); profile and fit on this engine "
            "(`promptdistill ttft profile` then `promptdistill ttft fit`)"
        )
        if not allow_other_engine:
            raise ModelIdentityError(message)
        warnings.warn(f"PREDICTING FOR ANOTHER ENGINE: {message}", UserWarning, stacklevel=3)

    def predict(
        self,
        features: Mapping[str, Any],
        *,
        engine_identity: EngineIdentity | None = None,
        allow_other_engine: bool = False,
    ) -> float:
        """Predicted TTFT in milliseconds for one prompt's features.

        Pass the engine you predict for as ``engine_identity``: a model fitted on another
        engine then raises ``ModelIdentityError`` (or warns, with ``allow_other_engine``).
        """
        return float(
            self.predict_many([features], engine_identity=engine_identity, allow_other_engine=allow_other_engine)[0]
        )

    def predict_many(
        self,
        features: Iterable[Mapping[str, Any]],
        *,
        engine_identity: EngineIdentity | None = None,
        allow_other_engine: bool = False,
    ) -> np.ndarray:
        """Predicted TTFT in milliseconds for each features dict."""
        self.check_engine(engine_identity, allow_other_engine=allow_other_engine)
        rows = [feature_row(f, self.features) for f in features]
        if not rows:
            return np.zeros(0)
        with threadpool_limits(1):  # tiny inputs: threads only add contention
            return np.asarray(self.estimator.predict(np.asarray(rows)), dtype=np.float64)

    # -- persistence ------------------------------------------------------------------

    @property
    def version(self) -> str:
        """A content id: fitted time plus a hash of the fitted state."""
        digest = hashlib.sha256(canonical_json(self._state()).encode()).hexdigest()[:10]
        stamp = self.fitted_at.replace("-", "").replace(":", "").replace("+0000", "Z").replace("+00:00", "Z")
        return f"{stamp}-{digest}"

    def _state(self) -> dict[str, Any]:
        if self.kind == "monomial":
            state = _regressor(self.estimator).get_state()
        else:
            state = {"skops_sha256": hashlib.sha256(self._skops_bytes()).hexdigest()}
        if isinstance(self.estimator, Pipeline):
            state = {"mechanics": self.mechanics, "regressor": state}
        return state

    def _skops_bytes(self) -> bytes:
        # skops archives carry timestamps: dump once so the hash and version stay stable.
        # Only the tree ensemble goes to skops; the mechanics step is two integers in the JSON.
        if self._blob is None:
            self._blob = sio.dumps(_regressor(self.estimator))
        return self._blob

    def to_files(self) -> dict[str, bytes]:
        """The artifact as ``{filename: bytes}``: model.json (+ estimator.skops)."""
        files: dict[str, bytes] = {}
        meta: dict[str, Any] = {
            "format": FORMAT,
            "format_version": 2 if isinstance(self.estimator, Pipeline) else 1,
            "name": self.name,
            "kind": self.kind,
            "features": list(self.features),
            "engine_identity": self.engine_identity.to_dict(),
            "engine_key": self.engine_identity.key(),
            "fitted_at": self.fitted_at,
            "metrics": self.metrics,
            "training": self.training,
        }
        if self.kind == "monomial":
            meta["estimator"] = _regressor(self.estimator).get_state()
        elif self.kind == "hgb":
            blob = self._skops_bytes()
            files[_SKOPS] = blob
            meta["estimator"] = {"file": _SKOPS, "sha256": hashlib.sha256(blob).hexdigest()}
        else:
            raise ValueError(f"unknown model kind {self.kind!r}")
        if isinstance(self.estimator, Pipeline):
            meta["mechanics"] = self.mechanics
        meta["version"] = self.version
        files[_JSON] = (json.dumps(json_safe(meta), indent=2, sort_keys=True) + "\n").encode()
        return files

    @classmethod
    def from_files(cls, files: Mapping[str, bytes], *, source: str = "artifact") -> "TTFTModel":
        """Rebuild a model from ``to_files()`` output.

        Raises:
            IntegrityError: a file is missing, malformed, of another format, or its hash
                does not match, or the skops file holds a type outside the allowlist.
        """
        if _JSON not in files:
            raise IntegrityError(f"{source}: no {_JSON} in the TTFT model artifact")
        try:
            meta = json.loads(files[_JSON])
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise IntegrityError(f"{source}/{_JSON}: not valid JSON: {e}") from None
        version = meta.get("format_version")
        if meta.get("format") != FORMAT or version not in _FEATURES_OF_VERSION:
            raise IntegrityError(
                f"{source}/{_JSON}: format is {meta.get('format')!r} v{version!r}, "
                f"expected {FORMAT!r} v{'/'.join(str(v) for v in _FEATURES_OF_VERSION)}"
            )
        features = _FEATURES_OF_VERSION[version]
        if tuple(meta["features"]) != features:
            raise IntegrityError(f"{source}/{_JSON}: features {meta['features']} differ from {list(features)}")
        kind = meta["kind"]
        blob = None
        if kind == "monomial":
            try:
                estimator = MonomialRegressor.from_state(meta["estimator"])
            except (KeyError, TypeError, ValueError) as e:
                raise IntegrityError(f"{source}/{_JSON}: estimator: {e}") from None
        elif kind == "hgb":
            estimator, blob = _load_skops(files, meta["estimator"], source)
        else:
            raise IntegrityError(f"{source}/{_JSON}: kind: unknown model kind {kind!r}")
        if version >= 2:
            try:
                mechanics = meta["mechanics"]
                estimator = with_mechanics(estimator, block_tokens=mechanics["block_tokens"],
                                           chunk_tokens=mechanics["chunk_tokens"])
                estimator.steps[0][1].fit(np.zeros((1, len(MODEL_FEATURES))))  # stateless: fitting checks the sizes
            except (KeyError, TypeError, ValueError) as e:
                raise IntegrityError(f"{source}/{_JSON}: mechanics: {e}") from None
        # The stored regressor must take what the current code hands it: a model fitted
        # while its inputs were different would fail (or mislead) at the first prediction.
        inputs = DERIVED_FEATURES if version >= 2 else features
        width = getattr(_regressor(estimator), "n_features_in_", len(inputs))
        if width != len(inputs):
            raise IntegrityError(
                f"{source}/{_JSON}: estimator: the {kind} regressor takes {width} inputs, this promptdistill "
                f"hands it {len(inputs)} ({', '.join(inputs)}): it was "
                "fitted by another version; refit it (`promptdistill ttft fit`)"
            )
        model = cls(
            estimator=estimator,
            kind=kind,
            name=meta["name"],
            engine_identity=EngineIdentity.from_dict(meta["engine_identity"]),
            metrics=meta.get("metrics", {}),
            training=meta.get("training", {}),
            fitted_at=meta["fitted_at"],
            features=features,
            _blob=blob,
        )
        if model.engine_identity.key() != meta.get("engine_key"):
            raise IntegrityError(f"{source}/{_JSON}: engine_key does not match engine_identity")
        if model.version != meta.get("version"):
            raise IntegrityError(f"{source}/{_JSON}: version {meta.get('version')!r} does not match its content")
        return model


def _regressor(estimator: Any) -> Any:
    """The regressor of a model: the last step of a mechanics pipeline, or the estimator."""
    return estimator.steps[-1][1] if isinstance(estimator, Pipeline) else estimator


def _mechanics_params(estimator: Any) -> dict[str, int | None]:
    if not isinstance(estimator, Pipeline):
        return {}
    step = estimator.steps[0][1]
    return {"block_tokens": step.block_tokens, "chunk_tokens": step.chunk_tokens}


def _load_skops(files: Mapping[str, bytes], ref: Mapping[str, Any], source: str) -> tuple[Any, bytes]:
    name = ref.get("file", _SKOPS)
    if name not in files:
        raise IntegrityError(f"{source}: {name} is missing")
    blob = files[name]
    if hashlib.sha256(blob).hexdigest() != ref.get("sha256"):
        raise IntegrityError(f"{source}/{name}: sha256 does not match the one recorded in {_JSON}")
    untrusted = sio.get_untrusted_types(data=blob)
    refused = sorted(set(untrusted) - _SKOPS_ALLOWED)
    if refused:
        raise IntegrityError(f"{source}/{name}: refusing to load types outside the allowlist: {refused}")
    return sio.load(io.BytesIO(blob), trusted=list(untrusted)), blob

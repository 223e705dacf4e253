"""Load TTFT models in the registry: ``load-ttft-model/<serving key>``, JSON only.

A load model describes a served model on a machine, whichever client measures it: its
key is the engine identity without the backend and version (an in-process search and
the vLLM server that serves the same model, dtype, hardware and KV block size share it).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from promptdistill.core.errors import TemplateNotFoundError
from promptdistill.core.jsonio import canonical_json, json_safe
from promptdistill.load.model import LoadTTFTModel

__all__ = ["LOAD_ARTIFACT_KIND", "load_load_model", "publish_load_model", "serving_key"]

LOAD_ARTIFACT_KIND = "load-ttft-model"


def serving_key(identity: Any, model_name: str | None = None) -> str:
    """The served weights (``model_name``: the model folder's name, which an in-process
    engine's identity carries and a server's served name hides), dtype, context, hardware
    and block size, hashed."""
    values = {k: getattr(identity, k) for k in ("dtype", "max_model_len", "hardware", "block_size")}
    values["model"] = model_name or identity.model
    return hashlib.sha256(canonical_json(values).encode()).hexdigest()[:16]


def publish_load_model(registry: Any, model: LoadTTFTModel, identity: Any, *, model_name: str | None = None,
                       metadata: Mapping[str, Any] | None = None) -> Any:
    """Store ``model`` (fitted on the engine ``identity``) as the next version of its key."""
    files = {"model.json": canonical_json(model.to_dict()).encode()}
    meta = {"engine_identity": identity.to_dict(), "model_name": model_name or identity.model, **dict(metadata or {})}
    return registry.put_artifact(LOAD_ARTIFACT_KIND, serving_key(identity, model_name), files,
                                 metadata=json_safe(meta), labels=["current"])


def load_load_model(registry: Any, identity: Any, model_name: str | None = None) -> tuple[LoadTTFTModel, dict[str, Any]]:
    """The newest load model for this engine's serving key, and its metadata.

    Raises:
        TemplateNotFoundError: none was fitted for it (the message says how to fit one).
    """
    key = serving_key(identity, model_name)
    try:
        record = registry.get_artifact(LOAD_ARTIFACT_KIND, key)
    except TemplateNotFoundError:
        raise TemplateNotFoundError(
            f"{registry.root}: no load TTFT model for {identity.model} ({identity.dtype}, {identity.hardware}); "
            "fit one with `python -m bench.bench_load --profile-only` (a spec that declares slo.load needs it)"
        ) from None
    data = json.loads(registry.read_artifact_files(record)["model.json"])
    return LoadTTFTModel.from_dict(data), dict(record.metadata)

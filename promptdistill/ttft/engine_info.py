"""What the profiler records about the engine besides its identity: the mechanics the
TTFT models derive features from, and the model's arithmetic for the hardware report.

* ``engine_mechanics``: the prefix cache's block size and the most prompt tokens one
  engine step prefills (vLLM's ``max_num_batched_tokens``, the chunked-prefill chunk).
  In-process they are read from the running vLLM config; from a server, from its
  ``/server_info`` (served in dev mode, which ``VLLMServer`` turns on) or else the
  block size from its Prometheus ``vllm:cache_config_info``.
* ``engine_model_flops``: ``ModelFlops`` of the served model's ``config.json``.

Every value is None when it cannot be found; the fit then falls back (see
``fit.mechanics_of``) and the report says the figure is unknown.
"""

from __future__ import annotations

from typing import Any

import httpx

from promptdistill.core.errors import PromptDistillError
from promptdistill.engine import resolve_model
from promptdistill.ttft.hardware import ModelFlops

__all__ = ["engine_mechanics", "engine_model_flops", "mechanics_columns"]


def _unwrap(engine: Any, attr: str) -> Any:
    """The first engine in a wrapper chain (``EngineWrapper.engine``) that has ``attr``."""
    for _ in range(8):
        if engine is None or hasattr(engine, attr):
            return engine
        engine = getattr(engine, "engine", None)
    return None


def engine_mechanics(engine: Any) -> dict[str, Any]:
    """``{"block_tokens", "chunk_tokens", "source"}`` of a local or server vLLM engine."""
    local = _unwrap(engine, "_llm")
    if local is not None:
        try:
            config = local._llm.llm_engine.vllm_config
            return {"block_tokens": int(config.cache_config.block_size),
                    "chunk_tokens": _chunk(config.scheduler_config.max_num_batched_tokens,
                                           getattr(config.scheduler_config, "enable_chunked_prefill", True)),
                    "source": "vllm config (in-process)"}
        except AttributeError:
            pass
    server = _unwrap(engine, "urls")
    if server is not None and server.urls:
        return _server_mechanics(server.urls[0])
    return {"block_tokens": None, "chunk_tokens": None, "source": "unknown"}


def _chunk(max_batched: Any, chunked: Any) -> int | None:
    # Without chunked prefill a prompt is never split: no chunk limit applies to it.
    return int(max_batched) if max_batched and chunked is not False else None


def _server_mechanics(url: str) -> dict[str, Any]:
    root = url[: -len("/v1")] if url.endswith("/v1") else url
    try:
        r = httpx.get(f"{root}/server_info", params={"config_format": "json"}, timeout=60)
        r.raise_for_status()
        config = r.json()["vllm_config"]
        scheduler = config["scheduler_config"]
        return {"block_tokens": int(config["cache_config"]["block_size"]),
                "chunk_tokens": _chunk(scheduler.get("max_num_batched_tokens"), scheduler.get("enable_chunked_prefill")),
                "source": "server /server_info"}
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        pass
    try:  # the block size alone, from the metrics every server exposes
        r = httpx.get(f"{root}/metrics", timeout=10)
        for line in r.text.splitlines():
            if line.startswith("vllm:cache_config_info{") and 'block_size="' in line:
                block = int(line.split('block_size="', 1)[1].split('"', 1)[0])
                return {"block_tokens": block, "chunk_tokens": None, "source": "server /metrics"}
    except (httpx.HTTPError, ValueError):
        pass
    return {"block_tokens": None, "chunk_tokens": None, "source": "unknown"}


def mechanics_columns(mechanics: dict[str, Any]) -> dict[str, Any]:
    """The mechanics as profile-row columns (read back by ``fit.mechanics_of``)."""
    return {"cache_block_tokens": mechanics.get("block_tokens"), "prefill_chunk_tokens": mechanics.get("chunk_tokens")}


def engine_model_flops(engine: Any) -> ModelFlops | None:
    """The served model's ``ModelFlops`` (from its folder's ``config.json``), or None."""
    configured = _unwrap(engine, "config")
    path = getattr(_unwrap(engine, "model_path"), "model_path", None)
    try:
        if path is None and configured is not None:
            path = resolve_model(configured.config.model)
        return ModelFlops.from_folder(path) if path else None
    except (PromptDistillError, OSError, KeyError, ValueError):
        return None

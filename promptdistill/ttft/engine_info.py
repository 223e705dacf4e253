"""What the profiler records about the engine besides its identity: the mechanics the
TTFT models derive features from, and the model's arithmetic for the hardware report.

* ``engine_block_size``: the prefix cache's block size, the one answer the TTFT
  profiles, the TTFT model and the optimizer's warm predictions all use. It is part of
  the engine's identity, read when the engine starts: in-process from the running vLLM
  config; from a server, from its Prometheus ``vllm:cache_config_info`` (``/metrics``)
  or its ``/server_info``; else the configured ``engine.block_size``.
* ``engine_mechanics``: that block size and the most prompt tokens one engine step
  prefills (vLLM's ``max_num_batched_tokens``, the chunked-prefill chunk): in-process
  from the running vLLM config, from a server from its ``/server_info`` (served in dev
  mode, which ``VLLMServer`` turns on).
* ``engine_model_flops``: ``ModelFlops`` of the served model's ``config.json``.

Every value is None when it cannot be found; the fit then falls back (see
``fit.mechanics_of``) and the report says the figure is unknown.
"""

from __future__ import annotations

from typing import Any

import httpx

from promptdistill.core.errors import PromptDistillError
from promptdistill.engine import resolve_model
from promptdistill.engine.base import unwrap_engine
from promptdistill.engine.server import served_block_size
from promptdistill.ttft.hardware import ModelFlops

__all__ = ["engine_block_size", "engine_mechanics", "engine_model_flops", "mechanics_columns"]


def engine_block_size(engine: Any) -> int | None:
    """The KV cache block size (tokens) of the engine behind ``engine``, or None.

    Wrappers forward their engine's identity, which carries the size the engine reported
    when it started (see the module docstring). A server engine made without its start-up
    check knows only the configured size: its servers are asked here instead.

    Example:
        >>> engine_block_size(engine)   # doctest: +SKIP
        128
    """
    identity = getattr(engine, "identity", None)
    size = getattr(identity, "block_size", None)
    if size is not None:
        return int(size)
    server = unwrap_engine(engine, "urls")
    if server is not None and server.urls:
        return served_block_size(server.urls[0])
    return None


def engine_mechanics(engine: Any) -> dict[str, Any]:
    """``{"block_tokens", "chunk_tokens", "source"}`` of a local or server vLLM engine."""
    block = engine_block_size(engine)
    local = unwrap_engine(engine, "_llm")
    if local is not None:
        try:
            config = local._llm.llm_engine.vllm_config
            return {"block_tokens": block if block is not None else int(config.cache_config.block_size),
                    "chunk_tokens": _chunk(config.scheduler_config.max_num_batched_tokens,
                                           getattr(config.scheduler_config, "enable_chunked_prefill", True)),
                    "source": "vllm config (in-process)"}
        except AttributeError:
            pass
    server = unwrap_engine(engine, "urls")
    if server is not None and server.urls:
        chunk = _server_chunk(server.urls[0])
        source = "server /server_info" if chunk is not None else "server /metrics" if block else "unknown"
        return {"block_tokens": block, "chunk_tokens": chunk, "source": source}
    return {"block_tokens": block, "chunk_tokens": None, "source": "engine identity" if block else "unknown"}


def _chunk(max_batched: Any, chunked: Any) -> int | None:
    # Without chunked prefill a prompt is never split: no chunk limit applies to it.
    return int(max_batched) if max_batched and chunked is not False else None


def _server_chunk(url: str) -> int | None:
    root = url.rstrip("/").removesuffix("/v1")
    try:
        r = httpx.get(f"{root}/server_info", params={"config_format": "json"}, timeout=60)
        r.raise_for_status()
        scheduler = r.json()["vllm_config"]["scheduler_config"]
        return _chunk(scheduler.get("max_num_batched_tokens"), scheduler.get("enable_chunked_prefill"))
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None


def mechanics_columns(mechanics: dict[str, Any]) -> dict[str, Any]:
    """The mechanics as profile-row columns (read back by ``fit.mechanics_of``)."""
    return {"cache_block_tokens": mechanics.get("block_tokens"), "prefill_chunk_tokens": mechanics.get("chunk_tokens")}


def engine_model_flops(engine: Any) -> ModelFlops | None:
    """The served model's ``ModelFlops`` (from its folder's ``config.json``), or None."""
    configured = unwrap_engine(engine, "config")
    path = getattr(unwrap_engine(engine, "model_path"), "model_path", None)
    try:
        if path is None and configured is not None:
            path = resolve_model(configured.config.model)
        return ModelFlops.from_folder(path) if path else None
    except (PromptDistillError, OSError, KeyError, ValueError):
        return None

"""The engine a pipeline run shares between its tasks, and the limit that guards it.

The in-process vLLM engine is big (1-2 GB) and not thread-safe: one per process, used by
one task at a time. Tasks ask :func:`shared_engine` for it rather than receiving it, so
Prefect never hashes or serializes it and a distributed task runner (each worker its own
process) gets one engine per worker. A flow run wraps its body in :func:`engine_session`:
the engine is created once for the run and closed at its end, unless the process already
had one (tests hand in their session engine with :func:`adopt_engine`).
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Iterator

from promptdistill.core.config import EngineConfig, Settings
from promptdistill.engine import load_engine, resolve_model
from promptdistill.engine.base import Engine, EngineIdentity

__all__ = ["adopt_engine", "engine_limit", "engine_session", "forget_engine", "open_engines", "shared_engine"]

_POOL: dict[EngineConfig, Engine] = {}
_POOL_LOCK = threading.Lock()


def _pool_key(config: EngineConfig) -> EngineConfig:
    if config.backend == "local":
        return replace(config, model=resolve_model(config.model))
    return config


def adopt_engine(engine: Engine, config: EngineConfig) -> None:
    """Make an already running engine the one this process uses for ``config``.

    Flows then reuse it and never close it (tests hand in their session engine).
    """
    with _POOL_LOCK:
        _POOL[_pool_key(config)] = engine


def shared_engine(config: EngineConfig) -> Engine:
    """The process's engine for ``config``, created on first use.

    The in-process vLLM engine is big and not thread-safe: one per process, used by one
    task at a time. Tasks call this instead of receiving the engine, so a distributed
    task runner (each worker its own process) gets one engine per worker.
    """
    key = _pool_key(config)
    with _POOL_LOCK:
        engine = _POOL.get(key)
        if engine is None:
            engine = _POOL[key] = load_engine(config)
        return engine


@contextmanager
def engine_session(config: EngineConfig) -> Iterator[Engine]:
    """The engine for one flow run: reused if the process has one, else created here and
    closed when the run ends."""
    key = _pool_key(config)
    with _POOL_LOCK:
        existing = _POOL.get(key)
    if existing is not None:
        yield existing
        return
    engine = shared_engine(config)
    try:
        yield engine
    finally:
        with _POOL_LOCK:
            if _POOL.get(key) is engine:
                del _POOL[key]
        engine.close()


@contextmanager
def open_engines(settings: Settings) -> Iterator[tuple[Engine, Engine | None]]:
    """The task engine and, when the config has a ``[judge]`` section, the judge engine:
    both opened for a command and closed at its end (the CLI's counterpart of a flow run)."""
    with ExitStack() as stack:
        engine = stack.enter_context(load_engine(settings.engine))
        judge = stack.enter_context(load_engine(settings.judge)) if settings.judge is not None else None
        yield engine, judge


def engine_limit(config: EngineConfig, identity: EngineIdentity) -> tuple[str, int]:
    """The global concurrency limit guarding an engine: (name, slots).

    One slot for an in-process engine (one optimization at a time per machine and model,
    across flow runs); one per endpoint for the server backend, named after the set of
    endpoints: a config that adds an endpoint gets a limit with one more slot (an existing
    limit's size is left as its operator set it).
    """
    if config.backend == "local":
        # The engine lives in this machine's memory: the limit is per host.
        host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-") or "host"
        return f"promptdistill-engine-{identity.key()}-{host}", 1
    urls = sorted({u.rstrip("/") for u in config.server_urls})
    endpoints = hashlib.sha256("\n".join(urls).encode()).hexdigest()[:8]
    return f"promptdistill-engine-{identity.key()}-{len(urls)}ep-{endpoints}", max(1, len(urls))


def forget_engine(config: EngineConfig) -> Engine | None:
    """Stop sharing the engine for ``config`` without closing it (its owner closes it)."""
    with _POOL_LOCK:
        return _POOL.pop(_pool_key(config), None)

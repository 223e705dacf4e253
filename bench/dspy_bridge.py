"""A DSPy bridge for the peers benchmark: ``dspy.LM`` calls routed to a promptdistill
``Engine``, in batches (MIPROv2 and GEPA run on the same engine as ours; the product never
imports DSPy).

DSPy evaluates and optimizes with a thread pool, one LM call per thread. Sent one at a
time, a local vLLM would run them serially; the ``BatchingEngine`` here gathers calls
that arrive within a short window into one ``Engine.generate`` batch, which vLLM's
scheduler runs together. It is also the only thread that touches the engine, so an
in-process vLLM (not thread-safe) is safe to use from DSPy's threads.

DSPy's cache key ignores ``api_base``: the LM's model name carries the engine identity
(``promptdistill/<model>@<identity key>``), so answers from one engine are never served
for another. The cache directory lives in the project's state folder.

Example:
    >>> lm = make_dspy_lm(engine, cache_dir=".promptdistill/dspy_cache")   # doctest: +SKIP
    >>> dspy.configure(lm=lm)                                             # doctest: +SKIP
"""

from __future__ import annotations

import json
import queue
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from promptdistill.engine.base import Engine, GenerationRequest, GenerationResult

__all__ = ["BatchingEngine", "make_dspy_lm"]


class BatchingEngine:
    """A DSPy custom engine (``complete(Request) -> Response``) over a promptdistill Engine.

    Args:
        engine: the engine every call goes to.
        max_batch: most calls gathered into one batch.
        window_s: how long the collector waits for more calls after the first.
        default_max_tokens: used when DSPy sends none.

    Attributes:
        batches: the size of every batch sent to the engine (requests DSPy's own cache
            answered never get here). Tokens are the engine's to count: wrap it in a
            ``CallMeter``.
    """

    # Capability hints DSPy reads from a custom engine: JSONAdapter then sends a
    # json_schema response_format, which the engine enforces with constrained decoding.
    supports_response_schema = True
    supports_function_calling = False
    supports_reasoning = False
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "stop", "seed"})

    def __init__(self, engine: Engine, *, max_batch: int = 32, window_s: float = 0.02, default_max_tokens: int = 256):
        self.engine = engine
        self.max_batch = max_batch
        self.window_s = window_s
        self.default_max_tokens = default_max_tokens
        self.batches: list[int] = []
        self._queue: queue.Queue[tuple[GenerationRequest, Future[GenerationResult]] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._collect, name="promptdistill-dspy-batcher", daemon=True)
        self._worker.start()

    # -- the batching loop -----------------------------------------------------------
    def _collect(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get(timeout=self.window_s)
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            self.batches.append(len(batch))
            try:
                results = self.engine.generate([req for req, _ in batch])
            except Exception as e:  # noqa: BLE001 - handed to every waiting caller
                for _, fut in batch:
                    fut.set_exception(e)
                continue
            for (_, fut), result in zip(batch, results):
                fut.set_result(result)

    def submit(self, request: GenerationRequest) -> GenerationResult:
        """Queue one request and wait for its result (called from DSPy's threads)."""
        fut: Future[GenerationResult] = Future()
        self._queue.put((request, fut))
        return fut.result()

    # -- DSPy's engine protocol -------------------------------------------------------
    def complete(self, request: Any) -> Any:
        from dspy.clients.engines.base import validate_request
        from dspy.lm15 import Message, Response, TextPart, Usage

        validate_request(request)
        result = self.submit(self.to_generation_request(request))
        finish = result.finish_reason if result.finish_reason in ("stop", "length") else "stop"
        return Response(
            id=None,
            model=self.engine.identity.model,
            message=Message.assistant([TextPart(result.text)]),
            finish_reason=finish,
            usage=Usage(
                input_tokens=result.prompt_tokens,
                output_tokens=result.completion_tokens,
                total_tokens=result.prompt_tokens + result.completion_tokens,
            ),
        )

    def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def to_generation_request(self, request: Any) -> GenerationRequest:
        """Translate a DSPy (lm15) Request into a promptdistill GenerationRequest."""
        messages = []
        if request.system is not None:
            system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
            messages.append({"role": "system", "content": system})
        for m in request.messages:
            role = m.role if m.role in ("system", "user", "assistant") else "user"
            messages.append({"role": role, "content": m.text or ""})
        cfg = request.config
        schema = None
        rf = cfg.response_format
        if isinstance(rf, type) and hasattr(rf, "model_json_schema"):  # a pydantic model
            schema = rf.model_json_schema()
        elif isinstance(rf, dict) and rf.get("type") == "json_schema":
            # lm15 flattens the schema to the top level; OpenAI nests it under json_schema.
            schema = rf.get("schema") or (rf.get("json_schema") or {}).get("schema")
        return GenerationRequest(
            messages=messages,
            temperature=0.0 if cfg.temperature is None else float(cfg.temperature),
            max_tokens=int(cfg.max_tokens or self.default_max_tokens),
            seed=0 if cfg.seed is None else int(cfg.seed),
            stop=tuple(cfg.stop or ()),
            json_schema=json.dumps(schema) if schema else None,
        )

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=5)


def make_dspy_lm(
    engine: Engine,
    *,
    cache_dir: str | Path | None = ".promptdistill/dspy_cache",
    temperature: float = 0.0,
    max_tokens: int = 256,
    **batching: Any,
) -> Any:
    """A ``dspy.LM`` whose calls run on ``engine`` in batches.

    Args:
        cache_dir: DSPy's disk cache folder (None turns DSPy's cache off).
    """
    import dspy

    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(cache_dir))
    bridge = BatchingEngine(engine, default_max_tokens=max_tokens, **batching)
    name = f"promptdistill/{engine.identity.model}@{engine.identity.key()}"
    lm = dspy.LM(
        name,
        engine=bridge,
        cache=cache_dir is not None,
        temperature=temperature,
        max_tokens=max_tokens,
        num_retries=0,
    )
    lm.bridge = bridge  # type: ignore[attr-defined]
    return lm

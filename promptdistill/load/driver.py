"""Send a template's requests to a vLLM OpenAI server at a load, as a service would.

The requests are what a service sends: the published template's chat body
(``client.Template.request_body``: system and user messages, ``max_tokens``, the JSON
Schema response format), streamed. The load is open loop (Poisson arrivals at a rate:
a request never waits for another's reply) or closed loop (a fixed number in flight).

What is reused from vLLM's own benchmark client (``vllm bench serve``, shipped with
vllm): its Poisson arrival generator (``vllm.benchmarks.serve.get_request``) and its
streamed chat request with timings (``async_request_openai_chat_completions``; TTFT is
the first streamed chunk, as ``vllm bench serve`` reports it). ``vllm bench serve`` itself
does not fit: its datasets carry one prompt string per request, so it cannot send a
template's system message, each request's own response format, or two templates
interleaved in one run. The library pieces take pre-built chat messages and a
per-request body, so they do.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from promptdistill.core.errors import ConfigError, EngineUnavailableError
from promptdistill.specs.model import Load

__all__ = ["LoadRequest", "Outcome", "chat_requests", "run_block"]


@dataclass(frozen=True)
class LoadRequest:
    """One request of a load run: which template and record it renders, and its body."""

    template: str
    record_id: str
    body: Mapping[str, Any]
    """The OpenAI chat body (model, messages, max_tokens, response_format, sampling)."""


@dataclass(frozen=True)
class Outcome:
    """What one request measured. Times in ms; ``sent_s`` from the block's start."""

    template: str
    record_id: str
    sent_s: float
    ttft_ms: float | None
    e2e_ms: float | None
    prompt_tokens: int
    completion_tokens: int
    ok: bool
    error: str = ""


def chat_requests(label: str, content: Mapping[str, Any], records: Sequence[Mapping[str, Any]], *,
                  model: str) -> list[LoadRequest]:
    """The chat bodies a service using the client sends for ``records`` with this template
    content (published or not): ``Template.request_body``, the client's own path."""
    from promptdistill.client import Template
    from promptdistill.registry.hashing import content_hash
    from promptdistill.registry.records import VersionRecord

    template = Template(VersionRecord(name=str(content.get("name", label)), version=0, parent=None, created_at="",
                                      actor="load", content=dict(content), provenance={}, metrics={},
                                      content_hash=content_hash(dict(content))))
    return [LoadRequest(label, str(r["id"]), template.request_body(r["inputs"], model=model)) for r in records]


def run_block(url: str, requests: Sequence[LoadRequest], load: Load, *, seed: int,
              timeout_s: float = 300.0) -> list[Outcome]:
    """Send ``requests`` to the server at ``url`` (``.../v1``) at ``load``; wait for every reply.

    Open loop: arrivals are a Poisson process at ``load.rate_rps`` (vLLM's generator,
    seeded), whatever the replies do. Closed loop: ``load.concurrency`` requests in flight.
    A request that fails (HTTP error, timeout, no first token) is an ``Outcome`` with
    ``ok`` False and the reason; the block never raises for one request.

    Raises:
        EngineUnavailableError: no request of the block succeeded and the first failure
            was a connection error (the server is down or refuses).
    """
    if not requests:
        return []
    if load.rate_rps is not None and not (load.rate_rps > 0 and math.isfinite(load.rate_rps)):
        raise ConfigError(f"load: rate_rps must be a positive number, got {load.rate_rps}")
    outcomes = asyncio.run(_run(url.rstrip("/"), list(requests), load, seed, timeout_s))
    if not any(o.ok for o in outcomes):
        first = outcomes[0].error.strip().splitlines()[-1] if outcomes[0].error else "no reply"
        raise EngineUnavailableError(f"{url}: none of {len(outcomes)} load requests succeeded ({first}); "
                                     "is the server up and serving this model?")
    return outcomes


async def _run(url: str, requests: list[LoadRequest], load: Load, seed: int, timeout_s: float) -> list[Outcome]:
    import aiohttp
    import numpy as np
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions
    from vllm.benchmarks.serve import get_request

    api_url = f"{url}/chat/completions"
    start = time.perf_counter()

    def func_input(req: LoadRequest) -> RequestFuncInput:
        body = dict(req.body)
        messages = body.pop("messages")
        model = body.pop("model")
        max_tokens = int(body.pop("max_tokens", 256))
        body.pop("stream", None)
        return RequestFuncInput(prompt="", api_url=api_url, prompt_len=0, output_len=max_tokens, model=model,
                                chat_messages=list(messages), extra_body=body)

    async def one(session: aiohttp.ClientSession, req: LoadRequest) -> Outcome:
        sent = time.perf_counter() - start
        out = await async_request_openai_chat_completions(func_input(req), session)
        ok = bool(out.success)
        return Outcome(template=req.template, record_id=req.record_id, sent_s=sent,
                       ttft_ms=out.ttft * 1000.0 if ok else None, e2e_ms=out.latency * 1000.0 if ok else None,
                       prompt_tokens=int(out.prompt_len or 0), completion_tokens=int(out.output_tokens or 0),
                       ok=ok, error="" if ok else (out.error or "failed")[-500:])

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0)  # the load, not the client, bounds what is in flight
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False) as session:
        if load.concurrency is not None:
            gate = asyncio.Semaphore(load.concurrency)

            async def gated(req: LoadRequest) -> Outcome:
                async with gate:
                    return await one(session, req)

            return list(await asyncio.gather(*(gated(r) for r in requests)))
        np.random.seed(seed)  # vLLM's generator draws its gaps from numpy's global state
        tasks = []
        async for req, _rate in get_request(requests, load.rate_rps):
            tasks.append(asyncio.create_task(one(session, req)))
        return list(await asyncio.gather(*tasks))

"""Server backend: one or more OpenAI-compatible vLLM servers, streamed and concurrent.

TTFT here is measured at the client: from just before the HTTP request is sent to the
arrival of the first streamed chunk that carries content (the first token's text), so it
includes the network and the server's HTTP handling, as a production service sees it.
End-to-end is until the stream's last chunk.

Structured output goes through ``response_format`` (json_schema) or vLLM's
``structured_outputs`` body field (choices). Never the removed ``guided_*`` keys: a
server ignores them silently and returns unconstrained text. Every reply is validated.

Requests are spread round-robin across the configured endpoints, with at most
``max_concurrency`` in flight per endpoint; transient failures (connection errors,
HTTP 5xx) are retried with exponential back-off.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
import warnings
from typing import Any, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from promptdistill.core.config import EngineConfig
from promptdistill.core.errors import EngineError, EngineTimeoutError, EngineUnavailableError, PromptTooLongError
from promptdistill.engine.base import (
    Engine,
    EngineIdentity,
    GenerationRequest,
    GenerationResult,
    Message,
    check_reply,
    hardware_fingerprint,
)

__all__ = ["ServerEngine", "block_size_from_metrics", "request_body", "served_block_size"]

_RETRIES = 2
_BACKOFF_S = 0.5


def request_body(req: GenerationRequest, model: str, *, stream: bool = True) -> tuple[str, dict[str, Any]]:
    """The OpenAI-compatible path and JSON body for a request."""
    body: dict[str, Any] = {
        "model": model,
        "temperature": req.temperature,
        "max_tokens": req.max_tokens,
        "stream": stream,
    }
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stop:
        body["stop"] = list(req.stop)
    if stream:
        body["stream_options"] = {"include_usage": True}
    if req.json_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": req.schema, "strict": True},
        }
    elif req.choices is not None:
        body["structured_outputs"] = {"choice": list(req.choices)}
    if req.messages is not None:
        body["messages"] = req.chat()
        return "/chat/completions", body
    body["prompt"] = req.prompt
    return "/completions", body


def block_size_from_metrics(text: str) -> int | None:
    """The KV cache block size in a vLLM server's Prometheus ``/metrics`` text, or None.

    vLLM publishes its cache config as an info gauge, one sample per engine core:
    ``vllm:cache_config_info{block_size="128",...,engine="0"} 1.0``. Several cores of one
    server share the config; samples that disagree give None rather than a guess.

    Example:
        >>> block_size_from_metrics('vllm:cache_config_info{block_size="128",engine="0"} 1.0')
        128
    """
    sizes = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:cache_config_info" and "block_size" in sample.labels:
                    sizes.add(int(sample.labels["block_size"]))
    except ValueError:  # not Prometheus text, or a block_size that is not a number
        return None
    return sizes.pop() if len(sizes) == 1 else None


def served_block_size(url: str, *, timeout_s: float = 10.0) -> int | None:
    """The block size the vLLM server at ``url`` (``.../v1`` or its root) runs with: from
    its ``/metrics`` (every server), else its ``/server_info`` (dev mode); None when
    neither says."""
    root = url.rstrip("/").removesuffix("/v1")
    try:
        r = httpx.get(f"{root}/metrics", timeout=timeout_s)
        if r.status_code == 200:
            size = block_size_from_metrics(r.text)
            if size is not None:
                return size
    except httpx.HTTPError:
        pass
    try:
        r = httpx.get(f"{root}/server_info", params={"config_format": "json"}, timeout=timeout_s)
        r.raise_for_status()
        return int(r.json()["vllm_config"]["cache_config"]["block_size"])
    except (httpx.HTTPError, KeyError, TypeError, ValueError):
        return None


class ServerEngine(Engine):
    """Talks to vLLM's OpenAI-compatible server(s) listed in ``config.server_urls``."""

    def __init__(self, config: EngineConfig, *, check: bool = True):
        self.config = config
        self.urls = [u.rstrip("/") for u in config.server_urls]
        self.model = config.served_model_name
        self._next_url = itertools.cycle(range(len(self.urls)))
        self._server_version = "unknown"
        block_size = config.block_size
        if check:
            self._check_ready()
            block_size = self._served_block_size()
        self.identity = EngineIdentity(
            model=self.model,
            backend="vllm-server",
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            hardware=hardware_fingerprint() if _is_loopback(self.urls[0]) else "remote",
            engine_version=f"vllm {self._server_version}",
            block_size=block_size,
        )

    def _served_block_size(self) -> int | None:
        """What the servers report (they must agree), else the configured size."""
        reported = {url: served_block_size(url) for url in self.urls}
        sizes = {size for size in reported.values() if size is not None}
        if len(sizes) > 1:
            raise EngineUnavailableError(
                f"engine.server_urls: the servers run with different KV cache block sizes ({reported}); "
                "one engine identity needs one size: start them with the same --block-size"
            )
        if not sizes:
            return self.config.block_size
        size = sizes.pop()
        if self.config.block_size is not None and size != self.config.block_size:
            warnings.warn(f"engine.block_size is {self.config.block_size} but the server runs with {size}-token "
                          f"blocks; using {size} (start the server with --block-size {self.config.block_size} "
                          "to have the configured size)", UserWarning, stacklevel=3)
        return size

    # -- plumbing -----------------------------------------------------------------------
    def _root(self, url: str) -> str:
        return url[: -len("/v1")] if url.endswith("/v1") else url

    def _check_ready(self) -> None:
        for url in self.urls:
            try:
                r = httpx.get(f"{url}/models", timeout=10)
                r.raise_for_status()
            except httpx.HTTPError as e:
                raise EngineUnavailableError(
                    f"engine.server_urls: no OpenAI-compatible server answers at {url} ({e}); "
                    "start one with `promptdistill serve` or check the URL"
                ) from None
            names = [m.get("id") for m in r.json().get("data", [])]
            if self.model not in names:
                raise EngineUnavailableError(
                    f"engine.served_model_name: the server at {url} serves {names}, not {self.model!r}"
                )
            try:
                self._server_version = httpx.get(f"{self._root(url)}/version", timeout=5).json().get("version", "unknown")
            except (httpx.HTTPError, ValueError):
                pass

    def _post(self, path: str, body: dict[str, Any], url: str | None = None) -> dict[str, Any]:
        url = url or self.urls[0]
        try:
            r = httpx.post(f"{self._root(url)}{path}", json=body, timeout=self.config.timeout_s)
        except httpx.HTTPError as e:
            raise EngineUnavailableError(f"{url}: {path} failed: {e}") from None
        if r.status_code >= 400:
            raise EngineError(f"{url}: {path} answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    # -- tokenization (the server's own tokenizer and chat template) --------------------
    def tokenize(self, text: str) -> list[int]:
        out = self._post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        return list(out["tokens"])

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        out = self._post(
            "/tokenize",
            {"model": self.model, "messages": [dict(m) for m in messages], "add_generation_prompt": True},
        )
        return self._post("/detokenize", {"model": self.model, "tokens": out["tokens"]})["prompt"]

    def count_tokens(self, messages: Sequence[Message] | str) -> int:
        """Counted by the server. Note: a vLLM server tokenizes the templated chat text in
        one go, so a role marker typed inside a value becomes a special token there (the
        in-process backend keeps it plain text); strip such markers from untrusted input
        before it reaches a server."""
        if isinstance(messages, str):
            return len(self.tokenize(messages))
        out = self._post(
            "/tokenize",
            {"model": self.model, "messages": [dict(m) for m in messages], "add_generation_prompt": True},
        )
        return int(out["count"])

    def _metric_totals(self, url: str, names: Sequence[str]) -> dict[str, float] | None:
        """Prometheus counters from one server's ``/metrics`` (summed over their labels);
        None when the endpoint does not answer."""
        try:
            r = httpx.get(f"{self._root(url)}/metrics", timeout=10)
            r.raise_for_status()
        except httpx.HTTPError:
            return None
        totals = dict.fromkeys(names, 0.0)
        for family in text_string_to_metric_families(r.text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
        return totals

    def prefix_cache_hit_rate(self) -> float | None:
        """The share of prompt tokens the servers' prefix caches served, from their
        Prometheus ``/metrics`` (``vllm:prefix_cache_hits`` over ``vllm:prefix_cache_queries``,
        summed over the endpoints, since each server started). None when no endpoint
        reports it or nothing was queried yet."""
        hits = queries = 0.0
        for url in self.urls:
            totals = self._metric_totals(url, ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))
            if totals is not None:
                hits += totals["vllm:prefix_cache_hits_total"]
                queries += totals["vllm:prefix_cache_queries_total"]
        return hits / queries if queries > 0 else None

    def endpoint_load(self) -> dict[str, dict[str, float] | None]:
        """Each endpoint's work since it started, as its server counts it (every client of
        the server included): finished requests, prompt and generated tokens. None for an
        endpoint that does not answer. Two snapshots' difference is a run's load."""
        names = {"requests": "vllm:request_success_total", "prompt_tokens": "vllm:prompt_tokens_total",
                 "generation_tokens": "vllm:generation_tokens_total"}
        load: dict[str, dict[str, float] | None] = {}
        for url in self.urls:
            totals = self._metric_totals(url, tuple(names.values()))
            load[url] = None if totals is None else {key: totals[name] for key, name in names.items()}
        return load

    def reset_prefix_cache(self) -> bool:
        """Needs the server started with VLLM_SERVER_DEV_MODE=1 (``promptdistill serve`` does)."""
        ok = True
        for url in self.urls:
            try:
                r = httpx.post(f"{self._root(url)}/reset_prefix_cache", timeout=30)
                ok = ok and r.status_code < 400
            except httpx.HTTPError:
                ok = False
        return ok

    # -- generation ---------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        """Send every request concurrently (bounded per endpoint); results in input order."""
        if not requests:
            return []
        return asyncio.run(self._generate_all(list(requests), progress))

    async def _generate_all(self, requests: list[GenerationRequest], progress: bool) -> list[GenerationResult]:
        limits = [asyncio.Semaphore(self.config.max_concurrency) for _ in self.urls]
        done = 0
        timeout = httpx.Timeout(self.config.timeout_s, connect=10.0)
        async with httpx.AsyncClient(timeout=timeout) as client:

            async def one(req: GenerationRequest) -> GenerationResult:
                nonlocal done
                i = next(self._next_url)
                async with limits[i]:
                    result = await self._with_retries(client, self.urls[i], req)
                done += 1
                if progress:
                    print(f"\r  generated {done}/{len(requests)}", end="", file=sys.stderr)
                return result

            results = await asyncio.gather(*(one(r) for r in requests))
        if progress:
            print(file=sys.stderr)
        return list(results)

    async def _with_retries(self, client: httpx.AsyncClient, url: str, req: GenerationRequest) -> GenerationResult:
        for attempt in range(_RETRIES + 1):
            try:
                return await asyncio.wait_for(
                    self._stream_one(client, url, req), timeout=req.timeout_s or self.config.timeout_s
                )
            except asyncio.TimeoutError:
                raise EngineTimeoutError(
                    f"{url}: request did not finish within {req.timeout_s or self.config.timeout_s:.0f} s"
                ) from None
            except (httpx.TransportError, _Retryable) as e:
                if attempt == _RETRIES:
                    raise EngineUnavailableError(f"{url}: failed after {_RETRIES + 1} attempts: {e}") from None
                await asyncio.sleep(_BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    async def _stream_one(self, client: httpx.AsyncClient, url: str, req: GenerationRequest) -> GenerationResult:
        path, body = request_body(req, self.model)
        chat = req.messages is not None
        text_parts: list[str] = []
        usage: dict[str, Any] = {}
        finish_reason = None
        first_token_s = None
        start = time.perf_counter()
        async with client.stream("POST", f"{url}{path}", json=body) as r:
            if r.status_code >= 500:
                raise _Retryable(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            if r.status_code >= 400:
                detail = (await r.aread()).decode(errors="replace")[:500]
                if "maximum context length" in detail or "max_model_len" in detail or "too long" in detail:
                    raise PromptTooLongError(f"{url}: {detail}")
                raise EngineError(f"{url}{path} answered HTTP {r.status_code}: {detail}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if piece:
                        if first_token_s is None:
                            first_token_s = time.perf_counter()
                        text_parts.append(piece)
                    finish_reason = choice.get("finish_reason") or finish_reason
        end = time.perf_counter()
        first_token_s = first_token_s or end
        details = usage.get("prompt_tokens_details") or {}
        result = GenerationResult(
            text="".join(text_parts),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens") or 0),
            finish_reason=finish_reason,
            ttft_ms=(first_token_s - start) * 1000.0,
            e2e_ms=(end - start) * 1000.0,
            extra={"endpoint": url},
        )
        result.valid, result.parsed, result.error = check_reply(req, result.text)
        return result


class _Retryable(Exception):
    """A server error worth another try (HTTP 5xx)."""


def _is_loopback(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("localhost", "::1") or host.startswith("127.")

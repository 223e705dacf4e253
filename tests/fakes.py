"""Fakes for unit tests of pure logic. Integration tests use the real engine.

``FakeEngine`` answers with a function of the request, tokenizes on whitespace and
reports a made-up TTFT. It is here so that logic such as clause splitting, selection
rules or report building can be tested in milliseconds; never use it to claim that
something works on the real engine.

``FakeServerEngine`` also reports a prefix-cache hit rate. For the search kernel
(``promptdistill.search``): ``FakeEvaluator`` scripts every candidate's score per record,
``FakeMeter`` and ``FakeClock`` drive a ``Budget``. ``LINEAR_TERMS`` makes small TTFT models.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from promptdistill.engine.base import (
    Engine,
    EngineIdentity,
    GenerationRequest,
    GenerationResult,
    Message,
    validate_reply,
)

if TYPE_CHECKING:
    from promptdistill.evaluate.evaluator import EvalReport

LINEAR_TERMS: tuple[tuple[int, ...], ...] = ((0,), (0, 0), (1,), (0, 1), (2,), (3,), (4,))
"""A small TTFT model for tests: a format-1 linear model's terms over ``BASE_FEATURES``
(uncached, uncached², cached, uncached x cached, few-shot count, density, entropy). The
product no longer fits such models (it fits ``MECHANICS_TERMS``) but still loads them."""

FAKE_IDENTITY = EngineIdentity(
    model="fake", backend="fake", dtype="none", max_model_len=2048, hardware="none", engine_version="0"
)


class FakeEngine(Engine):
    """A scripted engine: ``reply(request) -> text``; counts calls.

    With ``truncate=True`` a reply longer than the request's ``max_tokens`` (in whitespace
    tokens) is cut there and finishes with ``"length"``, as a real engine's would.
    """

    def __init__(self, reply: Callable[[GenerationRequest], str] | None = None, identity: EngineIdentity = FAKE_IDENTITY,
                 *, truncate: bool = False):
        self.reply = reply or (lambda req: "ok")
        self.identity = identity
        self.truncate = truncate
        self.calls = 0
        self.batches: list[int] = []

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages)

    def tokenize(self, text: str) -> list[int]:
        return [hash(w) % 50000 for w in text.split()]

    def reset_prefix_cache(self) -> bool:
        return True

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        self.batches.append(len(requests))
        out = []
        for req in requests:
            self.calls += 1
            text = self.reply(req)
            if req.choices is not None and text not in req.choices:
                text = req.choices[0]
            finish = "stop"
            if self.truncate and req.max_tokens is not None and len(text.split()) > req.max_tokens:
                text, finish = " ".join(text.split()[: req.max_tokens]), "length"
            prompt = req.prompt if req.prompt is not None else self.apply_chat_template(req.chat())
            n_prompt = len(self.tokenize(prompt))
            result = GenerationResult(
                text=text,
                prompt_tokens=n_prompt,
                completion_tokens=max(1, len(text.split())),
                cached_tokens=0,
                finish_reason=finish,
                ttft_ms=1.0 + 0.01 * n_prompt,
                e2e_ms=2.0 + 0.01 * n_prompt,
            )
            if req.json_schema is not None:
                result.parsed, result.error = validate_reply(text, req.schema)
                result.valid = result.error is None
            out.append(result)
        return out


class FakeServerEngine(FakeEngine):
    """A ``FakeEngine`` with ``prefix_cache_hit_rate()``: what the optimizer probes a server engine
    for to measure the warm share (``optimize.run.measured_hit_rate``)."""

    def __init__(self, reply: Callable[[GenerationRequest], str] | None = None, *, hit_rate: float = 0.5,
                 identity: EngineIdentity = FAKE_IDENTITY):
        super().__init__(reply, identity)
        self.hit_rate = hit_rate

    def prefix_cache_hit_rate(self) -> float:
        return self.hit_rate


def json_reply(obj: object) -> Callable[[GenerationRequest], str]:
    """A reply function that always answers ``obj`` as JSON."""
    return lambda req: json.dumps(obj)


# --- the search kernel (promptdistill.search) ----------------------------------------------


class FakeMeter:
    """Stands in for a ``CallMeter`` where only its ``calls`` count matters (``search.budget.Budget``)."""

    def __init__(self, calls: int = 0):
        self.calls = calls


class FakeClock:
    """A monotonic clock moved by hand; install it as ``time`` in a module under test:
    ``monkeypatch.setattr(budget_module, "time", clock)`` (it has ``monotonic()``)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fake_report(name: str, scores: Sequence[float | None], *, ids: Sequence[str] | None = None,
                completion_tokens: Sequence[int] | None = None) -> "EvalReport":
    """An ``EvalReport`` with these per-record scores (one generation call per record)."""
    from promptdistill.evaluate.evaluator import EvalReport

    n = len(scores)
    return EvalReport(
        spec_name=name, record_ids=list(ids) if ids is not None else [str(i) for i in range(n)], scores=list(scores),
        replies=[""] * n, valid=[None] * n,
        completion_tokens=list(completion_tokens) if completion_tokens is not None else [1] * n,
        truncated=[False] * n, generation_calls=n,
    )


class FakeEvaluator:
    """An ``evaluate(candidates, records)`` callback for ``search.screen``/``race`` with scripted scores.

    ``scores[candidate.id][int(record["id"])]`` is that candidate's score on that record.
    Every call is logged in ``calls`` as (candidate ids, record ids); a ``meter`` (a
    ``FakeMeter``) is charged one call per candidate and record, as the real evaluator would.
    """

    def __init__(self, scores: Mapping[str, Sequence[float | None]], meter: FakeMeter | None = None):
        self.scores = scores
        self.meter = meter
        self.calls: list[tuple[list[str], list[str]]] = []

    def __call__(self, cands: Sequence[Any], records: Sequence[Mapping[str, Any]]) -> list["EvalReport"]:
        ids = [str(r["id"]) for r in records]
        self.calls.append(([c.id for c in cands], ids))
        if self.meter is not None:
            self.meter.calls += len(cands) * len(records)
        return [fake_report(c.id, [self.scores[c.id][int(i)] for i in ids], ids=ids) for c in cands]

    def evaluated(self, cand_id: str) -> int:
        """Records ``cand_id`` was evaluated on, over every call."""
        return sum(len(ids) for cands, ids in self.calls if cand_id in cands)


def numbered_records(n: int) -> list[dict[str, Any]]:
    """Records ``{"id": "0"} ... {"id": str(n - 1)}`` for a ``FakeEvaluator``."""
    return [{"id": str(i)} for i in range(n)]


class FakeVLLMEndpoint:
    """A stand-in for a vLLM OpenAI server's read-only endpoints on 127.0.0.1 (a thread):
    ``/v1/models``, ``/version``, ``/metrics`` (the given Prometheus text) and, when given,
    ``/server_info``. For the code that reads what a server says about itself; generation
    is the real server's job (tests/test_engine_server.py). Use as a context manager.
    """

    def __init__(self, metrics: str = "", server_info: Mapping[str, Any] | None = None, model: str = "smollm2-135m"):
        self.pages = {"/v1/models": (200, json.dumps({"data": [{"id": model}]})),
                      "/version": (200, json.dumps({"version": "0.0-fake"})),
                      "/metrics": (200, metrics) if metrics else (404, "")}
        if server_info is not None:
            self.pages["/server_info"] = (200, json.dumps(server_info))
        self.requested: list[str] = []

    def __enter__(self) -> "FakeVLLMEndpoint":
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                path = self.path.split("?", 1)[0]
                fake.requested.append(path)
                status, body = fake.pages.get(path, (404, ""))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class FakeDriftingEngine(FakeEngine):
    """A ``FakeEngine`` whose TTFT is ``per_token_ms`` per prompt token plus ``drift_ms``
    per request sent so far: a machine that slows down while it is timed. ``log`` keeps
    every request's messages in the order sent."""

    def __init__(self, *, per_token_ms: float = 1.0, drift_ms: float = 5.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.per_token_ms, self.drift_ms = per_token_ms, drift_ms
        self.log: list[GenerationRequest] = []
        self.resets = 0

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        return True

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        results = []
        for req in requests:
            (result,) = super().generate([req])
            result.ttft_ms = self.per_token_ms * result.prompt_tokens + self.drift_ms * len(self.log)
            self.log.append(req)
            results.append(result)
        return results


def synthetic_load_cells(noise: float = 0.0, seed: int = 0, cached_ms: float = 0.02) -> list[dict]:
    """Load profile cells from a queueing law (prefill 0.4 ms/token, decode 8 ms/token shared) with noise."""
    rng = np.random.default_rng(seed)
    cells = []
    for pid, (u, k, g) in enumerate([(100, 0, 10), (400, 64, 20), (900, 256, 15), (200, 0, 80), (1500, 512, 30),
                                     (600, 128, 60), (300, 32, 40), (1100, 0, 25)]):
        solo = 20 + 0.4 * u + cached_ms * k  # cached_ms: what a cached prompt token still costs (attention)
        s = (0.0004 * u + cached_ms / 1000 * k + 0.004 * g + 0.01)
        for rep in range(2):
            for c in (1, 8, 32):
                p95 = solo * (1 + 0.35 * (c - 1) ** 0.8 * (1 + g / 60))
                cells.append({"prompt_id": f"p{pid}", "load_kind": "concurrency", "load_value": c, "repeat": rep,
                              "uncached_tokens": u, "cached_tokens": k, "completion_tokens": g,
                              "ttft_ms": p95 * math.exp(noise * rng.normal()), "throughput_rps":
                                  (1 / s) * min(1.0, c / 8) * math.exp(noise * rng.normal())})
            for r in (2.0, 5.0):
                rho = r * s
                if rho >= 0.97:
                    continue
                p95 = solo + 3.0 * s * 1000 * rho / (1 - rho)
                cells.append({"prompt_id": f"p{pid}", "load_kind": "rate", "load_value": r, "repeat": rep,
                              "uncached_tokens": u, "cached_tokens": k, "completion_tokens": g,
                              "ttft_ms": p95 * math.exp(noise * rng.normal())})
    return cells

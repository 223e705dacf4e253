"""A spec's baseline and its published template measured at load: what ``promptdistill load`` runs.

1. The server: the configured ``engine.server_urls`` (backend ``server``), else one
   launched here with the product's launcher for the configured model.
2. The requests: the spec's test records (the split every stage verifies on), rendered
   by each template's content through the client's request path.
3. The loads: the spec's declared ``slo.load`` and a sweep of rates around the
   baseline's capacity (``capacity_rps``: a short closed-loop probe at a high
   concurrency), so the sustainable rate can be read off; or the rates given.
4. ``measure_loads`` (both templates interleaved), then ``load_figures``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from promptdistill.core.config import EngineConfig
from promptdistill.core.errors import ConfigError, EngineUnavailableError
from promptdistill.load.driver import LoadRequest, chat_requests, run_block
from promptdistill.load.measure import LoadPlan, measure_loads
from promptdistill.load.report import LoadFigures, load_figures
from promptdistill.specs.model import Load, Spec

__all__ = ["CAPACITY_CONCURRENCY", "SWEEP", "LoadRun", "capacity_rps", "load_server", "measure_spec_load",
           "spec_records", "sweep_loads"]

CAPACITY_CONCURRENCY = 16
"""In flight during the capacity probe: enough to keep the engine's batch full."""
SWEEP = (0.3, 0.6, 0.85, 1.0, 1.2)
"""Rates swept, as shares of the baseline's capacity: light, two below the knee, at it, past it."""


@contextlib.contextmanager
def load_server(config: EngineConfig, *, log_path: str | None = None) -> Iterator[str]:
    """The ``.../v1`` URL to load: the first configured server, or one launched for the run."""
    if config.backend == "server":
        yield config.server_urls[0].rstrip("/")
        return
    from promptdistill.engine import resolve_model
    from promptdistill.engine.launcher import VLLMServer

    with VLLMServer(resolve_model(config.model), replace(config, backend="server"), log_path=log_path) as server:
        yield server.url


def spec_records(spec: Spec, *, n: int, seed: int = 0) -> list[Mapping[str, Any]]:
    """The spec's first ``n`` test records, as the verification shuffles them."""
    from promptdistill.search.splits import split_records

    records = split_records(spec, seed=seed, screen_size=1, dev_size=2, test_size=n).test
    if not records:
        raise ConfigError(f"{spec.dataset}: no test records to send at load")
    return list(records)


def capacity_rps(url: str, requests: Sequence[LoadRequest], *, concurrency: int = CAPACITY_CONCURRENCY,
                 n: int = 32, seed: int = 0) -> float:
    """Completed requests per second with ``concurrency`` in flight (a closed-loop probe):
    the rate past which an open-loop queue grows without bound."""
    chosen = [requests[i % len(requests)] for i in range(n)]
    start = time.perf_counter()
    outcomes = run_block(url, chosen, Load(concurrency=concurrency), seed=seed)
    span = time.perf_counter() - start
    done = sum(1 for o in outcomes if o.ok)
    if done == 0 or span <= 0:
        raise EngineUnavailableError(f"{url}: the capacity probe completed no request")
    return done / span


def sweep_loads(capacity: float, declared: Load | None = None, shares: Sequence[float] = SWEEP) -> tuple[Load, ...]:
    """The rates to measure: shares of ``capacity``, and the declared load (rate or concurrency)."""
    loads = [Load(rate_rps=round(capacity * s, 3)) for s in shares if capacity * s > 0]
    if declared is not None and declared not in loads:
        loads.append(declared)
    return tuple(sorted(loads, key=lambda ld: (ld.kind, ld.value)))


@dataclass(frozen=True)
class LoadRun:
    """One load measurement of a spec's templates: the plan, the rows, the figures."""

    spec: str
    templates: dict[str, dict[str, Any]]
    """label -> {ref, prompt tokens...}: what was measured."""
    capacity_rps: float | None
    plan: LoadPlan
    rows: list[dict[str, Any]]
    figures: LoadFigures
    minutes: float

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "templates": self.templates, "capacity_rps": self.capacity_rps,
                "plan": self.plan.to_dict(), "figures": self.figures.to_dict(), "minutes": self.minutes}


def measure_spec_load(url: str, spec: Spec, contents: Mapping[str, Mapping[str, Any]], *, model: str,
                      loads: Sequence[Load] | None = None, requests_per_block: int = 48, blocks: int = 2,
                      records: int = 200, target_ms: float | None = None, seed: int = 0,
                      progress: Callable[[str], None] | None = None) -> LoadRun:
    """Measure ``contents`` (label -> template content; the baseline first) at load.

    Args:
        loads: the loads; None: a sweep around the first template's capacity plus the
            spec's declared load.
        target_ms: the percentile's target for the sustainable rate (default ``slo.ttft_ms``).
    """
    t0 = time.perf_counter()
    recs = spec_records(spec, n=records, seed=seed)
    requests = {label: chat_requests(label, content, recs, model=model) for label, content in contents.items()}
    capacity = None
    if loads is None:
        first = next(iter(requests.values()))
        capacity = capacity_rps(url, first, seed=seed)
        if progress is not None:
            progress(f"capacity of {next(iter(requests))}: {capacity:.2f} req/s at concurrency {CAPACITY_CONCURRENCY}")
        loads = sweep_loads(capacity, spec.slo.load)
    plan = LoadPlan(loads=tuple(loads), requests_per_block=requests_per_block, blocks=blocks, seed=seed)
    rows = measure_loads(url, requests, plan, progress=progress)
    target = spec.slo.ttft_ms if target_ms is None else target_ms
    figures = load_figures(rows, templates=list(contents), percentile=spec.slo.ttft_percentile, target_ms=target,
                           seed=seed)
    described = {label: {"system_chars": len(str(c.get("system", ""))), "max_tokens": c.get("max_tokens")}
                 for label, c in contents.items()}
    return LoadRun(spec.name, described, capacity, plan, rows, figures, (time.perf_counter() - t0) / 60.0)

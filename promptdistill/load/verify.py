"""The winner measured against the baseline at the spec's declared load, before it is published.

Both templates at ``slo.load`` through a vLLM server, interleaved in paired blocks
(``measure_spec_load``); the verdict reads the interval of the winner's percentile
minus the baseline's: ``slower`` when it lies above 0 (the winner is reverted),
``faster`` when below, else ``not shown`` (the prediction stands). A failed request at
the load counts against its template: a template whose requests fail more is slower.

Where no server is configured, one is started for the measurement (the in-process
engine idles meanwhile: only one engine computes at a time).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, Mapping

from promptdistill.load.run import measure_spec_load
from promptdistill.specs.model import Spec

__all__ = ["LoadCheck", "VERIFY_BLOCKS", "VERIFY_REQUESTS", "check_at_load", "server_for"]

VERIFY_REQUESTS = 48
"""Requests per template and block of the verification (the first few warm the queue)."""
VERIFY_BLOCKS = 2


@dataclass(frozen=True)
class LoadCheck:
    """What the measurement at the declared load said."""

    latency: str
    """'P95 TTFT at 4 req/s'."""
    verdict: str
    """'slower', 'faster' or 'not shown'."""
    difference_ms: float | None
    low_ms: float | None
    high_ms: float | None
    n: int
    baseline_ms: float | None
    winner_ms: float | None
    failed: dict[str, int]
    minutes: float

    @property
    def slower(self) -> bool:
        return self.verdict == "slower"

    def sentence(self) -> str:
        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else f"{v:{fmt}}"
        return (f"measured {self.latency}: baseline {f(self.baseline_ms, '.0f')} ms, winner {f(self.winner_ms, '.0f')} "
                f"ms, difference {f(self.difference_ms, '+.0f')} [{f(self.low_ms, '+.0f')}, {f(self.high_ms, '+.0f')}] "
                f"ms (95%, n={self.n} each)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_at_load(url: str, spec: Spec, baseline: Mapping[str, Any], winner: Mapping[str, Any], *, model: str,
                  requests: int = VERIFY_REQUESTS, blocks: int = VERIFY_BLOCKS, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> LoadCheck:
    """Measure ``baseline`` and ``winner`` (template contents) at ``spec.slo.load``."""
    load = spec.slo.load
    if load is None:
        raise ValueError(f"{spec.name}: check_at_load needs slo.load")
    run = measure_spec_load(url, spec, {"baseline": baseline, "winner": winner}, model=model, loads=[load],
                            requests_per_block=requests, blocks=blocks, seed=seed, progress=progress)
    q = f"p{spec.slo.ttft_percentile:g}_ttft_ms"
    at = run.figures.per_load[0]
    diff = at.get("difference", {}).get(q) or {"value": None, "low": None, "high": None, "n": 0}
    failed = {label: t["failed"] for label, t in at["templates"].items()}
    verdict = "not shown"
    if failed["winner"] > failed["baseline"] or (diff["low"] is not None and diff["low"] > 0):
        verdict = "slower"
    elif diff["high"] is not None and diff["high"] < 0:
        verdict = "faster"
    return LoadCheck(latency=spec.slo.latency_name, verdict=verdict, difference_ms=diff["value"], low_ms=diff["low"],
                     high_ms=diff["high"], n=int(diff["n"]), baseline_ms=at["templates"]["baseline"][q]["value"],
                     winner_ms=at["templates"]["winner"][q]["value"], failed=failed, minutes=run.minutes)


@contextlib.contextmanager
def server_for(engine: Any) -> Iterator[tuple[str, str]]:
    """(the ``.../v1`` URL, the served model name) of a server for ``engine``'s model: its
    own first endpoint when it is a server engine, else one started here and stopped after."""
    from promptdistill.engine.base import unwrap_engine
    from promptdistill.engine.launcher import VLLMServer

    inner = unwrap_engine(engine)
    urls = getattr(inner, "urls", None)
    if urls:
        yield urls[0], inner.model
        return
    config = getattr(inner, "config", None)
    path = getattr(inner, "model_path", None)
    if config is None or path is None:
        raise ValueError("no server to measure at load: the engine is neither a server nor an in-process vLLM engine")
    with VLLMServer(path, replace(config, backend="server")) as server:
        yield server.url, config.served_model_name

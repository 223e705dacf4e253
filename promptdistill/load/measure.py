"""Templates measured at loads through one vLLM server, interleaved in time.

Per load, each template is sent ``blocks`` blocks of ``requests_per_block`` requests.
Block ``b`` of every template carries the same records and, for a rate, the same
Poisson arrival times (one seed per block), and the templates' blocks alternate
(A B, then B A, ...), so drift on the machine falls on both and block ``b`` of two
templates is a pair. The server drains between blocks (each block waits for its last
reply), so one block's queue never spills into the next. The first ``warmup`` requests
of a block, sent into an empty queue, are left out of the percentiles.

The server's prefix cache is left as production leaves it: the templates' static
prefixes stay cached across requests (warm), which is what a service under load sees.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

from promptdistill.core.errors import ConfigError
from promptdistill.load.driver import LoadRequest, Outcome, run_block
from promptdistill.specs.model import Load

__all__ = ["WARMUP", "LoadPlan", "measure_loads"]

WARMUP = 4
"""Requests at the start of a block, sent into an empty queue, left out of its percentiles."""


@dataclass(frozen=True)
class LoadPlan:
    """What one load measurement sends. Sized in requests; time is whatever they take."""

    loads: tuple[Load, ...]
    requests_per_block: int = 48
    blocks: int = 2
    warmup: int = WARMUP
    timeout_s: float = 300.0
    """Bound on each request (a request past it counts as failed)."""
    seed: int = 0
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.loads:
            raise ConfigError("load plan: no load to measure")
        if self.requests_per_block < 2:
            raise ConfigError(f"load plan: requests_per_block must be at least 2, got {self.requests_per_block}")
        if self.blocks < 1:
            raise ConfigError(f"load plan: blocks must be at least 1, got {self.blocks}")
        if not 0 <= self.warmup < self.requests_per_block:
            raise ConfigError(f"load plan: warmup must be in [0, requests_per_block), got {self.warmup}")

    @property
    def requests(self) -> int:
        return len(self.loads) * self.blocks * self.requests_per_block

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["loads"] = [ld.to_dict() for ld in self.loads]
        return out


def measure_loads(url: str, templates: Mapping[str, Sequence[LoadRequest]], plan: LoadPlan, *,
                  progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Send every template at every load of ``plan``; one row per request.

    Args:
        url: the server's ``.../v1`` address.
        templates: label -> that template's requests, one per record, in the same record
            order for every template (block ``b`` takes the next ``requests_per_block``,
            cycling).

    Returns:
        Rows: template, load_kind, load_value, block, index (arrival order in the block),
        warmup, record_id, sent_s, ttft_ms, e2e_ms, prompt_tokens, completion_tokens, ok,
        error, block_span_s (first send to last reply of the block).
    """
    labels = list(templates)
    if not labels or any(not templates[k] for k in labels):
        raise ConfigError("load measurement: every template needs at least one request")
    rows: list[dict[str, Any]] = []
    n = plan.requests_per_block
    steps, step = len(plan.loads) * plan.blocks * len(labels), 0
    for li, load in enumerate(plan.loads):
        for b in range(plan.blocks):
            order = labels if (li + b) % 2 == 0 else labels[::-1]
            for label in order:
                pool = list(templates[label])
                chosen = [pool[(b * n + i) % len(pool)] for i in range(n)]
                outcomes = run_block(url, chosen, load, seed=plan.seed + 1009 * li + b, timeout_s=plan.timeout_s)
                rows += _rows(outcomes, label, load, b, plan.warmup)
                step += 1
                if progress is not None:
                    ok = [o for o in outcomes if o.ok]
                    progress(f"load {load.describe()}: {label} block {b + 1}/{plan.blocks} "
                             f"({len(ok)}/{len(outcomes)} ok) [{step}/{steps}]")
    return rows


def _rows(outcomes: Sequence[Outcome], label: str, load: Load, block: int, warmup: int) -> list[dict[str, Any]]:
    ends = [o.sent_s + (o.e2e_ms or 0.0) / 1000.0 for o in outcomes]
    span = (max(ends) - min(o.sent_s for o in outcomes)) if outcomes else 0.0
    return [{"template": label, "load_kind": load.kind, "load_value": load.value, "block": block, "index": i,
             "warmup": i < warmup, "record_id": o.record_id, "sent_s": o.sent_s, "ttft_ms": o.ttft_ms,
             "e2e_ms": o.e2e_ms, "prompt_tokens": o.prompt_tokens, "completion_tokens": o.completion_tokens,
             "ok": o.ok, "error": o.error, "block_span_s": span}
            for i, o in enumerate(outcomes)]  # request order: the arrival order, the same for paired blocks

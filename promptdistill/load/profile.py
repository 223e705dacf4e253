"""The load profile: real templates measured at concurrencies and rates, in repeated rounds.

Templates: each given spec as written and its described variant (the one-line
description, no rules or examples; the shortest prompt the optimizer proposes), so the
prompts span short to long prefills and short to long replies. Requests are the specs'
test records through the client's request path (``load.driver``).

Loads: every concurrency of the config (1, 8 and 32 by default; the highest gives each
template's capacity), then, per template, rates at shares of its own capacity (the same
utilizations for every template), plus any rates given (the specs' declared loads). Each cell
(template, load) is one block; the whole design runs ``repeats`` rounds, the order
reversed each round, so repeats see the machine's drift and give the noise floor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from promptdistill.core.errors import ConfigError
from promptdistill.load.driver import LoadRequest, chat_requests, run_block
from promptdistill.specs.model import Load, Spec

__all__ = ["LoadProfileConfig", "ProfileTemplate", "profile_cells", "profile_templates", "run_load_profile",
           "template_features"]


@dataclass(frozen=True)
class LoadProfileConfig:
    """How much a load profile measures. Sized in requests; time is what they take."""

    concurrencies: tuple[int, ...] = (1, 8, 32)
    rate_shares: tuple[float, ...] = (0.3, 0.65)
    """Each template's rates, as shares of its own capacity (at the highest concurrency)."""
    extra_rates: tuple[float, ...] = ()
    """Rates measured besides (the specs' declared loads)."""
    requests: int = 40
    """Requests per cell (template, load), the first ``warmup`` left out."""
    solo_requests: int = 12
    """Requests per cell at concurrency 1 (its percentile is the solo tail: fewer do)."""
    warmup: int = 4
    repeats: int = 2
    percentile: float = 95.0
    records: int = 48
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ConfigError(f"load profile: concurrencies must be 1 or more, got {self.concurrencies}")
        if any(not s > 0 for s in (*self.rate_shares, *self.extra_rates)):
            raise ConfigError("load profile: rates and rate shares must be above 0")
        if self.repeats < 1 or self.requests <= self.warmup or self.solo_requests <= min(self.warmup, 1):
            raise ConfigError("load profile: repeats >= 1 and more requests than warmup per cell")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ProfileTemplate:
    """One template of the profile: its id, spec, content, requests and features."""

    prompt_id: str
    spec: Spec
    content: Mapping[str, Any]
    requests: Sequence[LoadRequest]
    features: Mapping[str, float]
    """Mean uncached_tokens and cached_tokens (a warm prefix cache) over the requests' prompts."""


def profile_templates(variants: Sequence[tuple[str, Spec, Sequence[Mapping[str, Any]]]], *, tokenizer: Any,
                      block_tokens: int, model: str, records: int = 48, seed: int = 0) -> list[ProfileTemplate]:
    """Each (prompt id, spec, fixed examples) as a template, with its features from
    ``tokenizer`` over the spec's test records (the caller picks the variants: the
    pipeline gives each spec as written and its described variant)."""
    from promptdistill.search.splits import split_records
    from promptdistill.specs.prompt import template_content

    out = []
    for prompt_id, spec, examples in variants:
        test = split_records(spec, seed=seed, screen_size=1, dev_size=2, test_size=records).test
        content = template_content(spec, examples)
        out.append(ProfileTemplate(prompt_id, spec, content, chat_requests(prompt_id, content, test, model=model),
                                   template_features(spec, examples, test[:8], tokenizer=tokenizer,
                                                     block_tokens=block_tokens)))
    return out


def template_features(spec: Spec, examples: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]], *,
                      tokenizer: Any, block_tokens: int) -> dict[str, float]:
    """Mean uncached and cached prompt tokens of ``records`` with a warm prefix cache (the
    static prefix in whole blocks: ``ttft.estimators.warm_cached_tokens``)."""
    from promptdistill.ttft.estimators import warm_cached_tokens
    from promptdistill.ttft.features import prompt_features

    feats = [prompt_features(spec, r["inputs"], tokenizer, examples=examples) for r in records]
    cached = [warm_cached_tokens(f["static_prefix_tokens"], f["total_tokens"], block_tokens) for f in feats]
    total = float(np.mean([f["total_tokens"] for f in feats]))
    return {"uncached_tokens": total - float(np.mean(cached)), "cached_tokens": float(np.mean(cached))}


def _cell(outcomes: Sequence[Any], warmup: int, percentile: float) -> dict[str, Any]:
    kept = [o for o in outcomes[warmup:] if o.ok]
    ends = [o.sent_s + (o.e2e_ms or 0.0) / 1000.0 for o in outcomes if o.ok]
    span = max(ends) - min(o.sent_s for o in outcomes) if ends else 0.0
    ttfts = [o.ttft_ms for o in kept]
    return {"ttft_ms": float(np.percentile(ttfts, percentile)) if ttfts else None,
            "p50_ms": float(np.percentile(ttfts, 50)) if ttfts else None, "n": len(ttfts),
            "failed": sum(1 for o in outcomes if not o.ok),
            "throughput_rps": (len(ends) / span) if span > 0 else None,
            "completion_tokens": float(np.mean([o.completion_tokens for o in outcomes if o.ok])) if ends else None,
            "prompt_tokens": float(np.mean([o.prompt_tokens for o in outcomes if o.ok])) if ends else None}


def run_load_profile(url: str, templates: Sequence[ProfileTemplate], config: LoadProfileConfig, *,
                     progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Measure every template at every load, ``config.repeats`` rounds; one row per cell.

    Rows: prompt_id, load_kind, load_value, repeat, ttft_ms (the percentile), p50_ms, n,
    failed, throughput_rps, completion_tokens, prompt_tokens, and the template's features.
    Each template's rates are its ``rate_shares`` of its own capacity (its throughput at the
    highest concurrency in the first round), so every template is measured at the same
    utilizations, light to near its knee, and the rates span what the templates sustain.
    """
    if not templates:
        raise ConfigError("load profile: no templates")
    conc = sorted(set(config.concurrencies), reverse=True)  # the highest first: it sets the rates
    rows: list[dict[str, Any]] = []
    rates: dict[str, list[float]] = {}
    shares: dict[str, dict[float, float]] = {}
    for rep in range(config.repeats):
        order = list(templates) if rep % 2 == 0 else list(templates)[::-1]
        plan = [(t, Load(concurrency=c)) for c in conc for t in order]
        plan += [(t, Load(rate_rps=r)) for t in order for r in rates.get(t.prompt_id, ())]
        if rep % 2:
            plan = plan[::-1]
        for li, (t, load) in enumerate(plan):
            n = config.solo_requests if load.concurrency == 1 else config.requests
            reqs = [t.requests[(rep * n + i) % len(t.requests)] for i in range(n)]
            warmup = min(config.warmup, 1) if load.concurrency == 1 else config.warmup
            outcomes = run_block(url, reqs, load, seed=config.seed + 101 * li + rep)
            cell = _cell(outcomes, warmup, config.percentile)
            rows.append({"prompt_id": t.prompt_id, "load_kind": load.kind, "load_value": load.value,
                         "rate_share": shares.get(t.prompt_id, {}).get(load.value) if load.rate_rps else None,
                         "repeat": rep, **cell, **t.features})
            if progress is not None:
                shown = "-" if cell["ttft_ms"] is None else f"{cell['ttft_ms']:.0f} ms"
                progress(f"round {rep + 1}/{config.repeats} {load.describe()}: {t.prompt_id} "
                         f"P{config.percentile:g} {shown}, {cell['throughput_rps'] or 0:.2f} req/s")
            if rep == 0 and load.concurrency == max(conc) and cell["throughput_rps"]:
                mine = sorted({round(cell["throughput_rps"] * s, 3) for s in config.rate_shares}
                              | set(config.extra_rates))
                rates[t.prompt_id] = mine
                shares[t.prompt_id] = {round(cell["throughput_rps"] * s, 3): s for s in config.rate_shares}
                plan += [(t, Load(rate_rps=r)) for r in mine]
    return rows


def profile_cells(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The cells a model fits on: per (prompt, load, repeat) as measured; the reply length
    (a feature) is the template's mean over all its cells, as the optimizer knows it from
    its screen records, not the cell's own."""
    lengths: dict[str, list[float]] = {}
    for r in rows:
        if r.get("completion_tokens") is not None:
            lengths.setdefault(r["prompt_id"], []).append(float(r["completion_tokens"]))
    return [{**r, "completion_tokens": float(np.mean(lengths[r["prompt_id"]]))}
            for r in rows if r["prompt_id"] in lengths and r.get("ttft_ms") is not None]

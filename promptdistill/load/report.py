"""A load measurement's figures: per template and load, and the templates compared.

Per (template, load): P50/P95/P99 TTFT with their intervals and n, failures, request
and output-token throughput (each block's completed requests over its span, first send
to last reply; interval: the blocks' range). Per load, the second template's percentile
minus the first's over the paired blocks. Per template, over the rate loads: the highest
rate at which the target percentile stays under the target (the sustainable rate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from promptdistill.load.stats import Estimate, percentile_ci, percentile_diff_ci, sustainable_rate
from promptdistill.specs.model import Load

__all__ = ["PERCENTILES", "SUSTAINED_SHARE", "LoadFigures", "load_figures", "markdown_tables"]

PERCENTILES = (50.0, 95.0, 99.0)
SUSTAINED_SHARE = 0.9
"""At a rate, a template whose blocks complete less than this share of the offered requests
per second is not sustaining it: its queue grows, and its percentiles grow with the run."""


def _load_key(row: Mapping[str, Any]) -> tuple[str, float]:
    return str(row["load_kind"]), float(row["load_value"])


def _describe(key: tuple[str, float]) -> str:
    kind, value = key
    return Load(rate_rps=value).describe() if kind == "rate" else Load(concurrency=int(value)).describe()


def _blocks(rows: Sequence[Mapping[str, Any]], field: str) -> list[list[float | None]]:
    by_block: dict[int, list[float | None]] = {}
    for r in rows:
        if not r["warmup"]:
            by_block.setdefault(int(r["block"]), []).append(r[field] if r["ok"] else None)
    return [by_block[b] for b in sorted(by_block)]


def _throughput(rows: Sequence[Mapping[str, Any]], what: str) -> Estimate:
    per_block = {}
    for r in rows:
        b = int(r["block"])
        span, done = per_block.get(b, (r["block_span_s"], 0.0))
        per_block[b] = (span, done + (1.0 if what == "requests" else float(r["completion_tokens"])) * bool(r["ok"]))
    rates = [done / span for span, done in per_block.values() if span > 0]
    if not rates:
        return Estimate(None, None, None, 0)
    return Estimate(sum(rates) / len(rates), min(rates), max(rates), len(rows))


@dataclass(frozen=True)
class LoadFigures:
    """Everything one load run says; ``to_dict`` is the JSON report's body."""

    templates: tuple[str, ...]
    percentile: float
    target_ms: float | None
    per_load: list[dict[str, Any]]
    sustainable: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"templates": list(self.templates), "percentile": self.percentile, "target_ms": self.target_ms,
                "per_load": self.per_load, "sustainable": self.sustainable}

    def at(self, load: Load) -> dict[str, Any] | None:
        """The figures at ``load``, or None when it was not measured."""
        for entry in self.per_load:
            if entry["load_kind"] == load.kind and float(entry["load_value"]) == load.value:
                return entry
        return None


def load_figures(rows: Sequence[Mapping[str, Any]], *, templates: Sequence[str], percentile: float = 95.0,
                 target_ms: float | None = None, seed: int = 0) -> LoadFigures:
    """The figures of ``measure_loads`` rows; the first template is the reference of the
    differences (``second - first``: the baseline first)."""
    keys = sorted({_load_key(r) for r in rows}, key=lambda k: (k[0], k[1]))
    per_load = []
    for key in keys:
        at = [r for r in rows if _load_key(r) == key]
        entry: dict[str, Any] = {"load_kind": key[0], "load_value": key[1], "load": _describe(key), "templates": {}}
        for label in templates:
            mine = [r for r in at if r["template"] == label]
            if not mine:
                continue
            ttft = _blocks(mine, "ttft_ms")
            measured = [r for r in mine if not r["warmup"]]
            entry["templates"][label] = {
                **{f"p{q:g}_ttft_ms": percentile_ci(ttft, q).to_dict() for q in PERCENTILES},
                "requests": len(mine), "measured": len(measured),
                "failed": sum(1 for r in mine if not r["ok"]),
                "request_throughput_rps": _throughput(mine, "requests").to_dict(),
                "output_token_throughput": _throughput(mine, "tokens").to_dict(),
                "mean_prompt_tokens": sum(r["prompt_tokens"] for r in mine) / len(mine),
                "mean_completion_tokens": sum(r["completion_tokens"] for r in mine) / len(mine),
            }
            if key[0] == "rate":
                # Open loop: a queue that grows through the run is a load the engine cannot sustain.
                done = entry["templates"][label]["request_throughput_rps"]["value"] or 0.0
                entry["templates"][label]["sustained"] = done >= SUSTAINED_SHARE * key[1]
        if len(templates) >= 2 and all(t in entry["templates"] for t in templates[:2]):
            first = _blocks([r for r in at if r["template"] == templates[0]], "ttft_ms")
            second = _blocks([r for r in at if r["template"] == templates[1]], "ttft_ms")
            if len(first) == len(second):
                entry["difference"] = {f"p{q:g}_ttft_ms": percentile_diff_ci(first, second, q).to_dict()
                                       for q in PERCENTILES}
        per_load.append(entry)
    sustainable: dict[str, dict[str, Any]] = {}
    if target_ms is not None:
        for label in templates:
            points = [(e["load_value"], Estimate(**e["templates"][label][f"p{percentile:g}_ttft_ms"]))
                      for e in per_load if e["load_kind"] == "rate" and label in e["templates"]]
            if points:
                sustainable[label] = sustainable_rate(points, target_ms).to_dict()
    return LoadFigures(tuple(templates), percentile, target_ms, per_load, sustainable)


def _fmt(e: Mapping[str, Any] | None, unit: str = "", fmt: str = ".0f") -> str:
    """``value [low, high]``; '-' for a figure or a bound the requests cannot give."""
    if not e or e.get("value") is None:
        return f"< {e['high']:{fmt}}{unit}" if e and e.get("high") is not None else "-"
    low = "-" if e.get("low") is None else f"{e['low']:{fmt}}"
    high = "-" if e.get("high") is None else f"{e['high']:{fmt}}"
    return f"{e['value']:{fmt}}{unit} [{low}, {high}]"


def markdown_tables(figures: LoadFigures) -> str:
    """The per-load table (P50/P95/P99 and throughput per template, the P95 difference)
    and the sustainable rates, as markdown."""
    q = f"p{figures.percentile:g}_ttft_ms"
    lines = ["| load | template | P50 TTFT ms | P95 TTFT ms | P99 TTFT ms | req/s | output tok/s | failed | n |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in figures.per_load:
        for label, t in e["templates"].items():
            shown = label if t.get("sustained", True) else f"{label} (**not sustained**: the queue grows)"
            lines.append(f"| {e['load']} | {shown} | {_fmt(t['p50_ttft_ms'])} | {_fmt(t['p95_ttft_ms'])} | "
                         f"{_fmt(t['p99_ttft_ms'])} | {_fmt(t['request_throughput_rps'], fmt='.2f')} | "
                         f"{_fmt(t['output_token_throughput'])} | {t['failed']} | {t['measured']} |")
        if "difference" in e:
            d = e["difference"][q]
            lines.append(f"| {e['load']} | **{figures.templates[1]} - {figures.templates[0]}** (paired) | | "
                         f"{_fmt(d)} | | | | | {d['n']} |")
    out = "\n".join(lines)
    if figures.sustainable:
        out += (f"\n\nSustainable rate (P{figures.percentile:g} TTFT at most {figures.target_ms:g} ms), "
                "interpolated between the rates swept:\n\n| template | req/s [95% interval] |\n|---|---|\n")
        out += "\n".join(f"| {label} | {_fmt(s, fmt='.2f')} |" for label, s in figures.sustainable.items())
    return out + "\n"

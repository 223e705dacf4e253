"""What an optimization run produced: the template to publish, the figures, the tables.

``OptimizationResult.write(folder)`` writes, each atomically (temp file, then rename):

* ``candidates.parquet``: the full candidate log (one row per candidate: prompt shape,
  predicted TTFT cold/warm, rung, dev quality with CI, paired lower bound, verdict);
* ``pareto.parquet``, ``density_curve.parquet``, ``formats.parquet``, ``timing.parquet``;
* ``result.json``: the template content, baseline and winner figures, the decision
  (``selection``: winner, clause, bounds, a revert) and its reason, the record plan,
  token budget, call counts and provenance: everything publishing needs;
* ``pareto.png``: the Pareto front with the baseline and the winner marked.

Publishing goes through :func:`promptdistill.pipeline.publish.publish_result` (one path
for the CLI and the flows).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from promptdistill.core.display import format_number
from promptdistill.core.jsonio import atomic_write, json_safe, write_json, write_parquet
from promptdistill.optimize.plot import plot_pareto
from promptdistill.search.selection import SelectionRecord
from promptdistill.search.sequential import Plan

__all__ = ["OptimizationResult"]


def _section(title: str, frame: pd.DataFrame, row: Callable[[Any], str]) -> list[str]:
    """A titled block of the summary: one indented line per row, then a blank line.

    An empty table prints nothing at all, so a step that did not run leaves no heading.
    """
    if frame.empty:
        return []
    return [title, *(f"  {row(r)}" for r in frame.itertuples()), ""]


@dataclass
class OptimizationResult:
    """The outcome of ``optimize``. ``content`` is ready for ``Registry.publish``."""

    spec_name: str
    seed: int
    content: dict[str, Any]
    """The winning template: system and user parts (examples inline), inputs, output
    schema, response_format, max_tokens and sampling settings."""
    winner_id: str
    reason: str
    """Why this template won, or why the baseline was kept."""
    kept_baseline: bool
    baseline: dict[str, Any]
    """Figures of the spec as written: dev/test quality with CIs, predicted and measured TTFT, valid rate."""
    winner: dict[str, Any]
    candidates: pd.DataFrame
    pareto: pd.DataFrame
    density_curve: pd.DataFrame
    tradeoff: pd.DataFrame
    formats: pd.DataFrame
    token_budget: Any
    timing: pd.DataFrame
    lm_calls: int
    """Every LM request of the run (through the cache, if any)."""
    real_lm_calls: int | None
    """Requests the cache could not answer (None without a CachedEngine)."""
    timing_requests: int
    """Requests sent to measure TTFT (never cached)."""
    minutes: float
    stop_reason: str | None
    provenance: dict[str, Any]
    budget: Any
    rule: Any
    winner_spec: Any
    winner_examples: list[Any]
    verification: dict[str, Any]
    dev_completion_tokens: list[int] = field(default_factory=list)
    """The published template's completion tokens per dev record (what ``max_tokens`` came from)."""
    dev_truncated: list[bool] = field(default_factory=list)
    """Per dev record: did that reply stop at the search's token limit?"""
    notes: list[str] = field(default_factory=list)
    plan: Plan | None = None
    """What the certify pool could decide (None when the race did not run)."""
    warm_share: float = 0.8
    warm_share_source: str = "assumed"
    """'measured (server prefix-cache hit rate)', 'configured' or 'assumed'."""
    ttft_resolution: float = 0.0
    """Relative TTFT difference below which two predictions tie (the model's held-out MAPE)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    """Tokens processed by every LM request of the run (what a GPU spends)."""
    ttft_kind: str = "expected"
    slo_ttft_ms: float | None = None
    max_quality_drop: float = 0.0
    splits: dict[str, int] = field(default_factory=dict)
    references: dict[str, Any] = field(default_factory=dict)
    """Label-free records: the baseline's reply each was scored against, by record id."""
    selection: SelectionRecord | None = None
    """The decision: winner, clause, resolution, bounds, a revert (``reason`` and ``kept_baseline`` say it too)."""

    # ------------------------------------------------------------------ figures
    def metrics(self) -> dict[str, Any]:
        """Flat metrics for the registry: baseline_* and winner_* figures plus run counts."""
        out: dict[str, Any] = {}
        for who, figs in (("baseline", self.baseline), ("winner", self.winner)):
            out.update({f"{who}_{k}": v for k, v in figs.items() if not isinstance(v, (dict, list))})
        out.update({
            "max_tokens": self.token_budget.max_tokens, "truncation_rate": self.token_budget.truncation_rate,
            "kept_baseline": self.kept_baseline, "lm_calls": self.lm_calls, "real_lm_calls": self.real_lm_calls,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "timing_requests": self.timing_requests, "minutes": round(self.minutes, 3),
            "warm_share": self.warm_share, "warm_share_source": self.warm_share_source,
            "candidates": int(len(self.candidates)), "pareto_size": int(len(self.pareto)),
        })
        return out

    def to_summary(self) -> str:
        """The table ``promptdistill optimize`` prints."""
        k = self.ttft_kind
        slo = "none" if self.slo_ttft_ms is None else f"{self.slo_ttft_ms:g} ms"
        lines = [f"Optimization of {self.spec_name} (seed {self.seed}): SLO {k} TTFT {slo}, "
                 f"allowed quality drop {self.max_quality_drop:g}", ""]
        lines.append(f"  {'candidate':<28} {'strat':<8} {'k':>2} {'dens':>5} {'tok':>5} {'cold':>6} {'warm':>6} "
                     f"{'scr':>5} {'n':>4} {'quality':>7} {'bounds':>15}  verdict")
        df = self.candidates.sort_values(["race_n", "screen_quality"], ascending=[False, False], na_position="last")
        for r in df.itertuples():
            mark = "*" if r.is_winner else ("B" if r.is_baseline else ("F" if r.finalist else " "))
            bounds = "" if r.diff_lower is None or r.diff_lower != r.diff_lower else \
                f"[{format_number(r.diff_lower, '+.2f')},{format_number(r.diff_upper, '+.2f')}]"
            why = r.decision or r.notes or r.verdict
            lines.append(f"{mark} {r.candidate_id[:28]:<28} {r.strategy:<8} {r.k:>2} {format_number(r.semantic_density, '.2f'):>5} "
                         f"{format_number(r.total_tokens, '.0f'):>5} {format_number(r.ttft_cold_ms, '.0f'):>6} {format_number(r.ttft_warm_ms, '.0f'):>6} "
                         f"{format_number(r.screen_quality, '.2f'):>5} {r.race_n:>4} {format_number(r.quality, '.3f'):>7} {bounds:>15}  "
                         f"{why[:90]}")
        lines += ["  (* winner, B baseline, F finalist; cold/warm: predicted TTFT in ms; scr: screen quality; "
                  "n, quality: certify records raced; bounds: anytime-valid bounds on the difference from the baseline)",
                  f"  expected TTFT: {self.warm_share:.0%} of requests warm ({self.warm_share_source}); predictions "
                  f"closer than {self.ttft_resolution:.0%} tie", ""]
        if self.plan is not None:
            lines += [f"Plan: {self.plan.sentence()}", ""]
        lines += _section(
            "Cache trade-off (screen quality; predicted TTFT cold -> warm)", self.tradeoff,
            lambda r: f"{r.strategy:<8} k={r.k:<2} quality {format_number(r.screen_quality, '.3f')} "
                      f"({r.screened} of {r.candidates} screened)  "
                      f"{format_number(r.ttft_cold_ms, '.0f')} -> {format_number(r.ttft_warm_ms, '.0f')} ms "
                      f"(cached {format_number(r.warm_cached_tokens, '.0f')} of {format_number(r.total_tokens, '.0f')} tokens)",
        )
        lines += _section(
            "Quality vs semantic density (instruction variants, screen records)", self.density_curve,
            lambda r: f"density {r.semantic_density:.3f}  tokens {r.instruction_tokens:>5.0f}  quality "
                      f"{format_number(r.quality, '.3f')}  best {format_number(r.best_quality, '.3f')}  {r.variant}{'  <- peak' if r.peak else ''}",
        )
        lines += _section(
            "Output format on screen records (valid-JSON rate)", self.formats,
            lambda r: f"{r.format:<17} valid {format_number(r.valid_json_rate, '.3f')}  quality {format_number(r.quality, '.3f')}"
                      f"{'  <- published' if r.chosen else ''}",
        )
        lines.append(f"{'':<22} {'baseline':>12} {'winner':>12}")
        for key, label, fmt in (
            ("dev_mean", "dev quality", ".3f"), ("test_mean", "test quality", ".3f"),
            ("test_ci_low", "  test CI low", ".3f"), ("test_ci_high", "  test CI high", ".3f"),
            ("test_n", "  test records", "d"),
            ("ttft_cold_ms", "pred. TTFT cold ms", ".0f"), ("ttft_warm_ms", "pred. TTFT warm ms", ".0f"),
            ("test_valid_json_rate", "test valid JSON", ".3f"), ("total_tokens", "prompt tokens", ".0f"),
            ("max_tokens", "max_tokens", "d"),
        ):
            lines.append(f"  {label:<20} {format_number(self.baseline.get(key), fmt):>12} {format_number(self.winner.get(key), fmt):>12}")
        lines.append(f"  {'test diff [95% CI]':<20} {'':>12} {format_number(self.winner.get('test_diff_mean'), '+.3f'):>12} "
                     f"[{format_number(self.winner.get('test_diff_ci_low'), '+.3f')}, {format_number(self.winner.get('test_diff_ci_high'), '+.3f')}]")
        if self.verification.get("test_stop"):
            lines.append(f"  test split: {self.verification['test_stop']}")
        lines += self._timing_lines()
        tb = self.token_budget
        lines += [
            "",
            f"Winner: {self.winner_id}{' (baseline kept)' if self.kept_baseline else ''}",
            f"  {self.reason}",
            f"  max_tokens {tb.max_tokens} = ceil(p95 {tb.p95_tokens:.1f} x {1 + tb.headroom:.2f}); "
            f"truncation rate {tb.truncation_rate:.3f}",
            f"  LM calls {self.lm_calls} of {self.budget.max_lm_calls}"
            + (f" ({self.real_lm_calls} not in the cache)" if self.real_lm_calls is not None else "")
            + f"; tokens processed {self.prompt_tokens} prompt + {self.completion_tokens} completion"
            + f"; TTFT timing requests {self.timing_requests}, {self.minutes:.1f} min"
            + (f"; stopped: {self.stop_reason}" if self.stop_reason else ""),
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _timing_lines(self) -> list[str]:
        """Measured against predicted TTFT on the timed test records, per side, and the
        measured difference with its interval (a kept baseline: one measurement, once)."""
        b, w = self.baseline, self.winner
        if b.get("measured_cold_ms") is None:
            return []
        how = (f"{format_number(b.get('timing_n'), 'd')} test records x {format_number(b.get('timing_repeats'), 'd')} repeats"
               + ("" if self.kept_baseline else ", baseline and winner interleaved"))
        lines = ["", f"TTFT on the engine ({how}; predicted for the same prompts)"]
        rows = [(f"{kind} {cache}", f"{kind}_{cache}_ms", ".0f") for cache in ("cold", "warm", "expected")
                for kind in ("measured", "predicted")]
        rows += [("static prefix cached", "static_cached_share", ".0%"),
                 ("  predicted", "static_cached_share_predicted", ".0%")]
        if self.kept_baseline:
            lines.append(f"  {'':<22} {'baseline (kept)':>15}")
            lines += [f"  {label:<22} {format_number(b.get(key), fmt):>15}" for label, key, fmt in rows]
            return lines
        lines.append(f"  {'':<22} {'baseline':>10} {'winner':>10}   winner - baseline [95% CI]")
        for label, key, fmt in rows:
            diff = ""
            if key.startswith("measured_"):
                d = key.removesuffix("_ms") + "_diff"
                diff = (f"   {format_number(w.get(d + '_ms'), '+.0f')} [{format_number(w.get(d + '_low_ms'), '+.0f')}, "
                        f"{format_number(w.get(d + '_high_ms'), '+.0f')}]")
            lines.append(f"  {label:<22} {format_number(b.get(key), fmt):>10} {format_number(w.get(key), fmt):>10}{diff}")
        if w.get("timing_interval"):
            lines.append(f"  (difference: {w['timing_interval']}; static prefix cached: cached tokens of a warm "
                         "request over the static prefix's tokens)")
        return lines

    # ------------------------------------------------------------------ output
    def to_json(self) -> dict[str, Any]:
        """Everything but the tables, as plain JSON (NaN as None)."""
        return json_safe({
            "spec": self.spec_name, "seed": self.seed, "winner_id": self.winner_id, "reason": self.reason,
            "kept_baseline": self.kept_baseline, "content": self.content, "baseline": self.baseline,
            "winner": self.winner, "token_budget": self.token_budget.to_dict(), "metrics": self.metrics(),
            "lm_calls": self.lm_calls, "real_lm_calls": self.real_lm_calls, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "timing_requests": self.timing_requests,
            "minutes": self.minutes, "stop_reason": self.stop_reason, "verification": self.verification,
            "notes": self.notes, "plan": asdict(self.plan) if self.plan else None,
            "plan_text": self.plan.sentence() if self.plan else None, "warm_share": self.warm_share,
            "warm_share_source": self.warm_share_source, "ttft_resolution": self.ttft_resolution,
            "ttft_kind": self.ttft_kind, "max_quality_drop": self.max_quality_drop, "splits": self.splits,
            "label_free_records": len(self.references),
            "selection": self.selection.to_dict() if self.selection is not None else None,
            "provenance": self.provenance,
        })

    def write(self, folder: str | os.PathLike[str]) -> dict[str, Path]:
        """Write the tables (Parquet), ``result.json`` and ``pareto.png`` into ``folder``."""
        folder = Path(folder)
        paths: dict[str, Path] = {}
        for name in ("candidates", "pareto", "density_curve", "tradeoff", "formats", "timing"):
            frame: pd.DataFrame = getattr(self, name)
            if name != "candidates" and frame.empty:
                continue
            paths[name] = write_parquet(folder / f"{name}.parquet", frame)
        if self.references:  # what label-free records were scored against, published with the run
            refs = pd.DataFrame({"record_id": list(self.references),
                                 "reference": [json.dumps(v, ensure_ascii=False) for v in self.references.values()]})
            paths["references"] = write_parquet(folder / "references.parquet", refs)
        paths["result"] = write_json(folder / "result.json", self.to_json())
        paths["plot"] = atomic_write(folder / "pareto.png", lambda p: plot_pareto(self, p))
        return paths

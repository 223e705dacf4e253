"""What an optimization run produced: the template to publish, the figures, the tables.

``OptimizationResult.write(folder)`` writes, each atomically (temp file, then rename):

* ``candidates.parquet``: the full candidate log (one row per candidate: prompt shape,
  predicted TTFT cold/warm, rung, dev quality with CI, paired lower bound, verdict);
* ``pareto.parquet``, ``density_curve.parquet``, ``formats.parquet``, ``timing.parquet``;
* ``result.json``: the template content, baseline and winner figures, the reason,
  token budget, call counts and provenance;
* ``pareto.png``: the Pareto front with the baseline and the winner marked.

``publish(registry)`` stores the template with its provenance and metrics.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

__all__ = ["OptimizationResult"]


def _atomic_write(path: Path, write: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _num(value: Any, fmt: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return format(value, fmt)


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
    ttft_kind: str = "warm"
    slo_ttft_ms: float | None = None
    max_quality_drop: float = 0.0

    # ------------------------------------------------------------------ figures
    def metrics(self) -> dict[str, Any]:
        """Flat metrics for the registry: baseline_* and winner_* figures plus run counts."""
        out: dict[str, Any] = {}
        for who, figs in (("baseline", self.baseline), ("winner", self.winner)):
            out.update({f"{who}_{k}": v for k, v in figs.items() if not isinstance(v, (dict, list))})
        out.update({
            "max_tokens": self.token_budget.max_tokens, "truncation_rate": self.token_budget.truncation_rate,
            "kept_baseline": self.kept_baseline, "lm_calls": self.lm_calls, "real_lm_calls": self.real_lm_calls,
            "timing_requests": self.timing_requests, "minutes": round(self.minutes, 3),
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
                     f"{'n':>3} {'quality':>7} {'CI':>13} {'lowb':>6}  verdict")
        df = self.candidates.sort_values(["complete", "quality"], ascending=[False, False], na_position="last")
        for r in df.itertuples():
            mark = "*" if r.is_winner else ("B" if r.is_baseline else ("P" if r.pareto else " "))
            ci = f"[{_num(r.ci_low, '.2f')},{_num(r.ci_high, '.2f')}]"
            lines.append(f"{mark} {r.candidate_id[:28]:<28} {r.strategy:<8} {r.k:>2} {_num(r.semantic_density, '.2f'):>5} "
                         f"{_num(r.total_tokens, '.0f'):>5} {_num(r.ttft_cold_ms, '.0f'):>6} {_num(r.ttft_warm_ms, '.0f'):>6} "
                         f"{r.n_dev:>3} {_num(r.quality):>7} {ci:>13} {_num(r.diff_lower, '+.2f'):>6}  {r.verdict[:60]}")
        lines += ["  (* winner, B baseline, P on the Pareto front; cold/warm: predicted TTFT in ms; "
                  "lowb: paired lower bound vs baseline)", ""]
        lines += _section(
            "Cache trade-off (minibatch quality; predicted TTFT cold -> warm)", self.tradeoff,
            lambda r: f"{r.strategy:<8} k={r.k:<2} quality {_num(r.minibatch_quality)}  "
                      f"{_num(r.ttft_cold_ms, '.0f')} -> {_num(r.ttft_warm_ms, '.0f')} ms "
                      f"(cached {_num(r.warm_cached_tokens, '.0f')} of {_num(r.total_tokens, '.0f')} tokens)",
        )
        lines += _section(
            "Quality vs semantic density (instruction variants, minibatch)", self.density_curve,
            lambda r: f"density {r.semantic_density:.3f}  tokens {r.instruction_tokens:>5.0f}  quality "
                      f"{_num(r.quality)}  best {_num(r.best_quality)}  {r.variant}{'  <- peak' if r.peak else ''}",
        )
        lines += _section(
            "Output format on dev (valid-JSON rate)", self.formats,
            lambda r: f"{r.format:<17} valid {_num(r.valid_json_rate)}  quality {_num(r.quality)}"
                      f"{'  <- published' if r.chosen else ''}",
        )
        lines.append(f"{'':<22} {'baseline':>12} {'winner':>12}")
        for key, label, fmt in (
            ("dev_mean", "dev quality", ".3f"), ("test_mean", "test quality", ".3f"),
            ("test_ci_low", "  test CI low", ".3f"), ("test_ci_high", "  test CI high", ".3f"),
            ("ttft_cold_ms", "pred. TTFT cold ms", ".0f"), ("ttft_warm_ms", "pred. TTFT warm ms", ".0f"),
            ("measured_cold_ms", "meas. TTFT cold ms", ".0f"), ("measured_warm_ms", "meas. TTFT warm ms", ".0f"),
            ("test_valid_json_rate", "test valid JSON", ".3f"), ("total_tokens", "prompt tokens", ".0f"),
            ("max_tokens", "max_tokens", "d"),
        ):
            lines.append(f"  {label:<20} {_num(self.baseline.get(key), fmt):>12} {_num(self.winner.get(key), fmt):>12}")
        lines.append(f"  {'equivalence vs base':<20} {'':>12} {_num(self.winner.get('test_equivalence')):>12}")
        tb = self.token_budget
        lines += [
            "",
            f"Winner: {self.winner_id}{' (baseline kept)' if self.kept_baseline else ''}",
            f"  {self.reason}",
            f"  max_tokens {tb.max_tokens} = ceil(p95 {tb.p95_tokens:.1f} x {1 + tb.headroom:.2f}); "
            f"truncation rate on dev {tb.truncation_rate:.3f}",
            f"  LM calls {self.lm_calls} of {self.budget.max_lm_calls}"
            + (f" ({self.real_lm_calls} not in the cache)" if self.real_lm_calls is not None else "")
            + f", TTFT timing requests {self.timing_requests}, {self.minutes:.1f} min"
            + (f"; stopped: {self.stop_reason}" if self.stop_reason else ""),
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    # ------------------------------------------------------------------ output
    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec_name, "seed": self.seed, "winner_id": self.winner_id, "reason": self.reason,
            "kept_baseline": self.kept_baseline, "content": self.content, "baseline": self.baseline,
            "winner": self.winner, "token_budget": self.token_budget.to_dict(), "lm_calls": self.lm_calls,
            "real_lm_calls": self.real_lm_calls, "timing_requests": self.timing_requests, "minutes": self.minutes,
            "stop_reason": self.stop_reason, "verification": self.verification, "notes": self.notes,
            "provenance": self.provenance,
        }

    def write(self, folder: str | os.PathLike[str]) -> dict[str, Path]:
        """Write the tables (Parquet), ``result.json`` and ``pareto.png`` into ``folder``."""
        folder = Path(folder)
        paths: dict[str, Path] = {}
        for name in ("candidates", "pareto", "density_curve", "tradeoff", "formats", "timing"):
            frame: pd.DataFrame = getattr(self, name)
            if name != "candidates" and frame.empty:
                continue
            paths[name] = _atomic_write(folder / f"{name}.parquet", lambda p, f=frame: f.to_parquet(p, index=False))
        text = json.dumps(self.to_json(), indent=2, sort_keys=True, default=str)
        paths["result"] = _atomic_write(folder / "result.json", lambda p: Path(p).write_text(text + "\n", encoding="utf-8"))
        paths["plot"] = self.plot(folder / "pareto.png")
        return paths

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """The Pareto front PNG (see ``plot.py``)."""
        from promptdistill.optimize.plot import plot_pareto

        return _atomic_write(Path(path), lambda p: plot_pareto(self, p))

    def publish(self, registry: Any, *, labels: tuple[str, ...] = ("candidate",), actor: str | None = None,
                parent: int | None | str = "auto") -> Any:
        """Publish ``content`` with provenance and metrics; returns the ``VersionRecord``.

        Args:
            registry: a ``promptdistill.registry.Registry``.
            labels: labels to point at the new version.
            actor: who publishes (default: ``$PROMPTDISTILL_ACTOR`` or user@host).
            parent: a version number, None, or 'auto': the version labelled production,
                else the latest version, else None.
        """
        if parent == "auto":
            parent = None
            versions = registry.versions(self.spec_name)
            if versions:
                parent = registry.labels(self.spec_name).get("production", versions[-1])
        reason = ("baseline kept: " if self.kept_baseline else f"optimized ({self.winner_id}): ") + self.reason
        return registry.publish(self.spec_name, self.content, parent=parent, provenance=self.provenance,
                                metrics=_json_safe(self.metrics()), labels=labels, actor=actor, reason=reason[:500])


def _json_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in values.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and v != v:
            v = None
        out[k] = v
    return out

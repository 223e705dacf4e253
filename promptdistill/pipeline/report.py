"""The nightly pipeline's summaries and reports: rows, tables and markdown (pure).

One summary row per spec, with the same columns whether the spec was optimized,
served from the cache, or failed (then ``status`` is ``failed`` and ``error`` says why).
The flows turn the rows into Prefect table/markdown artifacts and Parquet run logs; the
CLI prints :func:`format_summary_table`.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from promptdistill.core.display import format_number, text_table

__all__ = [
    "SUMMARY_COLUMNS",
    "artifact_key",
    "comparison_rows",
    "done_line",
    "endpoint_load_rows",
    "failed_row",
    "format_ci",
    "format_summary_table",
    "format_ttft",
    "format_ttft_diff",
    "image_markdown",
    "markdown_table",
    "nightly_report_markdown",
    "png_data_uri",
    "spec_report_markdown",
    "summary_frame",
    "summary_row",
    "ttft_model_line",
    "ttft_report_markdown",
    "ttft_score_rows",
    "version_label",
]

SUMMARY_COLUMNS = (
    "template", "status",
    "tokens_before", "tokens_after", "instruction_tokens_before", "instruction_tokens_after",
    "ttft_ms_before", "ttft_ms_after", "ttft_cold_ms_before", "ttft_cold_ms_after",
    "ttft_warm_ms_before", "ttft_warm_ms_after",
    "ttft_ms_predicted_before", "ttft_ms_predicted_after", "ttft_cold_ms_predicted_before",
    "ttft_cold_ms_predicted_after", "ttft_warm_ms_predicted_before", "ttft_warm_ms_predicted_after",
    "static_cached_share_before", "static_cached_share_after",
    "ttft_diff_ms", "ttft_diff_low_ms", "ttft_diff_high_ms", "ttft_timing", "kept_baseline", "clause",
    "quality_before", "quality_before_low", "quality_before_high",
    "quality_after", "quality_after_low", "quality_after_high",
    "valid_json_rate_before", "valid_json_rate_after",
    "latency", "load_ttft_ms_predicted_before", "load_ttft_ms_predicted_after", "sustainable_rps_before",
    "sustainable_rps_after", "load_ttft_ms_before", "load_ttft_ms_after", "load_diff_ms", "load_diff_low_ms",
    "load_diff_high_ms",
    "gate_passed", "gate_reason", "test_n", "race_n", "diff_lower", "plan", "warm_share", "warm_share_source",
    "lm_calls", "tokens_processed", "minutes",
    "version", "labels", "promotion", "cached", "run_key", "error",
)
"""Every summary row has exactly these keys (missing figures are None)."""


def summary_row(template: str, figures: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """One spec's row: ``figures`` (the optimizer's numbers) plus run fields (status, version...).

    Unknown keys are refused so a renamed figure cannot silently become an empty column.

    Raises:
        KeyError: naming the unknown keys.
    """
    values = {**dict(figures), **fields}
    unknown = sorted(set(values) - set(SUMMARY_COLUMNS))
    if unknown:
        raise KeyError(f"summary row for {template!r}: unknown column(s) {unknown}; known: {list(SUMMARY_COLUMNS)}")
    row = {c: None for c in SUMMARY_COLUMNS}
    row.update(values)
    row["template"] = template
    row["status"] = row["status"] or "optimized"
    row["cached"] = bool(row["cached"])
    if isinstance(row["labels"], (list, tuple)):
        row["labels"] = ",".join(row["labels"])
    return row


def failed_row(template: str, error: str, **fields: Any) -> dict[str, Any]:
    """The row of a spec whose work failed: every figure None, the error kept."""
    return summary_row(template, {}, status="failed", error=error, **fields)


def summary_frame(rows: Iterable[Mapping[str, Any]]) -> Any:
    """The rows as a DataFrame with the fixed columns, in order (for Parquet run logs)."""
    return pd.DataFrame([{c: r.get(c) for c in SUMMARY_COLUMNS} for r in rows], columns=list(SUMMARY_COLUMNS))


def endpoint_load_rows(before: Mapping[str, Mapping[str, float] | None],
                       after: Mapping[str, Mapping[str, float] | None], seconds: float) -> list[dict[str, Any]]:
    """Each endpoint's share of a run's work, from two ``endpoint_load()`` snapshots (the
    server's own counters, so every client of the server counts): requests, tokens,
    requests per second and the endpoint's share of the requests. An endpoint missing from
    either snapshot shows ``None`` (it did not answer)."""
    deltas = {url: None if before.get(url) is None or after.get(url) is None
              else {k: after[url][k] - before[url][k] for k in after[url]} for url in after}
    total = sum(d["requests"] for d in deltas.values() if d is not None)
    rows = []
    for url, d in deltas.items():
        if d is None:
            rows.append({"endpoint": url, "requests": None, "prompt_tokens": None, "generation_tokens": None,
                         "requests_per_s": None, "share": None})
            continue
        rows.append({"endpoint": url, "requests": int(d["requests"]), "prompt_tokens": int(d["prompt_tokens"]),
                     "generation_tokens": int(d["generation_tokens"]),
                     "requests_per_s": d["requests"] / seconds if seconds > 0 else None,
                     "share": d["requests"] / total if total > 0 else None})
    return rows


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key: lowercase letters, digits and dashes (``ticket-triage-report``).

    Keys are stable across runs, so the UI shows one history per key across nights.
    """
    key = "-".join(re.sub(r"[^a-z0-9]+", "-", str(p).lower()).strip("-") for p in parts if str(p).strip())
    key = re.sub(r"-+", "-", key).strip("-")
    if not key:
        raise ValueError(f"artifact key from {parts!r} is empty")
    return key


# ---------------------------------------------------------------- formatting
# A figure is shown by core.display.format_number, here as in the terminal and the night report.
def _arrow(before: Any, after: Any, spec: str = ".0f") -> str:
    return f"{format_number(before, spec)} -> {format_number(after, spec)}"


def format_ttft(row: Mapping[str, Any], key: str = "ttft_ms") -> str:
    """Measured TTFT ``before -> after``; a kept baseline was timed once: ``387 (kept)``."""
    if row.get("kept_baseline"):
        return f"{format_number(row.get(f'{key}_before'))} (kept)"
    return _arrow(row.get(f"{key}_before"), row.get(f"{key}_after"))


def format_ttft_diff(row: Mapping[str, Any]) -> str:
    """The measured TTFT difference (winner - baseline) with its interval: ``-107 ms [-120, -95]``."""
    if row.get("kept_baseline"):
        return "none: the baseline was kept (one prompt, timed once)"
    if format_number(row.get("ttft_diff_ms")) == "-":
        return "-"
    interval = "" if format_number(row.get("ttft_diff_low_ms")) == "-" else \
        f" [{format_number(row['ttft_diff_low_ms'], '+.0f')}, {format_number(row['ttft_diff_high_ms'], '+.0f')}]"
    return f"{format_number(row['ttft_diff_ms'], '+.0f')} ms{interval}"


def format_ci(mean: Any, low: Any, high: Any) -> str:
    """``0.812 [0.770, 0.850]``; the mean alone when a bound is missing, ``-`` without a mean."""
    if format_number(mean) == "-":
        return "-"
    if format_number(low) == "-" or format_number(high) == "-":
        return f"{mean:.3f}"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def version_label(row: Mapping[str, Any]) -> str:
    """``name:3 (candidate,production)``, or ``-`` when nothing was published."""
    if format_number(row.get("version")) == "-":
        return "-"
    labels = f" ({row['labels']})" if row.get("labels") else ""
    return f"{row['template']}:{int(row['version'])}{labels}"


_SUMMARY_HEADER = ("template", "status", "tokens", "TTFT ms", "quality", "published")


def _summary_cells(r: Mapping[str, Any]) -> tuple[str, ...]:
    """One spec's cells of the night's summary (``_SUMMARY_HEADER``): the terminal table and the markdown report."""
    return (str(r["template"]), str(r["status"]) + (" (cached)" if r.get("cached") else ""),
            _arrow(r.get("tokens_before"), r.get("tokens_after")), format_ttft(r),
            _arrow(r.get("quality_before"), r.get("quality_after"), ".3f"), version_label(r))


def format_summary_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table: template, tokens, TTFT (measured), quality before -> after, version."""
    lines = [text_table(_SUMMARY_HEADER, [_summary_cells(r) for r in rows], rule=True)]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['template']}: FAILED: {r['error']}")
    return "\n".join(lines)


def done_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """``3 of 4 specs done, 1 failed.``: the night's first line, in the markdown and the HTML report."""
    failed = sum(r["status"] == "failed" for r in rows)
    return f"{len(rows) - failed} of {len(rows)} specs done" + (f", {failed} failed." if failed else ".")


def comparison_rows(r: Mapping[str, Any], kind: str = "expected") -> list[tuple[str, str, str]]:
    """One spec's figures as (what, baseline, winner) text, for the markdown report and the
    night report: quality with its 95% CI; TTFT cold, warm and ``kind``, measured and
    predicted, and the static prefix's cached share (a kept baseline's one measurement is
    not shown twice); tokens; the valid-JSON rate."""
    ttft = []
    for label, key in (("cold", "ttft_cold_ms"), ("warm", "ttft_warm_ms"), (kind, "ttft_ms")):
        predicted = "ttft_ms_predicted" if key == "ttft_ms" else f"{key}_predicted"
        ttft += [(f"TTFT {label}, measured (ms)", format_number(r.get(f"{key}_before")),
                  format_number(r.get(f"{key}_after"))),
                 (f"TTFT {label}, predicted (ms)", format_number(r.get(f"{predicted}_before")),
                  format_number(r.get(f"{predicted}_after")))]
    ttft.append(("static prefix cached when warm", format_number(r.get("static_cached_share_before"), ".0%"),
                 format_number(r.get("static_cached_share_after"), ".0%")))
    latency = r.get("latency") or ""
    if " at " in latency:  # a declared load: its percentile, predicted and measured, and the sustainable rate
        diff = r.get("load_diff_ms")
        measured_after = format_number(r.get("load_ttft_ms_after"))
        if diff is not None:
            measured_after += (f" ({format_number(diff, '+.0f')} [{format_number(r.get('load_diff_low_ms'), '+.0f')}, "
                               f"{format_number(r.get('load_diff_high_ms'), '+.0f')}])")
        ttft += [(f"{latency}, measured (ms)", format_number(r.get("load_ttft_ms_before")), measured_after),
                 (f"{latency}, predicted (ms)", format_number(r.get("load_ttft_ms_predicted_before")),
                  format_number(r.get("load_ttft_ms_predicted_after"))),
                 ("sustainable rate at slo.ttft_ms, predicted (req/s)", format_number(r.get("sustainable_rps_before"), ".2f"),
                  format_number(r.get("sustainable_rps_after"), ".2f"))]
    if r.get("kept_baseline"):
        ttft = [(k, b, "same prompt (kept)") for k, b, _a in ttft]
    return [("quality, 95% CI" + (f" ({format_number(r.get('test_n'))} test records)" if r.get("test_n") else ""),
             format_ci(r.get("quality_before"), r.get("quality_before_low"), r.get("quality_before_high")),
             format_ci(r.get("quality_after"), r.get("quality_after_low"), r.get("quality_after_high"))),
            *ttft,
            ("prompt tokens", format_number(r.get("tokens_before")), format_number(r.get("tokens_after"))),
            ("instruction tokens", format_number(r.get("instruction_tokens_before")),
             format_number(r.get("instruction_tokens_after"))),
            ("valid-JSON rate", format_number(r.get("valid_json_rate_before"), ".1%"),
             format_number(r.get("valid_json_rate_after"), ".1%"))]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]], *, right: Sequence[int] = ()) -> list[str]:
    """A markdown table's lines; the columns numbered in ``right`` are right-aligned (figures)."""
    rule = "|" + "".join("---:|" if i in right else "---|" for i in range(len(header)))
    return [f"| {' | '.join(header)} |", rule, *(f"| {' | '.join(row)} |" for row in rows)]


def png_data_uri(data: bytes) -> str:
    """A PNG as a data URI: the reports embed their figures, so they open offline and in the Prefect UI."""
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _plots_markdown(plots: Mapping[str, str | Path | None]) -> list[str]:
    """A section per plot (None: not made, left out)."""
    return [line for alt, path in plots.items() if path is not None
            for line in ("", f"## {alt}", "", image_markdown(path, alt))]


def image_markdown(path: str | Path | None, alt: str, *, max_bytes: int = 400_000) -> str:
    """A PNG embedded as a data URI (the Prefect UI shows it), or its path when too big."""
    if path is None:
        return ""
    p = Path(path)
    if not p.is_file():
        return f"_{alt}: not produced ({p})_"
    data = p.read_bytes()
    if len(data) > max_bytes:
        return f"{alt}: `{p}` ({len(data) // 1024} KiB)"
    return f"![{alt}]({png_data_uri(data)})"


def spec_report_markdown(row: Mapping[str, Any], *, kind: str = "expected", plots: Mapping[str, str | Path | None] = {},
                         links: Mapping[str, str] = {}) -> str:
    """One spec's report: baseline against winner (``kind``: the TTFT the optimizer weighed), the decision, the plots."""
    r = row
    lines = [f"# {r['template']}: baseline vs winner", ""]
    if r["status"] == "failed":
        return "\n".join(lines + [f"**Failed:** {r['error']}"])
    lines += [
        *markdown_table(("", "baseline", "winner"), comparison_rows(r, kind), right=(1, 2)),
        "",
        f"- measured TTFT difference (winner - baseline): {format_ttft_diff(r)}"
        + (f" ({r['ttft_timing']})" if r["ttft_timing"] else ""),
        f"- gate: **{'passed' if r['gate_passed'] else 'not passed'}**" + (f" (clause: {r['clause']})" if r.get("clause") else "")
        + (f": {r['gate_reason']}" if r["gate_reason"] else ""),
        f"- published: {version_label(r)}" + (f"; {r['promotion']}" if r["promotion"] else ""),
        f"- cost: {format_number(r['lm_calls'])} LM calls, {format_number(r['minutes'], '.1f')} minutes"
        + (" (served from the cache of an earlier run)" if r["cached"] else ""),
    ]
    lines += [f"- {name}: `{url}`" for name, url in links.items()]
    return "\n".join(lines + _plots_markdown(plots))


def nightly_report_markdown(
    rows: Sequence[Mapping[str, Any]], *, ttft: Mapping[str, Any] | None = None, run_id: str = "", registry_root: str = ""
) -> str:
    """The night's report: the summary across specs, what was published, what failed."""
    failed = [r for r in rows if r["status"] == "failed"]
    lines = [f"# Nightly prompt optimization{f' ({run_id})' if run_id else ''}", "", done_line(rows)]
    if ttft:
        lines.append(ttft_model_line(ttft))
    lines += ["", *markdown_table(_SUMMARY_HEADER, map(_summary_cells, rows))]
    if failed:
        lines += ["", "## Failed", ""] + [f"- **{r['template']}**: {r['error']}" for r in failed]
    published = [r for r in rows if r["version"] is not None]
    if published:
        lines += ["", "## Registry versions", ""]
        lines += [f"- `{r['template']}:{r['version']}` labels: {r['labels'] or '-'}; {r['promotion'] or ''}" for r in published]
        if registry_root:
            lines.append(f"\nRegistry: `{registry_root}`; load with `Templates({registry_root!r}).get('NAME@production')`.")
    return "\n".join(lines)


# ------------------------------------------------------------------- TTFT model
def ttft_model_line(ttft: Mapping[str, Any]) -> str:
    """The run's TTFT model in one line: its state (``pipeline.ttft_models.TTFT_STATES``:
    fresh, refreshed, stale, none), its registry version and why.

    Example:
        >>> ttft_model_line({"state": "stale", "version": 3, "reason": "refresh FAILED (...)"})
        'TTFT model: stale (version 3): refresh FAILED (...)'
    """
    state = ttft.get("state") or ("refreshed" if ttft.get("refreshed") else "fresh")
    version = f" (version {ttft['version']})" if ttft.get("version") is not None and state != "none" else ""
    return f"TTFT model: {state}{version}: {ttft.get('reason', '')}"


def ttft_score_rows(fit: Any) -> list[dict[str, Any]]:
    """One row per TTFT model candidate: CV and held-out scores, monotonicity, chosen."""
    rows = []
    for name in fit.cv:
        row: dict[str, Any] = {"model": name, "chosen": name == fit.chosen, "monotonic": bool(fit.monotonic.get(name))}
        row.update({f"cv_{k}": v for k, v in fit.cv[name].items()})
        row.update({f"heldout_{k}": v for k, v in fit.heldout.get(name, {}).items()})
        rows.append(row)
    return sorted(rows, key=lambda r: (not r["chosen"], r["model"]))


def ttft_report_markdown(model: Any, fit: Any, record: Any, plots: Mapping[str, str | Path | None] = {}) -> str:
    """The refreshed TTFT model: what was measured, how well each candidate predicts, the plots."""
    ident = model.engine_identity
    held = fit.heldout.get(model.name, {})
    lines = [
        f"# TTFT model for engine `{ident.key()}`",
        "",
        f"- engine: {ident.model}, {ident.backend}, {ident.dtype}, max_model_len {ident.max_model_len}, "
        f"{ident.hardware}, {ident.engine_version}",
        f"- chosen: **{model.name}** (registry artifact version {record.version}, model {model.version})",
        f"- data: {model.training.get('rows', '-')} measurements, {model.training.get('prompts', '-')} prompts",
        "- held-out: " + (", ".join(f"{k} {v:.3g}" for k, v in held.items()) or "-"),
        "",
        *markdown_table(("model", "chosen", "monotonic", "CV MAPE", "held-out MAPE", "held-out R²"), (
            (r["model"], "yes" if r["chosen"] else "", "yes" if r["monotonic"] else "no",
             format_number(r.get("cv_mape"), ".1%"), format_number(r.get("heldout_mape"), ".1%"),
             format_number(r.get("heldout_r2"), ".3f")) for r in ttft_score_rows(fit)), right=(3, 4, 5)),
    ]
    return "\n".join(lines + _plots_markdown(plots))


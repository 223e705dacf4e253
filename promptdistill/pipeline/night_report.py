"""The night report: one self-contained HTML page per nightly run, built from stored files only.

What it reads (never an engine, never Prefect):

* the run logs in the registry: ``summary`` (one row per spec) and ``report`` (per
  spec: the baseline's and the published prompt's text, the optimizer's stage folder,
  and the TTFT model's status), written by the nightly's ``report-night`` task;
* each spec's optimizer folder (``result.json``, ``pareto.png``);
* the TTFT model's fit figure, stored with the model in the registry.

What it shows: the summary table on top; per spec, the published prompt beside the
baseline as a clause-level diff (:func:`promptdistill.specs.diff.prompt_diff`, re-exported
here), the decision and its numbers, the Pareto plot and the TTFT model's fit plot. CSS is inline and images are data URIs,
so the page opens offline. It is stored beside the run logs (``runs/<run_id>/report.html``);
``promptdistill report RUN_ID`` rebuilds it.
"""

from __future__ import annotations

import html
import json
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from promptdistill.core.display import format_number as _n
from promptdistill.core.errors import PromptDistillError, RegistryError
from promptdistill.core.jsonio import atomic_write, json_records
from promptdistill.pipeline.report import (
    comparison_rows,
    done_line,
    format_ttft,
    format_ttft_diff,
    png_data_uri,
    ttft_model_line,
    version_label,
)
from promptdistill.pipeline.stages import stage_dir
from promptdistill.pipeline.ttft_models import ttft_figure
from promptdistill.registry.store import Registry
from promptdistill.search.selection import SelectionRecord
from promptdistill.specs.datasets import dataset_for
from promptdistill.specs.diff import diff_counts, mark, prompt_diff
from promptdistill.specs.load import load_spec
from promptdistill.specs.prompt import build_system
from promptdistill.specs.render import unescape_braces

__all__ = ["REPORT_PART", "Night", "diff_counts", "latest_run_id", "load_night", "prompt_diff", "prompt_rows",
           "render_night_report", "write_night_report"]

REPORT_PART = "report"
"""Run log part holding what the report needs beyond the summary rows (prompt texts, folders)."""
REPORT_FILE = "report.html"


# ------------------------------------------------------------ what the run stores
def _baseline_prompt(result: Mapping[str, Any], folder: Path) -> tuple[str | None, str | None, str]:
    """The baseline's system and user text, re-rendered from the spec file the run used.

    Returns (system, user, note); None texts when the spec or dataset changed since.
    """
    spec_info = result.get("provenance", {}).get("spec", {})
    source = spec_info.get("source")
    if not source or not Path(source).is_file():
        return None, None, f"baseline not shown: spec file {source!r} not found"
    spec = load_spec(Path(source))
    if spec.spec_hash() != spec_info.get("spec_hash"):
        return None, None, f"baseline not shown: {source} changed since the run"
    base = pd.read_parquet(folder / "candidates.parquet")
    base = base[base["is_baseline"].astype(bool)]
    ids = json.loads(base["example_ids"].iloc[0]) if len(base) else []
    by_id = {str(r["id"]): r for r in dataset_for(spec).to_dict("records")} if ids else {}
    if any(i not in by_id for i in ids):
        return None, None, f"baseline not shown: {spec.dataset} no longer holds its examples"
    examples = [{"id": by_id[i]["id"], "inputs": by_id[i]["inputs"], "expected": by_id[i]["expected"]} for i in ids]
    return unescape_braces(build_system(spec, examples)), spec.user, f"baseline rendered from {source}"


def _optimize_folder(state_dir: str | Path, row: Mapping[str, Any]) -> Path:
    """The spec's optimizer folder of the run (its work key), where ``result.json`` and ``pareto.png`` are."""
    return stage_dir(state_dir, "optimize", str(row.get("run_key") or ""))


def _read_result(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "result.json").read_text(encoding="utf-8"))


def prompt_rows(rows: Sequence[Mapping[str, Any]], *, state_dir: str | Path, ttft: Mapping[str, Any]) -> pd.DataFrame:
    """The ``report`` run log: per spec, the folder and both prompts' text, read at run time.

    Stored with the run so the report can be rebuilt later even when a spec file changes.
    """
    out = []
    for r in rows:
        item: dict[str, Any] = {"template": r["template"], "folder": None, "baseline_system": None,
                                "baseline_user": None, "published_system": None, "published_user": None,
                                "prompt_note": "", "ttft_json": json.dumps(dict(ttft), default=str)}
        folder = _optimize_folder(state_dir, r)
        if r.get("run_key") and (folder / "result.json").is_file():
            result = _read_result(folder)
            content = result.get("content", {})
            item.update(folder=str(folder.resolve()), published_system=unescape_braces(content.get("system", "")),
                        published_user=content.get("user"))
            try:
                item["baseline_system"], item["baseline_user"], item["prompt_note"] = _baseline_prompt(result, folder)
            except (PromptDistillError, OSError, ValueError, KeyError) as e:
                item["prompt_note"] = f"baseline not shown: {type(e).__name__}: {e}"
        out.append(item)
    return pd.DataFrame(out, columns=["template", "folder", "baseline_system", "baseline_user", "published_system",
                                      "published_user", "prompt_note", "ttft_json"])


@dataclass
class Night:
    """Everything one report shows, read from the stored files."""

    run_id: str
    rows: list[dict[str, Any]]
    prompts: dict[str, dict[str, Any]]
    results: dict[str, dict[str, Any]]
    images: dict[str, dict[str, bytes]]
    """Per spec: {"pareto": PNG, "ttft": PNG} (missing ones left out)."""
    ttft: dict[str, Any]
    notes: list[str]


def load_night(registry: Registry, run_id: str, *, state_dir: str | Path) -> Night:
    """Read one run's report inputs: its run logs, its stage folders, the TTFT model's figure.

    Raises:
        RegistryError: the run has no ``summary`` run log.
    """
    rows = json_records(registry.read_run_log(run_id, part="summary"))
    notes: list[str] = []
    try:
        prompts = {p["template"]: p for p in json_records(registry.read_run_log(run_id, part=REPORT_PART))}
    except RegistryError:
        prompts = {}
        notes.append(f"no '{REPORT_PART}' run log: prompts are not shown (a run before the night report existed)")
    ttft = next((json.loads(p["ttft_json"]) for p in prompts.values() if p.get("ttft_json")), {})
    results: dict[str, dict[str, Any]] = {}
    images: dict[str, dict[str, bytes]] = {}
    fits: dict[tuple[str, str], bytes | None] = {}  # one figure per TTFT model, however many specs used it
    for r in rows:
        name = r["template"]
        folder = Path(prompts.get(name, {}).get("folder") or _optimize_folder(state_dir, r))
        if r["status"] == "failed" or not (folder / "result.json").is_file():
            if r["status"] != "failed":
                notes.append(f"{name}: stage folder {folder} is gone; its numbers come from the summary only")
            continue
        results[name] = _read_result(folder)
        images[name] = {}
        if (folder / "pareto.png").is_file():
            images[name]["pareto"] = (folder / "pareto.png").read_bytes()
        model = results[name].get("provenance", {}).get("ttft_model", {})
        ident = (model.get("engine_key"), model.get("version"))
        if all(ident) and ident not in fits:
            with tempfile.TemporaryDirectory() as tmp:  # ttft_figure writes a file; we only want its bytes
                path = ttft_figure(registry, ident[0], ident[1], tmp)
                fits[ident] = path.read_bytes() if path is not None else None
        if fits.get(ident):
            images[name]["ttft"] = fits[ident]
    return Night(run_id, rows, prompts, results, images, ttft, notes)


# ------------------------------------------------------------------------ the page
def _css() -> str:
    """The page's style sheet (inlined: the page opens offline), kept in a file of its own and
    read when a page is rendered, not when the flows import this module."""
    return resources.files("promptdistill.pipeline").joinpath("night_report.css").read_text(encoding="utf-8")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _img(data: bytes | None, alt: str, kind: str) -> str:
    if not data:
        return f'<p class="muted">{_e(alt)}: not available</p>'
    return f'<figure class="plot" data-plot="{kind}"><img src="{png_data_uri(data)}" alt="{_e(alt)}"><figcaption>{_e(alt)}</figcaption></figure>'


def _slug(name: str) -> str:
    return "spec-" + re.sub(r"[^a-z0-9_-]+", "-", name.lower())


def _summary_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("template", "status", "prompt tokens", "TTFT ms", "quality", "gate", "published")
    out = ["<table class='summary'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for r in rows:
        gate = "-" if r.get("gate_passed") is None else ("passed" if r["gate_passed"] else "not passed")
        out.append(
            f"<tr><td><a href='#{_slug(r['template'])}'>{_e(r['template'])}</a></td>"
            f"<td>{_e(r['status'])}{' (cached)' if r.get('cached') else ''}</td>"
            f"<td class='num'>{_n(r.get('tokens_before'))} → {_n(r.get('tokens_after'))}</td>"
            f"<td class='num'>{_e(format_ttft(r).replace(' -> ', ' → '))}</td>"
            f"<td class='num'>{_n(r.get('quality_before'), '.3f')} → {_n(r.get('quality_after'), '.3f')}</td>"
            f"<td>{gate}</td><td>{_e(version_label(r))}</td></tr>")
    return "\n".join(out + ["</table>"])


def _diff_html(before: str | None, after: str | None) -> tuple[str, str, dict[str, int]]:
    """(left, right, counts): the baseline with removals struck, the published text with additions marked."""
    if before is None:
        return '<span class="muted">(not available)</span>', _e(after), {}
    ops = prompt_diff(before, after or "")
    left = "".join(_e(o.before) if o.kind == "same" else _marked("del", o.kind, o.before)
                   for o in ops if o.kind != "added")
    right = "".join(_e(o.after) if o.kind == "same" else _marked("ins", o.kind, o.after)
                    for o in ops if o.kind != "removed")
    return left, right, diff_counts(ops)


def _marked(tag: str, kind: str, text: str) -> str:
    """``text`` escaped in ``<tag class=kind>``, its surrounding whitespace outside the tag."""
    return mark(text, f'<{tag} class="{kind}">', f"</{tag}>", escape=_e)


def _prompt_section(p: Mapping[str, Any], version: str) -> str:
    if not p or p.get("published_system") is None:
        return '<p class="muted">Prompts not available for this run.</p>'
    pairs = (("system", p.get("baseline_system"), p["published_system"]),
             ("user", p.get("baseline_user"), p.get("published_user")))
    if all(b is not None and not any(o.kind != "same" for o in prompt_diff(b, a or "")) for _, b, a in pairs):
        # The baseline was kept as written: one copy, full width, is easier to read than two.
        shown = "".join(f"<div class='small muted'>{t}</div><pre>{_e(a)}</pre>" for t, _, a in pairs)
        return (f"<p class='small'>Unchanged: the published prompt is the baseline, clause for clause. "
                f"<span class='muted'>{_e(p.get('prompt_note'))}</span></p><div class='same'>{shown}</div>")
    parts, totals = [], {"removed": 0, "added": 0, "rewritten": 0}
    for title, b, a in pairs:
        left, right, counts = _diff_html(b, a)
        totals = {k: totals[k] + counts.get(k, 0) for k in totals}
        parts.append(f"<div><div class='small muted'>{title} (baseline)</div><pre>{left}</pre></div>"
                     f"<div><div class='small muted'>{title} ({_e(version)})</div><pre>{right}</pre></div>")
    counts = ", ".join(f"{v} {k}" for k, v in totals.items())
    return (f"<p class='small'>Clauses: {counts}. <del class='removed'>struck</del>: removed; "
            f"<del class='rewritten'>old</del> → <ins class='rewritten'>new</ins>: rewritten; "
            f"<ins class='added'>green</ins>: added. <span class='muted'>{_e(p.get('prompt_note'))}</span></p>"
            f"<div class='diff'>{''.join(parts)}</div>")


def _numbers(r: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    kind = result.get("ttft_kind", "expected")
    table = ("<table class='numbers'><tr><th></th><th class='num'>baseline</th><th class='num'>published</th></tr>"
             + "".join(f"<tr><td>{_e(k)}</td><td class='num'>{_e(b)}</td><td class='num'>{_e(a)}</td></tr>" for k, b, a in comparison_rows(r, kind))
             + "</table>")
    d = (result.get("winner") or {}).get("decision") or {}
    bounds = ("not raced" if d.get("lower") is None else
              f"{d.get('verdict')}: difference from the baseline in [{_n(d.get('lower'), '+.3f')}, "
              f"{_n(d.get('upper'), '+.3f')}] after {_n(d.get('n'))} certify records (alpha {_n(d.get('alpha'), '.3g')})")
    selection = SelectionRecord.from_result(result) if result else None
    why = selection.reason if selection is not None else None
    gate = ("gate passed" if r.get("gate_passed") else "gate not passed") + (
        f" (clause: {selection.clause})" if selection is not None and selection.clause else "")
    if selection is not None and selection.reverted_from:
        gate += f"; {selection.reverted_from} ({selection.chosen_clause}) reverted on the test split"
    if r.get("gate_reason") and r["gate_reason"] != why:
        gate += f": {r['gate_reason']}"
    facts = [("decision", gate), ("why", why), ("certified bounds", bounds), ("record plan", r.get("plan") or "-"),
             (f"{kind} TTFT", f"{_n(r.get('warm_share'), '.0%')} of requests warm ({r.get('warm_share_source') or '-'})"),
             (f"measured {kind} TTFT, published - baseline", format_ttft_diff(r)
              + (f" ({r['ttft_timing']})" if r.get("ttft_timing") else "")),
             ("cost", f"{_n(r.get('lm_calls'))} LM calls, {_n(r.get('tokens_processed'))} tokens processed, "
                      f"{_n(r.get('minutes'), '.1f')} minutes" + (" (from the cache of an earlier run)" if r.get("cached") else "")),
             ("published", f"{version_label(r)}; {r.get('promotion') or ''}")]
    facts += [("note", n) for n in result.get("notes") or []]
    return table + "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts) + "</dl>"


def _spec_section(night: Night, r: Mapping[str, Any]) -> str:
    name, status = r["template"], str(r["status"])
    head = (f"<section class='spec' id='{_slug(name)}' data-spec='{_e(name)}'>"
            f"<h2>{_e(name)} <span class='badge {status.replace(' ', '-')}'>{_e(status)}</span></h2>")
    if status == "failed":
        return head + f"<pre class='error'>{_e(r.get('error'))}</pre></section>"
    result = night.results.get(name, {})
    images = night.images.get(name, {})
    version = f"v{int(r['version'])}" if r.get("version") is not None else "published"
    body = [f"<h3>Prompt: baseline and published ({_e(version)})</h3>", _prompt_section(night.prompts.get(name, {}), version),
            "<h3>Decision</h3>", _numbers(r, result),
            "<h3>Pareto front</h3>", _img(images.get("pareto"), "Pareto front: quality vs predicted TTFT, and the density curve", "pareto"),
            "<h3>TTFT model fit</h3>", _img(images.get("ttft"), "TTFT model: predicted vs measured (held-out prompts)", "ttft")]
    if r.get("error"):
        body.insert(0, f"<pre class='error'>{_e(r['error'])}</pre>")
    return head + "\n".join(body) + "</section>"


def render_night_report(night: Night) -> str:
    """The page (pure): summary table, then one section per spec."""
    ttft = night.ttft
    lead = [done_line(night.rows)]
    if ttft:
        lead.append(ttft_model_line(ttft))
    notes = "".join(f"<p class='muted small'>{_e(n)}</p>" for n in night.notes)
    return "\n".join([
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>Night report {_e(night.run_id)}</title><style>{_css()}</style></head><body>",
        f"<h1>Nightly prompt optimization</h1><p class='muted'>run {_e(night.run_id)}</p>",
        "".join(f"<p>{_e(x)}</p>" for x in lead), notes, _summary_table(night.rows),
        *(_spec_section(night, r) for r in night.rows), "</body></html>",
    ])


def write_night_report(registry: Registry, run_id: str, *, state_dir: str | Path) -> str:
    """Build the run's report and store it beside its run logs; returns where it is.

    A registry that is not a local folder also gets a local copy under
    ``<state_dir>/reports/`` (a browser opens files, not ``s3://`` URLs): that path is returned.
    """
    page = render_night_report(load_night(registry, run_id, state_dir=state_dir)).encode("utf-8")
    key = f"runs/{run_id}/{REPORT_FILE}"
    registry.backend.replace(key, page)
    url = registry.backend.url(key)
    if Path(url).is_file():
        return url
    local = atomic_write(Path(state_dir) / "reports" / f"{run_id}.html", page)  # never a half-written page
    return str(local.resolve())


def latest_run_id(registry: Registry, run_ids: Iterable[str] | None = None) -> str:
    """The newest run with a summary (run ids start with their UTC time).

    Raises:
        RegistryError: the registry holds no run.
    """
    ids = sorted(run_ids if run_ids is not None else registry.run_ids())
    for run_id in reversed(ids):
        try:
            registry.get_run_log(run_id, part="summary")
            return run_id
        except RegistryError:
            continue
    raise RegistryError(f"{registry.root}: no nightly run with a summary run log (runs/<run_id>/summary.parquet)")

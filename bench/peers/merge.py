"""One report from the JSON reports of separate runs (``--merge``): no LM call.

Runs made at different times share one table, each spec keeping the commit it was measured
at; one spec's peers may come from separate runs when ours agrees (``join_spec``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from bench.peers import PEERS
from bench.peers.goal import goal, ours_beside

__all__ = ["MERGE_KEYS", "OURS_PER_RUN", "SAME_OURS", "join_spec", "merge_reports", "peer_order"]


MERGE_KEYS = ("budget", "train", "dev", "test", "gepa_metric_calls", "num_threads", "max_bootstrapped_demos",
              "max_labeled_demos", "proposer_max_tokens", "timing_records", "seed", "mipro_auto", "gepa_auto",
              "dspy_version", "adapter")
"""What must agree for two runs' specs to share one table (the TTFT model may differ: it is
refitted as the engine's profile grows, and each spec records its own; the peers may differ:
a spec's peers can be measured in separate runs)."""

SAME_OURS = ("winner", "content", "test_mean", "test_n")
"""What two runs' ours sides must share for their peers to join one spec's table: the same
published template with the same test score (ours' decisions repeat exactly for a seed), so each
run's paired comparison is with the same ours."""

OURS_PER_RUN = ("ttft_cold_ms", "ttft_warm_ms", "computed_tokens", "search_tokens", "minutes", "lm_calls",
                "tokens_processed", "prompt_tokens_processed", "completion_tokens_processed", "verification_tokens")
"""Ours' figures that vary from run to run (timings, prefix-cache hits, a few completion tokens): a peer joined from
another run keeps them as measured beside it, and its goal is judged on them."""


def peer_order(kinds: Iterable[str]) -> list[str]:
    """Peers in ``PEERS``' order, then any other kind (an older report's) in the order met, each once."""
    kinds = list(dict.fromkeys(kinds))
    return [k for k in PEERS if k in kinds] + [k for k in kinds if k not in PEERS]


def run_of(row: Mapping[str, Any], side: Mapping[str, Any]) -> str:
    """The run a side was measured in: its own stamp when joined from another run, else its row's."""
    return f"{side.get('commit', row['commit'])} {side.get('timestamp', row['timestamp'])}"


def join_spec(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """One spec's row from two runs: the later run's sides, plus the earlier's peers it did not measure.

    The earlier peers are kept only when both runs' ours sides agree (``SAME_OURS``, and the
    split). Each kept peer side records the run it was measured in (commit, time, TTFT model)
    and ours' figures of that run (``OURS_PER_RUN``); the spec's minutes add up the runs its
    sides come from, each once. Returns the row, and the earlier peers dropped because ours
    differs, each with the commit it was measured at.
    """
    only_earlier = [k for k in earlier["comparisons"] if k not in later["comparisons"]]
    if not only_earlier:
        return dict(later), {}
    ours_a, ours_b = earlier["sides"]["ours"], later["sides"]["ours"]
    if earlier["split"] != later["split"] or any(ours_a.get(k) != ours_b.get(k) for k in SAME_OURS):
        return dict(later), {k: earlier["sides"][k].get("commit", earlier["commit"]) for k in only_earlier}
    ours_then = {k: ours_a.get(k) for k in OURS_PER_RUN}
    kept = {k: {"commit": earlier["commit"], "timestamp": earlier["timestamp"], "ttft_model": earlier.get("ttft_model"),
                "ours_in_run": ours_then, **earlier["sides"][k]} for k in only_earlier}
    order = peer_order([*kept, *later["comparisons"]])
    comparisons = {**earlier["comparisons"], **later["comparisons"]}
    sides = {"ours": later["sides"]["ours"], **{k: {**earlier["sides"], **later["sides"], **kept}[k] for k in order}}
    run_minutes = {**earlier.get("run_minutes", {run_of(earlier, {}): earlier["minutes"]}),
                   **later.get("run_minutes", {run_of(later, {}): later["minutes"]})}
    used = {run_of(later, side) for side in sides.values()}
    run_minutes = {run: m for run, m in run_minutes.items() if run in used}
    return {**later, "minutes": round(sum(run_minutes.values()), 3), "run_minutes": run_minutes, "sides": sides,
            "comparisons": {k: comparisons[k] for k in order}}, {}


def merge_reports(paths: list[Path]) -> dict[str, Any]:
    """One report from the JSON reports of separate runs (each measured at its own commit).

    A report is a run's or an earlier merge's. Every spec keeps the commit, time and TTFT model
    it was measured with; a later report's spec replaces an earlier one's, but keeps the
    earlier's peers it did not measure when ours agrees (``join_spec``: one spec's peers
    measured in separate runs).

    Raises:
        SystemExit: a report is unreadable, or the runs differ in engine or settings
            (named: the file and the field).
    """
    reports = []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: not a bench_peers report ({type(e).__name__}: {e})") from None
        missing = [k for k in ("specs", "config", "identity") if not isinstance(report, dict) or k not in report]
        # A run's report is stamped as a whole; a merged one, spec by spec.
        missing += [f"{name}.commit" for name, row in report.get("specs", {}).items()
                    if not (report.get("commit") or row.get("commit"))] if not missing else []
        if missing:
            raise SystemExit(f"{path}: not a bench_peers report (no {', '.join(missing)})")
        reports.append((Path(path), report))
    first_path, first = reports[0]
    rows: dict[str, Any] = {}
    for path, report in reports:
        if report["identity"] != first["identity"]:
            raise SystemExit(f"{path}: identity: measured on {report['identity']}, {first_path} on {first['identity']}")
        for key in MERGE_KEYS:
            if report["config"].get(key) != first["config"].get(key):
                raise SystemExit(f"{path}: config.{key}: {report['config'].get(key)!r}, "
                                 f"{first_path} has {first['config'].get(key)!r}")
        for name, row in report["specs"].items():
            # The goal is a function of the sides: recomputed, so every spec meets today's rule.
            for kind, c in row["comparisons"].items():
                c["goal"] = goal(ours_beside(row, kind), row["sides"][kind])
            ttft_model = report["config"].get("ttft_model")
            row = {**row, "commit": report.get("commit") or row["commit"],
                   "timestamp": report.get("timestamp") or row.get("timestamp"),
                   "ttft_model": ttft_model.get(name) if isinstance(ttft_model, dict) else ttft_model}
            if name in rows:
                row, dropped = join_spec(rows[name], row)
                if dropped:
                    runs = ", ".join(f"{kind} (commit {c})" for kind, c in dropped.items())
                    print(f"{path}: {name}: ours differs from the run of {runs}, so those rows are dropped", flush=True)
            rows[name] = row
    peers = peer_order(k for r in rows.values() for k in r["comparisons"])
    config = {**first["config"], "peers": peers, "ttft_model": {name: r["ttft_model"] for name, r in rows.items()}}
    total = sum(r["minutes"] for r in rows.values())
    return {"benchmark": "peers", "merged_from": [str(p) for p, _ in reports],
            "commits": sorted({r["commit"] for r in rows.values()}), "machine": first["machine"],
            "config": config, "identity": first["identity"], "total_minutes": round(total, 2), "specs": rows}

"""Publishing a result: which labels it gets, and one idempotent path for the CLI and the flows.

* :func:`promotion`: the rule that moves ``production``;
* :func:`publish_once`: publish unless the same run already published the same content
  (a rerun after a crash adds no duplicate version);
* :func:`publish_result`: an optimizer result (its ``result.json``) published with its
  provenance and metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from promptdistill.core.jsonio import json_safe
from promptdistill.registry.hashing import content_hash
from promptdistill.registry.records import VersionRecord
from promptdistill.registry.store import Registry
from promptdistill.search.selection import SelectionRecord

__all__ = [
    "CANDIDATE_LABEL",
    "PRODUCTION_LABEL",
    "Promotion",
    "gate",
    "promote_and_publish",
    "promotion",
    "publish_once",
    "publish_result",
]

CANDIDATE_LABEL = "candidate"
"""Every published result gets this label."""
PRODUCTION_LABEL = "production"
"""What services load (``NAME@production``); moved only by :func:`promotion`'s rule."""
_LOOKBACK = 20
"""How many of a template's latest versions :func:`publish_once` checks for a rerun's publish."""


@dataclass(frozen=True)
class Promotion:
    labels: tuple[str, ...]
    reason: str


def promotion(gate_passed: bool, allow_promotion: bool, *, gate_reason: str = "", has_production: bool = True,
              kept_baseline: bool = False) -> Promotion:
    """Which labels a new result gets.

    Every result becomes the ``candidate``. ``production`` moves to it only when the
    run's gate passed *and* the flow's parameter allows promotion; or, when the template
    has no production version yet and the run kept the baseline (the spec as written,
    verified on held-out data), so services can load ``NAME@production`` from the first
    night on (still only with promotion allowed).
    """
    why = f" ({gate_reason})" if gate_reason else ""
    if not allow_promotion:
        return Promotion((CANDIDATE_LABEL,), f"gate {'passed' if gate_passed else 'not passed'}{why}; "
                         "promotion not allowed by the run: production unchanged")
    if gate_passed:
        return Promotion((CANDIDATE_LABEL, PRODUCTION_LABEL), f"gate passed{why}: promoted to production")
    if not has_production and kept_baseline:
        return Promotion((CANDIDATE_LABEL, PRODUCTION_LABEL),
                         f"gate not passed{why}; no production version yet: the spec as written becomes production")
    return Promotion((CANDIDATE_LABEL,), f"gate not passed{why}: production unchanged")


def publish_once(
    registry: Registry,
    name: str,
    content: Mapping[str, Any],
    *,
    run_key: str,
    labels: Sequence[str],
    provenance: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    reason: str = "",
) -> tuple[VersionRecord, bool]:
    """Publish ``content`` unless a recent version came from the same ``run_key`` with the
    same content. Returns (record, created).

    A rerun (after a crash, or a night with nothing changed) adds no duplicate version.
    It sets only the labels that never pointed at the existing version (a crash between
    publishing and labelling); a label someone moved away since (a rollback) stays put.
    """
    chash = content_hash(dict(content))
    for version in reversed(registry.versions(name)[-_LOOKBACK:]):
        record = registry.get_version(name, version)
        if record.provenance.get("run_key") == run_key and record.content_hash == chash:
            missing = [label for label in labels
                       if not any(e.to_version == version for e in registry.history(name, label))]
            if missing:  # one event, forward only: never moves a label back past a newer version
                registry.set_labels(name, missing, version, reason=reason or "labels of an interrupted publish")
            return record, False
    parent = _current_version(registry, name)
    record = registry.publish(
        name, content, parent=parent, provenance={**dict(provenance or {}), "run_key": run_key},
        metrics=metrics, labels=labels, reason=reason,
    )
    return record, True


def _current_version(registry: Registry, name: str) -> int | None:
    """The parent of a new version: the production version, else the latest, else None."""
    versions = registry.versions(name)
    if not versions:
        return None
    return registry.labels(name).get(PRODUCTION_LABEL, versions[-1])


def publish_result(registry: Registry, result: Mapping[str, Any], *, run_key: str, labels: Sequence[str],
                   reason: str = "") -> tuple[VersionRecord, bool]:
    """Publish an optimizer result (``OptimizationResult.to_json()``) once per ``run_key``.

    Returns:
        (VersionRecord, created): created is False when a rerun found it already published.
    """
    selection = SelectionRecord.from_result(result)
    why = ("baseline kept: " if selection.kept else f"optimized ({selection.winner}): ") + selection.reason
    return publish_once(registry, result["spec"], result["content"], run_key=run_key, labels=labels,
                        provenance=result["provenance"], metrics=json_safe(result["metrics"]),
                        reason=(f"{reason}; {why}" if reason else why)[:500])


def gate(result: Mapping[str, Any]) -> tuple[bool, str]:
    """The run's gate: a winner other than the baseline was certified non-inferior, met
    the SLO, and held up on the held-out test split (the result's ``selection`` did not
    keep the baseline). Returns whether it passed, and the decision's reason."""
    selection = SelectionRecord.from_result(result)
    return not selection.kept, selection.reason


def promote_and_publish(registry: Registry, result: Mapping[str, Any], *, run_key: str,
                        allow_promotion: bool) -> tuple[VersionRecord, bool, Promotion]:
    """Publish a result as ``candidate``, and as ``production`` when :func:`promotion` says so.

    Returns:
        (record, created, the promotion decision).
    """
    name = result["spec"]
    passed, reason = gate(result)
    has_production = bool(registry.versions(name)) and PRODUCTION_LABEL in registry.labels(name)
    decision = promotion(passed, allow_promotion, gate_reason=reason[:200], has_production=has_production,
                         kept_baseline=SelectionRecord.from_result(result).kept)
    record, created = publish_result(registry, result, run_key=run_key, labels=decision.labels, reason=decision.reason)
    return record, created, decision

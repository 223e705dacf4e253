"""The nightly pipeline's rules, without Prefect: what the flows in ``flows/`` call.

Everything here is a plain function or value object, testable on its own:

* budgets (pydantic models, so Prefect renders them as forms) and how they map onto
  the profiler's and the optimizer's own configs;
* which specs a run covers (:func:`select_spec_files`) and what identifies one spec's
  work (:class:`SpecJob`, :func:`run_key`): the cache key of a resumable run;
* the TTFT model's life in the registry: where it is stored, when it is stale
  (:func:`ttft_status`), publishing and loading it;
* the promotion rule (:func:`promotion`) and idempotent publishing (:func:`publish_once`).

The engine a flow run shares between its tasks is in :mod:`promptdistill.pipeline_engine`;
summaries, tables and reports in :mod:`promptdistill.pipeline_report`; the calls into the
TTFT, distill and optimize stages in :mod:`promptdistill.pipeline_glue`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from promptdistill.engine.base import EngineIdentity, canonical_json
from promptdistill.errors import PromptDistillError, SpecError, TemplateNotFoundError

__all__ = [
    "BUDGET_PRESETS",
    "CANDIDATE_LABEL",
    "PRODUCTION_LABEL",
    "Promotion",
    "SpecJob",
    "SpecsFailedError",
    "TTFTBudget",
    "TTFTStatus",
    "TTFT_ARTIFACT_KIND",
    "budget_preset",
    "json_safe",
    "load_ttft_model",
    "prepare_job",
    "promotion",
    "publish_once",
    "publish_ttft_model",
    "select_spec_files",
    "settings_key",
    "task_timeout_s",
    "ttft_figure",
    "ttft_status",
    "work_key",
]

CANDIDATE_LABEL = "candidate"
PRODUCTION_LABEL = "production"
TTFT_ARTIFACT_KIND = "ttft-model"
"""Registry artifact kind of fitted TTFT models; the artifact name is the engine key."""


# ------------------------------------------------------------------------- budgets
class TTFTBudget(BaseModel):
    """How much profiling a TTFT refresh may do (the profiler's cost knobs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: int = Field(24, ge=0, description="Latin-hypercube sweep points (each cold, and warm when possible).")
    repeats: int = Field(2, ge=1, description="Rounds over the whole design.")
    spec_records: int = Field(2, ge=0, description="Records per bundled spec profiled as it renders.")
    minutes: float = Field(6.0, gt=0, description="Stop measuring after this long (rows so far are kept).")
    density_probe: bool = Field(True, description="Measure the density probe (fixed tokens, varied density).")
    fewshot_probe: bool = Field(True, description="Measure the few-shot probe (0/1/4/8 examples).")
    keep_contended: bool = Field(False, description="Fit on rows measured while other work took the CPU too "
                                 "(by default they are left out; keep them on a machine that is never idle).")

    def profile_config(self, *, prompts_dir: str | Path = "prompts", seed: int = 0) -> Any:
        """The profiler's ``ProfileConfig`` for this budget."""
        from promptdistill.ttft.profile import ProfileConfig

        kwargs: dict[str, Any] = dict(
            points=self.points,
            repeats=self.repeats,
            spec_records=self.spec_records,
            budget_s=self.minutes * 60.0,
            fewshot_probe=self.fewshot_probe,
            prompts_dir=str(prompts_dir),
            seed=seed,
        )
        if not self.density_probe:
            kwargs["density_probe_tokens"] = ()
        return ProfileConfig(**kwargs).validate()


def settings_key(value: Any) -> Any:
    """A budget, rule or config (dataclass or pydantic model) as plain JSON for a cache key."""
    if value is None:
        return None
    if is_dataclass(value) and not isinstance(value, type):
        return json_safe(asdict(value))
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json_safe(value)


def task_timeout_s(*max_minutes: float) -> float:
    """The safety net on one spec's task: its stages' own time limits three times over,
    plus 20 minutes for verification and start-up. The stages stop themselves well before."""
    return sum(max_minutes) * 60.0 * 3 + 1200.0


class SpecsFailedError(PromptDistillError):
    """Some specs of a run failed; the others were done. ``summary`` holds the whole run."""

    def __init__(self, message: str, summary: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, dict(summary or {}))
        self.summary = dict(summary or {})

    def __str__(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:  # Prefect logs the repr: the message, not the whole summary
        return f"{type(self).__name__}({self.args[0]!r})"


BUDGET_PRESETS = {
    "smoke": "a few minutes for one small spec: plumbing checks and tests, figures not meaningful",
    "quick": "about 40-60 minutes for the 5 bundled specs on a 2-core CPU (`make run`)",
    "full": "the library defaults (what the deployments use): an hour or more per spec on a CPU",
}
"""Named budgets of the nightly flow's parameters (``promptdistill nightly --budget NAME``)."""


def budget_preset(name: str) -> dict[str, Any]:
    """The nightly flow's budget parameters for a preset: ``ttft_budget``, ``distill``, ``budget``.

    Raises:
        ValueError: an unknown preset name.
    """
    from promptdistill.distill import DistillConfig
    from promptdistill.optimize import OptimizeBudget

    if name == "full":
        return {"ttft_budget": TTFTBudget(), "distill": DistillConfig(), "budget": OptimizeBudget()}
    if name == "quick":
        return {
            "ttft_budget": TTFTBudget(points=24, repeats=2, spec_records=2, minutes=6.0),
            "distill": DistillConfig(minibatch_size=6, dev_size=12, test_size=12, max_rounds=1, max_lm_calls=200,
                                     max_minutes=3.0, thresholds=(0.5,), target_ratios=(0.5,), calibrate=False),
            "budget": OptimizeBudget(max_lm_calls=400, max_minutes=4.0, dev_size=16, minibatch_size=6, test_size=16,
                                     fewshot_counts=(0, 2, 4), similar_counts=(2,), fixed_subsets=1, max_variants=3,
                                     feature_records=3, timing_records=2, format_size=8),
        }
    if name == "smoke":
        return {
            "ttft_budget": TTFTBudget(points=8, repeats=1, spec_records=1, minutes=4.0, density_probe=False,
                                      fewshot_probe=False),
            "distill": DistillConfig(minibatch_size=4, dev_size=4, test_size=4, max_rounds=1, max_lm_calls=60,
                                     max_minutes=2.0, thresholds=(0.5,), target_ratios=(0.5,), calibrate=False,
                                     judge_examples=1),
            "budget": OptimizeBudget(max_lm_calls=150, max_minutes=2.0, dev_size=6, minibatch_size=3, test_size=4,
                                     fewshot_counts=(0, 2), similar_counts=(), fixed_subsets=1, max_variants=2,
                                     feature_records=2, timing_records=1, formats=False, format_size=4),
        }
    raise ValueError(f"unknown budget preset {name!r}; known: {', '.join(BUDGET_PRESETS)}")


# --------------------------------------------------------------------- spec jobs
def select_spec_files(prompts_dir: str | Path = "prompts", names: Sequence[str] | None = None) -> list[Path]:
    """The spec files a run covers: every ``*.yaml`` in ``prompts_dir``, or the ones named.

    Loading happens later, one spec at a time, so a broken spec fails only its own work.

    Raises:
        SpecError: the folder is missing or empty, or a name is unknown (listing the known ones).
    """
    folder = Path(prompts_dir)
    if not folder.is_dir():
        raise SpecError(f"{folder}: prompts folder not found")
    known = {p.stem: p for p in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])}
    if not names:
        if not known:
            raise SpecError(f"{folder}: no *.yaml specs in the prompts folder")
        return list(known.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SpecError(f"{folder}: no spec named {', '.join(map(repr, unknown))} (known: {', '.join(known) or 'none'})")
    return [known[n] for n in dict.fromkeys(names)]


@dataclass(frozen=True)
class SpecJob:
    """One spec's work, identified by content: what the cache key is made of."""

    name: str
    path: str
    spec_hash: str
    dataset_path: str
    dataset_hash: str


def prepare_job(path: str | Path) -> SpecJob:
    """Load and validate one spec and hash its dataset.

    Raises:
        SpecError: the spec is invalid or its dataset is missing (naming the file).
    """
    from promptdistill.datasets import dataset_hash
    from promptdistill.specs import load_spec

    spec = load_spec(Path(path))
    if not spec.dataset.is_file():
        raise SpecError(f"{spec.where}: dataset: file {spec.dataset} not found")
    return SpecJob(
        name=spec.name,
        path=str(Path(path)),
        spec_hash=spec.spec_hash(),
        dataset_path=str(spec.dataset),
        dataset_hash=dataset_hash(spec.dataset),
    )


def work_key(stage: str, job: SpecJob, *, engine_key: str, seed: int, **settings: Any) -> str:
    """What determines one stage's result for one spec, hashed: the cache key of a task.

    Always the spec's content, its dataset's bytes, the engine identity and the seed;
    plus the stage's settings (budget, selection rule, distill config, TTFT model
    version...), each reduced to plain JSON by :func:`settings_key`. Never the engine
    object, a client or a DataFrame. The spec file's location is not part of it.

    Example:
        >>> work_key("optimize", job, engine_key=engine.identity.key(), seed=0,
        ...          budget=budget, ttft_model=model.version)            # doctest: +SKIP
        'optimize-3f1c...'
    """
    parts = {
        "stage": stage,
        "spec": job.spec_hash,
        "dataset": job.dataset_hash,
        "engine": engine_key,
        "seed": seed,
        **{name: settings_key(value) for name, value in sorted(settings.items())},
    }
    return f"{stage}-" + hashlib.sha256(canonical_json(parts).encode()).hexdigest()[:32]


# -------------------------------------------------------------------- TTFT model
@dataclass(frozen=True)
class TTFTStatus:
    """Whether the registry holds a usable TTFT model for an engine, and why (not)."""

    engine_key: str
    needs_refresh: bool
    reason: str
    version: int | None = None
    """Registry artifact version of the newest model, if any."""
    model_version: str | None = None
    fitted_at: str | None = None
    age_hours: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ttft_status(
    registry: Any, identity: EngineIdentity, *, max_age_hours: float | None, now: datetime | None = None
) -> TTFTStatus:
    """The staleness rule: refresh when there is no model for this engine identity, or
    the newest one was fitted more than ``max_age_hours`` ago (None: never too old)."""
    key = identity.key()
    try:
        record = registry.get_artifact(TTFT_ARTIFACT_KIND, key)
    except TemplateNotFoundError:
        return TTFTStatus(key, True, f"no TTFT model for engine {key} ({identity.model}, {identity.backend})")
    meta = record.metadata
    fitted_at = meta.get("fitted_at") or record.created_at
    now = now or datetime.now(timezone.utc)
    age_hours = (now - _parse_time(fitted_at)).total_seconds() / 3600.0
    base = dict(version=record.version, model_version=meta.get("model_version"), fitted_at=fitted_at, age_hours=age_hours)
    if max_age_hours is not None and age_hours > max_age_hours:
        return TTFTStatus(key, True, f"TTFT model {record.version} is {age_hours:.1f} h old (limit {max_age_hours:g} h)", **base)
    return TTFTStatus(key, False, f"TTFT model {record.version} is {age_hours:.1f} h old: fresh", **base)


def _parse_time(value: str) -> datetime:
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def publish_ttft_model(registry: Any, model: Any, *, extra: Mapping[str, Any] | None = None,
                       figures: Mapping[str, bytes] | None = None) -> Any:
    """Store a fitted ``TTFTModel`` as the next ``ttft-model/<engine key>`` artifact.

    ``figures`` (name -> PNG bytes) are stored beside the model as ``figure-<name>.png``,
    so every report made with this model can show how well it fits.
    """
    identity: EngineIdentity = model.engine_identity
    metadata = {
        "engine_identity": identity.to_dict(),
        "model_version": model.version,
        "model_name": model.name,
        "fitted_at": model.fitted_at,
        "metrics": model.metrics,
        **dict(extra or {}),
    }
    files = {**model.to_files(), **{f"figure-{name}.png": data for name, data in (figures or {}).items()}}
    return registry.put_artifact(TTFT_ARTIFACT_KIND, identity.key(), files, metadata=json_safe(metadata),
                                 labels=["current"])


def ttft_figure(registry: Any, engine_key: str, model_version: str, name: str, out_dir: str | Path) -> Path | None:
    """A figure stored with the TTFT model ``model_version`` of an engine, written to
    ``out_dir`` (None when that model or figure is not in the registry)."""
    for version in reversed(registry.artifact_versions(TTFT_ARTIFACT_KIND, engine_key)):
        record = registry.get_artifact(TTFT_ARTIFACT_KIND, engine_key, version=version)
        if record.metadata.get("model_version") != model_version:
            continue
        file_name = f"figure-{name}.png"
        if file_name not in record.files:
            return None
        data = registry.read_artifact_files(record)[file_name]
        path = Path(out_dir) / f"ttft-{model_version}-{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return path
    return None


def json_safe(value: Any) -> Any:
    """NaN/inf (an undefined score on a tiny fold) become None: the registry stores JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return json_safe(value.item())
    return value


def load_ttft_model(registry: Any, identity: EngineIdentity, *, version: int | None = None) -> Any:
    """The newest (or a given) TTFT model fitted on this engine identity.

    Raises:
        TemplateNotFoundError: no model for this engine; run the ``profile-ttft`` flow.
    """
    from promptdistill.ttft.model import TTFTModel

    key = identity.key()
    try:
        record = registry.get_artifact(TTFT_ARTIFACT_KIND, key, version=version)
    except TemplateNotFoundError:
        raise TemplateNotFoundError(
            f"{registry.root}: no TTFT model for engine {key} ({identity.model}, {identity.backend}); "
            "run the profile-ttft flow (`prefect deployment run 'profile-ttft/profile-ttft'`) or "
            "`promptdistill ttft profile` then `promptdistill ttft fit`"
        ) from None
    source = f"{registry.root}/{TTFT_ARTIFACT_KIND}/{key}:{record.version}"
    model = TTFTModel.from_files(registry.read_artifact_files(record), source=source)
    model.check_engine(identity)
    return model


# ------------------------------------------------------------- promotion/publish
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
    registry: Any,
    name: str,
    content: Mapping[str, Any],
    *,
    run_key: str,
    labels: Sequence[str],
    provenance: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    reason: str = "",
    lookback: int = 20,
) -> tuple[Any, bool]:
    """Publish ``content`` unless a recent version came from the same ``run_key`` with the
    same content. Returns (record, created).

    A rerun (after a crash, or a night with nothing changed) adds no duplicate version.
    It sets only the labels that never pointed at the existing version (a crash between
    publishing and labelling); a label someone moved away since (a rollback) stays put.
    """
    from promptdistill.registry import content_hash

    chash = content_hash(dict(content))
    for version in reversed(registry.versions(name)[-lookback:]):
        record = registry.get_version(name, version)
        if record.provenance.get("run_key") == run_key and record.content_hash == chash:
            for label in labels:
                if not any(e.to_version == version for e in registry.history(name, label)):
                    registry.set_label(name, label, version, reason=reason or "labels of an interrupted publish")
            return record, False
    parent = _current_version(registry, name)
    record = registry.publish(
        name, content, parent=parent, provenance={**dict(provenance or {}), "run_key": run_key},
        metrics=metrics, labels=labels, reason=reason,
    )
    return record, True


def _current_version(registry: Any, name: str) -> int | None:
    """The parent of a new version: the production version, else the latest, else None."""
    versions = registry.versions(name)
    if not versions:
        return None
    return registry.labels(name).get(PRODUCTION_LABEL, versions[-1])

"""The TTFT model's life: one place (the registry), for the CLI and the flows alike.

A fitted model is stored as the artifact ``ttft-model/<engine key>`` (the key of the
engine identity it was measured on), with its fit figure beside it and its held-out error
and noise floor in its metadata.
``promptdistill ttft fit``, the ``profile-ttft`` flow and the nightly's refresh all publish
there; ``promptdistill optimize`` and the nightly load from there.

* :func:`ttft_status`: is there a model for this engine, and is it fresh?
* :func:`fit_and_publish`: select and fit a model on measurements, measure their noise
  floor, draw its fit figure, publish it, write its model card (the nightly's refresh
  does exactly this; the research study over the same profiles is ``bench/ttft_study``,
  which nothing here imports);
* :func:`load_ttft_model`, :func:`ttft_figure`: read it back;
* :func:`after_failed_refresh`: the rule when a refresh fails (go on with the old model,
  or, when there is none, no model: each spec then stops with the reason);
* :func:`keep_ttft_model_fresh`: the run's sequence (status, refresh when stale, status
  again, or the rule above), the refresh itself passed in by the flow.

A run's model has a ``state`` (:data:`TTFT_STATES`), which its summary states.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import pandas as pd

from promptdistill.core.errors import IntegrityError, TemplateNotFoundError
from promptdistill.core.jsonio import atomic_write, json_safe
from promptdistill.core.settings import check, setting
from promptdistill.engine.base import EngineIdentity
from promptdistill.pipeline.report import ttft_report_markdown
from promptdistill.registry.store import Registry
from promptdistill.ttft.figures import FIT_FIGURE, fit_figure
from promptdistill.ttft.fit import FitResult, check_frame, engine_rows, fit_models
from promptdistill.ttft.model import TTFTModel
from promptdistill.ttft.noise import noise_floor

__all__ = [
    "TTFT_ARTIFACT_KIND",
    "TTFT_STATES",
    "TTFTFreshness",
    "TTFTStatus",
    "after_failed_refresh",
    "fit_and_publish",
    "fit_ttft_model",
    "keep_ttft_model_fresh",
    "load_ttft_model",
    "publish_ttft_model",
    "ttft_figure",
    "ttft_status",
]

TTFT_ARTIFACT_KIND = "ttft-model"
"""Registry artifact kind of fitted TTFT models; the artifact name is the engine key."""
TTFT_STATES = {
    "fresh": "the registry's model, young enough",
    "refreshed": "measured and fitted in this run",
    "stale": "the refresh failed: the last model for this engine, however old",
    "none": "no model for this engine and the refresh failed: every spec stops with the reason",
}
"""What a run's TTFT model is (``state`` in :func:`keep_ttft_model_fresh`'s answer)."""
NOISE_FLOOR_BOOT = 200
"""Bootstrap resamples of the noise floor's intervals at each fit (about a second)."""


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


@dataclass(frozen=True)
class TTFTFreshness:
    """How old a TTFT model may get before a run refreshes it (the nightly's ``ttft_max_age_hours``)."""

    # No bound, as the flag never had one: 0 or less refreshes at every run.
    max_age_hours: float = setting(168.0, "refresh an older TTFT model")

    def __post_init__(self) -> None:
        check(self)


def ttft_status(
    registry: Registry, identity: EngineIdentity, *, max_age_hours: float | None, now: datetime | None = None
) -> TTFTStatus:
    """The staleness rule: refresh when there is no model for this engine identity, or
    the newest one was fitted more than ``max_age_hours`` ago (None: never too old)."""
    key = identity.key()
    try:
        record = registry.get_artifact(TTFT_ARTIFACT_KIND, key)
    except TemplateNotFoundError:
        return TTFTStatus(key, True, f"no TTFT model for engine {key} ({identity.model}, {identity.backend})")
    try:
        _read_model(registry, record)
    except IntegrityError as e:
        usable = _newest_usable(registry, key, below=record.version)
        return TTFTStatus(key, True, f"TTFT model {record.version} cannot be used ({e})",
                          version=usable[0].version if usable else None)
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


def publish_ttft_model(registry: Registry, model: TTFTModel, *, extra: Mapping[str, Any] | None = None,
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


def ttft_figure(registry: Registry, engine_key: str, model_version: str, out_dir: str | Path, *,
                name: str = FIT_FIGURE) -> Path | None:
    """A figure stored with the TTFT model ``model_version`` of an engine (by default the fit's
    predicted-vs-measured plot), written to ``out_dir`` (None when that model or figure is not
    in the registry)."""
    for version in reversed(registry.artifact_versions(TTFT_ARTIFACT_KIND, engine_key)):
        record = registry.get_artifact(TTFT_ARTIFACT_KIND, engine_key, version=version)
        if record.metadata.get("model_version") != model_version:
            continue
        file_name = f"figure-{name}.png"
        if file_name not in record.files:
            return None
        data = registry.read_artifact_files(record)[file_name]
        path = Path(out_dir) / f"ttft-{model_version}-{name}.png"
        return atomic_write(path, data)
    return None


def load_ttft_model(registry: Registry, identity: EngineIdentity, *, version: int | None = None) -> TTFTModel:
    """The newest (or a given) TTFT model fitted on this engine identity.

    A newest model this code cannot load (fitted by another promptdistill, or damaged)
    gives way to the newest one that loads, with a warning; ``ttft_status`` reports it as
    needing a refresh.

    Raises:
        TemplateNotFoundError: no model for this engine; run the ``profile-ttft`` flow.
        IntegrityError: no version of it loads (the message says why and how to refit).
    """
    key = identity.key()
    try:
        record = registry.get_artifact(TTFT_ARTIFACT_KIND, key, version=version)
    except TemplateNotFoundError:
        raise TemplateNotFoundError(
            f"{registry.root}: no TTFT model for engine {key} ({identity.model}, {identity.backend}); "
            "run the profile-ttft flow (`prefect deployment run 'profile-ttft/profile-ttft'`) or "
            "`promptdistill ttft profile` then `promptdistill ttft fit`"
        ) from None
    try:
        model = _read_model(registry, record)
    except IntegrityError as e:
        # A newest model this code cannot use (fitted by another version, or damaged): the
        # last good one still predicts; asked for a version, there is no other answer.
        fallback = None if version is not None else _newest_usable(registry, key, below=record.version)
        if fallback is None:
            raise
        warnings.warn(f"{e}; using TTFT model {fallback[0].version} of engine {key}", UserWarning, stacklevel=2)
        model = fallback[1]
    model.check_engine(identity)
    return model


def _read_model(registry: Registry, record: Any) -> TTFTModel:
    source = f"{registry.root}/{TTFT_ARTIFACT_KIND}/{record.name}:{record.version}"
    return TTFTModel.from_files(registry.read_artifact_files(record), source=source)


def _newest_usable(registry: Registry, key: str, *, below: int) -> tuple[Any, TTFTModel] | None:
    """The newest model version under ``below`` that loads, with its record (None: none does)."""
    for version in sorted((v for v in registry.artifact_versions(TTFT_ARTIFACT_KIND, key) if v < below), reverse=True):
        record = registry.get_artifact(TTFT_ARTIFACT_KIND, key, version=version)
        try:
            return record, _read_model(registry, record)
        except IntegrityError:
            continue
    return None


def fit_ttft_model(frame: Any, *, seed: int = 0, source: str = "", keep_contended: bool = False) -> tuple[Any, Any, Any]:
    """Select and fit the TTFT model on a measurement frame of one engine.

    Rows measured under CPU contention are left out unless ``keep_contended``; when too
    few prompts remain without them, the fit keeps them and says so in
    ``model.training["contended_rows_kept"]``.

    Returns:
        (TTFTModel, FitResult, the rows it was fitted on).

    Raises:
        ValueError: the frame mixes engines, lacks identity columns or has too few prompts.
    """
    rows = engine_rows(frame, where=source or "measurements")
    fallback = None
    try:
        fit = fit_models(rows, seed=seed, drop_contended=not keep_contended)
    except ValueError as e:
        if keep_contended:
            raise
        # A machine that is never idle: rather a noisier model than none.
        fit, fallback = fit_models(rows, seed=seed, drop_contended=False), str(e)
    model = TTFTModel.from_fit(fit, rows, sources=[source] if source else [])
    if fallback:
        model.training["contended_rows_kept"] = f"too few uncontended prompts ({fallback}); fitted on every row"
    return model, fit, rows


def fit_and_publish(registry: Registry, frame: pd.DataFrame, *, seed: int = 0, source: str = "",
                    report_dir: str | Path, keep_contended: bool = False,
                    extra: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], TTFTModel, FitResult, Any]:
    """Fit and select the model on ``frame``, publish it with its noise floor and fit figure,
    and write its model card (``report.md`` and the figure) in ``report_dir/<model version>/``.

    A noise floor or a card that fails does not keep a good model from being published
    (the returned ``info["report_error"]`` says why).

    Returns:
        (info, model, fit, record): ``info`` is plain JSON (engine key, artifact version,
        model version, chosen estimator, held-out scores, noise floor, the card's path).
    """
    model, fit, rows = fit_ttft_model(frame, seed=seed, source=source, keep_contended=keep_contended)
    keep = keep_contended or bool(model.training.get("contended_rows_kept"))
    out = Path(report_dir) / model.version
    info: dict[str, Any] = {}
    figures: dict[str, Path] = {}
    noise: dict[str, Any] = {}
    try:
        noise = json_safe(noise_floor(check_frame(rows, drop_contended=not keep)[0], n_boot=NOISE_FLOOR_BOOT, seed=seed))
        out.mkdir(parents=True, exist_ok=True)
        figures[FIT_FIGURE.replace("_", " ")] = out / fit_figure(fit, out)
    except Exception as e:  # noqa: BLE001 - a failed floor or figure must not keep a good model from being published
        info["report_error"] = f"{type(e).__name__}: {e}"
    record = publish_ttft_model(registry, model, extra={"measurements": source, "noise_floor": noise, **dict(extra or {})},
                                figures={p.stem: p.read_bytes() for p in figures.values()})
    if "report_error" not in info:
        info["report"] = str(atomic_write(out / "report.md", _model_card(model, fit, record, noise)))
    info.update({"engine_key": model.engine_identity.key(), "version": record.version,
                 "model_version": model.version, "chosen": model.name,
                 "heldout": json_safe(fit.heldout.get(model.name, {})), "noise_floor": noise,
                 "contended_rows_kept": model.training.get("contended_rows_kept"),
                 "figures": {name: str(path) for name, path in figures.items()}})
    info.setdefault("report", None)
    return info, model, fit, record


def _model_card(model: TTFTModel, fit: FitResult, record: Any, noise: Mapping[str, Any]) -> str:
    """The published model in markdown: its scores, the noise floor they are bounded by, its fit figure."""
    def pct(key: str) -> str:
        return "n/a" if noise.get(key) is None else f"{noise[key]:.1%}"

    floor = (f"Noise floor (from {noise.get('units') or 0} prompts measured more than once, cold or warm): a perfect "
             f"model's MAPE would be {pct('floor_vs_medians')} against medians of repeats and "
             f"{pct('floor_vs_singles_pooled')} against single measurements.")
    return (f"{ttft_report_markdown(model, fit, record)}\n\n{floor}\n\n"
            f"![predicted vs measured]({FIT_FIGURE}.png)\n")


def after_failed_refresh(status: TTFTStatus, error: str) -> dict[str, Any]:
    """What a run does when refreshing the TTFT model failed: go on with the old model
    (state ``stale``), or, when this engine has none, with no model (state ``none``): the
    run goes on to say so per spec rather than fail whole."""
    if status.version is None:
        return {**status.to_dict(), "refreshed": False, "state": "none",
                "reason": f"no TTFT model for engine {status.engine_key} and the refresh failed: {error}"}
    return {**status.to_dict(), "refreshed": False, "state": "stale",
            "reason": f"{status.reason}; refresh FAILED ({error}), using the old model"}


class RunLogger(Protocol):
    """What :func:`keep_ttft_model_fresh` logs to (a flow's run logger, or any ``logging.Logger``)."""

    def info(self, msg: str, *args: Any) -> None: ...

    def warning(self, msg: str, *args: Any) -> None: ...


def keep_ttft_model_fresh(registry: Registry, identity: EngineIdentity, *, max_age_hours: float | None,
                          refresh: Callable[[TTFTStatus], str | None], logger: RunLogger) -> dict[str, Any]:
    """A run's TTFT model: the one in the registry while fresh, else refreshed, else the old one.

    The sequence: :func:`ttft_status`; when stale, ``refresh`` (measure, fit and publish:
    how is the caller's, a flow's tasks), then the new model's status, or on failure
    :func:`after_failed_refresh`.

    Args:
        refresh: called with the stale status; returns None once a new model is published,
            else the error that stopped it (``TypeName: message``).
        logger: told why a refresh starts (info) and when one failed (warning).

    Returns:
        The model's status as a dict, with ``refreshed``, its ``state`` (:data:`TTFT_STATES`)
        and (after a refresh) its reason. Never raises for a failed refresh: without a model
        the state is ``none`` and the reason says why.
    """
    status = ttft_status(registry, identity, max_age_hours=max_age_hours)
    if not status.needs_refresh:
        return {**status.to_dict(), "refreshed": False, "state": "fresh"}
    logger.info("refreshing the TTFT model: %s", status.reason)
    error = refresh(status)
    if error is None:
        after = ttft_status(registry, identity, max_age_hours=None)
        return {**after.to_dict(), "refreshed": True, "state": "refreshed", "reason": f"refreshed: {status.reason}"}
    outcome = after_failed_refresh(status, error)
    logger.warning("TTFT: %s", outcome["reason"])
    return outcome

"""Which specs a run covers, what identifies one spec's work (the cache key of a task),
what names a run (its registry run id), how specs run side by side, and what row a
spec's work ends in.

The rules live here and the flows only call them: what enters a stage's cache key
(:func:`distill_key`, :func:`optimize_key`), a spec's summary row (:class:`SpecOutcome`),
and how many specs run at once (:func:`dask_worker_count`, :func:`parallel_specs`).
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime, timezone
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from promptdistill.core.config import Settings
from promptdistill.core.errors import PromptDistillError, SpecError
from promptdistill.core.jsonio import canonical_json, json_safe
from promptdistill.judges.definitions import judge_dirs
from promptdistill.pipeline.report import failed_row, summary_row
from promptdistill.specs.datasets import dataset_hash
from promptdistill.specs.load import load_spec

__all__ = ["SpecJob", "SpecOutcome", "SpecsFailedError", "dask_worker_count", "distill_key", "judges_hash",
           "optimize_key", "parallel_specs", "prepare_job", "run_id_for", "select_spec_files", "settings_key", "work_key"]


class SpecsFailedError(PromptDistillError):
    """Some specs of a run failed; the others were done. ``summary`` holds the whole run."""

    def __init__(self, message: str, summary: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, dict(summary or {}))
        self.summary = dict(summary or {})

    def __str__(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:  # Prefect logs the repr: the message, not the whole summary
        return f"{type(self).__name__}({self.args[0]!r})"


def select_spec_files(prompts_dir: str | Path = "prompts", names: Sequence[str] | None = None) -> list[Path]:
    """The spec files a run covers: every ``*.yaml`` in ``prompts_dir``, or the ones named.

    Loading happens later, one spec at a time, so a broken spec fails only its own work.

    Raises:
        SpecError: the folder is missing or empty, or a name is unknown (listing the known ones).
    """
    folder = Path(prompts_dir)
    if not folder.is_dir():
        raise SpecError(f"{folder}: prompts folder not found (run from your project's folder, or pass --prompts-dir)")
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
    dataset_hash: str


def prepare_job(path: str | Path) -> SpecJob:
    """Load and validate one spec and hash its dataset.

    Raises:
        SpecError: the spec is invalid or its dataset is missing (naming the file).
    """
    spec = load_spec(Path(path))
    if not spec.dataset.is_file():
        raise SpecError(f"{spec.where}: dataset: file {spec.dataset} not found")
    return SpecJob(name=spec.name, path=str(Path(path)), spec_hash=spec.spec_hash(),
                   dataset_hash=dataset_hash(spec.dataset))


def settings_key(value: Any) -> Any:
    """A budget, rule or config (a dataclass) as plain JSON for a cache key."""
    if value is None:
        return None
    if is_dataclass(value) and not isinstance(value, type):
        return json_safe(asdict(value))
    return json_safe(value)


RESULTS_VERSION = 2
"""Part of every work key: bumped when the code changes what a stage returns for the same
inputs (how a reply is scored, how a race decides), so a warm state directory does not
serve results made under the old rules. 2: a reply that fails its schema scores 0, and the
confidence sequence stops for futility."""


def work_key(stage: str, job: SpecJob, *, engine_key: str, seed: int, **settings: Any) -> str:
    """What determines one stage's result for one spec, hashed: the cache key of a task.

    Always the spec's content, its dataset's bytes, the engine identity, the seed and
    ``RESULTS_VERSION``;
    plus the stage's settings (budget, selection rule, distill config, TTFT model
    version...), each reduced to plain JSON by :func:`settings_key`. Never the engine
    object, a client or a DataFrame. The spec file's location is not part of it.

    Example:
        >>> work_key("optimize", job, engine_key=engine.identity.key(), seed=0,
        ...          budget=budget, ttft_model=model.version)            # doctest: +SKIP
        'optimize-3f1c...'
    """
    parts = {
        "stage": stage, "results": RESULTS_VERSION, "spec": job.spec_hash, "dataset": job.dataset_hash,
        "engine": engine_key, "seed": seed,
        **{name: settings_key(value) for name, value in sorted(settings.items())},
    }
    return f"{stage}-" + hashlib.sha256(canonical_json(parts).encode()).hexdigest()[:32]


def judges_hash(directory: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The content of every judge definition a run can load: ``{name: sha256 of the file}``.

    For each name, the file :func:`~promptdistill.judges.definitions.load_judge` would read:
    the project's copy (``directory``, default the configured ``[paths] judges``), else the
    built-in. All of them, not only the ones a spec names: the distiller's judges are not
    named in specs, and a key that changes on an unused judge only costs a rerun. A file
    that cannot be read enters as its error (loading it fails the stage that uses it).
    """
    found: dict[str, Path] = {}
    for root in reversed(judge_dirs(directory)):  # built-ins first: the project's copy wins
        for path in sorted(root.glob("*.yaml")):
            if path.is_file():
                found[path.stem] = path
    hashes: dict[str, str] = {}
    for name, path in sorted(found.items()):
        try:
            hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as e:
            hashes[name] = f"unreadable: {e.strerror or e}"
    return hashes


def _project_settings(settings: Settings) -> dict[str, Any]:
    """What both stages' keys take from the settings: the judge engine and the judges' content."""
    return {"judge": settings.judge, "judges": judges_hash(settings.judges_dir)}


def distill_key(job: SpecJob, *, engine_key: str, seed: int, distill: Any, settings: Settings) -> str:
    """The distill stage's cache key: :func:`work_key` over the distill config, the judge
    engine (``[judge]``) and the content of the judge definitions (:func:`judges_hash`)."""
    return work_key("distill", job, engine_key=engine_key, seed=seed, distill=distill, **_project_settings(settings))


def optimize_key(job: SpecJob, *, engine_key: str, seed: int, budget: Any, selection: Any, distill: Any,
                 ttft_model: str | None, settings: Settings) -> str:
    """The optimize stage's cache key: :func:`work_key` over the budget, the selection rule,
    the distill config (None: no distill stage), the TTFT model version, the judge engine
    and the content of the judge definitions (:func:`judges_hash`)."""
    return work_key("optimize", job, engine_key=engine_key, seed=seed, budget=budget, selection=selection,
                    distill=distill, ttft_model=ttft_model, **_project_settings(settings))


def run_id_for(flow_run_id: str | None, now: datetime | None = None) -> str:
    """A registry run id: UTC time first (run logs sort by time:
    :func:`~promptdistill.pipeline.night_report.latest_run_id` relies on it), then the
    first 8 characters of the flow run's id (``local`` without one).

    Example:
        >>> run_id_for("0f1e2d3c-aaaa-bbbb", datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
        '20250102T030405Z-0f1e2d3c'
    """
    stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{(flow_run_id or 'local')[:8]}"


@dataclass
class SpecOutcome:
    """The summary row one spec's chain (prepare, distill, optimize, publish, record) ends
    in, built as its stages report back: the row's rules (its status, when it counts as
    cached, what a failure row names) live here, and the flow only says what each task did.

    Example:
        >>> outcome = SpecOutcome("ticket_triage")
        >>> outcome.stage("optimize-3f1c")                     # the stage's work key
        >>> outcome.stage_done(cached=True)                    # its result came from the cache
        >>> outcome.published(result, figures, published)      # doctest: +SKIP
    """

    name: str
    run_key: str | None = None
    """The work key of the latest stage started: a failure row names it (None: no stage yet)."""
    cache_hits: list[bool] = field(default_factory=list)
    """Per finished stage, whether its result came from an earlier run's cache."""

    def stage(self, run_key: str) -> None:
        """A stage starts on the work under ``run_key``."""
        self.run_key = run_key

    def stage_done(self, *, cached: bool) -> None:
        """The stage ended, computed now or (``cached``) read from an earlier run's cache."""
        self.cache_hits.append(cached)

    @property
    def cached(self) -> bool:
        """Every stage's result came from the cache: the row's figures are an earlier run's work."""
        return bool(self.cache_hits) and all(self.cache_hits)

    def failed(self, error: str) -> dict[str, Any]:
        """A stage (or the chain between them) failed: the row names the error and the work
        key; it is never ``cached``, as the work is not all in."""
        return failed_row(self.name, error, run_key=self.run_key)

    def publish_failed(self, error: str) -> dict[str, Any]:
        """Publishing failed: the spec failed, though its work is done (cached or not, as it was)."""
        return failed_row(self.name, error, run_key=self.run_key, cached=self.cached)

    def published(self, result: Mapping[str, Any], figures: Mapping[str, Any],
                  published: Mapping[str, Any]) -> dict[str, Any]:
        """The row of a published result: ``baseline kept`` when no candidate beat the
        baseline (the optimizer kept it), else ``optimized``; with the published version."""
        status = "baseline kept" if result["kept_baseline"] else "optimized"
        return summary_row(self.name, figures, status=status, version=published["version"], labels=published["labels"],
                           promotion=published["promotion"], cached=self.cached, run_key=self.run_key)

    @staticmethod
    def reporting_failed(row: Mapping[str, Any], error: str) -> dict[str, Any]:
        """A published row whose artifacts or run logs failed: the template is published (the
        spec did not fail), the error says what is missing."""
        return {**row, "error": f"reporting failed: {error}"}


def dask_worker_count(requested: int | None, server_urls: Sequence[str]) -> int:
    """Local Dask workers for a run: as many as asked, else one per endpoint (each endpoint
    serves one spec at a time, so more workers would only wait for a slot); at least one."""
    return requested or max(1, len(server_urls))


def parallel_specs(parallel: bool, backend: str) -> tuple[bool, str | None]:
    """Whether specs may run side by side on the flow's task runner, and when asked but
    refused, why (a warning for the run's log).

    The in-process engine is not thread-safe: side by side needs the server backend.
    """
    if parallel and backend == "local":
        return False, ("parallel=True needs the server backend (the in-process engine is not thread-safe): "
                       "running specs one at a time")
    return parallel, None

"""``Registry``: immutable template versions, movable labels, artifacts and run logs.

Layout under the root (a folder, or any fsspec URL such as ``s3://bucket/prompts``)::

    templates/<name>/versions/<N>.json          VersionRecord (content, parent, provenance,
                                                metrics, content_hash, record_hash)
    templates/<name>/labels.json                {label: version} checkpoint
    templates/<name>/labels/history/<seq>.json  append-only label moves (who, when, from, to)
    artifacts/<kind>/<name>/versions/<N>.json   ArtifactRecord manifest (a TTFT model, ...)
    artifacts/<kind>/<name>/blobs/sha256-<hex>  the manifest's files, content-addressed
    runs/<run_id>/<part>.parquet                run logs, written once

Nothing is ever overwritten except the label checkpoint, and nothing is deleted:
``repair`` moves corrupt label events aside into ``templates/<name>/quarantine/``. See
``collection`` for how concurrent publishers and label moves stay safe without locks, and
what a corrupt label event takes down (its own template's labels, at most).

The label ordering rule:

* ``publish(..., labels=[...])`` moves all its labels in one event (all or none), and
  only forward: a label that already points at a newer version (a concurrent publisher
  got there first) is left where it is, and a warning is logged. Two publishers racing
  therefore never move ``production`` back to the older of their versions.
* ``set_label`` and ``rollback`` are an operator's explicit choice and may move a label
  anywhere. ``set_label(..., expected=N)`` is a compare-and-set: the move happens only
  if the label still points at N when it is recorded (``expected=None``: only if unset).
* ``set_labels`` moves several labels in one event, forward only by default: what
  finishing an interrupted publish should use.

Canaries: ``set_canary(name, version, share)`` puts a version on the ``canary`` label
with a traffic share; clients serve it to that share of the keys asking for
``NAME@production`` (``split`` says how a label is served). Setting it again with a
larger share widens it. ``end_canary`` (and ``rollback`` of the ``canary`` label) removes
the label, leaving ``production`` as it is; ``promote_canary`` points ``production`` at
the canary's version and removes the canary, in one event. Each is a history event.

Example::

    reg = Registry("artifacts/registry")
    rec = reg.publish("summarize", content, provenance=prov, metrics=metrics, labels=["candidate"])
    reg.set_label("summarize", "production", rec.version, reason="won the nightly run")
    reg.rollback("summarize", "production", reason="quality dropped")
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from promptdistill.core.errors import IntegrityError, RegistryError, TemplateNotFoundError
from promptdistill.registry.backend import Backend, StoreUnavailableError, open_backend
from promptdistill.registry.collection import Collection, HistoryScan, LabelChange, label_moves, label_stack, utc_now
from promptdistill.registry.hashing import content_hash, sha256_hex, to_json_value
from promptdistill.registry.records import (
    CANARY_LABEL,
    SPLIT_LABEL,
    ArtifactRecord,
    LabelEvent,
    Split,
    VersionRecord,
    check_content,
    check_label,
    check_name,
    check_share,
    check_version,
    parse_ref,
)

if TYPE_CHECKING:
    from promptdistill.registry.verify import Problem, RepairReport

__all__ = ["ANY_VERSION", "Registry", "code_provenance", "default_actor"]

logger = logging.getLogger("promptdistill.registry")


class _AnyVersion:
    def __repr__(self) -> str:
        return "ANY_VERSION"


ANY_VERSION: Any = _AnyVersion()
"""``set_label(expected=ANY_VERSION)`` (the default): move the label whatever it holds."""


def default_actor() -> str:
    """``$PROMPTDISTILL_ACTOR``, else ``user@host``."""
    if os.environ.get("PROMPTDISTILL_ACTOR"):
        return os.environ["PROMPTDISTILL_ACTOR"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def code_provenance() -> dict[str, Any]:
    """The project's version and git commit (None outside a git checkout)."""
    from importlib import metadata

    try:
        version = metadata.version("promptdistill")
    except metadata.PackageNotFoundError:
        version = None
    commit, dirty = None, None
    here = Path(__file__).resolve().parent
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(here), *a], capture_output=True, text=True, timeout=5)  # noqa: E731
        head = run("rev-parse", "HEAD")
        if head.returncode == 0:
            commit = head.stdout.strip()
            dirty = bool(run("status", "--porcelain", "--untracked-files=no").stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"promptdistill_version": version, "git_commit": commit, "git_dirty": dirty}


class Registry:
    """Read and write the template registry at ``root``.

    Args:
        root: a folder (created on first write) or an fsspec URL (``s3://bucket/prefix``).
        storage_options: passed to fsspec for URLs (``{"client_kwargs": {"endpoint_url": ...}}``).
        must_exist: a root that is missing or holds no registry (an unmounted share) is
            unavailable (``StoreUnavailableError``) instead of an empty registry. Readers
            that must never take an outage for "not found" set it (the client does).
    """

    def __init__(self, root: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                 must_exist: bool = False) -> None:
        self.backend: Backend = open_backend(root, storage_options, must_exist=must_exist)

    @property
    def root(self) -> str:
        return self.backend.root

    def __repr__(self) -> str:
        return f"Registry({self.root!r})"

    def _templates(self, name: str) -> Collection:
        return Collection(self.backend, f"templates/{check_name(name)}", f"template {name!r}",
                          repair=f"promptdistill templates repair {name}")

    # ------------------------------------------------------------------ reading
    def names(self) -> list[str]:
        """Template names that have at least one version, or whose versions cannot be listed
        (a broken template is listed, so that reading it says what is wrong). A folder whose
        name is not a template name is skipped, with a warning.

        Raises:
            StoreUnavailableError: the root is unreachable, or (``must_exist``) holds no registry.
        """
        found = []
        for n in self.backend.list("templates"):
            try:
                if self._templates(n).versions():
                    found.append(n)
            except IntegrityError:
                found.append(n)
            except RegistryError as e:
                if isinstance(e, StoreUnavailableError):
                    raise
                logger.warning("%s: skipped, not a template: %s", self.backend.url(f"templates/{n}"), e)
        if not found:
            self.backend.check_available()  # an empty mount point is not "no templates"
        return found

    def versions(self, name: str) -> list[int]:
        """Version numbers of a template, ascending (empty if unknown)."""
        return self._templates(name).versions()

    def get_version(self, name: str, version: int) -> VersionRecord:
        """One version, verified against its hashes.

        Raises:
            TemplateNotFoundError: unknown name or version.
            IntegrityError: the stored file was edited after publishing.
            StoreUnavailableError: the store could not be reached.
        """
        coll = self._templates(name)
        check_version(version)
        data = coll.read_version(version)
        return VersionRecord.from_bytes(data, where=self.backend.url(coll.version_key(version)), name=name, version=version)

    def labels(self, name: str) -> dict[str, int]:
        """{label: version} for a template."""
        return self._templates(name).labels()

    def resolve(self, name: str, label: str) -> int:
        """The version ``label`` points to; TemplateNotFoundError if it is not set."""
        return self._templates(name).resolve(check_label(label))

    def shares(self, name: str) -> dict[str, float]:
        """{canary label: traffic share} for a template (empty while no canary is set)."""
        return self._templates(name).state()[2]

    def split(self, name: str, label: str) -> Split:
        """How ``label`` is served: its version and, for ``production`` with a canary set,
        the canary's version and share (one read of the label state).

        Raises:
            TemplateNotFoundError: the label is not set.
        """
        coll = self._templates(name)
        check_label(label)
        _seq, labels, shares = coll.state()
        if label not in labels:
            coll.resolve(label)  # raises the not-found error with the known labels
        version = labels[label]
        canary = labels.get(CANARY_LABEL)
        if label != SPLIT_LABEL or canary is None or canary == version or CANARY_LABEL not in shares:
            return Split(version)
        return Split(version, canary, shares[CANARY_LABEL])

    def get(self, ref: str, *, label: str | None = None, version: int | None = None) -> VersionRecord:
        """A version by reference: ``name@label``, ``name:3`` or ``name`` (production label)."""
        name, label, version = parse_ref(ref, label=label, version=version)
        if version is None:
            version = self.resolve(name, label)
        return self.get_version(name, version)

    def history(self, name: str, label: str | None = None) -> list[LabelEvent]:
        """Label events of a template, oldest first; with ``label``, that label's moves only
        (an event that moved several labels shows as this label's move)."""
        events = self._templates(name).history()
        return events if label is None else label_moves(events, check_label(label))

    def history_scan(self, name: str) -> HistoryScan:
        """Every label event of a template that can be read, and why each other one cannot
        (``history`` raises on the first corrupt event instead)."""
        return self._templates(name).scan_history()

    # ------------------------------------------------------------------ writing
    def publish(
        self,
        name: str,
        content: Mapping[str, Any],
        *,
        parent: int | None = None,
        provenance: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        labels: Iterable[str] = (),
        actor: str | None = None,
        reason: str = "",
    ) -> VersionRecord:
        """Store ``content`` as the next version of ``name``; then set ``labels`` to it.

        The version appears whole or not at all; concurrent publishers get distinct
        numbers. The labels are then moved in one event, all or none, and only forward
        (see the module docstring). ``provenance`` gets a ``code`` entry (project version
        and git commit) unless it has one.

        Raises:
            RegistryError: a bad name, label, parent or content (naming the field).
        """
        coll = self._templates(name)
        labels = list(dict.fromkeys(check_label(x) for x in labels))
        self.backend.ensure_root()
        content = to_json_value(dict(content) if isinstance(content, Mapping) else content, "content")
        check_content(content, f"{name}: content", name=name)
        if parent is not None:
            self.get_version(name, parent)  # must exist and be intact
        provenance = to_json_value(dict(provenance or {}), "provenance")
        provenance.setdefault("code", code_provenance())
        metrics = to_json_value(dict(metrics or {}), "metrics")
        actor = actor or default_actor()
        created_at = utc_now()
        chash = content_hash(content)
        records: dict[int, VersionRecord] = {}

        def build(version: int) -> bytes:
            records[version] = VersionRecord(
                name=name, version=version, parent=parent, created_at=created_at, actor=actor,
                content=content, provenance=provenance, metrics=metrics, content_hash=chash,
            )
            return records[version].to_bytes()

        version = coll.create_version(build)
        if labels:
            try:
                self._move_forward(coll, labels, version, actor=actor, reason=reason or "published")
            except IntegrityError as e:
                raise IntegrityError(f"published {name}:{version}, but did not set {', '.join(labels)}: {e}") from None
        return records[version]

    def set_labels(self, name: str, labels: Iterable[str], version: int, *, actor: str | None = None,
                   reason: str = "", forward_only: bool = True) -> LabelEvent | None:
        """Point several labels at an existing, intact ``version`` in one event (all or none).

        Args:
            forward_only: leave a label that points at a newer version where it is (the
                rule a publish follows; what finishing an interrupted publish should use).

        Returns:
            The event, or None when every label was left where it was.
        """
        self.get_version(name, check_version(version))
        labels = list(dict.fromkeys(check_label(x) for x in labels))
        if not labels:
            return None
        coll = self._templates(name)
        actor = actor or default_actor()
        if forward_only:
            return self._move_forward(coll, labels, version, actor=actor, reason=reason)
        return coll.move_labels(lambda _e, _l: {x: version for x in labels}, action="set", actor=actor, reason=reason)

    @staticmethod
    def _move_forward(coll: Collection, labels: list[str], version: int, *, actor: str,
                      reason: str) -> LabelEvent | None:
        """Point ``labels`` at ``version`` in one event, except those already at a newer one."""

        def target(_events: Any, current: dict[str, int]) -> dict[str, int]:
            newer = {x: current[x] for x in labels if current.get(x, 0) > version}
            if newer:
                logger.warning("%s: %s already at newer version(s) %s; left there (a publish never moves a "
                               "label back)", coll.backend.url(coll.prefix), coll.what, newer)
            return {x: version for x in labels if x not in newer}

        return coll.move_labels(target, action="set", actor=actor, reason=reason)

    def set_label(self, name: str, label: str, version: int, *, actor: str | None = None, reason: str = "",
                  expected: Any = ANY_VERSION) -> LabelEvent:
        """Point ``label`` at an existing, intact ``version`` and record the move.

        Args:
            expected: compare-and-set: move only if the label points at this version when
                the move is recorded (None: only if it is unset). Default: whatever it holds.

        Raises:
            RegistryError: ``expected`` was given and the label holds something else.
        """
        self.get_version(name, check_version(version))
        coll = self._templates(name)
        check_label(label)

        def target(_events: Any, labels: dict[str, int]) -> int:
            if expected is not ANY_VERSION and labels.get(label) != expected:
                raise RegistryError(
                    f"{coll.backend.url(coll.prefix)}: label {label!r} points at {labels.get(label)}, not "
                    f"{expected} (moved by someone else); not moved to {version}"
                )
            return version

        return coll.move_label(label, target, action="set", actor=actor or default_actor(), reason=reason)

    def rollback(self, name: str, label: str, *, actor: str | None = None, reason: str = "") -> LabelEvent:
        """Move ``label`` back to the version it had before its current one; for the
        ``canary`` label, end the canary (``end_canary``).

        Repeated rollbacks walk further back (``set 1, set 2, set 3, rollback, rollback``
        ends at 1).

        Raises:
            TemplateNotFoundError: the label is not set.
            RegistryError: the label has no earlier version.
        """
        check_label(label)
        if label == CANARY_LABEL:
            return self.end_canary(name, actor=actor, reason=reason or "canary rolled back")
        coll = self._templates(name)

        def target(events: list[LabelEvent] | None, labels: dict[str, int]) -> int:
            if label not in labels:
                coll.resolve(label)  # raises the not-found error with the known labels
            stack = label_stack(events or [], label)
            if len(stack) < 2:
                raise RegistryError(f"{coll.backend.url(coll.prefix)}: label {label!r} has no earlier version to roll back to")
            return stack[-2]

        return coll.move_label(label, target, action="rollback", actor=actor or default_actor(),
                               reason=reason, needs_history=True)

    def set_canary(self, name: str, version: int, share: float, *, actor: str | None = None,
                   reason: str = "") -> LabelEvent:
        """Put ``version`` on the ``canary`` label with ``share`` of ``production``'s traffic.

        Setting the same version again with another share widens (or narrows) it; another
        version replaces the canary (its keys are drawn afresh).

        Raises:
            RegistryError: a share outside (0, 1], production unset, or ``version`` is
                production's (a canary of itself serves nothing new).
        """
        share = check_share(share)
        self.get_version(name, check_version(version))
        coll = self._templates(name)

        def target(_events: Any, labels: dict[str, int]) -> LabelChange:
            if labels.get(SPLIT_LABEL) is None:
                raise RegistryError(f"{coll.backend.url(coll.prefix)}: {coll.what} has no {SPLIT_LABEL} label: "
                                    f"a canary takes a share of {SPLIT_LABEL}'s traffic (promote a version first)")
            if labels[SPLIT_LABEL] == version:
                raise RegistryError(f"{coll.backend.url(coll.prefix)}: version {version} is {SPLIT_LABEL} already; "
                                    "a canary must be another version")
            return LabelChange({CANARY_LABEL: version}, {CANARY_LABEL: share})

        before = coll.state()[2].get(CANARY_LABEL)
        why = reason or (f"canary share {share:g}" if before is None else f"canary share {before:g} -> {share:g}")
        event = coll.move_labels(target, action="set", actor=actor or default_actor(), reason=why)
        assert event is not None
        return event

    def end_canary(self, name: str, *, actor: str | None = None, reason: str = "") -> LabelEvent:
        """Remove the ``canary`` label (and its share); ``production`` is left as it is.

        Raises:
            RegistryError: no canary is set.
        """
        coll = self._templates(name)

        def target(_events: Any, labels: dict[str, int]) -> LabelChange:
            if CANARY_LABEL not in labels:
                raise RegistryError(f"{coll.backend.url(coll.prefix)}: {coll.what} has no canary to end "
                                    f"(labels: {', '.join(f'{k}={v}' for k, v in sorted(labels.items())) or 'none'})")
            return LabelChange({CANARY_LABEL: None})

        event = coll.move_labels(target, action="unset", actor=actor or default_actor(), reason=reason or "canary ended")
        assert event is not None
        return event

    def promote_canary(self, name: str, *, actor: str | None = None, reason: str = "") -> LabelEvent:
        """Point ``production`` at the canary's version and remove the canary, in one event.

        Raises:
            RegistryError: no canary is set.
        """
        coll = self._templates(name)

        def target(_events: Any, labels: dict[str, int]) -> LabelChange:
            if CANARY_LABEL not in labels:
                raise RegistryError(f"{coll.backend.url(coll.prefix)}: {coll.what} has no canary to promote")
            return LabelChange({SPLIT_LABEL: labels[CANARY_LABEL], CANARY_LABEL: None})

        event = coll.move_labels(target, action="set", actor=actor or default_actor(),
                                 reason=reason or "canary promoted")
        assert event is not None
        return event

    def verify(self, names: Iterable[str] | None = None) -> list[Problem]:
        """Every problem of the templates ``names`` (default: all), without changing anything.

        See ``promptdistill.registry.verify`` for what is checked.
        """
        from promptdistill.registry.verify import verify_templates

        return verify_templates(self, names)

    def repair(self, name: str, *, actor: str | None = None) -> RepairReport:
        """Move the corrupt label events of ``name`` to quarantine, so its labels can be read
        and moved again; rewrite its checkpoint. Versions are never moved."""
        from promptdistill.registry.verify import repair_template

        return repair_template(self, name, actor=actor or default_actor())

    # ---------------------------------------------------------------- artifacts
    def _artifacts(self, kind: str, name: str) -> Collection:
        check_name(kind, "artifact kind")
        check_name(name, "artifact name")
        return Collection(self.backend, f"artifacts/{kind}/{name}", f"artifact {kind}/{name}")

    def put_artifact(
        self,
        kind: str,
        name: str,
        files: Mapping[str, bytes],
        *,
        metadata: Mapping[str, Any] | None = None,
        labels: Iterable[str] = (),
        actor: str | None = None,
    ) -> ArtifactRecord:
        """Store a set of files (a fitted TTFT model, ...) as the next version of ``kind/name``.

        The files are written first as content-addressed blobs; the version becomes
        visible only when its manifest is created, so it appears whole or not at all.
        """
        coll = self._artifacts(kind, name)
        labels = list(dict.fromkeys(check_label(x) for x in labels))
        if not files:
            raise RegistryError(f"artifact {kind}/{name}: needs at least one file")
        self.backend.ensure_root()
        manifest: dict[str, dict[str, Any]] = {}
        for file_name, data in files.items():
            check_name(file_name, "artifact file name")
            if not isinstance(data, (bytes, bytearray)):
                raise RegistryError(f"artifact {kind}/{name}: file {file_name!r} must be bytes, got {type(data).__name__}")
            digest = sha256_hex(bytes(data))
            try:
                self.backend.create(f"{coll.prefix}/blobs/{digest.replace(':', '-')}", bytes(data))
            except FileExistsError:
                pass  # same bytes already stored (verified on read)
            manifest[file_name] = {"sha256": digest, "size": len(data)}
        metadata = to_json_value(dict(metadata or {}), "metadata")
        actor = actor or default_actor()
        created_at = utc_now()
        records: dict[int, ArtifactRecord] = {}

        def build(version: int) -> bytes:
            records[version] = ArtifactRecord(kind=kind, name=name, version=version, created_at=created_at,
                                              actor=actor, files=manifest, metadata=metadata)
            return records[version].to_bytes()

        version = coll.create_version(build)
        if labels:
            self._move_forward(coll, labels, version, actor=actor, reason="published")
        return records[version]

    def artifact_names(self, kind: str) -> list[str]:
        return self.backend.list(f"artifacts/{check_name(kind, 'artifact kind')}")

    def artifact_versions(self, kind: str, name: str) -> list[int]:
        return self._artifacts(kind, name).versions()

    def get_artifact(self, kind: str, name: str, *, version: int | None = None, label: str | None = None) -> ArtifactRecord:
        """An artifact manifest: by version, by label, or the latest version."""
        coll = self._artifacts(kind, name)
        if version is not None and label is not None:
            raise RegistryError(f"artifact {kind}/{name}: give a version or a label, not both")
        if label is not None:
            version = coll.resolve(check_label(label))
        elif version is None:
            known = coll.versions()
            if not known:
                self.backend.check_available()
                raise TemplateNotFoundError(f"{self.root}: unknown artifact {kind}/{name}")
            version = known[-1]
        data = coll.read_version(check_version(version))
        return ArtifactRecord.from_bytes(data, where=self.backend.url(coll.version_key(version)),
                                         kind=kind, name=name, version=version)

    def read_artifact_files(self, record: ArtifactRecord) -> dict[str, bytes]:
        """The files of an artifact version, each checked against its sha256."""
        coll = self._artifacts(record.kind, record.name)
        out = {}
        for file_name, info in record.files.items():
            key = f"{coll.prefix}/blobs/{info['sha256'].replace(':', '-')}"
            try:
                data = self.backend.read(key)
            except FileNotFoundError:
                raise IntegrityError(
                    f"{self.backend.url(key)}: file {file_name!r} of {record.kind}/{record.name}:{record.version} is missing"
                ) from None
            if sha256_hex(data) != info["sha256"]:
                raise IntegrityError(f"{self.backend.url(key)}: file {file_name!r} does not match its sha256")
            out[file_name] = data
        return out

    # ----------------------------------------------------------------- run logs
    def put_run_log(self, run_id: str, log: Any, *, part: str = "log") -> str:
        """Store a run log once (parquet bytes, or a pandas DataFrame); returns its URL.

        Raises:
            RegistryError: this run already has a log with that part name.
        """
        check_name(run_id, "run id")
        check_name(part, "run log part")
        data = log if isinstance(log, (bytes, bytearray)) else _to_parquet(log)
        key = f"runs/{run_id}/{part}.parquet"
        self.backend.ensure_root()
        try:
            self.backend.create(key, bytes(data))
        except FileExistsError:
            raise RegistryError(f"{self.backend.url(key)}: run log exists already (run logs are written once)") from None
        return self.backend.url(key)

    def get_run_log(self, run_id: str, *, part: str = "log") -> bytes:
        key = f"runs/{check_name(run_id, 'run id')}/{check_name(part, 'run log part')}.parquet"
        try:
            return self.backend.read(key)
        except FileNotFoundError:
            raise RegistryError(f"{self.backend.url(key)}: no such run log") from None

    def read_run_log(self, run_id: str, *, part: str = "log"):
        """A run log as a pandas DataFrame (imports pandas)."""
        import io

        import pandas as pd

        return pd.read_parquet(io.BytesIO(self.get_run_log(run_id, part=part)))

    def run_ids(self) -> list[str]:
        return self.backend.list("runs")


def _to_parquet(log: Any) -> bytes:
    if not hasattr(log, "to_parquet"):
        raise RegistryError(f"a run log must be parquet bytes or a pandas DataFrame, got {type(log).__name__}")
    import io

    buf = io.BytesIO()
    log.to_parquet(buf, index=False)
    return buf.getvalue()


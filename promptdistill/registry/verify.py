"""Check a registry's templates for every problem, and move corrupt label events aside.

``verify_templates`` reads everything of each template and reports, without changing
anything:

* ``version``: a version file that fails its checks (edited, not JSON, ``"version": 2.0``,
  a FIFO, a symlink out of the root) or whose name is not a version number;
* ``event``: a label event that is unreadable or malformed (repairable);
* ``label``: a label of the latest intact event that points at a missing or corrupt version;
* ``checkpoint``: a ``labels.json`` that is unreadable, is not a regular file (a FIFO, a
  folder, a symlink out of the root or a loop), or names a missing or corrupt event
  (readers ignore it; a repair moves it aside if need be and writes a new one);
* ``layout``: a folder that cannot be read at all (a symlink out of the root), or a name
  under ``templates/`` that is not a template name.

``repair_template`` moves the corrupt label events of one template (and a checkpoint
that is not a file) into ``templates/<name>/quarantine/<stamp>/`` (with ``why.json``) and
rewrites its checkpoint from the whole history, so ``get``, ``promote`` and ``rollback``
work again; it is safe beside promotes and other repairs (see ``Collection.quarantine``). It
never deletes anything and never moves a version: a version number, once published, is
never reused, so a corrupt version stays where it is and is reported (point the label at
another version).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from promptdistill.core.errors import IntegrityError, RegistryError, TemplateNotFoundError
from promptdistill.registry.collection import _VERSION_FILE, Collection, event_seq
from promptdistill.registry.records import check_name

if TYPE_CHECKING:
    from promptdistill.registry.store import Registry

__all__ = ["Problem", "RepairReport", "repair_template", "verify_templates"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a template; ``where`` is the file or folder."""

    name: str
    kind: str
    """``version``, ``event``, ``label``, ``checkpoint`` or ``layout``."""
    where: str
    reason: str
    seq: int | None = None
    """The label event's number (kind ``event``)."""

    @property
    def repairable(self) -> bool:
        """Whether ``templates repair`` fixes it (a corrupt event, a bad checkpoint)."""
        return self.kind in ("event", "checkpoint")

    def __str__(self) -> str:
        reason = self.reason if self.reason.startswith(self.where) else f"{self.where}: {self.reason}"
        return f"{self.name}: {self.kind}: {reason}"


@dataclass(frozen=True)
class RepairReport:
    """What ``repair_template`` did."""

    name: str
    moved: list[str]
    """Where each quarantined event (or checkpoint) now is."""
    labels: dict[str, int]
    """The labels after the repair."""
    remaining: list[Problem]
    """Problems a repair does not fix (versions, labels pointing at missing versions)."""


def verify_templates(registry: Registry, names: Iterable[str] | None = None) -> list[Problem]:
    """Every problem of the given templates (default: every folder under ``templates/``).

    Raises:
        TemplateNotFoundError: a name given has no folder in the registry.
        StoreUnavailableError: the store cannot be reached.
    """
    backend = registry.backend
    present = backend.list("templates")
    if names is None:
        wanted = present
        if not wanted:
            backend.check_available()
    else:
        wanted = list(dict.fromkeys(names))
        missing = [n for n in wanted if n not in present]
        if missing:
            backend.check_available()
            raise TemplateNotFoundError(f"{registry.root}: no template {', '.join(map(repr, missing))}")
    problems: list[Problem] = []
    for name in wanted:
        try:
            check_name(name)
        except RegistryError as e:
            problems.append(Problem(name, "layout", backend.url(f"templates/{name}"), f"{e}; ignored"))
            continue
        problems += _verify_one(registry, name)
    return problems


def _verify_one(registry: Registry, name: str) -> list[Problem]:
    coll: Collection = registry._templates(name)
    backend = coll.backend
    out: list[Problem] = []
    intact: set[int] = set()
    try:
        files = backend.list(f"{coll.prefix}/versions")
    except IntegrityError as e:
        out.append(Problem(name, "layout", backend.url(f"{coll.prefix}/versions"), str(e)))
        files = []
    for file in files:
        m = _VERSION_FILE.fullmatch(file)
        where = backend.url(f"{coll.prefix}/versions/{file}")
        if not m:
            out.append(Problem(name, "version", where, "not a version file name (N.json, N from 1); ignored"))
            continue
        try:
            registry.get_version(name, int(m.group(1)))
            intact.add(int(m.group(1)))
        except (IntegrityError, TemplateNotFoundError) as e:
            out.append(Problem(name, "version", where, str(e)))
    try:
        scan = coll.scan_history()
        history_files = backend.list(f"{coll.prefix}/labels/history")
    except IntegrityError as e:
        out.append(Problem(name, "layout", backend.url(f"{coll.prefix}/labels/history"), str(e)))
        return out
    for file in history_files:
        if event_seq(file) is None:
            out.append(Problem(name, "event", backend.url(f"{coll.prefix}/labels/history/{file}"),
                               "not an event file name (8 digits from 00000001, .json); ignored"))
    for seq, reason in sorted(scan.corrupt.items()):
        note = " (the latest event: the labels are unknown)" if seq == scan.latest else ""
        out.append(Problem(name, "event", backend.url(coll.event_key(seq)), reason + note, seq=seq))
    if scan.latest and scan.latest not in scan.corrupt:
        latest = next(e for e in scan.events if e.seq == scan.latest)
        for label, version in sorted(latest.labels.items()):
            if version not in intact:
                state = "is corrupt" if version in _numbers(files) else "does not exist"
                out.append(Problem(name, "label", backend.url(coll.event_key(latest.seq)),
                                   f"label {label!r} points at version {version}, which {state}"))
    out += _check_checkpoint(coll, name, scan.corrupt)
    return out


def _numbers(files: list[str]) -> set[int]:
    return {int(m.group(1)) for f in files if (m := _VERSION_FILE.fullmatch(f))}


def _check_checkpoint(coll: Collection, name: str, corrupt: dict[int, str]) -> list[Problem]:
    checkpoint = coll.read_checkpoint()
    where = coll.backend.url(coll.checkpoint_key)
    if checkpoint.problem:
        return [Problem(name, "checkpoint", where, checkpoint.problem)]
    seq = checkpoint.seq
    if seq and seq not in corrupt:  # a corrupt one is reported as the event
        try:
            coll.backend.read(coll.event_key(seq))
        except FileNotFoundError:
            return [Problem(name, "checkpoint", where, f"names event {seq}, which does not exist; readers ignore it")]
    return []


def repair_template(registry: Registry, name: str, *, actor: str) -> RepairReport:
    """Quarantine the corrupt label events of ``name`` (and a checkpoint that is not a
    file) and rewrite its checkpoint from the whole history.

    Raises:
        TemplateNotFoundError: no such template.
        IntegrityError: the history folder itself cannot be listed (a symlink out of the root).
    """
    problems = verify_templates(registry, [name])
    coll = registry._templates(name)
    layout = [p for p in problems if p.kind == "layout"]
    if layout:
        raise IntegrityError(f"{layout[0]} (a repair moves bad label events, not folders: fix this by hand)")
    result = coll.quarantine(actor=actor)
    labels = coll.labels()
    remaining = [p for p in verify_templates(registry, [name]) if not p.repairable]
    return RepairReport(name=name, moved=result.moved, labels=labels, remaining=remaining)

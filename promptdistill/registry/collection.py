"""Numbered immutable versions plus movable labels under one prefix of a backend.

Layout under ``<prefix>/`` (``templates/<name>`` or ``artifacts/<kind>/<name>``)::

    versions/<N>.json            immutable, created once (create-only write)
    labels.json                  checkpoint: {"seq": n, "labels": {label: version}}
    labels/history/<seq>.json    append-only label moves, numbered from 1

Concurrency without locks, using only the backend's create-only write:

* a new version takes the next free number; two publishers racing for N both try
  to create ``versions/N.json``, one wins and the other retries with N+1;
* a label move is the creation of history event ``seq+1`` carrying the full label
  map after the move (a compare-and-swap on the whole label state: a writer who lost
  the race re-reads and retries). One event may move several labels at once, so a
  publish with ``labels=[candidate, production]`` sets all of them or none.

The history is the source of truth. ``labels.json`` is only a hint of where it ends:
readers read the event the checkpoint names, check it, and roll forward over any later
events, so a stale checkpoint (a writer that crashed between the two writes, or a slow
one) never hides a move, and a checkpoint that disagrees with the history, names an
event that does not exist, or is not a regular file at all, is ignored (the history is
listed instead). Where the roll forward finds a missing number, the history is listed
before that is taken as its end: a repair leaves gaps where it quarantined events, and
a read that stopped at one would serve old labels and let the next move fill the gap
behind later events. A new event is always numbered after the last one that exists.

A corrupt event (not JSON, a wrong field, a FIFO, a symlink out of the root) takes down
the labels of its own name at most, and only while it is the **latest** event: every
event carries the whole label map, so the latest event alone says where the labels are.
An older corrupt event is skipped with an error logged (only a rollback, which needs the
whole history, refuses). A corrupt latest event leaves the labels unknown: reading them
raises ``IntegrityError`` naming the file, and so does every label move, until
``repair`` moves the bad event(s) aside (``quarantine/<stamp>/labels/history/`` under
the prefix, with a ``why.json``; nothing is deleted). The labels are then those of the
latest intact event, and when the latest event was the corrupt one the repair records
that state as a new event first (see ``quarantine``). See docs/client.md for why the state
before a corrupt latest event is not served without a repair.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from datetime import datetime, timezone
from typing import Callable, Mapping

from promptdistill.core.errors import IntegrityError, RegistryError, TemplateNotFoundError
from promptdistill.registry.backend import Backend, StoreUnavailableError
from promptdistill.registry.records import LabelEvent

__all__ = ["Checkpoint", "Collection", "HistoryScan", "LabelChange", "RepairResult", "event_seq", "label_moves", "label_stack",
           "utc_now"]

logger = logging.getLogger("promptdistill.registry")

_VERSION_FILE = re.compile(r"([1-9][0-9]*)\.json")
_EVENT_FILE = re.compile(r"([0-9]{1,12})\.json")
_MAX_ATTEMPTS = 256

Target = Callable[[list[LabelEvent] | None, dict[str, int]], "Mapping[str, int | None] | LabelChange"]


@dataclasses.dataclass(frozen=True)
class LabelChange:
    """What a label move's target may return besides ``{label: version}``: labels to move
    (None removes one) and canary shares to set (None removes one). A removed label loses
    its share."""

    labels: Mapping[str, int | None]
    shares: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


def event_seq(file_name: str) -> int | None:
    """The number of a label event file (``00000003.json`` -> 3); None for any other name."""
    m = _EVENT_FILE.fullmatch(file_name)
    if not m or int(m.group(1)) < 1 or file_name != f"{int(m.group(1)):08d}.json":
        return None
    return int(m.group(1))


def utc_now() -> str:
    """UTC time as ``2026-11-30T13:04:52.123Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def label_moves(events: list[LabelEvent], label: str) -> list[LabelEvent]:
    """The moves of one label, oldest first, one event each.

    An event that moved several labels (a publish) appears here as if it had moved
    ``label`` alone: its ``label``, ``from_version`` and ``to_version`` are this label's.
    """
    out: list[LabelEvent] = []
    before: dict[str, int] = {}
    for event in events:
        if event.label == label:
            out.append(event)
        elif label in event.labels and event.labels[label] != before.get(label):
            out.append(dataclasses.replace(event, label=label, from_version=before.get(label),
                                           to_version=event.labels[label]))
        elif label in before and label not in event.labels:  # removed beside another move (a canary promoted)
            out.append(dataclasses.replace(event, label=label, action="unset", from_version=before[label],
                                           to_version=before[label]))
        before = event.labels
    return out


def label_stack(events: list[LabelEvent], label: str) -> list[int]:
    """The versions a label went through, most recent last; a rollback pops one.

    ``set 1, set 2, set 3, rollback`` gives ``[1, 2]``: the label is at 2 and a further
    rollback goes to 1. Setting a label to the version it already has adds nothing.
    """
    stack: list[int] = []
    for event in label_moves(events, label):
        if event.action == "unset":  # removed: a later set starts afresh
            stack = []
            continue
        if event.action == "rollback" and stack:
            stack.pop()
        elif not stack and event.from_version is not None:
            stack.append(event.from_version)
        if not stack or stack[-1] != event.to_version:
            stack.append(event.to_version)
    return stack


@dataclasses.dataclass(frozen=True)
class HistoryScan:
    """Every event of a history that could be read, and why the others could not."""

    events: list[LabelEvent]
    """The intact events, oldest first."""
    corrupt: dict[int, str]
    """Event number -> the reason it was refused (the message names the file)."""
    latest: int
    """The number of the last event listed (0: none)."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What ``labels.json`` says, read by the one parser readers, ``verify`` and ``repair`` share."""

    seq: int | None
    """The event number it names (0: none yet); None when it is missing or unusable."""
    problem: str | None = None
    """Why it is unusable, naming the file (None: missing, or fine)."""
    not_a_file: bool = False
    """It is a FIFO, a socket, a folder or a symlink out of the root: a repair moves it
    aside before writing a new one (a write over it would fail)."""


@dataclasses.dataclass(frozen=True)
class RepairResult:
    """What ``Collection.quarantine`` did."""

    moved: list[str]
    """Where each quarantined object now is (URLs)."""
    recorded: LabelEvent | None
    """The event recording the labels the repair kept, when the latest event was corrupt."""


class Collection:
    """Versions and labels of one name. ``what`` names it in messages (``template 'x'``);
    ``repair`` is the command that quarantines its bad label events, for messages."""

    def __init__(self, backend: Backend, prefix: str, what: str, repair: str | None = None) -> None:
        self.backend = backend
        self.prefix = prefix
        self.what = what
        self.repair = repair

    def _not_found(self, message: str) -> TemplateNotFoundError:
        """A not-found error, once the store is known to be a registry at all.

        An empty mount point or a wrong prefix has no registry layout: that is the store
        being unavailable (a warm client keeps its last good copy), not "no such template".
        """
        self.backend.check_available()
        return TemplateNotFoundError(message)

    # ----------------------------------------------------------------- versions
    def version_key(self, version: int) -> str:
        return f"{self.prefix}/versions/{version}.json"

    def versions(self) -> list[int]:
        """Published version numbers, ascending.

        Raises:
            StoreUnavailableError: none, and the store holds no registry (``must_exist``).
        """
        names = self.backend.list(f"{self.prefix}/versions")
        found = sorted(int(m.group(1)) for n in names if (m := _VERSION_FILE.fullmatch(n)))
        if not found:
            self.backend.check_available()
        return found

    def read_version(self, version: int) -> bytes:
        """The stored bytes of one version.

        Raises:
            TemplateNotFoundError: no such version (the message lists the existing ones).
            StoreUnavailableError: the store is unreachable or holds no registry.
        """
        try:
            return self.backend.read(self.version_key(version))
        except FileNotFoundError:
            known = self.versions()
            if not known:
                raise self._not_found(f"{self.backend.root}: unknown {self.what}") from None
            raise self._not_found(
                f"{self.backend.url(self.version_key(version))}: {self.what} has no version {version} "
                f"(versions: {_span(known)})"
            ) from None

    def create_version(self, build: Callable[[int], bytes]) -> int:
        """Store ``build(N)`` as the next free version N and return N."""
        known = self.versions()
        version = (known[-1] if known else 0) + 1
        for _ in range(_MAX_ATTEMPTS):
            try:
                self.backend.create(self.version_key(version), build(version))
                return version
            except FileExistsError:
                version += 1  # another publisher took it: try the next number
        raise RegistryError(f"{self.backend.url(self.prefix)}: gave up after {_MAX_ATTEMPTS} version conflicts")

    # ------------------------------------------------------------------- labels
    def event_key(self, seq: int) -> str:
        return f"{self.prefix}/labels/history/{seq:08d}.json"

    def _read_event(self, seq: int) -> LabelEvent:
        key = self.event_key(seq)
        return LabelEvent.from_bytes(self.backend.read(key), where=self.backend.url(key), seq=seq)

    @property
    def checkpoint_key(self) -> str:
        return f"{self.prefix}/labels.json"

    def read_checkpoint(self) -> Checkpoint:
        """Parse ``labels.json`` (never raises for a bad one: it is only a hint).

        Raises:
            StoreUnavailableError: the store cannot be reached.
        """
        key = self.checkpoint_key
        where = self.backend.url(key)
        try:
            seq = json.loads(self.backend.read(key))["seq"]
        except FileNotFoundError:
            # A folder reads as missing; listed, it is something that is not a file.
            if "labels.json" in self.backend.list(self.prefix):
                return Checkpoint(None, f"{where}: is a folder, not a file; readers ignore it", not_a_file=True)
            return Checkpoint(None)
        except IntegrityError as e:  # a FIFO, a socket, a symlink out of the root or a loop
            return Checkpoint(None, f"{e}; readers ignore it", not_a_file=True)
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            return Checkpoint(None, f"{where}: unreadable ({type(e).__name__}: {e}); readers ignore it")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            return Checkpoint(None, f"{where}: seq {seq!r} is not an event number; readers ignore it")
        return Checkpoint(seq)

    def _checkpoint_seq(self) -> int | None:
        """The event number ``labels.json`` names, or None (missing or unusable, logged)."""
        checkpoint = self.read_checkpoint()
        if checkpoint.problem:
            logger.warning("%s (label checkpoint: reading the history instead; `%s` replaces it)", checkpoint.problem,
                           self.repair or "a repair")
        return checkpoint.seq

    def label_state(self) -> tuple[int, dict[str, int]]:
        """(last event number, {label: version}): the labels of the latest event.

        Raises:
            IntegrityError: the latest event is unreadable or malformed (naming the file,
                the field, and how to repair it). An older corrupt event is skipped.
        """
        seq, labels, _shares = self.state()
        return seq, labels

    def state(self) -> tuple[int, dict[str, int], dict[str, float]]:
        """(last event number, {label: version}, {canary label: share}) of the latest event
        (see ``label_state``)."""
        hint = self._checkpoint_seq()
        seq, labels, shares = 0, {}, {}
        if hint:
            try:
                event = self._read_event(hint)
                seq, labels, shares = event.seq, dict(event.labels), dict(event.shares)
            except FileNotFoundError:
                logger.warning("%s: the label checkpoint names event %d, which does not exist; reading the history",
                               self.backend.url(self.prefix), hint)
                hint = None
            except IntegrityError as e:
                logger.warning("%s: the label checkpoint names event %d, which is corrupt (%s); reading the history",
                               self.backend.url(self.prefix), hint, e)
                hint = None
        if hint is None:
            seq, labels, shares = self._latest_listed()
        while True:  # roll forward over events written after the checkpoint
            try:
                event = self._read_event(seq + 1)
            except FileNotFoundError:
                # The end, unless later events are listed: then this is a gap a repair left.
                seqs = self._event_seqs()
                if not seqs or seqs[-1] <= seq:
                    return seq, labels, shares
                seq, labels, shares = self._latest_listed()
                continue
            except IntegrityError as e:
                # Corrupt, but maybe not the latest: only the latest event decides.
                newer = self._latest_listed()
                if newer[0] <= seq + 1:
                    raise self._corrupt_latest(e) from None
                logger.error("%s (an older label event of %s: skipped, the labels come from event %d; "
                             "see `promptdistill templates verify`)", e, self.what, newer[0])
                seq, labels, shares = newer
                continue
            seq, labels, shares = event.seq, dict(event.labels), dict(event.shares)

    def _event_seqs(self) -> list[int]:
        return sorted(s for n in self.backend.list(f"{self.prefix}/labels/history") if (s := event_seq(n)))

    def _latest_listed(self) -> tuple[int, dict[str, int], dict[str, float]]:
        """(number, labels, shares) of the last event listed; (0, {}, {}) if there is none."""
        for _ in range(3):  # an event gone since the listing was moved by a repair: list again
            seqs = self._event_seqs()
            if not seqs:
                return 0, {}, {}
            try:
                event = self._read_event(seqs[-1])
            except FileNotFoundError:
                continue
            except IntegrityError as e:
                raise self._corrupt_latest(e) from None
            return event.seq, dict(event.labels), dict(event.shares)
        raise IntegrityError(f"{self.backend.url(self.event_key(seqs[-1]))}: listed but not readable")

    def _corrupt_latest(self, error: IntegrityError) -> IntegrityError:
        fix = f"`{self.repair}` moves it" if self.repair else "move it"
        return IntegrityError(f"{error} (the latest label event of {self.what}: its labels are unknown until it is "
                              f"repaired; {fix} to quarantine, and the labels are then those of the event before it)")

    def labels(self) -> dict[str, int]:
        return self.label_state()[1]

    def resolve(self, label: str) -> int:
        """The version a label points to.

        Raises:
            TemplateNotFoundError: the label is not set (the message lists the set ones).
        """
        labels = self.labels()
        if label not in labels:
            if not self.versions():
                raise self._not_found(f"{self.backend.root}: unknown {self.what}")
            raise self._not_found(
                f"{self.backend.url(self.prefix)}: {self.what} has no label {label!r} "
                f"(labels: {', '.join(f'{k}={v}' for k, v in sorted(labels.items())) or 'none'})"
            )
        return labels[label]

    def history(self) -> list[LabelEvent]:
        """Every label move, oldest first.

        Raises:
            IntegrityError: an event file is unreadable or malformed (naming it, and the repair).
        """
        scan = self.scan_history()
        if scan.corrupt:
            first = min(scan.corrupt)
            fix = f"; `{self.repair}` moves it to quarantine" if self.repair else ""
            raise IntegrityError(f"{scan.corrupt[first]} (label event {first} of {self.what}{fix})")
        return scan.events

    def scan_history(self) -> HistoryScan:
        """Every event that can be read, and the reason for each that cannot (never raises
        for a bad event; StoreUnavailableError if the store cannot be reached)."""
        seqs = self._event_seqs()
        events, corrupt = [], {}
        for s in seqs:
            try:
                events.append(self._read_event(s))
            except FileNotFoundError:
                corrupt[s] = f"{self.backend.url(self.event_key(s))}: listed but not readable"
            except IntegrityError as e:
                corrupt[s] = str(e)
        return HistoryScan(events=events, corrupt=corrupt, latest=seqs[-1] if seqs else 0)

    def quarantine(self, *, actor: str) -> RepairResult:
        """Move the corrupt label events and a checkpoint that is not a file into
        ``quarantine/<stamp>/`` (never deleted; ``why.json`` says who, when and why), then
        point the checkpoint at the latest event.

        The labels afterwards are those of the latest intact event, found by listing the
        whole history, never by a read that stops at a gap. Safe beside promotes and other
        repairs:

        * an older corrupt event's number is never taken again, since a move is always
          numbered after the last listed event;
        * a corrupt **latest** event's number would be free once it is moved, so first the
          labels of the latest intact event are recorded as a new event after it, with the
          same create-only write that orders every label move: a promote or another repair
          that got there first makes this one look again;
        * an event is moved only while it is still corrupt, and one another repair moved
          already is skipped.
        """
        for _ in range(_MAX_ATTEMPTS):
            scan = self.scan_history()
            recorded = None
            if scan.latest in scan.corrupt and scan.events:
                recorded = self._record_repair(scan, actor)
                if recorded is None:
                    continue  # another writer took the number: look again
            break
        else:
            raise RegistryError(f"{self.backend.url(self.prefix)}: gave up after {_MAX_ATTEMPTS} label conflicts")
        folder = f"{self.prefix}/quarantine/{utc_now().replace(':', '').replace('-', '')}-{uuid.uuid4().hex[:8]}"
        moved, events, why = [], {}, {}
        for seq in sorted(scan.corrupt):
            if self._still_corrupt(seq):
                target = f"{folder}/labels/history/{seq:08d}.json"
                if self._move_aside(self.event_key(seq), target, scan.corrupt[seq]):
                    moved.append(self.backend.url(target))
                    events[str(seq)] = scan.corrupt[seq]
        checkpoint = self.read_checkpoint()
        if checkpoint.not_a_file and self._move_aside(self.checkpoint_key, f"{folder}/labels.json",
                                                      checkpoint.problem or ""):
            moved.append(self.backend.url(f"{folder}/labels.json"))
            why["checkpoint"] = checkpoint.problem
        if moved:
            body = {"actor": actor, "at": utc_now(), "events": events, **why}
            self.backend.create(f"{folder}/why.json", (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())
        self.rewrite_checkpoint()
        return RepairResult(moved=moved, recorded=recorded)

    def _record_repair(self, scan: HistoryScan, actor: str) -> LabelEvent | None:
        """Create event ``scan.latest + 1`` holding the labels of the latest intact event;
        None if that number is taken (a label move or a repair got there first)."""
        last = scan.events[-1]
        lost = [s for s in sorted(scan.corrupt) if s > last.seq]
        numbers = ", ".join(map(str, lost))
        event = LabelEvent(
            seq=scan.latest + 1, label=last.label, from_version=last.labels[last.label],
            to_version=last.labels[last.label], action="set", actor=actor, at=utc_now(), labels=dict(last.labels),
            shares=dict(last.shares),
            reason=(f"repair: quarantined event{'s' if len(lost) > 1 else ''} {numbers} (corrupt); "
                    f"the labels are those of event {last.seq}"),
        )
        try:
            self.backend.create(self.event_key(event.seq), event.to_bytes())
        except FileExistsError:
            return None
        return event

    def _still_corrupt(self, seq: int) -> bool:
        try:
            self._read_event(seq)
        except FileNotFoundError:
            return False  # another repair moved it
        except IntegrityError:
            return True
        return False  # intact now: not ours to move

    def _move_aside(self, key: str, target: str, reason: str) -> bool:
        """Move one object into the quarantine; False if it is gone already (another repair)."""
        try:
            self.backend.move(key, target)
        except FileNotFoundError:
            return False
        logger.warning("%s: moved to %s: %s", self.backend.url(key), self.backend.url(target), reason)
        return True

    def rewrite_checkpoint(self) -> None:
        """Point ``labels.json`` at the latest event (after a repair, or to replace a bad one)."""
        seq = self.label_state()[0]
        self._write_checkpoint(self._read_event(seq) if seq else None)

    def move_labels(self, target: Target, *, action: str, actor: str, reason: str,
                    needs_history: bool = False) -> LabelEvent | None:
        """Append one event moving the labels ``target(history, labels)`` returns.

        ``target`` gets the history (when ``needs_history``, else None) and the current
        ``{label: version}``, and returns ``{label: new version}`` or a ``LabelChange``
        (labels removed, canary shares; empty: nothing to do, no event, returns None). The move is a create-only write of event ``seq+1``: if
        another writer got there first, the state is re-read and ``target`` asked again,
        so a ``target`` that checks the current state is a compare-and-set.
        """
        for _ in range(_MAX_ATTEMPTS):
            if needs_history:
                events = self.history()
                seq, labels, shares = ((events[-1].seq, dict(events[-1].labels), dict(events[-1].shares)) if events
                                       else (0, {}, {}))
                # events written after the listing are picked up by the conflict below
            else:
                events = None
                seq, labels, shares = self.state()
            change = target(events, labels)
            if not isinstance(change, LabelChange):
                change = LabelChange(dict(change))
            moves = dict(change.labels)
            if not moves and not change.shares:
                return None
            after = {k: v for k, v in {**labels, **moves}.items() if v is not None}
            shares = {k: v for k, v in {**shares, **change.shares}.items() if v is not None and k in after}
            label = next(iter(moves)) if moves else next(iter(change.shares))
            to_version = after.get(label, labels.get(label))
            if to_version is None:
                raise RegistryError(f"{self.backend.url(self.prefix)}: label {label!r} is not set")
            event = LabelEvent(
                seq=seq + 1, label=label, from_version=labels.get(label), to_version=to_version,
                action="unset" if label not in after else action, actor=actor, at=utc_now(), reason=reason,
                labels=after, shares=shares,
            )
            try:
                self.backend.create(self.event_key(event.seq), event.to_bytes())
            except FileExistsError:
                continue
            self._write_checkpoint(event)
            return event
        raise RegistryError(f"{self.backend.url(self.prefix)}: gave up after {_MAX_ATTEMPTS} label conflicts")

    def move_label(self, label: str, target: Callable[[list[LabelEvent] | None, dict[str, int]], int], *,
                   action: str, actor: str, reason: str, needs_history: bool = False) -> LabelEvent:
        """Append one move of one label; ``target(history, labels)`` picks the new version."""
        event = self.move_labels(lambda events, labels: {label: target(events, labels)}, action=action,
                                 actor=actor, reason=reason, needs_history=needs_history)
        assert event is not None  # one label always gives one event
        return event

    def _write_checkpoint(self, event: LabelEvent | None) -> None:
        """Point the checkpoint at ``event`` (None: no event left, seq 0)."""
        key = f"{self.prefix}/labels.json"
        body = ({"seq": event.seq, "labels": event.labels, "updated_at": event.at} if event is not None
                else {"seq": 0, "labels": {}, "updated_at": utc_now()})
        if event is not None and event.shares:
            body["shares"] = event.shares
        data = (json.dumps(body, sort_keys=True, indent=2) + "\n").encode()
        try:
            self.backend.replace(key, data)
        except (StoreUnavailableError, IntegrityError) as e:
            # The move is already recorded in the history; readers roll forward over it.
            fix = f" (`{self.repair}` replaces it)" if self.repair and isinstance(e, IntegrityError) else ""
            logger.warning("%s: label moved but checkpoint not written: %s%s", self.backend.url(key), e, fix)


def _span(versions: list[int]) -> str:
    if len(versions) > 6:
        return f"{versions[0]}..{versions[-1]} ({len(versions)} in all)"
    return ", ".join(map(str, versions))

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
  the race re-reads and retries). ``labels.json`` is then rewritten as a checkpoint.
  Readers read the checkpoint and roll forward over any later events, so a writer
  that crashed between the two writes, or a slow writer's stale checkpoint, never
  hides a move.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from typing import Callable

from promptdistill.core.errors import RegistryError, TemplateNotFoundError
from promptdistill.registry.backend import Backend, StoreUnavailableError
from promptdistill.registry.records import LabelEvent

__all__ = ["Collection", "label_stack", "utc_now"]

logger = logging.getLogger("promptdistill.registry")

_VERSION_FILE = re.compile(r"([1-9][0-9]*)\.json")
_MAX_ATTEMPTS = 256


def utc_now() -> str:
    """UTC time as ``2026-11-30T13:04:52.123Z``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def label_stack(events: list[LabelEvent], label: str) -> list[int]:
    """The versions a label went through, most recent last; a rollback pops one.

    ``set 1, set 2, set 3, rollback`` gives ``[1, 2]``: the label is at 2 and a further
    rollback goes to 1. Setting a label to the version it already has adds nothing.
    """
    stack: list[int] = []
    for event in events:
        if event.label != label:
            continue
        if event.action == "rollback" and stack:
            stack.pop()
        elif not stack and event.from_version is not None:
            stack.append(event.from_version)
        if not stack or stack[-1] != event.to_version:
            stack.append(event.to_version)
    return stack


class Collection:
    """Versions and labels of one name. ``what`` names it in messages (``template 'x'``)."""

    def __init__(self, backend: Backend, prefix: str, what: str) -> None:
        self.backend = backend
        self.prefix = prefix
        self.what = what

    # ----------------------------------------------------------------- versions
    def version_key(self, version: int) -> str:
        return f"{self.prefix}/versions/{version}.json"

    def versions(self) -> list[int]:
        """Published version numbers, ascending."""
        names = self.backend.list(f"{self.prefix}/versions")
        return sorted(int(m.group(1)) for n in names if (m := _VERSION_FILE.fullmatch(n)))

    def read_version(self, version: int) -> bytes:
        """The stored bytes of one version.

        Raises:
            TemplateNotFoundError: no such version (the message lists the existing ones).
        """
        try:
            return self.backend.read(self.version_key(version))
        except FileNotFoundError:
            known = self.versions()
            if not known:
                raise TemplateNotFoundError(f"{self.backend.root}: unknown {self.what}") from None
            raise TemplateNotFoundError(
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
    def _event_key(self, seq: int) -> str:
        return f"{self.prefix}/labels/history/{seq:08d}.json"

    def _read_event(self, seq: int) -> LabelEvent:
        key = self._event_key(seq)
        return LabelEvent.from_bytes(self.backend.read(key), where=self.backend.url(key))

    def label_state(self) -> tuple[int, dict[str, int]]:
        """(last event number, {label: version}), rolled forward past the checkpoint."""
        key = f"{self.prefix}/labels.json"
        seq, labels = 0, {}
        try:
            checkpoint = json.loads(self.backend.read(key))
            seq, labels = int(checkpoint["seq"]), dict(checkpoint["labels"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as e:
            logger.warning("%s: unreadable label checkpoint (%s); rebuilding from history", self.backend.url(key), e)
            events = self.history()
            return (events[-1].seq, dict(events[-1].labels)) if events else (0, {})
        while True:
            try:
                event = self._read_event(seq + 1)
            except FileNotFoundError:
                return seq, labels
            seq, labels = event.seq, dict(event.labels)

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
                raise TemplateNotFoundError(f"{self.backend.root}: unknown {self.what}")
            raise TemplateNotFoundError(
                f"{self.backend.url(self.prefix)}: {self.what} has no label {label!r} "
                f"(labels: {', '.join(f'{k}={v}' for k, v in sorted(labels.items())) or 'none'})"
            )
        return labels[label]

    def history(self) -> list[LabelEvent]:
        """Every label move, oldest first."""
        names = self.backend.list(f"{self.prefix}/labels/history")
        seqs = sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
        return [self._read_event(s) for s in seqs]

    def move_label(self, label: str, target: Callable[[list[LabelEvent] | None, dict[str, int]], int], *,
                   action: str, actor: str, reason: str, needs_history: bool = False) -> LabelEvent:
        """Append one label move; ``target(history, labels)`` picks the new version.

        The move is a create-only write of event ``seq+1``: if another writer got there
        first, the state is re-read and ``target`` asked again.
        """
        for _ in range(_MAX_ATTEMPTS):
            if needs_history:
                events = self.history()
                seq, labels = (events[-1].seq, dict(events[-1].labels)) if events else (0, {})
                # events written after the listing are picked up by the conflict below
            else:
                events = None
                seq, labels = self.label_state()
            to_version = target(events, labels)
            event = LabelEvent(
                seq=seq + 1, label=label, from_version=labels.get(label), to_version=to_version,
                action=action, actor=actor, at=utc_now(), reason=reason, labels={**labels, label: to_version},
            )
            try:
                self.backend.create(self._event_key(event.seq), event.to_bytes())
            except FileExistsError:
                continue
            self._write_checkpoint(event)
            return event
        raise RegistryError(f"{self.backend.url(self.prefix)}: gave up after {_MAX_ATTEMPTS} label conflicts")

    def _write_checkpoint(self, event: LabelEvent) -> None:
        key = f"{self.prefix}/labels.json"
        body = {"seq": event.seq, "labels": event.labels, "updated_at": event.at}
        data = (json.dumps(body, sort_keys=True, indent=2) + "\n").encode()
        try:
            self.backend.replace(key, data)
        except StoreUnavailableError as e:
            # The move is already recorded in the history; readers roll forward over it.
            logger.warning("%s: label moved but checkpoint not written: %s", self.backend.url(key), e)


def _span(versions: list[int]) -> str:
    if len(versions) > 6:
        return f"{versions[0]}..{versions[-1]} ({len(versions)} in all)"
    return ", ".join(map(str, versions))


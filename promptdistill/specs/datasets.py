"""Datasets: ``datasets/<name>.jsonl``, one record a line.

Each record is a JSON object::

    {"id": "tt-0001", "split": "train", "inputs": {"ticket": "..."}, "expected": {"label": "billing"}}

``split`` is ``train`` (few-shot examples and optimizer search), ``dev`` (optimizer
scoring) or ``test`` (held-out verification). An optional ``meta`` object may carry
provenance. An optional ``reference`` (any JSON value) is scoring data the prompt must
not see: the allowed alternatives of each argument, a rubric, reference facts. It is never
rendered; a python metric receives it as ``reference=`` and the rubric judge sees it. Every problem is reported with the file and line:
``datasets/x.jsonl:12: inputs.foo: not declared by the spec``.

Lines are strict JSON: ``NaN`` and ``Infinity`` (which Python's parser accepts) are
refused, and so are lone surrogates (``"\\ud800"``: not text) and values nested deeper
than ``MAX_DEPTH`` (a line of 200,000 brackets is an error on that line, not a RecursionError).

No Parquet cache: it is not a win at this size. Loading a bundled 180-record file takes
about 13 ms; reading a Parquet copy (inputs/expected as JSON columns, since nested dicts
of varying keys do not round-trip as Parquet structs) and decoding it took about 38 ms
(both measured on a loaded 2-core machine). Loaded frames are memoised in-process by
(path, size, mtime) instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import pandas as pd

from promptdistill.core.errors import SpecError, error_listing
from promptdistill.core.jsonio import NotJSONError, atomic_write, strict_json

if TYPE_CHECKING:  # the spec model imports the checks that load datasets
    from promptdistill.specs.model import Spec

__all__ = ["LOCK_WAIT_S", "MAX_DEPTH", "SPLITS", "SURROGATE_PROBLEM", "dataset_for", "dataset_hash", "dataset_lock",
           "load_dataset", "read_records", "records", "write_records"]

SPLITS = ("train", "dev", "test")
MAX_DEPTH = 64
"""Deepest nesting of objects and lists a record may have."""
_FIELDS = ("id", "split", "inputs")
_OPTIONAL = ("expected", "meta", "reference")
"""A record without ``expected`` (or with ``null``) is label-free: the search scores
replies against the baseline prompt's own reply (see :mod:`promptdistill.search.references`)."""
SURROGATE_PROBLEM = "holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not text"
"""Why a string with a lone surrogate is refused: no UTF-8 file, hash or prompt can carry it."""
LOCK_WAIT_S = 60.0
"""How long :func:`dataset_lock` waits for another holder by default, in seconds."""
MAX_ERRORS_SHOWN = 20
"""A message lists this many of a file's problems (all are in the error's ``errors``)."""
_CACHE: dict[tuple, pd.DataFrame] = {}


def _line_errors(rec: Any, declared: Sequence[str] | None) -> list[str]:
    """``field: reason`` problems of one parsed line (without the file:line prefix)."""
    if not isinstance(rec, dict):
        return [f"(record): must be a JSON object, got {type(rec).__name__}"]
    errors = [f"{f}: required field is missing" for f in _FIELDS if f not in rec]
    allowed = _FIELDS + _OPTIONAL
    errors += [f"{k}: unknown field (allowed: {', '.join(allowed)})" for k in rec if k not in allowed]
    if "id" in rec and not (isinstance(rec["id"], str) and rec["id"].strip()):
        errors.append(f"id: must be a non-empty string, got {rec['id']!r}")
    if "split" in rec and rec["split"] not in SPLITS:
        errors.append(f"split: unknown split {rec['split']!r} (expected one of {', '.join(SPLITS)})")
    inputs = rec.get("inputs")
    if "inputs" in rec and not isinstance(inputs, dict):
        errors.append(f"inputs: must be an object of input name -> value, got {type(inputs).__name__}")
    elif isinstance(inputs, dict) and declared is not None:
        errors += [
            f"inputs.{k}: input not declared by the spec (declared: {', '.join(declared)})"
            for k in inputs if k not in declared
        ]
        errors += [f"inputs.{k}: missing (the spec declares it)" for k in declared if k not in inputs]
    if "meta" in rec and not isinstance(rec["meta"], dict):
        errors.append("meta: must be an object")
    return errors


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests deeper than MAX_DEPTH (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _load_line(line: str) -> Any:
    """One line as strict JSON. Raises json.JSONDecodeError or NotJSONError."""
    try:
        value = strict_json(line)
    except RecursionError:
        raise NotJSONError(f"nested deeper than {MAX_DEPTH} levels") from None
    if _too_deep(value):
        raise NotJSONError(f"nested deeper than {MAX_DEPTH} levels")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise NotJSONError(SURROGATE_PROBLEM) from None
    return value


def _parse(path: Path, declared: Sequence[str] | None) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    first_line: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], [f"{path}: dataset file not found"]
    except IsADirectoryError:
        return [], [f"{path}: is a directory, not a dataset file"]
    except UnicodeDecodeError as e:
        return [], [f"{path}: not UTF-8 text (byte at offset {e.start})"]
    except OSError as e:
        return [], [f"{path}: cannot read: {e.strerror or e}"]
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = _load_line(line)
        except json.JSONDecodeError as e:
            errors.append(f"{path}:{n}: malformed JSON: {e.msg} at column {e.colno}")
            continue
        except NotJSONError as e:
            errors.append(f"{path}:{n}: malformed JSON: {e}")
            continue
        problems = _line_errors(rec, declared)
        if isinstance(rec, dict) and isinstance(rec.get("id"), str):
            if rec["id"] in first_line:
                problems.append(f"id: duplicate id {rec['id']!r} (first on line {first_line[rec['id']]})")
            else:
                first_line[rec["id"]] = n
        if problems:
            errors += [f"{path}:{n}: {p}" for p in problems]
            continue
        rows.append({"id": rec["id"], "split": rec["split"], "inputs": rec["inputs"], "expected": rec.get("expected"),
                     "reference": rec.get("reference"), "line": n, "record": rec})
    if not rows and not errors:
        errors.append(f"{path}: no records")
    return rows, errors


def _raise(errors: list[str]) -> None:
    raise error_listing(errors, "dataset errors", max_shown=MAX_ERRORS_SHOWN)


def load_dataset(path: str | os.PathLike[str], *, declared_inputs: Iterable[str] | None = None) -> pd.DataFrame:
    """Load and validate a JSONL dataset.

    Args:
        path: the ``.jsonl`` file.
        declared_inputs: the spec's inputs; when given, every record must supply exactly these.

    Returns:
        A DataFrame with columns ``id``, ``split``, ``inputs`` (dict), ``expected``,
        ``reference`` and ``line`` (1-based line number), in file order. Treat it as read-only: it is memoised.

    Raises:
        SpecError: every problem as ``file:line: field: reason`` (``.errors`` holds the list).
    """
    path = Path(path)
    declared = None if declared_inputs is None else tuple(declared_inputs)
    try:
        st = path.stat()
        key: tuple | None = (str(path.resolve()), st.st_size, st.st_mtime_ns, declared)
    except OSError:
        key = None
    if key is not None and key in _CACHE:
        return _CACHE[key]
    rows, errors = _parse(path, declared)
    if errors:
        _raise(errors)
    df = pd.DataFrame(rows, columns=[*_FIELDS, "expected", "reference", "line"])
    # pandas reads a missing value as NaN; a label-free record's expected is None.
    for column in ("expected", "reference"):
        df[column] = pd.Series([r[column] for r in rows], index=df.index, dtype=object)
    if key is not None:
        _CACHE[key] = df
    return df


def read_records(path: str | os.PathLike[str], *, declared_inputs: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every record of a dataset file as written (``meta`` and ``reference`` included), in file order.

    Raises:
        SpecError: as :func:`load_dataset`.
    """
    rows, errors = _parse(Path(path), None if declared_inputs is None else tuple(declared_inputs))
    if errors:
        _raise(errors)
    return [row["record"] for row in rows]


def dataset_for(spec: "Spec") -> pd.DataFrame:
    """The spec's dataset, checked against the spec's declared inputs."""
    return load_dataset(spec.dataset, declared_inputs=spec.inputs)


def records(df: pd.DataFrame, split: str) -> list[dict[str, Any]]:
    """The records of one split as dicts (``id``, ``split``, ``inputs``, ``expected``, ``reference``), in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    part = df[df["split"] == split]
    references = part["reference"] if "reference" in part else [None] * len(part)
    return [
        {"id": i, "split": s, "inputs": inp, "expected": exp, "reference": ref}
        for i, s, inp, exp, ref in zip(part["id"], part["split"], part["inputs"], part["expected"], references)
    ]


def dataset_hash(path: str | os.PathLike[str]) -> str:
    """sha256 of the file's bytes: what a result was measured on."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def dataset_lock(path: str | os.PathLike[str], *, wait_s: float = LOCK_WAIT_S,
                 on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold one dataset file's exclusive lock for a read-modify-replace (``datasets import``).

    The lock is ``flock`` on ``.<name>.lock`` beside the file: the kernel releases it when
    its holder dies, and the holder removes the file when done (a waiter that locked the
    removed file tries again on the new one). Once it is held, the temporary files a
    killed write of this dataset left (``.<name>.<hex>.tmp``, its backup's too) are removed.

    Args:
        wait_s: how long to wait for another holder.
        on_wait: told once, in a sentence, when it has to wait.

    Raises:
        SpecError: another holder kept it for ``wait_s`` (nothing was written).
    """
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline, told = time.monotonic() + wait_s, False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                raise SpecError(f"{path}: another import of it has not finished after {wait_s:g} s (lock {lock}); "
                                "nothing was written; run again when it ends, or wait longer (--wait)") from None
            if on_wait is not None and not told:
                on_wait(f"waiting for another import of {path} (up to {wait_s:g} s)")
                told = True
            time.sleep(0.02)
            continue
        if _is_current(fd, lock):
            break
        os.close(fd)  # its holder removed it as we opened it: lock the one there now
    try:
        _remove_stale_temporaries(path)
        yield
    finally:
        lock.unlink(missing_ok=True)  # still held here, so no one is locking the removed file in vain
        os.close(fd)


def _is_current(fd: int, lock: Path) -> bool:
    try:
        there = lock.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def _remove_stale_temporaries(path: Path) -> None:
    """Remove a killed write's temporaries of ``path`` and of its backup, named as
    ``core.jsonio.atomic_write`` names them (the lock is held: no live write owns them)."""
    ours = re.compile(rf"\.{re.escape(path.name)}(?:\.bak)?\.[0-9a-f]{{12}}\.tmp")
    for tmp in path.parent.iterdir():
        if ours.fullmatch(tmp.name):
            tmp.unlink(missing_ok=True)


def write_records(path: str | os.PathLike[str], recs: Iterable[Mapping[str, Any]], *, backup: bool = False,
                  check: Callable[[Path], list[str]] | None = None) -> Path:
    """Write records as JSONL atomically (temp file, then rename). Validates each first.

    Args:
        path: the dataset file.
        recs: at least one record.
        backup: keep the file being replaced as ``<path>.bak`` (one backup: an older one is
            overwritten). The replacement and the backup keep the replaced file's mode.
        check: called with the written temporary file before it replaces ``path``; the
            problems it returns (``file:line: field: reason``; the temporary file's name is
            shown as ``path``) stop the write and leave ``path`` as it was.

    Raises:
        SpecError: no records, a record that is not valid, or ``check``'s problems.
    """
    path = Path(path)
    lines = []
    for n, rec in enumerate(recs, start=1):
        problems = _line_errors(dict(rec), None)
        if problems:
            raise SpecError(f"{path}:{n}: {problems[0]}")
        try:
            lines.append(json.dumps(rec, ensure_ascii=False, sort_keys=False, allow_nan=False))
        except (ValueError, TypeError, RecursionError) as e:
            raise SpecError(f"{path}:{n}: not JSON: {e}") from None
    if not lines:
        raise SpecError(f"{path}: no records to write (the file is left as it was)")

    # A file kept private (0600: production traffic) stays so, and so does its backup.
    mode = stat.S_IMODE(path.stat().st_mode) if path.is_file() else None

    def copy_to_backup(tmp: str) -> None:
        shutil.copyfile(path, tmp)
        os.chmod(tmp, mode)

    def write(tmp: str) -> None:
        Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8")
        problems = check(Path(tmp)) if check is not None else []
        if problems:
            _raise([p.replace(tmp, str(path)) for p in problems])
        if mode is not None:
            os.chmod(tmp, mode)
            if backup:
                atomic_write(path.with_name(path.name + ".bak"), copy_to_backup)

    return atomic_write(path, write)  # a new file honours the umask, unlike mkstemp

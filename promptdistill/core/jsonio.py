"""JSON and files: one canonical JSON, one sanitiser, one atomic write (stdlib only).

* :func:`canonical_json`: sorted keys, no whitespace, UTF-8, no NaN or infinity: the
  stable input of every hash (request cache keys, spec hashes, content hashes);
* :func:`to_json_value`: a plain-JSON copy of a value (numpy scalars and arrays, tuples,
  datetimes, paths converted); NaN/infinity raise, or become None with
  ``nan_to_none=True`` (an undefined score on a tiny fold is a missing figure, not an error);
* :func:`json_records`: a table's rows as plain JSON (missing values and infinities as
  None): every table that leaves as JSON (Prefect artifacts, the night report, stage
  summaries) goes through it;
* :func:`atomic_write`: a temporary file in the target's folder, then a rename, so a
  reader never sees half a file and a crash leaves the old one (:func:`write_json`,
  :func:`write_parquet` write through it);
* :func:`read_text`: a file read within a size bound and as UTF-8, or one clear reason
  (every loader of user files: specs, judges, config, template content);
* :func:`strict_json`: JSON text as the standard defines it (Python's ``json`` also takes
  NaN and Infinity): dataset lines and the files ``templates publish`` reads.

Kept free of heavy imports: the registry client uses it.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from datetime import date, datetime
from pathlib import Path, PurePath
from typing import Any, Callable

__all__ = ["NotJSONError", "TextFileError", "atomic_write", "canonical_json", "json_records", "json_safe", "read_text",
           "strict_json", "to_json_value", "write_json", "write_parquet"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the stable input of every hash.

    Raises:
        ValueError: the value holds NaN or infinity (not JSON).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class NotJSONError(ValueError):
    """A value that has no JSON form; the message names the field (``where.key[0]``)."""


def _refuse_constant(name: str) -> Any:
    raise NotJSONError(f"{name} is not JSON (write null for a missing number)")


def strict_json(text: str | bytes) -> Any:
    """``text`` parsed as standard JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are refused.

    Raises:
        json.JSONDecodeError: malformed text; NotJSONError: ``NaN is not JSON (write null
            for a missing number)`` (both ValueErrors); RecursionError: nested too deeply to parse.
    """
    return json.loads(text, parse_constant=_refuse_constant)


def _plain(value: Any, where: str, nan_to_none: bool) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if nan_to_none:
            return None
        raise NotJSONError(f"{where}: {value!r} is not JSON; store None for a missing number")
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise NotJSONError(f"{where}: key {k!r} is not a string")
            out[k] = _plain(v, f"{where}.{k}", nan_to_none)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]", nan_to_none) for i, v in enumerate(value)]
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    # numpy / pandas scalars and arrays, without importing them.
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return _plain(value.item(), where, nan_to_none)
    if hasattr(value, "tolist") and callable(value.tolist):
        return _plain(value.tolist(), where, nan_to_none)
    if hasattr(value, "isoformat") and callable(value.isoformat):  # pandas.Timestamp
        return value.isoformat()
    raise NotJSONError(f"{where}: a {type(value).__name__} is not JSON (use str, number, bool, None, list or dict)")


def to_json_value(value: Any, where: str = "value", *, nan_to_none: bool = False) -> Any:
    """A plain-JSON copy of ``value``: dicts with str keys, lists, str, int, float, bool, None.

    Raises:
        NotJSONError (a ValueError): naming the field that is not JSON.
    """
    return _plain(value, where, nan_to_none)


def json_safe(value: Any) -> Any:
    """``to_json_value`` with NaN and infinity as None: figures that may be undefined."""
    return _plain(value, "value", True)


def json_records(frame: Any) -> list[dict[str, Any]]:
    """A pandas DataFrame's rows as plain-JSON dicts: NaN, NaT, NA and infinities as None,
    numpy scalars as Python ones (pandas itself is not imported here).

    Example:
        >>> json_records(pd.DataFrame({"ms": [1.5, float("nan"), float("inf")]}))
        [{'ms': 1.5}, {'ms': None}, {'ms': None}]
    """
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    return _plain(rows, "row", True)


def atomic_write(path: str | os.PathLike[str], data: bytes | str | Callable[[str], None]) -> Path:
    """Write ``path`` atomically: a temporary file in the same folder, then a rename.

    The file gets ``0o666`` less the process umask (``0o644`` under umask 022), as a new
    file from ``open(path, "w")`` would, and not the ``0o600`` of ``tempfile.mkstemp``.

    Args:
        path: the target; its folder is created if missing.
        data: bytes, text (UTF-8), or a function that writes the temporary path it is given
            (``frame.to_parquet``, ``fig.savefig``...).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        if callable(data):
            os.close(fd)
            data(tmp)
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _create_temp(path: Path) -> tuple[int, str]:
    """A new hidden temp file next to ``path``, created with mode 0o666 so the umask applies.

    Not ``tempfile.mkstemp``: it always creates 0o600, and reading the umask to correct
    that (``os.umask`` sets it to read it) is not safe with other threads running.
    """
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: no free temporary file name for {path.name}")


def write_json(path: str | os.PathLike[str], value: Any, *, nan_to_none: bool = True) -> Path:
    """``value`` as indented JSON (keys in their order), written atomically."""
    text = json.dumps(to_json_value(value, str(path), nan_to_none=nan_to_none), indent=2, ensure_ascii=False,
                      allow_nan=False)
    return atomic_write(path, text + "\n")


def write_parquet(path: str | os.PathLike[str], frame: Any) -> Path:
    """A pandas DataFrame as Parquet (no index), written atomically (pandas is not imported here)."""
    return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


class TextFileError(ValueError):
    """Why a file could not be read as bounded UTF-8 text; ``line`` is set for a decoding error."""

    def __init__(self, reason: str, line: int | None = None) -> None:
        super().__init__(reason)
        self.line = line


def read_text(path: str | os.PathLike[str], *, max_bytes: int) -> str:
    """The file's text, read no further than ``max_bytes`` + 1 bytes.

    Raises:
        TextFileError: a directory, unreadable, larger than ``max_bytes``, or not UTF-8
            (the message says which, without the file's name: the caller adds it).
    """
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise TextFileError("is a directory, not a file") from None
    except OSError as e:
        raise TextFileError(f"cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        limit = f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 else f"{max_bytes >> 10} KiB"
        raise TextFileError(f"larger than {limit}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TextFileError(f"not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})", line) from None

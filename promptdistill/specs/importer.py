"""Production traffic into a spec's dataset: ``promptdistill datasets import FILE --spec NAME``.

Reads JSONL, CSV or Parquet (pandas), maps columns onto the spec's inputs (a column of the
same name by default), and assigns each record a split from the hash of its id, so a
record keeps its split when the file grows. Records are label-free unless an ``expected``
column is named. Duplicates (same inputs) and rows with an empty input are left out and
counted in the report, never silently.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from promptdistill.core.errors import SpecError
from promptdistill.core.jsonio import canonical_json
from promptdistill.specs.model import Spec

__all__ = ["ImportReport", "import_records", "read_table", "split_of"]

_READERS = {".jsonl": lambda p: pd.read_json(p, lines=True), ".json": lambda p: pd.read_json(p, lines=True),
            ".csv": pd.read_csv, ".parquet": pd.read_parquet}


@dataclass
class ImportReport:
    """What an import kept and left out."""

    rows: int = 0
    kept: int = 0
    duplicates: list[Any] = field(default_factory=list)
    """Row numbers (1-based) whose inputs repeat an earlier row's."""
    empty: list[Any] = field(default_factory=list)
    """Row numbers with an input missing or empty."""
    splits: dict[str, int] = field(default_factory=dict)

    def sentence(self) -> str:
        shown = lambda rows: ", ".join(map(str, rows[:10])) + (" ..." if len(rows) > 10 else "")  # noqa: E731
        parts = [f"{self.kept} of {self.rows} rows imported ({', '.join(f'{k} {v}' for k, v in self.splits.items())})"]
        if self.duplicates:
            parts.append(f"{len(self.duplicates)} duplicate(s) left out (rows {shown(self.duplicates)})")
        if self.empty:
            parts.append(f"{len(self.empty)} row(s) with an empty input left out (rows {shown(self.empty)})")
        return "; ".join(parts)


def read_table(path: str | Path) -> pd.DataFrame:
    """A JSONL, CSV or Parquet file as a frame.

    Raises:
        SpecError: an unknown extension or an unreadable file (naming it).
    """
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise SpecError(f"{path}: unknown file type (use .jsonl, .csv or .parquet)")
    try:
        return reader(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: cannot read: {e}") from None


def split_of(record_id: str, *, train: float = 0.15, dev: float = 0.55) -> str:
    """The split a record belongs to, from the hash of its id (stable as the file grows).

    Example:
        >>> split_of("req-1") in ("train", "dev", "test")
        True
    """
    u = int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "train" if u < train else "dev" if u < train + dev else "test"


def _value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return None
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:
        return v.item()
    return v


def import_records(frame: pd.DataFrame, spec: Spec, *, mapping: Mapping[str, str] | None = None,
                   id_column: str | None = None, expected_column: str | None = None,
                   where: str = "file") -> tuple[list[dict[str, Any]], ImportReport]:
    """The frame's rows as dataset records for ``spec`` (see the module docstring).

    Args:
        mapping: input name -> column (default: the column of the same name).
        id_column: the column holding a stable request id (default: a hash of the inputs).
        expected_column: a column with the expected output (JSON text is parsed); default
            none: the records are label-free.

    Raises:
        SpecError: a mapped column is missing (listing the columns there are).
    """
    columns = {name: (mapping or {}).get(name, name) for name in spec.inputs}
    needed = [c for c in [*columns.values(), id_column, expected_column] if c]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise SpecError(f"{where}: no column(s) {missing} (columns: {list(frame.columns)}); map them with "
                        "--map INPUT=COLUMN")
    report, seen, out = ImportReport(rows=len(frame)), set(), []
    for n, row in enumerate(frame.to_dict("records"), start=1):
        inputs = {name: _value(row[col]) for name, col in columns.items()}
        if any(v is None or (isinstance(v, str) and not v.strip()) for v in inputs.values()):
            report.empty.append(n)
            continue
        key = canonical_json(inputs)
        if key in seen:
            report.duplicates.append(n)
            continue
        seen.add(key)
        rid = str(_value(row[id_column])) if id_column else "req-" + hashlib.sha256(key.encode()).hexdigest()[:12]
        record: dict[str, Any] = {"id": rid, "split": split_of(rid), "inputs": inputs}
        if expected_column and _value(row[expected_column]) is not None:
            raw = _value(row[expected_column])
            try:
                record["expected"] = json.loads(raw) if isinstance(raw, str) and raw[:1] in "{[" else raw
            except json.JSONDecodeError:
                record["expected"] = raw
        out.append(record)
    report.kept = len(out)
    report.splits = {s: sum(r["split"] == s for r in out) for s in ("train", "dev", "test")}
    return out, report

"""Production traffic into a spec's dataset: ``promptdistill datasets import FILE --spec NAME``.

Reads JSONL, CSV or Parquet, maps columns onto the spec's inputs (a column of the same
name by default), and assigns each record a split from the hash of its id, so a record
keeps its split when the file grows. Records are label-free unless an ``expected`` column
is named; ``reference`` columns become the record's scoring data (never rendered).
Duplicates (same inputs) and rows with an empty input are left out and counted in the
report, never silently.

The import is all or nothing: a repeated or missing id, a malformed line or a value that
is not JSON (NaN) is an error naming the input file, its line (row for Parquet) and
column, and nothing is written. The result is checked as ``spec validate`` checks a
dataset before it atomically replaces the file; the replaced file is kept as
``<file>.bak`` (both keep the replaced file's mode). ``append`` adds new rows to the
existing records, which keep their lines, content and splits. The dataset is locked from
the read to the replacement: concurrent imports of one dataset run one after the other.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from promptdistill.core.errors import SpecError, error_listing
from promptdistill.core.jsonio import NotJSONError, canonical_json, to_json_value
from promptdistill.specs.checks import read_yaml
from promptdistill.specs.datasets import (LOCK_WAIT_S, MAX_ERRORS_SHOWN, SURROGATE_PROBLEM, dataset_lock,
                                          read_records, write_records)
from promptdistill.specs.load import _dataset_errors, load_spec
from promptdistill.specs.model import Spec, spec_from_dict

__all__ = ["ImportReport", "Table", "import_file", "import_records", "read_table", "spec_for_import", "split_of"]

_NO_DATASET = ": dataset: file not found: "


@dataclass
class ImportReport:
    """What an import kept and left out."""

    rows: int = 0
    kept: int = 0
    duplicates: list[int] = field(default_factory=list)
    """Line (row) numbers whose inputs repeat an earlier row's."""
    empty: list[int] = field(default_factory=list)
    """Line (row) numbers with an input missing or empty."""
    present: list[int] = field(default_factory=list)
    """Line (row) numbers already in the dataset (``append``)."""
    splits: dict[str, int] = field(default_factory=dict)
    unit: str = "row"
    """What the numbers count: ``line`` (JSONL, CSV) or ``row`` (Parquet)."""

    def sentence(self) -> str:
        shown = lambda rows: ", ".join(map(str, rows[:10])) + (" ..." if len(rows) > 10 else "")  # noqa: E731
        parts = [f"{self.kept} of {self.rows} rows imported ({', '.join(f'{k} {v}' for k, v in self.splits.items())})"]
        for rows, what in ((self.duplicates, "duplicate(s)"), (self.empty, "row(s) with an empty input"),
                           (self.present, "row(s) already in the dataset")):
            if rows:
                parts.append(f"{len(rows)} {what} left out ({self.unit}s {shown(rows)})")
        return "; ".join(parts)


@dataclass(frozen=True)
class Table:
    """The rows of an input file, each with its line (JSONL, CSV) or row (Parquet) number."""

    path: Path
    rows: Sequence[tuple[int, Mapping[str, Any]]]
    unit: str = "line"

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(c for _, row in self.rows for c in row))

    def where(self, n: int) -> str:
        return f"{self.path}:{n}" if self.unit == "line" else f"{self.path}: row {n}"


def _raise(errors: list[str]) -> None:
    raise error_listing(errors, "import errors (nothing was written)", max_shown=MAX_ERRORS_SHOWN)


def _read_jsonl(path: Path) -> Table:
    rows, errors = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            # NaN is let through here and refused per column, where it can be named.
            row = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{path}:{n}: malformed JSON: {e.msg} at column {e.colno}")
            continue
        except RecursionError:
            errors.append(f"{path}:{n}: malformed JSON: nested too deeply")
            continue
        if not isinstance(row, dict):
            errors.append(f"{path}:{n}: must be a JSON object of column -> value, got {type(row).__name__}")
            continue
        broken = [c for c, v in row.items() if _lone_surrogate(c) or _lone_surrogate(v)]
        if broken:
            errors.append(f"{path}:{n}: column {broken[0]!r}: {SURROGATE_PROBLEM}")
            continue
        rows.append((n, row))
    if errors:
        _raise(errors)
    return Table(path, rows, "line")


def _lone_surrogate(value: Any) -> bool:
    """Whether ``value`` holds a lone surrogate (JSON's ``"\\ud800"``): a str UTF-8 cannot carry."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (ValueError, TypeError, RecursionError):  # named per column later
        return False
    return False


def _read_csv(path: Path) -> Table:
    rows, errors = [], []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        end = reader.line_num
        for cells in reader:
            n, end = end + 1, reader.line_num  # a quoted cell may span lines: the row starts here
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                errors.append(f"{path}:{n}: {len(cells)} cells for {len(header)} columns")
                continue
            rows.append((n, {c: (v if v != "" else None) for c, v in zip(header, cells)}))
    if errors:
        _raise(errors)
    return Table(path, rows, "line")


def _read_parquet(path: Path) -> Table:
    import pandas as pd

    frame = pd.read_parquet(path)
    # A typed column's missing value (NaN, NaT, NA) is a missing value here, not a number.
    missing = lambda v: v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and v != v)  # noqa: E731
    return Table(path, [(n, {c: (None if missing(v) else v) for c, v in row.items()})
                        for n, row in enumerate(frame.to_dict("records"), start=1)], "row")


_READERS = {".jsonl": _read_jsonl, ".json": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet}


def read_table(path: str | Path) -> Table:
    """A JSONL, CSV or Parquet file's rows, numbered by line (row for Parquet).

    Raises:
        SpecError: an unknown extension, an unreadable file, or malformed lines (each by number).
    """
    path = Path(path)
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise SpecError(f"{path}: unknown file type (use .jsonl, .csv or .parquet)")
    try:
        return reader(path)
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text (byte at offset {e.start})") from None
    except (OSError, ValueError, csv.Error) as e:
        raise SpecError(f"{path}: cannot read: {e}") from None


def split_of(record_id: str, *, train: float = 0.15, dev: float = 0.55) -> str:
    """The split a record belongs to, from the hash of its id (stable as the file grows).

    Example:
        >>> split_of("req-1") in ("train", "dev", "test")
        True
    """
    u = int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "train" if u < train else "dev" if u < train + dev else "test"


def _json_cell(value: Any) -> Any:
    """A cell's value, with JSON text (an object or a list, as a CSV cell holds it) parsed."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value, parse_constant=lambda name: float("nan"))
        except (json.JSONDecodeError, RecursionError):
            return value
    return value


class _Row:
    """One input row's cells as JSON values; problems are collected with their place."""

    def __init__(self, table: Table, n: int, row: Mapping[str, Any], errors: list[str]):
        self.where, self.row, self.errors = table.where(n), row, errors

    def cell(self, column: str, *, parse: bool = False) -> Any:
        value = self.row.get(column)
        try:
            return to_json_value(_json_cell(value) if parse else value, f"column {column!r}")
        except NotJSONError as e:
            self.errors.append(f"{self.where}: {e}".replace("store None", "write null"))
        except RecursionError:
            self.errors.append(f"{self.where}: column {column!r}: nested too deeply")
        return None

    def record_id(self, id_column: str | None, inputs_key: str) -> str | None:
        if id_column is None:
            return "req-" + hashlib.sha256(inputs_key.encode()).hexdigest()[:12]
        value = self.cell(id_column)
        if value is None or (isinstance(value, str) and not value.strip()):
            self.errors.append(f"{self.where}: column {id_column!r}: missing id (every row needs one; without "
                               "--id-column the id is a hash of the inputs)")
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            self.errors.append(f"{self.where}: column {id_column!r}: an id must be a string or an integer, "
                               f"got {value!r}")
            return None
        return str(value)


def import_records(table: Table, spec: Spec, *, mapping: Mapping[str, str] | None = None,
                   id_column: str | None = None, expected_column: str | None = None,
                   reference_columns: Sequence[str] = (), existing: Sequence[Mapping[str, Any]] = (),
                   dataset: str = "the dataset") -> tuple[list[dict[str, Any]], ImportReport]:
    """The table's rows as dataset records for ``spec`` (see the module docstring).

    Args:
        mapping: input name -> column (default: the column of the same name).
        id_column: the column holding a stable request id (default: a hash of the inputs).
        expected_column: a column with the expected output (JSON text is parsed); default
            none: the records are label-free.
        reference_columns: columns kept as the record's ``reference``, an object of column
            -> value (JSON text is parsed): scoring data the prompt never shows.
        existing: the dataset's records (``append``): a row with the same inputs is left
            out, a row with one of their ids and other inputs is an error.
        dataset: how errors name the existing dataset.

    Returns:
        The new records only (``existing`` is not repeated) and the report.

    Raises:
        SpecError: a mapped column is missing (listing the columns there are); a missing,
            repeated or malformed id, or a value that is not JSON, each by line and column.
    """
    columns = {name: (mapping or {}).get(name, name) for name in spec.inputs}
    needed = [c for c in [*columns.values(), id_column, expected_column, *reference_columns] if c]
    missing = [c for c in dict.fromkeys(needed) if c not in table.columns]
    if missing:
        raise SpecError(f"{table.path}: no column(s) {missing} (columns: {table.columns}); map inputs with "
                        "--map INPUT=COLUMN")
    first_key = {canonical_json(r["inputs"]): None for r in existing}
    first_id = {str(r["id"]): f"{dataset} (record {r['id']!r})" for r in existing}
    report, errors, out = ImportReport(rows=len(table.rows), unit=table.unit), [], []
    for n, raw in table.rows:
        row = _Row(table, n, raw, errors)
        before = len(errors)
        inputs = {name: row.cell(col) for name, col in columns.items()}
        if len(errors) > before:
            continue
        if any(v is None or (isinstance(v, str) and not v.strip()) for v in inputs.values()):
            report.empty.append(n)
            continue
        key = canonical_json(inputs)
        rid = row.record_id(id_column, key)
        if key in first_key:
            (report.duplicates if first_key[key] is not None else report.present).append(n)
            continue
        if rid is None:
            continue
        if rid in first_id:
            column = f"column {id_column!r}: " if id_column else ""
            errors.append(f"{row.where}: {column}id {rid!r} repeats {first_id[rid]} with other inputs")
            continue
        first_key[key], first_id[rid] = n, f"{table.unit} {n}"
        record: dict[str, Any] = {"id": rid, "split": split_of(rid), "inputs": inputs}
        expected = row.cell(expected_column, parse=True) if expected_column else None
        if expected is not None:
            record["expected"] = expected
        if reference_columns:
            record["reference"] = {c: row.cell(c, parse=True) for c in reference_columns}
        out.append(record)
    if errors:
        _raise(errors)
    report.kept = len(out)
    report.splits = {s: sum(r["split"] == s for r in out) for s in ("train", "dev", "test")}
    return out, report


def spec_for_import(path_or_name: str | Path, *, prompts_dir: str | Path = "prompts") -> Spec:
    """The spec, loaded as ``load_spec`` does but without its dataset file: an import may create it.

    Raises:
        SpecError: any other problem of the spec file.
    """
    try:
        return load_spec(path_or_name, prompts_dir=prompts_dir)
    except SpecError as e:
        problems = getattr(e, "errors", [str(e)])
        if not problems or not all(_NO_DATASET in p for p in problems):
            raise
        path = Path(problems[0].split(_NO_DATASET)[0])
    data, problem = read_yaml(path)
    if problem:
        raise SpecError(f"{path}: {problem}")
    return spec_from_dict(data, source_path=path)


def import_file(file: str | Path, spec: Spec, *, out: str | Path | None = None, append: bool = False,
                mapping: Mapping[str, str] | None = None, id_column: str | None = None,
                expected_column: str | None = None, reference_columns: Sequence[str] = (),
                wait_s: float = LOCK_WAIT_S, on_wait: Callable[[str], None] | None = None) -> tuple[Path, ImportReport]:
    """Import ``file`` into ``out`` (default: the spec's dataset): checked, atomic, with one backup.

    The dataset's lock (:func:`~promptdistill.specs.datasets.dataset_lock`) is held from
    reading the existing records to replacing the file, so two imports of one dataset
    never lose each other's rows: the second waits up to ``wait_s``, then fails.

    Args:
        append: keep the dataset's records and add the new rows (default: replace them).
        wait_s, on_wait: how long to wait for another import of the same dataset, and
            what to tell while waiting.
        (the rest as :func:`import_records`)

    Returns:
        The dataset file and the report; with nothing new to add the file is not touched.

    Raises:
        SpecError: as :func:`import_records`; no usable row; ``out`` is a folder; an
            existing dataset that does not load (``append``); another import held the
            dataset for ``wait_s``; or the result fails the checks of ``spec validate``
            (each as ``file:line: field: reason``). The dataset is then left as it was.
    """
    target = Path(out) if out is not None else spec.dataset
    if target.is_dir():
        raise SpecError(f"{target}: is a folder; name the dataset file to write (for example {target / 'NAME.jsonl'})")
    table = read_table(file)
    with dataset_lock(target, wait_s=wait_s, on_wait=on_wait):
        existing = read_records(target, declared_inputs=spec.inputs) if append and target.exists() else []
        new, report = import_records(table, spec, mapping=mapping, id_column=id_column,
                                     expected_column=expected_column, reference_columns=reference_columns,
                                     existing=existing, dataset=str(target))
        if not new:
            if existing:
                return target, report
            raise SpecError(f"{file}: nothing imported: {report.sentence()}; {target} is left as it was")
        write_records(target, [*existing, *new], backup=True,
                      check=lambda tmp: _dataset_errors(spec.with_changes(dataset=tmp)))
    return target, report

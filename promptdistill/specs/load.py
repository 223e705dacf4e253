"""Loading spec files, and validating a spec file together with its dataset.

``load_spec`` reads ``prompts/<name>.yaml`` (safe YAML, the shipped JSON Schema, then
meaning: see :mod:`promptdistill.specs.checks`); ``validate_spec_file`` adds the dataset:
every line loads, inputs match the spec, expected values fit the metric, the dev and
test splits are not empty, and the train split can supply the examples. Every problem is
reported as ``file: field: reason``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from promptdistill.core.errors import SpecError
from promptdistill.specs.checks import METRIC_PROBE_RECORDS, read_spec_data, record_errors
from promptdistill.specs.datasets import load_dataset, records
from promptdistill.specs.metrics import expected_error, metric_call_errors
from promptdistill.specs.model import Spec, spec_error, spec_from_dict
from promptdistill.specs.render import placeholders

__all__ = ["load_spec", "load_specs", "validate_spec_file"]


def _spec_path(path_or_name: str | Path, prompts_dir: str | Path) -> Path:
    p = Path(path_or_name)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise SpecError(f"{p}: spec file not found")
        return p
    candidate = Path(prompts_dir) / f"{p}.yaml"
    if not candidate.is_file():
        known = sorted(f.stem for f in Path(prompts_dir).glob("*.yaml"))
        raise SpecError(f"{candidate}: no spec named {str(p)!r} in {prompts_dir}/ (known: {', '.join(known) or 'none'})")
    return candidate


def load_spec(path_or_name: str | Path, *, prompts_dir: str | Path = "prompts") -> Spec:
    """Load and validate one spec, by file path or by name (``prompts_dir/<name>.yaml``).

    Raises:
        SpecError: listing every problem as ``file: path.to.field: reason``.
    """
    path = _spec_path(path_or_name, prompts_dir)
    data, errors = read_spec_data(path)
    if errors:
        raise spec_error(str(path), errors)
    return spec_from_dict(data, source_path=path)


def load_specs(prompts_dir: str | Path = "prompts") -> list[Spec]:
    """Every ``*.yaml`` spec in ``prompts_dir``, sorted by name."""
    return [load_spec(p) for p in sorted(Path(prompts_dir).glob("*.yaml"))]


def _metric_call_errors(spec: Spec, rows: list[dict[str, Any]]) -> list[str]:
    """Call the python metric as scoring will, at arm's length, on the first
    ``METRIC_PROBE_RECORDS`` labelled records with each record's expected output as the
    reply: it must return a score in [0, 1] or None, and not raise, hang or exit."""
    labelled = [r for r in rows if r["expected"] is not None][:METRIC_PROBE_RECORDS]
    return [f"{e} (called with the record's expected output as the reply)"
            for e in metric_call_errors(spec.metric, labelled, where=spec.where)]


def _dataset_errors(spec: Spec) -> list[str]:
    """Dataset lines, expected values and the examples' supply (prefixed by the dataset file)."""
    try:
        df = load_dataset(spec.dataset, declared_inputs=spec.inputs)
    except SpecError as e:
        return list(getattr(e, "errors", [str(e)]))
    errors = []
    for rec_id, line, expected in zip(df["id"], df["line"], df["expected"]):
        problem = None if expected is None else expected_error(spec.metric, expected)  # None: label-free
        if problem:
            errors.append(f"{spec.dataset}:{line}: expected: {problem} (record {rec_id!r})")
    rows = df.to_dict("records")
    errors += record_errors(spec, rows)  # per-request schemas
    if spec.metric.kind == "python" and spec.metric.function:
        errors += _metric_call_errors(spec, rows)
    # Few-shot examples show the answer: only labelled train records can be examples.
    train = [r for r in records(df, "train") if r["expected"] is not None]
    for split, why in (("dev", "the optimizer scores candidates on it"), ("test", "the winner is verified on it")):
        if not (df["split"] == split).any():
            errors.append(f"{spec.dataset}: split: no {split} records ({why})")
    ex = spec.examples
    wanted = [p[len("expected_"):] for p in placeholders(ex.format or "") if p.startswith("expected_")]
    for r in train if wanted else ():
        exp = r["expected"]
        missing = [f for f in wanted if not (isinstance(exp, dict) and f in exp)]
        if missing:
            errors.append(
                f"{spec.dataset}: record {r['id']!r}: expected has no field(s) {missing} "
                "that template.system.examples.format uses"
            )
    if ex.selection == "fixed":
        ids = {r["id"] for r in train}
        errors += [f"{spec.where}: template.system.examples.ids: {i!r} is not a train record of {spec.dataset}" for i in ex.ids if i not in ids]
    elif ex.count > len(train):
        errors.append(f"{spec.where}: template.system.examples.count: {ex.count} examples but {spec.dataset} has "
                      f"{len(train)} labelled train records")
    return errors


def validate_spec_file(path: str | Path) -> list[str]:
    """Every problem of a spec file and its dataset, as ``file: path.to.field: reason``."""
    data, errors = read_spec_data(path)
    if errors:
        return [f"{path}: {e}" for e in errors]
    try:
        spec = spec_from_dict(data, source_path=path)
    except SpecError as e:
        return list(getattr(e, "errors", [str(e)]))
    return _dataset_errors(spec)

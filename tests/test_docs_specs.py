"""docs/specs.md keeps up with the code: every field of the spec dataclasses, every key of
the spec's JSON Schema, every metric kind and selection, every dataset record field and
every Python-style type name ``schema_from`` maps is named on the page, so a new key
cannot ship undocumented. The README and the project ``init`` writes point to it.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path


import promptdistill.specs.model as model
from promptdistill.specs import schema_from
from promptdistill.specs.checks import load_schema
from promptdistill.specs.datasets import SPLITS

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "specs.md").read_text(encoding="utf-8") if (ROOT / "docs" / "specs.md").is_file() else ""


def _named(word: str) -> bool:
    """Whether the page names ``word`` as code: `word`, or inside a dotted key such as `metric.word`."""
    return f"`{word}`" in DOC or f".{word}`" in DOC or f"`{word}." in DOC


def _spec_dataclasses() -> list[type]:
    return [c for _, c in inspect.getmembers(model, inspect.isclass)
            if dataclasses.is_dataclass(c) and c.__module__ == model.__name__]


def _schema_keys(node: object) -> set[str]:
    keys: set[str] = set()
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            keys.add(name)
            keys |= _schema_keys(sub)
    return keys


def test_the_page_exists():
    assert DOC.startswith("# Prompt specs"), "docs/specs.md is missing or does not start with its title"


def test_every_field_of_the_spec_dataclasses_is_documented():
    classes = _spec_dataclasses()
    assert {c.__name__ for c in classes} >= {"Spec", "ExamplesConfig", "MetricSpec", "Slo"}
    missing = [f"{c.__name__}.{f.name}" for c in classes for f in dataclasses.fields(c) if not _named(f.name)]
    assert not missing, f"docs/specs.md does not mention these spec fields: {missing}"
    assert not [c.__name__ for c in classes if f"`{c.__name__}`" not in DOC]


def test_every_key_of_the_spec_schema_is_documented():
    keys = _schema_keys(load_schema())
    assert {"template", "examples", "schema_from", "max_quality_drop"} <= keys
    assert not sorted(k for k in keys if not _named(k)), "docs/specs.md does not mention these spec keys"


def test_every_metric_kind_selection_and_record_field_is_documented():
    kinds = load_schema()["properties"]["metric"]["properties"]["kind"]["enum"]
    selections = load_schema()["properties"]["template"]["properties"]["system"]["properties"]["examples"][
        "properties"]["selection"]["enum"]
    words = [*kinds, *selections, *SPLITS, "id", "split", "inputs", "expected", "meta", "reference"]
    assert not [w for w in words if not _named(w)]
    assert "`--reference-column" in DOC


def test_every_python_type_name_schema_from_maps_is_documented():
    names = schema_from.PYTHON_TYPES
    assert names and not [n for n in names if f"`{n}`" not in DOC]


def test_the_readme_and_the_project_init_writes_point_to_the_page(tmp_path):
    from promptdistill.cli import main

    assert "(docs/specs.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert main(["init", str(tmp_path / "proj")]) == 0
    for readme in ("prompts/README.md", "datasets/README.md"):
        assert "docs/specs.md" in (tmp_path / "proj" / readme).read_text(), readme

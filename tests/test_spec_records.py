"""What ``spec validate`` learns from the records: per-request schemas (``output.schema_from``)
and a python metric called as scoring will call it.

The engine test at the end decodes a BFCL-style function definition (Python type names)
on the real engine, through the evaluator the nightly uses.
"""

from __future__ import annotations

import json
from pathlib import Path
import re

import jsonschema
import pytest
import yaml

from promptdistill.cli import main
from promptdistill.specs.datasets import dataset_for, records, write_records
from promptdistill.specs.load import load_spec, validate_spec_file
from promptdistill.specs.metrics import score_reply
from promptdistill.specs.plugins import MetricFunctionError
from promptdistill.specs.prompt import output_schema_for
from promptdistill.specs.schema_from import request_schema

# As BFCL writes them: Python type names, 'dict' at the top.
AREA = {"name": "triangle_area", "description": "The area of a triangle.", "parameters": {
    "type": "dict", "required": ["base", "sides"],
    "properties": {"base": {"type": "float", "description": "The base, in cm."},
                   "sides": {"type": "tuple", "items": {"type": "integer"}, "description": "The other two sides."},
                   "unit": {"type": "str", "enum": ["cm", "mm"]},
                   "options": {"type": "dict", "properties": {"exact": {"type": "bool"}, "digits": {"type": "int"},
                                                              "tags": {"type": "list", "items": {"type": "str"}}}},
                   "note": {"type": "any"}}}}
AREA_JSON_SCHEMA = {
    "type": "object", "required": ["base", "sides"],
    "properties": {"base": {"type": "number", "description": "The base, in cm."},
                   "sides": {"type": "array", "items": {"type": "integer"}, "description": "The other two sides."},
                   "unit": {"type": "string", "enum": ["cm", "mm"]},
                   "options": {"type": "object", "properties": {"exact": {"type": "boolean"}, "digits": {"type": "integer"},
                                                                "tags": {"type": "array", "items": {"type": "string"}}}},
                   "note": {}}}

METRIC = '''
def score(reply_text, parsed, expected, inputs):
    return float(isinstance(parsed, dict) and parsed.get("base") == expected["base"])
'''


def _text(function: dict | str) -> str:
    return function if isinstance(function, str) else json.dumps(function)


def tool_project(root: Path, functions: list, *, metric: str = METRIC, name: str = "tool_call") -> Path:
    """A project with one tool-calling spec: record i calls ``functions[i % len(functions)]``."""
    (root / "prompts").mkdir(parents=True, exist_ok=True)
    (root / "metrics").mkdir(exist_ok=True)
    (root / "metrics" / f"{name}.py").write_text(metric)
    spec = {
        "name": name, "description": "Turn a request into the arguments of one function call.",
        "dataset": f"{name}.jsonl",
        "inputs": {"request": "What the user asked.", "function": "The function to call (JSON)."},
        "template": {"system": {"instruction": "Reply with the arguments of the function call as JSON."},
                     "user": "Function: {function}\nRequest: {request}"},
        "output": {"schema_from": "function", "max_tokens": 96},
        "metric": {"kind": "python", "function": f"metrics.{name}:score"},
        "slo": {"max_quality_drop": 0.1},
    }
    (root / "prompts" / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    recs = []
    for i in range(12):
        base = float(3 + i)
        recs.append({"id": f"{name}-{i:02d}", "split": "train" if i < 4 else "dev" if i < 8 else "test",
                     "inputs": {"request": f"The area of a triangle with base {base:g} cm and sides 4 and 5.",
                                "function": _text(functions[i % len(functions)])},
                     "expected": {"base": base, "sides": [4, 5]}})
    write_records(root / "datasets" / f"{name}.jsonl", recs)
    return root / "prompts" / f"{name}.yaml"


# --- Python-style type names ------------------------------------------------------------------


def test_python_type_names_become_json_schema_types():
    before = json.dumps(AREA)
    assert request_schema(AREA) == AREA_JSON_SCHEMA
    assert request_schema(json.dumps({"type": "function", "function": AREA})) == AREA_JSON_SCHEMA
    assert json.dumps(AREA) == before  # the caller's value is not changed
    jsonschema.Draft202012Validator.check_schema(request_schema(AREA))


def test_type_names_are_mapped_in_every_subschema_and_nowhere_else():
    schema = request_schema({"type": "dict", "properties": {
        "type": {"type": ["str", "null"]},                       # a parameter called 'type'
        "either": {"anyOf": [{"type": "int"}, {"type": "float"}]},
        "pair": {"type": "tuple", "prefixItems": [{"type": "str"}, {"type": "bool"}]},
        "loose": {"type": ["int", "any"]},
        "same": {"type": ["int", "integer"]},
        "kind": {"type": "str", "enum": ["dict", "float"], "default": "dict"}},
        "additionalProperties": {"type": "float"}, "$defs": {"x": {"type": "list"}}})
    props = schema["properties"]
    assert schema["type"] == "object" and props["type"] == {"type": ["string", "null"]}
    assert props["either"] == {"anyOf": [{"type": "integer"}, {"type": "number"}]}
    assert props["pair"] == {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]}
    assert props["loose"] == {} and props["same"] == {"type": ["integer"]}
    assert props["kind"] == {"type": "string", "enum": ["dict", "float"], "default": "dict"}  # values kept
    assert schema["additionalProperties"] == {"type": "number"} and schema["$defs"] == {"x": {"type": "array"}}


# --- spec validate: per-request schemas ------------------------------------------------------


def test_a_bfcl_style_function_validates_and_is_what_decoding_gets(tmp_path):
    path = tool_project(tmp_path, [AREA])
    assert validate_spec_file(path) == []
    spec = load_spec(path)
    record = records(dataset_for(spec), "dev")[0]
    assert output_schema_for(spec, record["inputs"]) == AREA_JSON_SCHEMA


def test_every_records_schema_is_checked_naming_the_record_and_the_path(tmp_path, capsys):
    bad_type = json.loads(json.dumps(AREA))
    bad_type["parameters"]["properties"]["unit"]["type"] = "HashMap"
    bad_required = {"type": "function", "function": {**AREA, "parameters": {**AREA["parameters"], "required": "base"}}}
    path = tool_project(tmp_path, [AREA, bad_type, "{not a schema", bad_required])
    errors = validate_spec_file(path)
    dataset = tmp_path / "datasets" / "tool_call.jsonl"
    assert len(errors) == 9, errors  # records 1, 2, 3, 5, 6, 7, 9, 10, 11
    assert errors[0].startswith(f"{dataset}:2: inputs.function: record 'tool_call-01': not a valid JSON Schema at "
                                "parameters.properties.unit.type: 'HashMap' is not valid"), errors[0]
    assert errors[1].startswith(f"{dataset}:3: inputs.function: record 'tool_call-02': not JSON"), errors[1]
    assert errors[2].startswith(f"{dataset}:4: inputs.function: record 'tool_call-03': not a valid JSON Schema at "
                                "function.parameters.required: 'base' is not of type 'array'"), errors[2]
    assert main(["spec", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "record 'tool_call-05'" in err and "9 error(s) in 1 file(s)" in err


# --- spec validate: python metrics ------------------------------------------------------------


@pytest.mark.parametrize("body, says", [
    ("return float('nan')", "returned nan; a score must be a number in [0, 1] or None"),
    ("return 'high'", "returned 'high'; a score must be"),
    ("return 1.5", "returned 1.5; a score must be"),
    ("return expected['missing']", "raised KeyError: 'missing'"),
    ("import sys; sys.exit(3)", "raised SystemExit(3)"),
], ids=["nan", "word", "out-of-range", "raises", "sys-exit"])
def test_spec_validate_calls_the_python_metric_and_names_the_record(tmp_path, body, says):
    path = tool_project(tmp_path, [AREA], metric=f"def score(reply_text, parsed, expected, inputs):\n    {body}\n")
    errors = validate_spec_file(path)
    assert len(errors) == 3, errors  # the first three labelled records
    assert errors[0].startswith(f"{path}: metric.function metrics.tool_call:score: record 'tool_call-00': "), errors
    assert says in errors[0] and errors[0].endswith("(called with the record's expected output as the reply)")


def test_the_metric_gets_the_expected_output_as_its_reply(tmp_path):
    seen = tmp_path / "seen.jsonl"
    metric = ("import json\n"
              "def score(reply_text, parsed, expected, inputs):\n"
              f"    open({str(seen)!r}, 'a').write(json.dumps([reply_text, parsed, expected]) + '\\n')\n"
              "    return 1.0\n")
    assert validate_spec_file(tool_project(tmp_path, [AREA], metric=metric)) == []
    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(calls) == 3
    for reply_text, parsed, expected in calls:
        assert json.loads(reply_text) == expected and parsed == expected


@pytest.mark.parametrize("value, score", [("numpy.float32(0.5)", 0.5), ("numpy.float64(1.0)", 1.0),
                                          ("numpy.int64(0)", 0.0)])
def test_a_numpy_scalar_is_a_score(tmp_path, value, score):
    path = tool_project(tmp_path, [AREA], metric="import numpy\n"
                                                  "def score(reply_text, parsed, expected, inputs):\n"
                                                  f"    return {value}\n")
    assert validate_spec_file(path) == []
    spec = load_spec(path)
    got = score_reply(spec.metric, '{"base": 3.0}', {"base": 3.0}, record_id="r", where=spec.where)
    assert got == score and type(got) is float


def test_a_numpy_bool_is_not_a_score(tmp_path):
    path = tool_project(tmp_path, [AREA], metric="import numpy\n"
                                                  "def score(reply_text, parsed, expected, inputs):\n"
                                                  "    return numpy.bool_(True)\n")
    errors = validate_spec_file(path)
    assert len(errors) == 3 and "record 'tool_call-00': returned np.True_; a score must be" in errors[0], errors


def test_a_binary_python_metric_is_raced_with_the_group_sequential_test_and_must_return_0_or_1(tmp_path):
    """``metric.scores: binary`` (an allowed-values rule): the race's test is the efficient
    group-sequential one, and a value other than 0 or 1 is an error naming the spec and record."""
    from promptdistill.search.sequential import GroupSequentialTest, make_test

    path = tool_project(tmp_path, [AREA], metric="def score(reply_text, parsed, expected, inputs):\n"
                                                  "    return 1.0 if parsed == expected else 0.5\n")
    assert validate_spec_file(path) == []
    assert not load_spec(path).metric.discrete  # undeclared: continuous
    spec_data = yaml.safe_load(path.read_text())
    spec_data["metric"]["scores"] = "binary"
    path.write_text(yaml.safe_dump(spec_data, sort_keys=False))
    spec = load_spec(path)
    assert spec.metric.discrete and spec.metric.to_dict()["scores"] == "binary"
    assert isinstance(make_test(discrete=spec.metric.discrete, pool=984, alpha=0.1), GroupSequentialTest)
    assert score_reply(spec.metric, '{"base": 3.0, "sides": [4, 5]}', {"base": 3.0, "sides": [4, 5]},
                       record_id="r", where=spec.where) == 1.0
    with pytest.raises(MetricFunctionError, match=f"{re.escape(spec.where)}: metric.function metrics.tool_call:score: "
                       "record 'r': returned 0.5; metric.scores: binary allows only 0 and 1"):
        score_reply(spec.metric, '{"base": 4.0}', {"base": 3.0, "sides": [4, 5]}, record_id="r", where=spec.where)
    # Only a python metric declares its scores; the schema knows one value.
    for metric, says in (({"kind": "exact", "scores": "binary"}, "metric.scores: only a python metric"),
                         ({"kind": "python", "function": "metrics.tool_call:score", "scores": "0/1"}, "metric.scores")):
        spec_data["metric"] = metric
        path.write_text(yaml.safe_dump(spec_data, sort_keys=False))
        errors = validate_spec_file(path)
        assert any(says in e for e in errors), errors


def test_a_metric_module_that_exits_at_import_is_an_error_and_other_specs_are_still_reported(tmp_path, capsys):
    exits = tool_project(tmp_path, [AREA], metric="import sys\nsys.exit(0)\n", name="exits")
    broken = tool_project(tmp_path, [AREA], metric="def score(*args):\n    return 'high'\n", name="broken")
    assert main(["spec", "validate", str(exits), str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{exits}: metric.function: cannot import {tmp_path / 'metrics' / 'exits.py'}: SystemExit: 0" in err
    assert f"{broken}: metric.function metrics.broken:score: record 'broken-00': returned 'high'" in err
    assert "error(s) in 2 file(s)" in err


# --- the real engine ----------------------------------------------------------------------------


@pytest.mark.engine
def test_a_bfcl_style_function_constrains_decoding_on_the_engine(engine, tmp_path):
    from promptdistill.evaluate.evaluator import evaluate

    spec = load_spec(tool_project(tmp_path, [AREA]))
    dev = records(dataset_for(spec), "dev")
    report = evaluate(engine, spec, dev)  # the path that failed: 'dict' is not a valid type
    assert report.valid == [True] * len(dev), report.replies
    for reply in report.replies:
        args = json.loads(reply)
        jsonschema.validate(args, AREA_JSON_SCHEMA)
        assert isinstance(args["base"], (int, float)) and not isinstance(args["base"], bool)
        assert isinstance(args["sides"], list) and all(isinstance(s, int) for s in args["sides"])
    assert all(s in (0.0, 1.0) for s in report.scores)

"""Prompt specs: the bundled specs validate and render; each kind of bad spec is named."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from promptdistill.cli import main
from promptdistill.specs.datasets import dataset_for, records
from promptdistill.core.errors import SpecError
from promptdistill.specs.render import render_messages
from promptdistill.specs import (
    ExamplesConfig,
    build_system,
    examples_for,
    load_spec,
    load_specs,
    select_examples,
    spec_messages,
    template_content,
    validate_spec_file,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "prompts"
BUNDLED = sorted(p.stem for p in PROMPTS.glob("*.yaml"))

VALID = {
    "name": "demo",
    "description": "A demo task.",
    "dataset": "demo.jsonl",
    "inputs": {"ticket": "The ticket."},
    "template": {
        "system": {
            "instruction": "Label the ticket.",
            "context": "Labels: a, b.",
            "constraints": ['Reply {"label": "a"} or {"label": "b"}.'],
            "examples": {"count": 2, "selection": "first", "format": "Ticket: {ticket}\nAnswer: {expected}"},
        },
        "user": "Ticket: {ticket}",
    },
    "output": {
        "schema": {"type": "object", "properties": {"label": {"type": "string", "enum": ["a", "b"]}}, "required": ["label"]},
        "max_tokens": 8,
    },
    "metric": {"kind": "exact", "field": "label"},
    "slo": {"ttft_ms": 300, "max_quality_drop": 0.02},
}
DATA = [
    {"id": f"r{i}", "split": s, "inputs": {"ticket": f"ticket {i}"}, "expected": {"label": "ab"[i % 2]}}
    for i, s in enumerate(["train"] * 4 + ["dev"] * 2 + ["test"] * 2)
]


def _project(tmp_path: Path, spec: dict | str, data: list | None = None, name: str = "demo") -> Path:
    (tmp_path / "prompts").mkdir(parents=True, exist_ok=True)
    (tmp_path / "datasets").mkdir(exist_ok=True)
    lines = data if data is not None else DATA
    (tmp_path / "datasets" / "demo.jsonl").write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in lines))
    path = tmp_path / "prompts" / f"{name}.yaml"
    path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=False))
    return path


def _mutated(change) -> dict:
    spec = copy.deepcopy(VALID)
    change(spec)
    return spec


# --- the bundled specs --------------------------------------------------------------------


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_spec_validates(name):
    assert validate_spec_file(PROMPTS / f"{name}.yaml") == []


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_spec_renders_every_dev_record(name):
    spec = load_spec(name, prompts_dir=PROMPTS)
    examples = examples_for(spec)
    assert len(examples) == spec.examples.count
    for r in records(dataset_for(spec), "dev"):
        messages = spec_messages(spec, r["inputs"], examples=examples)
        assert [m["role"] for m in messages] == ["system", "user"]
        for value in r["inputs"].values():
            assert value in messages[1]["content"] and value not in messages[0]["content"]
        content = template_content(spec, examples)
        assert render_messages(content["system"], content["user"], r["inputs"]) == messages


def test_at_least_five_bundled_tasks_cover_the_metric_kinds():
    specs = load_specs(PROMPTS)
    assert len(specs) >= 5
    kinds = {s.metric.kind for s in specs}
    assert {"exact", "json_field", "numeric", "python"} <= kinds
    assert any(s.metric.pattern for s in specs)  # a format-rules task
    summarize = next(s for s in specs if s.metric.kind == "python")
    assert set(summarize.output_schema["required"]) == {"summary", "key_points", "confidence_score"}


def test_template_content_shape():
    spec = load_spec("ticket_triage", prompts_dir=PROMPTS)
    c = template_content(spec, examples_for(spec), max_tokens=5)
    assert set(c) == {"name", "system", "user", "inputs", "output_schema", "response_format", "max_tokens", "sampling"}
    assert c["response_format"] == "json_schema" and c["max_tokens"] == 5 and c["sampling"] == {"temperature": 0.0}
    assert template_content(spec.with_changes(output_schema=None))["response_format"] == "none"
    assert template_content(spec, response_format="none")["response_format"] == "none"
    with pytest.raises(ValueError):
        template_content(spec, response_format="xml")


# --- value semantics -----------------------------------------------------------------------


def test_spec_is_frozen_and_with_changes_returns_a_new_validated_spec():
    spec = load_spec("ticket_triage", prompts_dir=PROMPTS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.instruction = "x"  # type: ignore[misc]
    shorter = spec.with_changes(instruction="Route the ticket.", constraints=())
    assert shorter.instruction == "Route the ticket." and spec.instruction.startswith("You are a helpful")
    assert shorter.spec_hash() != spec.spec_hash()
    assert shorter.instruction_text() == "Route the ticket."
    assert spec.instruction_text().endswith("even if you are unsure.")
    with pytest.raises(SpecError, match="template.system.instruction: uses input"):
        spec.with_changes(instruction="Route {ticket}.")
    with pytest.raises(TypeError, match="no field"):
        spec.with_changes(colour="red")


def test_spec_hash_is_content_not_path(tmp_path):
    path = _project(tmp_path, VALID)
    a = load_spec(path)
    assert a.spec_hash() == load_spec(path).spec_hash()
    other = tmp_path / "elsewhere"
    b = load_spec(_project(other, VALID))
    assert a.spec_hash() == b.spec_hash() and a.dataset != b.dataset
    assert len(a.spec_hash()) == 64


def test_load_spec_by_name_and_unknown_name(tmp_path):
    path = _project(tmp_path, VALID)
    assert load_spec("demo", prompts_dir=path.parent).name == "demo"
    with pytest.raises(SpecError, match=r"no spec named 'nope' .*known: demo"):
        load_spec("nope", prompts_dir=path.parent)


# --- examples ---------------------------------------------------------------------------------


def test_select_examples_rules(tmp_path):
    spec = load_spec(_project(tmp_path, VALID))
    train = records(dataset_for(spec), "train")
    assert [r["id"] for r in select_examples(spec, train)] == ["r0", "r1"]
    rand = spec.with_changes(examples=ExamplesConfig(count=3, selection="random"))
    assert select_examples(rand, train, seed=1) == select_examples(rand, train, seed=1)
    assert {r["id"] for r in select_examples(rand, train, count=4, seed=2)} == {"r0", "r1", "r2", "r3"}
    bal = spec.with_changes(examples=ExamplesConfig(count=2, selection="balanced"))
    assert sorted(r["expected"]["label"] for r in select_examples(bal, train, seed=5)) == ["a", "b"]
    fixed = spec.with_changes(examples=ExamplesConfig(count=2, selection="fixed", ids=("r3", "r0")))
    assert [r["id"] for r in select_examples(fixed, train)] == ["r3", "r0"]
    assert select_examples(spec, train, count=0) == []
    with pytest.raises(SpecError, match="5 examples asked, the train split has 4"):
        select_examples(spec, train, count=5)
    with pytest.raises(SpecError, match="not in the train split"):
        select_examples(fixed.with_changes(examples=ExamplesConfig(count=1, selection="fixed", ids=("zz",))), train)


def test_build_system_order_and_example_fields(tmp_path):
    spec = load_spec(_project(tmp_path, VALID))
    system = spec_messages(spec, {"ticket": "t"}, examples=examples_for(spec))[0]["content"]
    assert system == (
        'Label the ticket.\n\nLabels: a, b.\n\nRules:\n- Reply {"label": "a"} or {"label": "b"}.\n\n'
        'Examples:\n\nTicket: ticket 0\nAnswer: {"label": "a"}\n\nTicket: ticket 1\nAnswer: {"label": "b"}'
    )
    custom = spec.with_changes(examples=ExamplesConfig(count=1, format="{ticket} -> {expected_label}", header=""))
    assert build_system(custom, examples_for(custom)).endswith("Rules:\n- Reply {{\"label\": \"a\"}} or {{\"label\": \"b\"}}.\n\nticket 0 -> a")


# --- bad specs ----------------------------------------------------------------------------------

BAD_SPECS = [
    (lambda s: s.pop("name"), "name: required field is missing"),
    (lambda s: s.update(name="other"), "name: 'other' must equal the file's stem 'demo'"),
    (lambda s: s.update(name="Demo-1"), "name: 'Demo-1' does not match"),
    (lambda s: s.update(colour="red"), "colour: unknown field (allowed:"),
    (lambda s: s["template"]["system"].update(footer="x"), "template.system.footer: unknown field"),
    (lambda s: s["template"].pop("user"), "template.user: required field is missing"),
    (lambda s: s.update(dataset="missing.jsonl"), "dataset: file not found"),
    (lambda s: s.update(dataset="../etc/passwd"), "dataset: '../etc/passwd' does not match"),
    (lambda s: s.update(inputs={}), "inputs: {} should be non-empty"),
    (lambda s: s["template"].update(user="Ticket: {ticket} {customer}"), "template.user: placeholder {customer} is not a declared input"),
    (lambda s: s["template"].update(user="Ticket: {ticket} }"), "template.user: stray '}'"),
    (lambda s: s["inputs"].update(customer="who"), "inputs.customer: declared but never used in template.user"),
    (lambda s: s["inputs"].update(expected_x="x"), "inputs.expected_x: the name is reserved"),
    (lambda s: s["template"]["system"].update(instruction="Label {ticket}."), "template.system.instruction: uses input(s) {ticket}"),
    (lambda s: s["template"]["system"].update(constraints=["Mind {ticket}"]), "template.system.constraints[0]: uses input(s)"),
    (lambda s: s["template"]["system"]["examples"].update(format="{ticket} {answer}"), "template.system.examples.format: placeholder {answer}"),
    (lambda s: s["template"]["system"]["examples"].update(count=-1), "template.system.examples.count: -1 is less than the minimum"),
    (lambda s: s["template"]["system"]["examples"].update(selection="best"), "template.system.examples.selection: 'best' is not one of"),
    (lambda s: s["template"]["system"]["examples"].update(selection="fixed"), "template.system.examples.ids: the 'fixed' selection needs"),
    (lambda s: s["output"].update(schema={"type": "strng"}), "output.schema.type: not a valid JSON Schema"),
    (lambda s: s["output"].update(max_tokens=0), "output.max_tokens: 0 is less than the minimum"),
    (lambda s: s["metric"].update(kind="bleu"), "metric.kind: 'bleu' is not one of"),
    (lambda s: s["metric"].update(field="team"), "metric.field: 'team' is not a property of output.schema"),
    (lambda s: s["metric"].update(pattern="(unclosed"), "metric.pattern: not a valid regular expression"),
    (lambda s: s["metric"].update(pattern="(a|a)+b"), "metric.pattern: takes longer than 50 ms"),
    (lambda s: s["metric"].update(pattern="x" * 2000), "metric.pattern: longer than 1000 characters"),
    (lambda s: s.update(metric={"kind": "judge_rubric"}), "metric.rubric: a judge_rubric metric needs a rubric"),
    (lambda s: s.update(metric={"kind": "json_field", "pattern": "x"}), "metric.pattern: a json_field metric compares fields"),
    (lambda s: s["slo"].update(max_quality_drop=1.5), "slo.max_quality_drop: 1.5 is greater than the maximum"),
    (lambda s: s["slo"].update(ttft_ms=0), "slo.ttft_ms: 0 is less than or equal to the minimum"),
]


@pytest.mark.parametrize("change, message", BAD_SPECS, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BAD_SPECS)])
def test_each_bad_spec_gives_the_error_that_names_it(tmp_path, change, message):
    path = _project(tmp_path, _mutated(change))
    errors = validate_spec_file(path)
    assert any(e.startswith(f"{path}: ") and message in e for e in errors), errors
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert any(message in e for e in info.value.errors)


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: demo\n  bad: indentation\n:", "not valid YAML"),
        ("!!python/object/apply:os.system ['echo pwned']\n", "no language-specific tags"),
        ("name: !!python/name:os.system\n", "no language-specific tags"),
        ("name: demo\nname: demo\n", "duplicate key 'name'"),
        ("- just\n- a list\n", "(root): must be a mapping of fields, got list"),
    ],
)
def test_unsafe_or_malformed_yaml_is_refused(tmp_path, text, message):
    path = _project(tmp_path, text)
    errors = validate_spec_file(path)
    assert len(errors) == 1 and errors[0].startswith(f"{path}: ") and message in errors[0], errors


ALIAS_BOMB = "\n".join(
    ["name: demo", "a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]" for i in range(8)]
) + "\n"


@pytest.mark.parametrize(
    "data, message",
    [
        (b"name: demo\ndescription: caf\xe9\n", "line 2: not UTF-8 text (byte 0xe9"),
        (ALIAS_BOMB.encode(), "(root): more than 100000 values once aliases are expanded"),
        (("name: demo\n" + "".join(f"k{i}: &k{i} x\n" for i in range(101)) + "".join(f"r{i}: *k{i}\n" for i in range(101))).encode(),
         "more than 100 aliases"),
        (b"name: demo\ndescription: " + b"x" * (2 * 1024 * 1024) + b"\n", "(file): larger than 1 MiB"),
        (b"a: " + b"[" * 200_000 + b"]" * 200_000 + b"\n", "nested deeper than 64 levels"),
        (b"a: " + b"[" * 70 + b"]" * 70 + b"\n", "nested deeper than 64 levels"),
        (b"a: &a [*a]\n", "recursive alias"),
    ],
    ids=["non-utf8", "alias-bomb", "alias-count", "50mb-description", "200k-brackets", "deep", "recursive-alias"],
)
def test_hostile_yaml_is_refused_at_load_time(tmp_path, data, message):
    path = _project(tmp_path, VALID)
    path.write_bytes(data)
    errors = validate_spec_file(path)
    assert len(errors) == 1 and errors[0].startswith(f"{path}: ") and message in errors[0], errors
    with pytest.raises(SpecError, match="demo.yaml: "):
        load_spec(path)


def test_a_spec_path_that_is_a_directory_is_an_error(tmp_path):
    path = _project(tmp_path, VALID)
    path.unlink()
    path.mkdir()
    assert validate_spec_file(path) == [f"{path}: (file): is a directory, not a file"]


def test_all_errors_are_reported_at_once(tmp_path):
    spec = _mutated(lambda s: (s.pop("description"), s.update(colour=1), s["slo"].update(max_quality_drop=2)))
    errors = validate_spec_file(_project(tmp_path, spec))
    assert len(errors) == 3, errors


@pytest.mark.parametrize(
    "data, message",
    [
        (DATA[:-1] + ['{"id": "r7", oops'], "demo.jsonl:8: malformed JSON"),
        (DATA + [dict(DATA[0], id="r9", inputs={"ticket": "x", "customer": "y"})], "demo.jsonl:9: inputs.customer: input not declared by the spec"),
        (DATA + [dict(DATA[0], id="r9", expected={"team": "a"})], "demo.jsonl:9: expected: missing field 'label'"),
        (DATA[4:], "template.system.examples.count: 2 examples but"),
        (DATA[:-1] + ['{"id": "r7", "split": "test", "inputs": {"ticket": "x"}, "expected": {"label": NaN}}'],
         "demo.jsonl:8: malformed JSON: NaN is not JSON"),
        (DATA[:-1] + ['{"id": "r7", "split": "test", "inputs": {"ticket": "x"}, "expected": Infinity}'],
         "demo.jsonl:8: malformed JSON: Infinity is not JSON"),
        (DATA + ["[" * 200_000 + "]" * 200_000], "demo.jsonl:9: malformed JSON: nested deeper than 64 levels"),
        ([r for r in DATA if r["split"] != "dev"], "demo.jsonl: split: no dev records"),
        ([r for r in DATA if r["split"] != "test"], "demo.jsonl: split: no test records"),
    ],
    ids=["malformed", "undeclared-input", "missing-field", "few-train", "nan", "infinity", "brackets", "no-dev", "no-test"],
)
def test_dataset_problems_are_reported_by_spec_validation(tmp_path, data, message):
    errors = validate_spec_file(_project(tmp_path, VALID, data=data))
    assert any(message in e for e in errors), errors


def test_fixed_ids_must_be_train_records(tmp_path):
    spec = _mutated(lambda s: s["template"]["system"]["examples"].update(selection="fixed", ids=["r0", "r5"]))
    errors = validate_spec_file(_project(tmp_path, spec))
    assert any("template.system.examples.ids: 'r5' is not a train record" in e for e in errors), errors


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_validate_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["spec", "validate"]) == 0
    assert capsys.readouterr().out.count("ok: ") == len(BUNDLED)
    good = _project(tmp_path, VALID)
    bad = tmp_path / "prompts" / "demo2.yaml"
    bad.write_text(yaml.safe_dump(_mutated(lambda s: s.update(name="demo2", colour=1))))
    assert main(["spec", "validate", str(good)]) == 0
    capsys.readouterr()
    assert main(["spec", "validate", str(bad), str(good)]) == 2
    captured = capsys.readouterr()
    assert f"ok: {good}" in captured.out
    assert f"{bad}: colour: unknown field" in captured.err and "1 error(s) in 2 file(s)" in captured.err


def test_cli_render(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["spec", "render", "word_problems", "--id", "wp-0100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("=== system ===\n") and "=== user ===\nQuestion:" in out and "=== expected (wp-0100) ===" in out
    assert main(["spec", "render", "ticket_triage", "--json", "--examples", "0"]) == 0
    payload = json.loads(capsys.readouterr().out)
    first_dev = next(r["id"] for r in map(json.loads, (ROOT / "datasets/ticket_triage.jsonl").open()) if r["split"] == "dev")
    assert payload["record"] == first_dev and "Examples:" not in payload["messages"][0]["content"]
    assert main(["spec", "render", "ticket_triage", "--id", "nope"]) == 2  # bad input: like argparse's usage errors
    assert "SpecError: " in capsys.readouterr().err


def test_cli_exits_2_with_file_field_reason_never_a_traceback(tmp_path, capsys, monkeypatch):
    path = _project(tmp_path, VALID)
    monkeypatch.chdir(tmp_path)
    path.write_bytes(b"name: demo\ndescription: \xff\n")
    assert main(["spec", "validate", str(path)]) == 2
    assert f"{path}: line 2: not UTF-8 text" in capsys.readouterr().err
    assert main(["spec", "render", str(path)]) == 2
    assert "SpecError: " in capsys.readouterr().err
    (tmp_path / "cfg.toml").mkdir()
    assert main(["--config", str(tmp_path / "cfg.toml"), "templates", "list"]) == 2
    assert f"ConfigError: {tmp_path / 'cfg.toml'}: not a config file (a directory)" in capsys.readouterr().err


def test_cli_render_json_is_valid_json(tmp_path, capsys, monkeypatch):
    path = _project(tmp_path, VALID)
    monkeypatch.chdir(tmp_path)
    assert main(["spec", "render", str(path), "--json"]) == 0
    json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in the output"))

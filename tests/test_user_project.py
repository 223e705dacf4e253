"""A user's own project, pure parts: a python metric from the project, per-request output
schemas, label-free records, and the published template with a per-request schema.

The end-to-end run (an installed package, the nightly from a folder outside this
repository, a judge server) is tests/test_user_project_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fakes import FakeEngine
from promptdistill.core.errors import SpecError
from promptdistill.evaluate.evaluator import evaluate
from promptdistill.search.references import fill_references
from promptdistill.search.splits import split_records
from promptdistill.specs.datasets import write_records
from promptdistill.specs.load import load_spec, validate_spec_file
from promptdistill.specs.plugins import MetricFunctionError
from promptdistill.specs.prompt import output_schema_for, template_content

FUNCTION = {"name": "set_alarm", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["time"],
    "properties": {"time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                   "label": {"type": "string"}}}}

METRIC = '''
def score(reply_text, parsed, expected, inputs):
    """Each argument matches any of the allowed values; optional ones may be omitted."""
    if not isinstance(parsed, dict):
        return 0.0
    allowed = expected["allowed"]
    required = expected.get("required", [])
    if any(name not in parsed for name in required):
        return 0.0
    if any(name not in allowed or value not in allowed[name] for name, value in parsed.items()):
        return 0.0
    return 1.0
'''


def make_project(root: Path, *, metric_source: str = METRIC, labelled: bool = True) -> Path:
    (root / "prompts").mkdir(parents=True, exist_ok=True)
    (root / "metrics").mkdir(exist_ok=True)
    (root / "metrics" / "calls.py").write_text(metric_source)
    spec = {
        "name": "tool_call", "description": "Turn a request into the arguments of one function call.",
        "dataset": "tool_call.jsonl",
        "inputs": {"request": "What the user asked.", "function": "The function to call (JSON)."},
        "template": {"system": {"instruction": "Reply with the arguments of the function call as JSON. "
                                               "Use only the function's parameters."},
                     "user": "Function: {function}\nRequest: {request}"},
        "output": {"schema_from": "function", "max_tokens": 48},
        "metric": {"kind": "python", "function": "metrics.calls:score"},
        "slo": {"max_quality_drop": 0.1},
    }
    (root / "prompts" / "tool_call.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    records = []
    for i in range(40):
        split = "train" if i < 8 else "dev" if i < 28 else "test"
        hour = f"{6 + i % 12:02d}:{(i * 7) % 60:02d}"
        rec = {"id": f"tc-{i:03d}", "split": split,
               "inputs": {"request": f"wake me at {hour}", "function": json.dumps(FUNCTION)}}
        if labelled or split == "train":
            rec["expected"] = {"allowed": {"time": [hour], "label": ["wake up", "alarm"]}, "required": ["time"]}
        records.append(rec)
    write_records(root / "datasets" / "tool_call.jsonl", records)
    return root / "prompts" / "tool_call.yaml"


def reply_from_request(req):
    """A scripted model: it reads the hour out of the request (and sometimes adds a label)."""
    user = req.chat()[-1]["content"]
    hour = user.rsplit("wake me at ", 1)[-1].strip()
    return json.dumps({"time": hour} if int(hour[-1]) % 2 else {"time": hour, "label": "alarm"})


def test_a_python_metric_from_the_project_scores_replies(tmp_path):
    spec = load_spec(make_project(tmp_path))
    assert validate_spec_file(spec.source_path) == []
    splits = split_records(spec, seed=0, screen_size=4, dev_size=20, test_size=12)
    report = evaluate(FakeEngine(reply=reply_from_request), spec, splits.screen)
    assert report.scores == [1.0] * 4
    wrong = evaluate(FakeEngine(reply=lambda req: json.dumps({"time": "25:99"})), spec, splits.screen)
    assert wrong.scores == [0.0] * 4


def test_the_per_request_schema_constrains_and_validates_each_request(tmp_path):
    spec = load_spec(make_project(tmp_path))
    seen = []

    def reply(req):
        seen.append(req.schema)
        return reply_from_request(req)

    record = split_records(spec, seed=0, screen_size=4, dev_size=20, test_size=12).screen[0]
    assert output_schema_for(spec, record["inputs"]) == FUNCTION["parameters"]
    report = evaluate(FakeEngine(reply=reply), spec, [record])
    assert seen == [FUNCTION["parameters"]] and report.valid == [True]
    bad = evaluate(FakeEngine(reply=lambda req: '{"when": "7"}'), spec, [record])
    assert bad.valid == [False]


def test_a_metric_that_fails_names_the_spec_the_function_and_the_record(tmp_path):
    spec = load_spec(make_project(tmp_path, metric_source="def score(reply_text, parsed, expected, inputs):\n"
                                                           "    return expected['missing']\n"))
    record = split_records(spec, seed=0, screen_size=4, dev_size=20, test_size=12).screen[0]
    with pytest.raises(MetricFunctionError, match=rf"tool_call.yaml: metric.function metrics.calls:score: record "
                                                  rf"'{record['id']}': raised KeyError"):
        evaluate(FakeEngine(reply=reply_from_request), spec, [record])


def test_a_metric_that_returns_no_score_is_an_error_not_a_zero(tmp_path):
    spec = load_spec(make_project(tmp_path, metric_source="def score(*args):\n    return 'yes'\n"))
    record = split_records(spec, seed=0, screen_size=4, dev_size=20, test_size=12).screen[0]
    with pytest.raises(MetricFunctionError, match="returned 'yes'; a score must be a number in \\[0, 1\\] or None"):
        evaluate(FakeEngine(reply=reply_from_request), spec, [record])


def test_spec_validation_checks_the_function_exists(tmp_path):
    path = make_project(tmp_path)
    (tmp_path / "metrics" / "calls.py").write_text("def other(*args):\n    return 1.0\n")
    with pytest.raises(SpecError, match="metrics/calls.py has no callable 'score'"):
        load_spec(path)


def test_the_metric_source_is_part_of_the_spec_hash(tmp_path):
    path = make_project(tmp_path)
    before = load_spec(path).spec_hash()
    (tmp_path / "metrics" / "calls.py").write_text(METRIC + "\n# a changed rule\n")
    assert load_spec(path).spec_hash() != before


def test_label_free_records_are_scored_against_the_baselines_reply(tmp_path):
    spec = load_spec(make_project(tmp_path, labelled=False))
    splits = split_records(spec, seed=0, screen_size=4, dev_size=20, test_size=12)
    assert all(r["expected"] is None for r in splits.dev + splits.test)
    engine = FakeEngine(reply=reply_from_request)
    filled, refs = fill_references(engine, spec, splits)
    assert len(refs) == 32 and engine.calls == 32  # one batch, every label-free record once
    record = filled.screen[0]
    assert record["expected_from"] == "baseline" and record["expected"] == json.loads(reply_from_request_for(record))
    # The metric compares a candidate with the baseline's reply: here a project metric that
    # asks for the same arguments.
    (tmp_path / "metrics" / "calls.py").write_text("def score(reply_text, parsed, expected, inputs):\n"
                                                    "    return float(parsed == expected)\n")
    spec = load_spec(spec.source_path)
    agree = evaluate(FakeEngine(reply=reply_from_request), spec, filled.screen)
    differ = evaluate(FakeEngine(reply=lambda req: json.dumps({"time": "00:00"})), spec, filled.screen)
    assert agree.mean == 1.0 and differ.mean == 0.0


def reply_from_request_for(record):
    class _Req:
        def chat(self):
            return [{"role": "user", "content": f"Request: {record['inputs']['request']}"}]

    return reply_from_request(_Req())


def test_the_published_template_builds_the_response_format_per_request(tmp_path):
    from promptdistill.client import Templates
    from promptdistill.registry.store import Registry

    spec = load_spec(make_project(tmp_path))
    Registry(str(tmp_path / "registry")).publish("tool_call", template_content(spec), labels=["production"])
    t = Templates(str(tmp_path / "registry")).get("tool_call@production")
    inputs = {"request": "wake me at 07:30", "function": FUNCTION}
    body = t.request_body(inputs, model="m")
    assert body["response_format"]["json_schema"]["schema"] == FUNCTION["parameters"]
    other = {**FUNCTION, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    assert t.request_body({**inputs, "function": json.dumps(other)}, model="m")["response_format"]["json_schema"][
        "schema"] == other["parameters"]
    assert t.parse('{"time": "07:30"}', inputs) == {"time": "07:30"}
    with pytest.raises(Exception, match="does not match the output schema"):
        t.parse('{"time": "7.30pm"}', inputs)


def test_init_writes_a_minimal_project_and_keeps_what_exists(tmp_path, capsys):
    from promptdistill.cli import main

    assert main(["init", str(tmp_path / "proj")]) == 0
    root = tmp_path / "proj"
    assert {p.name for p in root.iterdir()} == {"promptdistill.toml", "prefect.yaml", "prompts", "datasets"}
    deployments = yaml.safe_load((root / "prefect.yaml").read_text())["deployments"]
    # The flows ship with the package: module entrypoints that import from any folder.
    import importlib

    for d in deployments:
        module, name = d["entrypoint"].rsplit(".", 1)
        assert hasattr(importlib.import_module(module), name), d["entrypoint"]
    from promptdistill.core.config import load_settings

    assert load_settings(root / "promptdistill.toml", env={}).judge is None
    (root / "promptdistill.toml").write_text("# mine\n")
    assert main(["init", str(root)]) == 0
    assert (root / "promptdistill.toml").read_text() == "# mine\n"
    assert "kept" in capsys.readouterr().err


def test_init_quotes_the_folder_name_in_prefect_yaml(tmp_path):
    from promptdistill.cli import main

    name = 'team: "search" it\'s #1'
    root = tmp_path / name
    assert main(["init", str(root)]) == 0
    config = yaml.safe_load((root / "prefect.yaml").read_text())
    assert config["name"] == name
    assert [d["name"] for d in config["deployments"]] == ["nightly", "optimize-prompt", "profile-ttft"]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_init_refuses_a_file_in_the_way_and_writes_nothing(tmp_path, capsys):
    from promptdistill.cli import main

    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    assert main(["init", str(a_file)]) == 2
    assert f"ConfigError: init: {a_file} is a file, so the project folder cannot be created" in capsys.readouterr().err
    assert main(["init", str(a_file / "proj")]) == 2
    err = capsys.readouterr().err
    assert f"init: {a_file}, a parent of the project folder, is a file" in err and "Traceback" not in err
    assert a_file.read_text() == "mine\n"

    root = tmp_path / "proj"
    root.mkdir()
    (root / "prompts").write_text("not a folder\n")
    assert main(["init", str(root)]) == 2
    assert f"init: {root / 'prompts'} is a file, so folder {root / 'prompts'} cannot be created" in capsys.readouterr().err
    assert _tree(root) == {"prompts": b"not a folder\n"}  # nothing half-written next to it

    (root / "prompts").unlink()
    (root / "datasets" / "README.md").mkdir(parents=True)
    assert main(["init", str(root), "--force"]) == 2
    assert f"init: {root / 'datasets' / 'README.md'} is a folder, where init writes a file" in capsys.readouterr().err
    assert _tree(root) == {"datasets": None, "datasets/README.md": None}


def test_init_undoes_a_write_that_fails_part_way(tmp_path, monkeypatch, capsys):
    import errno

    import promptdistill.core.jsonio as jsonio
    from promptdistill.cli import main

    root = tmp_path / "proj"
    root.mkdir()
    (root / "promptdistill.toml").write_text("# mine\n")
    before = _tree(root)
    real_write, calls = jsonio.atomic_write, []

    def full_disk(path, text, *args, **kwargs):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, text, *args, **kwargs)

    monkeypatch.setattr(jsonio, "atomic_write", full_disk)
    assert main(["init", str(root), "--force"]) == 2
    err = capsys.readouterr().err
    assert f"init: cannot write {calls[2]}: No space left on device; nothing was written" in err
    assert _tree(root) == before  # the replaced file is back, the new ones and prompts/ are gone


def test_datasets_import_maps_columns_splits_by_hashed_id_and_reports_what_it_left_out(tmp_path, capsys):
    import pandas as pd

    from promptdistill.cli import main
    from promptdistill.specs.datasets import load_dataset
    from promptdistill.specs.importer import split_of

    spec_path = make_project(tmp_path)
    rows = [{"request_id": f"r{i}", "text": f"wake me at 0{i % 10}:15", "fn": json.dumps(FUNCTION)} for i in range(60)]
    rows.append(dict(rows[3]))                              # a duplicate of row 4
    rows.append({"request_id": "r-empty", "text": "  ", "fn": json.dumps(FUNCTION)})  # an empty input
    pd.DataFrame(rows).to_parquet(tmp_path / "traffic.parquet")
    out = tmp_path / "datasets" / "imported.jsonl"
    code = main(["datasets", "import", str(tmp_path / "traffic.parquet"), "--spec", str(spec_path),
                 "--map", "request=text", "--map", "function=fn", "--id-column", "request_id", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "10 of 62 rows imported" in printed  # 10 distinct texts; the rest repeat them
    assert "51 duplicate(s) left out" in printed and "1 row(s) with an empty input left out (rows 62)" in printed
    df = load_dataset(out, declared_inputs=("request", "function"))
    assert df["expected"].isna().all()  # label-free
    assert all(split == split_of(rid) for rid, split in zip(df["id"], df["split"]))
    # The records written: the first row of each distinct non-empty text, in order, its id
    # from --id-column and its inputs from the mapped columns.
    first: dict[str, dict] = {}
    for r in rows:
        if r["text"].strip():
            first.setdefault(r["text"], r)
    assert list(zip(df["id"], df["inputs"])) == [(r["request_id"], {"request": r["text"], "function": r["fn"]})
                                                 for r in first.values()]
    splits = [split_of(r["request_id"]) for r in first.values()]
    assert (f"(train {splits.count('train')}, dev {splits.count('dev')}, test {splits.count('test')})"
            in printed), printed


def test_datasets_import_names_a_missing_column(tmp_path, capsys):
    from promptdistill.cli import main

    spec_path = make_project(tmp_path)
    dataset = tmp_path / "datasets" / "tool_call.jsonl"
    before = dataset.read_bytes()
    (tmp_path / "t.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    assert main(["datasets", "import", str(tmp_path / "t.jsonl"), "--spec", str(spec_path)]) == 2
    err = capsys.readouterr().err
    assert f"SpecError: {tmp_path / 't.jsonl'}: no column(s) ['request', 'function'] (columns: ['body'])" in err, err
    assert "--map INPUT=COLUMN" in err and "Traceback" not in err
    assert dataset.read_bytes() == before and not list(dataset.parent.glob("*.bak"))  # nothing written


def test_the_optimizer_publishes_constrained_decoding_for_a_per_request_schema(tmp_path):
    """The formats step compares ways to get JSON against one declared schema; a spec whose
    schema comes with each request has none to declare, and its published content must
    still constrain every request to that request's schema."""
    import dataclasses

    from test_optimize_unit import ttft_model

    from promptdistill.optimize.optimizer import optimize
    from promptdistill.optimize.run import OptimizeBudget

    spec = load_spec(make_project(tmp_path))
    budget = OptimizeBudget(max_lm_calls=400, screen_size=4, dev_size=8, test_size=4, fewshot_counts=(0,),
                            similar_counts=(), fixed_subsets=1, max_variants=1, feature_records=2,
                            timing_records=0, format_size=4)
    for formats in (True, False):
        result = optimize(FakeEngine(reply=reply_from_request), spec, ttft_model=ttft_model(),
                          budget=dataclasses.replace(budget, formats=formats))
        assert result.content["response_format"] == "json_schema" and result.content["schema_from"] == "function"


# --- a project metric runs at arm's length: hangs, exits, prints and odd values are errors ----------


@pytest.fixture
def short_metric_bounds(monkeypatch):
    monkeypatch.setenv("PROMPTDISTILL_METRIC_CALL_TIMEOUT_S", "1")
    monkeypatch.setenv("PROMPTDISTILL_METRIC_LOAD_TIMEOUT_S", "2")


def _validate(paths, capsys):
    from promptdistill.cli import main

    code = main(["spec", "validate", *map(str, paths)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(30)
def test_a_metric_that_hangs_per_call_is_stopped_within_its_bound(tmp_path, capsys, short_metric_bounds):
    import time

    path = make_project(tmp_path, metric_source="import time\ndef score(*args):\n    time.sleep(600)\n")
    start = time.monotonic()
    code, out, err = _validate([path], capsys)
    assert time.monotonic() - start < 20
    assert code == 2 and out == ""
    assert f"{path}: metric.function metrics.calls:score: record 'tc-000': took longer than 1 s" in err
    assert "PROMPTDISTILL_METRIC_CALL_TIMEOUT_S" in err


@pytest.mark.timeout(30)
def test_a_metric_that_hangs_at_import_is_stopped_within_its_bound(tmp_path, capsys, short_metric_bounds):
    path = make_project(tmp_path, metric_source="while True:\n    pass\n")
    code, out, err = _validate([path], capsys)
    assert code == 2 and out == ""
    assert f"{path}: metric.function: importing {tmp_path / 'metrics' / 'calls.py'} took longer than 2 s" in err
    assert "PROMPTDISTILL_METRIC_LOAD_TIMEOUT_S" in err


@pytest.mark.timeout(30)
def test_a_metric_that_ends_the_process_fails_validate_and_the_other_specs_are_still_reported(tmp_path, capsys):
    specs = []
    for n, body in enumerate(["import os; os._exit(0)", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                              "return 'high'", "return 1.0"]):
        root = tmp_path / f"p{n}"
        specs.append(make_project(root, metric_source=f"def score(*args):\n    {body}\n"))
    code, out, err = _validate(specs, capsys)
    assert code == 2, (out, err)
    assert (f"{specs[0]}: metric.function metrics.calls:score: record 'tc-000': the metric's process ended "
            "(exit code 0)") in err
    assert f"{specs[1]}: metric.function metrics.calls:score: record 'tc-000': the metric's process ended " \
           "(killed by signal SIGKILL)" in err
    assert f"{specs[2]}: metric.function metrics.calls:score: record 'tc-000': returned 'high'" in err
    assert out == f"ok: {specs[3]}\n"


@pytest.mark.timeout(30)
def test_what_a_metric_prints_never_reaches_validates_output_and_shows_in_its_error(tmp_path, capsys):
    quiet = make_project(tmp_path / "a", metric_source="import sys\nprint('ok: fake.yaml')\n"
                                                        "def score(*args):\n    print('ok: fake.yaml')\n"
                                                        "    print('noise', file=sys.stderr)\n    return 1.0\n")
    loud = make_project(tmp_path / "b", metric_source="def score(*args):\n    print('looking at', args[0][:10])\n"
                                                       "    raise ValueError('no')\n")
    code, out, err = _validate([quiet, loud], capsys)
    assert code == 2 and out == f"ok: {quiet}\n"
    assert "fake.yaml" not in out + err and "noise" not in out + err
    assert f"{loud}: metric.function metrics.calls:score: record 'tc-000': raised ValueError: no" in err
    assert "(it printed: 'looking at {\"allowed\"" in err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("source, says", [
    ("def score(*args):\n    return 10**400\n", "returned an int too large for a float; a score must be a number in [0, 1]"),
    ("class Stop(BaseException):\n    pass\ndef score(*args):\n    raise Stop('halt')\n", "raised Stop(halt)"),
    ("class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError('no str')\n"
     "def score(*args):\n    raise Odd()\n", "raised Odd: (str() of the exception failed: RuntimeError)"),
    ("class Odd:\n    def __repr__(self):\n        raise RuntimeError('no repr')\n"
     "def score(*args):\n    return Odd()\n", "returned a value of type Odd (repr() failed: RuntimeError: no repr)"),
], ids=["huge-int", "base-exception", "str-fails", "repr-fails"])
def test_an_exotic_return_or_exception_is_an_error_naming_the_record(tmp_path, capsys, source, says):
    path = make_project(tmp_path, metric_source=source)
    code, out, err = _validate([path], capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"{path}: metric.function metrics.calls:score: record 'tc-000': {says}" in err, err


@pytest.mark.timeout(30)
def test_datasets_import_with_a_hanging_metric_returns_within_its_bound(tmp_path, capsys, short_metric_bounds):
    from promptdistill.cli import main

    path = make_project(tmp_path, metric_source="import time\ndef score(*args):\n    time.sleep(600)\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"request": f"wake me at 0{i}:00", "function": json.dumps(FUNCTION),
                                        "expected": {"allowed": {"time": [f"0{i}:00"]}}}) + "\n" for i in range(9)))
    dataset = tmp_path / "datasets" / "tool_call.jsonl"
    before = dataset.read_bytes()
    code = main(["datasets", "import", str(rows), "--spec", str(path), "--expected-column", "expected"])
    err = capsys.readouterr().err
    assert code == 2 and "took longer than 1 s" in err and dataset.read_bytes() == before


def test_scoring_in_process_still_reports_a_base_exception_and_an_overflow_naming_the_record(tmp_path):
    import re

    # The first call runs at arm's length, the later ones in this process: the function
    # fails from its second call on (a file counts the calls across both processes).
    calls = tmp_path / "calls.txt"
    count = (f"import pathlib\ndef called():\n    p = pathlib.Path({str(calls)!r})\n"
             "    p.write_text(p.read_text() + 'x' if p.exists() else 'x')\n    return len(p.read_text())\n")
    for source, says in [("class Stop(BaseException):\n    pass\n"
                          "def score(*args):\n    if called() > 1:\n        raise Stop('x')\n    return 1.0\n",
                          "raised Stop(x)"),
                         ("def score(*args):\n    return 10**400 if called() > 1 else 1.0\n",
                          "returned an int too large for a float")]:
        calls.unlink(missing_ok=True)
        spec = load_spec(make_project(tmp_path, metric_source=count + source))
        screen = split_records(spec, seed=0, screen_size=4, dev_size=20, test_size=12).screen
        with pytest.raises(MetricFunctionError, match=re.escape(f"record '{screen[1]['id']}': {says}")):
            evaluate(FakeEngine(reply=reply_from_request), spec, screen[:2])
        assert calls.read_text() == "xx"


def test_a_function_definition_without_parameters_is_refused_naming_the_record(tmp_path):
    path = make_project(tmp_path)
    dataset = tmp_path / "datasets" / "tool_call.jsonl"
    records = [json.loads(line) for line in dataset.read_text().splitlines()]
    records[3]["inputs"]["function"] = json.dumps({"name": "set_alarm", "description": "Set an alarm."})
    records[5]["inputs"]["function"] = {"type": "function", "function": {"name": "set_alarm"}}
    write_records(dataset, records)
    errors = validate_spec_file(path)
    assert errors[:2] == [
        f"{dataset}:4: inputs.function: record 'tc-003': a function definition without parameters: read as a schema "
        "it would accept any reply; give the function's parameters (a JSON Schema object)",
        f"{dataset}:6: inputs.function: record 'tc-005': a function definition without function.parameters: read as "
        "a schema it would accept any reply; give the function's parameters (a JSON Schema object)"], errors


def test_init_of_a_symlink_loop_is_an_error_naming_it(tmp_path, capsys):
    from promptdistill.cli import main

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(["init", str(loop)]) == 2
    err = capsys.readouterr().err
    assert f"ConfigError: init: cannot check {loop}" in err and "nothing was written" in err


@pytest.mark.timeout(30)
@pytest.mark.parametrize("force", [[], ["--force"]])
def test_init_over_a_fifo_is_an_error_naming_it_not_a_hang(tmp_path, capsys, force):
    import os

    from promptdistill.cli import main

    os.mkfifo(tmp_path / "promptdistill.toml")
    assert main(["init", str(tmp_path), *force]) == 2
    err = capsys.readouterr().err
    assert (f"ConfigError: init: {tmp_path / 'promptdistill.toml'} is a FIFO (named pipe), not a regular file, where "
            "init writes a file; move or remove it") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["promptdistill.toml"]

"""Datasets: loading, line-numbered errors, and the bundled generated sets."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from promptdistill.specs.datasets import dataset_hash, load_dataset, records, write_records
from promptdistill.core.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ["ticket_triage", "invoice_extraction", "word_problems", "format_rules", "summarize"]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rec(i: str = "a", split: str = "train", **inputs: str) -> str:
    return json.dumps({"id": i, "split": split, "inputs": inputs or {"q": "x"}, "expected": "y"})


def test_load_returns_the_documented_columns_in_file_order(tmp_path):
    path = _write(tmp_path, [_rec("a"), "", _rec("b", "dev"), _rec("c", "test")])
    df = load_dataset(path, declared_inputs=["q"])
    assert list(df.columns) == ["id", "split", "inputs", "expected", "reference", "line"]
    assert list(df["id"]) == ["a", "b", "c"]
    assert list(df["line"]) == [1, 3, 4]
    assert records(df, "dev") == [{"id": "b", "split": "dev", "inputs": {"q": "x"}, "expected": "y", "reference": None}]
    with pytest.raises(ValueError, match="split must be one of"):
        records(df, "validation")


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "b", "split": "dev", ', ":2: malformed JSON"),
        ('["not", "an", "object"]', ":2: (record): must be a JSON object"),
        ('{"id": "b", "inputs": {"q": "x"}, "expected": 1}', ":2: split: required field is missing"),
        ('{"id": "b", "split": "validation", "inputs": {"q": "x"}, "expected": 1}', ":2: split: unknown split 'validation'"),
        ('{"id": "a", "split": "dev", "inputs": {"q": "x"}, "expected": 1}', ":2: id: duplicate id 'a' (first on line 1)"),
        ('{"id": "b", "split": "dev", "inputs": {"q": "x", "extra": "y"}, "expected": 1}', ":2: inputs.extra: input not declared by the spec"),
        ('{"id": "b", "split": "dev", "inputs": {}, "expected": 1}', ":2: inputs.q: missing (the spec declares it)"),
        ('{"id": "b", "split": "dev", "inputs": "x", "expected": 1}', ":2: inputs: must be an object"),
        ('{"id": "", "split": "dev", "inputs": {"q": "x"}, "expected": 1}', ":2: id: must be a non-empty string"),
        ('{"id": "b", "split": "dev", "inputs": {"q": "x"}, "expected": 1, "label": 2}', ":2: label: unknown field"),
        ('{"id": "b", "split": "dev", "inputs": {"q": "x"}, "expected": NaN}', ":2: malformed JSON: NaN is not JSON"),
        ('{"id": "b", "split": "dev", "inputs": {"q": "x"}, "expected": -Infinity}', ":2: malformed JSON: -Infinity is not JSON"),
        ("[" * 200_000 + "]" * 200_000, ":2: malformed JSON: nested deeper than 64 levels"),
        ('{"id": "b", "split": "dev", "inputs": {"q": "x"}, "expected": ' + "[" * 80 + "]" * 80 + "}",
         ":2: malformed JSON: nested deeper than 64 levels"),
    ],
)
def test_each_bad_line_gives_an_error_naming_file_line_and_field(tmp_path, line, message):
    path = _write(tmp_path, [_rec("a"), line])
    with pytest.raises(SpecError) as info:
        load_dataset(path, declared_inputs=["q"])
    errors = info.value.errors
    assert len(errors) == 1
    assert errors[0].startswith(str(path)) and message in errors[0], errors


def test_a_line_is_split_on_newlines_only(tmp_path):
    """U+2028 is valid raw inside a JSON string; str.splitlines() would cut the record there."""
    path = _write(tmp_path, ['{"id": "a", "split": "dev", "inputs": {"q": "x\u2028y\x85z"}, "expected": 1}'])
    assert load_dataset(path)["inputs"][0] == {"q": "x\u2028y\x85z"}


def test_every_error_is_reported_not_just_the_first(tmp_path):
    path = _write(tmp_path, ["{bad", _rec("a"), _rec("a"), '{"id": "z"}'])
    with pytest.raises(SpecError) as info:
        load_dataset(path)
    errors = info.value.errors
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in errors] == ["1", "3", "4", "4"]
    assert "4 dataset errors" in str(info.value)


def test_a_record_without_expected_is_label_free(tmp_path):
    path = _write(tmp_path, [_rec("a"), '{"id": "b", "split": "dev", "inputs": {"q": "x"}}',
                             '{"id": "c", "split": "test", "inputs": {"q": "y"}, "expected": null}'])
    df = load_dataset(path)
    assert df["expected"].tolist()[1:] == [None, None]
    assert records(df, "dev")[-1] == {"id": "b", "split": "dev", "inputs": {"q": "x"}, "expected": None,
                                      "reference": None}


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(SpecError, match="dataset file not found"):
        load_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(SpecError, match="is a directory"):
        load_dataset(tmp_path)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": "caf\xe9"}\n')
    with pytest.raises(SpecError, match="latin1.jsonl: not UTF-8 text"):
        load_dataset(tmp_path / "latin1.jsonl")
    empty = _write(tmp_path, [""])
    with pytest.raises(SpecError, match="no records"):
        load_dataset(empty)


def test_loading_is_memoised_until_the_file_changes(tmp_path):
    path = _write(tmp_path, [_rec("a")])
    first = load_dataset(path)
    assert load_dataset(path) is first
    _write(tmp_path, [_rec("a"), _rec("b", "dev")])
    assert list(load_dataset(path)["id"]) == ["a", "b"]


def test_dataset_hash_is_the_file_sha256(tmp_path):
    import hashlib

    path = _write(tmp_path, [_rec("a")])
    assert dataset_hash(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_write_records_is_atomic_and_validates(tmp_path):
    path = tmp_path / "out.jsonl"
    write_records(path, [{"id": "a", "split": "train", "inputs": {"q": "x"}, "expected": 1}])
    before = path.read_bytes()
    with pytest.raises(SpecError, match="split: unknown split"):
        write_records(path, [{"id": "a", "split": "nope", "inputs": {}, "expected": 1}])
    with pytest.raises(SpecError, match="out.jsonl:1: not JSON"):
        write_records(path, [{"id": "a", "split": "dev", "inputs": {}, "expected": float("nan")}])
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


# --- the bundled sets -------------------------------------------------------------------


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_sets_are_big_enough(name):
    df = load_dataset(ROOT / "datasets" / f"{name}.jsonl")
    counts = df["split"].value_counts().to_dict()
    assert len(df) >= 150 and counts.get("test", 0) >= 50 and counts.get("train", 0) >= 20 and counts.get("dev", 0) >= 20
    first_input = next(iter(df["inputs"].iloc[0]))
    assert df["inputs"].map(lambda d: d[first_input]).is_unique


@pytest.mark.parametrize("name", BUNDLED)
def test_generators_reproduce_the_bundled_files_byte_for_byte(tmp_path, name):
    out = tmp_path / f"{name}.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "datasets" / "generators" / f"{name}.py"), "--out", str(out)],
        check=True, capture_output=True, cwd=tmp_path,
    )
    assert out.read_bytes() == (ROOT / "datasets" / f"{name}.jsonl").read_bytes()


def _all(name: str) -> list[dict]:
    df = load_dataset(ROOT / "datasets" / f"{name}.jsonl")
    return [r for split in ("train", "dev", "test") for r in records(df, split)]


def test_word_problem_answers_are_right_by_an_independent_solver():
    def solve(q: str) -> int:
        n = [int(x) for x in re.findall(r"\d+", q)]
        if "gets" in q or "years older" in q:
            return n[0] + n[1]
        if "buys" in q and "loses" in q:
            return n[0] + n[1] - n[2]
        if "gave" in q or "change" in q:
            return n[0] - n[1] if "gave" in q else n[1] - n[0]
        if "each box" in q or "cost?" in q:
            return n[0] * n[1]
        if "equally" in q:
            return n[0] // n[1]
        raise AssertionError(f"unknown problem shape: {q}")

    for r in _all("word_problems"):
        assert solve(r["inputs"]["question"]) == r["expected"]["result"], r
        assert r["expected"]["calculation"].endswith(f"= {r['expected']['result']}")
        assert list(r["expected"]) == ["calculation", "result"]  # the order constrained decoding emits


def test_invoice_answers_appear_in_the_document():
    for r in _all("invoice_extraction"):
        doc, exp = r["inputs"]["document"], r["expected"]
        assert exp["vendor"] in doc and exp["invoice_number"] in doc
        assert f"{exp['total']:,.2f}" in doc
        symbol = {"USD": ("$", "USD "), "EUR": ("€", "EUR "), "GBP": ("£", "GBP ")}[exp["currency"]]
        assert any(f"{s}{exp['total']:,.2f}" in doc for s in symbol)
        due = dt.date.fromisoformat(exp["due_date"])
        assert exp["due_date"] in doc or f"{due:%B} {due.day}, {due.year}" in doc


def test_slugs_follow_the_rules_in_the_spec():
    for r in _all("format_rules"):
        title, slug = r["inputs"]["title"], r["expected"]["slug"]
        assert re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", slug)
        words = slug.split("-")
        assert not {"the", "a", "an"} & set(words)
        kept = [w.replace("'", "").lower() for w in re.findall(r"[A-Za-z0-9]+(?:'[A-Za-z]*)?", title)]
        kept = [w for w in kept if w not in ("the", "a", "an")]
        for _ in range(title.count("&")):
            i = words.index("and")
            assert kept[i - 1] == words[i - 1]
            words = words[:i] + words[i + 1:]
        assert words == kept, (title, slug)


def test_ticket_labels_match_their_cue_pool():
    from importlib import util

    spec = util.spec_from_file_location("tt_gen", ROOT / "datasets" / "generators" / "ticket_triage.py")
    sys.path.insert(0, str(ROOT / "datasets" / "generators"))
    try:
        gen = util.module_from_spec(spec)
        spec.loader.exec_module(gen)
    finally:
        sys.path.remove(str(ROOT / "datasets" / "generators"))
    openings = {label: [p.split("{")[0][:25] for p in pool] for label, pool in gen.PROBLEMS.items()}
    for r in _all("ticket_triage"):
        owners = {label for label, starts in openings.items() if any(s and s in r["inputs"]["ticket"] for s in starts)}
        assert r["expected"]["label"] in owners, r


def test_summary_references_only_use_facts_from_the_notes():
    for r in _all("summarize"):
        notes, exp = r["inputs"]["notes"], r["expected"]
        names = set(re.findall(r"\b[A-Z][a-z]+\b", " ".join(exp["key_points"])))
        names -= {"The", "Problem", "Decision", "Android", "April", "January"}
        assert names <= set(re.findall(r"\b[A-Z][a-z]+\b", notes)), (names, notes)
        assert 2 <= len(exp["key_points"]) <= 5 and 0 <= exp["confidence_score"] <= 1


# --- datasets import ----------------------------------------------------------------------


def _project(tmp_path: Path) -> Path:
    """A project with one spec (`label`, input `text`, exact metric) and no dataset yet."""
    import yaml

    (tmp_path / "prompts").mkdir()
    spec = {"name": "label", "description": "Label a message.", "dataset": "label.jsonl",
            "inputs": {"text": "The message."},
            "template": {"system": {"instruction": "Reply with the message's label."}, "user": "{text}"},
            "output": {"max_tokens": 8}, "metric": {"kind": "exact"}}
    (tmp_path / "prompts" / "label.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path / "prompts" / "label.yaml"


def _traffic(tmp_path: Path, rows: list, name: str = "traffic.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _rows(start: int, stop: int, **extra) -> list[dict]:
    return [{"rid": f"r{i}", "msg": f"message {i}", "label": f"l{i % 3}", **extra} for i in range(start, stop)]


def _seed(tmp_path: Path) -> Path:
    """The spec's existing labelled dataset, written without the importer."""
    from promptdistill.specs.importer import split_of

    return write_records(tmp_path / "datasets" / "label.jsonl",
                         [{"id": r["rid"], "split": split_of(r["rid"]), "inputs": {"text": r["msg"]},
                           "expected": r["label"]} for r in _rows(0, 40)])


def _import(tmp_path: Path, file: Path, *args: str) -> int:
    from promptdistill.cli import main

    return main(["datasets", "import", str(file), "--spec", str(tmp_path / "prompts" / "label.yaml"),
                 "--map", "text=msg", "--id-column", "rid", "--expected-column", "label", *args])


def test_import_creates_a_specs_first_dataset_that_passes_spec_validate(tmp_path, capsys):
    from promptdistill.specs.load import validate_spec_file

    spec_path = _project(tmp_path)
    assert _import(tmp_path, _traffic(tmp_path, _rows(0, 40))) == 0
    assert "40 of 40 rows imported" in capsys.readouterr().out
    assert validate_spec_file(spec_path) == []
    assert not (tmp_path / "datasets" / "label.jsonl.bak").exists()  # nothing was replaced
    out = tmp_path / "elsewhere" / "first.jsonl"
    assert _import(tmp_path, _traffic(tmp_path, _rows(0, 40)), "--out", str(out)) == 0
    assert load_dataset(out, declared_inputs=["text"])["id"].tolist() == [f"r{i}" for i in range(40)]


def test_an_import_with_no_usable_row_leaves_the_dataset_as_it_was(tmp_path, capsys):
    _project(tmp_path)
    dataset = _seed(tmp_path)
    before = dataset.read_bytes()
    assert _import(tmp_path, _traffic(tmp_path, [{"rid": "x", "msg": " ", "label": "a"}], "empty.jsonl")) == 2
    assert "nothing imported" in capsys.readouterr().err
    assert dataset.read_bytes() == before and not dataset.with_name("label.jsonl.bak").exists()


@pytest.mark.parametrize("rows, message", [
    (_rows(0, 3) + [{"rid": "r1", "msg": "other", "label": "a"}],
     r"traffic.jsonl:4: column 'rid': id 'r1' repeats line 2 with other inputs"),
    (_rows(0, 2) + [{"msg": "no id", "label": "a"}], r"traffic.jsonl:3: column 'rid': missing id"),
    (_rows(0, 2) + [{"rid": None, "msg": "null id", "label": "a"}], r"traffic.jsonl:3: column 'rid': missing id"),
    (_rows(0, 2) + ['{"rid": "r9", "msg": '], r"traffic.jsonl:3: malformed JSON"),
    (["", *_rows(0, 2), '{"rid": "r9", "msg": "m", "label": {"a": NaN}}'],
     r"traffic.jsonl:4: column 'label'.a: nan is not JSON; write null"),
    (_rows(0, 2) + ['{"rid": "r9", "msg": Infinity, "label": "a"}'], r"traffic.jsonl:3: column 'msg': inf is not JSON"),
])
def test_a_bad_row_is_named_by_input_file_line_and_column_and_nothing_is_written(tmp_path, capsys, rows, message):
    _project(tmp_path)
    dataset = _seed(tmp_path)
    before = dataset.read_bytes()
    assert _import(tmp_path, _traffic(tmp_path, rows)) == 2
    assert re.search(message, capsys.readouterr().err)
    assert dataset.read_bytes() == before


def test_a_csv_row_is_named_by_its_line_even_after_a_multiline_cell(tmp_path, capsys):
    _project(tmp_path)
    csv_file = tmp_path / "traffic.csv"
    csv_file.write_text('rid,msg,label\nr1,"two\nlines",a\n,no id,b\n')
    assert _import(tmp_path, csv_file) == 2
    assert "traffic.csv:4: column 'rid': missing id" in capsys.readouterr().err


def test_an_import_that_would_fail_spec_validate_is_refused_before_it_replaces_anything(tmp_path, capsys):
    _project(tmp_path)
    dataset = _seed(tmp_path)
    before = dataset.read_bytes()
    # An exact metric cannot score an object: `spec validate` would refuse this dataset.
    rows = _rows(0, 40)
    rows[5]["label"] = {"not": "a label"}
    assert _import(tmp_path, _traffic(tmp_path, rows)) == 2
    err = capsys.readouterr().err
    assert f"{dataset}:6: expected: an exact metric needs a string or number" in err
    assert dataset.read_bytes() == before
    assert sorted(p.name for p in dataset.parent.iterdir()) == ["label.jsonl"]  # no temporary file left


def test_a_replaced_dataset_is_kept_as_one_backup(tmp_path):
    _project(tmp_path)
    dataset = tmp_path / "datasets" / "label.jsonl"
    assert _import(tmp_path, _traffic(tmp_path, _rows(0, 40))) == 0
    first = dataset.read_bytes()
    assert _import(tmp_path, _traffic(tmp_path, _rows(40, 80))) == 0
    second = dataset.read_bytes()
    assert dataset.with_name("label.jsonl.bak").read_bytes() == first
    assert _import(tmp_path, _traffic(tmp_path, _rows(80, 120))) == 0
    assert dataset.with_name("label.jsonl.bak").read_bytes() == second
    assert sorted(p.name for p in dataset.parent.iterdir()) == ["label.jsonl", "label.jsonl.bak"]


def test_append_adds_new_traffic_and_keeps_the_existing_records_and_their_splits(tmp_path, capsys):
    from promptdistill.specs.datasets import read_records
    from promptdistill.specs.importer import split_of

    _project(tmp_path)
    dataset = tmp_path / "datasets" / "label.jsonl"
    assert _import(tmp_path, _traffic(tmp_path, _rows(0, 40))) == 0
    # A hand-made change the import must keep: another split and a meta object.
    existing = read_records(dataset)
    existing[0] = {**existing[0], "split": "test" if existing[0]["split"] != "test" else "dev", "meta": {"by": "hand"}}
    write_records(dataset, existing)
    capsys.readouterr()
    assert _import(tmp_path, _traffic(tmp_path, _rows(30, 50)), "--append") == 0
    assert "10 of 20 rows imported" in capsys.readouterr().out
    after = read_records(dataset)
    assert after[:40] == existing
    assert [r["id"] for r in after[40:]] == [f"r{i}" for i in range(40, 50)]
    assert all(r["split"] == split_of(r["id"]) for r in after[40:])
    # The same traffic again adds nothing and leaves the file alone.
    before = dataset.read_bytes()
    assert _import(tmp_path, _traffic(tmp_path, _rows(30, 50)), "--append") == 0
    assert dataset.read_bytes() == before
    # An id already in the dataset with other inputs is refused.
    assert _import(tmp_path, _traffic(tmp_path, [{"rid": "r3", "msg": "changed", "label": "a"}]), "--append") == 2
    assert f"traffic.jsonl:1: column 'rid': id 'r3' repeats {dataset}" in capsys.readouterr().err
    assert dataset.read_bytes() == before


def test_reference_columns_are_kept_as_the_records_reference(tmp_path):
    _project(tmp_path)
    rows = [{**r, "allowed": ["a", "b"], "facts": '{"k": [1, 2]}'} for r in _rows(0, 40)]
    rows[0]["allowed"] = None
    assert _import(tmp_path, _traffic(tmp_path, rows), "--reference-column", "allowed",
                   "--reference-column", "facts") == 0
    df = load_dataset(tmp_path / "datasets" / "label.jsonl", declared_inputs=["text"])
    assert df["reference"].tolist()[:2] == [{"allowed": None, "facts": {"k": [1, 2]}},
                                            {"allowed": ["a", "b"], "facts": {"k": [1, 2]}}]
    split = df["split"][1]
    assert {"id": "r1", "split": split, "inputs": {"text": "message 1"}, "expected": "l1",
            "reference": {"allowed": ["a", "b"], "facts": {"k": [1, 2]}}} in records(df, split)


def test_a_record_may_carry_any_json_reference(tmp_path):
    path = _write(tmp_path, [json.dumps({"id": "a", "split": "dev", "inputs": {"q": "x"}, "reference": [1, "two"]}),
                             json.dumps({"id": "b", "split": "dev", "inputs": {"q": "x"}, "reference": "facts"})])
    assert load_dataset(path, declared_inputs=["q"])["reference"].tolist() == [[1, "two"], "facts"]


# --- concurrent imports, killed imports, private files ------------------------------------

_APPEND_TRIALS = r'''
import json, os, sys
from pathlib import Path
from promptdistill.cli import main
import promptdistill.specs.importer  # noqa: F401 - imported once here, not in every child

root, trials = Path(sys.argv[1]), int(sys.argv[2])
spec = str(root / "prompts" / "label.yaml")
for t in range(trials):
    go_r, go_w = os.pipe()
    children = []
    for side in (0, 1):
        pid = os.fork()
        if pid == 0:  # a CLI process of its own, started at the same moment as the other
            os.close(go_w)
            os.read(go_r, 1)
            out = os.open(str(root / f"out-{t}-{side}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os._exit(main(["datasets", "import", str(root / f"traffic-{side}.jsonl"), "--spec", spec,
                           "--map", "text=msg", "--id-column", "rid", "--expected-column", "label",
                           "--out", str(root / "datasets" / f"trial-{t}.jsonl"), "--append"]))
        children.append(pid)
    os.close(go_r)
    os.write(go_w, b"go")
    os.close(go_w)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    print(json.dumps(codes), flush=True)
'''


def _seed_trials(tmp_path: Path, trials: int) -> None:
    from promptdistill.specs.importer import split_of

    seed = [{"id": r["rid"], "split": split_of(r["rid"]), "inputs": {"text": r["msg"]}, "expected": r["label"]}
            for r in _rows(0, 20)]
    for t in range(trials):
        write_records(tmp_path / "datasets" / f"trial-{t}.jsonl", seed)
    _traffic(tmp_path, _rows(100, 125), "traffic-0.jsonl")
    _traffic(tmp_path, _rows(200, 225), "traffic-1.jsonl")


def _lost_rows(tmp_path: Path, trials: int) -> list[int]:
    from promptdistill.specs.datasets import read_records

    return [70 - len(read_records(tmp_path / "datasets" / f"trial-{t}.jsonl")) for t in range(trials)]


@pytest.mark.timeout(300)
def test_two_concurrent_appends_never_lose_rows(tmp_path):
    """Two CLI processes append 25 rows each to the same 20-record dataset at the same moment,
    50 times (forked from one that has imported the CLI, so a trial costs milliseconds)."""
    _project(tmp_path)
    _seed_trials(tmp_path, 50)
    run = subprocess.run([sys.executable, "-c", _APPEND_TRIALS, str(tmp_path), "50"], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)}, timeout=250)
    assert run.returncode == 0, run.stderr
    assert [json.loads(line) for line in run.stdout.splitlines()] == [[0, 0]] * 50, (run.stdout, run.stderr)
    assert _lost_rows(tmp_path, 50) == [0] * 50
    assert all("25 of 25 rows imported" in (tmp_path / f"out-{t}-{s}.txt").read_text()
               for t in range(50) for s in (0, 1))
    assert sorted(p.name for p in (tmp_path / "datasets").iterdir() if p.name.startswith(".")) == []


@pytest.mark.timeout(600)
def test_two_appends_started_from_the_command_line_lose_no_rows(tmp_path):
    import os

    _project(tmp_path)
    _seed_trials(tmp_path, 2)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for t in range(2):
        procs = [subprocess.Popen([sys.executable, "-m", "promptdistill", "datasets", "import",
                                   str(tmp_path / f"traffic-{side}.jsonl"), "--spec",
                                   str(tmp_path / "prompts" / "label.yaml"), "--map", "text=msg", "--id-column", "rid",
                                   "--expected-column", "label", "--out", str(tmp_path / "datasets" / f"trial-{t}.jsonl"),
                                   "--append"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for side in (0, 1)]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0 and "25 of 25 rows imported" in out, err
    assert _lost_rows(tmp_path, 2) == [0, 0]


def test_an_import_waits_for_another_then_fails_naming_the_dataset(tmp_path, capsys):
    import fcntl
    import time

    _project(tmp_path)
    dataset = _seed(tmp_path)
    before = dataset.read_bytes()
    lock = dataset.with_name(".label.jsonl.lock")
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        start = time.monotonic()
        assert _import(tmp_path, _traffic(tmp_path, _rows(40, 45)), "--append", "--wait", "1") == 2
        assert 0.9 < time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert f"waiting for another import of {dataset}" in err
    assert (f"{dataset}: another import of it has not finished after 1 s (lock {lock}); nothing was written; "
            "run again when it ends, or wait longer (--wait)") in err
    assert dataset.read_bytes() == before


def test_a_killed_imports_temporary_file_is_removed_by_the_next_import(tmp_path):
    _project(tmp_path)
    dataset = _seed(tmp_path)
    stale = [dataset.with_name(".label.jsonl.0123456789ab.tmp"), dataset.with_name(".label.jsonl.bak.ba9876543210.tmp")]
    for path in stale:
        path.write_bytes(b"x" * 100_000)
    other = dataset.with_name(".other.jsonl.0123456789ab.tmp")  # another dataset's: not ours to remove
    other.write_bytes(b"y")
    assert _import(tmp_path, _traffic(tmp_path, _rows(40, 45)), "--append") == 0
    assert not any(p.exists() for p in stale) and other.exists()


def test_a_private_dataset_stays_private_and_so_does_its_backup(tmp_path):
    _project(tmp_path)
    dataset = _seed(tmp_path)
    dataset.chmod(0o600)
    assert _import(tmp_path, _traffic(tmp_path, _rows(40, 45)), "--append") == 0
    assert _import(tmp_path, _traffic(tmp_path, _rows(50, 90))) == 0
    assert oct(dataset.stat().st_mode & 0o777) == "0o600"
    assert oct(dataset.with_name("label.jsonl.bak").stat().st_mode & 0o777) == "0o600"


def test_a_lone_surrogate_in_an_import_line_is_named_by_line_and_column(tmp_path, capsys):
    _project(tmp_path)
    dataset = _seed(tmp_path)
    before = dataset.read_bytes()
    rows = _traffic(tmp_path, [*_rows(40, 42), '{"rid": "r9", "msg": "half \\ud800 a pair", "label": "a"}',
                               '{"rid": "r8", "msg": "a whole pair \\ud83d\\ude00", "label": "a"}'])
    assert _import(tmp_path, rows, "--append") == 2
    err = capsys.readouterr().err
    assert f"{rows}:3: column 'msg': holds a lone surrogate" in err and "Traceback" not in err
    assert dataset.read_bytes() == before
    from promptdistill.cli import main  # without --id-column the id is a hash of the inputs

    assert main(["datasets", "import", str(rows), "--spec", str(tmp_path / "prompts" / "label.yaml"),
                 "--map", "text=msg", "--append"]) == 2
    assert f"{rows}:3: column 'msg': holds a lone surrogate" in capsys.readouterr().err
    assert dataset.read_bytes() == before


def test_a_lone_surrogate_in_a_dataset_line_is_an_error_on_that_line(tmp_path):
    path = _write(tmp_path, [_rec("a"), json.dumps({"id": "b", "split": "dev", "inputs": {"q": "x\ud800"}})])
    with pytest.raises(SpecError, match=r"d.jsonl:2: malformed JSON: holds a lone surrogate"):
        load_dataset(path)


def test_import_out_naming_a_folder_is_an_error_naming_it(tmp_path, capsys):
    _project(tmp_path)
    folder = tmp_path / "datasets" / "here"
    folder.mkdir(parents=True)
    assert _import(tmp_path, _traffic(tmp_path, _rows(0, 40)), "--out", str(folder)) == 2
    err = capsys.readouterr().err
    assert f"SpecError: {folder}: is a folder; name the dataset file to write" in err
    assert list(folder.iterdir()) == [] and sorted(p.name for p in folder.parent.iterdir()) == ["here"]

"""Judge definitions and the judge runner: loading, validation, repair, swap, stats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fakes import FakeEngine
from promptdistill.core.errors import SpecError
from promptdistill.judges.runner import JudgeRunner
from promptdistill.judges.definitions import BUILTIN_DIR, list_judges, load_judge

REQUIRED = ["answer_equivalence", "clause_necessity", "distill_rewrite", "rubric_score"]

NECESSITY_ITEM = {"task": "Classify tickets.", "instruction": ">>>Be kind.<<< Answer with a label.",
                  "clause": "Be kind.", "examples": "Input: card charged twice\nExpected: billing"}


def test_every_required_judge_loads_and_validates():
    assert set(REQUIRED) <= set(list_judges())
    for name in REQUIRED:
        judge = load_judge(name)
        assert judge.name == name and judge.version >= 1
        assert judge.output_schema["type"] == "object"
        assert judge.kind == ("generator" if name == "distill_rewrite" else "judge")


def _write(tmp_path: Path, name: str, **changes) -> Path:
    data = yaml.safe_load((BUILTIN_DIR / "rubric_score.yaml").read_text())
    data["name"] = name
    data.update(changes)
    for key, value in list(data.items()):
        if value is None:
            del data[key]
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"version": 0}, "version"),
        ({"user": "Task: {task} {nope}"}, "user"),
        ({"instruction": "Reply {like this}"}, "instruction"),
        ({"output_schema": {"type": "object", "properties": {"s": {"type": "nonsense"}}}}, "output_schema"),
        ({"output_schema": {"type": "string"}}, "output_schema"),
        ({"inputs": [{"name": "task", "max_chars": 2}]}, "inputs[0].max_chars"),
        ({"kind": "oracle"}, "kind"),
        ({"extra_key": 1}, "extra_key"),
        ({"max_tokens": None, "user": None}, "user"),
    ],
)
def test_bad_definitions_name_the_file_and_field(tmp_path, changes, field):
    _write(tmp_path, "broken", **changes)
    with pytest.raises(SpecError) as err:
        load_judge("broken", tmp_path)
    assert str(tmp_path / "broken.yaml") in str(err.value)
    assert field in str(err.value)


def test_unknown_judge_lists_the_known_ones(tmp_path):
    _write(tmp_path, "mine")
    with pytest.raises(SpecError, match=r"missing.yaml: no such judge definition \(known: .*mine"):
        load_judge("missing", tmp_path)


def test_a_project_judge_overrides_the_built_in_of_the_same_name(tmp_path):
    assert load_judge("rubric_score", tmp_path).source == str(BUILTIN_DIR / "rubric_score.yaml")
    _write(tmp_path, "rubric_score", version=7)
    mine = load_judge("rubric_score", tmp_path)
    assert mine.version == 7 and mine.source == str(tmp_path / "rubric_score.yaml")
    assert "answer_equivalence" in list_judges(tmp_path)  # the other built-ins are still there


def test_built_in_judges_load_from_any_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no judges/ here: the package's own definitions answer
    assert load_judge("answer_equivalence").source.startswith(str(BUILTIN_DIR))


def test_name_must_match_the_file(tmp_path):
    data = yaml.safe_load((BUILTIN_DIR / "rubric_score.yaml").read_text())
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="other.yaml: name"):
        load_judge("other", tmp_path)


def test_messages_cut_long_values_and_keep_literal_braces():
    judge = load_judge("clause_necessity")
    limit = {i.name: i.max_chars for i in judge.inputs}["clause"]
    messages = judge.messages({**NECESSITY_ITEM, "clause": "{x} " + "y" * 5000})
    user = messages[-1]["content"]
    assert "{x} " in user and "y" * (limit + 1) not in user and "[...]" in user
    with pytest.raises(SpecError, match="needs input 'examples'"):
        judge.messages({k: v for k, v in NECESSITY_ITEM.items() if k != "examples"})


# --- the runner (fake engine: pure logic) ------------------------------------------------


def scripted(*replies):
    """A reply function answering ``replies`` in turn (the last one repeats)."""
    queue = list(replies)
    return lambda req: queue.pop(0) if len(queue) > 1 else queue[0]


def test_valid_replies_are_parsed_and_counted():
    fake = FakeEngine(lambda r: json.dumps({"score": 4, "reason": "needed"}))
    runner = JudgeRunner(fake)
    verdicts = runner.run("clause_necessity", [NECESSITY_ITEM] * 3)
    assert [v.value["score"] for v in verdicts] == [4, 4, 4]
    assert fake.batches == [3]
    s = runner.stats["clause_necessity"]
    assert (s.items, s.calls, s.valid, s.repairs, s.valid_share) == (3, 3, 3, 0, 1.0)
    assert s.prompt_tokens > 0 and len(runner.records) == 3


def test_an_invalid_reply_is_repaired_once_then_valid():
    fake = FakeEngine(scripted('{"score": 9, "reason": "x"}', json.dumps({"score": 2, "reason": "ok"})))
    runner = JudgeRunner(fake)
    [verdict] = runner.run("clause_necessity", [NECESSITY_ITEM])
    assert verdict.valid and verdict.value["score"] == 2 and verdict.attempts == 2
    s = runner.stats["clause_necessity"]
    assert (s.calls, s.repairs, s.repaired) == (2, 1, 1)


def test_twice_invalid_is_recorded_invalid_never_defaulted():
    seen = []

    def reply(req):
        seen.append(req)
        return "not json at all"

    runner = JudgeRunner(FakeEngine(reply))
    [verdict] = runner.run("clause_necessity", [NECESSITY_ITEM])
    assert not verdict.valid and verdict.value is None and "not valid JSON" in verdict.error
    assert verdict.attempts == 2 and len(seen) == 2
    repair = seen[1]
    assert repair.max_tokens == 2 * seen[0].max_tokens
    assert "invalid" in repair.chat()[-1]["content"] and repair.chat()[-2]["role"] == "assistant"
    s = runner.stats["clause_necessity"]
    assert (s.valid, s.invalid, s.valid_share) == (0, 1, 0.0)
    assert runner.records[0]["valid"] is False and runner.records[0]["error"]


def test_an_extra_check_triggers_the_repair():
    fake = FakeEngine(scripted('{"instruction": "Use {x}."}', '{"instruction": "Be brief."}'))
    runner = JudgeRunner(fake)
    check = lambda v: "no braces" if "{" in v["instruction"] else None  # noqa: E731
    items = [{"task": "t", "clauses": "- a", "target_words": "5"}]
    [verdict] = runner.run("distill_rewrite", items, check=check)
    assert verdict.valid and verdict.value["instruction"] == "Be brief." and verdict.attempts == 2


def test_a_prompt_too_long_is_invalid_without_a_call():
    fake = FakeEngine(lambda r: json.dumps({"score": 3}))
    fake.identity = type(fake.identity)(**{**fake.identity.to_dict(), "max_model_len": 40})
    runner = JudgeRunner(fake)
    [verdict] = runner.run("rubric_score", [{"task": "t " * 50, "rubric": "r", "input": "i", "reference": "x", "answer": "y"}])
    assert not verdict.valid and "too long" in verdict.error and verdict.attempts == 0
    assert fake.calls == 0 and runner.stats["rubric_score"].too_long == 1


def _equivalence_engine(rule):
    """A fake judge: ``rule(answer_a, answer_b) -> 'A'|'B'|'same'``."""

    def reply(req):
        text = req.chat()[-1]["content"]
        a = text.split("Answer A:\n", 1)[1].split("\n\nAnswer B:", 1)[0]
        b = text.split("Answer B:\n", 1)[1].split("\n\nWhich", 1)[0]
        return json.dumps({"verdict": rule(a, b)})

    return FakeEngine(reply)


def test_compare_is_consistent_when_the_judge_ignores_position():
    rank = {"good": 2, "ok": 1, "bad": 0}
    fake = _equivalence_engine(lambda a, b: "A" if rank[a] > rank[b] else "B" if rank[b] > rank[a] else "same")
    runner = JudgeRunner(fake)
    out = runner.compare("t", [("q", "ok", "good"), ("q", "ok", "bad"), ("q", "ok", "ok")])
    assert [c.verdict for c in out] == ["better", "worse", "same"]
    assert [c.score for c in out] == [1.0, 0.0, 0.5]
    assert all(c.consistent for c in out)
    assert fake.batches == [6]  # both orders in one batch
    assert runner.stats["answer_equivalence"].swap_consistency == 1.0


def test_a_verdict_that_flips_with_the_order_counts_as_a_tie():
    runner = JudgeRunner(_equivalence_engine(lambda a, b: "A"))  # always prefers the first answer
    out = runner.compare("t", [("q", "ref", "cand"), ("q", "ref2", "cand2")])
    assert [c.verdict for c in out] == ["same", "same"]
    assert [c.consistent for c in out] == [False, False]
    assert runner.stats["answer_equivalence"].swap_consistency == 0.0


def test_an_invalid_order_makes_the_comparison_invalid():
    calls = []

    def reply(req):
        calls.append(1)
        return json.dumps({"verdict": "same"}) if len(calls) == 1 else "garbage"

    runner = JudgeRunner(FakeEngine(reply))
    [c] = runner.compare("t", [("q", "a", "b")])
    assert c.verdict is None and c.score is None and c.consistent is None
    assert runner.stats["answer_equivalence"].pairs == 0


# --- the real engine ---------------------------------------------------------------------


@pytest.mark.engine
def test_every_judge_reply_on_the_real_engine_is_valid_or_recorded_invalid(engine):
    runner = JudgeRunner(engine, seed=0)
    necessity = runner.run("clause_necessity", [NECESSITY_ITEM, {**NECESSITY_ITEM, "clause": "Answer with a label."}])
    rubric = runner.run("rubric_score", [{
        "task": "Summarise in one sentence.", "rubric": "States the decision.", "input": "We chose Berlin for the offsite.",
        "reference": "The team chose Berlin.", "answer": "Berlin was chosen for the offsite."}])
    rewrite = runner.run("distill_rewrite", [{
        "task": "Classify tickets.", "clauses": "- You are a very friendly assistant.\n- NECESSARY: Pick billing or technical.",
        "target_words": "8"}], max_tokens=32)
    comparisons = runner.compare("Answer with a number.", [("What is 2+3?", "5", "5"), ("What is 2+3?", "5", "9")])
    for verdict in necessity + rubric + rewrite:
        if verdict.valid:
            assert verdict.error is None and verdict.value is not None
        else:
            assert verdict.value is None and verdict.error
    for v in necessity:
        assert not v.valid or v.value["score"] in range(1, 6)
    for c in comparisons:
        assert c.verdict in ("better", "same", "worse", None)
    rows = {r["judge"]: r for r in runner.stats_rows()}
    assert set(rows) == set(REQUIRED)
    for row in rows.values():
        assert row["valid"] + row["invalid"] == row["items"]
        assert row["items"] <= row["calls"] <= 2 * row["items"]
        assert row["completion_tokens"] > 0
    assert rows["answer_equivalence"]["pairs"] <= 2
    assert len(runner.records) == sum(r["items"] for r in rows.values())

"""The summarize spec's metric (prompts/summarize_metric.py): facts kept, and the digest's shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from promptdistill.specs import MetricSpec
from promptdistill.specs.datasets import load_dataset, records
from promptdistill.specs.metrics import parse_reply, score_reply
from promptdistill.specs.prompt import build_system, examples_for
from tests.bundled_specs import load_spec

ROOT = Path(__file__).resolve().parent.parent

NOTES = (
    "Notes from the Friday meeting of the mobile team. After some discussion the team agreed to postpone the dark "
    "mode feature to next quarter. There was some small talk about the office coffee machine. Jonas said the holiday "
    "rota is finished and goes live on Thursday. Kofi reported that the payment provider raised its fees by 2 percent. "
    "Everyone was present except Fatima, who is on holiday. Action items: Sofia will call the two affected customers "
    "by Thursday; Kofi will draft the job advert by Friday."
)
FACTS = {
    "status": {"owner": "Jonas", "thing": "holiday rota", "day": "Thursday"},
    "problem": {"owner": "Kofi", "text": "the payment provider raised its fees by 2 percent"},
    "decision": "postpone the dark mode feature to next quarter",
    "actions": [{"owner": "Sofia", "task": "call the two affected customers", "deadline": "Thursday"},
                {"owner": "Kofi", "task": "draft the job advert", "deadline": "Friday"}],
    "small_talk": ["There was some small talk about the office coffee machine.",
                   "Everyone was present except Fatima, who is on holiday."],
}
EXPECTED = {"summary": "x", "key_points": ["x", "y"], "confidence_score": 0.9, "facts": FACTS}
PERFECT = {
    "summary": "The holiday rota goes live on Thursday; the payment provider raised its fees by 2 percent, and the "
               "team postponed the dark mode feature to next quarter.",
    "key_points": ["Holiday rota live on Thursday (Jonas).", "Payment provider fees up 2 percent (Kofi).",
                   "Dark mode feature postponed to next quarter.", "Sofia calls the two affected customers by Thursday.",
                   "Kofi drafts the job advert by Friday."],
    "confidence_score": 0.8,
}


@pytest.fixture(scope="module")
def metric() -> MetricSpec:
    return load_spec("summarize").metric


def _score(metric: MetricSpec, reply, expected=EXPECTED) -> float | None:
    text = reply if isinstance(reply, str) else json.dumps(reply)
    return score_reply(metric, text, expected, inputs={"notes": NOTES}, record_id="t")


def _with(**changes) -> dict:
    return {**PERFECT, **changes}


def test_the_spec_scores_with_the_bundled_python_metric(metric):
    assert (metric.kind, metric.function) == ("python", "prompts.summarize_metric:score")


def test_a_faithful_complete_digest_scores_1_and_case_and_inflection_do_not_matter(metric):
    assert _score(metric, PERFECT) == 1.0
    shouted = _with(summary=PERFECT["summary"].upper(), key_points=[p.upper() for p in PERFECT["key_points"]])
    assert _score(metric, shouted) == 1.0


def test_each_missing_fact_costs_its_share(metric):
    points = PERFECT["key_points"]
    no_decision = _score(metric, _with(
        summary="The holiday rota goes live on Thursday and the payment provider raised its fees by 2 percent.",
        key_points=[points[0], points[1], points[3], points[4]]))
    assert no_decision == pytest.approx(0.8)  # one of five facts gone, the shape still right
    # Kofi's action gone: his name in the problem's key point is a third of it (owner, not task or deadline).
    assert _score(metric, _with(key_points=points[:4])) == pytest.approx((4 + 1 / 3) / 5)
    only_status = _score(metric, _with(summary="The holiday rota goes live on Thursday.",
                                       key_points=["Holiday rota live.", "It is on Thursday."]))
    assert only_status == pytest.approx((1 + 1 / 3) / 5)  # and Sofia's deadline, Thursday


def test_an_action_needs_its_owner_and_deadline_in_the_same_statement(metric):
    points = PERFECT["key_points"]
    swapped = _with(key_points=points[:3] + ["Sofia calls the two affected customers by Friday.",
                                             "Kofi drafts the job advert by Thursday."])
    unnamed = _with(key_points=points[:3] + ["Call the two affected customers.", "Draft the job advert."])
    assert _score(metric, unnamed) < _score(metric, swapped) < 1.0
    assert _score(metric, unnamed) == pytest.approx((3 + 2 / 3) / 5)  # task words only: a third of each action


@pytest.mark.parametrize(
    "reply, score",
    [
        ({"summary": "The marketing team launched the spring catalogue on Monday.",
          "key_points": ["Catalogue launched.", "Anna will book the venue by Tuesday."], "confidence_score": 0.9}, 0.0),
        ("", 0.0),
        ("{}", 0.0),
        ({"summary": "", "key_points": [], "confidence_score": 0.0}, 0.0),
        (None, 0.0),
    ],
)
def test_an_invented_or_empty_reply_scores_0(metric, reply, score):
    text = reply if reply is None or isinstance(reply, str) else json.dumps(reply)
    assert score_reply(metric, text, EXPECTED, inputs={"notes": NOTES}) == score


def test_form_scales_coverage_sentences_key_points_and_small_talk(metric):
    four_sentences = _with(summary="The holiday rota goes live on Thursday. The payment provider raised its fees by 2 "
                                   "percent. Dark mode is postponed to next quarter. That is all.")
    points = PERFECT["key_points"]
    repeated = _with(key_points=[points[0], points[0].upper(), points[1], points[2], f"{points[3]} {points[4]}"])
    small_talk = _with(key_points=[*points[:3], f"{points[3]} {points[4]}", "Small talk about the office coffee machine."])
    one = _with(key_points=[" ".join(PERFECT["key_points"])])
    assert _score(metric, four_sentences) == pytest.approx(1 - 0.3 / 4)
    assert _score(metric, one) == pytest.approx(1 - 0.3 / 4)  # 1 key point: the list fails, the facts are all there
    assert _score(metric, repeated) == pytest.approx(1 - 0.3 * 0.2 / 4)  # 4 distinct of 5
    assert _score(metric, small_talk) == pytest.approx(1 - 0.3 * 0.5 / 4)  # 1 of 2 small-talk sentences retold
    # The facts as plain text, not the JSON asked for: coverage with no form credit.
    plain = " ".join([PERFECT["summary"], *PERFECT["key_points"]])
    assert _score(metric, plain) == pytest.approx(0.7)


def test_a_reply_that_parses_from_prose_around_json_is_scored_on_its_json(metric):
    assert _score(metric, "Here you go: " + json.dumps(PERFECT) + " Thanks!") == 1.0


def test_label_free_records_are_scored_on_the_reference_key_points(metric):
    reference = {"summary": "s", "key_points": PERFECT["key_points"], "confidence_score": 0.7}  # the baseline's reply
    assert _score(metric, PERFECT, reference) == 1.0
    partial = _with(summary="The holiday rota goes live on Thursday.", key_points=PERFECT["key_points"][:2])
    assert 0.3 < _score(metric, partial, reference) < 0.6
    assert _score(metric, PERFECT, {"summary": "no key points"}) is None  # nothing to compare: unscored


def _bundled() -> list[dict]:
    df = load_dataset(ROOT / "datasets" / "summarize.jsonl")
    return [r for split in ("train", "dev", "test") for r in records(df, split)]


def test_every_bundled_reference_reply_scores_1(metric):
    recs = _bundled()
    assert len(recs) >= 700
    for r in recs:
        reply = json.dumps({k: v for k, v in r["expected"].items() if k != "facts"})
        assert score_reply(metric, reply, r["expected"], inputs=r["inputs"], record_id=r["id"]) >= 0.99, r["id"]


def test_bundled_facts_are_written_in_the_notes():
    for r in _bundled():
        notes, facts = r["inputs"]["notes"], r["expected"]["facts"]
        s = facts["status"]
        assert f"{s['owner']} said the {s['thing']} is finished and goes live on {s['day']}." in notes
        assert f"{facts['problem']['owner']} reported that {facts['problem']['text']}." in notes
        assert f"agreed to {facts['decision']}." in notes
        assert all(f"{a['owner']} will {a['task']} by {a['deadline']}" in notes for a in facts["actions"])
        assert facts["small_talk"] and all(t in notes for t in facts["small_talk"])


def test_the_facts_never_reach_the_prompt():
    spec = load_spec("summarize")
    shown = examples_for(spec)
    assert shown and "facts" in shown[0]["expected"]
    system = build_system(spec, shown)
    without = {k: v for k, v in shown[0]["expected"].items() if k != "facts"}
    assert json.dumps(without, ensure_ascii=False) in system
    assert '"facts"' not in system and shown[0]["expected"]["facts"]["decision"] in shown[0]["inputs"]["notes"]


def test_the_commented_judge_rubric_alternative_is_a_valid_metric():
    text = (ROOT / "prompts" / "summarize.yaml").read_text(encoding="utf-8")
    block = re.search(r"^# metric:\n(?:#  .*\n)+", text, re.M).group(0)
    alternative = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))["metric"]
    spec = load_spec("summarize").with_changes(metric=MetricSpec(**alternative))
    assert spec.metric.kind == "judge_rubric" and "owner and deadline" in spec.metric.rubric
    assert score_reply(spec.metric, json.dumps(PERFECT), EXPECTED) is None  # left to the judge


def test_parsed_reply_is_what_the_metric_reads(metric):
    # A key point list of non-strings is not the digest asked for: no form credit, facts still counted.
    odd = json.dumps({"summary": PERFECT["summary"], "key_points": PERFECT["key_points"] + [3]})
    assert parse_reply(odd)["key_points"][-1] == 3
    assert _score(metric, odd) == pytest.approx(0.7)


def test_each_name_or_day_absent_from_the_notes_costs_a_tenth(metric):
    copied = _with(key_points=[*PERFECT["key_points"][:4], "Kofi drafts the job advert by Friday with Marco on Monday."])
    assert _score(metric, copied) == pytest.approx(0.9 ** 2)  # Marco, Monday
    labelled = _with(key_points=["Problem: " + PERFECT["key_points"][1], "Decision: " + PERFECT["key_points"][2],
                                 *PERFECT["key_points"][3:], PERFECT["key_points"][0]])
    assert _score(metric, labelled) == 1.0  # label words are not invented facts

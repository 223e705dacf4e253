"""Clause splitting, protection and rebuilding (pure logic, no engine)."""

from __future__ import annotations

import pytest
from bundled_specs import load_spec
from hypothesis import given, settings
from hypothesis import strategies as st

from promptdistill.specs.clauses import (
    Clause,
    apply_clauses,
    join_clauses,
    mark_clause,
    protection_reason,
    split_clauses,
    split_text_clauses,
)

SPEC_NAMES = ["ticket_triage", "word_problems", "format_rules", "summarize", "invoice_extraction"]


def texts(text):
    return [c.text for c in split_text_clauses(text)]


def test_sentences_are_cut_at_sentence_ends():
    assert texts("Be kind. Answer in JSON! Why? Because.") == ["Be kind.", "Answer in JSON!", "Why?", "Because."]


def test_abbreviations_urls_and_numbers_do_not_end_a_sentence():
    text = "Use a unit, e.g. Meters or Feet. Visit shop.example/products for 3.5 ideas. Done."
    assert texts(text) == ["Use a unit, e.g. Meters or Feet.", "Visit shop.example/products for 3.5 ideas.", "Done."]


def test_bullets_and_numbered_rules_are_clauses_of_their_own():
    text = "Rules:\n- Be short\n- Be kind.\n1. First rule\n2) Second rule"
    parts = split_text_clauses(text)
    assert [c.text for c in parts] == ["Rules:", "Be short", "Be kind.", "First rule", "Second rule"]
    assert parts[1].sep == "\n- " and parts[4].sep == "\n2) "


def test_braces_and_quotes_are_never_cut():
    text = 'Reply with {"a": "x. Y"} only. Say "Stop. Now" twice. End.'
    assert texts(text) == ['Reply with {"a": "x. Y"} only.', 'Say "Stop. Now" twice.', "End."]


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_split_is_lossless_on_every_spec(name):
    spec = load_spec(name)
    clauses = split_clauses(spec)
    instruction = [c for c in clauses if c.source == "instruction"]
    assert join_clauses(instruction) == spec.instruction.strip()
    assert [c.text for c in clauses if c.source == "constraint"] == [c.strip() for c in spec.constraints]
    assert len({c.id for c in clauses}) == len(clauses)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["Alpha beta.", "Gamma!", "- item one", "\n", " ", "Delta {x. y} z.", "e.g. Foo."]), max_size=12))
def test_split_is_lossless_on_any_text(parts):
    text = "".join(parts).strip()
    clauses = split_text_clauses(text)
    assert join_clauses(clauses) == text
    assert "".join(c.sep + c.text for c in clauses) == text
    assert all(c.text == c.text.strip() and c.text for c in clauses)


def test_the_cutter_is_the_light_shared_one_and_its_separators_keep_everything():
    from promptdistill.specs import clauses as shared

    assert split_text_clauses is shared.split_text_clauses and Clause is shared.Clause
    text = "  Intro, e.g. Foo. Next!\n\nRules:\n- a\n2) b {x. Y} c.  \n"
    parts = shared.split_text_clauses(text)
    assert [c.text for c in parts] == ["Intro, e.g. Foo.", "Next!", "Rules:", "a", "b {x. Y} c."]
    assert [c.sep for c in parts] == ["  ", " ", "\n\n", "\n- ", "\n2) "]
    assert "".join(c.sep + c.text for c in parts) == text.rstrip()  # trailing whitespace aside


def test_protection_rules():
    schema = {"type": "object", "properties": {"label": {"enum": ["billing", "technical"]}, "due_date": {"type": "string"}}}
    assert protection_reason("Reply with {x}.") is not None
    assert "format" in protection_reason("Reply with a JSON object.")
    assert "allowed output values" in protection_reason("Choose billing or technical.", schema)
    assert protection_reason("Choose billing when unsure.", schema) is None  # one value is not a list
    assert "label" in protection_reason("The label must be lowercase.", schema)
    assert "due_date" in protection_reason("Write due_date as YYYY-MM-DD.", schema)
    assert protection_reason("Please read the whole ticket carefully.", schema) is None


def test_specs_protect_their_output_rules():
    triage = {c.text: c for c in split_clauses(load_spec("ticket_triage"))}
    json_rule = next(t for t in triage if t.startswith("Reply only with a JSON object"))
    assert triage[json_rule].protected
    assert not triage[next(t for t in triage if t.startswith("Once again"))].protected
    slug = split_clauses(load_spec("format_rules"))
    assert [c.protected for c in slug if c.source == "constraint"][-1]


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_apply_clauses_keeps_protected_clauses_whatever_is_asked(name):
    spec = load_spec(name)
    clauses = split_clauses(spec)
    pruned = apply_clauses(spec, [], all_clauses=clauses)
    text = pruned.instruction_text()
    for c in clauses:
        if c.protected:
            assert c.text in text
    assert pruned.instruction.strip()
    assert len(text) < len(spec.instruction_text())
    assert spec == load_spec(name)  # the input spec is untouched


def test_apply_clauses_drops_exactly_the_unkept_clauses():
    spec = load_spec("ticket_triage")
    clauses = split_clauses(spec)
    drop = next(c for c in clauses if not c.protected and c.source == "constraint")
    smaller = apply_clauses(spec, [c.id for c in clauses if c.id != drop.id], all_clauses=clauses)
    assert drop.text not in smaller.instruction_text()
    assert len(smaller.constraints) == len(spec.constraints) - 1
    assert smaller.instruction == spec.instruction.strip()


def test_dropping_keeps_line_breaks_and_bullet_markers():
    clauses = split_text_clauses("Intro one. Intro two.\nNext para.\n- a\n- b\n- c")
    ids = {c.text: c.id for c in clauses}
    assert join_clauses(clauses, [ids["Intro one."], ids["Next para."]]) == "Intro one.\nNext para."
    assert join_clauses(clauses, [ids["Intro two."], ids["Next para."]]) == "Intro two.\nNext para."
    assert join_clauses(clauses, [ids["Next para."], ids["a"], ids["c"]]) == "Next para.\n- a\n- c"


def test_mark_clause_marks_exactly_one_clause():
    spec = load_spec("word_problems")
    clauses = split_clauses(spec)
    marked = mark_clause(spec, clauses[2], clauses=clauses)
    assert marked.count(">>>") == 1 and f">>>{clauses[2].text}<<<" in marked
    assert "Rules:" in marked

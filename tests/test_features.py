"""Prompt features: exact on hand-checked cases, consistent with the served tokenizer."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from promptdistill.cli import main
from promptdistill.specs.datasets import dataset_for, records
from promptdistill.specs.checks import layout_warnings
from promptdistill.specs.load import load_spec
from promptdistill.specs.model import ExamplesConfig, Spec
from promptdistill.specs.prompt import examples_for, spec_messages
from promptdistill.specs.text import count_clauses, semantic_density
from promptdistill.ttft.features import (
    FEATURE_KEYS,
    cl100k_tokens,
    features_from_messages,
    prompt_features,
    token_entropy_bits,
)

ROOT = Path(__file__).resolve().parents[1]


class CharTokenizer:
    """One token per character, with a visible chat template: every count is checkable by hand."""

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(self, messages) -> str:
        return "".join(f"<{m['role']}>{m['content']}</>" for m in messages) + "<assistant>"


def _spec(**changes) -> Spec:
    base = dict(
        name="t", description="d", dataset="datasets/t.jsonl", inputs=("ticket",),
        instruction="Label it.", user="T: {ticket}",
        examples=ExamplesConfig(count=1, format="{ticket}={expected}", header="Ex:"),
    )
    base.update(changes)
    return Spec(**base)


@pytest.mark.parametrize(
    "text, density",
    [
        ("Reply with the label.", 2 / 4),
        ("Please, please reply with the label.", 2 / 6),
        ('Use "YYYY-MM-DD" for 3 dates.', 4 / 5),  # use, <quoted>, <number>, dates / + for
        ("label label label", 1 / 3),  # restating adds tokens, not content
        ("Don't add text.", 2 / 3),  # don't is a stop word
        ("{ticket}", 1.0),
        ("the of and", 0.0),
        ("", 0.0),
    ],
)
def test_semantic_density_hand_checked(text, density):
    assert semantic_density(text) == pytest.approx(density)


def test_terse_rewrite_is_denser_than_the_verbose_original():
    spec = load_spec("ticket_triage", prompts_dir=ROOT / "prompts")
    terse = "Route the ticket to one team: billing, technical, account or shipping. Reply JSON {\"label\": team}."
    assert semantic_density(terse) > semantic_density(spec.instruction_text()) + 0.3


@pytest.mark.parametrize(
    "text, clauses",
    [
        ("", 0),
        ("Reply with JSON.", 1),
        ("Read the ticket. If it mentions a refund, label it billing.", 3),
        ("Answer with one label, and do not explain.", 2),
        ("Be brief because users read on phones.", 2),
        ("Labels:\n- billing\n- shipping", 0),
        ('Reply "yes. no. maybe" only.', 1),
        ("Use e.g. ISO dates; never guess.", 2),
        ("Totals like 3.50 stay whole! Ask why? Fine", 2),
    ],
)
def test_count_clauses_hand_checked(text, clauses):
    assert count_clauses(text) == clauses


@pytest.mark.parametrize(
    "ids, bits",
    [([], 0.0), ([7] * 5, 0.0), ([1, 1, 2, 2], 1.0), ([1, 2, 3, 4], 2.0), ([1, 1, 1, 2], -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))],
)
def test_token_entropy_bits(ids, bits):
    assert token_entropy_bits(ids) == pytest.approx(bits)


def test_cl100k_tokens_offline():
    assert cl100k_tokens("hello world") == 2
    assert cl100k_tokens("<|endoftext|>") > 1  # special-token text is counted as text, not refused
    assert os.environ.get("TIKTOKEN_CACHE_DIR")


def test_prompt_features_exact_with_a_character_tokenizer():
    spec, tok = _spec(), CharTokenizer()
    f = prompt_features(spec, {"ticket": "abc"}, tok)
    # "<system>Label it.</><user>T: abc</><assistant>": 8+9+3 + 6+6+3 + 11 characters
    assert f["total_tokens"] == 46
    assert f["static_prefix_tokens"] == len("<system>Label it.</><user>T: ") == 29
    assert f["suffix_tokens"] == 17
    assert (f["fewshot_count"], f["fewshot_tokens"]) == (0, 0)
    assert f["instruction_tokens"] == 9
    assert f["clause_count"] == 1 and f["semantic_density"] == 0.5  # label, it(stop)
    prompt = "<system>Label it.</><user>T: abc</><assistant>"
    assert f["entropy_bits"] == pytest.approx(token_entropy_bits([ord(c) for c in prompt]))
    assert f["cl100k_tokens"] == cl100k_tokens("Label it.") + cl100k_tokens("T: abc")

    examples = [{"id": "e", "inputs": {"ticket": "x"}, "expected": "y"}]
    g = prompt_features(spec, {"ticket": "abc"}, tok, examples=examples)
    # the system text grows by "\n\nEx:\n\nx=y" (10 characters), all of it static
    assert (g["fewshot_count"], g["fewshot_tokens"]) == (1, 10)
    assert (g["total_tokens"], g["static_prefix_tokens"], g["suffix_tokens"]) == (56, 39, 17)
    assert list(g) == list(FEATURE_KEYS)


def test_static_prefix_ends_at_the_first_input_even_after_literal_braces():
    spec = _spec(user="{{x}} then {ticket} and more")
    f = prompt_features(spec, {"ticket": "abc"}, CharTokenizer())
    assert f["static_prefix_tokens"] == len("<system>Label it.</><user>{x} then ")


def test_features_from_messages_defaults():
    tok = CharTokenizer()
    messages = [{"role": "system", "content": "Sys."}, {"role": "user", "content": "hello"}]
    f = features_from_messages(messages, tok)
    assert f["static_prefix_tokens"] == len("<system>Sys.</><user>")
    assert f["instruction_tokens"] == 4 and f["fewshot_count"] == 0
    assert features_from_messages(messages, tok, static_prefix_chars=3)["static_prefix_tokens"] == 3
    assert features_from_messages([{"role": "user", "content": "hi"}], tok)["static_prefix_tokens"] == len("<user>")


# --- with the served model's tokenizer ------------------------------------------------------


@pytest.mark.parametrize("name", ["ticket_triage", "invoice_extraction", "word_problems", "format_rules", "summarize"])
def test_features_with_the_served_tokenizer(tokenizer, name):
    spec = load_spec(name, prompts_dir=ROOT / "prompts")
    examples = examples_for(spec)
    dev = records(dataset_for(spec), "dev")[:3]
    feats = [prompt_features(spec, r["inputs"], tokenizer, examples=examples) for r in dev]
    ids = [tokenizer.tokenize(tokenizer.apply_chat_template(spec_messages(spec, r["inputs"], examples=examples))) for r in dev]
    for f, i, r in zip(feats, ids, dev):
        assert list(f) == list(FEATURE_KEYS)
        assert f["total_tokens"] == len(i) == tokenizer.count_tokens(spec_messages(spec, r["inputs"], examples=examples))
        assert f["static_prefix_tokens"] + f["suffix_tokens"] == f["total_tokens"]
        assert f["fewshot_count"] == spec.examples.count and f["fewshot_tokens"] > 0
        assert f["instruction_tokens"] == len(tokenizer.tokenize(spec.instruction_text()))
    # the static prefix is the same token ids for every request: what a prefix cache can serve
    static = feats[0]["static_prefix_tokens"]
    assert all(f["static_prefix_tokens"] == static for f in feats)
    assert ids[0][:static] == ids[1][:static] == ids[2][:static]
    # and it reaches the template's user lead-in: only the request's own text follows it
    bare = prompt_features(spec, dev[0]["inputs"], tokenizer)
    assert feats[0]["fewshot_tokens"] == feats[0]["total_tokens"] - bare["total_tokens"]
    assert feats[0]["static_prefix_tokens"] - bare["static_prefix_tokens"] == feats[0]["fewshot_tokens"]


def test_features_cli(tokenizer, model_dir, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["features", "ticket_triage", "--sample", "3", "--model", str(model_dir)]) == 0
    out = capsys.readouterr().out
    assert "semantic_density" in out and "tt-0101" in out and "mean" in out
    assert main(["features", "word_problems", "--sample", "2", "--model", str(model_dir), "--json", "--examples", "0"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == ["wp-0101", "wp-0102"] and all(r["fewshot_count"] == 0 for r in rows)


# --- layout ----------------------------------------------------------------------------------


def test_bundled_specs_have_a_clean_layout():
    for path in sorted((ROOT / "prompts").glob("*.yaml")):
        assert layout_warnings(load_spec(path)) == []


@pytest.mark.parametrize(
    "changes, warning",
    [
        (dict(user="{ticket}\n\nRemember to answer with exactly one of the labels above."), "template.user: 10 words of static text come after the first input {ticket}"),
        (dict(context="Prices are valid until 2024-05-01."), "template.system.context: holds a date ('2024-05-01')"),
        (dict(context="Today's date is in the header."), "holds a date (\"Today's date is\")"),
        (dict(context="Prices as of March 5, 2024 apply."), "holds a date ('March 5, 2024')"),
        (dict(instruction="Session 4f9c2a1e-7b3d-4c5e-9a8b-1234567890ab: label it."), "template.system.instruction: holds a UUID"),
        (dict(constraints=("This is request #1042 of the batch.",)), "template.system.constraints[0]: holds a counter ('#1042')"),
        (dict(constraints=("Generated at 09:41:07.",)), "holds a time of day ('09:41:07')"),
    ],
)
def test_layout_warnings(changes, warning):
    warnings = layout_warnings(_spec(**changes))
    assert any(warning in w for w in warnings), warnings
    assert all(w.startswith("<spec t>: ") for w in warnings)


def test_short_tail_after_the_input_is_fine():
    assert layout_warnings(_spec(user="Ticket: {ticket}\nAnswer:")) == []


# --- with the real engine ----------------------------------------------------------------------


@pytest.mark.engine
def test_static_prefix_matches_what_the_engine_serves_from_its_prefix_cache(engine):
    import uuid

    from promptdistill.engine import GenerationRequest

    spec = load_spec("ticket_triage", prompts_dir=ROOT / "prompts")
    # a unique instruction: nothing earlier in the session can have cached this prefix
    spec = spec.with_changes(instruction=f"[{uuid.uuid4().hex[:8]}] " + spec.instruction)
    examples = examples_for(spec)
    dev = [r for r in records(dataset_for(spec), "dev") if not r["inputs"]["ticket"].startswith("H")][:2]
    feats = [prompt_features(spec, r["inputs"], engine, examples=examples) for r in dev]
    requests = [GenerationRequest(messages=spec_messages(spec, r["inputs"], examples=examples), max_tokens=2) for r in dev]
    first = engine.generate(requests[:1])[0]
    second = engine.generate(requests[1:])[0]
    assert first.prompt_tokens == feats[0]["total_tokens"] and second.prompt_tokens == feats[1]["total_tokens"]
    # the cache serves whole blocks of the static prefix, never more than it
    assert 0 < second.cached_tokens <= feats[1]["static_prefix_tokens"]
    assert feats[1]["static_prefix_tokens"] - second.cached_tokens < 256


@pytest.mark.engine
@pytest.mark.parametrize("name", ["ticket_triage", "invoice_extraction"])
def test_bundled_tasks_score_above_zero_on_the_embedded_model(engine, name):
    from promptdistill.engine import GenerationRequest
    from promptdistill.specs.metrics import score_reply

    spec = load_spec(name, prompts_dir=ROOT / "prompts")
    examples = examples_for(spec)
    dev = records(dataset_for(spec), "dev")[:6]
    results = engine.generate([
        GenerationRequest(
            messages=spec_messages(spec, r["inputs"], examples=examples),
            max_tokens=spec.max_tokens,
            json_schema=spec.output_schema,
            timeout_s=900,  # a shared 2-core machine can be slow; this is not a timing test
        )
        for r in dev
    ])
    # constrained decoding: replies are valid JSON unless a tiny model runs out of tokens
    assert sum(bool(r.valid) for r in results) >= len(results) - 1, [r.error for r in results]
    scores = [score_reply(spec.metric, res.text, r["expected"], output_schema=spec.output_schema) for res, r in zip(results, dev)]
    assert sum(scores) / len(scores) > 0.15, scores

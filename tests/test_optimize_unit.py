"""Pure logic of the optimizer: bootstrap, Pareto front, token budget, the selection rule
(expected TTFT with a measured, configured or assumed warm share; the TTFT model's error
as the resolution), example strategies, instruction variants, budget validation. The
last tests run the whole ``optimize`` on the FakeEngine to check the plumbing (tables,
result.json, Parquet, plot, publishing, reverting, refusing a budget) only; whether it
works on the real model is tests/test_optimize_engine.py's job.

The race (screening, certification, selection) is tested on scripted scores in
tests/test_search.py; here it runs on FakeEngine replies.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from bundled_specs import PROMPTS, load_spec
from fakes import FAKE_IDENTITY, LINEAR_TERMS, FakeEngine, FakeServerEngine, fake_report
from promptdistill.core.stats import bootstrap_ci
from promptdistill.engine.meter import CallMeter
from promptdistill.optimize import (
    ExampleCandidate,
    OptimizeBudget,
    SelectionRule,
    expected_ttft,
    instruction_variants,
    optimize,
    pareto_mask,
    token_budget,
    warm_cached_tokens,
)
from promptdistill.optimize.run import OptimizeRun, measured_hit_rate, warm_share_from_hit_rate
from promptdistill.optimize.select import ASSUMED_WARM_SHARE, unmeasured_quality
from promptdistill.optimize.variants import DESCRIBED, described_variant, reply_reminder, with_reply_reminder
from promptdistill.search.racing import Decision, select
from promptdistill.search.selection import FASTER, KEPT, TIE
from promptdistill.specs.datasets import dataset_for, records
from promptdistill.specs.prompt import spec_messages
from promptdistill.ttft.estimators import MonomialRegressor
from promptdistill.ttft.model import TTFTModel

# --- bootstrap ---------------------------------------------------------------------------


def test_bootstrap_ci_brackets_the_mean():
    ci = bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 1], confidence=0.95)
    assert ci.mean == pytest.approx(0.75) and ci.n == 8
    assert ci.low < ci.mean < ci.high
    assert 0.0 <= ci.low and ci.high <= 1.0
    assert bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 1], seed=4) == bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 1], seed=4)
    assert bootstrap_ci([None, None]).mean is None
    assert bootstrap_ci([None, 1, 1]).n == 2  # unscored records are left out
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1, 0], confidence=1.0)


# --- Pareto front ------------------------------------------------------------------------


def test_the_published_format_follows_valid_json_not_quality_on_a_few_records():
    from promptdistill.optimize.finish import preferred_format

    def rows(constrained, schema_in_prompt, free):
        return [{"format": name, "valid_json_rate": valid, "quality": quality} for name, (valid, quality) in
                (("free", free), ("schema_in_prompt", schema_in_prompt), ("constrained", constrained))]

    # Better quality on the format records certifies nothing: constrained decoding stays.
    assert preferred_format(rows((1.0, 0.25), (1.0, 0.75), (1.0, 0.5))) == "constrained"
    assert preferred_format(rows((1.0, 0.25), (0.9, 0.75), (None, None))) == "constrained"
    # Constrained replies cut off more often than another format's: that format.
    assert preferred_format(rows((0.75, 0.5), (1.0, 0.5), (0.5, 0.5))) == "schema_in_prompt"
    assert preferred_format(rows((0.75, 0.5), (0.75, 0.5), (0.875, 0.1))) == "free"


def test_pareto_mask_keeps_only_non_dominated_points():
    quality = [0.5, 0.7, 0.6, 0.9, 0.9, np.nan]
    # c dominated by b, e by d, f has no quality
    assert pareto_mask(quality, [100, 200, 300, 400, 500, 50]).tolist() == [True, True, False, True, False, False]
    assert pareto_mask(quality, [500, 100, 50, 600, 700, 10]).tolist() == [False, True, True, True, False, False]


def test_pareto_mask_of_no_points_is_empty():
    assert pareto_mask([], []).tolist() == []


# --- the selection rule ------------------------------------------------------------------


def test_expected_ttft_mixes_warm_and_cold_by_the_warm_share():
    assert expected_ttft(600.0, 100.0, 0.75) == 225.0
    assert expected_ttft(600.0, 100.0, 1.0) == 100.0 and expected_ttft(600.0, 100.0, 0.0) == 600.0
    # Measured on ticket_triage: pruning cut the cold prediction 639 -> 255 ms, while the warm
    # one rose 135 -> 141 ms (a shorter static prefix fills fewer 128-token cache blocks).
    # Expected at 80% warm: 0.8 x 135 + 0.2 x 639 = 235.8 against 0.8 x 141 + 0.2 x 255 = 163.8:
    # the expected TTFT credits the pruned prompt, the warm prediction alone would not.
    assert expected_ttft(639.0, 135.0, 0.8) == pytest.approx(235.8)
    assert expected_ttft(255.0, 141.0, 0.8) == pytest.approx(163.8)


def test_selection_rule_validates_its_fields():
    with pytest.raises(ValueError, match="warm_share"):
        SelectionRule(warm_share=1.5)
    with pytest.raises(ValueError, match="ttft"):
        SelectionRule(ttft="hot")
    with pytest.raises(ValueError, match="alpha"):
        SelectionRule(alpha=0.5)
    with pytest.raises(ValueError, match="alpha"):
        SelectionRule(alpha=0.0)
    with pytest.raises(ValueError, match="finalists"):
        SelectionRule(finalists=0)
    with pytest.raises(ValueError, match="first_look"):
        SelectionRule(first_look=0)
    assert SelectionRule(warm_share=0.0).warm_share == 0.0
    assert SelectionRule().to_dict()["ttft"] == "expected"


def test_unmeasured_quality_says_when_the_metric_measures_nothing():
    # SmolLM2-135M as the rubric judge of the summary task gave every reply the lowest score.
    assert unmeasured_quality([0.0, 0.0, None]) == (
        "the baseline scores 0 on every scored screen record (2 of 3): the metric does not measure quality here")
    assert unmeasured_quality([None, None]) == (
        "no screen record of the baseline could be scored: the metric does not measure quality here")
    assert unmeasured_quality([0.0, 0.5]) is None
    assert unmeasured_quality([1.0]) is None


# --- token budget ------------------------------------------------------------------------


def test_token_budget_is_p95_plus_15_percent_rounded_up():
    tokens = list(range(1, 101))  # p95 = 95.05 (linear interpolation)
    tb = token_budget(tokens)
    assert tb.p95_tokens == pytest.approx(95.05)
    assert tb.max_tokens == 110  # ceil(95.05 x 1.15 = 109.31)
    assert tb.truncation_rate == 0.0 and tb.n == 100


def test_token_budget_rounds_exact_products_without_float_noise():
    assert token_budget([20] * 10).max_tokens == 23  # 20 * 1.15 must not become 24


def test_token_budget_reports_the_truncation_it_would_have_had():
    tokens = [10] * 18 + [100, 200]  # p95 = 100 + 0.05 x 100 = 105: max_tokens ceil(120.75) = 121
    tb = token_budget(tokens)
    assert tb.max_tokens == 121
    assert tb.truncation_rate == 0.05  # only the 200-token reply
    cut = token_budget([5, 5, 5, 40], truncated=[False, False, False, True])
    assert cut.already_truncated_rate == 0.25 and cut.truncation_rate == 0.25
    assert token_budget([1]).max_tokens == 2 and token_budget([0]).max_tokens == 1
    with pytest.raises(ValueError):
        token_budget([])
    with pytest.raises(ValueError, match="flags"):
        token_budget([1, 2], truncated=[True])


def test_warm_cached_tokens_counts_whole_blocks_and_never_the_last_token():
    assert warm_cached_tokens(300, 400, 128) == 256
    assert warm_cached_tokens(100, 400, 128) == 0
    assert warm_cached_tokens(256, 256, 128) == 128
    assert warm_cached_tokens(40, 100, 16) == 32
    with pytest.raises(ValueError):
        warm_cached_tokens(40, 100, 0)


def test_predictions_are_clipped_at_the_physical_floor():
    from promptdistill.optimize.predict import MIN_TTFT_MS, clip_ttft

    assert clip_ttft([-44.0, 0.2, 250.0]).tolist() == [MIN_TTFT_MS, MIN_TTFT_MS, 250.0]


# --- example strategies ------------------------------------------------------------------


@pytest.fixture(scope="module")
def triage():
    from promptdistill.specs.datasets import dataset_for, records

    spec = load_spec("ticket_triage")
    df = dataset_for(spec)
    return spec, records(df, "train"), records(df, "dev")


def test_fixed_subsets_start_with_the_spec_rule_and_are_distinct(triage):
    from promptdistill.optimize import fixed_subsets
    from promptdistill.specs import select_examples

    spec, train, _ = triage
    subsets = fixed_subsets(spec, train, 4, n_subsets=3, seed=0)
    assert len(subsets) == 3
    assert subsets[0][0] == spec.examples.selection == "balanced"
    assert [r["id"] for r in subsets[0][1]] == [r["id"] for r in select_examples(spec, train, 4, 0)]
    assert len({tuple(sorted(r["id"] for r in recs)) for _, recs in subsets}) == 3
    assert all(len(recs) == 4 for _, recs in subsets)
    assert fixed_subsets(spec, train, 0) == [("none", [])]
    assert fixed_subsets(spec, train[:2], 4) == []


def test_similar_examples_find_same_label_neighbours(triage):
    from promptdistill.optimize import SimilarExamples

    spec, train, dev = triage
    sim = SimilarExamples(spec, train).fit()
    hits = total = 0
    for r in dev[:20]:
        for n in sim.neighbours(r["inputs"], 3):
            hits += n["expected"]["label"] == r["expected"]["label"]
            total += 1
    assert hits / total > 0.5  # well above the 0.25 of a random pick among four teams
    assert sim.neighbours(train[5]["inputs"], 1)[0]["id"] == train[5]["id"]  # a record is its own nearest
    with pytest.raises(RuntimeError, match="fit"):
        SimilarExamples(spec, train).neighbours(dev[0]["inputs"], 1)


def test_per_request_examples_sit_after_the_static_prefix(triage):
    """Same examples, same prompt length roughly; but only the fixed set is in the cacheable
    prefix. Token counts by the FakeEngine's whitespace tokenizer: the structure is what matters."""
    from promptdistill.optimize import SimilarExamples, per_request_spec
    from promptdistill.optimize.examples import fixed_spec, with_fewshot
    from promptdistill.ttft.features import prompt_features

    spec, train, dev = triage
    tokenizer = FakeEngine()
    sim = SimilarExamples(spec, train).fit()
    dynamic = per_request_spec(spec)
    rec = with_fewshot(spec, dev[:1], sim, 4)[0]
    shots = [t for t in train if t["id"] in rec["fewshot_ids"]]
    shots.sort(key=lambda t: rec["fewshot_ids"].index(t["id"]))
    fixed = fixed_spec(spec, shots)
    f_dyn = prompt_features(dynamic, rec["inputs"], tokenizer)
    f_fix = prompt_features(fixed, dev[0]["inputs"], tokenizer, examples=shots)
    assert f_fix["fewshot_tokens"] > 0
    assert abs(f_dyn["total_tokens"] - f_fix["total_tokens"]) < 15
    assert f_fix["static_prefix_tokens"] - f_dyn["static_prefix_tokens"] > 0.8 * f_fix["fewshot_tokens"]
    assert "{fewshot}" in dynamic.user and "fewshot" in dynamic.inputs and dynamic.examples.count == 0
    with pytest.raises(ValueError, match="reserved"):
        per_request_spec(dynamic)


def test_instruction_variants_dedupe_and_keep_the_rest_of_the_spec(triage):
    spec, _, _ = triage
    short = spec.with_changes(instruction="Route the ticket to one team.", user="Other: {ticket}")
    same = spec.with_changes(examples=spec.examples)
    out = instruction_variants(spec, [("short", short), ("same", same), ("short2", short)], max_variants=5)
    assert [vid for vid, _ in out] == ["original", "short"]
    assert out[1][1].instruction == "Route the ticket to one team." and out[1][1].user == spec.user
    tiny = spec.with_changes(instruction="Route it.")
    assert [vid for vid, _ in instruction_variants(spec, [short, tiny], max_variants=2)] == ["original", "variant1"]
    assert instruction_variants(spec, None) == [("original", spec)]


def test_the_described_variant_is_the_description_alone_and_a_separate_source(triage):
    spec, _, _ = triage
    spec = spec.with_changes(context="Teams: billing, technical, account.")
    short = spec.with_changes(instruction="Route the ticket to one team.")
    out = instruction_variants(spec, [("short", short)], max_variants=2, described=True)
    # It takes no distiller finalist's place: max_variants counts the original and the distiller's.
    assert [vid for vid, _ in out] == ["original", "short", DESCRIBED]
    described = out[-1][1]
    assert described.instruction == spec.description.strip() and described.constraints == ()
    assert spec.constraints  # the fixture has rules to drop
    assert (described.context, described.user, described.examples, described.output_schema) == (
        spec.context, spec.user, spec.examples, spec.output_schema)
    assert described_variant(spec) == described
    assert instruction_variants(spec, [("short", short)], max_variants=2) == out[:2]  # off by default
    # Nothing new to try: the spec already says only its description, or a distiller finalist does.
    assert described_variant(described) is None
    # Without an output schema the rules may be the only statement of the reply's format.
    assert described_variant(spec.with_changes(output_schema=None)) is None
    assert [vid for vid, _ in instruction_variants(spec, [("d", described)], described=True)] == ["original", "d"]


def test_the_reply_reminder_restates_the_schemas_keys_after_the_input(triage):
    spec, _, _ = triage
    reminded = with_reply_reminder(spec)
    keys = list(spec.output_schema["properties"])
    assert reminded.user.startswith(spec.user) and reminded.user != spec.user
    assert reminded.user.endswith(reply_reminder(spec)) and all(k in reminded.user[len(spec.user):] for k in keys)
    assert reminded.instruction == spec.instruction and reminded.examples == spec.examples
    assert with_reply_reminder(reminded) is None  # never twice
    # The twin renders the reminder last, after the input, braces and all.
    record = next(iter(records(dataset_for(spec), "dev")))
    assert spec_messages(reminded, record["inputs"])[-1]["content"].endswith("\n\n" + reply_reminder(spec))
    braced = spec.with_changes(output_schema={**spec.output_schema, "required": ["label", "a{b}"],
                                              "properties": {**spec.output_schema["properties"], "a{b}": {}}})
    assert spec_messages(with_reply_reminder(braced), record["inputs"])[-1]["content"].endswith(
        "with the keys label and a{b}.")
    def schema(properties, schema_from=None):
        return SimpleNamespace(output_schema={"type": "object", "properties": properties}, schema_from=schema_from)

    assert reply_reminder(schema({"a": {}, "b": {}, "c": {}})) == "Reply with one JSON object with the keys a, b and c."
    assert reply_reminder(schema({"label": {}})) == "Reply with one JSON object with the key label."
    # No object schema, or one per request: nothing to restate.
    assert reply_reminder(schema({})) is None and reply_reminder(schema({"a": {}}, schema_from="schema")) is None
    assert with_reply_reminder(SimpleNamespace(output_schema=None, schema_from=None)) is None


def test_optimize_budget_validates():
    with pytest.raises(ValueError, match="fewshot_counts"):
        OptimizeBudget(fewshot_counts=(0, 9))
    with pytest.raises(ValueError, match="similar_counts"):
        OptimizeBudget(similar_counts=(-1,))
    with pytest.raises(ValueError, match="screen_size"):
        OptimizeBudget(screen_size=0)
    with pytest.raises(ValueError, match="test_size"):
        OptimizeBudget(test_size=-1)
    with pytest.raises(ValueError, match="max_minutes"):
        OptimizeBudget(max_minutes=0)
    with pytest.raises(ValueError, match="max_variants"):
        OptimizeBudget(max_variants=0)
    assert OptimizeBudget(fewshot_counts=[0, 2]).fewshot_counts == (0, 2)  # lists become tuples
    assert OptimizeBudget(test_size=0, timing_records=0).test_size == 0


# --- warm share and resolution on an OptimizeRun (FakeEngine) --------------------------------


def ttft_model(mape: float | None = None) -> TTFTModel:
    """A linear TTFT model on FAKE_IDENTITY: 50 ms + 0.4 ms per uncached token + 0.02 per cached one."""
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(10, 1500, 80), rng.choice([0, 128, 256], 80), rng.integers(0, 8, 80),
                         rng.uniform(0.3, 0.8, 80), rng.uniform(5, 9, 80)])
    y = 50 + 0.4 * X[:, 0] + 0.02 * X[:, 1]
    metrics = {} if mape is None else {"heldout": {"linear": {"mape": mape}}}
    return TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, y), "monomial", "linear", FAKE_IDENTITY,
                     metrics=metrics)


SMALL = OptimizeBudget(max_lm_calls=500, screen_size=8, dev_size=16, test_size=4, fewshot_counts=(0,),
                       similar_counts=(), timing_records=0, formats=False)


def test_warm_share_from_a_token_hit_rate():
    # A warm request serves 256 of its 512 tokens from the cache: a 30% token hit rate is 60% of requests warm.
    assert warm_share_from_hit_rate(0.3, 256, 512) == pytest.approx(0.6)
    assert warm_share_from_hit_rate(0.9, 256, 512) == 1.0  # more than this template could get: clipped
    assert warm_share_from_hit_rate(0.3, 0, 512) == 0.0  # nothing cacheable: never warm
    assert warm_share_from_hit_rate(0.0, 256, 512) == 0.0


def test_the_warm_share_is_configured_measured_or_assumed(triage):
    spec, _, _ = triage
    measured = "measured: server prefix-cache hit rate 40% of prompt tokens"
    cases = [
        (FakeEngine(), SelectionRule(), "assumed"),
        (FakeServerEngine(hit_rate=0.4), SelectionRule(), measured),
        (CallMeter(FakeServerEngine(hit_rate=0.4)), SelectionRule(), measured),  # wrappers are looked through
        (FakeServerEngine(hit_rate=0.4), SelectionRule(warm_share=0.25), "configured"),
    ]
    for engine, rule, source in cases:
        run = OptimizeRun(engine, spec, ttft_model(), SMALL, 0, rule, None)
        base = run.evaluate_baseline()
        p = base.prediction
        share = {"assumed": ASSUMED_WARM_SHARE, "configured": 0.25}.get(
            source, 0.4 * p["total_tokens"] / p["warm_cached_tokens"])
        assert run.warm_share == pytest.approx(share) and run.warm_share_source.startswith(source)
        assert p["ttft_warm_ms"] < p["ttft_cold_ms"]  # the static prefix is served from the cache
        assert p["ttft_expected_ms"] == pytest.approx(share * p["ttft_warm_ms"] + (1 - share) * p["ttft_cold_ms"])
        assert base.cost == p["ttft_expected_ms"]
        assert base.static_tokens == round(p["static_prefix_tokens"]) > 0
    assert measured_hit_rate(FakeEngine()) is None
    assert measured_hit_rate(CallMeter(FakeServerEngine(hit_rate=0.9))) == 0.9


@pytest.mark.parametrize("kind", ["cold", "warm"])
def test_the_rule_kind_chooses_the_prediction_that_is_the_cost(triage, kind):
    spec, _, _ = triage
    run = OptimizeRun(FakeEngine(), spec, ttft_model(), SMALL, 0, SelectionRule(ttft=kind), None)
    cand = ExampleCandidate(id="c", spec=spec)
    run.predict(cand)
    assert cand.cost == cand.prediction[f"ttft_{kind}_ms"] == cand.ttft(kind)


def test_the_resolution_is_the_ttft_models_error_and_a_tie_needs_the_baselines_quality(triage):
    spec, _, _ = triage
    run = OptimizeRun(FakeEngine(), spec, ttft_model(mape=0.05), SMALL, 0, SelectionRule(), None)
    assert run.resolution_rel == 0.05
    assert OptimizeRun(FakeEngine(), spec, ttft_model(), SMALL, 0, SelectionRule(), None).resolution_rel == 0.1
    base = ExampleCandidate(id="baseline", spec=spec, cost=200.0, static_tokens=300)
    base.raced = fake_report("baseline", [1.0, 0.0, 1.0, 0.0])

    def certified(cid, cost, static, scores):
        c = ExampleCandidate(id=cid, spec=spec, cost=cost, static_tokens=static)
        c.raced = fake_report(cid, scores)
        c.decision = Decision("non-inferior", 4, 0.0, -0.01, 0.01, 0.05, "certified")
        return c

    assert run.resolution(base, certified("x", 190.0, 1, [0.0] * 4)) == 10.0  # 5% of the larger prediction
    # 192 ms is within 5% of 200 ms: a tie with the baseline; fewer static tokens do not
    # make up for lower quality, the same quality does.
    chosen = select(base, [certified("shorter_worse", 192.0, 250, [1.0, 0.0, 0.0, 0.0])], resolution=run.resolution)
    assert chosen.winner is base and chosen.clause == KEPT and chosen.reason.startswith("kept: ")
    chosen = select(base, [certified("shorter_same", 192.0, 250, [1.0, 0.0, 1.0, 0.0])], resolution=run.resolution)
    assert chosen.winner.id == "shorter_same" and chosen.clause == TIE and chosen.reason.startswith("tie, no worse: ")
    # 180 ms is more than 5% below: faster beyond the resolution, static tokens do not matter.
    chosen = select(base, [certified("faster", 180.0, 900, [1.0, 0.0, 0.0, 0.0])], resolution=run.resolution)
    assert chosen.winner.id == "faster" and chosen.clause == FASTER and chosen.reason.startswith("faster: ")


# --- plumbing on the FakeEngine (not a claim about the real model) ---------------------------

_KEYWORDS = {"billing": ("charge", "refund", "invoice", "coupon", "receipt", "payment", "price"),
             "shipping": ("deliver", "parcel", "tracking", "courier", "package", "address"),
             "account": ("password", "login", "log in", "email", "username", "verif", "two-factor", "delete")}


def _triage_reply(req):
    text = req.chat()[-1]["content"].lower().rsplit("ticket:", 1)[-1]
    label = next((lab for lab, words in _KEYWORDS.items() if any(w in text for w in words)), "technical")
    return json.dumps({"label": label})


def with_drop(spec, drop: float = 0.2, ttft_ms: float | None = 600):
    """The spec with a larger allowed drop: 50 certify records can then certify a candidate
    that answers exactly as the baseline (the spec's 0.03 needs a few hundred)."""
    return spec.with_changes(slo=dataclasses.replace(spec.slo, max_quality_drop=drop, ttft_ms=ttft_ms))


# The distiller's "short" is the candidate these runs follow; the described variant has its own test.
RUN_BUDGET = OptimizeBudget(max_lm_calls=1000, screen_size=8, dev_size=58, test_size=8, fewshot_counts=(0, 2),
                            similar_counts=(2,), timing_records=2, format_size=8, described=False)


@pytest.fixture(scope="module")
def fake_run(triage):
    spec, _, _ = triage
    spec = with_drop(spec)
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    engine = FakeEngine(reply=_triage_reply)
    result = optimize(engine, spec, ttft_model=ttft_model(mape=0.02), budget=RUN_BUDGET,
                      distill_candidates=[("short", short)])
    return result, engine


def test_optimize_plumbing_on_the_fake_engine(fake_run, tmp_path):
    result, engine = fake_run
    df = result.candidates
    assert set(df["strategy"]) == {"baseline", "none", "fixed", "similar"}
    # Each candidate with fixed or no examples has its reply-reminder twin; per-request ones do not.
    twins = df[df["variant"].str.endswith("+remind")]
    plain = df[df["strategy"].isin(["none", "fixed"]) & ~df["variant"].str.contains("remind")]
    assert len(twins) == len(plain) > 0 and set(twins["strategy"]) == {"none", "fixed"}
    assert set(twins["candidate_id"]) == {c.replace("/", "+remind/", 1) for c in plain["candidate_id"]}
    assert result.splits == {"train": 100, "screen": 8, "certify": 50, "test": 8}
    # Every LM request went through the run's meter; timing requests went to the engine behind it.
    assert engine.calls == result.lm_calls + result.timing_requests
    # 2 records x 6 repeats (12 pairs) x 2 templates, interleaved, x (1 cold + 1 warm)
    assert result.timing_requests == 48 == len(result.timing)  # the cold request primes the warm one
    assert result.baseline["timing_repeats"] == result.winner["timing_repeats"] == 6
    assert result.lm_calls <= result.budget.max_lm_calls
    # Every candidate answers as the baseline: the first finalist, the one with the lowest
    # expected TTFT (2% resolution: no tie here), is certified at the first look, which ends
    # the race, and wins.
    finalists = df[df["finalist"]]
    assert len(finalists) == 1 and finalists["verdict"].tolist() == ["non-inferior"]
    assert finalists["race_n"].tolist() == [50] and (finalists["diff_mean"] == 0.0).all()
    assert result.baseline["race_n"] == result.winner["race_n"] == 50  # what a kept baseline's report shows
    static = df[(df["strategy"] != "similar") & ~df["is_baseline"]].sort_values("ttft_expected_ms")
    assert result.winner_id == finalists["candidate_id"].iloc[0] == static["candidate_id"].iloc[0] == "short/none"
    assert static["ttft_expected_ms"].iloc[1] > 1.02 * static["ttft_expected_ms"].iloc[0]
    assert not result.kept_baseline and result.reason.startswith("faster: short/none: certified non-inferior")
    # Per-request examples: never finalists by default, and their static prefix is not cached.
    assert not df[df["strategy"] == "similar"]["finalist"].any()
    trade = result.tradeoff.set_index(["strategy", "k"])
    assert trade.loc[("similar", 2), "warm_cached_tokens"] < trade.loc[("fixed", 2), "warm_cached_tokens"]
    assert (df["ttft_expected_ms"] - (0.8 * df["ttft_warm_ms"] + 0.2 * df["ttft_cold_ms"])).abs().max() < 1e-9
    assert result.warm_share_source == "assumed" and result.ttft_resolution == 0.02
    assert result.plan is not None and result.plan.pool == 50
    assert result.content["max_tokens"] == result.token_budget.max_tokens
    assert result.content["response_format"] == "json_schema"
    assert {"free", "schema_in_prompt", "constrained"} == set(result.formats["format"])
    # 8 test records are too few to split into two looks: scored whole, intervals at 95%.
    assert result.winner["test_n"] == result.baseline["test_n"] == 8 and result.winner["test_diff_mean"] == 0.0
    assert result.verification["test_stop"] == "all 8 records in one look (fewer than 100: too few to split)"
    assert result.verification["test_confidence"] == 0.95
    assert result.winner["measured_cold_ms"] > 0 and result.verification["rendering_checked"] == 8
    # The fake engine's TTFT grows with the prompt: the shorter winner is measurably faster, with an interval.
    w = result.winner
    assert w["timing_pairs"] == 12
    assert w["measured_cold_diff_low_ms"] <= w["measured_cold_diff_ms"] <= w["measured_cold_diff_high_ms"] < 0
    assert w["measured_cold_ms"] < result.baseline["measured_cold_ms"]
    assert 0 < result.baseline["static_cached_share_predicted"] <= 1
    summary = result.to_summary()
    assert "winner - baseline [95% CI]" in summary and "baseline and winner interleaved" in summary
    from promptdistill.pipeline.stages import result_figures

    figures = result_figures(result.to_json())
    assert figures["ttft_diff_ms"] == pytest.approx(w["measured_expected_diff_ms"])
    assert figures["ttft_cold_ms_predicted_after"] == pytest.approx(w["predicted_cold_ms"])
    assert figures["kept_baseline"] is False and "interleaved pairs" in figures["ttft_timing"]


def test_optimize_writes_tables_json_and_plot(fake_run, tmp_path):
    result, _ = fake_run
    paths = result.write(tmp_path / "out")
    assert {"candidates", "pareto", "density_curve", "tradeoff", "formats", "timing", "result", "plot"} <= set(paths)
    assert pd.read_parquet(paths["candidates"]).shape[0] == len(result.candidates)
    assert pd.read_parquet(paths["pareto"])["candidate_id"].tolist() == result.pareto["candidate_id"].tolist()
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(paths["result"].read_text())
    assert saved["winner_id"] == result.winner_id and saved["content"] == result.content
    assert saved["metrics"]["winner_max_tokens"] == result.token_budget.max_tokens
    assert saved["plan_text"] == result.plan.sentence()
    summary = result.to_summary()
    assert "Winner: short/none" in summary and "Plan: 50 certify records" in summary
    assert "80% of requests warm (assumed)" in summary


def test_published_template_renders_what_was_verified(fake_run, tmp_path, triage):
    from promptdistill.client import Templates
    from promptdistill.pipeline.publish import CANDIDATE_LABEL, publish_result
    from promptdistill.registry import Registry
    from promptdistill.specs import spec_messages

    result, _ = fake_run
    spec, _, dev = triage
    (tmp_path / "reg").mkdir()  # a missing root reads as "not mounted", not as an empty registry
    registry = Registry(str(tmp_path / "reg"))
    record, created = publish_result(registry, result.to_json(), run_key="unit-test", labels=(CANDIDATE_LABEL,))
    assert created
    assert record.provenance["dataset"]["sha256"] and record.provenance["engine"]["model"] == "fake"
    assert record.metrics["winner_dev_mean"] == pytest.approx(result.winner["dev_mean"])
    again, created = publish_result(registry, result.to_json(), run_key="unit-test", labels=(CANDIDATE_LABEL,))
    assert not created and again.version == record.version  # once per run key
    t = Templates(str(tmp_path / "reg")).get(f"{spec.name}@candidate")
    for r in dev[:3]:
        assert t.render(r["inputs"]) == spec_messages(result.winner_spec, r["inputs"], examples=result.winner_examples)
    assert t.max_tokens == result.token_budget.max_tokens


@pytest.mark.parametrize("worse", [False, True])
def test_the_described_variant_is_screened_and_raced_like_any_candidate(triage, worse):
    """The description alone is the cheapest prompt here: it wins when it answers as the
    baseline does, and the screen drops it when it answers worse."""
    spec, _, _ = triage
    described = described_variant(spec)

    def reply(req):
        right = json.loads(_triage_reply(req))["label"]
        if worse and req.chat()[0]["content"].startswith(described.instruction):
            return json.dumps({"label": "technical" if right != "technical" else "billing"})
        return json.dumps({"label": right})

    budget = dataclasses.replace(RUN_BUDGET, described=True, timing_records=0, formats=False, similar_counts=())
    result = optimize(FakeEngine(reply=reply), with_drop(spec), ttft_model=ttft_model(mape=0.02), budget=budget)
    df = result.candidates.set_index("candidate_id")
    assert {"described/none", "described/fixed2", "described+remind/none"} <= set(df.index)
    if not worse:
        assert result.winner_id == "described/none" and result.winner_spec.instruction == described.instruction
        assert result.winner_spec.constraints == () and df.loc["described/none", "verdict"] == "non-inferior"
    else:
        assert not result.winner_id.startswith("described")
        assert not df.loc[df.index.str.startswith("described"), "finalist"].any()
        assert "screening: mean difference" in df.loc["described/none", "notes"]


def test_the_slo_decides_who_may_win(triage):
    """The same run with an SLO only the shortest prompt meets: the others are noted and not raced."""
    spec, _, _ = triage
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    budget = dataclasses.replace(RUN_BUDGET, timing_records=0, formats=False, similar_counts=())
    probe = optimize(FakeEngine(reply=_triage_reply), with_drop(spec, ttft_ms=None), ttft_model=ttft_model(mape=0.02),
                     budget=budget, distill_candidates=[("short", short)])
    costs = probe.candidates.set_index("candidate_id")["ttft_expected_ms"].sort_values()
    slo = (costs.iloc[0] + costs.iloc[1]) / 2  # between the two fastest predictions
    result = optimize(FakeEngine(reply=_triage_reply), with_drop(spec, ttft_ms=slo), ttft_model=ttft_model(mape=0.02),
                      budget=budget, distill_candidates=[("short", short)])
    df = result.candidates.set_index("candidate_id")
    assert result.winner_id == costs.index[0]
    slower = [cid for cid in costs.index[1:] if cid != "baseline"]
    assert all("misses the SLO: predicted expected TTFT" in df.loc[cid, "notes"] for cid in slower)
    assert not df.loc[slower, "finalist"].any()


def test_a_metric_that_scores_every_baseline_reply_zero_keeps_the_baseline(triage):
    spec, _, _ = triage
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    engine = FakeEngine(reply=lambda req: json.dumps({"label": "nobody"}))
    budget = dataclasses.replace(RUN_BUDGET, timing_records=0, formats=False, similar_counts=())
    result = optimize(engine, with_drop(spec), ttft_model=ttft_model(), budget=budget,
                      distill_candidates=[("short", short)])
    assert result.kept_baseline and result.winner_id == "baseline"
    assert "the metric does not measure quality here; keeping the baseline" in result.reason
    assert result.plan is None and (result.candidates["race_n"] == 0).all()
    # Nothing but the baseline is screened: a metric that cannot tell replies apart is not spent on.
    others = result.candidates[result.candidates["candidate_id"] != "baseline"]
    assert len(others) and (others["screen_n"].fillna(0) == 0).all()


def test_a_kept_baseline_is_timed_once_and_shown_once(triage):
    spec, _, _ = triage
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    engine = FakeEngine(reply=lambda req: json.dumps({"label": "nobody"}))
    budget = dataclasses.replace(RUN_BUDGET, timing_records=2, formats=False, similar_counts=())
    result = optimize(engine, with_drop(spec), ttft_model=ttft_model(), budget=budget,
                      distill_candidates=[("short", short)])
    assert result.kept_baseline
    assert set(result.timing["template"]) == {"baseline"}
    assert result.timing_requests == 2 * 6 * 2  # one template: half the cost of a comparison
    for key in ("measured_cold_ms", "measured_warm_ms", "predicted_warm_ms", "static_cached_share"):
        assert result.winner[key] == result.baseline[key]
    assert result.winner.get("measured_cold_diff_ms") is None
    summary = result.to_summary()
    assert "baseline (kept)" in summary and "winner - baseline [95% CI]" not in summary


def test_a_winner_that_fails_on_test_is_reverted_to_the_baseline(triage):
    """A candidate as good as the baseline on dev but worse on test must not be published."""
    spec, _, dev = triage
    spec = with_drop(spec)
    dev_tickets = {r["inputs"]["ticket"] for r in dev}

    def reply(req):
        system, user = req.chat()[0]["content"], req.chat()[-1]["content"]
        right = json.loads(_triage_reply(req))["label"]
        ticket = user.rsplit("Ticket: ", 1)[-1]
        if system.startswith(spec.instruction.strip()[:40]) or ticket in dev_tickets:
            return json.dumps({"label": right})
        return json.dumps({"label": "technical" if right != "technical" else "billing"})

    short = spec.with_changes(instruction="Pick the team for this ticket.")
    budget = OptimizeBudget(max_lm_calls=500, screen_size=8, dev_size=58, test_size=8, fewshot_counts=(0,),
                            similar_counts=(), timing_records=0, formats=False, described=False)
    result = optimize(FakeEngine(reply=reply), spec, ttft_model=ttft_model(mape=0.02), budget=budget,
                      distill_candidates=[("short", short)])
    assert result.kept_baseline and result.winner_id == "baseline"
    assert "REVERTED on test" in result.reason and result.verification["reverted_from"] == "short/none"
    chosen = result.selection
    assert (chosen.kept, chosen.winner, chosen.reverted_from, chosen.chosen_clause) == (True, "baseline", "short/none",
                                                                                        FASTER)
    assert result.to_json()["selection"]["reverted_from"] == "short/none"
    assert result.winner["test_mean"] == result.baseline["test_mean"]
    assert result.winner_spec == spec  # the published template is the baseline's


def _test_split_run(spec, records, winner_wrong):
    """score_test on ``records``: the baseline answers every record right, the winner (a
    shorter instruction) wrong on the records whose ids are in ``winner_wrong``."""
    from promptdistill.evaluate.evaluator import EvalItem
    from promptdistill.search.held_out import score_test

    short = spec.with_changes(instruction="Pick the team for this ticket.")
    expected = {r["inputs"]["ticket"]: r["expected"]["label"] for r in records}
    wrong = {r["inputs"]["ticket"] for r in records if r["id"] in winner_wrong}

    def reply(req):
        ticket = req.chat()[-1]["content"].rsplit("Ticket: ", 1)[-1]
        is_winner = req.chat()[0]["content"].startswith("Pick the team")
        label = expected[ticket]
        return json.dumps({"label": ("billing" if label != "billing" else "technical") if is_winner and ticket in wrong
                           else label})

    engine = CallMeter(FakeEngine(reply=reply))
    items = lambda recs: [EvalItem(spec, recs), EvalItem(short, recs)]  # noqa: E731
    score = lambda line: score_test(engine, items, records, line=line, judge_runner=None, seed=0)  # noqa: E731
    score.items = items
    return engine, score


def test_the_test_check_allows_a_tie_no_drop_and_a_faster_winner_the_allowed_one(triage):
    """One function checks both stages' winners: a tie (chosen for being no worse) is
    reverted by any drop on the test split, a faster winner only by more than the allowed one."""
    from promptdistill.search.held_out import check_on_test
    from promptdistill.search.racing import Candidate, Selection

    spec, _, dev = triage
    test = dev[:40]  # under 2 x MIN_LOOK: one look, every record
    base, short = Candidate("baseline", spec), Candidate("short", spec)
    for clause, reverted in ((TIE, True), (FASTER, False)):
        engine, score = _test_split_run(spec, test, winner_wrong={test[0]["id"]})  # a mean of -1/40
        chosen = Selection(short, base, clause, f"{clause}: short", "expected TTFT", 5.0, (-0.01, 0.02))
        check = check_on_test(chosen, score.items, test, engine=engine, judge_runner=None, seed=0, max_drop=0.05)
        assert check.diff_mean == pytest.approx(-0.025) and check.reverted == reverted, clause
        assert check.allowed_drop == (0.0 if clause == TIE else 0.05)
        if reverted:
            assert (check.selection.winner, check.selection.clause, check.selection.reverted_from) == (base, KEPT, short)
            assert check.selection.reason == (f"{TIE}: short; REVERTED on test: short scored -0.025 against the baseline "
                                              "on 40 records (a tie on expected TTFT must be at least as good as the "
                                              "baseline); keeping the baseline")
        else:
            assert check.selection is chosen
    # Nothing to revert (a kept baseline, or verify_on_test off): scored for the report only.
    engine, score = _test_split_run(spec, test, winner_wrong={r["id"] for r in test})
    chosen = Selection(short, base, FASTER, "faster: short")
    assert not check_on_test(chosen, score.items, test, engine=engine, judge_runner=None, seed=0, max_drop=0.05,
                             revert=False).reverted


def test_the_test_split_stops_after_its_first_half_when_that_decides(triage):
    spec, _, dev = triage
    # 100 records where the prompts agree everywhere clear -0.05 (the score interval's lower
    # end, -0.048); 50 do not (-0.091: 50 ties are 8% likely under a drop of 0.05).
    test = dev[:200]
    engine, score = _test_split_run(spec, test, winner_wrong=set())
    (base, win), confidence, why = score(-0.05)
    assert base.n == win.n == 100 and engine.calls == 200 and confidence == 0.975
    assert why.startswith("decided after the first 100 of 200 records") and "lies above -0.050" in why
    engine, score = _test_split_run(spec, test[:100], winner_wrong=set())
    (base, win), _, why = score(-0.05)
    assert win.n == 100 and engine.calls == 200 and "[-0.091, +0.091] not above -0.050" in why
    # Wrong on every record of the first half: no early revert, the second half is scored
    # too (where the winner answers right), so the revert rests on every record's mean.
    engine, score = _test_split_run(spec, test, winner_wrong={r["id"] for r in test[:100]})
    (base, win), _, why = score(-0.05)
    assert win.n == 200 and engine.calls == 400 and "[-1.000, -0.9" in why and "not above -0.050" in why
    assert win.mean == pytest.approx(base.mean - 0.5)


def test_the_test_split_scores_its_second_half_when_the_first_leaves_the_revert_open(triage):
    spec, _, dev = triage
    test = dev[:100]
    # 3 of the first 50 wrong: a mean of -0.06 whose interval reaches below -0.05; none of the rest.
    engine, score = _test_split_run(spec, test, winner_wrong={r["id"] for r in test[:3]})
    (base, win), confidence, why = score(-0.05)
    assert base.n == win.n == 100 and engine.calls == 200
    assert why.startswith("all 100 records: the first 50 left") and "not above -0.050" in why
    assert [r["id"] for r in test] == win.record_ids == base.record_ids  # the halves merged in order
    assert win.mean == pytest.approx(base.mean - 3 / 100)
    # The intervals reported cover at 95% over both looks: each at 97.5%.
    assert confidence == 0.975


def test_a_kept_baseline_is_scored_on_the_first_half_of_the_test_split(triage):
    spec, _, dev = triage
    engine, score = _test_split_run(spec, dev[:101], winner_wrong=set())
    (base, win), confidence, why = score(None)
    assert base.n == 51 and engine.calls == 102 and confidence == 0.95
    assert why == "nothing to revert: the first 51 of 101 records are scored, for the report"
    # Under 100 records: one look, scored whole, at 95%, whatever the line.
    for line in (None, -0.05):
        engine, score = _test_split_run(spec, dev[:9], winner_wrong=set())
        (base, win), confidence, why = score(line)
        assert base.n == 9 and engine.calls == 18 and confidence == 0.95 and why.startswith("all 9 records in one look")


def test_a_budget_too_small_for_baseline_and_verification_is_refused(triage):
    from promptdistill.core.errors import ConfigError

    spec, _, _ = triage
    engine = FakeEngine(reply=_triage_reply)
    # screen 5 + formats 2 x 5 + verification 2 x 10 test records (baseline and winner) = 35 calls.
    with pytest.raises(ConfigError, match=r"max_lm_calls: 30 is too small for ticket_triage: screening the baseline "
                                          r"and the verification alone need up to 35 LM calls \(5 screen, 10 test "
                                          r"records\)"):
        optimize(engine, spec, ttft_model=ttft_model(), budget=OptimizeBudget(max_lm_calls=30, dev_size=10,
                                                                              test_size=10))
    assert engine.calls == 0


# --- CLI ---------------------------------------------------------------------------------


def test_cli_registers_optimize_with_its_options():
    from promptdistill.cli import build_parser
    from promptdistill.cli.optimize import _budget

    args = build_parser().parse_args(["optimize", "ticket_triage", "--budget-calls", "500", "--budget-minutes", "3",
                                      "--seed", "2", "--publish", "--dev", "120", "--test", "40", "--screen", "12",
                                      "--alpha", "0.05", "--finalists", "2", "--ttft", "cold", "--warm-share", "0.6"])
    assert args.func.__name__ == "_optimize"
    assert (args.budget_calls, args.budget_minutes, args.seed, args.publish) == (500, 3.0, 2, True)
    budget, rule = _budget(args)
    assert (budget.max_lm_calls, budget.max_minutes, budget.dev_size, budget.test_size, budget.screen_size) == \
        (500, 3.0, 120, 40, 12)
    assert (rule.alpha, rule.finalists, rule.ttft, rule.warm_share) == (0.05, 2, "cold", 0.6)
    defaults, default_rule = _budget(build_parser().parse_args(["optimize", "ticket_triage"]))
    assert defaults == OptimizeBudget() and default_rule == SelectionRule()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["optimize", "ticket_triage", "--ttft", "hot"])


def test_cli_rejects_a_bad_budget(capsys):
    """Refused before any engine starts, with the reason; 2 is the CLI's exit code for a config error."""
    from promptdistill.cli import main

    assert main(["optimize", "ticket_triage", "--prompts-dir", str(PROMPTS), "--budget-calls", "0"]) == 2
    assert "ConfigError: optimize: max_lm_calls must be at least 1, got 0." in capsys.readouterr().err
    assert main(["optimize", "ticket_triage", "--prompts-dir", str(PROMPTS), "--warm-share", "2"]) == 2
    assert "ConfigError: optimize: warm_share must be in [0, 1], got 2.0." in capsys.readouterr().err

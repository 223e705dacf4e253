"""Pure logic of the optimizer: bootstrap, Pareto front, selection rule, token budget,
successive halving, example strategies. The last tests run the whole ``optimize`` on the
FakeEngine to check the plumbing (tables, Parquet, plot, publishing) only; whether it
works on the real model is tests/test_optimize_engine.py's job.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from promptdistill.optimize import (
    OptCandidate,
    Scored,
    SelectionRule,
    bootstrap_ci,
    instruction_variants,
    paired_bootstrap_lower_bound,
    pareto_front,
    select_winner,
    successive_halving,
    token_budget,
    warm_cached_tokens,
)
from promptdistill.evaluate import EvalReport


# --- bootstrap ---------------------------------------------------------------------------

def test_paired_lower_bound_identical_scores_is_zero():
    assert paired_bootstrap_lower_bound([1, 0, 1, 1], [1, 0, 1, 1]) == 0.0


def test_paired_lower_bound_sign_follows_the_difference():
    base = [0, 1] * 20
    better = [1, 1] * 20
    worse = [0, 0] * 20
    assert paired_bootstrap_lower_bound(better, base) > 0.3
    assert paired_bootstrap_lower_bound(worse, base) < -0.3


def test_paired_lower_bound_is_below_the_mean_difference_and_seeded():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2, 40).tolist()
    cand = [b if rng.random() < 0.8 else 1 - b for b in base]
    lb = paired_bootstrap_lower_bound(cand, base, confidence=0.9, seed=3)
    assert lb < np.mean(np.subtract(cand, base))
    assert lb == paired_bootstrap_lower_bound(cand, base, confidence=0.9, seed=3)
    assert paired_bootstrap_lower_bound(cand, base, confidence=0.99, seed=3) <= lb


def test_paired_lower_bound_drops_unscored_pairs_and_checks_lengths():
    assert paired_bootstrap_lower_bound([None, 1, 1], [0, None, 1]) == 0.0
    assert paired_bootstrap_lower_bound([None], [1]) is None
    with pytest.raises(ValueError, match="same records"):
        paired_bootstrap_lower_bound([1, 0], [1])


def test_bootstrap_ci_brackets_the_mean():
    ci = bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 1], confidence=0.95)
    assert ci.mean == pytest.approx(0.75)
    assert ci.low <= ci.mean <= ci.high
    assert 0.0 <= ci.low and ci.high <= 1.0
    assert bootstrap_ci([None, None]).mean is None


# --- Pareto front ------------------------------------------------------------------------

def test_pareto_front_keeps_only_non_dominated_points_sorted_by_cost():
    df = pd.DataFrame({
        "candidate_id": list("abcdef"),
        "quality": [0.5, 0.7, 0.6, 0.9, 0.9, np.nan],
        "ttft_warm_ms": [100, 200, 300, 400, 500, 50],
    })
    front = pareto_front(df)
    assert front["candidate_id"].tolist() == ["a", "b", "d"]  # c dominated by b, e by d, f has no quality


def test_pareto_front_of_an_empty_frame_is_empty():
    assert pareto_front(pd.DataFrame({"quality": [], "ttft_warm_ms": []})).empty


# --- selection rule ----------------------------------------------------------------------

BASE = Scored("baseline", 0.80, 0.0, ttft_cold_ms=500, ttft_warm_ms=300)


def test_winner_is_the_fastest_non_inferior_candidate_within_the_slo():
    cands = [
        Scored("fast_but_worse", 0.60, -0.30, 200, 100),
        Scored("fast_ok", 0.79, -0.02, 300, 150),
        Scored("faster_ok", 0.78, -0.025, 280, 140),
        Scored("slow_better", 0.90, 0.05, 900, 800),
    ]
    winner, reason = select_winner(cands, BASE, SelectionRule(), max_drop=0.03, slo_ttft_ms=600)
    assert winner.id == "faster_ok"
    assert "faster_ok" in reason and "168 ms" in reason and "80% warm" in reason  # 0.8 x 140 + 0.2 x 280


def test_expected_ttft_credits_a_pruned_prompt_the_warm_prediction_alone_would_not():
    # Measured on ticket_triage: pruning cut the cold prediction 639 -> 255 ms, while the warm
    # one rose 135 -> 141 ms (a shorter static prefix fills fewer 128-token cache blocks).
    base = Scored("baseline", 0.25, 0.0, ttft_cold_ms=639, ttft_warm_ms=135)
    pruned = Scored("pruned", 0.44, 0.0, ttft_cold_ms=255, ttft_warm_ms=141)
    assert select_winner([pruned], base, SelectionRule(), max_drop=0.03, slo_ttft_ms=None)[0].id == "pruned"
    assert select_winner([pruned], base, SelectionRule(ttft="warm"), max_drop=0.03, slo_ttft_ms=None)[0] is base
    assert select_winner([pruned], base, SelectionRule(warm_share=1.0), max_drop=0.03, slo_ttft_ms=None)[0] is base


def test_quality_minus_lambda_objective_trades_quality_for_ttft():
    cands = [Scored("fast_ok", 0.79, -0.02, 300, 150), Scored("slow_better", 0.90, 0.05, 900, 800)]
    rule = SelectionRule(objective="quality_minus_lambda_ttft", lam_per_ms=0.0001)
    assert select_winner(cands, BASE, rule, max_drop=0.03, slo_ttft_ms=None)[0].id == "slow_better"
    rule = SelectionRule(objective="quality_minus_lambda_ttft", lam_per_ms=0.01)
    assert select_winner(cands, BASE, rule, max_drop=0.03, slo_ttft_ms=None)[0].id == "fast_ok"


def test_no_candidate_meets_the_slo_keeps_the_baseline_and_says_why():
    cands = [Scored("fast_ok", 0.79, -0.02, 300, 150)]
    winner, reason = select_winner(cands, BASE, SelectionRule(), max_drop=0.03, slo_ttft_ms=50)
    assert winner is BASE
    assert "no candidate qualifies" in reason and "SLO" in reason and "50 ms" in reason and "keeping the baseline" in reason


def test_inferior_incomplete_and_per_request_candidates_do_not_qualify():
    cands = [
        Scored("inferior", 0.7, -0.1, 100, 50),
        Scored("partial", 0.9, 0.0, 100, 50, complete=False),
        Scored("similar", 0.9, 0.0, 100, 50, publishable=False),
    ]
    winner, reason = select_winner(cands, BASE, SelectionRule(), max_drop=0.03, slo_ttft_ms=None)
    assert winner is BASE and "baseline" in reason
    allowed = SelectionRule(allow_per_request_examples=True)
    assert select_winner(cands, BASE, allowed, max_drop=0.03, slo_ttft_ms=None)[0].id == "similar"


def test_cold_rule_uses_the_cold_prediction():
    cands = [Scored("a", 0.8, 0.0, ttft_cold_ms=700, ttft_warm_ms=100)]
    assert select_winner(cands, BASE, SelectionRule(ttft="warm"), max_drop=0.03, slo_ttft_ms=600)[0].id == "a"
    winner, reason = select_winner(cands, BASE, SelectionRule(ttft="cold"), max_drop=0.03, slo_ttft_ms=600)
    assert winner is BASE and "cold" in reason


def test_a_metric_that_scores_every_baseline_reply_zero_keeps_the_baseline():
    # SmolLM2-135M as the rubric judge of the summary task gave every reply the lowest score.
    fast = Scored("fast", 0.0, 0.0, ttft_cold_ms=100, ttft_warm_ms=50)
    winner, reason = select_winner([fast], BASE, SelectionRule(), max_drop=0.03, slo_ttft_ms=None,
                                   baseline_scores=[0.0, 0.0, 0.0])
    assert winner is BASE and "does not measure quality" in reason
    winner, _ = select_winner([fast], BASE, SelectionRule(), max_drop=0.03, slo_ttft_ms=None,
                              baseline_scores=[0.0, 1.0, 0.0])
    assert winner.id == "fast"


def test_selection_rule_validates_its_fields():
    with pytest.raises(ValueError, match="warm_share"):
        SelectionRule(warm_share=1.5)
    with pytest.raises(ValueError, match="objective"):
        SelectionRule(objective="fastest")
    with pytest.raises(ValueError, match="ttft"):
        SelectionRule(ttft="hot")


# --- token budget ------------------------------------------------------------------------

def test_token_budget_is_p95_plus_15_percent_rounded_up():
    tokens = list(range(1, 101))  # p95 = 95.05
    tb = token_budget(tokens)
    assert tb.max_tokens == math.ceil(95.05 * 1.15) == 110
    assert tb.truncation_rate == 0.0


def test_token_budget_rounds_exact_products_without_float_noise():
    assert token_budget([20] * 10).max_tokens == 23  # 20 * 1.15 must not become 24


def test_token_budget_reports_the_truncation_it_would_have_had():
    tokens = [10] * 18 + [100, 200]
    tb = token_budget(tokens)
    assert tb.max_tokens == math.ceil(np.percentile(tokens, 95) * 1.15)
    assert tb.truncation_rate == pytest.approx(np.mean(np.array(tokens) > tb.max_tokens))
    cut = token_budget([5, 5, 5, 40], truncated=[False, False, False, True])
    assert cut.already_truncated_rate == 0.25 and cut.truncation_rate == 0.25
    with pytest.raises(ValueError):
        token_budget([])


def test_warm_cached_tokens_counts_whole_blocks_and_never_the_last_token():
    assert warm_cached_tokens(300, 400, 128) == 256
    assert warm_cached_tokens(100, 400, 128) == 0
    assert warm_cached_tokens(256, 256, 128) == 128
    assert warm_cached_tokens(40, 100, 16) == 32


# --- successive halving ------------------------------------------------------------------

def _report(n: int, value: float) -> EvalReport:
    return EvalReport("s", [str(i) for i in range(n)], [value] * n, ["x"] * n, [None] * n, generation_calls=n)


def test_successive_halving_keeps_the_best_third_and_reaches_the_full_split():
    quality = {f"c{i}": i / 10 for i in range(9)}
    cands = [OptCandidate(cid, "original", "fixed", 1, None, prediction={"ttft_warm_ms": 100.0}) for cid in quality]
    records = [{"id": str(i)} for i in range(27)]
    calls = []

    def evaluate(c, recs):
        calls.append((c.id, len(recs)))
        c.add(_report(len(recs), quality[c.id]), [])

    key = lambda c: (-(c.mean or 0), c.id)  # noqa: E731
    alive, stop = successive_halving(cands, records, [3, 9, 27], evaluate, key, eta=3)
    assert stop is None
    assert [c.id for c in alive] == ["c8"]
    assert alive[0].n == 27
    assert sum(n for _, n in calls) == 9 * 3 + 3 * 6 + 1 * 18


def test_successive_halving_trims_to_what_the_budget_affords():
    cands = [OptCandidate(f"c{i}", "original", "fixed", 1, None) for i in range(6)]
    records = [{"id": str(i)} for i in range(12)]

    def evaluate(c, recs):
        c.add(_report(len(recs), int(c.id[1:]) / 10), [])

    left = {"calls": 6 * 4 + 4}  # the first rung, then one candidate of the second

    def affordable(n, n_records):
        can = min(n, left["calls"] // n_records)
        left["calls"] -= can * n_records
        return can

    alive, stop = successive_halving(cands, records, [4, 8, 12], evaluate, lambda c: (-(c.mean or 0), c.id),
                                     eta=2, affordable=affordable)
    assert stop is not None and "budget" in stop
    assert [(c.id, c.n) for c in alive] == [("c5", 8)]
    left["calls"] = 0
    fresh = [OptCandidate(f"d{i}", "original", "fixed", 1, None) for i in range(2)]
    alive, stop = successive_halving(fresh, records, [4, 8, 12], evaluate, lambda c: c.id, affordable=affordable)
    assert "could not start" in stop and all(c.n == 0 for c in alive)


# --- example strategies ------------------------------------------------------------------

@pytest.fixture(scope="module")
def triage():
    from promptdistill.specs.datasets import dataset_for, records
    from promptdistill.specs import load_spec

    spec = load_spec("ticket_triage")
    df = dataset_for(spec)
    return spec, records(df, "train"), records(df, "dev")


def test_fixed_subsets_start_with_the_spec_rule_and_are_distinct(triage):
    from promptdistill.optimize import fixed_subsets
    from promptdistill.specs import select_examples

    spec, train, _ = triage
    subsets = fixed_subsets(spec, train, 4, n_subsets=3, seed=0)
    assert len(subsets) == 3
    assert [r["id"] for r in subsets[0][1]] == [r["id"] for r in select_examples(spec, train, 4, 0)]
    assert len({tuple(sorted(r["id"] for r in recs)) for _, recs in subsets}) == 3
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


def test_per_request_examples_sit_after_the_static_prefix(triage, tokenizer):
    from promptdistill.ttft.features import prompt_features
    from promptdistill.optimize import SimilarExamples, per_request_spec
    from promptdistill.optimize.examples import fixed_spec, with_fewshot

    spec, train, dev = triage
    sim = SimilarExamples(spec, train).fit()
    dynamic = per_request_spec(spec)
    rec = with_fewshot(spec, dev[:1], sim, 4)[0]
    shots = [t for t in train if t["id"] in rec["fewshot_ids"]]
    shots.sort(key=lambda t: rec["fewshot_ids"].index(t["id"]))
    fixed = fixed_spec(spec, shots)
    f_dyn = prompt_features(dynamic, rec["inputs"], tokenizer)
    f_fix = prompt_features(fixed, dev[0]["inputs"], tokenizer, examples=shots)
    # Same examples, same text length roughly; but only the fixed set is in the cacheable prefix.
    assert abs(f_dyn["total_tokens"] - f_fix["total_tokens"]) < 15
    assert f_fix["static_prefix_tokens"] - f_dyn["static_prefix_tokens"] > 0.8 * f_fix["fewshot_tokens"]
    assert "{fewshot}" in dynamic.user and "fewshot" in dynamic.inputs and dynamic.examples.count == 0


def test_instruction_variants_dedupe_and_keep_the_rest_of_the_spec(triage):
    spec, _, _ = triage
    short = spec.with_changes(instruction="Route the ticket to one team.", user="Other: {ticket}")
    same = spec.with_changes(examples=spec.examples)
    out = instruction_variants(spec, [("short", short), ("same", same), ("short2", short)], max_variants=5)
    assert [vid for vid, _ in out] == ["original", "short"]
    assert out[1][1].instruction == "Route the ticket to one team." and out[1][1].user == spec.user


def test_optimize_budget_validates():
    from promptdistill.optimize import OptimizeBudget

    with pytest.raises(ValueError, match="fewshot_counts"):
        OptimizeBudget(fewshot_counts=(0, 9))
    with pytest.raises(ValueError, match="eta"):
        OptimizeBudget(eta=1)


# --- plumbing on the FakeEngine (not a claim about the real model) ---------------------------

_KEYWORDS = {"billing": ("charge", "refund", "invoice", "coupon", "receipt", "payment", "price"),
             "shipping": ("deliver", "parcel", "tracking", "courier", "package", "address"),
             "account": ("password", "login", "log in", "email", "username", "verif", "two-factor", "delete")}


def _triage_reply(req):
    text = req.chat()[-1]["content"].lower().rsplit("ticket:", 1)[-1]
    label = next((lab for lab, words in _KEYWORDS.items() if any(w in text for w in words)), "technical")
    return json.dumps({"label": label})


@pytest.fixture()
def fake_run(tmp_path, triage):
    from fakes import FAKE_IDENTITY, FakeEngine

    from promptdistill.optimize import OptimizeBudget, optimize
    from promptdistill.ttft.estimators import LINEAR_TERMS, MODEL_FEATURES, MonomialRegressor
    from promptdistill.ttft.model import TTFTModel

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(10, 1500, 80), rng.choice([0, 128, 256], 80), rng.integers(0, 8, 80),
                         rng.uniform(0.3, 0.8, 80), rng.uniform(5, 9, 80)])
    y = 50 + 0.4 * X[:, 0] + 0.02 * X[:, 1]
    model = TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, y), "monomial", "linear", FAKE_IDENTITY)
    assert len(MODEL_FEATURES) == X.shape[1]
    spec, _, _ = triage
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    budget = OptimizeBudget(max_lm_calls=400, dev_size=12, minibatch_size=4, test_size=8, fewshot_counts=(0, 2),
                            similar_counts=(2,), timing_records=2)
    engine = FakeEngine(reply=_triage_reply)
    result = optimize(engine, spec, ttft_model=model, budget=budget, distill_candidates=[("short", short)])
    return result, engine


def test_optimize_plumbing_on_the_fake_engine(fake_run, tmp_path):
    result, engine = fake_run
    df = result.candidates
    assert set(df["strategy"]) == {"baseline", "none", "fixed", "similar"}
    assert engine.calls == result.lm_calls + result.timing_requests
    assert result.lm_calls <= result.budget.max_lm_calls
    # Every answer is right, so every complete candidate is non-inferior: the fastest wins.
    complete = df[df["complete"] & df["publishable"]]
    assert result.winner_id == complete.sort_values("ttft_warm_ms")["candidate_id"].iloc[0]
    # Per-request examples are not cacheable: their warm saving is below the fixed ones'.
    trade = result.tradeoff.set_index(["strategy", "k"])
    assert trade.loc[("similar", 2), "warm_cached_tokens"] < trade.loc[("fixed", 2), "warm_cached_tokens"]
    assert result.content["max_tokens"] == result.token_budget.max_tokens
    assert result.content["response_format"] == "json_schema"
    assert {"free", "schema_in_prompt", "constrained"} == set(result.formats["format"])
    paths = result.write(tmp_path / "out")
    assert pd.read_parquet(paths["candidates"]).shape[0] == len(df)
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(paths["result"].read_text())["winner_id"] == result.winner_id
    summary = result.to_summary()
    assert "Winner:" in summary and result.winner_id in summary
    print(summary)


def test_published_template_renders_what_was_verified(fake_run, tmp_path, triage):
    from promptdistill.client import Templates
    from promptdistill.registry import Registry
    from promptdistill.specs import spec_messages

    result, _ = fake_run
    spec, _, dev = triage
    record = result.publish(Registry(tmp_path / "reg"))
    assert record.provenance["dataset"]["sha256"] and record.provenance["engine"]["model"] == "fake"
    assert record.metrics["winner_dev_mean"] == pytest.approx(result.winner["dev_mean"])
    t = Templates(str(tmp_path / "reg")).get(f"{spec.name}@candidate")
    inputs = dev[0]["inputs"]
    assert t.render(inputs) == spec_messages(result.winner_spec, inputs, examples=result.winner_examples)
    assert t.max_tokens == result.token_budget.max_tokens


# --- CLI ---------------------------------------------------------------------------------

def test_cli_registers_optimize_with_its_options():
    from promptdistill.cli import build_parser

    args = build_parser().parse_args(["optimize", "ticket_triage", "--budget-calls", "500", "--budget-minutes", "3",
                                      "--seed", "2", "--publish"])
    assert args.func.__name__ == "_optimize"
    assert (args.budget_calls, args.budget_minutes, args.seed, args.publish) == (500, 3.0, 2, True)


def test_cli_without_a_ttft_model_says_how_to_make_one(tmp_path, monkeypatch):
    from promptdistill.cli.optimize import find_ttft_model
    from promptdistill.core.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="promptdistill ttft fit"):
        find_ttft_model(None, tmp_path / ".promptdistill")
    (tmp_path / "artifacts/ttft/models").mkdir(parents=True)
    (tmp_path / "artifacts/ttft/models/LATEST").write_text("v1\n")
    assert find_ttft_model(None, tmp_path / ".promptdistill").name == "models"


def test_cli_rejects_a_bad_budget():
    from promptdistill.cli import main

    assert main(["optimize", "ticket_triage", "--budget-calls", "0"]) == 1


def test_a_winner_that_fails_on_test_is_reverted_to_the_baseline(triage):
    """A candidate as good as the baseline on dev but worse on test must not be published."""
    from fakes import FAKE_IDENTITY, FakeEngine

    from promptdistill.optimize import OptimizeBudget, optimize
    from promptdistill.ttft.estimators import LINEAR_TERMS, MonomialRegressor
    from promptdistill.ttft.model import TTFTModel

    spec, _, dev = triage
    dev_tickets = {r["inputs"]["ticket"] for r in dev}

    def reply(req):
        system, user = req.chat()[0]["content"], req.chat()[-1]["content"]
        if "Which answer is better" in user:
            return json.dumps({"verdict": "same"})
        right = json.loads(_triage_reply(req))["label"]
        ticket = user.rsplit("Ticket: ", 1)[-1]
        if system.startswith(spec.instruction.strip()[:40]) or ticket in dev_tickets:
            return json.dumps({"label": right})
        return json.dumps({"label": "technical" if right != "technical" else "billing"})

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(10, 1500, 60), np.zeros(60), rng.integers(0, 8, 60),
                         rng.uniform(0.3, 0.8, 60), rng.uniform(5, 9, 60)])
    model = TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, 50 + 0.4 * X[:, 0]), "monomial", "linear", FAKE_IDENTITY)
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    budget = OptimizeBudget(max_lm_calls=400, dev_size=8, minibatch_size=4, test_size=8, fewshot_counts=(0,),
                            similar_counts=(), timing_records=0, formats=False)
    result = optimize(FakeEngine(reply=reply), spec, ttft_model=model, budget=budget, distill_candidates=[("short", short)])
    assert result.kept_baseline and result.winner_id == "baseline"
    assert "REVERTED on test" in result.reason and result.verification["reverted_from"] == "short/none"
    assert result.winner["test_mean"] == result.baseline["test_mean"]


def test_a_budget_too_small_for_baseline_and_verification_is_refused(triage):
    from fakes import FAKE_IDENTITY, FakeEngine

    from promptdistill.core.errors import ConfigError
    from promptdistill.optimize import OptimizeBudget, optimize
    from promptdistill.ttft.estimators import LINEAR_TERMS, MonomialRegressor
    from promptdistill.ttft.model import TTFTModel

    spec, _, _ = triage
    X = np.column_stack([np.linspace(10, 900, 20), np.zeros(20), np.zeros(20), np.full(20, 0.5), np.linspace(5, 9, 20)])
    model = TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, 50 + 0.4 * X[:, 0]), "monomial", "linear", FAKE_IDENTITY)
    engine = FakeEngine(reply=_triage_reply)
    with pytest.raises(ConfigError, match="max_lm_calls: 30 is too small for ticket_triage"):
        optimize(engine, spec, ttft_model=model, budget=OptimizeBudget(max_lm_calls=30, dev_size=10, test_size=10))
    assert engine.calls == 0


def test_predictions_are_clipped_at_the_physical_floor():
    from promptdistill.optimize.predict import MIN_TTFT_MS, clip_ttft

    assert clip_ttft([-44.0, 0.2, 250.0]).tolist() == [MIN_TTFT_MS, MIN_TTFT_MS, 250.0]

"""The distillation loop: halving, selection, budget, protection, determinism, records."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bundled_specs import load_spec
from fakes import FakeEngine
from promptdistill.distill.clauses import Clause, split_clauses
from promptdistill.distill import DistillConfig, distill, split_records
from promptdistill.search.racing import (
    Candidate,
    ClauseScore,
    agreement_rate,
    prune_keep_sets,
    rung_sizes,
    select_winner,
    successive_halving,
)
from promptdistill.evaluate import EvalReport

MAIN_RULE = "If a ticket mentions more than one problem"


# --- pure parts ----------------------------------------------------------------------------


def test_rung_sizes():
    assert rung_sizes(8, 30) == [8, 16, 30]
    assert rung_sizes(8, 8) == [8]
    assert rung_sizes(8, 5) == [5]
    assert rung_sizes(4, 40, eta=3) == [4, 12, 36, 40]
    with pytest.raises(ValueError):
        rung_sizes(0, 10)


def report(scores, name="s"):
    return EvalReport(name, [str(i) for i in range(len(scores))], list(scores), ["r"] * len(scores),
                      [True] * len(scores), generation_calls=len(scores))


def cand(cid, tokens, quality):
    c = Candidate(cid, "prune:x", 1, spec=None, instruction_tokens=tokens)
    c.quality = quality  # type: ignore[attr-defined]
    return c


def test_successive_halving_evaluates_prefixes_and_keeps_the_best_half():
    records = list(range(16))
    cands = [cand("short-bad", 10, 0.0), cand("short-good", 20, 1.0), cand("long-good", 90, 1.0), cand("mid", 50, 0.8)]
    calls = []

    def evaluate_fn(alive, recs, last):
        calls.append(([c.id for c in alive], list(recs), last))
        return [report([c.quality] * len(recs)) for c in alive]

    alive, cut = successive_halving(cands, records, [4, 8, 16], evaluate_fn, base_scores=[1.0] * 16, max_drop=0.05)
    assert not cut
    assert calls[0] == ([c.id for c in cands], [0, 1, 2, 3], False)
    assert calls[1][1] == [4, 5, 6, 7] and calls[2][1] == list(range(8, 16)) and calls[2][2]
    # Feasible first, then shorter: short-good and long-good survive rung 0; short-good wins.
    assert calls[1][0] == ["short-good", "long-good"]
    assert [c.id for c in alive] == ["short-good"]
    assert alive[0].report.n == 16 and alive[0].rung == 2 and alive[0].lm_calls == 16
    assert cands[0].rung == 0 and cands[0].report.n == 4


def test_successive_halving_stops_when_the_budget_cannot_pay():
    cands = [cand("a", 10, 1.0), cand("b", 20, 1.0)]
    alive, cut = successive_halving(
        cands, list(range(8)), [4, 8], lambda alive, recs, last: [report([1.0] * len(recs)) for _ in alive],
        base_scores=[1.0] * 8, max_drop=0.0, can_afford=lambda n, r, last: not last,
    )
    assert cut and all(c.report.n == 4 for c in cands)


def test_select_winner_takes_the_shortest_feasible_full_candidate():
    current = cand("base", 100, 0.5)
    current.report = report([0.5] * 8)
    fine = cand("fine", 40, 0.5)
    fine.report = report([0.5] * 8)
    too_bad = cand("too_bad", 10, 0.0)
    too_bad.report = report([0.0] * 8)
    partial = cand("partial", 5, 1.0)
    partial.report = report([1.0] * 4)
    assert select_winner(current, [too_bad, fine, partial], [0.5] * 8, 0.05) is fine
    assert select_winner(current, [too_bad, partial], [0.5] * 8, 0.05) is current
    better = cand("better", 100, 0.9)
    better.report = report([0.9] * 8)
    assert select_winner(current, [better], [0.5] * 8, 0.05) is better


def clause(cid, protected=False):
    return Clause(cid, f"text {cid}", "instruction", int(cid[1:]), " ", protected, "p" if protected else None)


def test_prune_keep_sets_and_agreement():
    scores = [
        ClauseScore(clause("i0"), judge_score=5, ablation_delta=-0.2),
        ClauseScore(clause("i1"), judge_score=1, ablation_delta=0.0),
        ClauseScore(clause("i2"), judge_score=None, ablation_delta=0.1),  # invalid judge reply
        ClauseScore(clause("i3", protected=True)),
    ]
    sets = prune_keep_sets(scores, (0.5,))
    assert sets["judge@0.50"] == ("i0", "i2", "i3")  # no judge score: kept
    assert sets["ablation"] == ("i0", "i3")
    assert "combined@0.50" not in sets  # it keeps the same set as "ablation": listed once
    assert prune_keep_sets(scores, (0.2,))["combined@0.20"] == ("i0", "i1", "i3")
    assert agreement_rate(scores) == 1.0  # i0: both necessary; i1: both not


# --- the loop on a scripted engine ---------------------------------------------------------


@pytest.fixture(scope="module")
def triage():
    spec = load_spec("ticket_triage")
    dev, test, examples = split_records(spec, DistillConfig(dev_size=12, test_size=6))
    return spec, dev, test, examples


def triage_engine(dev_and_test, judge_scores=None):
    """Answers right only while the 'main problem' rule is in the system text.

    The necessity judge gives 5 to that rule and 1 to everything else (or ``judge_scores``).
    """
    truth = {r["inputs"]["ticket"]: r["expected"]["label"] for r in dev_and_test}

    def reply(req):
        props = (req.schema or {}).get("properties", {})
        user = req.chat()[-1]["content"]
        if "reason" in props:
            clause = user.split("Marked clause: ", 1)[1].split("\n", 1)[0]
            score = (judge_scores or {}).get(clause[:20], 5 if clause.startswith(MAIN_RULE) else 1)
            return json.dumps({"score": score, "reason": "scripted"})
        if "verdict" in props:
            return json.dumps({"verdict": "A"})
        if "instruction" in props:
            return json.dumps({"instruction": "Route tickets."})
        ticket = user.removeprefix("Ticket: ")
        right = MAIN_RULE in req.chat()[0]["content"]
        return json.dumps({"label": truth.get(ticket, "billing") if right else "billing"})

    return FakeEngine(reply)


def small(**kw):
    return DistillConfig(**{"dev_size": 12, "test_size": 6, "minibatch_size": 4, **kw})


def test_distill_prunes_what_is_not_needed_and_keeps_what_is(triage):
    spec, dev, test, examples = triage
    result = distill(triage_engine(dev + test), spec, config=small(), dev=dev, test=test, examples=examples)
    winner = result.winner.spec.instruction_text()
    assert MAIN_RULE in winner
    assert result.winner.instruction_tokens < result.original.instruction_tokens
    assert result.token_reduction > 0.3
    assert result.dev_delta is not None and result.dev_delta >= -result.max_quality_drop
    assert result.test_delta == 0.0
    main = [r for r in result.clause_rows if r["round"] == 1 and r["text"].startswith(MAIN_RULE)][0]
    assert main["judge_score"] == 5 and main["ablation_delta"] < 0 and main["kept"]
    assert result.agreement_rate == 1.0
    assert result.calibration["n"] == 12 and result.calibration["swap_consistency"] == 0.0
    assert spec == load_spec("ticket_triage")  # the input is not changed


def test_protected_clauses_are_in_every_candidate(triage):
    spec, dev, test, examples = triage
    protected = [c.text for c in split_clauses(spec) if c.protected]
    result = distill(triage_engine(dev + test, judge_scores={}), spec, config=small(thresholds=(0.25, 0.5, 1.0)),
                     dev=dev, test=test, examples=examples)
    assert len(result.candidates) > 3
    for c in result.candidates:
        for text in protected:
            assert text in c.text, (c.id, text)


def test_a_candidate_without_a_needed_rule_is_caught_by_evaluation(triage):
    spec, dev, test, examples = triage
    # The judge calls the needed rule useless: only evaluation can save it.
    engine = triage_engine(dev + test, judge_scores={MAIN_RULE[:20]: 1})
    result = distill(engine, spec, config=small(ablation=False, rewrite=False), dev=dev, test=test, examples=examples)
    rows = pd.DataFrame(result.candidate_rows())
    dropped = rows[~rows["text"].str.contains(MAIN_RULE)]
    assert len(dropped) > 0
    assert not dropped["feasible"].any() and not dropped["winner"].any()
    assert MAIN_RULE in result.winner.text


@pytest.mark.parametrize("budget", [5, 20, 45, 90, 400])
def test_the_search_never_exceeds_its_lm_call_budget(triage, budget):
    spec, dev, test, examples = triage
    engine = triage_engine(dev + test)
    result = distill(engine, spec, config=small(max_lm_calls=budget, calibrate=False), dev=dev, test=test, examples=examples)
    assert result.search_lm_calls <= budget
    assert engine.calls == result.total_lm_calls
    if budget < 45:
        assert result.stop_reason.startswith("budget")


def test_the_time_budget_stops_the_search(triage):
    spec, dev, test, examples = triage
    result = distill(triage_engine(dev + test), spec, config=small(max_minutes=1e-9, calibrate=False),
                     dev=dev, test=test, examples=examples)
    assert result.stop_reason.startswith("budget: time")
    assert result.search_lm_calls == 0 and result.winner is result.original


def test_the_time_budget_is_kept_by_projection(triage):
    """Steps that would end after the deadline (at the seconds per call seen) do not start."""
    import time as _time

    spec, dev, test, examples = triage
    engine = triage_engine(dev + test)
    reply = engine.reply
    engine.reply = lambda req: (_time.sleep(0.02), reply(req))[1]
    budget_s = 1.5
    distill(triage_engine(dev + test), spec, config=small(), dev=dev, test=test, examples=examples)  # warm imports
    result = distill(engine, spec, config=small(max_minutes=budget_s / 60, test_size=0, calibrate=False, max_rounds=5),
                     dev=dev, test=[], examples=examples)
    assert result.stop_reason.startswith("budget")
    assert result.elapsed_s < 2 * budget_s
    assert result.search_lm_calls > 0


def test_same_seed_same_result_and_parquet_records(triage, tmp_path):
    spec = triage[0]
    a = distill(triage_engine(triage[1] + triage[2]), spec, config=small(seed=3))
    b = distill(triage_engine(triage[1] + triage[2]), spec, config=small(seed=3))
    assert a.candidate_rows() == b.candidate_rows() and a.clause_rows == b.clause_rows
    c = distill(triage_engine(triage[1] + triage[2]), spec, config=small(seed=4))
    assert c.original.report.record_ids != a.original.report.record_ids
    path = a.write(tmp_path / "out" / "triage.parquet")
    frame = pd.read_parquet(path)
    assert len(frame) == len(a.candidates) and frame["winner"].sum() == 1
    for col in ("text", "instruction_tokens", "density", "dev_mean", "minibatch_mean", "lm_calls", "feasible"):
        assert col in frame.columns
    clauses = pd.read_parquet(tmp_path / "out" / "triage.clauses.parquet")
    assert {"judge_score", "ablation_delta", "kept", "protected"} <= set(clauses.columns)
    judges = pd.read_parquet(tmp_path / "out" / "triage.judges.parquet")
    assert set(judges["judge"]) >= {"clause_necessity", "answer_equivalence"}
    assert not list((tmp_path / "out").glob(".*tmp"))


def test_rewrite_check_rejects_unusable_rewrites():
    from promptdistill.distill import _rewrite_check

    assert _rewrite_check({"instruction": "Route the ticket to one team."}) is None
    assert "empty" in _rewrite_check({"instruction": "  "})
    assert "braces" in _rewrite_check({"instruction": "Reply with {label}."})
    assert "mid-sentence" in _rewrite_check({"instruction": "Route the ticket to one"})
    loop = "If you have many labels, pick one. " * 3
    assert "repeats" in _rewrite_check({"instruction": loop.strip()})


def test_config_rejects_nonsense():
    with pytest.raises(ValueError, match="thresholds"):
        DistillConfig(thresholds=(1.5,))
    with pytest.raises(ValueError, match="max_lm_calls"):
        DistillConfig(max_lm_calls=0)


FACTS_RULE = "It is very important that you only write things"


def test_judge_scored_specs_are_also_compared_with_the_baseline():
    """summarize: the rubric judge cannot tell the difference, answer_equivalence can."""
    spec = load_spec("summarize")

    def reply(req):
        props = (req.schema or {}).get("properties", {})
        user = req.chat()[-1]["content"]
        if "summary" in props:
            good = FACTS_RULE in req.chat()[0]["content"]
            return json.dumps({"summary": "GOOD" if good else "BAD", "key_points": ["a", "b"], "confidence_score": 0.5})
        if "reason" in props:
            return json.dumps({"score": 1, "reason": "scripted"})
        if "verdict" in props:
            a = "GOOD" in user.split("Answer A:", 1)[1].split("Answer B:", 1)[0]
            b = "GOOD" in user.split("Answer B:", 1)[1]
            return json.dumps({"verdict": "same" if a == b else "A" if a else "B"})
        if "instruction" in props:
            return json.dumps({"instruction": "Summarise the notes."})
        return json.dumps({"score": 4})  # rubric_score: blind

    result = distill(FakeEngine(reply), spec, config=small(ablation=False, rewrite=False, thresholds=(0.5,)))
    assert FACTS_RULE in result.winner.text
    rows = pd.DataFrame(result.candidate_rows())
    full = rows[(rows["n_evaluated"] == 12) & (rows["origin"] != "baseline")]
    assert len(full) > 0
    assert (full["dev_mean"] == 0.75).all()  # the rubric judge saw no difference
    assert (full["equivalence"] == 0.0).all() and not full["feasible"].any()
    assert result.calibration is None  # no programmatic metric to calibrate against



def test_cli_parses_budgets_and_prints_every_table(triage):
    from promptdistill.cli import build_parser
    from promptdistill.cli.distill import _config, format_result

    args = build_parser().parse_args(["distill", "ticket_triage", "--budget-calls", "50", "--dev", "10", "--no-rewrite"])
    config = _config(args)
    assert (config.max_lm_calls, config.dev_size, config.rewrite, config.ablation) == (50, 10, False, True)
    bad = build_parser().parse_args(["distill", "x", "--budget-calls", "0"])
    from promptdistill.core.errors import ConfigError

    with pytest.raises(ConfigError, match="max_lm_calls"):
        _config(bad)
    spec, dev, test, examples = triage
    result = distill(triage_engine(dev + test), spec, config=small(), dev=dev, test=test, examples=examples)
    text = format_result(result)
    for heading in ("Clauses", "Candidates", "Winner: ", "% fewer", "test quality", "Judges", "Calibration"):
        assert heading in text
    assert "pruned" in text and "<- winner" in text


# --- the real engine -----------------------------------------------------------------------
# One tiny run (zero-shot, 4 dev records) shared by the tests below, and a second identical
# run for the determinism check: a few dozen LM calls each.

# Only the LM-call budget may bind here: a time budget that binds would make runs differ.
REAL = dict(dev_size=3, minibatch_size=2, test_size=1, thresholds=(0.5,), max_lm_calls=24, max_rounds=2,
            max_minutes=120.0, rewrite=False, calibrate=False, seed=0)


@pytest.fixture(scope="module")
def real_run(engine):
    spec = load_spec("ticket_triage")
    return spec, distill(engine, spec, config=DistillConfig(**REAL), examples=[])


@pytest.mark.engine
def test_real_run_judge_replies_are_valid_or_recorded_invalid(real_run):
    _, result = real_run
    stats = {row["judge"]: row for row in result.judge_stats}
    assert "clause_necessity" in stats
    for row in stats.values():
        assert row["valid"] + row["invalid"] == row["items"] > 0
        assert row["items"] <= row["calls"] <= 2 * row["items"]
    for row in result.clause_rows:
        if row["protected"]:
            continue
        # a judge score is 1-5 exactly when the reply was valid; otherwise the error is kept
        assert (row["judge_score"] in range(1, 6)) != bool(row["judge_error"]) or row["judge_score"] is None


@pytest.mark.engine
def test_real_run_keeps_protected_clauses_and_its_budget(real_run):
    spec, result = real_run
    protected = [c.text for c in split_clauses(spec) if c.protected]
    assert len(result.candidates) >= 2
    for c in result.candidates:
        for text in protected:
            assert text in c.text
    assert result.search_lm_calls <= REAL["max_lm_calls"]
    assert result.winner.instruction_tokens <= result.original.instruction_tokens
    assert result.stop_reason


@pytest.mark.engine
def test_real_run_same_seed_same_result(engine, real_run):
    spec, first = real_run
    second = distill(engine, spec, config=DistillConfig(**REAL), examples=[])
    assert second.candidate_rows() == first.candidate_rows()
    assert second.clause_rows == first.clause_rows
    assert second.winner.text == first.winner.text

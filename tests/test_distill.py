"""The distillation loop: screening, the race, selection, budget, protection, determinism, records."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bundled_specs import load_spec
from fakes import FakeEngine
from promptdistill.distill import DistillConfig, distill
from promptdistill.distill.candidates import ClauseScore, agreement_rate, prune_keep_sets
from promptdistill.specs.clauses import Clause, split_clauses
from promptdistill.search.splits import split_records

MAIN_RULE = "If a ticket mentions more than one problem"


# --- pure parts ----------------------------------------------------------------------------


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


SIZES = dict(screen_size=8, dev_size=128, test_size=6)
"""Large enough for the race to certify a scripted candidate that answers exactly like the
original (no discordant record) at a 0.1 margin; the scripted engine answers in microseconds."""


@pytest.fixture(scope="module")
def triage():
    spec = load_spec("ticket_triage")
    splits = split_records(spec, seed=0, **SIZES)
    return spec, splits


def triage_engine(dev_and_test, judge_scores=None):
    """Answers right only while the 'main problem' rule is in the system text.

    The necessity judge gives 5 to that rule and 1 to everything else (or ``judge_scores``).
    """
    truth = {r["inputs"]["ticket"]: r["expected"]["label"] for r in dev_and_test}

    def reply(req):
        props = (req.schema or {}).get("properties", {})
        user = req.chat()[-1]["content"]
        if "reason" in props:
            if "Marked clause: " not in user:  # the repair of an invalid reply: invalid again
                return json.dumps({"score": 9, "reason": "scripted"})
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
    return DistillConfig(**{**SIZES, "max_quality_drop": 0.1, "max_lm_calls": 3000, **kw})


def records(splits):
    return splits.dev + splits.test


def test_distill_prunes_what_is_not_needed_and_keeps_what_is(triage):
    spec, splits = triage
    result = distill(triage_engine(records(splits)), spec, config=small(ablate_clear=True), splits=splits)
    winner = result.winner.spec.instruction_text()
    assert MAIN_RULE in winner
    assert result.winner.instruction_tokens < result.original.instruction_tokens
    assert result.token_reduction > 0.3
    assert result.winner.decision.verdict == "non-inferior" and result.winner.decision.lower > -0.1
    assert result.winner.id in result.finalists and "certified non-inferior" in result.reason
    assert result.test["winner"].mean == result.test["original"].mean
    main = [r for r in result.clause_rows if r["round"] == 1 and r["text"].startswith(MAIN_RULE)][0]
    assert main["judge_score"] == 5 and main["ablation_delta"] < 0 and main["kept"]
    assert result.agreement_rate == 1.0
    assert result.calibration["n"] == 8 and result.calibration["swap_consistency"] == 0.0
    assert spec == load_spec("ticket_triage")  # the input is not changed


def test_a_distilled_winner_that_fails_on_test_is_reverted_as_the_optimizer_would(triage):
    """The distiller checks its winner on the test split with the optimizer's function: a
    shorter instruction certified on dev but wrong on every test record is not the winner."""
    spec, splits = triage
    engine = triage_engine(records(splits))
    test_tickets = {r["inputs"]["ticket"] for r in splits.test}
    every_clause = [c.text for c in split_clauses(spec)]
    dev_reply = engine.reply

    def reply(req):
        system, user = req.chat()[0]["content"], req.chat()[-1]["content"]
        label = json.loads(dev_reply(req)).get("label")
        if label is not None and user.removeprefix("Ticket: ") in test_tickets \
                and not all(c in system for c in every_clause):
            return json.dumps({"label": "technical" if label != "technical" else "billing"})
        return dev_reply(req)

    engine.reply = reply
    result = distill(engine, spec, config=small(max_rounds=1, calibrate=False), splits=splits)
    chosen = result.selection
    assert chosen.kept and chosen.reverted_from is not None and chosen.chosen_clause == "faster"
    assert result.winner is result.original and "REVERTED on test" in result.reason
    assert f"{chosen.reverted_from} scored -1.000 against the baseline on 6 records (allowed drop 0.1)" in result.reason
    assert result.test["reverted"].mean == 0.0 and result.test["winner"].mean == result.test["original"].mean == 1.0
    assert result.summary()["selection"]["reverted_from"] == chosen.reverted_from
    assert "all 6 records in one look" in result.test_stop


def test_ablation_spends_records_only_where_the_judge_is_unsure(triage):
    spec, splits = triage
    prunable = [c for c in split_clauses(spec) if not c.protected]
    others = [c for c in prunable if not c.text.startswith(MAIN_RULE)]
    # The last clause is unsure (a misaligned ablation would land on an earlier one), the
    # first gets a score outside the scale (invalid twice: no score); the main rule gets 5
    # and the rest 1: clear.
    unsure, unscored = others[-1], others[0]
    scores = {unsure.text[:20]: 3, unscored.text[:20]: 9}
    runs = {}
    for clear in (False, True):
        engine = triage_engine(records(splits), judge_scores=scores)
        result = distill(engine, spec, config=small(ablate_clear=clear, rewrite=False), splits=splits)
        rows = [r for r in result.clause_rows if r["round"] == 1 and not r["protected"]]
        runs[clear] = (result, {r["clause_id"] for r in rows if r["ablation_delta"] is not None}, engine.calls)
    (lean, lean_ablated, lean_calls), (_, full_ablated, full_calls) = runs[False], runs[True]
    assert lean_ablated == {unsure.id, unscored.id}
    assert [r["judge_score"] for r in lean.clause_rows if r["round"] == 1 and r["clause_id"] == unscored.id] == [None]
    assert full_ablated == {c.id for c in prunable}
    # Each skipped ablation is one screen evaluation fewer (the rest of the run may differ).
    assert full_calls - lean_calls >= (len(prunable) - 2) * SIZES["screen_size"]
    assert MAIN_RULE in lean.winner.text and lean.winner.decision.verdict == "non-inferior"


def test_protected_clauses_are_in_every_candidate(triage):
    spec, splits = triage
    protected = [c.text for c in split_clauses(spec) if c.protected]
    result = distill(triage_engine(records(splits), judge_scores={}), spec, config=small(thresholds=(0.25, 0.5, 1.0)),
                     splits=splits)
    assert len(result.candidates) >= 3
    for c in result.candidates:
        for text in protected:
            assert text in c.text, (c.id, text)


def test_a_candidate_without_a_needed_rule_is_caught_by_screening(triage):
    spec, splits = triage
    # The judge calls the needed rule useless: only evaluation can save it.
    engine = triage_engine(records(splits), judge_scores={MAIN_RULE[:20]: 1})
    result = distill(engine, spec, config=small(ablation=False, rewrite=False), splits=splits)
    rows = pd.DataFrame(result.candidate_rows())
    dropped = rows[~rows["text"].str.contains(MAIN_RULE)]
    assert len(dropped) > 0
    assert not dropped["finalist"].any() and not dropped["winner"].any()
    assert dropped["notes"].str.contains("below -0.1").all()
    assert MAIN_RULE in result.winner.text


def test_screening_only_what_could_be_chosen_changes_no_choice_and_saves_calls(triage):
    """Each round's next base and the raced finalists are the same whether every candidate
    is screened or only those that could still be chosen; the latter spends fewer calls."""
    spec, splits = triage
    prunable = [c for c in split_clauses(spec) if not c.protected]
    judge = {c.text[:20]: score for c, score in zip(prunable, [2, 3, 4, 1, 3, 2, 4])} | {MAIN_RULE[:20]: 5}
    runs = {every: distill(triage_engine(records(splits), judge_scores=judge), spec, splits=splits,
                           config=small(max_rounds=2, calibrate=False, thresholds=(0.25, 0.5, 0.75),
                                        screen_every=every)) for every in (True, False)}
    every, lazy = runs[True], runs[False]
    assert lazy.winner.id == every.winner.id and len(lazy.finalists) == 3 and lazy.finalists == every.finalists
    assert lazy.reason == every.reason and lazy.rounds == every.rounds
    assert [(r["round"], r["clause_id"], r["kept"]) for r in lazy.clause_rows] == \
        [(r["round"], r["clause_id"], r["kept"]) for r in every.clause_rows]
    assert lazy.total_lm_calls < every.total_lm_calls
    unscreened = [c for c in lazy.candidates if c.screen is None]
    assert unscreened and all(len(c.notes) == 1 and c.notes[0].startswith("screening: ") for c in unscreened)


def test_a_pool_too_small_to_certify_keeps_the_original_and_says_why(triage):
    spec, _ = triage
    splits = split_records(spec, seed=0, screen_size=8, dev_size=24, test_size=4)
    result = distill(triage_engine(records(splits)), spec, config=small(dev_size=24, test_size=4), splits=splits)
    assert result.winner is result.original
    assert result.finalists and all(c.decision.verdict == "undecided" for c in result.candidates
                                    if c.id in result.finalists)
    assert "no candidate certified" in result.reason
    assert "cannot certify" in result.plan.sentence() and result.plan.pool == 16


@pytest.mark.parametrize("budget", [5, 20, 45, 90, 400])
def test_the_run_never_exceeds_its_lm_call_budget(triage, budget):
    spec, splits = triage
    engine = triage_engine(records(splits))
    result = distill(engine, spec, config=small(max_lm_calls=budget, calibrate=False), splits=splits)
    assert result.total_lm_calls <= budget
    assert engine.calls == result.total_lm_calls
    if budget < 45:
        assert result.stop_reason.startswith("budget")


def test_the_time_cap_stops_the_search_and_says_so(triage):
    spec, splits = triage
    result = distill(triage_engine(records(splits)), spec, config=small(max_minutes=1e-9, calibrate=False),
                     splits=splits)
    assert result.stop_reason.startswith("stopped by the 1e-09-minute cap")
    assert result.search_lm_calls == 0 and result.winner is result.original


def test_a_slower_engine_reaches_the_same_result(triage, monkeypatch):
    """Time is a cap, never a projection: at 1 s per LM call (a fake clock) the search makes
    the same candidates and decisions as at 1 ms, within a cap it does not reach. At
    af0b1f5 the 1 s pace shrank the search to what the minutes projected."""
    spec, splits = triage
    outcomes = []
    for per_call_s in (0.001, 1.0):
        clock = {"now": 1000.0}
        monkeypatch.setattr("promptdistill.search.budget.time.monotonic", lambda: clock["now"])
        engine = triage_engine(records(splits))
        reply = engine.reply

        def timed(req, reply=reply, clock=clock, per_call_s=per_call_s):
            clock["now"] += per_call_s
            return reply(req)

        engine.reply = timed
        result = distill(engine, spec, config=small(max_minutes=600.0, test_size=0, calibrate=False, max_rounds=2),
                         splits=split_records(spec, seed=0, **{**SIZES, "test_size": 0}))
        outcomes.append((result.winner.id, result.reason, result.stop_reason, engine.calls,
                         [c.id for c in result.candidates]))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][3] > 60  # more calls than a projected 1-minute-per-60-calls budget would have allowed


def test_same_seed_same_result_and_files(triage, tmp_path):
    spec, splits = triage
    a = distill(triage_engine(records(splits)), spec, config=small(seed=3))
    b = distill(triage_engine(records(splits)), spec, config=small(seed=3))
    assert a.candidate_rows() == b.candidate_rows() and a.clause_rows == b.clause_rows
    c = distill(triage_engine(records(splits)), spec, config=small(seed=4))
    assert c.original.screen.record_ids != a.original.screen.record_ids
    folder = a.write(tmp_path / "out")
    frame = pd.read_parquet(folder / "candidates.parquet")
    assert len(frame) == len(a.candidates) and frame["winner"].sum() == 1
    for col in ("text", "instruction_tokens", "density", "screen_mean", "race_mean", "verdict", "diff_lower",
                "finalist", "lm_calls"):
        assert col in frame.columns
    clauses = pd.read_parquet(folder / "clauses.parquet")
    assert {"judge_score", "ablation_delta", "kept", "protected"} <= set(clauses.columns)
    judges = pd.read_parquet(folder / "judges.parquet")
    assert set(judges["judge"]) >= {"clause_necessity", "answer_equivalence"}
    summary = json.loads((folder / "result.json").read_text())
    assert summary["winner"] == a.winner.id and summary["plan"]["pool"] == 120
    assert not list(folder.glob(".*tmp"))


def test_rewrite_check_rejects_unusable_rewrites():
    from promptdistill.distill.loop import _rewrite_check

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


def test_a_stage_run_is_behind_the_lm_cache_and_writes_its_folder(triage, tmp_path):
    """``run_distill``, what ``promptdistill distill`` and the nightly's stage both call:
    a rerun with the same cache makes no LM call and picks the same winner."""
    from promptdistill.pipeline.stages import run_distill

    spec, splits = triage
    engine = triage_engine(records(splits))
    first, folder = run_distill(engine, spec, config=small(), out_dir=tmp_path / "a", cache_path=tmp_path / "lm.sqlite")
    calls = engine.calls
    again, _ = run_distill(engine, spec, config=small(), out_dir=tmp_path / "b", cache_path=tmp_path / "lm.sqlite")
    assert calls > 0 and engine.calls == calls
    assert again.winner.id == first.winner.id and MAIN_RULE in again.winner.spec.instruction_text()
    assert folder == tmp_path / "a" and (folder / "candidates.parquet").is_file()


def test_cli_parses_budgets_and_prints_every_table(triage):
    from promptdistill.cli import build_parser
    from promptdistill.cli.distill import _config, format_result

    args = build_parser().parse_args(["distill", "ticket_triage", "--budget-calls", "50", "--dev", "10", "--no-rewrite",
                                      "--alpha", "0.05", "--screen", "6"])
    config = _config(args)
    assert (config.max_lm_calls, config.dev_size, config.rewrite, config.ablation) == (50, 10, False, True)
    assert not config.ablate_clear
    assert _config(build_parser().parse_args(["distill", "ticket_triage", "--ablate-clear"])).ablate_clear
    assert (config.alpha, config.screen_size) == (0.05, 6)
    bad = build_parser().parse_args(["distill", "x", "--budget-calls", "0"])
    from promptdistill.core.errors import ConfigError

    with pytest.raises(ConfigError, match="max_lm_calls"):
        _config(bad)
    spec, splits = triage
    result = distill(triage_engine(records(splits)), spec, config=small(), splits=splits)
    text = format_result(result)
    for heading in ("Clauses", "Candidates", "Plan: ", "Winner: ", "% fewer", "test quality", "Judges", "Calibration"):
        assert heading in text
    assert "pruned" in text and "<- winner" in text and "non-inferior" in text


# --- the real engine -----------------------------------------------------------------------
# One tiny run (zero-shot, 3 screen + 4 certify records) shared by the tests below, and a
# second identical run for the determinism check: a few dozen LM calls each.

# Only the LM-call budget may bind here: a time budget that binds would make runs differ.
REAL = dict(screen_size=3, dev_size=7, test_size=1, thresholds=(0.5,), max_lm_calls=40, max_rounds=2,
            max_minutes=120.0, rewrite=False, calibrate=False, seed=0, first_look=4)


def zero_shot(spec):
    return spec.with_changes(examples=spec.examples.__class__())


@pytest.fixture(scope="module")
def real_run(engine):
    spec = zero_shot(load_spec("ticket_triage"))
    return spec, distill(engine, spec, config=DistillConfig(**REAL))


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
        if row["judge_score"] is None:
            assert row["judge_error"] or not stats["clause_necessity"]["items"]
        else:
            assert row["judge_score"] in range(1, 6) and not row["judge_error"]


@pytest.mark.engine
def test_real_run_keeps_protected_clauses_and_its_budget(real_run):
    spec, result = real_run
    protected = [c.text for c in split_clauses(spec) if c.protected]
    assert len(result.candidates) >= 2
    for c in result.candidates:
        for text in protected:
            assert text in c.text
    assert result.total_lm_calls <= REAL["max_lm_calls"]
    assert result.winner.instruction_tokens <= result.original.instruction_tokens
    assert result.stop_reason


@pytest.mark.engine
def test_real_run_same_seed_same_result(engine, real_run):
    spec, first = real_run
    second = distill(engine, spec, config=DistillConfig(**REAL))
    assert second.candidate_rows() == first.candidate_rows()
    # The judge's free-text reason can drift after some tokens: the CPU engine's numerics
    # depend on what its prefix cache holds (about 1 run in 3 at 29796ea). Scores, ablation
    # deltas and what was kept must not.
    def decided(rows):
        return [{k: v for k, v in r.items() if k != "judge_reason"} for r in rows]

    assert decided(second.clause_rows) == decided(first.clause_rows)
    assert second.winner.text == first.winner.text


def test_without_its_own_race_the_distiller_hands_its_finalists_on(triage):
    spec, splits = triage
    engine = triage_engine(records(splits))
    result = distill(engine, spec, config=small(race=False, calibrate=False, test_size=0, max_rounds=1), splits=splits)
    assert result.winner is result.original and "go to the optimizer" in result.reason
    # Every candidate, shortest first, none screened here: the optimizer screens them itself.
    by_id = {c.id: c for c in result.candidates}
    assert result.finalists == [c.id for c in sorted(result.candidates[1:], key=lambda c: (c.instruction_tokens, c.id))]
    assert all(by_id[f].screen is None and by_id[f].raced is None for f in result.finalists)
    assert engine.calls == result.total_lm_calls < 120

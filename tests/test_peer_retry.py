"""bench.peers.dspy_side.run_with_retries: a peer that fails on an adapter parse error is retried as a DSPy user would.

Pure: the peer is a fake callable raising DSPy's real ``AdapterParseError`` (built as its
adapters build it) on its first N attempts; no engine, no LM call.
"""

from __future__ import annotations

import logging

import pytest

from bench.peers.dspy_side import run_with_retries
from bench.peers.goal import RATIO_FIELDS, goal
from bench.peers.report import markdown

dspy = pytest.importorskip("dspy")
from dspy.utils.exceptions import AdapterParseError

ADAPTERS = (dspy.JSONAdapter(), dspy.ChatAdapter(use_json_adapter_fallback=False))


def parse_error() -> AdapterParseError:
    """What MIPROv2's instruction proposer raised on invoice_extraction (dspy/adapters/base.py)."""
    return AdapterParseError(adapter_name="JSONAdapter", signature=dspy.Signature("basic_instruction -> proposed_instruction"),
                             lm_response="", message="The LM returned an empty or null response.")


class FakePeer:
    """A peer's compile: fails with ``error()`` on its first ``fails`` calls, then returns a program."""

    def __init__(self, fails: int, error=parse_error):
        self.fails, self.error, self.calls = fails, error, []

    def __call__(self, adapter, seed):
        self.calls.append((type(adapter).__name__, seed))
        if len(self.calls) <= self.fails:
            raise self.error()
        return f"program({type(adapter).__name__}, {seed})"


def tried(record):
    return [(a["adapter"], a["seed"], a["error_type"]) for a in record["attempts"]]


def test_a_first_attempt_that_succeeds_is_the_only_one():
    peer = FakePeer(0)
    program, record = run_with_retries(peer, ADAPTERS, seed=9)
    assert program == "program(JSONAdapter, 9)" and record["adapter"] == "JSONAdapter" and "error" not in record
    assert tried(record) == [("JSONAdapter", 9, None)] and record["attempts"][0]["seconds"] >= 0


def test_a_parse_error_is_retried_with_the_next_seed_then_with_the_other_adapter():
    peer = FakePeer(1)
    program, record = run_with_retries(peer, ADAPTERS, seed=9)
    assert program == "program(JSONAdapter, 10)" and record["adapter"] == "JSONAdapter"
    assert tried(record) == [("JSONAdapter", 9, "AdapterParseError"), ("JSONAdapter", 10, None)]
    assert "empty or null response" in record["attempts"][0]["error"]

    peer = FakePeer(2)
    program, record = run_with_retries(peer, ADAPTERS, seed=9)
    assert peer.calls == [("JSONAdapter", 9), ("JSONAdapter", 10), ("ChatAdapter", 9)]
    assert program == "program(ChatAdapter, 9)" and record["adapter"] == "ChatAdapter" and "error" not in record
    assert tried(record) == [("JSONAdapter", 9, "AdapterParseError"), ("JSONAdapter", 10, "AdapterParseError"),
                             ("ChatAdapter", 9, None)]


def test_a_peer_without_a_seed_goes_straight_to_the_other_adapter():
    peer = FakePeer(1)
    _, record = run_with_retries(peer, ADAPTERS, seed=None)
    assert peer.calls == [("JSONAdapter", None), ("ChatAdapter", None)] and record["adapter"] == "ChatAdapter"


def test_an_error_other_than_a_parse_error_is_not_retried():
    peer = FakePeer(1, error=lambda: RuntimeError("engine died"))
    program, record = run_with_retries(peer, ADAPTERS, seed=9)
    assert program is None and peer.calls == [("JSONAdapter", 9)]
    assert tried(record) == [("JSONAdapter", 9, "RuntimeError")] and record["adapter"] is None
    assert record["error"] == "RuntimeError: engine died" and "RuntimeError" in record["traceback"]

    # A parse error first, then another error: the other error ends the run.
    errors = iter([parse_error, lambda: ValueError("bad metric")])
    peer = FakePeer(3, error=lambda: next(errors)())
    program, record = run_with_retries(peer, ADAPTERS, seed=9)
    assert program is None and tried(record) == [("JSONAdapter", 9, "AdapterParseError"), ("JSONAdapter", 10, "ValueError")]
    assert record["error"] == "ValueError: bad metric"


def test_a_peer_failing_every_attempt_gets_a_failure_row():
    peer = FakePeer(10)
    program, record = run_with_retries(peer, ADAPTERS, seed=9)
    assert program is None and len(peer.calls) == 3 and record["adapter"] is None
    assert [a["error_type"] for a in record["attempts"]] == ["AdapterParseError"] * 3
    assert record["error"].startswith("AdapterParseError: The LM returned an empty or null response.")

    # The side run_peer makes of it (the record, and the cost of every attempt), in the report.
    mipro = {"kind": "mipro", **record, "minutes": 7.8, "lm_calls": 240, "tokens_processed": 300000,
             "prompt_tokens_processed": 290000, "completion_tokens_processed": 10000, "search_tokens": 300000,
             "computed_tokens": 120000}
    ours = {"winner": "v1", "kept_baseline": False, "reason": "better", "lm_calls": 100, "tokens_processed": 1000,
            "prompt_tokens_processed": 900, "completion_tokens_processed": 100, "engine_tokens_processed": 1000,
            "stage_tokens": {"distill": 500, "optimize": 500}, "phases": {}, "test_mean": 0.5, "test_ci_low": 0.4,
            "test_ci_high": 0.6, "test_n": 100, "prompt_tokens": 200, "instruction_tokens": 50, "minutes": 3.0,
            "ttft_cold_ms": 100.0, "ttft_warm_ms": 50.0, "search_tokens": 800, "computed_tokens": 300,
            "verification_tokens": {"search_tokens": 200, "computed_tokens": 90}}
    comparison = {**{f"{k}_ours_over_peer": None for k in RATIO_FIELDS}, "goal": goal(ours, mipro)}
    rows = {"invoice_extraction": {"split": {"train": 100, "dev": 100, "test": 100}, "minutes": 12.0,
                                   "sides": {"ours": ours, "mipro": mipro}, "comparisons": {"mipro": comparison}}}
    config = {"peers": ["mipro"], "budget": "quick", "dspy_version": dspy.__version__, "seed": 0,
              "timing_records": 3, "gepa_objectives": "n/a"}
    md = markdown(rows, config, 12.0)
    row = next(line for line in md.splitlines() if line.startswith("| mipro"))
    assert "failed 3 attempt(s): AdapterParseError: The LM returned an empty or null response." in row
    assert "| 240 | 300000 (290000 + 10000) | 120000 / 300000 |" in row
    ours_row = next(line for line in md.splitlines() if line.startswith("| ours |"))
    assert "| 300 / 800 (verification apart: 90 / 200) |" in ours_row
    line = next(line for line in md.splitlines() if line.startswith("- mipro:"))
    assert line.startswith("- mipro: failed all 3 attempt(s); tried (1) JSONAdapter seed 9")
    assert "(2) JSONAdapter seed 10" in line and "(3) ChatAdapter seed 9" in line
    assert line.count("AdapterParseError (The LM returned an empty or null response.)") == 3
    assert "| invoice_extraction | mipro |" in md and "peer failed |" in md
    assert "**invoice_extraction / mipro**: failed after 3 attempt(s), 240 LM calls:" in md


def test_a_peer_that_succeeded_on_the_other_adapter_says_so():
    from bench.peers.report import attempts_line, side_label

    _, record = run_with_retries(FakePeer(2), ADAPTERS, seed=0)
    assert side_label("mipro", record) == "mipro (ChatAdapter, attempt 3)"
    assert attempts_line("mipro", record).startswith("- mipro: succeeded with ChatAdapter; tried (1) JSONAdapter seed 0")
    assert side_label("gepa", run_with_retries(FakePeer(0), ADAPTERS, seed=0)[1]) == "gepa"
    assert attempts_line("gepa", {}) is None  # a report from before the retries


def test_bootstrapping_keeps_a_trace_at_the_bar_as_metric_threshold_asks():
    """MIPROv2 bootstraps each demo set with DSPy's own BootstrapFewShot: at DSPy's convention a
    continuous metric's 0.64 reply is not kept (summarize's 0 of 400); with ``bar`` passed as
    ``metric_threshold`` it is, and the bootstrapping stops at its demo count. A reply the adapter
    cannot parse never reaches the metric, and the tally still counts it as tried. Scripted replies
    (DSPy's DummyLM), summarize's real records and metric."""
    from dspy.teleprompt import BootstrapFewShot
    from dspy.utils import DummyLM

    from bench.peers.dspy_program import BootstrapTally, make_metric, make_signature, output_fields, spec_score, to_example
    from bundled_specs import load_spec
    from promptdistill.specs.datasets import dataset_for, records

    spec = load_spec("summarize")
    train = [to_example(spec, r) for r in records(dataset_for(spec), "train")[:7]]
    outs = list(output_fields(spec))

    def half(ex):  # the expected output with half its key points: facts lost, form kept
        return {**{k: ex[k] for k in outs}, "key_points": ex["key_points"][:len(ex["key_points"]) // 2]}

    unparsed = {"summary": "Cut off before its other fields."}  # ChatAdapter refuses a reply missing fields
    replies = [unparsed, {"summary": "Nothing.", "key_points": [], "confidence_score": 0.1}]
    replies += [half(ex) for ex in train[2:]]
    scores = [spec_score(spec, ex, dspy.Prediction(**r))[0] for ex, r in zip(train[1:], replies[1:])]
    assert scores[0] == 0.0 and all(0.5 <= s < 1.0 for s in scores[1:])  # what the test relies on

    def bootstrap(bar):
        tally = BootstrapTally()
        optimizer = BootstrapFewShot(metric=make_metric(spec, bar, tally), metric_threshold=bar,
                                     max_bootstrapped_demos=2, max_labeled_demos=0, max_rounds=1)
        adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)  # one reply per attempt
        with dspy.context(lm=DummyLM(list(replies)), adapter=adapter), tally.watching():
            program = optimizer.compile(dspy.Predict(make_signature(spec)), trainset=train)
        return tally, [d for d in program.demos if d.get("augmented")]

    tally, kept = bootstrap(None)
    assert (tally.tried, tally.scored, tally.failed, tally.kept, kept) == (7, 6, 1, 0, [])
    tally, kept = bootstrap(0.5)
    # the unparsed reply fails and the empty one is refused; two kept, then it stops
    assert (tally.tried, tally.failed, tally.kept) == (4, 1, 2)
    assert [d["key_points"] for d in kept] == [replies[2]["key_points"], replies[3]["key_points"]]
    metric = make_metric(spec, 0.5)
    assert metric(train[2], dspy.Prediction(**replies[2])) == metric(train[2], dspy.Prediction(**replies[2]), trace=[])
    assert tally not in logging.getLogger(BootstrapTally.LOGGER).handlers  # detached after the compile


def test_the_bar_is_checked_and_reported(capsys):
    from bench.bench_peers import main
    from bench.peers.report import search_line

    with pytest.raises(SystemExit):
        main(["summarize", "--mipro-metric-threshold", "0"])  # DSPy would read 0 as no threshold at all
    assert "--mipro-metric-threshold must be in (0, 1], not 0.0" in capsys.readouterr().err
    tally = {"bootstrap_traces_tried": 400, "bootstrap_traces_kept": 0}
    assert search_line("mipro", {**tally, "metric_threshold": None}) == (
        "- mipro: bootstrapping kept 0 of 400 traces tried (a trace is kept at a score of at least 1.0 "
        "(DSPy's convention))")
    assert "at least 0.5 (metric_threshold)" in search_line("mipro", {**tally, "metric_threshold": 0.5})
    line = search_line("mipro", {"bootstrap_traces_tried": 27, "bootstrap_traces_kept": 10,
                                 "bootstrap_traces_failed": 17, "metric_threshold": 0.5})
    assert line == ("- mipro: bootstrapping kept 10 of 27 traces tried (17 raised before scoring, as on a reply "
                    "the adapter cannot parse; a trace is kept at a score of at least 0.5 (metric_threshold))")


def test_an_instruction_is_predicted_as_the_template_it_makes_even_where_the_spec_checks_refuse_it():
    """TTFTObjective's spec: the instruction alone as system text. A peer's literal ``{ticket}``
    (the checks read it as a misplaced input) loses its braces; an empty instruction becomes "."."""
    from bench.peers.dspy_program import instruction_spec
    from bundled_specs import load_spec
    from promptdistill.core.errors import SpecError
    from promptdistill.specs.prompt import spec_messages

    spec = load_spec("ticket_triage")
    inputs = {"ticket": "My invoice is wrong."}
    assert spec_messages(instruction_spec(spec, "Route the ticket."), inputs)[0]["content"] == "Route the ticket."
    with pytest.raises(SpecError):
        spec.with_changes(instruction="Route the {ticket}.")
    assert spec_messages(instruction_spec(spec, "Route the {ticket}."), inputs)[0]["content"] == "Route the ticket."
    assert spec_messages(instruction_spec(spec, "  "), inputs)[0]["content"] == "."
    assert spec.instruction == load_spec("ticket_triage").instruction  # the spec given is unchanged

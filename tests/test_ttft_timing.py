"""Measured TTFT that can be compared: baseline and winner timed interleaved, the paired
difference with its interval, the static prefix's cached share, and how the summary and
the reports show TTFT per side (a kept baseline once)."""

from __future__ import annotations

import numpy as np
import pytest

from bundled_specs import load_spec
from fakes import FAKE_IDENTITY, LINEAR_TERMS, FakeDriftingEngine
from promptdistill.optimize.verify import (
    TimedTemplate,
    measure_ttft_interleaved,
    timing_repeats,
    timing_summary,
    ttft_difference,
)
from promptdistill.pipeline.report import (
    format_summary_table,
    format_ttft,
    format_ttft_diff,
    nightly_report_markdown,
    spec_report_markdown,
    summary_row,
)
from promptdistill.specs.prompt import template_content
from promptdistill.ttft.estimators import MonomialRegressor
from promptdistill.ttft.model import TTFTModel


def _model() -> TTFTModel:
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(10, 1500, 60), rng.choice([0, 128, 256], 60), rng.integers(0, 8, 60),
                         rng.uniform(0.3, 0.8, 60), rng.uniform(5, 9, 60)])
    return TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, 50 + 0.4 * X[:, 0] + 0.02 * X[:, 1]), "monomial",
                     "linear", FAKE_IDENTITY)


@pytest.fixture(scope="module")
def templates():
    from promptdistill.specs.datasets import dataset_for, records

    spec = load_spec("ticket_triage")
    test = records(dataset_for(spec), "dev")[:4]
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    return [TimedTemplate(label, template_content(s, [], max_tokens=8, sampling={"temperature": 0.0}), s, [], test)
            for label, s in (("baseline", spec), ("winner", short))]


def _label(req, templates) -> str:
    return "winner" if req.chat()[0]["content"].startswith("Pick the team for this ticket.") else "baseline"


def test_timing_repeats_reach_the_pairs_the_interval_needs():
    assert [timing_repeats(n) for n in (0, 1, 2, 3, 12, 40)] == [0, 12, 6, 4, 1, 1]


def test_baseline_and_winner_are_timed_interleaved_alternating_who_goes_first(templates):
    engine = FakeDriftingEngine()
    rows = measure_ttft_interleaved(engine, templates, model=_model(), n=2, repeats=3, block_tokens=16)
    assert len(rows) == 2 * 3 * 2 * 2  # records x repeats x cold/warm x templates
    assert len(engine.log) == len(rows)  # the cold request primes the warm one: no primer of its own
    blocks = [engine.log[k:k + 4] for k in range(0, len(engine.log), 4)]  # one record and repeat each
    firsts = [_label(b[0], templates) for b in blocks]
    assert firsts == ["baseline", "winner"] * 3  # alternates with every record and repeat
    for block, first in zip(blocks, firsts):
        second = "winner" if first == "baseline" else "baseline"
        # (cold, warm) for first, then for second
        assert [_label(r, templates) for r in block] == [first, first, second, second]
        assert block[0].chat()[-1] != block[1].chat()[-1]  # warm on another record than the cold primer
        assert block[1].chat()[-1] == block[3].chat()[-1]  # both templates warm on the same record
    assert engine.resets == 2 * 3 * 2  # a reset before each cold request only
    for label in ("baseline", "winner"):  # every record timed cold and warm in every repeat
        mine = [(r["record_id"], r["repeat"], r["cache"]) for r in rows if r["template"] == label]
        assert len(set(mine)) == len(mine) == 2 * 3 * 2
    assert {(r["template"], r["first"]) for r in rows} == {("baseline", True), ("baseline", False),
                                                            ("winner", True), ("winner", False)}
    assert all(r["static_prefix_tokens"] > 0 for r in rows)


def test_one_record_is_warmed_by_a_primer_on_the_spare_record(templates):
    engine = FakeDriftingEngine()
    rows = measure_ttft_interleaved(engine, templates[:1], model=_model(), n=1, repeats=2, block_tokens=16)
    assert [r["cache"] for r in rows] == ["cold", "warm"] * 2 and {r["record_id"] for r in rows} == {rows[0]["record_id"]}
    assert len(engine.log) == 2 * 3  # cold, primer, warm
    assert engine.log[1].chat()[-1] != engine.log[2].chat()[-1] == engine.log[0].chat()[-1]


def test_interleaving_keeps_drift_out_of_the_difference(templates):
    """The machine slows by 5 ms per request. Timed one template after the other (as
    before), the winner looks ~100 ms slower than it is; interleaved, the paired median
    is within one drift step of the truth."""
    model = _model()
    rows = measure_ttft_interleaved(FakeDriftingEngine(), templates, model=model, n=2, repeats=6, block_tokens=16)
    base_tokens = {r["record_id"]: r["prompt_tokens"] for r in rows if r["template"] == "baseline"}
    truth = np.median([r["prompt_tokens"] - base_tokens[r["record_id"]] for r in rows if r["template"] == "winner"])
    assert truth < 0  # the shorter instruction is faster
    diff = ttft_difference(rows, warm_share=0.8)
    for cache in ("cold", "warm"):
        assert abs(diff[f"measured_{cache}_diff_ms"] - truth) <= 5.0
    assert diff["timing_pairs"] == 12 and "percentile bootstrap within records" in diff["timing_interval"]

    engine = FakeDriftingEngine()
    one_after_the_other = []
    for t in templates:
        one_after_the_other += measure_ttft_interleaved(engine, [t], model=model, n=2, repeats=6, block_tokens=16)
    naive = ttft_difference(one_after_the_other, warm_share=0.8)
    assert naive["measured_cold_diff_ms"] - truth > 100.0


def _rows(diff_cold, diff_warm, *, noise=0.0, records=2, repeats=6, seed=0, drift=40.0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(records):
        for j in range(repeats):
            for cache, d in (("cold", diff_cold), ("warm", diff_warm)):
                base = (400.0 if cache == "cold" else 150.0) + 90.0 * i + drift * j  # records differ, the machine drifts
                for label, ms in (("baseline", base), ("winner", base + d)):
                    rows.append({"template": label, "record_id": str(i), "repeat": j, "cache": cache,
                                 "ttft_ms": ms + noise * rng.standard_normal()})
    return rows


def test_the_interval_is_on_the_median_paired_difference():
    exact = ttft_difference(_rows(-100.0, -20.0), warm_share=0.8)
    assert exact["measured_cold_diff_ms"] == exact["measured_cold_diff_low_ms"] == exact["measured_cold_diff_high_ms"] == -100.0
    assert exact["measured_expected_diff_ms"] == pytest.approx(0.8 * -20.0 + 0.2 * -100.0)
    noisy = ttft_difference(_rows(-100.0, -20.0, noise=8.0), warm_share=0.8, seed=3)
    low, high = noisy["measured_cold_diff_low_ms"], noisy["measured_cold_diff_high_ms"]
    assert low < -100.0 < high and high < 0  # faster, and the drift (40 ms a repeat) does not widen it
    assert high - low < 25.0
    tie = ttft_difference(_rows(0.0, 0.0, noise=8.0), warm_share=0.8, seed=3)
    assert tie["measured_warm_diff_low_ms"] < 0 < tie["measured_warm_diff_high_ms"]
    assert ttft_difference(_rows(-100.0, -20.0), warm_share=0.8, seed=1) == ttft_difference(
        _rows(-100.0, -20.0), warm_share=0.8, seed=1)


def test_a_kept_baseline_has_no_difference_and_one_pair_no_interval():
    alone = [r for r in _rows(-100.0, -20.0) if r["template"] == "baseline"]
    kept = ttft_difference(alone, warm_share=0.8)
    assert kept["measured_cold_diff_ms"] is None and kept["timing_pairs"] == 0
    one = ttft_difference(_rows(-100.0, -20.0, records=1, repeats=1), warm_share=0.8)
    assert one["measured_cold_diff_ms"] == -100.0 and one["measured_cold_diff_low_ms"] is None


def test_timing_summary_gives_the_static_prefix_cached_share():
    rows = []
    for j in range(2):
        rows.append({"template": "baseline", "record_id": "1", "repeat": j, "cache": "cold", "ttft_ms": 400.0,
                     "predicted_ms": 380.0, "cached_tokens": 0, "static_prefix_tokens": 300,
                     "predicted_cached_tokens": 0})
        rows.append({"template": "baseline", "record_id": "1", "repeat": j, "cache": "warm", "ttft_ms": 200.0,
                     "predicted_ms": 220.0, "cached_tokens": 256 if j else 128, "static_prefix_tokens": 300,
                     "predicted_cached_tokens": 256})
    s = timing_summary(rows, "baseline", warm_share=0.8)
    assert s["measured_cold_ms"] == 400.0 and s["predicted_warm_ms"] == 220.0
    assert s["measured_expected_ms"] == pytest.approx(0.8 * 200.0 + 0.2 * 400.0)
    assert s["static_cached_share"] == pytest.approx(192 / 300)  # what the engine reported
    assert s["static_cached_share_predicted"] == pytest.approx(256 / 300)  # whole blocks, as predicted
    assert s["timing_n"] == 1 and s["timing_repeats"] == 2


# --- how TTFT is shown -------------------------------------------------------------------------

FIGURES = dict(ttft_ms_before=387.0, ttft_ms_after=280.0, ttft_cold_ms_before=900.0, ttft_cold_ms_after=700.0,
               ttft_warm_ms_before=260.0, ttft_warm_ms_after=175.0, ttft_cold_ms_predicted_before=880.0,
               ttft_cold_ms_predicted_after=690.0, ttft_warm_ms_predicted_before=250.0,
               ttft_warm_ms_predicted_after=180.0, static_cached_share_before=0.85, static_cached_share_after=0.8,
               ttft_diff_ms=-107.0, ttft_diff_low_ms=-121.0, ttft_diff_high_ms=-95.0,
               ttft_timing="median of 12 interleaved pairs (winner - baseline), 95% percentile bootstrap within records")


def test_reports_show_ttft_per_side_measured_and_predicted_with_the_difference():
    row = summary_row("ticket_triage", FIGURES, status="optimized")
    assert format_ttft(row) == "387 -> 280"
    assert format_ttft_diff(row) == "-107 ms [-121, -95]"
    md = spec_report_markdown(row)
    assert "| TTFT cold, measured (ms) | 900 | 700 |\n| TTFT cold, predicted (ms) | 880 | 690 |" in md
    assert "| TTFT warm, measured (ms) | 260 | 175 |\n| TTFT warm, predicted (ms) | 250 | 180 |" in md
    assert "| static prefix cached when warm | 85% | 80% |" in md
    assert "-107 ms [-121, -95] (median of 12 interleaved pairs" in md


def test_a_kept_baseline_is_one_measurement_shown_once():
    kept = {**FIGURES, "ttft_ms_after": 387.0, "ttft_diff_ms": None, "ttft_diff_low_ms": None,
            "ttft_diff_high_ms": None, "ttft_timing": "2 test records x 6 repeats"}
    row = summary_row("ticket_triage", kept, status="optimized", kept_baseline=True)
    assert format_ttft(row) == "387 (kept)"
    table = format_summary_table([row])
    assert "387 (kept)" in table and "387 ->" not in table
    assert "387 (kept)" in nightly_report_markdown([row])
    assert "none: the baseline was kept" in spec_report_markdown(row)


def test_the_reports_show_ttft_per_side_and_a_kept_baseline_once():
    """The rows both the markdown report and the night report show."""
    from promptdistill.pipeline.report import comparison_rows

    lines = {k: (b, a) for k, b, a in comparison_rows(summary_row("t", FIGURES, status="optimized"), "expected")}
    assert lines["TTFT cold, measured (ms)"] == ("900", "700") and lines["TTFT warm, predicted (ms)"] == ("250", "180")
    assert lines["TTFT expected, measured (ms)"] == ("387", "280")
    assert lines["static prefix cached when warm"] == ("85%", "80%")
    kept = comparison_rows(summary_row("t", FIGURES, status="optimized", kept_baseline=True), "expected")
    assert {a for k, _b, a in kept if k.startswith(("TTFT", "static"))} == {"same prompt (kept)"}
    assert "same prompt (kept)" in spec_report_markdown(summary_row("t", FIGURES, kept_baseline=True))

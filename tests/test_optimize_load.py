"""Decisions at a declared load (``slo.load``): the load TTFT model's percentile is the
cost, its held-out error the resolution, the SLO is met at that load or the candidate
cannot win, and every reason names the latency. On the FakeEngine with a real
``LoadTTFTModel`` fitted on synthetic cells (the engine runs are tests/test_load_engine.py)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from fakes import FakeEngine, synthetic_load_cells
from promptdistill.core.errors import ConfigError
from promptdistill.load.model import LoadTTFTModel
from promptdistill.optimize import OptimizeBudget, optimize
from promptdistill.optimize.predict import LoadPricing
from promptdistill.specs.model import Load
from test_optimize_unit import _triage_reply, triage, ttft_model  # noqa: F401 - the shared fixture and fakes

LOAD = Load(rate_rps=2.0)
BUDGET = OptimizeBudget(max_lm_calls=1000, screen_size=8, dev_size=58, test_size=8, fewshot_counts=(0, 2),
                        similar_counts=(), timing_records=0, format_size=8, described=False, formats=False)


@pytest.fixture(scope="module")
def load_model():
    # A machine where a cached prompt token still costs half an uncached one at load (the
    # FakeEngine's prompts are mostly static prefix: shorter ones must be cheaper here).
    return LoadTTFTModel().fit(synthetic_load_cells(cached_ms=0.2))


def at_load(spec, *, ttft_ms=None, load=LOAD, drop=0.2):
    return spec.with_changes(slo=dataclasses.replace(spec.slo, load=load, ttft_ms=ttft_ms, max_quality_drop=drop))


def run(spec, load_model, errors=({"load_kind": "rate", "load_value": 0.65, "mape": 0.04},)):
    short = spec.with_changes(instruction="Pick the team for this ticket.")
    return optimize(FakeEngine(reply=_triage_reply), spec, ttft_model=ttft_model(mape=0.02), budget=BUDGET,
                    distill_candidates=[("short", short)],
                    load_pricing=LoadPricing.from_model(load_model, spec.slo, errors))


def test_a_declared_load_prices_candidates_at_its_percentile_and_the_reason_names_it(triage, load_model):
    spec = at_load(triage[0])
    result = run(spec, load_model)
    df = result.candidates.set_index("candidate_id")
    # The cost of every priced candidate is the load model's P95 at 2 req/s for its features and replies.
    for cid in ("baseline", "short/none"):
        row = df.loc[cid]
        x = {"uncached_tokens": row["total_tokens"] - row["warm_cached_tokens"],
             "cached_tokens": row["warm_cached_tokens"], "completion_tokens": row["load_reply_tokens"]}
        assert row["ttft_load_ms"] == pytest.approx(load_model.predict_one(x, "rate", 2.0))
    assert result.ttft_resolution == 0.04  # the load model's error at the profiled rates
    assert "P95 TTFT at 2 req/s" in result.reason
    assert result.provenance["latency"] == "P95 TTFT at 2 req/s"


def test_a_candidate_that_breaks_the_slo_at_the_load_is_not_published(triage, load_model):
    spec = at_load(triage[0])
    probe = run(spec, load_model).candidates.set_index("candidate_id")["ttft_load_ms"].sort_values()
    slo = (probe.iloc[0] + probe.iloc[1]) / 2  # only the cheapest at the load meets it
    result = run(at_load(triage[0], ttft_ms=slo), load_model)
    df = result.candidates.set_index("candidate_id")
    slower = [cid for cid in probe.index[1:] if cid != "baseline"]
    assert slower and all("misses the SLO: predicted P95 TTFT at 2 req/s" in df.loc[cid, "notes"] for cid in slower)
    assert result.winner_id in (probe.index[0], "baseline") and result.winner_id not in slower


def test_a_load_past_every_candidates_capacity_publishes_none_of_them(triage, load_model):
    result = run(at_load(triage[0], load=Load(rate_rps=500.0)), load_model)
    df = result.candidates.set_index("candidate_id")
    assert result.kept_baseline
    assert any("cannot sustain 500 req/s" in str(n) for n in df["notes"])
    assert math.isinf(df.loc["baseline", "ttft_load_ms"])


def test_a_declared_load_without_a_load_model_is_a_clear_error(triage):
    with pytest.raises(ConfigError, match="slo.load: the spec declares 2 req/s but no load TTFT model"):
        optimize(FakeEngine(reply=_triage_reply), at_load(triage[0]), ttft_model=ttft_model(), budget=BUDGET)


def test_load_pricing_takes_the_error_of_the_nearest_concurrency_or_the_largest_rate_error(load_model, triage):
    slo = at_load(triage[0]).slo
    errors = [{"load_kind": "rate", "load_value": 0.3, "mape": 0.2}, {"load_kind": "rate", "load_value": 0.65, "mape": 0.05},
              {"load_kind": "concurrency", "load_value": 8.0, "mape": 0.9}, {"load_kind": "concurrency",
                                                                             "load_value": 32.0, "mape": 0.3}]
    assert LoadPricing.from_model(load_model, slo, errors).relative_error == 0.2
    at_c = at_load(triage[0], load=Load(concurrency=24)).slo
    assert LoadPricing.from_model(load_model, at_c, errors).relative_error == 0.3
    assert LoadPricing.from_model(load_model, slo, []).relative_error == 0.25
    assert LoadPricing.from_model(load_model, slo).latency == "P95 TTFT at 2 req/s"


def test_the_night_report_shows_the_percentile_at_the_load_and_the_sustainable_rate(triage, load_model):
    from promptdistill.pipeline.report import comparison_rows
    from promptdistill.pipeline.stages import result_figures

    spec = at_load(triage[0], ttft_ms=400.0)
    result = json.loads(json.dumps(run(spec, load_model).to_json(), default=str))
    figures = result_figures(result)
    assert figures["latency"] == "P95 TTFT at 2 req/s"
    assert figures["load_ttft_ms_predicted_before"] > 0 and figures["sustainable_rps_before"] > 0
    rows = {what: (before, after) for what, before, after in comparison_rows(figures)}
    assert "P95 TTFT at 2 req/s, predicted (ms)" in rows
    assert "sustainable rate at slo.ttft_ms, predicted (req/s)" in rows

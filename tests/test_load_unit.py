"""Load measurement's pure parts: the declared load, percentile intervals, the sustainable
rate, the load TTFT model and its error against the noise floor (no engine)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fakes import synthetic_load_cells
from promptdistill.core.errors import SpecError
from promptdistill.load.fit import load_error_table, noise_floor
from promptdistill.load.model import LoadTTFTModel
from promptdistill.load.report import load_figures, markdown_tables
from promptdistill.load.stats import Estimate, percentile_ci, percentile_diff_ci, sustainable_rate
from promptdistill.specs.model import Load, Slo


# -- the declared load ----------------------------------------------------------------
def test_a_load_is_a_rate_or_a_concurrency_and_names_itself():
    assert Load(rate_rps=4).describe() == "4 req/s"
    assert Load(concurrency=8).describe() == "concurrency 8"
    assert Slo(ttft_ms=400, load=Load(rate_rps=4)).latency_name == "P95 TTFT at 4 req/s"
    assert Slo().latency_name == "solo TTFT"
    for bad in ({}, {"rate_rps": 1, "concurrency": 2}, {"rate_rps": 0}, {"rate_rps": -1}, {"concurrency": 0}):
        with pytest.raises(ValueError):
            Load(**bad)


def test_a_spec_without_a_load_keeps_its_shape_and_hash(tmp_path):
    from promptdistill.specs.load import load_spec

    spec = load_spec("prompts/ticket_triage.yaml")
    assert "load" not in spec.to_dict()["slo"]
    assert spec.slo.load is None and spec.slo.ttft_percentile == 95


@pytest.mark.parametrize("load, reason", [({"rate_rps": 0}, "rate_rps"), ({"rate_rps": -2}, "rate_rps"),
                                          ({"concurrency": 0}, "concurrency"), ({"qps": 3}, "qps"),
                                          ({"rate_rps": 1, "concurrency": 2}, "load")])
def test_a_bad_declared_load_is_a_clear_spec_error(tmp_path, load, reason):
    import shutil

    import yaml

    from promptdistill.specs.load import load_spec

    (tmp_path / "prompts").mkdir()
    shutil.copytree("datasets", tmp_path / "datasets", ignore=shutil.ignore_patterns("*.parquet", "*.bak"))
    data = yaml.safe_load(open("prompts/ticket_triage.yaml"))
    data["slo"]["load"] = load
    path = tmp_path / "prompts" / "ticket_triage.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError) as e:
        load_spec(str(path))
    assert "slo" in str(e.value) and reason in str(e.value) and "ticket_triage.yaml" in str(e.value)


def test_a_declared_load_round_trips_and_changes_the_hash(tmp_path):
    import shutil

    import yaml

    from promptdistill.specs.load import load_spec

    (tmp_path / "prompts").mkdir()
    shutil.copytree("datasets", tmp_path / "datasets", ignore=shutil.ignore_patterns("*.parquet", "*.bak"))
    data = yaml.safe_load(open("prompts/ticket_triage.yaml"))
    plain = tmp_path / "prompts" / "ticket_triage.yaml"
    plain.write_text(yaml.safe_dump(data))
    before = load_spec(str(plain))
    data["slo"]["load"] = {"rate_rps": 2.5}
    plain.write_text(yaml.safe_dump(data))
    spec = load_spec(str(plain))
    assert spec.slo.load == Load(rate_rps=2.5)
    assert spec.to_dict()["slo"]["load"] == {"rate_rps": 2.5}
    assert spec.spec_hash() != before.spec_hash()


# -- percentiles and their intervals -----------------------------------------------------
def test_percentile_interval_covers_the_true_percentile_of_correlated_queues():
    # An AR(1) series (a queue's correlation) of known marginal: its true P95 is known.
    rng = np.random.default_rng(1)
    phi, covered, trials = 0.6, 0, 200
    true_p95 = 1.6448536 * 1.0 / math.sqrt(1 - phi**2) * 1.0 + 100.0
    for t in range(trials):
        blocks = []
        for _ in range(2):
            x = np.empty(150)
            x[0] = rng.normal() / math.sqrt(1 - phi**2)
            for i in range(1, x.size):
                x[i] = phi * x[i - 1] + rng.normal()
            blocks.append((100.0 + x).tolist())
        est = percentile_ci(blocks, 95)
        covered += (est.low is None or est.low <= true_p95) and (est.high is None or true_p95 <= est.high)
    # Nominal 95%; it read 93% here (an iid percentile bootstrap reads 81%, a moving-block one 84%).
    assert covered / trials >= 0.9


def test_percentile_interval_is_near_nominal_on_independent_requests_and_honest_on_few():
    rng = np.random.default_rng(3)
    true_p95 = 100.0 + 1.6448536
    covered = 0
    for _ in range(300):
        est = percentile_ci([(100.0 + rng.normal(size=400)).tolist()], 95)
        covered += est.low is not None and est.high is not None and est.low <= true_p95 <= est.high
    assert 0.92 <= covered / 300 <= 0.995
    few = percentile_ci([(100.0 + rng.normal(size=30)).tolist()], 95)
    assert few.value is not None and few.high is None  # 30 requests cannot bound a P95 from above


def test_failed_requests_are_left_out_and_counted_apart():
    est = percentile_ci([[100.0, None, 120.0, float("nan"), 110.0]], 50)
    assert est.n == 3 and est.value == 110.0


def test_paired_difference_has_the_sign_of_second_minus_first():
    order = np.random.default_rng(0).permutation(400)  # arrival order unrelated to the value
    a = [[200.0 + i for i in order]]
    b = [[100.0 + i for i in order]]
    d = percentile_diff_ci(a, b, 95)
    assert d.value == pytest.approx(-100.0) and d.high < 0 < d.low + 200 and d.n == 400


def test_sustainable_rate_interpolates_the_crossing_and_brackets_it():
    pts = [(1.0, Estimate(100, 90, 110, 40)), (2.0, Estimate(200, 180, 220, 40)), (3.0, Estimate(600, 500, 700, 40))]
    s = sustainable_rate(pts, 400.0)
    assert s.value == pytest.approx(2.5)
    assert s.low < s.value < s.high
    never = sustainable_rate(pts, 10_000.0)
    assert never.value == 3.0 and never.high is None  # at least the top of the sweep
    always = sustainable_rate(pts, 50.0)
    assert always.value is None and always.high == 1.0  # below the lowest rate swept


# -- the load TTFT model --------------------------------------------------------------------
def test_the_load_model_learns_capacity_and_predicts_held_out_prompts():
    cells = synthetic_load_cells(noise=0.05)
    model = LoadTTFTModel().fit(cells)
    x = {"uncached_tokens": 400, "cached_tokens": 64, "completion_tokens": 20}
    assert model.seconds_per_request(x) == pytest.approx(0.0004 * 400 + 0.00002 * 64 + 0.004 * 20 + 0.01, rel=0.2)
    # More uncached tokens never predict faster, at either load kind.
    short, long_ = dict(x, uncached_tokens=200), dict(x, uncached_tokens=800)
    for kind, value in (("concurrency", 8), ("concurrency", 32), ("rate", 2.0)):
        assert model.predict_one(short, kind, value) < model.predict_one(long_, kind, value)
    assert math.isinf(model.predict_one(dict(x, uncached_tokens=20_000), "rate", 5.0))  # past capacity


def test_held_out_error_reaches_the_noise_floor_when_the_law_is_in_the_models_family():
    # Percentiles drawn from a fitted model's own law, with 5% multiplicative noise per run:
    # a correct fit and leave-one-prompt-out evaluation must land near the floor, and the
    # floor must read the noise (E|a - b| / sqrt(2) of two lognormal runs: 0.05 * 2 / sqrt(pi)).
    law = LoadTTFTModel().fit(synthetic_load_cells())
    rng = np.random.default_rng(4)
    cells = [dict(c, ttft_ms=law.predict_one(c, c["load_kind"], c["load_value"]) * math.exp(0.05 * rng.normal()))
             for c in synthetic_load_cells()]
    table = {r["load"]: r for r in load_error_table(cells)}
    for name in ("concurrency 8", "concurrency 32"):
        assert table[name]["floor"] == pytest.approx(0.05 * 2 / math.sqrt(math.pi), rel=0.5), table[name]
        assert table[name]["ratio"] <= 1.5, table[name]
    # A law the model cannot follow (every prompt's percentile shuffled) is far above the floor.
    shuffled = [dict(c, ttft_ms=cells[j]["ttft_ms"]) for c, j in zip(cells, rng.permutation(len(cells)))]
    assert max(r["ratio"] for r in load_error_table(shuffled) if r.get("ratio")) > 3


def test_the_load_model_round_trips_as_json_and_refuses_before_fit():
    import json

    model = LoadTTFTModel().fit(synthetic_load_cells())
    again = LoadTTFTModel.from_dict(json.loads(json.dumps(model.to_dict())))
    x = {"uncached_tokens": 333, "cached_tokens": 64, "completion_tokens": 33}
    assert again.predict_one(x, "rate", 2.0) == model.predict_one(x, "rate", 2.0)
    with pytest.raises(RuntimeError, match="not fitted"):
        LoadTTFTModel().predict_one(x, "rate", 2.0)
    with pytest.raises(ValueError):
        LoadTTFTModel.from_dict({"kind": "something else"})


def test_predicted_sustainable_rate_is_where_the_percentile_meets_the_target():
    model = LoadTTFTModel().fit(synthetic_load_cells())
    x = {"uncached_tokens": 400, "cached_tokens": 64, "completion_tokens": 20}
    target = model.predict_one(x, "rate", 2.0) * 1.5
    rate = model.sustainable_rate(x, target)
    assert rate > 2.0
    assert model.predict_one(x, "rate", rate) == pytest.approx(target, rel=1e-3)


def test_noise_floor_of_identical_repeats_is_zero_and_grows_with_noise():
    quiet = noise_floor(synthetic_load_cells(noise=0.0))
    noisy = noise_floor(synthetic_load_cells(noise=0.1))
    assert all(v == 0 for per in quiet.values() for vs in per.values() for v in vs)
    assert np.mean([v for per in noisy.values() for vs in per.values() for v in vs]) > 0.03


# -- the report --------------------------------------------------------------------------------
def _rows(label: str, base: float, load: float, blocks: int = 2, n: int = 30) -> list[dict]:
    rows = []
    for b in range(blocks):
        for i in range(n):
            rows.append({"template": label, "load_kind": "rate", "load_value": load, "block": b, "index": i,
                         "warmup": i < 3, "record_id": str(i), "sent_s": i * 0.5, "ttft_ms": base * load + i,
                         "e2e_ms": 500.0, "prompt_tokens": 100, "completion_tokens": 10, "ok": True, "error": "",
                         "block_span_s": 15.0})
    return rows


def test_load_figures_compare_templates_and_find_their_sustainable_rates():
    rows = []
    for rate in (1.0, 2.0, 4.0):
        rows += _rows("baseline", 200.0, rate) + _rows("winner", 100.0, rate)
    fig = load_figures(rows, templates=["baseline", "winner"], target_ms=450.0)
    at2 = fig.at(Load(rate_rps=2.0))
    assert at2["templates"]["baseline"]["p95_ttft_ms"]["n"] == 54
    assert at2["difference"]["p95_ttft_ms"]["value"] == pytest.approx(-200.0, abs=1)
    assert fig.sustainable["winner"]["value"] > fig.sustainable["baseline"]["value"]
    text = markdown_tables(fig)
    assert "winner - baseline" in text and "Sustainable rate" in text


def test_held_out_error_skips_a_prompt_the_others_cannot_fit_without():
    cells = [c for c in synthetic_load_cells() if c["prompt_id"] in ("p0", "p1")]
    assert load_error_table(cells) == []  # one prompt left cannot give a capacity: no figure, no crash


def test_a_rate_a_template_cannot_keep_up_with_is_marked_not_sustained():
    rows = _rows("baseline", 200.0, 1.0) + _rows("winner", 100.0, 1.0)
    for r in rows:  # the baseline's blocks took 3x as long as their arrivals: 0.6 req/s of 1.0 offered
        if r["template"] == "baseline":
            r["block_span_s"] = 50.0
    fig = load_figures(rows, templates=["baseline", "winner"])
    at = fig.at(Load(rate_rps=1.0))["templates"]
    assert at["baseline"]["sustained"] is False and at["winner"]["sustained"] is True
    assert "baseline (**not sustained**" in markdown_tables(fig)

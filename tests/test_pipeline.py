"""The nightly pipeline's rules without Prefect or the engine: budgets, spec selection,
cache keys, TTFT staleness, promotion, idempotent publishing, the engine pool, reports."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from promptdistill.pipeline import budgets, jobs, publish, report, session, ttft_models
from promptdistill.core.config import EngineConfig
from promptdistill.core.display import format_number
from promptdistill.engine.base import EngineIdentity
from promptdistill.core.errors import ModelIdentityError, SpecError, TemplateNotFoundError
from promptdistill.registry import Registry
from tests.fakes import FakeEngine

REPO = Path(__file__).resolve().parents[1]
IDENTITY = EngineIdentity(model="m", backend="vllm-local", dtype="float32", max_model_len=2048, hardware="cpu x2",
                          engine_version="vllm 0")


# ------------------------------------------------------------------ fixtures
def _measurements(identity: EngineIdentity = IDENTITY, n_prompts: int = 24, seed: int = 0) -> pd.DataFrame:
    """A measurement frame shaped like the profiler's: TTFT grows with uncached tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        uncached = int(rng.integers(40, 1500))
        cached = int(rng.choice([0, 128, 256]))
        for repeat in range(2):
            rows.append({
                "prompt_id": f"p{p}", "uncached_tokens": uncached, "cached_tokens": cached,
                "fewshot_count": int(rng.integers(0, 8)), "semantic_density": float(rng.uniform(0.3, 0.9)),
                "entropy_bits": float(rng.uniform(7, 10)), "warm": cached > 0,
                "ttft_ms": 150 + 1.2 * uncached + 0.0004 * uncached**2 + 0.05 * cached + float(rng.normal(0, 5)),
                "run_id": "synthetic", **{f"engine_{k}": v for k, v in identity.to_dict().items()},
                "engine_key": identity.key(),
            })
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def fitted():
    model, fit, _rows = ttft_models.fit_ttft_model(_measurements(), seed=0, source="synthetic.parquet")
    return model, fit


@pytest.fixture()
def registry(tmp_path):
    return Registry(tmp_path / "registry")


@pytest.fixture()
def prompts(tmp_path):
    """A copy of two bundled specs and their datasets (so they can be broken at will)."""
    (tmp_path / "prompts").mkdir()
    shutil.copytree(REPO / "datasets", tmp_path / "datasets", ignore=shutil.ignore_patterns("generators"))
    for name in ("ticket_triage", "summarize"):
        shutil.copy(REPO / "prompts" / f"{name}.yaml", tmp_path / "prompts" / f"{name}.yaml")
    return tmp_path / "prompts"


# ------------------------------------------------------------------- budgets
def test_ttft_budget_maps_onto_the_profiler_config():
    config = budgets.TTFTBudget(points=5, repeats=1, spec_records=0, max_minutes=2, density_probe_tokens=(),
                                 fewshot_probe=False).profile_config(prompts_dir="p", seed=3)
    assert (config.points, config.repeats, config.spec_records, config.max_minutes) == (5, 1, 0, 2)
    assert config.density_probe_tokens == () and config.fewshot_probe is False
    assert (config.prompts_dir, config.seed) == ("p", 3)
    assert config.queue_batches and budgets.TTFTBudget(queue_batches=()).profile_config().queue_batches == ()
    assert budgets.budget_preset("quick")["ttft_budget"].profile_config().queue_batches == ()
    # The matmul peak is the study's (bench/ttft_study), not the model's: no preset's refresh measures it.
    assert not any(budgets.budget_preset(name)["ttft_budget"].matmul_probe for name in budgets.BUDGET_PRESETS)


def test_ttft_budget_declares_no_profile_knob_of_its_own():
    """Each of its profile knobs is ProfileConfig's field: the same type, default, bounds and help."""
    import dataclasses
    import typing

    from promptdistill.ttft.profile import ProfileConfig

    profile = {f.name: f for f in dataclasses.fields(ProfileConfig)}
    hints, profile_hints = typing.get_type_hints(budgets.TTFTBudget), typing.get_type_hints(ProfileConfig)
    knobs = [f for f in dataclasses.fields(budgets.TTFTBudget) if f.name != "keep_contended"]
    assert knobs and all(f.name in profile for f in knobs)
    for f in knobs:
        assert (f.default, f.metadata, hints[f.name]) == (profile[f.name].default, profile[f.name].metadata,
                                                          profile_hints[f.name]), f.name
    assert budgets.TTFTBudget().profile_config() == ProfileConfig().validate()


def test_ttft_expected_minutes_grows_with_the_design_and_stops_at_the_safety_stop():
    smoke, quick = (budgets.budget_preset(n)["ttft_budget"] for n in ("smoke", "quick"))
    assert 0 < budgets.ttft_expected_minutes(smoke, 5) < budgets.ttft_expected_minutes(quick, 5) < quick.max_minutes
    assert budgets.ttft_expected_minutes(replace(quick, max_minutes=0.5), 5) == 0.5


def test_ttft_budget_refuses_bad_values_and_unknown_fields():
    with pytest.raises(ValueError, match="max_minutes must be positive, got 0"):
        budgets.TTFTBudget(max_minutes=0)
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        budgets.TTFTBudget(repeats=0)
    with pytest.raises(TypeError, match="point"):
        budgets.TTFTBudget(point=3)


def test_task_timeout_exceeds_the_stages_own_limits():
    assert budgets.task_timeout_s(2.0, 3.0) > 5 * 60


# --------------------------------------------------------------- spec jobs
def test_select_spec_files_all_or_named(prompts):
    assert [p.stem for p in jobs.select_spec_files(prompts)] == ["summarize", "ticket_triage"]
    assert [p.stem for p in jobs.select_spec_files(prompts, ["ticket_triage"])] == ["ticket_triage"]


def test_select_spec_files_names_the_unknown_and_the_known(prompts, tmp_path):
    with pytest.raises(SpecError, match=r"no spec named 'nope'.*known: summarize, ticket_triage"):
        jobs.select_spec_files(prompts, ["ticket_triage", "nope"])
    with pytest.raises(SpecError, match="prompts folder not found"):
        jobs.select_spec_files(tmp_path / "missing")


def test_prepare_job_hashes_spec_and_dataset(prompts):
    from promptdistill.specs.datasets import dataset_hash
    from promptdistill.specs import load_spec

    job = jobs.prepare_job(prompts / "ticket_triage.yaml")
    spec = load_spec(prompts / "ticket_triage.yaml")
    assert job.name == "ticket_triage"
    assert job.spec_hash == spec.spec_hash()
    assert job.dataset_hash == dataset_hash(spec.dataset)


def test_prepare_job_names_the_missing_dataset(prompts):
    (prompts.parent / "datasets" / "summarize.jsonl").unlink()
    with pytest.raises(SpecError, match=r"summarize\.yaml: dataset: .*not found.*summarize\.jsonl"):
        jobs.prepare_job(prompts / "summarize.yaml")


def test_work_key_depends_on_exactly_what_determines_the_result(prompts, monkeypatch):
    from promptdistill.optimize import OptimizeBudget, SelectionRule

    job = jobs.prepare_job(prompts / "ticket_triage.yaml")
    base = dict(engine_key="e1", seed=0, budget=OptimizeBudget(), selection=SelectionRule(), ttft_model="t1")
    key = jobs.work_key("optimize", job, **base)
    assert key.startswith("optimize-")
    assert key == jobs.work_key("optimize", jobs.prepare_job(prompts / "ticket_triage.yaml"), **base)
    variants = [
        jobs.work_key("distill", job, **base),
        jobs.work_key("optimize", jobs.SpecJob(**{**job.__dict__, "spec_hash": "x"}), **base),
        jobs.work_key("optimize", jobs.SpecJob(**{**job.__dict__, "dataset_hash": "x"}), **base),
        jobs.work_key("optimize", job, **{**base, "engine_key": "e2"}),
        jobs.work_key("optimize", job, **{**base, "budget": OptimizeBudget(max_lm_calls=7)}),
        jobs.work_key("optimize", job, **{**base, "selection": SelectionRule(ttft="cold")}),
        jobs.work_key("optimize", job, **{**base, "seed": 1}),
        jobs.work_key("optimize", job, **{**base, "ttft_model": "t2"}),
        jobs.work_key("optimize", job, **base, distill={"max_rounds": 1}),
    ]
    assert len({key, *variants}) == len(variants) + 1
    # The spec file's location is not part of it: only content counts.
    moved = jobs.SpecJob(**{**job.__dict__, "path": "/elsewhere/ticket_triage.yaml"})
    assert jobs.work_key("optimize", moved, **base) == key
    # New scoring or decision rules: the same inputs no longer reuse a result made under the old ones.
    monkeypatch.setattr(jobs, "RESULTS_VERSION", jobs.RESULTS_VERSION + 1)
    assert jobs.work_key("optimize", job, **base) != key


def test_stage_keys_follow_the_judge_definitions_and_nothing_else(prompts, tmp_path):
    from promptdistill.core.config import Settings
    from promptdistill.judges.definitions import BUILTIN_DIR
    from promptdistill.optimize import OptimizeBudget, SelectionRule

    judges = tmp_path / "judges"
    judges.mkdir()
    (judges / "my_judge.yaml").write_text("name: my_judge\nversion: 1\n")
    (judges / "README.md").write_text("notes\n")
    settings = Settings(judges_dir=judges)
    job = jobs.prepare_job(prompts / "ticket_triage.yaml")

    def keys() -> tuple[str, str]:
        return (jobs.distill_key(job, engine_key="e", seed=0, distill={"max_rounds": 1}, settings=settings),
                jobs.optimize_key(job, engine_key="e", seed=0, budget=OptimizeBudget(), selection=SelectionRule(),
                                  distill=None, ttft_model="t1", settings=settings))

    first = keys()
    assert first == keys()
    assert set(jobs.judges_hash(judges)) == {"my_judge", *(p.stem for p in BUILTIN_DIR.glob("*.yaml"))}
    # Not a judge definition: the keys stay.
    (judges / "README.md").write_text("other notes\n")
    (judges / "draft.yaml.bak").write_text("x\n")
    assert keys() == first
    # A project judge edited: both stages rerun.
    (judges / "my_judge.yaml").write_text("name: my_judge\nversion: 2\n")
    edited = keys()
    assert edited[0] != first[0] and edited[1] != first[1]
    # A project copy overriding a built-in: what load_judge reads changed, so the keys do.
    (judges / "rubric_score.yaml").write_bytes((BUILTIN_DIR / "rubric_score.yaml").read_bytes() + b"# tweaked\n")
    overridden = keys()
    assert overridden[0] != edited[0] and overridden[1] != edited[1]
    # The judge engine is in the key too.
    from promptdistill.core.config import EngineConfig

    settings = Settings(judges_dir=judges, judge=EngineConfig(backend="server", served_model_name="judge-model"))
    assert keys()[1] != overridden[1]


def test_settings_key_reduces_dataclasses_and_models_to_json():
    from promptdistill.optimize import OptimizeBudget

    assert jobs.settings_key(OptimizeBudget(fewshot_counts=(0, 2)))["fewshot_counts"] == [0, 2]
    assert jobs.settings_key(budgets.TTFTBudget(points=3))["points"] == 3
    assert jobs.settings_key({"x": float("nan")}) == {"x": None}
    assert jobs.settings_key(None) is None


def test_run_ids_sort_by_time_and_are_registry_names():
    from datetime import timezone

    from promptdistill.pipeline.night_report import latest_run_id
    from promptdistill.registry.records import check_name

    t = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert jobs.run_id_for("0f1e2d3c-aaaa-bbbb-cccc", t) == "20250102T030405Z-0f1e2d3c"
    assert jobs.run_id_for(None, t) == "20250102T030405Z-local"
    # UTC whatever the clock's zone: the stamp is the same instant.
    assert jobs.run_id_for("x", t.astimezone(timezone(timedelta(hours=-5)))) == "20250102T030405Z-x"
    ids = [jobs.run_id_for(flow, t + timedelta(seconds=s)) for flow, s in (("ffffffff", 0), ("00000000", 1), (None, 2))]
    assert sorted(ids) == ids and all(check_name(i, "run id") for i in ids)

    class Runs:  # the newest run with a summary, by its id
        def get_run_log(self, run_id, part):
            return run_id

    assert latest_run_id(Runs(), reversed(ids)) == ids[-1]


# --------------------------------------------------------------- TTFT model
def test_ttft_status_missing_then_fresh_then_stale(registry, fitted):
    model, _ = fitted
    status = ttft_models.ttft_status(registry, IDENTITY, max_age_hours=24)
    assert status.needs_refresh and "no TTFT model" in status.reason and status.version is None

    record = ttft_models.publish_ttft_model(registry, model)
    fitted_at = datetime.fromisoformat(model.fitted_at)
    fresh = ttft_models.ttft_status(registry, IDENTITY, max_age_hours=24, now=fitted_at + timedelta(hours=2))
    assert not fresh.needs_refresh and fresh.version == record.version and fresh.model_version == model.version
    stale = ttft_models.ttft_status(registry, IDENTITY, max_age_hours=24, now=fitted_at + timedelta(hours=25))
    assert stale.needs_refresh and "25.0 h old (limit 24 h)" in stale.reason
    assert not ttft_models.ttft_status(registry, IDENTITY, max_age_hours=None, now=fitted_at + timedelta(days=900)).needs_refresh

    other = EngineIdentity(**{**IDENTITY.to_dict(), "dtype": "bfloat16"})
    assert ttft_models.ttft_status(registry, other, max_age_hours=None).needs_refresh


def test_ttft_model_round_trips_through_the_registry(registry, fitted):
    model, _ = fitted
    ttft_models.publish_ttft_model(registry, model)
    loaded = ttft_models.load_ttft_model(registry, IDENTITY)
    features = {"uncached_tokens": 500, "cached_tokens": 0, "fewshot_count": 2, "semantic_density": 0.5, "entropy_bits": 9.0}
    assert loaded.version == model.version
    assert loaded.predict(features) == model.predict(features)
    other = EngineIdentity(**{**IDENTITY.to_dict(), "hardware": "gpu"})
    with pytest.raises(TemplateNotFoundError, match="no TTFT model for engine .*profile-ttft"):
        ttft_models.load_ttft_model(registry, other)


def test_a_newest_model_this_code_cannot_load_gives_way_to_the_last_good_one(registry, fitted):
    from sklearn.ensemble import HistGradientBoostingRegressor

    from promptdistill.core.errors import IntegrityError
    from promptdistill.ttft.estimators import with_mechanics
    from promptdistill.ttft.model import TTFTModel

    good, _ = fitted
    ttft_models.publish_ttft_model(registry, good)
    # Published by an older promptdistill whose mechanics handed the regressor 7 columns.
    rng = np.random.default_rng(0)
    old = HistGradientBoostingRegressor(max_iter=3).fit(rng.random((30, 7)), rng.random(30))
    ttft_models.publish_ttft_model(registry, TTFTModel(with_mechanics(old), "hgb", "hgb", IDENTITY))

    status = ttft_models.ttft_status(registry, IDENTITY, max_age_hours=None)
    assert status.needs_refresh and "TTFT model 2 cannot be used" in status.reason and "takes 7 inputs" in status.reason
    assert status.version == 1  # what a failed refresh falls back on
    with pytest.warns(UserWarning, match="takes 7 inputs.*using TTFT model 1"):
        assert ttft_models.load_ttft_model(registry, IDENTITY).version == good.version
    with pytest.raises(IntegrityError, match=r"ttft-model/.*:2/model.json: estimator"):
        ttft_models.load_ttft_model(registry, IDENTITY, version=2)
    outcome = ttft_models.after_failed_refresh(status, "engine down")
    assert outcome["version"] == 1 and "using the old model" in outcome["reason"]


def test_ttft_metadata_is_json_even_with_undefined_scores(registry, fitted):
    model, _ = fitted
    model.metrics = {**model.metrics, "cv": {"linear": {"r2": float("nan"), "mape": np.float64(0.1)}}}
    record = ttft_models.publish_ttft_model(registry, model)
    assert record.metadata["metrics"]["cv"]["linear"] == {"r2": None, "mape": 0.1}


def test_fit_reads_the_engine_identity_from_the_frame(fitted):
    model, fit = fitted
    assert model.engine_identity == IDENTITY
    assert model.name == fit.chosen
    with pytest.raises(ValueError, match="2 engine identities"):
        mixed = pd.concat([_measurements(), _measurements(EngineIdentity(**{**IDENTITY.to_dict(), "model": "n"}))])
        ttft_models.fit_ttft_model(mixed)
    with pytest.raises(ValueError, match="no engine_key column"):
        ttft_models.fit_ttft_model(_measurements().drop(columns=["engine_key"]))
    with pytest.raises(ModelIdentityError):
        model.predict({"uncached_tokens": 1, "cached_tokens": 0, "fewshot_count": 0, "semantic_density": 0.5,
                       "entropy_bits": 1.0}, engine_identity=EngineIdentity(**{**IDENTITY.to_dict(), "model": "n"}))


# ---------------------------------------------------------- promote/publish
@pytest.mark.parametrize(
    "gate, allow, has_production, kept_baseline, labels, words",
    [
        (True, True, True, False, ("candidate", "production"), "promoted"),
        (True, False, True, False, ("candidate",), "promotion not allowed"),
        (False, True, True, True, ("candidate",), "gate not passed"),
        (False, False, True, True, ("candidate",), "promotion not allowed"),
        # First night: no production yet, the verified spec as written becomes production.
        (False, True, False, True, ("candidate", "production"), "no production version yet"),
        (False, False, False, True, ("candidate",), "promotion not allowed"),
    ],
)
def test_promotion_needs_a_passing_gate_and_permission(gate, allow, has_production, kept_baseline, labels, words):
    decision = publish.promotion(gate, allow, gate_reason="why", has_production=has_production, kept_baseline=kept_baseline)
    assert decision.labels == labels
    assert words in decision.reason and "why" in decision.reason


CONTENT = {"name": "t", "system": "Answer.", "user": "Q: {q}", "inputs": ["q"], "output_schema": None,
           "response_format": "none", "max_tokens": 8, "sampling": {"temperature": 0.0}}


def test_publish_once_is_idempotent_per_run_key(registry):
    first, created = publish.publish_once(registry, "t", CONTENT, run_key="k1", labels=["candidate"])
    assert created and first.version == 1 and first.provenance["run_key"] == "k1"
    again, created = publish.publish_once(registry, "t", CONTENT, run_key="k1", labels=["candidate", "production"])
    assert not created and again.version == 1
    assert registry.labels("t") == {"candidate": 1, "production": 1}  # a label it never had is set
    other, created = publish.publish_once(registry, "t", {**CONTENT, "system": "Answer briefly."}, run_key="k2",
                                           labels=["candidate"])
    assert created and other.version == 2 and other.parent == 1  # parent: the production version
    assert registry.labels("t") == {"candidate": 2, "production": 1}


def test_publish_once_respects_a_rollback_on_rerun(registry):
    publish.publish_once(registry, "t", CONTENT, run_key="k1", labels=["candidate", "production"])
    publish.publish_once(registry, "t", {**CONTENT, "system": "Answer briefly."}, run_key="k2",
                          labels=["candidate", "production"])
    registry.rollback("t", "production", reason="v2 misbehaves")
    record, created = publish.publish_once(registry, "t", {**CONTENT, "system": "Answer briefly."}, run_key="k2",
                                            labels=["candidate", "production"])
    assert not created and record.version == 2
    assert registry.labels("t") == {"candidate": 2, "production": 1}


# ------------------------------------------------------------- engine pool
class _ClosingFake(FakeEngine):
    closed = 0

    def close(self) -> None:
        type(self).closed += 1


SERVER = EngineConfig(backend="server", server_urls=("http://a/v1", "http://b/v1"))


def test_engine_session_creates_once_and_closes_what_it_created(monkeypatch):
    created = []
    monkeypatch.setattr("promptdistill.pipeline.session.load_engine", lambda config: created.append(config) or _ClosingFake())
    _ClosingFake.closed = 0
    with session.engine_session(SERVER) as engine:
        assert session.shared_engine(SERVER) is engine  # tasks get the same one
    assert len(created) == 1 and _ClosingFake.closed == 1
    with session.engine_session(SERVER) as again:
        assert again is not engine  # closed engines are not handed out again
    assert len(created) == 2


def test_engine_session_never_closes_an_adopted_engine(monkeypatch):
    monkeypatch.setattr("promptdistill.pipeline.session.load_engine", lambda config: pytest.fail("must not create"))
    mine = _ClosingFake()
    _ClosingFake.closed = 0
    session.adopt_engine(mine, SERVER)
    try:
        with session.engine_session(SERVER) as engine:
            assert engine is mine
        assert _ClosingFake.closed == 0
    finally:
        assert session.forget_engine(SERVER) is mine


def test_engine_limit_is_per_host_for_local_and_per_endpoint_for_servers():
    name, slots = session.engine_limit(EngineConfig(), IDENTITY)
    assert slots == 1 and name.startswith(f"promptdistill-engine-{IDENTITY.key()}-")
    name, slots = session.engine_limit(SERVER, IDENTITY)
    assert slots == 2 and name.startswith(f"promptdistill-engine-{IDENTITY.key()}-2ep-")
    # Another set of endpoints is another limit (its size follows the new count) ...
    one = replace(SERVER, server_urls=SERVER.server_urls[:1])
    assert session.engine_limit(one, IDENTITY)[0] != name and session.engine_limit(one, IDENTITY)[1] == 1
    # ... the same set, in another order or with a trailing slash, the same one.
    same = replace(SERVER, server_urls=tuple(u + "/" for u in reversed(SERVER.server_urls)))
    assert session.engine_limit(same, IDENTITY) == (name, 2)


def test_specs_failed_error_keeps_the_summary_through_pickling():
    err = pickle.loads(pickle.dumps(jobs.SpecsFailedError("1 of 2 specs failed: a", {"failed": ["a"]})))
    assert str(err) == "1 of 2 specs failed: a" and err.summary == {"failed": ["a"]}


# ------------------------------------------------------------------- reports
FIGURES = {"tokens_before": 410, "tokens_after": 190, "ttft_ms_before": 620.0, "ttft_ms_after": 380.0,
           "ttft_ms_predicted_before": 600.0, "ttft_ms_predicted_after": 370.0, "quality_before": 0.80,
           "quality_before_low": 0.7, "quality_before_high": 0.9, "quality_after": 0.82, "quality_after_low": 0.72,
           "quality_after_high": 0.92, "valid_json_rate_before": 0.9, "valid_json_rate_after": 1.0,
           "gate_passed": True, "gate_reason": "non-inferior", "lm_calls": 321, "minutes": 4.2}


def test_summary_rows_have_fixed_columns_and_refuse_unknown_ones():
    row = report.summary_row("t", FIGURES, version=3, labels=["candidate", "production"], cached=True)
    assert tuple(row) == report.SUMMARY_COLUMNS
    assert row["labels"] == "candidate,production" and row["status"] == "optimized" and row["cached"] is True
    # Every figure lands in its own column unchanged; every column not given is empty.
    given = {**FIGURES, "template": "t", "status": "optimized", "version": 3, "labels": "candidate,production",
             "cached": True}
    assert {c: row[c] for c in given} == given
    assert {c: v for c, v in row.items() if c not in given} == {c: None for c in row if c not in given}
    with pytest.raises(KeyError, match="unknown column.*tokens_befor"):
        report.summary_row("t", {"tokens_befor": 1})
    failed = report.failed_row("u", "SpecError: bad")
    assert failed["status"] == "failed" and failed["error"] == "SpecError: bad" and failed["cached"] is False
    assert all(failed[c] is None for c in FIGURES)
    frame = report.summary_frame([row, failed, {"template": "partial", "tokens_before": 7, "not_a_column": 1}])
    assert list(frame.columns) == list(report.SUMMARY_COLUMNS) and len(frame) == 3
    assert frame["template"].tolist() == ["t", "u", "partial"] and frame["status"].tolist()[:2] == ["optimized", "failed"]
    assert frame.loc[0, "tokens_before"] == 410 and frame.loc[0, "quality_after_high"] == 0.92
    assert frame.loc[1, "error"] == "SpecError: bad" and frame.loc[2, "tokens_before"] == 7
    assert pd.isna(frame.loc[1, "tokens_before"]) and pd.isna(frame.loc[2, "ttft_ms_after"]) and pd.isna(frame.loc[2, "status"])


def test_summary_table_shows_before_after_and_failures():
    rows = [report.summary_row("ticket_triage", FIGURES, version=3, labels=["candidate"]),
            report.failed_row("summarize", "SpecError: prompts/summarize.yaml: dataset: missing")]
    text = report.format_summary_table(rows)
    assert "410 -> 190" in text and "620 -> 380" in text and "0.800 -> 0.820" in text
    assert "ticket_triage:3 (candidate)" in text
    assert "summarize: FAILED: SpecError: prompts/summarize.yaml" in text


def test_a_summary_read_back_from_parquet_shows_the_same_as_the_row():
    """The markdown artifacts and the night report share one formatting, and one reading of
    a Parquet run log: NaN, infinity and a version stored as a float are shown as written."""
    from promptdistill.core.jsonio import json_records

    row = report.summary_row("ticket_triage", {**FIGURES, "quality_before_low": float("nan"),
                                               "ttft_ms_after": float("inf")}, version=3, labels=["candidate"])
    (back,) = json_records(report.summary_frame([row, report.failed_row("x", "boom")]).iloc[:1])
    assert back["ttft_ms_after"] is None and back["quality_before_low"] is None and back["version"] == 3
    assert json.dumps(back, allow_nan=False)  # plain JSON: no NaN, no numpy scalars
    assert format_number(None) == format_number(float("nan")) == format_number(np.float64("nan"), "+.3f") \
        == format_number(np.float32("nan"), ".3f") == "-"
    assert format_number(0.8123, ".2f") == "0.81" and format_number(np.int64(7), "d") == "7"
    assert report.format_ci(0.8, None, 0.9) == report.format_ci(0.8, float("nan"), 0.9) == "0.800"
    assert report.format_ci(float("nan"), 0.7, 0.9) == "-" and report.format_ci(0.8, 0.7, 0.9) == "0.800 [0.700, 0.900]"
    assert report.version_label({**back, "version": 3.0}) == "ticket_triage:3 (candidate)"
    assert report.version_label({**back, "version": float("nan")}) == "-"


@pytest.mark.parametrize("ttft, line", [
    ({"state": "fresh", "version": 2, "reason": "TTFT model 2 is 3.0 h old: fresh"},
     "TTFT model: fresh (version 2): TTFT model 2 is 3.0 h old: fresh"),
    ({"state": "stale", "version": 1, "reason": "TTFT model 1 is 200.0 h old; refresh FAILED (x), using the old model"},
     "TTFT model: stale (version 1): TTFT model 1 is 200.0 h old; refresh FAILED (x), using the old model"),
    ({"state": "none", "version": None, "reason": "no TTFT model for engine e and the refresh failed: x"},
     "TTFT model: none: no TTFT model for engine e and the refresh failed: x"),
    ({"refreshed": True, "version": 4, "reason": "refreshed: no TTFT model"},  # a summary from before states
     "TTFT model: refreshed (version 4): refreshed: no TTFT model"),
])
def test_the_summary_states_the_ttft_models_state(ttft, line):
    assert report.ttft_model_line(ttft) == line
    assert line in report.nightly_report_markdown([report.failed_row("a", "boom")], ttft=ttft)


def test_without_a_ttft_model_each_spec_stops_with_the_reason_before_any_work(monkeypatch):
    """The night goes on to its specs without a TTFT model: each one's row is failed with the
    reason, and no task (prepare, distill, optimize) runs for it."""
    from types import SimpleNamespace

    from promptdistill.flows import tasks

    def no_task(*args, **kwargs):
        raise AssertionError("no task may run without a TTFT model")

    monkeypatch.setattr(tasks, "prepare_spec", SimpleNamespace(with_options=no_task))
    reason = "no TTFT model for engine e1 and the refresh failed: RuntimeError: TTFT profile stopped at the safety stop"
    ttft = ttft_models.after_failed_refresh(ttft_models.TTFTStatus("e1", True, "no TTFT model for engine e1"),
                                            "RuntimeError: TTFT profile stopped at the safety stop")
    assert ttft["reason"] == reason
    settings = SimpleNamespace(engine=None, registry="reg")
    engine = SimpleNamespace(identity=SimpleNamespace(key=lambda: "e1"))
    common = tasks.spec_arguments(settings, engine, budgets.budget_preset("smoke"), ttft, seed=0,
                                  allow_promotion=True, run_id="r1")
    rows = [tasks.run_spec(f"prompts/{name}.yaml", **common) for name in ("ticket_triage", "summarize")]
    assert [(r["template"], r["status"], r["error"]) for r in rows] == [
        ("ticket_triage", "failed", reason), ("summarize", "failed", reason)]
    # With a model, nothing stops the spec here.
    assert tasks.spec_arguments(settings, engine, budgets.budget_preset("smoke"), {"state": "stale", "reason": "old"},
                                seed=0, allow_promotion=True, run_id="r1")["no_ttft_model"] is None


def test_markdown_reports(tmp_path):
    row = report.summary_row("ticket_triage", FIGURES, version=3, labels=["candidate"], promotion="gate passed")
    png = tmp_path / "p.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 100)
    spec_md = report.spec_report_markdown(row, plots={"Pareto front": png})
    assert "| prompt tokens | 410 | 190 |" in spec_md and "0.800 [0.700, 0.900]" in spec_md
    assert "| valid-JSON rate | 90.0% | 100.0% |" in spec_md and "321 LM calls" in spec_md
    assert "![Pareto front](data:image/png;base64," in spec_md
    night = report.nightly_report_markdown(
        [row, report.failed_row("summarize", "boom")], ttft={"reason": "fresh"}, run_id="r1", registry_root="reg")
    assert "1 of 2 specs done, 1 failed." in night and "- **summarize**: boom" in night
    assert "`ticket_triage:3` labels: candidate" in night
    # The markdown summary has the terminal table's cells, row by row.
    assert "| template | status | tokens | TTFT ms | quality | published |\n|---|---|---|---|---|---|\n" in night
    text_row = report.format_summary_table([row]).splitlines()[2].split()
    md_row = next(line for line in night.splitlines() if line.startswith("| ticket_triage |"))
    assert [c for cell in md_row.strip("| ").split(" | ") for c in cell.split()] == text_row


def test_image_markdown_links_big_or_missing_images(tmp_path):
    big = tmp_path / "big.png"
    big.write_bytes(b"0" * 2048)
    assert report.image_markdown(big, "plot", max_bytes=1024) == f"plot: `{big}` (2 KiB)"
    assert "not produced" in report.image_markdown(tmp_path / "none.png", "plot")


def test_artifact_keys_are_prefect_safe():
    assert report.artifact_key("ticket_triage", "Candidates") == "ticket-triage-candidates"
    assert report.artifact_key("ttft-model", "ab12", "report") == "ttft-model-ab12-report"
    with pytest.raises(ValueError):
        report.artifact_key("__", "")


def test_ttft_report_markdown(tmp_path, registry, fitted):
    model, fit = fitted
    record = ttft_models.publish_ttft_model(registry, model)
    rows = report.ttft_score_rows(fit)
    assert rows[0]["model"] == fit.chosen and rows[0]["chosen"] and {"cv_mape", "heldout_mape"} <= set(rows[0])
    png = tmp_path / "fit.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 100)
    md = report.ttft_report_markdown(model, fit, record, {"fit": png})
    assert f"chosen: **{model.name}**" in md and IDENTITY.key() in md and "data:image/png;base64," in md


def test_fit_keeps_contended_rows_only_when_too_few_prompts_remain(monkeypatch):
    frame = _measurements(n_prompts=12)
    # The profiler's contention flag, whatever it is computed from: 4 prompts uncontended.
    monkeypatch.setattr("promptdistill.ttft.fit.flag_contended", lambda df, **_: pd.Series(df.index >= 8, index=df.index))
    model, fit, _ = ttft_models.fit_ttft_model(frame)
    assert "fitted on every row" in model.training["contended_rows_kept"]
    assert fit.rows["rows_contended"] == 0
    with pytest.raises(ValueError, match="distinct prompts"):
        ttft_models.fit_ttft_model(frame.iloc[:8], keep_contended=True)


# ---------------------------------------------------------------- presets, CLI
def test_budget_presets_build_the_flow_parameters(prompts):
    from promptdistill.optimize import OptimizeBudget

    job = jobs.prepare_job(prompts / "ticket_triage.yaml")
    keys = set()
    for name in budgets.BUDGET_PRESETS:
        preset = budgets.budget_preset(name)
        assert set(preset) == {"ttft_budget", "distill", "budget", "selection"}, name
        # Each preset is its own cache key: a night never reuses another preset's results.
        keys.add(jobs.work_key("optimize", job, engine_key="e", seed=0, budget=preset["budget"],
                               selection=preset["selection"], distill=preset["distill"]))
    assert len(keys) == len(budgets.BUDGET_PRESETS)
    # Larger presets do more of everything: LM calls, dev records, profiling time.
    smoke, quick, full = (budgets.budget_preset(n) for n in ("smoke", "quick", "full"))
    for stage in ("budget", "distill"):
        assert smoke[stage].max_lm_calls < quick[stage].max_lm_calls <= full[stage].max_lm_calls, stage
        assert smoke[stage].dev_size < quick[stage].dev_size <= full[stage].dev_size, stage
    assert smoke["ttft_budget"].max_minutes < quick["ttft_budget"].max_minutes <= full["ttft_budget"].max_minutes
    assert quick["budget"].max_lm_calls <= OptimizeBudget().max_lm_calls
    with pytest.raises(ValueError, match="unknown budget preset 'huge'; known: smoke, quick, full"):
        budgets.budget_preset("huge")


def test_a_deployed_night_races_exactly_once():
    """Every way a night starts takes its stage settings from one preset, and in every
    preset the distiller only proposes: the optimizer's race is the night's one race. At
    af0b1f5 the deployment ran the flow's own defaults, whose DistillConfig() raced too."""
    import inspect

    import yaml

    from promptdistill.cli.init import project_files
    from promptdistill.flows.nightly import nightly
    from promptdistill.flows.optimize_prompt import optimize_prompt

    def races(settings: dict) -> int:
        distill = settings["distill"]
        return 1 + int(distill is not None and distill.race)  # the optimizer always races

    flows = {"nightly": nightly, "optimize-prompt": optimize_prompt}
    for source in (Path("prefect.yaml").read_text(), project_files(Path("p"))[Path("p/prefect.yaml")]):
        for deployment in yaml.safe_load(source)["deployments"]:
            if deployment["name"] not in flows:
                continue
            default = inspect.signature(flows[deployment["name"]].fn).parameters["preset"].default
            preset = (deployment.get("parameters") or {}).get("preset", default)
            assert races(budgets.stage_settings(preset)) == 1, deployment["name"]
    for name in budgets.BUDGET_PRESETS:
        assert races(budgets.stage_settings(name)) == 1, name
    # An explicit setting replaces the preset's, the rest stays.
    own = budgets.stage_settings("quick", budget=budgets.budget_preset("smoke")["budget"])
    assert own["budget"].dev_size == 12 and own["distill"] == budgets.budget_preset("quick")["distill"]
    assert budgets.stage_settings("quick", distill_instructions=False)["distill"] is None


def test_nightly_command_line_runs_the_flow_with_what_it_was_given(monkeypatch):
    import io

    import promptdistill.flows.nightly as flows
    from promptdistill.cli import build_parser
    from promptdistill.cli.nightly import _run
    from promptdistill.pipeline.console import Terminal

    called = []

    class State:
        def result(self, raise_on_failure=True):
            return "the night's outcome"

    def nightly(**params):
        called.append(params)
        return State()

    monkeypatch.setattr(flows, "nightly", nightly)
    args = build_parser().parse_args(["nightly", "--specs", "ticket_triage, word_problems", "--budget", "smoke",
                                      "--no-promote", "--prompts-dir", str(REPO / "prompts"), "--seed", "3"])
    outcome, _ = _run(args, Terminal(io.StringIO(), io.StringIO(), None))
    assert outcome == "the night's outcome"
    assert called == [{"specs": ["ticket_triage", "word_problems"], "preset": "smoke", "distill_instructions": True,
                       "prompts_dir": str(REPO / "prompts"), "seed": 3, "allow_promotion": False,
                       "ttft_max_age_hours": 168.0, "return_state": True}]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["nightly", "--budget", "huge"])


def test_ttft_figures_travel_with_the_model(registry, fitted, tmp_path):
    model, _ = fitted
    png = b"\x89PNG\r\n\x1a\n" + b"1" * 50
    ttft_models.publish_ttft_model(registry, model, figures={"pred_vs_measured": png})
    assert ttft_models.load_ttft_model(registry, IDENTITY).version == model.version  # extra files do not disturb loading
    path = ttft_models.ttft_figure(registry, IDENTITY.key(), model.version, tmp_path)
    assert path is not None and path.read_bytes() == png
    assert ttft_models.ttft_figure(registry, IDENTITY.key(), model.version, tmp_path, name="residuals") is None
    assert ttft_models.ttft_figure(registry, IDENTITY.key(), "other-version", tmp_path) is None


def test_endpoint_load_rows_are_the_run_s_share_per_endpoint():
    from promptdistill.pipeline.report import endpoint_load_rows

    before = {"a": {"requests": 10.0, "prompt_tokens": 100.0, "generation_tokens": 50.0},
              "b": {"requests": 0.0, "prompt_tokens": 0.0, "generation_tokens": 0.0},
              "c": None}
    after = {"a": {"requests": 40.0, "prompt_tokens": 400.0, "generation_tokens": 80.0},
             "b": {"requests": 10.0, "prompt_tokens": 90.0, "generation_tokens": 20.0},
             "c": {"requests": 5.0, "prompt_tokens": 5.0, "generation_tokens": 5.0}}
    rows = {r["endpoint"]: r for r in endpoint_load_rows(before, after, seconds=20.0)}
    assert rows["a"] == {"endpoint": "a", "requests": 30, "prompt_tokens": 300, "generation_tokens": 30,
                         "requests_per_s": 1.5, "share": 0.75}
    assert rows["b"]["share"] == 0.25 and rows["b"]["requests_per_s"] == 0.5
    # An endpoint that did not answer in a snapshot has no figures, and no share of the total.
    assert rows["c"]["requests"] is None and rows["c"]["share"] is None


# ------------------------------------------------- the rules the flows only wire
PUBLISHED = {"version": 3, "labels": ["candidate", "production"], "promotion": "gate passed"}


def test_a_spec_s_row_says_optimized_or_baseline_kept_and_names_its_work_key():
    outcome = jobs.SpecOutcome("triage")
    outcome.stage("distill-k1")
    outcome.stage_done(cached=False)
    outcome.stage("optimize-k2")
    outcome.stage_done(cached=False)
    row = outcome.published({"kept_baseline": False}, {"tokens_before": 90, "tokens_after": 40}, PUBLISHED)
    assert (row["template"], row["status"], row["version"], row["labels"], row["promotion"], row["run_key"]) == \
        ("triage", "optimized", 3, "candidate,production", "gate passed", "optimize-k2")
    assert (row["tokens_before"], row["tokens_after"], row["cached"], row["error"]) == (90, 40, False, None)
    assert outcome.published({"kept_baseline": True}, {}, PUBLISHED)["status"] == "baseline kept"


def test_a_spec_s_row_is_cached_only_when_every_stage_came_from_the_cache():
    def outcome_of(*hits: bool) -> jobs.SpecOutcome:
        outcome = jobs.SpecOutcome("triage", run_key="optimize-k")
        for hit in hits:
            outcome.stage_done(cached=hit)
        return outcome

    assert outcome_of(True, True).published({"kept_baseline": False}, {}, PUBLISHED)["cached"] is True
    assert outcome_of(True, False).published({"kept_baseline": False}, {}, PUBLISHED)["cached"] is False
    assert outcome_of(False, True).cached is False and outcome_of(True).cached is True
    assert outcome_of().cached is False  # nothing ran: nothing came from the cache


def test_a_spec_s_failure_rows_name_the_error_and_the_stage_s_work_key():
    outcome = jobs.SpecOutcome("triage")
    assert outcome.failed("SpecError: bad") == report.failed_row("triage", "SpecError: bad")  # before any stage
    outcome.stage("distill-k1")
    outcome.stage_done(cached=True)
    outcome.stage("optimize-k2")
    failed = outcome.failed("EngineTimeoutError: slow")
    # The work is not all in: never cached, even after a cached distill stage.
    assert (failed["status"], failed["error"], failed["run_key"], failed["cached"]) == \
        ("failed", "EngineTimeoutError: slow", "optimize-k2", False)
    assert failed["version"] is None and failed["tokens_after"] is None
    outcome.stage_done(cached=True)
    unpublished = outcome.publish_failed("OSError: disk full")
    assert (unpublished["status"], unpublished["run_key"], unpublished["cached"]) == ("failed", "optimize-k2", True)
    # Reporting failing after publishing does not fail the spec: its row keeps its status.
    row = outcome.published({"kept_baseline": False}, {}, PUBLISHED)
    assert outcome.reporting_failed(row, "ValueError: no plot") == {**row, "error": "reporting failed: ValueError: no plot"}


def test_dask_workers_default_to_one_per_endpoint():
    assert jobs.dask_worker_count(None, []) == 1
    assert jobs.dask_worker_count(None, ["http://a:8000", "http://b:8000"]) == 2
    assert jobs.dask_worker_count(3, ["http://a:8000"]) == 3


def test_specs_run_side_by_side_only_on_the_server_backend():
    parallel, why = jobs.parallel_specs(True, "local")
    assert parallel is False and why is not None and "needs the server backend" in why
    assert jobs.parallel_specs(True, "server") == (True, None)
    assert jobs.parallel_specs(False, "local") == (False, None)
    assert jobs.parallel_specs(False, "server") == (False, None)


class _Notes:
    """A run logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, msg: str, *args: object) -> None:
        self.lines.append(("info", msg % args))

    def warning(self, msg: str, *args: object) -> None:
        self.lines.append(("warning", msg % args))


def test_a_fresh_ttft_model_is_kept_without_a_refresh(registry, fitted):
    model, _ = fitted
    ttft_models.publish_ttft_model(registry, model)

    def refresh(status):
        raise AssertionError("a fresh model must not be refreshed")

    notes = _Notes()
    outcome = ttft_models.keep_ttft_model_fresh(registry, IDENTITY, max_age_hours=None, refresh=refresh, logger=notes)
    assert outcome["refreshed"] is False and not outcome["needs_refresh"] and outcome["model_version"] == model.version
    assert outcome["state"] == "fresh" and notes.lines == []


def test_a_missing_ttft_model_is_refreshed_then_read_back(registry, fitted):
    model, _ = fitted
    seen = []

    def refresh(status):
        seen.append(status)
        ttft_models.publish_ttft_model(registry, model)
        return None

    notes = _Notes()
    outcome = ttft_models.keep_ttft_model_fresh(registry, IDENTITY, max_age_hours=24, refresh=refresh, logger=notes)
    assert len(seen) == 1 and seen[0].needs_refresh and seen[0].version is None
    assert outcome["refreshed"] is True and outcome["version"] == 1 and outcome["model_version"] == model.version
    assert outcome["state"] == "refreshed"
    assert outcome["reason"] == f"refreshed: {seen[0].reason}"
    assert notes.lines == [("info", f"refreshing the TTFT model: {seen[0].reason}")]


def test_a_failed_ttft_refresh_goes_on_with_the_old_model_or_stops_without_one(registry, fitted):
    def failing(status):
        return "EngineTimeoutError: too slow"

    # No model to go on with: the run goes on without one, its state and reason say why.
    none = ttft_models.keep_ttft_model_fresh(registry, IDENTITY, max_age_hours=24, refresh=failing, logger=_Notes())
    assert none["state"] == "none" and none["version"] is None and none["refreshed"] is False
    assert re.fullmatch(r"no TTFT model for engine \S+ and the refresh failed: EngineTimeoutError: too slow", none["reason"])
    model, _ = fitted
    ttft_models.publish_ttft_model(registry, model)
    notes = _Notes()
    # A negative limit: the model just published is already too old.
    outcome = ttft_models.keep_ttft_model_fresh(registry, IDENTITY, max_age_hours=-1, refresh=failing, logger=notes)
    assert outcome["refreshed"] is False and outcome["version"] == 1 and outcome["state"] == "stale"
    assert outcome["reason"].endswith("; refresh FAILED (EngineTimeoutError: too slow), using the old model")
    assert notes.lines[-1] == ("warning", f"TTFT: {outcome['reason']}")

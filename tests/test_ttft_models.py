"""TTFT model fitting, selection, persistence and the noise floor on synthetic measurement frames.

Pure logic: the frames are generated here with a known TTFT law, so the tests can check
that the fit recovers it. Real-engine behaviour is in test_ttft_engine.py.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from fakes import LINEAR_TERMS
from sklearn.base import clone
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.utils.estimator_checks import estimator_checks_generator
from threadpoolctl import threadpool_limits

from promptdistill.engine.base import EngineIdentity
from promptdistill.core.errors import IntegrityError, ModelIdentityError, TemplateNotFoundError
from promptdistill.ttft import MODEL_FEATURES, MonomialRegressor, TTFTModel, check_frame, fit_models
from promptdistill.ttft.estimators import (
    BASE_FEATURES,
    DERIVED_FEATURES,
    EngineMechanics,
    candidate_estimators,
    with_mechanics,
)
from promptdistill.ttft.fit import (
    flag_contended,
    is_monotonic_in_uncached,
    mechanics_of,
    model_inputs,
    never_slower_when_cached,
    score,
)
from promptdistill.ttft.noise import noise_floor

IDENT = EngineIdentity(model="m", backend="vllm-local", dtype="float32", max_model_len=2048, hardware="cpu x2", engine_version="v")
OTHER = EngineIdentity(model="m", backend="vllm-server", dtype="float32", max_model_len=2048, hardware="cpu x2", engine_version="v")


def law_ms(u, c, density=0.5, density_effect_ms=0.0):
    return 120 + 1.1 * u + 0.00035 * u * u + 0.05 * c + 0.0002 * u * c + density_effect_ms * density


def synthetic(n_prompts=60, repeats=3, seed=0, noise=0.03, density_effect_ms=0.0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        total = int(rng.integers(40, 2000))
        cached = int(total * rng.choice([0, 0.3, 0.6, 0.9])) // 128 * 128
        u = total - cached
        k, d, h = int(rng.integers(0, 9)), rng.uniform(0.2, 0.95), rng.uniform(5, 8)
        for r in range(repeats):
            ttft = law_ms(u, cached, d, density_effect_ms) * (1 + noise * rng.standard_normal())
            rows.append(dict(prompt_id=f"p{p}", repeat=r, run_id="run", uncached_tokens=u, cached_tokens=cached,
                             total_tokens=total, fewshot_count=k, semantic_density=d, entropy_bits=h, ttft_ms=ttft,
                             warm=cached > 0, design="sweep", foreign_cpu_share=0.0,
                             **{f"engine_{k2}": v for k2, v in IDENT.to_dict().items()}, engine_key=IDENT.key()))
    return pd.DataFrame(rows)


@pytest.fixture(autouse=True)
def one_openmp_thread():
    # fit_models does this itself; direct .fit calls here need it on a shared 2-core machine.
    with threadpool_limits(1):
        yield


@pytest.fixture(scope="module")
def frame():
    return synthetic()


@pytest.fixture(scope="module")
def fitted(frame):
    return fit_models(frame, seed=0)


def _sklearn_checks():
    # Every scikit-learn estimator check except the array-API one, which scikit-learn
    # itself skips unless SCIPY_ARRAY_API is set (the model is numpy-only).
    for est in (MonomialRegressor(), MonomialRegressor(degree=1, alpha=1.0)):
        for estimator, check in estimator_checks_generator(est, legacy=True):
            name = getattr(check, "func", check).__name__
            if name != "check_array_api_input":
                yield pytest.param(estimator, check, id=f"{estimator!r}-{name}")


@pytest.mark.parametrize("estimator, check", list(_sklearn_checks()))
def test_monomial_regressor_follows_the_sklearn_contract(estimator, check):
    check(estimator)


def test_linear_model_recovers_the_law_without_noise():
    df = synthetic(noise=0.0)
    X = df[list(BASE_FEATURES)].to_numpy(float)
    m = MonomialRegressor(terms=LINEAR_TERMS).fit(X, df["ttft_ms"])
    assert m.coef_[:4] == pytest.approx([1.1, 0.00035, 0.05, 0.0002], rel=1e-6)
    assert m.intercept_ == pytest.approx(120, rel=1e-6)
    assert np.abs(m.coef_[4:]).max() < 1e-6  # few-shot, density, entropy carry nothing here


def test_monomial_regressor_rejects_bad_terms():
    with pytest.raises(ValueError, match="terms"):
        MonomialRegressor(terms=((7,),)).fit(np.ones((5, 2)), np.arange(5.0))


def test_selection_scores_every_candidate_on_heldout_prompts(fitted, frame):
    assert set(fitted.heldout) == set(candidate_estimators())
    assert not set(fitted.train_groups) & set(fitted.test_groups)
    assert fitted.heldout[fitted.chosen]["mape"] < 0.05  # 3% noise on a law the linear model contains
    assert fitted.chosen.startswith("linear") or fitted.chosen.startswith("poly")
    for scores in fitted.heldout.values():
        assert {"r2", "mape", "p50_abs_err_ms", "p95_abs_err_ms"} <= set(scores)
    assert fitted.rows["rows_used"] == len(frame)


def test_every_candidate_is_monotonic_in_uncached_tokens(fitted, frame):
    X = model_inputs(frame)
    assert all(fitted.monotonic.values())
    assert is_monotonic_in_uncached(fitted.estimator, X)
    # The linear model keeps "cached is never slower" on this law (the tree's steps may
    # not: 13 ms above uncached for 128 of 1,349 tokens cached with scikit-learn 1.7).
    assert fitted.cache_consistent["linear"] and fitted.cache_consistent[fitted.chosen]
    assert never_slower_when_cached(fitted.estimator, X)


def test_a_decreasing_model_is_detected_and_not_chosen(frame):
    class Decreasing(MonomialRegressor):
        def predict(self, X):
            return 5000 - super().predict(X)

    candidates = {"bad": Decreasing(terms=LINEAR_TERMS), "hgb": candidate_estimators()["hgb"]}
    result = fit_models(frame, candidates=candidates)
    assert result.monotonic == {"bad": False, "hgb": True}
    assert result.chosen == "hgb"


def test_a_model_that_predicts_a_cached_prefix_slower_is_detected_and_not_chosen(frame, fitted):
    cached = MODEL_FEATURES.index("cached_tokens")

    class CacheCostsMore(MonomialRegressor):
        # Still monotonic in uncached tokens; only moving tokens into the cache is wrong.
        def predict(self, X):
            return super().predict(X) + 3.0 * np.asarray(X)[:, cached]

    X = model_inputs(frame)
    bad = CacheCostsMore(terms=LINEAR_TERMS).fit(X, frame["ttft_ms"])
    assert is_monotonic_in_uncached(bad, X)
    assert not never_slower_when_cached(bad, X)
    assert never_slower_when_cached(fitted.estimator, X)
    candidates = {"bad": CacheCostsMore(terms=LINEAR_TERMS), "linear": candidate_estimators()["linear"]}
    result = fit_models(frame, candidates=candidates)
    assert result.monotonic == {"bad": True, "linear": True}
    assert result.cache_consistent == {"bad": False, "linear": True}
    assert result.chosen == "linear"
    # With no candidate keeping both facts, monotonic in uncached tokens still decides: a
    # wiggle of +-40 ms fits far better (cross-validated) but goes down as tokens grow.
    class Wiggly(MonomialRegressor):
        def predict(self, X):
            return super().predict(X) + 40.0 * np.sin(np.asarray(X)[:, 0] / 10.0)

    result = fit_models(frame, candidates={"bad": CacheCostsMore(terms=LINEAR_TERMS), "wiggly": Wiggly(terms=LINEAR_TERMS)})
    assert result.cv["wiggly"]["mape_median"] < result.cv["bad"]["mape_median"]
    assert result.chosen == "bad"


def test_contended_and_failed_rows_are_left_out(frame):
    df = frame.copy()
    df.loc[:9, "foreign_cpu_share"] = 0.6
    df.loc[10:11, "ttft_ms"] = np.nan
    rows, counts = check_frame(df)
    assert counts == {"rows_total": len(df), "rows_failed": 2, "rows_contended": 10,
                      "rows_used": len(df) - 12, "prompts_used": rows["prompt_id"].nunique()}
    assert flag_contended(df).sum() == 10
    _, kept = check_frame(df, drop_contended=False)
    assert kept["rows_contended"] == 0


def test_check_frame_names_missing_columns(frame):
    with pytest.raises(ValueError, match=r"missing column\(s\) \['cached_tokens'\]"):
        check_frame(frame.drop(columns=["cached_tokens"]))


@pytest.mark.parametrize("name", ["linear", "poly2_a1", "hgb"])
def test_files_round_trip_exactly(frame, name):
    X = model_inputs(frame)
    est = clone(candidate_estimators()[name]).fit(X, frame["ttft_ms"])
    model = TTFTModel(estimator=est, kind="hgb" if name == "hgb" else "monomial", name=name, engine_identity=IDENT)
    files = model.to_files()
    loaded = TTFTModel.from_files(files)
    assert loaded.version == model.version
    rows = frame.to_dict("records")
    assert np.array_equal(loaded.predict_many(rows), model.predict_many(rows))
    assert ("estimator.skops" in files) == (name == "hgb")
    assert not any(name.endswith((".pkl", ".joblib")) for name in files)
    assert json.loads(files["model.json"])["mechanics"] == {"block_tokens": None, "chunk_tokens": None}


def test_predict_takes_a_features_dict(fitted, frame):
    model = TTFTModel(estimator=fitted.estimator, kind="monomial", name=fitted.chosen, engine_identity=IDENT)
    row = frame.iloc[0].to_dict()
    single = model.predict(row)
    assert single == pytest.approx(model.predict_many([row])[0])
    derived = {k: row[k] for k in ("total_tokens", "cached_tokens", "fewshot_count", "semantic_density", "entropy_bits")}
    assert model.predict(derived) == pytest.approx(single)
    with pytest.raises(KeyError, match="cached_tokens"):
        model.predict({"total_tokens": 100, "fewshot_count": 0, "semantic_density": 0.5, "entropy_bits": 6})


def test_another_engine_identity_is_refused_or_warned(fitted, frame, tmp_path):
    model = TTFTModel(estimator=fitted.estimator, kind="monomial", name=fitted.chosen, engine_identity=IDENT)
    row = frame.iloc[0].to_dict()
    model.predict(row, engine_identity=IDENT)
    with pytest.raises(ModelIdentityError, match="backend: fitted on 'vllm-local', asked for 'vllm-server'"):
        model.predict(row, engine_identity=OTHER)
    with pytest.warns(UserWarning, match="PREDICTING FOR ANOTHER ENGINE"):
        model.predict(row, engine_identity=OTHER, allow_other_engine=True)
    with pytest.raises(ModelIdentityError):
        TTFTModel.from_files(model.to_files()).check_engine(OTHER)


def test_tampered_artifacts_are_refused(fitted, frame, tmp_path):
    X = model_inputs(frame)
    hgb = clone(candidate_estimators()["hgb"]).fit(X, frame["ttft_ms"])
    files = TTFTModel(estimator=hgb, kind="hgb", name="hgb", engine_identity=IDENT).to_files()
    with pytest.raises(IntegrityError, match="sha256"):
        TTFTModel.from_files({**files, "estimator.skops": files["estimator.skops"][:-1] + b"x"})
    meta = json.loads(files["model.json"])
    meta["engine_identity"]["hardware"] = "gpu"
    with pytest.raises(IntegrityError, match="engine_key"):
        TTFTModel.from_files({**files, "model.json": json.dumps(meta).encode()})
    linear = TTFTModel(estimator=fitted.estimator, kind="monomial", name="linear", engine_identity=IDENT).to_files()
    meta = json.loads(linear["model.json"])
    meta["estimator"]["coef"][0] *= 2
    with pytest.raises(IntegrityError, match="version"):
        TTFTModel.from_files({"model.json": json.dumps(meta).encode()})
    meta = json.loads(linear["model.json"])
    meta["mechanics"]["block_tokens"] = 16  # the derived features would change: a different model
    with pytest.raises(IntegrityError, match="version"):
        TTFTModel.from_files({"model.json": json.dumps(meta).encode()})


def test_from_fit_learns_the_cache_block_and_a_warm_prefix_predicts_faster(fitted, frame):
    from promptdistill.ttft.estimators import warm_cached_tokens  # the rule the optimizer applies

    model = TTFTModel.from_fit(fitted, frame)
    assert model.engine_identity == IDENT
    assert model.training["cache_block_tokens"] == 128  # synthetic cached counts are multiples of 128
    features = {"total_tokens": 900, "static_prefix_tokens": 700, "fewshot_count": 2, "semantic_density": 0.5,
                "entropy_bits": 6.5}
    cached = warm_cached_tokens(700, 900, model.training["cache_block_tokens"])
    assert cached == 640
    assert model.predict({**features, "cached_tokens": cached}) < model.predict({**features, "cached_tokens": 0})


# --- engine mechanics ------------------------------------------------------------------------


def test_mechanics_round_cached_tokens_to_blocks_and_count_prefill_steps():
    m = EngineMechanics(block_tokens=128, chunk_tokens=1000).fit(np.zeros((1, len(MODEL_FEATURES))))
    u, c, k, d, h, ahead, batch = range(len(MODEL_FEATURES))
    P, S = DERIVED_FEATURES.index("prefill_tokens"), DERIVED_FEATURES.index("prefill_steps")
    rows = np.array([
        [300, 100, 0, 0.5, 7, 0, 0],  # a static prefix shorter than a block: nothing cached
        [44, 300, 0, 0.5, 7, 0, 0],  # 300 asked for: two whole blocks
        [0, 256, 0, 0.5, 7, 0, 0],  # all cached: the last token is still computed
        [400, 0, 0, 0.5, 7, 0, 1200],  # first of three 400-token requests: step 1 holds 1000 tokens
        [400, 0, 0, 0.5, 7, 800, 1200],  # third: its prefill ends in step 2, after all 1200
        [1500, 0, 0, 0.5, 7, 0, 0],  # alone, longer than a chunk: two steps
    ], dtype=float)
    out = m.transform(rows)
    assert out[:, 1].tolist() == [0, 256, 128, 0, 0, 0]
    assert out[:, 0].tolist() == [400, 88, 128, 400, 400, 1500]
    assert out[:, P].tolist() == [400, 88, 128, 1000, 1200, 1500]
    assert out[:, S].tolist() == [1, 1, 1, 1, 2, 2]
    # No block size: nothing rounded (the last token is still computed).
    assert np.array_equal(EngineMechanics().fit(rows).transform(rows)[:, P], [300, 44, 1, 1200, 1200, 1500])
    with pytest.raises(ValueError, match="7 columns"):
        EngineMechanics().fit(np.ones((3, 5)))


def queue_law_ms(prefill, steps, u):
    return 80 + 0.9 * prefill + 0.0003 * u * u + 25 * steps


def queued_frame(seed=0, noise=0.01):
    """Groups of requests sent together under a 1000-token chunk, plus requests alone."""
    rng = np.random.default_rng(seed)
    ident = {f"engine_{k}": v for k, v in IDENT.to_dict().items()}
    rows = []
    mech = EngineMechanics(block_tokens=128, chunk_tokens=1000).fit(np.zeros((1, 7)))
    groups = [(f"g{g}", [int(x) for x in rng.integers(100, 700, rng.integers(2, 5))]) for g in range(12)]
    groups += [(f"a{i}", [int(rng.integers(40, 1900))]) for i in range(40)]
    for name, sizes in groups:
        for j, size in enumerate(sizes):
            ahead, batch = (sum(sizes[:j]), sum(sizes)) if len(sizes) > 1 else (0, 0)
            x = mech.transform([[size, 0, 0, 0.5, 7.0, ahead, batch]])[0]
            for r in range(3):
                rows.append(dict(prompt_id=f"{name}-{j}", split_group=name, batch_position=j, batch_size=len(sizes),
                                 uncached_tokens=size, cached_tokens=0, total_tokens=size, tokens_ahead=ahead,
                                 batch_tokens=batch, fewshot_count=0, semantic_density=0.5, entropy_bits=7.0,
                                 ttft_ms=queue_law_ms(x[5], x[6], size) * (1 + noise * rng.standard_normal()),
                                 warm=False, design="queue" if len(sizes) > 1 else "sweep", repeat=r, run_id="run",
                                 cache_block_tokens=128, prefill_chunk_tokens=1000, **ident, engine_key=IDENT.key()))
    return pd.DataFrame(rows)


def test_queue_features_predict_requests_sent_together():
    df = queued_frame()
    assert mechanics_of(df) == {"block_tokens": 128, "chunk_tokens": 1000}
    fit = fit_models(df, seed=0)
    # A batch never straddles the split: its requests were measured together.
    test = fit.heldout_predictions
    assert not set(df.loc[df["prompt_id"].isin(test["prompt_id"]), "split_group"]) & set(
        df.loc[~df["prompt_id"].isin(test["prompt_id"]), "split_group"])
    assert fit.heldout[fit.chosen]["mape_median"] < 0.03


def test_model_derives_mechanics_from_the_optimizers_features():
    df = queued_frame()
    model = TTFTModel.from_fit(fit_models(df, seed=0), df)
    assert model.mechanics == {"block_tokens": 128, "chunk_tokens": 1000}
    assert model.training["cache_block_tokens"] == 128 and model.training["prefill_chunk_tokens"] == 1000
    # What predict.py and verify.py pass: prompt_features + cached_tokens, nothing about queues.
    features = {"total_tokens": 700, "static_prefix_tokens": 300, "suffix_tokens": 400, "fewshot_count": 0,
                "fewshot_tokens": 0, "instruction_tokens": 50, "semantic_density": 0.5, "entropy_bits": 7.0,
                "clause_count": 3, "cl100k_tokens": 650}
    rounded = model.predict({**features, "cached_tokens": 256})
    assert model.predict({**features, "cached_tokens": 300}) == pytest.approx(rounded)  # rounded to blocks inside
    assert model.predict({**features, "cached_tokens": 100}) == pytest.approx(model.predict({**features, "cached_tokens": 0}))
    assert model.predict({**features, "cached_tokens": 0, "tokens_ahead": 900, "batch_tokens": 1600}) > 1.5 * model.predict(
        {**features, "cached_tokens": 0})
    loaded = TTFTModel.from_files(model.to_files())
    assert loaded.mechanics == model.mechanics and loaded.predict({**features, "cached_tokens": 256}) == rounded


def test_format_1_models_still_load_and_predict(frame):
    X = frame[list(BASE_FEATURES)].to_numpy(float)
    old = TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, frame["ttft_ms"]), "monomial", "linear", IDENT)
    assert old.features == BASE_FEATURES
    files = old.to_files()
    assert json.loads(files["model.json"])["format_version"] == 1 and "mechanics" not in json.loads(files["model.json"])
    loaded = TTFTModel.from_files(files)
    rows = frame.to_dict("records")
    assert loaded.version == old.version and np.array_equal(loaded.predict_many(rows), old.predict_many(rows))


# --- the noise floor -------------------------------------------------------------------------


def test_noise_floor_of_known_noise():
    rng = np.random.default_rng(1)
    rows = [dict(prompt_id=f"p{p}", warm=False, ttft_ms=100.0 * (p + 1) * (1 + 0.1 * rng.standard_normal()))
            for p in range(200) for _ in range(5)]
    floor = noise_floor(pd.DataFrame(rows), n_boot=100)
    assert floor["units"] == 200 and floor["repeats_median"] == 5
    assert floor["cv_median"] == pytest.approx(0.1, abs=0.015)
    assert floor["cv_median_ci"][0] < floor["cv_median"] < floor["cv_median_ci"][1]
    # Normal noise: E|y - median| / y is about 0.8 sigma (less in-sample, more leaving one out)...
    assert floor["floor_vs_singles"] < floor["floor_vs_singles_pooled"] < floor["floor_vs_singles_loo"]
    assert floor["floor_vs_singles_pooled"] == pytest.approx(0.08, abs=0.01)
    # ... and the median of 5 is off by about 0.8 x 1.2 sigma / sqrt(5).
    assert floor["floor_vs_medians"] == pytest.approx(0.8 * 1.2 * 0.1 / 5**0.5, abs=0.008)
    assert floor["floor_vs_medians_ci"][0] < floor["floor_vs_medians"] < floor["floor_vs_medians_ci"][1]
    exact = noise_floor(pd.DataFrame([dict(prompt_id=f"p{p}", ttft_ms=50.0) for p in range(4) for _ in range(3)]), n_boot=20)
    assert exact["floor_vs_singles"] == exact["floor_vs_medians"] == exact["cv_median"] == 0.0
    assert noise_floor(pd.DataFrame([dict(prompt_id="a", ttft_ms=1.0)]))["units"] == 0


def test_score_against_medians_removes_the_noise_of_single_rows():
    y = np.array([90.0, 110.0, 100.0, 190.0, 210.0, 200.0])
    keys = np.array(["a", "a", "a", "b", "b", "b"])
    pred = np.array([100.0] * 3 + [200.0] * 3)
    s = score(y, pred, keys)
    assert s["mape_median"] == 0.0 and s["n_medians"] == 2 and s["mape"] > 0.05


def test_a_server_identity_finds_the_model_fitted_through_the_server(tmp_path):
    from promptdistill.pipeline.ttft_models import fit_and_publish, load_ttft_model
    from promptdistill.registry.store import Registry

    df = synthetic().assign(**{"engine_backend": OTHER.backend, "engine_key": OTHER.key()})
    registry = Registry(str(tmp_path / "registry"))
    fit_and_publish(registry, df, report_dir=tmp_path / "reports")
    assert load_ttft_model(registry, OTHER).engine_identity == OTHER
    with pytest.raises(TemplateNotFoundError, match="no TTFT model for engine"):
        load_ttft_model(registry, IDENT)  # the in-process engine needs its own profile


def test_the_refresh_publishes_the_model_its_error_noise_floor_and_fit_figure_without_the_study(tmp_path, monkeypatch):
    """What the nightly's refresh (and ``ttft fit``) does: no TTFT study anywhere in it."""
    import sys

    from promptdistill.pipeline.ttft_models import fit_and_publish, ttft_figure
    from promptdistill.registry.store import Registry

    for name in ("bench", "bench.ttft_study"):  # importing the study now fails
        monkeypatch.setitem(sys.modules, name, None)
    registry = Registry(str(tmp_path / "registry"))
    info, model, fit, record = fit_and_publish(registry, synthetic(), report_dir=tmp_path / "reports")
    assert "report_error" not in info
    folder = tmp_path / "reports" / model.version
    assert sorted(p.name for p in folder.iterdir()) == ["pred_vs_measured.png", "report.md"]
    assert info["report"] == str(folder / "report.md") and info["figures"] == {
        "pred vs measured": str(folder / "pred_vs_measured.png")}
    assert info["heldout"]["mape"] == fit.heldout[fit.chosen]["mape"] < 0.1
    # 60 prompts x 3 repeats of 3% noise: the floor against single rows is about 0.8 x 3%.
    assert info["noise_floor"]["units"] == 60 and 0.01 < info["noise_floor"]["floor_vs_singles_pooled"] < 0.04
    assert record.metadata["noise_floor"] == info["noise_floor"]
    assert record.metadata["metrics"]["heldout"][model.name]["mape"] == info["heldout"]["mape"]
    card = (folder / "report.md").read_text()
    assert f"{info['noise_floor']['floor_vs_medians']:.1%} against medians" in card
    assert "(pred_vs_measured.png)" in card and model.version in card
    stored = ttft_figure(registry, IDENT.key(), model.version, tmp_path / "out")
    assert stored.read_bytes() == (folder / "pred_vs_measured.png").read_bytes()


def test_a_regressor_fitted_on_other_inputs_is_refused(frame):
    # A model published while the mechanics handed the regressor 7 columns (seen in a real
    # registry): sklearn's own error came at the first prediction, deep in a night's run.
    derived = EngineMechanics().fit_transform(model_inputs(frame))
    hgb = HistGradientBoostingRegressor(max_iter=5).fit(derived[:, :-1], frame["ttft_ms"])
    files = TTFTModel(estimator=with_mechanics(hgb), kind="hgb", name="hgb", engine_identity=IDENT).to_files()
    with pytest.raises(IntegrityError, match=r"model.json: estimator: the hgb regressor takes 7 inputs, .* hands it 8 .*promptdistill ttft fit"):
        TTFTModel.from_files(files)

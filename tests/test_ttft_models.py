"""TTFT model fitting, selection, persistence and analysis on synthetic measurement frames.

Pure logic: the frames are generated here with a known TTFT law, so the tests can check
that the fit recovers it. Real-engine behaviour is in test_ttft_engine.py.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import estimator_checks_generator
from threadpoolctl import threadpool_limits

from promptdistill.engine.base import EngineIdentity
from promptdistill.core.errors import IntegrityError, ModelIdentityError
from promptdistill.ttft import MODEL_FEATURES, MonomialRegressor, TTFTModel, check_frame, fit_models
from promptdistill.ttft.analysis import bootstrap_coefficients, density_effect, fewshot_table
from promptdistill.ttft.estimators import LINEAR_TERMS, candidate_estimators
from promptdistill.ttft.fit import flag_contended, is_monotonic_in_uncached

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
    X = df[list(MODEL_FEATURES)].to_numpy(float)
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
    X = frame[list(MODEL_FEATURES)].to_numpy(float)
    assert all(fitted.monotonic.values())
    assert is_monotonic_in_uncached(fitted.estimator, X)


def test_a_decreasing_model_is_detected_and_not_chosen(frame):
    class Decreasing(MonomialRegressor):
        def predict(self, X):
            return 5000 - super().predict(X)

    candidates = {"bad": Decreasing(terms=LINEAR_TERMS), "hgb": candidate_estimators()["hgb"]}
    result = fit_models(frame, candidates=candidates)
    assert result.monotonic == {"bad": False, "hgb": True}
    assert result.chosen == "hgb"


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
    X = frame[list(MODEL_FEATURES)].to_numpy(float)
    est = clone(candidate_estimators()[name]).fit(X, frame["ttft_ms"])
    model = TTFTModel(estimator=est, kind="hgb" if name == "hgb" else "monomial", name=name, engine_identity=IDENT)
    files = model.to_files()
    loaded = TTFTModel.from_files(files)
    assert loaded.version == model.version
    assert np.array_equal(loaded.predict_frame(frame), model.predict_frame(frame))
    assert ("estimator.skops" in files) == (name == "hgb")
    assert not any(name.endswith((".pkl", ".joblib")) for name in files)


def test_predict_takes_a_features_dict(fitted, frame):
    model = TTFTModel(estimator=fitted.estimator, kind="monomial", name=fitted.chosen, engine_identity=IDENT)
    row = frame.iloc[0].to_dict()
    single = model.predict(row)
    assert single == pytest.approx(model.predict_frame(frame.iloc[:1])[0])
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
    X = frame[list(MODEL_FEATURES)].to_numpy(float)
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


def test_bootstrap_intervals_cover_the_true_coefficients():
    df = synthetic(noise=0.03, seed=3)
    table = bootstrap_coefficients(df, n_boot=200, seed=0).set_index("term")
    assert table.loc["uncached_tokens", "ci_low"] < 1.1 < table.loc["uncached_tokens", "ci_high"]
    assert table.loc["uncached_tokens", "ci_low"] > 0.5
    assert list(table.columns) == ["coef", "ci_low", "ci_high", "p_boot", "std_beta"]


def test_density_effect_finds_an_effect_only_when_there_is_one():
    none = density_effect(synthetic(seed=4, noise=0.01), n_boot=200)
    assert abs(none["effect_over_range_ms"]) < 0.02 * none["median_ttft_ms"]
    strong = density_effect(synthetic(seed=4, noise=0.01, density_effect_ms=400.0), n_boot=200)
    assert strong["ci_excludes_zero"] and strong["ci_low"] > 200


def test_fewshot_table_uses_only_the_probe():
    rows = []
    for k, ms in ((0, 500.0), (1, 560.0), (4, 740.0), (8, 980.0)):
        for r in range(3):
            rows.append(dict(design="fewshot_probe", fewshot_count=k, total_tokens=512 + 64 * k, fewshot_tokens=64 * k,
                             ttft_ms=ms + r, prompt_id=f"f{k}"))
    rows.append(dict(design="sweep", fewshot_count=1, total_tokens=90, fewshot_tokens=60, ttft_ms=1.0, prompt_id="s"))
    table = fewshot_table(pd.DataFrame(rows))
    assert table["fewshot_count"].tolist() == [0, 1, 4, 8]
    assert table["ttft_ms_median"].tolist() == [501.0, 561.0, 741.0, 981.0]
    assert table["increment_over_0_ms"].tolist() == [0.0, 60.0, 240.0, 480.0]
    assert table.loc[table["fewshot_count"] == 4, "claimed_ms"].item() == 316.0


def test_from_fit_learns_the_cache_block_and_sets_warm_features(fitted, frame):
    model = TTFTModel.from_fit(fitted, frame)
    assert model.engine_identity == IDENT
    assert model.training["cache_block_tokens"] == 128  # synthetic cached counts are multiples of 128
    features = {"total_tokens": 900, "static_prefix_tokens": 700, "fewshot_count": 2, "semantic_density": 0.5,
                "entropy_bits": 6.5}
    warm, cold = model.cache_features(features, warm=True), model.cache_features(features, warm=False)
    assert (warm["cached_tokens"], warm["uncached_tokens"]) == (640, 260)
    assert (cold["cached_tokens"], cold["uncached_tokens"]) == (0, 900)
    assert model.predict(warm) < model.predict(cold)

"""The TTFT profiler and models on the real engine (in-process vLLM, SmolLM2), small sweep."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pandas as pd
import pytest

from promptdistill.core.errors import ModelIdentityError
from promptdistill.ttft.features import FEATURE_KEYS
from promptdistill.specs import load_specs
from promptdistill.ttft import MODEL_FEATURES, ProfileConfig, TTFTModel, fit_models, run_profile
from promptdistill.ttft.profile import plan_prompts

pytestmark = pytest.mark.engine

# No waiting for a quiet CPU and no re-measuring here: the test checks the protocol, not
# accuracy, and on a shared machine waiting and retries would make its cost unbounded.
SMALL = ProfileConfig(
    points=6, repeats=2, max_minutes=30, max_tokens=400, density_probe_tokens=(256,), spec_records=1, warmup=2,
    max_retries=0, quiet_wait_s=0, seed=1,
)


@pytest.fixture(scope="module")
def profile(engine, tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    return run_profile(engine, SMALL, out=out, progress=False)


def test_profile_has_one_row_per_measurement_and_every_column(profile):
    df = profile.frame
    assert profile.stopped == "complete"
    first_attempts = df[df["attempt"] == 0]
    assert first_attempts["unit"].nunique() == profile.planned_units  # a queue unit gives one row per request
    # Every unit of every round was measured; retries only add rows.
    assert first_attempts.groupby(["prompt_id", "warm"])["round"].nunique().eq(SMALL.repeats).all()
    assert set(df["design"]) == {"sweep", "density_probe", "spec", "ladder", "queue"}
    assert df["spec"].nunique() == len(load_specs("prompts"))
    expected = {*FEATURE_KEYS, "cached_tokens", "uncached_tokens", "ttft_ms", "e2e_ms", "prompt_id", "repeat", "warm",
                "timestamp", "engine_key", "engine_backend", "engine_model", "cpu_wall_ratio", "foreign_cpu_share", "contended"}
    assert expected <= set(df.columns)
    assert df["error"].isna().all()
    assert (df["ttft_ms"] > 0).all() and (df["e2e_ms"] >= df["ttft_ms"] - 1e-6).all()
    assert (df["engine_backend"] == "vllm-local").all()
    assert df["timestamp"].is_monotonic_increasing
    # The order is interleaved: neither token count nor warm/cold runs in order.
    assert not df["total_tokens"].is_monotonic_increasing and (df["warm"] != df["warm"].shift()).sum() > 2
    on_disk = pd.read_parquet(profile.path)
    assert len(on_disk) == len(df) and list(on_disk.columns) == list(df.columns)


def test_profile_records_the_engine_mechanics_and_the_hardware(profile):
    df = profile.frame
    # The CPU build as promptdistill starts it: 32-token cache blocks (CPU_BLOCK_SIZE), 4096-token prefill chunks in-process.
    assert (df["cache_block_tokens"] == 32).all() and (df["prefill_chunk_tokens"] == 4096).all()
    assert (df["hw_matmul_gflops"] > 0).all() and df["hw_matmul_gflops"].nunique() == 1
    assert df["hw_matmul_gflops"].iloc[0] == max(df["hw_matmul_gflops_start"].iloc[0], df["hw_matmul_gflops_end"].iloc[0])
    assert df["model_matmul_params"].iloc[0] == 106_168_320  # SmolLM2-135M
    warm = df[df["cached_tokens"] > 0]
    assert (warm["cached_tokens"] % 32 == 0).all()  # whole blocks only


def test_queue_rows_record_what_arrived_ahead(profile):
    df = profile.frame
    queue = df[df["design"] == "queue"]
    alone = df[df["design"] != "queue"]
    assert (alone["tokens_ahead"] == 0).all() and (alone["batch_tokens"] == 0).all() and (alone["batch_size"] == 1).all()
    for (_, _), batch in queue.groupby(["run_id", "unit"]):
        batch = batch.sort_values("batch_position")
        assert batch["batch_tokens"].nunique() == 1 and batch["batch_tokens"].iloc[0] == batch["uncached_tokens"].sum()
        assert batch["tokens_ahead"].tolist() == [0, *batch["uncached_tokens"].cumsum().iloc[:-1].tolist()]
        assert (batch["cached_tokens"] == 0).all()  # a unique first line each: no request reuses another's blocks
        # Served together: the last request waits at least as long as it would alone.
        assert batch["ttft_ms"].iloc[-1] >= 0.9 * batch["ttft_ms"].iloc[0]


def test_cold_rows_had_no_cached_tokens_and_warm_rows_had_them(profile):
    df = profile.frame
    cold, warm = df[~df["warm"]], df[df["warm"]]
    assert len(cold) and len(warm)
    assert (cold["cached_tokens"] == 0).all()
    assert (warm["cached_tokens"] > 0).all()
    assert (warm["cached_tokens"] <= warm["static_prefix_tokens"]).all()
    assert (df["uncached_tokens"] == df["total_tokens"] - df["cached_tokens"]).all()
    # The features' token count is exactly what the engine ran.
    assert (df["prompt_tokens"] == df["total_tokens"]).all()


def test_fitted_model_is_monotonic_in_uncached_tokens_over_the_measured_range(profile, engine):
    fit = fit_models(profile.frame, drop_contended=False, n_splits=3)
    model = TTFTModel.from_fit(fit, profile.frame)
    assert model.engine_identity == engine.identity
    lo, hi = profile.frame["uncached_tokens"].min(), profile.frame["uncached_tokens"].max()
    grid = np.linspace(lo, hi, 60)
    for _, row in profile.frame.sample(20, random_state=0).iterrows():
        features = [{**row[list(MODEL_FEATURES)].to_dict(), "uncached_tokens": u} for u in grid]
        predicted = model.predict_many(features, engine_identity=engine.identity)
        assert np.all(np.diff(predicted) >= -0.01)


def test_stored_model_round_trips_exactly_and_other_engines_are_refused(profile, engine, tmp_path):
    from promptdistill.pipeline.ttft_models import load_ttft_model, publish_ttft_model
    from promptdistill.registry.store import Registry

    fit = fit_models(profile.frame, drop_contended=False, n_splits=3)
    model = TTFTModel.from_fit(fit, profile.frame)
    registry = Registry(str(tmp_path / "registry"))
    publish_ttft_model(registry, model)
    loaded = load_ttft_model(registry, engine.identity)
    rows = profile.frame.to_dict("records")
    assert np.array_equal(loaded.predict_many(rows), model.predict_many(rows))
    assert json.loads(model.to_files()["model.json"])["engine_key"] == engine.identity.key()

    other = dataclasses.replace(model, engine_identity=dataclasses.replace(engine.identity, hardware="another machine"))
    row = profile.frame.iloc[0].to_dict()
    with pytest.raises(ModelIdentityError, match="hardware"):
        other.predict(row, engine_identity=engine.identity)
    with pytest.raises(ModelIdentityError):
        TTFTModel.from_files(other.to_files()).check_engine(engine.identity)


def test_the_safety_stop_stops_cleanly_and_keeps_what_was_measured(engine, tmp_path):
    config = dataclasses.replace(SMALL, points=3, spec_records=0, density_probe_tokens=(), warmup=0, max_minutes=5 / 60)
    prompts = plan_prompts(engine, config)
    ticks = itertools.count(0.0, 1.0)  # each clock reading advances one "second"
    result = run_profile(engine, config, out=tmp_path / "p.parquet", progress=False, prompts=prompts, clock=lambda: next(ticks))
    assert result.stopped == "max_minutes"
    # The note gives the figures, whether or not the stop came before the fit's minimum.
    assert result.note.startswith("TTFT profile stopped at the safety stop of ") and "the fit needs" in result.note
    assert 0 < len(result.frame) < result.planned_units
    assert len(pd.read_parquet(tmp_path / "p.parquet")) == len(result.frame)


@pytest.mark.server
def test_profile_and_model_through_a_server(model_dir, tmp_path):
    """TTFT at the client over HTTP: the server's mechanics, contention net of the server's own
    processes, and a model that a server engine built afresh finds by its identity."""
    from promptdistill.core.config import EngineConfig
    from promptdistill.engine.launcher import VLLMServer
    from promptdistill.engine.server import ServerEngine
    from promptdistill.pipeline.ttft_models import fit_and_publish, load_ttft_model
    from promptdistill.registry.store import Registry

    config = EngineConfig(backend="server", max_model_len=2048)
    tiny = dataclasses.replace(SMALL, points=8, density_probe_tokens=(), ladder_tokens=(128,), spec_records=1,
                               matmul_probe=False)
    with VLLMServer(model_dir, config, startup_timeout_s=420) as server:
        engine = ServerEngine(dataclasses.replace(config, server_urls=(server.url,)))
        result = run_profile(engine, tiny, out=tmp_path / "p", progress=False, own_pids=(server._proc.pid,))
        df = result.frame
        assert result.info["queue_probe"].startswith("left out")
        assert set(df["design"]) == {"sweep", "ladder", "spec"}
        assert (df["engine_backend"] == "vllm-server").all()
        # From the server's /server_info: the API server's chunk is 2048 tokens on the CPU build.
        assert (df["cache_block_tokens"] == 32).all() and (df["prefill_chunk_tokens"] == 2048).all()
        assert df["foreign_cpu_share"].notna().all()  # the server's CPU time is ours, not contention
        registry = Registry(str(tmp_path / "registry"))
        fit_and_publish(registry, df, report_dir=tmp_path / "reports", keep_contended=True)
        fresh = ServerEngine(dataclasses.replace(config, server_urls=(server.url,)))  # as production builds one
        model = load_ttft_model(registry, fresh.identity)
        assert model.engine_identity.backend == "vllm-server" and model.mechanics["chunk_tokens"] == 2048

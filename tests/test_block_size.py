"""The KV cache block size: configured, passed to vLLM, read back from the engine or the
server, part of the engine identity; the one warm-cached-tokens rule; TTFT measured
interleaved with an interval; how reports show TTFT per side.

Pure tests use a /metrics text in the shape vLLM 0.32 emits and ``FakeVLLMEndpoint``;
the tests marked ``server``/``engine`` start the real thing.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

from fakes import FAKE_IDENTITY, LINEAR_TERMS, FakeEngine, FakeVLLMEndpoint
from promptdistill.core.config import EngineConfig, load_settings
from promptdistill.core.errors import ConfigError, EngineUnavailableError
from promptdistill.core.jsonio import canonical_json
from promptdistill.engine.base import EngineIdentity
from promptdistill.engine.launcher import VLLMServer
from promptdistill.engine.server import ServerEngine, block_size_from_metrics, served_block_size

# What `curl 127.0.0.1:8000/metrics` prints on vLLM 0.32 (CPU build), cut to a few families:
# the cache config is an info gauge whose labels are CacheConfig's fields, one sample per
# engine core (vllm/v1/metrics/loggers.py, log_metrics_info).
METRICS_CPU = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2-135m"} 0.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2-135m"} 1536.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="smollm2-135m"} 1.7649e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",cache_hit_alignment_tokens="128",calculate_kv_scales="False",\
cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",hash_block_size="128",\
is_attention_free="False",kv_cache_dtype_skip_layers="[]",kv_cache_memory_bytes="None",kv_offloading_backend="native",\
kv_offloading_size="None",mamba_block_size="None",num_cpu_blocks="None",num_gpu_blocks="455",\
num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",\
user_specified_block_size="False"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="smollm2-135m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="smollm2-135m"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="smollm2-135m"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="smollm2-135m"} 1.25
"""

IDENT = dict(model="m", backend="vllm-server", dtype="float32", max_model_len=2048, hardware="cpu x2", engine_version="v")


# --- reading the block size ---------------------------------------------------------------


def test_block_size_is_read_from_the_cache_config_info_of_a_metrics_text():
    assert block_size_from_metrics(METRICS_CPU) == 128
    gpu = METRICS_CPU.replace('block_size="128"', 'block_size="16"')
    assert block_size_from_metrics(gpu) == 16
    # Two engine cores of one server report the same config: still one size.
    second_core = METRICS_CPU.split("# HELP vllm:time_to_first")[0].splitlines()[-1].replace('engine="0"', 'engine="1"')
    assert block_size_from_metrics(METRICS_CPU + second_core + "\n") == 128


def test_metrics_without_a_usable_block_size_give_none():
    no_info = "\n".join(line for line in METRICS_CPU.splitlines() if "cache_config_info" not in line) + "\n"
    assert block_size_from_metrics(no_info) is None
    assert block_size_from_metrics("") is None
    assert block_size_from_metrics("<html>502 Bad Gateway</html>") is None
    assert block_size_from_metrics(METRICS_CPU.replace('block_size="128"', 'block_size="None"')) is None
    disagree = METRICS_CPU + 'vllm:cache_config_info{block_size="16",engine="1"} 1.0\n'
    assert block_size_from_metrics(disagree) is None  # no guessing between two sizes


def test_served_block_size_asks_metrics_first_then_server_info():
    with FakeVLLMEndpoint(metrics=METRICS_CPU) as fake:
        assert served_block_size(fake.url) == 128
        assert served_block_size(fake.url + "/") == 128
        assert fake.requested == ["/metrics", "/metrics"]
    info = {"vllm_config": {"cache_config": {"block_size": 64}, "scheduler_config": {}}}
    with FakeVLLMEndpoint(metrics="", server_info=info) as fake:
        assert served_block_size(fake.url) == 64
        assert fake.requested == ["/metrics", "/server_info"]
    with FakeVLLMEndpoint() as fake:
        assert served_block_size(fake.url) is None


def test_the_server_engine_identity_carries_the_served_block_size():
    with FakeVLLMEndpoint(metrics=METRICS_CPU) as fake:
        config = EngineConfig(backend="server", server_urls=(fake.url,))
        engine = ServerEngine(config)
        assert engine.identity.block_size == 128
        with pytest.warns(UserWarning, match="engine.block_size is 16 but the server runs with 128-token blocks"):
            assert ServerEngine(replace(config, block_size=16)).identity.block_size == 128
    with FakeVLLMEndpoint() as fake:  # a server that does not say: the configured size
        config = EngineConfig(backend="server", server_urls=(fake.url,), block_size=32)
        assert ServerEngine(config).identity.block_size == 32
        assert ServerEngine(replace(config, block_size=None)).identity.block_size is None


def test_servers_with_different_block_sizes_are_not_one_engine():
    gpu = METRICS_CPU.replace('block_size="128"', 'block_size="16"')
    with FakeVLLMEndpoint(metrics=METRICS_CPU) as a, FakeVLLMEndpoint(metrics=gpu) as b:
        with pytest.raises(EngineUnavailableError, match="different KV cache block sizes"):
            ServerEngine(EngineConfig(backend="server", server_urls=(a.url, b.url)))


def test_one_block_size_function_for_the_ttft_model_and_the_optimizer(tmp_path):
    from promptdistill.engine.cache import CachedEngine
    from promptdistill.engine.meter import CallMeter
    from promptdistill.optimize.predict import DEFAULT_BLOCK_TOKENS, prefix_block_tokens
    from promptdistill.ttft.engine_info import engine_block_size, engine_mechanics

    engine = FakeEngine(identity=EngineIdentity(**IDENT, block_size=128))
    for wrapped in (engine, CallMeter(engine), CallMeter(CachedEngine(engine, tmp_path / "lm.sqlite"))):
        assert engine_block_size(wrapped) == 128
        assert prefix_block_tokens(wrapped) == 128  # was 16 for anything but the in-process engine
        assert engine_mechanics(wrapped)["block_tokens"] == 128
    assert engine_block_size(FakeEngine()) is None
    assert prefix_block_tokens(FakeEngine()) == DEFAULT_BLOCK_TOKENS


def test_a_server_engine_without_its_start_up_check_is_asked_for_the_block_size():
    from promptdistill.optimize.predict import prefix_block_tokens

    with FakeVLLMEndpoint(metrics=METRICS_CPU) as fake:
        engine = ServerEngine(EngineConfig(backend="server", server_urls=(fake.url,)), check=False)
        assert engine.identity.block_size is None and not fake.requested
        assert prefix_block_tokens(engine) == 128


# --- configuration and identity ------------------------------------------------------------


def test_block_size_in_the_config_file_and_the_environment(tmp_path):
    assert EngineConfig().block_size is None  # vLLM's default for the build
    toml = tmp_path / "promptdistill.toml"
    toml.write_text("[engine]\nblock_size = 64\n")
    assert load_settings(toml, env={}).engine.block_size == 64
    assert load_settings(toml, env={"PROMPTDISTILL_BLOCK_SIZE": "16"}).engine.block_size == 16
    assert load_settings(toml, env={"PROMPTDISTILL_BLOCK_SIZE": ""}).engine.block_size is None
    with pytest.raises(ConfigError, match=r"\$PROMPTDISTILL_BLOCK_SIZE: engine.block_size: expected int"):
        load_settings(toml, env={"PROMPTDISTILL_BLOCK_SIZE": "big"})
    toml.write_text("[engine]\nblock_size = 0\n")
    with pytest.raises(ConfigError, match="engine.block_size: must be at least 1, got 0"):
        load_settings(toml, env={})
    toml.write_text('[engine]\nblock_size = "128"\n')
    with pytest.raises(ConfigError, match="engine.block_size: expected int"):
        load_settings(toml, env={})


def test_the_launcher_passes_the_block_size_to_vllm(tmp_path, monkeypatch):
    import promptdistill.core.config as config_module

    log = tmp_path / "server.log"
    cmd = VLLMServer("model", EngineConfig(block_size=64), port=8001, log_path=log).command()
    assert cmd[cmd.index("--block-size") + 1] == "64"
    # Unset: 32 on a CPU build (vLLM's own CPU default is 128), vLLM's default on a GPU.
    monkeypatch.setattr(config_module, "has_gpu", lambda: False)
    cmd = VLLMServer("model", EngineConfig(), port=8001, log_path=log).command()
    assert cmd[cmd.index("--block-size") + 1] == str(config_module.CPU_BLOCK_SIZE) == "32"
    monkeypatch.setattr(config_module, "has_gpu", lambda: True)
    assert "--block-size" not in VLLMServer("model", EngineConfig(), port=8001, log_path=log).command()
    assert "--block-size" in VLLMServer("model", EngineConfig(block_size=16), port=8001, log_path=log).command()


def test_the_block_size_an_engine_starts_with():
    from promptdistill.core.config import CPU_BLOCK_SIZE, block_size_to_start

    assert block_size_to_start(EngineConfig(), gpu=False) == CPU_BLOCK_SIZE == 32
    assert block_size_to_start(EngineConfig(), gpu=True) is None
    assert block_size_to_start(EngineConfig(block_size=128), gpu=False) == 128
    assert block_size_to_start(EngineConfig(block_size=64), gpu=True) == 64


def test_the_block_size_is_part_of_the_engine_identity():
    import hashlib

    unknown, cpu, gpu = EngineIdentity(**IDENT), EngineIdentity(**IDENT, block_size=128), EngineIdentity(**IDENT, block_size=16)
    assert len({unknown.key(), cpu.key(), gpu.key()}) == 3  # a TTFT model fitted at one size refits at another
    # Identities stored before the field existed keep their keys (their models still load).
    assert unknown.key() == hashlib.sha256(canonical_json(IDENT).encode()).hexdigest()[:16]
    assert EngineIdentity.from_dict(IDENT) == unknown
    assert EngineIdentity.from_dict(cpu.to_dict()) == cpu
    # A profile table holds it as a float column (NaN when unknown): the same identity and key.
    assert EngineIdentity(**IDENT, block_size=128.0).key() == cpu.key()
    assert EngineIdentity(**IDENT, block_size=float("nan")).key() == unknown.key()


def test_a_ttft_model_fitted_at_another_block_size_refuses_to_predict():
    from promptdistill.core.errors import ModelIdentityError
    from promptdistill.ttft.estimators import MonomialRegressor
    from promptdistill.ttft.model import TTFTModel

    X = np.column_stack([np.linspace(10, 900, 20), np.zeros(20), np.zeros(20), np.full(20, 0.5), np.full(20, 7.0)])
    model = TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, 50 + 0.4 * X[:, 0]), "monomial", "linear",
                      EngineIdentity(**IDENT, block_size=16))
    with pytest.raises(ModelIdentityError, match="block_size: fitted on 16, asked for 128"):
        model.check_engine(EngineIdentity(**IDENT, block_size=128))


# --- warm cached tokens: one rule ------------------------------------------------------------


def test_warm_cached_tokens_is_one_function():
    import promptdistill.optimize as optimize
    import promptdistill.optimize.predict as predict
    import promptdistill.ttft.model as model
    from promptdistill.ttft.estimators import EngineMechanics, warm_cached_tokens

    assert optimize.warm_cached_tokens is predict.warm_cached_tokens is warm_cached_tokens
    # The TTFT model keeps no copy of its own (it reads the rule through EngineMechanics).
    assert getattr(model, "warm_cached_tokens", warm_cached_tokens) is warm_cached_tokens
    static, total = np.array([300.0, 100.0, 256.0, 40.0, 0.0]), np.array([400.0, 400.0, 256.0, 100.0, 50.0])
    assert warm_cached_tokens(static, total, 128).tolist() == [256.0, 0.0, 128.0, 0.0, 0.0]
    assert warm_cached_tokens(static, total, None).tolist() == [300.0, 100.0, 255.0, 40.0, 0.0]
    # The model's mechanics derive the same cached column from (uncached, cached) inputs.
    X = np.column_stack([total - static, static, np.zeros((5, 5))])
    derived = EngineMechanics(block_tokens=128).fit_transform(X)
    assert derived[:, 1].tolist() == warm_cached_tokens(static, total, 128).tolist()
    assert (derived[:, 0] == total - derived[:, 1]).all()


def _linear_ttft_model(block_size, cached_ms_per_token, ms_per_token=0.4):
    """A TTFT model of 50 ms + ``ms_per_token`` per prompt token + ``cached_ms_per_token`` per
    cached one, fitted exactly on random prompts, for an engine with ``block_size``; and 3
    dev records of ticket_triage."""
    from promptdistill.specs.datasets import dataset_for, records
    from promptdistill.ttft.estimators import MonomialRegressor
    from promptdistill.ttft.model import TTFTModel
    from bundled_specs import load_spec

    spec = load_spec("ticket_triage")
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(10, 1500, 60), rng.choice([0, 128, 256], 60), rng.integers(0, 8, 60),
                         rng.uniform(0.3, 0.8, 60), rng.uniform(5, 9, 60)])
    ident = replace(FAKE_IDENTITY, block_size=block_size)
    y = 50 + ms_per_token * X[:, 0] + cached_ms_per_token * X[:, 1]
    model = TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, y), "monomial", "linear", ident)
    return model, FakeEngine(identity=ident), spec, records(dataset_for(spec), "dev")[:3]


def test_warm_predictions_use_the_engine_block_size(tmp_path):
    """The optimizer's warm prediction through a server caches whole 128-token blocks, not 16."""
    from promptdistill.optimize.predict import predict_candidate, prefix_block_tokens

    model, engine, spec, dev = _linear_ttft_model(128, 0.02)
    p = predict_candidate(engine, model, spec, dev, block_tokens=prefix_block_tokens(engine))
    assert p["warm_cached_tokens"] % 128 == 0
    assert p["warm_cached_tokens"] == 128 * (p["static_prefix_tokens"] // 128)  # one static prefix for all records
    p16 = predict_candidate(engine, model, spec, dev, block_tokens=16)
    assert p16["warm_cached_tokens"] > p["warm_cached_tokens"] and p16["ttft_warm_ms"] < p["ttft_warm_ms"]


def test_a_warm_prediction_above_the_cold_one_is_held_at_it_and_counted():
    """A model fitted on few points can charge cached tokens more than computing them; a
    prefix cache only skips work, so the optimizer never predicts warm above cold."""
    from promptdistill.optimize.predict import predict_candidate

    model, engine, spec, dev = _linear_ttft_model(32, 0.02)
    sound = predict_candidate(engine, model, spec, dev, block_tokens=32)
    assert sound["ttft_warm_ms"] < sound["ttft_cold_ms"] and sound["clipped_predictions"] == 0
    model, engine, spec, dev = _linear_ttft_model(32, 1.0)
    wrong = predict_candidate(engine, model, spec, dev, block_tokens=32)
    assert wrong["warm_cached_tokens"] > 0
    assert wrong["ttft_warm_ms"] == pytest.approx(wrong["ttft_cold_ms"])
    assert wrong["clipped_predictions"] == len(dev)


def _pruned_run(block_aligned: bool = True, ms_per_token: float = 0.4):
    """An optimizer run on ticket_triage (fake engine, the linear TTFT model at 32-token
    blocks) and the baseline's clauses."""
    from promptdistill.optimize.run import OptimizeBudget, OptimizeRun
    from promptdistill.optimize.select import SelectionRule
    from promptdistill.specs.clauses import split_clauses

    model, engine, spec, _ = _linear_ttft_model(32, 0.02, ms_per_token)
    budget = OptimizeBudget(max_lm_calls=400, screen_size=4, dev_size=20, test_size=4, feature_records=3,
                            block_aligned=block_aligned)
    run = OptimizeRun(engine, spec, model, budget, 0, SelectionRule(), None)
    return run, spec, [c for c in split_clauses(spec) if not c.protected]


def _candidate(run, cid, spec):
    from promptdistill.optimize.candidates import ExampleCandidate
    from promptdistill.optimize.examples import fixed_spec

    cand = ExampleCandidate(id=f"{cid}/none", spec=fixed_spec(spec, []), variant=cid, strategy="none")
    run.predict(cand)
    return cand


@pytest.mark.parametrize("ms_per_token", [0.4, -0.05], ids=["physical", "cheaper-when-longer"])
def test_a_restored_clause_is_added_when_it_ends_the_static_prefix_on_a_block_edge(ms_per_token):
    """Per pruned candidate, the optimizer adds the restore of one pruned clause that caches
    more of the prefix warm and is predicted cheapest, and only when it is cheaper than the
    candidate itself; the added prompt is the candidate plus one clause of the baseline. A
    model that predicts longer prompts faster (an extrapolation) must not add a restore
    that caches nothing more."""
    from itertools import combinations

    from promptdistill.optimize.blocks import restored_variants
    from promptdistill.specs.clauses import apply_clauses, split_clauses

    run, spec, free = _pruned_run(ms_per_token=ms_per_token)
    seen = {"added": 0, "crosses but dearer": 0}
    for drop in [d for r in (1, 2) for d in combinations(free, r)]:
        # The baseline without the clauses in `drop`: a distiller-like prune.
        keep = {c.id for c in split_clauses(spec)} - {c.id for c in drop}
        cand = _candidate(run, "prune", apply_clauses(spec, keep))
        out = run.block_aligned([cand])
        options = []
        for cid, restored in restored_variants(spec, cand.spec):
            alt = _candidate(run, f"probe+{cid}", restored)
            if alt.prediction["warm_cached_tokens"] > cand.prediction["warm_cached_tokens"]:
                options.append((alt.cost, cid))
        best = min(options, default=None)
        if best is None or best[0] >= cand.cost:
            assert out == [], f"dropping {[c.id for c in drop]}: a restore that is not cheaper was added"
            seen["crosses but dearer"] += best is not None
            continue
        seen["added"] += 1
        (alt,) = out
        assert alt.cost == pytest.approx(best[0]) and alt.variant == f"prune+{best[1]}"
        assert alt.prediction["warm_cached_tokens"] > cand.prediction["warm_cached_tokens"]
        assert alt.strategy == "none" and alt.examples == cand.examples
        restored = next(c.text for c in split_clauses(spec) if c.id == best[1])
        assert [c.text for c in split_clauses(cand.spec)] == [c.text for c in split_clauses(alt.spec)
                                                              if c.text != restored]
        assert "block-aligned" in alt.notes[0] and "past the last 32-token block" in alt.notes[0]
    # Both branches ran, so the assertions above could fail either way.
    assert seen["added"] >= 3, seen
    if ms_per_token > 0:
        assert seen["crosses but dearer"] >= 3, seen


def test_no_restore_for_the_original_a_rewrite_or_when_switched_off():
    from promptdistill.optimize.blocks import restored_variants
    from promptdistill.specs.clauses import apply_clauses, split_clauses

    run, spec, free = _pruned_run()
    off, _, _ = _pruned_run(block_aligned=False)
    prunes = [apply_clauses(spec, {c.id for c in split_clauses(spec)} - {c.id for c in free[-drop:]})
              for drop in range(1, len(free))]
    helped = [p for p in prunes if run.block_aligned([_candidate(run, "p", p)])]
    assert helped and all(off.block_aligned([_candidate(off, "p", p)]) == [] for p in helped)
    pruned = helped[0]
    rewrite = pruned.with_changes(instruction=pruned.instruction.replace("ShopRight", "ShopLeft"))
    assert restored_variants(spec, pruned) and restored_variants(spec, rewrite) == []
    assert restored_variants(spec, spec) == []
    assert run.block_aligned([_candidate(run, "original", spec), _candidate(run, "rw", rewrite)]) == []
    # One clause pruned: its only restore is the original instruction, which the grid already has
    # (a model that favours longer prompts, so that restores are added at all).
    longer, _, _ = _pruned_run(ms_per_token=-0.05)
    one_off = [apply_clauses(spec, {c.id for c in split_clauses(spec)} - {c.id}) for c in free]
    restorable = [p for p in one_off if longer.block_aligned([_candidate(longer, "p", p)])]
    longer.grid = [_candidate(longer, "original", spec)]
    assert restorable and all(longer.block_aligned([_candidate(longer, "p", p)]) == [] for p in restorable)


# --- the real engine and server (run by the maintainers: `-m "engine or server"`) -----------


@pytest.mark.engine
def test_the_in_process_engine_reports_its_block_size(engine):
    from promptdistill.optimize.predict import prefix_block_tokens
    from promptdistill.ttft.engine_info import engine_block_size, engine_mechanics

    size = engine.identity.block_size
    # promptdistill's CPU default, not vLLM's (128): the engine ran with what it was given.
    assert size == engine._llm.llm_engine.vllm_config.cache_config.block_size == 32
    assert engine_block_size(engine) == prefix_block_tokens(engine) == engine_mechanics(engine)["block_tokens"] == size


@pytest.mark.server
@pytest.mark.engine
def test_a_vllm_server_reports_its_block_size_and_the_optimizer_uses_it(model_dir):
    import httpx

    from promptdistill.engine import GenerationRequest
    from promptdistill.optimize.predict import prefix_block_tokens
    from promptdistill.ttft.engine_info import engine_mechanics

    config = EngineConfig(max_model_len=2048, block_size=64)
    with VLLMServer(model_dir, config, startup_timeout_s=420) as server:
        root = server.url.removesuffix("/v1")
        assert block_size_from_metrics(httpx.get(f"{root}/metrics", timeout=10).text) == 64
        assert served_block_size(server.url) == 64
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the configured size is the served one: no warning
            engine = ServerEngine(replace(config, backend="server", server_urls=(server.url,)))
        assert engine.identity.block_size == 64
        assert engine.identity.key() != replace(engine.identity, block_size=128).key()
        assert prefix_block_tokens(engine) == 64 and engine_mechanics(engine)["block_tokens"] == 64
        # What the server caches is whole 64-token blocks of the shared prefix.
        assert engine.reset_prefix_cache() is True
        static = "Policy: refunds within thirty days with a receipt. " * 20
        engine.generate([GenerationRequest(prompt=static + "Q1", max_tokens=1)])
        warm = engine.generate([GenerationRequest(prompt=static + "Q2", max_tokens=1)])[0]
        assert warm.cached_tokens > 0 and warm.cached_tokens % 64 == 0


@pytest.mark.server
@pytest.mark.engine
def test_a_cpu_server_started_with_the_defaults_serves_32_token_blocks(model_dir):
    config = EngineConfig(max_model_len=2048)
    with VLLMServer(model_dir, config, startup_timeout_s=420) as server:
        engine = ServerEngine(replace(config, backend="server", server_urls=(server.url,)))
        assert engine.identity.block_size == 32 == served_block_size(server.url)

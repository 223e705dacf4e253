"""Shared fixtures. The real engine is created once per test session.

Tests marked ``engine`` use the in-process vLLM engine with the embedded SmolLM2 model
(eager mode, no multiprocessing: it starts in seconds).
"""

from __future__ import annotations

import os

import pytest

# Offline and quiet defaults, set before anything imports litellm, DSPy, Prefect or vLLM.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_dir():
    """The converted embedded model folder (converted once per machine)."""
    from promptdistill.engine.embedded import ensure_embedded_model

    return ensure_embedded_model()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    """The served model's tokenizer and chat template, without starting vLLM."""
    from promptdistill.engine.tokenizer import cached_tokenizer

    return cached_tokenizer(str(model_dir))


@pytest.fixture(scope="session")
def engine(model_dir):
    """The real in-process vLLM engine on SmolLM2-135M-Instruct (one per session)."""
    from promptdistill.core.config import EngineConfig
    from promptdistill.engine import load_engine

    eng = load_engine(EngineConfig(backend="local", model=str(model_dir)))
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def ttft_model_dir(engine, tmp_path_factory):
    """A TTFT model folder for the session engine: the project's when it has one for this
    engine, else fitted once here from a short real profile (a few minutes at most)."""
    from promptdistill.cli.optimize import find_ttft_model
    from promptdistill.core.config import load_settings
    from promptdistill.core.errors import PromptDistillError
    from promptdistill.ttft import ProfileConfig, TTFTModel, fit_models, run_profile

    try:
        path = find_ttft_model(None, load_settings().state_dir)
        TTFTModel.load(path, engine_identity=engine.identity)
        return path
    except PromptDistillError:
        pass
    # Short prompts (the optimizer's candidates have 200-600 tokens), no waiting for a quiet
    # CPU and no re-measuring: a small real model, fitted in bounded time on a shared machine.
    config = ProfileConfig(points=12, repeats=1, spec_records=0, density_probe_tokens=(), fewshot_probe=False,
                           warmup=1, budget_s=900.0, max_tokens=640, max_retries=0, quiet_wait_s=0)
    profile = run_profile(engine, config, progress=False)
    fit = fit_models(profile.frame, n_splits=3, drop_contended=False)
    root = tmp_path_factory.mktemp("ttft") / "models"
    TTFTModel.from_fit(fit, profile.frame).save_versioned(root)
    return root

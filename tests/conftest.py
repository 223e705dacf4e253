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
    from promptdistill.config import EngineConfig
    from promptdistill.engine import load_engine

    eng = load_engine(EngineConfig(backend="local", model=str(model_dir)))
    yield eng
    eng.close()

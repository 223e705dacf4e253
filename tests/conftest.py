"""Shared fixtures. The real engine is created once per test session.

Tests marked ``engine`` use the in-process vLLM engine with the embedded SmolLM2 model
(eager mode, no multiprocessing: it starts in seconds).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from promptdistill.core.env import apply_defaults

# Offline and quiet defaults, set before anything imports litellm, DSPy, Prefect or vLLM.
apply_defaults()
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


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
def ttft_model(engine):
    """A TTFT model for the session engine, fitted here from a short real profile (a few
    minutes at most), never read from the developer's artifacts."""
    from promptdistill.ttft.fit import fit_models
    from promptdistill.ttft.model import TTFTModel
    from promptdistill.ttft.profile import ProfileConfig, run_profile

    # Short prompts (the optimizer's candidates have 200-600 tokens), no waiting for a quiet
    # CPU and no re-measuring: a small real model, fitted in bounded time on a shared machine.
    config = ProfileConfig(points=12, repeats=1, spec_records=0, density_probe_tokens=(), fewshot_probe=False,
                           warmup=1, max_minutes=15.0, max_tokens=640, max_retries=0, quiet_wait_s=0)
    profile = run_profile(engine, config, progress=False)
    return TTFTModel.from_fit(fit_models(profile.frame, n_splits=3, drop_contended=False), profile.frame)


@pytest.fixture(scope="session")
def ttft_registry(ttft_model, tmp_path_factory):
    """A registry root holding the session's TTFT model, where the benchmarks and the CLI look."""
    from promptdistill.pipeline.ttft_models import publish_ttft_model
    from promptdistill.registry.store import Registry

    root = tmp_path_factory.mktemp("registry")
    publish_ttft_model(Registry(str(root)), ttft_model)
    return root



@pytest.fixture(scope="session")
def seed_ttft_model(ttft_registry):
    """``seed(registry_root)`` puts the session's TTFT model into that registry.

    For nightlies whose subject is not the TTFT refresh (test_flows and test_console run
    that from an empty registry): their engine has the session engine's identity, so the
    night finds a fresh model and skips a profile that costs two of its three minutes.
    """
    import shutil

    def seed(registry_root) -> None:
        src, dest = Path(ttft_registry), Path(registry_root)
        shutil.copytree(src / "artifacts" / "ttft-model", dest / "artifacts" / "ttft-model")
        if not (dest / "registry.json").exists():
            shutil.copy2(src / "registry.json", dest / "registry.json")

    return seed


@pytest.fixture(scope="session")
def vllm_server(model_dir):
    """One real vLLM OpenAI server for the session's server tests (load measurement,
    the server backend): started on first use, stopped at the session's end."""
    from promptdistill.core.config import EngineConfig
    from promptdistill.engine.launcher import VLLMServer

    config = EngineConfig(max_model_len=2048)
    with VLLMServer(model_dir, config, startup_timeout_s=420) as server:
        yield server

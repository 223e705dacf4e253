"""The engine layer: one interface (``Engine.generate(requests) -> results``), two real backends.

* ``local``: in-process ``vllm.LLM`` (``LocalEngine``);
* ``server``: one or more OpenAI-compatible vLLM servers (``ServerEngine``).

``load_engine()`` builds the configured one; heavy imports happen only then.
"""

from __future__ import annotations

from pathlib import Path

from promptdistill.core.config import EngineConfig, load_settings
from promptdistill.core.errors import ModelNotFoundError
from promptdistill.engine.base import Engine, GenerationRequest

__all__ = ["Engine", "GenerationRequest", "load_engine", "resolve_model"]


def resolve_model(model: str) -> str:
    """``embedded`` -> the converted SmolLM2 folder; a path must exist; else a hub name."""
    if model == "embedded":
        from promptdistill.engine.embedded import ensure_embedded_model

        return str(ensure_embedded_model())
    looks_like_path = model.startswith(("/", ".", "~")) or Path(model).exists()
    if looks_like_path:
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"engine.model: {model!r} is not an HF model folder (no config.json)")
        return str(path)
    return model


def load_engine(config: EngineConfig | None = None) -> Engine:
    """The engine the config asks for (default: the config file, else the embedded model)."""
    config = (config or load_settings().engine).validate()
    if config.backend == "server":
        from promptdistill.engine.server import ServerEngine

        return ServerEngine(config)
    from promptdistill.engine.local import LocalEngine

    return LocalEngine(config, model_path=resolve_model(config.model))

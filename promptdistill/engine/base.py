"""The engine interface every stage uses: ``generate(requests) -> results``.

A request is a frozen value object (it doubles as a cache key); a result carries the
text plus the token counts and timings the TTFT models are fitted on.

Timing (milliseconds), the same meaning on every backend:

* ``ttft_ms``: from the moment the request is handed to the engine (in-process: the
  request's arrival in vLLM; server: just before the HTTP request is sent) to the
  moment the first output token exists (in-process: vLLM's first_token_ts; server:
  the arrival of the first streamed content chunk at the client). It includes queueing
  behind other requests of the same batch, as a production caller would see it.
* ``e2e_ms``: from the same start to the last token.

Both backends validate every structured reply against its schema with jsonschema and
report ``valid``/``error`` rather than passing an invalid reply on as if it were valid.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import jsonschema

from promptdistill.core.errors import SchemaError
from promptdistill.core.jsonio import canonical_json

__all__ = [
    "Engine",
    "EngineIdentity",
    "EngineWrapper",
    "GenerationRequest",
    "GenerationResult",
    "Message",
    "check_reply",
    "hardware_fingerprint",
    "unwrap_engine",
    "validate_reply",
]

Message = Mapping[str, str]
_ROLES = ("system", "user", "assistant")


def hardware_fingerprint() -> str:
    """A short description of the machine: the GPU's name when vLLM runs on one, else the
    CPU model and core count. TTFT models are fitted per fingerprint."""
    torch = sys.modules.get("torch")  # loaded by vLLM already; never imported just for this
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
        except Exception:  # noqa: BLE001 - a broken CUDA set-up: describe the CPU instead
            pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu} x{os.cpu_count()}"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation request. Frozen and hashable: ``key()`` is a stable cache key.

    Give either ``messages`` (chat; the engine applies the model's chat template) or a
    raw ``prompt``.
    """

    messages: tuple[tuple[str, str], ...] | None = None
    """Chat messages as (role, content) pairs; dicts with role/content are accepted."""
    prompt: str | None = None
    """A raw prompt, sent without a chat template."""
    temperature: float = 0.0
    """Sampling temperature in [0, 2]; 0 is greedy."""
    max_tokens: int = 256
    """Most tokens to generate."""
    seed: int | None = 0
    """Sampling seed (reproducible runs)."""
    stop: tuple[str, ...] = ()
    """Strings that end generation."""
    json_schema: str | None = None
    """A JSON Schema (dict or JSON text) the reply must match: decoding is constrained."""
    choices: tuple[str, ...] | None = None
    """A list of allowed replies: decoding is constrained to one of them."""
    timeout_s: float | None = None
    """How long the request may take; None uses the engine's default."""

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a GenerationRequest needs exactly one of messages or prompt.")
        if self.messages is not None:
            object.__setattr__(self, "messages", _normalise_messages(self.messages))
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        if self.json_schema is not None and not isinstance(self.json_schema, str):
            # Keep the schema's own key order: constrained decoding writes properties in
            # that order (a "reasoning" field before "answer" only works if it stays first).
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema, separators=(",", ":"), ensure_ascii=False))
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.json_schema is not None and self.choices is not None:
            raise ValueError("give json_schema or choices, not both.")
        if self.json_schema is not None:
            _check_schema_text(self.json_schema)
        if self.choices is not None and not self.choices:
            raise ValueError("choices must not be empty.")

    @property
    def schema(self) -> dict | None:
        """The JSON Schema as a dict, or None."""
        return None if self.json_schema is None else json.loads(self.json_schema)

    def chat(self) -> list[dict[str, str]]:
        """The messages as OpenAI-style dicts."""
        return [{"role": r, "content": c} for r, c in (self.messages or ())]

    def key(self) -> str:
        """A sha256 of every field: equal requests have equal keys."""
        return hashlib.sha256(canonical_json(asdict(self)).encode()).hexdigest()

    def replace(self, **changes: Any) -> "GenerationRequest":
        """A copy with some fields changed (the original is unchanged)."""
        values = asdict(self)
        values.update(changes)
        return GenerationRequest(**values)


def _normalise_messages(messages: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping):
            role, content = m.get("role"), m.get("content")
        else:
            role, content = m
        if role not in _ROLES:
            raise ValueError(f"messages[{i}].role must be one of {_ROLES}, got {role!r}.")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}.")
        out.append((role, content))
    if not out:
        raise ValueError("messages must not be empty.")
    return tuple(out)


def check_schema(schema: Any) -> None:
    """Raise SchemaError when ``schema`` is not a valid JSON Schema (Draft 2020-12)."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        path = ".".join(str(p) for p in e.absolute_path) or "(root)"
        raise SchemaError(f"json_schema is not a valid JSON Schema: at {path}: {e.message}") from None


@functools.lru_cache(maxsize=256)
def _check_schema_text(text: str) -> None:
    """:func:`check_schema` once per schema text: a night builds thousands of requests over a
    few schemas, and jsonschema takes about 1.3 ms to check one (some 3 s of summarize's optimize)."""
    check_schema(json.loads(text))


def validate_reply(text: str, schema: Mapping[str, Any]) -> tuple[Any, str | None]:
    """Parse ``text`` as JSON and validate it. Returns (parsed or None, error or None)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON: {e.msg} at char {e.pos}"
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: e.path)
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path) or "(root)"
        return None, f"does not match the schema at {path}: {e.message}"
    return value, None


def check_reply(req: GenerationRequest, text: str) -> tuple[bool | None, Any, str | None]:
    """(valid, parsed, error) of a reply to ``req``; all None when ``req`` is unconstrained.

    Every backend judges replies the same way, so a result means the same thing whichever
    engine produced it.
    """
    if req.json_schema is not None:
        parsed, error = validate_reply(text, req.schema)
        return error is None, parsed, error
    if req.choices is not None:
        if text in req.choices:
            return True, None, None
        return False, None, f"reply {text!r} is not one of the choices"
    return None, None, None


@dataclass
class GenerationResult:
    """What one request produced. Times in milliseconds (see the module docstring)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens served from the prefix cache (None-safe: 0 when unknown)."""
    finish_reason: str | None
    ttft_ms: float
    e2e_ms: float
    valid: bool | None = None
    """For structured requests: did the reply validate? None when unconstrained."""
    parsed: Any = None
    """The parsed JSON for valid schema replies."""
    error: str | None = None
    """Why a structured reply is invalid, or why the request failed."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EngineIdentity:
    """What a measurement or fitted model depends on. Artifacts record it."""

    model: str
    backend: str
    dtype: str
    max_model_len: int
    hardware: str
    engine_version: str
    block_size: int | None = None
    """The KV cache block in tokens the engine runs with (None: not known). Warm TTFT
    depends on it: the prefix cache reuses whole blocks."""

    def __post_init__(self) -> None:
        # Profile tables hold it as a float column (NaN or NA when unknown): one value, one key.
        try:
            size = None if self.block_size is None or self.block_size != self.block_size else int(self.block_size)
        except TypeError:  # pandas' NA has no truth value
            size = None
        object.__setattr__(self, "block_size", size)

    def key(self) -> str:
        """A short stable id: equal identities have equal keys.

        An unknown block size is left out, so identities recorded before it was part of
        them keep their keys; a known one makes a different engine (models refit).
        """
        values = asdict(self)
        if values["block_size"] is None:
            del values["block_size"]
        return hashlib.sha256(canonical_json(values).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EngineIdentity":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class Engine(ABC):
    """The interface every backend implements.

    ``generate`` takes a list and returns results in input order; backends batch the
    list (in-process: one vLLM batch; server: concurrent requests).
    """

    identity: EngineIdentity

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        """Run every request; results come back in input order."""

    @abstractmethod
    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        """The exact prompt text the model sees for these messages."""

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with the served model's tokenizer (no special tokens added)."""

    def count_tokens(self, messages: Sequence[Message] | str) -> int:
        """Prompt tokens for chat messages (chat template applied) or a raw prompt."""
        text = messages if isinstance(messages, str) else self.apply_chat_template(messages)
        return len(self.tokenize(text))

    @abstractmethod
    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache; False when the backend cannot (use a unique prefix)."""

    def close(self) -> None:
        """Release the engine's resources."""

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EngineWrapper(Engine):
    """An engine that adds something to ``generate`` (a cache, a counter) around another one.

    Everything else goes to the wrapped engine unchanged, so the wrapper tokenizes and
    counts exactly as the engine it stands for. ``close`` does not close the wrapped
    engine: its owner does.
    """

    def __init__(self, engine: Engine):
        self.engine = engine

    @property
    def identity(self) -> EngineIdentity:  # type: ignore[override]
        return self.engine.identity

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        return self.engine.apply_chat_template(messages)

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text)

    def count_tokens(self, messages: Sequence[Message] | str) -> int:
        return self.engine.count_tokens(messages)

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()


def unwrap_engine(engine: Any, attr: str | None = None) -> Any:
    """The engine behind ``engine``'s wrappers (each holds the next one as ``.engine``).

    Without ``attr``: the innermost engine (where timing requests must go). With ``attr``:
    the first engine in the chain, ``engine`` itself included, that has that attribute, or
    None when none has.
    """
    while engine is not None:
        if attr is not None and hasattr(engine, attr):
            return engine
        inner = getattr(engine, "engine", None)
        if inner is None:
            return engine if attr is None else None
        engine = inner
    return None

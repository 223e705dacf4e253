"""The one exception tree of promptdistill.

Callers catch ``PromptDistillError`` or narrow down::

    PromptDistillError
    ├── ConfigError            a config file or key is wrong (names the file and key)
    ├── SpecError              a prompt spec, dataset or judge definition is invalid (file: field: reason)
    ├── EngineError            the inference engine failed
    │   ├── ModelNotFoundError     no model at the configured path, or it could not be converted
    │   ├── EngineUnavailableError a server is unreachable or did not become ready in time
    │   ├── PromptTooLongError     a prompt does not fit max_model_len
    │   ├── EngineTimeoutError     a request did not finish within its timeout
    │   └── SchemaError            a JSON Schema for structured output is itself invalid
    ├── ModelIdentityError     a TTFT model is used on an engine other than the one it was fitted on
    └── RegistryError          the template registry refused an operation
        ├── TemplateNotFoundError  unknown name, label or version
        ├── IntegrityError         a stored version fails its content-hash check
        ├── InvalidReplyError      a reply does not parse or does not match the output schema
        └── SpecialTokenError      an input value holds a chat special-token string (policy 'reject')
"""

from __future__ import annotations

from typing import Sequence

__all__ = [
    "ConfigError",
    "EngineError",
    "EngineTimeoutError",
    "EngineUnavailableError",
    "IntegrityError",
    "InvalidReplyError",
    "ModelIdentityError",
    "ModelNotFoundError",
    "PromptDistillError",
    "PromptTooLongError",
    "RegistryError",
    "SchemaError",
    "SpecError",
    "SpecialTokenError",
    "TemplateNotFoundError",
    "error_listing",
]


class PromptDistillError(Exception):
    """Base class of every error promptdistill raises on purpose."""


class ConfigError(PromptDistillError):
    """A configuration file or key is invalid."""


class SpecError(PromptDistillError):
    """A prompt spec, dataset or judge definition is invalid."""


class EngineError(PromptDistillError):
    """The inference engine failed."""


class ModelNotFoundError(EngineError):
    """No usable model at the configured location."""


class EngineUnavailableError(EngineError):
    """A server is unreachable or did not become ready in time."""


class PromptTooLongError(EngineError):
    """A prompt is longer than the engine's max_model_len allows."""


class EngineTimeoutError(EngineError):
    """A request did not finish within its timeout."""


class SchemaError(EngineError):
    """A JSON Schema given for structured output is not a valid schema."""


class ModelIdentityError(PromptDistillError):
    """A fitted model is used with an engine identity other than its own."""


class RegistryError(PromptDistillError):
    """The template registry refused an operation."""


class TemplateNotFoundError(RegistryError):
    """Unknown template name, label or version."""


class IntegrityError(RegistryError):
    """A stored version does not match its content hash."""


class InvalidReplyError(RegistryError):
    """A model reply is not valid JSON or does not match the output schema."""


class SpecialTokenError(RegistryError, ValueError):
    """An input value holds a chat special-token string and the client's policy is ``reject``."""


def error_listing(errors: Sequence[str], heading: str = "errors", max_shown: int | None = None) -> "SpecError":
    """One ``SpecError`` for every problem found: the message itself when there is one, else
    ``"<n> <heading>:"`` and a line each (at most ``max_shown``, the rest counted). Its
    ``errors`` attribute holds them all, for callers that show or test each one."""
    lines = list(errors)
    shown = lines if max_shown is None else lines[:max_shown]
    more = f"\n  ... and {len(lines) - len(shown)} more" if len(shown) < len(lines) else ""
    err = SpecError(lines[0] if len(lines) == 1 else f"{len(lines)} {heading}:\n  " + "\n  ".join(shown) + more)
    err.errors = lines  # type: ignore[attr-defined]
    return err

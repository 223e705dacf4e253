"""The light client production services use to load published templates.

It imports only the standard library, jsonschema, fsspec (for URL roots) and
promptdistill's stdlib-only modules: never vLLM, DSPy, Prefect, torch or pandas.

Example::

    from promptdistill.client import Templates

    templates = Templates("s3://prompts/registry")        # or a folder; None = configured root
    t = templates.get("summarize@production")              # or "summarize:3", or version=3
    body = t.request_body({"text": doc}, model="smollm2-135m")
    reply = httpx.post(f"{base_url}/chat/completions", json=body).json()
    data = t.parse(reply)                                  # json.loads + JSON Schema check

Caching: a version is immutable, so once loaded (and its hash verified) it is kept for
the life of the process. A label is re-resolved when its entry is older than ``ttl_s``;
if the store cannot be reached then, the last good version keeps being served and a
warning is logged. An unknown name, label or version is always an error.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from typing import Any, Mapping

import jsonschema

from promptdistill.core.config import load_settings
from promptdistill.core.errors import InvalidReplyError, RegistryError
from promptdistill.registry.backend import StoreUnavailableError
from promptdistill.registry.records import VersionRecord, parse_ref
from promptdistill.registry.store import Registry
from promptdistill.specs.render import placeholders, render_messages

__all__ = ["StoreUnavailableError", "Template", "Templates"]

logger = logging.getLogger("promptdistill.client")

_EXCERPT_CHARS = 200


class Template:
    """One published template version, ready to render requests and parse replies.

    Instances are immutable and shared between callers: every method returns new
    objects, never internal state.
    """

    __slots__ = ("record", "name", "version", "content_hash", "inputs", "_system", "_user", "_required",
                 "_declared", "_schema", "_validator", "_response_format_json", "_sampling_json", "_max_tokens")

    def __init__(self, record: VersionRecord) -> None:
        content = record.content
        self.record = record
        self.name = record.name
        self.version = record.version
        self.content_hash = record.content_hash
        self.inputs: tuple[str, ...] = tuple(content["inputs"])
        self._system: str = content["system"]
        self._user: str = content["user"]
        self._declared = frozenset(self.inputs)
        self._required = frozenset(placeholders(self._user))
        self._schema = content.get("output_schema")
        self._validator = None
        if self._schema is not None:
            self._validator = jsonschema.validators.validator_for(self._schema)(self._schema)
        fmt = content.get("response_format", "json_schema" if self._schema is not None else "none")
        response_format = None
        if fmt == "json_schema":
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": _schema_name(self.name), "schema": self._schema, "strict": True},
            }
        self._response_format_json = json.dumps(response_format)
        self._sampling_json = json.dumps(dict(content.get("sampling") or {}))
        self._max_tokens: int | None = content.get("max_tokens")

    @property
    def ref(self) -> str:
        """``name:version``."""
        return f"{self.name}:{self.version}"

    def __repr__(self) -> str:
        return f"<Template {self.ref} {self.content_hash[:19]}>"

    # ------------------------------------------------------------------ request
    def render(self, inputs: Mapping[str, Any] | None = None, /, **kwargs: Any) -> list[dict[str, str]]:
        """Chat messages for one request, with the optimizer's own rendering function.

        Args:
            inputs: input values by name (or pass them as keyword arguments).

        Raises:
            TypeError: an input the template needs is missing, or an unknown one is given.
        """
        values = {**inputs, **kwargs} if inputs is not None else kwargs
        keys = values.keys()
        if not (self._required <= keys <= self._declared):
            missing = sorted(self._required - keys)
            unknown = sorted(keys - self._declared)
            problem = f"missing input(s) {missing}" if missing else f"unknown input(s) {unknown}"
            raise TypeError(f"{self.ref}: {problem}; the template takes {list(self.inputs)}")
        return render_messages(self._system, self._user, values)

    @property
    def response_format(self) -> dict[str, Any] | None:
        """The OpenAI-compatible ``response_format`` (json_schema, strict), or None."""
        return json.loads(self._response_format_json)

    @property
    def max_tokens(self) -> int | None:
        return self._max_tokens

    @property
    def sampling(self) -> dict[str, Any]:
        """Sampling settings the template was optimized with (``temperature``, ...)."""
        return json.loads(self._sampling_json)

    @property
    def output_schema(self) -> dict[str, Any] | None:
        return copy.deepcopy(self._schema)

    @property
    def content(self) -> dict[str, Any]:
        """The stored template content (a copy)."""
        return copy.deepcopy(self.record.content)

    @property
    def metrics(self) -> dict[str, Any]:
        return copy.deepcopy(self.record.metrics)

    @property
    def provenance(self) -> dict[str, Any]:
        return copy.deepcopy(self.record.provenance)

    def request_body(self, inputs: Mapping[str, Any], *, model: str, **overrides: Any) -> dict[str, Any]:
        """A ready OpenAI-compatible ``/v1/chat/completions`` body.

        Args:
            inputs: input values by name.
            model: the served model name.
            **overrides: extra or replacement body fields (``stream=True``, ``seed=1``).
        """
        body: dict[str, Any] = {"model": model, "messages": self.render(inputs)}
        body.update(json.loads(self._sampling_json))
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        response_format = json.loads(self._response_format_json)
        if response_format is not None:
            body["response_format"] = response_format
        body.update(overrides)
        return body

    # -------------------------------------------------------------------- reply
    def parse(self, reply: str | bytes | Mapping[str, Any]) -> Any:
        """The reply's JSON, validated against the output schema.

        Args:
            reply: the reply text, or a whole chat-completion response (its first
                choice's message content is used).

        Returns:
            The parsed JSON value; the text itself if the template has no output schema.

        Raises:
            InvalidReplyError: not JSON, or not matching the schema (with the path and reason).
        """
        text = _reply_text(reply, self.ref)
        if self._validator is None:
            return text
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidReplyError(f"{self.ref}: reply is not valid JSON ({e}); reply: {_excerpt(text)}") from None
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise InvalidReplyError(
                f"{self.ref}: reply does not match the output schema at {path}: {error.message}; reply: {_excerpt(text)}"
            )
        return value


class Templates:
    """Load templates by label or version from a registry root, with a TTL cache.

    Args:
        root: the registry folder or fsspec URL; None uses the configured registry
            (``[paths] registry`` / ``$PROMPTDISTILL_REGISTRY``).
        ttl_s: how long a label's resolution is trusted before it is checked again.
        storage_options: fsspec options for URL roots.
    """

    def __init__(self, root: str | None = None, *, ttl_s: float = 60.0,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if root is None:
            root = load_settings().registry
        if ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}.")
        self.root = root
        self.ttl_s = ttl_s
        self.registry = Registry(root, storage_options=storage_options)
        self._templates: dict[tuple[str, int], Template] = {}
        self._labels: dict[tuple[str, str], tuple[int, float]] = {}  # -> (version, expires_at)
        self._refs: dict[str, tuple[str, str | None, int | None]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Templates({self.root!r}, ttl_s={self.ttl_s})"

    def get(self, ref: str, *, label: str | None = None, version: int | None = None) -> Template:
        """A template by ``name@label``, ``name:3``, or a name plus ``label=``/``version=``.

        A bare name means its ``production`` label.

        Raises:
            TemplateNotFoundError: unknown name, label or version (never another version instead).
            IntegrityError: the stored version fails its hash check.
            StoreUnavailableError: the store cannot be reached and nothing was loaded before.
        """
        if label is None and version is None:
            parsed = self._refs.get(ref)
            if parsed is None:
                parsed = parse_ref(ref)
                if len(self._refs) < 4096:
                    self._refs[ref] = parsed
            name, label, version = parsed
        else:
            name, label, version = parse_ref(ref, label=label, version=version)
        if version is not None:
            template = self._templates.get((name, version))
            return template if template is not None else self._load(name, version)
        entry = self._labels.get((name, label))
        if entry is not None and entry[1] > time.monotonic():
            template = self._templates.get((name, entry[0]))
            if template is not None:
                return template
        return self._refresh_label(name, label)

    def clear(self) -> None:
        """Forget every cached label resolution and version."""
        with self._lock:
            self._templates.clear()
            self._labels.clear()

    def _load(self, name: str, version: int) -> Template:
        template = Template(self.registry.get_version(name, version))
        self._templates[(name, version)] = template
        return template

    def _refresh_label(self, name: str, label: str) -> Template:
        with self._lock:
            entry = self._labels.get((name, label))
            now = time.monotonic()
            if entry is not None and entry[1] > now and (name, entry[0]) in self._templates:
                return self._templates[(name, entry[0])]  # another thread refreshed it
            try:
                version = self.registry.resolve(name, label)
                template = self._templates.get((name, version)) or self._load(name, version)
            except StoreUnavailableError as e:
                if entry is None or (name, entry[0]) not in self._templates:
                    raise
                logger.warning(
                    "registry %s unreachable; serving last good copy %s:%s for %s@%s (retrying in %.0f s): %s",
                    self.root, name, entry[0], name, label, self.ttl_s, e,
                )
                self._labels[(name, label)] = (entry[0], now + self.ttl_s)
                return self._templates[(name, entry[0])]
            self._labels[(name, label)] = (version, time.monotonic() + self.ttl_s)
            return template


def _schema_name(name: str) -> str:
    # OpenAI's json_schema.name allows [a-zA-Z0-9_-]{1,64}.
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:64]


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "...")


def _reply_text(reply: Any, ref: str) -> str:
    if isinstance(reply, bytes):
        return reply.decode("utf-8", errors="replace")
    if isinstance(reply, str):
        return reply
    if isinstance(reply, Mapping):
        try:
            content = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise InvalidReplyError(f"{ref}: a reply dict must be a chat completion with choices[0].message.content") from None
        if isinstance(content, str):
            return content
        raise InvalidReplyError(f"{ref}: choices[0].message.content is {type(content).__name__}, not text")
    raise RegistryError(f"{ref}: parse() takes the reply text or a chat completion dict, got {type(reply).__name__}")

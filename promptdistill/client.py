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

Canaries and telemetry (see docs/rollout.md)::

    t = templates.get("summarize@production", key=user_id)  # the canary for a stable share of keys
    started = time.perf_counter()
    reply = httpx.post(f"{base_url}/chat/completions", json=t.request_body(inputs, model=m)).json()
    data = t.parse_observed(reply, started_at=started)      # parse, and record latency and failure

``get`` with a ``key`` serves the version on the ``canary`` label to the keys whose hash
falls below the canary's share (the same version for the same key, in every process);
without a key, a random share of calls. ``observe`` and ``parse_observed`` record per
template, version and label (Prometheus, an optional sink in the store): see
``promptdistill.registry.telemetry``. A failure there never fails or slows a request.

Caching: a version is immutable, so once loaded (and its hash verified) it is kept for
the life of the process. A label is re-resolved when its entry is older than ``ttl_s``.

Waiting is bounded (see docs/client.md): the store is read in a background thread, one
per template and label, never under a lock shared with other templates. A label that
has a last good copy waits at most ``timeout_s`` (0.5 s) for its refresh, then is
served from that copy while the refresh goes on (stale-while-revalidate); a cold get
waits at most ``cold_timeout_s``. When a refresh fails (store unreachable or hanging,
or a corrupt label history or version) the last good copy keeps being served, a
warning is logged, and the store is asked again ``ttl_s`` after the failure was seen.
An unknown name, label or version from a store that holds a registry is always an
error, never another version instead. The last good copy of ``NAME@production`` is its
whole assignment: production's version, and the canary's with its share.

What input values put into the rendered user message is checked for chat special-token
strings (``<|im_end|>``, ``[INST]``, ...): see ``DEFAULT_SPECIAL_TOKENS``.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import random
import re
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import jsonschema

from promptdistill.core.config import load_settings
from promptdistill.core.errors import (
    IntegrityError,
    InvalidReplyError,
    PromptDistillError,
    RegistryError,
    SpecialTokenError,
    TemplateNotFoundError,
)
from promptdistill.registry.backend import StoreUnavailableError
from promptdistill.registry.records import (
    CANARY_LABEL,
    VersionRecord,
    canary_point,
    openai_response_format,
    parse_ref,
    response_format_kind,
)
from promptdistill.registry.store import Registry
from promptdistill.registry.telemetry import Telemetry, default_telemetry
from promptdistill.specs.render import placeholders, render_messages, render_text_spans, value_text
from promptdistill.specs.schema_from import request_schema

__all__ = ["DEFAULT_SPECIAL_TOKENS", "SpecialTokenError", "StoreUnavailableError", "Telemetry", "Template", "Templates"]

logger = logging.getLogger("promptdistill.client")

_EXCERPT_CHARS = 200

DEFAULT_SPECIAL_TOKENS: tuple[str, ...] = (
    # ChatML (Qwen, SmolLM, ...), Llama 3, Phi-3: also caught by the <|name|> shape below.
    "<|im_start|>", "<|im_end|>", "<|endoftext|>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|end|>",
    # Llama 2 and Mistral.
    "<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>",
    "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
    # Gemma.
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
)
"""Special-token strings looked for in input values. Besides these, anything shaped
like ``<|name|>`` or ``<｜name｜>`` (the convention of most current chat models) is
matched. A vLLM server tokenizes the templated chat text in one go, so such a string
in a value would become a real role marker there."""

_SHAPES = r"<\|[A-Za-z0-9_.:/-]{1,48}\|>|<\uff5c[^\uff5c<>]{1,48}\uff5c>"
_SHAPE_CHARS = 52  # the longest a _SHAPES match can be
_ZWSP = "\u200b"
_REPLACEMENT = "\ufffd"
_POLICIES = ("escape", "reject", "keep")


class _Markers:
    """The special-token policy: find the strings, then escape them, refuse them, or keep them.

    The check runs on the rendered user message, not value by value, so two values that
    join into a marker (``{a}{b}`` with ``<|im_`` and ``end|>``) are caught, and on the
    text actually inserted (``str()`` of each value, as ``render_text`` inserts it). A
    marker that lies wholly in the template's own text is the template author's and is
    left alone; one that an inserted value is part of is escaped or refused.

    Escaping inserts a zero-width space after the marker's first character
    (``<\u200b|im_end|>``): the model reads nearly the same text, and no tokenizer matches it
    as a special token. A one-character marker cannot be split, so escaping replaces it by
    U+FFFD (the replacement character). No escape leaves a match at its position, and no
    character is escaped twice, so the scan ends.
    """

    __slots__ = ("policy", "pattern", "reach")

    def __init__(self, tokens: Iterable[str], policy: str) -> None:
        if policy not in _POLICIES:
            raise ValueError(f"on_special_tokens must be one of {_POLICIES}, got {policy!r}")
        tokens = [t for t in tokens if isinstance(t, str) and t]
        for t in tokens:
            for char, name in ((_ZWSP, "a zero-width space"), (_REPLACEMENT, "U+FFFD")):
                if char in t:
                    raise ValueError(f"special_tokens: {t!r} holds {name}, a character escaping inserts")
        self.policy = policy
        alternatives = [re.escape(t) for t in sorted(set(tokens), key=len, reverse=True)] + [_SHAPES]
        self.pattern = re.compile("|".join(alternatives))
        self.reach = max([len(t) for t in tokens] + [_SHAPE_CHARS])  # the longest a match can be

    def render(self, system: str, user: str, values: Mapping[str, Any], ref: str) -> list[dict[str, str]]:
        """``render_messages`` with the policy applied to what the values put into the user message."""
        texts = {}
        for name, value in values.items():
            try:
                texts[name] = value_text(value)
            except RecursionError:
                raise ValueError(f"{ref}: input {name!r}: nested too deeply to insert as JSON text") from None
        messages = render_messages(system, user, texts)
        if self.policy == "keep" or self.pattern.search(messages[-1]["content"]) is None:
            return messages
        content, spans = render_text_spans(user, texts)
        messages[-1] = {"role": "user", "content": self._apply(content, spans, ref)}
        return messages

    def _apply(self, content: str, spans: list[tuple[str, int, int]], ref: str) -> str:
        at = 0
        while (m := self.pattern.search(content, at)) is not None:
            start, end = m.span()
            # A value is part of the marker if it overlaps it, or is an empty value inside it.
            names = [n for n, s, e in spans if (s < end and e > start) or (s == e and start < s < end)]
            if not names:  # wholly the template's own text
                at = start + 1
                continue
            if self.policy == "reject":
                raise SpecialTokenError(_marker_problem(ref, m, spans, names))
            if end - start == 1:  # wholly value text, and it cannot be split
                content = content[:start] + _REPLACEMENT + content[end:]
                # Removing a '<', '>' or '｜' may complete a <｜name｜> shape that begins
                # earlier: look again from the earliest start a marker through here can have.
                at = max(0, start - self.reach + 1)
                continue
            content = content[:start + 1] + _ZWSP + content[start + 1:]
            # The inserted space counts as value text, so it never makes a marker the template's.
            spans = [(n, s + (s > start), e + (e > start)) for n, s, e in spans] + [(names[0], start + 1, start + 2)]
            at = start  # the next marker may start here, or overlap the one just broken
        return content


def _marker_problem(ref: str, m: re.Match[str], spans: list[tuple[str, int, int]], names: list[str]) -> str:
    start, end = m.span()
    inside = [(n, s) for n, s, e in spans if s <= start and end <= e]
    if inside:
        where = f"input {inside[0][0]!r}: holds the special-token string {m.group(0)!r} at char {start - inside[0][1]}"
    else:
        joined = ", ".join(repr(n) for n in dict.fromkeys(names))
        where = (f"input(s) {joined}: form the special-token string {m.group(0)!r} with the text next to them "
                 f"(at char {start} of the user message)")
    return f"{ref}: {where}; the policy is 'reject' (use on_special_tokens='escape' to neutralise it)"


_DEFAULT_MARKERS = _Markers(DEFAULT_SPECIAL_TOKENS, "escape")


class Template:
    """One published template version, ready to render requests and parse replies.

    Instances are immutable and shared between callers: every method returns new
    objects, never internal state.
    """

    __slots__ = ("record", "name", "version", "content_hash", "inputs", "_system", "_user", "_required",
                 "_declared", "_schema", "_validator", "_response_format_json", "_sampling_json", "_max_tokens",
                 "_markers", "schema_from", "label", "_telemetry")

    def __init__(self, record: VersionRecord, *, markers: _Markers = _DEFAULT_MARKERS,
                 telemetry: Telemetry | None = None, label: str | None = None) -> None:
        content = record.content
        self._markers = markers
        self._telemetry = telemetry
        self.label = label
        """The label this template was served under (``production``, ``canary``, ...);
        None when it was asked for by version. ``observe`` records it."""
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
        self.schema_from: str | None = content.get("schema_from")
        """The input that carries each request's reply schema (None: one schema for all)."""
        # With schema_from the format is built per request, from that request's schema.
        self._response_format_json = json.dumps(openai_response_format(content))
        self._sampling_json = json.dumps(dict(content.get("sampling") or {}))
        self._max_tokens: int | None = content.get("max_tokens")

    def request_schema(self, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
        """The reply's JSON Schema for this request: the template's, or the one its
        ``schema_from`` input carries (a schema, or a function definition's parameters).

        Raises:
            InvalidReplyError: the ``schema_from`` input is missing, not a schema, or not a
                valid JSON Schema (an unknown type name, nested too deeply, ...).
        """
        if self.schema_from is None:
            return copy.deepcopy(self._schema)
        where = f"{self.ref}: input {self.schema_from!r}"
        try:
            schema = request_schema(inputs.get(self.schema_from), where=where)
        except ValueError as e:
            raise InvalidReplyError(str(e)) from None
        _check_schema(schema, where)
        return schema

    @property
    def ref(self) -> str:
        """``name:version``."""
        return f"{self.name}:{self.version}"

    def __repr__(self) -> str:
        served = f" @{self.label}" if self.label else ""
        return f"<Template {self.ref}{served} {self.content_hash[:19]}>"

    def served_as(self, label: str | None) -> "Template":
        """This version as served under ``label`` (what ``observe`` records); shares everything else."""
        other = object.__new__(Template)
        for slot in Template.__slots__:
            object.__setattr__(other, slot, getattr(self, slot))
        other.label = label
        return other

    # ---------------------------------------------------------------- telemetry
    def observe(self, *, ttft_ms: float | None = None, e2e_ms: float | None = None, ok: bool = True,
                score: float | None = None, label: str | None = None) -> None:
        """Record what the service observed for one request served with this template.

        Labelled by template, version and label (default: the label it was served under).
        Never raises and never waits: a failing or full telemetry path drops the
        observation and counts the drop (see ``promptdistill.registry.telemetry``).

        Args:
            ttft_ms: time to first token, in milliseconds (streaming callers).
            e2e_ms: end-to-end latency of the request, in milliseconds.
            ok: False when the reply did not parse against the template's schema.
            score: a quality score the service computed (expected in [0, 1]).
            label: the label to record instead of the one it was served under.
        """
        try:
            telemetry = self._telemetry or default_telemetry()
            telemetry.observe(self.name, self.version, label or self.label or "none", ttft_ms=ttft_ms,
                              e2e_ms=e2e_ms, ok=ok, score=score)
        except Exception:  # noqa: BLE001 - telemetry never fails a request
            logger.debug("telemetry: observation of %s dropped", self.ref, exc_info=True)

    def parse_observed(self, reply: str | bytes | Mapping[str, Any], inputs: Mapping[str, Any] | None = None, *,
                       started_at: float | None = None, ttft_ms: float | None = None,
                       score: float | None = None) -> Any:
        """``parse``, recording the request: its latency since ``started_at`` (a
        ``time.perf_counter()`` reading taken before the request was sent) and whether the
        reply parsed (``ok=False`` when ``parse`` raises InvalidReplyError, which is raised).
        """
        e2e_ms = (time.perf_counter() - started_at) * 1000.0 if started_at is not None else None
        try:
            value = self.parse(reply, inputs)
        except InvalidReplyError:
            self.observe(ttft_ms=ttft_ms, e2e_ms=e2e_ms, ok=False, score=score)
            raise
        self.observe(ttft_ms=ttft_ms, e2e_ms=e2e_ms, ok=True, score=score)
        return value

    # ------------------------------------------------------------------ request
    def render(self, inputs: Mapping[str, Any] | None = None, /, **kwargs: Any) -> list[dict[str, str]]:
        """Chat messages for one request, with the optimizer's own rendering function.

        Special-token strings in values are escaped, or refused, as the ``Templates``
        policy says (``on_special_tokens``; see ``DEFAULT_SPECIAL_TOKENS``).

        Args:
            inputs: input values by name (or pass them as keyword arguments).

        Raises:
            TypeError: an input the template needs is missing, or an unknown one is given.
            SpecialTokenError: a value holds a special-token string and the policy is 'reject'.
        """
        values = {**inputs, **kwargs} if inputs is not None else kwargs
        keys = values.keys()
        if not (self._required <= keys <= self._declared):
            missing = sorted(self._required - keys)
            unknown = sorted(keys - self._declared)
            problem = f"missing input(s) {missing}" if missing else f"unknown input(s) {unknown}"
            raise TypeError(f"{self.ref}: {problem}; the template takes {list(self.inputs)}")
        return self._markers.render(self._system, self._user, values, self.ref)

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

        The template's sampling settings come first, so they can never replace
        ``model``, ``messages``, ``max_tokens`` or ``response_format`` (the registry also
        refuses any sampling key that is not a sampling setting).

        Args:
            inputs: input values by name.
            model: the served model name.
            **overrides: extra or replacement body fields (``stream=True``, ``seed=1``): the caller's.
        """
        body: dict[str, Any] = json.loads(self._sampling_json)
        response_format = json.loads(self._response_format_json)
        if self.schema_from is not None and response_format_kind(self.record.content) == "json_schema":
            # First: a bad per-request schema is the problem to report, not its text.
            response_format = openai_response_format(self.record.content, self.request_schema(inputs))
        body["model"] = model
        body["messages"] = self.render(inputs)
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        if response_format is not None:
            body["response_format"] = response_format
        body.update(overrides)
        return body

    # -------------------------------------------------------------------- reply
    def parse(self, reply: str | bytes | Mapping[str, Any], inputs: Mapping[str, Any] | None = None) -> Any:
        """The reply's JSON, validated against the output schema.

        Args:
            reply: the reply text, or a whole chat-completion response (its first
                choice's message content is used).
            inputs: the request's inputs: needed with ``schema_from`` (the schema is
                that request's).

        Returns:
            The parsed JSON value; the text itself if the template has no output schema.

        Raises:
            InvalidReplyError: not JSON, or not matching the schema (with the path and reason).
        """
        text = _reply_text(reply, self.ref)
        validator = self._validator
        if self.schema_from is not None:
            if inputs is None:
                raise InvalidReplyError(f"{self.ref}: the reply schema comes from input {self.schema_from!r}: "
                                        "pass the request's inputs to parse()")
            schema = self.request_schema(inputs)
            validator = jsonschema.validators.validator_for(schema)(schema)
        if validator is None:
            return text
        try:
            value = json.loads(text)
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        except json.JSONDecodeError as e:
            raise InvalidReplyError(f"{self.ref}: reply is not valid JSON ({e}); reply: {_excerpt(text)}") from None
        except RecursionError:
            raise InvalidReplyError(f"{self.ref}: reply is nested too deeply; reply: {_excerpt(text)}") from None
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise InvalidReplyError(
                f"{self.ref}: reply does not match the output schema at {path}: {error.message}; reply: {_excerpt(text)}"
            )
        return value


class _Flight:
    """One read of the store in progress, shared by every caller waiting for the same key."""

    __slots__ = ("started", "done", "result", "error", "warned")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.warned = False


class Templates:
    """Load templates by label or version from a registry root, with a TTL cache.

    Args:
        root: the registry folder or fsspec URL; None uses the configured registry
            (``[paths] registry`` / ``$PROMPTDISTILL_REGISTRY``).
        ttl_s: how long a label's resolution is trusted before it is checked again; also
            how long after a failed check the store is left alone (counted from when the
            failure was seen).
        timeout_s: the longest a ``get`` waits for the store when it has a last good copy
            to serve instead.
        cold_timeout_s: the longest a ``get`` waits when it has nothing to serve instead.
        storage_options: fsspec options for URL roots (over the bounded defaults of
            ``promptdistill.registry.backend.DEFAULT_S3_OPTIONS``).
        special_tokens: special-token strings to look for in input values.
        on_special_tokens: 'escape' (default: insert a zero-width space so the string is
            plain text to any tokenizer), 'reject' (raise SpecialTokenError) or 'keep'.
        telemetry: where ``Template.observe`` records (a ``Telemetry``: Prometheus metrics,
            a sink in the store); None: the process's default, Prometheus's global
            registry, created at the first observation.
    """

    def __init__(self, root: str | None = None, *, ttl_s: float = 60.0, timeout_s: float = 0.5,
                 cold_timeout_s: float = 10.0, storage_options: Mapping[str, Any] | None = None,
                 special_tokens: Iterable[str] = DEFAULT_SPECIAL_TOKENS, on_special_tokens: str = "escape",
                 telemetry: Telemetry | None = None) -> None:
        if root is None:
            root = load_settings().registry
        for what, value in (("ttl_s", ttl_s), ("timeout_s", timeout_s), ("cold_timeout_s", cold_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
                raise ValueError(f"{what} must be a finite number >= 0, got {value!r}.")
        self.root = root
        self.ttl_s = float(ttl_s)
        self.timeout_s = float(timeout_s)
        self.cold_timeout_s = float(cold_timeout_s)
        # must_exist: an unmounted share is an outage (serve the last good copy), not "not found".
        self.registry = Registry(root, storage_options=storage_options, must_exist=True)
        self._markers = _Markers(special_tokens, on_special_tokens)
        self.telemetry = telemetry
        self._templates: dict[tuple[str, int], Template] = {}
        self._served: dict[tuple[str, int, str], Template] = {}
        # The whole assignment of a label is one tuple (see _Entry), replaced at once, so
        # readers never see half of one.
        self._labels: dict[tuple[str, str], _Entry] = {}
        self._refs: dict[str, tuple[str, str | None, int | None]] = {}
        # Guards _flights only, for a few dict operations: never held during I/O.
        self._flights_lock = threading.Lock()
        self._flights: dict[tuple[str, str, Any], _Flight] = {}

    def __repr__(self) -> str:
        return f"Templates({self.root!r}, ttl_s={self.ttl_s})"

    def get(self, ref: str, *, label: str | None = None, version: int | None = None,
            key: str | bytes | int | None = None) -> Template:
        """A template by ``name@label``, ``name:3``, or a name plus ``label=``/``version=``.

        A bare name means its ``production`` label. While ``production`` has a canary, the
        canary's version is returned for its share of the calls: with ``key`` (a user,
        conversation or request id) for the keys whose hash falls below the share, the
        same version for the same key everywhere, and a key in at 10% stays in at 50%;
        without a key, for a random share of calls. The template's ``label`` says which.

        Raises:
            TemplateNotFoundError: unknown name, label or version (never another version instead).
            IntegrityError: the stored version fails its hash check (and nothing was loaded before).
            StoreUnavailableError: the store cannot be reached, or did not answer within
                ``cold_timeout_s``, and nothing was loaded before.
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
            return template if template is not None else self._get_version(name, version)
        entry = self._labels.get((name, label))
        if entry is None or entry[3] <= time.monotonic():
            entry = self._refresh_label(name, label, entry)
        canary = entry[1]
        if canary is None:
            return entry[0]
        point = random.random() if key is None else canary_point(name, canary.version, key)
        return canary if point < entry[2] else entry[0]

    def clear(self) -> None:
        """Forget every cached label resolution and version."""
        self._templates.clear()
        self._served.clear()
        self._labels.clear()

    # ------------------------------------------------------------------ loading
    def _load(self, name: str, version: int) -> Template:
        template = Template(self.registry.get_version(name, version), markers=self._markers, telemetry=self.telemetry)
        self._templates[(name, version)] = template
        return template

    def _serve(self, name: str, version: int, label: str) -> Template:
        """Version ``version`` as served under ``label`` (loaded once, then shared)."""
        served = self._served.get((name, version, label))
        if served is None:
            template = self._templates.get((name, version)) or self._load(name, version)
            served = self._served[(name, version, label)] = template.served_as(label)
        return served

    def _flight(self, key: tuple[str, str, Any], work: Callable[[], Template]) -> _Flight:
        """The read in progress for ``key``, or a new one started in its own thread."""
        with self._flights_lock:
            flight = self._flights.get(key)
            if flight is not None:
                return flight
            flight = self._flights[key] = _Flight()

        def run() -> None:
            try:
                flight.result = work()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting callers
                flight.error = e
            finally:
                with self._flights_lock:
                    if self._flights.get(key) is flight:
                        del self._flights[key]
                flight.done.set()

        try:
            threading.Thread(target=run, name=f"promptdistill-client-{key[1]}", daemon=True).start()
        except RuntimeError:  # no thread to be had: read in the caller's thread, unbounded
            run()
        return flight

    def _wait(self, flight: _Flight, budget_s: float) -> bool:
        # The budget counts from when the read started: callers who join a read that is
        # already late do not wait again.
        return flight.done.wait(max(0.0, flight.started + budget_s - time.monotonic()))

    def _get_version(self, name: str, version: int) -> Template:
        flight = self._flight(("v", name, version), lambda: self._load(name, version))
        if not self._wait(flight, self.cold_timeout_s):
            raise StoreUnavailableError(
                f"{self.root}: no answer within {self.cold_timeout_s:g} s loading {name}:{version} "
                "(the store is slow or hanging; nothing was loaded before)"
            )
        if flight.error is not None:
            raise _fresh(flight.error)
        assert flight.result is not None
        return flight.result

    def _refresh_label(self, name: str, label: str, entry: _Entry | None) -> _Entry:
        good = entry  # the last good assignment
        flight = self._flight(("l", name, label), lambda: self._resolve(name, label))
        if self._wait(flight, self.timeout_s if good is not None else self.cold_timeout_s):
            if flight.error is None:
                assert flight.result is not None
                return flight.result
            if good is not None and _falls_back(flight.error):
                return good  # the reader logged it and set the back-off
            raise _fresh(flight.error)
        if good is None:
            raise StoreUnavailableError(
                f"{self.root}: no answer within {self.cold_timeout_s:g} s resolving {name}@{label} "
                "(the store is slow or hanging; nothing was loaded before)"
            )
        # Too slow: serve the last good copy now; the read goes on and updates the cache
        # when it ends. Until then, callers get the copy without waiting again.
        self._labels[(name, label)] = good[:3] + (time.monotonic() + self.ttl_s,)
        if not flight.warned:
            flight.warned = True
            logger.warning(
                "registry %s did not answer within %.3g s; serving last good copy %s for %s@%s "
                "while the refresh goes on", self.root, self.timeout_s, _describe(good), name, label,
            )
        return good

    def _resolve(self, name: str, label: str) -> _Entry:
        """Resolve a label (with its canary) and load the versions (in a reader thread);
        update the cache."""
        key = (name, label)
        try:
            split = self.registry.split(name, label)
            template = self._serve(name, split.version, label)
            canary = None
            if split.canary is not None:
                try:
                    canary = self._serve(name, split.canary, CANARY_LABEL)
                except (IntegrityError, TemplateNotFoundError) as e:
                    # A broken canary must not stop production: serve production to everyone.
                    logger.error("registry %s: canary %s:%d of %s@%s cannot be loaded; serving %s to every key: %s",
                                 self.root, name, split.canary, name, label, template.ref, e)
        except Exception as e:
            good = self._labels.get(key)
            if good is None or not _falls_back(e):
                raise
            # Stamped after the failed call: a store slower than ttl_s is still left alone for ttl_s.
            self._labels[key] = good[:3] + (time.monotonic() + self.ttl_s,)
            if isinstance(e, StoreUnavailableError):
                logger.warning("registry %s unreachable; serving last good copy %s for %s@%s (retrying in %.0f s): %s",
                               self.root, _describe(good), name, label, self.ttl_s, e)
            else:
                logger.error("registry %s: %s@%s cannot be resolved; serving last good copy %s "
                             "(retrying in %.0f s): %s: %s", self.root, name, label, _describe(good), self.ttl_s,
                             type(e).__name__, e)
            raise
        entry: _Entry = (template, canary, split.share if canary is not None else 0.0, time.monotonic() + self.ttl_s)
        self._labels[key] = entry
        return entry


_Entry = tuple[Template, "Template | None", float, float]
"""A label's cached assignment: (its template, the canary's or None, the canary's share,
when to check the store again)."""


def _describe(entry: _Entry) -> str:
    """The assignment for messages: ``summarize:3`` or ``summarize:3 + canary summarize:4 at 10%``."""
    if entry[1] is None:
        return entry[0].ref
    return f"{entry[0].ref} + canary {entry[1].ref} at {entry[2]:.0%}"


def _falls_back(error: BaseException) -> bool:
    """Whether a warm label serves its last good copy after ``error``: the store unreachable,
    a corrupt history or version, or anything unexpected (logged as an error). An unknown
    name, label or version from a store that holds a registry stays an error."""
    return isinstance(error, Exception) and not isinstance(error, TemplateNotFoundError)


def _fresh(error: BaseException) -> BaseException:
    """A new exception like ``error``: several callers may raise what one reader caught."""
    if isinstance(error, PromptDistillError):
        try:
            return type(error)(*error.args)
        except TypeError:
            pass
    return error


def _check_schema(schema: dict[str, Any], where: str) -> None:
    """Raise InvalidReplyError unless ``schema`` is a valid JSON Schema (checked against its
    metaschema): an unknown type name or a malformed keyword would otherwise escape from
    validation as jsonschema's own error, or a deep one as RecursionError."""
    try:
        _check_schema_text(json.dumps(schema, sort_keys=True))
    except jsonschema.exceptions.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise InvalidReplyError(f"{where}: not a valid JSON Schema at {path}: {e.message}") from None
    except RecursionError:
        raise InvalidReplyError(f"{where}: the schema is nested too deeply") from None


@functools.lru_cache(maxsize=256)
def _check_schema_text(text: str) -> None:
    """The metaschema check, once per distinct schema: it costs milliseconds, and the
    requests of one service carry the same few function schemas again and again."""
    schema = json.loads(text)
    jsonschema.validators.validator_for(schema).check_schema(schema)


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

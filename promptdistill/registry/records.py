"""What the registry stores: version records, label events, artifact manifests.

Pure value objects with their JSON forms and checks; no I/O. A record read back is
verified before anyone sees it: its ``record_hash`` covers every field (content,
parent, provenance, metrics, ...) and its ``content_hash`` covers the template content,
so a hand-edited file is refused with ``IntegrityError``.

Template content (what ``promptdistill.specs.template_content`` produces)::

    {"name": str, "system": str, "user": str, "inputs": [str, ...],
     "output_schema": dict | None, "response_format": "json_schema" | "none",
     "max_tokens": int | None, "sampling": {"temperature": 0.0, ...}}

Content is checked when it is published and again when it is read back (a record
written by older code, or by hand with recomputed hashes, is refused the same way):
``name`` must be the template's name, no other keys are allowed, and ``sampling`` holds
only the sampling settings in ``SAMPLING_KEYS``: never ``model``, ``messages``,
``stream`` or anything else that would take over a caller's request.

Metrics are free-form JSON; the optimizer's convention is ``quality`` (with
``ci_low``/``ci_high``), ``prompt_tokens_before``/``prompt_tokens_after``,
``ttft_ms_predicted``/``ttft_ms_measured`` and ``valid_json_rate``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import jsonschema

from promptdistill.core.errors import IntegrityError, RegistryError
from promptdistill.core.jsonio import canonical_json
from promptdistill.registry.hashing import content_hash, sha256_hex
from promptdistill.specs.render import TemplateSyntaxError, check_template

__all__ = [
    "ASCII_DIGITS",
    "ArtifactRecord",
    "CANARY_LABEL",
    "CONTENT_KEYS",
    "LabelEvent",
    "SAMPLING_KEYS",
    "SPLIT_LABEL",
    "Split",
    "VersionRecord",
    "canary_point",
    "check_share",
    "check_content",
    "check_label",
    "check_name",
    "check_version",
    "openai_response_format",
    "parse_ref",
    "response_format_kind",
]

TEMPLATE_FORMAT = "promptdistill.template/1"
ARTIFACT_FORMAT = "promptdistill.artifact/1"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_RESPONSE_FORMATS = ("json_schema", "none")
ASCII_DIGITS = re.compile(r"[0-9]{1,12}")
"""A version number (or any whole number a user types): ASCII digits only. str.isdigit()
also accepts "²" and "３", which int() then fails on or silently reads as 3."""
_INPUT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ACTIONS = ("set", "rollback", "unset")

CANARY_LABEL = "canary"
"""The label a canary version is put on, with its traffic share (``LabelEvent.shares``)."""
SPLIT_LABEL = "production"
"""The label whose traffic a canary takes a share of: ``NAME@production`` serves the
canary's version to that share of keys."""

CONTENT_KEYS = ("name", "system", "user", "inputs", "output_schema", "schema_from", "response_format", "max_tokens",
                "sampling")
"""Every key template content may hold."""


def _number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False):
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"must be a finite number, got {v!r}"
        if lo is not None and (v <= lo if lo_open else v < lo):
            return f"must be {'>' if lo_open else '>='} {lo}, got {v!r}"
        if hi is not None and v > hi:
            return f"must be <= {hi}, got {v!r}"
        return None
    return check


def _positive_int(v: Any) -> bool:
    """A whole number from 1 (a version, a sequence number, max_tokens); ``True`` is not 1 here."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _integer(v: Any) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return f"must be an integer, got {v!r}"
    return None


def _stop(v: Any) -> str | None:
    if isinstance(v, str) or (isinstance(v, list) and len(v) <= 16 and all(isinstance(x, str) for x in v)):
        return None
    return f"must be a string or a list of at most 16 strings, got {v!r}"


SAMPLING_KEYS: dict[str, Any] = {
    "temperature": _number(0.0, 10.0),
    "top_p": _number(0.0, 1.0, lo_open=True),
    "top_k": _integer,
    "min_p": _number(0.0, 1.0),
    "seed": _integer,
    "stop": _stop,
    "presence_penalty": _number(-2.0, 2.0),
    "frequency_penalty": _number(-2.0, 2.0),
    "repetition_penalty": _number(0.0, 10.0, lo_open=True),
}
"""Sampling settings a template may carry, with their checks. ``model``, ``messages``,
``response_format``, ``max_tokens``, ``stream`` and the rest are the caller's or the
template's own fields, never sampling."""


def check_name(name: Any, what: str = "template name") -> str:
    """Return ``name`` if it is safe as one path component, else raise RegistryError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise RegistryError(
            f"invalid {what} {name!r}: use 1-128 letters, digits, '_', '-' or '.', starting with a "
            "letter or digit, without path separators or '..'"
        )
    return name


def check_label(label: Any) -> str:
    """Return ``label`` if valid (``production``, ``staging``, ``candidate``, ...)."""
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise RegistryError(
            f"invalid label {label!r}: use 1-64 letters, digits, '_' or '-', starting with a letter"
        )
    return label


def check_version(version: Any) -> int:
    """Return ``version`` if it is a positive int (not a bool), else raise RegistryError."""
    if not _positive_int(version):
        raise RegistryError(f"invalid version {version!r}: versions are integers from 1")
    return version


def parse_ref(ref: Any, *, label: str | None = None, version: int | None = None) -> tuple[str, str | None, int | None]:
    """Split ``name@label`` / ``name:3`` / ``name`` into (name, label, version).

    Exactly one of label and version is set in the result; a bare name with neither
    argument gets ``production``.

    Raises:
        RegistryError: a malformed reference, or a label/version given twice.
    """
    if not isinstance(ref, str):
        raise RegistryError(f"a template reference must be a string like 'name@production' or 'name:3', got {ref!r}")
    name, ref_label, ref_version = ref, None, None
    if "@" in ref:
        name, ref_label = ref.split("@", 1)
        check_label(ref_label)
    elif ":" in ref:
        name, text = ref.split(":", 1)
        if not ASCII_DIGITS.fullmatch(text):
            raise RegistryError(f"invalid reference {ref!r}: the part after ':' must be a version number (ASCII digits)")
        ref_version = int(text)
    check_name(name)
    given = [x for x in (ref_label, ref_version, label, version) if x is not None]
    if len(given) > 1:
        raise RegistryError(f"{ref!r}: give one label or one version, not {given}")
    if label is not None:
        ref_label = check_label(label)
    if version is not None:
        ref_version = check_version(version)
    if ref_version is not None:
        check_version(ref_version)
    elif ref_label is None:
        ref_label = "production"
    return name, ref_label, ref_version


def response_format_kind(content: Mapping[str, Any]) -> str:
    """The content's ``response_format``: as stored, else ``json_schema`` when it has an
    output schema and ``none`` when it has not."""
    return content.get("response_format", "json_schema" if content.get("output_schema") is not None else "none")


def openai_response_format(content: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The OpenAI-compatible ``response_format`` (json_schema, strict) a request for
    ``content`` sends, or None: the one definition the client and the MLflow mirror share.

    Args:
        content: checked template content.
        schema: this request's reply schema, for content with ``schema_from`` (each request
            carries its own; without it there is no fixed format: None). Content without
            ``schema_from`` uses its ``output_schema`` and ignores this.

    Example:
        >>> openai_response_format({"name": "triage v2", "output_schema": {"type": "object"}})
        {'type': 'json_schema', 'json_schema': {'name': 'triage_v2', 'schema': {'type': 'object'}, 'strict': True}}
    """
    if response_format_kind(content) != "json_schema":
        return None
    if content.get("schema_from") is None:
        schema = content.get("output_schema")
    if schema is None:
        return None
    # OpenAI's json_schema.name allows [a-zA-Z0-9_-]{1,64}.
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in content["name"])[:64]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def check_content(content: Any, where: str = "content", *, name: str | None = None) -> None:
    """Raise RegistryError naming the field if ``content`` is not a publishable template.

    Args:
        content: the template content.
        where: prefix of messages (``summarize: content``).
        name: the template's name; ``content["name"]`` must equal it.
    """
    if not isinstance(content, Mapping):
        raise RegistryError(f"{where}: must be a dict, got {type(content).__name__}")
    unknown = sorted(str(k) for k in content if k not in CONTENT_KEYS)
    if unknown:
        raise RegistryError(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(CONTENT_KEYS)})")
    if not isinstance(content.get("name"), str):
        raise RegistryError(f"{where}.name: must be the template's name, got {content.get('name')!r}")
    if name is not None and content["name"] != name:
        raise RegistryError(f"{where}.name: {content['name']!r} is not the template's name {name!r}")
    for key in ("system", "user"):
        if not isinstance(content.get(key), str):
            raise RegistryError(f"{where}.{key}: must be a string, got {type(content.get(key)).__name__}")
    inputs = content.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(n, str) and _INPUT.fullmatch(n) for n in inputs):
        raise RegistryError(f"{where}.inputs: must be a list of input names (identifiers), got {inputs!r}")
    if len(set(inputs)) != len(inputs):
        raise RegistryError(f"{where}.inputs: names must be unique, got {inputs!r}")
    try:
        check_template(content["system"], [], where=f"{where}.system")
        check_template(content["user"], inputs, where=f"{where}.user")
    except TemplateSyntaxError as e:
        raise RegistryError(str(e)) from None
    schema = content.get("output_schema")
    if schema is not None:
        if not isinstance(schema, Mapping):
            raise RegistryError(f"{where}.output_schema: must be a JSON Schema object or None")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise RegistryError(f"{where}.output_schema: not a valid JSON Schema: {e.message}") from None
        except RecursionError:
            raise RegistryError(f"{where}.output_schema: nested too deeply") from None
    fmt = response_format_kind(content)
    if fmt not in _RESPONSE_FORMATS:
        raise RegistryError(f"{where}.response_format: must be one of {_RESPONSE_FORMATS}, got {fmt!r}")
    schema_from = content.get("schema_from")
    if schema_from is not None:
        if schema_from not in inputs:
            raise RegistryError(f"{where}.schema_from: must name one of the inputs {inputs}, got {schema_from!r}")
        if schema is not None:
            raise RegistryError(f"{where}.schema_from: give output_schema or schema_from, not both")
    if fmt == "json_schema" and schema is None and schema_from is None:
        raise RegistryError(f"{where}.response_format: 'json_schema' needs an output_schema or a schema_from input")
    max_tokens = content.get("max_tokens")
    if max_tokens is not None and not _positive_int(max_tokens):
        raise RegistryError(f"{where}.max_tokens: must be a positive integer or None, got {max_tokens!r}")
    sampling = content.get("sampling", {})
    if sampling is None:
        sampling = {}
    if not isinstance(sampling, Mapping):
        raise RegistryError(f"{where}.sampling: must be a dict of sampling settings, got {type(sampling).__name__}")
    for key, value in sampling.items():
        check = SAMPLING_KEYS.get(key)
        if check is None:
            raise RegistryError(
                f"{where}.sampling.{key}: not a sampling setting (allowed: {', '.join(SAMPLING_KEYS)}); "
                "model, messages, max_tokens and response_format are never taken from sampling"
            )
        problem = check(value)
        if problem:
            raise RegistryError(f"{where}.sampling.{key}: {problem}")


def _load(data: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IntegrityError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise IntegrityError(f"{where}: not a record (JSON nested too deeply)") from None
    if not isinstance(value, dict):
        raise IntegrityError(f"{where}: expected a JSON object")
    return value


def _exact_fields(value: dict[str, Any], cls: type, where: str, what: str = "") -> dict[str, Any]:
    """``value`` when it holds exactly the record class's fields, else IntegrityError naming
    the missing or unexpected ones (``what`` ends the message: `` (not a label event)``)."""
    names = set(cls.__dataclass_fields__)
    for problem, keys in (("missing", names - set(value)), ("unexpected", set(value) - names)):
        if keys:
            raise IntegrityError(f"{where}: {problem} field(s) {sorted(keys)}{what}")
    return value


def _check_stored_version(value: Any, where: str) -> None:
    """A stored ``version`` must be a JSON integer: ``2.0`` equals 2 in Python, and would be
    served as ``name:2.0``; ``true`` equals 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise IntegrityError(f"{where}: version: must be an integer, got {value!r}")


def _pretty(value: Mapping[str, Any]) -> bytes:
    return (json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def _record_hash(fields: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json({k: v for k, v in fields.items() if k != "record_hash"}))


@dataclass(frozen=True)
class VersionRecord:
    """One immutable template version, as stored in ``templates/<name>/versions/<N>.json``."""

    name: str
    version: int
    parent: int | None
    created_at: str
    """UTC, ISO 8601 with milliseconds (``2026-11-30T13:04:52.123Z``)."""
    actor: str
    """Who published: ``user@host`` or a run id."""
    content: dict[str, Any]
    provenance: dict[str, Any]
    metrics: dict[str, Any]
    content_hash: str
    """sha256 of the canonical JSON of ``content``."""
    record_hash: str = ""
    """sha256 of the canonical JSON of every other field."""
    format: str = TEMPLATE_FORMAT

    def __post_init__(self) -> None:
        if not self.record_hash:
            object.__setattr__(self, "record_hash", _record_hash(asdict(self)))

    @property
    def ref(self) -> str:
        """``name:version``."""
        return f"{self.name}:{self.version}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_bytes(self) -> bytes:
        return _pretty(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str, name: str, version: int) -> "VersionRecord":
        """Parse and verify a stored record.

        Raises:
            IntegrityError: the file is not JSON, lacks a field, is for another name or
                version, or its hashes do not match (it was edited after publishing).
        """
        try:
            return cls._from_bytes(data, where=where, name=name, version=version)
        except (RecursionError, ValueError) as e:  # hashing a value nested too deeply, a NaN
            raise IntegrityError(f"{where}: not a valid record ({type(e).__name__}: {e})") from None

    @classmethod
    def _from_bytes(cls, data: bytes, *, where: str, name: str, version: int) -> "VersionRecord":
        value = _exact_fields(_load(data, where), cls, where)
        _check_stored_version(value["version"], where)
        if value["name"] != name or value["version"] != version:
            raise IntegrityError(f"{where}: holds {value['name']!r}:{value['version']!r}, expected {name}:{version}")
        types = {"parent": (int, type(None)), "created_at": str, "actor": str, "content": dict, "provenance": dict,
                 "metrics": dict, "content_hash": str, "record_hash": str, "format": str}
        for key, kind in types.items():
            if not isinstance(value[key], kind) or isinstance(value[key], bool):
                raise IntegrityError(f"{where}: {key}: wrong type {type(value[key]).__name__}")
        if content_hash(value["content"]) != value["content_hash"]:
            raise IntegrityError(f"{where}: content does not match content_hash (the file was edited after publishing)")
        if _record_hash(value) != value["record_hash"]:
            raise IntegrityError(f"{where}: fields do not match record_hash (the file was edited after publishing)")
        try:
            check_content(value["content"], f"{where}: content", name=name)
        except RegistryError as e:
            raise IntegrityError(f"{e} (the stored version is not a valid template)") from None
        return cls(**value)


def check_share(share: Any) -> float:
    """Return ``share`` if it is a traffic share in (0, 1], else raise RegistryError."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise RegistryError(f"invalid canary share {share!r}: a fraction of traffic in (0, 1], e.g. 0.1")
    return float(share)


_POINT_SCALE = 2.0 ** -64


def canary_point(name: str, canary_version: int, key: str | bytes | int) -> float:
    """Where ``key`` falls in [0, 1) for the canary ``canary_version`` of ``name``.

    A key is served the canary while its point is below the share, so the assignment is
    the same on every call, process and machine, and widening the share only adds keys
    (a key in at 10% is in at 50%). The canary's version is part of the hash: each new
    canary takes a fresh slice of the keys, not the same users every time.
    """
    if isinstance(key, str):
        data = key.encode("utf-8", "surrogatepass")
    elif isinstance(key, bytes):
        data = key
    elif isinstance(key, int) and not isinstance(key, bool):
        data = str(key).encode()
    else:
        raise TypeError(f"a canary key must be a str, bytes or int (a user, conversation or request id), "
                        f"got {type(key).__name__}")
    digest = hashlib.blake2b(f"{name}\0{canary_version}\0".encode() + data, digest_size=8).digest()
    return int.from_bytes(digest, "big") * _POINT_SCALE


@dataclass(frozen=True)
class Split:
    """How a label's traffic is served: its version, and a canary's version with its share.

    Only ``production`` is split (see ``SPLIT_LABEL``); ``canary`` is None elsewhere and
    while no canary is set.
    """

    version: int
    canary: int | None = None
    share: float = 0.0


@dataclass(frozen=True)
class LabelEvent:
    """One move of one label; events are numbered from 1 and never rewritten."""

    seq: int
    label: str
    from_version: int | None
    to_version: int
    action: str
    """``set`` (promote/publish), ``rollback``, or ``unset`` (the label was removed: a
    canary ended; ``from_version`` and ``to_version`` are the version it had)."""
    actor: str
    at: str
    reason: str
    labels: dict[str, int] = field(default_factory=dict)
    """Every label of the name after this event. One event may move several labels at
    once (a publish with ``labels=[...]``): ``label``/``from_version``/``to_version``
    describe the first; the others are the entries that differ from the previous event's
    map (see ``collection.label_moves``)."""
    shares: dict[str, float] = field(default_factory=dict)
    """The traffic share of each canary label after this event (``{"canary": 0.1}``).
    Stored only when not empty, so an event without a canary reads as it always did."""

    def to_bytes(self) -> bytes:
        value = asdict(self)
        if not value["shares"]:
            del value["shares"]
        return _pretty(value)

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str, seq: int | None = None) -> "LabelEvent":
        """Parse and check a stored event; ``seq`` is the number its file name says.

        Raises:
            IntegrityError: naming the file and the field (a wrong type, an unknown label,
                a number that is not the file's, a map that disagrees with the move).
        """
        value = _load(data, where)
        value.setdefault("shares", {})
        value = _exact_fields(value, cls, where, " (not a label event)")

        def bad(key: str, reason: str) -> IntegrityError:
            return IntegrityError(f"{where}: {key}: {reason}")

        if not _positive_int(value["seq"]):
            raise bad("seq", f"must be a positive integer, got {value['seq']!r}")
        if seq is not None and value["seq"] != seq:
            raise bad("seq", f"is {value['seq']}, but the file is event {seq}")
        if not isinstance(value["label"], str) or not _LABEL.fullmatch(value["label"]):
            raise bad("label", f"not a valid label: {value['label']!r}")
        if value["from_version"] is not None and not _positive_int(value["from_version"]):
            raise bad("from_version", f"must be a positive integer or null, got {value['from_version']!r}")
        if not _positive_int(value["to_version"]):
            raise bad("to_version", f"must be a positive integer, got {value['to_version']!r}")
        if value["action"] not in _ACTIONS:
            raise bad("action", f"must be one of {_ACTIONS}, got {value['action']!r}")
        for key in ("actor", "at", "reason"):
            if not isinstance(value[key], str):
                raise bad(key, f"must be a string, got {value[key]!r}")
        labels = value["labels"]
        if not isinstance(labels, dict):
            raise bad("labels", f"must be an object of label -> version, got {labels!r}")
        for k, v in labels.items():
            if not _LABEL.fullmatch(k) or not _positive_int(v):
                raise bad(f"labels.{k}", f"must map a valid label to a positive integer, got {v!r}")
        if value["action"] == "unset":
            if value["label"] in labels:
                raise bad("labels", f"still holds {value['label']}, but the event removes it")
        elif labels.get(value["label"]) != value["to_version"]:
            raise bad("labels", f"says {value['label']}={labels.get(value['label'])!r}, but the event moves it to "
                                f"{value['to_version']}")
        shares = value["shares"]
        if not isinstance(shares, dict):
            raise bad("shares", f"must be an object of label -> share, got {shares!r}")
        for k, v in shares.items():
            if k not in labels or isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise bad(f"shares.{k}", f"must give a set label a share in (0, 1], got {v!r}")
        value["shares"] = {k: float(v) for k, v in shares.items()}
        return cls(**value)


@dataclass(frozen=True)
class ArtifactRecord:
    """A manifest of one artifact version (a fitted TTFT model, for instance).

    The files themselves are content-addressed blobs, so the manifest is the one object
    whose creation publishes the version.
    """

    kind: str
    name: str
    version: int
    created_at: str
    actor: str
    files: dict[str, dict[str, Any]]
    """file name -> ``{"sha256": "sha256:...", "size": bytes}``."""
    metadata: dict[str, Any]
    record_hash: str = ""
    format: str = ARTIFACT_FORMAT

    def __post_init__(self) -> None:
        if not self.record_hash:
            object.__setattr__(self, "record_hash", _record_hash(asdict(self)))

    def to_bytes(self) -> bytes:
        return _pretty(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str, kind: str, name: str, version: int) -> "ArtifactRecord":
        value = _load(data, where)
        _check_stored_version(value.get("version"), where)
        try:
            record = cls(**{**value, "record_hash": value.get("record_hash") or "-"})
        except TypeError as e:
            raise IntegrityError(f"{where}: not an artifact manifest ({e})") from None
        if (record.kind, record.name, record.version) != (kind, name, version):
            raise IntegrityError(f"{where}: holds {record.kind}/{record.name}:{record.version}")
        if _record_hash(value) != value.get("record_hash"):
            raise IntegrityError(f"{where}: fields do not match record_hash (the file was edited after publishing)")
        return record

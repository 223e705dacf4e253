"""Mirror published templates into MLflow's Prompt Registry (``prompts:/NAME@production``).

Our registry stays the registry of record; MLflow gets a copy that services already
using MLflow can load with ``mlflow.genai.load_prompt``. What maps to what:

* each published version ``NAME:N`` -> one MLflow prompt version ``NAME`` / ``M`` (MLflow
  numbers its own versions), a chat prompt whose messages are ours with ``{input}``
  written as MLflow's ``{{ input }}`` and our ``{{``/``}}`` escapes as plain braces;
* ``max_tokens``, the sampling settings and the OpenAI ``response_format`` the client
  sends -> the version's ``model_config``; the output JSON Schema -> its ``response_format``;
* ``N``, the content hash, the record hash, parent, actor, time, provenance and metrics ->
  version tags ``promptdistill.*`` (``promptdistill.version`` records N -> M);
* labels -> aliases, moved to the MLflow version of the labelled version; an alias this
  sync set earlier whose label is gone is deleted. Aliases set by hand in MLflow under
  other names are left alone (the prompt tag ``promptdistill.aliases`` lists ours).

Idempotent and restartable: a version is found again by its ``promptdistill.version`` and
``promptdistill.content_hash`` tags (tags are written in the same request that creates
the version, so a version never exists without them), so a second run registers
nothing. Aliases move only after every version of the template exists, so an
interrupted run leaves aliases where they were, and the next run completes it.

A version MLflow cannot render the way we do (its literal text holds ``{{ name }}`` or
Jinja's ``{% %}``, which MLflow would read as template syntax) is skipped and reported,
and the MLflow aliases of labels pointing at it are removed rather than left on another
version. MLflow is imported inside the functions: the registry package stays light.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from promptdistill.core.errors import ConfigError, RegistryError, TemplateNotFoundError
from promptdistill.core.jsonio import canonical_json
from promptdistill.registry.backend import StoreUnavailableError
from promptdistill.registry.records import ASCII_DIGITS, VersionRecord, openai_response_format
from promptdistill.registry.store import Registry
from promptdistill.specs.render import render_messages, render_text

__all__ = [
    "TAG_ALIASES",
    "TAG_CONTENT_HASH",
    "TAG_VERSION",
    "SyncItem",
    "SyncReport",
    "mlflow_template",
    "model_config",
    "sync_to_mlflow",
]

logger = logging.getLogger("promptdistill.registry.mlflow")

TAG_VERSION = "promptdistill.version"
TAG_CONTENT_HASH = "promptdistill.content_hash"
TAG_ALIASES = "promptdistill.aliases"
"""Prompt-level tag: the aliases this sync manages (JSON list), so it deletes only its own."""

# MLflow copies version tags onto the prompt too, where a SQL backend keeps 5000 characters.
_TAG_CHARS = 4000
# Bounded HTTP waits unless the user set MLflow's own variables (MLflow's defaults retry
# 7 times with growing back-off and wait 120 s per request: minutes for a dead server).
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
_RESERVED_ALIAS = re.compile(r"latest|[vV][0-9]+", re.IGNORECASE)
# MLflow's own sampling names; the rest go to model_config as extra parameters, unchanged.
_SAMPLING_RENAMES = {"stop": "stop_sequences"}


@dataclass(frozen=True)
class SyncItem:
    """One thing the sync looked at: a version (``v3``) or an alias (``@production``)."""

    name: str
    item: str
    action: str
    """``registered``, ``unchanged``, ``set``, ``moved``, ``deleted`` or ``skipped``."""
    detail: str = ""


@dataclass
class SyncReport:
    """What a sync did; ``versions`` maps each template's version N to its MLflow version M."""

    tracking_uri: str
    items: list[SyncItem] = field(default_factory=list)
    versions: dict[str, dict[int, int]] = field(default_factory=dict)

    def count(self, action: str) -> int:
        return sum(1 for i in self.items if i.action == action)

    @property
    def changed(self) -> bool:
        """Whether anything was registered, moved or deleted."""
        return any(i.action not in ("unchanged", "skipped") for i in self.items)

    @property
    def skipped(self) -> list[SyncItem]:
        return [i for i in self.items if i.action == "skipped"]


# ---------------------------------------------------------------------- mapping
def mlflow_template(content: Mapping[str, Any]) -> list[dict[str, str]]:
    """Our chat template as MLflow chat messages: ``{text}`` -> ``{{ text }}``, ``{{`` -> ``{``.

    ``render_text`` itself does the conversion (it unescapes and fills in one pass), so the
    result is what our renderer produces with each input replaced by MLflow's placeholder.
    """
    marks = {name: "{{ " + name + " }}" for name in content["inputs"]}
    messages = []
    if content["system"]:
        messages.append({"role": "system", "content": render_text(content["system"], {})})
    messages.append({"role": "user", "content": render_text(content["user"], marks)})
    return messages


def model_config(content: Mapping[str, Any]) -> dict[str, Any]:
    """``max_tokens``, sampling and the client's ``response_format``, in MLflow's model config."""
    config: dict[str, Any] = {}
    for key, value in (content.get("sampling") or {}).items():
        if key == "top_k" and value <= 0:
            continue  # vLLM's "no top-k limit"; MLflow wants top_k > 0, and absent means the same
        if key == "stop" and isinstance(value, str):
            value = [value]
        config[_SAMPLING_RENAMES.get(key, key)] = value
    if content.get("max_tokens") is not None:
        config["max_tokens"] = content["max_tokens"]
    response_format = openai_response_format(content)  # what the client sends
    if response_format is not None:
        config["response_format"] = response_format
    elif content.get("schema_from") is not None:
        config["schema_from"] = content["schema_from"]  # the reply schema comes with each request
    return config


def _unrepresentable(content: Mapping[str, Any], template: list[dict[str, str]]) -> str | None:
    """Why MLflow would render this template differently from us, or None.

    Renders both ways with marker values that cannot occur in the text: literal text that
    MLflow reads as syntax (``{{ x }}``, ``{% %}``) shows up as a difference or an error.
    """
    from mlflow.entities.model_registry import PromptVersion

    values = {name: f"\ue000{name}\ue001" for name in content["inputs"]}
    ours = render_messages(content["system"], content["user"], values)
    try:
        theirs = PromptVersion(name="check", version=1, template=template).format(**values)
    except Exception as e:  # noqa: BLE001 - any failure means MLflow cannot take it as is
        return f"MLflow cannot format it ({type(e).__name__}: {e})"
    if theirs != ours:
        return ("its literal text holds '{{ name }}' or '{% %}', which MLflow reads as template syntax "
                "(MLflow has no escape for them)")
    return None


def _json_tag(value: Mapping[str, Any]) -> str:
    """Canonical JSON within the tag limit: the largest top-level entries are dropped and
    named under ``_omitted`` (the full record stays in our registry)."""
    value = dict(value)
    omitted: list[str] = []
    text = canonical_json(value)
    while len(text) > _TAG_CHARS and value:
        biggest = max(value, key=lambda k: len(canonical_json(value[k])))
        omitted.append(biggest)
        del value[biggest]
        text = canonical_json({**value, "_omitted": sorted(omitted)})
    return text


def _tags(record: VersionRecord, root: str) -> dict[str, str]:
    tags = {
        TAG_VERSION: str(record.version),
        TAG_CONTENT_HASH: record.content_hash,
        "promptdistill.record_hash": record.record_hash,
        "promptdistill.ref": record.ref,
        "promptdistill.created_at": record.created_at,
        "promptdistill.actor": record.actor[:_TAG_CHARS],
        "promptdistill.registry": root[:_TAG_CHARS],
        "promptdistill.provenance": _json_tag(record.provenance),
        "promptdistill.metrics": _json_tag(record.metrics),
    }
    if record.parent is not None:
        tags["promptdistill.parent"] = str(record.parent)
    return tags


# ---------------------------------------------------------------------- MLflow calls
@contextlib.contextmanager
def _http_bounds(timeout_s: int | None, retries: int | None) -> Iterator[None]:
    """MLflow reads its HTTP limits from the environment at each request: set them for the sync."""
    wanted = {k: v for k, v in _HTTP_DEFAULTS.items() if k not in os.environ}
    if timeout_s is not None:
        wanted["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(timeout_s))
    if retries is not None:
        wanted["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(int(retries))
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    # MLflow logs each creation at INFO ("Waiting up to 300 seconds ..."): not news here.
    quiet = logging.getLogger("mlflow")
    level = quiet.level
    quiet.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        quiet.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Mlflow:
    """The few MLflow calls the sync makes, each turning MLflow's errors into ours."""

    def __init__(self, client: Any, uri: str) -> None:
        from mlflow.exceptions import MlflowException

        self.client = client
        self.uri = uri
        self._exc = MlflowException

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._exc as e:
            raise self._error(what, e) from None
        except OSError as e:  # a local backend (sqlite:///, a folder) that cannot be opened
            raise StoreUnavailableError(f"MLflow at {self.uri}: {what}: {e}") from None

    def _error(self, what: str, e: Any) -> RegistryError:
        message = getattr(e, "message", str(e))
        # MLflow's REST client reports a connection that failed after its retries this way.
        if "API request to" in message and "failed with exception" in message:
            return StoreUnavailableError(f"MLflow at {self.uri} unreachable while {what}: {message}")
        return RegistryError(f"MLflow at {self.uri} refused {what}: {message}")

    @staticmethod
    def _missing(e: Any) -> bool:
        code = getattr(e, "error_code", "")
        return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE"
                                                     and "not found" in str(e).lower())

    def versions(self, name: str) -> list[Any]:
        """Every MLflow version of prompt ``name`` (none if the prompt does not exist)."""
        out, token = [], None
        while True:
            try:
                page = self.client.search_prompt_versions(name, max_results=1000, page_token=token)
            except self._exc as e:
                if self._missing(e):
                    return []
                raise self._error(f"listing the versions of {name!r}", e) from None
            out.extend(page)
            token = getattr(page, "token", None)
            if not token:
                return out

    def alias(self, name: str, alias: str) -> int | None:
        """The MLflow version ``name@alias`` points at, or None."""
        try:
            return int(self.client.get_prompt_version_by_alias(name, alias).version)
        except self._exc as e:
            if self._missing(e):
                return None
            raise self._error(f"reading alias {name}@{alias}", e) from None

    def managed_aliases(self, name: str) -> set[str]:
        prompt = self.call(f"reading prompt {name!r}", self.client.get_prompt, name)
        if prompt is None:
            return set()
        try:
            found = json.loads((prompt.tags or {}).get(TAG_ALIASES, "[]"))
        except json.JSONDecodeError:
            found = []
        return {a for a in found if isinstance(a, str)} if isinstance(found, list) else set()


# ---------------------------------------------------------------------- the sync
def sync_to_mlflow(registry: Registry, names: Iterable[str] | None = None, *, tracking_uri: str,
                   registry_uri: str | None = None, http_timeout_s: int | None = None,
                   http_retries: int | None = None, client: Any = None) -> SyncReport:
    """Register every published version of each template in MLflow and move its aliases to
    match our labels. Safe to re-run at any time; see the module docstring.

    Args:
        registry: our registry (the registry of record).
        names: templates to sync (default: every template).
        tracking_uri: MLflow's tracking URI (``http://host:5000``, ``sqlite:///mlflow.db``, ...).
        registry_uri: MLflow's registry URI, if not the tracking URI.
        http_timeout_s, http_retries: MLflow's per-request timeout and retries; default
            ``$MLFLOW_HTTP_REQUEST_TIMEOUT``/``_MAX_RETRIES`` if set, else 30 s and 3.
        client: an ``MlflowClient`` to use instead of a new one.

    Raises:
        TemplateNotFoundError: a name that has no published version (before MLflow is called).
        ConfigError: MLflow does not take ``tracking_uri`` (an unknown scheme, ...).
        StoreUnavailableError: our store or MLflow could not be reached.
        RegistryError: MLflow is not installed, refused a call, or holds a version tagged with
            one of our version numbers but another content hash (synced from another registry).
    """
    known = registry.names()
    wanted = list(dict.fromkeys(names)) if names is not None else known
    unknown = [n for n in wanted if not registry.versions(n)]
    if unknown:
        raise TemplateNotFoundError(
            f"{registry.root}: no published template {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(known) or 'none'})")
    try:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException
    except ImportError as e:
        raise RegistryError(f"syncing to MLflow needs the mlflow package ({e}): "
                            "pip install 'promptdistill[mlflow]'") from None
    report = SyncReport(tracking_uri=tracking_uri)
    with _http_bounds(http_timeout_s, http_retries):
        if client is None:
            try:
                client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri or tracking_uri)
            except MlflowException as e:  # an unsupported scheme, a retired backend: the URI is wrong
                raise ConfigError(f"MLflow tracking URI {tracking_uri!r}: {e.message}") from None
        ml = _Mlflow(client, tracking_uri)
        for name in wanted:
            _sync_one(registry, name, ml, report)
    return report


def _sync_one(registry: Registry, name: str, ml: _Mlflow, report: SyncReport) -> None:
    records = [registry.get_version(name, v) for v in registry.versions(name)]
    labels = registry.labels(name)

    # Which of our versions MLflow already holds: found by our tags, never by position.
    mapped: dict[int, int] = {}
    for pv in sorted(ml.versions(name), key=lambda p: int(p.version)):
        tags = pv.tags or {}
        ours = tags.get(TAG_VERSION)
        if ours is None or not ASCII_DIGITS.fullmatch(ours):
            continue  # a version someone registered in MLflow by hand
        record = next((r for r in records if r.version == int(ours)), None)
        if record is None or tags.get(TAG_CONTENT_HASH) != record.content_hash:
            raise RegistryError(
                f"MLflow at {ml.uri}: prompt {name!r} version {pv.version} is tagged as our {name}:{ours} "
                f"({tags.get(TAG_CONTENT_HASH)}), but {registry.root} "
                + (f"has {record.content_hash}" if record else "has no such version")
                + ": it was synced from another registry; nothing was changed for this template")
        if int(ours) in mapped:  # two syncs raced: the first copy is the one aliases use
            logger.warning("MLflow at %s: prompt %r versions %s and %s both hold %s:%s; using %s", ml.uri, name,
                           mapped[int(ours)], pv.version, name, ours, mapped[int(ours)])
            continue
        mapped[int(ours)] = int(pv.version)

    # 1. Versions, oldest first, each created with its tags in one request.
    unsynced: dict[int, str] = {}
    for record in records:
        item = f"v{record.version}"
        if record.version in mapped:
            report.items.append(SyncItem(name, item, "unchanged", f"MLflow version {mapped[record.version]}"))
            continue
        template = mlflow_template(record.content)
        why = _unrepresentable(record.content, template)
        if why:
            unsynced[record.version] = why
            report.items.append(SyncItem(name, item, "skipped", why))
            continue
        schema = record.content.get("output_schema")
        pv = ml.call(f"registering {record.ref}", ml.client.register_prompt, name=name, template=template,
                     commit_message=f"promptdistill {record.ref} published {record.created_at} by {record.actor}",
                     tags=_tags(record, registry.root), response_format=schema,
                     model_config=model_config(record.content) or None)
        mapped[record.version] = int(pv.version)
        report.items.append(SyncItem(name, item, "registered", f"MLflow version {pv.version}"))
    report.versions[name] = dict(sorted(mapped.items()))

    # 2. Aliases, now that every version they may point at exists. The managed list is
    # widened before any move, so an interrupted run still knows which aliases are ours.
    before = ml.managed_aliases(name)
    settable = {}
    for label, version in sorted(labels.items()):
        if _RESERVED_ALIAS.fullmatch(label):
            report.items.append(SyncItem(name, f"@{label}", "skipped", "a name MLflow reserves for aliases"))
        elif version in unsynced:
            report.items.append(SyncItem(name, f"@{label}", "skipped", f"points at v{version}, not synced"))
        else:
            settable[label] = version
    managed = sorted(before | set(settable))
    if managed != sorted(before):
        ml.call(f"tagging prompt {name!r}", ml.client.set_prompt_tag, name, TAG_ALIASES, json.dumps(managed))
    for label in managed:
        current = ml.alias(name, label)
        if label in settable:
            target = mapped[settable[label]]
            if current == target:
                report.items.append(SyncItem(name, f"@{label}", "unchanged", f"v{settable[label]} = MLflow {target}"))
                continue
            ml.call(f"setting alias {name}@{label}", ml.client.set_prompt_alias, name, label, target)
            report.items.append(SyncItem(name, f"@{label}", "set" if current is None else "moved",
                                         f"{'-' if current is None else current} -> MLflow {target} "
                                         f"(v{settable[label]})"))
        elif current is not None:  # our label is gone, or points at a version MLflow cannot hold
            ml.call(f"deleting alias {name}@{label}", ml.client.delete_prompt_alias, name, label)
            report.items.append(SyncItem(name, f"@{label}", "deleted", f"was MLflow {current}"))
    if managed != sorted(settable):
        ml.call(f"tagging prompt {name!r}", ml.client.set_prompt_tag, name, TAG_ALIASES,
                json.dumps(sorted(settable)))

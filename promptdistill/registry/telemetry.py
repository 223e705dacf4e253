"""Per-version telemetry from the services that use the client: Prometheus, and a sink in the store.

A service records each request it served with ``Template.observe(...)`` (or
``Template.parse_observed(...)``, which times and parses the reply). Each observation is
labelled by template, version and label (``production``, ``canary``, ...) and goes to:

* Prometheus metrics (``prometheus_client``, the ``telemetry`` extra), in a
  ``CollectorRegistry`` the service exposes with ``metrics_app()`` (WSGI) or
  ``start_metrics_server(port)``; any Prometheus scrapes it::

      promptdistill_template_requests_total{template, version, label}      counter
      promptdistill_template_failures_total{template, version, label}      counter (reply did not parse)
      promptdistill_template_ttft_seconds{template, version, label}        histogram, 10 ms - 30 s
      promptdistill_template_latency_seconds{template, version, label}     histogram, 10 ms - 30 s
      promptdistill_template_score{template, version, label}               histogram, 0 - 1
      promptdistill_telemetry_dropped_total{reason}                        counter

* optionally, an append-only sink in the registry's store, for teams without Prometheus:
  JSON lines, one object per observation, written in batches by a background thread as
  new objects ``telemetry/<name>/<version>/<stamp>-<pid>-<random>.jsonl`` (create-only,
  like everything the registry writes; ``<stamp>`` is the UTC write time,
  ``20261130T130452.123Z``). ``read_observations`` reads them back (what a rollout flow
  reads when it has no Prometheus).

Nothing here may slow or fail a request: ``observe`` takes no lock shared with I/O and
never raises. The sink's queue is bounded; when it is full, or the store is down or
hanging, observations are dropped and counted (``Telemetry.dropped``, and the
``promptdistill_telemetry_dropped_total`` counter). Observations still queued when the
process is killed are lost; at a normal exit the queue is flushed for at most
``close_timeout_s``.

``prometheus_client`` is imported only when Prometheus export is first used, so the
light client starts without it.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import queue
import threading
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping

from promptdistill.core.errors import ConfigError, RegistryError
from promptdistill.registry.backend import Backend, open_backend
from promptdistill.registry.records import check_name, check_version

__all__ = ["LATENCY_BUCKETS_S", "SCORE_BUCKETS", "Telemetry", "default_telemetry", "metrics_app",
           "read_observations", "start_metrics_server"]

logger = logging.getLogger("promptdistill.telemetry")

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 1.5, 2.5, 4.0, 6.0, 10.0, 15.0,
                     20.0, 30.0)
"""Histogram buckets for TTFT and end-to-end latency, in seconds (10 ms to 30 s)."""
SCORE_BUCKETS = tuple(round(0.05 * i, 2) for i in range(1, 21))
"""Histogram buckets for scores, which are expected in [0, 1]."""
LABEL_NAMES = ("template", "version", "label")
EXTRA = "telemetry"
_INSTALL = f"pip install 'promptdistill[{EXTRA}]'"
SINK_PREFIX = "telemetry"


def _prometheus():
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(f"Prometheus telemetry needs prometheus_client, which is not installed: "
                          f"{_INSTALL} (the '{EXTRA}' extra)") from None
    return prometheus_client


class _Exporter:
    """The metric families in one Prometheus ``CollectorRegistry`` (one per registry: a
    family registered twice is an error there), and a cache of their labelled children
    (``.labels()`` costs microseconds; a dict lookup does not)."""

    def __init__(self, registry: Any) -> None:
        prom = _prometheus()
        self.registry = registry
        kw = {"labelnames": LABEL_NAMES, "registry": registry}
        self.requests = prom.Counter("promptdistill_template_requests", "Requests served with a template version", **kw)
        self.failures = prom.Counter("promptdistill_template_failures",
                                     "Replies that did not parse against the template's schema", **kw)
        self.ttft = prom.Histogram("promptdistill_template_ttft_seconds", "Time to first token",
                                   buckets=LATENCY_BUCKETS_S, **kw)
        self.latency = prom.Histogram("promptdistill_template_latency_seconds", "End-to-end request latency",
                                      buckets=LATENCY_BUCKETS_S, **kw)
        self.score = prom.Histogram("promptdistill_template_score", "Quality score the service computed",
                                    buckets=SCORE_BUCKETS, **kw)
        self.dropped = prom.Counter("promptdistill_telemetry_dropped", "Observations dropped by the telemetry path",
                                    labelnames=("reason",), registry=registry)
        self._children: dict[tuple[str, int, str], tuple[Any, ...]] = {}
        self._lock = threading.Lock()

    def children(self, name: str, version: int, label: str) -> tuple[Any, ...]:
        key = (name, version, label)
        found = self._children.get(key)
        if found is None:
            with self._lock:
                values = (name, str(version), label)
                found = self._children[key] = tuple(m.labels(*values) for m in
                                                    (self.requests, self.failures, self.ttft, self.latency, self.score))
        return found


_EXPORTERS: dict[int, _Exporter] = {}
_EXPORTERS_LOCK = threading.Lock()


def _exporter(registry: Any | None) -> _Exporter:
    prom = _prometheus()
    registry = prom.REGISTRY if registry is None else registry
    with _EXPORTERS_LOCK:
        found = _EXPORTERS.get(id(registry))
        if found is None or found.registry is not registry:
            found = _EXPORTERS[id(registry)] = _Exporter(registry)
        return found


def _stamp(at: float) -> str:
    """``20261130T130452.123Z``: sorts as time does, and is a valid registry name part."""
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y%m%dT%H%M%S.%f")[:-3] + "Z"


class _Sink:
    """The store sink: a bounded queue drained by one background thread into batch objects."""

    def __init__(self, backend: Backend, *, max_queue: int, batch_size: int, flush_s: float,
                 count_drop: Any) -> None:
        self.backend = backend
        self.batch_size = batch_size
        self.flush_s = flush_s
        self._count_drop = count_drop
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="promptdistill-telemetry-sink", daemon=True)
        self._thread.start()
        self._last_warning = 0.0

    def put(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._count_drop("queue_full")

    def _run(self) -> None:
        while True:
            batch = []
            try:
                batch.append(self._queue.get(timeout=0.2 if self._stop else self.flush_s))
            except queue.Empty:
                if self._stop:
                    return
                continue
            deadline = time.monotonic() + (0.0 if self._stop else self.flush_s)
            while len(batch) < self.batch_size:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            try:
                self._write(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _write(self, batch: list[dict[str, Any]]) -> None:
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for record in batch:
            groups.setdefault((record["template"], record["version"]), []).append(record)
        stamp = _stamp(time.time())
        for (name, version), records in groups.items():
            key = f"{SINK_PREFIX}/{name}/{version}/{stamp}-{os.getpid()}-{uuid.uuid4().hex[:12]}.jsonl"
            data = "".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records).encode()
            try:
                self.backend.create(key, data)
            except Exception as e:  # noqa: BLE001 - the store down, refused, hanging then failing
                for _ in records:
                    self._count_drop("sink_error")
                now = time.monotonic()
                if now - self._last_warning > 60:
                    self._last_warning = now
                    logger.warning("telemetry sink %s: %d observation(s) dropped: %s: %s",
                                   self.backend.url(key), len(records), type(e).__name__, e)

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued is written (or dropped); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout_s: float) -> None:
        self._stop = True  # the thread writes what is queued at once, then ends
        self.flush(timeout_s)


def _number(value: Any, low: float) -> bool:
    """None, or a finite number from ``low``."""
    return value is None or (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
                             and value >= low)


class Telemetry:
    """Where a service's observations go: Prometheus metrics, a sink in the store, or both.

    Args:
        prometheus: export Prometheus metrics (needs the ``telemetry`` extra).
        registry: the ``prometheus_client.CollectorRegistry`` to register in (default:
            the global one that ``start_http_server`` and ``metrics_app()`` expose).
        sink: a registry root (folder or fsspec URL) to append observations to, or None.
        storage_options: fsspec options for a URL sink.
        max_queue: observations the sink may hold before it drops new ones.
        batch_size: observations per written object at most.
        flush_s: the longest an observation waits in the queue before it is written.
        close_timeout_s: how long the exit flush may take.

    Raises:
        ConfigError: Prometheus export asked for without ``prometheus_client`` installed
            (naming the extra), or a bad sink root.
    """

    def __init__(self, *, prometheus: bool = True, registry: Any | None = None, sink: str | os.PathLike[str] | None = None,
                 storage_options: Mapping[str, Any] | None = None, max_queue: int = 10_000, batch_size: int = 1000,
                 flush_s: float = 5.0, close_timeout_s: float = 2.0) -> None:
        self._exporter = _exporter(registry) if prometheus else None
        self._drops: dict[str, int] = {}
        self._drops_lock = threading.Lock()
        self.close_timeout_s = close_timeout_s
        self._sink: _Sink | None = None
        if sink is not None:
            try:
                backend = open_backend(sink, storage_options)
            except RegistryError as e:
                raise ConfigError(f"telemetry sink: {e}") from None
            self._sink = _Sink(backend, max_queue=max_queue, batch_size=batch_size, flush_s=flush_s,
                               count_drop=self._count_drop)
            atexit.register(self.close)

    @property
    def dropped(self) -> dict[str, int]:
        """Observations dropped so far, by reason (``queue_full``, ``sink_error``, ``invalid``, ``error``)."""
        with self._drops_lock:
            return dict(self._drops)

    def _count_drop(self, reason: str) -> None:
        with self._drops_lock:
            self._drops[reason] = self._drops.get(reason, 0) + 1
        if self._exporter is not None:
            try:
                self._exporter.dropped.labels(reason).inc()
            except Exception:  # noqa: BLE001
                pass

    def observe(self, name: str, version: int, label: str, *, ttft_ms: float | None = None,
                e2e_ms: float | None = None, ok: bool = True, score: float | None = None) -> None:
        """Record one request (see ``Template.observe``). Never raises, never waits."""
        try:
            if not (_number(ttft_ms, 0.0) and _number(e2e_ms, 0.0) and _number(score, -math.inf)):
                self._count_drop("invalid")
                return
            exporter = self._exporter
            if exporter is not None:
                requests, failures, ttft, latency, scores = exporter.children(name, version, label)
                requests.inc()
                if not ok:
                    failures.inc()
                if ttft_ms is not None:
                    ttft.observe(ttft_ms / 1000.0)
                if e2e_ms is not None:
                    latency.observe(e2e_ms / 1000.0)
                if score is not None:
                    scores.observe(score)
            if self._sink is not None:
                self._sink.put({"ts": time.time(), "template": name, "version": version, "label": label,
                                "ok": bool(ok), "ttft_ms": ttft_ms, "e2e_ms": e2e_ms, "score": score})
        except Exception:  # noqa: BLE001 - telemetry never fails a request
            self._count_drop("error")

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the sink has written what is queued; False on timeout (True without a sink)."""
        return self._sink.flush(timeout_s) if self._sink is not None else True

    def close(self) -> None:
        """Flush the sink for at most ``close_timeout_s`` and stop its thread (also at exit)."""
        if self._sink is not None:
            self._sink.close(self.close_timeout_s)


_DEFAULT: Telemetry | None = None
_DEFAULT_LOCK = threading.Lock()


class _Disabled(Telemetry):
    """The default when prometheus_client is missing: counts each observation as dropped."""

    def __init__(self) -> None:
        super().__init__(prometheus=False)

    def observe(self, name: str, version: int, label: str, **_: Any) -> None:
        self._count_drop("no_prometheus_client")


def default_telemetry() -> Telemetry:
    """The process's telemetry for clients built without one: Prometheus's global registry.

    Made at the first observation. Without prometheus_client installed, observations are
    dropped, and an error naming the extra is logged once.
    """
    global _DEFAULT
    if _DEFAULT is None:
        with _DEFAULT_LOCK:
            if _DEFAULT is None:
                try:
                    _DEFAULT = Telemetry()
                except ConfigError as e:
                    logger.error("Template.observe: %s; observations are dropped", e)
                    _DEFAULT = _Disabled()
    return _DEFAULT


def metrics_app(registry: Any | None = None):
    """A WSGI app serving the metrics in Prometheus's text format (mount it at ``/metrics``).

    Raises:
        ConfigError: prometheus_client is not installed (naming the extra).
    """
    prom = _prometheus()
    return prom.make_wsgi_app(prom.REGISTRY if registry is None else registry)


def start_metrics_server(port: int, addr: str = "0.0.0.0", registry: Any | None = None):
    """Serve the metrics over HTTP on ``addr:port`` from a background thread
    (``prometheus_client.start_http_server``); returns its (server, thread).

    Raises:
        ConfigError: prometheus_client is not installed (naming the extra).
    """
    prom = _prometheus()
    return prom.start_http_server(port, addr=addr, registry=prom.REGISTRY if registry is None else registry)


def read_observations(root: str | os.PathLike[str], name: str, *, version: int | None = None,
                      since: float | None = None, storage_options: Mapping[str, Any] | None = None
                      ) -> Iterator[dict[str, Any]]:
    """The observations the sink stored for ``name`` (one version, or all), oldest batch
    first; with ``since`` (a Unix time), only those recorded from then on.

    Each is ``{"ts", "template", "version", "label", "ok", "ttft_ms", "e2e_ms", "score"}``.
    A line that is not such an object (a batch cut short by hand) is skipped with a warning.
    """
    backend = open_backend(root, storage_options)
    check_name(name)
    versions = [check_version(version)] if version is not None else sorted(
        int(v) for v in backend.list(f"{SINK_PREFIX}/{name}") if v.isascii() and v.isdigit())
    floor = _stamp(since) if since is not None else ""
    for v in versions:
        prefix = f"{SINK_PREFIX}/{name}/{v}"
        # A batch is written after its observations: one stamped before ``since`` holds none of them.
        for file_name in (n for n in backend.list(prefix) if n.endswith(".jsonl") and n >= floor):
            try:
                data = backend.read(f"{prefix}/{file_name}")
            except FileNotFoundError:
                continue
            for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                try:
                    record = json.loads(line)
                    ok = isinstance(record, dict) and isinstance(record.get("ts"), (int, float))
                except ValueError:
                    ok = False
                if not ok:
                    logger.warning("%s:%d: not an observation; skipped", backend.url(f"{prefix}/{file_name}"), number)
                    continue
                if since is None or record["ts"] >= since:
                    yield record

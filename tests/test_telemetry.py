"""Per-version telemetry: Prometheus metrics labelled by template, version and label, the
sink in the store, and a telemetry path that never slows or fails a request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from promptdistill.client import Templates
from promptdistill.core.errors import ConfigError, InvalidReplyError
from promptdistill.registry import Registry
from promptdistill.registry.telemetry import Telemetry, metrics_app, read_observations

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = {"type": "object", "properties": {"team": {"type": "string"}}, "required": ["team"]}


def content(system: str) -> dict:
    return {"name": "triage", "system": system, "user": "Ticket: {ticket}", "inputs": ["ticket"],
            "output_schema": SCHEMA, "response_format": "json_schema", "max_tokens": 16}


@pytest.fixture
def reg(tmp_path) -> Registry:
    reg = Registry(tmp_path / "registry")
    reg.publish("triage", content("Route the ticket."), labels=["production"])
    reg.publish("triage", content("Route the ticket to one team."))
    reg.set_canary("triage", 2, 0.5)
    return reg


def value(registry: CollectorRegistry, metric: str, **labels) -> float:
    found = registry.get_sample_value(metric, labels)
    return 0.0 if found is None else found


def test_observations_are_counted_per_template_version_and_label(reg):
    metrics = CollectorRegistry()
    templates = Templates(reg.root, telemetry=Telemetry(registry=metrics))
    canary = next(t for k in range(200) if (t := templates.get("triage@production", key=k)).version == 2)
    production = templates.get("triage@production", key=next(
        k for k in range(200) if templates.get("triage@production", key=k).version == 1))
    started = time.perf_counter() - 0.120  # a request that took about 120 ms
    assert canary.parse_observed('{"team": "billing"}', started_at=started) == {"team": "billing"}
    with pytest.raises(InvalidReplyError):
        canary.parse_observed('{"teem": "billing"}', started_at=started)
    production.observe(ttft_ms=45.0, e2e_ms=300.0, ok=True, score=0.75)
    c = {"template": "triage", "version": "2", "label": "canary"}
    p = {"template": "triage", "version": "1", "label": "production"}
    assert value(metrics, "promptdistill_template_requests_total", **c) == 2
    assert value(metrics, "promptdistill_template_failures_total", **c) == 1
    assert value(metrics, "promptdistill_template_requests_total", **p) == 1
    assert value(metrics, "promptdistill_template_failures_total", **p) == 0
    latency = value(metrics, "promptdistill_template_latency_seconds_sum", **c) / 2
    assert 0.12 <= latency < 1.0
    assert value(metrics, "promptdistill_template_latency_seconds_bucket", **c, le="0.1") == 0
    assert value(metrics, "promptdistill_template_latency_seconds_bucket", **c, le="1.0") == 2
    assert value(metrics, "promptdistill_template_ttft_seconds_bucket", **p, le="0.05") == 1
    assert value(metrics, "promptdistill_template_score_sum", **p) == 0.75
    text = generate_latest(metrics).decode()
    assert 'promptdistill_template_requests_total{label="canary",template="triage",version="2"} 2.0' in text
    templates.get("triage:1").observe(e2e_ms=10)  # asked for by version: recorded as such
    assert value(metrics, "promptdistill_template_requests_total", template="triage", version="1", label="none") == 1


def test_metrics_app_serves_the_prometheus_text_format(reg):
    metrics = CollectorRegistry()
    Templates(reg.root, telemetry=Telemetry(registry=metrics)).get("triage@production").observe(e2e_ms=20)
    app = metrics_app(metrics)
    status = {}
    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
                         "SERVER_NAME": "x", "SERVER_PORT": "1", "wsgi.url_scheme": "http"},
                        lambda s, h: status.setdefault("s", s)))
    assert status["s"].startswith("200")
    assert b"promptdistill_template_latency_seconds_bucket" in body


def test_two_telemetries_on_one_registry_share_the_metrics(reg):
    metrics = CollectorRegistry()
    a, b = Telemetry(registry=metrics), Telemetry(registry=metrics)  # no "duplicated timeseries"
    a.observe("triage", 1, "production")
    b.observe("triage", 1, "production")
    assert value(metrics, "promptdistill_template_requests_total", template="triage", version="1",
                 label="production") == 2


def test_the_sink_appends_json_lines_per_version_that_read_back(reg, tmp_path):
    sink = tmp_path / "registry"
    telemetry = Telemetry(prometheus=False, sink=str(sink), flush_s=0.05)
    templates = Templates(reg.root, telemetry=telemetry)
    t0 = time.time()
    for k in range(200):
        t = templates.get("triage@production", key=k)
        t.observe(e2e_ms=float(k), ok=k % 10 != 0, score=0.5)
    assert telemetry.flush(10)
    assert telemetry.dropped == {}
    files = sorted((sink / "telemetry" / "triage").rglob("*.jsonl"))
    assert {f.parent.name for f in files} == {"1", "2"}
    records = list(read_observations(str(sink), "triage"))
    assert len(records) == 200
    assert {(r["version"], r["label"]) for r in records} == {(1, "production"), (2, "canary")}
    assert sum(not r["ok"] for r in records) == 20
    assert all(r["ts"] >= t0 and r["score"] == 0.5 for r in records)
    canary = list(read_observations(str(sink), "triage", version=2))
    assert canary and all(r["version"] == 2 for r in canary)
    assert list(read_observations(str(sink), "triage", since=time.time() + 1)) == []
    telemetry.close()


def test_a_failing_sink_never_fails_or_slows_the_request(reg, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the sink's folder should be")
    telemetry = Telemetry(prometheus=False, sink=str(blocked), flush_s=0.01)
    t = Templates(reg.root, telemetry=telemetry).get("triage@production")
    for _ in range(50):
        t.observe(e2e_ms=5.0)
    assert telemetry.flush(10)
    assert telemetry.dropped.get("sink_error") == 50
    telemetry.close()


def test_a_hanging_sink_drops_when_its_queue_is_full_and_never_blocks(reg, tmp_path):
    telemetry = Telemetry(prometheus=False, sink=str(tmp_path / "sink"), max_queue=100, batch_size=10, flush_s=0.01)
    release = threading.Event()
    telemetry._sink.backend.create = lambda key, data: release.wait(30)  # a store that accepts and never answers
    t = Templates(reg.root, telemetry=telemetry).get("triage@production")
    worst = 0.0
    for _ in range(5000):
        start = time.perf_counter()
        t.observe(e2e_ms=5.0, ok=True)
        worst = max(worst, time.perf_counter() - start)
    assert telemetry.dropped["queue_full"] >= 5000 - 100 - 10
    assert worst < 0.05, worst  # never waited for the store
    release.set()
    telemetry.close()


def test_an_exception_or_bad_value_in_the_telemetry_path_is_counted_not_raised(reg, monkeypatch):
    metrics = CollectorRegistry()
    telemetry = Telemetry(registry=metrics)
    t = Templates(reg.root, telemetry=telemetry).get("triage@production")
    t.observe(e2e_ms=float("nan"))
    t.observe(ttft_ms=-1)
    t.observe(e2e_ms="fast")
    assert telemetry.dropped == {"invalid": 3}

    def broken(*a):
        raise RuntimeError("a bug in the exporter")

    monkeypatch.setattr(telemetry._exporter, "children", broken)
    assert t.parse_observed('{"team": "x"}', started_at=time.perf_counter()) == {"team": "x"}
    assert telemetry.dropped["error"] == 1
    monkeypatch.setattr(telemetry, "observe", broken)  # even Telemetry.observe itself raising
    t.observe(e2e_ms=1.0)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_client_imports_prometheus_client_only_when_telemetry_is_used(reg):
    out = _run("import sys\n"
               "from promptdistill.client import Templates\n"
               f"t = Templates({reg.root!r}).get('triage@production', key='u1')\n"
               "t.render(ticket='x')\n"
               "assert 'prometheus_client' not in sys.modules, 'imported at start-up'\n"
               "t.observe(e2e_ms=3.0)\n"
               "import prometheus_client\n"
               "print(prometheus_client.REGISTRY.get_sample_value('promptdistill_template_requests_total', "
               "{'template': 'triage', 'version': str(t.version), 'label': t.label}))\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1.0"


BLOCK_PROMETHEUS = ("import sys\n"
                    "class Block:\n"
                    "    def find_spec(self, name, path=None, target=None):\n"
                    "        if name.split('.')[0] == 'prometheus_client':\n"
                    "            raise ImportError('blocked for the test')\n"
                    "sys.meta_path.insert(0, Block())\n")


def test_without_prometheus_client_the_error_names_the_extra_and_requests_go_on(reg):
    out = _run(BLOCK_PROMETHEUS +
               "from promptdistill.core.errors import ConfigError\n"
               "from promptdistill.client import Templates\n"
               "from promptdistill.registry.telemetry import Telemetry, default_telemetry\n"
               "try:\n"
               "    Telemetry()\n"
               "except ConfigError as e:\n"
               "    print('ERROR', e)\n"
               f"t = Templates({reg.root!r}).get('triage@production')\n"
               "t.observe(e2e_ms=3.0)\n"
               "print('DROPPED', default_telemetry().dropped)\n")
    assert out.returncode == 0, out.stderr
    assert "ERROR Prometheus telemetry needs prometheus_client" in out.stdout
    assert "pip install 'promptdistill[telemetry]'" in out.stdout
    assert "DROPPED {'no_prometheus_client': 1}" in out.stdout
    assert "promptdistill[telemetry]" in out.stderr  # logged once, naming the extra


def test_the_telemetry_extra_is_declared():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("prometheus-client") for r in extras["telemetry"])
    assert any(r.startswith("prometheus-client") for r in extras["pipeline"])
    with pytest.raises(ConfigError, match="telemetry sink"):
        Telemetry(prometheus=False, sink="nosuchprotocol://x")

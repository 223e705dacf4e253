"""``promptdistill load``: bad input and an unreachable server are clear errors; nothing is
written by a run that does not finish (no engine: the server is a closed port)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from promptdistill.load.driver import LoadRequest, run_block
from promptdistill.core.errors import ConfigError, EngineUnavailableError
from promptdistill.specs.model import Load


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _registry_with(tmp_path):
    from promptdistill.registry.store import Registry
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.prompt import template_content

    spec = load_spec("prompts/ticket_triage.yaml")
    Registry(str(tmp_path / "registry")).publish("ticket_triage", template_content(spec), labels=["production"])
    return tmp_path / "registry"


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PROMPTDISTILL_BACKEND": "server",
           "PROMPTDISTILL_SERVER_URLS": f"http://127.0.0.1:{_closed_port()}/v1",
           "PROMPTDISTILL_REGISTRY": str(tmp_path / "registry"), "PROMPTDISTILL_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run([sys.executable, "-m", "promptdistill", "load", "ticket_triage", *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("args, says", [(["--rate", "0"], "--rate: must be above 0"),
                                        (["--rate", "-3"], "--rate: must be above 0"),
                                        (["--concurrency", "0"], "--concurrency: must be at least 1"),
                                        (["--rate", "1", "--requests", "4"], "more than the 4 warm-up")])
def test_a_rate_of_zero_or_below_is_refused_before_any_request(tmp_path, args, says):
    _registry_with(tmp_path)
    out = _run(tmp_path, *args)
    assert out.returncode == 2 and says in out.stderr, out.stderr


def test_a_server_that_refuses_is_named_and_nothing_is_written(tmp_path):
    _registry_with(tmp_path)
    out = _run(tmp_path, "--rate", "2", "--requests", "6", "--blocks", "1")
    assert out.returncode == 1, out.stderr
    assert "EngineUnavailableError" in out.stderr and "none of 6 load requests succeeded" in out.stderr
    assert not (tmp_path / "state" / "load").exists()


def test_a_template_missing_from_the_registry_is_named(tmp_path):
    out = _run(tmp_path, "--rate", "2")
    assert out.returncode == 1 and "ticket_triage" in out.stderr and "Traceback" not in out.stderr


def test_the_driver_refuses_a_rate_it_cannot_send():
    req = LoadRequest("t", "1", {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    with pytest.raises(ConfigError, match="rate_rps"):
        run_block("http://127.0.0.1:1/v1", [req], _raw_load(float("inf")), seed=0)
    with pytest.raises(EngineUnavailableError):
        run_block(f"http://127.0.0.1:{_closed_port()}/v1", [req, req], Load(rate_rps=50.0), seed=0)


def _raw_load(rate: float) -> Load:
    """A Load that skipped its own checks (as a caller's object could): the driver checks again."""
    load = object.__new__(Load)
    object.__setattr__(load, "rate_rps", rate)
    object.__setattr__(load, "concurrency", None)
    return load

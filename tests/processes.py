"""Real servers for tests (Prefect, MLflow, ...): started in their own process group,
waited for with a bound, and always stopped (TERM, then KILL) however the test ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from promptdistill.engine.launcher import free_port

__all__ = ["background", "free_port", "stop", "tail", "wait_http"]


def stop(proc: subprocess.Popen, wait_s: float = 30.0) -> None:
    """Stop ``proc`` and its children (servers such as uvicorn fork workers)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def background(cmd: list[str], env: dict[str, str], log: Path, cwd: str | Path | None = None) -> Iterator[subprocess.Popen]:
    """``cmd`` running in its own session, its output in ``log``; stopped on exit."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        yield proc
    finally:
        stop(proc)


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float, what: str = "server") -> None:
    """Poll ``url`` until it answers 200; fail with the log's tail if ``proc`` exits or
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited ({proc.returncode}):\n{tail(log)}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"{what} not ready after {timeout_s:.0f} s:\n{tail(log)}")



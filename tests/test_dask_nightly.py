"""The nightly on Dask over two vLLM servers, for real.

Two OpenAI-compatible vLLM servers on 127.0.0.1 (each bound to a core of its own), a real
Prefect server, and the nightly flow with ``dask="local"``: a Dask cluster of three worker
processes runs three specs at once. Checked while it runs: the engine's global concurrency
limit (one slot per endpoint) never has more than two holders, though three workers want
one. One worker is killed while a spec's optimize stage runs: Dask runs the spec again on a
fresh worker, and the night completes with every spec published exactly once. At the end:
both endpoints served a real share of the requests, as their own counters say.

The budgets are the ``smoke`` preset made smaller, and the instruction is optimized as
written (no distill stage: a spec's stages reach Dask the same way, and test_flows runs the
distiller in a night): this checks the distributed plumbing on the real engine, not the
figures (``bench/bench_endpoints.py`` measures what a second endpoint buys).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from processes import background, free_port, wait_http

from bench.common import drain_prefect

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SPECS = ["ticket_triage", "format_rules", "invoice_extraction"]
SERVED = "smollm2-dask"
FLOW_TIMEOUT_S = 2400


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """Two vLLM servers loading side by side, each bound to its own core."""
    from promptdistill.core.config import EngineConfig
    from promptdistill.engine.launcher import VLLMServer

    logs = tmp_path_factory.mktemp("vllm")
    config = EngineConfig(backend="server", served_model_name=SERVED, max_model_len=2048)
    started = [VLLMServer(model_dir, config, startup_timeout_s=600, log_path=logs / f"server{core}.log",
                          env={"VLLM_CPU_OMP_THREADS_BIND": str(core)}) for core in (0, 1)]
    try:
        for server in started:
            server.start(wait=False)
        for server in started:
            server.wait_ready()
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A Prefect server of the test's own: Dask workers are processes, and they reach the
    same API through ``PREFECT_API_URL``."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    with background([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
                     "--no-ui"], env, log) as proc:
        wait_http(f"{api_url}/health", proc, log, 240, "prefect server")
        yield api_url


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, servers, prefect_api):
    """Config in the environment (the Dask workers inherit it), a private registry, state
    folder and copy of the bundled specs."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = tmp_path_factory.mktemp("dask-night")
    shutil.copytree(REPO / "prompts", root / "prompts")
    shutil.copytree(REPO / "datasets", root / "datasets", ignore=shutil.ignore_patterns("generators"))
    env = {
        "PROMPTDISTILL_BACKEND": "server",
        "PROMPTDISTILL_SERVER_URLS": ",".join(s.url for s in servers),
        "PROMPTDISTILL_SERVED_MODEL_NAME": SERVED,
        "PROMPTDISTILL_REGISTRY": str(root / "registry"),
        "PROMPTDISTILL_STATE_DIR": str(root / "state"),
        "PROMPTDISTILL_CONFIG": str(root / "promptdistill.toml"),
        "PREFECT_API_URL": prefect_api,
    }
    (root / "promptdistill.toml").write_text("# the engine comes from PROMPTDISTILL_* variables\n")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with temporary_settings(updates={PREFECT_API_URL: prefect_api}):
            try:
                yield root
            finally:
                drain_prefect()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Watcher(threading.Thread):
    """Polls the Prefect API while the night runs: the engine limit's holders; and once an
    optimize stage has run for a few seconds, kills a Dask worker that is waiting on one of
    the servers (so it dies mid-spec, not idle)."""

    def __init__(self, limit_name: str, parent_pid: int, server_ports: set[int], api_url: str):
        super().__init__(daemon=True)
        self.limit_name, self.parent_pid, self.server_ports = limit_name, parent_pid, server_ports
        self.api_url = api_url
        self.max_active = 0
        self.killed: int | None = None
        self.killed_while: list[str] = []
        self.done = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            TaskRunFilter,
            TaskRunFilterName,
        )
        from prefect.client.schemas.objects import StateType
        from prefect.exceptions import ObjectNotFound
        from prefect.settings import PREFECT_API_URL, temporary_settings

        running_since: float | None = None
        # Settings are per thread (a context variable): name the test's server here too.
        with temporary_settings(updates={PREFECT_API_URL: self.api_url}), get_client(sync_client=True) as client:
            while not self.done.wait(0.5):
                try:
                    limit = client.read_global_concurrency_limit_by_name(self.limit_name)
                    self.max_active = max(self.max_active, limit.active_slots)
                except ObjectNotFound:  # created by the first task that needs it
                    pass
                if self.killed is not None:
                    continue
                try:
                    running = [r for r in client.read_task_runs(
                        task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="optimize-")))
                        if r.state_type == StateType.RUNNING]
                    if not running:
                        continue
                    running_since = running_since or time.monotonic()
                    if time.monotonic() - running_since > 5:
                        workers = [pid for pid in dask_worker_pids(self.parent_pid)
                                   if connected_to(pid, self.server_ports)]
                        if workers:
                            self.killed = workers[0]
                            self.killed_while = [r.name for r in running]
                            os.kill(self.killed, signal.SIGKILL)
                except Exception as e:  # noqa: BLE001 - reported by the test, not lost with the thread
                    self.errors.append(f"{type(e).__name__}: {e}")


def dask_worker_pids(parent: int) -> list[int]:
    """The Dask worker processes the local cluster spawned: this process's children (from
    any of its threads) that Dask titled ``dask worker [tcp://...]``."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and cmd.startswith(b"dask worker"):
            pids.append(int(stat.parent.name))
    return sorted(pids)


def connected_to(pid: int, ports: set[int]) -> bool:
    """Whether ``pid`` has an open TCP connection to one of ``ports`` on this machine (its
    sockets' inodes, looked up in /proc/net/tcp)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            remote_port = int(cols[2].rsplit(":", 1)[1], 16)
            if cols[3] == "01" and remote_port in ports and cols[9] in inodes:  # 01: ESTABLISHED
                return True
    return False


@pytest.fixture(scope="module")
def night(workspace, servers):
    from promptdistill.core.config import load_settings
    from promptdistill.engine.server import ServerEngine
    from promptdistill.flows.nightly import nightly
    from promptdistill.pipeline.budgets import budget_preset
    from promptdistill.pipeline.session import engine_limit

    settings = load_settings()
    limit_name, slots = engine_limit(settings.engine, ServerEngine(settings.engine).identity)
    assert slots == 2
    smoke = budget_preset("smoke")
    watcher = Watcher(limit_name, os.getpid(), {s.port for s in servers}, os.environ["PREFECT_API_URL"])
    watcher.start()
    started = time.monotonic()
    try:
        state = nightly(
            specs=SPECS, prompts_dir=str(workspace / "prompts"), dask="local", dask_workers=3,
            ttft_budget=replace(smoke["ttft_budget"], points=10, max_minutes=12.0, keep_contended=True),
            distill_instructions=False,
            budget=replace(smoke["budget"], max_minutes=1.0, max_lm_calls=80),
            selection=smoke["selection"], return_state=True,
        )
    finally:
        watcher.done.set()
        watcher.join(10)
    return state, state.result(raise_on_failure=False), watcher, time.monotonic() - started


def test_specs_run_on_dask_workers_and_survive_a_killed_worker(night, workspace):
    from promptdistill.registry import Registry

    state, result, watcher, seconds = night
    assert state.is_completed(), f"{state.name}: {state.message}: {result}"
    rows = {r["template"]: r for r in result["rows"]}
    assert set(rows) == set(SPECS) and not result["failed"], result["rows"]
    # A worker really died mid-spec, and its spec was finished elsewhere.
    assert not watcher.errors, watcher.errors[:3]
    assert watcher.killed is not None, "no Dask worker was running an optimize stage to kill"
    assert watcher.killed_while, watcher.killed_while
    registry = Registry(workspace / "registry")
    for name, row in rows.items():
        # Exactly one version per spec: the rerun did not publish twice.
        assert registry.versions(name) == [row["version"]], (name, registry.versions(name))
        assert registry.labels(name)["candidate"] == row["version"]
    leftovers = [p for p in (workspace / "registry").rglob("*") if p.name.startswith(".") and p.is_file()]
    assert not leftovers, f"half-written files in the registry: {leftovers}"
    print(f"\n  dask night: {len(SPECS)} specs in {seconds:.0f} s; killed worker {watcher.killed} during "
          f"{watcher.killed_while}; most slot holders seen: {watcher.max_active}")


def test_the_engine_limit_holds_across_workers(night):
    _, _, watcher, _ = night
    # Three workers, two endpoints: never more than one spec per endpoint at a time ...
    assert watcher.max_active <= 2, watcher.max_active
    # ... and the two endpoints did work side by side.
    assert watcher.max_active == 2, watcher.max_active


def test_both_endpoints_served_a_share(night, servers):
    _, result, _, _ = night
    endpoints = {row["endpoint"]: row for row in result["endpoints"]}
    assert set(endpoints) == {s.url.rstrip("/") for s in servers}, endpoints
    for url, row in endpoints.items():
        assert row["requests"] > 0 and row["prompt_tokens"] > 0, row
        # Every worker spreads its requests round-robin over both endpoints.
        assert 0.25 <= row["share"] <= 0.75, (url, row)

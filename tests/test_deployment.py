"""The Prefect user's path, for real: server, ``prefect deploy`` from prefect.yaml, a process
worker, ``prefect deployment run``, and a flow run that completes.

Everything runs against a private ``PREFECT_HOME``, registry and state folder; every wait
is bounded, and the server and worker are stopped in ``finally`` blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from processes import background, free_port, tail, wait_http

pytestmark = [pytest.mark.server, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
PREFECT = [sys.executable, "-m", "prefect"]
POOL = "promptdistill-local"
# The smallest real run: a short TTFT profile (1 round, no probes), fit, publish.
# `minutes` is a cap: an idle machine measures the whole design (~30 requests) in about a
# minute; a busy one needs longer to reach the 10 prompts a fit needs.
TINY_TTFT = {"points": 10, "repeats": 1, "spec_records": 1, "max_minutes": 12.0, "density_probe_tokens": [], "fewshot_probe": False,
             "queue_batches": [], "matmul_probe": False, "keep_contended": True}
RUN_TIMEOUT_S = 1800


def _run(cmd: list[str], env: dict[str, str], timeout_s: float, *, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    if check:
        assert done.returncode == 0, f"{' '.join(cmd[2:])} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_deploy_from_prefect_yaml_and_run_with_a_process_worker(tmp_path):
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": api_url,
        "PREFECT_CLI_PROMPT": "false",
        "PROMPTDISTILL_REGISTRY": str(tmp_path / "registry"),
        "PROMPTDISTILL_STATE_DIR": str(tmp_path / "state"),
        "PWD": str(REPO),  # prefect.yaml's pull step: `{{ $PWD }}` at deploy time
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONUNBUFFERED": "1",
    }
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"

    with background([*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui"],
                     server_env, server_log, cwd=REPO) as server:
        wait_http(f"{api_url}/health", server, server_log, 240, "prefect server")
        _run([*PREFECT, "work-pool", "create", POOL, "--type", "process"], env, 120)
        deployed = _run([*PREFECT, "--no-prompt", "deploy", "--all"], env, 300)
        for name in ("nightly/nightly", "optimize-prompt/optimize-prompt", "profile-ttft/profile-ttft"):
            assert name in deployed.stdout, deployed.stdout

        inspect = _run([*PREFECT, "deployment", "inspect", "nightly/nightly"], env, 120).stdout
        assert "0 2 * * *" in inspect and "Europe/London" in inspect, inspect
        assert str(REPO) in inspect, f"the pull step should point at the checkout:\n{inspect}"

        with background([*PREFECT, "worker", "start", "--pool", POOL, "--type", "process"], env, worker_log, cwd=REPO) as worker:
            started = _run(
                [*PREFECT, "deployment", "run", "profile-ttft/profile-ttft", "--params", json.dumps({"budget": TINY_TTFT}),
                 "--watch", "--watch-interval", "5", "--watch-timeout", str(RUN_TIMEOUT_S)],
                env, RUN_TIMEOUT_S + 120, check=False,
            )
            assert worker.poll() is None, f"worker exited:\n{tail(worker_log)}"
        assert started.returncode == 0 and "Completed" in started.stdout, (
            f"{started.stdout[-3000:]}\n{started.stderr[-2000:]}\nworker log:\n{tail(worker_log)}")

        state = _last_flow_run_state(env, "profile-ttft")
        assert state == "COMPLETED", f"flow run ended {state}\nworker log:\n{tail(worker_log)}"

    # The flow run really published a TTFT model into this test's registry.
    from promptdistill.pipeline.ttft_models import TTFT_ARTIFACT_KIND
    from promptdistill.registry import Registry

    registry = Registry(tmp_path / "registry")
    (engine_key,) = registry.artifact_names(TTFT_ARTIFACT_KIND)
    record = registry.get_artifact(TTFT_ARTIFACT_KIND, engine_key)
    assert record.metadata["engine_identity"]["model"]
    assert "model.json" in record.files
    assert any(p.startswith("ttft-measurements") for p in _run_log_parts(tmp_path / "registry"))


def _last_flow_run_state(env: dict[str, str], flow_name: str) -> str:
    """The state type of the newest flow run of ``flow_name``, read through the API."""
    code = (
        "import sys\n"
        "from prefect.client.orchestration import get_client\n"
        "from prefect.client.schemas.filters import FlowFilter, FlowFilterName\n"
        "with get_client(sync_client=True) as c:\n"
        f"    runs = c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[{flow_name!r}])))\n"
        "    runs.sort(key=lambda r: r.created)\n"
        "    print(runs[-1].state.type.value if runs else 'NONE')\n"
    )
    return _run([sys.executable, "-c", code], env, 120).stdout.strip().splitlines()[-1]


def _run_log_parts(root: Path) -> list[str]:
    return [p.stem for p in (root / "runs").glob("*/*.parquet")]

"""A team's own project, end to end, as they would run it.

The package is installed non-editable into a fresh virtual environment (its dependencies
come from this repository's venv through a ``.pth`` file: a clean install of vLLM would take
minutes and gigabytes). In a folder outside the repository: ``promptdistill init``, then
their own function-calling spec (a per-request output schema), a python metric module,
label-free records, and a separate judge: a real vLLM server on 127.0.0.1 while the task
runs in-process. ``prefect deploy --all`` registers the packaged flows from that folder,
``promptdistill nightly --budget smoke`` runs there, and the published template renders
with that request's schema through the client.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from test_user_project import FUNCTION, METRIC, make_project

# Label-free records get the current prompt's own reply as ``expected``: the team's metric
# scores agreement with it there, and its labelled rule where a record has labels. Each
# call leaves a line in metrics/scored.log ("reference" or "label"), so the test sees that
# this module, and not a built-in metric, scored the night's replies.
METRIC_WITH_REFERENCES = "import pathlib\n" + METRIC.replace(
    '    if not isinstance(parsed, dict):\n',
    '    kind = "label" if isinstance(expected, dict) and "allowed" in expected else "reference"\n'
    '    with open(pathlib.Path(__file__).with_name("scored.log"), "a") as log:\n'
    '        log.write(kind + "\\n")\n'
    '    if not isinstance(parsed, dict):\n').replace(
    '    allowed = expected["allowed"]\n',
    '    if "allowed" not in expected:  # the baseline\'s reply is the reference\n'
    '        return float(isinstance(expected, dict) and parsed.get("time") == expected.get("time"))\n'
    '    allowed = expected["allowed"]\n')

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with promptdistill installed from this checkout, not editable."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "_repo_venv_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    build = tmp_path_factory.mktemp("build")
    # Built by this venv's setuptools (the fresh venv may carry an older one without
    # bdist_wheel), then installed from the wheel as a user would from an index.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "-w", str(build), str(REPO)], check=True, timeout=600, cwd=build,
                   env={**os.environ, "PIP_NO_INPUT": "1"})
    (wheel,) = build.glob("promptdistill-*.whl")
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-cache-dir", str(wheel)],
                   check=True, timeout=600, cwd=build, env={**os.environ, "PIP_NO_INPUT": "1"})
    where = subprocess.run([str(py), "-c", "import promptdistill, pathlib; print(pathlib.Path(promptdistill.__file__))"],
                           check=True, capture_output=True, text=True, cwd=build).stdout.strip()
    assert where.startswith(site), f"promptdistill imported from {where}, not the fresh install in {site}"
    return venv


@pytest.fixture(scope="module")
def judge_server(model_dir):
    from promptdistill.core.config import EngineConfig
    from promptdistill.engine.launcher import VLLMServer

    config = EngineConfig(backend="server", served_model_name="judge", max_model_len=2048)
    with VLLMServer(model_dir, config, startup_timeout_s=600) as server:
        yield server


def test_a_project_outside_the_repository_runs_the_nightly_with_its_own_metric_judge_and_traffic(
        installed, judge_server, seed_ttft_model, tmp_path):
    cli = installed / "bin" / "promptdistill"
    project = tmp_path / "team-project"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": ""}
    env.pop("PROMPTDISTILL_REGISTRY", None)
    env.pop("PROMPTDISTILL_STATE_DIR", None)
    subprocess.run([str(cli), "init", str(project)], check=True, env=env, timeout=120, capture_output=True)
    make_project(project, labelled=False, metric_source=METRIC_WITH_REFERENCES)
    # What the run must say it measured, computed here from the files the team wrote.
    records = [json.loads(line) for line in (project / "datasets" / "tool_call.jsonl").read_text().splitlines()]
    dataset_sha256 = hashlib.sha256((project / "datasets" / "tool_call.jsonl").read_bytes()).hexdigest()
    labelled_ids = {r["id"] for r in records if r.get("expected")}
    assert 0 < len(labelled_ids) < len(records)  # both kinds of record, so both kinds of score
    config = (project / "promptdistill.toml").read_text()
    config = config.replace("# [judge]\n# backend = \"server\"\n# server_urls = [\"http://127.0.0.1:8001/v1\"]\n"
                            "# served_model_name = \"my-judge\"",
                            f"[judge]\nbackend = \"server\"\nserver_urls = [\"{judge_server.url}\"]\n"
                            "served_model_name = \"judge\"")
    assert "[judge]\nbackend" in config
    seed_ttft_model(project / "artifacts" / "registry")
    (project / "promptdistill.toml").write_text(config)

    # `prefect deploy` from their folder: the deployments' entrypoints are the installed flows.
    prefect = [str(installed / "bin" / "python"), "-m", "prefect"]
    deploy_env = {**env, "PWD": str(project), "PREFECT_CLI_PROMPT": "false"}
    for cmd in (["work-pool", "create", "promptdistill-local", "--type", "process"], ["--no-prompt", "deploy", "--all"]):
        done = subprocess.run([*prefect, *cmd], cwd=project, env=deploy_env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"prefect {' '.join(cmd)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    for name in ("nightly/nightly", "optimize-prompt/optimize-prompt", "profile-ttft/profile-ttft"):
        assert name in done.stdout, done.stdout[-2000:]
    inspect = subprocess.run([*prefect, "deployment", "inspect", "nightly/nightly"], cwd=project, env=deploy_env,
                             capture_output=True, text=True, timeout=120).stdout
    assert "'entrypoint': 'promptdistill.flows.nightly.nightly'" in inspect and str(project) in inspect, inspect

    run = subprocess.run([str(cli), "nightly", "--budget", "smoke"], cwd=project, env=env, capture_output=True,
                         text=True, timeout=2400)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "tool_call" in run.stdout
    assert ": fresh" in run.stdout, run.stdout[-3000:]  # the seeded TTFT model served, no profile

    # The service's side: the published template, with this request's schema.
    code = ("import json, sys\n"
            "from promptdistill.client import Templates\n"
            "t = Templates('artifacts/registry').get('tool_call@production')\n"
            f"fn = {json.dumps(FUNCTION)!r}\n"
            "body = t.request_body({'request': 'wake me at 06:45', 'function': fn}, model='m')\n"
            "print(json.dumps({'schema': body['response_format']['json_schema']['schema'],\n"
            "                  'last': body['messages'][-1], 'provenance': t.provenance}))\n")
    out = subprocess.run([str(installed / "bin" / "python"), "-c", code], cwd=project, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{out.stderr[-3000:]}\n--- the nightly printed:\n{run.stdout[-3000:]}"
    published = json.loads(out.stdout.strip().splitlines()[-1])
    assert published["schema"] == FUNCTION["parameters"]
    provenance = published["provenance"]
    assert provenance["judge_engine"]["backend"] == "vllm-server"
    assert provenance["engine"]["backend"] == "vllm-local"
    assert provenance["dataset"]["file"] == "tool_call.jsonl"
    assert provenance["dataset"]["sha256"] == dataset_sha256  # the team's records, as written before the run
    # The published prompt renders this request (the spec's {request} placeholder) in the last user turn.
    assert published["last"]["role"] == "user" and "wake me at 06:45" in published["last"]["content"]
    assert (project / ".promptdistill").is_dir() and (project / "artifacts" / "registry").is_dir()
    # The project's own metric scored the replies, against the baseline's reply on label-free records.
    scored = (project / "metrics" / "scored.log").read_text().split()
    assert scored and set(scored) <= {"reference", "label"}, scored[:50]
    assert "reference" in scored, scored[:50]

"""A team's first dataset, imported from flat traffic, scored with per-record reference data.

From a folder outside the repository, with the package installed non-editable (the
``installed`` fixture of tests/test_user_project_e2e.py): ``promptdistill init``, a spec
whose dataset does not exist yet and whose python metric reads each record's
``reference`` (the allowed values of every argument, which the prompt must not see),
``datasets import`` of a flat JSONL file (then ``--append`` of more traffic), ``spec
validate``, ``plan`` and a ``--budget smoke`` nightly. The metric raises when a record
reaches it without its reference, and a metric error fails the night.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from test_user_project import FUNCTION, make_project
from test_user_project_e2e import installed  # noqa: F401 - the fixture

pytestmark = [pytest.mark.engine, pytest.mark.slow]

METRIC = '''
def score(reply_text, parsed, expected, inputs, reference=None):
    """Every argument is one of the record's allowed values; the time is required."""
    allowed = reference["allowed"]  # no reference: a KeyError/TypeError that fails the run
    if not isinstance(parsed, dict) or "time" not in parsed:
        return 0.0
    return float(all(name in allowed and value in allowed[name] for name, value in parsed.items()))
'''


def _traffic(start: int, stop: int) -> str:
    rows = []
    for i in range(start, stop):
        hour = f"{6 + i % 12:02d}:{(i * 7) % 60:02d}"
        rows.append({"request_id": f"r{i:03d}", "text": f"wake me at {hour}", "fn": json.dumps(FUNCTION),
                     "answer": {"time": hour}, "allowed": {"time": [hour], "label": ["wake up", "alarm"]}})
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_a_first_dataset_imported_from_flat_traffic_runs_the_nightly_with_reference_data(
        installed, seed_ttft_model, tmp_path):  # noqa: F811
    cli = str(installed / "bin" / "promptdistill")
    project = tmp_path / "team-project"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": ""}
    env.pop("PROMPTDISTILL_REGISTRY", None)
    env.pop("PROMPTDISTILL_STATE_DIR", None)

    def run(*args: str, timeout: int = 300) -> str:
        done = subprocess.run([cli, *args], cwd=project, env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"promptdistill {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    subprocess.run([cli, "init", str(project)], check=True, env=env, timeout=120, capture_output=True)
    spec_file = make_project(project, metric_source=METRIC)
    dataset = project / "datasets" / "tool_call.jsonl"
    dataset.unlink()  # the spec's first dataset comes from the import
    # Two examples, whose references must not show.
    spec = yaml.safe_load(spec_file.read_text())
    spec["template"]["system"]["examples"] = {"count": 2}
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    (project / "traffic.jsonl").write_text(_traffic(0, 48))
    (project / "more.jsonl").write_text(_traffic(40, 56))  # 8 already imported, 8 new

    common = ["--map", "request=text", "--map", "function=fn", "--id-column", "request_id",
              "--expected-column", "answer", "--reference-column", "allowed"]
    assert "48 of 48 rows imported" in run("datasets", "import", "traffic.jsonl", "--spec", "tool_call", *common)
    first = dataset.read_text().splitlines()
    printed = run("datasets", "import", "more.jsonl", "--spec", "tool_call", *common, "--append")
    assert "8 of 16 rows imported" in printed and "8 row(s) already in the dataset left out" in printed
    lines = dataset.read_text().splitlines()
    assert lines[:48] == first and len(lines) == 56
    assert (project / "datasets" / "tool_call.jsonl.bak").read_text().splitlines() == first
    record = json.loads(lines[-1])
    assert record["reference"] == {"allowed": {"time": [record["expected"]["time"]], "label": ["wake up", "alarm"]}}

    run("spec", "validate")
    run("plan", "tool_call")
    seed_ttft_model(project / "artifacts" / "registry")
    night = run("nightly", "--budget", "smoke", timeout=2400)
    assert "tool_call " in night
    assert ": fresh" in night, night[-3000:]  # the seeded TTFT model served, no profile
    assert (project / "artifacts" / "registry").is_dir()

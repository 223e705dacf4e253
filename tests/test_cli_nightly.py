"""``promptdistill nightly``'s set-up: process defaults before Prefect starts."""

from __future__ import annotations

import os

from promptdistill.core.env import apply_defaults


def test_a_missing_prefect_home_is_created_for_the_ephemeral_server(tmp_path, monkeypatch):
    # A fresh checkout has no .promptdistill/; Prefect's ephemeral server would then fail
    # with "unable to open database file" (it does not create parent folders).
    home = tmp_path / "fresh" / ".promptdistill" / "prefect"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)
    apply_defaults()
    assert home.is_dir()
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


def test_a_value_the_user_set_wins(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    apply_defaults()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


# --- a night whose specs fail: the summary and the reasons, no traceback ------------------------

FAILING_NIGHT = '''
import sys
from prefect import flow, task
import promptdistill.flows.nightly as flows
from promptdistill.cli import main
from promptdistill.core.errors import SchemaError
from promptdistill.pipeline.jobs import SpecsFailedError
from promptdistill.pipeline.report import failed_row


@task(name="optimize-spec")
def optimize(kind):
    if kind == "schema":
        raise SchemaError("json_schema is not a valid JSON Schema: at type: 'dict' is not valid")
    return {}["a bug"]


@flow(name="nightly")
def nightly(specs=None, **params):
    """The real flow's ending (its specs failing in their tasks), without the engine."""
    rows = []
    for name, kind in (("ticket_triage", "schema"), ("word_problems", "bug")):
        state = optimize.with_options(task_run_name=f"optimize-{name}")(kind, return_state=True)
        rows.append(failed_row(name, f"{type(state.result(raise_on_failure=False)).__name__}: "
                                     f"{state.result(raise_on_failure=False)}"))
    summary = {"run_id": "r1", "rows": rows, "ttft": {"reason": "fresh"}, "report": None,
               "failed": [r["template"] for r in rows]}
    raise SpecsFailedError("2 of 2 specs failed: ticket_triage, word_problems", summary)


flows.nightly = nightly
sys.exit(main(["nightly", "--budget", "smoke", "--specs", "ticket_triage,word_problems",
               "--prompts-dir", sys.argv[1]]))
'''


def test_a_failed_night_ends_with_the_summary_and_the_reasons_not_a_traceback(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "night.py").write_text(FAILING_NIGHT)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PROMPTDISTILL_STATE_DIR": str(tmp_path / "state"),
           "PROMPTDISTILL_REGISTRY": str(tmp_path / "registry"), "PYTHONUNBUFFERED": "1",
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    env.pop("PREFECT_API_URL", None)
    prompts = Path(__file__).resolve().parents[1] / "prompts"
    proc = subprocess.run([sys.executable, str(tmp_path / "night.py"), str(prompts)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    both = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 1, both
    assert "Traceback" not in both and "SpecsFailedError" not in both, both
    # The summary, each failure's reason, and what failed.
    assert "ticket_triage: FAILED: SchemaError: json_schema is not a valid JSON Schema" in proc.stdout, both
    assert "word_problems: FAILED: KeyError: 'a bug'" in proc.stdout, both
    log = proc.stderr.split("third-party output (engine, libraries): ", 1)[1].split()[0]
    assert f"failed: ticket_triage, word_problems (details in {log})" in proc.stderr
    # The tasks' errors as they happen: our error in one line, a bug pointing at its traceback.
    assert "ERROR optimize-ticket_triage: Task run failed with exception: SchemaError(" in proc.stderr
    assert "ERROR optimize-word_problems: Task run failed with exception: KeyError('a bug')" in proc.stderr
    assert f"(traceback in {log})" in proc.stderr
    assert Path(log).read_text().count("Traceback") >= 3  # the details are kept in the log

"""``promptdistill nightly``'s set-up before Prefect is imported (no engine, no Prefect run)."""

from __future__ import annotations

from promptdistill.cli import nightly as nightly_cli


def test_a_missing_prefect_home_is_created_for_the_ephemeral_server(tmp_path, monkeypatch):
    # A fresh checkout has no .promptdistill/; Prefect's ephemeral server would then fail
    # with "unable to open database file" (it does not create parent folders).
    home = tmp_path / "fresh" / ".promptdistill" / "prefect"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)
    nightly_cli._quiet_defaults()
    assert home.is_dir()
    assert nightly_cli.os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"


def test_settings_the_user_gave_are_kept(monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    nightly_cli._quiet_defaults()
    assert nightly_cli.os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "300"

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

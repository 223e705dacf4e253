"""``promptdistill ttft fit | report | profile`` end to end.

fit and report run on a synthetic profile file (pure logic); profile runs on the real
session engine (marked ``engine``).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_ttft_models import synthetic  # noqa: E402 - tests/ is on sys.path (see fakes imports)

from promptdistill.cli import main
from promptdistill.pipeline.ttft_models import TTFT_ARTIFACT_KIND, load_ttft_model
from promptdistill.registry.store import Registry


@pytest.fixture()
def profile_dir(tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    df = synthetic(n_prompts=40, repeats=2)
    df["design"] = "sweep"
    probe = synthetic(n_prompts=4, repeats=3, seed=9).assign(design="fewshot_probe")
    probe["fewshot_count"] = probe["prompt_id"].map({"p0": 0, "p1": 1, "p2": 4, "p3": 8})
    probe["prompt_id"] = "probe-" + probe["prompt_id"]
    probe["fewshot_tokens"] = probe["fewshot_count"] * 64
    df["fewshot_tokens"] = df["fewshot_count"] * 40
    pd.concat([df, probe], ignore_index=True).to_parquet(folder / "profile-a.parquet")
    return folder


def test_fit_publishes_to_the_registry_and_report_writes_markdown_and_figures(profile_dir, tmp_path, capsys,
                                                                               monkeypatch):
    monkeypatch.setenv("PROMPTDISTILL_REGISTRY", str(tmp_path / "registry"))
    assert main(["ttft", "fit", "--profiles", str(profile_dir), "--report-dir", str(tmp_path / "fit-report")]) == 0
    summary = json.loads(capsys.readouterr().out)
    registry = Registry(str(tmp_path / "registry"))
    (engine_key,) = registry.artifact_names(TTFT_ARTIFACT_KIND)
    identity = registry.get_artifact(TTFT_ARTIFACT_KIND, engine_key).metadata["engine_identity"]
    from promptdistill.engine.base import EngineIdentity

    model = load_ttft_model(registry, EngineIdentity.from_dict(identity))  # where optimize and the nightly look
    assert summary["version"] == model.version and summary["engine_key"] == engine_key
    assert summary["artifact"] == f"ttft-model/{engine_key}:1" and summary["heldout_mape"] < 0.1
    assert (tmp_path / "fit-report" / model.version / "report.md").is_file()

    report_dir = tmp_path / "report"
    assert main(["ttft", "report", "--profiles", str(profile_dir), "--out", str(report_dir), "--n-boot", "50"]) == 0
    text = (report_dir / "report.md").read_text()
    for png in ("pred_vs_measured.png", "ttft_vs_uncached.png", "residuals.png", "density_partial.png"):
        assert (report_dir / png).read_bytes().startswith(b"\x89PNG"), png
        assert png in text
    assert model.version in text
    assert "Does semantic density change TTFT" in text and "held-out MAPE" in text
    assert "## Noise floor" in text and "against medians of repeats" in text and "## Hardware limit" in text
    numbers = json.loads((report_dir / "report.json").read_text())
    assert [row["fewshot_count"] for row in numbers["fewshot"]] == [0, 1, 4, 8]
    assert {"coef_ms_per_unit", "ci_low", "ci_high", "std_beta"} <= set(numbers["density"])


def test_fit_without_profiles_says_what_to_run(tmp_path, capsys):
    assert main(["ttft", "fit", "--profiles", str(tmp_path / "nowhere")]) == 1
    assert "run `promptdistill ttft profile` first" in capsys.readouterr().err


@pytest.mark.engine
def test_profile_command_measures_on_the_configured_engine(engine, tmp_path, monkeypatch, capsys):
    import promptdistill.engine as engine_module

    class Borrowed:
        """The session engine, not closed by the command's ``with`` block."""

        def __enter__(self):
            return engine

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(engine_module, "load_engine", lambda config=None: Borrowed())
    out = tmp_path / "p"
    code = main(["ttft", "profile", "--points", "3", "--repeats", "1", "--max-tokens", "300", "--spec-records", "0",
                 "--density-probe-tokens", "", "--no-fewshot-probe", "--max-retries", "0", "--quiet-wait-s", "0",
                 "--out", str(out), "--quiet"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stopped"] == "complete" and summary["measurements"] >= summary["planned"] >= 3
    assert len(pd.read_parquet(summary["path"])) == summary["measurements"]

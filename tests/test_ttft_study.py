"""The TTFT study (``bench/ttft_study``) on synthetic measurement frames: coefficients with
bootstrap intervals, the density question, the few-shot table, the queue, the FLOPs and
throughput against the matmul peak, the batching ceiling, the target, and the bench command
that regenerates ``docs/ttft/``; and that the nightly never loads the study. The product's
fit, noise floor and hardware are tested in test_ttft_models.py and test_ttft_hardware.py.
"""

from __future__ import annotations

import ast
import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_ttft_hardware import SMOLLM2  # tests/ is on sys.path (see fakes imports)
from test_ttft_models import one_openmp_thread, queued_frame, synthetic  # noqa: F401 - the autouse fixture applies here too

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # bench/ is not installed: the study is imported from the checkout

from bench.ttft_study.analysis import (
    batched_ceiling,
    bootstrap_coefficients,
    decode_flops,
    density_effect,
    fewshot_table,
    prefill_flops,
    prefill_throughput,
    queue_table,
    request_flops,
)
from bench.ttft_study.report import target_verdict
from promptdistill.ttft import check_frame, fit_models
from promptdistill.ttft.hardware import ModelFlops


def test_bootstrap_intervals_cover_the_true_coefficients():
    df = synthetic(noise=0.03, seed=3)
    table = bootstrap_coefficients(df, n_boot=200, seed=0).set_index("term")
    # Requests alone: prefill tokens are the uncached tokens, so their coefficient is the law's.
    assert table.loc["prefill_tokens", "ci_low"] < 1.1 < table.loc["prefill_tokens", "ci_high"]
    assert table.loc["prefill_tokens", "ci_low"] > 0.5
    assert table.loc["prefill_steps", "coef"] == 0.0  # one step each: nothing to learn
    assert list(table.columns) == ["coef", "ci_low", "ci_high", "p_boot", "std_beta"]


def test_density_effect_finds_an_effect_only_when_there_is_one():
    none = density_effect(synthetic(seed=4, noise=0.01), n_boot=200)
    assert abs(none["effect_over_range_ms"]) < 0.02 * none["median_ttft_ms"]
    strong = density_effect(synthetic(seed=4, noise=0.01, density_effect_ms=400.0), n_boot=200)
    assert strong["ci_excludes_zero"] and strong["ci_low"] > 200


def test_fewshot_table_uses_only_the_probe():
    rows = []
    for k, ms in ((0, 500.0), (1, 560.0), (4, 740.0), (8, 980.0)):
        for r in range(3):
            rows.append(dict(design="fewshot_probe", fewshot_count=k, total_tokens=512 + 64 * k, fewshot_tokens=64 * k,
                             ttft_ms=ms + r, prompt_id=f"f{k}"))
    rows.append(dict(design="sweep", fewshot_count=1, total_tokens=90, fewshot_tokens=60, ttft_ms=1.0, prompt_id="s"))
    table = fewshot_table(pd.DataFrame(rows))
    assert table["fewshot_count"].tolist() == [0, 1, 4, 8]
    assert table["ttft_ms_median"].tolist() == [501.0, 561.0, 741.0, 981.0]
    assert table["increment_over_0_ms"].tolist() == [0.0, 60.0, 240.0, 480.0]
    assert table.loc[table["fewshot_count"] == 4, "claimed_ms"].item() == 316.0


def test_the_queue_table_predicts_each_batch_without_it():
    df = queued_frame()
    fit = fit_models(df, seed=0)
    table, scores = queue_table(check_frame(df)[0], fit.estimator)
    assert scores["n"] == len(table) == df.loc[df["batch_size"] > 1, "prompt_id"].nunique()
    assert scores["mape_queue"] < 0.05 < scores["mape_alone"]  # ignoring the queue misses most of the wait


def test_target_is_five_percent_or_close_to_a_floor_above_it():
    assert target_verdict(0.04, 0.02)["met"]
    assert not target_verdict(0.06, 0.03)["met"]  # the floor allows 5%: 6% is a miss
    close = target_verdict(0.066, 0.058)
    assert close["met"] and "1.2x" in close["how"] and close["ratio_to_floor"] == pytest.approx(0.066 / 0.058)
    assert not target_verdict(0.08, 0.058)["met"]


def test_prefill_and_decode_flops():
    m = ModelFlops.from_config(SMOLLM2)
    head = 2 * 49152 * 576
    assert prefill_flops(m, 1) == pytest.approx(2 * m.matmul_params + 2 * 30 * 576 + head)
    # Attention grows with the square of the new tokens and linearly with the cached ones.
    n, c = 1000, 512
    assert prefill_flops(m, n, c) - prefill_flops(m, n) == pytest.approx(2 * 30 * 576 * 2 * n * c)
    assert prefill_flops(m, np.array([128, 2048])).shape == (2,)
    per_token = prefill_flops(m, 2048) / 2048
    assert 2 * m.matmul_params < per_token < 1.4 * 2 * m.matmul_params  # attention adds under 40% at 2048
    assert request_flops(m, 100, 3) == pytest.approx(prefill_flops(m, 100) + decode_flops(m, 101) + decode_flops(m, 102))
    # A cached prefix is not computed again: only the rest of the prompt, over its whole context.
    assert request_flops(m, 100, 3, cached_tokens=64) == pytest.approx(
        prefill_flops(m, 36, 64) + decode_flops(m, 101) + decode_flops(m, 102))
    assert request_flops(m, 100, 3, cached_tokens=64) < request_flops(m, 100, 3)


def test_batched_ceiling_is_one_over_the_serial_share_of_peak():
    c = batched_ceiling(serial_wall_s=10.0, total_flops=400e9, peak_gflops=200.0)
    assert c["compute_floor_s"] == pytest.approx(2.0)
    assert c["serial_share_of_peak"] == pytest.approx(0.2)
    assert c["ceiling_ratio"] == pytest.approx(5.0)


def _ladder_rows(peak: float = 200.0) -> pd.DataFrame:
    m = ModelFlops.from_config(SMOLLM2)
    rows = []
    for tokens, share in ((128, 0.3), (512, 0.6), (2000, 0.7)):
        seconds = prefill_flops(m, tokens) / (share * peak * 1e9)
        for r, wobble in enumerate((0.98, 1.0, 1.02)):
            rows.append({"prompt_id": f"l{tokens}", "uncached_tokens": tokens, "cached_tokens": 0, "batch_size": 1,
                         "ttft_ms": seconds * 1000 * wobble, "hw_matmul_gflops": peak, **m.columns()})
    rows.append({**rows[0], "cached_tokens": 128, "ttft_ms": 1.0})  # warm: not a prefill of 128 tokens
    rows.append({**rows[0], "batch_size": 3, "ttft_ms": 1.0})  # queued: waited for others
    return pd.DataFrame(rows)


def test_prefill_throughput_as_a_share_of_the_peak():
    table = prefill_throughput(_ladder_rows(), n_boot=100).set_index("tokens")
    assert list(table.index) == [128, 512, 2048]  # 2000 tokens stand for 2048: the context limit
    assert table.loc[128, "n"] == 3 and table.loc[2048, "tokens_measured"] == 2000
    assert table.loc[512, "share_of_peak"] == pytest.approx(0.6, rel=1e-6)
    assert table.loc[512, "share_of_peak_lo"] < 0.6 < table.loc[512, "share_of_peak_hi"]
    assert table.loc[2048, "tokens_per_s"] == pytest.approx(2000 / (table.loc[2048, "ttft_ms"] / 1000), rel=1e-6)


def test_prefill_throughput_without_hardware_columns_has_no_share():
    rows = _ladder_rows().drop(columns=["hw_matmul_gflops"])
    assert prefill_throughput(rows, n_boot=20)["share_of_peak"].isna().all()


def test_the_bench_command_regenerates_the_study_where_it_is_told(tmp_path, monkeypatch):
    # The docs' folders are the defaults; the options given override them.
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    synthetic(n_prompts=30, repeats=2).to_parquet(profiles / "profile-a.parquet")
    monkeypatch.setenv("PROMPTDISTILL_REGISTRY", str(tmp_path / "registry"))
    out = tmp_path / "docs-ttft"
    monkeypatch.setattr(sys, "argv", ["bench.ttft_study", "--profiles", str(profiles), "--out", str(out),
                                      "--n-boot", "20"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("bench.ttft_study", run_name="__main__")
    assert done.value.code == 0
    assert "Does semantic density change TTFT" in (out / "report.md").read_text()
    numbers = _strict_json(out / "report.json")
    assert numbers["density"]["n_boot"] == 20 and numbers["model_version"] is None  # nothing published here
    for png in ("pred_vs_measured.png", "residuals.png", "density_partial.png", "noise.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG"), png


def _strict_json(path: Path) -> dict:
    """The file's JSON, refusing NaN and Infinity (which json.dumps writes by default and
    strict parsers reject)."""

    def refuse(name: str) -> None:
        raise ValueError(f"{path}: {name} is not JSON")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_report_json_writes_a_missing_figure_as_null(tmp_path, monkeypatch):
    import numpy as np

    from bench.ttft_study import report

    def numbers(rows, **_):
        return {"engine": {"engine_key": rows["engine_key"].iloc[0], "engine_backend": rows["engine_backend"].iloc[0],
                           "engine_max_model_len": np.int64(2048)},
                "fit": {"chosen": "linear"}, "heldout_mape_chosen": float("nan"),
                "heldout_mape_median_chosen": np.float64("nan"), "noise": {"floor_vs_medians": float("inf")},
                "target": {"vs_medians": {"met": np.bool_(False), "ratio_to_floor": float("nan")}},
                "mechanics": {}, "queue": {"table": [{"batch": 2, "mape": np.nan}]}, "hardware": {}, "rows": {}}

    monkeypatch.setattr(report, "report_numbers", numbers)
    monkeypatch.setattr(report, "engine_markdown", lambda n: "engine\n")
    monkeypatch.setattr(report, "overview_markdown", lambda engines, note="": "overview\n")
    df = pd.DataFrame({"engine_key": ["a", "b"], "engine_backend": ["vllm-local", "vllm-server"]})
    report.build_report(df.iloc[:1], tmp_path / "one", fit=None)
    one = _strict_json(tmp_path / "one" / "report.json")
    assert one["heldout_mape_chosen"] is None and one["heldout_mape_median_chosen"] is None
    assert one["noise"]["floor_vs_medians"] is None and one["queue"]["table"] == [{"batch": 2, "mape": None}]
    assert one["engine"]["engine_max_model_len"] == 2048 and one["target"]["vs_medians"]["met"] is False
    report.build_overview(df, tmp_path / "all")
    overview = _strict_json(tmp_path / "all" / "report.json")
    assert overview["engines"]["vllm-local"]["heldout_mape"] is None
    assert _strict_json(tmp_path / "all" / "vllm-server" / "report.json")["heldout_mape_chosen"] is None


# --- the study stays out of the product ---------------------------------------------------------


def test_the_nightly_imports_no_module_of_the_ttft_study():
    assert (ROOT / "bench" / "ttft_study" / "report.py").is_file()  # the study is where this test says it is
    # In a fresh interpreter, run in the checkout's folder: `bench` would import if anything asked for it.
    code = ("import sys; import promptdistill.flows.nightly, promptdistill.flows.profile_ttft; "
            "print(','.join(sorted(m for m in sys.modules if m == 'bench' or m.startswith('bench.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", f"importing the nightly loaded {done.stdout.strip()}"


def test_only_the_ttft_report_command_reaches_the_study():
    # The product never imports bench/; the one way in is `promptdistill ttft report`, when it runs.
    product = sorted((ROOT / "promptdistill").rglob("*.py"))
    imports = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in product
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bench"
               or isinstance(node, ast.Import) and any(a.name.split(".")[0] == "bench" for a in node.names)]
    assert imports == [], f"the product imports the benchmarks: {imports}"
    named = [str(path.relative_to(ROOT)) for path in product if '"bench.ttft_study"' in path.read_text(encoding="utf-8")]
    assert named == ["promptdistill/cli/ttft.py"]

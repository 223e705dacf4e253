"""Every benchmark of ``bench/run_all.py`` at its smallest size: it runs and its report has every field.

No timing assertion: a figure's value depends on the machine and its load; what is
checked is that each script runs to the end as a subprocess (as ``make bench`` runs it)
and writes a report with every field, of a sane type, stamped with the machine and the
commit. Reports go to a temporary folder (``PROMPTDISTILL_BENCH_DIR``), and so does the
state dir (``PROMPTDISTILL_STATE_DIR``: LM caches, optimizer outputs).

The optimizer benchmarks need a TTFT model for this engine: the session's, fitted from a
short real profile (conftest) and published into a temporary registry
(``PROMPTDISTILL_REGISTRY``), where the benchmarks look as ``promptdistill optimize`` does.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 900


def run_bench(module: str, *args: str, tmp_path: Path, registry: Path | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PROMPTDISTILL_BENCH_DIR": str(tmp_path / "bench"),
        "PROMPTDISTILL_STATE_DIR": str(tmp_path / "state"),
        "PROMPTDISTILL_REGISTRY": str(registry or tmp_path / "registry"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    print(f"{module} {' '.join(args)}: exit {proc.returncode} in {time.monotonic() - started:.1f} s")
    assert proc.returncode == 0, (f"{module} failed with exit {proc.returncode}\n--- stdout (tail)\n{proc.stdout[-3000:]}"
                                  f"\n--- stderr (tail)\n{proc.stderr[-6000:]}")
    return proc


def read_report(tmp_path: Path, name: str) -> dict[str, Any]:
    """The JSON report ``name`` with its stamp checked (and its markdown beside it)."""
    path = tmp_path / "bench" / f"{name}.json"
    assert path.is_file(), f"no report at {path}"
    assert (tmp_path / "bench" / f"{name}.md").is_file()
    report = json.loads(path.read_text())
    assert report["benchmark"] == name
    assert isinstance(report["timestamp"], str) and report["timestamp"]
    assert isinstance(report["commit"], str) and report["commit"]
    machine = report["machine"]
    assert isinstance(machine["hardware"], str) and machine["hardware"]
    assert isinstance(machine["cores"], int) and machine["cores"] >= 1
    assert isinstance(machine["python"], str) and isinstance(machine["platform"], str)
    return report


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def numbers(d: Mapping[str, Any], keys: Iterable[str], where: str = "") -> None:
    for k in keys:
        assert k in d, f"{where}{k}: missing"
        assert is_number(d[k]), f"{where}{k}: not a number: {d[k]!r}"


def number_or_none(d: Mapping[str, Any], keys: Iterable[str], where: str = "") -> None:
    for k in keys:
        assert k in d, f"{where}{k}: missing"
        assert d[k] is None or is_number(d[k]), f"{where}{k}: not a number: {d[k]!r}"


def check_identity(identity: Mapping[str, Any]) -> None:
    for k in ("model", "backend", "dtype", "hardware", "engine_version"):
        assert isinstance(identity[k], str) and identity[k], k
    assert isinstance(identity["max_model_len"], int)


# -- bench_client (no engine) ----------------------------------------------------------------


def test_bench_client(tmp_path):
    run_bench("bench.bench_client", "--iterations", "200", tmp_path=tmp_path)
    report = read_report(tmp_path, "client")
    assert isinstance(report["goal"], str) and isinstance(report["met"], bool)
    assert report["template"]["ref"] and isinstance(report["template"]["system_chars"], int)
    assert report["template"]["inputs"] == ["ticket", "tier"]
    for name in ("get_render_warm", "get_warm", "render", "request_body", "parse", "get_label_refresh", "get_cold",
                 "get_canary_key_render", "get_canary_key", "get_canary_random", "observe_prometheus",
                 "observe_prometheus_sink", "parse_observed"):
        numbers(report["results"][name], ("n", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "mean_us"), f"{name}.")
        assert report["results"][name]["n"] >= 1
    assert isinstance(report["canary_met"], bool) and report["sink_dropped"] == {}


# -- engine benchmarks ------------------------------------------------------------------------------


def check_side(side: Mapping[str, Any], where: str) -> None:
    numbers(side, ("wall_s", "requests_per_s", "completion_tokens", "valid_share"), where)
    for key in ("latency_ms", "ttft_ms"):
        numbers(side[key], ("p50", "p95", "n"), f"{where}{key}.")


@pytest.mark.engine
def test_bench_batching(tmp_path):
    # One block size other than the default (32), once: the smoke checks the engine ran at it.
    run_bench("bench.bench_batching", "--requests", "4", "--max-tokens", "4", "--block-sizes", "64", "--repeats", "1",
              tmp_path=tmp_path)
    report = read_report(tmp_path, "batching")
    assert report["requests"] == 4 and report["max_tokens"] == 4
    r = report["in_process"]
    check_identity(r["identity"])
    check_side(r["serial"], "serial.")
    check_side(r["batched"], "batched.")
    numbers(r, ("throughput_ratio",))
    assert r["identity"]["block_size"] == 32  # the CPU default promptdistill starts vLLM with
    (size,) = report["block_sizes"]["sizes"]
    assert size["block_size"] == size["engine_block_size"] == 64 and len(size["wall_s"]) == 1
    numbers(size, ("median_wall_s", "requests_per_s", "completion_tokens"))
    assert size["wall_ratio_to_last"] == 1.0 and size["cold_ttft_ms"]["n"] == 4
    assert "## KV block size" in (tmp_path / "bench" / "batching.md").read_text()


@pytest.mark.engine
def test_bench_reply_reminder(tmp_path):
    run_bench("bench.bench_reply_reminder", "ticket_triage", "--records", "4", tmp_path=tmp_path)
    report = read_report(tmp_path, "reply_reminder")
    (spec,) = report["specs"]
    assert spec["spec"] == "ticket_triage" and spec["reminder"].startswith("Reply with one JSON object")
    assert [r["prompt"] for r in spec["rows"]] == ["as written", "with reminder", "no examples",
                                                   "no examples, with reminder"]
    for row in spec["rows"]:
        numbers(row, ("mean", "n", "diff", "diff_low", "diff_high"), f"{row['prompt']}.")
        assert row["n"] == 4 and row["diff_low"] <= row["diff"] <= row["diff_high"]
    assert spec["rows"][0]["diff"] == 0.0
    assert "| ticket_triage | with reminder |" in (tmp_path / "bench" / "reply_reminder.md").read_text()


@pytest.mark.engine
def test_bench_prefix_cache(tmp_path):
    # ticket_triage's production template is a shorter winner (one rule, one example); the
    # other specs have none published, so only their baselines are timed.
    from promptdistill.registry import Registry
    from promptdistill.specs import examples_for, load_spec, template_content

    spec = load_spec(ROOT / "prompts" / "ticket_triage.yaml")
    shorter = spec.with_changes(constraints=spec.constraints[:1])
    Registry(tmp_path / "registry").publish("ticket_triage", template_content(shorter, examples_for(spec)[:1]),
                                            labels=["production"])
    run_bench("bench.bench_prefix_cache", "--block-sizes", "32", "--records", "2", "--repeats", "1",
              "--registry", str(tmp_path / "registry"), tmp_path=tmp_path)
    report = read_report(tmp_path, "prefix_cache")
    check_identity(report["identity"])
    (run,) = report["block_sizes"]
    assert run["block_size"] == 32 and run["identity"]["block_size"] == 32  # the engine ran with the asked size
    sides = ("measured_cold_ms", "measured_warm_ms", "static_cached_share", "static_prefix_tokens_timed")
    for name, row in run["specs"].items():
        numbers(row["baseline"], sides, f"{name}.baseline.")
        assert row["baseline"]["timing_n"] == 2 and ("winner" in row) == (name == "ticket_triage"), (name, row)
    winner, base = run["specs"]["ticket_triage"]["winner"], run["specs"]["ticket_triage"]["baseline"]
    numbers(winner, sides, "ticket_triage.winner.")
    assert winner["static_prefix_tokens_timed"] < base["static_prefix_tokens_timed"]
    # Whole 32-token blocks: a warm request finds its static prefix cached but for less than a block (and
    # at most a block more where the two records' inputs happen to start alike).
    for side in (winner, base):
        static = side["static_prefix_tokens_timed"]
        assert static - 32 < side["cached_tokens_warm"] < static + 32, side
    diff = run["specs"]["ticket_triage"]["difference"]
    numbers(diff, ("measured_cold_diff_ms", "measured_warm_diff_ms", "timing_pairs"), "difference.")
    assert "| 32 | ticket_triage |" in (tmp_path / "bench" / "prefix_cache.md").read_text()


@pytest.mark.engine
def test_bench_ttft_model(tmp_path):
    run_bench("bench.bench_ttft_model", "--budget-s", "120", "--points", "10", "--repeats", "1",
              "--out", str(tmp_path / "profiles"), tmp_path=tmp_path)
    report = read_report(tmp_path, "ttft_model")
    numbers(report, ("budget_s", "points", "repeats"))
    from promptdistill.registry.store import Registry

    # Published where the optimizer benchmarks and `promptdistill optimize` look.
    assert len(Registry(str(tmp_path / "registry")).artifact_names("ttft-model")) == 1
    r = report["by_backend"]["vllm-local"]
    assert isinstance(r["chosen"], str) and r["chosen"] in r["candidates"]
    numbers(r, ("heldout_mape", "heldout_r2", "p50_abs_err_ms", "p95_abs_err_ms"))
    assert isinstance(r["meets_target_10pct"], bool) and isinstance(r["meets_goal_5pct"], bool)
    assert isinstance(r["rows"], dict) and is_number(r["rows"]["rows_used"]) and is_number(r["rows"]["rows_contended"])
    numbers(r["profile"], ("measurements", "planned", "elapsed_s"), "profile.")
    assert r["profile"]["measurements"] >= 1 and isinstance(r["profile"]["stopped"], str)
    for name, scores in r["candidates"].items():
        assert scores and all(is_number(v) for v in scores.values()), name


OPTIMIZE_NUMBERS = ("minutes", "lm_calls", "tokens_processed", "margin", "warm_share", "baseline_instruction_tokens",
                    "winner_instruction_tokens", "baseline_total_tokens", "winner_total_tokens", "baseline_test_mean",
                    "winner_test_mean", "baseline_test_ci_low", "baseline_test_ci_high", "winner_test_n",
                    "baseline_measured_cold_ms", "baseline_measured_warm_ms", "winner_measured_cold_ms",
                    "winner_measured_warm_ms", "baseline_ttft_cold_ms", "winner_ttft_cold_ms")


@pytest.mark.engine
def test_bench_optimize(tmp_path, ttft_registry):
    run_bench("bench.bench_optimize", "ticket_triage", "--budget", "smoke", tmp_path=tmp_path, registry=ttft_registry)
    report = read_report(tmp_path, "optimize")
    numbers(report, ("total_minutes",))
    assert report["budget"] == "smoke"
    (row,) = report["specs"]
    assert row["spec"] == "ticket_triage"
    numbers(row, OPTIMIZE_NUMBERS, "ticket_triage.")
    assert isinstance(row["winner"], str) and isinstance(row["kept_baseline"], bool)
    assert isinstance(row["reason"], str) and row["reason"] and isinstance(row["warm_share_source"], str)
    number_or_none(row, ("race_records", "diff_lower", "diff_upper", "test_diff_mean"), "ticket_triage.")
    assert row["winner_test_n"] == 6
    assert (tmp_path / "state" / "bench" / "optimize" / "ticket_triage" / "result.json").is_file()
    assert "| ticket_triage |" in (tmp_path / "bench" / "optimize.md").read_text()


PEERS_SIDE = ("test_mean", "test_ci_low", "test_ci_high", "test_n", "lm_calls", "tokens_processed",
              "prompt_tokens_processed", "completion_tokens_processed", "search_tokens", "computed_tokens",
              "minutes", "prompt_tokens",
              "instruction_tokens", "ttft_cold_ms", "ttft_warm_ms")
PEERS_RATIOS = ("lm_calls_ours_over_peer", "tokens_processed_ours_over_peer", "computed_tokens_ours_over_peer",
                "search_tokens_ours_over_peer", "minutes_ours_over_peer",
                "prompt_tokens_ours_over_peer", "instruction_tokens_ours_over_peer", "ttft_cold_ms_ours_over_peer",
                "ttft_warm_ms_ours_over_peer", "quality_diff", "quality_diff_ci_low", "quality_diff_ci_high")


@pytest.mark.engine
def test_bench_peers(tmp_path, ttft_registry):
    run_bench("bench.bench_peers", "ticket_triage", "--budget", "smoke", "--train", "4", "--dev", "4", "--test", "4",
              "--num-threads", "4", "--max-bootstrapped-demos", "1", "--max-labeled-demos", "1",
              "--mipro-metric-threshold", "0.5",
              "--proposer-max-tokens", "96", "--gepa-metric-calls", "16", "--timing-records", "1",
              tmp_path=tmp_path, registry=ttft_registry)
    report = read_report(tmp_path, "peers")
    check_identity(report["identity"])
    config = report["config"]
    assert config["mipro_auto"] == "light" and isinstance(config["dspy_version"], str)
    assert isinstance(config["gepa_objectives_supported"], bool) and config["gepa_objectives"]
    peers = config["peers"]
    assert peers[:2] == ["mipro", "gepa"] and ("gepa_ttft" in peers) == config["gepa_objectives_supported"]
    r = report["specs"]["ticket_triage"]
    assert r["split"] == {"train": 4, "dev": 4, "test": 4}
    for side in ("ours", *peers):
        s = r["sides"][side]
        assert "error" not in s, f"{side}: {s.get('error')}\n{s.get('traceback')}"
        numbers(s, PEERS_SIDE, f"{side}.")
        assert s["test_n"] == 4 and s["lm_calls"] >= 1 and s["tokens_processed"] > 0 and s["prompt_tokens"] > 0
        assert 0 < s["computed_tokens"] <= s["search_tokens"]
        assert s["ttft_cold_ms"] > 0
        assert set(s["content"]) >= {"system", "user", "inputs", "response_format", "max_tokens"}
    ours = r["sides"]["ours"]
    numbers(ours, ("engine_calls", "engine_tokens_processed", "timing_requests"), "ours.")
    assert ours["phases"] and all(p["calls"] >= 1 for p in ours["phases"].values())
    assert sum(p["calls"] for p in ours["phases"].values()) == ours["engine_calls"]
    # The goal's count leaves the verification out (the peers' test scoring is not counted either).
    verified = ours["phases"]["optimize: test verification"]
    assert ours["search_tokens"] + ours["verification_tokens"]["search_tokens"] == ours["engine_tokens_processed"]
    assert ours["verification_tokens"]["search_tokens"] == verified["prompt_tokens"] + verified["completion_tokens"]
    for kind in peers:
        s = r["sides"][kind]
        numbers(s, ("program_test_mean", "test_eval_calls", "dspy_prompt_tokens"), f"{kind}.")
        assert s["export_checked"] == 4 and s["export_identical"] == 4 and s["export_differing"] == []
        assert isinstance(s["instruction"], str)  # as the peer wrote it (empty is a finding, not an error)
        c = r["comparisons"][kind]
        number_or_none(c, PEERS_RATIOS, f"{kind}.")
        numbers(c, ("quality_diff", "program_quality_diff"), f"{kind}.")
        assert c["peer_better"] in ("template", "program") and "program_scores" not in s
        assert isinstance(c["goal"]["met"], bool)
        assert all(v is None or isinstance(v, bool) for v in c["goal"].values())
    mipro = r["sides"]["mipro"]
    assert mipro["metric_threshold"] == 0.5 and 0 <= mipro["bootstrap_traces_kept"] <= mipro["bootstrap_traces_tried"]
    assert mipro["bootstrap_traces_tried"] >= 1
    assert "| ticket_triage | mipro |" in (tmp_path / "bench" / "peers.md").read_text()
    # The report line gives the JSON's tally, and names the attempts that raised exactly when there were any.
    tried, kept, failed = (mipro[f"bootstrap_traces_{k}"] for k in ("tried", "kept", "failed"))
    line = next(x for x in (tmp_path / "bench" / "peers.md").read_text().splitlines()
                if x.startswith("- mipro: bootstrapping kept "))
    assert line.startswith(f"- mipro: bootstrapping kept {kept} of {tried} traces tried (")
    assert (f"({failed} raised before scoring" in line) is (failed > 0)
    assert "on 4 of 4 test records, byte for byte" in (tmp_path / "bench" / "peers.md").read_text()
    assert r["commit"] == report["commit"] and r["timestamp"]

    # Runs made apart join into one table, each spec under the commit it was measured at.
    earlier = json.loads((tmp_path / "bench" / "peers.json").read_text())
    earlier["commit"], earlier["specs"] = "abc1234", {"word_problems": {**r, "commit": "stale"}}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    run_bench("bench.bench_peers", "--merge", str(tmp_path / "earlier.json"), str(tmp_path / "bench" / "peers.json"),
              tmp_path=tmp_path)
    merged = json.loads((tmp_path / "bench" / "peers.json").read_text())
    assert list(merged["specs"]) == ["word_problems", "ticket_triage"]
    assert merged["specs"]["word_problems"]["commit"] == "abc1234" and merged["commits"] == sorted({"abc1234", r["commit"]})
    text = (tmp_path / "bench" / "peers.md").read_text()
    assert "commit abc1234" in text and f"commit {r['commit']}" in text and "| word_problems | gepa |" in text


def test_peers_reports_of_other_settings_do_not_merge(tmp_path):
    from bench.peers.merge import merge_reports

    def report(path: Path, **config: Any) -> Path:
        body = {"commit": "abc1234", "timestamp": "t", "machine": {}, "identity": {"model": "m"},
                "config": {"budget": "quick", "peers": ["mipro"], **config}, "specs": {"s": {"minutes": 1.0, "sides": {"ours": {}}, "comparisons": {}}}}
        path.write_text(json.dumps(body))
        return path

    a, b = report(tmp_path / "a.json"), report(tmp_path / "b.json", budget="full")
    with pytest.raises(SystemExit, match=r"b.json: config.budget: 'full', .*a.json has 'quick'"):
        merge_reports([a, b])
    (tmp_path / "c.json").write_text("{")
    with pytest.raises(SystemExit, match=r"c.json: not a bench_peers report"):
        merge_reports([a, tmp_path / "c.json"])
    assert merge_reports([a, a])["specs"]["s"]["commit"] == "abc1234"


def test_the_checked_in_peers_report_merges_to_its_markdown_byte_for_byte():
    """``bench_peers --merge docs/bench/peers.json`` renders docs/bench/peers_2026-12-06.md exactly:
    the report code still reads the reports it wrote, and the goal recomputed agrees with them."""
    from bench.peers.merge import merge_reports
    from bench.peers.report import markdown

    merged = merge_reports([ROOT / "docs" / "bench" / "peers.json"])
    assert markdown(merged["specs"], merged["config"], merged["total_minutes"]) == (
        ROOT / "docs" / "bench" / "peers_2026-12-06.md").read_text()


def test_peers_of_one_spec_measured_apart_join_when_ours_agrees(tmp_path, capsys):
    """One spec's peers measured in separate runs (a long peer per session) share one table."""
    from bench.peers.merge import merge_reports
    from bench.peers.report import markdown

    measured = json.loads((ROOT / "docs" / "bench" / "peers.json").read_text())
    name, row = next((n, r) for n, r in measured["specs"].items() if {"mipro", "gepa"} <= set(r["comparisons"]))

    def run(path: Path, kind: str, commit: str, **ours: Any) -> Path:
        one = {**row, "sides": {"ours": {**row["sides"]["ours"], **ours}, kind: row["sides"][kind]},
               "comparisons": {kind: row["comparisons"][kind]}, "minutes": 10.0}
        body = {**{k: measured[k] for k in ("machine", "identity")}, "commit": commit, "timestamp": f"t-{commit}",
                "config": {**measured["config"], "peers": [kind]}, "specs": {name: one}}
        path.write_text(json.dumps(body))
        return path

    assert row["sides"]["ours"]["ttft_cold_ms"] < row["sides"]["mipro"]["ttft_cold_ms"]  # what the goal check below needs
    a = run(tmp_path / "a.json", "mipro", "aaa1111")
    # The later run timed ours slower than mipro (a noisy machine): mipro's goal stays judged within its own run.
    # It also counted a few more completion tokens: the row of ours in mipro's run shows that run's count.
    b = run(tmp_path / "b.json", "gepa", "bbb2222", ttft_cold_ms=row["sides"]["mipro"]["ttft_cold_ms"] + 1,
            tokens_processed=row["sides"]["ours"]["tokens_processed"] + 3)
    joined = merge_reports([a, b])
    r = joined["specs"][name]
    assert list(r["sides"]) == ["ours", "mipro", "gepa"] and list(r["comparisons"]) == ["mipro", "gepa"]
    assert r["sides"]["mipro"]["ours_in_run"]["ttft_cold_ms"] == row["sides"]["ours"]["ttft_cold_ms"]
    assert r["comparisons"]["mipro"]["goal"]["ttft_cold"] is (row["sides"]["ours"]["ttft_cold_ms"]
                                                             < row["sides"]["mipro"]["ttft_cold_ms"])
    assert joined["config"]["peers"] == ["mipro", "gepa"] and r["minutes"] == 20.0
    assert r["commit"] == "bbb2222" and r["sides"]["mipro"]["commit"] == "aaa1111" and "commit" not in r["sides"]["gepa"]
    text = markdown(joined["specs"], joined["config"], joined["total_minutes"])
    assert f"| {name} | mipro |" in text and f"| {name} | gepa |" in text and "mipro at commit aaa1111" in text
    beside = next(line for line in text.splitlines() if line.startswith("| ours, in mipro's run |"))
    assert f"| {row['sides']['ours']['tokens_processed']} (" in beside
    # Each run's minutes count once, however often a report is merged in.
    assert merge_reports([a, b, b])["specs"][name]["minutes"] == 20.0
    # A merged report merges again (the checked-in one, with a new run): each spec keeps its stamps.
    (tmp_path / "joined.json").write_text(json.dumps(joined))
    again = merge_reports([tmp_path / "joined.json"])
    assert again["specs"] == joined["specs"] and again["config"] == joined["config"]
    assert again["specs"][name]["comparisons"]["mipro"]["goal"] == r["comparisons"]["mipro"]["goal"]
    del joined["specs"][name]["commit"]
    (tmp_path / "joined.json").write_text(json.dumps(joined))
    with pytest.raises(SystemExit, match=rf"joined.json: not a bench_peers report \(no {name}.commit\)"):
        merge_reports([tmp_path / "joined.json"])

    # Another ours (another template, or another score) would pair the peers with different sides: not joined.
    c = run(tmp_path / "c.json", "gepa", "ccc3333", test_mean=row["sides"]["ours"]["test_mean"] + 0.01)
    apart = merge_reports([a, c])
    assert list(apart["specs"][name]["comparisons"]) == ["gepa"] and apart["config"]["peers"] == ["gepa"]
    assert f"c.json: {name}: ours differs from the run of mipro (commit aaa1111), so those rows are dropped" in capsys.readouterr().out


def test_make_bench_shows_progress_and_logs_the_rest(tmp_path, capsys):
    from bench.run_all import run

    script = ("import sys; print('FutureWarning: third-party noise'); print('» [spec] ours: done', flush=True); "
              "print('C++ line', file=sys.stderr); sys.exit(3)")
    log = tmp_path / "logs" / "fake.log"
    assert run([sys.executable, "-c", script], log, verbose=False) == 3
    out, err = capsys.readouterr()
    assert out == "  [spec] ours: done\n"  # only our progress line on the terminal
    assert "FutureWarning" in err and "C++ line" in err and str(log) in err  # a failure shows the log's tail
    assert log.read_text().splitlines() == ["FutureWarning: third-party noise", "» [spec] ours: done", "C++ line"]
    assert run([sys.executable, "-c", "print('all of it')"], log, verbose=True) == 0
    assert capsys.readouterr().out == "all of it\n"


def test_a_failed_peer_is_not_measured_against():
    from bench.peers.goal import better_side, goal

    ours = {"test_mean": 0.4, "prompt_tokens": 500, "ttft_cold_ms": 300.0, "computed_tokens": 40_000}
    peer = {"test_mean": 0.3, "test_ci_low": 0.2, "prompt_tokens": 400, "ttft_cold_ms": 250.0, "computed_tokens": 100_000}
    assert goal(ours, peer) == {"quality": True, "prompt_tokens": False, "ttft_cold": False,
                                "computed_tokens": False, "met": False}
    assert goal({**ours, "computed_tokens": 33_333}, peer)["computed_tokens"] is True
    # A peer whose DSPy program scores above its template is measured by its program (a team may serve it).
    served = {**peer, "program_test_mean": 0.45, "program_test_ci_low": 0.41}
    assert better_side(served) == "program" and better_side(peer) == "template"
    assert goal(ours, served)["quality"] is False and goal({**ours, "test_mean": 0.42}, served)["quality"] is True
    # Each side's interval counts: a template with the lower mean but a narrower interval still binds.
    narrow = {**peer, "test_mean": 0.44, "test_ci_low": 0.43, "program_test_mean": 0.45, "program_test_ci_low": 0.30}
    assert goal({**ours, "test_mean": 0.42}, narrow)["quality"] is False
    failed = {"error": "AdapterParseError: empty response", "computed_tokens": 120_000}
    assert goal(ours, failed) == {"quality": None, "prompt_tokens": None, "ttft_cold": None,
                                  "computed_tokens": None, "met": False}

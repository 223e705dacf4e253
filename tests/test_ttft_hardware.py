"""The hardware's limit: the matmul probe, the model's shape and the contention accounting
the profiler records (no engine). The FLOPs and the study's tables built from them are in
test_ttft_study.py."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from promptdistill.ttft.hardware import (
    ModelFlops,
    foreign_cpu_share,
    machine_busy_s,
    process_tree_cpu_s,
)

# SmolLM2-135M-Instruct's config.json (the embedded model).
SMOLLM2 = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}


def test_model_flops_count_the_parameters_of_smollm2():
    m = ModelFlops.from_config(SMOLLM2)
    # Per layer: q and o 576x576, k and v 576x192, gate/up/down 3 x 576x1536.
    assert m.matmul_params == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) == 106_168_320
    assert m.total_params == m.matmul_params + 49152 * 576 == 134_479_872  # "135M": tied embeddings
    assert m.attn_width == 576 and m.layers == 30
    assert ModelFlops.from_columns(pd.Series(m.columns())) == m
    assert ModelFlops.from_columns(pd.Series({"model_layers": 3})) is None


MATMUL_PROBE = """
import json, torch
from promptdistill.ttft.hardware import measure_matmul_peak
before = torch.get_num_threads()
peak = measure_matmul_peak(sizes=(64, 128), min_time_s=0.01, samples=2, threads=1)
print(json.dumps({"restored": torch.get_num_threads() == before, "gflops": peak.gflops,
                  "by_size": list(peak.by_size.values()), "gflops_1t": peak.gflops_1t,
                  "columns": sorted(peak.columns()), "by_kernel": peak.by_kernel, "kernel": peak.kernel}))
"""


def test_matmul_probe_measures_a_positive_rate_and_restores_threads():
    # In a fresh interpreter: once vLLM has bound torch's threads in a process (as the
    # session's engine does in this one), torch refuses thread changes and the one-thread
    # figure reads 'not measured' (NaN), which the report says.
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", MATMUL_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = json.loads(done.stdout.strip().splitlines()[-1])
    assert peak["restored"]
    assert peak["gflops"] == max(peak["by_size"]) > 0 and peak["gflops_1t"] > 0
    assert peak["columns"] == sorted({"hw_matmul_gflops", "hw_matmul_threads", "hw_matmul_gflops_1t",
                                      "hw_matmul_foreign_cpu_share", "hw_matmul_kernel"})
    # Every kernel torch offers is tried (BLAS, and oneDNN where torch has it): the best counts.
    assert "matmul" in peak["by_kernel"] and peak["gflops"] == max(peak["by_kernel"].values())
    assert peak["kernel"] in peak["by_kernel"]


@pytest.mark.skipif(machine_busy_s() is None, reason="needs /proc/stat")
def test_contention_accounting():
    assert foreign_cpu_share(None, 1.0, 0.0, 1.0) != foreign_cpu_share(None, 1.0, 0.0, 1.0)  # NaN: unknown
    cores = os.cpu_count() or 1
    assert foreign_cpu_share(10.0, 10.0 + cores, 0.0, 1.0) == pytest.approx(1.0)
    assert foreign_cpu_share(10.0, 11.0, 1.0, 1.0) == 0.0  # all the busy time was ours
    sum(i * i for i in range(300_000))  # some CPU time of our own
    assert process_tree_cpu_s((os.getpid(),)) > 0
    assert process_tree_cpu_s(()) == 0.0


@pytest.mark.parametrize("contended, waits", [
    ([False] * 6, [0]),                                   # idle: one window, before the first
    ([False, True, True, False, False, False], [0, 2, 3]),  # after each contended one
    ([True] * 3, [0, 1, 2]),                              # busy: before every measurement, as before
])
def test_the_profile_waits_for_a_quiet_cpu_only_when_the_machine_was_last_seen_busy(contended, waits):
    from promptdistill.ttft.profile import QuietGate

    waited: list[int] = []
    i = 0
    gate = QuietGate(lambda: waited.append(i))
    for i, busy in enumerate(contended):
        gate.before()
        gate.after(busy)
    assert waited == waits
    off = QuietGate(lambda: waited.append(-1), enabled=False)
    off.before()
    assert -1 not in waited


def test_run_profile_waits_for_a_quiet_cpu_at_the_start_and_after_each_contended_attempt(monkeypatch):
    """The gate wired into the profiler's loop: 4 units, the second contended once and the
    fourth twice (each retried); a window is waited for before the first attempt and after
    every contended one, never after a quiet one."""
    from types import SimpleNamespace

    import promptdistill.ttft.profile as prof

    shares = iter([0.0, 0.5, 0.0, 0.0, 0.5, 0.5, 0.0])  # foreign CPU share of each attempt
    events: list = []

    def measure(engine, unit, config, can_reset, own):
        share = next(shares)
        events.append(share)
        return [{"foreign_cpu_share": share, "ttft_ms": 1.0}]

    unit = SimpleNamespace(prompts=("p",), warm=False)
    monkeypatch.setattr(prof, "plan_units", lambda prompts, config: [unit] * 4)
    monkeypatch.setattr(prof, "measure_unit", measure)
    monkeypatch.setattr(prof, "wait_for_quiet", lambda *a, **k: events.append("wait") or True)
    monkeypatch.setattr(prof, "machine_busy_s", lambda: 1.0)
    monkeypatch.setattr(prof, "make_row", lambda *a: {"row": 1})
    monkeypatch.setattr(prof, "identity_columns", lambda engine: {})
    monkeypatch.setattr(prof, "_machine_columns", lambda engine: {})
    monkeypatch.setattr(prof, "summarize_points", lambda prompts: {})
    engine = SimpleNamespace(identity=SimpleNamespace(backend="vllm-local"), reset_prefix_cache=lambda: True,
                             generate=lambda requests: [])
    config = prof.ProfileConfig(warmup=0, max_retries=2, quiet_wait_s=5.0, matmul_probe=False)
    result = prof.run_profile(engine, config, out=None, progress=False,
                              prompts=[SimpleNamespace(point=SimpleNamespace(batch_id=None))])
    assert events == ["wait", 0.0, 0.5, "wait", 0.0, 0.0, 0.5, "wait", 0.5, "wait", 0.0]
    assert len(result.frame) == 7 and result.stopped == "complete"

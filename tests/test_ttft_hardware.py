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

    unit = SimpleNamespace(prompts=(SimpleNamespace(prompt_id="p"),), warm=False)
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
                              prompts=[SimpleNamespace(point=SimpleNamespace(batch_id=None), prompt_id="p")])
    assert events == ["wait", 0.0, 0.5, "wait", 0.0, 0.0, 0.5, "wait", 0.5, "wait", 0.0]
    assert len(result.frame) == 7 and result.stopped == "complete"


# ------------------------------------------------------- a profile sized in measurements
def _plan(n_prompts: int, warm: bool = False):
    """Units of ``n_prompts`` prompts measured alone (cold, and warm when asked), one round."""
    from types import SimpleNamespace

    from promptdistill.ttft.measure import Unit

    prompts = [SimpleNamespace(prompt_id=f"p{i}", point=SimpleNamespace(batch_id=None)) for i in range(n_prompts)]
    units = [Unit(0, (p,), False) for p in prompts] + ([Unit(0, (p,), True) for p in prompts] if warm else [])
    return prompts, units


class _ScriptedMachine:
    """The profiler's surroundings, scripted: each measurement's TTFT, error and foreign CPU
    share come from ``outcome(prompt_id, attempt_no)``; each measurement takes ``step_s`` on
    the fake clock, and a wait for a quiet CPU takes its whole ``quiet_wait_s`` when it runs out."""

    def __init__(self, monkeypatch, units, outcome, *, step_s: float = 1.0, quiet: bool = True):
        from tests.fakes import FakeClock

        import promptdistill.ttft.profile as prof

        self.clock, self.measured, self.waits = FakeClock(0.0), [], 0
        seen: dict[str, int] = {}

        def measure(engine, unit, config, can_reset, own):
            pid = unit.prompts[0].prompt_id
            seen[pid] = seen.get(pid, 0) + 1
            self.measured.append((pid, unit.round))
            self.clock.advance(step_s)
            ttft, error, share = outcome(pid, seen[pid])
            return [{"foreign_cpu_share": share, "ttft_ms": ttft, "error": error}]

        def wait(max_wait_s, *a, **k):
            self.waits += 1
            if not quiet:
                self.clock.advance(max_wait_s)
            return quiet

        monkeypatch.setattr(prof, "plan_units", lambda prompts, config: list(units))
        monkeypatch.setattr(prof, "measure_unit", measure)
        monkeypatch.setattr(prof, "wait_for_quiet", wait)
        monkeypatch.setattr(prof, "machine_busy_s", lambda: 1.0)
        monkeypatch.setattr(prof, "make_row", lambda *a: {"row": 1})
        monkeypatch.setattr(prof, "identity_columns", lambda engine: {})
        monkeypatch.setattr(prof, "_machine_columns", lambda engine: {})
        monkeypatch.setattr(prof, "summarize_points", lambda prompts: {})

    def run(self, prompts, **config):
        from types import SimpleNamespace

        import promptdistill.ttft.profile as prof

        engine = SimpleNamespace(identity=SimpleNamespace(backend="vllm-local"), reset_prefix_cache=lambda: True,
                                 generate=lambda requests: [])
        settings = prof.ProfileConfig(**{"warmup": 0, "matmul_probe": False, "repeats": 1, **config})
        return prof.run_profile(engine, settings, out=None, progress=False, prompts=prompts, clock=self.clock.monotonic)


def test_coverage_counts_successful_measurements_per_prompt_and_what_to_measure_again():
    from promptdistill.ttft.measure import Coverage

    prompts, units = _plan(4, warm=True)
    cov = Coverage(min_prompts=3, min_repeats=1)
    cov.add((prompts[0],), [{"ttft_ms": 90.0, "error": None, "foreign_cpu_share": 0.0}], contended=False)
    cov.add((prompts[1],), [{"ttft_ms": 300.0, "error": None, "foreign_cpu_share": 0.6}], contended=True)
    cov.add((prompts[2],), [{"ttft_ms": float("nan"), "error": "EngineError: boom"}], contended=False)
    cov.add((prompts[3],), [{"ttft_ms": 0.0, "error": None}], contended=False)  # no TTFT: the fit drops it
    assert (cov.rows, cov.failed, cov.contended, cov.prompts(), cov.clean_prompts()) == (4, 2, 1, 2, 1)
    assert not cov.met
    # One unit per prompt still short, cold before warm, as the round asked for.
    again = cov.shortfall(units, round_no=5)
    assert [(u.prompts[0].prompt_id, u.warm, u.round) for u in again] == [("p2", False, 5), ("p3", False, 5)]
    assert cov.describe() == ("4 measurements, 1 measured while other processes took the CPU (a median 60% of it), "
                              "2 failed; 2 prompts measured (1 on a quiet machine), of the 3 the fit needs")
    cov.add((prompts[2],), [{"ttft_ms": 80.0, "error": None}], contended=False)
    assert cov.met and cov.shortfall(units, round_no=6) == []
    assert Coverage(min_prompts=1, min_repeats=2).shortfall(units, 1)  # two each: every prompt is short


def test_a_busy_machine_measures_the_whole_design_and_reaches_the_minimum_without_endless_retries(monkeypatch):
    """Another process holds the CPU throughout: every measurement is contended and no wait finds
    a quiet window. The profile waits once, then at most every BUSY_RECHECK_WAITS waits' time,
    retries nothing meanwhile, measures the whole design and meets the fit's minimum; its note
    names the contention. Before, each unit took up to 3 attempts with a 10 s wait before each."""
    from promptdistill.ttft.profile import BUSY_RECHECK_WAITS

    prompts, units = _plan(30)
    machine = _ScriptedMachine(monkeypatch, units, lambda pid, n: (100.0, None, 0.5), quiet=False)
    result = machine.run(prompts, quiet_wait_s=10.0, max_retries=2)
    assert result.stopped == "complete" and result.minimum_met
    assert sorted(pid for pid, _ in machine.measured) == sorted(f"p{i}" for i in range(30))  # once each
    # 30 s of measuring and 10 s per wait: the first, then one each time the recheck span passed.
    assert machine.waits == 1 + int(machine.clock.monotonic() // (BUSY_RECHECK_WAITS * 10.0 + 10.0))
    assert machine.waits <= 2 and result.info["busy_waits"] == machine.waits
    assert result.note.startswith("TTFT profile measured the design in ")
    assert ("30 measurements, 30 measured while other processes took the CPU (a median 50% of it); "
            "30 prompts measured (0 on a quiet machine), of the 10 the fit needs") in result.note
    assert "the machine stayed busy through" in result.note


def test_a_contended_measurement_is_retried_when_the_machine_turns_quiet(monkeypatch):
    prompts, units = _plan(12)
    # Each prompt's first attempt is contended, the retry after a (successful) wait is quiet.
    machine = _ScriptedMachine(monkeypatch, units, lambda pid, n: (100.0, None, 0.5 if n == 1 else 0.0))
    result = machine.run(prompts, quiet_wait_s=10.0, max_retries=2)
    assert len(machine.measured) == 24 and result.minimum_met and result.stopped == "complete"
    assert result.info["busy_waits"] == 0 and "(12 on a quiet machine)" in result.note


def test_prompts_short_of_the_minimum_are_measured_again_after_the_design(monkeypatch):
    """Failed measurements leave 8 of 12 prompts: the profile measures the four again (a
    top-up pass) and meets the fit's 10; a prompt that fails every time ends the passes once one
    brings no prompt more, instead of measuring until the safety stop."""
    prompts, units = _plan(12)
    flaky = {"p0", "p1", "p2", "p3"}
    machine = _ScriptedMachine(monkeypatch, units, lambda pid, n: (
        (float("nan"), "EngineError: dropped", 0.0) if pid in flaky and n == 1 else (100.0, None, 0.0)))
    result = machine.run(prompts)
    assert result.minimum_met and result.info["top_up_passes"] == 1
    assert sorted(machine.measured[12:]) == [(p, 1) for p in sorted(flaky)]  # round 1: the top-up
    assert "16 measurements, 4 failed; 12 prompts measured, of the 10 the fit needs" in result.note

    prompts, units = _plan(12)
    dead = {"p0", "p1", "p2"}
    machine = _ScriptedMachine(monkeypatch, units, lambda pid, n: (
        (float("nan"), "EngineError: dropped", 0.0) if pid in dead else (100.0, None, 0.0)))
    result = machine.run(prompts)
    assert not result.minimum_met and result.stopped == "complete" and result.info["top_up_passes"] == 1
    assert len(machine.measured) == 15
    assert result.note.startswith("TTFT profile measured the design and the prompts short again in ")
    assert "9 prompts measured, of the 10 the fit needs" in result.note


def test_the_safety_stop_ends_the_profile_and_says_so_with_its_figures(monkeypatch):
    prompts, units = _plan(30)
    machine = _ScriptedMachine(monkeypatch, units, lambda pid, n: (100.0, None, 0.0), step_s=30.0)
    result = machine.run(prompts, max_minutes=4.0)
    assert result.stopped == "max_minutes" and not result.minimum_met and len(machine.measured) == 9
    assert result.note == ("TTFT profile stopped at the safety stop of 4 minutes in 270 s: 9 measurements; "
                           "9 prompts measured, of the 10 the fit needs")


def test_the_gate_stops_waiting_on_a_busy_machine_until_the_recheck_or_a_quiet_measurement():
    from promptdistill.ttft.profile import QuietGate
    from tests.fakes import FakeClock

    clock, waits = FakeClock(0.0), []
    gate = QuietGate(lambda: waits.append(clock.monotonic()) or False, recheck_s=60.0, clock=clock.monotonic)
    gate.before()                      # the first measurement: the wait runs out
    assert gate.busy and gate.timed_out == 1 and waits == [0.0]
    gate.after(True)
    clock.advance(30.0)
    gate.before()                      # still within the recheck span: no wait
    assert waits == [0.0] and gate.busy
    clock.advance(31.0)
    gate.before()                      # past it: wait again
    assert waits == [0.0, 61.0]
    gate.after(False)                  # a quiet measurement: not busy any more
    assert not gate.busy

"""The hardware's limit: measured dense matmul throughput and the model's shape.

A TTFT model says how long prefill takes; what this module records says how long it
*could* take. ``measure_matmul_peak`` times square float32 matrix products in the calling process (so a
benchmark measures the ceiling under the same conditions as its workload) with each dense
kernel torch offers, and keeps the fastest: the BLAS behind ``torch.matmul`` (MKL, which on
AMD CPUs takes a slower code path: about half of what the machine can do) and oneDNN
(``mkldnn``), the library vLLM's CPU build runs its linear layers on.
``ModelFlops`` reads a decoder-only transformer's shape from its ``config.json``: layers,
attention width, the weights of its linear layers, vocabulary.

The profiler records both beside every measurement (``hw_*``, ``model_*`` columns); the
TTFT study (``bench/ttft_study/analysis.py``) counts the FLOPs from the shape and sets
prefill throughput against the peak as ``flops / ttft / peak``: how far the engine is
from what this machine's arithmetic allows. The rest of this module tells whether the
machine is quiet enough to measure on.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = [
    "MatmulPeak",
    "ModelFlops",
    "foreign_cpu_share",
    "machine_busy_s",
    "measure_matmul_peak",
    "process_tree_cpu_s",
    "wait_for_quiet",
]


@dataclass(frozen=True)
class MatmulPeak:
    """Measured dense float32 matmul throughput of this machine.

    ``gflops`` is the best rate over the sizes tried, with every core busy (the
    ceiling); ``gflops_1t`` the same on one thread (NaN when torch's thread count is
    fixed, as in a process running vLLM's CPU worker, which binds its threads to cores).
    ``threads`` is the thread count torch actually ran with. ``by_size`` holds the best rate per
    matrix size (GFLOP/s).
    """

    gflops: float
    threads: int
    gflops_1t: float
    by_size: dict[int, float]
    foreign_cpu_share: float = float("nan")
    """Share of the machine's CPU other processes used while the probe ran (NaN: unknown)."""
    kernel: str = "matmul"
    """The kernel that reached the peak ('matmul': torch's BLAS; 'onednn')."""
    by_kernel: dict[str, float] | None = None
    """The best rate of each kernel tried (GFLOP/s)."""

    def columns(self) -> dict[str, Any]:
        """The figures as profile-row columns (``hw_*``)."""
        return {"hw_matmul_gflops": self.gflops, "hw_matmul_threads": self.threads,
                "hw_matmul_gflops_1t": self.gflops_1t, "hw_matmul_foreign_cpu_share": self.foreign_cpu_share,
                "hw_matmul_kernel": self.kernel}


def measure_matmul_peak(
    *, sizes: tuple[int, ...] = (512, 1024, 2048), threads: int | None = None, min_time_s: float = 0.2,
    samples: int = 3,
) -> MatmulPeak:
    """Time ``n x n @ n x n`` float32 products; the best rate is the machine's matmul peak.

    Each size and kernel is warmed up once, then timed ``samples`` times over at least
    ``min_time_s``; the best sample counts (the peak is what the hardware can do, and
    interruptions only ever slow a sample down). About ``len(sizes) x kernels x samples
    x min_time_s`` seconds with all threads, plus the two largest sizes on one thread.

    Args:
        sizes: matrix sizes to try.
        threads: torch threads for the all-core figure (default: every core).
        min_time_s: least time per timed sample.
        samples: timed samples per size.
    """
    # torch is imported here, not at module level: the report and the fit read profiles
    # without it, and importing it costs a second.
    import torch

    threads = threads or os.cpu_count() or 1
    before = torch.get_num_threads()
    if not _set_threads(torch, threads):
        threads = torch.get_num_threads()
    started, busy0, cpu0 = time.perf_counter(), machine_busy_s(), time.process_time()
    rates: dict[tuple[str, int], float] = {}
    try:
        for n in sizes:
            for name, kernel in _kernels(torch, n).items():
                rates[(name, n)] = _best_rate(torch, kernel, n, threads, min_time_s, samples)
        best_name = max(rates, key=rates.__getitem__)[0]
        one = float("nan")
        if _set_threads(torch, 1):  # vLLM's CPU worker refuses thread changes once it has bound its threads
            one = max(_best_rate(torch, _kernels(torch, n)[best_name], n, 1, min_time_s, max(2, samples - 1))
                      for n in sizes[-2:])
    finally:
        _set_threads(torch, before)  # vLLM in this process set its own thread count
    seconds = time.perf_counter() - started
    foreign = foreign_cpu_share(busy0, machine_busy_s(), time.process_time() - cpu0, seconds)
    by_size = {n: max(r for (_, m), r in rates.items() if m == n) for n in sizes}
    by_kernel = {k: max(r for (name, _), r in rates.items() if name == k) for k, _ in rates}
    return MatmulPeak(gflops=max(rates.values()), threads=threads, gflops_1t=one, by_size=by_size,
                      foreign_cpu_share=foreign, kernel=best_name, by_kernel=by_kernel)


def _kernels(torch: Any, n: int) -> dict[str, Callable[[], Any]]:
    """The dense float32 products to time, each a no-argument call on fixed ``n x n`` inputs."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen, dtype=torch.float32)
    b = torch.randn(n, n, generator=gen, dtype=torch.float32)
    out = torch.empty(n, n, dtype=torch.float32)
    kernels: dict[str, Callable[[], Any]] = {"matmul": lambda: torch.matmul(a, b, out=out)}
    linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if torch.backends.mkldnn.is_available() and linear is not None:
        try:
            linear(a, b, None, "none", [], "")  # oneDNN's linear: a @ b.T, as a vLLM linear layer runs
            kernels["onednn"] = lambda: linear(a, b, None, "none", [], "")
        except (RuntimeError, TypeError, AttributeError):  # a torch build without the op's CPU kernel
            pass
    return kernels


def _set_threads(torch: Any, threads: int) -> bool:
    """Ask torch for ``threads`` threads; True when it took them (vLLM in-process says no)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads() == threads


def _best_rate(torch: Any, kernel: Callable[[], Any], n: int, threads: int, min_time_s: float, samples: int) -> float:
    _set_threads(torch, threads)
    kernel()  # warm-up: kernel selection, page faults
    flops = 2.0 * n**3
    best = 0.0
    for _ in range(samples):
        reps, t0 = 0, time.perf_counter()
        while True:
            kernel()
            reps += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time_s:
                break
        best = max(best, flops * reps / elapsed / 1e9)
    return best


@dataclass(frozen=True)
class ModelFlops:
    """The shape of a decoder-only transformer its FLOPs are counted from (by the study:
    ``bench/ttft_study/analysis.py``)."""

    layers: int
    hidden: int
    attn_width: int
    """Query heads x head size: the width of ``QK^T`` and ``AV``."""
    matmul_params: int
    """Weights of the linear layers every token goes through (attention and MLP projections)."""
    total_params: int
    vocab: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelFlops":
        """From a Hugging Face ``config.json`` of a Llama-style model (q/k/v/o + gated MLP)."""
        d = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or d // heads)
        ff = int(config["intermediate_size"])
        vocab = int(config["vocab_size"])
        per_layer = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2 + 3 * d * ff
        embeddings = vocab * d * (1 if config.get("tie_word_embeddings", False) else 2)
        return cls(layers=layers, hidden=d, attn_width=heads * head_dim, matmul_params=per_layer * layers,
                   total_params=per_layer * layers + embeddings, vocab=vocab)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str]) -> "ModelFlops":
        return cls.from_config(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> "ModelFlops | None":
        """From a profile row's ``model_*`` columns (None when the profile lacks them)."""
        try:
            return cls(**{k: int(row[f"model_{k}"]) for k in cls.__dataclass_fields__})
        except (KeyError, TypeError, ValueError):
            return None

    def columns(self) -> dict[str, int]:
        """The figures as profile-row columns (``model_*``)."""
        return {f"model_{k}": v for k, v in asdict(self).items()}


# --- is the machine quiet? ---------------------------------------------------------------------


def machine_busy_s() -> float | None:
    """Seconds of CPU time the whole machine has spent busy since boot (None off Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user).
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def foreign_cpu_share(busy0: float | None, busy1: float | None, own_cpu_s: float, wall_s: float) -> float:
    """Other processes' CPU time over a span, as a share of the machine (NaN when unknown).

    ``own_cpu_s`` is the CPU time of everything measured (this process, and a server's
    processes when profiling one): the rest of the machine's busy time is foreign.
    """
    if busy0 is None or busy1 is None or wall_s <= 0:
        return float("nan")
    return max(0.0, (busy1 - busy0) - own_cpu_s) / (wall_s * (os.cpu_count() or 1))


def process_tree_cpu_s(pids: tuple[int, ...]) -> float:
    """CPU seconds (user + system) used so far by ``pids`` and all their descendants.

    A vLLM server is an API process plus an engine-core child: both are "ours" when the
    profiler measures through it. Processes that vanish while being read are skipped.
    """
    if not pids:
        return 0.0
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                # The command name may hold spaces: split after its closing parenthesis.
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    roots, total = set(pids), 0.0
    for pid in cpu:
        p, hops = pid, 0
        while p > 1 and hops < 64:
            if p in roots:
                total += cpu[pid]
                break
            p, hops = parent.get(p, 0), hops + 1
    return total


def wait_for_quiet(max_wait_s: float, max_share: float, window_s: float = 0.5,
                   own_pids: tuple[int, ...] = ()) -> bool:
    """Sleep until other processes use at most ``max_share`` of the CPU over a window.

    ``own_pids`` (and their children) count as this process. Returns False when
    ``max_wait_s`` passed without such a window (or off Linux).
    """
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        busy0, cpu0, wall0 = machine_busy_s(), _own_cpu_s(own_pids), time.perf_counter()
        if busy0 is None:
            return False
        time.sleep(window_s)
        share = foreign_cpu_share(busy0, machine_busy_s(), _own_cpu_s(own_pids) - cpu0, time.perf_counter() - wall0)
        if share <= max_share:
            return True
    return False


def _own_cpu_s(own_pids: tuple[int, ...]) -> float:
    return time.process_time() + process_tree_cpu_s(own_pids)

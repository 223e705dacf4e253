"""The TTFT profiler: measure the design's prompts on the real engine, one at a time.

Measurement protocol (what makes the numbers trustworthy):

* one request at a time, ``max_tokens`` 1 by default, greedy: TTFT is prefill alone;
* cold: the prefix cache is reset before the request (or, on a backend that cannot
  reset, the prompt gets a unique first line), so ``cached_tokens`` is 0;
* warm: after the reset, the prompt's static part (everything before the first input)
  is run first, so the request finds it in the cache, as in production where the
  static part is shared by every request;
* a few warm-up requests are run and discarded before anything is recorded;
* the order is interleaved: each round is a fresh random permutation of every
  (prompt, cold/warm) unit, so drift over time (thermal, other load) does not line up
  with any factor; rounds repeat the whole design;
* every single measurement is a row; nothing is averaged away here.

Contention. On a shared machine other processes can take the cores mid-request and
multiply a TTFT several times over (measured here: a 73-token prompt at 3.6 s instead
of 0.17 s while four other vLLM processes ran); that says nothing about the prompt.
Each measurement records ``foreign_cpu_share``: the CPU time the whole machine spent
outside this process during the request (from ``/proc/stat``), as a share of what all
cores could have given (wall time x cores). In-process, the engine's compute is inside
this process, so on an otherwise idle machine the share is near 0. A measurement whose
share exceeds ``max_foreign_cpu_share`` is flagged ``contended`` and measured again,
up to ``max_retries`` times. Before every measurement the profiler also waits (up to
``quiet_wait_s``, sleeping, so it adds no load) for a half-second in which the others
stay under that share. Every attempt is kept as a row;
fitting leaves out flagged rows and says how many. Other backends (a server, whose
compute is outside this process) and machines without ``/proc/stat`` are not checked.
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any, Callable, Sequence

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from promptdistill.core.errors import EngineError
from promptdistill.engine.base import Engine, GenerationRequest
from promptdistill.specs.prompt import format_example
from promptdistill.ttft.design import (
    BuiltPrompt,
    build_prompt,
    design_points,
    load_corpus,
    summarize_points,
    with_nonce,
)

__all__ = [
    "ProfileConfig",
    "ProfileResult",
    "identity_columns",
    "machine_busy_s",
    "wait_for_quiet",
    "plan_prompts",
    "run_profile",
    "write_parquet",
]


@dataclass(frozen=True)
class ProfileConfig:
    """What to measure and how much it may cost. Defaults take about 6 minutes here."""

    points: int = 40
    """Latin-hypercube sweep points (each measured cold, and warm when its static part allows)."""
    repeats: int = 2
    """Rounds over the whole design."""
    budget_s: float = 420.0
    """Stop cleanly (keeping every row measured) once this much time has passed."""
    min_tokens: int = 48
    max_tokens: int | None = None
    """Longest sweep prompt; None: the engine's context limit minus a margin."""
    density_probe_tokens: tuple[int, ...] = (256, 1024)
    fewshot_probe: bool = True
    spec_records: int = 2
    """Records per spec rendered as the spec renders them (0: skip spec profiling)."""
    warmup: int = 3
    """Requests run and discarded before measuring."""
    min_warm_static_tokens: int = 160
    """Measure a warm variant only when the static part has at least this many tokens
    (the CPU build caches whole 128-token blocks)."""
    new_tokens: int = 1
    """Tokens generated per request (1: prefill only)."""
    max_retries: int = 2
    """Re-measurements of a unit whose measurement was contended (in-process only)."""
    max_foreign_cpu_share: float = 0.2
    """Flag a measurement as contended when other processes used more than this share
    of the machine's CPU during it."""
    quiet_wait_s: float = 10.0
    """Before each measurement, wait up to this long for a moment when other processes
    leave the CPU alone (in-process only; 0: measure at once)."""
    prompts_dir: str = "prompts"
    seed: int = 0

    def validate(self) -> "ProfileConfig":
        for name in ("points", "spec_records", "warmup"):
            if getattr(self, name) < 0:
                raise ValueError(f"ProfileConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.repeats < 1:
            raise ValueError(f"ProfileConfig.repeats must be >= 1, got {self.repeats}")
        if self.budget_s <= 0:
            raise ValueError(f"ProfileConfig.budget_s must be positive, got {self.budget_s}")
        if self.min_tokens < 16:
            raise ValueError(f"ProfileConfig.min_tokens must be >= 16, got {self.min_tokens}")
        return self


@dataclass
class ProfileResult:
    frame: pd.DataFrame
    path: Path | None
    stopped: str
    """'complete', 'budget' or 'interrupted'."""
    planned_units: int
    elapsed_s: float
    info: dict[str, Any] = field(default_factory=dict)


def identity_columns(engine: Engine) -> dict[str, Any]:
    """The engine identity as row columns (``engine_*``), its short key and ``backend``."""
    ident = engine.identity
    cols = {f"engine_{k}": v for k, v in ident.to_dict().items()}
    cols["engine_key"] = ident.key()
    cols["backend"] = ident.backend
    return cols


def plan_prompts(engine: Engine, config: ProfileConfig) -> list[BuiltPrompt]:
    """Build every design point's prompt with the engine's own tokenizer and chat template."""
    corpus = load_corpus(config.prompts_dir)
    limit = engine.identity.max_model_len - max(48, config.new_tokens + 16)
    max_tokens = min(config.max_tokens or limit, limit)
    # The few-shot probe needs examples of at least ~64 tokens: take the spec whose
    # examples are longest.
    def example_tokens(spec: Any) -> float:
        lengths = [len(engine.tokenize(format_example(spec, r))) for r in corpus.train[spec.name][:10]]
        return median(lengths) if lengths else 0.0

    fewshot_spec = max(corpus.specs, key=example_tokens).name if config.fewshot_probe else None
    points = design_points(
        spec_names=[s.name for s in corpus.specs],
        n_sweep=config.points,
        min_tokens=config.min_tokens,
        max_tokens=max_tokens,
        seed=config.seed,
        density_probe_tokens=tuple(t for t in config.density_probe_tokens if t <= max_tokens),
        fewshot_probe_counts=(0, 1, 4, 8) if config.fewshot_probe else (),
        fewshot_spec=fewshot_spec,
        spec_records=config.spec_records,
        spec_fewshot={s.name: tuple(sorted({0, s.examples.count})) for s in corpus.specs},
    )
    return [build_prompt(p, corpus, engine) for p in points]


def _units(prompts: Sequence[BuiltPrompt], config: ProfileConfig) -> list[tuple[int, BuiltPrompt, bool]]:
    """(round, prompt, warm) in measuring order: every round is a fresh permutation."""
    base = []
    for p in prompts:
        base.append((p, False))
        # The probes stay cold: they isolate density and few-shot count, not the cache.
        if p.point.design in ("sweep", "spec") and p.features["static_prefix_tokens"] >= config.min_warm_static_tokens:
            base.append((p, True))
    rng = random.Random(config.seed)
    order = []
    for r in range(config.repeats):
        shuffled = list(base)
        rng.shuffle(shuffled)
        order += [(r, p, warm) for p, warm in shuffled]
    return order


def _measure(engine: Engine, built: BuiltPrompt, warm: bool, config: ProfileConfig, can_reset: bool) -> dict[str, Any]:
    cold_method = "reset"
    if not (can_reset and engine.reset_prefix_cache()):
        cold_method = "nonce"
        built = with_nonce(built, uuid.uuid4().hex[:12], engine)
    if warm:
        engine.generate([GenerationRequest(prompt=built.prompt_text[: built.static_chars], max_tokens=1, temperature=0.0)])
    request = GenerationRequest(messages=built.messages, max_tokens=config.new_tokens, temperature=0.0, seed=config.seed)
    load_1m = os.getloadavg()[0]
    busy0 = machine_busy_s()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    error = None
    try:
        result = engine.generate([request])[0]
    except EngineError as e:
        result, error = None, f"{type(e).__name__}: {e}"
    wall_ms = (time.perf_counter() - wall0) * 1000.0
    cpu_ms = (time.process_time() - cpu0) * 1000.0
    busy1 = machine_busy_s()
    foreign = float("nan")
    if busy0 is not None and busy1 is not None:
        foreign = max(0.0, (busy1 - busy0) * 1000.0 - cpu_ms) / (wall_ms * (os.cpu_count() or 1))
    cached = result.cached_tokens if result else 0
    return {
        **built.features,
        "prompt_tokens": result.prompt_tokens if result else None,
        "cached_tokens": cached,
        "uncached_tokens": built.features["total_tokens"] - cached,
        "ttft_ms": result.ttft_ms if result else float("nan"),
        "e2e_ms": result.e2e_ms if result else float("nan"),
        "completion_tokens": result.completion_tokens if result else 0,
        "wall_ms": wall_ms,
        "cpu_ms": cpu_ms,
        "cpu_wall_ratio": cpu_ms / max(1e-9, wall_ms),
        "foreign_cpu_share": foreign,
        "loadavg_1m": load_1m,
        "cold_method": cold_method,
        "error": error or (result.error if result else None),
    }


def run_profile(
    engine: Engine,
    config: ProfileConfig | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
    progress: bool = True,
    prompts: Sequence[BuiltPrompt] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ProfileResult:
    """Measure the design on ``engine`` and write every measurement to Parquet.

    Args:
        engine: the engine to profile (its identity is stamped on every row).
        config: sweep size and budget.
        out: a ``.parquet`` file, or a folder (a file named after the run is made in it);
            None: keep the frame in memory only.
        progress: a progress bar on stderr.
        prompts: prebuilt prompts (default: ``plan_prompts(engine, config)``).

    Returns:
        The frame (one row per measurement), where it was written, and why it stopped.
        Ctrl-C stops cleanly too: what was measured is written before returning.
    """
    config = (config or ProfileConfig()).validate()
    started = clock()
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
    prompts = list(prompts) if prompts is not None else plan_prompts(engine, config)
    units = _units(prompts, config)
    ident = identity_columns(engine)
    can_reset = bool(engine.reset_prefix_cache())
    check_contention = engine.identity.backend.endswith("local") and machine_busy_s() is not None
    path = _output_path(out, run_id)
    rows: list[dict[str, Any]] = []
    stopped = "complete"
    for i in range(config.warmup):  # discarded: first requests pay one-off costs
        engine.generate([GenerationRequest(messages=prompts[i % len(prompts)].messages, max_tokens=1)])
    bar = _progress(progress, len(units), summarize_points(prompts), config.budget_s)
    try:
        for unit_no, (round_no, built, warm) in enumerate(units):
            if clock() - started > config.budget_s:
                stopped = "budget"
                break
            for attempt in range(config.max_retries + 1):
                if check_contention and config.quiet_wait_s > 0:
                    wait_for_quiet(config.quiet_wait_s, config.max_foreign_cpu_share)
                row = _measure(engine, built, warm, config, can_reset)
                contended = check_contention and row["foreign_cpu_share"] > config.max_foreign_cpu_share
                p = built.point
                rows.append(
                    {
                        "run_id": run_id,
                        "seq": len(rows),
                        "unit": unit_no,
                        "round": round_no,
                        "repeat": round_no,
                        "attempt": attempt,
                        "point_id": p.point_id,
                        "design": p.design,
                        "spec": p.spec,
                        "prompt_id": built.prompt_id,
                        "warm": warm,
                        "target_tokens": p.target_tokens,
                        "density_knob": p.density_knob,
                        "static_share_target": p.static_share,
                        **row,
                        "contended": bool(contended),
                        **ident,
                        "timestamp": datetime.now(timezone.utc),
                    }
                )
                if not contended or clock() - started > config.budget_s:
                    break
            bar.advance(row["ttft_ms"], warm, contended)
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        bar.close()
        # Whatever stopped the run (the budget, Ctrl-C, an engine crash), keep what was measured.
        frame = pd.DataFrame(rows)
        if path is not None and not frame.empty:
            write_parquet(frame, path)
    return ProfileResult(
        frame=frame,
        path=path if not frame.empty else None,
        stopped=stopped,
        planned_units=len(units),
        elapsed_s=clock() - started,
        info={"cold_method": "reset" if can_reset else "nonce", **summarize_points(prompts)},
    )


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


def wait_for_quiet(max_wait_s: float, max_share: float, window_s: float = 0.5) -> bool:
    """Sleep until other processes use at most ``max_share`` of the CPU over a window.

    Returns False when ``max_wait_s`` passed without such a window (or off Linux).
    """
    deadline = time.monotonic() + max_wait_s
    cores = os.cpu_count() or 1
    while time.monotonic() < deadline:
        busy0, cpu0, wall0 = machine_busy_s(), time.process_time(), time.perf_counter()
        if busy0 is None:
            return False
        time.sleep(window_s)
        busy1 = machine_busy_s() or busy0
        foreign = max(0.0, (busy1 - busy0) - (time.process_time() - cpu0))
        if foreign / ((time.perf_counter() - wall0) * cores) <= max_share:
            return True
    return False


def _output_path(out: str | os.PathLike[str] | None, run_id: str) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    if path.suffix != ".parquet":
        path = path / f"profile-{run_id}.parquet"
    return path


def write_parquet(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write atomically: a temporary file in the same folder, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class _Bar:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, enabled: bool, total: int, summary: dict[str, Any], budget_s: float):
        self._progress = None
        if not enabled:
            return
        console = Console(file=sys.stderr)
        console.print(
            f"TTFT profile: {summary['prompts']} prompts, {total} measurements planned, "
            f"{summary['total_tokens'][0]}-{summary['total_tokens'][1]} tokens, budget {budget_s:.0f} s"
        )
        self._progress = Progress(
            TextColumn("measuring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"), console=console,
        )
        self._progress.start()
        self._task = self._progress.add_task("ttft", total=total, last="")

    def advance(self, ttft_ms: float, warm: bool, contended: bool) -> None:
        if self._progress is not None:
            note = " (contended)" if contended else ""
            self._progress.update(self._task, advance=1, last=f"last {ttft_ms:.0f} ms {'warm' if warm else 'cold'}{note}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _progress(enabled: bool, total: int, summary: dict[str, Any], budget_s: float) -> _Bar:
    return _Bar(enabled, total, summary, budget_s)

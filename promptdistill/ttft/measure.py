"""One measurement of the TTFT profile: a prompt alone (cold or warm), or a queue group.

Split from :mod:`promptdistill.ttft.profile`, whose docstring describes the protocol;
this module holds the units, the measuring of one unit, its rows, what the measurements
so far cover (``Coverage``: the profile's stopping rule), and the progress bar.
"""

from __future__ import annotations

import math
import os
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from statistics import median
from datetime import datetime, timezone
from typing import Any, Sequence

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from promptdistill.core.errors import EngineError
from promptdistill.engine.base import Engine, GenerationRequest
from promptdistill.ttft.design import BuiltPrompt, with_nonce
from promptdistill.ttft.hardware import (
    foreign_cpu_share,
    machine_busy_s,
    process_tree_cpu_s,
)

__all__ = ["Coverage", "Unit", "measure_unit", "progress_bar", "row", "units"]


@dataclass(frozen=True)
class Unit:
    """One measurement: a prompt alone (cold or warm), or a queue group sent together."""

    round: int
    prompts: tuple[BuiltPrompt, ...]
    warm: bool = False


def units(prompts: Sequence[BuiltPrompt], config: Any) -> list[Unit]:
    """Units in measuring order: every round is a fresh permutation."""
    base: list[tuple[tuple[BuiltPrompt, ...], bool]] = []
    groups: dict[str, list[BuiltPrompt]] = {}
    for p in prompts:
        if p.point.batch_id:
            groups.setdefault(p.point.batch_id, []).append(p)
            continue
        base.append(((p,), False))
        # The probes stay cold: they isolate density, few-shot count and size, not the cache.
        if p.point.design in ("sweep", "spec") and p.features["static_prefix_tokens"] >= config.min_warm_static_tokens:
            base.append(((p,), True))
    base += [(tuple(sorted(g, key=lambda b: b.point.batch_position)), False) for g in groups.values()]
    rng = random.Random(config.seed)
    order = []
    for r in range(config.repeats):
        shuffled = list(base)
        rng.shuffle(shuffled)
        order += [Unit(r, group, warm) for group, warm in shuffled]
    return order


@dataclass
class Coverage:
    """What the measurements so far give the fit: the profile measures until ``met``.

    A prompt counts once it has ``min_repeats`` successful measurements (a TTFT, no
    error). Contended ones count too: the profile retries them (a bounded number of
    times), and the fit keeps such rows when too few quiet ones remain, so on a machine
    that is never idle the minimum is still reached. ``clean_prompts`` tells how many
    prompts have that many quiet measurements.

    Example:
        >>> cov = Coverage(min_prompts=10, min_repeats=1)
        >>> cov.add(unit.prompts, measured, contended=False)   # doctest: +SKIP
        >>> cov.met, cov.shortfall(plan)                        # doctest: +SKIP
    """

    min_prompts: int
    min_repeats: int
    measured: Counter = field(default_factory=Counter)
    """prompt id -> successful measurements, contended ones included."""
    clean: Counter = field(default_factory=Counter)
    """prompt id -> successful measurements taken while the machine was quiet."""
    rows: int = 0
    failed: int = 0
    contended: int = 0
    contended_shares: list[float] = field(default_factory=list)
    """Other processes' CPU share during each contended measurement."""

    def add(self, prompts: Sequence[BuiltPrompt], measured: Sequence[dict[str, Any]], contended: bool) -> None:
        """Count one attempt's rows (one per prompt of the unit)."""
        for built, values in zip(prompts, measured):
            self.rows += 1
            ttft = values.get("ttft_ms")
            # The rows the fit can use (``fit.check_frame``): a positive TTFT and no error.
            if values.get("error") is not None or ttft is None or not math.isfinite(ttft) or ttft <= 0:
                self.failed += 1
                continue
            self.measured[built.prompt_id] += 1
            if contended:
                self.contended += 1
                share = values.get("foreign_cpu_share")
                if share is not None and math.isfinite(share):
                    self.contended_shares.append(float(share))
            else:
                self.clean[built.prompt_id] += 1

    def prompts(self) -> int:
        """Prompts with at least ``min_repeats`` successful measurements."""
        return sum(1 for n in self.measured.values() if n >= self.min_repeats)

    def clean_prompts(self) -> int:
        """Prompts with at least ``min_repeats`` quiet measurements."""
        return sum(1 for n in self.clean.values() if n >= self.min_repeats)

    @property
    def met(self) -> bool:
        return self.prompts() >= self.min_prompts

    def shortfall(self, plan: Sequence[Unit], round_no: int) -> list[Unit]:
        """Units to measure again until the minimum is met: one per prompt still short of
        ``min_repeats`` (its first unit alone in the plan, cold before warm), as round
        ``round_no``; empty when the minimum is met or the plan has no such prompt."""
        if self.met:
            return []
        chosen: dict[str, Unit] = {}
        for unit in sorted((u for u in plan if len(u.prompts) == 1), key=lambda u: u.warm):
            pid = unit.prompts[0].prompt_id
            if pid not in chosen and self.measured[pid] < self.min_repeats:
                chosen[pid] = Unit(round_no, unit.prompts, unit.warm)
        return list(chosen.values())

    def describe(self) -> str:
        """The figures in words: rows, contention, and prompts against the minimum."""
        contention = ""
        if self.contended:
            contention = (f", {self.contended} measured while other processes took the CPU (a median "
                          f"{median(self.contended_shares):.0%} of it)" if self.contended_shares
                          else f", {self.contended} measured under contention")
        failed = f", {self.failed} failed" if self.failed else ""
        quiet = f" ({self.clean_prompts()} on a quiet machine)" if self.contended else ""
        repeats = "" if self.min_repeats == 1 else f" {self.min_repeats} times"
        return (f"{self.rows} measurements{contention}{failed}; {self.prompts()} prompts measured{repeats}{quiet}, "
                f"of the {self.min_prompts} the fit needs")


def measure_unit(engine: Engine, unit: Unit, config: Any, can_reset: bool,
             own_pids: tuple[int, ...]) -> list[dict[str, Any]]:
    """Measure one unit; one row per request (a queue group gives several)."""
    cold_method = "reset"
    prompts = list(unit.prompts)
    if not (can_reset and engine.reset_prefix_cache()):
        cold_method = "nonce"
        prompts = [with_nonce(b, uuid.uuid4().hex[:12], engine) for b in prompts]
    if unit.warm:
        built = prompts[0]
        engine.generate([GenerationRequest(prompt=built.prompt_text[: built.static_chars], max_tokens=1, temperature=0.0)])
    requests = [GenerationRequest(messages=b.messages, max_tokens=config.new_tokens, temperature=0.0, seed=config.seed)
                for b in prompts]
    load_1m = os.getloadavg()[0]
    busy0, own0 = machine_busy_s(), process_tree_cpu_s(own_pids)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    error = None
    try:
        results: list[Any] = engine.generate(requests)
    except EngineError as e:
        results, error = [None] * len(requests), f"{type(e).__name__}: {e}"
    wall_ms = (time.perf_counter() - wall0) * 1000.0
    cpu_ms = (time.process_time() - cpu0) * 1000.0
    own_ms = cpu_ms + (process_tree_cpu_s(own_pids) - own0) * 1000.0
    foreign = foreign_cpu_share(busy0, machine_busy_s(), own_ms / 1000.0, wall_ms / 1000.0)
    uncached = [b.features["total_tokens"] - (r.cached_tokens if r else 0) for b, r in zip(prompts, results)]
    rows = []
    for i, (built, result) in enumerate(zip(prompts, results)):
        cached = result.cached_tokens if result else 0
        rows.append({
            **built.features,
            "prompt_tokens": result.prompt_tokens if result else None,
            "cached_tokens": cached,
            "uncached_tokens": built.features["total_tokens"] - cached,
            # A request alone has nothing ahead and no group: both 0, as the models assume.
            "tokens_ahead": sum(uncached[:i]) if len(prompts) > 1 else 0,
            "batch_tokens": sum(uncached) if len(prompts) > 1 else 0,
            "batch_size": len(prompts),
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
        })
    return rows


def row(run_id: str, seq: int, unit_no: int, unit: Unit, attempt: int, built: BuiltPrompt, measured: dict[str, Any],
         contended: bool, constant: dict[str, Any]) -> dict[str, Any]:
    p = built.point
    return {
        "run_id": run_id,
        "seq": seq,
        "unit": unit_no,
        "round": unit.round,
        "repeat": unit.round,
        "attempt": attempt,
        "point_id": p.point_id,
        "design": p.design,
        "spec": p.spec,
        "prompt_id": built.prompt_id,
        "split_group": p.batch_id or built.prompt_id,
        "batch_position": p.batch_position,
        "warm": unit.warm,
        "target_tokens": p.target_tokens,
        "density_knob": p.density_knob,
        "static_share_target": p.static_share,
        **measured,
        "contended": bool(contended),
        **constant,
        "timestamp": datetime.now(timezone.utc),
    }


class _Bar:
    """A rich progress bar on stderr (or nothing)."""

    def __init__(self, enabled: bool, total: int, summary: dict[str, Any], max_minutes: float):
        self._progress = None
        if not enabled:
            return
        console = Console(file=sys.stderr)
        console.print(
            f"TTFT profile: {summary['prompts']} prompts, {total} measurements planned, "
            f"{summary['total_tokens'][0]}-{summary['total_tokens'][1]} tokens, safety stop at {max_minutes:g} min"
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


def progress_bar(enabled: bool, total: int, summary: dict[str, Any], max_minutes: float) -> _Bar:
    return _Bar(enabled, total, summary, max_minutes)

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
* every single measurement is a row; nothing is averaged away here;
* queue groups (in-process only) are sent as one ``generate`` call, in order, after a
  cache reset: each row records the uncached tokens ahead of it and of the whole group.
  Over HTTP the client cannot say in which order, or in which engine step, concurrent
  requests reach the scheduler, so a server profile leaves the queue probe out.

Each profile also records what the models and the report need besides TTFT: the
engine's cache block and prefill chunk sizes (``cache_block_tokens``,
``prefill_chunk_tokens``), the model's arithmetic (``model_*``, from its config) and the
machine's dense matmul peak, measured in this process before and after the run
(``hw_matmul_gflops``: the better of the two; ``hw_*``).

Contention. On a shared machine other processes can take the cores mid-request and
multiply a TTFT several times over (measured here: a 73-token prompt at 3.6 s instead
of 0.17 s while four other vLLM processes ran); that says nothing about the prompt.
Each measurement records ``foreign_cpu_share``: the CPU time the whole machine spent
outside this process during the request (from ``/proc/stat``), as a share of what all
cores could have given (wall time x cores). In-process, the engine's compute is inside
this process, so on an otherwise idle machine the share is near 0. A measurement whose
share exceeds ``max_foreign_cpu_share`` is flagged ``contended`` and measured again,
up to ``max_retries`` times. Before the first measurement, and after a contended one, the
profiler also waits (up to ``quiet_wait_s``, sleeping, so it adds no load) for a
half-second in which the others stay under that share (``QuietGate``: after an
uncontended measurement the machine was just seen quiet, and a window before every
measurement made up 40% of a quick profile: 96 s of 241). A wait that runs out marks the
machine busy: until a measurement comes out quiet, or ``BUSY_RECHECK_WAITS`` waits' time
has passed, the profiler neither waits nor measures again (either would only cost time on
a machine that is never idle). Every attempt is kept as a row; fitting leaves out flagged
rows and says how many (and keeps them when too few quiet prompts remain). Through a
server, its processes' CPU time counts as ours when their ids are given (``own_pids``: the
server and its engine core); otherwise, and on machines without ``/proc/stat``, nothing is
checked.

Size. A profile is sized in measurements, not seconds: it measures the whole design, then,
while fewer than ``min_prompts`` prompts have ``min_repeats`` successful measurements (the
fit needs 10 prompts), it measures those prompts again (``Coverage``), as long as a pass
adds one. ``max_minutes`` is only a safety stop; the result says why the profile stopped
and what it had measured by then (``ProfileResult.note``). A busy machine measures the
same design, later.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any, Callable, Sequence

import pandas as pd

from promptdistill.core.jsonio import write_parquet
from promptdistill.core.settings import check, setting
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
from promptdistill.ttft.engine_info import (
    engine_mechanics,
    engine_model_flops,
    mechanics_columns,
)
from promptdistill.ttft.fit import MIN_FIT_PROMPTS
from promptdistill.ttft.hardware import (
    machine_busy_s,
    measure_matmul_peak,
    wait_for_quiet,
)
from promptdistill.ttft.measure import Coverage, measure_unit, progress_bar
from promptdistill.ttft.measure import row as make_row
from promptdistill.ttft.measure import units as plan_units

__all__ = [
    "BUSY_RECHECK_WAITS",
    "ProfileConfig",
    "ProfileResult",
    "QuietGate",
    "identity_columns",
    "machine_busy_s",
    "wait_for_quiet",
    "plan_prompts",
    "run_profile",
]


@dataclass(frozen=True)
class ProfileConfig:
    """What to measure, and the least the fit needs. Defaults take about 7 minutes on an idle 2-core machine."""

    points: int = setting(40, "Latin-hypercube sweep points (each measured cold, and warm when its static part "
                          "allows)", at_least=0)
    repeats: int = setting(3, "rounds over the whole design (the noise floor needs at least 2)", at_least=1)
    max_minutes: float = setting(30.0, "safety stop: end the profile after this many minutes even when the design or "
                                 "the minimum is not all measured (every row so far is kept; the result says why)",
                                 above=0)
    min_prompts: int = setting(MIN_FIT_PROMPTS, "after the design, measure again the prompts still short until this "
                               "many have min_repeats successful measurements (the fit needs 10)", at_least=1)
    min_repeats: int = setting(1, "successful measurements a prompt needs to count towards min_prompts", at_least=1)
    min_tokens: int = setting(48, "shortest sweep prompt", at_least=16)
    max_tokens: int | None = setting(None, "longest sweep prompt; unset: the engine's context limit minus a margin")
    density_probe_tokens: tuple[int, ...] = setting((256, 1024), "token counts of the density probe (fixed tokens, "
                                                    "varied density); empty: no probe")
    fewshot_probe: bool = setting(True, "measure the few-shot probe (0/1/4/8 examples)")
    spec_records: int = setting(2, "records per spec rendered as the spec renders them (0: skip spec profiling)",
                                at_least=0)
    ladder_tokens: tuple[int, ...] = setting((128, 256, 512, 1024, 2048), "cold prompts of these sizes (capped to "
                                             "the longest possible): throughput vs the hardware")
    # The defaults span one engine step and, past vLLM's 4096-token CPU chunk, two.
    queue_batches: tuple[tuple[int, int], ...] = setting(((4, 384), (8, 768), (3, 1536)), "groups sent together, "
                                                         "as (requests, tokens each); in-process only")
    matmul_probe: bool = setting(True, "measure the machine's matmul peak before and after (about 10 s each)")
    warmup: int = setting(3, "requests run and discarded before measuring", at_least=0)
    # vLLM caches whole blocks (32 tokens on the CPU build as promptdistill starts it, 128 as vLLM does).
    min_warm_static_tokens: int = setting(160, "measure a warm variant only when the static part has at least "
                                          "this many tokens")
    new_tokens: int = setting(1, "tokens generated per request (1: prefill only)")
    max_retries: int = setting(2, "re-measurements of a unit whose measurement was contended")
    max_foreign_cpu_share: float = setting(0.2, "flag a measurement as contended when other processes used more "
                                           "than this share of the machine's CPU during it")
    quiet_wait_s: float = setting(10.0, "before the first measurement and after a contended one, wait up to this "
                                  "many seconds for other processes to leave the CPU alone (0: measure at once)")
    prompts_dir: str = setting("prompts", "the specs profiled as they render")
    seed: int = setting(0, "seeds the sweep's design")

    def validate(self) -> "ProfileConfig":
        """This config, once every field is checked (raises ValueError naming the field)."""
        check(self)
        if any(count < 1 or tokens < 16 for count, tokens in self.queue_batches):
            raise ValueError(f"ProfileConfig.queue_batches must be (requests >= 1, tokens >= 16) pairs, got {self.queue_batches}")
        return self


@dataclass
class ProfileResult:
    frame: pd.DataFrame
    path: Path | None
    stopped: str
    """'complete', 'max_minutes' (the safety stop) or 'interrupted'."""
    planned_units: int
    elapsed_s: float
    info: dict[str, Any] = field(default_factory=dict)
    minimum_met: bool = True
    """At least ``min_prompts`` prompts have ``min_repeats`` successful measurements."""
    note: str = ""
    """How the profile ended, with its figures (rows, contention, prompts against the minimum)."""


def identity_columns(engine: Engine) -> dict[str, Any]:
    """The engine identity as row columns (``engine_*``), its short key and ``backend``."""
    ident = engine.identity
    cols = {f"engine_{k}": v for k, v in ident.to_dict().items()}
    cols["engine_key"] = ident.key()
    cols["backend"] = ident.backend
    return cols


def _in_process(engine: Engine) -> bool:
    return engine.identity.backend.endswith("local")


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
        ladder_tokens=config.ladder_tokens,
        queue_batches=config.queue_batches if _in_process(engine) else (),
    )
    built = []
    for p in points:
        prompt = build_prompt(p, corpus, engine)
        # A unique first line per queue request: no request of a group can reuse another's blocks.
        built.append(with_nonce(prompt, p.point_id, engine) if p.design == "queue" else prompt)
    return built


def run_profile(
    engine: Engine,
    config: ProfileConfig | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
    progress: bool = True,
    prompts: Sequence[BuiltPrompt] | None = None,
    clock: Callable[[], float] = time.monotonic,
    own_pids: Sequence[int] = (),
) -> ProfileResult:
    """Measure the design on ``engine`` and write every measurement to Parquet.

    Args:
        engine: the engine to profile (its identity is stamped on every row).
        config: the design's size, the minimum the fit needs, the safety stop.
        out: a ``.parquet`` file, or a folder (a file named after the run is made in it);
            None: keep the frame in memory only.
        progress: a progress bar on stderr.
        prompts: prebuilt prompts (default: ``plan_prompts(engine, config)``).
        own_pids: processes whose CPU time is part of the measurement (a local server
            and its children), so contention can be told apart from the engine's work.

    Returns:
        The frame (one row per measurement), where it was written, why it stopped and
        whether the fit's minimum was met (``note`` says both with the figures).
        Ctrl-C stops cleanly too: what was measured is written before returning.
    """
    config = (config or ProfileConfig()).validate()
    started = clock()
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]
    prompts = list(prompts) if prompts is not None else plan_prompts(engine, config)
    units = plan_units(prompts, config)
    own = tuple(int(p) for p in own_pids)
    constant = {**identity_columns(engine), **_machine_columns(engine)}
    can_reset = bool(engine.reset_prefix_cache())
    check_contention = (_in_process(engine) or bool(own)) and machine_busy_s() is not None
    peaks = [_peak(config, own)]
    path = _output_path(out, run_id)
    rows: list[dict[str, Any]] = []
    stopped = "complete"
    for i in range(config.warmup):  # discarded: first requests pay one-off costs
        engine.generate([GenerationRequest(messages=prompts[i % len(prompts)].messages, max_tokens=1)])
    bar = progress_bar(progress, len(units), summarize_points(prompts), config.max_minutes)
    gate = QuietGate(lambda: wait_for_quiet(config.quiet_wait_s, config.max_foreign_cpu_share, own_pids=own),
                     enabled=check_contention and config.quiet_wait_s > 0,
                     recheck_s=BUSY_RECHECK_WAITS * config.quiet_wait_s, clock=clock)
    coverage = Coverage(config.min_prompts, config.min_repeats)
    top_ups = 0

    def out_of_time() -> bool:
        return clock() - started > config.max_minutes * 60.0

    try:
        pending, unit_no, last_prompts = list(units), 0, 0
        while True:
            if not pending:
                # The design is measured: measure again the prompts still short of the minimum,
                # as long as the last pass brought one more prompt to it.
                before = coverage.prompts()
                pending = coverage.shortfall(units, config.repeats + top_ups)
                if not pending or (top_ups and before == last_prompts):
                    break
                top_ups, last_prompts = top_ups + 1, before
                continue
            if out_of_time():
                stopped = "max_minutes"
                break
            unit = pending.pop(0)
            for attempt in range(config.max_retries + 1):
                gate.before()
                measured = measure_unit(engine, unit, config, can_reset, own)
                contended = check_contention and measured[0]["foreign_cpu_share"] > config.max_foreign_cpu_share
                gate.after(contended)
                for built, values in zip(unit.prompts, measured):
                    rows.append(make_row(run_id, len(rows), unit_no, unit, attempt, built, values, contended, constant))
                coverage.add(unit.prompts, measured, contended)
                # On a busy machine a retry would only be contended again.
                if not contended or gate.busy or out_of_time():
                    break
            bar.advance(measured[-1]["ttft_ms"], unit.warm, contended)
            unit_no += 1
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        bar.close()
        if stopped != "interrupted":
            peaks.append(_peak(config, own))
        # Whatever stopped the run (the safety stop, Ctrl-C, an engine crash), keep what was measured.
        frame = pd.DataFrame(rows)
        if not frame.empty:
            frame = frame.assign(**_peak_columns(peaks))
        if path is not None and not frame.empty:
            write_parquet(path, frame)
    elapsed = clock() - started
    queue = "measured" if any(p.point.batch_id for p in prompts) else (
        "not planned" if _in_process(engine) else "left out: over HTTP the arrival order and engine step are not observable")
    return ProfileResult(
        frame=frame,
        path=path if not frame.empty else None,
        stopped=stopped,
        planned_units=len(units),
        elapsed_s=elapsed,
        info={"cold_method": "reset" if can_reset else "nonce", "queue_probe": queue,
              "matmul_gflops": [round(p.gflops, 1) for p in peaks if p is not None], "top_up_passes": top_ups,
              "busy_waits": gate.timed_out, **summarize_points(prompts)},
        minimum_met=coverage.met,
        note=_stop_note(stopped, coverage, elapsed, config, gate.timed_out),
    )


def _stop_note(stopped: str, coverage: Coverage, elapsed_s: float, config: ProfileConfig, busy_waits: int) -> str:
    """Why the profile ended and what it had measured by then, in one sentence."""
    how = {"complete": "measured the design" if coverage.met else "measured the design and the prompts short again",
           "max_minutes": f"stopped at the safety stop of {config.max_minutes:g} minutes",
           "interrupted": "interrupted"}[stopped]
    busy = (f"; the machine stayed busy through {busy_waits} wait(s) of {config.quiet_wait_s:g} s for a quiet CPU"
            if busy_waits else "")
    return f"TTFT profile {how} in {elapsed_s:.0f} s: {coverage.describe()}{busy}"


BUSY_RECHECK_WAITS = 6
"""On a machine found busy (a wait for a quiet CPU ran out), the next wait comes after this
many waits' time: at most a seventh of the profile goes to waiting."""


@dataclass
class QuietGate:
    """Waits for a quiet CPU before a measurement only when the machine was last seen busy:
    before the first measurement and after a contended one. An uncontended measurement has
    just shown the machine quiet, so waiting again would only sleep a window per row.

    A wait that runs out (``wait`` returns False) marks the machine ``busy`` for
    ``recheck_s``: no waits meanwhile, and the profiler does not retry contended
    measurements; a quiet measurement ends it early."""

    wait: Callable[[], Any]
    enabled: bool = True
    recheck_s: float = 0.0
    clock: Callable[[], float] = time.monotonic
    quiet: bool = False
    busy_until: float | None = None
    timed_out: int = 0
    """Waits that ran out without a quiet window."""

    @property
    def busy(self) -> bool:
        return self.busy_until is not None and self.clock() < self.busy_until

    def before(self) -> None:
        if not self.enabled or self.quiet or self.busy:
            return
        if self.wait() is False:
            self.timed_out += 1
            self.busy_until = self.clock() + self.recheck_s
        else:
            self.busy_until = None

    def after(self, contended: bool) -> None:
        self.quiet = not contended
        if self.quiet:
            self.busy_until = None


def _machine_columns(engine: Engine) -> dict[str, Any]:
    """Columns every row of this run shares: engine mechanics and the model's arithmetic."""
    cols: dict[str, Any] = mechanics_columns(engine_mechanics(engine))
    flops = engine_model_flops(engine)
    if flops is not None:
        cols.update(flops.columns())
    return cols


def _peak(config: ProfileConfig, own: tuple[int, ...]) -> Any:
    if not config.matmul_probe:
        return None
    if config.quiet_wait_s > 0:
        wait_for_quiet(config.quiet_wait_s, config.max_foreign_cpu_share, own_pids=own)
    return measure_matmul_peak()


def _peak_columns(peaks: list[Any]) -> dict[str, Any]:
    """The better probe counts (the peak is what the hardware can do); both are kept."""
    measured = [p for p in peaks if p is not None]
    if not measured:
        return {}
    best = max(measured, key=lambda p: p.gflops)
    return {**best.columns(), "hw_matmul_gflops_start": measured[0].gflops, "hw_matmul_gflops_end": measured[-1].gflops}


def _output_path(out: str | os.PathLike[str] | None, run_id: str) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    if path.suffix != ".parquet":
        path = path / f"profile-{run_id}.parquet"
    return path

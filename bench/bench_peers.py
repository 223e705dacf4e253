"""Side by side with DSPy's strongest optimizers: MIPROv2 and GEPA, same engine, records and metric.

The question a user asks: does ours reach the peers' quality with a shorter, faster prompt
and a fraction of the GPU work? Per spec (default ``invoice_extraction``, ``ticket_triage``,
``word_problems``), four sides run one after the other on the same engine:

* **ours**, as the nightly runs it: :func:`promptdistill.pipeline.stages.distill_stage`
  then :func:`~promptdistill.pipeline.stages.optimize_stage` with
  ``budget_preset(--budget)`` (default ``quick``), on a fresh LM cache;
* **mipro**: ``dspy.MIPROv2(auto="light")`` (instruction and demos);
* **gepa**: ``dspy.GEPA(auto="light")`` (instruction), the reflection LM being the same
  engine, the metric returning the spec's score with textual feedback (the expected and the
  produced output), as DSPy's GEPA documentation asks for;
* **gepa_ttft**: the same GEPA, its metric also returning ``objective_scores``: quality
  and minus the predicted expected TTFT of the instruction's template (the registry's TTFT
  model, as ours predicts it), with ``frontier_type="hybrid"``. Run only where the
  installed DSPy passes objective scores to GEPA (checked, and said in the report).

One split for every side (``search.splits.split_records``, the only split): the first
``--train`` train records (ours: the example pool; the peers: the trainset), ``--dev`` dev
records (ours: screening and the race; the peers: the valset) and ``--test`` test records,
drawn as the optimizer draws them. Ours runs on a copy of the spec whose dataset holds
exactly these records, so no side sees more data than another.

Ours is scored as a template on the test records by ``promptdistill.evaluate``
(constrained decoding, as the content says): what a service gets. A peer's program is
exported by ``bench.peer_export``: the messages JSONAdapter sends (its system message,
the demos as user/assistant turns, the user message with the inputs as placeholders),
its structured-output schema and the task LM's ``max_tokens``; the template's replies are
parsed as JSONAdapter parses them and scored by the program's metric. The template sends
the program's requests exactly: every run checks, on every test record, that the template
renders byte for byte the messages the adapter sent (``export_identical`` of
``export_checked``). Its score should then equal the program's own (reported beside it); a
difference left is the engine's (batches made differently) or the parse's. Ours is paired
with each of the two on the test records, and the goal asks ours to reach both. Its demo turns make it more than our registry's system +
user template: it is scored and timed here, not published.

Per side: test quality with a 95% bootstrap interval (and ours minus the peer, paired, with
its interval); LM calls and prompt/completion tokens processed (the peers: counted by the
DSPy bridge, below DSPy's cache; ours: from the stage results, and below our LM cache by a
meter that also splits them by phase); the search's tokens counted the same way for every
side at the engine (``search_tokens``: computed, i.e. prefilled past vLLM's prefix cache
plus completion, and prompt + completion; ours' held-out verification apart); wall
minutes; the resulting prompt's total tokens (the rendered chat prompt, served tokenizer,
mean over the test records) and instruction tokens (``Spec.instruction_text()``); measured
TTFT cold and warm (``optimize.verify.measure_ttft_interleaved``, one template at a time; a peer's by
``bench.peer_export.measure_ttft``, which renders its demo turns; every template one after
the other, after all runs).
Scoring the peers' programs and templates on test is not part of their cost, nor is ours'
held-out verification of the goal's count (it is reported beside it: the nightly does it).

A peer that fails or writes nonsense is reported as it is, with its own instruction.

Usage:
    python -m bench.bench_peers [invoice_extraction ticket_triage ...] [--budget quick]
        [--train 100] [--dev 100] [--test 100] [--peers mipro,gepa,gepa_ttft]
        [--gepa-metric-calls N] [--num-threads 16] [--timing-records 3] [--seed 0]
    python -m bench.bench_peers --merge run1/peers.json run2/peers.json   # one table from runs
        # made at different times (each spec keeps its commit); no LM call. One spec's peers
        # may come from separate runs (--peers mipro, then --peers gepa) when ours agrees
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

from bench.common import REPORT_DIR, commit, progress, setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402 - after the process defaults
from promptdistill.core.display import format_number  # noqa: E402
from promptdistill.core.jsonio import atomic_write, write_json  # noqa: E402
from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult  # noqa: E402
from promptdistill.specs.render import unescape_braces  # noqa: E402

DEFAULT_SPECS = ("invoice_extraction", "ticket_triage", "word_problems")
PEERS = ("mipro", "gepa", "gepa_ttft")
GOAL_TOKENS_SHARE = 1 / 3
"""Ours may compute at most this share of a peer's search tokens (``search_tokens``)."""
VERIFICATION_PHASE = "optimize: test verification"
"""Ours' held-out verification: reported apart, as the peers' test scoring is."""
RATIO_FIELDS = ("lm_calls", "tokens_processed", "search_tokens", "computed_tokens", "minutes", "prompt_tokens",
                "instruction_tokens", "ttft_cold_ms",
                "ttft_warm_ms")
# What would cut a phase's tokens (the report names the phases that spend the most).
PHASE_LEVERS = {
    "race": "the baseline and each finalist raced (in turn, the next only when the one before failed) are scored "
            "at each look of the certify records, so it scales with the records an undecided race reaches: a "
            "smaller pool (dev_size) when the plan says it cannot certify anyway cuts it",
    "test verification": "the baseline and the winner are each scored on every test record: scoring only the "
                         "winner (reusing the baseline's scores from an earlier night on the same template, engine "
                         "and records) would halve it; it scales with test_size",
    "ablations": "one pass over the screen records per clause the judge is unsure of (scored 2-4 or not at all): "
                 "fewer screen records cut it",
    "screening": "every grid candidate (instruction variants x example counts) on the screen records: fewer "
                 "variants or counts cut it in proportion",
    "output formats": "two more output formats on format_size records, a table only (constrained decoding is "
                      "published unless it gives less valid JSON): formats=False, as in the quick preset, removes it",
    "example sets": "several example sets per count on the screen records: fixed_subsets=1 removes the choice",
    "clause judge": "judge calls, one per unprotected clause (and repairs)",
    "rewrites": "judge calls, one per rewrite target (and repairs)",
    "calibration": "the equivalence judge on the baseline's screen replies: calibrate=False removes it",
    "held-out test": "the distiller's own test check: test_size=0 (as the nightly presets) removes it",
}


# -- counting -----------------------------------------------------------------------------------


class CallCounter(EngineWrapper):
    """Counts the generation requests that reach the engine (below each side's cache).

    A prompt longer than the context window would fail the whole batch it came in; it is
    answered alone with an empty reply and an error instead (zero tokens: the model never
    saw it), so one over-long proposer prompt fails one DSPy call, not its batch-mates.
    Such prompts are counted in ``rejected``, not ``calls``.
    """

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.calls = 0
        self.rejected = 0
        self.tokens = {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}
        """Of the results the engine returned: what ``search_tokens`` reads."""

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        from promptdistill.core.errors import PromptTooLongError

        try:
            results = self.engine.generate(requests, progress=progress)
        except PromptTooLongError:
            results = self._generate_fitting(requests, progress)
        else:
            self.calls += len(requests)
        add_tokens(self.tokens, results)
        return results

    def _generate_fitting(self, requests: Sequence[GenerationRequest], progress: bool) -> list[GenerationResult]:
        limit = self.identity.max_model_len
        sizes = [self.count_tokens(r.chat() if r.messages is not None else r.prompt) for r in requests]
        fits = [i for i, n in enumerate(sizes) if n < limit]  # the engine's own rule (it caps the output)
        done = dict(zip(fits, self.engine.generate([requests[i] for i in fits], progress=progress))) if fits else {}
        self.calls += len(fits)
        self.rejected += len(requests) - len(fits)
        return [done.get(i) or GenerationResult(
            text="", prompt_tokens=0, completion_tokens=0, cached_tokens=0, finish_reason="length", ttft_ms=0.0,
            e2e_ms=0.0, valid=False if req.json_schema or req.choices else None,
            error=f"prompt too long: {sizes[i]} tokens, max_model_len {limit}")
            for i, req in enumerate(requests)]


def add_tokens(totals: dict[str, int], results: Sequence[GenerationResult]) -> None:
    """Add the results' prompt, prefix-cached and completion tokens to ``totals``."""
    totals["prompt_tokens"] += sum(r.prompt_tokens for r in results)
    totals["cached_tokens"] = totals.get("cached_tokens", 0) + sum(r.cached_tokens for r in results)
    totals["completion_tokens"] += sum(r.completion_tokens for r in results)


def search_tokens(rows: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Tokens of the requests that reached the engine, counted the same way for every side:
    ``search_tokens`` (prompt + completion) and ``computed_tokens`` (the prompt tokens the
    engine prefilled, i.e. not served by its prefix cache, + completion)."""
    prompt, completion = sum(r["prompt_tokens"] for r in rows), sum(r["completion_tokens"] for r in rows)
    cached = sum(r.get("cached_tokens", 0) for r in rows)
    return {"search_tokens": prompt + completion, "computed_tokens": prompt - cached + completion}


# Where ours spends its tokens: (file, function) of the stack, innermost first, -> phase.
_PHASE_FRAMES = (
    ("distill/loop.py", "calibrate", "calibration"),
    ("distill/loop.py", "rewrites", "rewrites"),
    ("distill/loop.py", "held_out", "held-out test"),
    ("search/racing.py", "race", "race"),
    ("search/racing.py", "screen", "screening"),
    ("distill/loop.py", "score_clauses", "ablations"),
    ("optimize/run.py", "choose_fixed_sets", "example sets"),
    ("optimize/finish.py", "choose_format", "output formats"),
    ("optimize/finish.py", "finish", "test verification"),
)


def phase_of_stack() -> str:
    """``stage: phase`` of the generate call being made, read from the call stack.

    The stages report one total; the stack says which step asked (the distiller's clause
    judge, ablations, rewrites; either stage's screening and race; the optimizer's example
    sets, output formats and test verification). A judge call is named after the step that
    called the judge.
    """
    frames: list[tuple[str, str]] = []
    f = sys._getframe(1)
    while f is not None:
        frames.append((f.f_code.co_filename.replace(os.sep, "/"), f.f_code.co_name))
        f = f.f_back
    stage = ("distill" if any(p.endswith("distill/loop.py") for p, _ in frames)
             else "optimize" if any("/optimize/" in p for p, _ in frames) else "other")
    judge = False
    for path, func in frames:
        if path.endswith("judges/runner.py"):
            judge = True
            continue
        for suffix, name, phase in _PHASE_FRAMES:
            if path.endswith(suffix) and func == name:
                if phase == "ablations" and judge:
                    return f"{stage}: clause judge"
                return f"{stage}: {phase}" + (" (judge)" if judge and phase != "rewrites" else "")
    return f"{stage}: other" + (" (judge)" if judge else "")


class PhaseMeter(EngineWrapper):
    """Counts requests and tokens that reach the engine, per phase of our search (see ``phase_of_stack``)."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.phases: dict[str, dict[str, int]] = {}

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        phase = phase_of_stack()
        results = self.engine.generate(requests, progress=progress)
        row = self.phases.setdefault(phase, {"calls": 0, "prompt_tokens": 0, "cached_tokens": 0,
                                             "completion_tokens": 0})
        row["calls"] += len(requests)
        add_tokens(row, results)
        return results

    def total(self, key: str) -> int:
        return sum(row[key] for row in self.phases.values())


# -- one split for every side ----------------------------------------------------------------------


def bench_split(spec: Any, n_train: int, n_dev: int, n_test: int, seed: int) -> dict[str, list[dict]]:
    """The records every side gets, drawn by the optimizer's own split (dev and test shuffled by ``seed``)."""
    from promptdistill.search.splits import split_records

    s = split_records(spec, seed=seed, screen_size=1, dev_size=n_dev, test_size=n_test)
    return {"train": list(s.train[:n_train]), "dev": list(s.dev), "test": list(s.test)}


def subset_job(spec: Any, split: Mapping[str, Sequence[dict]], folder: Path) -> Any:
    """A copy of the spec file whose dataset holds exactly the split's records (what ours may see)."""
    from promptdistill.pipeline.jobs import prepare_job
    from promptdistill.specs.datasets import write_records

    (folder / "prompts").mkdir(parents=True, exist_ok=True)
    write_records(folder / "datasets" / spec.dataset.name, [*split["train"], *split["dev"], *split["test"]])
    path = folder / "prompts" / f"{spec.name}.yaml"
    shutil.copyfile(spec.source_path, path)
    return prepare_job(path)


# -- templates: every side exported and scored the same way -----------------------------------------


def literal_spec(spec: Any, instruction: str, **changes: Any) -> Any:
    """``spec`` with ``changes`` and ``instruction`` as literal system text.

    A peer's instruction may mention an input in braces (``{ticket}``); the spec check
    refuses that (an author's misplaced input), but here it is the peer's literal output,
    which ``build_system`` escapes, so it renders verbatim: the check is skipped for it.
    """
    out = spec.with_changes(instruction="(instruction)", **changes)
    object.__setattr__(out, "instruction", instruction)
    return out


def peer_spec(spec: Any, instruction: str, demos: Sequence[Mapping[str, Any]]) -> Any:
    """A DSPy program as a spec: its instruction is the whole system text, its demos fixed examples."""
    examples = dataclasses.replace(spec.examples, count=len(demos), selection="first", ids=())
    return literal_spec(spec, instruction, context=None, constraints=(), examples=examples)


def content_spec(spec: Any, content: Mapping[str, Any]) -> Any:
    """The spec that renders exactly ``content`` (its system text literal, no separate examples)."""
    system = unescape_braces(content["system"])  # build_system's escaping, undone
    examples = dataclasses.replace(spec.examples, count=0, selection="first", ids=())
    return literal_spec(spec, system, context=None, constraints=(), examples=examples, user=content["user"],
                        output_schema=content["output_schema"], max_tokens=content["max_tokens"])


def template_scores(engine: Engine, spec: Any, content: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                    seed: int) -> dict[str, Any]:
    """The template scored on ``records`` as a service would use it, and its prompt tokens.

    Rendering is checked first: the spec evaluated renders every record exactly as the
    content does (``render_messages``, the client's path).
    """
    from promptdistill.core.stats import bootstrap_ci
    from promptdistill.evaluate import evaluate
    from promptdistill.optimize.verify import check_rendering
    from promptdistill.specs.render import render_messages

    cspec = content_spec(spec, content)
    check_rendering(content, cspec, [], records)
    report = evaluate(engine, cspec, records, constrained=content["response_format"] == "json_schema",
                      max_tokens=content["max_tokens"], seed=seed)
    ci = bootstrap_ci(report.scores, seed=seed)
    tokens = [engine.count_tokens(render_messages(content["system"], content["user"], r["inputs"])) for r in records]
    return {"test_mean": ci.mean, "test_ci_low": ci.low, "test_ci_high": ci.high, "test_n": ci.n,
            "test_valid_json_rate": report.valid_json_rate,
            "prompt_tokens": round(statistics.fmean(tokens), 1) if tokens else None, "scores": report.scores}


def peer_template_scores(engine: Engine, spec: Any, content: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                         seed: int) -> dict[str, Any]:
    """A peer's exported program (``bench.peer_export``) scored on ``records``: its requests,
    its replies parsed as its adapter parses them, and the program's metric (``spec_score``:
    a reply the adapter refuses scores 0, as the program's failure score)."""
    from bench.peer_export import ParseError, parse_reply, render, requests
    from promptdistill.core.stats import bootstrap_ci
    from promptdistill.evaluate.evaluator import BATCH_TIMEOUT_S

    # Through CallCounter as the program's evaluation was: a prompt over the context window
    # gets an empty reply (0, as the program's failed call) instead of failing the batch.
    results = CallCounter(engine).generate(requests(content, records, seed=seed, timeout_s=BATCH_TIMEOUT_S))
    scores, parsed = [], []
    for r, res in zip(records, results):
        try:
            fields: Mapping[str, Any] = parse_reply(content, res.text)
        except ParseError:
            fields = {}
        parsed.append(bool(fields))
        scores.append(spec_score(spec, to_example(spec, r), fields)[0])
    ci = bootstrap_ci(scores, seed=seed)
    tokens = [engine.count_tokens(render(content, r["inputs"])) for r in records]
    return {"test_mean": ci.mean, "test_ci_low": ci.low, "test_ci_high": ci.high, "test_n": ci.n,
            "test_valid_json_rate": statistics.fmean(parsed) if parsed else None,
            "prompt_tokens": round(statistics.fmean(tokens), 1) if tokens else None, "scores": scores}


def ttft_figures(engine: Engine, model: Any, spec: Any, content: Mapping[str, Any],
                 records: Sequence[Mapping[str, Any]], *, n: int, block_tokens: int, label: str,
                 seed: int) -> dict[str, Any]:
    """Measured TTFT cold and warm (``measure_ttft_interleaved``, the optimizer's own function, on this one
    template), means over ``n`` records."""
    from promptdistill.optimize.verify import TimedTemplate, measure_ttft_interleaved

    template = TimedTemplate(label, content, content_spec(spec, content), [], records)
    rows = measure_ttft_interleaved(engine, [template], model=model, n=n, repeats=1, block_tokens=block_tokens,
                                    seed=seed)

    def mean(cache: str) -> float | None:
        sel = [r["ttft_ms"] for r in rows if r["cache"] == cache]
        return round(statistics.fmean(sel), 1) if sel else None

    return {"ttft_cold_ms": mean("cold"), "ttft_warm_ms": mean("warm"), "timing_n": len(rows) // 2}


# -- ours ----------------------------------------------------------------------------------------------


def fresh(path: Path) -> Path:
    """``path`` with any previous file or folder (and SQLite side files) removed: a run starts cold."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    return path


def sized_preset(name: str, n_dev: int, n_test: int) -> dict[str, Any]:
    """The nightly's budget preset, its record counts set to the benchmark's split (everything else as is)."""
    from promptdistill.pipeline.budgets import budget_preset

    preset = budget_preset(name)
    return {**preset, "distill": dataclasses.replace(preset["distill"], dev_size=n_dev),
            "budget": dataclasses.replace(preset["budget"], dev_size=n_dev, test_size=n_test)}


def run_ours(engine: Engine, model: Any, job: Any, preset: Mapping[str, Any], seed: int,
             folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Distill then optimize through the pipeline stages; returns (figures, the optimizer's result)."""
    from promptdistill.optimize.select import SelectionRule
    from promptdistill.pipeline.stages import distill_stage, optimize_stage

    meter = PhaseMeter(engine)
    cache = fresh(folder / "lm_cache.sqlite")
    started = time.monotonic()
    distilled = distill_stage(meter, job, config=preset["distill"], seed=seed, out_dir=fresh(folder / "distill"),
                              cache_path=cache)
    result = optimize_stage(meter, job, ttft_model=model, budget=preset["budget"],
                            selection=preset.get("selection", SelectionRule()), seed=seed, distilled=distilled,
                            out_dir=fresh(folder / "optimize"), cache_path=cache)
    minutes = (time.monotonic() - started) / 60.0
    d, w = distilled["summary"], result["winner"]
    if "{fewshot}" in result["content"]["user"]:
        raise RuntimeError("the winner has per-request examples; this benchmark scores static templates only")
    stage_tokens = {"distill": d["tokens_processed"], "optimize": result["prompt_tokens"] + result["completion_tokens"]}
    phases = {k: dict(v) for k, v in sorted(meter.phases.items())}
    figures = {
        "winner": result["winner_id"], "kept_baseline": result["kept_baseline"], "reason": result["reason"],
        "distill_winner": d["winner"], "distill_finalists": d["finalists"],
        "minutes": round(minutes, 3), "stage_minutes": {"distill": round(d["elapsed_s"] / 60.0, 3),
                                                         "optimize": round(result["minutes"], 3)},
        # The stage results count every request asked for (through the LM cache): the headline.
        "lm_calls": d["total_lm_calls"] + result["lm_calls"],
        "tokens_processed": sum(stage_tokens.values()), "stage_tokens": stage_tokens,
        # What reached the engine (cache misses), split by phase: prompt and completion apart.
        "engine_calls": meter.total("calls"), "prompt_tokens_processed": meter.total("prompt_tokens"),
        "completion_tokens_processed": meter.total("completion_tokens"),
        "engine_tokens_processed": meter.total("prompt_tokens") + meter.total("completion_tokens"),
        # The search alone (the peers' cost is their compile): every phase but the verification.
        **search_tokens([row for phase, row in phases.items() if phase != VERIFICATION_PHASE]),
        "verification_tokens": search_tokens([phases.get(VERIFICATION_PHASE, {"prompt_tokens": 0,
                                                                              "completion_tokens": 0})]),
        "timing_requests": result["timing_requests"], "phases": phases,
        "instruction_tokens": None if w.get("instruction_tokens") is None else round(w["instruction_tokens"]),
        "stage_test_mean": w.get("test_mean"), "stage_test_n": w.get("test_n"),
        "stop": result.get("stop_reason"), "folder": str(folder),
    }
    return figures, result


# -- the DSPy side -------------------------------------------------------------------------------------


_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def output_fields(spec: Any) -> dict[str, Any] | None:
    """name -> Python type of the spec's output schema properties; None: a free-text ``answer``."""
    schema = spec.output_schema or {}
    props = schema.get("properties") if schema.get("type") == "object" else None
    if not props:
        return None
    return {name: Literal[tuple(prop["enum"])] if "enum" in prop else _JSON_TYPES.get(prop.get("type"), str)  # type: ignore[misc]
            for name, prop in props.items()}


def start_instruction(spec: Any) -> str:
    """The spec's system text without examples (instruction, context, rules): where the peers start, as ours does."""
    from promptdistill.specs import build_system
    from promptdistill.specs.render import render_text

    return render_text(build_system(spec, ()), {})


def make_signature(spec: Any) -> Any:
    import dspy

    fields: dict[str, Any] = {n: (str, dspy.InputField(desc=spec.input_descriptions.get(n) or n)) for n in spec.inputs}
    for name, typ in (output_fields(spec) or {"answer": str}).items():
        fields[name] = (typ, dspy.OutputField())
    return dspy.Signature(fields, start_instruction(spec))


def to_example(spec: Any, record: Mapping[str, Any]) -> Any:
    import dspy

    outs = output_fields(spec)
    expected = record["expected"]
    labels = {k: expected[k] for k in outs if k in expected} if outs and isinstance(expected, Mapping) else {
        "answer": expected if isinstance(expected, str) else json.dumps(expected)}
    return dspy.Example(**record["inputs"], **labels).with_inputs(*spec.inputs)


def reply_of(spec: Any, pred: Any) -> str:
    """A DSPy prediction as the reply text the spec's metric scores (the output fields' JSON)."""
    outs = output_fields(spec)
    try:
        if outs:
            return json.dumps({k: pred[k] for k in outs}, ensure_ascii=False)
        return str(pred["answer"])
    except (KeyError, AttributeError, TypeError):
        return ""


def expected_of(spec: Any, example: Any) -> Any:
    outs = output_fields(spec)
    return {k: example[k] for k in outs if k in example} if outs else example["answer"]


def spec_score(spec: Any, example: Any, pred: Any) -> tuple[float, str, Any]:
    """(the spec's score, the reply scored, the expected output): the one metric of every side."""
    from promptdistill.specs.metrics import score_reply

    reply, expected = reply_of(spec, pred), expected_of(spec, example)
    score = score_reply(spec.metric, reply, expected, output_schema=spec.output_schema)
    return float(score or 0.0), reply, expected


class BootstrapTally(logging.Handler):
    """How many traces MIPROv2's bootstrapping tried, and how many it kept.

    The metric counts the traces it scores (it is called with a trace only while bootstrapping).
    An attempt whose program raised, such as a reply the adapter cannot parse, never reaches the
    metric: DSPy's ``BootstrapFewShot`` logs it as an error, and this handler, attached to that
    logger by ``watching``, counts it as ``failed``. ``tried`` is both.
    """

    LOGGER = "dspy.teleprompt.bootstrap"

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.scored = 0
        self.kept = 0
        self.failed = 0

    @property
    def tried(self) -> int:
        return self.scored + self.failed

    def emit(self, record: logging.LogRecord) -> None:
        if record.funcName == "_bootstrap_one_example":  # its one error: "Failed to run or to evaluate example"
            self.failed += 1

    @contextlib.contextmanager
    def watching(self) -> Iterator[BootstrapTally]:
        logger = logging.getLogger(self.LOGGER)
        logger.addHandler(self)
        try:
            yield self
        finally:
            logger.removeHandler(self)


def make_metric(spec: Any, bar: float | None = None, tally: BootstrapTally | None = None) -> Callable[..., Any]:
    """The spec's metric for MIPROv2 and for scoring programs.

    Called with a trace (bootstrapping), it passes a fully correct reply (score 1.0, DSPy's
    convention) or, with ``bar``, returns the score for MIPROv2's ``metric_threshold=bar`` to
    compare: what a DSPy user does with a continuous metric that a small model never scores
    1.0 on (summarize kept 0 of 400 traces at 1.0). ``tally`` counts the traces scored and kept.
    """

    def metric(example: Any, pred: Any, trace: Any = None, *_: Any) -> float | bool:
        score = spec_score(spec, example, pred)[0]
        if trace is None:
            return score
        passed = score >= (1.0 if bar is None else bar)
        if tally is not None:
            tally.scored += 1
            tally.kept += passed
        return passed if bar is None else score

    return metric


def make_gepa_metric(spec: Any, ttft: Callable[[str], float] | None = None) -> Callable[..., Any]:
    """The spec's metric as GEPA wants it: the score, textual feedback and, with ``ttft``, objective scores.

    The feedback says what the expected output was and what came out (DSPy's GEPA
    documentation: a bare score gives the reflection LM nothing to work with). With
    ``ttft``, ``objective_scores`` holds the quality and minus the predicted expected TTFT
    in seconds of the instruction that produced the prediction (higher is better for both).
    """
    import dspy

    def metric(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None) -> Any:
        score, reply, expected = spec_score(spec, gold, pred)
        shown = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
        out = dspy.Prediction(score=score, feedback=f"Score {score:.2f} out of 1. The expected output is {shown}; "
                                                    f"the output was {reply or '(nothing)'}.")
        instruction = getattr(pred, "_pd_instruction", None)
        if ttft is not None and instruction is not None:
            out["objective_scores"] = {"quality": score, "neg_ttft_s": -ttft(instruction) / 1000.0}
        return out

    return metric


def tagged_program(signature: Any) -> Any:
    """A ``dspy.Predict`` whose predictions carry the instruction that made them (for the TTFT objective)."""
    import dspy

    class TaggedPredict(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.predict = dspy.Predict(signature)

        def forward(self, **inputs: Any) -> Any:
            pred = self.predict(**inputs)
            pred._pd_instruction = self.predict.signature.instructions  # an attribute, not an output field
            return pred

    return TaggedPredict()


class TTFTObjective:
    """Predicted expected TTFT (ms) of the template an instruction makes, as our optimizer predicts it.

    Mean over a few dev records of the TTFT model's cold and warm predictions, mixed with
    the optimizer's assumed warm share; cached per instruction. DSPy calls the metric from
    its threads while the engine runs: tokenizing uses a tokenizer of its own, under a lock.
    """

    def __init__(self, engine: Engine, model: Any, spec: Any, records: Sequence[Mapping[str, Any]], block_tokens: int):
        from promptdistill.engine.tokenizer import HFTokenizer

        path = getattr(engine, "model_path", None)
        self.tokenizer = HFTokenizer(path) if path else engine
        self.identity = engine.identity
        self.model, self.spec, self.records, self.block_tokens = model, spec, list(records), block_tokens
        self._lock = threading.Lock()
        self._cache: dict[str, float] = {}

    # the Tokenizer protocol predict_candidate needs, plus the identity the model checks
    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text)

    def apply_chat_template(self, messages: Any) -> str:
        return self.tokenizer.apply_chat_template(messages)

    def __call__(self, instruction: str) -> float:
        from promptdistill.optimize.predict import predict_candidate
        from promptdistill.optimize.select import ASSUMED_WARM_SHARE, expected_ttft

        with self._lock:
            if instruction not in self._cache:
                p = predict_candidate(self, self.model, peer_spec(self.spec, instruction, []), self.records,  # type: ignore[arg-type]
                                      block_tokens=self.block_tokens)
                self._cache[instruction] = expected_ttft(p["ttft_cold_ms"], p["ttft_warm_ms"], ASSUMED_WARM_SHARE)
            return self._cache[instruction]


def gepa_objectives_supported() -> tuple[bool, str]:
    """Does the installed DSPy pass a metric's ``objective_scores`` on to GEPA's Pareto frontier?"""
    import inspect

    try:
        from dspy.teleprompt.gepa.gepa_utils import ScoreWithFeedback
        from gepa import optimize as gepa_optimize
    except ImportError as e:
        return False, f"dspy.GEPA is not importable: {e}"
    has_field = "objective_scores" in getattr(ScoreWithFeedback, "__annotations__", {})
    has_frontier = "frontier_type" in inspect.signature(gepa_optimize).parameters
    if has_field and has_frontier:
        return True, ("DSPy's GEPA takes objective_scores from the metric's Prediction (ScoreWithFeedback) and gepa's "
                      "frontier_type='hybrid' keeps per-objective fronts; the returned program is still the best by "
                      "the scalar score (quality)")
    return False, (f"objective scores are not supported: ScoreWithFeedback.objective_scores {has_field}, "
                   f"gepa.optimize(frontier_type=...) {has_frontier}")


def demo_records(spec: Any, demos: Sequence[Any]) -> list[dict]:
    """A program's demos as dataset records (bootstrapped demos keep the model's outputs)."""
    outs = output_fields(spec)
    recs = []
    for i, d in enumerate(demos):
        try:
            inputs = {n: d[n] for n in spec.inputs}
            expected = {k: d[k] for k in outs} if outs else d["answer"]
        except (KeyError, AttributeError):
            continue
        recs.append({"id": f"demo-{i}", "split": "train", "inputs": inputs, "expected": expected})
    return recs


def run_with_retries(compile_once: Callable[[Any, int | None], Any], adapters: Sequence[Any], seed: int | None,
                     retry_on: tuple[type[BaseException], ...] | None = None) -> tuple[Any, dict[str, Any]]:
    """A peer run as a competent DSPy user runs it: ``compile_once(adapter, seed)``, retried on a parse failure.

    The first adapter with ``seed``; on an adapter parse error (``retry_on``, default DSPy's
    ``AdapterParseError``) once more with the same adapter and ``seed + 1`` (skipped when
    the peer takes no seed: the same calls would come back from DSPy's cache), then each
    other adapter with ``seed``. Any other exception ends the run at once.

    Returns:
        (the result or None, the record for the peer's side): ``attempts`` (adapter, seed,
        seconds, error type and message), ``adapter`` (the one that succeeded) and, when
        every attempt failed, ``error`` and ``traceback`` of the last.
    """
    if retry_on is None:
        from dspy.utils.exceptions import AdapterParseError

        retry_on = (AdapterParseError,)
    plan = [(adapters[0], seed), *([(adapters[0], seed + 1)] if seed is not None else []),
            *((a, seed) for a in adapters[1:])]
    attempts: list[dict[str, Any]] = []
    error: Exception | None = None
    for adapter, s in plan:
        row: dict[str, Any] = {"adapter": type(adapter).__name__, "seed": s, "error_type": None, "error": None}
        attempts.append(row)
        started = time.monotonic()
        try:
            result = compile_once(adapter, s)
        except Exception as e:  # noqa: BLE001 - a failing peer is a result to report, not a crash
            row.update(seconds=round(time.monotonic() - started, 1), error_type=type(e).__name__,
                       error=str(e).strip()[:500])
            error = e
            if not isinstance(e, retry_on):
                break
            continue
        row["seconds"] = round(time.monotonic() - started, 1)
        return result, {"attempts": attempts, "adapter": row["adapter"]}
    assert error is not None
    return None, {"attempts": attempts, "adapter": None, "error": f"{type(error).__name__}: {error}",
                  "traceback": "".join(traceback.format_exception(error, limit=6))}


def run_peer(kind: str, engine: Engine, model: Any, spec: Any, split: Mapping[str, Sequence[dict]],
             args: argparse.Namespace, folder: Path, block_tokens: int) -> dict[str, Any]:
    """Compile one peer (``run_with_retries``: its cost counts every attempt), score its program on test,
    export it as a template (content included)."""
    import dspy

    from bench.dspy_bridge import make_dspy_lm
    from bench.peer_export import export_program, render
    from promptdistill.core.stats import bootstrap_ci

    counter = CallCounter(engine)
    temperature = 1.0 if kind.startswith("gepa") else 0.0  # GEPA's docs: a sampling reflection LM
    prompt_lm = make_dspy_lm(counter, cache_dir=fresh(folder / f"dspy_cache_{kind}"), temperature=temperature,
                             max_tokens=args.proposer_max_tokens, max_batch=32)
    bridge = prompt_lm.bridge
    task_lm = prompt_lm.copy(max_tokens=2 * (spec.max_tokens or 128) + 16, temperature=0.0)  # JSONAdapter's spacing
    trainset = [to_example(spec, r) for r in split["train"]]
    valset = [to_example(spec, r) for r in split["dev"]]
    out: dict[str, Any] = {"kind": kind}
    tally = BootstrapTally()

    def compile_once(adapter: Any, seed: int | None) -> Any:
        dspy.configure(lm=task_lm, adapter=adapter)  # global: every DSPy thread uses it
        if kind == "mipro":
            from dspy.teleprompt import MIPROv2

            bar = args.mipro_metric_threshold
            optimizer = MIPROv2(metric=make_metric(spec, bar, tally), prompt_model=prompt_lm, task_model=task_lm,
                                auto="light", metric_threshold=bar,
                                max_bootstrapped_demos=args.max_bootstrapped_demos,
                                max_labeled_demos=args.max_labeled_demos, num_threads=args.num_threads,
                                max_errors=10**6, seed=seed, verbose=False)
            with tally.watching():
                return optimizer.compile(dspy.Predict(make_signature(spec)), trainset=trainset, valset=valset,
                                         minibatch_size=min(35, len(valset)))
        ttft = TTFTObjective(engine, model, spec, split["dev"][:3], block_tokens) if kind == "gepa_ttft" else None
        budget = {"auto": "light"} if args.gepa_metric_calls is None else {"max_metric_calls": args.gepa_metric_calls}
        optimizer = dspy.GEPA(metric=make_gepa_metric(spec, ttft), reflection_lm=prompt_lm,
                              num_threads=args.num_threads, track_stats=True, seed=seed,
                              gepa_kwargs={"frontier_type": "hybrid"} if ttft is not None else None, **budget)
        program = optimizer.compile(tagged_program(make_signature(spec)), trainset=trainset, valset=valset)
        out.update(gepa_details(program, ttft))
        return program

    # JSONAdapter first; ChatAdapter without its JSON fallback, so its program (and its export) is ChatAdapter's.
    adapters = (dspy.JSONAdapter(), dspy.ChatAdapter(use_json_adapter_fallback=False))
    started = time.monotonic()
    program, record = run_with_retries(compile_once, adapters, args.seed + 9 if kind == "mipro" else args.seed)
    out.update(record)
    if kind == "mipro":  # every attempt's bootstrapping, like the cost
        out.update(metric_threshold=args.mipro_metric_threshold, bootstrap_traces_tried=tally.tried,
                   bootstrap_traces_kept=tally.kept, bootstrap_traces_failed=tally.failed)
    adapter = next((a for a in adapters if type(a).__name__ == record["adapter"]), adapters[0])
    out.update(minutes=round((time.monotonic() - started) / 60.0, 3), lm_calls=counter.calls,
               rejected_too_long=counter.rejected, prompt_tokens_processed=bridge.prompt_tokens,
               completion_tokens_processed=bridge.completion_tokens,
               tokens_processed=bridge.prompt_tokens + bridge.completion_tokens, bridge_calls=bridge.calls,
               **search_tokens([counter.tokens]))
    if program is None:
        bridge.close()
        return out

    # Its own program on test (DSPy's prompt, the adapter it compiled with): counted apart from its cost.
    before = counter.calls
    evaluation = dspy.Evaluate(devset=[to_example(spec, r) for r in split["test"]], metric=make_metric(spec),
                               num_threads=args.num_threads, max_errors=10**6, failure_score=0.0,
                               display_progress=False)(program)
    program_scores = [float(s) for _, _, s in evaluation.results]  # in test order, for the paired difference
    ci = bootstrap_ci(program_scores, seed=args.seed)
    bridge.close()
    predictor = program.predictors()[0]
    instruction = predictor.signature.instructions
    demos = demo_records(spec, predictor.demos)
    # What the adapter sends for each test record: counted, and the export checked against it.
    formatted = [adapter.format(predictor.signature, predictor.demos, dict(r["inputs"])) for r in split["test"]]
    sent = [engine.count_tokens(messages) for messages in formatted]
    pspec = peer_spec(spec, instruction, demos)
    # The program's own requests as a template (bench.peer_export): same messages, schema and max_tokens.
    content = export_program(spec.name, predictor.signature, predictor.demos, adapter,
                             max_tokens=task_lm.kwargs["max_tokens"], sampling={"temperature": 0.0})
    # The byte-for-byte check, on every test record: the template renders what the adapter sent.
    differing = [str(r["id"]) for r, messages in zip(split["test"], formatted) if render(content, r["inputs"]) != messages]
    out.update(program_test_mean=ci.mean, program_test_ci_low=ci.low, program_test_ci_high=ci.high,
               program_test_n=ci.n, program_scores=program_scores,
               export_checked=len(split["test"]), export_identical=len(split["test"]) - len(differing),
               export_differing=differing[:5],
               test_eval_calls=counter.calls - before, instruction=instruction,
               examples=len(content["turns"]) // 2,
               dspy_prompt_tokens=round(statistics.fmean(sent), 1) if sent else None,
               instruction_tokens=len(engine.tokenize(pspec.instruction_text())), content=content)
    return out


def gepa_details(program: Any, ttft: TTFTObjective | None) -> dict[str, Any]:
    """What GEPA explored: candidates, metric calls, the chosen one's validation scores (and objectives)."""
    r = getattr(program, "detailed_results", None)
    if r is None:
        return {}
    best = r.best_idx
    out: dict[str, Any] = {"candidates": len(r.candidates), "total_metric_calls": r.total_metric_calls,
                           "full_val_evals": r.num_full_val_evals, "val_score": r.val_aggregate_scores[best],
                           "val_score_seed": r.val_aggregate_scores[0]}
    if ttft is not None and r.val_aggregate_subscores:
        out["val_objectives"] = r.val_aggregate_subscores[best]
        out["objective_best_candidates"] = {k: sorted(v) for k, v in (r.per_objective_best_candidates or {}).items()}
        out["predicted_ttft_ms"] = {"chosen": ttft(r.candidates[best].predictors()[0].signature.instructions),
                                    "seed": ttft(r.candidates[0].predictors()[0].signature.instructions)}
    return out


# -- one spec, every side ------------------------------------------------------------------------------


def compare_spec(engine: Engine, model: Any, name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench.peer_export import measure_ttft as peer_ttft
    from promptdistill.core.stats import bootstrap_ci, paired_diffs
    from promptdistill.engine.cache import CachedEngine
    from promptdistill.optimize import prefix_block_tokens
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.render import render_messages

    spec = load_spec(Path(args.prompts_dir) / f"{name}.yaml")
    if spec.metric.kind == "judge_rubric":
        raise SystemExit(f"{name}: judge-scored; the peers' metric would be our judge on this model (pick another spec)")
    folder = work / name
    split = bench_split(spec, args.train, args.dev, args.test, args.seed)
    sizes = {k: len(v) for k, v in split.items()}
    job = subset_job(spec, split, folder / "data")
    sub = load_spec(Path(job.path))
    test = split["test"]
    block = prefix_block_tokens(engine)
    progress(f"{name}: train {sizes['train']}, dev {sizes['dev']}, test {sizes['test']}")
    started = time.monotonic()

    progress(f"[{name}] ours: distill then optimize ({args.budget} preset)")
    ours, result = run_ours(engine, model, job, sized_preset(args.budget, sizes["dev"], sizes["test"]), args.seed,
                            folder / "ours")
    sides: dict[str, dict[str, Any]] = {"ours": {**ours, "content": result["content"]}}
    progress(f"[{name}] ours: {ours['winner']} ({ours['reason'][:160]}); {ours['lm_calls']} LM calls, "
             f"{ours['tokens_processed']} tokens ({ours['computed_tokens']} search tokens computed), "
             f"{ours['minutes']:.1f} min")
    for kind in args.peers:
        progress(f"[{name}] {kind}: compile")
        sides[kind] = run_peer(kind, engine, model, sub, split, args, folder, block)
        s = sides[kind]
        progress(f"[{name}] {kind}: {s.get('error') or 'done'}; {s['lm_calls']} LM calls, {s['tokens_processed']} tokens "
                 f"({s['computed_tokens']} computed), "
                 f"{s['minutes']:.1f} min; instruction: {str(s.get('instruction'))[:200]!r}")

    # Every template scored on test the same way; ours through its own LM cache (the
    # optimizer verified this very template on these records: the same requests).
    ours_lm = CachedEngine(engine, Path(ours["folder"]) / "lm_cache.sqlite")
    try:
        for side, s in sides.items():
            if "content" in s and "turns" in s["content"]:  # a peer's program, exported by bench.peer_export
                s.update(peer_template_scores(engine, sub, s["content"], test, args.seed))
            elif "content" in s:
                s.update(template_scores(ours_lm if side == "ours" else engine, sub, s["content"], test, args.seed))
    finally:
        ours_lm.close()

    # Then every template timed, one after the other, by the optimizer's own function.
    progress(f"[{name}] timing every template ({args.timing_records} test records, cold and warm)")
    first = sides["ours"]["content"]
    engine.generate([GenerationRequest(messages=render_messages(first["system"], first["user"], test[0]["inputs"]),
                                       max_tokens=1)])  # discarded: the first timing after a pause runs slow
    for side, s in sides.items():
        if "content" in s and "turns" in s["content"]:
            s.update(peer_ttft(engine, s["content"], test, n=args.timing_records, seed=args.seed))
        elif "content" in s:
            s.update(ttft_figures(engine, model, sub, s["content"], test, n=args.timing_records, block_tokens=block,
                                  label=side, seed=args.seed))

    ours = sides["ours"]
    comparisons = {}
    for kind in args.peers:
        peer = sides[kind]
        c: dict[str, Any] = {}
        for key in RATIO_FIELDS:
            a, b = ours.get(key), peer.get(key)
            c[f"{key}_ours_over_peer"] = round(a / b, 3) if a is not None and b else None
        if peer.get("scores") is not None:
            diffs = paired_diffs(ours["scores"], peer["scores"])
            d = bootstrap_ci(diffs.tolist(), seed=args.seed)
            c.update(quality_diff=d.mean, quality_diff_ci_low=d.low, quality_diff_ci_high=d.high, quality_diff_n=d.n)
        if peer.get("program_scores") is not None:
            d = bootstrap_ci(paired_diffs(ours["scores"], peer["program_scores"]).tolist(), seed=args.seed)
            c.update(program_quality_diff=d.mean, program_quality_diff_ci_low=d.low,
                     program_quality_diff_ci_high=d.high, program_quality_diff_n=d.n)
        c["peer_better"] = better_side(peer)
        c["goal"] = goal(ours, peer)
        comparisons[kind] = c
    for s in sides.values():
        s.pop("scores", None)
        s.pop("program_scores", None)
    minutes = (time.monotonic() - started) / 60.0
    print(f"[{name}] done in {minutes:.1f} min: " + json.dumps({k: v["goal"] for k, v in comparisons.items()}),
          flush=True)
    return {"split": sizes, "minutes": round(minutes, 2), "sides": sides, "comparisons": comparisons}


def better_side(peer: Mapping[str, Any]) -> str:
    """Which of a peer's two scores is higher: its exported ``template`` (``test_``) or its DSPy
    ``program`` (``program_test_``); a team may serve either, so ours is measured against the better."""
    template, program = peer.get("test_mean"), peer.get("program_test_mean")
    return "program" if program is not None and (template is None or program > template) else "template"


def goal(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goal against one peer: quality at least the peer's template's and its program's
    (each, or inside its interval), a shorter prompt, a lower cold TTFT, and at most a third of
    the peer's search tokens computed (``search_tokens``: prefilled, not served by the prefix cache,
    + completion; the same count for every side)."""

    def known(*values: Any) -> bool:
        return all(v is not None for v in values)

    if peer.get("error"):  # a peer that failed part-way has no result to measure against
        return {"quality": None, "prompt_tokens": None, "ttft_cold": None, "computed_tokens": None, "met": False}

    # Inside or above the interval of each of the peer's template and program: the better one
    # by mean may have the wider interval, so both are checked.
    q = ours.get("test_mean")
    lows = [low for p in ("", "program_") if known(peer.get(f"{p}test_mean"), low := peer.get(f"{p}test_ci_low"))]
    checks = {
        "quality": all(q >= low for low in lows) if q is not None and lows else None,
        "prompt_tokens": ours["prompt_tokens"] < peer["prompt_tokens"] if known(ours.get("prompt_tokens"),
                                                                                peer.get("prompt_tokens")) else None,
        "ttft_cold": ours["ttft_cold_ms"] < peer["ttft_cold_ms"] if known(ours.get("ttft_cold_ms"),
                                                                          peer.get("ttft_cold_ms")) else None,
        "computed_tokens": ours["computed_tokens"] <= GOAL_TOKENS_SHARE * peer["computed_tokens"]
        if known(ours.get("computed_tokens"), peer.get("computed_tokens")) else None,
    }
    checks["met"] = all(v is True for v in checks.values())
    return checks


# -- report --------------------------------------------------------------------------------------------


def _paired(c: Mapping[str, Any], side: str = "template") -> str:
    """Ours - the peer's template (or program), paired over the test records, with its 95% interval."""
    p = "program_" if side == "program" else ""
    return (f"{_f(c.get(p + 'quality_diff'), '+.3f')} [{_f(c.get(p + 'quality_diff_ci_low'), '+.3f')}, "
            f"{_f(c.get(p + 'quality_diff_ci_high'), '+.3f')}]")


def export_line(kind: str, s: Mapping[str, Any]) -> str:
    """How many test records the exported template renders byte for byte as the adapter sent them."""
    differing = f" (differing, first ids: {', '.join(s['export_differing'])})" if s.get("export_differing") else ""
    return (f"{kind}: the exported template renders the messages the adapter sent on {s['export_identical']} of "
            f"{s['export_checked']} test records, byte for byte{differing}.")


def _f(value: Any, spec: str = ".3f") -> str:
    return format_number(value, spec)


def _ci(s: Mapping[str, Any], prefix: str = "test_") -> str:
    if s.get(f"{prefix}mean") is None:
        return "-"
    return f"{_f(s[f'{prefix}mean'])} [{_f(s[f'{prefix}ci_low'])}, {_f(s[f'{prefix}ci_high'])}] (n={s[f'{prefix}n']})"


def _mark(v: Any) -> str:
    return "-" if v is None else ("yes" if v else "**no**")


def attempts_line(kind: str, s: Mapping[str, Any]) -> str | None:
    """What a peer's run tried (``run_with_retries``): each attempt's adapter, seed, time and failure."""
    tried = s.get("attempts")
    if not tried:  # a report from before the retries
        return None
    parts = [f"{a['adapter']} seed {a['seed']}, {_f(a.get('seconds'), '.0f')} s: "
             + (f"{a['error_type']} ({str(a['error']).splitlines()[0][:100]})" if a.get("error_type") else "succeeded")
             for a in tried]
    outcome = f"succeeded with {s['adapter']}" if s.get("adapter") else f"failed all {len(tried)} attempt(s)"
    return f"- {kind}: {outcome}; tried " + "; ".join(f"({i}) {p}" for i, p in enumerate(parts, 1))


def side_label(side: str, s: Mapping[str, Any]) -> str:
    """A side's name in the table, with the adapter a peer ended on, or that it failed every attempt."""
    n = len(s.get("attempts") or ())
    if s.get("error"):
        tries = f" {n} attempt(s)" if n else ""
        return f"{side} (failed{tries}: {s['error'].splitlines()[0][:80]})"
    if n > 1 or (s.get("adapter") or "JSONAdapter") != "JSONAdapter":
        return f"{side} ({s['adapter']}, attempt {n})"
    return side


def search_line(kind: str, s: Mapping[str, Any]) -> str | None:
    """One line on what a peer's search did (GEPA: candidates accepted, metric calls, validation scores;
    MIPROv2: the traces its bootstrapping kept, and at what bar)."""
    if "bootstrap_traces_tried" in s:
        bar = s.get("metric_threshold")
        bar = "1.0 (DSPy's convention)" if bar is None else f"{bar} (metric_threshold)"
        failed = s.get("bootstrap_traces_failed")
        failed = f"{failed} raised before scoring, as on a reply the adapter cannot parse; " if failed else ""
        return (f"- {kind}: bootstrapping kept {s['bootstrap_traces_kept']} of {s['bootstrap_traces_tried']} traces "
                f"tried ({failed}a trace is kept at a score of at least {bar})")
    if s.get("error") or "candidates" not in s:
        return None
    line = (f"- {kind}: {s['candidates'] - 1} new candidate(s) accepted in {s['total_metric_calls']} metric calls "
            f"({s['lm_calls']} reached the engine, the rest from DSPy's cache); validation score "
            f"{_f(s['val_score_seed'])} (seed) -> {_f(s['val_score'])} (returned)")
    ttft = s.get("predicted_ttft_ms")
    if ttft:
        line += f"; predicted expected TTFT {ttft['seed']:.0f} ms (seed) -> {ttft['chosen']:.0f} ms (returned)"
    return line


def ours_beside(r: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Ours as measured in the run of peer ``kind`` (a peer joined from another run keeps that run's timings)."""
    return {**r["sides"]["ours"], **(r["sides"][kind].get("ours_in_run") or {})}


def shortfalls(name: str, r: Mapping[str, Any]) -> list[str]:
    """Per spec: each missed part of the goal in numbers; for tokens, the phases that spend them and the levers."""
    missed = {k: [part for part in ("quality", "prompt_tokens", "ttft_cold", "computed_tokens")
                  if c["goal"][part] is False] for k, c in r["comparisons"].items()}
    if not any(missed.values()):
        return []
    out = [f"**{name}**:", ""]
    for kind, parts in missed.items():
        peer, c, ours = r["sides"][kind], r["comparisons"][kind], ours_beside(r, kind)
        for part in parts:
            if part == "quality":
                better = c.get("peer_better", "template")
                prefix = "program_" if better == "program" else ""
                out.append(f"- quality against {kind}'s {better}: ours {_ci(ours)}, {kind} {_ci(peer, prefix + 'test_')}; "
                           f"paired difference {_paired(c, better)}")
            elif part == "prompt_tokens":
                out.append(f"- prompt tokens against {kind}: ours {_f(ours['prompt_tokens'], '.0f')} (instruction "
                           f"{_f(ours.get('instruction_tokens'), '.0f')}), {kind} {_f(peer['prompt_tokens'], '.0f')} "
                           f"(instruction {_f(peer.get('instruction_tokens'), '.0f')}, {peer.get('examples', 0)} demos)")
            elif part == "ttft_cold":
                out.append(f"- cold TTFT against {kind}: ours {_f(ours['ttft_cold_ms'], '.0f')} ms, {kind} "
                           f"{_f(peer['ttft_cold_ms'], '.0f')} ms")
    short = [k for k, parts in missed.items() if "computed_tokens" in parts]
    if short:
        cheapest = min(short, key=lambda k: r["sides"][k]["computed_tokens"])
        allowed = GOAL_TOKENS_SHARE * r["sides"][cheapest]["computed_tokens"]
        ours = ours_beside(r, cheapest)
        cut = 1 - allowed / ours["computed_tokens"]
        out.append(f"- search tokens computed against {', '.join(short)}: ours {ours['computed_tokens']} (of "
                   f"{ours['search_tokens']} prompt + completion); a third of {cheapest}'s is {allowed:.0f}, so "
                   f"ours would have to cut {cut:.0%}. By phase (all tokens that reached the engine, the "
                   "verification included):")
        total = max(1, ours["engine_tokens_processed"])
        ranked = sorted(ours["phases"].items(), key=lambda kv: -(kv[1]["prompt_tokens"] + kv[1]["completion_tokens"]))
        for phase, ph in ranked[:4]:
            share = (ph["prompt_tokens"] + ph["completion_tokens"]) / total
            lever = PHASE_LEVERS.get(phase.split(": ", 1)[-1].replace(" (judge)", ""), "")
            out.append(f"  - {phase}: {share:.0%} ({ph['calls']} calls){': ' + lever if lever else ''}")
    return [*out, ""]


def markdown(rows: Mapping[str, Mapping[str, Any]], config: Mapping[str, Any], total_minutes: float) -> str:
    intro = (f"Budget preset `{config['budget']}` for ours (distiller, then optimizer, through the pipeline stages); "
             f"DSPy {config['dspy_version']}, JSONAdapter; seed {config['seed']}. A peer failing on an adapter parse "
             "error is retried once with the next seed, then with ChatAdapter (every attempt is listed under its "
             "spec and counted in its cost). Test quality is every side's exported "
             "template scored on the test records: ours by `promptdistill.evaluate` (what a service gets), a peer's "
             "program exported by `bench.peer_export` (its adapter's own messages, demo turns, schema, max_tokens and "
             "parsing); the DSPy program's own score is beside it. Search tokens, counted the same way for every "
             "side below its own LM cache, at the engine: the requests of the search (peers: compile, every "
             "attempt; ours: distiller and optimizer, the held-out verification apart, as the peers' test scoring "
             "is), as *computed* (the prompt tokens the engine prefilled, i.e. not served by vLLM's prefix cache, "
             "+ completion: the goal's count) and as prompt + completion. Tokens processed: prompt + completion "
             "as each side asked for them (peers: the DSPy bridge; ours: the stage results, LM-cache hits and the "
             "verification included). Prompt tokens: the "
             "rendered chat prompt (served tokenizer), mean over the test records; instruction tokens: "
             "`Spec.instruction_text()` (instruction and rules; a peer's instruction is its whole system text). "
             "TTFT: measured, mean of "
             f"{config['timing_records']} test records each. Whole run: {total_minutes:.1f} minutes.")
    lines = ["# Ours against DSPy MIPROv2 and GEPA (auto=light): same engine, records and metric", "", intro, ""]
    for name, r in rows.items():
        sp = r["split"]
        measured = f"; commit {r['commit']}, {r['timestamp']}" if r.get("commit") else ""
        measured += "".join(f"; {kind} at commit {s['commit']}, {s['timestamp']}"
                            for kind, s in r["sides"].items() if s.get("commit"))
        lines += [f"## {name} (train {sp['train']}, dev {sp['dev']}, test {sp['test']}; {r['minutes']:.1f} min{measured})", "",
                  ("| side | test quality, template [95% CI] | DSPy program score [95% CI] | LM calls | tokens processed "
                   "(prompt + completion) | search tokens: computed / prompt + completion | minutes | prompt tokens | "
                   "instruction tokens | TTFT cold ms | TTFT warm ms |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        beside = {f"ours, in {kind}'s run": ours_beside(r, kind) for kind, s in r["sides"].items() if s.get("ours_in_run")}
        for side, s in {**r["sides"], **beside}.items():
            split_tokens = (f"{s['prompt_tokens_processed']} + {s['completion_tokens_processed']}"
                            if s.get("prompt_tokens_processed") is not None else "")
            engine_note = (f"; {s['engine_tokens_processed']} reached the engine"
                           if side == "ours" and s.get("engine_tokens_processed") is not None else "")
            verification = s.get("verification_tokens") or {}
            checked = (f" (verification apart: {verification['computed_tokens']} / {verification['search_tokens']})"
                       if verification else "")
            lines.append(
                f"| {side_label(side, s)} | {_ci(s)} | {_ci(s, 'program_test_')} | {s.get('lm_calls')} | "
                f"{s.get('tokens_processed')} ({split_tokens}{engine_note}) | "
                f"{_f(s.get('computed_tokens'), 'd')} / {_f(s.get('search_tokens'), 'd')}{checked} | "
                f"{_f(s.get('minutes'), '.1f')} | "
                f"{_f(s.get('prompt_tokens'), '.0f')} | {_f(s.get('instruction_tokens'), '.0f')} | "
                f"{_f(s.get('ttft_cold_ms'), '.0f')} | {_f(s.get('ttft_warm_ms'), '.0f')} |")
        for kind, c in r["comparisons"].items():
            diff = f"{_paired(c)} (paired diff)"
            program_diff = f"{_paired(c, 'program')} (paired diff)" if c.get("program_quality_diff") is not None else ""
            lines.append(
                f"| ours/{kind} | {diff} | {program_diff} | {_f(c['lm_calls_ours_over_peer'], '.2f')}x | "
                f"{_f(c['tokens_processed_ours_over_peer'], '.2f')}x | "
                f"{_f(c.get('computed_tokens_ours_over_peer'), '.2f')}x / {_f(c.get('search_tokens_ours_over_peer'), '.2f')}x | "
                f"{_f(c['minutes_ours_over_peer'], '.2f')}x | "
                f"{_f(c['prompt_tokens_ours_over_peer'], '.2f')}x | {_f(c['instruction_tokens_ours_over_peer'], '.2f')}x | "
                f"{_f(c['ttft_cold_ms_ours_over_peer'], '.2f')}x | {_f(c['ttft_warm_ms_ours_over_peer'], '.2f')}x |")
        ours = r["sides"]["ours"]
        kept = " (baseline kept)" if ours["kept_baseline"] else ""
        lines += ["", f"Ours: **{ours['winner']}**{kept}: {ours['reason']}", ""]
        lines += [line for kind in r["comparisons"] if (line := search_line(kind, r["sides"][kind]))]
        lines += [line for kind in r["comparisons"] if (line := attempts_line(kind, r["sides"][kind]))]
        lines += [export_line(kind, r["sides"][kind]) for kind in r["comparisons"] if r["sides"][kind].get("export_checked")]
        lines.append("")
    lines += ["## The goal, per spec and peer", "",
              ("Quality at least the peer's exported template's and its DSPy program's (each, or inside its "
               "95% interval), fewer prompt tokens, lower cold TTFT, at "
               f"most {GOAL_TOKENS_SHARE:.2f} of the peer's search tokens computed."), "",
              ("| spec | peer | quality (ours - peer, paired) | prompt tokens (ours/peer) | cold TTFT (ours/peer) | "
               "search tokens computed (ours/peer) | all |"), "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        for kind, c in r["comparisons"].items():
            g = c["goal"]
            better = c.get("peer_better", "template")
            lines.append(f"| {name} | {kind} | {_mark(g['quality'])} ({_paired(c, better)} against its {better}) | "
                         f"{_mark(g['prompt_tokens'])} ({_f(c['prompt_tokens_ours_over_peer'], '.2f')}x) | "
                         f"{_mark(g['ttft_cold'])} ({_f(c['ttft_cold_ms_ours_over_peer'], '.2f')}x) | "
                         f"{_mark(g.get('computed_tokens'))} ({_f(c.get('computed_tokens_ours_over_peer'), '.2f')}x) | "
                         f"{'peer failed' if r['sides'][kind].get('error') else _mark(g['met'])} |")
    lines += ["", "## Where we fall short, and why", ""]
    lines += [line for name, r in rows.items() for line in shortfalls(name, r)] or ["Nowhere.", ""]
    lines += ["", "## Where our tokens go (requests that reached the engine, by phase)", "",
              "| spec | phase | LM calls | prompt tokens | of them prefix-cached | completion tokens | share of tokens |",
              "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ours = r["sides"]["ours"]
        total = max(1, ours["engine_tokens_processed"])
        for phase, p in sorted(ours["phases"].items(), key=lambda kv: -(kv[1]["prompt_tokens"] + kv[1]["completion_tokens"])):
            t = p["prompt_tokens"] + p["completion_tokens"]
            lines.append(f"| {name} | {phase} | {p['calls']} | {p['prompt_tokens']} | {_f(p.get('cached_tokens'), 'd')} | "
                         f"{p['completion_tokens']} | {100 * t / total:.0f}% |")
        lines.append(f"| {name} | stage results (asked, cache hits included) | {ours['lm_calls']} | | | | "
                     f"{ours['tokens_processed']} tokens: distill {ours['stage_tokens']['distill']}, optimize "
                     f"{ours['stage_tokens']['optimize']} |")
    lines += ["", "## The peers' instructions, as they wrote them", ""]
    for name, r in rows.items():
        for kind in r["comparisons"]:
            s = r["sides"][kind]
            extra = f", {s['examples']} demos" if s.get("examples") else ""
            if s.get("error"):
                tries = f"{len(s['attempts'])} attempt(s), " if s.get("attempts") else ""
                lines += [f"**{name} / {kind}**: failed after {tries}{s.get('lm_calls')} LM calls:", "", "```text",
                          str(s["error"]).strip(), "```", ""]
                continue
            lines += [f"**{name} / {kind}** ({s.get('instruction_tokens')} tokens{extra}):", "", "```text",
                      str(s.get("instruction")).strip(), "```", ""]
    lines += [f"GEPA with predicted TTFT as a second objective: {config['gepa_objectives']}.", ""]
    return "\n".join(lines)


MERGE_KEYS = ("budget", "train", "dev", "test", "gepa_metric_calls", "num_threads", "max_bootstrapped_demos",
              "max_labeled_demos", "proposer_max_tokens", "timing_records", "seed", "mipro_auto", "gepa_auto",
              "dspy_version", "adapter")
"""What must agree for two runs' specs to share one table (the TTFT model may differ: it is
refitted as the engine's profile grows, and each spec records its own; the peers may differ:
a spec's peers can be measured in separate runs)."""

SAME_OURS = ("winner", "content", "test_mean", "test_n")
"""What two runs' ours sides must share for their peers to join one spec's table: the same
published template with the same test score (ours' decisions repeat exactly for a seed), so each
run's paired comparison is with the same ours."""

OURS_PER_RUN = ("ttft_cold_ms", "ttft_warm_ms", "computed_tokens", "search_tokens", "minutes", "lm_calls",
                "tokens_processed", "prompt_tokens_processed", "completion_tokens_processed", "verification_tokens")
"""Ours' figures that vary from run to run (timings, prefix-cache hits, a few completion tokens): a peer joined from
another run keeps them as measured beside it, and its goal is judged on them."""


def peer_order(kinds: Iterable[str]) -> list[str]:
    """Peers in ``PEERS``' order, then any other kind (an older report's) in the order met, each once."""
    kinds = list(dict.fromkeys(kinds))
    return [k for k in PEERS if k in kinds] + [k for k in kinds if k not in PEERS]


def run_of(row: Mapping[str, Any], side: Mapping[str, Any]) -> str:
    """The run a side was measured in: its own stamp when joined from another run, else its row's."""
    return f"{side.get('commit', row['commit'])} {side.get('timestamp', row['timestamp'])}"


def join_spec(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """One spec's row from two runs: the later run's sides, plus the earlier's peers it did not measure.

    The earlier peers are kept only when both runs' ours sides agree (``SAME_OURS``, and the
    split). Each kept peer side records the run it was measured in (commit, time, TTFT model)
    and ours' figures of that run (``OURS_PER_RUN``); the spec's minutes add up the runs its
    sides come from, each once. Returns the row, and the earlier peers dropped because ours
    differs, each with the commit it was measured at.
    """
    only_earlier = [k for k in earlier["comparisons"] if k not in later["comparisons"]]
    if not only_earlier:
        return dict(later), {}
    ours_a, ours_b = earlier["sides"]["ours"], later["sides"]["ours"]
    if earlier["split"] != later["split"] or any(ours_a.get(k) != ours_b.get(k) for k in SAME_OURS):
        return dict(later), {k: earlier["sides"][k].get("commit", earlier["commit"]) for k in only_earlier}
    ours_then = {k: ours_a.get(k) for k in OURS_PER_RUN}
    kept = {k: {"commit": earlier["commit"], "timestamp": earlier["timestamp"], "ttft_model": earlier.get("ttft_model"),
                "ours_in_run": ours_then, **earlier["sides"][k]} for k in only_earlier}
    order = peer_order([*kept, *later["comparisons"]])
    comparisons = {**earlier["comparisons"], **later["comparisons"]}
    sides = {"ours": later["sides"]["ours"], **{k: {**earlier["sides"], **later["sides"], **kept}[k] for k in order}}
    run_minutes = {**earlier.get("run_minutes", {run_of(earlier, {}): earlier["minutes"]}),
                   **later.get("run_minutes", {run_of(later, {}): later["minutes"]})}
    used = {run_of(later, side) for side in sides.values()}
    run_minutes = {run: m for run, m in run_minutes.items() if run in used}
    return {**later, "minutes": round(sum(run_minutes.values()), 3), "run_minutes": run_minutes, "sides": sides,
            "comparisons": {k: comparisons[k] for k in order}}, {}


def merge_reports(paths: list[Path]) -> dict[str, Any]:
    """One report from the JSON reports of separate runs (each measured at its own commit).

    A report is a run's or an earlier merge's. Every spec keeps the commit, time and TTFT model
    it was measured with; a later report's spec replaces an earlier one's, but keeps the
    earlier's peers it did not measure when ours agrees (``join_spec``: one spec's peers
    measured in separate runs).

    Raises:
        SystemExit: a report is unreadable, or the runs differ in engine or settings
            (named: the file and the field).
    """
    reports = []
    for path in paths:
        try:
            report = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: not a bench_peers report ({type(e).__name__}: {e})") from None
        missing = [k for k in ("specs", "config", "identity") if not isinstance(report, dict) or k not in report]
        # A run's report is stamped as a whole; a merged one, spec by spec.
        missing += [f"{name}.commit" for name, row in report.get("specs", {}).items()
                    if not (report.get("commit") or row.get("commit"))] if not missing else []
        if missing:
            raise SystemExit(f"{path}: not a bench_peers report (no {', '.join(missing)})")
        reports.append((Path(path), report))
    first_path, first = reports[0]
    rows: dict[str, Any] = {}
    for path, report in reports:
        if report["identity"] != first["identity"]:
            raise SystemExit(f"{path}: identity: measured on {report['identity']}, {first_path} on {first['identity']}")
        for key in MERGE_KEYS:
            if report["config"].get(key) != first["config"].get(key):
                raise SystemExit(f"{path}: config.{key}: {report['config'].get(key)!r}, "
                                 f"{first_path} has {first['config'].get(key)!r}")
        for name, row in report["specs"].items():
            # The goal is a function of the sides: recomputed, so every spec meets today's rule.
            for kind, c in row["comparisons"].items():
                c["goal"] = goal(ours_beside(row, kind), row["sides"][kind])
            ttft_model = report["config"].get("ttft_model")
            row = {**row, "commit": report.get("commit") or row["commit"],
                   "timestamp": report.get("timestamp") or row.get("timestamp"),
                   "ttft_model": ttft_model.get(name) if isinstance(ttft_model, dict) else ttft_model}
            if name in rows:
                row, dropped = join_spec(rows[name], row)
                if dropped:
                    runs = ", ".join(f"{kind} (commit {c})" for kind, c in dropped.items())
                    print(f"{path}: {name}: ours differs from the run of {runs}, so those rows are dropped", flush=True)
            rows[name] = row
    peers = peer_order(k for r in rows.values() for k in r["comparisons"])
    config = {**first["config"], "peers": peers, "ttft_model": {name: r["ttft_model"] for name, r in rows.items()}}
    total = sum(r["minutes"] for r in rows.values())
    return {"benchmark": "peers", "merged_from": [str(p) for p, _ in reports],
            "commits": sorted({r["commit"] for r in rows.values()}), "machine": first["machine"],
            "config": config, "identity": first["identity"], "total_minutes": round(total, 2), "specs": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="*", default=list(DEFAULT_SPECS))
    p.add_argument("--budget", default="quick", help="ours: the nightly's budget preset (smoke, quick, full)")
    p.add_argument("--train", type=int, default=100, help="train records (ours: example pool; peers: trainset)")
    # 100 dev records, not the nightly's 400: GEPA's light budget is about 4 x valset + 380 metric
    # calls, made mostly in sequential 3-record steps; at 400 one GEPA run alone takes ~half an hour here.
    p.add_argument("--dev", type=int, default=100, help="dev records (ours: screen + race; peers: valset)")
    p.add_argument("--test", type=int, default=100, help="held-out test records every template is scored on")
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    p.add_argument("--gepa-metric-calls", type=int, default=None,
                   help="GEPA's max_metric_calls instead of auto='light' (the smoke test's size)")
    p.add_argument("--num-threads", type=int, default=16, help="DSPy's threads (their calls are batched)")
    p.add_argument("--max-bootstrapped-demos", type=int, default=4, help="MIPROv2's (DSPy's default 4)")
    p.add_argument("--max-labeled-demos", type=int, default=4, help="MIPROv2's (DSPy's default 4)")
    p.add_argument("--mipro-metric-threshold", type=float, default=None, metavar="BAR",
                   help="MIPROv2's metric_threshold: bootstrapping keeps a trace scoring at least BAR "
                        "(default: only a score of 1.0, DSPy's convention)")
    p.add_argument("--proposer-max-tokens", type=int, default=512,
                   help="max_tokens of MIPROv2's proposer and GEPA's reflection calls")
    p.add_argument("--timing-records", type=int, default=3, help="test records timed cold and warm per template")
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--merge", nargs="+", type=Path, metavar="REPORT_JSON",
                   help="join the JSON reports of separate runs into one report (no LM call); specs are ignored")
    args = p.parse_args(argv)
    if args.merge:
        merged = merge_reports(args.merge)
        path = write_json(REPORT_DIR / "peers.json", merged)
        atomic_write(REPORT_DIR / "peers.md", markdown(merged["specs"], merged["config"], merged["total_minutes"]))
        print(f"{len(merged['specs'])} specs from {len(args.merge)} reports -> {path} and peers.md", flush=True)
        return merged
    args.peers = [k.strip() for k in args.peers.split(",") if k.strip()]
    unknown = [k for k in args.peers if k not in PEERS]
    if unknown:
        p.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    if args.train < 1 or args.dev < 2 or args.test < 2:
        p.error("--train must be at least 1, --dev and --test at least 2")
    if args.mipro_metric_threshold is not None and not 0 < args.mipro_metric_threshold <= 1:
        p.error(f"--mipro-metric-threshold must be in (0, 1], not {args.mipro_metric_threshold}")
    supported, why = gepa_objectives_supported()
    if "gepa_ttft" in args.peers and not supported:
        progress(f"gepa_ttft skipped: {why}")
        args.peers.remove("gepa_ttft")

    import dspy

    from promptdistill.engine import load_engine
    from promptdistill.pipeline.ttft_models import load_ttft_model
    from promptdistill.registry.store import Registry

    settings = load_settings()
    work = Path(settings.state_dir) / "bench" / "peers"
    rows: dict[str, Any] = {}
    started = time.monotonic()
    with load_engine(settings.engine) as engine:
        model = load_ttft_model(Registry(settings.registry), engine.identity)
        for name in args.specs:
            rows[name] = compare_spec(engine, model, name, args, work)
        identity = engine.identity.to_dict()
    total = (time.monotonic() - started) / 60.0
    config = {k: getattr(args, k) for k in ("budget", "train", "dev", "test", "peers", "gepa_metric_calls",
                                             "num_threads", "max_bootstrapped_demos", "max_labeled_demos",
                                             "proposer_max_tokens", "timing_records", "seed")}
    from promptdistill.pipeline.jobs import settings_key

    preset = sized_preset(args.budget, args.dev, args.test)
    config["ours_preset"] = {k: settings_key(v) for k, v in preset.items() if k != "ttft_budget"}
    config.update({"mipro_auto": "light", "gepa_auto": "light" if args.gepa_metric_calls is None else None,
                   "dspy_version": dspy.__version__, "adapter": "JSONAdapter", "ttft_model": model.version,
                   "gepa_objectives": why, "gepa_objectives_supported": supported})
    stamp = {"commit": commit(), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = {name: {**row, **stamp} for name, row in rows.items()}
    result = {"config": config, "identity": identity, "total_minutes": round(total, 2), "specs": rows}
    write_report("peers", result, markdown(rows, config, total))
    return result


if __name__ == "__main__":
    main()

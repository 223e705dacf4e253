"""``optimize(engine, spec, ...)``: tune few-shot examples and density against quality and TTFT.

The run, in order (each step a method of ``_Run``):

1. split the dataset: train (example pool), dev (search, shuffled by the seed, cut to
   ``dev_size``), test (verification only, never seen before step 8);
2. evaluate the baseline (the spec as written) on every dev record;
3. choose the fixed example set per count: a few draws, scored on the dev minibatch;
4. build the grid (instruction variants x none/fixed/similar x counts), predict every
   candidate's TTFT cold and warm with the fitted TTFT model, drop what cannot fit the
   context window;
5. successive halving over the dev records, bounded by the LM-call and time budget
   (the steps after the search are reserved up front, so no step can overrun it);
6. score (bootstrap CIs, paired lower bounds against the baseline), the Pareto front,
   and the selection rule (``select.py``);
7. for the winner: the valid-JSON rate three ways (free text, schema in the prompt,
   constrained decoding), then ``max_tokens`` from its completion tokens;
8. verify on the test split (``verify.py``) and keep the baseline if the winner fails.

Every LM request is counted (``lm_calls``); with a ``CachedEngine`` the cache misses are
counted too (``real_lm_calls``): a re-run with the same seed and a warm cache makes none,
as long as the call budget (not the clock) bounded the first run's search: a search cut
by ``max_minutes`` depends on the machine's load, and a fast cached re-run goes further.
TTFT measurement in step 8 always goes to the engine behind the cache (a cached
timing would be a stale one) and is counted apart (``timing_requests``).
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult, canonical_json
from promptdistill.errors import ConfigError
from promptdistill.evaluate import EvalReport, evaluate, judge_cost
from promptdistill.optimize.examples import SimilarExamples, fixed_spec, fixed_subsets, per_request_spec, with_fewshot
from promptdistill.optimize.predict import predict_candidate, prefix_block_tokens
from promptdistill.optimize.search import OptCandidate, rank_key, rung_sizes, successive_halving
from promptdistill.optimize.select import SelectionRule, expected_ttft
from promptdistill.optimize.variants import instruction_variants
from promptdistill.specs import Spec, build_system, select_examples, spec_messages

__all__ = ["OptimizeBudget", "optimize"]


@dataclass(frozen=True)
class OptimizeBudget:
    """Sizes and limits of one run. Defaults optimize one spec in a few minutes on a 2-core CPU."""

    max_lm_calls: int = 1200
    """Every LM request of the run (generation and judges), search and verification."""
    max_minutes: float = 8.0
    """Wall-clock limit of the whole run: the search shrinks so that the steps after it
    (projected from the run's pace) still fit."""
    dev_size: int = 40
    """Dev records of the last rung (selection and the token budget use them all)."""
    minibatch_size: int = 8
    """Dev records of the first rung and of the fixed-example choice."""
    eta: int = 3
    """Successive halving keeps ceil(n / eta) candidates per rung."""
    test_size: int = 40
    """Held-out test records for the verification."""
    fewshot_counts: tuple[int, ...] = (0, 2, 4, 8)
    """Counts of fixed (cacheable) examples; 0 is 'no examples'."""
    similar_counts: tuple[int, ...] = (2, 4)
    """Counts of per-request similar examples (TF-IDF neighbours)."""
    fixed_subsets: int = 2
    """Example sets tried per fixed count (the spec's own rule first)."""
    max_variants: int = 3
    """Instruction variants, the original included."""
    feature_records: int = 6
    """Dev records whose prompts the TTFT predictions average over."""
    timing_records: int = 3
    """Test records measured cold and warm on the real engine (0: no measurement)."""
    formats: bool = True
    """Compare free text, schema-in-prompt and constrained decoding (specs with a schema)."""
    format_size: int = 16
    """Dev records the three output formats are compared on."""

    def __post_init__(self) -> None:
        for name in ("max_lm_calls", "dev_size", "minibatch_size", "feature_records"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        for name in ("test_size", "timing_records", "fixed_subsets", "format_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}.")
        if self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be positive, got {self.max_minutes}.")
        if self.eta < 2:
            raise ValueError(f"eta must be at least 2, got {self.eta}.")
        if self.max_variants < 1:
            raise ValueError(f"max_variants must be at least 1, got {self.max_variants}.")
        for name in ("fewshot_counts", "similar_counts"):
            counts = tuple(getattr(self, name))
            if any(not 0 <= k <= 8 for k in counts):
                raise ValueError(f"{name} must be counts from 0 to 8, got {counts}.")
            object.__setattr__(self, name, counts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_TIMING_COST = 3
"""A TTFT timing request (sent alone) costs about as much time as this many batched LM calls."""


class _Recorder(EngineWrapper):
    """Counts every request and keeps each ``generate`` batch's results (per-record tokens)."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.calls = 0
        self.batches: list[list[GenerationResult]] = []

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        results = self.engine.generate(requests, progress=progress)
        self.calls += len(requests)
        self.batches.append(results)
        return results



def prefix_report(report: EvalReport, n: int) -> EvalReport:
    """The first ``n`` records of ``report`` (token totals are not split: left at 0)."""
    eq = None if report.equivalence is None else report.equivalence[:n]
    return EvalReport(spec_name=report.spec_name, record_ids=report.record_ids[:n], scores=report.scores[:n],
                      replies=report.replies[:n], valid=report.valid[:n], equivalence=eq)


def schema_in_prompt(spec: Spec) -> Spec:
    """``spec`` with its output schema declared in the prompt, as one more rule."""
    rule = f"Reply with one JSON object that matches this JSON Schema: {canonical_json(spec.output_schema)}"
    return spec.with_changes(constraints=(*spec.constraints, rule))


class _Run:
    def __init__(self, engine: Engine, spec: Spec, ttft_model: Any, budget: OptimizeBudget, seed: int,
                 rule: SelectionRule, distilled: Any, timing_engine: Engine | None):
        from promptdistill.judge_runner import JudgeRunner

        self.spec, self.model, self.budget, self.seed, self.rule = spec, ttft_model, budget, seed, rule
        self.distilled = distilled
        self.outer = engine
        self.timing_engine = timing_engine if timing_engine is not None else getattr(engine, "engine", engine)
        self.lm = _Recorder(engine)
        self.runner = JudgeRunner(self.lm, seed=seed)
        self.block_tokens = prefix_block_tokens(engine)
        self.max_drop = spec.slo.max_quality_drop
        self.max_tokens = spec.max_tokens or 256
        self.started = time.monotonic()
        self.deadline = self.started + 60.0 * budget.max_minutes
        self.stop_reason: str | None = None
        self.notes: list[str] = []

    # -- data and budget --------------------------------------------------------------
    def split(self) -> None:
        from promptdistill.datasets import dataset_for, records

        df = dataset_for(self.spec)
        rng = random.Random(self.seed)
        dev, test = records(df, "dev"), records(df, "test")
        rng.shuffle(dev)
        rng.shuffle(test)
        self.train = records(df, "train")
        self.dev, self.test = dev[: self.budget.dev_size], test[: self.budget.test_size]
        if not self.dev:
            raise ValueError(f"{self.spec.dataset}: no dev records to optimize on")
        self.minibatch = min(self.budget.minibatch_size, len(self.dev))
        self.similar = SimilarExamples(self.spec, self.train).fit() if self.train else None

    def cost(self, n_records: int, *, equivalence: bool = False) -> int:
        return judge_cost(self.spec, n_records, with_equivalence=equivalence)

    def reserve(self) -> int:
        """LM calls the steps after the search may need (formats, verification, a fallback)."""
        n_dev, n_test = len(self.dev), len(self.test)
        n_fmt = min(n_dev, self.budget.format_size)
        formats = 2 * self.cost(n_fmt) if self.budget.formats and self.spec.output_schema is not None else 0
        return formats + 2 * self.cost(n_test) + self.cost(n_test, equivalence=True)

    def affordable(self, n_cands: int, n_records: int) -> int:
        """How many candidates can be evaluated on ``n_records`` more records within both budgets.

        Time is projected from the run's own pace (seconds per LM call so far): the
        steps after the search (their reserved calls, and the TTFT timing requests, sent
        one at a time) must still fit before the deadline.
        """
        per_cand = max(1, self.cost(n_records))
        by_calls = (self.budget.max_lm_calls - self.reserved - self.lm.calls) // per_cand
        now = time.monotonic()
        pace_s = (now - self.started) / self.lm.calls if self.lm.calls else 0.0
        after_s = pace_s * (self.reserved + _TIMING_COST * 6 * self.budget.timing_records)
        by_time = n_cands if pace_s == 0 else int((self.deadline - now - after_s) // (pace_s * per_cand))
        can = max(0, min(n_cands, by_calls, by_time))
        if by_time < min(n_cands, by_calls):
            self.stop_reason = f"budget: time ({self.budget.max_minutes:g} min, at {pace_s:.2f} s per LM call)"
        return can

    # -- evaluation -------------------------------------------------------------------
    def records_for(self, cand: OptCandidate, records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        if cand.strategy == "similar":
            return with_fewshot(self.spec, records, self.similar, cand.k)
        return list(records)

    def run_eval(self, spec: Spec, examples: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]], *,
                 constrained: bool = True, max_tokens: int | None = None,
                 baseline_replies: Sequence[str] | None = None) -> tuple[EvalReport, list[GenerationResult]]:
        """``evaluate`` through the recorder; its first batch holds the per-record generations."""
        first = len(self.lm.batches)
        report = evaluate(self.lm, spec, records, examples=examples, constrained=constrained, judge_runner=self.runner,
                          max_tokens=max_tokens or self.max_tokens, seed=self.seed, baseline_replies=baseline_replies)
        results = self.lm.batches[first] if len(self.lm.batches) > first else []
        if len(results) != len(records):  # evaluate's contract: all generations in ONE batch, first
            raise RuntimeError(f"evaluate sent {len(results)} generations in its first batch for {len(records)} records")
        del self.lm.batches[first:]
        return report, list(results)

    def evaluate_candidate(self, cand: OptCandidate, records: Sequence[Mapping[str, Any]]) -> None:
        report, results = self.run_eval(cand.spec, cand.examples, self.records_for(cand, records))
        cand.add(report, results)

    def predict(self, cand: OptCandidate) -> None:
        sample = self.records_for(cand, self.dev[: self.budget.feature_records])
        cand.prediction = dict(predict_candidate(
            self.lm, self.model, cand.spec, sample, examples=cand.examples,
            fewshot_count=cand.k if cand.strategy == "similar" else None, block_tokens=self.block_tokens))
        cand.prediction["ttft_expected_ms"] = expected_ttft(
            cand.prediction["ttft_cold_ms"], cand.prediction["ttft_warm_ms"], self.rule.warm_share)

    def fits_context(self, cand: OptCandidate) -> bool:
        """Does the longest dev/test prompt leave room for ``max_tokens``?"""
        pool = self.records_for(cand, self.dev + self.test)
        longest = sorted(pool, key=lambda r: -sum(len(str(v)) for v in r["inputs"].values()))[:2]
        worst = max(self.lm.count_tokens(spec_messages(cand.spec, r["inputs"], examples=cand.examples)) for r in longest)
        cand.prediction["longest_prompt_tokens"] = worst
        return worst + self.max_tokens <= self.lm.identity.max_model_len

    # -- steps ------------------------------------------------------------------------
    def evaluate_baseline(self) -> OptCandidate:
        # The spec as served: its own examples as ``examples_for(spec)`` picks them (seed 0).
        examples = select_examples(self.spec, self.train, seed=0)
        base = OptCandidate("baseline", "original", "baseline", len(examples), self.spec, examples=examples,
                            subset=self.spec.examples.selection)
        needed = self.cost(len(self.dev)) + self.reserved
        if needed > self.budget.max_lm_calls:
            raise ConfigError(f"optimize budget: max_lm_calls: {self.budget.max_lm_calls} is too small for "
                              f"{self.spec.name}: the baseline and the verification alone need up to {needed} LM "
                              f"calls ({len(self.dev)} dev, {len(self.test)} test records); raise it or lower "
                              "dev_size/test_size")
        self.predict(base)
        self.evaluate_candidate(base, self.dev)
        base.rung = len(self.sizes) - 1
        self.base = base
        return base

    def choose_fixed_sets(self) -> dict[int, OptCandidate]:
        """Per fixed count, the example set with the best minibatch score (original instruction)."""
        chosen: dict[int, OptCandidate] = {}
        mb = self.dev[: self.minibatch]
        for k in sorted({k for k in self.budget.fewshot_counts if k > 0}):
            subsets = fixed_subsets(self.spec, self.train, k, n_subsets=max(1, self.budget.fixed_subsets), seed=self.seed)
            trials = [OptCandidate(f"original/fixed{k}", "original", "fixed", k, fixed_spec(self.spec, recs),
                                   examples=recs, subset=name) for name, recs in subsets]
            if not trials:
                self.notes.append(f"fixed{k}: the train split has fewer than {k} records")
                continue
            if len(trials) > 1:
                if self.affordable(len(trials), len(mb)) < len(trials):
                    trials = trials[:1]
                    self.notes.append(f"fixed{k}: budget allowed no choice between example sets; took the spec's rule")
                else:
                    base_key = (build_system(self.base.spec, self.base.examples), self.base.spec.user)
                    for t in trials:
                        if (build_system(t.spec, t.examples), t.spec.user) == base_key:
                            t.add(prefix_report(self.base.report, len(mb)), self.base.results[: len(mb)])
                            t.lm_calls = 0  # the baseline's calls, not this candidate's
                        else:
                            self.evaluate_candidate(t, mb)
                    trials.sort(key=lambda t: -(t.mean or 0.0))  # stable: ties keep the spec's own rule
                    trials[0].notes.append("example set chosen by minibatch score among " + ", ".join(
                        f"{t.subset}={t.mean:.3f}" for t in trials if t.mean is not None))
            chosen[k] = trials[0]
        return chosen

    def grid(self, base: OptCandidate, fixed: dict[int, OptCandidate]) -> list[OptCandidate]:
        out: list[OptCandidate] = []
        base_key = (build_system(base.spec, base.examples), base.spec.user)
        seen = {base_key}
        for vid, vspec in instruction_variants(self.spec, self.distilled, max_variants=self.budget.max_variants):
            for k in self.budget.fewshot_counts:
                if k == 0:
                    cand = OptCandidate(f"{vid}/none", vid, "none", 0, fixed_spec(vspec, []))
                elif k in fixed:
                    f = fixed[k]
                    if vid == "original":
                        cand = f
                    else:
                        cand = OptCandidate(f"{vid}/fixed{k}", vid, "fixed", k, fixed_spec(vspec, f.examples),
                                            examples=f.examples, subset=f.subset)
                else:
                    continue
                out.append(cand)
            if self.similar is not None:
                for k in self.budget.similar_counts:
                    if 0 < k <= len(self.train):
                        out.append(OptCandidate(f"{vid}/similar{k}", vid, "similar", k, per_request_spec(vspec)))
        unique = []
        for cand in out:
            key = (build_system(cand.spec, cand.examples), cand.spec.user)
            if key not in seen:
                seen.add(key)
                unique.append(cand)
            elif key == base_key:
                base.notes.append(f"{cand.id} renders the same prompt as the baseline")
        return unique

    def search(self, base: OptCandidate, grid: list[OptCandidate]) -> tuple[list[OptCandidate], list[OptCandidate]]:
        """Predict, drop what does not fit, run successive halving. Returns (all, alive)."""
        runnable = []
        for cand in grid:
            self.predict(cand)
            if self.fits_context(cand):
                runnable.append(cand)
            else:
                cand.notes.append(f"does not fit the context window: {cand.prediction['longest_prompt_tokens']} prompt "
                                  f"tokens + {self.max_tokens} > {self.lm.identity.max_model_len}")
        base_scores = base.report.scores

        def key(c: OptCandidate) -> tuple:
            return rank_key(c, base_scores, self.max_drop, ttft_kind=self.rule.ttft, slo_ttft_ms=self.spec.slo.ttft_ms,
                            publishable_only=not self.rule.allow_per_request_examples)

        alive, stop = successive_halving(runnable, self.dev, self.sizes, self.evaluate_candidate, key,
                                         eta=self.budget.eta, affordable=self.affordable)
        if stop:
            self.stop_reason = self.stop_reason or stop
        return grid, alive


def optimize(
    engine: Engine,
    spec: Spec,
    *,
    ttft_model: Any,
    budget: OptimizeBudget = OptimizeBudget(),
    seed: int = 0,
    distill_candidates: Any = None,
    selection: SelectionRule = SelectionRule(),
    timing_engine: Engine | None = None,
) -> "OptimizationResult":
    """Tune few-shot examples and instruction density of ``spec``; verify the winner on test.

    Args:
        engine: the target model, ideally a ``CachedEngine`` (re-runs are then free).
        spec: the spec as written: the baseline. It is not changed.
        ttft_model: a fitted ``TTFTModel`` for this engine (``ModelIdentityError`` otherwise).
        budget: sizes and limits.
        seed: shuffles dev/test, draws example sets, seeds every request.
        distill_candidates: instruction variants: a ``DistillResult``, specs, (id, spec) pairs, or None.
        selection: the rule that picks the winner.
        timing_engine: where TTFT is measured (default: the engine behind a cache).

    Returns:
        An ``OptimizationResult`` with the publishable template, the figures, the Pareto
        table and the candidate log.
    """
    from promptdistill.optimize.finish import finish

    ttft_model.check_engine(engine.identity)
    run = _Run(engine, spec, ttft_model, budget, seed, selection, distill_candidates, timing_engine)
    run.split()
    run.sizes = rung_sizes(run.minibatch, len(run.dev), eta=budget.eta)
    run.reserved = run.reserve()
    base = run.evaluate_baseline()
    fixed = run.choose_fixed_sets()
    grid, _alive = run.search(base, run.grid(base, fixed))
    return finish(run, base, grid)


def format_variants(spec: Spec) -> dict[str, tuple[Spec, bool]]:
    """The three ways to get JSON: name -> (spec, constrained decoding).

    'free': the prompt as written, unconstrained; 'schema_in_prompt': the JSON Schema
    added as a rule, unconstrained; 'constrained': decoding constrained to the schema.
    """
    return {"free": (spec, False), "schema_in_prompt": (schema_in_prompt(spec), False), "constrained": (spec, True)}

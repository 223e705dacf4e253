"""The state of one optimization run and its search steps (``optimize`` runs them in order).

The run, in order (each step a method of ``OptimizeRun``, the state ``finish`` reads too):

1. split the dataset (:func:`promptdistill.search.splits.split_records`): train (example
   pool), screen, certify, test (verification only, never seen before step 7);
2. the baseline (the spec as written) on the screen records;
3. per fixed count, the example set with the best screen score: the spec's rule, a
   label-balanced set, then greedy one-example swaps of the best so far (``fixed_subsets`` in all);
4. the grid (instruction variants x none/fixed/similar x counts, and each fixed or no-examples
   candidate with its reply's keys restated after the input: ``variants.py``); every candidate's TTFT
   predicted cold and warm with the fitted TTFT model; what cannot fit the context is dropped;
   per pruned candidate, the variant with one pruned clause restored when that caches more
   of its static prefix in whole KV blocks and is predicted cheaper (``blocks.py``);
5. screen the grid, then race the finalists against the baseline on the certify records
   (:mod:`promptdistill.search.racing`): a finalist can win only when certified
   non-inferior, and replaces the baseline only when its predicted TTFT is lower by more
   than the TTFT model's error, or within it at the baseline's quality or better
   (docs/decisions.md);
6. for the winner: constrained decoding for a spec with a schema, unless another format
   (free text, schema in the prompt; compared only with ``formats``, off in the quick
   preset) gave more valid JSON; then ``max_tokens`` from its completion tokens;
7. verify on the test split, measure TTFT cold and warm on the engine, keep the baseline
   if the winner fails (``finish.py``).

Every LM request is counted (``lm_calls``); with a ``CachedEngine`` the cache misses are
counted too (``real_lm_calls``). TTFT measurement always goes to the engine behind the
cache (a cached timing would be a stale one) and is counted apart (``timing_requests``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from promptdistill.core.errors import ConfigError
from promptdistill.core.jsonio import canonical_json
from promptdistill.core.settings import check, setting
from promptdistill.engine.base import Engine, unwrap_engine
from promptdistill.engine.meter import CallMeter, phase
from promptdistill.evaluate.evaluator import EvalItem, EvalReport, evaluate_many, judge_cost
from promptdistill.judges.runner import JudgeRunner
from promptdistill.optimize.blocks import restored_variants, static_tail
from promptdistill.optimize.candidates import ExampleCandidate
from promptdistill.optimize.examples import (SimilarExamples, fixed_spec, fixed_subsets, per_request_spec,
                                             swapped_subset, with_fewshot)
from promptdistill.optimize.predict import LoadPricing, predict_candidate, prefix_block_tokens
from promptdistill.optimize.select import ASSUMED_WARM_SHARE, SelectionRule, expected_ttft, unmeasured_quality
from promptdistill.optimize.variants import REMINDER_TAG, instruction_variants, with_reply_reminder
from promptdistill.search.budget import Budget, SearchBudget
from promptdistill.search.racing import (Candidate, QualityGoal, RaceSettings, Selection, plan_from_screen, screen,
                                         screen_then_race, select)
from promptdistill.search.references import fill_references
from promptdistill.search.selection import KEPT
from promptdistill.search.sequential import Plan
from promptdistill.search.splits import split_records
from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import build_system, select_examples, spec_messages

__all__ = ["OptimizeBudget", "OptimizeRun", "format_variants", "schema_in_prompt"]

Record = Mapping[str, Any]


@dataclass(frozen=True)
class OptimizeBudget(SearchBudget):
    """Sizes and limits of one run: the search's records and limits (:class:`SearchBudget`)
    and the optimizer's grid. The defaults optimize one spec in minutes on a 2-core CPU."""

    fewshot_counts: tuple[int, ...] = setting((0, 2, 4, 8), "counts of fixed (cacheable) examples; 0 is 'no examples'",
                                              at_least=0, at_most=8)
    similar_counts: tuple[int, ...] = setting((2, 4), "counts of per-request similar examples (TF-IDF neighbours)",
                                              at_least=0, at_most=8)
    fixed_subsets: int = setting(2, "example sets screened per fixed count: the spec's own rule, a label-balanced "
                                 "(or random) set, then greedy swaps (the best so far with one example swapped)", at_least=0)
    max_variants: int = setting(3, "instruction variants, the original included", at_least=1)
    described: bool = setting(True, "add the variant whose instruction is the spec's one-line description, without "
                              "its rules (where constrained decoding carries the format, rules can cost quality)")
    block_aligned: bool = setting(True, "add, per pruned candidate, the variant with one pruned clause restored when "
                                  "it caches more of the static prefix in whole KV blocks and is predicted cheaper")
    reply_reminder: bool = setting(True, "add, per candidate with fixed or no examples, its twin with the reply's keys "
                                   "restated after the input (specs with an output schema)")
    feature_records: int = setting(6, "dev records whose prompts the TTFT predictions average over", at_least=1)
    timing_records: int = setting(3, "test records measured cold and warm on the real engine (0: no measurement)",
                                  at_least=0)
    formats: bool = setting(True, "compare free text, schema-in-prompt and constrained decoding (specs with a schema; "
                            "constrained is published unless another format gave more valid JSON)")
    format_size: int = setting(16, "screen records the three output formats are compared on", at_least=0)

    def __post_init__(self) -> None:
        check(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def schema_in_prompt(spec: Spec) -> Spec:
    """``spec`` with its output schema declared in the prompt, as one more rule."""
    rule = f"Reply with one JSON object that matches this JSON Schema: {canonical_json(spec.output_schema)}"
    return spec.with_changes(constraints=(*spec.constraints, rule))


def format_variants(spec: Spec) -> dict[str, tuple[Spec, bool]]:
    """The three ways to get JSON: name -> (spec, constrained decoding).

    'free': the prompt as written, unconstrained; 'schema_in_prompt': the JSON Schema
    added as a rule, unconstrained; 'constrained': decoding constrained to the schema.
    """
    return {"free": (spec, False), "schema_in_prompt": (schema_in_prompt(spec), False), "constrained": (spec, True)}


def measured_hit_rate(engine: Engine) -> float | None:
    """The prefix-cache token hit rate a vLLM server reports, when the engine is one (else None)."""
    probe = getattr(unwrap_engine(engine), "prefix_cache_hit_rate", None)
    return probe() if callable(probe) else None


def warm_share_from_hit_rate(hit_rate: float, warm_cached_tokens: float, total_tokens: float) -> float:
    """The share of requests that find the static prefix cached, from a token hit rate.

    A warm request of this template serves ``warm_cached_tokens`` of its ``total_tokens``
    from the cache and a cold one none, so ``hit_rate = share * cached / total``.

    Example:
        >>> round(warm_share_from_hit_rate(0.6, 384, 512), 3)
        0.8
    """
    if total_tokens <= 0 or warm_cached_tokens <= 0:
        return 0.0
    return max(0.0, min(1.0, hit_rate * total_tokens / warm_cached_tokens))


class OptimizeRun:
    """Everything one optimization run knows: its inputs, records, candidates and decisions.

    Built by :func:`optimize`; ``finish`` (``finish.py``) reads it to assemble the result.
    """

    def __init__(self, engine: Engine, spec: Spec, ttft_model: Any, budget: OptimizeBudget, seed: int,
                 rule: SelectionRule, distilled: Any, timing_engine: Engine | None = None,
                 judge_engine: Engine | None = None, load_pricing: LoadPricing | None = None):
        ttft_model.check_engine(engine.identity)
        self.spec, self.model, self.budget, self.seed, self.rule = spec, ttft_model, budget, seed, rule
        self.distilled = distilled
        self.outer = engine
        self.timing_engine = timing_engine if timing_engine is not None else unwrap_engine(engine)
        self.meter = CallMeter(engine)
        self.runner = JudgeRunner(self.meter if judge_engine is None else CallMeter(judge_engine), seed=seed)
        self.block_tokens = prefix_block_tokens(engine)
        self.max_drop = spec.slo.max_quality_drop
        self.max_tokens = spec.max_tokens or 256
        self.per_record = judge_cost(spec, 1)
        self.hit_rate = measured_hit_rate(engine) if rule.warm_share is None else None
        if rule.warm_share is not None:
            self.warm_share, self.warm_share_source = rule.warm_share, "configured"
        else:
            self.warm_share, self.warm_share_source = ASSUMED_WARM_SHARE, "assumed"
        if spec.slo.load is not None and load_pricing is None:
            raise ConfigError(f"{spec.name}: slo.load: the spec declares {spec.slo.load.describe()} but no load TTFT "
                              "model was given; fit one (`python -m bench.bench_load --profile-only`) or remove slo.load")
        self.load = load_pricing
        """The declared load's pricing: its percentile is then the cost (None: solo TTFT)."""
        self.resolution_rel = load_pricing.relative_error if load_pricing else ttft_model.relative_error
        self.goal = (QualityGoal(spec.slo.min_quality_gain, latency_cap=spec.slo.ttft_ms)
                     if spec.slo.objective == "quality" else None)
        """The quality-first objective (``slo.objective: quality``): races certify superiority
        by ``slo.min_quality_gain`` and selection takes the best certified gain; None: the
        latency objective (faster, or as fast and no worse)."""
        margin = self.goal.margin if self.goal is not None else self.max_drop
        self.settings = RaceSettings.of(rule, margin=margin, discrete=spec.metric.discrete)
        splits = split_records(spec, seed=seed, screen_size=budget.screen_size, dev_size=budget.dev_size,
                               test_size=budget.test_size)
        self.splits, self.references = fill_references(self.meter, spec, splits, seed=seed)
        self.similar = SimilarExamples(spec, self.splits.train).fit() if self.splits.train else None
        self.search_budget = Budget(self.meter, max_calls=budget.max_lm_calls, max_minutes=budget.max_minutes,
                                    reserved_calls=self.reserved_calls())
        self.notes: list[str] = []
        self.baseline: ExampleCandidate | None = None
        self.grid: list[ExampleCandidate] = []
        self.finalists: list[Candidate] = []
        self.plan: Plan | None = None
        self.kept_reason: str | None = None
        """Why the race did not run (the metric measures nothing here), if it did not."""

    # -- data and budget --------------------------------------------------------------
    def reserved_calls(self) -> int:
        """LM calls the steps after the search may need (formats, verification, a fallback)."""
        n_fmt = min(len(self.splits.screen), self.budget.format_size)
        formats = 2 * n_fmt * self.per_record if self.budget.formats and self.spec.output_schema is not None else 0
        return formats + 2 * len(self.splits.test) * self.per_record  # the baseline and the winner

    def records_for(self, cand: ExampleCandidate, records: Sequence[Record]) -> list[Record]:
        """The records as the candidate's prompt needs them (per-request examples filled in)."""
        if cand.strategy == "similar":
            return with_fewshot(self.spec, records, self.similar, cand.k)
        return list(records)

    def item(self, cand: ExampleCandidate, records: Sequence[Record], *, spec: Spec | None = None,
             constrained: bool = True, max_tokens: int | None = None) -> EvalItem:
        """What evaluating ``cand`` (or ``spec`` with its examples) on ``records`` means."""
        return EvalItem(spec or cand.spec, self.records_for(cand, records), cand.examples, constrained,
                        max_tokens or self.max_tokens)

    def evaluate(self, cands: list[Candidate], records: Sequence[Record]) -> list[EvalReport]:
        """The race's and the screen's evaluation: every candidate in one batch."""
        return evaluate_many(self.meter, [self.item(c, records) for c in cands], judge_runner=self.runner,
                             seed=self.seed)

    def predict(self, cand: ExampleCandidate) -> None:
        sample = self.records_for(cand, self.splits.dev[: self.budget.feature_records])
        p = dict(predict_candidate(self.meter, self.model, cand.spec, sample, examples=cand.examples,
                                   fewshot_count=cand.k if cand.strategy == "similar" else None,
                                   block_tokens=self.block_tokens))
        p["ttft_expected_ms"] = expected_ttft(p["ttft_cold_ms"], p["ttft_warm_ms"], self.warm_share)
        cand.prediction = p
        cand.cost = p[f"ttft_{self.rule.ttft}_ms"]
        if self.load is not None:
            reply = self.reply_tokens(cand)
            p.update(ttft_load_ms=self.load.price(p, reply), load_reply_tokens=reply,
                     load_utilization=self.load.utilization(p, reply), load_latency=self.load.latency,
                     sustainable_rps=self.load.sustainable_rps(p, reply, self.spec.slo.ttft_ms))
            cand.cost = p["ttft_load_ms"]
        cand.static_tokens = int(round(p["static_prefix_tokens"]))

    @property
    def cost_column(self) -> str:
        """The candidates table's column that holds the cost."""
        return "ttft_load_ms" if self.load is not None else f"ttft_{self.rule.ttft}_ms"

    @property
    def latency(self) -> str:
        """What the cost is, as reasons name it: 'P95 TTFT at 4 req/s' or 'expected TTFT'."""
        return self.load.latency if self.load is not None else f"{self.rule.ttft} TTFT"

    def reply_tokens(self, cand: ExampleCandidate) -> float:
        """A candidate's mean reply length, which holds the batch at load: from its own
        screen records once screened, else the baseline's, else the spec's token limit."""
        for source in (cand, self.baseline):
            report = getattr(source, "screen", None)
            if report is not None and report.completion_tokens:
                return float(sum(report.completion_tokens)) / len(report.completion_tokens)
        return float(self.max_tokens)

    def reprice(self, cands: Sequence[ExampleCandidate]) -> None:
        """Price candidates again at the load with their own screened reply lengths."""
        if self.load is not None:
            for cand in cands:
                self.predict(cand)

    def resolution(self, a: Candidate, b: Candidate) -> float:
        """A predicted TTFT difference below the model's error at that point is a tie."""
        return self.resolution_rel * max(a.cost, b.cost)

    def fits_context(self, cand: ExampleCandidate) -> bool:
        """Does the longest dev/test prompt leave room for ``max_tokens``?"""
        pool = self.records_for(cand, self.splits.dev + self.splits.test)
        longest = sorted(pool, key=lambda r: -sum(len(str(v)) for v in r["inputs"].values()))[:2]
        worst = max(self.meter.count_tokens(spec_messages(cand.spec, r["inputs"], examples=cand.examples))
                    for r in longest)
        cand.prediction["longest_prompt_tokens"] = worst
        return worst + self.max_tokens <= self.meter.identity.max_model_len

    def screen(self, cands: Sequence[Candidate], **kwargs: Any) -> list[Candidate]:
        """:func:`promptdistill.search.racing.screen` against the baseline (``keep``, ``eligible``, ``every``)."""
        return screen(self.baseline, cands, self.splits.screen, self.evaluate, budget=self.search_budget,
                      settings=self.settings, resolution=self.resolution, calls_per_record=self.per_record, **kwargs)

    # -- steps ------------------------------------------------------------------------
    def evaluate_baseline(self) -> ExampleCandidate:
        """The spec as served (its own examples, as ``examples_for(spec)`` picks them), screened."""
        examples = select_examples(self.spec, self.splits.train, seed=0)
        base = ExampleCandidate(id="baseline", spec=self.spec, examples=list(examples), variant="original",
                                strategy="baseline", k=len(examples), subset=self.spec.examples.selection)
        needed = len(self.splits.screen) * self.per_record + self.reserved_calls()
        if needed > self.budget.max_lm_calls:
            raise ConfigError(f"optimize budget: max_lm_calls: {self.budget.max_lm_calls} is too small for "
                              f"{self.spec.name}: screening the baseline and the verification alone need up to "
                              f"{needed} LM calls ({len(self.splits.screen)} screen, {len(self.splits.test)} test "
                              "records); raise it or lower screen_size/test_size")
        self.baseline = base
        self.predict(base)
        if self.hit_rate is not None:
            # The server's token hit rate, read as the share of this template's requests
            # that find its static prefix cached (the counters run since the server started).
            self.warm_share = warm_share_from_hit_rate(self.hit_rate, base.prediction["warm_cached_tokens"],
                                                       base.prediction["total_tokens"])
            self.warm_share_source = (f"measured: server prefix-cache hit rate {self.hit_rate:.0%} of prompt "
                                      "tokens, over this template's cacheable share")
            self.predict(base)
        self.screen([])
        self.reprice([base])  # its own reply length, now that it is screened
        if base.screen is not None:
            # A metric that scores the baseline 0 everywhere cannot tell candidates apart:
            # stop before spending the screen on them.
            self.kept_reason = unmeasured_quality(base.screen.scores)
        return base

    @phase("example sets")
    def choose_fixed_sets(self) -> dict[int, ExampleCandidate]:
        """Per fixed count, the example set with the best screen score (original instruction).

        ``fixed_subsets`` sets are screened per count: the first two of ``examples.fixed_subsets``
        (the spec's own rule, then a label-balanced set, or a seeded random one when the rule
        is the balanced one), then a greedy search: each further set is the best so far with one example
        swapped for another train record (seeded, ``examples.swapped_subset``), kept when
        it screens higher. The chosen set is static, so it stays in the cached prefix; the
        candidates table's ``subset`` says which it is ('swap2' for the second swap)."""
        chosen: dict[int, ExampleCandidate] = {}
        if self.kept_reason:
            return chosen
        base_key = (build_system(self.baseline.spec, self.baseline.examples), self.baseline.spec.user)
        n_sets = max(1, self.budget.fixed_subsets)

        def trial(k: int, name: str, recs: Sequence[Record]) -> ExampleCandidate:
            return ExampleCandidate(id=f"original/fixed{k}", spec=fixed_spec(self.spec, recs), examples=list(recs),
                                    variant="original", strategy="fixed", k=k, subset=name)

        def screened(trials: list[ExampleCandidate]) -> bool:
            """Screen ``trials`` (a set rendering the baseline's prompt reuses its replies); False: the budget refused."""
            fresh = [t for t in trials if (build_system(t.spec, t.examples), t.spec.user) != base_key]
            n = len(self.splits.screen)
            if self.search_budget.affordable(len(fresh), n * self.per_record, "example sets") < len(fresh):
                return False
            for t in trials:
                if t not in fresh:
                    t.screen = self.baseline.screen
            for t, report in zip(fresh, self.evaluate(fresh, self.splits.screen)):
                t.add("screen", report)
            return True

        for k in sorted({k for k in self.budget.fewshot_counts if k > 0}):
            subsets = fixed_subsets(self.spec, self.splits.train, k, n_subsets=min(2, n_sets), seed=self.seed)
            trials = [trial(k, name, recs) for name, recs in subsets]
            if not trials:
                self.notes.append(f"fixed{k}: the train split has fewer than {k} records")
                continue
            if n_sets > 1:
                if not screened(trials):
                    trials = trials[:1]
                    self.notes.append(f"fixed{k}: budget allowed no choice between example sets; took the spec's rule")
                else:
                    tried = {tuple(sorted(str(r["id"]) for r in t.examples)) for t in trials}
                    for i in range(n_sets - len(trials)):
                        best = max(trials, key=lambda t: t.mean or 0.0)  # the first of equals: the spec's rule
                        swap = swapped_subset(self.splits.train, best.examples, seed=self.seed + 7919 * k + i,
                                              tried=tried)
                        if swap is None:
                            break
                        t = trial(k, f"swap{i + 1}", swap[0])
                        tried.add(tuple(sorted(str(r["id"]) for r in t.examples)))
                        if not screened([t]):
                            self.notes.append(f"fixed{k}: budget stopped the example-set search after {i} swap(s)")
                            break
                        t.notes.append(f"example set searched: {best.subset} with {swap[1]}")
                        trials.append(t)
                    trials.sort(key=lambda t: -(t.mean or 0.0))  # stable: ties keep the spec's own rule
                    trials[0].notes.append("example set chosen by screen score among " + ", ".join(
                        f"{t.subset}={t.mean:.3f}" for t in trials if t.mean is not None))
            chosen[k] = trials[0]
        return chosen

    def build_grid(self, fixed: dict[int, ExampleCandidate]) -> list[ExampleCandidate]:
        """Variants x example settings, each rendering a prompt different from the baseline's."""
        base = self.baseline
        out: list[ExampleCandidate] = []
        for vid, vspec in instruction_variants(self.spec, self.distilled, max_variants=self.budget.max_variants,
                                               described=self.budget.described):
            for k in self.budget.fewshot_counts:
                if k == 0:
                    out.append(ExampleCandidate(id=f"{vid}/none", spec=fixed_spec(vspec, []), variant=vid,
                                                strategy="none"))
                elif k in fixed:
                    f = fixed[k]
                    out.append(f if vid == "original" else ExampleCandidate(
                        id=f"{vid}/fixed{k}", spec=fixed_spec(vspec, f.examples), examples=f.examples, variant=vid,
                        strategy="fixed", k=k, subset=f.subset))
            if self.similar is not None:
                out += [ExampleCandidate(id=f"{vid}/similar{k}", spec=per_request_spec(vspec), variant=vid,
                                         strategy="similar", k=k)
                        for k in self.budget.similar_counts if 0 < k <= len(self.splits.train)]
        if self.budget.reply_reminder:
            out += [twin for cand in out if (twin := self.reminded(cand)) is not None]
        base_key = (build_system(base.spec, base.examples), base.spec.user)
        seen, unique = {base_key}, []
        for cand in out:
            key = (build_system(cand.spec, cand.examples), cand.spec.user)
            if key not in seen:
                seen.add(key)
                unique.append(cand)
            elif key == base_key:
                base.notes.append(f"{cand.id} renders the same prompt as the baseline")
        return unique

    @staticmethod
    def reminded(cand: ExampleCandidate) -> ExampleCandidate | None:
        """``cand`` with the reply reminder after its input (``variants.with_reply_reminder``);
        None for per-request examples (their user part is rebuilt per request) or a spec
        without an object schema."""
        spec = with_reply_reminder(cand.spec) if cand.strategy in ("none", "fixed") else None
        return None if spec is None else cand.derived(REMINDER_TAG, spec)

    def search(self) -> None:
        """Predict, drop what does not fit, screen, plan, race (sets ``finalists`` and decisions)."""
        runnable = []
        for cand in self.grid:
            self.predict(cand)
            if self.fits_context(cand):
                runnable.append(cand)
            else:
                cand.notes.append(f"does not fit the context window: {cand.prediction['longest_prompt_tokens']} "
                                  f"prompt tokens + {self.max_tokens} > {self.meter.identity.max_model_len}")
        aligned = [c for c in self.block_aligned(runnable) if self.fits_context(c)]
        self.grid += aligned
        runnable += aligned
        if self.kept_reason:
            for cand in runnable:
                cand.notes.append(f"not screened: {self.kept_reason}")
            return
        slo = self.spec.slo.ttft_ms
        eligible = set()
        for cand in runnable:
            if not (cand.publishable or self.rule.allow_per_request_examples):
                cand.notes.append("per-request examples: not publishable as a static template")
            elif self.load is not None and math.isinf(cand.cost):
                cand.notes.append(f"cannot sustain {self.load.load.describe()}: predicted utilization "
                                  f"{cand.prediction['load_utilization']:.2f} of the engine")
            elif slo is not None and cand.cost > slo:
                cand.notes.append(f"misses the SLO: predicted {self.latency} {cand.cost:.0f} ms > {slo:g} ms")
            else:
                eligible.add(id(cand))
        if self.baseline.screen is None:
            self.kept_reason = self.search_budget.reason or "the baseline could not be screened"
            return
        self.finalists, self.plan = screen_then_race(
            self.baseline, runnable, self.splits.screen, self.splits.certify, self.evaluate,
            budget=self.search_budget, settings=self.settings, resolution=self.resolution,
            calls_per_record=self.per_record, eligible=lambda c: id(c) in eligible, every=self.budget.screen_every,
            goal=self.goal)
        if self.plan is None:
            self.plan = self.make_plan()

    def within_slo(self, cands: Sequence[Candidate]) -> list[Candidate]:
        """At a declared load: the candidates priced again with their own reply lengths
        (the screen measured them) that still sustain the load and meet ``slo.ttft_ms``;
        each one that does not is noted and cannot win."""
        if self.load is None:
            return list(cands)
        self.reprice([self.baseline, *cands])  # type: ignore[list-item]
        slo, kept = self.spec.slo.ttft_ms, []
        for cand in cands:
            if math.isinf(cand.cost):
                cand.notes.append(f"cannot sustain {self.load.load.describe()} with its screened replies "
                                  f"({cand.prediction['load_reply_tokens']:.0f} tokens): not published")
            elif slo is not None and cand.cost > slo:
                cand.notes.append(f"misses the SLO with its screened replies: predicted {self.latency} "
                                  f"{cand.cost:.0f} ms > {slo:g} ms: not published")
            else:
                kept.append(cand)
        return kept

    def block_aligned(self, cands: Sequence[ExampleCandidate]) -> list[ExampleCandidate]:
        """Per pruned candidate, the variant with one pruned clause restored whose predicted
        cost is lowest, when it caches more of the static prefix warm and costs less than
        its source (:mod:`promptdistill.optimize.blocks`)."""
        out: list[ExampleCandidate] = []
        # A restore that renders a prompt already in the grid (all clauses back: the original) adds nothing.
        rendered = {(build_system(c.spec, c.examples), c.spec.user) for c in [self.baseline, *self.grid] if c}
        for cand in cands if self.budget.block_aligned else ():
            if cand.strategy not in ("none", "fixed") or cand.variant == "original":
                continue
            options = []
            for cid, spec in restored_variants(self.spec, cand.spec):
                if (build_system(spec, cand.examples), spec.user) in rendered:
                    continue
                alt = cand.derived(cid, spec)
                self.predict(alt)
                if alt.prediction["warm_cached_tokens"] > cand.prediction["warm_cached_tokens"]:
                    options.append(alt)
            best = min(options, key=lambda c: c.cost, default=None)
            if best is None or best.cost >= cand.cost:
                continue
            was, now = cand.prediction, best.prediction
            best.notes.append(
                f"block-aligned: {cand.id} with the baseline's clause {best.variant.rsplit('+', 1)[-1]} restored: "
                f"static prefix {was['static_prefix_tokens']:.0f} -> {now['static_prefix_tokens']:.0f} tokens "
                f"({static_tail(was['static_prefix_tokens'], self.block_tokens)} -> "
                f"{static_tail(now['static_prefix_tokens'], self.block_tokens)} past the last "
                f"{self.block_tokens}-token block); predicted {self.rule.ttft} TTFT {cand.cost:.0f} -> {best.cost:.0f} ms")
            out.append(best)
        return out

    def make_plan(self) -> Plan:
        """What the certify pool can decide without a finalist (the discordance assumed)."""
        return plan_from_screen(self.baseline, self.finalists, pool=len(self.splits.certify), settings=self.settings)

    def select(self) -> Selection:
        """The winner, by which clause and why (the baseline when nothing was certified)."""
        if self.kept_reason:
            return Selection(self.baseline, self.baseline, KEPT, f"{self.kept_reason}; keeping the baseline",
                             self.latency)
        chosen = select(self.baseline, self.within_slo(self.finalists), resolution=self.resolution,
                        latency=self.latency, goal=self.goal)
        if self.plan is not None and chosen.kept:
            chosen = dataclasses.replace(chosen, reason=f"{chosen.reason} ({self.plan.sentence()})")
        return chosen

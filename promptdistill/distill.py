"""The instruction distillation loop: prune and rewrite an instruction, keep what the task needs.

``distill(engine, spec)`` runs, for each round (from the best candidate so far):

1. split the instruction and constraints into clauses; protected ones (placeholders,
   output-format rules) are never touched (:mod:`promptdistill.clauses`);
2. score each unprotected clause twice: the ``clause_necessity`` judge, and ablation
   (drop the clause, measure the change in mean score on the dev minibatch);
3. build candidates: prune at several thresholds (judge, ablation, combined), rewrite
   kept clauses with ``distill_rewrite`` at several target lengths, plus any proposals
   given in the config (e.g. from a DSPy optimizer);
4. evaluate them with successive halving (all on the minibatch, the best on the full
   dev split) and take the shortest one whose quality is within ``max_quality_drop`` of
   the original's;
5. stop when a round finds nothing shorter, after ``max_rounds``, or when the budget
   (LM calls, minutes) would be exceeded: no step starts that could overrun it;
6. evaluate the original and the winner on held-out test records they never saw.

Every LM request (generation, judges, repairs) is counted. Everything is recorded:
``DistillResult.write(path)`` writes the candidates (text, tokens, density, scores, calls)
to Parquet, plus the clause table and the judge statistics beside it.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from promptdistill.clauses import Clause, apply_clauses, join_clauses, mark_clause, split_clauses
from promptdistill.distill_result import DistillResult, clause_rows, write_result
from promptdistill.distill_search import (
    Candidate,
    ClauseScore,
    agreement_rate,
    prune_keep_sets,
    rung_sizes,
    select_winner,
    successive_halving,
)
from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult
from promptdistill.evaluate import EvalReport, evaluate_many, judge_cost
from promptdistill.judge_runner import JudgeRunner
from promptdistill.render import render_text

__all__ = ["DistillConfig", "DistillResult", "distill", "write_result"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillConfig:
    """Every knob of the loop. The defaults are sized for a few minutes with SmolLM2-135M
    on an idle 2-core CPU; on a busy machine the time budget cuts the search short."""

    seed: int = 0
    """Shuffles the dev/test records and seeds every request: same seed, same result."""
    minibatch_size: int = 8
    """Dev records for ablation and the first successive-halving rung."""
    dev_size: int = 16
    """Dev records of the full split (the last rung)."""
    test_size: int = 16
    """Held-out test records for the final cross-validation."""
    thresholds: tuple[float, ...] = (0.5, 0.75)
    """Necessity thresholds for pruning (judge and combined scores are in [0, 1])."""
    target_ratios: tuple[float, ...] = (0.5, 0.3)
    """Rewrite targets: share of the unprotected clauses' words to aim for."""
    eta: int = 2
    """Successive halving keeps the best 1/eta of the candidates per rung."""
    max_rounds: int = 2
    max_lm_calls: int = 300
    """The search budget: LM requests (generation + judges + repairs)."""
    max_minutes: float = 10.0
    """The search's time budget: a step starts only if it is projected to end in time."""
    max_quality_drop: float | None = None
    """Largest allowed drop of the mean score; None takes the spec's ``slo.max_quality_drop``."""
    ablation: bool = True
    rewrite: bool = True
    proposals: tuple[str, ...] = ()
    """Extra instructions to consider in round 1 (e.g. from MIPROv2 or GEPA)."""
    calibrate: bool = True
    """On programmatic metrics, measure answer_equivalence's agreement with the metric."""
    judge_examples: int = 3
    """(input, expected) pairs shown to the clause_necessity judge."""
    judges_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("minibatch_size", "dev_size", "max_rounds", "max_lm_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.test_size < 0:
            raise ValueError(f"test_size must be at least 0, got {self.test_size}.")
        if self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be positive, got {self.max_minutes}.")
        if any(not 0 <= t <= 1 for t in self.thresholds):
            raise ValueError(f"thresholds must be in [0, 1], got {self.thresholds}.")
        if any(not 0 < r < 1 for r in self.target_ratios):
            raise ValueError(f"target_ratios must be in (0, 1), got {self.target_ratios}.")


class _Meter(EngineWrapper):
    """Counts every request that reaches the engine (the budget's LM calls). Token counts
    go to the wrapped engine, so the distiller counts as the engine that serves it."""

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        self.calls += len(requests)
        return self.engine.generate(requests, progress=progress)


class _Budget:
    """LM calls are a hard bound (a step starts only if its worst case fits). Time is
    bounded by projection: a step starts only if, at the seconds per call seen so far,
    it would end before the deadline."""

    def __init__(self, meter: _Meter, max_calls: int, max_minutes: float):
        self.meter, self.max_calls = meter, max_calls
        self.start = time.monotonic()
        self.deadline = self.start + 60.0 * max_minutes
        self.reason: str | None = None

    def afford(self, calls: int, what: str) -> bool:
        """May a step costing at most ``calls`` start? Records why not."""
        now = time.monotonic()
        per_call_s = (now - self.start) / self.meter.calls if self.meter.calls else 0.0
        if now > self.deadline:
            reason = f"budget: time ran out before {what}"
        elif now + per_call_s * calls > self.deadline:
            reason = f"budget: {what} would take about {per_call_s * calls:.0f} s, {self.deadline - now:.0f} s left"
        elif self.meter.calls + calls > self.max_calls:
            reason = f"budget: {what} needs up to {calls} LM calls, {self.max_calls - self.meter.calls} left"
        else:
            return True
        self.reason = self.reason or reason  # the first refusal is the one that ends the search
        return False


class _Run:
    """The state of one distillation run."""

    def __init__(self, engine: Engine, spec: Any, config: DistillConfig, dev: list, test: list, examples: list):
        self.spec, self.config, self.dev, self.test, self.examples = spec, config, dev, test, examples
        self.meter = _Meter(engine)
        self.runner = JudgeRunner(self.meter, judges_dir=config.judges_dir, seed=config.seed)
        self.max_drop = spec.slo.max_quality_drop if config.max_quality_drop is None else config.max_quality_drop
        self.minibatch = dev[: config.minibatch_size]
        self.candidates: list[Candidate] = []
        self.clause_scores: list[tuple[int, ClauseScore, bool]] = []
        self.judge_metric = spec.metric.kind == "judge_rubric"
        self.base_replies: dict[str, str] | None = None
        """The original's dev replies by record id (what answer_equivalence compares with)."""

    # -- helpers --------------------------------------------------------------------------
    def tokens(self, spec: Any) -> int:
        return len(self.meter.tokenize(spec.instruction_text()))

    def candidate(self, cid: str, origin: str, rnd: int, spec: Any, parent: Candidate | None, kept=()) -> Candidate:
        from promptdistill.features import semantic_density

        text = spec.instruction_text()
        return Candidate(cid, origin, rnd, spec, self.tokens(spec), semantic_density(text),
                         parent.id if parent else None, tuple(kept))

    def evaluate(self, specs: list, records: Sequence[Mapping], *, equivalence: bool = False) -> list[EvalReport]:
        base = None
        if equivalence and self.base_replies is not None:
            base = [self.base_replies[str(r["id"])] for r in records]
        return evaluate_many(self.meter, specs, records, examples=self.examples, judge_runner=self.runner,
                             seed=self.config.seed, baseline_replies=base)

    def cost(self, n_specs: int, n_records: int, equivalence: bool = False) -> int:
        return n_specs * judge_cost(self.spec, n_records, with_equivalence=equivalence)

    # -- steps ----------------------------------------------------------------------------
    def score_clauses(self, base: Candidate, clauses: tuple[Clause, ...]) -> list[ClauseScore]:
        prunable = [c for c in clauses if not c.protected]
        log.info("scoring %d clauses (%d protected): judge, then ablation on %d records",
                 len(prunable), len(clauses) - len(prunable), len(self.minibatch))
        judged: dict[str, Any] = {}
        if prunable and self.budget.afford(2 * len(prunable), "the clause_necessity judge"):
            examples = "\n".join(
                f"Input: {render_text(base.spec.user, r['inputs'])}\nExpected: {_text(r['expected'])}"
                for r in self.minibatch[: self.config.judge_examples]
            )
            items = [{"task": base.spec.description, "instruction": mark_clause(base.spec, c, clauses=clauses),
                      "clause": c.text, "examples": examples} for c in prunable]
            judged = dict(zip((c.id for c in prunable), self.runner.run("clause_necessity", items)))
        deltas: dict[str, float | None] = {}
        mb = len(self.minibatch)
        if self.config.ablation and prunable and self.budget.afford(self.cost(len(prunable), mb), "ablation"):
            ablated = [apply_clauses(base.spec, [x.id for x in clauses if x.id != c.id], all_clauses=clauses)
                       for c in prunable]
            reports = self.evaluate(ablated, self.minibatch)
            base_mb = _mean(base.report.scores[:mb])
            for c, rep in zip(prunable, reports):
                deltas[c.id] = None if rep.mean is None or base_mb is None else rep.mean - base_mb
        scores = []
        for c in clauses:
            v = judged.get(c.id)
            scores.append(ClauseScore(
                c, judge_score=v.value["score"] if v is not None and v.valid else None,
                judge_reason=v.value["reason"] if v is not None and v.valid else None,
                judge_error=v.error if v is not None else None, ablation_delta=deltas.get(c.id)))
        return scores

    def build_candidates(self, base: Candidate, rnd: int, clauses, scores: list[ClauseScore]) -> list[Candidate]:
        out: list[Candidate] = []
        keep_sets = prune_keep_sets(scores, self.config.thresholds)
        for rule, keep in keep_sets.items():
            spec = apply_clauses(base.spec, keep, all_clauses=clauses)
            out.append(self.candidate(f"r{rnd}-prune-{rule}", f"prune:{rule}", rnd, spec, base, keep))
        if self.config.rewrite:
            out += self.rewrites(base, rnd, clauses, scores, keep_sets)
        if rnd == 1:
            protected = [c for c in clauses if c.protected]
            for n, text in enumerate(self.config.proposals):
                spec = _with_protected(base.spec, text, protected)
                out.append(self.candidate(f"r{rnd}-proposal-{n}", "proposal", rnd, spec, base))
        unique, seen = [], {base.text}
        for cand in out:
            # A candidate longer than its parent can never win (selection wants fewer tokens).
            if cand.text not in seen and cand.instruction_tokens <= base.instruction_tokens:
                seen.add(cand.text)
                unique.append(cand)
        return unique

    def rewrites(self, base: Candidate, rnd: int, clauses, scores, keep_sets) -> list[Candidate]:
        by_id = {s.clause.id: s for s in scores}
        sources = {"all": tuple(c.id for c in clauses)}
        for rule in ("combined@0.50", "judge@0.50", "ablation"):
            if rule in keep_sets:
                sources[rule] = keep_sets[rule]
                break
        jobs, items = [], []
        for rule, keep in sources.items():
            kept = [c for c in clauses if c.id in keep and not c.protected]
            if not kept:
                continue
            words = sum(len(c.text.split()) for c in kept)
            lines = "\n".join(f"- {'NECESSARY: ' if (by_id[c.id].combined or 0) >= 0.75 else ''}{c.text}" for c in kept)
            for ratio in self.config.target_ratios:
                jobs.append((rule, ratio, keep, words))
                items.append({"task": base.spec.description, "clauses": lines, "target_words": str(max(5, round(words * ratio)))})
        if not items or not self.budget.afford(2 * len(items), "distill_rewrite"):
            return []
        # About 1.5 tokens per word plus the JSON around it; a cut-off reply is repaired with twice as many.
        limit = min(self.runner.definition("distill_rewrite").max_tokens,
                    max(2 * int(item["target_words"]) for item in items) + 24)
        verdicts = self.runner.run("distill_rewrite", items, max_tokens=limit, check=_rewrite_check)
        out = []
        for (rule, ratio, keep, words), v in zip(jobs, verdicts):
            if not v.valid or len(v.value["instruction"].split()) >= words:
                continue  # recorded in the judge stats; a rewrite that is not shorter is no candidate
            protected = [c for c in clauses if c.protected]
            spec = _with_protected(base.spec, v.value["instruction"].strip(), protected)
            out.append(self.candidate(f"r{rnd}-rewrite-{rule}@{ratio:.2f}", f"rewrite:{rule}@{ratio:.2f}", rnd, spec, base, keep))
        return out

    def halving(self, cands: list[Candidate]) -> tuple[list[Candidate], bool]:
        sizes = rung_sizes(len(self.minibatch), len(self.dev), eta=self.config.eta)
        eq = self.judge_metric

        def run(alive: list[Candidate], records: Sequence[Mapping], last: bool) -> list[EvalReport]:
            log.info("successive halving: %d candidates x %d new records", len(alive), len(records))
            return self.evaluate([c.spec for c in alive], records, equivalence=eq and last)

        def afford(n_cands: int, n_records: int, last: bool) -> bool:
            return self.budget.afford(self.cost(n_cands, n_records, eq and last), "successive halving")

        return successive_halving(cands, self.dev, sizes, run, base_scores=self.original.report.scores,
                                  max_drop=self.max_drop, eta=self.config.eta, can_afford=afford)

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> DistillResult:
        start = time.monotonic()
        self.original = self.candidate("r0-baseline", "baseline", 0, self.spec, None)
        self.candidates.append(self.original)
        # The clock starts after the first candidate: its density imports scikit-learn, which
        # is not search time (seconds on a busy machine).
        self.budget = _Budget(self.meter, self.config.max_lm_calls, self.config.max_minutes)
        stop = "no improvement"
        rounds = 0
        best = self.original
        if not self.budget.afford(self.cost(1, len(self.dev)), "the baseline evaluation"):
            stop = self.budget.reason or stop
        else:
            self.original.report = self.evaluate([self.spec], self.dev)[0]
            self.original.rung, self.original.lm_calls = 0, self.original.report.lm_calls
            self.base_replies = dict(zip(self.original.report.record_ids, self.original.report.replies))
            log.info("baseline: mean %s on %d dev records (%d LM calls so far)",
                     _fmt(self.original.report.mean), len(self.dev), self.meter.calls)
            for rnd in range(1, self.config.max_rounds + 1):
                rounds = rnd
                log.info("round %d from %s (%d instruction tokens)", rnd, best.id, best.instruction_tokens)
                clauses = split_clauses(best.spec)
                scores = self.score_clauses(best, clauses)
                cands = self.build_candidates(best, rnd, clauses, scores)
                self.candidates += cands
                finalists, cut = self.halving(cands) if cands else ([], False)
                winner = select_winner(best, finalists, self.original.report.scores, self.max_drop)
                log.info("round %d: %d candidates, best %s (%d tokens, mean %s); %d LM calls so far", rnd, len(cands),
                         winner.id, winner.instruction_tokens, _fmt(winner.mean), self.meter.calls)
                kept = set(winner.kept) if winner is not best else {c.id for c in clauses}
                self.clause_scores += [(rnd, s, s.clause.protected or s.clause.id in kept) for s in scores]
                if cut or self.budget.reason:
                    stop = self.budget.reason or "budget"
                    best = winner
                    break
                if winner is best:
                    stop = "no improvement" if cands else "no candidates"
                    break
                best = winner
            else:
                stop = f"max_rounds ({self.config.max_rounds}) reached"
        search_calls = self.meter.calls
        winner = best
        log.info("search stopped (%s) after %d LM calls; held-out test and calibration next", stop, search_calls)
        test_reports = self.cross_validate(winner)
        calibration = self.calibrate()
        return DistillResult(
            spec_name=self.spec.name, seed=self.config.seed, config=self.config, original=self.original,
            winner=winner, candidates=self.candidates, clause_rows=clause_rows(self.clause_scores),
            judge_stats=self.runner.stats_rows(),
            agreement_rate=agreement_rate([s for _, s, _ in self.clause_scores]),
            calibration=calibration, test=test_reports, rounds=rounds, stop_reason=stop,
            search_lm_calls=search_calls, total_lm_calls=self.meter.calls,
            elapsed_s=time.monotonic() - start, max_quality_drop=self.max_drop,
        )

    def cross_validate(self, winner: Candidate) -> dict[str, EvalReport]:
        """The original and the winner on test records (outside the search budget)."""
        if not self.test:
            return {}
        specs = [self.spec] if winner is self.original else [self.spec, winner.spec]
        reports = self.evaluate(specs, self.test)
        return {"original": reports[0], "winner": reports[-1]}

    def calibrate(self) -> dict[str, Any] | None:
        """answer_equivalence vs. the metric on the baseline's dev replies (programmatic metrics)."""
        report = self.original.report
        if not self.config.calibrate or self.judge_metric or report is None:
            return None
        from promptdistill.calibration import equivalence_agreement

        return equivalence_agreement(self.runner, self.spec, self.dev, report.replies, report.scores)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _text(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _mean(values: Sequence[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def _rewrite_check(value: Any) -> str | None:
    """Why a schema-valid rewrite is still unusable (the runner then repairs it once)."""
    import re

    text = value.get("instruction", "").strip() if isinstance(value, Mapping) else ""
    if not text:
        return "the instruction is empty"
    if "{" in text or "}" in text:
        return "the instruction must not contain curly braces"
    if text[-1] not in ".!?)\"'":
        return "the instruction stops mid-sentence"
    sentences = [" ".join(s.lower().split()) for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 4]
    if len(sentences) != len(set(sentences)):
        return "the instruction repeats a sentence; say each rule once"
    return None


def _with_protected(spec: Any, instruction: str, protected: Sequence[Clause]) -> Any:
    """``instruction`` plus every protected clause verbatim (instruction ones appended,
    constraint ones as the constraints)."""
    extra = join_clauses([c for c in protected if c.source == "instruction"])
    text = instruction if not extra or extra in instruction else f"{instruction.rstrip()} {extra}"
    return spec.with_changes(instruction=text, constraints=tuple(c.text for c in protected if c.source == "constraint"))


def split_records(spec: Any, config: DistillConfig) -> tuple[list, list, list]:
    """(dev, test, few-shot examples) for ``spec``: dev/test shuffled by the seed, then cut."""
    from promptdistill.datasets import dataset_for, records
    from promptdistill.specs import select_examples

    df = dataset_for(spec)
    rng = random.Random(config.seed)
    dev, test = records(df, "dev"), records(df, "test")
    rng.shuffle(dev)
    rng.shuffle(test)
    examples = select_examples(spec, records(df, "train"), seed=config.seed)
    return dev[: config.dev_size], test[: config.test_size], examples


def distill(
    engine: Engine,
    spec: Any,
    *,
    config: DistillConfig = DistillConfig(),
    dev: Sequence[Mapping] | None = None,
    test: Sequence[Mapping] | None = None,
    examples: Sequence[Mapping] | None = None,
) -> DistillResult:
    """Distill ``spec``'s instruction on ``engine``; ``spec`` itself is not changed.

    Args:
        engine: The target model (wrap it in ``CachedEngine`` to make re-runs free).
        spec: The spec whose instruction and constraints are distilled.
        config: Budgets, thresholds and sizes.
        dev, test, examples: Records to use instead of the spec's dataset splits.

    Returns:
        A ``DistillResult``; ``result.winner.spec`` is the distilled spec.
    """
    if dev is None or test is None or examples is None:
        d, t, e = split_records(spec, config)
        dev = d if dev is None else list(dev)[: config.dev_size]
        test = t if test is None else list(test)[: config.test_size]
        examples = e if examples is None else examples
    if not dev:
        raise ValueError("distill needs at least one dev record.")
    config = replace(config, minibatch_size=min(config.minibatch_size, len(dev)))
    return _Run(engine, spec, config, list(dev), list(test), list(examples)).run()

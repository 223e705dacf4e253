"""The instruction distillation loop: prune and rewrite an instruction, keep what the task needs.

``distill(engine, spec)`` runs, for each round (from the best screened candidate so far):

1. split the instruction and constraints into clauses; protected ones (placeholders,
   output-format rules) are never touched (:mod:`promptdistill.specs.clauses`);
2. score each unprotected clause: the ``clause_necessity`` judge, then ablation (drop the
   clause, measure the change in mean score on the screen records) where the judge is
   unsure (``ablate_clear`` ablates every clause);
3. build candidates: prune at several thresholds (judge, ablation, combined), rewrite
   kept clauses with ``distill_rewrite`` at several target lengths, plus any proposals
   given in the config (e.g. from a DSPy optimizer);
4. screen them on the screen records (:func:`promptdistill.search.racing.screen`); the
   best plausible shorter one is the next round's starting point.

Then the finalists (the best screened candidates of every round) race the original in
turn on the certify records (:func:`promptdistill.search.racing.screen_then_race`): a
finalist wins only when it is certified non-inferior (error rate ``alpha`` over the
finalists raced); the shortest certified one is the winner, else the original is kept.
The screen's top ``finalists`` are handed to the optimizer whether raced or not.
Finally the original and the winner are scored on held-out test records, and the winner is
reverted to the original if it fails there (:func:`promptdistill.search.held_out.check_on_test`,
the optimizer's check too).

No step starts whose LM calls could overrun the budget, nor once the time cap has passed
(:class:`promptdistill.search.budget.Budget`: time is a safety cap, never projected).
Every LM request (generation, judges, repairs) is counted; everything is recorded in a
``DistillResult``.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from promptdistill.core.display import format_number
from promptdistill.core.settings import check, restated, setting
from promptdistill.distill.candidates import ClauseScore, DistillCandidate, agreement_rate, prune_keep_sets
from promptdistill.specs.clauses import Clause, apply_clauses, join_clauses, mark_clause, split_clauses
from promptdistill.distill.result import DistillResult, clause_rows
from promptdistill.engine.base import Engine
from promptdistill.engine.meter import CallMeter, phase
from promptdistill.evaluate.evaluator import EvalItem, EvalReport, evaluate_many, judge_cost
from promptdistill.judges.calibration import equivalence_agreement
from promptdistill.judges.runner import JudgeRunner
from promptdistill.search.budget import Budget, SearchBudget
from promptdistill.search.held_out import check_on_test
from promptdistill.search.racing import (Candidate, RaceKnobs, RaceSettings, Selection, paired_mean, plan_from_screen,
                                         screen, screen_then_race, select)
from promptdistill.search.selection import KEPT
from promptdistill.search.references import fill_references
from promptdistill.search.splits import Splits, split_records
from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import select_examples
from promptdistill.specs.render import render_text, value_text
from promptdistill.specs.text import semantic_density

__all__ = ["DistillConfig", "distill"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillConfig(SearchBudget, RaceKnobs):
    """Every knob of the loop: the search's records and limits (:class:`SearchBudget`), the
    race's (:class:`RaceKnobs`), and the distiller's own. The defaults fit a few minutes with
    SmolLM2-135M on an idle 2-core CPU; on a busy machine the time cap cuts the search short."""

    seed: int = setting(0, "shuffles the dev/test records and seeds every request: same seed, same result")
    max_lm_calls: int = restated(SearchBudget, "max_lm_calls", 1500)
    max_minutes: float = restated(SearchBudget, "max_minutes", 10.0)
    thresholds: tuple[float, ...] = setting((0.5, 0.75), "necessity thresholds for pruning (judge and combined "
                                            "scores are in [0, 1])", at_least=0, at_most=1)
    target_ratios: tuple[float, ...] = setting((0.5, 0.3), "rewrite targets: share of the unprotected clauses' "
                                               "words to aim for", above=0, below=1)
    max_rounds: int = setting(2, "most rounds of prune and rewrite", at_least=1)
    max_quality_drop: float | None = setting(None, "largest allowed drop of the mean score; unset: the spec's "
                                             "slo.max_quality_drop")
    # The nightly turns the race off: the optimizer races the same finalists (with its
    # example settings) against the same baseline, so a race here would spend the same records twice.
    race: bool = setting(True, "race the finalists on the certify records")
    ablation: bool = setting(True, "score clauses by ablation too (drop each, measure the screen score)")
    ablate_clear: bool = setting(False, "ablate the clauses the judge scored 1 or 5 too; off: ablation spends its "
                                 "screen records only on the clauses the judge is unsure of (2-4, or no score)")
    rewrite: bool = setting(True, "rewrite kept clauses with distill_rewrite, besides pruning")
    proposals: tuple[str, ...] = setting((), "extra instructions to consider in round 1 (e.g. from MIPROv2 or GEPA)")
    calibrate: bool = setting(True, "on programmatic metrics, measure answer_equivalence's agreement with the metric")
    judge_examples: int = setting(3, "(input, expected) pairs shown to the clause_necessity judge")

    def __post_init__(self) -> None:
        check(self)


def _judge_is_clear(verdict: Any) -> bool:
    """A valid clause_necessity score at either end of the scale. Ablating such a clause on
    the screen records only adds candidates that overrule the judge on a few records' evidence;
    a candidate that drops a needed clause fails its screen or race like any other. Such
    ablations were a large share of the search's tokens and changed no screen score
    (docs/bench/peers.md)."""
    return verdict is not None and verdict.valid and verdict.value["score"] in (1, 5)


COST = "instruction tokens"
"""What a distilled candidate's cost counts (the latency the distiller's selection decides on)."""


def _exact(a: Candidate, b: Candidate) -> float:
    """Instruction tokens are counted, not predicted: any difference is a difference."""
    return 0.0


class _Run:
    """The state of one distillation run."""

    def __init__(self, engine: Engine, spec: Spec, config: DistillConfig, splits: Splits, examples: list,
                 judge_engine: Engine | None = None):
        self.spec, self.config, self.examples = spec, config, examples
        self.meter = CallMeter(engine)
        self.splits, self.references = fill_references(self.meter, spec, splits, seed=config.seed)
        judge_lm = self.meter if judge_engine is None else CallMeter(judge_engine)
        self.runner = JudgeRunner(judge_lm, seed=config.seed)
        self.max_drop = spec.slo.max_quality_drop if config.max_quality_drop is None else config.max_quality_drop
        self.settings = RaceSettings.of(config, margin=self.max_drop, discrete=spec.metric.discrete)
        self.per_record = judge_cost(spec, 1)
        test_calls = 2 * judge_cost(spec, len(self.splits.test))
        self.budget = Budget(self.meter, max_calls=config.max_lm_calls, max_minutes=config.max_minutes,
                             reserved_calls=test_calls)
        self.candidates: list[DistillCandidate] = []
        self.clause_scores: list[tuple[int, ClauseScore, bool]] = []

    # -- helpers --------------------------------------------------------------------------
    def candidate(self, cid: str, origin: str, rnd: int, spec: Spec, parent: DistillCandidate | None,
                  kept: Sequence[str] = ()) -> DistillCandidate:
        text = spec.instruction_text()
        return DistillCandidate(id=cid, spec=spec, examples=self.examples, cost=len(self.meter.tokenize(text)),
                                static_tokens=len(self.meter.tokenize(text)), origin=origin, round=rnd,
                                parent=parent.id if parent else None, kept=tuple(kept), density=semantic_density(text))

    def evaluate(self, cands: list[Candidate], records: Sequence[Mapping]) -> list[EvalReport]:
        items = [EvalItem(c.spec, records, self.examples) for c in cands]
        return evaluate_many(self.meter, items, judge_runner=self.runner, seed=self.config.seed)

    # -- steps ----------------------------------------------------------------------------
    def score_clauses(self, base: DistillCandidate, clauses: tuple[Clause, ...]) -> list[ClauseScore]:
        prunable = [c for c in clauses if not c.protected]
        records = self.splits.screen
        log.info("scoring %d clauses (%d protected): judge, then ablation on %d records",
                 len(prunable), len(clauses) - len(prunable), len(records))
        judged: dict[str, Any] = {}
        if prunable and self.budget.afford(2 * len(prunable), "clause_necessity judge calls"):
            shown = "\n".join(
                f"Input: {render_text(base.spec.user, r['inputs'])}\nExpected: {value_text(r['expected'])}"
                for r in records[: self.config.judge_examples]
            )
            items = [{"task": base.spec.description, "instruction": mark_clause(base.spec, c, clauses=clauses),
                      "clause": c.text, "examples": shown} for c in prunable]
            with self.meter.phase("clause judge"):
                judged = dict(zip((c.id for c in prunable), self.runner.run("clause_necessity", items)))
        deltas: dict[str, float | None] = {}
        unsure = [c for c in prunable if self.config.ablate_clear or not _judge_is_clear(judged.get(c.id))]
        if self.config.ablation and len(unsure) < len(prunable):
            log.info("ablation skips %d of %d clauses: the judge scored them 1 or 5", len(prunable) - len(unsure),
                     len(prunable))
        n_ablate = self.budget.affordable(len(unsure), self.per_record * len(records), "ablations") \
            if self.config.ablation and unsure else 0
        if n_ablate:
            ablated = [Candidate(f"ablate-{c.id}", apply_clauses(base.spec, [x.id for x in clauses if x.id != c.id],
                                                                  all_clauses=clauses))
                       for c in unsure[:n_ablate]]
            with self.meter.phase("ablations"):
                reports = self.evaluate(ablated, records)
            for c, report in zip(unsure, reports):
                deltas[c.id] = paired_mean(report, base.screen)
        scores = []
        for c in clauses:
            v = judged.get(c.id)
            scores.append(ClauseScore(
                c, judge_score=v.value["score"] if v is not None and v.valid else None,
                judge_reason=v.value["reason"] if v is not None and v.valid else None,
                judge_error=v.error if v is not None else None, ablation_delta=deltas.get(c.id)))
        return scores

    def build_candidates(self, base: DistillCandidate, rnd: int, clauses: tuple[Clause, ...],
                         scores: list[ClauseScore]) -> list[DistillCandidate]:
        out: list[DistillCandidate] = []
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
        unique, seen = [], {c.text for c in self.candidates}
        for cand in out:
            # A candidate longer than its parent can never win (selection wants fewer tokens).
            if cand.text not in seen and cand.instruction_tokens <= base.instruction_tokens:
                seen.add(cand.text)
                unique.append(cand)
        return unique

    @phase("rewrites")
    def rewrites(self, base: DistillCandidate, rnd: int, clauses: tuple[Clause, ...], scores: list[ClauseScore],
                 keep_sets: dict[str, tuple[str, ...]]) -> list[DistillCandidate]:
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
                items.append({"task": base.spec.description, "clauses": lines,
                              "target_words": str(max(5, round(words * ratio)))})
        if not items or not self.budget.afford(2 * len(items), "distill_rewrite calls"):
            return []
        # About 1.5 tokens per word plus the JSON around it; a cut-off reply is repaired with twice as many.
        limit = min(self.runner.definition("distill_rewrite").max_tokens,
                    max(2 * int(item["target_words"]) for item in items) + 24)
        verdicts = self.runner.run("distill_rewrite", items, max_tokens=limit, check=_rewrite_check)
        protected = [c for c in clauses if c.protected]
        out = []
        for (rule, ratio, keep, words), v in zip(jobs, verdicts):
            if not v.valid or len(v.value["instruction"].split()) >= words:
                continue  # recorded in the judge stats; a rewrite that is not shorter is no candidate
            spec = _with_protected(base.spec, v.value["instruction"].strip(), protected)
            out.append(self.candidate(f"r{rnd}-rewrite-{rule}@{ratio:.2f}", f"rewrite:{rule}@{ratio:.2f}", rnd, spec,
                                      base, keep))
        return out

    def screen(self, cands: Sequence[DistillCandidate], **kwargs: Any) -> list[Candidate]:
        """:func:`promptdistill.search.racing.screen` against the original (``keep``, ``eligible``, ``every``)."""
        return screen(self.original, cands, self.splits.screen, self.evaluate, budget=self.budget,
                      settings=self.settings, resolution=_exact, calls_per_record=self.per_record, **kwargs)

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> DistillResult:
        start = time.monotonic()
        self.original = self.candidate("r0-baseline", "baseline", 0, self.spec, None)
        self.candidates.append(self.original)
        # The clock starts after the first candidate: its density imports scikit-learn and
        # the tokenizer warms up, which is not search time (seconds on a busy machine).
        self.budget.restart_clock()
        stop, rounds, best = "no improvement", 0, self.original
        self.screen([])
        if self.original.screen is None:
            stop = self.budget.reason or "budget: the baseline could not be screened"
        else:
            log.info("baseline: mean %s on %d screen records", format_number(self.original.screen.mean, ".3f"), self.original.screen.n)
            for rnd in range(1, self.config.max_rounds + 1):
                rounds = rnd
                log.info("round %d from %s (%d instruction tokens)", rnd, best.id, best.instruction_tokens)
                clauses = split_clauses(best.spec)
                scores = self.score_clauses(best, clauses)
                cands = self.build_candidates(best, rnd, clauses, scores)
                self.candidates += cands
                if rnd == self.config.max_rounds and not self.config.race:
                    # The last round's candidates go to the optimizer, which screens them itself.
                    self.clause_scores += [(rnd, s, True) for s in scores]
                    stop = f"max_rounds ({self.config.max_rounds}) reached"
                    break
                # The next round starts from the cheapest plausible candidate shorter than this round's base.
                ranked = self.screen(cands, keep=1, eligible=lambda c, cost=best.cost: c.cost < cost,
                                     every=self.config.screen_every)
                step = ranked[0] if ranked else None
                log.info("round %d: %d candidates, %d screened; next: %s (%d LM calls so far)", rnd, len(cands),
                         sum(c.screen is not None for c in cands), step.id if step else "none", self.meter.calls)
                kept = set(step.kept) if step is not None else {c.id for c in clauses}
                self.clause_scores += [(rnd, s, s.clause.protected or s.clause.id in kept) for s in scores]
                if self.budget.reason:
                    stop = self.budget.reason
                    best = step or best
                    break
                if step is None:
                    stop = "no shorter plausible candidate" if cands else "no candidates"
                    break
                best = step
            else:
                stop = f"max_rounds ({self.config.max_rounds}) reached"
        log.info("search stopped (%s) after %d LM calls", stop, self.meter.calls)
        if self.config.race:
            raced, plan = screen_then_race(
                self.original, self.candidates[1:], self.splits.screen, self.splits.certify, self.evaluate,
                budget=self.budget, settings=self.settings, resolution=_exact, calls_per_record=self.per_record,
                every=self.config.screen_every, log=log.info) if self.original.screen is not None else ([], None)
            plan = plan or self.plan([])
            log.info("%s", plan.sentence())
            selection = select(self.original, raced, resolution=_exact, latency=COST)
            # Handed to the optimizer: the screen's top finalists, raced or not (the raced first).
            finalists = self.screen(self.candidates[1:], every=self.config.screen_every) \
                if self.original.screen is not None else []
        else:
            # The optimizer screens the variants itself, with its example settings: hand over
            # every candidate, shortest first, without spending records on them here.
            finalists = sorted(self.candidates[1:], key=lambda c: (c.instruction_tokens, c.id))
            plan = self.plan(finalists)
            log.info("%s", plan.sentence())
            selection = Selection(self.original, self.original, KEPT,
                                  f"not raced here: the {len(finalists)} finalist(s) go to the optimizer, which races "
                                  "them against the baseline", COST)
        search_calls = self.meter.calls
        selection, test_reports, test_stop = self.held_out(selection)
        calibration = self.calibrate()
        return DistillResult(
            spec_name=self.spec.name, seed=self.config.seed, config=self.config, original=self.original,
            winner=selection.winner, candidates=self.candidates, finalists=[c.id for c in finalists],
            reason=selection.reason, selection=selection.record(), test_stop=test_stop,
            plan=plan, clause_rows=clause_rows(self.clause_scores), judge_stats=self.runner.stats_rows(),
            agreement_rate=agreement_rate([s for _, s, _ in self.clause_scores]), calibration=calibration,
            test=test_reports, rounds=rounds, stop_reason=stop, search_lm_calls=search_calls,
            total_lm_calls=self.meter.calls, elapsed_s=time.monotonic() - start, max_quality_drop=self.max_drop,
            splits=self.splits.sizes(), tokens_processed=self.tokens_processed(),
            engines={"task": self.meter.identity.to_dict(), "judge": self.runner.engine.identity.to_dict()},
        )

    def tokens_processed(self) -> int:
        """Prompt and completion tokens of every request, judges' included."""
        meters = {id(m): m for m in (self.meter, self.runner.engine)}.values()
        return sum(m.prompt_tokens + m.completion_tokens for m in meters)

    def plan(self, finalists: Sequence[Candidate]) -> Any:
        """What the certify pool can decide, at a discordance the screen records cannot rule out."""
        return plan_from_screen(self.original, finalists, pool=len(self.splits.certify), settings=self.settings)

    @phase("held-out test")
    def held_out(self, selection: Selection) -> tuple[Selection, dict[str, EvalReport], str | None]:
        """The original and the winner on the test records (calls reserved in the budget),
        the winner reverted to the original if it fails there
        (:func:`promptdistill.search.held_out.check_on_test`, as the optimizer's).

        Returns:
            The selection after the check, the reports (``original``, ``winner``, and the
            reverted candidate's as ``reverted``), and which look stopped the scoring.
        """
        winner = selection.winner
        cands = [self.original] if winner is self.original else [self.original, winner]
        self.budget.release()
        if not self.splits.test or not self.budget.afford(len(cands) * self.per_record * len(self.splits.test),
                                                          "held-out test calls"):
            return selection, {}, None

        def items(records: Sequence[Mapping]) -> list[EvalItem]:
            return [EvalItem(c.spec, records, self.examples) for c in cands]

        check = check_on_test(selection, items, self.splits.test, engine=self.meter, judge_runner=self.runner,
                              seed=self.config.seed, max_drop=self.max_drop)
        if check.reverted:
            return check.selection, {"original": check.baseline, "winner": check.baseline,
                                     "reverted": check.winner}, check.stop
        return check.selection, {"original": check.baseline, "winner": check.winner}, check.stop

    @phase("calibration")
    def calibrate(self) -> dict[str, Any] | None:
        """answer_equivalence vs. the metric on the baseline's screen replies (programmatic metrics)."""
        report = self.original.screen
        if not self.config.calibrate or self.spec.metric.kind == "judge_rubric" or report is None:
            return None
        return equivalence_agreement(self.runner, self.spec, self.splits.screen, report.replies, report.scores)


def _rewrite_check(value: Any) -> str | None:
    """Why a schema-valid rewrite is still unusable (the runner then repairs it once)."""
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


def _with_protected(spec: Spec, instruction: str, protected: Sequence[Clause]) -> Spec:
    """``instruction`` plus every protected clause verbatim (instruction ones appended,
    constraint ones as the constraints)."""
    extra = join_clauses([c for c in protected if c.source == "instruction"])
    text = instruction if not extra or extra in instruction else f"{instruction.rstrip()} {extra}"
    return spec.with_changes(instruction=text, constraints=tuple(c.text for c in protected if c.source == "constraint"))


def distill(engine: Engine, spec: Spec, *, config: DistillConfig = DistillConfig(), splits: Splits | None = None,
            judge_engine: Engine | None = None) -> DistillResult:
    """Distill ``spec``'s instruction on ``engine``; ``spec`` itself is not changed.

    Args:
        engine: the target model (wrap it in ``CachedEngine`` to make re-runs free).
        spec: the spec whose instruction and constraints are distilled.
        config: budgets, thresholds, sizes, the race's error rate.
        splits: records to use instead of the spec's dataset split by ``config``.
        judge_engine: where judge calls go (default: ``engine``).

    Returns:
        A ``DistillResult``; ``result.winner.spec`` is the distilled spec (the original when
        no shorter candidate was certified non-inferior).
    """
    if splits is None:
        splits = split_records(spec, seed=config.seed, screen_size=config.screen_size, dev_size=config.dev_size,
                               test_size=config.test_size)
    if not splits.screen:
        raise ValueError("distill needs at least one dev record.")
    examples = select_examples(spec, splits.train, seed=config.seed)
    return _Run(engine, spec, config, splits, list(examples), judge_engine).run()

"""Against DSPy's own optimizer: MIPROv2 (``auto="light"``) and ours, same engine, split and metric.

The question a user asks: does ours reach the same quality with fewer LM calls and a
faster prompt? For each spec (default ``ticket_triage`` and ``word_problems``):

* one split for both sides: the first ``--train`` train records (ours: the example pool;
  MIPROv2: the trainset it bootstraps demos from), ``--dev`` dev records (ours: the
  search; MIPROv2: the valset) and ``--test`` held-out test records, drawn as the
  optimizer draws them (dev and test shuffled by the seed). Ours runs on a copy of the
  dataset holding exactly these records, so it cannot see more data than MIPROv2;
* one metric: the spec's (``metrics.score_reply``). MIPROv2's program is a
  ``dspy.Predict`` whose output fields are the spec's output schema, through the
  repo's batching bridge with ``dspy.JSONAdapter`` (SmolLM2-135M cannot follow
  ChatAdapter's markers; the adapter's JSON Schema is enforced by constrained decoding);
  its replies are scored as the JSON object of its output fields. Its starting
  instruction is the spec's system text (instruction, context, rules), as ours starts;
* LM calls counted the same way on both sides: generation requests that reached the
  engine (a counter right above it, below each side's cache: ours a fresh ``CachedEngine``,
  MIPROv2 a fresh DSPy cache). Ours runs as the nightly pipeline does: the distiller
  (quick budget; ``--no-distill`` skips it), then the optimizer. Ours' count covers both, its own held-out
  verification included; MIPROv2's covers ``compile``; scoring MIPROv2 on test is counted
  apart (``test_eval_calls``);
* the resulting prompt, measured the same way for both: MIPROv2's instruction and demos
  are exported as a promptdistill template (``template_content``: instruction as the
  system text, demos as fixed examples in the spec's example format); its prompt tokens
  (engine tokenizer, mean over the test records), instruction tokens (system text without
  the examples) and TTFT cold and warm (``optimize.verify.measure_ttft``, the function the
  optimizer's verification uses) on the same test records. ``dspy_prompt_tokens`` is what
  JSONAdapter actually sends (its field descriptions, demos as chat turns), and
  ``test_mean_as_template`` is the exported template's test score through the evaluator.

Ours runs without its TTFT verification step (``timing_records=0``): both resulting
prompts are timed after both runs, one after the other, by the same function, so they
are measured under the same conditions.

Usage:
    python -m bench.bench_mipro [ticket_triage word_problems ...] [--train 24] [--dev 16] [--test 16]
        [--num-threads 8] [--max-bootstrapped-demos 2] [--max-labeled-demos 2]
        [--budget-calls 600] [--budget-minutes 15] [--timing-records 3] [--ttft-model PATH] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from bench.common import setup, write_report

setup()

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult  # noqa: E402

DEFAULT_SPECS = ("ticket_triage", "word_problems")
RATIO_FIELDS = ("lm_calls", "minutes", "prompt_tokens", "ttft_cold_ms")


# -- counting -----------------------------------------------------------------------------


class CallCounter(EngineWrapper):
    """Counts the generation requests that reach the engine (the same count for both sides).

    A prompt longer than the context window would fail the whole batch it came in (the
    engine raises for the batch); it is answered alone with an empty reply and an error
    instead, so one over-long proposer prompt fails one DSPy call, not its batch-mates.
    Such prompts never reach the model and are counted in ``rejected``, not ``calls``.
    """

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.calls = 0
        self.rejected = 0

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        from promptdistill.core.errors import PromptTooLongError

        try:
            results = self.engine.generate(requests, progress=progress)
        except PromptTooLongError:
            return self._generate_fitting(requests, progress)
        self.calls += len(requests)
        return results

    def _generate_fitting(self, requests: Sequence[GenerationRequest], progress: bool) -> list[GenerationResult]:
        limit = self.identity.max_model_len
        sizes = [self.count_tokens(r.chat() if r.messages is not None else r.prompt) for r in requests]
        fits = [i for i, n in enumerate(sizes) if n < limit]
        done = dict(zip(fits, self.engine.generate([requests[i] for i in fits], progress=progress))) if fits else {}
        self.calls += len(fits)
        self.rejected += len(requests) - len(fits)
        out = []
        for i, req in enumerate(requests):
            out.append(done.get(i) or GenerationResult(
                text="", prompt_tokens=sizes[i], completion_tokens=0, cached_tokens=0, finish_reason="length",
                ttft_ms=0.0, e2e_ms=0.0, valid=False if req.json_schema or req.choices else None,
                error=f"prompt too long: {sizes[i]} tokens, max_model_len {limit}"))
        return out


# -- one split for both sides ---------------------------------------------------------------


def split_records(spec: Any, n_train: int, n_dev: int, n_test: int, seed: int) -> dict[str, list[dict]]:
    """The first ``n_train`` train records; dev and test shuffled by ``seed`` (as the optimizer does), cut."""
    from promptdistill.specs.datasets import dataset_for, records

    df = dataset_for(spec)
    rng = random.Random(seed)
    dev, test = records(df, "dev"), records(df, "test")
    rng.shuffle(dev)
    rng.shuffle(test)
    return {"train": records(df, "train")[:n_train], "dev": dev[:n_dev], "test": test[:n_test]}


def subset_spec(spec: Any, split: Mapping[str, Sequence[dict]], folder: Path) -> Any:
    """``spec`` on a dataset file holding exactly the split's records (what ours may see)."""
    from promptdistill.specs.datasets import write_records

    path = write_records(folder / spec.dataset.name, [*split["train"], *split["dev"], *split["test"]])
    return spec.with_changes(dataset=path)


def optimizer_test_order(spec: Any, seed: int) -> list[dict]:
    """The subset's test records in the order the optimizer verifies them (same shuffle)."""
    return split_records(spec, 0, 0, 10**9, seed)["test"]


# -- the DSPy side -----------------------------------------------------------------------------


_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def output_fields(spec: Any) -> dict[str, Any] | None:
    """name -> Python type of the spec's output schema properties; None: a free-text ``answer``."""
    schema = spec.output_schema or {}
    props = schema.get("properties") if schema.get("type") == "object" else None
    if not props:
        return None
    out = {}
    for name, prop in props.items():
        if "enum" in prop:
            out[name] = Literal[tuple(prop["enum"])]  # type: ignore[misc]
        else:
            out[name] = _JSON_TYPES.get(prop.get("type"), str)
    return out


def start_instruction(spec: Any) -> str:
    """The spec's system text without examples: the instruction both optimizers start from."""
    from promptdistill.specs import build_system
    from promptdistill.specs.render import render_text

    return render_text(build_system(spec, ()), {})


def make_signature(spec: Any) -> Any:
    import dspy

    fields: dict[str, Any] = {n: (str, dspy.InputField(desc=spec.input_descriptions.get(n) or n)) for n in spec.inputs}
    outs = output_fields(spec) or {"answer": str}
    for name, typ in outs.items():
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


def make_metric(spec: Any):
    from promptdistill.specs.metrics import score_reply

    def metric(example: Any, pred: Any, trace: Any = None, *_: Any) -> float | bool:
        score = score_reply(spec.metric, reply_of(spec, pred), expected_of(spec, example), output_schema=spec.output_schema)
        score = float(score or 0.0)
        return score >= 1.0 if trace is not None else score  # bootstrapping keeps fully correct traces only

    return metric


def demo_records(spec: Any, demos: Sequence[Any]) -> list[dict]:
    """MIPROv2's demos as dataset records (bootstrapped demos keep the model's outputs)."""
    outs = output_fields(spec)
    recs = []
    for i, d in enumerate(demos):
        try:
            inputs = {n: d[n] for n in spec.inputs}
            expected = {k: d[k] for k in outs} if outs else d["answer"]
        except (KeyError, AttributeError):
            continue
        recs.append({"id": f"mipro-demo-{i}", "split": "train", "inputs": inputs, "expected": expected})
    return recs


def mipro_template_spec(spec: Any, instruction: str, demos: Sequence[Mapping[str, Any]]) -> Any:
    """The MIPROv2 program as a spec: its instruction is the whole system text, its demos fixed examples."""
    examples = dataclasses.replace(spec.examples, count=len(demos), selection="first", ids=())
    return spec.with_changes(instruction=instruction.strip() or spec.instruction, context=None, constraints=(),
                             examples=examples)


def run_mipro(counter: CallCounter, spec: Any, split: Mapping[str, Sequence[dict]], args: argparse.Namespace,
              cache_dir: Path) -> dict[str, Any]:
    import dspy
    from dspy.teleprompt import MIPROv2

    from promptdistill.engine.dspy_bridge import make_dspy_lm

    prompt_lm = make_dspy_lm(counter, cache_dir=cache_dir, max_tokens=args.proposer_max_tokens, max_batch=32)
    task_lm = prompt_lm.copy(max_tokens=2 * (spec.max_tokens or 128) + 16)  # JSONAdapter's whitespace, some slack
    dspy.configure(lm=task_lm, adapter=dspy.JSONAdapter())
    metric = make_metric(spec)
    trainset = [to_example(spec, r) for r in split["train"]]
    valset = [to_example(spec, r) for r in split["dev"]]
    teleprompter = MIPROv2(metric=metric, prompt_model=prompt_lm, task_model=task_lm, auto="light",
                           max_bootstrapped_demos=args.max_bootstrapped_demos, max_labeled_demos=args.max_labeled_demos,
                           num_threads=args.num_threads, max_errors=10**6, seed=args.seed + 9, verbose=False)
    before = counter.calls
    started = time.monotonic()
    program = teleprompter.compile(dspy.Predict(make_signature(spec)), trainset=trainset, valset=valset,
                                   minibatch_size=min(35, len(valset)))
    minutes = (time.monotonic() - started) / 60.0
    calls = counter.calls - before

    before = counter.calls
    program.set_lm(task_lm)
    evaluation = dspy.Evaluate(devset=[to_example(spec, r) for r in split["test"]], metric=metric,
                               num_threads=args.num_threads, max_errors=10**6, failure_score=0.0,
                               display_progress=False)(program)
    test_scores = [float(s) for _, _, s in evaluation.results]
    test_calls = counter.calls - before
    predictor = program.predictors()[0]
    prompt_lm.bridge.close()
    return {"program": program, "instruction": predictor.signature.instructions, "demos": list(predictor.demos),
            "signature": predictor.signature, "minutes": minutes, "lm_calls": calls, "test_scores": test_scores,
            "test_eval_calls": test_calls, "bridge_calls": prompt_lm.bridge.calls}


# -- the measurements both sides share ------------------------------------------------------------


def prompt_figures(engine: Engine, model: Any, spec: Any, content: Mapping[str, Any], examples: Sequence[Any],
                   records: Sequence[Mapping[str, Any]], *, n_timing: int, block_tokens: int, label: str,
                   fewshot_count: int | None, seed: int) -> dict[str, Any]:
    """Prompt and instruction tokens (engine tokenizer) and TTFT cold/warm (``measure_ttft``)."""
    from promptdistill.optimize.verify import measure_ttft
    from promptdistill.specs.render import render_messages

    tokens = [engine.count_tokens(render_messages(content["system"], content["user"], r["inputs"])) for r in records]
    rows = measure_ttft(engine, content, spec, examples, records, model=model, n=n_timing, block_tokens=block_tokens,
                        fewshot_count=fewshot_count, label=label, seed=seed)

    def mean_ttft(cache: str) -> float | None:
        sel = [r["ttft_ms"] for r in rows if r["cache"] == cache]
        return round(statistics.fmean(sel), 1) if sel else None

    return {"prompt_tokens": round(statistics.fmean(tokens), 1) if tokens else None,
            "instruction_tokens": len(engine.tokenize(start_instruction(spec))),
            "ttft_cold_ms": mean_ttft("cold"), "ttft_warm_ms": mean_ttft("warm"), "timing_n": len(rows) // 2}


def compare_spec(engine: Engine, model: Any, name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from promptdistill.core.stats import bootstrap_ci
    from promptdistill.engine.cache import CachedEngine
    from promptdistill.evaluate import evaluate
    from promptdistill.optimize import OptimizeBudget, SimilarExamples, optimize, prefix_block_tokens
    from promptdistill.optimize.examples import with_fewshot
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.prompt import template_content

    spec = load_spec(name)
    if spec.metric.kind == "judge_rubric":
        raise SystemExit(f"{name}: a judge-scored spec; MIPROv2 needs a programmatic metric here (pick another spec)")
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    split = split_records(spec, args.train, args.dev, args.test, args.seed)
    sub = subset_spec(spec, split, folder)
    test = optimizer_test_order(sub, args.seed)
    sizes = {k: len(v) for k, v in split.items()}
    block = prefix_block_tokens(engine)
    print(f"\n===== {name}: train {sizes['train']}, dev {sizes['dev']}, test {sizes['test']}", flush=True)

    # -- ours
    counter = CallCounter(engine)
    budget = OptimizeBudget(
        max_lm_calls=args.budget_calls, max_minutes=args.budget_minutes, dev_size=len(split["dev"]),
        test_size=len(split["test"]), screen_size=min(8, max(1, len(split["dev"]) // 2)), timing_records=0,
        fewshot_counts=tuple(k for k in (0, 2, 4, 8) if k <= len(split["train"])),
        format_size=min(16, len(split["dev"])))
    cached = CachedEngine(counter, folder / "lm_cache.sqlite")
    started = time.monotonic()
    try:
        distilled = None
        if not args.no_distill:  # the pipeline's order: distill the instruction, then optimize
            from promptdistill.distill import distill
            from promptdistill.pipeline.budgets import budget_preset

            config = dataclasses.replace(budget_preset("quick")["distill"], dev_size=len(split["dev"]),
                                         screen_size=min(8, max(1, len(split["dev"]) // 2)), test_size=0)
            print(f"[{name}] ours: distill (quick budget, {config.max_lm_calls} LM calls at most)", flush=True)
            distilled = distill(cached, sub, config=dataclasses.replace(config, seed=args.seed))
        print(f"[{name}] ours: optimize (budget {budget.max_lm_calls} LM calls, {budget.max_minutes:g} min)", flush=True)
        result = optimize(cached, sub, ttft_model=model, budget=budget, seed=args.seed, timing_engine=engine,
                          distill_candidates=distilled)
    finally:
        cached.close()
    ours_minutes = (time.monotonic() - started) / 60.0
    w = result.winner
    strategy, k = w.get("strategy"), int(w.get("k") or 0)
    records = test
    if strategy == "similar":
        records = with_fewshot(sub, test, SimilarExamples(sub, split["train"]).fit(), k)
    ours = {"test_mean": w.get("test_mean"), "test_ci_low": w.get("test_ci_low"), "test_ci_high": w.get("test_ci_high"),
            "test_n": w.get("test_n"), "lm_calls": counter.calls, "lm_requests": result.lm_calls,
            "minutes": round(ours_minutes, 3), "winner": result.winner_id, "kept_baseline": result.kept_baseline,
            "examples": k if strategy != "baseline" else len(result.winner_examples), "strategy": strategy,
            "stop": result.stop_reason}
    print(f"[{name}] ours: {result.winner_id}, test {ours['test_mean']}, {ours['lm_calls']} LM calls, "
          f"{ours['minutes']} min", flush=True)

    # -- MIPROv2
    counter = CallCounter(engine)
    print(f"[{name}] MIPROv2 auto=light: compile", flush=True)
    m = run_mipro(counter, sub, split, args, folder / "dspy_cache")
    demos = demo_records(sub, m["demos"])
    mspec = mipro_template_spec(sub, m["instruction"], demos)
    content = template_content(mspec, demos, max_tokens=sub.max_tokens)
    ci = bootstrap_ci(m["test_scores"], seed=args.seed)
    as_template = evaluate(engine, mspec, test, examples=demos, max_tokens=sub.max_tokens, seed=args.seed)
    from dspy.adapters import JSONAdapter

    dspy_tokens = [engine.count_tokens(JSONAdapter().format(m["signature"], m["demos"], dict(r["inputs"])))
                   for r in test]
    mipro = {"test_mean": ci.mean, "test_ci_low": ci.low, "test_ci_high": ci.high, "test_n": ci.n,
             "lm_calls": m["lm_calls"], "minutes": round(m["minutes"], 3), "examples": len(demos),
             "test_eval_calls": m["test_eval_calls"], "rejected_too_long": counter.rejected,
             "test_mean_as_template": as_template.mean,
             "dspy_prompt_tokens": round(statistics.fmean(dspy_tokens), 1) if dspy_tokens else None,
             "instruction": m["instruction"]}
    print(f"[{name}] MIPROv2: test {mipro['test_mean']}, {mipro['lm_calls']} LM calls, {mipro['minutes']} min, "
          f"{len(demos)} demos", flush=True)

    # -- both resulting prompts, timed one after the other by the optimizer's own function
    print(f"[{name}] timing both prompts ({args.timing_records} test records, cold and warm)", flush=True)
    from promptdistill.specs.render import render_messages

    warmup = render_messages(result.content["system"], result.content["user"], records[0]["inputs"])
    engine.generate([GenerationRequest(messages=warmup, max_tokens=1)])  # discarded: the first timing after a pause
    ours.update(prompt_figures(engine, model, result.winner_spec, result.content, result.winner_examples, records,
                               n_timing=args.timing_records, block_tokens=block, label="ours",
                               fewshot_count=k if strategy == "similar" else None, seed=args.seed))
    mipro.update(prompt_figures(engine, model, mspec, content, demos, test, n_timing=args.timing_records,
                                block_tokens=block, label="mipro", fewshot_count=None, seed=args.seed))

    ratios = {}
    for key in RATIO_FIELDS:
        a, b = ours.get(key), mipro.get(key)
        ratios[f"{key}_ours_over_mipro"] = round(a / b, 3) if a is not None and b else None
    a, b = ours["test_mean"], mipro["test_mean"]
    ratios["test_mean_ours_minus_mipro"] = None if a is None or b is None else round(a - b, 4)
    print(f"[{name}] ratios ours/mipro: {ratios}", flush=True)
    return {"split": sizes, "ours": ours, "mipro": mipro, "ratios": ratios}


def markdown(rows: Mapping[str, Mapping[str, Any]]) -> str:
    def f(v: Any, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["# Ours against DSPy MIPROv2 (auto=light): same engine, split and metric", "",
             "| spec | side | test mean [95% CI] | LM calls | minutes | prompt tokens | instruction tokens | TTFT cold ms |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        for side in ("ours", "mipro"):
            s = r[side]
            lines.append(f"| {name} | {side} | {f(s['test_mean'])} [{f(s['test_ci_low'])}, {f(s['test_ci_high'])}] | "
                         f"{s['lm_calls']} | {f(s['minutes'], '.1f')} | {f(s['prompt_tokens'], '.0f')} | "
                         f"{s['instruction_tokens']} | {f(s['ttft_cold_ms'], '.0f')} |")
        q = r["ratios"]
        lines.append(f"| {name} | ours/mipro | {f(q['test_mean_ours_minus_mipro'], '+.3f')} (diff) | "
                     f"{f(q['lm_calls_ours_over_mipro'], '.2f')}x | {f(q['minutes_ours_over_mipro'], '.2f')}x | "
                     f"{f(q['prompt_tokens_ours_over_mipro'], '.2f')}x | | {f(q['ttft_cold_ms_ours_over_mipro'], '.2f')}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", nargs="*", default=list(DEFAULT_SPECS))
    p.add_argument("--train", type=int, default=24, help="train records (ours: example pool; MIPROv2: trainset)")
    p.add_argument("--dev", type=int, default=16, help="dev records (ours: search; MIPROv2: valset)")
    p.add_argument("--test", type=int, default=16, help="held-out test records both are scored on")
    p.add_argument("--num-threads", type=int, default=8, help="DSPy's threads (their calls are batched)")
    p.add_argument("--max-bootstrapped-demos", type=int, default=2)
    p.add_argument("--max-labeled-demos", type=int, default=2)
    p.add_argument("--proposer-max-tokens", type=int, default=256, help="max_tokens of MIPROv2's proposer calls")
    p.add_argument("--budget-calls", type=int, default=600, help="ours: most LM calls")
    p.add_argument("--budget-minutes", type=float, default=15.0, help="ours: wall-clock limit")
    p.add_argument("--timing-records", type=int, default=3, help="test records timed cold and warm per prompt")
    p.add_argument("--no-distill", action="store_true", help="ours without the distiller (optimize the instruction as written)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.train < 1 or args.dev < 2 or args.test < 2:
        p.error("--train must be at least 1, --dev and --test at least 2")

    import dspy

    from promptdistill.engine import load_engine
    from promptdistill.pipeline.ttft_models import load_ttft_model
    from promptdistill.registry.store import Registry

    settings = load_settings()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-mipro-") as tmp, load_engine(settings.engine) as engine:
        model = load_ttft_model(Registry(settings.registry), engine.identity)
        for name in args.specs:
            rows[name] = compare_spec(engine, model, name, args, Path(tmp))
        identity = engine.identity.to_dict()
    config = {k: getattr(args, k) for k in ("train", "dev", "test", "num_threads", "max_bootstrapped_demos",
                                             "max_labeled_demos", "proposer_max_tokens", "budget_calls",
                                             "budget_minutes", "timing_records", "seed")}
    config.update({"mipro_auto": "light", "dspy_version": dspy.__version__, "adapter": "JSONAdapter",
                   "ttft_model": model.version})
    result = {"config": config, "identity": identity, "specs": rows}
    write_report("mipro", result, markdown(rows))
    return result


if __name__ == "__main__":
    main()

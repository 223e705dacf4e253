"""A spec on 100 test records: which part of the prompt moves quality (real engine).

Run from a checkout: ``python -m bench.ablate_prompt [spec ...]`` (default invoice_extraction,
which also gets DSPy-style field-list variants, the description with 2 and 4 demos and the
spec with 4). Its figures are in
docs/bench/peers_invoice_tokens.md (Follow-up). A one-off study, not part of make bench.
"""
import sys
import time
from dataclasses import replace

from bench.common import setup

setup()  # offline and quiet, before the heavy imports (as every benchmark)

from promptdistill.core.config import load_settings  # noqa: E402
from promptdistill.core.stats import bootstrap_ci, paired_diffs  # noqa: E402
from promptdistill.engine import load_engine  # noqa: E402
from promptdistill.evaluate.evaluator import EvalItem, evaluate_many  # noqa: E402
from promptdistill.optimize.examples import fixed_spec, fixed_subsets, select_examples  # noqa: E402
from promptdistill.optimize.variants import described_variant  # noqa: E402
from promptdistill.search.splits import split_records  # noqa: E402
from promptdistill.specs import load_spec  # noqa: E402


def ablate(engine, name: str) -> None:
    spec = load_spec(f"prompts/{name}.yaml")
    s = split_records(spec, seed=0, screen_size=16, dev_size=1000, test_size=200)
    test = s.test[:100]
    base_ex = list(select_examples(spec, s.train, seed=0))
    four = fixed_subsets(spec, s.train, 4, seed=0)[0][1]  # the optimizer's first fixed4 subset

    def variant(examples: list, **changes: object) -> tuple:
        return fixed_spec(spec.with_changes(**changes), examples), examples

    variants = {
        f"baseline ({len(base_ex)} demos)": (spec, base_ex),
        "baseline, no demos": variant([]),
        # What the optimizer's described variant renders (OptimizeBudget.described), without examples.
        "description only, no constraints, no demos": (fixed_spec(described_variant(spec), []), []),
    }
    if name == "invoice_extraction":
        desc = spec.description
        # DSPy's ChatAdapter field list for this signature (what its prompts start with).
        fields = ("Your input fields are:\n1. `document` (str): The text of the invoice or invoice email, as "
                  "received.\nYour output fields are:\n1. `vendor` (str)\n2. `invoice_number` (str)\n3. `total` "
                  "(float)\n4. `currency` (Literal['USD', 'EUR', 'GBP'])\n5. `due_date` (str): YYYY-MM-DD\n")
        variants |= {
            "description + constraints, no demos": variant([], instruction=desc),
            "field list + description, no constraints, no demos": variant([], instruction=fields + "Objective: " + desc,
                                                                          constraints=()),
            "field list + instruction + constraints, no demos": variant([], instruction=fields + spec.instruction),
            "description + constraints, 2 demos": variant(base_ex, instruction=desc),
            # The optimizer's described/fixed2 and /fixed4 (MIPROv2's program adds 4 demos).
            "description only, no constraints, 2 demos": (fixed_spec(described_variant(spec), base_ex), base_ex),
            "description only, no constraints, 4 demos": (fixed_spec(described_variant(spec), four), four),
            "the spec as written, 4 demos": (fixed_spec(spec, four), four),  # the optimizer's original/fixed4
        }
    t = time.perf_counter()
    reps = evaluate_many(engine, [EvalItem(sp, test, ex) for sp, ex in variants.values()], seed=0)
    print(f"{name}: {len(variants)} x {len(test)} in {time.perf_counter() - t:.0f} s")
    b = reps[0]
    for (label, _), r in zip(variants.items(), reps):
        ci = bootstrap_ci(r.scores)
        d = bootstrap_ci(paired_diffs(r.scores, b.scores).tolist())
        print(f"{label:<60} {ci.mean:.3f} [{ci.low:.3f}, {ci.high:.3f}]  vs baseline {d.mean:+.3f} "
              f"[{d.low:+.3f}, {d.high:+.3f}]  prompt tokens {r.prompt_tokens / r.n:.0f}  valid {r.valid_json_rate:.2f}")


def main(names: list[str]) -> None:
    with load_engine(replace(load_settings().engine, backend="local", timeout_s=900)) as engine:
        for name in names:
            ablate(engine, name)


if __name__ == "__main__":
    main(sys.argv[1:] or ["invoice_extraction"])

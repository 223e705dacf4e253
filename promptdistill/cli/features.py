"""``promptdistill features NAME``: prompt features of a spec and a sample of its dataset."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("features", help="prompt features (served tokenizer) of a spec and a dataset sample")
    p.add_argument("name", help="spec name or file")
    p.add_argument("--sample", type=int, default=10, help="records to show (default 10)")
    p.add_argument("--split", default="dev", choices=("train", "dev", "test"))
    p.add_argument("--examples", type=int, default=None, help="few-shot count (default: the spec's)")
    p.add_argument("--model", default=None, help="HF model folder for the tokenizer (default: the configured engine model)")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    p.add_argument("--prompts-dir", default="prompts")
    p.set_defaults(func=run)


def _tokenizer(args: argparse.Namespace):
    from promptdistill.engine.tokenizer import cached_tokenizer

    model = args.model
    if model is None:
        from promptdistill.core.config import load_settings

        model = load_settings(args.config).engine.model
    if model == "embedded":
        from promptdistill.engine.embedded import ensure_embedded_model

        model = str(ensure_embedded_model())
    return cached_tokenizer(model)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from promptdistill.specs.checks import layout_warnings
    from promptdistill.specs.datasets import dataset_for, records
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.prompt import examples_for
    from promptdistill.ttft.features import FEATURE_KEYS, prompt_features

    spec = load_spec(args.name, prompts_dir=args.prompts_dir)
    tokenizer = _tokenizer(args)
    examples = examples_for(spec, args.examples)
    sample = records(dataset_for(spec), args.split)[: max(0, args.sample)]
    rows = [{"id": r["id"], **prompt_features(spec, r["inputs"], tokenizer, examples=examples)} for r in sample]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    static = ["fewshot_count", "fewshot_tokens", "instruction_tokens", "semantic_density", "clause_count"]
    print(f"spec {spec.name} ({spec.spec_hash()[:12]}), tokenizer {getattr(tokenizer, 'model', '?')}")
    if rows:
        print(pd.DataFrame([{k: rows[0][k] for k in static}], index=[spec.name]).round(3).to_string())
        print()
        per_record = [k for k in FEATURE_KEYS if k not in static]
        table = pd.DataFrame(rows).set_index("id")[per_record].astype(float)
        table.loc["mean"] = table.mean()
        print(table.round(2).to_string())
    for w in layout_warnings(spec):
        print(f"warning: {w}", file=sys.stderr)
    return 0

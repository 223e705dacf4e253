"""``promptdistill spec validate|render``: check and show prompt specs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("spec", help="validate and render prompt specs")
    sub = p.add_subparsers(dest="spec_command", metavar="SUBCOMMAND", required=True)

    v = sub.add_parser("validate", help="validate spec files and their datasets (exit 2 on errors)")
    v.add_argument("files", nargs="*", help="spec files (default: every prompts/*.yaml)")
    v.add_argument("--prompts-dir", default="prompts")
    v.set_defaults(func=validate)

    r = sub.add_parser("render", help="print the chat messages of a spec for one dataset record")
    r.add_argument("name", help="spec name or file")
    r.add_argument("--id", dest="record_id", help="record id (default: the first dev record)")
    r.add_argument("--examples", type=int, default=None, help="few-shot count (default: the spec's)")
    r.add_argument("--json", action="store_true", help="print the messages as JSON")
    r.add_argument("--prompts-dir", default="prompts")
    r.set_defaults(func=render)


def validate(args: argparse.Namespace) -> int:
    from promptdistill.specs.checks import layout_warnings
    from promptdistill.specs.load import load_spec, validate_spec_file

    files = [Path(f) for f in args.files] or sorted(Path(args.prompts_dir).glob("*.yaml"))
    if not files:
        print(f"no spec files in {args.prompts_dir}/", file=sys.stderr)
        return 2
    errors: list[str] = []
    for f in files:
        problems = validate_spec_file(f)
        errors += problems
        if not problems:
            for w in layout_warnings(load_spec(f)):
                print(f"warning: {w}", file=sys.stderr)
            print(f"ok: {f}")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"{len(errors)} error(s) in {len(files)} file(s)", file=sys.stderr)
        return 2
    return 0


def render(args: argparse.Namespace) -> int:
    from promptdistill.core.errors import SpecError
    from promptdistill.specs.datasets import dataset_for, records
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.prompt import examples_for, spec_messages

    spec = load_spec(args.name, prompts_dir=args.prompts_dir)
    df = dataset_for(spec)
    if args.record_id is None:
        dev = records(df, "dev")
        if not dev:
            raise SpecError(f"{spec.dataset}: no dev records; pass --id")
        record = dev[0]
    else:
        match = df[df["id"] == args.record_id]
        if match.empty:
            raise SpecError(f"{spec.dataset}: no record with id {args.record_id!r}")
        row = match.iloc[0]
        record = {"id": row["id"], "inputs": row["inputs"], "expected": row["expected"]}
    messages = spec_messages(spec, record["inputs"], examples=examples_for(spec, args.examples))
    if args.json:
        # allow_nan=False: the output must be JSON (the dataset loader refuses NaN already).
        print(json.dumps({"record": record["id"], "messages": messages, "expected": record["expected"]}, indent=2,
                         ensure_ascii=False, allow_nan=False))
        return 0
    for m in messages:
        print(f"=== {m['role']} ===\n{m['content']}\n")
    print(f"=== expected ({record['id']}) ===\n{json.dumps(record['expected'], ensure_ascii=False)}")
    return 0

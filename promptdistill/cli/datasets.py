"""``promptdistill datasets import FILE --spec NAME``: production traffic into a spec's dataset.

    promptdistill datasets import requests.jsonl --spec support --map ticket=body --id-column request_id

Writes the spec's dataset file (``datasets/<spec.dataset>``, or ``--out``) atomically and
prints what was imported and left out. See :mod:`promptdistill.specs.importer`.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="import production requests (JSONL/CSV/Parquet) as a spec's dataset")
    cmds = p.add_subparsers(dest="datasets_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    imp = cmds.add_parser("import", help="map columns to the spec's inputs, split by hashed id, write the dataset")
    imp.add_argument("file", help="a .jsonl, .csv or .parquet file of requests")
    imp.add_argument("--spec", required=True, help="the spec the records are for (name or path)")
    imp.add_argument("--prompts-dir", default="prompts")
    imp.add_argument("--map", action="append", default=[], metavar="INPUT=COLUMN",
                     help="the column holding an input (default: the column of the same name)")
    imp.add_argument("--id-column", help="a stable request id column (default: a hash of the inputs)")
    imp.add_argument("--expected-column", help="a column with the expected output (default: label-free)")
    imp.add_argument("--out", help="the dataset file to write (default: the spec's own)")
    imp.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    from promptdistill.core.errors import ConfigError
    from promptdistill.specs.datasets import write_records
    from promptdistill.specs.importer import import_records, read_table
    from promptdistill.specs.load import load_spec

    mapping = {}
    for item in args.map:
        name, sep, column = item.partition("=")
        if not sep or not name or not column:
            raise ConfigError(f"--map: expected INPUT=COLUMN, got {item!r}")
        mapping[name] = column
    spec = load_spec(args.spec, prompts_dir=args.prompts_dir)
    unknown = sorted(set(mapping) - set(spec.inputs))
    if unknown:
        raise ConfigError(f"--map: {unknown} not input(s) of {spec.name} ({', '.join(spec.inputs)})")
    records, report = import_records(read_table(args.file), spec, mapping=mapping, id_column=args.id_column,
                                     expected_column=args.expected_column, where=args.file)
    path = write_records(args.out or spec.dataset, records)
    print(f"{path}: {report.sentence()}")
    if not records:
        print("nothing imported", file=sys.stderr)
        return 1
    return 0

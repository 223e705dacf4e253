"""``promptdistill datasets import FILE --spec NAME``: production traffic into a spec's dataset.

    promptdistill datasets import requests.jsonl --spec support --map ticket=body --id-column request_id
    promptdistill datasets import more.jsonl --spec support --id-column request_id --append

Creates or replaces the spec's dataset file (``datasets/<spec.dataset>``, or ``--out``), or
adds to it (``--append``), atomically and only when the result passes the dataset checks
of ``spec validate``; the replaced file is kept as ``<file>.bak``. Concurrent imports of
one dataset run one after the other (``--wait`` bounds the wait). Prints what was
imported and left out. See :mod:`promptdistill.specs.importer`.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="import production requests (JSONL/CSV/Parquet) as a spec's dataset")
    cmds = p.add_subparsers(dest="datasets_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    imp = cmds.add_parser(
        "import", help="map columns to the spec's inputs, split by hashed id, write the dataset",
        description="Create, replace (keeping FILE.bak) or --append to a spec's dataset. Nothing is written "
                    "unless every row reads and the result passes the dataset checks of `spec validate`.")
    imp.add_argument("file", help="a .jsonl, .csv or .parquet file of requests")
    imp.add_argument("--spec", required=True, help="the spec the records are for (name or path); its dataset "
                                                   "file need not exist yet")
    imp.add_argument("--prompts-dir", default="prompts")
    imp.add_argument("--map", action="append", default=[], metavar="INPUT=COLUMN",
                     help="the column holding an input (default: the column of the same name)")
    imp.add_argument("--id-column", help="a stable request id column: every row needs a unique one "
                                         "(default: a hash of the inputs)")
    imp.add_argument("--expected-column", help="a column with the expected output (default: label-free)")
    imp.add_argument("--reference-column", action="append", default=[], metavar="COLUMN",
                     help="repeatable: a column kept in the record's `reference` object ({COLUMN: value}, JSON "
                          "text parsed): scoring data for the metric and the rubric judge, never shown to the model")
    imp.add_argument("--append", action="store_true",
                     help="add the new rows to the existing dataset (its records and splits are kept; rows already "
                          "there are left out; an id already there with other inputs is an error)")
    imp.add_argument("--out", help="the dataset file to write (default: the spec's own)")
    imp.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                     help="how long to wait for another import of the same dataset to finish (default: %(default)g)")
    imp.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    from promptdistill.core.errors import ConfigError
    from promptdistill.specs.importer import import_file, spec_for_import

    mapping = {}
    for item in args.map:
        name, sep, column = item.partition("=")
        if not sep or not name or not column:
            raise ConfigError(f"--map: expected INPUT=COLUMN, got {item!r}")
        mapping[name] = column
    spec = spec_for_import(args.spec, prompts_dir=args.prompts_dir)
    unknown = sorted(set(mapping) - set(spec.inputs))
    if unknown:
        raise ConfigError(f"--map: {unknown} not input(s) of {spec.name} ({', '.join(spec.inputs)})")
    if not args.wait >= 0:
        raise ConfigError(f"--wait: must be a number of seconds, at least 0, got {args.wait}")
    path, report = import_file(args.file, spec, out=args.out, append=args.append, mapping=mapping,
                               id_column=args.id_column, expected_column=args.expected_column,
                               reference_columns=args.reference_column, wait_s=args.wait,
                               on_wait=lambda message: print(message, file=sys.stderr, flush=True))
    print(f"{path}: {report.sentence()}" + ("" if report.kept else "; nothing new, the file is unchanged"))
    return 0

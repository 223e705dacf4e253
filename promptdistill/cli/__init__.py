"""The ``promptdistill`` command line: a thin layer over the library.

Each concept registers its own subcommands from a module in this package
(``register(subparsers)``), so commands can be added without touching this file's
logic. Errors from the library are printed as ``TypeName: message``: exit code 2 for
bad input (``ConfigError``, ``SpecError``: a config file, a spec, a dataset, a judge
definition or an argument, named as ``file: field: reason``, like argparse's own usage
errors), 1 for everything else.

The command modules import the library inside their functions: ``promptdistill --help``
and a mistyped flag answer at once instead of after loading vLLM, Prefect and pandas.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from promptdistill.core.env import apply_defaults
from promptdistill.core.errors import ConfigError, PromptDistillError, SpecError

__all__ = ["main"]

# Modules under promptdistill/cli/ that add subcommands, in help order.
COMMAND_MODULES = ("init", "generate", "spec", "datasets", "features", "ttft", "plan", "distill", "optimize",
                   "load", "templates", "nightly", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="promptdistill",
        description="Batch prompt optimization on a local vLLM engine.",
    )
    parser.add_argument("--config", help="config file (default: $PROMPTDISTILL_CONFIG or ./promptdistill.toml)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show third-party output (engine logs, library warnings) on the terminal instead of "
                             "in a log file; commands also take it after their name")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"promptdistill.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    apply_defaults()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, SpecError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except PromptDistillError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

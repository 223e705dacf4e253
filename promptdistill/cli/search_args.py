"""Arguments shared by the commands that search over a spec's prompt (distill, optimize).

Both take a spec, a seed and the same budget flags, and both map those flags onto the
config fields their searches share, so the flag names and the mapping live here once.
"""

from __future__ import annotations

import argparse
from typing import Any

from promptdistill.core.settings import DeclaredHelp

__all__ = ["add_search_arguments", "budget_values"]


def add_search_arguments(p: argparse.ArgumentParser, *, budget: str, race: str) -> None:
    """Add the spec name, ``--prompts-dir``, ``--seed`` and the budget flags to ``p``.

    ``budget`` and ``race`` are the settings classes (``"package.module:Class"``) that declare
    the budget flags' and the race flags' (``--alpha``, ``--finalists``) fields: each search
    has its own defaults and meaning of a budget, and each flag's help is its declaration's.
    The flags stay None when left out, so the declared default applies.
    """
    p.add_argument("name", help="spec name (prompts/NAME.yaml) or path")
    p.add_argument("--prompts-dir", default="prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-calls", type=int, help=DeclaredHelp(budget, "max_lm_calls"))
    p.add_argument("--budget-minutes", type=float, help=DeclaredHelp(budget, "max_minutes"))
    p.add_argument("--dev", type=int, help=DeclaredHelp(budget, "dev_size"))
    p.add_argument("--test", type=int, help=DeclaredHelp(budget, "test_size"))
    p.add_argument("--screen", type=int, help=DeclaredHelp(budget, "screen_size"))
    p.add_argument("--alpha", type=float, help=DeclaredHelp(race, "alpha"))
    p.add_argument("--finalists", type=int, help=DeclaredHelp(race, "finalists"))


def budget_values(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The budget flags (and ``extra`` config fields) that were given, by config field name.

    Flags left unset are left out, so the config's own defaults apply.
    """
    given = {"max_lm_calls": args.budget_calls, "max_minutes": args.budget_minutes, "dev_size": args.dev,
             "test_size": args.test, "screen_size": args.screen, **extra}
    return {k: v for k, v in given.items() if v is not None}

"""Arguments shared by the commands that search over a spec's prompt (distill, optimize).

Both take a spec, a seed and the same budget flags, and both map those flags onto the
config fields their searches share, so the flag names and the mapping live here once; so
do what both then open (settings, spec, output folder, LM cache) and how both refuse a
flag's value.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from promptdistill.core.errors import ConfigError
from promptdistill.core.settings import DeclaredHelp, SettingError

__all__ = ["add_search_arguments", "budget_values", "flag_errors", "open_search", "stage_folder"]


def add_search_arguments(p: argparse.ArgumentParser, *, budget: str, race: str) -> None:
    """Add the spec name, ``--prompts-dir``, ``--seed`` and the budget flags to ``p``.

    ``budget`` and ``race`` are the settings classes (``"package.module:Class"``) that hold
    the budget flags' and the race flags' (``--alpha``, ``--finalists``) fields: both inherit
    them from ``SearchBudget`` and ``RaceKnobs`` (one declaration, one help), each with its
    own defaults, which each flag's help shows.
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


@contextmanager
def flag_errors(command: str) -> Iterator[None]:
    """A flag's refused value as the ConfigError the CLI exits 2 on: ``COMMAND: field reason``."""
    try:
        yield
    except SettingError as e:
        raise ConfigError(f"{command}: {e.field_message}") from None


def stage_folder(state_dir: str | Path, stage: str, spec: str, seed: int) -> Path:
    """A command's stage output by default: ``STATE_DIR/STAGE/NAME-seedS`` (``optimize`` reads ``distill``'s)."""
    from promptdistill.pipeline.stages import stage_dir

    return stage_dir(state_dir, stage, f"{spec}-seed{seed}")


def open_search(args: argparse.Namespace, stage: str) -> tuple[Any, Any, Path, Path | None]:
    """What a search command works on: the settings, the spec, the output folder (``--out``,
    else :func:`stage_folder`) and the LM result cache (None with ``--no-cache``)."""
    from promptdistill.core.config import load_settings
    from promptdistill.pipeline.stages import lm_cache_path
    from promptdistill.specs.load import load_spec

    settings = load_settings(args.config)
    spec = load_spec(args.name, prompts_dir=args.prompts_dir)
    out = Path(args.out) if args.out else stage_folder(settings.state_dir, stage, spec.name, args.seed)
    return settings, spec, out, None if args.no_cache else lm_cache_path(settings.state_dir)

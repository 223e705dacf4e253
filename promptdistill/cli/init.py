"""``promptdistill init [FOLDER]``: a minimal project of your own, next to your service's code.

Writes ``prompts/`` and ``datasets/`` (with a short README each), ``promptdistill.toml``
(the engine, an optional separate judge, the registry) and ``prefect.yaml`` whose
deployments run the flows that ship with the installed package, so ``prefect deploy --all``
works from the project folder. Judge definitions are built in; a ``judges/`` folder is
only needed to override one. Existing files are kept (``--force`` replaces them).

Every path is checked before anything is written (a file where a folder goes is an
error naming it, exit code 2), and a write that fails part-way is undone: ``init`` leaves
a whole project or the folder as it was.
"""

from __future__ import annotations

import argparse
import stat
import sys
from importlib import resources
from pathlib import Path

from promptdistill.core.errors import ConfigError

__all__ = ["project_files", "register"]

# The project's files, as init writes them (``{name}`` in prefect.yaml: the folder's name),
# in the order it writes and reports them.
PROJECT = resources.files("promptdistill.cli").joinpath("project")
FILES = ("promptdistill.toml", "prefect.yaml", "prompts/README.md", "datasets/README.md")


def project_files(root: Path) -> dict[Path, str]:
    """Each file init writes under ``root``, with its text."""
    name = _yaml_string(root.resolve().name or "promptdistill")
    return {root / rel: PROJECT.joinpath(rel).read_text(encoding="utf-8").replace("{name}", name) for rel in FILES}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="write a minimal project (prompts/, datasets/, promptdistill.toml, prefect.yaml)")
    p.add_argument("folder", nargs="?", default=".", help="the project folder (default: here)")
    p.add_argument("--force", action="store_true", help="replace files that exist")
    p.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    root = Path(args.folder)
    try:
        files = project_files(root)
        _check_paths(root, files)
    except OSError as e:  # a folder that cannot be looked into, or a symbolic link loop (Python 3.13+)
        raise ConfigError(f"init: cannot check {e.filename or root}: {e.strerror or e}; nothing was written") from None
    except RuntimeError as e:  # pathlib's "Symlink loop from ..." before Python 3.13
        raise ConfigError(f"init: cannot check {root}: {e} (a symbolic link that points at itself); "
                          "remove it or choose another folder; nothing was written") from None
    kept = [path for path in files if path.exists() and not args.force]
    for path in kept:
        print(f"kept {path} (exists; --force replaces it)", file=sys.stderr)
    _write_all({path: text for path, text in files.items() if path not in kept})
    print(f"\nnext: write a spec in {root / 'prompts'}/ (every key: docs/specs.md in promptdistill's repository) and "
          f"its data in {root / 'datasets'}/, then `promptdistill spec validate` and `promptdistill nightly`")
    return 0


def _yaml_string(text: str) -> str:
    """``text`` as a double-quoted YAML scalar: a folder name with ``: ``, quotes or ``#`` stays one string."""
    import yaml

    return yaml.safe_dump(text, allow_unicode=True, width=float("inf"), default_style='"').rstrip("\n")


def _check_paths(root: Path, files: dict[Path, str]) -> None:
    """Refuse, before writing anything, a project whose folders or files cannot be created."""
    folders = [root, *sorted({path.parent for path in files} - {root})]
    for folder in folders:
        blocker = _file_in_the_way(folder)
        if blocker is not None:
            whose = "the project folder" if folder == root else f"folder {folder}"
            what = blocker if blocker == folder else f"{blocker}, a parent of {whose},"
            raise ConfigError(f"init: {what} is a file, so {whose} cannot be created; "
                              "move or rename that file, or choose another folder")
    for path in files:
        if path.is_dir():
            raise ConfigError(f"init: {path} is a folder, where init writes a file; move or rename it")
        if path.is_symlink() or path.exists():
            kind = _special_kind(path)
            if kind:  # reading it to undo a failed write would block (a FIFO) or never end (a device)
                raise ConfigError(f"init: {path} is {kind}, not a regular file, where init writes a file; "
                                  "move or remove it")


def _special_kind(path: Path) -> str | None:
    """What ``path`` is when it is neither a regular file nor a folder (None otherwise)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:  # a link to nothing: the write replaces the link
        return None
    except OSError as e:  # a link in a loop
        return f"a path that cannot be looked at ({e.strerror or e})"
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return None


def _file_in_the_way(folder: Path) -> Path | None:
    """The nearest existing path at or above ``folder`` if it is not a folder, else None."""
    for path in (folder, *folder.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def _write_all(files: dict[Path, str]) -> None:
    """Write every file, or, when one fails, undo what was written and raise ConfigError."""
    from promptdistill.core.jsonio import atomic_write

    created: list[Path] = []  # folders made here, outermost first
    replaced: dict[Path, bytes | None] = {}  # each file's bytes before (None: it did not exist)
    try:
        for path, text in files.items():
            for folder in reversed([path.parent, *path.parent.parents]):
                if not folder.exists():
                    folder.mkdir()
                    created.append(folder)
            replaced[path] = path.read_bytes() if path.exists() else None
            atomic_write(path, text)
    except OSError as e:
        _undo(replaced, created)
        where = e.filename or path
        raise ConfigError(f"init: cannot write {where}: {e.strerror or e}; nothing was written") from None
    for path in files:
        print(f"wrote {path}")


def _undo(replaced: dict[Path, bytes | None], created: list[Path]) -> None:
    for path, before in replaced.items():
        try:
            if before is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(before)
        except OSError:
            pass
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            pass

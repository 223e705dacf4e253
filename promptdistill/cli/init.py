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
import sys
from pathlib import Path

from promptdistill.core.errors import ConfigError

__all__ = ["register"]

CONFIG = """\
# promptdistill's settings for this project (every key has a default; see promptdistill's README).
[engine]
backend = "local"            # "local": in-process vLLM; "server": OpenAI-compatible server(s)
model = "embedded"           # "embedded" (SmolLM2-135M-Instruct) or an HF folder / hub name
# server_urls = ["http://127.0.0.1:8000/v1"]
# served_model_name = "my-model"

# A judge at least as capable as the model it judges (LLM-as-a-Judge). Without this
# section the task engine judges itself.
# [judge]
# backend = "server"
# server_urls = ["http://127.0.0.1:8001/v1"]
# served_model_name = "my-judge"

[paths]
state_dir = ".promptdistill"
registry = "artifacts/registry"   # or s3://bucket/prompts
judges = "judges"                 # only to override the built-in judges
"""

PREFECT = """\
# Prefect deployments of promptdistill's flows, run from this project folder.
#
#   prefect work-pool create promptdistill-local --type process   # once
#   prefect deploy --all
#   prefect worker start --pool promptdistill-local
#   prefect deployment run 'nightly/nightly'
#
# The flows ship with the installed package (module entrypoints); the worker runs them in
# this folder (the pull step), where prompts/, datasets/ and promptdistill.toml are.
name: {name}
prefect-version: 3.7.7

build: null
push: null

pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{{{{ $PWD }}}}"

definitions:
  work_pools:
    local: &local_pool
      name: promptdistill-local
      work_queue_name: default
      job_variables: {{}}

deployments:
  - name: nightly
    entrypoint: promptdistill.flows.nightly.nightly
    tags: [promptdistill, nightly]
    schedules:
      - cron: "0 2 * * *"
        timezone: UTC
        active: true
    concurrency_limit: 1
    parameters:
      preset: full
      allow_promotion: true
    work_pool: *local_pool

  - name: optimize-prompt
    entrypoint: promptdistill.flows.optimize_prompt.optimize_prompt
    tags: [promptdistill, ad-hoc]
    parameters:
      allow_promotion: false
    work_pool: *local_pool

  - name: profile-ttft
    entrypoint: promptdistill.flows.profile_ttft.profile_ttft
    tags: [promptdistill, ad-hoc]
    work_pool: *local_pool
"""

PROMPTS_README = """\
# Prompts

One YAML spec per production prompt template: `NAME.yaml` (the file's stem is the name).
Every key, with its type, default and an example, the metric kinds and the dataset record
format: `docs/specs.md` in promptdistill's repository. The smallest spec:

```yaml
name: NAME
description: What the prompt is for.
dataset: NAME.jsonl                 # in ../datasets/
inputs: {text: What a request supplies.}
template:
  system: {instruction: The instruction the prompt gives (static: served from the prefix cache).}
  user: "Text: {text}"
output: {schema: {type: object, properties: {answer: {type: string}}, required: [answer]}, max_tokens: 64}
metric: {kind: exact, field: answer}     # or {kind: python, function: "metrics.mine:score"}
slo: {max_quality_drop: 0.05}
```

`promptdistill spec validate` checks every spec with its dataset; `promptdistill plan NAME`
says how many records a certified decision needs.
"""

DATASETS_README = """\
# Datasets

One JSON record a line: `{"id": ..., "split": "train"|"dev"|"test", "inputs": {...}, "expected": ...}`.
`expected` is optional: a record without it is scored against the current prompt's own
reply (label-free). `meta` (free-form) and `reference` (scoring data for python metrics and
judges, never put into the prompt) are optional too; the whole format is in `docs/specs.md`
in promptdistill's repository. Import production traffic with
`promptdistill datasets import requests.jsonl --spec NAME --map text=request_text`.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="write a minimal project (prompts/, datasets/, promptdistill.toml, prefect.yaml)")
    p.add_argument("folder", nargs="?", default=".", help="the project folder (default: here)")
    p.add_argument("--force", action="store_true", help="replace files that exist")
    p.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    root = Path(args.folder)
    name = root.resolve().name or "promptdistill"
    files = {
        root / "promptdistill.toml": CONFIG,
        root / "prefect.yaml": PREFECT.format(name=_yaml_string(name)),
        root / "prompts" / "README.md": PROMPTS_README,
        root / "datasets" / "README.md": DATASETS_README,
    }
    try:
        _check_paths(root, files)
    except OSError as e:  # a folder that cannot be looked into
        raise ConfigError(f"init: cannot check {e.filename or root}: {e.strerror or e}; nothing was written") from None
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

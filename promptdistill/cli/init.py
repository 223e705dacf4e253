"""``promptdistill init [FOLDER]``: a minimal project of your own, next to your service's code.

Writes ``prompts/`` and ``datasets/`` (with a short README each), ``promptdistill.toml``
(the engine, an optional separate judge, the registry) and ``prefect.yaml`` whose
deployments run the flows that ship with the installed package, so ``prefect deploy --all``
works from the project folder. Judge definitions are built in; a ``judges/`` folder is
only needed to override one. Existing files are kept (``--force`` replaces them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register"]

CONFIG = """\
# promptdistill's settings for this project (every key has a default; see the README).
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
The smallest spec:

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
reply (label-free). Import production traffic with
`promptdistill datasets import requests.jsonl --spec NAME --map text=request_text`.
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="write a minimal project (prompts/, datasets/, promptdistill.toml, prefect.yaml)")
    p.add_argument("folder", nargs="?", default=".", help="the project folder (default: here)")
    p.add_argument("--force", action="store_true", help="replace files that exist")
    p.set_defaults(func=_init)


def _init(args: argparse.Namespace) -> int:
    from promptdistill.core.jsonio import atomic_write

    root = Path(args.folder)
    name = root.resolve().name or "promptdistill"
    files = {
        root / "promptdistill.toml": CONFIG,
        root / "prefect.yaml": PREFECT.format(name=name),
        root / "prompts" / "README.md": PROMPTS_README,
        root / "datasets" / "README.md": DATASETS_README,
    }
    for path, text in files.items():
        if path.exists() and not args.force:
            print(f"kept {path} (exists; --force replaces it)", file=sys.stderr)
            continue
        atomic_write(path, text)
        print(f"wrote {path}")
    print(f"\nnext: write a spec in {root / 'prompts'}/ and its data in {root / 'datasets'}/, then "
          "`promptdistill spec validate` and `promptdistill nightly`")
    return 0

"""``promptdistill generate``, ``model`` and ``serve``: the engine from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from promptdistill.core.config import load_settings

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate with the configured engine; print text, tokens and TTFT")
    p.add_argument("prompts", nargs="*", help="user messages (default: a few built-in examples)")
    p.add_argument("--system", default="You are a concise, helpful assistant.")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--schema", help="a JSON Schema (inline JSON or @file) the reply must match")
    p.add_argument("--backend", choices=["local", "server"], help="override engine.backend")
    p.set_defaults(func=_generate)

    m = sub.add_parser("model", help="prepare the embedded default model (convert once) and print its folder")
    m.set_defaults(func=_model)

    s = sub.add_parser("serve", help="run an OpenAI-compatible vLLM server for the configured model")
    s.add_argument("--port", type=int, default=8000)
    s.set_defaults(func=_serve)


_DEFAULT_PROMPTS = [
    "In one sentence, what is time-to-first-token?",
    "Name three primary colors.",
    "What is 12 plus 30?",
]


def _generate(args: argparse.Namespace) -> int:
    from promptdistill.engine import GenerationRequest, load_engine

    settings = load_settings(args.config)
    config = settings.engine if not args.backend else replace(settings.engine, backend=args.backend)
    schema = None
    if args.schema:
        text = open(args.schema[1:], encoding="utf-8").read() if args.schema.startswith("@") else args.schema
        schema = json.loads(text)
    prompts = args.prompts or _DEFAULT_PROMPTS
    requests = [
        GenerationRequest(
            messages=[{"role": "system", "content": args.system}, {"role": "user", "content": p}],
            max_tokens=args.max_tokens,
            json_schema=schema,
        )
        for p in prompts
    ]
    with load_engine(config) as engine:
        print(f"engine: {engine.identity.model} ({engine.identity.backend}, {engine.identity.dtype}) "
              f"on {engine.identity.hardware}", file=sys.stderr)
        results = engine.generate(requests, progress=True)
    for prompt, r in zip(prompts, results):
        print(f"\n> {prompt}\n{r.text.strip()}")
        status = "" if r.valid is None else (" valid" if r.valid else f" INVALID: {r.error}")
        print(f"  [prompt {r.prompt_tokens} tok ({r.cached_tokens} cached), completion {r.completion_tokens} tok, "
              f"TTFT {r.ttft_ms:.0f} ms, total {r.e2e_ms:.0f} ms, finish {r.finish_reason}{status}]")
    return 0


def _model(args: argparse.Namespace) -> int:
    from promptdistill.engine import resolve_model

    print(resolve_model(load_settings(args.config).engine.model))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from promptdistill.engine import resolve_model
    from promptdistill.engine.launcher import VLLMServer

    config = load_settings(args.config).engine
    server = VLLMServer(resolve_model(config.model), config, port=args.port)
    print(" ".join(server.command()), file=sys.stderr)
    with server:
        print(f"serving {config.served_model_name} at {server.url} (Ctrl-C stops)", file=sys.stderr)
        try:
            server._proc.wait()  # type: ignore[union-attr]
        except KeyboardInterrupt:
            pass
    return 0

"""``promptdistill ttft profile | fit | report``: measure TTFT, fit the models, explain them.

``fit`` publishes the chosen model to the registry (``ttft-model/<engine key>``), the one
place TTFT models live: ``promptdistill optimize`` and the nightly flow load it from there.
``profile --backend server --launch-server`` profiles through a vLLM server it starts on
127.0.0.1 (TTFT at the client, HTTP included). ``report`` runs the TTFT study
(``bench/ttft_study``, from a source checkout): over profiles of several engines (the
in-process and server backends) it writes one overview and a report per engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from promptdistill.core.settings import SettingsHelpFormatter, add_setting_options, setting_values

__all__ = ["register"]

PROFILES_DIR = "artifacts/ttft/profiles"
REPORT_DIR = "artifacts/ttft"
PROFILE = "promptdistill.ttft.profile:ProfileConfig"
PROFILE_FLAGS = {"--points": "points", "--repeats": "repeats", "--max-minutes": "max_minutes", "--max-tokens": "max_tokens",
                 "--spec-records": "spec_records", "--density-probe-tokens": "density_probe_tokens",
                 "--ladder-tokens": "ladder_tokens", "--max-retries": "max_retries", "--quiet-wait-s": "quiet_wait_s",
                 "--seed": "seed"}


def register(sub: argparse._SubParsersAction) -> None:
    ttft = sub.add_parser("ttft", help="profile TTFT on the engine, fit the models that predict it, report")
    cmds = ttft.add_subparsers(dest="ttft_command", metavar="SUBCOMMAND")
    ttft.set_defaults(func=lambda args: (ttft.print_help(), 2)[1])

    p = cmds.add_parser("profile", help="measure TTFT over a designed sweep and the bundled specs (to Parquet)",
                        formatter_class=SettingsHelpFormatter)
    add_setting_options(p, PROFILE, PROFILE_FLAGS)
    p.add_argument("--no-fewshot-probe", action="store_true", help="skip the 0/1/4/8-example probe")
    p.add_argument("--no-queue-probe", action="store_true", help="skip the groups of requests sent together")
    p.add_argument("--no-matmul-probe", action="store_true", help="skip the machine's matmul peak (about 20 s)")
    p.add_argument("--out", default=PROFILES_DIR, help=f"folder or .parquet file (default {PROFILES_DIR})")
    p.add_argument("--backend", choices=["local", "server"], help="override engine.backend")
    p.add_argument("--launch-server", action="store_true",
                   help="with --backend server: start a vLLM server on 127.0.0.1 for the profile (else use engine.server_urls)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_profile)

    f = cmds.add_parser("fit", help="fit and compare the TTFT models; publish the chosen one to the registry")
    _profile_args(f)
    f.add_argument("--report-dir", default=REPORT_DIR, help=f"where the model's report goes (default {REPORT_DIR})")
    f.set_defaults(func=_fit)

    r = cmds.add_parser("report", help="the TTFT study (bench/ttft_study): noise, mechanics, hardware, density, "
                        "few-shot, figures")
    _profile_args(r)
    r.add_argument("--out", default=REPORT_DIR, help=f"folder for report.md, report.json and PNGs (default {REPORT_DIR})")
    r.add_argument("--n-boot", type=int, default=500, help="bootstrap resamples (default %(default)s)")
    r.add_argument("--note", default="", help="a line under the overview's title (how the profiles were made)")
    r.set_defaults(func=_report)


def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profiles", nargs="+", default=[PROFILES_DIR], help=f"Parquet files or folders (default {PROFILES_DIR})")
    p.add_argument("--engine-key", help="use the rows of this engine identity (needed when profiles mix engines)")
    p.add_argument("--keep-contended", action="store_true", help="also fit on rows measured under CPU contention")
    p.add_argument("--seed", type=int, default=0)


def _fail(e: Exception) -> int:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    return 1


def read_profiles(paths: list[str]) -> tuple[Any, list[str]]:
    """Every profile row in the given Parquet files and folders, as one frame, and the files."""
    import pandas as pd

    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files += sorted(path.glob("*.parquet"))
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{path}: no such profile file or folder (run `promptdistill ttft profile` first)")
    if not files:
        raise ValueError(f"{', '.join(paths)}: no .parquet profiles found (run `promptdistill ttft profile` first)")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True), [str(f) for f in files]


def _profile(args: argparse.Namespace) -> int:
    from promptdistill.core.config import load_settings
    from promptdistill.ttft.profile import ProfileConfig

    settings = load_settings(args.config)
    engine_config = settings.engine if not args.backend else replace(settings.engine, backend=args.backend)
    if args.launch_server and engine_config.backend != "server":
        return _fail(ValueError("--launch-server needs --backend server (or engine.backend: server)"))
    try:
        config = ProfileConfig(
            **setting_values(args, PROFILE_FLAGS),
            fewshot_probe=not args.no_fewshot_probe,
            matmul_probe=not args.no_matmul_probe,
            **({"queue_batches": ()} if args.no_queue_probe else {}),
        ).validate()
    except ValueError as e:
        return _fail(e)
    result = profile_engine(engine_config, config, out=args.out, progress=not args.quiet, launch_server=args.launch_server)
    frame = result.frame
    summary = {
        "path": str(result.path) if result.path else None,
        "stopped": result.stopped,
        "minimum_met": result.minimum_met,
        "note": result.note,
        "measurements": int(len(frame)),
        "planned": result.planned_units,
        "contended": int(frame["contended"].sum()) if len(frame) else 0,
        "elapsed_s": round(result.elapsed_s, 1),
        **result.info,
    }
    print(json.dumps(summary, indent=2))
    return 0 if len(frame) else 1


def profile_engine(engine_config: Any, config: Any, *, out: str | None, progress: bool = True,
                   launch_server: bool = False) -> Any:
    """Run a profile on the configured engine; with ``launch_server``, through a vLLM server
    started for it on 127.0.0.1 (whose processes then count as the measurement's, not as
    contention). Returns the ``ProfileResult``."""
    from promptdistill.engine import load_engine, resolve_model
    from promptdistill.ttft.profile import run_profile

    if not launch_server:
        with load_engine(engine_config) as engine:
            return run_profile(engine, config, out=out, progress=progress)
    from promptdistill.engine.launcher import VLLMServer
    from promptdistill.engine.server import ServerEngine

    with VLLMServer(resolve_model(engine_config.model), engine_config, startup_timeout_s=600) as server:
        engine = ServerEngine(replace(engine_config, backend="server", server_urls=(server.url,)))
        proc = getattr(server, "_proc", None)  # the server's process group: its CPU is the engine's work
        return run_profile(engine, config, out=out, progress=progress, own_pids=(proc.pid,) if proc else ())


def _fit(args: argparse.Namespace) -> int:
    from promptdistill.core.config import load_settings
    from promptdistill.pipeline.ttft_models import fit_and_publish
    from promptdistill.registry.store import Registry
    from promptdistill.ttft.fit import engine_rows

    settings = load_settings(args.config)
    try:
        df, files = read_profiles(args.profiles)
        info, model, fit, record = fit_and_publish(
            Registry(settings.registry), engine_rows(df, args.engine_key), seed=args.seed, source=",".join(files),
            report_dir=args.report_dir, keep_contended=args.keep_contended)
    except ValueError as e:
        return _fail(e)
    print(_fit_table(fit), file=sys.stderr)
    h = fit.heldout[fit.chosen]
    print(json.dumps({"registry": settings.registry, "artifact": f"ttft-model/{info['engine_key']}:{record.version}",
                      "version": model.version, "chosen": fit.chosen, "heldout_mape": round(h["mape"], 4),
                      "heldout_r2": round(h["r2"], 4), "engine_key": info["engine_key"], "report": info["report"],
                      "rows": fit.rows}, indent=2))
    return 0


def _fit_table(fit: object) -> str:
    lines = [f"{'model':<12} {'cv MAPE':>8} {'MAPE':>7} {'R2':>7} {'p50 ms':>8} {'p95 ms':>8}  monotonic  cached-never-slower"]
    for name, s in fit.heldout.items():  # type: ignore[attr-defined]
        mark = " <- chosen" if name == fit.chosen else ""  # type: ignore[attr-defined]
        lines.append(f"{name:<12} {fit.cv[name]['mape']:>8.1%} {s['mape']:>7.1%} {s['r2']:>7.3f} "  # type: ignore[attr-defined]
                     f"{s['p50_abs_err_ms']:>8.0f} {s['p95_abs_err_ms']:>8.0f}  {fit.monotonic[name]!s:<9}  "  # type: ignore[attr-defined]
                     f"{fit.cache_consistent.get(name)}{mark}")  # type: ignore[attr-defined]
    return "\n".join(lines)


def _report(args: argparse.Namespace) -> int:
    from promptdistill.core.config import load_settings
    from promptdistill.registry.store import Registry

    try:
        study = _study()
        df, _ = read_profiles(args.profiles)
        path = study.write_study(df, args.out, registry=Registry(load_settings(args.config).registry),
                                 engine_key=args.engine_key, n_boot=args.n_boot, seed=args.seed,
                                 keep_contended=args.keep_contended, note=args.note)
    except (ImportError, ValueError) as e:
        return _fail(e)
    print(path)
    return 0


def _study() -> Any:
    """The TTFT study (``bench/ttft_study``), which lives beside the package in a source
    checkout: the product never imports it, this command only when run, and only where
    Python already finds it (``python -m promptdistill`` from the repository root)."""
    import importlib

    try:
        return importlib.import_module("bench.ttft_study")
    except ModuleNotFoundError as e:
        if e.name not in ("bench", "bench.ttft_study"):
            raise  # the study is there but a library it needs is not: say which
        raise ImportError("the TTFT study is not part of the installed package: it lives in a source checkout's "
                          "bench/ttft_study/; run `python -m promptdistill ttft report ...` or "
                          "`python -m bench.ttft_study` from the repository root") from None

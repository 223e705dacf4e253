"""``make bench`` and ``make bench-full``: which benchmarks each runs, with flags their scripts take.

Pure: no benchmark runs. A script's flags are checked against the parser its ``main`` builds,
rebuilt from its source (importing a benchmark sets up the engine's process defaults and
takes seconds; ``--help`` in a subprocess would too).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path

import pytest

from bench import run_all
from bench.run_all import DEFAULT, FULL, Benchmark

ROOT = Path(__file__).resolve().parent.parent
TYPES = {"int": int, "float": float, "str": str, "Path": str}
LITERAL_KWARGS = ("action", "nargs", "choices", "dest", "required", "const")


def source_parser(module: str) -> argparse.ArgumentParser:
    """The parser ``module.main`` builds: its ``add_argument`` calls with their literal arguments
    (names, action, nargs, type, literal choices); defaults and help left out."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module}: no such module"
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    mains = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
    assert len(mains) == 1, f"{module}: no main()"
    parser = argparse.ArgumentParser(prog=module, exit_on_error=False, add_help=False)
    calls = [n for n in ast.walk(mains[0]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "add_argument"]
    assert calls, f"{module}: main() adds no argument"
    for call in calls:
        names = [ast.literal_eval(a) for a in call.args]
        kwargs = {}
        for kw in call.keywords:
            if kw.arg == "type" and isinstance(kw.value, ast.Name):
                kwargs["type"] = TYPES[kw.value.id]
            elif kw.arg in LITERAL_KWARGS:
                try:
                    kwargs[kw.arg] = ast.literal_eval(kw.value)
                except ValueError:  # choices=SOME_CONSTANT: not checked here
                    continue
        parser.add_argument(*names, **kwargs)
    return parser


def parse(bench: Benchmark) -> argparse.Namespace:
    """``bench.args`` parsed as its script's ``main`` would parse them (an error fails the test)."""
    parser = source_parser(bench.module)
    try:
        args, extra = parser.parse_known_args(list(bench.args))
    except (argparse.ArgumentError, SystemExit) as e:
        pytest.fail(f"{bench.module} {' '.join(bench.args)}: {e}")
    assert not extra, f"{bench.module}: unknown arguments {extra}"
    return args


@pytest.mark.parametrize("bench", DEFAULT + FULL, ids=lambda b: f"{b.name}:{' '.join(b.args)}")
def test_each_benchmark_takes_its_flags(bench):
    args = parse(bench)
    for spec in getattr(args, "specs", None) or ():
        assert (ROOT / "prompts" / f"{spec}.yaml").is_file(), f"{bench.module}: no bundled spec {spec!r}"
    assert bench.minutes > 0


def test_a_flag_a_script_does_not_take_is_caught():
    with pytest.raises(BaseException, match="unknown arguments|unrecognized|invalid"):
        parse(Benchmark("bench.bench_dtype", ("--records", "24", "--budget", "quick"), 1.0))
    with pytest.raises(BaseException, match="invalid int"):
        parse(Benchmark("bench.bench_dtype", ("--records", "many"), 1.0))


def test_the_default_set_is_part_of_the_full_one_and_fits_an_hour():
    full = {b.module for b in FULL}
    assert {b.module for b in DEFAULT} <= full
    assert len({b.module for b in DEFAULT}) == len(DEFAULT) and len(full) == len(FULL)
    assert "bench.bench_endpoints" in full - {b.module for b in DEFAULT}
    assert sum(b.minutes for b in DEFAULT) <= 60
    # What the default set runs smaller: two specs for the optimizer (published, then compared at
    # load by bench_load, which runs after it), ticket_triage only for the peers.
    by_module = {b.module: b for b in DEFAULT}
    assert parse(by_module["bench.bench_optimize"]).specs == ["ticket_triage", "invoice_extraction"]
    assert parse(by_module["bench.bench_optimize"]).publish
    order = [b.module for b in DEFAULT]
    assert order.index("bench.bench_optimize") < order.index("bench.bench_load")
    assert parse(by_module["bench.bench_peers"]).specs == ["ticket_triage"]
    # bench_ttft_model publishes the TTFT model the optimizer benchmarks load: it runs first.
    for benchmarks in (DEFAULT, FULL):
        order = [b.module for b in benchmarks]
        assert order.index("bench.bench_ttft_model") < order.index("bench.bench_optimize")
        assert order.index("bench.bench_ttft_model") < order.index("bench.bench_peers")


@pytest.fixture
def ran(monkeypatch, tmp_path):
    """The commands ``run_all.main`` runs (none really runs; each exits 0)."""
    commands: list[list[str]] = []

    def fake_run(command, log_path, *, verbose):
        commands.append(command[2:])  # after "python -m"
        return 0

    monkeypatch.setattr(run_all, "run", fake_run)
    monkeypatch.setattr(run_all, "REPORT_DIR", tmp_path)
    return commands


def test_make_bench_runs_the_default_set_and_full_the_whole_list(ran, capsys):
    assert run_all.main([]) == 0
    assert ran == [[b.module, *b.args] for b in DEFAULT]
    out = capsys.readouterr().out
    total = sum(b.minutes for b in DEFAULT)
    assert f"about {total:.0f} minutes estimated" in out
    assert f"minutes in all (estimated {total:.1f})" in out
    for b in DEFAULT:  # the summary: a line per benchmark with its minutes and estimate
        assert any(line.strip().startswith(b.name) and f"(estimated {b.minutes:.1f})" in line
                   for line in out.splitlines()), b.name
    ran.clear()
    assert run_all.main(["--full"]) == 0
    assert ran == [[b.module, *b.args] for b in FULL]


def test_only_picks_from_the_chosen_set(ran, capsys):
    assert run_all.main(["--only", "bench.bench_client"]) == 0
    assert ran == [["bench.bench_client", "--iterations", "20000"]]
    with pytest.raises(SystemExit):
        run_all.main(["--only", "bench.bench_endpoints"])
    assert "--full runs the whole list" in capsys.readouterr().err
    ran.clear()
    assert run_all.main(["--full", "--only", "bench.bench_endpoints"]) == 0
    assert ran == [["bench.bench_endpoints", "--budget", "smoke"]]


def test_the_summary_names_a_failure():
    took = [(DEFAULT[0], 0.4, 0), (DEFAULT[1], 2.0, 3)]
    text = run_all.summary(took)
    assert "2.4 minutes in all (estimated 4.5)" in text
    assert "FAILED (exit 3)" in text.splitlines()[-1] and "FAILED" not in text.splitlines()[-2]

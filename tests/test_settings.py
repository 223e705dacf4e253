"""The stages' settings, declared once (promptdistill.core.settings): their fields and defaults
stay what the cache keys and deployments hold, every bad value is refused naming the class
and the field, and each command's ``--help`` shows the default the code uses."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import pytest

from promptdistill.cli import build_parser
from promptdistill.core.errors import ConfigError
from promptdistill.distill.loop import DistillConfig
from promptdistill.optimize.run import OptimizeBudget
from promptdistill.optimize.select import SelectionRule
from promptdistill.pipeline.budgets import TTFTBudget
from promptdistill.pipeline.ttft_models import TTFTFreshness
from promptdistill.search.budget import SearchBudget
from promptdistill.search.racing import RaceKnobs, RaceSettings
from promptdistill.search.sequential import PlanAssumption
from promptdistill.ttft.profile import ProfileConfig

REPO = Path(__file__).resolve().parents[1]

# Field order and defaults as the deployments' parameters hold them (the cache keys sort the
# fields by name: canonical_json). The shared fields come first, from the class that declares
# them (SearchBudget, RaceKnobs).
DEFAULTS = {
    DistillConfig: dict(alpha=0.1, finalists=3, first_look=50, max_lm_calls=1500, max_minutes=10.0, screen_size=16,
                        dev_size=1000, test_size=200, screen_every=False, seed=0, thresholds=(0.5, 0.75),
                        target_ratios=(0.5, 0.3), max_rounds=2, max_quality_drop=None, race=True,
                        ablation=True, ablate_clear=False, rewrite=True, proposals=(), calibrate=True, judge_examples=3),
    OptimizeBudget: dict(max_lm_calls=4000, max_minutes=60.0, screen_size=16, dev_size=1000, test_size=200,
                         screen_every=False, fewshot_counts=(0, 2, 4, 8), similar_counts=(2, 4), fixed_subsets=2,
                         max_variants=3, described=True, block_aligned=True, reply_reminder=True, feature_records=6,
                         timing_records=3, formats=True, format_size=16),
    SelectionRule: dict(alpha=0.1, finalists=3, first_look=50, ttft="expected", warm_share=None,
                        allow_per_request_examples=False, verify_on_test=True),
    TTFTBudget: dict(points=40, repeats=3, spec_records=2, max_minutes=30.0, density_probe_tokens=(256, 1024),
                     fewshot_probe=True, queue_batches=((4, 384), (8, 768), (3, 1536)), matmul_probe=True,
                     keep_contended=False),
    ProfileConfig: dict(points=40, repeats=3, max_minutes=30.0, min_prompts=10, min_repeats=1, min_tokens=48, max_tokens=None,
                        density_probe_tokens=(256, 1024), fewshot_probe=True, spec_records=2,
                        ladder_tokens=(128, 256, 512, 1024, 2048), queue_batches=((4, 384), (8, 768), (3, 1536)),
                        matmul_probe=True, warmup=3, min_warm_static_tokens=160, new_tokens=1, max_retries=2,
                        max_foreign_cpu_share=0.2, quiet_wait_s=10.0, prompts_dir="prompts", seed=0),
    PlanAssumption: dict(discordance=0.2),
    TTFTFreshness: dict(max_age_hours=168.0),
}


def make(cls: type, **values):
    """An instance checked as its callers check it (ProfileConfig on ``validate()``)."""
    obj = cls(**values)
    return obj.validate() if cls is ProfileConfig else obj


@pytest.mark.parametrize("cls", list(DEFAULTS), ids=lambda c: c.__name__)
def test_fields_and_defaults_are_unchanged(cls):
    assert dataclasses.asdict(make(cls)) == DEFAULTS[cls]
    assert list(dataclasses.asdict(make(cls))) == list(DEFAULTS[cls])


BAD = [
    *[(DistillConfig, name, 0) for name in ("screen_size", "dev_size", "max_rounds", "max_lm_calls", "finalists",
                                            "first_look")],
    (DistillConfig, "test_size", -1), (DistillConfig, "max_minutes", 0), (DistillConfig, "max_minutes", -1.5),
    (DistillConfig, "thresholds", (0.5, 1.5)), (DistillConfig, "thresholds", (-0.1,)),
    (DistillConfig, "target_ratios", (0.0,)), (DistillConfig, "target_ratios", (1.0,)),
    (DistillConfig, "alpha", 0.0), (DistillConfig, "alpha", 0.5), (DistillConfig, "max_lm_calls", "300"),
    (DistillConfig, "max_lm_calls", 1.5), (DistillConfig, "max_minutes", float("nan")),
    *[(OptimizeBudget, name, 0) for name in ("max_lm_calls", "dev_size", "screen_size", "feature_records",
                                             "max_variants", "max_minutes")],
    *[(OptimizeBudget, name, -1) for name in ("test_size", "timing_records", "fixed_subsets", "format_size")],
    (OptimizeBudget, "fewshot_counts", (0, 9)), (OptimizeBudget, "fewshot_counts", (-1,)),
    (OptimizeBudget, "similar_counts", (9,)), (OptimizeBudget, "formats", "yes"),
    (SelectionRule, "ttft", "hot"), (SelectionRule, "warm_share", 1.5), (SelectionRule, "warm_share", -0.1),
    (SelectionRule, "warm_share", "0.5"), (SelectionRule, "alpha", 0.0), (SelectionRule, "alpha", 0.5),
    (SelectionRule, "finalists", 0), (SelectionRule, "first_look", 0),
    (TTFTBudget, "points", -1), (TTFTBudget, "repeats", 0), (TTFTBudget, "spec_records", -1),
    (TTFTBudget, "max_minutes", 0), (TTFTBudget, "points", True),
    *[(ProfileConfig, name, -1) for name in ("points", "spec_records", "warmup")],
    (ProfileConfig, "repeats", 0), (ProfileConfig, "max_minutes", 0), (ProfileConfig, "min_tokens", 15),
    (ProfileConfig, "min_prompts", 0), (ProfileConfig, "min_repeats", 0),
    (ProfileConfig, "queue_batches", ((0, 384),)), (ProfileConfig, "queue_batches", ((4, 15),)),
    (ProfileConfig, "density_probe_tokens", ("256",)),
]


@pytest.mark.parametrize("cls, name, value", BAD, ids=lambda v: getattr(v, "__name__", repr(v)))
def test_every_bad_value_is_refused_naming_class_and_field(cls, name, value):
    with pytest.raises(ValueError, match=rf"^{cls.__name__}\.{name} .*got "):
        make(cls, **{name: value})


GOOD = [
    (DistillConfig, dict(test_size=0, thresholds=(0.0, 1.0), target_ratios=(0.01, 0.99), alpha=0.49,
                         max_minutes=1, max_quality_drop=0.0, judge_examples=0)),
    (OptimizeBudget, dict(test_size=0, timing_records=0, fixed_subsets=0, format_size=0, fewshot_counts=(0, 8),
                          similar_counts=())),
    (SelectionRule, dict(ttft="cold", warm_share=0.0, alpha=0.01, finalists=1, first_look=1)),
    (SelectionRule, dict(ttft="warm", warm_share=1.0)),
    (TTFTBudget, dict(points=0, repeats=1, spec_records=0, max_minutes=0.5)),
    (ProfileConfig, dict(points=0, spec_records=0, warmup=0, repeats=1, max_minutes=0.1, min_tokens=16, min_prompts=1,
                         queue_batches=(), max_tokens=300, density_probe_tokens=())),
]


@pytest.mark.parametrize("cls, values", GOOD, ids=lambda v: getattr(v, "__name__", ""))
def test_the_edges_of_each_range_are_accepted(cls, values):
    obj = make(cls, **values)
    assert {k: getattr(obj, k) for k in values} == values


KNOBS = ("screen_size", "dev_size", "test_size", "max_lm_calls", "max_minutes", "screen_every", "alpha", "finalists",
         "first_look")
"""The search's and the race's settings both stages take."""


def test_each_search_and_race_knob_is_declared_once():
    """Declared in two classes, a knob's help and bounds drift apart (the distiller's time
    budget said a step starts "only if projected to end in time", the search's Budget that
    time is never projected). Grep the package: each is declared as a setting once."""
    declared: dict[str, list[str]] = {name: [] for name in KNOBS}
    pattern = re.compile(rf"^\s+({'|'.join(KNOBS)})\s*:[^=\n]*=\s*setting\(", re.M)
    for path in sorted((REPO / "promptdistill").rglob("*.py")):
        if path.parent.name == "ttft":  # the TTFT profile's own safety stop is also named max_minutes
            continue
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            declared[match.group(1)].append(str(path.relative_to(REPO)))
    assert {name: len(where) for name, where in declared.items()} == dict.fromkeys(KNOBS, 1), declared
    # Every stage's field carries that one declaration (a stage's own default restates only the number).
    stages = (SearchBudget, RaceKnobs, RaceSettings, DistillConfig, OptimizeBudget, SelectionRule)
    for name in KNOBS:
        settings = {id(f.metadata["setting"]) for cls in stages for f in dataclasses.fields(cls) if f.name == name}
        assert len(settings) == 1, name


def test_lists_given_for_tuple_fields_become_tuples():
    assert OptimizeBudget(fewshot_counts=[0, 2]).fewshot_counts == (0, 2)
    assert DistillConfig(thresholds=[0.5]).thresholds == (0.5,)


# ------------------------------------------------------------------ --help
FLAGS = [
    *[(["distill"], flag, DistillConfig, name) for flag, name in (
        ("--budget-calls", "max_lm_calls"), ("--budget-minutes", "max_minutes"), ("--dev", "dev_size"),
        ("--test", "test_size"), ("--screen", "screen_size"), ("--alpha", "alpha"), ("--finalists", "finalists"),
        ("--rounds", "max_rounds"))],
    *[(["optimize"], flag, OptimizeBudget, name) for flag, name in (
        ("--budget-calls", "max_lm_calls"), ("--budget-minutes", "max_minutes"), ("--dev", "dev_size"),
        ("--test", "test_size"), ("--screen", "screen_size"))],
    *[(["optimize"], flag, SelectionRule, name) for flag, name in (
        ("--alpha", "alpha"), ("--finalists", "finalists"), ("--ttft", "ttft"))],
    *[(["ttft", "profile"], flag, ProfileConfig, name) for flag, name in (
        ("--points", "points"), ("--repeats", "repeats"), ("--max-minutes", "max_minutes"),
        ("--spec-records", "spec_records"), ("--density-probe-tokens", "density_probe_tokens"),
        ("--ladder-tokens", "ladder_tokens"), ("--max-retries", "max_retries"), ("--quiet-wait-s", "quiet_wait_s"),
        ("--seed", "seed"))],
    (["plan"], "--discordance", PlanAssumption, "discordance"),
    (["nightly"], "--ttft-max-age-hours", TTFTFreshness, "max_age_hours"),
]


def _declared(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _help(command: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def _option_help(help_text: str, flag: str) -> str:
    """The help of one option: from its flag to the next option."""
    found = re.search(rf"(?<= ){re.escape(flag)} (.*?)(?= --?[a-z]|$)", help_text)
    assert found, f"{flag} is not in the help"
    return found.group(1)


def _shown(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return format(value, "g") if isinstance(value, float) else str(value)


@pytest.mark.parametrize("command, flag, cls, name", FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list) else
                         getattr(v, "__name__", str(v)))
def test_help_shows_the_default_the_code_uses(command, flag, cls, name, capsys):
    default = _declared(cls, name).default
    assert re.search(rf"default {re.escape(_shown(default))}[;)]", _option_help(_help(command, capsys), flag))


NUMBER_FLAGS = [f for f in FLAGS if type(_declared(*f[2:]).default) in (int, float)]


@pytest.mark.parametrize("command, flag, cls, name", NUMBER_FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list)
                         else getattr(v, "__name__", str(v)))
def test_help_follows_a_changed_declaration(command, flag, cls, name, capsys, monkeypatch):
    # Another declared default shows in the help: no help text states a default of its own.
    field = _declared(cls, name)
    monkeypatch.setattr(field, "default", field.default + 7)
    assert f"default {_shown(field.default)})" in _option_help(_help(command, capsys), flag)


def test_the_help_of_unset_settings_says_what_unset_means(capsys):
    assert "unset: measured" in _option_help(_help(["optimize"], capsys), "--warm-share")
    assert "unset: the engine's context limit" in _option_help(_help(["ttft", "profile"], capsys), "--max-tokens")


def test_every_entrypoint_defaults_to_one_preset_or_says_why_not(capsys):
    """The flows (the deployments), ``plan`` and the presets' table agree on one default;
    ``promptdistill nightly`` runs on the machine at hand and its help says so."""
    import inspect

    import promptdistill.flows.nightly as nightly_flow
    import promptdistill.flows.optimize_prompt as optimize_flow
    from promptdistill.pipeline.budgets import budget_preset
    from promptdistill.pipeline.presets import DEFAULT_PRESET, LOCAL_PRESET, PRESETS

    for flow in (nightly_flow.nightly, optimize_flow.optimize_prompt):
        assert inspect.signature(flow.fn).parameters["preset"].default == DEFAULT_PRESET, flow.name
    parser = build_parser()
    assert parser.parse_args(["plan", "x"]).budget == DEFAULT_PRESET
    assert parser.parse_args(["nightly"]).budget == LOCAL_PRESET != DEFAULT_PRESET
    assert (f"(default {LOCAL_PRESET}: this command runs on the machine at hand; the deployed flows and "
            f"`promptdistill plan` default to {DEFAULT_PRESET})") in _option_help(_help(["nightly"], capsys), "--budget")
    # The default preset is the library defaults, but for the distiller's race (left to the optimizer)
    # and the TTFT profile's design, which its table row states.
    assert budget_preset(DEFAULT_PRESET) == {"ttft_budget": TTFTBudget(**PRESETS[DEFAULT_PRESET]["ttft_budget"]),
                                             "distill": DistillConfig(race=False), "budget": OptimizeBudget(),
                                             "selection": SelectionRule()}
    assert all(row["distill"]["race"] is False for row in PRESETS.values())


# ------------------------------------------------------------------ flags to settings
def test_flags_reach_the_settings_and_bad_ones_are_config_errors():
    from promptdistill.cli import distill, optimize

    parser = build_parser()
    budget, rule = optimize._budget(parser.parse_args(["optimize", "x", "--ttft", "cold", "--warm-share", "0.25",
                                                       "--budget-calls", "9", "--alpha", "0.05"]))
    assert (rule.ttft, rule.warm_share, rule.alpha, rule.finalists, budget.max_lm_calls) == ("cold", 0.25, 0.05, 3, 9)
    assert optimize._budget(parser.parse_args(["optimize", "x"])) == (OptimizeBudget(), SelectionRule())
    config = distill._config(parser.parse_args(["distill", "x", "--rounds", "1", "--seed", "4", "--no-rewrite"]))
    assert (config.max_rounds, config.seed, config.rewrite, config.max_lm_calls) == (1, 4, False, 1500)
    with pytest.raises(ConfigError, match=r"^optimize: warm_share must be in \[0, 1\], got 2.0\.$"):
        optimize._budget(parser.parse_args(["optimize", "x", "--warm-share", "2"]))
    with pytest.raises(SystemExit):  # a choice is refused while parsing, as argparse's choices are
        parser.parse_args(["optimize", "x", "--ttft", "hot"])


class _Stop(Exception):
    """Ends a command once it has passed on the value under test."""


def test_flags_left_out_run_with_the_declared_defaults(monkeypatch):
    """A flag left out parses as None; the command then runs with the declared default."""
    import inspect

    import promptdistill.flows.nightly as flows
    import promptdistill.search.racing as racing
    from promptdistill.cli import distill, nightly, plan
    from promptdistill.pipeline.console import Terminal

    def stop(seen: dict):
        def record(*args, **kwargs):
            seen.update(kwargs)
            raise _Stop
        return record

    parser = build_parser()
    assert distill._config(parser.parse_args(["distill", "x"])) == DistillConfig()
    max_age = _declared(TTFTFreshness, "max_age_hours").default
    assert inspect.signature(flows.nightly.fn).parameters["ttft_max_age_hours"].default == max_age
    passed, planned = {}, {}
    monkeypatch.setattr(flows, "nightly", stop(passed))
    with pytest.raises(_Stop):
        nightly._run(parser.parse_args(["nightly", "--budget", "smoke", "--prompts-dir", str(REPO / "prompts")]),
                     Terminal(io.StringIO(), io.StringIO(), None))
    assert passed["ttft_max_age_hours"] == max_age
    monkeypatch.setattr(racing, "plan_records", stop(planned))
    with pytest.raises(_Stop):
        plan._plan(parser.parse_args(["plan", "ticket_triage", "--prompts-dir", str(REPO / "prompts")]))
    assert planned["discordance"] == _declared(PlanAssumption, "discordance").default


def test_profile_flags_parse_as_their_fields_types():
    args = build_parser().parse_args(["ttft", "profile", "--density-probe-tokens", "", "--ladder-tokens", "64, 128",
                                      "--quiet-wait-s", "0", "--max-tokens", "300"])
    assert (args.density_probe_tokens, args.ladder_tokens, args.quiet_wait_s, args.max_tokens) == ((), (64, 128), 0.0,
                                                                                                    300)
    assert args.points is None  # left out: the class's default applies

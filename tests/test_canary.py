"""A canary share of production's traffic: the registry's label events, the client's stable
key assignment, the CLI, and a spec's ``rollout`` keys."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptdistill.cli import main as cli_main
from promptdistill.client import Templates
from promptdistill.core.errors import RegistryError, SpecError
from promptdistill.registry import Registry
from promptdistill.registry.collection import label_moves, label_stack
from promptdistill.registry.records import LabelEvent, Split, canary_point
from promptdistill.specs import load_spec

ROOT = Path(__file__).resolve().parent.parent
KEYS = [f"user-{i}" for i in range(4000)]


def content(system: str) -> dict:
    return {"name": "triage", "system": system, "user": "Ticket: {ticket}", "inputs": ["ticket"],
            "output_schema": {"type": "object", "properties": {"team": {"type": "string"}}, "required": ["team"]},
            "response_format": "json_schema", "max_tokens": 16}


@pytest.fixture
def reg(tmp_path) -> Registry:
    reg = Registry(tmp_path / "registry")
    reg.publish("triage", content("Route the ticket."), labels=["production"])  # 1
    reg.publish("triage", content("Route the ticket to one team."))  # 2
    reg.publish("triage", content("Route the ticket to exactly one team."))  # 3
    return reg


# ------------------------------------------------------------------ the key's point
@settings(max_examples=300, deadline=None)
@given(key=st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers()),
       shares=st.tuples(st.floats(0.001, 1.0), st.floats(0.001, 1.0)), version=st.integers(1, 10**6))
def test_a_key_keeps_its_version_and_widening_only_adds_keys(key, shares, version):
    low, high = sorted(shares)
    point = canary_point("triage", version, key)
    assert 0.0 <= point < 1.0
    assert canary_point("triage", version, key) == point  # the same version for the same key
    if point < low:
        assert point < high  # in at the narrow share: in at the wide one


def test_the_share_of_keys_matches_the_share_and_each_canary_draws_afresh():
    for share in (0.1, 0.5):
        inside = sum(canary_point("triage", 2, k) < share for k in KEYS) / len(KEYS)
        assert abs(inside - share) < 0.03, (share, inside)  # binomial sd <= 0.008 at 4000 keys
    first = {k for k in KEYS if canary_point("triage", 2, k) < 0.1}
    second = {k for k in KEYS if canary_point("triage", 3, k) < 0.1}
    assert len(first & second) < 0.3 * len(first)  # not the same users for every canary (about 10% overlap)
    with pytest.raises(TypeError, match="a canary key must be"):
        canary_point("triage", 2, 1.5)


def test_the_point_is_the_same_in_another_process():
    code = ("from promptdistill.registry.records import canary_point; "
            "print([canary_point('triage', 2, k) for k in ['a', 'user-7', 42, b'raw']])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"}).stdout
    assert json.loads(out.replace("'", '"')) == [canary_point("triage", 2, k) for k in ["a", "user-7", 42, b"raw"]]


# ---------------------------------------------------------------------- registry
def test_canary_moves_are_label_events_and_production_stays(reg):
    event = reg.set_canary("triage", 2, 0.1, reason="won nightly")
    assert (event.label, event.to_version, event.shares, event.reason) == ("canary", 2, {"canary": 0.1}, "won nightly")
    assert reg.split("triage", "production") == Split(1, 2, 0.1)
    assert reg.split("triage", "canary") == Split(2)  # only production is split
    widened = reg.set_canary("triage", 2, 0.5)
    assert widened.reason == "canary share 0.1 -> 0.5" and reg.shares("triage") == {"canary": 0.5}
    ended = reg.rollback("triage", "canary")
    assert (ended.action, ended.from_version, ended.labels) == ("unset", 2, {"production": 1})
    assert reg.split("triage", "production") == Split(1) and reg.shares("triage") == {}
    reg.set_canary("triage", 3, 0.2)
    promoted = reg.promote_canary("triage")
    assert promoted.labels == {"production": 3} and promoted.shares == {}
    moves = label_moves(reg.history("triage"), "canary")
    assert [(m.action, m.to_version) for m in moves] == [("set", 2), ("set", 2), ("unset", 2), ("set", 3), ("unset", 3)]
    assert label_stack(reg.history("triage"), "canary") == []
    assert label_stack(reg.history("triage"), "production") == [1, 3]


def test_bad_canaries_are_refused_naming_the_reason(reg, tmp_path):
    with pytest.raises(RegistryError, match="share"):
        reg.set_canary("triage", 2, 0)
    with pytest.raises(RegistryError, match="share"):
        reg.set_canary("triage", 2, 1.5)
    with pytest.raises(RegistryError, match="is production already"):
        reg.set_canary("triage", 1, 0.1)
    with pytest.raises(RegistryError, match="no canary to end"):
        reg.end_canary("triage")
    with pytest.raises(RegistryError, match="no canary to promote"):
        reg.promote_canary("triage")
    other = Registry(tmp_path / "other")
    other.publish("triage", content("x"))
    with pytest.raises(RegistryError, match="no production label"):
        other.set_canary("triage", 1, 0.1)


def test_an_event_without_a_canary_is_stored_as_before_and_a_share_is_checked(reg, tmp_path):
    first = (Path(reg.root) / "templates/triage/labels/history/00000001.json").read_bytes()
    assert b"shares" not in first  # older readers read it as ever
    reg.set_canary("triage", 2, 0.1)
    event = Path(reg.root) / "templates/triage/labels/history/00000002.json"
    data = json.loads(event.read_bytes())
    assert data["shares"] == {"canary": 0.1}
    for bad in ({"canary": 0}, {"canary": 2}, {"staging": 0.1}, {"canary": True}):
        with pytest.raises(Exception, match="shares"):
            LabelEvent.from_bytes(json.dumps({**data, "shares": bad}).encode(), where="e.json")
    with pytest.raises(Exception, match="still holds canary"):
        LabelEvent.from_bytes(json.dumps({**data, "action": "unset"}).encode(), where="e.json")


# ------------------------------------------------------------------------- client
def test_get_with_a_key_serves_the_canary_to_its_share_and_widening_keeps_keys(reg):
    reg.set_canary("triage", 2, 0.1)
    templates = Templates(reg.root, ttl_s=0, timeout_s=5)
    served = {k: templates.get("triage@production", key=k) for k in KEYS}
    canary = {k for k, t in served.items() if t.version == 2}
    assert canary == {k for k in KEYS if canary_point("triage", 2, k) < 0.1}
    assert abs(len(canary) / len(KEYS) - 0.1) < 0.03
    assert {t.label for k, t in served.items() if k in canary} == {"canary"}
    assert {t.label for k, t in served.items() if k not in canary} == {"production"}
    assert all(templates.get("triage@production", key=k).version == served[k].version for k in KEYS[:500])
    reg.set_canary("triage", 2, 0.5)
    wider = {k for k in KEYS if templates.get("triage@production", key=k).version == 2}
    assert canary < wider and abs(len(wider) / len(KEYS) - 0.5) < 0.03
    assert templates.get("triage@canary").version == 2  # the label itself, for everyone
    assert templates.get("triage:1").label is None
    reg.rollback("triage", "canary")
    assert {templates.get("triage@production", key=k).version for k in KEYS[:500]} == {1}


def test_without_a_key_a_random_share_of_calls_get_the_canary(reg):
    reg.set_canary("triage", 3, 0.25)
    templates = Templates(reg.root, ttl_s=60)
    versions = [templates.get("triage@production").version for _ in range(4000)]
    assert set(versions) == {1, 3}
    assert abs(versions.count(3) / 4000 - 0.25) < 0.04


def test_a_store_outage_keeps_the_whole_assignment(reg, caplog):
    reg.set_canary("triage", 2, 0.3)
    templates = Templates(reg.root, ttl_s=0, timeout_s=5)
    before = {k: templates.get("triage@production", key=k).version for k in KEYS[:1000]}
    assert set(before.values()) == {1, 2}
    moved = Path(reg.root).with_name("unmounted")
    Path(reg.root).rename(moved)
    try:
        with caplog.at_level(logging.WARNING, logger="promptdistill.client"):
            during = {k: templates.get("triage@production", key=k).version for k in KEYS[:1000]}
        assert during == before
        assert "serving last good copy triage:1 + canary triage:2 at 30%" in caplog.text
    finally:
        moved.rename(reg.root)


def test_a_reader_in_another_process_keeps_serving_through_an_outage(reg, tmp_path):
    reg.set_canary("triage", 2, 0.3)
    script = tmp_path / "reader.py"
    script.write_text(
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from promptdistill.client import Templates\n"
        "root = Path(sys.argv[1])\n"
        "keys = [f'user-{i}' for i in range(300)]\n"
        "t = Templates(str(root), ttl_s=0, timeout_s=0.2)\n"
        "before = [t.get('triage@production', key=k).version for k in keys]\n"
        "root.rename(root.with_name('gone'))\n"
        "during = [t.get('triage@production', key=k).version for k in keys]\n"
        "root.with_name('gone').rename(root)\n"
        "print(json.dumps({'before': before, 'during': during}))\n")
    out = subprocess.run([sys.executable, str(script), reg.root], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["during"] == result["before"] and set(result["before"]) == {1, 2}


def test_a_broken_canary_version_serves_production_to_every_key(reg, caplog):
    reg.set_canary("triage", 2, 0.5)
    version = Path(reg.root) / "templates/triage/versions/2.json"
    version.write_text(version.read_text().replace("one team", "two teams"))  # edited after publishing
    with caplog.at_level(logging.ERROR, logger="promptdistill.client"):
        templates = Templates(reg.root)
        assert {templates.get("triage@production", key=k).version for k in KEYS[:300]} == {1}
    assert "canary triage:2 of triage@production cannot be loaded" in caplog.text


# ---------------------------------------------------------------------------- CLI
def test_the_cli_sets_widens_shows_and_ends_a_canary(reg, capsys):
    root = ["--root", reg.root]
    assert cli_main(["templates", "canary", "triage", "2", "--share", "0.1", *root]) == 0
    assert "10% of production's keys (production is 1)" in capsys.readouterr().out
    assert cli_main(["templates", "canary", "triage", "2", "--share", "0.5", *root]) == 0
    assert cli_main(["templates", "list", *root]) == 0
    assert "canary=2 (50%), production=1" in capsys.readouterr().out
    assert cli_main(["templates", "rollback", "triage", "--label", "canary", *root]) == 0
    assert "canary ended); production stays at 1" in capsys.readouterr().out
    assert cli_main(["templates", "history", "triage", *root]) == 0
    out = capsys.readouterr().out
    assert "share 10% -> 50%" in out and "2 -> (removed)" in out and "unset" in out
    assert reg.labels("triage") == {"production": 1}
    with pytest.raises(SystemExit):
        cli_main(["templates", "canary", "triage", "2", "--share", "1.5", *root])


# -------------------------------------------------------------------------- specs
def _project_copy(tmp_path: Path, rollout: str) -> Path:
    for folder in ("prompts", "datasets"):
        (tmp_path / folder).mkdir(parents=True)
    shutil.copy(ROOT / "datasets" / "ticket_triage.jsonl", tmp_path / "datasets")
    text = (ROOT / "prompts" / "ticket_triage.yaml").read_text()
    (tmp_path / "prompts" / "ticket_triage.yaml").write_text(text + rollout)
    return tmp_path / "prompts"


def test_a_spec_without_rollout_keeps_the_hash_the_previous_code_gave_it(tmp_path):
    """The hash is over ``to_dict``: a spec without the new keys must give the dict the code
    before them gave (these top-level and ``slo`` keys, nothing more), so its hash is unchanged."""
    spec = load_spec("ticket_triage", prompts_dir=ROOT / "prompts")
    assert spec.rollout is None
    data = spec.to_dict()
    assert set(data) == {"name", "description", "dataset", "inputs", "template", "output", "metric", "slo"}
    assert set(data["slo"]) == {"ttft_ms", "max_quality_drop"}


def test_rollout_keys_load_with_defaults_and_change_the_hash(tmp_path):
    plain = load_spec("ticket_triage", prompts_dir=ROOT / "prompts")
    spec = load_spec("ticket_triage", prompts_dir=_project_copy(tmp_path / "a", "rollout: {canary_share: 0.2}\n"))
    assert (spec.rollout.canary_share, spec.rollout.steps) == (0.2, (0.2, 0.5, 1.0))
    assert spec.spec_hash() != plain.spec_hash()
    spec = load_spec("ticket_triage", prompts_dir=_project_copy(tmp_path / "b", "rollout: {steps: [0.05, 0.25, 1]}\n"))
    assert (spec.rollout.canary_share, spec.rollout.steps) == (0.05, (0.05, 0.25, 1))
    spec = load_spec("ticket_triage", prompts_dir=_project_copy(tmp_path / "c", "rollout: {}\n"))
    assert spec.rollout.to_dict() == {"canary_share": 0.1, "steps": [0.1, 0.5, 1.0]}


@pytest.mark.parametrize("rollout, message", [
    ("{canary_share: 0}", "canary_share"),
    ("{canary_share: 1}", "canary_share"),
    ("{steps: [0.5, 0.2, 1.0]}", "rollout.steps: shares must increase"),
    ("{steps: [0.1, 0.5]}", "rollout.steps: must end at 1.0"),
    ("{canary_share: 0.2, steps: [0.1, 1.0]}", "rollout.steps: must start at rollout.canary_share"),
    ("{canary_share: 0.1, wave: 2}", "wave"),
])
def test_bad_rollout_keys_are_refused_naming_the_field(tmp_path, rollout, message):
    with pytest.raises(SpecError, match=message):
        load_spec("ticket_triage", prompts_dir=_project_copy(tmp_path, f"rollout: {rollout}\n"))

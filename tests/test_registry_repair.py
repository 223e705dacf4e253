"""``templates repair`` can only make things right; ``verify`` names every problem.

Each case shows the label a **new process** is served before and after the repair (the
CLI and the client run in subprocesses, as an operator and a service would):

* a stale ``labels.json`` beside a corrupt older event: production stays where the
  history says, and the next promote is seen;
* a ``labels.json`` that is a FIFO, a symlink out of the root, or a folder: reads and
  promotes go on (the checkpoint is only a hint), verify reports it, repair quarantines it;
* two repairs at once both end cleanly;
* a file that is a symlink loop is listed by verify, not a crash;
* repair racing promotes, 20 trials: the labels are always those of the replayed history.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_registry import make_content
from test_registry_hostile import _corrupt, _event, _get_in_new_process, _run_cli, _template

from promptdistill.registry import Registry
from promptdistill.registry.collection import label_stack


@pytest.fixture
def reg(tmp_path) -> Registry:
    return Registry(tmp_path / "registry")


def _versions(reg: Registry, n: int, name: str = "t") -> None:
    for i in range(1, n + 1):
        reg.publish(name, make_content(f"v{i}", name=name))


def _stale_checkpoint_beside_a_corrupt_older_event(reg: Registry) -> Path:
    """t: versions 1-4; events 1, 2, 3 set production to 1, 2, 3; event 2 corrupt;
    labels.json still names event 1 (a writer killed before its checkpoint write)."""
    _versions(reg, 4)
    checkpoint = _template(reg, "t") / "labels.json"
    for v in (1, 2, 3):
        reg.set_label("t", "production", v)
        if v == 1:
            stale = checkpoint.read_bytes()
    checkpoint.write_bytes(stale)
    _corrupt(_event(reg, "t", 2))
    return checkpoint


def _served(reg: Registry) -> str:
    return _get_in_new_process(reg.root, "t@production")["t@production"]


def _replayed(reg: Registry) -> dict[str, int]:
    """The labels the history says: those of its last intact event (read straight from the files)."""
    history = _template(reg, "t") / "labels" / "history"
    events = []
    for path in sorted(history.iterdir()):
        try:
            event = json.loads(path.read_bytes())
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("labels"), dict):
            events.append(event)
    return events[-1]["labels"] if events else {}


# ------------------------------------------------- a stale checkpoint and a gap
def test_repair_of_an_older_event_beside_a_stale_checkpoint_keeps_the_served_label(reg):
    checkpoint = _stale_checkpoint_beside_a_corrupt_older_event(reg)
    assert _served(reg) == "OK t:3"

    run = _run_cli("templates", "repair", "t", "--root", reg.root)
    assert run.returncode == 0, run.stderr
    assert "t labels now: production=3" in run.stdout
    # The checkpoint names the latest event, not the one before the gap the repair made.
    assert json.loads(checkpoint.read_text())["labels"] == {"production": 3}
    assert _served(reg) == "OK t:3"

    # The next promote is seen by every new process.
    run = _run_cli("templates", "promote", "t", "4", "--label", "production", "--root", reg.root)
    assert run.returncode == 0, run.stderr
    assert _served(reg) == "OK t:4"
    assert reg.labels("t") == {"production": 4} == _replayed(reg)
    assert label_stack(reg.history("t"), "production") == [1, 3, 4]  # the quarantined move is gone


def test_a_checkpoint_before_a_gap_does_not_hide_later_events(reg):
    """A repair killed between its moves and its checkpoint write leaves the old checkpoint:
    readers must not stop at the gap, and a promote must not fill it."""
    checkpoint = _stale_checkpoint_beside_a_corrupt_older_event(reg)
    _event(reg, "t", 2).unlink()  # the gap a quarantine makes; the checkpoint still names event 1
    assert json.loads(checkpoint.read_text())["seq"] == 1
    assert _served(reg) == "OK t:3"
    assert reg.set_label("t", "production", 4).seq == 4  # after the last event, never into the gap
    assert not _event(reg, "t", 2).exists()
    assert _served(reg) == "OK t:4"


def test_repair_of_the_latest_event_records_itself_and_the_labels_before_it(reg):
    _versions(reg, 3)
    reg.set_label("t", "production", 1)
    reg.set_label("t", "production", 2)
    _corrupt(_event(reg, "t", 2))
    assert _served(reg).startswith("IntegrityError ")
    report = reg.repair("t", actor="ops")
    assert report.labels == {"production": 1} and [Path(p).name for p in report.moved] == ["00000002.json"]
    repair_event = reg.history("t")[-1]
    assert (repair_event.seq, repair_event.actor, repair_event.labels) == (3, "ops", {"production": 1})
    assert "quarantined event 2" in repair_event.reason
    assert _served(reg) == "OK t:1"
    assert reg.set_label("t", "production", 3).seq == 4
    assert _served(reg) == "OK t:3"


# --------------------------------------------- a checkpoint that is not a file
def _fifo(path: Path, tmp_path: Path) -> None:
    os.mkfifo(path)


def _symlink_out(path: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside-labels.json"
    outside.write_text(json.dumps({"seq": 1, "labels": {"production": 1}}))
    path.symlink_to(outside)


def _folder(path: Path, tmp_path: Path) -> None:
    path.mkdir()
    (path / "x").write_text("{}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [_fifo, _symlink_out, _folder], ids=["fifo", "symlink-out", "folder"])
def test_a_checkpoint_that_is_not_a_regular_file_is_ignored_reported_and_quarantined(reg, tmp_path, make):
    _versions(reg, 3)
    reg.set_label("t", "production", 1)
    reg.set_label("t", "production", 2)
    checkpoint = _template(reg, "t") / "labels.json"
    checkpoint.unlink()
    make(checkpoint, tmp_path)
    assert _served(reg) == "OK t:2"  # a hint that cannot be read is ignored

    run = _run_cli("templates", "verify", "--root", reg.root)
    assert run.returncode == 1
    (line,) = run.stdout.splitlines()
    assert line.startswith(f"t: checkpoint: {checkpoint}: ")
    assert "templates repair t" in run.stderr

    # A promote records the move, and says the checkpoint was not written: it succeeds.
    run = _run_cli("templates", "promote", "t", "3", "--label", "production", "--root", reg.root)
    assert run.returncode == 0, run.stderr
    assert "checkpoint not written" in run.stderr and "templates repair t" in run.stderr
    assert _served(reg) == "OK t:3"

    run = _run_cli("templates", "repair", "t", "--actor", "ops", "--root", reg.root)
    assert run.returncode == 0, run.stderr
    assert "t labels now: production=3" in run.stdout
    assert stat.S_ISREG(os.lstat(checkpoint).st_mode)
    assert json.loads(checkpoint.read_text())["labels"] == {"production": 3}
    (moved,) = (_template(reg, "t") / "quarantine").glob("*/labels.json")
    assert f"moved to quarantine: {moved}" in run.stdout
    assert {_fifo: stat.S_ISFIFO, _symlink_out: stat.S_ISLNK, _folder: stat.S_ISDIR}[make](os.lstat(moved).st_mode)
    assert _run_cli("templates", "verify", "--root", reg.root).returncode == 0
    assert _served(reg) == "OK t:3"


# ------------------------------------------------------------ two repairs at once
def test_two_repairs_at_once_both_end_cleanly(reg):
    for trial in range(5):
        root = Path(reg.root).parent / f"registry-{trial}"
        r = Registry(root)
        _stale_checkpoint_beside_a_corrupt_older_event(r)
        _corrupt(_event(r, "t", 3))  # the latest too: labels unknown until the repair
        runs = [subprocess.Popen([sys.executable, "-m", "promptdistill", "templates", "repair", "t", "--root",
                                  str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in runs]
        for p, (out, err) in zip(runs, outs):
            assert p.returncode == 0 and "Traceback" not in err, (out, err)
            assert "t labels now: production=1" in out
        quarantined = sorted(p.name for p in (_template(r, "t") / "quarantine").glob("*/labels/history/*"))
        assert quarantined == ["00000002.json", "00000003.json"]  # each once
        assert r.labels("t") == {"production": 1} == _replayed(r)
        assert _served(r) == "OK t:1"


# ----------------------------------------------------------------- symlink loops
def test_verify_lists_symlink_loops(reg):
    _versions(reg, 1)
    reg.set_label("t", "production", 1)
    version = _template(reg, "t") / "versions" / "2.json"
    version.symlink_to(version)
    event = _event(reg, "t", 2)
    event.symlink_to(event)
    run = _run_cli("templates", "verify", "--root", reg.root)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    lines = run.stdout.splitlines()
    assert any(x.startswith(f"t: version: {version}: ") and "symlink loop" in x for x in lines), lines
    assert any(x.startswith(f"t: event: {event}: ") and "symlink loop" in x for x in lines), lines
    run = _run_cli("templates", "repair", "t", "--root", reg.root)
    assert "t labels now: production=1" in run.stdout, run.stderr
    assert not os.path.lexists(event)
    assert _served(reg) == "OK t:1"


# -------------------------------------------------------- repair racing promotes
@pytest.mark.timeout(600)
def test_repair_racing_promotes_keeps_the_labels_of_the_replayed_history(reg):
    """20 trials: a repair and two promotes in three processes at once. Every promote that
    succeeded is in the history, and every reader is served what the history says."""
    for trial in range(20):
        root = Path(reg.root).parent / f"race-{trial}"
        r = Registry(root)
        _stale_checkpoint_beside_a_corrupt_older_event(r)
        latest_corrupt = trial % 2 == 1
        if latest_corrupt:
            _corrupt(_event(r, "t", 3))
        cli = [sys.executable, "-m", "promptdistill", "templates"]
        procs = {"repair": subprocess.Popen([*cli, "repair", "t", "--root", str(root)], stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)}
        time.sleep(0.15 * (trial % 5))  # the promotes start before, with, or after the repair's work
        for v in (1, 4):
            procs[f"promote {v}"] = subprocess.Popen(
                [*cli, "promote", "t", str(v), "--label", "production", "--actor", f"promote-{v}", "--root", str(root)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        results = {k: (p, *p.communicate(timeout=120)) for k, p in procs.items()}
        for what, (p, out, err) in results.items():
            assert "Traceback" not in err, (trial, what, err)
            # A promote may only fail while the latest event is corrupt, with the repair named.
            assert p.returncode == 0 or (what != "repair" and latest_corrupt and "templates repair t" in err), \
                (trial, what, out, err)
        history = r.history("t")  # no corrupt event left, none quarantined that was intact
        moved = {p.name for p in (_template(r, "t") / "quarantine").glob("*/labels/history/*")}
        assert moved == ({"00000002.json", "00000003.json"} if latest_corrupt else {"00000002.json"}), (trial, moved)
        promoted = {f"promote-{k.split()[1]}" for k, (p, _, _) in results.items() if k != "repair" and p.returncode == 0}
        assert promoted <= {e.actor for e in history}, trial  # no promote lost
        # ... nor hidden: each is numbered after every event that existed before the trial.
        assert all(e.seq > 3 for e in history if e.actor.startswith("promote-")), (trial, history)
        assert r.labels("t") == _replayed(r) == history[-1].labels, trial
        if trial == 19:  # and a new process is served the same
            assert _served(r) == f"OK t:{history[-1].labels['production']}"

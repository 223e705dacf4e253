"""The registry against a hostile or damaged store, and the files promptdistill writes.

* a corrupt label event takes down its own template's labels at most; ``templates verify``
  reports every problem and ``templates repair`` quarantines bad events (never deletes);
* FIFOs, sockets and symlinks out of the root are refused, not waited on or followed;
* a stored ``"version": 2.0`` (or ``true``) is not an integer version;
* files written atomically get the umask's permissions, not mkstemp's 0600.

Real files, real processes; the S3 case runs against moto's server.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_registry import make_content

from promptdistill.cli import main as cli_main
from promptdistill.core.errors import IntegrityError
from promptdistill.core.jsonio import atomic_write, write_json, write_parquet
from promptdistill.registry import Registry
from promptdistill.registry.records import _record_hash


@pytest.fixture
def reg(tmp_path) -> Registry:
    return Registry(tmp_path / "registry")


def _template(reg: Registry, name: str) -> Path:
    return Path(reg.root) / "templates" / name


def _event(reg: Registry, name: str, seq: int) -> Path:
    return _template(reg, name) / "labels" / "history" / f"{seq:08d}.json"


def _two_templates(reg: Registry) -> None:
    """summarize: v1, v2, production 1 -> 2 (events 1, 2); other: v1 at production (event 1)."""
    reg.publish("summarize", make_content("a"), labels=["production"])
    reg.publish("summarize", make_content("b"), labels=["production"])
    reg.publish("other", make_content("c", name="other"), labels=["production"])


def _corrupt(path: Path) -> bytes:
    """Replace an event with one whose ``labels`` is a string; return the original bytes."""
    original = path.read_bytes()
    event = json.loads(original)
    event["labels"] = "abc"
    path.write_text(json.dumps(event))
    return path.read_bytes()


def _run_cli(*argv: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """The CLI in a new process (a hang is a failure, not a stuck test run)."""
    return subprocess.run([sys.executable, "-m", "promptdistill", *argv], capture_output=True, text=True,
                          timeout=timeout_s)


_NEW_PROCESS_GET = textwrap.dedent("""
    import sys
    from promptdistill.client import Templates
    t = Templates(sys.argv[1])
    for ref in sys.argv[2:]:
        try:
            print(ref, "OK", t.get(ref).ref)
        except Exception as e:
            print(ref, type(e).__name__, str(e).replace("\\n", " "))
""")


def _get_in_new_process(root: str, *refs: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", _NEW_PROCESS_GET, root, *refs], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines()}


# ----------------------------------------------------------- a corrupt label event
def test_a_corrupt_latest_event_takes_down_only_its_own_template(reg, capsys):
    _two_templates(reg)
    bad = _event(reg, "summarize", 2)
    _corrupt(bad)

    # A new process: the broken label fails alone, with the file and the repair named;
    # a version by number and every other template are served.
    got = _get_in_new_process(reg.root, "summarize@production", "summarize:1", "other@production")
    assert got["summarize@production"].startswith(f"IntegrityError {bad}: labels: must be an object")
    assert "promptdistill templates repair summarize" in got["summarize@production"]
    assert got["summarize:1"] == "OK summarize:1"
    assert got["other@production"] == "OK other:1"

    # templates list shows the rest and marks the broken one (and exits 1).
    assert cli_main(["templates", "list", "--root", reg.root]) == 1
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["other"].split()[1:] == ["1", "1", "production=1"]
    assert rows["summarize"].split()[1:3] == ["2", "2"] and "BROKEN" in rows["summarize"]
    assert f"summarize: IntegrityError: {bad}: labels:" in err

    # show of an intact version still works, and says the labels are unknown.
    assert cli_main(["templates", "show", "summarize:1", "--root", reg.root]) == 0
    out, err = capsys.readouterr()
    assert "summarize:1  labels: unknown" in out and f"{bad}: labels:" in err

    # history shows what it can read and marks the corrupt event.
    assert cli_main(["templates", "history", "summarize", "--root", reg.root]) == 1
    out, err = capsys.readouterr()
    assert "- -> 1" in out.splitlines()[1]
    assert out.splitlines()[2].split()[:2] == ["2", "-"] and "CORRUPT" in out.splitlines()[2]
    assert f"IntegrityError: {bad}: labels:" in err and "templates repair summarize" in err


def test_verify_reports_every_problem_and_repair_makes_promote_and_rollback_work(reg, capsys):
    _two_templates(reg)
    reg.publish("summarize", make_content("c"))  # v3, no label
    root = ["--root", reg.root]
    assert cli_main(["templates", "verify", *root]) == 0
    assert "2 template(s) checked, no problems" in capsys.readouterr().out

    bad = _event(reg, "summarize", 2)
    bad_bytes = _corrupt(bad)
    other_v1 = _template(reg, "other") / "versions" / "1.json"
    record = json.loads(other_v1.read_text())
    record["metrics"] = {"quality": 0.99}  # hand-edited after publishing
    other_v1.write_text(json.dumps(record))
    (_template(reg, "other") / "labels.json").write_text("{broken")

    # Before the repair: every move on summarize refuses, naming the file and the repair.
    for argv in (["promote", "summarize", "3", "--label", "production"], ["rollback", "summarize", "--label",
                                                                           "production"]):
        assert cli_main(["templates", *argv, *root]) == 1
        err = capsys.readouterr().err
        assert f"IntegrityError: {bad}: labels:" in err and "templates repair summarize" in err

    assert cli_main(["templates", "verify", *root]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert any(x.startswith(f"summarize: event: {bad}: labels: must be an object") and "the latest event" in x
               for x in lines), out
    assert any(x.startswith(f"other: version: {other_v1}: fields do not match record_hash") for x in lines), out
    assert any(x.startswith(f"other: label: ") and "label 'production' points at version 1, which is corrupt" in x
               for x in lines), out
    assert any(x.startswith("other: checkpoint: ") and "unreadable" in x for x in lines), out
    assert len(lines) == 4, out
    assert "4 problem(s) in 2 template(s)" in err and "promptdistill templates repair summarize" in err
    assert cli_main(["templates", "verify", "other", *root]) == 1
    assert "summarize" not in capsys.readouterr().out

    assert cli_main(["templates", "repair", "summarize", "--actor", "ops", *root]) == 0
    out = capsys.readouterr().out
    (moved,) = (_template(reg, "summarize") / "quarantine").glob("*/labels/history/00000002.json")
    assert f"moved to quarantine: {moved}" in out and "summarize labels now: production=1" in out
    assert moved.read_bytes() == bad_bytes and not bad.exists()  # moved aside, not deleted or rewritten
    why = json.loads((moved.parents[2] / "why.json").read_text())
    assert why["actor"] == "ops" and "labels: must be an object" in why["events"]["2"]
    # The corrupt event was the latest: the labels kept are recorded as a new event after it.
    assert json.loads((_template(reg, "summarize") / "labels.json").read_text())["seq"] == 3
    assert reg.history("summarize")[-1].reason.startswith("repair: quarantined event 2")

    # The template works again: in a new process, and for promote and rollback.
    assert _get_in_new_process(reg.root, "summarize@production")["summarize@production"] == "OK summarize:1"
    assert cli_main(["templates", "promote", "summarize", "3", "--label", "production", *root]) == 0
    assert reg.history("summarize")[-1].seq == 4  # numbered after the last event: never into the gap
    assert cli_main(["templates", "rollback", "summarize", "--label", "production", *root]) == 0
    assert reg.labels("summarize") == {"production": 1}
    capsys.readouterr()

    # A repair of "other" rewrites its checkpoint; a corrupt version is reported, never moved.
    assert cli_main(["templates", "repair", "other", *root]) == 1
    out, err = capsys.readouterr()
    assert "other: no corrupt label events" in out and f"not repaired: other: version: {other_v1}" in err
    assert json.loads((_template(reg, "other") / "labels.json").read_text())["seq"] == 1
    assert other_v1.exists() and not (_template(reg, "other") / "quarantine").exists()


def test_a_corrupt_older_event_does_not_hide_the_labels(reg, caplog):
    _two_templates(reg)
    reg.set_label("summarize", "staging", 1)  # event 3: production=2, staging=1
    bad = _event(reg, "summarize", 2)
    _corrupt(bad)
    (_template(reg, "summarize") / "labels.json").unlink()
    with caplog.at_level(logging.ERROR, logger="promptdistill.registry"):
        assert reg.labels("summarize") == {"production": 2, "staging": 1}  # the latest event decides
    # From a checkpoint before the corrupt event: rolled forward past it, with an error logged.
    (_template(reg, "summarize") / "labels.json").write_text(json.dumps({"seq": 1, "labels": {"production": 1}}))
    with caplog.at_level(logging.ERROR, logger="promptdistill.registry"):
        assert reg.resolve("summarize", "production") == 2
    assert any(f"{bad}: labels:" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
    assert reg.set_label("summarize", "candidate", 2).seq == 4  # a move needs only the latest state
    # A rollback needs the whole history: it refuses until the repair.
    with pytest.raises(IntegrityError, match="templates repair summarize"):
        reg.rollback("summarize", "production")
    report = reg.repair("summarize", actor="ops")
    assert [Path(p).name for p in report.moved] == ["00000002.json"]
    assert report.labels == {"candidate": 2, "production": 2, "staging": 1} and report.remaining == []
    assert reg.rollback("summarize", "production").to_version == 1


def test_publish_with_labels_over_a_corrupt_history_says_the_version_was_published(reg, capsys, tmp_path):
    _two_templates(reg)
    _corrupt(_event(reg, "summarize", 2))
    (tmp_path / "c.json").write_text(json.dumps(make_content("d")))
    assert cli_main(["templates", "publish", "summarize", str(tmp_path / "c.json"), "--label", "production",
                     "--root", reg.root]) == 1
    assert "IntegrityError: published summarize:3, but did not set production:" in capsys.readouterr().err
    assert reg.versions("summarize") == [1, 2, 3]


def test_repair_on_an_object_store(s3_root):
    """The quarantine on S3 (moto's server): copy, then remove the original; nothing lost."""
    root, options = s3_root
    reg = Registry(root, storage_options=options)
    reg.publish("summarize", make_content("a"), labels=["production"])
    reg.publish("summarize", make_content("b"), labels=["production"])
    key = "templates/summarize/labels/history/00000002.json"
    reg.backend.fs.pipe_file(reg.backend._path(key), b"garbage{")
    with pytest.raises(IntegrityError, match="not valid JSON.*templates repair summarize"):
        reg.labels("summarize")
    assert [p.kind for p in reg.verify()] == ["event"]
    report = reg.repair("summarize", actor="ops")
    (moved,) = report.moved
    assert moved.endswith("/labels/history/00000002.json") and "/quarantine/" in moved
    assert reg.backend.read(moved.split(root.rstrip("/") + "/", 1)[1]) == b"garbage{"
    assert report.labels == {"production": 1}
    assert reg.set_label("summarize", "production", 2).seq == 4  # after the repair's own event 3
    assert reg.labels("summarize") == {"production": 2} and reg.verify() == []
    with pytest.raises(FileNotFoundError):
        reg.backend.read(key)  # the number stays free: a gap readers list past


@pytest.fixture
def s3_root():
    pytest.importorskip("s3fs")
    import uuid

    import s3fs
    from processes import free_port
    from test_registry_s3 import _options

    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        options = _options(f"http://127.0.0.1:{port}")
        bucket = f"prompts-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(**options).mkdir(bucket)
        yield f"s3://{bucket}/registry", options
    finally:
        server.stop()


# ---------------------------------------------------- FIFOs, sockets and symlinks
def test_a_fifo_version_file_is_refused_not_waited_on(reg):
    reg.publish("summarize", make_content("a"), labels=["production"])
    fifo = _template(reg, "summarize") / "versions" / "2.json"
    os.mkfifo(fifo)
    run = _run_cli("templates", "show", "summarize:2", "--root", reg.root, timeout_s=60)
    assert run.returncode == 1
    assert f"IntegrityError: {fifo}: is a FIFO, not a regular file" in run.stderr
    run = _run_cli("templates", "verify", "--root", reg.root, timeout_s=60)
    assert run.returncode == 1 and f"summarize: version: {fifo}: is a FIFO" in run.stdout


@pytest.mark.timeout(60)
def test_a_fifo_or_socket_as_a_label_event_is_refused_and_can_be_repaired(reg, monkeypatch):
    reg.publish("summarize", make_content("a"), labels=["production"])
    fifo = _event(reg, "summarize", 2)
    os.mkfifo(fifo)
    with pytest.raises(IntegrityError, match=re.escape(f"{fifo}: is a FIFO, not a regular file")):
        reg.labels("summarize")
    report = reg.repair("summarize", actor="ops")
    (moved,) = report.moved
    assert stat.S_ISFIFO(os.lstat(moved).st_mode) and report.labels == {"production": 1}

    sock_path = _event(reg, "summarize", 4)  # after the repair's own event 3
    monkeypatch.chdir(sock_path.parent)  # a relative name: AF_UNIX paths are limited to 108 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(sock_path.name)
        with pytest.raises(IntegrityError, match=re.escape(f"{sock_path}: is a socket, not a regular file")):
            reg.resolve("summarize", "production")


def test_symlinks_out_of_the_root_are_refused_and_nothing_is_written_through_them(reg, tmp_path):
    _two_templates(reg)
    labels_dir = _template(reg, "summarize") / "labels"
    outside = tmp_path / "outside-labels"
    labels_dir.rename(outside)
    labels_dir.symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in (outside / "history").iterdir())

    with pytest.raises(IntegrityError, match=re.escape(f"{labels_dir}/history: a symlink leads out of the registry root")):
        reg.set_label("summarize", "production", 1)
    assert cli_main(["templates", "promote", "summarize", "1", "--label", "production", "--root", reg.root]) == 1
    assert sorted(p.name for p in (outside / "history").iterdir()) == before  # nothing written outside
    assert reg.get("other@production").version == 1  # the other template is untouched

    # A version file that is a symlink to a copy outside the root is refused too.
    copy = tmp_path / "outside-1.json"
    version = _template(reg, "other") / "versions" / "1.json"
    copy.write_bytes(version.read_bytes())
    version.unlink()
    version.symlink_to(copy)
    with pytest.raises(IntegrityError, match="symlink leads out of the registry root"):
        reg.get_version("other", 1)

    # Symlinks that stay inside are followed, and the root itself may be a symlink.
    version.unlink()
    inside = Path(reg.root) / "kept-1.json"
    inside.write_bytes(copy.read_bytes())
    version.symlink_to(inside)
    assert reg.get_version("other", 1).version == 1
    link_root = tmp_path / "registry-link"
    link_root.symlink_to(reg.root, target_is_directory=True)
    assert Registry(link_root, must_exist=True).get("other@production").ref == "other:1"


# ------------------------------------------------------------- integer versions
def _rewrite(path: Path, **fields) -> None:
    record = {**json.loads(path.read_text()), **fields}
    record["record_hash"] = _record_hash(record)  # a careful forger: the hashes match
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("stored", [2.0, True])
def test_a_stored_version_that_is_not_an_integer_is_refused(reg, capsys, stored):
    reg.publish("summarize", make_content("a"))
    reg.publish("summarize", make_content("b"), labels=["production"])
    want = 1 if stored is True else 2
    path = _template(reg, "summarize") / "versions" / f"{want}.json"
    _rewrite(path, version=stored)
    with pytest.raises(IntegrityError, match=re.escape(f"{path}: version: must be an integer, got {stored!r}")):
        reg.get_version("summarize", want)
    assert cli_main(["templates", "show", f"summarize:{want}", "--root", reg.root]) == 1
    assert "version: must be an integer" in capsys.readouterr().err

    rec = reg.put_artifact("ttft-model", "engine-a", {"model.json": b"{}"})
    manifest = Path(reg.root) / "artifacts" / "ttft-model" / "engine-a" / "versions" / f"{rec.version}.json"
    _rewrite(manifest, version=float(rec.version))
    with pytest.raises(IntegrityError, match="version: must be an integer, got 1.0"):
        reg.get_artifact("ttft-model", "engine-a", version=1)


def test_a_folder_that_is_not_a_template_name_does_not_break_the_listing(reg, capsys):
    _two_templates(reg)
    (Path(reg.root) / "templates" / "bad name").mkdir()
    assert reg.names() == ["other", "summarize"]
    assert cli_main(["templates", "list", "--root", reg.root]) == 0
    assert cli_main(["templates", "verify", "--root", reg.root]) == 1
    assert "bad name: layout: " in capsys.readouterr().out


# ------------------------------------------------------- file modes and the umask
@pytest.fixture
def umask():
    """Set the process umask for one test, and restore it."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_written_atomically_get_the_umask_mode(tmp_path, umask, mask, mode):
    import pandas as pd

    from promptdistill.specs.datasets import write_records
    from bench.ttft_study.report import _atomic_write as report_write  # the TTFT study's writer

    umask(mask)
    out = tmp_path / "out"
    written = [
        atomic_write(out / "a.bin", b"x"),
        atomic_write(out / "a.txt", "x"),
        atomic_write(out / "a.parquet", lambda p: pd.DataFrame({"a": [1]}).to_parquet(p, index=False)),
        write_json(out / "result.json", {"a": 1}),
        write_records(out / "data.jsonl", [{"id": "a", "split": "train", "inputs": {"q": "x"}, "expected": 1}]),
        write_parquet(out / "profile.parquet", pd.DataFrame({"a": [1]})),
    ]
    report_write(out / "report.md", "# r\n")
    written.append(out / "report.md")
    assert cli_main(["init", str(tmp_path / "project")]) == 0
    written += [tmp_path / "project" / "promptdistill.toml", tmp_path / "project" / "prefect.yaml"]
    atomic_write(out / "a.txt", "rewritten")  # a replaced file gets the mode again
    for path in written:
        assert stat.S_IMODE(os.stat(path).st_mode) == mode, path
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp file left


def test_figures_are_written_atomically_with_the_umask_mode(tmp_path, umask):
    from promptdistill.ttft.figures import pyplot, save_figure

    umask(0o022)
    fig = pyplot().figure()
    name = save_figure(fig, tmp_path, "pred_vs_measured.png")
    path = tmp_path / name
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the temp name has no .png: the format is named
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pred_vs_measured.png"]


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temp(tmp_path):
    path = atomic_write(tmp_path / "result.json", "old")

    def broken(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_write(path, broken)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


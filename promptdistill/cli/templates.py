"""``promptdistill templates ...``: inspect and move published templates.

    promptdistill templates list
    promptdistill templates show summarize@production [--json]
    promptdistill templates diff summarize:2 summarize:3      (B may be just "3" or "@staging")
    promptdistill templates promote summarize 3 --label production [--reason "won nightly"]
    promptdistill templates rollback summarize --label production
    promptdistill templates canary summarize 4 --share 0.1     (again with --share 0.5 to widen)
    promptdistill templates rollback summarize --label canary  (ends the canary; production stays)
    promptdistill templates history summarize [--label production]
    promptdistill templates verify [summarize ...]
    promptdistill templates repair summarize
    promptdistill templates publish summarize content.json [--label candidate] [--parent 2]
    promptdistill templates sync-mlflow [summarize ...] --tracking-uri http://mlflow:5000

``diff`` prints a unified diff of the whole content (messages, schema, sampling); when the
system prompts differ, then their clause-level diff (``promptdistill.specs.diff``, the one
the night report shows): "system prompt: 2 clauses removed, 1 rewritten" and the text
with the changes marked; then the metrics with their deltas.

A corrupt label event takes down its own template's labels at most: ``list`` shows the
other templates and marks the broken one, ``history`` shows the events it can read.
``verify`` reports every problem of every template (exit 1 if any); ``repair NAME`` moves
the template's corrupt label events into ``templates/NAME/quarantine/`` (never deleting
them) so ``promote`` and ``rollback`` work again.

``canary`` puts a version on the ``canary`` label with a share of ``production``'s traffic:
clients asking for ``NAME@production`` with a key serve it to that share of the keys (see
docs/rollout.md). ``list`` and ``history`` show the share.

publish, promote, canary and rollback take ``--mlflow-uri URI`` to sync that template to MLflow
right after the change (see docs/mlflow.md).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Iterable
from typing import Any

from promptdistill.core.display import text_table
from promptdistill.core.errors import ConfigError, IntegrityError, PromptDistillError, RegistryError
from promptdistill.core.jsonio import TextFileError, read_text, strict_json

__all__ = ["register"]

_MAX_JSON_BYTES = 16 * 1024 * 1024


def _digits(text: str) -> bool:
    """ASCII digits only, as the registry reads versions (imported here: building the parser loads no registry)."""
    from promptdistill.registry.records import ASCII_DIGITS

    return ASCII_DIGITS.fullmatch(text) is not None


def _version(text: str) -> int:
    """A version argument: ASCII digits only (int() would also take "３")."""
    if not _digits(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid version {text!r}: versions are integers from 1 (ASCII digits)")
    return int(text)


def _share(text: str) -> float:
    """A traffic share: a fraction in (0, 1]."""
    try:
        share = float(text)
    except ValueError:
        share = float("nan")
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"invalid share {text!r}: a fraction of traffic in (0, 1], e.g. 0.1")
    return share


def _seconds(text: str) -> int:
    if not _digits(text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"invalid timeout {text!r}: whole seconds from 1")
    return int(text)


def _count(text: str) -> int:
    if not _digits(text):
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: a whole number from 0")
    return int(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", help="registry folder or fsspec URL (default: the configured [paths] registry)")
    # publish, promote and rollback: mirror the change into MLflow's Prompt Registry at once.
    mirror = argparse.ArgumentParser(add_help=False)
    mirror.add_argument("--mlflow-uri", metavar="URI",
                        help="then sync this template to the MLflow tracking server at URI (templates sync-mlflow)")
    parser = subparsers.add_parser("templates", help="list, show, diff, promote and roll back published templates")
    sub = parser.add_subparsers(dest="templates_command", metavar="ACTION", required=True)

    p = sub.add_parser("list", parents=[common], help="templates with their versions and labels")
    p.set_defaults(func=_list)

    p = sub.add_parser("show", parents=[common], help="one version: text, schema, metrics, provenance")
    p.add_argument("ref", help="NAME@LABEL, NAME:VERSION or NAME (production)")
    p.add_argument("--json", action="store_true", help="print the stored record as JSON")
    p.set_defaults(func=_show)

    p = sub.add_parser("diff", parents=[common],
                       help="two versions: a unified diff of the content, the system prompt clause by clause, "
                            "the metrics side by side")
    p.add_argument("a", help="NAME@LABEL or NAME:VERSION")
    p.add_argument("b", help="NAME@LABEL, NAME:VERSION, or VERSION / @LABEL of the same name")
    p.set_defaults(func=_diff)

    p = sub.add_parser("promote", parents=[common, mirror], help="point a label at a version")
    p.add_argument("name")
    p.add_argument("version", type=_version)
    p.add_argument("--label", required=True, help="production, staging, candidate, ...")
    p.add_argument("--reason", default="", help="recorded in the label history")
    p.add_argument("--actor", help="recorded in the label history (default: user@host)")
    p.set_defaults(func=_promote)

    p = sub.add_parser("canary", parents=[common, mirror],
                       help="put a version on the canary label with a share of production's traffic (again to widen)")
    p.add_argument("name")
    p.add_argument("version", type=_version)
    p.add_argument("--share", type=_share, required=True, help="the fraction of production's keys it serves, e.g. 0.1")
    p.add_argument("--reason", default="", help="recorded in the label history")
    p.add_argument("--actor", help="recorded in the label history (default: user@host)")
    p.set_defaults(func=_canary)

    p = sub.add_parser("rollback", parents=[common, mirror],
                       help="move a label back to its previous version (--label canary: end the canary)")
    p.add_argument("name")
    p.add_argument("--label", required=True)
    p.add_argument("--reason", default="")
    p.add_argument("--actor")
    p.set_defaults(func=_rollback)

    p = sub.add_parser("history", parents=[common], help="label moves: who, when, from which version to which")
    p.add_argument("name")
    p.add_argument("--label")
    p.set_defaults(func=_history)

    p = sub.add_parser("verify", parents=[common],
                       help="check every version, label event, label and checkpoint; report every problem")
    p.add_argument("names", nargs="*", metavar="NAME", help="templates to check (default: every template)")
    p.set_defaults(func=_verify)

    p = sub.add_parser("repair", parents=[common],
                       help="move a template's corrupt label events to its quarantine folder (never deleted)")
    p.add_argument("name")
    p.add_argument("--actor", help="recorded in quarantine/<stamp>/why.json (default: user@host)")
    p.set_defaults(func=_repair)

    p = sub.add_parser("publish", parents=[common, mirror], help="publish template content from a JSON file")
    p.add_argument("name")
    p.add_argument("content", help="JSON file with the template content")
    p.add_argument("--label", action="append", default=[], help="labels to set (repeatable)")
    p.add_argument("--parent", type=_version)
    p.add_argument("--metrics", help="JSON file with metrics")
    p.add_argument("--actor")
    p.set_defaults(func=_publish)

    p = sub.add_parser("sync-mlflow", parents=[common],
                       help="register published versions in MLflow's Prompt Registry; aliases follow our labels")
    p.add_argument("names", nargs="*", metavar="NAME", help="templates to sync (default: every template)")
    p.add_argument("--tracking-uri", metavar="URI",
                   help="MLflow tracking URI, e.g. http://mlflow:5000 (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--timeout", type=_seconds, metavar="S",
                   help="seconds per MLflow request (default: $MLFLOW_HTTP_REQUEST_TIMEOUT, else 30)")
    p.add_argument("--retries", type=_count, metavar="N",
                   help="retries per MLflow request (default: $MLFLOW_HTTP_REQUEST_MAX_RETRIES, else 3)")
    p.set_defaults(func=_sync_mlflow)


def _registry(args: argparse.Namespace):
    from promptdistill.registry import Registry

    root, where = args.root, "--root"
    if root is None:
        from promptdistill.core.config import load_settings

        settings = load_settings(getattr(args, "config", None))
        root, where = settings.registry, f"{settings.source}: paths.registry"
    try:
        # must_exist: an unmounted or wrong root says so instead of "unknown template";
        # publish still creates a new registry.
        return Registry(root, must_exist=True)
    except RegistryError as e:  # an unknown protocol, an empty root: the argument is wrong
        raise ConfigError(f"{where}: {e}") from None


def _labels_text(labels: dict[str, int], shares: dict[str, float] | None = None) -> str:
    shares = shares or {}
    return ", ".join(f"{k}={v}" + (f" ({shares[k]:.0%})" if k in shares else "") for k, v in sorted(labels.items())) or "-"


def _list(args: argparse.Namespace) -> int:
    reg = _registry(args)
    rows, broken = [], []
    for name in reg.names():
        # One broken template is marked, never hides the others.
        versions: list[int] = []
        try:
            versions = reg.versions(name)
            labels = _labels_text(reg.labels(name), reg.shares(name))
        except IntegrityError as e:
            broken.append(f"{name}: IntegrityError: {e}")
            labels = "BROKEN (see templates verify)"
        rows.append([name, str(len(versions)), str(versions[-1]) if versions else "-", labels])
    if not rows:
        print(f"no templates in {reg.root}")
        return 0
    print(text_table(["NAME", "VERSIONS", "LATEST", "LABELS"], rows))
    for line in broken:
        print(line, file=sys.stderr)
    if broken:
        print(f"{len(broken)} template(s) broken; `promptdistill templates verify` lists every problem, "
              "`promptdistill templates repair NAME` moves corrupt label events aside", file=sys.stderr)
        return 1
    return 0


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k in sorted(value):
            out.update(_flatten(value[k], f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: value}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "-"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def _text(record) -> list[str]:
    """The parts of a version a reviewer compares, as lines."""
    c = record.content
    lines = ["[system]", *c["system"].splitlines(), "", "[user]", *c["user"].splitlines(), ""]
    lines += ["[inputs] " + ", ".join(c["inputs"]), f"[response_format] {c.get('response_format')}",
              f"[max_tokens] {c.get('max_tokens')}", f"[sampling] {json.dumps(c.get('sampling') or {}, sort_keys=True)}"]
    if c.get("output_schema") is not None:
        lines += ["[output_schema]", *json.dumps(c["output_schema"], indent=2, sort_keys=True).splitlines()]
    return lines


def _show(args: argparse.Namespace) -> int:
    reg = _registry(args)
    record = reg.get(args.ref)
    if args.json:
        print(json.dumps(record.to_dict(), indent=2, sort_keys=True, ensure_ascii=False))
        return 0
    try:
        here = ", ".join(k for k, v in sorted(reg.labels(record.name).items()) if v == record.version) or "-"
    except IntegrityError as e:  # the version itself is intact: show it, and say the labels are not
        print(f"IntegrityError: {e}", file=sys.stderr)
        here = "unknown (the label history is corrupt; see templates verify)"
    print(f"{record.ref}  labels: {here}  parent: {_fmt(record.parent)}")
    print(f"published {record.created_at} by {record.actor}")
    print(f"content_hash {record.content_hash}\n")
    print("\n".join(_text(record)))
    for title, values in (("metrics", record.metrics), ("provenance", record.provenance)):
        flat = _flatten(values)
        if flat:
            print(f"\n[{title}]")
            print(text_table(["KEY", "VALUE"], [[k, _fmt(v)] for k, v in flat.items()]))
    return 0


def _ref_b(a: str, b: str) -> str:
    name = a.split("@", 1)[0].split(":", 1)[0]
    if _digits(b):
        return f"{name}:{b}"
    if b.startswith("@"):
        return name + b
    return b


def _clause_diff(before: str, after: str) -> str:
    """The system prompt clause by clause (the night report's diff): a count line, then the
    new text with ``[-removed-]``, ``{+added+}`` and ``[~old~>new~]`` marked."""
    from promptdistill.specs.diff import diff_counts, diff_text, prompt_diff

    ops = prompt_diff(before, after)
    counts = [(n, kind) for kind, n in diff_counts(ops).items() if n]
    if not counts:
        return "system prompt: the same clauses (only whitespace changed)"
    n, kind = counts[0]
    head = ", ".join([f"{n} clause{'s' if n != 1 else ''} {kind}"] + [f"{n} {kind}" for n, kind in counts[1:]])
    return f"system prompt: {head}\n{diff_text(ops).strip()}"


def _diff(args: argparse.Namespace) -> int:
    reg = _registry(args)
    a, b = reg.get(args.a), reg.get(_ref_b(args.a, args.b))
    diff = list(difflib.unified_diff(_text(a), _text(b), a.ref, b.ref, lineterm="", n=2))
    print("\n".join(diff) if diff else f"{a.ref} and {b.ref} have the same content ({a.content_hash})")
    if a.content["system"] != b.content["system"]:
        print()
        print(_clause_diff(a.content["system"], b.content["system"]))
    ma, mb = _flatten(a.metrics), _flatten(b.metrics)
    keys = sorted(set(ma) | set(mb))
    if keys:
        rows = []
        for k in keys:
            va, vb = ma.get(k), mb.get(k)
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
            rows.append([k, _fmt(va), _fmt(vb), f"{vb - va:+.4g}" if numeric else ""])
        print()
        print(text_table(["METRIC", a.ref, b.ref, "DELTA"], rows))
    return 0


def _promote(args: argparse.Namespace) -> int:
    reg = _registry(args)
    event = reg.set_label(args.name, args.label, args.version, actor=args.actor, reason=args.reason)
    print(f"{args.name}@{event.label}: {_fmt(event.from_version)} -> {event.to_version}")
    return _mirror(args, reg, "promoted")


def _canary(args: argparse.Namespace) -> int:
    reg = _registry(args)
    event = reg.set_canary(args.name, args.version, args.share, actor=args.actor, reason=args.reason)
    print(f"{args.name}@canary: {_fmt(event.from_version)} -> {event.to_version}, "
          f"{event.shares['canary']:.0%} of production's keys (production is {event.labels['production']})")
    return _mirror(args, reg, "canary set")


def _rollback(args: argparse.Namespace) -> int:
    reg = _registry(args)
    event = reg.rollback(args.name, args.label, actor=args.actor, reason=args.reason)
    if event.action == "unset":
        print(f"{args.name}@{event.label}: {event.from_version} removed (canary ended); "
              f"production stays at {_fmt(event.labels.get('production'))}")
    else:
        print(f"{args.name}@{event.label}: {_fmt(event.from_version)} -> {event.to_version} (rolled back)")
    return _mirror(args, reg, "rolled back")


def _history(args: argparse.Namespace) -> int:
    from promptdistill.registry.collection import label_moves
    from promptdistill.registry.records import check_label

    reg = _registry(args)
    scan = reg.history_scan(args.name)  # every event it can read, and why not the others
    events = scan.events if args.label is None else label_moves(scan.events, check_label(args.label))
    if not events and not scan.corrupt:
        print(f"no label moves for {args.name}")
        return 0
    rows, before, shares_before = [], {}, {}
    corrupt = sorted(scan.corrupt)
    for e in events:
        while corrupt and corrupt[0] < e.seq:
            rows.append([str(corrupt.pop(0)), "-", "-", "-", "CORRUPT", "-", "see below"])
        # One event may move several labels (a publish): one row per label it moved.
        moved = [e.label] if args.label else [e.label] + [k for k in sorted(set(e.labels) | set(before))
                                                          if k != e.label and before.get(k) != e.labels.get(k)]
        for label in moved:
            frm, to = (e.from_version, e.to_version) if label == e.label else (before.get(label), e.labels.get(label))
            action = e.action if label == e.label or label in e.labels else "unset"
            move = f"{_fmt(frm)} -> {'(removed)' if action == 'unset' else to}"
            if label in e.shares or label in shares_before:
                old, new = shares_before.get(label), e.shares.get(label)
                move += f", share {old:.0%} -> {new:.0%}" if old is not None and new is not None and old != new else (
                    f", share {new:.0%}" if new is not None else "")
            rows.append([str(e.seq), e.at, label, move, action, e.actor, e.reason])
        before, shares_before = e.labels, e.shares
    rows += [[str(seq), "-", "-", "-", "CORRUPT", "-", "see below"] for seq in corrupt]
    print(text_table(["SEQ", "AT", "LABEL", "MOVE", "ACTION", "ACTOR", "REASON"], rows))
    if scan.corrupt:
        for seq in sorted(scan.corrupt):
            print(f"IntegrityError: {scan.corrupt[seq]}", file=sys.stderr)
        print(f"{len(scan.corrupt)} corrupt label event(s); `promptdistill templates repair {args.name}` moves them "
              "to quarantine", file=sys.stderr)
        return 1
    return 0


def _verify(args: argparse.Namespace) -> int:
    reg = _registry(args)
    problems = reg.verify(args.names or None)
    if not problems:
        names = args.names or reg.names()
        print(f"{reg.root}: {len(names)} template(s) checked, no problems")
        return 0
    for p in problems:
        print(p)
    repairable = sorted({p.name for p in problems if p.repairable})
    print(f"{len(problems)} problem(s) in {len({p.name for p in problems})} template(s)", file=sys.stderr)
    for name in repairable:
        print(f"repair label events: promptdistill templates repair {name}", file=sys.stderr)
    return 1


def _repair(args: argparse.Namespace) -> int:
    reg = _registry(args)
    report = reg.repair(args.name, actor=args.actor)
    for where in report.moved:
        print(f"moved to quarantine: {where}")
    if not report.moved:
        print(f"{args.name}: no corrupt label events")  # another repair may have moved them first
    print(f"{args.name} labels now: {_labels_text(report.labels)}")
    if any("/labels/history/" in where for where in report.moved):
        print("a quarantined event may have been a label move: check the labels, and promote again if needed")
    for p in report.remaining:
        print(f"not repaired: {p}", file=sys.stderr)
    return 1 if report.remaining else 0


def _read_json(path: str, what: str) -> Any:
    try:
        text = read_text(path, max_bytes=_MAX_JSON_BYTES)
    except TextFileError as e:
        raise ConfigError(f"{path}: the {what} file: {e}") from None
    try:
        return strict_json(text)
    except ValueError as e:  # malformed, or NaN / Infinity
        raise ConfigError(f"{path}: the {what} file is not valid JSON: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: the {what} file is nested too deeply") from None


def _publish(args: argparse.Namespace) -> int:
    content = _read_json(args.content, "content")
    metrics = _read_json(args.metrics, "metrics") if args.metrics else None
    reg = _registry(args)
    record = reg.publish(args.name, content, parent=args.parent, metrics=metrics,
                         labels=args.label, actor=args.actor, reason="published from the CLI")
    labels: Iterable[str] = args.label
    print(f"published {record.ref} {record.content_hash}" + (f" labels: {', '.join(labels)}" if args.label else ""))
    return _mirror(args, reg, "published")


def _tracking_uri(given: str | None, flag: str) -> str:
    import os

    uri = given or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ConfigError(f"{flag}: give the MLflow tracking URI (http://host:5000) or set MLFLOW_TRACKING_URI")
    return uri


def _ranges(versions: list[int]) -> str:
    """[1, 2, 3, 5] -> "v1-v3, v5"."""
    spans: list[list[int]] = []
    for v in sorted(versions):
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(f"v{a}" if a == b else f"v{a}-v{b}" for a, b in spans)


def _print_sync(report) -> int:
    """The sync's table (unchanged versions as one row per template); 1 if anything was skipped."""
    rows = []
    for name in dict.fromkeys(i.name for i in report.items):
        items = [i for i in report.items if i.name == name]
        same = [int(i.item[1:]) for i in items if i.action == "unchanged" and i.item.startswith("v")]
        if same:
            rows.append([name, _ranges(same), "unchanged", f"{len(same)} version(s) already in MLflow"])
        rows += [[name, i.item, i.action, i.detail] for i in items
                 if not (i.action == "unchanged" and i.item.startswith("v"))]
    if rows:
        print(text_table(["NAME", "ITEM", "ACTION", "DETAIL"], rows))
    counts = ", ".join(f"{report.count(a)} {a}" for a in ("registered", "set", "moved", "deleted", "unchanged",
                                                           "skipped"))
    print(f"MLflow {report.tracking_uri}: {counts}")
    if report.skipped:
        print(f"{len(report.skipped)} item(s) not synced (see DETAIL); MLflow does not match the registry for them",
              file=sys.stderr)
        return 1
    return 0


def _sync(reg, names: list[str] | None, uri: str, *, timeout: int | None = None, retries: int | None = None):
    from promptdistill.registry.mlflow_sync import sync_to_mlflow

    return sync_to_mlflow(reg, names, tracking_uri=uri, http_timeout_s=timeout, http_retries=retries)


def _sync_mlflow(args: argparse.Namespace) -> int:
    uri = _tracking_uri(args.tracking_uri, "--tracking-uri")
    report = _sync(_registry(args), args.names or None, uri, timeout=args.timeout, retries=args.retries)
    return _print_sync(report)


def _mirror(args: argparse.Namespace, reg, done: str) -> int:
    """--mlflow-uri: sync the template just changed. The change itself stands if this fails."""
    if not args.mlflow_uri:
        return 0
    try:
        report = _sync(reg, [args.name], args.mlflow_uri)
    except PromptDistillError as e:
        print(f"{type(e).__name__}: {e}\n{done} in {reg.root}, but not synced to MLflow; run: "
              f"promptdistill templates sync-mlflow {args.name} --tracking-uri {args.mlflow_uri}", file=sys.stderr)
        return 1
    return _print_sync(report)

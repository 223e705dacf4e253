"""The markdown report: per spec, every side's figures, the goal, where ours falls short and why.

It reads only the report's JSON rows (a run's, or a merge of runs), so a merged report is
rendered by the same code as a fresh one.
"""

from __future__ import annotations

from typing import Any, Mapping

from bench.peers.goal import GOAL_TOKENS_SHARE, ours_beside
from promptdistill.core.display import format_number

__all__ = ["PHASE_LEVERS", "attempts_line", "export_line", "markdown", "search_line", "shortfalls", "side_label"]

PHASE_LEVERS = {
    "race": "the baseline and each finalist raced (in turn, the next only when the one before failed) are scored "
            "at each look of the certify records, so it scales with the records an undecided race reaches: a "
            "smaller pool (dev_size) when the plan says it cannot certify anyway cuts it",
    "test verification": "the baseline and the winner are each scored on every test record: scoring only the "
                         "winner (reusing the baseline's scores from an earlier night on the same template, engine "
                         "and records) would halve it; it scales with test_size",
    "ablations": "one pass over the screen records per clause the judge is unsure of (scored 2-4 or not at all): "
                 "fewer screen records cut it",
    "screening": "every grid candidate (instruction variants x example counts) on the screen records: fewer "
                 "variants or counts cut it in proportion",
    "output formats": "two more output formats on format_size records, a table only (constrained decoding is "
                      "published unless it gives less valid JSON): formats=False, as in the quick preset, removes it",
    "example sets": "several example sets per count on the screen records: fixed_subsets=1 removes the choice",
    "clause judge": "judge calls, one per unprotected clause (and repairs)",
    "rewrites": "judge calls, one per rewrite target (and repairs)",
    "calibration": "the equivalence judge on the baseline's screen replies: calibrate=False removes it",
    "held-out test": "the distiller's own test check: test_size=0 (as the nightly presets) removes it",
}
"""What would cut a phase's tokens, by the phase's last name (the report names the phases that spend the most)."""


def _paired(c: Mapping[str, Any], side: str = "template") -> str:
    """Ours - the peer's template (or program), paired over the test records, with its 95% interval."""
    p = "program_" if side == "program" else ""
    return (f"{_f(c.get(p + 'quality_diff'), '+.3f')} [{_f(c.get(p + 'quality_diff_ci_low'), '+.3f')}, "
            f"{_f(c.get(p + 'quality_diff_ci_high'), '+.3f')}]")


def export_line(kind: str, s: Mapping[str, Any]) -> str:
    """How many test records the exported template renders byte for byte as the adapter sent them."""
    differing = f" (differing, first ids: {', '.join(s['export_differing'])})" if s.get("export_differing") else ""
    return (f"{kind}: the exported template renders the messages the adapter sent on {s['export_identical']} of "
            f"{s['export_checked']} test records, byte for byte{differing}.")


def _f(value: Any, spec: str = ".3f") -> str:
    return format_number(value, spec)


def _ci(s: Mapping[str, Any], prefix: str = "test_") -> str:
    if s.get(f"{prefix}mean") is None:
        return "-"
    return f"{_f(s[f'{prefix}mean'])} [{_f(s[f'{prefix}ci_low'])}, {_f(s[f'{prefix}ci_high'])}] (n={s[f'{prefix}n']})"


def _mark(v: Any) -> str:
    return "-" if v is None else ("yes" if v else "**no**")


def attempts_line(kind: str, s: Mapping[str, Any]) -> str | None:
    """What a peer's run tried (``run_with_retries``): each attempt's adapter, seed, time and failure."""
    tried = s.get("attempts")
    if not tried:  # a report from before the retries
        return None
    parts = [f"{a['adapter']} seed {a['seed']}, {_f(a.get('seconds'), '.0f')} s: "
             + (f"{a['error_type']} ({str(a['error']).splitlines()[0][:100]})" if a.get("error_type") else "succeeded")
             for a in tried]
    outcome = f"succeeded with {s['adapter']}" if s.get("adapter") else f"failed all {len(tried)} attempt(s)"
    return f"- {kind}: {outcome}; tried " + "; ".join(f"({i}) {p}" for i, p in enumerate(parts, 1))


def side_label(side: str, s: Mapping[str, Any]) -> str:
    """A side's name in the table, with the adapter a peer ended on, or that it failed every attempt."""
    n = len(s.get("attempts") or ())
    if s.get("error"):
        tries = f" {n} attempt(s)" if n else ""
        return f"{side} (failed{tries}: {s['error'].splitlines()[0][:80]})"
    if n > 1 or (s.get("adapter") or "JSONAdapter") != "JSONAdapter":
        return f"{side} ({s['adapter']}, attempt {n})"
    return side


def search_line(kind: str, s: Mapping[str, Any]) -> str | None:
    """One line on what a peer's search did (GEPA: candidates accepted, metric calls, validation scores;
    MIPROv2: the traces its bootstrapping kept, and at what bar)."""
    if "bootstrap_traces_tried" in s:
        bar = s.get("metric_threshold")
        bar = "1.0 (DSPy's convention)" if bar is None else f"{bar} (metric_threshold)"
        failed = s.get("bootstrap_traces_failed")
        failed = f"{failed} raised before scoring, as on a reply the adapter cannot parse; " if failed else ""
        return (f"- {kind}: bootstrapping kept {s['bootstrap_traces_kept']} of {s['bootstrap_traces_tried']} traces "
                f"tried ({failed}a trace is kept at a score of at least {bar})")
    if s.get("error") or "candidates" not in s:
        return None
    line = (f"- {kind}: {s['candidates'] - 1} new candidate(s) accepted in {s['total_metric_calls']} metric calls "
            f"({s['lm_calls']} reached the engine, the rest from DSPy's cache); validation score "
            f"{_f(s['val_score_seed'])} (seed) -> {_f(s['val_score'])} (returned)")
    ttft = s.get("predicted_ttft_ms")
    if ttft:
        line += f"; predicted expected TTFT {ttft['seed']:.0f} ms (seed) -> {ttft['chosen']:.0f} ms (returned)"
    return line


def shortfalls(name: str, r: Mapping[str, Any]) -> list[str]:
    """Per spec: each missed part of the goal in numbers; for tokens, the phases that spend them and the levers."""
    missed = {k: [part for part in ("quality", "prompt_tokens", "ttft_cold", "computed_tokens")
                  if c["goal"][part] is False] for k, c in r["comparisons"].items()}
    if not any(missed.values()):
        return []
    out = [f"**{name}**:", ""]
    for kind, parts in missed.items():
        peer, c, ours = r["sides"][kind], r["comparisons"][kind], ours_beside(r, kind)
        for part in parts:
            if part == "quality":
                better = c.get("peer_better", "template")
                prefix = "program_" if better == "program" else ""
                out.append(f"- quality against {kind}'s {better}: ours {_ci(ours)}, {kind} {_ci(peer, prefix + 'test_')}; "
                           f"paired difference {_paired(c, better)}")
            elif part == "prompt_tokens":
                out.append(f"- prompt tokens against {kind}: ours {_f(ours['prompt_tokens'], '.0f')} (instruction "
                           f"{_f(ours.get('instruction_tokens'), '.0f')}), {kind} {_f(peer['prompt_tokens'], '.0f')} "
                           f"(instruction {_f(peer.get('instruction_tokens'), '.0f')}, {peer.get('examples', 0)} demos)")
            elif part == "ttft_cold":
                out.append(f"- cold TTFT against {kind}: ours {_f(ours['ttft_cold_ms'], '.0f')} ms, {kind} "
                           f"{_f(peer['ttft_cold_ms'], '.0f')} ms")
    short = [k for k, parts in missed.items() if "computed_tokens" in parts]
    if short:
        cheapest = min(short, key=lambda k: r["sides"][k]["computed_tokens"])
        allowed = GOAL_TOKENS_SHARE * r["sides"][cheapest]["computed_tokens"]
        ours = ours_beside(r, cheapest)
        cut = 1 - allowed / ours["computed_tokens"]
        out.append(f"- search tokens computed against {', '.join(short)}: ours {ours['computed_tokens']} (of "
                   f"{ours['search_tokens']} prompt + completion); a third of {cheapest}'s is {allowed:.0f}, so "
                   f"ours would have to cut {cut:.0%}. By phase (all tokens that reached the engine, the "
                   "verification included):")
        total = max(1, ours["engine_tokens_processed"])
        ranked = sorted(ours["phases"].items(), key=lambda kv: -(kv[1]["prompt_tokens"] + kv[1]["completion_tokens"]))
        for phase, ph in ranked[:4]:
            share = (ph["prompt_tokens"] + ph["completion_tokens"]) / total
            # "(judge)": an older report's name for a judge's calls within a phase
            lever = PHASE_LEVERS.get(phase.rsplit(": ", 1)[-1].replace(" (judge)", ""), "")
            out.append(f"  - {phase}: {share:.0%} ({ph['calls']} calls){': ' + lever if lever else ''}")
    return [*out, ""]


def markdown(rows: Mapping[str, Mapping[str, Any]], config: Mapping[str, Any], total_minutes: float) -> str:
    intro = (f"Budget preset `{config['budget']}` for ours (distiller, then optimizer, through the pipeline stages); "
             f"DSPy {config['dspy_version']}, JSONAdapter; seed {config['seed']}. A peer failing on an adapter parse "
             "error is retried once with the next seed, then with ChatAdapter (every attempt is listed under its "
             "spec and counted in its cost). Test quality is every side's exported "
             "template scored on the test records: ours by `promptdistill.evaluate` (what a service gets), a peer's "
             "program exported by `bench.peer_export` (its adapter's own messages, demo turns, schema, max_tokens and "
             "parsing); the DSPy program's own score is beside it. Search tokens, counted the same way for every "
             "side below its own LM cache, at the engine: the requests of the search (peers: compile, every "
             "attempt; ours: distiller and optimizer, the held-out verification apart, as the peers' test scoring "
             "is), as *computed* (the prompt tokens the engine prefilled, i.e. not served by vLLM's prefix cache, "
             "+ completion: the goal's count) and as prompt + completion. Tokens processed: prompt + completion "
             "as each side asked for them (peers: the DSPy bridge; ours: the stage results, LM-cache hits and the "
             "verification included). Prompt tokens: the "
             "rendered chat prompt (served tokenizer), mean over the test records; instruction tokens: "
             "`Spec.instruction_text()` (instruction and rules; a peer's instruction is its whole system text). "
             "TTFT: measured, mean of "
             f"{config['timing_records']} test records each. Whole run: {total_minutes:.1f} minutes.")
    lines = ["# Ours against DSPy MIPROv2 and GEPA (auto=light): same engine, records and metric", "", intro, ""]
    for name, r in rows.items():
        sp = r["split"]
        measured = f"; commit {r['commit']}, {r['timestamp']}" if r.get("commit") else ""
        measured += "".join(f"; {kind} at commit {s['commit']}, {s['timestamp']}"
                            for kind, s in r["sides"].items() if s.get("commit"))
        lines += [f"## {name} (train {sp['train']}, dev {sp['dev']}, test {sp['test']}; {r['minutes']:.1f} min{measured})", "",
                  ("| side | test quality, template [95% CI] | DSPy program score [95% CI] | LM calls | tokens processed "
                   "(prompt + completion) | search tokens: computed / prompt + completion | minutes | prompt tokens | "
                   "instruction tokens | TTFT cold ms | TTFT warm ms |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        beside = {f"ours, in {kind}'s run": ours_beside(r, kind) for kind, s in r["sides"].items() if s.get("ours_in_run")}
        for side, s in {**r["sides"], **beside}.items():
            split_tokens = (f"{s['prompt_tokens_processed']} + {s['completion_tokens_processed']}"
                            if s.get("prompt_tokens_processed") is not None else "")
            engine_note = (f"; {s['engine_tokens_processed']} reached the engine"
                           if side == "ours" and s.get("engine_tokens_processed") is not None else "")
            verification = s.get("verification_tokens") or {}
            checked = (f" (verification apart: {verification['computed_tokens']} / {verification['search_tokens']})"
                       if verification else "")
            lines.append(
                f"| {side_label(side, s)} | {_ci(s)} | {_ci(s, 'program_test_')} | {s.get('lm_calls')} | "
                f"{s.get('tokens_processed')} ({split_tokens}{engine_note}) | "
                f"{_f(s.get('computed_tokens'), 'd')} / {_f(s.get('search_tokens'), 'd')}{checked} | "
                f"{_f(s.get('minutes'), '.1f')} | "
                f"{_f(s.get('prompt_tokens'), '.0f')} | {_f(s.get('instruction_tokens'), '.0f')} | "
                f"{_f(s.get('ttft_cold_ms'), '.0f')} | {_f(s.get('ttft_warm_ms'), '.0f')} |")
        for kind, c in r["comparisons"].items():
            diff = f"{_paired(c)} (paired diff)"
            program_diff = f"{_paired(c, 'program')} (paired diff)" if c.get("program_quality_diff") is not None else ""
            lines.append(
                f"| ours/{kind} | {diff} | {program_diff} | {_f(c['lm_calls_ours_over_peer'], '.2f')}x | "
                f"{_f(c['tokens_processed_ours_over_peer'], '.2f')}x | "
                f"{_f(c.get('computed_tokens_ours_over_peer'), '.2f')}x / {_f(c.get('search_tokens_ours_over_peer'), '.2f')}x | "
                f"{_f(c['minutes_ours_over_peer'], '.2f')}x | "
                f"{_f(c['prompt_tokens_ours_over_peer'], '.2f')}x | {_f(c['instruction_tokens_ours_over_peer'], '.2f')}x | "
                f"{_f(c['ttft_cold_ms_ours_over_peer'], '.2f')}x | {_f(c['ttft_warm_ms_ours_over_peer'], '.2f')}x |")
        ours = r["sides"]["ours"]
        kept = " (baseline kept)" if ours["kept_baseline"] else ""
        lines += ["", f"Ours: **{ours['winner']}**{kept}: {ours['reason']}", ""]
        lines += [line for kind in r["comparisons"] if (line := search_line(kind, r["sides"][kind]))]
        lines += [line for kind in r["comparisons"] if (line := attempts_line(kind, r["sides"][kind]))]
        lines += [export_line(kind, r["sides"][kind]) for kind in r["comparisons"] if r["sides"][kind].get("export_checked")]
        lines.append("")
    lines += ["## The goal, per spec and peer", "",
              ("Quality at least the peer's exported template's and its DSPy program's (each, or inside its "
               "95% interval), fewer prompt tokens, lower cold TTFT, at "
               f"most {GOAL_TOKENS_SHARE:.2f} of the peer's search tokens computed."), "",
              ("| spec | peer | quality (ours - peer, paired) | prompt tokens (ours/peer) | cold TTFT (ours/peer) | "
               "search tokens computed (ours/peer) | all |"), "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        for kind, c in r["comparisons"].items():
            g = c["goal"]
            better = c.get("peer_better", "template")
            lines.append(f"| {name} | {kind} | {_mark(g['quality'])} ({_paired(c, better)} against its {better}) | "
                         f"{_mark(g['prompt_tokens'])} ({_f(c['prompt_tokens_ours_over_peer'], '.2f')}x) | "
                         f"{_mark(g['ttft_cold'])} ({_f(c['ttft_cold_ms_ours_over_peer'], '.2f')}x) | "
                         f"{_mark(g.get('computed_tokens'))} ({_f(c.get('computed_tokens_ours_over_peer'), '.2f')}x) | "
                         f"{'peer failed' if r['sides'][kind].get('error') else _mark(g['met'])} |")
    lines += ["", "## Where we fall short, and why", ""]
    lines += [line for name, r in rows.items() for line in shortfalls(name, r)] or ["Nowhere.", ""]
    lines += ["", "## Where our tokens go (requests that reached the engine, by phase)", "",
              "| spec | phase | LM calls | prompt tokens | of them prefix-cached | completion tokens | share of tokens |",
              "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ours = r["sides"]["ours"]
        total = max(1, ours["engine_tokens_processed"])
        for phase, p in sorted(ours["phases"].items(), key=lambda kv: -(kv[1]["prompt_tokens"] + kv[1]["completion_tokens"])):
            t = p["prompt_tokens"] + p["completion_tokens"]
            lines.append(f"| {name} | {phase} | {p['calls']} | {p['prompt_tokens']} | {_f(p.get('cached_tokens'), 'd')} | "
                         f"{p['completion_tokens']} | {100 * t / total:.0f}% |")
        lines.append(f"| {name} | stage results (asked, cache hits included) | {ours['lm_calls']} | | | | "
                     f"{ours['tokens_processed']} tokens: distill {ours['stage_tokens']['distill']}, optimize "
                     f"{ours['stage_tokens']['optimize']} |")
    lines += ["", "## The peers' instructions, as they wrote them", ""]
    for name, r in rows.items():
        for kind in r["comparisons"]:
            s = r["sides"][kind]
            extra = f", {s['examples']} demos" if s.get("examples") else ""
            if s.get("error"):
                tries = f"{len(s['attempts'])} attempt(s), " if s.get("attempts") else ""
                lines += [f"**{name} / {kind}**: failed after {tries}{s.get('lm_calls')} LM calls:", "", "```text",
                          str(s["error"]).strip(), "```", ""]
                continue
            lines += [f"**{name} / {kind}** ({s.get('instruction_tokens')} tokens{extra}):", "", "```text",
                      str(s.get("instruction")).strip(), "```", ""]
    lines += [f"GEPA with predicted TTFT as a second objective: {config['gepa_objectives']}.", ""]
    return "\n".join(lines)

"""The TTFT report's markdown, from the numbers ``report.report_numbers`` computed."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from bench.ttft_study.analysis import CLAIMED_DENSITY_BETA, DENSITY_HINGE

__all__ = ["engine_markdown", "overview_markdown"]


def _pct(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.{digits}%}"


def _ci(pair: Any) -> str:
    return f"[{_pct(pair[0])}, {_pct(pair[1])}]"


def _cell(column: str, value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return ""
        if "mape" in column or "share" in column:
            return f"{value:.1%}"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_cell(c, v) for c, v in zip(cols, row)) + " |")
    return "\n".join(lines)


def _verdict(t: dict[str, Any]) -> str:
    return f"**{'met' if t['met'] else 'not met'}** ({t['how']}; {t['ratio_to_floor']:.2f}x the floor)"


def _result(n: dict[str, Any]) -> str:
    fit, noise, t = n["fit"], n["noise"], n["target"]
    h = fit["heldout"][fit["chosen"]]
    spec = (f" On held-out rows of the bundled specs as rendered over their datasets, MAPE is {_pct(n['heldout_mape_spec_rows'])}."
            if n["heldout_mape_spec_rows"] is not None else "")
    return f"""Chosen model: **{fit['chosen']}**, on {fit['n_test_prompts']} held-out prompts ({h['n']} measurements, {h.get('n_medians', 'n/a')} repeated units).

| held-out MAPE | model | noise floor (95% CI) | model / floor | target |
|---|---|---|---|---|
| against medians of repeats | **{_pct(h.get('mape_median'))}** | {_pct(noise['floor_vs_medians'])} {_ci(noise['floor_vs_medians_ci'])} | {t['vs_medians']['ratio_to_floor']:.2f} | {_verdict(t['vs_medians'])} |
| against single measurements | {_pct(h['mape'])} | {_pct(noise['floor_vs_singles_pooled'])} {_ci(noise['floor_vs_singles_pooled_ci'])} | {t['vs_singles']['ratio_to_floor']:.2f} | {_verdict(t['vs_singles'])} |

The goal is 5% against medians; where the noise floor alone is above 5% / 1.2, the target is 1.2x the floor. The floors are a perfect model's expected MAPE on new measurements (see the noise floor below); the cross-validated figures over the training prompts ({fit['n_train_prompts']} prompts, grouped 5-fold) are {_pct(fit['cv'][fit['chosen']].get('mape_median'))} against medians and {_pct(fit['cv'][fit['chosen']]['mape'])} against single measurements.
R² {h['r2']:.3f}; absolute error p50 {h['p50_abs_err_ms']:.0f} ms, p95 {h['p95_abs_err_ms']:.0f} ms.{spec}
{'The shipped model is refitted on all rows; the held-out figures are for the same specification fitted on the training prompts only.' if fit['refit_on_all'] else ''}"""


def _noise(n: dict[str, Any], figures: dict[str, str]) -> str:
    x = n["noise"]
    if not x["units"]:
        return "_No prompt was measured more than once: no noise floor._"
    img = f"\n![noise]({figures['noise']})" if "noise" in figures else ""
    return f"""{x['units']} units (prompt x cold/warm x queue place) measured {x['repeats_median']:.0f} times (median), {x['rows']} measurements, repeats spread over the whole run. Intervals: 95% bootstrap over units ({x['n_boot']} resamples).

| figure | value | 95% CI |
|---|---|---|
| per-unit CV (std / mean), median over units | {_pct(x['cv_median'])} | {_ci(x['cv_median_ci'])} |
| per-unit CV, mean over units | {_pct(x['cv_mean'])} | {_ci(x['cv_mean_ci'])} |
| per-unit MAD / median, median over units | {_pct(x['rel_mad_median'])} | {_ci(x['rel_mad_median_ci'])} |
| perfect model vs single measurements, predicting each unit's own median (in-sample: optimistic) | {_pct(x['floor_vs_singles'])} | {_ci(x['floor_vs_singles_ci'])} |
| the same, leave-one-out: each repeat predicted by the median of the others (pessimistic) | {_pct(x['floor_vs_singles_loo'])} | {_ci(x['floor_vs_singles_loo_ci'])} |
| perfect model vs new single measurements (pooled deviations) | {_pct(x['floor_vs_singles_pooled'])} | {_ci(x['floor_vs_singles_pooled_ci'])} |
| perfect model vs medians of repeats: the error of a unit's median itself (pooled deviations, simulated for each unit's repeats) | {_pct(x['floor_vs_medians'])} | {_ci(x['floor_vs_medians_ci'])} |

The noise is multiplicative and comes in spells (the right-hand figure: runs of same-sign deviations while the machine runs slower or faster), so the deviations of all units are pooled to estimate how far a median of two or three repeats lands from the truth.
{img}"""


def _mechanics(n: dict[str, Any]) -> str:
    m, q = n["mechanics"], n["queue"]
    block = m.get("block_tokens")
    chunk = m.get("chunk_tokens")
    one_step = chunk is not None and m.get("max_model_len") and chunk >= m["max_model_len"]
    lines = [
        (f"- Prefix-cache block: **{block or 'unknown'}** tokens. The model rounds cached tokens down to whole blocks "
        f"(never the last prompt token), so a static prefix shorter than a block predicts no cache benefit."),
        f"- Chunked prefill: at most **{chunk or 'unlimited'}** prompt tokens per engine step"
        + (f"; with max_model_len {m['max_model_len']} a request alone always prefills in one step, so the chunk size "
           "matters only when requests arrive together." if one_step else "."),
    ]
    if q.get("n"):
        table = pd.DataFrame(q["table"]).rename(columns={"ttft_ms": "ttft_ms_median"})
        lines += ["", (f"Requests sent together (queue probe, cold, first come first served; {q['n']} places, each "
                  "predicted by the model fitted without its batch):"), "", _md_table(table), "",
                  (f"MAPE against the medians: **{_pct(q['mape_queue'])}** with the queue features, "
                  f"{_pct(q['mape_alone'])} if each request is predicted as if it came alone.")]
    elif str(n["engine"].get("engine_backend", "")).endswith("local"):
        lines.append("- Queueing: not measured in these profiles (no queue probe).")
    else:
        lines.append("- Queueing: not measured through the server: over HTTP the client cannot observe in which order, "
                     "or in which engine step, concurrent requests reach the scheduler, so the queue features would be "
                     "guesses. The in-process profile measures it; `bench_batching` measures concurrent server requests.")
    return "\n".join(lines)


def _num(v: Any) -> str:
    # A probe a profile did not run (an older or a server profile) reads as 'not measured'.
    return "not measured" if v is None or v != v else f"{v:.0f}"


def _hardware(n: dict[str, Any], figures: dict[str, str]) -> str:
    hw = n["hardware"]
    if hw["matmul_gflops"] is None or hw["model"] is None:
        return "_These profiles predate the matmul probe: no hardware figures._"
    model = hw["model"]
    table = pd.DataFrame(hw["throughput"])
    shown = pd.DataFrame()
    if len(table):
        shown = pd.DataFrame({
            "tokens": table["tokens"], "n": table["n"], "prompts": table["prompts"],
            "ttft_ms_median": table["ttft_ms"],
            "tokens_per_s": [f"{v:,.0f} [{lo:,.0f}, {hi:,.0f}]" for v, lo, hi in table[["tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi"]].to_numpy()],
            "GFLOP/s": [f"{v:.1f} [{lo:.1f}, {hi:.1f}]" for v, lo, hi in table[["gflops", "gflops_lo", "gflops_hi"]].to_numpy()],
            "share_of_peak": [f"{v:.0%} [{lo:.0%}, {hi:.0%}]" for v, lo, hi in table[["share_of_peak", "share_of_peak_lo", "share_of_peak_hi"]].to_numpy()],
        })
    img = f"\n![prefill against the matmul peak]({figures['throughput']})" if "throughput" in figures else ""
    return f"""Dense float32 matmul peak, measured in the profiling process with torch (the best of square products of 512-2048 tokens, every core, over torch's BLAS and oneDNN; best: `{hw.get('matmul_kernel') or 'matmul'}`): **{hw['matmul_gflops']:.0f} GFLOP/s** on {_num(hw.get('matmul_threads'))} threads (probe at the start {_num(hw.get('matmul_gflops_start'))}, at the end {_num(hw.get('matmul_gflops_end'))}; one torch thread {_num(hw.get('matmul_gflops_1t'))}).
Model arithmetic: {model['total_params'] / 1e6:.1f} M parameters, {model['matmul_params'] / 1e6:.1f} M of them in the linear layers every token passes through, so {hw['gflop_per_token_linear']:.3f} GFLOP per prompt token (2 x those parameters), plus causal attention (2 x layers x width x n²) and the last token's logits.

Cold prefill of requests sent alone (medians with 95% bootstrap intervals over measurements; TTFT includes the engine's per-request overhead):

{_md_table(shown) if len(shown) else '_No cold measurements near these sizes._'}
{img}"""


def _density(dens: dict[str, Any]) -> str:
    verdict = (
        "**No measurable effect.** The 95% interval of the density coefficient includes zero."
        if not dens["ci_excludes_zero"]
        else f"**A measurable effect**: {dens['effect_over_range_ms']:+.1f} ms across the measured density range "
        f"({dens['effect_share_of_median_ttft']:+.1%} of the median TTFT)."
    )
    p = "< " + format(1 / dens["n_boot"], ".2g") if dens["p_boot"] == 0 else "= " + format(dens["p_boot"], ".2f")
    return f"""{verdict}

- Density coefficient: {dens['coef_ms_per_unit']:+.1f} ms per unit density, 95% CI [{dens['ci_low']:+.1f}, {dens['ci_high']:+.1f}], bootstrap p {p} ({dens['n_rows']} measurements, {dens['n_prompts']} prompts).
- Across the measured range (density {dens['density_p5']:.2f} to {dens['density_p95']:.2f}): {dens['effect_over_range_ms']:+.1f} ms, CI [{dens['effect_over_range_ms_ci'][0]:+.1f}, {dens['effect_over_range_ms_ci'][1]:+.1f}] ms, that is {dens['effect_share_of_median_ttft']:+.1%} of the median TTFT ({dens['median_ttft_ms']:.0f} ms).
- Standardised beta: {dens['std_beta']:+.3f}, against the claimed +{CLAIMED_DENSITY_BETA}.
- "Steep above {DENSITY_HINGE}": the extra slope above {DENSITY_HINGE} is {dens['hinge_coef_ms_per_unit']:+.1f} ms per unit, CI [{dens['hinge_ci'][0]:+.1f}, {dens['hinge_ci'][1]:+.1f}] ({dens['rows_above_hinge']} measurements above {DENSITY_HINGE}).

Density is measured by `promptdistill.ttft.features.semantic_density` on the instruction text. The coefficient is read from the linear model, which holds the token terms, cached tokens, few-shot count and entropy fixed while density varies; the figure plots what the token terms alone leave unexplained against density."""


def engine_markdown(n: dict[str, Any]) -> str:
    """One engine's report."""
    e, r, fit, figures = n["engine"], n["rows"], n["fit"], n["figures"]
    comparison = pd.DataFrame([
        {"model": name, "cv_mape": fit["cv"][name]["mape"], "cv_mape_median": fit["cv"][name].get("mape_median", np.nan),
         "heldout_mape": s["mape"], "heldout_mape_median": s.get("mape_median", np.nan), "heldout_r2": s["r2"],
         "p50_abs_err_ms": s["p50_abs_err_ms"], "p95_abs_err_ms": s["p95_abs_err_ms"],
         "monotonic": fit["monotonic"][name], "cached_never_slower": fit.get("cache_consistent", {}).get(name),
         "chosen": "yes" if name == fit["chosen"] else ""}
        for name, s in fit["heldout"].items()
    ])
    coefs = pd.DataFrame(n["coefficients"])
    n_boot = n["density"]["n_boot"]
    if len(coefs):
        coefs["p_boot"] = [f"<{1 / n_boot:.2g}" if p == 0 else f"{p:.2f}" for p in coefs["p_boot"]]
    fewshot = pd.DataFrame(n["fewshot"])
    return f"""# TTFT profile and models: `{e.get('engine_backend')}`

Engine: `{e.get('engine_model')}` on `{e.get('engine_backend')}` ({e.get('engine_dtype')}, max_model_len {e.get('engine_max_model_len')}, {e.get('engine_engine_version')}), hardware `{e.get('engine_hardware')}`, engine key `{e.get('engine_key')}`.
Model version: `{n['model_version'] or 'not saved'}`. Runs: {', '.join(f'`{x}`' for x in n['runs']) or 'n/a'}.

Rows: {r['rows_total']} measurements, {r['rows_failed']} failed, {r['rows_contended'] if n['drop_contended'] else 'no rows'} left out as measured under CPU contention{'' if n['drop_contended'] else ' (contended rows kept on request)'}, {r['rows_used']} used ({r['prompts_used']} distinct prompts).{_conditions(n['conditions'])}

## Result

{_result(n)}

## Noise floor

{_noise(n, figures)}

## Engine mechanics

{_mechanics(n)}

## Hardware limit

{_hardware(n, figures)}

## Model comparison (grouped by prompt)

{_md_table(comparison)}

Selection: the lowest cross-validated MAPE against medians among models that never predict a longer prompt faster.

![predicted vs measured]({figures['pred_vs_measured']})
![TTFT against uncached tokens]({figures['ttft_vs_uncached']})
![residuals]({figures['residuals']})

## Linear model coefficients (ms per unit; 95% grouped-bootstrap intervals, {n_boot} resamples)

{_md_table(coefs)}

`std_beta` is the coefficient in standard deviations of TTFT per standard deviation of the term; a term that never varies in these measurements (e.g. `prefill_steps` without a queue probe) gets 0.

## Does semantic density change TTFT once tokens are controlled?

{_density(n['density'])}

![density partial residuals]({figures['density_partial']})

## Few-shot count (cold, ~512-token base, examples of ~64 tokens)

{_md_table(fewshot) if len(fewshot) else '_No few-shot probe in these profiles._'}

`claimed_ms` is the shared claim's figure for 1, 4 and 8 examples; `increment_over_0_ms` is this engine's added TTFT over the same base without examples.
"""


def _conditions(c: dict) -> str:
    if any(v is None or pd.isna(v) for v in c.values()):  # missing or NaN: nothing to say
        return ""
    return (
        f" Other processes used a median {c['foreign_cpu_share_median_all']:.0%} of the CPU during all measurements "
        f"and {c['foreign_cpu_share_median_used']:.0%} during the ones used (1-minute load average "
        f"{c['loadavg_1m_median_used']:.1f} on {os.cpu_count()} cores)."
    )


def _share_at(hw: dict[str, Any], size: int) -> str:
    for row in hw["throughput"]:
        if row["tokens"] == size and not pd.isna(row["share_of_peak"]):
            return f"{row['share_of_peak']:.0%}"
    return "n/a"


def overview_markdown(engines: dict[str, dict[str, Any]], *, note: str = "") -> str:
    """The summary over engines, linking each engine's report."""
    lines = ["# TTFT profile and models", ""]
    if note:
        lines += [note, ""]
    lines += [
        ("| backend | chosen | held-out MAPE vs medians | floor vs medians | vs singles | floor vs singles | target (5%, else 1.2x floor) "
        "| per-unit CV | matmul peak GFLOP/s | prefill share of peak at 128 / 512 / 2048 tokens | prompts held out | details |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for slug, n in engines.items():
        h, x, hw = n["fit"]["heldout"][n["fit"]["chosen"]], n["noise"], n["hardware"]
        t = n["target"]["vs_medians"]
        peak = f"{hw['matmul_gflops']:.0f}" if hw["matmul_gflops"] else "n/a"
        shares = " / ".join(_share_at(hw, s) for s in (128, 512, 2048))
        lines.append(
            f"| `{n['engine'].get('engine_backend')}` | {n['fit']['chosen']} | **{_pct(h.get('mape_median'))}** | "
            f"{_pct(x['floor_vs_medians'])} {_ci(x['floor_vs_medians_ci'])} | {_pct(h['mape'])} | "
            f"{_pct(x['floor_vs_singles_pooled'])} {_ci(x['floor_vs_singles_pooled_ci'])} | {'met' if t['met'] else 'not met'} "
            f"({t['ratio_to_floor']:.2f}x floor) | {_pct(x['cv_median'])} | {peak} | {shares} | "
            f"{n['fit']['n_test_prompts']} ({h['n']} rows) | [{slug}/report.md]({slug}/report.md) |")
    lines += ["", ("Floors: the MAPE a perfect model would have (see each report's noise-floor section); intervals are 95% "
              "bootstrap intervals over prompts. Prefill share of peak: cold requests sent alone, FLOPs from the model's "
              "parameter count and attention, over the matmul peak measured in the same process."), ""]
    for slug, n in engines.items():
        figures = n["figures"]
        lines += [f"## `{n['engine'].get('engine_backend')}`", "", (f"Engine key `{n['engine'].get('engine_key')}`; "
                  f"full report: [{slug}/report.md]({slug}/report.md)."), "",
                  f"![predicted vs measured]({slug}/{figures['pred_vs_measured']})"]
        if "throughput" in figures:
            lines.append(f"![prefill against the matmul peak]({slug}/{figures['throughput']})")
        lines.append("")
    return "\n".join(lines)

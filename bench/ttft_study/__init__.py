"""The TTFT study: what the profiles say beyond the model the nightly needs.

The product (``promptdistill.ttft``) profiles the engine and fits, selects and publishes
the TTFT model with its held-out error, noise floor and fit figure; the nightly needs no
more. This study reads the same profiles and asks the research questions: the noise
floor in full, the engine mechanics and the queue, prefill throughput against the
machine's matmul peak, the linear model's coefficients with bootstrap intervals, whether
semantic density moves TTFT once tokens are controlled, and the few-shot table.

* :mod:`bench.ttft_study.analysis`: the numbers (coefficients, density, few-shot, throughput, queue);
* :mod:`bench.ttft_study.figures`: the PNGs;
* :mod:`bench.ttft_study.report` (with :mod:`bench.ttft_study.report_text`): ``report.md``
  and ``report.json``, for one engine or an overview over several.

Regenerate ``docs/ttft/`` with ``python -m bench.ttft_study`` (from the repository root);
``promptdistill ttft report`` runs the same study from a source checkout. Nothing under
``promptdistill/`` imports this package except that command, lazily
(``tests/test_ttft_study.py`` checks that the nightly never loads it).
"""

from bench.ttft_study.report import build_overview, build_report, target_verdict, write_study

__all__ = ["build_overview", "build_report", "target_verdict", "write_study"]

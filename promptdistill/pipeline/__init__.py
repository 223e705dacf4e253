"""The nightly pipeline's rules, without Prefect: every function the flows call.

* :mod:`~promptdistill.pipeline.budgets`: named budget presets (smoke, quick, full);
* :mod:`~promptdistill.pipeline.jobs`: which specs a run covers, their cache keys;
* :mod:`~promptdistill.pipeline.ttft_models`: the TTFT model's life in the registry;
* :mod:`~promptdistill.pipeline.stages`: the distill and optimize stages, JSON in and out;
* :mod:`~promptdistill.pipeline.publish`: the promotion rule and idempotent publishing;
* :mod:`~promptdistill.pipeline.session`: the engine a run shares between its tasks;
* :mod:`~promptdistill.pipeline.report`: summary rows, tables and markdown.
"""

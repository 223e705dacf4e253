"""TTFT: profile the engine, fit models that predict time to first token.

* :mod:`~promptdistill.ttft.features`: token features of a prompt (served tokenizer);
* :mod:`~promptdistill.ttft.design`: which prompts to measure, built from specs and data;
* :mod:`~promptdistill.ttft.profile` (with :mod:`~promptdistill.ttft.measure` and
  :mod:`~promptdistill.ttft.engine_info`): measuring them on the real engine, in-process
  or through a server, to Parquet, with the engine's cache block and chunk sizes;
* :mod:`~promptdistill.ttft.hardware`: the machine's matmul peak and the model's shape;
* :mod:`~promptdistill.ttft.noise`: the noise floor of repeated measurements;
* :mod:`~promptdistill.ttft.estimators` and :mod:`~promptdistill.ttft.fit`: the engine
  mechanics, the regressors, and model selection by grouped cross-validation;
* :mod:`~promptdistill.ttft.model`: ``TTFTModel``, the engine-stamped predictor (stored in
  the registry by :mod:`promptdistill.pipeline.ttft_models`, with the fit figure of
  :mod:`~promptdistill.ttft.figures`).

The research study over the same profiles (coefficients with bootstrap intervals, the
density question, the few-shot table, throughput against the hardware, the queue, its
figures and report) is ``bench/ttft_study``: no module here imports it.

Example:
    >>> model = load_ttft_model(Registry("artifacts/registry"), engine.identity)  # doctest: +SKIP
    >>> model.predict(features, engine_identity=engine.identity)                # doctest: +SKIP
"""

from promptdistill.ttft.estimators import MODEL_FEATURES, MonomialRegressor
from promptdistill.ttft.fit import check_frame, fit_models
from promptdistill.ttft.model import TTFTModel
from promptdistill.ttft.profile import ProfileConfig, run_profile

__all__ = ["MODEL_FEATURES", "MonomialRegressor", "ProfileConfig", "TTFTModel", "check_frame", "fit_models", "run_profile"]

"""Prompt specs: how a production prompt template is described, loaded, checked and rendered.

Modules (a spec's layout, with an example, is in ``model``'s docstring):

* :mod:`~promptdistill.specs.model`: the frozen ``Spec`` and its parts;
* :mod:`~promptdistill.specs.checks`: safe YAML, the shipped JSON Schema, what a schema
  cannot say, prefix-cache layout warnings;
* :mod:`~promptdistill.specs.load`: reading, saving and validating spec files with their data;
* :mod:`~promptdistill.specs.datasets`: the JSONL records and their splits;
* :mod:`~promptdistill.specs.render`: the one rendering function (the client uses it too);
* :mod:`~promptdistill.specs.prompt`: examples, system text, messages, template content;
* :mod:`~promptdistill.specs.metrics`: scoring a reply against the expected output;
* :mod:`~promptdistill.specs.text`: semantic density and clause count of an instruction.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ExamplesConfig",
    "MetricSpec",
    "Spec",
    "build_system",
    "examples_for",
    "load_spec",
    "load_specs",
    "select_examples",
    "spec_messages",
    "template_content",
    "validate_spec_file",
]

_HOME = {
    "ExamplesConfig": "model", "MetricSpec": "model", "Spec": "model",
    "build_system": "prompt", "examples_for": "prompt", "select_examples": "prompt",
    "spec_messages": "prompt", "template_content": "prompt",
    "load_spec": "load", "load_specs": "load", "validate_spec_file": "load",
}


def __getattr__(name: str) -> Any:
    # Lazy: the registry client imports promptdistill.specs.render, which runs this file
    # first; eager re-exports would pull scikit-learn and pandas into every service.
    if name in _HOME:
        return getattr(importlib.import_module(f"promptdistill.specs.{_HOME[name]}"), name)
    raise AttributeError(f"module 'promptdistill.specs' has no attribute {name!r}")

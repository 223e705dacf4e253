"""The records every side gets: one split, drawn as the optimizer draws it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["bench_split", "fresh", "subset_job"]


def bench_split(spec: Any, n_train: int, n_dev: int, n_test: int, seed: int) -> dict[str, list[dict]]:
    """The records every side gets, drawn by the optimizer's own split (dev and test shuffled by ``seed``)."""
    from promptdistill.search.splits import split_records

    s = split_records(spec, seed=seed, screen_size=1, dev_size=n_dev, test_size=n_test)
    return {"train": list(s.train[:n_train]), "dev": list(s.dev), "test": list(s.test)}


def subset_job(spec: Any, split: Mapping[str, Sequence[dict]], folder: Path) -> Any:
    """A copy of the spec file whose dataset holds exactly the split's records (what ours may see)."""
    from promptdistill.pipeline.jobs import prepare_job
    from promptdistill.specs.datasets import write_records

    (folder / "prompts").mkdir(parents=True, exist_ok=True)
    write_records(folder / "datasets" / spec.dataset.name, [*split["train"], *split["dev"], *split["test"]])
    path = folder / "prompts" / f"{spec.name}.yaml"
    shutil.copyfile(spec.source_path, path)
    return prepare_job(path)


def fresh(path: Path) -> Path:
    """``path`` with any previous file or folder (and SQLite side files) removed: a run starts cold."""
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    return path

"""Where the study notebooks' stores live (``cache_dir()/datastores/study``), and a REST index there opened or
built once: the leaf the study's store modules (:mod:`~specnb.experiments.stores`,
:mod:`~specnb.experiments.dresd`, the sweeps) share."""

from __future__ import annotations

from pathlib import Path

from ..datastores.corpus import TokenCorpus
from ..datastores.rest import RestIndex
from ..models import cache_dir


def study_folder() -> Path:
    """``cache_dir()/datastores/study`` (created on demand): the study notebooks' stores."""
    folder = cache_dir() / "datastores" / "study"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rest_store(corpus: TokenCorpus, path: Path, progress: bool = False) -> RestIndex:
    """The REST index of ``corpus`` at ``path``: opened when it exists, else built there (atomically)."""
    return RestIndex.load(path) if path.exists() else RestIndex.build(corpus, path, progress=progress)

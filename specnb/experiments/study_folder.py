"""Where the study notebooks' stores live (``<cache>/datastores/study``), and a REST index there opened or
built once: the leaf the study's store modules (:mod:`~specnb.experiments.stores`,
:mod:`~specnb.experiments.dresd`, the sweeps) share."""

from __future__ import annotations

from pathlib import Path

from ..datastores.corpus import TokenCorpus
from ..datastores.rest import RestIndex
from ..paths import artifact_path


def study_folder() -> Path:
    """``<cache>/datastores/study`` (created on demand): the study notebooks' stores."""
    folder = artifact_path("datastores", "study")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rest_store(corpus: TokenCorpus, path: Path, progress: bool = False) -> RestIndex:
    """The REST index of ``corpus`` at ``path``: opened when it exists, else built there (atomically)."""
    return RestIndex.load(path) if path.exists() else RestIndex.build(corpus, path, progress=progress)

"""The retrieval datastores of the study notebooks (03's corpus sweep, 08, 09), built once into the cache under
``<cache>/datastores/study`` and reused.

REST, CREST and DReSD are built on *the same corpus*: the documents of the profile's dense OOD code store
(:func:`specnb.experiments.dresd.datastores`), so their differences are the methods', not the corpora's.
DReSD also gets its in-distribution (ID) store.
"""

from __future__ import annotations

from pathlib import Path

from ..datastores.crest import build_crest
from ..model.models import LoadedModel
from ..study.profiles import Profile
from .dresd import datastores, store_corpus
from .study_folder import rest_store, study_folder


def study_stores(target: LoadedModel, profile: Profile, progress: bool = False) -> dict[str, Path]:
    """{"rest", "crest", "dense", "dense-id"}: paths of the stores for ``target`` at ``profile``'s size (CREST's top t
    n-grams per n: the profile's ``study_stores.crest_t``), built on ``profile.corpus`` (``code``: the stdlib, or a
    folder / JSONL of the user's: :func:`specnb.experiments.dresd.datastores`)."""
    dense = datastores(target, profile, kinds=("code-OOD", "code-ID"), progress=progress)
    ood = dense["code-OOD"]
    index = rest_store(store_corpus(ood), study_folder() / f"rest-{ood.path.name}", progress)
    t = profile.study_stores.crest_t
    crest_path = study_folder() / f"crest-t{t}-{ood.path.name}.sqlite"
    if not crest_path.exists():
        build_crest(index, crest_path, t=t, progress=progress).close()
    return {"rest": index.path, "crest": crest_path, "dense": ood.path, "dense-id": dense["code-ID"].path}

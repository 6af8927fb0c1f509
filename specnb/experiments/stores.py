"""The retrieval datastores of the study notebooks (03's corpus sweep, 08, 09), built once into the cache under
``<cache>/datastores/study`` and reused.

REST, CREST and DReSD are built on *the same corpus*: the documents of one of the profile's dense code stores
(:func:`specnb.experiments.dresd.datastores`; ``study_stores.rest_store``: the OOD one under ``quick``, the
in-distribution one under ``paper``, as in DReSD's Table 3), so their differences are the methods', not the
corpora's. DReSD gets both its OOD and its ID store.
"""

from __future__ import annotations

from pathlib import Path

from ..datastores.crest import build_crest
from ..model.models import LoadedModel
from ..study.profiles import Profile
from .dresd import datastores, rest_twin
from .study_folder import study_folder


def study_stores(target: LoadedModel, profile: Profile, progress: bool = False) -> dict[str, Path]:
    """{"rest", "crest", "dense", "dense-id"}: paths of the stores for ``target`` at ``profile``'s size: REST and
    CREST (its top t n-grams per n: ``study_stores.crest_t``) on the documents of the dense store
    ``study_stores.rest_store`` ("code-OOD" or "code-ID"), DReSD's OOD and ID stores, built on ``profile.corpus``
    (``code``: the stdlib, or a folder / JSONL of the user's: :func:`specnb.experiments.dresd.datastores`); each
    built once into the cache, atomically."""
    dense = datastores(target, profile, kinds=("code-OOD", "code-ID"), progress=progress)
    docs = dense[profile.study_stores.rest_store]
    index = rest_twin(docs, progress)
    t = profile.study_stores.crest_t
    crest_path = study_folder() / f"crest-t{t}-{docs.path.name}.sqlite"
    if not crest_path.exists():
        build_crest(index, crest_path, t=t, progress=progress).close()
    return {"rest": index.path, "crest": crest_path, "dense": dense["code-OOD"].path, "dense-id": dense["code-ID"].path}

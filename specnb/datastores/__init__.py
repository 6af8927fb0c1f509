"""Datastore safety shared by every store kind: atomic builds (:mod:`.atomic`) and per-file checksums
(:mod:`.manifest`). The store formats and builders are in :mod:`specnb.corpus`, :mod:`specnb.drafters.rest`,
:mod:`specnb.drafters.crest` and :mod:`specnb.drafters.dense`."""


class CorpusError(ValueError):
    """A corpus or datastore that cannot be used (missing, corrupt, built with another tokenizer)."""

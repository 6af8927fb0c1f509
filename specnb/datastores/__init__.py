"""Datastores: every store the drafters read, with its format, its builder and its ``specnb`` command, and the
safety they share.

* :mod:`.corpus`: token corpora (the input of every retrieval store) and tokenizer fingerprints;
* :mod:`.rest`: REST's suffix-array store and its search; :mod:`.crest`: CREST's n-gram -> tree store;
  :mod:`.retrieval_tree`: the token tree both build from retrieved continuations;
* :mod:`.dense`: DReSD's hidden-state store (keys, projection, ANN index, values);
* :mod:`.cluster`: what the Ray builds share; :mod:`.shards`, :mod:`.ivfpq_shards`: a dense store's extraction
  and IVF-PQ fill on Ray (REST's and CREST's Ray builds are in :mod:`.rest` and :mod:`.crest_build`);
* :mod:`.ngram_tables`: the unigram ranking and bigram table derived from a model's weights (N-Grammys);
* :mod:`.manifest`: per-file checksums (``specnb datastore verify``, :mod:`specnb.cli.datastore`); every store
  is written through :mod:`specnb.atomic`.

The drafters that query these stores are in :mod:`specnb.drafters`; REST's search is checked against
``draftretriever`` from PyPI in :mod:`specnb.experiments.draftretriever_ref`.
"""


class CorpusError(ValueError):
    """A corpus or datastore that cannot be used (missing, corrupt, built with another tokenizer)."""

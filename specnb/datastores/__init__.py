"""Datastores: every store the drafters read, with its format, its builder and its ``specnb`` command, and the
safety they share.

* :mod:`.corpus`: token corpora (the input of every retrieval store) and tokenizer fingerprints;
* :mod:`.rest`: REST's suffix-array store and its search; :mod:`.crest`: CREST's n-gram -> tree store;
  :mod:`.retrieval_tree`: the token tree both build from retrieved continuations;
* :mod:`.dense`: DReSD's hidden-state store (keys, projection, ANN index, values);
* :mod:`.ngram_tables`: the unigram ranking and bigram table derived from a model's weights (N-Grammys);
* :mod:`.draftretriever_ref`: REST's search checked against ``draftretriever`` from PyPI;
* :mod:`.manifest`: per-file checksums; :mod:`.verify`: ``specnb datastore verify``; every store is written
  through :mod:`specnb.atomic`.

The drafters that query these stores are in :mod:`specnb.drafters`.
"""


class CorpusError(ValueError):
    """A corpus or datastore that cannot be used (missing, corrupt, built with another tokenizer)."""

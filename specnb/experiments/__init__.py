"""Experiments: the runner's method kinds and its summary (re-exported from :mod:`specnb.eval.runner`; every run goes
through :func:`specnb.eval.bench.run_bench`), and what only the notebooks' studies need: the
cached greedy references (:mod:`.references`), replay grids (:mod:`.grids`), the DReSD stores (:mod:`.dresd`)
and their studies (:mod:`.hidden_states`, :mod:`.pca_variance`, :mod:`.ann_index`),
the corpus-size sweep (:mod:`.corpus_sweep`), CREST's compaction (:mod:`.compaction`), the n-gram drafts
(:mod:`.ngrams`), MCSD (:mod:`.mcsd`), draft shapes (:mod:`.shapes`), the study stores (:mod:`.stores`), the
quickstart (:mod:`.quickstart`), the end-to-end table (:mod:`.endtoend`), the GPU-priced column
(:mod:`.gpu_price`) and the draftretriever comparison."""

from ..eval.runner import Runner, Variant, summarize

__all__ = ["Runner", "Variant", "summarize"]

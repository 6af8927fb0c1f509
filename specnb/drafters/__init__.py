"""Drafters: one module per speculation method, all behind :class:`~specnb.core.drafter.Drafter`.

Each module exports its options (a frozen :class:`specnb.options.Options` dataclass) and a factory
``make(target, options) -> Drafter``; :data:`DRAFTERS` finds them by method name. Modules are imported on
first use, so reading this table loads neither torch nor a method's dependencies (hnswlib, a draft model).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.drafter import Drafter
    from ..model.models import LoadedModel


@dataclass(frozen=True)
class Entry:
    """A method's drafter: one line of help, and where its options class and factory live."""

    help: str
    module: str  # under specnb.drafters
    options: str = "Options"
    make: str = "make"

    def _module(self) -> Any:
        return importlib.import_module(f"{__name__}.{self.module}")

    def options_class(self) -> type:
        return getattr(self._module(), self.options)

    def drafter(self, target: LoadedModel, options: Any) -> Drafter:
        return getattr(self._module(), self.make)(target, options)


DRAFTERS: dict[str, Entry] = {
    "pld": Entry("prompt lookup: n-gram matches in the prompt and output", "context"),
    "ngram-unigram": Entry("model-derived unigrams (N-Grammys)", "model_ngram", "UnigramOptions", "make_unigram"),
    "ngram-bigram": Entry("model-derived bigram chains (N-Grammys)", "model_ngram", "BigramOptions", "make_bigram"),
    "mixed": Entry("context n-grams, then model bigrams (N-Grammys)", "mixed", "MixedOptions", "make_mixed"),
    "mixed-adaptive": Entry("mixed, its shape chosen per call from the roofline", "mixed", "AdaptiveOptions",
                            "make_adaptive"),
    "dense": Entry("DReSD dense retrieval of hidden states (needs --datastore)", "dense"),
    "rest": Entry("REST suffix-array retrieval, token tree", "rest"),
    "crest": Entry("CREST n-gram -> precomputed tree store", "crest"),
    "rest-priced": Entry("REST's tree cut to the budget that pays", "priced", "RestPricedOptions", "make_rest"),
    "crest-priced": Entry("CREST's tree cut to the budget that pays", "priced", "CrestPricedOptions",
                          "make_crest"),
    "dense-priced": Entry("DReSD vote-merged tree cut to the budget that pays", "priced", "DensePricedOptions",
                          "make_dense"),
    "suffix": Entry("SuffixDecoding: suffix matches in this request and earlier outputs", "suffix"),
    "recycle": Entry("Token Recycling: trees from the target's own earlier top-k successors", "recycle"),
    "auto": Entry("router: each step, the drafter with the best expected tokens/s on this machine", "auto"),
    "sd": Entry("vanilla speculative decoding with a draft model, one chain", "draft_model", "SdOptions", "make_sd"),
    "mcsd": Entry("MCSD: draft-model candidate tree, multi-candidate sampling", "draft_model", "McsdOptions",
                  "make_mcsd"),
}

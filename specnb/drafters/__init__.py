"""Drafters: one module per speculation method, all behind :class:`~specnb.core.drafter.Drafter`, and the method
registry.

:class:`Method` is a method's record: its name, one line of help, its display name in figures, where its options
dataclass and factory ``make(target, options) -> Drafter`` live, and whether the router may use it.
:data:`DRAFTERS` holds one record per drafter; :data:`specnb.eval.methods.METHODS` adds ``ar`` and the Hugging
Face / llama.cpp baselines as records of the same kind. Records name their module, options and factory by
string, and the module is imported on first use, so reading the table loads neither torch nor a method's
dependencies (hnswlib, a draft model): ``specnb bench --help`` and the model-name checks read it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..options import Options

if TYPE_CHECKING:
    from ..core.drafter import Drafter
    from ..model.models import LoadedModel


@dataclass(frozen=True)
class Method:
    """A named method.

    name: the bench's name (``pld``); help: one line for ``specnb bench --help``; label: its display name in every
    figure; module: the module holding its options class and factory (``specnb.drafters.context``; "" for a
    method with neither, ``ar``); options: the options class's name in ``module``, or the class itself (the
    baselines'); factory: the name in ``module`` of ``make(target, options) -> Drafter`` ("" for a baseline, which
    the bench runs itself); routable: whether the router (``auto``) may choose it (model-free, not already priced).
    """

    name: str
    help: str
    label: str
    module: str = ""
    options: str | type = "Options"
    factory: str = "make"
    routable: bool = False

    @property
    def is_drafter(self) -> bool:
        """Whether the method drafts through our loop (``ar`` and the baselines do not)."""
        return bool(self.module and self.factory)

    def options_class(self) -> type:
        """The method's options dataclass (imports its module the first time)."""
        if isinstance(self.options, type):
            return self.options
        return getattr(importlib.import_module(self.module), self.options) if self.module else Options

    def make(self, target: LoadedModel, options: Any) -> Drafter:
        """The method's drafter for ``target`` with ``options`` (an instance of :meth:`options_class`)."""
        if not self.is_drafter:
            raise ValueError(f"{self.name} is not a drafter")
        return getattr(importlib.import_module(self.module), self.factory)(target, options)


def _drafter(name: str, help: str, label: str, module: str, options: str = "Options", factory: str = "make",
             routable: bool = False) -> Method:
    return Method(name, help, label, f"{__name__}.{module}", options, factory, routable)


DRAFTERS: dict[str, Method] = {m.name: m for m in (
    _drafter("pld", "prompt lookup: n-gram matches in the prompt and output", "prompt lookup", "context",
             routable=True),
    _drafter("ngram-unigram", "model-derived unigrams (N-Grammys)", "model unigram", "model_ngram",
             "UnigramOptions", "make_unigram", routable=True),
    _drafter("ngram-bigram", "model-derived bigram chains (N-Grammys)", "model bigram", "model_ngram",
             "BigramOptions", "make_bigram", routable=True),
    _drafter("mixed", "context n-grams, then model bigrams (N-Grammys)", "mixed", "mixed", "MixedOptions",
             "make_mixed", routable=True),
    _drafter("mixed-adaptive", "mixed, its shape chosen per call from the roofline", "mixed, adaptive", "mixed",
             "AdaptiveOptions", "make_adaptive"),
    _drafter("dense", "DReSD dense retrieval of hidden states (needs --datastore)", "DReSD", "dense", routable=True),
    _drafter("rest", "REST suffix-array retrieval, token tree", "REST", "rest", routable=True),
    _drafter("crest", "CREST n-gram -> precomputed tree store", "CREST", "crest", routable=True),
    _drafter("rest-priced", "REST's tree cut to the budget that pays", "REST, priced", "priced", "RestPricedOptions",
             "make_rest"),
    _drafter("crest-priced", "CREST's tree cut to the budget that pays", "CREST, priced", "priced",
             "CrestPricedOptions", "make_crest"),
    _drafter("dense-priced", "DReSD vote-merged tree cut to the budget that pays", "DReSD, priced", "priced",
             "DensePricedOptions", "make_dense"),
    _drafter("suffix", "SuffixDecoding: suffix matches in this request and earlier outputs", "SuffixDecoding",
             "suffix", routable=True),
    _drafter("recycle", "Token Recycling: trees from the target's own earlier top-k successors", "Token Recycling",
             "recycle", routable=True),
    _drafter("auto", "router: each step, the drafter with the best expected tokens/s on this machine",
             "auto (router)", "auto"),
    _drafter("sd", "vanilla speculative decoding with a draft model, one chain", "SD", "draft_model", "SdOptions",
             "make_sd"),
    _drafter("mcsd", "MCSD: draft-model candidate tree, multi-candidate sampling", "MCSD", "draft_model",
             "McsdOptions", "make_mcsd"),
)}
"""Every drafter's record, by method name (the order of ``specnb bench --help``)."""

"""Named speculation methods for the bench and the notebooks.

A method name maps to a factory ``(target, options) -> Drafter | None`` (None = plain AR through our loop).
Factories are imported lazily ("module:function") so a method's heavy dependencies (hnswlib, draftretriever,
a draft model) load only when it is used. The Hugging Face baselines (``hf``, ``hf-pld``, ``hf-assisted``)
are not drafters; :mod:`specnb.bench` runs them through ``model.generate``.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from .drafters.base import Drafter
from .models import LoadedModel


@dataclass
class MethodOptions:
    """Knobs shared by the methods; each factory reads the ones it understands.

    k, w: number and length of drafts (None = the method's default). datastore: path of a datastore;
    datastores: per-method paths that override it (``{"dense": ..., "rest": ...}``).
    draft: draft model name or ``self:L``. draft_shape: e.g. ``4x2x2x1``. extra: any ``key=value`` option.
    """

    k: int | None = None
    w: int | None = None
    datastore: str | None = None
    datastores: dict[str, str] = field(default_factory=dict)
    draft: str | None = None
    draft_shape: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any) -> Any:
        """An option by name: a field if set, else ``extra[name]`` (converted to the default's type)."""
        value = getattr(self, name, None)
        if value is None:
            value = self.extra.get(name)
        if value is None:
            return default
        return type(default)(value) if default is not None and not isinstance(value, type(default)) else value


def _ar(target: LoadedModel, options: MethodOptions) -> None:
    return None


def _pld(target: LoadedModel, options: MethodOptions) -> Drafter:
    from .drafters.context import ContextNgramDrafter

    return ContextNgramDrafter(k=options.get("k", 1), w=options.get("w", 10),
                               max_ngram=options.get("max_ngram", 3), min_ngram=options.get("min_ngram", 1))


FACTORIES: dict[str, Any] = {
    "ar": _ar,
    "pld": _pld,
    # Later methods register here as "module:function" strings.
    "ngram-unigram": "specnb.drafters.model_ngram:make_unigram",
    "ngram-bigram": "specnb.drafters.model_ngram:make_bigram",
    "mixed": "specnb.drafters.mixed:make_mixed",
    "mixed-adaptive": "specnb.drafters.mixed:make_mixed_adaptive",
    "dense": "specnb.drafters.dense:make_dense",
    "rest": "specnb.drafters.rest:make_rest",
    "crest": "specnb.drafters.crest:make_crest",
    "rest-priced": "specnb.drafters.priced:make_rest_priced",
    "crest-priced": "specnb.drafters.priced:make_crest_priced",
    "dense-priced": "specnb.drafters.priced:make_dense_priced",
    "sd": "specnb.drafters.draft_model:make_sd",
    "mcsd": "specnb.drafters.draft_model:make_mcsd",
}

HF_BASELINES = ("hf", "hf-pld", "hf-assisted")
LLAMACPP_BASELINES = ("llamacpp", "llamacpp-pld")  # specnb.llamacpp


def method_names() -> list[str]:
    return [*FACTORIES, *HF_BASELINES, *LLAMACPP_BASELINES]


def make_drafter(method: str, target: LoadedModel, options: MethodOptions | None = None) -> Drafter | None:
    """The drafter for ``method`` (None for ``ar``). Raises ValueError naming the known methods."""
    if method not in FACTORIES:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(method_names())}")
    factory = FACTORIES[method]
    if isinstance(factory, str):
        module, function = factory.split(":")
        factory = getattr(importlib.import_module(module), function)
    options = options or MethodOptions()
    # a priced variant reads its base method's store unless it has its own
    path = options.datastores.get(method) or options.datastores.get(method.removesuffix("-priced"))
    if path is not None:
        options = dataclasses.replace(options, datastore=path)
    return factory(target, options)


def split_datastores(values: list[str]) -> tuple[str | None, dict[str, str]]:
    """``--datastore`` values -> (the path for every method, {method: path}) from ``PATH`` / ``METHOD=PATH``."""
    shared, per_method = None, {}
    for value in values:
        method, sep, path = value.partition("=")
        if sep and method in FACTORIES:
            per_method[method] = path
        elif shared is None:
            shared = value
        else:
            raise ValueError(f"two datastores for every method ({shared!r}, {value!r}); use METHOD=PATH")
    return shared, per_method

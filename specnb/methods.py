"""Named speculation methods for the bench and the notebooks, each with a small dataclass of typed options.

A method is a one-line description, an options dataclass and a factory ``(target, options) -> Drafter | None``
(None = plain AR through our loop). Factories are imported lazily ("module:function") so a method's heavy
dependencies (hnswlib, draftretriever, a draft model) load only when it is used, and this module imports
nothing heavy: the command line validates every option before a model is loaded. The Hugging Face baselines
(``hf``, ``hf-pld``, ``hf-assisted``) and llama.cpp's (``llamacpp``, ``llamacpp-pld``) have no factory;
:mod:`specnb.bench` runs them itself.

Options come from the command line's shared flags (``--k``, ``--w``, ``--datastore``, ``--draft``,
``--draft-shape``) and ``-o KEY=VALUE``; each is parsed once, to its field's type, by :func:`parse_options`
(a wrong type names the option). :func:`options_for` does it for several methods at once and refuses a value
that none of them reads.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .drafters.base import Drafter
    from .models import LoadedModel


class OptionError(ValueError):
    """A method or method option that is unknown, unused, out of range or of the wrong type."""


# Command-line spelling of the options that have their own flag (the rest are ``-o KEY=VALUE``).
FLAGS = {"k": "--k", "w": "--w", "datastore": "--datastore", "draft": "--draft", "draft_shape": "--draft-shape"}


def _at_least(options: Any, minimum: int, *names: str) -> None:
    """Raise OptionError naming the first of ``names`` (fields of ``options``) that is set and below ``minimum``."""
    for name in names:
        value = getattr(options, name)
        if value is not None and value < minimum:
            raise OptionError(f"option {name} must be >= {minimum}, got {value}")


def _ngram_range(options: Any) -> None:
    _at_least(options, 1, "max_ngram", "min_ngram")
    if options.min_ngram > options.max_ngram:
        raise OptionError(f"option min_ngram ({options.min_ngram}) must not exceed max_ngram ({options.max_ngram})")


@dataclass(frozen=True)
class NoOptions:
    """Methods that take no option (ar, hf)."""


@dataclass(frozen=True)
class PldOptions:
    """Prompt lookup: ``k`` drafts of ``w`` tokens after the longest match of the last max_ngram..min_ngram tokens."""

    k: int = 1
    w: int = 10
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self) -> None:
        _at_least(self, 1, "k", "w")
        _ngram_range(self)


@dataclass(frozen=True)
class UnigramOptions:
    """Model unigrams: the ``k`` top tokens of the ``unigram`` ranking rule."""

    k: int = 10
    unigram: Literal["appendix", "distance"] = "appendix"

    def __post_init__(self) -> None:
        _at_least(self, 1, "k")


@dataclass(frozen=True)
class BigramOptions:
    """Model bigrams: ``k`` drafts of ``w`` tokens; ``bigram_tokens=all`` builds every row of the table."""

    k: int = 10
    w: int = 1
    bigram_tokens: Literal["default", "all"] = "default"

    def __post_init__(self) -> None:
        _at_least(self, 1, "k", "w")


@dataclass(frozen=True)
class MixedOptions:
    """Context n-grams first, model bigrams fill the remaining rows of a k x w batch."""

    k: int = 10
    w: int = 10
    max_ngram: int = 1
    min_ngram: int = 1
    bigram_tokens: Literal["default", "all"] = "default"

    def __post_init__(self) -> None:
        _at_least(self, 1, "k", "w")
        _ngram_range(self)


@dataclass(frozen=True)
class MixedAdaptiveOptions:
    """Mixed drafting with the shape chosen per call from a roofline table (``roofline``: a CSV, or measured)."""

    max_ngram: int = 1
    min_ngram: int = 1
    bigram_tokens: Literal["default", "all"] = "default"
    roofline: str = ""

    def __post_init__(self) -> None:
        _ngram_range(self)


@dataclass(frozen=True)
class RestOptions:
    """REST: ``datastore`` (default: the target's code store); ``w`` continuation tokens per match."""

    datastore: str | None = None
    w: int = 10
    max_query: int = 16
    min_query: int = 2
    max_matches: int = 5000
    max_nodes: int = 64

    def __post_init__(self) -> None:
        _at_least(self, 1, "w", "min_query", "max_matches", "max_nodes")
        if self.min_query > self.max_query:
            raise OptionError(f"option min_query ({self.min_query}) must not exceed max_query ({self.max_query})")


@dataclass(frozen=True)
class CrestOptions:
    """CREST: ``datastore`` (default: the target's code store); ``max_nodes`` cuts the stored trees."""

    datastore: str | None = None
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        _at_least(self, 1, "max_nodes")


@dataclass(frozen=True)
class DenseOptions:
    """DReSD: ``datastore`` (required), a ``draft_shape`` KxW|greedy|sampling or ``k``/``w`` (default 10x10)."""

    datastore: str | None = None
    draft_shape: str | None = None
    k: int | None = None
    w: int | None = None
    neighbours: int | None = None
    ef: int | None = None
    merge: Literal["rows", "votes"] = "rows"

    def __post_init__(self) -> None:
        if self.datastore is None:
            raise OptionError("dense needs --datastore (a folder from `specnb datastore build dense`)")
        _at_least(self, 1, "k", "w", "neighbours", "ef")
        if self.draft_shape is not None:
            from .draft_shapes import retrieval_shape

            retrieval_shape(self.draft_shape)


@dataclass(frozen=True)
class RestPricedOptions(RestOptions):
    """REST's tree cut to the node budget that pays on this machine's roofline (``roofline``: CSV or measured)."""

    roofline: str = ""


@dataclass(frozen=True)
class CrestPricedOptions(CrestOptions):
    """CREST's stored tree cut to the node budget that pays."""

    roofline: str = ""


@dataclass(frozen=True)
class DensePricedOptions(DenseOptions):
    """DReSD's neighbours merged into one vote-ranked tree, cut to the node budget that pays."""

    merge: Literal["rows", "votes"] = "votes"
    roofline: str = ""


@dataclass(frozen=True)
class DraftModelOptions:
    """A draft model (``draft``: a name or ``self:L``; ``self:2`` for tiny targets) sampling at ``temperature``
    / ``top_p`` (the run's unless set) with ``seed``, accepted by ``scheme``."""

    draft: str | None = None
    scheme: str = "mcss"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        from .accept import SCHEMES
        from .draft_shapes import self_layers
        from .model_names import check_installed

        if self.draft is not None and self_layers(self.draft) is None:
            check_installed(self.draft)  # a mistyped or missing draft fails before the target loads
        if self.scheme not in SCHEMES:
            raise OptionError(f"option scheme must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise OptionError(f"options temperature >= 0 and 0 < top_p <= 1 needed, got {self.temperature}, "
                              f"{self.top_p}")


@dataclass(frozen=True)
class SdOptions(DraftModelOptions):
    """Vanilla SD: one chain of ``w`` draft tokens, or ``draft_shape`` 1x1x..."""

    draft_shape: str | None = None
    w: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        _at_least(self, 1, "w")
        if self.draft_shape is not None:
            from .draft_shapes import tree_shape

            if max(tree_shape(self.draft_shape)) > 1:
                raise OptionError(f"sd drafts one chain; draft shape {self.draft_shape!r} has several candidates "
                                  "per level (use mcsd)")


@dataclass(frozen=True)
class McsdOptions(DraftModelOptions):
    """MCSD: a ``draft_shape`` tree of candidates per level, MCSS without replacement unless ``scheme``."""

    draft_shape: str = "4x2x2x1"
    scheme: str = "mcss-wor"

    def __post_init__(self) -> None:
        super().__post_init__()
        from .draft_shapes import tree_shape

        tree_shape(self.draft_shape)


@dataclass(frozen=True)
class SuffixOptions:
    """SuffixDecoding: a tree of up to ``max_nodes`` from the longest suffix match (this request and earlier
    outputs), ``alpha`` x match length deep (at most ``max_depth``), nodes below ``min_prob`` pruned. ``alpha`` 2
    and ``max_nodes`` 16 (the reference implementation's are 1 and larger) ran faster here: docs/drafters.md."""

    max_nodes: int = 16
    alpha: float = 2.0
    max_depth: int = 16
    min_prob: float = 0.1
    max_query: int = 32
    min_query: int = 1
    history_tokens: int = 262_144

    def __post_init__(self) -> None:
        _at_least(self, 1, "max_nodes", "max_depth", "max_query", "min_query", "history_tokens")
        if self.alpha <= 0 or not 0 <= self.min_prob <= 1:
            raise OptionError(f"options alpha > 0 and 0 <= min_prob <= 1 needed, got {self.alpha}, {self.min_prob}")
        if self.min_query > self.max_query:
            raise OptionError(f"option min_query ({self.min_query}) must not exceed max_query ({self.max_query})")


# Model-free drafters the router can choose among (draft models and already-priced methods excluded).
ROUTABLE = ("pld", "suffix", "recycle", "ngram-unigram", "ngram-bigram", "mixed", "rest", "crest", "dense")


@dataclass(frozen=True)
class AutoOptions:
    """The router: ``members`` (comma-separated methods; default pld, suffix, recycle, ngram-bigram and crest
    where its store exists), ``crest`` / ``dense`` store paths for those members, ``roofline`` CSV, ``window``
    (steps between two reviews of whether each member pays for its seat; 0: keep every member), ``merge``
    (whether the best two members' trees may be verified together when that is expected to pay), ``merge_z``
    (standard errors below its mean that what a merge adds is taken at; 0: the mean)."""

    members: str = ""
    crest: str = ""
    dense: str = ""
    roofline: str = ""
    window: int = 256
    merge: bool = True
    merge_z: float = 0.0

    def __post_init__(self) -> None:
        _at_least(self, 0, "window")
        _at_least(self, 0, "merge_z")
        for name in filter(None, self.members.split(",")):
            if name not in ROUTABLE:
                raise OptionError(f"option members: {name!r} cannot be routed; use some of {', '.join(ROUTABLE)}")


@dataclass(frozen=True)
class RecycleOptions:
    """Token Recycling: the target's top ``k`` successors of every token; breadth-first trees of ``max_nodes``
    (8, not the paper's 32: on a CPU every node is a row of the target's call; docs/drafters.md). The router
    (``auto``) keeps recycle's 32-node tree and cuts it itself."""

    k: int = 8
    max_nodes: int = 8

    def __post_init__(self) -> None:
        _at_least(self, 1, "k", "max_nodes")


@dataclass(frozen=True)
class LookupOptions:
    """The baselines' prompt lookup (Hugging Face, llama.cpp) with ``w`` draft tokens."""

    w: int = 10

    def __post_init__(self) -> None:
        _at_least(self, 1, "w")


@dataclass(frozen=True)
class HfAssistedOptions:
    """Hugging Face assisted generation with the draft model ``draft`` (same tokenizer as the target)."""

    draft: str | None = None

    def __post_init__(self) -> None:
        if not self.draft or self.draft.startswith("self:"):
            raise OptionError("hf-assisted needs --draft NAME (a model with the target's tokenizer)")
        from .model_names import check_installed

        check_installed(self.draft)


@dataclass(frozen=True)
class Method:
    """A named method: one line of help, its options dataclass, and its factory ``"module:function"`` (None for
    the Hugging Face and llama.cpp baselines, which the bench runs itself)."""

    help: str
    options: type = NoOptions
    factory: str | None = None


def no_drafter(target: LoadedModel, options: NoOptions) -> None:
    """The ``ar`` factory: no drafter, plain autoregressive decoding through our loop."""
    return None


def make_pld(target: LoadedModel, options: PldOptions) -> Drafter:
    """The ``pld`` factory."""
    from .drafters.context import ContextNgramDrafter

    return ContextNgramDrafter(k=options.k, w=options.w, max_ngram=options.max_ngram, min_ngram=options.min_ngram)


METHODS: dict[str, Method] = {
    "ar": Method("autoregressive decoding through our loop (the reference; always runs)", NoOptions,
                 "specnb.methods:no_drafter"),
    "pld": Method("prompt lookup: n-gram matches in the prompt and output", PldOptions, "specnb.methods:make_pld"),
    "ngram-unigram": Method("model-derived unigrams (N-Grammys)", UnigramOptions,
                            "specnb.drafters.model_ngram:make_unigram"),
    "ngram-bigram": Method("model-derived bigram chains (N-Grammys)", BigramOptions,
                           "specnb.drafters.model_ngram:make_bigram"),
    "mixed": Method("context n-grams, then model bigrams (N-Grammys)", MixedOptions,
                    "specnb.drafters.mixed:make_mixed"),
    "mixed-adaptive": Method("mixed, its shape chosen per call from the roofline", MixedAdaptiveOptions,
                             "specnb.drafters.mixed:make_mixed_adaptive"),
    "dense": Method("DReSD dense retrieval of hidden states (needs --datastore)", DenseOptions,
                    "specnb.drafters.dense:make_dense"),
    "rest": Method("REST suffix-array retrieval, token tree", RestOptions, "specnb.drafters.rest:make_rest"),
    "crest": Method("CREST n-gram -> precomputed tree store", CrestOptions, "specnb.drafters.crest:make_crest"),
    "rest-priced": Method("REST's tree cut to the budget that pays", RestPricedOptions,
                          "specnb.drafters.priced:make_rest_priced"),
    "crest-priced": Method("CREST's tree cut to the budget that pays", CrestPricedOptions,
                           "specnb.drafters.priced:make_crest_priced"),
    "dense-priced": Method("DReSD vote-merged tree cut to the budget that pays", DensePricedOptions,
                           "specnb.drafters.priced:make_dense_priced"),
    "suffix": Method("SuffixDecoding: suffix matches in this request and earlier outputs", SuffixOptions,
                     "specnb.drafters.suffix:make_suffix"),
    "recycle": Method("Token Recycling: trees from the target's own earlier top-k successors", RecycleOptions,
                      "specnb.drafters.recycle:make_recycle"),
    "auto": Method("router: each step, the drafter with the best expected tokens/s on this machine", AutoOptions,
                   "specnb.drafters.auto:make_auto"),
    "sd": Method("vanilla speculative decoding with a draft model, one chain", SdOptions,
                 "specnb.drafters.draft_model:make_sd"),
    "mcsd": Method("MCSD: draft-model candidate tree, multi-candidate sampling", McsdOptions,
                   "specnb.drafters.draft_model:make_mcsd"),
    "hf": Method("Hugging Face generate (plain)"),
    "hf-pld": Method("Hugging Face prompt lookup", LookupOptions),
    "hf-assisted": Method("Hugging Face assisted generation with --draft", HfAssistedOptions),
    "llamacpp": Method("llama.cpp (llama-cpp-python) on the embedded model's GGUF, greedy"),
    "llamacpp-pld": Method("llama.cpp with its prompt-lookup drafting", LookupOptions),
}

HF_BASELINES = ("hf", "hf-pld", "hf-assisted")
LLAMACPP_BASELINES = ("llamacpp", "llamacpp-pld")  # specnb.llamacpp


def method(name: str) -> Method:
    """The method called ``name``; OptionError naming the known ones otherwise."""
    if name not in METHODS:
        raise OptionError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def option_names(name: str) -> list[str]:
    """The options method ``name`` reads, in declaration order."""
    return [f.name for f in dataclasses.fields(method(name).options)]


def parse_options(name: str, values: Mapping[str, Any] | None = None) -> Any:
    """Method ``name``'s options dataclass from ``values`` (strings from the command line, or typed values).

    Raises OptionError naming the option for an unknown key, a value of the wrong type or out of range.
    """
    cls = method(name).options
    hints = typing.get_type_hints(cls)
    known = option_names(name)
    values = values or {}
    for key in values:
        if key not in known:
            raise OptionError(f"method {name} has no option {key!r}; it reads {', '.join(known) or 'none'}")
    try:
        return cls(**{key: _convert(key, value, hints[key]) for key, value in values.items()})
    except OptionError as exc:
        raise OptionError(f"method {name}: {exc}") from None


def _convert(key: str, value: Any, hint: Any) -> Any:
    """``value`` as the type ``hint`` (int, float, str, bool, a Literal, or one of them | None)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        hint = next(a for a in args if a is not type(None))
        args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        if value not in args:
            raise OptionError(f"option {key} must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if hint is bool and isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    expected = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[hint]
    if isinstance(value, str) and hint in (int, float):
        try:
            return hint(value)
        except ValueError:
            raise OptionError(f"option {key} must be {expected}, got {value!r}") from None
    if isinstance(value, hint) and not (isinstance(value, bool) and hint is not bool):
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise OptionError(f"option {key} must be {expected}, got {value!r}")


def split_datastores(values: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """``--datastore`` values -> (the path for every method, {method: path}) from ``PATH`` / ``METHOD=PATH``."""
    shared, per_method = None, {}
    for value in values:
        name, sep, path = value.partition("=")
        if sep and name in METHODS:
            per_method[name] = path
        elif shared is None:
            shared = value
        else:
            raise OptionError(f"two datastores for every method ({shared!r}, {value!r}); use METHOD=PATH")
    return shared, per_method


def check_before_loading(model: str, options: Mapping[str, Any]) -> None:
    """Raise (one line) for what the chosen methods would find wrong only after ``model`` loads, checked from its
    name alone: a datastore or roofline table that is not there (the message names the build command; existence
    only, the loaders check contents and tokenizer) and a ``self:L`` draft at least as deep as the model (where
    its config file is at hand)."""
    from .datastores import dense, rest
    from .draft_shapes import check_self_layers, self_layers
    from .model_names import layer_count

    for opts in options.values():
        layers = self_layers(getattr(opts, "draft", None) or "")
        if layers is not None and (total := layer_count(model)) is not None:
            check_self_layers(layers, total)
        if isinstance(opts, RestOptions | CrestOptions):
            kind = "rest" if isinstance(opts, RestOptions) else "crest"
            rest.require_store(rest.store_path(model, kind, opts.datastore), kind)
        elif isinstance(opts, DenseOptions):
            dense.require_store(dense.store_path(opts.datastore, model))
        elif isinstance(opts, AutoOptions):
            if opts.crest:
                rest.require_store(Path(opts.crest), "crest")
            if opts.dense:
                dense.require_store(Path(opts.dense))
        roofline = getattr(opts, "roofline", "")
        if roofline and not Path(roofline).is_file():
            raise FileNotFoundError(f"roofline table {roofline} does not exist")


def options_for(methods: Sequence[str], given: Mapping[str, Any], datastores: Sequence[str] = (),
                run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Typed options of every method in ``methods``: {method: options dataclass}.

    given: option values from the command line (None = not given); datastores: ``--datastore`` values
    (``PATH`` for every method, ``METHOD=PATH`` for one; a ``-priced`` method uses its base method's);
    run: run-wide values (temperature, top_p, seed) for the methods that have such fields. Raises OptionError
    for an unknown method, or a value that none of ``methods`` reads (naming what each one reads).
    """
    for name in methods:
        method(name)
    shared, per_method = split_datastores(datastores)
    unused = [f"--datastore {name}=..." for name in per_method
              if not any(m in (name, f"{name}-priced") for m in methods)]
    given = {key: value for key, value in given.items() if value is not None}
    if shared is not None:
        given["datastore"] = shared
    read: set[str] = set()
    result = {}
    for name in methods:
        names = option_names(name)
        values = {key: value for key, value in (run or {}).items() if key in names}
        values.update({key: value for key, value in given.items() if key in names})
        path = per_method.get(name) or per_method.get(name.removesuffix("-priced"))
        if path is not None and "datastore" in names:
            values["datastore"] = path
            read.add("datastore")
        read.update(key for key in given if key in names)
        result[name] = parse_options(name, values)
    unused += [FLAGS.get(key, f"-o {key}") for key in given if key not in read]
    if unused:
        accepts = "; ".join(f"{name} reads {', '.join(option_names(name)) or 'nothing'}" for name in methods)
        raise OptionError(f"{', '.join(unused)}: read by none of the methods run ({accepts})")
    return result


def make_drafter(name: str, target: LoadedModel, options: Any = None) -> Drafter | None:
    """The drafter of method ``name`` (None for ``ar``).

    options: the method's options dataclass, a mapping of option values (parsed by :func:`parse_options`),
    or None for the defaults. Raises OptionError for an unknown method or bad options.
    """
    spec = method(name)
    if spec.factory is None:
        raise OptionError(f"{name} is a baseline, not a drafter; run it with specnb.bench")
    if options is None or isinstance(options, Mapping):
        options = parse_options(name, options)
    elif not isinstance(options, spec.options):
        raise OptionError(f"method {name} takes {spec.options.__name__}, got {type(options).__name__}")
    module, function = spec.factory.split(":")
    return getattr(importlib.import_module(module), function)(target, options)

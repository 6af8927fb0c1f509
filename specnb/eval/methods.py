"""Named speculation methods for the bench and the notebooks: the name table and the command line's coercion.

A method is a :class:`specnb.drafters.Method` record (name, help, display name, options, factory): a drafter
(declared in its drafter's module; :data:`specnb.drafters.DRAFTERS` holds its :class:`~specnb.drafters.Entry`,
read without importing that module) or a baseline the bench runs itself (Hugging Face's ``hf``, ``hf-pld``,
``hf-assisted``; llama.cpp's ``llamacpp``, ``llamacpp-pld``), whose options are :class:`LookupOptions`,
:class:`HfAssistedOptions`. ``ar`` is plain AR through our loop. :data:`METHODS` holds them all by name, and
:func:`method` gives a name's full record.

Options come from the command line's shared flags (``--k``, ``--w``, ``--datastore``, ``--draft``,
``--draft-shape``) and ``-o KEY=VALUE``; each is parsed once, to its field's type, by :func:`parse_options`
(a wrong type names the option). :func:`options_for` does it for several methods at once and refuses a value
that none of them reads; :func:`check_before_loading` runs each options' ``check`` before the model loads.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..draft_shapes import SelfDraft, parse_draft
from ..drafters import DRAFTERS, Entry, Method
from ..options import OptionError, Options, at_least, name_list, parsed_by

if TYPE_CHECKING:
    from ..core.drafter import Drafter
    from ..model.models import LoadedModel


@dataclass(frozen=True)
class LookupOptions(Options):
    """The baselines' prompt lookup (Hugging Face, llama.cpp) with ``w`` draft tokens."""

    w: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "w")


@dataclass(frozen=True)
class HfAssistedOptions(Options):
    """Hugging Face assisted generation with the draft model ``draft`` (same tokenizer as the target)."""

    draft: str | SelfDraft | None = parsed_by(parse_draft, None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.draft, str) or not self.draft:
            raise OptionError("hf-assisted needs --draft NAME (a model with the target's tokenizer)")
        from ..model.model_names import check_installed

        check_installed(self.draft)


# Command-line spelling of the options that have their own flag (the rest are ``-o KEY=VALUE``).
FLAGS = {"k": "--k", "w": "--w", "datastore": "--datastore", "draft": "--draft", "draft_shape": "--draft-shape"}


METHODS: dict[str, Method | Entry] = {m.name: m for m in (
    Method("ar", "autoregressive decoding through our loop (the reference; always runs)", "AR (ours)"),
    *DRAFTERS.values(),
    Method("hf", "Hugging Face generate (plain)", "HF generate"),
    Method("hf-pld", "Hugging Face prompt lookup", "HF prompt lookup", options=LookupOptions),
    Method("hf-assisted", "Hugging Face assisted generation with --draft", "HF assisted", options=HfAssistedOptions),
    Method("llamacpp", "llama.cpp (llama-cpp-python) on the embedded model's GGUF, greedy", "llama.cpp"),
    Method("llamacpp-pld", "llama.cpp with its prompt-lookup drafting", "llama.cpp lookup", options=LookupOptions),
)}
"""Every named method, in the order of ``specnb bench --help`` and the figures: ``ar``, the drafters (their
:class:`~specnb.drafters.Entry`: name, help, label, routable), the baselines (their
:class:`~specnb.drafters.Method`)."""

HF_BASELINES = ("hf", "hf-pld", "hf-assisted")
LLAMACPP_BASELINES = ("llamacpp", "llamacpp-pld")  # specnb.eval.llamacpp


def method(name: str) -> Method:
    """The record of the method called ``name`` (a drafter's imports its module); OptionError naming the known ones
    otherwise."""
    if name not in METHODS:
        raise OptionError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    record = METHODS[name]
    return record.method() if isinstance(record, Entry) else record


def option_names(name: str) -> list[str]:
    """The options method ``name`` reads, in declaration order."""
    return [f.name for f in dataclasses.fields(method(name).options)]


def parse_options(name: str, values: Mapping[str, Any] | None = None) -> Any:
    """Method ``name``'s options dataclass from ``values`` (strings from the command line or a notebook's
    parameters, or typed values): each string is parsed here, once, into its field's type (a field's own parser,
    e.g. a draft shape ``"4x2x2x1"`` -> (4, 2, 2, 1); else int, float, bool, a ``Literal``, a tuple of names).

    Raises OptionError naming the option for an unknown key, a value of the wrong type or out of range.
    """
    cls = method(name).options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = values or {}
    for key in values:
        if key not in fields:
            raise OptionError(f"method {name} has no option {key!r}; it reads {', '.join(fields) or 'none'}")
    try:
        return cls(**{key: _convert(key, value, hints[key], fields[key].metadata.get("parse"))
                      for key, value in values.items()})
    except OptionError as exc:
        raise OptionError(f"method {name}: {exc}") from None


def _convert(key: str, value: Any, hint: Any, parse: Callable[[str], Any] | None = None) -> Any:
    """``value`` as the type ``hint`` (int, float, str, bool, a Literal, a tuple, or one of them | None; a field
    with a parser may be a union, e.g. ``str | SelfDraft | None``); a string goes through ``parse`` when the field
    has one (ValueError -> OptionError naming ``key``)."""
    members = (hint,)
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        members = tuple(a for a in args if a is not type(None))
        hint = members[0]
    if parse is not None and isinstance(value, str):
        try:
            return parse(value)
        except OptionError:
            raise
        except ValueError as exc:
            raise OptionError(f"option {key}: {exc}") from None
    if len(members) > 1:  # a typed value of one of the union's types
        if isinstance(value, members):
            return value
        raise OptionError(f"option {key} must be {' or '.join(m.__name__ for m in members)}, got {value!r}")
    if typing.get_origin(hint) is tuple:
        if isinstance(value, str):
            return name_list(value)
        if isinstance(value, list | tuple):
            return tuple(value)
        raise OptionError(f"option {key} must be a tuple, got {value!r}")
    if typing.get_origin(hint) is Literal:
        return value  # checked by Options.__post_init__
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
    """``--datastore`` values -> (the path for every method, {method: path}) from ``PATH`` / ``METHOD=PATH``;
    OptionError for a value that names no path (``--datastore crest=`` was read as no datastore at all)."""
    shared, per_method = None, {}
    for value in values:
        name, sep, path = value.partition("=")
        if not (path if sep and name in METHODS else value).strip():
            raise OptionError(f"--datastore {value!r} names no path; give METHOD=PATH or PATH")
        if sep and name in METHODS:
            per_method[name] = path
        elif shared is None:
            shared = value
        else:
            raise OptionError(f"two datastores for every method ({shared!r}, {value!r}); use METHOD=PATH")
    return shared, per_method


def check_before_loading(model: str, options: Mapping[str, Any]) -> None:
    """Raise (one line) for what the chosen methods would find wrong only after ``model`` loads, judged from its
    name alone: each options' :meth:`~specnb.options.Options.check` (a store or roofline table that is not there,
    naming the command that builds it; a ``self:L`` draft at least as deep as the model)."""
    for opts in options.values():
        opts.check(model)


def options_for(methods: Sequence[str], given: Mapping[str, Any], datastores: Sequence[str] = ()) -> dict[str, Any]:
    """Typed options of every method in ``methods``: {method: options dataclass}.

    given: option values from the command line (None = not given); datastores: ``--datastore`` values
    (``PATH`` for every method, ``METHOD=PATH`` for one; a ``-priced`` method uses its base method's). The
    run's sampling (temperature, top_p, seed) is :class:`specnb.eval.bench.BenchConfig`'s. Raises OptionError
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
        values = {key: value for key, value in given.items() if key in names}
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
    or None for the defaults. Raises OptionError for an unknown method or bad options. A method that prices
    calls on this target's roofline table (an empty ``roofline`` option) gets it measured first, once
    (:func:`specnb.eval.timing.cost_table`): the drafters only read it.
    """
    record = method(name)
    if name != "ar" and not record.is_drafter:
        raise OptionError(f"{name} is a baseline, not a drafter; run it with specnb.eval.bench")
    if options is None or isinstance(options, Mapping):
        options = parse_options(name, options)
    elif not isinstance(options, record.options):
        raise OptionError(f"method {name} takes {record.options.__name__}, got {type(options).__name__}")
    if getattr(options, "roofline", None) == "":
        from .timing import cost_table

        cost_table(target)
    return record.make(target, options) if record.is_drafter else None

"""Draft-model speculative decoding: vanilla SD and Multi-Candidate Speculative Decoding (MCSD).

A small LM that shares the target's tokenizer drafts a k_1 x k_2 x ... x k_L tree level by level: every
node of level l gets k_{l+1} children sampled from the draft's distribution q at that node. Vanilla SD
(Leviathan et al. 2023) is the 1 x 1 x ... x 1 chain. Each level is *one* draft call: the level's nodes
go in as one row with a tree-attention mask (every node sees the context and its own ancestors) and
per-node positions, on top of the draft's own KV cache. After verification the draft cache keeps the
context plus the accepted nodes it already computed; nothing is ever recomputed.

Draft models: any model with the target's vocabulary (``qwen2.5-coder-0.5b-instruct`` for the 1.5B
target), or a :class:`~specnb.draft_shapes.SelfDraft` (``self:L``), the target's own first L layers with its
final norm and LM head (no extra weights). Temperature 0 drafting is deterministic (the top-k_l tokens, or the
top-1 chain when drawing with replacement, as in the MCSD paper) and carries no q; temperature > 0 returns a
:class:`~specnb.core.accept.CandidateDraft` whose ``q`` and ``scheme`` drive :func:`~specnb.core.accept.accept_mcss`.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..core.accept import SCHEMES, CandidateDraft, Scheme
from ..core.draft import Draft
from ..core.drafter import DecodeState, Drafter
from ..core.report import Report
from ..core.sampling import SamplingConfig, probabilities
from ..draft_shapes import SelfDraft, check_self_layers, parse_draft, tree_shape
from ..model.backend import HFModules
from ..model.decoder import Body
from ..model.device import generator as make_generator
from ..model.forward import forward
from ..model.kernels import top_k
from ..model.kv_cache import GrowingCache
from ..model.masks import TreeMasks
from ..model.model_names import check_installed, layer_count
from ..model.models import LoadedModel, load_model
from ..options import OptionError, Options, at_least, parsed_by, positive_shape
from . import Method

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

NO_DRAFT = "draft-model methods need --draft NAME or --draft self:L"


@dataclass(frozen=True)
class DraftModelOptions(Options):
    """A draft model (``draft``: a model name or a :class:`~specnb.draft_shapes.SelfDraft`, ``self:L`` at the edge;
    None: ``self:2`` for tiny targets) sampling at ``temperature``
    / ``top_p`` with ``seed`` (None: the run's, :class:`specnb.eval.bench.BenchConfig`; 0, 1, 0 outside a
    bench), accepted by ``scheme``."""

    draft: str | SelfDraft | None = parsed_by(parse_draft, None)
    scheme: Scheme = "mcss"
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.draft, str):
            check_installed(self.draft)  # a mistyped or missing draft fails before the target loads
        if (self.temperature or 0.0) < 0 or not 0 < (1.0 if self.top_p is None else self.top_p) <= 1:
            raise OptionError(f"options temperature >= 0 and 0 < top_p <= 1 needed, got {self.temperature}, "
                              f"{self.top_p}")

    def check(self, model: str) -> None:
        """A draft must be named (a tiny target drafts with itself); a self-draft must be shallower than the target
        (where its config file is at hand)."""
        super().check(model)
        if self.draft is None and not model.startswith("tiny-"):
            raise OptionError(NO_DRAFT)
        if isinstance(self.draft, SelfDraft) and (total := layer_count(model)) is not None:
            check_self_layers(self.draft.layers, total)
        if isinstance(self.draft, str) and self.draft != model:  # from the tokenizers alone (~1 s), not the weights
            from ..datastores.corpus import load_tokenizer

            _check_same_vocabulary(model, load_tokenizer(model), self.draft, load_tokenizer(self.draft))


@dataclass(frozen=True)
class SdOptions(DraftModelOptions):
    """Vanilla SD: one chain of ``w`` draft tokens, or ``draft_shape`` (1, 1, ...) (``1x1x1`` at the edge)."""

    draft_shape: tuple[int, ...] | None = parsed_by(tree_shape, None)
    w: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "w")
        positive_shape(self, "draft_shape")
        if self.draft_shape is not None and max(self.draft_shape) > 1:
            raise OptionError(f"sd drafts one chain; draft shape {'x'.join(map(str, self.draft_shape))} has several "
                              "candidates per level (use mcsd)")


@dataclass(frozen=True)
class McsdOptions(DraftModelOptions):
    """MCSD: a ``draft_shape`` tree of candidates per level (``4x2x2x1`` at the edge), MCSS without replacement
    unless ``scheme``."""

    draft_shape: tuple[int, ...] = parsed_by(tree_shape, (4, 2, 2, 1))
    scheme: Scheme = "mcss-wor"

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_shape(self, "draft_shape")


@dataclass(frozen=True)
class DraftModelReport(Report):
    """The draft model's forward calls for this proposal and the nodes it drew."""

    draft_calls: int = 0
    draft_nodes: int = 0


class VocabularyError(ValueError):
    """The draft model's tokenizer differs from the target's."""


# ------------------------------------------------------------------------------------ draft models


def self_draft(target: LoadedModel, layers: int) -> LoadedModel:
    """The target truncated to its first ``layers`` decoder layers, sharing every weight with it.

    Its decoder is the target's own on its first layers (:meth:`specnb.model.decoder.Body.first_layers`: the same
    layer objects, final norm and head). Its Hugging Face model, which gives the config (and runs the ``hf``
    backend: Hugging Face decoders run ``self.layers[:config.num_hidden_layers]``), is a shallow copy of the
    target's model objects with a config of ``layers`` layers: no copied tensors.
    """
    config = copy.deepcopy(target.modules.config)
    text = config.get_text_config()
    total = text.num_hidden_layers
    check_self_layers(layers, total)
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:layers]
    decoder = target.decoder
    shell = _first_layers(target.modules, config)
    draft = decoder.first_layers(layers) if isinstance(decoder, Body) else HFModules(shell, decoder.head)
    dense = None if target.dense is None else functools.cache(lambda: _first_layers(target.model, config))
    return LoadedModel(shell, target.tokenizer, f"{target.name}:self:{layers}", draft, target.chat,
                       target.eos_token_ids, dense)


def _first_layers(outer: PreTrainedModel, config: PretrainedConfig) -> PreTrainedModel:
    """A shallow copy of ``outer`` with ``config`` (fewer layers): the same submodules, no tensor copied."""
    base = copy.copy(outer.base_model)  # new object, same submodules (and so the same weights)
    base.config = config.get_text_config()
    model = copy.copy(outer)
    model._modules = {**outer._modules, outer.base_model_prefix: base}  # never mutate the target's dict
    model.config = config
    return model


def check_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise :class:`VocabularyError` unless both tokenizers map the same strings to the same ids."""
    if draft.tokenizer is not target.tokenizer:
        _check_same_vocabulary(target.name, target.tokenizer, draft.name, draft.tokenizer)


def _check_same_vocabulary(target: str, target_tokenizer: PreTrainedTokenizerBase, draft: str,
                           draft_tokenizer: PreTrainedTokenizerBase) -> None:
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise VocabularyError(
            f"draft model {draft!r} has a different vocabulary ({len(draft_tokenizer)} tokens) than the target "
            f"{target!r} ({len(target_tokenizer)} tokens); a draft model must share the target's tokenizer (use "
            "self:L for an early-exit draft of the target)")


@functools.lru_cache(maxsize=2)
def _load_cached(name: str, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    return load_model(name, dtype=dtype, device=device)


def load_draft(target: LoadedModel, draft: str | SelfDraft, device: str | torch.device | None = None) -> LoadedModel:
    """The draft model ``draft``: the target's first layers (a :class:`~specnb.draft_shapes.SelfDraft`), or the model
    of a :func:`load_model` name loaded in the target's dtype on ``device`` (default: the target's) and checked to
    share its vocabulary."""
    if isinstance(draft, SelfDraft):
        return self_draft(target, draft.layers)
    model = _load_cached(draft, target.dtype,
                         target.device if device is None else torch.device(device))
    check_vocabulary(target, model)
    return model


# ------------------------------------------------------------------------------------------ drafter


class DraftModelDrafter(Drafter):
    """Drafts a ``shape`` tree (children per node at each level) with a draft LM and its own KV cache.

    draft: the draft model (see :func:`load_draft`); target_vocab: rows of the target's LM head (the
    draft's logits are cut or padded with -inf to it); scheme: how candidates are drawn at temperature > 0
    (``mcss``: with replacement, ``mcss-wor`` and ``mcns``: without); temperature / top_p: the draft's own
    sampling (use the target's for the best acceptance; any value keeps decoding lossless).
    """

    name = "draft-model"

    def __init__(self, draft: LoadedModel, shape: tuple[int, ...] | str, target_vocab: int, *,
                 scheme: Scheme = "mcss-wor", temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        if scheme not in SCHEMES:
            raise ValueError(f"unknown acceptance scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
        self.draft = draft
        self.shape = tree_shape(shape) if isinstance(shape, str) else tuple(shape)
        if not self.shape or min(self.shape) < 1:
            raise ValueError(f"invalid draft shape {self.shape}")
        self.target_vocab = target_vocab
        self.scheme: Scheme = scheme
        self.config = SamplingConfig(temperature, top_p)
        # One generator for the drafter's life, not reseeded per generation: repeated generations from the
        # same prompt must draw fresh candidates, or their outputs would not follow the target distribution.
        self.generator = make_generator(draft.device, seed)
        self.masks = TreeMasks(draft.config, draft.dtype, draft.device)
        self.reset(torch.empty(0, dtype=torch.long))

    # -------------------------------------------------------------- protocol

    def reset(self, prompt_ids: Tensor) -> None:
        self.cache = GrowingCache()
        self.prefix = 0  # leading cache slots = tokens[:prefix] of the context, positions 0..prefix-1
        self._forget_tree()
        self._report = DraftModelReport()

    def _forget_tree(self) -> None:
        empty = torch.empty(0, dtype=torch.long)
        self.tree_tokens, self.tree_parents = empty, empty
        self.tree_slot = empty  # cache slot of each node, -1 if never fed to the draft

    @property
    def report(self) -> DraftModelReport:
        return self._report

    @torch.inference_mode()
    def propose(self, state: DecodeState) -> Draft | None:
        depth = min(len(self.shape), state.max_depth)
        if depth < 1:
            return None
        context = state.tokens.shape[0]
        self.prefix = min(self.prefix, context - 1)  # the root's logits are needed, so it is always fed
        self.cache.keep(self.prefix, torch.empty(0, dtype=torch.long))  # drop a tree update() did not see
        # Level 0: the tokens the draft has not seen yet (accepted leaves, the root) as one causal chain.
        pending = state.tokens[self.prefix:]
        logits, _ = forward(self.draft, pending[None], last_only=True, cache=self.cache)
        logits = self._fit(logits[0])  # [1, V]
        self.prefix = context
        frontier = torch.tensor([-1])  # nodes whose children are drawn next (-1 = the root)
        tokens, parents, slots, qs = [], [], [], []
        fed: list[Tensor] = []  # node ids in cache-slot order after the prefix
        count, calls = 0, 1
        for level in range(depth):
            children, q = self._draw(logits, self.shape[level])  # [m, k], [m, V] or None
            m, k = children.shape
            new = count + torch.arange(m * k)
            tokens.append(children.flatten())
            parents.append(frontier.repeat_interleave(k))
            if q is not None:
                qs.append(q.repeat_interleave(k, 0))
            # Expand only the first copy of a token among siblings: a repeated candidate can never be
            # accepted after the first copy was rejected, so its subtree would be wasted work.
            first = ~((children[:, :, None] == children[:, None, :]) & _earlier(k)).any(-1).flatten()
            count += m * k
            slots.append(torch.full((m * k,), -1, dtype=torch.long))
            if level == depth - 1:
                break
            frontier = new[first]
            all_tokens, all_parents = torch.cat(tokens), torch.cat(parents)
            logits = self._forward_level(all_tokens, all_parents, fed, frontier, context)
            slots[-1][first] = self.prefix + sum(f.shape[0] for f in fed) + torch.arange(frontier.shape[0])
            fed.append(frontier)
            calls += 1
        self.tree_tokens, self.tree_parents = torch.cat(tokens), torch.cat(parents)
        self.tree_slot = torch.cat(slots)
        self._report = DraftModelReport(calls, count)
        if self.config.greedy:
            return Draft(self.tree_tokens, self.tree_parents)
        return CandidateDraft(self.tree_tokens, self.tree_parents, torch.cat(qs), scheme=self.scheme)

    @torch.inference_mode()
    def update(self, committed: Tensor, accepted: Tensor) -> None:
        """Keep the cache entries of the accepted nodes the draft already computed (every accepted node but
        a leaf of the drafted tree, whose logits the draft never needed)."""
        slots = self.tree_slot[accepted]
        unfed = torch.nonzero(slots < 0)
        fed = int(unfed[0]) if unfed.numel() else slots.shape[0]
        self.cache.keep(self.prefix, slots[:fed])
        self.prefix += fed
        self._forget_tree()

    # -------------------------------------------------------------- internals

    def _draw(self, logits: Tensor, k: int) -> tuple[Tensor, Tensor | None]:
        """Children tokens [m, k'] (host) for each of m frontier rows of draft logits [m, V] (device), and
        q [m, V] (device).

        Temperature 0: the top-k tokens (top-1 when drawing with replacement), no q. Otherwise k draws from
        q, i.i.d. for ``mcss`` or without replacement (never more than q's smallest support).
        """
        with_replacement = self.scheme == "mcss"
        if self.config.greedy:
            return top_k(logits, 1 if with_replacement else k).cpu(), None
        q = probabilities(logits, self.config)
        if not with_replacement:
            k = min(k, int((q > 0).sum(-1).min()))
        return torch.multinomial(q, k, replacement=with_replacement, generator=self.generator).cpu(), q

    def _forward_level(self, tokens: Tensor, parents: Tensor, fed: list[Tensor], frontier: Tensor,
                       context: int) -> Tensor:
        """One draft call over the ``frontier`` nodes; returns their draft logits [m, V].

        Keys are the cache (context prefix, then the nodes fed at earlier levels in ``fed`` order) and the
        frontier itself; a node sees the whole prefix and exactly its ancestors and itself among the rest.
        """
        ancestors, depth = Draft(tokens, parents).attention()
        ancestors, depth = ancestors[1:, 1:], depth[1:]  # drop the root: it is part of the prefix
        key_nodes = torch.cat([*fed, frontier])
        query_pos = context - 1 + depth[frontier]
        mask = self.masks(ancestors[frontier][:, key_nodes], query_pos, context - 1 + depth[key_nodes],
                          prefix=self.prefix)
        logits, _ = forward(self.draft, tokens[frontier][None], cache=self.cache, mask=mask,
                            positions=query_pos[None])
        return self._fit(logits[0])

    def _fit(self, logits: Tensor) -> Tensor:
        """Draft logits [m, Vd] -> [m, V] of the target's head size (extra rows cut, missing ones -inf)."""
        extra = self.target_vocab - logits.shape[-1]
        if extra < 0:
            return logits[:, :self.target_vocab]
        if extra > 0:
            return torch.cat([logits, logits.new_full((logits.shape[0], extra), float("-inf"))], dim=-1)
        return logits


@functools.cache
def _earlier(k: int) -> Tensor:
    """bool [k, k]: ``[i, j]`` is True when j < i (candidate j was drawn before candidate i)."""
    return torch.ones(k, k, dtype=torch.bool).tril(-1)


# ----------------------------------------------------------------------------------------- factories


def _make(target: LoadedModel, options: DraftModelOptions, shape: tuple[int, ...]) -> DraftModelDrafter:
    if max(shape) > target.vocab_size:
        raise OptionError(f"draft shape {'x'.join(map(str, shape))} branches past {target.name}'s vocabulary "
                          f"({target.vocab_size} tokens)")
    draft = options.draft or (SelfDraft(2) if target.name.startswith("tiny-") else None)
    if draft is None:
        raise ValueError(NO_DRAFT)
    return DraftModelDrafter(load_draft(target, draft), shape, target.vocab_size, scheme=options.scheme,
                             temperature=options.temperature or 0.0,
                             top_p=1.0 if options.top_p is None else options.top_p, seed=options.seed or 0)


def make_sd(target: LoadedModel, options: SdOptions) -> DraftModelDrafter:
    """The ``sd`` drafter: one chain of ``w`` tokens, or ``draft_shape`` (1, 1, ...)."""
    return _make(target, options, options.draft_shape or (1,) * options.w)


def make_mcsd(target: LoadedModel, options: McsdOptions) -> DraftModelDrafter:
    """The ``mcsd`` drafter: a ``draft_shape`` tree of candidates."""
    return _make(target, options, options.draft_shape)


METHODS = (
    Method("sd", "vanilla speculative decoding with a draft model, one chain", "SD", SdOptions, make_sd),
    Method("mcsd", "MCSD: draft-model candidate tree, multi-candidate sampling", "MCSD", McsdOptions, make_mcsd),
)

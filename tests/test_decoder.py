"""The explicit decoder body (specnb/model/decoder.py) against Hugging Face's decoder on the same weights: prefill,
chain, tree and batch calls, contexts past the sliding window; and its norm / heads kernels on their own."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import (
    ARCHS,
    DTYPES,
    GGUF_ARCHS,
    hugging_face_on_kernels,
    kernel_path_exists,
    tiny,
    tiny_gguf,
    without_kernels,
)

from specnb.core.draft import Draft
from specnb.model import kernels
from specnb.model.backend import build_decoder, dense_backend
from specnb.model.decoder import MIN_POSITIONS, Body, Rotary, Stacked
from specnb.model.forward import forward
from specnb.model.kv_cache import GrowingCache
from specnb.model.masks import TreeMasks
from specnb.model.models import LoadedModel, stock, tiny_model

# Skipped only where the kernels cannot exist; where they can, a failed build fails these tests (and
# test_kernels.py::test_the_extension_builds says why).
pytestmark = pytest.mark.skipif(not kernel_path_exists(), reason="no AVX2/FMA CPU (or SPECNB_KERNELS=0)")

PROMPT, STEPS = 40, 6  # the tiny Gemma's window is 16: most keys of the later calls are outside it

# (architecture, weights): every architecture dense, and those GGUF files hold in Hugging Face's row order over
# GGUF blocks (conftest.tiny_gguf)
MODELS = [(arch, "dense") for arch in ARCHS] + [(arch, "gguf") for arch in GGUF_ARCHS]


def tiny_model_of(arch: str, weights: str, dtype: torch.dtype) -> LoadedModel:
    return (tiny_gguf if weights == "gguf" else tiny)(arch, dtype)


def hf(model, ids, cache, on_kernels: bool = True, **kwargs):
    """Hugging Face's decoder, on specnb's kernels (:func:`conftest.hugging_face_on_kernels`) or as shipped."""
    with hugging_face_on_kernels(model) if on_kernels else contextlib.nullcontext():
        return model.get_decoder()(input_ids=ids, cache=cache, use_cache=True, **kwargs).last_hidden_state


def assert_close(got, want, dtype):
    """The body rounds where Hugging Face's ops round, but sums a norm's squares (and attention's weights) in
    another order: in bf16 the fp32 results then round to the other neighbour now and then (about one random
    40-token prompt in ten on these models), a one-unit difference that later layers and positions carry along.
    So: most values bit for bit, every value within a few bf16 units; fp32: within its summation order."""
    if dtype == torch.bfloat16:
        assert (got == want).float().mean() > 0.5
        torch.testing.assert_close(got, want, rtol=2**-5, atol=2**-5)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch, weights", MODELS)
def test_body_matches_hugging_face(arch, weights, dtype):
    if weights == "gguf" and dtype == torch.bfloat16:
        pytest.skip("Hugging Face's bf16 weights round the blocks' fp32 values (d * q): another model")
    target = tiny_model_of(arch, weights, dtype)
    model, lean = target.model, target.decoder
    assert isinstance(lean, Body) and lean.backend == weights
    # seed 0 gives the tiny bf16 Gemma a prompt where a norm rounds the other way (see assert_close)
    ids = torch.randint(0, 256, (1, PROMPT + STEPS + 3), generator=torch.Generator().manual_seed(0))
    ours, theirs = GrowingCache(), GrowingCache()
    with torch.inference_mode():
        assert_close(lean.forward(ids[:, :PROMPT], ours), hf(model, ids[:, :PROMPT], theirs), dtype)
        for i in range(PROMPT, PROMPT + STEPS):  # one token at a time
            assert_close(lean.forward(ids[:, i:i + 1], ours), hf(model, ids[:, i:i + 1], theirs), dtype)
        # a tree call: root with two children, positions by depth, masks as the verifier builds them
        draft = Draft(ids[0, -2:], torch.tensor([-1, -1]))
        visible, depth = draft.attention()
        past = ours.get_seq_length()
        positions = past + depth
        mask = TreeMasks.of(model)(visible, positions, positions, prefix=past)
        tree = ids[:, [-3, -2, -1]]
        assert_close(lean.forward(tree, ours, positions[None], mask),
                     hf(model, tree, theirs, attention_mask=mask, position_ids=positions[None]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_body_without_kernels_matches_hugging_face(arch, dtype):
    """Where the kernels do not run (other devices, CPUs without AVX2) the same body runs PyTorch's ops: its
    prefill, decoding and tree calls against Hugging Face's decoder, as the kernels' are."""
    ids = torch.randint(0, 256, (1, PROMPT + STEPS), generator=torch.Generator().manual_seed(0))
    ours, theirs = GrowingCache(), GrowingCache()
    with without_kernels(), torch.inference_mode():
        target = tiny_model(arch, dtype=dtype)  # loaded where the kernels do not run
        model, lean = target.model, target.decoder
        assert lean.specs is None and not kernels.attends(16, ids.float())
        assert_close(lean.forward(ids[:, :PROMPT], ours), hf(model, ids[:, :PROMPT], theirs, False), dtype)
        chain = ids[:, PROMPT:PROMPT + 3]  # cached keys and several queries: SDPA needs the causal mask
        assert_close(lean.forward(chain, ours), hf(model, chain, theirs, False), dtype)
        for i in range(PROMPT + 3, PROMPT + STEPS):
            step = ids[:, i:i + 1]
            assert_close(lean.forward(step, ours), hf(model, step, theirs, False), dtype)
    assert tiny(arch, dtype).decoder.specs is not None  # loaded where they run: the one-call stack


def test_stacked_siblings_are_views_of_their_weights():
    """q/k/v stacked into one weight whose row slices are the projections' own weights (same values, nothing
    stored twice): what the dense decoder of a loaded model streams."""
    target = tiny_model("qwen2")
    attn = target.model.get_decoder().layers[0].self_attn
    siblings = [attn.q_proj, attn.k_proj, attn.v_proj]
    weights, biases = [m.weight.detach().clone() for m in siblings], [m.bias.detach().clone() for m in siblings]
    stack = Stacked.of(siblings)
    assert torch.equal(stack.weight, torch.cat(weights)) and torch.equal(stack.bias, torch.cat(biases))
    assert stack.sizes == (64, 32, 32)
    for module, original, start in zip(siblings, weights, (0, 64, 96), strict=True):
        assert module.weight.data_ptr() == stack.weight[start].data_ptr() and torch.equal(module.weight, original)
    loaded = target.decoder.layers[1].projections.qkv.weight  # stacked when the model loaded
    assert attn.q_proj.weight.data_ptr() != loaded.data_ptr()  # layer 0 was stacked again above, layer 1 not
    assert target.model.get_decoder().layers[1].self_attn.q_proj.weight.data_ptr() == loaded.data_ptr()


@pytest.mark.parametrize("arch, weights", MODELS)
def test_body_rows_are_bit_independent(arch, weights):
    """A chain call, and a batch of rows on a one-row cache, give each token the bits it gets alone."""
    lean = tiny_model_of(arch, weights, torch.bfloat16).decoder
    ids = torch.randint(0, 256, (1, PROMPT + 8))
    with torch.inference_mode():
        alone, chain = GrowingCache(), GrowingCache()
        lean.forward(ids[:, :PROMPT], alone)
        lean.forward(ids[:, :PROMPT], chain)
        one = torch.cat([lean.forward(ids[:, i:i + 1], alone) for i in range(PROMPT, PROMPT + 8)], 1)
        assert torch.equal(lean.forward(ids[:, PROMPT:], chain), one)
        chain.keep(PROMPT, torch.empty(0, dtype=torch.long))
        rows = torch.stack([ids[0, PROMPT:], ids[0, PROMPT:].flip(0)])  # [2, 8]: the first row is the chain
        assert torch.equal(lean.forward(rows, chain)[:1], one)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch, weights", MODELS)
def test_one_call_layer_stack_gives_the_python_layers_bits(arch, weights, dtype, monkeypatch):
    """Decoding, tree and batch-verification calls run every layer in one C++ call (kernels.decoder_layers): the
    hidden states and the cache it leaves are bit-identical to the Python layers', past the sliding window too."""
    target = tiny_model_of(arch, weights, dtype)
    model, lean = target.model, target.decoder
    ran = _count_stack_calls(monkeypatch)
    assert lean.specs is not None

    def python_layers(*args, **kwargs):
        return _python_layers(lean, *args, **kwargs)

    ids = torch.randint(0, 256, (1, PROMPT + STEPS + 3))
    ours, theirs = GrowingCache(), GrowingCache()
    with torch.inference_mode():
        assert torch.equal(lean.forward(ids[:, :PROMPT], ours), python_layers(ids[:, :PROMPT], theirs))
        assert not ran  # a prefill fills the cache's buffers in Python first
        for i in range(PROMPT, PROMPT + STEPS):
            assert torch.equal(lean.forward(ids[:, i:i + 1], ours), python_layers(ids[:, i:i + 1], theirs))
        draft = Draft(ids[0, -2:], torch.tensor([-1, -1]))
        visible, depth = draft.attention()
        positions = ours.get_seq_length() + depth
        mask = TreeMasks.of(model)(visible, positions, positions, prefix=ours.get_seq_length())
        tree = ids[:, [-3, -2, -1]]
        assert torch.equal(lean.forward(tree, ours, positions[None], mask),
                           python_layers(tree, theirs, positions[None], mask))
        rows = torch.stack([ids[0, -3:], ids[0, -3:].flip(0)])  # a batch verification: rows on the one-row cache
        assert torch.equal(lean.forward(rows, ours), python_layers(rows, theirs))
        for cache in (ours, theirs):
            cache.keep_row(1, 2)  # the second row's first two entries
    assert len(ran) == STEPS + 2
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("arch, weights", MODELS)
def test_one_call_layer_stack_runs_rows_side_by_side(arch, weights, monkeypatch):
    """Rows with cache rows of their own, their own positions and masks (core/batched.py's decoding steps) run in
    the one-call stack too, with the Python layers' bits in the hidden states and the cache."""
    lean = tiny_model_of(arch, weights, torch.bfloat16).decoder
    ran = _count_stack_calls(monkeypatch)
    ids = torch.randint(0, 256, (3, PROMPT + STEPS))
    pads = torch.tensor([0, 2, 5])  # each row's first keys hidden, as padding is
    ours, theirs = GrowingCache(), GrowingCache()
    with torch.inference_mode():
        assert torch.equal(lean.forward(ids[:, :PROMPT], ours), _python_layers(lean, ids[:, :PROMPT], theirs))
        for i in range(PROMPT, PROMPT + STEPS):
            hidden = (torch.arange(i + 1)[None] < pads[:, None])[:, None, None]  # [3, 1, 1, K]
            mask = torch.zeros(hidden.shape, dtype=torch.bfloat16).masked_fill_(hidden, torch.finfo(torch.bfloat16).min)
            step = (ids[:, i:i + 1], ours, (i - pads)[:, None], mask)
            assert torch.equal(lean.forward(*step), _python_layers(lean, ids[:, i:i + 1], theirs, *step[2:]))
    assert len(ran) == STEPS
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert a.keys.shape[0] == 3 and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_batch_call_needs_no_room_in_the_buffers(monkeypatch):
    """Batch verification writes nothing into the cache, so rows whose entries would run past the buffers' capacity
    (256 positions after a 128-token prefill) still run in the one-call stack, with the Python layers' bits."""
    lean = tiny_model_of("qwen2", "gguf", torch.bfloat16).decoder
    ran = _count_stack_calls(monkeypatch)
    ids = torch.randint(0, 256, (1, 250))
    rows = torch.randint(0, 256, (2, 10))
    ours, theirs = GrowingCache(), GrowingCache()
    with torch.inference_mode():
        for cache in (ours, theirs):
            _python_layers(lean, ids[:, :128], cache)
            _python_layers(lean, ids[:, 128:], cache)
        assert ours.layers[0].key_buffer.shape[2] == 256 < 250 + rows.shape[1]
        assert torch.equal(lean.forward(rows, ours), _python_layers(lean, rows, theirs))
    assert len(ran) == 1


def _count_stack_calls(monkeypatch) -> list[int]:
    """A list that grows by one at every call of kernels.decoder_layers (the one-call layer stack)."""
    ran, stack = [], kernels.decoder_layers
    monkeypatch.setattr(kernels, "decoder_layers", lambda *args: ran.append(1) or stack(*args))
    return ran


def _python_layers(lean: Body, *args, **kwargs) -> torch.Tensor:
    """``lean.forward`` through its Python layers (the one-call stack switched off for the call)."""
    specs, lean.specs = lean.specs, None
    try:
        return lean.forward(*args, **kwargs)
    finally:
        lean.specs = specs


def test_forward_runs_the_decoder_the_model_loaded_with(monkeypatch):
    target = tiny("llama")
    calls = []
    monkeypatch.setattr(Body, "forward", lambda self, ids, *args: calls.append(1) or hf(target.model, ids, None))
    ids = torch.randint(0, 256, (1, 5))
    forward(target, ids)
    assert calls == [1]
    reference = stock(target)
    assert reference.backend == "hf" and reference.model is target.model and target.backend == "dense"
    forward(reference, ids)
    assert calls == [1]


def test_other_architectures_keep_hugging_faces_decoder(monkeypatch):
    model = tiny("llama").model
    monkeypatch.setattr(model.config, "model_type", "mistral")
    assert dense_backend(model) == "hf"
    with pytest.raises(ValueError, match="specnb's decoder covers"):
        build_decoder(model, "dense")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_norm_and_heads_kernels_round_like_pytorch(arch, dtype):
    """The norm kernel against the Hugging Face norm module; the rotary tables against Hugging Face's, bit for
    bit; the heads kernel against the norm plus Hugging Face's rotary embedding, on strided inputs (a slice of a
    fused projection)."""
    model, lean = tiny(arch, dtype).model, tiny(arch, dtype).decoder
    layer = model.get_decoder().layers[0]
    x = torch.randn(5, 64, dtype=dtype) * 3
    assert_close(lean.layers[0].norms.input(x), layer.input_layernorm(x), dtype)
    fused = torch.randn(1, 5, 3 * 64, dtype=dtype)
    q = fused[..., :64]  # rows strided by 3 * 64
    positions = torch.arange(7, 12)[None]
    from transformers.models.gemma3.modeling_gemma3 import apply_rotary_pos_emb

    rotary = model.get_decoder().rotary_emb
    for kind in lean.kinds:
        theirs = rotary(q, positions, kind) if arch == "gemma3" else rotary(q, positions)
        assert all(torch.equal(a, b) for a, b in zip(lean.rotary(positions, dtype)[kind], theirs, strict=True))
    cos, sin = lean.rotary(positions, dtype)["full_attention"]
    if arch == "gemma3":
        want = layer.self_attn.q_norm(q.reshape(1, 5, 4, 16)).transpose(1, 2)
        got = kernels.heads(q, 4, lean.layers[0].norms.q.scale, lean.layers[0].norms.q.eps, False, cos, sin)
    else:
        want = q.reshape(1, 5, 4, 16).transpose(1, 2)
        got = kernels.heads(q, 4, None, 0.0, False, cos, sin)
    want, _ = apply_rotary_pos_emb(want, want, cos, sin)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_rotary_rows_are_hugging_faces_wherever_a_call_starts(arch, dtype):
    """The body's rotary rows come from tables computed once: a call's span, and the rows of explicit positions,
    equal Hugging Face's rotary module computed for those positions alone, bit for bit, also past the first
    table's end (where it regrows)."""
    model, lean = tiny(arch, dtype).model, tiny(arch, dtype).decoder
    rotary = Rotary(lean.rotary.inv_freq, lean.rotary.scaling)  # empty tables
    theirs_of = model.get_decoder().rotary_emb
    x = torch.zeros(1, 1, 64, dtype=dtype)
    for start, S in [(0, 3), (7, 5), (3 * MIN_POSITIONS, 4)]:
        positions = torch.arange(start, start + S)[None]
        spans, rows = rotary.span(start, start + S, dtype, x.device), rotary(positions.flip(1), dtype)
        for kind in lean.kinds:
            theirs = theirs_of(x, positions, kind) if arch == "gemma3" else theirs_of(x, positions)
            assert all(torch.equal(a, b) for a, b in zip(spans[kind], theirs, strict=True))
            assert all(torch.equal(a, b.flip(1)) for a, b in zip(rows[kind], theirs, strict=True))


def test_timing_tables_are_keyed_by_the_body_too(monkeypatch):
    """Roofline tables timed before a change to the body (or without it) are not reused."""
    from specnb.core.roofline import cost_table_path

    target = tiny("gemma3")
    name = target.decoder.call_path()
    assert name.startswith(kernels.routed(target.model)) and "-body" in name
    assert name in cost_table_path(target).name
    monkeypatch.setattr("specnb.model.decoder._digest", lambda: "changed0")
    assert target.decoder.call_path() != name
    assert stock(target).decoder.call_path() == "" and "-body" not in cost_table_path(stock(target)).name


def test_a_family_specnb_does_not_cover_runs_on_hugging_faces_modules_said_once(tmp_path, capsys):
    """A local GPT-2 folder (a family specnb's decoder does not cover): it loads, one line on stderr says which
    modules run it (once per process), and speculation on it is lossless with drafts accepted."""
    from transformers import AutoModelForCausalLM, GPT2Config

    from specnb import generate, load_model
    from specnb.drafters.context import ContextNgramDrafter
    from specnb.model.models import _say_which_decoder, byte_tokenizer

    _say_which_decoder.cache_clear()
    config = GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=2, n_positions=256, bos_token_id=256,
                        eos_token_id=257)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    capsys.readouterr()
    target = load_model(str(tmp_path), dtype="float32")
    load_model(str(tmp_path), dtype="float32")
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specnb: ")]
    assert said == ["specnb: gpt2 models run on Hugging Face's modules (specnb's decoder covers gemma3_text, llama, "
                    "qwen2)"]
    assert target.backend == "hf" and target.weights == "bf16"
    prompt = "abcabcabc"
    ar = generate(target, prompt, max_new_tokens=20, stop_at_eos=False)
    for verify in ("tree", "batch"):
        out = generate(target, prompt, ContextNgramDrafter(k=2, w=4), max_new_tokens=20, verify=verify,
                       stop_at_eos=False)
        assert out.tokens == ar.tokens and out.stats.tokens_per_call > 1.0, verify


def test_loads_of_one_folder_share_its_tokenizer_until_a_file_changes(tmp_path):
    """Two loads of a local folder (two dtypes) and the store builders' tokenizer get one tokenizer object (a large
    vocabulary takes seconds to read); a folder whose tokenizer file changed is read again; a tokenizer no model
    holds any more is not kept."""
    import gc
    import os

    from specnb import load_model
    from specnb.datastores.corpus import load_tokenizer
    from specnb.model.models import _TOKENIZERS

    tiny("llama").model.save_pretrained(tmp_path)
    tiny("llama").tokenizer.save_pretrained(tmp_path)
    first, second = load_model(str(tmp_path), dtype="float32"), load_model(str(tmp_path), dtype="bfloat16")
    assert second.tokenizer is first.tokenizer and load_tokenizer(str(tmp_path)) is first.tokenizer
    stat = (tmp_path / "tokenizer.json").stat()
    os.utime(tmp_path / "tokenizer.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    third = load_model(str(tmp_path), dtype="float32")
    assert third.tokenizer is not first.tokenizer
    assert third.tokenizer("abc").input_ids == first.tokenizer("abc").input_ids
    del first, second, third
    gc.collect()
    assert not [key for key in _TOKENIZERS.keys() if key[0] == str(tmp_path.resolve())]

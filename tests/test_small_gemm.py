"""The small-row linear kernel: same numbers as F.linear, rows independent of each other, safe fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from specnb import small_gemm
from specnb.models import tiny_model

pytestmark = pytest.mark.skipif(small_gemm.library() is None, reason="no AVX2/FMA CPU or no C compiler")


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, small_gemm.MAX_ROWS), n=st.integers(1, 37), k=st.integers(1, 70),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_matches_torch_on_any_shape(rows, n, k, bias, seed):
    # n and k cover every remainder of the 4-row weight blocks and the 8-lane k loop
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    assert small_gemm.usable(x, w)
    torch.testing.assert_close(small_gemm.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_each_row_is_bit_identical_to_computing_it_alone(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(small_gemm.MAX_ROWS, 203, generator=g), torch.randn(301, 203, generator=g)
        together = small_gemm.linear(x, w)
        for rows in range(1, small_gemm.MAX_ROWS + 1):
            assert torch.equal(small_gemm.linear(x[:rows], w), together[:rows])
        alone = torch.cat([small_gemm.linear(x[i:i + 1], w) for i in range(x.shape[0])])
        assert torch.equal(alone, together)
    finally:
        torch.set_num_threads(previous)


def test_keeps_leading_dimensions():
    x, w = torch.randn(2, 3, 16), torch.randn(5, 16)
    out = small_gemm.linear(x, w)
    assert out.shape == (2, 3, 5)
    torch.testing.assert_close(out, F.linear(x, w))


def test_falls_back_where_the_kernel_does_not_apply():
    w = torch.randn(8, 16)
    assert not small_gemm.usable(torch.randn(small_gemm.MAX_ROWS + 1, 16), w)  # many rows: torch's GEMM
    assert not small_gemm.usable(torch.randn(2, 16, dtype=torch.bfloat16), w.bfloat16())
    assert not small_gemm.usable(torch.randn(2, 16), w.t().contiguous().t())  # a non-contiguous weight
    assert not small_gemm.usable(torch.randn(2, 0), torch.randn(8, 0))  # nothing to reduce over
    x = torch.randn(2, 16, requires_grad=True)
    assert not small_gemm.usable(x, w)
    small_gemm.linear(x, w).sum().backward()  # F.linear, so gradients still flow
    assert x.grad is not None
    with torch.no_grad():
        assert small_gemm.usable(x, w)


def test_install_routes_every_linear_and_keeps_the_model_output():
    loaded = tiny_model("qwen2")  # q/k/v projections with biases
    reference = tiny_model("qwen2")
    for module in reference.model.modules():  # undo the routing load time did: plain torch layers
        module.__dict__.pop("forward", None)
    assert small_gemm.routed(loaded.model).startswith("small-gemm-") and small_gemm.routed(reference.model) == ""
    ids = torch.randint(0, 256, (1, 9))
    with torch.inference_mode():
        for rows in (ids, ids[:, :1]):
            torch.testing.assert_close(loaded.model(rows).logits, reference.model(rows).logits,
                                       rtol=1e-4, atol=1e-4)
    assert small_gemm.install(reference.model.to(torch.bfloat16)) == 0  # other dtypes are left alone

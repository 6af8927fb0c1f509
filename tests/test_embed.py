"""Hidden-state extraction and the z-score -> PCA -> L2 key transform."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny

from specnb.datastores import embed
from specnb.datastores.corpus import TokenCorpus, TokenizerInfo
from specnb.datastores.embed import Projection, extract, fit_projection, next_tokens, row_layout, segments


def corpus_of(docs: list[list[int]], target) -> TokenCorpus:
    info, _ = TokenizerInfo.of(target)
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return TokenCorpus(np.concatenate([np.asarray(d, dtype=np.int32) for d in docs]), starts,
                       {"name": "test", "tokenizer": info.__dict__})


def test_rows_and_values_stay_inside_documents():
    starts = np.array([0, 5, 6, 9])  # documents of 5, 1 and 3 tokens
    tokens = np.arange(10, 19, dtype=np.int32)
    positions, ends = row_layout(starts)
    assert positions.tolist() == [0, 1, 2, 3, 6, 7]  # the last token of a document has no next token
    values = next_tokens(tokens, positions, ends, n_next=2, pad_id=-7)
    assert values[0].tolist() == [11, 12, 13]
    assert values[3].tolist() == [14, -7, -7]
    assert values[4].tolist() == [17, 18, -7]


def test_segments_cover_every_row_once_with_context_from_the_same_document():
    rng = np.random.default_rng(0)
    starts = np.concatenate([[0], np.cumsum(rng.integers(1, 40, 30))])
    positions, _ = row_layout(starts)
    covered = np.zeros(positions.shape[0], dtype=int)
    for seg in segments(starts, seq_len=7, overlap=3):
        doc = np.searchsorted(starts, seg.keep, side="right") - 1
        assert starts[doc] <= seg.context <= seg.keep < seg.end < starts[doc + 1]
        assert seg.keep - seg.context <= 3 and seg.end - seg.keep <= 7
        assert (positions[seg.row:seg.row + seg.end - seg.keep] == np.arange(seg.keep, seg.end)).all()
        covered[seg.row:seg.row + seg.end - seg.keep] += 1
    assert (covered == 1).all()


def test_extraction_matches_a_full_forward(tmp_path):
    target = tiny("gemma3")
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 256, n).tolist() for n in (30, 12, 45)]
    params = extract(target, corpus_of(docs, target), tmp_path, n_next=4, seq_len=64, overlap=0,
                     batch_tokens=128, progress=False)
    hidden = np.load(tmp_path / "hidden.f16.npy")
    assert hidden.shape == (params["rows"], 64) and params["rows"] == 29 + 11 + 44
    row = 0
    for doc in docs:  # segments are whole documents here: states equal one forward over the document
        with torch.inference_mode():
            ref = target.model(torch.tensor([doc]), output_hidden_states=True).hidden_states[-1][0, :-1]
        np.testing.assert_allclose(hidden[row:row + len(doc) - 1], ref.numpy(), rtol=1e-2, atol=1e-2)
        row += len(doc) - 1
    values = np.load(tmp_path / "values.i32.npy")
    assert values[0].tolist() == docs[0][1:6] and values[28].tolist() == [docs[0][29], 257, 257, 257, 257]


@pytest.mark.parametrize("measured", ["float32", "bfloat16"])
def test_bf16_extraction_runs_its_gemms_in_the_batch_dtype(monkeypatch, tmp_path, measured):
    """Batches of a bf16 model are GEMMs in the dtype this machine measured faster
    (specnb.model.kernels.cpu.batch_dtype)."""
    monkeypatch.setattr("specnb.model.kernels.cpu.batch_gemm_dtype", lambda: measured)
    target = tiny("llama", torch.bfloat16)
    gemms, real = set(), torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: gemms.add(x.dtype) or real(x, w, b))
    doc = np.random.default_rng(3).integers(0, 256, 300).tolist()
    extract(target, corpus_of([doc], target), tmp_path, n_next=2, seq_len=300, overlap=0, batch_tokens=300,
            progress=False)
    assert gemms == {getattr(torch, measured)}


def test_interrupted_extraction_resumes_to_the_same_result(tmp_path, monkeypatch):
    target = tiny("llama")
    rng = np.random.default_rng(2)
    corpus = corpus_of([rng.integers(0, 256, n).tolist() for n in (50, 40, 33, 20, 64)], target)
    kwargs = dict(n_next=3, seq_len=16, overlap=4, batch_tokens=20, progress=False)
    extract(target, corpus, tmp_path / "ref", **kwargs)

    real = embed.last_hidden_states
    calls = {"n": 0}

    def flaky(*args, **kw):
        calls["n"] += 1
        if calls["n"] > 9:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(embed, "last_hidden_states", flaky)
    with pytest.raises(KeyboardInterrupt):
        extract(target, corpus, tmp_path / "run", **kwargs)
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["batches_done"] == 8
    assert not (tmp_path / "run" / "extract.json").exists()
    monkeypatch.setattr(embed, "last_hidden_states", real)
    extract(target, corpus, tmp_path / "run", **kwargs)
    np.testing.assert_array_equal(np.load(tmp_path / "run" / "hidden.f16.npy"),
                                  np.load(tmp_path / "ref" / "hidden.f16.npy"))


def reference_keys(x: np.ndarray, c: int, dims: int, znorm: bool) -> tuple[np.ndarray, np.ndarray]:
    """Textbook pipeline: z-score, PCA by SVD of the centred data, first dims components, unit length."""
    mean = x.mean(0)
    z = (x - mean) / (np.sqrt(x.var(0) + 1e-6) if znorm else 1.0)
    z = z - z.mean(0)
    _, s, vt = np.linalg.svd(z, full_matrices=False)
    ratio = s**2 / (s**2).sum()
    keys = z @ vt[:dims].T
    return keys / np.linalg.norm(keys, axis=1, keepdims=True), ratio[:c]


@pytest.mark.parametrize("znorm", [True, False])
def test_projection_matches_a_reference_computation(znorm):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3000, 24)) @ rng.standard_normal((24, 24)) * rng.uniform(0.1, 5, 24)
         + rng.uniform(-3, 3, 24)).astype(np.float32)
    proj = fit_projection(x, n_components=16, dims=6, znorm=znorm)
    keys = proj(x)
    ref, ratio = reference_keys(x.astype(np.float64), 16, 6, znorm)
    signs = np.sign((keys * ref).sum(0))  # components are defined up to sign
    np.testing.assert_allclose(keys, ref * signs, atol=2e-3)
    np.testing.assert_allclose(proj.explained_variance_ratio, ratio, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(keys, axis=1), 1.0, rtol=1e-5)
    assert (proj.scale == 1).all() != znorm


def test_projection_options_and_round_trip(tmp_path):
    x = np.random.default_rng(4).standard_normal((500, 10)).astype(np.float32)
    proj = fit_projection(x, n_components=256, dims=64)
    assert proj.components.shape == (10, 10) and proj.dims == 10  # capped at d
    with pytest.raises(ValueError, match=r"^8 sample vectors cannot fit 10 principal components \(--components\)"):
        fit_projection(x[:8], n_components=256, dims=4)  # fewer vectors than components: one line, not sklearn's
    raw = proj.with_dims(4, l2=False)(x)
    assert raw.shape == (500, 4) and not np.allclose(np.linalg.norm(raw, axis=1), 1)
    proj.save(tmp_path / "p.npz")
    again = Projection.load(tmp_path / "p.npz")
    np.testing.assert_array_equal(again(x[:5]), proj(x[:5]))
    np.testing.assert_allclose(proj.transform(x.astype(np.float16), chunk=7), proj(x.astype(np.float16)), atol=1e-6)
    with pytest.raises(ValueError, match="dims"):
        proj.with_dims(11)


def eigh_projection(x: np.ndarray, n_components: int, znorm: bool, eps: float = 1e-6) -> tuple[np.ndarray, ...]:
    """The projection as specnb fitted it before scikit-learn: float64 moments, eigh of the covariance, the
    largest-magnitude entry of each component positive. Returns (mean, scale, components, ratio)."""
    mean, var = x.mean(0), x.var(0)
    scale = np.sqrt(var + eps) if znorm else np.ones(x.shape[1])
    z = (x - mean) / scale
    eigvals, eigvecs = np.linalg.eigh(z.T @ z / (x.shape[0] - 1))
    eigvals, components = eigvals[::-1], eigvecs[:, ::-1][:, :n_components].T
    components = components * np.sign(components[np.arange(n_components), np.abs(components).argmax(1)])[:, None]
    return mean, scale, components, eigvals[:n_components] / eigvals.sum()


@pytest.mark.parametrize("znorm", [True, False])
@pytest.mark.parametrize("incremental", [False, True])
def test_scikit_learn_projection_matches_the_eigh_projection(znorm, incremental):
    """StandardScaler + PCA give the same transform as the former hand-written fit, signs included, to 1e-5
    (IncrementalPCA, used when the sample is large, too: with every component kept it is exact)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2000, 12)) @ rng.standard_normal((12, 12)) * rng.uniform(0.1, 5, 12)
         + rng.uniform(-3, 3, 12)).astype(np.float32)
    c = 12 if incremental else 8
    proj = fit_projection(x, n_components=c, dims=6, znorm=znorm, chunk=500, max_bytes=0 if incremental else 2**30)
    mean, scale, components, ratio = eigh_projection(x.astype(np.float64), c, znorm)
    np.testing.assert_allclose(proj.mean, mean, atol=1e-5)
    np.testing.assert_allclose(proj.scale, scale, rtol=1e-5)
    np.testing.assert_allclose(proj.components, components, atol=1e-5)
    np.testing.assert_allclose(proj.explained_variance_ratio, ratio, atol=1e-5)
    expected = (x - mean) / scale @ components[:6].T
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(proj(x), expected, atol=1e-5)

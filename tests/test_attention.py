"""coursekit.attention against torch's own implementations and true properties."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from coursekit import attention as A
from tests.conftest import assert_close

DTYPES = [torch.float64, torch.float32]


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_matches_torch(dtype, dim):
    x = rand(3, 4, 5, dtype=dtype) * 4
    assert_close(A.softmax(x, dim=dim), torch.softmax(x, dim=dim))


def test_softmax_is_stable_where_the_naive_formula_overflows():
    x = torch.tensor([1000.0, 1001.0, 1002.0])
    naive = torch.exp(x) / torch.exp(x).sum()
    assert torch.isnan(naive).all()  # the failure the max shift prevents
    assert_close(A.softmax(x), torch.softmax(x, dim=-1))


def test_softmax_fully_masked_row_is_zero_not_nan():
    x = torch.tensor([[0.0, -math.inf], [-math.inf, -math.inf]])
    assert torch.isnan(torch.softmax(x, -1)[1]).all()  # what torch.softmax does
    assert torch.equal(A.softmax(x), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_softmax_worked_example_from_docstring():
    assert_close(A.softmax(torch.tensor([0.0, math.log(3.0)])), torch.tensor([0.25, 0.75]))


def test_softmax_gradcheck():
    x = rand(3, 5).requires_grad_()
    assert torch.autograd.gradcheck(A.softmax, (x,))


def test_softmax_rejects_integer_input():
    with pytest.raises(TypeError, match="floating tensor"):
        A.softmax(torch.arange(3))


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
@pytest.mark.parametrize("T,S,D,Dv", [(1, 1, 4, 4), (5, 7, 8, 3), (6, 6, 16, 16)])
def test_attention_matches_torch_sdpa(dtype, batch, T, S, D, Dv):
    q, k, v = (
        rand(*batch, T, D, dtype=dtype, seed=1),
        rand(*batch, S, D, dtype=dtype, seed=2),
        rand(*batch, S, Dv, dtype=dtype, seed=3),
    )
    out, w = A.scaled_dot_product_attention(q, k, v)
    assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert w.shape == (*batch, T, S)
    assert_close(w.sum(-1), torch.ones(*batch, T, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_with_boolean_mask_matches_torch(dtype):
    q, k, v = (
        rand(2, 3, 4, 8, dtype=dtype),
        rand(2, 3, 6, 8, dtype=dtype, seed=1),
        rand(2, 3, 6, 5, dtype=dtype, seed=2),
    )
    mask = torch.rand(2, 1, 4, 6, generator=torch.Generator().manual_seed(4)) < 0.5  # broadcast over heads
    out, w = A.scaled_dot_product_attention(q, k, v, mask=mask)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert (w.masked_select(~mask.expand_as(w)) == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_with_additive_mask_matches_torch(dtype):
    q, k, v = (
        rand(2, 4, 8, dtype=dtype),
        rand(2, 6, 8, dtype=dtype, seed=1),
        rand(2, 6, 5, dtype=dtype, seed=2),
    )
    bias = rand(4, 6, dtype=dtype, seed=5)
    bias[0, :3] = -math.inf
    out, _ = A.scaled_dot_product_attention(q, k, v, mask=bias)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_causal_matches_torch(dtype):
    q, k, v = (
        rand(2, 7, 8, dtype=dtype),
        rand(2, 7, 8, dtype=dtype, seed=1),
        rand(2, 7, 8, dtype=dtype, seed=2),
    )
    out, _ = A.scaled_dot_product_attention(q, k, v, mask=A.causal_mask(7))
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_attention_custom_scale_matches_torch():
    q, k, v = rand(2, 4, 8), rand(2, 5, 8, seed=1), rand(2, 5, 3, seed=2)
    out, _ = A.scaled_dot_product_attention(q, k, v, scale=0.7)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.7))


def test_boolean_and_additive_masks_agree():
    q, k, v = rand(4, 6), rand(6, 6, seed=1), rand(6, 2, seed=2)
    mask = A.causal_mask(4, 6)
    a, _ = A.scaled_dot_product_attention(q, k, v, mask=mask)
    b, _ = A.scaled_dot_product_attention(q, k, v, mask=A.bool_to_additive(mask, torch.float64))
    assert_close(a, b)


def test_fully_masked_query_gets_zero_output_like_torch():
    q, k, v = rand(3, 4), rand(5, 4, seed=1), rand(5, 2, seed=2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, w = A.scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(out[1], torch.zeros(2, dtype=torch.float64))
    assert torch.equal(w[1], torch.zeros(5, dtype=torch.float64))
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_permutation_equivariance():
    """Without positions, permuting the tokens permutes the outputs the same way."""
    torch.manual_seed(0)
    layer = A.SelfAttention(8, 4).double()
    x = rand(2, 6, 8)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(1))
    out, _ = layer(x)
    out_p, _ = layer(x[:, perm])
    assert_close(out_p, out[:, perm])


def test_causal_outputs_ignore_future_tokens():
    torch.manual_seed(0)
    layer = A.SelfAttention(8, 4).double()
    x = rand(2, 6, 8)
    y = x.clone()
    y[:, 3:] = rand(2, 3, 8, seed=9)
    a, _ = layer(x, mask=A.causal_mask(6))
    b, _ = layer(y, mask=A.causal_mask(6))
    assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_attention_gradcheck_with_mask():
    q, k, v = (rand(2, 3, 4, seed=s).requires_grad_() for s in range(3))
    mask = A.causal_mask(3)
    assert torch.autograd.gradcheck(
        lambda q, k, v: A.scaled_dot_product_attention(q, k, v, mask)[0], (q, k, v)
    )


@pytest.mark.parametrize(
    "shapes,message",
    [
        (((2, 4, 8), (2, 5, 6), (2, 5, 6)), "q and k must share their last dimension"),
        (((2, 4, 8), (2, 5, 8), (2, 6, 8)), "k and v must have the same number of keys"),
        (((2, 4, 8), (3, 5, 8), (3, 5, 8)), "batch"),
        (((8,), (5, 8), (5, 8)), "q must have shape"),
    ],
)
def test_bad_shapes_give_clear_errors(shapes, message):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        A.scaled_dot_product_attention(q, k, v)


def test_bad_mask_and_dtype_errors():
    q = torch.zeros(2, 4, 8)
    with pytest.raises(ValueError, match=r"must broadcast to the scores' shape"):
        A.scaled_dot_product_attention(q, q, q, mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="boolean .* or floating"):
        A.scaled_dot_product_attention(q, q, q, mask=torch.ones(4, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="share a dtype"):
        A.scaled_dot_product_attention(q, q.double(), q)
    with pytest.raises(TypeError, match="floating tensor"):
        A.scaled_dot_product_attention(q.long(), q.long(), q.long())
    with pytest.raises(TypeError, match=r"additive mask must have the dtype of q.*mask.to\(torch.float32\)"):
        A.scaled_dot_product_attention(q, q, q, mask=torch.zeros(4, 4, dtype=torch.float64))


def test_bilinear_scores_start_with_unit_variance():
    torch.manual_seed(0)
    bil = A.BilinearScore(64, 32)
    q, k = torch.randn(4000, 64), torch.randn(4000, 32)
    var = (q[:, None, :] @ bil.W @ k[:, :, None]).var().item()
    assert 0.8 < var < 1.25, var


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("T,S", [(1, 1), (4, 4), (3, 7), (1, 5)])
def test_causal_mask_matches_torch_lower_right(T, S):
    expected = causal_lower_right(T, S)._materialize(torch.device("cpu"))
    assert torch.equal(A.causal_mask(T, S), expected)


def test_causal_mask_square_is_lower_triangular_and_errors():
    assert torch.equal(A.causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="0 <= T <= S"):
        A.causal_mask(5, 3)


def test_padding_mask_and_error():
    assert torch.equal(A.padding_mask([2, 3]), torch.tensor([[True, True, False], [True, True, True]]))
    assert A.padding_mask([1], S=4).shape == (1, 4)
    with pytest.raises(ValueError, match="shorter than the longest"):
        A.padding_mask([5], S=3)
    with pytest.raises(ValueError, match="integer"):
        A.padding_mask(torch.tensor([1.5]))


def test_padding_mask_matches_multihead_attention_key_padding_mask():
    """Our mask, converted, gives nn.MultiheadAttention the same result as SDPA gives us."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 1, batch_first=True, bias=False).double().eval()
    x = rand(2, 5, 8)
    keep = A.padding_mask([3, 5], S=5)  # (B, S), True = real token
    expected, _ = mha(x, x, x, key_padding_mask=~keep)
    assert torch.equal(A.from_key_padding_mask(~keep), keep)
    Wq, Wk, Wv = mha.in_proj_weight.chunk(3)
    out, _ = A.scaled_dot_product_attention(x @ Wq.T, x @ Wk.T, x @ Wv.T, mask=keep[:, None, :])
    assert_close(out @ mha.out_proj.weight.T, expected)


def test_mask_conversions_round_trip():
    mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) < 0.5
    additive = A.bool_to_additive(mask)
    assert set(additive.unique().tolist()) <= {0.0, -math.inf}
    assert torch.equal(A.additive_to_bool(additive), mask)
    with pytest.raises(ValueError, match="finite non-zero"):
        A.additive_to_bool(torch.tensor([0.0, -1.0]))
    with pytest.raises(TypeError):
        A.bool_to_additive(torch.zeros(2))


# --------------------------------------------------------------------------- score functions


def test_score_functions():
    q, k = rand(2, 3, 4), rand(2, 5, 4, seed=1)
    assert_close(A.dot_scores(q, k), torch.einsum("btd,bsd->bts", q, k))
    assert_close(A.scaled_dot_scores(q, k), A.dot_scores(q, k) / 2.0)
    torch.manual_seed(0)
    bil = A.BilinearScore(4, 6).double()
    k6 = rand(2, 5, 6, seed=2)
    assert_close(bil(q, k6), torch.einsum("btd,de,bse->bts", q, bil.W, k6))
    add = A.AdditiveScore(4, 6, 7).double()
    expected = torch.stack(
        [
            torch.stack([add.w(torch.tanh(add.W_q(q[b, t]) + add.W_k(k6[b, s]))).squeeze() for s in range(5)])
            for b in range(2)
            for t in range(3)
        ]
    ).view(2, 3, 5)
    assert_close(add(q, k6), expected)


def test_bilinear_with_identity_is_dot():
    bil = A.BilinearScore(4, 4).double()
    with torch.no_grad():
        bil.W.copy_(torch.eye(4))
    q, k = rand(3, 4), rand(5, 4, seed=1)
    assert_close(bil(q, k), A.dot_scores(q, k))


def test_self_attention_matches_manual_and_rejects_bad_input():
    torch.manual_seed(0)
    layer = A.SelfAttention(8, 4).double()
    x = rand(2, 5, 8)
    out, w = layer(x)
    q, k, v = layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)
    assert_close(out, F.scaled_dot_product_attention(q, k, v))
    assert sum(p.numel() for p in layer.parameters()) == 3 * (8 * 4 + 4)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 8\)"):
        layer(torch.zeros(2, 5, 7, dtype=torch.float64))


@pytest.mark.parametrize("block", [1, 2, 3, 7, 16, 40])
def test_online_softmax_equals_torch_softmax_for_every_block_size(block):
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(block)) * 20
    x[0, 0] = -math.inf  # a fully masked row gives zeros, as our softmax does
    x[1, 2, :block] = -math.inf  # a first block that is all -inf
    expected = torch.softmax(x, dim=-1).nan_to_num(0.0)
    torch.testing.assert_close(A.online_softmax(x, block), expected, rtol=1e-12, atol=1e-15)


def test_score_variance_follows_the_theory_and_its_generator():
    """Var(q . k) = D for independent standard-normal entries, 1 after scaling by 1/sqrt(D) (within six
    standard deviations of the sample variance at n = 20,000); the same seed, the same value."""
    for D in (1, 16, 256):
        raw = A.score_variance(D, 20_000, torch.Generator().manual_seed(D))
        scaled = A.score_variance(D, 20_000, torch.Generator().manual_seed(D), scaled=True)
        assert abs(raw / D - 1) < 0.12 and abs(scaled - 1) < 0.12
        assert raw == pytest.approx(scaled * D, rel=1e-12)  # the same draws, scaled
    with pytest.raises(ValueError, match="D >= 1 and n >= 2"):
        A.score_variance(0, 10, torch.Generator())

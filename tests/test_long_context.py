"""coursekit.long_context against naive attention, brute-force masks, explicit recurrences,
Hugging Face's mask functions and true properties."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from coursekit import attention as A
from coursekit import gpt, multihead, positional
from coursekit import long_context as lc
from tests.conftest import assert_close


def rand(*shape, dtype=torch.float64, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def naive(q, k, v, causal=False, mask=None):
    """Plain attention from Chapter 1, with the bottom-right causal mask."""
    if causal:
        c = A.causal_mask(q.shape[-2], k.shape[-2])
        mask = c if mask is None else mask & c
    return A.scaled_dot_product_attention(q, k, v, mask=mask)[0]


# --------------------------------------------------------------------------- tiled attention

SHAPES = [((2, 3, 37, 16), (2, 3, 45, 16), 8), ((1, 1, 64, 8), (1, 1, 64, 8), 8), ((5, 9, 4), (5, 9, 4), 6)]
BLOCKS = [(1, 1), (5, 7), (16, 4), (64, 64), (100, 3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qs,ks,dv", SHAPES)
@pytest.mark.parametrize("bq,bk", BLOCKS)
def test_tiled_equals_naive_attention_in_float64(qs, ks, dv, causal, bq, bk):
    q, k, v = rand(*qs, seed=1), rand(*ks, seed=2), rand(*ks[:-1], dv, seed=3)
    assert_close(lc.tiled_attention(q, k, v, causal=causal, block_q=bq, block_k=bk), naive(q, k, v, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_equals_torch_sdpa_including_bottom_right_causal(causal):
    q, k, v = rand(2, 4, 33, 16, seed=4), rand(2, 4, 50, 16, seed=5), rand(2, 4, 50, 16, seed=6)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=causal_lower_right(33, 50) if causal else None
    )
    assert_close(lc.tiled_attention(q, k, v, causal=causal, block_q=8, block_k=16), expected)


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_float32_within_1e6_of_naive(causal):
    q, k, v = (rand(2, 4, 300, 64, dtype=torch.float32, seed=s) for s in (7, 8, 9))
    out = lc.tiled_attention(q, k, v, causal=causal, block_q=64, block_k=48)
    torch.testing.assert_close(out, naive(q, k, v, causal), rtol=0, atol=1e-6)


def test_tiled_is_stable_with_scores_that_overflow_exp():
    """Scores grow along the keys up to 2400: exp overflows unless the running max follows them."""
    q = torch.full((1, 6, 4), 10.0, dtype=torch.float64)
    k = torch.linspace(0, 60, 40, dtype=torch.float64)[None, :, None].expand(1, 40, 4)  # scores 40 * linspace
    v = rand(1, 40, 3, seed=11)
    out = lc.tiled_attention(q, k, v, block_q=4, block_k=8, scale=1.0)
    assert out.isfinite().all()
    assert_close(out, A.scaled_dot_product_attention(q, k, v, scale=1.0)[0])


def test_tiled_with_a_boolean_mask_and_fully_masked_rows_gives_zeros_not_nan():
    q, k, v = rand(2, 2, 10, 8, seed=12), rand(2, 2, 13, 8, seed=13), rand(2, 2, 13, 5, seed=14)
    lengths = torch.tensor([13, 6])
    mask = A.padding_mask(lengths, 13)[:, None, None, :]  # (B, 1, 1, S) key padding
    assert_close(lc.tiled_attention(q, k, v, mask=mask, block_q=3, block_k=4), naive(q, k, v, mask=mask))
    full = torch.rand(10, 13, generator=torch.Generator().manual_seed(0)) < 0.5
    full[[2, 7]] = False  # queries 2 and 7 may attend to nothing
    out = lc.tiled_attention(q, k, v, causal=True, mask=full, block_q=4, block_k=4)
    assert out.isfinite().all()
    assert torch.equal(out[..., [2, 7], :], torch.zeros_like(out[..., [2, 7], :]))
    assert_close(out, naive(q, k, v, causal=True, mask=full))


def test_tiled_causal_masks_future_keys_and_skips_future_tiles():
    """Nine queries at positions 3..11 of twelve keys, tiles of 4. NaN keys at positions 9..11 are
    masked for the queries before them; NaN *values* there can only be avoided by skipping the
    tile of keys 8..11, which lies entirely in the future of the first query tile (positions 3..6)."""
    q, k, v = rand(1, 9, 8, seed=15), rand(1, 12, 8, seed=16), rand(1, 12, 8, seed=17)
    clean = lc.tiled_attention(q, k, v, causal=True, block_q=4, block_k=4)
    assert_close(clean, naive(q, k, v, causal=True))
    bad_k, bad_v = k.clone(), v.clone()
    bad_k[:, 9:], bad_v[:, 8:] = float("nan"), float("nan")
    out = lc.tiled_attention(q, bad_k, v, causal=True, block_q=4, block_k=4)
    assert out[:, :6].isfinite().all() and out[:, 6:].isnan().all()
    assert_close(out[:, :6], clean[:, :6])
    out = lc.tiled_attention(q, k, bad_v, causal=True, block_q=4, block_k=4)
    assert_close(out[:, :4], clean[:, :4])  # the skipped tile was never read


def test_tiled_gradcheck_on_tiny_shapes():
    q, k, v = (rand(1, 2, 5, 3, seed=s).requires_grad_() for s in (18, 19, 20))
    assert torch.autograd.gradcheck(lambda *a: lc.tiled_attention(*a, block_q=2, block_k=2), (q, k, v))
    assert torch.autograd.gradcheck(
        lambda *a: lc.tiled_attention(*a, causal=True, block_q=3, block_k=2), (q, k, v)
    )


def test_tiled_gradients_equal_naive_gradients_with_masked_rows():
    mask = torch.ones(7, 9, dtype=torch.bool)
    mask[3] = False
    grads = []
    for fn in (
        lambda q, k, v: lc.tiled_attention(q, k, v, causal=True, mask=mask, block_q=3, block_k=4),
        lambda q, k, v: naive(q, k, v, causal=True, mask=mask),
    ):
        q, k, v = (
            rand(2, 7, 4, seed=21).requires_grad_(),
            rand(2, 9, 4, seed=22).requires_grad_(),
            rand(2, 9, 4, seed=23).requires_grad_(),
        )
        (fn(q, k, v) * rand(2, 7, 4, seed=24)).sum().backward()
        grads.append((q.grad, k.grad, v.grad))
    for a, b in zip(*grads):
        assert a.isfinite().all()
        assert_close(a, b)


def test_tiled_bad_inputs():
    q = rand(2, 4, 8)
    with pytest.raises(ValueError, match="block sizes must be positive"):
        lc.tiled_attention(q, q, q, block_q=0)
    with pytest.raises(TypeError, match="boolean mask"):
        lc.tiled_attention(q, q, q, mask=torch.zeros(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        lc.tiled_attention(q, q[:, :2], q[:, :2], causal=True)
    with pytest.raises(ValueError, match="share their last dimension"):
        lc.tiled_attention(q, rand(2, 4, 6), rand(2, 4, 6))


# --------------------------------------------------------------------------- sliding window and sparse patterns


def brute(T, S, allowed):
    """A (T, S) mask from a predicate on (query position, key position), bottom-right aligned."""
    return torch.tensor(
        [bool(allowed(i + S - T, j)) for i in range(T) for j in range(S)], dtype=torch.bool
    ).view(T, S)


@pytest.mark.parametrize(
    "T,S,W", [(6, 6, 1), (6, 6, 2), (6, 6, 3), (9, 9, 4), (4, 10, 3), (5, 7, 20), (1, 8, 3), (0, 3, 2)]
)
def test_sliding_window_mask_brute_force_and_hugging_face(T, S, W):
    from transformers.masking_utils import sliding_window_causal_mask_function

    mask = lc.sliding_window_mask(T, W, S)
    assert torch.equal(mask, brute(T, S, lambda p, j: p - W < j <= p))
    hf = sliding_window_causal_mask_function(W)
    q_idx = torch.arange(T)[:, None] + S - T  # HF takes absolute query positions (cache_position)
    assert torch.equal(mask, hf(0, 0, q_idx, torch.arange(S)[None, :]).expand(T, S))
    assert torch.equal(mask.sum(-1), (q_idx[:, 0] + 1).clamp(max=W))  # min(p + 1, W) keys each


def test_sliding_window_mask_limits():
    assert torch.equal(lc.sliding_window_mask(7, 7), A.causal_mask(7))
    assert torch.equal(lc.sliding_window_mask(4, 100, 9), A.causal_mask(4, 9))
    assert torch.equal(lc.sliding_window_mask(5, 1), torch.eye(5, dtype=torch.bool))
    assert torch.equal(lc.sliding_window_mask(3, 2, 8), lc.sliding_window_mask(8, 2)[-3:])  # bottom-right
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="window must be a positive integer"):
            lc.sliding_window_mask(4, bad)
    with pytest.raises(ValueError, match="0 <= T <= S"):
        lc.sliding_window_mask(5, 2, 3)


@pytest.mark.parametrize("H,H_kv", [(2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("W", [1, 3, 8, 30])
def test_rolling_cache_decoding_equals_windowed_full_attention(H, H_kv, W):
    q, k, v = rand(2, H, 20, 8, seed=30), rand(2, H_kv, 20, 8, seed=31), rand(2, H_kv, 20, 8, seed=32)
    full = A.scaled_dot_product_attention(
        q,
        multihead.repeat_kv(k, H // H_kv),
        multihead.repeat_kv(v, H // H_kv),
        mask=lc.sliding_window_mask(20, W),
    )[0]
    assert_close(lc.sliding_window_decode(q, k, v, W), full)


def test_rolling_cache_is_a_ring_buffer_of_constant_size():
    cache = lc.RollingKVCache(1, 2, 3, 4, dtype=torch.float16)
    assert cache.nbytes == lc.kv_cache_size(1, 2, 4, 100, batch=1, dtype=torch.float16, window=3)
    seen = []
    for t in range(7):
        k = torch.full((1, 2, 1, 4), float(t), dtype=torch.float16)
        keys, _, valid = cache.update(k, -k)
        seen.append(valid.sum().item())
    assert seen == [1, 2, 3, 3, 3, 3, 3]
    assert keys[0, 0, :, 0].tolist() == [6.0, 4.0, 5.0]  # token t sits in slot t % 3
    assert cache.nbytes == 2 * 2 * 3 * 4 * 2
    with pytest.raises(ValueError, match="one token"):
        cache.update(
            torch.zeros(1, 2, 2, 4, dtype=torch.float16), torch.zeros(1, 2, 2, 4, dtype=torch.float16)
        )
    with pytest.raises(ValueError, match="window must be positive"):
        lc.RollingKVCache(1, 1, 0, 4)


@pytest.mark.parametrize("T,s", [(1, 1), (10, 1), (10, 3), (16, 4), (17, 5)])
def test_strided_mask_brute_force(T, s):
    assert torch.equal(
        lc.strided_mask(T, s), brute(T, T, lambda i, j: j <= i and (i - j < s or (i - j) % s == 0))
    )


@pytest.mark.parametrize("T,l,c", [(10, 1, 1), (12, 4, 1), (13, 4, 2), (9, 3, 3)])
def test_fixed_mask_brute_force(T, l, c):
    expected = brute(T, T, lambda i, j: j <= i and (i // l == j // l or j % l >= l - c))
    assert torch.equal(lc.fixed_mask(T, l, c), expected)


@pytest.mark.parametrize("pattern", [lambda T: lc.strided_mask(T, 4), lambda T: lc.fixed_mask(T, 4, 1)])
def test_sparse_patterns_connect_every_pair_in_two_steps(pattern):
    """Child et al.'s factorisation: with both heads, any earlier key reaches any query in two hops."""
    M = pattern(23).double()
    two_hops = (M @ M) > 0
    assert torch.equal(two_hops, A.causal_mask(23))


@pytest.mark.parametrize("T,r,g", [(10, 1, []), (10, 2, [0]), (12, 0, [0, 5, 11]), (7, 10, [3])])
def test_longformer_mask_brute_force(T, r, g):
    expected = brute(T, T, lambda i, j: abs(i - j) <= r or i in g or j in g)
    assert torch.equal(lc.longformer_mask(T, r, g), expected)
    assert torch.equal(lc.longformer_mask(T, r, torch.tensor(g, dtype=torch.long)), expected)


def test_pattern_bad_inputs():
    with pytest.raises(ValueError, match="stride must be positive"):
        lc.strided_mask(5, 0)
    with pytest.raises(ValueError, match="1 <= summary <= block"):
        lc.fixed_mask(5, 2, 3)
    with pytest.raises(ValueError, match="global positions must lie in 0 .. 4"):
        lc.longformer_mask(5, 1, [5])
    with pytest.raises(ValueError, match="radius must be non-negative"):
        lc.longformer_mask(5, -1)
    with pytest.raises(ValueError, match="pattern must be one of"):
        lc.attended_pairs("dilated", 5)


PAIR_CASES = [
    ("full", {}, lambda T: torch.ones(T, T, dtype=torch.bool)),
    ("causal", {}, A.causal_mask),
    ("sliding_window", {"window": 1}, lambda T: lc.sliding_window_mask(T, 1)),
    ("sliding_window", {"window": 7}, lambda T: lc.sliding_window_mask(T, 7)),
    ("strided", {"stride": 5}, lambda T: lc.strided_mask(T, 5)),
    ("strided", {"stride": 1}, lambda T: lc.strided_mask(T, 1)),
    ("fixed", {"block": 6, "summary": 2}, lambda T: lc.fixed_mask(T, 6, 2)),
    ("fixed", {"block": 4}, lambda T: lc.fixed_mask(T, 4)),
    ("longformer", {"radius": 3, "global_positions": [0, 20]}, lambda T: lc.longformer_mask(T, 3, [0, 20])),
    ("longformer", {"radius": 0}, lambda T: lc.longformer_mask(T, 0)),
]


@pytest.mark.parametrize("pattern,params,make", PAIR_CASES, ids=lambda c: c if isinstance(c, str) else None)
@pytest.mark.parametrize("T", [21, 64, 97])
def test_attended_pairs_equals_mask_sum(pattern, params, make, T):
    assert lc.attended_pairs(pattern, T, **params) == int(make(T).sum())


def test_attended_pairs_closed_forms():
    T, W = 10_000, 128
    assert lc.attended_pairs("causal", T) == T * (T + 1) // 2
    assert lc.attended_pairs("sliding_window", T, window=W) == T * W - W * (W - 1) // 2  # O(T W), not O(T^2)
    assert lc.attended_pairs("sliding_window", 4, window=2) == 7  # the docstring's example
    s = 100  # stride sqrt(T): about 2 sqrt(T) keys per query
    assert lc.attended_pairs("strided", T, stride=s) < 2 * s * T


# --------------------------------------------------------------------------- linear attention


def recurrent_reference(q, k, v, eps):
    """Linear attention as an RNN, one token at a time: S += phi(k)^T v, z += phi(k)."""
    phi = lambda x: F.elu(x) + 1  # noqa: E731
    S = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    z = torch.zeros(*q.shape[:-2], q.shape[-1], dtype=q.dtype)
    out = []
    for t in range(q.shape[-2]):
        S = S + phi(k[..., t, :]).unsqueeze(-1) * v[..., t, :].unsqueeze(-2)
        z = z + phi(k[..., t, :])
        qt = phi(q[..., t, :])
        out.append((qt.unsqueeze(-2) @ S).squeeze(-2) / ((qt * z).sum(-1, keepdim=True) + eps))
    return torch.stack(out, dim=-2)


def test_elu_feature_map_is_positive_everywhere():
    x = torch.linspace(-30, 30, 601, dtype=torch.float64)
    assert_close(lc.elu_feature_map(x), F.elu(x) + 1)
    far = torch.tensor([-700.0, -100.0, -40.0], dtype=torch.float64)
    assert (F.elu(far) + 1 == 0).all()  # the textbook formula rounds to 0 here
    assert (lc.elu_feature_map(far) > 0).all() and (lc.elu_feature_map(far.float()[1:]) > 0).all()
    assert torch.autograd.gradcheck(lc.elu_feature_map, (rand(20, seed=39, scale=3).requires_grad_(),))


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("shape", [(2, 3, 17, 8, 5), (1, 9, 4, 4)])
def test_causal_linear_attention_forms_agree(shape, eps):
    *lead, T, D, Dv = shape
    q, k, v = rand(*lead, T, D, seed=40), rand(*lead, T, D, seed=41), rand(*lead, T, Dv, seed=42)
    prefix = lc.causal_linear_attention(q, k, v, eps=eps)
    assert_close(prefix, lc.linear_attention_parallel(q, k, v, causal=True, eps=eps))
    assert_close(prefix, recurrent_reference(q, k, v, eps))
    assert_close(prefix, lc.linear_attention(q, k, v, causal=True, eps=eps))


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_linear_attention_equals_the_prefix_sums(chunk):
    q, k, v = rand(2, 3, 37, 8, seed=54), rand(2, 3, 37, 8, seed=55), rand(2, 3, 37, 5, seed=56)
    assert_close(lc.chunked_linear_attention(q, k, v, chunk=chunk), lc.causal_linear_attention(q, k, v))
    with pytest.raises(ValueError, match="chunk >= 1"):
        lc.chunked_linear_attention(q, k, v, chunk=0)


def test_noncausal_linear_attention_equals_the_parallel_form_and_an_explicit_sum():
    q, k, v = rand(2, 11, 6, seed=43), rand(2, 15, 6, seed=44), rand(2, 15, 3, seed=45)
    fast = lc.linear_attention(q, k, v)
    assert_close(fast, lc.linear_attention_parallel(q, k, v))
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    w = torch.einsum("btd,bsd->bts", phi_q, phi_k)
    assert_close(fast, torch.einsum("bts,bse->bte", w, v) / (w.sum(-1, keepdim=True) + 1e-6))


def test_causal_linear_attention_ignores_the_future_and_has_gradients():
    q, k, v = rand(1, 12, 4, seed=46), rand(1, 12, 4, seed=47), rand(1, 12, 4, seed=48)
    k2, v2 = k.clone(), v.clone()
    k2[:, 8:], v2[:, 8:] = rand(1, 4, 4, seed=49), rand(1, 4, 4, seed=50)
    assert_close(lc.causal_linear_attention(q, k, v)[:, :8], lc.causal_linear_attention(q, k2, v2)[:, :8])
    small = [rand(1, 5, 3, seed=s).requires_grad_() for s in (51, 52, 53)]
    assert torch.autograd.gradcheck(lc.causal_linear_attention, tuple(small))


def test_linear_attention_bad_inputs():
    q = rand(2, 5, 4)
    with pytest.raises(ValueError, match="eps must be non-negative"):
        lc.causal_linear_attention(q, q, q, eps=-1.0)
    with pytest.raises(ValueError, match="as many keys as queries"):
        lc.causal_linear_attention(q, rand(2, 6, 4), rand(2, 6, 4))
    with pytest.raises(ValueError, match="needs T == S"):
        lc.linear_attention_parallel(q, rand(2, 6, 4), rand(2, 6, 4), causal=True)


# --------------------------------------------------------------------------- Performer (positive random features)


def performer_reference(q, k, v, w, causal=False):
    """FAVOR+ written out: the (T, S) matrix of estimated weights, masked, normalised by its rows."""
    scale = q.shape[-1] ** -0.25
    phi = lambda x: torch.exp(x @ w.T - (x**2).sum(-1, keepdim=True) / 2) / w.shape[0] ** 0.5  # noqa: E731
    weights = phi(q * scale) @ phi(k * scale).transpose(-2, -1)  # (..., T, S)
    if causal:
        may_attend = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        weights = weights.masked_fill(~may_attend, 0.0)
    return weights @ v / weights.sum(-1, keepdim=True)


def test_positive_random_features_estimate_exp_qk_without_bias():
    # phi(q) . phi(k) is the mean of m terms exp(w.(q+k) - |q|^2/2 - |k|^2/2); for independent rows its
    # variance per term is exp(2 q.k) (exp(|q+k|^2) - 1) in closed form: five standard errors of the mean
    q, k = rand(8, seed=60, scale=0.3), rand(8, seed=61, scale=0.3)
    exact = torch.exp(q @ k).item()
    m = 200_000
    w = lc.random_feature_matrix(m, 8, torch.Generator().manual_seed(62), orthogonal=False)
    estimate = (lc.positive_random_features(q[None], w) @ lc.positive_random_features(k[None], w).T).item()
    sd = exact * ((torch.exp((q + k) @ (q + k)) - 1).item() / m) ** 0.5
    assert abs(estimate - exact) < 5 * sd
    assert (lc.positive_random_features(rand(3, 5, 8, seed=63), w[:100]) > 0).all()


def test_orthogonal_features_are_orthogonal_and_still_unbiased():
    D, draws = 8, 4000
    g = torch.Generator().manual_seed(64)
    w = lc.random_feature_matrix(2 * D + 3, D, g)  # two full blocks and part of a third
    for block in (w[:D], w[D : 2 * D]):
        gram = block @ block.T
        assert_close(gram, torch.diag(torch.diagonal(gram)))  # rows of one block are orthogonal
    # independent draws of one block each: the mean estimate within five standard errors of exp(q . k)
    q, k = rand(D, seed=65, scale=0.3), rand(D, seed=66, scale=0.3)
    w = lc.random_feature_matrix(D * draws, D, g)  # independent blocks of D orthogonal rows
    terms = (
        lc.positive_random_features(q[None], w) * lc.positive_random_features(k[None], w) * D * draws
    )  # (1, m)
    estimates = terms.view(draws, D).mean(dim=-1)  # phi(q) . phi(k) with one block each
    assert abs(estimates.mean() - torch.exp(q @ k)) < 5 * estimates.std() / draws**0.5


@pytest.mark.parametrize("causal", [False, True])
def test_performer_attention_converges_to_softmax_attention(causal):
    # the error of each estimated weight falls like 1/sqrt(m): from m = 16 to 4096, 16 times
    q, k, v = (
        rand(2, 3, 24, 8, seed=67, scale=0.5),
        rand(2, 3, 24, 8, seed=68, scale=0.5),
        rand(2, 3, 24, 5, seed=69),
    )
    exact = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def mean_error(m):
        errors = [
            (
                lc.performer_attention(q, k, v, m, torch.Generator().manual_seed(s), causal=causal) - exact
            ).norm()
            / exact.norm()
            for s in range(6)
        ]
        return sum(errors) / len(errors)

    few, many = mean_error(16), mean_error(4096)
    assert many < few / 4 and many < 0.05


@pytest.mark.parametrize("chunk", [1, 5, 128])
@pytest.mark.parametrize("orthogonal", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_performer_attention_equals_the_masked_matrix_form(causal, orthogonal, chunk):
    q, k, v = rand(2, 3, 37, 8, seed=70), rand(2, 3, 37, 8, seed=71), rand(3, 37, 5, seed=72)  # v broadcasts
    out = lc.performer_attention(q, k, v, 40, torch.Generator().manual_seed(7), causal, orthogonal, chunk)
    w = lc.random_feature_matrix(40, 8, torch.Generator().manual_seed(7), orthogonal)
    assert_close(out, performer_reference(q, k, v, w, causal))
    out32 = lc.performer_attention(
        q.float(), k.float(), v.float(), 40, torch.Generator().manual_seed(7), causal, orthogonal, chunk
    )
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32, out.float(), rtol=1e-4, atol=1e-5)


def test_performer_attention_with_more_keys_ignores_the_future_and_stays_finite():
    q, k, v = rand(1, 9, 6, seed=73), rand(1, 14, 6, seed=74), rand(1, 14, 4, seed=75)
    w = lc.random_feature_matrix(32, 6, torch.Generator().manual_seed(0))
    assert_close(
        lc.performer_attention(q, k, v, 32, torch.Generator().manual_seed(0)), performer_reference(q, k, v, w)
    )
    q, k, v = rand(1, 12, 4, seed=76), rand(1, 12, 4, seed=77), rand(1, 12, 4, seed=78)
    k2, v2 = k.clone(), v.clone()
    k2[:, 8:], v2[:, 8:] = rand(1, 4, 4, seed=79), rand(1, 4, 4, seed=80)
    causal = [
        lc.performer_attention(q, kk, vv, 64, torch.Generator().manual_seed(1), causal=True)[:, :8]
        for kk, vv in ((k, v), (k2, v2))
    ]
    assert_close(causal[0], causal[1])
    # long vectors: exp(w . x - |x|^2 / 2) alone would underflow to 0 / 0; the shifts keep it finite
    big = lc.performer_attention(
        rand(1, 12, 4, seed=81, scale=40.0),
        rand(1, 12, 4, seed=82, scale=40.0),
        v,
        64,
        torch.Generator().manual_seed(1),
        causal=True,
    )
    assert big.isfinite().all()


def test_performer_bad_inputs():
    q, g = rand(2, 5, 4), torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="n_features must be a positive integer"):
        lc.performer_attention(q, q, q, 0, g)
    with pytest.raises(ValueError, match="n_features must be a positive integer"):
        lc.performer_attention(q, q, q, 8.0, g)
    with pytest.raises(ValueError, match="generator must be a torch.Generator"):
        lc.performer_attention(q, q, q, 8, 0)
    with pytest.raises(ValueError, match="needs T == S"):
        lc.performer_attention(q, rand(2, 6, 4), rand(2, 6, 4), 8, g, causal=True)
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        lc.performer_attention(q, q, q, 8, g, causal=True, chunk=0)
    with pytest.raises(ValueError, match="last dimension"):
        lc.performer_attention(q, rand(2, 5, 3), q, 8, g)
    with pytest.raises(ValueError, match=r"w must be \(m, D\)"):
        lc.positive_random_features(q, rand(8, 3))
    with pytest.raises(ValueError, match="floating point"):
        lc.positive_random_features(torch.ones(2, 4, dtype=torch.long), rand(8, 4))


# --------------------------------------------------------------------------- KV-cache size


@pytest.mark.parametrize(
    "L,H,H_kv,D,T,B", [(32, 32, 32, 128, 4096, 1), (80, 64, 8, 128, 1000, 3), (32, 71, 1, 64, 7, 2)]
)
@pytest.mark.parametrize(
    "dtype,nbytes", [(torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4), (torch.float64, 8)]
)
def test_kv_cache_size_equals_chapter_2s_kv_cache_bytes(L, H, H_kv, D, T, B, dtype, nbytes):
    assert lc.kv_cache_size(L, H, D, T, n_kv_heads=H_kv, batch=B, dtype=dtype) == multihead.kv_cache_bytes(
        L, H_kv, D, T, batch=B, bytes_per_value=nbytes
    )


def test_kv_cache_size_of_a_7b_model():
    per_token = lc.kv_cache_size(32, 32, 128, 1)  # Llama 2 7B, float16
    assert per_token == 512 * 1024  # 0.5 MiB
    assert lc.kv_cache_size(32, 32, 128, 128 * 1024) == 64 * 2**30  # 64 GiB at 128k tokens
    assert lc.kv_cache_size(32, 32, 128, 128 * 1024, n_kv_heads=8) == 16 * 2**30  # GQA-8: 4x smaller
    assert lc.kv_cache_size(32, 32, 128, 128 * 1024, n_kv_heads=1) == 2 * 2**30  # MQA: 32x smaller
    assert lc.kv_cache_size(32, 32, 128, 128 * 1024, n_kv_heads=8, window=4096) == 512 * 2**20  # Mistral-like


def test_kv_cache_size_equals_a_gpt_kv_cache_in_memory():
    cfg = gpt.GPTConfig(vocab_size=50, block_size=40, n_layers=3, n_heads=4, d_model=32)
    cache = gpt.GPT(cfg).init_cache(batch_size=2)
    assert cache.nbytes() == lc.kv_cache_size(3, 4, 8, 40, batch=2, dtype=torch.float32)


def test_kv_cache_size_bad_inputs():
    with pytest.raises(ValueError, match="must divide n_heads"):
        lc.kv_cache_size(2, 8, 16, 10, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_layers must be positive"):
        lc.kv_cache_size(0, 8, 16, 10)
    with pytest.raises(ValueError, match="seq_len must be non-negative"):
        lc.kv_cache_size(2, 8, 16, -1)
    with pytest.raises(ValueError, match="window must be positive"):
        lc.kv_cache_size(2, 8, 16, 10, window=0)


# --------------------------------------------------------------------------- segment recurrence


@pytest.mark.parametrize("L,M", [(4, 4), (4, 0), (3, 7), (5, 2), (20, 3)])
def test_segment_recurrence_equals_masked_full_attention(L, M):
    torch.manual_seed(0)
    attn = multihead.MultiHeadAttention(16, 4).double()
    x = rand(2, 18, 16, seed=60)
    expected = attn(x, mask=lc.segment_recurrence_mask(18, L, M))[0]
    assert_close(lc.segment_recurrence(attn, x, L, M), expected)


def test_segment_recurrence_mask_brute_force():
    assert torch.equal(
        lc.segment_recurrence_mask(11, 3, 2), brute(11, 11, lambda i, j: (i // 3) * 3 - 2 <= j <= i)
    )
    assert torch.equal(lc.segment_recurrence_mask(9, 3, 0), brute(9, 9, lambda i, j: (i // 3) * 3 <= j <= i))
    assert torch.equal(lc.segment_recurrence_mask(9, 3, 100), A.causal_mask(9))


def test_memory_carries_no_gradient_to_earlier_segments():
    torch.manual_seed(0)
    attn = multihead.MultiHeadAttention(8, 2).double()
    x = rand(1, 8, 8, seed=61).requires_grad_()
    lc.segment_recurrence(attn, x, 4, 4)[:, 4:].sum().backward()  # a loss on the second segment only
    assert torch.equal(x.grad[:, :4], torch.zeros_like(x.grad[:, :4]))  # stop-gradient memory
    assert x.grad[:, 4:].abs().sum() > 0
    y = x.detach().clone().requires_grad_()
    attn(y, mask=lc.segment_recurrence_mask(8, 4, 4))[0][:, 4:].sum().backward()
    assert y.grad[:, :4].abs().sum() > 0  # full attention does send gradient back


def test_attend_with_memory_without_memory_is_causal_attention_and_checks_shapes():
    torch.manual_seed(0)
    attn = multihead.MultiHeadAttention(8, 2).double()
    x = rand(2, 5, 8, seed=62)
    assert_close(lc.attend_with_memory(attn, x), attn(x, is_causal=True)[0])
    with pytest.raises(ValueError, match="memory must be"):
        lc.attend_with_memory(attn, x, rand(3, 4, 8))
    with pytest.raises(ValueError, match="segment_len >= 1"):
        lc.segment_recurrence(attn, x, 0, 2)


# --------------------------------------------------------------------------- context extension


def test_position_interpolation_divides_positions_and_ntk_stretches_only_the_slow_pairs():
    p, D, s = torch.arange(0, 512, 7), 16, 4.0
    assert_close(positional.rope_angles(p, D, scaling="linear", factor=s), positional.rope_angles(p / s, D))
    x = rand(3, len(p), D, seed=70)
    assert_close(positional.apply_rope(x, p, scaling="linear", factor=s), positional.apply_rope(x, p / s))
    base = positional.ntk_scaled_base(10000.0, D, s)
    assert base == pytest.approx(10000.0 * s ** (D / (D - 2)))
    plain, ntk = positional.rope_frequencies(D), positional.rope_frequencies(D, base)
    assert ntk[0] == plain[0] and ntk[-1] == pytest.approx(plain[-1] / s)


# --------------------------------------------------------------------------- tiled backward (recomputation)

BACKWARD_CASES = [  # q shape, k shape, Dv, block_q, block_k: blocks that do not divide T or S, and ones that do
    ((2, 3, 37, 16), (2, 3, 45, 16), 8, 5, 7),
    ((1, 2, 64, 8), (1, 2, 64, 8), 8, 16, 16),
    ((5, 9, 4), (5, 9, 4), 6, 4, 2),
    ((1, 1, 30, 8), (1, 1, 70, 8), 3, 64, 64),
    ((2, 13, 5), (2, 13, 5), 5, 1, 1),
]


def _grads(fn, qs, ks, dv, seed):
    q = rand(*qs, seed=seed).requires_grad_()
    k = rand(*ks, seed=seed + 1).requires_grad_()
    v = rand(*ks[:-1], dv, seed=seed + 2).requires_grad_()
    out = fn(q, k, v)
    weight = rand(*out.shape, seed=seed + 3)  # a loss whose gradient dO is a random tensor
    return out, torch.autograd.grad((out * weight).sum(), (q, k, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qs,ks,dv,bq,bk", BACKWARD_CASES)
def test_flash_attention_gradients_equal_autograd_through_plain_attention(qs, ks, dv, bq, bk, causal):
    out, grads = _grads(lambda q, k, v: lc.flash_attention(q, k, v, causal, bq, bk), qs, ks, dv, seed=30)
    ref_out, ref_grads = _grads(lambda q, k, v: naive(q, k, v, causal), qs, ks, dv, seed=30)
    assert_close(out, ref_out)
    for got, expected in zip(grads, ref_grads):
        assert_close(got, expected)


def test_flash_attention_with_a_custom_scale_equals_torch_sdpa_gradients():
    for causal in (False, True):
        out, grads = _grads(
            lambda q, k, v: lc.flash_attention(q, k, v, causal, 6, 5, scale=0.7),
            (2, 11, 4),
            (2, 15, 4),
            3,
            40,
        )
        mask = causal_lower_right(11, 15) if causal else None
        ref_out, ref_grads = _grads(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.7),
            (2, 11, 4),
            (2, 15, 4),
            3,
            40,
        )
        assert_close(out, ref_out)
        for got, expected in zip(grads, ref_grads):
            assert_close(got, expected)


def test_tiled_forward_equals_tiled_attention_and_returns_the_log_sum_exp():
    q, k, v = rand(2, 3, 21, 8, seed=50), rand(2, 3, 29, 8, seed=51), rand(2, 3, 29, 5, seed=52)
    for causal in (False, True):
        out, lse = lc.tiled_attention_forward(q, k, v, causal, 4, 6)
        assert_close(out, lc.tiled_attention(q, k, v, causal=causal, block_q=4, block_k=6))
        scores = q @ k.transpose(-2, -1) / 8**0.5  # (2, 3, 21, 29)
        if causal:
            scores = scores.masked_fill(~A.causal_mask(21, 29), float("-inf"))
        assert_close(lse, torch.logsumexp(scores, dim=-1))


def test_flash_attention_gradcheck_on_a_tiny_case():
    q, k, v = (rand(1, 2, 5, 3, seed=s).requires_grad_() for s in (60, 61, 62))
    assert torch.autograd.gradcheck(lambda *a: lc.flash_attention(*a, False, 2, 3), (q, k, v))
    assert torch.autograd.gradcheck(lambda *a: lc.flash_attention(*a, True, 3, 2), (q, k, v))


def _saved_shapes(fn, *inputs):
    """Shapes of every tensor that autograd keeps for the backward pass of ``fn(*inputs)``."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs).sum().backward()
    return shapes


def test_flash_attention_saves_no_T_by_S_tensor_for_backward():
    """The memory claim as a count: what autograd keeps is q, k, v, the output and a (B, H, T) log-sum-exp."""
    B, H, T, S, D = 1, 2, 48, 40, 8
    inputs = [rand(B, H, T, D, seed=70), rand(B, H, S, D, seed=71), rand(B, H, S, D, seed=72)]
    inputs = [t.requires_grad_() for t in inputs]
    saved = _saved_shapes(lambda q, k, v: lc.flash_attention(q, k, v, False, 16, 16), *inputs)
    assert sorted(saved) == sorted([(B, H, T, D), (B, H, S, D), (B, H, S, D), (B, H, T, D), (B, H, T)])
    # the same count finds the (T, S) matrices that plain attention keeps: the check can fail
    plain = _saved_shapes(lambda q, k, v: naive(q, k, v), *inputs)
    assert any(shape[-2:] == (T, S) for shape in plain)


def test_tiled_backward_bad_inputs():
    q, k, v = rand(2, 5, 4), rand(2, 6, 4), rand(2, 6, 3)
    out, lse = lc.tiled_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="expected out and grad_out"):
        lc.tiled_attention_backward(q, k, v, out, lse[..., :-1], out)
    with pytest.raises(ValueError, match="share their leading dimensions"):
        lc.flash_attention(q, rand(1, 6, 4), rand(1, 6, 3))
    with pytest.raises(ValueError, match="block sizes must be positive"):
        lc.flash_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="at least as many keys"):
        lc.flash_attention(k, q, rand(2, 5, 3), causal=True)


# --------------------------------------------------------------------------- attention sinks on a GPT


def _tiny_gpt(seed=0):
    torch.manual_seed(seed)
    cfg = gpt.GPTConfig(vocab_size=23, block_size=24, n_layers=3, n_heads=2, d_model=16)
    return gpt.GPT(cfg).double().eval()


def test_gpt_logits_with_the_causal_mask_equal_the_model():
    model = _tiny_gpt()
    idx = torch.randint(0, 23, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, weights = lc.gpt_logits_with_mask(model, idx, A.causal_mask(24), return_weights=True)
        assert_close(logits, model(idx))
        assert_close(
            lc.gpt_logits_with_mask(model, idx[:, :10], lc.sink_window_mask(10, 10, 0)), model(idx[:, :10])
        )
    assert len(weights) == 3 and weights[0].shape == (3, 2, 24, 24)
    assert (weights[1][..., ~A.causal_mask(24)] == 0).all()


@pytest.mark.parametrize("window,n_sink", [(1, 0), (4, 0), (5, 2), (3, 4), (30, 1), (6, 30)])
def test_sink_cache_decoding_equals_the_sink_window_mask(window, n_sink):
    model = _tiny_gpt(seed=2)
    idx = torch.randint(0, 23, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        streamed = lc.sink_cache_decode(model, idx, window, n_sink)
        masked = lc.gpt_logits_with_mask(model, idx, lc.sink_window_mask(20, window, n_sink))
        assert_close(streamed, masked)
        if n_sink + window < 20:  # tokens were evicted: the result differs from the full model
            assert not torch.allclose(streamed, model(idx))
        else:  # nothing was ever evicted
            assert_close(streamed, model(idx))


def test_gpt_mask_helpers_bad_inputs():
    model = _tiny_gpt()
    idx = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"mask must be a \(5, 5\) boolean"):
        lc.gpt_logits_with_mask(model, idx, torch.ones(5, 5))
    with pytest.raises(ValueError, match="learned positions"):
        lc.gpt_logits_with_mask(model, torch.zeros(1, 25, dtype=torch.long), A.causal_mask(25))
    with pytest.raises(ValueError, match="token ids"):
        lc.sink_cache_decode(model, torch.zeros(5, dtype=torch.long), 2, 1)
    with pytest.raises(ValueError, match="window >= 1"):
        lc.sink_cache_decode(model, idx, 0, 1)

"""coursekit.multihead against nn.MultiheadAttention, SDPA's enable_gqa, per-head loops and true properties."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import attention as A
from coursekit import multihead as M
from tests.conftest import assert_close

DTYPES = [torch.float64, torch.float32]


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def build(C=12, H=4, H_kv=None, bias=True, dropout=0.0, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    m = M.MultiHeadAttention(C, H, n_kv_heads=H_kv, bias=bias, dropout=dropout).to(dtype)
    if bias:  # nn.Linear starts with small biases; make them matter in every comparison
        with torch.no_grad():
            m.qkv_proj.bias.copy_(rand(m.qkv_proj.out_features, dtype=dtype, seed=seed + 100))
            m.out_proj.bias.copy_(rand(C, dtype=dtype, seed=seed + 101))
    return m


def torch_twin(m: M.MultiHeadAttention) -> nn.MultiheadAttention:
    """nn.MultiheadAttention holding ``m``'s weights: our packed [q | k | v] rows are its in_proj layout."""
    bias = m.qkv_proj.bias is not None
    t = nn.MultiheadAttention(m.d_model, m.n_heads, bias=bias, batch_first=True).to(m.qkv_proj.weight.dtype)
    with torch.no_grad():
        t.in_proj_weight.copy_(m.qkv_proj.weight)
        t.out_proj.weight.copy_(m.out_proj.weight)
        if bias:
            t.in_proj_bias.copy_(m.qkv_proj.bias)
            t.out_proj.bias.copy_(m.out_proj.bias)
    return t.eval()


def to_torch_attn_mask(mask: torch.Tensor, B: int, H: int) -> torch.Tensor:
    """Our attention mask -> nn.MultiheadAttention's attn_mask.

    Boolean: ours is True = may attend, torch's is True = *not* allowed, so negate.
    Floating masks are additive in both. Torch takes (T, S) or (B * H, T, S).
    """
    converted = ~mask if mask.dtype == torch.bool else mask
    if converted.dim() == 2:
        return converted
    T, S = converted.shape[-2:]
    return converted.expand(B, H, T, S).reshape(B * H, T, S)  # (B*H, T, S)


# --------------------------------------------------------------------------- split, merge, repeat


@pytest.mark.parametrize("B,T,H,D", [(2, 5, 3, 4), (1, 1, 1, 6), (3, 4, 6, 1)])
def test_split_heads_gives_head_h_the_features_h_times_d(B, T, H, D):
    x = rand(B, T, H * D)
    heads = M.split_heads(x, H)
    assert heads.shape == (B, H, T, D)
    for h in range(H):
        assert torch.equal(heads[:, h], x[..., h * D : (h + 1) * D])


def test_merge_heads_concatenates_heads_and_inverts_split():
    x = rand(2, 3, 5, 4)  # (B, H, T, D)
    assert torch.equal(M.merge_heads(x), torch.cat([x[:, h] for h in range(3)], dim=-1))
    y = rand(2, 5, 12)
    assert torch.equal(M.merge_heads(M.split_heads(y, 3)), y)
    assert torch.equal(M.split_heads(M.merge_heads(x), 3), x)


def test_split_heads_accepts_a_slice_of_a_packed_projection():
    packed = rand(2, 5, 36)  # (B, T, 3C): q, k and v of width 12 side by side
    q = packed[..., :12]  # not contiguous
    assert torch.equal(M.split_heads(q, 4), M.split_heads(q.contiguous(), 4))


@pytest.mark.parametrize("n_rep", [1, 2, 3])
def test_repeat_kv_gives_query_head_h_the_kv_head_h_div_n_rep(n_rep):
    x = rand(2, 2, 5, 3)  # (B, H_kv, S, D)
    out = M.repeat_kv(x, n_rep)
    assert out.shape == (2, 2 * n_rep, 5, 3)
    for h in range(2 * n_rep):
        assert torch.equal(out[:, h], x[:, h // n_rep])


def test_repeat_kv_matches_sdpa_enable_gqa():
    q, k, v = rand(2, 6, 4, 5), rand(2, 2, 7, 5, seed=1), rand(2, 2, 7, 5, seed=2)
    ours, _ = A.scaled_dot_product_attention(q, M.repeat_kv(k, 3), M.repeat_kv(v, 3))
    assert_close(ours, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_split_merge_repeat_bad_input():
    with pytest.raises(ValueError, match=r"n_heads=5 must be positive and divide the width 12"):
        M.split_heads(torch.zeros(2, 3, 12), 5)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, H\*D\), got \(3, 12\)"):
        M.split_heads(torch.zeros(3, 12), 3)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, H, T, D\), got \(2, 3, 12\)"):
        M.merge_heads(torch.zeros(2, 3, 12))
    with pytest.raises(ValueError, match=r"expected x of shape \(B, H_kv, S, D\)"):
        M.repeat_kv(torch.zeros(2, 3, 12), 2)
    with pytest.raises(ValueError, match="n_rep must be positive"):
        M.repeat_kv(torch.zeros(2, 1, 3, 4), 0)


# --------------------------------------------------------------------------- against nn.MultiheadAttention


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch(dtype, H, bias):
    m = build(12, H, bias=bias, dtype=dtype)
    x = rand(2, 5, 12, dtype=dtype, seed=1)
    out, w = m(x, need_weights=True)
    ref, ref_w = torch_twin(m)(x, x, x, need_weights=True, average_attn_weights=False)
    assert_close(out, ref)
    assert_close(w, ref_w)
    assert w.shape == (2, H, 5, 5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_attention_matches_torch(dtype):
    m = build(12, 3, dtype=dtype)
    x, kv = rand(2, 4, 12, dtype=dtype, seed=1), rand(2, 7, 12, dtype=dtype, seed=2)
    out, w = m(x, kv, need_weights=True)
    ref, ref_w = torch_twin(m)(x, kv, kv, need_weights=True, average_attn_weights=False)
    assert out.shape == (2, 4, 12) and w.shape == (2, 3, 4, 7)
    assert_close(out, ref)
    assert_close(w, ref_w)


def test_need_weights_false_returns_none_and_the_same_output():
    m, x = build(), rand(2, 5, 12, seed=1)
    out, w = m(x)
    assert w is None
    assert_close(out, m(x, need_weights=True)[0])


def test_key_padding_mask_is_the_negation_of_torchs():
    m, x, kv = build(12, 4), rand(2, 4, 12, seed=1), rand(2, 6, 12, seed=2)
    keep = A.padding_mask([4, 6], S=6)  # (B, S): True = real key
    out, w = m(x, kv, key_padding_mask=keep, need_weights=True)
    ref, ref_w = torch_twin(m)(
        x, kv, kv, key_padding_mask=~keep, need_weights=True, average_attn_weights=False
    )
    assert torch.equal(A.from_key_padding_mask(~keep), keep)  # the conversion, both ways
    assert_close(out, ref)
    assert_close(w, ref_w)
    assert (w[0, :, :, 4:] == 0).all()
    unconverted, _ = m(x, kv, key_padding_mask=~keep)  # what forgetting the conversion does
    assert not torch.allclose(unconverted, ref)


@pytest.mark.parametrize("shape", [(4, 6), (2, 1, 4, 6), (2, 3, 4, 6)])
def test_boolean_attention_mask_matches_torch_after_negation(shape):
    m, x, kv = build(12, 3), rand(2, 4, 12, seed=1), rand(2, 6, 12, seed=2)
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) < 0.6
    mask[..., 0] = True  # every query sees a key: torch gives NaN otherwise
    out, w = m(x, kv, mask=mask, need_weights=True)
    ref, ref_w = torch_twin(m)(
        x, kv, kv, attn_mask=to_torch_attn_mask(mask, 2, 3), need_weights=True, average_attn_weights=False
    )
    assert_close(out, ref)
    assert_close(w, ref_w)


def test_floating_mask_matches_torch():
    m, x = build(12, 2), rand(2, 5, 12, seed=1)
    bias = rand(5, 5, seed=4)
    bias[1, 2:] = -math.inf
    out, _ = m(x, mask=bias)
    ref, _ = torch_twin(m)(x, x, x, attn_mask=bias, need_weights=False)
    assert_close(out, ref)


def test_all_masks_together_match_torch():
    m, x = build(12, 4), rand(2, 5, 12, seed=1)
    keep = A.padding_mask([5, 4], S=5)
    bias = rand(5, 5, seed=4)
    out, _ = m(x, mask=bias, key_padding_mask=keep, is_causal=True)
    attn_mask = bias + A.bool_to_additive(A.causal_mask(5), torch.float64)
    padding = A.bool_to_additive(keep, torch.float64)  # torch wants both masks of one kind
    ref, _ = torch_twin(m)(x, x, x, attn_mask=attn_mask, key_padding_mask=padding, need_weights=False)
    assert_close(out, ref)


def test_is_causal_equals_an_explicit_causal_mask_and_ignores_the_future():
    m, x = build(12, 4), rand(2, 6, 12, seed=1)
    out, _ = m(x, is_causal=True)
    assert_close(out, m(x, mask=A.causal_mask(6))[0])
    ref, _ = torch_twin(m)(x, x, x, attn_mask=~A.causal_mask(6), need_weights=False)
    assert_close(out, ref)
    y = x.clone()
    y[:, 4:] = rand(2, 2, 12, seed=9)
    later, _ = m(y, is_causal=True)
    assert_close(later[:, :4], out[:, :4])
    assert not torch.allclose(later[:, 4:], out[:, 4:])


def test_fully_masked_query_gets_zero_attention_output_not_nan():
    """Ours: zero attention output (then out_proj's bias). Torch: the same through its fused
    path (need_weights=False), NaN through its explicit softmax (need_weights=True)."""
    m, x = build(12, 3), rand(2, 4, 12, seed=1)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[1, 0, 2] = False  # query 2 of sequence 1 sees no key
    out, w = m(x, mask=mask, need_weights=True)
    assert not torch.isnan(out).any()
    assert torch.equal(w[1, :, 2], torch.zeros(3, 4, dtype=torch.float64))
    assert_close(out[1, 2], m.out_proj.bias)
    t, attn_mask = torch_twin(m), to_torch_attn_mask(mask, 2, 3)
    assert_close(out, t(x, x, x, attn_mask=attn_mask, need_weights=False)[0])
    with_weights, _ = t(x, x, x, attn_mask=attn_mask, need_weights=True)
    assert torch.isnan(with_weights[1, 2]).all()
    visible = torch.ones(2, 4, dtype=torch.bool)
    visible[1, 2] = False
    assert_close(out[visible], with_weights[visible])  # every row with a visible key agrees


def test_permutation_equivariance_without_masks():
    m, x = build(12, 4), rand(2, 6, 12, seed=1)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(1))
    assert_close(m(x[:, perm])[0], m(x)[0][:, perm])


# --------------------------------------------------------------------------- one head at a time


def heads_one_by_one(m: M.MultiHeadAttention, x, kv=None, mask=None):
    """Attention computed head by head with slices of the packed weights, then out_proj."""
    kv = x if kv is None else kv
    C, D, H, H_kv = m.d_model, m.d_head, m.n_heads, m.n_kv_heads
    W, b = m.qkv_proj.weight, m.qkv_proj.bias  # (C + 2 H_kv D, C), (C + 2 H_kv D,)
    outs = []
    for h in range(H):
        g = h // (H // H_kv)  # the key/value head this query head reads
        rows_q = slice(h * D, (h + 1) * D)
        rows_k = slice(C + g * D, C + (g + 1) * D)
        rows_v = slice(C + H_kv * D + g * D, C + H_kv * D + (g + 1) * D)
        q = x @ W[rows_q].T + b[rows_q]  # (B, T, D)
        k = kv @ W[rows_k].T + b[rows_k]  # (B, S, D)
        v = kv @ W[rows_v].T + b[rows_v]  # (B, S, D)
        out, _ = A.scaled_dot_product_attention(q, k, v, mask=mask)
        outs.append(out)
    return m.out_proj(torch.cat(outs, dim=-1))  # (B, T, C)


@pytest.mark.parametrize("H,H_kv", [(4, 4), (4, 2), (4, 1), (6, 3), (1, 1)])
def test_packed_module_equals_a_loop_over_single_heads(H, H_kv):
    m = build(12, H, H_kv)
    x, kv = rand(2, 5, 12, seed=1), rand(2, 7, 12, seed=2)
    assert_close(m(x)[0], heads_one_by_one(m, x))
    assert_close(m(x, kv)[0], heads_one_by_one(m, x, kv))
    mask = A.causal_mask(5)
    assert_close(m(x, is_causal=True)[0], heads_one_by_one(m, x, mask=mask))


# --------------------------------------------------------------------------- GQA and MQA


@pytest.mark.parametrize("H_kv", [1, 2, 3, 6])
def test_gqa_matches_sdpa_enable_gqa_on_the_projections(H_kv):
    m, x = build(12, 6, H_kv), rand(2, 5, 12, seed=1)
    q, k, v = m.project(x)
    assert q.shape == (2, 6, 5, 2) and k.shape == v.shape == (2, H_kv, 5, 2)
    expected = m.out_proj(
        M.merge_heads(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    )
    assert_close(m(x, is_causal=True)[0], expected)


def test_gqa_with_as_many_kv_heads_as_heads_is_torchs_mha():
    m, x = build(12, 4, H_kv=4), rand(2, 5, 12, seed=1)
    assert_close(m(x)[0], torch_twin(m)(x, x, x, need_weights=False)[0])


def test_gqa_equals_mha_whose_kv_heads_are_copied_within_each_group():
    C, H, H_kv, D = 12, 6, 2, 2
    gqa, x = build(C, H, H_kv), rand(2, 5, C, seed=1)
    mha = M.MultiHeadAttention(C, H).double()
    q_w, k_w, v_w = gqa.qkv_proj.weight.split([C, H_kv * D, H_kv * D])
    q_b, k_b, v_b = gqa.qkv_proj.bias.split([C, H_kv * D, H_kv * D])

    def expand(t):  # (H_kv * D, ...) -> (H * D, ...): each kv head's rows repeated for its group
        return (
            t.reshape(H_kv, D, *t.shape[1:]).repeat_interleave(H // H_kv, dim=0).reshape(H * D, *t.shape[1:])
        )

    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat([q_w, expand(k_w), expand(v_w)]))
        mha.qkv_proj.bias.copy_(torch.cat([q_b, expand(k_b), expand(v_b)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    assert_close(gqa(x)[0], mha(x)[0])


@pytest.mark.parametrize("C,H", [(12, 1), (12, 2), (12, 3), (12, 12), (512, 8), (768, 12)])
def test_parameter_count_is_4c2_plus_4c_whatever_the_heads(C, H):
    assert sum(p.numel() for p in M.MultiHeadAttention(C, H).parameters()) == 4 * C * C + 4 * C
    assert sum(p.numel() for p in M.MultiHeadAttention(C, H, bias=False).parameters()) == 4 * C * C
    t = nn.MultiheadAttention(C, H)
    assert sum(p.numel() for p in t.parameters()) == 4 * C * C + 4 * C


@pytest.mark.parametrize("H,H_kv", [(8, 8), (8, 2), (8, 1)])
def test_gqa_parameter_count(H, H_kv):
    C = 64
    D = C // H
    expected = (C * (C + 2 * H_kv * D) + C + 2 * H_kv * D) + (C * C + C)
    assert sum(p.numel() for p in M.MultiHeadAttention(C, H, H_kv).parameters()) == expected


# --------------------------------------------------------------------------- KV cache


@pytest.mark.parametrize("H,H_kv", [(8, 8), (8, 2), (8, 1)])
@pytest.mark.parametrize("dtype,nbytes", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_kv_cache_bytes_equals_the_keys_and_values_the_layers_produce(H, H_kv, dtype, nbytes):
    L, B, T, C = 3, 2, 7, 32
    torch.manual_seed(0)
    layers = [M.MultiHeadAttention(C, H, H_kv).to(dtype) for _ in range(L)]
    x = torch.randn(B, T, C).to(dtype)
    measured = 0
    with torch.no_grad():
        for layer in layers:
            _, k, v = layer.project(x)  # what a KV cache keeps for this layer
            measured += k.numel() * k.element_size() + v.numel() * v.element_size()
    assert measured == M.kv_cache_bytes(L, H_kv, C // H, T, batch=B, bytes_per_value=nbytes)


def test_kv_cache_bytes_of_published_models():
    """Facts from the shapes: Llama 2 7B keeps 512 KiB per token in float16, so 4096 tokens take 2 GiB."""
    assert M.kv_cache_bytes(32, 32, 128, 1) == 512 * 1024
    assert M.kv_cache_bytes(32, 32, 128, 4096) == 2 * 1024**3
    assert M.kv_cache_bytes(80, 8, 128, 4096) == 1280 * 1024**2  # Llama 2 70B with GQA (8 kv heads)
    mha = M.kv_cache_bytes(32, 32, 128, 4096)
    assert M.kv_cache_bytes(32, 8, 128, 4096) * 4 == mha  # Mistral 7B: a quarter
    assert M.kv_cache_bytes(32, 1, 128, 4096) * 32 == mha  # MQA: 1/H
    with pytest.raises(ValueError, match="seq_len must be non-negative, got -1"):
        M.kv_cache_bytes(1, 1, 1, -1)


# --------------------------------------------------------------------------- dropout


def test_dropout_in_eval_mode_is_the_identity():
    m, x = build(12, 4, dropout=0.5).eval(), rand(2, 5, 12, seed=1)
    plain = build(12, 4)
    plain.load_state_dict(m.state_dict())
    out, w = m(x, need_weights=True)
    out_p, w_p = plain(x, need_weights=True)
    assert torch.equal(out, out_p) and torch.equal(w, w_p)


def test_dropout_in_training_zeroes_weights_and_rescales_the_rest():
    p = 0.25
    m, x = build(12, 4, dropout=p).train(), rand(2, 5, 12, seed=1)
    torch.manual_seed(1)
    out, w = m(x, need_weights=True)
    _, w_eval = m.eval()(x, need_weights=True)
    dropped = w == 0
    assert dropped.any() and not dropped.all()
    assert_close(w[~dropped], w_eval[~dropped] / (1 - p))
    _, _, v = m.project(x)
    assert_close(out, m.out_proj(M.merge_heads(w @ v)))  # the output uses the dropped weights


def test_dropout_preserves_the_expected_output():
    """The mean of N training-mode outputs converges to the eval-mode output.

    Every sample is independent, so the error of the mean at each entry has standard
    deviation sigma / sqrt(N), with sigma measured from the samples; we allow 5 of them
    (with a fixed seed the test is deterministic; 5 sigma fails with probability
    ~6e-7 per entry for a correct implementation, while a missing 1/(1-p) rescaling
    is off by p/(1-p) = 43% here).
    """
    p, N = 0.3, 2000
    m, x = build(8, 2, dropout=p), rand(1, 4, 8, seed=1)
    torch.manual_seed(0)
    with torch.no_grad():
        expected, _ = m.eval()(x)
        m.train()
        samples = torch.stack([m(x)[0] for _ in range(N)])  # (N, B, T, C)
    mean, sigma = samples.mean(0), samples.std(0)
    assert (sigma > 0).all()
    assert ((mean - expected).abs() <= 5 * sigma / math.sqrt(N)).all()
    assert not torch.allclose(samples[0], expected)


# --------------------------------------------------------------------------- gradients and errors


def test_gradcheck_self_and_cross_attention_with_masks():
    m = build(4, 2, H_kv=1, dropout=0.0)
    x = rand(1, 3, 4, seed=1).requires_grad_()
    kv = rand(1, 4, 4, seed=2).requires_grad_()
    keep = torch.tensor([[True, True, False, True]])
    assert torch.autograd.gradcheck(lambda x: m(x, is_causal=True)[0], (x,))
    assert torch.autograd.gradcheck(lambda x, kv: m(x, kv, key_padding_mask=keep)[0], (x, kv))


def test_gradients_match_torch():
    m, x = build(12, 3), rand(2, 5, 12, seed=1).requires_grad_()
    t = torch_twin(m)
    up = rand(2, 5, 12, seed=3)
    (m(x, is_causal=True)[0] * up).sum().backward()
    ours = x.grad.clone(), m.qkv_proj.weight.grad.clone()
    x.grad = None
    (t(x, x, x, attn_mask=~A.causal_mask(5), need_weights=False)[0] * up).sum().backward()
    assert_close(ours[0], x.grad)
    assert_close(ours[1], t.in_proj_weight.grad)


@pytest.mark.parametrize(
    "args,message",
    [
        ((12, 5), r"n_heads=5 must be positive and divide d_model=12"),
        ((12, 0), r"n_heads=0 must be positive"),
        ((12, 4, 3), r"n_kv_heads=3 must be positive and divide n_heads=4"),
        ((12, 4, 0), r"n_kv_heads=0 must be positive"),
    ],
)
def test_bad_configuration_errors(args, message):
    with pytest.raises(ValueError, match=message):
        M.MultiHeadAttention(*args)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        M.MultiHeadAttention(12, 4, dropout=1.0)


def test_bad_input_errors():
    m = build(12, 4)
    x = rand(2, 5, 12)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 12\), got \(2, 5, 8\)"):
        m(rand(2, 5, 8))
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, 12\), got \(5, 12\)"):
        m(rand(5, 12))
    with pytest.raises(ValueError, match=r"expected kv of shape \(2, S, 12\), got \(3, 6, 12\)"):
        m(x, rand(3, 6, 12))
    with pytest.raises(
        ValueError, match=r"key_padding_mask must be a boolean \(2, 5\) tensor .*got torch.bool \(2, 4\)"
    ):
        m(x, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_padding_mask must be a boolean .*got torch.int64 \(2, 5\)"):
        m(x, key_padding_mask=torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="mask must be boolean or floating, got torch.int64"):
        m(x, mask=torch.ones(5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must broadcast to the scores' shape"):
        m(x, mask=torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="0 <= T <= S"):
        m(x, rand(2, 3, 12), is_causal=True)  # causal cross-attention needs S >= T

"""coursekit.positional against Hugging Face's implementations, closed forms and true properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

from coursekit import attention as A
from coursekit import positional as P
from tests.conftest import assert_close

#: The fact vectors below are printed to 6 significant digits in the literature; compare at that precision.
FACT_ATOL = 1e-6


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------- sinusoidal


def test_sinusoidal_fact_vector_pe1_d4():
    pe = P.sinusoidal_encoding(2, 4, dtype=torch.float64)
    expected = torch.tensor([0.841471, 0.540302, 0.0099998, 0.99995], dtype=torch.float64)
    torch.testing.assert_close(pe[1], expected, rtol=0, atol=FACT_ATOL)


def test_sinusoidal_matches_the_papers_formula():
    T, C = 40, 12
    expected = torch.tensor(
        [
            [(math.sin if c % 2 == 0 else math.cos)(p / 10000 ** ((c - c % 2) / C)) for c in range(C)]
            for p in range(T)
        ],
        dtype=torch.float64,
    )
    assert_close(P.sinusoidal_encoding(T, C, dtype=torch.float64), expected)
    expected_base = torch.tensor(
        [
            [(math.sin if c % 2 == 0 else math.cos)(p / 50.0 ** ((c - c % 2) / C)) for c in range(C)]
            for p in range(T)
        ],
        dtype=torch.float64,
    )
    assert_close(P.sinusoidal_encoding(T, C, base=50.0, dtype=torch.float64), expected_base)


def test_sinusoidal_matches_hugging_face_xlm_interleaved_layout():
    T, C = 64, 16
    out = torch.empty(T, C)
    create_sinusoidal_embeddings(T, C, out)  # XLM: sin in even channels, cos in odd ones, float32
    assert_close(P.sinusoidal_encoding(T, C), out)


def test_sinusoidal_default_dtype_and_position_zero():
    pe = P.sinusoidal_encoding(3, 6)
    assert pe.dtype == torch.float32 and pe.shape == (3, 6)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 3))
    assert P.sinusoidal_encoding(0, 4).shape == (0, 4)


@pytest.mark.parametrize("C", [4, 16, 64])
def test_sinusoidal_shift_is_a_fixed_linear_map(C):
    pe = P.sinusoidal_encoding(300, C, dtype=torch.float64)  # (T, C)
    for k in (1, 5, 37, -3):
        M = P.sinusoidal_shift_matrix(k, C)  # (C, C)
        pos = torch.arange(max(0, -k), 300 - max(0, k))  # every position with p + k in range
        assert_close(pe[pos] @ M.T, pe[pos + k])  # row form of M_k PE(p) = PE(p + k)
        assert_close(M @ M.T, torch.eye(C, dtype=torch.float64))  # a rotation
    assert_close(
        P.sinusoidal_shift_matrix(3, C) @ P.sinusoidal_shift_matrix(4, C), P.sinusoidal_shift_matrix(7, C)
    )


def test_sinusoidal_dot_product_depends_only_on_the_distance():
    C = 32
    pe = P.sinusoidal_encoding(200, C, dtype=torch.float64)
    freq = 10000.0 ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)
    for k in (0, 1, 10, 60):
        dots = (pe[: 200 - k] * pe[k:]).sum(-1)  # PE(p) . PE(p + k) for every p
        assert_close(dots, torch.full_like(dots, torch.cos(k * freq).sum().item()))


def test_sinusoidal_rejects_odd_width():
    with pytest.raises(ValueError, match="even C"):
        P.sinusoidal_encoding(4, 5)
    with pytest.raises(ValueError, match="base must be positive"):
        P.sinusoidal_encoding(4, 4, base=0.0)


def test_positions_break_permutation_equivariance():
    torch.manual_seed(0)
    layer = A.SelfAttention(8, 4).double()
    x = rand(1, 6, 8)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    out, _ = layer(x)
    out_p, _ = layer(x[:, perm])
    assert_close(out_p, out[:, perm])  # without positions: equivariant
    pe = P.sinusoidal_encoding(6, 8, dtype=torch.float64)
    with_pe, _ = layer(x + pe)
    with_pe_p, _ = layer(x[:, perm] + pe)
    assert not torch.allclose(with_pe_p, with_pe[:, perm])


# --------------------------------------------------------------------------- learned absolute


def test_learned_embedding_matches_nn_embedding():
    torch.manual_seed(0)
    wpe = P.LearnedPositionalEmbedding(10, 6).double()
    emb = torch.nn.Embedding(10, 6).double()
    emb.weight.data.copy_(wpe.weight.data)
    positions = torch.tensor([[0, 3, 9], [2, 2, 1]])
    assert_close(wpe(positions), emb(positions))
    assert wpe(torch.arange(4)).shape == (4, 6)
    wpe(positions).sum().backward()
    assert torch.equal(wpe.weight.grad.abs().sum(-1) > 0, torch.isin(torch.arange(10), positions))


def test_learned_embedding_refuses_positions_beyond_its_table():
    wpe = P.LearnedPositionalEmbedding(8, 4)
    with pytest.raises(ValueError, match=r"0 \.\. 7 \(max_len=8\), got 0 \.\. 8"):
        wpe(torch.arange(9))
    with pytest.raises(ValueError, match="max_len"):
        wpe(torch.tensor([-1]))
    with pytest.raises(TypeError, match="integer tensor"):
        wpe(torch.arange(3.0))


# --------------------------------------------------------------------------- relative bias


@pytest.mark.parametrize("T,S", [(1, 1), (4, 4), (3, 7)])
def test_relative_positions_are_key_minus_query_bottom_right(T, S):
    rel = P.relative_positions(T, S)
    expected = torch.tensor([[j - (i + S - T) for j in range(S)] for i in range(T)])
    assert torch.equal(rel, expected)
    assert torch.equal(rel <= 0, A.causal_mask(T, S))  # the same alignment as the causal mask
    with pytest.raises(ValueError, match="0 <= T <= S"):
        P.relative_positions(5, 3)


def test_relative_position_bias_clips_offsets():
    torch.manual_seed(0)
    H, K, T, S = 3, 2, 5, 7
    rpb = P.RelativePositionBias(H, K).double()
    assert rpb.bias.shape == (H, 2 * K + 1) and torch.equal(
        rpb.bias, torch.zeros(H, 2 * K + 1, dtype=torch.float64)
    )
    with torch.no_grad():
        rpb.bias.copy_(rand(H, 2 * K + 1))
    expected = torch.empty(H, T, S, dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            for j in range(S):
                offset = min(max(j - (i + S - T), -K), K)
                expected[h, i, j] = rpb.bias[h, offset + K]
    assert_close(rpb(T, S), expected)
    long = rpb(50)  # longer than anything: far keys share the clipped bias
    assert torch.equal(long[:, 49, :48], rpb.bias[:, :1].expand(H, 48))


def test_relative_position_bias_as_an_additive_mask_matches_torch():
    torch.manual_seed(0)
    rpb = P.RelativePositionBias(2, 3).double()
    with torch.no_grad():
        rpb.bias.copy_(rand(2, 7, seed=1))
    q, k, v = rand(1, 2, 6, 4), rand(1, 2, 6, 4, seed=2), rand(1, 2, 6, 4, seed=3)
    mask = rpb(6) + A.bool_to_additive(A.causal_mask(6), torch.float64)  # (H, T, S)
    out, _ = A.scaled_dot_product_attention(q, k, v, mask=mask)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_relative_position_bias_gradcheck():
    rpb = P.RelativePositionBias(2, 2)
    table = rand(2, 5).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: torch.func.functional_call(rpb, {"bias": t}, (4,)), (table,))
    rpb(4).sum().backward()
    # 16 (query, key) pairs: offsets -3..3 clipped to -2..2 -> counts of each clipped offset
    assert torch.equal(rpb.bias.grad[0], torch.tensor([3.0, 3.0, 4.0, 3.0, 3.0]))


# --------------------------------------------------------------------------- RoPE


def llama_config(D=8, H=2, base=10000.0, rope_type="default", **extra):
    params = {"rope_type": rope_type, "rope_theta": base, **extra}
    return LlamaConfig(
        hidden_size=D * H,
        num_attention_heads=H,
        num_key_value_heads=H,
        head_dim=D,
        max_position_embeddings=64,
        rope_parameters=params,
    )


def rope_complex(x, angles):
    """Independent reference: pair (i, i + D/2) as the complex number x_i + 1j x_{i+D/2}, times e^{i angle}."""
    D = x.shape[-1]
    z = torch.complex(x[..., : D // 2], x[..., D // 2 :]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("D,base", [(8, 10000.0), (16, 500000.0), (2, 10.0)])
def test_rope_frequencies_match_hugging_face(D, base):
    inv_freq, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(llama_config(D=D, base=base))
    assert_close(P.rope_frequencies(D, base, dtype=torch.float32), inv_freq)
    assert_close(P.rope_frequencies(4), torch.tensor([1.0, 0.01], dtype=torch.float64))


def test_rope_matches_hugging_face_llama_with_explicit_positions():
    B, H, T, D = 2, 3, 7, 8
    q, k = rand(B, H, T, D, dtype=torch.float32), rand(B, H, T, D, dtype=torch.float32, seed=1)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [10, 11, 12, 30, 31, 50, 3]])  # (B, T)
    cos, sin = LlamaRotaryEmbedding(llama_config(D=D, H=H))(q, positions)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    assert_close(P.apply_rope(q, positions), q_hf)
    assert_close(P.apply_rope(k, positions), k_hf)
    assert_close(
        P.apply_rope(q, positions[1]), apply_rotary_pos_emb(q, k, cos[1:], sin[1:])[0]
    )  # (T,) shared


def test_rope_rotation_matches_hugging_face_in_float64():
    """The rotation itself (pairing, direction) in float64, with angles from both sides."""
    x = rand(2, 2, 5, 6)
    positions = torch.tensor([0, 3, 4, 9, 100])
    angles = P.rope_angles(positions, 6)  # (T, D/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # (T, D)
    expected, _ = apply_rotary_pos_emb(x, x, cos[None], sin[None])
    assert_close(P.apply_rope(x, positions), expected)
    assert_close(P.apply_rope(x, positions), rope_complex(x, angles))


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_rope_linear_scaling_matches_hugging_face(factor):
    B, H, T, D = 1, 2, 9, 8
    q = rand(B, H, T, D, dtype=torch.float32)
    positions = torch.arange(0, 90, 10)[None]  # (B, T)
    rope = LlamaRotaryEmbedding(llama_config(D=D, H=H, rope_type="linear", factor=factor))
    cos, sin = rope(q, positions)
    q_hf, _ = apply_rotary_pos_emb(q, q, cos, sin)
    assert_close(P.apply_rope(q, positions, scaling="linear", factor=factor), q_hf)
    # position interpolation is plain RoPE at fractional positions
    assert_close(
        P.apply_rope(q, positions, scaling="linear", factor=factor), P.apply_rope(q, positions / factor)
    )


@pytest.mark.parametrize("D,factor", [(8, 2.0), (16, 4.0), (64, 8.0)])
def test_ntk_scaling_closed_form_and_hugging_face_dynamic_ntk(D, factor):
    base = 10000.0
    new_base = P.ntk_scaled_base(base, D, factor)
    assert new_base == pytest.approx(base * factor ** (D / (D - 2)), rel=1e-15)
    plain, ntk = P.rope_frequencies(D, base), P.rope_frequencies(D, new_base)
    assert_close(ntk[-1], plain[-1] / factor)  # the lowest frequency is stretched by exactly `factor`
    assert ntk[0] == plain[0] == 1.0  # the highest is unchanged
    assert_close(
        ntk[1] / plain[1], torch.tensor(factor ** (-2 / (D - 2)), dtype=torch.float64)
    )  # the next barely
    # HF's dynamic NTK uses base * (factor * L / L0 - (factor - 1))^(D/(D-2));
    # at L = L0 (2 - 1/factor) the bracket is `factor`
    config = llama_config(D=D, rope_type="dynamic", factor=factor)
    L0 = config.max_position_embeddings
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, None, seq_len=int(L0 * (2 - 1 / factor)))
    assert_close(P.rope_frequencies(D, new_base, dtype=torch.float32), inv_freq)
    positions = torch.arange(5)
    assert_close(P.rope_angles(positions, D, scaling="ntk", factor=factor), positions[:, None] * ntk)


def test_rope_preserves_norms_and_is_the_identity_at_position_zero():
    x = rand(2, 3, 6, 8)
    positions = torch.tensor([0.0, 1.0, 2.5, 7.0, 1000.0, 123456.0])
    assert_close(P.apply_rope(x, positions).norm(dim=-1), x.norm(dim=-1))
    assert_close(P.apply_rope(x, torch.zeros(6, dtype=torch.long)), x)


def test_rope_scores_depend_only_on_the_offset():
    q, k = rand(16, seed=1), rand(16, seed=2)

    def score(m, n):
        return P.apply_rope(q[None], torch.tensor([m])) @ P.apply_rope(k[None], torch.tensor([n])).T

    assert_close(score(5, 3), score(12, 10))
    assert_close(score(0, 7), score(100, 107))
    assert not torch.allclose(score(5, 3), score(5, 4))


def test_rope_attention_is_invariant_to_a_global_shift():
    q, k, v = rand(1, 2, 5, 8), rand(1, 2, 5, 8, seed=1), rand(1, 2, 5, 8, seed=2)
    pos = torch.arange(5)
    out0, _ = A.scaled_dot_product_attention(
        P.apply_rope(q, pos), P.apply_rope(k, pos), v, mask=A.causal_mask(5)
    )
    out1, _ = A.scaled_dot_product_attention(
        P.apply_rope(q, pos + 40), P.apply_rope(k, pos + 40), v, mask=A.causal_mask(5)
    )
    assert_close(out0, out1)


def test_rope_interleaved_convention_is_a_permutation_of_half_split():
    """Meta's original LLaMA pairs (2i, 2i+1); ours pairs (i, i + D/2): the same rotation after a
    channel permutation."""
    D = 8
    x = rand(4, D)
    positions = torch.arange(4)
    angles = P.rope_angles(positions, D)  # (T, D/2)
    z = torch.view_as_complex(x.reshape(4, D // 2, 2).contiguous()) * torch.polar(
        torch.ones_like(angles), angles
    )
    interleaved = torch.view_as_real(z).reshape(4, D)
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # (2i, 2i+1) -> (i, i + D/2)
    assert_close(P.apply_rope(x[:, perm], positions), interleaved[:, perm])
    assert not torch.allclose(P.apply_rope(x, positions), interleaved)


def test_rope_batched_positions_and_shapes():
    x = rand(2, 3, 4, 6)
    positions = torch.tensor([[0, 1, 2, 3], [7, 5, 9, 2]])
    out = P.apply_rope(x, positions)
    for b in range(2):
        assert_close(out[b], P.apply_rope(x[b], positions[b]))
    x3 = rand(2, 4, 6)  # (B, T, D), no head axis
    assert_close(P.apply_rope(x3, positions)[1], P.apply_rope(x3[1], positions[1]))
    assert P.apply_rope(x.float(), positions).dtype == torch.float32


def test_rope_gradcheck():
    x = rand(1, 2, 3, 4).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: P.apply_rope(x, torch.tensor([0, 2, 5])), (x,))


def test_rope_bad_input_errors():
    with pytest.raises(ValueError, match="even D"):
        P.apply_rope(torch.zeros(2, 3, 5), torch.arange(3))
    with pytest.raises(ValueError, match=r"positions must be \(T,\) or \(B, T\) with T=3"):
        P.apply_rope(torch.zeros(2, 3, 4), torch.arange(4))
    with pytest.raises(ValueError, match="need x of shape"):
        P.apply_rope(torch.zeros(3, 4), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="scaling must be one of"):
        P.rope_angles(torch.arange(3), 4, scaling="yarn")
    with pytest.raises(ValueError, match="needs an even D > 2"):
        P.rope_angles(torch.arange(3), 2, scaling="ntk", factor=2.0)
    with pytest.raises(ValueError, match="factor must be positive"):
        P.rope_angles(torch.arange(3), 4, scaling="linear", factor=0.0)
    with pytest.raises(ValueError, match="even and positive"):
        P.rope_frequencies(3)


# --------------------------------------------------------------------------- ALiBi


def test_alibi_fact_8_heads():
    expected = torch.tensor([2.0**-i for i in range(1, 9)])  # 1/2, 1/4, ..., 1/256
    assert torch.equal(P.alibi_slopes(8), expected)


@pytest.mark.parametrize("H", list(range(1, 21)) + [24, 32, 40])
def test_alibi_slopes_match_bloom(H):
    alibi = build_alibi_tensor(torch.ones(1, 3), H, torch.float32)  # (H, 1, S): slope_h * j
    assert_close(P.alibi_slopes(H), alibi[:, 0, 1])


def test_alibi_slopes_rule_for_non_powers_of_two():
    assert_close(
        P.alibi_slopes(3, torch.float64), torch.tensor([2.0**-4, 2.0**-8, 2.0**-2], dtype=torch.float64)
    )
    s12 = P.alibi_slopes(12, torch.float64)
    assert_close(s12[:8], P.alibi_slopes(8, torch.float64))
    assert_close(s12[8:], P.alibi_slopes(16, torch.float64)[0::2][:4])
    with pytest.raises(ValueError, match="at least one head"):
        P.alibi_slopes(0)


@pytest.mark.parametrize("T,S", [(1, 1), (5, 5), (3, 7)])
def test_alibi_bias_formula_and_alignment(T, S):
    slopes = P.alibi_slopes(4, torch.float64)
    bias = P.alibi_bias(slopes, T, S)
    expected = torch.full((4, T, S), -math.inf, dtype=torch.float64)
    for h in range(4):
        for i in range(T):
            for j in range(S):
                if j <= i + S - T:
                    expected[h, i, j] = -slopes[h] * (i + S - T - j)
    assert_close(bias, expected)
    assert torch.equal(torch.isfinite(bias), A.causal_mask(T, S).expand(4, T, S))


def test_alibi_bias_equals_bloom_up_to_softmax_shift_invariance():
    H, T = 6, 9
    q, k, v = rand(2, H, T, 8), rand(2, H, T, 8, seed=1), rand(2, H, T, 8, seed=2)
    bloom = build_alibi_tensor(torch.ones(2, T), H, torch.float64).view(
        2, H, 1, T
    )  # slope_h * j, no query term
    bloom_mask = bloom + A.bool_to_additive(A.causal_mask(T), torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bloom_mask)
    ours, _ = A.scaled_dot_product_attention(q, k, v, mask=P.alibi_bias(P.alibi_slopes(H, torch.float64), T))
    # BLOOM's slopes are computed in float32, so compare at float32 precision
    torch.testing.assert_close(ours.float(), expected.float(), rtol=1.3e-6, atol=1e-5)


def test_alibi_bias_is_a_causal_mask_for_attention():
    H, T = 4, 6
    slopes = P.alibi_slopes(H)
    bias = P.alibi_bias(slopes, T)
    assert bias.dtype == torch.float32 and bias.shape == (H, T, T)
    torch.manual_seed(0)
    q, k, v = torch.randn(1, H, T, 8), torch.randn(1, H, T, 8), torch.randn(1, H, T, 8)
    out, w = A.scaled_dot_product_attention(q, k, v, mask=bias)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    assert (w[..., ~A.causal_mask(T)] == 0).all()
    v2 = v.clone()
    v2[..., 4:, :] += 1.0  # change the future
    out2, _ = A.scaled_dot_product_attention(q, k, v2, mask=bias)
    assert_close(out2[..., :4, :], out[..., :4, :])


def test_alibi_bias_gradcheck_and_errors():
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: P.alibi_bias(s, 3, 4).clamp(min=-100.0), (slopes,))
    with pytest.raises(ValueError, match="0 <= T <= S"):
        P.alibi_bias(P.alibi_slopes(2), 4, 3)
    with pytest.raises(ValueError, match=r"floating \(H,\) tensor"):
        P.alibi_bias(torch.tensor([1, 2]), 3)


# --------------------------------------------------------------------------- YaRN

#: Hugging Face computes YaRN's frequencies in float32 (whatever the default dtype): compare at that precision.
YARN_HF_RTOL = 1e-6

YARN_CASES = [  # D, base, factor, original_max, beta_fast, beta_slow, truncate
    (8, 10000.0, 4.0, 2048, 32.0, 1.0, True),
    (64, 10000.0, 8.0, 4096, 32.0, 1.0, True),
    (128, 500000.0, 16.0, 8192, 32.0, 1.0, True),
    (32, 10000.0, 2.5, 512, 16.0, 2.0, True),
    (64, 10000.0, 4.0, 2048, 32.0, 1.0, False),
    (16, 10000.0, 4.0, 16, 32.0, 1.0, True),  # a short context: the lower boundary is clamped to pair 0
]


@pytest.mark.parametrize("D,base,factor,L,beta_fast,beta_slow,truncate", YARN_CASES)
def test_yarn_inv_freq_and_mscale_equal_hugging_face(D, base, factor, L, beta_fast, beta_slow, truncate):
    config = llama_config(
        D=D,
        base=base,
        rope_type="yarn",
        factor=factor,
        original_max_position_embeddings=L,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        truncate=truncate,
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    ours = P.yarn_inv_freq(D, base, factor, L, beta_fast, beta_slow, truncate)
    assert ours.dtype == torch.float64 and ours.shape == (D // 2,)
    torch.testing.assert_close(ours, inv_freq.double(), rtol=YARN_HF_RTOL, atol=0)
    assert P.yarn_mscale(factor) == pytest.approx(attention_factor, rel=1e-15)


@pytest.mark.parametrize("D,base,factor,L", [(64, 10000.0, 8.0, 4096), (128, 10000.0, 4.0, 2048)])
def test_yarn_keeps_fast_pairs_interpolates_slow_pairs_in_float64(D, base, factor, L):
    """The paper's rule from the turns r_i = L theta_i / (2 pi): r > 32 kept, r < 1 divided by s, the rest between."""
    theta = P.rope_frequencies(D, base)
    turns = L * theta / (2 * math.pi)
    yarn = P.yarn_inv_freq(D, base, factor, L)
    fast, slow = turns > 32, turns < 1
    assert fast.any() and slow.any() and (~fast & ~slow).any()  # all three regimes occur
    torch.testing.assert_close(yarn[fast], theta[fast], rtol=0, atol=0)
    assert_close(yarn[slow], theta[slow] / factor)
    assert (yarn <= theta).all() and (yarn >= theta / factor * (1 - 1e-15)).all()
    assert (yarn[1:] < yarn[:-1]).all()  # still decreasing: no two pairs share a frequency
    assert_close(P.yarn_inv_freq(D, base, 1.0, L), theta)  # no stretch: plain RoPE


def test_yarn_example_and_errors():
    assert_close(
        P.yarn_inv_freq(8, 10000.0, 4.0, 2048),
        torch.tensor([1.0, 0.1, 0.00625, 0.00025], dtype=torch.float64),
    )
    assert P.yarn_mscale(1.0) == 1.0 and P.yarn_mscale(0.5) == 1.0
    assert P.yarn_mscale(math.e) == pytest.approx(1.1)
    with pytest.raises(ValueError, match="scale must be positive"):
        P.yarn_inv_freq(8, scale=0.0)
    with pytest.raises(ValueError, match="original_max must be at least 1"):
        P.yarn_inv_freq(8, scale=2.0, original_max=0)
    with pytest.raises(ValueError, match="0 < beta_slow < beta_fast"):
        P.yarn_inv_freq(8, scale=2.0, beta_fast=1.0, beta_slow=2.0)
    with pytest.raises(ValueError, match="even and positive"):
        P.yarn_inv_freq(7, scale=2.0)
    with pytest.raises(ValueError, match="scale must be positive"):
        P.yarn_mscale(-1.0)


# --------------------------------------------------------------------------- adding or concatenating positions

#: float64 least squares on well-conditioned problems agrees with numpy's to about 1e-12
RECOVERY_ATOL = 1e-9


def recovery_draws(C, T, n_tokens, n_samples, token_std, seed):
    """The draws ``position_recovery_r2`` documents, in its order, from a generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    E = torch.randn(n_tokens, C, generator=g, dtype=torch.float64) * token_std  # (n_tokens, C)
    tok = torch.randint(0, n_tokens, (2 * n_samples,), generator=g)
    pos = torch.randint(0, T, (2 * n_samples,), generator=g)
    return E, tok, pos


@pytest.mark.parametrize("mode", ["add", "concat"])
@pytest.mark.parametrize("C,T,n_tokens,token_std", [(8, 16, 50, 0.7), (32, 24, 300, 1.5)])
def test_position_recovery_r2_equals_numpy_lstsq_with_an_intercept_column(mode, C, T, n_tokens, token_std):
    n_samples, seed = 400, 3
    E, tok, pos = recovery_draws(C, T, n_tokens, n_samples, token_std, seed)
    pe = np.array(
        [
            [(math.sin if c % 2 == 0 else math.cos)(p / 10000 ** ((c - c % 2) / C)) for c in range(C)]
            for p in range(T)
        ]
    )  # (T, C), the paper's formula
    E, tok, pos = E.numpy(), tok.numpy(), pos.numpy()
    x = E[tok] + pe[pos] if mode == "add" else np.concatenate([E[tok], pe[pos]], axis=1)
    x = np.concatenate([x, np.ones((len(x), 1))], axis=1)  # an explicit bias column instead of centring
    y = pe[pos]
    W = np.linalg.lstsq(x[:n_samples], y[:n_samples], rcond=1e-10)[0]
    resid = y[n_samples:] - x[n_samples:] @ W
    expected = 1 - (resid**2).sum() / ((y[n_samples:] - y[n_samples:].mean(0)) ** 2).sum()
    ours = P.position_recovery_r2(
        C,
        T,
        mode,
        n_tokens=n_tokens,
        n_samples=n_samples,
        token_std=token_std,
        generator=torch.Generator().manual_seed(seed),
    )
    assert ours == pytest.approx(expected, abs=RECOVERY_ATOL)
    if mode == "add":
        assert ours < 0.99  # tokens this loud do get in the way


@pytest.mark.parametrize("C,T", [(16, 32), (64, 128), (128, 200)])
def test_position_recovery_r2_concatenation_and_silent_tokens_are_exact(C, T):
    g = torch.Generator().manual_seed(0)
    assert P.position_recovery_r2(C, T, "concat", n_samples=4 * C, generator=g) == pytest.approx(1, abs=1e-9)
    assert P.position_recovery_r2(C, T, "add", n_samples=2 * C, token_std=0.0, generator=g) == pytest.approx(
        1, abs=1e-9
    )


def test_position_recovery_r2_reaches_the_population_optimum():
    """With many pairs the fitted map is the best affine map for the true distribution, whose R^2 is
    tr(Sp (Sp + Se)^-1 Sp) / tr(Sp), Sp and Se the covariances of a uniform position vector and of a
    uniform row of the token table (independent of each other)."""
    C, T, n_tokens, n_samples, token_std, seed = 16, 32, 2000, 40_000, 0.8, 5
    E, _, _ = recovery_draws(C, T, n_tokens, n_samples, token_std, seed)
    pe = P.sinusoidal_encoding(T, C, dtype=torch.float64)
    Sp = torch.cov(pe.T, correction=0)  # (C, C)
    Se = torch.cov(E.T, correction=0)  # (C, C)
    optimum = (torch.trace(Sp @ torch.linalg.solve(Sp + Se, Sp)) / torch.trace(Sp)).item()
    ours = P.position_recovery_r2(
        C,
        T,
        "add",
        n_tokens=n_tokens,
        n_samples=n_samples,
        token_std=token_std,
        generator=torch.Generator().manual_seed(seed),
    )
    assert 0.2 < optimum < 0.9  # a case where adding loses something, so the comparison means something
    assert ours == pytest.approx(optimum, abs=0.01)  # sampling error of 40,000 pairs, 17 coefficients each


def test_position_recovery_r2_errors():
    with pytest.raises(ValueError, match="mode must be one of"):
        P.position_recovery_r2(8, 16, "sum")
    with pytest.raises(ValueError, match="T must be at least 2"):
        P.position_recovery_r2(8, 1, "add")
    with pytest.raises(ValueError, match="n_tokens must be at least 1"):
        P.position_recovery_r2(8, 16, "add", n_tokens=0)
    with pytest.raises(ValueError, match="token_std must be >= 0"):
        P.position_recovery_r2(8, 16, "add", token_std=-1.0)
    with pytest.raises(ValueError, match=r"n_samples must exceed the input width plus one \(17"):
        P.position_recovery_r2(8, 16, "concat", n_samples=17)
    with pytest.raises(ValueError, match="even"):
        P.position_recovery_r2(7, 16, "add")

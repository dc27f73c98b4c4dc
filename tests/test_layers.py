"""coursekit.layers against torch's transformer layers, Hugging Face GPT-2 shapes, and true properties."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import layers as L
from coursekit.attention import causal_mask, padding_mask
from tests.conftest import assert_close
from tests.conftest import randomise as _randomise

DTYPES = [torch.float64, torch.float32]
C, H, DFF = 16, 4, 24


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def randomise(module: nn.Module, seed: int = 0) -> nn.Module:
    return _randomise(module, seed, scale=0.5)


def torch_encoder_layer(norm_first, activation, bias=True, dropout=0.0, d_ff=DFF):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        C,
        H,
        dim_feedforward=d_ff,
        dropout=dropout,
        activation=activation,
        norm_first=norm_first,
        batch_first=True,
        bias=bias,
    )
    return randomise(layer.double())


def torch_decoder_layer(norm_first, activation, bias=True, dropout=0.0, d_ff=DFF):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(
        C,
        H,
        dim_feedforward=d_ff,
        dropout=dropout,
        activation=activation,
        norm_first=norm_first,
        batch_first=True,
        bias=bias,
    )
    return randomise(layer.double())


def ours_like(theirs: nn.Module, cls, **kwargs) -> nn.Module:
    ours = cls(C, H, DFF, **kwargs).double()
    ours.load_state_dict(from_torch(theirs))
    return ours


def from_torch(module: nn.Module) -> dict:
    return L.from_torch_state_dict(module.state_dict())


def torch_padding(keep: torch.Tensor) -> torch.Tensor:
    """Our (B, S) True = real token -> torch's key_padding_mask (True = ignore)."""
    return ~keep


# --------------------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(C,), (3, C), (2, 5, C), (2, 3, 4, C)])
def test_layer_norm_matches_torch(dtype, bias, shape):
    theirs = randomise(nn.LayerNorm(C, eps=1e-5, bias=bias).to(dtype))
    ours = L.LayerNorm(C, bias=bias).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    x = rand(*shape, dtype=dtype) * 3 + 2
    assert_close(ours(x), theirs(x))


def test_layer_norm_parameters_are_named_and_initialised_as_torch():
    ours, theirs = L.LayerNorm(C), nn.LayerNorm(C)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for k in theirs.state_dict():
        assert torch.equal(ours.state_dict()[k], theirs.state_dict()[k])
    assert "bias" not in L.LayerNorm(C, bias=False).state_dict()


def test_layer_norm_eps_inside_the_square_root():
    """A nearly constant row: eps dominates the tiny variance, as in nn.LayerNorm."""
    x = torch.full((2, C), 3.0, dtype=torch.float64) + rand(2, C) * 1e-4
    ours, theirs = L.LayerNorm(C, eps=1e-3).double(), nn.LayerNorm(C, eps=1e-3).double()
    assert_close(ours(x), theirs(x))
    assert torch.equal(
        L.LayerNorm(C).double()(torch.ones(3, C, dtype=torch.float64)), torch.zeros(3, C, dtype=torch.float64)
    )


def test_layer_norm_output_has_zero_mean_and_unit_biased_variance():
    y = L.LayerNorm(C, eps=0.0).double()(rand(4, 7, C) * 5 + 1)
    assert_close(y.mean(-1), torch.zeros(4, 7, dtype=torch.float64))
    assert_close(y.var(-1, unbiased=False), torch.ones(4, 7, dtype=torch.float64))


def test_layer_norm_treats_each_token_alone():
    """Unlike batch norm, a token's output does not depend on the rest of the batch."""
    ln = randomise(L.LayerNorm(C).double())
    x = rand(4, 5, C)
    y = x.clone()
    y[1:] = rand(3, 5, C, seed=1)
    assert_close(ln(x)[0], ln(y)[0])


def test_layer_norm_gradcheck():
    ln = randomise(L.LayerNorm(5).double())
    assert torch.autograd.gradcheck(ln, (rand(2, 3, 5).requires_grad_(),))


def test_layer_norm_rejects_the_wrong_width():
    with pytest.raises(ValueError, match=r"expected x of shape \(\.\.\., 16\), got \(2, 8\)"):
        L.LayerNorm(C)(torch.randn(2, 8))


# --------------------------------------------------------------------------- FeedForward


@pytest.mark.parametrize("activation,torch_act", [("relu", nn.ReLU()), ("gelu", nn.GELU())])
@pytest.mark.parametrize("bias", [True, False])
def test_feedforward_matches_a_torch_mlp(activation, torch_act, bias):
    ff = randomise(L.FeedForward(C, DFF, activation=activation, bias=bias).double())
    mlp = nn.Sequential(nn.Linear(C, DFF, bias=bias), torch_act, nn.Linear(DFF, C, bias=bias)).double()
    mlp[0].load_state_dict(ff.linear1.state_dict())
    mlp[2].load_state_dict(ff.linear2.state_dict())
    x = rand(2, 5, C)
    assert_close(ff(x), mlp(x))


def test_feedforward_d_ff_defaults_to_four_times_the_width():
    ff = L.FeedForward(C)
    assert (ff.linear1.in_features, ff.linear1.out_features, ff.linear2.out_features) == (C, 4 * C, C)


def test_feedforward_gelu_is_exact_not_tanh():
    ff = L.FeedForward(1, 1, activation="gelu", bias=False).double()
    with torch.no_grad():
        ff.linear1.weight.fill_(1.0)
        ff.linear2.weight.fill_(1.0)
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)[:, None]
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    assert_close(ff(x), exact)
    assert not torch.allclose(ff(x), F.gelu(x, approximate="tanh"), rtol=1e-7, atol=1e-9)


def test_feedforward_is_a_per_position_mlp():
    """Output t depends on input t only: the Jacobian between different positions is zero."""
    ff = randomise(L.FeedForward(4, 8, activation="gelu").double())
    x = rand(1, 3, 4)
    J = torch.autograd.functional.jacobian(ff, x)[0, :, :, 0]  # (T, C, T, C)
    for t in range(3):
        for s in range(3):
            assert (J[t, :, s].abs().sum() == 0) == (t != s)


def test_feedforward_rejects_an_unknown_activation():
    with pytest.raises(ValueError, match="activation must be 'relu' or 'gelu', got 'swish'"):
        L.FeedForward(C, activation="swish")


# --------------------------------------------------------------------------- choices by name


@pytest.mark.parametrize("bias", [True, False])
def test_fused_layer_norm_equals_chapter4_layer_norm(bias):
    a, b = randomise(L.LayerNorm(16, bias=bias)).double(), L.FusedLayerNorm(16, bias=bias).double()
    b.load_state_dict(a.state_dict())
    x = rand(3, 5, 16)
    assert_close(b(x), a(x))
    assert_close(b(x), F.layer_norm(x, (16,), a.weight, a.bias))


def test_the_tables_name_torch_modules():
    x = rand(4, 7) * 3
    expected = {"relu": F.relu(x), "gelu": F.gelu(x), "gelu_tanh": F.gelu(x, approximate="tanh")}
    assert set(L.ACTIVATIONS) == set(expected)
    for name, y in expected.items():
        assert_close(L.ACTIVATIONS[name]()(x), y)
    assert L.NORMS == {"layer_norm": L.LayerNorm, "fused": L.FusedLayerNorm}


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_by_name_is_a_feedforward_with_that_activation(activation):
    torch.manual_seed(0)
    ff = L.feed_forward(C, DFF, activation, dropout=0.25, bias=False).double()
    assert type(ff) is L.FeedForward and ff.dropout.p == 0.25 and ff.linear1.bias is None
    assert [n for n, _ in ff.named_children()] == ["linear1", "act", "dropout", "linear2"]
    x = rand(2, 3, C)
    act = L.ACTIVATIONS[activation]()
    assert_close(ff.eval()(x), ff.linear2(act(ff.linear1(x))))
    if activation != "gelu_tanh":  # the exercise's FeedForward computes the same with the same weights
        torch.manual_seed(0)
        assert_close(L.FeedForward(C, DFF, activation, bias=False).double().eval()(x), ff(x))
    with pytest.raises(
        ValueError, match=r"activation must be one of \['gelu', 'gelu_tanh', 'relu'\], got 'swish'"
    ):
        L.feed_forward(C, activation="swish")


# --------------------------------------------------------------------------- EncoderLayer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_encoder_layer_matches_torch_in_eval_mode(norm_first, activation, bias):
    theirs = torch_encoder_layer(norm_first, activation, bias=bias, dropout=0.1).eval()
    ours = ours_like(
        theirs, L.EncoderLayer, norm_first=norm_first, activation=activation, bias=bias, dropout=0.1
    ).eval()
    x = rand(3, 6, C)
    assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_masks_match_torch(norm_first):
    theirs = torch_encoder_layer(norm_first, "relu").eval()
    ours = ours_like(theirs, L.EncoderLayer, norm_first=norm_first).eval()
    x = rand(3, 6, C)
    keep = padding_mask([6, 4, 2])  # (B, T), True = real
    assert_close(ours(x, key_padding_mask=keep), theirs(x, src_key_padding_mask=torch_padding(keep)))
    causal = causal_mask(6)
    assert_close(ours(x, is_causal=True), theirs(x, src_mask=~causal, is_causal=True))
    assert_close(ours(x, mask=causal), theirs(x, src_mask=~causal))
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(3)) < 0.6
    mask[:, 0] = True
    assert_close(
        ours(x, mask=mask, key_padding_mask=keep), theirs(x, src_mask=~mask, src_key_padding_mask=~keep)
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_dropout_is_a_no_op_in_eval_mode(norm_first):
    a = L.EncoderLayer(C, H, dropout=0.5, norm_first=norm_first).double().eval()
    b = L.EncoderLayer(C, H, dropout=0.0, norm_first=norm_first).double().eval()
    b.load_state_dict(a.state_dict())
    x = rand(2, 5, C)
    assert torch.equal(a(x), b(x))
    a.train()
    assert not torch.allclose(a(x), b(x))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_training_mode_draws_the_same_dropout_masks_as_torch(norm_first):
    """With one sequence (B = 1), the same seed gives torch's output exactly: the dropouts
    sit in the same places and draw their masks in the same order.

    (With B > 1 torch's attention returns a transposed (T, B, C) tensor, and dropout draws
    its mask in that memory order, so the masks differ element by element while having
    the same distribution.)
    """
    theirs = torch_encoder_layer(norm_first, "gelu", dropout=0.2).train()
    ours = ours_like(theirs, L.EncoderLayer, norm_first=norm_first, activation="gelu", dropout=0.2).train()
    x = rand(1, 6, C)
    torch.manual_seed(1)
    expected = theirs(x)
    torch.manual_seed(1)
    assert_close(ours(x), expected)
    torch.manual_seed(2)
    assert not torch.allclose(ours(x), expected)


def test_encoder_layer_is_permutation_equivariant_and_causal_when_asked():
    layer = randomise(L.EncoderLayer(C, H, dropout=0.0).double()).eval()
    x = rand(2, 6, C)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(1))
    assert_close(layer(x[:, perm]), layer(x)[:, perm])
    y = x.clone()
    y[:, 4:] = rand(2, 2, C, seed=5)
    assert_close(layer(x, is_causal=True)[:, :4], layer(y, is_causal=True)[:, :4])
    assert not torch.allclose(layer(x)[:, :4], layer(y)[:, :4])


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_gradcheck(norm_first):
    layer = randomise(L.EncoderLayer(4, 2, 6, dropout=0.0, activation="gelu", norm_first=norm_first).double())
    x = rand(2, 3, 4).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: layer(x, is_causal=True), (x,))


def test_encoder_layer_rejects_a_bad_width():
    with pytest.raises(ValueError, match="expected x of shape"):
        L.EncoderLayer(C, H)(torch.randn(2, 5, C + 1))


# --------------------------------------------------------------------------- DecoderLayer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_decoder_layer_matches_torch_in_eval_mode(norm_first, activation, bias):
    theirs = torch_decoder_layer(norm_first, activation, bias=bias, dropout=0.1).eval()
    ours = ours_like(
        theirs, L.DecoderLayer, norm_first=norm_first, activation=activation, bias=bias, dropout=0.1
    ).eval()
    x, memory = rand(3, 5, C), rand(3, 7, C, seed=1)
    causal = causal_mask(5)
    assert_close(ours(x, memory), theirs(x, memory, tgt_mask=~causal, tgt_is_causal=True))
    assert_close(ours(x, memory, is_causal=False), theirs(x, memory))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_masks_match_torch(norm_first):
    theirs = torch_decoder_layer(norm_first, "gelu").eval()
    ours = ours_like(theirs, L.DecoderLayer, norm_first=norm_first, activation="gelu").eval()
    x, memory = rand(3, 5, C), rand(3, 7, C, seed=1)
    keep, mem_keep = padding_mask([5, 3, 4]), padding_mask([7, 2, 5])
    expected = theirs(
        x, memory, tgt_mask=~causal_mask(5), tgt_key_padding_mask=~keep, memory_key_padding_mask=~mem_keep
    )
    assert_close(ours(x, memory, key_padding_mask=keep, memory_key_padding_mask=mem_keep), expected)
    memory_mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(4)) < 0.5
    memory_mask[:, 0] = True
    expected = theirs(x, memory, tgt_mask=~causal_mask(5), memory_mask=~memory_mask)
    assert_close(ours(x, memory, memory_mask=memory_mask), expected)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_training_mode_draws_the_same_dropout_masks_as_torch(norm_first):
    theirs = torch_decoder_layer(norm_first, "relu", dropout=0.2).train()
    ours = ours_like(theirs, L.DecoderLayer, norm_first=norm_first, dropout=0.2).train()
    x, memory = rand(1, 5, C), rand(1, 7, C, seed=1)
    torch.manual_seed(1)
    expected = theirs(x, memory, tgt_mask=~causal_mask(5), tgt_is_causal=True)
    torch.manual_seed(1)
    assert_close(ours(x, memory), expected)
    ours.eval()
    assert not torch.allclose(ours(x, memory), expected)


def test_decoder_layer_is_causal_and_ignores_padded_memory():
    layer = randomise(L.DecoderLayer(C, H, dropout=0.0, norm_first=True).double()).eval()
    x, memory = rand(2, 6, C), rand(2, 7, C, seed=1)
    y = x.clone()
    y[:, 3:] = rand(2, 3, C, seed=2)
    assert_close(layer(x, memory)[:, :3], layer(y, memory)[:, :3])
    mem_keep = padding_mask([7, 4])
    other = memory.clone()
    other[1, 4:] = rand(3, C, seed=3)
    assert_close(
        layer(x, memory, memory_key_padding_mask=mem_keep), layer(x, other, memory_key_padding_mask=mem_keep)
    )
    assert not torch.allclose(layer(x, memory)[1], layer(x, other)[1])


def test_decoder_layer_reads_the_memory_through_cross_attention():
    layer = randomise(L.DecoderLayer(C, H, dropout=0.0).double()).eval()
    x = rand(2, 5, C)
    a, b = layer(x, rand(2, 7, C, seed=1)), layer(x, rand(2, 3, C, seed=2))
    assert a.shape == b.shape == (2, 5, C) and not torch.allclose(a, b)


def test_decoder_layer_gradcheck():
    layer = randomise(L.DecoderLayer(4, 2, 6, dropout=0.0, norm_first=True).double())
    x, memory = rand(2, 3, 4).requires_grad_(), rand(2, 4, 4, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(layer, (x, memory))


# --------------------------------------------------------------------------- stacks and the weight mapping


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_matches_torch(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(C, H, DFF, dropout=0.0, norm_first=norm_first, batch_first=True)
    theirs = nn.TransformerEncoder(
        layer, num_layers=3, norm=nn.LayerNorm(C) if norm_first else None, enable_nested_tensor=False
    )
    theirs = randomise(theirs.double()).eval()
    ours = L.Encoder(3, C, H, DFF, norm_first=norm_first).double().eval()
    ours.load_state_dict(from_torch(theirs))
    x, keep = rand(2, 6, C), padding_mask([6, 3])
    assert_close(ours(x, key_padding_mask=keep), theirs(x, src_key_padding_mask=~keep))
    assert (ours.norm is None) == (not norm_first)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_stack_matches_torch(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(C, H, DFF, dropout=0.0, norm_first=norm_first, batch_first=True)
    theirs = nn.TransformerDecoder(layer, num_layers=2, norm=nn.LayerNorm(C) if norm_first else None)
    theirs = randomise(theirs.double()).eval()
    ours = L.Decoder(2, C, H, DFF, norm_first=norm_first).double().eval()
    ours.load_state_dict(from_torch(theirs))
    x, memory, mem_keep = rand(2, 5, C), rand(2, 6, C, seed=1), padding_mask([6, 4])
    expected = theirs(
        x, memory, tgt_mask=~causal_mask(5), tgt_is_causal=True, memory_key_padding_mask=~mem_keep
    )
    assert_close(ours(x, memory, memory_key_padding_mask=mem_keep), expected)


@pytest.mark.parametrize("bias", [True, False])
def test_weight_mapping_covers_every_tensor_both_ways(bias):
    cases = [
        (
            nn.TransformerEncoderLayer(C, H, DFF, batch_first=True, bias=bias),
            L.EncoderLayer(C, H, DFF, bias=bias),
        ),
        (
            nn.TransformerDecoderLayer(C, H, DFF, batch_first=True, bias=bias),
            L.DecoderLayer(C, H, DFF, bias=bias),
        ),
        (
            nn.TransformerDecoder(
                nn.TransformerDecoderLayer(C, H, DFF, batch_first=True, bias=bias),
                2,
                norm=nn.LayerNorm(C, bias=bias),
            ),
            L.Decoder(2, C, H, DFF, norm_first=True, bias=bias),
        ),
    ]
    for theirs, ours in cases:
        sd = theirs.state_dict()
        mapped = L.from_torch_state_dict(sd)
        assert mapped.keys() == ours.state_dict().keys()
        assert L.to_torch_state_dict(ours.state_dict()).keys() == sd.keys()
        back = L.to_torch_state_dict(mapped)
        assert back.keys() == sd.keys() and all(back[k] is v for k, v in sd.items())


def test_weight_mapping_worked_example():
    w = torch.zeros(1)
    assert L.from_torch_state_dict({"layers.0.linear1.weight": w}) == {"layers.0.ff.linear1.weight": w}
    assert L.from_torch_state_dict({"multihead_attn.in_proj_bias": w}) == {"cross_attn.qkv_proj.bias": w}


def test_stacks_reject_zero_layers():
    for cls in (L.Encoder, L.Decoder):
        with pytest.raises(ValueError, match="n_layers must be at least 1"):
            cls(0, C, H)


@pytest.mark.parametrize("cls", [L.Encoder, L.Decoder])
@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_build_every_norm_from_the_table(cls, norm_first):
    plain = randomise(cls(2, C, H, DFF, norm_first=norm_first, eps=1e-6)).double().eval()
    fused = cls(2, C, H, DFF, norm_first=norm_first, eps=1e-6, norm="fused").double().eval()
    fused.load_state_dict(plain.state_dict())  # the same parameters under the same names, in the same order
    assert list(fused.state_dict()) == list(plain.state_dict())
    norms = [m for m in fused.modules() if isinstance(m, L.LayerNorm)]
    per_layer = 2 if cls is L.Encoder else 3
    assert len(norms) == 2 * per_layer + norm_first  # a pre-norm stack ends with one more
    assert all(type(m) is L.FusedLayerNorm and m.eps == 1e-6 for m in norms)
    assert not any(type(m) is L.FusedLayerNorm for m in plain.modules())
    x, memory = rand(2, 5, C), rand(2, 6, C, seed=1)
    args = (x,) if cls is L.Encoder else (x, memory)
    assert_close(fused(*args), plain(*args))
    with pytest.raises(ValueError, match=r"norm must be one of \['fused', 'layer_norm'\], got 'rms'"):
        cls(1, C, H, norm="rms")


# --------------------------------------------------------------------------- parameter counts


def numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("d_model,d_ff", [(16, None), (16, 24), (64, 100)])
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_counts_equal_torch_modules(d_model, d_ff, bias):
    torch_ff = 2048 if d_ff is None else d_ff  # torch's default differs; pass ours explicitly
    ff = 4 * d_model if d_ff is None else d_ff
    assert L.layer_norm_params(d_model, bias) == numel(nn.LayerNorm(d_model, bias=bias))
    assert L.attention_params(d_model, bias) == numel(nn.MultiheadAttention(d_model, 4, bias=bias))
    assert L.feedforward_params(d_model, d_ff, bias) == numel(nn.Linear(d_model, ff, bias=bias)) + numel(
        nn.Linear(ff, d_model, bias=bias)
    )
    assert L.encoder_layer_params(d_model, ff, bias) == numel(
        nn.TransformerEncoderLayer(d_model, 4, ff, bias=bias)
    )
    assert L.decoder_layer_params(d_model, ff, bias) == numel(
        nn.TransformerDecoderLayer(d_model, 4, ff, bias=bias)
    )
    assert L.encoder_layer_params(d_model, torch_ff, bias) == numel(
        nn.TransformerEncoderLayer(d_model, 4, torch_ff, bias=bias)
    )


@pytest.mark.parametrize("d_model,d_ff", [(16, None), (16, 24), (64, 100)])
@pytest.mark.parametrize("bias", [True, False])
def test_parameter_counts_equal_our_modules(d_model, d_ff, bias):
    assert L.layer_norm_params(d_model, bias) == L.count_params(L.LayerNorm(d_model, bias=bias))
    assert L.feedforward_params(d_model, d_ff, bias) == L.count_params(
        L.FeedForward(d_model, d_ff, bias=bias)
    )
    assert L.encoder_layer_params(d_model, d_ff, bias) == L.count_params(
        L.EncoderLayer(d_model, 4, d_ff, bias=bias)
    )
    assert L.decoder_layer_params(d_model, d_ff, bias) == L.count_params(
        L.DecoderLayer(d_model, 4, d_ff, bias=bias)
    )
    assert L.moe_feedforward_params(d_model, 3, d_ff, bias) == L.count_params(
        L.MoEFeedForward(d_model, 3, 2, d_ff, bias=bias)
    )


def test_closed_forms_at_d_ff_4c():
    for c in (8, 768):
        assert L.encoder_layer_params(c) == 12 * c * c + 13 * c
        assert L.decoder_layer_params(c) == 16 * c * c + 19 * c


def gpt_like(shape: L.GPTShape, tied: bool = True) -> nn.Module:
    """A GPT-2-shaped model from coursekit modules, on the meta device (no memory, no weights)."""
    with torch.device("meta"):
        model = nn.ModuleDict(
            {
                "wte": nn.Embedding(shape.vocab_size, shape.d_model),
                "wpe": nn.Embedding(shape.n_positions, shape.d_model),
                "blocks": L.Encoder(
                    shape.n_layers, shape.d_model, shape.n_heads, activation="gelu", norm_first=True
                ),
            }
        )
        if not tied:
            model["head"] = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
    return model


#: Published sizes of the GPT-2 family (tied embeddings), as Hugging Face reports them.
GPT2_SIZES = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
}


@pytest.mark.parametrize("name", list(L.GPT2_SHAPES))
def test_gpt_params_counts_the_gpt2_family_exactly(name):
    s = L.GPT2_SHAPES[name]
    exact = L.gpt_params(s.vocab_size, s.n_positions, s.d_model, s.n_layers)
    assert exact == GPT2_SIZES[name]
    assert exact == L.count_params(gpt_like(s))
    untied = L.gpt_params(s.vocab_size, s.n_positions, s.d_model, s.n_layers, tied=False)
    assert untied == L.count_params(gpt_like(s, tied=False)) == exact + s.vocab_size * s.d_model


@pytest.mark.parametrize("name", list(L.GPT2_SHAPES))
def test_gpt_params_equal_hugging_face_gpt2_on_the_meta_device(name):
    import transformers

    s = L.GPT2_SHAPES[name]
    config = transformers.GPT2Config(
        n_layer=s.n_layers,
        n_embd=s.d_model,
        n_head=s.n_heads,
        vocab_size=s.vocab_size,
        n_positions=s.n_positions,
    )
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    assert L.gpt_params(s.vocab_size, s.n_positions, s.d_model, s.n_layers) == numel(model)


def test_the_rule_of_thumb_drops_exactly_positions_biases_and_norms():
    for s in L.GPT2_SHAPES.values():
        V, T, c, n = s.vocab_size, s.n_positions, s.d_model, s.n_layers
        dropped = T * c + n * 13 * c + 2 * c
        assert L.gpt_params(V, T, c, n) - L.approx_gpt_params(V, c, n) == dropped


# --------------------------------------------------------------------------- mixture of experts


def moe(k=2, n_experts=4, normalize=True, d_model=8, seed=0):
    torch.manual_seed(seed)
    return randomise(L.MoEFeedForward(d_model, n_experts, k=k, d_ff=12, normalize=normalize).double(), seed)


def dense_loop(m: L.MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Independent reference: per token, sort the router's logits in Python, take the best k,
    gate with the softmax over those k (or the full softmax), and sum the experts' outputs."""
    B, T, C_ = x.shape
    out = torch.zeros_like(x)
    for b in range(B):
        for t in range(T):
            logits = (m.router.weight @ x[b, t]).tolist()
            best = sorted(range(len(logits)), key=lambda e: -logits[e])[: m.k]
            pool = best if m.normalize else range(len(logits))
            z = sum(math.exp(logits[e]) for e in pool)
            for e in best:
                out[b, t] += math.exp(logits[e]) / z * m.experts[e](x[b, t])
    return out


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("normalize", [True, False])
def test_moe_equals_a_dense_loop_over_tokens(k, normalize):
    m = moe(k=k, normalize=normalize)
    x = rand(2, 5, 8)
    out, _ = m(x)
    assert_close(out, dense_loop(m, x))


def test_moe_with_every_expert_is_the_softmax_mixture():
    m = moe(k=4)
    x = rand(2, 3, 8)
    p = torch.softmax(m.router(x), dim=-1)  # (B, T, E)
    expected = sum(p[..., e : e + 1] * m.experts[e](x) for e in range(4))
    assert_close(m(x)[0], expected)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_moe_sends_each_token_to_exactly_k_experts_by_index(k):
    m = moe(k=k, n_experts=5)
    x = rand(3, 4, 8)
    seen = {e: [] for e in range(5)}
    hooks = [
        m.experts[e].register_forward_hook(lambda mod, inp, out, e=e: seen[e].append(inp[0]))
        for e in range(5)
    ]
    m(x)
    for h in hooks:
        h.remove()
    flat = x.reshape(-1, 8)  # (N, C)
    received = torch.zeros(flat.shape[0], dtype=torch.long)
    for e, batches in seen.items():
        rows = torch.cat(batches) if batches else flat[:0]
        # each row an expert received is one of the tokens, and only tokens routed there
        match = (rows[:, None, :] == flat[None, :, :]).all(-1)  # (n_e, N)
        assert (match.sum(1) == 1).all()
        tokens = match.float().argmax(1)
        assert len(set(tokens.tolist())) == len(tokens)  # no token twice to the same expert
        received[tokens] += 1
        _, chosen, _ = m.route(flat)
        assert set(tokens.tolist()) == set((chosen == e).any(-1).nonzero().flatten().tolist())
    assert (received == k).all()
    _, chosen, gates = m.route(flat)
    assert chosen.shape == gates.shape == (12, k)
    assert all(len(set(row)) == k for row in chosen.tolist())


def test_moe_gates():
    x = rand(6, 8)
    m = moe(k=2)
    probs, chosen, gates = m.route(x)
    assert_close(gates.sum(-1), torch.ones(6, dtype=torch.float64))
    assert_close(gates, probs.gather(-1, chosen) / probs.gather(-1, chosen).sum(-1, keepdim=True))
    m.normalize = False
    probs, chosen, gates = m.route(x)
    assert_close(gates, probs.gather(-1, chosen))
    assert (probs.gather(-1, chosen) >= probs.topk(2, -1).values[:, -1:]).all()


def test_moe_aux_loss_is_one_for_uniform_routing_and_n_experts_for_collapse():
    E = 4
    for k in (1, 2):
        m = L.MoEFeedForward(E, E, k=k, d_ff=4).double()
        with torch.no_grad():
            m.router.weight.copy_(torch.eye(E) * 3)
        # token i prefers expert i (then i+1): a cyclic design, so f and P are both uniform
        x = torch.stack([torch.eye(E)[i] + 0.5 * torch.eye(E)[(i + 1) % E] for i in range(E)]).double()
        _, aux = m(x.repeat(3, 1)[None])
        assert_close(aux, torch.tensor(1.0, dtype=torch.float64))
    m = L.MoEFeedForward(E, E, k=1, d_ff=4).double()
    with torch.no_grad():
        m.router.weight.zero_()
        m.router.weight[0].fill_(100.0)
    _, aux = m(torch.ones(1, 5, E, dtype=torch.float64))
    assert_close(aux, torch.tensor(float(E), dtype=torch.float64))


@pytest.mark.parametrize("k", [1, 2])
def test_moe_aux_loss_equals_hugging_face_mixtral_divided_by_k(k):
    """Hugging Face counts f_i over tokens (summing to k), we over assignments (summing to 1)."""
    from transformers.models.mixtral import modeling_mixtral as mixtral

    m = moe(k=k, n_experts=6)
    x = rand(3, 7, 8)
    _, aux = m(x)
    logits = m.router(x.reshape(-1, 8)).float().detach()
    theirs = mixtral.load_balancing_loss_func((logits,), num_experts=6, top_k=k)
    torch.testing.assert_close(aux.float() * k, theirs)


def test_moe_gradients_reach_the_router():
    x = rand(2, 5, 8)
    m = moe(k=2)
    out, aux = m(x)
    out.sum().backward()
    assert m.router.weight.grad.abs().sum() > 0  # through the gates
    # k = 1 with renormalised gates: the gate is always 1, so only the aux loss trains the router
    m = moe(k=1)
    m(x)[0].sum().backward()
    assert m.router.weight.grad is None or m.router.weight.grad.abs().sum() == 0
    m(x)[1].backward()
    assert m.router.weight.grad.abs().sum() > 0
    m = moe(k=1, normalize=False)  # Switch: the gate is p_i, which depends on the router
    m(x)[0].sum().backward()
    assert m.router.weight.grad.abs().sum() > 0


def test_moe_gradcheck():
    m = moe(k=2, d_model=4)
    x = rand(1, 3, 4).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: m(x)[0], (x,))
    assert torch.autograd.gradcheck(lambda x: m(x)[1], (x,))


def test_moe_rejects_bad_arguments():
    with pytest.raises(ValueError, match="need 1 <= k <= n_experts, got k=5 and n_experts=4"):
        L.MoEFeedForward(C, 4, k=5)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, C\)"):
        L.MoEFeedForward(C, 4)(torch.randn(3, C))


# --------------------------------------------------------------------------- RMSNorm and SwiGLU (Llama)


def llama_config(**kwargs):
    """A tiny random Llama configuration: nothing is downloaded."""
    from transformers import LlamaConfig

    defaults = dict(
        hidden_size=C,
        intermediate_size=40,
        num_hidden_layers=1,
        num_attention_heads=H,
        vocab_size=32,
        hidden_act="silu",
        rms_norm_eps=1e-6,
    )
    return LlamaConfig(**{**defaults, **kwargs})


def from_llama_mlp(module: nn.Module) -> dict:
    """Hugging Face ``LlamaMLP`` weights under our names, through the one mapping ``LLAMA_MLP_TO_OURS``."""
    out = {}
    for key, value in module.state_dict().items():
        first, _, rest = key.partition(".")
        out[f"{L.LLAMA_MLP_TO_OURS[first]}.{rest}"] = value
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(C,), (3, C), (2, 5, C)])
def test_rms_norm_matches_torch_rms_norm(dtype, shape):
    ours = randomise(L.RMSNorm(C)).to(dtype)
    theirs = nn.RMSNorm(C, eps=1e-6).to(dtype)
    theirs.load_state_dict(ours.state_dict())  # one parameter, "weight", in both
    x = rand(*shape, dtype=dtype) * 3 + 1
    assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("shape", [(3, C), (2, 5, C)])
def test_rms_norm_matches_hugging_face_llama_rms_norm(shape):
    """LlamaRMSNorm computes in float32 whatever its input (it upcasts, then casts back), so the
    comparison is in float32 at float32's tolerance."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    config = llama_config()
    theirs = randomise(LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps))
    ours = L.RMSNorm(C, eps=config.rms_norm_eps)
    ours.load_state_dict(theirs.state_dict())
    x = rand(*shape, dtype=torch.float32) * 3 + 1
    assert_close(ours(x), theirs(x))


def test_rms_norm_is_layer_norm_without_the_mean():
    """On tokens of mean zero the two norms agree; with a mean they do not, and RMSNorm (unlike
    LayerNorm) changes when a constant is added to every feature, but not when x is rescaled."""
    rms, ln = L.RMSNorm(C, eps=1e-6).double(), L.LayerNorm(C, eps=1e-6, bias=False).double()
    x = rand(4, C) * 2 + 0.5
    centred = x - x.mean(dim=-1, keepdim=True)
    assert_close(rms(centred), ln(centred))
    assert not torch.allclose(rms(x), ln(x), rtol=1e-3, atol=1e-3)
    assert_close(ln(x + 3.0), ln(x))
    assert not torch.allclose(rms(x + 3.0), rms(x), rtol=1e-3, atol=1e-3)
    exact = L.RMSNorm(C, eps=0.0).double()
    assert_close(exact(7.0 * x), exact(x))


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_matches_hugging_face_llama_mlp(bias):
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = llama_config(mlp_bias=bias)
    theirs = randomise(LlamaMLP(config).double())
    ours = L.SwiGLU(C, config.intermediate_size, bias=bias).double()
    ours.load_state_dict(from_llama_mlp(theirs))  # strict: every tensor mapped, none left over
    x = rand(2, 5, C)
    assert_close(ours(x), theirs(x))
    assert (
        L.count_params(ours) == L.count_params(theirs) == L.swiglu_params(C, config.intermediate_size, bias)
    )


def test_swiglu_is_down_of_silu_gate_times_up():
    """The formula written out with the sigmoid, not F.silu: ``((x Wg^T) sigmoid(x Wg^T) * x Wu^T) Wd^T``."""
    m = randomise(L.SwiGLU(C, 24).double())
    x = rand(3, 4, C)
    g, u = x @ m.gate.weight.T, x @ m.up.weight.T  # (3, 4, 24) each
    assert_close(m(x), (g * torch.sigmoid(g) * u) @ m.down.weight.T)


def test_swiglu_defaults_follow_llama():
    m = L.SwiGLU(48)
    assert m.d_ff == 128 == int(8 * 48 / 3)
    assert (m.gate.bias, m.up.bias, m.down.bias) == (None, None, None)
    assert (m.gate.weight.shape, m.up.weight.shape, m.down.weight.shape) == ((128, 48), (128, 48), (48, 128))


def test_swiglu_is_a_per_position_mlp():
    m = randomise(L.SwiGLU(4, 6).double())
    J = torch.autograd.functional.jacobian(m, rand(1, 3, 4))[0, :, :, 0]  # (T, C, T, C)
    for t in range(3):
        for s in range(3):
            assert (J[t, :, s].abs().sum() == 0) == (t != s)


def test_swiglu_dropout_acts_on_the_hidden_product_in_training_only():
    m = randomise(L.SwiGLU(C, 24, dropout=1.0).double())
    x = rand(2, C)
    assert torch.equal(m.train()(x), torch.zeros(2, C, dtype=torch.float64))  # no biases: all dropped
    assert m.eval()(x).abs().sum() > 0


def test_swiglu_gradcheck():
    m = randomise(L.SwiGLU(4, 6, bias=True).double())
    assert torch.autograd.gradcheck(m, (rand(2, 3, 4).requires_grad_(),))


@pytest.mark.parametrize("c", [8, 16, 32, 768, 4096])
def test_swiglu_at_8c_over_3_costs_what_a_4c_mlp_costs_up_to_rounding(c):
    """Three C x int(8C/3) matrices against two C x 4C ones: fewer by less than one hidden unit (3C)."""
    with torch.device("meta"):  # shapes only
        swiglu = L.count_params(L.SwiGLU(c))
        gelu = L.count_params(L.FeedForward(c, bias=False))
    assert gelu == 8 * c * c
    assert 0 <= gelu - swiglu < 3 * c


@pytest.mark.parametrize("bias", [False, True])
def test_swiglu_params_equal_the_module(bias):
    with torch.device("meta"):
        for c, d_ff in ((16, None), (16, 40), (64, 171)):
            assert L.swiglu_params(c, d_ff, bias) == L.count_params(L.SwiGLU(c, d_ff, bias=bias))


@pytest.mark.parametrize(
    "args,width",
    [
        ((4096,), 11008),  # Llama 7B
        ((5120,), 13824),  # Llama 13B
        ((6656,), 17920),  # Llama 33B
        ((8192,), 22016),  # Llama 65B
        ((8192, 4096, 1.3), 28672),  # Llama 2 70B
        ((4096, 1024, 1.3), 14336),  # Llama 3 8B
        ((32, 1), 85),  # int(8 C / 3)
        ((32, 8), 88),  # rounded up to a multiple of 8
    ],
)
def test_llama_ffn_hidden_gives_the_published_widths(args, width):
    assert L.llama_ffn_hidden(*args) == width


def test_llama_ffn_hidden_matches_hugging_face_llama_config_defaults():
    """LlamaConfig's defaults are Llama 7B's shapes (a configuration object only: no weights)."""
    from transformers import LlamaConfig

    config = LlamaConfig()
    assert L.llama_ffn_hidden(config.hidden_size) == config.intermediate_size


def test_swiglu_and_llama_ffn_hidden_reject_bad_arguments():
    with pytest.raises(ValueError, match=r"expected x of shape \(\.\.\., 16\), got \(2, 8\)"):
        L.SwiGLU(C)(torch.randn(2, 8))
    with pytest.raises(ValueError, match="SwiGLU needs d_model >= 1 and d_ff >= 1, got d_model=16, d_ff=0"):
        L.SwiGLU(C, 0)
    with pytest.raises(ValueError, match="multiple_of must be a positive integer, got 0"):
        L.llama_ffn_hidden(C, multiple_of=0)
    with pytest.raises(ValueError, match="d_model must be a positive integer, got 2.5"):
        L.llama_ffn_hidden(2.5)
    with pytest.raises(ValueError, match="ffn_dim_multiplier must be positive"):
        L.llama_ffn_hidden(C, ffn_dim_multiplier=0.0)

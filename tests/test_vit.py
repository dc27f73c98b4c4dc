"""coursekit.vit against independent references: F.unfold, Conv2d, explicit slicing, Hugging Face
ViTForImageClassification (tiny random configs, no download), scikit-learn's split, and true properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import vit
from coursekit.layers import count_params
from tests.conftest import assert_close, randomise

transformers = pytest.importorskip("transformers")
from transformers import ViTConfig as HFViTConfig  # noqa: E402
from transformers import ViTForImageClassification  # noqa: E402

NANO = vit.VIT_PRESETS["nano"]  # 8x8 RGB images, 2x2 patches, 5 classes
#: Hugging Face's eager attention takes its softmax in float32 even for float64 inputs, so
#: attention weights read from it agree to about 1e-7, not to float64 rounding.
HF_EAGER_ATOL = 1e-6


def hf_model(cfg=NANO, seed=0, attn="sdpa", dtype=torch.float64):
    torch.manual_seed(seed)
    hf = ViTForImageClassification(HFViTConfig(**vit.hf_config_kwargs(cfg), attn_implementation=attn))
    return randomise(hf.to(dtype), seed).eval()


def ours_from(hf, cfg=NANO):
    m = vit.ViT(cfg).to(hf.dtype).eval()
    m.load_state_dict(vit.from_hf_state_dict(hf.state_dict()))
    return m


def images(B, C_in=3, H=8, W=8, seed=0, dtype=torch.float64):
    return torch.randn(B, C_in, H, W, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def sliced_patches(x: torch.Tensor, P: int) -> torch.Tensor:
    """The patches cut one by one with explicit slices, row by row: an independent patchify."""
    B, _, H, W = x.shape
    out = [
        x[:, :, r * P : (r + 1) * P, c * P : (c + 1) * P].reshape(B, -1)
        for r in range(H // P)
        for c in range(W // P)
    ]
    return torch.stack(out, dim=1)


# --------------------------------------------------------------------------- patches


def test_patchify_worked_example():
    x = torch.arange(16.0).view(1, 1, 4, 4)
    expected = torch.tensor(
        [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]], dtype=torch.float32
    )
    assert torch.equal(vit.patchify(x, 2), expected[None])


@pytest.mark.parametrize(
    "shape,P", [((2, 3, 8, 8), 2), ((3, 1, 8, 8), 4), ((2, 3, 6, 9), 3), ((1, 2, 8, 4), 1), ((2, 3, 8, 8), 8)]
)
def test_patchify_equals_unfold_and_explicit_slices(shape, P):
    x = images(*shape)
    p = vit.patchify(x, P)
    N_p = (shape[2] // P) * (shape[3] // P)
    assert p.shape == (shape[0], N_p, shape[1] * P * P)
    assert torch.equal(
        p, F.unfold(x, kernel_size=P, stride=P).transpose(1, 2)
    )  # (B, C_in P^2, N_p) -> (B, N_p, C_in P^2)
    assert torch.equal(p, sliced_patches(x, P))


@pytest.mark.parametrize("shape,P", [((2, 3, 8, 8), 2), ((2, 3, 6, 9), 3), ((1, 1, 8, 8), 8)])
def test_unpatchify_inverts_patchify_both_ways(shape, P):
    x = images(*shape)
    assert torch.equal(vit.unpatchify(vit.patchify(x, P), P, shape[2:]), x)
    patches = torch.randn(2, (shape[2] // P) * (shape[3] // P), shape[1] * P * P, dtype=torch.float64)
    assert torch.equal(vit.patchify(vit.unpatchify(patches, P, shape[2:]), P), patches)
    assert torch.equal(
        vit.unpatchify(vit.patchify(x, P), P, shape[2:]),
        F.fold(vit.patchify(x, P).transpose(1, 2), shape[2:], kernel_size=P, stride=P),
    )


def test_patchify_and_its_inverse_have_correct_gradients():
    x = images(2, 2, 4, 6).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: vit.patchify(t, 2), (x,))
    p = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: vit.unpatchify(t, 2, (4, 4)), (p,))


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda: vit.patchify(images(1, 3, 8, 8), 3), r"image size 8x8 is not divisible by patch_size=3"),
        (lambda: vit.patchify(images(1, 3, 8, 6), 4), r"8x6 is not divisible by patch_size=4"),
        (
            lambda: vit.patchify(torch.zeros(3, 8, 8), 2),
            r"expected images of shape \(B, C_in, H_img, W_img\), got \(3, 8, 8\)",
        ),
        (lambda: vit.patchify(images(1), 0), r"patch_size must be a positive integer, got 0"),
        (
            lambda: vit.unpatchify(torch.zeros(1, 5, 12), 2, 4),
            r"expected patches of shape \(B, 4, C_in \* 4\)",
        ),
        (
            lambda: vit.unpatchify(torch.zeros(1, 4, 12), 3, 4),
            r"must be a positive integer dividing the image size 4x4",
        ),
        (lambda: vit.PatchEmbedding(8, 3, 1, 16), r"patch_size=3 must divide image_size=8"),
        (
            lambda: vit.PatchEmbedding(8, 2, 3, 16)(images(1, 1, 8, 8, dtype=torch.float32)),
            r"expected images of shape \(B, 3, 8, 8\), got \(1, 1, 8, 8\)",
        ),
        (
            lambda: vit.PatchEmbedding(8, 2, 3, 16)(images(1, 3, 16, 16, dtype=torch.float32)),
            r"expected images of shape \(B, 3, 8, 8\), got \(1, 3, 16, 16\)",
        ),
        (
            lambda: vit.ViTConfig(
                image_size=10, patch_size=4, in_channels=1, n_classes=2, n_layers=1, n_heads=1, d_model=4
            ),
            r"patch_size=4 must divide image_size=10",
        ),
        (lambda: replace(NANO, n_heads=3), r"n_heads=3 must divide d_model=16"),
        (lambda: replace(NANO, in_channels=0), r"in_channels must be a positive integer, got 0"),
        (
            lambda: vit.ViT(NANO).float()(images(2, 1, 8, 8, dtype=torch.float32)),
            r"expected images of shape \(B, 3, 8, 8\)",
        ),
        (
            lambda: vit.add_cls_and_positions(torch.zeros(2, 4, 8), torch.zeros(1, 1, 8), torch.zeros(4, 8)),
            r"expected cls_token \(1, 1, 8\) and positions \(5, 8\), got \(1, 1, 8\) and \(4, 8\)",
        ),
    ],
)
def test_bad_inputs_raise_clear_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_vit_takes_a_config():
    with pytest.raises(TypeError, match="ViT takes a ViTConfig"):
        vit.ViT({"image_size": 8, "patch_size": 2})


def test_patch_embedding_is_a_strided_conv2d():
    emb = randomise(vit.PatchEmbedding(8, 2, 3, 16)).double()
    conv = nn.Conv2d(3, 16, kernel_size=2, stride=2).double()
    with torch.no_grad():
        conv.weight.copy_(emb.proj.weight.view(16, 3, 2, 2))  # (C, C_in P^2) -> (C, C_in, P, P)
        conv.bias.copy_(emb.proj.bias)
    x = images(4)
    expected = conv(x).flatten(2).transpose(1, 2)  # (B, C, 4, 4) -> (B, N_p, C), row-major patches
    assert_close(emb(x), expected)


def test_add_cls_and_positions_puts_cls_first_and_adds_a_position_to_every_token():
    B, N_p, C = 3, 4, 5
    patches = torch.randn(B, N_p, C, dtype=torch.float64)
    cls = torch.randn(1, 1, C, dtype=torch.float64)
    pos = torch.randn(N_p + 1, C, dtype=torch.float64)
    out = vit.add_cls_and_positions(patches, cls, pos)
    assert out.shape == (B, N_p + 1, C)
    for b in range(B):
        assert_close(out[b, 0], cls[0, 0] + pos[0])
        for n in range(N_p):
            assert_close(out[b, n + 1], patches[b, n] + pos[n + 1])
    args = (patches.requires_grad_(), cls.requires_grad_(), pos.requires_grad_())
    assert torch.autograd.gradcheck(vit.add_cls_and_positions, args)


# --------------------------------------------------------------------------- Hugging Face parity


def test_logits_equal_hf_vit_float64():
    hf = hf_model()
    m = ours_from(hf)
    x = images(4)
    assert_close(m(x), hf(pixel_values=x).logits)


def test_logits_equal_hf_vit_float32_with_default_init():
    """HF's own initialisation and default attention kernel, float32, with more layers and a 4x4 patch."""
    cfg = replace(NANO, patch_size=4, n_layers=3, n_heads=4, d_model=32, n_classes=7, d_ff=48)
    torch.manual_seed(3)
    hf = ViTForImageClassification(HFViTConfig(**vit.hf_config_kwargs(cfg))).eval()
    m = ours_from(hf, cfg)
    x = images(5, seed=3, dtype=torch.float32)
    assert_close(m(x), hf(pixel_values=x).logits)


def test_mapping_round_trips_with_hf_names_and_shapes():
    torch.manual_seed(0)
    m = randomise(vit.ViT(NANO))
    sd = m.state_dict()
    hf_sd = vit.to_hf_state_dict(sd, NANO.patch_size)
    theirs = ViTForImageClassification(HFViTConfig(**vit.hf_config_kwargs(NANO))).state_dict()
    assert hf_sd.keys() == theirs.keys()
    assert all(hf_sd[k].shape == theirs[k].shape for k in theirs)
    back = vit.from_hf_state_dict(hf_sd)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    hf = ViTForImageClassification(HFViTConfig(**vit.hf_config_kwargs(NANO))).eval()
    hf.load_state_dict(hf_sd)  # strict: our weights fill every HF parameter
    x = images(2, dtype=torch.float32)
    assert_close(m.eval()(x), hf(pixel_values=x).logits)


def test_from_hf_rejects_unknown_keys_and_incomplete_qkv():
    sd = hf_model().state_dict()
    with pytest.raises(ValueError, match="unexpected Hugging Face key 'vit.pooler.dense.weight'"):
        vit.from_hf_state_dict({**sd, "vit.pooler.dense.weight": torch.zeros(1)})
    partial = {k: v for k, v in sd.items() if k != "vit.layers.1.attention.k_proj.bias"}
    with pytest.raises(
        ValueError, match=r"layer 1 bias: expected q_proj, k_proj and v_proj, got \['q_proj', 'v_proj'\]"
    ):
        vit.from_hf_state_dict(partial)
    with pytest.raises(ValueError, match="no Hugging Face name for 'decoder.weight'"):
        vit.to_hf_state_dict({"decoder.weight": torch.zeros(1)}, 2)


def test_cls_attention_equals_hf_last_layer_attention_averaged_over_heads():
    hf = hf_model(attn="eager")
    m = ours_from(hf)
    x = images(3, seed=1)
    expected = hf(pixel_values=x, output_attentions=True).attentions[-1][:, :, 0, 1:].mean(dim=1)  # (B, N_p)
    got = vit.cls_attention(m.train(), x)
    assert m.training  # the mode is restored
    assert got.shape == (3, NANO.n_patches)
    torch.testing.assert_close(got, expected, rtol=0, atol=HF_EAGER_ATOL)
    assert bool((got.sum(-1) < 1).all())  # the weight on [CLS] itself is left out


# --------------------------------------------------------------------------- properties


def test_cls_output_invariant_when_patches_move_with_their_positions():
    """Attention has no notion of order: permuting the patch tokens together with their position
    vectors changes nothing the [CLS] token sees."""
    torch.manual_seed(0)
    m = randomise(vit.ViT(NANO)).double().eval()
    x = images(2)
    perm = torch.randperm(NANO.n_patches, generator=torch.Generator().manual_seed(1))
    tokens = m.embed(x)  # (B, T, C)
    moved = torch.cat([tokens[:, :1], tokens[:, 1:][:, perm]], dim=1)
    assert_close(m.head(m.encoder(moved)[:, 0]), m(x))
    shuffled = vit.unpatchify(vit.patchify(x, 2)[:, perm], 2, 8)  # the same patches, elsewhere in the image
    assert not torch.allclose(m(shuffled), m(x))  # with the positions fixed, the model does see the layout


def test_model_reads_the_cls_token_only():
    torch.manual_seed(0)
    m = randomise(vit.ViT(NANO)).double().eval()
    x = images(2)
    h = m.encoder(m.embed(x))  # (B, T, C)
    assert_close(m(x), F.linear(h[:, 0], m.head.weight, m.head.bias))
    assert m.encoder.norm is not None  # the pre-norm stack ends with its final norm


def test_dropout_only_in_training_mode():
    torch.manual_seed(0)
    m = vit.ViT(replace(NANO, dropout=0.5)).double()
    x = images(2)
    m.eval()
    assert torch.equal(m(x), m(x))
    m.train()
    assert not torch.equal(m(x), m(x))


# --------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("name", ["nano", "small", "vit-b/16", "vit-l/16", "vit-h/14"])
def test_parameter_counts_equal_our_model_and_hf_on_meta(name):
    cfg = vit.VIT_PRESETS[name]
    with torch.device("meta"):
        ours = count_params(vit.ViT(cfg))
        theirs = sum(
            p.numel()
            for p in ViTForImageClassification(HFViTConfig(**vit.hf_config_kwargs(cfg))).parameters()
        )
    assert vit.vit_params(cfg) == ours == theirs


def test_vit_b16_has_86_6_million_parameters():
    # 86.6M (86M in Dosovitskiy et al., 2021, table 1; 86.57M in timm's vit_base_patch16_224)
    assert vit.vit_params(vit.VIT_PRESETS["vit-b/16"]) == 86_567_656


# --------------------------------------------------------------------------- attention distance


def brute_force_distance(
    weights: torch.Tensor, rows: int, cols: int, P: float, cls_token: bool
) -> torch.Tensor:
    """Mean attention distance by explicit float64 loops over images, heads, queries and keys."""
    import math

    w = weights.double()
    off = int(cls_token)
    B, H = w.shape[:2]
    out = torch.zeros(B, H, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            total = 0.0
            for i in range(rows * cols):
                num = den = 0.0
                for j in range(rows * cols):
                    a = float(w[b, h, i + off, j + off])
                    num += a * P * math.hypot(i // cols - j // cols, i % cols - j % cols)
                    den += a
                total += num / den
            out[b, h] = total / (rows * cols)
    return out


@pytest.mark.parametrize("rows,cols,P,cls_token", [(2, 2, 4, True), (3, 4, 2.5, False), (1, 5, 3, True)])
def test_mean_attention_distance_equals_a_float64_loop(rows, cols, P, cls_token):
    T = rows * cols + int(cls_token)
    g = torch.Generator().manual_seed(rows * 10 + cols)
    weights = torch.softmax(2 * torch.randn(3, 2, T, T, generator=g, dtype=torch.float64), dim=-1)
    got = vit.mean_attention_distance(weights, (rows, cols), P, cls_token=cls_token)
    assert got.shape == (3, 2) and got.dtype == torch.float64
    assert_close(got, brute_force_distance(weights, rows, cols, P, cls_token))
    if rows == cols:  # an int grid means a square one
        assert_close(vit.mean_attention_distance(weights, rows, P, cls_token=cls_token), got)


def test_mean_attention_distance_closed_forms():
    P = 4.0
    uniform = torch.full((2, 3, 4, 4), 0.25, dtype=torch.float64)  # 2x2 grid: distances 0, P, P, P sqrt 2
    assert_close(
        vit.mean_attention_distance(uniform, 2, P, cls_token=False),
        torch.full((2, 3), P * (2 + 2**0.5) / 4, dtype=torch.float64),
    )
    self_only = torch.eye(9, dtype=torch.float64).expand(1, 2, 9, 9)
    assert torch.equal(
        vit.mean_attention_distance(self_only, 3, P, cls_token=False), torch.zeros(1, 2, dtype=torch.float64)
    )
    to_corner = torch.zeros(1, 1, 9, 9, dtype=torch.float64)
    to_corner[..., 8] = 1.0  # every query reads patch 8, the bottom-right corner of a 3x3 grid
    expected = P * (6 + 3 * 2**0.5 + 2 * 5**0.5) / 9  # |p_i - (2, 2)| summed over the 9 patches, averaged
    assert_close(
        vit.mean_attention_distance(to_corner, 3, P, cls_token=False),
        torch.tensor([[expected]], dtype=torch.float64),
    )


def test_mean_attention_distance_leaves_cls_out_and_rescales():
    """Half of every patch query's weight on [CLS] and half on the diagonally opposite patch of a
    2x2 grid: the [CLS] half is left out, so the distance is the full diagonal, P sqrt 2; and the
    [CLS] query's row does not count."""
    P = 4.0
    w = torch.zeros(2, 1, 5, 5, dtype=torch.float64)
    w[:, :, 1:, 0] = 0.5
    for n in range(4):
        w[:, :, 1 + n, 1 + (3 - n)] = 0.5  # patch n -> patch 3 - n, its diagonal opposite
    w[0, :, 0, 0], w[1, :, 0, 1:] = 1.0, 0.25  # two different [CLS] rows
    assert_close(
        vit.mean_attention_distance(w, 2, P, cls_token=True),
        torch.full((2, 1), P * 2**0.5, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    "weights,grid,P,cls_token,match",
    [
        (
            torch.rand(2, 5, 5),
            2,
            4,
            True,
            r"expected weights of shape \(B, H, 5, 5\) for 2x2 patches and \[CLS\], got \(2, 5, 5\)",
        ),
        (
            torch.rand(1, 2, 4, 4),
            2,
            4,
            True,
            r"\(B, H, 5, 5\) for 2x2 patches and \[CLS\], got \(1, 2, 4, 4\)",
        ),
        (torch.rand(1, 2, 5, 5), 2, 4, False, r"\(B, H, 4, 4\) for 2x2 patches, got \(1, 2, 5, 5\)"),
        (
            torch.rand(1, 2, 6, 5),
            (1, 5),
            4,
            True,
            r"\(B, H, 6, 6\) for 1x5 patches and \[CLS\], got \(1, 2, 6, 5\)",
        ),
        (
            torch.ones(1, 1, 4, 4, dtype=torch.long),
            2,
            4,
            False,
            r"expected floating attention weights, got torch.int64",
        ),
        (-torch.rand(1, 1, 4, 4), 2, 4, False, r"must be non-negative"),
        (torch.eye(5)[:, [0, 0, 0, 0, 0]].expand(1, 1, 5, 5), 2, 4, True, r"puts no weight on any patch"),
        (torch.rand(1, 1, 4, 4), 0, 4, False, r"grid sides must be at least 1, got 0x0"),
        (torch.rand(1, 1, 4, 4), 2, 0, False, r"patch_px must be positive, got 0"),
    ],
)
def test_mean_attention_distance_rejects_bad_input(weights, grid, P, cls_token, match):
    with pytest.raises(ValueError, match=match):
        vit.mean_attention_distance(weights, grid, P, cls_token=cls_token)


def test_attention_weights_equal_hf_output_attentions():
    hf = hf_model(attn="eager")
    m = ours_from(hf)
    x = images(3, seed=2)
    expected = torch.stack(hf(pixel_values=x, output_attentions=True).attentions)  # (L, B, H, T, T)
    got = vit.attention_weights(m.train(), x)
    assert m.training  # the mode is restored
    T = NANO.n_patches + 1
    assert got.shape == (NANO.n_layers, 3, NANO.n_heads, T, T)
    torch.testing.assert_close(got, expected, rtol=0, atol=HF_EAGER_ATOL)
    assert_close(got.sum(-1), torch.ones(got.shape[:-1], dtype=torch.float64))

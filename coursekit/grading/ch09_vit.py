"""Checks for Exercise 9 (the vision transformer: patches, patch embedding, [CLS] and positions, the classifier).

``check_*`` are the public checks (a small fixed example each); ``grade_*`` the hidden ones.
Patches are compared with ``F.unfold`` (and with a worked example), the patch
embedding with a strided ``Conv2d``, the token sequence with its definition written out,
and the model with :mod:`coursekit.vit` holding the same random float64 weights (pushed
with ``load_state_dict``, so the submodule names of the instructions matter). Common
mistakes are recognised by recomputing them and get their own hint; a part that fails
because an earlier part is wrong says so.

Under the autograder a model cannot cross into the sandbox, so the graders of parts 2 and 4
take the student's *class* (and the notebook's ``ViTConfig``) and build the modules there,
beside the student's code, as the Chapter 7 graders do. The part 4 grader also reads the
notebook's own ``patchify`` and ``add_cls_and_positions`` to say which part to fix first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from coursekit import vit as ref
from coursekit.grading.core import (
    Grader,
    close,
    describe,
    expect_value_error,
    first_match,
    is_a,
    is_tensor,
    load_weights,
    probe,
    raise_unless_student_error,
    rand,
    random_weights,
    student_side,
)

__all__ = [
    "check_patchify", "check_patch_embedding", "check_add_cls_and_positions", "check_vit",
    "grade_patchify", "grade_patch_embedding", "grade_add_cls_and_positions", "grade_vit",
]

IMG, P, C_IN, C, K = 8, 2, 3, 12, 5  # RGB 8x8 images in 2x2 patches: N_p = 16 tokens of C_in P^2 = 12 values
N_P = (IMG // P) ** 2
#: the part 4 model: small, but every piece present (two layers, two heads, a non-default width)
VIT_KWARGS = dict(image_size=IMG, patch_size=P, in_channels=C_IN, n_classes=K, n_layers=2, n_heads=2, d_model=C)


# =========================================================================== part 1: patchify


def _unfold(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """The right answer, from torch's own sliding-window extraction."""
    return F.unfold(x, kernel_size=patch_size, stride=patch_size).transpose(1, 2)  # (B, C_in P^2, N_p) -> (B, N_p, C_in P^2)


_CHANNEL_LAST = ("each patch is flattened channel-last, as (P, P, C_in): flatten it channel-first, as (C_in, P, P), the "
                 "layout of F.unfold and of a Conv2d weight: permute the blocks to (B, rows, cols, C_in, P, P) before the "
                 "last reshape")
_COLUMN_MAJOR = ("the patches are numbered column by column (rows and columns of the grid swapped): number them row by "
                 "row, patch n at grid row n // (W_img / P) and column n % (W_img / P)")
_PIXELS_SWAPPED = ("inside each patch the pixel rows and columns are swapped: flatten a patch as (C_in, P, P), pixel row "
                   "before pixel column")
_IMAGE_TRANSPOSED = ("the image's height and width are swapped (you cut the transposed image): images are (B, C_in, H_img, "
                     "W_img), so the height is images.shape[2] and the width images.shape[3]")
_PLAIN_RESHAPE = ("the image was reshaped to (B, N_p, C_in P^2) without cutting it into patches (a plain reshape groups "
                  "consecutive values of whole image rows): reshape to (B, C_in, H_img / P, P, W_img / P, P), permute to "
                  "(B, rows, cols, C_in, P, P), then reshape")


def _patch_mistakes(x: torch.Tensor, patch_size: int):
    B, C_in, H_img, W_img = x.shape
    rows, cols = H_img // patch_size, W_img // patch_size
    blocks = x.reshape(B, C_in, rows, patch_size, cols, patch_size)  # (B, C_in, rows, P, cols, P)
    flat = lambda t: t.reshape(B, rows * cols, -1)  # noqa: E731
    out = [
        (flat(blocks.permute(0, 2, 4, 3, 5, 1)), _CHANNEL_LAST),  # (B, rows, cols, P, P, C_in)
        (flat(blocks.permute(0, 4, 2, 1, 3, 5)), _COLUMN_MAJOR),  # (B, cols, rows, C_in, P, P)
        (flat(blocks.permute(0, 4, 2, 3, 5, 1)), _COLUMN_MAJOR + "; " + _CHANNEL_LAST),
        (flat(blocks.permute(0, 2, 4, 1, 5, 3)), _PIXELS_SWAPPED),  # (B, rows, cols, C_in, P, P) with the pixels transposed
        (flat(x), _PLAIN_RESHAPE),
    ]
    if H_img == W_img:
        out.append((_unfold(x.transpose(2, 3), patch_size), _IMAGE_TRANSPOSED))
    return out


def _patchify_call(g: Grader, patchify, x, patch_size):
    out = patchify(x, patch_size)
    B, C_in, H_img, W_img = x.shape
    shape = (B, (H_img // patch_size) * (W_img // patch_size), C_in * patch_size ** 2)
    g.expect(is_tensor(out) and tuple(out.shape) == shape and out.dtype == x.dtype,
             f"for images {tuple(x.shape)} and patch_size={patch_size} expected a {x.dtype} tensor of shape "
             f"(B, N_p, C_in P^2) = {shape}, got {describe(out)}")
    return out


def _worked_example(g: Grader, patchify) -> None:
    x = torch.arange(16.0).view(1, 1, 4, 4)
    out = _patchify_call(g, patchify, x, 2)
    expected = torch.tensor([[[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]], dtype=torch.float32)
    first_match(g, out, _patch_mistakes(x, 2), expected)
    g.expect(close(out, expected), f"the 4x4 image 0 .. 15 in 2x2 patches should give {expected[0].tolist()}, "
                                   f"got {out[0].tolist()}")


def grade_patchify(patchify) -> None:
    """Grade a student's ``patchify(images, patch_size)``."""
    g = Grader("patchify")

    with g.check("returns (B, N_p, C_in P^2) in the images' dtype"):
        for dtype in (torch.float64, torch.float32):
            _patchify_call(g, patchify, rand("patchify.shape", 2, C_IN, IMG, IMG, dtype=dtype), P)

    with g.check("the worked example: a 4x4 image holding 0 .. 15 in 2x2 patches"):
        _worked_example(g, patchify)

    with g.check("RGB images: equal to F.unfold (patches row by row, each flattened as (C_in, P, P))"):
        for B, C_in, H_img, W_img, p in ((2, 3, 8, 8, 2), (3, 3, 8, 8, 4), (2, 2, 6, 6, 3)):
            x = rand(f"patchify.values.{p}", B, C_in, H_img, W_img)
            out = _patchify_call(g, patchify, x, p)
            first_match(g, out, _patch_mistakes(x, p), _unfold(x, p))
            g.expect(close(out, _unfold(x, p)), f"for images {tuple(x.shape)} and P={p} the patches differ from "
                                                "F.unfold(images, P, stride=P).transpose(1, 2)")

    with g.check("non-square images (6x9 in 3x3 patches, 8x4 in 2x2 patches)"):
        for shape, p in (((2, 3, 6, 9), 3), ((1, 2, 8, 4), 2)):
            x = rand(f"patchify.rect.{p}", *shape)
            out = _patchify_call(g, patchify, x, p)
            first_match(g, out, _patch_mistakes(x, p), _unfold(x, p))
            g.expect(close(out, _unfold(x, p)),
                     f"for images {shape} and P={p} the patches differ: with H_img != W_img the grid has H_img / P rows "
                     "and W_img / P columns; take them from images.shape[2] and images.shape[3]")

    with g.check("edge cases: P = 1 (a patch per pixel) and P = the image size (one patch)"):
        x = rand("patchify.edge", 2, C_IN, 4, 4)
        for p in (1, 4):
            out = _patchify_call(g, patchify, x, p)
            g.expect(close(out, _unfold(x, p)), f"with P={p} the patches differ from F.unfold")

    with g.check("raises ValueError when P does not divide the image's height or width"):
        expect_value_error(g, lambda: patchify(rand("patchify.bad", 1, C_IN, 8, 8), 3), "8x8 images with P=3")
        expect_value_error(g, lambda: patchify(rand("patchify.bad.w", 1, C_IN, 8, 6), 4),
                            "8x6 images with P=4 (the height fits, the width does not)")

    with g.check("does not change the images"):
        x = rand("patchify.inplace", 2, C_IN, IMG, IMG)
        result = probe(patchify, x.clone(), P)
        g.expect(close(result.args[0], x), "patchify changed its input: work on views or copies, never in place")

    g.finish()


def check_patchify(patchify) -> None:
    """Public: the worked example, then 3-channel images against ``F.unfold``."""
    g = Grader("patchify (public)")
    with g.check("a 4x4 image holding 0 .. 15 in 2x2 patches"):
        _worked_example(g, patchify)
    with g.check("a (2, 3, 8, 8) batch in 2x2 patches equals F.unfold(images, 2, stride=2).transpose(1, 2)"):
        x = rand("public.patchify", 2, 3, 8, 8)
        out = _patchify_call(g, patchify, x, 2)
        g.expect(close(out, _unfold(x, 2)), "the patches differ from F.unfold: patches row by row, each flattened "
                                            "channel-first as (C_in, P, P)")
    g.finish()


# =========================================================================== part 2: PatchEmbedding


def _conv(weights, patch_size: int) -> torch.nn.Conv2d:
    """The strided ``Conv2d`` equal to a patch embedding with ``weights``: the independent reference."""
    w = weights["proj.weight"]
    d_model, patch_dim = w.shape
    conv = torch.nn.Conv2d(patch_dim // patch_size ** 2, d_model, patch_size, stride=patch_size).double()
    with torch.no_grad():
        conv.weight.copy_(w.view(d_model, -1, patch_size, patch_size))  # (C, C_in P^2) -> (C, C_in, P, P)
        conv.bias.copy_(weights["proj.bias"])
    return conv


def _embed_reference(weights, x, patch_size: int) -> torch.Tensor:
    return _conv(weights, patch_size)(x).flatten(2).transpose(1, 2)  # (B, C, rows, cols) -> (B, N_p, C)


def _patchify_broken(g: Grader) -> None:
    """Fail with "fix part 1 first" when the notebook's ``patchify`` is wrong."""
    theirs = student_side("patchify", ref.patchify)
    x = rand("embedding.patchify", 2, C_IN, IMG, IMG)
    try:
        ok = close(theirs(x, P), _unfold(x, P))
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        ok = False
    g.expect(ok, "your patchify (part 1) gives wrong patches, and PatchEmbedding uses it: fix part 1 first")


def _build_embedding(g: Grader, PatchEmbedding, name: str, image_size=IMG, patch_size=P, in_channels=C_IN, d_model=C):
    m = PatchEmbedding(image_size, patch_size, in_channels, d_model)
    m.double()
    weights = random_weights(ref.PatchEmbedding(image_size, patch_size, in_channels, d_model), name)
    load_weights(g, m, weights, "PatchEmbedding")
    return m, weights


def grade_patch_embedding(PatchEmbedding) -> None:
    """Grade ``PatchEmbedding(image_size, patch_size, in_channels, d_model)``."""
    g = Grader("PatchEmbedding")

    with g.check("has one nn.Linear proj from C_in P^2 to C features"):
        m = PatchEmbedding(IMG, P, C_IN, C)
        layer = getattr(m, "proj", None)
        g.expect(is_a(layer, "torch.nn.modules.linear.Linear"), "PatchEmbedding needs an nn.Linear called proj")
        got = (layer.in_features, layer.out_features)
        g.expect(got == (C_IN * P * P, C), f"proj should map C_in P^2 = {C_IN * P * P} values to C = {C} features, "
                                           f"got {got[0]} -> {got[1]}")
        g.expect(layer.bias is not None, "proj needs a bias (nn.Linear's default), like the Conv2d of the ViT paper")

    with g.check("equals a Conv2d with kernel size and stride P (random weights, RGB images)"):
        _patchify_broken(g)
        m, w = _build_embedding(g, PatchEmbedding, "embedding.conv")
        x = rand("embedding.conv.x", 3, C_IN, IMG, IMG)
        out = m(x)
        expected = _embed_reference(w, x, P)
        g.expect(is_tensor(out) and out.shape == expected.shape, f"expected (B, N_p, C) = {tuple(expected.shape)}, "
                                                                 f"got {describe(out)}")
        lin = lambda patches: F.linear(patches, w["proj.weight"], w["proj.bias"])  # noqa: E731
        first_match(g, out, [(lin(p), hint) for p, hint in _patch_mistakes(x, P)] + [
            (F.linear(ref.patchify(x, P), w["proj.weight"]), "the bias of proj is missing from the output: return proj(patches)"),
            (ref.patchify(x, P), "the patches are returned without the linear map: return proj(patchify(images, P))"),
        ], expected)
        g.expect(close(out, expected), "the output differs from a Conv2d with kernel and stride P whose weight is "
                                       "proj.weight.view(C, C_in, P, P): return proj(patchify(images, patch_size))")

    with g.check("other shapes: 4x4 patches of 8x8 images with one channel, 3x3 patches of 6x6 images"):
        for image_size, p, c_in in ((8, 4, 1), (6, 3, 2)):
            m, w = _build_embedding(g, PatchEmbedding, f"embedding.shapes.{p}", image_size, p, c_in, 10)
            x = rand(f"embedding.shapes.{p}.x", 2, c_in, image_size, image_size)
            out = m(x)
            g.expect(close(out, _embed_reference(w, x, p)), f"with image_size={image_size}, patch_size={p}, "
                                                            f"in_channels={c_in} the output differs from the Conv2d: "
                                                            "use the constructor's arguments, not fixed numbers")

    with g.check("raises ValueError for images with the wrong channels or size"):
        m, _ = _build_embedding(g, PatchEmbedding, "embedding.bad")
        expect_value_error(g, lambda: m(rand("embedding.bad.c", 2, 1, IMG, IMG)),
                            f"PatchEmbedding({IMG}, {P}, {C_IN}, {C}) given 1-channel images")
        expect_value_error(g, lambda: m(rand("embedding.bad.s", 2, C_IN, 2 * IMG, 2 * IMG)),
                            f"PatchEmbedding({IMG}, {P}, {C_IN}, {C}) given {2 * IMG}x{2 * IMG} images")

    g.finish()


def check_patch_embedding(PatchEmbedding) -> None:
    """Public: ``PatchEmbedding(8, 2, 3, 12)`` against a strided ``Conv2d`` with the same weights."""
    g = Grader("PatchEmbedding (public)")
    with g.check("PatchEmbedding(8, 2, 3, 12) equals a Conv2d with kernel size and stride 2"):
        torch.manual_seed(0)
        m = PatchEmbedding(8, 2, 3, 12)
        sd = m.state_dict()
        g.expect(isinstance(sd, dict) and set(sd) == {"proj.weight", "proj.bias"},
                 f"expected parameters ['proj.bias', 'proj.weight'], got {sorted(sd) if isinstance(sd, dict) else describe(sd)}")
        g.expect(tuple(sd["proj.weight"].shape) == (12, 12), f"proj.weight should be (C, C_in P^2) = (12, 12), "
                                                             f"got {tuple(sd['proj.weight'].shape)}")
        x = rand("public.embedding", 2, 3, 8, 8, dtype=torch.float32)
        conv = torch.nn.Conv2d(3, 12, 2, stride=2)
        with torch.no_grad():
            conv.weight.copy_(sd["proj.weight"].view(12, 3, 2, 2))
            conv.bias.copy_(sd["proj.bias"])
        expected = conv(x).flatten(2).transpose(1, 2)
        out = m(x)
        g.expect(is_tensor(out) and out.shape == (2, 16, 12), f"expected a (2, 16, 12) tensor, got {describe(out)}")
        g.expect(torch.allclose(out, expected, atol=1e-5), "the output differs from the Conv2d: return proj(patchify(images, P))")
    g.finish()


# =========================================================================== part 3: add_cls_and_positions


def _tokens(name: str, B: int, N_p: int, C_: int):
    return rand(name + ".x", B, N_p, C_), rand(name + ".cls", 1, 1, C_), rand(name + ".pos", N_p + 1, C_)


_CLS_LAST = "[CLS] was put at the end: it is token 0, in front of the patches (torch.cat([cls, patches], dim=1))"
_CLS_NO_POSITION = ("[CLS] got no position: add positions to the whole sequence after prepending [CLS], so [CLS] gets "
                    "positions[0] and patch n gets positions[n + 1]")


def _cls_mistakes(x, cls, pos):
    B, N_p, C_ = x.shape
    c = cls.expand(B, 1, C_)
    return [
        (torch.cat([x, c], 1) + pos, _CLS_LAST),
        (torch.cat([x + pos[:N_p], c + pos[N_p]], 1), _CLS_LAST),
        (torch.cat([c, x + pos[1:]], 1), _CLS_NO_POSITION),
        (torch.cat([c, x + pos[:N_p]], 1), "the patches got positions 0 .. N_p - 1 and [CLS] none: [CLS] is token 0 "
                                           "with positions[0], patch n is token n + 1 with positions[n + 1]"),
        (torch.cat([c + pos[0], x + pos[:N_p]], 1), "positions[0] is used twice: patch n is token n + 1 and gets "
                                                    "positions[n + 1]"),
        (torch.cat([c, x], 1), "the positions are not added: return torch.cat([cls, patches], dim=1) + positions"),
        (x + pos[1:], "[CLS] is missing: the output has N_p + 1 tokens, [CLS] first"),
    ]


def _cls_call(g: Grader, fn, x, cls, pos):
    try:
        return fn(x, cls, pos)
    except Exception as e:
        raise_unless_student_error(e)
        if x.shape[0] > 1 and ("size" in str(e).lower() or "dimension" in str(e).lower()):
            g.fail(f"with a batch of {x.shape[0]} your code raised {type(e).__name__.removeprefix('Student')}: {e}. "
                   "cls_token is (1, 1, C), one vector for every image: expand it to (B, 1, C) before concatenating")
        raise


def grade_add_cls_and_positions(add_cls_and_positions) -> None:
    """Grade ``add_cls_and_positions(patches, cls_token, positions)``."""
    g = Grader("add_cls_and_positions")

    def expected(x, cls, pos):
        out = torch.empty(x.shape[0], x.shape[1] + 1, x.shape[2], dtype=x.dtype)
        out[:, 0] = cls[0, 0] + pos[0]  # token 0: [CLS] and position 0
        out[:, 1:] = x + pos[1:]  # token n + 1: patch n and position n + 1
        return out

    with g.check("returns (B, N_p + 1, C) in the inputs' dtype"):
        x, cls, pos = _tokens("cls.shape", 2, 4, 6)
        out = _cls_call(g, add_cls_and_positions, x, cls, pos)
        g.expect(is_tensor(out) and tuple(out.shape) == (2, 5, 6) and out.dtype == x.dtype,
                 f"for patches (2, 4, 6) expected a float64 tensor of shape (B, N_p + 1, C) = (2, 5, 6), got {describe(out)}")

    with g.check("[CLS] first with positions[0]; patch n is token n + 1 with positions[n + 1]"):
        for B, N_p, C_ in ((3, 16, C), (1, 4, 5), (5, 9, 8)):
            x, cls, pos = _tokens(f"cls.values.{B}", B, N_p, C_)
            out = _cls_call(g, add_cls_and_positions, x, cls, pos)
            right = expected(x, cls, pos)
            first_match(g, out, _cls_mistakes(x, cls, pos), right)
            g.expect(close(out, right), f"for B, N_p, C = {(B, N_p, C_)} the tokens differ from "
                                        "torch.cat([cls_token.expand(B, 1, C), patches], dim=1) + positions")

    with g.check("every image gets the same [CLS] vector"):
        x, cls, pos = _tokens("cls.batch", 4, 3, 5)
        out = _cls_call(g, add_cls_and_positions, x, cls, pos)
        g.expect(is_tensor(out) and out.shape == (4, 4, 5) and close(out[:, 0], (cls[0, 0] + pos[0]).expand(4, 5)),
                 "token 0 differs between images or from cls_token + positions[0]: expand the one (1, 1, C) cls_token "
                 "over the batch")

    with g.check("gradients reach cls_token and positions, and the patches are not changed in place"):
        x, cls, pos = _tokens("cls.grad", 3, 4, 5)
        upstream = rand("cls.grad.up", 3, 5, 5)
        result = probe(add_cls_and_positions, x.clone().requires_grad_(), cls.clone().requires_grad_(),
                       pos.clone().requires_grad_(), backward=(None, upstream))
        g.expect(close(result.args[0].detach(), x), "the patches were changed in place: build a new tensor (torch.cat)")
        grads = result.grads or [None, None, None]
        g.expect(grads[1] is not None and close(grads[1], upstream[:, :1].sum(0, keepdim=True)),
                 "the gradient of cls_token should be the sum over the batch of the upstream gradient at token 0: use "
                 "cls_token itself (expand, not .data, .detach() or a new tensor)")
        g.expect(grads[2] is not None and close(grads[2], upstream.sum(0)),
                 "the gradient of positions should be the upstream gradient summed over the batch: add positions "
                 "itself to the sequence (no .data, .detach() or copy)")

    g.finish()


def check_add_cls_and_positions(add_cls_and_positions) -> None:
    """Public: two images of three patches of width 2, written out by hand."""
    g = Grader("add_cls_and_positions (public)")
    with g.check("2 images, 3 patches, C = 2"):
        x = torch.arange(12.0).view(2, 3, 2)
        cls = torch.tensor([[[100.0, 200.0]]])
        pos = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]])
        out = add_cls_and_positions(x, cls, pos)
        expected = torch.tensor([[[100.1, 200.2], [0.3, 1.4], [2.5, 3.6], [4.7, 5.8]],
                                 [[100.1, 200.2], [6.3, 7.4], [8.5, 9.6], [10.7, 11.8]]])
        g.expect(is_tensor(out) and out.shape == (2, 4, 2), f"expected a (2, 4, 2) tensor, got {describe(out)}")
        g.expect(torch.allclose(out, expected, atol=1e-5), f"expected {expected.tolist()}, got {out.tolist()}: [CLS] "
                                                           "first, then positions[t] added to token t")
    g.finish()


# =========================================================================== part 4: ViT


def _vit_pair(g: Grader, ViT, ViTConfig, name: str, dropout: float = 0.0, **overrides):
    """The same ViT twice, with random float64 weights: built with the student's classes (in their
    process) and with coursekit's, both in eval mode."""
    kwargs = {**VIT_KWARGS, "dropout": dropout, **overrides}
    local = ref.ViT(ref.ViTConfig(**kwargs)).double()
    weights = random_weights(local, name)
    local.load_state_dict(weights)
    local.eval()
    theirs = ViT(ViTConfig(**kwargs))
    theirs.double()
    load_weights(g, theirs, weights, "ViT")
    theirs.eval()
    return theirs, local


def _vit_mistakes(r, x):
    """What common wrong forwards return, computed with the reference model ``r``'s pieces."""
    tokens = r.embed(x)  # (B, T, C)
    h = r.encoder(tokens)  # (B, T, C)
    no_norm = tokens
    for layer in r.encoder.layers:
        no_norm = layer(no_norm)
    patches = r.patch_embed(x)  # (B, N_p, C)
    B = x.shape[0]
    cls = r.cls_token.expand(B, 1, -1)
    no_pos = r.head(r.encoder(torch.cat([cls, patches], 1))[:, 0])
    return [
        (r.head(h.mean(1)), "the classifier reads the mean of all tokens: read the [CLS] output only, "
                            "head(encoder(tokens)[:, 0])"),
        (r.head(h[:, 1:].mean(1)), "the classifier reads the mean of the patch tokens: read the [CLS] output, "
                                   "head(encoder(tokens)[:, 0])"),
        (r.head(h[:, -1]), "the classifier reads the last token: [CLS] is token 0, head(encoder(tokens)[:, 0])"),
        (r.head(no_norm[:, 0]), "the final layer norm is missing: run the whole self.encoder (a pre-norm stack ends "
                                "with its norm), not only its layers"),
        (torch.softmax(r.head(h[:, 0]), -1), "forward returns probabilities: return the logits, head(...) without a "
                                             "softmax (F.cross_entropy applies log-softmax itself)"),
        (r.head(r.encoder(patches)[:, 0]), "[CLS] and the positions are missing: embed builds the encoder's input with "
                                           "add_cls_and_positions(patch_embed(images), cls_token, positions)"),
        (no_pos, "the positions are not added: embed adds pos_emb(torch.arange(N_p + 1)) through add_cls_and_positions"),
        (r.head(tokens[:, 0]), "the encoder is not applied: logits = head(encoder(embed(images))[:, 0])"),
    ]


def _parts_broken(g: Grader, m) -> None:
    """Fail with "fix part N first" when an earlier part of the notebook is wrong."""
    x = rand("vit.parts.x", 2, C_IN, IMG, IMG)
    try:
        patchify_ok = close(student_side("patchify", ref.patchify)(x, P), _unfold(x, P))
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        patchify_ok = False
    g.expect(patchify_ok, "your patchify (part 1) gives wrong patches, and the model uses it: fix part 1 first")
    w = {k: v for k, v in m.state_dict().items() if k.startswith("patch_embed.")}
    try:
        emb_ok = close(m.patch_embed(x), _embed_reference({k.removeprefix("patch_embed."): v for k, v in w.items()}, x, P))
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        emb_ok = False
    g.expect(emb_ok, "model.patch_embed (your PatchEmbedding, part 2) gives wrong embeddings: fix part 2 first")
    x3, cls, pos = _tokens("vit.parts.cls", 2, 4, 5)
    try:
        out = student_side("add_cls_and_positions", ref.add_cls_and_positions)(x3, cls, pos)
        cls_ok = close(out, ref.add_cls_and_positions(x3, cls, pos))
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        cls_ok = False
    g.expect(cls_ok, "your add_cls_and_positions (part 3) is wrong, and embed uses it: fix part 3 first")


def grade_vit(ViT, ViTConfig) -> None:
    """Grade the student's ``ViT`` (its ``embed`` and ``forward``); ``ViTConfig`` is the notebook's config class."""
    g = Grader("ViT")

    with g.check("embed: [CLS] and the patch embeddings with their positions, (B, N_p + 1, C)"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.embed")
        _parts_broken(g, m)
        x = rand("vit.embed.x", 3, C_IN, IMG, IMG)
        out = m.embed(x)
        right = r.embed(x)
        g.expect(is_tensor(out) and out.shape == right.shape, f"embed should return (B, N_p + 1, C) = {tuple(right.shape)}, "
                                                              f"got {describe(out)}")
        patches = r.patch_embed(x)
        g.expect(not close(out, torch.cat([r.cls_token.expand(3, 1, C), patches], 1)),
                 "embed does not add the positions: pass pos_emb(torch.arange(N_p + 1)) to add_cls_and_positions")
        g.expect(close(out, right), "embed differs from add_cls_and_positions(patch_embed(images), cls_token, "
                                    "pos_emb(torch.arange(N_p + 1))) followed by dropout")

    with g.check("forward: the logits (B, K) from the [CLS] output of the encoder"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.forward")
        x = rand("vit.forward.x", 4, C_IN, IMG, IMG)
        out = m(x)
        right = r(x)
        g.expect(is_tensor(out) and out.shape == right.shape, f"expected logits (B, K) = {tuple(right.shape)}, got {describe(out)}")
        first_match(g, out, _vit_mistakes(r, x), right)
        g.expect(close(out, right), "the logits differ from head(encoder(embed(images))[:, 0]) with the same weights")

    with g.check("another shape: 4x4 patches, 3 layers, 4 heads, one channel"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.shape", image_size=8, patch_size=4, in_channels=1, n_layers=3, n_heads=4,
                         d_model=16, n_classes=3)
        x = rand("vit.shape.x", 2, 1, 8, 8)
        out = m(x)
        first_match(g, out, _vit_mistakes(r, x), r(x))
        g.expect(close(out, r(x)), "with patch_size=4, 3 layers, 4 heads and in_channels=1 the logits differ: use "
                                   "the configuration, not fixed numbers")

    with g.check("each image is classified on its own"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.batch")
        x = rand("vit.batch.x", 3, C_IN, IMG, IMG)
        together, alone = m(x), m(x[1:2])
        g.expect(is_tensor(together) and is_tensor(alone) and close(alone, together[1:2]),
                 "the logits of an image change with the other images of the batch: never mix the batch axis (0)")

    with g.check("dropout only in training mode"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.dropout", dropout=0.5)
        x = rand("vit.dropout.x", 4, C_IN, IMG, IMG)
        a, b = m(x), m(x)
        g.expect(close(a, b) and close(a, r(x)), "in eval mode with dropout=0.5 the logits should equal the reference's "
                                                 "every time")
        m.train()
        a, b = m(x), m(x)
        g.expect(is_tensor(a) and is_tensor(b) and not close(a, b),
                 "in training mode with dropout=0.5 two calls gave the same logits: apply self.dropout in embed")

    g.finish()


def check_vit(ViT, ViTConfig) -> None:
    """Public: a two-layer ViT against coursekit's with the same weights."""
    g = Grader("ViT (public)")
    with g.check("ViT(ViTConfig(image_size=8, patch_size=2, in_channels=3, n_classes=5, n_layers=2, n_heads=2, "
                 "d_model=12)) equals the reference with the same weights"):
        m, r = _vit_pair(g, ViT, ViTConfig, "public.vit")
        x = rand("public.vit.x", 2, C_IN, IMG, IMG)
        emb = m.embed(x)
        g.expect(is_tensor(emb) and emb.shape == (2, N_P + 1, C), f"embed should return (2, {N_P + 1}, {C}), got {describe(emb)}")
        g.expect(close(emb, r.embed(x)), "embed differs from the reference: [CLS] first, positions added to every token")
        out = m(x)
        g.expect(is_tensor(out) and out.shape == (2, K), f"expected logits (2, {K}), got {describe(out)}")
        g.expect(close(out, r(x)), "the logits differ from head(encoder(embed(images))[:, 0])")
    g.finish()

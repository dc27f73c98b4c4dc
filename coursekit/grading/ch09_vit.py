"""Checks for Exercise 9 (the vision transformer: patches, patch embedding, [CLS] and positions, the classifier).

``check_*`` are the public checks (one small fixed example per clause of the part's text);
``grade_*`` the hidden ones: one named check per clause, on inputs drawn across what the text
allows (derandomized Hypothesis examples: batches of 1 and more, 1 to 4 channels, square and
non-square images, patch sizes from 1 to the whole image, both float dtypes, model shapes with
one or more layers and heads). Patches are compared with ``F.unfold`` (and with a worked
example), the patch embedding with a strided ``Conv2d``, the token sequence with its definition
written out, and the model with :mod:`coursekit.vit` holding the same random weights (pushed with
``load_state_dict``, so the submodule names of the instructions matter). The model's dropout is
checked in isolation and deterministically: with its ``p`` set to 1 the encoder's input is zero,
with ``p = 0.5`` each value is either dropped or doubled, and in eval mode nothing is dropped.
Common mistakes are recognised by recomputing them and get their own hint; a part that fails
because an earlier part is wrong says so.

Under the autograder a model cannot cross into the sandbox, so the graders of parts 2 and 4
take the student's *class* (and the notebook's ``ViTConfig``) and build the modules there,
beside the student's code, as the Chapter 7 graders do. The part 4 grader also reads the
notebook's own ``patchify`` and ``add_cls_and_positions`` to say which part to fix first.

**Devices.** ``embed`` must make its positions on the images' device. Only CPU tensors cross to
the student's process, so that check sets torch's default device of that process to ``meta``
(``torch.set_default_device``) and calls ``embed`` on CPU images: positions made without
``device=`` land on ``meta`` and the call fails (a private helper; a candidate for the toolkit).

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from coursekit import vit as ref
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    default_device,
    describe,
    dtype_name,
    expect_value_error,
    first_match,
    for_all,
    is_a,
    is_tensor,
    meta_copy_refused,
    names_hint,
    probe,
    raise_unless_student_error,
    rand,
    random_weights,
    seeded,
    set_attr,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band

__all__ = [
    "check_patchify",
    "check_patch_embedding",
    "check_add_cls_and_positions",
    "check_vit",
    "grade_patchify",
    "grade_patch_embedding",
    "grade_add_cls_and_positions",
    "grade_vit",
    "DIGIT_TOKENS",
    "ATTENTION_PAIRS",
    "check_predict_digit_tokens",
    "grade_predict_digit_tokens",
    "check_predict_attention_pairs",
    "grade_predict_attention_pairs",
    "SCRAMBLED_PIXELS",
    "check_predict_scrambled_pixels",
    "grade_predict_scrambled_pixels",
    "check_blank_patch_share",
    "grade_blank_patch_share",
    "check_sincos_2d_positions",
    "grade_sincos_2d_positions",
]

IMG, P, C_IN, C, K = 8, 2, 3, 12, 5  # RGB 8x8 images in 2x2 patches: N_p = 16 tokens of C_in P^2 = 12 values
N_P = (IMG // P) ** 2
#: the part 4 model: small, but every piece present (two layers, two heads, a non-default width)
VIT_KWARGS = dict(
    image_size=IMG, patch_size=P, in_channels=C_IN, n_classes=K, n_layers=2, n_heads=2, d_model=C
)
F64, F32 = torch.float64, torch.float32
SEEDS = st.integers(0, 2**20)


def _raised(e: BaseException) -> str:
    """What the student's code raised, for a hint: ``RuntimeError: message``."""
    text = str(e)
    for prefix in (f"your code raised {getattr(e, 'type_name', '')}: ", "your code raised "):
        text = text.removeprefix(prefix)
    return f"{type(e).__name__.removeprefix('Student')}: {text[:200]}"


def _load(g: Grader, module, weights: dict, what: str) -> None:
    """:func:`~coursekit.grading.core.load_weights`, after checking the parameters' shapes too (a private helper: a
    wrong shape then gets a hint that names the parameter, not torch's load_state_dict error)."""
    sd = module.state_dict()
    got = set(sd) if isinstance(sd, dict) else set()
    g.expect(got == set(weights), names_hint(what, got, set(weights)))
    for key, w in weights.items():
        mine = tuple(sd[key].shape) if is_tensor(sd[key]) else describe(sd[key])
        g.expect(
            mine == tuple(w.shape),
            f"{what}'s parameter {key} has shape {mine}, expected {tuple(w.shape)} "
            "(see the shapes in the instructions)",
        )
    module.load_state_dict(weights)


# =========================================================================== part 1: patchify


def _unfold(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """The right answer, from torch's own sliding-window extraction."""
    # (B, C_in P^2, N_p) -> (B, N_p, C_in P^2)
    return F.unfold(x, kernel_size=patch_size, stride=patch_size).transpose(1, 2)


_CHANNEL_LAST = (
    "each patch is flattened channel-last, as (P, P, C_in): flatten it channel-first, as (C_in, P, P), "
    "the "
    "layout of F.unfold and of a Conv2d weight: permute the blocks to (B, rows, cols, C_in, P, P) before "
    "the "
    "last reshape"
)
_COLUMN_MAJOR = (
    "the patches are numbered column by column (rows and columns of the grid swapped): number them row by "
    "row, patch n at grid row n // (W_img / P) and column n % (W_img / P)"
)
_PIXELS_SWAPPED = (
    "inside each patch the pixel rows and columns are swapped: flatten a patch as (C_in, P, P), pixel "
    "row "
    "before pixel column"
)
_IMAGE_TRANSPOSED = (
    "the image's height and width are swapped (you cut the transposed image): images are (B, C_in, "
    "H_img, "
    "W_img), so the height is images.shape[2] and the width images.shape[3]"
)
_PLAIN_RESHAPE = (
    "the image was reshaped to (B, N_p, C_in P^2) without cutting it into patches (a plain reshape "
    "groups "
    "consecutive values of whole image rows): reshape to (B, C_in, H_img / P, P, W_img / P, P), permute "
    "to "
    "(B, rows, cols, C_in, P, P), then reshape"
)


def _patch_mistakes(x: torch.Tensor, patch_size: int):
    B, C_in, H_img, W_img = x.shape
    rows, cols = H_img // patch_size, W_img // patch_size
    blocks = x.reshape(B, C_in, rows, patch_size, cols, patch_size)  # (B, C_in, rows, P, cols, P)
    flat = lambda t: t.reshape(B, rows * cols, -1)  # noqa: E731
    out = [
        (flat(blocks.permute(0, 2, 4, 3, 5, 1)), _CHANNEL_LAST),  # (B, rows, cols, P, P, C_in)
        (flat(blocks.permute(0, 4, 2, 1, 3, 5)), _COLUMN_MAJOR),  # (B, cols, rows, C_in, P, P)
        (flat(blocks.permute(0, 4, 2, 3, 5, 1)), _COLUMN_MAJOR + "; " + _CHANNEL_LAST),
        (
            flat(blocks.permute(0, 2, 4, 1, 5, 3)),
            _PIXELS_SWAPPED,
        ),  # (B, rows, cols, C_in, P, P), pixels transposed
        (flat(x), _PLAIN_RESHAPE),
    ]
    if H_img == W_img:
        out.append((_unfold(x.transpose(2, 3), patch_size), _IMAGE_TRANSPOSED))
    return out


def _patchify_call(g: Grader, patchify, x, patch_size):
    where = f"for images {tuple(x.shape)} ({dtype_name(x.dtype)}) and patch_size={patch_size}"
    try:
        out = patchify(x.clone(), patch_size)
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        g.fail(f"{where} your code raised {_raised(e)}")
    B, C_in, H_img, W_img = x.shape
    shape = (B, (H_img // patch_size) * (W_img // patch_size), C_in * patch_size**2)
    g.expect(
        is_tensor(out) and tuple(out.shape) == shape and out.dtype == x.dtype,
        f"{where} expected a {dtype_name(x.dtype)} tensor of shape (B, N_p, C_in P^2) = {shape}, got {describe(out)}",
    )
    return out


def _patchify_matches(g: Grader, patchify, x, patch_size) -> None:
    out = _patchify_call(g, patchify, x, patch_size)
    right = _unfold(x.double(), patch_size).to(x.dtype)
    if close(out, right):
        return
    mistakes = [(wrong.to(x.dtype), hint) for wrong, hint in _patch_mistakes(x.double(), patch_size)]
    where = f"for images {tuple(x.shape)} and patch_size={patch_size}"
    first_match(g, out, [(wrong, f"{where}: {hint}") for wrong, hint in mistakes], right)
    hint = (
        " (with H_img != W_img the grid has H_img / P rows and W_img / P columns: take them from images.shape[2] "
        "and "
        "images.shape[3])"
        if x.shape[2] != x.shape[3]
        else ""
    )
    g.fail(
        f"{where} the patches differ from F.unfold(images, P, stride=P).transpose(1, 2): patches row by row, each "
        f"flattened channel-first as (C_in, P, P){hint}"
    )


def _worked_example(g: Grader, patchify) -> None:
    x = torch.arange(16.0).view(1, 1, 4, 4)
    out = _patchify_call(g, patchify, x, 2)
    expected = torch.tensor(
        [[[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]], dtype=torch.float32
    )
    first_match(g, out, _patch_mistakes(x, 2), expected)
    g.expect(
        close(out, expected),
        f"the 4x4 image 0 .. 15 in 2x2 patches should give {expected[0].tolist()}, got {out[0].tolist()}",
    )


@dataclass(frozen=True)
class _Images:
    """A batch of images: B, C_in, a grid of rows x cols patches of P x P pixels, a dtype and a seed."""

    seed: int
    B: int
    C_in: int
    rows: int
    cols: int
    P: int
    dtype: torch.dtype = F64

    def images(self) -> torch.Tensor:
        return tensor(self.seed, self.B, self.C_in, self.rows * self.P, self.cols * self.P).to(self.dtype)


_IMAGES = st.builds(
    _Images,
    SEEDS,
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from((F64, F64, F32)),
)


def grade_patchify(patchify) -> None:
    """Grade a student's ``patchify(images, patch_size)``."""
    g = Grader("patchify")

    with g.check("returns (B, N_p, C_in P^2) in the images' dtype (float64 and float32)"):
        for dtype in (F64, F32):
            _patchify_call(g, patchify, rand("patchify.shape", 2, C_IN, IMG, IMG, dtype=dtype), P)
            _patchify_call(g, patchify, rand("patchify.shape.rect", 1, 2, 6, 4, dtype=dtype), 2)

    with g.check("the worked example: a 4x4 image holding 0 .. 15 in 2x2 patches"):
        _worked_example(g, patchify)

    with g.check(
        "patches row by row, each flattened channel-first as (C_in, P, P): equal to F.unfold for any batch, "
        "channels, patch size and grid (square or not, P = 1, one patch per image)"
    ):
        for_all(
            "patchify.values",
            _IMAGES,
            lambda case: _patchify_matches(g, patchify, case.images(), case.P),
            max_examples=20,
            first=_Images(1, 2, 3, 2, 2, 2),
        )
        for B, C_in, H_img, W_img, p in ((2, 3, 8, 8, 2), (3, 3, 8, 8, 4), (2, 2, 6, 6, 3)):
            _patchify_matches(g, patchify, rand(f"patchify.values.{p}", B, C_in, H_img, W_img), p)

    with g.check("non-square images (6x9 in 3x3 patches, 8x4 in 2x2 patches, 2x6 in 2x2 patches)"):
        for shape, p in (((2, 3, 6, 9), 3), ((1, 2, 8, 4), 2), ((2, 1, 2, 6), 2)):
            _patchify_matches(g, patchify, rand(f"patchify.rect.{p}", *shape), p)

    with g.check("edge cases: P = 1 (a patch per pixel) and P = the image size (one patch)"):
        x = rand("patchify.edge", 2, C_IN, 4, 4)
        for p in (1, 4):
            _patchify_matches(g, patchify, x, p)

    with g.check("raises ValueError when P does not divide the image's height or width"):
        expect_value_error(g, lambda: patchify(rand("patchify.bad", 1, C_IN, 8, 8), 3), "8x8 images with P=3")
        expect_value_error(
            g,
            lambda: patchify(rand("patchify.bad.w", 1, C_IN, 8, 6), 4),
            "8x6 images with P=4 (the height fits, the width does not)",
        )
        expect_value_error(
            g,
            lambda: patchify(rand("patchify.bad.h", 2, 1, 6, 8), 4),
            "6x8 images with P=4 (the width fits, the height does not)",
        )
        expect_value_error(
            g, lambda: patchify(rand("patchify.bad.big", 1, 1, 4, 4), 8), "4x4 images with P=8"
        )

    with g.check("raises ValueError when images is not 4-D or patch_size is below 1"):
        for shape in ((3, 8, 8), (1, 1, 3, 8, 8), (8, 8)):
            expect_value_error(
                g,
                lambda shape=shape: patchify(rand("patchify.rank", *shape), 2),
                f"images of shape {shape} and P=2",
                "images must be (B, C_in, H_img, W_img)",
            )
        for p in (0, -2):
            expect_value_error(
                g,
                lambda p=p: patchify(rand("patchify.p", 1, 2, 4, 4), p),
                f"4x4 images with P={p}",
                "patch_size must be a positive integer",
            )

    with g.check("does not change the images"):
        x = rand("patchify.inplace", 2, C_IN, IMG, IMG)
        result = probe(patchify, x.clone(), P)
        g.expect(
            close(result.args[0], x), "patchify changed its input: work on views or copies, never in place"
        )

    g.finish()


def check_patchify(patchify) -> None:
    """Public: one small example per clause the hidden checks grade."""
    g = Grader("patchify (public)")
    with g.check("a 4x4 image holding 0 .. 15 in 2x2 patches"):
        _worked_example(g, patchify)
    with g.check("a (2, 3, 8, 8) batch in 2x2 patches equals F.unfold(images, 2, stride=2).transpose(1, 2)"):
        _patchify_matches(g, patchify, rand("public.patchify", 2, 3, 8, 8), 2)
    with g.check("a float32 (1, 2, 6, 4) image in 2x2 patches, P = 1 and P = the image size"):
        x = rand("public.patchify.rect", 1, 2, 6, 4, dtype=F32)
        for p in (2, 1):
            _patchify_matches(g, patchify, x, p)
        _patchify_matches(g, patchify, x[:, :, :4], 4)
    with g.check("8x6 images with P=4, (3, 8, 8) images and P=0 raise ValueError"):
        expect_value_error(
            g, lambda: patchify(rand("public.patchify.bad", 1, 3, 8, 6), 4), "8x6 images with P=4"
        )
        expect_value_error(
            g, lambda: patchify(rand("public.patchify.rank", 3, 8, 8), 2), "images of shape (3, 8, 8)"
        )
        expect_value_error(g, lambda: patchify(rand("public.patchify.p", 1, 3, 4, 4), 0), "P=0")
    with g.check("the images are not changed"):
        x = rand("public.patchify.inplace", 1, 2, 4, 4)
        g.expect(close(probe(patchify, x.clone(), 2).args[0], x), "patchify changed its input in place")
    g.finish()


# =========================================================================== part 2: PatchEmbedding


def _conv(weights, patch_size: int) -> torch.nn.Conv2d:
    """The strided ``Conv2d`` equal to a patch embedding with ``weights``: the independent reference."""
    w = weights["proj.weight"].double()
    d_model, patch_dim = w.shape
    conv = torch.nn.Conv2d(patch_dim // patch_size**2, d_model, patch_size, stride=patch_size).double()
    with torch.no_grad():
        conv.weight.copy_(w.view(d_model, -1, patch_size, patch_size))  # (C, C_in P^2) -> (C, C_in, P, P)
        conv.bias.copy_(weights["proj.bias"].double())
    return conv


def _embed_reference(weights, x, patch_size: int) -> torch.Tensor:
    with torch.no_grad():
        return (
            _conv(weights, patch_size)(x.double()).flatten(2).transpose(1, 2)
        )  # (B, C, rows, cols) -> (B, N_p, C)


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


def _build_embedding(
    g: Grader, PatchEmbedding, name: str, image_size=IMG, patch_size=P, in_channels=C_IN, d_model=C, dtype=F64
):
    """The student's ``PatchEmbedding`` with random weights of ``dtype`` loaded into it (and those weights)."""
    m = PatchEmbedding(image_size, patch_size, in_channels, d_model)
    m.to(dtype)
    weights = {
        key: w.to(dtype)
        for key, w in random_weights(
            ref.PatchEmbedding(image_size, patch_size, in_channels, d_model), name
        ).items()
    }
    _load(g, m, weights, "PatchEmbedding")
    return m, weights


@dataclass(frozen=True)
class _Embedding:
    seed: int
    B: int
    grid: int
    P: int
    C_in: int
    d_model: int
    dtype: torch.dtype = F64

    @property
    def image_size(self) -> int:
        return self.grid * self.P

    def __str__(self) -> str:
        return (
            f"for PatchEmbedding({self.image_size}, {self.P}, {self.C_in}, {self.d_model}) in {dtype_name(self.dtype)} "
            f"on images ({self.B}, {self.C_in}, {self.image_size}, {self.image_size})"
        )


_EMBEDDINGS = st.builds(
    _Embedding,
    SEEDS,
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 7),
    st.sampled_from((F64, F64, F32)),
)


def _embedding_matches(g: Grader, PatchEmbedding, case: _Embedding) -> None:
    m, w = _build_embedding(
        g,
        PatchEmbedding,
        f"embedding.{case.seed}",
        case.image_size,
        case.P,
        case.C_in,
        case.d_model,
        case.dtype,
    )
    x = tensor(case.seed, case.B, case.C_in, case.image_size, case.image_size).to(case.dtype)
    try:
        out = m(x)
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        g.fail(f"{case} your code raised {_raised(e)}")
    expected = _embed_reference(w, x, case.P)
    g.expect(
        is_tensor(out) and out.shape == expected.shape and out.dtype == case.dtype,
        f"{case}: expected a {dtype_name(case.dtype)} tensor (B, N_p, C) = {tuple(expected.shape)}, "
        f"got {describe(out)}",
    )
    if close(out, expected.to(case.dtype)):
        return
    xd = x.double()
    lin = lambda patches: F.linear(patches, w["proj.weight"].double(), w["proj.bias"].double())  # noqa: E731
    first_match(
        g,
        out,
        [(lin(p).to(case.dtype), f"{case}: {hint}") for p, hint in _patch_mistakes(xd, case.P)]
        + [
            (
                F.linear(ref.patchify(xd, case.P), w["proj.weight"].double()).to(case.dtype),
                f"{case}: the bias of proj is missing from the output: return proj(patches)",
            ),
            (
                ref.patchify(xd, case.P).to(case.dtype) if case.C_in * case.P**2 == case.d_model else None,
                f"{case}: the patches are returned without the linear map: return proj(patchify(images, P))",
            ),
        ],
        expected.to(case.dtype),
    )
    g.fail(
        f"{case}: the output differs from a Conv2d with kernel and stride P whose weight is "
        "proj.weight.view(C, C_in, P, P): return proj(patchify(images, patch_size)), with the constructor's "
        "arguments, not fixed numbers"
    )


def grade_patch_embedding(PatchEmbedding) -> None:
    """Grade ``PatchEmbedding(image_size, patch_size, in_channels, d_model)``."""
    g = Grader("PatchEmbedding")

    with g.check("has one nn.Linear proj from C_in P^2 to C features, with a bias"):
        for args in ((IMG, P, C_IN, C), (6, 3, 1, 5), (4, 1, 2, 3)):
            m = PatchEmbedding(*args)
            layer = getattr(m, "proj", None)
            g.expect(
                is_a(layer, "torch.nn.modules.linear.Linear"), "PatchEmbedding needs an nn.Linear called proj"
            )
            image_size, p, c_in, d_model = args
            got = (layer.in_features, layer.out_features)
            g.expect(
                got == (c_in * p * p, d_model),
                f"for PatchEmbedding{args} proj should map C_in P^2 = "
                f"{c_in * p * p} "
                f"values to C = {d_model} features, got {got[0]} -> {got[1]}",
            )
            g.expect(
                layer.bias is not None,
                "proj needs a bias (nn.Linear's default), like the Conv2d of the ViT paper",
            )

    with g.check("equals a Conv2d with kernel size and stride P (weights loaded into proj, RGB 8x8 images)"):
        _patchify_broken(g)
        _embedding_matches(g, PatchEmbedding, _Embedding(3, 3, IMG // P, P, C_IN, C))

    with g.check(
        "any shape: batches of 1 and more, 1 to 3 channels, P = 1 to the whole image, any width, float32 "
        "and float64"
    ):
        for_all(
            "embedding.shapes",
            _EMBEDDINGS,
            lambda case: _embedding_matches(g, PatchEmbedding, case),
            max_examples=12,
            first=_Embedding(1, 2, 2, 2, 1, 3),
        )
        for image_size, p, c_in in ((8, 4, 1), (6, 3, 2)):
            _embedding_matches(g, PatchEmbedding, _Embedding(image_size + p, 2, image_size // p, p, c_in, 10))

    with g.check("raises ValueError for images of the wrong channels, height, width or rank"):
        m, _ = _build_embedding(g, PatchEmbedding, "embedding.bad")
        name = f"PatchEmbedding({IMG}, {P}, {C_IN}, {C})"
        for shape, what in (
            ((2, 1, IMG, IMG), "1-channel images"),
            ((2, 4, IMG, IMG), "4-channel images"),
            ((2, C_IN, 2 * IMG, 2 * IMG), f"{2 * IMG}x{2 * IMG} images"),
            ((2, C_IN, IMG // 2, IMG // 2), f"{IMG // 2}x{IMG // 2} images"),
            ((2, C_IN, IMG, 2 * IMG), f"{IMG}x{2 * IMG} images (the height fits, the width does not)"),
            ((2, C_IN, IMG + 2, IMG), f"{IMG + 2}x{IMG} images (the width fits, the height does not)"),
            ((C_IN, IMG, IMG), f"one image without a batch axis, ({C_IN}, {IMG}, {IMG})"),
        ):
            expect_value_error(
                g,
                lambda shape=shape: m(rand("embedding.bad.x", *shape)),
                f"{name} given {what}",
                f"images must be (B, {C_IN}, {IMG}, {IMG})",
            )

    with g.check("the constructor raises ValueError when patch_size does not divide image_size"):
        for args in ((8, 3, 3, 12), (6, 4, 1, 4), (4, 8, 1, 4)):
            expect_value_error(
                g,
                lambda args=args: PatchEmbedding(*args),
                f"PatchEmbedding{args}",
                "patch_size must divide image_size",
            )

    with g.check("does not change the images"):
        m, _ = _build_embedding(g, PatchEmbedding, "embedding.inplace")
        x = rand("embedding.inplace.x", 2, C_IN, IMG, IMG)
        g.expect(close(probe(m, x.clone()).args[0], x), "PatchEmbedding changed the images in place")

    g.finish()


def check_patch_embedding(PatchEmbedding) -> None:
    """Public: one small example per clause the hidden checks grade."""
    g = Grader("PatchEmbedding (public)")
    with g.check("PatchEmbedding(8, 2, 3, 12) has proj = nn.Linear(12, 12) with a bias"):
        m = PatchEmbedding(8, 2, 3, 12)
        layer = getattr(m, "proj", None)
        g.expect(
            is_a(layer, "torch.nn.modules.linear.Linear")
            and layer.bias is not None
            and (layer.in_features, layer.out_features) == (12, 12),
            f"expected proj = nn.Linear(12, 12) (with its bias), got {describe(layer)}",
        )
    with g.check(
        "with weights loaded, PatchEmbedding(8, 2, 3, 12) equals a Conv2d with kernel size and stride 2"
    ):
        _embedding_matches(g, PatchEmbedding, _Embedding(21, 2, 4, 2, 3, 12))
    with g.check("PatchEmbedding(6, 3, 1, 4) in float32 on one image"):
        _embedding_matches(g, PatchEmbedding, _Embedding(22, 1, 2, 3, 1, 4, F32))
    with g.check(
        "1-channel images, 8x16 images, one (3, 8, 8) image without a batch axis, and "
        "PatchEmbedding(8, 3, 3, 12) raise ValueError"
    ):
        m, _ = _build_embedding(g, PatchEmbedding, "public.embedding.bad")
        expect_value_error(g, lambda: m(rand("public.embedding.bad.c", 2, 1, IMG, IMG)), "1-channel images")
        expect_value_error(g, lambda: m(rand("public.embedding.bad.w", 2, C_IN, IMG, 2 * IMG)), "8x16 images")
        expect_value_error(
            g, lambda: m(rand("public.embedding.bad.r", C_IN, IMG, IMG)), "one (3, 8, 8) image"
        )
        expect_value_error(g, lambda: PatchEmbedding(8, 3, 3, 12), "PatchEmbedding(8, 3, 3, 12)")
    with g.check("the images are not changed"):
        m, _ = _build_embedding(g, PatchEmbedding, "public.embedding.inplace")
        x = rand("public.embedding.inplace.x", 1, C_IN, IMG, IMG)
        g.expect(close(probe(m, x.clone()).args[0], x), "PatchEmbedding changed the images in place")
    g.finish()


# =========================================================================== part 3: add_cls_and_positions


def _tokens(name: str, B: int, N_p: int, C_: int, dtype=F64):
    return (
        rand(name + ".x", B, N_p, C_, dtype=dtype),
        rand(name + ".cls", 1, 1, C_, dtype=dtype),
        rand(name + ".pos", N_p + 1, C_, dtype=dtype),
    )


_CLS_LAST = (
    "[CLS] was put at the end: it is token 0, in front of the patches (torch.cat([cls, patches], dim=1))"
)
_CLS_NO_POSITION = (
    "[CLS] got no position: add positions to the whole sequence after prepending [CLS], so [CLS] gets "
    "positions[0] and patch n gets positions[n + 1]"
)


def _cls_expected(x, cls, pos):
    """The definition written out: token 0 is [CLS] + positions[0], token n + 1 is patch n + positions[n + 1]."""
    x, cls, pos = x.double(), cls.double(), pos.double()
    out = torch.empty(x.shape[0], x.shape[1] + 1, x.shape[2], dtype=F64)
    out[:, 0] = cls[0, 0] + pos[0]
    out[:, 1:] = x + pos[1:]
    return out


def _cls_mistakes(x, cls, pos):
    x, cls, pos = x.double(), cls.double(), pos.double()
    B, N_p, C_ = x.shape
    c = cls.expand(B, 1, C_)
    return [
        (torch.cat([x, c], 1) + pos, _CLS_LAST),
        (torch.cat([x + pos[:N_p], c + pos[N_p]], 1), _CLS_LAST),
        (torch.cat([c, x + pos[1:]], 1), _CLS_NO_POSITION),
        (
            torch.cat([c, x + pos[:N_p]], 1),
            "the patches got positions 0 .. N_p - 1 and [CLS] none: [CLS] is token 0 "
            "with positions[0], patch n is token n + 1 with positions[n + 1]",
        ),
        (
            torch.cat([c + pos[0], x + pos[:N_p]], 1),
            "positions[0] is used twice: patch n is token n + 1 and gets positions[n + 1]",
        ),
        (
            torch.cat([c, x], 1),
            "the positions are not added: return torch.cat([cls, patches], dim=1) + positions",
        ),
        (x + pos[1:], "[CLS] is missing: the output has N_p + 1 tokens, [CLS] first"),
    ]


def _cls_call(g: Grader, fn, x, cls, pos):
    where = f"for patches {tuple(x.shape)}, cls_token {tuple(cls.shape)} and positions {tuple(pos.shape)}"
    try:
        return fn(x.clone(), cls.clone(), pos.clone())
    except Exception as e:
        raise_unless_student_error(e)
        if x.shape[0] > 1 and ("size" in str(e).lower() or "dimension" in str(e).lower()):
            g.fail(
                f"{where} your code raised {_raised(e)}. cls_token is (1, 1, C), one vector for every image: expand "
                "it to (B, 1, C) before concatenating"
            )
        g.fail(f"{where} your code raised {_raised(e)}")


def _cls_matches(g: Grader, fn, x, cls, pos) -> None:
    out = _cls_call(g, fn, x, cls, pos)
    B, N_p, C_ = x.shape
    where = f"for patches {tuple(x.shape)} ({dtype_name(x.dtype)})"
    g.expect(
        is_tensor(out) and tuple(out.shape) == (B, N_p + 1, C_) and out.dtype == x.dtype,
        f"{where} expected a {dtype_name(x.dtype)} tensor of shape (B, N_p + 1, C) = {(B, N_p + 1, C_)}, got "
        f"{describe(out)}",
    )
    right = _cls_expected(x, cls, pos)
    if close(out, right.to(x.dtype)):
        return
    first_match(
        g,
        out,
        [(w.to(x.dtype), f"{where}: {hint}") for w, hint in _cls_mistakes(x, cls, pos)],
        right.to(x.dtype),
    )
    g.fail(
        f"{where} the tokens differ from torch.cat([cls_token.expand(B, 1, C), patches], dim=1) + positions"
    )


@dataclass(frozen=True)
class _Tokens:
    seed: int
    B: int
    N_p: int
    C: int
    dtype: torch.dtype = F64

    def inputs(self):
        return (
            tensor(self.seed, self.B, self.N_p, self.C).to(self.dtype),
            tensor(self.seed + 1, 1, 1, self.C).to(self.dtype),
            tensor(self.seed + 2, self.N_p + 1, self.C).to(self.dtype),
        )


_TOKENS = st.builds(
    _Tokens, SEEDS, st.integers(1, 4), st.integers(1, 9), st.integers(1, 8), st.sampled_from((F64, F64, F32))
)


def grade_add_cls_and_positions(add_cls_and_positions) -> None:
    """Grade ``add_cls_and_positions(patches, cls_token, positions)``."""
    g = Grader("add_cls_and_positions")

    with g.check("returns a new (B, N_p + 1, C) tensor in the inputs' dtype (float64 and float32)"):
        for dtype in (F64, F32):
            x, cls, pos = _tokens("cls.shape", 2, 4, 6, dtype)
            out = _cls_call(g, add_cls_and_positions, x, cls, pos)
            g.expect(
                is_tensor(out) and tuple(out.shape) == (2, 5, 6) and out.dtype == dtype,
                f"for {dtype_name(dtype)} patches (2, 4, 6) expected a {dtype_name(dtype)} tensor of shape "
                "(B, N_p + 1, C) = "
                f"(2, 5, 6), got {describe(out)}",
            )

    with g.check(
        "[CLS] first with positions[0]; patch n is token n + 1 with positions[n + 1] (any B, N_p, C)"
    ):
        for_all(
            "cls.values",
            _TOKENS,
            lambda case: _cls_matches(g, add_cls_and_positions, *case.inputs()),
            max_examples=20,
            first=_Tokens(1, 2, 3, 2),
        )
        for B, N_p, C_ in ((3, 16, C), (1, 4, 5), (5, 9, 8), (1, 1, 1)):
            _cls_matches(g, add_cls_and_positions, *_tokens(f"cls.values.{B}", B, N_p, C_))

    with g.check("every image gets the same [CLS] vector"):
        x, cls, pos = _tokens("cls.batch", 4, 3, 5)
        out = _cls_call(g, add_cls_and_positions, x, cls, pos)
        g.expect(
            is_tensor(out) and out.shape == (4, 4, 5),
            f"for patches (4, 3, 5) expected a (4, 4, 5) tensor, got {describe(out)}",
        )
        g.expect(
            close(out[:, 0], out[:1, 0].expand(4, 5)),
            "token 0 differs between images, so it is not the [CLS] token: put the one (1, 1, C) cls_token, "
            "expanded over the batch, first",
        )
        g.expect(
            close(out[:, 0], (cls[0, 0] + pos[0]).expand(4, 5)),
            "token 0 is the same in every image but not cls_token + positions[0]: add positions[0] to the "
            "[CLS] token",
        )

    with g.check("gradients reach the patches, cls_token and positions"):
        x, cls, pos = _tokens("cls.grad", 3, 4, 5)
        upstream = rand("cls.grad.up", 3, 5, 5)
        result = probe(
            add_cls_and_positions,
            x.clone().requires_grad_(),
            cls.clone().requires_grad_(),
            pos.clone().requires_grad_(),
            backward=(None, upstream),
        )
        grads = result.grads or [None, None, None]
        g.expect(
            grads[0] is not None and close(grads[0], upstream[:, 1:]),
            "the gradient of the patches should be the upstream gradient at tokens 1 .. N_p: use patches itself "
            "(no .data, .detach() or copy)",
        )
        g.expect(
            grads[1] is not None and close(grads[1], upstream[:, :1].sum(0, keepdim=True)),
            "the gradient of cls_token should be the sum over the batch of the upstream gradient at token 0: use "
            "cls_token itself (expand, not .data, .detach() or a new tensor)",
        )
        g.expect(
            grads[2] is not None and close(grads[2], upstream.sum(0)),
            "the gradient of positions should be the upstream gradient summed over the batch: add positions "
            "itself to the sequence (no .data, .detach() or copy)",
        )

    with g.check("does not change the patches, cls_token or positions in place"):
        x, cls, pos = _tokens("cls.inplace", 3, 4, 5)
        result = probe(add_cls_and_positions, x.clone(), cls.clone(), pos.clone())
        for name, before, after in zip(("patches", "cls_token", "positions"), (x, cls, pos), result.args):
            g.expect(
                is_tensor(after) and close(after, before),
                f"{name} was changed in place: build a new tensor (torch.cat, then +, never +=)",
            )

    with g.check("raises ValueError when the shapes do not fit"):
        x, cls, pos = _tokens("cls.bad", 2, 4, 3)
        for args, what in (
            ((x, cls, pos[:4]), "positions (4, 3) for 4 patches (it needs N_p + 1 = 5 rows)"),
            ((x, cls, torch.cat([pos, pos[:1]])), "positions (6, 3) for 4 patches"),
            ((x, cls, pos[:, :2]), "positions (5, 2) for patches of width 3"),
            ((x, torch.cat([cls, cls], -1), pos), "cls_token (1, 1, 6) for patches of width 3"),
            ((x, cls[..., :2], pos), "cls_token (1, 1, 2) for patches of width 3"),
            ((x[0], cls, pos), "patches (4, 3) without a batch axis"),
            ((x[None], cls, pos), "patches (1, 2, 4, 3)"),
        ):
            expect_value_error(
                g,
                lambda args=args: add_cls_and_positions(*args),
                what,
                "patches (B, N_p, C), cls_token (1, 1, C), positions (N_p + 1, C)",
            )

    g.finish()


def check_add_cls_and_positions(add_cls_and_positions) -> None:
    """Public: two images of three patches of width 2, written out by hand, then one example per clause."""
    g = Grader("add_cls_and_positions (public)")
    with g.check("2 images, 3 patches, C = 2"):
        x = torch.arange(12.0).view(2, 3, 2)
        cls = torch.tensor([[[100.0, 200.0]]])
        pos = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]])
        out = add_cls_and_positions(x, cls, pos)
        expected = torch.tensor(
            [
                [[100.1, 200.2], [0.3, 1.4], [2.5, 3.6], [4.7, 5.8]],
                [[100.1, 200.2], [6.3, 7.4], [8.5, 9.6], [10.7, 11.8]],
            ]
        )
        g.expect(
            is_tensor(out) and out.shape == (2, 4, 2), f"expected a (2, 4, 2) tensor, got {describe(out)}"
        )
        g.expect(
            close(out, expected, magnitude=200.0),
            f"expected {expected.tolist()}, got {out.tolist()}: [CLS] "
            "first, then positions[t] added to token t",
        )
    with g.check("one image of one patch, in float64 and in float32"):
        _cls_matches(g, add_cls_and_positions, *_tokens("public.cls.one", 1, 1, 3))
        _cls_matches(g, add_cls_and_positions, *_tokens("public.cls.one", 1, 1, 3, F32))
    with g.check("gradients reach the patches, cls_token and positions; nothing is changed in place"):
        x, cls, pos = _tokens("public.cls.grad", 2, 3, 2)
        result = probe(
            add_cls_and_positions,
            x.clone().requires_grad_(),
            cls.clone().requires_grad_(),
            pos.clone().requires_grad_(),
            backward=(None, torch.ones(2, 4, 2, dtype=F64)),
        )
        grads = result.grads or [None, None, None]
        for name, got, want in zip(
            ("patches", "cls_token", "positions"),
            grads,
            (torch.ones(2, 3, 2), torch.full((1, 1, 2), 2.0), torch.full((4, 2), 2.0)),
        ):
            g.expect(
                is_tensor(got) and close(got, want.double()), f"the gradient of {name} is wrong or missing"
            )
        for name, before, after in zip(("patches", "cls_token", "positions"), (x, cls, pos), result.args):
            g.expect(is_tensor(after) and close(after.detach(), before), f"{name} was changed in place")
    with g.check(
        "positions with N_p rows instead of N_p + 1, and a cls_token (1, 1, 3) for patches of width 2, "
        "raise ValueError"
    ):
        x, cls, pos = _tokens("public.cls.bad", 2, 3, 2)
        expect_value_error(
            g, lambda: add_cls_and_positions(x, cls, pos[:3]), "positions (3, 2) for 3 patches"
        )
        expect_value_error(
            g,
            lambda: add_cls_and_positions(x, torch.cat([cls, cls[..., :1]], -1), pos),
            "cls_token (1, 1, 3) for patches of width 2",
        )
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
    _load(g, theirs, weights, "ViT")
    theirs.eval()
    return theirs, local


def _vit_mistakes(r, x):
    """What common wrong forwards return, computed with the reference model ``r``'s pieces."""
    with torch.no_grad():
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
            (
                r.head(h.mean(1)),
                "the classifier reads the mean of all tokens: read the [CLS] output only, "
                "head(encoder(tokens)[:, 0])",
            ),
            (
                r.head(h[:, 1:].mean(1)),
                "the classifier reads the mean of the patch tokens: read the [CLS] output, "
                "head(encoder(tokens)[:, 0])",
            ),
            (
                r.head(h[:, -1]),
                "the classifier reads the last token: [CLS] is token 0, head(encoder(tokens)[:, 0])",
            ),
            (
                r.head(no_norm[:, 0]),
                "the final layer norm is missing: run the whole self.encoder (a pre-norm stack "
                "ends "
                "with its norm), not only its layers",
            ),
            (
                torch.softmax(r.head(h[:, 0]), -1),
                "forward returns probabilities: return the logits, head(...) without "
                "a "
                "softmax (F.cross_entropy applies log-softmax itself)",
            ),
            (
                r.head(r.encoder(patches)[:, 0]),
                "[CLS] and the positions are missing: embed builds the encoder's input "
                "with add_cls_and_positions(patch_embed(images), cls_token, positions)",
            ),
            (
                no_pos,
                "the positions are not added: embed adds pos_emb(torch.arange(N_p + 1)) through "
                "add_cls_and_positions",
            ),
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
    g.expect(
        patchify_ok, "your patchify (part 1) gives wrong patches, and the model uses it: fix part 1 first"
    )
    w = {k: v for k, v in m.state_dict().items() if k.startswith("patch_embed.")}
    try:
        mine = {k.removeprefix("patch_embed."): v for k, v in w.items()}
        emb_ok = close(m.patch_embed(x), _embed_reference(mine, x, P))
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        emb_ok = False
    g.expect(
        emb_ok, "model.patch_embed (your PatchEmbedding, part 2) gives wrong embeddings: fix part 2 first"
    )
    x3, cls, pos = _tokens("vit.parts.cls", 2, 4, 5)
    try:
        out = student_side("add_cls_and_positions", ref.add_cls_and_positions)(x3, cls, pos)
        cls_ok = close(out, ref.add_cls_and_positions(x3, cls, pos))
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        cls_ok = False
    g.expect(cls_ok, "your add_cls_and_positions (part 3) is wrong, and embed uses it: fix part 3 first")


@dataclass(frozen=True)
class _Model:
    """A ViT's shape and a batch size."""

    seed: int
    B: int
    grid: int
    patch_size: int
    in_channels: int
    n_heads: int
    d_head: int
    n_layers: int
    n_classes: int

    @property
    def kwargs(self) -> dict:
        return dict(
            image_size=self.grid * self.patch_size,
            patch_size=self.patch_size,
            in_channels=self.in_channels,
            n_classes=self.n_classes,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_model=self.n_heads * self.d_head,
        )

    def images(self) -> torch.Tensor:
        size = self.grid * self.patch_size
        return tensor(self.seed, self.B, self.in_channels, size, size)

    def __str__(self) -> str:
        return f"for ViTConfig({', '.join(f'{k}={v}' for k, v in self.kwargs.items())}) on {self.B} image(s)"


_MODELS = st.builds(
    _Model,
    SEEDS,
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 2),
    st.integers(1, 6),
)


def _model_matches(g: Grader, ViT, ViTConfig, case: _Model, what: str) -> None:
    m, r = _vit_pair(g, ViT, ViTConfig, f"vit.{what}.{case.seed}", **case.kwargs)
    _model_compare(g, m, r, case, what)


def _model_compare(g: Grader, m, r, case: _Model, what: str) -> None:
    """The student's model ``m`` against the reference ``r`` (same weights) on ``case``'s images."""
    x = case.images()
    with torch.no_grad():
        right = r.embed(x) if what == "embed" else r(x)
    try:
        out = m.embed(x) if what == "embed" else m(x)
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        g.fail(f"{case}: {what} raised {_raised(e)}")
    shape = "(B, N_p + 1, C)" if what == "embed" else "logits (B, K)"
    g.expect(
        is_tensor(out) and out.shape == right.shape and out.dtype == F64,
        f"{case}: {what} should return a float64 {shape} = {tuple(right.shape)}, got {describe(out)}",
    )
    if close(out, right):
        return
    if what == "embed":
        with torch.no_grad():
            patches = r.patch_embed(x)
            no_pos = torch.cat([r.cls_token.expand(x.shape[0], 1, -1), patches], 1)
        first_match(
            g,
            out,
            [
                (
                    no_pos,
                    f"{case}: embed does not add the positions: pass pos_emb(torch.arange(N_p + 1)) "
                    "to add_cls_and_positions",
                )
            ],
            right,
        )
        g.fail(
            f"{case}: embed differs from dropout(add_cls_and_positions(patch_embed(images), cls_token, "
            "pos_emb(torch.arange(N_p + 1))))"
        )
    first_match(g, out, [(wrong, f"{case}: {hint}") for wrong, hint in _vit_mistakes(r, x)], right)
    g.fail(
        f"{case}: the logits differ from head(encoder(embed(images))[:, 0]) with the same weights: use the "
        "configuration, not fixed numbers"
    )


def _embed_on_device(g: Grader, m, x) -> None:
    """``m.embed(x)`` with torch's default device set to ``meta`` in the student's process: the positions must be
    made on the images' device (the CPU), so the result is a CPU tensor."""
    fix = (
        "make the positions on the images' device: pos_emb(torch.arange(N_p + 1, device=images.device)), not "
        "torch.arange(N_p + 1) (nor .to(device) afterwards)"
    )
    try:
        with default_device():
            out = m.embed(x)
    except Exception as e:  # noqa: BLE001
        if not meta_copy_refused(e):
            raise_unless_student_error(e)
        g.fail(
            f"with torch's default device set to another device than the images' (meta), embed raised "
            f"{_raised(e)}: {fix}"
        )
    g.expect(
        is_tensor(out) and out.device.type == "cpu",
        f"with torch's default device set to meta, embed returned {describe(out)}"
        f"{' on ' + out.device.type if is_tensor(out) else ''}, not a tensor on the images' device (cpu): {fix}",
    )


def grade_vit(ViT, ViTConfig) -> None:
    """Grade the student's ``ViT`` (its ``embed`` and ``forward``); ``ViTConfig`` is the notebook's config class."""
    g = Grader("ViT")

    with g.check("embed: [CLS] and the patch embeddings with their positions, (B, N_p + 1, C)"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.embed")
        _parts_broken(g, m)
        _model_compare(g, m, r, _Model(1, 3, IMG // P, P, C_IN, 2, C // 2, 2, K), "embed")

    with g.check("forward: the logits (B, K) from the [CLS] output of the encoder"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.forward")  # a model lives in its check's process
        _model_compare(g, m, r, _Model(2, 4, IMG // P, P, C_IN, 2, C // 2, 2, K), "forward")

    with g.check(
        "any configuration: 1 to 3 channels, patch sizes, grids of 1 to 9 patches, 1 or 2 layers, 1 to 3 "
        "heads, batches of 1 and more"
    ):

        def both(case):
            m, r = _vit_pair(g, ViT, ViTConfig, f"vit.shapes.{case.seed}", **case.kwargs)
            _model_compare(g, m, r, case, "embed")
            _model_compare(g, m, r, case, "forward")

        for_all("vit.shapes", _MODELS, both, max_examples=6, first=_Model(3, 1, 2, 2, 1, 1, 2, 1, 2))
        both(_Model(4, 2, 2, 4, 1, 4, 4, 3, 3))

    with g.check("each image is classified on its own"):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.batch")
        x = rand("vit.batch.x", 3, C_IN, IMG, IMG)
        together, alone = m(x), m(x[1:2])
        g.expect(
            is_tensor(together) and is_tensor(alone) and close(alone, together[1:2]),
            "the logits of an image change with the other images of the batch: never mix the batch axis (0)",
        )

    with g.check(
        "eval mode: no dropout (with dropout=0.5 in the configuration, embed and forward give what they give "
        "with dropout=0)"
    ):
        m, _ = _vit_pair(g, ViT, ViTConfig, "vit.dropout", dropout=0.5)
        m0, _ = _vit_pair(g, ViT, ViTConfig, "vit.dropout", dropout=0.0)  # the same weights
        x = rand("vit.dropout.x", 4, C_IN, IMG, IMG)
        for what, out, want in (("embed", m.embed(x), m0.embed(x)), ("forward", m(x), m0(x))):
            g.expect(
                is_tensor(out) and is_tensor(want) and close(out, want),
                f"in eval mode with dropout=0.5 {what} differs from {what} with dropout=0 (the same weights): "
                "dropout must act in training mode only: use self.dropout (an nn.Dropout), or F.dropout(x, p, "
                "training=self.training)",
            )

    with g.check(
        "training mode: self.dropout is applied to the encoder's input, the output of embed (with its p set "
        "to 1, embed returns zeros and forward runs the encoder on zeros)"
    ):
        m, r = _vit_pair(g, ViT, ViTConfig, "vit.dropout.one")
        x = rand("vit.dropout.one.x", 2, C_IN, IMG, IMG)
        plain = m.embed(x)  # eval mode: no dropout
        zeros = torch.zeros(2, N_P + 1, C, dtype=F64)
        with torch.no_grad():
            patches_only = torch.cat([r.cls_token.expand(2, 1, -1), zeros[:, 1:]], 1) + r.pos_emb.weight
        dropout = getattr(m, "dropout", None)
        g.expect(
            is_a(dropout, "torch.nn.modules.dropout.Dropout"),
            f"the given ViT has self.dropout (an nn.Dropout), got {describe(dropout)}",
        )
        set_attr(dropout, "p", 1.0)
        m.train()
        out = m.embed(x)
        g.expect(
            is_tensor(out) and out.shape == zeros.shape,
            f"embed should return {tuple(zeros.shape)}, got {describe(out)}",
        )
        if not close(out, zeros):
            first_match(
                g,
                out,
                [
                    (
                        plain,
                        "with self.dropout.p = 1 in training mode embed returned the tokens "
                        "unchanged: apply self.dropout to the output of add_cls_and_positions in "
                        "embed (not in forward, and not only in eval mode)",
                    ),
                    (
                        patches_only,
                        "with self.dropout.p = 1 in training mode only the patch embeddings "
                        "were zeroed: apply self.dropout to the whole sequence, after "
                        "add_cls_and_positions",
                    ),
                ],
                zeros,
            )
            g.fail(
                "with self.dropout.p = 1 in training mode embed should return zeros: "
                "return self.dropout(add_cls_and_positions(...))"
            )
        encoded = m.encoder(zeros)  # the given encoder: no dropout of its own here (dropout=0)
        g.expect(is_tensor(encoded), f"self.encoder returned {describe(encoded)}")
        g.expect(
            close(m(x), m.head(encoded[:, 0])),
            "with self.dropout.p = 1 in training mode forward should be head(encoder(zeros)[:, 0]), since embed "
            "returns zeros: forward must run the encoder on self.embed(images), and apply no other dropout",
        )

    with g.check(
        "training mode: self.dropout is applied once, with nn.Dropout's scaling (p = 0.5 drops about half the "
        "values of embed and doubles the others)"
    ):
        m, _ = _vit_pair(g, ViT, ViTConfig, "vit.dropout.half")
        x = rand("vit.dropout.half.x", 3, C_IN, IMG, IMG)
        plain = m.embed(x)  # eval mode: no dropout
        g.expect(
            is_tensor(plain) and plain.shape == (3, N_P + 1, C),
            f"embed should return (3, {N_P + 1}, {C}), got {describe(plain)}",
        )
        set_attr(m.dropout, "p", 0.5)
        m.train()
        with seeded("vit.dropout.half"):
            out = m.embed(x)
        g.expect(
            is_tensor(out) and out.shape == plain.shape,
            f"embed should return {tuple(plain.shape)}, got {describe(out)}",
        )
        dropped = out == 0  # nn.Dropout zeroes exactly
        share = float(dropped.double().mean())
        g.expect(
            close(out, torch.where(dropped, torch.zeros_like(plain), 2 * plain)),
            "with self.dropout.p = 0.5 in training mode each value of embed should be 0 or twice the value "
            "without "
            "dropout: apply self.dropout once, to the output of add_cls_and_positions",
        )
        g.expect(
            0.3 <= share <= 0.7,
            f"with self.dropout.p = 0.5 {share:.0%} of embed's values were dropped, about "
            "half expected: apply self.dropout once, in embed",
        )

    with g.check("embed makes its positions on the images' device, not on torch's default device"):
        m, _ = _vit_pair(g, ViT, ViTConfig, "vit.device")
        _embed_on_device(g, m, rand("vit.device.x", 2, C_IN, IMG, IMG))

    g.finish()


def check_vit(ViT, ViTConfig) -> None:
    """Public: a two-layer ViT against coursekit's with the same weights, then one example per clause."""
    g = Grader("ViT (public)")
    with g.check(
        "ViT(ViTConfig(image_size=8, patch_size=2, in_channels=3, n_classes=5, n_layers=2, n_heads=2, "
        "d_model=12)) equals the reference with the same weights"
    ):
        m, r = _vit_pair(g, ViT, ViTConfig, "public.vit")
        x = rand("public.vit.x", 2, C_IN, IMG, IMG)
        with torch.no_grad():
            right_embed, right = r.embed(x), r(x)
        emb = m.embed(x)
        g.expect(
            is_tensor(emb) and emb.shape == (2, N_P + 1, C),
            f"embed should return (2, {N_P + 1}, {C}), got {describe(emb)}",
        )
        g.expect(
            close(emb, right_embed),
            "embed differs from the reference: [CLS] first, positions added to every token",
        )
        out = m(x)
        g.expect(is_tensor(out) and out.shape == (2, K), f"expected logits (2, {K}), got {describe(out)}")
        g.expect(close(out, right), "the logits differ from head(encoder(embed(images))[:, 0])")
    with g.check("another configuration: one grey 8x8 image in 4x4 patches, 3 layers, 4 heads"):
        _model_matches(g, ViT, ViTConfig, _Model(31, 1, 2, 4, 1, 4, 4, 3, 3), "forward")
    with g.check(
        "eval mode ignores dropout; in training mode self.dropout acts once on embed's output (p = 1: zeros, "
        "and forward runs the encoder on zeros; p = 0.5: values dropped or doubled)"
    ):
        m, _ = _vit_pair(g, ViT, ViTConfig, "public.vit.dropout", dropout=0.5)
        m0, _ = _vit_pair(g, ViT, ViTConfig, "public.vit.dropout", dropout=0.0)
        x = rand("public.vit.dropout.x", 1, C_IN, IMG, IMG)
        g.expect(
            close(m(x), m0(x)), "in eval mode the logits with dropout=0.5 should equal those with dropout=0"
        )
        m = m0  # in training mode the encoder's own dropout (the configuration's) must stay off
        plain = m.embed(x)
        set_attr(m.dropout, "p", 1.0)
        m.train()
        out = m.embed(x)
        zeros = torch.zeros(1, N_P + 1, C, dtype=F64)
        g.expect(
            is_tensor(out) and close(out, zeros),
            "with self.dropout.p = 1 in training mode embed should return zeros: return self.dropout(...)",
        )
        encoded = m.encoder(zeros)
        g.expect(
            is_tensor(encoded) and close(m(x), m.head(encoded[:, 0])),
            "with self.dropout.p = 1 in training mode forward should be head(encoder(zeros)[:, 0]): run the "
            "encoder on self.embed(images)",
        )
        set_attr(m.dropout, "p", 0.5)
        with seeded("public.vit.dropout.half"):
            out = m.embed(x)
        g.expect(
            is_tensor(out) and close(out, torch.where(out == 0, torch.zeros_like(plain), 2 * plain)),
            "with self.dropout.p = 0.5 in training mode each value of embed should be 0 or twice the value "
            "without dropout: apply self.dropout once",
        )
    with g.check(
        "the positions are made on the images' device (torch's default device set to meta for the call)"
    ):
        m, _ = _vit_pair(g, ViT, ViTConfig, "public.vit.device")
        _embed_on_device(g, m, rand("public.vit.device.x", 1, C_IN, IMG, IMG))
    g.finish()


# --------------------------------------------------------------------------- predictions


#: DIGIT_TOKENS's images: MNIST's 28x28 digits, read by the book's digit ViT (its 4x4 patches, one channel)
MNIST_SIZE = 28


def _digit_tokens() -> int:
    """The number of tokens the book's digit ViT (the ``small`` preset), built for MNIST_SIZE-pixel images,
    feeds its encoder for one image."""
    cfg = dataclasses.replace(ref.VIT_PRESETS["small"], image_size=MNIST_SIZE)
    torch.manual_seed(0)
    with torch.no_grad():
        tokens = ref.ViT(cfg).embed(torch.zeros(1, cfg.in_channels, MNIST_SIZE, MNIST_SIZE))
    return int(tokens.shape[1])


#: ATTENTION_PAIRS's image sizes: ViT-B/16's pre-training resolution, and the one it is fine-tuned at
PAIRS_SIZES = (224, 384)


def _attention_pairs_ratio() -> float:
    """(query, key) pairs of ViT-B/16 on 384x384 images over those on 224x224 images, [CLS] included; the
    tokens are counted by cutting an image of each size into patches."""
    p = ref.VIT_PRESETS["vit-b/16"].patch_size
    tokens = [ref.patchify(torch.zeros(1, 3, n, n), p).shape[1] + 1 for n in PAIRS_SIZES]
    return (tokens[1] / tokens[0]) ** 2


_PAIRS_CHOICES = {"a": 1.0, "b": 1.7, "c": 3.0, "d": 9.0}

DIGIT_TOKENS = Prediction(
    name="predict_digit_tokens",
    question="The book's digit ViT, built instead for MNIST's 28x28 digits, cuts each into 4x4 patches and puts "
    "[CLS] in front: how many tokens does its encoder read per image?",
    tests="the token count of a ViT: (H_img / P) (W_img / P) patches plus one [CLS]",
    measure=_digit_tokens,
    explanation="A 28x28 image holds a 7x7 grid of 4x4 patches, so N_p = 49 patch tokens, and [CLS] makes "
    "{truth}. Not 49: the [CLS] token is a sequence position too. Not 8: the patches tile both directions, "
    "7 per row times 7 rows. Not 785: a token is a 16-pixel patch, not a pixel. The weights of the patch "
    "embedding do not change (each token is still one linear map of 16 pixels), but the position table has "
    "N_p + 1 rows, 50 here against 5 for the 8x8 digits, so the book's trained model cannot read 28x28 "
    "images without new positions.",
)

ATTENTION_PAIRS = Prediction(
    name="predict_attention_pairs",
    question="ViT-B/16 is pre-trained on 224x224 images and, as Dosovitskiy et al. (2021) do, fine-tuned on "
    "384x384 ones, with the same 16x16 patches. The number of (query, key) pairs each attention head scores "
    "grows by about how much?",
    tests="attention's quadratic cost: the tokens grow with the image's area, the attention pairs with its "
    "square",
    measure=lambda: min(
        _PAIRS_CHOICES,
        key=lambda c: abs(math.log(_attention_pairs_ratio()) - math.log(_PAIRS_CHOICES[c])),
    ),
    explanation="Answer {truth}. A 384x384 image holds a 24x24 grid of 16x16 patches: 576 patches and [CLS], "
    "577 tokens instead of 14 x 14 + 1 = 197. Every query scores every key, so the pairs grow with the square "
    "of the tokens: 577^2 / 197^2 = 8.6. (b), 384 / 224 = 1.7, is the growth of the image's side, but the "
    "tokens grow with its area; (c), 577 / 197 = 2.9, is the growth of the tokens, which is what the patch "
    "embedding and the feed-forward layers pay, not attention; (a) counts the weights, which stay the same "
    "ones (only the position table is interpolated in 2-D to the larger grid). This is why Touvron et al. "
    "(2019) and the ViT paper train at a low resolution and fine-tune briefly at a higher one.",
    choices={
        "a": "about the same (1x)",
        "b": "about 1.7x",
        "c": "about 3x",
        "d": "about 9x",
    },
)


def scrambled_errors(data: dict, n_test: int) -> dict[tuple[str, str], int]:
    """Test errors, in images, of each (model, variant) of runs of ``coursekit.experiments.scrambled_pixels``
    (``data`` as its ``load_results`` returns them) on ``n_test`` test images, summed over the seeds."""
    return {
        (m, v): sum(round(n_test * (1 - r["test_accuracy"])) for r in data["runs"][m][v])
        for m in data["runs"]
        for v in data["runs"][m]
    }


def scrambled_choice(errors: dict[tuple[str, str], int], n_images: int) -> str:
    """SCRAMBLED_PIXELS's letter for summed test errors ``{(model, variant): errors}`` out of ``n_images``
    test images per (model, variant): a network *holds* when its scrambled errors stay within 25% + 3
    images of its plain ones either way (a seed's runs differ by a few images), and *loses* when they at
    least double, plus 3; each letter needs both networks' levels, and (c) also needs the scrambled ViT
    ahead of the scrambled CNN."""

    def holds(m):
        plain, scrambled = errors[m, "plain"], errors[m, "scrambled"]
        return 0.8 * plain - 3 <= scrambled <= 1.25 * plain + 3

    def loses(m):
        return errors[m, "scrambled"] >= 2 * errors[m, "plain"] + 3

    def at_chance(m):
        return errors[m, "scrambled"] > 0.5 * n_images

    if at_chance("cnn") and at_chance("vit"):
        return "d"
    if holds("cnn") and holds("vit"):
        return "a"
    if loses("vit") and holds("cnn"):
        return "b"
    if loses("cnn") and holds("vit") and errors["vit", "scrambled"] < errors["cnn", "scrambled"]:
        return "c"
    return f"no choice fits the errors {errors}"


def _scrambled_pixels_choice() -> str:
    """The letter of the committed runs of ``coursekit.experiments.scrambled_pixels`` (its loader refuses a
    file the code would not write)."""
    from coursekit.experiments import digits, scrambled_pixels  # only when the question is graded

    data = scrambled_pixels.load_results()
    n_test = len(digits.digits_split().test_y)
    return scrambled_choice(scrambled_errors(data, n_test), n_test * len(data["seeds"]))


SCRAMBLED_PIXELS = Prediction(
    name="predict_scrambled_pixels",
    question="Scramble the digits: choose one fixed random order of the 16 pixel positions of a 4x4 patch and "
    "move the pixels inside every 4x4 patch of every image by it, training and test images alike (the digits "
    "look like noise to us, but nothing is lost: the order can be undone). The chapter's CNN and its ViT (4x4 "
    "patches) train on all 1,437 scrambled training digits, each with the recipe of the chapter's data-scale "
    "sweep, and are tested on the scrambled test digits. Compared with the same runs on plain digits, what "
    "happens?",
    tests="inductive bias: a convolution assumes that neighbouring pixels belong together; a ViT's patch "
    "embedding assumes nothing about the order of a patch's pixels",
    measure=_scrambled_pixels_choice,
    explanation="Answer {truth} (the check read the committed runs of coursekit.experiments.scrambled_pixels, "
    "summed over their seeds). The ViT reads each 4x4 patch through one linear map of its 16 pixels, and a "
    "linear map does not know which of its inputs are neighbours: reordering them only relabels its weights. "
    "A ViT trained on scrambled digits is the plain ViT with the columns of its patch embedding permuted, and "
    "it learns just as well (the experiment even starts it from the plain run's weights, relabelled, and it "
    "makes the same errors). The CNN's 3x3 filters assume that a pixel's neighbours in the grid are its "
    "neighbours in the picture, and that a stroke looks the same wherever it is. After the scramble neither is "
    "true: a filter sees pixels that lie far apart in the digit, and the same stroke looks different in each "
    "position of a patch. The assumption that made the CNN better on plain digits now works against it, and "
    "the ViT, which assumed nothing about the pixels inside a patch, comes out ahead. A prior helps only when "
    "it is true of the data: a model with less of one has more to learn, and less to be wrong about. (The "
    "ViT is not indifferent to every scramble: moving pixels between patches would change what each token "
    "holds.)",
    choices={
        "a": "both stay about where they were: nothing is lost, so neither network is affected",
        "b": "the ViT loses accuracy and the CNN does not: a scrambled patch no longer holds a stroke",
        "c": "the CNN loses accuracy and the ViT does not, so the scrambled ViT makes fewer errors than the "
        "scrambled CNN",
        "d": "both fall towards chance (10%)",
    },
)

check_predict_digit_tokens, grade_predict_digit_tokens = DIGIT_TOKENS.graders()
check_predict_attention_pairs, grade_predict_attention_pairs = ATTENTION_PAIRS.graders()
check_predict_scrambled_pixels, grade_predict_scrambled_pixels = SCRAMBLED_PIXELS.graders()


# --------------------------------------------------------------------------- experiment

#: the experiment's band: the share of blank patches in a random sample of BLANK_SAMPLE digits must lie
#: within BLANK_BAND of the share over all 1,797 digits (measured with the reference at grading time). Over
#: 1,000 samples of 300 digits the sample share strays from the full share by at most 0.009 (P = 1), 0.016
#: (P = 2) and 0.005 (P = 4); 0.03 is wide enough for any sample, and narrow enough to catch a share of
#: non-blank patches, a share over pixels rather than patches, or a blank test that accepts small values.
BLANK_SAMPLE, BLANK_BAND = 300, 0.03
_DIGITS: list[torch.Tensor] = []


def _digits() -> torch.Tensor:
    """All 1,797 scikit-learn digits, ``(1797, 1, 8, 8)`` float64 in ``[0, 1]`` (loaded once)."""
    if not _DIGITS:
        from sklearn.datasets import load_digits

        _DIGITS.append(torch.tensor(load_digits().images, dtype=torch.float64).unsqueeze(1) / 16.0)
    return _DIGITS[0]


def _sample(seed: int) -> torch.Tensor:
    """``BLANK_SAMPLE`` digits drawn without replacement (the grader's own generator)."""
    x = _digits()
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:BLANK_SAMPLE]]


def _blank(g: Grader, blank_patch_share, images: torch.Tensor, P: int, what: str):
    where = f"blank_patch_share({what} {tuple(images.shape)}, {P})"
    return where, call_student(g, where, blank_patch_share, images, P)


def _expect_exact(g: Grader, where: str, v, images: torch.Tensor, P: int) -> None:
    expected = ref.blank_patch_share(images, P)
    g.expect(
        type(v) is float,
        f"{where} should return a Python float, got {describe(v)}: float(...) of the share",
    )
    g.expect(
        math.isclose(v, expected, rel_tol=1e-9, abs_tol=1e-12),
        f"{where} gave {v!r}, the stated procedure gives {expected!r}: count the patches (of C_in P^2 values, "
        "across all channels) whose values are all exactly 0, and divide by B N_p",
    )


def grade_blank_patch_share(blank_patch_share) -> None:
    """Grade the experiment ``blank_patch_share(images, patch_size)``: a Python float, within the stated band
    of the share over all digits on random samples, exactly the stated procedure, and its errors."""
    g = Grader("blank_patch_share")
    with g.check("returns a Python float"):
        where, v = _blank(g, blank_patch_share, _sample(1), 2, "digits")
        g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")
    with g.check(
        f"on {BLANK_SAMPLE} random digits, within {BLANK_BAND} of the share over all 1,797 digits, for P = 1, 2, 4"
    ):
        for P, seed in ((1, 11), (2, 12), (4, 13)):
            full = ref.blank_patch_share(_digits(), P)
            where, v = _blank(g, blank_patch_share, _sample(seed), P, "digits")
            expect_in_band(
                g,
                where,
                v,
                full - BLANK_BAND,
                full + BLANK_BAND,
                "a patch is blank when all its values are exactly 0; return the share of blank patches (not of "
                "non-blank ones, not of pixels)",
            )
    with g.check("counts whole patches across every channel, and values of either sign (constructed images)"):
        x = torch.zeros(2, 3, 4, 4, dtype=torch.float64)
        x[0, 2, 0, 1] = 0.5  # patch (0, 0) of image 0 is non-blank in its last channel only
        x[1, 0, 3, 3] = -1.0  # a negative value: patch (1, 1) of image 1 is not blank
        x[1, 1, 0, 2] = 1e-6  # a tiny value is not zero
        x[1, 2, 0, 0], x[1, 2, 1, 1] = (
            0.25,
            -0.25,
        )  # values that sum to 0: patch (0, 0) of image 1 is not blank
        for P, what in ((2, "2 images, 3 channels"), (1, "single pixels"), (4, "one patch per image")):
            where, v = _blank(g, blank_patch_share, x, P, what)
            _expect_exact(g, where, v, x, P)
    with g.check("the share over a batch is over all B N_p patches, for non-square images and any dtype"):
        for images, P in (
            (_sample(21)[:7].float(), 2),
            (torch.cat([_sample(22)[:5, :, :4], _sample(23)[:5, :, 4:]], 0), 2),  # 4x8 images
            (_sample(24)[:1], 4),
        ):
            where, v = _blank(g, blank_patch_share, images, P, str(images.dtype).removeprefix("torch."))
            _expect_exact(g, where, v, images, P)
    with g.check("does not modify the images"):
        x = _sample(31)[:4]
        try:
            after = probe(blank_patch_share, x.clone(), 2).args[0]
        except Exception as e:  # noqa: BLE001
            raise_unless_student_error(e)
            g.fail(f"blank_patch_share(digits (4, 1, 8, 8), 2): {_raised(e)}")
        g.expect(is_tensor(after) and torch.equal(after, x), "blank_patch_share changed the images in place")
    with g.check("raises ValueError for images that are not 4-D, P that does not divide them, or no image"):
        for make, what in (
            (lambda: torch.zeros(8, 8), "an 8x8 image without batch and channel axes"),
            (lambda: torch.zeros(2, 1, 8, 8), "P=3 for 8x8 images"),
            (lambda: torch.zeros(0, 1, 8, 8), "an empty batch (B = 0)"),
        ):
            P = 3 if "P=3" in what else 2
            expect_value_error(
                g,
                lambda make=make, P=P: blank_patch_share(make(), P),
                what,
                "say what was expected and what came",
            )
    g.finish()


def check_blank_patch_share(blank_patch_share) -> None:
    """Public checks of ``blank_patch_share``: the docstring's example and one sample of digits."""
    g = Grader("blank_patch_share (public)")
    with g.check("the image [[0, 0], [0, 1]]: 0.75 of its pixels are blank, and its one 2x2 patch is not"):
        x = torch.tensor([[[[0.0, 0.0], [0.0, 1.0]]]], dtype=torch.float64)
        for P in (1, 2):
            where, v = _blank(g, blank_patch_share, x, P, "[[0, 0], [0, 1]]")
            _expect_exact(g, where, v, x, P)
    with g.check(
        f"on {BLANK_SAMPLE} random digits with P = 2, within {BLANK_BAND} of the share over all digits"
    ):
        full = ref.blank_patch_share(_digits(), 2)
        where, v = _blank(g, blank_patch_share, _sample(0), 2, "digits")
        expect_in_band(
            g, where, v, full - BLANK_BAND, full + BLANK_BAND, "return the share of all-zero patches"
        )
    with g.check(
        "values that sum to 0, or are tiny, make a patch non-blank; an empty batch raises ValueError"
    ):
        x = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
        x[0, 0, 0, 0], x[0, 0, 1, 1], x[0, 0, 3, 3] = 0.25, -0.25, 1e-6
        where, v = _blank(g, blank_patch_share, x, 2, "a 4x4 image with 0.25, -0.25 and 1e-6")
        _expect_exact(g, where, v, x, 2)
        expect_value_error(
            g,
            lambda: blank_patch_share(torch.zeros(0, 1, 8, 8), 2),
            "an empty batch (B = 0)",
            "say what was expected and what came",
        )
    g.finish()


# --------------------------------------------------------------------------- stretch


def _sincos(
    grid_h: int,
    grid_w: int,
    dim: int,
    cls_token: bool = False,
    *,
    rows_first: bool = False,
    cos_first: bool = False,
    interleaved: bool = False,
    denominator: float | None = None,
    column_major: bool = False,
    cls_last: bool = False,
) -> torch.Tensor:
    """MAE's table written out from its definition (float64), or one of the catalogued mistakes."""
    quarter = dim // 4
    i = torch.arange(quarter, dtype=F64)
    omega = 10000.0 ** (-2 * i / (dim / 2 if denominator is None else denominator))  # (dim/4,)
    r, c = torch.meshgrid(torch.arange(grid_h, dtype=F64), torch.arange(grid_w, dtype=F64), indexing="ij")
    if column_major:
        r, c = r.T, c.T  # patches numbered column by column

    def one(p):
        a = p.reshape(-1, 1) * omega  # (N, dim/4)
        if interleaved:
            return torch.stack([a.sin(), a.cos()], dim=-1).reshape(len(a), -1)
        return torch.cat([a.cos(), a.sin()] if cos_first else [a.sin(), a.cos()], dim=1)

    table = torch.cat([one(r), one(c)] if rows_first else [one(c), one(r)], dim=1)  # (N, dim)
    if cls_token:
        zero = torch.zeros(1, dim, dtype=F64)
        table = torch.cat([table, zero] if cls_last else [zero, table], dim=0)
    return table


_SINCOS_MISTAKES = (
    (
        dict(rows_first=True),
        "the halves are swapped: the first dim/2 channels encode the column (w), the last dim/2 the row (h), "
        "as MAE's meshgrid(grid_w, grid_h) does",
    ),
    (dict(cos_first=True), "each half holds the dim/4 sines first, then the dim/4 cosines"),
    (
        dict(interleaved=True),
        "each half is split, not interleaved: dim/4 sines, then the dim/4 cosines of the same angles",
    ),
    (
        dict(column_major=True),
        "patches are numbered row by row: token r * grid_w + c is row r, column c",
    ),
)


def _sincos_hint(p, grid_h: int, grid_w: int, dim: int, cls_token: bool) -> str:
    """The hint for a wrong table: a recognised mistake, else the first wrong entry."""
    if not is_tensor(p) or p.shape != (grid_h * grid_w + cls_token, dim):
        return ""
    got = p.detach().double()
    for kwargs, hint in _SINCOS_MISTAKES:
        if torch.allclose(got, _sincos(grid_h, grid_w, dim, cls_token, **kwargs), atol=1e-5):
            return hint
    for den, what in ((dim, "dim"), (dim / 4, "dim/4")):
        if dim > 4 and torch.allclose(
            got, _sincos(grid_h, grid_w, dim, cls_token, denominator=den), atol=1e-5
        ):
            return (
                f"the frequencies look like 1/10000^(2i/{what}); each 1-D encoding has dim/2 channels, so "
                "w_i = 1/10000^(2i/(dim/2)) for i = 0 .. dim/4 - 1"
            )
    if cls_token and torch.allclose(got, _sincos(grid_h, grid_w, dim, True, cls_last=True), atol=1e-5):
        return "the zero row for [CLS] comes first, before the patches"
    expected = _sincos(grid_h, grid_w, dim, cls_token)
    n, k = divmod(int((got - expected).abs().argmax()), dim)
    return f"row {n}, channel {k} is {got[n, k].item():.6g}, expected {expected[n, k].item():.6g}"


def _positions(g: Grader, sincos_2d_positions, grid_h: int, grid_w: int, dim: int, cls_token: bool = False):
    where = f"sincos_2d_positions({grid_h}, {grid_w}, {dim}, cls_token={cls_token})"
    return where, call_student(g, where, sincos_2d_positions, grid_h, grid_w, dim, cls_token)


def _positions_match(
    g: Grader, sincos_2d_positions, grid_h: int, grid_w: int, dim: int, cls_token: bool
) -> None:
    where, p = _positions(g, sincos_2d_positions, grid_h, grid_w, dim, cls_token)
    shape = (grid_h * grid_w + cls_token, dim)
    g.expect(
        is_tensor(p) and p.shape == shape and p.dtype == torch.float32,
        f"{where} should be a float32 tensor {shape}, got {describe(p)}",
    )
    g.expect(
        close(p, _sincos(grid_h, grid_w, dim, cls_token).float()),
        f"{where}: {_sincos_hint(p, grid_h, grid_w, dim, cls_token)}",
    )


def grade_sincos_2d_positions(sincos_2d_positions) -> None:
    """Grade the stretch part ``sincos_2d_positions(grid_h, grid_w, dim, cls_token=False)``."""
    g = Grader("sincos_2d_positions")
    with g.check("MAE's table on square and non-square grids: column half first, sines before cosines"):
        for_all(
            "sincos_2d_positions.values",
            st.tuples(
                st.integers(1, 6), st.integers(1, 6), st.sampled_from((4, 8, 12, 16, 32)), st.booleans()
            ),
            lambda case: _positions_match(g, sincos_2d_positions, *case),
            max_examples=12,
            first=(3, 5, 16, False),
        )
    with g.check("frequencies 1/10000^(2i/(dim/2)): a wide table (dim = 64) on a 14 x 14 grid, as in MAE"):
        _positions_match(g, sincos_2d_positions, 14, 14, 64, False)
    with g.check("the angles are computed in float64: a long row of 4096 patches, dim = 64"):
        # float32 frequencies are off by about 3e-8 relative, so the angle of column 4095 is off by about
        # 1e-4: 3e-5 in the table, beyond float32's tolerance (1e-5), while a float64 computation is off
        # only by the final rounding to float32 (6e-8)
        where, p = _positions(g, sincos_2d_positions, 1, 4096, 64)
        g.expect(
            close(p, _sincos(1, 4096, 64).float()),
            f"{where}: {_sincos_hint(p, 1, 4096, 64, False)}; compute the frequencies and angles in float64 "
            "and convert to float32 only at the end",
        )
    with g.check("cls_token is False by default"):
        where = "sincos_2d_positions(2, 3, 8)"
        p = call_student(g, where, sincos_2d_positions, 2, 3, 8)
        g.expect(
            close(p, _sincos(2, 3, 8).float()),
            f"{where} (cls_token left out) should be the (6, 8) table without the [CLS] row, got {describe(p)}",
        )
    with g.check("cls_token=True puts a row of zeros in front of the same table"):
        for grid_h, grid_w, dim in ((2, 3, 8), (4, 4, 16), (1, 1, 4)):
            _positions_match(g, sincos_2d_positions, grid_h, grid_w, dim, True)
    with g.check("patches are numbered row by row on a non-square grid (2 x 5 and 5 x 2)"):
        for grid_h, grid_w in ((2, 5), (5, 2)):
            _positions_match(g, sincos_2d_positions, grid_h, grid_w, 8, False)
    with g.check("raises ValueError when dim is not a positive multiple of 4 or a grid size is below 1"):
        for args, what in (
            ((2, 2, 6), "dim=6"),
            ((2, 2, 2), "dim=2"),
            ((2, 2, 0), "dim=0"),
            ((2, 2, 10), "dim=10"),
            ((0, 3, 8), "grid_h=0"),
            ((3, 0, 8), "grid_w=0"),
            ((-1, 2, 8), "grid_h=-1"),
        ):
            expect_value_error(g, lambda args=args: sincos_2d_positions(*args), what, "say what was expected")
    g.finish()


def check_sincos_2d_positions(sincos_2d_positions) -> None:
    """Public checks of ``sincos_2d_positions``: the docstring's example, one grid, [CLS] and one error."""
    g = Grader("sincos_2d_positions (public)")
    with g.check("sincos_2d_positions(1, 2, 4) is [[0, 1, 0, 1], [sin 1, cos 1, 0, 1]]"):
        _positions_match(g, sincos_2d_positions, 1, 2, 4, False)
    with g.check("a 2 x 3 grid with dim = 16 matches MAE's get_2d_sincos_pos_embed"):
        _positions_match(g, sincos_2d_positions, 2, 3, 16, False)
    with g.check("cls_token=True puts a row of zeros first; dim = 6 raises ValueError"):
        _positions_match(g, sincos_2d_positions, 2, 2, 8, True)
        expect_value_error(g, lambda: sincos_2d_positions(2, 2, 6), "dim=6", "say what was expected")
    g.finish()

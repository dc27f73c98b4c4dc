"""Checks for Exercise 9 (the vision transformer: patches, patch embedding, [CLS] and positions, the classifier).

Each graded part is a :class:`~coursekit.grading.spec.Spec`: one :class:`~coursekit.grading.spec.Clause`
per promise of its text, stated once. ``check_*`` (public) runs each clause's small fixed examples;
``grade_*`` (hidden) runs the same clauses on inputs drawn across what the text allows (batches of 1 and
more, 1 to 4 channels, square and non-square images, patch sizes from 1 to the whole image, both float
dtypes, models with one or more layers and heads), then on fixed edges. Errors, no change in place, the
promised shape and dtype and the experiment's exact procedure are the generic kinds of
:mod:`coursekit.grading.spec`; the bespoke tests compare patches with ``F.unfold``, the patch embedding
with a strided ``Conv2d``, the tokens with their definition, and the model with :mod:`coursekit.vit`
holding the same random weights (so the instructed submodule names matter). Dropout is checked in
isolation and deterministically (``p = 1``: zeros; ``p = 0.5``: dropped or doubled; eval mode: nothing
dropped). Common mistakes are recomputed and get their own hint; a part that fails because an earlier
part is wrong says so. A model cannot cross into the sandbox, so parts 2 and 4 take the student's
*class* (and the notebook's ``ViTConfig``) and build it there. ``embed`` must make its positions on the
images' device: that check sets the student's default device to ``meta`` (a private helper).

Over 500 lines: one clause per promise of the exercise text for each graded part, with the inputs that
provoke it and the mistakes its hints name, and three predictions; splitting it would scatter one
exercise's specification over several files.
"""

from __future__ import annotations

import dataclasses
import functools
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
    first_match,
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
from coursekit.grading.spec import Call, Clause, Spec, procedure, raises, returns, unchanged

#: the graded parts, by the names of their entry points ``check_<part>`` and ``grade_<part>``
_PARTS = ("patchify", "patch_embedding", "add_cls_and_positions", "vit", "predict_digit_tokens")
_PARTS += ("predict_attention_pairs", "predict_scrambled_pixels", "blank_patch_share", "sincos_2d_positions")
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]
__all__ += ["DIGIT_TOKENS", "ATTENTION_PAIRS", "SCRAMBLED_PIXELS"]

IMG, P, C_IN, C, K = 8, 2, 3, 12, 5  # RGB 8x8 images in 2x2 patches: N_p = 16 tokens of C_in P^2 = 12 values
N_P = (IMG // P) ** 2
#: the part 4 model: small, but every piece present (two layers, two heads, a non-default width)
VIT_KWARGS = dict(
    image_size=IMG, patch_size=P, in_channels=C_IN, n_classes=K, n_layers=2, n_heads=2, d_model=C
)
F64, F32 = torch.float64, torch.float32
SEEDS = st.integers(0, 2**20)
DTYPES = st.sampled_from((F64, F64, F32))  # float64 twice as often as float32


def _raised(e: BaseException) -> str:
    """What the student's code raised, for a hint: ``RuntimeError: message``."""
    text = str(e)
    for prefix in (f"your code raised {getattr(e, 'type_name', '')}: ", "your code raised "):
        text = text.removeprefix(prefix)
    return f"{type(e).__name__.removeprefix('Student')}: {text[:200]}"


def _works(check) -> bool:
    """Whether ``check()`` holds; an error of the student's code in it means no."""
    try:
        return bool(check())
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        return False


def _agree(g: Grader, out, right: torch.Tensor, mistakes: list, fallback: str, where: str = "") -> None:
    """Pass when ``out`` is close to ``right``; else fail with the hint of the first mistake (in right's dtype)
    it equals, after ``where: `` if given, or ``fallback``."""
    if not close(out, right):
        cast = [
            (w.to(right.dtype) if is_tensor(w) else w, f"{where}: " * bool(where) + h) for w, h in mistakes
        ]
        first_match(g, out, cast, right)
        g.fail(fallback)


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
            f"{what}'s parameter {key} has shape {mine}, expected {tuple(w.shape)} (see the shapes in the "
            "instructions)",
        )
    module.load_state_dict(weights)


# =========================================================================== part 1: patchify


def _unfold(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """The right answer, from torch's own sliding-window extraction: (B, C_in P^2, N_p) -> (B, N_p, C_in P^2)."""
    return F.unfold(x, kernel_size=patch_size, stride=patch_size).transpose(1, 2)


_CHANNEL_LAST = (
    "each patch is flattened channel-last, as (P, P, C_in): flatten it channel-first, as (C_in, P, P), the "
    "layout of F.unfold and of a Conv2d weight: permute the blocks to (B, rows, cols, C_in, P, P) before the "
    "last reshape"
)
_COLUMN_MAJOR = (
    "the patches are numbered column by column (rows and columns of the grid swapped): number them row by "
    "row, patch n at grid row n // (W_img / P) and column n % (W_img / P)"
)


def _patch_mistakes(x: torch.Tensor, patch_size: int):
    B, C_in, H_img, W_img = x.shape
    rows, cols = H_img // patch_size, W_img // patch_size
    blocks = x.reshape(B, C_in, rows, patch_size, cols, patch_size)  # (B, C_in, rows, P, cols, P)
    flat = lambda *axes: blocks.permute(0, *axes).reshape(B, rows * cols, -1)  # noqa: E731
    out = [
        (flat(2, 4, 3, 5, 1), _CHANNEL_LAST),  # (B, rows, cols, P, P, C_in)
        (flat(4, 2, 1, 3, 5), _COLUMN_MAJOR),  # (B, cols, rows, C_in, P, P)
        (flat(4, 2, 3, 5, 1), _COLUMN_MAJOR + "; " + _CHANNEL_LAST),
        (
            flat(2, 4, 1, 5, 3),  # pixels transposed inside a patch
            "inside each patch the pixel rows and columns are swapped: flatten a patch as (C_in, P, P), pixel "
            "row before pixel column",
        ),
        (
            x.reshape(B, rows * cols, -1),
            "the image was reshaped to (B, N_p, C_in P^2) without cutting it into patches (a plain reshape "
            "groups consecutive values of whole image rows): reshape to (B, C_in, H_img / P, P, W_img / P, P), "
            "permute to (B, rows, cols, C_in, P, P), then reshape",
        ),
    ]
    if H_img == W_img:
        hint = "the image's height and width are swapped (you cut the transposed image): images are "
        hint += "(B, C_in, H_img, W_img), so the height is images.shape[2] and the width images.shape[3]"
        out.append((_unfold(x.transpose(2, 3), patch_size), hint))
    return out


def _patchify_call(g: Grader, patchify, x, patch_size):
    where = f"for images {tuple(x.shape)} ({dtype_name(x.dtype)}) and patch_size={patch_size}"
    out = call_student(g, where, patchify, x, patch_size)
    B, C_in, H_img, W_img = x.shape
    shape = (B, (H_img // patch_size) * (W_img // patch_size), C_in * patch_size**2)
    g.expect(
        is_tensor(out) and tuple(out.shape) == shape and out.dtype == x.dtype,
        f"{where} expected a {dtype_name(x.dtype)} tensor of shape (B, N_p, C_in P^2) = {shape}, got "
        f"{describe(out)}",
    )
    return out


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


@dataclass(frozen=True)
class _Fixed:
    """Fixed images: normal values of ``shape`` seeded from ``name``, in patches of ``P``; ``what`` names
    them in a hint."""

    name: str
    shape: tuple
    P: int
    what: str = ""
    dtype: torch.dtype = F64

    def images(self) -> torch.Tensor:
        return rand(self.name, *self.shape, dtype=self.dtype)


_IMAGES = st.builds(_Images, SEEDS, st.integers(1, 3), *[st.integers(1, 4)] * 4, DTYPES)


def _patchify_values(g: Grader, patchify, case: _Images | _Fixed) -> None:
    x, p = case.images(), case.P
    out = _patchify_call(g, patchify, x, p)
    where = f"for images {tuple(x.shape)} and patch_size={p}"
    fallback = f"{where} the patches differ from F.unfold(images, P, stride=P).transpose(1, 2): "
    fallback += "patches row by row, each flattened channel-first as (C_in, P, P)"
    if x.shape[2] != x.shape[3]:
        fallback += " (with H_img != W_img the grid has H_img / P rows and W_img / P columns: take them from "
        fallback += "images.shape[2] and images.shape[3])"
    _agree(g, out, _unfold(x.double(), p).to(x.dtype), _patch_mistakes(x.double(), p), fallback, where)


def _patchify_worked(g: Grader, patchify, case: None) -> None:
    """The text's worked example: a 4x4 image holding 0 .. 15 in 2x2 patches."""
    x = torch.arange(16.0).view(1, 1, 4, 4)
    out = _patchify_call(g, patchify, x, 2)
    expected = torch.tensor([[[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]], dtype=F32)
    hint = f"the 4x4 image 0 .. 15 in 2x2 patches should give {expected[0].tolist()}, got {out[0].tolist()}"
    _agree(g, out, expected, _patch_mistakes(x, 2), hint)


def _patchify(case: _Fixed) -> Call:
    x = case.images()
    return Call(case.what or f"patchify(images {case.shape} {dtype_name(x.dtype)}, {case.P})", (x, case.P))


def _patches_of(case: _Fixed) -> torch.Tensor:
    B, C_in, H_img, W_img = case.shape
    return torch.empty(B, (H_img // case.P) * (W_img // case.P), C_in * case.P**2, dtype=case.dtype)


_PATCHIFY_BAD = [  # name, shape, P, what
    ("patchify.bad", (1, C_IN, 8, 8), 3, "8x8 images with P=3"),
    ("patchify.bad.w", (1, C_IN, 8, 6), 4, "8x6 images with P=4 (the height fits, the width does not)"),
    ("patchify.bad.h", (2, 1, 6, 8), 4, "6x8 images with P=4 (the width fits, the height does not)"),
    ("patchify.bad.big", (1, 1, 4, 4), 8, "4x4 images with P=8"),
]
_RANK_TEXT = "raises ValueError when images is not 4-D or patch_size is below 1"
_RANK_BAD = [
    ("patchify.rank", s, 2, f"images of shape {s} and P=2") for s in ((3, 8, 8), (1, 1, 3, 8, 8), (8, 8))
]
_RANK_BAD += [("patchify.p", (1, 2, 4, 4), p, f"4x4 images with P={p}") for p in (0, -2)]


def _not_4d_or_p_below_1(g: Grader, patchify, case: _Fixed) -> None:
    """:func:`~coursekit.grading.spec.raises` with the fix of each input (spec's takes one for all)."""
    below_1 = case.name == "patchify.p"
    fix = "patch_size must be a positive integer" if below_1 else "images must be (B, C_in, H_img, W_img)"
    raises(_patchify, text=_RANK_TEXT, fix=fix, examples=[case]).test(g, patchify, case)


_PATCHIFY_SHAPES = [("patchify.shape", (2, C_IN, IMG, IMG), P), ("patchify.shape.rect", (1, 2, 6, 4), 2)]

PATCHIFY = Spec(
    "patchify",
    [
        returns(
            _patchify,
            _patches_of,
            text="returns (B, N_p, C_in P^2) in the images' dtype (float64 and float32)",
            examples=[_Fixed(*case, dtype=dtype) for dtype in (F64, F32) for case in _PATCHIFY_SHAPES],
        ),
        Clause(
            "the worked example: a 4x4 image holding 0 .. 15 in 2x2 patches",
            _patchify_worked,
            examples=[None],
        ),
        Clause(
            "patches row by row, each flattened channel-first as (C_in, P, P): equal to F.unfold for any batch, "
            "channels, patch size and grid (square or not, P = 1, one patch per image)",
            _patchify_values,
            _IMAGES,
            key="patchify.values",
            budget="wide",
            examples=[_Images(1, 2, 3, 2, 2, 2)],
            also=[
                _Fixed(f"patchify.values.{s[-1]}", s[:4], s[-1])
                for s in ((2, 3, 8, 8, 2), (3, 3, 8, 8, 4), (2, 2, 6, 6, 3))
            ],
        ),
        Clause(
            "non-square images (6x9 in 3x3 patches, 8x4 in 2x2 patches, 2x6 in 2x2 patches)",
            _patchify_values,
            examples=[
                _Fixed(f"patchify.rect.{p}", s, p)
                for s, p in (((2, 3, 6, 9), 3), ((1, 2, 8, 4), 2), ((2, 1, 2, 6), 2))
            ],
        ),
        Clause(
            "edge cases: P = 1 (a patch per pixel) and P = the image size (one patch)",
            _patchify_values,
            examples=[_Fixed("patchify.edge", (2, C_IN, 4, 4), p) for p in (1, 4)],
        ),
        raises(
            _patchify,
            text="raises ValueError when P does not divide the image's height or width",
            fix="say what was expected and what came",
            examples=[_Fixed(*case) for case in _PATCHIFY_BAD],
        ),
        Clause(_RANK_TEXT, _not_4d_or_p_below_1, examples=[_Fixed(*case) for case in _RANK_BAD]),
        unchanged(
            _patchify,
            examples=[_Fixed("patchify.inplace", (2, C_IN, IMG, IMG), P)],
            text="does not change the images",
            advice="work on views or copies, never in place",
        ),
    ],
)
check_patchify, grade_patchify = PATCHIFY.graders()


# =========================================================================== part 2: PatchEmbedding


def _embed_reference(weights, x, patch_size: int) -> torch.Tensor:
    """The strided ``Conv2d`` equal to a patch embedding with ``weights`` (the independent reference) on
    ``x``: (B, C, rows, cols) -> (B, N_p, C)."""
    w = weights["proj.weight"].double()
    d_model, patch_dim = w.shape
    conv = torch.nn.Conv2d(patch_dim // patch_size**2, d_model, patch_size, stride=patch_size).double()
    with torch.no_grad():
        conv.weight.copy_(w.view(d_model, -1, patch_size, patch_size))  # (C, C_in P^2) -> (C, C_in, P, P)
        conv.bias.copy_(weights["proj.bias"].double())
        return conv(x.double()).flatten(2).transpose(1, 2)


def _patchify_broken(g: Grader, x: torch.Tensor, user: str) -> None:
    """Fail with "fix part 1 first" when the notebook's ``patchify`` is wrong."""
    ok = _works(lambda: close(student_side("patchify", ref.patchify)(x, P), _unfold(x, P)))
    g.expect(ok, f"your patchify (part 1) gives wrong patches, and {user} uses it: fix part 1 first")


def _build_embedding(g: Grader, PatchEmbedding, name: str, args=(IMG, P, C_IN, C), dtype=F64):
    """The student's ``PatchEmbedding(*args)`` with random weights of ``dtype`` loaded into it (and those weights)."""
    m = PatchEmbedding(*args)
    m.to(dtype)
    weights = {key: w.to(dtype) for key, w in random_weights(ref.PatchEmbedding(*args), name).items()}
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
    def args(self) -> tuple[int, int, int, int]:
        return self.grid * self.P, self.P, self.C_in, self.d_model

    def __str__(self) -> str:
        images = (self.B, self.C_in, self.args[0], self.args[0])
        return f"for PatchEmbedding{self.args} in {dtype_name(self.dtype)} on images {images}"


_EMBEDDINGS = st.builds(_Embedding, SEEDS, *[st.integers(1, n) for n in (3, 3, 4, 3, 7)], DTYPES)


def _embedding_matches(g: Grader, PatchEmbedding, case: _Embedding) -> None:
    m, w = _build_embedding(g, PatchEmbedding, f"embedding.{case.seed}", case.args, case.dtype)
    size, dtype = case.args[0], case.dtype
    x = tensor(case.seed, case.B, case.C_in, size, size).to(dtype)
    out = call_student(g, str(case), m, x)
    expected = _embed_reference(w, x, case.P).to(dtype)
    g.expect(
        is_tensor(out) and out.shape == expected.shape and out.dtype == dtype,
        f"{case}: expected a {dtype_name(dtype)} tensor (B, N_p, C) = {tuple(expected.shape)}, got "
        f"{describe(out)}",
    )
    xd = x.double()
    weight, bias, patches = w["proj.weight"].double(), w["proj.bias"].double(), ref.patchify(xd, case.P)
    no_bias = "the bias of proj is missing from the output: return proj(patches)"
    no_proj = "the patches are returned without the linear map: return proj(patchify(images, P))"
    same_width = case.C_in * case.P**2 == case.d_model  # only then can the patches pass for embeddings
    mistakes = [(F.linear(p, weight, bias), hint) for p, hint in _patch_mistakes(xd, case.P)]
    mistakes += [(F.linear(patches, weight), no_bias), (patches if same_width else None, no_proj)]
    fallback = "the output differs from a Conv2d with kernel and stride P whose weight is "
    fallback += "proj.weight.view(C, C_in, P, P): return proj(patchify(images, patch_size)), with the "
    fallback += "constructor's arguments, not fixed numbers"
    _agree(g, out, expected, mistakes, f"{case}: {fallback}", str(case))


def _embedding_layer(g: Grader, PatchEmbedding, args: tuple) -> None:
    layer = getattr(PatchEmbedding(*args), "proj", None)
    g.expect(is_a(layer, "torch.nn.modules.linear.Linear"), "PatchEmbedding needs an nn.Linear called proj")
    _, p, c_in, d_model = args
    got = (layer.in_features, layer.out_features)
    g.expect(
        got == (c_in * p * p, d_model),
        f"for PatchEmbedding{args} proj should map C_in P^2 = {c_in * p * p} values to C = {d_model} features, "
        f"got {got[0]} -> {got[1]}",
    )
    g.expect(
        layer.bias is not None, "proj needs a bias (nn.Linear's default), like the Conv2d of the ViT paper"
    )


def _embedding_conv(g: Grader, PatchEmbedding, case: _Embedding) -> None:
    _patchify_broken(g, rand("embedding.patchify", 2, C_IN, IMG, IMG), "PatchEmbedding")
    _embedding_matches(g, PatchEmbedding, case)


def _given(case: tuple[tuple, str, str]) -> Call:
    """The student's ``PatchEmbedding(8, 2, 3, 12)`` (weights seeded from ``name``) given images of ``shape``."""
    shape, what, name = case
    build = lambda g, PatchEmbedding: _build_embedding(g, PatchEmbedding, name)[0]  # noqa: E731
    return Call(
        f"PatchEmbedding({IMG}, {P}, {C_IN}, {C}) given {what}", (rand(f"{name}.x", *shape),), build=build
    )


_EMBEDDING_BAD = [
    ((2, 1, IMG, IMG), "1-channel images"),
    ((2, 4, IMG, IMG), "4-channel images"),
    ((2, C_IN, 2 * IMG, 2 * IMG), f"{2 * IMG}x{2 * IMG} images"),
    ((2, C_IN, IMG // 2, IMG // 2), f"{IMG // 2}x{IMG // 2} images"),
    ((2, C_IN, IMG, 2 * IMG), f"{IMG}x{2 * IMG} images (the height fits, the width does not)"),
    ((2, C_IN, IMG + 2, IMG), f"{IMG + 2}x{IMG} images (the width fits, the height does not)"),
    ((C_IN, IMG, IMG), f"one image without a batch axis, ({C_IN}, {IMG}, {IMG})"),
]

PATCH_EMBEDDING = Spec(
    "PatchEmbedding",
    [
        Clause(
            "has one nn.Linear proj from C_in P^2 to C features, with a bias",
            _embedding_layer,
            examples=[(IMG, P, C_IN, C), (6, 3, 1, 5), (4, 1, 2, 3)],
        ),
        Clause(
            "equals a Conv2d with kernel size and stride P (weights loaded into proj, RGB 8x8 images)",
            _embedding_conv,
            examples=[_Embedding(3, 3, IMG // P, P, C_IN, C)],
        ),
        Clause(
            "any shape: batches of 1 and more, 1 to 3 channels, P = 1 to the whole image, any width, float32 "
            "and float64",
            _embedding_matches,
            _EMBEDDINGS,
            key="embedding.shapes",
            budget="more",
            examples=[_Embedding(1, 2, 2, 2, 1, 3), _Embedding(22, 1, 2, 3, 1, 4, F32)],
            also=[_Embedding(12, 2, 2, 4, 1, 10), _Embedding(9, 2, 2, 3, 2, 10)],
        ),
        raises(
            _given,
            text="raises ValueError for images of the wrong channels, height, width or rank",
            fix=f"images must be (B, {C_IN}, {IMG}, {IMG})",
            examples=[(shape, what, "embedding.bad") for shape, what in _EMBEDDING_BAD],
        ),
        raises(
            lambda args: Call(f"PatchEmbedding{args}", args),
            text="the constructor raises ValueError when patch_size does not divide image_size",
            fix="patch_size must divide image_size",
            examples=[(8, 3, 3, 12), (6, 4, 1, 4), (4, 8, 1, 4)],
        ),
        unchanged(
            _given,
            examples=[((2, C_IN, IMG, IMG), f"images (2, {C_IN}, {IMG}, {IMG})", "embedding.inplace")],
            text="does not change the images",
            advice="PatchEmbedding must not change the images: compute new tensors",
        ),
    ],
)
check_patch_embedding, grade_patch_embedding = PATCH_EMBEDDING.graders("patch_embedding")


# =========================================================================== part 3: add_cls_and_positions


def _tokens(name: str, B: int, N_p: int, C_: int, dtype=F64):
    """Patches (B, N_p, C), cls_token (1, 1, C) and positions (N_p + 1, C) seeded from ``name``."""
    x, cls = rand(f"{name}.x", B, N_p, C_, dtype=dtype), rand(f"{name}.cls", 1, 1, C_, dtype=dtype)
    return x, cls, rand(f"{name}.pos", N_p + 1, C_, dtype=dtype)


_CLS_LAST = (
    "[CLS] was put at the end: it is token 0, in front of the patches (torch.cat([cls, patches], dim=1))"
)
#: the hints of the common mistakes, in the order :func:`_cls_mistakes` computes them
_CLS_HINTS = (
    _CLS_LAST,
    _CLS_LAST,
    "[CLS] got no position: add positions to the whole sequence after prepending [CLS], so [CLS] gets "
    "positions[0] and patch n gets positions[n + 1]",
    "the patches got positions 0 .. N_p - 1 and [CLS] none: [CLS] is token 0 with positions[0], patch n is "
    "token n + 1 with positions[n + 1]",
    "positions[0] is used twice: patch n is token n + 1 and gets positions[n + 1]",
    "the positions are not added: return torch.cat([cls, patches], dim=1) + positions",
    "[CLS] is missing: the output has N_p + 1 tokens, [CLS] first",
)


def _cls_mistakes(x, cls, pos):
    B, N_p, C_ = x.shape
    c = cls.expand(B, 1, C_)
    cat = lambda *parts: torch.cat(parts, 1)  # along the tokens
    wrong = [cat(x, c) + pos, cat(x + pos[:N_p], c + pos[N_p]), cat(c, x + pos[1:]), cat(c, x + pos[:N_p])]
    wrong += [cat(c + pos[0], x + pos[:N_p]), cat(c, x), x + pos[1:]]
    return list(zip(wrong, _CLS_HINTS))


def _cls_call(g: Grader, fn, x, cls, pos, shown: str | None = None):
    """The student's tokens of ``x, cls, pos``; with ``shown`` (the input, as the hint names it), checked to be
    ``(B, N_p + 1, C)`` in x's dtype."""
    where = f"for patches {tuple(x.shape)}, cls_token {tuple(cls.shape)} and positions {tuple(pos.shape)}"
    try:
        out = fn(x.clone(), cls.clone(), pos.clone())
    except Exception as e:
        raise_unless_student_error(e)
        if x.shape[0] > 1 and ("size" in str(e).lower() or "dimension" in str(e).lower()):
            g.fail(
                f"{where} your code raised {_raised(e)}. cls_token is (1, 1, C), one vector for every image: "
                "expand it to (B, 1, C) before concatenating"
            )
        g.fail(f"{where} your code raised {_raised(e)}")
    if shown is not None:
        (B, N_p, C_), dtype = x.shape, x.dtype
        g.expect(
            is_tensor(out) and tuple(out.shape) == (B, N_p + 1, C_) and out.dtype == dtype,
            f"{shown} expected a {dtype_name(dtype)} tensor of shape (B, N_p + 1, C) = {(B, N_p + 1, C_)}, "
            f"got {describe(out)}",
        )
    return out


@dataclass(frozen=True)
class _Tokens:
    seed: int
    B: int
    N_p: int
    C: int
    dtype: torch.dtype = F64

    def inputs(self):
        # patches, cls_token and positions
        shapes = ((self.B, self.N_p, self.C), (1, 1, self.C), (self.N_p + 1, self.C))
        return tuple(tensor(self.seed + i, *shape).to(self.dtype) for i, shape in enumerate(shapes))


@dataclass(frozen=True)
class _NamedTokens:
    """Patches, cls_token and positions seeded from ``name`` (:func:`_tokens`)."""

    name: str
    B: int
    N_p: int
    C: int

    def inputs(self):
        return _tokens(self.name, self.B, self.N_p, self.C)


class _Written:
    """The worked example: two images of three patches of width 2, their tokens written out by hand."""

    expected = [
        [[100.1, 200.2], [0.3, 1.4], [2.5, 3.6], [4.7, 5.8]],
        [[100.1, 200.2], [6.3, 7.4], [8.5, 9.6], [10.7, 11.8]],
    ]

    def inputs(self):
        pos = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]])
        return torch.arange(12.0).view(2, 3, 2), torch.tensor([[[100.0, 200.0]]]), pos


_TOKENS = st.builds(_Tokens, SEEDS, *[st.integers(1, n) for n in (4, 9, 8)], DTYPES)


def _cls_values(g: Grader, fn, case: _Tokens | _NamedTokens | _Written) -> None:
    x, cls, pos = case.inputs()
    (B, _, C_), dtype = x.shape, x.dtype
    where = f"for patches {tuple(x.shape)} ({dtype_name(dtype)})"
    out = _cls_call(g, fn, x, cls, pos, where)
    x, cls, pos = x.double(), cls.double(), pos.double()
    right = torch.cat([(cls[0, 0] + pos[0]).expand(B, 1, C_), x + pos[1:]], 1)  # the definition written out
    fallback = (
        f"expected {case.expected}, got {out.tolist()}: [CLS] first, then positions[t] added to token t"
        if isinstance(case, _Written)
        else f"{where} the tokens differ from torch.cat([cls_token.expand(B, 1, C), patches], dim=1) + positions"
    )
    _agree(g, out, right.to(dtype), _cls_mistakes(x, cls, pos), fallback, where)


def _cls_kind(g: Grader, fn, dtype: torch.dtype) -> None:
    """The shape and dtype (the clause :func:`~coursekit.grading.spec.returns` states, here with the hint of
    :func:`_cls_call` for a cls_token not expanded over the batch)."""
    _cls_call(g, fn, *_tokens("cls.shape", 2, 4, 6, dtype), f"for {dtype_name(dtype)} patches (2, 4, 6)")


def _cls_batch(g: Grader, fn, name: str) -> None:
    x, cls, pos = _tokens(name, 4, 3, 5)
    out = _cls_call(g, fn, x, cls, pos)
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
        "token 0 is the same in every image but not cls_token + positions[0]: add positions[0] to the [CLS] "
        "token",
    )


def _cls_grads(g: Grader, fn, name: str) -> None:
    x, cls, pos = _tokens(name, 3, 4, 5)
    up = rand(f"{name}.up", 3, 5, 5)
    leaves = [t.clone().requires_grad_() for t in (x, cls, pos)]
    grads = probe(fn, *leaves, backward=(None, up)).grads or [None, None, None]
    wants = (up[:, 1:], up[:, :1].sum(0, keepdim=True), up.sum(0))  # of the patches, cls_token, positions
    hints = (
        "the gradient of the patches should be the upstream gradient at tokens 1 .. N_p: use patches itself (no "
        ".data, .detach() or copy)",
        "the gradient of cls_token should be the sum over the batch of the upstream gradient at token 0: use "
        "cls_token itself (expand, not .data, .detach() or a new tensor)",
        "the gradient of positions should be the upstream gradient summed over the batch: add positions itself to "
        "the sequence (no .data, .detach() or copy)",
    )
    for got, want, hint in zip(grads, wants, hints):
        g.expect(got is not None and close(got, want), hint)


def _cls_inplace(g: Grader, fn, name: str) -> None:
    x, cls, pos = _tokens(name, 3, 4, 5)
    result = probe(fn, x.clone(), cls.clone(), pos.clone())
    for what, before, after in zip(("patches", "cls_token", "positions"), (x, cls, pos), result.args):
        g.expect(
            is_tensor(after) and close(after, before),
            f"{what} was changed in place: build a new tensor (torch.cat, then +, never +=)",
        )


_CLS_BAD = {  # what -> its arguments, made of patches (2, 4, 3), cls_token (1, 1, 3) and positions (5, 3)
    "positions (4, 3) for 4 patches (it needs N_p + 1 = 5 rows)": lambda x, cls, pos: (x, cls, pos[:4]),
    "positions (6, 3) for 4 patches": lambda x, cls, pos: (x, cls, torch.cat([pos, pos[:1]])),
    "positions (5, 2) for patches of width 3": lambda x, cls, pos: (x, cls, pos[:, :2]),
    "cls_token (1, 1, 6) for patches of width 3": lambda x, cls, pos: (x, torch.cat([cls, cls], -1), pos),
    "cls_token (1, 1, 2) for patches of width 3": lambda x, cls, pos: (x, cls[..., :2], pos),
    "patches (4, 3) without a batch axis": lambda x, cls, pos: (x[0], cls, pos),
    "patches (1, 2, 4, 3)": lambda x, cls, pos: (x[None], cls, pos),
}

ADD_CLS_AND_POSITIONS = Spec(
    "add_cls_and_positions",
    [
        Clause(
            "returns a new (B, N_p + 1, C) tensor in the inputs' dtype (float64 and float32)",
            _cls_kind,
            examples=[F64, F32],
        ),
        Clause(
            "[CLS] first with positions[0]; patch n is token n + 1 with positions[n + 1] (any B, N_p, C)",
            _cls_values,
            _TOKENS,
            key="cls.values",
            budget="wide",
            first=_Tokens(1, 2, 3, 2),
            examples=[_Written(), _Tokens(1, 2, 3, 2)],
            also=[
                _NamedTokens(f"cls.values.{s[0]}", *s) for s in ((3, 16, C), (1, 4, 5), (5, 9, 8), (1, 1, 1))
            ],
        ),
        Clause("every image gets the same [CLS] vector", _cls_batch, examples=["cls.batch"]),
        Clause("gradients reach the patches, cls_token and positions", _cls_grads, examples=["cls.grad"]),
        Clause(
            "does not change the patches, cls_token or positions in place",
            _cls_inplace,
            examples=["cls.inplace"],
        ),
        raises(
            lambda what: Call(what, _CLS_BAD[what](*_tokens("cls.bad", 2, 4, 3))),
            text="raises ValueError when the shapes do not fit",
            fix="patches (B, N_p, C), cls_token (1, 1, C), positions (N_p + 1, C)",
            examples=list(_CLS_BAD),
        ),
    ],
)
check_add_cls_and_positions, grade_add_cls_and_positions = ADD_CLS_AND_POSITIONS.graders()


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


#: the hints of the common wrong forwards, in the order :func:`_vit_mistakes` computes them
_VIT_HINTS = (
    "the classifier reads the mean of all tokens: read the [CLS] output only, head(encoder(tokens)[:, 0])",
    "the classifier reads the mean of the patch tokens: read the [CLS] output, head(encoder(tokens)[:, 0])",
    "the classifier reads the last token: [CLS] is token 0, head(encoder(tokens)[:, 0])",
    "the final layer norm is missing: run the whole self.encoder (a pre-norm stack ends with its norm), not only "
    "its layers",
    "forward returns probabilities: return the logits, head(...) without a softmax (F.cross_entropy applies "
    "log-softmax itself)",
    "[CLS] and the positions are missing: embed builds the encoder's input with "
    "add_cls_and_positions(patch_embed(images), cls_token, positions)",
    "the positions are not added: embed adds pos_emb(torch.arange(N_p + 1)) through add_cls_and_positions",
    "the encoder is not applied: logits = head(encoder(embed(images))[:, 0])",
)


def _vit_mistakes(r, x):
    """What common wrong forwards return, computed with the reference model ``r``'s pieces."""
    with torch.no_grad():
        tokens = r.embed(x)  # (B, T, C)
        h = r.encoder(tokens)  # (B, T, C)
        no_norm = tokens
        for layer in r.encoder.layers:
            no_norm = layer(no_norm)
        patches = r.patch_embed(x)  # (B, N_p, C)
        no_pos = r.head(r.encoder(torch.cat([r.cls_token.expand(x.shape[0], 1, -1), patches], 1))[:, 0])
        wrong = [r.head(h.mean(1)), r.head(h[:, 1:].mean(1)), r.head(h[:, -1]), r.head(no_norm[:, 0])]
        probabilities, no_cls = torch.softmax(r.head(h[:, 0]), -1), r.head(r.encoder(patches)[:, 0])
        wrong += [probabilities, no_cls, no_pos, r.head(tokens[:, 0])]
        return list(zip(wrong, _VIT_HINTS))


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
        given = {
            k: getattr(self, k) for k in ("patch_size", "in_channels", "n_classes", "n_layers", "n_heads")
        }
        return dict(image_size=self.grid * self.patch_size, **given, d_model=self.n_heads * self.d_head)

    def images(self) -> torch.Tensor:
        size = self.grid * self.patch_size
        return tensor(self.seed, self.B, self.in_channels, size, size)

    def __str__(self) -> str:
        return f"for ViTConfig({', '.join(f'{k}={v}' for k, v in self.kwargs.items())}) on {self.B} image(s)"


_MODELS = st.builds(_Model, SEEDS, *[st.integers(1, n) for n in (3, 3, 3, 3, 3, 4, 2, 6)])


def _model_compare(g: Grader, m, r, case: _Model, what: str) -> None:
    """The student's model ``m`` against the reference ``r`` (same weights) on ``case``'s images: ``what`` is
    "embed" or "forward"."""
    x, embed = case.images(), what == "embed"
    with torch.no_grad():
        right = r.embed(x) if embed else r(x)
    out = call_student(g, f"{case}: {what}", m.embed if embed else m, x)
    g.expect(
        is_tensor(out) and out.shape == right.shape and out.dtype == F64,
        f"{case}: {what} should return a float64 {'(B, N_p + 1, C)' if embed else 'logits (B, K)'} = "
        f"{tuple(right.shape)}, got {describe(out)}",
    )
    if embed:
        with torch.no_grad():
            no_pos = torch.cat([r.cls_token.expand(x.shape[0], 1, -1), r.patch_embed(x)], 1)
        hint = "embed does not add the positions: pass pos_emb(torch.arange(N_p + 1)) to "
        mistakes = [(no_pos, hint + "add_cls_and_positions")]
        fallback = "embed differs from dropout(add_cls_and_positions(patch_embed(images), cls_token, "
        fallback += "pos_emb(torch.arange(N_p + 1))))"
    else:
        mistakes = _vit_mistakes(r, x)
        fallback = "the logits differ from head(encoder(embed(images))[:, 0]) with the same weights: use the "
        fallback += "configuration, not fixed numbers"
    _agree(g, out, right, mistakes, f"{case}: {fallback}", str(case))


def _vit_reads(g: Grader, classes, case: tuple[str, _Model, str]) -> None:
    """``embed`` or ``forward`` of the instructed model against the reference; ``embed`` first fails with
    "fix part N first" when an earlier part of the notebook is wrong."""
    name, model, what = case
    m, r = _vit_pair(g, *classes, name)  # a model lives in its check's process
    if what == "embed":
        x = rand("vit.parts.x", 2, C_IN, IMG, IMG)
        _patchify_broken(g, x, "the model")
        sd = m.state_dict()
        mine = {k.removeprefix("patch_embed."): v for k, v in sd.items() if k.startswith("patch_embed.")}
        g.expect(
            _works(lambda: close(m.patch_embed(x), _embed_reference(mine, x, P))),
            "model.patch_embed (your PatchEmbedding, part 2) gives wrong embeddings: fix part 2 first",
        )
        x3, cls, pos = _tokens("vit.parts.cls", 2, 4, 5)
        theirs = student_side("add_cls_and_positions", ref.add_cls_and_positions)
        g.expect(
            _works(lambda: close(theirs(x3, cls, pos), ref.add_cls_and_positions(x3, cls, pos))),
            "your add_cls_and_positions (part 3) is wrong, and embed uses it: fix part 3 first",
        )
    _model_compare(g, m, r, model, what)


def _vit_shapes(g: Grader, classes, case: _Model) -> None:
    m, r = _vit_pair(g, *classes, f"vit.shapes.{case.seed}", **case.kwargs)
    _model_compare(g, m, r, case, "embed")
    _model_compare(g, m, r, case, "forward")


def _vit_batch(g: Grader, classes, name: str) -> None:
    m, _ = _vit_pair(g, *classes, name)
    x = rand(f"{name}.x", 3, C_IN, IMG, IMG)
    together, alone = m(x), m(x[1:2])
    g.expect(
        is_tensor(together) and is_tensor(alone) and close(alone, together[1:2]),
        "the logits of an image change with the other images of the batch: never mix the batch axis (0)",
    )


def _vit_eval(g: Grader, classes, name: str) -> None:
    m, _ = _vit_pair(g, *classes, name, dropout=0.5)
    m0, _ = _vit_pair(g, *classes, name, dropout=0.0)  # the same weights
    x = rand(f"{name}.x", 4, C_IN, IMG, IMG)
    for what, out, want in (("embed", m.embed(x), m0.embed(x)), ("forward", m(x), m0(x))):
        g.expect(
            is_tensor(out) and is_tensor(want) and close(out, want),
            f"in eval mode with dropout=0.5 {what} differs from {what} with dropout=0 (the same weights): "
            "dropout must act in training mode only: use self.dropout (an nn.Dropout), or F.dropout(x, p, "
            "training=self.training)",
        )


def _dropped(g: Grader, classes, name: str, B: int, p: float):
    """The given ViT and the reference, B images, then ``embed`` of them in eval mode and in training mode with
    ``self.dropout.p = p`` (torch's generator seeded from ``name``)."""
    m, r = _vit_pair(g, *classes, name)
    x = rand(f"{name}.x", B, C_IN, IMG, IMG)
    plain, shape = m.embed(x), (B, N_P + 1, C)  # eval mode: no dropout
    g.expect(is_tensor(plain) and plain.shape == shape, f"embed should return {shape}, got {describe(plain)}")
    dropout = getattr(m, "dropout", None)
    hint = f"the given ViT has self.dropout (an nn.Dropout), got {describe(dropout)}"
    g.expect(is_a(dropout, "torch.nn.modules.dropout.Dropout"), hint)
    set_attr(dropout, "p", p)
    m.train()
    with seeded(name):
        out = m.embed(x)
    g.expect(is_tensor(out) and out.shape == shape, f"embed should return {shape}, got {describe(out)}")
    return m, r, x, plain, out


def _vit_dropout_one(g: Grader, classes, name: str) -> None:
    """With ``self.dropout.p = 1`` in training mode, ``embed`` returns zeros and ``forward`` runs the encoder
    on them."""
    m, r, x, plain, out = _dropped(g, classes, name, 2, 1.0)
    zeros = torch.zeros(2, N_P + 1, C, dtype=F64)
    with torch.no_grad():
        patches_only = torch.cat([r.cls_token.expand(2, 1, -1), zeros[:, 1:]], 1) + r.pos_emb.weight
    p1 = "with self.dropout.p = 1 in training mode"
    as_given = f"{p1} embed returned the tokens unchanged: apply self.dropout to the output of "
    as_given += "add_cls_and_positions in embed (not in forward, and not only in eval mode)"
    some = f"{p1} only the patch embeddings were zeroed: apply self.dropout to the whole sequence, after "
    some += "add_cls_and_positions"
    fallback = f"{p1} embed should return zeros: return self.dropout(add_cls_and_positions(...))"
    _agree(g, out, zeros, [(plain, as_given), (patches_only, some)], fallback)
    encoded = m.encoder(zeros)  # the given encoder: no dropout of its own here (dropout=0)
    g.expect(is_tensor(encoded), f"self.encoder returned {describe(encoded)}")
    g.expect(
        close(m(x), m.head(encoded[:, 0])),
        "with self.dropout.p = 1 in training mode forward should be head(encoder(zeros)[:, 0]), since embed "
        "returns zeros: forward must run the encoder on self.embed(images), and apply no other dropout",
    )


def _vit_dropout_half(g: Grader, classes, name: str) -> None:
    """With ``self.dropout.p = 0.5`` in training mode each value of ``embed`` is dropped or doubled (torch's
    generator seeded from ``name``)."""
    _, _, _, plain, out = _dropped(g, classes, name, 3, 0.5)
    dropped = out == 0  # nn.Dropout zeroes exactly
    share = float(dropped.double().mean())
    g.expect(
        close(out, torch.where(dropped, torch.zeros_like(plain), 2 * plain)),
        "with self.dropout.p = 0.5 in training mode each value of embed should be 0 or twice the value without "
        "dropout: apply self.dropout once, to the output of add_cls_and_positions",
    )
    g.expect(
        0.3 <= share <= 0.7,
        f"with self.dropout.p = 0.5 {share:.0%} of embed's values were dropped, about half expected: apply "
        "self.dropout once, in embed",
    )


def _vit_device(g: Grader, classes, name: str) -> None:
    """``embed`` with torch's default device set to ``meta`` in the student's process: the positions must be
    made on the images' device (the CPU), so the result is a CPU tensor."""
    m, _ = _vit_pair(g, *classes, name)
    x = rand(f"{name}.x", 2, C_IN, IMG, IMG)
    fix = "make the positions on the images' device: pos_emb(torch.arange(N_p + 1, device=images.device)), "
    fix += "not torch.arange(N_p + 1) (nor .to(device) afterwards)"
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


VIT = Spec(
    "ViT",
    [
        Clause(
            "embed: [CLS] and the patch embeddings with their positions, (B, N_p + 1, C)",
            _vit_reads,
            examples=[("vit.embed", _Model(1, 3, IMG // P, P, C_IN, 2, C // 2, 2, K), "embed")],
        ),
        Clause(
            "forward: the logits (B, K) from the [CLS] output of the encoder",
            _vit_reads,
            examples=[("vit.forward", _Model(2, 4, IMG // P, P, C_IN, 2, C // 2, 2, K), "forward")],
        ),
        Clause(
            "any configuration: 1 to 3 channels, patch sizes, grids of 1 to 9 patches, 1 or 2 layers, 1 to 3 "
            "heads, batches of 1 and more",
            _vit_shapes,
            _MODELS,
            key="vit.shapes",
            budget="small",
            examples=[_Model(3, 1, 2, 2, 1, 1, 2, 1, 2)],
            also=[_Model(4, 2, 2, 4, 1, 4, 4, 3, 3)],
        ),
        Clause("each image is classified on its own", _vit_batch, examples=["vit.batch"]),
        Clause(
            "eval mode: no dropout (with dropout=0.5 in the configuration, embed and forward give what they give "
            "with dropout=0)",
            _vit_eval,
            examples=["vit.dropout"],
        ),
        Clause(
            "training mode: self.dropout is applied to the encoder's input, the output of embed (with its p set "
            "to 1, embed returns zeros and forward runs the encoder on zeros)",
            _vit_dropout_one,
            examples=["vit.dropout.one"],
        ),
        Clause(
            "training mode: self.dropout is applied once, with nn.Dropout's scaling (p = 0.5 drops about half the "
            "values of embed and doubles the others)",
            _vit_dropout_half,
            examples=["vit.dropout.half"],
        ),
        Clause(
            "embed makes its positions on the images' device, not on torch's default device",
            _vit_device,
            examples=["vit.device"],
        ),
    ],
)
check_vit, grade_vit = VIT.graders("vit")


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


_PAIRS_CHOICES = {"a": 1.0, "b": 1.7, "c": 3.0, "d": 9.0}


def _attention_pairs_choice() -> str:
    """The choice nearest (on a log scale) to the (query, key) pairs of ViT-B/16 on 384x384 images over those
    on 224x224 images, [CLS] included; the tokens are counted by cutting an image of each size into patches."""
    p = ref.VIT_PRESETS["vit-b/16"].patch_size
    tokens = [ref.patchify(torch.zeros(1, 3, n, n), p).shape[1] + 1 for n in PAIRS_SIZES]
    ratio = (tokens[1] / tokens[0]) ** 2
    return min(_PAIRS_CHOICES, key=lambda c: abs(math.log(ratio) - math.log(_PAIRS_CHOICES[c])))


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
    measure=_attention_pairs_choice,
    explanation="Answer {truth}. A 384x384 image holds a 24x24 grid of 16x16 patches: 576 patches and [CLS], "
    "577 tokens instead of 14 x 14 + 1 = 197. Every query scores every key, so the pairs grow with the square "
    "of the tokens: 577^2 / 197^2 = 8.6. (b), 384 / 224 = 1.7, is the growth of the image's side, but the "
    "tokens grow with its area; (c), 577 / 197 = 2.9, is the growth of the tokens, which is what the patch "
    "embedding and the feed-forward layers pay, not attention; (a) counts the weights, which stay the same "
    "ones (only the position table is interpolated in 2-D to the larger grid). This is why Touvron et al. "
    "(2019) and the ViT paper train at a low resolution and fine-tune briefly at a higher one.",
    choices={"a": "about the same (1x)", "b": "about 1.7x", "c": "about 3x", "d": "about 9x"},
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
    holds = lambda m: 0.8 * errors[m, "plain"] - 3 <= errors[m, "scrambled"] <= 1.25 * errors[m, "plain"] + 3
    loses = lambda m: errors[m, "scrambled"] >= 2 * errors[m, "plain"] + 3
    at_chance = lambda m: errors[m, "scrambled"] > 0.5 * n_images
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


@functools.cache
def _digits() -> torch.Tensor:
    """All 1,797 scikit-learn digits, ``(1797, 1, 8, 8)`` float64 in ``[0, 1]`` (loaded once)."""
    from sklearn.datasets import load_digits

    return torch.tensor(load_digits().images, dtype=torch.float64).unsqueeze(1) / 16.0


def _sample(seed: int) -> torch.Tensor:
    """``BLANK_SAMPLE`` digits drawn without replacement (the grader's own generator)."""
    x = _digits()
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:BLANK_SAMPLE]]


def _blank(g: Grader, blank_patch_share, images: torch.Tensor, P: int, what: str):
    where = f"blank_patch_share({what} {tuple(images.shape)}, {P})"
    return where, call_student(g, where, blank_patch_share, images, P)


def _expect_float(g: Grader, where: str, v) -> None:
    g.expect(
        type(v) is float, f"{where} should return a Python float, got {describe(v)}: float(...) of the share"
    )


def _band(P: int) -> tuple[float, float]:
    """The band of a sample's share: within BLANK_BAND of the share over all digits."""
    full = ref.blank_patch_share(_digits(), P)
    return full - BLANK_BAND, full + BLANK_BAND


def _blank_float(g: Grader, blank_patch_share, case: tuple[int, int]) -> None:
    seed, P = case
    where, v = _blank(g, blank_patch_share, _sample(seed), P, "digits")
    g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")


_BLANK_FIX = (
    "a patch is blank when all its values are exactly 0; return the share of blank patches (not of non-blank "
    "ones, not of pixels)"
)


def _blank_band(g: Grader, blank_patch_share, case: tuple[int, int]) -> None:
    P, seed = case
    where, v = _blank(g, blank_patch_share, _sample(seed), P, "digits")
    expect_in_band(g, where, v, *_band(P), _BLANK_FIX)


def _in_sample(case: tuple[int, int]) -> Call:
    P, seed = case
    return Call(f"blank_patch_share(digits ({BLANK_SAMPLE}, 1, 8, 8), {P})", (_sample(seed), P))


#: the band's samples, each (P, seed)
_SAMPLES = [(1, 11), (2, 12), (4, 13)]

_EXACT_ON_SAMPLES = procedure(
    _in_sample,
    lambda case: ref.blank_patch_share(_sample(case[1]), case[0]),
    text="on the same random digits, exactly the stated count: one share over all B N_p patches of the batch",
    steps="divide the number of all-zero patches of the whole batch by B N_p, in one go (a mean of the shares "
    "of chunks of the batch is another number when the chunks differ in size)",
    examples=_SAMPLES,
    band=lambda case: _band(case[0]),
)


def _blank_procedure(g: Grader, blank_patch_share, case: tuple[int, int]) -> None:
    """:func:`~coursekit.grading.spec.procedure` on the band's samples, once the result is a float (a tensor
    gets the hint of its type, not of the procedure)."""
    c = _in_sample(case)
    _expect_float(g, c.where, call_student(g, c.where, blank_patch_share, *c.args))
    _EXACT_ON_SAMPLES.test(g, blank_patch_share, case)


def _constructed() -> torch.Tensor:
    x = torch.zeros(2, 3, 4, 4, dtype=torch.float64)
    x[0, 2, 0, 1] = 0.5  # patch (0, 0) of image 0 is non-blank in its last channel only
    x[1, 0, 3, 3] = -1.0  # a negative value: patch (1, 1) of image 1 is not blank
    x[1, 1, 0, 2] = 1e-6  # a tiny value is not zero
    x[1, 2, 0, 0], x[1, 2, 1, 1] = 0.25, -0.25  # values that sum to 0: patch (0, 0) of image 1 is not blank
    return x


#: the images of the clauses that ask for the exact count
_IMAGES_OF = {
    "constructed": _constructed,
    "7 digits": lambda: _sample(21)[:7].float(),
    "10 images of 4x8": lambda: torch.cat([_sample(22)[:5, :, :4], _sample(23)[:5, :, 4:]], 0),
    "one digit": lambda: _sample(24)[:1],
    "[[0, 0], [0, 1]]": lambda: torch.tensor([[[[0.0, 0.0], [0.0, 1.0]]]], dtype=torch.float64),
}


def _blank_exact(g: Grader, blank_patch_share, case: tuple[str, int, str]) -> None:
    """The stated count exactly on images ``case[0]`` of ``_IMAGES_OF`` with P ``case[1]``; ``case[2]``
    names them in the hint."""
    images, P = _IMAGES_OF[case[0]](), case[1]
    where, v = _blank(g, blank_patch_share, images, P, case[2])
    _expect_float(g, where, v)
    expected = ref.blank_patch_share(images, P)
    g.expect(
        math.isclose(v, expected, rel_tol=1e-9, abs_tol=1e-12),
        f"{where} gave {v!r}, the stated procedure gives {expected!r}: count the patches (of C_in P^2 values, "
        "across all channels) whose values are all exactly 0, and divide by B N_p",
    )


def _zeros(case: tuple[tuple, int, str]) -> Call:
    return Call(case[2], (torch.zeros(case[0]), case[1]))


BLANK_PATCH_SHARE = Spec(
    "blank_patch_share",
    [
        Clause("returns a Python float", _blank_float, examples=[(1, 2)]),
        Clause(
            f"on {BLANK_SAMPLE} random digits, within {BLANK_BAND} of the share over all 1,797 digits, for P = 1, 2, 4",
            _blank_band,
            examples=_SAMPLES,
        ),
        Clause(
            _EXACT_ON_SAMPLES.text,
            _blank_procedure,
            st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(100, 2**31 - 1)),
            _SAMPLES,
            key="blank.procedure",
            budget="tiny",
            also=_SAMPLES[1:],
        ),
        Clause(
            "counts whole patches across every channel, and values of either sign (constructed images)",
            _blank_exact,
            examples=[
                ("constructed", P, what)
                for P, what in ((2, "2 images, 3 channels"), (1, "single pixels"), (4, "one patch per image"))
            ],
        ),
        Clause(
            "the share over a batch is over all B N_p patches, for non-square images and any dtype",
            _blank_exact,
            examples=[
                ("7 digits", 2, "float32"),
                ("10 images of 4x8", 2, "float64"),
                ("one digit", 4, "float64"),
            ],
        ),
        unchanged(
            lambda seed: Call("blank_patch_share(digits (4, 1, 8, 8), 2)", (_sample(seed)[:4], 2)),
            examples=[31],
            text="does not modify the images",
            advice="blank_patch_share must not change the images",
        ),
        raises(
            _zeros,
            text="raises ValueError for images that are not 4-D, P that does not divide them, or no image",
            fix="say what was expected and what came",
            examples=[
                ((8, 8), 2, "an 8x8 image without batch and channel axes"),
                ((2, 1, 8, 8), 3, "P=3 for 8x8 images"),
                ((0, 1, 8, 8), 2, "an empty batch (B = 0)"),
            ],
        ),
        raises(
            _zeros,
            text="raises ValueError for P below 1, as patchify does",
            fix="patch_size must be a positive integer",
            examples=[((2, 1, 8, 8), 0, "P=0 for 8x8 images"), ((2, 1, 8, 8), -2, "P=-2 for 8x8 images")],
        ),
    ],
    extra_public=[
        Clause(
            "the image [[0, 0], [0, 1]]: 0.75 of its pixels are blank, and its one 2x2 patch is not",
            _blank_exact,
            examples=[("[[0, 0], [0, 1]]", P, "[[0, 0], [0, 1]]") for P in (1, 2)],
        )
    ],
)
check_blank_patch_share, grade_blank_patch_share = BLANK_PATCH_SHARE.graders()


# --------------------------------------------------------------------------- stretch


def _sincos(grid_h: int, grid_w: int, dim: int, cls_token: bool = False, **mistake) -> torch.Tensor:
    """MAE's table written out from its definition (float64), or with one of the catalogued mistakes
    (``mistake``: rows_first, cos_first, interleaved, column_major or cls_last True, or a denominator)."""
    i = torch.arange(dim // 4, dtype=F64)
    omega = 10000.0 ** (-2 * i / mistake.get("denominator", dim / 2))  # (dim/4,)
    r, c = torch.meshgrid(torch.arange(grid_h, dtype=F64), torch.arange(grid_w, dtype=F64), indexing="ij")
    if mistake.get("column_major"):
        r, c = r.T, c.T  # patches numbered column by column

    def one(p):
        a = p.reshape(-1, 1) * omega  # (N, dim/4)
        if mistake.get("interleaved"):
            return torch.stack([a.sin(), a.cos()], dim=-1).reshape(len(a), -1)
        return torch.cat([a.cos(), a.sin()] if mistake.get("cos_first") else [a.sin(), a.cos()], dim=1)

    table = torch.cat([one(r), one(c)] if mistake.get("rows_first") else [one(c), one(r)], dim=1)  # (N, dim)
    if cls_token:
        zero = torch.zeros(1, dim, dtype=F64)
        table = torch.cat([table, zero] if mistake.get("cls_last") else [zero, table], dim=0)
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
    wrong = "the frequencies look like 1/10000^(2i/{}); each 1-D encoding has dim/2 channels, so "
    wrong += "w_i = 1/10000^(2i/(dim/2)) for i = 0 .. dim/4 - 1"
    mistakes = [
        *_SINCOS_MISTAKES,
        *((dict(denominator=d), wrong.format(w)) for d, w in ((dim, "dim"), (dim / 4, "dim/4")) if dim > 4),
    ]
    if cls_token:
        mistakes.append((dict(cls_last=True), "the zero row for [CLS] comes first, before the patches"))
    for kwargs, hint in mistakes:
        if torch.allclose(got, _sincos(grid_h, grid_w, dim, cls_token, **kwargs), atol=1e-5):
            return hint
    expected = _sincos(grid_h, grid_w, dim, cls_token)
    n, k = divmod(int((got - expected).abs().argmax()), dim)
    return f"row {n}, channel {k} is {got[n, k].item():.6g}, expected {expected[n, k].item():.6g}"


def _positions(g: Grader, sincos_2d_positions, grid_h: int, grid_w: int, dim: int, cls_token: bool = False):
    where = f"sincos_2d_positions({grid_h}, {grid_w}, {dim}, cls_token={cls_token})"
    return where, call_student(g, where, sincos_2d_positions, grid_h, grid_w, dim, cls_token)


def _sincos_values(g: Grader, sincos_2d_positions, case: tuple[int, int, int, bool]) -> None:
    where, p = _positions(g, sincos_2d_positions, *case)
    shape = (case[0] * case[1] + case[3], case[2])
    g.expect(
        is_tensor(p) and p.shape == shape and p.dtype == torch.float32,
        f"{where} should be a float32 tensor {shape}, got {describe(p)}",
    )
    g.expect(close(p, _sincos(*case).float()), f"{where}: {_sincos_hint(p, *case)}")


def _sincos_float64(g: Grader, sincos_2d_positions, case: tuple[int, int, int]) -> None:
    # float32 frequencies are off by about 3e-8 relative, so the angle of column 4095 is off by about 1e-4:
    # 3e-5 in the table, beyond float32's tolerance (1e-5), while a float64 computation is off only by the
    # final rounding to float32 (6e-8)
    where, p = _positions(g, sincos_2d_positions, *case)
    g.expect(
        close(p, _sincos(*case).float()),
        f"{where}: {_sincos_hint(p, *case, False)}; compute the frequencies and angles in float64 and convert to "
        "float32 only at the end",
    )


def _sincos_default(g: Grader, sincos_2d_positions, case: tuple[int, int, int]) -> None:
    where = f"sincos_2d_positions{case}"
    p = call_student(g, where, sincos_2d_positions, *case)
    g.expect(
        close(p, _sincos(*case).float()),
        f"{where} (cls_token left out) should be the ({case[0] * case[1]}, {case[2]}) table without the [CLS] "
        f"row, got {describe(p)}",
    )


SINCOS_2D_POSITIONS = Spec(
    "sincos_2d_positions",
    [
        Clause(
            "MAE's table on square and non-square grids: column half first, sines before cosines",
            _sincos_values,
            st.tuples(
                st.integers(1, 6), st.integers(1, 6), st.sampled_from((4, 8, 12, 16, 32)), st.booleans()
            ),
            key="sincos_2d_positions.values",
            budget="more",
            examples=[(3, 5, 16, False), (1, 2, 4, False)],  # then the docstring's example
        ),
        Clause(
            "frequencies 1/10000^(2i/(dim/2)): a wide table (dim = 64) on a 14 x 14 grid, as in MAE",
            _sincos_values,
            examples=[(14, 14, 64, False)],
        ),
        Clause(
            "the angles are computed in float64: a long row of 4096 patches, dim = 64",
            _sincos_float64,
            examples=[(1, 4096, 64)],
        ),
        Clause("cls_token is False by default", _sincos_default, examples=[(2, 3, 8)]),
        Clause(
            "cls_token=True puts a row of zeros in front of the same table",
            _sincos_values,
            examples=[(2, 3, 8, True), (4, 4, 16, True), (1, 1, 4, True)],
        ),
        Clause(
            "patches are numbered row by row on a non-square grid (2 x 5 and 5 x 2)",
            _sincos_values,
            examples=[(2, 5, 8, False), (5, 2, 8, False)],
        ),
        raises(
            lambda case: Call(case[1], case[0]),
            text="raises ValueError when dim is not a positive multiple of 4 or a grid size is below 1",
            fix="say what was expected",
            examples=[((2, 2, d), f"dim={d}") for d in (6, 2, 0, 10)]
            + [((0, 3, 8), "grid_h=0"), ((3, 0, 8), "grid_w=0"), ((-1, 2, 8), "grid_h=-1")],
        ),
    ],
)
check_sincos_2d_positions, grade_sincos_2d_positions = SINCOS_2D_POSITIONS.graders()

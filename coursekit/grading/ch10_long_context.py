"""Checks for Exercise 10 (long contexts).

Each part has two entry points, both called from the notebook with the student's function.
``check_*`` holds the *public* checks: one small fixed example per clause of the part's text.
``grade_*`` holds the *hidden* checks: one named check per clause, on inputs drawn across what
the text allows (derandomized Hypothesis examples: sizes 0 or 1, odd, T != S, several or no
leading dimensions that broadcast, masks of every broadcastable shape, every optional argument at
non-default values, both float dtypes and half precision where allowed) against independent
facts: plain attention from Chapter 1 with the whole ``(T, S)`` score matrix, masks written from
their definition, an explicit token-by-token recurrence, the closed-form cache size. The common
mistakes are recognised first and get their own hint: an online softmax that does not rescale its
accumulator, divides too early or lets ``exp`` overflow; a window off by one, not causal or
aligned to the wrong corner; linear attention that is not causal, has no normaliser or a feature
map that is not positive; a cache size without the factor 2, with query heads or without the
dtype's size.

**Devices.** A tensor made inside the student's function must be made on the inputs' device.
Under the autograder only CPU tensors cross to the student's process, so the checks set torch's
default device of that process to ``meta`` (``torch.set_default_device``) and call the function
on CPU inputs: a tensor made without ``device=`` lands on ``meta`` and the call fails. A function
with a ``device`` argument is called with ``device="meta"``; its meta result cannot be sent back
(torch refuses to copy data that a meta tensor does not have), and that refusal, raised outside
the student's code, is how the grader learns where the result lives.

**What the checks cannot see.** Only data crosses to the student's process, so the graders see
values, not memory. A tiled attention that secretly builds the whole score matrix gives the right
values; the chapter measures the difference. The causal linear attention, though, is run at
``T = 200,000``, where a ``(T, T)`` matrix does not fit.

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import textwrap
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from coursekit import attention as att
from coursekit import gpt
from coursekit import long_context as ref
from coursekit.grading.core import (
    Grader,
    close,
    default_device,
    describe,
    dtype_name,
    expect_value_error,
    for_all,
    generator,
    is_tensor,
    magnitude,
    meta_copy_refused,
    probe,
    raise_unless_student_error,
    rand,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band

__all__ = [
    "check_tiled_attention",
    "check_sliding_window_mask",
    "check_causal_linear_attention",
    "check_kv_cache_size",
    "grade_tiled_attention",
    "grade_sliding_window_mask",
    "grade_causal_linear_attention",
    "grade_kv_cache_size",
    "check_predict_window_pairs",
    "grade_predict_window_pairs",
    "check_predict_kv_cache_gib",
    "grade_predict_kv_cache_gib",
    "check_predict_saved_per_row",
    "grade_predict_saved_per_row",
    "check_window_mass",
    "grade_window_mass",
    "check_sink_window_mask",
    "grade_sink_window_mask",
]

F64 = torch.float64


def _raised(e: BaseException) -> str:
    """What the student's code raised, for a hint: ``RuntimeError (message)``."""
    text = str(e)
    for prefix in (f"your code raised {getattr(e, 'type_name', '')}: ", "your code raised "):
        text = text.removeprefix(prefix)
    return f"{type(e).__name__.removeprefix('Student')} ({text[:200]})"


# =========================================================================== devices (private helpers)


def _device_call(g: Grader, call, what: str, fix: str):
    """``call()`` with torch's default device set to ``meta`` in the student's process (inputs on the
    CPU): fail with ``fix`` when a tensor was made on the default device instead of the inputs' one."""
    try:
        with default_device():
            out = call()
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        if not meta_copy_refused(e):
            raise_unless_student_error(e)
        g.fail(
            f"{what}, with torch's default device set to another device than the inputs' (meta), your code "
            f"raised {type(e).__name__.removeprefix('Student')} ({str(e)[:150]}): {fix}"
        )
    if is_tensor(out) and out.device.type != "cpu":
        g.fail(
            f"{what}, with torch's default device set to meta, your result is on {out.device.type}, not on the "
            f"inputs' device (cpu): {fix}"
        )
    return out


def _result_device(call) -> str | None:
    """The device type of the tensor ``call()`` returns (``None`` for anything else).

    Under the autograder a result on the ``meta`` device cannot be sent back: torch refuses to copy
    its data, outside the student's code (the refusal names no line of theirs), and that is read
    as ``"meta"``. A refusal inside their code (``.item()`` or ``.cpu()`` on a meta tensor) is raised.
    """
    try:
        out = call()
    except NotImplementedError as e:
        outside = getattr(e, "type_name", None) == "NotImplementedError" and not getattr(e, "where", "?")
        if meta_copy_refused(e) and outside:
            return "meta"
        raise
    return out.device.type if is_tensor(out) else None


# =========================================================================== part 1: tiled attention


@functools.cache
def _tiled_with(*edits: tuple[str, str]):
    """The reference :func:`~coursekit.long_context.tiled_attention` with each ``(old, new)``
    source edit applied once: the mistakes the hints describe, computed exactly."""
    source = textwrap.dedent(inspect.getsource(ref.tiled_attention))
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(f"edit does not match the reference exactly once: {old!r}")
        source = source.replace(old, new)
    namespace = dict(vars(ref))
    exec(compile(source, "<tiled_attention variant>", "exec"), namespace)
    return namespace["tiled_attention"]


_RESCALE_ACC = ("acc = alpha * acc + p @ v", "acc = acc + p @ v")
_RESCALE_L = ("l = alpha * l + p.sum", "l = l + p.sum")
_TILE_SOFTMAX = (
    "p = torch.exp(s - shift)",
    "p = torch.exp(s - shift); p = p / p.sum(dim=-1, keepdim=True).clamp_min(1e-300)",
)

_NO_RESCALE_ACC = (
    "the accumulator is not rescaled: when a tile raises a query's running maximum from m to m_new, "
    "multiply the running sum l AND the accumulator acc by exp(m - m_new) before adding the tile's "
    "exp(s - m_new) and exp(s - m_new) @ v"
)
_NO_RESCALE = (
    "neither the running sum nor the accumulator is rescaled: when a tile raises the running maximum from "
    "m to m_new, multiply l and acc by exp(m - m_new) before adding the new tile"
)
_DIVIDE_EARLY = (
    "each tile is normalised by its own sum (a softmax per tile): divide by the running sum only once, "
    "after the last tile, out = acc / l"
)
_MAX_OVERFLOW = (
    "exp overflowed to inf (the output has inf or NaN) on large scores: subtract the running maximum "
    "before exp. Set m_new = max(m, max of the tile's scores) at every tile, subtract m_new before exp, "
    "and "
    "rescale the old l and acc by exp(m - m_new)"
)
_TOP_LEFT = (
    "the causal mask is aligned to the top left: with S > T keys the queries are the LAST T positions, so "
    "query i sits at position i + S - T and sees keys j <= i + S - T"
)
_NO_SCALE = "the scores are not scaled: multiply q k^T by scale, which defaults to 1 / sqrt(D)"
_SCALE_IGNORED = (
    "the scale argument is ignored: with scale given, multiply the scores by it instead of 1 / sqrt(D)"
)
_NO_CAUSAL = "causal=True is ignored: query i may only see keys j <= i + S - T"
_CAUSAL_TILE_OFFSET = (
    "the causal mask is right in one tile but not across tiles: compare absolute positions, query "
    "i0 + r (at position i0 + r + S - T) with key j0 + c, adding each tile's offsets i0 and j0"
)
_MASK_TILE_OFFSET = (
    "the mask is right in one tile but not across tiles: each tile takes its own block of the mask, "
    "mask[..., i0:i0 + block_q, j0:j0 + block_k]"
)
_NO_MASK = (
    "the mask is ignored: a key must be allowed by the mask (True = may attend) as well as by causality"
)
#: the mistakes that one tile can tell from a wrong tile offset: with one tile the offsets are 0
_ONE_TILE = {_NO_CAUSAL: _CAUSAL_TILE_OFFSET, _TOP_LEFT: _CAUSAL_TILE_OFFSET, _NO_MASK: _MASK_TILE_OFFSET}
_MASK_INVERTED = (
    "the mask is inverted: True means the query MAY attend to the key (mask out where it is False)"
)
_NAN_TILES = (
    "the output has NaN or inf although the scores are small: a row of a tile can be fully masked (a causal "
    "tile "
    "partly in the future, or the mask) while the query sees keys in other tiles. exp(-inf - (-inf)) is NaN "
    "and "
    "a tile's sum can be 0: subtract 0 where the running maximum is still -inf, and divide by l only once, "
    "after the last tile"
)
_MASKED_NAN = (
    "a query that may attend to no key must get a zero output, not NaN: keep l = 0 for it and divide by "
    "torch.where(l > 0, l, 1); also exp(-inf - (-inf)) is NaN, so where the running maximum is still -inf "
    "subtract 0 instead"
)


def _naive(q, k, v, causal=False, mask=None, scale=None):
    """Attention with the whole ``(T, S)`` score matrix (Chapter 1's), in float64."""
    q, k, v = q.double(), k.double(), v.double()
    if causal:
        c = att.causal_mask(q.shape[-2], k.shape[-2])
        mask = c if mask is None else mask & c
    return att.scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)[0]


def _attention_magnitude(q, k, v, scale=None) -> float:
    """What a sound attention's rounding scales with: the largest score times the largest value."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.double() @ k.double().transpose(-2, -1)) * scale
    return magnitude(scores) * magnitude(v)


@dataclass(frozen=True)
class _Tiled:
    """One call of ``tiled_attention``: the shapes and arguments, and a seed for the values."""

    seed: int
    lead: tuple  # the leading dimensions of q, k and v (they broadcast)
    T: int
    S: int
    D: int
    Dv: int
    causal: bool = False
    mask: tuple | None = None  # the mask's shape, or None
    block_q: int | None = None  # None: the default
    block_k: int | None = None
    scale: float | None = None
    size: float = 1.0  # the values' scale
    dtype: torch.dtype = F64

    def inputs(self):
        q = tensor(self.seed, *self.lead[0], self.T, self.D, scale=self.size).to(self.dtype)
        k = tensor(self.seed + 1, *self.lead[1], self.S, self.D, scale=self.size).to(self.dtype)
        v = tensor(self.seed + 2, *self.lead[2], self.S, self.Dv).to(self.dtype)
        mask = None
        if self.mask is not None:
            mask = torch.rand(self.mask, generator=torch.Generator().manual_seed(self.seed + 3)) < 0.65
        return q, k, v, mask

    def kwargs(self, mask) -> dict:
        kw = {"causal": True} if self.causal else {}
        if mask is not None:
            kw["mask"] = mask
        for name in ("block_q", "block_k", "scale"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return kw

    def __str__(self) -> str:
        q, k, v = (
            (*lead, n, d)
            for lead, n, d in zip(self.lead, (self.T, self.S, self.S), (self.D, self.D, self.Dv))
        )
        args = [f"q {q}, k {k}, v {v} ({dtype_name(self.dtype)})"]
        args += [
            f"{key}={val!r}"
            for key, val in (
                ("causal", self.causal or None),
                ("block_q", self.block_q),
                ("block_k", self.block_k),
                ("scale", self.scale),
            )
            if val is not None
        ]
        if self.mask is not None:
            args.append(f"a boolean mask {self.mask}")
        return "for " + ", ".join(args)


#: leading dimensions of (q, k, v): equal, broadcast (1 against n, missing against present), or none
_LEADS = [
    ((), (), ()),
    ((2,), (2,), (2,)),
    ((2, 3), (2, 3), (2, 3)),
    ((2, 3), (1, 3), (3,)),
    ((3,), (), ()),
    ((), (2,), ()),
    ((), (), (2,)),
    ((1,), (2,), (2,)),
]


def _mask_shapes(T: int, S: int, batch: tuple) -> list[tuple]:
    """Boolean mask shapes broadcastable to ``(*batch, T, S)``: keys only, queries only, whole, batched."""
    shapes = [(S,), (1, S), (T, 1), (T, S), (*batch, T, S)]
    if batch:
        shapes.append((*batch[:-1], 1, T, S))
    return shapes


@st.composite
def _tiled_cases(draw, causal=False, masked=False, scales=(None,), sizes=(0.5, 1.0, 2.0), dtypes=(F64,)):
    lead = draw(st.sampled_from(_LEADS))
    T = draw(st.integers(1, 9))
    S = T + draw(st.integers(0, 5)) if causal else draw(st.integers(1, 11))
    batch = tuple(torch.broadcast_shapes(*lead))
    mask = draw(st.sampled_from(_mask_shapes(T, S, batch))) if masked else None
    blocks = st.sampled_from([None, 1, 2, 3, 4, 5, 7, 64])
    return _Tiled(
        draw(st.integers(0, 2**20)),
        lead,
        T,
        S,
        draw(st.integers(1, 6)),
        draw(st.integers(1, 4)),
        causal,
        mask,
        draw(blocks),
        draw(blocks),
        draw(st.sampled_from(scales)),
        draw(st.sampled_from(sizes)),
        draw(st.sampled_from(dtypes)),
    )


def _tiled_mistakes(case: _Tiled, q, k, v, mask):
    """What common wrong tiled attentions return on this case (float64), with their hints."""
    kw = dict(
        causal=case.causal,
        mask=mask,
        block_q=case.block_q or 64,
        block_k=case.block_k or 64,
        scale=case.scale,
    )
    q, k, v = q.double(), k.double(), v.double()
    T, S = case.T, case.S
    top_left = torch.ones(T, S, dtype=torch.bool).tril()
    out = [
        (_tiled_with(_RESCALE_ACC)(q, k, v, **kw), _NO_RESCALE_ACC),
        (_tiled_with(_RESCALE_ACC, _RESCALE_L)(q, k, v, **kw), _NO_RESCALE),
        (_tiled_with(_TILE_SOFTMAX)(q, k, v, **kw), _DIVIDE_EARLY),
        (
            _naive(q, k, v, mask=top_left if mask is None else mask & top_left, scale=case.scale)
            if case.causal
            else None,
            _TOP_LEFT,
        ),
        (
            _naive(q, k, v, case.causal, mask, scale=1.0),
            _SCALE_IGNORED if case.scale is not None else _NO_SCALE,
        ),
        (_naive(q, k, v, case.causal, mask) if case.scale is not None else None, _SCALE_IGNORED),
        (_naive(q, k, v, False, mask, case.scale) if case.causal else None, _NO_CAUSAL),
        (_naive(q, k, v, case.causal, None, case.scale) if mask is not None else None, _NO_MASK),
        (_naive(q, k, v, case.causal, ~mask, case.scale) if mask is not None else None, _MASK_INVERTED),
    ]
    return out


def _tiled_output(g: Grader, tiled_attention, case: _Tiled, q, k, v, mask):
    """Call the student's function on ``case`` and check the result's type, shape and dtype."""
    try:
        out = tiled_attention(
            q.clone(), k.clone(), v.clone(), **case.kwargs(None if mask is None else mask.clone())
        )
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(f"{case}: your code raised {_raised(e)}")
    shape = (*torch.broadcast_shapes(*case.lead), case.T, case.Dv)
    g.expect(
        is_tensor(out) and tuple(out.shape) == shape and out.dtype == case.dtype,
        f"{case}: expected a {dtype_name(case.dtype)} tensor of shape (..., T, Dv) = {shape}, got {describe(out)}",
    )
    return out


def _has_empty_rows(case: _Tiled, mask) -> bool:
    """Some query of ``case`` may attend to no key."""
    if mask is None:
        return False
    allowed = mask.expand(case.T, case.S) if mask.dim() <= 2 else mask
    if case.causal:
        allowed = allowed & att.causal_mask(case.T, case.S)
    return not bool(allowed.any(-1).all())


def _tiled_compare(g: Grader, case: _Tiled, out, q, k, v, mask, large: bool = False, one_tile=None) -> None:
    """``out`` must equal attention with the whole score matrix on ``case``; else name the mistake.

    ``one_tile``: the student's output on the same inputs with one tile (block_q = T, block_k = S), or
    None. A result that looks like a causal mistake (the mask ignored or aligned top-left) but is right
    with one tile is a tile offset: the hint names that instead."""
    expected = _naive(q, k, v, case.causal, mask, case.scale)
    M = _attention_magnitude(q, k, v, case.scale)
    if close(out, expected.to(case.dtype), magnitude=M):
        return
    if not bool(out.isfinite().all()):
        if large:
            g.fail(f"{case} (scores up to {M / magnitude(v):.0f}): {_MAX_OVERFLOW}")
        g.fail(f"{case}: {_MASKED_NAN if _has_empty_rows(case, mask) else _NAN_TILES}")
    for wrong, hint in _tiled_mistakes(case, q, k, v, mask):
        if wrong is None or close(wrong.to(case.dtype), expected.to(case.dtype), magnitude=M):
            continue  # this mistake is harmless on this input
        if close(out, wrong.to(case.dtype), magnitude=M):
            tiles = (case.block_q or 64) < case.T or (case.block_k or 64) < case.S
            if hint in _ONE_TILE and one_tile is not None and tiles:
                if close(one_tile(), expected.to(case.dtype), magnitude=M):
                    g.fail(f"{case}: {_ONE_TILE[hint]}")
            g.fail(f"{case}: {hint}")
    worst = (out.double() - expected).abs().max().item()
    g.fail(
        f"{case}: the result differs from attention with the whole score matrix, "
        f"scaled_dot_product_attention(q, k, v, mask)[0] (largest difference {worst:.3g})"
    )


def _tiled_matches(g: Grader, tiled_attention, case: _Tiled, large: bool = False) -> None:
    q, k, v, mask = case.inputs()
    out = _tiled_output(g, tiled_attention, case, q, k, v, mask)
    _tiled_compare(g, case, out, q, k, v, mask, large, _one_tile(tiled_attention, case, q, k, v, mask))


def _one_tile(tiled_attention, case: _Tiled, q, k, v, mask):
    """The student's call on ``case``'s inputs with one tile (block_q = T, block_k = S), to be made only
    when a hint needs it: to tell a wrong tile offset from a causal or mask mistake. None if it raises."""

    def call():
        whole = dataclasses.replace(case, block_q=max(case.T, 1), block_k=max(case.S, 1))
        try:
            return tiled_attention(
                q.clone(), k.clone(), v.clone(), **whole.kwargs(None if mask is None else mask.clone())
            )
        except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
            raise_unless_student_error(e)
            return None

    return call


#: the simplest call: one head, four queries and keys, the default tiles
_FIRST = _Tiled(seed=1, lead=((), (), ()), T=4, S=4, D=3, Dv=2)


def grade_tiled_attention(tiled_attention) -> None:
    """Grade a student's ``tiled_attention(q, k, v, causal=False, mask=None, block_q=64, block_k=64, scale=None)``."""
    g = Grader("tiled_attention")
    test = functools.partial(_tiled_matches, g, tiled_attention)

    with g.check("returns (..., T, Dv) in q's dtype: float64, float32, float16 and bfloat16"):
        for i, dtype in enumerate((F64, torch.float32, torch.float16, torch.bfloat16)):
            test(
                _Tiled(
                    70 + i,
                    ((2,), (2,), (2,)),
                    5,
                    7,
                    4,
                    3,
                    causal=i % 2 == 1,
                    block_q=2,
                    block_k=3,
                    dtype=dtype,
                )
            )

    with g.check(
        "equals attention with the whole score matrix, for any tiles (the default, 1, tiles that do not "
        "divide T or S) and leading dimensions (none, several, broadcast between q, k and v)"
    ):
        for_all(
            "tiled.values",
            _tiled_cases(dtypes=(F64, F64, torch.float32)),
            test,
            max_examples=14,
            first=_FIRST,
        )

    with g.check("causal=True: query i sees keys j <= i + S - T (bottom-right), with S == T and S > T"):
        for_all(
            "tiled.causal",
            _tiled_cases(causal=True),
            test,
            max_examples=12,
            first=_Tiled(2, ((), (), ()), 2, 5, 3, 2, causal=True, block_q=1, block_k=2),
        )

    with g.check(
        "mask: boolean, True = may attend, of any shape that broadcasts to (..., T, S), and with causal=True "
        "a key must be allowed by both"
    ):
        for_all(
            "tiled.mask",
            _tiled_cases(masked=True),
            test,
            max_examples=10,
            first=_Tiled(3, ((2,), (2,), (2,)), 3, 5, 2, 2, mask=(3, 5), block_q=2, block_k=2),
        )
        for_all(
            "tiled.mask.causal",
            _tiled_cases(causal=True, masked=True),
            test,
            max_examples=8,
            first=_Tiled(4, ((2,), (2,), (2,)), 3, 5, 2, 2, causal=True, mask=(5,), block_q=2, block_k=2),
        )
        for i, lead in enumerate((((2,), (), ()), ((), (2,), ()), ((), (), (2,)), ((3, 2), (2,), (1, 2)))):
            batch = tuple(
                torch.broadcast_shapes(*lead)
            )  # a batched mask, where one of q, k, v holds the batch
            test(
                _Tiled(40 + i, lead, 3, 5, 2, 2, causal=i % 2 == 0, mask=(*batch, 3, 5), block_q=2, block_k=2)
            )

    with g.check("a query that may attend to no key gets a zero output, not NaN"):
        q, k, v = (
            rand("tiled.empty.q", 2, 6, 3),
            rand("tiled.empty.k", 2, 8, 3),
            rand("tiled.empty.v", 2, 8, 2),
        )
        mask = torch.rand(6, 8, generator=generator("tiled.empty")) < 0.6
        mask[[1, 4]] = False  # these queries see nothing
        mask[2, :4] = False  # this one sees keys only in the later tiles
        for causal, bq, bk in ((False, 2, 4), (True, 3, 2), (False, 64, 64)):
            case = _Tiled(
                0, ((2,), (2,), (2,)), 6, 8, 3, 2, causal=causal, mask=(6, 8), block_q=bq, block_k=bk
            )
            out = _tiled_output(g, tiled_attention, case, q, k, v, mask)
            g.expect(
                bool(out.isfinite().all()),
                f"{case} where queries 1 and 4 may attend to no key: {_MASKED_NAN}",
            )
            g.expect(
                close(out[:, [1, 4]], torch.zeros(2, 2, 2, dtype=F64)),
                f"{case}: queries 1 and 4 may attend to no key, so their outputs must be 0, got "
                f"{out[:, [1, 4]].tolist()}",
            )
            _tiled_compare(
                g, case, out, q, k, v, mask, one_tile=_one_tile(tiled_attention, case, q, k, v, mask)
            )

    with g.check("scale multiplies the scores: any value (0, negative, large); the default is 1 / sqrt(D)"):
        for_all(
            "tiled.scale",
            _tiled_cases(scales=(None, 0.0, 0.3, 1.0, 2.5, -0.7)),
            test,
            max_examples=12,
            first=_Tiled(5, ((), (), ()), 3, 4, 4, 2, scale=0.0),
        )

    with g.check(
        "stable for large scores: the running maximum follows the scores (float64 and float32, rows of very "
        "different sizes)"
    ):
        q = torch.full((1, 5, 4), 10.0, dtype=F64)
        k = (
            torch.linspace(0, 60, 40, dtype=F64)[None, :, None].expand(1, 40, 4).contiguous()
        )  # scores grow to 2400
        v = rand("tiled.overflow.v", 1, 40, 3)
        case = _Tiled(0, ((1,), (1,), (1,)), 5, 40, 4, 3, block_q=2, block_k=8, scale=1.0)
        _tiled_compare(
            g, case, _tiled_output(g, tiled_attention, case, q, k, v, None), q, k, v, None, large=True
        )
        for_all(
            "tiled.large",
            _tiled_cases(causal=True, sizes=(12.0, 25.0), dtypes=(F64, torch.float32)),
            functools.partial(_tiled_matches, g, tiled_attention, large=True),
            max_examples=6,
            first=_Tiled(
                6, ((), (), ()), 4, 6, 4, 2, causal=True, block_q=2, block_k=2, size=25.0, dtype=torch.float32
            ),
        )
        q = (
            rand("tiled.rows.q", 2, 6, 4)
            * torch.tensor([60.0, 1.0, -40.0, 0.01, 30.0, 1.0], dtype=F64)[:, None]
        )
        k, v = rand("tiled.rows.k", 2, 9, 4, scale=3.0), rand("tiled.rows.v", 2, 9, 3)
        case = _Tiled(0, ((2,), (2,), (2,)), 6, 9, 4, 3, block_q=3, block_k=4)
        _tiled_compare(
            g, case, _tiled_output(g, tiled_attention, case, q, k, v, None), q, k, v, None, large=True
        )

    with g.check("gradients reach q, k and v and equal plain attention's"):
        q, k, v = rand("tiled.grad.q", 2, 7, 4), rand("tiled.grad.k", 1, 9, 4), rand("tiled.grad.v", 9, 3)
        mask = torch.rand(9, generator=generator("tiled.grad.mask")) < 0.7
        up = rand("tiled.grad.up", 2, 7, 3)
        p = probe(
            tiled_attention,
            q.clone().requires_grad_(),
            k.clone().requires_grad_(),
            v.clone().requires_grad_(),
            causal=True,
            mask=mask,
            block_q=3,
            block_k=2,
            backward=(None, up),
        )
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            "the output does not depend on q, k, v through autograd: avoid .detach(), .item(), .data or "
            "torch.tensor(...) on them",
        )
        refs = [t.clone().requires_grad_() for t in (q, k, v)]
        (_naive(*refs, causal=True, mask=mask) * up).sum().backward()
        for name, got, want in zip("qkv", p.grads or [None] * 3, refs):
            g.expect(
                is_tensor(got) and close(got, want.grad),
                f"for q (2, 7, 4), k (1, 9, 4), v (9, 3), causal=True and a mask (9,): the gradient with respect "
                f"to {name} differs from plain attention's",
            )

    with g.check("does not change q, k, v or the mask in place"):
        q, k, v = (
            rand("tiled.inplace.q", 2, 5, 3),
            rand("tiled.inplace.k", 2, 6, 3),
            rand("tiled.inplace.v", 2, 6, 2),
        )
        mask = torch.rand(5, 6, generator=generator("tiled.inplace")) < 0.6
        p = probe(
            tiled_attention,
            q.clone(),
            k.clone(),
            v.clone(),
            mask=mask.clone(),
            block_q=2,
            block_k=4,
            scale=0.7,
        )
        for name, before, after in zip(
            ("q", "k", "v", "mask"),
            (q, k, v, mask),
            (*p.args, p.kwargs.get("mask") if isinstance(p.kwargs, dict) else None),
        ):
            g.expect(
                is_tensor(after) and torch.equal(after, before),
                f"tiled_attention changed its argument {name} in place: work on new tensors (q * scale, not q *= "
                "scale or q.mul_(scale))",
            )

    with g.check("makes its tensors on q's device, not on torch's default device"):
        case = _Tiled(7, ((2,), (2,), (2,)), 5, 7, 3, 2, causal=True, mask=(5, 7), block_q=2, block_k=3)
        q, k, v, mask = case.inputs()
        args = (q.clone(), k.clone(), v.clone())
        kwargs = case.kwargs(mask.clone())
        out = _device_call(
            g,
            lambda: tiled_attention(*args, **kwargs),
            str(case),
            "make every tensor on q's device: torch.full(..., device=q.device), torch.zeros(..., "
            "device=q.device), torch.arange(..., device=q.device), or new_full / zeros_like",
        )
        g.expect(is_tensor(out), f"{case}: expected a tensor, got {describe(out)}")
        _tiled_compare(g, case, out, q, k, v, mask, one_tile=_one_tile(tiled_attention, case, q, k, v, mask))

    with g.check("raises ValueError for block sizes below 1, causal with S < T, and shapes that do not fit"):
        x, y = rand("tiled.bad.x", 1, 4, 2), rand("tiled.bad.y", 1, 3, 2)
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_q=0), "block_q=0")
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_k=0), "block_k=0")
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_q=-2, block_k=3), "block_q=-2")
        expect_value_error(
            g, lambda: tiled_attention(x, x, x, block_q=2, block_k=-1), "block_q=2 and block_k=-1"
        )
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_q=64, block_k=-3), "block_k=-3")
        expect_value_error(
            g, lambda: tiled_attention(x, y, y, causal=True), "causal=True with T=4 queries and S=3 keys"
        )
        expect_value_error(
            g,
            lambda: tiled_attention(x, x, y),
            "k (1, 4, 2) and v (1, 3, 2) of different lengths",
            "call check_attention_inputs(q, k, v, mask) first",
        )
        expect_value_error(
            g,
            lambda: tiled_attention(x, rand("tiled.bad.w", 1, 4, 3), x),
            "q (1, 4, 2) and k (1, 4, 3) of different widths",
            "call check_attention_inputs(q, k, v, mask) first",
        )
        expect_value_error(
            g,
            lambda: tiled_attention(x, x, x, mask=torch.ones(5, 4, dtype=torch.bool)),
            "a mask (5, 4) for 4 queries and 4 keys",
            "call check_attention_inputs(q, k, v, mask) first",
        )

    with g.check("raises TypeError for a mask that is not boolean, or q, k, v of different dtypes"):
        x = rand("tiled.type", 1, 4, 2)
        for bad, what in (
            (torch.zeros(4, 4, dtype=F64), "a float64 mask"),
            (torch.ones(4, 4, dtype=torch.long), "a long mask"),
        ):
            try:
                out = tiled_attention(x, x, x, mask=bad)
            except TypeError:
                continue
            except Exception as e:  # noqa: BLE001
                raise_unless_student_error(e)
                g.fail(
                    f"with {what} your code raised {type(e).__name__.removeprefix('Student')} ({str(e)[:100]}); "
                    f"raise a "
                    "TypeError instead: the mask must be boolean (True = may attend)"
                )
            g.fail(
                f"with {what} your code returned {describe(out)}; raise a TypeError: the mask must be boolean"
            )
        try:
            out = tiled_attention(x, x.float(), x)
        except TypeError:
            pass
        except Exception as e:  # noqa: BLE001
            raise_unless_student_error(e)
            g.fail(
                f"with q, v float64 and k float32 your code raised {type(e).__name__.removeprefix('Student')}; "
                f"raise "
                "a TypeError instead (call check_attention_inputs(q, k, v, mask) first)"
            )
        else:
            g.fail(
                f"with q, v float64 and k float32 your code returned {describe(out)}; raise a TypeError (call "
                "check_attention_inputs(q, k, v, mask) first)"
            )

    g.finish()


def check_tiled_attention(tiled_attention) -> None:
    """Public checks of ``tiled_attention``: every clause the hidden checks grade, on one small example each."""
    g = Grader("tiled_attention (public)")
    test = functools.partial(_tiled_matches, g, tiled_attention)
    with g.check("6 queries, 6 keys, tiles of 2 and 4: equals attention with the whole score matrix"):
        test(_Tiled(11, ((1,), (1,), (1,)), 6, 6, 4, 2, block_q=2, block_k=4, size=2.0))
    with g.check("the default tiles, and q (2, 3, 4) with k, v (3, 6, 4) that broadcast"):
        test(_Tiled(12, ((2, 3), (3,), (3,)), 4, 6, 4, 2))
    with g.check("causal with 3 queries and 6 keys: the queries are positions 3, 4, 5"):
        test(_Tiled(13, ((1,), (1,), (1,)), 3, 6, 4, 2, causal=True, block_q=2, block_k=4))
    with g.check("a boolean mask (6,) over the keys, with causal=True"):
        test(_Tiled(14, ((1,), (1,), (1,)), 6, 6, 4, 2, causal=True, mask=(6,), block_q=4, block_k=2))
    with g.check("a query that may attend to no key gets zeros"):
        q, k, v = (rand(f"public.tiled.empty.{n}", 1, T, 2) for n, T in zip("qkv", (3, 4, 4)))
        mask = torch.tensor([[True, False, True, False], [False] * 4, [False, False, False, True]])
        case = _Tiled(0, ((1,), (1,), (1,)), 3, 4, 2, 2, mask=(3, 4), block_q=2, block_k=2)
        out = _tiled_output(g, tiled_attention, case, q, k, v, mask)
        g.expect(bool(out.isfinite().all()), f"{case}: {_MASKED_NAN}")
        _tiled_compare(g, case, out, q, k, v, mask, one_tile=_one_tile(tiled_attention, case, q, k, v, mask))
    with g.check("scale=0.5 and scale=0.0 multiply the scores"):
        test(_Tiled(15, ((), (), ()), 4, 5, 3, 2, block_q=3, block_k=2, scale=0.5))
        test(_Tiled(16, ((), (), ()), 4, 5, 3, 2, block_q=3, block_k=2, scale=0.0))
    with g.check("scores up to 2400 in float64 and up to about 500 in float32 do not overflow"):
        q = torch.full((1, 3, 2), 10.0, dtype=F64)
        k = torch.linspace(0, 120, 12, dtype=F64)[None, :, None].expand(1, 12, 2).contiguous()
        v = rand("public.tiled.large.v", 1, 12, 2)
        case = _Tiled(0, ((1,), (1,), (1,)), 3, 12, 2, 2, block_q=2, block_k=4, scale=1.0)
        _tiled_compare(
            g, case, _tiled_output(g, tiled_attention, case, q, k, v, None), q, k, v, None, large=True
        )
        _tiled_matches(
            g,
            tiled_attention,
            _Tiled(17, ((), (), ()), 4, 4, 4, 2, block_q=2, block_k=2, size=20.0, dtype=torch.float32),
            large=True,
        )
    with g.check("float32, float16 and bfloat16 inputs give a result of their dtype"):
        for i, dtype in enumerate((torch.float32, torch.float16, torch.bfloat16)):
            test(_Tiled(18 + i, ((), (), ()), 3, 4, 2, 2, block_q=2, block_k=3, dtype=dtype))
    with g.check("gradients reach q, k and v; the inputs are not changed in place"):
        q, k, v = (rand(f"public.tiled.grad.{n}", 1, T, 2) for n, T in zip("qkv", (3, 4, 4)))
        p = probe(
            tiled_attention,
            q.clone().requires_grad_(),
            k.clone().requires_grad_(),
            v.clone().requires_grad_(),
            block_q=2,
            block_k=2,
            backward=(None, torch.ones(1, 3, 2, dtype=F64)),
        )
        refs = [t.clone().requires_grad_() for t in (q, k, v)]
        _naive(*refs).sum().backward()
        for name, got, want in zip("qkv", p.grads or [None] * 3, refs):
            g.expect(
                is_tensor(got) and close(got, want.grad),
                f"the gradient with respect to {name} differs from plain attention's",
            )
        for name, before, after in zip("qkv", (q, k, v), p.args):
            g.expect(is_tensor(after) and torch.equal(after.detach(), before), f"{name} was changed in place")
    with g.check("tensors made on q's device (torch's default device set to meta for the call)"):
        case = _Tiled(19, ((), (), ()), 3, 4, 2, 2, causal=True, block_q=2, block_k=2)
        q, k, v, _ = case.inputs()
        args = (q.clone(), k.clone(), v.clone())
        out = _device_call(
            g,
            lambda: tiled_attention(*args, causal=True, block_q=2, block_k=2),
            str(case),
            "make every tensor with device=q.device (or zeros_like, new_full)",
        )
        _tiled_compare(g, case, out, q, k, v, None, one_tile=_one_tile(tiled_attention, case, q, k, v, None))
    with g.check(
        "ValueError for block_q=0, block_k=-1, causal with S < T and k, v of different lengths; TypeError for "
        "a float mask"
    ):
        x = rand("public.tiled.bad", 1, 4, 2)
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_q=0), "block_q=0")
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_k=-1), "block_k=-1")
        expect_value_error(
            g,
            lambda: tiled_attention(x, x, x[:, :3]),
            "k (1, 4, 2) and v (1, 3, 2)",
            "call check_attention_inputs(q, k, v, mask) first",
        )
        expect_value_error(
            g, lambda: tiled_attention(x, x[:, :2], x[:, :2], causal=True), "causal=True with T=4 and S=2"
        )
        try:
            tiled_attention(x, x, x, mask=torch.zeros(4, 4, dtype=F64))
            g.fail(
                "with a float64 mask your code returned a result; raise a TypeError (the mask must be boolean)"
            )
        except TypeError:
            pass
    g.finish()


# =========================================================================== part 2: sliding-window mask


def _window(T, S, allowed) -> torch.Tensor:
    """A (T, S) mask from a predicate on (query position p, key position j)."""
    p = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    return allowed(p, j).expand(T, S)


def _window_mistakes(T, S, W):
    return [
        (
            _window(T, S, lambda p, j: (j <= p) & (j >= p - W)),
            "the window is off by one: it holds W + 1 keys. Query p sees keys p - W < j <= p, itself and the W - 1 "
            "before it",
        ),
        (
            _window(T, S, lambda p, j: (j <= p) & (j > p - W + 1)),
            "the window is off by one: it holds W - 1 keys. Query p sees keys p - W < j <= p, itself and the W - 1 "
            "before it",
        ),
        (
            _window(T, S, lambda p, j: (j < p) & (j >= p - W)),
            "the window leaves out the query itself: query p sees keys p - W < j <= p, itself included",
        ),
        (
            _window(T, S, lambda p, j: (p - j).abs() < W),
            "the window is not causal: it lets a query see keys after it. Keep only keys j <= p (and j > p - W)",
        ),
        (
            _window(T, S, lambda p, j: (j >= p) & (j < p + W)),
            "the window looks into the future: a query sees itself and the keys BEFORE it, p - W < j <= p",
        ),
        (
            _window(T, S, lambda p, j: (j <= p - (S - T)) & (j > p - (S - T) - W)),
            "the mask is aligned to the top left: with S > T keys, query i sits at position p = i + S - T",
        ),
        (
            _window(T, S, lambda p, j: j <= p),
            "the window is ignored: query p sees only keys p - W < j <= p, not all earlier keys",
        ),
        (
            ~ref.sliding_window_mask(T, W, S),
            "the mask is inverted: True means the query MAY attend to the key",
        ),
    ]


def _call(T, W, S):
    return f"sliding_window_mask({T}, {W}{'' if S is None else f', {S}'})"


def _window_call(g: Grader, sliding_window_mask, T, W, S=None):
    out = sliding_window_mask(T, W) if S is None else sliding_window_mask(T, W, S)
    S_ = T if S is None else S
    g.expect(
        is_tensor(out) and tuple(out.shape) == (T, S_) and out.dtype == torch.bool,
        f"{_call(T, W, S)} should be a boolean tensor of shape ({T}, {S_}), got {describe(out)}",
    )
    return out


def _window_matches(g: Grader, sliding_window_mask, T, W, S=None) -> None:
    out = _window_call(g, sliding_window_mask, T, W, S)
    S_ = T if S is None else S
    expected = _window(T, S_, lambda p, j: (j <= p) & (j > p - W))
    if torch.equal(out, expected):
        return
    hints = list(
        dict.fromkeys(
            hint
            for wrong, hint in _window_mistakes(T, S_, W)
            if not torch.equal(wrong, expected) and torch.equal(out, wrong)
        )
    )
    if hints:  # on a small mask two mistakes can give the same answer
        g.fail(
            f"{_call(T, W, S)}: "
            f"{hints[0] if len(hints) == 1 else 'this mask fits more than one mistake: ' + '; OR '.join(hints)}"
        )
    rows = [i for i in range(T) if not torch.equal(out[i], expected[i])]
    g.fail(
        f"{_call(T, W, S)} differs from the definition (query p = i + S - T sees keys p - W < j <= p) in rows "
        f"{rows[:5]}: row {rows[0]} should be {expected[rows[0]].int().tolist()}, got {out[rows[0]].int().tolist()}"
    )


def _window_device(g: Grader, sliding_window_mask, T, W, S) -> None:
    call = f"sliding_window_mask({T}, {W}, {S}, device='meta')"
    try:
        where = _result_device(lambda: sliding_window_mask(T, W, S, device="meta"))
    except NotImplementedError as e:
        if not meta_copy_refused(e):
            raise
        g.fail(
            f"{call}: your code read the values of a meta tensor ({str(e)[:80]}): build the mask with torch "
            "operations only, on device"
        )
    g.expect(
        where == "meta",
        f"{call} returned a mask on {where}: build it on the device asked for, "
        "torch.arange(..., device=device)",
    )


def grade_sliding_window_mask(sliding_window_mask) -> None:
    """Grade a student's ``sliding_window_mask(T, window, S=None, device=None)``."""
    g = Grader("sliding_window_mask")

    with g.check("returns a (T, S) boolean tensor, S = T by default; T = 0 gives an empty mask"):
        for T, W, S in ((5, 2, None), (3, 2, 6), (1, 1, None), (0, 2, None), (0, 3, 4)):
            _window_call(g, sliding_window_mask, T, W, S)

    with g.check(
        "query p = i + S - T sees the keys p - window < j <= p (itself and the window - 1 before it)"
    ):

        def test(case):
            T, extra, W, default_S = case
            _window_matches(g, sliding_window_mask, T, W, None if default_S and not extra else T + extra)

        for_all(
            "window.values",
            st.tuples(st.integers(0, 12), st.integers(0, 5), st.integers(1, 14), st.booleans()),
            test,
            max_examples=30,
            first=(4, 0, 2, True),
        )
        for T, W in ((4, 2), (9, 3), (16, 5), (6, 1)):
            _window_matches(g, sliding_window_mask, T, W)

    with g.check("a window as long as the keys (or longer) is the causal mask; window 1 is the diagonal"):
        for T, W, S in ((7, 7, None), (7, 50, None), (3, 6, 6), (4, 9, 6)):
            out = _window_call(g, sliding_window_mask, T, W, S)
            g.expect(
                torch.equal(out, att.causal_mask(T, S)),
                f"{_call(T, W, S)} should equal the causal mask causal_mask({T}, {S or T})",
            )
        for T, S in ((5, None), (3, 7)):
            out = _window_call(g, sliding_window_mask, T, 1, S)
            g.expect(
                torch.equal(out, _window(T, S or T, lambda p, j: j == p)),
                f"with window 1 a query sees only itself: {_call(T, 1, S)} is True only at key p = i + S - T",
            )

    with g.check("with S > T keys the queries are the last T positions (bottom-right)"):
        for T, W, S in ((3, 2, 8), (4, 3, 5), (1, 4, 9), (5, 10, 12), (2, 3, 5)):
            _window_matches(g, sliding_window_mask, T, W, S)

    with g.check("builds the mask on the device asked for (device='meta')"):
        for T, W, S in ((4, 2, 4), (3, 2, 7)):
            _window_device(g, sliding_window_mask, T, W, S)

    with g.check("raises ValueError unless window is a positive integer, and unless 0 <= T <= S"):
        for W in (0, -3, 2.5, 2.0):
            expect_value_error(
                g,
                lambda: sliding_window_mask(4, W),
                f"sliding_window_mask(4, {W!r})",
                "the window must be a positive integer",
            )
        expect_value_error(
            g, lambda: sliding_window_mask(5, 2, 3), "sliding_window_mask(5, 2, 3): more queries than keys"
        )
        expect_value_error(g, lambda: sliding_window_mask(-1, 2), "sliding_window_mask(-1, 2)")
        expect_value_error(g, lambda: sliding_window_mask(-2, 2, 3), "sliding_window_mask(-2, 2, 3)")

    g.finish()


def check_sliding_window_mask(sliding_window_mask) -> None:
    """Public checks of ``sliding_window_mask``: every clause the hidden checks grade, on the exercise's examples."""
    g = Grader("sliding_window_mask (public)")
    with g.check("sliding_window_mask(4, 2) is [[1,0,0,0], [1,1,0,0], [0,1,1,0], [0,0,1,1]]"):
        _window_matches(g, sliding_window_mask, 4, 2)
    with g.check("sliding_window_mask(2, 3, 5): the two queries are positions 3 and 4"):
        _window_matches(g, sliding_window_mask, 2, 3, 5)
    with g.check(
        "sliding_window_mask(3, 5) is the causal mask; sliding_window_mask(0, 2, 3) is empty (0, 3)"
    ):
        _window_matches(g, sliding_window_mask, 3, 5)
        _window_matches(g, sliding_window_mask, 0, 2, 3)
    with g.check("sliding_window_mask(3, 2, 4, device='meta') is built on the meta device"):
        _window_device(g, sliding_window_mask, 3, 2, 4)
    with g.check(
        "sliding_window_mask(4, 0), sliding_window_mask(4, 1.5) and sliding_window_mask(3, 2, 2) raise "
        "ValueError"
    ):
        expect_value_error(g, lambda: sliding_window_mask(4, 0), "sliding_window_mask(4, 0)")
        expect_value_error(g, lambda: sliding_window_mask(4, 1.5), "sliding_window_mask(4, 1.5)")
        expect_value_error(g, lambda: sliding_window_mask(3, 2, 2), "sliding_window_mask(3, 2, 2)")
    g.finish()


# =========================================================================== part 3: causal linear attention


def _parallel(q, k, v, phi, causal=True, eps=1e-6, diagonal=0):
    A = phi(q) @ phi(k).transpose(-2, -1)  # (..., T, T)
    if causal:
        A = A.tril(diagonal)
    return (A @ v) / (A.sum(-1, keepdim=True) + eps)


def _recurrence(q, k, v, eps):
    """Linear attention as an RNN, token by token, in float64: the independent reference."""
    q, k, v = q.double(), k.double(), v.double()
    phi = ref.elu_feature_map
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    state = torch.zeros(*batch, q.shape[-1], v.shape[-1], dtype=F64)
    z = torch.zeros(*batch, q.shape[-1], dtype=F64)
    out = []
    for t in range(q.shape[-2]):
        pk, pq = phi(k[..., t, :]), phi(q[..., t, :])
        state = state + pk.unsqueeze(-1) * v[..., t, :].unsqueeze(-2)  # (..., D, Dv)
        z = z + pk
        out.append((pq.unsqueeze(-2) @ state).squeeze(-2) / ((pq * z).sum(-1, keepdim=True) + eps))
    if not out:
        return torch.zeros(*batch, 0, v.shape[-1], dtype=F64)
    return torch.stack(out, dim=-2)


_NOT_CAUSAL = (
    "the result is not causal: query i used the sums over ALL keys. Use running sums (cumsum over the "
    "sequence axis) so that query i sees keys 0 .. i only"
)
_NO_NORMALISER = (
    "the normaliser is missing: divide phi(q_i) S_i by phi(q_i) . z_i + eps, where z_i is the running "
    "sum of phi(k_j)"
)
_NOT_POSITIVE = (
    "the feature map is not positive: apply phi(x) = elu(x) + 1 (the given elu_feature_map) to q and k, "
    "so that every weight phi(q) . phi(k) is positive"
)
_EPS_IGNORED = "the eps argument is not used: divide by (phi(q_i) . z_i + eps) with the eps you were given"


def _linear_mistakes(q, k, v, eps):
    q, k, v = q.double(), k.double(), v.double()
    phi = ref.elu_feature_map
    A = (phi(q) @ phi(k).transpose(-2, -1)).tril()
    return [
        (ref.linear_attention(q, k, v, eps=eps), _NOT_CAUSAL),
        (A @ v, _NO_NORMALISER),
        (_parallel(q, k, v, F.elu, eps=eps), _NOT_POSITIVE),
        (_parallel(q, k, v, lambda x: x, eps=eps), _NOT_POSITIVE),
        (_parallel(q, k, v, F.relu, eps=eps), _NOT_POSITIVE),
        (
            _parallel(q, k, v, phi, eps=eps, diagonal=-1),
            "query i does not see key i: the running sums must include position i (an inclusive cumsum)",
        ),
        (_parallel(q, k, v, phi, eps=1e-6), _EPS_IGNORED),
        (_parallel(q, k, v, phi, eps=0.0), "eps is not used: divide by (phi(q_i) . z_i + eps)"),
        (
            (A @ v + eps) / (A.sum(-1, keepdim=True) + eps),
            "eps belongs to the denominator only: (phi(q_i) S_i) / (phi(q_i) . z_i + eps)",
        ),
        (
            (A @ v) / (A.sum(-1, keepdim=True) * (1 + eps)),
            "eps is added to the normaliser, not multiplied: (phi(q_i) S_i) / (phi(q_i) . z_i + eps)",
        ),
    ]


@dataclass(frozen=True)
class _Linear:
    seed: int
    lead: tuple  # leading dimensions of (q, k, v)
    T: int
    D: int
    Dv: int
    eps: float | None = None  # None: the default
    size: float = 1.0
    dtype: torch.dtype = F64

    def inputs(self):
        q = tensor(self.seed, *self.lead[0], self.T, self.D, scale=self.size).to(self.dtype)
        k = tensor(self.seed + 1, *self.lead[1], self.T, self.D, scale=self.size).to(self.dtype)
        v = tensor(self.seed + 2, *self.lead[2], self.T, self.Dv).to(self.dtype)
        return q, k, v

    @property
    def kwargs(self) -> dict:
        return {} if self.eps is None else {"eps": self.eps}

    def __str__(self) -> str:
        q, k, v = ((*lead, self.T, d) for lead, d in zip(self.lead, (self.D, self.D, self.Dv)))
        eps = "" if self.eps is None else f", eps={self.eps!r}"
        return f"for q {q}, k {k}, v {v} ({dtype_name(self.dtype)}){eps}"


@st.composite
def _linear_cases(draw, eps=(None,), dtypes=(F64,)):
    return _Linear(
        draw(st.integers(0, 2**20)),
        draw(st.sampled_from(_LEADS)),
        draw(st.integers(1, 12)),
        draw(st.integers(1, 5)),
        draw(st.integers(1, 4)),
        draw(st.sampled_from(eps)),
        draw(st.sampled_from((0.5, 1.0, 2.5))),
        draw(st.sampled_from(dtypes)),
    )


def _linear_output(g: Grader, causal_linear_attention, case: _Linear, q, k, v):
    try:
        out = causal_linear_attention(q.clone(), k.clone(), v.clone(), **case.kwargs)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(f"{case}: your code raised {_raised(e)}")
    shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), case.T, case.Dv)
    g.expect(
        is_tensor(out) and tuple(out.shape) == shape and out.dtype == case.dtype,
        f"{case}: expected a {dtype_name(case.dtype)} tensor of shape (..., T, Dv) = {shape}, got {describe(out)}",
    )
    return out


def _linear_matches(g: Grader, causal_linear_attention, case: _Linear) -> None:
    q, k, v = case.inputs()
    out = _linear_output(g, causal_linear_attention, case, q, k, v)
    eps = 1e-6 if case.eps is None else case.eps
    expected = _recurrence(q, k, v, eps)
    M = magnitude(ref.elu_feature_map(q.double()), ref.elu_feature_map(k.double()), v)
    if close(out, expected.to(case.dtype), magnitude=M):
        return
    for wrong, hint in _linear_mistakes(q, k, v, eps):
        if close(wrong.to(case.dtype), expected.to(case.dtype), magnitude=M):
            continue
        if close(out, wrong.to(case.dtype), magnitude=M):
            g.fail(f"{case}: {hint}")
    g.fail(
        f"{case}: the result differs from the token-by-token recurrence of linear attention "
        f"(largest difference {(out.double() - expected).abs().max().item():.3g})"
    )


def grade_causal_linear_attention(causal_linear_attention) -> None:
    """Grade a student's ``causal_linear_attention(q, k, v, eps=1e-6)``."""
    g = Grader("causal_linear_attention")
    test = functools.partial(_linear_matches, g, causal_linear_attention)

    with g.check(
        "returns (..., T, Dv) in q's dtype (float64, float32), with no, one or several leading dimensions"
    ):
        for i, (lead, dtype) in enumerate(
            (
                (((), (), ()), F64),
                (((2, 3), (2, 3), (2, 3)), torch.float32),
                (((2,), (2,), (2,)), F64),
                (((1, 3), (3,), (2, 1, 1)), torch.float32),
            )
        ):
            test(_Linear(30 + i, lead, 5, 4, 3, dtype=dtype))

    with g.check(
        "equals the token-by-token recurrence (T from 1, leading dimensions that broadcast, float32 and "
        "float64)"
    ):
        for_all(
            "lin.values",
            _linear_cases(dtypes=(F64, F64, torch.float32)),
            test,
            max_examples=16,
            first=_Linear(1, ((), (), ()), 4, 3, 2),
        )

    with g.check("causal: changing later keys and values leaves earlier outputs unchanged"):
        q, k, v = (
            rand("lin.future.q", 2, 12, 4),
            rand("lin.future.k", 2, 12, 4),
            rand("lin.future.v", 2, 12, 3),
        )
        k2, v2 = k.clone(), v.clone()
        k2[:, 8:], v2[:, 8:] = (
            rand("lin.future.k2", 2, 4, 4, scale=3.0),
            rand("lin.future.v2", 2, 4, 3, scale=3.0),
        )
        a, b = (
            causal_linear_attention(q.clone(), k.clone(), v.clone()),
            causal_linear_attention(q.clone(), k2, v2),
        )
        g.expect(
            is_tensor(a)
            and is_tensor(b)
            and tuple(a.shape) == tuple(b.shape) == (2, 12, 3)
            and close(b[:, :8], a[:, :8]),
            f"for q, k (2, 12, 4) and v (2, 12, 3), changing keys and values 8 .. 11 changed the outputs of "
            f"queries 0 .. 7: {_NOT_CAUSAL}",
        )

    with g.check("eps is added to each normaliser, at any value (0, the default 1e-6, 0.5, 3)"):
        for_all(
            "lin.eps",
            _linear_cases(eps=(0.0, 1e-6, 0.5, 3.0)),
            test,
            max_examples=10,
            first=_Linear(2, ((), (), ()), 5, 3, 2, eps=0.5),
        )

    with g.check("gradients reach q, k and v and equal the recurrence's"):
        q, k, v = rand("lin.grad.q", 2, 6, 3), rand("lin.grad.k", 2, 6, 3), rand("lin.grad.v", 2, 6, 2)
        up = rand("lin.grad.up", 2, 6, 2)
        p = probe(
            causal_linear_attention,
            q.clone().requires_grad_(),
            k.clone().requires_grad_(),
            v.clone().requires_grad_(),
            eps=0.1,
            backward=(None, up),
        )
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            "the output does not depend on q, k, v through autograd: avoid .detach(), .item(), .data or "
            "torch.tensor(...)",
        )
        refs = [t.clone().requires_grad_() for t in (q, k, v)]
        (_recurrence(*refs, 0.1) * up).sum().backward()
        for name, got, want in zip("qkv", p.grads or [None] * 3, refs):
            g.expect(
                is_tensor(got) and close(got, want.grad),
                f"for q, k (2, 6, 3), v (2, 6, 2) and eps=0.1 the gradient with respect to {name} differs from "
                f"the "
                "recurrence's",
            )

    with g.check("does not change q, k or v in place"):
        q, k, v = (
            rand("lin.inplace.q", 2, 5, 3),
            rand("lin.inplace.k", 2, 5, 3),
            rand("lin.inplace.v", 2, 5, 2),
        )
        p = probe(causal_linear_attention, q.clone(), k.clone(), v.clone())
        for name, before, after in zip("qkv", (q, k, v), p.args):
            g.expect(
                is_tensor(after) and torch.equal(after, before),
                f"causal_linear_attention changed its argument {name} in place: work on new tensors",
            )

    with g.check("linear in T: 200,000 tokens without a (T, T) matrix"):
        T = 200_000
        q, k, v = rand("lin.long.q", T, 2), rand("lin.long.k", T, 2), rand("lin.long.v", T, 2)
        try:
            out = causal_linear_attention(q.clone(), k.clone(), v.clone())
        except Exception as e:
            raise_unless_student_error(e)
            g.fail(
                f"with T = {T:,} your code raised {type(e).__name__.removeprefix('Student')} ({str(e)[:120]}): a "
                f"(T, T) matrix "
                f"of float64 needs {T * T * 8 / 2**30:,.0f} GiB. Use running sums (cumsum), whose memory grows "
                f"like T D Dv"
            )
        g.expect(
            is_tensor(out) and out.shape == (T, 2) and bool(out.isfinite().all()),
            f"with T = {T:,} expected a finite ({T}, 2) tensor, got {describe(out)}",
        )
        g.expect(
            close(out, ref.causal_linear_attention(q, k, v)),
            f"with T = {T:,} the result differs from the reference",
        )

    with g.check("raises ValueError for q and k of different lengths, eps < 0, and shapes that do not fit"):
        q = rand("lin.bad", 1, 5, 2)
        expect_value_error(
            g, lambda: causal_linear_attention(q, q[:, :3], q[:, :3]), "q with 5 positions and k, v with 3"
        )
        expect_value_error(
            g, lambda: causal_linear_attention(q, q, q, eps=-1e-3), "eps=-0.001", "eps must be >= 0"
        )
        expect_value_error(g, lambda: causal_linear_attention(q, q, q, -0.5), "eps=-0.5", "eps must be >= 0")
        expect_value_error(
            g,
            lambda: causal_linear_attention(q, rand("lin.bad.w", 1, 5, 3), q),
            "q (1, 5, 2) and k (1, 5, 3) of different widths",
            "call check_attention_inputs(q, k, v) first",
        )
        expect_value_error(
            g,
            lambda: causal_linear_attention(q, q, q[:, :4]),
            "k (1, 5, 2) and v (1, 4, 2)",
            "call check_attention_inputs(q, k, v) first",
        )

    g.finish()


def check_causal_linear_attention(causal_linear_attention) -> None:
    """Public checks of ``causal_linear_attention``: every clause the hidden checks grade, on one small example each."""
    g = Grader("causal_linear_attention (public)")
    test = functools.partial(_linear_matches, g, causal_linear_attention)
    with g.check("5 tokens: equals the causal weights phi(q_i) . phi(k_j), j <= i, normalised"):
        test(_Linear(41, ((1,), (1,), (1,)), 5, 3, 2))
    with g.check("leading dimensions (2, 3) and none; float32"):
        test(_Linear(42, ((2, 3), (2, 3), (2, 3)), 4, 2, 3, dtype=torch.float32))
        test(_Linear(43, ((), (), ()), 4, 2, 3))
    with g.check("eps=0.5 and eps=0 are added to the normaliser"):
        test(_Linear(44, ((1,), (1,), (1,)), 5, 3, 2, eps=0.5))
        test(_Linear(45, ((1,), (1,), (1,)), 5, 3, 2, eps=0.0))
    with g.check("gradients reach q, k and v; the inputs are not changed in place"):
        q, k, v = (rand(f"public.lin.grad.{n}", 1, 4, 2) for n in "qkv")
        p = probe(
            causal_linear_attention,
            q.clone().requires_grad_(),
            k.clone().requires_grad_(),
            v.clone().requires_grad_(),
            backward=(None, torch.ones(1, 4, 2, dtype=F64)),
        )
        refs = [t.clone().requires_grad_() for t in (q, k, v)]
        _recurrence(*refs, 1e-6).sum().backward()
        for name, got, want in zip("qkv", p.grads or [None] * 3, refs):
            g.expect(
                is_tensor(got) and close(got, want.grad),
                f"the gradient with respect to {name} differs from the recurrence's",
            )
        for name, before, after in zip("qkv", (q, k, v), p.args):
            g.expect(is_tensor(after) and torch.equal(after.detach(), before), f"{name} was changed in place")
    with g.check("20,000 tokens without a (T, T) matrix"):
        T = 20_000
        q, k, v = (
            rand("public.lin.long.q", T, 2),
            rand("public.lin.long.k", T, 2),
            rand("public.lin.long.v", T, 2),
        )
        try:
            out = causal_linear_attention(q.clone(), k.clone(), v.clone())
        except Exception as e:
            raise_unless_student_error(e)
            g.fail(
                f"with T = {T:,} your code raised {_raised(e)}: use running sums (cumsum), not a (T, T) matrix"
            )
        g.expect(
            close(out, ref.causal_linear_attention(q, k, v)),
            f"with T = {T:,} the result differs from the reference",
        )
    with g.check("ValueError for q and k of different lengths and for eps < 0"):
        x = rand("public.lin.bad", 1, 4, 2)
        expect_value_error(
            g, lambda: causal_linear_attention(x, x[:, :2], x[:, :2]), "q with 4 positions and k, v with 2"
        )
        expect_value_error(g, lambda: causal_linear_attention(x, x, x, eps=-0.1), "eps=-0.1")
    g.finish()


# =========================================================================== part 4: KV-cache size


def _kv(L, H_kv, D, T, B=1, nbytes=2) -> int:
    return 2 * L * H_kv * D * T * B * nbytes


_BYTES = {
    torch.float16: 2,
    torch.bfloat16: 2,
    torch.float32: 4,
    torch.float64: 8,
    torch.int8: 1,
    torch.uint8: 1,
}
_NO_TWO = (
    "the factor 2 is missing: the cache holds a key AND a value for every layer, token and key/value head"
)
_QUERY_HEADS = (
    "the size counts the query heads: only the n_kv_heads key/value heads are cached (GQA and MQA share "
    "them among the query heads); n_kv_heads=None means n_heads"
)
_DTYPE = (
    "the size does not follow dtype: a value takes torch.empty((), dtype=dtype).element_size() bytes "
    "(2 for float16 and bfloat16, 4 for float32, 8 for float64, 1 for int8)"
)
_BITS = "the size is in bits: count bytes (element_size(), not the number of bits)"
_WINDOW = "the window is ignored: a sliding window of W keys caches only the last min(seq_len, W) tokens"
_WINDOW_MIN = (
    "with a window the cache holds min(seq_len, window) tokens: fewer when the sequence is shorter than the "
    "window"
)
_BATCH = "the batch is ignored: every sequence of the batch has its own cache"


def _kv_expected(L, H, D, T, H_kv=None, B=1, dtype=torch.float16, W=None):
    """(kwargs, expected bytes, [(wrong bytes, hint), ...]) of one call."""
    h_kv = H if H_kv is None else H_kv
    nbytes = _BYTES[dtype]
    tokens = T if W is None else min(T, W)
    kwargs = dict(n_layers=L, n_heads=H, d_head=D, seq_len=T)
    for key, value, default in (
        ("n_kv_heads", H_kv, None),
        ("batch", B, 1),
        ("dtype", dtype, torch.float16),
        ("window", W, None),
    ):
        if value != default:
            kwargs[key] = value
    expected = _kv(L, h_kv, D, tokens, B, nbytes)
    wrong = [
        (expected // 2, _NO_TWO),
        (_kv(L, H, D, tokens, B, nbytes), _QUERY_HEADS),
        (_kv(L, h_kv, D, tokens, B, 2), _DTYPE),
        (expected * 8, _BITS),
        (_kv(L, h_kv, D, T, B, nbytes), _WINDOW),
        (_kv(L, h_kv, D, W or T, B, nbytes), _WINDOW_MIN),
        (_kv(L, h_kv, D, tokens, 1, nbytes), _BATCH),
    ]
    return kwargs, expected, wrong


def _kv_cases():
    """Fixed cases: (kwargs, expected bytes, [(wrong bytes, hint), ...])."""
    return [
        _kv_expected(*args)
        for args in (
            (32, 32, 128, 4096, None, 1, torch.float16, None),
            (80, 64, 128, 1000, 8, 3, torch.bfloat16, None),
            (4, 8, 16, 50, 1, 2, torch.float32, None),
            (32, 32, 128, 131072, 8, 1, torch.float16, 4096),
            (6, 12, 64, 300, 4, 2, torch.float32, 1024),
            (2, 4, 8, 9, 2, 5, torch.float64, 4),
        )
    ]


def _kv_matches(g: Grader, kv_cache_size, kwargs: dict, expected: int, wrong) -> None:
    call = ", ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in kwargs.items())
    out = kv_cache_size(**kwargs)
    g.expect(
        type(out) is int,
        f"kv_cache_size({call}) should return an int (a number of bytes), got {describe(out)}"
        f"{f' ({out!r})' if isinstance(out, (int, float)) else ''}",
    )
    if out == expected:
        return
    hints = list(dict.fromkeys(hint for value, hint in wrong if value != expected and out == value))
    if hints:  # a value can fit two mistakes (float32 without the factor 2 = float32 counted as 2 bytes)
        said = (
            hints[0] if len(hints) == 1 else "this value fits more than one mistake: " + "; OR ".join(hints)
        )
        g.fail(f"{said} (kv_cache_size({call}) returned {out:,}, expected {expected:,})")
    g.fail(
        f"kv_cache_size({call}) returned {out:,}, expected 2 * L * B * tokens * H_kv * D * bytes = {expected:,}"
    )


@st.composite
def _kv_calls(draw):
    H = draw(st.sampled_from((1, 2, 3, 4, 6, 8, 12)))
    H_kv = draw(st.sampled_from([None] + [d for d in range(1, H + 1) if H % d == 0]))
    return (
        draw(st.integers(1, 40)),
        H,
        draw(st.integers(1, 160)),
        draw(st.integers(0, 5000)),
        H_kv,
        draw(st.integers(1, 6)),
        draw(st.sampled_from(list(_BYTES))),
        draw(st.sampled_from((None, 1, 7, 64, 4096))),
    )


def grade_kv_cache_size(kv_cache_size) -> None:
    """Grade a student's ``kv_cache_size(n_layers, n_heads, d_head, seq_len, n_kv_heads=None, batch=1,
    dtype=torch.float16, window=None)``."""
    g = Grader("kv_cache_size")
    cases = _kv_cases()

    with g.check("returns an int"):
        for args in ((2, 4, 8, 10), (1, 1, 1, 0)):
            out = kv_cache_size(*args)
            g.expect(
                type(out) is int,
                f"kv_cache_size{args} should return an int (a number of bytes), got "
                f"{describe(out)}{f' ({out!r})' if isinstance(out, (int, float)) else ''}",
            )

    with g.check(
        "a 7B model (32 layers, 32 heads of 128) in float16: 0.5 MiB per token, 64 GiB at 128k tokens"
    ):
        _kv_matches(
            g,
            kv_cache_size,
            dict(n_layers=32, n_heads=32, d_head=128, seq_len=1),
            512 * 1024,
            [(256 * 1024, _NO_TWO), (1024 * 1024, _DTYPE), (4 * 1024 * 1024, _BITS)],
        )
        _kv_matches(
            g,
            kv_cache_size,
            dict(n_layers=32, n_heads=32, d_head=128, seq_len=128 * 1024),
            64 * 2**30,
            [(32 * 2**30, _NO_TWO)],
        )

    with g.check("2 * L * B * tokens * H_kv * D * bytes per value, for any sizes and arguments"):
        for_all(
            "kv.values",
            _kv_calls(),
            lambda args: _kv_matches(g, kv_cache_size, *_kv_expected(*args)),
            max_examples=30,
            first=(2, 4, 8, 10, None, 1, torch.float16, None),
        )

    with g.check("MHA, GQA and MQA: only the key/value heads are cached (n_kv_heads=None means n_heads)"):
        for kwargs, expected, wrong in cases[:3]:
            _kv_matches(g, kv_cache_size, kwargs, expected, wrong)
        _kv_matches(g, kv_cache_size, *_kv_expected(3, 6, 16, 10, 6))
        _kv_matches(g, kv_cache_size, *_kv_expected(3, 6, 16, 10, 2))

    with g.check("the dtype sets the bytes per value (float16, bfloat16, float32, float64, int8)"):
        for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int8, torch.float16):
            _kv_matches(g, kv_cache_size, *_kv_expected(3, 4, 16, 10, dtype=dtype))

    with g.check("a sliding window caps the cached tokens at min(seq_len, window)"):
        for kwargs, expected, wrong in cases[3:]:
            _kv_matches(g, kv_cache_size, kwargs, expected, wrong)
        for T, W in ((10, 1), (10, 10), (10, 11), (0, 3)):
            _kv_matches(g, kv_cache_size, *_kv_expected(2, 4, 8, T, W=W))

    with g.check("the batch multiplies the size; seq_len=0 gives 0 bytes"):
        for B in (2, 5):
            _kv_matches(g, kv_cache_size, *_kv_expected(3, 4, 16, 10, B=B))
        _kv_matches(g, kv_cache_size, *_kv_expected(3, 4, 16, 0))

    with g.check(
        "raises ValueError for sizes below 1, a negative seq_len, n_kv_heads not dividing n_heads, a window "
        "below 1"
    ):
        good = dict(n_layers=2, n_heads=8, d_head=16, seq_len=10)
        bad = [
            ("n_layers", 0),
            ("n_layers", -1),
            ("n_heads", 0),
            ("n_heads", -8),
            ("d_head", 0),
            ("d_head", -2),
            ("seq_len", -1),
            ("n_kv_heads", 0),
            ("n_kv_heads", -2),
            ("n_kv_heads", 3),
            ("batch", 0),
            ("batch", -1),
            ("window", 0),
            ("window", -1),
        ]
        for name, value in bad:
            kwargs = {**good, name: value}
            expect_value_error(
                g,
                lambda kwargs=kwargs: kv_cache_size(**kwargs),
                f"{name}={value}",
                "sizes must be >= 1 (seq_len >= 0), n_kv_heads must divide n_heads",
            )

    g.finish()


def check_kv_cache_size(kv_cache_size) -> None:
    """Public checks of ``kv_cache_size``: every clause the hidden checks grade, on the chapter's examples."""
    g = Grader("kv_cache_size (public)")
    with g.check("32 layers, 32 heads of 128, float16: 524,288 bytes (0.5 MiB) per token, an int"):
        _kv_matches(
            g,
            kv_cache_size,
            dict(n_layers=32, n_heads=32, d_head=128, seq_len=1),
            512 * 1024,
            [(256 * 1024, _NO_TWO), (1024 * 1024, _DTYPE), (4 * 1024 * 1024, _BITS)],
        )
    with g.check("the same with 8 key/value heads (GQA) caches 4 times less"):
        _kv_matches(
            g,
            kv_cache_size,
            dict(n_layers=32, n_heads=32, d_head=128, seq_len=1, n_kv_heads=8),
            128 * 1024,
            [(512 * 1024, _QUERY_HEADS), (64 * 1024, _NO_TWO)],
        )
    with g.check("in float32 a value takes 4 bytes: 1 MiB per token"):
        _kv_matches(
            g,
            kv_cache_size,
            dict(n_layers=32, n_heads=32, d_head=128, seq_len=1, dtype=torch.float32),
            1024 * 1024,
            [(512 * 1024, _DTYPE), (8 * 1024 * 1024, _BITS), (512 * 1024, _NO_TWO)],
        )
    with g.check(
        "a window of 4,096 caps 131,072 tokens (and keeps all of 1,000); a batch of 3 triples the size; "
        "seq_len=0 gives 0"
    ):
        _kv_matches(g, kv_cache_size, *_kv_expected(32, 32, 128, 131072, W=4096))
        _kv_matches(g, kv_cache_size, *_kv_expected(32, 32, 128, 1000, W=4096))
        _kv_matches(g, kv_cache_size, *_kv_expected(2, 4, 8, 10, B=3))
        _kv_matches(g, kv_cache_size, *_kv_expected(2, 4, 8, 0))
    with g.check("ValueError for n_layers=0, seq_len=-1, n_kv_heads=3 with n_heads=8, window=0"):
        for kwargs in (dict(n_layers=0), dict(seq_len=-1), dict(n_kv_heads=3), dict(window=0)):
            full = {**dict(n_layers=2, n_heads=8, d_head=16, seq_len=10), **kwargs}
            expect_value_error(
                g, lambda full=full: kv_cache_size(**full), ", ".join(f"{k}={v}" for k, v in kwargs.items())
            )
    g.finish()


# =========================================================================== predict, then check

WINDOW_PAIRS = Prediction(
    name="predict_window_pairs",
    question="A causal sliding window of W = 4 keys over T = 16 tokens: how many (query, key) pairs may attend?",
    tests="counting a sliding window's pairs: T W minus the short windows of the first W - 1 queries",
    measure=lambda: int(ref.sliding_window_mask(16, 4).sum()),
    explanation="Query i sees min(i + 1, W) keys: the first three queries have only 1, 2 and 3 keys before them, "
    "the other 13 see 4 each, so 1 + 2 + 3 + 13 * 4 = {truth}, a little under T W = 64 (and far under the "
    "136 pairs of the full causal mask). For T much larger than W the count is about T W: linear in T.",
)

#: the shape of KV_CACHE_GIB: Llama 2 13B (Touvron et al., 2023): layers, heads (multi-head attention), head width
_KV_13B = dict(n_layers=40, n_heads=40, d_head=128)


def _kv_cache_13b_gib() -> float:
    """GiB of the KV cache of one 4,096-token float16 sequence of the 13B shape: the buffers of Chapter 7's
    ``KVCache`` allocated on the ``meta`` device (shapes and dtypes, no data) and their bytes added up."""
    L, H, D = _KV_13B["n_layers"], _KV_13B["n_heads"], _KV_13B["d_head"]
    cache = gpt.KVCache([gpt.LayerCache(1, H, 4096, D, torch.float16, "meta") for _ in range(L)])
    return cache.nbytes() / 2**30


KV_CACHE_GIB = Prediction(
    name="predict_kv_cache_gib",
    question="A Llama-2-13B shape (40 layers, 40 heads of width 128, multi-head attention) caches keys and "
    "values in float16 for one sequence of 4,096 tokens: how many GiB is its KV cache?",
    tests="the KV cache's size: 2 (keys and values) x layers x tokens x heads x head width x bytes",
    measure=_kv_cache_13b_gib,
    explanation="Per token and layer the cache holds one key and one value per head: 2 * 40 * 128 = 10,240 "
    "values, 20 KiB in float16; times 40 layers that is 800 KiB per token, and 4,096 tokens make {truth} GiB. "
    "Forgetting the values gives half of it, forgetting the layers 1/40, counting 4 bytes per value twice it. "
    "Against the 7B shape's 0.5 MiB per token, the 13B shape caches (40/32)^2 = 1.56 times more per token, "
    "since it is both deeper and wider (more heads): past about 32k tokens one sequence's cache outweighs its "
    "26 GB of float16 weights (Touvron et al., 2023).",
    rel=0.05,
    mistakes=(
        ("GB instead of GiB", lambda gib: gib * 2**30 / 1e9),
        ("keys only, no values", lambda gib: gib / 2),
        ("one layer's cache", lambda gib: gib / 40),
        ("4 bytes per value", lambda gib: 2 * gib),
    ),
)

#: the shape of SAVED_PER_ROW: q, k and v are (B, H, T, D) in float32
_SAVED_B, _SAVED_H, _SAVED_T, _SAVED_D = 2, 8, 4096, 64

#: the choices of SAVED_PER_ROW in bytes
_SAVED_CHOICES = {"a": 0, "b": 2**18, "c": 2**19, "d": 2**30}


def _saved_extra_bytes(T: int) -> int:
    """Bytes ``flash_attention`` keeps for its backward pass beyond ``q, k, v`` and its output, for
    ``(B, H, T, D)`` inputs in float32: counted with autograd's ``saved_tensors_hooks``."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(_SAVED_B, _SAVED_H, T, _SAVED_D, generator=g, requires_grad=True) for _ in range(3)
    )  # (B, H, T, D)
    kept: dict[int, int] = {}  # memory block -> its bytes (views of one block count once)

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = ref.flash_attention(q, k, v, block_q=64, block_k=64)  # (B, H, T, D)
    return sum(kept.values()) - sum(t.untyped_storage().nbytes() for t in (q, k, v, out))


def _saved_extra() -> str:
    """Which choice the extra bytes at ``T = 4096`` are nearest to (on a log scale). They are counted at
    ``T = 128`` and ``T = 256`` (the tiled forward pass at 4,096 tokens takes seconds on a CPU) and carried to
    4,096 along the growth measured between the two: ``T`` for numbers per row, ``T^2`` for weights."""
    small, large = _saved_extra_bytes(128), _saved_extra_bytes(256)
    if large == 0:
        return "a"
    at_t = large * (_SAVED_T / 256) ** math.log2(large / small)
    return min(
        (c for c in _SAVED_CHOICES if _SAVED_CHOICES[c]),
        key=lambda c: abs(math.log(at_t / _SAVED_CHOICES[c])),
    )


SAVED_PER_ROW = Prediction(
    name="predict_saved_per_row",
    question="Training through flash_attention with q, k and v of shape (2, 8, 4096, 64) (batch, heads, tokens, "
    "head width) in float32: beyond q, k, v and the output, how many bytes does its forward pass keep for the "
    "backward pass?",
    tests="recomputation in FlashAttention's backward: one log-sum-exp per query row, linear in T, not T x T",
    measure=_saved_extra,
    explanation="Answer {truth}. The forward pass keeps one log-sum-exp L_i = m_i + log l_i per query row of "
    "every head: 2 * 8 * 4,096 = 65,536 float32 numbers, 256 KiB, whatever the head width. With it every weight "
    "is P_ij = exp(s_ij - L_i), and s_ij = q_i . k_j / sqrt(D) comes back from q and k, so the backward pass "
    "rebuilds each tile of P and drops it. 0 bytes would mean redoing a row's whole online softmax before any of "
    "its weights could be rebuilt, since a row's normaliser depends on all its keys; 512 KiB keeps the running "
    "maximum and the running sum, which the backward pass needs only in the combination L_i, so one number "
    "replaces two; 1 GiB is the (T, T) weights of all 16 heads, 2 * 8 * 4,096^2 * 4 bytes, what plain autograd "
    "keeps: 4,096 times more, the memory that recomputation saves at the price of computing Q K^T once more "
    "(Dao et al., 2022).",
    choices={"a": "0 bytes", "b": "256 KiB", "c": "512 KiB", "d": "1 GiB"},
)

check_predict_window_pairs, grade_predict_window_pairs = WINDOW_PAIRS.graders()
check_predict_kv_cache_gib, grade_predict_kv_cache_gib = KV_CACHE_GIB.graders()
check_predict_saved_per_row, grade_predict_saved_per_row = SAVED_PER_ROW.graders()


# =========================================================================== experiment: window_mass

#: the experiment's trials and band. The keys are exchangeable (each has the same distribution and the
#: weights sum to 1), so the expected kept weight is exactly W / T for any correct measurement, whatever
#: the scale of the scores. With n = 4,000 trials the standard error of the mean is at most 0.9% of W / T
#: for the cases graded (measured on the reference: 0.6% for T = 64, W = 8; 0.9% for T = 32, W = 4), so
#: a band of 6% is more than six standard errors; a window off by one key moves the mean by 1 / W,
#: 12.5% or 25% for W = 8 or 4, outside the band.
MASS_N, MASS_BAND = 4000, 0.06


def _run(g: Grader, where: str, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(f"{where}: {_raised(e)}")


def _seeded(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _mass(g: Grader, window_mass, T: int, W: int, seed: int, D: int | None = None):
    where = f"window_mass({T}, {W}, {MASS_N}, generator{'' if D is None else f', D={D}'})"
    args = (T, W, MASS_N, _seeded(seed)) + (() if D is None else (D,))
    return where, _run(g, where, window_mass, *args)


_MASS_WHY = (
    "the keys are exchangeable, so the last W of T keys hold W / T of the weight on average. Check that the "
    "softmax runs over the T keys of each trial (not over the trials), that you sum the weights of the last "
    "window keys exactly (weights[:, T - window:]), and that you average the sums over the n trials"
)


def grade_window_mass(window_mass) -> None:
    """Grade the experiment ``window_mass(T, window, n, generator, D=16)``: its measurements must fall in
    the stated band around the theory ``window / T``."""
    g = Grader("window_mass")
    with g.check("returns a Python float"):
        where, v = _mass(g, window_mass, 16, 4, 3)
        g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")
    with g.check(
        f"the kept weight is window / T within {MASS_BAND:.0%} (T, W = 64, 8; 32, 4; 256, 32; 128, 16)"
    ):
        for T, W, seed in ((64, 8, 11), (32, 4, 12), (256, 32, 13), (128, 16, 14)):
            where, v = _mass(g, window_mass, T, W, seed)
            expect_in_band(g, where, v, W / T * (1 - MASS_BAND), W / T * (1 + MASS_BAND), _MASS_WHY)
    with g.check(f"the theory holds for any D: D = 1 and D = 64 also give window / T within {MASS_BAND:.0%}"):
        for D, seed in ((1, 21), (64, 22)):
            where, v = _mass(g, window_mass, 64, 8, seed, D)
            expect_in_band(g, where, v, 0.125 * (1 - MASS_BAND), 0.125 * (1 + MASS_BAND), _MASS_WHY)
    with g.check("a window of all T keys keeps all the weight (1 up to rounding)"):
        for T in (1, 12):
            where, v = _mass(g, window_mass, T, T, 31)
            g.expect(
                _is_close_to(v, 1.0),
                f"{where} should be 1 (the softmax weights of all T keys sum to 1), got {describe(v)}",
            )
    with g.check("draws the queries, then the keys, float64, from its generator: the reference's result"):
        for T, W, seed, D in ((16, 4, 51, None), (32, 8, 52, 3), (8, 1, 53, 16)):
            where, v = _mass(g, window_mass, T, W, seed, D)
            args = (T, W, MASS_N, torch.Generator().manual_seed(seed)) + (() if D is None else (D,))
            expected = ref.window_mass(*args)
            g.expect(
                isinstance(v, float) and abs(v - expected) <= 1e-9 * max(1.0, abs(expected)),
                f"{where} with a generator seeded {seed} gave {describe(v)}, the stated procedure gives "
                f"{expected!r}: draw all queries (n, D) first, then all keys (n, T, D), with torch.randn(..., "
                "generator=generator, dtype=torch.float64), score q . k / sqrt(D) (D = 16 by default) and keep "
                "the last window keys",
            )
    with g.check("draws from its generator: the same seed gives the same result, another seed another"):
        _, a = _mass(g, window_mass, 32, 4, 41)
        _, b = _mass(g, window_mass, 32, 4, 41)
        _, c = _mass(g, window_mass, 32, 4, 42)
        g.expect(
            a == b and a != c,
            f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: draw q and k with "
            "torch.randn(..., generator=generator), not from torch's global random state",
        )
        _, d1 = _mass(g, window_mass, 32, 4, 43, 1)
        _, d8 = _mass(g, window_mass, 32, 4, 43, 8)
        g.expect(
            d1 != d8,
            f"D = 1 and D = 8 gave the same result {d1!r} from generators seeded alike: q and k have D entries "
            "each, so D must change what is drawn",
        )
    with g.check("raises ValueError for T, n or D below 1, or a window outside 1 .. T"):
        for args in ((0, 1, 10), (8, 0, 10), (8, 9, 10), (8, 2, 0)):
            expect_value_error(
                g,
                lambda args=args: window_mass(*args, _seeded(0)),
                f"window_mass{args[:3]}",
                "say which argument is out of range",
            )
        expect_value_error(g, lambda: window_mass(8, 2, 10, _seeded(0), 0), "window_mass(8, 2, 10, D=0)")
    g.finish()


def _is_close_to(v, target: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v - target) <= 1e-9


def check_window_mass(window_mass) -> None:
    """Public checks of ``window_mass``: one measurement against the theory, and a full window."""
    g = Grader("window_mass (public)")
    with g.check(f"window_mass(64, 8, {MASS_N}, generator) is 8 / 64 = 0.125 within {MASS_BAND:.0%}"):
        where, v = _mass(g, window_mass, 64, 8, 0)
        expect_in_band(g, where, v, 0.125 * (1 - MASS_BAND), 0.125 * (1 + MASS_BAND), _MASS_WHY)
    with g.check(f"window_mass(10, 10, {MASS_N}, generator) is 1"):
        where, v = _mass(g, window_mass, 10, 10, 1)
        g.expect(_is_close_to(v, 1.0), f"{where} should be 1 (all the weight), got {describe(v)}")
    g.finish()


# =========================================================================== stretch: sink_window_mask


def _sink_call(T, W, n, S):
    return f"sink_window_mask({T}, {W}, {n}{'' if S is None else f', {S}'})"


def _sink_matches(g: Grader, sink_window_mask, T, W, n, S=None) -> None:
    call = _sink_call(T, W, n, S)
    out = _run(g, call, sink_window_mask, *((T, W, n) if S is None else (T, W, n, S)))
    S_ = T if S is None else S
    g.expect(
        is_tensor(out) and tuple(out.shape) == (T, S_) and out.dtype == torch.bool,
        f"{call} should be a boolean tensor of shape ({T}, {S_}), got {describe(out)}",
    )
    expected = _window(T, S_, lambda p, j: (j <= p) & ((j > p - W) | (j < n)))
    if torch.equal(out, expected):
        return
    mistakes = [
        (
            _window(T, S_, lambda p, j: ((j <= p) & (j > p - W)) | (j < n)),
            "a sink is a key like any other: a query "
            "may not see a sink token after its own position (keep j <= p for the sinks too)",
        ),
        (
            _window(T, S_, lambda p, j: (j <= p) & (j > p - W)),
            "the sink tokens are missing: every query also sees keys j < n_sink",
        ),
        (
            _window(T, S_, lambda p, j: (j <= p) & ((j > p - W) | (j <= n))),
            "the sinks are off by one: they are the first n_sink keys, j < n_sink",
        ),
        (
            _window(T, S_, lambda p, j: (j <= p) & ((j > p - W) | (j < n - (S_ - T)))),
            "the sinks are the first n_sink KEY positions 0 .. n_sink - 1, whatever S - T is",
        ),
    ]
    for wrong, hint in mistakes:
        if torch.equal(out, wrong):
            g.fail(f"{call}: {hint}")
    rows = [i for i in range(T) if not torch.equal(out[i], expected[i])]
    g.fail(
        f"{call} differs from the definition (query p = i + S - T sees keys j <= p with p - window < j or "
        f"j < n_sink) in rows {rows[:5]}: row {rows[0]} should be {expected[rows[0]].int().tolist()}, got "
        f"{out[rows[0]].int().tolist() if is_tensor(out) else describe(out)}"
    )


def grade_sink_window_mask(sink_window_mask) -> None:
    """Grade the stretch part ``sink_window_mask(T, window, n_sink, S=None, device=None)``."""
    g = Grader("sink_window_mask")
    with g.check("query p = i + S - T sees keys j <= p with p - window < j or j < n_sink"):

        def test(case):
            T, extra, W, n, default_S = case
            _sink_matches(g, sink_window_mask, T, W, n, None if default_S and not extra else T + extra)

        for_all(
            "sink.values",
            st.tuples(
                st.integers(0, 12), st.integers(0, 5), st.integers(1, 8), st.integers(0, 6), st.booleans()
            ),
            test,
            max_examples=30,
            first=(6, 0, 2, 1, True),
        )
    with g.check("n_sink = 0 is the sliding window; sinks inside the window change nothing"):
        for T, W, S in ((6, 2, None), (3, 3, 7)):
            _sink_matches(g, sink_window_mask, T, W, 0, S)
        _sink_matches(g, sink_window_mask, 5, 9, 3)
    with g.check("with S > T keys the queries are the last T positions, the sinks the first keys"):
        for T, W, n, S in ((2, 2, 1, 6), (3, 3, 2, 10), (1, 1, 4, 9)):
            _sink_matches(g, sink_window_mask, T, W, n, S)
    with g.check("raises ValueError for a bad window or n_sink, and unless 0 <= T <= S"):
        for args in ((4, 0, 1), (4, 2, -1), (4, 2.5, 1), (4, 2, 1.5), (5, 2, 1, 3)):
            expect_value_error(g, lambda args=args: sink_window_mask(*args), f"sink_window_mask{args}")
    with g.check("builds the mask on the device asked for (device='meta')"):
        call = "sink_window_mask(3, 2, 1, 5, device='meta')"
        try:
            where = _result_device(lambda: sink_window_mask(3, 2, 1, 5, device="meta"))
        except NotImplementedError as e:
            if not meta_copy_refused(e):
                raise
            g.fail(
                f"{call}: your code read the values of a meta tensor: build the mask with torch operations only"
            )
        g.expect(
            where == "meta",
            f"{call} returned a mask on {where}: build every tensor on the device asked for "
            "(torch.arange(..., device=device), and pass device on)",
        )
    g.finish()


def check_sink_window_mask(sink_window_mask) -> None:
    """Public checks of ``sink_window_mask``: the docstring's example and the bottom-right alignment."""
    g = Grader("sink_window_mask (public)")
    with g.check("sink_window_mask(5, 2, 1) is the example of the text"):
        _sink_matches(g, sink_window_mask, 5, 2, 1)
    with g.check("sink_window_mask(2, 2, 1, 5): queries at positions 3 and 4, the sink at key 0"):
        _sink_matches(g, sink_window_mask, 2, 2, 1, 5)
    with g.check("sink_window_mask(4, 0, 1) and sink_window_mask(4, 2, -1) raise ValueError"):
        expect_value_error(g, lambda: sink_window_mask(4, 0, 1), "sink_window_mask(4, 0, 1)")
        expect_value_error(g, lambda: sink_window_mask(4, 2, -1), "sink_window_mask(4, 2, -1)")
    g.finish()

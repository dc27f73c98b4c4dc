"""Checks for Exercise 10 (long contexts).

Each graded part is a :class:`~coursekit.grading.spec.Spec`: one clause per promise of the part's text,
stated once. ``Spec.graders()`` gives the entry points the notebook calls with the student's function:
``check_*``, the *public* checks (each clause on its small fixed examples), and ``grade_*``, the *hidden*
checks (each clause on inputs :func:`~coursekit.grading.core.for_all` draws from its key across what the
text allows: sizes 0 or 1, odd, T != S, leading dimensions that broadcast, masks of every broadcastable
shape, optional arguments at non-default values, float32, float64 and half precision; then its fixed
``also`` inputs) against independent facts: plain attention from Chapter 1 with the whole ``(T, S)`` score
matrix, masks written from their definition, a token-by-token recurrence, the closed-form cache size.
Generic clauses (errors, in-place changes, the promised type, an experiment's procedure) come from
:mod:`coursekit.grading.spec`; the others are module-level tests ``_<part>_<clause>(g, student, case)``. A
clause whose hidden check runs fixed inputs before its draw, or draws from two keys, is a :class:`_Steps`.
The common mistakes are recognised first and get their own hint: an online softmax that does not rescale
its accumulator, divides too early or lets ``exp`` overflow; a window off by one, not causal or aligned to
the wrong corner; linear attention that is not causal, has no normaliser or a feature map that is not
positive; a cache size without the factor 2, with query heads, without the dtype's size or through a float.

**Devices.** A tensor made inside the student's function must be made on the inputs' device. Under the
autograder only CPU tensors cross to the student's process, so the checks set torch's default device of
that process to ``meta`` and call the function on CPU inputs: a tensor made without ``device=`` lands on
``meta`` and the call fails. A function with a ``device`` argument is called with ``device="meta"``; its
meta result cannot be sent back (torch refuses to copy data a meta tensor does not have), and that
refusal, raised outside the student's code, is how the grader learns where the result lives.

**What the checks cannot see.** Only data crosses to the student's process: the graders see values, not
memory. A tiled attention that secretly builds the whole score matrix gives the right values (the chapter
measures the difference); the causal linear attention, though, runs at ``T = 200,000``, where a ``(T, T)``
matrix does not fit.

Over 500 lines: one clause per promise of the exercise text for each graded part, with the inputs that
provoke each clause and the common mistakes each hint names; splitting it would scatter one exercise's
specification over several files.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from coursekit import attention as att
from coursekit import gpt
from coursekit import long_context as ref
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    default_device,
    describe,
    dtype_name,
    generator,
    is_tensor,
    magnitude,
    meta_copy_refused,
    probe,
    raise_unless_student_error,
    raised,
    rand,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band
from coursekit.grading.spec import Call, Clause, Spec, procedure, raises, returns, unchanged

#: the graded parts, by the names of their entry points ``check_<part>`` and ``grade_<part>``
_PARTS = ("tiled_attention", "sliding_window_mask", "causal_linear_attention", "kv_cache_size")
_PARTS += ("predict_window_pairs", "predict_kv_cache_gib", "predict_saved_per_row", "window_mass")
__all__ = [f"{verb}_{part}" for part in (*_PARTS, "sink_window_mask") for verb in ("check", "grade")]

F64, F32, F16 = torch.float64, torch.float32, torch.float16


@dataclass(frozen=True)
class _Steps(Clause):
    """A clause whose hidden check runs ``before`` (fixed inputs) ahead of its draw, then ``more`` draws,
    each ``(key, strategy, budget, first)``, then ``also``: one promise over regions of its inputs that
    have seeds of their own."""

    before: Sequence = ()
    more: Sequence = ()

    def hidden(self, g: Grader, student: object) -> None:
        for case in self.before:
            self.test(g, student, case)
        draws = [dataclasses.replace(self, before=(), more=(), also=())]
        draws += [Clause(self.text, self.test, s, key=k, budget=b, first=f) for k, s, b, f in self.more]
        for clause in draws:
            Clause.hidden(clause, g, student)
        for case in self.also:
            self.test(g, student, case)


def _one_hint(hints: list[str], what: str) -> str:
    """The hint of the one mistake an answer fits, or all of them (on a small input two can coincide)."""
    return hints[0] if len(hints) == 1 else f"this {what} fits more than one mistake: " + "; OR ".join(hints)


# =========================================================================== devices (private helpers)


def _built_on_meta(name: str, g: Grader, fn, args: tuple) -> None:
    """``fn(*args, device="meta")`` (``fn`` the student's ``name``) must build its mask on the meta device.
    Under the autograder a result on ``meta`` cannot be sent back: torch refuses to copy its data outside the
    student's code (the refusal names no line of theirs), which reads as ``"meta"``; a refusal inside their
    code (``.item()`` or ``.cpu()`` on a meta tensor) means they read the values."""
    call = f"{name}({', '.join(map(str, args))}, device='meta')"
    try:
        out = fn(*args, device="meta")
        where = out.device.type if is_tensor(out) else None
    except NotImplementedError as e:
        outside = getattr(e, "type_name", None) == "NotImplementedError" and not getattr(e, "where", "?")
        if not meta_copy_refused(e):
            raise
        if not outside:
            g.fail(
                f"{call}: your code read the values of a meta tensor ({str(e)[:80]}): build the mask with "
                "torch operations only, on device"
            )
        where = "meta"
    g.expect(
        where == "meta",
        f"{call} returned a mask on {where}: build it on the device asked for, torch.arange(..., device=device), "
        "and pass device on to any function you call",
    )


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
    "exp overflowed to inf (the output has inf or NaN) on large scores: subtract the running maximum before "
    "exp. Set m_new = max(m, max of the tile's scores) at every tile, subtract m_new before exp, and rescale "
    "the old l and acc by exp(m - m_new)"
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
    "tile partly in the future, or the mask) while the query sees keys in other tiles. exp(-inf - (-inf)) is "
    "NaN and a tile's sum can be 0: subtract 0 where the running maximum is still -inf, and divide by l only "
    "once, after the last tile"
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


@dataclass(frozen=True)
class _Tiled:
    """One call of ``tiled_attention`` (or, made by :func:`_Linear`, of ``causal_linear_attention``): the
    shapes and arguments, and a seed for the values."""

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
    eps: float | None = None  # causal_linear_attention's (None: the default)

    def inputs(self):
        q = tensor(self.seed, *self.lead[0], self.T, self.D, scale=self.size).to(self.dtype)
        k = tensor(self.seed + 1, *self.lead[1], self.S, self.D, scale=self.size).to(self.dtype)
        v = tensor(self.seed + 2, *self.lead[2], self.S, self.Dv).to(self.dtype)
        mask = None
        if self.mask is not None:
            mask = torch.rand(self.mask, generator=torch.Generator().manual_seed(self.seed + 3)) < 0.65
        return q, k, v, mask

    def kwargs(self, mask) -> dict:
        given = dict(causal=self.causal or None, mask=mask, block_q=self.block_q, block_k=self.block_k)
        given |= dict(scale=self.scale, eps=self.eps)
        return {n: a for n, a in given.items() if a is not None}

    def __str__(self) -> str:
        lengths, widths = (self.T, self.S, self.S), (self.D, self.D, self.Dv)
        q, k, v = ((*lead, n, d) for lead, n, d in zip(self.lead, lengths, widths))
        args = [f"q {q}, k {k}, v {v} ({dtype_name(self.dtype)})"]
        args += [f"{key}={val!r}" for key, val in self.kwargs(None).items()]
        return "for " + ", ".join(args + ([] if self.mask is None else [f"a boolean mask {self.mask}"]))


#: leading dimensions of (q, k, v): equal, broadcast (1 against n, missing against present), or none
_LEADS = [((), (), ()), ((2,), (2,), (2,)), ((2, 3), (2, 3), (2, 3)), ((2, 3), (1, 3), (3,)), ((3,), (), ())]
_LEADS += [((), (2,), ()), ((), (), (2,)), ((1,), (2,), (2,))]
_ONE = ((1,), (1,), (1,))  # one leading dimension of 1 on q, k and v
_TWO = ((2,), (2,), (2,))
_NONE = ((), (), ())


@st.composite
def _tiled_cases(draw, causal=False, masked=False, scales=(None,), sizes=(0.5, 1.0, 2.0), dtypes=(F64,)):
    lead = draw(st.sampled_from(_LEADS))
    T = draw(st.integers(1, 9))
    S = T + draw(st.integers(0, 5)) if causal else draw(st.integers(1, 11))
    batch = tuple(torch.broadcast_shapes(*lead))
    # boolean mask shapes broadcastable to (*batch, T, S): keys only, queries only, whole, batched
    shapes = [(S,), (1, S), (T, 1), (T, S), (*batch, T, S)] + ([(*batch[:-1], 1, T, S)] if batch else [])
    mask = draw(st.sampled_from(shapes)) if masked else None
    blocks = [None, 1, 2, 3, 4, 5, 7, 64]
    seed, D, Dv = draw(st.integers(0, 2**20)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    rest = [draw(st.sampled_from(c)) for c in (blocks, blocks, scales, sizes, dtypes)]
    return _Tiled(seed, lead, T, S, D, Dv, causal, mask, *rest)


def _tiled_mistakes(case: _Tiled, q, k, v, mask):
    """What common wrong tiled attentions return on this case (float64), with their hints."""
    kw = dict(causal=case.causal, mask=mask, block_q=case.block_q or 64, block_k=case.block_k or 64)
    kw["scale"] = scale = case.scale
    q, k, v = q.double(), k.double(), v.double()
    top_left = torch.ones(case.T, case.S, dtype=torch.bool).tril()
    top_left = top_left if mask is None else mask & top_left
    return [
        (_tiled_with(_RESCALE_ACC)(q, k, v, **kw), _NO_RESCALE_ACC),
        (_tiled_with(_RESCALE_ACC, _RESCALE_L)(q, k, v, **kw), _NO_RESCALE),
        (_tiled_with(_TILE_SOFTMAX)(q, k, v, **kw), _DIVIDE_EARLY),
        (_naive(q, k, v, mask=top_left, scale=scale) if case.causal else None, _TOP_LEFT),
        (_naive(q, k, v, case.causal, mask, scale=1.0), _SCALE_IGNORED if scale is not None else _NO_SCALE),
        (_naive(q, k, v, case.causal, mask) if scale is not None else None, _SCALE_IGNORED),
        (_naive(q, k, v, False, mask, scale) if case.causal else None, _NO_CAUSAL),
        (_naive(q, k, v, case.causal, None, scale) if mask is not None else None, _NO_MASK),
        (_naive(q, k, v, case.causal, ~mask, scale) if mask is not None else None, _MASK_INVERTED),
    ]


def _output(g: Grader, attention, case, q, k, v, kwargs: dict):
    """Call the student's attention on ``case`` (a ``_Tiled``) and check the result's type, shape and dtype."""
    out = call_student(g, str(case), attention, q, k, v, **kwargs)
    shape = (*torch.broadcast_shapes(*case.lead), case.T, case.Dv)
    g.expect(
        is_tensor(out) and tuple(out.shape) == shape and out.dtype == case.dtype,
        f"{case}: expected a {dtype_name(case.dtype)} tensor of shape (..., T, Dv) = {shape}, got {describe(out)}",
    )
    return out


def _tiled_compare(g: Grader, tiled_attention, case: _Tiled, out, q, k, v, mask, large: bool = False) -> None:
    """``out`` must equal attention with the whole score matrix on ``case``; else name the mistake. A result
    that looks like a causal or mask mistake but is right with one tile (the student's call again, with
    block_q = T and block_k = S) is a tile offset: the hint names that instead."""
    expected = _naive(q, k, v, case.causal, mask, case.scale)
    s = 1.0 / math.sqrt(q.shape[-1]) if case.scale is None else case.scale
    # what a sound attention's rounding scales with: the largest score times the largest value
    M = magnitude((q.double() @ k.double().transpose(-2, -1)) * s) * magnitude(v)
    if close(out, expected.to(case.dtype), magnitude=M):
        return
    if not bool(out.isfinite().all()):
        if large:
            g.fail(f"{case} (scores up to {M / magnitude(v):.0f}): {_MAX_OVERFLOW}")
        allowed = mask & att.causal_mask(case.T, case.S) if case.causal and mask is not None else mask
        every_query_sees = allowed is None or bool(allowed.any(-1).all())  # else some query may see no key
        g.fail(f"{case}: {_NAN_TILES if every_query_sees else _MASKED_NAN}")
    for wrong, hint in _tiled_mistakes(case, q, k, v, mask):
        if wrong is None or close(wrong.to(case.dtype), expected.to(case.dtype), magnitude=M):
            continue  # this mistake is harmless on this input
        if close(out, wrong.to(case.dtype), magnitude=M):
            if hint in _ONE_TILE and ((case.block_q or 64) < case.T or (case.block_k or 64) < case.S):
                whole = dataclasses.replace(case, block_q=case.T, block_k=case.S)
                kwargs = whole.kwargs(None if mask is None else mask.clone())
                try:
                    one_tile = tiled_attention(q.clone(), k.clone(), v.clone(), **kwargs)
                except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
                    raise_unless_student_error(e)
                    one_tile = None
                if close(one_tile, expected.to(case.dtype), magnitude=M):
                    g.fail(f"{case}: {_ONE_TILE[hint]}")
            g.fail(f"{case}: {hint}")
    worst = (out.double() - expected).abs().max().item()
    g.fail(
        f"{case}: the result differs from attention with the whole score matrix, "
        f"scaled_dot_product_attention(q, k, v, mask)[0] (largest difference {worst:.3g})"
    )


def _tiled_matches(g: Grader, tiled_attention, case, large: bool = False) -> None:
    """A ``_Tiled``, or a fixed input of :data:`_LARGE` by name."""
    case, q, k, v, mask = (case, *case.inputs()) if isinstance(case, _Tiled) else _LARGE[case]()
    out = _output(g, tiled_attention, case, q, k, v, case.kwargs(mask))
    _tiled_compare(g, tiled_attention, case, out, q, k, v, mask, large)


#: one call in each dtype, causal every other time
_DTYPES = [
    _Tiled(70 + i, _TWO, 5, 7, 4, 3, causal=i % 2 == 1, block_q=2, block_k=3, dtype=dtype)
    for i, dtype in enumerate((F64, F32, torch.float16, torch.bfloat16))
]


#: batched masks ``(*batch, 3, 5)`` where one of q, k, v holds the batch
_BATCHED_MASKS = [
    _Tiled(40 + i, lead, 3, 5, 2, 2, i % 2 == 0, (*torch.broadcast_shapes(*lead), 3, 5), 2, 2)
    for i, lead in enumerate((((2,), (), ()), ((), (2,), ()), ((), (), (2,)), ((3, 2), (2,), (1, 2))))
]


def _ramp(T: int, S: int, D: int, Dv: int, top: float, name: str, block_q: int, block_k: int):
    """Queries of 10s against keys growing from 0 to ``top``: scores up to ``10 D top``, the largest at
    the last keys, so every tile raises the running maximum."""
    q = torch.full((1, T, D), 10.0, dtype=F64)
    k = torch.linspace(0, top, S, dtype=F64)[None, :, None].expand(1, S, D).contiguous()
    case = _Tiled(0, _ONE, T, S, D, Dv, block_q=block_q, block_k=block_k, scale=1.0)
    return case, q, k, rand(name, 1, S, Dv), None


def _rows_apart():
    """Rows of very different sizes: one maximum for all the rows underflows the small ones."""
    q = rand("tiled.rows.q", 2, 6, 4) * torch.tensor([60.0, 1.0, -40.0, 0.01, 30.0, 1.0], dtype=F64)[:, None]
    k, v = rand("tiled.rows.k", 2, 9, 4, scale=3.0), rand("tiled.rows.v", 2, 9, 3)
    return _Tiled(0, _TWO, 6, 9, 4, 3, block_q=3, block_k=4), q, k, v, None


#: the fixed inputs of the stability clause, by name: scores up to 2400 in float64, rows of very different sizes
_LARGE = {
    "overflow": lambda: _ramp(5, 40, 4, 3, 60.0, "tiled.overflow.v", 2, 8),
    "public.overflow": lambda: _ramp(3, 12, 2, 2, 120.0, "public.tiled.large.v", 2, 4),
    "rows": _rows_apart,
}


def _tiled_empty(g: Grader, tiled_attention, case) -> None:
    """Inputs where some queries (``rows``) may attend to no key."""
    if case == "public":
        q, k, v = (rand(f"public.tiled.empty.{n}", 1, T, 2) for n, T in zip("qkv", (3, 4, 4)))
        mask = torch.tensor([[True, False, True, False], [False] * 4, [False, False, False, True]])
        call, rows = _Tiled(0, _ONE, 3, 4, 2, 2, mask=(3, 4), block_q=2, block_k=2), [1]
    else:
        causal, block_q, block_k = case
        q, k, v = (rand(f"tiled.empty.{n}", 2, T, d) for n, T, d in zip("qkv", (6, 8, 8), (3, 3, 2)))
        mask = torch.rand(6, 8, generator=generator("tiled.empty")) < 0.6
        mask[[1, 4]] = False  # these queries see nothing
        mask[2, :4] = False  # this one sees keys only in the later tiles
        call, rows = _Tiled(0, _TWO, 6, 8, 3, 2, causal, (6, 8), block_q, block_k), [1, 4]
    out = _output(g, tiled_attention, call, q, k, v, call.kwargs(mask))
    who = f"quer{'ies' if len(rows) > 1 else 'y'} {' and '.join(map(str, rows))}"
    g.expect(bool(out.isfinite().all()), f"{call} where {who} may attend to no key: {_MASKED_NAN}")
    empty = out[..., rows, :]
    g.expect(
        close(empty, torch.zeros(empty.shape, dtype=out.dtype)),
        f"{call}: {who} may attend to no key, so their outputs must be 0, got {empty.tolist()}",
    )
    _tiled_compare(g, tiled_attention, call, out, q, k, v, mask)


def _expect_gradients(g: Grader, fn, where: str, qkv, kwargs: dict, up, reference, of: str) -> None:
    """The gradients of ``fn(q, k, v, **kwargs)`` against upstream ``up`` equal ``reference``'s."""
    p = probe(fn, *(t.clone().requires_grad_() for t in qkv), backward=(None, up), **kwargs)
    g.expect(
        is_tensor(p.result) and p.result.requires_grad,
        f"{where}: the output does not depend on q, k, v through autograd: avoid .detach(), .item(), .data or "
        "torch.tensor(...) on them",
    )
    refs = [t.clone().requires_grad_() for t in qkv]
    (reference(*refs) * up).sum().backward()
    for name, got, want in zip("qkv", p.grads or [None] * 3, refs):
        g.expect(
            is_tensor(got) and close(got, want.grad),
            f"{where}: the gradient with respect to {name} differs from {of}",
        )


def _tiled_gradients(g: Grader, tiled_attention, case: str) -> None:
    if case == "public":
        q, k, v = (rand(f"public.tiled.grad.{n}", 1, T, 2) for n, T in zip("qkv", (3, 4, 4)))
        kwargs, up = dict(block_q=2, block_k=2), torch.ones(1, 3, 2, dtype=F64)
        where = "for q (1, 3, 2), k (1, 4, 2), v (1, 4, 2), block_q=2 and block_k=2"
    else:
        q, k, v = rand("tiled.grad.q", 2, 7, 4), rand("tiled.grad.k", 1, 9, 4), rand("tiled.grad.v", 9, 3)
        mask = torch.rand(9, generator=generator("tiled.grad.mask")) < 0.7
        kwargs, up = dict(causal=True, mask=mask, block_q=3, block_k=2), rand("tiled.grad.up", 2, 7, 3)
        where = "for q (2, 7, 4), k (1, 9, 4), v (9, 3), causal=True and a mask (9,)"
    reference = functools.partial(_naive, causal=kwargs.get("causal", False), mask=kwargs.get("mask"))
    _expect_gradients(g, tiled_attention, where, (q, k, v), kwargs, up, reference, "plain attention's")


def _tiled_inplace(g: Grader, tiled_attention, case: str) -> None:
    q, k, v = rand(f"{case}.q", 2, 5, 3), rand(f"{case}.k", 2, 6, 3), rand(f"{case}.v", 2, 6, 2)
    mask = torch.rand(5, 6, generator=generator(case)) < 0.6
    p = probe(
        tiled_attention, q.clone(), k.clone(), v.clone(), mask=mask.clone(), block_q=2, block_k=4, scale=0.7
    )
    after = (*p.args, p.kwargs.get("mask") if isinstance(p.kwargs, dict) else None)
    for name, before, now in zip(("q", "k", "v", "mask"), (q, k, v, mask), after):
        g.expect(
            is_tensor(now) and torch.equal(now, before),
            f"tiled_attention changed its argument {name} in place: work on new tensors (q * scale, not q *= "
            "scale or q.mul_(scale))",
        )


def _tiled_device(g: Grader, tiled_attention, case: _Tiled) -> None:
    """The call with torch's default device set to ``meta`` in the student's process (inputs on the CPU):
    a tensor made on the default device instead of q's fails."""
    q, k, v, mask = case.inputs()
    args, kwargs = (q.clone(), k.clone(), v.clone()), case.kwargs(None if mask is None else mask.clone())
    fix = (
        "make every tensor on q's device: torch.full(..., device=q.device), torch.zeros(..., device=q.device), "
        "torch.arange(..., device=q.device), or new_full / zeros_like"
    )
    try:
        with default_device():
            out = tiled_attention(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        if not meta_copy_refused(e):
            raise_unless_student_error(e)
        g.fail(
            f"{case}, with torch's default device set to another device than the inputs' (meta), your code "
            f"raised {type(e).__name__.removeprefix('Student')} ({str(e)[:150]}): {fix}"
        )
    if is_tensor(out) and out.device.type != "cpu":
        g.fail(
            f"{case}, with torch's default device set to meta, your result is on {out.device.type}, not on the "
            f"inputs' device (cpu): {fix}"
        )
    g.expect(is_tensor(out), f"{case}: expected a tensor, got {describe(out)}")
    _tiled_compare(g, tiled_attention, case, out, q, k, v, mask)


#: calls the text rules out, by their description (the first four public): the tensors (of x (1, 4, 2),
#: y (1, 3, 2), w (1, 4, 3)) and keyword arguments
_TILED_BAD = {
    "block_q=0": ("xxx", dict(block_q=0)),
    "block_q=2 and block_k=-1": ("xxx", dict(block_q=2, block_k=-1)),
    "causal=True with T=4 queries and S=3 keys": ("xyy", dict(causal=True)),
    "k (1, 4, 2) and v (1, 3, 2) of different lengths": ("xxy", {}),
    "block_k=0": ("xxx", dict(block_k=0)),
    "block_q=-2": ("xxx", dict(block_q=-2, block_k=3)),
    "block_k=-3": ("xxx", dict(block_q=64, block_k=-3)),
    "q (1, 4, 2) and k (1, 4, 3) of different widths": ("xwx", {}),
    "a mask (5, 4) for 4 queries and 4 keys": ("xxx", dict(mask=(5, 4))),
}


def _tiled_bad(case: str) -> Call:
    names, kwargs = _TILED_BAD[case]
    x = dict(x=rand("tiled.bad.x", 1, 4, 2), y=rand("tiled.bad.y", 1, 3, 2), w=rand("tiled.bad.w", 1, 4, 3))
    kwargs = {n: torch.ones(a, dtype=torch.bool) if n == "mask" else a for n, a in kwargs.items()}
    return Call(case, tuple(x[n] for n in names), kwargs)


def _tiled_mistyped(case: str) -> Call:
    x = rand("tiled.type", 1, 4, 2)
    if case == "q, v float64 and k float32":
        return Call(case, (x, x.float(), x))
    mask = {"a float64 mask": torch.zeros(4, 4, dtype=F64), "a long mask": torch.ones(4, 4, dtype=torch.long)}
    return Call(case, (x, x, x), dict(mask=mask[case]))


_CHECK_INPUTS = "call check_attention_inputs(q, k, v, mask) first"

TILED = Spec(
    "tiled_attention",
    [
        Clause(
            "returns (..., T, Dv) in q's dtype: float64, float32, float16 and bfloat16",
            _tiled_matches,
            examples=_DTYPES[1:],
            also=_DTYPES[:1],
        ),
        Clause(
            "equals attention with the whole score matrix, for any tiles (the default, 1, tiles that do not "
            "divide T or S) and leading dimensions (none, several, broadcast between q, k and v)",
            _tiled_matches,
            _tiled_cases(dtypes=(F64, F64, F32)),
            key="tiled.values",
            budget="many",
            # 6 queries and keys in tiles of 2 and 4; the default tiles with q (2, 3, 4) and k, v (3, 6, 4)
            examples=[
                _Tiled(seed=1, lead=_NONE, T=4, S=4, D=3, Dv=2),  # one head, four queries and keys
                _Tiled(11, _ONE, 6, 6, 4, 2, block_q=2, block_k=4, size=2.0),
                _Tiled(12, ((2, 3), (3,), (3,)), 4, 6, 4, 2),
            ],
        ),
        Clause(
            "causal=True: query i sees keys j <= i + S - T (bottom-right), with S == T and S > T",
            _tiled_matches,
            _tiled_cases(causal=True),
            key="tiled.causal",
            budget="more",
            # 3 queries and 6 keys: the queries are positions 3, 4, 5
            examples=[
                _Tiled(2, _NONE, 2, 5, 3, 2, True, block_q=1, block_k=2),
                _Tiled(13, _ONE, 3, 6, 4, 2, True, block_q=2, block_k=4),
            ],
        ),
        _Steps(
            "mask: boolean, True = may attend, of any shape that broadcasts to (..., T, S), and with causal=True "
            "a key must be allowed by both",
            _tiled_matches,
            _tiled_cases(masked=True),
            key="tiled.mask",
            # the second example's mask (6,) is over the keys only
            examples=[
                _Tiled(3, _TWO, 3, 5, 2, 2, mask=(3, 5), block_q=2, block_k=2),
                _Tiled(14, _ONE, 6, 6, 4, 2, True, (6,), 4, 2),
            ],
            more=[
                (
                    "tiled.mask.causal",
                    _tiled_cases(causal=True, masked=True),
                    "some",
                    _Tiled(4, _TWO, 3, 5, 2, 2, True, (5,), 2, 2),
                )
            ],
            also=_BATCHED_MASKS,
        ),
        Clause(
            "a query that may attend to no key gets a zero output, not NaN",
            _tiled_empty,
            examples=["public"],
            also=[(False, 2, 4), (True, 3, 2), (False, 64, 64)],
        ),
        Clause(
            "scale multiplies the scores: any value (0, negative, large); the default is 1 / sqrt(D)",
            _tiled_matches,
            _tiled_cases(scales=(None, 0.0, 0.3, 1.0, 2.5, -0.7)),
            key="tiled.scale",
            budget="more",
            examples=[
                _Tiled(5, _NONE, 3, 4, 4, 2, scale=0.0),
                _Tiled(15, _NONE, 4, 5, 3, 2, block_q=3, block_k=2, scale=0.5),
            ],
        ),
        _Steps(
            "stable for large scores: the running maximum follows the scores (float64 and float32, rows of very "
            "different sizes)",
            functools.partial(_tiled_matches, large=True),
            _tiled_cases(causal=True, sizes=(12.0, 25.0), dtypes=(F64, F32)),
            key="tiled.large",
            budget="small",
            first=_Tiled(6, _NONE, 4, 6, 4, 2, True, block_q=2, block_k=2, size=25.0, dtype=F32),
            # scores up to 2400 in float64, and up to about 500 in float32
            examples=[
                "public.overflow",
                _Tiled(17, _NONE, 4, 4, 4, 2, block_q=2, block_k=2, size=20.0, dtype=F32),
            ],
            before=["overflow"],
            also=["rows"],
        ),
        Clause(
            "gradients reach q, k and v and equal plain attention's",
            _tiled_gradients,
            examples=["public"],
            also=["tiled.grad"],
        ),
        Clause("does not change q, k, v or the mask in place", _tiled_inplace, examples=["tiled.inplace"]),
        Clause(
            "makes its tensors on q's device, not on torch's default device",
            _tiled_device,
            examples=[_Tiled(19, _NONE, 3, 4, 2, 2, True, block_q=2, block_k=2)],
            also=[_Tiled(7, _TWO, 5, 7, 3, 2, True, (5, 7), 2, 3)],
        ),
        raises(
            _tiled_bad,
            fix=f"block sizes must be >= 1 and causal needs S >= T; for the shapes, {_CHECK_INPUTS}",
            text="raises ValueError for block sizes below 1, causal with S < T, and shapes that do not fit",
            examples=list(_TILED_BAD)[:4],
            also=list(_TILED_BAD)[4:],
        ),
        raises(
            _tiled_mistyped,
            fix=f"the mask must be boolean (True = may attend), and q, k, v share a dtype: {_CHECK_INPUTS}",
            text="raises TypeError for a mask that is not boolean, or q, k, v of different dtypes",
            examples=["a float64 mask"],
            also=["a long mask", "q, v float64 and k float32"],
            error=TypeError,
        ),
    ],
)
check_tiled_attention, grade_tiled_attention = TILED.graders()


# =========================================================================== part 2: sliding-window mask


def _window(T, S, allowed) -> torch.Tensor:
    """A (T, S) mask from a predicate on (query position p, key position j)."""
    p = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    return allowed(p, j).expand(T, S)


_OFF_BY_ONE = (
    "the window is off by one: it holds W {} 1 keys. Query p sees keys p - W < j <= p, itself and the W - 1 "
    "before it"
)


def _window_mistakes(T, S, W):
    """What common wrong masks are for ``sliding_window_mask(T, W, S)``, with their hints."""
    top = S - T  # how far the top-left alignment shifts the queries
    return [
        (_window(T, S, wrong), hint)
        for wrong, hint in [
            (lambda p, j: (j <= p) & (j >= p - W), _OFF_BY_ONE.format("+")),
            (lambda p, j: (j <= p) & (j > p - W + 1), _OFF_BY_ONE.format("-")),
            (
                lambda p, j: (j < p) & (j >= p - W),
                "the window leaves out the query itself: query p sees keys p - W < j <= p, itself included",
            ),
            (
                lambda p, j: (p - j).abs() < W,
                "the window is not causal: it lets a query see keys after it. Keep only keys j <= p (and j > p - W)",
            ),
            (
                lambda p, j: (j >= p) & (j < p + W),
                "the window looks into the future: a query sees itself and the keys BEFORE it, p - W < j <= p",
            ),
            (
                lambda p, j: (j <= p - top) & (j > p - top - W),
                "the mask is aligned to the top left: with S > T keys, query i sits at position p = i + S - T",
            ),
            (
                lambda p, j: j <= p,
                "the window is ignored: query p sees only keys p - W < j <= p, not all earlier keys",
            ),
            (
                lambda p, j: (j > p) | (j <= p - W),
                "the mask is inverted: True means the query MAY attend to the key",
            ),
        ]
    ]


def _mask_call(name: str, case) -> Call:
    """``name(*case)``, its last argument ``S`` left out where it is None."""
    args = case[:-1] if case[-1] is None else case
    return Call(f"{name}({', '.join(map(str, args))})", args)


def _undrawn(case, n: int) -> tuple:
    """A drawn ``(T, S - T, *rest, whether S is left out)`` of ``n`` entries as the call's ``(T, *rest, S)``
    (``S`` None: left out); a fixed case as it is."""
    if len(case) != n:
        return case
    T, extra, *rest, default_S = case
    return (T, *rest, None if default_S and not extra else T + extra)


def _mask_verdict(g: Grader, mask_fn, name: str, case, allowed, mistakes, definition: str) -> None:
    """``name(*case)`` (see :func:`_mask_call`) must be the boolean (T, S) mask of ``allowed``, a predicate on
    (query position p, key position j); else the hint of the named mistake (``(mask, hint)``) it equals, else
    its first wrong row against ``definition``."""
    c = _mask_call(name, case)
    out = call_student(g, c.where, mask_fn, *c.args)
    expected = _window(case[0], case[-1] or case[0], allowed)
    T, S = expected.shape
    g.expect(
        is_tensor(out) and tuple(out.shape) == (T, S) and out.dtype == torch.bool,
        f"{c.where} should be a boolean tensor of shape ({T}, {S}), got {describe(out)}",
    )
    if torch.equal(out, expected):
        return
    hints = list(
        dict.fromkeys(h for m, h in mistakes if not torch.equal(m, expected) and torch.equal(out, m))
    )
    if hints:
        g.fail(f"{c.where}: {_one_hint(hints, 'mask')}")
    rows = [i for i in range(T) if not torch.equal(out[i], expected[i])]
    g.fail(
        f"{c.where} differs from the definition ({definition}) in rows {rows[:5]}: row {rows[0]} should be "
        f"{expected[rows[0]].int().tolist()}, got {out[rows[0]].int().tolist()}"
    )


def _window_matches(g: Grader, sliding_window_mask, case, edges: bool = False) -> None:
    """``(T, W, S)`` (``S`` None: left out), or a drawn ``(T, S - T, W, whether S is left out)``: the mask of the
    definition, or the named mistake's hint. With ``edges``, the definition the hint states is the edge's: a
    window of at least S keys is the causal mask, a window of 1 the diagonal."""
    T, W, S = case = _undrawn(case, 4)
    definition = "query p = i + S - T sees keys p - W < j <= p"
    if edges:
        definition = f"a window of {W} >= S keys is the causal mask causal_mask(T, S)"
        definition = "with window 1 a query sees only itself" if W == 1 else definition
    allowed, mistakes = (lambda p, j: (j <= p) & (j > p - W)), _window_mistakes(T, S or T, W)
    _mask_verdict(g, sliding_window_mask, "sliding_window_mask", case, allowed, mistakes, definition)


def _window_bad(case) -> Call:
    why = ": more queries than keys" if len(case) == 3 and case[0] > case[2] else ""
    return Call(f"sliding_window_mask{case}{why}", case)


WINDOW = Spec(
    "sliding_window_mask",
    [
        returns(
            functools.partial(_mask_call, "sliding_window_mask"),
            lambda case: torch.empty(case[0], case[0] if case[2] is None else case[2], dtype=torch.bool),
            text="returns a (T, S) boolean tensor, S = T by default; T = 0 gives an empty mask",
            examples=[(5, 2, None), (0, 3, 4)],
            also=[(3, 2, 6), (1, 1, None), (0, 2, None)],
        ),
        Clause(
            "query p = i + S - T sees the keys p - window < j <= p (itself and the window - 1 before it)",
            _window_matches,
            st.tuples(st.integers(0, 12), st.integers(0, 5), st.integers(1, 14), st.booleans()),
            key="window.values",
            budget="widest",
            # the first is the text's example: sliding_window_mask(4, 2) is [[1,0,0,0], [1,1,0,0], [0,1,1,0], [0,0,1,1]]
            examples=[(4, 0, 2, True)],
            also=[(4, 0, 2, True), (9, 0, 3, True), (16, 0, 5, True), (6, 0, 1, True)],
        ),
        Clause(
            "a window as long as the keys (or longer) is the causal mask; window 1 is the diagonal",
            functools.partial(_window_matches, edges=True),
            examples=[(3, 5, None), (3, 1, 7)],
            also=[(7, 7, None), (7, 50, None), (3, 6, 6), (4, 9, 6), (5, 1, None)],
        ),
        Clause(
            "with S > T keys the queries are the last T positions (bottom-right)",
            _window_matches,
            examples=[(2, 3, 5)],  # the two queries are positions 3 and 4
            also=[(3, 2, 8), (4, 3, 5), (1, 4, 9), (5, 10, 12)],
        ),
        Clause(
            "builds the mask on the device asked for (device='meta')",
            functools.partial(_built_on_meta, "sliding_window_mask"),
            examples=[(3, 2, 7)],
            also=[(4, 2, 4)],
        ),
        raises(
            _window_bad,
            fix="the window must be a positive integer, and 0 <= T <= S",
            text="raises ValueError unless window is a positive integer, and unless 0 <= T <= S",
            examples=[(4, 0), (4, 2.5), (5, 2, 3)],
            also=[(4, -3), (4, 2.0), (-1, 2), (-2, 2, 3)],
        ),
    ],
)
check_sliding_window_mask, grade_sliding_window_mask = WINDOW.graders()


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


def _Linear(seed, lead, T, D, Dv, eps=None, size=1.0, dtype=F64) -> _Tiled:
    """One call of ``causal_linear_attention``: as many keys as queries, and ``eps`` (None: the default)."""
    return _Tiled(seed, lead, T, T, D, Dv, size=size, dtype=dtype, eps=eps)


@st.composite
def _linear_cases(draw, eps=(None,), dtypes=(F64,)):
    sizes = (st.integers(1, 12), st.integers(1, 5), st.integers(1, 4), st.sampled_from(eps))
    seed, lead = draw(st.integers(0, 2**20)), draw(st.sampled_from(_LEADS))
    rest = (*sizes, st.sampled_from((0.5, 1.0, 2.5)), st.sampled_from(dtypes))
    return _Linear(seed, lead, *(draw(s) for s in rest))


def _linear_matches(g: Grader, causal_linear_attention, case: _Tiled) -> None:
    q, k, v, _ = case.inputs()
    out = _output(g, causal_linear_attention, case, q, k, v, case.kwargs(None))
    eps = 1e-6 if case.eps is None else case.eps
    expected = _recurrence(q, k, v, eps)
    M = magnitude(ref.elu_feature_map(q.double()), ref.elu_feature_map(k.double()), v)
    if close(out, expected.to(case.dtype), magnitude=M):
        return
    for wrong, hint in _linear_mistakes(q, k, v, eps):
        if not close(wrong.to(case.dtype), expected.to(case.dtype), magnitude=M):
            g.expect(not close(out, wrong.to(case.dtype), magnitude=M), f"{case}: {hint}")
    g.fail(
        f"{case}: the result differs from the token-by-token recurrence of linear attention "
        f"(largest difference {(out.double() - expected).abs().max().item():.3g})"
    )


def _linear_future(g: Grader, causal_linear_attention, case: str) -> None:
    """Changing the keys and values after position 7 leaves the outputs of queries 0 .. 7 unchanged."""
    q, k, v = rand(f"{case}.q", 2, 12, 4), rand(f"{case}.k", 2, 12, 4), rand(f"{case}.v", 2, 12, 3)
    k2, v2 = k.clone(), v.clone()
    k2[:, 8:], v2[:, 8:] = rand(f"{case}.k2", 2, 4, 4, scale=3.0), rand(f"{case}.v2", 2, 4, 3, scale=3.0)
    where = "for q, k (2, 12, 4) and v (2, 12, 3)"
    a = call_student(g, where, causal_linear_attention, q, k, v)
    b = call_student(g, f"{where} with keys and values 8 .. 11 changed", causal_linear_attention, q, k2, v2)
    g.expect(
        is_tensor(a)
        and is_tensor(b)
        and tuple(a.shape) == tuple(b.shape) == (2, 12, 3)
        and close(b[:, :8], a[:, :8]),
        f"{where}, changing keys and values 8 .. 11 changed the outputs of queries 0 .. 7: {_NOT_CAUSAL}",
    )


def _linear_gradients(g: Grader, causal_linear_attention, case: str) -> None:
    if case == "public":
        q, k, v = (rand(f"public.lin.grad.{n}", 1, 4, 2) for n in "qkv")
        eps, up, where = None, torch.ones(1, 4, 2, dtype=F64), "for q, k, v (1, 4, 2)"
    else:
        q, k, v = rand("lin.grad.q", 2, 6, 3), rand("lin.grad.k", 2, 6, 3), rand("lin.grad.v", 2, 6, 2)
        eps, up, where = 0.1, rand("lin.grad.up", 2, 6, 2), "for q, k (2, 6, 3), v (2, 6, 2) and eps=0.1"
    reference = functools.partial(_recurrence, eps=eps or 1e-6)
    kwargs = {} if eps is None else dict(eps=eps)
    _expect_gradients(g, causal_linear_attention, where, (q, k, v), kwargs, up, reference, "the recurrence's")


def _linear_long(g: Grader, causal_linear_attention, case) -> None:
    """``T`` tokens, far more than a ``(T, T)`` matrix allows at 200,000."""
    name, T = case
    q, k, v = (rand(f"{name}.{n}", T, 2) for n in "qkv")
    try:
        out = causal_linear_attention(q.clone(), k.clone(), v.clone())
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(
            f"with T = {T:,} {raised(e)}: a (T, T) matrix of float64 needs {T * T * 8 / 2**30:,.0f} GiB. Use "
            "running sums (cumsum), whose memory grows like T D Dv"
        )
    g.expect(
        is_tensor(out) and out.shape == (T, 2) and bool(out.isfinite().all()),
        f"with T = {T:,} expected a finite ({T}, 2) tensor, got {describe(out)}",
    )
    g.expect(
        close(out, ref.causal_linear_attention(q, k, v)),
        f"with T = {T:,} the result differs from the reference",
    )


#: calls the text rules out, by their description: the tensors (of q (1, 5, 2), a its first 3 positions,
#: b its first 4, w (1, 5, 3)) and the keyword arguments, or eps by position
_LINEAR_BAD = {
    "q with 5 positions and k, v with 3": ("qaa", {}),
    "eps=-0.001": ("qqq", dict(eps=-1e-3)),
    "eps=-0.5": ("qqq", -0.5),  # eps passed by position
    "q (1, 5, 2) and k (1, 5, 3) of different widths": ("qwq", {}),
    "k (1, 5, 2) and v (1, 4, 2)": ("qqb", {}),
}


def _linear_bad(case: str) -> Call:
    names, eps = _LINEAR_BAD[case]
    q = rand("lin.bad", 1, 5, 2)
    x = dict(q=q, a=q[:, :3], b=q[:, :4], w=rand("lin.bad.w", 1, 5, 3))
    args = tuple(x[n] for n in names)
    return Call(case, args, eps) if isinstance(eps, dict) else Call(case, (*args, eps))


def _linear_kept(case: str) -> Call:
    q, k, v = rand(f"{case}.q", 2, 5, 3), rand(f"{case}.k", 2, 5, 3), rand(f"{case}.v", 2, 5, 2)
    return Call("causal_linear_attention(q, k (2, 5, 3), v (2, 5, 2))", (q, k, v))


LINEAR = Spec(
    "causal_linear_attention",
    [
        returns(
            lambda c: Call(str(c), c.inputs()[:3], c.kwargs(None)),
            lambda c: torch.empty((*torch.broadcast_shapes(*c.lead), c.T, c.Dv), dtype=c.dtype),
            text="returns (..., T, Dv) in q's dtype (float64, float32), with no, one or several leading dimensions",
            examples=[_Linear(31, ((2, 3), (2, 3), (2, 3)), 5, 4, 3, dtype=F32)],
            also=[
                _Linear(30, _NONE, 5, 4, 3),
                _Linear(32, _TWO, 5, 4, 3),
                _Linear(33, ((1, 3), (3,), (2, 1, 1)), 5, 4, 3, dtype=F32),
            ],
        ),
        Clause(
            "equals the token-by-token recurrence (T from 1, leading dimensions that broadcast, float32 and "
            "float64)",
            _linear_matches,
            _linear_cases(dtypes=(F64, F64, F32)),
            key="lin.values",
            budget="wide",
            # 5 tokens: the causal weights phi(q_i) . phi(k_j), j <= i, normalised
            examples=[_Linear(1, _NONE, 4, 3, 2), _Linear(41, _ONE, 5, 3, 2)],
        ),
        Clause(
            "causal: changing later keys and values leaves earlier outputs unchanged",
            _linear_future,
            examples=["lin.future"],
        ),
        Clause(
            "eps is added to each normaliser, at any value (0, the default 1e-6, 0.5, 3)",
            _linear_matches,
            _linear_cases(eps=(0.0, 1e-6, 0.5, 3.0)),
            key="lin.eps",
            examples=[_Linear(2, _NONE, 5, 3, 2, eps=0.5), _Linear(45, _ONE, 5, 3, 2, eps=0.0)],
        ),
        Clause(
            "gradients reach q, k and v and equal the recurrence's",
            _linear_gradients,
            examples=["public"],
            also=["lin.grad"],
        ),
        unchanged(
            _linear_kept,
            text="does not change q, k or v in place",
            advice="work on new tensors (arguments 1, 2 and 3 are q, k and v)",
            examples=["lin.inplace"],
        ),
        Clause(
            "linear in T: 200,000 tokens without a (T, T) matrix",
            _linear_long,
            examples=[("public.lin.long", 20_000)],
            also=[("lin.long", 200_000)],
        ),
        raises(
            _linear_bad,
            fix="q and k need as many positions, eps must be >= 0; for the shapes, call "
            "check_attention_inputs(q, k, v) first",
            text="raises ValueError for q and k of different lengths, eps < 0, and shapes that do not fit",
            examples=list(_LINEAR_BAD)[:2],
            also=list(_LINEAR_BAD)[2:],
        ),
    ],
)
check_causal_linear_attention, grade_causal_linear_attention = LINEAR.graders()


# =========================================================================== part 4: KV-cache size


def _kv(L, H_kv, D, T, B=1, nbytes=2) -> int:
    return 2 * L * H_kv * D * T * B * nbytes


_BYTES = {F16: 2, torch.bfloat16: 2, F32: 4, F64: 8, torch.int8: 1, torch.uint8: 1}
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
_ROUNDED = (
    "the size went through a float (a true division /, float bits or bytes, 2.0 *), which rounds above 2**53, "
    "about 9e15 bytes: compute with ints only (element_size(), * and //) so that the size is exact at any scale"
)


def _kv_expected(L, H, D, T, H_kv=None, B=1, dtype=F16, W=None):
    """(kwargs, expected bytes, [(wrong bytes, hint), ...]) of one call."""
    h_kv, nbytes, tokens = H if H_kv is None else H_kv, _BYTES[dtype], T if W is None else min(T, W)
    kwargs = dict(n_layers=L, n_heads=H, d_head=D, seq_len=T)
    given = dict(n_kv_heads=(H_kv, None), batch=(B, 1), dtype=(dtype, F16), window=(W, None))
    kwargs |= {key: value for key, (value, default) in given.items() if value != default}
    expected = _kv(L, h_kv, D, tokens, B, nbytes)
    wrong = [(expected // 2, _NO_TWO), (_kv(L, H, D, tokens, B, nbytes), _QUERY_HEADS)]
    wrong += [(_kv(L, h_kv, D, tokens, B, n), _DTYPE) for n in (2, 4)] + [(expected * 8, _BITS)]
    wrong += [(_kv(L, h_kv, D, T, B, nbytes), _WINDOW), (_kv(L, h_kv, D, W or T, B, nbytes), _WINDOW_MIN)]
    return kwargs, expected, [*wrong, (_kv(L, h_kv, D, tokens, 1, nbytes), _BATCH)]


#: fixed calls (arguments of :func:`_kv_expected`): MHA, GQA and MQA, then sliding windows
_KV_CASES = [(32, 32, 128, 4096, None, 1, F16, None), (80, 64, 128, 1000, 8, 3, torch.bfloat16, None)]
_KV_CASES += [(4, 8, 16, 50, 1, 2, F32, None), (32, 32, 128, 131072, 8, 1, F16, 4096)]
_KV_CASES += [(6, 12, 64, 300, 4, 2, F32, 1024), (2, 4, 8, 9, 2, 5, F64, 4)]


def _kv_cases():
    """Fixed cases: (kwargs, expected bytes, [(wrong bytes, hint), ...])."""
    return [_kv_expected(*args) for args in _KV_CASES]


@st.composite
def _kv_calls(draw):
    H = draw(st.sampled_from((1, 2, 3, 4, 6, 8, 12)))
    H_kv = draw(st.sampled_from([None] + [d for d in range(1, H + 1) if H % d == 0]))
    L, D, T, B = (draw(st.integers(*bounds)) for bounds in ((1, 40), (1, 160), (0, 5000), (1, 6)))
    dtype, W = draw(st.sampled_from(list(_BYTES))), draw(st.sampled_from((None, 1, 7, 64, 4096)))
    return L, H, D, T, H_kv, B, dtype, W


def _kv_int(g: Grader, kv_cache_size, args: tuple) -> None:
    out = call_student(g, f"kv_cache_size{args}", kv_cache_size, *args)
    g.expect(type(out) is int, f"kv_cache_size{args} should return an int (bytes), got {describe(out)}")


def _kv_case(g: Grader, kv_cache_size, args: tuple, exact: bool = False) -> None:
    """``args`` of :func:`_kv_expected`: the size, with the named mistakes' hints; ``exact``: sizes past 2**53
    bytes, where a float cannot hold every integer, and the hint names the rounding."""
    kwargs, expected, wrong = _kv_expected(*args)
    wrong = [(int(float(expected)), _ROUNDED)] * exact + wrong
    call = ", ".join(f"{k}={dtype_name(v) if isinstance(v, torch.dtype) else v}" for k, v in kwargs.items())
    out = call_student(g, f"kv_cache_size({call})", kv_cache_size, **kwargs)
    g.expect(type(out) is int, f"kv_cache_size({call}) should return an int (bytes), got {describe(out)}")
    # a value can fit two mistakes (float32 without the factor 2 = float32 counted as 2 bytes)
    hints = list(dict.fromkeys(hint for value, hint in wrong if value != expected and out == value))
    if out != expected and hints:
        g.fail(f"{_one_hint(hints, 'value')} (kv_cache_size({call}) returned {out:,}, expected {expected:,})")
    g.expect(
        out == expected,
        f"kv_cache_size({call}) returned {out:,}, expected 2 * L * B * tokens * H_kv * D * bytes = {expected:,}",
    )


def _kv_bad(case: tuple) -> Call:
    name, value = case
    return Call(f"{name}={value}", (), dict(n_layers=2, n_heads=8, d_head=16, seq_len=10) | {name: value})


#: arguments the text rules out (the first four public)
_KV_BAD = [("n_layers", 0), ("seq_len", -1), ("n_kv_heads", 3), ("window", 0)]
_KV_BAD += [("n_layers", -1), ("n_heads", 0), ("n_heads", -8), ("d_head", 0), ("d_head", -2)]
_KV_BAD += [("n_kv_heads", 0), ("n_kv_heads", -2), ("batch", 0), ("batch", -1), ("window", -1)]

KV = Spec(
    "kv_cache_size",
    [
        Clause("returns an int", _kv_int, examples=[(2, 4, 8, 10)], also=[(1, 1, 1, 0)]),
        Clause(
            "a 7B model (32 layers, 32 heads of 128) in float16: 0.5 MiB per token, 64 GiB at 128k tokens",
            _kv_case,
            examples=[(32, 32, 128, 1)],
            also=[(32, 32, 128, 128 * 1024)],
        ),
        Clause(
            "2 * L * B * tokens * H_kv * D * bytes per value, for any sizes and arguments",
            _kv_case,
            _kv_calls(),
            key="kv.values",
            budget="widest",
            examples=[(2, 4, 8, 10, None, 1, F16, None)],
        ),
        Clause(
            "MHA, GQA and MQA: only the key/value heads are cached (n_kv_heads=None means n_heads)",
            _kv_case,
            examples=[(32, 32, 128, 1, 8)],  # 8 key/value heads (GQA) cache 4 times less
            also=[*_KV_CASES[:3], (3, 6, 16, 10, 6), (3, 6, 16, 10, 2)],
        ),
        Clause(
            "the dtype sets the bytes per value (float16, bfloat16, float32, float64, int8)",
            _kv_case,
            examples=[(32, 32, 128, 1, None, 1, F32)],  # 4 bytes a value: 1 MiB per token
            also=[(3, 4, 16, 10, None, 1, dtype) for dtype in (F32, torch.bfloat16, F64, torch.int8, F16)],
        ),
        Clause(
            "a sliding window caps the cached tokens at min(seq_len, window)",
            _kv_case,
            # a window of 4,096 caps 131,072 tokens and keeps all of 1,000
            examples=[(32, 32, 128, T, None, 1, F16, 4096) for T in (131072, 1000)],
            also=[
                *_KV_CASES[3:],
                *((2, 4, 8, T, None, 1, F16, W) for T, W in ((10, 1), (10, 10), (10, 11), (0, 3))),
            ],
        ),
        Clause(
            "the batch multiplies the size; seq_len=0 gives 0 bytes",
            _kv_case,
            examples=[(2, 4, 8, 10, None, 3), (2, 4, 8, 0)],
            also=[(3, 4, 16, 10, None, 2), (3, 4, 16, 10, None, 5), (3, 4, 16, 0)],
        ),
        Clause(
            "exact at any size, past 2**53 bytes too: an int computed with ints, never through a float",
            functools.partial(_kv_case, exact=True),
            examples=[(95, 127, 129, 2**31 - 1, None, 4095, F64)],
            also=[(126, 96, 255, 10**12 + 1, 3, 999, torch.int8, 2**45 + 1)],
        ),
        raises(
            _kv_bad,
            fix="sizes must be >= 1 (seq_len >= 0), n_kv_heads must divide n_heads",
            text="raises ValueError for sizes below 1, a negative seq_len, n_kv_heads not dividing n_heads, a window "
            "below 1",
            examples=_KV_BAD[:4],
            also=_KV_BAD[4:],
        ),
    ],
)
check_kv_cache_size, grade_kv_cache_size = KV.graders()


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


def _kv_cache_13b_gib() -> float:
    """GiB of the KV cache of one 4,096-token float16 sequence of the 13B shape: the buffers of Chapter 7's
    ``KVCache`` allocated on the ``meta`` device (shapes and dtypes, no data) and their bytes added up."""
    # the shape of KV_CACHE_GIB: Llama 2 13B (Touvron et al., 2023): layers, heads (multi-head attention), head width
    L, H, D = 40, 40, 128
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


def _seeded(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _mass_request(case, about: str = "") -> Call:
    """``(T, W, seed, D)``: one measurement with a generator seeded ``seed`` (``D=None``: the default)."""
    T, W, seed, D = case
    where = f"window_mass({T}, {W}, {MASS_N}, generator{'' if D is None else f', D={D}'}){about}"
    return Call(where, (T, W, MASS_N, _seeded(seed)) + (() if D is None else (D,)))


def _mass(g: Grader, window_mass, case):
    c = _mass_request(case)
    return c.where, call_student(g, c.where, window_mass, *c.args)


_MASS_WHY = (
    "the keys are exchangeable, so the last W of T keys hold W / T of the weight on average. Check that the "
    "softmax runs over the T keys of each trial (not over the trials), that you sum the weights of the last "
    "window keys exactly (weights[:, T - window:]), and that you average the sums over the n trials"
)


def _mass_float(g: Grader, window_mass, case) -> None:
    where, v = _mass(g, window_mass, case)
    g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")


def _mass_band(g: Grader, window_mass, case) -> None:
    """Within the band around ``W / T``; with a window of all T keys, 1 up to rounding."""
    where, v = _mass(g, window_mass, case)
    if case[0] != case[1]:
        return expect_in_band(g, where, v, *_mass_around(case), _MASS_WHY)
    g.expect(
        isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v - 1.0) <= 1e-9,
        f"{where} should be 1 (the softmax weights of all T keys sum to 1), got {describe(v)}",
    )


def _mass_around(case) -> tuple[float, float]:
    """The band around the theory ``W / T``."""
    return case[1] / case[0] * (1 - MASS_BAND), case[1] / case[0] * (1 + MASS_BAND)


def _mass_seeded(g: Grader, window_mass, case) -> None:
    """``(seed, another seed, a seed for two D)``: the same seed gives the same result, another another,
    and D changes what is drawn."""
    seed, other, seed_d = case
    a, b, c = (_mass(g, window_mass, (32, 4, s, None))[1] for s in (seed, seed, other))
    g.expect(
        a == b and a != c,
        f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: draw q and k with "
        "torch.randn(..., generator=generator), not from torch's global random state",
    )
    d1, d8 = (_mass(g, window_mass, (32, 4, seed_d, D))[1] for D in (1, 8))
    g.expect(
        d1 != d8,
        f"D = 1 and D = 8 gave the same result {d1!r} from generators seeded alike: q and k have D entries "
        "each, so D must change what is drawn",
    )


def _mass_bad(case) -> Call:
    *args, D = case
    where = f"window_mass({', '.join(map(str, args))}{'' if D is None else f', D={D}'})"
    return Call(where, (*args, _seeded(0)) + (() if D is None else (D,)))


MASS = Spec(
    "window_mass",
    [
        Clause("returns a Python float", _mass_float, examples=[(16, 4, 3, None)]),
        Clause(
            f"the kept weight is window / T within {MASS_BAND:.0%} (T, W = 64, 8; 32, 4; 256, 32; 128, 16)",
            _mass_band,
            examples=[(64, 8, 0, None)],  # the docstring's example: about 8 / 64 = 0.125
            also=[(64, 8, 11, None), (32, 4, 12, None), (256, 32, 13, None), (128, 16, 14, None)],
        ),
        Clause(
            f"the theory holds for any D: D = 1 and D = 64 also give window / T within {MASS_BAND:.0%}",
            _mass_band,
            examples=[(64, 8, 21, 1)],
            also=[(64, 8, 22, 64)],
        ),
        Clause(
            "a window of all T keys keeps all the weight (1 up to rounding)",
            _mass_band,
            examples=[(1, 1, 31, None)],
            also=[(12, 12, 31, None)],
        ),
        procedure(
            lambda c: _mass_request(c, f" with a generator seeded {c[2]}"),
            lambda c: ref.window_mass(
                *c[:2], MASS_N, torch.Generator().manual_seed(c[2]), *(c[3:] if c[3] else ())
            ),
            text="draws the queries, then the keys, float64, from its generator: the reference's result",
            steps="draw all queries (n, D) first, then all keys (n, T, D), with torch.randn(..., generator=generator, "
            "dtype=torch.float64), score q . k / sqrt(D) (D = 16 by default) and keep the last window keys",
            examples=[(16, 4, 51, None), (32, 8, 52, 3), (8, 1, 53, 16)],
            inputs=st.tuples(
                st.sampled_from([8, 16, 32, 64]),
                st.sampled_from([1, 2, 4, 8]),
                st.integers(100, 2**31 - 1),
                st.sampled_from([None, 1, 3, 16, 32]),
            ),
            key="mass.procedure",
            band=_mass_around,
        ),
        Clause(
            "draws from its generator: the same seed gives the same result, another seed another",
            _mass_seeded,
            examples=[(41, 42, 43)],
        ),
        raises(
            _mass_bad,
            fix="say which argument is out of range",
            text="raises ValueError for T, n or D below 1, or a window outside 1 .. T",
            examples=[(8, 9, 10, None), (8, 2, 10, 0)],
            also=[(0, 1, 10, None), (8, 0, 10, None), (8, 2, 0, None)],
        ),
    ],
)
check_window_mass, grade_window_mass = MASS.graders()


# =========================================================================== stretch: sink_window_mask


def _sink_matches(g: Grader, sink_window_mask, case) -> None:
    """``(T, W, n_sink, S)`` (``S`` None: left out), or a drawn ``(T, S - T, W, n_sink, whether S is left out)``."""
    T, W, n, S = case = _undrawn(case, 5)
    top = (S or T) - T
    mistakes = [
        (
            lambda p, j: ((j <= p) & (j > p - W)) | (j < n),
            "a sink is a key like any other: a query may not see a sink token after its own position (keep j <= p "
            "for the sinks too)",
        ),
        (
            lambda p, j: (j <= p) & (j > p - W),
            "the sink tokens are missing: every query also sees keys j < n_sink",
        ),
        (
            lambda p, j: (j <= p) & ((j > p - W) | (j <= n)),
            "the sinks are off by one: they are the first n_sink keys, j < n_sink",
        ),
        (
            lambda p, j: (j <= p) & ((j > p - W) | (j < n - top)),
            "the sinks are the first n_sink KEY positions 0 .. n_sink - 1, whatever S - T is",
        ),
    ]
    allowed = lambda p, j: (j <= p) & ((j > p - W) | (j < n))
    definition = "query p = i + S - T sees keys j <= p with p - window < j or j < n_sink"
    mistakes = [(_window(T, S or T, f), hint) for f, hint in mistakes]
    _mask_verdict(g, sink_window_mask, "sink_window_mask", case, allowed, mistakes, definition)


SINK = Spec(
    "sink_window_mask",
    [
        Clause(
            "query p = i + S - T sees keys j <= p with p - window < j or j < n_sink",
            _sink_matches,
            st.tuples(
                st.integers(0, 12), st.integers(0, 5), st.integers(1, 8), st.integers(0, 6), st.booleans()
            ),
            key="sink.values",
            budget="widest",
            examples=[(6, 0, 2, 1, True), (5, 0, 2, 1, True)],  # the second is the example of the text
        ),
        Clause(
            "n_sink = 0 is the sliding window; sinks inside the window change nothing",
            _sink_matches,
            examples=[(6, 2, 0, None)],
            also=[(3, 3, 0, 7), (5, 9, 3, None)],
        ),
        Clause(
            "with S > T keys the queries are the last T positions, the sinks the first keys",
            _sink_matches,
            examples=[(2, 2, 1, 6)],
            also=[(3, 3, 2, 10), (1, 1, 4, 9)],
        ),
        raises(
            lambda case: Call(f"sink_window_mask{case}", case),
            fix="say what was expected and what came",
            text="raises ValueError for a bad window or n_sink, and unless 0 <= T <= S",
            examples=[(4, 0, 1), (4, 2, -1)],
            also=[(4, 2.5, 1), (4, 2, 1.5), (5, 2, 1, 3)],
        ),
        Clause(
            "builds the mask on the device asked for (device='meta')",
            functools.partial(_built_on_meta, "sink_window_mask"),
            examples=[(3, 2, 1, 5)],
        ),
    ],
)
check_sink_window_mask, grade_sink_window_mask = SINK.graders()

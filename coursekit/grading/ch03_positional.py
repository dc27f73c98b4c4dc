"""Checks for Exercise 3 (positional encodings).

Each part has two entry points, both called from the notebook with the student's
object. ``check_*`` holds the *public* checks: one small, fixed example per clause of the
part's text, so a student knows what will be graded. ``grade_*`` holds the *hidden* checks:
one named check per clause of the text and docstring, each on fresh inputs drawn across what
the text allows (sizes, dtypes, optional arguments, shapes; derandomized property-based
examples that shrink to the smallest failing one) and compared with
:mod:`coursekit.positional` in float64. Before the generic "differs" hint, a check tries the
common mistakes (swapped sine and cosine, the wrong RoPE pairing or direction, the wrong ALiBi
rule for head counts that are not powers of two, ...) and names the one that matches. Both
raise :class:`~coursekit.grading.core.GradingFailure` with a hint per failed check.

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from coursekit import positional as ref
from coursekit.grading.core import (
    SESSION,
    Grader,
    call_student,
    close,
    default_device,
    describe,
    expect_close,
    expect_value_error,
    for_all,
    is_tensor,
    magnitude,
    meta_copy_refused,
    probe,
    raise_unless_student_error,
    raised,
    rand,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band

__all__ = [
    "check_sinusoidal_encoding",
    "check_apply_rope",
    "check_alibi_slopes",
    "check_alibi_bias",
    "grade_sinusoidal_encoding",
    "grade_apply_rope",
    "grade_alibi_slopes",
    "grade_alibi_bias",
    "check_predict_rope_offset",
    "grade_predict_rope_offset",
    "check_predict_alibi_first_slope",
    "grade_predict_alibi_first_slope",
    "check_predict_position_length",
    "grade_predict_position_length",
    "check_sinusoidal_similarity",
    "grade_sinusoidal_similarity",
    "check_ntk_scaled_base",
    "grade_ntk_scaled_base",
]

F64, F32 = torch.float64, torch.float32


# --------------------------------------------------------------------------- helpers


def _args(**kwargs) -> str:
    """', base=100.0, scaling='ntk'' for the keyword arguments that are given."""
    return "".join(f", {k}={v!r}" for k, v in kwargs.items() if v is not None)


def _in_process() -> bool:
    """True when the student's objects live in this process (a notebook, a unit test, the mutation
    reports); False under the autograder, whose sandbox cannot send tensors on the meta device."""
    return SESSION.get() is None


# --------------------------------------------------------------------------- sinusoidal


def _interleave(sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """(T, C/2) sines and cosines -> (T, C) with sin in even and cos in odd channels."""
    return torch.stack([sin, cos], dim=-1).flatten(-2)  # (T, C)


def _sinusoidal_variants(T: int, C: int, base: float) -> dict[str, torch.Tensor]:
    """The tables that common mistakes produce, in float64."""
    pos = torch.arange(T, dtype=F64)[:, None]  # (T, 1)
    good = ref.sinusoidal_encoding(T, C, base=base, dtype=F64)  # (T, C)
    half = torch.arange(C // 2, dtype=F64)
    angles_i = pos * base ** (-half / C)  # exponent i/C instead of 2i/C
    channel = torch.arange(C, dtype=F64)
    per_channel = pos * base ** (-channel / C)  # every channel its own frequency base^(-c/C)
    return {
        "swapped": _interleave(good[:, 1::2], good[:, 0::2]),
        "concatenated": torch.cat([good[:, 0::2], good[:, 1::2]], dim=-1),
        "exponent": _interleave(angles_i.sin(), angles_i.cos()),
        "per_channel": torch.where(channel.long() % 2 == 0, per_channel.sin(), per_channel.cos()),
        "from_one": ref.sinusoidal_encoding(T + 1, C, base=base, dtype=F64)[1:],
        "inverse_base": ref.sinusoidal_encoding(T, C, base=1.0 / base, dtype=F64),
        "default_base": ref.sinusoidal_encoding(T, C, dtype=F64),
        "float32_angles": _interleave(
            *(lambda a: (a.sin(), a.cos()))(
                pos * (base ** (-torch.arange(0, C, 2, dtype=torch.float32) / C)).double()
            )
        ),
    }


def _diagnose_sinusoidal(g: Grader, what: str, pe: object, T: int, C: int, base: float) -> None:
    if not (is_tensor(pe) and pe.shape == (T, C)):
        g.fail(f"{what}: expected a ({T}, {C}) tensor, got {describe(pe)}")
    good = ref.sinusoidal_encoding(T, C, base=base, dtype=F64)
    wrong = _sinusoidal_variants(T, C, base)

    def matches(key):
        return not close(wrong[key], good) and close(pe, wrong[key])

    if matches("swapped"):
        g.fail(
            f"{what}: sin and cos are swapped: even channels 2i hold sin(p w_i), odd channels 2i+1 hold cos(p w_i)"
        )
    if matches("concatenated"):
        g.fail(
            f"{what}: you put all the sines first and all the cosines after them: this encoding interleaves "
            "them, channel 2i = sin(p w_i) and channel 2i+1 = cos(p w_i)"
        )
    if matches("exponent"):
        g.fail(f"{what}: the frequency exponent is off: pair i has w_i = base^(-2i/C), not base^(-i/C)")
    if matches("per_channel"):
        g.fail(
            f"{what}: the frequency exponent is off: channels 2i and 2i+1 share one frequency "
            "w_i = base^(-2i/C); you gave every channel c its own base^(-c/C)"
        )
    if matches("from_one"):
        g.fail(f"{what}: row 0 must be position 0 (all sines 0, all cosines 1): your positions start at 1")
    if base != 10000.0 and matches("default_base"):
        g.fail(f"{what}: the base argument is ignored: w_i = base^(-2i/C) with base={base:g}, not 10000")
    if matches("float32_angles"):
        g.fail(
            f"{what}: the frequencies were computed in float32 (off in the 8th digit): compute the angles in "
            "float64, torch.arange(..., dtype=torch.float64), and cast only the table to dtype"
        )
    if matches("inverse_base"):
        g.fail(
            f"{what}: the frequencies are inverted: w_i = base^(-2i/C) (a negative exponent), "
            "so they fall from 1 to almost 1/base"
        )


def grade_sinusoidal_encoding(sinusoidal_encoding) -> None:
    """Grade a student's ``sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32)``."""
    g = Grader("sinusoidal_encoding")

    with g.check("returns a (T, C) tensor of the requested dtype (float32 by default)"):
        expected = ref.sinusoidal_encoding(5, 6, dtype=F64)
        for kwargs, dtype in (
            ({}, F32),
            ({"dtype": F64}, F64),
            ({"dtype": torch.float16}, torch.float16),
            ({"dtype": torch.bfloat16}, torch.bfloat16),
        ):
            what = f"sinusoidal_encoding(5, 6{_args(**kwargs)})"
            pe = call_student(g, what, sinusoidal_encoding, 5, 6, **kwargs)
            g.expect(
                is_tensor(pe) and pe.shape == (5, 6) and pe.dtype == dtype,
                f"{what} should be a {str(dtype).removeprefix('torch.')} (5, 6) tensor, got {describe(pe)}"
                + ("" if kwargs else ": the default dtype is float32"),
            )
            expect_close(g, what, pe, expected.to(dtype))

    def values(case):
        T, C = case
        what = f"sinusoidal_encoding({T}, {C}, dtype=torch.float64)"
        pe = call_student(g, what, sinusoidal_encoding, T, C, dtype=F64)
        expected = ref.sinusoidal_encoding(T, C, dtype=F64)
        if not close(pe, expected):
            _diagnose_sinusoidal(g, what, pe, T, C, 10000.0)
            expect_close(g, what, pe, expected)

    with g.check("PE[p, 2i] = sin(p w_i), PE[p, 2i + 1] = cos(p w_i), w_i = 10000^(-2i/C), p = 0 .. T-1"):
        evens = st.integers(1, 8).map(lambda k: 2 * k)
        for_all("sinusoidal.values", st.tuples(st.integers(0, 12), evens), values, first=(2, 4))
        values((50, 16))  # regression: the old fixed case

    def with_base(case):
        T, C, base = case
        what = f"sinusoidal_encoding({T}, {C}, base={base:g}, dtype=torch.float64)"
        pe = call_student(g, what, sinusoidal_encoding, T, C, base=base, dtype=F64)
        expected = ref.sinusoidal_encoding(T, C, base=base, dtype=F64)
        if not close(pe, expected):
            _diagnose_sinusoidal(g, what, pe, T, C, base)
            expect_close(g, what, pe, expected)

    with g.check("uses the base argument: w_i = base^(-2i/C)"):
        bases = st.sampled_from([100.0, 2.0, 0.5, 10.0, 777.5, 1e5, 1e6])
        for_all(
            "sinusoidal.base",
            st.tuples(st.integers(2, 10), st.sampled_from([4, 6, 8, 12]), bases),
            with_base,
            first=(3, 4, 100.0),
        )

    with g.check("the angles are computed in float64 and only the table is cast to dtype"):
        for T, C, dtype in ((4096, 16, F32), (300, 8, torch.float16)):
            what = f"sinusoidal_encoding({T}, {C}{_args(dtype=None if dtype == F32 else dtype)})"
            pe = call_student(
                g, what, sinusoidal_encoding, T, C, **({} if dtype == F32 else {"dtype": dtype})
            )
            expected = ref.sinusoidal_encoding(T, C, dtype=F64).to(dtype)
            g.expect(
                is_tensor(pe) and pe.shape == (T, C) and pe.dtype == dtype,
                f"{what} should be a {str(dtype).removeprefix('torch.')} ({T}, {C}) tensor, got {describe(pe)}",
            )
            expect_close(
                g,
                what,
                pe,
                expected,
                advice=f": at large positions angles computed in "
                f"{str(dtype).removeprefix('torch.')} lose digits; compute them in float64, cast at the end",
            )

    with g.check("C odd or not positive, T negative or base not positive raise a ValueError"):
        for args, kwargs, what in (
            ((4, 3), {}, "C=3"),
            ((4, 0), {}, "C=0"),
            ((4, -2), {}, "C=-2"),
            ((-1, 4), {}, "T=-1"),
            ((4, 4), {"base": 0.0}, "base=0"),
            ((4, 4), {"base": -100.0}, "base=-100"),
        ):
            expect_value_error(
                g,
                lambda: sinusoidal_encoding(*args, **kwargs),
                f"sinusoidal_encoding({what})",
                "keep the given argument checks",
            )

    g.finish()


# --------------------------------------------------------------------------- RoPE


def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """RoPE pairing neighbours (2i, 2i+1) instead of (i, i + D/2)."""
    D = x.shape[-1]
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # (2i, 2i+1) -> (i, i + D/2)
    return ref.apply_rope(x[..., perm], positions, **kwargs)[..., torch.argsort(perm)]


def _rope_repeat_interleave(x: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """Half-split rotation with angles laid out for interleaved pairs (cos.repeat_interleave(2))."""
    angles = ref.rope_angles(positions, x.shape[-1], **kwargs)  # (..., T, D/2)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)  # (..., T, D)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _rope_heads(x: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor | None:
    """(B, T) positions broadcast over the heads axis of x (B, H, T, D) when H == B: row h for head h."""
    if not (x.dim() == 4 and positions.dim() == 2 and x.shape[0] == x.shape[1]):
        return None
    B, H = x.shape[:2]
    return torch.stack(
        [torch.stack([ref.apply_rope(x[b, h], positions[h], **kwargs) for h in range(H)]) for b in range(B)]
    )


def _diagnose_rope(
    g: Grader, what: str, out: object, x: torch.Tensor, positions: torch.Tensor, **kwargs
) -> None:
    """Fail with the hint of the first common mistake that ``out`` matches."""
    if not (is_tensor(out) and out.shape == x.shape):
        g.fail(f"{what}: expected a tensor of x's shape {tuple(x.shape)}, got {describe(out)}")
    good = ref.apply_rope(x, positions, **kwargs)
    kw = {k: v for k, v in kwargs.items() if k != "base"}
    candidates = [
        (x, "x came back unchanged: rotate each pair by the angle p * theta_i of its position"),
        (
            _rope_interleaved(x, positions, **kwargs),
            "you rotate neighbouring channels (2i, 2i+1) together: this convention is half-split, channel i "
            "pairs with channel i + D/2 (as in rotate_half)",
        ),
        (
            _rope_repeat_interleave(x, positions, **kwargs),
            "the half-split pairs get the wrong frequencies: channels i and i + D/2 share theta_i, so build "
            "cos and sin with torch.cat([c, c], -1), not repeat_interleave",
        ),
        (
            ref.apply_rope(x, -positions, **kwargs),
            "the rotation goes the wrong way: a pair (a, b) becomes (a cos - b sin, a sin + b cos), i.e. "
            "x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1)",
        ),
        (
            ref.apply_rope(x, positions + 1, **kwargs),
            "your positions are shifted by one: use the positions given (the first token may have position 0)",
        ),
        (
            _rope_heads(x, positions, **kwargs),
            "head h was rotated by the positions of sequence h: with positions (B, T) and x (B, H, T, D) insert a "
            "head axis, angles[:, None], so every head of sequence b uses row b",
        ),
        (
            ref.apply_rope(x, torch.arange(x.shape[-2]).expand_as(positions), **kwargs),
            "the positions argument is ignored: you used 0 .. T-1 instead of the positions given",
        ),
    ]
    if positions.is_floating_point() and not torch.equal(positions, positions.round()):
        candidates.append(
            (
                ref.apply_rope(x, positions.long(), **kwargs),
                "the positions were cast to integers: positions may be floats, use them as they are",
            )
        )
    if kwargs.get("scaling") is not None:
        candidates.append(
            (
                ref.apply_rope(x, positions, base=kwargs.get("base", 10000.0)),
                "scaling and factor are ignored: pass them on to rope_angles",
            )
        )
    if kwargs.get("base", 10000.0) != 10000.0:
        candidates.append(
            (ref.apply_rope(x, positions, **kw), "the base argument is ignored: pass base on to rope_angles")
        )
    for wrong, hint in candidates:
        if wrong is not None and wrong.shape == good.shape and not close(wrong, good) and close(out, wrong):
            g.fail(f"{what}: {hint}")


def _rope_case(g: Grader, apply_rope, x: torch.Tensor, positions: torch.Tensor, what: str, **kwargs) -> None:
    """Compare ``apply_rope(x, positions, **kwargs)`` with the reference, naming a known mistake if it matches."""
    out = call_student(g, what, apply_rope, x, positions, **kwargs)
    expected = ref.apply_rope(x, positions, **kwargs)
    if not close(out, expected, magnitude=magnitude(x)):
        _diagnose_rope(g, what, out, x, positions, **kwargs)
        expect_close(g, what, out, expected, magnitude(x))


def _positions_text(p: torch.Tensor) -> str:
    values = p.tolist()
    return str(values) if p.numel() <= 8 else f"of shape {tuple(p.shape)}"


@st.composite
def _rope_shapes(draw, ranks=(4,), max_T=7, positions="arange"):
    """x's shape, positions and a seed: rank from ``ranks``; ``positions`` is 'arange', 'explicit'
    (integers or floats in any order) or 'batched' ((B, T), one row per sequence)."""
    rank = draw(st.sampled_from(ranks))
    B, H = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    T, D = draw(st.integers(1, max_T)), draw(st.sampled_from([2, 4, 6, 8, 10, 12]))
    shape = {2: (T, D), 3: (B, T, D), 4: (B, H, T, D)}[rank]
    if positions == "arange":
        pos = list(range(T))
    elif positions == "explicit":
        if draw(st.booleans()):
            pos = draw(st.lists(st.integers(0, 3000), min_size=T, max_size=T))
        else:
            pos = draw(st.lists(st.floats(0.0, 500.0, allow_nan=False, width=32), min_size=T, max_size=T))
    else:
        pos = draw(st.lists(st.lists(st.integers(0, 60), min_size=T, max_size=T), min_size=B, max_size=B))
    return shape, pos, draw(st.integers(0, 2**16))


def _as_positions(pos) -> torch.Tensor:
    flat = pos if not pos or not isinstance(pos[0], list) else [v for row in pos for v in row]
    return torch.tensor(pos, dtype=F64 if any(isinstance(v, float) for v in flat) else torch.long)


def grade_apply_rope(apply_rope) -> None:
    """Grade a student's ``apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0)``."""
    g = Grader("apply_rope")

    with g.check("returns a new tensor of x's shape and dtype, and leaves x and positions unchanged"):
        positions = torch.tensor([0, 3, 1, 7, 2])
        for dtype in (F32, F64, torch.bfloat16):
            x = rand(f"rope.dtype.{dtype}", 2, 3, 5, 8).to(dtype)
            what = f"for x {describe(x)} and positions {positions.tolist()}"
            p = probe(apply_rope, x.clone(), positions.clone())
            g.expect(
                is_tensor(p.result) and p.result.shape == x.shape and p.result.dtype == dtype,
                f"{what}: expected a tensor of x's shape and dtype, got {describe(p.result)}: "
                "cast cos and sin to x.dtype",
            )
            g.expect(
                is_tensor(p.args[0]) and torch.equal(p.args[0], x),
                f"{what}: x was modified in place: compute a new tensor",
            )
            g.expect(
                is_tensor(p.args[1]) and torch.equal(p.args[1], positions),
                f"{what}: positions was modified in place",
            )
            if dtype == F32:
                expected = ref.apply_rope(x.double(), positions).float()
                expect_close(g, what, p.result, expected, magnitude(x))

    def arange_case(case):
        shape, pos, seed = case
        x = tensor(seed, *shape)
        _rope_case(g, apply_rope, x, torch.tensor(pos), f"for x {shape} and positions {pos}")

    with g.check(
        "x (B, H, T, D) at positions 0 .. T-1: channels i and i + D/2 turn by p theta_i, "
        "(a, b) -> (a cos - b sin, a sin + b cos)"
    ):
        for_all("rope.arange", _rope_shapes(), arange_case, first=((1, 1, 2, 4), [0, 1], 0))

    with g.check("x may also be (B, T, D) or (T, D), positions (T,) shared by the batch"):
        for_all("rope.ranks", _rope_shapes(ranks=(2, 3)), arange_case, first=((2, 4), [0, 1], 1))

    def explicit_case(case):
        shape, pos, seed = case
        x, positions = tensor(seed, *shape), _as_positions(pos)
        _rope_case(g, apply_rope, x, positions, f"for x {shape} and positions {_positions_text(positions)}")

    with g.check("explicit positions (T,): any order, integers or floats, up to thousands"):
        for_all(
            "rope.explicit",
            _rope_shapes(ranks=(2, 3, 4), positions="explicit"),
            explicit_case,
            first=((1, 2, 6, 8), [5, 0, 17, 3, 100, 42], 2),
        )

    with g.check("positions (B, T): every head of sequence b uses row b, for x (B, T, D) or (B, H, T, D)"):
        for_all(
            "rope.batched",
            _rope_shapes(ranks=(3, 4), positions="batched"),
            explicit_case,
            first=((2, 2, 4, 6), [[0, 1, 2, 3], [9, 4, 20, 7]], 3),
        )

    def options_case(case):
        (shape, pos, seed), (base, scaling, factor) = case
        if scaling == "ntk" and shape[-1] == 2:
            shape = (*shape[:-1], 4)  # NTK-aware scaling needs D > 2
        x, positions = tensor(seed, *shape), _as_positions(pos)
        kwargs = {"base": base, "scaling": scaling, "factor": factor}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        what = f"for x {shape}, positions {_positions_text(positions)}{_args(**kwargs)}"
        _rope_case(g, apply_rope, x, positions, what, **kwargs)

    options = st.tuples(
        st.sampled_from([None, 500.0, 10000.0, 1e6]),
        st.sampled_from([None, "linear", "ntk"]),
        st.sampled_from([None, 0.5, 2.0, 4.0, 8.0]),
    )
    with g.check("passes base, scaling ('linear' or 'ntk') and factor on (factor defaults to 1.0)"):
        for_all(
            "rope.options",
            st.tuples(_rope_shapes(ranks=(2, 4), positions="explicit"), options),
            options_case,
            first=(((1, 2, 5, 8), [0, 10, 20, 30, 40], 4), (500.0, None, None)),
        )
        x, positions = rand("rope.options.fixed", 1, 2, 5, 8), torch.arange(0, 50, 10)
        for kwargs in (
            {"scaling": "linear", "factor": 4.0},
            {"scaling": "ntk", "factor": 8.0},
            {"scaling": "linear"},
            {"factor": 3.0},
        ):
            _rope_case(
                g,
                apply_rope,
                x,
                positions,
                f"for x (1, 2, 5, 8), positions [0, 10, .., 40]{_args(**kwargs)}",
                **kwargs,
            )

    with g.check("gradients flow back to x (the inverse rotation of the upstream gradient)"):
        x = rand("rope.grad", 2, 2, 4, 6)
        positions = torch.tensor([3, 1, 4, 1])
        upstream = rand("rope.grad.up", 2, 2, 4, 6)
        p = probe(apply_rope, x.clone().requires_grad_(), positions, backward=(None, upstream))
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            "for x (2, 2, 4, 6): the output does not depend on x through autograd: avoid .detach(), "
            ".numpy() or .item()",
        )
        expected = ref.apply_rope(upstream, -positions)
        expect_close(
            g,
            "for x (2, 2, 4, 6) and positions [3, 1, 4, 1], the gradient with respect to x",
            p.grads[0] if p.grads else None,
            expected,
            advice=" (it is the inverse rotation of the upstream gradient)",
        )

    with g.check("x with an odd D or fewer than 2 dims, or positions of another shape, raise a ValueError"):
        x = rand("rope.bad", 2, 3, 4, 6)
        for call, what in (
            (lambda: apply_rope(rand("rope.bad.odd", 2, 3, 4, 5), torch.arange(4)), "x (2, 3, 4, 5) (D odd)"),
            (lambda: apply_rope(rand("rope.bad.1d", 6), torch.arange(1)), "x (6,) (one dimension)"),
            (lambda: apply_rope(x, torch.arange(5)), "x (2, 3, 4, 6) and positions (5,)"),
            (
                lambda: apply_rope(x, torch.zeros(3, 4, dtype=torch.long)),
                "x (2, 3, 4, 6) and positions (3, 4)",
            ),
            (
                lambda: apply_rope(x[0, 0], torch.zeros(2, 4, dtype=torch.long)),
                "x (4, 6) and positions (2, 4)",
            ),
            (
                lambda: apply_rope(x, torch.zeros(2, 1, 4, dtype=torch.long)),
                "x (2, 3, 4, 6) and positions (2, 1, 4)",
            ),
        ):
            expect_value_error(g, call, what, "keep the given argument checks")

    g.finish()


# --------------------------------------------------------------------------- ALiBi slopes


def _geometric(n: int) -> list[float]:
    return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]


def _diagnose_slopes(g: Grader, s: object, H: int) -> None:
    expected = ref.alibi_slopes(H, F64)
    if not (is_tensor(s) and s.shape == (H,)):
        g.fail(f"alibi_slopes({H}) should be a tensor of shape ({H},), got {describe(s)}")
    if H > 1 and close(s, expected.flip(0)):
        g.fail(
            f"alibi_slopes({H}): the slopes are reversed: head 0 gets the steepest slope 2^(-8/n), "
            "e.g. 1/2 for 8 heads"
        )
    if close(s, torch.tensor([2.0 ** (-8.0 * i / H) for i in range(H)], dtype=F64)):
        g.fail(
            f"alibi_slopes({H}): the exponents start at 0: the slopes are 2^(-8i/n) for i = 1 .. n, so the "
            "first is 2^(-8/n), not 1"
        )
    if H & (H - 1):  # not a power of two
        n = 1 << (H.bit_length() - 1)
        if close(s, torch.tensor(_geometric(H), dtype=F64)):
            g.fail(
                f"H = {H} is not a power of two: the paper's rule takes the {n} slopes for n = {n} heads, then "
                f"the first {H - n} of every other slope for 2n = {2 * n} heads (2^(-8i/H) is not that)"
            )
        if close(s, torch.tensor(_geometric(n) + _geometric(2 * n)[1::2][: H - n], dtype=F64)):
            g.fail(
                f"for H = {H} the extra slopes are every other slope of the {2 * n}-head sequence starting "
                "with its first, [0::2], not [1::2]"
            )
        if close(s, expected.sort(descending=True).values):
            g.fail(
                f"alibi_slopes({H}): do not sort the slopes: the paper's order is the n slopes for n heads "
                "first, then the extra ones from the 2n-head sequence"
            )


def grade_alibi_slopes(alibi_slopes) -> None:
    """Grade a student's ``alibi_slopes(H, dtype=torch.float32)``."""
    g = Grader("alibi_slopes")

    with g.check("returns an (H,) tensor of the requested dtype (float32 by default)"):
        for H, kwargs, dtype in (
            (4, {}, F32),
            (12, {}, F32),
            (4, {"dtype": F64}, F64),
            (6, {"dtype": torch.bfloat16}, torch.bfloat16),
        ):
            what = f"alibi_slopes({H}{_args(**kwargs)})"
            s = call_student(g, what, alibi_slopes, H, **kwargs)
            g.expect(
                is_tensor(s) and s.shape == (H,) and s.dtype == dtype,
                f"{what} should be a {str(dtype).removeprefix('torch.')} tensor of shape ({H},), "
                f"got {describe(s)}",
            )
            expected = ref.alibi_slopes(H, F64).to(dtype)
            expect_close(g, what, s, expected)

    def slopes_case(H):
        s = call_student(g, f"alibi_slopes({H}, torch.float64)", alibi_slopes, H, F64)
        expected = ref.alibi_slopes(H, F64)
        if not close(s, expected):
            _diagnose_slopes(g, s, H)
        expect_close(g, f"alibi_slopes({H}, torch.float64)", s, expected)

    with g.check("H a power of two: the geometric sequence 2^(-8i/H), i = 1 .. H"):
        for_all(
            "alibi.slopes.pow2", st.integers(0, 7).map(lambda k: 2**k), slopes_case, max_examples=8, first=8
        )

    with g.check(
        "other H: the n slopes for n heads, then every other slope for 2n heads (n = largest power of 2 < H)"
    ):
        others = st.integers(3, 100).filter(lambda h: h & (h - 1) != 0)
        for_all("alibi.slopes.other", others, slopes_case, first=3)
        for H in (5, 6, 12, 20, 24):  # regression: the old fixed cases
            slopes_case(H)

    with g.check("H < 1 raises a ValueError", weight=0):  # the release gives this check: no credit alone
        for H in (0, -3):
            expect_value_error(
                g, lambda: alibi_slopes(H), f"alibi_slopes({H})", "keep the given argument check"
            )

    g.finish()


# --------------------------------------------------------------------------- ALiBi bias


def _diagnose_bias(g: Grader, what: str, b: object, slopes: torch.Tensor, T: int, S: int) -> None:
    expected = ref.alibi_bias(slopes, T, S)
    H = slopes.shape[0]
    mag = magnitude(expected)
    if not (is_tensor(b) and b.shape == (H, T, S)):
        g.fail(f"{what}: expected a tensor of shape ({H}, {T}, {S}), got {describe(b)}")
    if b.dtype != slopes.dtype:
        g.fail(f"{what}: the bias should have the dtype of the slopes ({slopes.dtype}), got {b.dtype}")
    if T == 0:
        return
    if S > T and close(b, ref.alibi_bias(slopes, S)[:, :T], magnitude=mag):
        g.fail(
            f"{what} is misaligned to the top-left: the queries are the last {T} of {S} positions, so "
            f"query i sits at position i + (S - T) and its own key is j = i + {S - T} (bias 0)"
        )
    past = torch.isfinite(expected)  # (H, T, S): keys the queries may see
    if not bool(torch.isneginf(b[~past]).all()):
        if close(b[past], expected[past], magnitude=mag):
            g.fail(
                f"{what}: future keys must be -inf: the bias is also the causal mask (a query may not see "
                "keys after it)"
            )
        g.fail(
            f"{what}: keys after the query must get -inf and keys up to the query a finite bias (is the bias "
            "causal and aligned?)"
        )
    if not bool(torch.isfinite(b[past]).all()):
        g.fail(f"{what}: some keys up to and including the query got -inf: only future keys are masked")
    if bool((expected[past] != 0).any()) and close(b[past], -expected[past], magnitude=mag):
        g.fail(f"{what}: the sign is flipped: keys further back must get a *more negative* bias, -m (i - j)")
    if bool((slopes != 0).any()) and close(
        b[past], expected[past] - slopes[:, None, None].expand(H, T, S)[past], magnitude=mag
    ):
        g.fail(
            f"{what}: the distance is off by one: a query's own key gets bias 0, the key before it -m, "
            "then -2m, ..."
        )
    flipped = ref.alibi_bias(slopes.flip(0), T, S)
    if H > 1 and not close(flipped, expected) and close(b, flipped, magnitude=mag):
        g.fail(f"{what}: the heads use the slopes in reverse order: head h gets slopes[h]")


def _bias_case(g: Grader, alibi_bias, slopes: torch.Tensor, T: int, S: int | None) -> None:
    shown = (
        "[" + ", ".join(f"{v:.4g}" for v in slopes.tolist()) + "]"
        if slopes.numel() <= 4
        else describe(slopes)
    )
    what = f"alibi_bias(slopes {shown}, {T}" + ("" if S is None else f", {S}") + ")"
    b = (
        call_student(g, what, alibi_bias, slopes, T)
        if S is None
        else call_student(g, what, alibi_bias, slopes, T, S)
    )
    S = T if S is None else S
    expected = ref.alibi_bias(slopes, T, S)
    mag = magnitude(expected)
    if not close(b, expected, magnitude=mag):
        _diagnose_bias(g, what, b, slopes, T, S)
        expect_close(g, what, b, expected, mag)


@st.composite
def _bias_shapes(draw, square=True):
    H, T = draw(st.integers(1, 5)), draw(st.integers(1 if square else 0, 8))
    S = None if square else T + draw(st.integers(0 if T else 1, 6))
    scale = draw(st.sampled_from([1.0, 0.01, 30.0]))
    return H, T, S, scale, draw(st.booleans()), draw(st.integers(0, 2**16))


def grade_alibi_bias(alibi_bias) -> None:
    """Grade a student's ``alibi_bias(slopes, T, S=None)``."""
    g = Grader("alibi_bias")
    slopes = torch.tensor([0.5, 0.125, 0.03, 0.7], dtype=F64)

    with g.check("returns an (H, T, S) tensor of the slopes' dtype, on the slopes' device"):
        for dtype in (F32, F64, torch.bfloat16):
            s = slopes.to(dtype)
            what = f"alibi_bias({describe(s)} slopes, 4, 6)"
            b = call_student(g, what, alibi_bias, s, 4, 6)
            g.expect(
                is_tensor(b) and b.shape == (4, 4, 6) and b.dtype == dtype,
                f"{what} should be a {str(dtype).removeprefix('torch.')} (4, 4, 6) tensor, got {describe(b)}",
            )
            expected = ref.alibi_bias(s.double(), 4, 6).to(dtype)
            expect_close(g, what, b, expected, 5.0)
        if _in_process():  # tensors on the meta device cannot cross the autograder's sandbox
            what = "alibi_bias(slopes on the meta device, 3, 5)"
            try:
                b = alibi_bias(slopes.to("meta"), 3, 5)
            except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
                raise_unless_student_error(e)
                g.fail(
                    f"{what}: {raised(e)}: the bias must be on the slopes' device, create the positions "
                    "with device=slopes.device"
                )
            g.expect(
                is_tensor(b) and b.device.type == "meta" and b.shape == (4, 3, 5),
                "alibi_bias(slopes on the meta device, 3, 5) should be a (4, 3, 5) tensor on the slopes' device "
                f"(meta), got {describe(b)} on {getattr(b, 'device', '?')}: create the positions with "
                "device=slopes.device",
            )
        _bias_on_slopes_device(g, alibi_bias, slopes, 3, 5)

    def case(c):
        H, T, S, scale, signed, seed = c
        s = tensor(seed, H, scale=scale)
        _bias_case(g, alibi_bias, s if signed else s.abs(), T, S)

    with g.check(
        "S defaults to T: -m_h (i - j) for keys j <= i (0 on the query's own key), -inf for later keys"
    ):
        for_all("alibi.bias.square", _bias_shapes(), case, first=(1, 3, None, 1.0, False, 0))
        for T in (5, 1, 8):  # regression: the old fixed cases
            _bias_case(g, alibi_bias, slopes, T, None)

    with g.check(
        "S > T keys: the queries are the last T of S positions (query i sits at i + S - T); T may be 0"
    ):
        for_all("alibi.bias.rect", _bias_shapes(square=False), case, first=(1, 2, 4, 1.0, False, 0))
        for T, S in ((3, 7), (1, 5), (0, 3)):
            _bias_case(g, alibi_bias, slopes, T, S)

    with g.check("leaves the slopes unchanged"):
        p = probe(alibi_bias, slopes.clone(), 4, 6)
        g.expect(
            is_tensor(p.args[0]) and torch.equal(p.args[0], slopes),
            "alibi_bias(slopes, 4, 6) modified the slopes in place: compute a new tensor",
        )

    with g.check("slopes that are not a floating (H,) tensor, S < T or T < 0 raise a ValueError"):
        for call, what in (
            (lambda: alibi_bias(slopes, 5, 3), "alibi_bias(slopes, 5, 3) (S < T)"),
            (lambda: alibi_bias(slopes, -1), "alibi_bias(slopes, -1)"),
            (lambda: alibi_bias(torch.tensor([1, 2]), 3), "integer slopes"),
            (lambda: alibi_bias(slopes[None], 3), "slopes of shape (1, 4)"),
            (lambda: alibi_bias(slopes.tolist(), 3), "slopes given as a list"),
        ):
            expect_value_error(g, call, what, "keep the given argument checks")

    g.finish()


# --------------------------------------------------------------------------- public checks


def _public_value(g: Grader, what: str, out: object, expected: torch.Tensor, mag: float = 1.0) -> None:
    g.expect(
        is_tensor(out) and out.shape == expected.shape and out.dtype == expected.dtype,
        f"{what} should be a {describe(expected)}, got {describe(out)}",
    )
    expect_close(g, what, out, expected, mag)


def check_sinusoidal_encoding(sinusoidal_encoding) -> None:
    """Public checks of ``sinusoidal_encoding``: one small example per graded clause."""
    g = Grader("sinusoidal_encoding (public)")
    s1, c1 = math.sin(1.0), math.cos(1.0)
    with g.check("sinusoidal_encoding(3, 4) is a float32 (3, 4) tensor; dtype=torch.float64 gives float64"):
        pe = sinusoidal_encoding(3, 4)
        g.expect(
            is_tensor(pe) and pe.shape == (3, 4) and pe.dtype == F32,
            f"sinusoidal_encoding(3, 4) must be a float32 (3, 4) tensor, got {describe(pe)}",
        )
        pe = sinusoidal_encoding(3, 4, dtype=F64)
        g.expect(
            is_tensor(pe) and pe.shape == (3, 4) and pe.dtype == F64,
            f"sinusoidal_encoding(3, 4, dtype=torch.float64) must be float64 (3, 4), got {describe(pe)}",
        )
    with g.check("PE(0) = [0, 1, 0, 1] and PE(1) = [sin 1, cos 1, sin 0.01, cos 0.01] for C = 4"):
        pe = sinusoidal_encoding(2, 4, dtype=F64)
        expected = torch.tensor([[0.0, 1.0, 0.0, 1.0], [s1, c1, math.sin(0.01), math.cos(0.01)]], dtype=F64)
        if is_tensor(pe) and pe.shape == (2, 4) and close(pe[1], expected[1, [1, 0, 3, 2]]):
            g.fail("sin and cos are swapped: even channels hold sin, odd channels cos")
        _public_value(g, "sinusoidal_encoding(2, 4, dtype=torch.float64)", pe, expected)
    with g.check("base=100: PE(1) = [sin 1, cos 1, sin 0.1, cos 0.1]"):
        pe = sinusoidal_encoding(2, 4, base=100.0, dtype=F64)
        expected = torch.tensor([[0.0, 1.0, 0.0, 1.0], [s1, c1, math.sin(0.1), math.cos(0.1)]], dtype=F64)
        _public_value(g, "sinusoidal_encoding(2, 4, base=100.0, dtype=torch.float64)", pe, expected)
    with g.check("angles in float64: row 3000 of the float32 table for C = 16 is exact to float32"):
        pe = sinusoidal_encoding(3001, 16)
        expected = ref.sinusoidal_encoding(3001, 16, dtype=F64).float()
        _public_value(g, "sinusoidal_encoding(3001, 16)", pe, expected)
    with g.check("sinusoidal_encoding(4, 3) (C odd) raises a ValueError"):
        expect_value_error(g, lambda: sinusoidal_encoding(4, 3), "C=3", "keep the given argument checks")
    g.finish()


def check_apply_rope(apply_rope) -> None:
    """Public checks of ``apply_rope``: one small example per graded clause (D = 4: frequencies 1 and 0.01)."""
    g = Grader("apply_rope (public)")
    c, s = math.cos(1.0), math.sin(1.0)
    e1 = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    with g.check("x = [1, 0, 0, 0] at positions [0, 1] becomes [1, 0, 0, 0] and [cos 1, 0, sin 1, 0]"):
        x = torch.stack([e1, e1])  # (T=2, D=4)
        out = apply_rope(x, torch.tensor([0, 1]))
        if is_tensor(out) and out.shape == (2, 4):
            if close(out[1], torch.tensor([c, s, 0.0, 0.0], dtype=F64)):
                g.fail(
                    "you rotate neighbouring channels (0, 1) together: with the half-split pairing channel 0 "
                    "pairs with channel 2 = 0 + D/2"
                )
            if close(out[1], torch.tensor([c, 0.0, -s, 0.0], dtype=F64)):
                g.fail("the rotation goes the wrong way: (a, b) becomes (a cos - b sin, a sin + b cos)")
        _public_value(
            g,
            "apply_rope([[1, 0, 0, 0], [1, 0, 0, 0]], [0, 1])",
            out,
            torch.tensor([[1.0, 0, 0, 0], [c, 0, s, 0]], dtype=F64),
        )
    with g.check(
        "a float32 (B, H, T, D) x at positions 0 .. T-1 gives a new float32 tensor of its shape, "
        "x unchanged, norms kept"
    ):
        y = rand("public.rope", 2, 3, 5, 8, dtype=F32)
        p = probe(apply_rope, y.clone(), torch.arange(5))
        out = p.result
        g.expect(
            is_tensor(out) and out.shape == y.shape and out.dtype == F32,
            f"expected a float32 tensor of shape {tuple(y.shape)}, got {describe(out)}",
        )
        g.expect(torch.equal(p.args[0], y), "x was modified in place: compute a new tensor")
        g.expect(
            close(out.norm(dim=-1), y.norm(dim=-1), magnitude=magnitude(y)),
            "the norms changed: each pair must be rotated, not scaled",
        )
        expect_close(
            g,
            "apply_rope(x (2, 3, 5, 8), arange(5))",
            out,
            ref.apply_rope(y.double(), torch.arange(5)).float(),
            magnitude(y),
        )
    with g.check("x (T, D) or (B, T, D), explicit and float positions"):
        x = torch.stack([e1, e1, e1])  # (T=3, D=4)
        positions = torch.tensor([2.0, 0.5, 1.0], dtype=F64)
        _public_value(
            g,
            "apply_rope(x (3, 4), positions [2.0, 0.5, 1.0])",
            apply_rope(x, positions),
            ref.apply_rope(x, positions),
        )
        _public_value(
            g,
            "apply_rope(x (1, 3, 4), positions [2.0, 0.5, 1.0])",
            apply_rope(x[None], positions),
            ref.apply_rope(x[None], positions),
        )
    with g.check("positions (B, T): sequence b (all its heads) uses row b, for x (B, H, T, D) or (B, T, D)"):
        x = torch.stack([e1, e1])[None, None].expand(2, 3, 2, 4).contiguous()  # (B=2, H=3, T=2, D=4)
        positions = torch.tensor([[0, 1], [1, 0]])
        _public_value(
            g,
            "apply_rope(x (2, 3, 2, 4), positions [[0, 1], [1, 0]])",
            apply_rope(x, positions),
            ref.apply_rope(x, positions),
        )
        _public_value(
            g,
            "apply_rope(x (2, 2, 4), positions [[0, 1], [1, 0]])",
            apply_rope(x[:, 0], positions),
            ref.apply_rope(x[:, 0], positions),
        )
    with g.check(
        "base, scaling and factor are passed on: base=100, scaling='linear' with factor=2, scaling='ntk'"
    ):
        x = torch.stack(
            [e1.roll(1), e1.roll(1)]
        )  # channel 1 set: pairs with channel 3, turns with base^(-1/2)
        for kwargs in (
            {"base": 100.0},
            {"scaling": "linear", "factor": 2.0},
            {"scaling": "ntk", "factor": 4.0},
        ):
            positions = torch.tensor([3, 8])
            _public_value(
                g,
                f"apply_rope([[0, 1, 0, 0]] * 2, [3, 8]{_args(**kwargs)})",
                apply_rope(x, positions, **kwargs),
                ref.apply_rope(x, positions, **kwargs),
            )
    with g.check("gradients flow back to x"):
        p = probe(
            apply_rope,
            torch.stack([e1, e1]).requires_grad_(),
            torch.tensor([0, 1]),
            backward=(None, torch.ones(2, 4, dtype=F64)),
        )
        expected = ref.apply_rope(torch.ones(2, 4, dtype=F64), -torch.tensor([0, 1]))
        g.expect(
            p.grads is not None and p.grads[0] is not None and close(p.grads[0], expected),
            "the gradient with respect to x should be the inverse rotation of the upstream gradient: "
            "avoid .detach(), .numpy() or .item()",
        )
    with g.check("x (2, 5) (D odd) raises a ValueError"):
        expect_value_error(
            g,
            lambda: apply_rope(torch.zeros(2, 5), torch.arange(2)),
            "x (2, 5)",
            "keep the given argument checks",
        )
    g.finish()


def check_alibi_slopes(alibi_slopes) -> None:
    """Public checks of ``alibi_slopes``: one small example per graded clause."""
    g = Grader("alibi_slopes (public)")
    with g.check("alibi_slopes(8) is a float32 [1/2, 1/4, ..., 1/256]; dtype=torch.float64 gives float64"):
        _public_value(g, "alibi_slopes(8)", alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))
        _public_value(
            g,
            "alibi_slopes(2, torch.float64)",
            alibi_slopes(2, F64),
            torch.tensor([1 / 16, 1 / 256], dtype=F64),
        )
    with g.check("alibi_slopes(3) is [1/16, 1/256, 1/4] (3 is not a power of two)"):
        s = alibi_slopes(3, F64)
        g.expect(
            is_tensor(s) and s.shape == (3,),
            f"alibi_slopes(3) must be a tensor of shape (3,), got {describe(s)}",
        )
        g.expect(
            close(s, torch.tensor([1 / 16, 1 / 256, 1 / 4], dtype=F64)),
            f"expected [1/16, 1/256, 1/4] (the 2 slopes for 2 heads, then the first of every other slope for "
            f"4 heads), got {s.tolist()}",
        )
    with g.check("alibi_slopes(0) raises a ValueError"):
        expect_value_error(g, lambda: alibi_slopes(0), "alibi_slopes(0)", "keep the given argument check")
    g.finish()


def _bias_on_slopes_device(g: Grader, alibi_bias, slopes: torch.Tensor, T: int, S: int) -> None:
    """``alibi_bias`` on CPU slopes while torch's default device, where the student's code runs, is
    ``meta`` (in-process and under the autograder alike): positions made without
    ``device=slopes.device`` land on ``meta``, and the call fails or its result is not on the CPU."""
    what = f"alibi_bias(slopes {tuple(slopes.shape)}, {T}, {S}) with torch's default device set to meta"
    fix = "create the positions with device=slopes.device"
    try:
        with default_device():
            b = alibi_bias(slopes.clone(), T, S)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        if not meta_copy_refused(e):
            raise_unless_student_error(e)
        g.fail(f"{what}: {raised(e)}: {fix}")
    g.expect(
        is_tensor(b) and b.device.type == "cpu",
        f"{what}: got {describe(b)}{' on ' + b.device.type if is_tensor(b) else ''}, not a tensor on the "
        f"slopes' device (cpu): {fix}",
    )
    expected = ref.alibi_bias(slopes, T, S)  # on the CPU: the device is right, the rest is its own clause
    g.expect(
        b.dtype == expected.dtype,
        f"{what}: got {describe(b)}: the bias has the slopes' dtype, {str(expected.dtype).removeprefix('torch.')}",
    )
    expect_close(g, what, b, expected)


def check_alibi_bias(alibi_bias) -> None:
    """Public checks of ``alibi_bias``: one small example per graded clause."""
    g = Grader("alibi_bias (public)")
    inf = math.inf
    half = torch.tensor([0.5], dtype=F64)
    with g.check("alibi_bias([0.5], 3) is [[0, -inf, -inf], [-0.5, 0, -inf], [-1, -0.5, 0]]"):
        b = alibi_bias(half, 3)
        if is_tensor(b) and b.shape == (1, 3, 3):
            g.expect(
                bool(torch.isneginf(b[0, 0, 1:]).all()),
                "future keys must be -inf: the bias is also the causal mask",
            )
            g.expect(
                float(b[0, 1, 0]) < 0,
                "keys further back must get a negative bias, -m (i - j): is the sign flipped?",
            )
        _public_value(
            g,
            "alibi_bias([0.5], 3)",
            b,
            torch.tensor([[[0.0, -inf, -inf], [-0.5, 0.0, -inf], [-1.0, -0.5, 0.0]]], dtype=F64),
        )
    with g.check(
        "alibi_bias([0.5, 0.25], 2, 4): the last query sees all 4 keys; float32 slopes give float32, "
        "slopes on the meta device a bias on the meta device"
    ):
        s = torch.tensor([0.5, 0.25])
        _public_value(
            g, "alibi_bias([0.5, 0.25] (float32), 2, 4)", alibi_bias(s, 2, 4), ref.alibi_bias(s, 2, 4)
        )
        if _in_process():  # tensors on the meta device cannot cross the autograder's sandbox
            b = alibi_bias(s.to("meta"), 2, 4)
            g.expect(
                is_tensor(b) and b.device.type == "meta",
                "with slopes on the meta device the bias must be there too: create the positions with "
                "device=slopes.device",
            )
        _bias_on_slopes_device(g, alibi_bias, s, 2, 4)
    with g.check("alibi_bias([0.5], 0, 3) is an empty (1, 0, 3) tensor"):
        _public_value(g, "alibi_bias([0.5], 0, 3)", alibi_bias(half, 0, 3), torch.zeros(1, 0, 3, dtype=F64))
    with g.check("the slopes are left unchanged"):
        p = probe(alibi_bias, half.clone(), 3)
        g.expect(torch.equal(p.args[0], half), "the slopes were modified in place: compute a new tensor")
    with g.check("alibi_bias([0.5], 3, 2) (S < T) raises a ValueError"):
        expect_value_error(g, lambda: alibi_bias(half, 3, 2), "T=3 and S=2", "keep the given argument checks")
    g.finish()


# --------------------------------------------------------------------------- predict, then check


def _rope_offset() -> str:
    """Measure what the scores of a buggy RoPE depend on: the query is rotated by its position m, the key by
    twice its position n; rotate one query and one key to several position pairs and compare the scores."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 16, generator=gen, dtype=F64), torch.randn(1, 16, generator=gen, dtype=F64)

    def score(m: int, n: int) -> float:
        return float((ref.apply_rope(q, torch.tensor([m])) * ref.apply_rope(k, torch.tensor([2 * n]))).sum())

    same = lambda a, b: abs(a - b) < 1e-9  # noqa: E731
    by_offset = same(score(3, 7), score(10, 14)) and same(score(0, 5), score(20, 25))  # n - m = 4, then 5
    by_2n_m = same(score(3, 7), score(5, 8)) and same(score(0, 5), score(6, 8))  # 2n - m = 11, then 10
    plain = same(score(3, 7), float((q * k).sum())) and same(score(10, 2), float((q * k).sum()))
    if plain:
        return "d"
    return "a" if by_offset and not by_2n_m else ("b" if by_2n_m and not by_offset else "c")


ROPE_OFFSET = Prediction(
    name="predict_rope_offset",
    question="A bug rotates the keys by twice their position: the query at position m is turned by m theta_i, the "
    "key at position n by 2n theta_i. The score of the pair then depends on the positions how?",
    tests="why RoPE is relative: two rotations meet as one by the difference of their angles, so the score is "
    "relative only when queries and keys turn by the same rule",
    measure=_rope_offset,
    explanation="Answer {truth}. Each pair of channels of q turns by m theta_i and the same pair of k by "
    "2n theta_i; a dot product of two rotated vectors only sees the angle between them, (2n - m) theta_i, so the "
    "score is one function of 2n - m: (3, 7) and (5, 8) score alike, (3, 7) and (10, 14) do not. (a) takes "
    "relativity for a property of rotations as such; it comes from rotating queries and keys by the same rule "
    "(Su et al., 2021), and here shifting both positions by s changes the angle by s theta_i, so the model would "
    "have to learn every offset again at every position. (c) forgets that two rotations still compose into "
    "one, by the difference of their angles. (d) holds only when the two angles are equal: rotations keep "
    "lengths, not the dot product of two vectors turned by different angles.",
    choices={
        "a": "only on the offset n - m, as with correct RoPE",
        "b": "only on 2n - m",
        "c": "on m and n separately, through no single combination",
        "d": "not at all: it equals q . k",
    },
)

ALIBI_FIRST_SLOPE = Prediction(
    name="predict_alibi_first_slope",
    question="With ALiBi and H = 32 heads, what is the slope m of the first head (the penalty per token of "
    "distance)?",
    tests="ALiBi's geometric slopes 2^(-8 i / H): the first head is the most local, and more heads make the "
    "ladder finer",
    measure=lambda: float(ref.alibi_slopes(32, dtype=F64)[0]),
    explanation="The slopes of Press et al. (2022) are 2^(-8 i / H) for i = 1 .. H, so the first is 2^(-8 / H); "
    "with H = 32 that is 2^(-1/4) = {truth}, and the ladder steps down by a factor 2^(-1/4) per head to the "
    "last, 2^-8 = 1/256, for every power of two H. More heads do not reach further: they split the same range "
    "from 1 to 1/256 into finer steps, so the steepest head gets steeper (a key 10 tokens back loses 8.4 "
    "from its score) while the gentlest stays at 1/256. H = 8's 1/2 is not a fixed first slope, 2^-8 is the "
    "last head's, not the first's, and 1/H = 1/32 would make the first slope shrink as heads are added, when it "
    "grows.",
    abs=5e-4,  # 2 ** -0.25 = 0.8409 to 3 decimals; excludes 0.8415, the page's PE(1)
)

POSITION_LENGTH = Prediction(
    name="predict_position_length",
    question="At C = 768, how long (in Euclidean norm) is the sinusoidal position vector PE(p) of position "
    "p = 3000, the vector the Transformer adds to that token's embedding?",
    tests="why Vaswani et al. scale embeddings by sqrt(C): every sinusoidal vector has length sqrt(C / 2) at "
    "every position, a token vector initialised for a tied output layer about 1",
    measure=lambda: float(ref.sinusoidal_encoding(3001, 768, dtype=F64)[3000].norm()),
    explanation="Each frequency fills a pair of channels with sin(p w_i) and cos(p w_i), and sin^2 + cos^2 = 1, so "
    "|PE(p)|^2 = C / 2 = 384 and |PE(p)| = sqrt(384) = {truth} at every position: p = 3000 is no longer than "
    "p = 0, and the base does not matter. Counting 1 per channel gives sqrt(C) = 27.7 (but each pair shares its "
    "1 between a sine and a cosine), 384 is the squared length, and 16 is sqrt(C / 2) at C = 512: the length "
    "grows with the width. An embedding initialised for a tied output layer has entries of standard deviation "
    "1 / sqrt(C), a length of about 1: added as it is, the token would be 1 / (1 + 384), about 0.3%, of the "
    "squared length of the sum. Multiplied by sqrt(C) = 27.7, as Vaswani et al. (2017) do, it has two thirds "
    "of the squared length (768 against 384): the two signals start on the same footing.",
    rel=0.01,
)

check_predict_rope_offset, grade_predict_rope_offset = ROPE_OFFSET.graders()
check_predict_alibi_first_slope, grade_predict_alibi_first_slope = ALIBI_FIRST_SLOPE.graders()
check_predict_position_length, grade_predict_position_length = POSITION_LENGTH.graders()


# --------------------------------------------------------------------------- experiment

#: the experiment's band around the identity (2 / C) sum_i cos(k w_i). In float64 any correct measurement
#: equals it to about 1e-12, a float32 table (sinusoidal_encoding's default dtype) to about 1e-4 for the
#: angles below 2,000 used here; 0.01 leaves room for both, while the classic mistakes land further away:
#: an unnormalised dot product is C / 2 times larger, an offset off by one moves the value by 0.03 or more
#: for the small offsets checked (k <= 8), a similarity of PE(p) with PE(k) instead of PE(p + k) fails for T > 1
SIMILARITY_BAND = 0.01
SIMILARITY_CASES = ((1, 64), (2, 16), (8, 128), (100, 64), (1000, 32), (37, 10))


def _similarity_theory(k: int, C: int, base: float = 10000.0) -> float:
    w = ref.rope_frequencies(C, base)  # w_i = base^(-2i/C), the sinusoidal frequencies
    return float((2.0 / C) * torch.cos(k * w).sum())


def _similarity(g: Grader, sinusoidal_similarity, k: int, C: int, **kwargs):
    where = f"sinusoidal_similarity({k}, {C}{_args(**kwargs)})"
    return where, call_student(g, where, sinusoidal_similarity, k, C, **kwargs)


def grade_sinusoidal_similarity(sinusoidal_similarity) -> None:
    """Grade the experiment ``sinusoidal_similarity(k, C, T=512, base=10000.0)``: the mean cosine
    similarity of sinusoidal encodings k positions apart, in a band around (2 / C) sum_i cos(k w_i)."""
    g = Grader("sinusoidal_similarity")
    with g.check("returns a Python float"):
        where, v = _similarity(g, sinusoidal_similarity, 3, 16)
        g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")
    with g.check("an offset of 0 gives 1 (a position is identical to itself)"):
        for C in (4, 64):
            where, v = _similarity(g, sinusoidal_similarity, 0, C)
            expect_in_band(g, where, v, 1 - 1e-6, 1 + 1e-6, "divide the dot product by both rows' norms")
    with g.check(f"matches (2 / C) sum_i cos(k w_i) within {SIMILARITY_BAND} for several offsets and widths"):
        for k, C in SIMILARITY_CASES:
            where, v = _similarity(g, sinusoidal_similarity, k, C)
            truth = _similarity_theory(k, C)
            expect_in_band(
                g,
                where,
                v,
                truth - SIMILARITY_BAND,
                truth + SIMILARITY_BAND,
                "compare row p with row p + k of sinusoidal_encoding(T + k, C), as a cosine similarity (the dot "
                "product divided by both norms), averaged over p = 0 .. T-1",
            )
    with g.check("uses T and base (T = 1, T = 7, base = 100)"):
        for k, C, kwargs in (
            (5, 8, {"T": 1}),
            (3, 16, {"T": 7}),
            (4, 8, {"base": 100.0}),
            (2, 6, {"T": 2, "base": 50.0}),
        ):
            where, v = _similarity(g, sinusoidal_similarity, k, C, **kwargs)
            truth = _similarity_theory(k, C, kwargs.get("base", 10000.0))
            expect_in_band(
                g,
                where,
                v,
                truth - SIMILARITY_BAND,
                truth + SIMILARITY_BAND,
                "pass base on to sinusoidal_encoding and average over exactly T pairs of rows",
            )
    with g.check("raises ValueError for k < 0 or T < 1"):
        for k, T in ((-1, 8), (2, 0)):
            expect_value_error(
                g,
                lambda k=k, T=T: sinusoidal_similarity(k, 8, T=T),
                f"k={k}, T={T}",
                "say which argument is out of range",
            )
    g.finish()


def check_sinusoidal_similarity(sinusoidal_similarity) -> None:
    """Public checks of ``sinusoidal_similarity``: the docstring's examples and one band."""
    g = Grader("sinusoidal_similarity (public)")
    with g.check("sinusoidal_similarity(0, 64) is 1 and sinusoidal_similarity(1, 2) is cos 1"):
        where, v = _similarity(g, sinusoidal_similarity, 0, 64)
        expect_in_band(g, where, v, 1 - 1e-6, 1 + 1e-6, "divide the dot product by both rows' norms")
        where, v = _similarity(g, sinusoidal_similarity, 1, 2)
        expect_in_band(
            g,
            where,
            v,
            math.cos(1) - SIMILARITY_BAND,
            math.cos(1) + SIMILARITY_BAND,
            "compare rows p and p + 1",
        )
    with g.check(f"sinusoidal_similarity(8, 128) is (2 / C) sum_i cos(8 w_i) within {SIMILARITY_BAND}"):
        where, v = _similarity(g, sinusoidal_similarity, 8, 128)
        truth = _similarity_theory(8, 128)
        expect_in_band(
            g,
            where,
            v,
            truth - SIMILARITY_BAND,
            truth + SIMILARITY_BAND,
            "average the cosine similarity over p",
        )
    g.finish()


# --------------------------------------------------------------------------- stretch

NTK_CASES = ((10000.0, 64, 4.0), (10000.0, 128, 8.0), (500000.0, 16, 2.5), (10000.0, 4, 4.0), (100.0, 6, 0.5))


def grade_ntk_scaled_base(ntk_scaled_base) -> None:
    """Grade the stretch part ``ntk_scaled_base(base, D, factor)``."""
    g = Grader("ntk_scaled_base")
    with g.check("returns a Python float"):
        where = "ntk_scaled_base(10000.0, 64, 4.0)"
        v = call_student(g, where, ntk_scaled_base, 10000.0, 64, 4.0)
        g.expect(type(v) is float, f"{where} should return a Python float, got {describe(v)}")
    with g.check("the lowest frequency becomes factor times lower, the highest stays 1"):
        for base, D, factor in NTK_CASES:
            where = f"ntk_scaled_base({base}, {D}, {factor})"
            v = call_student(g, where, ntk_scaled_base, base, D, factor)
            g.expect(isinstance(v, (int, float)) and v > 1, f"{where} should be a base > 1, got {v!r}")
            lowest = float(ref.rope_frequencies(D, v)[-1])
            want = float(ref.rope_frequencies(D, base)[-1]) / factor
            g.expect(
                abs(lowest - want) <= 1e-9 * want,
                f"{where} gave {v:.6g}: with it the lowest frequency base^(-(D-2)/D) is {lowest:.6g}, expected "
                f"{want:.6g} (factor times lower); solve base'^(-(D-2)/D) = base^(-(D-2)/D) / factor for base'",
            )
    with g.check("factor 1 keeps the base"):
        v = call_student(g, "ntk_scaled_base(10000.0, 32, 1.0)", ntk_scaled_base, 10000.0, 32, 1.0)
        g.expect(
            isinstance(v, (int, float)) and abs(v - 10000.0) <= 1e-9,
            f"ntk_scaled_base(10000.0, 32, 1.0) gave {v!r}, expected 10000.0",
        )
    with g.check("raises ValueError for an odd D or D <= 2, base <= 1 or factor <= 0"):
        for args in (
            (10000.0, 2, 4.0),
            (10000.0, 7, 4.0),
            (1.0, 8, 4.0),
            (10000.0, 8, 0.0),
            (10000.0, 8, -2.0),
        ):
            expect_value_error(g, lambda args=args: ntk_scaled_base(*args), "base, D, factor = " + repr(args))
    g.finish()


def check_ntk_scaled_base(ntk_scaled_base) -> None:
    """Public checks of ``ntk_scaled_base``: the docstring's example."""
    g = Grader("ntk_scaled_base (public)")
    with g.check("ntk_scaled_base(10000.0, 4, 4.0) is 160000.0"):
        v = call_student(g, "ntk_scaled_base(10000.0, 4, 4.0)", ntk_scaled_base, 10000.0, 4, 4.0)
        g.expect(
            isinstance(v, float) and abs(v - 160000.0) <= 1e-6,
            f"ntk_scaled_base(10000.0, 4, 4.0) gave {v!r}, expected 160000.0 (frequencies [1, 0.01] -> [1, 0.0025])",
        )
    g.finish()

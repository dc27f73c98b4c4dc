"""Checks for Exercise 3 (positional encodings): each graded part is a :class:`~coursekit.grading.spec.Spec`.

The clauses test against :mod:`coursekit.positional` in float64. Before the generic "differs" hint a test
names the common mistake that matches (swapped sine and cosine, the wrong RoPE pairing or direction, the
wrong ALiBi rule for head counts that are not powers of two, ...).

Over 500 lines: every clause of the exercise text for each graded part, with the inputs that provoke it
and the common mistakes each hint names; splitting it would scatter one exercise's specification.
"""

from __future__ import annotations

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
    dtype_name,
    expect_close,
    first_match,
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
from coursekit.grading.spec import Call, Clause, Spec, dtype_kept, new_tensor, raises, unchanged

_PARTS = ("sinusoidal_encoding", "apply_rope", "alibi_slopes", "alibi_bias", "predict_rope_offset")
_PARTS += ("predict_alibi_first_slope", "predict_position_length", "sinusoidal_similarity", "ntk_scaled_base")
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]

F64, F32, F16, BF16 = torch.float64, torch.float32, torch.float16, torch.bfloat16
_CHECKS = "keep the given argument checks"


def _args(**kwargs) -> str:
    """', base=100.0, scaling='ntk'' for the keyword arguments that are given."""
    return "".join(f", {k}={v!r}" for k, v in kwargs.items() if v is not None)


def _against(g: Grader, what: str, out: object, expected: torch.Tensor, mistakes, mag: float = 1.0) -> None:
    """``out`` against the reference's ``expected``; where they differ, the hint of the first common
    mistake that ``out`` equals (``mistakes()`` lists ``(wrong, hint)``, computed only then), else where."""
    if not close(out, expected, magnitude=mag):
        shape = tuple(expected.shape)
        g.expect(
            is_tensor(out) and out.shape == shape, f"{what}: expected a {shape} tensor, got {describe(out)}"
        )
        first_match(g, out, [(w, f"{what}: {h}") for w, h in mistakes()], right=expected)
        expect_close(g, what, out, expected, mag)


def _expect_kind(g: Grader, what: str, out: object, shape: tuple, dtype: torch.dtype, why: str = "") -> None:
    g.expect(
        is_tensor(out) and out.shape == shape and out.dtype == dtype,
        f"{what} should be a {dtype_name(dtype)} {shape} tensor, got {describe(out)}{why}",
    )


# --------------------------------------------------------------------------- sinusoidal


def _interleave(sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """(T, C/2) sines and cosines -> (T, C) with sin in even and cos in odd channels."""
    return torch.stack([sin, cos], dim=-1).flatten(-2)  # (T, C)


#: the hints of sinusoidal_encoding's common mistakes, in the order they are tried
_SINUSOIDAL_HINTS = {
    "swapped": "sin and cos are swapped: even channels 2i hold sin(p w_i), odd channels 2i+1 hold cos(p w_i)",
    "concatenated": "you put all the sines first and all the cosines after them: this encoding interleaves "
    "them, channel 2i = sin(p w_i) and channel 2i+1 = cos(p w_i)",
    "exponent": "the frequency exponent is off: pair i has w_i = base^(-2i/C), not base^(-i/C)",
    "per_channel": "the frequency exponent is off: channels 2i and 2i+1 share one frequency w_i = "
    "base^(-2i/C); you gave every channel c its own base^(-c/C)",
    "from_one": "row 0 must be position 0 (all sines 0, all cosines 1): your positions start at 1",
    "default_base": "the base argument is ignored: w_i = base^(-2i/C) with base={base:g}, not 10000",
    "float32_angles": "the frequencies were computed in float32 (off in the 8th digit): compute the angles in "
    "float64, torch.arange(..., dtype=torch.float64), and cast only the table to dtype",
    "inverse_base": "the frequencies are inverted: w_i = base^(-2i/C) (a negative exponent), so they fall "
    "from 1 to almost 1/base",
}


def _sinusoidal_mistakes(T: int, C: int, base: float) -> list[tuple[torch.Tensor, str]]:
    """The float64 tables that common mistakes produce, each with its hint."""
    pos = torch.arange(T, dtype=F64)[:, None]  # (T, 1)
    good = ref.sinusoidal_encoding(T, C, base=base, dtype=F64)  # (T, C)
    angles_i = pos * base ** (-torch.arange(C // 2, dtype=F64) / C)  # exponent i/C instead of 2i/C
    channel = torch.arange(C, dtype=F64)
    per_channel = pos * base ** (-channel / C)  # every channel its own frequency base^(-c/C)
    angles32 = pos * (base ** (-torch.arange(0, C, 2, dtype=torch.float32) / C)).double()
    wrong = {
        "swapped": _interleave(good[:, 1::2], good[:, 0::2]),
        "concatenated": torch.cat([good[:, 0::2], good[:, 1::2]], dim=-1),
        "exponent": _interleave(angles_i.sin(), angles_i.cos()),
        "per_channel": torch.where(channel.long() % 2 == 0, per_channel.sin(), per_channel.cos()),
        "from_one": ref.sinusoidal_encoding(T + 1, C, base=base, dtype=F64)[1:],
        "default_base": ref.sinusoidal_encoding(T, C, dtype=F64),
        "float32_angles": _interleave(angles32.sin(), angles32.cos()),
        "inverse_base": ref.sinusoidal_encoding(T, C, base=1.0 / base, dtype=F64),
    }
    return [(wrong[k], hint.format(base=base)) for k, hint in _SINUSOIDAL_HINTS.items()]


def _sinusoidal_kind(g: Grader, sinusoidal_encoding, case) -> None:
    """``(T, C, dtype)`` (dtype None: left out, float32): a (T, C) table of that dtype, accurate to it
    (for T in the hundreds and more, only if the angles were computed in float64)."""
    T, C, dtype = case
    what = f"sinusoidal_encoding({T}, {C}{_args(dtype=dtype)})"
    pe = call_student(g, what, sinusoidal_encoding, T, C, **({} if dtype is None else {"dtype": dtype}))
    _expect_kind(g, what, pe, (T, C), dtype or F32, "" if dtype else ": the default dtype is float32")
    digits = f": at large positions angles computed in {dtype_name(dtype or F32)} lose digits; compute them "
    advice = digits + "in float64, cast at the end" if T >= 300 else ""
    expect_close(g, what, pe, ref.sinusoidal_encoding(T, C, dtype=F64).to(dtype or F32), advice=advice)


def _sinusoidal_values(g: Grader, sinusoidal_encoding, case) -> None:
    """``(T, C)`` at the default base, or ``(T, C, base)``: the float64 table, a known mistake named."""
    T, C, base = case if len(case) == 3 else (*case, None)
    kwargs = {} if base is None else {"base": base}
    what = f"sinusoidal_encoding({T}, {C}{'' if base is None else f', base={base:g}'}, dtype=torch.float64)"
    pe = call_student(g, what, sinusoidal_encoding, T, C, **kwargs, dtype=F64)
    base = kwargs.get("base", 10000.0)
    expected = ref.sinusoidal_encoding(T, C, base=base, dtype=F64)
    _against(g, what, pe, expected, lambda: _sinusoidal_mistakes(T, C, base))


#: sinusoidal_encoding's arguments that the text rules out, by the name a hint gives them
_SINUSOIDAL_BAD = {"C=3": (4, 3), "C=0": (4, 0), "C=-2": (4, -2), "T=-1": (-1, 4), "base=0": (4, 4, 0.0)}
_SINUSOIDAL_BAD["base=-100"] = (4, 4, -100.0)


def _sinusoidal_bad(what: str) -> Call:
    T, C, *base = _SINUSOIDAL_BAD[what]
    return Call(f"sinusoidal_encoding({what})", (T, C), {"base": base[0]} if base else {})


SINUSOIDAL = Spec(
    "sinusoidal_encoding",
    [
        Clause(
            "returns a (T, C) tensor of the requested dtype (float32 by default)",
            _sinusoidal_kind,
            examples=[(5, 6, dtype) for dtype in (None, F64, F16, BF16)],
        ),
        Clause(
            "PE[p, 2i] = sin(p w_i), PE[p, 2i + 1] = cos(p w_i), w_i = 10000^(-2i/C), p = 0 .. T-1",
            _sinusoidal_values,
            st.tuples(st.integers(0, 12), st.integers(1, 8).map(lambda k: 2 * k)),
            examples=[(2, 4)],  # PE(1) = [sin 1, cos 1, sin 0.01, cos 0.01]
            key="sinusoidal.values",
            budget="wide",
            also=[(50, 16)],
        ),
        Clause(
            "uses the base argument: w_i = base^(-2i/C)",
            _sinusoidal_values,
            st.tuples(
                st.integers(2, 10),
                st.sampled_from([4, 6, 8, 12]),
                st.sampled_from([100.0, 2.0, 0.5, 10.0, 777.5, 1e5, 1e6]),
            ),
            examples=[(3, 4, 100.0), (2, 4, 100.0)],  # PE(1) = [sin 1, cos 1, sin 0.1, cos 0.1]
            key="sinusoidal.base",
            budget="wide",
        ),
        Clause(
            "the angles are computed in float64 and only the table is cast to dtype",
            _sinusoidal_kind,
            examples=[(4096, 16, None), (300, 8, F16)],
        ),
        raises(
            _sinusoidal_bad,
            text="C odd or not positive, T negative or base not positive raise a ValueError",
            fix=_CHECKS,
            examples=list(_SINUSOIDAL_BAD),
        ),
    ],
)
check_sinusoidal_encoding, grade_sinusoidal_encoding = SINUSOIDAL.graders()


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


#: the hints of apply_rope's common mistakes, in the order they are tried
_ROPE_HINTS = {
    "unchanged": "x came back unchanged: rotate each pair by the angle p * theta_i of its position",
    "interleaved": "you rotate neighbouring channels (2i, 2i+1) together: this convention is half-split, "
    "channel i pairs with channel i + D/2 (as in rotate_half)",
    "repeat_interleave": "the half-split pairs get the wrong frequencies: channels i and i + D/2 share "
    "theta_i, so build cos and sin with torch.cat([c, c], -1), not repeat_interleave",
    "backwards": "the rotation goes the wrong way: a pair (a, b) becomes (a cos - b sin, a sin + b cos), "
    "i.e. x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1)",
    "shifted": "your positions are shifted by one: use the positions given (the first token may have "
    "position 0)",
    "heads": "head h was rotated by the positions of sequence h: with positions (B, T) and x (B, H, T, D) "
    "insert a head axis, angles[:, None], so every head of sequence b uses row b",
    "arange": "the positions argument is ignored: you used 0 .. T-1 instead of the positions given",
    "integers": "the positions were cast to integers: positions may be floats, use them as they are",
    "no_scaling": "scaling and factor are ignored: pass them on to rope_angles",
    "no_base": "the base argument is ignored: pass base on to rope_angles",
}


def _rope_mistakes(x: torch.Tensor, positions: torch.Tensor, **kwargs) -> list:
    """What the common mistakes give on ``x`` and ``positions``, each with its hint (a mistake that
    changes nothing on this input gives the right answer, and :func:`first_match` skips it)."""
    wrong = {
        "unchanged": x,
        "interleaved": _rope_interleaved(x, positions, **kwargs),
        "repeat_interleave": _rope_repeat_interleave(x, positions, **kwargs),
        "backwards": ref.apply_rope(x, -positions, **kwargs),
        "shifted": ref.apply_rope(x, positions + 1, **kwargs),
        "heads": _rope_heads(x, positions, **kwargs),
        "arange": ref.apply_rope(x, torch.arange(x.shape[-2]).expand_as(positions), **kwargs),
        "integers": ref.apply_rope(x, positions.long(), **kwargs),
        "no_scaling": ref.apply_rope(x, positions, base=kwargs.get("base", 10000.0)),
        "no_base": ref.apply_rope(x, positions, **{k: v for k, v in kwargs.items() if k != "base"}),
    }
    return [(wrong[k], hint) for k, hint in _ROPE_HINTS.items()]


@st.composite
def _rope_shapes(draw, ranks=(4,), max_T=7, positions="arange"):
    """x's shape, positions and a seed: rank from ``ranks``; ``positions`` is 'arange', 'explicit'
    (integers or floats in any order), 'batched' ((B, T), one row per sequence) or 'large' (integers
    from 1000 to 4096)."""
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
    elif positions == "large":
        pos = draw(st.lists(st.integers(1000, 4096), min_size=T, max_size=T))
    else:
        pos = draw(st.lists(st.lists(st.integers(0, 60), min_size=T, max_size=T), min_size=B, max_size=B))
    return shape, pos, draw(st.integers(0, 2**16))


def _as_positions(pos) -> torch.Tensor:
    flat = pos if not pos or not isinstance(pos[0], list) else [v for row in pos for v in row]
    return torch.tensor(pos, dtype=F64 if any(isinstance(v, float) for v in flat) else torch.long)


def _rope_x(shape: tuple, seed) -> tuple[torch.Tensor, str]:
    """x of ``shape`` and how a hint names it: drawn from an integer seed, from a named seed
    (:func:`rand`), or with every row the given values (a worked example)."""
    if isinstance(seed, (int, str)):
        return (tensor(seed, *shape) if isinstance(seed, int) else rand(seed, *shape)), f"{shape}"
    row = ", ".join(f"{v:g}" for v in seed)
    return torch.tensor(seed, dtype=F64).expand(shape).contiguous(), f"{shape} with every row [{row}]"


def _rope_kind(g: Grader, apply_rope, dtype: torch.dtype) -> None:
    positions = torch.tensor([0, 3, 1, 7, 2])
    x = rand(f"rope.dtype.{dtype}", 2, 3, 5, 8).to(dtype)
    what = f"for x {describe(x)} and positions {positions.tolist()}"
    p = probe(apply_rope, x.clone(), positions.clone())
    out, (x_after, positions_after) = p.result, p.args
    kind = f"expected a tensor of x's shape and dtype, got {describe(out)}: cast cos and sin to x.dtype"
    g.expect(is_tensor(out) and out.shape == x.shape and out.dtype == dtype, f"{what}: {kind}")
    kept = lambda now, was: is_tensor(now) and torch.equal(now, was)
    g.expect(kept(x_after, x), f"{what}: x was modified in place: compute a new tensor")
    g.expect(kept(positions_after, positions), f"{what}: positions was modified in place")
    if dtype == F32:
        expect_close(g, what, out, ref.apply_rope(x.double(), positions).float(), magnitude(x))


def _rope_values(g: Grader, apply_rope, case) -> None:
    """``(shape, positions, seed)``, or ``((shape, positions, seed), (base, scaling, factor))``; the
    reference's result, a known mistake named."""
    (shape, pos, seed), (base, scaling, factor) = case if len(case) == 2 else (case, (None, None, None))
    if scaling == "ntk" and shape[-1] == 2:
        shape = (*shape[:-1], 4)  # NTK-aware scaling needs D > 2
    (x, named), positions = _rope_x(shape, seed), _as_positions(pos)
    kwargs = {k: v for k, v in (("base", base), ("scaling", scaling), ("factor", factor)) if v is not None}
    shown = str(positions.tolist()) if positions.numel() <= 8 else f"of shape {tuple(positions.shape)}"
    what = f"for x {named}{',' if len(case) == 2 else ' and'} positions {shown}{_args(**kwargs)}"
    out = call_student(g, what, apply_rope, x, positions, **kwargs)
    expected = ref.apply_rope(x, positions, **kwargs)
    _against(g, what, out, expected, lambda: _rope_mistakes(x, positions, **kwargs), magnitude(x))


def _rope_grad(g: Grader, apply_rope, case) -> None:
    shape, pos, name = case
    x, upstream, positions = rand(name, *shape), rand(f"{name}.up", *shape), torch.tensor(pos)
    p = probe(apply_rope, x.clone().requires_grad_(), positions, backward=(None, upstream))
    what = f"for x {shape} and positions {pos}"
    g.expect(
        is_tensor(p.result) and p.result.requires_grad,
        f"{what}: the output does not depend on x through autograd: avoid .detach(), .numpy() or .item()",
    )
    grad, expected = p.grads[0] if p.grads else None, ref.apply_rope(upstream, -positions)
    advice = " (it is the inverse rotation of the upstream gradient)"
    expect_close(g, f"{what}, the gradient with respect to x", grad, expected, advice=advice)


#: apply_rope's arguments that the text rules out (x is rand("rope.bad", 2, 3, 4, 6)), by their names in a hint
_ROPE_BAD = {
    "x (2, 3, 4, 5) (D odd)": lambda x: (rand("rope.bad.odd", 2, 3, 4, 5), torch.arange(4)),
    "x (6,) (one dimension)": lambda x: (rand("rope.bad.1d", 6), torch.arange(1)),
    "x (2, 3, 4, 6) and positions (5,)": lambda x: (x, torch.arange(5)),
    "x (2, 3, 4, 6) and positions (3, 4)": lambda x: (x, torch.zeros(3, 4, dtype=torch.long)),
    "x (4, 6) and positions (2, 4)": lambda x: (x[0, 0], torch.zeros(2, 4, dtype=torch.long)),
    "x (2, 3, 4, 6) and positions (2, 1, 4)": lambda x: (x, torch.zeros(2, 1, 4, dtype=torch.long)),
}


def _rope_unrotated(case) -> Call:
    """x at positions that are all 0: the rotation is the identity, the result still a new tensor."""
    shape, pos = case
    return Call(f"apply_rope(x {shape}, positions {pos})", (tensor(7, *shape), _as_positions(pos)))


def _rope_large(case) -> Call:
    dtype, (shape, pos, seed) = case
    where = f"apply_rope(x {shape} {dtype_name(dtype)}, positions {pos}) (positions in the thousands: take "
    where += "cos and sin of the float64 angles, then cast them to x.dtype)"
    return Call(where, (tensor(seed, *shape).to(dtype), torch.tensor(pos)))


def _rope_large_reference(case) -> torch.Tensor:
    x, positions = _rope_large(case).args
    return ref.apply_rope(x.double(), positions).to(x.dtype)


_ROPE_OPTIONS = st.tuples(
    st.sampled_from([None, 500.0, 10000.0, 1e6]),
    st.sampled_from([None, "linear", "ntk"]),
    st.sampled_from([None, 0.5, 2.0, 4.0, 8.0]),
)
_ROPE_FIXED = ((1, 2, 5, 8), [0, 10, 20, 30, 40], "rope.options.fixed")


def _rope_clause(text: str, key: str, inputs, examples, also=()) -> Clause:
    return Clause(text, _rope_values, inputs, examples, key=key, budget="wide", also=also)


ROPE = Spec(
    "apply_rope",
    [
        Clause(
            "returns a new tensor of x's shape and dtype, and leaves x and positions unchanged",
            _rope_kind,
            examples=[F32, F64, BF16],
        ),
        _rope_clause(
            "x (B, H, T, D) at positions 0 .. T-1: channels i and i + D/2 turn by p theta_i, "
            "(a, b) -> (a cos - b sin, a sin + b cos)",
            "rope.arange",
            _rope_shapes(),
            # and the docstring's example: [1, 0, 0, 0] at position 1 becomes [cos 1, 0, sin 1, 0]
            [((1, 1, 2, 4), [0, 1], 0), ((1, 1, 2, 4), [0, 1], (1.0, 0.0, 0.0, 0.0))],
        ),
        _rope_clause(
            "x may also be (B, T, D) or (T, D), positions (T,) shared by the batch",
            "rope.ranks",
            _rope_shapes(ranks=(2, 3)),
            [((2, 4), [0, 1], 1)],
        ),
        _rope_clause(
            "explicit positions (T,): any order, integers or floats, up to thousands",
            "rope.explicit",
            _rope_shapes(ranks=(2, 3, 4), positions="explicit"),
            [((1, 2, 6, 8), [5, 0, 17, 3, 100, 42], 2), ((1, 3, 4), [2.0, 0.5, 1.0], 5)],
        ),
        _rope_clause(
            "positions (B, T): every head of sequence b uses row b, for x (B, T, D) or (B, H, T, D)",
            "rope.batched",
            _rope_shapes(ranks=(3, 4), positions="batched"),
            [((2, 2, 4, 6), [[0, 1, 2, 3], [9, 4, 20, 7]], 3), ((2, 2, 4), [[0, 1], [1, 0]], 4)],
        ),
        _rope_clause(
            "passes base, scaling ('linear' or 'ntk') and factor on (factor defaults to 1.0)",
            "rope.options",
            st.tuples(_rope_shapes(ranks=(2, 4), positions="explicit"), _ROPE_OPTIONS),
            [
                (((1, 2, 5, 8), [0, 10, 20, 30, 40], 4), (500.0, None, None)),
                (((2, 4), [3, 8], 5), (None, "linear", 2.0)),
                (((2, 4), [3, 8], 5), (None, "ntk", 4.0)),
            ],
            also=[(_ROPE_FIXED, (None, s, f)) for s, f in (("linear", 4.0), ("ntk", 8.0), ("linear", None))]
            + [(_ROPE_FIXED, (None, None, 3.0))],
        ),
        Clause(
            "gradients flow back to x (the inverse rotation of the upstream gradient)",
            _rope_grad,
            examples=[((2, 2, 4, 6), [3, 1, 4, 1], "rope.grad")],
        ),
        raises(
            lambda what: Call(what, _ROPE_BAD[what](rand("rope.bad", 2, 3, 4, 6))),
            text="x with an odd D or fewer than 2 dims, or positions of another shape, raise a ValueError",
            fix=_CHECKS,
            examples=list(_ROPE_BAD),
        ),
        new_tensor(
            _rope_unrotated,
            text="returns a new tensor also where nothing turns (every position 0), never x itself",
            examples=[((2, 3, 4, 8), [0, 0, 0, 0]), ((3, 6), [0.0, 0.0, 0.0])],
            also=[((2, 1, 4), [[0], [0]])],
        ),
        dtype_kept(
            _rope_large,
            _rope_large_reference,
            st.tuples(st.sampled_from([F32, BF16, F16]), _rope_shapes(ranks=(2, 3, 4), positions="large")),
            key="rope.large",
            text="keeps x's dtype and its accuracy at positions in the thousands (float32, bfloat16, float16)",
            examples=[(F32, ((1, 2, 3, 8), [1000, 2500, 4096], 6)), (BF16, ((2, 4), [3000, 4001], 7))],
        ),
    ],
)
check_apply_rope, grade_apply_rope = ROPE.graders()


# --------------------------------------------------------------------------- ALiBi slopes


#: the hints of alibi_slopes' common mistakes, in the order they are tried
_SLOPES_HINTS = {
    "reversed": "the slopes are reversed: head 0 gets the steepest slope 2^(-8/n), e.g. 1/2 for 8 heads",
    "from_zero": "the exponents start at 0: the slopes are 2^(-8i/n) for i = 1 .. n, so the first is 2^(-8/n), "
    "not 1",
    "naive": "H = {H} is not a power of two: the paper's rule takes the {n} slopes for n = {n} heads, then "
    "the first {extra} of every other slope for 2n = {n2} heads (2^(-8i/H) is not that)",
    "odd_extras": "for H = {H} the extra slopes are every other slope of the {n2}-head sequence starting "
    "with its first, [0::2], not [1::2]",
    "sorted": "do not sort the slopes: the paper's order is the n slopes for n heads "
    "first, then the extra ones from the 2n-head sequence",
}


def _slopes_mistakes(H: int) -> list:
    """What the common mistakes give for ``H`` heads (float64), each with its hint."""
    n = 1 << (H.bit_length() - 1)  # the largest power of two <= H
    expected = ref.alibi_slopes(H, F64)
    geometric = lambda n: [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]  # noqa: E731 (n heads, n a power of 2)
    wrong = {
        "reversed": expected.flip(0),
        "from_zero": [2.0 ** (-8.0 * i / H) for i in range(H)],
        "naive": geometric(H),
        "odd_extras": geometric(n) + geometric(2 * n)[1::2][: H - n],
        "sorted": expected.sort(descending=True).values,
    }
    hints = {k: h.format(H=H, n=n, n2=2 * n, extra=H - n) for k, h in _SLOPES_HINTS.items()}
    return [(torch.as_tensor(wrong[k], dtype=F64), hint) for k, hint in hints.items()]


def _slopes_kind(g: Grader, alibi_slopes, case) -> None:
    H, dtype = case  # dtype None: the default, float32
    what = f"alibi_slopes({H}{_args(dtype=dtype)})"
    s = call_student(g, what, alibi_slopes, H, **({} if dtype is None else {"dtype": dtype}))
    g.expect(
        is_tensor(s) and s.shape == (H,) and s.dtype == (dtype or F32),
        f"{what} should be a {dtype_name(dtype or F32)} tensor of shape ({H},), got {describe(s)}",
    )
    expect_close(g, what, s, ref.alibi_slopes(H, F64).to(dtype or F32))


def _slopes_values(g: Grader, alibi_slopes, H: int) -> None:
    what = f"alibi_slopes({H}, torch.float64)"
    s = call_student(g, what, alibi_slopes, H, F64)
    _against(g, what, s, ref.alibi_slopes(H, F64), lambda: _slopes_mistakes(H))


SLOPES = Spec(
    "alibi_slopes",
    [
        Clause(
            "returns an (H,) tensor of the requested dtype (float32 by default)",
            _slopes_kind,
            examples=[(4, None), (12, None), (4, F64), (6, BF16)],
        ),
        Clause(
            "H a power of two: the geometric sequence 2^(-8i/H), i = 1 .. H",
            _slopes_values,
            st.integers(0, 7).map(lambda k: 2**k),
            examples=[8],  # [1/2, 1/4, ..., 1/256]
            key="alibi.slopes.pow2",
            budget="some",
        ),
        Clause(
            "other H: the n slopes for n heads, then every other slope for 2n heads (n = largest power of 2 < H)",
            _slopes_values,
            st.integers(3, 100).filter(lambda h: h & (h - 1) != 0),
            examples=[3],  # [1/16, 1/256, 1/4]
            key="alibi.slopes.other",
            budget="wide",
            also=[5, 6, 12, 20, 24],
        ),
        raises(
            lambda H: Call(f"alibi_slopes({H})", (H,)),
            text="H < 1 raises a ValueError",
            fix="keep the given argument check",
            examples=[0, -3],
            weight=0,  # the release gives this check: no credit alone
        ),
    ],
)
check_alibi_slopes, grade_alibi_slopes = SLOPES.graders()


# --------------------------------------------------------------------------- ALiBi bias


def _diagnose_bias(g: Grader, what: str, b: object, slopes: torch.Tensor, T: int, S: int) -> None:
    expected, H = ref.alibi_bias(slopes, T, S), slopes.shape[0]
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
    one_more = expected[past] - slopes[:, None, None].expand(H, T, S)[past]
    if bool((slopes != 0).any()) and close(b[past], one_more, magnitude=mag):
        g.fail(
            f"{what}: the distance is off by one: a query's own key gets bias 0, the key before it -m, "
            "then -2m, ..."
        )
    flipped = ref.alibi_bias(slopes.flip(0), T, S)
    if H > 1 and not close(flipped, expected) and close(b, flipped, magnitude=mag):
        g.fail(f"{what}: the heads use the slopes in reverse order: head h gets slopes[h]")


@st.composite
def _bias_shapes(draw, square=True):
    H, T = draw(st.integers(1, 5)), draw(st.integers(1 if square else 0, 8))
    S = None if square else T + draw(st.integers(0 if T else 1, 6))
    scale = draw(st.sampled_from([1.0, 0.01, 30.0]))
    return H, T, S, scale, draw(st.booleans()), draw(st.integers(0, 2**16))


def _bias_values(g: Grader, alibi_bias, case) -> None:
    """``(H, T, S, scale, signed, seed)`` (S None: left out); a tuple of slopes in place of the seed
    gives them. The reference's bias, a known mistake named."""
    H, T, S, scale, signed, seed = case
    slopes = torch.tensor(seed, dtype=F64) if isinstance(seed, tuple) else tensor(seed, H, scale=scale)
    slopes = slopes if signed else slopes.abs()
    shown = (
        "[" + ", ".join(f"{v:.4g}" for v in slopes.tolist()) + "]" if len(slopes) <= 4 else describe(slopes)
    )
    what = f"alibi_bias(slopes {shown}, {T}" + ("" if S is None else f", {S}") + ")"
    b = call_student(g, what, alibi_bias, slopes, T, *(() if S is None else (S,)))
    expected = ref.alibi_bias(slopes, T, S)
    if not close(b, expected, magnitude=magnitude(expected)):
        _diagnose_bias(g, what, b, slopes, T, T if S is None else S)
        expect_close(g, what, b, expected, magnitude(expected))


#: the slopes of the fixed cases
_SLOPE_VALUES = (0.5, 0.125, 0.03, 0.7)
_SLOPES = torch.tensor(_SLOPE_VALUES, dtype=F64)
_ON_SLOPES = "create the positions with device=slopes.device"


def _bias_on_slopes_device(g: Grader, alibi_bias, slopes: torch.Tensor, T: int, S: int) -> None:
    """``alibi_bias`` on CPU slopes while torch's default device, where the student's code runs, is
    ``meta`` (in-process and under the autograder alike): positions made without
    ``device=slopes.device`` land on ``meta``, and the call fails or its result is not on the CPU."""
    what = f"alibi_bias(slopes {tuple(slopes.shape)}, {T}, {S}) with torch's default device set to meta"
    try:
        with default_device():
            b = alibi_bias(slopes.clone(), T, S)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        if not meta_copy_refused(e):
            raise_unless_student_error(e)
        g.fail(f"{what}: {raised(e)}: {_ON_SLOPES}")
    g.expect(
        is_tensor(b) and b.device.type == "cpu",
        f"{what}: got {describe(b)}{' on ' + b.device.type if is_tensor(b) else ''}, not a tensor on the "
        f"slopes' device (cpu): {_ON_SLOPES}",
    )
    expected = ref.alibi_bias(slopes, T, S)  # on the CPU: the device is right, the rest is its own clause
    g.expect(
        b.dtype == expected.dtype,
        f"{what}: got {describe(b)}: the bias has the slopes' dtype, {dtype_name(expected.dtype)}",
    )
    expect_close(g, what, b, expected)


def _bias_kind(g: Grader, alibi_bias, case) -> None:
    """``case``: the slopes' dtype; "meta": slopes on the meta device (in-process only: meta tensors
    cannot cross the autograder's sandbox); "default device": torch's default device set to meta."""
    if case == "default device":
        return _bias_on_slopes_device(g, alibi_bias, _SLOPES, 3, 5)
    if case == "meta":
        if SESSION.get() is not None:  # under the autograder
            return
        what = "alibi_bias(slopes on the meta device, 3, 5)"
        try:
            b = alibi_bias(_SLOPES.to("meta"), 3, 5)
        except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
            raise_unless_student_error(e)
            g.fail(f"{what}: {raised(e)}: the bias must be on the slopes' device, {_ON_SLOPES}")
        where = f"{describe(b)} on {getattr(b, 'device', '?')}"
        g.expect(
            is_tensor(b) and b.device.type == "meta" and b.shape == (4, 3, 5),
            f"{what} should be a (4, 3, 5) tensor on the slopes' device (meta), got {where}: {_ON_SLOPES}",
        )
        return
    s = _SLOPES.to(case)
    what = f"alibi_bias({describe(s)} slopes, 4, 6)"
    b = call_student(g, what, alibi_bias, s, 4, 6)
    _expect_kind(g, what, b, (4, 4, 6), case)
    expect_close(g, what, b, ref.alibi_bias(s.double(), 4, 6).to(case), 5.0)


#: alibi_bias's arguments that the text rules out, by their names in a hint
_BIAS_BAD = {
    "alibi_bias(slopes, 5, 3) (S < T)": lambda: (_SLOPES.clone(), 5, 3),
    "alibi_bias(slopes, -1)": lambda: (_SLOPES.clone(), -1),
    "integer slopes": lambda: (torch.tensor([1, 2]), 3),
    "slopes of shape (1, 4)": lambda: (_SLOPES.clone()[None], 3),
    "slopes given as a list": lambda: (list(_SLOPE_VALUES), 3),
}

BIAS = Spec(
    "alibi_bias",
    [
        Clause(
            "returns an (H, T, S) tensor of the slopes' dtype, on the slopes' device",
            _bias_kind,
            examples=[F32, F64, BF16, "meta", "default device"],
        ),
        Clause(
            "S defaults to T: -m_h (i - j) for keys j <= i (0 on the query's own key), -inf for later keys",
            _bias_values,
            _bias_shapes(),
            # and the docstring's example: [0.5], T = 3 gives [[0, -inf, -inf], [-0.5, 0, -inf], [-1, -0.5, 0]]
            examples=[(1, 3, None, 1.0, False, 0), (1, 3, None, 1.0, True, (0.5,))],
            key="alibi.bias.square",
            budget="wide",
            also=[(4, T, None, 1.0, True, _SLOPE_VALUES) for T in (5, 1, 8)],
        ),
        Clause(
            "S > T keys: the queries are the last T of S positions (query i sits at i + S - T); T may be 0",
            _bias_values,
            _bias_shapes(square=False),
            examples=[
                (1, 2, 4, 1.0, False, 0),
                (2, 2, 4, 1.0, True, (0.5, 0.25)),
                (1, 0, 3, 1.0, True, (0.5,)),
            ],
            key="alibi.bias.rect",
            budget="wide",
            also=[(4, T, S, 1.0, True, _SLOPE_VALUES) for T, S in ((3, 7), (1, 5), (0, 3))],
        ),
        unchanged(
            lambda case: Call(f"alibi_bias(slopes, {case[0]}, {case[1]})", (_SLOPES.clone(), *case)),
            examples=[(4, 6)],
            text="leaves the slopes unchanged",
            advice="an alibi_bias that modified the slopes in place (their values or their shape) changes them "
            "for the caller; compute a new tensor (index them as slopes[:, None, None], no unsqueeze_)",
        ),
        raises(
            lambda what: Call(what, _BIAS_BAD[what]()),
            text="slopes that are not a floating (H,) tensor, S < T or T < 0 raise a ValueError",
            fix=_CHECKS,
            examples=list(_BIAS_BAD),
        ),
    ],
)
check_alibi_bias, grade_alibi_bias = BIAS.graders()


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
SIMILARITY_OPTIONS = (
    (5, 8, {"T": 1}),
    (3, 16, {"T": 7}),
    (4, 8, {"base": 100.0}),
    (2, 6, {"T": 2, "base": 50.0}),
)


def _similarity(g: Grader, sinusoidal_similarity, case) -> tuple[str, object]:
    """``(k, C)`` or ``(k, C, kwargs)``: the call's name in a hint, and its result."""
    k, C, kwargs = case if len(case) == 3 else (*case, {})
    where = f"sinusoidal_similarity({k}, {C}{_args(**kwargs)})"
    return where, call_student(g, where, sinusoidal_similarity, k, C, **kwargs)


def _similarity_float(g: Grader, sinusoidal_similarity, case) -> None:
    where, v = _similarity(g, sinusoidal_similarity, case)
    g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")


def _similarity_band(g: Grader, sinusoidal_similarity, case) -> None:
    """Within the band around the identity; ``k = 0`` within 1e-6 of 1."""
    where, v = _similarity(g, sinusoidal_similarity, case)
    if case[0] == 0:
        return expect_in_band(g, where, v, 1 - 1e-6, 1 + 1e-6, "divide the dot product by both rows' norms")
    kwargs = case[2] if len(case) == 3 else {}
    w = ref.rope_frequencies(case[1], kwargs.get("base", 10000.0))  # w_i = base^(-2i/C), as in PE
    truth = float((2.0 / case[1]) * torch.cos(case[0] * w).sum())  # the identity (2 / C) sum_i cos(k w_i)
    advice = (
        "pass base on to sinusoidal_encoding and average over exactly T pairs of rows"
        if kwargs
        else "compare row p with row p + k of sinusoidal_encoding(T + k, C), as a cosine similarity (the dot "
        "product divided by both norms), averaged over p = 0 .. T-1"
    )
    expect_in_band(g, where, v, truth - SIMILARITY_BAND, truth + SIMILARITY_BAND, advice)


SIMILARITY = Spec(
    "sinusoidal_similarity",
    [
        Clause("returns a Python float", _similarity_float, examples=[(3, 16)]),
        Clause(
            "an offset of 0 gives 1 (a position is identical to itself)",
            _similarity_band,
            examples=[(0, 4), (0, 64)],
        ),
        Clause(
            f"matches (2 / C) sum_i cos(k w_i) within {SIMILARITY_BAND} for several offsets and widths",
            _similarity_band,
            examples=SIMILARITY_CASES,
        ),
        Clause("uses T and base (T = 1, T = 7, base = 100)", _similarity_band, examples=SIMILARITY_OPTIONS),
        raises(
            lambda case: Call(f"k={case[0]}, T={case[1]}", (case[0], 8), {"T": case[1]}),
            text="raises ValueError for k < 0 or T < 1",
            fix="say which argument is out of range",
            examples=[(-1, 8), (2, 0)],
        ),
    ],
    extra_public=[
        Clause(
            "sinusoidal_similarity(1, 2) is cos 1 (the docstring's example)",
            _similarity_band,
            examples=[(1, 2)],
        )
    ],
)
check_sinusoidal_similarity, grade_sinusoidal_similarity = SIMILARITY.graders()


# --------------------------------------------------------------------------- stretch

NTK_CASES = ((10000.0, 64, 4.0), (10000.0, 128, 8.0), (500000.0, 16, 2.5), (10000.0, 4, 4.0), (100.0, 6, 0.5))
NTK_BAD = ((10000.0, 2, 4.0), (10000.0, 7, 4.0), (1.0, 8, 4.0), (10000.0, 8, 0.0), (10000.0, 8, -2.0))


def _ntk(g: Grader, ntk_scaled_base, case) -> tuple[str, object]:
    where = f"ntk_scaled_base({', '.join(map(repr, case))})"
    return where, call_student(g, where, ntk_scaled_base, *case)


def _ntk_float(g: Grader, ntk_scaled_base, case) -> None:
    where, v = _ntk(g, ntk_scaled_base, case)
    g.expect(type(v) is float, f"{where} should return a Python float, got {describe(v)}")


def _ntk_lowest(g: Grader, ntk_scaled_base, case) -> None:
    (base, D, factor), (where, v) = case, _ntk(g, ntk_scaled_base, case)
    g.expect(isinstance(v, (int, float)) and v > 1, f"{where} should be a base > 1, got {v!r}")
    lowest, want = float(ref.rope_frequencies(D, v)[-1]), float(ref.rope_frequencies(D, base)[-1]) / factor
    g.expect(
        abs(lowest - want) <= 1e-9 * want,
        f"{where} gave {v:.6g}: with it the lowest frequency base^(-(D-2)/D) is {lowest:.6g}, expected "
        f"{want:.6g} (factor times lower); solve base'^(-(D-2)/D) = base^(-(D-2)/D) / factor for base'",
    )


def _ntk_unchanged(g: Grader, ntk_scaled_base, case) -> None:
    where, v = _ntk(g, ntk_scaled_base, case)
    ok = isinstance(v, (int, float)) and abs(v - case[0]) <= 1e-9
    g.expect(ok, f"{where} gave {v!r}, expected {case[0]!r}")


NTK = Spec(
    "ntk_scaled_base",
    [
        Clause("returns a Python float", _ntk_float, examples=[(10000.0, 64, 4.0)]),
        Clause(
            "the lowest frequency becomes factor times lower, the highest stays 1",
            _ntk_lowest,
            examples=NTK_CASES,  # (10000.0, 4, 4.0): the docstring's 160000.0, frequencies [1, 0.0025]
        ),
        Clause("factor 1 keeps the base", _ntk_unchanged, examples=[(10000.0, 32, 1.0)]),
        raises(
            lambda args: Call("base, D, factor = " + repr(args), args),
            text="raises ValueError for an odd D or D <= 2, base <= 1 or factor <= 0",
            fix="say what was expected and what came",
            examples=NTK_BAD,
        ),
    ],
)
check_ntk_scaled_base, grade_ntk_scaled_base = NTK.graders()

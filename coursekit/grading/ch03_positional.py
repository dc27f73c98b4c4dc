"""Checks for Exercise 3 (positional encodings).

Each part has two entry points, both called from the notebook with the student's
object. ``check_*`` holds the *public* checks: small, fixed examples that a
student runs while working (and ``coursekit check`` runs). ``grade_*`` holds the
*hidden* checks: it compares the object with :mod:`coursekit.positional` on fresh
seeded inputs, diagnoses the common mistakes (swapped sine and cosine, the wrong
RoPE pairing or direction, the wrong ALiBi rule for head counts that are not
powers of two, ...) and tests properties. Both raise
:class:`~coursekit.grading.core.GradingFailure` with a hint per failed check.
"""

from __future__ import annotations

import math

import torch

from coursekit import positional as ref
from coursekit.grading.core import Grader, close, describe, is_tensor, probe, rand

__all__ = [
    "check_sinusoidal_encoding", "check_apply_rope", "check_alibi_slopes", "check_alibi_bias",
    "grade_sinusoidal_encoding", "grade_apply_rope", "grade_alibi_slopes", "grade_alibi_bias",
]

F64 = torch.float64


def _same(a: object, b: torch.Tensor) -> bool:
    """``a`` equals ``b`` where ``b`` is finite and is ``-inf`` exactly where ``b`` is (for biases)."""
    if not (is_tensor(a) and a.shape == b.shape and a.dtype == b.dtype):
        return False
    finite = torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), finite) or not torch.equal(a[~finite], b[~finite]):
        return False
    return close(a[finite], b[finite])


# --------------------------------------------------------------------------- sinusoidal


def _interleave(sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """(T, C/2) sines and cosines -> (T, C) with sin in even and cos in odd channels."""
    return torch.stack([sin, cos], dim=-1).flatten(-2)  # (T, C)


def _sinusoidal_variants(T: int, C: int, base: float) -> dict[str, torch.Tensor]:
    """The reference and the tables that common mistakes produce, in float64."""
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
    }


def _diagnose_sinusoidal(g: Grader, pe: object, T: int, C: int, base: float) -> None:
    wrong = _sinusoidal_variants(T, C, base)
    if close(pe, wrong["swapped"]):
        g.fail("sin and cos are swapped: even channels 2i hold sin(p w_i), odd channels 2i+1 hold cos(p w_i)")
    if close(pe, wrong["concatenated"]):
        g.fail(
            "you put all the sines first and all the cosines after them: this encoding interleaves them, "
            "channel 2i = sin(p w_i) and channel 2i+1 = cos(p w_i)"
        )
    if close(pe, wrong["exponent"]):
        g.fail("the frequency exponent is off: pair i has w_i = base^(-2i/C), not base^(-i/C)")
    if close(pe, wrong["per_channel"]):
        g.fail(
            "the frequency exponent is off: channels 2i and 2i+1 share one frequency w_i = base^(-2i/C); "
            "you gave every channel c its own base^(-c/C)"
        )
    if close(pe, wrong["from_one"]):
        g.fail("row 0 must be position 0 (all sines 0, all cosines 1): your positions start at 1")


def grade_sinusoidal_encoding(sinusoidal_encoding) -> None:
    """Grade a student's ``sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32)``."""
    g = Grader("sinusoidal_encoding")

    with g.check("returns a (T, C) tensor of the requested dtype"):
        pe = sinusoidal_encoding(5, 8)
        g.expect(
            is_tensor(pe) and pe.shape == (5, 8) and pe.dtype == torch.float32,
            f"sinusoidal_encoding(5, 8) should be a float32 tensor of shape (5, 8) by default, got {describe(pe)}",
        )
        pe = sinusoidal_encoding(5, 8, dtype=F64)
        g.expect(
            is_tensor(pe) and pe.shape == (5, 8) and pe.dtype == F64,
            f"with dtype=torch.float64 expected a float64 (5, 8) tensor, got {describe(pe)}: cast with .to(dtype)",
        )

    with g.check("PE(1) for C = 4 is [sin 1, cos 1, sin 0.01, cos 0.01]"):
        pe = sinusoidal_encoding(2, 4, dtype=F64)
        expected = torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], dtype=F64)
        g.expect(is_tensor(pe) and pe.shape == (2, 4), f"sinusoidal_encoding(2, 4) should be (2, 4), got {describe(pe)}")
        _diagnose_sinusoidal(g, pe, 2, 4, 10000.0)
        g.expect(close(pe[1], expected), f"PE(1) should be [0.841471, 0.540302, 0.0099998, 0.99995], got {pe[1].tolist()}")

    with g.check("matches the reference for T = 50, C = 16 (float64)"):
        pe = sinusoidal_encoding(50, 16, dtype=F64)
        _diagnose_sinusoidal(g, pe, 50, 16, 10000.0)
        g.expect(close(pe, ref.sinusoidal_encoding(50, 16, dtype=F64)), "the values differ from the reference encoding")

    with g.check("matches the reference in float32"):
        for T, C in ((64, 32), (7, 2)):
            pe = sinusoidal_encoding(T, C)
            g.expect(close(pe, ref.sinusoidal_encoding(T, C)), f"sinusoidal_encoding({T}, {C}) differs from the reference in float32")

    with g.check("uses the `base` argument"):
        pe = sinusoidal_encoding(20, 8, base=100.0, dtype=F64)
        if close(pe, ref.sinusoidal_encoding(20, 8, dtype=F64)):
            g.fail("the base argument is ignored: w_i = base^(-2i/C), with base=100 here, not 10000")
        _diagnose_sinusoidal(g, pe, 20, 8, 100.0)
        g.expect(close(pe, ref.sinusoidal_encoding(20, 8, base=100.0, dtype=F64)), "with base=100 the values differ from the reference")

    with g.check("PE(p + k) is a fixed rotation of PE(p)"):
        pe = sinusoidal_encoding(40, 12, dtype=F64)
        M = ref.sinusoidal_shift_matrix(5, 12)  # (C, C)
        g.expect(
            is_tensor(pe) and pe.shape == (40, 12) and close(pe[:35] @ M.T, pe[5:]),
            "PE(p + 5) is not the rotation M_5 PE(p) of every (sin, cos) pair: check the layout and frequencies",
        )

    g.finish()


# --------------------------------------------------------------------------- RoPE


def _rope_interleaved(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE pairing neighbours (2i, 2i+1) instead of (i, i + D/2)."""
    D = x.shape[-1]
    perm = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # (2i, 2i+1) -> (i, i + D/2)
    return ref.apply_rope(x[..., perm], positions)[..., torch.argsort(perm)]


def _rope_repeat_interleave(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Half-split rotation with angles laid out for interleaved pairs (cos.repeat_interleave(2))."""
    angles = ref.rope_angles(positions, x.shape[-1])  # (T, D/2)
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)  # (T, D)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _diagnose_rope(g: Grader, out: object, x: torch.Tensor, positions: torch.Tensor) -> None:
    if not (is_tensor(out) and out.shape == x.shape):
        g.fail(f"apply_rope must return a tensor of x's shape {tuple(x.shape)}, got {describe(out)}")
    if close(out, x) and bool((positions != 0).any()):
        g.fail("x came back unchanged: rotate each pair by the angle p * theta_i of its position")
    if close(out, _rope_interleaved(x, positions)):
        g.fail(
            "you rotate neighbouring channels (2i, 2i+1) together: this convention is half-split, "
            "channel i pairs with channel i + D/2 (as in rotate_half)"
        )
    if close(out, _rope_repeat_interleave(x, positions)):
        g.fail(
            "the half-split pairs get the wrong frequencies: channels i and i + D/2 share theta_i, so build "
            "cos and sin with torch.cat([c, c], -1), not repeat_interleave"
        )
    if close(out, ref.apply_rope(x, -positions)):
        g.fail(
            "the rotation goes the wrong way: a pair (a, b) becomes (a cos - b sin, a sin + b cos), "
            "i.e. x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1)"
        )
    if close(out, ref.apply_rope(x, positions + 1)):
        g.fail("your positions are shifted by one: use the `positions` given (the first token may have position 0)")
    T = x.shape[-2]
    if not torch.equal(positions, torch.arange(T).expand_as(positions)) and close(out, ref.apply_rope(x, torch.arange(T))):
        g.fail("the positions argument is ignored: you used 0 .. T-1 instead of the positions given")


def grade_apply_rope(apply_rope) -> None:
    """Grade a student's ``apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0)``."""
    g = Grader("apply_rope")

    with g.check("returns a tensor of x's shape and dtype"):
        for dtype in (torch.float32, F64):
            x = rand("rope.shape", 2, 3, 5, 8, dtype=dtype)
            out = apply_rope(x, torch.arange(5))
            g.expect(
                is_tensor(out) and out.shape == x.shape and out.dtype == dtype,
                f"for x {describe(x)} expected the same shape and dtype, got {describe(out)}: cast cos and sin to x.dtype",
            )

    with g.check("is the identity at position 0"):
        x = rand("rope.zero", 2, 2, 4, 8)
        out = apply_rope(x, torch.zeros(4, dtype=torch.long))
        if close(out, ref.apply_rope(x, torch.ones(4, dtype=torch.long))):
            g.fail("at position 0 the rotation must be the identity: your positions are shifted by one (start at 0)")
        g.expect(close(out, x), "at position 0 the rotation must be the identity (angle 0): apply_rope(x, zeros) should return x")

    with g.check("matches the reference for positions 0 .. T-1"):
        x = rand("rope.arange", 2, 3, 6, 8)
        positions = torch.arange(6)
        out = apply_rope(x, positions)
        _diagnose_rope(g, out, x, positions)
        g.expect(close(out, ref.apply_rope(x, positions)), "the rotated x differs from the reference")

    with g.check("uses explicit positions (T,)"):
        x = rand("rope.explicit", 2, 2, 6, 8)
        positions = torch.tensor([5, 0, 17, 3, 100, 42])
        out = apply_rope(x, positions)
        _diagnose_rope(g, out, x, positions)
        g.expect(close(out, ref.apply_rope(x, positions)), "with positions [5, 0, 17, 3, 100, 42] the result differs from the reference")

    with g.check("one row of positions per sequence (B, T), shared by the heads"):
        x = rand("rope.batched", 2, 2, 4, 6)  # B = H, so angles broadcast over the wrong axis run silently
        positions = torch.tensor([[0, 1, 2, 3], [9, 4, 20, 7]])
        out = apply_rope(x, positions)
        on_heads = torch.stack([torch.stack([ref.apply_rope(x[b, h], positions[h]) for h in range(2)]) for b in range(2)])
        if close(out, on_heads):
            g.fail(
                "head h was rotated by the positions of sequence h: with positions (B, T) and x (B, H, T, D) "
                "insert a head axis, angles[:, None], so every head of sequence b uses row b"
            )
        _diagnose_rope(g, out, x, positions)
        g.expect(close(out, ref.apply_rope(x, positions)), "with (B, T) positions the result differs from the reference")

    with g.check("preserves norms, and scores depend only on the offset"):
        q, k = rand("rope.q", 1, 1, 1, 16), rand("rope.k", 1, 1, 1, 16)

        def score(m, n):
            a, b = apply_rope(q, torch.tensor([m])), apply_rope(k, torch.tensor([n]))
            g.expect(is_tensor(a) and is_tensor(b) and a.shape == q.shape, f"apply_rope returned {describe(a)} for x {describe(q)}")
            return (a * b).sum()

        a = apply_rope(q, torch.tensor([7]))
        g.expect(is_tensor(a) and close(a.norm(), q.norm()), "the norm of x changed: each pair must be rotated, not scaled")
        g.expect(
            close(score(5, 3), score(12, 10)) and close(score(0, 9), score(30, 39)),
            "the score of a query at m and a key at n must depend only on n - m: (5, 3) and (12, 10) give different scores",
        )

    with g.check("passes base, scaling and factor on"):
        x = rand("rope.base", 1, 2, 5, 8)
        positions = torch.arange(0, 50, 10)
        g.expect(
            close(apply_rope(x, positions), ref.apply_rope(x, positions)),
            "plain RoPE already differs from the reference (see the checks above); fix that first",
        )
        for kwargs in ({"base": 500.0}, {"scaling": "linear", "factor": 4.0}, {"scaling": "ntk", "factor": 8.0}):
            out = apply_rope(x, positions, **kwargs)
            if close(out, ref.apply_rope(x, positions)):
                g.fail(f"with {kwargs} the result is plain RoPE: pass base, scaling and factor on to rope_angles")
            g.expect(close(out, ref.apply_rope(x, positions, **kwargs)), f"with {kwargs} the result differs from the reference")

    with g.check("gradients match the reference"):
        x = rand("rope.grad", 2, 2, 4, 6)
        positions = torch.tensor([3, 1, 4, 1])
        upstream = rand("rope.grad.up", 2, 2, 4, 6)
        p = probe(apply_rope, x.clone().requires_grad_(), positions, backward=(None, upstream))
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            "the output does not depend on x through autograd: avoid .detach(), .numpy() or .item()",
        )
        g.expect(
            p.grads is not None and p.grads[0] is not None and close(p.grads[0], ref.apply_rope(upstream, -positions)),
            "the gradient with respect to x differs from the reference (it is the inverse rotation of the upstream gradient)",
        )

    with g.check("leaves x and positions unchanged"):
        x = rand("rope.inplace", 1, 2, 4, 8)
        positions = torch.tensor([2, 0, 5, 1])
        p = probe(apply_rope, x.clone(), positions.clone())
        g.expect(is_tensor(p.args[0]) and torch.equal(p.args[0], x), "x was modified in place: compute a new tensor")
        g.expect(is_tensor(p.args[1]) and torch.equal(p.args[1], positions), "positions was modified in place")

    g.finish()


# --------------------------------------------------------------------------- ALiBi slopes


def _geometric(n: int) -> list[float]:
    return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]


def _diagnose_slopes(g: Grader, s: object, H: int) -> None:
    expected = ref.alibi_slopes(H, F64)
    if not (is_tensor(s) and s.shape == (H,)):
        g.fail(f"alibi_slopes({H}) should be a tensor of shape ({H},), got {describe(s)}")
    if H > 1 and close(s, expected.flip(0)):
        g.fail("the slopes are reversed: head 0 gets the steepest slope 2^(-8/n), e.g. 1/2 for 8 heads")
    if close(s, torch.tensor([2.0 ** (-8.0 * i / H) for i in range(H)], dtype=F64)):
        g.fail("the exponents start at 0: the slopes are 2^(-8i/n) for i = 1 .. n, so the first is 2^(-8/n), not 1")
    if H & (H - 1):  # not a power of two
        n = 1 << (H.bit_length() - 1)
        if close(s, torch.tensor(_geometric(H), dtype=F64)):
            g.fail(
                f"H = {H} is not a power of two: the paper's rule takes the {n} slopes for n = {n} heads, then the "
                f"first {H - n} of every other slope for 2n = {2 * n} heads (2^(-8i/H) is not that)"
            )
        if close(s, torch.tensor(_geometric(n) + _geometric(2 * n)[1::2][: H - n], dtype=F64)):
            g.fail(
                f"for H = {H} the extra slopes are every other slope of the {2 * n}-head sequence starting "
                "with its first, [0::2], not [1::2]"
            )
        if close(s, expected.sort(descending=True).values):
            g.fail(
                "do not sort the slopes: the paper's order is the n slopes for n heads first, "
                "then the extra ones from the 2n-head sequence"
            )


def grade_alibi_slopes(alibi_slopes) -> None:
    """Grade a student's ``alibi_slopes(H, dtype=torch.float32)``."""
    g = Grader("alibi_slopes")

    with g.check("returns an (H,) tensor of the requested dtype"):
        s = alibi_slopes(4)
        g.expect(
            is_tensor(s) and s.shape == (4,) and s.dtype == torch.float32,
            f"alibi_slopes(4) should be a float32 tensor of shape (4,) by default, got {describe(s)}",
        )
        s = alibi_slopes(4, F64)
        g.expect(is_tensor(s) and s.dtype == F64, f"alibi_slopes(4, torch.float64) should be float64, got {describe(s)}")

    with g.check("8 heads have the slopes 1/2, 1/4, ..., 1/256"):
        s = alibi_slopes(8, F64)
        _diagnose_slopes(g, s, 8)
        g.expect(close(s, torch.tensor([2.0**-i for i in range(1, 9)], dtype=F64)), f"expected [1/2, ..., 1/256], got {s}")

    with g.check("powers of two: the geometric sequence 2^(-8i/H)"):
        for H in (1, 2, 4, 16, 32):
            s = alibi_slopes(H, F64)
            _diagnose_slopes(g, s, H)
            g.expect(close(s, ref.alibi_slopes(H, F64)), f"alibi_slopes({H}) differs from 2^(-8i/{H}), i = 1 .. {H}")

    with g.check("other head counts follow the paper's rule"):
        for H in (3, 5, 6, 12, 20, 24):
            s = alibi_slopes(H, F64)
            _diagnose_slopes(g, s, H)
            g.expect(close(s, ref.alibi_slopes(H, F64)), f"alibi_slopes({H}) differs from the reference")

    with g.check("float32 values"):
        s = alibi_slopes(12)
        g.expect(close(s, ref.alibi_slopes(12)), "alibi_slopes(12) in float32 differs from the reference")

    g.finish()


# --------------------------------------------------------------------------- ALiBi bias


def _diagnose_bias(g: Grader, b: object, slopes: torch.Tensor, T: int, S: int) -> None:
    expected = ref.alibi_bias(slopes, T, S)
    H = slopes.shape[0]
    if not (is_tensor(b) and b.shape == (H, T, S)):
        g.fail(f"alibi_bias(slopes of {H} heads, T={T}, S={S}) should be a tensor of shape ({H}, {T}, {S}), got {describe(b)}")
    if b.dtype != slopes.dtype:
        g.fail(f"the bias should have the dtype of the slopes ({slopes.dtype}), got {b.dtype}")
    if S > T and _same(b, ref.alibi_bias(slopes, S)[:, :T]):
        g.fail(
            f"alibi_bias(slopes, {T}, {S}) is misaligned to the top-left: the queries are the last {T} of {S} "
            f"positions, so query i sits at position i + (S - T) and its own key is j = i + S - T (bias 0)"
        )
    past = torch.isfinite(expected)  # (H, T, S): keys the queries may see
    if not bool(torch.isneginf(b[~past]).all()):
        if close(b[past], expected[past]):
            g.fail("future keys must be -inf: the bias is also the causal mask (a query may not see keys after it)")
        g.fail("keys after the query must get -inf and keys up to the query a finite bias (is the bias causal and aligned?)")
    if not bool(torch.isfinite(b[past]).all()):
        g.fail("some keys up to and including the query got -inf: only future keys are masked")
    if bool((expected[past] != 0).any()) and close(b[past], -expected[past]):
        g.fail("the sign is flipped: keys further back must get a *more negative* bias, -m (i - j)")
    if close(b[past], expected[past] - slopes[:, None, None].expand(H, T, S)[past]):
        g.fail("the distance is off by one: a query's own key gets bias 0, the key before it -m, then -2m, ...")
    if H > 1 and T > 1 and close(b[past], ref.alibi_bias(slopes.flip(0), T, S)[past]):
        g.fail("the heads use the slopes in reverse order: head h gets slopes[h]")


def grade_alibi_bias(alibi_bias) -> None:
    """Grade a student's ``alibi_bias(slopes, T, S=None)``."""
    g = Grader("alibi_bias")
    slopes = torch.tensor([0.5, 0.125, 0.03, 0.7], dtype=F64)

    with g.check("returns an (H, T, S) tensor of the slopes' dtype"):
        b = alibi_bias(slopes.float(), 4)
        g.expect(
            is_tensor(b) and b.shape == (4, 4, 4) and b.dtype == torch.float32,
            f"alibi_bias(float32 slopes of 4 heads, T=4) should be a float32 (4, 4, 4) tensor, got {describe(b)}",
        )

    with g.check("square case (S = T): -m (i - j) for past keys, -inf for future ones"):
        for T in (5, 1, 8):
            b = alibi_bias(slopes, T)
            _diagnose_bias(g, b, slopes, T, T)
            g.expect(_same(b, ref.alibi_bias(slopes, T)), f"alibi_bias(slopes, {T}) differs from the reference")

    with g.check("with S > T keys, the queries are the last T positions (bottom-right alignment)"):
        for T, S in ((3, 7), (1, 5)):
            b = alibi_bias(slopes, T, S)
            _diagnose_bias(g, b, slopes, T, S)
            g.expect(_same(b, ref.alibi_bias(slopes, T, S)), f"alibi_bias(slopes, {T}, {S}) differs from the reference")

    with g.check("any slopes, any number of heads"):
        s = rand("alibi.bias.slopes", 7).abs()
        b = alibi_bias(s, 6)
        _diagnose_bias(g, b, s, 6, 6)
        g.expect(_same(b, ref.alibi_bias(s, 6)), "with 7 random slopes the bias differs from the reference")

    with g.check("leaves the slopes unchanged"):
        p = probe(alibi_bias, slopes.clone(), 4)
        g.expect(is_tensor(p.args[0]) and torch.equal(p.args[0], slopes), "the slopes were modified in place: compute a new tensor")

    g.finish()


# --------------------------------------------------------------------------- public checks


def check_sinusoidal_encoding(sinusoidal_encoding) -> None:
    """Public checks of ``sinusoidal_encoding`` on the fact PE(1) for C = 4."""
    g = Grader("sinusoidal_encoding (public)")
    with g.check("sinusoidal_encoding(3, 4) is (3, 4); PE(0) = [0, 1, 0, 1]; PE(1) = [0.841471, 0.540302, 0.0099998, 0.99995]"):
        pe = sinusoidal_encoding(3, 4)
        g.expect(
            is_tensor(pe) and pe.shape == (3, 4) and pe.dtype == torch.float32,
            f"sinusoidal_encoding(3, 4) must be a float32 (3, 4) tensor, got {describe(pe)}",
        )
        g.expect(torch.allclose(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0])), f"PE(0) should be [0, 1, 0, 1] (row 0 is position 0), got {pe[0].tolist()}")
        if torch.allclose(pe[1], torch.tensor([0.540302, 0.841471, 0.99995, 0.0099998]), atol=1e-6):
            g.fail("sin and cos are swapped: even channels hold sin, odd channels cos")
        g.expect(
            torch.allclose(pe[1], torch.tensor([0.841471, 0.540302, 0.0099998, 0.99995]), atol=1e-6),
            f"PE(1) should be [sin 1, cos 1, sin 0.01, cos 0.01] = [0.841471, 0.540302, 0.0099998, 0.99995], got {pe[1].tolist()}",
        )
    g.finish()


def check_apply_rope(apply_rope) -> None:
    """Public checks of ``apply_rope`` with D = 4 (frequencies 1 and 0.01)."""
    g = Grader("apply_rope (public)")
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # (T=2, D=4)
    with g.check("x = [1, 0, 0, 0] at positions [0, 1] becomes [1, 0, 0, 0] and [cos 1, 0, sin 1, 0]"):
        out = apply_rope(x, torch.tensor([0, 1]))
        g.expect(is_tensor(out) and out.shape == (2, 4), f"apply_rope must return a tensor of x's shape (2, 4), got {describe(out)}")
        g.expect(torch.allclose(out[0], x[0]), f"at position 0 the rotation must be the identity, got {out[0].tolist()}")
        c, s = math.cos(1.0), math.sin(1.0)
        if torch.allclose(out[1], torch.tensor([c, s, 0.0, 0.0]), atol=1e-6):
            g.fail("you rotate neighbouring channels (0, 1) together: with the half-split pairing channel 0 pairs with channel 2 = 0 + D/2")
        if torch.allclose(out[1], torch.tensor([c, 0.0, -s, 0.0]), atol=1e-6):
            g.fail("the rotation goes the wrong way: (a, b) becomes (a cos - b sin, a sin + b cos)")
        g.expect(torch.allclose(out[1], torch.tensor([c, 0.0, s, 0.0]), atol=1e-6), f"expected [0.5403, 0, 0.8415, 0] at position 1, got {out[1].tolist()}")
    with g.check("(B, H, T, D) input: norms are preserved"):
        y = rand("public.rope", 2, 3, 5, 8, dtype=torch.float32)
        out = apply_rope(y, torch.arange(5))
        g.expect(is_tensor(out) and out.shape == y.shape, f"expected shape {tuple(y.shape)}, got {describe(out)}")
        g.expect(torch.allclose(out.norm(dim=-1), y.norm(dim=-1), atol=1e-5), "the norms changed: each pair must be rotated, not scaled")
    g.finish()


def check_alibi_slopes(alibi_slopes) -> None:
    """Public checks of ``alibi_slopes`` for 8 heads and 3 heads."""
    g = Grader("alibi_slopes (public)")
    with g.check("alibi_slopes(8) is [1/2, 1/4, ..., 1/256]"):
        s = alibi_slopes(8)
        g.expect(is_tensor(s) and s.shape == (8,), f"alibi_slopes(8) must be a tensor of shape (8,), got {describe(s)}")
        g.expect(torch.allclose(s, torch.tensor([2.0**-i for i in range(1, 9)])), f"expected [0.5, 0.25, ..., 0.0039], got {s.tolist()}")
    with g.check("alibi_slopes(3) is [1/16, 1/256, 1/4] (3 is not a power of two)"):
        s = alibi_slopes(3)
        g.expect(is_tensor(s) and s.shape == (3,), f"alibi_slopes(3) must be a tensor of shape (3,), got {describe(s)}")
        g.expect(
            torch.allclose(s, torch.tensor([1 / 16, 1 / 256, 1 / 4])),
            f"expected [1/16, 1/256, 1/4] (the 2 slopes for 2 heads, then the first of every other slope for 4 heads), got {s.tolist()}",
        )
    g.finish()


def check_alibi_bias(alibi_bias) -> None:
    """Public checks of ``alibi_bias`` for one head with slope 1/2."""
    g = Grader("alibi_bias (public)")
    inf = math.inf
    with g.check("alibi_bias([0.5], 3) is [[0, -inf, -inf], [-0.5, 0, -inf], [-1, -0.5, 0]]"):
        b = alibi_bias(torch.tensor([0.5]), 3)
        g.expect(is_tensor(b) and b.shape == (1, 3, 3), f"alibi_bias(slopes of 1 head, 3) must be (1, 3, 3), got {describe(b)}")
        expected = torch.tensor([[[0.0, -inf, -inf], [-0.5, 0.0, -inf], [-1.0, -0.5, 0.0]]])
        g.expect(bool(torch.isneginf(b[0, 0, 1:]).all()), "future keys must be -inf: the bias is also the causal mask")
        g.expect(float(b[0, 1, 0]) < 0, "keys further back must get a negative bias, -m (i - j): is the sign flipped?")
        g.expect(torch.equal(torch.isfinite(b), torch.isfinite(expected)) and torch.allclose(b[torch.isfinite(b)], expected[torch.isfinite(expected)]), f"expected\n{expected}\ngot\n{b}")
    with g.check("alibi_bias([0.5], 2, 4): the last query sees all 4 keys"):
        b = alibi_bias(torch.tensor([0.5]), 2, 4)
        g.expect(is_tensor(b) and b.shape == (1, 2, 4), f"alibi_bias(slopes, 2, 4) must be (1, 2, 4), got {describe(b)}")
        g.expect(
            torch.allclose(b[0, 1], torch.tensor([-1.5, -1.0, -0.5, 0.0])),
            f"the last query sits at position 3 and sees keys 0..3 with biases [-1.5, -1, -0.5, 0], got {b[0, 1].tolist()}",
        )
    g.finish()

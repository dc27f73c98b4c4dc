"""Checks for Exercise 10 (long contexts).

Each part has two entry points, both called from the notebook with the student's function.
``check_*`` holds the *public* checks: small, fixed examples. ``grade_*`` holds the *hidden*
checks: the student's function against independent facts (plain attention from Chapter 1 with
the whole ``(T, S)`` score matrix, masks written from their definition, an explicit token-by-token
recurrence, the closed-form cache size) and against :mod:`coursekit.long_context` on fresh
seeded inputs, diagnosing the common mistakes first: an online softmax that does not rescale
its accumulator, divides too early or lets ``exp`` overflow; a window off by one, not causal
or aligned to the wrong corner; linear attention that is not causal, has no normaliser or a
feature map that is not positive; a cache size without the factor 2, with query heads or
without the dtype's size.

**What the checks cannot see.** Under the autograder only data crosses to the student's
process, so the graders see values, not memory. A tiled attention that secretly builds the
whole score matrix gives the right values; the chapter measures the difference. The causal
linear attention, though, is run at ``T = 200,000``, where a ``(T, T)`` matrix does not fit.
"""

from __future__ import annotations

import functools
import inspect
import textwrap

import torch
import torch.nn.functional as F

from coursekit import attention as att
from coursekit import long_context as ref
from coursekit.grading.core import (
    Grader,
    close,
    describe,
    expect_value_error,
    first_match,
    generator,
    is_tensor,
    probe,
    raise_unless_student_error,
    rand,
)

__all__ = [
    "check_tiled_attention", "check_sliding_window_mask", "check_causal_linear_attention", "check_kv_cache_size",
    "grade_tiled_attention", "grade_sliding_window_mask", "grade_causal_linear_attention", "grade_kv_cache_size",
]

F64 = torch.float64


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
_TILE_SOFTMAX = ("p = torch.exp(s - shift)", "p = torch.exp(s - shift); p = p / p.sum(dim=-1, keepdim=True).clamp_min(1e-300)")

_NO_RESCALE_ACC = ("the accumulator is not rescaled: when a tile raises a query's running maximum from m to m_new, "
                   "multiply the running sum l AND the accumulator acc by exp(m - m_new) before adding the tile's "
                   "exp(s - m_new) and exp(s - m_new) @ v")
_NO_RESCALE = ("neither the running sum nor the accumulator is rescaled: when a tile raises the running maximum from "
               "m to m_new, multiply l and acc by exp(m - m_new) before adding the new tile")
_DIVIDE_EARLY = ("each tile is normalised by its own sum (a softmax per tile): divide by the running sum only once, "
                 "after the last tile, out = acc / l")
_MAX_OVERFLOW = ("exp overflowed to inf (the output has inf or NaN) on scores that grow along the keys: the running "
                 "maximum is not updated. Set m_new = max(m, max of the tile's scores) at every tile, subtract m_new "
                 "before exp, and rescale the old l and acc by exp(m - m_new)")
_TOP_LEFT = ("the causal mask is aligned to the top left: with S > T keys the queries are the LAST T positions, so "
             "query i sits at position i + S - T and sees keys j <= i + S - T")
_NO_SCALE = "the scores are not scaled: multiply q k^T by scale, which defaults to 1 / sqrt(D)"
_NAN_TILES = ("the output has NaN or inf although the scores are small: a row of a tile can be fully masked (a causal tile "
              "partly in the future, or the mask) while the query sees keys in other tiles. exp(-inf - (-inf)) is NaN and "
              "a tile's sum can be 0: subtract 0 where the running maximum is still -inf, and divide by l only once, "
              "after the last tile")
_MASKED_NAN = ("a query that may attend to no key must get a zero output, not NaN: keep l = 0 for it and divide by "
               "torch.where(l > 0, l, 1); also exp(-inf - (-inf)) is NaN, so where the running maximum is still -inf "
               "subtract 0 instead")


def _naive(q, k, v, causal=False, mask=None, scale=None):
    if causal:
        c = att.causal_mask(q.shape[-2], k.shape[-2])
        mask = c if mask is None else mask & c
    return att.scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)[0]


def _tiled_mistakes(q, k, v, causal=False, mask=None, block_q=64, block_k=64):
    kw = dict(causal=causal, mask=mask, block_q=block_q, block_k=block_k)
    T, S = q.shape[-2], k.shape[-2]
    top_left = torch.ones(T, S, dtype=torch.bool).tril()
    return [
        (_tiled_with(_RESCALE_ACC)(q, k, v, **kw), _NO_RESCALE_ACC),
        (_tiled_with(_RESCALE_ACC, _RESCALE_L)(q, k, v, **kw), _NO_RESCALE),
        (_tiled_with(_TILE_SOFTMAX)(q, k, v, **kw), _DIVIDE_EARLY),
        (_naive(q, k, v, mask=top_left if mask is None else mask & top_left) if causal else None, _TOP_LEFT),
        (_naive(q, k, v, causal, mask, scale=1.0), _NO_SCALE),
    ]


def _tiled_call(g: Grader, tiled_attention, q, k, v, **kw):
    out = tiled_attention(q, k, v, **kw)
    expected = _naive(q, k, v, kw.get("causal", False), kw.get("mask"), kw.get("scale"))
    g.expect(is_tensor(out) and out.shape == expected.shape and out.dtype == q.dtype,
             f"expected a {str(q.dtype).removeprefix('torch.')} tensor of shape {tuple(expected.shape)} "
             f"(..., T, Dv), got {describe(out)}")
    return out, expected


def _tiled_matches(g: Grader, tiled_attention, q, k, v, what: str, overflow: bool = False, **kw) -> None:
    out, expected = _tiled_call(g, tiled_attention, q, k, v, **kw)
    if not bool(out.isfinite().all()):
        g.fail(_MAX_OVERFLOW if overflow else _NAN_TILES)
    kw.pop("scale", None)
    first_match(g, out, _tiled_mistakes(q, k, v, **kw), expected)
    g.expect(close(out, expected), f"{what}: the result differs from attention with the whole score matrix")


def grade_tiled_attention(tiled_attention) -> None:
    """Grade a student's ``tiled_attention(q, k, v, causal=False, mask=None, block_q=64, block_k=64, scale=None)``."""
    g = Grader("tiled_attention")

    with g.check("returns (..., T, Dv) of q's dtype"):
        for dtype in (F64, torch.float32):
            q, k, v = rand("tiled.shape.q", 2, 3, 5, 4, dtype=dtype), rand("tiled.shape.k", 2, 3, 7, 4, dtype=dtype), \
                rand("tiled.shape.v", 2, 3, 7, 6, dtype=dtype)
            _tiled_call(g, tiled_attention, q, k, v, block_q=2, block_k=3)

    with g.check("one tile (blocks larger than T and S) equals plain attention"):
        q, k, v = rand("tiled.one.q", 2, 6, 8), rand("tiled.one.k", 2, 9, 8), rand("tiled.one.v", 2, 9, 5)
        _tiled_matches(g, tiled_attention, q, k, v, "with a single tile", block_q=64, block_k=64)

    with g.check("many tiles, including tiles that do not divide T or S"):
        q, k, v = rand("tiled.many.q", 2, 2, 13, 8, scale=2.0), rand("tiled.many.k", 2, 2, 21, 8, scale=2.0), \
            rand("tiled.many.v", 2, 2, 21, 4)
        for bq, bk in ((1, 1), (4, 5), (13, 8), (5, 21), (64, 3)):
            _tiled_matches(g, tiled_attention, q, k, v, f"with block_q={bq}, block_k={bk}", block_q=bq, block_k=bk)

    with g.check("causal, with S == T and with S > T (bottom-right aligned)"):
        for T, S, bq, bk in ((12, 12, 4, 4), (12, 12, 5, 3), (7, 19, 3, 4), (1, 10, 1, 3)):
            q, k, v = rand(f"tiled.causal.{T}.{S}.q", 2, T, 8, scale=2.0), rand(f"tiled.causal.{T}.{S}.k", 2, S, 8, scale=2.0), \
                rand(f"tiled.causal.{T}.{S}.v", 2, S, 3)
            _tiled_matches(g, tiled_attention, q, k, v, f"causal with T={T}, S={S}", causal=True, block_q=bq, block_k=bk)

    with g.check("a boolean mask; queries that may attend to no key give zeros, not NaN"):
        q, k, v = rand("tiled.mask.q", 2, 9, 4), rand("tiled.mask.k", 2, 11, 4), rand("tiled.mask.v", 2, 11, 4)
        mask = torch.rand(9, 11, generator=generator("tiled.mask")) < 0.6
        mask[[1, 6]] = False
        out, expected = _tiled_call(g, tiled_attention, q, k, v, mask=mask, block_q=4, block_k=4)
        if not bool(out.isfinite().all()):
            g.fail(_MASKED_NAN)
        first_match(g, out, _tiled_mistakes(q, k, v, mask=mask, block_q=4, block_k=4), expected)
        g.expect(close(out, expected), "with a boolean mask (True = may attend) the result differs from plain attention")
        out, expected = _tiled_call(g, tiled_attention, q, k[:, :9], v[:, :9], causal=True, mask=mask[:, :9], block_q=3, block_k=2)
        if not bool(out.isfinite().all()):
            g.fail(_MASKED_NAN)
        g.expect(close(out, expected), "with causal=True and a mask together the result differs from plain attention "
                                       "(a key must be allowed by both, and queries 1 and 6 see no key at all)")

    with g.check("scores that overflow exp: the running maximum follows the scores"):
        q = torch.full((1, 5, 4), 10.0, dtype=F64)
        k = torch.linspace(0, 60, 40, dtype=F64)[None, :, None].expand(1, 40, 4)  # scores grow to 2400
        v = rand("tiled.overflow.v", 1, 40, 3)
        _tiled_matches(g, tiled_attention, q, k, v, "with scores up to 2400", overflow=True, block_q=2, block_k=8, scale=1.0)

    with g.check("float32 agrees with plain attention"):
        q, k, v = (rand(f"tiled.f32.{n}", 2, 40, 16, dtype=torch.float32) for n in "qkv")
        _tiled_matches(g, tiled_attention, q, k, v, "in float32", causal=True, block_q=16, block_k=16)

    with g.check("uses the scale argument"):
        q, k, v = rand("tiled.scale.q", 1, 6, 4), rand("tiled.scale.k", 1, 6, 4), rand("tiled.scale.v", 1, 6, 4)
        out, expected = _tiled_call(g, tiled_attention, q, k, v, scale=0.3, block_q=2, block_k=2)
        if close(out, _naive(q, k, v)):
            g.fail("the scale argument is ignored: with scale given, multiply the scores by it instead of 1 / sqrt(D)")
        g.expect(close(out, expected), "with scale=0.3 the result differs from plain attention with that scale")

    with g.check("gradients equal those of plain attention"):
        q, k, v = rand("tiled.grad.q", 2, 7, 4), rand("tiled.grad.k", 2, 9, 4), rand("tiled.grad.v", 2, 9, 3)
        up = rand("tiled.grad.up", 2, 7, 3)
        p = probe(tiled_attention, q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_(),
                  causal=True, block_q=3, block_k=2, backward=(None, up))
        g.expect(is_tensor(p.result) and p.result.requires_grad,
                 "the output does not depend on q, k, v through autograd: avoid .detach(), .item() or torch.tensor(...)")
        refs = [t.clone().requires_grad_() for t in (q, k, v)]
        (_naive(*refs, causal=True) * up).sum().backward()
        for name, got, want in zip("qkv", p.grads or [None] * 3, refs):
            g.expect(is_tensor(got) and close(got, want.grad), f"the gradient with respect to {name} differs from plain attention's")

    with g.check("block sizes below 1 raise ValueError"):
        x = rand("tiled.bad", 1, 4, 2)
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_q=0), "block_q=0")
        expect_value_error(g, lambda: tiled_attention(x, x, x, block_k=-2), "block_k=-2")

    g.finish()


def check_tiled_attention(tiled_attention) -> None:
    """Public checks of ``tiled_attention`` on small examples."""
    g = Grader("tiled_attention (public)")
    with g.check("6 queries, 6 keys, tiles of 2 and 4: equals attention with the whole score matrix"):
        q, k, v = rand("public.tiled.q", 1, 6, 4, scale=3.0), rand("public.tiled.k", 1, 6, 4, scale=3.0), \
            rand("public.tiled.v", 1, 6, 2)
        _tiled_matches(g, tiled_attention, q, k, v, "block_q=2, block_k=4", block_q=2, block_k=4)
    with g.check("causal: query i sees keys 0 .. i"):
        _tiled_matches(g, tiled_attention, q, k, v, "causal, block_q=4, block_k=2", causal=True, block_q=4, block_k=2)
    with g.check("causal with 3 queries and 6 keys: the queries are positions 3, 4, 5"):
        _tiled_matches(g, tiled_attention, q[:, 3:], k, v, "causal, T=3, S=6, block_q=2, block_k=4",
                       causal=True, block_q=2, block_k=4)
    g.finish()


# =========================================================================== part 2: sliding-window mask


def _window(T, S, allowed) -> torch.Tensor:
    """A (T, S) mask from a predicate on (query position p, key position j)."""
    p = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    return allowed(p, j).expand(T, S)


def _window_mistakes(T, S, W):
    return [
        (_window(T, S, lambda p, j: (j <= p) & (j >= p - W)),
         "the window is off by one: it holds W + 1 keys. Query p sees keys p - W < j <= p, itself and the W - 1 before it"),
        (_window(T, S, lambda p, j: (j <= p) & (j > p - W + 1)),
         "the window is off by one: it holds W - 1 keys. Query p sees keys p - W < j <= p, itself and the W - 1 before it"),
        (_window(T, S, lambda p, j: (p - j).abs() < W),
         "the window is not causal: it lets a query see keys after it. Keep only keys j <= p (and j > p - W)"),
        (_window(T, S, lambda p, j: (j >= p) & (j < p + W)),
         "the window looks into the future: a query sees itself and the keys BEFORE it, p - W < j <= p"),
        (_window(T, S, lambda p, j: (j <= p - (S - T)) & (j > p - (S - T) - W)),
         "the mask is aligned to the top left: with S > T keys, query i sits at position p = i + S - T"),
        (~ref.sliding_window_mask(T, W, S), "the mask is inverted: True means the query MAY attend to the key"),
    ]


def _window_call(g: Grader, sliding_window_mask, T, W, S=None):
    out = sliding_window_mask(T, W) if S is None else sliding_window_mask(T, W, S)
    S_ = T if S is None else S
    g.expect(is_tensor(out) and out.shape == (T, S_) and out.dtype == torch.bool,
             f"sliding_window_mask({T}, {W}{'' if S is None else f', {S}'}) should be a boolean tensor of shape "
             f"({T}, {S_}), got {describe(out)}")
    return out


def _window_matches(g: Grader, sliding_window_mask, T, W, S=None) -> None:
    out = _window_call(g, sliding_window_mask, T, W, S)
    S_ = T if S is None else S
    expected = ref.sliding_window_mask(T, W, S_)
    for wrong, hint in _window_mistakes(T, S_, W):
        if not torch.equal(wrong, expected) and torch.equal(out, wrong):
            g.fail(hint)
    g.expect(torch.equal(out, expected),
             f"sliding_window_mask({T}, {W}{'' if S is None else f', {S}'}) differs from the definition "
             f"(query p sees keys p - W < j <= p): rows {[i for i in range(T) if not torch.equal(out[i], expected[i])][:5]} differ")


def grade_sliding_window_mask(sliding_window_mask) -> None:
    """Grade a student's ``sliding_window_mask(T, window, S=None, device=None)``."""
    g = Grader("sliding_window_mask")

    with g.check("returns a (T, S) boolean tensor"):
        _window_call(g, sliding_window_mask, 5, 2)
        _window_call(g, sliding_window_mask, 3, 2, 6)

    with g.check("each query sees itself and the window - 1 keys before it"):
        for T, W in ((4, 2), (9, 3), (16, 5), (6, 1)):
            _window_matches(g, sliding_window_mask, T, W)

    with g.check("the number of keys per query is min(p + 1, window)"):
        out = _window_call(g, sliding_window_mask, 20, 6)
        g.expect(torch.equal(out.sum(-1), (torch.arange(20) + 1).clamp(max=6)),
                 f"rows should hold min(p + 1, 6) keys each, got {out.sum(-1).tolist()}")

    with g.check("a window as long as the sequence is the causal mask; window 1 is the diagonal"):
        for T, W in ((7, 7), (7, 50)):
            out = _window_call(g, sliding_window_mask, T, W)
            g.expect(torch.equal(out, att.causal_mask(T)), f"sliding_window_mask({T}, {W}) should equal the causal mask")
        out = _window_call(g, sliding_window_mask, 5, 1)
        g.expect(torch.equal(out, torch.eye(5, dtype=torch.bool)), "with window 1 a query sees only itself: the diagonal")

    with g.check("with S > T keys the queries are the last T positions (bottom-right)"):
        for T, W, S in ((3, 2, 8), (4, 3, 5), (1, 4, 9), (5, 10, 12)):
            _window_matches(g, sliding_window_mask, T, W, S)

    with g.check("a window below 1 raises ValueError"):
        expect_value_error(g, lambda: sliding_window_mask(4, 0), "sliding_window_mask(4, 0)")
        expect_value_error(g, lambda: sliding_window_mask(4, -3), "sliding_window_mask(4, -3)")

    g.finish()


def check_sliding_window_mask(sliding_window_mask) -> None:
    """Public checks of ``sliding_window_mask`` on the examples of the exercise."""
    g = Grader("sliding_window_mask (public)")
    with g.check("sliding_window_mask(4, 2) is [[1,0,0,0], [1,1,0,0], [0,1,1,0], [0,0,1,1]]"):
        _window_matches(g, sliding_window_mask, 4, 2)
    with g.check("sliding_window_mask(2, 3, 5): the two queries are positions 3 and 4"):
        _window_matches(g, sliding_window_mask, 2, 3, 5)
    g.finish()


# =========================================================================== part 3: causal linear attention


def _parallel(q, k, v, phi, causal=True, eps=1e-6, diagonal=0):
    A = phi(q) @ phi(k).transpose(-2, -1)  # (..., T, T)
    if causal:
        A = A.tril(diagonal)
    return (A @ v) / (A.sum(-1, keepdim=True) + eps)


def _recurrence(q, k, v, eps):
    """Linear attention as an RNN, token by token: the independent reference."""
    phi = ref.elu_feature_map
    state = torch.zeros(*q.shape[:-2], q.shape[-1], v.shape[-1], dtype=q.dtype)
    z = torch.zeros(*q.shape[:-2], q.shape[-1], dtype=q.dtype)
    out = []
    for t in range(q.shape[-2]):
        pk, pq = phi(k[..., t, :]), phi(q[..., t, :])
        state = state + pk.unsqueeze(-1) * v[..., t, :].unsqueeze(-2)  # (..., D, Dv)
        z = z + pk
        out.append((pq.unsqueeze(-2) @ state).squeeze(-2) / ((pq * z).sum(-1, keepdim=True) + eps))
    return torch.stack(out, dim=-2)


_NOT_CAUSAL = ("the result is not causal: query i used the sums over ALL keys. Use running sums (cumsum over the "
               "sequence axis) so that query i sees keys 0 .. i only")
_NO_NORMALISER = ("the normaliser is missing: divide phi(q_i) S_i by phi(q_i) . z_i + eps, where z_i is the running "
                  "sum of phi(k_j)")
_NOT_POSITIVE = ("the feature map is not positive: apply phi(x) = elu(x) + 1 (the given elu_feature_map) to q and k, "
                 "so that every weight phi(q) . phi(k) is positive")


def _linear_mistakes(q, k, v, eps):
    phi = ref.elu_feature_map
    A = (phi(q) @ phi(k).transpose(-2, -1)).tril()
    return [
        (ref.linear_attention(q, k, v, eps=eps), _NOT_CAUSAL),
        (A @ v, _NO_NORMALISER),
        (_parallel(q, k, v, F.elu, eps=eps), _NOT_POSITIVE),
        (_parallel(q, k, v, lambda x: x, eps=eps), _NOT_POSITIVE),
        (_parallel(q, k, v, F.relu, eps=eps), _NOT_POSITIVE),
        (_parallel(q, k, v, phi, eps=eps, diagonal=-1),
         "query i does not see key i: the running sums must include position i (an inclusive cumsum)"),
        (_parallel(q, k, v, phi, eps=0.0),
         "eps is not used: divide by (phi(q_i) . z_i + eps)"),
        ((A @ v + eps) / (A.sum(-1, keepdim=True) + eps), "eps belongs to the denominator only: (phi(q_i) S_i) / (phi(q_i) . z_i + eps)"),
    ]


def _linear_matches(g: Grader, causal_linear_attention, q, k, v, what: str, **kw) -> None:
    out = causal_linear_attention(q, k, v, **kw)
    eps = kw.get("eps", 1e-6)
    expected = _recurrence(q, k, v, eps)
    g.expect(is_tensor(out) and out.shape == expected.shape and out.dtype == q.dtype,
             f"expected a {str(q.dtype).removeprefix('torch.')} tensor of shape {tuple(expected.shape)} (..., T, Dv), got {describe(out)}")
    first_match(g, out, _linear_mistakes(q, k, v, eps), expected)
    g.expect(close(out, expected), f"{what}: the result differs from the token-by-token recurrence of linear attention")


def grade_causal_linear_attention(causal_linear_attention) -> None:
    """Grade a student's ``causal_linear_attention(q, k, v, eps=1e-6)``."""
    g = Grader("causal_linear_attention")

    with g.check("returns (..., T, Dv) of q's dtype"):
        for dtype in (F64, torch.float32):
            q, k = rand("lin.shape.q", 2, 3, 5, 4, dtype=dtype), rand("lin.shape.k", 2, 3, 5, 4, dtype=dtype)
            v = rand("lin.shape.v", 2, 3, 5, 6, dtype=dtype)
            out = causal_linear_attention(q, k, v)
            g.expect(is_tensor(out) and out.shape == (2, 3, 5, 6) and out.dtype == dtype,
                     f"for q, k {describe(q)} and v {describe(v)} expected a {str(dtype).removeprefix('torch.')} tensor of "
                     f"shape (2, 3, 5, 6), got {describe(out)}")

    with g.check("equals the token-by-token recurrence"):
        for shape in ((1, 9, 4, 4), (2, 3, 17, 8, 5), (1, 1, 2, 3)):
            *lead, T, D, Dv = shape
            q, k = rand(f"lin.rec.{shape}.q", *lead, T, D, scale=1.5), rand(f"lin.rec.{shape}.k", *lead, T, D, scale=1.5)
            v = rand(f"lin.rec.{shape}.v", *lead, T, Dv)
            _linear_matches(g, causal_linear_attention, q, k, v, f"for q, k {tuple(q.shape)} and v {tuple(v.shape)}")

    with g.check("changing future keys and values leaves earlier outputs unchanged"):
        q, k, v = rand("lin.future.q", 1, 12, 4), rand("lin.future.k", 1, 12, 4), rand("lin.future.v", 1, 12, 4)
        k2, v2 = k.clone(), v.clone()
        k2[:, 8:], v2[:, 8:] = rand("lin.future.k2", 1, 4, 4, scale=3.0), rand("lin.future.v2", 1, 4, 4, scale=3.0)
        a, b = causal_linear_attention(q, k, v), causal_linear_attention(q, k2, v2)
        g.expect(is_tensor(a) and is_tensor(b) and a.shape == (1, 12, 4) and close(b[:, :8], a[:, :8]), _NOT_CAUSAL)

    with g.check("uses the eps argument"):
        q, k, v = rand("lin.eps.q", 1, 6, 3), rand("lin.eps.k", 1, 6, 3), rand("lin.eps.v", 1, 6, 3)
        _linear_matches(g, causal_linear_attention, q, k, v, "with eps=0.5", eps=0.5)

    with g.check("gradients equal those of the recurrence"):
        q, k, v = rand("lin.grad.q", 2, 6, 3), rand("lin.grad.k", 2, 6, 3), rand("lin.grad.v", 2, 6, 2)
        up = rand("lin.grad.up", 2, 6, 2)
        p = probe(causal_linear_attention, q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_(),
                  backward=(None, up))
        g.expect(is_tensor(p.result) and p.result.requires_grad,
                 "the output does not depend on q, k, v through autograd: avoid .detach(), .item() or torch.tensor(...)")
        refs = [t.clone().requires_grad_() for t in (q, k, v)]
        (_recurrence(*refs, 1e-6) * up).sum().backward()
        for name, got, want in zip("qkv", p.grads or [None] * 3, refs):
            g.expect(is_tensor(got) and close(got, want.grad), f"the gradient with respect to {name} differs from the recurrence's")

    with g.check("linear in T: 200,000 tokens without a (T, T) matrix"):
        T = 200_000
        q, k, v = rand("lin.long.q", T, 2), rand("lin.long.k", T, 2), rand("lin.long.v", T, 2)
        try:
            out = causal_linear_attention(q, k, v)
        except Exception as e:
            raise_unless_student_error(e)
            g.fail(f"with T = {T:,} your code raised {type(e).__name__.removeprefix('Student')} ({str(e)[:120]}): a (T, T) matrix "
                   f"of float64 needs {T * T * 8 / 2**30:,.0f} GiB. Use running sums (cumsum), whose memory grows like T D Dv")
        g.expect(is_tensor(out) and out.shape == (T, 2) and bool(out.isfinite().all()),
                 f"with T = {T:,} expected a finite ({T}, 2) tensor, got {describe(out)}")
        g.expect(close(out, ref.causal_linear_attention(q, k, v)), f"with T = {T:,} the result differs from the reference")

    with g.check("keys and queries of different lengths raise ValueError"):
        q = rand("lin.bad", 1, 5, 2)
        expect_value_error(g, lambda: causal_linear_attention(q, q[:, :3], q[:, :3]), "q with 5 positions and k, v with 3")

    g.finish()


def check_causal_linear_attention(causal_linear_attention) -> None:
    """Public checks of ``causal_linear_attention`` on a small example."""
    g = Grader("causal_linear_attention (public)")
    with g.check("5 tokens: equals the causal weights phi(q_i) . phi(k_j), j <= i, normalised"):
        q, k, v = rand("public.lin.q", 1, 5, 3), rand("public.lin.k", 1, 5, 3), rand("public.lin.v", 1, 5, 2)
        _linear_matches(g, causal_linear_attention, q, k, v, "for 5 tokens")
    g.finish()


# =========================================================================== part 4: KV-cache size


def _kv(L, H_kv, D, T, B=1, nbytes=2) -> int:
    return 2 * L * H_kv * D * T * B * nbytes


_NO_TWO = "the factor 2 is missing: the cache holds a key AND a value for every layer, token and key/value head"
_QUERY_HEADS = ("the size counts the query heads: only the n_kv_heads key/value heads are cached (GQA and MQA share "
                "them among the query heads); n_kv_heads=None means n_heads")
_DTYPE = ("the size does not follow dtype: a value takes torch.empty((), dtype=dtype).element_size() bytes "
          "(2 for float16 and bfloat16, 4 for float32)")
_BITS = "the size is in bits: count bytes (element_size(), not the number of bits)"
_WINDOW = "the window is ignored: a sliding window of W keys caches only the last min(seq_len, W) tokens"
_WINDOW_MIN = "with a window the cache holds min(seq_len, window) tokens: fewer when the sequence is shorter than the window"
_BATCH = "the batch is ignored: every sequence of the batch has its own cache"


def _kv_cases():
    """(kwargs, expected bytes, [(wrong bytes, hint), ...])."""
    cases = []
    for L, H, H_kv, D, T, B, dtype, nbytes, W in (
        (32, 32, None, 128, 4096, 1, torch.float16, 2, None),
        (80, 64, 8, 128, 1000, 3, torch.bfloat16, 2, None),
        (4, 8, 1, 16, 50, 2, torch.float32, 4, None),
        (32, 32, 8, 128, 131072, 1, torch.float16, 2, 4096),
        (6, 12, 4, 64, 300, 2, torch.float32, 4, 1024),
        (2, 4, 2, 8, 9, 5, torch.float64, 8, 4),
    ):
        h_kv = H if H_kv is None else H_kv
        tokens = T if W is None else min(T, W)
        kwargs = dict(n_layers=L, n_heads=H, d_head=D, seq_len=T, n_kv_heads=H_kv, batch=B, dtype=dtype, window=W)
        expected = _kv(L, h_kv, D, tokens, B, nbytes)
        wrong = [(expected // 2, _NO_TWO), (_kv(L, H, D, tokens, B, nbytes), _QUERY_HEADS),
                 (_kv(L, h_kv, D, tokens, B, 2), _DTYPE), (expected * 8, _BITS), (_kv(L, h_kv, D, T, B, nbytes), _WINDOW),
                 (_kv(L, h_kv, D, W or T, B, nbytes), _WINDOW_MIN), (_kv(L, h_kv, D, tokens, 1, nbytes), _BATCH)]
        cases.append((kwargs, expected, wrong))
    return cases


def _kv_matches(g: Grader, kv_cache_size, kwargs: dict, expected: int, wrong) -> None:
    call = ", ".join(f"{k}={str(v).removeprefix('torch.')}" for k, v in kwargs.items())
    out = kv_cache_size(**kwargs)
    g.expect(type(out) is int, f"kv_cache_size({call}) should return an int (a number of bytes), got {describe(out)}")
    hints = list(dict.fromkeys(hint for value, hint in wrong if value != expected and out == value))
    if hints:  # a value can fit two mistakes (float32 without the factor 2 = float32 counted as 2 bytes)
        said = hints[0] if len(hints) == 1 else "this value fits more than one mistake: " + "; OR ".join(hints)
        g.fail(f"{said} (kv_cache_size({call}) returned {out:,}, expected {expected:,})")
    g.expect(out == expected, f"kv_cache_size({call}) returned {out:,}, expected 2 * L * B * tokens * H_kv * D * bytes = {expected:,}")


def grade_kv_cache_size(kv_cache_size) -> None:
    """Grade a student's ``kv_cache_size(n_layers, n_heads, d_head, seq_len, n_kv_heads=None, batch=1,
    dtype=torch.float16, window=None)``."""
    g = Grader("kv_cache_size")
    cases = _kv_cases()

    with g.check("a 7B model (32 layers, 32 heads of 128) in float16: 0.5 MiB per token, 64 GiB at 128k tokens"):
        _kv_matches(g, kv_cache_size, dict(n_layers=32, n_heads=32, d_head=128, seq_len=1), 512 * 1024,
                    [(256 * 1024, _NO_TWO), (1024 * 1024, _DTYPE), (4 * 1024 * 1024, _BITS)])
        _kv_matches(g, kv_cache_size, dict(n_layers=32, n_heads=32, d_head=128, seq_len=128 * 1024), 64 * 2**30,
                    [(32 * 2**30, _NO_TWO)])

    with g.check("MHA, GQA and MQA: only the key/value heads are cached"):
        for kwargs, expected, wrong in cases[:3]:
            _kv_matches(g, kv_cache_size, kwargs, expected, wrong)

    with g.check("the dtype sets the bytes per value"):
        for dtype, nbytes in ((torch.float32, 4), (torch.bfloat16, 2), (torch.float64, 8)):
            kwargs = dict(n_layers=3, n_heads=4, d_head=16, seq_len=10, dtype=dtype)
            expected = _kv(3, 4, 16, 10, 1, nbytes)
            _kv_matches(g, kv_cache_size, kwargs, expected, [(_kv(3, 4, 16, 10, 1, 2), _DTYPE), (expected * 8, _BITS),
                                                             (expected // 2, _NO_TWO)])

    with g.check("a sliding window caps the cached tokens at min(seq_len, window)"):
        for kwargs, expected, wrong in cases[3:]:
            _kv_matches(g, kv_cache_size, kwargs, expected, wrong)

    with g.check("the batch multiplies the size"):
        kwargs, expected, wrong = cases[1]
        _kv_matches(g, kv_cache_size, kwargs, expected, wrong)

    with g.check("bad shapes raise ValueError"):
        expect_value_error(g, lambda: kv_cache_size(2, 8, 16, 10, n_kv_heads=3), "n_kv_heads=3 with n_heads=8 (3 does not divide 8)")
        expect_value_error(g, lambda: kv_cache_size(0, 8, 16, 10), "n_layers=0")
        expect_value_error(g, lambda: kv_cache_size(2, 8, 16, -1), "seq_len=-1")

    g.finish()


def check_kv_cache_size(kv_cache_size) -> None:
    """Public checks of ``kv_cache_size`` on the chapter's examples."""
    g = Grader("kv_cache_size (public)")
    with g.check("32 layers, 32 heads of 128, float16: 524,288 bytes (0.5 MiB) per token"):
        _kv_matches(g, kv_cache_size, dict(n_layers=32, n_heads=32, d_head=128, seq_len=1), 512 * 1024,
                    [(256 * 1024, _NO_TWO), (1024 * 1024, _DTYPE), (4 * 1024 * 1024, _BITS)])
    with g.check("the same with 8 key/value heads (GQA) caches 4 times less"):
        _kv_matches(g, kv_cache_size, dict(n_layers=32, n_heads=32, d_head=128, seq_len=1, n_kv_heads=8), 128 * 1024,
                    [(512 * 1024, _QUERY_HEADS), (64 * 1024, _NO_TWO)])
    with g.check("in float32 a value takes 4 bytes: 1 MiB per token"):
        _kv_matches(g, kv_cache_size, dict(n_layers=32, n_heads=32, d_head=128, seq_len=1, dtype=torch.float32), 1024 * 1024,
                    [(512 * 1024, _DTYPE), (8 * 1024 * 1024, _BITS), (512 * 1024, _NO_TWO)])
    g.finish()


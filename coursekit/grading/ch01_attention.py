"""Checks for Exercise 1 (attention).

Each part has two entry points, both called from the notebook with the student's
object. ``check_*`` holds the *public* checks: small, fixed examples that a
student runs while working (and ``coursekit check`` runs). ``grade_*`` holds the
*hidden* checks: it compares the object with :mod:`coursekit.attention` on fresh
seeded inputs and tests properties. Both raise
:class:`~coursekit.grading.core.GradingFailure` with a hint per failed check.
"""

from __future__ import annotations

import math

import torch

from coursekit import attention as ref
from coursekit.grading.core import (
    Grader, close, describe, generator, is_a, is_tensor, load_weights, probe, rand, random_weights,
)

__all__ = [
    "check_softmax", "check_causal_mask", "check_attention", "check_self_attention",
    "grade_softmax", "grade_causal_mask", "grade_attention", "grade_self_attention",
]


# --------------------------------------------------------------------------- softmax


def grade_softmax(softmax) -> None:
    """Grade a student's ``softmax(x, dim=-1)``."""
    g = Grader("softmax")

    with g.check("returns a tensor of the input's shape and dtype"):
        for dtype in (torch.float32, torch.float64):
            x = rand("softmax.shape", 3, 4, 5, dtype=dtype)
            p = softmax(x)
            g.expect(
                is_tensor(p) and p.shape == x.shape and p.dtype == x.dtype,
                f"for input {describe(x)} expected the same shape and dtype, got {describe(p)}",
            )

    with g.check("matches torch.softmax on random inputs"):
        x = rand("softmax.values", 4, 7, scale=3.0)
        p = softmax(x)
        expected = torch.softmax(x, dim=-1)
        if is_tensor(p) and p.shape == x.shape and not close(p.sum(-1), torch.ones(4, dtype=x.dtype)):
            g.fail("your rows do not sum to 1: normalise by the sum over the last axis (keepdim=True)")
        g.expect(close(p, expected), "values differ from torch.softmax(x, dim=-1)")

    with g.check("normalises along the `dim` argument"):
        x = rand("softmax.dim", 3, 4, 5)
        for dim in (0, 1, -1):
            p = softmax(x, dim=dim)
            g.expect(
                close(p, torch.softmax(x, dim=dim)),
                f"softmax(x, dim={dim}) does not sum to 1 along dim {dim}: "
                "softmax over the wrong axis? Use `dim` in both the max and the sum",
            )

    with g.check("stable for large and very negative inputs"):
        x = rand("softmax.large", 3, 6, dtype=torch.float32, scale=50.0) + 1000.0
        p = softmax(x)
        g.expect(
            is_tensor(p) and bool(torch.isfinite(p).all()),
            "got inf or NaN for inputs around 1000: exp(1000) overflows; "
            "subtract the maximum of each slice before exponentiating",
        )
        g.expect(close(p, torch.softmax(x, dim=-1)), "values differ from torch.softmax for inputs around 1000")
        y = torch.full((2, 3), -1000.0)
        g.expect(
            close(softmax(y), torch.full((2, 3), 1 / 3)),
            "inputs of all -1000 should give a uniform distribution: exp(-1000) underflows to 0, "
            "so subtract the maximum first",
        )

    with g.check("a slice of all -inf gives zeros, not NaN"):
        x = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, -math.inf]], dtype=torch.float64)
        p = softmax(x)
        expected = torch.tensor([[1 / (1 + math.e), 0.0, math.e / (1 + math.e)], [0.0, 0.0, 0.0]], dtype=torch.float64)
        g.expect(
            is_tensor(p) and not bool(torch.isnan(p).any()),
            "a fully masked row (all -inf) gave NaN: replace an infinite maximum by 0 before subtracting, "
            "and divide by 1 where the sum is 0",
        )
        g.expect(close(p, expected), "softmax([[0, -inf, 1], [-inf, -inf, -inf]]) should be [[0.269, 0, 0.731], [0, 0, 0]]")

    with g.check("leaves its input unchanged"):
        x = rand("softmax.inplace", 3, 5)
        after = probe(softmax, x.clone()).args[0]
        g.expect(is_tensor(after) and torch.equal(after, x), "softmax modified its input in place (x -= ... or x.exp_()): compute a new tensor")

    g.finish()


# --------------------------------------------------------------------------- causal mask


def grade_causal_mask(causal_mask) -> None:
    """Grade a student's ``causal_mask(T, S=None)``."""
    g = Grader("causal_mask")
    # sizes drawn from the check's generator as well as the edge cases, so no table of sizes passes
    drawn = torch.randint(3, 40, (3,), generator=generator("causal.sizes")).tolist()
    offsets = torch.randint(1, 12, (3,), generator=generator("causal.offsets")).tolist()

    with g.check("returns a boolean (T, S) tensor"):
        m = causal_mask(4)
        g.expect(
            is_tensor(m) and m.dtype == torch.bool and m.shape == (4, 4),
            f"causal_mask(4) should be a bool tensor of shape (4, 4), got {describe(m)}",
        )

    with g.check("square masks (S = T) allow exactly the past and the present"):
        for T in (5, 1, 2, *drawn):
            m = causal_mask(T)
            expected = ref.causal_mask(T)
            if is_tensor(m) and m.shape == expected.shape and m.dtype == torch.bool and T > 1:
                if torch.equal(m, expected.T):
                    g.fail("the mask is transposed: query i (row) may attend to keys j <= i (columns)")
                if torch.equal(m, ~expected):
                    g.fail("the mask is inverted: True means *may attend*")
            if is_tensor(m) and m.shape == expected.shape and m.dtype == torch.bool:
                if not bool(m.diagonal().all()):
                    g.fail("a position may not attend to itself: the diagonal must be True (off by one?)")
                if bool((m & ~expected).any()):
                    g.fail("a query can see a future key: entries above the diagonal must be False")
            g.expect(
                is_tensor(m) and torch.equal(m, expected),
                f"causal_mask({T}) differs from the lower-triangular mask",
            )

    with g.check("with S > T keys, the last query sees every key (bottom-right alignment)"):
        for T, S in ((1, 4), (3, 5), *((t, t + d) for t, d in zip(drawn, offsets))):
            m = causal_mask(T, S)
            g.expect(
                is_tensor(m) and m.shape == (T, S),
                f"causal_mask({T}, {S}) should have shape ({T}, {S}), got {describe(m)}",
            )
            g.expect(
                torch.equal(m, ref.causal_mask(T, S)),
                f"causal_mask({T}, {S}) is misaligned: the queries are the last {T} of {S} positions, "
                f"so query i may attend to keys j <= i + (S - T)",
            )

    g.finish()


# --------------------------------------------------------------------------- attention


def _unpack(result, name: str, g: Grader):
    g.expect(
        isinstance(result, tuple) and len(result) == 2,
        f"{name} must return a tuple (out, weights), got {describe(result)}",
    )
    return result


def grade_attention(attention) -> None:
    """Grade a student's ``scaled_dot_product_attention(q, k, v, mask=None, scale=None)``."""
    g = Grader("scaled_dot_product_attention")
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def inputs(name, *batch, T=5, S=6, D=4, Dv=3, dtype=torch.float64):
        return (
            rand(name + ".q", *batch, T, D, dtype=dtype),
            rand(name + ".k", *batch, S, D, dtype=dtype),
            rand(name + ".v", *batch, S, Dv, dtype=dtype),
        )

    with g.check("returns (out, weights) with shapes (..., T, Dv) and (..., T, S)"):
        q, k, v = inputs("att.shape", 2, T=5, S=6, D=4, Dv=3)
        out, w = _unpack(attention(q, k, v), "attention", g)
        g.expect(
            is_tensor(out) and out.shape == (2, 5, 3),
            f"out should be (2, 5, 3) for q (2, 5, 4), k (2, 6, 4), v (2, 6, 3); got {describe(out)}",
        )
        g.expect(
            is_tensor(w) and w.shape == (2, 5, 6),
            f"weights should be (2, 5, 6) = (B, T, S); got {describe(w)}",
        )

    with g.check("matches torch's scaled_dot_product_attention without a mask"):
        for batch in ((), (3,), (2, 3)):
            q, k, v = inputs(f"att.nomask{batch}", *batch, T=5, S=7, D=8, Dv=3)
            out, w = _unpack(attention(q, k, v), "attention", g)
            if is_tensor(w) and w.shape[-2:] == (5, 7):
                sums = w.sum(-1)
                if not close(sums, torch.ones_like(sums)):
                    g.fail("rows of the weights do not sum to 1: take the softmax over the keys (last axis)")
            if close(out, sdpa(q, k, v, scale=1.0)):
                g.fail("the scores are not scaled: divide q k^T by sqrt(D)")
            if close(out, sdpa(q, k, v, scale=1.0 / q.shape[-1])):
                g.fail("the scores are divided by D: divide by sqrt(D) instead")
            g.expect(close(out, sdpa(q, k, v)), f"out differs from the reference for batch shape {batch}")
            g.expect(close(w, ref.scaled_dot_product_attention(q, k, v)[1]), "weights differ from the reference")

    with g.check("uses the `scale` argument when given"):
        q, k, v = inputs("att.scale", 2)
        out, _ = _unpack(attention(q, k, v, scale=0.3), "attention", g)
        g.expect(close(out, sdpa(q, k, v, scale=0.3)), "scale=0.3 was not used: multiply the scores by `scale` when it is given")

    with g.check("a boolean mask: True means may attend"):
        q, k, v = inputs("att.bool", 2, T=4, S=5)
        mask = torch.rand(2, 4, 5, generator=generator("att.bool.mask")) < 0.6
        mask[..., 0] = True  # every query sees at least one key
        out, w = _unpack(attention(q, k, v, mask=mask), "attention", g)
        if close(out, sdpa(q, k, v, attn_mask=~mask)):
            g.fail("the mask is inverted: True means the query *may attend* to the key")
        if is_tensor(w) and w.shape == mask.shape:
            g.expect(
                bool((w[~mask] == 0).all()),
                "masked keys got non-zero weight: set their scores to -inf *before* the softmax",
            )
            sums = w.sum(-1)
            g.expect(
                close(sums, torch.ones_like(sums)),
                "with a mask the rows no longer sum to 1: mask the scores before the softmax, not the weights after it",
            )
        g.expect(close(out, sdpa(q, k, v, attn_mask=mask)), "out differs from the reference with a boolean mask")

    with g.check("a causal mask broadcast over the batch"):
        q, k, v = inputs("att.causal", 3, T=6, S=6)
        out, _ = _unpack(attention(q, k, v, mask=ref.causal_mask(6)), "attention", g)
        g.expect(close(out, sdpa(q, k, v, is_causal=True)), "out differs from the reference with a (T, S) causal mask")

    with g.check("a floating mask is added to the scores"):
        q, k, v = inputs("att.additive", 2, T=4, S=5)
        bias = rand("att.additive.bias", 4, 5)
        bias[1, 2] = -math.inf
        out, _ = _unpack(attention(q, k, v, mask=bias), "attention", g)
        g.expect(
            close(out, sdpa(q, k, v, attn_mask=bias)),
            "a floating (additive) mask must be added to the scaled scores; only boolean masks select keys",
        )

    with g.check("a query with no visible key gets zero weights and a zero output"):
        q, k, v = inputs("att.empty", 2, T=3, S=4)
        mask = torch.ones(3, 4, dtype=torch.bool)
        mask[1] = False
        out, w = _unpack(attention(q, k, v, mask=mask), "attention", g)
        g.expect(
            is_tensor(out) and not bool(torch.isnan(out).any()),
            "a fully masked row gave NaN: its weights must be all zero (see the softmax part)",
        )
        g.expect(close(out, sdpa(q, k, v, attn_mask=mask)), "the fully masked query's output should be zeros")

    with g.check("gradients match the reference"):
        q, k, v = inputs("att.grad", 2, T=3, S=4)
        upstream = rand("att.grad.up", *q.shape[:-1], v.shape[-1])  # (B, T, Dv)
        p = probe(attention, *(t.clone().requires_grad_() for t in (q, k, v)), backward=(0, upstream))
        out, _ = _unpack(p.result, "attention", g)
        g.expect(
            is_tensor(out) and out.requires_grad,
            "the output does not depend on q, k, v through autograd: avoid .detach(), .numpy() or .item()",
        )
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        (sdpa(qr, kr, vr) * upstream).sum().backward()
        for name, got, b in zip("qkv", p.grads, (qr, kr, vr)):
            g.expect(
                got is not None and close(got, b.grad),
                f"the gradient with respect to {name} differs from the reference",
            )

    with g.check("leaves q, k, v and the mask unchanged"):
        q, k, v = inputs("att.inplace", 2)
        mask = torch.rand(5, 6, generator=generator("att.inplace.mask")) < 0.7
        mask[:, 0] = True
        p = probe(attention, q.clone(), k.clone(), v.clone(), mask=mask.clone())
        for name, a, b in zip("qkvm", (*p.args, p.kwargs.get("mask")), (q, k, v, mask)):
            g.expect(is_tensor(a) and torch.equal(a, b), f"{'mask' if name == 'm' else name} was modified in place: compute new tensors")

    g.finish()


# --------------------------------------------------------------------------- self-attention module


def grade_self_attention(SelfAttention) -> None:
    """Grade a student's ``SelfAttention(d_model, d_head=None, bias=True)`` module class."""
    g = Grader("SelfAttention")
    C, D = 8, 4

    def build(**kwargs):
        torch.manual_seed(0)
        return SelfAttention(C, D, **kwargs).double()

    def twin(name: str):
        """The student's module and coursekit's, holding the same random weights of ours (a module
        that only works with its own initial weights, say zeros, must not pass)."""
        m, r = build(), ref.SelfAttention(C, D).double()
        weights = random_weights(r, name)
        load_weights(g, m, weights, "SelfAttention")
        r.load_state_dict(weights)
        return m, r

    with g.check("has q_proj, k_proj and v_proj of shape C -> D"):
        m = build()
        for name in ("q_proj", "k_proj", "v_proj"):
            layer = getattr(m, name, None)
            g.expect(is_a(layer, "torch.nn.modules.linear.Linear"), f"SelfAttention needs an nn.Linear called {name}")
            g.expect(
                (layer.in_features, layer.out_features) == (C, D),
                f"{name} should map C={C} to D={D} features, got {layer.in_features} -> {layer.out_features}",
            )

    with g.check("parameter count: 3 (C D + D) with bias, 3 C D without"):
        for bias, expected in ((True, 3 * (C * D + D)), (False, 3 * C * D)):
            n = sum(p.numel() for p in build(bias=bias).parameters())
            g.expect(n == expected, f"with bias={bias} expected {expected} parameters, got {n}")

    with g.check("d_head defaults to d_model"):
        torch.manual_seed(0)
        m = SelfAttention(C)
        g.expect(m.q_proj.out_features == C, "SelfAttention(C) should use D = C when d_head is not given")

    with g.check("matches the reference with the same weights"):
        m, r = twin("sa.weights")
        x = rand("sa.x", 2, 5, C)
        out, w = _unpack(m(x), "SelfAttention.forward", g)
        out_r, w_r = r(x)
        if close(w, w_r) and not close(out, out_r):
            g.fail("the weights match but the output does not: the values must be v_proj(x)")
        g.expect(close(w, w_r), "the attention weights differ: queries come from q_proj(x) and keys from k_proj(x)")
        g.expect(close(out, out_r), "the output differs from the reference with the same weights")

    with g.check("passes the mask to attention"):
        m, r = twin("sa.mask.weights")
        x = rand("sa.mask.x", 2, 5, C)
        mask = ref.causal_mask(5)
        out, _ = _unpack(m(x, mask=mask), "SelfAttention.forward", g)
        g.expect(close(out, r(x, mask=mask)[0]), "with mask=causal_mask(T) the output differs: is the mask passed on?")

    with g.check("changing a future token does not change earlier outputs under a causal mask"):
        m, _ = twin("sa.causal.weights")
        x = rand("sa.causal.x", 1, 6, C)
        y = x.clone()
        y[:, 4:] += 1.0
        a, _ = _unpack(m(x, mask=ref.causal_mask(6)), "SelfAttention.forward", g)
        b, _ = _unpack(m(y, mask=ref.causal_mask(6)), "SelfAttention.forward", g)
        g.expect(
            is_tensor(a) and is_tensor(b) and close(a[:, :4], b[:, :4]),
            "outputs at positions 0-3 changed when only positions 4-5 changed: information leaks from the future",
        )

    g.finish()


# --------------------------------------------------------------------------- public checks


def check_softmax(softmax) -> None:
    """Public checks of ``softmax`` on one small example."""
    g = Grader("softmax (public)")
    x = torch.tensor([[0.0, math.log(3.0)], [1000.0, 1000.0], [-math.inf, 0.0]])
    expected = torch.tensor([[0.25, 0.75], [0.5, 0.5], [0.0, 1.0]])
    with g.check("softmax([[0, log 3], [1000, 1000], [-inf, 0]]) is [[0.25, 0.75], [0.5, 0.5], [0, 1]]"):
        p = softmax(x)
        g.expect(is_tensor(p) and p.shape == x.shape, f"softmax must return a tensor of shape {tuple(x.shape)}, got {describe(p)}")
        g.expect(
            bool(torch.isfinite(p).all()),
            "softmax gave inf or NaN for [1000, 1000]: subtract the maximum of each slice before exponentiating",
        )
        g.expect(torch.allclose(p.sum(-1), torch.ones(3)), "your rows do not sum to 1: normalise by the sum over `dim`")
        g.expect(torch.allclose(p, expected), f"expected\n{expected}\ngot\n{p}")
    g.finish()


def check_causal_mask(causal_mask) -> None:
    """Public checks of ``causal_mask`` for T = S = 3 and for T = 2, S = 4."""
    g = Grader("causal_mask (public)")
    with g.check("causal_mask(3) is the lower-triangular (3, 3) boolean mask"):
        m = causal_mask(3)
        g.expect(is_tensor(m) and m.dtype == torch.bool and m.shape == (3, 3), f"causal_mask(3) must be a (3, 3) boolean tensor, got {describe(m)}")
        g.expect(bool(m.diagonal().all()), "a position may not attend to itself: the diagonal must be True (off by one?)")
        g.expect(
            not bool(m[0, 1]),
            "query 0 can see key 1, a future key: entries above the diagonal must be False (is the mask transposed?)",
        )
        g.expect(torch.equal(m, torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)), f"causal_mask(3) is\n{m}")
    with g.check("with S > T keys, the last query sees every key"):
        m = causal_mask(2, 4)
        g.expect(is_tensor(m) and m.shape == (2, 4), f"causal_mask(2, 4) must have shape (2, 4), got {describe(m)}")
        g.expect(bool(m[-1].all()), "with S > T keys, the last query sees every key: causal_mask(2, 4) is misaligned")
    g.finish()


def check_attention(attention) -> None:
    """Public checks of ``scaled_dot_product_attention`` against torch's, with and without a mask."""
    g = Grader("scaled_dot_product_attention (public)")
    q, k, v = rand("public.q", 2, 3, 4, dtype=torch.float32), rand("public.k", 2, 5, 4, dtype=torch.float32), rand("public.v", 2, 5, 6, dtype=torch.float32)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with g.check("q (2, 3, 4), k (2, 5, 4), v (2, 5, 6) give out (2, 3, 6) equal to torch's"):
        out, weights = _unpack(attention(q, k, v), "attention", g)
        g.expect(
            is_tensor(out) and is_tensor(weights) and out.shape == (2, 3, 6) and weights.shape == (2, 3, 5),
            f"expected out (2, 3, 6) and weights (2, 3, 5), got {describe(out)} and {describe(weights)}",
        )
        g.expect(
            torch.allclose(weights.sum(-1), torch.ones(2, 3)),
            "rows of the weights do not sum to 1: take the softmax over the keys (last axis)",
        )
        g.expect(
            torch.allclose(out, sdpa(q, k, v), atol=1e-6),
            "out differs from torch's scaled_dot_product_attention (is q k^T divided by sqrt(D)?)",
        )
    with g.check("a boolean causal mask (3, 5): masked keys get zero weight"):
        mask = ref.causal_mask(3, 5)
        out, weights = _unpack(attention(q, k, v, mask=mask), "attention", g)
        g.expect(is_tensor(weights) and weights.shape == (2, 3, 5), f"weights should be (2, 3, 5), got {describe(weights)}")
        g.expect(
            bool((weights[:, ~mask] == 0).all()),
            "masked keys got non-zero weight: set their scores to -inf before the softmax",
        )
        g.expect(
            is_tensor(out) and torch.allclose(out, sdpa(q, k, v, attn_mask=mask), atol=1e-6),
            "with a boolean mask, out differs from torch's",
        )
    g.finish()


def check_self_attention(SelfAttention) -> None:
    """Public checks of ``SelfAttention(8, 4)``: shapes, parameter count, and the computation."""
    g = Grader("SelfAttention (public)")
    x = rand("public.x", 2, 5, 8, dtype=torch.float32)
    with g.check("SelfAttention(8, 4) maps (2, 5, 8) to out (2, 5, 4) and weights (2, 5, 5)"):
        out, weights = _unpack(SelfAttention(8, 4)(x), "SelfAttention.forward", g)
        g.expect(
            is_tensor(out) and is_tensor(weights) and out.shape == (2, 5, 4) and weights.shape == (2, 5, 5),
            f"expected out (2, 5, 4) and weights (2, 5, 5), got {describe(out)} and {describe(weights)}",
        )
    with g.check("SelfAttention(8, 4) has 3 * (8*4 + 4) = 108 parameters"):
        n = sum(p.numel() for p in SelfAttention(8, 4).parameters())
        g.expect(n == 3 * (8 * 4 + 4), f"SelfAttention(8, 4) should have 3 * (8*4 + 4) = 108 parameters, got {n}")
    with g.check("out is attention over q_proj(x), k_proj(x), v_proj(x)"):
        layer = SelfAttention(8, 4)
        names = ("q_proj", "k_proj", "v_proj")
        sd = layer.state_dict()
        g.expect(
            isinstance(sd, dict) and all(f"{n}.weight" in sd for n in names),
            "SelfAttention needs three nn.Linear layers called q_proj, k_proj and v_proj",
        )
        reference = ref.SelfAttention(8, 4)
        weights = {k: v.float() for k, v in random_weights(reference, "public.weights").items()}
        load_weights(g, layer, weights, "SelfAttention")  # our weights, not only the module's own initial ones
        reference.load_state_dict(weights)
        out, _ = _unpack(layer(x), "SelfAttention.forward", g)
        g.expect(
            is_tensor(out) and torch.allclose(out, reference(x)[0], atol=1e-6),
            "out differs from attention over q_proj(x), k_proj(x), v_proj(x)",
        )
    g.finish()

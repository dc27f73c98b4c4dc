"""Checks for Exercise 2 (multi-head attention).

Each part has two entry points, both called from the notebook with the student's
object. ``check_*`` holds the *public* checks: small, fixed examples that a
student runs while working (and ``coursekit check`` runs). ``grade_*`` holds the
*hidden* checks: it compares the object with :mod:`coursekit.multihead` on fresh
seeded inputs and tests properties. Both raise
:class:`~coursekit.grading.core.GradingFailure` with a hint per failed check.

The module part checks the names and shapes of the student's ``state_dict()`` (keys
``qkv_proj.weight``, ``qkv_proj.bias``, ``out_proj.weight``, ``out_proj.bias``), then loads
the same random weights of its own into the student's module and into
:class:`coursekit.multihead.MultiHeadAttention`: a module that only works with its own initial
weights (zeros, say) does not pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from coursekit import attention as att
from coursekit import multihead as ref
from coursekit.grading.core import Grader, close, describe, generator, is_a, is_tensor, probe, rand, random_weights

__all__ = [
    "check_split_heads", "check_merge_heads", "check_repeat_kv", "check_multihead_attention",
    "grade_split_heads", "grade_merge_heads", "grade_repeat_kv", "grade_multihead_attention",
]

LINEAR = "torch.nn.modules.linear.Linear"

_VIEW_HINT = (
    "view() failed because its input is not contiguous (the result of a transpose): "
    "use .reshape(...) or .contiguous().view(...) after transposing"
)


def _call(g: Grader, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, turning the classic view-after-transpose error into its hint."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        if "view size is not compatible" in str(e):
            g.fail(_VIEW_HINT)
        raise


def _unpack(result, name: str, g: Grader):
    g.expect(
        isinstance(result, tuple) and len(result) == 2,
        f"{name} must return a tuple (out, weights), got {describe(result)}",
    )
    return result


# --------------------------------------------------------------------------- split_heads


def grade_split_heads(split_heads) -> None:
    """Grade a student's ``split_heads(x, n_heads)``."""
    g = Grader("split_heads")

    with g.check("returns (B, H, T, D) with the input's dtype"):
        for B, T, H, D, dtype in ((2, 5, 3, 4, torch.float64), (1, 3, 4, 2, torch.float32)):
            x = rand("split.shape", B, T, H * D, dtype=dtype)
            out = _call(g, split_heads, x, H)
            g.expect(
                is_tensor(out) and out.shape == (B, H, T, D) and out.dtype == dtype,
                f"split_heads(x of shape {(B, T, H * D)}, {H}) should be ({B}, {H}, {T}, {D}) = (B, H, T, D) "
                f"with x's dtype, got {describe(out)}",
            )

    with g.check("head h holds features h*D .. (h+1)*D - 1 of every token"):
        B, T, C = 2, 5, 12
        x = rand("split.values", B, T, C)
        for H in (3, 4, 2, 1, 12):
            D = C // H
            out = _call(g, split_heads, x, H)
            expected = ref.split_heads(x, H)
            if is_tensor(out) and out.shape == expected.shape and H > 1 and D > 1:
                if torch.equal(out, x.view(B, T, D, H).permute(0, 3, 1, 2)):
                    g.fail(
                        "head h got every H-th feature instead of a block of D neighbours: "
                        "view the width as (H, D), x.view(B, T, H, D), not (D, H)"
                    )
                if torch.equal(out, x.reshape(B, H, T, D)):
                    g.fail(
                        "reshaping (B, T, C) straight to (B, H, T, D) mixes features of different tokens: "
                        "view as (B, T, H, D) first, then transpose(1, 2)"
                    )
            g.expect(
                is_tensor(out) and out.shape == expected.shape and torch.equal(out, expected),
                f"split_heads(x, {H}) differs from the reference: head h must be x[..., h*D:(h+1)*D] with D = C / H",
            )

    with g.check("merge_heads (the reference) undoes it"):
        x = rand("split.roundtrip", 3, 4, 8)
        out = _call(g, split_heads, x, 2)
        g.expect(
            is_tensor(out) and out.shape == (3, 2, 4, 4) and torch.equal(ref.merge_heads(out), x),
            "concatenating your heads back does not give x: no values may be lost, duplicated or reordered",
        )

    with g.check("a width that n_heads does not divide raises ValueError"):
        x = rand("split.error", 2, 3, 12)
        try:
            out = split_heads(x, 5)
        except ValueError:
            pass
        except Exception as e:
            g.fail(f"split_heads(x of width 12, 5) raised {type(e).__name__}; raise a ValueError that names n_heads and the width")
        else:
            g.fail(f"split_heads(x of width 12, 5) returned {describe(out)}: 5 heads cannot share 12 features, raise a ValueError")

    g.finish()


# --------------------------------------------------------------------------- merge_heads


def grade_merge_heads(merge_heads) -> None:
    """Grade a student's ``merge_heads(x)``."""
    g = Grader("merge_heads")

    with g.check("returns (B, T, H * D) with the input's dtype"):
        for B, H, T, D, dtype in ((2, 3, 5, 4, torch.float64), (1, 4, 3, 2, torch.float32)):
            x = rand("merge.shape", B, H, T, D, dtype=dtype)
            out = _call(g, merge_heads, x)
            g.expect(
                is_tensor(out) and out.shape == (B, T, H * D) and out.dtype == dtype,
                f"merge_heads(x of shape {(B, H, T, D)}) should be ({B}, {T}, {H * D}) = (B, T, H*D) "
                f"with x's dtype, got {describe(out)}",
            )

    with g.check("token t holds the features of head 0, then head 1, ..."):
        B, H, T, D = 2, 3, 5, 4
        x = rand("merge.values", B, H, T, D)
        out = _call(g, merge_heads, x)
        expected = ref.merge_heads(x)
        if is_tensor(out) and out.shape == expected.shape and torch.equal(out, x.reshape(B, T, H * D)):
            g.fail(
                "without a transpose the reshape mixes tokens: each token's heads must sit side by side, "
                "so transpose(1, 2) to (B, T, H, D) before reshaping to (B, T, H*D)"
            )
        g.expect(
            is_tensor(out) and out.shape == expected.shape and torch.equal(out, expected),
            "merge_heads(x)[b, t] must be the concatenation x[b, 0, t], x[b, 1, t], ..., x[b, H-1, t]",
        )

    with g.check("undoes split_heads (the reference) for any number of heads"):
        y = rand("merge.roundtrip", 2, 4, 12)
        for H in (1, 3, 4, 12):
            out = _call(g, merge_heads, ref.split_heads(y, H))
            g.expect(
                is_tensor(out) and out.shape == y.shape and torch.equal(out, y),
                f"merge_heads(split_heads(y, {H})) should give y back",
            )

    with g.check("a tensor that is not (B, H, T, D) raises ValueError"):
        x = rand("merge.error", 2, 3, 12)
        try:
            out = merge_heads(x)
        except ValueError:
            pass
        except Exception as e:
            g.fail(f"merge_heads(x of shape (2, 3, 12)) raised {type(e).__name__}; raise a ValueError naming the shape")
        else:
            g.fail(f"merge_heads(x of shape (2, 3, 12)) returned {describe(out)}: a 3-D input has no head axis, raise a ValueError")

    g.finish()


# --------------------------------------------------------------------------- repeat_kv


def grade_repeat_kv(repeat_kv) -> None:
    """Grade a student's ``repeat_kv(x, n_rep)``."""
    g = Grader("repeat_kv")

    with g.check("returns (B, H_kv * n_rep, S, D)"):
        for n_rep in (1, 2, 3):
            x = rand("repeat.shape", 2, 2, 5, 3)
            out = repeat_kv(x, n_rep)
            g.expect(
                is_tensor(out) and out.shape == (2, 2 * n_rep, 5, 3) and out.dtype == x.dtype,
                f"repeat_kv(x of shape (2, 2, 5, 3), {n_rep}) should be (2, {2 * n_rep}, 5, 3), got {describe(out)}",
            )

    with g.check("n_rep = 1 returns the heads unchanged"):
        x = rand("repeat.one", 2, 3, 4, 2)
        out = repeat_kv(x, 1)
        g.expect(is_tensor(out) and torch.equal(out, x), "repeat_kv(x, 1) must return x's values unchanged")

    with g.check("query head h gets key/value head h // n_rep"):
        for H_kv, n_rep in ((2, 3), (3, 2), (1, 4)):
            x = rand("repeat.groups", 2, H_kv, 5, 3)
            out = repeat_kv(x, n_rep)
            expected = ref.repeat_kv(x, n_rep)
            if is_tensor(out) and out.shape == expected.shape and H_kv > 1 and torch.equal(out, x.repeat(1, n_rep, 1, 1)):
                g.fail(
                    "the groups are wrong: heads [a, b] with n_rep=2 must become [a, a, b, b] (consecutive query "
                    "heads share a key/value head), not [a, b, a, b]; use repeat_interleave(n_rep, dim=1), not repeat"
                )
            g.expect(
                is_tensor(out) and out.shape == expected.shape and torch.equal(out, expected),
                f"repeat_kv(x, {n_rep}) with {H_kv} key/value heads differs from the reference: output head h is input head h // n_rep",
            )

    with g.check("attention over repeated heads equals torch's enable_gqa=True"):
        q = rand("repeat.sdpa.q", 2, 6, 4, 5)  # (B, H, T, D)
        k, v = rand("repeat.sdpa.k", 2, 2, 7, 5), rand("repeat.sdpa.v", 2, 2, 7, 5)  # (B, H_kv, S, D)
        rk, rv = repeat_kv(k, 3), repeat_kv(v, 3)
        g.expect(is_tensor(rk) and is_tensor(rv) and rk.shape == (2, 6, 7, 5), f"repeat_kv(k, 3) should be (2, 6, 7, 5), got {describe(rk)}")
        out, _ = att.scaled_dot_product_attention(q, rk, rv)
        g.expect(
            close(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
            "attention with your repeated keys/values differs from F.scaled_dot_product_attention(..., enable_gqa=True): "
            "query head h must read key/value head h // n_rep",
        )

    with g.check("gradients reach every key/value head"):
        x = rand("repeat.grad", 1, 2, 3, 4)
        upstream = rand("repeat.grad.up", 1, 6, 3, 4)
        p = probe(repeat_kv, x.clone().requires_grad_(), 3, backward=(None, upstream))
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            "the result does not depend on x through autograd: avoid .detach(), .numpy() or building a new tensor from values",
        )
        expected = upstream.view(1, 2, 3, 3, 4).sum(2)  # each kv head collects its group's gradients
        g.expect(
            p.grads is not None and p.grads[0] is not None and close(p.grads[0], expected),
            "the gradient of x should be the sum of the upstream gradients over each group of n_rep query heads",
        )

    g.finish()


# --------------------------------------------------------------------------- the module

C, H = 12, 4  # D = 3: scaling by sqrt(C) and by sqrt(D) differ


def _build(MultiHeadAttention, **kwargs):
    torch.manual_seed(0)
    return MultiHeadAttention(C, H, **kwargs).double()


def _twin(g: Grader, m, n_heads: int = H, n_kv_heads: int | None = None, bias: bool = True, dropout: float = 0.0):
    """The reference module; it and the student's ``m`` now hold the same random weights of ours."""
    r = ref.MultiHeadAttention(C, n_heads, n_kv_heads, bias=bias, dropout=dropout).double()
    expected = r.state_dict()
    sd = m.state_dict()
    g.expect(
        isinstance(sd, dict) and set(sd) == set(expected),
        f"state_dict() should hold exactly {sorted(expected)}, got "
        f"{sorted(map(str, sd)) if isinstance(sd, dict) else describe(sd)}: the module's only layers are the nn.Linear "
        "qkv_proj and out_proj",
    )
    for key, value in sd.items():
        g.expect(
            is_tensor(value) and value.shape == expected[key].shape,
            f"{key} should have shape {tuple(expected[key].shape)}, got {describe(value)}",
        )
    weights = random_weights(r, f"mha.weights.{n_heads}.{n_kv_heads}.{bias}")
    m.load_state_dict(weights)
    r.load_state_dict(weights)
    return r.eval()


def _heads(r, x, kv=None):
    """The reference's q and the repeated k, v: (B, H, T, D), (B, H, S, D), (B, H, S, D)."""
    q, k, v = r.project(x, kv)
    n_rep = r.n_heads // r.n_kv_heads
    return q, ref.repeat_kv(k, n_rep), ref.repeat_kv(v, n_rep)


def _expect_weights(g: Grader, w, w_r, what: str) -> None:
    B, Hr, T, S = w_r.shape
    if is_tensor(w) and w.shape == (B, T, S) and close(w, w_r.mean(1)):
        g.fail(
            "need_weights must return one (T, S) matrix per head, shape (B, H, T, S): "
            "do not average over the heads (that is torch's average_attn_weights=True)"
        )
    if is_tensor(w) and w.shape == (B, T, Hr, S) and close(w, w_r.transpose(1, 2)):
        g.fail(f"weights should be (B, H, T, S) = {(B, Hr, T, S)}, got (B, T, H, S) = {tuple(w.shape)}: do not transpose them")
    g.expect(is_tensor(w) and w.shape == w_r.shape, f"weights should be (B, H, T, S) = {tuple(w_r.shape)}{what}, got {describe(w)}")


def grade_multihead_attention(MultiHeadAttention) -> None:
    """Grade a student's ``MultiHeadAttention(d_model, n_heads, n_kv_heads=None, bias=True, dropout=0.0)``."""
    g = Grader("MultiHeadAttention")
    D = C // H

    with g.check("has nn.Linear layers qkv_proj (C -> C + 2 H_kv D) and out_proj (C -> C)"):
        for n_kv in (None, 2, 1):
            H_kv = H if n_kv is None else n_kv
            m = _build(MultiHeadAttention, n_kv_heads=n_kv)
            for name, out_features in (("qkv_proj", C + 2 * H_kv * D), ("out_proj", C)):
                layer = getattr(m, name, None)
                g.expect(is_a(layer, LINEAR), f"MultiHeadAttention needs an nn.Linear called {name}")
                g.expect(
                    (layer.in_features, layer.out_features) == (C, out_features),
                    f"with C={C}, H={H}, n_kv_heads={n_kv}: {name} should map {C} to {out_features} features"
                    f"{' (q, k and v packed: C + 2 H_kv D)' if name == 'qkv_proj' else ''}, "
                    f"got {layer.in_features} -> {layer.out_features}",
                )

    with g.check("4 C^2 + 4 C parameters whatever the number of heads (4 C^2 without bias)"):
        for n_heads in (1, 2, 3, 4, 6, 12):
            for bias, expected in ((True, 4 * C * C + 4 * C), (False, 4 * C * C)):
                torch.manual_seed(0)
                n = sum(p.numel() for p in MultiHeadAttention(C, n_heads, bias=bias).parameters())
                g.expect(
                    n == expected,
                    f"MultiHeadAttention({C}, {n_heads}, bias={bias}) has {n} parameters, expected {expected}"
                    + ("" if bias else ": pass bias=bias to both nn.Linear layers"),
                )

    with g.check("self-attention matches the reference with the same weights"):
        m = _build(MultiHeadAttention)
        r = _twin(g, m)
        x = rand("mha.self.x", 2, 5, C)
        out, w = _unpack(_call(g, m, x, need_weights=True), "forward", g)
        out_r, w_r = r(x, need_weights=True)
        q, k, v = _heads(r, x)
        _expect_weights(g, w, w_r, "")
        if close(w, att.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(C))[1]):
            g.fail(f"the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = C / H = {D}, not the model width")
        if close(w, att.scaled_dot_product_attention(k, q, v)[1]):
            g.fail("queries and keys are swapped: qkv_proj's output is [q (C) | k (H_kv D) | v (H_kv D)], split it in that order")
        g.expect(close(w, w_r), "the attention weights differ from the reference with the same weights")
        heads_out = att.scaled_dot_product_attention(q, k, v)[0]  # (B, H, T, D)
        if close(out, ref.merge_heads(heads_out)):
            g.fail("out is the merged heads without the output projection: apply out_proj after merge_heads")
        g.expect(close(out, out_r), "the weights match but out does not: out = out_proj(merge_heads(weights @ v))")

    with g.check("need_weights=False returns (out, None)"):
        m = _build(MultiHeadAttention)
        r = _twin(g, m)
        x = rand("mha.noweights.x", 2, 4, C)
        out, w = _unpack(_call(g, m, x), "forward", g)
        g.expect(w is None, f"without need_weights=True the second value should be None, got {describe(w)}")
        g.expect(close(out, r(x)[0]), "out differs from the reference when need_weights is False")

    with g.check("cross-attention: queries from x, keys and values from kv"):
        m = _build(MultiHeadAttention)
        r = _twin(g, m)
        x, kv = rand("mha.cross.x", 2, 4, C), rand("mha.cross.kv", 2, 6, C)
        out, w = _unpack(_call(g, m, x, kv, need_weights=True), "forward", g)
        out_r, w_r = r(x, kv, need_weights=True)
        if is_tensor(w) and w.shape == (2, H, 4, 4):
            g.fail("the keys come from x: in cross-attention queries come from x but keys and values from kv, so weights are (B, H, T, S)")
        _expect_weights(g, w, w_r, " with T=4 queries and S=6 keys")
        g.expect(close(w, w_r), "with kv given, the weights differ: keys are kv projected by qkv_proj's k rows")
        g.expect(is_tensor(out) and out.shape == (2, 4, C), f"out should be (B, T, C) = (2, 4, {C}), got {describe(out)}")
        g.expect(close(out, out_r), "with kv given, out differs: values are kv projected by qkv_proj's v rows")

    with g.check("key_padding_mask: True marks a real key, False a padded one"):
        m = _build(MultiHeadAttention)
        r = _twin(g, m)
        x = rand("mha.kpm.x", 2, 5, C)
        keep = att.padding_mask([5, 3], S=5)  # (B, S)
        out, w = _unpack(_call(g, m, x, key_padding_mask=keep, need_weights=True), "forward", g)
        if close(out, r(x, key_padding_mask=~keep)[0]):
            g.fail(
                "key_padding_mask is inverted: in this course True marks a real key and False padding "
                "(nn.MultiheadAttention uses the opposite)"
            )
        if is_tensor(w) and w.shape == (2, H, 5, 5):
            g.expect(bool((w[1, :, :, 3:] == 0).all()), "padded keys got non-zero weight: key_padding_mask was not applied")
        g.expect(close(out, r(x, key_padding_mask=keep)[0]), "with a key_padding_mask, out differs from the reference")

    with g.check("is_causal=True hides future keys"):
        m = _build(MultiHeadAttention)
        r = _twin(g, m)
        x = rand("mha.causal.x", 2, 6, C)
        out, _ = _unpack(_call(g, m, x, is_causal=True), "forward", g)
        if close(out, r(x)[0]):
            g.fail("is_causal=True was ignored: combine causal_mask(T, S) with the other masks")
        y = x.clone()
        y[:, 4:] += 1.0
        later, _ = _unpack(_call(g, m, y, is_causal=True), "forward", g)
        g.expect(
            is_tensor(out) and is_tensor(later) and out.shape == later.shape and close(later[:, :4], out[:, :4]),
            "with is_causal=True, outputs 0-3 changed when only tokens 4-5 changed: information leaks from the future",
        )
        g.expect(close(out, r(x, is_causal=True)[0]), "with is_causal=True, out differs from the reference")

    with g.check("boolean and floating attention masks, alone and combined"):
        m = _build(MultiHeadAttention)
        r = _twin(g, m)
        x = rand("mha.mask.x", 2, 5, C)
        bool_mask = torch.rand(2, 1, 5, 5, generator=generator("mha.mask.bool")) < 0.6  # (B, 1, T, S)
        bool_mask[..., 0] = True
        float_mask = rand("mha.mask.float", 5, 5)  # (T, S)
        keep = att.padding_mask([5, 4], S=5)
        for kwargs, what in (
            (dict(mask=bool_mask), "a boolean (B, 1, T, S) mask"),
            (dict(mask=att.causal_mask(5)), "a boolean (T, S) mask"),
            (dict(mask=float_mask), "a floating (T, S) mask"),
            (dict(mask=bool_mask, key_padding_mask=keep, is_causal=True), "a boolean mask, key_padding_mask and is_causal together"),
            (dict(mask=float_mask, key_padding_mask=keep, is_causal=True), "a floating mask, key_padding_mask and is_causal together"),
        ):
            out, _ = _unpack(_call(g, m, x, **kwargs), "forward", g)
            if kwargs["mask"].dtype == torch.bool and close(out, r(x, **{**kwargs, "mask": ~kwargs["mask"]})[0]):
                g.fail("a boolean mask is inverted: True means the query *may attend* to the key")
            if "is_causal" in kwargs and close(out, r(x, mask=kwargs["mask"])[0]):
                g.fail("only the mask was applied: key_padding_mask and is_causal must be combined with it (every part can remove a key)")
            g.expect(close(out, r(x, **kwargs)[0]), f"with {what}, out differs from the reference")

    with g.check("a query with no visible key gets a zero attention output, not NaN"):
        m = _build(MultiHeadAttention)
        r = _twin(g, m)
        x = rand("mha.empty.x", 2, 4, C)
        mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
        mask[1, 0, 2] = False  # query 2 of sequence 1 sees nothing
        out, _ = _unpack(_call(g, m, x, mask=mask), "forward", g)
        g.expect(
            is_tensor(out) and not bool(torch.isnan(out).any()),
            "a fully masked query gave NaN: use coursekit's scaled_dot_product_attention, whose fully masked rows are zeros",
        )
        g.expect(
            is_tensor(out) and out.shape == (2, 4, C) and close(out[1, 2], r.out_proj.bias.detach()),
            "the fully masked query's output should be out_proj's bias (a zero attention output)",
        )
        g.expect(close(out, r(x, mask=mask)[0]), "with one fully masked query, out differs from the reference")

    with g.check("grouped-query (n_kv_heads=2) and multi-query (n_kv_heads=1) attention"):
        for n_kv in (2, 1):
            m = _build(MultiHeadAttention, n_kv_heads=n_kv)
            r = _twin(g, m, n_kv_heads=n_kv)
            x = rand(f"mha.gqa{n_kv}.x", 2, 5, C)
            out, w = _unpack(_call(g, m, x, need_weights=True), "forward", g)
            out_r, w_r = r(x, need_weights=True)
            _expect_weights(g, w, w_r, f" with n_kv_heads={n_kv}")
            if n_kv > 1:
                q, k, v = r.project(x)
                tiled = att.scaled_dot_product_attention(q, k.repeat(1, H // n_kv, 1, 1), v.repeat(1, H // n_kv, 1, 1))[1]
                if close(w, tiled):
                    g.fail(
                        "the groups are wrong: query head h must read key/value head h // (H / H_kv), "
                        "so repeat each key/value head with repeat_interleave (repeat_kv), not repeat"
                    )
            g.expect(close(w, w_r), f"with n_kv_heads={n_kv}, the weights differ from the reference")
            g.expect(close(out, out_r), f"with n_kv_heads={n_kv}, out differs from the reference")

    with g.check("in eval mode dropout is off"):
        m = _build(MultiHeadAttention, dropout=0.5)
        r = _twin(g, m, dropout=0.5)
        m.eval()
        x = rand("mha.eval.x", 2, 5, C)
        out, w = _unpack(_call(g, m, x, need_weights=True), "forward", g)
        _, w_r = r(x, need_weights=True)
        if is_tensor(w) and w.shape == w_r.shape and bool((w == 0).any()):
            g.fail("in eval mode some weights were zeroed: apply dropout only when self.training is True")
        g.expect(close(out, r(x)[0]), "in eval mode with dropout=0.5, out differs from the reference (which applies no dropout in eval mode)")

    with g.check("in training mode dropout zeroes weights and rescales the rest by 1/(1-p)"):
        p = 0.5
        m = _build(MultiHeadAttention, dropout=p)
        r = _twin(g, m, dropout=p)
        m.train()
        x = rand("mha.train.x", 2, 5, C)
        out, w = _unpack(_call(g, m, x, need_weights=True), "forward", g)
        _, w_r = r(x, need_weights=True)
        _expect_weights(g, w, w_r, " (after dropout)")
        dropped = w == 0
        g.expect(bool(dropped.any()), "in training mode with dropout=0.5 no weight was zeroed: apply F.dropout to the attention weights")
        if close(w[~dropped], w_r[~dropped]):
            g.fail("the weights that survive dropout must be scaled by 1/(1-p) (F.dropout does this); yours are unscaled")
        g.expect(
            close(w[~dropped], w_r[~dropped] / (1 - p)),
            "the weights that survive dropout differ from the reference's weights times 1/(1-p)",
        )
        _, _, v = _heads(r, x)
        g.expect(
            close(out, r.out_proj(ref.merge_heads(w @ v))),
            "out must be computed from the weights after dropout: out = out_proj(merge_heads(dropout(weights) @ v))",
        )

    with g.check("gradients with respect to x match the reference"):
        m = _build(MultiHeadAttention, n_kv_heads=2)
        r = _twin(g, m, n_kv_heads=2)
        x = rand("mha.grad.x", 2, 4, C)
        upstream = rand("mha.grad.up", 2, 4, C)
        pr = probe(m, x.clone().requires_grad_(), is_causal=True, backward=(0, upstream))
        out, _ = _unpack(pr.result, "forward", g)
        g.expect(is_tensor(out) and out.requires_grad, "out does not depend on x through autograd: avoid .detach(), .numpy() or .item()")
        xr = x.clone().requires_grad_()
        (r(xr, is_causal=True)[0] * upstream).sum().backward()
        g.expect(pr.grads is not None and pr.grads[0] is not None and close(pr.grads[0], xr.grad), "the gradient with respect to x differs from the reference")

    g.finish()


# --------------------------------------------------------------------------- public checks


def check_split_heads(split_heads) -> None:
    """Public checks of ``split_heads`` on a (2, 3, 6) tensor of counting numbers."""
    g = Grader("split_heads (public)")
    x = torch.arange(36.0).view(2, 3, 6)  # (B=2, T=3, C=6)
    with g.check("split_heads(x of shape (2, 3, 6), 2) is (2, 2, 3, 3): head 0 = features 0-2, head 1 = features 3-5"):
        out = _call(g, split_heads, x, 2)
        g.expect(is_tensor(out) and out.shape == (2, 2, 3, 3), f"expected shape (B, H, T, D) = (2, 2, 3, 3), got {describe(out)}")
        g.expect(
            torch.equal(out[:, 0], x[..., :3]) and torch.equal(out[:, 1], x[..., 3:]),
            f"head 0 should hold features 0-2 and head 1 features 3-5 of every token; x[0] is\n{x[0]}\nyour out[0] is\n{out[0]}",
        )
    g.finish()


def check_merge_heads(merge_heads) -> None:
    """Public checks of ``merge_heads``: it undoes the reference ``split_heads``."""
    g = Grader("merge_heads (public)")
    x = torch.arange(36.0).view(2, 3, 6)  # (B=2, T=3, C=6)
    heads = ref.split_heads(x, 2).contiguous()  # (2, 2, 3, 3), laid out like attention's output
    with g.check("merge_heads(split_heads(x, 2)) gives x (2, 3, 6) back"):
        out = _call(g, merge_heads, heads)
        g.expect(is_tensor(out) and out.shape == (2, 3, 6), f"expected shape (B, T, H*D) = (2, 3, 6), got {describe(out)}")
        g.expect(
            torch.equal(out, x),
            f"expected x[0] =\n{x[0]}\ngot\n{out[0]}\n(each token's heads side by side: transpose before reshaping)",
        )
    g.finish()


def check_repeat_kv(repeat_kv) -> None:
    """Public checks of ``repeat_kv``: two key/value heads, each serving two query heads."""
    g = Grader("repeat_kv (public)")
    x = torch.stack([torch.zeros(3, 2), torch.ones(3, 2)])[None]  # (B=1, H_kv=2, S=3, D=2): head 0 zeros, head 1 ones
    with g.check("repeat_kv(x with heads [0, 1], 2) has heads [0, 0, 1, 1]"):
        out = repeat_kv(x, 2)
        g.expect(is_tensor(out) and out.shape == (1, 4, 3, 2), f"expected shape (B, H_kv * n_rep, S, D) = (1, 4, 3, 2), got {describe(out)}")
        got = [int(out[0, h, 0, 0]) for h in range(4)]
        g.expect(got == [0, 0, 1, 1], f"heads should be [0, 0, 1, 1] (each key/value head repeated in place), got {got}")
    g.finish()


def check_multihead_attention(MultiHeadAttention) -> None:
    """Public checks of ``MultiHeadAttention(8, 2)``: shapes, parameter count and the computation."""
    g = Grader("MultiHeadAttention (public)")
    x = rand("public.mha.x", 2, 5, 8, dtype=torch.float32)
    with g.check("MultiHeadAttention(8, 2) maps (2, 5, 8) to out (2, 5, 8) and weights (2, 2, 5, 5)"):
        out, weights = _unpack(MultiHeadAttention(8, 2)(x, need_weights=True), "forward", g)
        g.expect(
            is_tensor(out) and is_tensor(weights) and out.shape == (2, 5, 8) and weights.shape == (2, 2, 5, 5),
            f"expected out (B, T, C) = (2, 5, 8) and weights (B, H, T, S) = (2, 2, 5, 5), got {describe(out)} and {describe(weights)}",
        )
        g.expect(torch.allclose(weights.sum(-1), torch.ones(2, 2, 5)), "rows of the weights do not sum to 1")
    with g.check("MultiHeadAttention(8, 2) has 4 * 8^2 + 4 * 8 = 288 parameters"):
        n = sum(p.numel() for p in MultiHeadAttention(8, 2).parameters())
        g.expect(n == 288, f"expected 288 parameters (qkv_proj: 8 -> 24, out_proj: 8 -> 8, with biases), got {n}")
    with g.check("out matches the reference with the same weights"):
        m = MultiHeadAttention(8, 2)
        sd = m.state_dict()
        names = ("qkv_proj.weight", "qkv_proj.bias", "out_proj.weight", "out_proj.bias")
        g.expect(
            isinstance(sd, dict) and sorted(sd) == sorted(names),
            "the module needs exactly two nn.Linear layers, called qkv_proj and out_proj",
        )
        reference = ref.MultiHeadAttention(8, 2)
        weights = {k: v.float() for k, v in random_weights(reference, "public.mha.weights").items()}
        m.load_state_dict(weights)  # our weights, not only the module's own initial ones
        reference.load_state_dict(weights)
        out, _ = _unpack(m(x), "forward", g)
        g.expect(
            is_tensor(out) and torch.allclose(out, reference(x)[0], atol=1e-5),
            "out differs from the reference multi-head attention with your weights",
        )
    g.finish()

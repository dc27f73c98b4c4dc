"""Checks for Exercise 4 (transformer layers).

Each part has two entry points, both called from the notebook with the student's
class. ``check_*`` holds the *public* checks: small, fixed examples. ``grade_*`` holds
the *hidden* checks: the student's module gets random weights (pushed with
``load_state_dict``, so the submodule names of the instructions matter) and its output
is compared with ``torch.nn``'s own layers (``nn.LayerNorm``,
``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``) carrying the same
weights, on fresh seeded float64 inputs. Before the generic "differs" hint, each check
tries the common mistakes (computed with :mod:`coursekit.layers` pieces) and names the
one that matches.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import layers as ref
from coursekit.attention import causal_mask, padding_mask
from coursekit.grading.core import (
    Grader,
    close,
    describe,
    first_match,
    generator,
    is_a,
    is_tensor,
    load_weights,
    names_hint,
    probe,
    rand,
    random_weights,
)

__all__ = [
    "check_layer_norm", "check_feed_forward", "check_encoder_layer", "check_decoder_layer",
    "grade_layer_norm", "grade_feed_forward", "grade_encoder_layer", "grade_decoder_layer",
]

C, H, DFF = 16, 4, 24


# --------------------------------------------------------------------------- LayerNorm


def _ln_expected(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def grade_layer_norm(LayerNorm) -> None:
    """Grade a student's ``LayerNorm(d_model, eps=1e-5, bias=True)`` module class."""
    g = Grader("LayerNorm")

    def build(name, **kwargs):
        m = LayerNorm(C, **kwargs).double()
        w, b = rand(name + ".w", C) * 0.5 + 1, rand(name + ".b", C) * 0.5
        weights = {"weight": w, "bias": b} if kwargs.get("bias", True) else {"weight": w}
        load_weights(g, m, weights, "LayerNorm")
        return m, w, (b if kwargs.get("bias", True) else None)

    with g.check("has parameters weight (ones) and bias (zeros) of shape (C,)"):
        sd = LayerNorm(C).state_dict()
        g.expect(
            isinstance(sd, dict) and "weight" in sd and "bias" in sd,
            "LayerNorm needs learnable parameters named weight and bias (nn.Parameter), the affine "
            "scale and shift applied after normalising",
        )
        g.expect(
            is_tensor(sd["weight"]) and sd["weight"].shape == (C,) and bool((sd["weight"] == 1).all()),
            f"weight should start as ones of shape ({C},), got {describe(sd['weight'])}",
        )
        g.expect(
            is_tensor(sd["bias"]) and sd["bias"].shape == (C,) and bool((sd["bias"] == 0).all()),
            f"bias should start as zeros of shape ({C},), got {describe(sd['bias'])}",
        )

    with g.check("matches nn.LayerNorm with random scale and shift"):
        m, w, b = build("ln.values")
        x = rand("ln.values.x", 3, 5, C, scale=2.0) + 1.0
        out = m(x)
        g.expect(is_tensor(out) and out.shape == x.shape and out.dtype == x.dtype,
                 f"for input {describe(x)} expected the same shape and dtype, got {describe(out)}")
        mean = x.mean(-1, keepdim=True)
        first_match(g, out, [
            ((x - mean) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * w + b,
             "you used the unbiased variance (dividing by C - 1): layer norm divides by C, "
             "x.var(-1, unbiased=False) or ((x - mean) ** 2).mean(-1)"),
            ((x - mean) / (x.var(-1, unbiased=False, keepdim=True).sqrt() + 1e-5) * w + b,
             "eps must be added to the variance inside the square root: (x - mean) / sqrt(var + eps)"),
            (F.layer_norm(x, (C,), eps=1e-5),
             "the scale and shift are not applied: multiply by weight and add bias after normalising"),
        ])
        g.expect(close(out, _ln_expected(x, w, b)), "the output differs from nn.LayerNorm with the same weight and bias")

    with g.check("normalises each token over its own features (not over the batch)"):
        m, w, b = build("ln.axis")
        x = rand("ln.axis.x", 4, 3, C)
        y = x.clone()
        y[1:] = rand("ln.axis.other", 3, 3, C, scale=3.0) + 2.0
        a, c = m(x), m(y)
        g.expect(
            is_tensor(a) and is_tensor(c) and a.shape == x.shape and close(a[0], c[0]),
            "the output of the first sequence changed when only the other sequences in the batch changed: "
            "compute the mean and variance over the last (feature) axis, dim=-1 with keepdim=True "
            "(statistics over the batch are batch norm, not layer norm)",
        )

    with g.check("eps is added to the variance inside the square root"):
        m = LayerNorm(C, eps=0.1).double()
        w, b = rand("ln.eps.w", C) * 0.5 + 1, rand("ln.eps.b", C) * 0.5
        load_weights(g, m, {"weight": w, "bias": b}, "LayerNorm")
        x = rand("ln.eps.x", 2, 4, C, scale=0.1) + 3.0  # variance about 0.01, well below eps
        out = m(x)
        mean = x.mean(-1, keepdim=True)
        std = x.var(-1, unbiased=False, keepdim=True).sqrt()
        first_match(g, out, [
            ((x - mean) / (std + 0.1) * w + b,
             "eps must be added to the variance inside the square root: (x - mean) / sqrt(var + eps)"),
            (_ln_expected(x, w, b, eps=1e-5),
             "LayerNorm(C, eps=0.1) still used eps=1e-5: store the eps argument and use it"),
        ])
        g.expect(close(out, _ln_expected(x, w, b, eps=0.1)),
                 "with eps=0.1 and a small variance the output differs from nn.LayerNorm(C, eps=0.1)")

    with g.check("bias=False: a scale but no shift"):
        m, w, _ = build("ln.nobias", bias=False)
        x = rand("ln.nobias.x", 2, 3, C)
        g.expect(close(m(x), _ln_expected(x, w, None)),
                 "with bias=False the output differs from nn.LayerNorm(C, bias=False)")

    with g.check("any number of leading dimensions"):
        m, w, b = build("ln.shapes")
        for shape in ((C,), (2, 3, 4, C)):
            x = rand(f"ln.shapes.{shape}", *shape)
            out = m(x)
            g.expect(close(out, _ln_expected(x, w, b)),
                     f"for an input of shape {shape} the output differs from nn.LayerNorm")

    with g.check("gradients match nn.LayerNorm"):
        m, w, b = build("ln.grad")
        x = rand("ln.grad.x", 2, 3, C)
        up = rand("ln.grad.up", 2, 3, C)
        p = probe(m, x.clone().requires_grad_(), backward=(None, up))
        g.expect(is_tensor(p.result) and p.result.requires_grad,
                 "the output does not depend on x through autograd: avoid .detach(), .item() or .numpy()")
        xr = x.clone().requires_grad_()
        (_ln_expected(xr, w, b) * up).sum().backward()
        g.expect(p.grads and p.grads[0] is not None and close(p.grads[0], xr.grad),
                 "the gradient with respect to x differs from nn.LayerNorm's")

    g.finish()


# --------------------------------------------------------------------------- FeedForward


def grade_feed_forward(FeedForward) -> None:
    """Grade a student's ``FeedForward(d_model, d_ff=None, activation="relu", dropout=0.0, bias=True)``."""
    g = Grader("FeedForward")

    def build(name, d_ff=DFF, activation="relu", **kwargs):
        m = FeedForward(C, d_ff, activation, **kwargs).double().eval()
        r = ref.FeedForward(C, d_ff, activation, bias=kwargs.get("bias", True)).double().eval()
        weights = random_weights(r, name)
        load_weights(g, m, weights, "FeedForward")
        r.load_state_dict(weights)
        return m, r

    with g.check("has linear1 (C -> d_ff) and linear2 (d_ff -> C)"):
        m = FeedForward(C, DFF)
        for name, shape in (("linear1", (C, DFF)), ("linear2", (DFF, C))):
            layer = getattr(m, name, None)
            g.expect(is_a(layer, "torch.nn.modules.linear.Linear"), f"FeedForward needs an nn.Linear called {name}")
            g.expect((layer.in_features, layer.out_features) == shape,
                     f"{name} should map {shape[0]} to {shape[1]} features, got {layer.in_features} -> {layer.out_features}")

    with g.check("d_ff defaults to 4 * d_model"):
        n = FeedForward(C).linear1.out_features
        g.expect(n == 4 * C, f"FeedForward({C}) has a hidden width of {n}: d_ff defaults to 4 * d_model = {4 * C}")

    for activation in ("relu", "gelu"):
        with g.check(f"activation={activation!r} matches the reference"):
            m, r = build(f"ff.{activation}", activation=activation)
            x = rand(f"ff.{activation}.x", 2, 5, C)
            out = m(x)
            h = r.linear1(x)
            with torch.no_grad():
                act = F.relu if activation == "relu" else F.gelu
                first_match(g, out, [
                    (act(r.linear2(h)), "the activation goes between the two linear layers: linear2(act(linear1(x))), "
                                        "not act(linear2(linear1(x)))"),
                    (r.linear2(h), "no nonlinearity was applied: use linear2(act(linear1(x)))"),
                    (r.linear2(F.gelu(h, approximate="tanh")),
                     "you used the tanh approximation of GELU: use the exact GELU x * Phi(x), "
                     "nn.GELU() or F.gelu(h) (approximate='none')"),
                    (r.linear2(F.relu(h)) if activation == "gelu" else r.linear2(F.gelu(h)),
                     f"activation={activation!r} was ignored: choose ReLU or GELU from the argument"),
                ])
                g.expect(close(out, r(x)),
                         f"with activation={activation!r} the output differs from linear2(act(linear1(x)))")

    with g.check("bias=False: no biases"):
        m = FeedForward(C, DFF, bias=False)
        n = sum(p.numel() for p in m.parameters())
        g.expect(n == 2 * C * DFF,
                 f"FeedForward({C}, {DFF}, bias=False) should have 2 * {C} * {DFF} = {2 * C * DFF} parameters, got {n}")

    with g.check("applied to each position separately"):
        m, r = build("ff.position")
        x = rand("ff.position.x", 1, 4, C)
        y = x.clone()
        y[:, 1:] = rand("ff.position.other", 1, 3, C)
        a, b = m(x), m(y)
        g.expect(is_tensor(a) and is_tensor(b) and close(a[:, 0], b[:, 0]),
                 "the output at position 0 changed when only other positions changed: the feed-forward must act on each token alone")

    with g.check("dropout on the hidden activations, only in training mode"):
        m, r = build("ff.dropout", dropout=0.5)
        x = rand("ff.dropout.x", 4, 6, C)
        out = m(x)
        g.expect(close(out, r(x)), "in eval mode dropout must do nothing (use nn.Dropout, which knows the mode)")
        m.train()
        out = m(x)
        g.expect(is_tensor(out) and not close(out, r(x)),
                 "FeedForward(..., dropout=0.5) in training mode gave the eval output: is dropout applied?")
        zeros = int((out == 0).sum()) if is_tensor(out) else 0
        g.expect(zeros < out.numel() // 10,
                 f"dropout zeroes entries of the output ({zeros} of {out.numel()}): apply it to the hidden "
                 "activations, linear2(dropout(act(linear1(x))))")

    g.finish()


# --------------------------------------------------------------------------- EncoderLayer


def _torch_encoder(weights, norm_first, activation, bias=True):
    t = nn.TransformerEncoderLayer(C, H, DFF, dropout=0.0, activation=activation, norm_first=norm_first,
                                   batch_first=True, bias=bias).double().eval()
    t.load_state_dict(ref.to_torch_state_dict(weights))
    return t


def _encoder_mistakes(r: ref.EncoderLayer, x, norm_first, **masks):
    """Outputs of common wrong encoder layers built from the reference's own pieces."""
    def a(h):
        return r.self_attn(h, **masks)[0]
    n1, n2, f = r.norm1, r.norm2, r.ff
    out = []
    with torch.no_grad():
        r.norm_first = not norm_first
        out.append((r(x, **masks), "pre-norm and post-norm are swapped: norm_first=False is post-norm, "
                                   "x = norm1(x + self_attn(x)); norm_first=True is pre-norm, x = x + self_attn(norm1(x))"))
        r.norm_first = norm_first
        if norm_first:
            h = a(n1(x))
            out.append((h + f(n2(h)),
                        "the residual connection around self-attention is missing: x = x + self_attn(norm1(x))"))
            h = x + a(n1(x))
            out.append((f(n2(h)), "the residual connection around the feed-forward is missing: x = x + ff(norm2(x))"))
            h = n1(x)
            h = h + a(h)
            h = n2(h)
            out.append((h + f(h), "pre-norm normalises only the sub-layer's input, x = x + self_attn(norm1(x)): "
                                  "do not replace x by norm1(x), the residual stream itself stays un-normalised"))
        else:
            h = n1(a(x))
            out.append((n2(h + f(h)),
                        "the residual connection around self-attention is missing: x = norm1(x + self_attn(x))"))
            h = n1(x + a(x))
            out.append((n2(f(h)), "the residual connection around the feed-forward is missing: x = norm2(x + ff(x))"))
    return out


def grade_encoder_layer(EncoderLayer) -> None:
    """Grade a student's ``EncoderLayer(d_model, n_heads, d_ff=None, dropout=0.1, activation="relu",
    norm_first=False, eps=1e-5, bias=True)``."""
    g = Grader("EncoderLayer")

    def build(name, norm_first=False, activation="relu", bias=True, dropout=0.0):
        m = EncoderLayer(C, H, DFF, dropout=dropout, activation=activation, norm_first=norm_first, bias=bias).double().eval()
        r = ref.EncoderLayer(C, H, DFF, dropout=0.0, activation=activation, norm_first=norm_first, bias=bias).double().eval()
        weights = random_weights(r, name)
        load_weights(g, m, weights, "EncoderLayer")
        r.load_state_dict(weights)
        return m, r, _torch_encoder(weights, norm_first, activation, bias)

    with g.check("has self_attn, ff, norm1 and norm2 with the reference's parameter names"):
        m = EncoderLayer(C, H, DFF)
        expected = set(ref.EncoderLayer(C, H, DFF).state_dict())
        sd = m.state_dict()
        got = set(sd) if isinstance(sd, dict) else set()
        g.expect(got == expected, names_hint("EncoderLayer", got, expected))
        n = sum(p.numel() for p in m.parameters())
        g.expect(n == ref.encoder_layer_params(C, DFF), f"expected {ref.encoder_layer_params(C, DFF)} parameters, got {n}")

    with g.check("d_ff defaults to 4 * d_model"):
        n = EncoderLayer(C, H).ff.linear1.out_features
        g.expect(n == 4 * C,
                 f"EncoderLayer({C}, {H}) has a feed-forward width of {n}: pass d_ff on, its default is 4 * d_model")

    for norm_first, activation in ((False, "relu"), (True, "relu"), (False, "gelu"), (True, "gelu")):
        label = "pre-norm" if norm_first else "post-norm"
        with g.check(f"{label} (norm_first={norm_first}), {activation}: matches nn.TransformerEncoderLayer"):
            m, r, t = build(f"enc.{norm_first}.{activation}", norm_first, activation)
            x = rand(f"enc.{norm_first}.{activation}.x", 2, 5, C)
            out = m(x)
            g.expect(is_tensor(out) and out.shape == x.shape,
                     f"expected an output of shape {tuple(x.shape)}, got {describe(out)}")
            first_match(g, out, _encoder_mistakes(r, x, norm_first))
            g.expect(close(out, t(x)),
                     f"the {label} output differs from nn.TransformerEncoderLayer(norm_first={norm_first}) with the same weights")

    with g.check("key_padding_mask (True = real token) reaches self-attention"):
        m, r, t = build("enc.padding", norm_first=True)
        x = rand("enc.padding.x", 3, 5, C)
        keep = padding_mask([4, 3, 2], S=5)  # every sequence has padding, so the inverted mask hides no row entirely
        out = m(x, key_padding_mask=keep)
        first_match(g, out, [
            (t(x, src_key_padding_mask=keep), "key_padding_mask is inverted: in this course True marks real tokens"),
            (t(x), "key_padding_mask was ignored: pass it to self_attn(..., key_padding_mask=key_padding_mask)"),
        ])
        g.expect(close(out, t(x, src_key_padding_mask=~keep)),
                 "with a key_padding_mask the output differs from nn.TransformerEncoderLayer")

    with g.check("mask and is_causal reach self-attention"):
        m, r, t = build("enc.mask")
        x = rand("enc.mask.x", 2, 5, C)
        mask = torch.rand(5, 5, generator=generator("enc.mask.m")) < 0.6
        mask[:, 0] = True
        out = m(x, mask=mask)
        g.expect(not close(out, t(x)), "the mask was ignored: pass it to self_attn(..., mask=mask)")
        g.expect(close(out, t(x, src_mask=~mask)),
                 "with a boolean mask (True = may attend) the output differs from the reference")
        out = m(x, is_causal=True)
        g.expect(not close(out, t(x)), "is_causal=True was ignored: pass it to self_attn(..., is_causal=is_causal)")
        g.expect(close(out, t(x, src_mask=~causal_mask(5), is_causal=True)),
                 "with is_causal=True the output differs from the reference")

    with g.check("bias=False is passed to the projections and norms"):
        m = EncoderLayer(C, H, DFF, bias=False)
        n = sum(p.numel() for p in m.parameters())
        g.expect(n == ref.encoder_layer_params(C, DFF, bias=False),
                 f"EncoderLayer(..., bias=False) should have {ref.encoder_layer_params(C, DFF, bias=False)} parameters "
                 f"(no biases in attention, feed-forward or norms), got {n}")

    with g.check("dropout does nothing in eval mode and something in training mode"):
        m, r, t = build("enc.dropout", dropout=0.5)
        x = rand("enc.dropout.x", 2, 5, C)
        g.expect(close(m(x), t(x)),
                 "EncoderLayer(..., dropout=0.5) in eval mode differs from the reference: use nn.Dropout modules")
        m.train()
        g.expect(not close(m(x), t(x)),
                 "in training mode dropout=0.5 changed nothing: apply dropout to each sub-layer's output")

    with g.check("gradients match nn.TransformerEncoderLayer"):
        m, r, t = build("enc.grad", norm_first=True, activation="gelu")
        x = rand("enc.grad.x", 2, 4, C)
        up = rand("enc.grad.up", 2, 4, C)
        p = probe(m, x.clone().requires_grad_(), backward=(None, up))
        g.expect(is_tensor(p.result) and p.result.requires_grad,
                 "the output does not depend on x through autograd: avoid .detach(), .item() or .numpy()")
        xr = x.clone().requires_grad_()
        (t(xr) * up).sum().backward()
        g.expect(p.grads and p.grads[0] is not None and close(p.grads[0], xr.grad),
                 "the gradient with respect to x differs from the reference")

    g.finish()


# --------------------------------------------------------------------------- DecoderLayer


def _torch_decoder(weights, norm_first, activation, bias=True):
    t = nn.TransformerDecoderLayer(C, H, DFF, dropout=0.0, activation=activation, norm_first=norm_first,
                                   batch_first=True, bias=bias).double().eval()
    t.load_state_dict(ref.to_torch_state_dict(weights))
    return t


def _causal_torch(t, x, memory, **kwargs):
    T = x.shape[1]
    return t(x, memory, tgt_mask=~causal_mask(T), tgt_is_causal=True, **kwargs)


def _decoder_mistakes(r: ref.DecoderLayer, x, memory, norm_first):
    out = []
    with torch.no_grad():
        out.append((r(x, memory, is_causal=False),
                    "self-attention must be causal by default: pass is_causal=is_causal (default True) to self_attn"))
        r.norm_first = not norm_first
        out.append((r(x, memory),
                    "pre-norm and post-norm are swapped: norm_first=False is post-norm, x = norm(x + sublayer(x))"))
        r.norm_first = norm_first
        sa = lambda h: r.self_attn(h, is_causal=True)[0]  # noqa: E731
        if norm_first:
            h = x + sa(r.norm1(x))
            n = r.norm2(h)
            wrong_kv = h + r.cross_attn(n, kv=n)[0]
            normed_memory = h + r.cross_attn(n, kv=r.norm2(memory))[0]
            out.append((wrong_kv + r.ff(r.norm3(wrong_kv)),
                        "cross-attention must take its keys and values from memory: self.cross_attn(h, kv=memory, ...)"))
            out.append((normed_memory + r.ff(r.norm3(normed_memory)),
                        "do not normalise memory in the decoder: only the query side, cross_attn(norm2(x), kv=memory)"))
        else:
            h = r.norm1(x + sa(x))
            wrong_kv = r.norm2(h + r.cross_attn(h, kv=h)[0])
            out.append((r.norm3(wrong_kv + r.ff(wrong_kv)),
                        "cross-attention must take its keys and values from memory: self.cross_attn(h, kv=memory, ...)"))
    return out


def grade_decoder_layer(DecoderLayer) -> None:
    """Grade a student's ``DecoderLayer(d_model, n_heads, d_ff=None, dropout=0.1, activation="relu",
    norm_first=False, eps=1e-5, bias=True)``."""
    g = Grader("DecoderLayer")

    def build(name, norm_first=False, activation="relu", dropout=0.0):
        m = DecoderLayer(C, H, DFF, dropout=dropout, activation=activation, norm_first=norm_first).double().eval()
        r = ref.DecoderLayer(C, H, DFF, dropout=0.0, activation=activation, norm_first=norm_first).double().eval()
        weights = random_weights(r, name)
        load_weights(g, m, weights, "DecoderLayer")
        r.load_state_dict(weights)
        return m, r, _torch_decoder(weights, norm_first, activation)

    with g.check("has self_attn, cross_attn, ff and norm1-3 with the reference's parameter names"):
        m = DecoderLayer(C, H, DFF)
        expected = set(ref.DecoderLayer(C, H, DFF).state_dict())
        sd = m.state_dict()
        got = set(sd) if isinstance(sd, dict) else set()
        g.expect(got == expected, names_hint("DecoderLayer", got, expected))
        n = sum(p.numel() for p in m.parameters())
        g.expect(n == ref.decoder_layer_params(C, DFF), f"expected {ref.decoder_layer_params(C, DFF)} parameters, got {n}")

    for norm_first, activation in ((False, "relu"), (True, "gelu")):
        label = "pre-norm" if norm_first else "post-norm"
        with g.check(f"{label} (norm_first={norm_first}), {activation}: matches nn.TransformerDecoderLayer with a causal mask"):
            m, r, t = build(f"dec.{norm_first}", norm_first, activation)
            x, memory = rand(f"dec.{norm_first}.x", 2, 5, C), rand(f"dec.{norm_first}.mem", 2, 7, C)
            out = m(x, memory)
            g.expect(is_tensor(out) and out.shape == x.shape,
                     f"for x {tuple(x.shape)} and memory {tuple(memory.shape)} expected an output of shape {tuple(x.shape)}, got {describe(out)}")
            first_match(g, out, _decoder_mistakes(r, x, memory, norm_first))
            g.expect(close(out, _causal_torch(t, x, memory)),
                     f"the {label} output differs from nn.TransformerDecoderLayer(norm_first={norm_first}) with the same weights")

    with g.check("is_causal=False removes the causal mask"):
        m, r, t = build("dec.noncausal", norm_first=True)
        x, memory = rand("dec.noncausal.x", 2, 4, C), rand("dec.noncausal.mem", 2, 6, C)
        g.expect(close(m(x, memory, is_causal=False), t(x, memory)),
                 "with is_causal=False the output differs from nn.TransformerDecoderLayer without a target mask")

    with g.check("a future token does not change earlier outputs"):
        m, r, t = build("dec.future")
        x, memory = rand("dec.future.x", 2, 6, C), rand("dec.future.mem", 2, 5, C)
        y = x.clone()
        y[:, 4:] = rand("dec.future.y", 2, 2, C)
        a, b = m(x, memory), m(y, memory)
        g.expect(is_tensor(a) and is_tensor(b) and close(a[:, :4], b[:, :4]),
                 "outputs at positions 0-3 changed when only positions 4-5 changed: information leaks from the future "
                 "(self-attention must be causal, and cross-attention must read memory, not x)")

    with g.check("memory_key_padding_mask (True = real token) reaches cross-attention"):
        m, r, t = build("dec.mempad", norm_first=True)
        x, memory = rand("dec.mempad.x", 3, 4, C), rand("dec.mempad.mem", 3, 6, C)
        keep = padding_mask([5, 3, 1], S=6)  # every sequence has padding
        out = m(x, memory, memory_key_padding_mask=keep)
        first_match(g, out, [
            (_causal_torch(t, x, memory), "memory_key_padding_mask was ignored: pass it to cross_attn as key_padding_mask"),
            (_causal_torch(t, x, memory, memory_key_padding_mask=keep),
             "memory_key_padding_mask is inverted: in this course True marks real tokens"),
        ])
        g.expect(close(out, _causal_torch(t, x, memory, memory_key_padding_mask=~keep)),
                 "with a memory_key_padding_mask the output differs from nn.TransformerDecoderLayer")

    with g.check("key_padding_mask and memory_mask reach their attentions"):
        m, r, t = build("dec.masks")
        x, memory = rand("dec.masks.x", 3, 5, C), rand("dec.masks.mem", 3, 6, C)
        keep = padding_mask([5, 4, 3])
        out = m(x, memory, key_padding_mask=keep)
        g.expect(not close(out, _causal_torch(t, x, memory)),
                 "key_padding_mask was ignored: pass it to self_attn(..., key_padding_mask=key_padding_mask)")
        g.expect(close(out, _causal_torch(t, x, memory, tgt_key_padding_mask=~keep)),
                 "with a key_padding_mask the output differs from the reference")
        memory_mask = torch.rand(5, 6, generator=generator("dec.masks.mm")) < 0.5
        memory_mask[:, 0] = True
        out = m(x, memory, memory_mask=memory_mask)
        g.expect(not close(out, _causal_torch(t, x, memory)),
                 "memory_mask was ignored: pass it to cross_attn(..., mask=memory_mask)")
        g.expect(close(out, _causal_torch(t, x, memory, memory_mask=~memory_mask)),
                 "with a memory_mask the output differs from the reference")

    with g.check("dropout does nothing in eval mode and something in training mode"):
        m, r, t = build("dec.dropout", dropout=0.5)
        x, memory = rand("dec.dropout.x", 2, 5, C), rand("dec.dropout.mem", 2, 6, C)
        g.expect(close(m(x, memory), _causal_torch(t, x, memory)),
                 "DecoderLayer(..., dropout=0.5) in eval mode differs from the reference: use nn.Dropout modules")
        m.train()
        g.expect(not close(m(x, memory), _causal_torch(t, x, memory)), "in training mode dropout=0.5 changed nothing")

    with g.check("gradients reach x and memory as in nn.TransformerDecoderLayer"):
        m, r, t = build("dec.grad", norm_first=True, activation="gelu")
        x, memory = rand("dec.grad.x", 2, 4, C), rand("dec.grad.mem", 2, 5, C)
        up = rand("dec.grad.up", 2, 4, C)
        p = probe(m, x.clone().requires_grad_(), memory.clone().requires_grad_(), backward=(None, up))
        g.expect(is_tensor(p.result) and p.result.requires_grad,
                 "the output does not depend on x through autograd: avoid .detach(), .item() or .numpy()")
        xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
        (_causal_torch(t, xr, mr) * up).sum().backward()
        for name, got, want in zip(("x", "memory"), p.grads or [None, None], (xr.grad, mr.grad)):
            g.expect(got is not None and close(got, want), f"the gradient with respect to {name} differs from the reference")

    g.finish()


# --------------------------------------------------------------------------- public checks


def check_layer_norm(LayerNorm) -> None:
    """Public checks of ``LayerNorm(4)`` on two hand-computable rows."""
    g = Grader("LayerNorm (public)")
    with g.check("LayerNorm(4) has weight (ones) and bias (zeros)"):
        sd = LayerNorm(4).state_dict()
        g.expect(isinstance(sd, dict) and set(sd) == {"weight", "bias"},
                 f"LayerNorm needs exactly two parameters, weight and bias, got {sorted(sd) if isinstance(sd, dict) else describe(sd)}")
        g.expect(torch.equal(sd["weight"], torch.ones(4)) and torch.equal(sd["bias"], torch.zeros(4)),
                 "weight should start as ones and bias as zeros")
    with g.check("LayerNorm(4) of [[1, 2, 3, 4], [2, 2, 2, 2]]"):
        x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]])
        expected = torch.stack([(x[0] - 2.5) / math.sqrt(1.25 + 1e-5), torch.zeros(4)])
        out = LayerNorm(4)(x)
        g.expect(is_tensor(out) and out.shape == (2, 4), f"expected a (2, 4) tensor, got {describe(out)}")
        g.expect(not torch.allclose(out[0], (x[0] - 2.5) / x[0].std(), atol=1e-4),
                 "you used the unbiased variance (divide by C - 1): layer norm divides by C")
        g.expect(bool(torch.isfinite(out).all()),
                 "a constant row gave inf or NaN: add eps to the variance inside the square root")
        g.expect(torch.allclose(out, expected, atol=1e-5),
                 f"expected (x - mean) / sqrt(var + 1e-5) with the biased variance:\n{expected}\ngot\n{out}")
    g.finish()


def check_feed_forward(FeedForward) -> None:
    """Public checks of ``FeedForward(8)``: shapes and the computation with ReLU."""
    g = Grader("FeedForward (public)")
    with g.check("FeedForward(8) maps 8 -> 32 -> 8 and keeps the shape"):
        ff = FeedForward(8)
        g.expect(is_a(ff.linear1, "torch.nn.modules.linear.Linear") and is_a(ff.linear2, "torch.nn.modules.linear.Linear"),
                 "FeedForward needs nn.Linear layers called linear1 and linear2")
        g.expect(ff.linear1.out_features == 32, f"d_ff defaults to 4 * d_model = 32, got {ff.linear1.out_features}")
        out = ff(rand("public.ff.x", 2, 3, 8, dtype=torch.float32))
        g.expect(is_tensor(out) and out.shape == (2, 3, 8), f"expected (2, 3, 8), got {describe(out)}")
    with g.check("out = linear2(relu(linear1(x)))"):
        ff = FeedForward(8, 16)
        w = ff.state_dict()
        x = rand("public.ff.x2", 2, 3, 8, dtype=torch.float32)
        expected = F.linear(F.relu(F.linear(x, w["linear1.weight"], w["linear1.bias"])), w["linear2.weight"], w["linear2.bias"])
        out = ff(x)
        g.expect(is_tensor(out) and torch.allclose(out, expected, atol=1e-5), "out differs from linear2(relu(linear1(x)))")
    g.finish()


def check_encoder_layer(EncoderLayer) -> None:
    """Public checks of ``EncoderLayer(8, 2)`` against ``nn.TransformerEncoderLayer`` (both norm_first)."""
    g = Grader("EncoderLayer (public)")
    x = rand("public.enc.x", 2, 5, 8, dtype=torch.float32)
    for norm_first in (False, True):
        with g.check(f"EncoderLayer(8, 2, dropout=0.0, norm_first={norm_first}) equals torch's layer with its weights"):
            layer = EncoderLayer(8, 2, dropout=0.0, norm_first=norm_first).eval()
            sd = layer.state_dict()
            expected_names = set(ref.EncoderLayer(8, 2).state_dict())
            g.expect(isinstance(sd, dict) and set(sd) == expected_names,
                     names_hint("EncoderLayer", set(sd) if isinstance(sd, dict) else set(), expected_names))
            t = nn.TransformerEncoderLayer(8, 2, 32, dropout=0.0, norm_first=norm_first, batch_first=True).eval()
            t.load_state_dict(ref.to_torch_state_dict(sd))
            out = layer(x)
            g.expect(is_tensor(out) and out.shape == (2, 5, 8), f"expected (2, 5, 8), got {describe(out)}")
            g.expect(torch.allclose(out, t(x), atol=1e-5),
                     f"the output differs from nn.TransformerEncoderLayer(norm_first={norm_first}) "
                     "(post-norm: x = norm1(x + self_attn(x)); pre-norm: x = x + self_attn(norm1(x)))")
    g.finish()


def check_decoder_layer(DecoderLayer) -> None:
    """Public checks of ``DecoderLayer(8, 2)`` against ``nn.TransformerDecoderLayer`` with a causal mask."""
    g = Grader("DecoderLayer (public)")
    x = rand("public.dec.x", 2, 4, 8, dtype=torch.float32)
    memory = rand("public.dec.mem", 2, 6, 8, dtype=torch.float32)
    for norm_first in (False, True):
        with g.check(f"DecoderLayer(8, 2, dropout=0.0, norm_first={norm_first}) equals torch's layer with its weights"):
            layer = DecoderLayer(8, 2, dropout=0.0, norm_first=norm_first).eval()
            sd = layer.state_dict()
            expected_names = set(ref.DecoderLayer(8, 2).state_dict())
            g.expect(isinstance(sd, dict) and set(sd) == expected_names,
                     names_hint("DecoderLayer", set(sd) if isinstance(sd, dict) else set(), expected_names))
            t = nn.TransformerDecoderLayer(8, 2, 32, dropout=0.0, norm_first=norm_first, batch_first=True).eval()
            t.load_state_dict(ref.to_torch_state_dict(sd))
            out = layer(x, memory)
            g.expect(is_tensor(out) and out.shape == (2, 4, 8), f"expected (2, 4, 8), got {describe(out)}")
            g.expect(torch.allclose(out, _causal_torch(t, x, memory), atol=1e-5),
                     f"the output differs from nn.TransformerDecoderLayer(norm_first={norm_first}) with a causal mask "
                     "(self-attention is causal by default; cross-attention reads memory)")
    g.finish()

"""Checks for Exercise 4 (transformer layers).

Each part has two entry points, both called from the notebook with the student's class.
``check_*`` holds the *public* checks: one small, fixed example per clause of the part's text,
so a student knows what will be graded. ``grade_*`` holds the *hidden* checks: one named check
per clause of the text and docstring (every constructor argument at non-default values, every
mask and shape the docstring allows, each dropout in isolation, the promised errors), on fresh
inputs drawn across what the text allows (derandomized property-based examples that shrink to
the smallest failing one). The student's module always gets random weights, pushed with
``load_state_dict`` (so the submodule names of the instructions matter), and its output is
compared in float64 with :mod:`coursekit.layers` carrying the same weights (which
``tests/test_layers.py`` shows equal to ``nn.LayerNorm``, ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer``). Before the generic "differs" hint, each check tries the common
mistakes (computed with :mod:`coursekit.layers` pieces) and names the one that matches.

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch import nn

from coursekit import layers as ref
from coursekit.attention import padding_mask
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    describe,
    expect_close,
    expect_value_error,
    first_match,
    for_all,
    is_a,
    is_tensor,
    load_weights,
    magnitude,
    names_hint,
    probe,
    rand,
    random_weights,
    set_attr,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band

__all__ = [
    "check_layer_norm",
    "check_feed_forward",
    "check_encoder_layer",
    "check_decoder_layer",
    "grade_layer_norm",
    "grade_feed_forward",
    "grade_encoder_layer",
    "grade_decoder_layer",
    "check_predict_layer_norm_params",
    "grade_predict_layer_norm_params",
    "check_predict_input_gradient",
    "grade_predict_input_gradient",
    "check_predict_swiglu_params",
    "grade_predict_swiglu_params",
    "check_input_gradient_norm",
    "grade_input_gradient_norm",
    "check_rms_norm",
    "grade_rms_norm",
]

F64 = torch.float64
DROPOUT = "torch.nn.modules.dropout.Dropout"
LINEAR = "torch.nn.modules.linear.Linear"


# --------------------------------------------------------------------------- helpers


def _args(*positional, **kwargs) -> str:
    """'16, 4, dropout=0.0' from the arguments given (keyword arguments that are None are left out)."""
    return ", ".join(
        [repr(a) for a in positional] + [f"{k}={v!r}" for k, v in kwargs.items() if v is not None]
    )


def _load(
    g: Grader,
    module,
    weights: dict[str, torch.Tensor],
    what: str,
    d_ff: int | None = None,
    bias: bool | None = None,
) -> None:
    """:func:`load_weights`, after checking that every parameter has the shape of the weights to load.

    ``d_ff``: the default width 4 * d_model where the call left d_ff out: a parameter whose expected
    shape has that width and that came out otherwise is told that d_ff defaults to it (and only such a
    parameter). ``bias``: the module's bias argument (see :func:`names_hint`)."""
    sd = module.state_dict()
    got = set(sd) if isinstance(sd, dict) else set()
    g.expect(got == set(weights), names_hint(what, got, set(weights), bias))
    for key, value in weights.items():
        shape = tuple(sd[key].shape)
        g.expect(
            shape == tuple(value.shape),
            f"{what}: {key} has shape {shape}, expected {tuple(value.shape)}"
            + (": d_ff defaults to 4 * d_model" if d_ff is not None and d_ff in value.shape else ""),
        )
    load_weights(g, module, weights, what, bias)


def _for_all_then_diagnose(name: str, strategy, test, cache: dict, fixed=(), **kwargs) -> None:
    """``test`` on the ``fixed`` examples (with the known mistakes' diagnosis), then :func:`for_all`.

    A mistake that the fixed examples show fails there at once, with its own hint and no shrinking
    (each example builds and runs a layer, so shrinking costs seconds). In :func:`for_all` the
    known mistakes are tried only once it has failed: on the smallest failing example (the last one
    Hypothesis ran), ``test`` runs again with ``cache["diagnose"]`` set."""
    cache["diagnose"] = True
    try:
        for case in fixed:
            test(case)
    finally:
        cache["diagnose"] = False
    tried = []

    def run(case):
        tried.append(case)
        test(case)

    try:
        for_all(name, strategy, run, **kwargs)
    except Exception as e:
        if getattr(e, "hint", None) is None or not tried:  # not a failed check (e.g. not implemented yet)
            raise
        cache["diagnose"] = True
        try:
            test(tried[-1])  # fails again, with the mistake's own hint where one matches
        finally:
            cache["diagnose"] = False
        raise


def _get(obj, path: str):
    """``obj.a.b`` for ``path = "a.b"``; None where an attribute is missing."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


# --------------------------------------------------------------------------- LayerNorm


def _ln(x, weight, bias, eps=1e-5):
    """The reference layer norm, in x's dtype: what nn.LayerNorm computes (``tests/test_layers.py``), written out
    because torch's fused kernel is slow to start on a loaded machine."""
    mean = x.mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _ln_mistakes(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    std = x.var(-1, unbiased=False, keepdim=True).sqrt()
    out = (
        []
        if x.shape[-1] < 2
        else [
            (
                (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + (0 if b is None else b),
                "you used the unbiased variance (dividing by C - 1): layer norm divides by C, "
                "x.var(-1, unbiased=False) or ((x - mean) ** 2).mean(-1)",
            )
        ]
    )
    out += [
        (
            (x - mean) / (std + eps) * w + (0 if b is None else b),
            "eps must be added to the variance inside the square root: (x - mean) / sqrt(var + eps)",
        ),
        (
            _ln(x, None, None, eps),
            "the scale and shift are not applied: multiply by weight and add bias after normalising",
        ),
        (
            _ln(x, w, b, 1e-5),
            f"LayerNorm(C, eps={eps:g}) still used eps=1e-5: store the eps argument and use it",
        ),
    ]
    if eps == 1e-5:
        out += [
            (_ln(x, w, b, other), f"eps defaults to 1e-5 (as in nn.LayerNorm), not {other:g}")
            for other in (1e-6, 1e-8, 1e-12, 0.0)
        ]
    if x.dim() > 1:
        m0, v0 = x.mean(0, keepdim=True), x.var(0, unbiased=False, keepdim=True)
        out.append(
            (
                (x - m0) / torch.sqrt(v0 + eps) * w + (0 if b is None else b),
                "the statistics are taken over the batch (dim 0): layer norm normalises each token over its "
                "own features, mean and variance over dim=-1 with keepdim=True",
            )
        )
    return out


@st.composite
def _ln_case(draw, eps=False):
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    C = draw(st.sampled_from([1, 2, 3, 5, 8, 12, 16]))
    e = draw(st.sampled_from([1e-5, 1e-3, 0.1, 0.5, 2.0])) if eps else None
    scale = draw(st.sampled_from([1.0, 0.05, 30.0]))
    return lead, C, e, draw(st.booleans()), scale, draw(st.integers(0, 2**16))


def grade_layer_norm(LayerNorm) -> None:
    """Grade a student's ``LayerNorm(d_model, eps=1e-5, bias=True)`` module class."""
    g = Grader("LayerNorm")

    def build(name, C, eps=None, bias=True, dtype=F64):
        what = f"LayerNorm({_args(C, eps=eps, bias=None if bias else False)})"
        m = call_student(
            g,
            what,
            LayerNorm,
            C,
            **({} if eps is None else {"eps": eps}),
            **({} if bias else {"bias": False}),
        )
        m = m.to(dtype)
        w = (rand(name + ".w", C) * 0.5 + 1).to(dtype)
        b = (rand(name + ".b", C) * 0.5).to(dtype) if bias else None
        _load(g, m, {"weight": w, "bias": b} if bias else {"weight": w}, what, bias=bias)
        return m, w, b, what

    with g.check("has parameters weight (ones) and bias (zeros) of shape (C,); bias=False registers no bias"):
        for C in (16, 3):
            m = call_student(g, f"LayerNorm({C})", LayerNorm, C)
            params = dict(m.named_parameters())
            g.expect(
                set(params) == {"weight", "bias"},
                f"LayerNorm({C}) needs exactly two nn.Parameters, weight and bias, got {sorted(params)}",
            )
            g.expect(
                close(params["weight"].detach(), torch.ones(C)),
                f"LayerNorm({C}).weight should start as ones of shape ({C},), got {describe(params['weight'])}",
            )
            g.expect(
                close(params["bias"].detach(), torch.zeros(C)),
                f"LayerNorm({C}).bias should start as zeros of shape ({C},), got {describe(params['bias'])}",
            )
        m = call_student(g, "LayerNorm(16, bias=False)", LayerNorm, 16, bias=False)
        params = dict(m.named_parameters())
        g.expect(
            set(params) == {"weight"} and m.bias is None,
            f"LayerNorm(16, bias=False) should have only the parameter weight and self.bias = None, "
            f"got parameters {sorted(params)} and bias {describe(m.bias)}",
        )

    def values(case):
        lead, C, eps, bias, scale, seed = case
        m, w, b, what = build(f"ln.{seed}", C, eps=eps, bias=bias)
        x = tensor(seed, *lead, C, scale=scale) + scale
        what = f"{what} on x {(*lead, C)}"
        out = call_student(g, what, m, x)
        expected = _ln(x, w, b, 1e-5 if eps is None else eps)
        if not close(out, expected, magnitude=magnitude(x)):
            first_match(
                g,
                out,
                [
                    (wrong, f"{what}: {hint}")
                    for wrong, hint in _ln_mistakes(x, w, b, 1e-5 if eps is None else eps)
                ],
                expected,
            )
            expect_close(g, what, out, expected, magnitude(x))

    with g.check(
        "(x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance), "
        "for any number of leading dimensions"
    ):
        for_all("ln.values", _ln_case(), values, max_examples=12, first=((2, 3), 4, None, True, 1.0, 0))

    with g.check("eps at other values, added to the variance inside the square root; bias=False: no shift"):
        for_all("ln.eps", _ln_case(eps=True), values, max_examples=10, first=((2,), 5, 0.5, True, 0.05, 1))
        values(((3,), 8, 0.1, False, 0.05, 7))

    with g.check("float32 in, float32 out; accurate when the features share a large offset (1e4 + noise)"):
        m, w, b, what = build("ln.stable", 16, dtype=torch.float32)
        x = rand("ln.stable.x", 3, 5, 16, dtype=torch.float32) + 1e4
        out = call_student(g, f"{what} on float32 x = 1e4 + noise (3, 5, 16)", m, x)
        expected = _ln(x.double(), w.double(), b.double()).float()
        if is_tensor(out) and out.dtype == F64:
            g.fail(f"{what} on float32 x returned float64: return x's dtype")
        expect_close(
            g,
            f"{what} on float32 x = 1e4 + noise (3, 5, 16)",
            out,
            expected,
            magnitude(x),
            advice=": compute the variance as the mean of squared deviations, ((x - mean) ** 2).mean(-1); "
            "E[x^2] - E[x]^2 loses every digit when the mean is large",
        )

    with g.check("training and evaluation modes compute the same thing"):
        m, w, b, what = build("ln.modes", 6)
        x = rand("ln.modes.x", 4, 3, 6, scale=2.0)
        m.eval()
        in_eval = call_student(g, f"{what} in eval mode on x (4, 3, 6)", m, x)
        m.train()
        expect_close(
            g,
            f"{what} in training mode on x (4, 3, 6), compared with its output in eval mode",
            call_student(g, f"{what} in training mode on x (4, 3, 6)", m, x),
            in_eval if is_tensor(in_eval) else x,
            advice=": layer norm uses each token's own statistics in both modes (no running averages, "
            "no dropout)",
        )

    with g.check("x whose last axis is not C raises a ValueError"):
        m = call_student(g, "LayerNorm(6)", LayerNorm, 6)
        for shape in ((2, 5), (2, 3, 1), (7,)):
            expect_value_error(
                g,
                lambda: m(torch.zeros(*shape)),
                f"LayerNorm(6) on x {shape}",
                "compare x.shape[-1] with d_model and name both",
            )

    with g.check("leaves x unchanged; gradients with respect to x match nn.LayerNorm's"):
        m, w, b, what = build("ln.grad", 6)
        x = rand("ln.grad.x", 2, 3, 6)
        up = rand("ln.grad.up", 2, 3, 6)
        p = probe(m, x.clone())
        g.expect(
            is_tensor(p.args[0]) and torch.equal(p.args[0], x),
            f"{what} modified x in place: compute a new tensor",
        )
        p = probe(m, x.clone().requires_grad_(), backward=(None, up))
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            f"{what} on x (2, 3, 6): the output does not depend on x through autograd: avoid .detach(), "
            ".item() or .numpy()",
        )
        xr = x.clone().requires_grad_()
        (_ln(xr, w, b) * up).sum().backward()
        expect_close(
            g,
            f"{what} on x (2, 3, 6), the gradient with respect to x",
            p.grads[0] if p.grads else None,
            xr.grad,
        )

    g.finish()


# --------------------------------------------------------------------------- FeedForward


def _ff_expected(r, x, act):
    return r.linear2(act(r.linear1(x)))


@st.composite
def _ff_case(draw):
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    C = draw(st.sampled_from([1, 3, 4, 8, 12]))
    d_ff = draw(st.sampled_from([None, 1, 5, 7, 16]))
    return lead, C, d_ff, draw(st.booleans()), draw(st.integers(0, 2**16))


def grade_feed_forward(FeedForward) -> None:
    """Grade a student's ``FeedForward(d_model, d_ff=None, activation="relu", dropout=0.0, bias=True)``."""
    g = Grader("FeedForward")

    def build(name, C, d_ff=None, activation=None, bias=True, **kwargs):
        what = f"FeedForward({_args(C, d_ff, activation=activation, bias=None if bias else False, **kwargs)})"
        if d_ff is None:
            what = what.replace(", None", "")
        extra = ({} if activation is None else {"activation": activation}) | ({} if bias else {"bias": False})
        m = call_student(g, what, FeedForward, C, d_ff, **extra, **kwargs).double().eval()
        r = ref.FeedForward(C, d_ff, activation or "relu", bias=bias).double().eval()
        weights = random_weights(r, name)
        _load(g, m, weights, what, 4 * C if d_ff is None else None, bias)
        r.load_state_dict(weights)
        return m, r, what

    with g.check("linear1 (C -> d_ff) and linear2 (d_ff -> C) are nn.Linear; d_ff defaults to 4 * d_model"):
        for C, d_ff in ((16, None), (6, 10), (8, 1)):
            what = f"FeedForward({C}{'' if d_ff is None else f', {d_ff}'})"
            m = call_student(g, what, FeedForward, C, d_ff)
            hidden = 4 * C if d_ff is None else d_ff
            for name, shape in (("linear1", (C, hidden)), ("linear2", (hidden, C))):
                layer = getattr(m, name, None)
                g.expect(is_a(layer, LINEAR), f"{what} needs an nn.Linear called {name}")
                got = (layer.in_features, layer.out_features)
                g.expect(
                    got == shape,
                    f"{what}.{name} should map {shape[0]} to {shape[1]} features, got "
                    f"{got[0]} -> {got[1]}" + (": d_ff defaults to 4 * d_model" if d_ff is None else ""),
                )

    def values(case, activation):
        lead, C, d_ff, bias, seed = case
        m, r, what = build(
            f"ff.{activation}.{seed}",
            C,
            d_ff,
            activation=activation if activation != "relu" else None,
            bias=bias,
        )
        x = tensor(seed, *lead, C)
        what = f"{what} on x {(*lead, C)}"
        out = call_student(g, what, m, x)
        act = F.relu if activation == "relu" else F.gelu
        with torch.no_grad():
            expected = _ff_expected(r, x, act)
            if not close(out, expected):
                h = r.linear1(x)
                first_match(
                    g,
                    out,
                    [
                        (wrong, f"{what}: {hint}")
                        for wrong, hint in (
                            (
                                act(r.linear2(h)),
                                "the activation goes between the two linear layers: linear2(act(linear1(x))), "
                                "not act(linear2(linear1(x)))",
                            ),
                            (r.linear2(h), "no nonlinearity was applied: use linear2(act(linear1(x)))"),
                            (
                                r.linear2(F.gelu(h, approximate="tanh")),
                                (
                                    "you used the tanh approximation of GELU: use the exact GELU x * Phi(x), "
                                    "nn.GELU() or F.gelu(h)"
                                ),
                            ),
                            (
                                r.linear2(F.relu(h)) if activation == "gelu" else r.linear2(F.gelu(h)),
                                f"activation={activation!r} was ignored: choose ReLU or GELU from the argument",
                            ),
                        )
                    ],
                    expected,
                )
                expect_close(g, what, out, expected)

    with g.check(
        "activation='relu' (the default): linear2(relu(linear1(x))), any leading dims, bias=True or False"
    ):
        for_all(
            "ff.relu",
            _ff_case(),
            lambda c: values(c, "relu"),
            max_examples=10,
            first=((2, 3), 4, None, True, 0),
        )

    with g.check("activation='gelu': the exact GELU x * Phi(x), not the tanh approximation"):
        for_all(
            "ff.gelu", _ff_case(), lambda c: values(c, "gelu"), max_examples=10, first=((2, 3), 4, 7, True, 1)
        )

    with g.check("bias=False: neither linear layer has a bias"):
        m = call_student(g, "FeedForward(8, 12, bias=False)", FeedForward, 8, 12, bias=False)
        keys = set(m.state_dict())
        g.expect(
            keys == {"linear1.weight", "linear2.weight"},
            "FeedForward(8, 12, bias=False) should hold only linear1.weight and linear2.weight, "
            f"got {sorted(keys)}",
        )

    with g.check("an activation other than 'relu' or 'gelu' raises a ValueError"):
        for name in ("tanh", "swish", ""):
            expect_value_error(
                g,
                lambda: FeedForward(8, activation=name),
                f"FeedForward(8, activation={name!r})",
                "name the activation that came and the two allowed",
            )

    with g.check(
        "dropout (nn.Dropout named dropout, default p = 0.0) acts on act(linear1(x)), only in training mode"
    ):
        x = rand("ff.dropout.x", 2, 3, 6)
        m = call_student(g, "FeedForward(6, 10)", FeedForward, 6, 10)
        d = getattr(m, "dropout", None)
        g.expect(is_a(d, DROPOUT), f"FeedForward needs an nn.Dropout named dropout, got {describe(d)}")
        g.expect(d.p == 0.0, f"FeedForward(6, 10).dropout.p is {d.p}: dropout defaults to 0.0")
        d = getattr(
            call_student(g, "FeedForward(6, 10, dropout=0.3)", FeedForward, 6, 10, dropout=0.3),
            "dropout",
            None,
        )
        g.expect(
            is_a(d, DROPOUT) and d.p == 0.3,
            f"FeedForward(6, 10, dropout=0.3).dropout should be nn.Dropout(0.3), got {describe(d)} "
            f"with p={getattr(d, 'p', None)}",
        )
        for activation in ("relu", "gelu"):
            m, r, what = build(f"ff.dropout.{activation}", 6, 10, activation=activation, dropout=0.3)
            act = F.relu if activation == "relu" else F.gelu
            set_attr(m.dropout, "p", 1.0)
            m.train()
            with torch.no_grad():
                expected = r.linear2(torch.zeros(2, 3, 10, dtype=F64))  # every hidden activation dropped
                expect_close(
                    g,
                    f"{what} in training mode with its dropout's p set to 1",
                    call_student(g, what, m, x),
                    expected,
                    advice=": dropout must act on the hidden activations, linear2(dropout(act(linear1(x)))), "
                    "so dropping all of them leaves linear2's bias",
                )
                m.eval()
                expect_close(
                    g,
                    f"{what} in eval mode with its dropout's p set to 1",
                    call_student(g, what, m, x),
                    _ff_expected(r, x, act),
                    advice=": in eval mode dropout must do nothing (use nn.Dropout, which knows the mode)",
                )
                # Where exactly: swap the dropout for a fixed linear map and see where it acts.
                W = rand(f"ff.dropout.{activation}.W", 10, 10)
                stand_in = student_side("nn", nn).Linear(10, 10, bias=False)
                stand_in.double()
                stand_in.load_state_dict({"weight": W})
                set_attr(m, "dropout", stand_in)
                expected = r.linear2(F.linear(act(r.linear1(x)), W))
                expect_close(
                    g,
                    f"{what} with self.dropout replaced by a fixed linear map M",
                    call_student(g, what, m, x),
                    expected,
                    advice=": self.dropout must be applied to the activations after act, "
                    "linear2(self.dropout(act(linear1(x))))",
                )

    with g.check("leaves x unchanged; gradients with respect to x match the reference"):
        m, r, what = build("ff.grad", 6, 10, activation="gelu")
        x = rand("ff.grad.x", 2, 3, 6)
        up = rand("ff.grad.up", 2, 3, 6)
        p = probe(m, x.clone())
        g.expect(is_tensor(p.args[0]) and torch.equal(p.args[0], x), f"{what} modified x in place")
        p = probe(m, x.clone().requires_grad_(), backward=(None, up))
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            f"{what}: the output does not depend on x through autograd: avoid .detach(), .item() or .numpy()",
        )
        xr = x.clone().requires_grad_()
        (_ff_expected(r, xr, F.gelu) * up).sum().backward()
        expect_close(
            g,
            f"{what} on x (2, 3, 6), the gradient with respect to x",
            p.grads[0] if p.grads else None,
            xr.grad,
        )

    g.finish()


# --------------------------------------------------------------------------- shared by the layers


_WIDTHS = [(4, 1), (6, 2), (8, 2), (12, 3), (8, 4)]


@st.composite
def _layer_case(draw, cross=False):
    """Sizes, an activation and a seed: ``(C, H, d_ff, B, T, S, activation, seed)``."""
    C, H = draw(st.sampled_from(_WIDTHS))
    d_ff = draw(st.sampled_from([None, 5, 16]))
    B, T = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    S = draw(st.integers(1, 7)) if cross else T
    return C, H, d_ff, B, T, S, draw(st.sampled_from(["relu", "gelu"])), draw(st.integers(0, 999))


def _build_layer(
    g: Grader, cls, ref_cls, label: str, name: str, C, H, d_ff=None, cache: dict | None = None, **kwargs
):
    """The student's layer (with exactly the arguments given, so defaults are exercised) and the reference,
    both float64 in eval mode with the same random weights. With ``cache`` (a dict that lives as long as one
    check), a layer of the same configuration is built once and reused: the examples of a property-based
    check then cost a forward pass each, which keeps shrinking a failure quick."""
    if cache is not None:
        key = (label, C, H, d_ff, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = _build_layer(
                g,
                cls,
                ref_cls,
                label,
                f"{name}.{C}.{H}.{d_ff}.{sorted(kwargs.items())}",
                C,
                H,
                d_ff,
                **kwargs,
            )
        return cache[key]
    what = f"{label}({_args(C, H, d_ff, **kwargs)})".replace(", None", "")
    m = call_student(g, what, cls, C, H, *(() if d_ff is None else (d_ff,)), **kwargs)
    m = m.double().eval()
    opts = {"dropout": 0.0, **{k: v for k, v in kwargs.items() if k != "dropout"}}
    r = ref_cls(C, H, d_ff, **opts).double().eval()
    weights = random_weights(r, name)
    _load(g, m, weights, what, 4 * C if d_ff is None else None, kwargs.get("bias", True))
    r.load_state_dict(weights)
    return m, r, what


def _names_check(g: Grader, cls, ref_cls, label: str) -> None:
    """Parameter names and shapes like the reference's, for several arguments: d_ff and n_heads reach the
    sub-modules."""
    for C, H, d_ff, kwargs in ((16, 4, 24, {}), (12, 3, None, {}), (8, 2, 5, {"bias": False})):
        what = f"{label}({_args(C, H, d_ff, **kwargs)})".replace(", None", "")
        m = call_student(g, what, cls, C, H, *(() if d_ff is None else (d_ff,)), **kwargs)
        reference = ref_cls(C, H, d_ff, **kwargs)
        shapes = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
        sd = m.state_dict()
        got = set(sd) if isinstance(sd, dict) else set()
        g.expect(
            got == set(shapes),
            names_hint(what, got, set(shapes), kwargs.get("bias", True)),
        )
        for key, shape in shapes.items():
            g.expect(
                tuple(sd[key].shape) == shape,
                f"{what}: {key} has shape {tuple(sd[key].shape)}, expected {shape}"
                + (": d_ff defaults to 4 * d_model" if d_ff is None and 4 * C in shape else ""),
            )
        for attn in [a for a in ("self_attn", "cross_attn") if hasattr(reference, a)]:
            heads = _get(m, f"{attn}.n_heads")
            g.expect(heads == H, f"{what}.{attn} has {heads} heads: pass n_heads on to MultiHeadAttention")


def _dropout_values_check(
    g: Grader, cls, label: str, places: tuple[str, ...], attentions: tuple[str, ...]
) -> None:
    """The dropout argument (default 0.1) reaches every named nn.Dropout, ff.dropout and the attentions."""
    for kwargs, p in (({}, 0.1), ({"dropout": 0.3}, 0.3), ({"dropout": 0.0}, 0.0)):
        what = f"{label}({_args(8, 2, **kwargs)})"
        m = call_student(g, what, cls, 8, 2, **kwargs)
        for place in places + ("ff.dropout",):
            d = _get(m, place)
            g.expect(is_a(d, DROPOUT), f"{what} needs an nn.Dropout named {place}, got {describe(d)}")
            g.expect(
                d.p == p,
                f"{what}.{place}.p is {d.p}, expected {p}: pass dropout on to every dropout "
                "(its default is 0.1)",
            )
        for attn in attentions:
            got = _get(m, f"{attn}.dropout")
            g.expect(
                got == p,
                f"{what}.{attn} drops attention weights with p = {got}, expected {p}: "
                f"MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)",
            )


def _only(g: Grader, module, on: str, places: tuple[str, ...], attentions: tuple[str, ...]) -> None:
    """Every dropout of ``module`` off (p = 0) but ``on`` (p = 1): that one in isolation, deterministically."""
    for place in places + ("ff.dropout",):
        d = _get(module, place)
        g.expect(is_a(d, DROPOUT), f"the layer needs an nn.Dropout named {place}, got {describe(d)}")
        set_attr(d, "p", 1.0 if place == on else 0.0)
    for attn in attentions:
        set_attr(_get(module, attn), "dropout", 0.0)


def _masks(seed: int, B: int, H: int, T: int, S: int, kind: str, shape: str) -> torch.Tensor:
    """A mask broadcastable to (B, H, T, S): boolean (True = may attend, key 0 always) or additive floats."""
    full = {"TS": (T, S), "B1TS": (B, 1, T, S), "BHTS": (B, H, T, S)}[shape]
    g = torch.Generator().manual_seed(int(seed))
    if kind == "bool":
        m = torch.rand(*full, generator=g) < 0.6
        m[..., 0] = True
        return m
    return torch.randn(*full, generator=g, dtype=F64) * 2.0


# --------------------------------------------------------------------------- EncoderLayer


_ENC_DROPOUTS = ("dropout1", "dropout2")


def _encoder_mistakes(r: ref.EncoderLayer, x, norm_first, **masks):
    """Outputs of common wrong encoder layers built from the reference's own pieces."""

    def a(h):
        return r.self_attn(h, **masks)[0]

    n1, n2, f = r.norm1, r.norm2, r.ff
    out = []
    with torch.no_grad():
        r.norm_first = not norm_first
        out.append(
            (
                r(x, **masks),
                "pre-norm and post-norm are swapped: norm_first=False (the default) is post-norm, "
                "x = norm1(x + self_attn(x)); norm_first=True is pre-norm, "
                "x = x + self_attn(norm1(x))",
            )
        )
        r.norm_first = norm_first
        if norm_first:
            h = a(n1(x))
            out.append(
                (
                    h + f(n2(h)),
                    "the residual connection around self-attention is missing: x = x + self_attn(norm1(x))",
                )
            )
            h = x + a(n1(x))
            out.append(
                (f(n2(h)), "the residual connection around the feed-forward is missing: x = x + ff(norm2(x))")
            )
            h = n1(x)
            h = h + a(h)
            h = n2(h)
            out.append(
                (
                    h + f(h),
                    "pre-norm normalises only the sub-layer's input, x = x + self_attn(norm1(x)): "
                    "do not replace x by norm1(x), the residual stream itself stays un-normalised",
                )
            )
        else:
            h = n1(a(x))
            out.append(
                (
                    n2(h + f(h)),
                    "the residual connection around self-attention is missing: x = norm1(x + self_attn(x))",
                )
            )
            h = n1(x + a(x))
            out.append(
                (n2(f(h)), "the residual connection around the feed-forward is missing: x = norm2(x + ff(x))")
            )
        if masks.get("key_padding_mask") is not None:
            flipped = {**masks, "key_padding_mask": ~masks["key_padding_mask"]}
            out.append(
                (r(x, **flipped), "key_padding_mask is inverted: in this course True marks real tokens")
            )
        for key in masks:
            out.append(
                (
                    r(x, **{k: v for k, v in masks.items() if k != key}),
                    f"{key} was not passed on: self_attn(h, mask=mask, key_padding_mask=key_padding_mask, "
                    "is_causal=is_causal)",
                )
            )
    return out


def _encoder_case(
    g: Grader, EncoderLayer, case, name: str, norm_first: bool | None, cache: dict, **masks
) -> None:
    C, H, d_ff, B, T, _, activation, seed = case
    kwargs = {"activation": None if activation == "relu" else activation, "norm_first": norm_first}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    m, r, what = _build_layer(
        g, EncoderLayer, ref.EncoderLayer, "EncoderLayer", name, C, H, d_ff, cache, **kwargs
    )
    x = tensor(seed, B, T, C)
    shown = ", ".join(f"{k} {describe(v) if torch.is_tensor(v) else v}" for k, v in masks.items())
    what = f"{what} on x ({B}, {T}, {C})" + (f" with {shown}" if shown else "")
    out = call_student(g, what, m, x, **masks)
    with torch.no_grad():
        expected = r(x, **masks)
    if not close(out, expected):
        g.expect(
            is_tensor(out) and out.shape == x.shape,
            f"{what}: expected a ({B}, {T}, {C}) tensor, got {describe(out)}",
        )
        if cache.get("diagnose"):
            first_match(
                g,
                out,
                [(w, f"{what}: {h}") for w, h in _encoder_mistakes(r, x, bool(norm_first), **masks)],
                expected,
            )
        expect_close(g, what, out, expected)


def grade_encoder_layer(EncoderLayer) -> None:
    """Grade a student's ``EncoderLayer(d_model, n_heads, d_ff=None, dropout=0.1, activation="relu",
    norm_first=False, eps=1e-5, bias=True)``."""
    g = Grader("EncoderLayer")

    with g.check(
        "submodules self_attn, ff, norm1, norm2 with the reference's parameter names and shapes; "
        "d_ff (default 4 * d_model) and n_heads reach them"
    ):
        _names_check(g, EncoderLayer, ref.EncoderLayer, "EncoderLayer")

    post, pre = (8, 2, None, 2, 3, 3, "relu", 0), (12, 3, 16, 3, 4, 4, "gelu", 1)
    with g.check(
        "post-norm by default (norm_first=False): x = norm1(x + self_attn(x)); x = norm2(x + ff(x)), "
        "relu or gelu, dropout off in eval mode"
    ):
        cache = {}
        _for_all_then_diagnose(
            "enc.post",
            _layer_case(),
            lambda c: _encoder_case(g, EncoderLayer, c, "enc.post", None, cache),
            cache,
            fixed=[post, pre],
            max_examples=8,
        )

    with g.check("pre-norm (norm_first=True): x = x + self_attn(norm1(x)); x = x + ff(norm2(x))"):
        cache = {}
        _for_all_then_diagnose(
            "enc.pre",
            _layer_case(),
            lambda c: _encoder_case(g, EncoderLayer, c, "enc.pre", True, cache),
            cache,
            fixed=[post, pre],
            max_examples=8,
        )

    def mask_case(c):
        case, kind, shape, norm_first = c
        C, H, d_ff, B, T, _, activation, seed = case
        _encoder_case(
            g, EncoderLayer, case, "enc.mask", norm_first, cache, mask=_masks(seed, B, H, T, T, kind, shape)
        )

    kinds = st.tuples(
        _layer_case(),
        st.sampled_from(["bool", "float"]),
        st.sampled_from(["TS", "B1TS", "BHTS"]),
        st.sampled_from([None, True]),
    )
    with g.check(
        "mask (boolean, True = may attend, or additive floats), broadcastable to (B, H, T, T), "
        "reaches self-attention"
    ):
        cache = {}
        _for_all_then_diagnose(
            "enc.mask",
            kinds,
            mask_case,
            cache,
            max_examples=8,
            fixed=[(post, "bool", "TS", None), (pre, "float", "BHTS", True)],
        )

    def padding_case(c):
        case, norm_first, lengths = c
        C, H, d_ff, B, T, _, activation, seed = case
        lengths = [min(max(n, 1), T) for n in lengths[:B]] + [T] * (B - len(lengths))
        keep = padding_mask(lengths, S=T)
        _encoder_case(g, EncoderLayer, case, "enc.pad", norm_first, cache, key_padding_mask=keep)

    with g.check("key_padding_mask (B, T), True at real tokens, reaches self-attention"):
        cache = {}
        _for_all_then_diagnose(
            "enc.pad",
            st.tuples(_layer_case(), st.sampled_from([None, True]), st.lists(st.integers(1, 6), max_size=3)),
            padding_case,
            cache,
            max_examples=6,
            fixed=[((8, 2, None, 3, 5, 5, "relu", 0), None, [4, 3, 2]), (pre, True, [2, 4, 1])],
        )

    def causal_case(c):
        case, norm_first, kind, padded = c
        C, H, d_ff, B, T, _, activation, seed = case
        masks = {"is_causal": True}
        if kind is not None:
            masks["mask"] = _masks(seed, B, H, T, T, kind, "TS")
        if padded:
            masks["key_padding_mask"] = padding_mask([max(1, T - b) for b in range(B)], S=T)
        _encoder_case(g, EncoderLayer, case, "enc.causal", norm_first, cache, **masks)

    with g.check(
        "is_causal=True: each position attends only to itself and earlier positions, together with "
        "mask and key_padding_mask when they are given"
    ):
        cache = {}
        _for_all_then_diagnose(
            "enc.causal",
            st.tuples(
                _layer_case(),
                st.sampled_from([None, True]),
                st.sampled_from([None, "bool", "float"]),
                st.booleans(),
            ),
            causal_case,
            cache,
            max_examples=6,
            fixed=[(post, None, None, False), (pre, True, "bool", True)],
        )

    with g.check("eps reaches both norms and bias=False every projection, the feed-forward and the norms"):
        for kwargs in ({"eps": 0.5}, {"bias": False}, {"eps": 2.0, "bias": False, "norm_first": True}):
            m, r, what = _build_layer(
                g, EncoderLayer, ref.EncoderLayer, "EncoderLayer", "enc.opts", 8, 2, 12, **kwargs
            )
            x = rand("enc.opts.x", 2, 4, 8, scale=0.5)
            with torch.no_grad():
                expect_close(
                    g,
                    f"{what} on x (2, 4, 8)",
                    call_student(g, what, m, x),
                    r(x),
                    advice=": pass eps and bias on to LayerNorm(d_model, eps, bias), and bias to "
                    "MultiHeadAttention and FeedForward",
                )

    with g.check(
        "dropout (default 0.1) reaches dropout1, dropout2, ff.dropout and self_attn (its attention weights)"
    ):
        _dropout_values_check(g, EncoderLayer, "EncoderLayer", _ENC_DROPOUTS, ("self_attn",))

    with g.check(
        "dropout1 acts on the attention output and dropout2 on the feed-forward output, before each "
        "residual add (each alone with p = 1, in training mode)"
    ):
        for norm_first in (False, True):
            for on in _ENC_DROPOUTS:
                m, r, what = _build_layer(
                    g,
                    EncoderLayer,
                    ref.EncoderLayer,
                    "EncoderLayer",
                    f"enc.drop.{on}",
                    8,
                    2,
                    12,
                    dropout=0.3,
                    norm_first=norm_first,
                )
                _only(g, m, on, _ENC_DROPOUTS, ("self_attn",))
                _only(g, r, on, _ENC_DROPOUTS, ("self_attn",))
                m.train()
                r.train()
                x = rand(f"enc.drop.{on}.x", 2, 4, 8)
                with torch.no_grad():
                    expect_close(
                        g,
                        f"{what} in training mode with {on}.p = 1 and every other dropout off",
                        call_student(g, what, m, x),
                        r(x),
                        advice=f": {on} must drop the {'attention' if on == 'dropout1' else 'feed-forward'} "
                        "sub-layer's output just before its residual add, and nothing else",
                    )

    with g.check("leaves x unchanged; gradients with respect to x match the reference"):
        m, r, what = _build_layer(
            g,
            EncoderLayer,
            ref.EncoderLayer,
            "EncoderLayer",
            "enc.grad",
            8,
            2,
            12,
            activation="gelu",
            norm_first=True,
        )
        x = rand("enc.grad.x", 2, 4, 8)
        up = rand("enc.grad.up", 2, 4, 8)
        p = probe(m, x.clone())
        g.expect(is_tensor(p.args[0]) and torch.equal(p.args[0], x), f"{what} modified x in place")
        p = probe(m, x.clone().requires_grad_(), backward=(None, up))
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            f"{what}: the output does not depend on x through autograd: avoid .detach(), .item() or .numpy()",
        )
        xr = x.clone().requires_grad_()
        (r(xr) * up).sum().backward()
        expect_close(
            g,
            f"{what} on x (2, 4, 8), the gradient with respect to x",
            p.grads[0] if p.grads else None,
            xr.grad,
        )

    g.finish()


# --------------------------------------------------------------------------- DecoderLayer


_DEC_DROPOUTS = ("dropout1", "dropout2", "dropout3")


def _decoder_mistakes(r: ref.DecoderLayer, x, memory, norm_first, **masks):
    out = []
    with torch.no_grad():
        if masks.get("is_causal", True):
            out.append(
                (
                    r(x, memory, **{**masks, "is_causal": False}),
                    "self-attention must be causal by default: pass is_causal=is_causal (default True) to "
                    "self_attn",
                )
            )
        r.norm_first = not norm_first
        out.append(
            (
                r(x, memory, **masks),
                "pre-norm and post-norm are swapped: norm_first=False (the default) is post-norm, "
                "x = norm(x + sublayer(x)); norm_first=True is pre-norm, x = x + sublayer(norm(x))",
            )
        )
        r.norm_first = norm_first
        causal = masks.get("is_causal", True)

        def sa(h):
            return r.self_attn(
                h, mask=masks.get("mask"), key_padding_mask=masks.get("key_padding_mask"), is_causal=causal
            )[0]

        def ca(h, kv):
            return r.cross_attn(
                h, kv=kv, mask=masks.get("memory_mask"), key_padding_mask=masks.get("memory_key_padding_mask")
            )[0]

        if norm_first:
            h = x + sa(r.norm1(x))
            n = r.norm2(h)
            wrong_kv = h + r.cross_attn(n, kv=n)[0]
            out.append(
                (
                    wrong_kv + r.ff(r.norm3(wrong_kv)),
                    "cross-attention must take its keys and values from memory: "
                    "self.cross_attn(h, kv=memory, ...)",
                )
            )
            normed_memory = h + ca(n, r.norm2(memory))
            out.append(
                (
                    normed_memory + r.ff(r.norm3(normed_memory)),
                    "do not normalise memory in the decoder: only the query side, cross_attn(norm2(x), kv=memory)",
                )
            )
        else:
            h = r.norm1(x + sa(x))
            wrong_kv = r.norm2(h + r.cross_attn(h, kv=h)[0])
            out.append(
                (
                    r.norm3(wrong_kv + r.ff(wrong_kv)),
                    "cross-attention must take its keys and values from memory: "
                    "self.cross_attn(h, kv=memory, ...)",
                )
            )
        if masks.get("memory_key_padding_mask") is not None:
            flipped = {**masks, "memory_key_padding_mask": ~masks["memory_key_padding_mask"]}
            out.append(
                (
                    r(x, memory, **flipped),
                    "memory_key_padding_mask is inverted: in this course True marks real tokens",
                )
            )
        if masks.get("key_padding_mask") is not None:
            flipped = {**masks, "key_padding_mask": ~masks["key_padding_mask"]}
            out.append(
                (
                    r(x, memory, **flipped),
                    "key_padding_mask is inverted: in this course True marks real tokens",
                )
            )
        for key, hint in (
            ("mask", "mask was not passed to self_attn(..., mask=mask)"),
            ("key_padding_mask", "key_padding_mask was not passed to self_attn"),
            ("memory_mask", "memory_mask was not passed to cross_attn(..., mask=memory_mask)"),
            (
                "memory_key_padding_mask",
                "memory_key_padding_mask was not passed to cross_attn as key_padding_mask",
            ),
        ):
            if masks.get(key) is not None:
                out.append((r(x, memory, **{k: v for k, v in masks.items() if k != key}), hint))
        if (
            masks.get("mask") is not None
            and masks.get("memory_mask") is not None
            and masks["mask"].shape[-1] == masks["memory_mask"].shape[-1]
        ):
            swapped = {**masks, "mask": masks["memory_mask"], "memory_mask": masks["mask"]}
            out.append(
                (
                    r(x, memory, **swapped),
                    "mask and memory_mask are swapped: mask goes to self_attn, memory_mask to cross_attn",
                )
            )
    return out


def _decoder_case(
    g: Grader, DecoderLayer, case, name: str, norm_first: bool | None, cache: dict, **masks
) -> None:
    C, H, d_ff, B, T, S, activation, seed = case
    kwargs = {"activation": None if activation == "relu" else activation, "norm_first": norm_first}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    m, r, what = _build_layer(
        g, DecoderLayer, ref.DecoderLayer, "DecoderLayer", name, C, H, d_ff, cache, **kwargs
    )
    x, memory = tensor(seed, B, T, C), tensor(seed + 1, B, S, C)
    shown = ", ".join(f"{k} {describe(v) if torch.is_tensor(v) else v}" for k, v in masks.items())
    what = f"{what} on x ({B}, {T}, {C}) and memory ({B}, {S}, {C})" + (f" with {shown}" if shown else "")
    out = call_student(g, what, m, x, memory, **masks)
    with torch.no_grad():
        expected = r(x, memory, **masks)
    if not close(out, expected):
        g.expect(
            is_tensor(out) and out.shape == x.shape,
            f"{what}: expected a ({B}, {T}, {C}) tensor, got {describe(out)}",
        )
        if cache.get("diagnose"):
            first_match(
                g,
                out,
                [(w, f"{what}: {h}") for w, h in _decoder_mistakes(r, x, memory, bool(norm_first), **masks)],
                expected,
            )
        expect_close(g, what, out, expected)


def grade_decoder_layer(DecoderLayer) -> None:
    """Grade a student's ``DecoderLayer(d_model, n_heads, d_ff=None, dropout=0.1, activation="relu",
    norm_first=False, eps=1e-5, bias=True)``."""
    g = Grader("DecoderLayer")

    with g.check(
        "submodules self_attn, cross_attn, ff, norm1-3 with the reference's parameter names and shapes; "
        "d_ff (default 4 * d_model) and n_heads reach them"
    ):
        _names_check(g, DecoderLayer, ref.DecoderLayer, "DecoderLayer")

    post, pre = (8, 2, None, 2, 3, 4, "relu", 0), (12, 3, 16, 3, 4, 2, "gelu", 1)
    with g.check(
        "post-norm by default: masked (causal by default) self-attention, cross-attention to memory "
        "(S may differ from T), feed-forward, each x = norm_i(x + sublayer_i(x))"
    ):
        cache = {}
        _for_all_then_diagnose(
            "dec.post",
            _layer_case(cross=True),
            lambda c: _decoder_case(g, DecoderLayer, c, "dec.post", None, cache),
            cache,
            fixed=[post, pre],
            max_examples=8,
        )

    with g.check("pre-norm (norm_first=True): x = x + sublayer_i(norm_i(x)); memory is used as it comes"):
        cache = {}
        _for_all_then_diagnose(
            "dec.pre",
            _layer_case(cross=True),
            lambda c: _decoder_case(g, DecoderLayer, c, "dec.pre", True, cache),
            cache,
            fixed=[post, pre],
            max_examples=8,
        )

    with g.check("is_causal=False: self-attention sees every position of x"):
        cache = {}
        _for_all_then_diagnose(
            "dec.noncausal",
            st.tuples(_layer_case(cross=True), st.sampled_from([None, True])),
            lambda c: _decoder_case(g, DecoderLayer, c[0], "dec.noncausal", c[1], cache, is_causal=False),
            cache,
            max_examples=5,
            fixed=[(post, None), (pre, True)],
        )

    def self_masks(c):
        case, kind, shape, norm_first, lengths = c
        C, H, d_ff, B, T, S, activation, seed = case
        lengths = [min(max(n, 1), T) for n in lengths[:B]] + [T] * (B - len(lengths))
        masks = {
            "mask": _masks(seed, B, H, T, T, kind, shape),
            "key_padding_mask": padding_mask(lengths, S=T),
        }
        _decoder_case(g, DecoderLayer, case, "dec.selfmask", norm_first, cache, **masks)

    shapes = st.sampled_from(["TS", "B1TS", "BHTS"])
    with g.check(
        "mask (boolean or additive, broadcastable to (B, H, T, T)) and key_padding_mask (B, T) "
        "reach self-attention, on top of the causal mask"
    ):
        cache = {}
        _for_all_then_diagnose(
            "dec.selfmask",
            st.tuples(
                _layer_case(cross=True),
                st.sampled_from(["bool", "float"]),
                shapes,
                st.sampled_from([None, True]),
                st.lists(st.integers(1, 6), max_size=3),
            ),
            self_masks,
            cache,
            max_examples=6,
            fixed=[
                ((8, 2, None, 3, 5, 4, "relu", 0), "bool", "TS", None, [5, 4, 3]),
                (pre, "float", "BHTS", True, [4, 2, 3]),
            ],
        )

    def memory_masks(c):
        case, kind, shape, norm_first, lengths = c
        C, H, d_ff, B, T, S, activation, seed = case
        lengths = [min(max(n, 1), S) for n in lengths[:B]] + [S] * (B - len(lengths))
        masks = {
            "memory_mask": _masks(seed + 2, B, H, T, S, kind, shape),
            "memory_key_padding_mask": padding_mask(lengths, S=S),
        }
        _decoder_case(g, DecoderLayer, case, "dec.memmask", norm_first, cache, **masks)

    with g.check(
        "memory_mask (boolean or additive, broadcastable to (B, H, T, S)) and memory_key_padding_mask "
        "(B, S), True at real tokens, reach cross-attention"
    ):
        cache = {}
        _for_all_then_diagnose(
            "dec.memmask",
            st.tuples(
                _layer_case(cross=True),
                st.sampled_from(["bool", "float"]),
                shapes,
                st.sampled_from([None, True]),
                st.lists(st.integers(1, 7), max_size=3),
            ),
            memory_masks,
            cache,
            max_examples=6,
            fixed=[
                ((8, 2, None, 3, 4, 6, "relu", 0), "bool", "TS", None, [5, 3, 1]),
                (pre, "float", "B1TS", True, [2, 1, 2]),
            ],
        )

    with g.check(
        "eps reaches the three norms and bias=False every projection, the feed-forward and the norms"
    ):
        for kwargs in ({"eps": 0.5}, {"bias": False}, {"eps": 2.0, "bias": False, "norm_first": True}):
            m, r, what = _build_layer(
                g, DecoderLayer, ref.DecoderLayer, "DecoderLayer", "dec.opts", 8, 2, 12, **kwargs
            )
            x, memory = rand("dec.opts.x", 2, 4, 8, scale=0.5), rand("dec.opts.mem", 2, 5, 8, scale=0.5)
            with torch.no_grad():
                expect_close(
                    g,
                    f"{what} on x (2, 4, 8) and memory (2, 5, 8)",
                    call_student(g, what, m, x, memory),
                    r(x, memory),
                    advice=": pass eps and bias on to LayerNorm(d_model, eps, bias), and bias to "
                    "both MultiHeadAttention and FeedForward",
                )

    with g.check("dropout (default 0.1) reaches dropout1-3, ff.dropout, self_attn and cross_attn"):
        _dropout_values_check(g, DecoderLayer, "DecoderLayer", _DEC_DROPOUTS, ("self_attn", "cross_attn"))

    with g.check(
        "dropout1, dropout2 and dropout3 act on the outputs of self-attention, cross-attention and the "
        "feed-forward, before each residual add (each alone with p = 1, in training mode)"
    ):
        subs = {"dropout1": "self-attention", "dropout2": "cross-attention", "dropout3": "feed-forward"}
        for norm_first in (False, True):
            for on in _DEC_DROPOUTS:
                m, r, what = _build_layer(
                    g,
                    DecoderLayer,
                    ref.DecoderLayer,
                    "DecoderLayer",
                    f"dec.drop.{on}",
                    8,
                    2,
                    12,
                    dropout=0.3,
                    norm_first=norm_first,
                )
                _only(g, m, on, _DEC_DROPOUTS, ("self_attn", "cross_attn"))
                _only(g, r, on, _DEC_DROPOUTS, ("self_attn", "cross_attn"))
                m.train()
                r.train()
                x, memory = rand(f"dec.drop.{on}.x", 2, 4, 8), rand(f"dec.drop.{on}.mem", 2, 3, 8)
                with torch.no_grad():
                    expect_close(
                        g,
                        f"{what} in training mode with {on}.p = 1 and every other dropout off",
                        call_student(g, what, m, x, memory),
                        r(x, memory),
                        advice=f": {on} must drop the {subs[on]} sub-layer's output just before its residual "
                        "add, and nothing else",
                    )

    with g.check("leaves x and memory unchanged; gradients reach x and memory as in the reference"):
        m, r, what = _build_layer(
            g,
            DecoderLayer,
            ref.DecoderLayer,
            "DecoderLayer",
            "dec.grad",
            8,
            2,
            12,
            activation="gelu",
            norm_first=True,
        )
        x, memory = rand("dec.grad.x", 2, 4, 8), rand("dec.grad.mem", 2, 5, 8)
        up = rand("dec.grad.up", 2, 4, 8)
        p = probe(m, x.clone(), memory.clone())
        g.expect(
            all(is_tensor(a) for a in p.args[:2])
            and torch.equal(p.args[0], x)
            and torch.equal(p.args[1], memory),
            f"{what} modified x or memory in place",
        )
        p = probe(m, x.clone().requires_grad_(), memory.clone().requires_grad_(), backward=(None, up))
        g.expect(
            is_tensor(p.result) and p.result.requires_grad,
            f"{what}: the output does not depend on x through autograd: avoid .detach(), .item() or .numpy()",
        )
        xr, mr = x.clone().requires_grad_(), memory.clone().requires_grad_()
        (r(xr, mr) * up).sum().backward()
        for i, (arg, want) in enumerate((("x", xr.grad), ("memory", mr.grad))):
            expect_close(
                g,
                f"{what} on x (2, 4, 8) and memory (2, 5, 8), the gradient with respect to {arg}",
                p.grads[i] if p.grads else None,
                want,
            )

    g.finish()


# --------------------------------------------------------------------------- public checks


def _public_layer(g: Grader, cls, ref_cls, label: str, name: str, *args, **kwargs):
    """A student's layer and the reference with the same random weights (float64, eval mode)."""
    C, H = args[:2]
    d_ff = args[2] if len(args) > 2 else None
    return _build_layer(g, cls, ref_cls, label, name, C, H, d_ff, **kwargs)


def check_layer_norm(LayerNorm) -> None:
    """Public checks of ``LayerNorm``: one small example per graded clause."""
    g = Grader("LayerNorm (public)")
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]], dtype=F64)
    with g.check(
        "LayerNorm(4) has parameters weight (ones) and bias (zeros); LayerNorm(4, bias=False) only weight"
    ):
        params = dict(LayerNorm(4).named_parameters())
        g.expect(
            set(params) == {"weight", "bias"},
            f"LayerNorm needs exactly two nn.Parameters, weight and bias, got {sorted(params)}",
        )
        g.expect(
            close(params["weight"].detach(), torch.ones(4))
            and close(params["bias"].detach(), torch.zeros(4)),
            "weight should start as ones and bias as zeros",
        )
        params = dict(LayerNorm(4, bias=False).named_parameters())
        g.expect(
            set(params) == {"weight"},
            f"LayerNorm(4, bias=False) should have only weight, got {sorted(params)}",
        )
    with g.check(
        "LayerNorm(4) of [[1, 2, 3, 4], [2, 2, 2, 2]] (biased variance, eps inside the square root)"
    ):
        out = LayerNorm(4).double()(x)
        expected = torch.stack([(x[0] - 2.5) / math.sqrt(1.25 + 1e-5), torch.zeros(4, dtype=F64)])
        g.expect(
            not (is_tensor(out) and close(out[0], (x[0] - 2.5) / x[0].std())),
            "you used the unbiased variance (divide by C - 1): layer norm divides by C",
        )
        g.expect(
            not (is_tensor(out) and not bool(torch.isfinite(out).all())),
            "a constant row gave inf or NaN: add eps to the variance inside the square root",
        )
        expect_close(g, "LayerNorm(4) of [[1, 2, 3, 4], [2, 2, 2, 2]]", out, expected)
    with g.check("with loaded weight and bias, eps=0.5, bias=False, x of shape (2, 3, 4) or (4,)"):
        for kwargs in ({}, {"eps": 0.5}, {"bias": False}):
            m = LayerNorm(4, **kwargs).double()
            w, b = rand("public.ln.w", 4) + 1, rand("public.ln.b", 4)
            load_weights(
                g,
                m,
                {"weight": w, "bias": b} if kwargs.get("bias", True) else {"weight": w},
                f"LayerNorm({_args(4, **kwargs)})",
                kwargs.get("bias", True),
            )
            for shape in ((2, 3, 4), (4,)):
                xs = rand(f"public.ln.x{shape}", *shape)
                expect_close(
                    g,
                    f"LayerNorm(4{_args(**kwargs) and ', ' + _args(**kwargs)}) on x {shape}",
                    m(xs),
                    _ln(xs, w, b if kwargs.get("bias", True) else None, kwargs.get("eps", 1e-5)),
                )
    with g.check("float32 x = 1e4 + [1, 2, 3, 4]: float32 out, accurate (two-pass variance)"):
        xs = torch.tensor([1.0, 2.0, 3.0, 4.0]) + 1e4
        expect_close(
            g,
            "LayerNorm(4) of 1e4 + [1, 2, 3, 4] in float32",
            LayerNorm(4)(xs),
            _ln(xs.double(), None, None).float(),
            magnitude(xs),
        )
    with g.check("the same output in training and eval mode"):
        m = LayerNorm(4).double()
        expect_close(g, "LayerNorm(4) in training mode", m.train()(x), _ln(x, None, None))
    with g.check("LayerNorm(4) on x (2, 3) raises a ValueError"):
        expect_value_error(g, lambda: LayerNorm(4)(torch.zeros(2, 3)), "LayerNorm(4) on x (2, 3)")
    with g.check("x is left unchanged and gradients flow back to it"):
        p = probe(
            LayerNorm(4).double(), x.clone().requires_grad_(), backward=(None, torch.ones(2, 4, dtype=F64))
        )
        g.expect(torch.equal(p.args[0].detach(), x), "x was modified in place")
        g.expect(
            p.grads is not None and p.grads[0] is not None,
            "no gradient reached x: avoid .detach() or .item()",
        )
    g.finish()


def check_feed_forward(FeedForward) -> None:
    """Public checks of ``FeedForward``: one small example per graded clause."""
    g = Grader("FeedForward (public)")
    with g.check("FeedForward(8) has nn.Linear linear1 (8 -> 32) and linear2 (32 -> 8)"):
        ff = FeedForward(8)
        g.expect(
            is_a(ff.linear1, LINEAR) and is_a(ff.linear2, LINEAR),
            "FeedForward needs nn.Linear layers called linear1 and linear2",
        )
        g.expect(
            ff.linear1.out_features == 32, f"d_ff defaults to 4 * d_model = 32, got {ff.linear1.out_features}"
        )
    x = rand("public.ff.x", 2, 3, 8)
    for activation in ("relu", "gelu"):
        with g.check(
            f"activation={activation!r}: linear2({activation}(linear1(x))) with loaded weights, x (2, 3, 8)"
        ):
            m = FeedForward(8, 16, activation).double().eval()
            r = ref.FeedForward(8, 16, activation).double().eval()
            weights = random_weights(r, f"public.ff.{activation}")
            load_weights(g, m, weights, f"FeedForward(8, 16, {activation!r})", True)
            r.load_state_dict(weights)
            with torch.no_grad():
                expect_close(g, f"FeedForward(8, 16, {activation!r})", m(x), r(x))
    with g.check("bias=False: only linear1.weight and linear2.weight"):
        keys = set(FeedForward(8, 16, bias=False).state_dict())
        expected = {"linear1.weight", "linear2.weight"}
        g.expect(keys == expected, names_hint("FeedForward(8, 16, bias=False)", keys, expected, False))
    with g.check("FeedForward(8, activation='tanh') raises a ValueError"):
        expect_value_error(g, lambda: FeedForward(8, activation="tanh"), "activation='tanh'")
    with g.check(
        "dropout: nn.Dropout named dropout (p = 0.0 by default), on act(linear1(x)), only in training mode"
    ):
        m = FeedForward(8, 16, dropout=0.25).double()
        g.expect(
            is_a(getattr(m, "dropout", None), DROPOUT) and m.dropout.p == 0.25,
            "FeedForward(8, 16, dropout=0.25) needs self.dropout = nn.Dropout(0.25)",
        )
        g.expect(FeedForward(8).dropout.p == 0.0, "dropout defaults to 0.0")
        set_attr(m.dropout, "p", 1.0)
        with torch.no_grad():
            expect_close(
                g,
                "FeedForward(8, 16) in training mode with dropout.p = 1",
                m.train()(x),
                m.linear2.bias.detach().expand(2, 3, 8),
                advice=": dropping every hidden activation must leave linear2's bias",
            )
    with g.check("x is left unchanged and gradients flow back to it"):
        p = probe(
            FeedForward(8).double(),
            x.clone().requires_grad_(),
            backward=(None, torch.ones(2, 3, 8, dtype=F64)),
        )
        g.expect(torch.equal(p.args[0].detach(), x), "x was modified in place")
        g.expect(
            p.grads is not None and p.grads[0] is not None,
            "no gradient reached x: avoid .detach() or .item()",
        )
    g.finish()


def _public_dropout(g: Grader, m, places: tuple[str, ...], attentions: tuple[str, ...], p: float) -> None:
    for place in places + ("ff.dropout",):
        d = _get(m, place)
        g.expect(is_a(d, DROPOUT) and d.p == p, f"{place} should be nn.Dropout({p}), got {describe(d)}")
    for attn in attentions:
        g.expect(_get(m, f"{attn}.dropout") == p, f"{attn} should be MultiHeadAttention(..., dropout={p})")


def check_encoder_layer(EncoderLayer) -> None:
    """Public checks of ``EncoderLayer(8, 2)``: one small example per graded clause."""
    g = Grader("EncoderLayer (public)")
    x = rand("public.enc.x", 2, 5, 8)
    with g.check("EncoderLayer(8, 2) has the reference's parameter names (self_attn, ff, norm1, norm2)"):
        for kwargs in ({}, {"bias": False}):
            sd = EncoderLayer(8, 2, **kwargs).state_dict()
            expected = set(ref.EncoderLayer(8, 2, **kwargs).state_dict())
            g.expect(
                isinstance(sd, dict) and set(sd) == expected,
                names_hint(
                    f"EncoderLayer(8, 2{', bias=False' if kwargs else ''})",
                    set(sd) if isinstance(sd, dict) else set(),
                    expected,
                    kwargs.get("bias", True),
                ),
            )
    for kwargs in ({}, {"norm_first": True}, {"activation": "gelu", "eps": 0.5, "bias": False}):
        with g.check(
            f"EncoderLayer({_args(8, 2, **kwargs)}) with loaded weights, in eval mode, matches the reference"
        ):
            m, r, what = _public_layer(
                g, EncoderLayer, ref.EncoderLayer, "EncoderLayer", "public.enc", 8, 2, **kwargs
            )
            with torch.no_grad():
                expect_close(g, what, m(x), r(x))
    with g.check("mask (T, T), key_padding_mask (B, T) with True at real tokens, and is_causal=True"):
        m, r, what = _public_layer(
            g, EncoderLayer, ref.EncoderLayer, "EncoderLayer", "public.enc.masks", 8, 2
        )
        masks = {
            "mask": ~torch.eye(5, dtype=torch.bool).roll(1, 1),
            "key_padding_mask": padding_mask([5, 3]),
            "is_causal": True,
        }
        for key, value in masks.items():
            with torch.no_grad():
                expect_close(g, f"{what} with {key}", m(x, **{key: value}), r(x, **{key: value}))
    with g.check("dropout defaults to 0.1 in dropout1, dropout2, ff.dropout and self_attn"):
        _public_dropout(g, EncoderLayer(8, 2), _ENC_DROPOUTS, ("self_attn",), 0.1)
    with g.check("dropout1 alone (p = 1, training mode) removes the attention sub-layer's output"):
        m, r, what = _public_layer(g, EncoderLayer, ref.EncoderLayer, "EncoderLayer", "public.enc.drop", 8, 2)
        _only(g, m, "dropout1", _ENC_DROPOUTS, ("self_attn",))
        with torch.no_grad():
            h = r.norm1(x)  # the attention's output dropped: x = norm1(x + 0)
            expect_close(
                g, f"{what} with dropout1.p = 1 in training mode", m.train()(x), r.norm2(h + r.ff(h))
            )
    with g.check("x is left unchanged and gradients flow back to it"):
        m, r, what = _public_layer(g, EncoderLayer, ref.EncoderLayer, "EncoderLayer", "public.enc.grad", 8, 2)
        p = probe(m, x.clone())
        g.expect(torch.equal(p.args[0], x), "x was modified in place")
        p = probe(m, x.clone().requires_grad_(), backward=(None, torch.ones(2, 5, 8, dtype=F64)))
        g.expect(
            p.grads is not None and p.grads[0] is not None,
            "no gradient reached x: avoid .detach() or .item()",
        )
    g.finish()


def check_decoder_layer(DecoderLayer) -> None:
    """Public checks of ``DecoderLayer(8, 2)``: one small example per graded clause."""
    g = Grader("DecoderLayer (public)")
    x, memory = rand("public.dec.x", 2, 4, 8), rand("public.dec.mem", 2, 6, 8)
    with g.check(
        "DecoderLayer(8, 2) has the reference's parameter names (self_attn, cross_attn, ff, norm1-3)"
    ):
        for kwargs in ({}, {"bias": False}):
            sd = DecoderLayer(8, 2, **kwargs).state_dict()
            expected = set(ref.DecoderLayer(8, 2, **kwargs).state_dict())
            g.expect(
                isinstance(sd, dict) and set(sd) == expected,
                names_hint(
                    f"DecoderLayer(8, 2{', bias=False' if kwargs else ''})",
                    set(sd) if isinstance(sd, dict) else set(),
                    expected,
                    kwargs.get("bias", True),
                ),
            )
    for kwargs in ({}, {"norm_first": True}, {"activation": "gelu", "eps": 0.5, "bias": False}):
        with g.check(
            f"DecoderLayer({_args(8, 2, **kwargs)}), x (2, 4, 8), memory (2, 6, 8): causal by default, "
            "matches the reference"
        ):
            m, r, what = _public_layer(
                g, DecoderLayer, ref.DecoderLayer, "DecoderLayer", "public.dec", 8, 2, **kwargs
            )
            with torch.no_grad():
                expect_close(g, what, m(x, memory), r(x, memory))
    with g.check("is_causal=False, mask, key_padding_mask, memory_mask and memory_key_padding_mask"):
        m, r, what = _public_layer(
            g, DecoderLayer, ref.DecoderLayer, "DecoderLayer", "public.dec.masks", 8, 2
        )
        masks = {
            "is_causal": False,
            "mask": torch.ones(4, 4, dtype=torch.bool).tril(),
            "key_padding_mask": padding_mask([4, 2]),
            "memory_mask": torch.ones(4, 6, dtype=torch.bool).triu(),
            "memory_key_padding_mask": padding_mask([6, 3]),
        }
        masks["memory_mask"][:, 0] = True
        for key, value in masks.items():
            with torch.no_grad():
                expect_close(
                    g, f"{what} with {key}", m(x, memory, **{key: value}), r(x, memory, **{key: value})
                )
    with g.check("dropout defaults to 0.1 in dropout1-3, ff.dropout, self_attn and cross_attn"):
        _public_dropout(g, DecoderLayer(8, 2), _DEC_DROPOUTS, ("self_attn", "cross_attn"), 0.1)
    with g.check("dropout2 alone (p = 1, training mode) removes the cross-attention sub-layer's output"):
        m, r, what = _public_layer(g, DecoderLayer, ref.DecoderLayer, "DecoderLayer", "public.dec.drop", 8, 2)
        _only(g, m, "dropout2", _DEC_DROPOUTS, ("self_attn", "cross_attn"))
        with torch.no_grad():
            h = r.norm1(x + r.self_attn(x, is_causal=True)[0])
            h = r.norm2(h)
            expect_close(
                g, f"{what} with dropout2.p = 1 in training mode", m.train()(x, memory), r.norm3(h + r.ff(h))
            )
    with g.check("x and memory are left unchanged and gradients flow back to both"):
        m, r, what = _public_layer(g, DecoderLayer, ref.DecoderLayer, "DecoderLayer", "public.dec.grad", 8, 2)
        p = probe(m, x.clone(), memory.clone())
        g.expect(
            torch.equal(p.args[0], x) and torch.equal(p.args[1], memory), "x or memory was modified in place"
        )
        p = probe(
            m,
            x.clone().requires_grad_(),
            memory.clone().requires_grad_(),
            backward=(None, torch.ones(2, 4, 8, dtype=F64)),
        )
        g.expect(
            p.grads is not None and all(gr is not None for gr in p.grads[:2]),
            "no gradient reached x or memory: avoid .detach() or .item()",
        )
    g.finish()


# --------------------------------------------------------------------------- predict, then check

LAYER_NORM_PARAMS = Prediction(
    name="predict_layer_norm_params",
    question="How many learnt parameters does a LayerNorm of width C = 768 (GPT-2 small's) have?",
    tests="what layer norm learns: one scale and one shift per feature, nothing per token or per batch",
    measure=lambda: ref.count_params(ref.LayerNorm(768)),
    explanation="A layer norm learns a scale (weight) and a shift (bias) for each of the C features, so 2C = "
    "{truth}. Its mean and variance are computed from each token on the fly: they are not parameters, and "
    "unlike batch norm it keeps no running statistics. (RMSNorm drops the shift: C parameters.)",
)

INPUT_GRADIENT = Prediction(
    name="predict_input_gradient",
    question="A pre-norm stack of 24 random layers of width C = 256, with no final norm: how much larger is "
    "the gradient that reaches its input than the gradient at its output?",
    tests="the residual stream's identity path: how gradients add up through a pre-norm stack",
    measure=lambda: min(
        "abcd",
        key=lambda c: abs(
            math.log(ref.input_gradient_norm(24, 256, True, torch.Generator().manual_seed(1)))
            - math.log({"a": 0.2, "b": 1.0, "c": 5.0, "d": 25.0}[c])
        ),
    ),
    explanation="The stream of a pre-norm stack is the input plus every layer's write, so its variance grows "
    "like l + 1 after l layers, and layer l's own path (through a norm that divides by sqrt(l + 1)) adds a "
    "fraction 1 / (l + 1) to the squared gradient: the product of (l + 2) / (l + 1) telescopes to N + 1 = 25, "
    "a gradient about sqrt(25) = 5 times the output's (answer {truth}). Nothing is lost on the way down: the "
    "identity path alone carries the whole output gradient. A post-norm stack gives about 1 instead: each "
    "norm divides by the size of x + W x, which undoes what the two paths add.",
    choices={"a": "1/5", "b": "1", "c": "5", "d": "25"},
)

#: the choices of SWIGLU_PARAMS: a GEGLU's parameters over those of a GELU MLP, both of hidden width 4C
_SWIGLU_CHOICES = {"a": 2 / 3, "b": 1.0, "c": 1.5, "d": 2.0}


class _GEGLU(nn.Module):
    """The gated GELU feed-forward of Shazeer (2020), ``down(gelu(gate(x)) * up(x))``, without biases."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.gate(x)) * self.up(x))


def _swiglu_params() -> str:
    """Which choice a GEGLU of hidden width 4C over a GELU MLP of width 4C is nearest to, at C = 1024, both
    built on the meta device."""
    C = 1024
    with torch.device("meta"):  # shapes only: no weights to draw
        geglu = _GEGLU(C, 4 * C)
        mlp = ref.FeedForward(C, 4 * C, activation="gelu", bias=False)
    ratio = ref.count_params(geglu) / ref.count_params(mlp)
    return min(_SWIGLU_CHOICES, key=lambda c: abs(math.log(ratio / _SWIGLU_CHOICES[c])))


SWIGLU_PARAMS = Prediction(
    name="predict_swiglu_params",
    question="A gated GELU feed-forward (GEGLU, down(gelu(gate(x)) * up(x))) kept at the MLP's hidden width "
    "d_ff = 4C, against a GELU MLP of hidden width 4C, both without biases, at C = 1024: how many parameters "
    "does the GEGLU have?",
    tests="what a gate costs: a gated feed-forward has three C x d_ff matrices where the MLP has two",
    measure=_swiglu_params,
    explanation="Answer {truth}. The gate is a third C x d_ff matrix: gate, up and down hold 3 x 1024 x 4096 = "
    "12.6 million weights where the MLP's linear1 and linear2 hold 2 x 1024 x 4096 = 8.4 million, 12 C^2 "
    "against 8 C^2, and the GELU itself has no parameters. (b) is what Shazeer (2020) and Llama get by shrinking "
    "the hidden width to 2/3 of 4C, which this layer does not do; (a) puts that 2/3 on the wrong side; (d) "
    "doubles the whole layer, but the gate doubles only the input side, and the down projection is not "
    "duplicated. A gated layer at unchanged width is therefore not a like-for-like swap: compared with an MLP, "
    "part of any gain could come from the extra weights, which is why gated feed-forwards are compared at "
    "matched parameters.",
    choices={
        "a": "about 2/3 as many",
        "b": "about as many",
        "c": "about 1.5 times as many",
        "d": "about twice as many",
    },
)

check_predict_layer_norm_params, grade_predict_layer_norm_params = LAYER_NORM_PARAMS.graders()
check_predict_input_gradient, grade_predict_input_gradient = INPUT_GRADIENT.graders()
check_predict_swiglu_params, grade_predict_swiglu_params = SWIGLU_PARAMS.graders()


# --------------------------------------------------------------------------- experiment

#: the experiment's bands, at C = 256 and 64 tokens. Over 30 seeds the reference's pre-norm measurement
#: has a mean within 1% of sqrt(N + 1) and a spread of 1.5% (N = 12) to 2% (N = 24); post-norm's
#: has a mean of 1.00 to 1.04 with a spread under 3%. A 15% band around sqrt(N + 1) and [0.85, 1.2] for
#: post-norm are five standard deviations or more, yet they separate the two placements at every depth
#: (sqrt(2) = 1.41 for one layer) and catch a missing residual, an unscaled W, or an unnormalised r.
GRAD_C, GRAD_BAND, POST_BAND = 256, 0.15, (0.85, 1.2)


def _seeded(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _grad_norm(g: Grader, input_gradient_norm, n_layers: int, norm_first: bool, seed: int, C: int = GRAD_C):
    where = f"input_gradient_norm({n_layers}, {C}, norm_first={norm_first}, generator)"
    return where, call_student(g, where, input_gradient_norm, n_layers, C, norm_first, _seeded(seed))


def _is_float(v) -> bool:
    return type(v) is float and math.isfinite(v)


def _pre_band(g: Grader, where: str, v, n_layers: int) -> None:
    expect_in_band(
        g,
        where,
        v,
        math.sqrt(n_layers + 1) * (1 - GRAD_BAND),
        math.sqrt(n_layers + 1) * (1 + GRAD_BAND),
        f"pre-norm should give about sqrt(n_layers + 1) = {math.sqrt(n_layers + 1):.3g}: x = x + norm(x) W^T keeps "
        "the identity path (the residual), W has entries randn / sqrt(C), and the result is ||d loss / d x0|| "
        "divided by ||r|| for a random r (torch.randn, not ones)",
    )


def _post_band(g: Grader, where: str, v) -> None:
    expect_in_band(
        g,
        where,
        v,
        *POST_BAND,
        "post-norm should give about 1: x = norm(x + x W^T), the norm after the residual add (without scale "
        "and shift), W with entries randn / sqrt(C), and ||d loss / d x0|| divided by ||r|| for a random r "
        "(torch.randn, not ones)",
    )


def grade_input_gradient_norm(input_gradient_norm) -> None:
    """Grade the experiment ``input_gradient_norm(n_layers, C, norm_first, generator, n_tokens=64)``: its
    measurements must fall in the stated bands (about sqrt(n_layers + 1) pre-norm, about 1 post-norm)."""
    g = Grader("input_gradient_norm")
    with g.check("returns a Python float"):
        where, v = _grad_norm(g, input_gradient_norm, 2, True, 3, C=16)
        g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")
    with g.check(f"pre-norm: about sqrt(n_layers + 1) within {GRAD_BAND:.0%} (n_layers = 1, 4, 12; C = 256)"):
        for n_layers, seed in ((1, 11), (4, 12), (12, 13)):
            where, v = _grad_norm(g, input_gradient_norm, n_layers, True, seed)
            _pre_band(g, where, v, n_layers)
    with g.check(f"post-norm: about 1, in [{POST_BAND[0]}, {POST_BAND[1]}] (n_layers = 1, 4, 12; C = 256)"):
        for n_layers, seed in ((1, 21), (4, 22), (12, 23)):
            where, v = _grad_norm(g, input_gradient_norm, n_layers, False, seed)
            _post_band(g, where, v)
    with g.check("n_tokens at other values: the ratio does not depend on how many tokens"):
        for n_tokens, seed in ((1, 41), (200, 42)):
            where = f"input_gradient_norm(4, {GRAD_C}, norm_first=True, generator, n_tokens={n_tokens})"
            v = call_student(g, where, input_gradient_norm, 4, GRAD_C, True, _seeded(seed), n_tokens=n_tokens)
            _pre_band(g, where, v, 4)
    with g.check("n_tokens defaults to 64; the smallest allowed sizes (n_layers=1, C=2, n_tokens=1) work"):
        where = "input_gradient_norm(3, 32, norm_first=False, generator, n_tokens=64)"
        a = call_student(g, where, input_gradient_norm, 3, 32, False, _seeded(51), n_tokens=64)
        _, b = _grad_norm(g, input_gradient_norm, 3, False, 51, C=32)
        g.expect(
            a == b,
            f"{where} gave {a!r} but the same call without n_tokens gave {b!r}: n_tokens defaults to 64",
        )
        where = "input_gradient_norm(1, 2, norm_first=True, generator, n_tokens=1)"
        v = call_student(g, where, input_gradient_norm, 1, 2, True, _seeded(52), n_tokens=1)
        g.expect(
            _is_float(v),
            f"{where} should return a float, got {describe(v)}: C = 2 and n_tokens = 1 are allowed",
        )
    with g.check("draws from its generator: the same seed gives the same result, another seed another"):
        _, a = _grad_norm(g, input_gradient_norm, 3, True, 31, C=32)
        _, b = _grad_norm(g, input_gradient_norm, 3, True, 31, C=32)
        _, c = _grad_norm(g, input_gradient_norm, 3, True, 32, C=32)
        g.expect(
            a == b and a != c,
            f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: draw x0, each W and "
            "r with torch.randn(..., generator=generator), not from torch's global random state",
        )
    with g.check("raises ValueError for n_layers < 1, C < 2 or n_tokens < 1"):
        for args, kwargs in (((0, 8, True), {}), ((2, 1, False), {}), ((2, 8, True), {"n_tokens": 0})):
            expect_value_error(
                g,
                lambda args=args, kwargs=kwargs: input_gradient_norm(*args, _seeded(0), **kwargs),
                f"input_gradient_norm{(*args, 'generator')}{' n_tokens=0' if kwargs else ''}",
                "say which argument is out of range",
            )
    g.finish()


def check_input_gradient_norm(input_gradient_norm) -> None:
    """Public checks of ``input_gradient_norm``: one measurement each way, against the theory."""
    g = Grader("input_gradient_norm (public)")
    with g.check("input_gradient_norm(8, 256, norm_first, generator): about 3 pre-norm, about 1 post-norm"):
        where, v = _grad_norm(g, input_gradient_norm, 8, True, 0)
        _pre_band(g, where, v, 8)
        where, v = _grad_norm(g, input_gradient_norm, 8, False, 1)
        _post_band(g, where, v)
    g.finish()


# --------------------------------------------------------------------------- stretch


def _rms(x, weight, eps=1e-6):
    """The reference RMSNorm, in x's dtype (what nn.RMSNorm computes: tests/test_layers.py)."""
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def grade_rms_norm(RMSNorm) -> None:
    """Grade the stretch part ``RMSNorm(d_model, eps=1e-6)``."""
    g = Grader("RMSNorm")

    def build(C, eps=None, dtype=F64, seed=0):
        what = f"RMSNorm({_args(C, eps=eps)})"
        m = call_student(g, what, RMSNorm, C, **({} if eps is None else {"eps": eps}))
        m = m.to(dtype)
        w = (rand(f"rms.w.{seed}", C) * 0.5 + 1).to(dtype)
        _load(g, m, {"weight": w}, what)  # a bias: "should have no ['bias']" (names_hint)
        return m, w, what

    with g.check("has exactly one parameter, weight, ones of shape (C,)"):
        for C in (16, 3):
            m = call_student(g, f"RMSNorm({C})", RMSNorm, C)
            params = dict(m.named_parameters())
            g.expect(
                set(params) == {"weight"},
                f"RMSNorm({C}) needs exactly one nn.Parameter, weight (no bias), got {sorted(params)}",
            )
            g.expect(
                close(params["weight"].detach(), torch.ones(C)),
                f"RMSNorm({C}).weight should start as ones of shape ({C},), got {describe(params['weight'])}",
            )

    def values(case):
        lead, C, eps, scale, seed = case
        m, w, what = build(C, eps=eps, seed=seed)
        x = tensor(seed, *lead, C, scale=scale) + scale  # an offset: RMSNorm must not subtract the mean
        what = f"{what} on x {(*lead, C)}"
        out = call_student(g, what, m, x)
        e = 1e-6 if eps is None else eps
        expected = _rms(x, w, e)
        if not close(out, expected, magnitude=1.0):
            mistakes = [
                (_ln(x, w, None, e), "RMSNorm does not subtract the mean"),
                (x / (torch.sqrt((x * x).mean(-1, keepdim=True)) + e) * w, "eps goes inside the square root"),
                (
                    x / torch.sqrt((x * x).sum(-1, keepdim=True) + e) * w,
                    "the mean of the squares, not their sum",
                ),
            ]
            if eps is None:
                mistakes += [(_rms(x, w, 1e-5), "eps defaults to 1e-6, as the text says, not 1e-5")]
            else:
                mistakes += [
                    (_rms(x, w, 1e-6), f"RMSNorm(C, eps={eps:g}) still used eps=1e-6: store eps, use it")
                ]
            first_match(g, out, [(wrong, f"{what}: {hint}") for wrong, hint in mistakes], expected)
            expect_close(g, what, out, expected, 1.0)

    with g.check(
        "x / sqrt(mean(x^2) + eps) * weight over the last axis, no mean subtracted, any leading dims"
    ):
        for_all(
            "rms.values",
            st.tuples(
                st.lists(st.integers(1, 4), max_size=3).map(tuple),
                st.sampled_from([1, 2, 5, 8, 16]),
                st.just(None),
                st.sampled_from([1.0, 0.05, 30.0]),
                st.integers(0, 2**16),
            ),
            values,
            max_examples=10,
            first=((2, 3), 4, None, 1.0, 0),
        )
    with g.check("eps at other values, inside the square root (tiny inputs show it)"):
        for case in (((3,), 6, 0.5, 1.0, 1), ((2, 2), 8, 1e-2, 1e-2, 2), ((4,), 5, 1e-3, 1e-3, 3)):
            values(case)
        values(((3,), 8, None, 1e-3, 4))
    with g.check("float32 in, float32 out"):
        m, w, what = build(16, dtype=torch.float32)
        x = rand("rms.f32", 3, 16, dtype=torch.float32)
        out = call_student(g, f"{what} on float32 x (3, 16)", m, x)
        expect_close(g, f"{what} on float32 x (3, 16)", out, _rms(x.double(), w.double()).float())
    with g.check("x whose last axis is not C raises a ValueError"):
        m = call_student(g, "RMSNorm(6)", RMSNorm, 6)
        for shape in ((2, 5), (7,)):
            expect_value_error(
                g, lambda shape=shape: m(torch.zeros(*shape)), f"RMSNorm(6) on x {shape}", "name both shapes"
            )
    with g.check("leaves x unchanged; gradients flow back to x"):
        m, w, what = build(6)
        x = rand("rms.grad.x", 2, 6)
        up = rand("rms.grad.up", 2, 6)
        p = probe(m, x.clone().requires_grad_(), backward=(None, up))
        g.expect(is_tensor(p.args[0]) and torch.equal(p.args[0].detach(), x), f"{what} modified x in place")
        xr = x.clone().requires_grad_()
        (_rms(xr, w) * up).sum().backward()
        expect_close(
            g, f"{what} on x (2, 6), the gradient with respect to x", p.grads[0] if p.grads else None, xr.grad
        )
    g.finish()


def check_rms_norm(RMSNorm) -> None:
    """Public checks of ``RMSNorm``: the parameter and one small example."""
    g = Grader("RMSNorm (public)")
    with g.check("RMSNorm(4) has one parameter, weight (ones)"):
        params = dict(RMSNorm(4).named_parameters())
        g.expect(
            set(params) == {"weight"}, f"RMSNorm needs exactly one nn.Parameter, weight, got {sorted(params)}"
        )
    with g.check(
        "RMSNorm(4) of [[1, 2, 3, 4], [3, 3, 3, 3]] divides by the root mean square (no mean subtracted)"
    ):
        x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [3.0, 3.0, 3.0, 3.0]], dtype=F64)
        out = RMSNorm(4).double()(x)
        expect_close(g, "RMSNorm(4) of [[1, 2, 3, 4], [3, 3, 3, 3]]", out, _rms(x, torch.ones(4, dtype=F64)))
    g.finish()

"""Checks for Exercise 2 (multi-head attention).

Each part has two entry points, both called from the notebook with the student's
object. ``check_*`` holds the *public* checks: one small, fixed example per clause of
the part's text. ``grade_*`` holds the *hidden* checks: one named check per clause, on
inputs drawn across what the text allows (:func:`~coursekit.grading.core.for_all`: batch
sizes, one head and many, ``T != S``, every ``n_kv_heads`` that divides ``n_heads``, with
and without bias, float32 and float64), compared with :mod:`coursekit.multihead`. A failed
check names the smallest input that shows the mistake. Both raise
:class:`~coursekit.grading.core.GradingFailure` with a hint per failed check.

The module part checks the names and shapes of the student's ``state_dict()`` (keys
``qkv_proj.weight``, ``qkv_proj.bias``, ``out_proj.weight``, ``out_proj.bias``), then loads
the same random weights of its own into the student's module and into
:class:`coursekit.multihead.MultiHeadAttention`: a module that only works with its own initial
weights (zeros, say) does not pass. Its dropout (the attention weights', the only one) is
checked deterministically: with ``need_weights=True`` in training mode every returned weight
must be 0 or the reference's weight divided by ``1 - p``, and the output must be computed
from exactly those weights.

Shared helpers come from :mod:`coursekit.grading.core` (``call_student`` turns an exception of
the student's code into a hint that names the input); :func:`_message` reads an error's message
in-process and from the sandbox alike.

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from coursekit import attention as att
from coursekit import multihead as ref
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    default_device,
    describe,
    dtype_name,
    expect_value_error,
    first_difference,
    first_match,
    for_all,
    is_a,
    is_tensor,
    load_weights,
    magnitude,
    meta_copy_refused,
    names_hint,
    probe,
    raise_unless_student_error,
    raised,
    random_weights,
    show,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_repeat_kv",
    "check_multihead_attention",
    "grade_split_heads",
    "grade_merge_heads",
    "grade_repeat_kv",
    "grade_multihead_attention",
    "check_predict_params_vs_heads",
    "grade_predict_params_vs_heads",
    "check_predict_kv_shrink",
    "grade_predict_kv_shrink",
    "check_kv_pooling_error",
    "grade_kv_pooling_error",
    "check_pool_kv_heads",
    "grade_pool_kv_heads",
]

FLOATS = (torch.float64, torch.float32)
LINEAR = "torch.nn.modules.linear.Linear"
SEEDS = st.integers(0, 2**31 - 1)


# --------------------------------------------------------------------------- helpers


def _message(e: BaseException) -> str:
    """The message of an exception the student's code raised, here or in the sandbox."""
    message = getattr(e, "message", None)
    return message if isinstance(message, str) else str(e)


def _names(message: str, *numbers: int, ordered: bool = True) -> bool:
    """Whether ``message`` holds each of ``numbers`` (in order, if ``ordered``: a shape), each not as part of a
    longer number."""
    one = [rf"(?<![\d.]){abs(n)}(?![\d.])" for n in numbers]
    if ordered:
        return re.search(r"\D+".join(one), message) is not None
    return all(re.search(pattern, message) for pattern in one)


def _expect_error_naming(
    g: Grader, call, what: str, numbers: tuple[int, ...], fix: str, ordered: bool = True
) -> None:
    """``call()`` must raise a ValueError whose message names ``numbers`` (a shape in order, or values)."""
    try:
        out = call()
    except ValueError as e:
        g.expect(
            _names(_message(e), *numbers, ordered=ordered),
            f"with {what} your ValueError says {_message(e)[:160]!r}: {fix}",
        )
        return
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        g.fail(
            f"with {what} your code raised {type(e).__name__.removeprefix('Student')} ({_message(e)[:160]}); "
            f"raise a ValueError instead ({fix})"
        )
    g.fail(f"with {what} your code returned {describe(out)}; raise a ValueError instead ({fix})")


def _unpack(g: Grader, result, what: str):
    g.expect(
        isinstance(result, tuple) and len(result) == 2,
        f"{what} must return a tuple (out, weights), got {describe(result)}",
    )
    return result


def _layout(x: torch.Tensor, contiguous: bool) -> torch.Tensor:
    """``x`` itself, or the same values in a non-contiguous layout (a transpose of a copy)."""
    return x if contiguous else x.transpose(0, -1).contiguous().transpose(0, -1)


# --------------------------------------------------------------------------- split_heads

#: B, T, H, D, dtype, seed, contiguous
SPLIT = st.tuples(
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(1, 4),
    st.sampled_from(FLOATS),
    SEEDS,
    st.booleans(),
)


def grade_split_heads(split_heads) -> None:
    """Grade a student's ``split_heads(x, n_heads)``."""
    g = Grader("split_heads")

    def split(case):
        B, T, H, D, dtype, seed, contiguous = case
        x = _layout(tensor(seed, B, T, H * D, dtype=dtype), contiguous)
        where = f"split_heads(x {(B, T, H * D)} {dtype_name(dtype)}, {H})"
        return x, where, call_student(g, where, split_heads, x, H)

    with g.check("returns (B, H, T, D) with D = C / H, in x's dtype"):

        def shape(case):
            B, T, H, D, dtype = case[:5]
            x, where, out = split(case)
            g.expect(
                is_tensor(out) and out.shape == (B, H, T, D) and out.dtype == dtype,
                f"{where} should be {dtype_name(dtype)} {(B, H, T, D)} = (B, H, T, D), got {describe(out)}",
            )

        for_all("split.shape", SPLIT, shape, max_examples=10, first=(2, 5, 3, 4, torch.float64, 0, True))

    with g.check("head h holds the contiguous features h*D .. (h+1)*D - 1 of every token"):

        def values(case):
            B, T, H, D = case[:4]
            x, where, out = split(case)
            expected = ref.split_heads(x, H)
            first_match(
                g,
                out,
                [
                    (
                        x.reshape(B, T, D, H).permute(0, 3, 1, 2),
                        f"{where}: head h got every H-th feature instead of a block of D neighbours: view the width as "
                        "(H, D), x.view(B, T, H, D), not (D, H)",
                    ),
                    (
                        x.reshape(B, H, T, D),
                        f"{where}: reshaping (B, T, C) straight to (B, H, T, D) mixes features of different tokens: "
                        "view as (B, T, H, D) first, then transpose(1, 2)",
                    ),
                ],
                right=expected,
            )
            g.expect(
                is_tensor(out) and out.shape == expected.shape and torch.equal(out, expected),
                f"{where}: head h must be x[..., h*D:(h+1)*D]; {first_difference(out, expected)}",
            )

        for_all("split.values", SPLIT, values, max_examples=14, first=(2, 5, 3, 4, torch.float64, 1, True))

    with g.check(
        "raises a ValueError naming n_heads and the width unless n_heads is a positive divisor of it"
    ):

        def bad_heads(case):
            C, n_heads = case
            x = tensor(C, 2, 3, C)
            _expect_error_naming(
                g,
                lambda: split_heads(x, n_heads),
                f"split_heads(x (2, 3, {C}), {n_heads})",
                (n_heads, C),
                f"{n_heads} heads cannot share {C} features; name n_heads={n_heads} "
                f"and the width {C} in the message",
                ordered=False,
            )

        heads = st.tuples(st.integers(2, 12), st.integers(-3, 13)).filter(lambda c: c[1] < 1 or c[0] % c[1])
        for_all("split.error", heads, bad_heads, max_examples=10, first=(12, 5))
        for C, n_heads in ((12, 0), (12, -1), (12, -3), (6, 12)):
            bad_heads((C, n_heads))

    with g.check("raises a ValueError naming the shape unless x is 3-D"):
        for shape in ((4, 6), (2, 3, 2, 6), (6,)):
            x = tensor(len(shape), *shape)
            _expect_error_naming(
                g,
                lambda x=x: split_heads(x, 2),
                f"split_heads(x {shape}, 2)",
                shape,
                f"x must be (B, T, C); name the shape received, {shape}, in the message",
            )

    g.finish()


# --------------------------------------------------------------------------- merge_heads

#: B, H, T, D, dtype, seed, contiguous
MERGE = st.tuples(
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(1, 4),
    st.sampled_from(FLOATS),
    SEEDS,
    st.booleans(),
)


def grade_merge_heads(merge_heads) -> None:
    """Grade a student's ``merge_heads(x)``."""
    g = Grader("merge_heads")

    def merge(case):
        B, H, T, D, dtype, seed, contiguous = case
        x = _layout(tensor(seed, B, H, T, D, dtype=dtype), contiguous)
        where = f"merge_heads(x {(B, H, T, D)} {dtype_name(dtype)}{'' if contiguous else ', not contiguous'})"
        return x, where, call_student(g, where, merge_heads, x)

    with g.check("returns (B, T, H * D) in x's dtype, whatever x's memory layout"):

        def shape(case):
            B, H, T, D, dtype = case[:5]
            x, where, out = merge(case)
            g.expect(
                is_tensor(out) and out.shape == (B, T, H * D) and out.dtype == dtype,
                f"{where} should be {dtype_name(dtype)} {(B, T, H * D)} = (B, T, H*D), got {describe(out)}",
            )

        for_all("merge.shape", MERGE, shape, max_examples=10, first=(2, 3, 5, 4, torch.float64, 0, True))

    with g.check("token t holds the features of head 0, then head 1, ... (x[b, :, t] side by side)"):

        def values(case):
            B, H, T, D = case[:4]
            x, where, out = merge(case)
            expected = ref.merge_heads(x)
            first_match(
                g,
                out,
                [
                    (
                        x.reshape(B, T, H * D),
                        f"{where}: without a transpose the reshape mixes tokens: each token's heads must sit side by "
                        "side, so transpose(1, 2) to (B, T, H, D) before reshaping to (B, T, H*D)",
                    ),
                    (
                        x.permute(0, 2, 3, 1).reshape(B, T, H * D),
                        f"{where}: the features are interleaved across heads: put head 0's D features first, then head "
                        "1's (transpose(1, 2), not a permute that moves D before H)",
                    ),
                ],
                right=expected,
            )
            g.expect(
                is_tensor(out) and out.shape == expected.shape and torch.equal(out, expected),
                f"{where}: merge_heads(x)[b, t] must be the concatenation x[b, 0, t], x[b, 1, t], ...; "
                f"{first_difference(out, expected)}",
            )

        for_all("merge.values", MERGE, values, max_examples=14, first=(2, 3, 5, 4, torch.float64, 1, False))

    with g.check("undoes split_heads: merge_heads(split_heads(y, H)) is y for every H"):

        def roundtrip(case):
            B, T, H, D, seed = case
            y = tensor(seed, B, T, H * D)
            where = f"merge_heads(split_heads(y {(B, T, H * D)}, {H}))"
            out = call_student(g, where, merge_heads, ref.split_heads(y, H))
            g.expect(
                is_tensor(out) and out.shape == y.shape and torch.equal(out, y),
                f"{where} should give y back: {first_difference(out, y)}",
            )

        for_all(
            "merge.roundtrip",
            st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.integers(1, 4), SEEDS),
            roundtrip,
            max_examples=8,
            first=(2, 4, 3, 4, 2),
        )

    with g.check("raises a ValueError naming the shape unless x is 4-D"):
        for shape in ((2, 7, 12), (2, 3, 4, 2, 5), (5, 6)):
            x = tensor(len(shape), *shape)
            _expect_error_naming(
                g,
                lambda x=x: merge_heads(x),
                f"merge_heads(x {shape})",
                shape,
                f"x must be (B, H, T, D); name the shape received, {shape}, in the message",
            )

    g.finish()


# --------------------------------------------------------------------------- repeat_kv

#: B, H_kv, S, D, n_rep, dtype, seed
REPEAT = st.tuples(
    st.integers(1, 2),
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(1, 4),
    st.sampled_from(FLOATS),
    SEEDS,
)


def grade_repeat_kv(repeat_kv) -> None:
    """Grade a student's ``repeat_kv(x, n_rep)``."""
    g = Grader("repeat_kv")

    def repeat(case):
        B, H_kv, S, D, n_rep, dtype, seed = case
        x = tensor(seed, B, H_kv, S, D, dtype=dtype)
        where = f"repeat_kv(x {(B, H_kv, S, D)} {dtype_name(dtype)}, {n_rep})"
        return x, where, call_student(g, where, repeat_kv, x, n_rep)

    with g.check("returns (B, H_kv * n_rep, S, D) in x's dtype"):

        def shape(case):
            B, H_kv, S, D, n_rep, dtype = case[:6]
            x, where, out = repeat(case)
            g.expect(
                is_tensor(out) and out.shape == (B, H_kv * n_rep, S, D) and out.dtype == dtype,
                f"{where} should be {dtype_name(dtype)} {(B, H_kv * n_rep, S, D)}, got {describe(out)}",
            )

        for_all("repeat.shape", REPEAT, shape, max_examples=10, first=(2, 2, 5, 3, 3, torch.float64, 0))

    with g.check(
        "output head h is input head h // n_rep: [a, b] becomes [a, a, b, b]; n_rep = 1 gives x's values"
    ):

        def values(case):
            B, H_kv, S, D, n_rep = case[:5]
            x, where, out = repeat(case)
            expected = ref.repeat_kv(x, n_rep)
            first_match(
                g,
                out,
                [
                    (
                        x.repeat(1, n_rep, 1, 1),
                        f"{where}: the groups are wrong: heads [a, b] with n_rep=2 must become [a, a, b, b] "
                        "(consecutive query heads share a key/value head), not [a, b, a, b]; use "
                        "repeat_interleave(n_rep, dim=1), "
                        "not repeat",
                    ),
                ],
                right=expected,
            )
            g.expect(
                is_tensor(out) and out.shape == expected.shape and torch.equal(out, expected),
                f"{where}: output head h must be input head h // n_rep; {first_difference(out, expected)}",
            )

        for_all("repeat.values", REPEAT, values, max_examples=14, first=(2, 2, 5, 3, 2, torch.float64, 1))
        x = tensor(7, 2, 3, 4, 2)
        out = call_student(g, "repeat_kv(x (2, 3, 4, 2), 1)", repeat_kv, x, 1)
        g.expect(
            is_tensor(out) and out.shape == x.shape and torch.equal(out, x),
            f"repeat_kv(x, 1) must give x's values unchanged: {first_difference(out, x)}",
        )

    with g.check(
        "attention over the repeated heads equals torch's scaled_dot_product_attention(enable_gqa=True)"
    ):

        def gqa(case):
            B, H_kv, T, S, D, n_rep, seed = case
            q = tensor(seed, B, H_kv * n_rep, T, D)
            k, v = tensor(seed + 1, B, H_kv, S, D), tensor(seed + 2, B, H_kv, S, D)
            where = f"for q {tuple(q.shape)} and k, v {tuple(k.shape)}, n_rep={n_rep}"
            rk, rv = call_student(g, where, repeat_kv, k, n_rep), call_student(g, where, repeat_kv, v, n_rep)
            g.expect(
                is_tensor(rk) and is_tensor(rv) and rk.shape == rv.shape == (B, H_kv * n_rep, S, D),
                f"{where}: repeat_kv(k, {n_rep}) should be {(B, H_kv * n_rep, S, D)}, got {describe(rk)}",
            )
            out, _ = att.scaled_dot_product_attention(q, rk, rv)
            expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            g.expect(
                close(out, expected),
                f"{where}: attention with your repeated keys and values differs from "
                "enable_gqa=True: query head h must read key/value head h // n_rep",
            )

        for_all(
            "repeat.gqa",
            st.tuples(
                st.integers(1, 2),
                st.integers(1, 3),
                st.integers(1, 4),
                st.integers(1, 5),
                st.integers(1, 4),
                st.integers(1, 3),
                SEEDS,
            ),
            gqa,
            max_examples=8,
            first=(2, 2, 4, 7, 5, 3, 2),
        )

    with g.check("gradients reach every key/value head: each collects the sum over its group of n_rep heads"):

        def grads(case):
            B, H_kv, S, D, n_rep, seed = case
            x = tensor(seed, B, H_kv, S, D)
            upstream = tensor(seed + 1, B, H_kv * n_rep, S, D)
            where = f"repeat_kv(x {tuple(x.shape)}, {n_rep})"
            try:
                p = probe(repeat_kv, x.clone().requires_grad_(), n_rep, backward=(None, upstream))
            except Exception as e:  # noqa: BLE001
                raise_unless_student_error(e)
                g.fail(f"{where}: {raised(e)}")
            g.expect(
                is_tensor(p.result) and p.result.requires_grad,
                f"{where}: the result does not depend on x through autograd: avoid .detach(), .numpy() or "
                "building a new tensor from values",
            )
            expected = upstream.view(B, H_kv, n_rep, S, D).sum(2)
            got = p.grads[0] if p.grads else None
            g.expect(
                got is not None and close(got, expected),
                f"{where}: the gradient of x should be the sum of the upstream gradients over each group of "
                f"n_rep query heads; {first_difference(got, expected)}",
            )

        for_all(
            "repeat.grad",
            st.tuples(
                st.integers(1, 2),
                st.integers(1, 3),
                st.integers(1, 3),
                st.integers(1, 3),
                st.integers(1, 3),
                SEEDS,
            ),
            grads,
            max_examples=5,
            first=(1, 2, 3, 4, 3, 3),
        )

    with g.check("raises ValueError unless x is 4-D and n_rep >= 1"):
        for shape, n_rep in (((2, 3, 4), 2), ((2, 3, 4, 2, 2), 2), ((2, 3, 4, 2), 0), ((2, 3, 4, 2), -1)):
            x = tensor(len(shape), *shape)
            expect_value_error(
                g,
                lambda x=x, n_rep=n_rep: repeat_kv(x, n_rep),
                f"repeat_kv(x {shape}, {n_rep})",
                "x must be (B, H_kv, S, D) and n_rep >= 1; say what was expected and what came",
            )

    g.finish()


# --------------------------------------------------------------------------- the module


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


#: H, D, key/value heads (0: the default, else an index into H's divisors), bias, dtype, seed
CONFIG = (
    st.sampled_from([1, 2, 3, 4, 6]),
    st.integers(1, 3),
    st.integers(0, 3),
    st.booleans(),
    st.sampled_from(FLOATS),
    SEEDS,
)


class _Pair:
    """The student's module and coursekit's, holding the same random weights of ours."""

    def __init__(self, g: Grader, MultiHeadAttention, config, dropout: float = 0.0, train: bool = False):
        H, D, kv, bias, dtype, seed = config
        self.H, self.D, self.C, self.bias, self.dtype = H, D, H * D, bias, dtype
        self.n_kv = None if kv == 0 else _divisors(H)[(kv - 1) % len(_divisors(H))]
        self.H_kv = H if self.n_kv is None else self.n_kv
        kwargs = {} if self.n_kv is None else {"n_kv_heads": self.n_kv}
        kwargs.update({} if bias else {"bias": False})
        kwargs.update({"dropout": dropout} if dropout else {})
        self.call = f"MultiHeadAttention({self.C}, {H}{''.join(f', {k}={v}' for k, v in kwargs.items())})"
        m = call_student(g, self.call, MultiHeadAttention, self.C, H, **kwargs)
        self.r = ref.MultiHeadAttention(self.C, H, self.n_kv, bias=bias, dropout=dropout).to(dtype)
        weights = {k: v.to(dtype) for k, v in random_weights(self.r, f"mha.weights.{seed}").items()}
        self.m = call_student(g, f"{self.call}.to({dtype})", m.to, dtype)
        _check_state(g, self.m, self.r, self.call, bias)
        load_weights(g, self.m, weights, self.call, bias)
        self.r.load_state_dict(weights)
        call_student(g, f"{self.call}.{'train' if train else 'eval'}()", self.m.train, train)
        self.r.eval()

    def inputs(self, seed: int, B: int, T: int, S: int | None = None):
        x = tensor(seed, B, T, self.C, dtype=self.dtype)
        kv = None if S is None else tensor(seed + 1, B, S, self.C, dtype=self.dtype)
        return x, kv

    def where(self, x, kv=None, **kwargs) -> str:
        text = f"{self.call} ({dtype_name(self.dtype)}) on x {tuple(x.shape)}"
        text += "" if kv is None else f" and kv {tuple(kv.shape)}"
        for key, value in kwargs.items():
            if value is None:
                continue
            text += f", {key}=" + (
                f"{'boolean' if value.dtype == torch.bool else dtype_name(value.dtype)} {tuple(value.shape)}"
                if isinstance(value, torch.Tensor)
                else repr(value)
            )
        return text

    def forward(self, g: Grader, x, kv=None, **kwargs):
        where = self.where(x, kv, **kwargs)
        args = (x,) if kv is None else (x, kv)
        out, w = _unpack(g, call_student(g, where, self.m, *args, **kwargs), "forward")
        return where, out, w

    def expected(self, x, kv=None, **kwargs):
        with torch.no_grad():
            out, w = self.r(x, kv, **{**kwargs, "need_weights": True})
            q, k, v = self.r.project(x, kv)
            scores = q @ ref.repeat_kv(k, self.H // self.H_kv).transpose(-2, -1) / math.sqrt(self.D)
        return out, w, magnitude(scores, x, kv, *self.r.parameters())


def _causal_on_x_device(g: Grader, MultiHeadAttention, config, B: int, T: int, S: int) -> None:
    """Cross-attention with ``is_causal=True`` on CPU inputs while torch's default device (where the
    student's code runs) is ``meta``: a mask made without ``device=x.device`` lands on ``meta``."""
    p = _Pair(g, MultiHeadAttention, config)
    x, kv = p.inputs(config[-1], B, T, S)
    where = p.where(x, kv, is_causal=True) + ", with torch's default device set to meta"
    fix = "make the causal mask on x's device: causal_mask(T, S, device=x.device)"
    try:
        with default_device():
            result = p.m(x.clone(), kv.clone(), is_causal=True, need_weights=True)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        if not meta_copy_refused(e):
            raise_unless_student_error(e)
        g.fail(f"{where}: {raised(e)}: {fix}")
    out, _ = _unpack(g, result, "forward")
    g.expect(
        is_tensor(out) and out.device.type == "cpu",
        f"{where}: got {describe(out)}{' on ' + out.device.type if is_tensor(out) else ''}, not a tensor on "
        f"x's device (cpu): {fix}",
    )
    expected = p.expected(x, kv, is_causal=True)[
        0
    ]  # on the CPU: the device is right, the rest is its own clause
    g.expect(
        close(out, expected), f"{where}: out differs from the reference: {first_difference(out, expected)}"
    )


def _dropout_shows(w, w_r, p: float, mag: float) -> bool:
    """The weights ``w`` differ from the reference's ``w_r`` as dropout with probability ``p`` makes them
    differ: each is 0 or scaled by 1/(1-p) (what a dropout applied in eval mode shows)."""
    if not (is_tensor(w) and w.shape == w_r.shape and w.dtype == w_r.dtype) or close(w, w_r, magnitude=mag):
        return False
    scaled = w_r / (1 - p) if p < 1 else torch.zeros_like(w_r)
    return close(torch.where(w == 0, scaled, w), scaled, magnitude=mag)


def _check_state(g: Grader, m, r, call: str, bias: bool) -> None:
    """The student's state_dict has the reference's names and shapes (qkv_proj and out_proj only); a
    difference in biases alone is the bias argument's clause (:func:`names_hint` says so)."""
    expected = r.state_dict()
    sd = m.state_dict()
    if isinstance(sd, dict):
        differ = set(map(str, sd)) ^ set(expected)
        g.expect(
            not differ or not all(key.endswith(".bias") for key in differ),
            names_hint(call, set(map(str, sd)), set(expected), bias),
        )
    g.expect(
        isinstance(sd, dict) and set(sd) == set(expected),
        f"{call}: state_dict() should hold exactly {sorted(expected)}, got "
        f"{sorted(map(str, sd)) if isinstance(sd, dict) else describe(sd)}: the module's only layers are the "
        "nn.Linear qkv_proj and out_proj",
    )
    for key, value in sd.items():
        g.expect(
            is_tensor(value) and value.shape == expected[key].shape,
            f"{call}: {key} should have shape {tuple(expected[key].shape)}, got {describe(value)}",
        )


def _mistakes(p: _Pair, x, kv, where: str, **kwargs) -> list:
    """Classic wrong outputs of the module (computed with the reference's pieces), with their hints."""
    r, H, H_kv = p.r, p.H, p.H_kv
    mask = r._combine_masks(
        kwargs.get("mask"),
        kwargs.get("key_padding_mask"),
        kwargs.get("is_causal", False),
        x.shape[0],
        x.shape[1],
        (x if kv is None else kv).shape[1],
        x,
    )
    with torch.no_grad():
        q, k, v = r.project(x, kv)
        n_rep = H // H_kv
        rk, rv = ref.repeat_kv(k, n_rep), ref.repeat_kv(v, n_rep)

        def out_of(q, k, v, mask=mask, scale=None):
            return r.out_proj(
                ref.merge_heads(att.scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)[0])
            )

        out = [
            (
                out_of(q, rk, rv, scale=1 / math.sqrt(p.C)),
                f"{where}: the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = C / H = {p.D}, "
                "not the model width",
            ),
            (
                ref.merge_heads(att.scaled_dot_product_attention(q, rk, rv, mask=mask)[0]),
                f"{where}: out is the merged heads without the output projection: apply out_proj after merge_heads",
            ),
        ]
        if H_kv == H and kv is None:
            out.append(
                (
                    out_of(k, q, v),
                    f"{where}: queries and keys are swapped: qkv_proj's output is [q (C) | "
                    "k (H_kv D) | v (H_kv D)], split it in that order",
                )
            )
        if 1 < H_kv < H:
            out.append(
                (
                    out_of(q, k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)),
                    f"{where}: the groups are wrong: query head h must read key/value head h // (H / H_kv), so "
                    "repeat each key/value head with repeat_interleave (repeat_kv), not repeat",
                )
            )
        if kv is not None and kv.shape[1] == x.shape[1]:
            qx, kx, vx = r.project(x)
            out.append(
                (
                    out_of(q, ref.repeat_kv(kx, n_rep), ref.repeat_kv(vx, n_rep)),
                    f"{where}: the keys and values come from x: in cross-attention they come from kv",
                )
            )
        user = kwargs.get("mask")
        if user is not None:
            if user.dtype == torch.bool:
                out.append(
                    (
                        r(x, kv, **{**kwargs, "mask": ~user})[0],
                        f"{where}: a boolean mask is inverted: True means the query *may attend* to the key",
                    )
                )
            else:
                out.append(
                    (
                        r(x, kv, **{**kwargs, "mask": None})[0],
                        f"{where}: the floating mask was ignored: it is added to the scores",
                    )
                )
            if kwargs.get("key_padding_mask") is not None or kwargs.get("is_causal"):
                out.append(
                    (
                        r(x, kv, mask=user)[0],
                        f"{where}: only the mask was applied: key_padding_mask and is_causal must be combined "
                        "with it (every part can remove a key)",
                    )
                )
        if kwargs.get("key_padding_mask") is not None:
            flipped = {**kwargs, "key_padding_mask": ~kwargs["key_padding_mask"]}
            out.append(
                (
                    r(x, kv, **flipped)[0],
                    f"{where}: key_padding_mask is inverted: in this course True marks a "
                    "real key and False padding (nn.MultiheadAttention uses the opposite)",
                )
            )
        if kwargs.get("is_causal"):
            without = {**kwargs, "is_causal": False}
            out.append(
                (
                    r(x, kv, **without)[0],
                    f"{where}: is_causal=True was ignored: combine causal_mask(T, S) with the other masks",
                )
            )
            S, T = (x if kv is None else kv).shape[1], x.shape[1]
            if S != T:
                top_left = torch.ones(T, S, dtype=torch.bool).tril()
                mixed = {**without, "mask": top_left if kwargs.get("mask") is None else None}
                if mixed["mask"] is not None:
                    out.append(
                        (
                            r(x, kv, **mixed)[0],
                            f"{where}: the causal mask is aligned to the top-left: use causal_mask(T, S), whose "
                            "last query sees every key (bottom-right aligned)",
                        )
                    )
    return out


def _expect_forward(g: Grader, p: _Pair, x, kv=None, **kwargs):
    """The student's forward against the reference's, with the classic mistakes' hints; returns (out, w)."""
    need = kwargs.pop("need_weights", True)  # None: left out, so the default (False) applies
    where, out, w = p.forward(g, x, kv, **kwargs, **({} if need is None else {"need_weights": need}))
    out_r, w_r, mag = p.expected(x, kv, **kwargs)
    B, T, S = x.shape[0], x.shape[1], (x if kv is None else kv).shape[1]
    g.expect(
        is_tensor(out) and out.shape == (B, T, p.C) and out.dtype == p.dtype,
        f"{where}: out should be {dtype_name(p.dtype)} {(B, T, p.C)} = (B, T, C), got {describe(out)}",
    )
    if is_tensor(out) and bool(torch.isnan(out).any()):
        g.fail(
            f"{where}: out holds NaN ({show(out)}): a query that sees no key must get zero weights (the given "
            "scaled_dot_product_attention does this; combine masks by adding -inf, never -inf - -inf)"
        )
    try:
        mistakes = _mistakes(p, x, kv, where, **kwargs)
    except Exception:  # noqa: BLE001 (a mistake that cannot be computed on this input has no hint here)
        mistakes = []
    first_match(g, out, mistakes, right=out_r)
    if need and kv is not None and S != T and is_tensor(w) and w.shape == (B, p.H, T, T):
        g.fail(
            f"{where}: the keys come from x: in cross-attention queries come from x but keys and values from kv, "
            "so the weights are (B, H, T, S)"
        )
    if need:
        if is_tensor(w) and w.shape == (B, T, S) and close(w, w_r.mean(1), magnitude=mag):
            g.fail(
                f"{where}: need_weights must return one (T, S) matrix per head, shape (B, H, T, S): do not "
                "average over the heads (that is torch's average_attn_weights=True)"
            )
        if (
            p.H != T
            and is_tensor(w)
            and w.shape == (B, T, p.H, S)
            and close(w, w_r.transpose(1, 2), magnitude=mag)
        ):
            g.fail(
                f"{where}: weights should be (B, H, T, S) = {(B, p.H, T, S)}, got (B, T, H, S) = {tuple(w.shape)}:"
                " do not transpose them"
            )
        g.expect(
            is_tensor(w) and w.shape == w_r.shape and w.dtype == p.dtype,
            f"{where}: weights should be {dtype_name(p.dtype)} (B, H, T, S) = {tuple(w_r.shape)}, got {describe(w)}",
        )
        g.expect(
            close(w, w_r, magnitude=mag),
            f"{where}: the attention weights differ from the reference: {first_difference(w, w_r)}",
        )
    else:
        g.expect(
            w is None,
            f"{where}: without need_weights=True (it defaults to False) the second value should be "
            f"None, got {describe(w)}",
        )
    g.expect(
        close(out, out_r, magnitude=mag),
        f"{where}: out differs from the reference: {first_difference(out, out_r)}",
    )
    return out, w


def grade_multihead_attention(MultiHeadAttention) -> None:
    """Grade a student's ``MultiHeadAttention(d_model, n_heads, n_kv_heads=None, bias=True, dropout=0.0)``."""
    g = Grader("MultiHeadAttention")

    with g.check(
        "__init__ stores d_model, n_heads, n_kv_heads, d_head and dropout, and creates the nn.Linear "
        "qkv_proj (C -> C + 2 H_kv D) and out_proj (C -> C), with biases only if bias=True"
    ):

        def layers(case):
            H, D, kv, bias, _, p = case
            C = H * D
            n_kv = None if kv == 0 else _divisors(H)[(kv - 1) % len(_divisors(H))]
            H_kv = H if n_kv is None else n_kv
            call = f"MultiHeadAttention({C}, {H}, n_kv_heads={n_kv}, bias={bias}, dropout={p})"
            m = call_student(g, call, MultiHeadAttention, C, H, n_kv_heads=n_kv, bias=bias, dropout=p)
            for name, value in (
                ("d_model", C),
                ("n_heads", H),
                ("n_kv_heads", H_kv),
                ("d_head", D),
                ("dropout", p),
            ):
                got = getattr(m, name, "missing")
                g.expect(
                    type(got) in (int, float) and got == value,
                    f"{call}: the attribute {name} should be {value!r}, got {got!r}",
                )
            for name, n_out in (("qkv_proj", C + 2 * H_kv * D), ("out_proj", C)):
                layer = getattr(m, name, None)
                g.expect(is_a(layer, LINEAR), f"{call} needs an nn.Linear called {name}")
                g.expect(
                    (layer.in_features, layer.out_features) == (C, n_out),
                    f"{call}: {name} should map {C} to {n_out} features"
                    f"{' (q, k and v packed: C + 2 H_kv D)' if name == 'qkv_proj' else ''}, "
                    f"got {layer.in_features} -> {layer.out_features}",
                )
            _check_state(g, m, ref.MultiHeadAttention(C, H, n_kv, bias=bias), call, bias)

        for_all(
            "mha.layers",
            st.tuples(*CONFIG[:5], st.sampled_from([0.0, 0.1, 0.5])),
            layers,
            max_examples=10,
            first=(4, 3, 0, True, torch.float64, 0.0),
        )

    with g.check(
        "project(x, kv=None) returns q (B, H, T, D), k and v (B, H_kv, S, D): all three from x, or q from "
        "x and k, v from kv"
    ):

        def project(case):
            config, B, T, S, cross = case[:6], case[6], case[7], case[8], case[9]
            p = _Pair(g, MultiHeadAttention, config)
            x, kv = p.inputs(config[-1], B, T, S if cross else None)
            where = p.where(x, kv) + ": project"
            got = call_student(g, where, p.m.project, *((x,) if kv is None else (x, kv)))
            with torch.no_grad():
                expected = p.r.project(x, kv)
            g.expect(
                isinstance(got, tuple) and len(got) == 3,
                f"{where} must return (q, k, v), got {describe(got)}",
            )
            for name, a, b in zip("qkv", got, expected):
                g.expect(
                    is_tensor(a) and a.shape == b.shape and a.dtype == b.dtype,
                    f"{where}: {name} should be {describe(b)}, got {describe(a)}",
                )
                g.expect(
                    close(a, b, magnitude=magnitude(x, kv)),
                    f"{where}: {name} differs from the reference: {first_difference(a, b)}"
                    + (
                        " (queries come from x with the first C rows of qkv_proj, keys and values from kv with "
                        "the rest)"
                        if cross
                        else " (qkv_proj's output is [q (C) | k (H_kv D) | v (H_kv D)])"
                    ),
                )

        for_all(
            "mha.project",
            st.tuples(*CONFIG, st.integers(1, 2), st.integers(1, 4), st.integers(1, 5), st.booleans()),
            project,
            max_examples=10,
            first=(4, 3, 0, True, torch.float64, 0, 2, 4, 6, True),
        )

    with g.check(
        "self-attention: out (B, T, C) and per-head weights (B, H, T, T) as the reference's, any n_kv_heads "
        "dividing n_heads (MHA, GQA, MQA); need_weights=False, the default, returns (out, None)"
    ):

        def self_attention(case):
            config, B, T, need = case[:6], case[6], case[7], case[8]
            p = _Pair(g, MultiHeadAttention, config)
            x, _ = p.inputs(config[-1], B, T)
            _expect_forward(g, p, x, need_weights=need)

        for_all(
            "mha.self",
            st.tuples(*CONFIG, st.integers(1, 2), st.integers(1, 5), st.sampled_from([True, False, None])),
            self_attention,
            max_examples=12,
            first=(4, 3, 0, True, torch.float64, 1, 2, 5, True),
        )
        self_attention(
            (4, 2, 2, True, torch.float64, 12, 2, 4, True)
        )  # GQA: 2 key/value heads for 4 query heads
        self_attention((6, 2, 3, False, torch.float32, 13, 1, 3, None))  # 3 key/value heads for 6

    with g.check(
        "cross-attention: queries from x (T), keys and values from kv (S != T), with or without bias"
    ):

        def cross(case):
            config, B, T, S = case[:6], case[6], case[7], case[8]
            p = _Pair(g, MultiHeadAttention, config)
            x, kv = p.inputs(config[-1], B, T, S)
            _expect_forward(g, p, x, kv)

        for_all(
            "mha.cross",
            st.tuples(*CONFIG, st.integers(1, 2), st.integers(1, 4), st.integers(1, 6)),
            cross,
            max_examples=12,
            first=(4, 3, 0, False, torch.float64, 2, 2, 4, 6),
        )
        cross((4, 2, 2, False, torch.float64, 14, 2, 3, 5))  # GQA without bias

    with g.check("key_padding_mask (B, S): True marks a real key, False a padded one that gets no weight"):

        def padding(case):
            config, B, T, S, cross = case[:6], case[6], case[7], case[8], case[9]
            p = _Pair(g, MultiHeadAttention, config)
            x, kv = p.inputs(config[-1], B, T, S if cross else None)
            S = S if cross else T
            keep = tensor(config[-1] + 2, B, S) > -0.5
            keep[:, config[-1] % S] = True
            _expect_forward(g, p, x, kv, key_padding_mask=keep)

        for_all(
            "mha.padding",
            st.tuples(*CONFIG, st.integers(1, 2), st.integers(1, 4), st.integers(1, 6), st.booleans()),
            padding,
            max_examples=10,
            first=(4, 3, 0, True, torch.float64, 3, 2, 5, 5, False),
        )

    with g.check("is_causal=True adds causal_mask(T, S): bottom-right aligned when S != T"):

        def causal(case):
            config, B, T, extra, cross = case[:6], case[6], case[7], case[8], case[9]
            p = _Pair(g, MultiHeadAttention, config)
            x, kv = p.inputs(config[-1], B, T, T + extra if cross else None)
            _expect_forward(g, p, x, kv, is_causal=True)

        for_all(
            "mha.causal",
            st.tuples(*CONFIG, st.integers(1, 2), st.integers(1, 5), st.integers(0, 3), st.booleans()),
            causal,
            max_examples=10,
            first=(4, 3, 0, True, torch.float64, 4, 2, 6, 0, False),
        )

    with g.check("is_causal builds its mask on x's device, not on torch's default device"):
        _causal_on_x_device(g, MultiHeadAttention, (2, 3, 0, True, torch.float64, 11), 2, 3, 5)

    with g.check(
        "mask, boolean or floating and broadcastable to (B, H, T, S), alone and combined with "
        "key_padding_mask and is_causal"
    ):

        def masked(case):
            config, B, T, extra, kind, keep, drop, with_padding, with_causal = (case[:6], *case[6:])
            p = _Pair(g, MultiHeadAttention, config)
            S = T + extra
            x, kv = p.inputs(config[-1], B, T, S if extra else None)
            full = (B, p.H, T, S)
            shape = tuple(n if k else 1 for n, k in zip(full, keep))[min(drop, 3) :]
            mask = tensor(config[-1] + 3, *shape) > -0.5
            mask[..., 0] = True  # key 0 stays visible to every query (is_causal keeps it too)
            if kind == "float":
                mask = tensor(config[-1] + 4, *shape, dtype=p.dtype).masked_fill(~mask, -math.inf)
            kwargs = {"mask": mask}
            if with_padding:
                kwargs["key_padding_mask"] = tensor(config[-1] + 5, B, S) > -1.0
                kwargs["key_padding_mask"][:, 0] = True
            if with_causal:
                kwargs["is_causal"] = True
            _expect_forward(g, p, x, kv, **kwargs)

        for_all(
            "mha.mask",
            st.tuples(
                *CONFIG,
                st.integers(1, 2),
                st.integers(1, 4),
                st.integers(0, 2),
                st.sampled_from(["bool", "float"]),
                st.lists(st.booleans(), min_size=4, max_size=4),
                st.integers(0, 3),
                st.booleans(),
                st.booleans(),
            ),
            masked,
            max_examples=14,
            first=(4, 3, 0, True, torch.float64, 5, 2, 5, 0, "bool", [True] * 4, 0, False, False),
        )
        masked(
            (4, 2, 2, True, torch.float64, 15, 2, 4, 1, "float", [True, True, False, True], 0, True, True)
        )  # GQA

    with g.check(
        "a query with no visible key gets a zero attention output (out is out_proj's bias), not NaN"
    ):

        def empty(case):
            config, B, T, boolean = case[:6], case[6], case[7], case[8]
            p = _Pair(g, MultiHeadAttention, config)
            x, _ = p.inputs(config[-1], B, T)
            row = config[-1] % T
            mask = torch.ones(B, 1, T, T, dtype=torch.bool)
            mask[-1, :, row] = False
            if not boolean:
                mask = torch.zeros(mask.shape, dtype=p.dtype).masked_fill(~mask, -math.inf)
            out, _ = _expect_forward(g, p, x, mask=mask)
            bias = p.r.out_proj.bias
            expected = torch.zeros(p.C, dtype=p.dtype) if bias is None else bias.detach()
            g.expect(
                close(out[-1, row], expected, magnitude=magnitude(x)),
                f"{p.where(x, mask=mask)}: query {row} sees no key, so its output should be out_proj's bias",
            )

        for_all(
            "mha.empty",
            st.tuples(*CONFIG, st.integers(1, 2), st.integers(1, 5), st.booleans()),
            empty,
            max_examples=8,
            first=(4, 3, 0, True, torch.float64, 6, 2, 4, True),
        )

    with g.check(
        "raises ValueError for a key_padding_mask that is not a boolean (B, S) tensor, and for a mask "
        "that is neither boolean nor floating"
    ):
        p = _Pair(g, MultiHeadAttention, (4, 3, 0, True, torch.float64, 7))
        x, _ = p.inputs(7, 2, 5)
        for what, kwargs in (
            (
                "key_padding_mask=torch.int64 (2, 5)",
                {"key_padding_mask": torch.ones(2, 5, dtype=torch.int64)},
            ),
            ("key_padding_mask=float64 (2, 5)", {"key_padding_mask": torch.zeros(2, 5, dtype=torch.float64)}),
            ("key_padding_mask=boolean (2, 4)", {"key_padding_mask": torch.ones(2, 4, dtype=torch.bool)}),
            ("key_padding_mask=boolean (1, 5)", {"key_padding_mask": torch.ones(1, 5, dtype=torch.bool)}),
            ("key_padding_mask=boolean (5,)", {"key_padding_mask": torch.ones(5, dtype=torch.bool)}),
            ("mask=torch.int64 (5, 5)", {"mask": torch.ones(5, 5, dtype=torch.int64)}),
        ):
            expect_value_error(
                g,
                lambda kwargs=kwargs: p.m(x, **kwargs),
                f"{p.call} on x (2, 5, 12) with {what}",
                "key_padding_mask must be a boolean (B, S) tensor, mask boolean or floating",
            )

    with g.check(
        "dropout: in training mode each attention weight is zeroed with probability p and the others are "
        "scaled by 1/(1-p), out is computed from those weights; no dropout in eval mode or with p = 0"
    ):
        for config, p_drop in (
            ((4, 3, 0, True, torch.float64, 8), 0.3),
            ((2, 2, 1, False, torch.float32, 9), 0.6),
        ):
            pair = _Pair(g, MultiHeadAttention, config, dropout=p_drop, train=True)
            x, _ = pair.inputs(config[-1], 2, 6)
            where, out, w = pair.forward(g, x, need_weights=True)
            _, w_r, mag = pair.expected(x)
            g.expect(
                is_tensor(w) and w.shape == w_r.shape,
                f"{where} in training mode: weights should be {tuple(w_r.shape)}, got {describe(w)}",
            )
            kept = w != 0
            with torch.no_grad():
                _, _, v = pair.r.project(x)
                v = ref.repeat_kv(v, pair.H // pair.H_kv)
                expected = pair.r.out_proj(ref.merge_heads(w @ v))
            if not bool((~kept).any()) and not close(out, expected, magnitude=mag):
                g.fail(
                    f"{where} in training mode: out changed but the returned weights were not dropped: dropout "
                    "belongs on the attention weights, and need_weights returns them after dropout"
                )
            g.expect(
                bool((~kept).any()),
                f"{where} in training mode: no attention weight was zeroed: apply F.dropout(weights, "
                "self.dropout) to the attention weights when self.training",
            )
            g.expect(bool(kept.any()), f"{where} in training mode: every attention weight was zeroed")
            if close(w[kept], w_r[kept], magnitude=mag):
                g.fail(
                    f"{where} in training mode: the weights that survive dropout must be scaled by 1/(1-p) "
                    "(F.dropout does this); yours are unscaled"
                )
            g.expect(
                close(w[kept], w_r[kept] / (1 - p_drop), magnitude=mag),
                f"{where} in training mode: a weight must be 0 or the weight without dropout times "
                f"1/(1-p) = {1 / (1 - p_drop):.4g}: {first_difference(w[kept], w_r[kept] / (1 - p_drop))} "
                "(dropout belongs on the attention weights after the softmax, nowhere else)",
            )
            g.expect(
                close(out, expected, magnitude=mag),
                f"{where} in training mode: out must be computed from the weights after dropout: "
                "out = out_proj(merge_heads(dropout(weights) @ v)), with no other dropout",
            )
            out_r = pair.r(x)[0].detach()
            again, _ = _unpack(g, call_student(g, where, pair.m, x), "forward")
            g.expect(
                not close(again, out_r, magnitude=mag),
                f"{where} in training mode with need_weights=False: out is the output without dropout: apply "
                "dropout whether or not the weights are returned",
            )
            call_student(g, f"{pair.call}.eval()", pair.m.eval)
            where, out, w = pair.forward(g, x, need_weights=True)
            if is_tensor(w) and w.shape == w_r.shape and bool((w == 0).any()):
                g.fail(
                    f"{where} in eval mode: some weights were zeroed: apply dropout only when self.training"
                )
            g.expect(
                close(out, out_r, magnitude=mag) or not _dropout_shows(w, w_r, p_drop, mag),
                f"{where} in eval mode: the weights were scaled by 1/(1-p) = {1 / (1 - p_drop):.4g}: apply "
                "dropout only when self.training",
            )
            g.expect(
                close(out, out_r, magnitude=mag),
                f"{where} in eval mode: out differs from the reference, "
                "which applies no dropout in eval mode",
            )
        pair = _Pair(g, MultiHeadAttention, (4, 3, 0, True, torch.float64, 10), train=True)
        x, _ = pair.inputs(10, 2, 5)
        _expect_forward(g, pair, x)

    with g.check("gradients with respect to x and kv match the reference"):

        def grads(case):
            config, B, T, extra, cross = case[:6], case[6], case[7], case[8], case[9]
            p = _Pair(g, MultiHeadAttention, config)
            x, kv = p.inputs(config[-1], B, T, T + extra if cross else None)
            upstream = tensor(config[-1] + 9, B, T, p.C, dtype=p.dtype)
            where = p.where(x, kv, is_causal=True)
            args = [t.clone().requires_grad_() for t in ((x,) if kv is None else (x, kv))]
            try:
                pr = probe(p.m, *args, is_causal=True, backward=(0, upstream))
            except Exception as e:  # noqa: BLE001
                raise_unless_student_error(e)
                g.fail(f"{where}: {raised(e)}")
            out, _ = _unpack(g, pr.result, "forward")
            g.expect(
                is_tensor(out) and out.requires_grad,
                f"{where}: out does not depend on x through autograd: avoid .detach(), .numpy() or .item()",
            )
            mine = [t.detach().clone().requires_grad_() for t in args]
            (p.r(*mine, is_causal=True)[0] * upstream).sum().backward()
            for name, got, want in zip(("x", "kv"), pr.grads or [None, None], mine):
                g.expect(
                    got is not None and close(got, want.grad, magnitude=magnitude(x, kv)),
                    f"{where}: the gradient with respect to {name} differs from the reference"
                    + (f": {first_difference(got, want.grad)}" if got is not None else ""),
                )

        for_all(
            "mha.grad",
            st.tuples(
                *CONFIG[:4],
                st.just(torch.float64),
                SEEDS,
                st.integers(1, 2),
                st.integers(1, 4),
                st.integers(0, 2),
                st.booleans(),
            ),
            grads,
            max_examples=5,
            first=(4, 3, 2, True, torch.float64, 11, 2, 4, 0, False),
        )

    g.finish()


# --------------------------------------------------------------------------- public checks


def check_split_heads(split_heads) -> None:
    """Public checks of ``split_heads``: one small fixed example per clause the hidden checks grade."""
    g = Grader("split_heads (public)")
    x = torch.arange(36.0).view(2, 3, 6)  # (B=2, T=3, C=6)
    with g.check(
        "split_heads(x of shape (2, 3, 6), 2) is (2, 2, 3, 3): head 0 = features 0-2, head 1 = features 3-5"
    ):
        out = call_student(g, "split_heads(x (2, 3, 6), 2)", split_heads, x, 2)
        g.expect(
            is_tensor(out) and out.shape == (2, 2, 3, 3) and out.dtype == x.dtype,
            f"expected float32 (B, H, T, D) = (2, 2, 3, 3), got {describe(out)}",
        )
        g.expect(
            torch.equal(out[:, 0], x[..., :3]) and torch.equal(out[:, 1], x[..., 3:]),
            f"head 0 should hold features 0-2 and head 1 features 3-5 of every token; x[0] is\n{x[0]}\n"
            f"your out[0] is\n{out[0]}",
        )
    with g.check(
        "split_heads(x (2, 3, 6), 4) and split_heads(x, 0) raise a ValueError naming n_heads and the width"
    ):
        _expect_error_naming(
            g,
            lambda: split_heads(x, 4),
            "split_heads(x (2, 3, 6), 4)",
            (4, 6),
            "name n_heads and the width",
            ordered=False,
        )
        _expect_error_naming(
            g,
            lambda: split_heads(x, 0),
            "split_heads(x (2, 3, 6), 0)",
            (0, 6),
            "name n_heads and the width",
            ordered=False,
        )
    with g.check("split_heads(x (3, 6), 2) raises a ValueError naming the shape"):
        _expect_error_naming(
            g,
            lambda: split_heads(x[0], 2),
            "split_heads(x (3, 6), 2)",
            (3, 6),
            "x must be (B, T, C): name the shape received",
        )
    g.finish()


def check_merge_heads(merge_heads) -> None:
    """Public checks of ``merge_heads``: one small fixed example per clause the hidden checks grade."""
    g = Grader("merge_heads (public)")
    x = torch.arange(36.0).view(2, 3, 6)  # (B=2, T=3, C=6)
    heads = ref.split_heads(x, 2)  # (2, 2, 3, 3), a transposed view: not contiguous
    with g.check(
        "merge_heads(split_heads(x, 2)) gives x (2, 3, 6) back, for contiguous and transposed heads"
    ):
        for what, h in (("contiguous heads", heads.contiguous()), ("transposed heads", heads)):
            out = call_student(g, f"merge_heads({what})", merge_heads, h)
            g.expect(
                is_tensor(out) and out.shape == (2, 3, 6) and out.dtype == x.dtype,
                f"with {what}: expected float32 (B, T, H*D) = (2, 3, 6), got {describe(out)}",
            )
            g.expect(
                torch.equal(out, x),
                f"with {what}: expected x[0] =\n{x[0]}\ngot\n{out[0]}\n(each token's heads "
                "side by side: transpose before reshaping)",
            )
    with g.check("merge_heads(x (2, 3, 6)) raises a ValueError naming the shape"):
        _expect_error_naming(
            g,
            lambda: merge_heads(x),
            "merge_heads(x (2, 3, 6))",
            (2, 3, 6),
            "x must be (B, H, T, D): name the shape received",
        )
    g.finish()


def check_repeat_kv(repeat_kv) -> None:
    """Public checks of ``repeat_kv``: one small fixed example per clause the hidden checks grade."""
    g = Grader("repeat_kv (public)")
    x = torch.stack([torch.zeros(3, 2), torch.ones(3, 2)])[
        None
    ]  # (B=1, H_kv=2, S=3, D=2): head 0 zeros, head 1 ones
    with g.check("repeat_kv(x with heads [0, 1], 2) has heads [0, 0, 1, 1]; repeat_kv(x, 1) is x"):
        out = call_student(g, "repeat_kv(x, 2)", repeat_kv, x, 2)
        g.expect(
            is_tensor(out) and out.shape == (1, 4, 3, 2),
            f"expected shape (B, H_kv * n_rep, S, D) = (1, 4, 3, 2), got {describe(out)}",
        )
        got = [int(out[0, h, 0, 0]) for h in range(4)]
        g.expect(
            got == [0, 0, 1, 1],
            f"heads should be [0, 0, 1, 1] (each key/value head repeated in place), got {got}",
        )
        same = call_student(g, "repeat_kv(x, 1)", repeat_kv, x, 1)
        g.expect(
            is_tensor(same) and torch.equal(same, x), f"repeat_kv(x, 1) should be x, got {describe(same)}"
        )
    with g.check(
        "attention over repeat_kv(k, 2) equals torch's enable_gqa=True; gradients sum over each group"
    ):
        q, k = tensor(1, 1, 4, 3, 2), tensor(2, 1, 2, 3, 2)
        rk = call_student(g, "repeat_kv(k, 2)", repeat_kv, k, 2)
        out, _ = att.scaled_dot_product_attention(q, rk, rk) if is_tensor(rk) else (None, None)
        g.expect(
            close(out, F.scaled_dot_product_attention(q, k, k, enable_gqa=True)),
            "attention with your repeated keys differs from enable_gqa=True",
        )
        p = probe(
            repeat_kv, k.clone().requires_grad_(), 2, backward=(None, torch.ones(1, 4, 3, 2, dtype=k.dtype))
        )
        grad = p.grads[0] if p.grads else None
        g.expect(
            grad is not None and close(grad, torch.full_like(k, 2.0)),
            "the gradient of x should be 2 everywhere (each key/value head serves 2 query heads)",
        )
    with g.check("repeat_kv(x (2, 3), 2) and repeat_kv(x, 0) raise ValueError"):
        expect_value_error(g, lambda: repeat_kv(x[0, 0], 2), "repeat_kv(x (3, 2), 2)", "x must be 4-D")
        expect_value_error(g, lambda: repeat_kv(x, 0), "repeat_kv(x, 0)", "n_rep must be at least 1")
    g.finish()


def check_multihead_attention(MultiHeadAttention) -> None:
    """Public checks of ``MultiHeadAttention``: one small fixed example per clause the hidden checks grade."""
    g = Grader("MultiHeadAttention (public)")
    x = tensor(31, 2, 5, 8, dtype=torch.float32)
    kv = tensor(32, 2, 3, 8, dtype=torch.float32)
    with g.check(
        "MultiHeadAttention(8, 2): attributes, qkv_proj 8 -> 24 and out_proj 8 -> 8, 288 parameters "
        "(256 with bias=False; qkv_proj 8 -> 16 with n_kv_heads=1)"
    ):
        for kwargs, n_expected in (({}, 288), ({"bias": False}, 256), ({"n_kv_heads": 1}, 216)):
            m = call_student(g, f"MultiHeadAttention(8, 2, **{kwargs})", MultiHeadAttention, 8, 2, **kwargs)
            sd = m.state_dict()
            n = sum(t.numel() for t in sd.values()) if isinstance(sd, dict) else -1
            g.expect(
                n == n_expected,
                f"MultiHeadAttention(8, 2, **{kwargs}) should have {n_expected} parameters, got {n}",
            )
        m = call_student(g, "MultiHeadAttention(8, 2)", MultiHeadAttention, 8, 2)
        for name, value in (
            ("d_model", 8),
            ("n_heads", 2),
            ("n_kv_heads", 2),
            ("d_head", 4),
            ("dropout", 0.0),
        ):
            got = getattr(m, name, None)
            g.expect(got == value, f"MultiHeadAttention(8, 2).{name} should be {value!r}, got {got!r}")

    def pair(config, **kwargs):
        return _Pair(g, MultiHeadAttention, config, **kwargs)

    with g.check("project: q (2, 2, 5, 4), k and v (2, 2, 3, 4) for x (2, 5, 8) and kv (2, 3, 8)"):
        p = pair((2, 4, 0, True, torch.float32, 41))
        got = call_student(g, "project(x, kv)", p.m.project, x, kv)
        with torch.no_grad():
            expected = p.r.project(x, kv)
        g.expect(
            isinstance(got, tuple) and len(got) == 3 and all(close(a, b) for a, b in zip(got, expected)),
            "project(x, kv) differs from the reference: q = x with qkv_proj's first C rows, k and v = kv with "
            "the rest, each split into heads",
        )
    with g.check(
        "self-attention with our weights: out (2, 5, 8), weights (2, 2, 5, 5); without need_weights=True "
        "the weights are None"
    ):
        p = pair((2, 4, 0, True, torch.float32, 42))
        _expect_forward(g, p, x)
        _expect_forward(g, p, x, need_weights=None)
    with g.check("cross-attention without bias: x (2, 5, 8), kv (2, 3, 8) give weights (2, 2, 5, 3)"):
        _expect_forward(g, pair((2, 4, 0, False, torch.float32, 43)), x, kv)
    with g.check(
        "key_padding_mask [[1, 1, 1], [1, 1, 0]] (True = real key); is_causal with kv (2, 7, 8): "
        "bottom-right aligned"
    ):
        p = pair((2, 4, 0, True, torch.float32, 44))
        _expect_forward(g, p, x, kv, key_padding_mask=torch.tensor([[True, True, True], [True, True, False]]))
        _expect_forward(g, p, x, tensor(33, 2, 7, 8, dtype=torch.float32), is_causal=True)
    with g.check(
        "is_causal with x (2, 3, 6) and kv (2, 5, 6) while torch's default device is meta: the mask is made on "
        "x's device"
    ):
        _causal_on_x_device(g, MultiHeadAttention, (2, 3, 0, True, torch.float64, 12), 2, 3, 5)
    with g.check("a boolean (5, 5) and a floating (2, 1, 5, 5) mask, alone and with is_causal"):
        p = pair((2, 4, 0, True, torch.float32, 45))
        _expect_forward(g, p, x, mask=att.causal_mask(5).T.contiguous())
        _expect_forward(g, p, x, mask=tensor(46, 2, 1, 5, 5, dtype=torch.float32), is_causal=True)
    with g.check("a query with no visible key gets out_proj's bias"):
        p = pair((2, 4, 0, True, torch.float32, 47))
        mask = torch.ones(5, 5, dtype=torch.bool)
        mask[2] = False
        _expect_forward(g, p, x, mask=mask)
    with g.check("grouped-query (n_kv_heads=2 of 4 heads) and multi-query (n_kv_heads=1) attention"):
        _expect_forward(g, pair((4, 2, 2, True, torch.float32, 48)), x)
        _expect_forward(g, pair((4, 2, 1, True, torch.float32, 49)), x, kv)
    with g.check("key_padding_mask of shape (2, 4) or dtype int64, and an int64 mask, raise ValueError"):
        p = pair((2, 4, 0, True, torch.float32, 50))
        for what, kwargs in (
            ("key_padding_mask (2, 4)", {"key_padding_mask": torch.ones(2, 4, dtype=torch.bool)}),
            ("key_padding_mask int64", {"key_padding_mask": torch.ones(2, 5, dtype=torch.int64)}),
            ("mask int64", {"mask": torch.ones(5, 5, dtype=torch.int64)}),
        ):
            expect_value_error(
                g, lambda kwargs=kwargs: p.m(x, **kwargs), what, "check the masks' dtypes and shapes"
            )
    with g.check(
        "dropout=0.25 in training mode: each weight 0 or scaled by 4/3, out computed from them, also "
        "without need_weights; none in eval mode"
    ):
        p = pair((2, 4, 0, True, torch.float64, 51), dropout=0.25, train=True)
        x64 = x.double()
        where, out, w = p.forward(g, x64, need_weights=True)
        _, w_r, mag = p.expected(x64)
        g.expect(
            is_tensor(w) and w.shape == w_r.shape and bool((w == 0).any()) and bool((w != 0).any()),
            "in training mode some (not all) attention weights must be zeroed",
        )
        g.expect(
            close(w[w != 0], w_r[w != 0] / 0.75, magnitude=mag),
            "a weight must be 0 or the weight without dropout times 1/(1-p) = 4/3",
        )
        with torch.no_grad():
            expected = p.r.out_proj(ref.merge_heads(w @ p.r.project(x64)[2]))
        g.expect(close(out, expected, magnitude=mag), "out must be computed from the weights after dropout")
        again, _ = _unpack(g, call_student(g, "forward(x) in training mode", p.m, x64), "forward")
        g.expect(
            not close(again, p.r(x64)[0].detach(), magnitude=mag),
            "with need_weights=False in training mode, out is the output without dropout: apply dropout whether "
            "or not the weights are returned",
        )
        call_student(g, "eval()", p.m.eval)
        where, _, w = p.forward(g, x64, need_weights=True)
        g.expect(
            not _dropout_shows(w, w_r, 0.25, mag),
            f"{where} in eval mode: dropout was applied (weights zeroed or scaled by 1/(1-p) = 4/3): apply "
            "dropout only when self.training",
        )
        _expect_forward(g, p, x64)
    with g.check("gradients with respect to x match the reference"):
        p = pair((2, 4, 0, True, torch.float64, 52))
        pr = probe(p.m, x.double().requires_grad_(), backward=(0, torch.ones(2, 5, 8, dtype=torch.float64)))
        xr = x.double().requires_grad_()
        p.r(xr)[0].sum().backward()
        g.expect(
            pr.grads is not None and pr.grads[0] is not None and close(pr.grads[0], xr.grad),
            "the gradient with respect to x differs from the reference",
        )
    g.finish()


# --------------------------------------------------------------------------- predict, then check


#: the choices of PARAMS_VS_HEADS: parameters of the 16-head layer over the 8-head one's
_PARAMS_CHOICES = {"a": 4.0, "b": 1.0, "c": 2.0, "d": 8.0}


def _params_vs_heads() -> str:
    """Parameters of MultiHeadAttention(1024, 16) against (512, 8), both with heads of width 64, as the letter
    of the nearest choice (in log space)."""

    def count(C: int, H: int) -> int:
        return sum(p.numel() for p in ref.MultiHeadAttention(C, H).parameters())

    # building the layers draws weights from torch's global generator: leave the student's seed alone
    with torch.random.fork_rng(devices=[]):
        ratio = count(1024, 16) / count(512, 8)
    return min(_PARAMS_CHOICES, key=lambda c: abs(math.log(ratio / _PARAMS_CHOICES[c])))


#: Question 5b's layer: query heads, key/value heads after the conversion, and a head width (the ratio asked
#: for does not depend on it, nor on the number of tokens)
KV_HEADS, KV_HEADS_GQA, KV_D = 40, 5, 16


def _int8(t: torch.Tensor) -> torch.Tensor:
    """``t`` quantised to int8 with one scale for the whole tensor (the scale is not counted)."""
    return (t / t.abs().max() * 127).round().to(torch.int8)


def _kv_shrink() -> float:
    """How many times more bytes the keys and values of a 40-head MHA layer take in float16 than those of the
    same layer with GQA (5 key/value heads), stored in int8."""
    x = torch.randn(1, 16, KV_HEADS * KV_D, generator=torch.Generator().manual_seed(0))  # (B, T, C)
    stored = {}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # the layers' weights: not the student's seed
        for n_kv, store in ((KV_HEADS, lambda t: t.to(torch.float16)), (KV_HEADS_GQA, _int8)):
            _, k, v = ref.MultiHeadAttention(KV_HEADS * KV_D, KV_HEADS, n_kv_heads=n_kv).project(x)
            cached = [store(t) for t in (k, v)]  # 2 x (1, H_kv, T, D)
            stored[n_kv] = sum(t.numel() * t.element_size() for t in cached)
    return stored[KV_HEADS] / stored[KV_HEADS_GQA]


PARAMS_VS_HEADS = Prediction(
    name="predict_params_vs_heads",
    question="Two layers have heads of the same width D = 64: MultiHeadAttention(512, 8) and "
    "MultiHeadAttention(1024, 16), whose 16 heads make C = 1024. How many parameters does the 16-head layer "
    "have compared with the 8-head one?",
    tests="the parameters depend on the width C only (4C^2 + 4C), not on how it is cut into heads; with a fixed "
    "head width, more heads make a wider layer",
    measure=_params_vs_heads,
    explanation="Answer {truth}. W_Q, W_K, W_V and W_O are each C x C plus a bias of C, 4C^2 + 4C parameters "
    "however the width is cut into heads. Here the heads stay 64 wide, so 16 heads make C = 1024 instead of "
    "512, and doubling C quadruples C^2: 4,198,400 against 1,050,624, just under 4 times because the biases "
    "only double. (b) carries 'heads add no parameters' over from a fixed C, but here the width grows with the "
    "heads; (c) counts a fixed set of parameters per head, but each head's slice of a projection is C x D and "
    "C doubled too; (d) gives every head its own C x C matrices, H C^2 instead of 4 C^2.",
    choices={
        "a": "about 4 times as many",
        "b": "the same number",
        "c": "about twice as many",
        "d": "about 8 times as many",
    },
)

KV_SHRINK = Prediction(
    name="predict_kv_shrink",
    question="A layer with 40 query heads uses multi-head attention (40 key/value heads) and a float16 KV "
    "cache. It is converted to grouped-query attention with 5 key/value heads, same width and head size, and "
    "its cache is stored in int8 (ignore the few bytes of quantisation scales). By what factor do the keys and "
    "values it must cache shrink?",
    tests="the KV cache is 2 L H_kv D T B x (bytes per value): proportional to H_kv and to the bytes of a "
    "stored value, not to the number of query heads",
    measure=_kv_shrink,
    explanation="The cache holds one key and one value vector of width D per key/value head and token, each "
    "entry in the cache's storage type: 2 L H_kv D T B x (bytes per value). Both factors change here: 40 -> 5 "
    "key/value heads divides it by 8, and float16 -> int8 (2 bytes -> 1) by 2, so it is {truth} times smaller. "
    "8 forgets the storage type, 2 the heads; the 40 query heads are not cached and do not enter. The two "
    "savings are independent and multiply: GQA (Ainslie et al., 2023) shares key/value heads, quantisation "
    "shrinks each stored value, at some cost in accuracy for each.",
)

check_predict_params_vs_heads, grade_predict_params_vs_heads = PARAMS_VS_HEADS.graders()
check_predict_kv_shrink, grade_predict_kv_shrink = KV_SHRINK.graders()


# --------------------------------------------------------------------------- experiment

#: the experiment's band around 1 - H_kv / H. With independent standard-normal heads the error is a
#: ratio of two sums of N = B H S D squares (N >= 8,192 below); its standard deviation is below
#: sqrt(2 / N) < 0.016, so 0.05 is over three of them for the smallest input and far more for the
#: others, while the classic mistakes land 0.125 or more away (pooling H_kv heads instead of H / H_kv,
#: pooling over tokens or features, an absolute instead of a relative error)
POOL_BAND = 0.05
POOL_CASES = ((8, 2, 101), (8, 1, 102), (8, 8, 103), (6, 3, 104), (6, 2, 105), (4, 2, 106))


def _pool(g: Grader, kv_pooling_error, k: torch.Tensor, n_kv: int, what: str = ""):
    where = f"kv_pooling_error(k {tuple(k.shape)}{what}, n_kv_heads={n_kv})"
    return where, call_student(g, where, kv_pooling_error, k, n_kv)


def grade_kv_pooling_error(kv_pooling_error) -> None:
    """Grade the experiment ``kv_pooling_error(k, n_kv_heads)``: the relative squared error of
    mean-pooling each group of H / H_kv consecutive heads, in a band around 1 - H_kv / H for
    independent heads, and exactly on structured keys."""
    g = Grader("kv_pooling_error")
    with g.check("returns a Python float"):
        where, e = _pool(g, kv_pooling_error, tensor(1, 2, 8, 16, 16), 2)
        g.expect(type(e) is float, f"{where} should return a Python float (use .item()), got {describe(e)}")
    with g.check(f"independent heads lose 1 - H_kv / H within {POOL_BAND} (H = 4, 6, 8; every H_kv)"):
        for H, n_kv, seed in POOL_CASES:
            k = tensor(seed, 2, H, 32, 16)  # (B, H, S, D)
            where, e = _pool(g, kv_pooling_error, k, n_kv, " independent normal heads")
            expect_in_band(
                g,
                where,
                e,
                1 - n_kv / H - POOL_BAND,
                1 - n_kv / H + POOL_BAND,
                "pool the n_rep = H / H_kv heads of each group into their mean (over the head axis only), give "
                "every head its group's mean, and divide the summed squared error by the summed squares of k",
            )
    with g.check("groups are consecutive heads: keys repeated as [a, a, b, b] lose nothing"):
        for H, n_kv, seed in ((4, 2, 111), (8, 2, 112), (6, 3, 113)):
            k = ref.repeat_kv(tensor(seed, 2, n_kv, 8, 4), H // n_kv)  # (B, H, S, D)
            where, e = _pool(g, kv_pooling_error, k, n_kv, " with heads [a, a, b, b]-style")
            g.expect(
                isinstance(e, float) and abs(e) < 1e-9,
                f"{where} gave {e!r}, expected 0: group g holds heads g * n_rep .. (g + 1) * n_rep - 1 (the "
                "repeat_kv layout), not every H_kv-th head",
            )
    with g.check("equals the reference on heads that partly agree (float32 and float64)"):
        for dtype, seed in ((torch.float64, 121), (torch.float32, 122)):
            base = tensor(seed, 3, 2, 8, 8, dtype=dtype)
            k = ref.repeat_kv(base, 4) + 0.5 * tensor(seed + 1, 3, 8, 8, 8, dtype=dtype)  # (B, H, S, D)
            where, e = _pool(g, kv_pooling_error, k, 2, f" {dtype_name(dtype)}")
            expected = ref.kv_pooling_error(k.double(), 2)
            g.expect(
                isinstance(e, float) and abs(e - expected) <= 1e-4 * max(expected, 1e-3),
                f"{where} gave {e!r}, expected {expected:.6g}: the squared error summed over everything, "
                "divided by the sum of k's squares",
            )
    with g.check("all-zero keys give 0.0 (no division by zero)"):
        where, e = _pool(g, kv_pooling_error, torch.zeros(1, 4, 3, 2, dtype=torch.float64), 2, " all zeros")
        g.expect(e == 0.0 and isinstance(e, float), f"{where} gave {e!r}, expected 0.0")
    with g.check("does not modify k"):
        k = tensor(131, 2, 4, 5, 3)
        try:
            after = probe(kv_pooling_error, k.clone(), 2).args[0]
        except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
            raise_unless_student_error(e)
            g.fail(f"kv_pooling_error(k (2, 4, 5, 3), 2): {raised(e)}")
        g.expect(
            is_tensor(after) and torch.equal(after, k),
            f"kv_pooling_error modified k in place: k was {show(k)}, afterwards {show(after)}",
        )
    with g.check("raises ValueError for k that is not 4-D or n_kv_heads that does not divide H"):
        _expect_error_naming(
            g,
            lambda: kv_pooling_error(tensor(141, 4, 5, 3), 2),
            "k (4, 5, 3) (not 4-D)",
            (4, 5, 3),
            "raise ValueError naming the shape that came, (4, 5, 3)",
        )
        for bad, n_kv, what in (
            (tensor(142, 1, 8, 5, 3), 3, "k (1, 8, 5, 3) and n_kv_heads=3"),
            (tensor(143, 1, 8, 5, 3), 0, "k (1, 8, 5, 3) and n_kv_heads=0"),
        ):
            expect_value_error(
                g,
                lambda bad=bad, n_kv=n_kv: kv_pooling_error(bad, n_kv),
                what,
                "name the shape or the head counts",
            )
    g.finish()


def check_kv_pooling_error(kv_pooling_error) -> None:
    """Public checks of ``kv_pooling_error``: the band for 8 heads into 2, and repeated heads."""
    g = Grader("kv_pooling_error (public)")
    with g.check(f"8 independent heads pooled into 2 lose 0.75 within {POOL_BAND}"):
        where, e = _pool(g, kv_pooling_error, tensor(0, 2, 8, 32, 16), 2, " independent normal heads")
        expect_in_band(
            g,
            where,
            e,
            0.75 - POOL_BAND,
            0.75 + POOL_BAND,
            "average each group of 4 heads, divide by sum(k^2)",
        )
    with g.check("heads [a, a, b, b] pooled into 2 lose nothing"):
        where, e = _pool(g, kv_pooling_error, ref.repeat_kv(tensor(1, 1, 2, 4, 3), 2), 2, " [a, a, b, b]")
        g.expect(isinstance(e, float) and abs(e) < 1e-9, f"{where} gave {e!r}, expected 0.0")
    g.finish()


# --------------------------------------------------------------------------- stretch

POOL_CONFIGS = (
    (8, 4, 2, True, torch.float64),
    (12, 6, 3, False, torch.float64),
    (8, 4, 1, True, torch.float32),
    (4, 1, 1, True, torch.float64),
)


def _pool_weights(g: Grader, pool_kv_heads, w, b, H: int, n_kv: int):
    bias = "bias" if b is not None else "None"
    where = f"pool_kv_heads(weight {tuple(w.shape)} {dtype_name(w.dtype)}, {bias}, {H}, {n_kv})"
    out = call_student(g, where, pool_kv_heads, w, b, H, n_kv)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        g.fail(f"{where} should return a pair (weight, bias), got {describe(out)}")
    return where, out[0], out[1]


def grade_pool_kv_heads(pool_kv_heads) -> None:
    """Grade the stretch part ``pool_kv_heads(qkv_weight, qkv_bias, n_heads, n_kv_heads)``."""
    g = Grader("pool_kv_heads")
    with g.check(
        "the q rows are kept and each group's key and value rows are averaged (with and without bias)"
    ):
        for seed, (C, H, n_kv, bias, dtype) in enumerate(POOL_CONFIGS):
            w = tensor(200 + seed, 3 * C, C, dtype=dtype)
            b = tensor(210 + seed, 3 * C, dtype=dtype) if bias else None
            where, got_w, got_b = _pool_weights(g, pool_kv_heads, w, b, H, n_kv)
            want_w, want_b = ref.pool_kv_heads(w, b, H, n_kv)
            g.expect(
                close(got_w, want_w),
                f"{where}: the weight {first_difference(got_w, want_w)}; keep the C query rows, then for each "
                "group the mean of its n_rep consecutive key heads' D rows, then the same for the values",
            )
            if bias:
                g.expect(close(got_b, want_b), f"{where}: the bias {first_difference(got_b, want_b)}")
            else:
                g.expect(
                    got_b is None,
                    f"{where}: with qkv_bias None the bias should be None, got {describe(got_b)}",
                )
    with g.check(
        "loaded into MultiHeadAttention(C, H, H_kv) it equals the MHA layer when heads in a group agree"
    ):
        C, H, n_kv = 8, 4, 2
        mha = ref.MultiHeadAttention(C, H).double()
        with torch.no_grad():  # make the key and value heads of each group identical
            w = mha.qkv_proj.weight
            for block in (1, 2):
                rows = w[block * C : (block + 1) * C].reshape(n_kv, H // n_kv, C // H, C)
                rows[:, 1:] = rows[:, :1].clone()
                w[block * C : (block + 1) * C] = rows.reshape(C, C)
            mha.qkv_proj.bias[C:] = 0.0
        where, got_w, got_b = _pool_weights(
            g, pool_kv_heads, mha.qkv_proj.weight.detach(), mha.qkv_proj.bias.detach(), H, n_kv
        )
        gqa = ref.MultiHeadAttention(C, H, n_kv_heads=n_kv).double()
        g.expect(
            is_tensor(got_w) and tuple(got_w.shape) == tuple(gqa.qkv_proj.weight.shape),
            f"{where} should give a weight {tuple(gqa.qkv_proj.weight.shape)}, got {describe(got_w)}",
        )
        with torch.no_grad():
            gqa.qkv_proj.weight.copy_(got_w)
            gqa.qkv_proj.bias.copy_(got_b)
            gqa.out_proj.load_state_dict(mha.out_proj.state_dict())
            x = tensor(220, 2, 5, C)
            want, got = mha(x, is_causal=True)[0], gqa(x, is_causal=True)[0]
        g.expect(close(got, want), f"{where}: the converted layer's output {first_difference(got, want)}")
    with g.check("does not modify its inputs"):
        w, b = tensor(230, 24, 8), tensor(231, 24)
        try:
            after = probe(pool_kv_heads, w.clone(), b.clone(), 4, 2).args
        except Exception as e:  # noqa: BLE001
            raise_unless_student_error(e)
            g.fail(f"pool_kv_heads(weight (24, 8), bias (24,), 4, 2): {raised(e)}")
        g.expect(
            torch.equal(after[0], w) and torch.equal(after[1], b),
            "pool_kv_heads modified its weight or bias in place",
        )
    with g.check("raises ValueError for a weight that is not (3C, C) or a head count that does not divide"):
        _expect_error_naming(
            g,
            lambda: pool_kv_heads(tensor(241, 24, 8), tensor(242, 16), 4, 2),
            "weight (24, 8) and bias (16,)",
            (16,),
            "name the bias shape that came, (16,)",
        )
        for w, b, H, n_kv, what in (
            (tensor(240, 16, 8), None, 4, 2, "weight (16, 8)"),
            (tensor(243, 24, 8), None, 3, 1, "n_heads=3 for C=8"),
            (tensor(243, 24, 8), None, 0, 1, "n_heads=0"),
            (tensor(244, 24, 8), None, 4, 3, "n_heads=4, n_kv_heads=3"),
            (tensor(244, 24, 8), None, 4, 0, "n_heads=4, n_kv_heads=0"),
        ):
            expect_value_error(g, lambda w=w, b=b, H=H, n_kv=n_kv: pool_kv_heads(w, b, H, n_kv), what)
    g.finish()


def check_pool_kv_heads(pool_kv_heads) -> None:
    """Public checks of ``pool_kv_heads``: the docstring's example."""
    g = Grader("pool_kv_heads (public)")
    with g.check("C = 4, H = 2, H_kv = 1: the weight goes from (12, 4) to (8, 4), the key rows averaged"):
        w = torch.arange(48, dtype=torch.float64).reshape(12, 4)
        where, got_w, got_b = _pool_weights(g, pool_kv_heads, w, None, 2, 1)
        want_w, _ = ref.pool_kv_heads(w, None, 2, 1)
        g.expect(close(got_w, want_w), f"{where}: {first_difference(got_w, want_w)}")
        g.expect(got_b is None, f"{where}: with qkv_bias None the bias should be None, got {describe(got_b)}")
    g.finish()

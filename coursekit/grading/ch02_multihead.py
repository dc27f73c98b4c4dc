"""Checks for Exercise 2 (multi-head attention): each graded part is a :class:`~coursekit.grading.spec.Spec`.

A part states each clause of its text once (:class:`~coursekit.grading.spec.Clause`: its name, its
test ``test(g, student, case)``, its drawn hidden inputs and its fixed examples); ``SPEC.graders()``
gives the two entry points the notebook calls: ``check_*`` runs every clause on its small examples
(the public checks), ``grade_*`` on inputs drawn across what the text allows (batch sizes, one head
and many, ``T != S``, every ``n_kv_heads`` that divides ``n_heads``, with and without bias, float32
and float64), compared with :mod:`coursekit.multihead`; a failed check names the smallest input that
shows the mistake. Generic clauses (an error, no change in place, the promised shape and dtype, the
reference's values) come from :mod:`coursekit.grading.spec`'s constructors.

The module part checks the names and shapes of the student's ``state_dict()``, then loads the same
random weights into the student's module and :class:`coursekit.multihead.MultiHeadAttention` (a
module that only works with its own initial weights does not pass). Its dropout is checked
deterministically: with ``need_weights=True`` in training mode every returned weight must be 0 or
the reference's divided by ``1 - p``, and the output must be computed from exactly those weights.

Over 500 lines: one clause per promise of the exercise text for each graded part, with the inputs
that provoke it and the common mistakes each hint names, and the module's comparison against the
reference on equal weights; splitting it would scatter one exercise's specification over files.
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
    said,
    show,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band
from coursekit.grading.spec import Call, Clause, Spec, matches, procedure, raises, returns, unchanged

#: the graded parts, by the names of their entry points ``check_<part>`` and ``grade_<part>``
_PARTS = ("split_heads", "merge_heads", "repeat_kv", "multihead_attention", "predict_params_vs_heads")
_PARTS += ("predict_kv_shrink", "kv_pooling_error", "pool_kv_heads")
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]

F64, F32 = torch.float64, torch.float32
FLOATS = st.sampled_from((F64, F32))  # the dtypes a drawn input comes in
LINEAR = "torch.nn.modules.linear.Linear"
SEEDS = st.integers(0, 2**31 - 1)


def _ints(*bounds: tuple[int, int]) -> list:
    """``st.integers(low, high)`` for each ``(low, high)``: the sizes of a case."""
    return [st.integers(low, high) for low, high in bounds]


# --------------------------------------------------------------------------- helpers


def _names(message: str, *numbers: int, ordered: bool = True) -> bool:
    """Whether ``message`` holds each of ``numbers`` (in order, if ``ordered``: a shape), each not as part of a
    longer number."""
    one = [rf"(?<![\d.]){abs(n)}(?![\d.])" for n in numbers]
    if ordered:
        return re.search(r"\D+".join(one), message) is not None
    return all(re.search(pattern, message) for pattern in one)


def _expect_error_naming(
    g: Grader, call, what: str, numbers: tuple[int, ...] | None, fix: str, ordered: bool = True
) -> None:
    """``call()`` must raise a ValueError whose message names ``numbers`` (a shape in order, or values;
    ``None``: any ValueError will do)."""
    messages = []

    def keep_message():
        try:
            return call()
        except ValueError as e:
            messages.append(said(e))
            raise

    expect_value_error(g, keep_message, what, fix)
    g.expect(
        numbers is None or _names(messages[0], *numbers, ordered=ordered),
        f"with {what} your ValueError says {messages[0][:160]!r}: {fix}",
    )


def _errors(g: Grader, fn, case) -> None:
    """A test of "raises ValueError" for ``case = (what, args, numbers, fix)``: ``fn(*args)`` with the
    tensors of ``args`` given as ``(seed, shape)``; ``numbers``: what the message must name (or None)."""
    what, args, numbers, fix = case
    values = [tensor(a[0], *a[1]) if isinstance(a, tuple) else a for a in args]
    _expect_error_naming(g, lambda: fn(*values), what, numbers, fix)


def _not_of_rank(g: Grader, fn, case) -> None:
    """A test of "raises a ValueError naming the shape" for ``case = (name, rank text, shape, *more)``:
    ``fn(x, *more)`` for ``x`` of ``shape``."""
    name, rank, shape, *more = case
    what = f"{name}(x {shape}{''.join(f', {m}' for m in more)})"
    fix = f"x must be {rank}; name the shape received, {shape}, in the message"
    _errors(g, fn, (what, ((len(shape), shape), *more), shape, fix))


def _unpack(g: Grader, result, what: str):
    g.expect(
        isinstance(result, tuple) and len(result) == 2,
        f"{what} must return a tuple (out, weights), got {describe(result)}",
    )
    return result


def _layout(x: torch.Tensor, contiguous: bool) -> torch.Tensor:
    """``x`` itself, or the same values in a non-contiguous layout (a transpose of a copy)."""
    return x if contiguous else x.transpose(0, -1).contiguous().transpose(0, -1)


#: the readable public example of Parts 1 and 2: x (B=2, T=3, C=6) holding 0 .. 35
ARANGE = "arange(36).view(2, 3, 6)"


# --------------------------------------------------------------------------- split_heads

#: B, T, H, D, dtype, seed, contiguous
SPLIT = st.tuples(*_ints((1, 3), (1, 5), (1, 4), (1, 4)), FLOATS, SEEDS, st.booleans())


def _split_call(case) -> Call:
    """A case of :data:`SPLIT`, or :data:`ARANGE` with 2 heads."""
    if case == ARANGE:
        return Call(f"split_heads(x = {ARANGE}, 2)", (torch.arange(36.0).view(2, 3, 6), 2))
    B, T, H, D, dtype, seed, contiguous = case
    x = _layout(tensor(seed, B, T, H * D, dtype=dtype), contiguous)
    return Call(f"split_heads(x {(B, T, H * D)} {dtype_name(dtype)}, {H})", (x, H))


def _split_mistakes(case, where: str) -> list:
    x, H = _split_call(case).args
    B, T, C = x.shape
    return [
        (
            x.reshape(B, T, C // H, H).permute(0, 3, 1, 2),
            f"{where}: head h got every H-th feature instead of a block of D neighbours: view the width as "
            "(H, D), x.view(B, T, H, D), not (D, H)",
        ),
        (
            x.reshape(B, H, T, C // H),
            f"{where}: reshaping (B, T, C) straight to (B, H, T, D) mixes features of different tokens: "
            "view as (B, T, H, D) first, then transpose(1, 2)",
        ),
    ]


def _split_bad_heads(g: Grader, split_heads, case) -> None:
    C, n_heads = case
    x, where = tensor(C, 2, 3, C), f"split_heads(x (2, 3, {C}), {n_heads})"
    fix = (
        f"{n_heads} heads cannot share {C} features; name n_heads={n_heads} and the width {C} in the message"
    )
    _expect_error_naming(g, lambda: split_heads(x, n_heads), where, (n_heads, C), fix, ordered=False)


SPLIT_HEADS = Spec(
    "split_heads",
    [
        returns(
            _split_call,
            lambda case: torch.empty(case[0], case[2], case[1], case[3], dtype=case[4]),
            SPLIT,
            text="returns (B, H, T, D) with D = C / H, in x's dtype",
            key="split.shape",
            examples=[(2, 5, 3, 4, torch.float64, 0, True)],
        ),
        matches(
            _split_call,
            lambda case: ref.split_heads(*_split_call(case).args),
            SPLIT,
            text="head h holds the contiguous features h*D .. (h+1)*D - 1 of every token",
            mistakes=_split_mistakes,
            key="split.values",
            budget="many",
            examples=[(2, 5, 3, 4, torch.float64, 1, True), ARANGE],
            advice=" (head h must be x[..., h*D:(h+1)*D])",
        ),
        Clause(
            "raises a ValueError naming n_heads and the width unless n_heads is a positive divisor of it",
            _split_bad_heads,
            st.tuples(st.integers(2, 12), st.integers(-3, 13)).filter(lambda c: c[1] < 1 or c[0] % c[1]),
            key="split.error",
            examples=[(12, 5), (12, 0)],
            also=[(12, 0), (12, -1), (12, -3), (6, 12)],
        ),
        Clause(
            "raises a ValueError naming the shape unless x is 3-D",
            _not_of_rank,
            examples=[("split_heads", "(B, T, C)", (4, 6), 2)],
            also=[("split_heads", "(B, T, C)", (2, 3, 2, 6), 2), ("split_heads", "(B, T, C)", (6,), 2)],
        ),
    ],
)
check_split_heads, grade_split_heads = SPLIT_HEADS.graders()


# --------------------------------------------------------------------------- merge_heads

#: B, H, T, D, dtype, seed, contiguous
MERGE = st.tuples(*_ints((1, 3), (1, 4), (1, 5), (1, 4)), FLOATS, SEEDS, st.booleans())


def _merge_call(case) -> Call:
    B, H, T, D, dtype, seed, contiguous = case
    x = _layout(tensor(seed, B, H, T, D, dtype=dtype), contiguous)
    return Call(
        f"merge_heads(x {(B, H, T, D)} {dtype_name(dtype)}{'' if contiguous else ', not contiguous'})", (x,)
    )


def _merge_mistakes(case, where: str) -> list:
    x = _merge_call(case).args[0]
    B, H, T, D = x.shape
    return [
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
    ]


def _merge_roundtrip(g: Grader, merge_heads, case) -> None:
    if case == ARANGE:  # the heads made contiguous: a layout the drawn cases (transposed views) lack
        y, H, where = torch.arange(36.0).view(2, 3, 6), 2, f"merge_heads(split_heads(y = {ARANGE}, 2))"
        heads = ref.split_heads(y, H).contiguous()
    else:
        B, T, H, D, seed = case
        y = tensor(seed, B, T, H * D)
        where, heads = f"merge_heads(split_heads(y {(B, T, H * D)}, {H}))", ref.split_heads(y, H)
    out = call_student(g, where, merge_heads, heads)
    g.expect(
        is_tensor(out) and out.shape == y.shape and torch.equal(out, y),
        f"{where} should give y back: {first_difference(out, y)}",
    )


MERGE_HEADS = Spec(
    "merge_heads",
    [
        returns(
            _merge_call,
            lambda case: torch.empty(case[0], case[2], case[1] * case[3], dtype=case[4]),
            MERGE,
            text="returns (B, T, H * D) in x's dtype, whatever x's memory layout",
            key="merge.shape",
            examples=[(2, 3, 5, 4, torch.float64, 0, True)],
        ),
        matches(
            _merge_call,
            lambda case: ref.merge_heads(_merge_call(case).args[0]),
            MERGE,
            text="token t holds the features of head 0, then head 1, ... (x[b, :, t] side by side)",
            mistakes=_merge_mistakes,
            key="merge.values",
            budget="many",
            examples=[(2, 3, 5, 4, torch.float64, 1, False)],
            advice=" (merge_heads(x)[b, t] must be the concatenation x[b, 0, t], x[b, 1, t], ...)",
        ),
        Clause(
            "undoes split_heads: merge_heads(split_heads(y, H)) is y for every H",
            _merge_roundtrip,
            st.tuples(*_ints((1, 3), (1, 5), (1, 4), (1, 4)), SEEDS),
            key="merge.roundtrip",
            budget="some",
            examples=[(2, 4, 3, 4, 2), ARANGE],
        ),
        Clause(
            "raises a ValueError naming the shape unless x is 4-D",
            _not_of_rank,
            examples=[("merge_heads", "(B, H, T, D)", (2, 7, 12))],
            also=[("merge_heads", "(B, H, T, D)", (2, 3, 4, 2, 5)), ("merge_heads", "(B, H, T, D)", (5, 6))],
        ),
    ],
)
check_merge_heads, grade_merge_heads = MERGE_HEADS.graders()


# --------------------------------------------------------------------------- repeat_kv

#: B, H_kv, S, D, n_rep, dtype, seed
REPEAT = st.tuples(*_ints((1, 2), (1, 3), (1, 5), (1, 3), (1, 4)), FLOATS, SEEDS)
#: the readable public example: heads [0, 1] (all zeros, all ones), x (B=1, H_kv=2, S=3, D=2)
HEADS_01 = "heads [0, 1]"


def _repeat_call(case) -> Call:
    if case == HEADS_01:
        x = torch.stack([torch.zeros(3, 2), torch.ones(3, 2)])[None]
        return Call("repeat_kv(x (1, 2, 3, 2) with heads [0, 1], 2)", (x, 2))
    B, H_kv, S, D, n_rep, dtype, seed = case
    return Call(
        f"repeat_kv(x {(B, H_kv, S, D)} {dtype_name(dtype)}, {n_rep})",
        (tensor(seed, B, H_kv, S, D, dtype=dtype), n_rep),
    )


def _repeat_mistakes(case, where: str) -> list:
    x, n_rep = _repeat_call(case).args
    return [
        (
            x.repeat(1, n_rep, 1, 1),
            f"{where}: the groups are wrong: heads [a, b] with n_rep=2 must become [a, a, b, b] (consecutive "
            "query heads share a key/value head), not [a, b, a, b]; use repeat_interleave(n_rep, dim=1), "
            "not repeat",
        ),
    ]


def _repeat_gqa(g: Grader, repeat_kv, case) -> None:
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
    g.expect(
        close(out, F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
        f"{where}: attention with your repeated keys and values differs from "
        "enable_gqa=True: query head h must read key/value head h // n_rep",
    )


def _repeat_grads(g: Grader, repeat_kv, case) -> None:
    B, H_kv, S, D, n_rep, seed = case
    x = tensor(seed, B, H_kv, S, D)
    upstream = tensor(seed + 1, B, H_kv * n_rep, S, D)
    where = f"repeat_kv(x {tuple(x.shape)}, {n_rep})"
    p = call_student(g, where, probe, repeat_kv, x.clone().requires_grad_(), n_rep, backward=(None, upstream))
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


REPEAT_KV = Spec(
    "repeat_kv",
    [
        returns(
            _repeat_call,
            lambda case: torch.empty(case[0], case[1] * case[4], case[2], case[3], dtype=case[5]),
            REPEAT,
            text="returns (B, H_kv * n_rep, S, D) in x's dtype",
            key="repeat.shape",
            examples=[(2, 2, 5, 3, 3, torch.float64, 0)],
        ),
        matches(
            _repeat_call,
            lambda case: ref.repeat_kv(*_repeat_call(case).args),
            REPEAT,
            text="output head h is input head h // n_rep: [a, b] becomes [a, a, b, b]; n_rep = 1 gives x's "
            "values",
            mistakes=_repeat_mistakes,
            key="repeat.values",
            budget="many",
            examples=[(2, 2, 5, 3, 2, torch.float64, 1), HEADS_01],
            also=[(2, 3, 4, 2, 1, torch.float64, 7)],  # n_rep = 1: x's values
            advice=" (output head h must be input head h // n_rep; with n_rep = 1, x's values)",
        ),
        Clause(
            "attention over the repeated heads equals torch's scaled_dot_product_attention(enable_gqa=True)",
            _repeat_gqa,
            st.tuples(*_ints((1, 2), (1, 3), (1, 4), (1, 5), (1, 4), (1, 3)), SEEDS),
            key="repeat.gqa",
            budget="some",
            examples=[(2, 2, 4, 7, 5, 3, 2)],
        ),
        Clause(
            "gradients reach every key/value head: each collects the sum over its group of n_rep heads",
            _repeat_grads,
            st.tuples(*_ints((1, 2), (1, 3), (1, 3), (1, 3), (1, 3)), SEEDS),
            key="repeat.grad",
            budget="handful",
            examples=[(1, 2, 3, 4, 3, 3)],
        ),
        raises(
            lambda case: Call(
                f"repeat_kv(x {case[0]}, {case[1]})", (tensor(len(case[0]), *case[0]), case[1])
            ),
            text="raises ValueError unless x is 4-D and n_rep >= 1",
            fix="x must be (B, H_kv, S, D) and n_rep >= 1; say what was expected and what came",
            examples=[((2, 3, 4), 2)],
            also=[((2, 3, 4, 2, 2), 2), ((2, 3, 4, 2), 0), ((2, 3, 4, 2), -1)],
        ),
    ],
)
check_repeat_kv, grade_repeat_kv = REPEAT_KV.graders()


# --------------------------------------------------------------------------- the module


def _n_kv_heads(H: int, kv: int) -> int | None:
    """The n_kv_heads argument of a configuration: None (the default) for ``kv = 0``, else a divisor of H."""
    divisors = [d for d in range(1, H + 1) if H % d == 0]
    return None if kv == 0 else divisors[(kv - 1) % len(divisors)]


#: H, D, key/value heads (0: the default, else an index into H's divisors), bias, dtype, seed
CONFIG = (st.sampled_from([1, 2, 3, 4, 6]), *_ints((1, 3), (0, 3)), st.booleans(), FLOATS, SEEDS)


class _Pair:
    """The student's module and coursekit's, holding the same random weights of ours."""

    def __init__(self, g: Grader, MultiHeadAttention, config, dropout: float = 0.0, train: bool = False):
        H, D, kv, bias, dtype, seed = config
        self.H, self.D, self.C, self.dtype = H, D, H * D, dtype
        self.n_kv = _n_kv_heads(H, kv)
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
            if isinstance(value, torch.Tensor):
                kind = "boolean" if value.dtype == torch.bool else dtype_name(value.dtype)
                text += f", {key}={kind} {tuple(value.shape)}"
            elif value is not None:
                text += f", {key}={value!r}"
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


def _pair(g: Grader, MultiHeadAttention, case, S: int | None = None):
    """The pair of a case (a configuration, then B and T) and its inputs x (B, T, C) and kv (B, S, C) or None."""
    p = _Pair(g, MultiHeadAttention, case[:6])
    return (p, *p.inputs(case[5], case[6], case[7], S))


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
    # on the CPU: the device is right; the rest is its own clause
    expected = p.expected(x, kv, is_causal=True)[0]
    g.expect(
        close(out, expected), f"{where}: out differs from the reference: {first_difference(out, expected)}"
    )


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
    r, n_rep, T, S = p.r, p.H // p.H_kv, x.shape[1], (x if kv is None else kv).shape[1]
    user, padding, causal = kwargs.get("mask"), kwargs.get("key_padding_mask"), kwargs.get("is_causal")
    mask = r._combine_masks(user, padding, causal, x.shape[0], T, S, x)
    out = []

    def add(wrong, hint: str) -> None:
        out.append((wrong, f"{where}: {hint}"))

    def out_of(q, k, v, scale=None):
        return r.out_proj(
            ref.merge_heads(att.scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)[0])
        )

    with torch.no_grad():
        q, k, v = r.project(x, kv)
        rk, rv = ref.repeat_kv(k, n_rep), ref.repeat_kv(v, n_rep)
        add(
            out_of(q, rk, rv, scale=1 / math.sqrt(p.C)),
            f"the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = C / H = {p.D}, "
            "not the model width",
        )
        add(
            ref.merge_heads(att.scaled_dot_product_attention(q, rk, rv, mask=mask)[0]),
            "out is the merged heads without the output projection: apply out_proj after merge_heads",
        )
        if p.H_kv == p.H and kv is None:
            add(
                out_of(k, q, v),
                "queries and keys are swapped: qkv_proj's output is [q (C) | k (H_kv D) | v (H_kv D)], split "
                "it in that order",
            )
        if 1 < p.H_kv < p.H:
            add(
                out_of(q, k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)),
                "the groups are wrong: query head h must read key/value head h // (H / H_kv), so repeat each "
                "key/value head with repeat_interleave (repeat_kv), not repeat",
            )
        if kv is not None and S == T:
            _, kx, vx = r.project(x)
            add(
                out_of(q, ref.repeat_kv(kx, n_rep), ref.repeat_kv(vx, n_rep)),
                "the keys and values come from x: in cross-attention they come from kv",
            )
        if user is not None and user.dtype == torch.bool:
            add(
                r(x, kv, **{**kwargs, "mask": ~user})[0],
                "a boolean mask is inverted: True means the query *may attend* to the key",
            )
        elif user is not None:
            add(
                r(x, kv, **{**kwargs, "mask": None})[0],
                "the floating mask was ignored: it is added to the scores",
            )
        if user is not None and (padding is not None or causal):
            add(
                r(x, kv, mask=user)[0],
                "only the mask was applied: key_padding_mask and is_causal must be combined with it (every part "
                "can remove a key)",
            )
        if padding is not None:
            add(
                r(x, kv, **{**kwargs, "key_padding_mask": ~padding})[0],
                "key_padding_mask is inverted: in this course True marks a real key and False padding "
                "(nn.MultiheadAttention uses the opposite)",
            )
        if causal:
            without = {**kwargs, "is_causal": False}
            add(
                r(x, kv, **without)[0],
                "is_causal=True was ignored: combine causal_mask(T, S) with the other masks",
            )
        if causal and S != T and user is None:
            add(
                r(x, kv, **{**without, "mask": torch.ones(T, S, dtype=torch.bool).tril()})[0],
                "the causal mask is aligned to the top-left: use causal_mask(T, S), whose last query sees every "
                "key (bottom-right aligned)",
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


def _mha_layers(g: Grader, MultiHeadAttention, case) -> None:
    H, D, kv, bias, _, p = case
    C = H * D
    n_kv = _n_kv_heads(H, kv)
    H_kv = H if n_kv is None else n_kv
    call = f"MultiHeadAttention({C}, {H}, n_kv_heads={n_kv}, bias={bias}, dropout={p})"
    m = call_student(g, call, MultiHeadAttention, C, H, n_kv_heads=n_kv, bias=bias, dropout=p)
    for name, value in (("d_model", C), ("n_heads", H), ("n_kv_heads", H_kv), ("d_head", D), ("dropout", p)):
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


def _mha_project(g: Grader, MultiHeadAttention, case) -> None:
    p, x, kv = _pair(g, MultiHeadAttention, case, case[8] if case[9] else None)
    where = p.where(x, kv) + ": project"
    got = call_student(g, where, p.m.project, *((x,) if kv is None else (x, kv)))
    with torch.no_grad():
        expected = p.r.project(x, kv)
    g.expect(isinstance(got, tuple) and len(got) == 3, f"{where} must return (q, k, v), got {describe(got)}")
    layout = (
        " (queries come from x with the first C rows of qkv_proj, keys and values from kv with the rest)"
        if kv is not None
        else " (qkv_proj's output is [q (C) | k (H_kv D) | v (H_kv D)])"
    )
    for name, a, b in zip("qkv", got, expected):
        g.expect(
            is_tensor(a) and a.shape == b.shape and a.dtype == b.dtype,
            f"{where}: {name} should be {describe(b)}, got {describe(a)}",
        )
        g.expect(
            close(a, b, magnitude=magnitude(x, kv)),
            f"{where}: {name} differs from the reference: {first_difference(a, b)}{layout}",
        )


def _mha_padding(g: Grader, MultiHeadAttention, case) -> None:
    seed, B, T, S, cross = case[5:]
    p, x, kv = _pair(g, MultiHeadAttention, case, S if cross else None)
    S = S if cross else T
    keep = tensor(seed + 2, B, S) > -0.5
    keep[:, seed % S] = True
    _expect_forward(g, p, x, kv, key_padding_mask=keep)


def _mha_causal(g: Grader, MultiHeadAttention, case) -> None:
    p, x, kv = _pair(g, MultiHeadAttention, case, case[7] + case[8] if case[9] else None)
    _expect_forward(g, p, x, kv, is_causal=True)


def _padding(seed: int, B: int, S: int) -> torch.Tensor:
    """A key_padding_mask (B, S) that keeps key 0 (as the mask keeps it) and about 84% of the others."""
    keep = tensor(seed + 5, B, S) > -1.0
    keep[:, 0] = True
    return keep


def _mha_mask(g: Grader, MultiHeadAttention, case) -> None:
    seed, B, T, extra, kind, keep, drop, with_padding, with_causal = case[5:]
    S = T + extra
    p, x, kv = _pair(g, MultiHeadAttention, case, S if extra else None)
    shape = tuple(n if k else 1 for n, k in zip((B, p.H, T, S), keep))[min(drop, 3) :]
    mask = tensor(seed + 3, *shape) > -0.5
    mask[..., 0] = True  # key 0 stays visible to every query (is_causal keeps it too)
    if kind == "float":
        mask = tensor(seed + 4, *shape, dtype=p.dtype).masked_fill(~mask, -math.inf)
    padding = {"key_padding_mask": _padding(seed, B, S)} if with_padding else {}
    _expect_forward(g, p, x, kv, mask=mask, **padding, **({"is_causal": True} if with_causal else {}))


def _mha_mask_dtype(g: Grader, MultiHeadAttention, case) -> None:
    """A floating mask of another dtype than x (float32 for float64 inputs, or the reverse), alone or with
    a key_padding_mask: it is added to the scores in x's dtype."""
    seed, B, T, mask_dtype, with_padding = case[5:]
    p, x, _ = _pair(g, MultiHeadAttention, case)
    padding = {"key_padding_mask": _padding(seed, B, T)} if with_padding else {}
    kwargs = {"mask": tensor(seed + 4, 1, 1, T, T, dtype=mask_dtype), **padding}
    where = p.where(x, **kwargs)
    try:
        p.m(x.clone(), **{k: v.clone() for k, v in kwargs.items()}, need_weights=True)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(
            f"{where}: {raised(e)}: a floating mask may come in another dtype than x "
            f"({dtype_name(mask_dtype)} here, x {dtype_name(p.dtype)}): convert it to x's dtype before "
            "adding it (mask.to(x.dtype))"
        )
    _expect_forward(g, p, x, **kwargs)


def _mha_empty(g: Grader, MultiHeadAttention, case) -> None:
    seed, B, T, boolean = case[5:]
    p, x, _ = _pair(g, MultiHeadAttention, case)
    row = seed % T
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


def _mha_count(g: Grader, MultiHeadAttention, case) -> None:
    kwargs, expected = case
    where = f"MultiHeadAttention(8, 2{''.join(f', {k}={v}' for k, v in kwargs.items())})"
    sd = call_student(g, where, MultiHeadAttention, 8, 2, **kwargs).state_dict()
    n = sum(t.numel() for t in sd.values()) if isinstance(sd, dict) else describe(sd)
    g.expect(n == expected, f"{where} should have {expected} parameters (4 C^2 + 4 C for MHA), got {n}")


def _mha_bad_mask(case) -> Call:
    """``case``: the argument's name, dtype, shape and fill value."""
    name, dtype, shape, fill = case
    kind = "boolean" if dtype == torch.bool else str(dtype) if dtype == torch.int64 else dtype_name(dtype)
    return Call(
        f"MultiHeadAttention(12, 4) on x (2, 5, 12) with {name}={kind} {shape}",
        (tensor(7, 2, 5, 12),),
        {name: torch.full(shape, fill, dtype=dtype)},
        build=lambda g, M: call_student(
            g,
            "MultiHeadAttention(12, 4).to(float64)",
            call_student(g, "MultiHeadAttention(12, 4)", M, 12, 4).to,
            torch.float64,
        ),
    )


def _mha_dropout(g: Grader, MultiHeadAttention, case) -> None:
    config, p_drop, T = case
    pair = _Pair(g, MultiHeadAttention, config, dropout=p_drop, train=True)
    x, _ = pair.inputs(config[-1], 2, T)
    if not p_drop:  # dropout 0 in training mode: the output without dropout
        _expect_forward(g, pair, x)
        return
    where, out, w = pair.forward(g, x, need_weights=True)
    _, w_r, mag = pair.expected(x)
    g.expect(
        is_tensor(w) and w.shape == w_r.shape,
        f"{where} in training mode: weights should be {tuple(w_r.shape)}, got {describe(w)}",
    )
    kept = w != 0
    with torch.no_grad():
        _, _, v = pair.r.project(x)
        expected = pair.r.out_proj(ref.merge_heads(w @ ref.repeat_kv(v, pair.H // pair.H_kv)))
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
            f"{where} in eval mode: dropout was applied (some weights were zeroed): apply dropout only when "
            "self.training"
        )
    # no weight is 0 here: a dropout applied in eval mode shows as weights scaled by 1/(1-p)
    g.expect(
        close(out, out_r, magnitude=mag)
        or close(w, w_r, magnitude=mag)
        or not close(w, w_r / (1 - p_drop), magnitude=mag),
        f"{where} in eval mode: dropout was applied (the weights were scaled by 1/(1-p) = "
        f"{1 / (1 - p_drop):.4g}): apply dropout only when self.training",
    )
    g.expect(
        close(out, out_r, magnitude=mag),
        f"{where} in eval mode: out differs from the reference, which applies no dropout in eval mode",
    )


def _mha_grads(g: Grader, MultiHeadAttention, case) -> None:
    seed, B, T, extra, cross = case[5:]
    p, x, kv = _pair(g, MultiHeadAttention, case, T + extra if cross else None)
    upstream = tensor(seed + 9, B, T, p.C, dtype=p.dtype)
    where = p.where(x, kv, is_causal=True)
    args = [t.clone().requires_grad_() for t in ((x,) if kv is None else (x, kv))]
    pr = call_student(g, where, probe, p.m, *args, is_causal=True, backward=(0, upstream))
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


MULTIHEAD_ATTENTION = Spec(
    "MultiHeadAttention",
    [
        Clause(
            "__init__ stores d_model, n_heads, n_kv_heads, d_head and dropout, and creates the nn.Linear "
            "qkv_proj (C -> C + 2 H_kv D) and out_proj (C -> C), with biases only if bias=True",
            _mha_layers,
            st.tuples(*CONFIG[:5], st.sampled_from([0.0, 0.1, 0.5])),
            key="mha.layers",
            examples=[(4, 3, 0, True, F64, 0.0)],
        ),
        Clause(
            "project(x, kv=None) returns q (B, H, T, D), k and v (B, H_kv, S, D): all three from x, or q from "
            "x and k, v from kv",
            _mha_project,
            st.tuples(*CONFIG, *_ints((1, 2), (1, 4), (1, 5)), st.booleans()),
            key="mha.project",
            examples=[(4, 3, 0, True, F64, 0, 2, 4, 6, True)],
        ),
        Clause(
            "self-attention: out (B, T, C) and per-head weights (B, H, T, T) as the reference's, any "
            "n_kv_heads dividing n_heads (MHA, GQA, MQA); need_weights=False, the default, returns (out, None)",
            lambda g, M, case: _expect_forward(g, *_pair(g, M, case), need_weights=case[8]),
            st.tuples(*CONFIG, *_ints((1, 2), (1, 5)), st.sampled_from([True, False, None])),
            key="mha.self",
            budget="more",
            examples=[(4, 3, 0, True, F64, 1, 2, 5, True)],
            also=[
                (4, 2, 2, True, F64, 12, 2, 4, True),  # GQA: 2 key/value heads for 4 query heads
                (6, 2, 3, False, torch.float32, 13, 1, 3, None),  # 3 key/value heads for 6
            ],
        ),
        Clause(
            "cross-attention: queries from x (T), keys and values from kv (S != T), with or without bias",
            lambda g, M, case: _expect_forward(g, *_pair(g, M, case, case[8])),
            st.tuples(*CONFIG, *_ints((1, 2), (1, 4), (1, 6))),
            key="mha.cross",
            budget="more",
            examples=[(4, 3, 0, False, F64, 2, 2, 4, 6)],
            also=[(4, 2, 2, False, F64, 14, 2, 3, 5)],  # GQA without bias
        ),
        Clause(
            "key_padding_mask (B, S): True marks a real key, False a padded one that gets no weight",
            _mha_padding,
            st.tuples(*CONFIG, *_ints((1, 2), (1, 4), (1, 6)), st.booleans()),
            key="mha.padding",
            examples=[(4, 3, 0, True, F64, 3, 2, 5, 5, False)],
        ),
        Clause(
            "is_causal=True adds causal_mask(T, S): bottom-right aligned when S != T",
            _mha_causal,
            st.tuples(*CONFIG, *_ints((1, 2), (1, 5), (0, 3)), st.booleans()),
            key="mha.causal",
            examples=[(4, 3, 0, True, F64, 4, 2, 6, 0, False)],
        ),
        Clause(
            "is_causal builds its mask on x's device, not on torch's default device",
            lambda g, M, case: _causal_on_x_device(g, M, *case),
            examples=[((2, 3, 0, True, F64, 11), 2, 3, 5)],
        ),
        Clause(
            "mask, boolean or floating and broadcastable to (B, H, T, S), alone and combined with "
            "key_padding_mask and is_causal",
            _mha_mask,
            st.tuples(
                *CONFIG,
                *_ints((1, 2), (1, 4), (0, 2)),
                st.sampled_from(["bool", "float"]),
                st.lists(st.booleans(), min_size=4, max_size=4),
                st.integers(0, 3),
                st.booleans(),
                st.booleans(),
            ),
            key="mha.mask",
            budget="many",
            examples=[(4, 3, 0, True, F64, 5, 2, 5, 0, "bool", [True] * 4, 0, False, False)],
            also=[
                (4, 2, 2, True, F64, 15, 2, 4, 1, "float", [True, True, False, True], 0, True, True)
            ],  # GQA
        ),
        Clause(
            "a floating mask of another dtype than x (float32 on float64 inputs, float64 on float32 ones) "
            "is added in x's dtype",
            _mha_mask_dtype,
            examples=[(4, 3, 0, True, F64, 16, 2, 5, torch.float32, False)],
            also=[(4, 2, 2, False, torch.float32, 17, 2, 4, F64, True)],
        ),
        Clause(
            "a query with no visible key gets a zero attention output (out is out_proj's bias), not NaN",
            _mha_empty,
            st.tuples(*CONFIG, *_ints((1, 2), (1, 5)), st.booleans()),
            key="mha.empty",
            budget="some",
            examples=[(4, 3, 0, True, F64, 6, 2, 4, True)],
        ),
        raises(
            _mha_bad_mask,
            text="raises ValueError for a key_padding_mask that is not a boolean (B, S) tensor, and for a mask "
            "that is neither boolean nor floating",
            fix="key_padding_mask must be a boolean (B, S) tensor, mask boolean or floating",
            examples=[("key_padding_mask", torch.int64, (2, 5), 1)],
            also=[
                ("key_padding_mask", F64, (2, 5), 0),
                ("key_padding_mask", torch.bool, (2, 4), True),
                ("key_padding_mask", torch.bool, (1, 5), True),
                ("key_padding_mask", torch.bool, (5,), True),
                ("mask", torch.int64, (5, 5), 1),
            ],
        ),
        Clause(
            "dropout: in training mode each attention weight is zeroed with probability p and the others are "
            "scaled by 1/(1-p), out is computed from those weights; no dropout in eval mode or with p = 0",
            _mha_dropout,
            examples=[((4, 3, 0, True, F64, 8), 0.3, 6)],
            also=[((2, 2, 1, False, torch.float32, 9), 0.6, 6), ((4, 3, 0, True, F64, 10), 0.0, 5)],
        ),
        Clause(
            "gradients with respect to x and kv match the reference",
            _mha_grads,
            st.tuples(*CONFIG[:4], st.just(F64), SEEDS, *_ints((1, 2), (1, 4), (0, 2)), st.booleans()),
            key="mha.grad",
            budget="handful",
            examples=[(4, 3, 2, True, F64, 11, 2, 4, 0, False)],
        ),
    ],
    extra_public=[
        Clause(
            "MultiHeadAttention(8, 2) has 288 parameters, 256 with bias=False, 216 with n_kv_heads=1",
            _mha_count,
            examples=[({}, 288), ({"bias": False}, 256), ({"n_kv_heads": 1}, 216)],
        )
    ],
)
check_multihead_attention, grade_multihead_attention = MULTIHEAD_ATTENTION.graders("multihead_attention")


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


def _kv_shrink() -> float:
    """How many times more bytes the keys and values of a 40-head MHA layer take in float16 than those of the
    same layer with GQA (5 key/value heads), stored in int8."""
    x = torch.randn(1, 16, KV_HEADS * KV_D, generator=torch.Generator().manual_seed(0))  # (B, T, C)
    stored = {}
    # int8: one scale for the whole tensor (the scale is not counted)
    int8 = lambda t: (t / t.abs().max() * 127).round().to(torch.int8)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # the layers' weights: not the student's seed
        for n_kv, store in ((KV_HEADS, lambda t: t.to(torch.float16)), (KV_HEADS_GQA, int8)):
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


def _pooling_float(g: Grader, kv_pooling_error, case) -> None:
    seed, shape, n_kv = case
    where, e = _pool(g, kv_pooling_error, tensor(seed, *shape), n_kv)
    g.expect(type(e) is float, f"{where} should return a Python float (use .item()), got {describe(e)}")


def _pooling_band(g: Grader, kv_pooling_error, case) -> None:
    H, n_kv, seed = case
    where, e = _pool(g, kv_pooling_error, tensor(seed, 2, H, 32, 16), n_kv, " independent normal heads")
    how = (
        "pool the n_rep = H / H_kv heads of each group into their mean (over the head axis only), give "
        "every head its group's mean, and divide the summed squared error by the summed squares of k"
    )
    expect_in_band(g, where, e, 1 - n_kv / H - POOL_BAND, 1 - n_kv / H + POOL_BAND, how)


def _pooling_repeated(g: Grader, kv_pooling_error, case) -> None:
    H, n_kv, seed = case
    k = ref.repeat_kv(tensor(seed, 2, n_kv, 8, 4), H // n_kv)  # (B, H, S, D)
    where, e = _pool(g, kv_pooling_error, k, n_kv, " with heads [a, a, b, b]-style")
    g.expect(
        isinstance(e, float) and abs(e) < 1e-9,
        f"{where} gave {e!r}, expected 0: group g holds heads g * n_rep .. (g + 1) * n_rep - 1 (the "
        "repeat_kv layout), not every H_kv-th head",
    )


def _agreeing_heads(case) -> torch.Tensor:
    """Keys (3, 8, 8, 8) whose heads partly agree: each group of 4 shares a part."""
    dtype, seed = case
    shared = ref.repeat_kv(tensor(seed, 3, 2, 8, 8, dtype=dtype), 4)  # (B, H, S, D)
    return shared + 0.5 * tensor(seed + 1, 3, 8, 8, 8, dtype=dtype)


def _pooling_zeros(g: Grader, kv_pooling_error, shape) -> None:
    where, e = _pool(g, kv_pooling_error, torch.zeros(shape, dtype=torch.float64), 2, " all zeros")
    g.expect(e == 0.0 and isinstance(e, float), f"{where} gave {e!r}, expected 0.0")


_NAMING, _COUNTS = "raise ValueError naming the shape that came,", "name the shape or the head counts"

KV_POOLING_ERROR = Spec(
    "kv_pooling_error",
    [
        Clause("returns a Python float", _pooling_float, examples=[(1, (2, 8, 16, 16), 2)]),
        Clause(
            f"independent heads lose 1 - H_kv / H within {POOL_BAND} (H = 4, 6, 8; every H_kv)",
            _pooling_band,
            examples=POOL_CASES[:1],
            also=POOL_CASES[1:],
        ),
        Clause(
            "groups are consecutive heads: keys repeated as [a, a, b, b] lose nothing",
            _pooling_repeated,
            examples=[(4, 2, 111)],
            also=[(8, 2, 112), (6, 3, 113)],
        ),
        procedure(
            lambda case: Call(
                f"kv_pooling_error(k {(3, 8, 8, 8)} {dtype_name(case[0])}, n_kv_heads=2)",
                (_agreeing_heads(case), 2),
            ),
            lambda case: ref.kv_pooling_error(_agreeing_heads(case).double(), 2),
            text="equals the reference on heads that partly agree (float32 and float64)",
            steps="the squared error summed over everything, divided by the sum of k's squares",
            examples=[(torch.float64, 121), (torch.float32, 122)],
            inputs=st.tuples(FLOATS, st.integers(200, 2**31 - 2)),
            key="pooling.procedure",
            rel=1e-4,
        ),
        Clause("all-zero keys give 0.0 (no division by zero)", _pooling_zeros, examples=[(1, 4, 3, 2)]),
        unchanged(
            lambda case: Call(
                f"kv_pooling_error(k {case[1]}, {case[2]})", (tensor(case[0], *case[1]), case[2])
            ),
            examples=[(131, (2, 4, 5, 3), 2)],
            text="does not modify k",
            advice="compute the pooled keys and the error into new tensors",
        ),
        Clause(
            "raises ValueError for k that is not 4-D or n_kv_heads that does not divide H",
            _errors,
            examples=[("k (4, 5, 3) (not 4-D)", ((141, (4, 5, 3)), 2), (4, 5, 3), f"{_NAMING} (4, 5, 3)")],
            also=[
                ("k (1, 8, 5, 3) and n_kv_heads=3", ((142, (1, 8, 5, 3)), 3), None, _COUNTS),
                ("k (1, 8, 5, 3) and n_kv_heads=0", ((143, (1, 8, 5, 3)), 0), None, _COUNTS),
            ],
        ),
    ],
)
check_kv_pooling_error, grade_kv_pooling_error = KV_POOLING_ERROR.graders()


# --------------------------------------------------------------------------- stretch

POOL_CONFIGS = ((8, 4, 2, True, F64), (12, 6, 3, False, F64), (8, 4, 1, True, F32), (4, 1, 1, True, F64))


def _pool_weights(g: Grader, pool_kv_heads, w, b, H: int, n_kv: int):
    bias = "bias" if b is not None else "None"
    where = f"pool_kv_heads(weight {tuple(w.shape)} {dtype_name(w.dtype)}, {bias}, {H}, {n_kv})"
    out = call_student(g, where, pool_kv_heads, w, b, H, n_kv)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        g.fail(f"{where} should return a pair (weight, bias), got {describe(out)}")
    return where, out[0], out[1]


def _pool_values(g: Grader, pool_kv_heads, case) -> None:
    """``case``: an index into :data:`POOL_CONFIGS` (its weights drawn), or None: the docstring's example
    (C = 4, H = 2, H_kv = 1, the weight holding 0 .. 47, no bias)."""
    C, H, n_kv, bias, dtype = (4, 2, 1, False, F64) if case is None else POOL_CONFIGS[case]
    w = torch.arange(48, dtype=F64).view(12, 4) if case is None else tensor(200 + case, 3 * C, C, dtype=dtype)
    b = tensor(210 + case, 3 * C, dtype=dtype) if bias else None
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
        g.expect(got_b is None, f"{where}: with qkv_bias None the bias should be None, got {describe(got_b)}")


def _pool_agreeing(g: Grader, pool_kv_heads, case) -> None:
    C, H, n_kv = case
    with torch.random.fork_rng(devices=[]):  # weights fixed by the case; the global generator untouched
        torch.manual_seed(1000 * C + 10 * H + n_kv)
        mha = ref.MultiHeadAttention(C, H).double()
    with torch.no_grad():  # make the key and value heads of each group identical
        w = mha.qkv_proj.weight
        for block in (1, 2):
            rows = w[block * C : (block + 1) * C].reshape(n_kv, H // n_kv, C // H, C)
            rows[:, 1:] = rows[:, :1].clone()
            w[block * C : (block + 1) * C] = rows.reshape(C, C)
        mha.qkv_proj.bias[C:] = 0.0
    where, got_w, got_b = _pool_weights(g, pool_kv_heads, w.detach(), mha.qkv_proj.bias.detach(), H, n_kv)
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


_NAME_IT, _BIAS_SHAPE = "say what was expected and what came", "name the bias shape that came, (16,)"

POOL_KV_HEADS = Spec(
    "pool_kv_heads",
    [
        Clause(
            "the q rows are kept and each group's key and value rows are averaged (with and without bias)",
            _pool_values,
            examples=[0],
            also=[1, 2, 3],
        ),
        Clause(
            "loaded into MultiHeadAttention(C, H, H_kv) it equals the MHA layer when heads in a group agree",
            _pool_agreeing,
            examples=[(8, 4, 2)],
        ),
        unchanged(
            lambda case: Call(
                "pool_kv_heads(weight (24, 8), bias (24,), 4, 2)", (tensor(230, 24, 8), tensor(231, 24), 4, 2)
            ),
            examples=[None],
            text="does not modify its inputs",
            advice="compute the pooled rows into new tensors",
        ),
        Clause(
            "raises ValueError for a weight that is not (3C, C) or a head count that does not divide",
            _errors,
            examples=[
                ("weight (24, 8) and bias (16,)", ((241, (24, 8)), (242, (16,)), 4, 2), (16,), _BIAS_SHAPE)
            ],
            also=[
                ("weight (16, 8)", ((240, (16, 8)), None, 4, 2), None, _NAME_IT),
                ("n_heads=3 for C=8", ((243, (24, 8)), None, 3, 1), None, _NAME_IT),
                ("n_heads=0", ((243, (24, 8)), None, 0, 1), None, _NAME_IT),
                ("n_heads=4, n_kv_heads=3", ((244, (24, 8)), None, 4, 3), None, _NAME_IT),
                ("n_heads=4, n_kv_heads=0", ((244, (24, 8)), None, 4, 0), None, _NAME_IT),
            ],
        ),
    ],
    extra_public=[
        Clause(
            "C = 4, H = 2, H_kv = 1: the weight goes from (12, 4) to (8, 4), the key rows averaged",
            _pool_values,
            examples=[None],
        )
    ],
)
check_pool_kv_heads, grade_pool_kv_heads = POOL_KV_HEADS.graders()

"""Checks for Exercise 1 (attention).

Each part has two entry points, both called from the notebook with the student's
object. ``check_*`` holds the *public* checks: one small, fixed example per clause of
the part's text, which a student runs while working (and ``coursekit check`` runs).
``grade_*`` holds the *hidden* checks: one named check per clause, each on inputs drawn
across what the text allows (:func:`~coursekit.grading.core.for_all`: ranks, sizes
including 1, T != S, both float dtypes, large magnitudes where stability is promised),
compared with :mod:`coursekit.attention` in float64. A failed check names the smallest
input that shows the mistake. Both raise :class:`~coursekit.grading.core.GradingFailure`
with a hint per failed check.

Shared helpers come from :mod:`coursekit.grading.core` (``call_student`` turns an exception of
the student's code into a hint that names the input). Private ones: :func:`_device_type` reads the device of a
result even under the autograder (a meta tensor cannot travel back from the sandbox as data,
and the attempt says so), :func:`_show` prints a few values for a hint.

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from coursekit import attention as ref
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
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
    probe,
    raise_unless_student_error,
    raised,
    random_weights,
    show,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band
from coursekit.grading.spec import Call, Clause, Spec, unchanged

__all__ = [
    "check_softmax",
    "check_causal_mask",
    "check_attention",
    "check_self_attention",
    "grade_softmax",
    "grade_causal_mask",
    "grade_attention",
    "grade_self_attention",
    "check_predict_leaked_pairs",
    "grade_predict_leaked_pairs",
    "check_predict_score_variance",
    "grade_predict_score_variance",
    "check_predict_sequential_steps",
    "grade_predict_sequential_steps",
    "check_score_variance",
    "grade_score_variance",
    "check_online_softmax",
    "grade_online_softmax",
]

FLOATS = (torch.float64, torch.float32)
#: what the exercise's text rules out in every answer (``torch.softmax``, ``F.softmax``,
#: ``x.softmax(...)``, ``F.scaled_dot_product_attention``): calls of these attributes are listed
#: among the class report's integrity signals (:mod:`coursekit.integrity`), not deducted
RULED_OUT = ("softmax", "scaled_dot_product_attention")
LINEAR = "torch.nn.modules.linear.Linear"
SEEDS = st.integers(0, 2**31 - 1)


# --------------------------------------------------------------------------- helpers


def _device_type(g: Grader, where: str, fn, *args, **kwargs) -> str:
    """The device type of the tensor ``fn`` returns ("cpu", "meta", ...), or a description of
    what it returned instead. Under the autograder a meta tensor cannot be copied back out of the
    sandbox; the failed copy is how it shows there."""
    try:
        out = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        if "Cannot copy out of meta tensor" in str(e):
            return "meta"
        raise_unless_student_error(e)
        g.fail(f"{where}: {raised(e)}")
    return out.device.type if is_tensor(out) else describe(out)


def _unpack(g: Grader, result, what: str):
    g.expect(
        isinstance(result, tuple) and len(result) == 2,
        f"{what} must return a tuple (out, weights), got {describe(result)}",
    )
    return result


# --------------------------------------------------------------------------- softmax


def _shape_and_dim(max_rank: int = 4, max_size: int = 6):
    """A shape of rank 1..max_rank and an axis of it, positive or negative."""
    return (
        st.lists(st.integers(1, max_size), min_size=1, max_size=max_rank)
        .map(tuple)
        .flatmap(lambda shape: st.tuples(st.just(shape), st.integers(-len(shape), len(shape) - 1)))
    )


def _softmax_mistakes(x: torch.Tensor, dim: int, where: str) -> list:
    """The classic wrong softmaxes of ``x`` (float64) along ``dim``, with their hints."""
    others = [d for d in range(x.dim()) if d != dim % x.dim()]
    out = [
        (torch.exp(x), f"{where}: your slices do not sum to 1: divide by the sum over `dim` (keepdim=True)")
    ]
    out += [
        (
            ref.softmax(x, d),
            f"{where}: softmax over the wrong axis (dim {d} instead of {dim}): use `dim` "
            "in both the max and the sum",
        )
        for d in others
    ]
    out += [
        (
            ref.softmax(x.float(), dim).double(),
            f"{where}: your result has only float32 precision: compute in x's dtype (no .float() on the way)",
        )
    ]
    return out


def _softmax_kind(g: Grader, softmax, case) -> None:
    (shape, dim), dtype, seed = case
    x = tensor(seed, *shape, dtype=dtype)
    where = f"softmax(x {shape} {dtype_name(dtype)}, dim={dim})"
    p = call_student(g, where, softmax, x, dim=dim)
    g.expect(
        is_tensor(p) and p.shape == x.shape and p.dtype == x.dtype,
        f"{where} should be a tensor {dtype_name(dtype)} {shape}, got {describe(p)}",
    )


def _softmax_matches(
    g: Grader, softmax, x: torch.Tensor, dim: int | None, where: str, advice: str = ""
) -> None:
    """The student's softmax of ``x`` along ``dim`` (``None``: the default) against the reference,
    with the classic mistakes' hints first."""
    p = call_student(g, where, softmax, x) if dim is None else call_student(g, where, softmax, x, dim=dim)
    dim = -1 if dim is None else dim
    expected = ref.softmax(x.double(), dim).to(x.dtype)
    first_match(
        g, p, [(m.to(x.dtype), h) for m, h in _softmax_mistakes(x.double(), dim, where)], right=expected
    )
    g.expect(close(p, expected, magnitude=magnitude(x)), f"{where}: {first_difference(p, expected, advice)}")


def _softmax_values(g: Grader, softmax, case) -> None:
    shape, dtype, scale, seed = case
    x = tensor(seed, *shape, dtype=dtype, scale=scale)
    _softmax_matches(g, softmax, x, None, f"softmax(x) for x {shape} {dtype_name(dtype)}")


def _softmax_along(g: Grader, softmax, case) -> None:
    (shape, dim), dtype, seed = case
    x = tensor(seed, *shape, dtype=dtype, scale=2.0)
    _softmax_matches(g, softmax, x, dim, f"softmax(x, dim={dim}) for x {shape} {dtype_name(dtype)}")


def _softmax_stable(g: Grader, softmax, case) -> None:
    (shape, dim), dtype, offset, spread, apart, seed = case
    x = tensor(seed, *shape, dtype=dtype, scale=spread) + offset
    around = f"around {offset:g}"
    if apart and x.dim() > 1:  # slices far apart: every other slice around -offset
        sign = (torch.arange(x.numel() // x.shape[dim]) % 2 * -2 + 1).to(dtype)
        others = [n for d, n in enumerate(shape) if d != dim % len(shape)]
        x = x * sign.view(*others).unsqueeze(dim)
        around = f"around {offset:g} in some slices and {-offset:g} in others"
    where = f"softmax(x, dim={dim}) for x {shape} {dtype_name(dtype)} with values {around}"
    p = call_student(g, where, softmax, x, dim=dim)
    if is_tensor(p) and p.shape == x.shape and not bool(torch.isfinite(p).all()):
        g.fail(
            f"{where}: got inf or NaN ({show(p)}): exp overflows above about 88 in float32 (709 in "
            "float64) and every term underflows to 0 far below; subtract the maximum of each slice "
            "(not of the whole tensor) before exponentiating"
        )
    expected = ref.softmax(x.double(), dim).to(dtype)
    g.expect(
        close(p, expected, magnitude=magnitude(x)),
        f"{where}: {first_difference(p, expected, ' (subtract the maximum of each slice first)')}",
    )


#: a fixed input holding -inf, and a slice of nothing but -inf
_ALL_MASKED = ((0.0, -math.inf, 1.0), (-math.inf, -math.inf, -math.inf))


def _softmax_masked(g: Grader, softmax, case) -> None:
    if case == _ALL_MASKED:
        x, dim = torch.tensor(case, dtype=torch.float64), -1
        where = "softmax([[0, -inf, 1], [-inf, -inf, -inf]])"
    else:
        (shape, dim), dtype, seed = case
        x = tensor(seed, *shape, dtype=dtype)
        drop = tensor(seed + 1, *shape) > 0.3  # about 38% of the entries become -inf
        x = x.masked_fill(drop, -math.inf)
        x.movedim(dim, -1)[(0,) * (x.dim() - 1)] = -math.inf  # and one whole slice along dim
        where = f"softmax(x, dim={dim}) for x {shape} {dtype_name(dtype)} holding -inf ({show(x)})"
    p = call_student(g, where, softmax, x, dim=dim)
    if is_tensor(p) and bool(torch.isnan(p).any()):
        g.fail(
            f"{where}: gave NaN ({show(p)}): a slice of all -inf has maximum -inf and -inf - (-inf) is "
            "NaN; replace an infinite maximum by 0 before subtracting, and divide by 1 where the sum is 0"
        )
    expected = ref.softmax(x.double(), dim).to(x.dtype)
    g.expect(close(p, expected, magnitude=magnitude(x)), f"{where}: {first_difference(p, expected)}")


def _softmax_call(case) -> Call:
    (shape, dim), dtype, seed = case
    x = tensor(seed, *shape, dtype=dtype, scale=3.0)
    return Call(f"softmax(x, dim={dim}) for x {shape} {dtype_name(dtype)}", (x,), {"dim": dim})


_SOFTMAX_CASES = st.tuples(_shape_and_dim(3), st.sampled_from(FLOATS), SEEDS)

SOFTMAX = Spec(
    "softmax",
    [
        Clause(
            "returns a new tensor of x's shape and dtype (float32 or float64, any rank)",
            _softmax_kind,
            st.tuples(_shape_and_dim(), st.sampled_from(FLOATS), SEEDS),
            key="softmax.shape",
            budget="more",
            examples=[(((2, 3), -1), torch.float64, 0)],
        ),
        Clause(
            "equals exp(x) / sum(exp(x)) along the last axis by default",
            _softmax_values,
            st.tuples(
                st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple),
                st.sampled_from(FLOATS),
                st.sampled_from([1.0, 3.0, 0.01]),
                SEEDS,
            ),
            key="softmax.values",
            budget="plenty",
            examples=[((3, 4), torch.float64, 1.0, 1)],
        ),
        Clause(
            "normalises along `dim`: any axis, positive or negative",
            _softmax_along,
            st.tuples(_shape_and_dim(), st.sampled_from(FLOATS), SEEDS),
            key="softmax.dim",
            budget="many",
            examples=[(((3, 4, 5), 0), torch.float64, 2)],
        ),
        Clause(
            "stable: finite and accurate for large positive and very negative inputs (float32 and float64)",
            _softmax_stable,
            st.tuples(
                _shape_and_dim(3),
                st.sampled_from(FLOATS),
                st.sampled_from([1000.0, -1000.0, 1e4, -1e4, 200.0, -800.0]),
                st.sampled_from([1.0, 10.0, 50.0]),
                st.booleans(),
                SEEDS,
            ),
            key="softmax.stable",
            budget="plenty",
            examples=[(((2, 3), -1), torch.float32, 1000.0, 1.0, False, 3)],
            also=[(((3, 4), -1), torch.float32, 1000.0, 1.0, True, 4)],  # rows around 1000 and -1000
        ),
        Clause(
            "-inf entries get weight 0, and a slice of all -inf gives zeros, not NaN",
            _softmax_masked,
            _SOFTMAX_CASES,
            key="softmax.masked",
            budget="more",
            first=(((2, 3), -1), torch.float64, 4),
            examples=[_ALL_MASKED],
            also=[_ALL_MASKED],
        ),
        unchanged(
            _softmax_call,
            _SOFTMAX_CASES,
            key="softmax.inplace",
            examples=[(((3, 5), -1), torch.float64, 5)],
            text="leaves x unchanged (no in-place changes)",
            advice="compute a new tensor (no x -= ..., x.exp_() or out=x)",
        ),
    ],
)
check_softmax, grade_softmax = SOFTMAX.graders()


# --------------------------------------------------------------------------- causal mask


def grade_causal_mask(causal_mask) -> None:
    """Grade a student's ``causal_mask(T, S=None, device=None)``."""
    g = Grader("causal_mask")

    with g.check("returns a boolean (T, S) tensor; S defaults to T"):

        def kind(case):
            T, extra, give_s = case
            S = T + extra
            args = (T, S) if give_s else (T,)
            call = f"causal_mask({', '.join(map(str, args))})"
            m = call_student(g, call, causal_mask, *args)
            want = (T, S if give_s else T)
            g.expect(
                is_tensor(m) and m.dtype == torch.bool and m.shape == want,
                f"{call} should be a bool tensor of shape {want}, got {describe(m)}",
            )

        for_all(
            "causal.kind",
            st.tuples(st.integers(0, 9), st.integers(0, 5), st.booleans()),
            kind,
            max_examples=10,
            first=(4, 0, False),
        )

    with g.check("S = T: query i sees keys 0..i (the lower triangle with its diagonal), T = 0 included"):

        def square(case):
            T, give_s = case
            call = f"causal_mask({T}, {T})" if give_s else f"causal_mask({T})"
            m = call_student(g, call, causal_mask, *((T, T) if give_s else (T,)))
            expected = ref.causal_mask(T)
            if is_tensor(m) and m.shape == expected.shape and m.dtype == torch.bool and T > 1:
                if torch.equal(m, expected.T):
                    g.fail(f"{call} is transposed: query i (row) may attend to keys j <= i (columns)")
                if torch.equal(m, ~expected):
                    g.fail(f"{call} is inverted: True means *may attend*")
                if not bool(m.diagonal().all()):
                    g.fail(
                        f"{call}: a position may not attend to itself: the diagonal must be True (off by one?)"
                    )
                if bool((m & ~expected).any()):
                    g.fail(f"{call}: a query can see a future key: entries above the diagonal must be False")
            g.expect(
                is_tensor(m) and m.dtype == torch.bool and torch.equal(m, expected),
                f"{call} differs from the lower-triangular mask: {first_difference(m, expected)}",
            )

        for_all(
            "causal.square",
            st.tuples(st.integers(0, 12), st.booleans()),
            square,
            max_examples=14,
            first=(5, False),
        )

    with g.check("S > T keys: bottom-right aligned, query i sees keys j <= i + (S - T)"):

        def rectangle(case):
            T, extra = case
            S = T + extra
            call = f"causal_mask({T}, {S})"
            m = call_student(g, call, causal_mask, T, S)
            expected = ref.causal_mask(T, S)
            top_left = torch.ones(T, S, dtype=torch.bool).tril()
            if is_tensor(m) and m.shape == (T, S) and T > 0 and torch.equal(m, top_left):
                g.fail(
                    f"{call} is misaligned (top-left, like torch's is_causal): the queries are the last {T} of "
                    f"{S} positions, so query i may attend to keys j <= i + (S - T)"
                )
            g.expect(
                is_tensor(m) and m.shape == (T, S) and m.dtype == torch.bool and torch.equal(m, expected),
                f"{call} is misaligned: the queries are the last {T} of {S} positions, so query i may attend "
                f"to keys j <= i + (S - T); {first_difference(m, expected)}",
            )

        for_all(
            "causal.rectangle",
            st.tuples(st.integers(0, 9), st.integers(1, 8)),
            rectangle,
            max_examples=14,
            first=(3, 2),
        )

    with g.check("raises ValueError unless 0 <= T <= S"):

        def invalid(case):
            T, S = case
            args = (T,) if S is None else (T, S)
            call = f"causal_mask({', '.join(map(str, args))})"
            expect_value_error(
                g, lambda: causal_mask(*args), call, "a ValueError that names T and S: 0 <= T <= S"
            )

        bad = st.one_of(
            st.tuples(st.integers(1, 8), st.integers(0, 7)).map(lambda ts: (ts[0] + ts[1], ts[1])),
            st.tuples(st.integers(-5, -1), st.one_of(st.none(), st.integers(0, 5))),
        )
        for_all("causal.invalid", bad, invalid, max_examples=10, first=(3, 2))
        for args in ((-1,), (-1, 0), (1, 0)):
            expect_value_error(
                g,
                lambda args=args: causal_mask(*args),
                f"causal_mask{args}".replace(",)", ")"),
                "a ValueError that names T and S: 0 <= T <= S",
            )

    with g.check("creates the mask on `device` (the CPU by default)"):
        for T, S in ((3, None), (2, 5)):
            call = f"causal_mask({T}, {S}, device='meta')" if S else f"causal_mask({T}, device='meta')"
            got = (
                _device_type(g, call, causal_mask, T, S, device="meta")
                if S
                else _device_type(g, call, causal_mask, T, device="meta")
            )
            g.expect(
                got == "meta",
                f"{call} should be created on the meta device, got {got}: pass device=device "
                "to every tensor you create (torch.arange(..., device=device))",
            )
        got = _device_type(g, "causal_mask(3)", causal_mask, 3)
        g.expect(got == "cpu", f"causal_mask(3) should be on the CPU, got {got}")

    g.finish()


# --------------------------------------------------------------------------- attention


LEAD = st.lists(st.integers(1, 3), max_size=2).map(tuple)  # no leading dims, (B,), or (A, B)
#: leading dims, T, S, D, Dv, dtype, seed
ATTENTION = st.tuples(
    LEAD,
    st.integers(1, 6),
    st.integers(1, 7),
    st.integers(1, 8),
    st.integers(1, 5),
    st.sampled_from(FLOATS),
    SEEDS,
)


def _qkv(case, scale: float = 1.0):
    lead, T, S, D, Dv, dtype, seed = case[:7]
    q = tensor(seed, *lead, T, D, dtype=dtype, scale=scale)
    k = tensor(seed + 1, *lead, S, D, dtype=dtype, scale=scale)
    v = tensor(seed + 2, *lead, S, Dv, dtype=dtype)
    return q, k, v


def _sizes(q, k, v, mask=None, scale=None) -> str:
    text = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} ({dtype_name(q.dtype)})"
    if mask is not None:
        text += f", a {'boolean' if mask.dtype == torch.bool else 'floating'} mask {tuple(mask.shape)}"
    if scale is not None:
        text += f", scale={scale:g}"
    return "for " + text


def _expected(q, k, v, mask=None, scale=None):
    """coursekit's (out, weights) in float64, cast to q's dtype, and the magnitude of the scores."""
    d = lambda t: None if t is None else (t if t.dtype == torch.bool else t.double())  # noqa: E731
    out, w = ref.scaled_dot_product_attention(d(q), d(k), d(v), mask=d(mask), scale=scale)
    s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.double() @ k.double().transpose(-2, -1)) * s
    return out.to(q.dtype), w.to(q.dtype), magnitude(scores, v)


def _mask_shape(full: tuple, keep: list[bool], drop: int) -> tuple:
    """A shape that broadcasts to ``full``: some axes of size 1, some leading axes left out."""
    shape = tuple(n if k else 1 for n, k in zip(full, keep))
    return shape[min(drop, len(full) - 1) :]


def _bool_mask(seed: int, shape: tuple, S: int) -> torch.Tensor:
    """About 60% True, and one key visible to every query (so no row is fully masked)."""
    mask = tensor(seed, *shape) > -0.25
    mask[..., seed % shape[-1]] = True
    return mask


def _attention_mistakes(q, k, v, mask, scale, where):
    """Classic wrong attentions (float64), each with its hint."""
    dq = lambda t: t if t is None or t.dtype == torch.bool else t.double()  # noqa: E731
    q, k, v, mask = dq(q), dq(k), dq(v), dq(mask)
    D = q.shape[-1]
    s = 1 / math.sqrt(D) if scale is None else scale
    out = []
    if scale is None:
        out += [
            (
                ref.scaled_dot_product_attention(q, k, v, mask, scale=1.0)[0],
                f"{where}: the scores are not scaled: divide q k^T by sqrt(D)",
            ),
            (
                ref.scaled_dot_product_attention(q, k, v, mask, scale=1.0 / D)[0],
                f"{where}: the scores are divided by D: divide by sqrt(D) instead",
            ),
        ]
    else:
        out += [
            (
                ref.scaled_dot_product_attention(q, k, v, mask)[0],
                f"{where}: scale={scale:g} was not used: multiply the scores by `scale` when it is given "
                "(test `scale is None`, since 0 is a valid scale)",
            )
        ]
    scores = (q @ k.transpose(-2, -1)) * s
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, -math.inf)
        out += [
            (
                ref.scaled_dot_product_attention(q, k, v, ~mask, scale)[0],
                f"{where}: the mask is inverted: True means the query *may attend* to the key",
            ),
            (
                (ref.softmax((q @ k.transpose(-2, -1)) * s, -1) * mask) @ v,
                f"{where}: masked keys still count in the softmax: set their scores to -inf before the softmax",
            ),
        ]
    elif mask is not None:
        out += [
            (
                ref.scaled_dot_product_attention(q, k, v, None, scale)[0],
                f"{where}: the floating mask was ignored: add it to the scaled scores",
            ),
            (
                ref.scaled_dot_product_attention(q, k, v, mask * s, scale)[0],
                f"{where}: the floating mask was added before scaling: add it to the *scaled* scores",
            ),
            (
                ref.scaled_dot_product_attention(q, k, v, mask != 0, scale)[0],
                f"{where}: a floating mask was used as a boolean one: a floating mask is *added* to the scores",
            ),
        ]
        scores = scores + mask
    out += [
        (
            ref.softmax(scores, -2) @ v,
            f"{where}: softmax over the queries: take the softmax over the keys (last axis)",
        )
    ]
    return out


def _mistakes_or_none(q, k, v, mask, scale, where) -> list:
    """:func:`_attention_mistakes` in q's dtype, or none if they cannot be computed on this input."""
    try:
        return [(m.to(q.dtype), h) for m, h in _attention_mistakes(q, k, v, mask, scale, where)]
    except Exception:  # noqa: BLE001
        return []


def grade_attention(attention) -> None:
    """Grade a student's ``scaled_dot_product_attention(q, k, v, mask=None, scale=None)``."""
    g = Grader("scaled_dot_product_attention")

    def compare(q, k, v, mask=None, scale=None, name="attention"):
        where = _sizes(q, k, v, mask, scale)
        kwargs = {} if mask is None and scale is None else {"mask": mask, "scale": scale}
        out, w = _unpack(g, call_student(g, where, attention, q, k, v, **kwargs), name)
        exp_out, exp_w, mag = _expected(q, k, v, mask, scale)
        first_match(g, out, _mistakes_or_none(q, k, v, mask, scale, where), right=exp_out)
        for name, got in (("out", out), ("the weights", w)):
            if is_tensor(got) and not bool(torch.isfinite(got).all()):
                g.fail(
                    f"{where}: {name} hold inf or NaN ({show(got)}) where the reference is finite: use your "
                    "stable softmax (it subtracts each row's maximum before exponentiating)"
                )
        if is_tensor(w) and w.shape == exp_w.shape:
            sums = w.sum(-1)
            g.expect(
                close(sums, exp_w.double().sum(-1).round().to(q.dtype), magnitude=mag),
                f"{where}: rows of the weights do not sum to 1 ({show(sums)}): take the softmax over the keys "
                "(last axis), after masking",
            )
        g.expect(close(w, exp_w, magnitude=mag), f"{where}: the weights differ: {first_difference(w, exp_w)}")
        g.expect(
            close(out, exp_out, magnitude=mag), f"{where}: out differs: {first_difference(out, exp_out)}"
        )
        return out, w

    with g.check(
        "returns (out, weights) of shapes (..., T, Dv) and (..., T, S) in q's dtype, any leading dims"
    ):

        def shapes(case):
            q, k, v = _qkv(case)
            where = _sizes(q, k, v)
            out, w = _unpack(g, call_student(g, where, attention, q, k, v), "scaled_dot_product_attention")
            T, S, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
            lead = tuple(q.shape[:-2])
            g.expect(
                is_tensor(out) and out.shape == (*lead, T, Dv) and out.dtype == q.dtype,
                f"{where}: out should be {dtype_name(q.dtype)} {(*lead, T, Dv)} = (..., T, Dv), got {describe(out)}",
            )
            g.expect(
                is_tensor(w) and w.shape == (*lead, T, S) and w.dtype == q.dtype,
                f"{where}: weights should be {dtype_name(q.dtype)} {(*lead, T, S)} = (..., T, S), got {describe(w)}",
            )

        for_all("att.shapes", ATTENTION, shapes, max_examples=12, first=((2,), 5, 6, 4, 3, torch.float64, 0))

    with g.check("without a mask: weights = softmax(q k^T / sqrt(D)) over the keys, out = weights v"):
        for_all(
            "att.values",
            ATTENTION,
            lambda case: compare(*_qkv(case)),
            max_examples=12,
            first=((3,), 5, 7, 8, 3, torch.float64, 1),
        )

    with g.check("`scale` multiplies the scores when given (0 and negative values included)"):

        def scaled(case):
            q, k, v = _qkv(case[:7])
            compare(q, k, v, scale=case[7])

        for_all(
            "att.scale",
            st.tuples(
                LEAD,
                st.integers(1, 6),
                st.integers(2, 7),
                st.integers(1, 8),
                st.integers(1, 5),
                st.sampled_from(FLOATS),
                SEEDS,
                st.sampled_from([0.0, 0.3, 2.0, -1.0, 1.0]),
            ),
            scaled,
            max_examples=12,
            first=((2,), 4, 5, 4, 3, torch.float64, 2, 0.0),
        )

    def masked_case(extra):
        return st.tuples(
            LEAD,
            st.integers(1, 6),
            st.integers(1, 7),
            st.integers(1, 6),
            st.integers(1, 4),
            st.sampled_from(FLOATS),
            SEEDS,
            st.lists(st.booleans(), min_size=4, max_size=4),
            st.integers(0, 3),
            *extra,
        )

    with g.check(
        "a boolean mask, broadcastable to (..., T, S): True means may attend, False removes the key"
    ):

        def boolean(case):
            q, k, v = _qkv(case)
            full = (*q.shape[:-1], k.shape[-2])
            mask = _bool_mask(case[6] + 3, _mask_shape(full, case[7], case[8]), k.shape[-2])
            out, w = compare(q, k, v, mask=mask)

        for_all(
            "att.bool",
            masked_case(()),
            boolean,
            max_examples=12,
            first=((2,), 4, 5, 4, 3, torch.float64, 3, [True] * 4, 0),
        )
        q, k, v = _qkv(((3,), 6, 6, 4, 3, torch.float64, 7))
        compare(q, k, v, mask=ref.causal_mask(6))  # a (T, S) causal mask broadcast over the batch

    with g.check(
        "a floating mask, broadcastable to (..., T, S), is added to the scaled scores (-inf removes a key)"
    ):

        def additive(case):
            q, k, v = _qkv(case)
            full = (*q.shape[:-1], k.shape[-2])
            shape = _mask_shape(full, case[7], case[8])
            bias = tensor(case[6] + 4, *shape, dtype=q.dtype, scale=2.0)
            bias = bias.masked_fill(tensor(case[6] + 5, *shape) > 0.8, -math.inf)
            bias[..., case[6] % shape[-1]] = 0.5  # one finite entry per row
            compare(q, k, v, mask=bias)

        for_all(
            "att.additive",
            masked_case(()),
            additive,
            max_examples=12,
            first=((2,), 4, 5, 4, 3, torch.float64, 4, [True] * 4, 0),
        )

    with g.check("a query with no visible key gets zero weights and a zero output, not NaN"):

        def empty(case):
            lead, T, S, D, Dv, dtype, seed, boolean = case
            q, k, v = _qkv((lead, T, S, D, Dv, dtype, seed))
            mask = tensor(seed + 6, *lead, T, S) > -0.5
            row = seed % T
            mask[..., row, :] = False
            mask = mask if boolean else torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -math.inf)
            where = _sizes(q, k, v, mask) + f" that hides every key from query {row}"
            out, w = _unpack(
                g, call_student(g, where, attention, q, k, v, mask=mask), "scaled_dot_product_attention"
            )
            exp_out, exp_w, mag = _expected(q, k, v, mask)
            first_match(g, out, _mistakes_or_none(q, k, v, mask, None, where), right=exp_out)
            if is_tensor(out) and bool(torch.isnan(out).any()) or is_tensor(w) and bool(torch.isnan(w).any()):
                g.fail(
                    f"{where}: gave NaN: query {row}'s weights must be all zero (see the softmax part: a row of "
                    "all -inf gives zeros)"
                )
            uniform = (
                is_tensor(w)
                and w.shape == exp_w.shape
                and close(w[..., row, :], torch.full_like(w[..., row, :], 1 / S))
            )
            if uniform:
                g.fail(
                    f"{where}: query {row} got uniform weights 1/S: a large finite number such as -1e9 is not "
                    "-inf; mask with -inf so that the softmax gives zeros"
                )
            g.expect(
                close(w, exp_w, magnitude=mag), f"{where}: the weights differ: {first_difference(w, exp_w)}"
            )
            g.expect(
                close(out, exp_out, magnitude=mag), f"{where}: out differs: {first_difference(out, exp_out)}"
            )

        for_all(
            "att.empty",
            st.tuples(
                LEAD,
                st.integers(1, 5),
                st.integers(1, 6),
                st.integers(1, 6),
                st.integers(1, 4),
                st.sampled_from(FLOATS),
                SEEDS,
                st.booleans(),
            ),
            empty,
            max_examples=12,
            first=((2,), 3, 4, 4, 3, torch.float64, 1, True),
        )

    with g.check("stable for large scores (|q k^T| in the thousands, float32 and float64)"):

        def large(case):
            q, k, v = _qkv(case[:7], scale=case[7])
            out, w = compare(q, k, v)

        for_all(
            "att.large",
            st.tuples(
                LEAD,
                st.integers(1, 5),
                st.integers(1, 6),
                st.integers(1, 6),
                st.integers(1, 4),
                st.sampled_from(FLOATS),
                SEEDS,
                st.sampled_from([10.0, 30.0, 60.0]),
            ),
            large,
            max_examples=10,
            first=((2,), 3, 4, 4, 3, torch.float32, 5, 30.0),
        )

    with g.check("gradients with respect to q, k and v match the reference"):

        def grads(case):
            lead, T, S, D, Dv, seed, use_mask = case
            q, k, v = _qkv((lead, T, S, D, Dv, torch.float64, seed))
            mask = _bool_mask(seed + 7, (T, S), S) if use_mask else None
            upstream = tensor(seed + 8, *lead, T, Dv)
            where = _sizes(q, k, v, mask)
            try:
                p = probe(
                    attention,
                    *(t.clone().requires_grad_() for t in (q, k, v)),
                    mask=mask,
                    backward=(0, upstream),
                )
            except Exception as e:  # noqa: BLE001
                raise_unless_student_error(e)
                g.fail(f"{where}: {raised(e)}")
            out, _ = _unpack(g, p.result, "scaled_dot_product_attention")
            g.expect(
                is_tensor(out) and out.requires_grad,
                f"{where}: out does not depend on q, k, v through autograd: avoid .detach(), .numpy(), "
                ".item() or building new tensors from values",
            )
            qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
            (ref.scaled_dot_product_attention(qr, kr, vr, mask)[0] * upstream).sum().backward()
            for name, got, want in zip("qkv", p.grads or [None] * 3, (qr.grad, kr.grad, vr.grad)):
                g.expect(
                    got is not None and close(got, want),
                    f"{where}: the gradient with respect to {name} differs from the reference "
                    f"({first_difference(got, want) if got is not None else 'none'})",
                )

        for_all(
            "att.grad",
            st.tuples(
                LEAD,
                st.integers(1, 4),
                st.integers(1, 5),
                st.integers(1, 4),
                st.integers(1, 3),
                SEEDS,
                st.booleans(),
            ),
            grads,
            max_examples=5,
            first=((2,), 3, 4, 4, 3, 6, False),
        )

    with g.check("leaves q, k, v and the mask unchanged (no in-place changes)"):

        def untouched(case):
            lead, T, S, D, Dv, dtype, seed, kind, scale = case
            q, k, v = _qkv((lead, T, S, D, Dv, dtype, seed))
            mask = None if kind == "none" else _bool_mask(seed + 9, (T, S), S)
            if kind == "float":
                mask = torch.zeros(T, S, dtype=dtype).masked_fill(~mask, -math.inf)
            try:
                p = probe(
                    attention,
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    mask=None if mask is None else mask.clone(),
                    scale=scale,
                )
            except Exception as e:  # noqa: BLE001
                raise_unless_student_error(e)
                g.fail(f"{_sizes(q, k, v, mask, scale)}: {raised(e)}")
            for name, a, b in zip(("q", "k", "v", "mask"), (*p.args, p.kwargs.get("mask")), (q, k, v, mask)):
                if b is not None:
                    g.expect(
                        is_tensor(a) and a.dtype == b.dtype and torch.equal(a, b),
                        f"{_sizes(q, k, v, mask, scale)}: {name} was modified in place (q *= scale, "
                        "masked_fill_ ...): compute new tensors",
                    )

        for_all(
            "att.inplace",
            st.tuples(
                LEAD,
                st.integers(1, 5),
                st.integers(1, 6),
                st.integers(1, 6),
                st.integers(1, 4),
                st.sampled_from(FLOATS),
                SEEDS,
                st.sampled_from(["bool", "float", "none"]),
                st.sampled_from([None, 0.5]),
            ),
            untouched,
            max_examples=8,
            first=((2,), 5, 6, 4, 3, torch.float64, 8, "bool", None),
        )

    g.finish()


# --------------------------------------------------------------------------- self-attention module


def _self_attention_pair(g: Grader, SelfAttention, C: int, D: int | None, bias: bool, dtype, name: str):
    """The student's module and coursekit's, holding the same random weights of ours (a module
    that only works with its own initial weights, say zeros, must not pass)."""
    args = (C,) if D is None else (C, D)
    call = f"SelfAttention({', '.join(map(str, args))}{'' if bias else ', bias=False'})"
    m = call_student(g, call, SelfAttention, *args, **({} if bias else {"bias": False}))
    r = ref.SelfAttention(*args, bias=bias).to(dtype)
    weights = {key: value.to(dtype) for key, value in random_weights(r, name).items()}
    m = call_student(g, f"{call}.to({dtype})", m.to, dtype)
    load_weights(g, m, weights, call, bias)
    r.load_state_dict(weights)
    return m, r, call


SELF = st.tuples(
    st.integers(1, 3),
    st.integers(1, 6),
    st.integers(1, 8),
    st.one_of(st.none(), st.integers(1, 6)),
    st.booleans(),
    st.sampled_from(FLOATS),
    SEEDS,
)


def grade_self_attention(SelfAttention) -> None:
    """Grade a student's ``SelfAttention(d_model, d_head=None, bias=True)`` module class."""
    g = Grader("SelfAttention")

    with g.check("has nn.Linear layers q_proj, k_proj and v_proj, each C -> D (d_head defaults to d_model)"):

        def layers(case):
            C, D, bias = case
            args = (C,) if D is None else (C, D)
            call = f"SelfAttention({', '.join(map(str, args))}, bias={bias})"
            m = call_student(g, call, SelfAttention, *args, bias=bias)
            width = C if D is None else D
            for name in ("q_proj", "k_proj", "v_proj"):
                layer = getattr(m, name, None)
                g.expect(is_a(layer, LINEAR), f"{call} needs an nn.Linear called {name}")
                g.expect(
                    (layer.in_features, layer.out_features) == (C, width),
                    f"{call}: {name} should map C={C} to D={width} features"
                    f"{' (d_head defaults to d_model)' if D is None else ''}, "
                    f"got {layer.in_features} -> {layer.out_features}",
                )

        for_all(
            "sa.layers",
            st.tuples(st.integers(1, 9), st.one_of(st.none(), st.integers(1, 7)), st.booleans()),
            layers,
            max_examples=8,
            first=(8, 4, True),
        )

    with g.check("bias=False: no biases (3 C D parameters; 3 (C D + D) with bias=True)"):
        for C, D in ((8, 4), (5, 3), (6, None)):
            width = C if D is None else D
            for bias, expected in ((True, 3 * (C * width + width)), (False, 3 * C * width)):
                args = (C,) if D is None else (C, D)
                call = f"SelfAttention({', '.join(map(str, args))}, bias={bias})"
                m = call_student(g, call, SelfAttention, *args, bias=bias)
                sd = m.state_dict()
                n = sum(p.numel() for p in sd.values()) if isinstance(sd, dict) else -1
                g.expect(
                    n == expected,
                    f"{call} should have {expected} parameters, got {n}"
                    + ("" if bias else ": pass bias=bias to the three nn.Linear layers"),
                )

    with g.check(
        "forward(x) returns (out (B, T, D), weights (B, T, T)) of attention over q_proj(x), k_proj(x), "
        "v_proj(x)"
    ):

        def values(case):
            B, T, C, D, bias, dtype, seed = case
            m, r, call = _self_attention_pair(g, SelfAttention, C, D, bias, dtype, f"sa.values.{seed}")
            x = tensor(seed, B, T, C, dtype=dtype)
            where = f"{call} on x {(B, T, C)} {dtype_name(dtype)} with weights of ours"
            out, w = _unpack(g, call_student(g, where, m, x), "SelfAttention.forward")
            out_r, w_r = r(x)
            width = C if D is None else D
            g.expect(
                is_tensor(out) and out.shape == (B, T, width) and out.dtype == dtype,
                f"{where}: out should be {dtype_name(dtype)} {(B, T, width)}, got {describe(out)}",
            )
            g.expect(
                is_tensor(w) and w.shape == (B, T, T),
                f"{where}: weights should be {(B, T, T)}, got {describe(w)}",
            )
            with torch.no_grad():
                q, k, v = r.q_proj(x), r.k_proj(x), r.v_proj(x)
                mistakes = [
                    (
                        ref.scaled_dot_product_attention(q, q, v)[0],
                        f"{where}: the keys are q_proj(x): queries come from q_proj(x), keys from k_proj(x)",
                    ),
                    (
                        ref.scaled_dot_product_attention(k, k, v)[0],
                        f"{where}: the queries are k_proj(x): queries come from q_proj(x), keys from k_proj(x)",
                    ),
                    (ref.scaled_dot_product_attention(k, q, v)[0], f"{where}: queries and keys are swapped"),
                    (
                        ref.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(C))[0],
                        f"{where}: the scores are scaled by 1/sqrt(C): the given attention scales by 1/sqrt(D)",
                    ),
                ]
            if close(w, w_r) and not close(out, out_r):
                g.fail(f"{where}: the weights match but the output does not: the values must be v_proj(x)")
            first_match(g, out, mistakes, right=out_r.detach())
            g.expect(
                close(w, w_r.detach()),
                f"{where}: the attention weights differ: "
                + first_difference(w, w_r, " (queries come from q_proj(x) and keys from k_proj(x))"),
            )
            g.expect(
                close(out, out_r.detach()),
                f"{where}: out differs from the reference with the same weights "
                f"({first_difference(out, out_r)})",
            )

        for_all("sa.values", SELF, values, max_examples=10, first=(2, 5, 8, 4, True, torch.float64, 0))

    with g.check("forward(x, mask) passes the mask on: boolean or floating, broadcastable to (B, T, T)"):

        def masked(case):
            B, T, C, D, bias, dtype, seed, kind, keep, drop = case
            m, r, call = _self_attention_pair(g, SelfAttention, C, D, bias, dtype, f"sa.mask.{seed}")
            x = tensor(seed, B, T, C, dtype=dtype)
            shape = _mask_shape((B, T, T), keep, drop)
            mask = ref.causal_mask(T) if kind == "causal" else _bool_mask(seed + 1, shape, T)
            if kind == "float":
                mask = tensor(seed + 2, *shape, dtype=dtype).masked_fill(~mask, -math.inf)
            where = f"{call} on x {(B, T, C)} {dtype_name(dtype)} with a {kind} mask {tuple(mask.shape)}"
            out, _ = _unpack(g, call_student(g, where, m, x, mask=mask), "SelfAttention.forward")
            out_r = r(x, mask=mask)[0].detach()
            if close(out, r(x)[0].detach()) and not close(out_r, r(x)[0].detach()):
                g.fail(
                    f"{where}: the output is the unmasked one: pass mask on to scaled_dot_product_attention "
                    "(is the mask passed on?)"
                )
            g.expect(
                close(out, out_r), f"{where}: out differs from the reference: {first_difference(out, out_r)}"
            )

        for_all(
            "sa.mask",
            st.tuples(
                *[
                    st.integers(1, 3),
                    st.integers(1, 6),
                    st.integers(1, 8),
                    st.one_of(st.none(), st.integers(1, 6)),
                    st.booleans(),
                    st.sampled_from(FLOATS),
                    SEEDS,
                    st.sampled_from(["causal", "bool", "float"]),
                    st.lists(st.booleans(), min_size=3, max_size=3),
                    st.integers(0, 2),
                ]
            ),
            masked,
            max_examples=10,
            first=(2, 5, 8, 4, True, torch.float64, 1, "causal", [True] * 3, 0),
        )

    with g.check("raises ValueError unless x is (B, T, C) with C = d_model"):
        m = call_student(g, "SelfAttention(8, 4)", SelfAttention, 8, 4)
        for shape in ((5, 8), (2, 5, 6), (1, 2, 5, 8), (2, 5, 9)):
            x = tensor(sum(shape), *shape, dtype=torch.float32)
            expect_value_error(
                g,
                lambda x=x: m(x),
                f"SelfAttention(8, 4) on x {shape}",
                "a ValueError naming the shape expected, (B, T, 8), and the one received",
            )

    g.finish()


# --------------------------------------------------------------------------- public checks


#: softmax's public example: finite, large and -inf entries (the adversarial catalogue knows it by heart)
def check_causal_mask(causal_mask) -> None:
    """Public checks of ``causal_mask``: one small fixed example per clause the hidden checks grade."""
    g = Grader("causal_mask (public)")
    with g.check("causal_mask(3) is the lower-triangular (3, 3) boolean mask"):
        m = call_student(g, "causal_mask(3)", causal_mask, 3)
        g.expect(
            is_tensor(m) and m.dtype == torch.bool and m.shape == (3, 3),
            f"causal_mask(3) must be a (3, 3) boolean tensor, got {describe(m)}",
        )
        g.expect(
            bool(m.diagonal().all()),
            "a position may not attend to itself: the diagonal must be True (off by one?)",
        )
        g.expect(
            not bool(m[0, 1]),
            "query 0 can see key 1, a future key: entries above the diagonal must be False "
            "(is the mask transposed?)",
        )
        g.expect(
            torch.equal(m, torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)),
            f"causal_mask(3) is\n{m}",
        )
    with g.check(
        "with S > T keys, the last query sees every key: causal_mask(2, 4) is [[1, 1, 1, 0], [1, 1, 1, 1]]"
    ):
        m = call_student(g, "causal_mask(2, 4)", causal_mask, 2, 4)
        g.expect(
            is_tensor(m) and m.shape == (2, 4), f"causal_mask(2, 4) must have shape (2, 4), got {describe(m)}"
        )
        g.expect(
            torch.equal(m, ref.causal_mask(2, 4)),
            f"causal_mask(2, 4) is misaligned: query i sees keys j <= i + (S - T); got {show(m, 8)}",
        )
    with g.check("causal_mask(0, 2) is an empty (0, 2) boolean mask"):
        m = call_student(g, "causal_mask(0, 2)", causal_mask, 0, 2)
        g.expect(
            is_tensor(m) and m.dtype == torch.bool and m.shape == (0, 2),
            f"causal_mask(0, 2) must be a (0, 2) boolean tensor, got {describe(m)}",
        )
    with g.check("causal_mask(3, 2), causal_mask(1, 0) and causal_mask(-1) raise ValueError"):
        expect_value_error(g, lambda: causal_mask(3, 2), "causal_mask(3, 2)", "0 <= T <= S")
        expect_value_error(g, lambda: causal_mask(1, 0), "causal_mask(1, 0)", "0 <= T <= S")
        expect_value_error(g, lambda: causal_mask(-1), "causal_mask(-1)", "0 <= T <= S")
    with g.check("causal_mask(2, 3, device='meta') is created on the meta device"):
        got = _device_type(g, "causal_mask(2, 3, device='meta')", causal_mask, 2, 3, device="meta")
        g.expect(
            got == "meta", f"causal_mask(2, 3, device='meta') is on {got}: pass device=device to torch.arange"
        )
    g.finish()


def check_attention(attention) -> None:
    """Public checks of ``scaled_dot_product_attention``: one small fixed example per clause."""
    g = Grader("scaled_dot_product_attention (public)")
    q, k, v = (tensor(s, 2, n, d, dtype=torch.float32) for s, n, d in ((11, 3, 4), (12, 5, 4), (13, 5, 6)))

    def same_as_reference(what, q, k, v, **kwargs):
        out, w = _unpack(
            g, call_student(g, what, attention, q, k, v, **kwargs), "scaled_dot_product_attention"
        )
        exp_out, exp_w, mag = _expected(q, k, v, kwargs.get("mask"), kwargs.get("scale"))
        g.expect(
            is_tensor(out)
            and is_tensor(w)
            and out.shape == exp_out.shape
            and w.shape == exp_w.shape
            and out.dtype == q.dtype,
            f"{what}: expected out {describe(exp_out)} and weights {describe(exp_w)}, "
            f"got {describe(out)} and {describe(w)}",
        )
        g.expect(close(w, exp_w, magnitude=mag), f"{what}: the weights differ: {first_difference(w, exp_w)}")
        g.expect(close(out, exp_out, magnitude=mag), f"{what}: out differs: {first_difference(out, exp_out)}")
        return out, w

    with g.check(
        "q (2, 3, 4), k (2, 5, 4), v (2, 5, 6) give out (2, 3, 6) and weights (2, 3, 5), as torch's"
    ):
        out, w = same_as_reference("q (2, 3, 4), k (2, 5, 4), v (2, 5, 6)", q, k, v)
    with g.check("no batch dims (q (3, 4)) and two (q (2, 2, 3, 4)); float64"):
        same_as_reference("q (3, 4), k (5, 4), v (5, 6)", q[0].double(), k[0].double(), v[0].double())
        q4, k4, v4 = (t[None].expand(2, *t.shape).contiguous().double() for t in (q, k, v))
        same_as_reference("q (2, 2, 3, 4), k (2, 2, 5, 4), v (2, 2, 5, 6)", q4, k4, v4)
    with g.check("scale=0.5 and scale=0 (uniform weights) are used as given"):
        same_as_reference("scale=0.5", q, k, v, scale=0.5)
        same_as_reference("scale=0", q, k, v, scale=0.0)
    with g.check("a boolean causal mask (3, 5): masked keys get zero weight"):
        mask = ref.causal_mask(3, 5)
        _, w = same_as_reference("a boolean mask (3, 5)", q, k, v, mask=mask)
        g.expect(
            bool((w[:, ~mask] == 0).all()),
            "masked keys got non-zero weight: set their scores to -inf before the softmax",
        )
    with g.check("a floating mask (3, 5) is added to the scaled scores"):
        bias = tensor(14, 3, 5, dtype=torch.float32)
        bias[0, 1] = -math.inf
        same_as_reference("a floating mask (3, 5)", q, k, v, mask=bias)
    with g.check("a query with no visible key gets zero weights and a zero output"):
        mask = torch.ones(3, 5, dtype=torch.bool)
        mask[1] = False
        out, w = same_as_reference("a mask hiding every key from query 1", q, k, v, mask=mask)
    with g.check("large scores (q and k times 30, float32) stay finite and accurate"):
        same_as_reference("q and k times 30", q * 30, k * 30, v)
    with g.check("gradients reach q, k and v; q, k, v and the mask are left unchanged"):
        q64, k64, v64 = q.double(), k.double(), v.double()
        mask = ref.causal_mask(3, 5)
        p = probe(
            attention,
            *(t.clone().requires_grad_() for t in (q64, k64, v64)),
            mask=mask.clone(),
            backward=(0, torch.ones(2, 3, 6, dtype=torch.float64)),
        )
        qr, kr, vr = (t.clone().requires_grad_() for t in (q64, k64, v64))
        ref.scaled_dot_product_attention(qr, kr, vr, mask)[0].sum().backward()
        for name, got, want in zip("qkv", p.grads or [None] * 3, (qr.grad, kr.grad, vr.grad)):
            g.expect(got is not None and close(got, want), f"the gradient with respect to {name} differs")
        for name, a, b in zip(
            ("q", "k", "v", "mask"), (*p.args, p.kwargs.get("mask")), (q64, k64, v64, mask)
        ):
            g.expect(
                is_tensor(a) and torch.equal(a.detach(), b),
                f"{name} was modified in place: compute new tensors",
            )
    g.finish()


def check_self_attention(SelfAttention) -> None:
    """Public checks of ``SelfAttention``: one small fixed example per clause the hidden checks grade."""
    g = Grader("SelfAttention (public)")
    x = tensor(21, 2, 5, 8, dtype=torch.float32)
    with g.check("SelfAttention(8, 4) maps (2, 5, 8) to out (2, 5, 4) and weights (2, 5, 5)"):
        out, weights = _unpack(
            g,
            call_student(g, "SelfAttention(8, 4)(x)", lambda: SelfAttention(8, 4)(x)),
            "SelfAttention.forward",
        )
        g.expect(
            is_tensor(out) and is_tensor(weights) and out.shape == (2, 5, 4) and weights.shape == (2, 5, 5),
            f"expected out (2, 5, 4) and weights (2, 5, 5), got {describe(out)} and {describe(weights)}",
        )
    with g.check(
        "SelfAttention(8, 4) has 3 * (8*4 + 4) = 108 parameters, SelfAttention(8, 4, bias=False) 96, "
        "SelfAttention(8) 216"
    ):
        for args, kwargs, n_expected in (((8, 4), {}, 108), ((8, 4), {"bias": False}, 96), ((8,), {}, 216)):
            sd = call_student(g, f"SelfAttention{args}", SelfAttention, *args, **kwargs).state_dict()
            n = sum(p.numel() for p in sd.values()) if isinstance(sd, dict) else -1
            g.expect(
                n == n_expected,
                f"SelfAttention(*{args}, **{kwargs}) should have {n_expected} parameters, got {n}",
            )
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
        load_weights(
            g, layer, weights, "SelfAttention(8, 4)", True
        )  # our weights, not only the module's own initial ones
        reference.load_state_dict(weights)
        out, _ = _unpack(g, call_student(g, "SelfAttention(8, 4)(x)", layer, x), "SelfAttention.forward")
        g.expect(
            close(out, reference(x)[0].detach()),
            "out differs from attention over q_proj(x), k_proj(x), v_proj(x)",
        )
    with g.check("a mask is passed on: a causal (5, 5) mask and a floating (2, 5, 5) one"):
        layer, reference, _ = _self_attention_pair(
            g, SelfAttention, 8, 4, True, torch.float32, "public.mask.weights"
        )
        for mask in (ref.causal_mask(5), tensor(22, 2, 5, 5, dtype=torch.float32)):
            what = f"a {'boolean' if mask.dtype == torch.bool else 'floating'} mask {tuple(mask.shape)}"
            out, _ = _unpack(
                g,
                call_student(g, f"SelfAttention(8, 4)(x, mask) with {what}", layer, x, mask=mask),
                "SelfAttention.forward",
            )
            g.expect(
                close(out, reference(x, mask=mask)[0].detach()),
                f"with {what}, out differs: pass the mask on to scaled_dot_product_attention",
            )
    with g.check("x of shape (5, 8) (no batch axis) raises ValueError"):
        layer = call_student(g, "SelfAttention(8, 4)", SelfAttention, 8, 4)
        expect_value_error(g, lambda: layer(x[0]), "SelfAttention(8, 4) on x (5, 8)", "expected (B, T, 8)")
    g.finish()


# --------------------------------------------------------------------------- predict, then check

LEAKED_PAIRS = Prediction(
    name="predict_leaked_pairs",
    question="A causal mask built as torch.ones(8, 8).tril(1) instead of tril(0): how many (query, key) "
    "pairs let a query see a key after its own position?",
    tests="reading a mask: which diagonal tril keeps, and what a leak of the next token means",
    measure=lambda: int((torch.ones(8, 8).tril(1).bool() & ~ref.causal_mask(8)).sum()),
    explanation="tril(1) also keeps the first diagonal above the main one, so every query i < T - 1 sees "
    "key i + 1: {truth} leaks for T = 8. In training that is the very token the model must predict, so the "
    "loss drops fast and the model learns nothing it can use at generation time.",
)

#: Question 5b's setting: the width D, and the standard deviations of the entries of q and of k
VARIANCE_D, VARIANCE_Q_STD, VARIANCE_K_STD = 16, 2.0, 3.0
#: the choices of SCORE_VARIANCE, as numbers (the answer is the nearest in log space)
_VARIANCE_CHOICES = {"a": 16.0, "b": 96.0, "c": 576.0, "d": 9216.0}


def _score_variance() -> str:
    """Which choice the sample variance of ``q . k`` over 20,000 seeded pairs is nearest to (in log space), for
    ``q`` and ``k`` of :data:`VARIANCE_D` independent normal entries of the standard deviations of Question 5b."""
    generator = torch.Generator().manual_seed(1)
    q = VARIANCE_Q_STD * torch.randn(20_000, VARIANCE_D, generator=generator, dtype=torch.float64)  # (n, D)
    k = VARIANCE_K_STD * torch.randn(20_000, VARIANCE_D, generator=generator, dtype=torch.float64)  # (n, D)
    variance = (q * k).sum(dim=-1).var().item()
    return min(_VARIANCE_CHOICES, key=lambda c: abs(math.log(variance / _VARIANCE_CHOICES[c])))


SCORE_VARIANCE = Prediction(
    name="predict_score_variance",
    question="q has D = 16 independent entries of mean 0 and standard deviation 2; k, independent of q, has "
    "entries of mean 0 and standard deviation 3. Without the 1/sqrt(D), the variance of the score q . k is "
    "about how large?",
    tests="why scores are scaled: the variance of a sum of D independent products, each of variance "
    "Var(q_i) Var(k_i), beyond the unit-variance case",
    measure=_score_variance,
    explanation="Answer {truth}. Each product q_i k_i has mean 0 and variance E[q_i^2] E[k_i^2] = 4 x 9 = 36: "
    "the variances multiply, not the standard deviations (2 x 3 = 6 per product gives (b) 96). The D = 16 "
    "products are independent, so their variances add: 16 x 36 = 576, a standard deviation of 24. (a) 16 "
    "keeps only the count D, which is the answer for unit-variance entries alone; (d) 9216 = 16^2 x 36 adds "
    "the standard deviations of the products instead of their variances, as if all 16 moved together. The "
    "1/sqrt(D) of Vaswani et al. (2017) corrects for the width only: here it would leave a variance of 36, "
    "still enough to saturate the softmax, which is why the scale of the queries and keys matters too.",
    choices={"a": "16", "b": "96", "c": "576", "d": "9216"},
)


def _graph_depth(out: torch.Tensor, source: torch.Tensor) -> int:
    """The longest chain of operations, each needing the result of the one before, from the leaf tensor
    ``source`` to ``out``: the depth of the autograd graph between them (an operation on a whole tensor counts
    as one step)."""
    order, seen, stack = [], set(), [(out.grad_fn, False)]
    while stack:  # iterative depth-first search: a loop's graph is thousands of nodes deep
        node, expanded = stack.pop()
        if expanded:
            order.append(node)  # every node after the nodes it leads to
        elif node not in seen:
            seen.add(node)
            stack.append((node, True))
            stack.extend((n, False) for n, _ in node.next_functions if n is not None and n not in seen)
    depth: dict = {}
    for node in order:
        if getattr(node, "variable", None) is source:
            depth[node] = 0
        else:
            below = [depth[n] for n, _ in node.next_functions if depth.get(n) is not None]
            depth[node] = 1 + max(below) if below else None  # None: does not lead to source
    return depth[out.grad_fn]


def _generation_chain(model: torch.nn.Module, T: int) -> int:
    """The chain (:func:`_graph_depth`) from the embedding table of one of Chapter 1's readers to the logits of
    the last of ``T`` tokens it generates greedily from the prompt ``[0]``. The GRU reader carries its hidden
    state from step to step; the attention reader re-reads all the tokens so far at every step (its own
    forward, on embeddings). Each generated token is fed back as ``(hard + p - p.detach()) @ table``: in value
    exactly the embedding of the argmax token, in the graph dependent on the logits that chose it, which argmax
    alone would hide from autograd."""
    table = model.embed.weight  # (V, C)
    rows, h = [table[:1][None]], None  # the prompt's embedding (1, 1, C); the GRU's state
    with torch.enable_grad():
        for _ in range(T):
            if hasattr(model, "gru"):
                _, h = model.gru(rows[-1], h)  # h: (1, 1, C), the state after one more token
                logits = model.head(h[0])  # (1, V)
            else:
                t = len(rows)
                x = torch.cat(rows, dim=1) + model.pos[:t]  # (1, t, C)
                out, _ = model.attn(x, mask=ref.causal_mask(t))  # (1, t, C)
                logits = model.head(model.ln(x + out)[:, -1])  # (1, V)
            p = logits.softmax(-1)  # (1, V)
            hard = torch.nn.functional.one_hot(p.argmax(-1), table.shape[0]).to(p.dtype)  # (1, V)
            rows.append(((hard + p - p.detach()) @ table)[:, None])  # (1, 1, C): the chosen token, fed back
    return _graph_depth(logits, table)


#: the choices of SEQUENTIAL_STEPS: how the chain grows (GRU, attention) when T doubles
_STEPS_CHOICES = {"a": (2.0, 1.0), "b": (1.0, 1.0), "c": (2.0, 4.0), "d": (2.0, 2.0)}


def _sequential_steps() -> str:
    """Which choice the generation chains of Chapter 1's two readers fit, from T = 8 to T = 16 tokens."""
    from coursekit.experiments import recurrence

    # building the models draws weights from torch's global generator: leave the student's seed alone
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        gru, attention = recurrence.GRUReader(), recurrence.AttentionReader(max_len=17)
    grows = [_generation_chain(m, 16) / _generation_chain(m, 8) for m in (gru, attention)]
    return min(
        _STEPS_CHOICES,
        key=lambda c: sum(abs(math.log(g / w)) for g, w in zip(grows, _STEPS_CHOICES[c])),
    )


SEQUENTIAL_STEPS = Prediction(
    name="predict_sequential_steps",
    question="Chapter 1's GRU reader and attention reader (coursekit.experiments.recurrence) generate tokens "
    "greedily, each fed back as the next input (the GRU carries its state, the attention reader re-reads all "
    "the tokens so far). When they generate T = 16 tokens instead of T = 8, how does the longest chain of "
    "operations from the token embeddings to the last logits (each waiting for the one before) change?",
    tests="sequential operations: attention removes the chain across positions when the whole sequence is known "
    "(training, reading a prompt), not in generation, where each token waits for the one before",
    measure=_sequential_steps,
    explanation="Answer {truth}. Generation is a loop: token t + 1 is chosen from the logits of step t and only "
    "then fed back, so every step waits for the one before, whatever the layer. Per token the GRU adds one "
    "state update, its read-out and the choice of the token; the attention reader re-reads the tokens so far, "
    "but that is one pass of fixed depth (Q K^T, the softmax and the product with V handle all positions at "
    "once), so it too adds a fixed number of operations per token, and both chains double with the number of "
    "tokens. (a) applies the 'sequential operations' column of Vaswani et al.'s (2017) Table 1, O(1) for "
    "attention, where it does not hold: it describes a layer reading a sequence known in advance, as in "
    "training. (b) misses the feedback loop altogether. (c) confuses the chain with the work: re-reading t "
    "tokens costs O(t^2) per step (a KV cache cuts it to O(t)), but the passes still come one after another. "
    "This chain is why generation is slow on any hardware, and what speculative decoding (Leviathan et al., "
    "2023) works around.",
    choices={
        "a": "it doubles for the GRU and stays the same for attention",
        "b": "it stays the same for both",
        "c": "it doubles for the GRU and quadruples for attention",
        "d": "it doubles for both",
    },
)

check_predict_leaked_pairs, grade_predict_leaked_pairs = LEAKED_PAIRS.graders()
check_predict_score_variance, grade_predict_score_variance = SCORE_VARIANCE.graders()
check_predict_sequential_steps, grade_predict_sequential_steps = SEQUENTIAL_STEPS.graders()


# --------------------------------------------------------------------------- experiment

#: the experiment's band: with n = 20,000 draws the sample variance strays from its expectation by
#: about 2% (D = 1, where the products are heaviest-tailed) or less, so 12% is six standard deviations
VARIANCE_N, VARIANCE_BAND = 20_000, 0.12


def _seeded(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _variance(g: Grader, score_variance, D: int, seed: int, scaled: bool | None = None):
    where = f"score_variance({D}, {VARIANCE_N}, generator{'' if scaled is None else f', scaled={scaled}'})"
    args = (D, VARIANCE_N, _seeded(seed)) + (() if scaled is None else (scaled,))
    return where, call_student(g, where, score_variance, *args)


def grade_score_variance(score_variance) -> None:
    """Grade the experiment ``score_variance(D, n, generator, scaled=False)``: its measurements must
    fall in the stated band around the theory (D unscaled, 1 scaled)."""
    g = Grader("score_variance")
    with g.check("returns a Python float"):
        where, v = _variance(g, score_variance, 16, 3)
        g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")
    with g.check(
        f"unscaled, the variance is D within {VARIANCE_BAND:.0%} (D = 1, 8, 64, 256; scaled=False by default)"
    ):
        for D, seed in ((1, 11), (8, 12), (64, 13), (256, 14)):
            where, v = _variance(g, score_variance, D, seed)
            expect_in_band(
                g,
                where,
                v,
                D * (1 - VARIANCE_BAND),
                D * (1 + VARIANCE_BAND),
                "each product q_i k_i has variance 1 and the D products add up; check that you sum over the "
                "D entries (not average them) and that scaled defaults to False",
            )
    with g.check(f"scaled by 1/sqrt(D), the variance is 1 within {VARIANCE_BAND:.0%} for every D"):
        for D, seed in ((1, 21), (8, 22), (64, 23), (256, 24)):
            where, v = _variance(g, score_variance, D, seed, scaled=True)
            expect_in_band(
                g,
                where,
                v,
                1 - VARIANCE_BAND,
                1 + VARIANCE_BAND,
                "divide each score by sqrt(D) (dividing by D gives 1/D), then take the variance",
            )
    with g.check("draws q then k, float64, from its generator: the reference's result for the same seed"):
        for D, seed, scaled in ((1, 41, False), (8, 42, True), (64, 43, False)):
            where, v = _variance(g, score_variance, D, seed, scaled)
            expected = ref.score_variance(D, VARIANCE_N, torch.Generator().manual_seed(seed), scaled)
            g.expect(
                type(v) is float and math.isclose(v, expected, rel_tol=1e-9),
                f"{where} with a generator seeded {seed} gave {v!r}, the stated procedure gives {expected!r}: draw "
                "all of q, then all of k, with torch.randn(n, D, generator=generator, dtype=torch.float64), and "
                "take the unbiased variance (n - 1 in the denominator)",
            )
    with g.check("draws from its generator: the same seed gives the same result, another seed another"):
        _, a = _variance(g, score_variance, 8, 31)
        _, b = _variance(g, score_variance, 8, 31)
        _, c = _variance(g, score_variance, 8, 32)
        g.expect(
            a == b and a != c,
            f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: draw q and k with "
            "torch.randn(..., generator=generator), not from torch's global random state",
        )
    with g.check("raises ValueError for D < 1 or n < 2, and accepts D = 1 and n = 2"):
        small = call_student(g, "score_variance(1, 2, generator)", score_variance, 1, 2, _seeded(5))
        g.expect(
            type(small) is float and math.isfinite(small),
            f"score_variance(1, 2, generator) should return a float (two draws have a variance), got {describe(small)}",
        )
        for D, n in ((0, 100), (4, 1)):
            expect_value_error(
                g,
                lambda D=D, n=n: score_variance(D, n, _seeded(0)),
                f"D={D}, n={n}",
                "say which argument is out of range",
            )
    g.finish()


def check_score_variance(score_variance) -> None:
    """Public checks of ``score_variance``: one measurement each way, against the theory."""
    g = Grader("score_variance (public)")
    with g.check("score_variance(64, 20000, generator) is about 64, and about 1 with scaled=True"):
        where, v = _variance(g, score_variance, 64, 0)
        expect_in_band(
            g, where, v, 64 * (1 - VARIANCE_BAND), 64 * (1 + VARIANCE_BAND), "sum the D products q_i k_i"
        )
        where, v = _variance(g, score_variance, 64, 1, scaled=True)
        expect_in_band(g, where, v, 1 - VARIANCE_BAND, 1 + VARIANCE_BAND, "divide each score by sqrt(D)")
    g.finish()


# --------------------------------------------------------------------------- stretch


def _online(g: Grader, online_softmax, x: torch.Tensor, block: int):
    where = f"online_softmax(x {tuple(x.shape)} {dtype_name(x.dtype)}, block={block})"
    return where, call_student(g, where, online_softmax, x, block)


def grade_online_softmax(online_softmax) -> None:
    """Grade the stretch part ``online_softmax(x, block)``."""
    g = Grader("online_softmax")

    def compare(case):
        (lead, S), block, dtype, scale, seed = case
        x = tensor(seed, *lead, S, dtype=dtype, scale=scale)
        where, p = _online(g, online_softmax, x, block)
        expected = ref.softmax(x.double(), -1).to(dtype)
        g.expect(
            is_tensor(p) and p.shape == x.shape and p.dtype == x.dtype,
            f"{where} should be a tensor {dtype_name(dtype)} {tuple(x.shape)}, got {describe(p)}",
        )
        g.expect(close(p, expected, magnitude=1.0), f"{where}: {first_difference(p, expected)}")

    with g.check("equals softmax over the last axis for every block size, the last block shorter"):
        for_all(
            "online_softmax.values",
            st.tuples(
                st.tuples(st.lists(st.integers(1, 3), max_size=2).map(tuple), st.integers(1, 12)),
                st.integers(1, 13),
                st.sampled_from(FLOATS),
                st.just(3.0),
                SEEDS,
            ),
            compare,
            max_examples=15,
            first=(((2,), 7), 3, torch.float64, 3.0, 0),
        )
    with g.check("rescales the running sum when a later block raises the maximum (increasing rows)"):
        x = torch.arange(12, dtype=torch.float64).mul(3.0).reshape(1, 12)
        for block in (1, 4, 5):
            where, p = _online(g, online_softmax, x, block)
            expected = ref.softmax(x, -1)
            g.expect(
                close(p, expected),
                f"{where} for x = 0, 3, ..., 33: "
                + first_difference(
                    p,
                    expected,
                    "; when a block raises the maximum from m to m', multiply the sum so far by exp(m - m') "
                    "before adding the block",
                ),
            )
    with g.check("stays finite for entries around 1e4 (float32)"):
        x = tensor(5, 3, 9, dtype=torch.float32, scale=1.0) * 1e4
        where, p = _online(g, online_softmax, x, 4)
        expected = ref.softmax(x.double(), -1).float()
        g.expect(close(p, expected), f"{where} for entries near 1e4: {first_difference(p, expected)}")
    with g.check("a row that is all -inf gives zeros, a block that is all -inf is skipped (no NaN)"):
        x = tensor(6, 3, 8, dtype=torch.float64)
        x[0] = -math.inf
        x[1, :4] = -math.inf
        where, p = _online(g, online_softmax, x, 4)
        expected = ref.softmax(x, -1)
        g.expect(
            close(p, expected),
            f"{where} with row 0 all -inf and row 1's first block -inf: {first_difference(p, expected)}",
        )
    with g.check("does not modify x"):
        x = tensor(7, 2, 6, dtype=torch.float64)
        try:
            after = probe(online_softmax, x.clone(), 4).args[0]
        except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
            raise_unless_student_error(e)
            g.fail(f"online_softmax(x (2, 6), block=4): {raised(e)}")
        g.expect(
            is_tensor(after) and torch.equal(after, x),
            f"online_softmax modified its input in place: x was {show(x)}, afterwards {show(after)}",
        )
    with g.check("raises ValueError for a block that is not a positive integer"):
        x = tensor(8, 2, 5, dtype=torch.float64)
        for bad in (0, -1, -2):
            expect_value_error(g, lambda bad=bad: online_softmax(x, bad), f"block={bad}")
    g.finish()


def check_online_softmax(online_softmax) -> None:
    """Public checks of ``online_softmax``: the example of its docstring and one rescaling case."""
    g = Grader("online_softmax (public)")
    with g.check("online_softmax([0, log 3], 1) is [0.25, 0.75]"):
        x = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)
        where, p = _online(g, online_softmax, x, 1)
        g.expect(close(p, torch.tensor([0.25, 0.75], dtype=torch.float64)), f"{where}: got {show(p)}")
    with g.check("online_softmax(x, 2) equals softmax(x) for x = 0, 3, ..., 15"):
        x = torch.arange(6, dtype=torch.float64).mul(3.0)
        where, p = _online(g, online_softmax, x, 2)
        g.expect(close(p, ref.softmax(x, -1)), f"{where}: {first_difference(p, ref.softmax(x, -1))}")
    g.finish()

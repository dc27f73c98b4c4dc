"""Checks for Exercise 1 (attention).

Each graded part is a :class:`~coursekit.grading.spec.Spec`: one clause per promise of the part's text,
stated once. ``Spec.graders()`` gives the entry points the notebook calls with the student's object:
``check_*``, the *public* checks (each clause on its small fixed examples; ``coursekit check`` runs them
too), and ``grade_*``, the *hidden* checks (each clause on inputs :func:`~coursekit.grading.core.for_all`
draws from its key across what the text allows: ranks, sizes including 1, T != S, both float dtypes,
large magnitudes where stability is promised; then its fixed ``also`` inputs), compared with
:mod:`coursekit.attention` in float64. A failed check names the smallest input that shows the mistake.
Generic clauses come from :mod:`coursekit.grading.spec`; the others are module-level tests
``_<part>_<clause>(g, student, case)``. Private helpers: :func:`_device_type` reads the device of a result
even under the autograder (a meta tensor cannot travel back from the sandbox as data, and the attempt
says so); :func:`_compare` checks an attention against the reference, the named mistakes' hints first.

Over 500 lines: one clause per promise of the exercise text for each graded part, with the inputs that
provoke each clause and the common mistakes each hint names; splitting it would scatter one exercise's
specification over several files.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

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
from coursekit.grading.spec import (
    Call,
    Clause,
    Spec,
    dtype_kept,
    matches,
    procedure,
    raises,
    returns,
    unchanged,
)

#: the graded parts, by the names of their entry points ``check_<part>`` and ``grade_<part>``
_PARTS = ("softmax", "causal_mask", "attention", "self_attention", "predict_leaked_pairs")
_PARTS += ("predict_score_variance", "predict_sequential_steps", "score_variance", "online_softmax")
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]

F64, F32 = torch.float64, torch.float32
FLOATS = (F64, F32)
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
    axis = "{}: softmax over the wrong axis (dim {} instead of {}): use `dim` in both the max and the sum"
    return [
        (torch.exp(x), f"{where}: your slices do not sum to 1: divide by the sum over `dim` (keepdim=True)"),
        *((ref.softmax(x, d), axis.format(where, d, dim)) for d in others),
        (
            ref.softmax(x.float(), dim).double(),
            f"{where}: your result has only float32 precision: compute in x's dtype (no .float() on the way)",
        ),
    ]


def _softmax_matches(g: Grader, softmax, case) -> None:
    """The student's softmax against the reference, with the classic mistakes' hints first: along the default
    axis for ``(shape, dtype, scale, seed)``, along ``dim`` for ``((shape, dim), dtype, seed)``."""
    if len(case) == 4:
        shape, dtype, scale, seed = case
        dim, where = None, f"softmax(x) for x {shape} {dtype_name(dtype)}"
    else:
        (shape, dim), dtype, seed = case
        scale, where = 2.0, f"softmax(x, dim={dim}) for x {shape} {dtype_name(dtype)}"
    x = tensor(seed, *shape, dtype=dtype, scale=scale)
    p = call_student(g, where, softmax, x) if dim is None else call_student(g, where, softmax, x, dim=dim)
    dim = -1 if dim is None else dim
    expected = ref.softmax(x.double(), dim).to(x.dtype)
    first_match(
        g, p, [(m.to(x.dtype), h) for m, h in _softmax_mistakes(x.double(), dim, where)], right=expected
    )
    g.expect(close(p, expected, magnitude=magnitude(x)), f"{where}: {first_difference(p, expected)}")


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


def _softmax_call(case, where: str = "softmax(x, dim={2}) for x {0} {1}", scale: float = 3.0) -> Call:
    """``((shape, dim), dtype, seed)``: ``softmax(x, dim=dim)``, named by ``where`` (formatted with the shape,
    the dtype and dim), for an ``x`` of ``scale``."""
    (shape, dim), dtype, seed = case
    x = tensor(seed, *shape, dtype=dtype, scale=scale)
    return Call(where.format(shape, dtype_name(dtype), dim), (x,), {"dim": dim})


_SOFTMAX_CASES = st.tuples(_shape_and_dim(3), st.sampled_from(FLOATS), SEEDS)

SOFTMAX = Spec(
    "softmax",
    [
        returns(
            lambda case: _softmax_call(case, "softmax(x {} {}, dim={})", 1.0),
            lambda case: torch.empty(case[0][0], dtype=case[1]),
            st.tuples(_shape_and_dim(), st.sampled_from(FLOATS), SEEDS),
            text="returns a new tensor of x's shape and dtype (float32 or float64, any rank)",
            key="softmax.shape",
            budget="more",
            examples=[(((2, 3), -1), torch.float64, 0)],
        ),
        Clause(
            "equals exp(x) / sum(exp(x)) along the last axis by default",
            _softmax_matches,
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
            _softmax_matches,
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


def _causal_call(case) -> Call:
    """``(T, S)``: ``causal_mask(T, S)``, or ``causal_mask(T)`` where ``S`` is None."""
    args = tuple(case[:1] if case[1] is None else case[:2])
    return Call(f"causal_mask({', '.join(map(str, args))})", args)


def _causal_square(g: Grader, causal_mask, case) -> None:
    T, give_s = case
    call = _causal_call((T, T if give_s else None))
    m, expected = call_student(g, call.where, causal_mask, *call.args), ref.causal_mask(T)
    if is_tensor(m) and m.shape == expected.shape and m.dtype == torch.bool and T > 1:
        if torch.equal(m, expected.T):
            g.fail(f"{call.where} is transposed: query i (row) may attend to keys j <= i (columns)")
        if torch.equal(m, ~expected):
            g.fail(f"{call.where} is inverted: True means *may attend*")
        if not bool(m.diagonal().all()):
            g.fail(
                f"{call.where}: a position may not attend to itself: the diagonal must be True (off by one?)"
            )
        if bool((m & ~expected).any()):
            g.fail(f"{call.where}: a query can see a future key: entries above the diagonal must be False")
    g.expect(
        is_tensor(m) and m.dtype == torch.bool and torch.equal(m, expected),
        f"{call.where} differs from the lower-triangular mask: {first_difference(m, expected)}",
    )


def _causal_rectangle(g: Grader, causal_mask, case) -> None:
    T, S = case[0], sum(case)
    call = f"causal_mask({T}, {S})"
    m, expected = call_student(g, call, causal_mask, T, S), ref.causal_mask(T, S)
    aligned = f"the queries are the last {T} of {S} positions, so query i may attend to keys j <= i + (S - T)"
    top_left = torch.ones(T, S, dtype=torch.bool).tril()
    if is_tensor(m) and m.shape == (T, S) and T > 0 and torch.equal(m, top_left):
        g.fail(f"{call} is misaligned (top-left, like torch's is_causal): {aligned}")
    g.expect(
        is_tensor(m) and m.shape == (T, S) and m.dtype == torch.bool and torch.equal(m, expected),
        f"{call} is misaligned: {aligned}; {first_difference(m, expected)}",
    )


def _causal_device(g: Grader, causal_mask, case) -> None:
    """``(T, S, device)``: the mask is made on ``device`` (``None``: on the CPU, by default)."""
    call = _causal_call(case)
    where = call.where if case[2] is None else f"{call.where[:-1]}, device={case[2]!r})"
    got = _device_type(g, where, causal_mask, *call.args, **({} if case[2] is None else {"device": case[2]}))
    if case[2] is None:
        g.expect(got == "cpu", f"{where} should be on the CPU, got {got}")
    g.expect(
        case[2] in (None, got),
        f"{where} should be created on the {case[2]} device, got {got}: pass device=device "
        "to every tensor you create (torch.arange(..., device=device))",
    )


CAUSAL_MASK = Spec(
    "causal_mask",
    [
        returns(
            lambda case: _causal_call((case[0], sum(case[:2]) if case[2] else None)),
            lambda case: torch.empty(case[0], sum(case[:2]) if case[2] else case[0], dtype=torch.bool),
            st.tuples(st.integers(0, 9), st.integers(0, 5), st.booleans()),  # T, S - T, whether S is given
            text="returns a boolean (T, S) tensor; S defaults to T",
            key="causal.kind",
            examples=[(4, 0, False), (0, 2, True)],
        ),
        Clause(
            "S = T: query i sees keys 0..i (the lower triangle with its diagonal), T = 0 included",
            _causal_square,
            st.tuples(st.integers(0, 12), st.booleans()),
            key="causal.square",
            budget="many",
            examples=[(3, False)],  # causal_mask(3) is [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
            first=(5, False),
        ),
        Clause(
            "S > T keys: bottom-right aligned, query i sees keys j <= i + (S - T)",
            _causal_rectangle,
            st.tuples(st.integers(0, 9), st.integers(1, 8)),  # T, S - T
            key="causal.rectangle",
            budget="many",
            examples=[(2, 2)],  # causal_mask(2, 4) is [[1, 1, 1, 0], [1, 1, 1, 1]]
            first=(3, 2),
        ),
        raises(
            _causal_call,
            st.one_of(
                st.tuples(st.integers(1, 8), st.integers(0, 7)).map(lambda ts: (ts[0] + ts[1], ts[1])),
                st.tuples(st.integers(-5, -1), st.one_of(st.none(), st.integers(0, 5))),
            ),
            fix="a ValueError that names T and S: 0 <= T <= S",
            text="raises ValueError unless 0 <= T <= S",
            key="causal.invalid",
            examples=[(3, 2), (1, 0), (-1, None)],
            also=[(-1, None), (-1, 0), (1, 0)],
        ),
        Clause(
            "creates the mask on `device` (the CPU by default)",
            _causal_device,
            examples=[(3, None, "meta"), (2, 5, "meta")],
            also=[(3, None, None)],
        ),
    ],
)
check_causal_mask, grade_causal_mask = CAUSAL_MASK.graders()


# --------------------------------------------------------------------------- attention


LEAD = st.lists(st.integers(1, 3), max_size=2).map(tuple)  # no leading dims, (B,), or (A, B)
_FS = (st.sampled_from(FLOATS), SEEDS)  # a dtype and a seed


def _sized(T: int, S: int | tuple, D: int, Dv: int, *extra):
    """Leading dims and T, S, D, Dv from 1 (or the low end of a pair) up to the given sizes, then
    ``extra``: the inputs of an attention."""
    return st.tuples(
        LEAD, *(st.integers(*n) if isinstance(n, tuple) else st.integers(1, n) for n in (T, S, D, Dv)), *extra
    )


#: leading dims, T, S, D, Dv, dtype, seed
ATTENTION = _sized(6, 7, 8, 5, *_FS)
#: then which axes of the mask are full (the others 1) and how many leading axes it leaves out
_MASKED = _sized(6, 7, 6, 4, *_FS, st.lists(st.booleans(), min_size=4, max_size=4), st.integers(0, 3))


def _qkv(case, scale: float = 1.0):
    lead, T, S, D, Dv, dtype, seed = case[:7]
    q = tensor(seed, *lead, T, D, dtype=dtype, scale=scale)
    k = tensor(seed + 1, *lead, S, D, dtype=dtype, scale=scale)
    return q, k, tensor(seed + 2, *lead, S, Dv, dtype=dtype)


def _sizes(q, k, v, mask=None, scale=None) -> str:
    text = f"for q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} ({dtype_name(q.dtype)})"
    if mask is not None:
        text += f", a {'boolean' if mask.dtype == torch.bool else 'floating'} mask {tuple(mask.shape)}"
    return text if scale is None else f"{text}, scale={scale:g}"


def _double(t):
    return t if t is None or t.dtype == torch.bool else t.double()


def _mask_shape(full: tuple, keep: list[bool], drop: int) -> tuple:
    """A shape that broadcasts to ``full``: some axes of size 1, some leading axes left out."""
    return tuple(n if k else 1 for n, k in zip(full, keep))[min(drop, len(full) - 1) :]


def _bool_mask(seed: int, shape: tuple) -> torch.Tensor:
    """About 60% True, and one key visible to every query (so no row is fully masked)."""
    mask = tensor(seed, *shape) > -0.25
    mask[..., seed % shape[-1]] = True
    return mask


#: the hints of classic wrong attentions (see :func:`_attention_mistakes`)
_UNSCALED = "the scores are not scaled: divide q k^T by sqrt(D)"
_BY_D = "the scores are divided by D: divide by sqrt(D) instead"
_UNUSED = (
    "was not used: multiply the scores by `scale` when it is given "
    "(test `scale is None`, since 0 is a valid scale)"
)
_INVERTED = "the mask is inverted: True means the query *may attend* to the key"
_AFTER = "masked keys still count in the softmax: set their scores to -inf before the softmax"
_IGNORED = "the floating mask was ignored: add it to the scaled scores"
_BEFORE = "the floating mask was added before scaling: add it to the *scaled* scores"
_AS_BOOL = "a floating mask was used as a boolean one: a floating mask is *added* to the scores"
_QUERIES = "softmax over the queries: take the softmax over the keys (last axis)"


def _attention_mistakes(q, k, v, mask, scale, where) -> list:
    """Classic wrong attentions in q's dtype, each with its hint: the reference with another mask or
    scale, the mask applied after the softmax, the softmax over the queries."""
    dtype, D = q.dtype, q.shape[-1]
    q, k, v, mask = map(_double, (q, k, v, mask))
    s = 1 / math.sqrt(D) if scale is None else scale
    wrong = (
        [(mask, 1.0, _UNSCALED), (mask, 1.0 / D, _BY_D)]
        if scale is None
        else [(mask, None, f"scale={scale:g} {_UNUSED}")]
    )
    scores, after = (q @ k.transpose(-2, -1)) * s, []
    if mask is not None and mask.dtype == torch.bool:
        wrong.append((~mask, scale, _INVERTED))
        after = [((ref.softmax(scores, -1) * mask) @ v, _AFTER)]
        scores = scores.masked_fill(~mask, -math.inf)
    elif mask is not None:
        wrong += [(None, scale, _IGNORED), (mask * s, scale, _BEFORE), (mask != 0, scale, _AS_BOOL)]
        scores = scores + mask
    out = [(ref.scaled_dot_product_attention(q, k, v, m, sc)[0], h) for m, sc, h in wrong]
    out += [*after, (ref.softmax(scores, -2) @ v, _QUERIES)]
    return [(m.to(dtype), f"{where}: {h}") for m, h in out]


def _attend(g: Grader, attention, q, k, v, mask=None, scale=None, where: str | None = None):
    """The student's ``(out, weights)`` (mask and scale passed only when given) after the named mistakes'
    hints, and the reference's ``(out, weights, magnitude)``."""
    where = where or _sizes(q, k, v, mask, scale)
    kwargs = {} if mask is None and scale is None else {"mask": mask, "scale": scale}
    out, w = _unpack(g, call_student(g, where, attention, q, k, v, **kwargs), "scaled_dot_product_attention")
    # coursekit's (out, weights) in float64, cast to q's dtype, and the magnitude of the scores
    exp_out, exp_w = ref.scaled_dot_product_attention(
        *map(_double, (q, k, v)), mask=_double(mask), scale=scale
    )
    s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    mag = magnitude((q.double() @ k.double().transpose(-2, -1)) * s, v)
    try:
        mistakes = _attention_mistakes(q, k, v, mask, scale, where)
    except Exception:  # noqa: BLE001 (no named mistake on an input where one cannot be computed)
        mistakes = []
    first_match(g, out, mistakes, right=exp_out.to(q.dtype))
    return where, out, w, exp_out.to(q.dtype), exp_w.to(q.dtype), mag


def _same_attention(g: Grader, where: str, out, w, exp_out, exp_w, mag: float) -> None:
    g.expect(close(w, exp_w, magnitude=mag), f"{where}: the weights differ: {first_difference(w, exp_w)}")
    g.expect(close(out, exp_out, magnitude=mag), f"{where}: out differs: {first_difference(out, exp_out)}")


def _compare(g: Grader, attention, q, k, v, mask=None, scale=None) -> None:
    """The student's attention against the reference: the named mistakes first, then finiteness, rows
    that sum to 1, the weights and out."""
    where, out, w, exp_out, exp_w, mag = _attend(g, attention, q, k, v, mask, scale)
    for name, got in (("out", out), ("the weights", w)):
        if is_tensor(got) and not bool(torch.isfinite(got).all()):
            g.fail(
                f"{where}: {name} hold inf or NaN ({show(got)}) where the reference is finite: use your "
                "stable softmax (it subtracts each row's maximum before exponentiating)"
            )
    if is_tensor(w) and w.shape == exp_w.shape:
        g.expect(
            close(w.sum(-1), exp_w.double().sum(-1).round().to(q.dtype), magnitude=mag),
            f"{where}: rows of the weights do not sum to 1 ({show(w.sum(-1))}): take the softmax over the "
            "keys (last axis), after masking",
        )
    _same_attention(g, where, out, w, exp_out, exp_w, mag)


def _att_values(g: Grader, attention, case, large: bool = False) -> None:
    """Without a mask; ``case[7]``, where drawn: the scale, or with ``large`` the size of q and k."""
    drawn = case[7] if len(case) > 7 else None
    _compare(g, attention, *_qkv(case, scale=drawn if large else 1.0), scale=None if large else drawn)


def _att_masked(g: Grader, attention, case, additive: bool = False) -> None:
    """A boolean mask (``case[7] == "causal"``: a (T, S) causal mask broadcast over the batch), or with
    ``additive`` a floating one."""
    q, k, v = _qkv(case)
    full = (*q.shape[:-1], k.shape[-2])
    if case[7] == "causal":
        mask = ref.causal_mask(*full[-2:])
    elif not additive:
        mask = _bool_mask(case[6] + 3, _mask_shape(full, *case[7:9]))
    else:
        shape = _mask_shape(full, case[7], case[8])
        mask = tensor(case[6] + 4, *shape, dtype=q.dtype, scale=2.0)
        mask = mask.masked_fill(tensor(case[6] + 5, *shape) > 0.8, -math.inf)
        mask[..., case[6] % shape[-1]] = 0.5  # one finite entry per row
    _compare(g, attention, q, k, v, mask=mask)


def _att_empty(g: Grader, attention, case) -> None:
    lead, T, S, D, Dv, dtype, seed, boolean = case
    q, k, v = _qkv(case)
    mask, row = tensor(seed + 6, *lead, T, S) > -0.5, seed % T
    mask[..., row, :] = False
    mask = mask if boolean else torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, -math.inf)
    where = _sizes(q, k, v, mask) + f" that hides every key from query {row}"
    where, out, w, exp_out, exp_w, mag = _attend(g, attention, q, k, v, mask, where=where)
    if any(is_tensor(t) and bool(torch.isnan(t).any()) for t in (out, w)):
        g.fail(
            f"{where}: gave NaN: query {row}'s weights must be all zero (see the softmax part: a row of "
            "all -inf gives zeros)"
        )
    w_row = w[..., row, :] if is_tensor(w) and w.shape == exp_w.shape else None
    if w_row is not None and close(w_row, torch.full_like(w_row, 1 / S)):
        g.fail(
            f"{where}: query {row} got uniform weights 1/S: a large finite number such as -1e9 is not "
            "-inf; mask with -inf so that the softmax gives zeros"
        )
    _same_attention(g, where, out, w, exp_out, exp_w, mag)


def _att_grads(g: Grader, attention, case) -> None:
    lead, T, S, D, Dv, seed, use_mask = case
    q, k, v = _qkv((lead, T, S, D, Dv, torch.float64, seed))
    mask = _bool_mask(seed + 7, (T, S)) if use_mask else None
    upstream, where = tensor(seed + 8, *lead, T, Dv), _sizes(q, k, v, mask)
    leaves = (t.clone().requires_grad_() for t in (q, k, v))
    p = call_student(g, where, probe, attention, *leaves, mask=mask, backward=(0, upstream))
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


def _att_call(case) -> Call:
    """q, k, v and a boolean, floating or no (T, S) mask, with a scale or none."""
    lead, T, S, D, Dv, dtype, seed, kind, scale = case
    mask = None if kind == "none" else _bool_mask(seed + 9, (T, S))
    if kind == "float":
        mask = torch.zeros(T, S, dtype=dtype).masked_fill(~mask, -math.inf)
    q, k, v = _qkv(case)
    return Call(_sizes(q, k, v, mask, scale), (q, k, v), {"mask": mask, "scale": scale})


ATTENTION_SPEC = Spec(
    "scaled_dot_product_attention",
    [
        returns(
            lambda case: Call(f"scaled_dot_product_attention(q, k, v) {_sizes(*_qkv(case))}", _qkv(case)),
            lambda c: (
                torch.empty(*c[0], c[1], c[4], dtype=c[5]),
                torch.empty(*c[0], c[1], c[2], dtype=c[5]),
            ),
            ATTENTION,
            text="returns (out, weights) of shapes (..., T, Dv) and (..., T, S) in q's dtype, any leading dims",
            key="att.shapes",
            budget="more",
            # one leading dim, none, two
            examples=[((2,), 5, 6, 4, 3, F64, 0), ((), 3, 5, 4, 6, F32, 11), ((2, 2), 3, 5, 4, 6, F64, 12)],
        ),
        Clause(
            "without a mask: weights = softmax(q k^T / sqrt(D)) over the keys, out = weights v",
            _att_values,
            ATTENTION,
            key="att.values",
            budget="more",
            examples=[((3,), 5, 7, 8, 3, F64, 1)],
        ),
        Clause(
            "`scale` multiplies the scores when given (0 and negative values included)",
            _att_values,
            _sized(6, (2, 7), 8, 5, *_FS, st.sampled_from([0.0, 0.3, 2.0, -1.0, 1.0])),  # S >= 2
            key="att.scale",
            budget="more",
            examples=[((2,), 4, 5, 4, 3, F64, 2, 0.0), ((2,), 3, 5, 4, 6, F32, 13, 0.5)],
        ),
        Clause(
            "a boolean mask, broadcastable to (..., T, S): True means may attend, False removes the key",
            _att_masked,
            _MASKED,
            key="att.bool",
            budget="more",
            examples=[((2,), 4, 5, 4, 3, F64, 3, [True] * 4, 0), ((2,), 3, 5, 4, 6, F32, 11, "causal", 0)],
            also=[((3,), 6, 6, 4, 3, F64, 7, "causal", 0)],  # a (T, S) causal mask broadcast over the batch
        ),
        Clause(
            "a floating mask, broadcastable to (..., T, S), is added to the scaled scores (-inf removes a key)",
            functools.partial(_att_masked, additive=True),
            _MASKED,
            key="att.additive",
            budget="more",
            examples=[((2,), 4, 5, 4, 3, F64, 4, [True] * 4, 0)],
        ),
        Clause(
            "a query with no visible key gets zero weights and a zero output, not NaN",
            _att_empty,
            _sized(5, 6, 6, 4, *_FS, st.booleans()),
            key="att.empty",
            budget="more",
            examples=[((2,), 3, 4, 4, 3, F64, 1, True)],
        ),
        Clause(
            "stable for large scores (|q k^T| in the thousands, float32 and float64)",
            functools.partial(_att_values, large=True),
            _sized(5, 6, 6, 4, *_FS, st.sampled_from([10.0, 30.0, 60.0])),
            key="att.large",
            examples=[((2,), 3, 4, 4, 3, F32, 5, 30.0)],
        ),
        Clause(
            "gradients with respect to q, k and v match the reference",
            _att_grads,
            _sized(4, 5, 4, 3, SEEDS, st.booleans()),
            key="att.grad",
            budget="handful",
            examples=[((2,), 3, 4, 4, 3, 6, False)],
        ),
        unchanged(
            _att_call,
            _sized(
                5, 6, 6, 4, *_FS, st.sampled_from(["bool", "float", "none"]), st.sampled_from([None, 0.5])
            ),
            key="att.inplace",
            budget="some",
            examples=[((2,), 5, 6, 4, 3, F64, 8, "bool", None)],
            text="leaves q, k, v and the mask unchanged (no in-place changes)",
            advice="q, k, v are arguments 1 to 3; a tensor that was modified in place (q *= scale, "
            "masked_fill_ ...) changes the caller's: compute new tensors",
        ),
    ],
)
check_attention, grade_attention = ATTENTION_SPEC.graders("attention")


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


def _build(g: Grader, SelfAttention, C: int, D: int | None, bias: bool):
    """``SelfAttention(C, D, bias=bias)`` (``D = None``: no d_head), and the call that made it."""
    args = (C,) if D is None else (C, D)
    call = f"SelfAttention({', '.join(map(str, args))}, bias={bias})"
    return call_student(g, call, SelfAttention, *args, bias=bias), call


#: batch, T, C, D (None: the default), bias, dtype, seed
_SELF = (*(st.integers(1, n) for n in (3, 6, 8)), st.none() | st.integers(1, 6), st.booleans(), *_FS)


def _sa_layers(g: Grader, SelfAttention, case) -> None:
    C, D, bias = case
    m, call = _build(g, SelfAttention, C, D, bias)
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


def _sa_parameters(g: Grader, SelfAttention, case) -> None:
    C, D, bias = case
    width = C if D is None else D
    expected = 3 * (C * width + width) if bias else 3 * C * width
    m, call = _build(g, SelfAttention, C, D, bias)
    sd = m.state_dict()
    n = sum(p.numel() for p in sd.values()) if isinstance(sd, dict) else -1
    fix = "" if bias else ": pass bias=bias to the three nn.Linear layers"
    g.expect(n == expected, f"{call} should have {expected} parameters, got {n}{fix}")


def _sa_values(g: Grader, SelfAttention, case) -> None:
    B, T, C, D, bias, dtype, seed = case
    m, r, call = _self_attention_pair(g, SelfAttention, C, D, bias, dtype, f"sa.values.{seed}")
    x = tensor(seed, B, T, C, dtype=dtype)
    where = f"{call} on x {(B, T, C)} {dtype_name(dtype)} with weights of ours"
    out, w = _unpack(g, call_student(g, where, m, x), "SelfAttention.forward")
    out_r, w_r = (t.detach() for t in r(x))
    width = C if D is None else D
    g.expect(
        is_tensor(out) and out.shape == (B, T, width) and out.dtype == dtype,
        f"{where}: out should be {dtype_name(dtype)} {(B, T, width)}, got {describe(out)}",
    )
    g.expect(
        is_tensor(w) and w.shape == (B, T, T), f"{where}: weights should be {(B, T, T)}, got {describe(w)}"
    )
    with torch.no_grad():
        q, k, v = r.q_proj(x), r.k_proj(x), r.v_proj(x)
        qk = "queries come from q_proj(x), keys from k_proj(x)"
        mistakes = [
            (q, q, None, f"the keys are q_proj(x): {qk}"),
            (k, k, None, f"the queries are k_proj(x): {qk}"),
            (k, q, None, "queries and keys are swapped"),
            (
                q,
                k,
                1 / math.sqrt(C),
                "the scores are scaled by 1/sqrt(C): the given attention scales by 1/sqrt(D)",
            ),
        ]
        mistakes = [
            (ref.scaled_dot_product_attention(a, b, v, scale=s)[0], f"{where}: {h}")
            for a, b, s, h in mistakes
        ]
    if close(w, w_r) and not close(out, out_r):
        g.fail(f"{where}: the weights match but the output does not: the values must be v_proj(x)")
    first_match(g, out, mistakes, right=out_r)
    g.expect(
        close(w, w_r),
        f"{where}: the attention weights differ: "
        + first_difference(w, w_r, " (queries come from q_proj(x) and keys from k_proj(x))"),
    )
    g.expect(
        close(out, out_r),
        f"{where}: out differs from the reference with the same weights ({first_difference(out, out_r)})",
    )


def _sa_masked(g: Grader, SelfAttention, case) -> None:
    B, T, C, D, bias, dtype, seed, kind, keep, drop = case
    m, r, call = _self_attention_pair(g, SelfAttention, C, D, bias, dtype, f"sa.mask.{seed}")
    x, shape = tensor(seed, B, T, C, dtype=dtype), _mask_shape((B, T, T), keep, drop)
    mask = ref.causal_mask(T) if kind == "causal" else _bool_mask(seed + 1, shape)
    if kind == "float":
        mask = tensor(seed + 2, *shape, dtype=dtype).masked_fill(~mask, -math.inf)
    where = f"{call} on x {(B, T, C)} {dtype_name(dtype)} with a {kind} mask {tuple(mask.shape)}"
    out, _ = _unpack(g, call_student(g, where, m, x, mask=mask), "SelfAttention.forward")
    out_r, unmasked = r(x, mask=mask)[0].detach(), r(x)[0].detach()
    if close(out, unmasked) and not close(out_r, unmasked):
        g.fail(
            f"{where}: the output is the unmasked one: pass mask on to scaled_dot_product_attention "
            "(is the mask passed on?)"
        )
    g.expect(close(out, out_r), f"{where}: out differs from the reference: {first_difference(out, out_r)}")


def _sa_forward(shape: tuple) -> Call:
    """``SelfAttention(8, 4)`` on an x of ``shape``."""
    x = tensor(sum(shape), *shape, dtype=F32)
    build = lambda g, SelfAttention: call_student(g, "SelfAttention(8, 4)", SelfAttention, 8, 4)
    return Call(f"SelfAttention(8, 4) on x {shape}", (x,), build=build)


SELF_ATTENTION = Spec(
    "SelfAttention",
    [
        Clause(
            "has nn.Linear layers q_proj, k_proj and v_proj, each C -> D (d_head defaults to d_model)",
            _sa_layers,
            st.tuples(st.integers(1, 9), st.one_of(st.none(), st.integers(1, 7)), st.booleans()),
            key="sa.layers",
            budget="some",
            examples=[(8, 4, True)],
        ),
        Clause(
            "bias=False: no biases (3 C D parameters; 3 (C D + D) with bias=True)",
            _sa_parameters,
            examples=[(8, 4, True), (8, 4, False)],  # 108 and 96 parameters
            also=[(5, 3, True), (5, 3, False), (6, None, True), (6, None, False)],
        ),
        Clause(
            "forward(x) returns (out (B, T, D), weights (B, T, T)) of attention over q_proj(x), k_proj(x), "
            "v_proj(x)",
            _sa_values,
            st.tuples(*_SELF),
            key="sa.values",
            examples=[(2, 5, 8, 4, True, F64, 0)],
        ),
        Clause(
            "forward(x, mask) passes the mask on: boolean or floating, broadcastable to (B, T, T)",
            _sa_masked,
            st.tuples(
                *_SELF,
                st.sampled_from(["causal", "bool", "float"]),  # the mask's kind
                st.lists(st.booleans(), min_size=3, max_size=3),  # its full axes (the others 1)
                st.integers(0, 2),  # how many leading axes it leaves out
            ),
            key="sa.mask",
            examples=[
                (2, 5, 8, 4, True, F64, 1, "causal", [True] * 3, 0),
                (2, 5, 8, 4, True, F32, 22, "float", [True] * 3, 0),
            ],
        ),
        raises(
            _sa_forward,
            fix="a ValueError naming the shape expected, (B, T, 8), and the one received",
            text="raises ValueError unless x is (B, T, C) with C = d_model",
            examples=[(5, 8)],
            also=[(2, 5, 6), (1, 2, 5, 8), (2, 5, 9)],
        ),
    ],
)
check_self_attention, grade_self_attention = SELF_ATTENTION.graders("self_attention")


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
# D = 256 is measured by the hidden check only (``also``): its two draws of 20,000 x 256 normals took
# 0.5 s of the public check's 0.9, which a student runs each time they check the part


def _seeded(seed: int):
    return student_side("torch", torch).Generator().manual_seed(seed)


def _variance_call(case, about: str = "") -> Call:
    """``(D, seed, scaled)``: one measurement on a generator seeded ``seed`` (``scaled=None``: the default)."""
    D, seed, scaled = case
    where = f"score_variance({D}, {VARIANCE_N}, generator{'' if scaled is None else f', {scaled=}'}){about}"
    return Call(where, (D, VARIANCE_N, _seeded(seed)) + (() if scaled is None else (scaled,)))


def _variance(g: Grader, score_variance, case):
    call = _variance_call(case)
    return call.where, call_student(g, call.where, score_variance, *call.args)


def _variance_band(case) -> tuple[float, float]:
    """The band around the theory: D unscaled, 1 scaled."""
    theory = 1 if case[2] else case[0]
    return theory * (1 - VARIANCE_BAND), theory * (1 + VARIANCE_BAND)


def _variance_float(g: Grader, score_variance, case) -> None:
    where, v = _variance(g, score_variance, case)
    g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")


def _variance_in_band(g: Grader, score_variance, case) -> None:
    where, v = _variance(g, score_variance, case)
    why = (
        "divide each score by sqrt(D) (dividing by D gives 1/D), then take the variance"
        if case[2]
        else "each product q_i k_i has variance 1 and the D products add up; check that you sum over the "
        "D entries (not average them) and that scaled defaults to False"
    )
    expect_in_band(g, where, v, *_variance_band(case), why)


def _variance_seeded(g: Grader, score_variance, case) -> None:
    """``(D, seed, other)``: twice on ``seed``, once on ``other``."""
    a, b, c = (_variance(g, score_variance, (case[0], s, None))[1] for s in (case[1], case[1], case[2]))
    g.expect(
        a == b and a != c,
        f"two generators seeded alike gave {a!r} and {b!r}, and another seed gave {c!r}: draw q and k with "
        "torch.randn(..., generator=generator), not from torch's global random state",
    )


def _variance_range(g: Grader, score_variance, case) -> None:
    """``(D, n)``: a float where ``D >= 1`` and ``n >= 2``, else a ValueError."""
    D, n = case
    if D < 1 or n < 2:
        call = lambda: score_variance(D, n, _seeded(0))  # noqa: E731
        return expect_value_error(g, call, f"D={D}, n={n}", "say which argument is out of range")
    v = call_student(g, f"score_variance({D}, {n}, generator)", score_variance, D, n, _seeded(5))
    g.expect(
        type(v) is float and math.isfinite(v),
        f"score_variance({D}, {n}, generator) should return a float (two draws have a variance), got {describe(v)}",
    )


SCORE_VARIANCE_SPEC = Spec(
    "score_variance",
    [
        Clause("returns a Python float", _variance_float, examples=[(16, 3, None)]),
        Clause(
            f"unscaled, the variance is D within {VARIANCE_BAND:.0%} (D = 1, 8, 64, 256; scaled=False by default)",
            _variance_in_band,
            examples=[(1, 11, None), (8, 12, None), (64, 13, None)],
            also=[(256, 14, None)],
        ),
        Clause(
            f"scaled by 1/sqrt(D), the variance is 1 within {VARIANCE_BAND:.0%} for every D",
            _variance_in_band,
            examples=[(1, 21, True), (8, 22, True), (64, 23, True)],
            also=[(256, 24, True)],
        ),
        procedure(
            lambda case: _variance_call(case, f" with a generator seeded {case[1]}"),
            lambda case: ref.score_variance(
                case[0], VARIANCE_N, torch.Generator().manual_seed(case[1]), case[2]
            ),
            text="draws q then k, float64, from its generator: the reference's result for the same seed",
            steps="draw all of q, then all of k, with torch.randn(n, D, generator=generator, dtype=torch.float64), "
            "and take the unbiased variance (n - 1 in the denominator)",
            examples=[(1, 41, False), (8, 42, True), (64, 43, False)],
            inputs=st.tuples(st.sampled_from([1, 4, 16, 64]), st.integers(100, 2**31 - 1), st.booleans()),
            key="variance.procedure",
            band=_variance_band,
        ),
        Clause(
            "draws from its generator: the same seed gives the same result, another seed another",
            _variance_seeded,
            examples=[(8, 31, 32)],
        ),
        Clause(
            "raises ValueError for D < 1 or n < 2, and accepts D = 1 and n = 2",
            _variance_range,
            examples=[(1, 2), (0, 100), (4, 1)],
        ),
    ],
)
check_score_variance, grade_score_variance = SCORE_VARIANCE_SPEC.graders()


# --------------------------------------------------------------------------- stretch


def _online(x: torch.Tensor, block: int, about: str = "") -> Call:
    return Call(f"online_softmax(x {tuple(x.shape)} {dtype_name(x.dtype)}, block={block}){about}", (x, block))


def _softmax_of(call: Callable[[object], Call]) -> Callable[[object], torch.Tensor]:
    """The reference of ``call``'s inputs: the softmax over the last axis of its ``x``, in x's dtype."""

    def reference(case) -> torch.Tensor:
        x = call(case).args[0]
        return ref.softmax(x.double(), -1).to(x.dtype)

    return reference


def _online_values(case) -> Call:
    """A drawn ``((lead, S), block, dtype, scale, seed)``, or the docstring's example ``(values, block)``."""
    if len(case) == 2:
        return _online(torch.tensor(case[0], dtype=F64), case[1], " for x = [0, log 3]")
    (lead, S), block, dtype, scale, seed = case
    return _online(tensor(seed, *lead, S, dtype=dtype, scale=scale), block)


def _online_rising(block: int) -> Call:
    """Rows that increase: every block raises the maximum."""
    return _online(torch.arange(12, dtype=F64).mul(3.0).reshape(1, 12), block, " for x = 0, 3, ..., 33")


def _online_large(block: int) -> Call:
    return _online(tensor(5, 3, 9, dtype=F32, scale=1.0) * 1e4, block, " for entries near 1e4")


def _online_masked(block: int) -> Call:
    x = tensor(6, 3, 8, dtype=F64)
    x[0], x[1, :4] = -math.inf, -math.inf
    return _online(x, block, " with row 0 all -inf and row 1's first block -inf")


ONLINE_SOFTMAX = Spec(
    "online_softmax",
    [
        matches(
            _online_values,
            _softmax_of(_online_values),
            st.tuples(
                st.tuples(st.lists(st.integers(1, 3), max_size=2).map(tuple), st.integers(1, 12)),
                st.integers(1, 13),
                st.sampled_from(FLOATS),
                st.just(3.0),
                SEEDS,
            ),
            text="equals softmax over the last axis for every block size, the last block shorter",
            key="online_softmax.values",
            budget="plenty",
            # the docstring's example: online_softmax([0, log 3], 1) is [0.25, 0.75]
            examples=[(((2,), 7), 3, F64, 3.0, 0), ((0.0, math.log(3.0)), 1)],
        ),
        matches(
            _online_rising,
            _softmax_of(_online_rising),
            text="rescales the running sum when a later block raises the maximum (increasing rows)",
            examples=[1],
            also=[4, 5],
            advice="; when a block raises the maximum from m to m', multiply the sum so far by exp(m - m') "
            "before adding the block",
        ),
        dtype_kept(
            _online_large,
            _softmax_of(_online_large),
            None,
            key=None,
            examples=[4],
            text="stays finite for entries around 1e4 (float32)",
        ),
        matches(
            _online_masked,
            _softmax_of(_online_masked),
            text="a row that is all -inf gives zeros, a block that is all -inf is skipped (no NaN)",
            examples=[4],
        ),
        unchanged(
            lambda block: _online(tensor(7, 2, 6, dtype=F64), block),
            examples=[4],
            text="does not modify x",
            advice="compute new tensors (no x -= m or x.exp_())",
        ),
        raises(
            lambda block: _online(tensor(8, 2, 5, dtype=F64), block),
            fix="say that block must be a positive integer, and what came",
            text="raises ValueError for a block that is not a positive integer",
            examples=[0],
            also=[-1, -2],
        ),
    ],
)
check_online_softmax, grade_online_softmax = ONLINE_SOFTMAX.graders()

"""Checks for Exercise 7 (GPT decoding): a :class:`~coursekit.grading.spec.Spec` per graded part.

The hidden checks draw inputs across what the text allows (batch sizes and lengths including 1, any
leading shape, both float dtypes, large logits where stability is promised, random toy language models
for beam search, every grouping of key/value heads). Answers are compared with :mod:`coursekit.decoding` /
:mod:`coursekit.gpt` and with independent facts (the loss on explicitly shifted tensors, toy models whose
best sequences are worked out by hand, greedy decoding, the log-probability of the returned sequence,
attention over the whole sequence); the common mistakes get their own hints.

**Models cross no wire.** Under the autograder the student's functions run in a sandboxed process
and only data crosses to it. So the graders of parts 4 and 5 also take the *classes* they need, from
the names the notebook imports (``TableLM``, ``GPT``, ``GPTConfig``, ``MultiHeadAttention``,
``LayerCache``; the tests receive them with the function as one tuple): they build the objects with
them in the student's process, push weights with ``load_state_dict``, and build the same objects
from coursekit here for the expected answers. The public check of part 4 gets no ``GPT`` and
``GPTConfig``: it takes the notebook's (:func:`~coursekit.grading.core.student_side`).

:class:`TableLM`, part 4's toy language model, lives in :mod:`coursekit.toys` (re-exported here,
where notebooks released before it moved import it from), so that the notebook (and so the sandbox)
can import it. With a ``(V, V, V)`` table its next token depends on the last *two* tokens, which its
cache remembers per row: a beam search that does not reorder the cache reads the wrong rows, as it
would with a GPT. :func:`_beam_margin` measures how close a beam search came to a tie (drawn cases
that hang on rounding are skipped); :func:`_dropout_subsets` decides whether an attention output is
"dropout on the attention weights with probability p" whatever the random mask was.

Over 500 lines: one clause per rule of the exercise text for each graded part, with the inputs that
provoke each clause, the toy models of beam search and the common mistakes each hint names;
splitting it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref

import torch
import torch.nn.functional as F
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from coursekit import attention as att
from coursekit import decoding as dec
from coursekit import gpt as ref
from coursekit import multihead as mh
from coursekit import speculative
from coursekit.grading.core import (
    Grader,
    call_student,
    close,
    describe,
    dtype_name,
    first_match,
    generator,
    is_tensor,
    magnitude,
    probe,
    raise_unless_student_error,
    raised,
    rand,
    random_weights,
    same,
    seeded,
    set_attr,
    student_side,
    tensor,
)
from coursekit.grading.questions import Prediction, expect_in_band
from coursekit.grading.spec import Call, Clause, Spec, new_tensor, raises, returns, unchanged
from coursekit.toys import TableLM, table_logp

_PARTS = ("causal_lm_loss", "top_k_filter", "top_p_filter", "min_p_filter", "beam_search", "bits_per_char")
_PARTS += ("causal_self_attention", "predict_nucleus_size", "predict_perplexity")
_PARTS += ("predict_speculative_tokens",)
__all__ = ["TableLM"] + [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]

FLOATS = (torch.float64, torch.float32)
_DTYPES = st.sampled_from(FLOATS)
SEEDS = st.integers(0, 2**31 - 1)


# =========================================================================== helpers


def _num(x: object) -> str:
    """A scalar result for a hint: '2.3026', or a description of what came instead."""
    return f"{float(x):.6g}" if is_tensor(x) and x.numel() == 1 else describe(x)


def _kept(x: object) -> object:
    """Which entries a filter kept (finite), as nested lists, for a hint."""
    return x.isfinite().int().tolist() if is_tensor(x) else describe(x)


def _ids(name: str, *shape: int, V: int) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=generator(name))


def _ids_from(seed: int, *shape: int, V: int) -> torch.Tensor:
    """Token ids in ``[0, V)`` from the integer ``seed`` (for drawn examples)."""
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(int(seed) + 7))


def _fmt(rows) -> str:
    """Nested numbers as a hint writes them: ``[[1, 3, 2]]``, ``[0.2, 0.5, -inf]``."""
    if isinstance(rows, (tuple, list)):
        return "[" + ", ".join(_fmt(r) for r in rows) + "]"
    return f"{rows:g}"


def _worked(kind: str, rows) -> tuple[torch.Tensor, str]:
    """A worked example written as a literal, and how a hint names it: ``kind`` "x32" and "x64" are
    the logits themselves (float32, float64), "log" the logarithms of probabilities (float64)."""
    if kind == "log":
        return torch.tensor(rows, dtype=torch.float64).log(), f"log {_fmt(rows)}"
    return torch.tensor(rows, dtype=torch.float32 if kind == "x32" else torch.float64), _fmt(rows)


def _clear(condition: bool) -> None:
    """Skip a drawn input whose answer hangs on rounding (Hypothesis's ``assume``). Outside a drawn run (a
    public example, a replay of inputs that passed) the input is known to be clear."""
    if currently_in_test_context():
        assume(condition)


def _is_worked(case) -> bool:
    """A worked example (a tuple starting with its kind, see :func:`_worked`), not a drawn input."""
    return isinstance(case, tuple) and bool(case) and isinstance(case[0], str)


# =========================================================================== part 1: causal_lm_loss


def _shifted_ce(logits, ids, ignore_index=-100):
    """The expected loss, by explicit shifting: logits 0 .. T-2 against tokens 1 .. T-1."""
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1), ignore_index=ignore_index)


_NOT_SHIFTED = (
    "targets are not shifted: the logits at position t predict token t + 1, so score "
    "logits[:, :-1] against input_ids[:, 1:] (the last position has no target, the first token is never "
    "predicted)"
)
_UNSTABLE = (
    "the loss is inf or NaN for large logits: log(softmax(x)) underflows to log(0); use F.log_softmax or "
    "F.cross_entropy, which subtract the maximum first"
)
_IGNORED_MEAN = (
    "the loss averages over ignored positions: an ignored position must not count in the mean either"
)


def _loss_mistakes(logits, ids, ignore_index=-100):
    """The classic wrong losses (float64, then the logits' dtype) with their hints."""
    V, dtype = logits.shape[-1], logits.dtype
    logits = logits.double()

    def ce(lg, t, ignore=ignore_index, reduction="mean"):
        try:
            return F.cross_entropy(
                lg.reshape(-1, V), t.reshape(-1), ignore_index=ignore, reduction=reduction
            ).to(dtype)
        except Exception:  # e.g. a target of -100 without ignore_index
            return None

    shifted = logits[:, :-1], ids[:, 1:]
    per = ce(*shifted, reduction="none")
    out = [
        (ce(logits, ids), _NOT_SHIFTED),
        (
            ce(logits[:, 1:], ids[:, :-1]),
            "the shift goes the wrong way: the logits at position t predict token t + 1, so drop the *last* logits and "
            "the *first* token (logits[:, :-1] against input_ids[:, 1:])",
        ),
        (ce(*shifted, reduction="sum"), "the loss is summed: return the mean over the scored positions"),
    ]
    if bool((ids[:, 1:] == ignore_index).any()) and per is not None:
        fix = ", divide by the number of scored positions (F.cross_entropy(..., ignore_index=ignore_index) does this)"
        out += [(per.mean(), _IGNORED_MEAN + fix), (per.sum() / per.numel(), _IGNORED_MEAN)]
    if ignore_index != -100:
        out.append(
            (
                ce(*shifted, -100),
                f"the ignore_index argument was not used (here ignore_index={ignore_index}, but -100 was skipped): "
                "pass ignore_index=ignore_index to F.cross_entropy",
            )
        )
    return out


def _scalar_loss(g: Grader, out, dtype, where: str) -> None:
    g.expect(
        is_tensor(out) and out.dim() == 0 and out.dtype == dtype,
        f"{where}: the loss should be a scalar (0-dimensional) tensor of the logits' dtype {dtype_name(dtype)}, "
        f"got {describe(out)}",
    )


def _loss_draw(size, seed: int, dtype=torch.float64, scale=1.0, ignore=None, rate=0.35):
    """Drawn ``(logits, input_ids)`` of ``size`` ``(B, T, V)``; with ``ignore``, about ``rate`` of the ids set to
    it (target 1 of row 0 always scored)."""
    B, T, V = size
    ids = _ids_from(seed, B, T, V=V)
    if ignore is not None:
        drop = torch.rand(ids.shape, generator=torch.Generator().manual_seed(int(seed) + 11)) < rate
        drop[0, 1] = False
        ids = ids.masked_fill(drop, ignore)
        if int(ids[0, 1]) == ignore:
            ids[0, 1] = (ignore + 1) % V
    return tensor(seed, B, T, V, dtype=dtype, scale=scale), ids


def _loss_where(logits, ids, extra: str = "") -> str:
    shown = ids.tolist() if ids.numel() <= 12 else tuple(ids.shape)
    return (
        f"causal_lm_loss(logits {tuple(logits.shape)} {dtype_name(logits.dtype)}, input_ids {shown}{extra})"
    )


def _loss_value(g: Grader, fn, logits, ids, ignore=None, positional=False, scale_hint="") -> None:
    """Call the student's loss (ignore_index by default, by keyword, or positionally) and compare."""
    by = "" if ignore is None else (f", {ignore}" if positional else f", ignore_index={ignore}")
    where = _loss_where(logits, ids, by)
    kwargs = {} if ignore is None or positional else {"ignore_index": ignore}
    out = call_student(g, where, fn, logits, ids, *((ignore,) if positional else ()), **kwargs)
    index = -100 if ignore is None else ignore
    expected = _shifted_ce(logits.double(), ids, index).to(logits.dtype)
    _scalar_loss(g, out, logits.dtype, where)
    if not bool(torch.isfinite(out)):
        g.fail(f"{where}{scale_hint}: got {_num(out)}; " + _UNSTABLE)
    first_match(g, out, [(m, f"{where}: {h}") for m, h in _loss_mistakes(logits, ids, index)], expected)
    g.expect(
        close(out, expected, magnitude=magnitude(logits)),
        f"{where}{scale_hint}: expected {float(expected):.6g} (F.cross_entropy of logits[:, :-1] against "
        f"input_ids[:, 1:]{'' if ignore is None else f', ignore_index={ignore}'}), got {_num(out)}",
    )


_LOSS_SIZES = st.tuples(st.integers(1, 4), st.integers(2, 8), st.integers(2, 11))


def _loss_worked(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed ``(logits, input_ids)`` of the loss's clauses, by name."""
    if name == "tokens [2, 3, 1]":  # logits_0 scores 3, logits_1 scores 1; position 2's has no target
        logits = torch.full((1, 3, 4), -20.0)
        logits[0, 0, 3] = logits[0, 1, 1] = logits[0, 2, 0] = 20.0
        return logits, torch.tensor([[2, 3, 1]])
    if name == "-100 padding":
        ids = torch.tensor([[1, 4, 0, 2], [3, 3, -100, -100]])
        return rand("public.loss", 2, 4, 5, dtype=torch.float32), ids
    if name == "0 padding":
        return rand("public.loss.pad", 2, 4, 5), torch.tensor([[1, 4, 2, 0], [3, 0, 0, 0]])
    if name == "gradient":
        return rand("public.loss.grad", 1, 3, 4), torch.tensor([[0, 3, 1]])
    # closed forms: uniform logits give log V, confident right ones 0
    ids = _ids("loss.closed.ids", 2, 5, V=6)
    if name == "uniform":
        return torch.zeros(2, 5, 6, dtype=torch.float64), ids
    logits = torch.full((2, 5, 6), -20.0, dtype=torch.float64)  # "confident": position t favours token t + 1
    return logits.scatter(-1, torch.cat([ids[:, 1:], ids[:, :1]], 1)[..., None], 20.0), ids


def _loss_scalar(g: Grader, fn, case) -> None:
    size, dtype, seed = case
    logits, ids = _loss_draw(size, seed, dtype)
    where = _loss_where(logits, ids)
    _scalar_loss(g, call_student(g, where, fn, logits, ids), dtype, where)


def _loss_values(scale: float, ignore, g: Grader, fn, case) -> None:
    """A worked example by name, or a drawn ``(size, dtype, seed)`` of logits of ``scale`` (or ``(size, dtype,
    scale, seed)``), about a third of the ids set to ``ignore`` (None: none)."""
    if isinstance(case, str):
        return _loss_value(g, fn, *_loss_worked(case))
    size, dtype, *drawn, seed = case
    _loss_value(g, fn, *_loss_draw(size, seed, dtype, drawn[0] if drawn else scale, ignore))


def _loss_custom(g: Grader, fn, case) -> None:
    if _is_worked(case):  # (name, positional): ignore_index=0
        return _loss_value(g, fn, *_loss_worked(case[0]), 0, case[1])
    size, which, positional, seed = case
    ignore = {"zero": 0, "last": size[2] - 1, "minus one": -1, "large": size[2] + 5}[which]
    _loss_value(g, fn, *_loss_draw(size, seed, scale=2.0, ignore=ignore), ignore, positional)


def _loss_stable(g: Grader, fn, case) -> None:
    size, scale, seed = case
    logits, ids = _loss_draw(size, seed, torch.float32, scale)
    _loss_value(g, fn, logits, ids, scale_hint=f" (logits of scale {scale:g})")


def _loss_gradient(g: Grader, fn, case) -> None:
    logits, ids = _loss_worked(case) if isinstance(case, str) else _loss_draw(*case, ignore=-100, rate=0.2)
    where = _loss_where(logits, ids)
    backward = (None, torch.tensor(1.0, dtype=torch.float64))
    p = call_student(g, where, probe, fn, logits.clone().requires_grad_(), ids, backward=backward)
    g.expect(
        is_tensor(p.result) and p.result.requires_grad,
        f"{where}: the loss does not depend on the logits through autograd: avoid .item(), .detach(), "
        ".numpy() or torch.tensor(...)",
    )
    grad = p.grads[0] if p.grads else None
    lr = logits.clone().requires_grad_()
    _shifted_ce(lr, ids).backward()
    g.expect(
        is_tensor(grad) and grad.shape == logits.shape,
        f"{where}: expected a gradient of shape {tuple(logits.shape)}, got {describe(grad)}",
    )
    if bool(grad[:, -1].abs().max() > 0):
        g.fail(
            f"{where}: the last position's logits got a gradient: they predict a token after the end of the "
            "sequence and must not be scored (use logits[:, :-1] against input_ids[:, 1:])"
        )
    g.expect(
        close(grad, lr.grad),
        f"{where}: the gradient with respect to the logits differs from that of "
        "the mean cross-entropy of the shifted tensors",
    )


def _loss_inplace_call(case) -> Call:
    size, ignore, seed = case
    logits, ids = _loss_draw(size, seed, ignore=ignore)
    where = _loss_where(logits, ids, f", ignore_index={ignore}")
    return Call(where, (logits, ids), {"ignore_index": ignore}, names=("logits", "input_ids"))


_LOSS_ERRORS = ["T = 1", "2-D logits", "4-D logits", "longer ids", "more rows", "flat ids"]


def _loss_error_call(case) -> Call:
    (B, T, V), which, seed = case
    logits, ids = _loss_draw((B, T, V), seed)
    shapes = "logits must be (B, T, V) and input_ids (B, T), the logits' first two sizes"
    one = "a sequence of one token has no next-token target"
    lg, ii, what = {
        "T = 1": (logits[:, :1], ids[:, :1], f"logits {(B, 1, V)} and input_ids {(B, 1)} (T = 1: {one})"),
        "2-D logits": (logits[..., 0], ids, f"logits {(B, T)} (2-D) and input_ids {(B, T)}"),
        "4-D logits": (logits[..., None], ids, f"logits {(B, T, V, 1)} (4-D) and input_ids {(B, T)}"),
        "longer ids": (
            logits,
            torch.cat([ids, ids[:, :1]], 1),
            f"logits {(B, T, V)} and input_ids {(B, T + 1)}",
        ),
        "more rows": (logits, torch.cat([ids, ids[:1]], 0), f"logits {(B, T, V)} and input_ids {(B + 1, T)}"),
        "flat ids": (logits, ids.reshape(-1), f"logits {(B, T, V)} and input_ids {(B * T,)} (1-D)"),
    }[which]
    return Call(what if which == "T = 1" else f"{what} ({shapes})", (lg, ii))


LOSS = Spec(
    "causal_lm_loss",
    [
        Clause(
            "returns a scalar tensor of the logits' dtype (float32 and float64)",
            _loss_scalar,
            st.tuples(_LOSS_SIZES, _DTYPES, SEEDS),
            key="loss.scalar",
            budget="small",
            examples=[((1, 2, 3), torch.float64, 0), ((1, 3, 4), torch.float32, 0)],
        ),
        Clause(
            "the logits at position t are scored against token t + 1 (any B, T >= 2, V)",
            functools.partial(_loss_values, 1.0, None),
            st.tuples(_LOSS_SIZES, _DTYPES, st.sampled_from([1.0, 3.0, 0.1]), SEEDS),
            key="loss.shift",
            budget="plenty",
            examples=[((1, 2, 3), torch.float64, 1.0, 1), "tokens [2, 3, 1]"],
            also=["uniform", "confident"],
        ),
        Clause(
            "targets equal to ignore_index (default -100) count neither in the sum nor in the mean",
            functools.partial(_loss_values, 2.0, -100),
            st.tuples(_LOSS_SIZES, _DTYPES, SEEDS),
            key="loss.ignore",
            budget="plenty",
            examples=[((2, 4, 5), torch.float64, 2), "-100 padding"],
        ),
        Clause(
            "a custom ignore_index (a padding id such as 0, or any other number) is honoured, "
            "by keyword or positionally",
            _loss_custom,
            st.tuples(
                _LOSS_SIZES, st.sampled_from(["zero", "last", "minus one", "large"]), st.booleans(), SEEDS
            ),
            key="loss.custom",
            budget="more",
            examples=[((2, 4, 5), "zero", False, 3), ("0 padding", False), ("0 padding", True)],
        ),
        Clause(
            "stable: float32 logits of magnitude 100 to 10^4 give a finite, accurate loss",
            _loss_stable,
            st.tuples(_LOSS_SIZES, st.sampled_from([100.0, 1e3, 1e4]), SEEDS),
            key="loss.stable",
            budget="some",
            examples=[((1, 3, 4), 1e3, 4)],
        ),
        Clause(
            "differentiable: the gradient with respect to the logits is F.cross_entropy's (none at the last "
            "position)",
            _loss_gradient,
            st.tuples(_LOSS_SIZES, SEEDS),
            key="loss.grad",
            budget="small",
            examples=[((1, 3, 4), 5), "gradient"],
        ),
        unchanged(
            _loss_inplace_call,
            st.tuples(_LOSS_SIZES, st.sampled_from([-100, 0]), SEEDS),
            key="loss.inplace",
            budget="handful",
            examples=[((2, 3, 4), -100, 6)],
            text="leaves logits and input_ids unchanged",
            advice="compute new tensors: no in-place ops on the logits, and no item assignment or masked_fill_ "
            "on input_ids (a loss that changed input_ids in place breaks the caller, who still needs them)",
        ),
        raises(
            _loss_error_call,
            st.tuples(_LOSS_SIZES, st.sampled_from(_LOSS_ERRORS), SEEDS),
            key="loss.errors",
            budget="more",
            examples=[((1, 2, 3), "T = 1", 7), ((2, 3, 5), "longer ids", 8)],
            also=[((2, 3, 4), kind, 8) for kind in _LOSS_ERRORS],
            fix="say which shape came and that logits (B, T, V) and input_ids (B, T) with T >= 2 were expected",
            text="raises ValueError for logits that are not (B, T, V), input_ids that are not (B, T), or T < 2",
        ),
    ],
)
check_causal_lm_loss, grade_causal_lm_loss = LOSS.graders()


# =========================================================================== parts 2 and 3: the filters

#: the (...) of (..., V): rank 1 to 4; rank 2 or 3 (with longer rows); the logits' scales
_LEADING = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
_ROWS = st.lists(st.integers(1, 4), min_size=1, max_size=2).map(tuple)
_SCALES = st.sampled_from([1.0, 2.0, 4.0])


def _filter_call(
    g: Grader, fn, where: str, x: torch.Tensor, arg, expected: torch.Tensor, mistakes=(), what=""
):
    """Call ``fn(x, arg)`` and compare with ``expected``: type, shape, dtype, -inf exactly where dropped, values."""
    out = call_student(g, where, fn, x, arg)
    g.expect(
        is_tensor(out) and out.shape == x.shape and out.dtype == x.dtype,
        f"{where} should return a tensor of the logits' shape and dtype, {describe(x)}, got {describe(out)}",
    )
    first_match(g, out, [(m, f"{where}: {h}") for m, h in mistakes], expected)
    if not same(out, expected):
        changed = (out != x) & ~torch.isneginf(out)
        if bool(changed.any()):
            g.fail(
                f"{where}: kept logits must be returned unchanged and dropped ones set to float('-inf') exactly "
                "(not a large negative number), so that softmax gives them probability exactly 0"
            )
        g.fail(f"{where}: kept {_kept(out)}, expected {_kept(expected)}{what}")


def _filter_input(name: str, case, scale: float = 1.0) -> tuple[torch.Tensor, object, str]:
    """``(logits, arg, where)`` of a filter's case: a worked example ``(kind, rows, arg)`` (see
    :func:`_worked`), a drawn ``(leading shape, V, arg, dtype, seed)`` (the logits' scale may come before the
    seed), or ``(logits, arg)`` themselves."""
    if _is_worked(case):
        x, text = _worked(case[0], case[1])
        return x, case[2], f"{name}({text}, {case[2]!r})"
    if is_tensor(case[0]):
        x, arg = case
    else:
        lead, V, arg, dtype, *scaled, seed = case
        x = tensor(seed, *lead, V, dtype=dtype, scale=scaled[0] if scaled else scale)
    return x, arg, f"{name}(logits {tuple(x.shape)} {dtype_name(x.dtype)}, {arg!r})"


#: each filter's reference, its common mistakes, whether a drawn case is clear of rounding (None: always), and
#: what its hint says is kept; filled in by each filter's section
_FILTERS: dict = {}


def _filtered(name: str, g: Grader, fn, case, what: str = "", scale: float = 1.0, where=None) -> None:
    """The filter ``name`` on a case of :func:`_filter_input` against the reference, the common mistakes named;
    a drawn case whose answer hangs on rounding is skipped."""
    x, arg, named = _filter_input(name, case, scale)
    reference, mistakes, clear, kept = _FILTERS[name]
    if clear is not None and not _is_worked(case):
        _clear(clear(x, arg))
    _filter_call(g, fn, where or named, x, arg, reference(x, arg), mistakes(x, arg), what or kept)


def _composed(name: str, what: str, g: Grader, fn, case) -> None:
    """Logits already at -inf after top-k: a worked case, or a drawn ``(V, k, arg, seed)`` (3 rows)."""
    if _is_worked(case):
        return _filtered(name, g, fn, case)
    V, k, arg, seed = case
    _filtered(name, g, fn, (dec.top_k_filter(tensor(seed, 3, V, scale=2.0), min(k, V)), arg), what)


def _filter_arg_call(name: str, scale: float, case, dtype=torch.float64) -> Call:
    """``name(logits, arg)`` for ``(leading shape, V, arg, seed)``, logits of ``dtype`` and ``scale``."""
    lead, V, arg, seed = case
    x, arg, where = _filter_input(name, (lead, V, arg, dtype, seed), scale)
    return Call(where, (x, arg), names=("logits",))


def _filter_bad_call(what: str, case) -> Call:
    V, arg, seed = case
    return Call(f"{what}={arg!r} (logits (2, {V}))", (tensor(seed, 2, V), arg))


def _keeps_all(name: str, at, what: str, g: Grader, fn, case) -> None:
    """At the argument that keeps every logit the result equals the logits: a worked case, or a drawn
    ``(leading shape, V, ..., seed)`` of float64 logits, the argument ``at(V, ...)``."""
    if not _is_worked(case):
        lead, V, *more, seed = case
        case = (lead, V, at(V, *more), torch.float64, seed)
    x, arg, where = _filter_input(name, case)
    _filter_call(g, fn, where, x, arg, x.clone(), what=what)


def _filter_shape(name: str, key: str, arg: object) -> Clause:
    """The result has the logits' shape and dtype (the filter at ``arg``)."""
    return returns(
        lambda case: _filter_arg_call(name, 1.0, (case[0], case[1], arg, case[3]), case[2]),
        lambda case: torch.empty(*case[0], case[1], dtype=case[2]),
        st.tuples(_LEADING, st.integers(1, 8), _DTYPES, SEEDS),
        key=key,
        budget="small",
        examples=[((2,), 3, torch.float64, 0), ((1,), 3, torch.float32, 0)],
        text="returns a tensor of the logits' shape and dtype (float32 and float64)",
    )


def _filter_unchanged(name: str, scale: float, key: str, args, example) -> Clause:
    """The logits stay unchanged (the filter at drawn ``args``, float64 logits of ``scale``)."""
    return unchanged(
        functools.partial(_filter_arg_call, name, scale),
        st.tuples(_LEADING, st.integers(2, 8), args, SEEDS),
        key=key,
        budget="handful",
        examples=[((2,), 5, example, 6)],
        text="leaves the logits unchanged",
        advice="return a new tensor (logits.masked_fill(...), not masked_fill_ or item assignment): a filter "
        "that changed its input in place breaks a caller that still needs the original logits",
    )


# --------------------------------------------------------------------------- top-k

_TIES_HINT = (
    "ties with the k-th largest must be kept: drop only the logits smaller than the k-th largest value "
    "(logits < kth), do not keep exactly the k indices that torch.topk returns"
)


def _top_k_mistakes(x: torch.Tensor, k: int):
    V = x.shape[-1]
    out = []
    if k < V:
        kth1 = torch.topk(x, k + 1, dim=-1).values[..., -1:]
        out.append(
            (
                x.masked_fill(x < kth1, float("-inf")),
                "kept k + 1 tokens: the k-th largest is torch.topk(logits, k).values[..., -1] "
                "(index k - 1, not k)",
            )
        )
    if k > 1:
        kth = torch.topk(x, min(k, V), dim=-1).values[..., -1:]
        out.append(
            (
                x.masked_fill(x <= kth, float("-inf")),
                "kept only k - 1 tokens: keep the logits >= the k-th largest (drop logits < kth, not <= kth)",
            )
        )
    idx = torch.topk(x, min(k, V), dim=-1).indices
    exact = torch.full_like(x, float("-inf")).scatter(-1, idx, x.gather(-1, idx))
    if not torch.equal(exact, dec.top_k_filter(x, k)):
        out.append((exact, _TIES_HINT))
    if x.dim() > 1 and x.shape[0] > 1 and k < V:  # filtered along the first axis instead of the last
        out.append(
            (
                dec.top_k_filter(x.movedim(0, -1), min(k, x.shape[0])).movedim(-1, 0),
                "the filter ran along the wrong axis: keep the k largest of each row, along the last axis "
                "(dim=-1)",
            )
        )
    return out


_FILTERS["top_k_filter"] = (dec.top_k_filter, _top_k_mistakes, None, "")


def _top_k_values(g: Grader, fn, case, what: str = "") -> None:
    """A worked case, or a drawn one with k clamped to V (float64 when drawn without a dtype)."""
    if not _is_worked(case):
        lead, V, k, *dtype, seed = case
        case = (lead, V, min(k, V), *(dtype or [torch.float64]), seed)
    _filtered("top_k_filter", g, fn, case, what, scale=2.0)


def _top_k_ties(g: Grader, fn, case) -> None:
    if not _is_worked(case):
        lead, V, k, dtype, seed = case
        x = torch.randint(0, 4, (*lead, V), generator=torch.Generator().manual_seed(seed)).to(dtype)
        case = x, min(k, V)
    _filtered("top_k_filter", g, fn, case, " (" + _TIES_HINT + ")")


_TIES_X = ((1.0, 3.0, 3.0, 2.0), (0.0, 5.0, 1.0, 1.0))
_K_ALL = ": with k >= V every token is kept (clamp k to min(k, V) before torch.topk)"
_K_AXIS = ": filter along the last axis only (torch.topk(..., dim=-1), keepdim-style [..., -1:] indexing)"

TOP_K = Spec(
    "top_k_filter",
    [
        _filter_shape("top_k_filter", "topk.shape", 1),
        Clause(
            "keeps the k largest logits of each row unchanged and sets the others to -inf (1 <= k <= V)",
            _top_k_values,
            st.tuples(_ROWS, st.integers(1, 12), st.integers(1, 12), _DTYPES, SEEDS),
            key="topk.values",
            budget="wide",
            examples=[((2,), 5, 2, torch.float64, 1), ("x32", ((1.0, 3.0, 2.0),), 2)],
        ),
        Clause(
            "values tied with the k-th largest are all kept",
            _top_k_ties,
            st.tuples(
                st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
                st.integers(2, 10),
                st.integers(1, 6),
                _DTYPES,
                SEEDS,
            ),
            key="topk.ties",
            budget="plenty",
            examples=[((1,), 4, 1, torch.float64, 2), ("x32", ((1.0, 3.0, 3.0, 2.0),), 1)],
            also=[("x64", _TIES_X, 1), ("x64", _TIES_X, 2)],
        ),
        Clause(
            "k >= V keeps every logit",
            functools.partial(_keeps_all, "top_k_filter", lambda V, extra: V + extra, _K_ALL),
            st.tuples(_LEADING, st.integers(1, 8), st.integers(0, 5), SEEDS),
            key="topk.all",
            budget="some",
            examples=[((2,), 3, 1, 3), ("x32", ((1.0, 3.0, 2.0),), 5)],
        ),
        Clause(
            "works on logits of any shape (..., V): 1-D, 2-D, 3-D and 4-D",
            functools.partial(_top_k_values, what=_K_AXIS),
            st.tuples(_LEADING, st.integers(1, 9), st.integers(1, 5), SEEDS),
            key="topk.ranks",
            budget="more",
            examples=[
                ((), 6, 2, 4),
                ("x32", (1.0, 3.0, 2.0), 2),
                ("x32", (((1.0, 3.0, 2.0),), ((4.0, 0.0, 5.0),)), 1),
            ],
            also=[(lead, 7, 3, 5) for lead in ((), (2, 3), (2, 1, 2))],
        ),
        _filter_unchanged("top_k_filter", 1.0, "topk.inplace", st.integers(1, 3), 2),
        new_tensor(
            functools.partial(_filter_arg_call, "top_k_filter", 1.0),
            examples=[((2,), 3, 3, 0), ((), 4, 9, 1), ((2, 2), 5, 2, 2)],
            text="returns a new tensor, never the logits themselves, also when k >= V keeps every logit",
        ),
        raises(
            functools.partial(_filter_bad_call, "k"),
            st.tuples(st.integers(1, 8), st.sampled_from([0, -1, -3, 2.5, 0.5]), SEEDS),
            key="topk.bad",
            budget="some",
            examples=[(5, 0, 7), (5, 2.5, 8)],
            also=[(5, k, 8) for k in (0, -2, 2.5)],
            fix="k must be a positive integer; say which k came",
            text="k that is not a positive integer (0, negative, 2.5) raises ValueError",
        ),
    ],
)
check_top_k_filter, grade_top_k_filter = TOP_K.graders()


# --------------------------------------------------------------------------- top-p

_CROSS_HINT = (
    "top-p dropped the token that crosses p: keep a token while the probability of the tokens ranked "
    "*before* it is still below p (cumsum - probs < p), so the smallest set reaching p is kept and the most "
    "likely token always survives"
)
_SORT_HINT = (
    "top-p must accumulate probabilities from the most likely token down: sort the logits in decreasing "
    "order first (torch.sort(..., descending=True)), then scatter the mask back to the vocabulary order"
)
_ORDER_HINT = (
    "the result is in sorted order: the mask was computed on sorted logits, scatter it back to the "
    "vocabulary order (mask.scatter(-1, order, mask)) before applying it to the original logits"
)


def _top_p_mistakes(x: torch.Tensor, p: float):
    inf = float("-inf")
    s, order = torch.sort(x, dim=-1, descending=True)
    probs = F.softmax(s, dim=-1)
    cum = probs.cumsum(-1)
    out = [(x.masked_fill(drop.scatter(-1, order, drop), inf), _CROSS_HINT) for drop in (cum > p, cum >= p)]
    vocab = F.softmax(x, dim=-1)
    out.append((x.masked_fill(vocab.cumsum(-1) - vocab >= p, inf), _SORT_HINT))
    out.append((x.masked_fill(vocab.cumsum(-1) > p, inf), _SORT_HINT))
    sorted_result = s.masked_fill(cum - probs >= p, inf)
    if not torch.equal(sorted_result, dec.top_p_filter(x, p)):
        out.append((sorted_result, _ORDER_HINT))
    up, order_up = torch.sort(x, dim=-1)  # increasing order: accumulated from the least likely token
    up = F.softmax(up, dim=-1)
    asc_drop = (up.cumsum(-1) - up) >= p
    out.append((x.masked_fill(asc_drop.scatter(-1, order_up, asc_drop), inf), _SORT_HINT))
    return out


def _top_p_margin(x: torch.Tensor, p: float) -> float:
    """How close, in probability, the mass ranked before some token comes to ``p`` (float64): a drawn case
    closer than rounding can decide is skipped."""
    probs = F.softmax(torch.sort(x.double(), dim=-1, descending=True).values, dim=-1)
    before = probs.cumsum(-1) - probs
    return float((before - p).abs().min())


_FILTERS["top_p_filter"] = (
    dec.top_p_filter,
    _top_p_mistakes,
    lambda x, p: _top_p_margin(x, p) > 1e-5,
    " (the smallest set of most likely tokens whose probabilities sum to at least p)",
)
_P_VALUES = st.sampled_from([0.05, 0.2, 0.35, 0.5, 0.62, 0.75, 0.9, 0.97])


def _top_p_axis(worked: str, what: str, g: Grader, fn, case) -> None:
    """A worked case (its hint says ``worked``), or a drawn ``(leading shape, V, p, seed)`` (``(V, p, seed)``:
    leading shape (2,)) of float64 logits of scale 2 (its hint says ``what``)."""
    if _is_worked(case):
        return _filtered("top_p_filter", g, fn, case, worked)
    *lead, V, p, seed = case
    _filtered("top_p_filter", g, fn, (*(lead or [(2,)]), V, p, torch.float64, seed), what, scale=2.0)


_P_ONE = ": with p = 1 every token (of non-zero probability) is kept"
_P_ORDER = ": kept logits must stay at their vocabulary positions, unchanged"
_P_AXIS = ": sort, softmax and cumsum along the last axis (dim=-1), and scatter back along it"
_P_ZERO = ": the softmax of the filtered logits gives the removed tokens probability 0, they stay -inf"
#: probabilities in vocabulary order and p: the token that crosses p survives, and the most likely one always
_CROSSING = [((0.2, 0.5, 0.3), 0.6), ((0.05, 0.9, 0.05), 0.5), ((0.2, 0.5, 0.3), 0.45)]
_CROSSING += [((0.1, 0.25, 0.15, 0.5), 0.7), ((0.1, 0.25, 0.15, 0.5), 0.8), ((0.3, 0.3, 0.4), 0.01)]

TOP_P = Spec(
    "top_p_filter",
    [
        _filter_shape("top_p_filter", "topp.shape", 0.5),
        Clause(
            "keeps the smallest set of most likely tokens whose probabilities sum to at least p",
            functools.partial(_filtered, "top_p_filter"),
            st.tuples(_ROWS, st.integers(1, 12), _P_VALUES, _DTYPES, _SCALES, SEEDS),
            key="topp.values",
            budget="wider",
            examples=[((2,), 6, 0.5, torch.float64, 2.0, 1), ("log", ((0.5, 0.3, 0.2),), 0.6)],
        ),
        Clause(
            "the token whose probability crosses p is kept, and the most likely token always is",
            functools.partial(_filtered, "top_p_filter", what=f" ({_CROSS_HINT})"),
            examples=[("log", (probs,), p) for probs, p in _CROSSING[:2]],
            also=[("log", (probs,), p) for probs, p in _CROSSING[2:]],
        ),
        Clause(
            "probabilities are accumulated from the most likely token down, and the result is in vocabulary order",
            functools.partial(_top_p_axis, f" ({_SORT_HINT})", _P_ORDER),
            st.tuples(st.integers(3, 12), _P_VALUES, SEEDS),
            key="topp.order",
            budget="normal",
            examples=[(6, 0.62, 2), ("log", ((0.3, 0.05, 0.45, 0.2),), 0.5)],
            also=[("log", ((0.05, 0.1, 0.15, 0.7), (0.3, 0.05, 0.45, 0.2)), 0.5)],
        ),
        Clause(
            "p = 1 keeps every token",
            functools.partial(_keeps_all, "top_p_filter", lambda V: 1.0, _P_ONE),
            st.tuples(_LEADING, st.integers(1, 10), SEEDS),
            key="topp.one",
            budget="small",
            examples=[((2,), 5, 3), ("log", ((0.2, 0.5, 0.3),), 1.0)],
        ),
        Clause(
            "logits already at -inf (after top-k) stay -inf: they have probability 0",
            functools.partial(_composed, "top_p_filter", _P_ZERO),
            st.tuples(st.integers(3, 12), st.integers(1, 6), _P_VALUES, SEEDS),
            key="topp.compose",
            budget="some",
            examples=[(8, 3, 0.9, 4), ("x64", ((0.0, -math.inf, 1.0, -1.0),), 0.95)],
        ),
        Clause(
            "works on logits of any shape (..., V): 1-D, 2-D, 3-D and 4-D",
            functools.partial(_top_p_axis, "", _P_AXIS),
            st.tuples(_LEADING, st.integers(2, 9), _P_VALUES, SEEDS),
            key="topp.ranks",
            budget="more",
            examples=[((), 6, 0.62, 5), ("log", (0.2, 0.5, 0.3), 0.6)],
        ),
        _filter_unchanged("top_p_filter", 1.0, "topp.inplace", _P_VALUES, 0.5),
        new_tensor(
            functools.partial(_filter_arg_call, "top_p_filter", 1.0),
            examples=[((2,), 5, 1.0, 0), ((), 3, 1.0, 1), ((2, 2), 6, 0.5, 2)],
            text="returns a new tensor, never the logits themselves, also when p = 1 keeps every token",
        ),
        raises(
            functools.partial(_filter_bad_call, "p"),
            st.tuples(st.integers(1, 8), st.sampled_from([0.0, -0.1, -1.0, 1.5, 1.0001, 2.0]), SEEDS),
            key="topp.bad",
            budget="some",
            examples=[(5, 0.0, 7), (5, 1.5, 8)],
            also=[(5, p, 8) for p in (0.0, 1.5, -0.1)],
            fix="p must be in (0, 1]",
            text="p outside (0, 1] raises ValueError",
        ),
    ],
)
check_top_p_filter, grade_top_p_filter = TOP_P.graders()


# =========================================================================== the toy model


def _table(V: int, entries: dict[tuple[int, int], float]) -> torch.Tensor:
    """``(V, V)`` probabilities: the given entries, 0 elsewhere (1e-9 in the model: see
    :func:`coursekit.toys.table_logp`)."""
    p = torch.full((V, V), 0.0, dtype=torch.float64)
    for (a, b), value in entries.items():
        p[a, b] = value
    return p


def _greedy_trap() -> torch.Tensor:
    """From 0: token 1 (0.6) beats 2 (0.4), but then the best is 0.4 after 1 and 0.9 after 2:
    greedy gives 1, 3 (0.24), the likeliest pair is 2, 3 (0.36)."""
    entries = {(0, 1): 0.6, (0, 2): 0.4, (1, 3): 0.4, (1, 4): 0.3, (1, 0): 0.3, (2, 3): 0.9, (2, 4): 0.1}
    return _table(5, entries | {(3, 4): 1.0, (4, 4): 1.0})


#: the EOS token of the tables below
_EOS_LEN, _EOS_STOP, _EOS_KEEP, _EOS_RANK, _EOS_LIVE, _EOS_EARLY, _EOS_CROWD = 3, 3, 8, 2, 3, 3, 7
#: the beam width W the ladder table rewards with the path 0, W, 6 (W = 1 .. 5)
_LADDER_TARGET = 6


def _length_table() -> torch.Tensor:
    """EOS right away has 0.4; the path 1, 2, EOS has 0.6 at each step: a lower total (0.216)
    but a higher mean log-probability. Raw sums pick the short one, normalised scores the long one."""
    e = _EOS_LEN
    entries = {(0, e): 0.4, (0, 1): 0.6, (1, 2): 0.6, (1, e): 0.4, (2, 2): 0.4, (2, e): 0.6}
    return _table(4, entries | {(e, x): 0.25 for x in (0, 1, 2, e)})


def _stop_table() -> torch.Tensor:
    """0 -> 1 (0.9) -> EOS (0.8) is the best hypothesis; after EOS the table repeats EOS with
    probability 1, so a search that ignores EOS loses nothing by going on (and gains from
    the length normalisation)."""
    e = _EOS_STOP
    return _table(
        4, {(0, 1): 0.9, (0, 2): 0.1, (1, e): 0.8, (1, 2): 0.2, (2, 2): 0.5, (2, e): 0.5, (e, e): 1.0}
    )


def _eos_beam_table() -> torch.Tensor:
    """From 0: EOS 0.45, A=1 0.35, B=2 0.2. After A four tokens 4..7 of 0.25 each, then EOS;
    after B: C=3 then EOS, both certain. With beam width 2 and length_penalty 1 the best is
    0, B, C, EOS (log 0.2 / 3 = -0.54) over 0, EOS (-0.80) and 0, A, x, EOS (-0.81), but only
    if B stays a live beam next to A after EOS finished a hypothesis."""
    e = _EOS_KEEP
    entries = {(0, e): 0.45, (0, 1): 0.35, (0, 2): 0.2, (2, 3): 1.0, (3, e): 1.0, (e, e): 1.0}
    for x in range(4, 8):
        entries[(1, x)] = 0.25
        entries[(x, e)] = 1.0
    return _table(9, entries)


def _eos_rank_table() -> torch.Tensor:
    """From 0: A=1 (0.6), EOS (0.4); after A: B=3 (0.5), EOS (0.3), C=4 (0.2). With beam width 1 and
    length_penalty 0 the EOS after 0 is the second-best candidate (rank 1, not among the best W = 1): it
    is dropped, and the answer is 0, A, B (0.3, the live beam when the steps run out). A search that
    finishes an EOS candidate ranked below W returns 0, EOS (0.4)."""
    e = _EOS_RANK
    entries = {(0, 1): 0.6, (0, e): 0.4, (1, 3): 0.5, (1, e): 0.3, (1, 4): 0.2}
    return _table(5, entries | {(3, 3): 1.0, (4, 4): 1.0, (e, e): 1.0})


def _live_table() -> torch.Tensor:
    """From 0: EOS (0.3) finishes at once; A=1 (0.7) then B=2 (0.9). After 2 steps the live beam
    0, A, B (log 0.63 / 2 = -0.23 at length_penalty 1) beats the finished 0, EOS (log 0.3 = -1.2):
    the live beams count as finished hypotheses when the steps run out."""
    e = _EOS_LIVE
    return _table(4, {(0, e): 0.3, (0, 1): 0.7, (1, 2): 0.9, (1, e): 0.1, (2, 2): 1.0, (e, e): 1.0})


def _early_stop_table() -> torch.Tensor:
    """From 0: EOS (0.5) finishes at step 1; A=1 (0.2) then B=2 and EOS, both certain; ten other tokens of
    0.03. With beam width 1 and length_penalty 1, after step 1 the live beam 0, A (log 0.2) may still reach
    log 0.2 / 3 = -0.54 > log 0.5 = -0.69: a search that stops as soon as W hypotheses have finished (or
    bounds the live beam by its next length only) returns 0, EOS; the answer is 0, A, B, EOS."""
    e = _EOS_EARLY
    entries = {(0, e): 0.5, (0, 1): 0.2, (1, 2): 1.0, (2, e): 1.0, (e, e): 1.0}
    entries.update({(0, x): 0.03 for x in range(4, 14)})
    return _table(14, entries)


def _crowded_table() -> torch.Tensor:
    """Beam width 3. From 0: A=1, B=2, C=3 (0.4, 0.35, 0.25). Each ends with EOS or goes on: A: EOS 0.6, a=4
    0.4; B: EOS 0.6, b=5 0.4; C: EOS 0.52, c=6 0.48. At step 2 the best 6 candidates are A EOS, B EOS, A a,
    B b, C EOS, C c: the third EOS is ranked 5th (dropped) and C c, 6th, is the third live beam; it goes on
    to c, d=8, EOS (certain), the best hypothesis at length_penalty 1 (log 0.12 / 4 = -0.53). A search that
    ranks fewer than the best 2W candidates loses it."""
    e = _EOS_CROWD
    entries = {(0, 1): 0.4, (0, 2): 0.35, (0, 3): 0.25, (1, e): 0.6, (1, 4): 0.4, (2, e): 0.6, (2, 5): 0.4}
    entries |= {(3, e): 0.52, (3, 6): 0.48, (6, 8): 1.0}
    return _table(9, entries | {(x, e): 1.0 for x in (4, 5, 8, e)})


def _ladder_table() -> torch.Tensor:
    """From 0 the first token is 1 .. 5 (0.26, 0.22, 0.20, 0.17, 0.15); token w then goes to token 6
    with probability 0.2, 0.3, 0.4, 0.55, 0.99 (the rest spread thinly over 33 other tokens). With
    two new tokens, a search of width W keeps the first tokens 1 .. W, so it returns 0, W, 6: every
    width from 1 to 5 gives a different answer."""
    V, target = 40, _LADDER_TARGET
    p = torch.zeros(V, V, dtype=torch.float64)
    for w, (first, then) in enumerate(
        zip((0.26, 0.22, 0.20, 0.17, 0.15), (0.2, 0.3, 0.4, 0.55, 0.99)), start=1
    ):
        p[0, w] = first
        p[w, target] = then
        p[w, target + 1 :] = (1 - then) / (V - target - 1)
    return p


def _path_logprob(logp: torch.Tensor, tokens: list[int]) -> float:
    """The log-probability of ``tokens[1:]`` after ``tokens[0]`` under a ``(V, V)`` table."""
    return float(sum(logp[a, b].double() for a, b in zip(tokens, tokens[1:])))


def _random_table(seed: int, V: int, order: int, eos: int | None, sharp: float) -> torch.Tensor:
    """A random ``(V,) * (order + 1)`` table of float32 log-probabilities (EOS made likely when given)."""
    logits = tensor(seed, *(V,) * (order + 1), scale=sharp)
    if eos is not None:
        logits[..., eos] += 1.0
    return F.log_softmax(logits, dim=-1).float()


# =========================================================================== part 4: beam_search

_REORDER_HINT = (
    "the KV cache was not reordered: after choosing the new beams call cache.reorder(index) with the "
    "parent beam of each new beam, so that row i of the cache belongs to beam i"
)
_NORM_HINT = (
    "beam scores are not length-normalised: rank finished hypotheses by logprob / n ** length_penalty, "
    "with n the number of generated tokens (EOS included)"
)
_RAW_HINT = "with length_penalty=0 hypotheses are ranked by their raw total log-probability (n ** 0 = 1)"
_EOS_HINT = (
    "the sequence goes on after EOS: a candidate that ends in eos_id must become a finished hypothesis, "
    "not a live beam that is extended further"
)
_EOS_BEAM_HINT = (
    "an EOS candidate took the place of a live beam: take the best 2W candidates; those ending in EOS "
    "among the best W finish a hypothesis, and the best W that do not end in EOS stay live"
)
_EOS_RANK_HINT = (
    "an EOS candidate ranked below the best W finished a hypothesis: of the best 2W candidates, one "
    "ending in EOS finishes a hypothesis only if it is among the best W (otherwise it is dropped)"
)
_LIVE_HINT = (
    "the live beams were not counted when the steps ran out: after max_new_tokens steps the live beams are "
    "finished hypotheses too, ranked with the others"
)
_EARLY_HINT = (
    "the search stopped too early: stop before max_new_tokens only when W hypotheses have finished and no "
    "live beam can still beat the worst of them, even at its best possible final length (a live beam's "
    "total only falls, so its best rank is total / n ** length_penalty at n = t + 1 or n = max_new_tokens)"
)
_GREEDY_HINT = (
    "your beam search returned the greedy sequence: at each step rank the candidates of all beams together "
    "(the (N, V) table of beam score + log-probability, flattened) and keep the best W, not the best "
    "token of each beam"
)
_WIDTH_HINT = (
    "the search is not W beams wide: keep the best W candidates as live beams at every step (beam_width, "
    "4 by default)"
)


def _beam_call(g: Grader, fn, model, label: str, prompt, max_new_tokens, *args, **kwargs):
    """Call the student's beam search on ``model`` (``label`` in the hint); returns ``(where, tokens list,
    score)`` after checking the return types."""
    extra = "".join(f", {a!r}" for a in args) + "".join(f", {k}={v!r}" for k, v in kwargs.items())
    where = f"beam_search({label}, {prompt.tolist()}, {max_new_tokens}{extra})"
    try:
        result = fn(model, prompt, max_new_tokens, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        text = str(e)
        if "expected k and v of shape" in text or "reorder the cache" in text:
            g.fail(f"{where}: {_REORDER_HINT} (the model raised: {text[:200]})")
        g.fail(f"{where}: {raised(e)}")
    g.expect(
        isinstance(result, (tuple, list)) and len(result) == 2,
        f"{where}: beam_search must return a tuple (tokens, score), got {describe(result)}",
    )
    tokens, score = result
    T0 = prompt.shape[1]
    g.expect(
        is_tensor(tokens) and tokens.dtype == torch.long and tokens.dim() == 2 and tokens.shape[0] == 1,
        f"{where}: tokens must be a (1, T0 + n) torch.long tensor, got {describe(tokens)}",
    )
    g.expect(
        T0 < tokens.shape[1] <= T0 + max_new_tokens and torch.equal(tokens[:, :T0], prompt),
        f"{where}: tokens must start with the prompt {prompt[0].tolist()} and add 1 to {max_new_tokens} tokens, "
        f"got {tokens[0].tolist()}",
    )
    g.expect(
        isinstance(score, float) and math.isfinite(score),
        f"{where}: score must be a finite Python float (the best hypothesis's normalised log-probability; "
        f"float(...) of a tensor), got {describe(score) if not isinstance(score, float) else score}",
    )
    return where, tokens[0].tolist(), score


def _score_ok(
    score: float, expected: float, n: int, alpha: float, logits: float = 1.0, spread: float = 0.0
) -> bool:
    """The score agrees with ``expected`` within the float32 rounding of a total of ``n`` log-probabilities.

    Each is a log-softmax of logits as large as ``logits``, and a search with a KV cache rounds other than
    the full forward pass that gives ``expected``; ``spread`` is how far the reference's own search strayed
    from it. On the peaky GPTs of the GPT checks (logits near 100) the reference's score strayed by up to
    13 x n x logits x eps / n ** alpha in 4,500 draws (1,500 course secrets), and the float32 tolerance
    alone failed it in 7 of 300 (a correct answer lost half a point): 32 x that, or 4 x ``spread``, is
    allowed. The named mistakes of the score are told apart on the table models, which round far less."""
    total = abs(expected) * n**alpha
    slack = max(32 * n * max(1.0, logits) * torch.finfo(torch.float32).eps / n**alpha, 4 * spread)
    return abs(score - expected) <= slack or close(
        torch.tensor(score, dtype=torch.float32),
        torch.tensor(expected, dtype=torch.float32),
        magnitude=max(1.0, total),
    )


def _expect_path(
    g: Grader, where: str, got, score, expected, expected_score, alpha: float, hint: str
) -> None:
    g.expect(got == expected, f"{where}: {hint} (expected {expected}, got {got})")
    n = len(expected) - 1
    g.expect(
        _score_ok(score, expected_score, n, alpha),
        f"{where}: the tokens are right but the score is {score:.6f}, expected {expected_score:.6f}: return the "
        "best hypothesis's total log-probability of its new tokens divided by n ** length_penalty",
    )


@torch.no_grad()
def _beam_margin(
    model, prompt, max_new_tokens: int, W: int, eos_id=None, length_penalty: float = 1.0
) -> float:
    """How close coursekit's beam search (the same steps) came to a tie: the smallest gap between
    consecutive candidates among the best 2W + 1 of any step, and between the two best finished
    hypotheses. A drawn case with a gap below float32 rounding is skipped: its answer is not a fact."""
    was_training = model.training
    model.eval()
    try:
        T0 = prompt.shape[1]
        cache = model.init_cache(1, T0 + max_new_tokens)
        logits = model(prompt, cache=cache)[:, -1]
        beams, scores, finished, margin = prompt, torch.zeros(1), [], math.inf

        def rank(total, n):
            return total / n**length_penalty

        for t in range(1, max_new_tokens + 1):
            logp = F.log_softmax(logits.float(), dim=-1)
            V = logp.shape[-1]
            cand = (scores[:, None] + logp).view(-1)
            top_scores, top_idx = cand.topk(min(2 * W + 1, cand.numel()))
            s = top_scores.tolist()
            for i in range(min(2 * W, len(s) - 1)):
                margin = min(margin, s[i] - s[i + 1])
            keep_beam, keep_tok, keep_score = [], [], []
            for r, (sc, i) in enumerate(zip(s[: 2 * W], top_idx.tolist())):
                beam, tok = divmod(i, V)
                if eos_id is not None and tok == eos_id:
                    if r < W:
                        finished.append(rank(sc, t))
                elif len(keep_beam) < W:
                    keep_beam.append(beam)
                    keep_tok.append(tok)
                    keep_score.append(sc)
            if not keep_beam or t == max_new_tokens:
                break
            if len(finished) >= W:
                worst_kept = sorted(finished)[-W]
                best = max(max(rank(sc, t + 1), rank(sc, max_new_tokens)) for sc in keep_score)
                margin = min(margin, abs(best - worst_kept))
                if best <= worst_kept:
                    break
            index = torch.tensor(keep_beam)
            cache.reorder(index)
            tokens = torch.tensor(keep_tok)[:, None]
            beams = torch.cat([beams[index], tokens], dim=1)
            scores = torch.tensor(keep_score)
            logits = model(tokens, cache=cache)[:, -1]
        if t == max_new_tokens:
            finished += [rank(sc, t) for sc in keep_score]
        ranked = sorted(finished, reverse=True)
        if len(ranked) > 1:
            margin = min(margin, ranked[0] - ranked[1])
        return margin
    finally:
        model.train(was_training)


def _gpt_pair(GPT, GPTConfig, seed: int, dropout: float = 0.0):
    """The same small GPT twice: built with the student's classes (in their process) and with coursekit's."""
    kwargs = dict(vocab_size=23, block_size=48, n_layers=2, n_heads=2, d_model=16, dropout=dropout)
    with seeded(f"gpt.pair.{seed}"):  # weights a table cannot anticipate (the course's secret is in the seed)
        local = ref.GPT(ref.GPTConfig(**kwargs))
    with torch.no_grad():
        for p in local.parameters():
            p.mul_(20)  # peaky predictions: sequences differ and near-ties are rare
    local.eval()
    theirs = GPT(GPTConfig(**kwargs))
    theirs.load_state_dict(local.state_dict())
    theirs.eval()
    return theirs, local


def _prompt(name: str, T0: int = 5) -> torch.Tensor:
    return _ids(name, 1, T0, V=23)


def _clear_prompt(local, name: str, T0: int, n: int, W: int, eos_at=None, alpha: float = 1.0):
    """The first of a few prompts (and its EOS, a token the search meets) whose beam search on ``local``
    has no near-tie: ``(prompt, eos_id)``."""
    for j in range(8):
        prompt = _prompt(f"{name}.{j}", T0)
        eos = None if eos_at is None else int(dec.beam_search(local, prompt, n, W)[0][0, T0 + eos_at])
        if _beam_margin(local, prompt, n, W, eos, alpha) > 1e-3:
            return prompt, eos
    return prompt, eos


def _expect_best(g: Grader, where: str, got, score, logp, expected, alpha: float, hint: str) -> None:
    """The tokens are ``expected`` (from the prompt [[0]]) and the score its total over n ** alpha."""
    n = len(expected) - 1
    _expect_path(g, where, got, score, expected, _path_logprob(logp, expected) / n**alpha, alpha, hint)


def _on_table(g: Grader, student, label: str, logp, n: int, W=None, *, eos=None, alpha=None):
    """The student's beam search on the table model ``logp`` (built with their ``TableLM``) from the prompt
    [[0]], ``W`` and ``alpha`` left to their defaults when ``None``: ``(where, tokens, score)``."""
    args = () if W is None else (W,)
    kwargs = {k: v for k, v in (("eos_id", eos), ("length_penalty", alpha)) if v is not None}
    return _beam_call(g, student[0], student[1](logp), f"<{label}>", torch.tensor([[0]]), n, *args, **kwargs)


def _like_reference(g: Grader, student, logp, label: str, prompt, n: int, W: int, hint: str, **kwargs):
    """The student's beam search on the table model ``logp`` (built with their ``TableLM``) against
    coursekit's with the same arguments: the same tokens and score."""
    tokens, expected_score = dec.beam_search(TableLM(logp), prompt, n, W, **kwargs)
    where, got, score = _beam_call(g, student[0], student[1](logp), f"<{label}>", prompt, n, W, **kwargs)
    alpha = kwargs.get("length_penalty", 1.0)
    _expect_path(g, where, got, score, tokens[0].tolist(), expected_score, alpha, hint)


def _beam_returns(g: Grader, student, case) -> None:
    model = student[1](_random_table(seed=1, V=5, order=1, eos=None, sharp=2.0))
    _beam_call(g, student[0], model, "<random (5, 5) table>", torch.tensor([[0, 3]]), 3, 2)


def _beam_width(g: Grader, student, case) -> None:
    """``"greedy trap"``: the likeliest pair, which greedy decoding misses; ``W``: the ladder table, where
    each width W (``None``: the default 4) finds 0, W, 6."""
    if case == "greedy trap":
        logp = table_logp(_greedy_trap())
        where, got, score = _on_table(g, student, "greedy-trap table", logp, 2, 2, alpha=0.0)
        best = max(([0, a, b] for a in range(5) for b in range(5)), key=lambda s: _path_logprob(logp, s))
        if got == [0, 1, 3]:
            g.fail(f"{where}: {_GREEDY_HINT}")
        _expect_best(g, where, got, score, logp, best, 0.0, "the likeliest pair of new tokens")
        return
    logp, width = table_logp(_ladder_table()), 4 if case is None else case
    expected = [0, width, _LADDER_TARGET]
    where, got, score = _on_table(g, student, "ladder table", logp, 2, case)
    default = " (the default beam_width is 4)" if case is None else ""
    if got != expected and got in [[0, w, _LADDER_TARGET] for w in range(1, 6)]:
        g.fail(
            f"{where}: a search of width {width} keeps the first tokens 1 .. {width} and ends with 0, {width}, "
            f"{_LADDER_TARGET}; got {got}, the answer of width {got[1]}{default}: {_WIDTH_HINT}"
        )
    _expect_best(g, where, got, score, logp, expected, 1.0, _WIDTH_HINT + default)


def _beam_length(g: Grader, student, alpha) -> None:
    """The length table at the default length_penalty (``None``: 1) and at ``alpha``."""
    logp, e = table_logp(_length_table()), _EOS_LEN
    if alpha is None:
        where, got, score = _on_table(g, student, "length table", logp, 6, 2, eos=e)
        long = [0, 1, 2, e]
        if got == [0, e]:
            g.fail(f"{where} (default length_penalty): {_NORM_HINT} (the default length_penalty is 1.0)")
        if got == long and abs(score - _path_logprob(logp, long) / 4) < 1e-4:
            g.fail(
                f"{where}: n counts the generated tokens (EOS included), not the prompt: divide by (T - T0) ** "
                "length_penalty"
            )
        if got == long and abs(score - _path_logprob(logp, long)) < 1e-4:
            g.fail(f"{where}: {_NORM_HINT} (the returned score is the raw total)")
        hint = "with the default length_penalty=1 the hypothesis 0, 1, 2, EOS (mean log-probability log 0.6) beats "
        _expect_best(g, where, got, score, logp, long, 1.0, hint + "0, EOS (log 0.4)")
        return
    hint = (
        _RAW_HINT + ": 0, EOS (probability 0.4) beats 0, 1, 2, EOS (0.216)"
        if alpha == 0
        else f"rank finished hypotheses by logprob / n ** {alpha}"
    )
    _like_reference(
        g, student, logp, "length table", torch.tensor([[0]]), 6, 2, hint, eos_id=e, length_penalty=alpha
    )


_RANK_NOTE = (
    "with beam_width=1 the EOS after 0 is the second-best candidate and is dropped; 0, 1, 3 is the answer"
)
_KEEP_NOTE = (
    "with beam_width=2: after 0, EOS finishes at step 1, both 0, 1 and 0, 2 must stay live; 0, 2, 3, EOS is "
    "the best hypothesis"
)
_CROWD_NOTE = (
    "with beam_width=3, three EOS candidates are among the best 6 at step 2: the third (ranked 5th) is "
    "dropped and 0, 3, 6 (ranked 6th) stays live; " + _EOS_BEAM_HINT
)
_STOP_NOTE = "the best hypothesis is 0, 1, EOS"
_ONE_NOTE = "the only candidate is EOS: it finishes a hypothesis and no beam is live, so the search ends"
#: the cases with an EOS worked out by hand: the table (None: one token, EOS = 0), EOS, max_new_tokens, W,
#: length_penalty (None: the default), the answer, the hint for the answer 0, EOS (None: none), the hint
#: (None: that one)
_HAND = {
    "EOS rank": (_eos_rank_table, _EOS_RANK, 2, 1, 0.0, [0, 1, 3], _EOS_RANK_HINT, _RANK_NOTE),
    "stop 1": (_stop_table, _EOS_STOP, 6, 2, 1.0, [0, 1, 3], None, _STOP_NOTE),  # EOS = 3
    "stop 0": (_stop_table, _EOS_STOP, 6, 2, 0.0, [0, 1, 3], None, _STOP_NOTE),
    "EOS-beam": (_eos_beam_table, _EOS_KEEP, 5, 2, 1.0, [0, 2, 3, _EOS_KEEP], _EOS_BEAM_HINT, _KEEP_NOTE),
    "crowded": (_crowded_table, _EOS_CROWD, 4, 3, None, [0, 3, 6, 8, _EOS_CROWD], None, _CROWD_NOTE),
    "early-stop 1": (_early_stop_table, _EOS_EARLY, 4, 1, 1.0, [0, 1, 2, 3], _EARLY_HINT, None),  # EOS = 3
    "early-stop 2": (_early_stop_table, _EOS_EARLY, 4, 1, 2.0, [0, 1, 2, 3], _EARLY_HINT, None),
    "live": (_live_table, _EOS_LIVE, 2, 2, None, [0, 1, 2], _LIVE_HINT, None),
    "one-token 1": (None, 0, 3, 1, None, [0, 0], None, _ONE_NOTE),
    "one-token 2": (None, 0, 1, 2, None, [0, 0], None, _ONE_NOTE),
}


def _beam_hand(g: Grader, student, name: str) -> None:
    """The case ``name`` of :data:`_HAND` (its table's name is the case's, without the length_penalty)."""
    table, e, n, W, alpha, answer, wrong, hint = _HAND[name]
    label = "one-token table, EOS = 0" if table is None else f"{name.split()[0]} table"
    logp = torch.zeros(1, 1) if table is None else table_logp(table())
    where, got, score = _on_table(g, student, label, logp, n, W, eos=e, alpha=alpha)
    if e in got[1:-1]:
        g.fail(f"{where}: {_EOS_HINT} (got {got})")
    if wrong is not None and got == [0, e]:
        g.fail(f"{where}: {wrong}")
    _expect_best(g, where, got, score, logp, answer, 1.0 if alpha is None else alpha, hint or wrong)


def _beam_random(g: Grader, student, case) -> None:
    if case == "order 2":  # the cache follows the beams: the next token depends on the last two tokens
        logp = _random_table(seed=5, V=4, order=2, eos=None, sharp=2.5)
        return _like_reference(
            g, student, logp, "random (4, 4, 4) table", torch.tensor([[1, 2]]), 4, 3, _REORDER_HINT
        )
    order, V, W, n, T0, alpha, with_eos, sharp, seed = case
    eos = (seed % V) if with_eos else None
    logp = _random_table(seed, V, order, eos, sharp)
    prompt = _ids_from(seed, 1, T0, V=V)
    _clear(_beam_margin(TableLM(logp), prompt, n, W, eos, alpha) > 1e-4)
    hint = "the sequence differs from the reference's"
    if order == 2:
        hint += (
            " (this model's next token depends on the last two tokens, which its cache keeps per row: "
            "reorder the cache with cache.reorder(parents) whenever the beams change)"
        )
    label = f"random {'(V, V, V)' if order == 2 else '(V, V)'} table, V={V}"
    _like_reference(g, student, logp, label, prompt, n, W, hint, eos_id=eos, length_penalty=alpha)


def _gpt_classes(student) -> tuple:
    """The notebook's ``GPT`` and ``GPTConfig``: passed to the hidden grader, taken by the public one."""
    if len(student) >= 4:
        return student[2], student[3]
    return student_side("GPT", ref.GPT), student_side("GPTConfig", ref.GPTConfig)


#: the GPT cases of beam search: (W, max_new_tokens, length_penalty, the step of the EOS or None)
_GPT_BEAMS = ((3, 8, 1.0, None), (4, 7, 0.7, 3), (2, 6, 0.0, 2))


def _beam_gpt(g: Grader, student, i: int) -> None:
    model, local = _gpt_pair(*_gpt_classes(student), seed=4)
    W, n, alpha, eos_at = _GPT_BEAMS[i]
    prompt, eos = _clear_prompt(local, f"beam.gpt.{i}", 4, n, W, eos_at, alpha)
    tokens, ours = dec.beam_search(local, prompt, n, W, eos_id=eos, length_penalty=alpha)
    where, got, score = _beam_call(
        g, student[0], model, "gpt", prompt, n, W, eos_id=eos, length_penalty=alpha
    )
    g.expect(
        got == tokens[0].tolist(),
        f"{where} should give {tokens[0, 4:].tolist()} after the prompt, got {got[4:]}. If the table-model "
        "checks pass, look at the cache: reorder it with cache.reorder(index) whenever the beams change, "
        "and feed only the new tokens (N, 1) with it",
    )
    lp = float(dec.sequence_logprob(local, prompt, torch.tensor([got[4:]])))
    m = len(got) - 4
    with torch.no_grad():
        logits = float(local(torch.tensor([got[:-1]]))[0, 3:].abs().max())  # those that scored the new tokens
    g.expect(
        _score_ok(score, lp / m**alpha, m, alpha, logits, abs(ours - lp / m**alpha)),
        f"{where}: for {got[4:]} (n = {m}) the score should be log p / n ** {alpha} = {lp / m**alpha:.6f}, "
        f"got {score:.6f}",
    )


def _beam_greedy(g: Grader, student, i: int) -> None:
    model, local = _gpt_pair(*_gpt_classes(student), seed=3)
    prompt = _prompt(f"beam.greedy.{i}")
    greedy = dec.generate(local, prompt, 12)
    where, got, _ = _beam_call(g, student[0], model, "gpt", prompt, 12, 1)
    g.expect(
        got == greedy[0].tolist(),
        f"{where}: with beam_width=1 and no EOS the new tokens must be the greedy ones "
        f"{greedy[0, 5:].tolist()}, got {got[5:]}",
    )
    eos = int(greedy[0, 10])
    expected = dec.generate(local, prompt, 12, eos_id=eos)[0].tolist()
    where, got, _ = _beam_call(g, student[0], model, "gpt", prompt, 12, 1, eos_id=eos, length_penalty=0.0)
    if len(got) > len(expected) and got[: len(expected)] == expected:
        g.fail(f"{where}: {_EOS_HINT}")
    g.expect(
        got == expected,
        f"{where}: the result must be greedy decoding up to its first EOS, {expected[5:]}, got {got[5:]}",
    )


def _beam_mode(g: Grader, student, case: str) -> None:
    """``"GPT"``: a GPT in training mode with dropout decodes as in eval mode and stays in training mode;
    ``"eval"``: a table model in eval mode stays so; ``"raises"``: the model raises, its mode is restored."""
    fn = student[0]
    if case == "GPT":
        model, local = _gpt_pair(*_gpt_classes(student), seed=6, dropout=0.3)
        model.train()
        prompt, _ = _clear_prompt(local, "beam.mode", 4, 6, 3)
        tokens, _ = dec.beam_search(local, prompt, 6, 3)
        where, got, _ = _beam_call(g, fn, model, "gpt in training mode, dropout=0.3", prompt, 6, 3)
        g.expect(
            got == tokens[0].tolist(),
            f"{where}: the result differs from the reference: call model.eval() before decoding (dropout off)",
        )
        g.expect(
            model.training is True,
            f"{where}: the model was left in eval mode: remember was_training = model.training and restore it "
            "with model.train(was_training) in a finally block",
        )
        return
    table = student[1](table_logp(_greedy_trap()))
    if case == "eval":
        table.eval()
        where = _beam_call(g, fn, table, "<table in eval mode>", torch.tensor([[0]]), 2, 2)[0]
        g.expect(
            table.training is False,
            f"{where} left the model in training mode: restore the mode it had (model.train(was_training)), "
            "not training mode",
        )
        return
    table.train()
    where = "beam_search(<table in training mode>, [[7]], 2, 2) (token 7 is not in the model's 5-token vocabulary)"
    try:
        fn(table, torch.tensor([[7]]), 2, 2)
    except Exception as e:  # noqa: BLE001 (the model raises; so may the student's code)
        raise_unless_student_error(e)
    g.expect(
        table.training is True,
        f"{where}: the model raised and was left in eval mode: restore its mode in "
        "a finally block (try: ... finally: model.train(was_training))",
    )


#: bad arguments of beam_search (after the model, a table): the prompt's shape and dtype, max_new_tokens,
#: beam_width, and what they are
_BEAM_BAD = [
    ((2, 3), torch.long, 4, 2, "two prompts at once, shape (2, 3) (it takes one (1, T0) prompt)"),
    ((3,), torch.long, 4, 2, "a 1-D prompt (3,) (the prompt must be (1, T0))"),
    ((1, 3), torch.float32, 4, 2, "a float32 prompt (1, 3) (token ids are torch.long)"),
    ((1, 2), torch.int32, 4, 2, "an int32 prompt (1, 2) (token ids are torch.long)"),
    ((1, 3), torch.long, 4, 0, "beam_width=0"),
    ((1, 3), torch.long, 4, -1, "beam_width=-1"),
    ((1, 3), torch.long, 0, 2, "max_new_tokens=0"),
    ((1, 3), torch.long, -2, 2, "max_new_tokens=-2"),
]


def _beam_bad_call(i: int) -> Call:
    """The student's beam search on a table model built with their ``TableLM``, with bad arguments."""
    shape, dtype, n, W, what = _BEAM_BAD[i]
    on_trap = lambda g, student: functools.partial(student[0], student[1](table_logp(_greedy_trap())))
    return Call(what, (torch.zeros(shape, dtype=dtype), n, W), build=on_trap)


BEAM = Spec(
    "beam_search",
    [
        Clause(
            "returns (tokens, score): tokens (1, T0 + n) torch.long starting with the prompt, score a float",
            _beam_returns,
            examples=["random table"],
        ),
        Clause(
            "keeps the best beam_width candidates of all beams together (W = 1 .. 5; 4 by default)",
            _beam_width,
            examples=["greedy trap", 2, 3, None],
            also=[1, 5],
        ),
        Clause(
            "ranks hypotheses by logprob / n ** length_penalty (1 by default; 0, 0.5, 2 and -1)",
            _beam_length,
            examples=[None, 0.0],
            also=[0.5, 2.0, -1.0],
        ),
        Clause(
            "a hypothesis ends at its EOS, which finishes it only if it is among the best W candidates",
            _beam_hand,
            examples=["EOS rank", "stop 1"],
            also=["stop 0"],
        ),
        Clause(
            "an EOS candidate does not take the place of a live beam (the best 2W candidates are ranked)",
            _beam_hand,
            examples=["EOS-beam"],
            also=["crowded"],
        ),
        Clause(
            "stops before max_new_tokens only when no live beam can still beat the W best finished hypotheses",
            _beam_hand,
            examples=["early-stop 1"],
            also=["early-stop 2"],
        ),
        Clause(
            "after max_new_tokens steps the live beams count as finished; the search ends when no beam is live",
            _beam_hand,
            examples=["live"],
            also=["one-token 1", "one-token 2"],
        ),
        Clause(
            "matches the reference on random models (any beam_width, max_new_tokens, length_penalty, eos_id), "
            "reordering the cache with the beams",
            _beam_random,
            st.tuples(
                st.sampled_from([1, 2]),
                st.integers(3, 7),
                st.integers(1, 5),
                st.integers(1, 6),
                st.integers(1, 3),
                st.sampled_from([1.0, 0.0, 0.5, 2.0, -0.5]),
                st.booleans(),
                st.sampled_from([1.0, 2.5]),
                SEEDS,
            ),
            key="beam.random",
            budget="widest",
            examples=[(2, 4, 2, 3, 1, 1.0, True, 2.5, 11), "order 2"],
        ),
        Clause(
            "matches the reference on a GPT (the beams' KV cache follows them) and scores the returned sequence",
            _beam_gpt,
            examples=[0],
            also=[1, 2],
        ),
        Clause(
            "beam_width=1 is greedy decoding (a GPT; with an EOS at length_penalty=0)",
            _beam_greedy,
            examples=[0],
            also=[1],
        ),
        Clause(
            "decodes in eval mode and restores the model's mode (training or eval), even when the model raises",
            _beam_mode,
            examples=["eval", "raises"],
            also=["GPT"],
        ),
        raises(
            _beam_bad_call,
            examples=[4, 6, 0],
            also=[1, 2, 3, 5, 7],
            fix="beam_search takes one (1, T0) torch.long prompt, beam_width >= 1 and max_new_tokens >= 1",
            text="bad arguments raise ValueError: a prompt that is not (1, T0) torch.long, beam_width < 1, "
            "max_new_tokens < 1",
        ),
    ],
)
check_beam_search, grade_beam_search = BEAM.graders()


# =========================================================================== part 5: causal_self_attention

C, H = 12, 4  # D = 3: scaling by sqrt(C) and by sqrt(D) differ
#: (C, H, H_kv, bias) of the attention modules the checks draw: one head, D = 1, every grouping, no biases
CONFIGS = [(12, 4, 4, True), (12, 4, 2, True), (12, 4, 1, False), (6, 1, 1, True), (6, 6, 3, True)]
CONFIGS += [(8, 2, 1, False), (10, 5, 5, False), (12, 6, 3, True), (12, 6, 2, False)]
GQA_CONFIGS = [c for c in CONFIGS if 1 < c[2] < c[1]]

_TOP_LEFT_HINT = (
    "the causal mask is aligned top-left: new tokens after a cache must see all cached keys, new token i "
    "(at position P + i) sees keys 0 .. P + i: use the bottom-right aligned causal_mask(T, S), not "
    "is_causal=True (which is only right when T == S)"
)
_NOT_EXTENDED_HINT = (
    "the cache was not extended: the new tokens attend only to themselves; call k, v = cache.update(k, v) "
    "and attend to all the keys and values it returns"
)
_GROUPS_HINT = (
    "the groups are wrong: query head h reads key/value head h // (H / H_kv); use repeat_kv "
    "(repeat_interleave) or enable_gqa=True, not repeat"
)
_AT_ZERO_HINT = (
    "the cache is written at position 0 instead of after the cached tokens: new keys and values go to "
    "positions P .. P + T - 1 (cache.update(k, v) does this and advances cache.length)"
)


def attention_pair(
    MultiHeadAttention,
    name: str,
    n_kv: int | None = None,
    dropout: float = 0.0,
    *,
    d_model: int = C,
    n_heads: int = H,
    bias: bool = True,
):
    """A Chapter 2 attention module built with the student's class (in their process) and with coursekit's,
    holding the same random float64 weights, both in eval mode."""
    local = mh.MultiHeadAttention(d_model, n_heads, n_kv, bias=bias, dropout=dropout).double()
    weights = random_weights(local, name)
    local.load_state_dict(weights)
    local.eval()
    theirs = MultiHeadAttention(d_model, n_heads, n_kv, bias=bias, dropout=dropout)
    theirs.double()
    theirs.load_state_dict(weights)
    theirs.eval()
    return theirs, local


def _pair(MultiHeadAttention, name: str, config, dropout: float = 0.0):
    """:func:`attention_pair` of one of :data:`CONFIGS`, ``(C, H, H_kv, bias)``."""
    Cc, Hh, kv, bias = config
    return attention_pair(MultiHeadAttention, name, kv, dropout, d_model=Cc, n_heads=Hh, bias=bias)


def _attend(r, x_new, k, v, mask=None, scale=None, out_proj=True):
    """``r``'s attention of the new tokens' queries to keys ``k`` and values ``v`` (the common mistakes use this)."""
    q = r.project(x_new)[0]  # (B, H, T, D)
    n_rep = r.n_heads // k.shape[1]  # 1 if k already has H heads
    out, _ = att.scaled_dot_product_attention(
        q, mh.repeat_kv(k, n_rep), mh.repeat_kv(v, n_rep), mask=mask, scale=scale
    )
    merged = mh.merge_heads(out)  # (B, T, C)
    return r.out_proj(merged) if out_proj else merged


def _csa_mistakes(r, x_new, k_all, v_all, P: int):
    T, S = x_new.shape[1], k_all.shape[2]
    top_left = torch.ones(T, S, dtype=torch.bool).tril()
    bottom_right = att.causal_mask(T, S)
    out = [
        (
            _attend(r, x_new, k_all, v_all, bottom_right, scale=1.0),
            "the scores are not scaled: multiply q k^T by 1/sqrt(D), D = attn.d_head (F.scaled_dot_product_attention "
            "does this)",
        ),
        (
            _attend(r, x_new, k_all, v_all, bottom_right, scale=1 / math.sqrt(r.d_model)),
            f"the scores are scaled by 1/sqrt(C): divide by sqrt(D), the head width D = attn.d_head = "
            f"{r.d_head}, not the model width",
        ),
        (
            _attend(r, x_new, k_all, v_all, bottom_right, out_proj=False),
            "the output projection is missing: return attn.out_proj(merge_heads(out))",
        ),
        (
            _attend(r, x_new, k_all, v_all),
            "the attention is not causal: new token i may only see keys up to its own position P + i",
        ),
    ]
    if 1 < r.n_kv_heads < r.n_heads:
        n_rep = r.n_heads // r.n_kv_heads
        tiled = k_all.repeat(1, n_rep, 1, 1), v_all.repeat(1, n_rep, 1, 1)  # (B, H, S, D) in the wrong order
        out.append((_attend(r, x_new, *tiled, bottom_right), _GROUPS_HINT))
    if P > 0:
        out.insert(0, (_attend(r, x_new, k_all, v_all, top_left), _TOP_LEFT_HINT))
        k_new, v_new = k_all[:, :, P:], v_all[:, :, P:]
        out.insert(1, (_attend(r, x_new, k_new, v_new, att.causal_mask(T)), _NOT_EXTENDED_HINT))
        if T <= P:
            stale = (
                torch.cat([k_new, k_all[:, :, T:P], torch.zeros_like(k_new)], 2),
                torch.cat([v_new, v_all[:, :, T:P], torch.zeros_like(v_new)], 2),
            )
            out.insert(2, (_attend(r, x_new, *stale, bottom_right), _AT_ZERO_HINT))
            out.insert(3, (_attend(r, x_new, *stale, top_left), _AT_ZERO_HINT))
    return out


def _csa_call(g: Grader, fn, where: str, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        if "expected k and v of shape" in str(e):
            g.fail(
                f"{where}: cache.update received keys/values of the wrong shape: store the H_kv key/value heads "
                f"that attn.project returns, (B, H_kv, T, D), and repeat them for the query heads only after reading "
                f"the cache ({e})"
            )
        g.fail(f"{where}: {raised(e)}")


def _prefilled(LayerCache, r, x_past: torch.Tensor, max_len: int, dtype: torch.dtype = torch.float64):
    """A cache (of the student's class, buffers of ``dtype``) holding the reference keys and values of the
    float64 ``x_past`` ``(B, P, C)``."""
    B, P = x_past.shape[:2]
    _, k, v = r.project(x_past)  # (B, H_kv, P, D) each
    cache = LayerCache(B, r.n_kv_heads, max_len, r.d_head, dtype)
    if P:
        cache.update(k.to(dtype), v.to(dtype))
    return cache


def _cache_contents(g: Grader, where: str, cache, k_expected, v_expected, P: int) -> None:
    """After the call the cache holds ``k_expected``/``v_expected`` at positions 0 .. P + T - 1."""
    S = k_expected.shape[2]
    length = cache.length
    T = S - P
    if length == P:
        g.fail(
            f"{where}: cache.length is still {P} after {T} new tokens: the cache was not extended "
            "(use k, v = cache.update(k, v))"
        )
    g.expect(
        length == S,
        f"{where}: after {P} cached and {T} new tokens cache.length should be {S}, got {length!r}",
    )
    ck, cv = cache.k, cache.v
    g.expect(
        is_tensor(ck) and ck.dim() == 4 and ck.shape[:2] == k_expected.shape[:2] and ck.shape[2] >= S,
        f"{where}: cache.k should stay a (B, H_kv, max_len, D) buffer of {k_expected.shape[1]} key/value heads, "
        f"got {describe(ck)}",
    )
    if P and T <= P and close(ck[:, :, :T], k_expected[:, :, P:]):
        g.fail(f"{where}: {_AT_ZERO_HINT}")
    g.expect(
        close(ck[:, :, :S], k_expected) and close(cv[:, :, :S], v_expected),
        f"{where}: the cache does not hold the keys and values of all tokens in order: new keys/values go to "
        "positions P .. P + T - 1, after the cached ones (cache.update)",
    )


def _csa_where(config, B: int, P: int, T: int, dtype=torch.float64, extra: str = "") -> str:
    Cc, Hh, kv, bias = config
    cache = "no cache" if P < 0 else ("an empty cache" if P == 0 else f"a cache holding P={P} tokens")
    return (
        f"causal_self_attention(attn (C={Cc}, H={Hh}, n_kv_heads={kv}, bias={bias}{extra}), x ({B}, {T}, {Cc}) "
        f"{dtype_name(dtype)}, {cache})"
    )


def _csa_step(name: str, g: Grader, student, case) -> None:
    """One call against attention over the whole sequence: a drawn ``(config, (B, T), dtype, seed)`` without a
    cache, or ``(config, B, P, T, seed)`` after ``P`` cached tokens (``(config, B, P, seed)``: one new token)."""
    fn, MultiHeadAttention, LayerCache = student
    if isinstance(case[1], tuple):  # no cache
        config, (B, T), dtype, seed = case
        P = None
    else:
        config, B, P, *new, seed = case
        T, dtype = new[0] if new else 1, torch.float64
    Cc, name = config[0], f"{name}.{seed}"
    m, r = _pair(MultiHeadAttention, name, config)
    Pn = P or 0
    x_all = rand(name + ".x", B, Pn + T, Cc)
    x_new = x_all[:, Pn:]
    full = r(x_all, is_causal=True)[0]  # (B, P + T, C), float64
    where = _csa_where(config, B, -1 if P is None else Pn, T, dtype)
    if dtype != torch.float64:
        m.to(dtype)
    cache = None if P is None else _prefilled(LayerCache, r, x_all[:, :Pn], Pn + T + 1, dtype)
    out = _csa_call(g, fn, where, m, x_new.to(dtype), *(() if cache is None else (cache,)))
    g.expect(
        is_tensor(out) and out.shape == (B, T, Cc) and out.dtype == dtype,
        f"{where}: expected a tensor {dtype_name(dtype)} {(B, T, Cc)}, got {describe(out)}",
    )
    expected = full[:, Pn:].to(dtype)
    _, k_all, v_all = r.project(x_all)
    if dtype == torch.float64:
        mistakes = _csa_mistakes(r, x_new, k_all, v_all, Pn)
        first_match(g, out, [(mm, f"{where}: {h}") for mm, h in mistakes], expected)
    g.expect(
        close(out, expected, magnitude=magnitude(x_all)),
        f"{where}: the output differs from attn(x_all, is_causal=True)[0] at the new positions (x_all = the "
        "cached tokens followed by x)",
    )
    if cache is not None and dtype == torch.float64:
        _cache_contents(g, where, cache, k_all, v_all, Pn)


_BT = st.tuples(st.integers(1, 3), st.integers(1, 6))


def _dropout_subsets(out, r, x_all: torch.Tensor, P: int, p: float):
    """Whether ``out`` is ``out_proj(merge_heads(dropout_p(weights) @ v))`` for *some* dropout mask: each
    head's output before ``out_proj`` must be ``1 / (1 - p)`` times a sum of ``w_s v_s`` over a subset of the
    visible keys ``s``. Returns ``None`` if so, else the first ``(b, h, t)`` that is no such sum."""
    B, S, Cc = x_all.shape
    T = S - P
    W_o, b_o = r.out_proj.weight, r.out_proj.bias
    shifted = out - (0 if b_o is None else b_o)  # (B, T, C)
    heads = (
        torch.linalg.solve(W_o, shifted.reshape(-1, Cc).T)
        .T.reshape(B, T, r.n_heads, r.d_head)
        .transpose(1, 2)
    )
    q, k, v = r.project(x_all)
    q = q[:, :, P:]
    n_rep = r.n_heads // r.n_kv_heads
    k, v = mh.repeat_kv(k, n_rep), mh.repeat_kv(v, n_rep)  # (B, H, S, D)
    w = att.scaled_dot_product_attention(q, k, v, mask=att.causal_mask(T, S))[1]  # (B, H, T, S)
    subsets = torch.tensor(list(itertools.product([0.0, 1.0], repeat=S)), dtype=torch.float64)  # (2^S, S)
    for b, h, t in itertools.product(range(B), range(r.n_heads), range(T)):
        cand = (subsets * w[b, h, t]) @ v[b, h] / (1 - p)  # (2^S, D)
        best = (cand - heads[b, h, t]).abs().amax(-1).argmin()
        if not close(heads[b, h, t], cand[best], magnitude=magnitude(x_all, v)):
            return b, h, t
    return None


def _csa_shape_call(case) -> Call:
    config, (B, T), dtype, seed = case

    def build(g: Grader, student):
        """The student's attention step bound to a module of ``config`` built with their class."""
        m, _ = _pair(student[1], f"csa.shape.{seed}", config)
        m.to(dtype)
        return functools.partial(student[0], m)

    x = tensor(seed, B, T, config[0], dtype=dtype)
    return Call(_csa_where(config, B, -1, T, dtype), (x,), build=build)


def _csa_extended(g: Grader, student, case) -> None:
    (fn, MHA, LC), (config, B, P, T, seed) = student, case
    m, r = _pair(MHA, f"csa.cache.{seed}", config)
    x_all = tensor(seed, B, P + T, config[0])
    cache = _prefilled(LC, r, x_all[:, :P], P + T + 2)
    where = _csa_where(config, B, P, T)
    _csa_call(g, fn, where, m, x_all[:, P:], cache)
    _, k_all, v_all = r.project(x_all)
    _cache_contents(g, where, cache, k_all, v_all, P)


def _csa_pieces(g: Grader, student, case) -> None:
    (fn, MHA, LC), (config, B, sizes, seed) = student, case
    m, r = _pair(MHA, f"csa.chain.{seed}", config)
    S, Cc = sum(sizes), config[0]
    x = tensor(seed, B, S, Cc)
    cache = LC(B, r.n_kv_heads, S, r.d_head, torch.float64)
    full = r(x, is_causal=True)[0]
    start = 0
    for n in sizes:
        where = (
            f"{_csa_where(config, B, start, n)} (feeding pieces of {list(sizes)} tokens through one cache, "
            f"this is the piece at {start} .. {start + n - 1})"
        )
        out = _csa_call(g, fn, where, m, x[:, start : start + n], cache)
        g.expect(
            is_tensor(out) and out.shape == (B, n, Cc), f"{where}: expected {(B, n, Cc)}, got {describe(out)}"
        )
        g.expect(
            close(out, full[:, start : start + n]),
            f"{where}: differs from attention over the whole sequence: later pieces must see all earlier "
            "tokens through the cache",
        )
        start += n
    _, k, v = r.project(x)
    _cache_contents(g, _csa_where(config, B, S - sizes[-1], sizes[-1]), cache, k, v, S - sizes[-1])


def _csa_eval(g: Grader, student, case) -> None:
    (fn, MHA, LC), (config, B, P, T, seed) = student, case
    m, r = _pair(MHA, f"csa.eval.{seed}", config, dropout=0.5)
    x_all = tensor(seed, B, P + T, config[0])
    cache = _prefilled(LC, r, x_all[:, :P], P + T)
    where = _csa_where(config, B, P, T, extra=", dropout=0.5, eval mode")
    out = _csa_call(g, fn, where, m, x_all[:, P:], cache)
    g.expect(
        close(out, r(x_all, is_causal=True)[0][:, P:]),
        f"{where}: the output differs from the reference: apply dropout only when attn.training",
    )


def _csa_dropout(g: Grader, student, case) -> None:
    (fn, MHA, LC), (config, B, P, T, p, seed) = student, case
    m, r = _pair(MHA, f"csa.dropout.{seed}", config, dropout=0.5)
    m.train()
    if p != 0.5:
        set_attr(m, "dropout", p)
    Cc = config[0]
    x_all = tensor(seed, B, P + T, Cc)
    cache = _prefilled(LC, r, x_all[:, :P], P + T) if P else None
    where = _csa_where(config, B, P if P else -1, T, extra=f", attn.dropout={p}, training mode")
    out = _csa_call(g, fn, where, m, x_all[:, P:], *(() if cache is None else (cache,)))
    g.expect(
        is_tensor(out) and out.shape == (B, T, Cc), f"{where}: expected {(B, T, Cc)}, got {describe(out)}"
    )
    if p == 1.0:
        bias_only = r.out_proj(torch.zeros(B, T, Cc, dtype=torch.float64)).detach()  # its bias, or zeros
        g.expect(
            close(out, bias_only),
            f"{where}: with every attention weight dropped the output is out_proj of zeros (its bias): apply "
            "dropout with probability attn.dropout to the attention weights (dropout_p=attn.dropout when "
            "attn.training)",
        )
        return
    if close(out, r(x_all, is_causal=True)[0][:, P:]):
        g.fail(
            f"{where}: nothing was dropped: in training mode pass dropout_p=attn.dropout to "
            "F.scaled_dot_product_attention (or F.dropout the weights)"
        )
    bad = _dropout_subsets(out, r, x_all, P, p)
    g.expect(
        bad is None,
        f"{where}: at batch {bad and bad[0]}, head {bad and bad[1]}, new token {bad and bad[2]} the output "
        "is not 2 x a sum of w_s v_s over some of the visible keys: dropout belongs on the attention "
        "weights (each weight kept with probability 1 - p and scaled by 1 / (1 - p)), not on q, k, v or "
        "the output",
    )


def _configs_and(*rest) -> st.SearchStrategy:
    return st.tuples(st.sampled_from(CONFIGS), *rest)


CSA = Spec(
    "causal_self_attention",
    [
        returns(
            _csa_shape_call,
            lambda case: torch.empty(*case[1], case[0][0], dtype=case[2]),
            _configs_and(_BT, _DTYPES, SEEDS),
            key="csa.shape",
            budget="few",
            examples=[(CONFIGS[0], (1, 2), torch.float32, 0)],
            text="returns (B, T, C) of x's dtype (float32 and float64)",
        ),
        Clause(
            "without a cache: equals attn(x, is_causal=True)[0] (any B, T, heads, key/value heads, with or "
            "without biases, float32 and float64)",
            functools.partial(_csa_step, "csa.nocache"),
            _configs_and(_BT, _DTYPES, SEEDS),
            key="csa.nocache",
            budget="normal",
            examples=[(CONFIGS[0], (2, 5), torch.float64, 1)],
        ),
        Clause(
            "one new token after P cached ones sees every cached key",
            functools.partial(_csa_step, "csa.step"),
            _configs_and(st.integers(1, 3), st.integers(1, 7), SEEDS),
            key="csa.step",
            budget="some",
            examples=[(CONFIGS[0], 2, 5, 2)],
        ),
        Clause(
            "T new tokens after P cached ones: the causal mask is aligned bottom-right (T < P, T = P, T > P)",
            functools.partial(_csa_step, "csa.chunk"),
            _configs_and(st.integers(1, 3), st.integers(1, 6), st.integers(2, 5), SEEDS),
            key="csa.chunk",
            budget="normal",
            examples=[(CONFIGS[0], 2, 4, 3, 3)],
            also=[(CONFIGS[1], 2, P, T, 4) for P, T in ((2, 4), (3, 3), (5, 2))],
        ),
        Clause(
            "the cache is extended: cache.length = P + T, and it holds every key and value in order",
            _csa_extended,
            _configs_and(st.integers(1, 2), st.integers(0, 5), st.integers(1, 4), SEEDS),
            key="csa.cache",
            budget="some",
            examples=[(CONFIGS[0], 2, 3, 2, 5)],
        ),
        Clause(
            "decoding piece by piece with one cache equals attention over the whole sequence",
            _csa_pieces,
            _configs_and(
                st.integers(1, 2), st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), SEEDS
            ),
            key="csa.chain",
            budget="small",
            examples=[(CONFIGS[0], 2, (4, 1, 3, 1), 6), (CONFIGS[0], 2, (3, 1), 0)],
        ),
        Clause(
            "grouped-query attention: the cache holds H_kv heads, query head h reads key/value head h // (H / "
            "H_kv)",
            functools.partial(_csa_step, "csa.gqa"),
            st.tuples(
                st.sampled_from(GQA_CONFIGS), st.integers(1, 2), st.integers(0, 4), st.integers(1, 3), SEEDS
            ),
            key="csa.gqa",
            budget="some",
            examples=[(GQA_CONFIGS[0], 2, 3, 2, 7)],
            also=[(GQA_CONFIGS[0], 2, P, T, 8) for P, T in ((0, 3), (3, 1), (2, 2))],
        ),
        Clause(
            "no dropout in eval mode, even with attn.dropout = 0.5",
            _csa_eval,
            _configs_and(st.integers(1, 2), st.integers(0, 3), st.integers(1, 3), SEEDS),
            key="csa.eval",
            budget="few",
            examples=[(CONFIGS[0], 2, 0, 3, 8)],
        ),
        Clause(
            "in training mode, dropout with probability attn.dropout on the attention weights "
            "(p = 1 drops them all; p = 0.5 keeps a subset, scaled by 2)",
            _csa_dropout,
            st.tuples(
                st.sampled_from([c for c in CONFIGS if c[0] // c[1] > 1] + [CONFIGS[3]]),
                st.integers(1, 2),
                st.integers(0, 3),
                st.integers(1, 3),
                st.sampled_from([0.5, 1.0]),
                SEEDS,
            ),
            key="csa.dropout",
            budget="normal",
            examples=[(CONFIGS[0], 2, 0, 3, 1.0, 9)],
            also=[(CONFIGS[1], 2, P, T, p, 10) for P, T in ((0, 3), (3, 1), (2, 3)) for p in (1.0, 0.5)],
        ),
    ],
)
check_causal_self_attention, grade_causal_self_attention = CSA.graders()


# --------------------------------------------------------------------------- predict, then check

#: the distribution of NUCLEUS_SIZE, and its p
NUCLEUS_PROBS, NUCLEUS_P = (0.4, 0.3, 0.2, 0.1), 0.75


def _nucleus_size() -> int:
    logits = torch.tensor(NUCLEUS_PROBS, dtype=torch.float64).log()  # (4,)
    return int(torch.isfinite(dec.top_p_filter(logits, NUCLEUS_P)).sum())


NUCLEUS_SIZE = Prediction(
    name="predict_nucleus_size",
    question=f"Next-token probabilities {list(NUCLEUS_PROBS)} go through top_p_filter with p = {NUCLEUS_P}: how "
    "many tokens can still be sampled?",
    tests="the nucleus rule: the token whose probability crosses p is kept",
    measure=_nucleus_size,
    explanation="The tokens ranked before the third one hold 0.4 + 0.3 = 0.7, still below 0.75, so the third "
    "token (0.2) is kept: it is the one that crosses p. The fourth has 0.9 before it and is dropped: {truth} "
    "tokens remain, whose probability (0.9) is at least p, as Holtzman et al. (2020) define the nucleus. "
    "Stopping *before* crossing p would keep 2 tokens holding only 0.7 < p.",
)

#: the characters per token of PERPLEXITY's subword model
PPL_CHARS_PER_TOKEN = 3
#: the choices of PERPLEXITY, letter -> perplexity per token: the per-character perplexity unchanged,
#: multiplied by the characters per token, raised to their number (the truth), the character vocabulary
_PPL_CHOICES = {"a": 3.3, "b": 10.0, "c": 36.0, "d": 103.0}


@functools.cache
def _gpt_char() -> dict:
    """``gpt-char`` and four held-out pieces of 600 characters of its validation split (loaded once)."""
    from coursekit import checkpoints, data

    ck = checkpoints.load("gpt-char")
    _, val = data.split_text(data.python_docs_text())
    pieces = [val[a : a + 600] for a in range(0, len(val) - 600, len(val) // 4)][:4]
    return {"ck": ck, "ids": [data.encode_text(ck.tokenizer, t) for t in pieces]}


def _perplexity_choice() -> str:
    """The choice nearest (in log space) to the perplexity per token of a model with gpt-char's measured
    bits per character on tokens of PPL_CHARS_PER_TOKEN characters: a token's loss is the sum of its
    characters' losses."""
    c = _gpt_char()
    bits = sum(ref.bits_per_char(c["ck"].model, ids, 128) for ids in c["ids"]) / len(c["ids"])
    nats_per_token = PPL_CHARS_PER_TOKEN * bits * math.log(2)
    return min(_PPL_CHOICES, key=lambda k: abs(nats_per_token - math.log(_PPL_CHOICES[k])))


PERPLEXITY = Prediction(
    name="predict_perplexity",
    question="gpt-char scores about 1.2 nats per character on held-out text: a perplexity of about 3.3 per "
    f"character. A subword model cuts the same text into tokens of {PPL_CHARS_PER_TOKEN} characters on average "
    "and is exactly as good per character. What is its perplexity per token?",
    tests="perplexity per character and per token: losses add over a token's characters, perplexities multiply",
    measure=_perplexity_choice,
    explanation="Answer {truth}. A token's probability is the product of its characters' probabilities, so its "
    f"loss is the sum of theirs: {PPL_CHARS_PER_TOKEN} x 1.2 = 3.6 nats, and its perplexity exp(3.6) = 3.3 ** "
    f"{PPL_CHARS_PER_TOKEN}, about 36 (the check measured gpt-char's loss on four held-out pieces of text). 3.3 "
    "is the perplexity per character, not per token: a whole token is harder to guess than one of its "
    "characters; 10 = 3 x 3.3 adds perplexities where only losses add; 103 is the character vocabulary, a "
    "model that knows nothing. The same model has two perplexities, so compare models in bits (or nats) per "
    "character.",
    choices={"a": "about 3.3", "b": "about 10", "c": "about 36", "d": "about 103"},
)

#: SPECULATIVE_TOKENS's draft: k tokens a round, each accepted with probability a
SPECULATIVE_A, SPECULATIVE_K = 0.8, 4
#: its choices, letter -> tokens per target pass: a rejection discarding the whole guess (1 + k a^k), the
#: accepted prefix plus the target's token (the truth), every draft judged on its own (1 + a k), a perfect draft
_SPECULATIVE_CHOICES = {"a": 2.64, "b": 3.36, "c": 4.2, "d": 5.0}
#: rounds drawn (one seed): the mean's standard error is 0.011, the gap from the truth to the nearest other choice 0.72
SPECULATIVE_ROUNDS = 20_000


def _speculative_tokens_per_pass() -> float:
    """Mean tokens per target pass over SPECULATIVE_ROUNDS rounds of coursekit's accept/reject rule.

    A target ``p = (a, 1 - a)`` at every position and a draft that always proposes token 0
    (``q = (1, 0)``) make each draft accepted with probability ``min(1, p / q) = a``, independently;
    speculative_verify judges all rounds at once (one row per round) and a round emits its
    accepted drafts plus the target's one token.
    """
    a, k, B = SPECULATIVE_A, SPECULATIVE_K, SPECULATIVE_ROUNDS
    p = torch.tensor([a, 1 - a], dtype=torch.float64).expand(B, k + 1, 2)  # (B, k + 1, V)
    q = torch.tensor([1.0, 0.0], dtype=torch.float64).expand(B, k, 2)  # (B, k, V)
    drafted = torch.zeros(B, k, dtype=torch.long)  # (B, k)
    n_accepted, _ = speculative.speculative_verify(p, q, drafted, torch.Generator().manual_seed(0))
    return (n_accepted + 1).double().mean().item()


def _speculative_choice() -> str:
    measured = _speculative_tokens_per_pass()
    return min(_SPECULATIVE_CHOICES, key=lambda c: abs(measured - _SPECULATIVE_CHOICES[c]))


SPECULATIVE_TOKENS = Prediction(
    name="predict_speculative_tokens",
    question=f"Speculative decoding: a draft proposes k = {SPECULATIVE_K} tokens a round and the target accepts "
    f"each with probability a = {SPECULATIVE_A}, independently. How many tokens does one target pass emit on "
    "average?",
    tests="speculative decoding's bookkeeping: the accepted prefix plus the target's own token",
    measure=_speculative_choice,
    explanation="Answer {truth} (the check ran 20,000 rounds of speculative_verify and counted). A round keeps "
    "the drafts up to the first rejection and then adds one token of the target's own: the replacement drawn "
    "from the residual, or the free token after all k were accepted. Draft i survives only if it and every "
    "draft before it are accepted, with probability a^i, so a pass emits 1 + a + a^2 + a^3 + a^4 = 1 + 0.8 + "
    "0.64 + 0.512 + 0.41 = 3.36 = (1 - a^5) / (1 - a) tokens (Leviathan et al., 2023). 1 + a k = 4.2 would "
    "judge each draft on its own, but the drafts after a rejection continue a token the target threw away, so "
    "they are discarded unread; 1 + k a^k = 2.6 would discard the whole guess at a rejection, but the accepted "
    "prefix is kept; k + 1 = 5 needs a draft that is never wrong. Tokens per pass are not yet the speedup: "
    "each round also pays k draft passes.",
    choices={"a": "about 2.6", "b": "about 3.4", "c": "about 4.2", "d": "5"},
)

check_predict_nucleus_size, grade_predict_nucleus_size = NUCLEUS_SIZE.graders()
check_predict_perplexity, grade_predict_perplexity = PERPLEXITY.graders()
check_predict_speculative_tokens, grade_predict_speculative_tokens = SPECULATIVE_TOKENS.graders()


# --------------------------------------------------------------------------- experiment

#: the experiment's band, relative to coursekit's bits_per_char on the same model, text and block_size. The
#: measurement is deterministic and the docstring fixes the windows, so a correct answer differs only by
#: rounding (float32 logits and sums: well under 1e-5 relative); 0.1% is a hundred times that. One prediction
#: left out or counted twice among 300 moves the result by about 0.3%, a window without its overlap by more,
#: and the classic mistakes land far outside: nats instead of bits (+44%), log10 (-70%), the unshifted loss.
BPC_BAND = 0.001

#: the student's gpt-char of each check in progress, by grader: a check's cases share it (as they share the
#: student's process under the autograder)
_THEIR_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _their_gpt_char(g: Grader):
    """``gpt-char`` built with the notebook's ``GPT`` and ``GPTConfig`` (where the student's code runs), once
    per check."""
    models = _THEIR_MODELS.setdefault(g, {})
    if len(g.results) not in models:
        ck = _gpt_char()["ck"]
        GPT, GPTConfig = student_side("GPT", ref.GPT), student_side("GPTConfig", ref.GPTConfig)
        model = GPT(GPTConfig(**ck.record["config"]))
        model.load_state_dict(ck.model.state_dict())
        model.eval()
        models.clear()
        models[len(g.results)] = model
    return models[len(g.results)]


def _bits(g: Grader, bits_per_char, case):
    """The student's measurement on ``case``, ``(piece, tokens, block_size, what)``: ``(where, ids, result)``."""
    piece, n, block_size, what = case
    ids = _gpt_char()["ids"][piece][:n]
    where = f"bits_per_char(gpt-char, ids ({ids.numel()},) of {what}, {block_size})"
    return where, ids, call_student(g, where, bits_per_char, _their_gpt_char(g), ids, block_size)


def _bpc_float(g: Grader, bits_per_char, case) -> None:
    where, _, v = _bits(g, bits_per_char, case)
    g.expect(type(v) is float, f"{where} should return a Python float (use .item()), got {describe(v)}")


def _bpc_in_band(g: Grader, bits_per_char, case) -> None:
    where, ids, got = _bits(g, bits_per_char, case)
    expected = ref.bits_per_char(_gpt_char()["ck"].model, ids, case[2])
    expect_in_band(
        g,
        where,
        got,
        expected * (1 - BPC_BAND),
        expected * (1 + BPC_BAND),
        f"expected about {expected:.3f} bits per character: the logits at position i score token i + 1 (shift "
        "the targets), sum the cross-entropy over every predicted token, divide by their number and by ln 2 "
        "(natural log to bits)",
    )


def _bpc_bad_call(case) -> Call:
    n, shape, block_size, what = case
    ids = _gpt_char()["ids"][0][:n]
    bound = lambda g, bits_per_char: functools.partial(bits_per_char, _their_gpt_char(g))
    return Call(what, (ids if shape is None else ids.view(shape), block_size), build=bound)


# kept short: 20 s a check in the sandbox
_HELD_OUT = [(i, 300, 128, f"held-out piece {i + 1}") for i in range(3)]
_WINDOWS = [(3, 160, 16), (1, 40, 1), (2, 201, 128), (2, 2, 128), (1, 2, 1)]

BITS_PER_CHAR = Spec(
    "bits_per_char",
    [
        Clause("returns a Python float", _bpc_float, examples=[(0, 200, 128, "a held-out piece")]),
        Clause(
            f"within {BPC_BAND:.1%} of the measured loss on three held-out pieces (block_size 128)",
            _bpc_in_band,
            examples=_HELD_OUT[:1],
            also=_HELD_OUT[1:],
        ),
        Clause(
            f"respects block_size: 16 and 1 (more, shorter windows), 128 on 201 tokens (a short last window), and "
            f"the smallest text, 2 tokens (within {BPC_BAND:.1%})",
            _bpc_in_band,
            examples=[(*_WINDOWS[3], "a held-out piece")],
            also=[(*w, "a held-out piece") for i, w in enumerate(_WINDOWS) if i != 3],
        ),
        raises(
            _bpc_bad_call,
            examples=[(1, None, 128, "ids of 1 token"), (20, None, 0, "block_size=0")],
            also=[
                (20, (2, 10), 128, "ids of shape (2, 10)"),
                (20, None, -1, "block_size=-1"),
                (20, None, True, "block_size=True"),
            ],
            fix="say what was expected and what came",
            text="raises ValueError for ids of fewer than 2 tokens, ids that are not 1-D, or block_size < 1",
        ),
    ],
)
check_bits_per_char, grade_bits_per_char = BITS_PER_CHAR.graders()


# =========================================================================== stretch: min-p

_RELATIVE_HINT = (
    "min-p compares each probability with p_base times the *top* probability of its row "
    "(probs < p_base * probs.amax(dim=-1, keepdim=True)), not with p_base itself"
)
_PROBS_HINT = (
    "min-p compares probabilities (the softmax of the logits), not the logits themselves: a logit can be "
    "negative, and p_base * max logit is no probability"
)
_TIED_HINT = (
    "a token whose probability equals the threshold is kept (drop probs < threshold, not <=): with "
    "p_base = 1 the most likely token must survive"
)
_ROW_HINT = "take the top probability of each row (amax(dim=-1, keepdim=True)), not of the whole tensor"
_KEEP_HINT = "keep the tokens at or above the threshold and drop those below it, not the other way round"


def _min_p_mistakes(x: torch.Tensor, p: float):
    inf = float("-inf")
    probs = F.softmax(x, dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    out = [
        (x.masked_fill(probs <= p * top, inf), _TIED_HINT),
        (x.masked_fill(probs < p, inf), _RELATIVE_HINT),
        (x.masked_fill(x < p * x.amax(dim=-1, keepdim=True), inf), _PROBS_HINT),
        (x.masked_fill(probs >= p * top, inf), _KEEP_HINT),
    ]
    if x.dim() > 1:
        out.append((x.masked_fill(probs < p * probs.amax(), inf), _ROW_HINT))
    return out


def _min_p_margin(x: torch.Tensor, p: float) -> float:
    """How close, relative to the threshold, some token's probability comes to ``p * top`` (float64): a drawn
    case closer than float32 rounding can decide is skipped (p = 0 has no such token)."""
    probs = F.softmax(x.double(), dim=-1)
    threshold = p * probs.amax(dim=-1, keepdim=True)
    if p == 0.0:
        return math.inf
    near = (probs - threshold).abs() / threshold
    return float(near.masked_fill(probs == probs.amax(dim=-1, keepdim=True), math.inf).min())


_FILTERS["min_p_filter"] = (
    dec.min_p_filter,
    _min_p_mistakes,
    lambda x, p: _min_p_margin(x, p) > 1e-4,
    " (the tokens whose probability is at least p_base times the top probability)",
)
_P_BASES = st.sampled_from([0.01, 0.05, 0.1, 0.2, 0.35, 0.5, 0.8])


def _min_p_rows(g: Grader, fn, case) -> None:
    """A worked example of one row or of several (their hint says each row has its own threshold)."""
    _filtered("min_p_filter", g, fn, case, f" ({_ROW_HINT})" if len(case[1]) > 1 else "")


def _min_p_logits(g: Grader, fn, shift: float) -> None:
    x = torch.tensor([[0.1, 0.4, 0.3, 0.2]], dtype=torch.float64).log() + shift
    _filtered("min_p_filter", g, fn, (x, 0.6), where=f"min_p_filter(log [0.1, 0.4, 0.3, 0.2] + {shift}, 0.6)")


def _min_p_ends(g: Grader, fn, case) -> None:
    """A worked example, or drawn logits at p_base = 0 (every token kept) and at 1 (no case skipped)."""
    if _is_worked(case):
        return _filtered("min_p_filter", g, fn, case, f" ({_TIED_HINT})" if case[2] == 1.0 else "")
    lead, V, seed = case
    x = tensor(seed, *lead, V)
    for p, expected in ((0.0, x.clone()), (1.0, dec.min_p_filter(x, 1.0))):
        what = ": with p_base = 0 every token is kept" if p == 0.0 else f" ({_TIED_HINT})"
        where = _filter_input("min_p_filter", (x, p))[2]
        _filter_call(g, fn, where, x, p, expected, _min_p_mistakes(x, p), what)


MIN_P = Spec(
    "min_p_filter",
    [
        _filter_shape("min_p_filter", "minp.shape", 0.1),
        Clause(
            "keeps the tokens whose probability is at least p_base times the top probability, any shape",
            functools.partial(_filtered, "min_p_filter"),
            st.tuples(_LEADING, st.integers(1, 12), _P_BASES, _DTYPES, _SCALES, SEEDS),
            key="minp.values",
            budget="wider",
            examples=[((3,), 8, 0.2, torch.float64, 2.0, 1), ("log", ((0.5, 0.3, 0.15, 0.05),), 0.2)],
        ),
        Clause(
            "the threshold follows the top probability: a flat row keeps many tokens, a peaked row few",
            _min_p_rows,
            examples=[
                # flat: threshold 0.15 keeps all four (0.5 keeps none)
                ("log", ((0.3, 0.25, 0.25, 0.2),), 0.5),
                ("log", ((0.3, 0.25, 0.25, 0.2), (0.02, 0.9, 0.05, 0.03)), 0.2),  # a threshold per row
            ],
            also=[
                ("log", ((0.02, 0.9, 0.05, 0.03),), 0.05),  # peaked: threshold 0.045 keeps 0.9 and 0.05
                ("log", ((0.1, 0.4, 0.3, 0.2),), 0.6),  # threshold 0.24 keeps 0.4 and 0.3
            ],
        ),
        Clause(
            "compares probabilities, not logits (logits of either sign, shifted by a constant)",
            _min_p_logits,
            examples=[-5.0],
            also=[0.0, 3.0],
        ),
        Clause(
            "p_base = 0 keeps every token; p_base = 1 keeps the most likely token and those tied with it",
            _min_p_ends,
            st.tuples(_LEADING, st.integers(1, 10), SEEDS),
            key="minp.ends",
            budget="small",
            examples=[((2,), 5, 3), ("log", ((0.2, 0.5, 0.3),), 0.0), ("log", ((0.2, 0.5, 0.3),), 1.0)],
            also=[("x64", ((1.0, 2.0, 2.0, 0.0),), 1.0)],
        ),
        Clause(
            "logits already at -inf (after top-k) stay -inf: they have probability 0",
            functools.partial(_composed, "min_p_filter", ""),
            st.tuples(st.integers(3, 12), st.integers(1, 6), _P_BASES, SEEDS),
            key="minp.compose",
            budget="some",
            examples=[(8, 3, 0.1, 4)],
        ),
        _filter_unchanged("min_p_filter", 2.0, "minp.inplace", _P_BASES, 0.5),
        new_tensor(
            functools.partial(_filter_arg_call, "min_p_filter", 2.0),
            examples=[((2,), 5, 0.0, 0), ((), 3, 0.0, 1), ((2, 2), 6, 0.3, 2)],
            text="returns a new tensor, never the logits themselves, also when p_base = 0 keeps every token",
        ),
        raises(
            functools.partial(_filter_bad_call, "p_base"),
            examples=[(5, -0.1, 7), (5, 1.5, 7)],
            also=[(5, p, 7) for p in (-1.0, 1.0001, 2.0)],
            fix="p_base must be in [0, 1]",
            text="p_base outside [0, 1] raises ValueError",
        ),
    ],
)
check_min_p_filter, grade_min_p_filter = MIN_P.graders()

"""Checks for the appendix exercise (transformer arithmetic).

Each graded part is a :class:`~coursekit.grading.spec.Spec`: one :class:`~coursekit.grading.spec.Clause`
per promise of its text and docstring, stated once. ``check_*`` (public) runs each clause's fixed
examples (a worked example of the text where there is one); ``grade_*`` (hidden) runs the same clauses
on published shapes and on shapes drawn across the allowed inputs (one to several layers and heads,
grouped-query attention with one or more key/value heads, explicit and default widths, every precision
and optimizer, any number of bits), against :mod:`coursekit.arithmetic` (whose formulas the course's
tests compare with real modules, real caches, real optimizer states and torch's FLOP counter).
Parameter counts must be exact integers; the other answers are compared at float64 precision
(:func:`~coursekit.grading.core.close`). Every promised ``ValueError`` is provoked: each argument at
zero, negative and (where a whole number is needed) fractional values, and the divisibility and range
rules; its message must name the argument or give the values (so these clauses test more than
:func:`~coursekit.grading.spec.raises`, which checks the type alone). Before the generic "expected ..."
hint, each check computes the answers of the usual mistakes (the factor 2 of keys and values, bits for
bytes, GB for GiB, biases and norms forgotten, ``2 N D`` for ``6 N D`` ...) and names the one the
student's number equals. The experiment is graded in its band and, as a
:func:`~coursekit.grading.spec.procedure`, exactly.

Over 500 lines: one clause per promise of the exercise text for each graded part, with the inputs that
provoke it and the common mistakes each hint names, and three predictions; splitting it would scatter
one exercise's specification over several files.
"""

from __future__ import annotations

import inspect
import math
import numbers
from functools import partial

import numpy as np
import torch
from hypothesis import strategies as st
from torch import nn

from coursekit import arithmetic as ref
from coursekit import gpt
from coursekit.grading.core import Grader, close, describe, is_tensor, raise_unless_student_error, said
from coursekit.grading.questions import Prediction, expect_in_band
from coursekit.grading.spec import Call, Clause, Spec, procedure
from coursekit.multihead import MultiHeadAttention

#: the graded parts, by the names of their entry points ``check_<part>`` and ``grade_<part>``
_PARTS = ("decoder_params", "training_memory", "kv_cache", "training_days", "predict_adam_bytes")
_PARTS += ("predict_gpt2_xl_kv_mib", "predict_batched_decode", "flops_ratio", "chinchilla_optimal")
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]


def _number(x) -> float | None:
    """``x`` as a float if it is a plain number (int, float, numpy scalar or one-element tensor)."""
    if isinstance(x, bool) or isinstance(x, np.bool_):
        return None
    if isinstance(x, numbers.Real):
        return float(x)
    if isinstance(x, np.ndarray) and x.size == 1 and np.issubdtype(x.dtype, np.number):
        return float(x.reshape(()))
    if is_tensor(x) and x.numel() == 1 and x.dtype != torch.bool and not x.is_complex():
        return float(x.reshape(()))
    return None


def _fmt(x: float) -> str:
    """Whole numbers with thousands separators (parameter counts), the rest with 7 significant digits."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.7g}"


def _close(a: float, b: float) -> bool:
    """``a`` agrees with ``b`` at float64 precision (the tolerances of :data:`~coursekit.grading.core.TOLERANCES`)."""
    return close(torch.tensor(float(a), dtype=torch.float64), torch.tensor(float(b), dtype=torch.float64))


def _expect_value(g: Grader, got, expected: float, call: str, mistakes=(), exact: bool = False) -> None:
    """Fail unless ``got`` is ``expected`` (an int equal to it with ``exact``, else a number that agrees at
    float64 precision); name the mistakes it equals.

    ``mistakes`` are ``(value, hint)`` pairs: the answers of known wrong formulas (a mistake
    that happens to give the right answer on this input is skipped). When several give the
    student's number, every one is named.
    """
    value = _number(got)
    if value is None:
        g.fail(f"{call} should return a number, got {describe(got)}")
    if not math.isfinite(value):
        g.fail(f"{call} returned {value}, expected {_fmt(expected)}")
    same = (lambda a, b: a == b) if exact else _close
    if same(value, expected):
        if exact and not (isinstance(got, numbers.Integral) and not isinstance(got, (bool, np.bool_))):
            g.fail(
                f"{call} returned {got!r}: return an int (the count is a whole number; use // for divisions)"
            )
        return
    matching = (hint for wrong, hint in mistakes if not same(wrong, expected) and same(value, wrong))
    hints = list(dict.fromkeys(matching))  # each hint once, in order
    if hints:
        g.fail(f"{call} = {_fmt(value)}, expected {_fmt(expected)}: " + "; or: ".join(hints))
    g.fail(f"{call} = {_fmt(value)}, expected {_fmt(expected)}")


def _call(name: str, *args, **kwargs) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _expect_error(
    g: Grader, fn, args: tuple, kwargs: dict, name: str, must_name: tuple[str, ...], why: str
) -> None:
    """``fn(*args, **kwargs)`` must raise a ValueError whose message holds every string of ``must_name``."""
    call = _call(name, *args, **kwargs)
    try:
        got = fn(*args, **kwargs)
    except ValueError as e:
        missing = [s for s in must_name if s not in said(e)]
        g.expect(
            not missing,
            f"the ValueError of {call} should name {', '.join(map(repr, missing))} ({why}), it says: {e}",
        )
        return
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(
            f"{call} raised {type(e).__name__.removeprefix('Student')} ({e}); raise a ValueError instead ({why})"
        )
    g.fail(f"{call} returned {got!r}; raise a ValueError instead ({why})")


def _student(g: Grader, call: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; an exception of the student's code fails the check: "<call> raised X: msg"."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        raise_unless_student_error(e)
        g.fail(f"{call} raised {type(e).__name__.removeprefix('Student')}: {e}")


def _split(case: tuple) -> tuple[tuple, dict]:
    """A fixed input: the positional arguments alone, or ``(arguments, keyword arguments)``."""
    return case if len(case) == 2 and isinstance(case[0], tuple) and isinstance(case[1], dict) else (case, {})


def _check_value(g: Grader, fn, case: tuple, reference, mistakes, exact: bool = False) -> None:
    """``fn(*args, **kwargs)`` (:func:`_split`) gives ``reference``'s answer (:func:`_expect_value`);
    ``mistakes`` takes every argument of ``reference`` (its defaults filled in) by position."""
    args, kwargs = _split(case)
    call = _call(reference.__name__, *args, **kwargs)
    got = _student(g, call, fn, *args, **kwargs)
    full = inspect.signature(reference).bind(*args, **kwargs)
    full.apply_defaults()
    _expect_value(g, got, reference(*args, **kwargs), call, mistakes(*full.args), exact)


def _divide_cases(name: str, *cases: tuple[tuple, tuple[str, ...]], why: str | None = None) -> list:
    """The inputs of :func:`_divides`: ``(args, the values the message must give)`` for ``name``; ``why``
    what the message must say (by default :data:`_DIVIDE`)."""
    return [(name, args, shown, why or _DIVIDE) for args, shown in cases]


def _bad_cases(name: str, good: dict, integers: tuple[str, ...], numbers_: tuple[str, ...] = ()) -> list:
    """Each argument in turn at 0 and -1 (and 2.5 where a whole number is needed): the inputs of
    :func:`_bad_value`."""
    return [
        (name, good, arg, bad, "a positive integer" if arg in integers else "a positive number")
        for arg in integers + numbers_
        for bad in (0, -1) + ((2.5,) if arg in integers else ())
    ]


def _bad_value(g: Grader, fn, case: tuple) -> None:
    """``fn(**good)`` with one argument at a bad value must raise a ValueError naming it."""
    name, good, arg, bad, kind = case
    _expect_error(g, fn, (), good | {arg: bad}, name, (arg,), f"{arg} must be {kind}: use require_positive")


def _divides(g: Grader, fn, case: tuple) -> None:
    """``fn(*args)`` must raise a ValueError giving the values that do not divide."""
    name, args, shown, why = case
    _expect_error(g, fn, args, {}, name, shown, why)


_DIVIDE = "say which of d_model, n_heads and n_kv_heads do not divide, with their values"


def _gqa_shapes():
    """(H, H_kv, D): query heads, a divisor of them for key/value heads, and a head width."""
    return st.integers(1, 8).flatmap(
        lambda h: st.tuples(
            st.just(h), st.sampled_from([k for k in range(1, h + 1) if h % k == 0]), st.integers(1, 8)
        )
    )


# =========================================================================== part 1: decoder_params

_RULE_OF_THUMB = (
    "that is the rule of thumb V C + 12 L C^2: count every parameter exactly (position embeddings, "
    "biases, layer norms, the true key/value width)"
)
_NO_BIASES = (
    "the biases are missing: each linear layer here has one (the q, k and v projections, the output "
    "projection and both feed-forward layers), one value per output"
)
_NO_NORMS = (
    "the layer norms are missing: two per layer and one final norm, each with a scale and a shift "
    "of d_model values (2 d_model)"
)
_NO_BIASES_NORMS = (
    "the biases and the layer norms are missing: "
    + _NO_BIASES.split(": ", 1)[1]
    + "; and two layer norms per layer plus a final one, 2 d_model each"
)
_ONE_VECTOR_NORMS = (
    "a layer norm has two vectors of d_model values, a scale and a shift: 2 d_model, not d_model"
)
_IGNORED_GQA = (
    "the key and value projections have n_kv_heads * d_head outputs each (d_head = d_model // n_heads), "
    "not d_model: with grouped-query attention only the query and output projections are d_model x d_model"
)
_KV_WIDTH = (
    "the key/value width is n_kv_heads * d_head with d_head = d_model // n_heads, not n_kv_heads * d_model"
)
_TIED_TWICE = "with tied=True the output layer reuses the token embedding matrix: it adds no parameters"
_UNTIED_MISSING = (
    "with tied=False the output layer is a separate vocab_size x d_model matrix (no bias): add it"
)
_UNTIED_BIAS = "the untied output layer has no bias: vocab_size x d_model, nothing more"
_IGNORED_D_FF = "use d_ff for the feed-forward width (4 * d_model only when d_ff is None)"
_ONE_KV = "keys AND values: two projections of n_kv_heads * d_head outputs each, not one"


def _decoder_mistakes(V, T, C, L, H, H_kv=None, d_ff=None, tied=True) -> list[tuple[float, str]]:
    """The answers of the usual wrong counts, with their hints."""
    H_kv = H if H_kv is None else H_kv
    f = 4 * C if d_ff is None else d_ff
    exact = ref.decoder_params(V, T, C, L, H, H_kv, f, tied)
    kv = H_kv * (C // H)
    biases = (C + 2 * kv) + C + f + C
    norms = L * 4 * C + 2 * C
    head = 0 if tied else V * C
    wide_kv = exact + L * 2 * (C + 1) * (H_kv * C - kv)
    return [
        (V * C + 12 * L * C * C, _RULE_OF_THUMB),
        (V * C + 12 * L * C * C + head, _RULE_OF_THUMB),
        (exact - L * biases - norms, _NO_BIASES_NORMS),
        (exact - L * biases, _NO_BIASES),
        (exact - norms, _NO_NORMS),
        (exact - norms // 2, _ONE_VECTOR_NORMS),
        (exact - 2 * C, "the final layer norm (2 d_model, after the last layer) is missing"),
        (exact - T * C, "the learned position embeddings (n_positions x d_model) are missing"),
        (ref.decoder_params(V, T, C, L, H, H, f, tied), _IGNORED_GQA),
        (wide_kv, _KV_WIDTH),
        (exact - L * (C + 1) * kv, _ONE_KV),
        (exact + V * C, _TIED_TWICE if tied else "the untied output layer has no bias and is counted once"),
        (exact + V, _UNTIED_BIAS if not tied else _TIED_TWICE),
        (exact - head, _UNTIED_MISSING),
        (ref.decoder_params(V, T, C, L, H, H_kv, None, tied), _IGNORED_D_FF),
    ]


_DECODER_ARGS = ("vocab_size", "n_positions", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "tied")


#: ``decoder_params(*args, **kwargs)`` (:func:`_split`): the exact count, an int
_check_decoder = partial(_check_value, reference=ref.decoder_params, mistakes=_decoder_mistakes, exact=True)


def _decoder_cases():
    """Small decoders of every kind: (args, kwargs)."""

    def build(case):
        (H, H_kv, D), V, T, L, d_ff, tied, how = case
        values = dict(zip(_DECODER_ARGS, (V, T, H * D, L, H, H_kv, d_ff, tied)))
        positional = _DECODER_ARGS[: 5 + how]  # how many of the optional arguments go by position
        return tuple(values[n] for n in positional), {n: values[n] for n in _DECODER_ARGS[5 + how :]}

    return st.tuples(
        _gqa_shapes(),
        st.integers(1, 300),
        st.integers(1, 64),
        st.integers(1, 4),
        st.one_of(st.none(), st.integers(1, 64)),
        st.booleans(),
        st.integers(0, 3),
    ).map(build)


_GPT2 = [ref.PUBLISHED[n] for n in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")]

DECODER_PARAMS = Spec(
    "decoder_params",
    [
        Clause(
            "the exact count, an int, of the GPT-2 family (multi-head attention, tied output layer)",
            _check_decoder,
            examples=[(c.vocab_size, c.block_size, c.d_model, c.n_layers, c.n_heads) for c in _GPT2],
        ),
        Clause(
            "grouped-query attention: k and v have n_kv_heads * d_head outputs (one or several kv heads)",
            _check_decoder,
            examples=[(50257, 1024, 768, 12, 12, 4), (32000, 4096, 4096, 32, 32, 8), (1000, 64, 96, 3, 6, 1)],
        ),
        Clause(
            "an explicit feed-forward width d_ff",
            _check_decoder,
            examples=[(32000, 2048, 2048, 16, 16, 4, 5504), (500, 32, 64, 2, 4, 2, 100)],
        ),
        Clause(
            "tied=False adds a bias-free vocab_size x d_model output layer",
            _check_decoder,
            examples=[
                (32000, 4096, 4096, 32, 32, 8, 11008, False),
                ((50257, 1024, 768, 12, 12), {"tied": False}),
            ],
        ),
        Clause(
            "defaults: n_kv_heads=None is multi-head attention, d_ff=None is 4 * d_model, tied=True",
            _check_decoder,
            examples=[(1000, 128, 256, 4, 8), ((1000, 128, 256, 4, 8), {"n_kv_heads": None, "d_ff": None})],
        ),
        Clause(
            "the exact count of small decoders of every kind (drawn shapes, optional arguments by position or "
            "by name)",
            _check_decoder,
            _decoder_cases(),
            key="params.values",
            budget="widest",
            examples=[((10, 4, 6, 1, 2), {})],
        ),
        Clause(
            "a ValueError naming the values when n_heads does not divide d_model or n_kv_heads does not "
            "divide n_heads",
            _divides,
            examples=_divide_cases(
                "decoder_params",
                ((1000, 64, 100, 2, 12), ("100", "12")),
                ((1000, 64, 96, 2, 12, 5), ("12", "5")),
                ((1000, 64, 96, 2, 8, 3), ("8", "3")),
            ),
        ),
        Clause(
            "a ValueError naming the argument for a size that is not a positive whole number",
            _bad_value,
            examples=_bad_cases(
                "decoder_params",
                dict(zip(_DECODER_ARGS[:7], (1000, 64, 96, 2, 12, 4, 300))),
                _DECODER_ARGS[:7],
            ),
        ),
    ],
)
check_decoder_params, grade_decoder_params = DECODER_PARAMS.graders()


# =========================================================================== part 2: training_memory_gib

_GB = "a GiB is 2**30 bytes; you divided by 10**9, which is a GB"
_BITS = "you counted bits, not bytes (a float32 value is 4 bytes, 32 bits): divide by 8"
_NO_GRADS = "the gradients are missing: training keeps one per parameter (4 bytes in fp32, 2 in fp16/bf16)"
_NO_MASTER = (
    "the float32 master weights are missing: mixed precision keeps 16-bit weights and gradients "
    "(2 + 2 bytes) and a float32 copy of the weights (4 bytes) that the optimizer updates"
)
_FP32_GRADS = (
    "here gradients are kept in 16 bits, as the weights (ZeRO's convention: 16 bytes for mixed-precision "
    "Adam); you kept them in float32 (the 18-byte convention)"
)
_MIXED_AS_FP32 = (
    "in mixed precision (fp16/bf16) the weights and gradients are 16-bit, 2 bytes each; "
    "only the master copy and the optimizer states are float32"
)
_ONE_MOMENT = "Adam keeps two moments per parameter (m and v), 4 bytes each in float32: 8 bytes of state"
_MOMENTUM_TWO = "SGD with momentum keeps one buffer per parameter (4 bytes in float32), not two"
_MOMENTUM_NONE = "SGD with momentum keeps a momentum buffer per parameter (4 bytes in float32)"
_SGD_STATE = (
    "plain SGD keeps no optimizer state: only weights and gradients (and the master copy in mixed precision)"
)
_ADAM8_BYTES = "8-bit Adam stores each of its two moments in 8 bits = 1 byte (2 bytes of state), not 8 bytes"
_ADAM8_FP32 = "8-bit Adam stores its two moments in 8 bits, 1 byte each, not in float32"
_ADAM8_ONE = "8-bit Adam still keeps two moments (m and v), 1 byte each: 2 bytes of state"

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("sgd", "momentum", "adam", "adam8bit")
KEYS = ("weights", "gradients", "master weights", "optimizer states")


def _memory_mistakes(n: float, precision: str, optimizer: str) -> list[tuple[float, str]]:
    comp = ref.memory_per_param(precision, optimizer)
    variants = [({"gradients": 0}, _NO_GRADS)]
    if precision != "fp32":  # mixed precision
        variants += [
            ({"master weights": 0}, _NO_MASTER),
            ({"gradients": 4}, _FP32_GRADS),
            ({"weights": 4, "gradients": 4}, _MIXED_AS_FP32),
        ]
    states = {
        "adam": [(4, _ONE_MOMENT)],
        "momentum": [(8, _MOMENTUM_TWO), (0, _MOMENTUM_NONE)],
        "sgd": [(4, _SGD_STATE), (8, _SGD_STATE)],
        "adam8bit": [(16, _ADAM8_BYTES), (8, _ADAM8_FP32), (1, _ADAM8_ONE)],
    }
    variants += [({"optimizer states": s}, hint) for s, hint in states[optimizer]]
    out = [(n * sum((comp | change).values()) / 2**30, hint) for change, hint in variants]
    total = sum(comp.values())
    out += [(n * total / 1e9, _GB), (n * total * 8 / 2**30, _BITS), (n * total * 8 / 1e9, _BITS)]
    return out


def _check_memory(g: Grader, functions: tuple, case: tuple) -> None:
    """``training_memory_gib(*case)``, ``case = (n_params, *names)``."""
    _check_value(g, functions[0], case, ref.training_memory_gib, _memory_mistakes)


def _check_bytes(g: Grader, functions: tuple, case: tuple) -> None:
    """``memory_per_param(*args, **kwargs)`` (:func:`_split`): the bytes per parameter under the four keys."""
    args, kwargs = _split(case)
    call = _call("memory_per_param", *args, **kwargs)
    got = _student(g, call, functions[1], *args, **kwargs)
    expected = ref.memory_per_param(*args, **kwargs)
    g.expect(
        isinstance(got, dict) and set(got) == set(KEYS),
        f"{call} should return a dict with the keys {list(KEYS)}, got {got!r}",
    )
    wrong = {k: got[k] for k in KEYS if _number(got[k]) is None or _number(got[k]) != expected[k]}
    if wrong and kwargs.get("fp32_grads") and set(wrong) == {"gradients"} and got["gradients"] == 2:
        g.fail(f"{call} gave 2 bytes of gradients: with fp32_grads=True the gradients are float32, 4 bytes")
    g.expect(not wrong, f"{call} should be {expected}, got {got!r} (wrong: {', '.join(wrong)})")


def _memory_errors(g: Grader, functions: tuple, case: tuple) -> None:
    """A ValueError from ``training_memory_gib`` (``which`` 0) or ``memory_per_param`` (1, when the test cell
    passes it) for ``args``, naming ``shown``."""
    which, args, shown, why = case
    if functions[which] is not None:
        _expect_error(g, functions[which], args, {}, _MEMORY_NAMES[which], shown, why)


_MEMORY_NAMES = ("training_memory_gib", "memory_per_param")
_BAD_NAMES = [
    (which, lead + names, accepted, f"list the accepted {what}")
    for which, lead in ((0, (1e9,)), (1, ()))
    for names, accepted, what in (
        (("fp8", "adam"), PRECISIONS, "precisions"),
        (("fp32", "adagrad"), OPTIMIZERS, "optimizers"),
    )
]
_N_PARAMS = "n_params must be a positive number: use require_positive"

TRAINING_MEMORY = Spec(
    "training_memory_gib",
    [
        Clause(
            "the result is in GiB (2**30 bytes); the defaults are fp32 and Adam",
            _check_memory,
            examples=[(2**30, "fp32", "sgd"), (1e9, "fp32", "adam"), (1e9,), (3e8, "bf16")],
        ),
        Clause(
            "weights and gradients: plain SGD, fp32 and mixed precision",
            _check_memory,
            examples=[(3e9, p, "sgd") for p in PRECISIONS],
        ),
        Clause(
            "SGD with momentum keeps one float32 buffer",
            _check_memory,
            examples=[(1.3e8, p, "momentum") for p in PRECISIONS],
        ),
        Clause(
            "Adam keeps two float32 moments: 16 bytes per parameter in mixed precision and in fp32",
            _check_memory,
            examples=[(7e9, p, "adam") for p in ("bf16", "fp16", "fp32")],
        ),
        Clause(
            "8-bit Adam keeps two 1-byte moments",
            _check_memory,
            examples=[(7e9, p, "adam8bit") for p in PRECISIONS],
        ),
        Clause(
            "any positive number of parameters, every precision and optimizer (drawn)",
            _check_memory,
            st.tuples(
                st.one_of(st.integers(1, 10**12), st.floats(0.5, 1e12)),
                st.sampled_from(PRECISIONS),
                st.sampled_from(OPTIMIZERS),
            ),
            key="memory.values",
            budget="wide",
            first=(1, "fp32", "sgd"),
            examples=[(1e9, "fp32", "adam"), (1e9, "bf16", "adam")],  # the text's: 16 bytes, 14.90 GiB
        ),
        Clause(
            "unknown precision or optimizer names raise a ValueError that lists the accepted names; "
            "n_params must be a positive number",
            _memory_errors,
            examples=_BAD_NAMES + [(0, (bad, "fp32", "adam"), ("n_params",), _N_PARAMS) for bad in (0, -1e9)],
        ),
        Clause(
            "memory_per_param: bytes per parameter by what they hold, for every precision and optimizer, "
            "with and without fp32_grads (default False), and its defaults (fp32, Adam)",
            _check_bytes,
            examples=[(), ("bf16",)]
            + [
                case
                for p in PRECISIONS
                for o in OPTIMIZERS
                for case in ((p, o), ((p, o), {"fp32_grads": True}), (p, o, False))
            ],
        ),
    ],
)
#: the same part when the test cell passes training_memory_gib alone: memory_per_param is not graded
_TRAINING_MEMORY_ALONE = Spec("training_memory_gib", TRAINING_MEMORY.clauses[:-1])


def check_training_memory(training_memory_gib, memory_per_param=None) -> None:
    """Public checks of ``training_memory_gib`` and, when the test cell passes it, ``memory_per_param``."""
    spec = _TRAINING_MEMORY_ALONE if memory_per_param is None else TRAINING_MEMORY
    spec.check((training_memory_gib, memory_per_param))


def grade_training_memory(training_memory_gib, memory_per_param=None) -> None:
    """Hidden checks of ``training_memory_gib(n_params, precision, optimizer)`` and, when the test cell passes
    it, ``memory_per_param(precision, optimizer, fp32_grads)``."""
    spec = _TRAINING_MEMORY_ALONE if memory_per_param is None else TRAINING_MEMORY
    spec.grade((training_memory_gib, memory_per_param))


check_training_memory.spec = grade_training_memory.spec = TRAINING_MEMORY  # type: ignore[attr-defined]


# =========================================================================== part 3: kv_cache_gib

_NO_FACTOR_2 = (
    "the factor 2 is missing: every layer caches a key AND a value vector per token and key/value head"
)
_N_HEADS = (
    "with grouped-query attention only the n_kv_heads key/value heads are cached, not the n_heads query heads"
)
_D_MODEL = "each cached head has width d_head = d_model // n_heads, not d_model"
_WHOLE_BYTES = (
    "do not round: with bits / 8 bytes per value the cache is a fraction of a byte per value (use /, not //)"
)

_KV_ARGS = ("n_layers", "n_heads", "n_kv_heads", "d_model", "seq_len", "batch", "bits")


def _kv_mistakes(L, H, H_kv, C, T, B=1, bits=16) -> list[tuple[float, str]]:
    right = ref.kv_cache_gib(L, H, H_kv, C, T, B, bits)
    n_bytes = right * 2**30
    out = [
        (right / 2, _NO_FACTOR_2),
        (right * H / H_kv, _N_HEADS),
        (right * H, _D_MODEL),
        (right * 8, "bits is the number of bits per cached value: divide by 8 to get bytes"),
        (right * 16 / bits, "use the bits argument (bits / 8 bytes per value), not always 2 bytes"),
        (n_bytes / 1e9, _GB),
        (n_bytes / 2**20, "a GiB is 2**30 bytes; you divided by 2**20 (a MiB)"),
        (right / B, "multiply by the batch: every sequence has its own cache"),
        ((2 * L * H_kv * (C // H) * T * B * bits // 8) / 2**30, _WHOLE_BYTES),
        (float(int(n_bytes) // 2**30), _WHOLE_BYTES),
    ]
    if H_kv != H:
        out.append((right * H * H / H_kv, _N_HEADS + "; and " + _D_MODEL))
    return out


#: ``kv_cache_gib(*args, **kwargs)`` (:func:`_split`)
_check_kv = partial(_check_value, reference=ref.kv_cache_gib, mistakes=_kv_mistakes)


def _check_kv_drawn(g: Grader, kv_cache_gib, case: tuple) -> None:
    (H, H_kv, D), L, T, B, bits = case
    _check_kv(g, kv_cache_gib, (L, H, H_kv, H * D, T, B, bits))


KV_CACHE = Spec(
    "kv_cache_gib",
    [
        Clause(
            "multi-head attention (n_kv_heads = n_heads), 16 bits",
            _check_kv,
            examples=[(12, 12, 12, 768, 1024, 1, 16), (48, 25, 25, 1600, 1024, 1, 16)],
        ),
        Clause(
            "grouped-query attention caches n_kv_heads heads of width d_model // n_heads",
            _check_kv,
            examples=[
                (32, 32, 8, 4096, 8192, 1, 16),
                (80, 64, 8, 8192, 4096, 1, 16),
                (28, 28, 4, 3584, 32768, 1, 16),
            ],
        ),
        Clause("the batch multiplies the cache", _check_kv, examples=[(32, 32, 8, 4096, 2048, 16, 16)]),
        Clause(
            "bits per value: a quantized cache (8 and 4 bits), and any whole number of bits",
            _check_kv,
            examples=[
                (32, 32, 8, 4096, 8192, 1, 8),
                (32, 32, 4, 4096, 100000, 2, 4),
                (1, 1, 1, 1, 1, 1, 3),
                (3, 4, 2, 12, 7, 1, 1),
            ],
        ),
        Clause(
            "multi-query attention (n_kv_heads = 1) and the defaults batch=1, bits=16",
            _check_kv,
            examples=[
                (24, 16, 1, 2048, 2048),
                ((24, 16, 2, 2048, 2048), {"batch": 3}),
                ((24, 16, 4, 2048, 2048), {"bits": 8}),
            ],
        ),
        Clause(
            "drawn shapes: layers, heads, key/value heads, widths, lengths, batches and bits",
            _check_kv_drawn,
            st.tuples(
                _gqa_shapes(), st.integers(1, 6), st.integers(1, 5000), st.integers(1, 8), st.integers(1, 32)
            ),
            key="kv.values",
            budget="widest",
            first=((2, 1, 4), 1, 1, 1, 16),
            # the text's check: a Llama-3-8B shape holds 1 GiB for 8192 tokens in 16 bits
            examples=[((32, 8, 128), 32, 8192, 1, 16), ((2, 1, 4), 1, 1, 1, 16)],
        ),
        Clause(
            "a ValueError naming the values when n_heads does not divide d_model or n_kv_heads does not "
            "divide n_heads",
            _divides,
            examples=_divide_cases(
                "kv_cache_gib",
                ((2, 12, 12, 100, 64), ("100", "12")),
                ((2, 12, 5, 96, 64), ("12", "5")),
                ((2, 8, 3, 96, 64), ("8", "3")),
            ),
        ),
        Clause(
            "a ValueError naming the argument for a value that is not a positive whole number",
            _bad_value,
            examples=_bad_cases("kv_cache_gib", dict(zip(_KV_ARGS, (2, 12, 4, 96, 64, 2, 8))), _KV_ARGS),
        ),
    ],
)
check_kv_cache, grade_kv_cache = KV_CACHE.graders()


# =========================================================================== part 4: training_days

_2ND = (
    "training costs 6 N D FLOPs (2 N D in the forward pass, 4 N D in the backward pass); "
    "2 N D is the forward pass alone"
)
_NO_MFU = "divide by the MFU as well: the GPUs deliver only mfu x their peak"
_MFU_TIMES = "the achieved throughput is n_gpus * peak * mfu: divide the FLOPs by it (you multiplied by mfu)"
_NO_GPUS = "divide by the number of GPUs: they share the work"

_DAYS_ARGS = ("n_params", "n_tokens", "n_gpus", "gpu_tflops", "mfu")


def _days_mistakes(N, D, n_gpus, tflops, mfu) -> list[tuple[float, str]]:
    right = ref.training_days(N, D, n_gpus, tflops, mfu)
    return [
        (right / 3, _2ND),
        (right * mfu, _NO_MFU),
        (right * mfu * mfu, _MFU_TIMES),
        (right * 24, "return days: divide the seconds by 86400 (24 * 3600); you returned hours"),
        (right * 86400, "return days: divide the seconds by 86400 (24 * 3600)"),
        (right * 1440, "return days: divide the seconds by 86400 (24 * 3600); you returned minutes"),
        (right * 1e12, "gpu_tflops is in TFLOP/s: multiply by 10**12 to get FLOP/s"),
        (right * n_gpus, _NO_GPUS),
        (right / 3 * mfu, _2ND + "; and " + _NO_MFU),
    ]


_check_days = partial(_check_value, reference=ref.training_days, mistakes=_days_mistakes)


def _days_halve(g: Grader, training_days, case: tuple) -> None:
    """Twice the GPUs (``case[2]`` and twice that) take half the time."""
    one = _number(training_days(*case))
    two = _number(training_days(*case[:2], 2 * case[2], *case[3:]))
    g.expect(
        one is not None and two is not None and _close(one, 2 * two),
        f"{case[2]} GPUs gave {one} days and {2 * case[2]} GPUs {two}: the time must halve when the GPUs double "
        "(" + _NO_GPUS + ")",
    )


def _days_scaling(g: Grader, training_days, case: tuple) -> None:
    (_days_halve if case[0] == "halve" else _check_days)(g, training_days, case[1])


def _days_errors(g: Grader, training_days, case: tuple) -> None:
    """mfu above 1 (a ValueError giving the value), or a bad value of one argument (:func:`_bad_value`)."""
    if len(case) == 2:
        why = "mfu is a fraction of the peak, in (0, 1]: say so and give the value"
        _expect_error(
            g, training_days, (), _DAYS_GOOD | {"mfu": case[1]}, "training_days", (str(case[1]),), why
        )
    else:
        _bad_value(g, training_days, case)


_DAYS_GOOD = dict(zip(_DAYS_ARGS, (1e9, 2e10, 8, 312.0, 0.5)))

TRAINING_DAYS = Spec(
    "training_days",
    [
        Clause(
            "published runs: GPT-3 (175B parameters, 300B tokens, 1024 A100s at 40% MFU) and Chinchilla",
            _check_days,
            examples=[(175e9, 300e9, 1024, 312.0, 0.4), (70e9, 1.4e12, 2048, 989.0, 0.35)],
        ),
        Clause(
            "small runs: the units (TFLOP/s, seconds to days)",
            _check_days,
            examples=[(1.24e8, 1e10, 1, 125.0, 0.3), (1e9, 2e10, 8, 312.0, 0.45)],
        ),
        Clause(
            "twice the GPUs take half the time; mfu=1 (the peak) is allowed",
            _days_scaling,
            examples=[
                ("halve", (7e9, 2e12, 256, 989.0, 0.4)),
                ("value", (1e9, 2e10, 8, 312.0, 1.0)),
                ("value", (3e9, 1e11, 64, 400.0, 1)),
            ],
        ),
        Clause(
            "drawn runs: any positive sizes, GPU counts, peaks and 0 < mfu <= 1",
            _check_days,
            st.tuples(
                st.floats(1e3, 1e12),
                st.floats(1e3, 1e13),
                st.integers(1, 4096),
                st.floats(1.0, 2000.0),
                st.one_of(st.floats(0.01, 1.0), st.just(1.0)),
            ),
            key="days.values",
            budget="wide",
            examples=[(1e9, 2e10, 8, 312.0, 0.5)],  # the text's check: 1.11 days
        ),
        Clause(
            "a ValueError unless 0 < mfu <= 1, and for a size, GPU count or peak that is not positive",
            _days_errors,
            examples=[("mfu", mfu) for mfu in (1.5, 2.0, 1.0001)]
            + _bad_cases("training_days", _DAYS_GOOD, (), _DAYS_ARGS),
        ),
    ],
)
check_training_days, grade_training_days = TRAINING_DAYS.graders()


# =========================================================================== predict, then check


def _gpt2_xl_kv_mib() -> float:
    c = ref.GPT_PRESETS["gpt2-xl"]
    return ref.kv_cache_gib(c.n_layers, c.n_heads, c.n_heads, c.d_model, c.block_size, bits=16) * 1024


def _pure_bf16_adam_bytes() -> float:
    """Bytes per parameter that PyTorch allocates to train a small model cast to bf16 with ``torch.optim.Adam``
    on its own parameters (no master copy): weights, gradients and Adam's state after one step, counted as
    the appendix counts fp32 training (Adam's one-number step counters left out)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to(torch.bfloat16)
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(4, 32, dtype=torch.bfloat16)).float().square().sum().backward()
        opt.step()
    held = sum(p.nbytes + p.grad.nbytes for p in model.parameters())
    held += sum(
        t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.numel() > 1
    )
    return held / sum(p.numel() for p in model.parameters())


ADAM_BYTES = Prediction(
    name="predict_adam_bytes",
    question="A model cast to bf16 (model.to(torch.bfloat16)) trains with torch.optim.Adam on its own parameters, "
    "with no float32 master copy; Adam makes its state with torch.zeros_like(param). How many bytes per "
    "parameter do the weights, gradients and optimizer state take?",
    tests="training memory: which tensors training keeps per parameter, and in which precision each one is",
    measure=_pure_bf16_adam_bytes,
    explanation="Adam's two moments are made like the parameter they follow, so here they are bf16: weights (2), "
    "gradients (2) and the moments m and v (2 + 2) make {truth} bytes, half the 16 of mixed-precision Adam. "
    "16 counts the float32 master copy and float32 moments of the mixed-precision recipe, which this setup does "
    "not have; 12 keeps the moments in float32; 4 forgets the optimizer's state. The saving has a price: bf16 "
    "keeps 8 significant bits, so an update smaller than about 1/256 of a weight can round away entirely, and "
    "with the small learning rates of late training many of Adam's steps (about lr per weight) are that small. "
    "That is why mixed precision updates a float32 master copy (Micikevicius et al., 2018).",
)

GPT2_XL_KV_MIB = Prediction(
    name="predict_gpt2_xl_kv_mib",
    question="GPT-2 XL (48 layers, d_model 1600, 25 heads, multi-head attention) caches keys and values in "
    "float16 for one sequence of its full context, 1,024 tokens: how many MiB is its KV cache?",
    tests="the KV cache: 2 x layers x tokens x d_model x bytes per value, linear in the context T",
    measure=_gpt2_xl_kv_mib,
    explanation="Per token each layer caches a key and a value of d_model = 1600 values (25 heads of 64): "
    "2 * 48 * 1600 = 153,600 values, 300 KiB in float16. For 1,024 tokens that is {truth} MiB, growing "
    "linearly with T: 8 sequences of 1,024 tokens already take 2.3 GiB, about 80% of the 2.9 GiB of "
    "GPT-2 XL's float16 weights.",
    rel=0.02,  # MB for MiB is 4.9% off: the band must be narrower
    mistakes=(
        ("MB instead of MiB", lambda mib: mib * 2**20 / 1e6),
        ("float32 (4 bytes) instead of float16", lambda mib: 2 * mib),
        ("keys only, no values", lambda mib: mib / 2),
    ),
)

#: the choices of BATCHED_DECODE: FLOPs per byte of a decode step
_DECODE_CHOICES = {"a": 20.0, "b": 40.0, "c": 80.0, "d": 300.0}

#: the key/value heads of BATCHED_DECODE's grouped-query variant of GPT_7B (32 query heads)
_DECODE_KV_HEADS = 8


def _batched_decode() -> str:
    """Which choice the arithmetic intensity of a bf16 decode step of ``GPT_7B`` with 8 key/value heads, at
    batch 64 and a context of 1,024 tokens, is nearest to (on a log scale). ``decode_step_cost`` prices the
    multi-head step; from it go the key and value projection weights that grouped-query attention drops
    (counted on Chapter 2's ``MultiHeadAttention`` built on the ``meta`` device), once in the FLOPs per token
    and once in the bytes, and the multi-head cache is swapped for the grouped one (Chapter 7's ``KVCache``
    on ``meta``, the ``S + 1`` positions ``decode_step_cost`` reads and writes)."""
    c, B, S = ref.GPT_7B, 64, 1024
    mha = ref.decode_step_cost(c, B, S, dtype_bytes=2)
    with torch.device("meta"):
        attn = {
            h: MultiHeadAttention(c.d_model, c.n_heads, n_kv_heads=h, bias=False)
            for h in (c.n_heads, _DECODE_KV_HEADS)
        }
    dropped = c.n_layers * (
        sum(p.numel() for p in attn[c.n_heads].parameters())
        - sum(p.numel() for p in attn[_DECODE_KV_HEADS].parameters())
    )

    def cache_bytes(n_kv: int) -> int:
        layers = [gpt.LayerCache(B, n_kv, S + 1, c.d_head, torch.bfloat16, "meta") for _ in range(c.n_layers)]
        return gpt.KVCache(layers).nbytes()

    flops = mha.flops - 2 * B * dropped
    moved = mha.bytes_moved - 2 * dropped - cache_bytes(c.n_heads) + cache_bytes(_DECODE_KV_HEADS)
    return min(_DECODE_CHOICES, key=lambda k: abs(math.log(flops / moved / _DECODE_CHOICES[k])))


BATCHED_DECODE = Prediction(
    name="predict_batched_decode",
    question="The appendix's 7B-class shape (GPT_7B) with grouped-query attention, 8 key/value heads for its 32 "
    "query heads, decodes in bf16 with 1,024 tokens of context per sequence. At batch 64, about how many FLOPs "
    "per byte does a decode step do?",
    tests="decode's arithmetic intensity: batching shares the weights' bytes, not the KV cache's; GQA shrinks "
    "only the cache's",
    measure=_batched_decode,
    explanation="Answer {truth}. A decode step reads every weight once for all 64 sequences: 11.6 GB in bf16 "
    "(the key and value projections shrink to a quarter, the rest does not). Each sequence reads its own cache, "
    "2 * 32 layers * 1,025 positions * 8 heads * 128 * 2 bytes = 134 MB, a quarter of multi-head attention's "
    "0.54 GB, so the 64 sequences read 8.6 GB. 777 GFLOP over 20.2 GB is about 38 FLOPs per byte. With 32 "
    "key/value heads the same step does about 18.5: the 64 caches then read 34 GB, more than the weights. It "
    "does not rise four-fold to 80, because the weights' bytes, which GQA barely changes, are now more than "
    "half of the traffic. What rises about four-fold is the ceiling, one sequence's FLOPs over its cache "
    "bytes, 12.1 GFLOP / 0.134 GB = 90, which large batches approach; it is still far below an H100's ridge "
    "near 300, so the step stays memory-bound at every batch, but four times as many sequences fit in memory "
    "(Ainslie et al., 2023; Pope et al., 2022).",
    choices={
        "a": "about 20, as with multi-head attention: GQA saves memory, not traffic",
        "b": "about 40",
        "c": "about 80, four times multi-head attention's, since the cache is four times smaller",
        "d": "about 300, an H100's ridge point: compute-bound",
    },
)

check_predict_adam_bytes, grade_predict_adam_bytes = ADAM_BYTES.graders()
check_predict_gpt2_xl_kv_mib, grade_predict_gpt2_xl_kv_mib = GPT2_XL_KV_MIB.graders()
check_predict_batched_decode, grade_predict_batched_decode = BATCHED_DECODE.graders()


# =========================================================================== experiment: flops_ratio

#: The experiment's band. ``counted_flops`` counts matrix-product FLOPs exactly (the course's tests
#: compare it with :func:`~coursekit.arithmetic.forward_flops` to the FLOP), so every correct measurement
#: gives ``forward_flops / (2 N B T)`` up to float rounding, whether the model is built on the meta
#: device or with real weights, whatever the token ids. A 1% band leaves room for nothing but rounding,
#: and is narrower than every usual mistake on the graded shapes (FLOPS_SHAPES): the closest, leaving the
#: position embedding out of N, is 2.3% off at the shape with the largest vocabulary; the fused CPU
#: attention kernel, which the counter does not see, removes 8.5% to 25% of the count; the embeddings
#: left out of N, 6 N instead of 2 N, a forgotten batch or a backward pass are off by 5% or far more
#: (tests/test_grading_appendix_arithmetic.py checks these margins).
FLOPS_BAND = 0.01

#: (vocab_size, d_model, n_layers, n_heads, seq_len, batch) graded, from little attention to a lot.
FLOPS_SHAPES = (
    (97, 48, 3, 4, 64, 2),
    (2000, 32, 2, 2, 64, 1),
    (512, 64, 2, 4, 128, 1),
    (64, 128, 4, 8, 256, 3),
)

_FUSED = (
    "the count misses attention's q k^T and weights @ v: run the model inside counted_flops (it picks torch's "
    "math kernel; FlopCounterMode alone does not see the fused CPU kernel)"
)
_NON_EMBEDDING = (
    "N counts all the parameters, embeddings included: sum(p.numel() for p in model.parameters())"
)
_BATCH = "divide by all the tokens, batch * seq_len, not seq_len alone"
_PER_SEQUENCE = "divide by the tokens: 2 N per token, times batch * seq_len"


def _flops_parts(V, C, L, H, T, B) -> tuple[int, int, int]:
    """(counted FLOPs, N, attention FLOPs) of the reference model."""
    cfg = ref.GPTConfig(vocab_size=V, block_size=T, n_layers=L, n_heads=H, d_model=C)
    return ref.forward_flops(cfg, T, B), ref.gpt_param_count(cfg), 4 * L * T * C * B * T


def _flops_mistakes(V, C, L, H, T, B) -> list[tuple[float, str]]:
    flops, n, attention = _flops_parts(V, C, L, H, T, B)
    right = flops / (2 * n * B * T)
    return [
        ((flops - attention) / (2 * n * B * T), _FUSED),
        (flops / (2 * (n - (V + T) * C) * B * T), _NON_EMBEDDING),
        (flops / (2 * (n - T * C) * B * T), "N counts all the parameters, the position embedding included"),
        (3 * right, "count the forward pass alone, under torch.no_grad(): a backward pass triples the FLOPs"),
        (right / 3, "divide by 2 N FLOPs per token (the forward pass), not 6 N (training)"),
        (right * B, _BATCH),
        (right * T, _PER_SEQUENCE),
        (right * B * T, _PER_SEQUENCE),
        (1 / right, "return counted / (2 N B T), not its inverse"),
        (right * 2, "2 N FLOPs per token: a multiply-add is 2 FLOPs"),
        ((flops - attention) / (2 * (n - (V + T) * C) * B * T), _FUSED + "; and " + _NON_EMBEDDING),
    ]


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= FLOPS_BAND * abs(b)


def _check_ratio(g: Grader, flops_ratio, shape: tuple, pass_batch: bool = True) -> float | None:
    V, C, L, H, T, B = shape
    args = shape if pass_batch else shape[:5]
    call = _call("flops_ratio", *args)
    got = _student(g, call, flops_ratio, *args)
    flops, n, _ = _flops_parts(*shape)
    right = flops / (2 * n * B * T)
    value = _number(got)
    if value is not None and not _near(value, right):
        mistakes = [h for w, h in _flops_mistakes(*shape) if not _near(w, right) and _near(value, w)]
        if mistakes:
            hints = "; or: ".join(dict.fromkeys(mistakes))
            g.fail(f"{call} gave {value:.4g}, expected {right:.4f} (within {FLOPS_BAND:.0%}): {hints}")
    how = (
        f"the forward pass counts {flops:,} FLOPs for {n:,} parameters and {B * T} tokens: count one forward "
        "pass of GPT(GPTConfig(vocab_size, block_size=seq_len, ...)) with counted_flops and divide by 2 N B T"
    )
    expect_in_band(g, call, got, right * (1 - FLOPS_BAND), right * (1 + FLOPS_BAND), how)
    return value


def _ratio_float(g: Grader, flops_ratio, args: tuple) -> None:
    got = flops_ratio(*args)
    g.expect(
        type(got) is float, f"{_call('flops_ratio', *args)} should return a Python float, got {describe(got)}"
    )


def _ratio_per_token(g: Grader, flops_ratio, shape: tuple) -> None:
    """The default batch=1, and batch ``shape[5]``: the same ratio."""
    one = _check_ratio(g, flops_ratio, (*shape[:5], 1), pass_batch=False)
    more = _check_ratio(g, flops_ratio, shape)
    g.expect(
        one is not None and more is not None and _near(more, one),
        f"batch=1 (the default) gave {one} and batch={shape[5]} gave {more}: the ratio is per token, "
        + _BATCH,
    )


def _exact_ratio(shape: tuple) -> float:
    flops, n, _ = _flops_parts(*shape)
    return flops / (2 * n * shape[5] * shape[4])


_FLOPS_GOOD = dict(vocab_size=97, d_model=48, n_layers=3, n_heads=4, seq_len=64, batch=2)

FLOPS_RATIO = Spec(
    "flops_ratio",
    [
        Clause("returns a Python float", _ratio_float, examples=[FLOPS_SHAPES[0]]),
        Clause(
            f"the measured ratio, within {FLOPS_BAND:.0%}, on four shapes from little attention to a lot",
            _check_ratio,
            examples=FLOPS_SHAPES[:1],
            also=FLOPS_SHAPES[1:],
        ),
        procedure(
            lambda shape: Call(_call("flops_ratio", *shape), shape),
            _exact_ratio,
            text="exactly the stated count, not only within the band: counted_flops of one forward pass over "
            "2 N B T, N all the parameters",
            steps="count one forward pass with counted_flops and return counted / (2 N B T) as it is (no rounding), "
            "N = sum(p.numel() for p in model.parameters()): every parameter, embeddings, biases and norms included",
            examples=[FLOPS_SHAPES[0], FLOPS_SHAPES[-1]],
            inputs=st.tuples(
                st.integers(2, 600),
                st.sampled_from([16, 32, 48, 64]),
                st.integers(1, 3),
                st.sampled_from([1, 2, 4]),
                st.sampled_from([8, 32, 64, 128]),
                st.integers(1, 3),
            ),
            key="flops.procedure",
            band=lambda shape: (
                _exact_ratio(shape) * (1 - FLOPS_BAND),
                _exact_ratio(shape) * (1 + FLOPS_BAND),
            ),
        ),
        Clause(
            "one layer, one head, eight tokens: the smallest shapes work",
            _check_ratio,
            examples=[(10, 4, 1, 1, 8, 1), (50, 6, 2, 3, 1, 2)],
        ),
        Clause(
            "batch defaults to 1 and does not change the ratio (FLOPs and tokens both scale with it)",
            _ratio_per_token,
            examples=[(512, 64, 2, 4, 128, 4)],
        ),
        Clause(
            "a ValueError naming the values when n_heads does not divide d_model",
            _divides,
            examples=_divide_cases(
                "flops_ratio",
                ((97, 48, 3, 5, 64), ("48", "5")),
                ((97, 10, 1, 4, 8), ("10", "4")),
                why="say that n_heads does not divide d_model, with both values",
            ),
        ),
        Clause(
            "a ValueError naming the argument for a size that is not a positive whole number",
            _bad_value,
            examples=_bad_cases("flops_ratio", _FLOPS_GOOD, tuple(_FLOPS_GOOD)),
        ),
    ],
)
check_flops_ratio, grade_flops_ratio = FLOPS_RATIO.graders()


# =========================================================================== stretch: chinchilla_optimal

_SWAPPED = (
    "N grows like (C / 6)^(beta / (alpha + beta)) and D like (C / 6)^(alpha / (alpha + beta)): "
    "the exponents are swapped"
)
_NO_SIX = "the budget is C = 6 N D: use C / 6 = N D, not C"
_G_INVERTED = (
    "N = G (C / 6)^a and D = (C / 6)^b / G with G = (alpha A / (beta B))^(1 / (alpha + beta)): G is inverted"
)
_G_POWER = "G = (alpha A / (beta B)) to the power 1 / (alpha + beta), not G = alpha A / (beta B)"


def _chinchilla_ref(flops, A=406.4, B=410.7, alpha=0.34, beta=0.28) -> tuple[float, float]:
    n, d = ref.ChinchillaFit(E=0.0, A=A, B=B, alpha=alpha, beta=beta).optimal(flops)
    return float(n), float(d)


def _chinchilla_mistakes(flops, A, B, alpha, beta) -> list[tuple[tuple[float, float], str]]:
    s = alpha + beta
    G = (alpha * A / (beta * B)) ** (1 / s)
    c = flops / 6
    n, d = _chinchilla_ref(flops, A, B, alpha, beta)
    return [
        ((G * c ** (alpha / s), c ** (beta / s) / G), _SWAPPED),
        ((G * flops ** (beta / s), flops ** (alpha / s) / G), _NO_SIX),
        ((c ** (beta / s) / G, G * c ** (alpha / s)), _G_INVERTED),
        ((G**s * c ** (beta / s), c ** (alpha / s) / G**s), _G_POWER),
        ((d, n), "return (N, D): the parameters first, then the tokens"),
    ]


def _check_chinchilla(g: Grader, chinchilla_optimal, case: tuple[float, dict]) -> None:
    """``chinchilla_optimal(flops, **constants)``: ``(N, D)``, two Python floats, at float64 precision."""
    flops, constants = case
    call = _call("chinchilla_optimal", flops, **constants)
    got = _student(g, call, chinchilla_optimal, flops, **constants)
    if not (isinstance(got, tuple) and len(got) == 2):
        g.fail(f"{call} should return a tuple (N, D) of two floats, got {describe(got)}")
    n, d = (_number(x) for x in got)
    if n is None or d is None or not (type(got[0]) is float and type(got[1]) is float):
        g.fail(
            f"{call} should return two Python floats (use float(...)), got {describe(got[0])} and {describe(got[1])}"
        )
    full = {"A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28} | constants
    right = _chinchilla_ref(flops, **full)
    if _close(n, right[0]) and _close(d, right[1]):
        return
    hints = [h for (wn, wd), h in _chinchilla_mistakes(flops, **full) if _close(n, wn) and _close(d, wd)]
    if not hints and _close(6 * n * d, flops):
        hints = [
            "6 N D equals the budget, but N is not the minimum of the loss along it: set the derivative of "
            "A / N^alpha + B / D^beta with D = C / (6 N) to zero"
        ]
    g.fail(
        f"{call} = ({n:.6g}, {d:.6g}), expected ({right[0]:.6g}, {right[1]:.6g})"
        + (": " + "; or: ".join(hints) if hints else "")
    )


def _budget_spent(g: Grader, chinchilla_optimal, flops: float) -> None:
    n, d = chinchilla_optimal(flops)
    g.expect(
        _close(6 * float(n) * float(d), flops),
        f"chinchilla_optimal({flops:g}) gave N = {float(n):.4g}, D = {float(d):.4g}: 6 N D = "
        f"{6 * float(n) * float(d):.4g}, not the budget {flops:g} ({_NO_SIX})",
    )


_CHINCHILLA_GOOD = {"flops": 1e21, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}

CHINCHILLA_OPTIMAL = Spec(
    "chinchilla_optimal",
    [
        Clause(
            "Hoffmann et al.'s published constants (the defaults), budgets from 1e18 to 1e25 FLOPs",
            _check_chinchilla,
            examples=[(flops, {}) for flops in (1e18, 5.76e23, 3.14e23, 1e25)],
        ),
        Clause(
            "any positive budget, even a tiny one that is not a multiple of 6 (7 and 100 FLOPs)",
            _check_chinchilla,
            examples=[(7.0, {}), (100.0, {})],
        ),
        Clause("the budget is spent: 6 N D == flops", _budget_spent, examples=[2e19, 7.5e24]),
        Clause(
            "other constants: Besiroglu et al.'s refit (2024), equal exponents, and A, B, alpha, beta by name",
            _check_chinchilla,
            examples=[
                (1e22, {"A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}),
                (6e20, {"A": 100.0, "B": 100.0, "alpha": 0.5, "beta": 0.5}),
                (1e21, {"B": 1000.0}),
                (1e21, {"alpha": 0.4}),
                (1e21, {"A": 50.0, "beta": 0.2}),
            ],
        ),
        Clause(
            "a ValueError naming the argument for a budget or constant that is not positive",
            _bad_value,
            examples=[
                ("chinchilla_optimal", _CHINCHILLA_GOOD, arg, bad, "a positive number")
                for arg in _CHINCHILLA_GOOD
                for bad in (0, -1.0)
            ],
        ),
    ],
)
check_chinchilla_optimal, grade_chinchilla_optimal = CHINCHILLA_OPTIMAL.graders()

"""A graded part, stated once: every clause of its text is one row.

A :class:`Clause` is one promise of the exercise's text, written once:

- ``text``: the check's name, as the student reads it in both the public and the hidden report;
- ``test(g, student, case)``: the test of one input (``g`` the :class:`~coursekit.grading.core.Grader`,
  ``student`` the object the notebook hands over, ``case`` one input drawn or given);
- ``inputs``: a Hypothesis strategy of hidden inputs, drawn from the seed of ``key``
  (see :func:`~coursekit.grading.core.for_all`), and ``examples``: fixed inputs. The public check runs
  the examples; the hidden one tries the first example before any drawn input, then draws ``budget``
  more (a row of :data:`BUDGETS`), then runs ``also`` (fixed hidden inputs: an edge that a random draw
  rarely reaches);
- ``weight``: the clause's share of the part's points under partial credit.

A :class:`Spec` is a part's clauses in order; ``Spec.graders()`` returns ``(check_<part>,
grade_<part>)``, the public and the hidden entry point of the part. Example (the whole of a graded
part, beside its mutants in ``tests/mutants/``)::

    def _values(g, relu, case):
        shape, seed = case
        x = tensor(seed, *shape)
        where = f"relu(x {shape})"
        expect_close(g, where, call_student(g, where, relu, x), x.clamp(min=0))

    RELU = Spec("relu", [
        Clause("equals max(x, 0) elementwise", _values, inputs=st.tuples(SHAPES, SEEDS),
               key="relu.values", examples=[((2, 3), 0)]),
        unchanged(lambda case: Call(f"relu(x {case[0]})", (tensor(case[1], *case[0]),)),
                  st.tuples(SHAPES, SEEDS), key="relu.inplace", examples=[((3,), 1)]),
    ])
    check_relu, grade_relu = RELU.graders()

The constructors below state the generic kinds of clause once, for every part where they apply:
:func:`raises` (a clear error for what the text rules out), :func:`unchanged` (no change in place),
:func:`returns` (the promised type, shape, dtype and device), :func:`matches` (the reference, with the
named mistakes' hints first), :func:`new_tensor` (no alias of an input, at every argument value
including its edges), :func:`dtype_kept` (the dtype promise at the largest magnitudes allowed),
:func:`ties` (a tie exactly at a threshold goes the way the text says), :func:`order_free` (the answer
does not depend on the order of a mapping it receives), :func:`excludes` (what a random draw must
never produce), :func:`procedure` (an experiment's result is its stated procedure's, on a seeded
generator; the band only says how far off a wrong one is). A prediction's band is tested against its
named mistakes in :class:`~coursekit.grading.questions.Prediction`.

Over 500 lines: the form of a part and the one statement of every generic kind of clause, which
every chapter's parts list.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

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
    is_tensor,
    magnitude,
    probe,
    raise_unless_student_error,
    raised,
    show,
)

__all__ = [
    "BUDGETS",
    "Call",
    "Clause",
    "Spec",
    "budget",
    "dtype_kept",
    "excludes",
    "matches",
    "new_tensor",
    "order_free",
    "procedure",
    "raises",
    "returns",
    "scaled_budgets",
    "ties",
    "unchanged",
]

#: How many drawn inputs a clause's hidden check tries (Hypothesis's ``max_examples``), by the cost
#: of one input and the size of the space it covers. One table: the suite can scale every budget at
#: once (:func:`scaled_budgets`); a part names a row, never a number.
BUDGETS: dict[str, int] = {
    "tiny": 3,  # one input trains a model for a few steps
    "few": 4,
    "handful": 5,
    "small": 6,  # one input builds and runs a whole layer or model
    "some": 8,
    "normal": 10,
    "more": 12,
    "many": 14,
    "plenty": 15,
    "wide": 20,  # a cheap call over a large space
    "wider": 25,
    "widest": 30,  # a tokenizer over random strings
}

_SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("coursekit_budget_scale", default=1.0)


@contextlib.contextmanager
def scaled_budgets(factor: float) -> Iterator[None]:
    """Every budget times ``factor`` (at least 1 input) while the block runs: for a suite that wants
    more inputs (a nightly run) or fewer. Grading never scales: a grade must not depend on it."""
    if not factor > 0:
        raise ValueError(f"a budget scale must be positive, got {factor!r}")
    token = _SCALE.set(factor)
    try:
        yield
    finally:
        _SCALE.reset(token)


def budget(name: str) -> int:
    """The number of drawn inputs of the budget ``name`` (a key of :data:`BUDGETS`)."""
    if name not in BUDGETS:
        raise ValueError(f"unknown budget {name!r}: use one of {', '.join(BUDGETS)}")
    return max(1, round(BUDGETS[name] * _SCALE.get()))


_FROM_EXAMPLES = object()


class _Bound:
    """``test(g, student, case)`` as the one-argument test :func:`for_all` takes. Carries the test's
    code, which :func:`for_all` keys its replay of passed inputs by."""

    def __init__(self, test: Callable, g: Grader, student: object):
        self.test, self.g, self.student = test, g, student
        self.__code__ = getattr(test, "__code__", test)

    def __call__(self, case: object) -> None:
        self.test(self.g, self.student, case)


@dataclass(frozen=True)
class Clause:
    """One promise of a part's text, its test written once (see the module's docstring)."""

    text: str
    test: Callable[[Grader, Any, Any], None]
    inputs: Any = None
    examples: Sequence = ()
    key: str | None = None
    budget: str = "normal"
    weight: float = 1.0
    also: Sequence = ()
    first: Any = _FROM_EXAMPLES
    public: bool = True

    def __post_init__(self):
        if not callable(self.test):
            raise TypeError(f"clause {self.text!r}: test must be callable, got {type(self.test).__name__}")
        if self.inputs is not None and not self.key:
            raise ValueError(f"clause {self.text!r}: drawn inputs need a key (the seed of the draw)")
        if self.inputs is None and not self.examples and not self.also:
            raise ValueError(f"clause {self.text!r} has no inputs: give inputs, examples or also")
        if not self.weight >= 0:
            raise ValueError(f"clause {self.text!r}: weight must be 0 or more, got {self.weight!r}")
        budget(self.budget)  # a known row
        object.__setattr__(self, "examples", tuple(self.examples))
        object.__setattr__(self, "also", tuple(self.also))

    def hidden(self, g: Grader, student: object) -> None:
        """The hidden test: the first example, the drawn inputs, then ``also`` (or, without drawn
        inputs, every example)."""
        if self.inputs is None:
            for case in self.examples:
                self.test(g, student, case)
        else:
            first = self.first
            if first is _FROM_EXAMPLES:
                first = self.examples[0] if self.examples else None
            for_all(
                self.key,
                self.inputs,
                _Bound(self.test, g, student),
                max_examples=budget(self.budget),
                first=first,
            )
        for case in self.also:
            self.test(g, student, case)

    def shown(self, g: Grader, student: object) -> None:
        """The public test: every fixed example."""
        for case in self.examples:
            self.test(g, student, case)


@dataclass(frozen=True)
class Spec:
    """A graded part: its name and its clauses, in the order the report lists them.

    ``extra_public``: checks only the public report runs (a worked example the notebook prints),
    as clauses whose examples are the inputs.
    """

    part: str
    clauses: Sequence[Clause]
    extra_public: Sequence[Clause] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "clauses", tuple(self.clauses))
        object.__setattr__(self, "extra_public", tuple(self.extra_public))
        texts = [c.text for c in self.clauses]
        repeated = sorted({t for t in texts if texts.count(t) > 1})
        if repeated:
            raise ValueError(f"{self.part}: two clauses share the text {repeated[0]!r}")
        keys = [c.key for c in self.clauses if c.key]
        if len(keys) != len(set(keys)):
            raise ValueError(f"{self.part}: two clauses draw from the same key (their inputs would coincide)")

    def grade(self, student: object) -> None:
        """The hidden grader: every clause on its hidden inputs."""
        g = Grader(self.part)
        for clause in self.clauses:
            with g.check(clause.text, clause.weight):
                clause.hidden(g, student)
        g.finish()

    def check(self, student: object) -> None:
        """The public check: every public clause on its fixed examples."""
        g = Grader(f"{self.part} (public)")
        for clause in (*self.clauses, *self.extra_public):
            if clause.public and clause.examples:
                with g.check(clause.text, clause.weight):
                    clause.shown(g, student)
        g.finish()

    def graders(self, name: str | None = None) -> tuple[Callable[[object], None], Callable[[object], None]]:
        """``(check_<name>, grade_<name>)`` (``name`` defaults to the part's), named as the notebooks
        call them. A part graded on several of the student's objects (a function and the classes it
        uses) is called with all of them; its tests then receive them as one tuple."""
        name = name or self.part

        def check(*students: object) -> None:
            self.check(students[0] if len(students) == 1 else students)

        def grade(*students: object) -> None:
            self.grade(students[0] if len(students) == 1 else students)

        for fn, verb in ((check, "check"), (grade, "grade")):
            fn.__name__ = fn.__qualname__ = f"{verb}_{name}"
            fn.__doc__ = (
                f"{'Public checks' if verb == 'check' else 'Hidden checks'} of ``{name}``: "
                + "; ".join(c.text for c in self.clauses)
            )
            fn.spec = self  # type: ignore[attr-defined]  # read by tests and the instructor's table
        return check, grade


# --------------------------------------------------------------------------- generic kinds


@dataclass(frozen=True)
class Call:
    """One call of the student's code: ``where`` names it in a hint (``softmax(x (2, 3), dim=0)``).
    ``method``: call that attribute of the student's object instead of the object itself (a module's
    ``forward``, say); ``build``: make the object to call from the student's (a class -> an instance);
    ``names``: what hints call the positional arguments (default: "argument 1", ...)."""

    where: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    build: Callable | None = None
    names: tuple[str, ...] = ()  # the positional arguments' names, as hints name them ("x", "patches")

    def target(self, g: Grader, student: object):
        return student if self.build is None else self.build(g, student)


def _data(args: tuple, kwargs: dict, names: tuple[str, ...] = ()) -> list[tuple[str, object]]:
    """The arguments a call could change in place (tensors, lists, dicts, sets), by name."""
    named = [(names[i] if i < len(names) else f"argument {i + 1}", a) for i, a in enumerate(args)]
    named += [(k, v) for k, v in kwargs.items()]
    return [(n, v) for n, v in named if isinstance(v, (torch.Tensor, list, dict, set, bytearray))]


def _tensors(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    return [(n, t) for n, t in _data(args, kwargs) if isinstance(t, torch.Tensor)]


def _copy(value: object) -> object:
    """A copy of an argument for one call: the grader's own stays as it was."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    return copy.deepcopy(value) if isinstance(value, (list, dict, set, bytearray)) else value


def _equal(now: object, was: object) -> bool:
    if isinstance(was, torch.Tensor):
        return is_tensor(now) and now.shape == was.shape and now.dtype == was.dtype and torch.equal(now, was)
    return type(now) is type(was) and now == was


def raises(
    call: Callable[[Any], Call],
    inputs: Any = None,
    *,
    fix: str,
    text: str,
    key: str | None = None,
    examples: Sequence = (),
    also: Sequence = (),
    budget: str = "normal",
    weight: float = 1.0,
    error: type[Exception] = ValueError,
) -> Clause:
    """The text rules these inputs out: the call must raise ``error`` (``ValueError``); ``fix`` says
    what a good message tells the caller."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        fn = c.target(g, student)
        if error is ValueError:
            expect_value_error(g, lambda: fn(*c.args, **c.kwargs), c.where, fix)
            return
        try:
            out = fn(*c.args, **c.kwargs)
        except error:
            return
        except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
            raise_unless_student_error(e)
            g.fail(f"with {c.where} your code raised {raised(e)}; raise a {error.__name__} instead ({fix})")
        g.fail(f"with {c.where} your code returned {describe(out)}; raise a {error.__name__} instead ({fix})")

    return Clause(text, test, inputs, examples, key, budget, weight, also)


def unchanged(
    call: Callable[[Any], Call],
    inputs: Any = None,
    *,
    key: str | None = None,
    examples: Sequence = (),
    also: Sequence = (),
    budget: str = "small",
    weight: float = 1.0,
    text: str = "leaves its inputs unchanged (no in-place changes)",
    advice: str = "compute a new tensor",
) -> Clause:
    """No argument changes in place: a tensor (``x -= m``, ``x.exp_()``, ``out=x``), or a list, dict or
    set the call receives (``ids.pop()``, ``counts[pair] += 1``)."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        before = _data(c.args, c.kwargs, c.names)
        p = probe(c.target(g, student), *map(_copy, c.args), **{k: _copy(v) for k, v in c.kwargs.items()})
        after = dict(_data(tuple(p.args), p.kwargs, c.names))
        for name, was in before:
            now = after.get(name)
            g.expect(
                _equal(now, was),
                f"{c.where}: your code modified its input in place ({name} was {show(was)}, afterwards "
                f"{show(now)}); {advice}",
            )

    return Clause(text, test, inputs, examples, key, budget, weight, also)


def returns(
    call: Callable[[Any], Call],
    promised: Callable[[Any], torch.Tensor | tuple],
    inputs: Any = None,
    *,
    text: str,
    key: str | None = None,
    examples: Sequence = (),
    also: Sequence = (),
    budget: str = "normal",
    weight: float = 1.0,
) -> Clause:
    """The result is a plain tensor of the promised shape, dtype and device: ``promised(case)`` is
    a tensor of them (an empty one is enough: ``torch.empty(shape, dtype=..., device=...)``), or a
    tuple of such for a tuple result."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        out = call_student(g, c.where, c.target(g, student), *c.args, **c.kwargs)
        want = promised(case)
        pairs = list(zip(out, want)) if isinstance(want, tuple) else [(out, want)]
        if isinstance(want, tuple):
            g.expect(
                isinstance(out, tuple) and len(out) == len(want),
                f"{c.where} should return a tuple of {len(want)} tensors, got {describe(out)}",
            )
        for got, w in pairs:
            g.expect(
                is_tensor(got) and got.shape == w.shape and got.dtype == w.dtype,
                f"{c.where} should be a tensor {dtype_name(w.dtype)} {tuple(w.shape)}, got {describe(got)}",
            )
            g.expect(
                got.device.type == w.device.type,
                f"{c.where} should be on {w.device.type}, got {got.device.type}: create new tensors with "
                "device=x.device",
            )

    return Clause(text, test, inputs, examples, key, budget, weight, also)


def matches(
    call: Callable[[Any], Call],
    reference: Callable[[Any], torch.Tensor],
    inputs: Any = None,
    *,
    text: str,
    mistakes: Callable[[Any, str], list] | None = None,
    key: str | None = None,
    examples: Sequence = (),
    also: Sequence = (),
    budget: str = "normal",
    weight: float = 1.0,
    advice: str = "",
) -> Clause:
    """The result equals the reference's (``reference(case)``, computed in float64 and cast to the
    promised dtype) within the tolerance of its dtype. ``mistakes(case, where)`` lists the named wrong
    answers on the same input as ``(wrong_output, hint)``: a result equal to one gets its hint."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        out = call_student(g, c.where, c.target(g, student), *c.args, **c.kwargs)
        expected = reference(case)
        if mistakes is not None:
            first_match(g, out, mistakes(case, c.where), right=expected)
        mag = magnitude(*[t for _, t in _tensors(c.args, c.kwargs)])
        g.expect(close(out, expected, magnitude=mag), f"{c.where}: {first_difference(out, expected, advice)}")

    return Clause(text, test, inputs, examples, key, budget, weight, also)


def new_tensor(
    call: Callable[[Any], Call],
    inputs: Any = None,
    *,
    key: str | None = None,
    examples: Sequence = (),
    also: Sequence = (),
    budget: str = "small",
    weight: float = 1.0,
    text: str = "returns a new tensor, never a view of its input, at every argument value",
) -> Clause:
    """No result tensor shares memory with a tensor argument, also at the argument values where the
    computation does nothing (``p = 0``, a scale of 1, nothing masked): give those edges in
    ``examples`` or ``also``. Writing into the result must never change the caller's input."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        p = probe(c.target(g, student), *c.args, **c.kwargs)
        g.expect(
            not p.aliased,
            f"{c.where}: your result shares memory with an input (returned the input, or a view of it, "
            "where nothing needed changing): a caller that writes into the result would change the input; "
            "return a new tensor (x.clone()) at every argument value",
        )

    return Clause(text, test, inputs, examples, key, budget, weight, also)


def dtype_kept(
    call: Callable[[Any], Call],
    reference: Callable[[Any], torch.Tensor],
    inputs: Any,
    *,
    key: str,
    examples: Sequence = (),
    also: Sequence = (),
    budget: str = "small",
    weight: float = 1.0,
    text: str = "keeps its dtype promise at the largest magnitudes the text allows (finite and accurate)",
) -> Clause:
    """At the largest magnitudes the text allows (``inputs`` draw them), the result keeps the promised
    dtype, stays finite and matches the float64 reference: a computation that overflows in float16 or
    float32 on the way fails here."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        out = call_student(g, c.where, c.target(g, student), *c.args, **c.kwargs)
        expected = reference(case)
        g.expect(
            is_tensor(out) and out.dtype == expected.dtype,
            f"{c.where} should stay {dtype_name(expected.dtype)}, got {describe(out)}",
        )
        finite = torch.isfinite(expected)
        g.expect(
            bool(torch.isfinite(out)[finite].all()),
            f"{c.where}: inf or NaN ({show(out)}) at large magnitudes: an intermediate overflowed "
            f"{dtype_name(expected.dtype)}; rescale before the operation that grows (or compute in float32)",
        )
        # relative to the result, not the inputs: a large input must not widen the tolerance that
        # tells a result ruined by an overflow on the way from the right one
        g.expect(
            close(out, expected, magnitude=magnitude(expected)),
            f"{c.where}: {first_difference(out, expected)}: at large magnitudes an intermediate overflowed "
            f"{dtype_name(expected.dtype)} (or lost its precision); rescale before the operation that grows "
            "(or compute in float32)",
        )

    return Clause(text, test, inputs, examples, key, budget, weight, also)


def ties(
    call: Callable[[Any], Call],
    expected: Callable[[Any], object],
    *,
    text: str,
    rule: str,
    examples: Sequence,
    weight: float = 1.0,
) -> Clause:
    """Inputs that sit exactly on a threshold (a probability equal to top-p, two equal logits at the
    k-th place): the result is the one the text's rule gives. ``rule`` says the rule in the hint."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        out = call_student(g, c.where, c.target(g, student), *c.args, **c.kwargs)
        want = expected(case)
        ok = (
            torch.equal(out, want)
            if is_tensor(want) and is_tensor(out) and out.shape == want.shape
            else out == want
        )
        g.expect(
            bool(ok), f"{c.where} is exactly at the threshold: {rule}; expected {show(want)}, got {show(out)}"
        )

    return Clause(text, test, None, examples, None, "normal", weight)


def order_free(
    call: Callable[[Any, bool], Call],
    *,
    text: str = "does not depend on the order of the mapping it receives",
    examples: Sequence,
    weight: float = 1.0,
    compare: Callable[[object, object], bool] | None = None,
) -> Clause:
    """The same mapping in another insertion order gives the same answer: ``call(case, reversed)``
    builds the call with the mapping's items in their order or reversed."""

    def test(g: Grader, student: object, case: object) -> None:
        fwd, back = call(case, False), call(case, True)
        a = call_student(g, fwd.where, fwd.target(g, student), *fwd.args, **fwd.kwargs)
        b = call_student(g, back.where, back.target(g, student), *back.args, **back.kwargs)
        same = compare(a, b) if compare else (torch.equal(a, b) if is_tensor(a) and is_tensor(b) else a == b)
        g.expect(
            bool(same),
            f"{fwd.where}: the same mapping in another order gave another answer ({show(a)} vs {show(b)}): "
            "iterate in the order the text fixes (sorted, or by rank), not in the mapping's insertion order",
        )

    return Clause(text, test, None, examples, None, "normal", weight)


def excludes(
    call: Callable[[Any], Call],
    forbidden: Callable[[Any, object], list],
    inputs: Any = None,
    *,
    text: str,
    why: str,
    key: str | None = None,
    examples: Sequence = (),
    also: Sequence = (),
    budget: str = "normal",
    weight: float = 1.0,
) -> Clause:
    """A random draw must never produce what the text excludes (a special token, a masked id):
    ``forbidden(case, out)`` lists what the result holds of it (empty: fine)."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        out = call_student(g, c.where, c.target(g, student), *c.args, **c.kwargs)
        bad = forbidden(case, out)
        g.expect(not bad, f"{c.where} produced {bad[:6]}, which a draw must exclude: {why}")

    return Clause(text, test, inputs, examples, key, budget, weight, also)


def procedure(
    call: Callable[[Any], Call],
    reference: Callable[[Any], float],
    *,
    text: str,
    steps: str,
    examples: Sequence,
    inputs: Any = None,
    key: str | None = None,
    budget: str = "tiny",
    band: Callable[[Any], tuple[float, float]] | None = None,
    rel: float = 1e-9,
    weight: float = 1.0,
) -> Clause:
    """An experiment computes exactly what its stated procedure computes on the same seeded generator
    (``reference(case)``): another procedure whose result still lands inside the band fails. ``steps``
    restates the procedure in the hint; ``band(case)`` only says how far off a wrong result is.
    The hidden check runs every example and, with ``inputs``, ``budget`` draws of seeds and settings the
    examples do not use (from ``key``): a result right only on the public examples fails there."""

    def test(g: Grader, student: object, case: object) -> None:
        c = call(case)
        got = call_student(g, c.where, c.target(g, student), *c.args, **c.kwargs)
        want = reference(case)
        ok = (
            isinstance(got, (int, float))
            and not isinstance(got, bool)
            and abs(got - want) <= rel * abs(want) + 1e-12
        )
        if ok:
            return
        where = ""
        if band is not None and isinstance(got, (int, float)):
            low, high = band(case)
            where = (
                " (inside the band, so the procedure differs)"
                if low <= got <= high
                else " (outside the band)"
            )
        g.fail(f"{c.where} gave {got!r}, the stated procedure gives {want!r}{where}: {steps}")

    if inputs is None:
        return Clause(text, test, None, examples, None, "normal", weight)
    return Clause(text, test, inputs, examples, key, budget, weight, also=tuple(examples)[1:])

""" "Predict, then check" questions, and the measured band of an experiment part.

A *prediction* is a question about one of the chapter's experiments whose answer is a number or
one of a few lettered choices. The student writes it down in a variable before running the
experiment (``predict_leaked_pairs = 7``); the check runs the experiment with the course's own
code (``coursekit``), compares, and explains the result either way. The truth is *measured*
when the question is graded, never typed into the grader, so a change to the chapter's code
cannot leave a question with a stale answer.

Example::

    LEAK = Prediction(
        name="predict_leaked_pairs",
        question="How many (query, future key) pairs does tril(1) let through for T = 8?",
        tests="reading a mask: which diagonal tril keeps",
        measure=lambda: int((tril1 & ~causal).sum()),
        explanation="tril(1) keeps the first superdiagonal: query i sees key i + 1, for i < T - 1.",
    )
    check_predict_leaked_pairs, grade_predict_leaked_pairs = LEAK.graders()

An *experiment* part is a function the student writes that measures something (a variance, a
loss after a tiny run). Its grader calls it and accepts any result inside a stated band:
:func:`expect_in_band`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from coursekit.grading.core import Grader, describe

__all__ = ["Prediction", "expect_in_band", "predictions", "value"]


def value(obj: object) -> object:
    """``obj`` itself; for a student's global that lives in the sandbox, its value as data."""
    read = getattr(type(obj), "_value", None)
    if read is not None and getattr(obj, "type_name", None) is not None:
        return obj._value()
    return obj


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Prediction:
    """A "predict, then check" question.

    Attributes:
        name: the variable the student sets (``predict_...``), also the graded part's name.
        question: the question in one sentence (feedback and the instructor's table).
        tests: what the question tests, for the instructor's table.
        measure: runs the chapter's experiment with ``coursekit`` and returns the answer: a
            number, or one of ``choices``' letters.
        explanation: why the answer is what it is; shown in the feedback whether or not the
            prediction was right. ``{truth}`` is replaced by the measured answer.
        choices: for a multiple-choice question, letter -> choice; ``None`` for a number.
        rel, abs: a number is right when ``|answer - truth| <= rel * |truth| + abs``.
        mistakes: for a number, the named mistakes the band must separate from the truth, as
            ``(what, wrong_answer(truth))`` pairs (a unit confused, a factor forgotten): each must lie
            outside the band (:meth:`unseparated`, which the suite checks for every prediction), and an
            answer close to one is told which mistake it looks like.
    """

    name: str
    question: str
    tests: str
    measure: Callable[[], object]
    explanation: str
    choices: dict[str, str] | None = None
    rel: float = 0.0
    abs: float = 0.0
    mistakes: tuple[tuple[str, Callable[[float], float]], ...] = ()
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def truth(self) -> object:
        """The measured answer (measured once per process)."""
        if "truth" not in self._cache:
            measured = self.measure()
            if self.choices is not None and measured not in self.choices:
                raise RuntimeError(
                    f"{self.name}: the experiment answered {measured!r}, not one of the choices"
                )
            if self.choices is None and not _is_number(measured):
                raise RuntimeError(f"{self.name}: the experiment answered {measured!r}, not a number")
            self._cache["truth"] = measured
        return self._cache["truth"]

    def _within(self, answer: float, truth: float) -> bool:
        return abs(answer - truth) <= self.rel * abs(truth) + self.abs

    def unseparated(self) -> list[str]:
        """The named mistakes whose answer the band accepts (empty when the band separates them all)."""
        truth = self.truth()
        return [what for what, wrong in self.mistakes if self._within(wrong(truth), truth)]

    def _looks_like(self, answer: float, truth: float) -> str:
        """`` (what <mistake> gives)`` when ``answer`` is within the band of a named mistake's answer."""
        for what, wrong in self.mistakes:
            value = wrong(truth)
            if abs(answer - value) <= self.rel * abs(value) + self.abs:
                return f" (what {what} gives)"
        return ""

    def band(self) -> str:
        """How close a number must be, in words (empty for an exact answer or a choice)."""
        if self.choices is not None or (self.rel == 0 and self.abs == 0):
            return ""
        parts = ([f"{self.rel:.0%}"] if self.rel else []) + ([f"{self.abs:g}"] if self.abs else [])
        return " (within " + " + ".join(parts) + ")"

    def _shown(self, x: object) -> str:
        if self.choices is not None and x in self.choices:
            return f"({x}) {self.choices[x]}"
        return f"{x:g}" if _is_number(x) else repr(x)

    def _grade(self, answer: object, label: str) -> None:
        g = Grader(label)
        with g.check(  # weight 0: a well-formed prediction earns nothing unless it is right
            f"{self.name} is {'one of ' + ', '.join(map(repr, self.choices)) if self.choices else 'a number'}",
            weight=0,
        ):
            given = value(answer)
            g.expect(
                given is not None and given is not Ellipsis,
                f"not implemented yet: {self.name} is still None; replace None with your prediction",
            )
            if self.choices is not None:
                if isinstance(given, str) and given.strip().lower() in self.choices:
                    given = given.strip().lower()
                g.expect(
                    given in self.choices,
                    f"{self.name} should be one of the letters {', '.join(map(repr, self.choices))}, "
                    f"got {describe(given)}",
                )
            else:
                g.expect(_is_number(given), f"{self.name} should be a finite number, got {describe(given)}")
        if not g.failures:
            truth = self.truth()
            with g.check(f"your prediction matches what the experiment measures{self.band()}"):
                if self.choices is not None:
                    right = given == truth
                else:
                    right = self._within(given, truth)
                g.note(
                    f"{self.question} You predicted {self._shown(given)}; the experiment gives "
                    f"{self._shown(truth)}. {self.explanation.format(truth=self._shown(truth))}"
                )
                looks = "" if right or self.choices is not None else self._looks_like(given, truth)
                g.expect(
                    right,
                    f"you predicted {self._shown(given)}{looks}; the experiment gives {self._shown(truth)}",
                )
        g.finish()

    def graders(self) -> tuple[Callable[[object], None], Callable[[object], None]]:
        """``(check, grade)``: the public check and the hidden grader of this question. Both
        measure and explain; the hidden one is the one that carries the points."""

        def check(answer: object) -> None:
            self._grade(answer, f"{self.name} (public)")

        def grade(answer: object) -> None:
            self._grade(answer, self.name)

        for fn, verb in ((check, "Check"), (grade, "Grade")):
            fn.__name__ = fn.__qualname__ = f"{verb.lower()}_{self.name}"
            fn.__doc__ = f"{verb} the prediction ``{self.name}``: {self.question}"
            fn.prediction = self  # type: ignore[attr-defined]  # read by the instructor's table
        return check, grade


def predictions(module) -> list[Prediction]:
    """The predictions a grading module defines, in the order they were written."""
    return [v for v in vars(module).values() if isinstance(v, Prediction)]


def expect_in_band(g: Grader, what: str, got: object, low: float, high: float, why: str) -> float:
    """Fail the current check unless ``got`` is a finite number in ``[low, high]``; ``why`` says
    what a result outside the band usually means. Returns ``got`` as a float."""
    g.expect(_is_number(got), f"{what} should return a finite number, got {describe(got)}")
    g.expect(
        low <= got <= high, f"{what} gave {got:.4g}, outside the expected band [{low:.4g}, {high:.4g}]: {why}"
    )
    return float(got)

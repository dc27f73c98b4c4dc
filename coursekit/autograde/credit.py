"""Partial credit: a test cell's points shared among the clauses (named checks) its graders test.

A grader's :meth:`~coursekit.grading.core.Grader.check` carries a weight (1 unless the grader says
otherwise). A test cell whose checks all pass scores its points; otherwise it scores its points in
proportion to the weight of the checks that passed, rounded *down* to the course's step, so a part
with any failed check never rounds up to full marks. An instructor who wants all or nothing says so
in ``nbgrader_config.py``::

    c.CourseKit.partial_credit_step = 0.5   # the grid scores are rounded down to (default 0.5)
    c.CourseKit.all_or_nothing = True       # a test cell scores all its points or none

The score reaches nbgrader through its own partial-credit path (a test cell whose output is a
number scores that number), so the gradebook, the formgrader and the exports all see it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Credit"]


@dataclass(frozen=True)
class Credit:
    """How a test cell's points follow its clauses.

    Args:
        step: scores are rounded down to a multiple of ``step`` points (``0.5``: 3.8 -> 3.5).
        all_or_nothing: a test cell with a failed check scores 0, whatever passed.
    """

    step: float = 0.5
    all_or_nothing: bool = False

    def __post_init__(self):
        if not (isinstance(self.step, (int, float)) and math.isfinite(self.step) and self.step > 0):
            raise ValueError(
                f"CourseKit.partial_credit_step must be a positive number of points, got {self.step!r}"
            )
        if not isinstance(self.all_or_nothing, bool):
            raise ValueError(f"CourseKit.all_or_nothing must be True or False, got {self.all_or_nothing!r}")

    def score(self, points: float, clauses: list[tuple[str, float, bool]]) -> float:
        """The points a test cell worth ``points`` scores with ``clauses`` ``(check, weight, passed)``.

        Example: 5 points, checks weighing 1, 1, 2 of which the last failed: 5 * 2/4 = 2.5.
        A cell with no clause recorded (its graders stopped before any check) scores 0 unless it
        passed, which the caller decides.
        """
        if clauses and all(ok for _, _, ok in clauses):
            return float(points)
        total = sum(w for _, w, _ in clauses)
        passed = sum(w for _, w, ok in clauses if ok)
        if self.all_or_nothing or total <= 0 or passed <= 0:
            return 0.0
        # rounded down to the step (the epsilon keeps 2.5 from flooring to 2.0 through 2.4999999999999996),
        # and below full marks: a failed check, even one that weighs nothing, always costs a step
        floored = math.floor(points * passed / total / self.step + 1e-9) * self.step
        below_full = math.ceil(points / self.step - 1e-9) * self.step - self.step
        return float(max(0.0, min(floored, below_full)))

    def points_of(self, points: float, clauses: list[tuple[str, float, bool]]) -> dict[str, float]:
        """Each clause's share of ``points`` (before rounding): what the feedback shows beside it."""
        total = sum(w for _, w, _ in clauses)
        return {name: points * w / total for name, w, _ in clauses} if total > 0 else {}

    @classmethod
    def from_config(cls, config) -> Credit:
        """The course's choice, from its nbgrader config (``CourseKit.partial_credit_step`` and
        ``CourseKit.all_or_nothing``); the defaults where it says nothing."""
        section = config.get("CourseKit", {}) if hasattr(config, "get") else {}
        known = {"partial_credit_step", "all_or_nothing"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(
                f"nbgrader_config.py sets unknown CourseKit options {unknown}; known: {sorted(known)}"
            )
        return cls(
            step=section.get("partial_credit_step", cls.step),
            all_or_nothing=section.get("all_or_nothing", cls.all_or_nothing),
        )

"""Catalogues of wrong implementations ("mutants"), one module per exercise.

Each mutant replaces one definition of the reference solution. The graders must
fail the mutant's part and show the intended hint; ``tests/test_grading_*.py``
checks this in-process and ``tests/test_autograde.py`` through nbgrader.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str  # short id, used as the fake student's id
    target: str  # the top-level def/class it replaces
    part: str  # the graded part that must lose its points
    hint: str  # a substring of the hint the student must see
    source: str  # the wrong definition

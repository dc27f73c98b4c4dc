"""Graders: the hidden tests of every exercise are one-line calls into this package.

``from coursekit.grading import ch01_attention as grader; grader.grade_softmax(softmax)``
"""

from coursekit.grading.core import TOLERANCES, Grader, GradingFailure, close, generator

__all__ = ["TOLERANCES", "Grader", "GradingFailure", "close", "generator"]

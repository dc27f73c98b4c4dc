"""Partial credit: a test cell's points shared among its clauses (coursekit.autograde.credit)."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from coursekit.autograde.credit import Credit
from coursekit.grading import core


def clauses(*passed: bool, weights=None):
    weights = weights or [1.0] * len(passed)
    return [(f"check {i}", w, ok) for i, (w, ok) in enumerate(zip(weights, passed))]


def test_points_follow_the_weight_of_the_passed_clauses_rounded_down_to_the_step():
    assert Credit(step=0.5).score(5, clauses(True, True, False, weights=[1, 1, 2])) == 2.5
    assert Credit(step=0.5).score(5, clauses(True, True, True, False)) == 3.5  # 3.75 rounded down
    assert Credit(step=0.25).score(5, clauses(True, True, True, False)) == 3.75
    assert Credit(step=1).score(3, clauses(True, False, False)) == 1
    assert Credit().score(5, clauses(True, True)) == 5  # every clause passed: all the points


def test_a_failed_clause_never_rounds_up_to_full_marks():
    many = clauses(*([True] * 999 + [False]))
    assert Credit(step=0.5).score(5, many) == 4.5
    assert Credit(step=0.5).score(0.5, clauses(True, False)) == 0  # a cell worth one step


def test_nothing_passed_or_all_or_nothing_scores_zero():
    assert Credit().score(5, clauses(False, False)) == 0
    assert Credit().score(5, []) == 0  # the graders stopped before any check
    assert Credit(all_or_nothing=True).score(5, clauses(True, True, False)) == 0
    assert Credit(all_or_nothing=True).score(5, clauses(True, True)) == 5


def test_each_clause_shows_its_share_of_the_points():
    assert Credit().points_of(6, clauses(True, False, weights=[1, 2])) == {"check 0": 2.0, "check 1": 4.0}


def test_the_course_chooses_in_its_nbgrader_config():
    config = Config()
    assert Credit.from_config(config) == Credit()
    config.CourseKit.partial_credit_step = 1.0
    config.CourseKit.all_or_nothing = True
    assert Credit.from_config(config) == Credit(step=1.0, all_or_nothing=True)
    config.CourseKit.partial_credt_step = 2  # a typo is refused, not ignored
    with pytest.raises(ValueError, match="unknown CourseKit options \\['partial_credt_step'\\]"):
        Credit.from_config(config)
    for bad in (0, -1, float("nan"), "half"):
        with pytest.raises(ValueError, match="partial_credit_step must be a positive number"):
            Credit(step=bad)
    with pytest.raises(ValueError, match="all_or_nothing must be True or False"):
        Credit(all_or_nothing="no")


def test_a_grader_records_each_check_with_its_weight():
    g = core.Grader("part")
    recorded: list = []
    token = core.CLAUSES.set(recorded)
    try:
        with g.check("light"):
            pass
        with g.check("heavy", weight=3):
            g.fail("wrong")
        with pytest.raises(core.GradingFailure):
            g.finish()
    finally:
        core.CLAUSES.reset(token)
    assert recorded == [("part: light", 1.0, True), ("part: heavy", 3.0, False)]
    with pytest.raises(ValueError, match="weight must be 0 or more"):
        with g.check("negative", weight=-1):
            pass
    assert Credit().score(4, [("given", 0.0, True), ("theirs", 1.0, False)]) == 0  # given code earns nothing
    assert Credit().score(4, [("given", 0.0, False), ("theirs", 1.0, True)]) == 3.5  # but failing it costs


def test_a_wrong_prediction_earns_nothing_for_being_well_formed():
    """A prediction's format clause (a number, one of the letters) weighs nothing: under partial
    credit a wrong prediction still scores 0 and a right one all its points."""
    from coursekit.grading.questions import Prediction

    q = Prediction("predict_x", "How many?", "counting", measure=lambda: 3, explanation="three")
    for answer, expected in ((4, 0), (3, 2)):
        recorded: list = []
        token = core.CLAUSES.set(recorded)
        try:
            try:
                q.graders()[1](answer)
            except core.GradingFailure:
                pass
        finally:
            core.CLAUSES.reset(token)
        assert Credit().score(2, recorded) == expected, recorded

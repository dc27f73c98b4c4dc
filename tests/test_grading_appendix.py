"""The appendix exercise's graders, tested like code: the reference passes, every mutant is caught."""

from __future__ import annotations

import inspect
import textwrap

import numpy as np
import pytest
import torch

from coursekit import arithmetic as ref
from coursekit.grading import GradingFailure
from coursekit.grading import appendix_arithmetic as grader

#: graded part -> (hidden grader, public check, the reference definition's name)
PARTS = {
    "decoder_params": (grader.grade_decoder_params, grader.check_decoder_params, "decoder_params"),
    "training_memory_gib": (grader.grade_training_memory, grader.check_training_memory, "training_memory_gib"),
    "kv_cache_gib": (grader.grade_kv_cache, grader.check_kv_cache, "kv_cache_gib"),
    "training_days": (grader.grade_training_days, grader.check_training_days, "training_days"),
}


def namespace():
    """What a student's notebook holds: the imports cell's names and the reference definitions,
    defined in it (so that a mutant of ``memory_per_param`` is what ``training_memory_gib`` calls)."""
    import math

    ns = {"math": math, "require_positive": ref.require_positive}
    for name in ("decoder_params", "memory_per_param", "training_memory_gib", "kv_cache_gib", "training_days"):
        exec(compile(textwrap.dedent(inspect.getsource(getattr(ref, name))), f"<reference {name}>", "exec"), ns)
    return ns


def stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("wrap", [float, np.float64, lambda x: torch.tensor(x, dtype=torch.float64), np.array])
def test_any_plain_number_type_is_accepted(wrap):
    """A float, a numpy scalar or a one-element tensor or array is an answer; rounding within RTOL passes."""
    grader.grade_kv_cache(lambda *a: wrap(ref.kv_cache_gib(*a) * (1 + 0.3 * grader.RTOL)))
    grader.grade_training_days(lambda *a: wrap(ref.training_days(*a)))


def test_off_by_more_than_the_tolerance_fails_with_the_numbers():
    with pytest.raises(GradingFailure, match=r"expected 1 \(relative tolerance 1e-06\)"):
        grader.check_kv_cache(lambda *a: ref.kv_cache_gib(*a) * (1 + 3 * grader.RTOL))


@pytest.mark.parametrize("answer", ["1.0", None, [1.0], True])
def test_non_numbers_are_named(answer):
    with pytest.raises(GradingFailure, match="should return a number, got"):
        grader.check_kv_cache(lambda *a: answer)


def test_ambiguous_numbers_name_every_matching_mistake():
    """fp32 Adam at 12 bytes is either a missing gradient or a missing moment: the hint says both."""
    def twelve_bytes(n, precision="fp32", optimizer="adam"):
        return n * 12 / 2**30

    with pytest.raises(GradingFailure) as info:
        grader.check_training_memory(twelve_bytes)
    assert "the gradients are missing" in str(info.value) and "Adam keeps two moments" in str(info.value)

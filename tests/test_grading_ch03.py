"""The Exercise 3 graders, tested like code: reference passes, every mutant is caught."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from coursekit import positional as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch03_positional as grader
from tests.mutants.ch03_positional import MUTANTS

GRADERS = {
    "sinusoidal_encoding": grader.grade_sinusoidal_encoding,
    "apply_rope": grader.grade_apply_rope,
    "alibi_slopes": grader.grade_alibi_slopes,
    "alibi_bias": grader.grade_alibi_bias,
}

PUBLIC = {
    "sinusoidal_encoding": grader.check_sinusoidal_encoding,
    "apply_rope": grader.check_apply_rope,
    "alibi_slopes": grader.check_alibi_slopes,
    "alibi_bias": grader.check_alibi_bias,
}


def namespace(**overrides):
    """What a student's notebook holds: imports plus the reference definitions."""
    ns = {"torch": torch, "math": math, "nn": nn, "rope_angles": ref.rope_angles}
    ns.update({name: getattr(ref, name) for name in GRADERS})
    ns.update(overrides)
    return ns


def stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize(
    "name,part",
    [("sinusoidal_sin_cos_swapped", "sinusoidal_encoding"), ("rope_interleaved_pairs", "apply_rope"),
     ("rope_rotates_backwards", "apply_rope"), ("alibi_slopes_naive_rule", "alibi_slopes"),
     ("alibi_bias_sign_flipped", "alibi_bias")],
)
def test_public_checks_catch_the_commonest_mistakes(name, part):
    mutant = next(m for m in MUTANTS if m.name == name)
    ns = namespace()
    exec(compile(mutant.source, f"<mutant {name}>", "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[part](ns[mutant.target])


def test_student_exception_is_reported_with_its_line():
    def broken(x, positions, base=10000.0, scaling=None, factor=1.0):
        return x @ positions  # wrong shapes

    with pytest.raises(GradingFailure, match=r"your code raised RuntimeError.*line \d+"):
        grader.grade_apply_rope(broken)


def test_grading_is_deterministic():
    seen = []

    def spy(x, positions, **kwargs):
        seen.append(x.clone())
        return ref.apply_rope(x, positions, **kwargs)

    grader.grade_apply_rope(spy)
    first = list(seen)
    seen.clear()
    grader.grade_apply_rope(spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for a, b in zip(first, seen))


def test_a_lying_tensor_subclass_fails_in_process_too():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    def alibi_slopes(H, dtype=torch.float32):
        return torch.zeros(H, dtype=dtype).as_subclass(Liar)

    with pytest.raises(GradingFailure, match="got Liar"):
        grader.grade_alibi_slopes(alibi_slopes)

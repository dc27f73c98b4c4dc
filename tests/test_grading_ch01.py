"""The Exercise 1 graders, tested like code: reference passes, every mutant is caught."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from coursekit import attention as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch01_attention as grader
from tests.mutants.ch01_attention import MUTANTS

GRADERS = {
    "softmax": (grader.grade_softmax, "softmax"),
    "causal_mask": (grader.grade_causal_mask, "causal_mask"),
    "scaled_dot_product_attention": (grader.grade_attention, "scaled_dot_product_attention"),
    "SelfAttention": (grader.grade_self_attention, "SelfAttention"),
}


def namespace(**overrides):
    """What a student's notebook holds: imports plus the reference definitions."""
    ns = {"torch": torch, "math": math, "nn": nn, "check_attention_inputs": ref.check_attention_inputs}
    ns.update({name: getattr(ref, name) for name in GRADERS})
    ns.update(overrides)
    return ns


@pytest.mark.parametrize("part", list(GRADERS))
def test_reference_scores_full_marks(part, capsys):
    grade, attr = GRADERS[part]
    grade(getattr(ref, attr))
    assert "checks passed" in capsys.readouterr().out


@pytest.mark.parametrize("part", list(GRADERS))
def test_unimplemented_part_fails_with_a_plain_reason(part):
    def stub(*args, **kwargs):
        raise NotImplementedError()

    grade, _ = GRADERS[part]
    with pytest.raises(GradingFailure, match="not implemented yet"):
        grade(stub)


def test_catalogue_is_large_and_covers_every_part():
    assert len(MUTANTS) >= 8
    assert {m.part for m in MUTANTS} == set(GRADERS)
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_loses_points_with_its_hint(mutant):
    ns = namespace()
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)  # defines ns[mutant.target], using ns's other names
    grade, _ = GRADERS[mutant.part]
    with pytest.raises(GradingFailure) as info:
        grade(ns[mutant.target])
    assert mutant.hint in str(info.value), f"expected hint {mutant.hint!r}, got:\n{info.value}"


def test_failure_message_lists_each_failed_check():
    def bad_softmax(x, dim=-1):
        return torch.exp(x)  # unnormalised

    with pytest.raises(GradingFailure) as info:
        grader.grade_softmax(bad_softmax)
    message = str(info.value)
    assert message.startswith("softmax: ")
    assert "do not sum to 1" in message
    assert len(info.value.failures) >= 2


def test_student_exception_is_reported_with_its_line():
    def broken(q, k, v, mask=None, scale=None):
        return q @ k  # wrong: (T, D) @ (S, D)

    with pytest.raises(GradingFailure, match=r"your code raised RuntimeError.*line \d+"):
        grader.grade_attention(broken)


def test_grading_is_deterministic():
    seen = []

    def spy(x, dim=-1):
        seen.append(x.clone())
        return ref.softmax(x, dim)

    grader.grade_softmax(spy)
    first = list(seen)
    seen.clear()
    grader.grade_softmax(spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for a, b in zip(first, seen))


PUBLIC = {
    "softmax": grader.check_softmax,
    "causal_mask": grader.check_causal_mask,
    "scaled_dot_product_attention": grader.check_attention,
    "SelfAttention": grader.check_self_attention,
}


@pytest.mark.parametrize("part", list(PUBLIC))
def test_public_checks_pass_the_reference_and_fail_a_stub(part, capsys):
    PUBLIC[part](getattr(ref, part))
    assert "checks passed" in capsys.readouterr().out

    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(GradingFailure, match="not implemented yet"):
        PUBLIC[part](stub)


def test_a_lying_tensor_subclass_fails_in_process_too():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    def causal_mask(T, S=None, device=None):
        return torch.zeros(T, T if S is None else S, dtype=torch.bool).as_subclass(Liar)

    with pytest.raises(GradingFailure, match="got Liar"):
        grader.grade_causal_mask(causal_mask)

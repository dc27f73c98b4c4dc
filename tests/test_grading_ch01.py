"""The Exercise 1 graders, tested like code: reference passes, every mutant is caught."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from coursekit import attention as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch01_attention as grader

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


def test_a_lying_tensor_subclass_fails_in_process_too():
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

    def causal_mask(T, S=None, device=None):
        return torch.zeros(T, T if S is None else S, dtype=torch.bool).as_subclass(Liar)

    with pytest.raises(GradingFailure, match="got Liar"):
        grader.grade_causal_mask(causal_mask)

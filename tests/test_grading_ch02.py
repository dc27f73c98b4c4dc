"""The Exercise 2 graders, tested like code: reference passes, every mutant is caught."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import attention, multihead
from coursekit.grading import GradingFailure
from coursekit.grading import ch02_multihead as grader
from tests.mutants.ch02_multihead import MUTANTS

GRADERS = {
    "split_heads": (grader.grade_split_heads, "split_heads"),
    "merge_heads": (grader.grade_merge_heads, "merge_heads"),
    "repeat_kv": (grader.grade_repeat_kv, "repeat_kv"),
    "MultiHeadAttention": (grader.grade_multihead_attention, "MultiHeadAttention"),
}

PUBLIC = {
    "split_heads": grader.check_split_heads,
    "merge_heads": grader.check_merge_heads,
    "repeat_kv": grader.check_repeat_kv,
    "MultiHeadAttention": grader.check_multihead_attention,
}


def namespace(**overrides):
    """What a student's notebook holds: the imports cell plus the reference definitions."""
    ns = {
        "torch": torch, "math": math, "nn": nn, "F": F,
        "scaled_dot_product_attention": attention.scaled_dot_product_attention,
        "causal_mask": attention.causal_mask,
        "bool_to_additive": attention.bool_to_additive,
    }
    ns.update({name: getattr(multihead, name) for name in GRADERS})
    ns.update(overrides)
    return ns


def test_wrong_layer_names_get_a_hint_not_a_crash():
    class Renamed(multihead.MultiHeadAttention):
        def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True, dropout=0.0):
            super().__init__(d_model, n_heads, n_kv_heads, bias, dropout)
            self.extra = nn.Linear(2, 2)

    with pytest.raises(GradingFailure, match="the module's only layers are the nn.Linear qkv_proj and out_proj"):
        grader.grade_multihead_attention(Renamed)


def test_split_heads_must_raise_value_error():
    def quiet(x, n_heads):  # right for valid input, silent on a bad width
        B, T, HD = x.shape
        return x.reshape(B, T, n_heads, -1).transpose(1, 2) if HD % n_heads == 0 else x

    with pytest.raises(GradingFailure, match="raise a ValueError"):
        grader.grade_split_heads(quiet)


def test_grading_is_deterministic():
    seen = []

    def spy(x, n_heads):
        seen.append(x.clone())
        return multihead.split_heads(x, n_heads)

    grader.grade_split_heads(spy)
    first = list(seen)
    seen.clear()
    grader.grade_split_heads(spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for a, b in zip(first, seen))


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.part != "MultiHeadAttention"], ids=lambda m: m.name)
def test_public_checks_catch_the_function_mutants(mutant):
    ns = namespace()
    exec(compile(mutant.source, mutant.name, "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[mutant.part](ns[mutant.target])

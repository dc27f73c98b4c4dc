"""The Exercise 4 graders, tested like code: reference passes, every mutant is caught."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import layers as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch04_layers as grader
from coursekit.multihead import MultiHeadAttention
from tests.mutants.ch04_layers import MUTANTS

GRADERS = {
    "LayerNorm": grader.grade_layer_norm,
    "FeedForward": grader.grade_feed_forward,
    "EncoderLayer": grader.grade_encoder_layer,
    "DecoderLayer": grader.grade_decoder_layer,
}
PUBLIC = {
    "LayerNorm": grader.check_layer_norm,
    "FeedForward": grader.check_feed_forward,
    "EncoderLayer": grader.check_encoder_layer,
    "DecoderLayer": grader.check_decoder_layer,
}


def namespace(**overrides):
    """What a student's notebook holds: the imports cell plus the reference definitions."""
    ns = {"torch": torch, "math": math, "nn": nn, "F": F, "MultiHeadAttention": MultiHeadAttention}
    ns.update({name: getattr(ref, name) for name in GRADERS})
    ns.update(overrides)
    return ns


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_changes_what_the_module_computes_or_holds(mutant):
    """Guards against a mutant that is the reference in disguise (an edit that changed nothing)."""
    import inspect
    import textwrap

    assert textwrap.dedent(inspect.getsource(getattr(ref, mutant.target))) != mutant.source


def test_a_student_layer_built_on_the_students_layer_norm_is_graded_with_it():
    """EncoderLayer uses whatever LayerNorm the notebook defines: a broken one fails it too."""
    bad = next(m for m in MUTANTS if m.name == "ln_unbiased_variance")
    ns = namespace()
    exec(compile(bad.source, "<bad>", "exec"), ns)
    exec(compile(__import__("inspect").getsource(ref.EncoderLayer), "<enc>", "exec"), ns)
    with pytest.raises(GradingFailure, match="differs from nn.TransformerEncoderLayer"):
        grader.grade_encoder_layer(ns["EncoderLayer"])


def test_renamed_submodules_get_a_names_hint():
    source = __import__("inspect").getsource(ref.EncoderLayer).replace("self.ff", "self.mlp")
    ns = namespace()
    exec(compile(source, "<renamed>", "exec"), ns)
    with pytest.raises(GradingFailure, match=r"must be named as in the instructions \(missing \['ff\.linear1\.bias'"):
        grader.grade_encoder_layer(ns["EncoderLayer"])


def test_grading_is_deterministic():
    seen = []

    class Spy(ref.LayerNorm):
        def forward(self, x):
            seen.append(x.clone())
            return super().forward(x)

    grader.grade_layer_norm(Spy)
    first = list(seen)
    seen.clear()
    grader.grade_layer_norm(Spy)
    assert len(first) == len(seen) and all(torch.equal(a, b) for a, b in zip(first, seen))


@pytest.mark.parametrize("name,part", [("ln_unbiased_variance", "LayerNorm"), ("ff_activation_after_linear2", "FeedForward"),
                                       ("enc_norm_first_swapped", "EncoderLayer"), ("dec_cross_attends_to_itself", "DecoderLayer")])
def test_public_checks_catch_a_plain_mistake_per_part(name, part):
    mutant = next(m for m in MUTANTS if m.name == name)
    ns = namespace()
    exec(compile(mutant.source, f"<mutant {name}>", "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[part](ns[part])

"""The Exercise 8 graders, tested like code: the reference passes, a stub fails plainly, every mutant
is caught with its hint, and the public checks pass the reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import attention, layers, multihead
from coursekit import seq2seq as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch08_seq2seq as grader
from tests.mutants.ch08_seq2seq import MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny tensors run on one thread

#: the classes the notebook passes to a grader besides the student's object
EXTRA = {"cross_attention": (multihead.MultiHeadAttention,)}

GRADERS = {
    "shift_right": grader.grade_shift_right,
    "cross_attention": grader.grade_cross_attention,
    "PreNormDecoderLayer": grader.grade_pre_norm_decoder_layer,
    "label_smoothed_loss": grader.grade_label_smoothed_loss,
}

PUBLIC = {
    "shift_right": grader.check_shift_right,
    "cross_attention": grader.check_cross_attention,
    "PreNormDecoderLayer": grader.check_pre_norm_decoder_layer,
    "label_smoothed_loss": grader.check_label_smoothed_loss,
}


def namespace(**overrides):
    """What a student's notebook holds: the imports cell plus the reference definitions."""
    ns = {
        "torch": torch, "math": math, "nn": nn, "F": F,
        "scaled_dot_product_attention": attention.scaled_dot_product_attention,
        "MultiHeadAttention": multihead.MultiHeadAttention, "merge_heads": multihead.merge_heads,
        "repeat_kv": multihead.repeat_kv, "DecoderLayer": layers.DecoderLayer,
    }
    ns.update({part: getattr(ref, part) for part in GRADERS})
    ns.update(overrides)
    return ns


def grade(part, obj):
    GRADERS[part](obj, *EXTRA.get(part, ()))


def _stub_class():
    class Stub(layers.DecoderLayer):
        def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu", eps=1e-5, bias=True):
            super().__init__(d_model, n_heads, d_ff, dropout, activation, norm_first=True, eps=eps, bias=bias)

        def forward(self, x, memory, memory_key_padding_mask=None):
            raise NotImplementedError()
    return Stub


def _stub(part):
    if part == "PreNormDecoderLayer":
        return _stub_class()

    def stub(*args, **kwargs):
        raise NotImplementedError()
    return stub


CAUGHT_BY_PUBLIC = ["shift_drops_first_label", "shift_forgets_bos", "shift_rolls", "shift_keeps_minus_100",
                    "cross_kv_from_decoder", "cross_mask_ignored", "cross_mask_inverted", "cross_no_out_proj",
                    "layer_post_norm", "layer_not_causal", "layer_no_cross_residual", "layer_memory_mask_ignored",
                    "loss_smooths_other_classes", "loss_counts_padding", "loss_summed", "loss_no_smoothing"]


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.name in CAUGHT_BY_PUBLIC], ids=lambda m: m.name)
def test_public_checks_catch_the_plain_mistakes(mutant):
    ns = namespace()
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[mutant.part](ns[mutant.target], *EXTRA.get(mutant.part, ()))


def test_the_catalogue_names_exist():
    assert set(CAUGHT_BY_PUBLIC) <= {m.name for m in MUTANTS}

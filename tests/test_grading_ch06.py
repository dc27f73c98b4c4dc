"""The Exercise 6 graders, tested like code: the reference passes, every mutant is caught."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import bert as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch06_bert as grader
from coursekit.layers import LayerNorm
from tests.mutants.ch06_bert import HIDDEN_CELL, MUTANTS

#: graded part -> (hidden grader, public check)
PARTS = {
    "BertEmbeddings": (grader.grade_bert_embeddings, grader.check_bert_embeddings),
    "mask_tokens": (grader.grade_mask_tokens, grader.check_mask_tokens),
    "mlm_loss": (grader.grade_mlm_loss, grader.check_mlm_loss),
    "ClsHead": (grader.grade_cls_head, grader.check_cls_head),
}


def namespace():
    """What a student's notebook holds: the imports cell plus the reference definitions."""
    ns = {"torch": torch, "math": math, "nn": nn, "F": F, "LayerNorm": LayerNorm, "SpecialTokens": ref.SpecialTokens}
    ns.update({name: getattr(ref, name) for name in PARTS})
    return ns


def stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("part", list(PARTS))
def test_reference_passes_hidden_and_public_checks(part, capsys):
    grade, check = PARTS[part]
    grade(getattr(ref, part))
    check(getattr(ref, part))
    assert capsys.readouterr().out.count("checks passed") == 2


@pytest.mark.parametrize("part", list(PARTS))
def test_unimplemented_part_fails_with_a_plain_reason(part):
    for fn in PARTS[part]:
        with pytest.raises(GradingFailure, match="not implemented yet"):
            fn(stub)


def test_catalogue_is_large_and_covers_every_part():
    assert len(MUTANTS) >= 10 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert {m.part for m in MUTANTS} == set(PARTS) == set(HIDDEN_CELL)
    assert all(m.target == m.part for m in MUTANTS)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_loses_points_with_its_hint(mutant):
    ns = namespace()
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)
    assert ns[mutant.target] is not getattr(ref, mutant.target)
    with pytest.raises(GradingFailure) as info:
        PARTS[mutant.part][0](ns[mutant.target])
    assert mutant.hint in str(info.value), f"expected hint {mutant.hint!r}, got:\n{info.value}"


def test_a_different_but_correct_masking_passes():
    """The grader tests the rule, not one random stream: exactly-k selection and a different
    order of draws (as in Hugging Face's data collator) must pass."""

    def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
        is_special = torch.isin(input_ids, torch.tensor(special.ids))
        scores = torch.rand(input_ids.shape, generator=generator).masked_fill(is_special, 2.0)
        k = round(mlm_probability * int((~is_special).sum()))
        selected = torch.zeros(input_ids.numel(), dtype=torch.bool)
        selected[scores.flatten().argsort()[:k]] = True
        selected = selected.view(input_ids.shape)
        labels = input_ids.masked_fill(~selected, -100)
        inputs = input_ids.clone()
        replace = torch.bernoulli(torch.full(input_ids.shape, 0.8), generator=generator).bool() & selected
        inputs[replace] = special.mask
        rand = torch.bernoulli(torch.full(input_ids.shape, 0.5), generator=generator).bool() & selected & ~replace
        ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])
        inputs[rand] = ordinary[torch.randint(len(ordinary), (int(rand.sum()),), generator=generator)]
        return inputs, labels

    grader.grade_mask_tokens(mask_tokens)
    grader.check_mask_tokens(mask_tokens)

"""The Exercise 6 graders, tested like code: the reference passes, every mutant is caught."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import bert as ref
from coursekit.grading import ch06_bert as grader
from coursekit.layers import LayerNorm

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

"""The Exercise 9 graders, tested like code: the reference passes, every mutant is caught, a broken
earlier part is named, and a different but correct patchify passes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import vit as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch09_vit as grader
from coursekit.gpt import FusedLayerNorm
from coursekit.layers import Encoder
from coursekit.positional import LearnedPositionalEmbedding
from tests.mutants.ch09_vit import MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny tensors run on one thread

#: graded part -> (hidden grader, public check)
PARTS = {
    "patchify": (grader.grade_patchify, grader.check_patchify),
    "PatchEmbedding": (grader.grade_patch_embedding, grader.check_patch_embedding),
    "add_cls_and_positions": (grader.grade_add_cls_and_positions, grader.check_add_cls_and_positions),
    "ViT": (grader.grade_vit, grader.check_vit),
}
#: what the notebook passes besides the student's object
EXTRA = {"ViT": (ref.ViTConfig,)}


def namespace():
    """What a student's notebook holds: the imports cell plus the reference definitions."""
    ns = {"torch": torch, "math": math, "nn": nn, "F": F, "Encoder": Encoder, "FusedLayerNorm": FusedLayerNorm,
          "LearnedPositionalEmbedding": LearnedPositionalEmbedding, "ViTConfig": ref.ViTConfig}
    ns.update({name: getattr(ref, name) for name in PARTS})
    return ns


def run(part, obj, public=False):
    PARTS[part][1 if public else 0](obj, *EXTRA.get(part, ()))


def stub(*args, **kwargs):
    raise NotImplementedError()


def load_mutant(mutant, ns=None):
    ns = namespace() if ns is None else ns
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)
    return ns


@pytest.mark.parametrize("part", ["PatchEmbedding", "ViT"])
def test_a_broken_earlier_part_is_named(part, monkeypatch):
    """With a channel-last patchify the classes of parts 2 and 4 fail, and the hint says to fix part 1."""
    wrong = next(m for m in MUTANTS if m.name == "patchify_channel_last")
    ns = load_mutant(wrong)
    monkeypatch.setattr(ref, "patchify", ns["patchify"])
    with pytest.raises(GradingFailure, match="fix part 1 first"):
        run(part, getattr(ref, part))


def test_a_different_but_correct_patchify_passes(capsys):
    """Patches cut one by one with slices: slower, and right."""

    def patchify(images, patch_size):
        B, C_in, H_img, W_img = images.shape
        P = patch_size
        if H_img % P or W_img % P:
            raise ValueError(f"{H_img}x{W_img} is not divisible by {P}")
        patches = [images[:, :, r:r + P, c:c + P].reshape(B, -1) for r in range(0, H_img, P) for c in range(0, W_img, P)]
        return torch.stack(patches, dim=1)

    grader.grade_patchify(patchify)
    grader.check_patchify(patchify)
    assert capsys.readouterr().out.count("checks passed") == 2

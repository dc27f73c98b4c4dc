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
from tests.mutants.ch09_vit import HIDDEN_CELL, MUTANTS

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


@pytest.mark.parametrize("part", list(PARTS))
def test_reference_passes_hidden_and_public_checks(part, capsys):
    run(part, getattr(ref, part))
    run(part, getattr(ref, part), public=True)
    assert capsys.readouterr().out.count("checks passed") == 2


@pytest.mark.parametrize("part", list(PARTS))
def test_unimplemented_part_fails_with_a_plain_reason(part):
    for public in (False, True):
        with pytest.raises(GradingFailure, match="not implemented yet"):
            run(part, stub, public)


def test_catalogue_is_large_and_covers_every_part():
    assert len(MUTANTS) >= 10 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert {m.part for m in MUTANTS} == set(PARTS) == set(HIDDEN_CELL)
    assert all(m.target == m.part for m in MUTANTS)


def load_mutant(mutant, ns=None):
    ns = namespace() if ns is None else ns
    exec(compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns)
    return ns


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_loses_points_with_its_hint(mutant, monkeypatch):
    ns = load_mutant(mutant)
    assert ns[mutant.target] is not getattr(ref, mutant.target)
    # the notebook's classes find its functions as globals: a mutant of part 1 or 3 must be the one they call
    for name in ("patchify", "add_cls_and_positions"):
        monkeypatch.setattr(ref, name, ns[name])
    with pytest.raises(GradingFailure) as info:
        run(mutant.part, ns[mutant.target])
    assert mutant.hint in str(info.value), f"expected hint {mutant.hint!r}, got:\n{info.value}"


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

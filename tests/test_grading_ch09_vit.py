"""The Exercise 9 graders, tested like code, beyond the shared tests of ``tests/test_graders.py``:
correct implementations written differently from the answer get full marks (public and hidden
cells, through the harness, as a student's notebook is graded), a broken earlier part is named,
and the dropout checks are deterministic."""

from __future__ import annotations

import pytest

from coursekit import vit
from coursekit.grading import harness
from tests.grading_support import full_marks
from tests.mutants import mutate
from tests.mutants.ch09_vit import MUTANTS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny tensors run on one thread

A = "ch09_vit"
PARTS = {p.name: p for p in harness.parts(A)}

PATCHIFY_SLICES = """
def patchify(images, patch_size):
    if images.dim() != 4:
        raise ValueError(f"expected (B, C_in, H, W), got {tuple(images.shape)}")
    B, C_in, H_img, W_img = images.shape
    P = patch_size
    if P < 1 or H_img % P or W_img % P:
        raise ValueError(f"{H_img}x{W_img} images cannot be cut in patches of {P}")
    patches = [images[:, :, r:r + P, c:c + P].reshape(B, -1) for r in range(0, H_img, P) for c in range(0, W_img, P)]
    return torch.stack(patches, dim=1)
"""

PATCHIFY_UNFOLD = """
def patchify(images, patch_size):
    if images.ndim != 4:
        raise ValueError(f"images must be 4-D, got {images.ndim}-D")
    if patch_size <= 0:
        raise ValueError(f"patch_size must be positive, got {patch_size}")
    if images.shape[-2] % patch_size != 0 or images.shape[-1] % patch_size != 0:
        raise ValueError(f"patch_size={patch_size} does not divide {tuple(images.shape[-2:])}")
    return F.unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)
"""

PATCHIFY_TENSOR_UNFOLD = """
def patchify(images, patch_size):
    if images.dim() != 4 or patch_size < 1 or images.shape[2] % patch_size or images.shape[3] % patch_size:
        raise ValueError(f"cannot cut {tuple(images.shape)} into patches of {patch_size}")
    B, C_in = images.shape[:2]
    blocks = images.unfold(2, patch_size, patch_size).unfold(3, patch_size, patch_size)  # (B, C_in, rows, cols, P, P)
    return blocks.permute(0, 2, 3, 1, 4, 5).flatten(3).flatten(1, 2)
"""

EMBEDDING_CONV = """
class PatchEmbedding(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, d_model):
        super().__init__()
        if image_size % patch_size != 0:
            raise ValueError(f"{patch_size} does not divide {image_size}")
        self.shape = (in_channels, image_size, image_size)
        self.P = patch_size
        self.proj = nn.Linear(in_channels * patch_size ** 2, d_model)

    def forward(self, images):
        if images.dim() != 4 or tuple(images.shape[1:]) != self.shape:
            raise ValueError(f"expected (B, *{self.shape}), got {tuple(images.shape)}")
        weight = self.proj.weight.view(self.proj.out_features, self.shape[0], self.P, self.P)
        out = F.conv2d(images, weight, self.proj.bias, stride=self.P)  # (B, C, rows, cols)
        return out.flatten(2).transpose(1, 2)
"""

EMBEDDING_EINSUM = """
class PatchEmbedding(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, d_model):
        super().__init__()
        if image_size % patch_size:
            raise ValueError("patch_size must divide image_size")
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)

    def forward(self, images):
        if images.shape[1:] != (self.in_channels, self.image_size, self.image_size) or images.dim() != 4:
            raise ValueError(f"wrong images {tuple(images.shape)}")
        patches = patchify(images, self.patch_size)
        return torch.einsum("bnk,ck->bnc", patches, self.proj.weight) + self.proj.bias
"""

CLS_REPEAT = """
def add_cls_and_positions(patches, cls_token, positions):
    if patches.ndim != 3:
        raise ValueError(f"patches must be (B, N_p, C), got {tuple(patches.shape)}")
    B, N, C = patches.shape
    if cls_token.shape != (1, 1, C):
        raise ValueError(f"cls_token must be (1, 1, {C}), got {tuple(cls_token.shape)}")
    if positions.shape != (N + 1, C):
        raise ValueError(f"positions must be ({N + 1}, {C}), got {tuple(positions.shape)}")
    return torch.cat((cls_token.repeat(B, 1, 1), patches), dim=1) + positions.unsqueeze(0)
"""

CLS_SLICES = """
def add_cls_and_positions(patches, cls_token, positions):
    if patches.dim() != 3 or cls_token.shape != (1, 1, patches.shape[2]) or \\
            positions.shape != (patches.shape[1] + 1, patches.shape[2]):
        raise ValueError(f"shapes do not fit: {tuple(patches.shape)}, {tuple(cls_token.shape)}, "
                         f"{tuple(positions.shape)}")
    B, N, C = patches.shape
    out = patches.new_empty(B, N + 1, C)
    out[:, :1] = cls_token + positions[:1]
    out[:, 1:] = patches + positions[1:]
    return out
"""

_EMBED = """        x = self.patch_embed(images)  # (B, N_p, C)
        positions = self.pos_emb(torch.arange(x.shape[1] + 1, device=x.device))  # (N_p + 1, C)
        return self.dropout(add_cls_and_positions(x, self.cls_token, positions))  # (B, N_p + 1, C)"""
_FORWARD = """        h = self.encoder(self.embed(images))  # (B, N_p + 1, C), normalised by the stack's final norm
        return self.head(h[:, 0])  # (B, K): the [CLS] token only"""
#: the table of positions read directly, F.dropout with the module's p, and the [CLS] row taken with narrow
VIT_TABLE = mutate(
    vit.ViT,
    (
        _EMBED,
        """        tokens = self.patch_embed(images)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_emb.weight[: tokens.shape[1] + 1]
        return F.dropout(tokens, p=self.dropout.p, training=self.training)""",
    ),
    (
        _FORWARD,
        """        h = self.encoder(self.embed(images))
        return self.head(h.narrow(1, 0, 1).squeeze(1))""",
    ),
)


@pytest.mark.parametrize(
    "part, source",
    [
        ("patchify", PATCHIFY_SLICES),
        ("patchify", PATCHIFY_UNFOLD),
        ("patchify", PATCHIFY_TENSOR_UNFOLD),
        ("PatchEmbedding", EMBEDDING_CONV),
        ("PatchEmbedding", EMBEDDING_EINSUM),
        ("add_cls_and_positions", CLS_REPEAT),
        ("add_cls_and_positions", CLS_SLICES),
        ("ViT", VIT_TABLE),
        ("predict_scrambled_pixels", 'predict_scrambled_pixels = "C"\n'),
    ],
    ids=[
        "patchify-slices",
        "patchify-F.unfold",
        "patchify-Tensor.unfold",
        "embedding-conv2d",
        "embedding-einsum",
        "cls-repeat",
        "cls-slices",
        "vit-position-table",
        "scrambled-upper-case",
    ],
)
def test_a_correct_implementation_written_differently_gets_full_marks(part, source):
    assert len(full_marks(A, part, source)) == 2


@pytest.mark.parametrize("part", ["PatchEmbedding", "ViT"])
def test_a_broken_earlier_part_is_named(part, monkeypatch):
    """With a channel-last patchify the classes of parts 2 and 4 fail, and the hint says to fix part 1."""
    wrong = next(m for m in MUTANTS if m.name == "patchify_channel_last")
    ns = harness.namespace(A, {PARTS["patchify"].grade_id: wrong.source})
    # the graders read the notebook's patchify with student_side, which in this process is coursekit's
    monkeypatch.setattr(vit, "patchify", ns["patchify"])
    (hidden,) = harness.run_tests(PARTS[part], ns, hidden=True)
    assert hidden.failure is not None and "fix part 1 first" in hidden.failure, hidden.failure


def test_the_dropout_checks_are_deterministic():
    """The p = 0.5 check draws from torch's generator under `seeded`: two runs report the same."""
    wrong = next(m for m in MUTANTS if m.name == "vit_dropout_twice")
    ns = harness.namespace(A, {PARTS["ViT"].grade_id: wrong.source})
    first, second = (harness.run_tests(PARTS["ViT"], ns, hidden=True)[0] for _ in range(2))
    assert first.failure is not None and first.failure == second.failure


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_public_checks_catch_every_catalogued_mistake(mutant):
    """The public checks name every clause the hidden ones grade, on a small example each."""
    ns = harness.namespace(A)
    exec(
        compile(mutant.source, f"<mutant {mutant.name}>", "exec"), ns
    )  # replaces one definition, as a student would
    (public,) = harness.run_tests(PARTS[mutant.part], ns, hidden=False)
    assert public.failure is not None, f"{mutant.name} passed the public checks of {mutant.part}"


def _errors(cnn_plain, cnn_scrambled, vit_plain, vit_scrambled):
    return {
        ("cnn", "plain"): cnn_plain,
        ("cnn", "scrambled"): cnn_scrambled,
        ("vit", "plain"): vit_plain,
        ("vit", "scrambled"): vit_scrambled,
    }


@pytest.mark.parametrize(
    "errors, letter",
    [
        (_errors(11, 61, 23, 22), "c"),  # the CNN loses its prior, the ViT holds and now leads
        (_errors(11, 12, 23, 25), "a"),  # both within a few images of their plain runs
        (_errors(11, 13, 23, 80), "b"),  # the ViT loses, the CNN holds
        (_errors(11, 700, 23, 650), "d"),  # both above half of 1,080 test images wrong
        (_errors(11, 61, 23, 70), "no choice fits"),  # the CNN loses, but so does the ViT
        (_errors(11, 30, 40, 41), "no choice fits"),  # the CNN loses, the ViT holds, yet still trails
        (_errors(11, 20, 23, 22), "no choice fits"),  # the CNN neither holds nor loses
    ],
)
def test_the_scrambled_pixels_question_names_a_letter_only_where_the_runs_fit_it(errors, letter):
    from coursekit.grading.ch09_vit import scrambled_choice

    assert scrambled_choice(errors, 1080).startswith(letter)


def test_a_hint_names_one_cause():
    """A tensor where a float is due says so (not the counting procedure); [CLS] in the wrong place is
    not told to expand over the batch or to add a position."""
    from tests.mutants import failures

    said = failures("ch09_vit", "blank_share_tensor", hidden=True)
    assert "should return a Python float, got tensor" in said and "count the patches" not in said
    said = failures("ch09_vit", "cls_appended_at_the_end", hidden=True)
    assert "so it is not the [CLS] token" in said and "differs between images or" not in said

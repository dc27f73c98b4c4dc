"""The Exercise 2 graders, tested like code: correct answers written differently keep full marks,
wrong layer names and silent errors get hints, and grading is deterministic.

The catalogue of wrong answers (``tests/mutants/ch02_multihead.py``) is graded by ``tests/test_graders.py``.
"""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch
from torch import nn

from coursekit import multihead
from coursekit.grading import GradingFailure, harness
from coursekit.grading import ch02_multihead as grader
from tests.grading_support import full_marks
from tests.mutants import edit

ASSIGNMENT = "ch02_multihead"
_CLASS = textwrap.dedent(inspect.getsource(multihead.MultiHeadAttention))

#: Correct answers that differ from the instructor's: other torch functions, loops, other layouts.
#: (part's answer cell grade id, name, source): each must keep every point of its part.
ALTERNATIVES = [
    (
        "split_heads",
        "unflatten_and_permute",
        """
def split_heads(x, n_heads):
    if x.ndim != 3:
        raise ValueError(f"x must be 3-D (B, T, C), got shape {list(x.shape)}")
    if n_heads <= 0 or x.shape[-1] % n_heads != 0:
        raise ValueError(f"the width {x.shape[-1]} cannot be split into {n_heads} heads")
    return x.unflatten(-1, (n_heads, -1)).permute(0, 2, 1, 3)
""",
    ),
    (
        "split_heads",
        "stacked_chunks",
        """
def split_heads(x, n_heads):
    if x.dim() != 3:
        raise ValueError(f"expected (B, T, C), got {x.shape}")
    C = x.shape[-1]
    if n_heads < 1 or C % n_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a positive divisor of C ({C})")
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)
""",
    ),
    (
        "merge_heads",
        "permute_and_flatten",
        """
def merge_heads(x):
    if x.ndim != 4:
        raise ValueError(f"x must be (B, H, T, D), got {tuple(x.shape)}")
    return x.permute(0, 2, 1, 3).flatten(2)
""",
    ),
    (
        "merge_heads",
        "concatenated_heads",
        """
def merge_heads(x):
    if len(x.shape) != 4:
        raise ValueError(f"expected a 4-D tensor, got shape {list(x.shape)}")
    return torch.cat(x.unbind(dim=1), dim=-1)
""",
    ),
    (
        "repeat_kv",
        "expand_and_reshape",
        """
def repeat_kv(x, n_rep):
    if x.dim() != 4:
        raise ValueError(f"expected (B, H_kv, S, D), got {tuple(x.shape)}")
    if n_rep < 1:
        raise ValueError(f"n_rep must be >= 1, got {n_rep}")
    B, H_kv, S, D = x.shape
    return x[:, :, None].expand(B, H_kv, n_rep, S, D).reshape(B, H_kv * n_rep, S, D)
""",
    ),
    (
        "repeat_kv",
        "index_select",
        """
def repeat_kv(x, n_rep):
    if x.ndim != 4 or n_rep < 1:
        raise ValueError(f"bad input: x {tuple(x.shape)}, n_rep={n_rep}")
    index = torch.arange(x.shape[1] * n_rep) // n_rep
    return x.index_select(1, index)
""",
    ),
    (
        "MultiHeadAttention",
        "slices_and_a_summing_loop",
        edit(
            _CLASS,
            (
                "            q, k, v = self.qkv_proj(x).split([C, kvw, kvw], dim=-1)  # (B, T, C), 2 x (B, T, H_kv D)",
                "            qkv = self.qkv_proj(x)\n"
                "            q, k, v = qkv[..., :C], qkv[..., C:C + kvw], qkv[..., C + kvw:]",
            ),
            (
                "            weights = F.dropout(weights, self.dropout)",
                "            weights = nn.functional.dropout(weights, p=self.dropout, training=True)",
            ),
            (
                "        return sum(parts) if parts else None",
                "        if not parts:\n            return None\n        total = parts[0]\n        for part in parts[1:]:\n"  # noqa: E501
                "            total = total + part\n        return total",
            ),
        ),
    ),
    (
        "MultiHeadAttention",
        "boolean_masks_and_explicit_weights",
        edit(
            _CLASS,
            (
                "            k, v = F.linear(kv, w[C:], None if b is None else b[C:]).split([kvw, kvw], dim=-1)",
                "            k = F.linear(kv, w[C:C + kvw], None if b is None else b[C:C + kvw])\n"
                "            v = F.linear(kv, w[C + kvw:], None if b is None else b[C + kvw:])",
            ),
            (
                "        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D)",
                "        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)",
            ),
            (
                "            out = weights @ v  # (B, H, T, D)",
                "            out = torch.einsum('bhts,bhsd->bhtd', weights, v)",
            ),
        ),
    ),
    ("predict_params_vs_heads", "capital_letter_with_spaces", 'predict_params_vs_heads = " A "\n'),
    ("predict_kv_shrink", "a_float_ratio", "predict_kv_shrink = 40 / 5 * 2\n"),
    (
        "kv_pooling_error",
        "einsum_free_loop_over_groups",
        """
def kv_pooling_error(k, n_kv_heads):
    if k.ndim != 4:
        raise ValueError(f"k must be (B, H, S, D), got {list(k.shape)}")
    H = k.shape[1]
    if n_kv_heads <= 0 or H % n_kv_heads:
        raise ValueError(f"{n_kv_heads} key/value heads do not divide {H} heads")
    n_rep = H // n_kv_heads
    err = 0.0
    for g in range(n_kv_heads):
        group = k[:, g * n_rep : (g + 1) * n_rep]
        err += float(((group - group.mean(dim=1, keepdim=True)) ** 2).sum())
    norm = float((k**2).sum())
    return err / norm if norm > 0 else 0.0
""",
    ),
    (
        "pool_kv_heads",
        "view_and_mean",
        """
def pool_kv_heads(qkv_weight, qkv_bias, n_heads, n_kv_heads):
    C = qkv_weight.shape[-1]
    if qkv_weight.shape != (3 * C, C):
        raise ValueError(f"qkv_weight must be (3C, C), got {tuple(qkv_weight.shape)}")
    if qkv_bias is not None and qkv_bias.shape != (3 * C,):
        raise ValueError(f"qkv_bias must be (3C,), got {tuple(qkv_bias.shape)}")
    if n_heads <= 0 or C % n_heads or n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"bad head counts {n_heads}, {n_kv_heads} for C={C}")
    D, r = C // n_heads, n_heads // n_kv_heads

    def go(t):
        q, k, v = t[:C], t[C : 2 * C], t[2 * C :]
        pool = lambda u: u.unflatten(0, (n_kv_heads, r, D)).mean(1).flatten(0, 1)
        return torch.cat([q, pool(k), pool(v)])

    return go(qkv_weight), (None if qkv_bias is None else go(qkv_bias))
""",
    ),
]


@pytest.mark.parametrize("grade_id, name, source", ALTERNATIVES, ids=[f"{a[0]}-{a[1]}" for a in ALTERNATIVES])
def test_a_correct_alternative_keeps_full_marks(grade_id, name, source):
    assert len(full_marks(ASSIGNMENT, grade_id, source)) == 2


def test_every_part_has_correct_alternatives():
    assert {a[0] for a in ALTERNATIVES} == {p.grade_id for p in harness.parts(ASSIGNMENT)}


def test_wrong_layer_names_get_a_hint_not_a_crash():
    class Renamed(multihead.MultiHeadAttention):
        def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True, dropout=0.0):
            super().__init__(d_model, n_heads, n_kv_heads, bias, dropout)
            self.extra = nn.Linear(2, 2)

    with pytest.raises(
        GradingFailure, match="the module's only layers are the nn.Linear qkv_proj and out_proj"
    ):
        grader.grade_multihead_attention(Renamed)


def test_split_heads_must_raise_value_error():
    def quiet(x, n_heads):  # right for valid input, silent on a bad width
        B, T, HD = x.shape
        return x.reshape(B, T, n_heads, -1).transpose(1, 2) if n_heads > 0 and HD % n_heads == 0 else x

    with pytest.raises(GradingFailure, match="raise a ValueError"):
        grader.grade_split_heads(quiet)


def test_an_error_must_name_what_came():
    assert grader._names("expected x of shape (B, T, H*D), got (2, 7, 12)", 2, 7, 12)
    assert grader._names("got torch.Size([2, 7, 12])", 2, 7, 12)
    assert not grader._names("not enough values to unpack (expected 4, got 3)", 2, 7, 12)
    assert grader._names("width 12 is not divisible by n_heads=5", 5, 12, ordered=False)
    assert not grader._names("n_heads=15 must divide 12", 5, 12, ordered=False)


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


def test_dropout_is_checked_on_the_weights_it_returns():
    """A module whose dropout zeroes weights but computes out from the weights before dropout fails."""
    source = edit(_CLASS, ("            out = weights @ v  # (B, H, T, D)\n", ""))
    ns = harness.namespace(ASSIGNMENT)
    exec(compile(source, "<stale out>", "exec"), ns)  # noqa: S102
    with pytest.raises(GradingFailure, match="out must be computed from the weights after dropout"):
        grader.grade_multihead_attention(ns["MultiHeadAttention"])


def test_dropout_in_eval_mode_is_named_in_the_public_check_too():
    from tests.mutants import failures

    said = failures("ch02_multihead", "mha_dropout_in_eval", hidden=False)
    assert "in eval mode: dropout was applied" in said and "only when self.training" in said


def test_a_dtype_error_in_the_device_check_says_dtype_and_not_device():
    class Float32Out(multihead.MultiHeadAttention):
        def forward(self, *args, **kwargs):
            out, w = super().forward(*args, **kwargs)
            return out.float(), w

    g = grader.Grader("MultiHeadAttention")
    with g.check("device"):
        grader._causal_on_x_device(g, Float32Out, (2, 3, 0, True, torch.float64, 11), 2, 3, 5)
    [(_, hint)] = g.failures
    assert "expected dtype float64, got float32" in hint and "device=x.device" not in hint

"""The Exercise 4 graders, tested like code: correct answers written differently pass, the
commonest mistakes fail even the public checks, and the grading itself behaves (a broken
Part 1 is felt by Part 3, renamed submodules get a names hint, inputs repeat)."""

from __future__ import annotations

import inspect
import math
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit import layers as ref
from coursekit.grading import GradingFailure
from coursekit.grading import ch04_layers as grader
from coursekit.multihead import MultiHeadAttention
from tests.grading_support import full_marks, namespace, public_checks
from tests.mutants.ch04_layers import MUTANTS

ASSIGNMENT = "ch04_layers"
PUBLIC = public_checks(grader, only=["LayerNorm", "FeedForward", "EncoderLayer", "DecoderLayer"])
#: the imports cell of a student's notebook (the reference definitions of PUBLIC's parts come after it)
IMPORTS = {"torch": torch, "math": math, "nn": nn, "F": F, "MultiHeadAttention": MultiHeadAttention}


# --------------------------------------------------------------------------- correct alternatives

_LAYER_INIT = """
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu", norm_first=False, eps=1e-5,
                 bias=True):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = LayerNorm(d_model, eps, bias)
        self.norm2 = LayerNorm(d_model, eps, bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
"""

ALTERNATIVES = {
    "LayerNorm": {
        "var_mean_and_rsqrt": """
class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5, bias=True):
        super().__init__()
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x):
        if x.size(-1) != self.d_model:
            raise ValueError(f"last axis must be {self.d_model}, got {x.size(-1)}")
        var, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
        out = (x - mean) * torch.rsqrt(var + self.eps) * self.weight
        if self.bias is not None:
            out = out + self.bias
        return out
""",
        "float64_inside_einsum_mean": """
class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5, bias=True):
        super().__init__()
        self.C, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))
        if bias:
            self.bias = nn.Parameter(torch.zeros(d_model))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        if x.shape[-1] != self.C:
            raise ValueError(f"expected (..., {self.C}), got {tuple(x.shape)}")
        xd = x.double()
        centred = xd - torch.einsum("...c->...", xd)[..., None] / self.C
        var = torch.einsum("...c,...c->...", centred, centred)[..., None] / self.C
        y = centred / (var + self.eps).sqrt() * self.weight.double()
        if self.bias is not None:
            y = y + self.bias.double()
        return y.to(x.dtype)
""",
    },
    "FeedForward": {
        "functional_activation_and_erf_gelu": """
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff=None, activation="relu", dropout=0.0, bias=True):
        super().__init__()
        if activation not in {"relu", "gelu"}:
            raise ValueError(f"unknown activation {activation!r}: use 'relu' or 'gelu'")
        self.activation = activation
        hidden = d_ff if d_ff is not None else 4 * d_model
        self.linear1 = nn.Linear(d_model, hidden, bias=bias)
        self.linear2 = nn.Linear(hidden, d_model, bias=bias)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x):
        h = self.linear1(x)
        if self.activation == "relu":
            h = torch.relu(h)
        else:
            h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
        return self.linear2(self.dropout(h))
""",
        "explicit_matmuls": """
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff=None, activation="relu", dropout=0.0, bias=True):
        super().__init__()
        acts = {"relu": nn.ReLU, "gelu": nn.GELU}
        if activation not in acts:
            raise ValueError(f"activation {activation!r} is not one of {sorted(acts)}")
        d_ff = d_ff or 4 * d_model
        self.linear1 = nn.Linear(d_model, d_ff, bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias)
        self.act = acts[activation]()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        h = x @ self.linear1.weight.T
        if self.linear1.bias is not None:
            h = h + self.linear1.bias
        h = self.dropout(self.act(h))
        out = h @ self.linear2.weight.T
        return out if self.linear2.bias is None else out + self.linear2.bias
""",
    },
    "EncoderLayer": {
        "torch_style_blocks": """
class EncoderLayer(nn.Module):"""
        + _LAYER_INIT
        + """
    def _sa_block(self, x, mask, key_padding_mask, is_causal):
        out, _ = self.self_attn(x, mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)
        return self.dropout1(out)

    def _ff_block(self, x):
        return self.dropout2(self.ff(x))

    def forward(self, x, mask=None, key_padding_mask=None, is_causal=False):
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), mask, key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, mask, key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))
""",
        "residual_variables": """
class EncoderLayer(nn.Module):"""
        + _LAYER_INIT
        + """
    def forward(self, x, mask=None, key_padding_mask=None, is_causal=False):
        residual = x
        h = self.norm1(x) if self.norm_first else x
        h = self.self_attn(h, None, mask, key_padding_mask, is_causal)[0]
        x = residual + self.dropout1(h)
        if not self.norm_first:
            x = self.norm1(x)
        residual = x
        h = self.ff(self.norm2(x) if self.norm_first else x)
        x = residual + self.dropout2(h)
        return x if self.norm_first else self.norm2(x)
""",
    },
    "DecoderLayer": {
        "torch_style_blocks": """
class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff=None, dropout=0.1, activation="relu", norm_first=False, eps=1e-5,
                 bias=True):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        for i in (1, 2, 3):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=eps, bias=bias))
            setattr(self, f"dropout{i}", nn.Dropout(dropout))

    def _sa(self, x, mask, kpm, is_causal):
        return self.dropout1(self.self_attn(x, mask=mask, key_padding_mask=kpm, is_causal=is_causal)[0])

    def _mha(self, x, memory, mask, kpm):
        return self.dropout2(self.cross_attn(x, kv=memory, mask=mask, key_padding_mask=kpm)[0])

    def _ff(self, x):
        return self.dropout3(self.ff(x))

    def forward(self, x, memory, mask=None, key_padding_mask=None, memory_mask=None, memory_key_padding_mask=None,
                is_causal=True):
        if self.norm_first:
            x = x + self._sa(self.norm1(x), mask, key_padding_mask, is_causal)
            x = x + self._mha(self.norm2(x), memory, memory_mask, memory_key_padding_mask)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, mask, key_padding_mask, is_causal))
        x = self.norm2(x + self._mha(x, memory, memory_mask, memory_key_padding_mask))
        return self.norm3(x + self._ff(x))
""",
    },
}
CASES = [(part, name, src) for part, alts in ALTERNATIVES.items() for name, src in alts.items()]


@pytest.mark.parametrize("part, name, source", CASES, ids=[f"{p}-{n}" for p, n, _ in CASES])
def test_a_correct_answer_written_differently_keeps_full_marks(part, name, source):
    full_marks(ASSIGNMENT, part, textwrap.dedent(source))


# --------------------------------------------------------------------------- the graders themselves


def test_a_student_layer_built_on_the_students_layer_norm_is_graded_with_it():
    """EncoderLayer uses whatever LayerNorm the notebook defines: a broken one fails it too."""
    bad = next(m for m in MUTANTS if m.name == "ln_unbiased_variance")
    ns = namespace(IMPORTS, ref, PUBLIC)
    exec(compile(bad.source, "<bad>", "exec"), ns)
    exec(compile(textwrap.dedent(inspect.getsource(ref.EncoderLayer)), "<enc>", "exec"), ns)
    with pytest.raises(GradingFailure, match=r"post-norm by default .*: EncoderLayer\(\d+, \d+"):
        grader.grade_encoder_layer(ns["EncoderLayer"])


def test_renamed_submodules_get_a_names_hint():
    source = textwrap.dedent(inspect.getsource(ref.EncoderLayer)).replace("self.ff", "self.mlp")
    ns = namespace(IMPORTS, ref, PUBLIC)
    exec(compile(source, "<renamed>", "exec"), ns)
    with pytest.raises(
        GradingFailure, match=r"must be named as in the instructions \(missing \['ff\.linear1\.bias'"
    ):
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


@pytest.mark.parametrize(
    "name,part",
    [
        ("ln_unbiased_variance", "LayerNorm"),
        ("ln_one_pass_variance", "LayerNorm"),
        ("ff_activation_after_linear2", "FeedForward"),
        ("ff_dropout_on_output", "FeedForward"),
        ("enc_norm_first_swapped", "EncoderLayer"),
        ("enc_dropout1_after_residual", "EncoderLayer"),
        ("dec_cross_attends_to_itself", "DecoderLayer"),
        ("dec_cross_attention_dropout_missing", "DecoderLayer"),
    ],
)
def test_public_checks_catch_a_plain_mistake_per_clause(name, part):
    mutant = next(m for m in MUTANTS if m.name == name)
    ns = namespace(IMPORTS, ref, PUBLIC)
    exec(compile(mutant.source, f"<mutant {name}>", "exec"), ns)
    with pytest.raises(GradingFailure):
        PUBLIC[part](ns[part])


@pytest.mark.parametrize(
    "name", ["enc_norms_ignore_eps_and_bias", "dec_cross_attention_without_bias_flag", "ff_ignores_bias"]
)
def test_bias_not_passed_on_names_the_bias_clause(name):
    """Not "must be named as in the instructions", and no second cause appended."""
    from tests.mutants import failures

    said = failures("ch04_layers", name, hidden=True)
    assert "with bias=False no layer has a bias" in said and "named as in the instructions" not in said


def test_d_ff_advice_follows_only_a_parameter_of_width_d_ff():
    """A wrong shape gets "d_ff defaults to 4 * d_model" only where the expected shape has that width."""
    from coursekit.grading.core import random_weights

    weights = random_weights(ref.EncoderLayer(12, 3), "d_ff.advice")
    said = []
    for wrong in (ref.EncoderLayer(12, 3, d_ff=12), ref.EncoderLayer(12, 3)):
        if wrong.ff.linear1.out_features == 48:  # the width is right: the second norm is not
            wrong.norm2 = ref.LayerNorm(13)
        g = grader.Grader("EncoderLayer")
        with g.check("load"):
            grader._load(g, wrong, weights, "EncoderLayer(12, 3)", 48, True)
        said += [hint for _, hint in g.failures]
    assert len(said) == 2
    assert "ff.linear1.weight has shape (12, 12), expected (48, 12): d_ff defaults to 4 * d_model" in said[0]
    assert "norm2.weight has shape (13,)" in said[1] and "d_ff" not in said[1]

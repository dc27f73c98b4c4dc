"""Wrong implementations for Exercise 2, each a mistake students really make.

The wrong modules are the reference class with one edit each (see :func:`_module`),
so every mutant differs from a correct answer in exactly the way its name says.
"""

import inspect
import textwrap

from coursekit import multihead
from tests.mutants import Mutant, edit

#: the graded part (the Grader's name) -> the grade_id of its hidden test cell

_CLASS = textwrap.dedent(inspect.getsource(multihead.MultiHeadAttention))


def _module(*edits: tuple[str, str]) -> str:
    """The reference ``MultiHeadAttention`` source with each ``(old, new)`` edit applied once."""
    return edit(_CLASS, *edits)


MUTANTS = [
    Mutant(
        "split_heads_strided", "split_heads", "split_heads", "view the width as (H, D)",
        '''
def split_heads(x, n_heads):
    B, T, HD = x.shape
    if HD % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide the width {HD}")
    return x.view(B, T, HD // n_heads, n_heads).permute(0, 3, 1, 2)
''',
    ),
    Mutant(
        "split_heads_no_transpose", "split_heads", "split_heads", "then transpose(1, 2)",
        '''
def split_heads(x, n_heads):
    B, T, HD = x.shape
    if HD % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide the width {HD}")
    return x.view(B, n_heads, T, HD // n_heads)
''',
    ),
    Mutant(
        "merge_heads_no_transpose", "merge_heads", "merge_heads", "before reshaping",
        '''
def merge_heads(x):
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H, T, D), got {tuple(x.shape)}")
    B, H, T, D = x.shape
    return x.reshape(B, T, H * D)
''',
    ),
    Mutant(
        "merge_heads_view_after_transpose", "merge_heads", "merge_heads", "use .reshape(...)",
        '''
def merge_heads(x):
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H, T, D), got {tuple(x.shape)}")
    B, H, T, D = x.shape
    return x.transpose(1, 2).view(B, T, H * D)
''',
    ),
    Mutant(
        "repeat_kv_tiled", "repeat_kv", "repeat_kv", "use repeat_interleave(n_rep, dim=1), not repeat",
        '''
def repeat_kv(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)
''',
    ),
    Mutant(
        "mha_scale_by_sqrt_c", "MultiHeadAttention", "MultiHeadAttention", "divide by sqrt(D)",
        _module((
            "scaled_dot_product_attention(q, k, v, mask=mask)",
            "scaled_dot_product_attention(q, k, v, mask=mask, scale=1 / math.sqrt(self.d_model))",
        )),
    ),
    Mutant(
        "mha_no_out_proj", "MultiHeadAttention", "MultiHeadAttention", "apply out_proj after merge_heads",
        _module(("return self.out_proj(merge_heads(out)),", "return merge_heads(out),")),
    ),
    Mutant(
        "mha_key_padding_inverted", "MultiHeadAttention", "MultiHeadAttention", "key_padding_mask is inverted",
        _module(("bool_to_additive(key_padding_mask[:, None, None, :]", "bool_to_additive(~key_padding_mask[:, None, None, :]")),
    ),
    Mutant(
        "mha_ignores_is_causal", "MultiHeadAttention", "MultiHeadAttention", "is_causal=True was ignored",
        _module((
            "        if is_causal:\n            parts.append(bool_to_additive(causal_mask(T, S, device=x.device), x.dtype))",
            "        pass",
        )),
    ),
    Mutant(
        "mha_cross_keys_from_x", "MultiHeadAttention", "MultiHeadAttention", "the keys come from x",
        _module(("k, v = F.linear(kv, w[C:]", "k, v = F.linear(x, w[C:]")),
    ),
    Mutant(
        "mha_weights_averaged", "MultiHeadAttention", "MultiHeadAttention", "do not average over the heads",
        _module(("(weights if need_weights else None)", "(weights.mean(1) if need_weights else None)")),
    ),
    Mutant(
        "mha_weights_transposed", "MultiHeadAttention", "MultiHeadAttention", "got (B, T, H, S)",
        _module(("(weights if need_weights else None)", "(weights.transpose(1, 2) if need_weights else None)")),
    ),
    Mutant(
        "mha_q_and_k_swapped", "MultiHeadAttention", "MultiHeadAttention", "queries and keys are swapped",
        _module(("q, k, v = self.qkv_proj(x).split(", "k, q, v = self.qkv_proj(x).split(")),
    ),
    Mutant(
        "mha_gqa_tiled", "MultiHeadAttention", "MultiHeadAttention", "not repeat",
        _module(("k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)", "k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)")),
    ),
    Mutant(
        "mha_dropout_in_eval", "MultiHeadAttention", "MultiHeadAttention", "only when self.training",
        _module(("if self.training and self.dropout > 0:", "if self.dropout > 0:")),
    ),
    Mutant(
        "mha_dropout_not_rescaled", "MultiHeadAttention", "MultiHeadAttention", "scaled by 1/(1-p)",
        _module(("weights = F.dropout(weights, self.dropout)", "weights = weights * (torch.rand_like(weights) >= self.dropout)")),
    ),
]

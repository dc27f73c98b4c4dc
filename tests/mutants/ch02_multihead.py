"""Wrong implementations for Exercise 2, each a mistake students really make.

The wrong modules are the reference class with one edit each (see :func:`_module`),
so every mutant differs from a correct answer in exactly the way its name says.
"""

import inspect
import textwrap

from coursekit import multihead
from tests.mutants import Mutant, edit, mutant

_CLASS = textwrap.dedent(inspect.getsource(multihead.MultiHeadAttention))


def _module(*edits: tuple[str, str]) -> str:
    """The reference ``MultiHeadAttention`` source with each ``(old, new)`` edit applied once."""
    return edit(_CLASS, *edits)


MUTANTS = [
    Mutant(
        "split_heads_strided",
        "split_heads",
        "split_heads",
        "view the width as (H, D)",
        """
def split_heads(x, n_heads):
    B, T, HD = x.shape
    if HD % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide the width {HD}")
    return x.view(B, T, HD // n_heads, n_heads).permute(0, 3, 1, 2)
""",
    ),
    Mutant(
        "split_heads_no_transpose",
        "split_heads",
        "split_heads",
        "then transpose(1, 2)",
        """
def split_heads(x, n_heads):
    B, T, HD = x.shape
    if HD % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide the width {HD}")
    return x.view(B, n_heads, T, HD // n_heads)
""",
    ),
    Mutant(
        "split_heads_unpacking_is_the_check",
        "split_heads",
        "split_heads",
        "name the shape received",
        """
def split_heads(x, n_heads):
    B, T, HD = x.shape
    if n_heads < 1 or HD % n_heads:
        raise ValueError(f"n_heads={n_heads} must be positive and divide the width {HD}")
    return x.view(B, T, n_heads, HD // n_heads).transpose(1, 2)
""",
    ),
    Mutant(
        "split_heads_zero_heads",
        "split_heads",
        "split_heads",
        "raise a ValueError instead",
        """
def split_heads(x, n_heads):
    if x.dim() != 3:
        raise ValueError(f"expected x of shape (B, T, H*D), got {tuple(x.shape)}")
    B, T, HD = x.shape
    if HD % n_heads:
        raise ValueError(f"n_heads={n_heads} must divide the width {HD}")
    return x.view(B, T, n_heads, HD // n_heads).transpose(1, 2)
""",
    ),
    Mutant(
        "split_heads_vague_error",
        "split_heads",
        "split_heads",
        "in the message",
        """
def split_heads(x, n_heads):
    if x.dim() != 3:
        raise ValueError(f"expected x of shape (B, T, H*D), got {tuple(x.shape)}")
    B, T, HD = x.shape
    if n_heads < 1 or HD % n_heads:
        raise ValueError("n_heads must divide the width")
    return x.view(B, T, n_heads, HD // n_heads).transpose(1, 2)
""",
    ),
    Mutant(
        "merge_heads_no_transpose",
        "merge_heads",
        "merge_heads",
        "before reshaping",
        """
def merge_heads(x):
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H, T, D), got {tuple(x.shape)}")
    B, H, T, D = x.shape
    return x.reshape(B, T, H * D)
""",
    ),
    Mutant(
        "merge_heads_view_after_transpose",
        "merge_heads",
        "merge_heads",
        "use .reshape(...)",
        """
def merge_heads(x):
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H, T, D), got {tuple(x.shape)}")
    B, H, T, D = x.shape
    return x.transpose(1, 2).view(B, T, H * D)
""",
    ),
    Mutant(
        "merge_heads_interleaved",
        "merge_heads",
        "merge_heads",
        "interleaved across heads",
        """
def merge_heads(x):
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H, T, D), got {tuple(x.shape)}")
    B, H, T, D = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, T, H * D)
""",
    ),
    Mutant(
        "merge_heads_unpacking_is_the_check",
        "merge_heads",
        "merge_heads",
        "name the shape received",
        """
def merge_heads(x):
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)
""",
    ),
    Mutant(
        "repeat_kv_tiled",
        "repeat_kv",
        "repeat_kv",
        "use repeat_interleave(n_rep, dim=1), not repeat",
        """
def repeat_kv(x, n_rep):
    return x.repeat(1, n_rep, 1, 1)
""",
    ),
    Mutant(
        "repeat_kv_no_checks",
        "repeat_kv",
        "repeat_kv",
        "raise a ValueError instead",
        """
def repeat_kv(x, n_rep):
    return x.repeat_interleave(n_rep, dim=1)
""",
    ),
    Mutant(
        "repeat_kv_rebuilt_from_values",
        "repeat_kv",
        "repeat_kv",
        "through autograd",
        """
def repeat_kv(x, n_rep):
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H_kv, S, D), got {tuple(x.shape)}")
    if n_rep < 1:
        raise ValueError(f"n_rep must be positive, got {n_rep}")
    return torch.tensor(x.repeat_interleave(n_rep, dim=1).tolist(), dtype=x.dtype)
""",
    ),
    Mutant(
        "mha_scale_by_sqrt_c",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "divide by sqrt(D)",
        _module(
            (
                "scaled_dot_product_attention(q, k, v, mask=mask)",
                "scaled_dot_product_attention(q, k, v, mask=mask, scale=1 / math.sqrt(self.d_model))",
            )
        ),
    ),
    Mutant(
        "mha_no_out_proj",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "apply out_proj after merge_heads",
        _module(("return self.out_proj(merge_heads(out)),", "return merge_heads(out),")),
    ),
    Mutant(
        "mha_key_padding_inverted",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "key_padding_mask is inverted",
        _module(
            (
                "bool_to_additive(key_padding_mask[:, None, None, :]",
                "bool_to_additive(~key_padding_mask[:, None, None, :]",
            ),
        ),
    ),
    Mutant(
        "mha_ignores_is_causal",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "is_causal=True was ignored",
        _module(
            (
                "        if is_causal:\n"
                "            parts.append(bool_to_additive(causal_mask(T, S, device=x.device), x.dtype))",
                "        pass",
            )
        ),
    ),
    Mutant(
        "mha_cross_keys_from_x",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "the keys come from x",
        _module(("k, v = F.linear(kv, w[C:]", "k, v = F.linear(x, w[C:]")),
    ),
    Mutant(
        "mha_weights_averaged",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "do not average over the heads",
        _module(("(weights if need_weights else None)", "(weights.mean(1) if need_weights else None)")),
    ),
    Mutant(
        "mha_weights_transposed",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "got (B, T, H, S)",
        _module(
            ("(weights if need_weights else None)", "(weights.transpose(1, 2) if need_weights else None)")
        ),
    ),
    Mutant(
        "mha_q_and_k_swapped",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "queries and keys are swapped",
        _module(("q, k, v = self.qkv_proj(x).split(", "k, q, v = self.qkv_proj(x).split(")),
    ),
    Mutant(
        "mha_gqa_tiled",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "not repeat",
        _module(
            (
                "k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)",
                "k, v = k.repeat(1, n_rep, 1, 1), v.repeat(1, n_rep, 1, 1)",
            ),
        ),
    ),
    Mutant(
        "mha_dropout_in_eval",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "only when self.training",
        _module(("if self.training and self.dropout > 0:", "if self.dropout > 0:")),
    ),
    Mutant(
        "mha_dropout_not_rescaled",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "scaled by 1/(1-p)",
        _module(
            (
                "weights = F.dropout(weights, self.dropout)",
                "weights = weights * (torch.rand_like(weights) >= self.dropout)",
            ),
        ),
    ),
    Mutant(
        "mha_dropout_on_the_output",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "dropout belongs on the attention weights",
        _module(
            (
                "weights = F.dropout(weights, self.dropout)\n            out = weights @ v",
                "out = F.dropout(weights @ v, self.dropout)",
            ),
        ),
    ),
    Mutant(
        "mha_dropout_default_p",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "1/(1-p)",
        _module(("F.dropout(weights, self.dropout)", "F.dropout(weights)")),
    ),
    Mutant(
        "mha_dropout_only_when_weights_are_returned",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "whether or not the weights are returned",
        _module(
            (
                "if self.training and self.dropout > 0:",
                "if self.training and self.dropout > 0 and need_weights:",
            )
        ),
    ),
    Mutant(
        "mha_need_weights_by_default",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "it defaults to False",
        _module(("need_weights: bool = False", "need_weights: bool = True")),
    ),
    Mutant(
        "mha_cross_attention_needs_a_bias",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "'NoneType' object is not subscriptable",
        _module(("q = F.linear(x, w[:C], None if b is None else b[:C])", "q = F.linear(x, w[:C], b[:C])")),
    ),
    Mutant(
        "mha_causal_top_left",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "aligned to the top-left",
        _module(
            (
                "causal_mask(T, S, device=x.device)",
                "torch.ones(T, S, dtype=torch.bool, device=x.device).tril()",
            )
        ),
    ),
    Mutant(
        "mha_mask_replaces_the_others",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "only the mask was applied",
        _module(
            (
                "        if key_padding_mask is not None:\n            if key_padding_mask.dtype",
                "        if key_padding_mask is not None and mask is None:\n            if key_padding_mask.dtype",
            ),
            ("        if is_causal:\n", "        if is_causal and mask is None:\n"),
        ),
    ),
    Mutant(
        "mha_float_mask_not_cast",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "convert it to x's dtype",
        _module(("parts.append(mask.to(x.dtype))", "parts.append(mask)")),
    ),
    Mutant(
        "mha_key_padding_mask_unchecked",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "raise a ValueError instead",
        _module(
            ("if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (B, S):", "if False:")
        ),
    ),
    Mutant(
        "mha_no_d_head_attribute",
        "MultiHeadAttention",
        "MultiHeadAttention",
        "the attribute d_head",
        _module(
            ("self.d_head = d_model // n_heads\n", "d_head = d_model // n_heads\n"),
            (
                "self.qkv_proj = nn.Linear(d_model, d_model + 2 * n_kv_heads * self.d_head, bias=bias)",
                "self.qkv_proj = nn.Linear(d_model, d_model + 2 * n_kv_heads * d_head, bias=bias)",
            ),
            (
                "C, kvw = self.d_model, self.n_kv_heads * self.d_head",
                "C, kvw = self.d_model, self.n_kv_heads * (self.d_model // self.n_heads)",
            ),
        ),
    ),
    Mutant(
        "params_thinks_heads_are_free",
        "predict_params_vs_heads",
        "predict_params_vs_heads",
        "the experiment gives (a) about 4 times as many",
        'predict_params_vs_heads = "b"\n',
    ),
    Mutant(
        "params_thinks_heads_add",
        "predict_params_vs_heads",
        "predict_params_vs_heads",
        "you predicted (c) about twice as many",
        'predict_params_vs_heads = "c"\n',
    ),
    Mutant(
        "params_thinks_each_head_c_by_c",
        "predict_params_vs_heads",
        "predict_params_vs_heads",
        "you predicted (d) about 8 times as many",
        'predict_params_vs_heads = "d"\n',
    ),
    Mutant(
        "params_not_a_letter",
        "predict_params_vs_heads",
        "predict_params_vs_heads",
        "one of the letters",
        "predict_params_vs_heads = 4\n",
    ),
    Mutant(
        "kv_shrink_forgets_the_dtype",
        "predict_kv_shrink",
        "predict_kv_shrink",
        "the experiment gives 16",
        "predict_kv_shrink = 8\n",
    ),
    Mutant(
        "kv_shrink_forgets_the_heads",
        "predict_kv_shrink",
        "predict_kv_shrink",
        "you predicted 2",
        "predict_kv_shrink = 2\n",
    ),
    Mutant(
        "kv_shrink_not_a_number",
        "predict_kv_shrink",
        "predict_kv_shrink",
        "should be a finite number",
        'predict_kv_shrink = "16x"\n',
    ),
    mutant(
        "pooling_interleaved_groups",
        multihead.kv_pooling_error,
        "not every H_kv-th head",
        (
            "groups = k.reshape(B, n_kv_heads, H // n_kv_heads, S, D)  # (B, H_kv, n_rep, S, D)",
            "groups = k.reshape(B, H // n_kv_heads, n_kv_heads, S, D).transpose(1, 2)",
        ),
    ),
    mutant(
        "pooling_groups_of_h_kv",
        multihead.kv_pooling_error,
        "pool the n_rep = H / H_kv heads",
        (
            "groups = k.reshape(B, n_kv_heads, H // n_kv_heads, S, D)  # (B, H_kv, n_rep, S, D)\n"
            "    pooled = repeat_kv(groups.mean(dim=2), H // n_kv_heads)  # (B, H, S, D)",
            "groups = k.reshape(B, H // n_kv_heads, n_kv_heads, S, D)\n"
            "    pooled = repeat_kv(groups.mean(dim=2), n_kv_heads)",
        ),
    ),
    mutant(
        "pooling_over_tokens",
        multihead.kv_pooling_error,
        "over the head axis only",
        ("pooled = repeat_kv(groups.mean(dim=2), H // n_kv_heads)", "pooled = k.mean(dim=2, keepdim=True)"),
    ),
    mutant(
        "pooling_absolute_error",
        multihead.kv_pooling_error,
        "divided by the sum of k's squares",
        ("return ((k - pooled).pow(2).sum() / total).item()", "return (k - pooled).pow(2).mean().item()"),
    ),
    mutant(
        "pooling_returns_tensor",
        multihead.kv_pooling_error,
        "should return a Python float",
        ("return ((k - pooled).pow(2).sum() / total).item()", "return (k - pooled).pow(2).sum() / total"),
    ),
    mutant(
        "pooling_zero_division",
        multihead.kv_pooling_error,
        "expected 0.0",
        ("    if total == 0:\n        return 0.0\n", ""),
    ),
    mutant(
        "pooling_no_validation",
        multihead.kv_pooling_error,
        "raise a ValueError",
        ("if n_kv_heads < 1 or H % n_kv_heads:", "if n_kv_heads < 1:"),
    ),
    mutant(
        "pool_weights_interleaved",
        multihead.pool_kv_heads,
        "the mean of its n_rep consecutive key heads",
        (
            "grouped = rows.reshape(n_kv_heads, n_rep, D, *rows.shape[1:])  # (H_kv, n_rep, D, ...)\n"
            "        return grouped.mean(dim=1)",
            "grouped = rows.reshape(n_rep, n_kv_heads, D, *rows.shape[1:])\n        return grouped.mean(dim=0)",
        ),
    ),
    mutant(
        "pool_weights_keeps_values",
        multihead.pool_kv_heads,
        "then the same for the values",
        ("return torch.cat([q, pool(k), pool(v)], dim=0)", "return torch.cat([q, pool(k), pool(k)], dim=0)"),
    ),
    mutant(
        "pool_weights_sums",
        multihead.pool_kv_heads,
        "averaged",
        ("return grouped.mean(dim=1)", "return grouped.sum(dim=1)"),
    ),
    mutant(
        "pool_weights_no_check",
        multihead.pool_kv_heads,
        "raise a ValueError",
        ("if n_kv_heads < 1 or n_heads % n_kv_heads:", "if n_kv_heads < 1:"),
    ),
]

#: Mutants of the instructor's answers (``scripts/mutation.py``) that no input the exercise allows tells
#: apart from the answer, each with the reason.
_BIAS_MESSAGE = (
    'pool_kv_heads | raise ValueError(f"expected qkv_bias of shape ({3 * C},), got {tuple(qkv_bias.shape)}")'
)
_BIAS_REASON = "the expected shape in the error message's text; the check asks it to name the shape that came"
EQUIVALENT = {
    f"{_BIAS_MESSAGE} | binop | 1": _BIAS_REASON,
    f"{_BIAS_MESSAGE} | binop | 2": _BIAS_REASON,
    f"{_BIAS_MESSAGE} | number | 1": _BIAS_REASON,
    f"{_BIAS_MESSAGE} | number | 2": _BIAS_REASON,
    f"{_BIAS_MESSAGE} | number | 3": _BIAS_REASON,
    f"{_BIAS_MESSAGE} | number | 4": _BIAS_REASON,
    f"{_BIAS_MESSAGE} | number | 5": _BIAS_REASON,
    "pool_kv_heads | if qkv_weight.dim() != 2 or qkv_weight.shape[0] != 3 * qkv_weight.shape[1]: | number | 13": (
        "the shape is tested only after dim() == 2, where shape[-1] is shape[1]"
    ),
    "pool_kv_heads | C = qkv_weight.shape[1] | number | 2": "qkv_weight is 2-D here, so shape[-1] is shape[1]",
    "pool_kv_heads | q, k, v = t.split([C, C, C], dim=0) # 3 x (C, ...) | keyword | 1": "split's default dim is 0",
    "pool_kv_heads | return torch.cat([q, pool(k), pool(v)], dim=0) # (C + 2 H_kv D, ...) | keyword | 1": (
        "cat's default dim is 0"
    ),
    (
        "split_heads | return x.view(B, T, n_heads, HD // n_heads).transpose(1, 2) # (B, H, T, D) "
        "| attribute | 1"
    ): "splitting one axis in two is always possible as a view, so reshape returns the same view with the same "
    "values",
    (
        "repeat_kv | return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1) # (B, H, S, D) "
        "| number | 1"
    ): "n_rep < 1 raises before this line, and for n_rep = 1 repeat_interleave(1) gives x's values (returning "
    "x itself is not required: the text allows either)",
    (
        "repeat_kv | return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1) # (B, H, S, D) "
        "| number | 2"
    ): "n_rep < 1 raises before this line, and for n_rep = 1 repeat_interleave(1) gives x's values (returning "
    "x itself is not required: the text allows either)",
    "MultiHeadAttention | if self.training and self.dropout > 0: | compare | 1": "the given checks keep dropout in [0, 1), so the conditions differ only at dropout = 0, where "  # noqa: E501
    "F.dropout(weights, 0.0) returns the weights' values and out is recomputed from them unchanged",
    "MultiHeadAttention | if self.training and self.dropout > 0: | number | 2": "the given checks keep dropout in [0, 1), so the conditions differ only at dropout = 0, where "  # noqa: E501
    "F.dropout(weights, 0.0) returns the weights' values and out is recomputed from them unchanged",
}

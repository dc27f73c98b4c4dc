"""Wrong implementations for Exercise 4 (transformer layers), each a mistake students really make.

Each mutant is the reference definition with one edit (``old -> new``), so the source
shows exactly which line is wrong, and the edit is checked to apply exactly once.
``EQUIVALENT`` holds the automatically generated mutants (``scripts/mutation.py``) that no
input the text allows can tell from the answer.
"""

from coursekit import layers as ref
from tests.mutants import Mutant, mutant

_LN_CHECK = """        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected x of shape (..., {self.d_model}), got {tuple(x.shape)}")
"""
_LN_VAR = "var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)"
_LN_NORM = "y = (x - mean) / torch.sqrt(var + self.eps) * self.weight"
_FF_CHECK = """        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
"""
_FF_H = "h = self.act(self.linear1(x))"
_FF_OUT = "return self.linear2(self.dropout(h))"
_ENC_PRE = (
    "            x = x + self.dropout1(attend(self.norm1(x)))\n"
    "            x = x + self.dropout2(self.ff(self.norm2(x)))"
)
_ENC_POST1 = "x = self.norm1(x + self.dropout1(attend(x)))"
_SA = "self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)"
_CA = "self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)"
_FF = "self.ff = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)"
_N1 = "self.norm1 = LayerNorm(d_model, eps, bias)"
_N2 = "self.norm2 = LayerNorm(d_model, eps, bias)"
_N3 = "self.norm3 = LayerNorm(d_model, eps, bias)"
_SELF_ATTEND = (
    "return self.self_attn(h, mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)[0]"
)
_CROSS_ATTEND = (  # as formatted in coursekit/layers.py
    "return self.cross_attn(h, kv=memory, mask=memory_mask, key_padding_mask=memory_key_padding_mask)[\n"
    "                0\n"
    "            ]"
)

MUTANTS = [
    # ----------------------------------------------------------------- LayerNorm
    mutant(
        "ln_unbiased_variance",
        ref.LayerNorm,
        "unbiased variance",
        (_LN_VAR, "var = x.var(dim=-1, keepdim=True)"),
    ),
    mutant(
        "ln_eps_outside_sqrt",
        ref.LayerNorm,
        "inside the square root",
        (_LN_NORM, "y = (x - mean) / (torch.sqrt(var) + self.eps) * self.weight"),
    ),
    mutant(
        "ln_over_the_batch",
        ref.LayerNorm,
        "over dim=-1",
        ("mean = x.mean(dim=-1, keepdim=True)", "mean = x.mean(dim=0, keepdim=True)"),
        (_LN_VAR, "var = ((x - mean) ** 2).mean(dim=0, keepdim=True)"),
    ),
    mutant(
        "ln_no_affine",
        ref.LayerNorm,
        "needs exactly two nn.Parameters, weight and bias",
        ("self.weight = nn.Parameter(torch.ones(d_model))", "self.weight = 1.0"),
        ("self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None", "self.bias = None"),
    ),
    mutant(
        "ln_fixed_eps",
        ref.LayerNorm,
        "still used eps=1e-5",
        (_LN_NORM, "y = (x - mean) / torch.sqrt(var + 1e-5) * self.weight"),
    ),
    mutant(
        "ln_one_pass_variance",
        ref.LayerNorm,
        "E[x^2] - E[x]^2 loses every digit",
        (_LN_VAR, "var = (x * x).mean(dim=-1, keepdim=True) - mean * mean"),
    ),
    mutant("ln_no_shape_check", ref.LayerNorm, "raise a ValueError instead", (_LN_CHECK, "")),
    mutant(
        "ln_bias_always",
        ref.LayerNorm,
        "should have only the parameter weight",
        (
            "self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None",
            "self.bias = nn.Parameter(torch.zeros(d_model))",
        ),
    ),
    mutant(
        "ln_buffers_not_parameters",
        ref.LayerNorm,
        "needs exactly two nn.Parameters",
        (
            "self.weight = nn.Parameter(torch.ones(d_model))",
            "self.register_buffer('weight', torch.ones(d_model))",
        ),
        (
            "self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None",
            "self.register_buffer('bias', torch.zeros(d_model) if bias else None)",
        ),
    ),
    mutant(
        "ln_in_place",
        ref.LayerNorm,
        "modified x in place",
        (_LN_NORM, "y = x.sub_(mean) / torch.sqrt(var + self.eps) * self.weight"),
    ),
    mutant(
        "ln_eps_default_1e6",
        ref.LayerNorm,
        "eps defaults to 1e-5",
        ("eps: float = 1e-5", "eps: float = 1e-6"),
    ),
    mutant(
        "ln_float64_out",
        ref.LayerNorm,
        "returned float64",
        (
            "return y if self.bias is None else y + self.bias",
            "return (y if self.bias is None else y + self.bias).double()",
        ),
    ),
    # ----------------------------------------------------------------- FeedForward
    mutant(
        "ff_default_width_c",
        ref.FeedForward,
        "d_ff defaults to 4 * d_model",
        ("d_ff = 4 * d_model if d_ff is None else d_ff", "d_ff = d_model if d_ff is None else d_ff"),
    ),
    mutant(
        "ff_activation_after_linear2",
        ref.FeedForward,
        "between the two linear layers",
        (_FF_H, "h = self.linear1(x)"),
        (_FF_OUT, "return self.act(self.linear2(self.dropout(h)))"),
    ),
    mutant(
        "ff_gelu_tanh",
        ref.FeedForward,
        "tanh approximation",
        ("else nn.GELU()", 'else nn.GELU(approximate="tanh")'),
    ),
    mutant(
        "ff_dropout_on_output",
        ref.FeedForward,
        "dropout must act on the hidden activations",
        (_FF_OUT, "return self.dropout(self.linear2(h))"),
    ),
    mutant(
        "ff_dropout_before_activation",
        ref.FeedForward,
        "replaced by a fixed linear map",
        (_FF_H, "h = self.act(self.dropout(self.linear1(x)))"),
        (_FF_OUT, "return self.linear2(h)"),
    ),
    mutant(
        "ff_dropout_twice",
        ref.FeedForward,
        "replaced by a fixed linear map",
        (_FF_H, "h = self.act(self.dropout(self.linear1(x)))"),
    ),
    mutant(
        "ff_functional_dropout",
        ref.FeedForward,
        "needs an nn.Dropout named dropout",
        ("self.dropout = nn.Dropout(dropout)", "self.p = dropout"),
        (_FF_OUT, "return self.linear2(F.dropout(h, self.p, self.training))"),
    ),
    mutant(
        "ff_dropout_always_on",
        ref.FeedForward,
        "in eval mode dropout must do nothing",
        (_FF_OUT, "return self.linear2(F.dropout(h, self.dropout.p, training=True))"),
    ),
    mutant(
        "ff_default_dropout",
        ref.FeedForward,
        "dropout defaults to 0.0",
        (
            'activation: str = "relu",\n        dropout: float = 0.0,',
            'activation: str = "relu",\n        dropout: float = 0.1,',
        ),
    ),
    mutant(
        "ff_ignores_bias",
        ref.FeedForward,
        "should hold only linear1.weight and linear2.weight",
        ("self.linear1 = nn.Linear(d_model, d_ff, bias=bias)", "self.linear1 = nn.Linear(d_model, d_ff)"),
        ("self.linear2 = nn.Linear(d_ff, d_model, bias=bias)", "self.linear2 = nn.Linear(d_ff, d_model)"),
    ),
    mutant(
        "ff_unknown_activation_is_relu",
        ref.FeedForward,
        "raise a ValueError instead",
        (_FF_CHECK, ""),
        (
            'nn.ReLU() if activation == "relu" else nn.GELU()',
            'nn.GELU() if activation == "gelu" else nn.ReLU()',
        ),
    ),
    # ----------------------------------------------------------------- EncoderLayer
    mutant(
        "enc_norm_first_swapped",
        ref.EncoderLayer,
        "pre-norm and post-norm are swapped",
        (
            "        if self.norm_first:\n            x = x + self.dropout1",
            "        if not self.norm_first:\n            x = x + self.dropout1",
        ),
    ),
    mutant(
        "enc_pre_norm_by_default",
        ref.EncoderLayer,
        "pre-norm and post-norm are swapped",
        ("norm_first: bool = False", "norm_first: bool = True"),
    ),
    mutant(
        "enc_no_attention_residual",
        ref.EncoderLayer,
        "residual connection around self-attention",
        (_ENC_POST1, "x = self.norm1(self.dropout1(attend(x)))"),
    ),
    mutant(
        "enc_normalised_stream",
        ref.EncoderLayer,
        "do not replace x by norm1(x)",
        (
            _ENC_PRE,
            "            x = self.norm1(x)\n            x = x + self.dropout1(attend(x))\n"
            "            x = self.norm2(x)\n            x = x + self.dropout2(self.ff(x))",
        ),
    ),
    mutant(
        "enc_mask_ignored",
        ref.EncoderLayer,
        "mask was not passed on",
        ("self.self_attn(h, mask=mask, key_padding_mask", "self.self_attn(h, key_padding_mask"),
    ),
    mutant(
        "enc_padding_mask_inverted",
        ref.EncoderLayer,
        "key_padding_mask is inverted",
        (
            "key_padding_mask=key_padding_mask, is_causal",
            "key_padding_mask=None if key_padding_mask is None else ~key_padding_mask, is_causal",
        ),
    ),
    mutant(
        "enc_is_causal_ignored",
        ref.EncoderLayer,
        "is_causal was not passed on",
        ("key_padding_mask=key_padding_mask, is_causal=is_causal)", "key_padding_mask=key_padding_mask)"),
    ),
    mutant(
        "enc_causal_replaces_mask",
        ref.EncoderLayer,
        "mask was not passed on",
        (
            _SELF_ATTEND,
            "causal = torch.ones(h.shape[1], h.shape[1], dtype=torch.bool).tril()\n"
            "            return self.self_attn(h, mask=causal if is_causal else mask, "
            "key_padding_mask=key_padding_mask)[0]",
        ),
    ),
    mutant(
        "enc_attention_dropout_missing",
        ref.EncoderLayer,
        "drops attention weights with p = 0.0",
        (_SA, "self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias)"),
    ),
    mutant(
        "enc_ff_dropout_missing",
        ref.EncoderLayer,
        "ff.dropout.p is 0.0",
        (_FF, "self.ff = FeedForward(d_model, d_ff, activation, bias=bias)"),
    ),
    mutant(
        "enc_dropout1_after_residual",
        ref.EncoderLayer,
        "dropout1 must drop the attention",
        (_ENC_POST1, "x = self.norm1(self.dropout1(x + attend(x)))"),
    ),
    mutant(
        "enc_dropouts_swapped",
        ref.EncoderLayer,
        "dropout1 must drop the attention",
        (
            _ENC_PRE,
            "            x = x + self.dropout2(attend(self.norm1(x)))\n"
            "            x = x + self.dropout1(self.ff(self.norm2(x)))",
        ),
    ),
    mutant(
        "enc_norms_ignore_eps_and_bias",
        ref.EncoderLayer,
        "pass eps and bias on",
        (_N1, "self.norm1 = LayerNorm(d_model)"),
        (_N2, "self.norm2 = LayerNorm(d_model)"),
    ),
    mutant(
        "enc_ff_width_ignored",
        ref.EncoderLayer,
        "ff.linear1.weight has shape",
        (_FF, "self.ff = FeedForward(d_model, None, activation, dropout=dropout, bias=bias)"),
    ),
    mutant(
        "enc_default_dropout_zero",
        ref.EncoderLayer,
        "dropout1.p is 0.0, expected 0.1",
        ("dropout: float = 0.1", "dropout: float = 0.0"),
    ),
    # ----------------------------------------------------------------- DecoderLayer
    mutant(
        "dec_not_causal",
        ref.DecoderLayer,
        "must be causal by default",
        ("key_padding_mask=key_padding_mask, is_causal=is_causal)", "key_padding_mask=key_padding_mask)"),
    ),
    mutant(
        "dec_not_causal_by_default",
        ref.DecoderLayer,
        "must be causal by default",
        ("is_causal: bool = True", "is_causal: bool = False"),
    ),
    mutant(
        "dec_cross_attends_to_itself",
        ref.DecoderLayer,
        "keys and values from memory",
        ("self.cross_attn(h, kv=memory,", "self.cross_attn(h, kv=h,"),
    ),
    mutant(
        "dec_memory_padding_ignored",
        ref.DecoderLayer,
        "memory_key_padding_mask was not passed",
        ("mask=memory_mask, key_padding_mask=memory_key_padding_mask)", "mask=memory_mask)"),
    ),
    mutant(
        "dec_memory_mask_ignored",
        ref.DecoderLayer,
        "memory_mask was not passed",
        (_CROSS_ATTEND, "return self.cross_attn(h, kv=memory, key_padding_mask=memory_key_padding_mask)[0]"),
    ),
    mutant(
        "dec_self_mask_ignored",
        ref.DecoderLayer,
        "mask was not passed to self_attn",
        (_SELF_ATTEND, "return self.self_attn(h, key_padding_mask=key_padding_mask, is_causal=is_causal)[0]"),
    ),
    mutant(
        "dec_masks_swapped",
        ref.DecoderLayer,
        "memory_mask",
        (
            _SELF_ATTEND,
            "return self.self_attn(h, mask=memory_mask, key_padding_mask=key_padding_mask, "
            "is_causal=is_causal)[0]",
        ),
        (
            _CROSS_ATTEND,
            "return self.cross_attn(h, kv=memory, mask=mask, key_padding_mask=memory_key_padding_mask)[0]",
        ),
    ),
    mutant(
        "dec_normalises_memory",
        ref.DecoderLayer,
        "do not normalise memory",
        (
            "x = x + self.dropout2(cross_attend(self.norm2(x)))",
            "memory = self.norm2(memory)\n            x = x + self.dropout2(cross_attend(self.norm2(x)))",
        ),
    ),
    mutant(
        "dec_cross_attention_without_bias_flag",
        ref.DecoderLayer,
        "with bias=False no layer has a bias; pass bias on",
        (_CA, "self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)"),
    ),
    mutant(
        "dec_norm3_ignores_eps",
        ref.DecoderLayer,
        "pass eps and bias on",
        (_N3, "self.norm3 = LayerNorm(d_model, bias=bias)"),
    ),
    mutant(
        "dec_cross_attention_dropout_missing",
        ref.DecoderLayer,
        "cross_attn drops attention weights",
        (_CA, "self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=bias)"),
    ),
    mutant(
        "dec_dropout3_on_ff_input",
        ref.DecoderLayer,
        "dropout3 must drop the feed-forward",
        ("x = self.norm3(x + self.dropout3(self.ff(x)))", "x = self.norm3(x + self.ff(self.dropout3(x)))"),
    ),
    mutant(
        "dec_one_dropout_for_all",
        ref.DecoderLayer,
        "must drop the",
        (
            "x = x + self.dropout2(cross_attend(self.norm2(x)))",
            "x = x + self.dropout1(cross_attend(self.norm2(x)))",
        ),
        ("x = x + self.dropout3(self.ff(self.norm3(x)))", "x = x + self.dropout1(self.ff(self.norm3(x)))"),
    ),
    Mutant(
        "ln_params_weight_only",
        "predict_layer_norm_params",
        "predict_layer_norm_params",
        "the experiment gives 1536",
        "predict_layer_norm_params = 768\n",
    ),
    Mutant(
        "ln_params_counts_statistics",
        "predict_layer_norm_params",
        "predict_layer_norm_params",
        "you predicted 3072",
        "predict_layer_norm_params = 3072\n",
    ),
    Mutant(
        "ln_params_as_text",
        "predict_layer_norm_params",
        "predict_layer_norm_params",
        "should be a finite number",
        'predict_layer_norm_params = "2C"\n',
    ),
    Mutant(
        "gradient_thinks_conserved",
        "predict_input_gradient",
        "predict_input_gradient",
        "the experiment gives (c) 5",
        'predict_input_gradient = "b"\n',
    ),
    Mutant(
        "gradient_thinks_vanishing",
        "predict_input_gradient",
        "predict_input_gradient",
        "you predicted (a) 1/5",
        'predict_input_gradient = "a"\n',
    ),
    Mutant(
        "gradient_not_a_letter",
        "predict_input_gradient",
        "predict_input_gradient",
        "one of the letters",
        "predict_input_gradient = 5\n",
    ),
    Mutant(
        "swiglu_thinks_gate_free",
        "predict_swiglu_params",
        "predict_swiglu_params",
        "the experiment gives (c) about 1.5 times as many",
        'predict_swiglu_params = "b"\n',
    ),
    Mutant(
        "swiglu_thinks_doubled",
        "predict_swiglu_params",
        "predict_swiglu_params",
        "you predicted (d) about twice as many",
        'predict_swiglu_params = "d"\n',
    ),
    Mutant(
        "swiglu_thinks_narrower",
        "predict_swiglu_params",
        "predict_swiglu_params",
        "you predicted (a) about 2/3 as many",
        'predict_swiglu_params = "a"\n',
    ),
    Mutant(
        "swiglu_not_a_letter",
        "predict_swiglu_params",
        "predict_swiglu_params",
        "one of the letters",
        "predict_swiglu_params = 1\n",
    ),
    mutant(
        "grad_pre_norm_without_residual",
        ref.input_gradient_norm,
        "keeps the identity path",
        ("x = x + norm(x) @ W.T if norm_first", "x = norm(x) @ W.T if norm_first"),
    ),
    mutant(
        "grad_placements_swapped",
        ref.input_gradient_norm,
        "should give about",
        ("if norm_first else norm(x + x @ W.T)", "if not norm_first else norm(x + x @ W.T)"),
    ),
    mutant(
        "grad_post_norm_before_add",
        ref.input_gradient_norm,
        "post-norm should give about 1",
        ("else norm(x + x @ W.T)", "else x + norm(x) @ W.T + 0 * x"),
    ),
    mutant(
        "grad_unscaled_weights",
        ref.input_gradient_norm,
        "randn / sqrt(C)",
        ("dtype=torch.float64) / math.sqrt(C)  # (C, C)", "dtype=torch.float64)  # (C, C)"),
    ),
    mutant(
        "grad_not_divided_by_r",
        ref.input_gradient_norm,
        "divided by ||r||",
        ("return (grad.norm() / r.norm()).item()", "return grad.norm().item()"),
    ),
    mutant(
        "grad_ones_not_random",
        ref.input_gradient_norm,
        "not ones",
        (
            "r = torch.randn(n_tokens, C, generator=generator, dtype=torch.float64)",
            "r = torch.ones(n_tokens, C, dtype=torch.float64)",
        ),
    ),
    mutant(
        "grad_global_rng",
        ref.input_gradient_norm,
        "not from torch's global random state",
        (
            "W = torch.randn(C, C, generator=generator, dtype=torch.float64)",
            "W = torch.randn(C, C, dtype=torch.float64)",
        ),
    ),
    mutant(
        "grad_r_drawn_before_the_weights",
        ref.input_gradient_norm,
        "the stated procedure gives",
        (
            "x = x0  # (n_tokens, C)",
            "r = torch.randn(n_tokens, C, generator=generator, dtype=torch.float64)\n    x = x0  # (n_tokens, C)",
        ),
        ("    r = torch.randn(n_tokens, C, generator=generator, dtype=torch.float64)  # (n_tokens, C)\n", ""),
    ),
    mutant(
        "grad_returns_tensor",
        ref.input_gradient_norm,
        "should return a Python float",
        ("return (grad.norm() / r.norm()).item()", "return grad.norm() / r.norm()"),
    ),
    mutant(
        "grad_no_validation",
        ref.input_gradient_norm,
        "raise a ValueError",
        ("n_layers < 1 or C < 2 or n_tokens < 1", "False"),
    ),
    mutant(
        "rms_subtracts_mean",
        ref.RMSNorm,
        "does not subtract the mean",
        (
            "ms = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)\n        return x / torch.sqrt(ms + self.eps)",
            "x = x - x.mean(dim=-1, keepdim=True)\n"
            "        ms = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)\n"
            "        return x / torch.sqrt(ms + self.eps)",
        ),
    ),
    mutant(
        "rms_eps_outside_sqrt",
        ref.RMSNorm,
        "eps goes inside the square root",
        ("x / torch.sqrt(ms + self.eps) * self.weight", "x / (torch.sqrt(ms) + self.eps) * self.weight"),
    ),
    mutant(
        "rms_sum_not_mean",
        ref.RMSNorm,
        "not their sum",
        ("ms = (x * x).mean(dim=-1, keepdim=True)", "ms = (x * x).sum(dim=-1, keepdim=True)"),
    ),
    mutant(
        "rms_with_bias",
        ref.RMSNorm,
        "exactly one nn.Parameter",
        (
            "self.weight = nn.Parameter(torch.ones(d_model))",
            "self.weight = nn.Parameter(torch.ones(d_model))\n        self.bias = nn.Parameter(torch.zeros(d_model))",
        ),
    ),
    mutant(
        "rms_default_eps",
        ref.RMSNorm,
        "eps defaults to 1e-6",
        ("eps: float = 1e-6", "eps: float = 1e-5"),
    ),
]

#: Automatically generated mutants (``scripts/mutation.py``) that no input the text allows can tell
#: from the answer, each with the reason.
EQUIVALENT: dict[str, str] = {
    (
        "input_gradient_norm | if not all(isinstance(v, int) and not isinstance(v, bool) for v in ("
        "n_layers, C, n_tokens)) or ( | boolop | 2"
    ): "the text promises a ValueError for sizes out of range only, not for non-integer sizes",
    "input_gradient_norm | mean = x.mean(dim=-1, keepdim=True) # (n_tokens, 1) | unary | 1": (
        "x is 2-D, so dim=1 is dim=-1"
    ),
    "input_gradient_norm | mean = x.mean(dim=-1, keepdim=True) # (n_tokens, 1) | number | 2": (
        "keepdim=-1 is truthy, the same as keepdim=True"
    ),
    (
        "input_gradient_norm | return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(dim=-1, keepdi"
        "m=True) + 1e-5) | unary | 1"
    ): "x is 2-D, so dim=1 is dim=-1",
    (
        "input_gradient_norm | return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(dim=-1, keepdi"
        "m=True) + 1e-5) | number | 6"
    ): "keepdim=-1 is truthy, the same as keepdim=True",
}

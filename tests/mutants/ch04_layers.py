"""Wrong implementations for Exercise 4 (transformer layers), each a mistake students really make.

Each mutant is the reference definition with one edit (``old -> new``), so the source
shows exactly which line is wrong, and the edit is checked to apply exactly once.
"""

from coursekit import layers as ref
from tests.mutants import mutant

#: Grader part -> grade_id of its hidden test cell in the solution notebook.


_LN_VAR = "var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)"
_LN_NORM = "y = (x - mean) / torch.sqrt(var + self.eps) * self.weight"

MUTANTS = [
    # ----------------------------------------------------------------- LayerNorm
    mutant("ln_unbiased_variance", ref.LayerNorm, "unbiased variance",
            (_LN_VAR, "var = x.var(dim=-1, keepdim=True)")),
    mutant("ln_eps_outside_sqrt", ref.LayerNorm, "inside the square root",
            (_LN_NORM, "y = (x - mean) / (torch.sqrt(var) + self.eps) * self.weight")),
    mutant("ln_over_the_batch", ref.LayerNorm, "over the last (feature) axis",
            ("mean = x.mean(dim=-1, keepdim=True)", "mean = x.mean(dim=0, keepdim=True)"),
            (_LN_VAR, "var = ((x - mean) ** 2).mean(dim=0, keepdim=True)")),
    mutant("ln_no_affine", ref.LayerNorm, "learnable parameters named weight and bias",
            ("self.weight = nn.Parameter(torch.ones(d_model))", "self.weight = 1.0"),
            ("self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None", "self.bias = None")),
    mutant("ln_fixed_eps", ref.LayerNorm, "still used eps=1e-5",
            (_LN_NORM, "y = (x - mean) / torch.sqrt(var + 1e-5) * self.weight")),
    # ----------------------------------------------------------------- FeedForward
    mutant("ff_default_width_c", ref.FeedForward, "d_ff defaults to 4 * d_model",
            ("d_ff = 4 * d_model if d_ff is None else d_ff", "d_ff = d_model if d_ff is None else d_ff")),
    mutant("ff_activation_after_linear2", ref.FeedForward, "between the two linear layers",
            ("h = self.act(self.linear1(x))", "h = self.linear1(x)"),
            ("return self.linear2(self.dropout(h))", "return self.act(self.linear2(self.dropout(h)))")),
    mutant("ff_gelu_tanh", ref.FeedForward, "tanh approximation",
            ('else nn.GELU()', 'else nn.GELU(approximate="tanh")')),
    mutant("ff_dropout_on_output", ref.FeedForward, "dropout zeroes entries of the output",
            ("return self.linear2(self.dropout(h))", "return self.dropout(self.linear2(h))")),
    # ----------------------------------------------------------------- EncoderLayer
    mutant("enc_norm_first_swapped", ref.EncoderLayer, "pre-norm and post-norm are swapped",
            ("        if self.norm_first:\n            x = x + self.dropout1",
             "        if not self.norm_first:\n            x = x + self.dropout1")),
    mutant("enc_no_attention_residual", ref.EncoderLayer, "residual connection around self-attention",
            ("x = self.norm1(x + self.dropout1(attend(x)))", "x = self.norm1(self.dropout1(attend(x)))")),
    mutant("enc_normalised_stream", ref.EncoderLayer, "do not replace x by norm1(x)",
            ("            x = x + self.dropout1(attend(self.norm1(x)))\n            x = x + self.dropout2(self.ff(self.norm2(x)))",
             "            x = self.norm1(x)\n            x = x + self.dropout1(attend(x))\n"
             "            x = self.norm2(x)\n            x = x + self.dropout2(self.ff(x))")),
    mutant("enc_mask_ignored", ref.EncoderLayer, "the mask was ignored",
            ("self.self_attn(h, mask=mask, key_padding_mask", "self.self_attn(h, key_padding_mask")),
    mutant("enc_padding_mask_inverted", ref.EncoderLayer, "key_padding_mask is inverted",
            ("key_padding_mask=key_padding_mask, is_causal",
             "key_padding_mask=None if key_padding_mask is None else ~key_padding_mask, is_causal")),
    # ----------------------------------------------------------------- DecoderLayer
    mutant("dec_not_causal", ref.DecoderLayer, "must be causal by default",
            ("key_padding_mask=key_padding_mask, is_causal=is_causal)", "key_padding_mask=key_padding_mask)")),
    mutant("dec_cross_attends_to_itself", ref.DecoderLayer, "keys and values from memory",
            ("self.cross_attn(h, kv=memory,", "self.cross_attn(h, kv=h,")),
    mutant("dec_memory_padding_ignored", ref.DecoderLayer, "memory_key_padding_mask was ignored",
            ("mask=memory_mask, key_padding_mask=memory_key_padding_mask)", "mask=memory_mask)")),
    mutant("dec_normalises_memory", ref.DecoderLayer, "do not normalise memory",
            ("x = x + self.dropout2(cross_attend(self.norm2(x)))",
             "memory = self.norm2(memory)\n            x = x + self.dropout2(cross_attend(self.norm2(x)))")),
]

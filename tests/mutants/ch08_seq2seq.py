"""Wrong implementations for Exercise 8 (cross-attention and the decoder), each a mistake students really make.

Most mutants are the reference definition with one edit (``old -> new``), so the source shows
exactly which line is wrong, and each edit is checked to apply exactly once; the rest are
whole definitions written the way a student would (attention by hand, in-place shifting).
The mutant sources use the names of the notebook's imports cell.
"""

from coursekit import seq2seq as ref
from tests.mutants import Mutant, mutant, mutate

#: Grader part -> grade_id of its hidden test cell in the solution notebook.


_SHIFT = "shifted = torch.cat([start, labels[:, :-1]], dim=1)  # (B, T)"
_ATTEND = "out, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, H, T, D), (B, H, T, S)"
_SELF = "x = x + self.dropout1(self.self_attn(self.norm1(x), is_causal=True)[0])"
_CROSS = "attended, weights = cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask)"
_UNIFORM = "uniform = -logp.mean(dim=-1)  # (N,): cross-entropy against the uniform distribution"


def _manual_attention(scores_line: str, softmax_dim: int) -> str:
    """cross_attention written by hand, with a chosen scaling and softmax axis."""
    return mutate(ref.cross_attention, (_ATTEND, (
        f"scores = {scores_line}  # (B, H, T, S)\n"
        "    if mask is not None:\n"
        "        scores = scores.masked_fill(~mask, float('-inf'))\n"
        f"    weights = torch.softmax(scores, dim={softmax_dim})  # (B, H, T, S)\n"
        "    out = weights @ v  # (B, H, T, D)")))


MUTANTS = [
    # ----------------------------------------------------------------- shift_right
    mutant("shift_drops_first_label", ref.shift_right, "the first label was dropped instead of the last",
            (_SHIFT, "shifted = torch.cat([start, labels[:, 1:]], dim=1)")),
    mutant("shift_forgets_bos", ref.shift_right, "must start with bos_id",
            ("start = labels.new_full((labels.shape[0], 1), bos_id)", "start = labels.new_full((labels.shape[0], 1), pad_id)")),
    mutant("shift_rolls", ref.shift_right, "torch.roll wraps the last label around",
            (_SHIFT, "shifted = torch.roll(labels, 1, dims=1)")),
    mutant("shift_keeps_minus_100", ref.shift_right, "replace it with pad_id",
            ("return shifted.masked_fill(shifted == -100, pad_id)", "return shifted")),
    mutant("shift_in_place", ref.shift_right, "changed labels in place",
            (_SHIFT, "labels[:, 1:] = labels[:, :-1].clone()\n    labels[:, 0] = bos_id\n    shifted = labels")),
    # ----------------------------------------------------------------- cross_attention
    mutant("cross_kv_from_decoder", ref.cross_attention, "the keys and values come from x",
            ("q, k, v = attn.project(x, memory)", "q, k, v = attn.project(x)")),
    mutant("cross_mask_ignored", ref.cross_attention, "memory_key_padding_mask was ignored",
            (_ATTEND, "out, weights = scaled_dot_product_attention(q, k, v)")),
    mutant("cross_mask_inverted", ref.cross_attention, "memory_key_padding_mask is inverted",
            ("mask = memory_key_padding_mask[:, None, None, :]", "mask = ~memory_key_padding_mask[:, None, None, :]")),
    mutant("cross_no_out_proj", ref.cross_attention, "the output projection is missing",
            ("return attn.out_proj(merge_heads(out)), weights", "return merge_heads(out), weights")),
    mutant("cross_causal", ref.cross_attention, "cross-attention is not causal",
            (_ATTEND, "causal = torch.ones(x.shape[1], memory.shape[1], dtype=torch.bool).tril()  # (T, S)\n"
                      "    mask = causal if mask is None else mask & causal\n"
                      "    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)")),
    Mutant("cross_softmax_over_queries", "cross_attention", "cross_attention", "the softmax runs over the wrong axis",
           _manual_attention("q @ k.transpose(-2, -1) / math.sqrt(attn.d_head)", -2)),
    Mutant("cross_scaled_by_model_width", "cross_attention", "cross_attention", "scaled by 1/sqrt(C)",
           _manual_attention("q @ k.transpose(-2, -1) / math.sqrt(attn.d_model)", -1)),
    # ----------------------------------------------------------------- PreNormDecoderLayer
    mutant("layer_post_norm", ref.PreNormDecoderLayer, "this is post-norm",
            (_SELF, "x = self.norm1(x + self.dropout1(self.self_attn(x, is_causal=True)[0]))"),
            ("self.norm2(x), memory", "x, memory"),
            ("x = x + self.dropout2(attended)", "x = self.norm2(x + self.dropout2(attended))"),
            ("x = x + self.dropout3(self.ff(self.norm3(x)))", "x = self.norm3(x + self.dropout3(self.ff(x)))")),
    mutant("layer_not_causal", ref.PreNormDecoderLayer, "the self-attention must be causal",
            (_SELF, "x = x + self.dropout1(self.self_attn(self.norm1(x))[0])")),
    mutant("layer_kv_from_decoder", ref.PreNormDecoderLayer, "cross-attention must take its keys and values from memory",
            (_CROSS, "attended, weights = cross_attention(self.cross_attn, self.norm2(x), self.norm2(x))")),
    mutant("layer_no_cross_residual", ref.PreNormDecoderLayer, "a residual connection is missing",
            ("x = x + self.dropout2(attended)", "x = self.dropout2(attended)")),
    mutant("layer_normalises_memory", ref.PreNormDecoderLayer, "do not normalise memory",
            (_CROSS, "attended, weights = cross_attention(self.cross_attn, self.norm2(x), self.norm2(memory), "
                     "memory_key_padding_mask)")),
    mutant("layer_memory_mask_ignored", ref.PreNormDecoderLayer, "memory_key_padding_mask was ignored",
            (_CROSS, "attended, weights = cross_attention(self.cross_attn, self.norm2(x), memory)")),
    mutant("layer_normalised_stream", ref.PreNormDecoderLayer, "do not replace x by its normalised version",
            (_SELF, "x = self.norm1(x)\n        x = x + self.dropout1(self.self_attn(x, is_causal=True)[0])\n"
                    "        x = self.norm2(x)"),
            ("self.norm2(x), memory", "x, memory"),
            ("x = x + self.dropout3(self.ff(self.norm3(x)))", "x = self.norm3(x)\n        x = x + self.dropout3(self.ff(x))")),
    # ----------------------------------------------------------------- label_smoothed_loss
    mutant("loss_smooths_other_classes", ref.label_smoothed_loss, "to the V - 1 wrong classes only",
            (_UNIFORM, "uniform = (-logp.sum(dim=-1) - nll) / (logp.shape[-1] - 1)")),
    mutant("loss_counts_padding", ref.label_smoothed_loss, "padding positions are scored",
            ("keep = targets != pad_id  # (...)", "keep = torch.ones_like(targets, dtype=torch.bool)")),
    mutant("loss_summed", ref.label_smoothed_loss, "the loss is summed",
            ("return ((1.0 - smoothing) * nll + smoothing * uniform).mean()",
             "return ((1.0 - smoothing) * nll + smoothing * uniform).sum()")),
    mutant("loss_sums_over_classes", ref.label_smoothed_loss, "take the mean over the classes",
            (_UNIFORM, "uniform = -logp.sum(dim=-1)")),
    mutant("loss_no_smoothing", ref.label_smoothed_loss, "smoothing was not applied",
            ("return ((1.0 - smoothing) * nll + smoothing * uniform).mean()", "return nll.mean()")),
]

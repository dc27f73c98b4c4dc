"""Wrong implementations for Exercise 8 (cross-attention and the decoder), each a mistake students really make.

Most mutants are the reference definition with one edit (``old -> new``), so the source shows
exactly which line is wrong, and each edit is checked to apply exactly once; the rest are
whole definitions written the way a student would (attention by hand, in-place shifting).
The mutant sources use the names of the notebook's imports cell.
"""

from coursekit import seq2seq as ref
from coursekit.experiments import number_words
from tests.mutants import Mutant, mutant, mutate

#: Grader part -> grade_id of its hidden test cell in the solution notebook.


_SHIFT = "shifted = torch.cat([start, labels[:, :-1]], dim=1)  # (B, T)"
_ATTEND = "out, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, H, T, D), (B, H, T, S)"
_SELF = "x = x + self.dropout1(self.self_attn(self.norm1(x), is_causal=True)[0])"
_CROSS = (
    "attended, weights = cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask)"
)
_UNIFORM = "uniform = -logp.mean(dim=-1)  # (N,): cross-entropy against the uniform distribution"


def _manual_attention(scores_line: str, softmax_dim: int) -> str:
    """cross_attention written by hand, with a chosen scaling and softmax axis."""
    return mutate(
        ref.cross_attention,
        (
            _ATTEND,
            (
                f"scores = {scores_line}  # (B, H, T, S)\n"
                "    if mask is not None:\n"
                "        scores = scores.masked_fill(~mask, float('-inf'))\n"
                f"    weights = torch.softmax(scores, dim={softmax_dim})  # (B, H, T, S)\n"
                "    out = weights @ v  # (B, H, T, D)"
            ),
        ),
    )


MUTANTS = [
    # ----------------------------------------------------------------- shift_right
    mutant(
        "shift_drops_first_label",
        ref.shift_right,
        "the first label was dropped instead of the last",
        (_SHIFT, "shifted = torch.cat([start, labels[:, 1:]], dim=1)"),
    ),
    mutant(
        "shift_forgets_bos",
        ref.shift_right,
        "must start with bos_id",
        (
            "start = labels.new_full((labels.shape[0], 1), bos_id)",
            "start = labels.new_full((labels.shape[0], 1), pad_id)",
        ),
    ),
    mutant(
        "shift_rolls",
        ref.shift_right,
        "torch.roll wraps the last label around",
        (_SHIFT, "shifted = torch.roll(labels, 1, dims=1)"),
    ),
    mutant(
        "shift_keeps_minus_100",
        ref.shift_right,
        "replace it with pad_id",
        ("return shifted.masked_fill(shifted == -100, pad_id)", "return shifted"),
    ),
    mutant(
        "shift_in_place",
        ref.shift_right,
        "changed labels in place",
        (_SHIFT, "labels[:, 1:] = labels[:, :-1].clone()\n    labels[:, 0] = bos_id\n    shifted = labels"),
    ),
    mutant(
        "shift_no_value_error",
        ref.shift_right,
        "raise a ValueError instead",
        ("if labels.dim() != 2 or labels.shape[1] < 1 or labels.dtype != torch.long:", "if False:"),
    ),
    mutant(
        "shift_accepts_any_integer_dtype",
        ref.shift_right,
        "int32 labels",
        ("labels.dtype != torch.long", "labels.is_floating_point()"),
    ),
    mutant(
        "shift_fixed_bos",
        ref.shift_right,
        "bos_id and pad_id are arguments",
        (
            "start = labels.new_full((labels.shape[0], 1), bos_id)",
            "start = labels.new_full((labels.shape[0], 1), 1)",
        ),
    ),
    mutant(
        "shift_minus_100_to_zero",
        ref.shift_right,
        "bos_id and pad_id are arguments",
        (
            "return shifted.masked_fill(shifted == -100, pad_id)",
            "return shifted.masked_fill(shifted == -100, 0)",
        ),
    ),
    # ----------------------------------------------------------------- cross_attention
    mutant(
        "cross_kv_from_decoder",
        ref.cross_attention,
        "the keys and values come from x",
        ("q, k, v = attn.project(x, memory)", "q, k, v = attn.project(x)"),
    ),
    mutant(
        "cross_mask_ignored",
        ref.cross_attention,
        "padded source positions got attention weight",
        (_ATTEND, "out, weights = scaled_dot_product_attention(q, k, v)"),
    ),
    mutant(
        "cross_mask_inverted",
        ref.cross_attention,
        "True in memory_key_padding_mask marks a real token",
        (
            "mask = memory_key_padding_mask[:, None, None, :]",
            "mask = ~memory_key_padding_mask[:, None, None, :]",
        ),
    ),
    mutant(
        "cross_no_out_proj",
        ref.cross_attention,
        "the output projection is missing",
        ("return attn.out_proj(merge_heads(out)), weights", "return merge_heads(out), weights"),
    ),
    mutant(
        "cross_causal",
        ref.cross_attention,
        "cross-attention is not causal",
        (
            _ATTEND,
            "causal = torch.ones(x.shape[1], memory.shape[1], dtype=torch.bool).tril()  # (T, S)\n"
            "    mask = causal if mask is None else mask & causal\n"
            "    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)",
        ),
    ),
    Mutant(
        "cross_softmax_over_queries",
        "cross_attention",
        "cross_attention",
        "the softmax runs over the wrong axis",
        _manual_attention("q @ k.transpose(-2, -1) / math.sqrt(attn.d_head)", -2),
    ),
    Mutant(
        "cross_scaled_by_model_width",
        "cross_attention",
        "cross_attention",
        "scaled by 1/sqrt(C)",
        _manual_attention("q @ k.transpose(-2, -1) / math.sqrt(attn.d_model)", -1),
    ),
    Mutant(
        "cross_nan_for_a_source_without_tokens",
        "cross_attention",
        "cross_attention",
        "a source row with no real token",
        _manual_attention("q @ k.transpose(-2, -1) / math.sqrt(attn.d_head)", -1).replace(
            "scaled_dot_product_attention", "torch.softmax"
        ),
    ),
    mutant(
        "cross_without_repeat_kv",
        ref.cross_attention,
        "are repeated for the query heads",
        ("k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D)", "pass"),
    ),
    mutant(
        "cross_dropout_in_eval_mode",
        ref.cross_attention,
        "apply dropout only when attn.training",
        ("if attn.training and attn.dropout > 0:", "if attn.dropout > 0:"),
    ),
    mutant(
        "cross_dropout_out_not_recomputed",
        ref.cross_attention,
        "out must be computed from the dropped weights",
        ("        out = weights @ v  # (B, H, T, D)\n", ""),
    ),
    mutant(
        "cross_dropout_on_the_output",
        ref.cross_attention,
        "each returned weight must be 0 (dropped)",
        (
            "        weights = F.dropout(weights, attn.dropout)\n        out = weights @ v  # (B, H, T, D)\n",
            "        out = F.dropout(out, attn.dropout)\n",
        ),
    ),
    mutant(
        "cross_no_mask_check",
        ref.cross_attention,
        "raise a ValueError instead",
        (
            "if memory_key_padding_mask.dtype != torch.bool or memory_key_padding_mask.shape != (B, S):",
            "if False:",
        ),
    ),
    # ----------------------------------------------------------------- PreNormDecoderLayer
    mutant(
        "layer_post_norm",
        ref.PreNormDecoderLayer,
        "this is post-norm",
        (_SELF, "x = self.norm1(x + self.dropout1(self.self_attn(x, is_causal=True)[0]))"),
        ("self.norm2(x), memory", "x, memory"),
        ("x = x + self.dropout2(attended)", "x = self.norm2(x + self.dropout2(attended))"),
        ("x = x + self.dropout3(self.ff(self.norm3(x)))", "x = self.norm3(x + self.dropout3(self.ff(x)))"),
    ),
    mutant(
        "layer_not_causal",
        ref.PreNormDecoderLayer,
        "the self-attention must be causal",
        (_SELF, "x = x + self.dropout1(self.self_attn(self.norm1(x))[0])"),
    ),
    mutant(
        "layer_kv_from_decoder",
        ref.PreNormDecoderLayer,
        "take the cross-attention's keys and values from memory",
        (_CROSS, "attended, weights = cross_attention(self.cross_attn, self.norm2(x), self.norm2(x))"),
    ),
    mutant(
        "layer_no_cross_residual",
        ref.PreNormDecoderLayer,
        "a residual connection is missing",
        ("x = x + self.dropout2(attended)", "x = self.dropout2(attended)"),
    ),
    mutant(
        "layer_normalises_memory",
        ref.PreNormDecoderLayer,
        "do not normalise memory",
        (
            _CROSS,
            "attended, weights = cross_attention(self.cross_attn, self.norm2(x), self.norm2(memory), "
            "memory_key_padding_mask)",
        ),
    ),
    mutant(
        "layer_memory_mask_ignored",
        ref.PreNormDecoderLayer,
        "memory_key_padding_mask was ignored",
        (_CROSS, "attended, weights = cross_attention(self.cross_attn, self.norm2(x), memory)"),
    ),
    mutant(
        "layer_normalised_stream",
        ref.PreNormDecoderLayer,
        "do not replace x by its normalised version",
        (
            _SELF,
            "x = self.norm1(x)\n        x = x + self.dropout1(self.self_attn(x, is_causal=True)[0])\n"
            "        x = self.norm2(x)",
        ),
        ("self.norm2(x), memory", "x, memory"),
        (
            "x = x + self.dropout3(self.ff(self.norm3(x)))",
            "x = self.norm3(x)\n        x = x + self.dropout3(self.ff(x))",
        ),
    ),
    mutant(
        "layer_dropout2_on_the_input",
        ref.PreNormDecoderLayer,
        "with only dropout2 at p = 1",
        (
            _CROSS,
            "attended, weights = cross_attention(self.cross_attn, self.dropout2(self.norm2(x)), memory, "
            "memory_key_padding_mask)",
        ),
        ("x = x + self.dropout2(attended)", "x = x + attended"),
    ),
    mutant(
        "layer_functional_dropout",
        ref.PreNormDecoderLayer,
        "dropout applies only in training mode",
        (
            "x = x + self.dropout3(self.ff(self.norm3(x)))",
            "x = x + F.dropout(self.ff(self.norm3(x)), self.dropout3.p)",
        ),
    ),
    mutant(
        "layer_dropout3_forgotten",
        ref.PreNormDecoderLayer,
        "with only dropout3 at p = 1",
        ("x = x + self.dropout3(self.ff(self.norm3(x)))", "x = x + self.ff(self.norm3(x))"),
    ),
    mutant(
        "layer_returns_self_attention_weights",
        ref.PreNormDecoderLayer,
        "not (B, H, T, S): return the cross-attention weights",
        (
            _SELF,
            "attended, self_weights = self.self_attn(self.norm1(x), is_causal=True, need_weights=True)\n"
            "        x = x + self.dropout1(attended)",
        ),
        ("return x, weights", "return x, self_weights"),
    ),
    # ----------------------------------------------------------------- label_smoothed_loss
    mutant(
        "loss_smooths_other_classes",
        ref.label_smoothed_loss,
        "to the V - 1 wrong classes only",
        (_UNIFORM, "uniform = (-logp.sum(dim=-1) - nll) / (logp.shape[-1] - 1)"),
    ),
    mutant(
        "loss_counts_padding",
        ref.label_smoothed_loss,
        "padding positions are scored",
        ("keep = targets != pad_id  # (...)", "keep = torch.ones_like(targets, dtype=torch.bool)"),
    ),
    mutant(
        "loss_summed",
        ref.label_smoothed_loss,
        "the loss is summed",
        (
            "return ((1.0 - smoothing) * nll + smoothing * uniform).mean()",
            "return ((1.0 - smoothing) * nll + smoothing * uniform).sum()",
        ),
    ),
    mutant(
        "loss_sums_over_classes",
        ref.label_smoothed_loss,
        "take the mean over the classes",
        (_UNIFORM, "uniform = -logp.sum(dim=-1)"),
    ),
    mutant(
        "loss_no_smoothing",
        ref.label_smoothed_loss,
        "smoothing was not applied",
        ("return ((1.0 - smoothing) * nll + smoothing * uniform).mean()", "return nll.mean()"),
    ),
    mutant(
        "loss_log_of_softmax",
        ref.label_smoothed_loss,
        "the loss is inf or NaN for large logits",
        (
            "logp = F.log_softmax(logits[keep], dim=-1)",
            "logp = torch.log(torch.softmax(logits[keep], dim=-1))",
        ),
    ),
    mutant(
        "loss_fixed_pad_id",
        ref.label_smoothed_loss,
        "the pad_id argument was not used",
        ("keep = targets != pad_id  # (...)", "keep = targets != 0"),
    ),
    mutant(
        "loss_nan_for_only_padding",
        ref.label_smoothed_loss,
        "raise a ValueError instead",
        (
            '    if not bool(keep.any()):\n        raise ValueError("every target is padding: there is nothing to '
            'score")\n',
            "",
        ),
    ),
    mutant(
        "loss_default_smoothing_0",
        ref.label_smoothed_loss,
        "the default smoothing=0.1",
        ("smoothing: float = 0.1", "smoothing: float = 0.0"),
    ),
    mutant(
        "loss_changes_targets",
        ref.label_smoothed_loss,
        "changed its inputs in place",
        ("keep = targets != pad_id  # (...)", "keep = targets != pad_id\n    targets[~keep] = 0"),
    ),
    Mutant(
        "floor_right_argmax_means_zero_loss",
        "predict_smoothing_floor",
        "predict_smoothing_floor",
        "the experiment gives (b) 0.10",
        'predict_smoothing_floor = "a"\n',
    ),
    Mutant(
        "floor_plain_loss_at_the_smoothed_floor",
        "predict_smoothing_floor",
        "predict_smoothing_floor",
        "you predicted (c) 0.66",
        'predict_smoothing_floor = "c"\n',
    ),
    Mutant(
        "floor_smoothing_makes_it_uniform",
        "predict_smoothing_floor",
        "predict_smoothing_floor",
        "you predicted (d) 3.56 (ln 35)",
        'predict_smoothing_floor = "d"\n',
    ),
    Mutant(
        "floor_not_a_letter",
        "predict_smoothing_floor",
        "predict_smoothing_floor",
        "one of the letters",
        "predict_smoothing_floor = 0.10\n",
    ),
    Mutant(
        "passes_one_pass_like_teacher_forcing",
        "predict_encoder_passes",
        "predict_encoder_passes",
        "the experiment gives (c) once per step (6)",
        'predict_encoder_passes = "a"\n',
    ),
    Mutant(
        "passes_per_beam",
        "predict_encoder_passes",
        "predict_encoder_passes",
        "you predicted (b) once per beam (4)",
        'predict_encoder_passes = "b"\n',
    ),
    Mutant(
        "passes_per_beam_and_step",
        "predict_encoder_passes",
        "predict_encoder_passes",
        "you predicted (d) once per beam and step (24)",
        'predict_encoder_passes = "d"\n',
    ),
    Mutant(
        "passes_not_set",
        "predict_encoder_passes",
        "predict_encoder_passes",
        "still None",
        "predict_encoder_passes = None\n",
    ),
    Mutant(
        "bleu_one_word_sentences_give_0",
        "predict_bleu_one_word",
        "predict_bleu_one_word",
        "the experiment gives (d) 78",
        'predict_bleu_one_word = "a"\n',
    ),
    Mutant(
        "bleu_mean_of_sentence_scores",
        "predict_bleu_one_word",
        "predict_bleu_one_word",
        "you predicted (b) 12.5",
        'predict_bleu_one_word = "b"\n',
    ),
    Mutant(
        "bleu_product_without_root",
        "predict_bleu_one_word",
        "predict_bleu_one_word",
        "you predicted (c) 36",
        'predict_bleu_one_word = "c"\n',
    ),
    Mutant(
        "bleu_as_a_number",
        "predict_bleu_one_word",
        "predict_bleu_one_word",
        "one of the letters",
        "predict_bleu_one_word = 77.7\n",
    ),
    mutant(
        "heldout_no_shift",
        number_words.heldout_loss,
        "feed the decoder shift_right",
        ("logits = model(src, shift_right(tgt, BOS, PAD))", "logits = model(src, tgt)"),
    ),
    mutant(
        "heldout_scores_padding",
        number_words.heldout_loss,
        "outside the expected band",
        (
            "return label_smoothed_loss(logits, tgt, smoothing).item()",
            "return F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), label_smoothing=smoothing).item()",
        ),
    ),
    mutant(
        "heldout_fixed_smoothing",
        number_words.heldout_loss,
        "at the given smoothing",
        (
            "return label_smoothed_loss(logits, tgt, smoothing).item()",
            "return label_smoothed_loss(logits, tgt).item()",
        ),
    ),
    mutant(
        "heldout_global_rng",
        number_words.heldout_loss,
        "not from torch's global random state",
        ("torch.randint(len(test), (n,), generator=generator)", "torch.randint(len(test), (n,))"),
    ),
    mutant(
        "heldout_returns_tensor",
        number_words.heldout_loss,
        "should return a Python float",
        (
            "return label_smoothed_loss(logits, tgt, smoothing).item()",
            "return label_smoothed_loss(logits, tgt, smoothing)",
        ),
    ),
    mutant(
        "heldout_loads_by_position",
        number_words.heldout_loss,
        "in reversed order",
        (
            "model.load_state_dict(weights)",
            "model.load_state_dict(dict(zip(model.state_dict(), weights.values())))",
        ),
    ),
    mutant(
        "heldout_draws_without_replacement",
        number_words.heldout_loss,
        "the stated procedure gives",
        (
            "torch.randint(len(test), (n,), generator=generator)",
            "torch.randperm(len(test), generator=generator)[:n]",
        ),
    ),
    # ------------------------------------------------------------------ stretch: length_penalty_score
    mutant(
        "lp_power_of_n",
        ref.length_penalty_score,
        "not n ** alpha",
        (
            "penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha",
            "penalty = length.to(logprob.dtype) ** alpha",
        ),
    ),
    mutant(
        "lp_no_alpha",
        ref.length_penalty_score,
        "to the power alpha",
        (
            "penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha",
            "penalty = (5 + length.to(logprob.dtype)) / 6",
        ),
    ),
    mutant(
        "lp_multiplies",
        ref.length_penalty_score,
        "do not multiply",
        ("return logprob / penalty", "return logprob * penalty"),
    ),
    mutant(
        "lp_integer_division",
        ref.length_penalty_score,
        "integer division",
        ("penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha", "penalty = ((5 + length) // 6) ** alpha"),
    ),
    mutant(
        "lp_precedence",
        ref.length_penalty_score,
        "mind the brackets",
        (
            "penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha",
            "penalty = (5 + length.to(logprob.dtype)) / 6**alpha",
        ),
    ),
    mutant(
        "lp_float32_penalty",
        ref.length_penalty_score,
        "in logprob's dtype",
        (
            "penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha",
            "penalty = ((5 + length.float()) / 6) ** alpha",
        ),
    ),
    mutant(
        "lp_in_place",
        ref.length_penalty_score,
        "in place",
        ("return logprob / penalty", "return logprob.div_(penalty)"),
    ),
    mutant(
        "lp_no_length_check",
        ref.length_penalty_score,
        "raise a ValueError",
        ("    if bool((length < 1).any()):\n", "    if False:\n"),
    ),
    mutant(
        "lp_alpha_0_returns_logprob",
        ref.length_penalty_score,
        "shares memory with an input",
        (
            "    penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha",
            "    if alpha == 0:\n        return logprob  # nothing to divide by\n"
            "    penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha",
        ),
    ),
]

#: Mutants of the instructor's answers (scripts/mutation.py) that no input the text allows can tell apart
#: from the answer, each with the reason.
_XM = (
    "the text promises a ValueError only for the mask; x and memory are documented as (B, T, C) and (B, S, C) "
    "with one B, so no allowed input reaches this check"
)
_NDIM = (
    "the text requires logits with at least one leading axis, (..., V), so logits.dim() >= 2 for every "
    "allowed input"
)
_SMOOTH = (
    "the text promises no error for a smoothing outside [0, 1] (it is documented as in [0, 1]), so no allowed "
    "input reaches this check"
)
_DROP0 = (
    "with attn.dropout = 0, F.dropout keeps every weight unscaled, so applying it (and recomputing out) "
    "changes nothing"
)
_2D = "the tensor is 2-D, so dim 1 is dim -1"
_LINEAR = (
    "nll stays (N, 1) and broadcasts against uniform (N,) to (N, N), whose mean (1 - s) mean(nll) + "
    "s mean(uniform) is the same loss and gradient (the loss is linear in both terms)"
)
_CHECK_XM = "cross_attention | if x.dim() != 3 or memory.dim() != 3 or memory.shape[0] != x.shape[0]:"
_RAISE_XM = (
    'cross_attention | raise ValueError(f"expected x (B, T, C) and memory (B, S, C), got {tuple(x.shape)} and '
    '{tuple(memory.shape)}")'
)
_DROPOUT_IF = "cross_attention | if attn.training and attn.dropout > 0:"
_LS_CHECK = "label_smoothed_loss | if logits.dim() < 2 or targets.shape != logits.shape[:-1]:"
_LS_SMOOTH = "label_smoothed_loss | if not 0.0 <= smoothing <= 1.0:"
_LS_LOGP = (
    "label_smoothed_loss | logp = F.log_softmax(logits[keep], dim=-1) # (N, V): the scored positions only"
)
_LS_NLL = "label_smoothed_loss | nll = -logp.gather(-1, targets[keep][:, None]).squeeze(-1) # (N,)"
_LS_UNIFORM = (
    "label_smoothed_loss | uniform = -logp.mean(dim=-1) # (N,): cross-entropy against the uniform "
    "distribution"
)

_HELD_SMOOTH = "a smoothing outside [0, 1] reaches label_smoothed_loss, which raises the same ValueError"
_HELD_N = (
    "n = 0 reaches make_batch, which raises ValueError for no numbers; a negative n raises in torch.randint"
)
EQUIVALENT: dict[str, str] = {
    "heldout_loss | if not 0.0 <= smoothing <= 1.0: | delete | 1": _HELD_SMOOTH,
    "heldout_loss | if not 0.0 <= smoothing <= 1.0: | number | 2": _HELD_SMOOTH,
    "heldout_loss | if not 0.0 <= smoothing <= 1.0: | number | 5": _HELD_SMOOTH,
    'heldout_loss | raise ValueError(f"smoothing must be in [0, 1], got {smoothing!r}") | delete | 1': _HELD_SMOOTH,
    "heldout_loss | if not isinstance(n, int) or isinstance(n, bool) or n < 1: | number | 1": _HELD_N,
    "heldout_loss | model.eval() | delete | 1": (
        "SEQ2SEQ_PRESETS['small'] has dropout 0.0, so training and eval mode compute the same logits"
    ),
    (
        "shift_right | if labels.dim() != 2 or labels.shape[1] < 1 or labels.dtype != torch.long: "
        "| number | 6"
    ): "labels.dim() == 2 is checked first, so labels.shape[-1] is labels.shape[1]",
    "shift_right | shifted = torch.cat([start, labels[:, :-1]], dim=1) # (B, T) | number | 5": (
        "the tensors concatenated are 2-D, so dim=-1 is dim=1"
    ),
    f"{_CHECK_XM} | delete | 1": _XM,
    f"{_CHECK_XM} | boolop | 1": _XM,
    f"{_RAISE_XM} | delete | 1": _XM,
    "cross_attention | B, S = memory.shape[:2] | number | 3": "memory is 3-D (B, S, C), so shape[:-1] is shape[:2]",
    f"{_DROPOUT_IF} | compare | 1": _DROP0,
    f"{_DROPOUT_IF} | number | 2": _DROP0,
    f"{_LS_CHECK} | number | 1": _NDIM,
    f"{_LS_CHECK} | number | 2": _NDIM,
    f"{_LS_CHECK} | number | 3": _NDIM,
    f"{_LS_SMOOTH} | delete | 1": _SMOOTH,
    f"{_LS_SMOOTH} | number | 2": _SMOOTH,
    f"{_LS_SMOOTH} | number | 5": _SMOOTH,
    'label_smoothed_loss | raise ValueError(f"smoothing must be in [0, 1], got {smoothing}") | delete | 1': _SMOOTH,
    f"{_LS_LOGP} | keyword | 1": "logits[keep] is 2-D: log_softmax's implicit dim is then 1, the last axis",
    f"{_LS_LOGP} | unary | 1": _2D,
    f"{_LS_LOGP} | number | 2": _2D,
    f"{_LS_NLL} | unary | 2": _2D,
    f"{_LS_NLL} | number | 2": _2D,
    f"{_LS_NLL} | unary | 3": "the gathered tensor is (N, 1), so squeeze(1) is squeeze(-1)",
    f"{_LS_NLL} | number | 5": "the gathered tensor is (N, 1), so squeeze(1) is squeeze(-1)",
    f"{_LS_NLL} | number | 4": _LINEAR,
    f"{_LS_NLL} | number | 6": _LINEAR,
    f"{_LS_UNIFORM} | keyword | 1": (
        "the mean over all N V entries equals the final mean over positions of each "
        "position's mean over V (every position has V classes): the same loss and "
        "gradient"
    ),
    f"{_LS_UNIFORM} | unary | 2": _2D,
    f"{_LS_UNIFORM} | number | 2": _2D,
}

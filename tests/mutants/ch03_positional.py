"""Wrong implementations for Exercise 3, each a mistake students really make.

Each mutant is the reference definition with one edit (``old -> new``), so the source shows
exactly which line is wrong (and keeps the given argument checks, as a student's answer does),
and the edit is checked to apply exactly once. ``EQUIVALENT`` holds the automatically generated
mutants (``scripts/mutation.py``) that no input the text allows can tell from the answer.
"""

from coursekit import positional as ref
from tests.mutants import Mutant, mutant

_SIN_POS = "pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)"
_SIN_FREQ = "freq = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)  # (C/2,) w_i = base^(-2i/C)"
_SIN_STACK = "pe = torch.stack([angles.sin(), angles.cos()], dim=-1)"
_SIN_OUT = "return pe.reshape(T, C).to(dtype)"
_ROPE_ANGLES = "angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)"
_ROPE_HEADS = "    if positions.dim() == 2 and x.dim() == 4:\n        angles = angles[:, None]"
_ROPE_COS = "cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)"
_ROPE_SIN = "sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)"
_ROPE_PARTNER = "partner = torch.cat([-x2, x1], dim=-1)"
_ROPE_OUT = "return x * cos + partner * sin"
_SLOPES = "slopes = geometric(n) + geometric(2 * n)[0::2][: H - n]"
_GEOMETRIC = "return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]"
_BIAS_I = "i = torch.arange(T, device=slopes.device)[:, None] + (S - T)"
_BIAS_J = "j = torch.arange(S, device=slopes.device)[None, :]"
_BIAS_OFFSET = "offset = (j - i).to(slopes.dtype)"
_BIAS_OUT = 'return bias.masked_fill(j > i, float("-inf"))'

MUTANTS = [
    # ----------------------------------------------------------------- sinusoidal_encoding
    mutant(
        "sinusoidal_sin_cos_swapped",
        ref.sinusoidal_encoding,
        "sin and cos are swapped",
        (_SIN_STACK, "pe = torch.stack([angles.cos(), angles.sin()], dim=-1)"),
    ),
    mutant(
        "sinusoidal_exponent_i_over_C",
        ref.sinusoidal_encoding,
        "frequency exponent is off",
        (_SIN_FREQ, "freq = base ** (-torch.arange(C // 2, dtype=torch.float64) / C)"),
    ),
    mutant(
        "sinusoidal_frequency_per_channel",
        ref.sinusoidal_encoding,
        "every channel c its own",
        (
            _SIN_STACK,
            "c = torch.arange(C, dtype=torch.float64)\n    "
            "pe = torch.where(c % 2 == 0, (pos * base ** (-c / C)).sin(), (pos * base ** (-c / C)).cos())",
        ),
        (_SIN_OUT, "return pe.to(dtype)"),
    ),
    mutant(
        "sinusoidal_sines_then_cosines",
        ref.sinusoidal_encoding,
        "put all the sines first",
        (_SIN_STACK, "pe = torch.cat([angles.sin(), angles.cos()], dim=-1)"),
    ),
    mutant(
        "sinusoidal_ignores_base",
        ref.sinusoidal_encoding,
        "base argument is ignored",
        (_SIN_FREQ, "freq = 10000.0 ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)"),
    ),
    mutant(
        "sinusoidal_positions_from_one",
        ref.sinusoidal_encoding,
        "your positions start at 1",
        (_SIN_POS, "pos = torch.arange(1, T + 1, dtype=torch.float64)[:, None]"),
    ),
    mutant(
        "sinusoidal_angles_in_dtype",
        ref.sinusoidal_encoding,
        "lose digits; compute them in float64",
        (_SIN_POS, "pos = torch.arange(T, dtype=dtype)[:, None]"),
        (_SIN_FREQ, "freq = base ** (-torch.arange(0, C, 2, dtype=dtype) / C)"),
    ),
    mutant(
        "sinusoidal_ignores_dtype",
        ref.sinusoidal_encoding,
        "the default dtype is float32",
        (_SIN_OUT, "return pe.reshape(T, C)"),
    ),
    mutant(
        "sinusoidal_float32_frequencies",
        ref.sinusoidal_encoding,
        "computed in float32",
        (_SIN_FREQ, "freq = base ** (-torch.arange(0, C, 2, dtype=torch.float32) / C)"),
    ),
    mutant(
        "sinusoidal_drops_argument_checks",
        ref.sinusoidal_encoding,
        "raise a ValueError instead",
        ("    if T < 0 or C <= 0 or C % 2:\n", "    if T < 0 or C <= 0:\n"),
    ),
    # ----------------------------------------------------------------- apply_rope
    mutant(
        "rope_interleaved_pairs",
        ref.apply_rope,
        "half-split",
        (_ROPE_COS, "cos = angles.cos().repeat_interleave(2, -1).to(x.dtype)"),
        (_ROPE_SIN, "sin = angles.sin().repeat_interleave(2, -1).to(x.dtype)"),
        (_ROPE_PARTNER, "partner = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)"),
    ),
    mutant(
        "rope_mixed_conventions",
        ref.apply_rope,
        "repeat_interleave",
        (_ROPE_COS, "cos = angles.cos().repeat_interleave(2, -1).to(x.dtype)"),
        (_ROPE_SIN, "sin = angles.sin().repeat_interleave(2, -1).to(x.dtype)"),
    ),
    mutant(
        "rope_rotates_backwards",
        ref.apply_rope,
        "the rotation goes the wrong way",
        (_ROPE_PARTNER, "partner = torch.cat([x2, -x1], dim=-1)"),
    ),
    mutant(
        "rope_ignores_positions",
        ref.apply_rope,
        "positions argument is ignored",
        (
            _ROPE_ANGLES,
            "angles = rope_angles(torch.arange(x.shape[-2]), D, base=base, scaling=scaling, factor=factor)",
        ),
        (_ROPE_HEADS, "    pass"),
    ),
    mutant(
        "rope_positions_from_one",
        ref.apply_rope,
        "shifted by one",
        (_ROPE_ANGLES, "angles = rope_angles(positions + 1, D, base=base, scaling=scaling, factor=factor)"),
    ),
    mutant(
        "rope_batched_positions_on_heads", ref.apply_rope, "insert a head axis", (_ROPE_HEADS, "    pass")
    ),
    mutant(
        "rope_drops_scaling",
        ref.apply_rope,
        "scaling and factor are ignored",
        (_ROPE_ANGLES, "angles = rope_angles(positions, D, base=base)"),
    ),
    mutant(
        "rope_ignores_base",
        ref.apply_rope,
        "the base argument is ignored",
        (_ROPE_ANGLES, "angles = rope_angles(positions, D, scaling=scaling, factor=factor)"),
    ),
    mutant(
        "rope_linear_multiplies",
        ref.apply_rope,
        "scaling='linear'",
        (
            _ROPE_ANGLES,
            "angles = rope_angles(positions * factor if scaling == 'linear' else positions, D, "
            "base=base, scaling=None if scaling == 'linear' else scaling, factor=factor)",
        ),
    ),
    mutant(
        "rope_head_axis_for_3d_x",
        ref.apply_rope,
        "positions [[",
        (_ROPE_HEADS, "    if positions.dim() == 2:\n        angles = angles[:, None]"),
    ),
    mutant(
        "rope_integer_positions",
        ref.apply_rope,
        "cast to integers",
        (
            _ROPE_ANGLES,
            "angles = rope_angles(positions.long(), D, base=base, scaling=scaling, factor=factor)",
        ),
    ),
    mutant(
        "rope_in_place",
        ref.apply_rope,
        "x was modified in place",
        (_ROPE_OUT, "return x.mul_(cos).add_(partner * sin)"),
    ),
    mutant(
        "rope_keeps_float64",
        ref.apply_rope,
        "cast cos and sin to x.dtype",
        (_ROPE_COS, "cos = torch.cat([angles.cos(), angles.cos()], dim=-1)"),
        (_ROPE_SIN, "sin = torch.cat([angles.sin(), angles.sin()], dim=-1)"),
    ),
    mutant(
        "rope_detached",
        ref.apply_rope,
        "does not depend on x through autograd",
        (_ROPE_OUT, "return (x * cos + partner * sin).detach()"),
    ),
    mutant(
        "rope_returns_x_where_nothing_turns",
        ref.apply_rope,
        "shares memory with an input",
        (
            "    D = x.shape[-1]\n",
            "    if not bool(positions.any()):\n        return x  # nothing to rotate\n    D = x.shape[-1]\n",
        ),
    ),
    mutant(
        "rope_angles_in_x_dtype",
        ref.apply_rope,
        "take cos and sin of the float64 angles",
        (_ROPE_COS, "cos = torch.cat([angles.to(x.dtype).cos(), angles.to(x.dtype).cos()], dim=-1)"),
        (_ROPE_SIN, "sin = torch.cat([angles.to(x.dtype).sin(), angles.to(x.dtype).sin()], dim=-1)"),
    ),
    mutant(
        "rope_drops_argument_checks",
        ref.apply_rope,
        "raise a ValueError",
        ("    if x.dim() < 2 or x.shape[-1] % 2:\n", "    if x.dim() < 1:\n"),
    ),
    # ----------------------------------------------------------------- alibi_slopes
    mutant(
        "alibi_slopes_naive_rule",
        ref.alibi_slopes,
        "is not a power of two",
        (_SLOPES, "slopes = [2.0 ** (-8.0 * i / H) for i in range(1, H + 1)]"),
    ),
    mutant(
        "alibi_slopes_reversed",
        ref.alibi_slopes,
        "the slopes are reversed",
        ("return torch.tensor(slopes, dtype=dtype)", "return torch.tensor(slopes[::-1], dtype=dtype)"),
    ),
    mutant(
        "alibi_slopes_from_zero",
        ref.alibi_slopes,
        "the exponents start at 0",
        (_GEOMETRIC, "return [2.0 ** (-8.0 * i / n) for i in range(n)]"),
    ),
    mutant(
        "alibi_slopes_odd_extras",
        ref.alibi_slopes,
        "[0::2], not [1::2]",
        (_SLOPES, "slopes = geometric(n) + geometric(2 * n)[1::2][: H - n]"),
    ),
    mutant(
        "alibi_slopes_sorted",
        ref.alibi_slopes,
        "do not sort the slopes",
        (_SLOPES, "slopes = sorted(geometric(n) + geometric(2 * n)[0::2][: H - n], reverse=True)"),
    ),
    mutant(
        "alibi_slopes_ignores_dtype",
        ref.alibi_slopes,
        "should be a float64 tensor",
        ("return torch.tensor(slopes, dtype=dtype)", "return torch.tensor(slopes)"),
    ),
    mutant(
        "alibi_slopes_drops_argument_check",
        ref.alibi_slopes,
        "alibi_slopes(0) your code",
        (
            '        raise ValueError(f"alibi_slopes needs at least one head, got H={H}")',
            "        return torch.zeros(0)",
        ),
    ),
    # ----------------------------------------------------------------- alibi_bias
    mutant(
        "alibi_bias_sign_flipped",
        ref.alibi_bias,
        "the sign is flipped",
        (_BIAS_OFFSET, "offset = (i - j).to(slopes.dtype)"),
    ),
    mutant(
        "alibi_bias_not_causal",
        ref.alibi_bias,
        "future keys must be -inf",
        (_BIAS_OFFSET, "offset = -(j - i).abs().to(slopes.dtype)"),
        (_BIAS_OUT, "return bias"),
    ),
    mutant(
        "alibi_bias_off_by_one",
        ref.alibi_bias,
        "the distance is off by one",
        (_BIAS_OFFSET, "offset = (j - i - 1).to(slopes.dtype)"),
    ),
    mutant(
        "alibi_bias_top_left",
        ref.alibi_bias,
        "misaligned",
        (_BIAS_I, "i = torch.arange(T, device=slopes.device)[:, None]"),
    ),
    mutant(
        "alibi_bias_forgets_device",
        ref.alibi_bias,
        "device=slopes.device",
        (_BIAS_I, "i = torch.arange(T)[:, None] + (S - T)"),
        (_BIAS_J, "j = torch.arange(S)[None, :]"),
    ),
    mutant(
        "alibi_bias_float32",
        ref.alibi_bias,
        "the dtype of the slopes",
        (_BIAS_OFFSET, "offset = (j - i).float()"),
        ("bias = slopes[:, None, None] * offset", "bias = slopes[:, None, None].float() * offset"),
    ),
    mutant(
        "alibi_bias_in_place",
        ref.alibi_bias,
        "modified the slopes in place",
        ("bias = slopes[:, None, None] * offset", "bias = slopes.unsqueeze_(-1).unsqueeze_(-1) * offset"),
    ),
    mutant(
        "alibi_bias_square_only",
        ref.alibi_bias,
        "alibi_bias(slopes",
        ("    S = T if S is None else S\n", "    S = T\n"),
    ),
    mutant(
        "alibi_bias_large_negative_instead_of_inf",
        ref.alibi_bias,
        "future keys must be -inf",
        (_BIAS_OUT, "return bias.masked_fill(j > i, -1e9)"),
    ),
    mutant(
        "alibi_bias_drops_argument_checks",
        ref.alibi_bias,
        "raise a ValueError",
        ("    if T < 0 or S < T:\n", "    if T < 0:\n"),
    ),
    Mutant(
        "rope_thinks_always_relative",
        "predict_rope_offset",
        "predict_rope_offset",
        "the experiment gives (b) only on 2n - m",
        'predict_rope_offset = "a"\n',
    ),
    Mutant(
        "rope_thinks_absolute",
        "predict_rope_offset",
        "predict_rope_offset",
        "you predicted (c) on m and n separately",
        'predict_rope_offset = "c"\n',
    ),
    Mutant(
        "rope_thinks_cancels",
        "predict_rope_offset",
        "predict_rope_offset",
        "you predicted (d)",
        'predict_rope_offset = "d"\n',
    ),
    Mutant(
        "rope_not_a_letter",
        "predict_rope_offset",
        "predict_rope_offset",
        "one of the letters",
        "predict_rope_offset = 1\n",
    ),
    Mutant(
        "alibi_slope_copies_eight_heads",
        "predict_alibi_first_slope",
        "predict_alibi_first_slope",
        "you predicted 0.5;",
        "predict_alibi_first_slope = 0.5\n",
    ),
    Mutant(
        "alibi_slope_last_head",
        "predict_alibi_first_slope",
        "predict_alibi_first_slope",
        "the experiment gives 0.840896",
        "predict_alibi_first_slope = 2 ** -8\n",
    ),
    Mutant(
        "alibi_slope_one_over_H",
        "predict_alibi_first_slope",
        "predict_alibi_first_slope",
        "you predicted 0.03125",
        "predict_alibi_first_slope = 1 / 32\n",
    ),
    Mutant(
        "alibi_slope_not_a_number",
        "predict_alibi_first_slope",
        "predict_alibi_first_slope",
        "should be a finite number",
        'predict_alibi_first_slope = "2^-1/4"\n',
    ),
    Mutant(
        "length_thinks_unit",
        "predict_position_length",
        "predict_position_length",
        "you predicted 1;",
        "predict_position_length = 1\n",
    ),
    Mutant(
        "length_copies_512",
        "predict_position_length",
        "predict_position_length",
        "you predicted 16;",
        "predict_position_length = 16\n",
    ),
    Mutant(
        "length_sqrt_C",
        "predict_position_length",
        "predict_position_length",
        "the experiment gives 19.5959",
        "predict_position_length = 27.7\n",
    ),
    Mutant(
        "length_squared",
        "predict_position_length",
        "predict_position_length",
        "you predicted 384",
        "predict_position_length = 384\n",
    ),
    Mutant(
        "length_as_text",
        "predict_position_length",
        "predict_position_length",
        "should be a finite number",
        'predict_position_length = "19.6"\n',
    ),
    mutant(
        "similarity_unnormalised",
        ref.sinusoidal_similarity,
        "divided by both norms",
        ("cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))", "cos = (a * b).sum(-1)"),
    ),
    mutant(
        "similarity_off_by_one",
        ref.sinusoidal_similarity,
        "compare row p with row p + k",
        ("a, b = pe[:T], pe[k : k + T]", "a, b = pe[:T], pe[max(k - 1, 0) : max(k - 1, 0) + T]"),
    ),
    mutant(
        "similarity_against_row_k",
        ref.sinusoidal_similarity,
        "averaged over p = 0 .. T-1",
        ("a, b = pe[:T], pe[k : k + T]", "a, b = pe[:T], pe[k : k + 1].expand(T, -1)"),
    ),
    mutant(
        "similarity_ignores_base",
        ref.sinusoidal_similarity,
        "pass base on to sinusoidal_encoding",
        (
            "pe = sinusoidal_encoding(T + k, C, base=base, dtype=torch.float64)",
            "pe = sinusoidal_encoding(T + k, C, dtype=torch.float64)",
        ),
    ),
    mutant(
        "similarity_returns_tensor",
        ref.sinusoidal_similarity,
        "should return a Python float",
        ("return cos.mean().item()", "return cos.mean()"),
    ),
    mutant(
        "similarity_no_validation",
        ref.sinusoidal_similarity,
        "raise a ValueError",
        ("if k < 0:", "if k < -1:"),
    ),
    mutant(
        "ntk_linear_factor",
        ref.ntk_scaled_base,
        "factor times lower",
        ("return float(base * factor ** (D / (D - 2)))", "return float(base * factor)"),
    ),
    mutant(
        "ntk_exponent_inverted",
        ref.ntk_scaled_base,
        "solve base'^(-(D-2)/D)",
        ("return float(base * factor ** (D / (D - 2)))", "return float(base * factor ** ((D - 2) / D))"),
    ),
    mutant(
        "ntk_accepts_zero_factor",
        ref.ntk_scaled_base,
        "raise a ValueError",
        ("if factor <= 0:", "if factor < 0:"),
    ),
]

#: Automatically generated mutants (``scripts/mutation.py``) that no input the text allows can tell
#: from the answer, each with the reason.
_SIG = (
    "sinusoidal_similarity | def sinusoidal_similarity(k: int, C: int, T: int = 512, base: float = 10000.0) "
    "-> float:"
)
_COS = "sinusoidal_similarity | cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)) # (T,)"
EQUIVALENT = {
    f"{_SIG} | default | 2": (
        "the mean over p does not depend on T: every pair of rows k apart has the same similarity, "
        "(2 / C) sum_i cos(k w_i)"
    ),
    f"{_SIG} | default | 4": ("the mean over p does not depend on T (see default | 2)"),
    f"{_SIG} | default | 5": ("the mean over p does not depend on T (see default | 2)"),
    f"{_SIG} | default | 9": (
        "base 10001 instead of 10000 moves the similarity by far less than the band of 0.01 that float32 tables need"
    ),
    f"{_SIG} | default | 10": (
        "base 9999 instead of 10000 moves the similarity by far less than the band of 0.01 that float32 tables need"
    ),
    (
        "sinusoidal_similarity | pe = sinusoidal_encoding(T + k, C, base=base, dtype=torch.float64) # (T + k, C) "
        "| keyword | 2"
    ): ("a float32 table is allowed: its rounding (about 1e-4) is inside the band"),
    "sinusoidal_similarity | a, b = pe[:T], pe[k : k + T] # (T, C) each: positions p and p + k | slice | 5": (
        "the table has exactly T + k rows, so the slice k : k + T + 1 stops at the same row"
    ),
    f"{_COS} | unary | 1": ("a and b are 2-D, so dim=1 is dim=-1"),
    f"{_COS} | number | 2": ("a and b are 2-D, so dim=1 is dim=-1"),
    f"{_COS} | unary | 2": ("a and b are 2-D, so dim=1 is dim=-1"),
    f"{_COS} | number | 5": ("a and b are 2-D, so dim=1 is dim=-1"),
    f"{_COS} | unary | 3": ("a and b are 2-D, so dim=1 is dim=-1"),
    f"{_COS} | number | 8": ("a and b are 2-D, so dim=1 is dim=-1"),
    "ntk_scaled_base | if D <= 2 or D % 2: | number | 4": ("a number in the error message's text only"),
    "ntk_scaled_base | if base <= 1: | number | 3": ("a number in the error message's text only"),
    ("sinusoidal_encoding | pos = torch.arange(T, dtype=torch.float64)[:, None] # (T, 1) | keyword | 1"): (
        "int64 positions times the float64 frequencies promote to float64 with the same exact "
        "values (T < 2^53)"
    ),
}

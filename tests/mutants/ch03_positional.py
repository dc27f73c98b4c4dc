"""Wrong implementations for Exercise 3, each a mistake students really make."""

from tests.mutants import Mutant

#: graded part -> grade_id of its hidden test cell in solutions/ch03_positional

MUTANTS = [
    Mutant(
        "sinusoidal_sin_cos_swapped", "sinusoidal_encoding", "sinusoidal_encoding", "sin and cos are swapped",
        '''
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)
    angles = pos * freq
    return torch.stack([angles.cos(), angles.sin()], dim=-1).reshape(T, C).to(dtype)
''',
    ),
    Mutant(
        "sinusoidal_exponent_i_over_C", "sinusoidal_encoding", "sinusoidal_encoding", "frequency exponent is off",
        '''
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = base ** (-torch.arange(C // 2, dtype=torch.float64) / C)
    angles = pos * freq
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(T, C).to(dtype)
''',
    ),
    Mutant(
        "sinusoidal_frequency_per_channel", "sinusoidal_encoding", "sinusoidal_encoding", "every channel c its own",
        '''
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):
    pe = torch.zeros(T, C, dtype=torch.float64)
    for p in range(T):
        for c in range(C):
            angle = p / base ** (c / C)
            pe[p, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe.to(dtype)
''',
    ),
    Mutant(
        "sinusoidal_sines_then_cosines", "sinusoidal_encoding", "sinusoidal_encoding", "put all the sines first",
        '''
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)
    angles = pos * freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)
''',
    ),
    Mutant(
        "sinusoidal_ignores_base", "sinusoidal_encoding", "sinusoidal_encoding", "base argument is ignored",
        '''
def sinusoidal_encoding(T, C, base=10000.0, dtype=torch.float32):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = 10000.0 ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)
    angles = pos * freq
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(T, C).to(dtype)
''',
    ),
    Mutant(
        "rope_interleaved_pairs", "apply_rope", "apply_rope", "half-split",
        '''
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):
    positions = torch.as_tensor(positions, device=x.device)
    angles = rope_angles(positions, x.shape[-1], base=base, scaling=scaling, factor=factor)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]
    cos = angles.cos().repeat_interleave(2, -1).to(x.dtype)
    sin = angles.sin().repeat_interleave(2, -1).to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    partner = torch.stack([-x_odd, x_even], dim=-1).flatten(-2)
    return x * cos + partner * sin
''',
    ),
    Mutant(
        "rope_mixed_conventions", "apply_rope", "apply_rope", "repeat_interleave",
        '''
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):
    positions = torch.as_tensor(positions, device=x.device)
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]
    cos = angles.cos().repeat_interleave(2, -1).to(x.dtype)
    sin = angles.sin().repeat_interleave(2, -1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
''',
    ),
    Mutant(
        "rope_rotates_backwards", "apply_rope", "apply_rope", "the rotation goes the wrong way",
        '''
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):
    positions = torch.as_tensor(positions, device=x.device)
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([x2, -x1], dim=-1) * sin
''',
    ),
    Mutant(
        "rope_ignores_positions", "apply_rope", "apply_rope", "positions argument is ignored",
        '''
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):
    T, D = x.shape[-2:]
    angles = rope_angles(torch.arange(T), D, base=base, scaling=scaling, factor=factor)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
''',
    ),
    Mutant(
        "rope_positions_from_one", "apply_rope", "apply_rope", "shifted by one",
        '''
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):
    positions = torch.as_tensor(positions, device=x.device) + 1
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
''',
    ),
    Mutant(
        "rope_batched_positions_on_heads", "apply_rope", "apply_rope", "insert a head axis",
        '''
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):
    positions = torch.as_tensor(positions, device=x.device)
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
''',
    ),
    Mutant(
        "rope_drops_scaling", "apply_rope", "apply_rope", "pass base, scaling and factor on",
        '''
def apply_rope(x, positions, base=10000.0, scaling=None, factor=1.0):
    positions = torch.as_tensor(positions, device=x.device)
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
''',
    ),
    Mutant(
        "alibi_slopes_naive_rule", "alibi_slopes", "alibi_slopes", "is not a power of two",
        '''
def alibi_slopes(H, dtype=torch.float32):
    return torch.tensor([2.0 ** (-8.0 * i / H) for i in range(1, H + 1)], dtype=dtype)
''',
    ),
    Mutant(
        "alibi_slopes_reversed", "alibi_slopes", "alibi_slopes", "the slopes are reversed",
        '''
def alibi_slopes(H, dtype=torch.float32):
    def geometric(n):
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    n = 1 << (H.bit_length() - 1)
    slopes = geometric(n) + geometric(2 * n)[0::2][: H - n]
    return torch.tensor(slopes[::-1], dtype=dtype)
''',
    ),
    Mutant(
        "alibi_slopes_from_zero", "alibi_slopes", "alibi_slopes", "the exponents start at 0",
        '''
def alibi_slopes(H, dtype=torch.float32):
    def geometric(n):
        return [2.0 ** (-8.0 * i / n) for i in range(n)]

    n = 1 << (H.bit_length() - 1)
    slopes = geometric(n) + geometric(2 * n)[0::2][: H - n]
    return torch.tensor(slopes, dtype=dtype)
''',
    ),
    Mutant(
        "alibi_slopes_odd_extras", "alibi_slopes", "alibi_slopes", "[0::2], not [1::2]",
        '''
def alibi_slopes(H, dtype=torch.float32):
    def geometric(n):
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    n = 1 << (H.bit_length() - 1)
    slopes = geometric(n) + geometric(2 * n)[1::2][: H - n]
    return torch.tensor(slopes, dtype=dtype)
''',
    ),
    Mutant(
        "alibi_bias_sign_flipped", "alibi_bias", "alibi_bias", "the sign is flipped",
        '''
def alibi_bias(slopes, T, S=None):
    S = T if S is None else S
    i = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    bias = slopes[:, None, None] * (i - j).to(slopes.dtype)
    return bias.masked_fill(j > i, float("-inf"))
''',
    ),
    Mutant(
        "alibi_bias_not_causal", "alibi_bias", "alibi_bias", "future keys must be -inf",
        '''
def alibi_bias(slopes, T, S=None):
    S = T if S is None else S
    i = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    return -slopes[:, None, None] * (i - j).abs().to(slopes.dtype)
''',
    ),
    Mutant(
        "alibi_bias_off_by_one", "alibi_bias", "alibi_bias", "the distance is off by one",
        '''
def alibi_bias(slopes, T, S=None):
    S = T if S is None else S
    i = torch.arange(T)[:, None] + (S - T)
    j = torch.arange(S)[None, :]
    bias = -slopes[:, None, None] * (i - j + 1).to(slopes.dtype)
    return bias.masked_fill(j > i, float("-inf"))
''',
    ),
    Mutant(
        "alibi_bias_top_left", "alibi_bias", "alibi_bias", "misaligned",
        '''
def alibi_bias(slopes, T, S=None):
    S = T if S is None else S
    i = torch.arange(T)[:, None]
    j = torch.arange(S)[None, :]
    bias = slopes[:, None, None] * (j - i).to(slopes.dtype)
    return bias.masked_fill(j > i, float("-inf"))
''',
    ),
]

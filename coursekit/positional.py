"""Chapter 3: positional encodings.

Attention by itself does not know where a token is: permute the tokens and the
outputs are permuted the same way. This module holds the standard ways of telling
it, in three families:

* **absolute, added to the token embeddings**: :func:`sinusoidal_encoding`
  (Vaswani et al., 2017) and :class:`LearnedPositionalEmbedding` (a table, as in
  BERT and GPT-2);
* **relative, added to the scores**: :class:`RelativePositionBias` (offsets
  clipped as in Shaw et al., 2018, with one learned scalar per head and clipped
  offset, as in T5's bias) and :func:`alibi_bias` (Press et al., 2022);
* **relative, by rotating queries and keys**: :func:`apply_rope` (Su et al.,
  2021), with position interpolation (Chen et al., 2023) and NTK-aware base
  scaling (bloc97, 2023) to stretch a trained context.

Conventions (see the book's notation page):

* Shapes: ``B`` batch, ``T`` queries, ``S`` keys, ``C`` model width, ``H`` heads,
  ``D`` head width. Positions start at 0.
* An offset is *key position minus query position*, ``j - i``: negative for the
  past. With ``S > T`` keys the queries are the *last* ``T`` of ``S`` positions
  (bottom-right alignment, as in :func:`coursekit.attention.causal_mask`).
* Sinusoidal encodings use the **interleaved** layout: channel ``2i`` holds the
  sine and channel ``2i + 1`` the cosine of the same frequency.
* RoPE uses the **half-split** pairing of Hugging Face's Llama and GPT-NeoX:
  channel ``i`` is rotated together with channel ``i + D/2``.
* Position biases are floating ``(H, T, S)`` tensors, additive masks for
  :func:`coursekit.attention.scaled_dot_product_attention`; ``-inf`` marks a key
  the query may not see.

Over 500 lines: every positional scheme the chapter compares, and the exercise's experiment
(``sinusoidal_similarity``), whose code the solution notebook holds next to the parts it uses.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "sinusoidal_encoding",
    "sinusoidal_shift_matrix",
    "LearnedPositionalEmbedding",
    "relative_positions",
    "RelativePositionBias",
    "rope_frequencies",
    "ntk_scaled_base",
    "rope_angles",
    "apply_rope",
    "alibi_slopes",
    "alibi_bias",
    "sinusoidal_similarity",
]

ROPE_SCALINGS = (None, "linear", "ntk")


# --------------------------------------------------------------------------- sinusoidal


def sinusoidal_encoding(
    T: int, C: int, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Sinusoidal position encodings of Vaswani et al. (2017), interleaved layout.

    ``PE[p, 2i] = sin(p w_i)`` and ``PE[p, 2i + 1] = cos(p w_i)`` with frequencies
    ``w_i = base^(-2i / C)`` for ``i = 0 .. C/2 - 1``: wavelengths from ``2 pi``
    (channels 0, 1) up to almost ``2 pi base`` (the last pair). The angles are
    computed in float64 and the result is cast to ``dtype``.

    Args:
        T: number of positions, ``0 .. T-1`` (``T = 0`` gives an empty table).
        C: width of each encoding, even.
        base: sets the longest wavelength; 10000 in the paper.
        dtype: floating dtype of the result.

    Returns:
        ``(T, C)`` tensor; row ``p`` is the encoding of position ``p``.

    Raises:
        ValueError: if ``C`` is odd or not positive, ``T`` is negative or ``base`` is not positive.

    Example:
        ``sinusoidal_encoding(2, 4)[1]`` is ``[sin 1, cos 1, sin 0.01, cos 0.01]``
        ``= [0.8415, 0.5403, 0.0100, 0.99995]``.
    """
    if T < 0 or C <= 0 or C % 2:
        raise ValueError(f"sinusoidal_encoding needs T >= 0 and an even C > 0, got T={T} and C={C}")
    if base <= 0:
        raise ValueError(f"base must be positive, got {base}")
    pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    freq = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)  # (C/2,) w_i = base^(-2i/C)
    angles = pos * freq  # (T, C/2)
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (T, C/2, 2): (sin, cos) per frequency
    return pe.reshape(T, C).to(dtype)  # (T, C): sin, cos, sin, cos, ...


def sinusoidal_shift_matrix(
    k: float, C: int, base: float = 10000.0, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """The fixed linear map ``M_k`` with ``PE(p + k) = M_k PE(p)`` for every position ``p``.

    Each (sin, cos) pair of :func:`sinusoidal_encoding` is a point on a circle
    turning with the position, so moving ``k`` positions ahead is a rotation by
    ``k w_i`` of every pair: ``M_k`` is block diagonal with the ``2 x 2`` blocks
    ``[[cos k w_i, sin k w_i], [-sin k w_i, cos k w_i]]``. It depends on ``k``,
    not on ``p``, which is why Vaswani et al. (2017) hoped the encodings would let
    a model attend by relative position.

    Args:
        k: the shift (any real number; negative moves back).
        C: width of the encodings, even.
        base: as in :func:`sinusoidal_encoding`.
        dtype: floating dtype of the result.

    Returns:
        ``(C, C)`` matrix. For row vectors, ``PE[p + k] = PE[p] @ M_k.T``.
    """
    if C <= 0 or C % 2:
        raise ValueError(f"C must be even and positive, got C={C}")
    freq = base ** (-torch.arange(0, C, 2, dtype=torch.float64) / C)  # (C/2,)
    c, s = torch.cos(k * freq), torch.sin(k * freq)  # each (C/2,)
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (C/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype)  # (C, C)


# --------------------------------------------------------------------------- learned absolute


class LearnedPositionalEmbedding(nn.Module):
    """One learned vector per position, up to ``max_len`` (BERT's and GPT-2's ``wpe``).

    The table has nothing to say about positions it was not built with: asking for
    one raises a ``ValueError`` (and positions it was built with but never saw in
    training keep their random initial vectors).

    Args:
        max_len: number of positions in the table, ``0 .. max_len-1``.
        d_model: width ``C`` of each vector.
        init_std: standard deviation of the initial values (0.02, as in Hugging Face's
            GPT-2 and BERT).
    """

    def __init__(self, max_len: int, d_model: int, init_std: float = 0.02):
        super().__init__()
        if max_len <= 0 or d_model <= 0:
            raise ValueError(f"max_len and d_model must be positive, got {max_len} and {d_model}")
        self.max_len = max_len
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * init_std)  # (max_len, C)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """Look up the vectors of ``positions``.

        Args:
            positions: integer tensor of any shape, e.g. ``torch.arange(T)`` or
                ``(B, T)``.

        Returns:
            ``(*positions.shape, C)``, e.g. ``(T, C)`` to add to ``(B, T, C)`` embeddings.
        """
        if (
            not isinstance(positions, torch.Tensor)
            or positions.dtype.is_floating_point
            or positions.dtype == torch.bool
        ):
            raise TypeError(
                f"positions must be an integer tensor, got {getattr(positions, 'dtype', type(positions).__name__)}"
            )
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= self.max_len):
            raise ValueError(
                f"positions must lie in 0 .. {self.max_len - 1} (max_len={self.max_len}), got "
                f"{int(positions.min())} .. {int(positions.max())}: a learned table has no vector "
                "for positions beyond its length"
            )
        return self.weight[positions]  # (*positions.shape, C)


# --------------------------------------------------------------------------- relative bias


def relative_positions(
    T: int, S: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Offsets ``j - i`` (key position minus query position), bottom-right aligned.

    With ``S > T`` the queries are the last ``T`` of ``S`` positions, so query ``i``
    sits at position ``i + S - T``, as in :func:`coursekit.attention.causal_mask`.

    Args:
        T: number of queries.
        S: number of keys, ``S >= T``; defaults to ``T``.
        device: where to create the result.

    Returns:
        ``(T, S)`` int64 tensor: 0 on a query's own position, negative for the past.

    Example:
        ``relative_positions(2, 3)`` is ``[[-1, 0, 1], [-2, -1, 0]]``.
    """
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"relative_positions needs 0 <= T <= S, got T={T} and S={S}")
    i = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) query positions
    j = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    return j - i  # (T, S)


class RelativePositionBias(nn.Module):
    """A learned scalar bias per head and clipped offset, added to the attention scores.

    Offsets ``j - i`` are clipped to ``[-max_distance, max_distance]`` as in Shaw et
    al. (2018): all keys further away than ``max_distance`` share one bias, which is
    what lets the layer run on sequences longer than any seen in training. Shaw et
    al. learn a *vector* per clipped offset and add it to the keys; here, as in T5
    (Raffel et al., 2020), each head learns a *scalar* per offset that is added to
    the score (T5 groups offsets into logarithmic buckets instead of clipping).

    Args:
        n_heads: number of heads ``H``.
        max_distance: clipping distance ``K``; the table has ``2K + 1`` columns.

    The parameter ``bias`` has shape ``(H, 2K + 1)``; column ``K + o`` holds the
    bias of the clipped offset ``o``. It starts at zero (no position preference).
    """

    def __init__(self, n_heads: int, max_distance: int):
        super().__init__()
        if n_heads <= 0 or max_distance < 0:
            raise ValueError(f"need n_heads > 0 and max_distance >= 0, got {n_heads} and {max_distance}")
        self.max_distance = max_distance
        self.bias = nn.Parameter(torch.zeros(n_heads, 2 * max_distance + 1))  # (H, 2K+1)

    def forward(self, T: int, S: int | None = None) -> torch.Tensor:
        """The additive bias for ``T`` queries and ``S`` keys (bottom-right aligned).

        Returns:
            ``(H, T, S)``; add a causal mask separately if the model is causal.
        """
        K = self.max_distance
        offsets = relative_positions(T, S, device=self.bias.device).clamp(-K, K)  # (T, S)
        return self.bias[:, offsets + K]  # (H, T, S)


# --------------------------------------------------------------------------- RoPE


def rope_frequencies(D: int, base: float = 10000.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """RoPE's rotation frequencies ``theta_i = base^(-2i / D)``, ``i = 0 .. D/2 - 1``.

    Pair ``i`` turns by ``p theta_i`` radians at position ``p``: the first pair a full
    radian per token, the last one about ``base`` times slower.

    Args:
        D: head width, even.
        base: 10000 in Su et al. (2021); larger in long-context models.
        dtype: floating dtype of the result.

    Returns:
        ``(D/2,)`` tensor, decreasing from 1.

    Example:
        ``rope_frequencies(4)`` is ``[1, 0.01]``.
    """
    if D <= 0 or D % 2:
        raise ValueError(f"the head width D must be even and positive, got D={D}")
    if base <= 1:
        raise ValueError(f"base must be larger than 1, got {base}")
    return (base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)).to(dtype)  # (D/2,)


def ntk_scaled_base(base: float, D: int, factor: float) -> float:
    """NTK-aware RoPE base for a context ``factor`` times longer: ``base * factor^(D / (D - 2))``.

    Position interpolation (Chen et al., 2023) divides every angle by ``factor``, which also
    slows the highest frequencies that tell neighbouring tokens apart. NTK-aware scaling
    (bloc97, 2023) changes the base instead, so that the *lowest* frequency
    ``theta_{D/2-1} = base^(-(D-2)/D)`` becomes exactly ``factor`` times lower (its wavelength
    stretched like position interpolation's) while the highest, ``theta_0 = 1``, is unchanged
    and the ones in between are slowed less the higher they are.

    Args:
        base: the trained RoPE base, ``> 1`` (10000 in Su et al., 2021).
        D: head width, even and ``> 2`` (with ``D = 2`` there is only the frequency 1).
        factor: the context extension factor, ``> 0`` (``1`` keeps ``base``).

    Returns:
        The new base, a Python ``float``.

    Raises:
        ValueError: if ``D`` is odd or ``<= 2``, ``base <= 1`` or ``factor <= 0``, naming the value.

    Example:
        ``ntk_scaled_base(10000.0, 4, 4.0)`` is ``10000 * 4^2 = 160000.0``: the frequencies go from
        ``[1, 0.01]`` to ``[1, 0.0025]``.
    """
    if D <= 2 or D % 2:
        raise ValueError(f"NTK-aware scaling needs an even D > 2, got D={D}")
    if base <= 1:
        raise ValueError(f"base must be larger than 1, got {base}")
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor}")
    return float(base * factor ** (D / (D - 2)))


def rope_angles(
    positions: torch.Tensor,
    D: int,
    base: float = 10000.0,
    scaling: str | None = None,
    factor: float = 1.0,
) -> torch.Tensor:
    """Rotation angles ``p theta_i`` for every position ``p`` and pair ``i``, in float64.

    ``scaling`` stretches a context trained at length ``L`` to ``factor * L``:

    * ``None``: plain RoPE (``factor`` is ignored);
    * ``"linear"``: position interpolation (Chen et al., 2023): positions are
      divided by ``factor``, so the longer context reuses the trained angles
      (Hugging Face's ``rope_type="linear"``);
    * ``"ntk"``: NTK-aware scaling: the base becomes :func:`ntk_scaled_base`, which
      slows the low frequencies and keeps the high ones.

    Args:
        positions: ``(T,)`` or ``(B, T)`` (any shape works), integers or floats.
        D: head width, even.
        base: RoPE base.
        scaling: ``None``, ``"linear"`` or ``"ntk"``.
        factor: the context extension factor, ``> 0``.

    Returns:
        ``(*positions.shape, D/2)`` float64 tensor (float64 keeps large positions exact).
    """
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"scaling must be one of {ROPE_SCALINGS}, got {scaling!r}")
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor}")
    positions = torch.as_tensor(positions)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be integers or real numbers, got {positions.dtype}")
    if scaling == "ntk":
        base = ntk_scaled_base(base, D, factor)
    p = positions.to(torch.float64)
    if scaling == "linear":
        p = p / factor
    return p[..., None] * rope_frequencies(D, base).to(p.device)  # (*positions.shape, D/2)


def apply_rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    base: float = 10000.0,
    scaling: str | None = None,
    factor: float = 1.0,
) -> torch.Tensor:
    """Rotate queries or keys by their positions: rotary position embedding (Su et al., 2021).

    **Pairing convention: half-split.** Channel ``i`` and channel ``i + D/2`` form a
    pair that turns by the angle ``p theta_i`` (counter-clockwise:
    ``(a, b) -> (a cos - b sin, a sin + b cos)``), as in Hugging Face's Llama
    (``rotate_half``) and GPT-NeoX. Su et al. and Meta's original LLaMA code pair
    neighbours ``(2i, 2i + 1)`` instead ("interleaved"). The two differ by a fixed
    permutation of the channels, which learned projections absorb, but weights
    trained with one convention give wrong results with the other.

    Because each pair is rotated, ``rope(q, m) . rope(k, n)`` depends on the
    positions only through ``n - m``, and norms are unchanged.

    Args:
        x: ``(B, H, T, D)`` queries or keys (``(B, T, D)`` or ``(T, D)`` also work).
        positions: ``(T,)`` positions shared by the batch, or ``(B, T)`` one row per
            sequence (for ``x`` of shape ``(B, T, D)`` or ``(B, H, T, D)``);
            integers or floats.
        base, scaling, factor: as in :func:`rope_angles` (``factor`` defaults to 1.0).

    Returns:
        A new tensor of the shape and dtype of ``x`` (``x`` itself is not modified).

    Raises:
        ValueError: if ``D`` is odd, ``x`` has fewer than 2 dimensions, or ``positions``
            is neither ``(T,)`` nor ``(B, T)`` with ``x``'s ``T`` (and ``B``).

    Example:
        With ``D = 4`` (frequencies 1 and 0.01), ``x = [1, 0, 0, 0]`` at position 1
        becomes ``[cos 1, 0, sin 1, 0]``: channel 0 turns towards channel 2.
    """
    positions = torch.as_tensor(positions, device=x.device)
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must be (..., T, D) with an even D, got {tuple(x.shape)}")
    if positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"positions must be (T,) or (B, T) with T={x.shape[-2]}, got {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and (x.dim() not in (3, 4) or x.shape[0] != positions.shape[0]):
        raise ValueError(f"positions (B, T) need x of shape (B, T, D) or (B, H, T, D), got {tuple(x.shape)}")
    D = x.shape[-1]
    angles = rope_angles(positions, D, base=base, scaling=scaling, factor=factor)  # (T, D/2) or (B, T, D/2)
    if positions.dim() == 2 and x.dim() == 4:
        angles = angles[:, None]  # (B, 1, T, D/2): the same positions for every head
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)  # (..., T, D)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)  # (..., T, D)
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]  # each (..., T, D/2): the two halves of every pair
    partner = torch.cat([-x2, x1], dim=-1)  # (..., T, D): each pair turned by 90 degrees
    return x * cos + partner * sin  # (..., T, D)


# --------------------------------------------------------------------------- ALiBi


def alibi_slopes(H: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ALiBi's per-head slopes, by the rule of Press et al. (2022).

    For ``H`` a power of two the slopes are the geometric sequence
    ``2^(-8 i / H)``, ``i = 1 .. H``. Otherwise, with ``n`` the largest power of
    two below ``H``, they are the ``n`` slopes for ``n`` heads followed by the
    first ``H - n`` slopes with an odd ``i`` (``i = 1, 3, 5, ...``) of the sequence for ``2n`` heads
    (counting ``i`` from 1, as in the formula). The first extra slope, ``2^(-8 / (2n))``, is steeper
    than all ``n``; the others fall between neighbouring ones (for 12 heads: ``2^-0.5`` above ``2^-1``,
    then ``2^-1.5``, ``2^-2.5``, ``2^-3.5``).

    Args:
        H: number of heads, ``>= 1``.
        dtype: floating dtype of the result.

    Returns:
        ``(H,)`` tensor of slopes in ``(0, 1)``.

    Raises:
        ValueError: if ``H < 1``.

    Example:
        ``alibi_slopes(8)`` is ``[1/2, 1/4, ..., 1/256]``;
        ``alibi_slopes(3)`` is ``[1/16, 1/256, 1/4]``.
    """
    if H < 1:
        raise ValueError(f"alibi_slopes needs at least one head, got H={H}")

    def geometric(n):  # the slopes for n heads, n a power of two
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    n = 1 << (H.bit_length() - 1)  # the largest power of two <= H
    slopes = geometric(n) + geometric(2 * n)[0::2][: H - n]
    return torch.tensor(slopes, dtype=dtype)  # (H,)


def alibi_bias(slopes: torch.Tensor, T: int, S: int | None = None) -> torch.Tensor:
    """Causal ALiBi bias (Press et al., 2022): ``-m_h (i - j)`` for past keys, ``-inf`` for future ones.

    Head ``h`` penalises a key linearly in its distance from the query, with slope
    ``m_h``; the query's own key gets 0. Keys after the query get ``-inf``, so the
    bias *is* the causal mask and can be passed alone as the additive ``mask`` of
    :func:`coursekit.attention.scaled_dot_product_attention`. With ``S > T`` the
    queries are the last ``T`` of ``S`` positions (bottom-right alignment, as in
    :func:`coursekit.attention.causal_mask`), so query ``i`` sits at ``i + S - T``.

    Args:
        slopes: ``(H,)`` floating, e.g. :func:`alibi_slopes` (any values; not modified).
        T: number of queries, ``>= 0``.
        S: number of keys, ``S >= T``; defaults to ``T``.

    Returns:
        ``(H, T, S)`` tensor of the dtype of ``slopes``, on their device.

    Raises:
        ValueError: if ``slopes`` is not a floating ``(H,)`` tensor, ``T < 0`` or ``S < T``.

    Example:
        ``alibi_bias(torch.tensor([0.5]), 3)[0]`` is
        ``[[0, -inf, -inf], [-0.5, 0, -inf], [-1, -0.5, 0]]``.
    """
    S = T if S is None else S
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1 or not slopes.dtype.is_floating_point:
        raise ValueError(
            f"slopes must be a floating (H,) tensor, got {getattr(slopes, 'shape', type(slopes).__name__)}"
        )
    if T < 0 or S < T:
        raise ValueError(f"alibi_bias needs 0 <= T <= S, got T={T} and S={S}")
    i = torch.arange(T, device=slopes.device)[:, None] + (S - T)  # (T, 1) query positions
    j = torch.arange(S, device=slopes.device)[None, :]  # (1, S) key positions
    offset = (j - i).to(slopes.dtype)  # (T, S): 0 for the query's own key, -1 for the one before, ...
    bias = slopes[:, None, None] * offset  # (H, T, S): -m_h (i - j)
    return bias.masked_fill(j > i, float("-inf"))  # (H, T, S): future keys removed


# --------------------------------------------------------------------------- experiment


def sinusoidal_similarity(k: int, C: int, T: int = 512, base: float = 10000.0) -> float:
    """How alike the sinusoidal encodings of two positions ``k`` apart are: their mean cosine similarity.

    Builds :func:`sinusoidal_encoding` ``(T + k, C)`` in float64 and averages, over the positions
    ``p = 0 .. T-1``, the cosine similarity of rows ``p`` and ``p + k``. Every row has norm
    ``sqrt(C / 2)`` and ``PE(p) . PE(p + k) = sum_i cos(k w_i)`` for every ``p``, so the result is
    ``(2 / C) sum_i cos(k w_i)``: it depends on the offset only, is 1 at ``k = 0`` and falls, not
    monotonically, as ``k`` grows.

    Args:
        k: the offset, ``>= 0``.
        C: width of the encodings, even and positive.
        T: number of position pairs averaged, ``>= 1``.
        base: as in :func:`sinusoidal_encoding`.

    Returns:
        The mean cosine similarity, a Python ``float`` in ``[-1, 1]``.

    Raises:
        ValueError: if ``k < 0`` or ``T < 1`` (naming the value), or for a ``C`` or ``base`` that
            :func:`sinusoidal_encoding` refuses.

    Example:
        ``sinusoidal_similarity(0, 64)`` is ``1.0``; ``sinusoidal_similarity(1, 2)`` is ``cos 1 = 0.5403``.
    """
    if k < 0:
        raise ValueError(f"the offset k must be >= 0, got k={k}")
    if T < 1:
        raise ValueError(f"T must be at least 1, got T={T}")
    pe = sinusoidal_encoding(T + k, C, base=base, dtype=torch.float64)  # (T + k, C)
    a, b = pe[:T], pe[k : k + T]  # (T, C) each: positions p and p + k
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))  # (T,)
    return cos.mean().item()


# --------------------------------------------------------------------------- YaRN (NTK-by-parts + temperature)

import math  # noqa: E402  (this block is appended to the module; its imports stay with it)


def yarn_inv_freq(
    D: int,
    base: float = 10000.0,
    scale: float = 1.0,
    original_max: int = 2048,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """RoPE frequencies stretched by YaRN's "NTK-by-parts" interpolation (Peng et al., 2023).

    Pair ``i`` of plain RoPE turns by ``theta_i = base^(-2i / D)`` per token, so over the trained
    context of ``L = original_max`` tokens it makes ``r_i = L theta_i / (2 pi)`` full turns. YaRN
    treats the pairs by that count:

    * pairs that turn many times (``r_i > beta_fast``) already saw every angle in training and
      keep their frequency (no interpolation: they tell neighbours apart);
    * pairs that turn less than ``beta_slow`` times never completed a turn; they are divided by
      ``scale``, as position interpolation does, so a ``scale`` times longer context reuses
      trained angles;
    * in between, ``theta_i' = (1 - g_i) theta_i / scale + g_i theta_i`` with ``g_i`` falling linearly
      from 1 to 0 over the pair index, between the pair where ``r = beta_fast`` and the one where
      ``r = beta_slow`` (rounded outward when ``truncate``).

    The pair where ``r = beta`` is ``d(beta) = D ln(L / (2 pi beta)) / (2 ln base)``. This follows
    the authors' code and Hugging Face's ``rope_type="yarn"`` (``_compute_yarn_parameters``),
    whose boundaries are clamped to ``[0, D - 1]``. YaRN also sharpens the softmax:
    :func:`yarn_mscale`.

    Args:
        D: head width, even and positive.
        base: RoPE base, ``> 1``.
        scale: the context extension factor ``s > 0`` (1 gives plain RoPE).
        original_max: the trained context ``L``, ``>= 1``.
        beta_fast: turns above which a pair is kept as it is, ``> 0``.
        beta_slow: turns below which a pair is fully interpolated, ``0 < beta_slow < beta_fast``.
        truncate: round the boundary pairs outward to integers (Hugging Face's default).

    Returns:
        ``(D/2,)`` float64 frequencies, between ``theta_i / scale`` and ``theta_i``.

    Raises:
        ValueError: a bad ``D`` or ``base`` (:func:`rope_frequencies`), ``scale <= 0``,
            ``original_max < 1`` or betas not ``0 < beta_slow < beta_fast``.

    Example:
        ``yarn_inv_freq(8, 10000.0, 4.0, 2048)`` keeps the two fastest pairs ``[1, 0.1]`` (they turn
        326 and 33 times in 2048 tokens), quarters the slowest ``0.001 -> 0.00025`` and moves the third
        ``0.01`` part of the way: the ramp runs over pair indices 1 to 3, so ``g = 1/2`` and
        ``0.01 -> (0.0025 + 0.01) / 2 = 0.00625``.
    """
    theta = rope_frequencies(D, base)  # (D/2,) float64, validates D and base
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if original_max < 1:
        raise ValueError(f"original_max must be at least 1, got {original_max}")
    if not 0 < beta_slow < beta_fast:
        raise ValueError(
            f"need 0 < beta_slow < beta_fast, got beta_slow={beta_slow} and beta_fast={beta_fast}"
        )

    def pair_with_turns(turns: float) -> float:  # the (fractional) pair index i where r_i = turns
        return D * math.log(original_max / (2 * math.pi * turns)) / (2 * math.log(base))

    low, high = pair_with_turns(beta_fast), pair_with_turns(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    if low == high:
        high += 0.001  # as Hugging Face: avoids dividing by zero
    i = torch.arange(D // 2, dtype=torch.float64)  # (D/2,) pair indices
    ramp = ((i - low) / (high - low)).clamp(0, 1)  # (D/2,) 0 keeps theta_i, 1 divides it by scale
    return theta / scale * ramp + theta * (1 - ramp)  # (D/2,)


def yarn_mscale(scale: float) -> float:
    """YaRN's attention temperature: multiply cos and sin by ``0.1 ln(s) + 1`` (1 for ``s <= 1``).

    Interpolated positions sit closer together, which flattens the softmax; Peng et al. (2023)
    counter it by scaling the logits by ``1 / t`` with ``sqrt(1 / t) = 0.1 ln(s) + 1``, fitted on
    LLaMA. Scaling both the rotated query and key by ``sqrt(1 / t)`` does that, and Hugging Face
    returns it as the ``attention_factor`` that multiplies cos and sin.

    Args:
        scale: the context extension factor ``s > 0``.

    Returns:
        The factor, a Python ``float`` (``0.1 ln 4 + 1 = 1.1386...`` for ``s = 4``).
    """
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    return 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0


__all__ += ["yarn_inv_freq", "yarn_mscale"]


# --------------------------------------------------------------------------- adding or concatenating positions

#: how :func:`position_recovery_r2` combines a token vector with its position vector
POSITION_INPUTS = ("add", "concat")


def position_recovery_r2(
    C: int,
    T: int,
    mode: str,
    n_tokens: int = 1000,
    n_samples: int = 4096,
    token_std: float = 0.5**0.5,
    base: float = 10000.0,
    generator: torch.Generator | None = None,
) -> float:
    """How well an affine map reads a token's position back out of its input vector: held-out R^2.

    Draws a table of ``n_tokens`` random token vectors ``E`` ``(n_tokens, C)``, entries
    ``N(0, token_std^2)``, and ``2 n_samples`` (token, position) pairs, both uniform (positions
    ``0 .. T-1``). Each pair becomes one input: ``E[t] + PE[p]`` ``(C,)`` for ``mode="add"``, or
    ``[E[t], PE[p]]`` ``(2C,)`` for ``mode="concat"``, with ``PE`` the :func:`sinusoidal_encoding`.
    An affine map from input to ``PE[p]`` is fitted by least squares (the minimum-norm solution by
    SVD, singular values below ``1e-10`` of the largest counted as zero) on the first ``n_samples``
    pairs and scored on the other ``n_samples``::

        R^2 = 1 - sum ||PE[p] - fitted||^2 / sum ||PE[p] - mean||^2

    summed over the held-out pairs and all ``C`` channels, ``mean`` being their own mean. 1 means
    the position vector is recovered exactly, 0 no better than by its mean. Concatenation keeps
    the two parts in separate channels, so R^2 is 1 up to rounding; adding mixes them, and R^2
    falls short of 1 by how much of the token vectors lies where the position vectors vary.

    The default ``token_std`` gives token vectors the expected squared norm ``C / 2`` of every
    position vector. Everything is float64; the draws, in this order, all from ``generator``:
    ``E = randn(n_tokens, C) * token_std``, token ids ``randint(0, n_tokens, (2 n_samples,))``,
    positions ``randint(0, T, (2 n_samples,))``.

    Args:
        C: width of token and position vectors, even and positive.
        T: number of positions, ``>= 2``.
        mode: ``"add"`` or ``"concat"``.
        n_tokens: size of the token table, ``>= 1``.
        n_samples: pairs to fit on, and as many to score on; more than the input width plus one.
        token_std: standard deviation of the token vectors' entries, ``>= 0``.
        base: as in :func:`sinusoidal_encoding`.
        generator: the source of randomness (``None``: torch's global generator).

    Returns:
        The held-out R^2, a Python ``float``, at most 1.

    Raises:
        ValueError: for an unknown ``mode``, ``T < 2``, ``n_tokens < 1``, a negative ``token_std``,
            too few ``n_samples`` for the input width, or a ``C`` or ``base`` that
            :func:`sinusoidal_encoding` refuses.

    Example:
        With ``C=64, T=128`` and the defaults, ``"concat"`` gives 1.0 (to about ``1e-12``) and
        ``"add"`` about 0.6: the book's Chapter 3 shows how the gap closes as ``C`` grows.
    """
    if mode not in POSITION_INPUTS:
        raise ValueError(f"mode must be one of {POSITION_INPUTS}, got {mode!r}")
    if T < 2:
        raise ValueError(f"T must be at least 2 (one position has nothing to recover), got T={T}")
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be at least 1, got {n_tokens}")
    if not token_std >= 0:
        raise ValueError(f"token_std must be >= 0, got {token_std}")
    pe = sinusoidal_encoding(T, C, base=base, dtype=torch.float64)  # (T, C); validates C and base
    width = C if mode == "add" else 2 * C
    if n_samples <= width + 1:
        raise ValueError(
            f"n_samples must exceed the input width plus one ({width + 1} for mode={mode!r}, C={C}), "
            f"got {n_samples}"
        )
    E = torch.randn(n_tokens, C, generator=generator, dtype=torch.float64) * token_std  # (n_tokens, C)
    tok = torch.randint(0, n_tokens, (2 * n_samples,), generator=generator)  # (2N,) token ids
    pos = torch.randint(0, T, (2 * n_samples,), generator=generator)  # (2N,) positions
    if mode == "add":
        x = E[tok] + pe[pos]  # (2N, C)
    else:
        x = torch.cat([E[tok], pe[pos]], dim=-1)  # (2N, 2C)
    y = pe[pos]  # (2N, C): the target, each pair's position vector
    x_fit, y_fit, x_test, y_test = x[:n_samples], y[:n_samples], x[n_samples:], y[n_samples:]
    x_mean, y_mean = x_fit.mean(0), y_fit.mean(0)  # centring both sides fits the bias
    # The T position vectors span fewer than C directions (about 60 for T=128, C=512), so some input
    # directions are exactly dependent: the SVD solver with a relative cutoff drops them, where
    # pivoted QR ("gelsy", torch's default) was seen to give a different answer from run to run.
    W = torch.linalg.lstsq(x_fit - x_mean, y_fit - y_mean, rcond=1e-10, driver="gelsd").solution  # (width, C)
    fitted = (x_test - x_mean) @ W + y_mean  # (N, C)
    residual = (y_test - fitted).pow(2).sum()
    total = (y_test - y_test.mean(0)).pow(2).sum()
    return (1 - residual / total).item()


__all__ += ["position_recovery_r2"]

"""Chapter 1: scaled dot-product attention, masks and score functions.

Conventions (see the book's notation page):

* Shapes: ``B`` batch, ``T`` query length, ``S`` key length, ``C`` model width,
  ``D`` head width. Any number of leading batch dimensions ``...`` is allowed.
* Row convention: ``softmax(Q K^T / sqrt(D)) V`` with the sequence on the
  second-to-last axis, so queries are rows of ``Q`` with shape ``(..., T, D)``.
* Masks: a boolean mask is ``True`` where a query **may attend** to a key, as in
  :func:`torch.nn.functional.scaled_dot_product_attention`. A floating mask is
  *additive*: it is added to the scores (``0`` keeps a key, ``-inf`` removes it).
* A fully masked row (a query that may attend to no key) gets all-zero weights
  and therefore a zero output. It never produces NaN.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "softmax",
    "check_attention_inputs",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "from_key_padding_mask",
    "bool_to_additive",
    "additive_to_bool",
    "dot_scores",
    "scaled_dot_scores",
    "BilinearScore",
    "AdditiveScore",
    "SelfAttention",
    "score_variance",
    "online_softmax",
]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable softmax along ``dim``.

    Subtracting the maximum of each slice before exponentiating leaves the result
    unchanged (the factor ``exp(-max)`` cancels) but keeps ``exp`` from
    overflowing. A slice whose entries are all ``-inf`` (a fully masked row) gives
    all zeros instead of NaN.

    Args:
        x: float32 or float64 tensor of any shape (it is not modified).
        dim: the axis that is normalised; negative values count from the end.

    Returns:
        A new tensor of the same shape and dtype as ``x``; slices along ``dim`` sum to
        1, except all ``-inf`` slices, which are all 0; ``-inf`` entries get 0.
        Accurate for large positive and very negative inputs (``x`` around ``1e4``
        or ``-1e4``) in float32 as in float64.

    Example:
        ``softmax(torch.tensor([0.0, math.log(3.0)]))`` is ``tensor([0.25, 0.75])``.
    """
    if not torch.is_floating_point(x):
        raise TypeError(f"softmax expects a floating tensor, got dtype {x.dtype}")
    m = x.amax(dim=dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf slice: shift by 0
    e = torch.exp(x - m)
    s = e.sum(dim=dim, keepdim=True)
    return e / torch.where(s > 0, s, torch.ones_like(s))  # an all -inf slice is 0 / 1


def check_attention_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> None:
    """Raise a clear error unless ``q, k, v`` and ``mask`` fit together.

    Args:
        q: queries ``(..., T, D)``.
        k: keys ``(..., S, D)``.
        v: values ``(..., S, Dv)``.
        mask: ``None``, or a boolean or floating tensor that broadcasts to
            ``(..., T, S)``; a floating mask has the dtype of ``q``.

    Raises:
        TypeError: a non-tensor, a non-floating ``q, k, v``, mixed dtypes, or a
            mask that is neither boolean nor of ``q``'s floating dtype.
        ValueError: shapes that do not fit together, naming the shapes received.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., length, width), got {tuple(t.shape)}")
        if not torch.is_floating_point(t):
            raise TypeError(f"{name} must be a floating tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            "k and v must have the same number of keys (dimension -2), "
            f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            "the leading (batch) dimensions of q, k and v must broadcast, "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)}"
        ) from None
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not torch.is_floating_point(mask):
        raise TypeError(f"mask must be boolean (True = may attend) or floating (additive), got {mask.dtype}")
    if mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise TypeError(
            f"an additive mask must have the dtype of q, k and v ({q.dtype}), got {mask.dtype}: "
            f"convert it with mask.to({q.dtype})"
        )
    scores_shape = (*batch, q.shape[-2], k.shape[-2])
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == torch.Size(scores_shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} must broadcast to the scores' shape "
            f"(..., T, S) = {scores_shape} without enlarging it"
        )


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(q k^T * scale + mask) v`` with ``scale = 1/sqrt(D)``.

    Args:
        q: queries ``(..., T, D)``: any number of leading dimensions, none included.
        k: keys ``(..., S, D)``.
        v: values ``(..., S, Dv)``.
        mask: optional, broadcastable to ``(..., T, S)``. Boolean: ``True`` where
            the query may attend to the key. Floating (``q``'s dtype): added to the
            scaled scores (``-inf`` removes a key).
        scale: multiplies the scores; defaults to ``1 / sqrt(D)``. Any float, ``0``
            included (then every visible key gets the same weight).

    Returns:
        ``(out, weights)`` in ``q``'s dtype: ``out`` is ``(..., T, Dv)`` and ``weights``
        is ``(..., T, S)``, each row a probability distribution over keys. A query
        that may attend to no key gets zero weights and a zero output. Accurate for
        large scores (thousands), differentiable with respect to ``q``, ``k`` and
        ``v``; the inputs and the mask are not modified.
    """
    check_attention_inputs(q, k, v, mask)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    weights = softmax(scores, dim=-1)  # (..., T, S), fully masked rows are 0
    return weights @ v, weights  # (..., T, Dv), (..., T, S)


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean causal mask: query ``i`` may attend to keys up to its own position.

    With ``S > T`` the queries are the *last* ``T`` positions of a length-``S``
    sequence (as when earlier keys are cached), so the mask is aligned to the
    bottom-right corner: query ``i`` sees keys ``j <= i + (S - T)``. (Torch's
    ``is_causal=True`` aligns to the top-left instead; the two agree for ``S == T``.)

    Args:
        T: number of queries, ``T >= 0`` (``T = 0`` gives an empty ``(0, S)`` mask).
        S: number of keys, ``S >= T``; defaults to ``T``.
        device: where to create the mask (default: the CPU).

    Returns:
        ``(T, S)`` boolean tensor on ``device``, ``True`` where attending is allowed.

    Raises:
        ValueError: unless ``0 <= T <= S``, naming ``T`` and ``S``.

    Example:
        ``causal_mask(3)`` is ``[[1, 0, 0], [1, 1, 0], [1, 1, 1]]`` (as booleans).
    """
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"causal_mask needs 0 <= T <= S, got T={T} and S={S}")
    i = torch.arange(T, device=device)[:, None]  # (T, 1) query positions
    j = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    return j <= i + (S - T)  # (T, S)


def padding_mask(lengths: torch.Tensor | list[int], S: int | None = None) -> torch.Tensor:
    """Key mask from sequence lengths: ``True`` for real tokens, ``False`` for padding.

    To mask attention scores of shape ``(B, T, S)`` use ``padding_mask(...)[:, None, :]``;
    for ``(B, H, T, S)`` use ``[:, None, None, :]``.

    Args:
        lengths: ``(B,)`` number of real tokens in each sequence.
        S: padded length; defaults to ``max(lengths)``.

    Returns:
        ``(B, S)`` boolean tensor.

    Example:
        ``padding_mask([2, 3])`` is ``[[1, 1, 0], [1, 1, 1]]`` (as booleans).
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer tensor, got {lengths.dtype} {tuple(lengths.shape)}")
    if (lengths < 0).any():
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    S = longest if S is None else S
    if S < longest:
        raise ValueError(f"S={S} is shorter than the longest sequence ({longest})")
    return torch.arange(S, device=lengths.device)[None, :] < lengths[:, None]  # (B, S)


def from_key_padding_mask(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """Convert torch's ``key_padding_mask`` (``True`` = *ignore*) to our convention.

    ``nn.MultiheadAttention`` and ``nn.Transformer*`` take a ``(B, S)`` mask whose
    ``True`` entries mark padding. Ours marks what may be attended to, so the
    conversion is a logical not.

    Args:
        key_padding_mask: ``(B, S)`` boolean, ``True`` at padded keys.

    Returns:
        ``(B, S)`` boolean, ``True`` at real keys.
    """
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(f"expected a boolean key_padding_mask, got {key_padding_mask.dtype}")
    return ~key_padding_mask


def bool_to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask (``True`` = may attend) to an additive one (``0`` or ``-inf``).

    Example:
        ``bool_to_additive(torch.tensor([True, False]))`` is ``tensor([0., -inf])``.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"expected a boolean mask, got {mask.dtype}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


def additive_to_bool(mask: torch.Tensor) -> torch.Tensor:
    """Additive mask to a boolean one: ``True`` wherever the entry is not ``-inf``.

    Finite negative entries (a soft bias) have no boolean equivalent and raise.
    """
    if not torch.is_floating_point(mask):
        raise TypeError(f"expected a floating (additive) mask, got {mask.dtype}")
    keep = mask != float("-inf")
    if (mask[keep] != 0).any():
        raise ValueError("additive mask has finite non-zero entries; only 0 and -inf convert to boolean")
    return keep


def dot_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot-product scores ``q k^T``: ``(..., T, D), (..., S, D) -> (..., T, S)``."""
    return q @ k.transpose(-2, -1)


def scaled_dot_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product scores ``q k^T / sqrt(D)``: ``(..., T, S)``."""
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


class BilinearScore(nn.Module):
    """Bilinear ("general") score ``q W k^T`` of Luong et al. (2015).

    ``W`` starts with variance ``1 / (Dq Dk)``, so unit-variance queries and keys
    give unit-variance scores (the same reason scaled dot-product attention
    divides by ``sqrt(D)``).

    Args:
        d_q: query width ``Dq``.
        d_k: key width ``Dk`` (may differ from ``Dq``).
    """

    def __init__(self, d_q: int, d_k: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(d_q, d_k) / math.sqrt(d_q * d_k))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``(..., T, Dq), (..., S, Dk) -> (..., T, S)``."""
        return q @ self.W @ k.transpose(-2, -1)


class AdditiveScore(nn.Module):
    """Additive score ``w^T tanh(W_q q + W_k k)`` of Bahdanau et al. (2015).

    Args:
        d_q: query width ``Dq``.
        d_k: key width ``Dk``.
        d_hidden: width of the hidden layer.
    """

    def __init__(self, d_q: int, d_k: int, d_hidden: int):
        super().__init__()
        self.W_q = nn.Linear(d_q, d_hidden, bias=False)
        self.W_k = nn.Linear(d_k, d_hidden, bias=False)
        self.w = nn.Linear(d_hidden, 1, bias=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``(..., T, Dq), (..., S, Dk) -> (..., T, S)``; costs ``O(T S d_hidden)`` memory."""
        h = self.W_q(q).unsqueeze(-2) + self.W_k(k).unsqueeze(-3)  # (..., T, S, d_hidden)
        return self.w(torch.tanh(h)).squeeze(-1)  # (..., T, S)


class SelfAttention(nn.Module):
    """Single-head self-attention with learned query, key and value projections.

    Args:
        d_model: input width ``C``.
        d_head: width ``D`` of queries, keys and values; defaults to ``d_model``.
        bias: whether the projections have a bias.

    Parameters: ``q_proj``, ``k_proj`` and ``v_proj``, each an ``nn.Linear`` from ``C``
    to ``D`` features: ``3 (C D + D)`` parameters, ``3 C D`` with ``bias=False``.
    """

    def __init__(self, d_model: int, d_head: int | None = None, bias: bool = True):
        super().__init__()
        d_head = d_model if d_head is None else d_head
        self.q_proj = nn.Linear(d_model, d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, d_head, bias=bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from every position of ``x`` to every position of ``x``.

        Args:
            x: ``(B, T, C)``.
            mask: optional, boolean or floating, broadcastable to ``(B, T, T)``, as in
                :func:`scaled_dot_product_attention`.

        Returns:
            ``(out, weights)`` of shapes ``(B, T, D)`` and ``(B, T, T)``.

        Raises:
            ValueError: if ``x`` is not ``(B, T, C)`` with ``C = d_model``, naming
                the shape expected and the one received.
        """
        if x.dim() != 3 or x.shape[-1] != self.q_proj.in_features:
            raise ValueError(f"expected x of shape (B, T, {self.q_proj.in_features}), got {tuple(x.shape)}")
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # each (B, T, D)
        return scaled_dot_product_attention(q, k, v, mask=mask)


def score_variance(D: int, n: int, generator: torch.Generator, scaled: bool = False) -> float:
    """Measure the variance of the attention score ``q . k`` for random queries and keys.

    Draws ``n`` independent pairs of vectors ``q`` and ``k``, each with ``D`` standard-normal
    entries (float64, from ``generator``: all of ``q`` first, then all of ``k``), takes their
    dot products, divides them by ``sqrt(D)`` when ``scaled``, and returns the sample variance
    (the unbiased one, dividing by ``n - 1``) of the ``n`` scores. In theory it is ``D``
    unscaled and ``1`` scaled.

    Args:
        D: the width of queries and keys, at least 1.
        n: how many pairs to draw, at least 2.
        generator: the source of randomness (the same seed gives the same result).
        scaled: divide each score by ``sqrt(D)``, as attention does.

    Returns:
        The sample variance as a Python ``float``.

    Example:
        ``score_variance(64, 20_000, torch.Generator().manual_seed(0))`` is about 64.
    """
    if not isinstance(D, int) or D < 1 or not isinstance(n, int) or n < 2:
        raise ValueError(f"score_variance needs D >= 1 and n >= 2 (integers), got D={D!r}, n={n!r}")
    q = torch.randn(n, D, generator=generator, dtype=torch.float64)  # (n, D)
    k = torch.randn(n, D, generator=generator, dtype=torch.float64)  # (n, D)
    scores = (q * k).sum(dim=-1)  # (n,)
    if scaled:
        scores = scores / math.sqrt(D)
    return scores.var().item()


def online_softmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """Softmax over the last axis, reading ``x`` one block of ``block`` columns at a time.

    The one-pass ("online") softmax of Milakov and Gimelshein (2018), the heart of
    FlashAttention: keep, per row, the running maximum ``m`` and the running sum ``l`` of
    ``exp(x - m)`` over the blocks seen so far. When a block raises the maximum from ``m`` to
    ``m'``, the sum so far is rescaled by ``exp(m - m')`` before the block's terms are added.
    A second pass divides ``exp(x - m)`` by ``l``. Rows that are all ``-inf`` give zeros, as
    :func:`softmax` does.

    Args:
        x: float32 or float64 tensor of shape ``(..., S)``, not modified.
        block: the number of columns read at a time, at least 1 (the last block may be shorter).

    Returns:
        A tensor of ``x``'s shape and dtype, equal to ``softmax(x, dim=-1)`` up to rounding.

    Example:
        ``online_softmax(torch.tensor([0.0, math.log(3.0)]), 1)`` is ``tensor([0.25, 0.75])``.
    """
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ValueError(f"block must be a positive integer, got {block!r}")
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype)  # (...) running maximum
    l = torch.zeros(x.shape[:-1], dtype=x.dtype)  # (...) running sum of exp(x - m)
    for start in range(0, x.shape[-1], block):
        chunk = x[..., start : start + block]  # (..., block)
        m_new = torch.maximum(m, chunk.amax(dim=-1))
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # all -inf so far
        l = l * torch.exp(m - shift) + torch.exp(chunk - shift.unsqueeze(-1)).sum(dim=-1)
        m = m_new
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    l = torch.where(l > 0, l, torch.ones_like(l))  # an all -inf row is 0 / 1
    return torch.exp(x - shift.unsqueeze(-1)) / l.unsqueeze(-1)

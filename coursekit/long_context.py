"""Chapter 10: long contexts: exact tiled attention, sparse and local patterns, linear attention,
KV-cache sizes and segment recurrence.

Softmax attention over ``T`` tokens costs ``T^2`` scores. This module holds the standard answers,
each checked against the plain attention of :mod:`coursekit.attention`:

* **the same result with less memory**: :func:`tiled_attention` computes exact attention block
  by block with the *online softmax* of FlashAttention (Dao et al., 2022), never holding more
  than a ``block_q x block_k`` tile of scores
  (:func:`coursekit.experiments.long_context.attention_peak_memory` measures it);
* **fewer pairs**: :func:`sliding_window_mask` (local causal attention, Mistral's sliding
  window) decoded with a fixed-size ring buffer, :class:`RollingKVCache`; the strided and fixed
  patterns of Child et al. (2019), :func:`strided_mask` and :func:`fixed_mask`; Longformer's
  window plus global tokens (Beltagy et al., 2020), :func:`longformer_mask`; and
  :func:`attended_pairs`, which counts the pairs of each pattern without building its mask;
* **no softmax**: linear attention with the positive feature map ``elu(x) + 1`` (Katharopoulos
  et al., 2020) in its parallel form, :func:`linear_attention_parallel`, its causal
  prefix-sum (recurrent) form, :func:`causal_linear_attention`, and chunk by chunk,
  :func:`chunked_linear_attention`;
* **softmax approximated in linear time**: the Performer's positive random features (FAVOR+,
  Choromanski et al., 2021), :func:`random_feature_matrix`, :func:`positive_random_features` and
  :func:`performer_attention`;
* **what a cache costs**: :func:`kv_cache_size`, Chapter 2's
  :func:`~coursekit.multihead.kv_cache_bytes` with a dtype, grouped heads and a sliding window;
* **memory across segments**: :func:`attend_with_memory` and :func:`segment_recurrence`
  (Transformer-XL, Dai et al., 2019), equal to full attention under
  :func:`segment_recurrence_mask`.

A longer context than trained (position interpolation, NTK-aware scaling, ALiBi) comes from the
position signals of :mod:`coursekit.positional`; the book's experiment that trains short and
tests long is in :mod:`coursekit.experiments.long_context`.

Conventions (see the book's notation page): ``B`` batch, ``H`` heads, ``T`` queries, ``S`` keys,
``D`` head width, ``C`` model width, ``W`` window. Boolean masks are ``True`` where a query may
attend. With ``S > T`` keys the queries are the *last* ``T`` of ``S`` positions (bottom-right
alignment, as :func:`coursekit.attention.causal_mask`). A query that may attend to no key gets a
zero output, never NaN, everywhere in this module.

Over 500 lines: Chapter 10's techniques side by side (tiled attention, windowed and sparse masks, a
rolling cache, linear attention, segment recurrence, the KV-cache size), each short; the trained
experiments live in coursekit.experiments.long_context.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from coursekit.attention import check_attention_inputs, scaled_dot_product_attention
from coursekit.multihead import MultiHeadAttention, merge_heads, repeat_kv

__all__ = [
    "tiled_attention",
    "sliding_window_mask",
    "RollingKVCache",
    "sliding_window_decode",
    "strided_mask",
    "fixed_mask",
    "longformer_mask",
    "attended_pairs",
    "elu_feature_map",
    "linear_attention_parallel",
    "causal_linear_attention",
    "chunked_linear_attention",
    "linear_attention",
    "random_feature_matrix",
    "positive_random_features",
    "performer_attention",
    "kv_cache_size",
    "attend_with_memory",
    "segment_recurrence",
    "segment_recurrence_mask",
    "window_mass",
    "sink_window_mask",
    "tiled_attention_forward",
    "tiled_attention_backward",
    "TiledAttention",
    "flash_attention",
    "gpt_logits_with_mask",
    "sink_cache_decode",
]


# --------------------------------------------------------------------------- exact tiled attention


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact attention ``softmax(q k^T * scale) v`` computed tile by tile with the online softmax.

    This is the forward pass of FlashAttention (Dao et al., 2022): for each block of ``block_q``
    queries, walk over the keys ``block_k`` at a time and keep, per query, the running maximum
    ``m`` of its scores, the running sum ``l`` of ``exp(score - m)`` and the running weighted sum
    ``acc`` of the values. When a new tile raises the maximum from ``m`` to ``m_new``, the old
    ``l`` and ``acc`` were computed relative to ``m`` and are rescaled by ``exp(m - m_new)``;
    only at the end is ``acc`` divided by ``l``. No ``(T, S)`` matrix of scores is ever held: the
    extra memory is one ``block_q x block_k`` tile (and the optional boolean mask, the caller's).

    Args:
        q: queries ``(..., T, D)``, ``T >= 1``.
        k: keys ``(..., S, D)``, ``S >= 1``.
        v: values ``(..., S, Dv)``.
        causal: query ``i`` sees keys ``j <= i + S - T`` (bottom-right alignment; needs ``S >= T``).
            Key tiles entirely in a query tile's future may be skipped (the result is the same).
        mask: optional boolean, broadcastable to ``(..., T, S)``, ``True`` = may attend (combined
            with ``causal``). It is cut into tiles as well.
        block_q: queries per tile, ``>= 1``.
        block_k: keys per tile, ``>= 1``.
        scale: multiplies the scores (any value, 0 included); defaults to ``1 / sqrt(D)``.

    Returns:
        ``(..., T, Dv)`` in the inputs' dtype and on their device, equal to
        :func:`coursekit.attention.scaled_dot_product_attention`. A query that may attend to no
        key gets a zero output (its ``l`` stays 0). The inputs are not changed.

    Raises:
        ValueError: ``block_q`` or ``block_k`` below 1, ``causal`` with ``S < T``, or shapes that
            do not fit (:func:`~coursekit.attention.check_attention_inputs`).
        TypeError: a mask that is not boolean, or ``q, k, v`` of different dtypes.
    """
    check_attention_inputs(q, k, v, mask)
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"tiled_attention takes a boolean mask (True = may attend), got {mask.dtype}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q} and block_k={block_k}")
    T, S = q.shape[-2], k.shape[-2]
    if causal and S < T:
        raise ValueError(f"a causal mask needs at least as many keys as queries, got T={T} and S={S}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if mask is not None:
        mask = mask.expand(*batch, T, S)  # a view: tiles can be sliced from it
    outputs = []
    for i0 in range(0, T, block_q):
        i1 = min(i0 + block_q, T)
        qi = q[..., i0:i1, :] * scale  # (..., Tq, D)
        m = torch.full((*batch, i1 - i0, 1), -math.inf, dtype=q.dtype, device=q.device)  # running max
        l = torch.zeros((*batch, i1 - i0, 1), dtype=q.dtype, device=q.device)  # running sum of exp
        acc = torch.zeros((*batch, i1 - i0, v.shape[-1]), dtype=q.dtype, device=q.device)  # (..., Tq, Dv)
        for j0 in range(0, S, block_k):
            if causal and j0 > i1 - 1 + S - T:
                break  # this tile and all later ones lie in the future of every query of the block
            j1 = min(j0 + block_k, S)
            s = qi @ k[..., j0:j1, :].transpose(-2, -1)  # (..., Tq, Sk) one tile of scores
            if causal:
                rows = torch.arange(i0, i1, device=q.device)[:, None] + (S - T)  # (Tq, 1) query positions
                s = s.masked_fill(torch.arange(j0, j1, device=q.device)[None, :] > rows, -math.inf)
            if mask is not None:
                s = s.masked_fill(~mask[..., i0:i1, j0:j1], -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., Tq, 1)
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))  # no key yet: 0
            p = torch.exp(s - shift)  # (..., Tq, Sk), masked scores give 0
            alpha = torch.exp(m - shift)  # (..., Tq, 1) rescales what was summed relative to m
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + p @ v[..., j0:j1, :]  # (..., Tq, Dv)
            m = m_new
        outputs.append(acc / torch.where(l > 0, l, torch.ones_like(l)))  # fully masked rows: 0 / 1
    return torch.cat(outputs, dim=-2)  # (..., T, Dv)


# --------------------------------------------------------------------------- local and sparse patterns


def _positions(T: int, S: int | None, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"need 0 <= T <= S, got T={T} and S={S}")
    i = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) query positions
    j = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    return i, j, S


def sliding_window_mask(
    T: int, window: int, S: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Local causal attention: each query sees itself and the ``window - 1`` keys before it.

    Query ``i`` sits at position ``p = i + S - T`` (bottom-right alignment) and may attend to key
    ``j`` when ``p - window < j <= p``: at most ``window`` keys, never a future one. This is the
    sliding window of Longformer's causal variant and of Mistral 7B (Hugging Face's
    ``sliding_window``). ``window >= S`` gives the plain causal mask.

    Args:
        T: number of queries, ``T >= 0``.
        window: keys each query sees at most, an integer ``W >= 1`` (itself included).
        S: number of keys, ``S >= T``; defaults to ``T``.
        device: where to build the mask.

    Returns:
        ``(T, S)`` boolean on ``device``, ``True`` = may attend.

    Raises:
        ValueError: ``window`` is not a positive integer, or not ``0 <= T <= S``.

    Example:
        ``sliding_window_mask(4, 2)`` is ``[[1,0,0,0], [1,1,0,0], [0,1,1,0], [0,0,1,1]]``.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"sliding_window_mask needs 0 <= T <= S, got T={T} and S={S}")
    p = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) query positions
    j = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    return (j <= p) & (j > p - window)  # (T, S)


class RollingKVCache:
    """The keys and values of the last ``window`` tokens in a fixed-size ring buffer.

    Token ``t`` is written to slot ``t % window``, overwriting token ``t - window``, which a
    sliding window of ``window`` keys no longer needs (Mistral's "rolling buffer cache"). The
    slots are then out of order, but attention does not care about the order of its keys (any
    position information is already in them, e.g. RoPE applied before caching), so the buffer is
    used as it is. Memory stays ``2 B H_kv window D`` values however long the sequence.

    Args:
        batch: sequences ``B``.
        n_kv_heads: key/value heads ``H_kv``.
        window: slots ``W``.
        d_head: head width ``D``.
        dtype, device: of the buffers.
    """

    def __init__(
        self,
        batch: int,
        n_kv_heads: int,
        window: int,
        d_head: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        for name, value in (
            ("batch", batch),
            ("n_kv_heads", n_kv_heads),
            ("window", window),
            ("d_head", d_head),
        ):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.window = window
        self.k = torch.zeros(batch, n_kv_heads, window, d_head, dtype=dtype, device=device)  # (B, H_kv, W, D)
        self.v = torch.zeros_like(self.k)  # (B, H_kv, W, D)
        self.length = 0  # tokens seen so far

    @property
    def nbytes(self) -> int:
        """Bytes held by the two buffers: constant, whatever ``length`` is."""
        return self.k.numel() * self.k.element_size() * 2

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write one new token's key and value over the oldest slot.

        Args:
            k, v: ``(B, H_kv, 1, D)``.

        Returns:
            ``(keys, values, valid)``: the buffers ``(B, H_kv, W, D)`` and a ``(W,)`` boolean
            that is ``False`` at slots not written yet (before ``W`` tokens were seen).
        """
        if k.shape != self.k[:, :, :1].shape or v.shape != k.shape:
            raise ValueError(
                f"update takes one token, k and v of shape {tuple(self.k[:, :, :1].shape)}, "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        slot = self.length % self.window
        self.k[:, :, slot] = k[:, :, 0]
        self.v[:, :, slot] = v[:, :, 0]
        self.length += 1
        valid = torch.arange(self.window, device=self.k.device) < min(self.length, self.window)  # (W,)
        return self.k, self.v, valid


def sliding_window_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Attend token by token through a :class:`RollingKVCache`, as a decoder generates.

    Args:
        q: ``(B, H, T, D)``.
        k, v: ``(B, H_kv, T, D)``, ``H_kv`` dividing ``H`` (grouped-query attention).
        window: the cache's slots ``W``.

    Returns:
        ``(B, H, T, D)``, equal to full attention under :func:`sliding_window_mask` ``(T, W)``.
    """
    if (
        q.dim() != 4
        or k.dim() != 4
        or k.shape != v.shape
        or q.shape[0] != k.shape[0]
        or q.shape[2:] != k.shape[2:]
    ):
        raise ValueError(
            f"expected q (B, H, T, D) and k, v (B, H_kv, T, D), got {tuple(q.shape)}, "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    B, H, T, D = q.shape
    if H % k.shape[1]:
        raise ValueError(f"the key/value heads ({k.shape[1]}) must divide the query heads ({H})")
    cache = RollingKVCache(B, k.shape[1], window, D, dtype=k.dtype, device=k.device)
    outputs = []
    for t in range(T):
        keys, values, valid = cache.update(
            k[:, :, t : t + 1], v[:, :, t : t + 1]
        )  # (B, H_kv, W, D) x 2, (W,)
        keys, values = repeat_kv(keys, H // k.shape[1]), repeat_kv(values, H // k.shape[1])  # (B, H, W, D)
        outputs.append(scaled_dot_product_attention(q[:, :, t : t + 1], keys, values, mask=valid[None, :])[0])
    return torch.cat(outputs, dim=2)  # (B, H, T, D)


def strided_mask(T: int, stride: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The causal *strided* pattern of Child et al. (2019), both heads' patterns combined.

    Query ``i`` sees key ``j <= i`` when ``i - j < stride`` (the last ``stride`` positions) or
    ``(i - j) % stride == 0`` (every ``stride``-th position before it). With ``stride ~ sqrt(T)``
    each query sees about ``2 sqrt(T)`` keys, and any key reaches any later query in two steps.

    Returns:
        ``(T, T)`` boolean, ``True`` = may attend.

    Example: ``strided_mask(5, 2)[4]`` is ``[1, 0, 1, 1, 1]``.
    """
    if stride < 1:
        raise ValueError(f"stride must be positive, got {stride}")
    i, j, _ = _positions(T, None, device)
    return (j <= i) & ((i - j < stride) | ((i - j) % stride == 0))  # (T, T)


def fixed_mask(
    T: int, block: int, summary: int = 1, device: torch.device | str | None = None
) -> torch.Tensor:
    """The causal *fixed* pattern of Child et al. (2019), both heads' patterns combined.

    Positions are cut into blocks of ``block``. Query ``i`` sees key ``j <= i`` in its own block,
    and the last ``summary`` positions of every earlier block, which act as summaries.

    Returns:
        ``(T, T)`` boolean, ``True`` = may attend.

    Example: ``fixed_mask(6, 3)[4]`` is ``[0, 0, 1, 1, 1, 0]``.
    """
    if block < 1 or not 1 <= summary <= block:
        raise ValueError(
            f"need block >= 1 and 1 <= summary <= block, got block={block} and summary={summary}"
        )
    i, j, _ = _positions(T, None, device)
    return (j <= i) & ((i // block == j // block) | (j % block >= block - summary))  # (T, T)


def _global_index(T: int, global_positions) -> torch.Tensor:
    g = torch.as_tensor(
        list(global_positions) if not isinstance(global_positions, torch.Tensor) else global_positions,
        dtype=torch.long,
    ).unique()
    if g.dim() != 1 or (g.numel() and (int(g.min()) < 0 or int(g.max()) >= T)):
        raise ValueError(f"global positions must lie in 0 .. {T - 1}, got {g.tolist()}")
    return g


def longformer_mask(
    T: int, radius: int, global_positions=(), device: torch.device | str | None = None
) -> torch.Tensor:
    """Longformer's pattern (Beltagy et al., 2020): a symmetric window plus global tokens.

    Every query sees the keys within ``radius`` positions on either side (``2 radius + 1`` keys
    away from the edges). A *global* token (e.g. ``[CLS]``, or the question in question
    answering) sees every key and is seen by every query. Not causal: Longformer is an encoder.

    Args:
        T: sequence length.
        radius: one-sided window, ``>= 0``.
        global_positions: indices of the global tokens.

    Returns:
        ``(T, T)`` boolean, ``True`` = may attend.
    """
    if radius < 0:
        raise ValueError(f"radius must be non-negative, got {radius}")
    i, j, _ = _positions(T, None, device)
    is_global = torch.zeros(T, dtype=torch.bool, device=device)
    is_global[_global_index(T, global_positions).to(is_global.device)] = True
    return ((i - j).abs() <= radius) | is_global[:, None] | is_global[None, :]  # (T, T)


PATTERNS = ("full", "causal", "sliding_window", "strided", "fixed", "longformer")


def attended_pairs(pattern: str, T: int, **params) -> int:
    """Number of ``(query, key)`` pairs a pattern lets attend, from each row's closed-form count.

    Equals ``mask.sum()`` of the pattern's mask, but needs ``O(T)`` memory, so it can count for a
    million tokens. Per query ``i`` (0-based):

    * ``full``: ``T``; ``causal``: ``i + 1`` (``T (T + 1) / 2`` in all);
    * ``sliding_window`` (``window=W``): ``min(i + 1, W)``, about ``T W``;
    * ``strided`` (``stride=s``): ``min(i + 1, s) + i // s``;
    * ``fixed`` (``block=l``, ``summary=c``): ``i % l + 1 + (i // l) c``;
    * ``longformer`` (``radius=r``, ``global_positions``): ``T`` for a global query; otherwise its
      window clipped to ``0 .. T - 1`` plus the global keys outside the window.

    Example: ``attended_pairs("sliding_window", 4, window=2)`` is ``1 + 2 + 2 + 2 = 7``.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if T < 0:
        raise ValueError(f"T must be non-negative, got {T}")
    i = torch.arange(T, dtype=torch.int64)  # (T,) query positions
    if pattern == "full":
        counts = torch.full_like(i, T)
    elif pattern == "causal":
        counts = i + 1
    elif pattern == "sliding_window":
        sliding_window_mask(0, params["window"])  # validates the window
        counts = (i + 1).clamp(max=params["window"])
    elif pattern == "strided":
        s = params["stride"]
        strided_mask(0, s)
        counts = (i + 1).clamp(max=s) + i // s
    elif pattern == "fixed":
        block, summary = params["block"], params.get("summary", 1)
        fixed_mask(0, block, summary)
        counts = i % block + 1 + (i // block) * summary
    else:
        r = params["radius"]
        longformer_mask(0, r)
        g = _global_index(T, params.get("global_positions", ()))
        lo, hi = (i - r).clamp(min=0), (i + r).clamp(max=T - 1)  # (T,) window ends
        outside = ((g[None, :] < lo[:, None]) | (g[None, :] > hi[:, None])).sum(-1)  # (T,) globals outside
        counts = hi - lo + 1 + outside
        counts[g] = T
    return int(counts.sum())


# --------------------------------------------------------------------------- linear attention


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``, the positive feature map of Katharopoulos et al. (2020).

    ``elu(x) + 1`` is ``x + 1`` for ``x > 0`` and ``exp(x)`` otherwise: positive, so every weight
    ``phi(q) . phi(k)`` is positive and the normaliser cannot vanish or change sign. It is
    computed in that second form: ``F.elu(x) + 1`` adds 1 to ``exp(x) - 1`` and rounds to exactly
    0 below ``x = -37`` in float64 (``-17`` in float32), where ``exp(x)`` is still positive.

    Example: ``elu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))`` is ``[0.3679, 1, 3]``.
    """
    return torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))  # clamp: no overflow in the unused branch


def _check_qkv(q, k, v, eps):
    check_attention_inputs(q, k, v)
    if eps < 0:
        raise ValueError(f"eps must be non-negative, got {eps}")


def linear_attention_parallel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Linear attention in its parallel form: softmax's ``exp(q . k)`` replaced by ``phi(q) . phi(k)``.

    ``out_i = sum_j A_ij v_j / (sum_j A_ij + eps)`` with ``A = phi(q) phi(k)^T`` (and ``A_ij = 0``
    for ``j > i`` when causal), ``phi =`` :func:`elu_feature_map`. It builds the ``(T, S)``
    matrix like softmax attention does; :func:`causal_linear_attention` and
    :func:`linear_attention` compute the same without it.

    Args:
        q: ``(..., T, D)``; k: ``(..., S, D)``; v: ``(..., S, Dv)``.
        causal: mask future keys (needs ``S == T``).
        eps: added to each normaliser.

    Returns:
        ``(..., T, Dv)``.
    """
    _check_qkv(q, k, v, eps)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs T == S, got T={q.shape[-2]} and S={k.shape[-2]}")
    A = elu_feature_map(q) @ elu_feature_map(k).transpose(-2, -1)  # (..., T, S), all positive
    if causal:
        A = A.tril()  # query i keeps keys j <= i
    return (A @ v) / (A.sum(dim=-1, keepdim=True) + eps)  # (..., T, Dv)


def causal_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Causal linear attention by prefix sums: ``O(T)`` time, no ``(T, T)`` matrix.

    With ``phi =`` :func:`elu_feature_map`, the causal numerator ``sum_{j<=i} (phi(q_i) . phi(k_j)) v_j``
    is ``phi(q_i) S_i`` with the state ``S_i = sum_{j<=i} phi(k_j)^T v_j`` ``(D, Dv)``, and the
    normaliser is ``phi(q_i) . z_i`` with ``z_i = sum_{j<=i} phi(k_j)``. Both are running sums:
    ``S_i = S_{i-1} + phi(k_i)^T v_i`` is the recurrence of an RNN, computed here for every ``i`` at
    once with ``cumsum``.

    Args:
        q, k: ``(..., T, D)``.
        v: ``(..., T, Dv)``.
        eps: added to each normaliser ``phi(q_i) . z_i``, ``eps >= 0``.

    Returns:
        ``(..., T, Dv)`` in ``q``'s dtype, equal to
        ``linear_attention_parallel(q, k, v, causal=True, eps=eps)``. The inputs are not changed.

    Raises:
        ValueError: ``q`` and ``k`` of different lengths, ``eps < 0``, or shapes that do not fit
            (:func:`~coursekit.attention.check_attention_inputs`).
    """
    check_attention_inputs(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"causal linear attention needs as many keys as queries, got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if eps < 0:
        raise ValueError(f"eps must be non-negative, got {eps}")
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # (..., T, D), positive
    state = (phi_k.unsqueeze(-1) * v.unsqueeze(-2)).cumsum(dim=-3)  # (..., T, D, Dv): S_i
    z = phi_k.cumsum(dim=-2)  # (..., T, D): z_i
    numerator = (phi_q.unsqueeze(-2) @ state).squeeze(-2)  # (..., 1, D) @ (..., D, Dv) -> (..., T, Dv)
    normaliser = (phi_q * z).sum(dim=-1, keepdim=True)  # (..., T, 1)
    return numerator / (normaliser + eps)


def chunked_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunk: int = 128,
    eps: float = 1e-6,
    feature_map: Callable[[torch.Tensor], torch.Tensor] = elu_feature_map,
) -> torch.Tensor:
    """Causal linear attention chunk by chunk: the parallel form inside a chunk, the state across chunks.

    The prefix-sum form of :func:`causal_linear_attention` holds a ``(D, Dv)`` state for *every*
    position, ``T D Dv`` numbers, and is limited by memory traffic. Here the state is kept only
    at chunk boundaries: chunk ``c`` adds to its own causal ``(C, C)`` weights the contribution
    ``phi(q) S`` of the state ``S`` of all earlier chunks, then adds its keys and values to ``S``.
    Time ``O(T C D + T D Dv)``, memory ``O(C^2 + D Dv)`` beyond the output: how fast
    implementations of linear attention (and its gated successors) run.

    Args:
        q, k: ``(..., T, D)``.
        v: ``(..., T, Dv)``.
        chunk: positions per chunk ``C >= 1``.
        eps: added to each normaliser.
        feature_map: ``phi``, positive; :func:`elu_feature_map` by default (the Performer passes
            features it has already computed, and the identity).

    Returns:
        ``(..., T, Dv)``, equal to :func:`causal_linear_attention` with the default ``phi``.
    """
    _check_qkv(q, k, v, eps)
    if q.shape[-2] != k.shape[-2] or chunk < 1:
        raise ValueError(
            f"need as many keys as queries and chunk >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}, chunk={chunk}"
        )
    phi_q, phi_k = feature_map(q), feature_map(k)  # (..., T, D)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    state = q.new_zeros(*batch, q.shape[-1], v.shape[-1])  # (..., D, Dv): sum of phi(k_j)^T v_j so far
    z = q.new_zeros(*batch, q.shape[-1], 1)  # (..., D, 1): sum of phi(k_j) so far
    outputs = []
    for c0 in range(0, q.shape[-2], chunk):
        qc, kc, vc = (
            phi_q[..., c0 : c0 + chunk, :],
            phi_k[..., c0 : c0 + chunk, :],
            v[..., c0 : c0 + chunk, :],
        )
        A = (qc @ kc.transpose(-2, -1)).tril()  # (..., C, C) causal weights inside the chunk
        numerator = qc @ state + A @ vc  # (..., C, Dv): earlier chunks + this one
        normaliser = qc @ z + A.sum(dim=-1, keepdim=True)  # (..., C, 1)
        outputs.append(numerator / (normaliser + eps))
        state = state + kc.transpose(-2, -1) @ vc  # (..., D, Dv)
        z = z + kc.sum(dim=-2).unsqueeze(-1)  # (..., D, 1)
    return torch.cat(outputs, dim=-2)  # (..., T, Dv)


def linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Linear attention in ``O(T)``: by associativity when not causal, by prefix sums when causal.

    Not causal: ``phi(q) (phi(k)^T v)`` multiplies a ``(D, Dv)`` summary of all keys and values,
    built once, instead of a ``(T, S)`` matrix; the normaliser is ``phi(q) . sum_j phi(k_j)``.

    Returns:
        ``(..., T, Dv)``, equal to :func:`linear_attention_parallel` with the same arguments.
    """
    if causal:
        return causal_linear_attention(q, k, v, eps)
    _check_qkv(q, k, v, eps)
    phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)  # (..., T, D), (..., S, D)
    summary = phi_k.transpose(-2, -1) @ v  # (..., D, Dv)
    normaliser = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (..., T, D) @ (..., D, 1) -> (..., T, 1)
    return (phi_q @ summary) / (normaliser + eps)  # (..., T, Dv)


# --------------------------------------------------------------------------- approximating softmax: Performer


def random_feature_matrix(
    n_features: int, D: int, generator: torch.Generator, orthogonal: bool = True
) -> torch.Tensor:
    """Draw the ``(m, D)`` projection ``w`` of positive random features, each row from ``N(0, I)``.

    With ``orthogonal=False`` the rows are independent standard-normal vectors. With
    ``orthogonal=True`` (the Performer's choice, Choromanski et al., 2021) the rows come in blocks
    of ``D`` that are exactly orthogonal to each other: each block is the ``Q`` of the QR
    decomposition of a Gaussian matrix (signs fixed, so its directions are uniform), each row
    rescaled to the length of an independent Gaussian vector. Every row on its own is still a draw
    from ``N(0, I)``, so estimates built from it stay unbiased; orthogonal rows spread the features
    more evenly over the directions and lower the variance.

    Args:
        n_features: rows ``m >= 1``.
        D: the width of the vectors to be mapped, ``D >= 1``.
        generator: the source of randomness (drawn in float64, so the draws do not depend on the
            dtype the caller casts to).
        orthogonal: draw orthogonal blocks (default) or independent rows.

    Returns:
        ``w`` ``(m, D)`` in float64.

    Raises:
        ValueError: ``n_features`` or ``D`` not a positive integer, or ``generator`` not a
            :class:`torch.Generator`.
    """
    for name, value in (("n_features", n_features), ("D", D)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if not orthogonal:
        return torch.randn(n_features, D, generator=generator, dtype=torch.float64)
    n_blocks = -(-n_features // D)  # ceil(m / D) blocks of D orthonormal rows
    Q, R = torch.linalg.qr(torch.randn(n_blocks, D, D, generator=generator, dtype=torch.float64))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)  # signs fixed: uniform directions
    rows = Q.transpose(-2, -1).reshape(n_blocks * D, D)  # (n_blocks * D, D): each block's rows orthonormal
    directions = rows[:n_features]  # (m, D)
    lengths = torch.randn(n_features, D, generator=generator, dtype=torch.float64).norm(dim=-1)  # (m,) chi_D
    return directions * lengths.unsqueeze(-1)  # (m, D)


def _prf_exponent(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # w . x - |x|^2 / 2 - log(m) / 2 for every feature: the log of phi(x), (..., T, m)
    return x @ w.T - (x * x).sum(dim=-1, keepdim=True) / 2 - math.log(w.shape[0]) / 2


def positive_random_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The positive random features of FAVOR+: ``phi(x)_i = exp(w_i . x - |x|^2 / 2) / sqrt(m)``.

    For rows ``w_i`` drawn from ``N(0, I)``, ``E[exp(w . q) exp(w . k)] = exp(|q + k|^2 / 2)``, so
    ``phi(q) . phi(k)``, the mean of ``m`` terms ``exp(w_i . (q + k) - |q|^2 / 2 - |k|^2 / 2)``, is
    an unbiased estimate of ``exp(q . k)``, and every feature is positive, as softmax's weights are
    (Choromanski et al., 2021). Its variance per term is ``exp(2 q . k) (exp(|q + k|^2) - 1)``:
    small for short vectors, exploding for long ones.

    Example: with ``x = 0`` every feature is ``1 / sqrt(m)``, and ``phi(0) . phi(0) = 1 = exp(0)``.

    Args:
        x: ``(..., T, D)``, floating point.
        w: ``(m, D)``, e.g. from :func:`random_feature_matrix`; cast to ``x``'s dtype.

    Returns:
        ``(..., T, m)``, positive (up to underflow for very long ``x``).

    Raises:
        ValueError: ``w`` not 2-D, widths that differ, or ``x`` not floating point.
    """
    if not x.is_floating_point():
        raise ValueError(f"x must be floating point, got {x.dtype}")
    if w.dim() != 2 or w.shape[1] != x.shape[-1]:
        raise ValueError(f"w must be (m, D) with D = x.shape[-1] = {x.shape[-1]}, got w {tuple(w.shape)}")
    return torch.exp(_prf_exponent(x, w.to(x.dtype)))


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    n_features: int,
    generator: torch.Generator,
    causal: bool = False,
    orthogonal: bool = True,
    chunk: int = 128,
) -> torch.Tensor:
    """Softmax attention approximated in linear time with ``m`` positive random features (FAVOR+).

    Softmax attention weighs key ``j`` by ``exp(q_i . k_j / sqrt(D))``, which is ``exp(q' . k')``
    for ``q' = q / D^(1/4)`` and ``k' = k / D^(1/4)``. :func:`positive_random_features` turns that
    weight into an unbiased estimate ``phi(q') . phi(k')``, and the rest is linear attention with
    the feature map ``phi``: ``O(T m Dv)`` instead of ``O(T S D)``. The error of the estimate falls
    like ``1 / sqrt(m)`` (Choromanski et al., 2021).

    ``w`` is drawn first, ``random_feature_matrix(n_features, D, generator, orthogonal)``, so the
    same seed gives the same features. For stability, each query's features are divided by their
    largest value and all keys' features by the largest over the keys (``exp`` of a shifted
    exponent): constant factors that cancel between numerator and normaliser.

    Args:
        q: ``(..., T, D)``; k: ``(..., S, D)``; v: ``(..., S, Dv)`` (leading dimensions broadcast).
        n_features: random features ``m >= 1``.
        generator: the source of the random features.
        causal: query ``i`` sees keys ``j <= i`` (needs ``S == T``), computed chunk by chunk.
        orthogonal: orthogonal blocks of features (the paper's choice) or independent ones.
        chunk: positions per chunk in the causal case, ``>= 1``.

    Returns:
        ``(..., T, Dv)`` in ``q``'s dtype; as ``m`` grows it tends to
        ``softmax(q k^T / sqrt(D)) v`` (causal: with future keys masked).

    Raises:
        ValueError: shapes that do not fit (:func:`~coursekit.attention.check_attention_inputs`),
            ``n_features`` or ``chunk`` not a positive integer, ``generator`` not a
            :class:`torch.Generator`, or ``causal`` with ``S != T``.
    """
    check_attention_inputs(q, k, v)
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal performer attention needs T == S, got T={q.shape[-2]} and S={k.shape[-2]}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    D = q.shape[-1]
    w = random_feature_matrix(n_features, D, generator, orthogonal).to(q.dtype)  # (m, D)
    scale = D**-0.25  # exp(q' . k') = exp(q . k / sqrt(D))
    log_q, log_k = _prf_exponent(q * scale, w), _prf_exponent(k * scale, w)  # (..., T, m), (..., S, m)
    phi_q = torch.exp(log_q - log_q.amax(dim=-1, keepdim=True))  # per query: cancels in the ratio
    phi_k = torch.exp(log_k - log_k.amax(dim=(-2, -1), keepdim=True))  # one shift for all keys
    tiny = torch.finfo(phi_q.dtype).tiny  # a normaliser lost to underflow gives 0, not NaN
    if causal:
        return chunked_linear_attention(phi_q, phi_k, v, chunk, eps=tiny, feature_map=lambda phi: phi)
    numerator = phi_q @ (phi_k.transpose(-2, -1) @ v)  # (..., T, m) @ (..., m, Dv) -> (..., T, Dv)
    normaliser = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (..., T, 1)
    return numerator / (normaliser + tiny)


# --------------------------------------------------------------------------- KV-cache size


def kv_cache_size(
    n_layers: int,
    n_heads: int,
    d_head: int,
    seq_len: int,
    n_kv_heads: int | None = None,
    batch: int = 1,
    dtype: torch.dtype = torch.float16,
    window: int | None = None,
) -> int:
    """Bytes of a KV cache: ``2 * L * B * tokens * H_kv * D * bytes per value``.

    The 2 is one key and one value per cached token, layer and key/value head. ``H_kv = H`` is
    multi-head attention, ``1 < H_kv < H`` grouped-query and ``H_kv = 1`` multi-query attention:
    query heads share key/value heads, and only those are cached. With a sliding window of ``W``
    keys, a rolling buffer holds ``min(seq_len, W)`` tokens. Equal to
    :func:`coursekit.multihead.kv_cache_bytes` with ``bytes_per_value`` from ``dtype``.

    Args:
        n_layers: ``L``.
        n_heads: query heads ``H``.
        d_head: head width ``D``.
        seq_len: tokens in the context ``T``.
        n_kv_heads: key/value heads ``H_kv``, dividing ``H``; ``None`` for ``H``.
        batch: sequences ``B``.
        dtype: of the cached values (2 bytes for float16 and bfloat16, 4 for float32, 1 for int8).
        window: sliding-window size ``W``, or ``None`` for full attention.

    Returns:
        The size in bytes (an ``int``; 0 for ``seq_len = 0``).

    Raises:
        ValueError: ``n_layers``, ``n_heads``, ``d_head``, ``n_kv_heads`` or ``batch`` below 1, a
            negative ``seq_len``, ``n_kv_heads`` not dividing ``n_heads``, or ``window`` below 1.

    Example: a 7B Llama-2 shape (``L=32, H=32, D=128``) in float16 needs
    ``2 * 32 * 32 * 128 * 2 = 524,288`` bytes (0.5 MiB) per token, 64 GiB at 131,072 tokens.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    for name, value in (
        ("n_layers", n_layers),
        ("n_heads", n_heads),
        ("d_head", d_head),
        ("n_kv_heads", n_kv_heads),
        ("batch", batch),
    ):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if seq_len < 0:
        raise ValueError(f"seq_len must be non-negative, got {seq_len}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
    if window is not None and window < 1:
        raise ValueError(f"window must be positive or None, got {window}")
    tokens = seq_len if window is None else min(seq_len, window)
    bytes_per_value = torch.empty((), dtype=dtype).element_size()
    return 2 * n_layers * batch * tokens * n_kv_heads * d_head * bytes_per_value


# --------------------------------------------------------------------------- segment recurrence


def attend_with_memory(
    attn: MultiHeadAttention, x: torch.Tensor, memory: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal self-attention of a segment over ``[memory; segment]`` (Transformer-XL, Dai et al., 2019).

    Queries come from the segment ``x``; keys and values from the cached ``memory`` (the ``M``
    positions before the segment, *detached*: no gradient flows into earlier segments) followed
    by ``x``. Segment token ``i`` sees every memory position and segment tokens ``0 .. i``: the
    bottom-right aligned causal mask of ``(T, M + T)`` scores.

    Args:
        attn: a :class:`~coursekit.multihead.MultiHeadAttention`.
        x: the segment ``(B, T, C)``.
        memory: ``(B, M, C)`` or ``None``.

    Returns:
        ``(B, T, C)``.
    """
    if memory is not None and (
        memory.dim() != 3 or memory.shape[0] != x.shape[0] or memory.shape[-1] != x.shape[-1]
    ):
        raise ValueError(
            f"memory must be (B, M, C) = ({x.shape[0]}, M, {x.shape[-1]}), got {tuple(memory.shape)}"
        )
    kv = (
        x if memory is None else torch.cat([memory.detach(), x], dim=1)
    )  # (B, M + T, C), stop-gradient memory
    return attn(x, kv=kv, is_causal=True)[0]


def segment_recurrence(
    attn: MultiHeadAttention, x: torch.Tensor, segment_len: int, mem_len: int
) -> torch.Tensor:
    """Run a long sequence segment by segment, each attending over the previous ``mem_len`` positions.

    After each segment the memory becomes the last ``mem_len`` positions of ``[memory; segment]``,
    detached. One layer's memory is its input; a deep Transformer-XL caches each layer's input
    the same way, so its reach grows with depth.

    Args:
        attn: the attention layer.
        x: ``(B, T, C)``.
        segment_len: ``L >= 1`` positions per segment.
        mem_len: ``M >= 0`` positions of memory.

    Returns:
        ``(B, T, C)``, equal to ``attn(x, mask=segment_recurrence_mask(T, L, M))`` in the forward pass.
    """
    if segment_len < 1 or mem_len < 0:
        raise ValueError(f"need segment_len >= 1 and mem_len >= 0, got {segment_len} and {mem_len}")
    outputs, memory = [], None
    for s0 in range(0, x.shape[1], segment_len):
        segment = x[:, s0 : s0 + segment_len]  # (B, L, C)
        outputs.append(attend_with_memory(attn, segment, memory))
        seen = segment if memory is None else torch.cat([memory, segment], dim=1)  # (B, M + L, C)
        memory = (
            seen[:, max(0, seen.shape[1] - mem_len) :].detach() if mem_len else None
        )  # the last M positions
    return torch.cat(outputs, dim=1)  # (B, T, C)


def segment_recurrence_mask(T: int, segment_len: int, mem_len: int) -> torch.Tensor:
    """The ``(T, T)`` mask under which full attention equals :func:`segment_recurrence`.

    Query ``i`` lies in the segment starting at ``s = (i // L) L`` and sees keys
    ``s - M <= j <= i``: its own segment up to itself and the ``M`` positions before the segment.

    Example: ``segment_recurrence_mask(4, 2, 1)[3]`` is ``[0, 1, 1, 1]``.
    """
    if segment_len < 1 or mem_len < 0:
        raise ValueError(f"need segment_len >= 1 and mem_len >= 0, got {segment_len} and {mem_len}")
    i, j, _ = _positions(T, None, None)
    start = (i // segment_len) * segment_len  # (T, 1) first position of each query's segment
    return (j <= i) & (j >= start - mem_len)  # (T, T)


# --------------------------------------------------------------------------- experiment and stretch


def window_mass(T: int, window: int, n: int, generator: torch.Generator, D: int = 16) -> float:
    """Measure the attention weight a sliding window keeps, for random queries and keys.

    Draws ``n`` independent trials, each one query ``q`` and ``T`` keys ``k`` with ``D``
    standard-normal entries (float64, from ``generator``: all the queries ``(n, D)`` first, then
    all the keys ``(n, T, D)``). The query sits at the last position and attends causally to all
    ``T`` keys with the weights ``softmax(q . k / sqrt(D))``; a sliding window of ``window`` keys
    would keep only the last ``window`` of them. Returns the mean over the trials of the weight on
    those ``window`` keys. The keys are exchangeable, so in theory it is ``window / T``: without
    locality, a window drops ``1 - window / T`` of the attention.

    Args:
        T: keys the query sees (its own position included), at least 1.
        window: the window ``W``, ``1 <= W <= T``.
        n: trials, at least 1.
        generator: the source of randomness (the same seed gives the same result).
        D: the width of queries and keys, at least 1.

    Returns:
        The mean kept weight, a Python ``float`` in ``[0, 1]``.

    Raises:
        ValueError: ``T``, ``n`` or ``D`` below 1, or ``window`` not in ``1 .. T``.

    Example:
        ``window_mass(64, 8, 4000, torch.Generator().manual_seed(0))`` is about ``8 / 64 = 0.125``.
    """
    for name, value in (("T", T), ("n", n), ("D", D)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= T:
        raise ValueError(f"window must be an integer in 1 .. T = {T}, got {window!r}")
    q = torch.randn(n, D, generator=generator, dtype=torch.float64)  # (n, D)
    k = torch.randn(n, T, D, generator=generator, dtype=torch.float64)  # (n, T, D)
    scores = (k @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(D)  # (n, T)
    weights = torch.softmax(scores, dim=-1)  # (n, T)
    return weights[:, T - window :].sum(dim=-1).mean().item()


def sink_window_mask(
    T: int, window: int, n_sink: int, S: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """A sliding window plus *attention sinks*: StreamingLLM's mask (Xiao et al., 2023).

    Query ``i`` sits at position ``p = i + S - T`` (bottom-right alignment) and may attend to key
    ``j <= p`` when ``j`` is in its window, ``p - window < j``, or is one of the first ``n_sink``
    tokens, ``j < n_sink``. Trained models park much of their attention on the first tokens; a
    rolling cache that evicts them breaks down, one that keeps ``n_sink`` of them (4 in the paper)
    plus the last ``window`` keys stays fluent for millions of tokens. ``n_sink = 0`` is
    :func:`sliding_window_mask`.

    Args:
        T: number of queries, ``T >= 0``.
        window: the window ``W``, a positive integer (the query itself included).
        n_sink: the sink tokens every query keeps, an integer ``>= 0``.
        S: number of keys, ``S >= T``; defaults to ``T``.
        device: where to build the mask.

    Returns:
        ``(T, S)`` boolean on ``device``, ``True`` = may attend.

    Raises:
        ValueError: ``window`` not a positive integer, ``n_sink`` not a non-negative integer, or
            not ``0 <= T <= S``.

    Example:
        ``sink_window_mask(5, 2, 1)`` is ``[[1,0,0,0,0], [1,1,0,0,0], [1,1,1,0,0], [1,0,1,1,0],
        [1,0,0,1,1]]``.
    """
    if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
        raise ValueError(f"n_sink must be a non-negative integer, got {n_sink!r}")
    window_part = sliding_window_mask(T, window, S, device=device)  # (T, S), validates the rest
    S = window_part.shape[-1]
    p = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1) query positions
    j = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    return window_part | ((j < n_sink) & (j <= p))  # (T, S)


# --------------------------------------------------------------------------- tiled backward with recomputation


def _check_tiled_autograd_inputs(q, k, v, causal, block_q, block_k) -> None:
    check_attention_inputs(q, k, v)
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"q, k and v must share their leading dimensions (no broadcasting), got {tuple(q.shape)}, "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q} and block_k={block_k}")
    if causal and k.shape[-2] < q.shape[-2]:
        raise ValueError(
            f"a causal mask needs at least as many keys as queries, got T={q.shape[-2]} and S={k.shape[-2]}"
        )


def _tile_scores(qi, kj, i0, j0, T, S, causal, scale):
    """One tile of scaled scores ``(..., Tq, Sk)``, ``-inf`` where a causal query may not look."""
    s = (qi @ kj.transpose(-2, -1)) * scale  # (..., Tq, Sk)
    if causal:
        rows = torch.arange(i0, i0 + qi.shape[-2], device=qi.device)[:, None] + (S - T)  # (Tq, 1)
        cols = torch.arange(j0, j0 + kj.shape[-2], device=qi.device)[None, :]  # (1, Sk)
        s = s.masked_fill(cols > rows, -math.inf)
    return s


def tiled_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The online-softmax forward of :func:`tiled_attention`, also returning each row's log-sum-exp.

    The running maximum ``m`` and running sum ``l`` of a query row end as ``m`` and
    ``l = sum_j exp(s_j - m)``, so ``lse = m + log(l) = log sum_j exp(s_j)``. That one number per
    row is all the backward pass needs to rebuild any tile of probabilities,
    ``P = exp(s - lse)``, without storing them (FlashAttention, Dao et al., 2022).

    Args:
        q: ``(..., T, D)``.
        k: ``(..., S, D)``, the same leading dimensions as ``q``.
        v: ``(..., S, Dv)``.
        causal: bottom-right causal mask (query ``i`` sees keys ``j <= i + S - T``), ``S >= T``.
        block_q, block_k: tile sizes, ``>= 1``.
        scale: multiplies the scores; defaults to ``1 / sqrt(D)``.

    Returns:
        ``(out, lse)``: ``(..., T, Dv)``, equal to :func:`tiled_attention`, and ``(..., T)``, the
        log-sum-exp of each query's scaled scores (every row sees at least one key).

    Raises:
        ValueError: block sizes below 1, ``causal`` with ``S < T``, leading dimensions that differ.
    """
    _check_tiled_autograd_inputs(q, k, v, causal, block_q, block_k)
    T, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    outputs, lses = [], []
    for i0 in range(0, T, block_q):
        qi = q[..., i0 : i0 + block_q, :]  # (..., Tq, D)
        m = torch.full((*qi.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)  # (..., Tq, 1)
        l = torch.zeros_like(m)  # (..., Tq, 1)
        acc = torch.zeros((*qi.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)  # (..., Tq, Dv)
        for j0 in range(0, S, block_k):
            if causal and j0 > i0 + qi.shape[-2] - 1 + S - T:
                break  # every later key tile lies in the future of the whole query block
            s = _tile_scores(qi, k[..., j0 : j0 + block_k, :], i0, j0, T, S, causal, scale)  # (..., Tq, Sk)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., Tq, 1), finite: key j0 is visible
            p = torch.exp(s - m_new)  # (..., Tq, Sk)
            alpha = torch.exp(m - m_new)  # (..., Tq, 1), 0 on the first tile
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + p @ v[..., j0 : j0 + block_k, :]  # (..., Tq, Dv)
            m = m_new
        outputs.append(acc / l)
        lses.append((m + torch.log(l)).squeeze(-1))  # (..., Tq)
    return torch.cat(outputs, dim=-2), torch.cat(lses, dim=-1)  # (..., T, Dv), (..., T)


def tiled_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of attention tile by tile, recomputing the probabilities (FlashAttention's backward).

    With ``P = softmax(s)`` row by row, ``s = scale q k^T`` and ``out = P v``, the chain rule gives

    * ``dV = P^T dO`` and ``dP = dO V^T``;
    * through the softmax, ``dS = P * (dP - Delta)`` with ``Delta_i = sum_j P_ij dP_ij``, which
      equals ``rowsum(dO * O)`` (since ``O = P V``) and so needs no ``(T, S)`` matrix;
    * ``dQ = scale dS K`` and ``dK = scale dS^T Q``.

    Every term is a sum over tiles, so the loop rebuilds each ``block_q x block_k`` tile of
    ``P = exp(s - lse)`` from ``q``, ``k`` and the saved log-sum-exp, uses it and throws it away:
    the extra memory is one tile, not the ``(T, S)`` matrix that plain autograd keeps. The loop
    over key tiles is outside (each key tile accumulates its ``dK`` and ``dV`` while the query
    tiles stream past), as in FlashAttention-2.

    Args:
        q, k, v: the forward's inputs, ``(..., T, D)``, ``(..., S, D)``, ``(..., S, Dv)``.
        out: the forward's output ``(..., T, Dv)``.
        lse: the log-sum-exp of each row of scaled scores ``(..., T)``
            (:func:`tiled_attention_forward`).
        grad_out: the gradient of the loss with respect to ``out``, ``(..., T, Dv)``.
        causal, block_q, block_k, scale: as in the forward pass (the tiles need not match it).

    Returns:
        ``(dq, dk, dv)`` shaped like ``q``, ``k`` and ``v``.

    Raises:
        ValueError: as :func:`tiled_attention_forward`, or ``out``, ``lse`` or ``grad_out`` of the
            wrong shape.
    """
    _check_tiled_autograd_inputs(q, k, v, causal, block_q, block_k)
    T, S = q.shape[-2], k.shape[-2]
    expected = (*q.shape[:-1], v.shape[-1])
    if out.shape != expected or grad_out.shape != expected or lse.shape != q.shape[:-1]:
        raise ValueError(
            f"expected out and grad_out {expected} and lse {tuple(q.shape[:-1])}, got {tuple(out.shape)}, "
            f"{tuple(grad_out.shape)} and {tuple(lse.shape)}"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    delta = (grad_out * out).sum(dim=-1)  # (..., T): Delta_i = rowsum(dO * O)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j0 in range(0, S, block_k):
        kj, vj = k[..., j0 : j0 + block_k, :], v[..., j0 : j0 + block_k, :]  # (..., Sk, D), (..., Sk, Dv)
        first_query = 0 if not causal else max(0, j0 - (S - T))  # earlier queries cannot see this tile
        for i0 in range(first_query - first_query % block_q, T, block_q):
            qi = q[..., i0 : i0 + block_q, :]  # (..., Tq, D)
            s = _tile_scores(qi, kj, i0, j0, T, S, causal, scale)  # (..., Tq, Sk)
            p = torch.exp(s - lse[..., i0 : i0 + block_q, None])  # (..., Tq, Sk) recomputed probabilities
            do = grad_out[..., i0 : i0 + block_q, :]  # (..., Tq, Dv)
            dv[..., j0 : j0 + block_k, :] += p.transpose(-2, -1) @ do  # (..., Sk, Dv)
            dp = do @ vj.transpose(-2, -1)  # (..., Tq, Sk)
            ds = p * (dp - delta[..., i0 : i0 + block_q, None])  # (..., Tq, Sk)
            dq[..., i0 : i0 + block_q, :] += scale * (ds @ kj)  # (..., Tq, D)
            dk[..., j0 : j0 + block_k, :] += scale * (ds.transpose(-2, -1) @ qi)  # (..., Sk, D)
    return dq, dk, dv


class TiledAttention(torch.autograd.Function):
    """Exact attention whose backward pass recomputes its tiles instead of storing them.

    The forward pass (:func:`tiled_attention_forward`) saves ``q``, ``k``, ``v``, the output and one
    log-sum-exp per query row: ``O(T D + S D)`` numbers. The backward pass
    (:func:`tiled_attention_backward`) rebuilds each tile of probabilities from them. Plain
    autograd through attention would instead keep the ``(T, S)`` weights (and more) for every
    head: the memory that limits training on long sequences. Call it through
    :func:`flash_attention`.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=64, block_k=64, scale=None):
        out, lse = tiled_attention_forward(q, k, v, causal, block_q, block_k, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, block_q, block_k, scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.options)
        return dq, dk, dv, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact attention, tiled forward and backward: the FlashAttention algorithm (Dao et al., 2022) in PyTorch.

    The same numbers as :func:`tiled_attention` (causal or not, no other mask), but training
    through it stores only ``q, k, v``, the output and a log-sum-exp per row; the backward pass
    recomputes the probabilities tile by tile. A Python loop over tiles: it shows the algorithm
    and its memory; it does not make the fused GPU kernel's speed.

    Args:
        q: ``(..., T, D)``.
        k: ``(..., S, D)``, the same leading dimensions as ``q``.
        v: ``(..., S, Dv)``.
        causal: bottom-right causal mask, needs ``S >= T``.
        block_q, block_k: tile sizes, ``>= 1``.
        scale: multiplies the scores; defaults to ``1 / sqrt(D)``.

    Returns:
        ``(..., T, Dv)``, differentiable with respect to ``q``, ``k`` and ``v``.
    """
    return TiledAttention.apply(q, k, v, causal, block_q, block_k, scale)


# --------------------------------------------------------------------------- attention sinks on a trained GPT


def _check_gpt_input(model, idx: torch.Tensor) -> None:
    if idx.dim() != 2 or idx.dtype != torch.long:
        raise ValueError(f"idx must be (B, T) token ids of dtype int64, got {tuple(idx.shape)} {idx.dtype}")
    if not 1 <= idx.shape[1] <= model.cfg.block_size:
        raise ValueError(
            f"the model has {model.cfg.block_size} learned positions, so 1 <= T <= {model.cfg.block_size}; "
            f"got T={idx.shape[1]}"
        )


def _attend(attn, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask=None):
    """``attn``'s attention of ``q`` over the given keys and values, through its output projection."""
    group = attn.n_heads // attn.n_kv_heads
    out, weights = scaled_dot_product_attention(
        q, repeat_kv(keys, group), repeat_kv(values, group), mask=mask
    )  # (B, H, T, D), (B, H, T, S)
    return attn.out_proj(merge_heads(out)), weights  # (B, T, C)


def gpt_logits_with_mask(
    model, idx: torch.Tensor, mask: torch.Tensor, return_weights: bool = False
) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
    """Next-token logits of a Chapter 7 :class:`~coursekit.gpt.GPT` whose layers attend under ``mask``.

    The same computation as ``model(idx)`` (token plus learned position embeddings, pre-norm
    blocks, final norm, tied output layer) with the causal mask replaced by any boolean mask,
    e.g. :func:`sliding_window_mask` or :func:`sink_window_mask`. Because the model's positions
    are added to the embeddings, a rolling cache that keeps each token's key and value as they
    were computed is exactly attention under such a mask (:func:`sink_cache_decode` checks it).
    Run it in ``eval()`` mode unless dropout is wanted.

    Args:
        model: a :class:`~coursekit.gpt.GPT`.
        idx: ``(B, T)`` token ids, ``T <= model.cfg.block_size``.
        mask: ``(T, T)`` boolean, ``True`` = may attend; a query that may attend to nothing gets a
            zero attention output.
        return_weights: also return every layer's attention weights.

    Returns:
        ``(B, T, V)`` logits; with ``return_weights``, also a list of ``L`` tensors ``(B, H, T, T)``.

    Raises:
        ValueError: ``idx`` not ``(B, T)`` integers within the model's positions, or ``mask`` not a
            ``(T, T)`` boolean.
    """
    _check_gpt_input(model, idx)
    T = idx.shape[1]
    if mask.shape != (T, T) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a ({T}, {T}) boolean, got {tuple(mask.shape)} {mask.dtype}")
    x = model.drop(model.tok_emb(idx) + model.pos_emb(torch.arange(T, device=idx.device)))  # (B, T, C)
    all_weights = []
    for block in model.blocks:
        q, k, v = block.attn.project(block.norm1(x))  # (B, H, T, D), (B, H_kv, T, D) x 2
        out, weights = _attend(block.attn, q, k, v, mask=mask)  # (B, T, C), (B, H, T, T)
        all_weights.append(weights)
        x = x + block.dropout1(out)
        x = x + block.dropout2(block.ff(block.norm2(x)))
    logits = model.lm_head(model.norm(x))  # (B, T, V)
    return (logits, all_weights) if return_weights else logits


def sink_cache_decode(model, idx: torch.Tensor, window: int, n_sink: int) -> torch.Tensor:
    """Feed ``idx`` to a GPT token by token through StreamingLLM's cache (Xiao et al., 2023).

    Every layer caches the keys and values of the first ``n_sink`` tokens (the *attention
    sinks*) and of the last ``window`` tokens, the new one included; when a token arrives and the
    cache is full, the oldest token that is not a sink is evicted. ``n_sink = 0`` is a plain
    rolling window. Each token keeps its absolute position (the model's positions are in its
    embeddings), so the result equals :func:`gpt_logits_with_mask` under :func:`sink_window_mask`.

    Args:
        model: a :class:`~coursekit.gpt.GPT`, in ``eval()`` mode for a deterministic result.
        idx: ``(B, T)`` token ids, ``T <= model.cfg.block_size``.
        window: recent tokens kept, ``W >= 1``.
        n_sink: first tokens kept, ``>= 0``.

    Returns:
        ``(B, T, V)``: the logits computed at each step.
    """
    _check_gpt_input(model, idx)
    if window < 1 or n_sink < 0:
        raise ValueError(f"need window >= 1 and n_sink >= 0, got window={window} and n_sink={n_sink}")
    caches: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(model.blocks)
    logits = []
    for t in range(idx.shape[1]):
        pos = torch.tensor([t], device=idx.device)
        x = model.drop(model.tok_emb(idx[:, t : t + 1]) + model.pos_emb(pos))  # (B, 1, C)
        for layer, block in enumerate(model.blocks):
            q, k, v = block.attn.project(block.norm1(x))  # (B, H, 1, D), (B, H_kv, 1, D) x 2
            if caches[layer] is not None:
                k = torch.cat([caches[layer][0], k], dim=2)  # (B, H_kv, n + 1, D)
                v = torch.cat([caches[layer][1], v], dim=2)
            if k.shape[2] > n_sink + window:  # full: evict the oldest token that is not a sink
                keep = [j for j in range(k.shape[2]) if j != n_sink]
                k, v = k[:, :, keep], v[:, :, keep]  # (B, H_kv, n_sink + W, D)
            caches[layer] = (k, v)
            out, _ = _attend(block.attn, q, k, v)  # (B, 1, C)
            x = x + block.dropout1(out)
            x = x + block.dropout2(block.ff(block.norm2(x)))
        logits.append(model.lm_head(model.norm(x)))  # (B, 1, V)
    return torch.cat(logits, dim=1)  # (B, T, V)

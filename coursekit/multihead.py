"""Chapter 2: multi-head attention, with grouped-query (GQA) and multi-query (MQA) variants.

One module holds every variant. With ``H`` query heads of width ``D = C / H`` and
``H_kv`` key/value heads:

- ``H_kv == H`` is multi-head attention (Vaswani et al., 2017);
- ``H_kv == 1`` is multi-query attention (Shazeer, 2019);
- ``1 < H_kv < H`` is grouped-query attention (Ainslie et al., 2023): query head ``h``
  reads key/value head ``h // (H / H_kv)``, the grouping of
  ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``.

The query, key and value projections are *packed* into one ``nn.Linear`` whose
output rows are ``[q (C) | k (H_kv D) | v (H_kv D)]``, the layout of
``nn.MultiheadAttention.in_proj_weight``; cross-attention applies the ``q`` rows to
the queries' sequence and the ``k``/``v`` rows to the other sequence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.attention import bool_to_additive, causal_mask, scaled_dot_product_attention

__all__ = [
    "MultiHeadAttention",
    "split_heads",
    "merge_heads",
    "repeat_kv",
    "kv_cache_bytes",
    "kv_pooling_error",
    "pool_kv_heads",
]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Cut the feature axis into ``n_heads`` heads and move the heads before the sequence.

    Args:
        x: ``(B, T, H * D)``, in any memory layout.
        n_heads: ``H``; a positive number that divides the last dimension.

    Returns:
        ``(B, H, T, D)`` in ``x``'s dtype, where head ``h`` holds features
        ``h*D .. (h+1)*D - 1``.

    Raises:
        ValueError: if ``x`` is not 3-D (naming its shape), or if ``n_heads`` is not a
            positive divisor of the width (naming both).

    Example: ``x`` of shape ``(2, 5, 12)`` with 3 heads becomes ``(2, 3, 5, 4)``.
    """
    if x.dim() != 3:
        raise ValueError(f"expected x of shape (B, T, H*D), got {tuple(x.shape)}")
    B, T, HD = x.shape
    if n_heads < 1 or HD % n_heads:
        raise ValueError(f"n_heads={n_heads} must be positive and divide the width {HD}")
    return x.view(B, T, n_heads, HD // n_heads).transpose(1, 2)  # (B, H, T, D)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_heads`: concatenate the heads' features.

    Args:
        x: ``(B, H, T, D)``, in any memory layout (a transposed view, say).

    Returns:
        ``(B, T, H * D)`` in ``x``'s dtype: token ``t`` holds head 0's ``D`` features,
        then head 1's, and so on.

    Raises:
        ValueError: if ``x`` is not 4-D, naming its shape.
    """
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H, T, D), got {tuple(x.shape)}")
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each key/value head ``n_rep`` times, so ``H_kv`` heads serve ``H = H_kv * n_rep``.

    Args:
        x: ``(B, H_kv, S, D)``.
        n_rep: queries per key/value head, at least 1.

    Returns:
        ``(B, H_kv * n_rep, S, D)`` in ``x``'s dtype; output head ``h`` is input head
        ``h // n_rep``. With ``n_rep = 1``, ``x``'s values (``x`` itself is fine).
        Gradients flow back to ``x``.

    Raises:
        ValueError: if ``x`` is not 4-D or ``n_rep < 1``.

    Example: heads ``[a, b]`` with ``n_rep=2`` become ``[a, a, b, b]`` (not ``[a, b, a, b]``).
    """
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (B, H_kv, S, D), got {tuple(x.shape)}")
    if n_rep < 1:
        raise ValueError(f"n_rep must be positive, got {n_rep}")
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)  # (B, H, S, D)


def kv_cache_bytes(
    n_layers: int, n_kv_heads: int, d_head: int, seq_len: int, batch: int = 1, bytes_per_value: int = 2
) -> int:
    """Memory of a KV cache: a key and a value vector per layer, key/value head and token.

    MQA (``H_kv = 1``) and GQA shrink it by ``H / H_kv`` against MHA (``H_kv = H``).

    Args:
        n_layers: attention layers ``L``.
        n_kv_heads: key/value heads ``H_kv`` per layer.
        d_head: head width ``D``.
        seq_len: cached tokens ``T``.
        batch: sequences ``B``.
        bytes_per_value: 2 for float16/bfloat16, 4 for float32.

    Returns:
        ``2 * L * H_kv * D * T * B * bytes_per_value`` bytes.

    Example: Llama 2 7B (``L=32, H_kv=32, D=128``) at 4096 tokens in float16 needs
    ``kv_cache_bytes(32, 32, 128, 4096)`` = 2 GiB.
    """
    for name, value in (
        ("n_layers", n_layers),
        ("n_kv_heads", n_kv_heads),
        ("d_head", d_head),
        ("seq_len", seq_len),
        ("batch", batch),
        ("bytes_per_value", bytes_per_value),
    ):
        if value < 0:
            raise ValueError(f"{name} must be non-negative, got {value}")
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch * bytes_per_value


class MultiHeadAttention(nn.Module):
    """Multi-head attention with packed projections; GQA/MQA through ``n_kv_heads``.

    Args:
        d_model: model width ``C``.
        n_heads: query heads ``H``; must divide ``C``. Each head has width ``D = C / H``.
        n_kv_heads: key/value heads ``H_kv`` (default ``H``); must divide ``H``.
        bias: whether the projections have biases.
        dropout: probability of zeroing an attention weight in training mode (as in
            Vaswani et al., 2017 and ``nn.MultiheadAttention``); the weights that are
            kept are scaled by ``1 / (1 - dropout)``. The module's only dropout.

    Parameters: ``qkv_proj`` (``C -> C + 2 H_kv D``) and ``out_proj`` (``C -> C``), so
    MHA has ``4 C^2 + 4 C`` parameters whatever ``H`` is.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model < 1 or n_heads < 1 or d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must be positive and divide d_model={d_model}")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must be positive and divide n_heads={n_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        self.qkv_proj = nn.Linear(d_model, d_model + 2 * n_kv_heads * self.d_head, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def project(self, x: torch.Tensor, kv: torch.Tensor | None = None):
        """Queries from ``x``; keys and values from ``kv`` (default ``x``), split into heads.

        Args:
            x: queries' sequence ``(B, T, C)``.
            kv: keys' and values' sequence ``(B, S, C)``; ``None`` for self-attention.

        Returns:
            ``q (B, H, T, D)``, ``k (B, H_kv, S, D)``, ``v (B, H_kv, S, D)``: the
            ``k`` and ``v`` are what a KV cache stores.
        """
        C, kvw = self.d_model, self.n_kv_heads * self.d_head
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        if kv is None:
            q, k, v = self.qkv_proj(x).split([C, kvw, kvw], dim=-1)  # (B, T, C), 2 x (B, T, H_kv D)
        else:
            q = F.linear(x, w[:C], None if b is None else b[:C])  # (B, T, C)
            # (B, S, H_kv D) each
            k, v = F.linear(kv, w[C:], None if b is None else b[C:]).split([kvw, kvw], dim=-1)
        return split_heads(q, self.n_heads), split_heads(k, self.n_kv_heads), split_heads(v, self.n_kv_heads)

    def forward(
        self,
        x: torch.Tensor,
        kv: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from ``x`` to ``kv`` (self-attention when ``kv`` is None).

        Args:
            x: queries' sequence ``(B, T, C)``.
            kv: keys' and values' sequence ``(B, S, C)`` for cross-attention.
            mask: broadcastable to ``(B, H, T, S)``; boolean ``True`` = may attend, or
                floating and added to the scores. A ``(T, S)`` mask applies to every
                batch element and head.
            key_padding_mask: ``(B, S)`` boolean, ``True`` for real keys and ``False``
                for padding (the opposite of ``nn.MultiheadAttention``'s argument).
            is_causal: add :func:`~coursekit.attention.causal_mask` ``(T, S)`` (bottom-right
                aligned when ``S > T``), made on ``x``'s device.
            need_weights: also return the attention weights.

        Returns:
            ``(out, weights)``: ``out (B, T, C)``; ``weights (B, H, T, S)`` (after
            dropout, one matrix per head) or ``None``. A query with no visible key gets a
            zero attention output (then ``out_proj``'s bias). In training mode ``out`` is
            computed from the weights after dropout.

        Raises:
            ValueError: for ``x`` or ``kv`` of the wrong shape, a ``key_padding_mask``
                that is not a boolean ``(B, S)`` tensor, or a ``mask`` that is neither
                boolean nor floating.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"expected x of shape (B, T, {self.d_model}), got {tuple(x.shape)}")
        if kv is not None and (kv.dim() != 3 or kv.shape[0] != x.shape[0] or kv.shape[-1] != self.d_model):
            raise ValueError(f"expected kv of shape ({x.shape[0]}, S, {self.d_model}), got {tuple(kv.shape)}")
        source = x if kv is None else kv
        B, T, S = x.shape[0], x.shape[1], source.shape[1]
        q, k, v = self.project(x, kv)  # (B, H, T, D), (B, H_kv, S, D), (B, H_kv, S, D)
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D)
        mask = self._combine_masks(mask, key_padding_mask, is_causal, B, T, S, x)
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, H, T, D), (B, H, T, S)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, self.dropout)
            out = weights @ v  # (B, H, T, D)
        return self.out_proj(merge_heads(out)), (weights if need_weights else None)

    @staticmethod
    def _combine_masks(mask, key_padding_mask, is_causal, B, T, S, x):
        """One additive mask broadcastable to ``(B, H, T, S)`` (``0`` keep, ``-inf`` drop), or None.

        Each boolean part becomes ``0``/``-inf`` and the parts are added, so a key is
        dropped if any part drops it (the logical *and* of the boolean masks).
        """
        parts = []
        if mask is not None:
            if mask.dtype == torch.bool:
                parts.append(bool_to_additive(mask, x.dtype))
            elif mask.is_floating_point():
                parts.append(mask.to(x.dtype))
            else:
                raise ValueError(f"mask must be boolean or floating, got {mask.dtype}")
        if key_padding_mask is not None:
            if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (B, S):
                raise ValueError(
                    f"key_padding_mask must be a boolean ({B}, {S}) tensor (True = real key), "
                    f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
                )
            parts.append(bool_to_additive(key_padding_mask[:, None, None, :], x.dtype))  # (B, 1, 1, S)
        if is_causal:
            parts.append(bool_to_additive(causal_mask(T, S, device=x.device), x.dtype))  # (T, S)
        return sum(parts) if parts else None


def kv_pooling_error(k: torch.Tensor, n_kv_heads: int) -> float:
    """What mean-pooling key (or value) heads into groups loses: the relative squared error.

    The conversion of a multi-head checkpoint to grouped-query attention (Ainslie et al., 2023)
    replaces each group of ``n_rep = H / H_kv`` consecutive heads by their mean. This measures
    ``sum((k - pooled)^2) / sum(k^2)``, where ``pooled`` gives every head its group's mean.
    For independent heads of equal variance it is about ``1 - H_kv / H``; heads that agree lose less.

    Args:
        k: ``(B, H, S, D)`` keys (or values), floating; not modified.
        n_kv_heads: ``H_kv``, a positive divisor of ``H``.

    Returns:
        The relative error as a Python ``float`` (``0.0`` when ``n_kv_heads == H``; ``0.0`` for
        all-zero ``k``).

    Raises:
        ValueError: if ``k`` is not 4-D (naming its shape) or ``n_kv_heads`` does not divide ``H``
            (naming both).

    Example: heads ``[a, b]`` with ``a = 1``, ``b = -1`` everywhere and ``n_kv_heads=1`` pool to
    ``0``, so the error is ``1.0``; heads ``[a, a]`` give ``0.0``.
    """
    if k.dim() != 4:
        raise ValueError(f"expected k of shape (B, H, S, D), got {tuple(k.shape)}")
    B, H, S, D = k.shape
    if n_kv_heads < 1 or H % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must be positive and divide the {H} heads of k")
    groups = k.reshape(B, n_kv_heads, H // n_kv_heads, S, D)  # (B, H_kv, n_rep, S, D)
    pooled = repeat_kv(groups.mean(dim=2), H // n_kv_heads)  # (B, H, S, D)
    total = k.pow(2).sum()
    if total == 0:
        return 0.0
    return ((k - pooled).pow(2).sum() / total).item()


def pool_kv_heads(
    qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None, n_heads: int, n_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Convert a multi-head layer's packed projection to grouped-query attention by mean-pooling.

    Ainslie et al. (2023) turn a multi-head checkpoint into a GQA one by averaging the key heads
    (and the value heads) of each group of ``n_rep = H / H_kv`` consecutive heads, then train
    briefly. The query rows are kept.

    Args:
        qkv_weight: ``(3C, C)``, the rows ``[q (C) | k (C) | v (C)]`` of
            :class:`MultiHeadAttention` ``(C, H)``'s ``qkv_proj.weight``; not modified.
        qkv_bias: ``(3C,)`` in the same layout, or ``None``.
        n_heads: ``H``, a positive divisor of ``C``.
        n_kv_heads: ``H_kv``, a positive divisor of ``H``.

    Returns:
        ``(weight, bias)``: ``weight (C + 2 H_kv D, C)`` and ``bias (C + 2 H_kv D,)`` (or ``None``)
        for ``MultiHeadAttention(C, H, n_kv_heads=H_kv).qkv_proj``, where ``D = C / H``: the ``q``
        rows unchanged, then key head ``g``'s ``D`` rows the mean of key heads ``g n_rep .. (g + 1)
        n_rep - 1``, then the value heads likewise.

    Raises:
        ValueError: if ``qkv_weight`` is not ``(3C, C)``, ``qkv_bias`` not ``(3C,)``, or a head count
            does not divide (naming what came).

    Example: ``C = 4, H = 2, H_kv = 1``: the key rows 0-1 and 2-3 (of the ``k`` block) are averaged
    into 2 rows, so the weight goes from ``(12, 4)`` to ``(8, 4)``.
    """
    if qkv_weight.dim() != 2 or qkv_weight.shape[0] != 3 * qkv_weight.shape[1]:
        raise ValueError(f"expected qkv_weight of shape (3C, C), got {tuple(qkv_weight.shape)}")
    C = qkv_weight.shape[1]
    if qkv_bias is not None and tuple(qkv_bias.shape) != (3 * C,):
        raise ValueError(f"expected qkv_bias of shape ({3 * C},), got {tuple(qkv_bias.shape)}")
    if n_heads < 1 or C % n_heads:
        raise ValueError(f"n_heads={n_heads} must be positive and divide C={C}")
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must be positive and divide n_heads={n_heads}")
    D, n_rep = C // n_heads, n_heads // n_kv_heads

    def pool(rows):  # (C, ...) -> (H_kv D, ...): the mean over each group's heads
        grouped = rows.reshape(n_kv_heads, n_rep, D, *rows.shape[1:])  # (H_kv, n_rep, D, ...)
        return grouped.mean(dim=1).reshape(n_kv_heads * D, *rows.shape[1:])  # (H_kv D, ...)

    def convert(t):
        q, k, v = t.split([C, C, C], dim=0)  # 3 x (C, ...)
        return torch.cat([q, pool(k), pool(v)], dim=0)  # (C + 2 H_kv D, ...)

    return convert(qkv_weight), None if qkv_bias is None else convert(qkv_bias)

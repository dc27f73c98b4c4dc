"""Chapter 7: a GPT decoder, its KV cache, the causal LM loss and a tested GPT-2 weight mapping.

A GPT (Radford et al., 2018, 2019) is a stack of *pre-norm* transformer layers whose
self-attention is causal, between a token-plus-position embedding and an output layer
that reuses the token embedding (tied weights, Press & Wolf, 2017). It models
``p(x_1 .. x_T) = prod_t p(x_t | x_<t)``: the logits at position ``t`` predict token
``t + 1``, so training on a window is ``T`` next-token problems at once (teacher forcing).

Built from the earlier chapters: every :class:`Block` holds Chapter 4's
:class:`~coursekit.layers.LayerNorm` (run by torch's fused kernel,
:class:`~coursekit.layers.FusedLayerNorm`) and :class:`~coursekit.layers.FeedForward` (its
activation, GPT-2's tanh GELU by default, chosen by name from :data:`~coursekit.layers.ACTIVATIONS`) and
Chapter 2's :class:`~coursekit.multihead.MultiHeadAttention`. Its attention runs through
:func:`causal_self_attention`, which uses the module's own projections and adds what
generation needs: a :class:`KVCache`, and torch's fused ``scaled_dot_product_attention``
kernel (a test keeps it equal to ``MultiHeadAttention.forward(x, is_causal=True)``).

**The KV cache.** At decoding step ``t`` a layer needs the keys and values of all earlier
tokens, which do not change: the cache keeps them, so each step computes ``q, k, v`` for
the one new token only. Two things must then be offset by the number of cached tokens
``P``: the new tokens' *positions* (``P, P + 1, ...``) and the *causal mask* (new token
``i`` may see keys ``0 .. P + i``, a bottom-right aligned mask).

**Padding.** Prompts of different lengths share a batch by *left* padding, so that every row's
last token, the one whose logits pick the next token, sits in the last column. ``GPT.forward``
then takes an ``attention_mask`` ``(B, P + T)`` (``True`` at real tokens, over the cached and
the new positions, as Hugging Face's argument): padding keys are masked out and positions count
real tokens only (:func:`positions_from_mask`), so a padded row's logits at its real tokens are
the unpadded row's. :func:`padded_self_attention` is the attention of that path.

**Hugging Face weights.** :func:`from_hf_state_dict` / :func:`to_hf_state_dict` map
between this module and ``transformers.GPT2LMHeadModel``; GPT-2 stores its linear
layers as ``Conv1D`` with the weight transposed (``(in, out)``), and packs ``[q | k | v]``
in ``c_attn`` exactly as our ``qkv_proj`` does. With internet access, real GPT-2 loads
through the same mapping::

    from transformers import GPT2LMHeadModel            # downloads about 500 MB
    hf = GPT2LMHeadModel.from_pretrained("gpt2")
    model = GPT(GPT_PRESETS["gpt2"])
    model.load_state_dict(from_hf_state_dict(hf.state_dict()))
    enc = tiktoken.get_encoding("gpt2")                 # GPT-2's tokenizer (also downloaded)

**Packing and preferences.** :func:`document_ids` and :func:`document_causal_mask` give the
block-diagonal causal mask of documents packed into one window (Krell et al., 2021);
:func:`sequence_log_prob` and :func:`dpo_loss` tune a model on pairs of preferred and rejected
answers by direct preference optimization (Rafailov et al., 2023).

Over 500 lines: the config, the KV cache, the graded causal_self_attention, its padded variant, the
model, the measures of a language model's loss, packing, DPO and the Hugging Face mapping are
Chapter 7's model file, formatted at 110 columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from coursekit._config import check_transformer_config
from coursekit.attention import causal_mask
from coursekit.layers import (
    FusedLayerNorm,
    encoder_layer_params,
    feed_forward,
    layer_norm_params,
)
from coursekit.multihead import MultiHeadAttention, merge_heads

__all__ = [
    "GPTConfig",
    "GPT_PRESETS",
    "GPT",
    "Block",
    "KVCache",
    "LayerCache",
    "causal_self_attention",
    "padded_self_attention",
    "positions_from_mask",
    "causal_lm_loss",
    "bits_per_char",
    "perplexity",
    "unigram_loss",
    "document_ids",
    "document_causal_mask",
    "sequence_log_prob",
    "dpo_loss",
    "gpt_param_count",
    "from_hf_state_dict",
    "to_hf_state_dict",
    "config_from_hf",
    "hf_config_kwargs",
]


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class GPTConfig:
    """Shape and regularisation of a :class:`GPT`; the keys are ``GPT``'s constructor arguments.

    Args:
        vocab_size: ``V``.
        block_size: the longest context, ``T_max`` (learned positions ``0 .. T_max - 1``).
        n_layers: ``L``.
        n_heads: ``H``; must divide ``d_model``.
        d_model: ``C``.
        d_ff: feed-forward width; ``None`` for ``4 C``.
        dropout: on embeddings, attention weights, sub-layer outputs and FF activations.
        bias: biases in the linear layers and norms (GPT-2 has them).
        activation: ``"gelu_tanh"`` (GPT-2's tanh approximation) or ``"gelu"`` (exact).
        eps: the layer norms' epsilon.
    """

    vocab_size: int
    block_size: int
    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int | None = None
    dropout: float = 0.0
    bias: bool = True
    activation: str = "gelu_tanh"
    eps: float = 1e-5

    def __post_init__(self):
        check_transformer_config(self, ("vocab_size", "block_size", "n_layers", "n_heads", "d_model"))
        if self.activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"activation must be 'gelu' or 'gelu_tanh', got {self.activation!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


#: ``nano`` for tests; ``small`` is the book's character-level model (set ``vocab_size`` from
#: the tokenizer with ``dataclasses.replace``); the rest are published shapes (GPT-2:
#: Radford et al., 2019; GPT-3 175B: Brown et al., 2020) for parameter arithmetic.
GPT_PRESETS: dict[str, GPTConfig] = {
    "nano": GPTConfig(vocab_size=64, block_size=32, n_layers=2, n_heads=2, d_model=32),
    "small": GPTConfig(vocab_size=128, block_size=128, n_layers=4, n_heads=4, d_model=128),
    "gpt2": GPTConfig(vocab_size=50257, block_size=1024, n_layers=12, n_heads=12, d_model=768),
    "gpt2-medium": GPTConfig(vocab_size=50257, block_size=1024, n_layers=24, n_heads=16, d_model=1024),
    "gpt2-large": GPTConfig(vocab_size=50257, block_size=1024, n_layers=36, n_heads=20, d_model=1280),
    "gpt2-xl": GPTConfig(vocab_size=50257, block_size=1024, n_layers=48, n_heads=25, d_model=1600),
    "gpt3": GPTConfig(vocab_size=50257, block_size=2048, n_layers=96, n_heads=96, d_model=12288),
}


def gpt_param_count(cfg: GPTConfig) -> int:
    """Exact number of parameters of ``GPT(cfg)`` (tied output layer), from Chapter 4's counts."""
    embeddings = (cfg.vocab_size + cfg.block_size) * cfg.d_model
    return (
        embeddings
        + cfg.n_layers * encoder_layer_params(cfg.d_model, cfg.d_ff, cfg.bias)
        + layer_norm_params(cfg.d_model, cfg.bias)
    )


# --------------------------------------------------------------------------- KV cache


class LayerCache:
    """One layer's cached keys and values, preallocated for ``max_len`` positions.

    ``update`` writes the new tokens' keys and values at positions ``length ..
    length + T - 1`` and returns views of everything cached so far; writing into a
    preallocated buffer keeps a decoding step's cost independent of how many steps came
    before (concatenating would copy the whole cache at every step).

    Args:
        batch_size, n_kv_heads, max_len, d_head: the buffers are ``(B, H_kv, max_len, D)``.
        dtype, device: of the buffers.
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        max_len: int,
        d_head: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        shape = (batch_size, n_kv_heads, max_len, d_head)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (B, H_kv, max_len, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (B, H_kv, max_len, D)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v`` of shape ``(B, H_kv, T, D)``; return all cached ``(B, H_kv, length, D)``."""
        if k.shape != v.shape or k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
            raise ValueError(
                f"expected k and v of shape ({self.k.shape[0]}, {self.k.shape[1]}, T, {self.k.shape[3]}), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"the cache holds {self.max_len} positions; {start} are used and {k.shape[2]} more do not fit"
            )
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, H_kv, end, D) each

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search: each new beam copies its parent's cache)."""
        self.k, self.v = self.k[index], self.v[index]


class KVCache:
    """The :class:`LayerCache` of every layer of a model; ``length`` is the number of cached positions."""

    def __init__(self, layers: list[LayerCache]):
        if not layers:
            raise ValueError("a KVCache needs at least one layer")
        self.layers = layers

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def max_len(self) -> int:
        return self.layers[0].max_len

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` in every layer (see :meth:`LayerCache.reorder`)."""
        for layer in self.layers:
            layer.reorder(index)

    def nbytes(self) -> int:
        """Bytes held by the buffers (equal to :func:`~coursekit.multihead.kv_cache_bytes` at ``max_len``)."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.k, layer.v))


# --------------------------------------------------------------------------- the model


def causal_self_attention(
    attn: MultiHeadAttention, x: torch.Tensor, cache: LayerCache | None = None
) -> torch.Tensor:
    """Causal self-attention of ``x`` with ``attn``'s weights, optionally extending a KV cache.

    The new tokens sit at positions ``P .. P + T - 1`` after the ``P`` cached ones, so new
    token ``i`` may attend to keys ``0 .. P + i``: the causal mask is aligned to the
    bottom right of the ``(T, P + T)`` score matrix.

    Args:
        attn: a Chapter 2 :class:`~coursekit.multihead.MultiHeadAttention` (its ``qkv_proj``
            and ``out_proj`` are used; its ``dropout`` applies in training mode).
        x: the new tokens ``(B, T, C)``.
        cache: this layer's cache; it is extended by the ``T`` new keys and values.

    Returns:
        ``(B, T, C)`` of ``x``'s dtype, equal to ``attn(x_all, is_causal=True)[0]`` at the new positions.
    """
    q, k, v = attn.project(x)  # (B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D)
    if cache is not None:
        k, v = cache.update(k, v)  # (B, H_kv, S, D) with S = P + T
    T, S = q.shape[2], k.shape[2]
    dropout_p = attn.dropout if attn.training else 0.0
    gqa = attn.n_kv_heads != attn.n_heads
    if T == S:  # no cached past: the usual top-left causal mask, the fused kernel's fast path
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa)
    elif T == 1:  # one new token sees every cached key
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, enable_gqa=gqa)
    else:
        mask = causal_mask(T, S, device=x.device)  # (T, S), bottom-right aligned
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)
    return attn.out_proj(merge_heads(out))  # (B, H, T, D) -> (B, T, C)


def padded_self_attention(
    attn: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor, cache: LayerCache | None = None
) -> torch.Tensor:
    """Self-attention of ``x`` under an explicit boolean mask (causality *and* padding), optionally
    extending a KV cache: the attention of :meth:`GPT.forward` when it is given an ``attention_mask``.

    A query that may attend to no key at all (a padding token at the left of its row: it sees only
    earlier padding) gets a zero attention output, so its layer output is ``out_proj``'s bias: finite,
    never NaN, and never read by a real token, since padding keys are masked.

    Args:
        attn: a Chapter 2 :class:`~coursekit.multihead.MultiHeadAttention`.
        x: the new tokens ``(B, T, C)``.
        mask: ``(B, 1, T, S)`` boolean, ``True`` where new token ``i`` may attend to key ``j``, with
            ``S = P + T`` keys: the ``P`` cached ones and the ``T`` new ones.
        cache: this layer's cache holding ``P`` positions; it is extended by the ``T`` new keys and values.

    Returns:
        ``(B, T, C)`` of ``x``'s dtype.

    Raises:
        ValueError: for a mask that is not boolean ``(B, 1, T, S)``.
    """
    q, k, v = attn.project(x)  # (B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D)
    if cache is not None:
        k, v = cache.update(k, v)  # (B, H_kv, S, D) with S = P + T
    B, _, T, _ = q.shape
    S = k.shape[2]
    if mask.dtype != torch.bool or mask.shape != (B, 1, T, S):
        raise ValueError(f"mask must be boolean ({B}, 1, {T}, {S}), got {mask.dtype} {tuple(mask.shape)}")
    sees_a_key = mask.any(dim=-1, keepdim=True)  # (B, 1, T, 1)
    # a query with no visible key would be a softmax over nothing (NaN): let it see every key, then zero it
    safe = mask | ~sees_a_key  # (B, 1, T, S)
    dropout_p = attn.dropout if attn.training else 0.0
    gqa = attn.n_kv_heads != attn.n_heads
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, dropout_p=dropout_p, enable_gqa=gqa)
    out = out.masked_fill(~sees_a_key, 0.0)  # (B, H, T, D)
    return attn.out_proj(merge_heads(out))  # (B, H, T, D) -> (B, T, C)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only: ``cumsum(mask) - 1``, with ``0`` at leading padding.

    Example: ``[[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]] -> [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]``: a row's
    first real token gets position 0 however much padding comes before it. (The value at a padding
    position is never read by a real token; Hugging Face puts 1 there, we put what the cumulative
    count gives, clamped at 0.)

    Args:
        attention_mask: ``(B, S)`` boolean (or 0/1 integers), ``True`` at real tokens.

    Returns:
        ``(B, S)`` ``torch.long``.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # (B, S)


class Block(nn.Module):
    """A pre-norm GPT layer: ``x + attn(norm1(x))``, then ``x + ff(norm2(x))``.

    Submodules: ``norm1``, ``attn``, ``norm2``, ``ff``, ``dropout1``, ``dropout2``.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm1 = FusedLayerNorm(cfg.d_model, cfg.eps, cfg.bias)
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, bias=cfg.bias, dropout=cfg.dropout)
        self.norm2 = FusedLayerNorm(cfg.d_model, cfg.eps, cfg.bias)
        self.ff = feed_forward(cfg.d_model, cfg.d_ff, cfg.activation, dropout=cfg.dropout, bias=cfg.bias)
        self.dropout1 = nn.Dropout(cfg.dropout)
        self.dropout2 = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, cache: LayerCache | None = None, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``(B, T, C) -> (B, T, C)``; ``cache`` as in :func:`causal_self_attention`. With ``attn_mask``
        ``(B, 1, T, S)`` (causality and padding in one boolean mask) the attention is
        :func:`padded_self_attention` instead."""
        h = self.norm1(x)
        if attn_mask is None:
            a = causal_self_attention(self.attn, h, cache)
        else:
            a = padded_self_attention(self.attn, h, attn_mask, cache)
        x = x + self.dropout1(a)
        return x + self.dropout2(self.ff(self.norm2(x)))


class GPT(nn.Module):
    """A GPT language model: embeddings, ``L`` :class:`Block` s, a final norm, tied output layer.

    Initialisation follows GPT-2: weights ``N(0, 0.02)``, the two projections that write
    into the residual stream (``attn.out_proj``, ``ff.linear2``) scaled by ``1 / sqrt(2 L)``
    so the stream's variance does not grow with depth, biases zero, norms one.

    Args:
        cfg: a :class:`GPTConfig` (see :data:`GPT_PRESETS`).

    Submodules: ``tok_emb``, ``pos_emb``, ``drop``, ``blocks``, ``norm``, ``lm_head``
    (whose weight *is* ``tok_emb.weight``).
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"GPT takes a GPTConfig (see GPT_PRESETS), got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = FusedLayerNorm(cfg.d_model, cfg.eps, cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied: one (V, C) matrix embeds and predicts
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith(("attn.out_proj.weight", "ff.linear2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def init_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        """An empty :class:`KVCache` for ``batch_size`` sequences of up to ``max_len`` (default
        ``block_size``) tokens."""
        max_len = self.cfg.block_size if max_len is None else max_len
        if not 1 <= max_len <= self.cfg.block_size:
            raise ValueError(f"max_len must be in [1, block_size={self.cfg.block_size}], got {max_len}")
        p = self.tok_emb.weight
        return KVCache(
            [
                LayerCache(batch_size, b.attn.n_kv_heads, max_len, b.attn.d_head, p.dtype, p.device)
                for b in self.blocks
            ]
        )

    def forward(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits for every position of ``idx``.

        Args:
            idx: token ids ``(B, T)``, ``torch.long``.
            cache: continue after the ``P = cache.length`` cached tokens: ``idx`` gets the
                positions ``P .. P + T - 1`` and the cache grows by ``T``.
            attention_mask: ``(B, P + T)`` boolean (or 0/1 integers), ``True`` at real tokens and
                ``False`` at padding, over the cached positions *and* ``idx`` (as Hugging Face's
                argument). Padding keys are masked out of every attention, and the default positions
                count real tokens only (:func:`positions_from_mask`). A query that sees no real key
                (leading padding, or a row without any real token) gets a zero attention output:
                its logits are finite and meaningless.
            position_ids: ``(B, T)`` ``torch.long`` positions of ``idx``'s tokens, each in
                ``[0, block_size)``; default ``P .. P + T - 1``, or from ``attention_mask``.

        Returns:
            ``(B, T, V)``: the logits at position ``t`` score the token at ``t + 1``. With a left-padded
            ``attention_mask``, a row's logits at its real tokens equal (to rounding) those of the same
            tokens without the padding.

        Raises:
            ValueError: for ids that are not ``(B, T)`` ``torch.long``, more than ``block_size``
                cached and new tokens (padding included), a cache of the wrong depth, or an
                ``attention_mask`` or ``position_ids`` of the wrong shape, dtype or range.
        """
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be (B, T) torch.long token ids, got {idx.dtype} {tuple(idx.shape)}")
        B, T = idx.shape
        start = 0 if cache is None else cache.length
        if start + T > self.cfg.block_size:
            raise ValueError(
                f"{start} cached + {T} new tokens exceed block_size={self.cfg.block_size}: "
                "crop the context (or decode without the cache)"
            )
        if cache is not None and len(cache.layers) != len(self.blocks):
            raise ValueError(
                f"the cache has {len(cache.layers)} layers, the model {len(self.blocks)}: use model.init_cache"
            )
        if attention_mask is not None:
            attention_mask = self._check_attention_mask(attention_mask, B, start + T)
        if position_ids is not None:
            self._check_position_ids(position_ids, B, T)
            pos = position_ids  # (B, T)
        elif attention_mask is not None:
            pos = positions_from_mask(attention_mask)[:, start:]  # (B, T): real tokens only are counted
        else:
            pos = torch.arange(start, start + T, device=idx.device)  # (T,), offset by the cached length
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C)
        mask = None
        if attention_mask is not None:  # causal (bottom-right, after P cached keys) and no padding key
            causal = causal_mask(T, start + T, device=idx.device)  # (T, S)
            mask = (causal[None] & attention_mask[:, None, :])[:, None]  # (B, 1, T, S)
        for i, block in enumerate(self.blocks):
            x = block(x, None if cache is None else cache.layers[i], mask)
        return self.lm_head(self.norm(x))  # (B, T, V)

    @staticmethod
    def _check_attention_mask(mask: torch.Tensor, B: int, S: int) -> torch.Tensor:
        if mask.shape != (B, S) or mask.dtype.is_floating_point or mask.is_complex():
            raise ValueError(
                f"attention_mask must be boolean or 0/1 integers of shape (B, cached + new) = ({B}, {S}), "
                f"got {mask.dtype} {tuple(mask.shape)}"
            )
        if mask.dtype != torch.bool:
            if ((mask != 0) & (mask != 1)).any():
                raise ValueError("an integer attention_mask must hold only 0 (padding) and 1 (real token)")
            mask = mask.bool()
        return mask

    def _check_position_ids(self, pos: torch.Tensor, B: int, T: int) -> None:
        if pos.shape != (B, T) or pos.dtype != torch.long:
            raise ValueError(
                f"position_ids must be ({B}, {T}) torch.long, got {pos.dtype} {tuple(pos.shape)}"
            )
        if pos.numel() and (pos.min() < 0 or pos.max() >= self.cfg.block_size):
            raise ValueError(
                f"position_ids must be in [0, block_size={self.cfg.block_size}), "
                f"got {int(pos.min())} .. {int(pos.max())}"
            )


def causal_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits`` for the sequence ``input_ids`` itself.

    The logits at position ``t`` predict token ``t + 1``: drop the last position's logits
    and the first token, then compare (the "shift" of Hugging Face's ``labels=input_ids``).
    Example: for tokens ``[a, b, c]`` the pairs are ``(logits_0, b)`` and ``(logits_1, c)``.

    Args:
        logits: ``(B, T, V)`` from ``model(input_ids)``.
        input_ids: ``(B, T)``; positions equal to ``ignore_index`` are not scored.
        ignore_index: the target that is not scored (``-100``, or a padding id such as ``0``).

    Returns:
        A scalar tensor of ``logits``' dtype: the mean over the scored positions (targets ``1 .. T-1``
        not equal to ``ignore_index``). Stable for large logits; the inputs are not changed.

    Raises:
        ValueError: unless ``logits`` is ``(B, T, V)`` and ``input_ids`` ``(B, T)`` with ``T >= 2``.
    """
    if logits.dim() != 3 or input_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, T, V) and input_ids (B, T), got {tuple(logits.shape)} and {tuple(input_ids.shape)}"
        )
    if logits.shape[1] < 2:
        raise ValueError("a sequence needs at least 2 tokens to have a next-token target")
    pred = logits[:, :-1]  # (B, T-1, V): positions 0 .. T-2
    target = input_ids[:, 1:]  # (B, T-1): tokens 1 .. T-1
    return F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), ignore_index=ignore_index)


@torch.no_grad()
def bits_per_char(model: nn.Module, ids: torch.Tensor, block_size: int) -> float:
    """Measure a character-level language model's loss on a text, in bits per character.

    Cuts ``ids`` into consecutive windows of ``block_size + 1`` tokens that overlap by one
    (starting at ``0, block_size, 2 block_size, ...``; the last one may be shorter), so that
    every token but the first is predicted exactly once, from the tokens before it in its
    window. Sums the next-token cross-entropy (nats) over all ``len(ids) - 1`` predictions,
    divides by their number and converts to bits (divides by ``ln 2``). With one character
    per token this is bits per character; ``2 ** bits`` is the perplexity.

    Args:
        model: a language model called as ``model(idx)`` with ``idx`` ``(1, t)``, ``t <= block_size``,
            returning logits ``(1, t, V)``; used as it is (put it in eval mode first).
        ids: ``(N,)`` ``torch.long`` token ids of the text, ``N >= 2``.
        block_size: the longest context the model takes, at least 1.

    Returns:
        The mean loss in bits per token, a Python ``float``.

    Raises:
        ValueError: ``ids`` is not 1-D with at least 2 tokens, or ``block_size < 1``.

    Example:
        ``bits_per_char(model, ids, 128)`` for the chapter's ``gpt-char`` on held-out text is about
        1.7 (1.2 nats per character; perplexity about 3.3).
    """
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens, got shape {tuple(ids.shape)}")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    total = 0.0
    for start in range(0, ids.numel() - 1, block_size):
        window = ids[start : start + block_size + 1]  # (t + 1,)
        logits = model(window[None, :-1])  # (1, t, V): position i predicts window[i + 1]
        total += F.cross_entropy(logits[0].double(), window[1:], reduction="sum").item()
    return total / (ids.numel() - 1) / math.log(2)


def perplexity(model: nn.Module, ids: torch.Tensor, block_size: int) -> float:
    """A language model's perplexity on a text: ``exp(mean loss in nats) = 2 ** bits_per_char``.

    The text is scored exactly as by :func:`bits_per_char` (every token but the first predicted
    once). A perplexity of ``N`` means the model is, on average, as unsure as a uniform choice among
    ``N`` tokens (the geometric mean of ``1 / p(correct token)``): a model that knows nothing about a
    vocabulary of ``V`` tokens scores ``V``, a perfect one ``1``.

    Args:
        model, ids, block_size: as :func:`bits_per_char`.

    Returns:
        The perplexity per token, a Python ``float`` ``>= 1``.

    Raises:
        ValueError: as :func:`bits_per_char`.
    """
    return 2.0 ** bits_per_char(model, ids, block_size)


def unigram_loss(fit_ids: torch.Tensor, ids: torch.Tensor, vocab_size: int, add: float = 1.0) -> float:
    """The loss (nats per token) on ``ids`` of a model that ignores the context: token frequencies.

    The unigram baseline of a language model: ``p(x) = (count(x) + add) / (N + add V)`` with the counts
    taken from ``fit_ids`` (``add`` smooths, so a token that ``fit_ids`` lacks is not impossible).
    Scored on the text it was fitted to with ``add = 0``, this is the entropy of that text's token
    frequencies, the best any context-free model can do there. Example: fitted on ``[0, 0, 1]`` with
    ``add = 0``, the text ``[0, 1]`` scores ``-(ln(2/3) + ln(1/3)) / 2 = 0.752``.

    Args:
        fit_ids: ``(N,)`` token ids the frequencies are counted on, ``torch.long``.
        ids: ``(M,)`` token ids to score, ``M >= 1``, ``torch.long``.
        vocab_size: ``V``; every id must be below it.
        add: the additive (Laplace) smoothing count, ``>= 0``.

    Returns:
        Mean ``-ln p(x)`` over ``ids``, a Python ``float`` (``inf`` if a scored token has probability 0).

    Raises:
        ValueError: for ids that are not 1-D ``torch.long`` in ``[0, vocab_size)``, an empty ``ids``, or
        ``add < 0`` (or ``add = 0`` with an empty ``fit_ids``).
    """
    for name, t in (("fit_ids", fit_ids), ("ids", ids)):
        if t.dim() != 1 or t.dtype != torch.long:
            raise ValueError(f"{name} must be 1-D torch.long token ids, got {t.dtype} {tuple(t.shape)}")
        if t.numel() and (t.min() < 0 or t.max() >= vocab_size):
            raise ValueError(
                f"{name} must lie in [0, vocab_size={vocab_size}), got {int(t.min())} .. {int(t.max())}"
            )
    if ids.numel() == 0:
        raise ValueError("ids must hold at least one token to score")
    if not add >= 0 or (add == 0 and fit_ids.numel() == 0):
        raise ValueError(f"add must be >= 0 (and > 0 when fit_ids is empty), got {add}")
    counts = torch.bincount(fit_ids, minlength=vocab_size).double() + add  # (V,)
    logp = counts.log() - counts.sum().log()  # (V,)
    return -logp[ids].mean().item()


# --------------------------------------------------------------------------- packing and preferences


def document_ids(ids: torch.Tensor, eot_id: int) -> torch.Tensor:
    """The document of every token of packed text whose documents each end with ``eot_id``.

    Pretraining concatenates documents, each followed by an end-of-text token, and cuts the stream
    into windows; a token's document is the number of end-of-text tokens *before* it, so the
    end-of-text token belongs to the document it closes. Example (``E`` = ``eot_id``):
    ``[a, b, E, c, E, d] -> [0, 0, 0, 1, 1, 2]``.

    Args:
        ids: ``(..., T)`` integer token ids (``(T,)`` or ``(B, T)``).
        eot_id: the end-of-text token.

    Returns:
        ``(..., T)`` ``torch.long``, non-decreasing along the last axis, starting at 0 in every row.

    Raises:
        ValueError: for ids that are not an integer tensor with at least one axis.
    """
    if ids.dim() == 0 or ids.dtype.is_floating_point or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be integer token ids (..., T), got {ids.dtype} {tuple(ids.shape)}")
    ends = (ids == eot_id).long()  # (..., T)
    return ends.cumsum(dim=-1) - ends  # (..., T): end-of-text tokens strictly before each token


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """The causal mask of packed documents: each token sees earlier tokens of its own document only.

    Query ``i`` may attend to key ``j`` when ``j <= i`` and both are in the same document, so the
    mask is block diagonal, one causal block per document; with a single document it is
    :func:`~coursekit.attention.causal_mask`. Example: ``[0, 0, 1] -> [[1, 0, 0], [1, 1, 0],
    [0, 0, 1]]`` (as booleans). For ``scaled_dot_product_attention`` over ``(B, H, T, S)`` scores,
    add a head axis: ``mask[:, None]``.

    Args:
        doc_ids: ``(..., T)`` integer document ids (``(T,)`` or ``(B, T)``), non-decreasing along
            the last axis: each document is one contiguous run (see :func:`document_ids`).

    Returns:
        ``(..., T, T)`` boolean, ``True`` where query ``i`` may attend to key ``j``. Every query sees
        at least itself, so no row is fully masked.

    Raises:
        ValueError: for ids that are not an integer tensor with at least one axis, or that decrease
            along the last axis (a document split in two runs).
    """
    if (
        doc_ids.dim() == 0
        or doc_ids.dtype.is_floating_point
        or doc_ids.is_complex()
        or doc_ids.dtype == torch.bool
    ):
        raise ValueError(f"doc_ids must be integer ids (..., T), got {doc_ids.dtype} {tuple(doc_ids.shape)}")
    if (doc_ids[..., 1:] < doc_ids[..., :-1]).any():
        raise ValueError(
            "doc_ids must be non-decreasing along the last axis: one contiguous run per document"
        )
    T = doc_ids.shape[-1]
    same = doc_ids[..., :, None] == doc_ids[..., None, :]  # (..., T, T): query i and key j in one document
    return same & causal_mask(T, device=doc_ids.device)  # (..., T, T)


def sequence_log_prob(model: nn.Module, ids: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """``log pi(answer | prompt)`` of each row: the log-probabilities of the answer's tokens, summed.

    Each row of ``ids`` is a prompt followed by its answer (and possibly right padding, which a causal
    model cannot see from earlier positions). Token ``t`` of the answer is scored by the logits at
    position ``t - 1``, that is given everything before it; tokens outside ``answer_mask`` (the
    prompt, the padding) are not scored. Example: for ``ids = [p, q, a, b]`` with the mask on ``a, b``,
    the result is ``log p(a | p q) + log p(b | p q a)``.

    Args:
        model: called as ``model(ids)``, returning logits ``(B, T, V)``; the logits at position ``t``
            score token ``t + 1``. Gradients flow (wrap the call in ``torch.no_grad()`` for a frozen
            reference model).
        ids: ``(B, T)`` ``torch.long``, ``T >= 2``.
        answer_mask: ``(B, T)`` boolean, ``True`` at the answer's tokens; ``False`` at position 0 (no
            logits predict it) and at least one ``True`` per row.

    Returns:
        ``(B,)`` of the logits' dtype: each row's summed log-probability (at most 0).

    Raises:
        ValueError: for ids that are not ``(B, T)`` ``torch.long`` with ``T >= 2``, a mask that is not
            boolean of the same shape, a mask that marks position 0 or no token of a row, or logits
            that are not ``(B, T, V)``.
    """
    if ids.dim() != 2 or ids.dtype != torch.long or ids.shape[1] < 2:
        raise ValueError(f"ids must be (B, T) torch.long with T >= 2, got {ids.dtype} {tuple(ids.shape)}")
    if answer_mask.dtype != torch.bool or answer_mask.shape != ids.shape:
        raise ValueError(
            f"answer_mask must be boolean of the ids' shape {tuple(ids.shape)}, "
            f"got {answer_mask.dtype} {tuple(answer_mask.shape)}"
        )
    if answer_mask[:, 0].any():
        raise ValueError(
            "answer_mask marks position 0, which no logits predict: an answer needs a prompt before it"
        )
    if not answer_mask.any(dim=1).all():
        raise ValueError("every row of answer_mask must mark at least one answer token")
    logits = model(ids)  # (B, T, V)
    if logits.dim() != 3 or logits.shape[:2] != ids.shape:
        raise ValueError(
            f"model(ids) must return logits (B, T, V) for ids {tuple(ids.shape)}, got {tuple(logits.shape)}"
        )
    logp = F.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V): position t scores token t + 1
    token_logp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1): log p(token t+1 | tokens <= t)
    scored = torch.where(answer_mask[:, 1:], token_logp, torch.zeros_like(token_logp))  # (B, T-1)
    return scored.sum(dim=-1)  # (B,)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The direct preference optimization loss (Rafailov et al., 2023) of a batch of preference pairs.

    Each argument holds one summed log-probability per pair (:func:`sequence_log_prob`): of the
    chosen answer ``y_w`` or the rejected one ``y_l``, under the model being tuned (the policy) or the
    frozen reference. The implicit reward of an answer is ``beta (log pi(y|x) - log pi_ref(y|x))``, and
    the loss is ``-log sigmoid(r_w - r_l)``, averaged over the pairs: the Bradley-Terry negative
    log-likelihood that the chosen answer wins. When the policy is the reference both rewards are 0 and
    the loss is ``log 2``.

    Args:
        policy_chosen, policy_rejected: ``(B,)`` floating, with gradients to the policy.
        ref_chosen, ref_rejected: ``(B,)`` of the same dtype, from the reference (no gradient needed).
        beta: ``> 0``, the strength of the pull towards the reference: the smaller, the farther the
            policy may move from it.

    Returns:
        ``(loss, chosen_reward, rejected_reward)``: the mean loss, a scalar tensor, and the implicit
        rewards ``(B,)`` each, detached (for logging).

    Raises:
        ValueError: for arguments that are not four 1-D floating tensors of one shape and dtype with
            ``B >= 1``, or a ``beta`` that is not a finite positive number.
    """
    args = dict(
        policy_chosen=policy_chosen,
        policy_rejected=policy_rejected,
        ref_chosen=ref_chosen,
        ref_rejected=ref_rejected,
    )
    shapes = {name: (t.dtype, tuple(t.shape)) for name, t in args.items()}
    if (
        len(set(shapes.values())) != 1
        or policy_chosen.dim() != 1
        or policy_chosen.numel() == 0
        or not policy_chosen.dtype.is_floating_point
    ):
        raise ValueError(
            f"expected four 1-D floating (B,) tensors of one shape and dtype, B >= 1; got {shapes}"
        )
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < math.inf:
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    chosen_reward = beta * (policy_chosen - ref_chosen)  # (B,)
    rejected_reward = beta * (policy_rejected - ref_rejected)  # (B,)
    loss = -F.logsigmoid(chosen_reward - rejected_reward).mean()
    return loss, chosen_reward.detach(), rejected_reward.detach()


# --------------------------------------------------------------------------- Hugging Face GPT-2

#: Our parameter name -> GPT-2's, per layer (``blocks.{i}.`` <-> ``transformer.h.{i}.``).
_LAYER_NAMES = {
    "norm1": "ln_1",
    "attn.qkv_proj": "attn.c_attn",
    "attn.out_proj": "attn.c_proj",
    "norm2": "ln_2",
    "ff.linear1": "mlp.c_fc",
    "ff.linear2": "mlp.c_proj",
}
_TOP_NAMES = {
    "tok_emb.weight": "transformer.wte.weight",
    "pos_emb.weight": "transformer.wpe.weight",
    "norm.weight": "transformer.ln_f.weight",
    "norm.bias": "transformer.ln_f.bias",
}
#: GPT-2's Conv1D layers store ``weight`` as ``(in, out)``: these are transposed both ways.
_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
#: Buffers some GPT-2 checkpoints carry (the causal mask); they hold no weights.
_HF_BUFFERS = (".attn.bias", ".attn.masked_bias")


def _is_conv1d_weight(hf_name: str) -> bool:
    """``transformer.h.{i}.attn.c_attn.weight`` and the other Conv1D weights."""
    parts = hf_name.split(".")  # transformer, h, i, module..., leaf
    return parts[:2] == ["transformer", "h"] and parts[-1] == "weight" and ".".join(parts[3:-1]) in _CONV1D


def _ours_to_hf_name(name: str) -> str:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    _, i, rest = name.split(".", 2)  # blocks.{i}.{module}.{weight|bias}
    module, leaf = rest.rsplit(".", 1)
    if module not in _LAYER_NAMES:
        raise KeyError(f"no GPT-2 name for our parameter {name!r}")
    return f"transformer.h.{i}.{_LAYER_NAMES[module]}.{leaf}"


def to_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our :class:`GPT` state dict as ``GPT2LMHeadModel``'s (Conv1D weights transposed).

    ``lm_head.weight`` is included (equal to ``transformer.wte.weight``: tied).
    Example: ``blocks.0.attn.qkv_proj.weight (3C, C) -> transformer.h.0.attn.c_attn.weight (C, 3C)``.
    """
    out = {}
    for name, value in state_dict.items():
        if name == "lm_head.weight":
            continue
        hf = _ours_to_hf_name(name)
        out[hf] = value.t() if _is_conv1d_weight(hf) else value
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def from_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``GPT2LMHeadModel`` state dict as ours: the inverse of :func:`to_hf_state_dict`.

    Mask buffers (``attn.bias``, ``attn.masked_bias``) are dropped; ``lm_head.weight``
    must equal the token embedding (GPT-2 ties them), else it is an error.

    Raises:
        KeyError: a name that is not part of GPT-2 (with the name).
        ValueError: an untied ``lm_head.weight``.
    """
    hf_to_ours = {}
    n_layers = 1 + max(
        (int(k.split(".")[2]) for k in state_dict if k.startswith("transformer.h.")), default=-1
    )
    for ours, hf in _TOP_NAMES.items():
        hf_to_ours[hf] = ours
    for i in range(n_layers):
        for ours, hf in _LAYER_NAMES.items():
            for leaf in ("weight", "bias"):
                hf_to_ours[f"transformer.h.{i}.{hf}.{leaf}"] = f"blocks.{i}.{ours}.{leaf}"
    out = {}
    for name, value in state_dict.items():
        if name.endswith(_HF_BUFFERS):
            continue
        if name == "lm_head.weight":
            wte = state_dict.get("transformer.wte.weight")
            if wte is None or not torch.equal(value, wte):
                raise ValueError(
                    "lm_head.weight differs from transformer.wte.weight: our GPT ties them, as GPT-2 does"
                )
            continue
        if name not in hf_to_ours:
            raise KeyError(f"{name!r} is not a GPT2LMHeadModel parameter this mapping knows")
        out[hf_to_ours[name]] = value.t() if _is_conv1d_weight(name) else value
    out["lm_head.weight"] = out["tok_emb.weight"]
    return out


def config_from_hf(hf_config) -> GPTConfig:
    """The :class:`GPTConfig` of a ``transformers.GPT2Config`` (tanh GELU, as ``gelu_new``)."""
    acts = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    if hf_config.activation_function not in acts:
        raise ValueError(
            f"unsupported GPT-2 activation {hf_config.activation_function!r}; expected one of {sorted(acts)}"
        )
    return GPTConfig(
        vocab_size=hf_config.vocab_size,
        block_size=hf_config.n_positions,
        n_layers=hf_config.n_layer,
        n_heads=hf_config.n_head,
        d_model=hf_config.n_embd,
        d_ff=hf_config.n_inner,
        activation=acts[hf_config.activation_function],
        eps=hf_config.layer_norm_epsilon,
    )


def hf_config_kwargs(cfg: GPTConfig) -> dict:
    """Keyword arguments of ``transformers.GPT2Config`` for the same model (dropout off)."""
    return dict(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_embd=cfg.d_model,
        n_inner=cfg.d_ff,
        layer_norm_epsilon=cfg.eps,
        activation_function="gelu_new" if cfg.activation == "gelu_tanh" else "gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )

"""Chapter 4: transformer layers, stacks, parameter counts and a mixture-of-experts feed-forward.

A transformer layer is two (encoder) or three (decoder) *sub-layers*, each wrapped in a
residual connection and a layer normalisation (Vaswani et al., 2017):

- **post-norm** (``norm_first=False``, the original paper): ``x = norm(x + dropout(sublayer(x)))``;
- **pre-norm** (``norm_first=True``, GPT-2 and most models since; analysed by Xiong et al., 2020):
  ``x = x + dropout(sublayer(norm(x)))``, and a pre-norm *stack* ends with one final norm.

Dropout sits where Vaswani et al. (2017, section 5.4) put it, on each sub-layer's output
before the residual add, plus the two places their code (and ``torch.nn``) also uses: on the
attention weights (inside :class:`~coursekit.multihead.MultiHeadAttention`) and on the
feed-forward's hidden activations. The layers compute exactly what
``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer`` compute with
``batch_first=True``; :func:`from_torch_state_dict` maps their weights onto ours.

Masks follow the course convention: boolean ``True`` = may attend, and ``key_padding_mask``
is ``(B, S)`` with ``True`` at real tokens (the opposite of torch's argument).

**Choices by name.** Later chapters pick their activation and norm from two tables instead of
patching modules after construction: :data:`ACTIVATIONS` (``"relu"``, ``"gelu"``, GPT-2's
``"gelu_tanh"``) for :func:`feed_forward`, and :data:`NORMS` (``"layer_norm"``, and
``"fused"``: the same norm computed by torch's kernel, :class:`FusedLayerNorm`) for the
``norm`` argument of :class:`Encoder` and :class:`Decoder`. :class:`FeedForward`,
:class:`LayerNorm`, :class:`EncoderLayer` and :class:`DecoderLayer` are the Chapter 4 exercise
as its text specifies it (ReLU or exact GELU, Chapter 4's own norm), so the tables sit beside
them rather than inside them.

**Llama's choices.** :class:`RMSNorm` (layer norm without the mean, Zhang and Sennrich, 2019)
and :class:`SwiGLU` (a gated feed-forward, Shazeer, 2020) are the norm and feed-forward of Llama
(Touvron et al., 2023), Mistral and Mixtral; :func:`llama_ffn_hidden` is Llama's rule for the
SwiGLU's hidden width. They stand apart from the tables above, whose entries share
:class:`LayerNorm`'s and :class:`FeedForward`'s parameters.

Over 500 lines: Chapter 4's four graded classes with their teaching docstrings, the stacks and the
norm and activation tables later chapters select from, and the parameter counts the appendix checks
them against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.attention import softmax
from coursekit.multihead import MultiHeadAttention

__all__ = [
    "LayerNorm",
    "FeedForward",
    "FusedLayerNorm",
    "ACTIVATIONS",
    "NORMS",
    "feed_forward",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "MoEFeedForward",
    "from_torch_state_dict",
    "to_torch_state_dict",
    "count_params",
    "layer_norm_params",
    "attention_params",
    "feedforward_params",
    "encoder_layer_params",
    "decoder_layer_params",
    "moe_feedforward_params",
    "gpt_params",
    "approx_gpt_params",
    "GPTShape",
    "GPT2_SHAPES",
    "input_gradient_norm",
    "RMSNorm",
    "SwiGLU",
    "LLAMA_MLP_TO_OURS",
    "llama_ffn_hidden",
    "swiglu_params",
]

# --------------------------------------------------------------------------- building blocks


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al., 2016) over the last (feature) axis.

    Each token is normalised on its own: ``y = (x - mean) / sqrt(var + eps) * weight + bias``,
    with the mean and the *biased* variance (divide by ``C``, not ``C - 1``) of its ``C``
    features. Nothing depends on the other tokens or the batch, so training and
    evaluation compute the same thing (unlike batch normalisation).

    Args:
        d_model: number of features ``C``.
        eps: added to the variance inside the square root.
        bias: whether to learn the shift ``bias`` (the scale ``weight`` is always learnt).

    Parameters: ``weight`` (ones) and ``bias`` (zeros), each ``(C,)``, named as in
    ``nn.LayerNorm``; with ``bias=False`` there is no ``bias`` parameter (``self.bias`` is None).
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` of shape ``(..., C)`` (any number of leading dimensions).

        The variance is the mean of the squared deviations from the mean: it stays accurate when
        the features share a large offset (say ``1e4`` plus noise in float32), where
        ``E[x^2] - E[x]^2`` loses every digit.

        Returns:
            A new tensor of the shape and dtype of ``x``.

        Raises:
            ValueError: if the last axis of ``x`` is not ``C``.
        """
        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected x of shape (..., {self.d_model}), got {tuple(x.shape)}")
        mean = x.mean(dim=-1, keepdim=True)  # (..., 1)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # (..., 1), biased: divide by C
        y = (x - mean) / torch.sqrt(var + self.eps) * self.weight  # (..., C)
        return y if self.bias is None else y + self.bias


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``linear2(dropout(act(linear1(x))))``.

    The same two-layer MLP is applied to every position separately (it never mixes
    tokens). ``act`` is ReLU or the *exact* GELU ``x * Phi(x)`` of Hendrycks & Gimpel (2016),
    as torch's ``"gelu"`` (not the tanh approximation of GPT-2's code).

    Args:
        d_model: model width ``C``.
        d_ff: hidden width; defaults to ``4 * C`` as in Vaswani et al. (2017).
        activation: ``"relu"`` or ``"gelu"``.
        dropout: probability of zeroing a hidden activation in training mode.
        bias: whether the two linear layers have biases.

    Submodules: ``linear1`` (``C -> d_ff``), ``linear2`` (``d_ff -> C``) and ``dropout``
    (``nn.Dropout(dropout)``, applied as ``self.dropout(act(linear1(x)))``).

    Raises:
        ValueError: if ``activation`` is neither ``"relu"`` nor ``"gelu"``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        activation: str = "relu",
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.act = nn.ReLU() if activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., C) -> (..., C)`` for any number of leading dimensions, through a hidden ``(..., d_ff)``."""
        h = self.act(self.linear1(x))  # (..., d_ff)
        return self.linear2(self.dropout(h))  # (..., C)


# --------------------------------------------------------------------------- choices by name


class FusedLayerNorm(LayerNorm):
    """:class:`LayerNorm` (same parameters, same result to rounding) computed by torch's fused kernel.

    One operation instead of eight, which matters for small tensors and at every decoding step.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)


#: Activation name -> a constructor of the module: the exact GELU ``x * Phi(x)`` is ``"gelu"``;
#: ``"gelu_tanh"`` is the tanh approximation GPT-2 was trained with (Hugging Face's ``"gelu_new"``).
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": partial(nn.GELU, approximate="tanh"),
}

#: Norm name -> class, each called as ``cls(d_model, eps, bias)`` with :class:`LayerNorm`'s parameters.
NORMS: dict[str, type[LayerNorm]] = {
    "layer_norm": LayerNorm,
    "fused": FusedLayerNorm,
}


def _check_choice(kind: str, name: str, table: dict) -> None:
    if name not in table:
        raise ValueError(f"{kind} must be one of {sorted(table)}, got {name!r}")


def feed_forward(
    d_model: int, d_ff: int | None = None, activation: str = "relu", dropout: float = 0.0, bias: bool = True
) -> FeedForward:
    """A :class:`FeedForward` whose activation is any name of :data:`ACTIVATIONS`.

    ``FeedForward`` itself (the Chapter 4 exercise) takes ``"relu"`` and ``"gelu"``; this
    builds one and sets its ``act`` from the table, so ``"gelu_tanh"`` gives GPT-2's MLP.
    The module and its parameters are otherwise exactly ``FeedForward``'s.

    Raises:
        ValueError: ``activation`` is not a key of :data:`ACTIVATIONS`.
    """
    _check_choice("activation", activation, ACTIVATIONS)
    ff = FeedForward(d_model, d_ff, "relu", dropout=dropout, bias=bias)
    ff.act = ACTIVATIONS[activation]()
    return ff


# --------------------------------------------------------------------------- layers


class EncoderLayer(nn.Module):
    """Transformer encoder layer: self-attention and a feed-forward, each with a residual.

    Post-norm (``norm_first=False``, Vaswani et al., 2017)::

        x = norm1(x + dropout1(self_attn(x)))
        x = norm2(x + dropout2(ff(x)))

    Pre-norm (``norm_first=True``; used by GPT-2, analysed by Xiong et al., 2020)::

        x = x + dropout1(self_attn(norm1(x)))
        x = x + dropout2(ff(norm2(x)))

    The same layer with ``is_causal=True`` is a GPT block.

    Args:
        d_model: model width ``C``.
        n_heads: attention heads ``H``; must divide ``C``.
        d_ff: feed-forward hidden width (default ``4 C``).
        dropout: the probability of every dropout: ``dropout1`` and ``dropout2`` on the
            sub-layer outputs, ``self_attn``'s on the attention weights and ``ff.dropout`` on
            the feed-forward's hidden activations.
        activation: ``"relu"`` or ``"gelu"``.
        norm_first: pre-norm if True, post-norm if False.
        eps: the layer norms' epsilon.
        bias: biases in the projections, the feed-forward and the layer norms.

    Submodules: ``self_attn``, ``ff``, ``norm1``, ``norm2``, ``dropout1``, ``dropout2``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = LayerNorm(d_model, eps, bias)
        self.norm2 = LayerNorm(d_model, eps, bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Apply the layer.

        Args:
            x: ``(B, T, C)``.
            mask: boolean (``True`` = may attend) or additive floats, broadcastable to ``(B, H, T, T)``.
            key_padding_mask: ``(B, T)`` boolean, ``True`` at real tokens.
            is_causal: each position attends only to itself and earlier positions.

        Returns:
            ``(B, T, C)``.
        """

        def attend(h):
            return self.self_attn(h, mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)[0]

        if self.norm_first:
            x = x + self.dropout1(attend(self.norm1(x)))
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout1(attend(x)))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x


class DecoderLayer(nn.Module):
    """Transformer decoder layer: masked self-attention, cross-attention, feed-forward.

    Post-norm (``norm_first=False``)::

        x = norm1(x + dropout1(self_attn(x)))            # causal by default
        x = norm2(x + dropout2(cross_attn(x, memory)))   # queries from x, keys/values from memory
        x = norm3(x + dropout3(ff(x)))

    Pre-norm (``norm_first=True``) normalises each sub-layer's input instead,
    ``x = x + dropout(sublayer(norm(x)))``; ``memory`` is used as it comes (a pre-norm
    encoder stack has already normalised it).

    Args: as :class:`EncoderLayer`; ``dropout`` also reaches ``cross_attn`` and ``dropout3``.

    Submodules: ``self_attn``, ``cross_attn``, ``ff``, ``norm1``, ``norm2``, ``norm3``,
    ``dropout1``, ``dropout2``, ``dropout3``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, activation, dropout=dropout, bias=bias)
        self.norm1 = LayerNorm(d_model, eps, bias)
        self.norm2 = LayerNorm(d_model, eps, bias)
        self.norm3 = LayerNorm(d_model, eps, bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = True,
    ) -> torch.Tensor:
        """Apply the layer.

        Args:
            x: the decoder's sequence ``(B, T, C)``.
            memory: the encoder's output ``(B, S, C)``.
            mask: extra self-attention mask (boolean, ``True`` = may attend, or additive floats),
                broadcastable to ``(B, H, T, T)``; combined with the causal mask.
            key_padding_mask: ``(B, T)`` boolean, ``True`` at real decoder tokens.
            memory_mask: cross-attention mask (boolean or additive), broadcastable to ``(B, H, T, S)``.
            memory_key_padding_mask: ``(B, S)`` boolean, ``True`` at real encoder tokens.
            is_causal: causal self-attention (the default: a decoder must not see the future).

        Returns:
            ``(B, T, C)``.
        """

        def self_attend(h):
            return self.self_attn(h, mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)[0]

        def cross_attend(h):
            return self.cross_attn(h, kv=memory, mask=memory_mask, key_padding_mask=memory_key_padding_mask)[
                0
            ]

        if self.norm_first:
            x = x + self.dropout1(self_attend(self.norm1(x)))
            x = x + self.dropout2(cross_attend(self.norm2(x)))
            x = x + self.dropout3(self.ff(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout1(self_attend(x)))
            x = self.norm2(x + self.dropout2(cross_attend(x)))
            x = self.norm3(x + self.dropout3(self.ff(x)))
        return x


# --------------------------------------------------------------------------- stacks


class _Stack(nn.Module):
    """``n_layers`` copies of ``layer_cls`` and, for pre-norm, a final norm; every norm is ``NORMS[norm]``."""

    layer_cls: type[nn.Module]

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        activation: str = "relu",
        norm_first: bool = False,
        eps: float = 1e-5,
        bias: bool = True,
        norm: str = "layer_norm",
    ):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        _check_choice("norm", norm, NORMS)
        self.layers = nn.ModuleList(
            self._layer(d_model, n_heads, d_ff, dropout, activation, norm_first, eps, bias, norm)
            for _ in range(n_layers)
        )
        self.norm = NORMS[norm](d_model, eps, bias) if norm_first else None

    def _layer(self, d_model, n_heads, d_ff, dropout, activation, norm_first, eps, bias, norm):
        layer = self.layer_cls(d_model, n_heads, d_ff, dropout, activation, norm_first, eps, bias)
        if norm != "layer_norm":  # the exercise's layers build LayerNorm; the chosen norm takes its place
            for name, child in layer.named_children():
                if isinstance(child, LayerNorm):
                    setattr(layer, name, NORMS[norm](d_model, eps, bias))
        return layer


class Encoder(_Stack):
    """A stack of ``n_layers`` :class:`EncoderLayer`; pre-norm stacks end with a final norm.

    Without the final norm a pre-norm stack would hand on an un-normalised residual
    stream whose scale grows with depth (GPT-2 calls this norm ``ln_f``; torch's
    ``nn.TransformerEncoder`` takes it as ``norm=``). A post-norm stack already ends
    with a norm, its last layer's ``norm2``.

    Args:
        n_layers: number of layers ``L``.
        d_model, n_heads, d_ff, dropout, activation, norm_first, eps, bias: as
            :class:`EncoderLayer`, shared by every layer.
        norm: a key of :data:`NORMS`, the class of every norm in the stack (``"layer_norm"``:
            Chapter 4's :class:`LayerNorm`; ``"fused"``: the same computed by torch's kernel).

    Submodules: ``layers`` (an ``nn.ModuleList``) and ``norm`` (``None`` for post-norm).
    """

    layer_cls = EncoderLayer

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """``(B, T, C) -> (B, T, C)``; the masks as in :meth:`EncoderLayer.forward`."""
        for layer in self.layers:
            x = layer(x, mask=mask, key_padding_mask=key_padding_mask, is_causal=is_causal)
        return x if self.norm is None else self.norm(x)


class Decoder(_Stack):
    """A stack of ``n_layers`` :class:`DecoderLayer` reading the same ``memory``.

    Args: as :class:`Encoder`. Submodules: ``layers`` and ``norm`` (``None`` for post-norm).
    """

    layer_cls = DecoderLayer

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        memory_key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = True,
    ) -> torch.Tensor:
        """``(B, T, C), (B, S, C) -> (B, T, C)``; the masks as in :meth:`DecoderLayer.forward`."""
        for layer in self.layers:
            x = layer(
                x,
                memory,
                mask=mask,
                key_padding_mask=key_padding_mask,
                memory_mask=memory_mask,
                memory_key_padding_mask=memory_key_padding_mask,
                is_causal=is_causal,
            )
        return x if self.norm is None else self.norm(x)


# --------------------------------------------------------------------------- torch weights

#: torch's name -> ours, for one component of a state-dict key (``self_attn.in_proj_weight``
#: becomes ``self_attn.qkv_proj.weight``; ``linear1.bias`` becomes ``ff.linear1.bias``).
TORCH_TO_OURS = {
    "in_proj_weight": "qkv_proj.weight",
    "in_proj_bias": "qkv_proj.bias",
    "multihead_attn": "cross_attn",
    "linear1": "ff.linear1",
    "linear2": "ff.linear2",
}
_OURS_TO_TORCH = {v: k for k, v in TORCH_TO_OURS.items()}


def from_torch_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename the weights of ``nn.TransformerEncoderLayer`` / ``DecoderLayer`` (or of their
    ``nn.TransformerEncoder`` / ``Decoder`` stacks, ``batch_first`` or not) to ours.

    Both store the packed ``[q | k | v]`` projection the same way, so only names change:
    ``self_attn.in_proj_weight -> self_attn.qkv_proj.weight``, ``multihead_attn ->
    cross_attn``, ``linear1/linear2 -> ff.linear1/ff.linear2``; ``norm*``, ``out_proj``
    and ``layers.{i}`` stay.

    Example: ``{"layers.0.linear1.weight": w} -> {"layers.0.ff.linear1.weight": w}``.
    """
    out = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        out[".".join(TORCH_TO_OURS.get(p, p) for p in parts)] = value
    return out


def to_torch_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`from_torch_state_dict`: our names to torch's."""
    out = {}
    for key, value in state_dict.items():
        parts = key.split(".")
        renamed, i = [], 0
        while i < len(parts):
            pair = ".".join(parts[i : i + 2])
            if pair in _OURS_TO_TORCH:
                renamed.append(_OURS_TO_TORCH[pair])
                i += 2
            else:
                renamed.append(_OURS_TO_TORCH.get(parts[i], parts[i]))
                i += 1
        out[".".join(renamed)] = value
    return out


# --------------------------------------------------------------------------- parameter counts


def count_params(module: nn.Module) -> int:
    """Number of parameters of ``module``; a tied (shared) tensor counts once. Works on ``meta``."""
    return sum(p.numel() for p in module.parameters())


def layer_norm_params(d_model: int, bias: bool = True) -> int:
    """``2 C`` (scale and shift), or ``C`` without the shift."""
    return d_model * (2 if bias else 1)


def attention_params(d_model: int, bias: bool = True) -> int:
    """Multi-head attention: ``4 C^2 + 4 C`` (``q, k, v`` and output projections), whatever ``H``."""
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def feedforward_params(d_model: int, d_ff: int | None = None, bias: bool = True) -> int:
    """``2 C d_ff + d_ff + C``; with ``d_ff = 4 C`` that is ``8 C^2 + 5 C``."""
    d_ff = 4 * d_model if d_ff is None else d_ff
    return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)


def encoder_layer_params(d_model: int, d_ff: int | None = None, bias: bool = True) -> int:
    """One encoder (or GPT) layer: attention, feed-forward and two norms; ``12 C^2 + 13 C`` at ``d_ff = 4 C``."""
    return (
        attention_params(d_model, bias)
        + feedforward_params(d_model, d_ff, bias)
        + 2 * layer_norm_params(d_model, bias)
    )


def decoder_layer_params(d_model: int, d_ff: int | None = None, bias: bool = True) -> int:
    """One decoder layer: two attentions, feed-forward, three norms; ``16 C^2 + 19 C`` at ``d_ff = 4 C``."""
    return (
        2 * attention_params(d_model, bias)
        + feedforward_params(d_model, d_ff, bias)
        + 3 * layer_norm_params(d_model, bias)
    )


def moe_feedforward_params(d_model: int, n_experts: int, d_ff: int | None = None, bias: bool = True) -> int:
    """``n_experts`` feed-forwards plus a bias-free router ``C -> n_experts``."""
    return n_experts * feedforward_params(d_model, d_ff, bias) + d_model * n_experts


def gpt_params(
    vocab_size: int, n_positions: int, d_model: int, n_layers: int, d_ff: int | None = None, tied: bool = True
) -> int:
    """Exact parameter count of a GPT-2-style language model.

    Token embedding ``V C``, learned positions ``T_max C``, ``L`` pre-norm layers of
    ``12 C^2 + 13 C`` (at ``d_ff = 4 C``), a final norm ``2 C``, and an output layer that
    reuses the token embedding (``tied=True``, as GPT-2) or adds ``V C`` more.

    Example: ``gpt_params(50257, 1024, 768, 12)`` is 124,439,808, GPT-2 small.
    """
    embeddings = vocab_size * d_model + n_positions * d_model
    head = 0 if tied else vocab_size * d_model
    return embeddings + n_layers * encoder_layer_params(d_model, d_ff) + layer_norm_params(d_model) + head


def approx_gpt_params(vocab_size: int, d_model: int, n_layers: int) -> int:
    """The rule of thumb ``V C + 12 L C^2``: embeddings plus ``4 C^2`` attention and ``8 C^2``
    feed-forward weights per layer; it drops biases, norms and position embeddings."""
    return vocab_size * d_model + 12 * n_layers * d_model * d_model


@dataclass(frozen=True)
class GPTShape:
    """The shape of a GPT-2-style model (keys match :func:`gpt_params` and ``GPT2Config``)."""

    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int = 50257
    n_positions: int = 1024


#: The published GPT-2 family (Radford et al., 2019).
GPT2_SHAPES = {
    "gpt2": GPTShape(n_layers=12, d_model=768, n_heads=12),
    "gpt2-medium": GPTShape(n_layers=24, d_model=1024, n_heads=16),
    "gpt2-large": GPTShape(n_layers=36, d_model=1280, n_heads=20),
    "gpt2-xl": GPTShape(n_layers=48, d_model=1600, n_heads=25),
}


# --------------------------------------------------------------------------- mixture of experts


class MoEFeedForward(nn.Module):
    """A mixture-of-experts feed-forward with top-``k`` routing (Shazeer et al., 2017).

    A bias-free linear *router* scores the ``n_experts`` experts for each token; the
    token goes to the ``k`` best, and its output is the gated sum of their outputs:
    ``y = sum_j gate_j * expert_{e_j}(x)``. Each expert sees only its own tokens
    (dispatch by index), so a token costs ``k`` feed-forwards, not ``n_experts``.

    Gates: with ``normalize=True`` (the default) they are the softmax over the ``k``
    selected logits, as in Shazeer et al. (2017) and Mixtral (Jiang et al., 2024). With
    ``normalize=False`` they are the full softmax probabilities of the selected experts,
    as in the Switch Transformer (Fedus et al., 2022), whose ``k = 1`` would otherwise give
    a constant gate of 1 and no gradient to the router from the output.

    Load balancing (Fedus et al., 2022): ``aux = n_experts * sum_i f_i P_i`` with ``f_i``
    the fraction of the ``N k`` token-to-expert assignments that go to expert ``i`` (not
    differentiable) and ``P_i`` the router's mean probability for expert ``i``. It is 1
    for perfectly uniform routing and grows as the load concentrates. Every token is
    served (no capacity limit, no dropped tokens).

    Args:
        d_model: model width ``C``.
        n_experts: number of experts ``E``.
        k: experts per token, ``1 <= k <= E``.
        d_ff, activation, dropout, bias: of each expert, as :class:`FeedForward`.
        normalize: renormalise the gates over the selected experts (see above).

    Submodules: ``router`` (``C -> E``, no bias) and ``experts`` (an ``nn.ModuleList``).
    """

    def __init__(
        self,
        d_model: int,
        n_experts: int,
        k: int = 2,
        d_ff: int | None = None,
        activation: str = "gelu",
        dropout: float = 0.0,
        bias: bool = True,
        normalize: bool = True,
    ):
        super().__init__()
        if n_experts < 1 or not 1 <= k <= n_experts:
            raise ValueError(f"need 1 <= k <= n_experts, got k={k} and n_experts={n_experts}")
        self.n_experts, self.k, self.normalize = n_experts, k, normalize
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(
            FeedForward(d_model, d_ff, activation, dropout, bias) for _ in range(n_experts)
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Choose the experts of each token.

        Args:
            x: ``(N, C)`` tokens.

        Returns:
            ``(probs, experts, gates)``: the router's softmax ``(N, E)``, the indices of
            the ``k`` chosen experts ``(N, k)`` (best first) and their gates ``(N, k)``.
        """
        logits = self.router(x)  # (N, E)
        probs = softmax(logits, dim=-1)  # (N, E)
        top_logits, experts = logits.topk(self.k, dim=-1)  # (N, k), (N, k)
        gates = softmax(top_logits, dim=-1) if self.normalize else probs.gather(-1, experts)  # (N, k)
        return probs, experts, gates

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Route every token to its ``k`` experts and combine their outputs.

        Args:
            x: ``(B, T, C)``.

        Returns:
            ``(out, aux_loss)``: ``out (B, T, C)`` and the scalar load-balancing loss
            (add ``alpha * aux_loss`` to the training loss; Switch uses ``alpha = 0.01``).
        """
        if x.dim() != 3:
            raise ValueError(f"expected x of shape (B, T, C), got {tuple(x.shape)}")
        B, T, C = x.shape
        flat = x.reshape(B * T, C)  # (N, C)
        probs, experts, gates = self.route(flat)  # (N, E), (N, k), (N, k)
        out = torch.zeros_like(flat)  # (N, C)
        for e, expert in enumerate(self.experts):
            token, slot = (experts == e).nonzero(as_tuple=True)  # (n_e,), (n_e,): who goes to expert e
            if token.numel():
                out = out.index_add(0, token, gates[token, slot, None] * expert(flat[token]))  # (N, C)
        load = (
            torch.bincount(experts.flatten(), minlength=self.n_experts).to(x.dtype) / experts.numel()
        )  # (E,) f_i
        aux_loss = self.n_experts * (load * probs.mean(dim=0)).sum()
        return out.view(B, T, C), aux_loss


def input_gradient_norm(
    n_layers: int, C: int, norm_first: bool, generator: torch.Generator, n_tokens: int = 64
) -> float:
    """Measure how much of the output's gradient reaches the input of a stack of random layers.

    Each of the ``n_layers`` layers has one sub-layer, a random linear map ``W`` (``(C, C)``,
    standard-normal entries divided by ``sqrt(C)``, so that ``W x`` is about as large as ``x``),
    and a layer norm without scale and shift (``eps = 1e-5``), placed either way:

    - post-norm (``norm_first=False``): ``x = norm(x + x W^T)``;
    - pre-norm (``norm_first=True``): ``x = x + norm(x) W^T`` (no final norm).

    The input ``x0`` has ``n_tokens`` standard-normal rows; the loss is ``(x_out * r).sum()``
    for a standard-normal ``r`` of the output's shape, so the gradient at the output is ``r``.
    Everything is float64 and drawn from ``generator`` in this order: ``x0``, then each layer's
    ``W``, then ``r``. The checks hold the result to a band for each placement, stated in the
    exercise's text; the value itself is what the experiment measures.

    Args:
        n_layers: the depth of the stack, at least 1.
        C: the width, at least 2.
        norm_first: pre-norm (``True``) or post-norm (``False``).
        generator: the source of randomness (the same seed gives the same result).
        n_tokens: the number of input rows (tokens), at least 1.

    Returns:
        ``||d loss / d x0|| / ||r||`` (Frobenius norms) as a Python ``float``.

    Example:
        ``input_gradient_norm(24, 256, True, torch.Generator().manual_seed(0))`` returns a
        positive ``float``, and exactly the same one again from a generator seeded the same way.
    """
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (n_layers, C, n_tokens)) or (
        n_layers < 1 or C < 2 or n_tokens < 1
    ):
        raise ValueError(
            f"input_gradient_norm needs integers n_layers >= 1, C >= 2 and n_tokens >= 1, "
            f"got n_layers={n_layers!r}, C={C!r}, n_tokens={n_tokens!r}"
        )

    def norm(x):  # layer norm without scale and shift, over the last axis
        mean = x.mean(dim=-1, keepdim=True)  # (n_tokens, 1)
        return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(dim=-1, keepdim=True) + 1e-5)

    x0 = torch.randn(n_tokens, C, generator=generator, dtype=torch.float64, requires_grad=True)
    x = x0  # (n_tokens, C)
    for _ in range(n_layers):
        W = torch.randn(C, C, generator=generator, dtype=torch.float64) / math.sqrt(C)  # (C, C)
        x = x + norm(x) @ W.T if norm_first else norm(x + x @ W.T)  # (n_tokens, C)
    r = torch.randn(n_tokens, C, generator=generator, dtype=torch.float64)  # (n_tokens, C)
    (grad,) = torch.autograd.grad((x * r).sum(), x0)  # (n_tokens, C)
    return (grad.norm() / r.norm()).item()


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019) over the last (feature) axis.

    Layer norm without the mean: ``y = x / sqrt(mean(x^2) + eps) * weight``, the mean of the
    squares taken over each token's ``C`` features. No centring and no shift, so it is cheaper
    than :class:`LayerNorm`; LLaMA and most recent decoders use it.

    Args:
        d_model: number of features ``C``.
        eps: added to the mean square inside the square root.

    Parameters: ``weight`` (ones), ``(C,)``, as in ``nn.RMSNorm``; there is no ``bias``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` of shape ``(..., C)``; returns a new tensor of its shape and dtype.

        Raises:
            ValueError: if the last axis of ``x`` is not ``C``.
        """
        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected x of shape (..., {self.d_model}), got {tuple(x.shape)}")
        ms = (x * x).mean(dim=-1, keepdim=True)  # (..., 1)
        return x / torch.sqrt(ms + self.eps) * self.weight  # (..., C)


# --------------------------------------------------------------------------- Llama's feed-forward


def llama_ffn_hidden(d_model: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """The hidden width Llama gives its SwiGLU feed-forward (Touvron et al., 2023).

    A SwiGLU feed-forward has three matrices instead of two, so Llama shrinks the hidden width
    from ``4 C`` to ``2/3 * 4 C`` to keep the parameter count of a ``4 C`` MLP; Llama 2 and 3 may
    scale that by ``ffn_dim_multiplier``; the result is rounded *up* to a multiple of
    ``multiple_of`` (for efficient kernels). This is the rule of Meta's reference code::

        hidden = int(2 * 4 * C / 3)
        hidden = int(ffn_dim_multiplier * hidden)            # when given
        hidden = multiple_of * ceil(hidden / multiple_of)

    Examples (the published configurations): ``llama_ffn_hidden(4096) == 11008`` (Llama 7B),
    ``llama_ffn_hidden(5120) == 13824`` (Llama 13B), ``llama_ffn_hidden(4096, 1024, 1.3) ==
    14336`` (Llama 3 8B); ``llama_ffn_hidden(C, multiple_of=1)`` is ``int(8 C / 3)``.

    Args:
        d_model: model width ``C``, at least 1.
        multiple_of: the hidden width is rounded up to a multiple of this, at least 1.
        ffn_dim_multiplier: an extra factor applied before rounding (``None``: none).

    Returns:
        The hidden width ``d_ff``.

    Raises:
        ValueError: if ``d_model`` or ``multiple_of`` is not a positive integer, or
            ``ffn_dim_multiplier`` is not positive.
    """
    for name, value in (("d_model", d_model), ("multiple_of", multiple_of)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if ffn_dim_multiplier is not None and not ffn_dim_multiplier > 0:
        raise ValueError(f"ffn_dim_multiplier must be positive (or None), got {ffn_dim_multiplier!r}")
    hidden = int(2 * 4 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    """The gated feed-forward of Llama, Mistral and Mixtral: ``down(silu(gate(x)) * up(x))``.

    A GLU variant (Shazeer, 2020): two linear maps of ``x`` to the hidden width, one passed
    through the Swish/SiLU activation ``silu(z) = z * sigmoid(z)`` and used as a *gate* that
    multiplies the other element by element, then a linear map back to ``C``. Like
    :class:`FeedForward` it acts on every position on its own.

    With three ``C x d_ff`` matrices instead of two, ``d_ff = 8 C / 3`` costs what a ``4 C`` MLP
    costs (``8 C^2`` weights); Llama's rounding of that width is :func:`llama_ffn_hidden`.

    Args:
        d_model: model width ``C``.
        d_ff: hidden width; defaults to ``int(8 C / 3)`` (``llama_ffn_hidden(C, multiple_of=1)``).
        dropout: probability of zeroing a hidden activation (after the product) in training
            mode; Llama uses none.
        bias: whether the three linear maps have biases (Llama: no).

    Submodules: ``gate`` and ``up`` (``C -> d_ff``), ``down`` (``d_ff -> C``), ``dropout``.
    Hugging Face's ``LlamaMLP`` calls them ``gate_proj``, ``up_proj`` and ``down_proj``
    (:data:`LLAMA_MLP_TO_OURS`).

    Raises:
        ValueError: if ``d_model`` or ``d_ff`` is below 1.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        d_ff = llama_ffn_hidden(d_model, multiple_of=1) if d_ff is None else d_ff
        if d_model < 1 or d_ff < 1:
            raise ValueError(f"SwiGLU needs d_model >= 1 and d_ff >= 1, got d_model={d_model}, d_ff={d_ff}")
        self.d_model, self.d_ff = d_model, d_ff
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., C) -> (..., C)`` for any number of leading dimensions, through a hidden ``(..., d_ff)``.

        Raises:
            ValueError: if the last axis of ``x`` is not ``C``.
        """
        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected x of shape (..., {self.d_model}), got {tuple(x.shape)}")
        h = F.silu(self.gate(x)) * self.up(x)  # (..., d_ff)
        return self.down(self.dropout(h))  # (..., C)


#: Hugging Face ``LlamaMLP`` (also Mistral's and each Mixtral expert's) submodule name -> ours.
LLAMA_MLP_TO_OURS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


def swiglu_params(d_model: int, d_ff: int | None = None, bias: bool = False) -> int:
    """``3 C d_ff`` weights, plus ``2 d_ff + C`` biases with ``bias=True``; ``d_ff`` defaults to ``int(8 C / 3)``."""
    d_ff = llama_ffn_hidden(d_model, multiple_of=1) if d_ff is None else d_ff
    return 3 * d_model * d_ff + ((2 * d_ff + d_model) if bias else 0)

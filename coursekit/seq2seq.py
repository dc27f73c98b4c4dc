"""Chapter 8: an encoder-decoder transformer that translates English number words into German.

The model of Vaswani et al. (2017), pre-norm (as analysed by Xiong et al., 2020), built from Chapter 4:
an :class:`~coursekit.layers.Encoder` reads the source once and hands its output, the
*memory* ``(B, S, C)``, to a stack of :class:`PreNormDecoderLayer` s. Each decoder layer has
three sub-layers: causal self-attention over the target prefix, **cross-attention** whose
queries come from the decoder and whose keys and values come from the memory
(:func:`cross_attention`), and a feed-forward network.

Three masks, kept separate:

- the **source padding mask** ``(B, S)``, ``True`` at real source tokens: the encoder's
  self-attention and every cross-attention ignore padded keys;
- the **causal mask** of the decoder's self-attention: target position ``t`` sees ``0 .. t``;
- no target padding mask is needed: padding sits after EOS, the causal mask keeps every
  real position from seeing it, and the loss ignores padded targets.

Training is teacher forcing: the decoder reads ``shift_right(targets)`` (BOS, then the
targets without their last token) and predicts ``targets`` at every position at once, scored
by :func:`label_smoothed_loss` (Szegedy et al., 2016). Optionally,
:func:`~coursekit.experiments.number_words.scheduled_sampling`
(Bengio et al., 2015; in the two-pass form of Mihaylova & Martins, 2019 for transformers)
replaces some of the true prefix tokens with the model's own predictions.

Decoding reuses Chapter 7: :class:`ConditionalLM` wraps a model and an encoded source as a
language model (``model(idx, cache=cache)``, ``init_cache``, ``reorder``), so
:func:`coursekit.decoding.generate` (greedy) and :func:`coursekit.decoding.beam_search` drive
it. The encoder runs once per source; beams share its memory. The decoder re-reads its
prefix at every step (our targets have at most 12 tokens; a KV cache as in Chapter 7 would
matter for long outputs).

The task of the chapter (English number words to German, ``forty-two`` ->
``zweiundvierzig``), its vocabularies, data, training recipe and scores are in
:mod:`coursekit.experiments.number_words`; this module is the model and its decoding only. The
special token ids :data:`PAD`, :data:`BOS`, :data:`EOS` are the model's conventions, shared
by both vocabularies there.

Translations are scored by :func:`bleu` (Papineni et al., 2002), computed from its definition
with sacrebleu's conventions; chrF is sacrebleu's, in the task's module.

Over 500 lines: Chapter 8's four graded pieces with their docstrings, the encoder-decoder model and
its decoding (greedy and beam) are one model file, with BLEU, the score of its outputs; the
number-word task lives in coursekit.experiments.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import decoding
from coursekit._config import check_transformer_config
from coursekit.attention import scaled_dot_product_attention
from coursekit.layers import DecoderLayer, Encoder, LayerNorm, to_torch_state_dict
from coursekit.multihead import MultiHeadAttention, merge_heads, repeat_kv
from coursekit.positional import sinusoidal_encoding

__all__ = [
    "PAD",
    "BOS",
    "EOS",
    "shift_right",
    "cross_attention",
    "PreNormDecoderLayer",
    "Seq2SeqDecoder",
    "Seq2SeqConfig",
    "SEQ2SEQ_PRESETS",
    "Seq2Seq",
    "to_torch_transformer_state_dict",
    "label_smoothed_loss",
    "ConditionalLM",
    "greedy_decode",
    "beam_decode",
    "length_penalty_score",
    "bleu",
]

#: Special token ids, the same in the source and the target vocabulary.
PAD, BOS, EOS = 0, 1, 2


# --------------------------------------------------------------------------- the four building blocks


def shift_right(labels: torch.Tensor, bos_id: int, pad_id: int) -> torch.Tensor:
    """The decoder's input for teacher forcing: ``bos_id``, then ``labels`` without their last token.

    Position ``t`` of the result holds target ``t - 1``, so the decoder predicts target ``t``
    having seen targets ``0 .. t - 1`` only. A label of ``-100`` (Hugging Face's "not scored")
    is not a token: it becomes ``pad_id``. The labels are not changed.
    Example: ``[[5, 6, EOS, PAD]] -> [[BOS, 5, 6, EOS]]``.

    Args:
        labels: ``(B, T)`` target ids, ``torch.long``, ``T >= 1``.
        bos_id: the start token.
        pad_id: replaces ``-100``.

    Returns:
        ``(B, T)`` ``torch.long``; ``labels`` is not changed.

    Raises:
        ValueError: unless ``labels`` is a 2-D ``torch.long`` tensor with ``T >= 1``.
    """
    if labels.dim() != 2 or labels.shape[1] < 1 or labels.dtype != torch.long:
        raise ValueError(
            f"labels must be (B, T) torch.long with T >= 1, got {labels.dtype} {tuple(labels.shape)}"
        )
    start = labels.new_full((labels.shape[0], 1), bos_id)  # (B, 1)
    shifted = torch.cat([start, labels[:, :-1]], dim=1)  # (B, T)
    return shifted.masked_fill(shifted == -100, pad_id)


def cross_attention(
    attn: MultiHeadAttention,
    x: torch.Tensor,
    memory: torch.Tensor,
    memory_key_padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-head attention from the decoder's ``x`` (queries) to the encoder's ``memory`` (keys, values).

    With ``attn``'s packed weights: ``q = x W_q``, ``k = memory W_k``, ``v = memory W_v``,
    split into heads; ``softmax(q k^T / sqrt(D))`` over the ``S`` memory positions, padded
    ones masked out; the heads' outputs merged and projected by ``attn.out_proj``.
    Dropout on the weights applies in training mode, as in ``attn`` itself.

    Args:
        attn: a Chapter 2 :class:`~coursekit.multihead.MultiHeadAttention`.
        x: the decoder's sequence ``(B, T, C)``.
        memory: the encoder's output ``(B, S, C)``.
        memory_key_padding_mask: ``(B, S)`` boolean, ``True`` at real source tokens.

    Returns:
        ``(out (B, T, C), weights (B, H, T, S))``, ``out`` of ``x``'s dtype; each row of weights sums
        to 1 over the real source tokens (a row with none is all zeros, and its output is ``out_proj``'s
        bias). In training mode the weights are returned after dropout, and ``out`` is computed from them.

    Raises:
        ValueError: if ``memory_key_padding_mask`` is not a boolean ``(B, S)`` tensor.
    """
    if x.dim() != 3 or memory.dim() != 3 or memory.shape[0] != x.shape[0]:
        raise ValueError(
            f"expected x (B, T, C) and memory (B, S, C), got {tuple(x.shape)} and {tuple(memory.shape)}"
        )
    mask = None
    if memory_key_padding_mask is not None:
        B, S = memory.shape[:2]
        if memory_key_padding_mask.dtype != torch.bool or memory_key_padding_mask.shape != (B, S):
            raise ValueError(
                f"memory_key_padding_mask must be a boolean ({B}, {S}) tensor (True = real token), got "
                f"{memory_key_padding_mask.dtype} {tuple(memory_key_padding_mask.shape)}"
            )
        mask = memory_key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
    q, k, v = attn.project(x, memory)  # (B, H, T, D), (B, H_kv, S, D), (B, H_kv, S, D)
    n_rep = attn.n_heads // attn.n_kv_heads
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, D)
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, H, T, D), (B, H, T, S)
    if attn.training and attn.dropout > 0:
        weights = F.dropout(weights, attn.dropout)
        out = weights @ v  # (B, H, T, D)
    return attn.out_proj(merge_heads(out)), weights


class PreNormDecoderLayer(DecoderLayer):
    """Chapter 4's decoder layer, pre-norm, that also returns its cross-attention weights.

    ::

        x = x + dropout1(self_attn(norm1(x)))                 # causal
        c, weights = cross_attention(cross_attn, norm2(x), memory, memory_key_padding_mask)
        x = x + dropout2(c)
        x = x + dropout3(ff(norm3(x)))

    The memory is used as it comes (the encoder stack has normalised it). Parameters,
    their names and the output are those of ``DecoderLayer(..., norm_first=True)`` and of
    ``nn.TransformerDecoderLayer(norm_first=True)`` (tests check both).

    Args:
        d_model, n_heads, d_ff, dropout, activation, eps, bias: as :class:`~coursekit.layers.DecoderLayer`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        activation: str = "relu",
        eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__(d_model, n_heads, d_ff, dropout, activation, norm_first=True, eps=eps, bias=bias)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, memory_key_padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply the layer.

        Args:
            x: the decoder's sequence ``(B, T, C)``.
            memory: the encoder's output ``(B, S, C)``.
            memory_key_padding_mask: ``(B, S)`` boolean, ``True`` at real source tokens.

        Returns:
            ``(out (B, T, C), weights (B, H, T, S))``: the cross-attention weights.
        """
        x = x + self.dropout1(self.self_attn(self.norm1(x), is_causal=True)[0])
        attended, weights = cross_attention(self.cross_attn, self.norm2(x), memory, memory_key_padding_mask)
        x = x + self.dropout2(attended)
        x = x + self.dropout3(self.ff(self.norm3(x)))
        return x, weights


def label_smoothed_loss(
    logits: torch.Tensor, targets: torch.Tensor, smoothing: float = 0.1, pad_id: int = 0
) -> torch.Tensor:
    """Cross-entropy against smoothed targets, averaged over the non-padding positions.

    The target distribution puts ``1 - smoothing`` on the right token and spreads
    ``smoothing`` uniformly over all ``V`` tokens (the right one included), so per position
    ``loss = (1 - smoothing) * (-log p_y) + smoothing * mean_v(-log p_v)`` (Szegedy et al.,
    2016; ``F.cross_entropy(..., label_smoothing=smoothing)`` computes the same).
    Positions whose target is ``pad_id`` count neither in the sum nor in the mean.

    Args:
        logits: ``(..., V)`` with at least one leading axis, e.g. ``(B, T, V)``.
        targets: ``logits.shape[:-1]`` ids, ``torch.long``.
        smoothing: in ``[0, 1]``; 0 is the plain cross-entropy.
        pad_id: the ignored target.

    Returns:
        A scalar tensor of ``logits``' dtype (stable for large logits; the inputs are not changed).

    Raises:
        ValueError: if ``targets`` is not ``logits.shape[:-1]``, or every target is ``pad_id``.
    """
    if logits.dim() < 2 or targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"expected logits (..., V) and targets of the leading shape, "
            f"got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"smoothing must be in [0, 1], got {smoothing}")
    keep = targets != pad_id  # (...)
    if not bool(keep.any()):
        raise ValueError("every target is padding: there is nothing to score")
    logp = F.log_softmax(logits[keep], dim=-1)  # (N, V): the scored positions only
    nll = -logp.gather(-1, targets[keep][:, None]).squeeze(-1)  # (N,)
    uniform = -logp.mean(dim=-1)  # (N,): cross-entropy against the uniform distribution
    return ((1.0 - smoothing) * nll + smoothing * uniform).mean()


# --------------------------------------------------------------------------- the model


class Seq2SeqDecoder(nn.Module):
    """``n_layers`` :class:`PreNormDecoderLayer` s and a final :class:`~coursekit.layers.LayerNorm`.

    Submodules ``layers`` and ``norm``, named as ``nn.TransformerDecoder``'s.
    """

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.1,
        activation: str = "relu",
    ):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(d_model, n_heads, d_ff, dropout, activation) for _ in range(n_layers)
        )
        self.norm = LayerNorm(d_model)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, memory_key_padding_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(B, T, C), (B, S, C) -> (B, T, C)`` and each layer's cross-attention weights ``(B, H, T, S)``."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, memory, memory_key_padding_mask)
            weights.append(w)
        return self.norm(x), weights


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Shape of a :class:`Seq2Seq`; the keys are its constructor's.

    Args:
        src_vocab_size, tgt_vocab_size: ``V`` of each side.
        d_model, n_heads, d_ff, dropout, activation: of every layer (``d_ff=None`` is ``4 C``).
        n_encoder_layers, n_decoder_layers: the two stacks' depths.
        max_len: the longest source or target (sinusoidal positions ``0 .. max_len - 1``).
    """

    src_vocab_size: int = (
        34  # len(coursekit.experiments.number_words.EN_VOCAB), the chapter's task (a test checks)
    )
    tgt_vocab_size: int = 35  # len(coursekit.experiments.number_words.DE_VOCAB)
    d_model: int = 64
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    d_ff: int | None = None
    dropout: float = 0.1
    activation: str = "relu"
    max_len: int = 16

    def __post_init__(self):
        check_transformer_config(
            self,
            (
                "src_vocab_size",
                "tgt_vocab_size",
                "d_model",
                "n_heads",
                "n_encoder_layers",
                "n_decoder_layers",
                "max_len",
            ),
        )
        if self.d_model % 2:
            raise ValueError(
                f"d_model={self.d_model} must be even (sinusoidal positions come in sin/cos pairs)"
            )


#: ``nano`` for tests; ``small`` is the chapter's model.
SEQ2SEQ_PRESETS = {
    "nano": Seq2SeqConfig(
        d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0
    ),
    "small": Seq2SeqConfig(
        d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=256, dropout=0.0
    ),
}


class Seq2Seq(nn.Module):
    """An encoder-decoder transformer: pre-norm Chapter 4 encoder, :class:`Seq2SeqDecoder`, tied output layer.

    Tokens are embedded (``N(0, 1/C)``, scaled by ``sqrt(C)`` as in Vaswani et al., 2017),
    sinusoidal positions are added, and the output layer reuses the target embedding.

    Args:
        cfg: a :class:`Seq2SeqConfig`.

    Submodules: ``src_emb``, ``tgt_emb``, ``drop``, ``encoder`` (:class:`~coursekit.layers.Encoder`),
    ``decoder`` (:class:`Seq2SeqDecoder`), ``lm_head`` (its weight *is* ``tgt_emb.weight``).
    """

    def __init__(self, cfg: Seq2SeqConfig = SEQ2SEQ_PRESETS["small"]):
        super().__init__()
        if not isinstance(cfg, Seq2SeqConfig):
            raise TypeError(f"Seq2Seq takes a Seq2SeqConfig (see SEQ2SEQ_PRESETS), got {type(cfg).__name__}")
        self.cfg = cfg
        C = cfg.d_model
        self.src_emb = nn.Embedding(cfg.src_vocab_size, C)
        self.tgt_emb = nn.Embedding(cfg.tgt_vocab_size, C)
        for emb in (self.src_emb, self.tgt_emb):
            nn.init.normal_(emb.weight, std=C**-0.5)
        self.register_buffer("pos", sinusoidal_encoding(cfg.max_len, C), persistent=False)  # (max_len, C)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(
            cfg.n_encoder_layers, C, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.activation, norm_first=True
        )
        self.decoder = Seq2SeqDecoder(
            cfg.n_decoder_layers, C, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.activation
        )
        self.lm_head = nn.Linear(C, cfg.tgt_vocab_size, bias=False)
        self.lm_head.weight = self.tgt_emb.weight  # tied

    def _embed(self, emb: nn.Embedding, ids: torch.Tensor, what: str) -> torch.Tensor:
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(
                f"{what} must be (B, L) torch.long token ids, got {ids.dtype} {tuple(ids.shape)}"
            )
        if ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"{what} has {ids.shape[1]} tokens, more than max_len={self.cfg.max_len}")
        pos = self.pos[: ids.shape[1]].to(emb.weight.dtype)  # (L, C)
        return self.drop(emb(ids) * self.cfg.d_model**0.5 + pos)  # (B, L, C)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The memory ``(B, S, C)`` of source ids ``(B, S)``; ``src_mask`` (``True`` = real token) defaults
        to ``src != PAD``."""
        src_mask = src != PAD if src_mask is None else src_mask
        return self.encoder(self._embed(self.src_emb, src, "src"), key_padding_mask=src_mask)

    def decode(
        self,
        tgt_in: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ):
        """Logits ``(B, T, V)`` for decoder inputs ``(B, T)`` given the memory ``(B, S, C)``.

        Position ``t``'s logits score target ``t`` (the decoder input holds targets ``< t``).
        With ``return_weights`` also each layer's cross-attention weights ``(B, H, T, S)``.
        """
        h, weights = self.decoder(self._embed(self.tgt_emb, tgt_in, "tgt_in"), memory, src_mask)
        logits = self.lm_head(h)  # (B, T, V)
        return (logits, weights) if return_weights else logits

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits ``(B, T, V)`` for sources ``(B, S)`` and decoder inputs ``(B, T)``."""
        src_mask = src != PAD  # (B, S)
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask)


def to_torch_transformer_state_dict(model: Seq2Seq) -> dict[str, torch.Tensor]:
    """The encoder and decoder weights of ``model`` under ``nn.Transformer(norm_first=True)``'s names."""
    sd = {k: v for k, v in model.state_dict().items() if k.startswith(("encoder.", "decoder."))}
    return to_torch_state_dict(sd)


# --------------------------------------------------------------------------- decoding


class _Prefix:
    """The "cache" of a :class:`ConditionalLM`: each row's decoded tokens and its source's memory."""

    def __init__(self, memory: torch.Tensor, src_mask: torch.Tensor, max_len: int):
        self.memory, self.src_mask, self.max_len = memory, src_mask, max_len  # (N, S, C), (N, S)
        self.tokens = torch.zeros((memory.shape[0], 0), dtype=torch.long, device=memory.device)  # (N, t)

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (beam search: each new beam continues a parent's prefix)."""
        self.tokens, self.memory, self.src_mask = self.tokens[index], self.memory[index], self.src_mask[index]


class ConditionalLM(nn.Module):
    """A :class:`Seq2Seq` decoder conditioned on encoded sources, as a Chapter 7 language model.

    The sources are encoded **once**, here. ``lm(idx, cache=cache)`` returns the next-token
    logits ``(N, T, V)`` of the decoder inputs ``idx`` (starting with ``BOS``) appended to the
    cache's prefix; ``init_cache(n)`` repeats a single source's memory for ``n`` beams and
    ``cache.reorder`` follows the beams. So :func:`coursekit.decoding.generate` and
    :func:`coursekit.decoding.beam_search` decode it unchanged.

    Args:
        model: the translation model (its mode is copied; use eval mode to translate).
        src: ``(B, S)`` source ids.
    """

    def __init__(self, model: Seq2Seq, src: torch.Tensor):
        super().__init__()
        self.model = model
        self.train(model.training)
        self.src_mask = src != PAD  # (B, S)
        with torch.no_grad():
            self.memory = model.encode(src, self.src_mask)  # (B, S, C), the only encoder pass
        self.cfg = SimpleNamespace(block_size=model.cfg.max_len)

    def init_cache(self, batch_size: int, max_len: int | None = None) -> _Prefix:
        B = self.memory.shape[0]
        if batch_size != B and B != 1:
            raise ValueError(
                f"the ConditionalLM holds {B} sources; a cache for {batch_size} rows needs 1 or {B}"
            )
        index = torch.zeros(batch_size, dtype=torch.long) if batch_size != B else torch.arange(B)
        return _Prefix(
            self.memory[index], self.src_mask[index], self.cfg.block_size if max_len is None else max_len
        )

    def forward(self, idx: torch.Tensor, cache: _Prefix | None = None) -> torch.Tensor:
        if cache is None:
            tokens, memory, mask = idx, self.memory, self.src_mask
        else:
            if cache.length + idx.shape[1] > cache.max_len:
                raise ValueError(
                    f"the prefix holds {cache.max_len} tokens; {cache.length} are used and "
                    f"{idx.shape[1]} more do not fit"
                )
            cache.tokens = torch.cat([cache.tokens, idx], dim=1)  # (N, t + T)
            tokens, memory, mask = cache.tokens, cache.memory, cache.src_mask
        return self.model.decode(tokens, memory, mask)[:, -idx.shape[1] :]  # (N, T, V): the new positions


def _max_new(model: Seq2Seq, max_new_tokens: int | None) -> int:
    return model.cfg.max_len - 1 if max_new_tokens is None else max_new_tokens


@torch.no_grad()
def greedy_decode(model: Seq2Seq, src: torch.Tensor, max_new_tokens: int | None = None) -> torch.Tensor:
    """Greedy translations of a batch of sources, the encoder run once.

    Args:
        model: the translation model (put in eval mode for the call; its mode is restored).
        src: ``(B, S)`` source ids.
        max_new_tokens: at most this many target tokens (default ``max_len - 1``).

    Returns:
        ``(B, n)`` target ids (no ``BOS``); a row ends at its first ``EOS`` (later entries are ``EOS``).
    """
    was_training = model.training
    model.eval()
    try:
        lm = ConditionalLM(model, src)
        bos = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        return decoding.generate(lm, bos, _max_new(model, max_new_tokens), eos_id=EOS)[:, 1:]
    finally:
        model.train(was_training)


@torch.no_grad()
def beam_decode(
    model: Seq2Seq,
    src: torch.Tensor,
    beam_width: int = 4,
    length_penalty: float = 1.0,
    max_new_tokens: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Beam-search translation of one source with :func:`coursekit.decoding.beam_search`.

    The source is encoded once; the beams share (copies of) its memory. ``beam_width=1``
    with ``length_penalty=0`` is greedy decoding.

    Args:
        model: the translation model (eval mode for the call).
        src: ``(1, S)`` source ids.
        beam_width, length_penalty: as :func:`coursekit.decoding.beam_search`.
        max_new_tokens: the longest translation (default ``max_len - 1``).

    Returns:
        ``(ids (n,), score)``: the best translation's ids (ending with ``EOS`` unless cut) and its
        length-normalised log-probability.
    """
    if src.dim() != 2 or src.shape[0] != 1:
        raise ValueError(f"beam_decode translates one source of shape (1, S), got {tuple(src.shape)}")
    was_training = model.training
    model.eval()
    try:
        lm = ConditionalLM(model, src)
        bos = torch.full((1, 1), BOS, dtype=torch.long, device=src.device)
        out, score = decoding.beam_search(
            lm, bos, _max_new(model, max_new_tokens), beam_width, eos_id=EOS, length_penalty=length_penalty
        )
        return out[0, 1:], score
    finally:
        model.train(was_training)


# --------------------------------------------------------------------------- the exercise's experiment


# --------------------------------------------------------------------------- the exercise's stretch part


def length_penalty_score(logprob: torch.Tensor, length: torch.Tensor, alpha: float) -> torch.Tensor:
    """The length-normalised score of finished beam hypotheses (Wu et al., 2016, Google's NMT system).

    A hypothesis's summed log-probability only falls as it grows, so ranking finished beams by it
    favours short translations. Wu et al. divide it by the length penalty
    ``lp(n) = ((5 + n) / 6) ** alpha``: ``score = logprob / lp(n)``, with ``n`` the number of
    generated tokens. ``alpha = 0`` gives the raw log-probability (``lp = 1``); a larger ``alpha``
    favours longer hypotheses more (the paper tuned ``alpha`` in ``[0.6, 0.7]``). ``lp(1) = 1``.
    Example: ``logprob`` ``[-3.0, -4.0]`` with lengths ``[2, 6]`` and ``alpha = 1`` score
    ``[-2.571, -2.182]``: the longer hypothesis now ranks first.

    Args:
        logprob: ``(...)`` floating tensor, the summed log-probabilities of the hypotheses.
        length: integer tensor of their lengths ``n >= 1``, broadcastable with ``logprob``.
        alpha: the strength of the penalty, ``>= 0``.

    Returns:
        The scores, a tensor of the broadcast shape and ``logprob``'s dtype (``length`` is
        converted to that dtype: no integer division, no float32 rounding of float64 scores);
        the inputs are not changed.

    Raises:
        ValueError: for ``alpha < 0`` or a length below 1.
    """
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    if bool((length < 1).any()):
        raise ValueError(f"every length must be at least 1, got {length.tolist()}")
    penalty = ((5 + length.to(logprob.dtype)) / 6) ** alpha  # lp(n), broadcastable with logprob
    return logprob / penalty


# --------------------------------------------------------------------------- scoring translations: BLEU


def _ngrams(tokens: list[str], n: int) -> Counter:
    """The n-grams of ``tokens`` with their counts.

    Example: ``(["a", "b", "a", "b"], 2) -> {("a", "b"): 2, ("b", "a"): 1}``.
    """
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def bleu(
    hypotheses: list[str],
    references: list[str],
    max_order: int = 4,
    smooth: str = "exp",
    effective_order: bool = False,
) -> float:
    """Corpus BLEU (Papineni et al., 2002) of whitespace-separated hypotheses, one reference each, 0-100.

    For each order ``n = 1 .. max_order`` the *modified precision* ``p_n`` pools over the corpus:
    the hypotheses' n-grams, each counted at most as often as it occurs in its reference
    (clipping: ``"the the the"`` against ``"the cat"`` matches one ``the``), divided by the
    number of hypothesis n-grams. With ``c`` hypothesis and ``r`` reference tokens in all, the
    brevity penalty is ``BP = exp(1 - r / c)`` if ``c < r``, else 1, and
    ``BLEU = 100 BP exp(mean_n log p_n)``, a geometric mean: one ``p_n = 0`` makes BLEU 0.

    The conventions are sacrebleu's (Post, 2018), so the two agree (a test checks):
    ``smooth="exp"`` (its default, NIST's) gives the k-th order without any match
    ``p_n = 1 / (2^k total_n)`` instead of 0, ``"none"`` leaves it 0; no match at any order is
    BLEU 0. An order for which the hypotheses have **no n-gram at all** (every hypothesis
    shorter than ``n`` tokens) has ``p_n = 0`` and BLEU is 0, even for a perfect output; with
    ``effective_order=True`` the mean runs over the orders up to the last one that has n-grams.
    Tokens are split at whitespace only (sacrebleu's default ``13a`` tokenizer also splits off
    punctuation; number words have none).
    Example: ``bleu(["zweiundvierzig"], ["zweiundvierzig"]) -> 0.0`` (one token: no 2-grams),
    with ``effective_order=True`` 100.0.

    Args:
        hypotheses: ``N`` system outputs.
        references: ``N`` references, one per hypothesis.
        max_order: the longest n-gram, ``>= 1``.
        smooth: ``"exp"`` or ``"none"``.
        effective_order: average only over the orders the hypotheses have n-grams of.

    Returns:
        BLEU as a Python ``float`` in ``[0, 100]``.

    Raises:
        ValueError: for different numbers of hypotheses and references, no sentences,
            ``max_order < 1`` or an unknown ``smooth``.
    """
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(
            f"need one reference per hypothesis and at least one pair, got {len(hypotheses)} and {len(references)}"
        )
    if max_order < 1 or smooth not in ("exp", "none"):
        raise ValueError(f"need max_order >= 1 and smooth 'exp' or 'none', got {max_order!r} and {smooth!r}")
    correct, total = [0] * max_order, [0] * max_order
    c = r = 0
    for hyp, ref in zip(hypotheses, references):
        h, t = hyp.split(), ref.split()
        c, r = c + len(h), r + len(t)
        for n in range(1, max_order + 1):
            counts, ref_counts = _ngrams(h, n), _ngrams(t, n)
            correct[n - 1] += sum(min(k, ref_counts[g]) for g, k in counts.items())  # clipped
            total[n - 1] += sum(counts.values())
    if not any(correct):
        return 0.0
    bp = 1.0 if c >= r else math.exp(1 - r / c)
    log_p, zeros = [], 0
    for n in range(max_order):
        if total[n] == 0:  # no hypothesis n-grams: p_n undefined, counted as 0 unless effective_order
            if not effective_order:
                return 0.0
            break
        if correct[n] == 0:
            if smooth == "none":
                return 0.0
            zeros += 1
            log_p.append(-math.log(2**zeros * total[n]))
        else:
            log_p.append(math.log(correct[n] / total[n]))
    return 100.0 * bp * math.exp(sum(log_p) / len(log_p))

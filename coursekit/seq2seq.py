"""Chapter 8: an encoder-decoder transformer that translates English number words into German.

The model of Vaswani et al. (2017), pre-norm (Xiong et al., 2020), built from Chapter 4:
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
by :func:`label_smoothed_loss` (Szegedy et al., 2016). Optionally, :func:`scheduled_sampling`
(Bengio et al., 2015; in the two-pass form of Mihaylova & Martins, 2019 for transformers)
replaces some of the true prefix tokens with the model's own predictions.

Decoding reuses Chapter 7: :class:`ConditionalLM` wraps a model and an encoded source as a
language model (``model(idx, cache=cache)``, ``init_cache``, ``reorder``), so
:func:`coursekit.decoding.generate` (greedy) and :func:`coursekit.decoding.beam_search` drive
it. The encoder runs once per source; beams share its memory. The decoder re-reads its
prefix at every step (our targets have at most 12 tokens; a KV cache as in Chapter 7 would
matter for long outputs).

**The task.** Every integer from 0 to 999,999 in English words (American style, no "and":
``forty-two``, ``one hundred one``) and in German (``zweiundvierzig``, ``einhunderteins``):
German names the units before the tens (``zwei-und-vierzig`` for forty-two), uses ``eins``
only at the very end of a number and ``ein`` inside it (``einundzwanzig``, ``eintausend``),
and writes the number as one word. Tokens are English words (the hyphen is a token of its
own) and German *morphemes* (``zwei und vierzig``), so the word-order change is visible
in the cross-attention. We write ``einhundert`` and ``eintausend`` (not the equally correct
``hundert``, ``tausend``), as cheques and num2words do.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import decoding, train
from coursekit._config import check_transformer_config
from coursekit._files import read_json, write_json
from coursekit.attention import scaled_dot_product_attention
from coursekit.layers import DecoderLayer, Encoder, LayerNorm, to_torch_state_dict
from coursekit.multihead import MultiHeadAttention, merge_heads, repeat_kv
from coursekit.positional import sinusoidal_encoding

__all__ = [
    "MAX_NUMBER", "PAD", "BOS", "EOS", "Vocab", "EN_VOCAB", "DE_VOCAB",
    "english_tokens", "english", "german_tokens", "german",
    "NumberSplits", "number_splits", "number_shape", "sample_numbers", "make_batch",
    "shift_right", "cross_attention", "PreNormDecoderLayer", "Seq2SeqDecoder",
    "Seq2SeqConfig", "SEQ2SEQ_PRESETS", "Seq2Seq", "to_torch_transformer_state_dict",
    "label_smoothed_loss", "scheduled_sampling", "ConditionalLM",
    "greedy_decode", "beam_decode", "translate", "chrf", "evaluate_translation",
    "Seq2SeqRecipe", "SEQ2SEQ_NUMBERS", "train_seq2seq", "pretrain_seq2seq_numbers", "load_seq2seq_numbers",
]

# --------------------------------------------------------------------------- number words

#: The largest number of the task: every integer in ``0 .. MAX_NUMBER`` has a translation.
MAX_NUMBER = 999_999

_EN_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
            "fifteen sixteen seventeen eighteen nineteen").split()
_EN_TENS = (None, None, "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_DE_ONES = ("null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn "
            "fünfzehn sechzehn siebzehn achtzehn neunzehn").split()
_DE_TENS = (None, None, "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig")


def _check_number(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"expected an integer in 0 .. {MAX_NUMBER:,}, got {n!r}")


def _english_below_1000(n: int) -> list[str]:
    """``1 <= n <= 999`` in English words: ``[hundreds "hundred"] [tens ["-" unit] | 1..19]``."""
    hundreds, rest = divmod(n, 100)
    out = [_EN_ONES[hundreds], "hundred"] if hundreds else []
    if rest >= 20:
        tens, unit = divmod(rest, 10)
        out += [_EN_TENS[tens]] + (["-", _EN_ONES[unit]] if unit else [])
    elif rest:
        out.append(_EN_ONES[rest])
    return out


def english_tokens(n: int) -> list[str]:
    """The English words of ``n`` (American style: no "and"), the hyphen as a token of its own.

    Example: ``english_tokens(1042) -> ["one", "thousand", "forty", "-", "two"]``.
    """
    _check_number(n)
    if n == 0:
        return ["zero"]
    thousands, rest = divmod(n, 1000)
    out = _english_below_1000(thousands) + ["thousand"] if thousands else []
    return out + (_english_below_1000(rest) if rest else [])


def english(n: int) -> str:
    """``n`` in English words. Example: ``english(101042) -> "one hundred one thousand forty-two"``."""
    return " ".join(english_tokens(n)).replace(" - ", "-")


def _german_one(u: int, last: bool) -> str:
    """The German word of ``1 <= u <= 19``; 1 is ``eins`` only where the number ends, else ``ein``."""
    if u == 1:
        return "eins" if last else "ein"
    return _DE_ONES[u]


def _german_below_1000(n: int, last: bool) -> list[str]:
    """``1 <= n <= 999`` as German morphemes: ``[h "hundert"] [[unit "und"] tens | 1..19]``."""
    hundreds, rest = divmod(n, 100)
    out = [_german_one(hundreds, last=False), "hundert"] if hundreds else []
    if rest >= 20:
        tens, unit = divmod(rest, 10)
        out += ([_german_one(unit, last=False), "und"] if unit else []) + [_DE_TENS[tens]]
    elif rest:
        out.append(_german_one(rest, last))
    return out


def german_tokens(n: int) -> list[str]:
    """The German morphemes of ``n``: units before tens, ``eins`` only at the very end.

    Example: ``german_tokens(21042) -> ["ein", "und", "zwanzig", "tausend", "zwei", "und", "vierzig"]``.
    """
    _check_number(n)
    if n == 0:
        return ["null"]
    thousands, rest = divmod(n, 1000)
    out = _german_below_1000(thousands, last=False) + ["tausend"] if thousands else []
    return out + (_german_below_1000(rest, last=True) if rest else [])


def german(n: int) -> str:
    """``n`` in German, one word. Example: ``german(42) -> "zweiundvierzig"``, ``german(101) -> "einhunderteins"``."""
    return "".join(german_tokens(n))


# --------------------------------------------------------------------------- vocabularies

#: Special token ids, the same in both vocabularies.
PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ("<pad>", "<bos>", "<eos>")


class Vocab:
    """A closed word vocabulary: the three special tokens (ids 0, 1, 2), then ``tokens`` in order.

    Example: ``Vocab(["a", "b"]).encode(["b", "a"]) -> [4, 3, 2]`` (``EOS`` appended).
    """

    def __init__(self, tokens):
        self.itos: tuple[str, ...] = _SPECIALS + tuple(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary tokens must be distinct and must not repeat the special tokens")

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: list[str], eos: bool = True) -> list[int]:
        """Ids of ``tokens``, then ``EOS`` (if ``eos``); an unknown token is a ValueError."""
        try:
            ids = [self.stoi[t] for t in tokens]
        except KeyError as e:
            raise ValueError(f"{e.args[0]!r} is not in the vocabulary of {len(self)} tokens") from None
        return ids + [EOS] if eos else ids

    def decode(self, ids) -> list[str]:
        """Tokens of ``ids`` (a list or a 1-D tensor) up to the first ``EOS``, which is dropped."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        if EOS in ids:
            ids = ids[:ids.index(EOS)]
        try:
            return [self.itos[i] for i in ids]
        except IndexError:
            raise ValueError(f"token ids must be in [0, {len(self)}), got {ids}") from None


EN_VOCAB = Vocab(_EN_ONES + [t for t in _EN_TENS if t] + ["hundred", "thousand", "-"])
DE_VOCAB = Vocab(_DE_ONES + ["ein"] + [t for t in _DE_TENS if t] + ["und", "hundert", "tausend"])


# --------------------------------------------------------------------------- splits and batches


@dataclass(frozen=True)
class NumberSplits:
    """Disjoint sets of numbers, each a sorted 1-D ``torch.long`` tensor; together all of ``0 .. MAX_NUMBER``."""

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor


def number_splits(n_val: int = 2000, n_test: int = 5000, seed: int = 0) -> NumberSplits:
    """The task's fixed split: a seeded permutation of ``0 .. MAX_NUMBER`` cut into test, validation, train.

    Every number is in exactly one split, so no test sentence (and no test source or target
    string, since the number words are one-to-one) is ever trained on. The test and
    validation sets are uniform samples: nine in ten of their numbers have six digits.
    """
    total = MAX_NUMBER + 1
    if n_val < 1 or n_test < 1 or n_val + n_test >= total:
        raise ValueError(f"need n_val, n_test >= 1 and n_val + n_test < {total}, got {n_val} and {n_test}")
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    test, val, train_ = perm[:n_test], perm[n_test:n_test + n_val], perm[n_test + n_val:]
    return NumberSplits(train_.sort().values, val.sort().values, test.sort().values)


def _group_shape(g: torch.Tensor) -> torch.Tensor:
    """The shape of 3-digit groups ``g`` (``0 .. 999``): hundreds or not (x 6), then the last two
    digits: none, 1, 2-19, round tens, tens and 1, tens and 2-9. Example: 342 -> 6 + 5 = 11."""
    r = g % 100
    rest = torch.where(r == 0, 0, torch.where(r == 1, 1, torch.where(r < 20, 2, torch.where(
        r % 10 == 0, 3, torch.where(r % 10 == 1, 4, 5)))))
    return (g >= 100).long() * 6 + rest


def number_shape(numbers: torch.Tensor) -> torch.Tensor:
    """The structural class (``0 .. 143``) of each number: the shape of its thousands, then of its last three digits.

    Numbers of one class are spelled alike in both languages (the same words in the same
    order, up to which digit); e.g. 342,671 and 567,821 share a class, 342,000 (no last three
    digits) and 342,601 (*...hundertein-s*) each have another. Numbers below 1,000 have empty
    thousands (shape 0).
    """
    return _group_shape(numbers // 1000) * 12 + _group_shape(numbers % 1000)  # (N,)


def _shape_groups(pool: torch.Tensor) -> list[torch.Tensor]:
    """``pool`` split by :func:`number_shape`; only the classes ``pool`` has."""
    shapes = number_shape(pool)  # (N,)
    return [pool[shapes == c] for c in shapes.unique().tolist()]


def sample_numbers(pool: torch.Tensor, batch_size: int, generator: torch.Generator,
                   groups: list[torch.Tensor] | None = None) -> torch.Tensor:
    """``batch_size`` numbers from ``pool``: a structural class (:func:`number_shape`) uniformly, then
    a uniform number of that class.

    Uniform sampling would hardly ever show a rare structure: nine in ten numbers have six
    digits, and one in a thousand of those is a round thousand (342,000), whose German ends
    in *tausend*. Balancing the classes shows each of them as often as any other.

    Args:
        pool: ``(N,)`` numbers, e.g. ``number_splits().train``.
        batch_size: ``B``.
        generator: the source of randomness.
        groups: ``pool`` grouped by class, precomputed with ``_shape_groups`` (optional, for speed).

    Returns:
        ``(B,)`` ``torch.long``.
    """
    groups = _shape_groups(pool) if groups is None else groups
    if not groups:
        raise ValueError("the pool of numbers is empty")
    classes = torch.randint(len(groups), (batch_size,), generator=generator)  # (B,)
    u = torch.rand(batch_size, generator=generator, dtype=torch.float64)  # (B,)
    return torch.stack([groups[c][int(x * len(groups[c]))] for c, x in zip(classes.tolist(), u.tolist())])


def _pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r)
    return out


def make_batch(numbers) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and target token ids of ``numbers`` (a list or a 1-D tensor of ints).

    Returns:
        ``(src (B, S), tgt (B, T))``, ``torch.long``, padded with ``PAD``; the source is the
        English words, the target the German morphemes followed by ``EOS``.
    """
    numbers = numbers.tolist() if isinstance(numbers, torch.Tensor) else list(numbers)
    if not numbers:
        raise ValueError("make_batch needs at least one number")
    src = _pad([EN_VOCAB.encode(english_tokens(n), eos=False) for n in numbers])
    tgt = _pad([DE_VOCAB.encode(german_tokens(n)) for n in numbers])
    return src, tgt


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
        raise ValueError(f"labels must be (B, T) torch.long with T >= 1, got {labels.dtype} {tuple(labels.shape)}")
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
        raise ValueError(f"expected x (B, T, C) and memory (B, S, C), got {tuple(x.shape)} and {tuple(memory.shape)}")
    mask = None
    if memory_key_padding_mask is not None:
        B, S = memory.shape[:2]
        if memory_key_padding_mask.dtype != torch.bool or memory_key_padding_mask.shape != (B, S):
            raise ValueError(f"memory_key_padding_mask must be a boolean ({B}, {S}) tensor (True = real token), got "
                             f"{memory_key_padding_mask.dtype} {tuple(memory_key_padding_mask.shape)}")
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

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "relu", eps: float = 1e-5, bias: bool = True):
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


def label_smoothed_loss(logits: torch.Tensor, targets: torch.Tensor, smoothing: float = 0.1,
                        pad_id: int = 0) -> torch.Tensor:
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
        raise ValueError(f"expected logits (..., V) and targets of the leading shape, "
                         f"got {tuple(logits.shape)} and {tuple(targets.shape)}")
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

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int | None = None, dropout: float = 0.1,
                 activation: str = "relu"):
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"n_layers must be at least 1, got {n_layers}")
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(d_model, n_heads, d_ff, dropout, activation) for _ in range(n_layers))
        self.norm = LayerNorm(d_model)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_key_padding_mask: torch.Tensor | None = None
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

    src_vocab_size: int = len(EN_VOCAB)
    tgt_vocab_size: int = len(DE_VOCAB)
    d_model: int = 64
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    d_ff: int | None = None
    dropout: float = 0.1
    activation: str = "relu"
    max_len: int = 16

    def __post_init__(self):
        check_transformer_config(self, ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_encoder_layers",
                                        "n_decoder_layers", "max_len"))
        if self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even (sinusoidal positions come in sin/cos pairs)")


#: ``nano`` for tests; ``small`` is the chapter's model.
SEQ2SEQ_PRESETS = {
    "nano": Seq2SeqConfig(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0),
    "small": Seq2SeqConfig(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=256, dropout=0.0),
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
            nn.init.normal_(emb.weight, std=C ** -0.5)
        self.register_buffer("pos", sinusoidal_encoding(cfg.max_len, C), persistent=False)  # (max_len, C)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(cfg.n_encoder_layers, C, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.activation,
                               norm_first=True)
        self.decoder = Seq2SeqDecoder(cfg.n_decoder_layers, C, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.activation)
        self.lm_head = nn.Linear(C, cfg.tgt_vocab_size, bias=False)
        self.lm_head.weight = self.tgt_emb.weight  # tied

    def _embed(self, emb: nn.Embedding, ids: torch.Tensor, what: str) -> torch.Tensor:
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"{what} must be (B, L) torch.long token ids, got {ids.dtype} {tuple(ids.shape)}")
        if ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"{what} has {ids.shape[1]} tokens, more than max_len={self.cfg.max_len}")
        pos = self.pos[:ids.shape[1]].to(emb.weight.dtype)  # (L, C)
        return self.drop(emb(ids) * self.cfg.d_model ** 0.5 + pos)  # (B, L, C)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The memory ``(B, S, C)`` of source ids ``(B, S)``; ``src_mask`` (``True`` = real token) defaults
        to ``src != PAD``."""
        src_mask = src != PAD if src_mask is None else src_mask
        return self.encoder(self._embed(self.src_emb, src, "src"), key_padding_mask=src_mask)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None = None,
               return_weights: bool = False):
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


# --------------------------------------------------------------------------- training


def scheduled_sampling(model: Seq2Seq, src: torch.Tensor, tgt_in: torch.Tensor, rate: float,
                       generator: torch.Generator) -> torch.Tensor:
    """Decoder inputs in which each prefix token is, with probability ``rate``, the model's own guess.

    Two passes (Mihaylova & Martins, 2019): a teacher-forced pass without gradients predicts
    every target; shifted right, these guesses are what the decoder would have read had it
    generated the prefix itself. Each token after ``BOS`` is replaced by the guess with
    probability ``rate``; ``BOS`` and padding stay. Train on the result (second pass) to
    expose the model to its own mistakes (Bengio et al., 2015).

    Args:
        model: the model being trained.
        src: ``(B, S)`` source ids.
        tgt_in: ``(B, T)`` teacher-forcing inputs, ``shift_right(targets)``.
        rate: in ``[0, 1]``; 0 returns ``tgt_in`` unchanged.
        generator: which tokens are replaced.

    Returns:
        ``(B, T)`` decoder inputs.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    if rate == 0.0:
        return tgt_in
    with torch.no_grad():
        guesses = model(src, tgt_in).argmax(dim=-1)  # (B, T): the guess for target t
    own = shift_right(guesses, BOS, PAD)  # (B, T): what the decoder would read
    replace_ = torch.rand(tgt_in.shape, generator=generator) < rate  # (B, T)
    replace_ &= (tgt_in != PAD) & (tgt_in != BOS)
    return torch.where(replace_, own, tgt_in)


@dataclass(frozen=True)
class Seq2SeqRecipe:
    """A model, its training schedule, and the loss's options.

    Args:
        model: the :class:`Seq2SeqConfig`.
        train: :class:`coursekit.train.TrainConfig` (``batch_size`` examples per step).
        smoothing: label smoothing of :func:`label_smoothed_loss`.
        sampling_rate: the final :func:`scheduled_sampling` rate, reached linearly at the
            last step (0: pure teacher forcing).
        val_numbers: how many validation numbers each evaluation translates.
    """

    model: Seq2SeqConfig = field(default_factory=lambda: SEQ2SEQ_PRESETS["small"])
    train: train.TrainConfig = field(default_factory=lambda: train.TrainConfig(
        max_steps=500, batch_size=128, lr=3e-3, warmup_steps=50, weight_decay=0.01, betas=(0.9, 0.98),
        eval_interval=100, eval_batches=4))
    smoothing: float = 0.1
    sampling_rate: float = 0.0
    val_numbers: int = 500


#: The committed checkpoint's recipe (``coursekit pretrain seq2seq-numbers``).
SEQ2SEQ_NUMBERS = Seq2SeqRecipe()


def _loss_fn(smoothing: float):
    def loss_fn(model, batch):
        src, tgt_in, tgt = batch
        return label_smoothed_loss(model(src, tgt_in), tgt, smoothing)
    return loss_fn


def train_seq2seq(model: Seq2Seq, splits: NumberSplits, recipe: Seq2SeqRecipe, *,
                  progress: bool = True) -> train.History:
    """Train ``model`` on ``splits.train`` with :func:`coursekit.train.train`.

    Each step draws :func:`sample_numbers` from the training split, builds the batch with
    :func:`make_batch` and :func:`shift_right` (and :func:`scheduled_sampling` at the step's
    rate), and minimises :func:`label_smoothed_loss`. Evaluations record ``val_loss`` (on
    ``eval_batches`` fixed validation batches) and ``val_exact`` (greedy exact match on
    ``recipe.val_numbers`` validation numbers, every k-th of the sorted split, so all sizes).
    """
    cfg = recipe.train
    groups = _shape_groups(splits.train)
    loss_fn = _loss_fn(recipe.smoothing)
    ss_gen = torch.Generator().manual_seed(cfg.seed + 2)

    def batch_fn(step, g):
        src, tgt = make_batch(sample_numbers(splits.train, cfg.batch_size, g, groups))
        tgt_in = shift_right(tgt, BOS, PAD)
        if recipe.sampling_rate > 0:
            tgt_in = scheduled_sampling(model, src, tgt_in, recipe.sampling_rate * step / cfg.max_steps, ss_gen)
        return src, tgt_in, tgt

    val_gen = torch.Generator().manual_seed(1234)
    val_batches = []
    for _ in range(cfg.eval_batches):
        src, tgt = make_batch(sample_numbers(splits.val, cfg.batch_size, val_gen))
        val_batches.append((src, shift_right(tgt, BOS, PAD), tgt))
    val_numbers = splits.val[::max(1, len(splits.val) // recipe.val_numbers)][:recipe.val_numbers]  # spread out

    def eval_fn(m):
        return {"val_loss": train.evaluate(m, val_batches, loss_fn),
                "val_exact": evaluate_translation(m, val_numbers)["exact_match"]}

    return train.train(model, batch_fn, cfg, loss_fn=loss_fn, eval_fn=eval_fn, progress=progress)


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
            raise ValueError(f"the ConditionalLM holds {B} sources; a cache for {batch_size} rows needs 1 or {B}")
        index = torch.zeros(batch_size, dtype=torch.long) if batch_size != B else torch.arange(B)
        return _Prefix(self.memory[index], self.src_mask[index], self.cfg.block_size if max_len is None else max_len)

    def forward(self, idx: torch.Tensor, cache: _Prefix | None = None) -> torch.Tensor:
        if cache is None:
            tokens, memory, mask = idx, self.memory, self.src_mask
        else:
            if cache.length + idx.shape[1] > cache.max_len:
                raise ValueError(f"the prefix holds {cache.max_len} tokens; {cache.length} are used and "
                                 f"{idx.shape[1]} more do not fit")
            cache.tokens = torch.cat([cache.tokens, idx], dim=1)  # (N, t + T)
            tokens, memory, mask = cache.tokens, cache.memory, cache.src_mask
        return self.model.decode(tokens, memory, mask)[:, -idx.shape[1]:]  # (N, T, V): the new positions


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
def beam_decode(model: Seq2Seq, src: torch.Tensor, beam_width: int = 4, length_penalty: float = 1.0,
                max_new_tokens: int | None = None) -> tuple[torch.Tensor, float]:
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
        out, score = decoding.beam_search(lm, bos, _max_new(model, max_new_tokens), beam_width,
                                          eos_id=EOS, length_penalty=length_penalty)
        return out[0, 1:], score
    finally:
        model.train(was_training)


def translate(model: Seq2Seq, numbers, beam_width: int = 1, batch_size: int = 500) -> list[str]:
    """German translations of ``numbers`` (ints or a 1-D tensor), greedy or by beam search."""
    numbers = numbers.tolist() if isinstance(numbers, torch.Tensor) else list(numbers)
    out = []
    for i in range(0, len(numbers), batch_size):
        src, _ = make_batch(numbers[i:i + batch_size])
        if beam_width == 1:
            rows = greedy_decode(model, src)
        else:
            rows = [beam_decode(model, src[j:j + 1], beam_width)[0] for j in range(src.shape[0])]
        out += ["".join(DE_VOCAB.decode(r)) for r in rows]
    return out


def chrf(hypotheses: list[str], references: list[str]) -> float:
    """Corpus chrF (Popović, 2015) of ``hypotheses`` against one reference each, sacrebleu's defaults (0-100)."""
    from sacrebleu.metrics import CHRF

    if len(hypotheses) != len(references):
        raise ValueError(f"need one reference per hypothesis, got {len(hypotheses)} and {len(references)}")
    return CHRF().corpus_score(hypotheses, [references]).score


def evaluate_translation(model: Seq2Seq, numbers, beam_width: int = 1) -> dict:
    """Translate ``numbers`` and score them against :func:`german`.

    Returns:
        ``{"exact_match": fraction, "chrf": 0-100, "n": count, "errors": [(number, reference, output), ...]}``.
    """
    numbers = numbers.tolist() if isinstance(numbers, torch.Tensor) else list(numbers)
    hyps = translate(model, numbers, beam_width)
    refs = [german(n) for n in numbers]
    errors = [(n, r, h) for n, r, h in zip(numbers, refs, hyps) if r != h]
    return {"exact_match": 1 - len(errors) / len(numbers), "chrf": chrf(hyps, refs), "n": len(numbers),
            "errors": errors}


# --------------------------------------------------------------------------- the committed checkpoint

_FORMAT = "coursekit-seq2seq"
_VERSION = 1


def _checkpoint_dir(directory) -> Path:
    from coursekit.pretrained import checkpoint_dir  # pretrained imports this module: import here

    return Path(directory) if directory is not None else checkpoint_dir()


def pretrain_seq2seq_numbers(out_dir: str | os.PathLike | None = None, recipe: Seq2SeqRecipe = SEQ2SEQ_NUMBERS,
                             name: str = "seq2seq-numbers", progress: bool = True) -> dict:
    """Train :data:`SEQ2SEQ_NUMBERS` from scratch, round to float16, measure on the test split, and write
    ``<name>.pt`` and ``<name>.json``.

    Returns:
        The recorded metrics (exact match and chrF on the test split, measured with the
        stored float16 weights, the first errors, training time and steps).
    """
    out_dir = _checkpoint_dir(out_dir)
    splits = number_splits()
    torch.manual_seed(recipe.train.seed)
    model = Seq2Seq(recipe.model)
    history = train_seq2seq(model, splits, recipe, progress=progress)
    model.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})  # what is stored
    started = time.perf_counter()
    result = evaluate_translation(model, splits.test)
    metrics = {
        "test_exact_match": result["exact_match"], "test_chrf": result["chrf"], "test_size": result["n"],
        "test_errors": [list(e) for e in result["errors"][:50]],
        "eval_seconds": round(time.perf_counter() - started, 1),
        "val_during_training": history.evals,
        "train_seconds": round(history.train_time, 1), "steps": len(history.steps),
        "parameters": sum(p.numel() for p in model.parameters()),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.to(torch.float16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    torch.save(weights, out_dir / f"{name}.pt")
    write_json(out_dir / f"{name}.json", {
        "format": _FORMAT, "version": _VERSION, "name": name,
        "model": asdict(recipe.model), "train": asdict(recipe.train),
        "smoothing": recipe.smoothing, "sampling_rate": recipe.sampling_rate, "val_numbers": recipe.val_numbers,
        "vocab": {"en": list(EN_VOCAB.itos), "de": list(DE_VOCAB.itos)},
        "metrics": metrics, "command": f"coursekit pretrain {name}",
    })
    return metrics


def load_seq2seq_numbers(directory: str | os.PathLike | None = None,
                         name: str = "seq2seq-numbers") -> tuple[Seq2Seq, dict]:
    """The committed translation model (float32, eval mode) and its record."""
    directory = _checkpoint_dir(directory)
    record = read_json(directory / f"{name}.json", _FORMAT, _VERSION, "coursekit seq2seq record")
    if record["vocab"] != {"en": list(EN_VOCAB.itos), "de": list(DE_VOCAB.itos)}:
        raise ValueError(f"{directory / name}.json was trained with other vocabularies than this coursekit's")
    model = Seq2Seq(Seq2SeqConfig(**record["model"]))
    weights = torch.load(directory / f"{name}.pt", map_location="cpu", weights_only=True)
    weights["lm_head.weight"] = weights["tgt_emb.weight"]
    model.load_state_dict({k: v.float() for k, v in weights.items()})
    return model.eval(), record

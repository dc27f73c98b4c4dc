"""Chapter 6: BERT, an encoder-only transformer pretrained by masked language modelling.

BERT (Devlin et al., 2019) is the post-norm encoder of Chapter 4 with three embeddings
added at the input (token, learned position, segment) and two small heads:

- **masked language modelling (MLM)**: :func:`mask_tokens` selects 15% of the positions
  that are not special tokens; of those, 80% become ``[MASK]``, 10% a random ordinary
  token and 10% stay as they are. The model predicts the original token at every
  selected position and nowhere else (:func:`mlm_loss`). The output layer reuses the
  token embedding (tied weights) plus a bias;
- **classification**: a pooler (dense + tanh) on the ``[CLS]`` position, dropout and a
  linear layer to ``K`` classes (:class:`ClsHead`, :class:`BertClassifier`);
- **extractive question answering**: :class:`SpanHead` gives every token a start and an end
  logit (one linear layer ``C -> 2``) and :func:`best_span` picks the highest-scoring valid
  span ``start[i] + end[j]``, ``i <= j``, within the context (Devlin et al., 2019, on SQuAD);
- **sentence pairs**: :func:`pack_pairs` packs ``[CLS] a [SEP] b [SEP]`` with segment ids
  0 then 1; :func:`nsp_pairs` makes BERT's next-sentence prediction pairs (the second segment
  follows, or comes from another document) and :func:`sop_pairs` ALBERT's sentence-order
  prediction pairs (two neighbours, in order or swapped; Lan et al., 2020).

Conventions, stated once and tested:

- **Special tokens** are appended after a base vocabulary (our byte-level BPE of
  Chapter 5): :meth:`SpecialTokens.after` ``(V0)`` gives ``[PAD] = V0``, ``[CLS] = V0 + 1``,
  ``[SEP] = V0 + 2``, ``[MASK] = V0 + 3`` and a model vocabulary of ``V0 + 4``.
- **Masks**: ``attention_mask`` is ``(B, T)`` boolean, ``True`` at real tokens (the course's
  convention; Hugging Face's ``1`` = real token is the same polarity, as integers).
- **Layers** are :class:`coursekit.layers.Encoder` with ``norm_first=False`` and exact GELU,
  which is BERT's layer; BERT has no dropout inside its feed-forward, so we remove that one.
- **Hugging Face**: :data:`HF_NAMES` is the one table between our parameter names and
  those of ``transformers.BertForMaskedLM`` / ``BertForSequenceClassification`` /
  ``BertForQuestionAnswering``; the packed
  ``qkv_proj`` rows ``[q | k | v]`` are HF's separate ``query``, ``key``, ``value``
  concatenated. With internet access, real weights load like this (our BPE is not BERT's
  WordPiece, so use Hugging Face's tokenizer with them)::

      from transformers import AutoTokenizer, BertForMaskedLM as HFBert
      hf = HFBert.from_pretrained("bert-base-uncased")
      model = BertForMaskedLM(BERT_PRESETS["bert-base"]).eval()
      model.load_state_dict(from_hf_state_dict(hf.state_dict()))
      tok = AutoTokenizer.from_pretrained("bert-base-uncased")
      enc = tok("Paris is the [MASK] of France.", return_tensors="pt")
      logits = model(enc["input_ids"], enc["attention_mask"].bool(), enc["token_type_ids"])

The data, the training and the measurements of the chapter live in
:mod:`coursekit.experiments.bert_mlm` (masked-language-model batches, evaluation, baselines,
the book's checkpoint ``bert-small``) and :mod:`coursekit.experiments.topics` (the
fine-tuning task); this module is the model and the definitions of its inputs.

Over 500 lines: the config, presets, embeddings, encoder, the three heads and the span decoder, the
graded mask_tokens and mlm_loss with their teaching docstrings, BERT's and ALBERT's sentence-pair inputs,
and the Hugging Face name table are the model file of Chapter 6 (training and data live in coursekit.experiments).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from coursekit._config import check_transformer_config
from coursekit.hf_names import NameTable
from coursekit.layers import ACTIVATIONS, Encoder, LayerNorm, encoder_layer_params, layer_norm_params

__all__ = [
    "BERT_PRESETS",
    "HF_NAMES",
    "Bert",
    "BertClassifier",
    "BertConfig",
    "BertEmbeddings",
    "BertForMaskedLM",
    "ClsHead",
    "MLMHead",
    "SpecialTokens",
    "bert_params",
    "corrupted_fraction",
    "from_hf_state_dict",
    "mask_tokens",
    "mask_whole_words",
    "mlm_loss",
    "nsp_pairs",
    "pack_pairs",
    "sop_pairs",
    "to_hf_state_dict",
]


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT model (keys match the constructor arguments used below).

    Args:
        vocab_size: ``V``, including the special tokens.
        max_len: the number of learned positions, the longest input ``T``.
        n_layers: encoder layers ``L``.
        n_heads: attention heads ``H``; must divide ``d_model``.
        d_model: model width ``C``.
        d_ff: feed-forward hidden width (BERT: ``4 C``).
        n_segments: segment (token type) embeddings; 2 for sentence pairs.
        dropout: on embeddings, attention weights and sub-layer outputs.
        eps: the layer norms' epsilon (BERT: ``1e-12``).
        activation: ``"gelu"`` (exact, BERT's), ``"gelu_tanh"`` or ``"relu"``.
        init_std: standard deviation of the normal initialisation of weights.
    """

    vocab_size: int
    max_len: int
    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int
    n_segments: int = 2
    dropout: float = 0.1
    eps: float = 1e-12
    activation: str = "gelu"
    init_std: float = 0.02

    def __post_init__(self):
        check_transformer_config(
            self, ("vocab_size", "max_len", "n_layers", "n_heads", "d_model", "d_ff", "n_segments")
        )
        if not self.eps > 0 or not self.init_std > 0:
            raise ValueError(f"eps and init_std must be positive, got {self.eps} and {self.init_std}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")

    def hf_kwargs(self) -> dict:
        """Keyword arguments of the equal ``transformers.BertConfig``."""
        return dict(
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_len,
            num_hidden_layers=self.n_layers,
            num_attention_heads=self.n_heads,
            hidden_size=self.d_model,
            intermediate_size=self.d_ff,
            type_vocab_size=self.n_segments,
            hidden_dropout_prob=self.dropout,
            attention_probs_dropout_prob=self.dropout,
            layer_norm_eps=self.eps,
            hidden_act={"gelu_tanh": "gelu_new"}.get(self.activation, self.activation),
            initializer_range=self.init_std,
        )


#: ``nano`` for tests; ``small`` is the book's model (our 1024-token BPE plus 4 special
#: tokens; no dropout: a few minutes of CPU training underfit, and dropout would only slow
#: them); ``bert-base`` and ``bert-large`` are the published shapes (Devlin et al., 2019).
BERT_PRESETS = {
    "nano": BertConfig(vocab_size=64, max_len=16, n_layers=2, n_heads=2, d_model=16, d_ff=32),
    "small": BertConfig(
        vocab_size=1028, max_len=64, n_layers=2, n_heads=2, d_model=64, d_ff=256, dropout=0.0
    ),
    "bert-base": BertConfig(vocab_size=30522, max_len=512, n_layers=12, n_heads=12, d_model=768, d_ff=3072),
    "bert-large": BertConfig(vocab_size=30522, max_len=512, n_layers=24, n_heads=16, d_model=1024, d_ff=4096),
}


@dataclass(frozen=True)
class SpecialTokens:
    """The ids of BERT's four special tokens.

    ``[PAD]`` fills short sequences, ``[CLS]`` starts every sequence (its output feeds the
    classifier), ``[SEP]`` ends a segment, ``[MASK]`` replaces a token to predict.
    Example: ``SpecialTokens.after(1024) -> SpecialTokens(pad=1024, cls=1025, sep=1026, mask=1027)``.
    """

    pad: int
    cls: int
    sep: int
    mask: int

    NAMES = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")

    def __post_init__(self):
        if any(not isinstance(i, int) or i < 0 for i in self.ids) or len(set(self.ids)) != 4:
            raise ValueError(f"special token ids must be four distinct non-negative integers, got {self.ids}")

    @classmethod
    def after(cls, base_vocab_size: int) -> SpecialTokens:
        """The four ids that follow a base vocabulary of ``base_vocab_size`` tokens."""
        return cls(*range(base_vocab_size, base_vocab_size + 4))

    @property
    def ids(self) -> tuple[int, int, int, int]:
        return (self.pad, self.cls, self.sep, self.mask)

    def name(self, i: int) -> str | None:
        """``"[MASK]"`` for the mask id, and so on; ``None`` for an ordinary token."""
        return dict(zip(self.ids, self.NAMES)).get(int(i))


# --------------------------------------------------------------------------- the model


class BertEmbeddings(nn.Module):
    """Token + learned position + segment embeddings, then layer norm and dropout.

    ``x[b, t] = norm(token[ids[b, t]] + position[t] + segment[token_type_ids[b, t]])``.

    Args:
        vocab_size: ``V``.
        max_len: learned positions; inputs may have up to this many tokens.
        d_model: ``C``.
        n_segments: segment embeddings.
        dropout: applied after the norm.
        eps: the norm's epsilon.

    Submodules: ``token`` ``(V, C)``, ``position`` ``(max_len, C)``, ``segment``
    ``(n_segments, C)`` (each an ``nn.Embedding``), ``norm`` (``LayerNorm(C, eps)``),
    ``dropout`` (``nn.Dropout(dropout)``).

    Raises:
        ValueError: the input has more than ``max_len`` tokens (the message names both numbers).
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        d_model: int,
        n_segments: int = 2,
        dropout: float = 0.1,
        eps: float = 1e-12,
    ):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(n_segments, d_model)
        self.norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, T)`` token ids (and segment ids, default all 0) -> ``(B, T, C)``."""
        T = input_ids.shape[1]
        if T > self.position.num_embeddings:
            raise ValueError(
                f"the input has {T} tokens but the model has {self.position.num_embeddings} positions"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)  # (B, T): one segment
        positions = torch.arange(T, device=input_ids.device)  # (T,), broadcast over the batch
        x = self.token(input_ids) + self.position(positions) + self.segment(token_type_ids)  # (B, T, C)
        return self.dropout(self.norm(x))


class Bert(nn.Module):
    """The BERT encoder: :class:`BertEmbeddings` then ``L`` post-norm encoder layers.

    Args:
        config: a :class:`BertConfig`.

    Submodules: ``embeddings`` and ``encoder`` (a :class:`coursekit.layers.Encoder`).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        c = self.config = config
        self.embeddings = BertEmbeddings(c.vocab_size, c.max_len, c.d_model, c.n_segments, c.dropout, c.eps)
        self.encoder = Encoder(
            c.n_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.activation, norm_first=False, eps=c.eps
        )
        for layer in self.encoder.layers:
            layer.ff.dropout = (
                nn.Identity()
            )  # BERT drops a sub-layer's output, not the feed-forward's hidden units
        _init_weights(self, c.init_std)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encode a batch.

        Args:
            input_ids: ``(B, T)`` ``torch.long``, ``T <= max_len``.
            attention_mask: ``(B, T)`` boolean, ``True`` at real tokens (padding is never
                attended to); ``None``: every token is real.
            token_type_ids: ``(B, T)`` segment ids; ``None``: all 0.

        Returns:
            ``(B, T, C)``; outputs at padding positions are computed but meaningless.
        """
        _check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, C)
        return self.encoder(x, key_padding_mask=attention_mask)  # (B, T, C)


def _check_inputs(c: BertConfig, input_ids, attention_mask, token_type_ids) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        got = (
            f"{input_ids.dtype} {tuple(input_ids.shape)}"
            if isinstance(input_ids, torch.Tensor)
            else type(input_ids).__name__
        )
        raise ValueError(f"input_ids must be a (B, T) torch.long tensor, got {got}")
    if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= c.vocab_size):
        raise ValueError(
            f"token ids must be in [0, {c.vocab_size}), got {int(input_ids.min())}..{int(input_ids.max())}"
        )
    if input_ids.shape[1] > c.max_len:
        raise ValueError(f"the input has {input_ids.shape[1]} tokens but the model has {c.max_len} positions")
    if attention_mask is not None and (
        attention_mask.dtype != torch.bool or attention_mask.shape != input_ids.shape
    ):
        raise ValueError(
            f"attention_mask must be a boolean {tuple(input_ids.shape)} tensor (True = real token), got "
            f"{attention_mask.dtype} {tuple(attention_mask.shape)}; convert a 0/1 mask with mask.bool()"
        )
    if token_type_ids is not None:
        if token_type_ids.shape != input_ids.shape or token_type_ids.dtype != torch.long:
            raise ValueError(
                f"token_type_ids must be a torch.long {tuple(input_ids.shape)} tensor, got "
                f"{token_type_ids.dtype} {tuple(token_type_ids.shape)}"
            )
        if token_type_ids.numel() and (token_type_ids.min() < 0 or token_type_ids.max() >= c.n_segments):
            raise ValueError(
                f"segment ids must be in [0, {c.n_segments}), got up to {int(token_type_ids.max())}"
            )


def _init_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: weights of linear layers and embeddings ~ N(0, std^2), biases 0."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class MLMHead(nn.Module):
    """BERT's MLM head: ``norm(act(dense(h))) @ E^T + bias`` with ``E`` the token embedding.

    Submodules: ``dense`` (``C -> C``), ``act``, ``norm``; parameter ``bias`` ``(V,)``.
    """

    def __init__(self, d_model: int, vocab_size: int, activation: str = "gelu", eps: float = 1e-12):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = ACTIVATIONS[activation]()
        self.norm = LayerNorm(d_model, eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, h: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``h (B, T, C)`` and the token embedding ``(V, C)`` -> logits ``(B, T, V)``."""
        return F.linear(self.norm(self.act(self.dense(h))), embedding, self.bias)  # (B, T, V)


class BertForMaskedLM(nn.Module):
    """:class:`Bert` with the MLM head; the output layer is tied to the token embedding.

    Submodules: ``bert`` and ``mlm`` (an :class:`MLMHead`).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = Bert(config)
        self.mlm = MLMHead(config.d_model, config.vocab_size, config.activation, config.eps)
        _init_weights(self.mlm, config.init_std)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, T, V)`` for every position; the arguments as :meth:`Bert.forward`."""
        h = self.bert(input_ids, attention_mask, token_type_ids)  # (B, T, C)
        return self.mlm(h, self.bert.embeddings.token.weight)  # (B, T, V)


class ClsHead(nn.Module):
    """Sequence classification from the ``[CLS]`` position (position 0).

    ``logits = classifier(dropout(tanh(pooler(h[:, 0]))))``: the pooler is BERT's dense +
    tanh layer, then a linear layer to ``K`` classes.

    Args:
        d_model: ``C``.
        n_classes: ``K``.
        dropout: before the classifier, in training mode.

    Submodules: ``pooler`` (``C -> C``), ``dropout`` (``nn.Dropout(dropout)``), ``classifier`` (``C -> K``).
    """

    def __init__(self, d_model: int, n_classes: int, dropout: float = 0.1):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(B, T, C)`` encoder outputs -> ``(B, K)`` logits."""
        pooled = torch.tanh(self.pooler(hidden[:, 0]))  # (B, C): the [CLS] position only
        return self.classifier(self.dropout(pooled))  # (B, K)


class BertClassifier(nn.Module):
    """:class:`Bert` with a :class:`ClsHead`; submodules ``bert`` and ``head``.

    Args:
        config: the encoder's shape.
        n_classes: ``K``.
        dropout: of the head (default ``config.dropout``).
    """

    def __init__(self, config: BertConfig, n_classes: int, dropout: float | None = None):
        super().__init__()
        self.config = config
        self.bert = Bert(config)
        self.head = ClsHead(config.d_model, n_classes, config.dropout if dropout is None else dropout)
        _init_weights(self.head, config.init_std)

    @classmethod
    def from_bert(cls, bert: Bert, n_classes: int, dropout: float | None = None) -> BertClassifier:
        """A classifier whose encoder starts as a copy of ``bert`` (the head is new)."""
        model = cls(bert.config, n_classes, dropout)
        model.bert.load_state_dict(bert.state_dict())
        return model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, K)``; the arguments as :meth:`Bert.forward`."""
        return self.head(self.bert(input_ids, attention_mask, token_type_ids))


def bert_params(config: BertConfig, head: str = "mlm", n_classes: int = 2) -> int:
    """Exact parameter count: embeddings, ``L (12 C^2 + 13 C)`` (at ``d_ff = 4 C``), a head.

    Args:
        config: the shape.
        head: ``"mlm"`` (dense, norm and output bias; the output matrix is the tied
            embedding), ``"pooler"`` (dense ``C -> C``: Hugging Face's ``BertModel``, the
            count papers report), ``"classifier"`` (pooler plus ``C -> K``) or ``"none"``.
        n_classes: ``K``, for ``head="classifier"``.

    Example: ``bert_params(BERT_PRESETS["bert-base"], "pooler")`` is 109,482,240 ("110M").
    """
    c = config
    embeddings = (c.vocab_size + c.max_len + c.n_segments) * c.d_model + layer_norm_params(c.d_model)
    layers = c.n_layers * encoder_layer_params(c.d_model, c.d_ff)
    pooler = c.d_model * c.d_model + c.d_model
    heads = {
        "mlm": pooler + layer_norm_params(c.d_model) + c.vocab_size,
        "pooler": pooler,
        "classifier": pooler + (c.d_model + 1) * n_classes,
        "none": 0,
    }
    if head not in heads:
        raise ValueError(f"head must be one of {sorted(heads)}, got {head!r}")
    return embeddings + layers + heads[head]


# --------------------------------------------------------------------------- question answering


class SpanHead(nn.Module):
    """Extractive question answering: a start and an end logit for every token.

    One linear layer ``C -> 2`` (Hugging Face's ``qa_outputs``): row 0 of its weight is
    BERT's start vector ``S`` and row 1 its end vector ``E`` (Devlin et al., 2019), so
    ``start[b, t] = S . h[b, t] + bias_0`` and ``end[b, t] = E . h[b, t] + bias_1``.
    The biases shift every start (or end) logit alike and change no span's rank.

    Args:
        d_model: ``C``.

    Submodules: ``qa_outputs`` (``C -> 2``).
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.qa_outputs = nn.Linear(d_model, 2)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, T, C)`` encoder outputs -> start logits ``(B, T)`` and end logits ``(B, T)``."""
        C = self.qa_outputs.in_features
        if hidden.dim() != 3 or hidden.shape[-1] != C:
            raise ValueError(f"hidden must be (B, T, C) with C = {C}, got {tuple(hidden.shape)}")
        logits = self.qa_outputs(hidden)  # (B, T, 2)
        return logits[..., 0], logits[..., 1]  # (B, T), (B, T)


class BertForQuestionAnswering(nn.Module):
    """:class:`Bert` with a :class:`SpanHead`; submodules ``bert`` and ``head``.

    The input is ``[CLS] question [SEP] context [SEP]`` (:func:`pack_pairs`, segment ids 0
    then 1); :func:`best_span` turns the two logits into an answer.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = Bert(config)
        self.head = SpanHead(config.d_model)
        _init_weights(self.head, config.init_std)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits, ``(B, T)`` each; the arguments as :meth:`Bert.forward`."""
        return self.head(self.bert(input_ids, attention_mask, token_type_ids))


def best_span(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    max_len: int,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The answer span ``(i, j)`` with the highest ``start[i] + end[j]``.

    A span is valid if ``i <= j``, it has at most ``max_len`` tokens (``j - i < max_len``)
    and every token from ``i`` to ``j`` is allowed (for ``[CLS] question [SEP] context
    [SEP]``: the context tokens). Ties go to the smallest ``i``, then the smallest ``j``.

    Example: start ``[0, 3, 1]``, end ``[2, 0, 1]``, ``max_len=3`` -> ``(1, 2)``, score 4
    (``(1, 0)`` would score 5 but ends before it starts).

    Args:
        start_logits: ``(B, T)``, finite.
        end_logits: ``(B, T)``, finite.
        max_len: the longest answer, in tokens (at least 1).
        allowed: ``(B, T)`` boolean, ``True`` where an answer may lie; ``None`` allows every
            position.

    Returns:
        ``(start, end, score)``, ``(B,)`` each: the first and last token of each row's best
        span (inclusive, ``torch.long``) and its score ``start[i] + end[j]``.

    Raises:
        ValueError: logits of different shapes, not ``(B, T)`` floats, or not finite; a
            ``max_len`` below 1; an ``allowed`` that is not a boolean ``(B, T)`` tensor; a row
            with no allowed position.
    """
    if start_logits.shape != end_logits.shape or start_logits.dim() != 2:
        raise ValueError(
            "start_logits and end_logits must both be (B, T), got "
            f"{tuple(start_logits.shape)} and {tuple(end_logits.shape)}"
        )
    if not (start_logits.is_floating_point() and end_logits.is_floating_point()):
        raise ValueError(f"logits must be floating point, got {start_logits.dtype} and {end_logits.dtype}")
    if not (torch.isfinite(start_logits).all() and torch.isfinite(end_logits).all()):
        raise ValueError("logits must be finite: mark forbidden positions with allowed, not with -inf or NaN")
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
    B, T = start_logits.shape
    if allowed is None:
        allowed = torch.ones(B, T, dtype=torch.bool, device=start_logits.device)
    if allowed.dtype != torch.bool or allowed.shape != (B, T):
        raise ValueError(
            f"allowed must be a boolean {(B, T)} tensor (True = may be in the answer), "
            f"got {allowed.dtype} {tuple(allowed.shape)}"
        )
    empty = ~allowed.any(1)
    if empty.any():
        raise ValueError(f"row {int(empty.nonzero()[0])} allows no position, so it has no span")

    pos = torch.arange(T, device=start_logits.device)
    length = pos[None, :] - pos[:, None] + 1  # (T, T): j - i + 1 for start i (row) and end j (column)
    blocked = torch.cumsum(~allowed, dim=1)  # (B, T): forbidden positions among 0..t
    clean = (blocked[:, None, :] == blocked[:, :, None]) & allowed[:, :, None]  # (B, T, T): none in i..j
    valid = clean & (length >= 1) & (length <= max_len)  # (B, T, T)
    scores = start_logits[:, :, None] + end_logits[:, None, :]  # (B, T, T): start i + end j
    scores = scores.masked_fill(~valid, float("-inf")).view(B, T * T)
    best = scores.max(1).values  # (B,)
    flat = torch.where(scores == best[:, None], torch.arange(T * T, device=scores.device), T * T)
    first = flat.min(1).values  # (B,): the first best span in (i, j) order
    return first // T, first % T, best


# --------------------------------------------------------------------------- masked language modelling


def mask_tokens(
    input_ids: torch.Tensor,
    special: SpecialTokens,
    vocab_size: int,
    generator: torch.Generator,
    mlm_probability: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: choose positions to predict and corrupt them 80/10/10.

    Each position that is not a special token is selected with probability
    ``mlm_probability``. A selected position becomes ``[MASK]`` with probability 0.8, a
    random ordinary (non-special) token with probability 0.1, and keeps its token with
    probability 0.1. Example: ``[CLS] a b c [SEP]`` may become ``[CLS] a [MASK] c [SEP]``
    with labels ``-100 -100 b -100 -100``.

    Args:
        input_ids: ``(B, T)`` ``torch.long`` token ids in ``[0, vocab_size)``.
        special: the special tokens; they are never selected.
        vocab_size: ``V``; random tokens are drawn uniformly from the ordinary ids in ``[0, V)``.
        generator: the source of every random choice (the global state is not used).
        mlm_probability: the selection rate.

    Returns:
        ``(inputs, labels)``, both ``(B, T)`` ``torch.long``: the corrupted ids, and the
        original id at selected positions with ``-100`` everywhere else.
    """
    is_special = torch.isin(input_ids, torch.tensor(special.ids))  # (B, T)
    selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special  # (B, T)
    labels = torch.where(selected, input_ids, -100)  # (B, T)
    action = torch.rand(input_ids.shape, generator=generator)  # (B, T): < 0.8 mask, < 0.9 random, else keep
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])  # (V - 4,)
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]  # (B, T)
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)  # (B, T)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)  # (B, T)
    return inputs, labels


def mask_whole_words(
    input_ids: torch.Tensor,
    word_ids: torch.Tensor,
    special: SpecialTokens,
    vocab_size: int,
    generator: torch.Generator,
    mlm_probability: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-word masking: choose *words* to predict, then corrupt each of their tokens 80/10/10.

    The BERT authors' 2019 whole-word-masking release: a word cut into several WordPiece
    tokens is predicted all at once or not at all, so the model cannot fill in ``##ing`` from
    the visible ``play``. Each word of each row is selected with probability
    ``mlm_probability``, independently (word ``w`` of row 0 and word ``w`` of row 1 are two
    words); every token of a selected word is selected, and each selected token, on its own,
    becomes ``[MASK]`` with probability 0.8, a random ordinary token with probability 0.1, and
    keeps its id with probability 0.1, as in :func:`mask_tokens`. Example: ``[CLS] play ##ing
    now [SEP]`` with word ids ``-1 0 0 1 -1`` may become ``[CLS] [MASK] [MASK] now [SEP]`` with
    labels ``-100 play ##ing -100 -100``.

    Args:
        input_ids: ``(B, T)`` ``torch.long`` token ids in ``[0, vocab_size)``, not modified.
        word_ids: ``(B, T)`` integer tensor: the index of each token's word within its row
            (tokens of one word share it; indices need not be contiguous), ``-1`` exactly at
            the special tokens, as Hugging Face's ``word_ids()`` gives ``None`` there.
        special: the special tokens; they are never selected.
        vocab_size: ``V``; random tokens are drawn uniformly from the ordinary ids in ``[0, V)``.
        generator: the source of every random choice (the global state is not used).
        mlm_probability: the probability of selecting each word, in ``[0, 1]``.

    Returns:
        ``(inputs, labels)``, both ``(B, T)`` ``torch.long``: the corrupted ids, and the
        original id at selected positions with ``-100`` everywhere else.

    Raises:
        ValueError: ``input_ids`` is not 2-D, ``word_ids`` has another shape, ``word_ids`` is
            ``-1`` at an ordinary token or not ``-1`` at a special token, or
            ``mlm_probability`` is outside ``[0, 1]``.

    Example:
        >>> special = SpecialTokens(pad=40, cls=41, sep=42, mask=43)
        >>> ids = torch.tensor([[41, 7, 8, 9, 42]])
        >>> words = torch.tensor([[-1, 0, 0, 1, -1]])
        >>> inputs, labels = mask_whole_words(ids, words, special, 44, torch.Generator().manual_seed(0), 1.0)
        >>> labels.tolist()
        [[-100, 7, 8, 9, -100]]
    """
    if input_ids.dim() != 2 or word_ids.shape != input_ids.shape:
        raise ValueError(
            f"input_ids must be (B, T) and word_ids of the same shape, got input_ids {tuple(input_ids.shape)} "
            f"and word_ids {tuple(word_ids.shape)}"
        )
    if not 0 <= mlm_probability <= 1:
        raise ValueError(f"mlm_probability must be in [0, 1], got {mlm_probability}")
    is_special = torch.isin(input_ids, torch.tensor(special.ids))  # (B, T)
    if not torch.equal(word_ids < 0, is_special):
        raise ValueError(
            "word_ids must be -1 exactly at the special tokens and a word index >= 0 at every ordinary token, "
            f"got word_ids {word_ids.tolist()} for input_ids {input_ids.tolist()}"
        )
    B, T = input_ids.shape
    n_words = int(word_ids.max()) + 1 if word_ids.numel() else 1
    chosen = torch.rand((B, max(n_words, 1)), generator=generator) < mlm_probability  # (B, W): per word
    selected = chosen.gather(1, word_ids.long().clamp(min=0)) & ~is_special  # (B, T)
    labels = torch.where(selected, input_ids, -100)  # (B, T)
    action = torch.rand(input_ids.shape, generator=generator)  # (B, T): < 0.8 mask, < 0.9 random, else keep
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])  # (V - 4,)
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]  # (B, T)
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)  # (B, T)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)  # (B, T)
    return inputs, labels


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the selected positions (labels ``!= -100``) only.

    Args:
        logits: ``(..., V)``.
        labels: ``logits.shape[:-1]``, ``torch.long``: a target id or ``-100`` (ignored).

    Returns:
        A scalar of the logits' dtype: the mean over selected positions of
        ``-log softmax(logits)[label]``, computed stably for large logits.

    Raises:
        ValueError: the shapes do not fit (the message names both), or no position is
            selected (the mean of nothing would be NaN).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels must have the shape of logits without its last axis, {tuple(logits.shape[:-1])}, "
            f"got {tuple(labels.shape)}"
        )
    if not (labels != -100).any():
        raise ValueError("no position is selected (every label is -100): there is nothing to predict")
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)  # (N, V), (N,)


def corrupted_fraction(
    input_ids: torch.Tensor,
    special: SpecialTokens,
    vocab_size: int,
    generator: torch.Generator,
    mlm_probability: float = 0.15,
) -> float:
    """Measure the share of ordinary tokens that :func:`mask_tokens` actually changes.

    Runs :func:`mask_tokens` once on ``input_ids`` and counts the ordinary (non-special)
    positions whose id in the corrupted ``inputs`` differs from the original. A selected token
    that is kept, or replaced by a random token that happens to be itself, is not changed, so
    the expectation is ``mlm_probability * (0.8 + 0.1 * (1 - 1 / n))`` with ``n`` ordinary ids
    in the vocabulary: about 13.5% at the default 15%, not 15%.

    Args:
        input_ids: ``(B, T)`` ``torch.long`` token ids in ``[0, vocab_size)``, not modified.
        special: the special tokens; they are never selected, and do not count.
        vocab_size: ``V``, passed on to :func:`mask_tokens`.
        generator: the source of every random choice (the same seed gives the same result).
        mlm_probability: the selection rate, passed on to :func:`mask_tokens`.

    Returns:
        The fraction (changed ordinary positions) / (ordinary positions), a Python ``float``.

    Raises:
        ValueError: ``input_ids`` holds no ordinary token (the fraction would be 0 / 0).

    Example:
        On 30,000 ordinary tokens of a vocabulary of 1,028 ids, ``corrupted_fraction(ids,
        SpecialTokens.after(1024), 1028, torch.Generator().manual_seed(0))`` is about 0.135.
    """
    ordinary = ~torch.isin(input_ids, torch.tensor(special.ids))  # (B, T)
    if not ordinary.any():
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} holds no ordinary token: nothing can be corrupted"
        )
    inputs, _ = mask_tokens(input_ids, special, vocab_size, generator, mlm_probability)  # (B, T)
    changed = (inputs != input_ids) & ordinary  # (B, T)
    return (changed.sum() / ordinary.sum()).item()


# --------------------------------------------------------------------------- sentence pairs


def pack_pairs(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], special: SpecialTokens, length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack segment pairs as ``[CLS] a [SEP] b [SEP] [PAD]...`` with their segment ids.

    The segment (token type) id is 0 for ``[CLS]``, ``a`` and the first ``[SEP]``, 1 for ``b``
    and the second ``[SEP]``, and 0 at padding, as Hugging Face's BERT tokenizers give them.
    Example: ``a = [7, 8]``, ``b = [9]`` -> ids ``[CLS] 7 8 [SEP] 9 [SEP]``, segments
    ``0 0 0 0 1 1``.

    Args:
        pairs: ``N`` pairs ``(a, b)`` of token id sequences (further items, such as a label,
            are ignored), each segment at least one token.
        special: the special tokens.
        length: ``T``, the padded length; default the longest packed pair.

    Returns:
        ``(input_ids, attention_mask, token_type_ids)``, each ``(N, T)``: ``torch.long`` ids,
        a boolean mask (``True`` at real tokens) and ``torch.long`` segment ids.

    Raises:
        ValueError: no pair, an empty segment, or a pair longer than ``length`` once packed.
    """
    if not pairs:
        raise ValueError("pack_pairs needs at least one pair, got none")
    rows = []
    for i, (a, b, *_) in enumerate(pairs):
        if len(a) == 0 or len(b) == 0:
            raise ValueError(f"pair {i} has an empty segment (lengths {len(a)} and {len(b)})")
        rows.append(([special.cls, *a, special.sep, *b, special.sep], len(a) + 2))
    longest = max(len(r) for r, _ in rows)
    T = longest if length is None else length
    if longest > T:
        raise ValueError(f"a pair needs {longest} tokens packed ([CLS] a [SEP] b [SEP]) but length is {T}")
    input_ids = torch.full((len(rows), T), special.pad, dtype=torch.long)  # (N, T)
    token_type_ids = torch.zeros((len(rows), T), dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((len(rows), T), dtype=torch.bool)  # (N, T)
    for i, (row, first) in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        token_type_ids[i, first : len(row)] = 1  # b and its [SEP]
        attention_mask[i, : len(row)] = True
    return input_ids, attention_mask, token_type_ids


def _coin(generator: torch.Generator) -> bool:
    """A fair coin from ``generator``."""
    return bool(torch.rand((), generator=generator) < 0.5)


def _check_documents(documents) -> None:
    for d, segments in enumerate(documents):
        if any(len(s) == 0 for s in segments):
            raise ValueError(f"document {d} has an empty segment")


def nsp_pairs(
    documents: Sequence[Sequence[Sequence[int]]], generator: torch.Generator
) -> list[tuple[Sequence[int], Sequence[int], int]]:
    """Next-sentence prediction pairs (Devlin et al., 2019): is ``b`` the segment after ``a``?

    Each document's segments are taken two at a time, ``(s0, s1), (s2, s3), ...`` (an odd last
    segment is left out), so each segment is used once. For each pair a fair coin decides: label
    1 keeps ``(s_2j, s_2j+1)``; label 0 replaces ``s_2j+1`` by a random segment of *another*
    document (a document drawn uniformly among the others that have segments, then one of its
    segments uniformly), as BERT's data builder did.
    Example: documents ``[[a0, a1], [c0, c1]]`` may give ``[(a0, a1, 1), (c0, a1, 0)]``.

    Args:
        documents: each a list of consecutive segments (token id sequences, none empty).
        generator: the source of every coin and draw.

    Returns:
        ``(a, b, label)`` triples, document by document, the segments themselves (not copies).

    Raises:
        ValueError: an empty segment, or a pair with no other document to draw from.
    """
    _check_documents(documents)
    out = []
    for d, segments in enumerate(documents):
        others = [o for o, s in enumerate(documents) if o != d and len(s) > 0]
        for j in range(0, len(segments) - 1, 2):
            if _coin(generator):
                out.append((segments[j], segments[j + 1], 1))
                continue
            if not others:
                raise ValueError(f"document {d} needs another document with segments for its random pairs")
            o = others[int(torch.randint(len(others), (), generator=generator))]
            b = documents[o][int(torch.randint(len(documents[o]), (), generator=generator))]
            out.append((segments[j], b, 0))
    return out


def sop_pairs(
    documents: Sequence[Sequence[Sequence[int]]], generator: torch.Generator
) -> list[tuple[Sequence[int], Sequence[int], int]]:
    """Sentence-order prediction pairs (ALBERT; Lan et al., 2020): are two neighbours in order?

    Each document's segments are taken two at a time, ``(s0, s1), (s2, s3), ...`` (an odd last
    segment is left out); a fair coin keeps a pair in order (label 1) or swaps it (label 0).
    Both segments always come from the same place in the same document, so only their order
    tells the labels apart. Example: ``[[a0, a1, a2, a3]]`` may give ``[(a0, a1, 1), (a3, a2, 0)]``.

    Args:
        documents: each a list of consecutive segments (token id sequences, none empty).
        generator: the source of every coin.

    Returns:
        ``(a, b, label)`` triples, document by document, the segments themselves (not copies).

    Raises:
        ValueError: an empty segment.
    """
    _check_documents(documents)
    out = []
    for segments in documents:
        for j in range(0, len(segments) - 1, 2):
            first, second = segments[j], segments[j + 1]
            out.append((first, second, 1) if _coin(generator) else (second, first, 0))
    return out


# --------------------------------------------------------------------------- Hugging Face weights

#: Our parameter name -> Hugging Face's, for ``BertForMaskedLM`` (``mlm.*``),
#: ``BertForSequenceClassification`` and ``BertForQuestionAnswering`` (``head.*``); ``{i}`` is a
#: layer index. Not a rename: our ``self_attn.qkv_proj`` rows are HF's ``attention.self.query``, ``key``, ``value``
#: stacked, and HF's ``cls.predictions.decoder`` is the tied token embedding and ``mlm.bias``.
HF_NAMES = {
    "bert.embeddings.token.weight": "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.position.weight": "bert.embeddings.position_embeddings.weight",
    "bert.embeddings.segment.weight": "bert.embeddings.token_type_embeddings.weight",
    "bert.embeddings.norm.{p}": "bert.embeddings.LayerNorm.{p}",
    "bert.encoder.layers.{i}.self_attn.out_proj.{p}": "bert.encoder.layer.{i}.attention.output.dense.{p}",
    "bert.encoder.layers.{i}.norm1.{p}": "bert.encoder.layer.{i}.attention.output.LayerNorm.{p}",
    "bert.encoder.layers.{i}.ff.linear1.{p}": "bert.encoder.layer.{i}.intermediate.dense.{p}",
    "bert.encoder.layers.{i}.ff.linear2.{p}": "bert.encoder.layer.{i}.output.dense.{p}",
    "bert.encoder.layers.{i}.norm2.{p}": "bert.encoder.layer.{i}.output.LayerNorm.{p}",
    "mlm.dense.{p}": "cls.predictions.transform.dense.{p}",
    "mlm.norm.{p}": "cls.predictions.transform.LayerNorm.{p}",
    "mlm.bias": "cls.predictions.bias",
    "head.pooler.{p}": "bert.pooler.dense.{p}",
    "head.classifier.{p}": "classifier.{p}",
    "head.qa_outputs.{p}": "qa_outputs.{p}",
}
_NAMES = NameTable(
    HF_NAMES,
    our_qkv="bert.encoder.layers.{i}.self_attn.qkv_proj.{p}",
    hf_qkv="bert.encoder.layer.{i}.attention.self.{part}.{p}",
    parts=("query", "key", "value"),
)
_HF_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


def to_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our :class:`BertForMaskedLM`, :class:`BertClassifier` or :class:`BertForQuestionAnswering`
    weights with Hugging Face's names.

    ``qkv_proj`` is cut into ``query``, ``key`` and ``value`` (``C`` rows each); an MLM
    model also gets ``cls.predictions.decoder.weight`` (the token embedding) and
    ``cls.predictions.decoder.bias`` (``mlm.bias``), as HF's state dict lists them.
    """
    out = {}
    for key, value in state_dict.items():
        out.update(_NAMES.to_hf(key, value, "BertForMaskedLM, BertClassifier or BertForQuestionAnswering"))
    if "mlm.bias" in state_dict:
        out["cls.predictions.decoder.weight"] = state_dict["bert.embeddings.token.weight"]
        out["cls.predictions.decoder.bias"] = state_dict["mlm.bias"]
    return out


def from_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face ``BertForMaskedLM`` / ``BertForSequenceClassification`` /
    ``BertForQuestionAnswering`` weights with our names.

    Raises:
        ValueError: an unknown key, a layer without all of query/key/value, or a decoder
            that is not tied to the token embedding.
    """
    out, qkv = {}, {}
    for key, value in state_dict.items():
        if key in _HF_BUFFERS or _NAMES.collect_qkv(key, value, qkv):
            continue
        if key == "cls.predictions.decoder.weight":
            emb = state_dict.get("bert.embeddings.word_embeddings.weight")
            if emb is None or not torch.equal(value, emb):
                raise ValueError(
                    "cls.predictions.decoder.weight differs from the word embeddings: ours are tied"
                )
        elif key == "cls.predictions.decoder.bias":
            if not torch.equal(value, state_dict.get("cls.predictions.bias", value + 1)):
                raise ValueError("cls.predictions.decoder.bias differs from cls.predictions.bias")
        else:
            name = _NAMES.our_name(key)
            if name is None:
                raise ValueError(
                    f"unexpected Hugging Face key {key!r} (BertForMaskedLM, "
                    "BertForSequenceClassification and BertForQuestionAnswering are supported)"
                )
            out[name] = value
    out.update(_NAMES.join_qkv(qkv))
    return out

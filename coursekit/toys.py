"""Toy models for testing decoders on examples small enough to work out by hand.

:class:`TableLM` is a language model whose next-token distribution is a row of a table: the
notebook of Exercise 7 imports it to test a beam search, and its grader
(:mod:`coursekit.grading.ch07_gpt`, which re-exports it for notebooks released before it moved here)
builds its test cases from it. It follows the language-model protocol of :mod:`coursekit.decoding`,
like :class:`coursekit.gpt.GPT`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["TableCache", "TableLM", "TableLMConfig", "table_logp"]


@dataclass(frozen=True)
class TableLMConfig:
    vocab_size: int
    block_size: int


class TableCache:
    """The cache of a :class:`TableLM`: it keeps the last token of each cached sequence (all a
    ``(V, V, V)`` table needs), and checks that it is used as a KV cache must be: each call feeds
    one row per cached sequence (``reorder`` changes which and how many), and at most ``max_len``
    positions fit."""

    def __init__(self, batch_size: int, max_len: int):
        self.batch_size, self.max_len, self.length = batch_size, max_len, 0
        self.last: torch.Tensor | None = None  # (N,): each row's last token, once something is cached

    def reorder(self, index) -> None:
        """Keep rows ``index`` (a 1-D integer tensor or list), as :meth:`coursekit.gpt.KVCache.reorder`."""
        index = torch.as_tensor(index)
        if index.dim() != 1 or index.dtype not in (torch.int64, torch.int32) or index.numel() == 0:
            raise ValueError(
                f"reorder takes a non-empty 1-D tensor of row indices, got {index.dtype} {tuple(index.shape)}"
            )
        if int(index.min()) < 0 or int(index.max()) >= self.batch_size:
            raise ValueError(
                f"reorder index {index.tolist()} is out of range for a cache of {self.batch_size} rows"
            )
        self.batch_size = index.numel()
        if self.last is not None:
            self.last = self.last[index.long()]

    def check(self, batch_size: int, T: int) -> None:
        if batch_size != self.batch_size:
            raise ValueError(
                f"the cache holds {self.batch_size} sequences but the model got {batch_size}: "
                "reorder the cache (cache.reorder(index)) whenever the beams change"
            )
        if self.length + T > self.max_len:
            raise ValueError(
                f"the cache holds {self.max_len} positions; {self.length} are used and {T} more do not fit"
            )

    def extend(self, idx: torch.Tensor) -> None:
        self.length += idx.shape[1]
        self.last = idx[:, -1].clone()


class TableLM(nn.Module):
    """A toy language model for testing decoders: the next token depends on the last token (or two) only.

    With a ``(V, V)`` table, row ``a`` of ``logp`` holds ``log p(next token | last token = a)``,
    so a sequence's probability is a product of table entries and the best continuation
    can be worked out by hand. With a ``(V, V, V)`` table, ``logp[a, b]`` holds
    ``log p(next token | the two last tokens are a, b)`` (for a sequence's first token, ``a = b``):
    its cache then remembers each row's last token, so it must follow the beams as a GPT's does.
    It follows the language-model protocol of :mod:`coursekit.decoding`, like
    :class:`~coursekit.gpt.GPT`: ``model(idx, cache=cache)`` returns ``(B, T, V)`` log-probabilities
    used as logits, and ``init_cache(batch_size, max_len)`` an empty cache with ``length`` and
    ``reorder(index)``. The cache complains as a KV cache would: the number of rows fed must follow
    ``reorder``, and at most ``max_len`` positions fit.

    Args:
        logp: ``(V, V)`` or ``(V, V, V)`` log-probabilities (each row's ``exp`` sums to 1).
        block_size: the longest sequence, ``cfg.block_size``.

    Example: ``TableLM.from_probs(p)`` with ``p[0, 1] = 0.6, p[0, 2] = 0.4, p[1, 3] = 0.4,
    p[2, 3] = 0.9`` (and small numbers elsewhere): from token 0 greedy decoding picks
    ``1, 3`` (probability 0.24) but ``2, 3`` (0.36) is likelier.
    """

    def __init__(self, logp: torch.Tensor, block_size: int = 64):
        super().__init__()
        if logp.dim() not in (2, 3) or any(n != logp.shape[0] for n in logp.shape):
            raise ValueError(f"logp must be a (V, V) or (V, V, V) table, got {tuple(logp.shape)}")
        self.cfg = TableLMConfig(vocab_size=logp.shape[0], block_size=block_size)
        self.register_buffer("logp", logp.clone())  # (V, V) or (V, V, V): the last token (two) -> the next

    @classmethod
    def from_probs(cls, probs: torch.Tensor, block_size: int = 64) -> TableLM:
        """A table model from ``(V, V)`` or ``(V, V, V)`` probabilities (zeros become 1e-9; rows are renormalised)."""
        return cls(table_logp(probs), block_size)

    def init_cache(self, batch_size: int, max_len: int | None = None) -> TableCache:
        return TableCache(batch_size, self.cfg.block_size if max_len is None else max_len)

    def forward(self, idx: torch.Tensor, cache: TableCache | None = None) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, T, V)`` next-token logits (the table's rows)."""
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be (B, T) torch.long token ids, got {idx.dtype} {tuple(idx.shape)}")
        if cache is not None:
            cache.check(idx.shape[0], idx.shape[1])
        if self.logp.dim() == 2:
            out = self.logp[idx]  # (B, T, V)
        else:
            prev = torch.cat([idx[:, :1], idx[:, :-1]], dim=1)  # (B, T): the token before each one
            if cache is not None and cache.last is not None:
                prev[:, 0] = cache.last
            out = self.logp[prev, idx]  # (B, T, V)
        if cache is not None:
            cache.extend(idx)
        return out


def table_logp(p: torch.Tensor) -> torch.Tensor:
    """Float32 log-probabilities of ``(V, V)`` or ``(V, V, V)`` probabilities (zeros become 1e-9, rows renormalised)."""
    q = p.double().clamp_min(1e-9)
    return (q / q.sum(-1, keepdim=True)).log().float()

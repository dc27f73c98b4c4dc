"""Text data for the language-model chapters: corpora, tokenizers, token tensors and batches.

One pipeline, stated once and tested:

- **Text.** :func:`load_text` reads ``"python-docs"`` (the Python reference manual that
  ships with CPython, so nothing is downloaded) or any UTF-8 file of the user's.
- **Split.** :func:`split_text` keeps the first 90% of the *characters* for training and
  the last 10% for validation: one contiguous held-out block, never shuffled lines, so
  no validation sentence also appears in training.
- **Tokens.** Character level (:class:`CharTokenizer`, vocabulary = the sorted characters
  of the *whole* text, so validation has no unknown character) or byte-level BPE
  (:func:`bpe_tokenizer`, Chapter 5, trained on the training split only: bytes make
  every text encodable, so nothing is unknown either). Each split is encoded once to a
  1-D ``torch.long`` tensor (:func:`encode_text`); :func:`prepare` does all of this.
- **Batches.** :func:`lm_batch` cuts ``B`` random windows of ``T + 1`` tokens from a
  split: ``x`` is the first ``T``, ``y`` the last ``T`` (the next token at every
  position). :func:`eval_batches` draws a fixed list of such batches from a seed, so
  every evaluation of a run (and of a rerun) sees the same validation tokens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from coursekit import bpe
from coursekit._files import read_json, write_json
from coursekit.bpe import python_docs_text, read_text

__all__ = [
    "CORPORA",
    "CharTokenizer",
    "TokenData",
    "TokenizerLike",
    "bpe_tokenizer",
    "encode_text",
    "eval_batches",
    "lm_batch",
    "load_text",
    "prepare",
    "python_docs_text",
    "split_batches",
    "split_text",
]

#: Corpora that need no download, by name (see :func:`load_text`).
CORPORA: dict[str, Callable[[], str]] = {"python-docs": python_docs_text}
_FORMAT = "coursekit-char"
_VERSION = 1


class TokenizerLike(Protocol):
    """What the pipeline needs of a tokenizer: :class:`CharTokenizer` and :class:`coursekit.bpe.Tokenizer`."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


# --------------------------------------------------------------------------- text


def load_text(source: str | os.PathLike) -> str:
    """The text of a named corpus (``"python-docs"``) or of a user's UTF-8 file.

    Args:
        source: a key of :data:`CORPORA` or a path to a text file.

    Returns:
        The whole text as one string.

    Raises:
        FileNotFoundError: ``source`` is neither a corpus name nor an existing file.
        ValueError: the file is not UTF-8 or is empty.
    """
    if isinstance(source, str) and source in CORPORA:
        return CORPORA[source]()
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a corpus name or a path, got {type(source).__name__}")
    if not Path(source).is_file():
        raise FileNotFoundError(
            f"no such file: {os.fspath(source)!r}; pass a path to a UTF-8 text file "
            f"or one of the built-in corpora {sorted(CORPORA)}"
        )
    text = read_text(source)
    if not text:
        raise ValueError(f"{os.fspath(source)} is empty: a language model needs some text")
    return text


def split_text(text: str, train_fraction: float = 0.9) -> tuple[str, str]:
    """Split ``text`` by characters into its first ``train_fraction`` and the rest.

    The cut is at character ``int(train_fraction * len(text))``.
    Example: ``split_text("abcdefghij") -> ("abcdefghi", "j")``.

    Args:
        text: the whole corpus.
        train_fraction: share of the characters for training, strictly between 0 and 1.

    Returns:
        ``(train, val)`` with ``train + val == text``.
    """
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be strictly between 0 and 1, got {train_fraction}")
    cut = int(train_fraction * len(text))
    return text[:cut], text[cut:]


# --------------------------------------------------------------------------- tokenizers


class CharTokenizer:
    """Character-level tokenizer: token ``i`` is the ``i``-th character of the vocabulary.

    Example: ``CharTokenizer.from_text("hello")`` has the vocabulary ``e h l o``, and
    ``encode("hole") -> [1, 3, 2, 0]``.

    Args:
        chars: the vocabulary, distinct single characters, in id order.
    """

    def __init__(self, chars: Iterable[str]):
        self.chars: list[str] = list(chars)
        if not self.chars:
            raise ValueError("a CharTokenizer needs at least one character")
        for c in self.chars:
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(f"every vocabulary entry must be one character, got {c!r}")
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.chars)}
        if len(self.stoi) != len(self.chars):
            dupes = sorted({c for c in self.chars if self.chars.count(c) > 1})
            raise ValueError(f"vocabulary characters must be distinct, got repeats of {dupes}")
        self.itos: dict[int, str] = dict(enumerate(self.chars))

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is the sorted set of the characters of ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, one per character.

        Raises:
            ValueError: a character is not in the vocabulary (named, with its position).
        """
        stoi = self.stoi
        try:
            return [stoi[c] for c in text]
        except KeyError as e:
            c = e.args[0]
            raise ValueError(
                f"character {c!r} (U+{ord(c):04X}) at position {text.index(c)} is not in the "
                f"vocabulary of {len(self.chars)} characters: build the tokenizer from the whole corpus"
            ) from None

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """The text of ``ids`` (a list or a 1-D tensor); an id outside ``[0, V)`` is an error."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        itos = self.itos
        try:
            return "".join([itos[i] for i in ids])
        except KeyError as e:
            raise ValueError(f"unknown token id {e.args[0]} (vocabulary size {len(self.chars)})") from None

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vocabulary as JSON and return the path.

        Format, version 1: ``{"format": "coursekit-char", "version": 1, "chars": ["\\n", " ", ...]}``.
        """
        return write_json(path, {"format": _FORMAT, "version": _VERSION, "chars": self.chars})

    @classmethod
    def load(cls, path: str | os.PathLike) -> CharTokenizer:
        """Read a file written by :meth:`save`."""
        return cls(read_json(path, _FORMAT, _VERSION, "coursekit character tokenizer file")["chars"])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def bpe_tokenizer(text: str, vocab_size: int, pattern: str = "gpt4") -> bpe.Tokenizer:
    """Train the byte-level BPE tokenizer of Chapter 5 (:func:`coursekit.bpe.train`) on ``text``.

    Args:
        text: training text (pass the training split, so that validation stays unseen).
        vocab_size: total vocabulary, at least 256 (the bytes); training stops early,
            with a smaller vocabulary, when no pair of tokens repeats.
        pattern: pre-tokenization regex, ``"gpt2"``, ``"gpt4"`` or a pattern.

    Returns:
        A :class:`coursekit.bpe.Tokenizer` (``encode``, ``decode``, ``vocab_size``, ``save``).
    """
    return bpe.train(text, vocab_size, pattern)


# --------------------------------------------------------------------------- token tensors


def encode_text(tokenizer: TokenizerLike, text: str) -> torch.Tensor:
    """Encode ``text`` once into a 1-D ``torch.long`` tensor of ``N`` token ids."""
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)  # (N,)


@dataclass(frozen=True)
class TokenData:
    """A tokenized corpus: the tokenizer and the two splits as ``(N,)`` ``torch.long`` tensors."""

    tokenizer: TokenizerLike
    train: torch.Tensor
    val: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def prepare(
    source: str | os.PathLike = "python-docs",
    tokenizer: str = "char",
    vocab_size: int | None = None,
    train_fraction: float = 0.9,
) -> TokenData:
    """Load, split, tokenize and encode a corpus in one call.

    Args:
        source: ``"python-docs"`` or a path to a UTF-8 text file (see :func:`load_text`).
        tokenizer: ``"char"`` (vocabulary from the whole text) or ``"bpe"`` (trained on
            the training split).
        vocab_size: the BPE vocabulary size; required for ``"bpe"``, not allowed for ``"char"``.
        train_fraction: share of the characters for training (see :func:`split_text`).

    Returns:
        A :class:`TokenData` with ``train`` and ``val`` token tensors.
    """
    if tokenizer not in ("char", "bpe"):
        raise ValueError(f"tokenizer must be 'char' or 'bpe', got {tokenizer!r}")
    if tokenizer == "char" and vocab_size is not None:
        raise ValueError(
            f"a character tokenizer's vocabulary is the text's characters; got vocab_size={vocab_size}"
        )
    if tokenizer == "bpe" and vocab_size is None:
        raise ValueError("tokenizer='bpe' needs a vocab_size (256 bytes + the number of merges)")
    text = load_text(source)
    train_text, val_text = split_text(text, train_fraction)
    tok = CharTokenizer.from_text(text) if tokenizer == "char" else bpe_tokenizer(train_text, vocab_size)
    return TokenData(tok, encode_text(tok, train_text), encode_text(tok, val_text))


# --------------------------------------------------------------------------- batches


def _check_tokens(data: torch.Tensor, block_size: int, batch_size: int) -> None:
    if not isinstance(data, torch.Tensor) or data.dim() != 1 or data.dtype != torch.long:
        got = (
            f"{data.dtype} tensor of shape {tuple(data.shape)}"
            if isinstance(data, torch.Tensor)
            else type(data).__name__
        )
        raise ValueError(f"data must be a 1-D torch.long tensor of token ids, got {got}")
    if block_size < 1 or batch_size < 1:
        raise ValueError(f"block_size and batch_size must be at least 1, got {block_size} and {batch_size}")
    if data.numel() < block_size + 1:
        raise ValueError(
            f"data has {data.numel()} tokens, but a window needs block_size + 1 = {block_size + 1} "
            "(the inputs and their next tokens): use a smaller block_size or more text"
        )


def _windows(data: torch.Tensor, offsets: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    windows = data.unfold(0, block_size + 1, 1)  # (N - T, T + 1), a view: window i is data[i : i + T + 1]
    w = windows[offsets]  # (B, T + 1), copied
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()  # (B, T), (B, T)


def lm_batch(
    data: torch.Tensor, block_size: int, batch_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random windows and their next tokens, for next-token prediction.

    Offsets are drawn uniformly from every valid start ``0 .. N - T - 1`` with
    ``generator`` (the global random state is not touched). Example: with
    ``data = arange(10)``, ``T = 3`` and offset 4, ``x = [4, 5, 6]`` and ``y = [5, 6, 7]``.

    Args:
        data: ``(N,)`` token ids, ``torch.long``, ``N >= T + 1``.
        block_size: ``T``, the context length.
        batch_size: ``B``.
        generator: the source of the offsets.

    Returns:
        ``(x, y)``, both ``(B, T)`` ``torch.long``, with ``y[:, t] = data[offset + t + 1]``.
    """
    _check_tokens(data, block_size, batch_size)
    offsets = torch.randint(data.numel() - block_size, (batch_size,), generator=generator)  # (B,)
    return _windows(data, offsets, block_size)


def eval_batches(
    data: torch.Tensor, block_size: int, batch_size: int, n_batches: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of :func:`lm_batch` batches, drawn from a generator seeded with ``seed``.

    The same arguments always give the same batches, so losses measured at different
    steps (or in different runs) are measured on the same tokens.

    Args:
        data: ``(N,)`` token ids, ``torch.long``.
        block_size: ``T``.
        batch_size: ``B``.
        n_batches: how many batches.
        seed: seed of the private generator (the global random state is not touched).

    Returns:
        ``n_batches`` pairs ``(x, y)``, each ``(B, T)``.
    """
    if n_batches < 1:
        raise ValueError(f"n_batches must be at least 1, got {n_batches}")
    g = torch.Generator().manual_seed(seed)
    return [lm_batch(data, block_size, batch_size, g) for _ in range(n_batches)]


def split_batches(
    data: torch.Tensor, block_size: int, batch_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole split as consecutive, non-overlapping windows: every token predicted once.

    Windows start at ``0, T, 2T, ...``; the ``(N - 1) mod T`` tokens left at the end,
    fewer than one window, are not scored. Unlike :func:`eval_batches` nothing is sampled,
    so the loss over these batches is *the* loss on the split. Example: with
    ``data = arange(8)`` and ``T = 3``, the windows are ``x = [0, 1, 2], [3, 4, 5]`` with
    ``y = [1, 2, 3], [4, 5, 6]``.

    Args:
        data: ``(N,)`` token ids, ``torch.long``, ``N >= T + 1``.
        block_size: ``T``.
        batch_size: ``B``, windows per batch (the last batch may hold fewer).

    Returns:
        Pairs ``(x, y)``, each ``(b, T)`` with ``b <= B``; ``(N - 1) // T`` windows in all.
    """
    _check_tokens(data, block_size, batch_size)
    n = (data.numel() - 1) // block_size  # whole windows
    offsets = torch.arange(n) * block_size  # (n,)
    return [_windows(data, offsets[i : i + batch_size], block_size) for i in range(0, n, batch_size)]

"""Chapter 5: byte-level byte-pair encoding (BPE), trained incrementally, exact against tiktoken.

The base alphabet is the 256 byte values, so any text (any script, emoji, binary) is
encodable and nothing is ever unknown. Training repeatedly merges the most frequent
adjacent pair of tokens into a new token (Sennrich, Haddow & Birch, 2016, on top of
Gage's 1994 compression algorithm); byte-level BPE with regex pre-tokenization is the
GPT-2 recipe (Radford et al., 2019).

Rules, stated once and tested:

- **Pre-tokenization.** Text is first split into chunks by a regex (:data:`GPT2_PATTERN`
  or :data:`GPT4_PATTERN`); pairs never cross a chunk boundary.
- **Counting.** A pair's count is the number of places it occurs, summed over chunks.
  Inside a run of equal tokens (``a a a``) overlapping occurrences all count, as in
  minbpe and Hugging Face ``tokenizers``: ``aaa`` holds the pair ``(a, a)`` twice.
- **Merging** a pair in a chunk replaces its occurrences left to right without overlap:
  ``a a a -> (aa) a``.
- **Tie-break.** Among pairs with the same count, the pair with the smallest
  ``(left id, right id)`` wins. On ``aaabdaaabac`` this merges ``aa``, then ``ab``
  (``(97, 98)`` beats ``(256, 97)``), then ``(aa)(ab)``.
- **Ids.** Byte ``b`` is token ``b``; the ``i``-th merge creates token ``256 + i``;
  special tokens come after the merges.
- **Encoding** a chunk merges, at every step, the adjacent pair that was learnt first
  (lowest new id), which is what tiktoken does with ``mergeable_ranks = {bytes: id}``.

Over 500 lines: the chapter's tokenizer, and the exercise's experiment and stretch part
(``bytes_per_token``, ``encode_with_special``), whose code the solution notebook holds: a test keeps
the answers and this module the same, so they live beside the parts they build on.
"""

from __future__ import annotations

import heapq
import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import regex

from coursekit._files import read_json, write_json

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "Tokenizer",
    "chunk_counts",
    "decode",
    "encode_chunk",
    "encode_with_special",
    "get_pair_counts",
    "merge",
    "train",
    "train_naive",
    "bytes_per_token",
    "python_docs_text",
    "stdlib_source_text",
    "read_text",
    "SINGLE_DIGIT_PATTERN",
    "token_pieces",
    "token_counts",
    "under_trained_tokens",
]

#: GPT-2's split pattern (tiktoken's ``r50k_base``): contractions, letters, numbers and
#: punctuation each with an optional leading space, then whitespace.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
#: GPT-4's split pattern (tiktoken's ``cl100k_base``): case-insensitive contractions,
#: numbers in groups of at most three digits, newlines kept apart.
GPT4_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""  # noqa: E501
#: GPT-4's pattern with every digit a chunk of its own (``\p{N}`` instead of ``\p{N}{1,3}+``), so that no
#: merge can join two digits: the rule of Llama's tokenizer, which splits numbers into single digits.
SINGLE_DIGIT_PATTERN = GPT4_PATTERN.replace(r"\p{N}{1,3}+", r"\p{N}")
_PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}
_FORMAT = "coursekit-bpe"
_VERSION = 1


# --------------------------------------------------------------------------- the two primitives


def get_pair_counts(
    ids: list[int], counts: dict | None = None, weight: int = 1
) -> dict[tuple[int, int], int]:
    """Count adjacent pairs, overlapping ones included.

    Example: ``[1, 2, 3, 1, 2] -> {(1, 2): 2, (2, 3): 1, (3, 1): 1}``;
    ``[7, 7, 7] -> {(7, 7): 2}``.

    Args:
        ids: token ids of one chunk (left unchanged).
        counts: a dict to add to, in place (default ``None``: a new dict on every call).
        weight: added per occurrence (the chunk's frequency in the corpus).

    Returns:
        ``counts``, mapping each ``(left, right)`` tuple to its number of occurrences
        times ``weight`` (plus what it held before).
    """
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + weight
    return counts


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids``, left to right, by ``new_id``.

    Example: ``merge([5, 5, 5, 6], (5, 5), 9) -> [9, 5, 6]``.
    """
    a, b = pair
    out, i, n = [], 0, len(ids)
    while i < n:
        if i < n - 1 and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


# --------------------------------------------------------------------------- training


def chunk_counts(text: str, pattern: str = "gpt4") -> Counter:
    """Split ``text`` with the pre-tokenization regex and count each distinct chunk.

    Example: ``chunk_counts("the cat the", "gpt4") -> Counter({" the": 1, "the": 1, " cat": 1})``.
    """
    return Counter(regex.findall(_PATTERNS.get(pattern, pattern), text))


def train(
    text: str | Iterable[str],
    vocab_size: int,
    pattern: str = "gpt4",
    special_tokens: Iterable[str] = (),
) -> Tokenizer:
    """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``.

    Incremental: pair counts are computed once; after each merge only the chunks
    that contain the merged pair are re-counted, and a heap (with stale entries
    skipped) finds the most frequent pair. Ties go to the smallest ``(left, right)``.
    Training stops early, with a smaller vocabulary, when no pair occurs twice.

    Args:
        text: training text, or an iterable of texts (chunks never cross texts).
        vocab_size: total vocabulary including the 256 bytes and the special tokens.
        pattern: ``"gpt2"``, ``"gpt4"`` or a regex for pre-tokenization.
        special_tokens: strings such as ``"<|endoftext|>"``, given the last ids.

    Returns:
        A :class:`Tokenizer`.
    """
    special_tokens = list(dict.fromkeys(special_tokens))
    n_merges = vocab_size - 256 - len(special_tokens)
    if n_merges < 0:
        raise ValueError(
            f"vocab_size={vocab_size} is smaller than 256 bytes + {len(special_tokens)} special tokens"
        )
    pat = _PATTERNS.get(pattern, pattern)
    texts = [text] if isinstance(text, str) else list(text)
    chunk_freq: Counter = Counter()
    for t in texts:
        if not isinstance(t, str):
            raise TypeError(f"text must be str or an iterable of str, got {type(t).__name__}")
        chunk_freq.update(chunk_counts(t, pat))

    words = [list(chunk.encode("utf-8")) for chunk in chunk_freq]  # unique chunks as byte ids
    freqs = list(chunk_freq.values())
    counts: dict[tuple[int, int], int] = {}
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)  # pair -> chunks that may hold it
    for w, (ids, f) in enumerate(zip(words, freqs)):
        get_pair_counts(ids, counts, f)
        for pair in zip(ids, ids[1:]):
            where[pair].add(w)
    heap = [(-c, p) for p, c in counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        if counts.get(pair, 0) != -neg:  # stale entry: the count changed since it was pushed
            continue
        if -neg < 2:
            break
        new_id = 256 + len(merges)
        merges.append(pair)
        changed: set[tuple[int, int]] = set()
        for w in where.pop(pair):
            ids = words[w]
            new = merge(ids, pair, new_id)
            if len(new) == len(ids):  # stale index entry: the pair left this chunk earlier
                continue
            f = freqs[w]
            for p in zip(ids, ids[1:]):
                counts[p] -= f
                changed.add(p)
            for p in zip(new, new[1:]):
                counts[p] = counts.get(p, 0) + f
                changed.add(p)
                where[p].add(w)
            words[w] = new
        for p in changed:
            c = counts[p]
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                del counts[p]
    specials = {s: 256 + len(merges) + i for i, s in enumerate(special_tokens)}
    return Tokenizer(merges, pat, specials)


def train_naive(text: str, vocab_size: int, pattern: str = "gpt4") -> list[tuple[int, int]]:
    """The textbook loop, for comparison: recount every pair of every chunk after each merge.

    Same rules as ``coursekit.bpe.train``, the book's faster version (and the same merges). It counts each
    distinct chunk once, weighted by its frequency, but every merge still recounts
    and rewrites every chunk.

    Args:
        text: the training text.
        vocab_size: 256 plus the number of merges to learn (fewer when no pair occurs twice).
        pattern: ``"gpt4"``, ``"gpt2"`` or a regex, passed to :func:`chunk_counts`.

    Returns:
        The merges, ``(left, right)`` tuples; merge ``i`` creates the token ``256 + i``.
    """
    freq = chunk_counts(text, pattern)  # each distinct chunk once, with its frequency
    chunks = [list(c.encode("utf-8")) for c in freq]
    weights = list(freq.values())
    merges: list[tuple[int, int]] = []
    for new_id in range(256, vocab_size):
        counts: dict[tuple[int, int], int] = {}
        for ids, w in zip(chunks, weights):
            get_pair_counts(ids, counts, w)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))  # most frequent; ties: smallest (left, right)
        if counts[pair] < 2:
            break
        chunks = [merge(ids, pair, new_id) for ids in chunks]
        merges.append(pair)
    return merges


def encode_chunk(chunk: str, ranks: dict[tuple[int, int], int]) -> list[int]:
    """Encode one pre-tokenized chunk: start from its UTF-8 bytes and, while some
    adjacent pair was learnt, merge the pair learnt first (the lowest new id).

    Example: with ``ranks = {(97, 97): 256, (256, 97): 257}``, ``"aaa"`` becomes
    ``[257]`` and ``"aaaa"`` becomes ``[256, 256]``.

    Args:
        chunk: text of one chunk.
        ranks: ``{(left, right): new id}`` of every merge.

    Returns:
        The chunk's token ids.
    """
    ids = list(chunk.encode("utf-8"))
    while len(ids) >= 2:
        pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        ids = merge(ids, pair, ranks[pair])
    return ids


def decode(ids: list[int], vocab: dict[int, bytes], errors: str = "replace") -> str:
    """Concatenate the tokens' bytes, then decode them as UTF-8 once.

    Decoding token by token would break a character whose bytes are split across
    two tokens; joining the bytes first keeps it whole. Bytes that are still not
    valid UTF-8 (a sequence cut at either end) become U+FFFD with ``errors="replace"``.

    Example: ``decode([226, 130, 172], vocab) -> "€"`` although no single byte is a character.

    Args:
        ids: token ids.
        vocab: ``{id: bytes}`` of every token.
        errors: what to do with bytes that are not valid UTF-8, passed to ``bytes.decode``:
            ``"replace"`` (U+FFFD), ``"strict"`` (raise ``UnicodeDecodeError``), ``"ignore"`` (drop them), ...

    Returns:
        The text, a ``str``.

    Raises:
        ValueError: an id is not in ``vocab`` (the message names it).
    """
    try:
        data = b"".join(vocab[i] for i in ids)
    except KeyError as e:
        raise ValueError(f"unknown token id {e.args[0]} (vocabulary size {len(vocab)})") from None
    return data.decode("utf-8", errors=errors)


# --------------------------------------------------------------------------- the tokenizer


class Tokenizer:
    """A trained byte-level BPE tokenizer: merges, split pattern and special tokens.

    Args:
        merges: the learnt pairs in order; merge ``i`` creates id ``256 + i``.
        pattern: the pre-tokenization regex (or ``"gpt2"``/``"gpt4"``).
        special_tokens: ``{text: id}``; ids must follow the merges.
    """

    def __init__(
        self,
        merges: list[tuple[int, int]],
        pattern: str = "gpt4",
        special_tokens: dict[str, int] | None = None,
    ):
        self.pattern = _PATTERNS.get(pattern, pattern)
        self._regex = regex.compile(self.pattern)
        self.merges = [tuple(map(int, m)) for m in merges]
        self.ranks = {pair: 256 + i for i, pair in enumerate(self.merges)}
        self.vocab: dict[int, bytes] = {i: bytes([i]) for i in range(256)}
        for i, (a, b) in enumerate(self.merges):
            if a not in self.vocab or b not in self.vocab:
                raise ValueError(f"merge {i} ({a}, {b}) uses an id that does not exist before it")
            self.vocab[256 + i] = self.vocab[a] + self.vocab[b]
        self.special_tokens = dict(special_tokens or {})
        for text, i in self.special_tokens.items():
            if i in self.vocab:
                raise ValueError(f"special token {text!r} has id {i}, which is already a byte or a merge")
            self.vocab[i] = text.encode("utf-8")
        self._special_regex = (
            regex.compile(
                "("
                + "|".join(regex.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True))
                + ")"
            )
            if self.special_tokens
            else None
        )
        self._cache: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    # ----- encoding

    def _encode_chunk(self, chunk: str) -> list[int]:
        ids = self._cache.get(chunk)
        if ids is None:
            ids = encode_chunk(chunk, self.ranks)
            if len(self._cache) < 1 << 20:
                self._cache[chunk] = ids
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text``, treating special-token strings as ordinary text."""
        out: list[int] = []
        cache = self._cache
        for chunk in self._regex.findall(text):
            ids = cache.get(chunk)  # most chunks repeat: look them up before calling anything
            out.extend(ids if ids is not None else self._encode_chunk(chunk))
        return out

    def encode(self, text: str, allowed_special: str | Iterable[str] = "none") -> list[int]:
        """Encode ``text`` to token ids.

        Args:
            text: any string.
            allowed_special: ``"all"``, ``"none"`` or a set of special tokens that are
                encoded as their single id. A special token that appears in ``text``
                but is not allowed raises ``ValueError`` (as tiktoken does), so that
                user text cannot smuggle in control tokens; use
                :meth:`encode_ordinary` to encode it as plain text.

        Returns:
            The token ids.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        if allowed_special == "all":
            allowed = set(self.special_tokens)
        elif allowed_special == "none":
            allowed = set()
        else:
            allowed = set(allowed_special)
            unknown = allowed - set(self.special_tokens)
            if unknown:
                raise ValueError(f"not special tokens of this tokenizer: {sorted(unknown)}")
        if self._special_regex is None:
            return self.encode_ordinary(text)
        out: list[int] = []
        for i, part in enumerate(self._special_regex.split(text)):
            if i % 2 == 0:
                out.extend(self.encode_ordinary(part))
            elif part in allowed:
                out.append(self.special_tokens[part])
            else:
                raise ValueError(
                    f"text contains the special token {part!r}: pass allowed_special={{{part!r}}} (or 'all') "
                    "to encode it as one token, or use encode_ordinary to encode it as text"
                )
        return out

    # ----- decoding

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of ``ids`` concatenated (exact, even mid-character)."""
        try:
            return b"".join(self.vocab[int(i)] for i in ids)
        except KeyError as e:
            raise ValueError(f"unknown token id {e.args[0]} (vocabulary size {len(self.vocab)})") from None

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Decode ``ids`` to text with :func:`decode` (as tiktoken does: cut characters
        become U+FFFD with ``errors="replace"``)."""
        return decode([int(i) for i in ids], self.vocab, errors)

    # ----- persistence

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as JSON (see the format below); returns the path.

        Format, version 1::

            {"format": "coursekit-bpe", "version": 1,
             "pattern": "<regex>",
             "merges": [[left, right], ...],      # merge i creates id 256 + i
             "special_tokens": {"<|endoftext|>": 1280, ...}}
        """
        data = {
            "format": _FORMAT,
            "version": _VERSION,
            "pattern": self.pattern,
            "merges": [list(m) for m in self.merges],
            "special_tokens": self.special_tokens,
        }
        return write_json(path, data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Read a file written by :meth:`save`."""
        data = read_json(path, _FORMAT, _VERSION, "coursekit BPE file")
        return cls([tuple(m) for m in data["merges"]], data["pattern"], data["special_tokens"])

    # ----- interoperability

    def mergeable_ranks(self) -> dict[bytes, int]:
        """``{token bytes: id}`` for the bytes and the merges, as ``tiktoken.Encoding`` expects."""
        return {self.vocab[i]: i for i in range(256 + len(self.merges))}


# --------------------------------------------------------------------------- corpora


def python_docs_text() -> str:
    """The Python reference manual that ships with CPython (``pydoc_data.topics``),
    about 465 KB of English prose: the topics joined by blank lines in sorted order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def stdlib_source_text(max_bytes: int = 2_000_000) -> str:
    """Python source from the standard library (sorted ``.py`` files of the ``os``
    module's folder, not recursing), up to ``max_bytes`` characters."""
    folder = Path(os.__file__).parent
    parts, total = [], 0
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return "\n".join(parts)[:max_bytes]


def read_text(path: str | os.PathLike) -> str:
    """Read a user's UTF-8 text file, with a clear error if it is not text."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}): convert it first") from None


# --------------------------------------------------------------------------- the experiment


def bytes_per_token(train_text: str, test_text: str, vocab_size: int, pattern: str = "gpt4") -> float:
    """Measure compression: train on one text, encode another, return its UTF-8 bytes per token.

    Trains with :func:`train_naive` (``vocab_size - 256`` merges at most), then encodes every chunk
    of ``test_text`` (split by the same ``pattern``) with :func:`encode_chunk`. With no merges the
    result is 1.0; larger vocabularies give longer tokens and higher values.

    Example: ``bytes_per_token(docs[:20_000], docs[200_000:210_000], 400)`` is about 1.74 on the
    Python manual (``docs = python_docs_text()``).

    Args:
        train_text: the text the merges are learnt from.
        test_text: the text measured (held out, or of another domain); not empty.
        vocab_size: 256 plus the number of merges to learn, an int ``>= 256``.
        pattern: ``"gpt4"``, ``"gpt2"`` or a regex, for training and encoding alike.

    Returns:
        ``len(test_text.encode("utf-8")) / number of tokens``, a Python ``float``.

    Raises:
        ValueError: ``vocab_size`` is not an int ``>= 256``, or ``test_text`` is empty.
    """
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 256:
        raise ValueError(f"vocab_size must be an int >= 256 (the bytes), got {vocab_size!r}")
    if not test_text:
        raise ValueError(f"test_text is empty ({test_text!r}): bytes per token is undefined")
    merges = train_naive(train_text, vocab_size, pattern)
    ranks = {pair: 256 + i for i, pair in enumerate(merges)}
    n_tokens = 0
    for chunk, count in chunk_counts(test_text, pattern).items():  # each distinct chunk once
        n_tokens += count * len(encode_chunk(chunk, ranks))
    return len(test_text.encode("utf-8")) / n_tokens


# --------------------------------------------------------------------------- the stretch part


def encode_with_special(text: str, ranks: dict[tuple[int, int], int], special: dict[str, int]) -> list[int]:
    """Encode ``text`` keeping each special token (such as ``"<|endoftext|>"``) whole, as one id.

    The text is first split at the special strings, as tiktoken's ``allowed_special`` does: scanning left
    to right, the leftmost special string wins, and among those starting at the same place the longest.
    Each ordinary piece between them is split into chunks with :data:`GPT4_PATTERN` and every chunk is
    encoded with :func:`encode_chunk`; each special string becomes its id. Pairs never cross a special
    token. With ``special = {}`` this is ordinary encoding.

    Example: with ``ranks = {(97, 97): 256}`` and ``special = {"<|endoftext|>": 300}``,
    ``encode_with_special("aa<|endoftext|>aa", ranks, special) -> [256, 300, 256]``.

    Args:
        text: the text to encode.
        ranks: ``{(left, right): new id}`` of every merge.
        special: ``{special string: id}``; each string non-empty, each id an int that is neither a byte
            (0-255) nor a merge's id.

    Returns:
        The token ids, a list of ``int``.

    Raises:
        ValueError: a special string is empty, or a special id is not an int, is a byte or is a merge's id
            (the message names it).
    """
    merge_ids = set(ranks.values())
    for s, i in special.items():
        if not s:
            raise ValueError(f"special token strings must not be empty, got {s!r}")
        if not isinstance(i, int) or isinstance(i, bool) or i < 256 or i in merge_ids:
            raise ValueError(
                f"special token {s!r} has id {i!r}: it must be an int that is not a byte or a merge"
            )
    if not special:
        pieces = [text]
    else:
        alternatives = "|".join(regex.escape(s) for s in sorted(special, key=len, reverse=True))
        pieces = regex.split("(" + alternatives + ")", text)
    ids: list[int] = []
    for k, piece in enumerate(pieces):
        if k % 2 == 1:  # split() puts the matched special strings at the odd positions
            ids.append(special[piece])
        else:
            for chunk in regex.findall(GPT4_PATTERN, piece):
                ids.extend(encode_chunk(chunk, ranks))
    return ids


# --------------------------------------------------------------------------- failure modes


def token_pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    """The pieces of text the tokens of ``text`` stand for, in order (special strings as plain text).

    A token whose bytes are not whole UTF-8 characters shows the stray bytes as ``\\x`` escapes.

    Example: with a tokenizer that learnt `` st``, ``ra``, ``er`` and ``ry``,
    ``token_pieces(tok, " strawberry") -> [" st", "ra", "w", "b", "er", "ry"]``.

    Args:
        tokenizer: a trained :class:`Tokenizer`.
        text: any string.

    Returns:
        One ``str`` per token of ``tokenizer.encode_ordinary(text)``; joined they give ``text``
        back whenever no character is split between tokens.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    return [
        tokenizer.vocab[i].decode("utf-8", errors="backslashreplace") for i in tokenizer.encode_ordinary(text)
    ]


def token_counts(tokenizer: Tokenizer, text: str) -> Counter:
    """How often each token id occurs when ``text`` is encoded (special strings as plain text).

    Counts each distinct chunk once and multiplies by its frequency, so it equals
    ``Counter(tokenizer.encode_ordinary(text))`` at a fraction of the cost on long texts.

    Args:
        tokenizer: a trained :class:`Tokenizer`.
        text: any string.

    Returns:
        A ``Counter`` mapping token id to its number of occurrences; ids that never occur are absent.
    """
    counts: Counter = Counter()
    for chunk, n in chunk_counts(text, tokenizer.pattern).items():
        for i in tokenizer._encode_chunk(chunk):
            counts[i] += n
    return counts


def under_trained_tokens(
    tokenizer: Tokenizer, tokenizer_text: str, model_text: str, max_count: int = 0
) -> list[tuple[int, int, int]]:
    """Tokens a model trained on ``model_text`` would (almost) never see, most frequent in
    ``tokenizer_text`` first: the mechanism behind glitch tokens such as GPT-2's `` SolidGoldMagikarp``.

    A token earns its place in the vocabulary from the text the tokenizer was trained on. If the
    model is trained on other text, a token that is rare there is (almost) never an input: its row of
    the input embedding changes only where the token occurs. With tied embeddings that row is also
    the output layer's, which moves at every step, but only to push the token's logit down.

    Example: a tokenizer trained on the Python manual, with ``model_text`` Python source code, lists
    `` characters`` (dozens of times in the manual, never in the source) among the first.

    Args:
        tokenizer: a trained :class:`Tokenizer`; its bytes and merges are examined, not its special tokens.
        tokenizer_text: the text the tokenizer was trained on (or any text to rank the tokens by).
        model_text: the text a model would be trained on.
        max_count: the largest number of occurrences in ``model_text`` that still counts as rare,
            an int ``>= 0`` (default 0: never occurs).

    Returns:
        ``(id, count in tokenizer_text, count in model_text)`` for every byte or merge token that
        occurs at most ``max_count`` times in ``model_text``, sorted by the count in
        ``tokenizer_text``, largest first, then by id.

    Raises:
        ValueError: ``max_count`` is not an int ``>= 0``.
    """
    if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count < 0:
        raise ValueError(f"max_count must be an int >= 0, got {max_count!r}")
    in_tokenizer = token_counts(tokenizer, tokenizer_text)
    in_model = token_counts(tokenizer, model_text)
    rare = [
        (i, in_tokenizer[i], in_model[i])
        for i in range(256 + len(tokenizer.merges))
        if in_model[i] <= max_count
    ]
    return sorted(rare, key=lambda row: (-row[1], row[0]))

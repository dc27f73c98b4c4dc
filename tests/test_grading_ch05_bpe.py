"""The Exercise 5 graders, tested like code: correct answers written differently keep full marks.

The reference passing, the release failing and the catalogue's mistakes losing their points (with
their hints) are tested for every exercise by ``tests/test_graders.py``; what the generated mutants
do, by ``tests/test_mutation.py``.
"""

from __future__ import annotations

import pytest

from coursekit.grading import ch05_bpe as grader
from coursekit.grading.core import GradingFailure
from tests.grading_support import full_marks

A = "ch05_bpe"

#: answer cell grade id -> correct answers written differently from the instructor's
ALTERNATIVES = {
    "get_pair_counts": {
        "a Counter": """
def get_pair_counts(ids, counts=None, weight=1):
    counts = Counter() if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + weight
    return counts
""",
        "an index loop": """
def get_pair_counts(ids, counts=None, weight=1):
    if counts is None:
        counts = {}
    for i in range(len(ids) - 1):
        pair = (ids[i], ids[i + 1])
        if pair in counts:
            counts[pair] += weight
        else:
            counts[pair] = weight
    return counts
""",
        "Counter arithmetic": """
def get_pair_counts(ids, counts=None, weight=1):
    counts = {} if counts is None else counts
    for pair, n in Counter(zip(ids, ids[1:])).items():
        counts[pair] = counts.get(pair, 0) + n * weight
    return counts
""",
    },
    "merge": {
        "a for loop with a skip flag": """
def merge(ids, pair, new_id):
    out, skip = [], False
    for i, x in enumerate(ids):
        if skip:
            skip = False
        elif i + 1 < len(ids) and (x, ids[i + 1]) == tuple(pair):
            out.append(new_id)
            skip = True
        else:
            out.append(x)
    return out
""",
        "slices": """
def merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i:i + 2] == list(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
""",
    },
    "train_naive": {
        "every chunk occurrence, max with a key": """
def train_naive(text, vocab_size, pattern="gpt4"):
    chunks = [list(c.encode("utf-8")) for c in chunk_counts(text, pattern).elements()]
    merges = []
    for new_id in range(256, vocab_size):
        counts = {}
        for ids in chunks:
            get_pair_counts(ids, counts)
        if not counts or max(counts.values()) < 2:
            break
        pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        chunks = [merge(ids, pair, new_id) for ids in chunks]
        merges.append(pair)
    return merges
""",
        "sorted items": """
def train_naive(text, vocab_size, pattern="gpt4"):
    freq = chunk_counts(text, pattern)
    words = {tuple(c.encode("utf-8")): n for c, n in freq.items()}
    merges = []
    while len(merges) < vocab_size - 256:
        counts = Counter()
        for ids, n in words.items():
            for pair in zip(ids, ids[1:]):
                counts[pair] += n
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if not ranked or ranked[0][1] < 2:
            break
        pair = ranked[0][0]
        new_id = 256 + len(merges)
        words = {tuple(merge(list(ids), pair, new_id)): n for ids, n in words.items()}
        merges.append(pair)
    return merges
""",
    },
    "encode_chunk": {
        "every merge once, in rank order": """
def encode_chunk(chunk, ranks):
    ids = list(chunk.encode("utf-8"))
    for pair, new_id in sorted(ranks.items(), key=lambda kv: kv[1]):
        ids = merge(ids, pair, new_id)
    return ids
""",
        "tiktoken's loop, one position at a time": """
def encode_chunk(chunk, ranks):
    ids = list(chunk.encode("utf-8"))
    while True:
        best = None
        for i in range(len(ids) - 1):
            r = ranks.get((ids[i], ids[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return ids
        r, i = best
        ids = ids[:i] + [r] + ids[i + 2:]
""",
        "minbpe's loop": """
def encode_chunk(chunk, ranks):
    ids = list(chunk.encode("utf-8"))
    while len(ids) >= 2:
        stats = get_pair_counts(ids)
        pair = min(stats, key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        ids = merge(ids, pair, ranks[pair])
    return ids
""",
    },
    "decode": {
        "a bytearray and an explicit check": """
def decode(ids, vocab, errors="replace"):
    data = bytearray()
    for i in ids:
        if i not in vocab:
            raise ValueError(f"id {i} is not in the vocabulary")
        data += vocab[i]
    return bytes(data).decode("utf-8", errors)
""",
        "codecs": """
import codecs

def decode(ids, vocab, errors="replace"):
    unknown = [i for i in ids if i not in vocab]
    if unknown:
        raise ValueError(f"unknown token ids: {unknown}")
    return codecs.decode(b"".join(map(vocab.__getitem__, ids)), "utf-8", errors)
""",
    },
}

CASES = [(gid, name) for gid, answers in ALTERNATIVES.items() for name in answers]


@pytest.mark.parametrize("gid, name", CASES, ids=[f"{g}: {n}" for g, n in CASES])
def test_a_correct_answer_written_differently_keeps_full_marks(gid, name):
    full_marks(A, gid, ALTERNATIVES[gid][name])


def test_a_counter_is_an_acceptable_answer_when_called_directly():
    """Students often return collections.Counter; it is a dict and must pass (in-process and in the sandbox)."""
    from collections import Counter

    def get_pair_counts(ids, counts=None, weight=1):
        counts = Counter() if counts is None else counts
        for pair in zip(ids, ids[1:]):
            counts[pair] = counts.get(pair, 0) + weight
        return counts

    grader.grade_get_pair_counts(get_pair_counts)
    grader.check_get_pair_counts(get_pair_counts)


def test_a_failed_drawn_example_is_shrunk_and_quoted():
    """A merge that never merges the pair (a, a) fails on the smallest such list, quoted in the hint."""

    def merge(ids, pair, new_id):
        out, i = [], 0
        while i < len(ids):
            if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair and pair[0] != pair[1]:
                out.append(new_id)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        return out

    with pytest.raises(GradingFailure) as info:
        grader.grade_merge(merge)
    assert "merge([0, 0], (0, 0), 300) should be [300], got [0, 0]" in str(info.value)


def test_the_weight_hint_is_given_only_when_the_weight_is_ignored():
    """[0, 0, 0] with weight 2: skipping overlaps and ignoring the weight both give {(0, 0): 2}; only the
    code that ignores the weight is told to add the weight."""
    from tests.mutants import failures

    assert "(the weight) per occurrence" in failures("ch05_bpe", "pairs_ignore_weight", hidden=True)
    said = failures("ch05_bpe", "pairs_skip_overlaps", hidden=True)
    assert "also where pairs overlap" in said and "(the weight) per occurrence" not in said

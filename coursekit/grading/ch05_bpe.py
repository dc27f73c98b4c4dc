"""Checks for Exercise 5 (byte-level BPE): each graded part is a :class:`~coursekit.grading.spec.Spec`.

A part lists its clauses, one per rule of its text and docstring, each stated once: the check's name,
its test ``test(g, student, case)``, the hidden inputs (a Hypothesis strategy drawn from the seed of ``key``:
short id lists from small alphabets, so that runs, overlaps and ties are common; texts with spaces, digits,
newlines and multi-byte characters; every split pattern the text names) and fixed examples (the classic
mistakes' cases: overlaps, tie-break, merge order, cut UTF-8 characters). ``check_<part>`` (public) runs
every clause on its examples; ``grade_<part>`` (hidden) tries the first example, then the drawn inputs and
the fixed ``also`` ones, against :mod:`coursekit.bpe`. A failed drawn example is shrunk to the smallest
one that still fails, and the hint quotes it, naming the common mistake it matches.

Over 500 lines: every clause of the exercise text for each graded part, with the inputs that provoke it
and the common mistakes each hint names; splitting it would scatter one exercise's specification.
"""

from __future__ import annotations

import ast
import functools

import regex
from hypothesis import strategies as st

from coursekit import bpe as ref
from coursekit.grading.core import Grader, call_student, describe, probe, raise_unless_student_error, said
from coursekit.grading.questions import Prediction, expect_in_band
from coursekit.grading.spec import Call, Clause, Spec, order_free, raises

_PARTS = ("get_pair_counts", "merge", "train", "encode_chunk", "decode", "predict_word_end_merges")
_PARTS += ("predict_shared_merges", "predict_digit_groups", "bytes_per_token", "encode_with_special")
__all__ = [f"{verb}_{part}" for part in _PARTS for verb in ("check", "grade")]

#: Text the hidden checks train and encode on: English, code, digits and non-Latin scripts.
_SAMPLE = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away, and the\n"
    "other foxes follow the first fox into the forest. 1234 + 5678 = 6912.\n"
    "def tokenize(text):\n    return [t for t in text.split() if t]\n"
    "Ünïcödé: naïve café, Straße, ελληνικά, русский, 日本語のテキスト, emoji 🙂🙂🚀.\n"
)
#: Characters of the drawn texts: letters, a space, a newline, a digit, an apostrophe (GPT-4's
#: contractions), a 2-byte and a 3-byte character.
_ALPHABET = "ab c\n1'é€"
#: The split patterns of the drawn examples: both named ones and two regexes of one's own.
_PATTERNS = ("gpt4", "gpt2", r"\S+|\s+", ".+")
#: Drawn texts of :data:`_ALPHABET`'s characters.
_TEXT = functools.partial(st.text, alphabet=_ALPHABET)


def _short(x, n: int = 160) -> str:
    text = repr(x)
    return text if len(text) <= n else text[: n - 3] + "..."


def _id_lists(max_size: int = 12):
    """Short id lists from a small alphabet (runs and overlaps are common), at an offset (bytes, or ids of merges)."""
    return st.tuples(st.lists(st.integers(0, 3), max_size=max_size), st.sampled_from((0, 97, 256))).map(
        lambda t: [t[1] + i for i in t[0]]
    )


@functools.cache
def _sample_merges(size: int = 256 + 60) -> tuple:
    return tuple(ref.train_naive(_SAMPLE, size))


def _ranks(merges) -> dict:
    """The ranks of ``merges``, a new dict: merge i creates id 256 + i."""
    return {pair: 256 + i for i, pair in enumerate(merges)}


def _sample_ranks() -> dict:
    """The ranks learnt on :data:`_SAMPLE` with vocab_size 316 (32 merges: no pair is left twice), a new dict."""
    return _ranks(_sample_merges())


# --------------------------------------------------------------------------- pair counts

_SHARED_DEFAULT = (
    "the counts of earlier calls were kept: a default of counts={} is one dict shared by every call, "
    "so use counts=None and make a new dict inside"
)


def _expect_pair_dict(g: Grader, got, what: str) -> None:
    """A dict (a Counter or defaultdict is fine) of (int, int) tuples -> int."""
    ok = isinstance(got, dict) and all(
        type(k) is tuple and len(k) == 2 and all(type(i) is int for i in k) and type(v) is int
        for k, v in got.items()
    )
    g.expect(
        ok,
        f"{what} returned {_short(got)}: return a dict whose keys are (left, right) tuples of ints and whose "
        "values are int counts",
    )


def _pairs_values(g: Grader, get_pair_counts, ids: list) -> None:
    what = f"get_pair_counts({ids})"
    got = call_student(g, what, get_pair_counts, list(ids))
    _expect_pair_dict(g, got, what)
    expected = ref.get_pair_counts(ids)
    if dict(got) != expected:  # a second call without counts must not see the first one's counts
        first = call_student(g, "get_pair_counts([11, 12])", get_pair_counts, [11, 12])
        first = dict(first) if isinstance(first, dict) else first  # a snapshot: the same dict may come back
        second = call_student(g, "get_pair_counts([11, 12]) (called again)", get_pair_counts, [11, 12])
        g.expect(
            not isinstance(second, dict) or dict(second) == first,
            f"get_pair_counts([11, 12]) gave {_short(first)}, then {_short(dict(second))} when called again: "
            f"{_SHARED_DEFAULT}",
        )
    if dict(got) != expected and any(a == b == c for a, b, c in zip(ids, ids[1:], ids[2:])):
        g.fail(
            f"{what} should be {expected}, got {dict(got)}: count every adjacent position "
            "(zip(ids, ids[1:])), also where pairs overlap"
        )
    g.expect(dict(got) == expected, f"{what} should be {expected}, got {dict(got)}")


def _pairs_fresh(g: Grader, get_pair_counts, ids: list) -> None:
    first = call_student(g, f"get_pair_counts({ids})", get_pair_counts, list(ids))
    second = call_student(g, f"get_pair_counts({ids}) (called again)", get_pair_counts, list(ids))
    expected = ref.get_pair_counts(ids)
    g.expect(
        isinstance(first, dict) and dict(first) == expected,
        f"get_pair_counts({ids}) should be {expected}, got {_short(first)}",
    )
    g.expect(
        isinstance(second, dict) and dict(second) == expected,
        f"called a second time, get_pair_counts({ids}) gave {_short(second)} instead of {expected}: "
        f"{_SHARED_DEFAULT}",
    )


def _pairs_weight(g: Grader, get_pair_counts, case) -> None:
    ids, weight, keyword = case
    what = (
        f"get_pair_counts({ids}, weight={weight})" if keyword else f"get_pair_counts({ids}, None, {weight})"
    )
    args, kwargs = ((list(ids),), {"weight": weight}) if keyword else ((list(ids), None, weight), {})
    got = call_student(g, what, get_pair_counts, *args, **kwargs)
    _expect_pair_dict(g, got, what)
    expected = ref.get_pair_counts(ids, None, weight)
    if dict(got) != expected and dict(got) == ref.get_pair_counts(ids):
        # the unweighted counts, and the same with weight=1: the weight is ignored (not another mistake
        # that happens to give the unweighted counts on this input, such as skipping overlaps)
        once = call_student(g, f"get_pair_counts({ids}, None, 1)", get_pair_counts, list(ids), None, 1)
        g.expect(
            not (isinstance(once, dict) and dict(once) == dict(got)),
            f"{what} should be {expected}, got {dict(got)}: add {weight} (the weight) per occurrence, not 1",
        )
    g.expect(dict(got) == expected, f"{what} should be {expected}, got {dict(got)}")


def _pairs_into(g: Grader, get_pair_counts, case) -> None:
    ids, counts, weight = case
    what = f"get_pair_counts({ids}, {counts}, {weight})"
    p = probe(get_pair_counts, list(ids), dict(counts), weight)
    expected = ref.get_pair_counts(ids, dict(counts), weight)
    _expect_pair_dict(g, p.result, what)
    g.expect(
        dict(p.result) == expected,
        f"{what} should add {weight} per occurrence to the given dict and return it: expected {expected}, "
        f"got {dict(p.result)}",
    )
    g.expect(
        isinstance(p.args[1], dict) and dict(p.args[1]) == expected,
        f"after {what} the counts dict passed in holds {_short(p.args[1])}, expected {expected}: add into "
        "that dict (training shares one counts dict across chunks) and return it, not a copy",
    )


def _pairs_unchanged(g: Grader, get_pair_counts, ids: list) -> None:
    after = probe(get_pair_counts, list(ids)).args[0]
    g.expect(after == ids, f"get_pair_counts({ids}) changed its input list to {after}: only read it")


_PAIR_DICTS = st.dictionaries(st.tuples(st.integers(0, 3), st.integers(0, 3)), st.integers(1, 9), max_size=4)

PAIR_COUNTS = Spec(
    "get_pair_counts",
    [
        Clause(
            "returns a dict of every adjacent (left, right) tuple -> int count, overlapping pairs included",
            _pairs_values,
            _id_lists(),
            examples=[[1, 2, 3, 1, 2], [7, 7, 7]],  # {(1, 2): 2, (2, 3): 1, (3, 1): 1}; {(7, 7): 2}
            key="pairs.values",
            budget="wide",
            also=[[7, 7, 7, 7, 1], [], [5], [1, 2]],
        ),
        Clause(
            "counts=None (the default) starts a new dict on every call", _pairs_fresh, examples=[[1, 2, 1, 2]]
        ),
        Clause(
            "adds `weight` per occurrence (counts=None or a dict given)",
            _pairs_weight,
            st.tuples(_id_lists(), st.integers(2, 9), st.booleans()),
            examples=[([1, 2], 3, True), ([1, 2, 1, 2], 3, True)],  # {(1, 2): 6, (2, 1): 3}
            key="pairs.weight",
            budget="wide",
            also=[([1, 2, 1, 2], 5, False)],
        ),
        Clause(
            "adds into the `counts` dict given, in place, and returns that dict",
            _pairs_into,
            st.tuples(st.lists(st.integers(0, 3), max_size=10), _PAIR_DICTS, st.integers(1, 5)),
            examples=[([1, 2], {(1, 2): 1}, 5)],
            key="pairs.into",
            budget="wide",
            # the fixed case first, as before the spec form: its weight of 5 names an ignored weight
            first=([1, 2, 1, 2], {(1, 2): 10, (9, 9): 1}, 5),
            also=[([1, 2], {(1, 2): 1}, 1)],
        ),
        Clause(
            "leaves `ids` unchanged",
            _pairs_unchanged,
            _id_lists(),
            examples=[[3, 4, 3, 4]],
            key="pairs.unchanged",
            budget="some",
        ),
    ],
)
check_get_pair_counts, grade_get_pair_counts = PAIR_COUNTS.graders()


# --------------------------------------------------------------------------- merge


def _merge_values(g: Grader, merge, case) -> None:
    ids, pair, new_id = case
    what = f"merge({ids}, {pair}, {new_id})"
    got = call_student(g, what, merge, list(ids), pair, new_id)
    g.expect(type(got) is list, f"{what} must return a new list, got {describe(got)}")
    expected = ref.merge(ids, pair, new_id)
    if got.count(new_id) == 1 < expected.count(new_id):
        g.fail(
            f"{what} gave {got}: only the first occurrence was merged; replace every occurrence, scanning the "
            "whole list"
        )
    if pair[0] == pair[1] and got.count(new_id) > expected.count(new_id):
        g.fail(
            f"{what} gave {got}, expected {expected}: a token was used in two merges (the middle 5 was used twice "
            "in [5, 5, 5]); after a merge, skip both tokens (i += 2)"
        )
    g.expect(got == expected, f"{what} should be {expected}, got {_short(got)}")


def _merge_unchanged(g: Grader, merge, case) -> None:
    ids, pair, new_id = case
    after = probe(merge, list(ids), pair, new_id).args[0]
    g.expect(
        after == ids,
        f"merge({ids}, {pair}, {new_id}) changed its input list to {after}: build a new list and leave ids as it was",
    )


#: merge's drawn cases: ids and a pair from a small alphabet at an offset, and a new id
_MERGE_CASES = st.tuples(
    st.lists(st.integers(0, 3), max_size=14),
    st.sampled_from((0, 97, 256)),
    st.tuples(st.integers(0, 3), st.integers(0, 3)),
    st.integers(300, 400),
).map(lambda c: ([c[1] + i for i in c[0]], (c[1] + c[2][0], c[1] + c[2][1]), c[3]))

MERGE = Spec(
    "merge",
    [
        Clause(
            "returns a new list with every occurrence of the pair replaced, left to right",
            _merge_values,
            _MERGE_CASES,
            examples=[([1, 2, 3, 1, 2], (1, 2), 256)],  # [256, 3, 256]
            key="merge.values",
            budget="wide",
            also=[
                ([1, 2, 3, 1, 2], (1, 2), 99),
                ([1, 2, 1, 2, 1, 2, 7], (1, 2), 256),
                ([300, 301, 300, 301], (300, 301), 302),
            ],
        ),
        Clause(
            "overlapping occurrences merge left to right without overlap: [5, 5, 5] -> [9, 5]",
            _merge_values,
            examples=[
                (ids, (5, 5), 9) for ids in ([5, 5, 5], [5, 5, 5, 5, 5], [5, 5, 5, 5], [6, 5, 5, 5, 6])
            ],
        ),
        Clause(
            "a pair in the other order, or absent, or cut at the end, is not merged",
            _merge_values,
            examples=[(ids, (1, 2), 7) for ids in ([2, 1, 2], [2, 1], [], [1], [3, 1], [1, 3, 2])],
        ),
        Clause(
            "leaves `ids` unchanged",
            _merge_unchanged,
            _MERGE_CASES,
            examples=[([1, 2, 3, 1, 2], (1, 2), 256)],
            key="merge.unchanged",
        ),
    ],
)
check_merge, grade_merge = MERGE.graders()


# --------------------------------------------------------------------------- training


def _train_variant(
    text, vocab_size, pattern="gpt4", *, chunks=True, weighted=True, tie="smallest", stop=True, first_id=256
) -> list[tuple[int, int]]:
    """The training loop with one rule changed: what a known mistake learns (for its hint)."""
    freq = ref.chunk_counts(text, pattern) if chunks else {text: 1}
    words = [list(c.encode("utf-8")) for c in freq]
    weights = [w if weighted else 1 for w in freq.values()]
    merges = []
    for new_id in range(first_id, vocab_size - 256 + first_id):
        counts: dict = {}
        for ids, w in zip(words, weights):
            ref.get_pair_counts(ids, counts, w)
        if not counts:
            break
        pair = (
            min(counts, key=lambda p: (-counts[p], p)) if tie == "smallest" else max(counts, key=counts.get)
        )
        if stop and counts[pair] < 2:
            break
        words = [ref.merge(ids, pair, new_id) for ids in words]
        merges.append(pair)
    return merges


def _train_mistakes(text: str, vocab_size: int, pattern: str) -> list[tuple[list, str]]:
    off_by_one = "the new ids are off by one: merge i creates id 256 + i (the first new id is 256)"
    return [
        (_train_variant(text, vocab_size, pattern, first_id=257), off_by_one),
        (_train_variant(text, vocab_size, pattern, first_id=255), off_by_one),
        (
            _train_variant(text, vocab_size, "gpt4"),
            f"use the pattern argument ({pattern!r}): split with chunk_counts(text, pattern), not the default pattern",
        ),
        (
            _train_variant(text, vocab_size, pattern, chunks=False),
            "pairs crossed chunk boundaries: split the text with chunk_counts(text, pattern) and count pairs inside "
            "each chunk",
        ),
        (
            _train_variant(text, vocab_size, pattern, weighted=False),
            "each distinct chunk counted once: weight its pairs by the chunk's frequency "
            "(get_pair_counts(ids, counts, weight))",
        ),
        (
            _train_variant(text, vocab_size, pattern, tie="first"),
            "ties went to the pair seen first: choose max count, then the smallest pair "
            "(min(counts, key=lambda p: (-counts[p], p)))",
        ),
        (
            _train_variant(text, vocab_size, pattern, stop=False),
            "you kept merging pairs that occur once: stop when the best pair occurs fewer than 2 times (a merge that "
            "saves nothing)",
        ),
    ]


def _token_bytes(merges: list) -> list[bytes]:
    """The bytes of the tokens that ``merges`` create (skipping merges that use unknown ids)."""
    vocab = {i: bytes([i]) for i in range(256)}
    for i, pair in enumerate(merges):
        if len(pair) == 2 and all(x in vocab for x in pair):
            vocab[256 + i] = vocab[pair[0]] + vocab[pair[1]]
    return [vocab[i] for i in range(256, 256 + len(merges)) if i in vocab]


def _learnt(g: Grader, train_naive, text: str, vocab_size: int, pattern: str | None = None):
    """The call's name in a hint, and the merges it learnt, each checked to be a (left, right) tuple of ints."""
    args = (text, vocab_size) if pattern is None else (text, vocab_size, pattern)
    what = f"train_naive({', '.join(_short(a, 60) for a in args)})"
    got = call_student(g, what, train_naive, *args)
    g.expect(type(got) is list, f"{what} must return the list of merges, got {describe(got)}")
    bad = [p for p in got if not (type(p) is tuple and len(p) == 2 and all(type(i) is int for i in p))]
    g.expect(
        not bad,
        f"{what} returned {_short(got)}: each merge must be a (left, right) tuple of two ints, got "
        f"{_short(bad[0]) if bad else ''}",
    )
    return what, got


def _train_values(g: Grader, train_naive, case) -> None:
    """``(text, vocab_size, pattern)`` (pattern None: left out): the reference's merges, a known mistake named."""
    text, vocab_size, pattern = case
    what, got = _learnt(g, train_naive, text, vocab_size, pattern)
    expected = ref.train_naive(text, vocab_size, pattern or "gpt4")
    if got == expected:
        return
    for wrong, hint in _train_mistakes(text, vocab_size, pattern or "gpt4"):
        if wrong != expected and got == wrong:
            g.fail(f"{what} learnt {_short(got)}, expected {_short(expected)}: {hint}")
    i = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    if i < min(len(got), len(expected)):
        g.fail(f"{what}: merge {i} should be {expected[i]}, got {got[i]} (the merges before it agreed)")
    g.fail(f"{what} should learn {len(expected)} merges {_short(expected)}, got {len(got)}: {_short(got)}")


def _train_in_chunks(g: Grader, train_naive, case) -> None:
    text, vocab_size, _ = case
    what, got = _learnt(g, train_naive, text, vocab_size)
    crossing = [t for t in _token_bytes(got) if regex.search(rb"\S ", t)]
    if crossing:
        g.fail(
            f"you learnt the token {crossing[0]!r}, which joins a word and the space after it, which are in "
            "different chunks: split the text with chunk_counts(text, pattern) and count pairs inside each chunk"
        )
    _train_values(g, train_naive, case)


def _train_tie(g: Grader, train_naive, case) -> None:
    text, vocab_size, _ = case  # "zy ab zy ab": (32, 97), (97, 98) and (122, 121) all occur twice
    what, got = _learnt(g, train_naive, text, vocab_size)
    g.expect(
        got == [(32, 97)],
        f"in {text!r} the pairs (32, 97), (97, 98) and (122, 121) all occur twice; the rule picks the smallest, "
        f"(32, 97), but you merged {got}: choose max count, then the smallest pair "
        "(for example min(counts, key=lambda p: (-counts[p], p)))",
    )


TRAIN = Spec(
    "train_naive",
    [
        Clause(
            "returns the reference merges as (left, right) tuples, merge i creating id 256 + i",
            _train_values,
            examples=[(_SAMPLE, 256 + 40, None), (_SAMPLE, 256 + 5, None)],
        ),
        Clause(
            "learns the reference merges on drawn texts, sizes and patterns",
            _train_values,
            st.tuples(_TEXT(max_size=28), st.integers(256, 272), st.sampled_from(_PATTERNS)),
            examples=[("ab ab ab ab", 262, ".+")],
            key="train.values",
            budget="wider",
        ),
        Clause(
            "splits with the `pattern` argument ('gpt4' by default, 'gpt2' or a regex)",
            _train_values,
            examples=[
                ("it'S 12345 it'S 12345 ab ab ab ab", 264, p) for p in ("gpt2", r"\S+|\s+", ".+", None)
            ],
        ),
        Clause(
            "pairs never cross chunk boundaries", _train_in_chunks, examples=[("ab ab ab cd cd", 260, None)]
        ),
        Clause(
            "each chunk counts as often as it occurs", _train_values, examples=[("xy zw zw zw", 258, None)]
        ),
        Clause(
            "ties go to the smallest (left, right) pair", _train_tie, examples=[("zy ab zy ab", 257, None)]
        ),
        Clause(
            "stops early when no pair occurs twice (or none is left), and learns nothing for vocab_size=256",
            _train_values,
            examples=[
                (t, n, None)
                for t, n in (("abcabc xyz", 306), ("", 300), ("a", 300), ("a b c d", 300), ("aaaa", 256))
            ],
        ),
    ],
    extra_public=[
        Clause(
            "the worked example: 'aaabdaaabac' learns [(97, 97), (97, 98), (256, 257)] (tuples, ids from 256)",
            _train_values,
            examples=[("aaabdaaabac", 259, None)],
        )
    ],
)
check_train, grade_train = TRAIN.graders("train")


# --------------------------------------------------------------------------- encoding


def _leftmost(chunk: str, ranks: dict) -> list[int]:
    """A mistake: merge the leftmost learnt pair at each step, not the one learnt first."""
    ids = list(chunk.encode("utf-8"))
    while pair := next((p for p in zip(ids, ids[1:]) if p in ranks), None):
        ids = ref.merge(ids, pair, ranks[pair])
    return ids


def _encode_mistakes(chunk: str, ranks: dict) -> list[tuple[list | None, str]]:
    """What the common mistakes give on ``chunk`` (None where one cannot show), each with its hint."""
    data, chars = list(chunk.encode("utf-8")), [ord(c) for c in chunk]
    first = min((p for p in zip(data, data[1:]) if p in ranks), key=ranks.get, default=None)
    return [
        (
            chars if chars != data else None,
            "start from the UTF-8 bytes (list(chunk.encode('utf-8'))), not the characters",
        ),
        (
            _leftmost(chunk, ranks),
            "you merged the leftmost learnt pair; merge the pair with the lowest rank (the one learnt first) at "
            "each step",
        ),
        (
            None if first is None else ref.merge(data, first, ranks[first]),
            "repeat until no adjacent pair is in ranks",
        ),
    ]


def _encode(g: Grader, encode_chunk, case) -> None:
    """A chunk of the mixed text (with the ranks learnt on it), ``(chunk, ranks)``, or ``(text, n_merges, chunk)``
    (with the ranks of ``n_merges`` merges learnt on ``text``): the reference's ids, a known mistake named."""
    if isinstance(case, str):
        chunk, ranks, shown = case, _sample_ranks(), "the ranks learnt on a mixed text"
    elif len(case) == 2:
        chunk, ranks, shown = *case, str(case[1])
    else:
        text, n_merges, chunk = case
        ranks = _ranks(ref.train_naive(text, 256 + n_merges, ".+"))
        shown = _short(ranks, 300)
    what = f"encode_chunk({chunk!r}, {shown})"
    got = call_student(g, what, encode_chunk, chunk, dict(ranks))
    g.expect(
        type(got) is list and all(type(i) is int for i in got),
        f"{what} must return a list of int ids, got {_short(got)}",
    )
    expected = ref.encode_chunk(chunk, ranks)
    for wrong, hint in _encode_mistakes(chunk, ranks) if got != expected else ():
        if wrong is not None and wrong != expected and got == wrong:
            g.fail(f"{what} gave {got}, expected {expected}: {hint}")
    g.expect(got == expected, f"{what} should be {expected}, got {got}")


def _encode_reordered(case, backwards: bool) -> Call:
    chunk, ranks = case
    items = list(ranks.items())[:: -1 if backwards else 1]
    return Call(f"encode_chunk({chunk!r}, {dict(items)})", (chunk, dict(items)))


#: ranks (a) a then aa, (b, c) before (a, b), and one that needs every step
_DOCSTRING_RANKS = {(97, 97): 256, (256, 97): 257}
_BC_FIRST = {(98, 99): 256, (97, 98): 257}
_AAAAA = {(97, 97): 256, (256, 256): 257, (257, 97): 258}

ENCODE = Spec(
    "encode_chunk",
    [
        Clause(
            "returns a list of int ids, as the reference, on the chunks of a mixed text",
            _encode,
            examples=list(ref.chunk_counts(_SAMPLE)),
        ),
        Clause(
            "encodes drawn chunks with the ranks learnt on drawn texts",
            _encode,
            st.tuples(_TEXT(max_size=24), st.integers(0, 12), _TEXT(max_size=10)),
            examples=[("aaab aaab", 3, "aaab")],
            key="encode.values",
            budget="wider",
        ),
        Clause(
            "merges by rank (the pair learnt first), not left to right",
            _encode,  # (b, c) first, then (a, b): "abc" must become [a, bc], not [ab, c]
            examples=[
                ("abc", _BC_FIRST),
                ("xabcabc", {(98, 99): 256, (120, 97): 257, (97, 256): 258, (257, 256): 259}),
            ],
        ),
        Clause("keeps merging until no learnt pair is left", _encode, examples=[("aaaaa", _AAAAA)]),
        Clause(
            "starts from the UTF-8 bytes (non-ASCII text, the empty chunk)",
            _encode,
            examples=[(c, {}) for c in ("é", "日本", "🙂", "", "a")]
            + [("€€", {(226, 130): 256, (256, 172): 257})],
        ),
        order_free(
            _encode_reordered,
            text="does not depend on the order of `ranks`: a pair's rank is its new id, not its place in the dict",
            examples=[("aaa", _DOCSTRING_RANKS), ("abcabc", _BC_FIRST), ("aaaaa", _AAAAA)],
        ),
    ],
    extra_public=[
        Clause(
            "the docstring's example: with ranks {(a, a): 256, (aa, a): 257}, 'aaa' -> [257], 'aaaa' -> [256, 256]",
            _encode,
            examples=[("aaa", _DOCSTRING_RANKS), ("aaaa", _DOCSTRING_RANKS)],
        )
    ],
)
check_encode_chunk, grade_encode_chunk = ENCODE.graders()


# --------------------------------------------------------------------------- decoding


@functools.cache
def _tokenizer() -> ref.Tokenizer:
    """The tokenizer of :func:`_sample_merges`, built once; hand its ``vocab`` out as a copy."""
    return ref.Tokenizer(list(_sample_merges()), "gpt4")


def _vocabs():
    """A vocabulary of byte strings cut from UTF-8 text (characters split across tokens, invalid pieces) and ids."""

    def build(case):
        text, cuts, extra, order = case
        data = text.encode("utf-8")
        points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
        pieces = [data[a:b] for a, b in zip(points, points[1:])] + [bytes([b]) for b in extra]
        vocab = {i: bytes([i]) for i in range(256)} | {300 + i: p for i, p in enumerate(pieces)}
        ids = [300 + i for i in range(len(pieces))]
        return vocab, [ids[i % len(ids)] for i in order] if ids else []

    return st.tuples(
        st.text(alphabet=_ALPHABET + "🙂", max_size=8),
        st.lists(st.integers(0, 30), max_size=6),
        st.lists(st.integers(128, 255), max_size=2),
        st.lists(st.integers(0, 9), max_size=8),
    ).map(build)


def _decode(g: Grader, decode, case) -> None:
    """A text (encoded with the tokenizer learnt on a mixed text), a drawn ``(vocab, ids)``, ``(ids, errors)``
    (errors None: left out) or ``(ids, errors, tokens)``: the vocabulary learnt on a mixed text, with the given
    tokens added."""
    if isinstance(case, str):
        tok, errors, shown = _tokenizer(), None, "the vocabulary learnt on a mixed text"
        ids, vocab = tok.encode(case), dict(tok.vocab)
    elif isinstance(case[0], dict):
        (vocab, ids), errors = case, None
        shown = _short({i: vocab[i] for i in sorted(set(ids))}, 200)
    else:
        ids, errors, *extra = case
        vocab = dict(_tokenizer().vocab) | (extra[0] if extra else {})
        shown = "{" + ", ".join(f"{i}: {t!r}" for i, t in extra[0].items()) + ", ...}" if extra else "vocab"
    kwargs = {} if errors is None else {"errors": errors}
    what = f"decode({ids}, {shown}{'' if errors is None else f', errors={errors!r}'})"
    data = b"".join(vocab[i] for i in ids)
    try:
        expected = data.decode("utf-8", errors=errors or "replace")
    except UnicodeDecodeError:  # errors="strict" on invalid bytes: the student's code must raise it too
        expected = None
    try:
        got = decode(list(ids), vocab, **kwargs)
    except UnicodeDecodeError as e:
        if expected is None:
            return
        g.fail(
            f"{what} raised UnicodeDecodeError ({e}): generated text can end in the middle of a character; "
            f"decode with .decode('utf-8', errors=errors), errors={errors or 'replace'!r} here"
        )
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        name = type(e).__name__.removeprefix("Student")
        if expected is None:
            g.fail(
                f"{what} raised {name} ({e}); with errors='strict' bytes.decode raises UnicodeDecodeError: pass "
                "errors on"
            )
        g.fail(f"{what} raised {name}: {e}")
    if expected is None:
        g.fail(
            f"{what} returned {got!r}: with errors='strict' invalid bytes raise UnicodeDecodeError; pass errors "
            "on to .decode('utf-8', errors=errors)"
        )
    g.expect(type(got) is str, f"{what} must return a str, got {describe(got)}")
    if errors not in (None, "replace") and got != expected and got == data.decode("utf-8", errors="replace"):
        g.fail(
            f"{what} gave {got!r}, expected {expected!r}: the errors argument was ignored; pass it on, "
            ".decode('utf-8', errors=errors)"
        )
    if got != expected and got == "".join(vocab[i].decode("utf-8", errors=errors or "replace") for i in ids):
        g.fail(
            f"{what} gave {got!r}, expected {expected!r}: join the bytes of all tokens first, then decode once "
            "(decoding token by token breaks characters split across tokens)"
        )
    g.expect(got == expected, f"{what} should be {expected!r}, got {got!r}")


def _decode_unknown(g: Grader, decode, ids: list) -> None:
    vocab = dict(_tokenizer().vocab)
    bad = next(i for i in ids if i not in vocab)
    try:
        got = decode(ids, vocab)
    except ValueError as e:
        g.expect(
            str(bad) in said(e),
            f"the ValueError of decode({ids}, vocab) should name the unknown id {bad}, it says: {e}",
        )
        return
    except KeyError:
        g.fail(
            f"decode({ids}, vocab) raised a bare KeyError: catch it and raise ValueError(f'unknown token id {{i}}') "
            "so the user learns which id is wrong"
        )
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(
            f"decode({ids}, vocab) raised {type(e).__name__.removeprefix('Student')} ({e}): an id that is not in "
            "vocab must raise a ValueError that names it"
        )
    g.fail(
        f"decode({ids}, vocab) returned {got!r}: an id that is not in vocab ({bad}) must raise a ValueError that "
        "names it"
    )


_EURO = "€".encode()  # three bytes

DECODE = Spec(
    "decode",
    [
        Clause(
            "decode(encode(text)) gives the text back, as a str",
            _decode,
            examples=[_SAMPLE, "", " ", "🙂🚀 ελληνικά"],
        ),
        Clause(
            "joins the bytes of all tokens, then decodes once (drawn vocabularies and ids)",
            _decode,
            _vocabs(),
            examples=[({i: bytes([i]) for i in range(256)}, [104, 105])],
            key="decode.values",
            budget="wider",
        ),
        Clause(
            "a character split across two tokens survives",
            _decode,
            examples=[([1000, 1001], None, {1000: _EURO[:2], 1001: _EURO[2:] + b"!"})],
        ),
        Clause(
            "bytes that are not valid UTF-8 become U+FFFD by default (errors='replace') instead of an error",
            _decode,
            examples=[
                (ids, None) for ids in ([0xE2, 0x82], [104, 0xFF, 105], [0xAC, 0xE2, 0x82, 0xAC, 0xE2])
            ],
        ),
        Clause(
            "passes `errors` to bytes.decode: 'strict' raises UnicodeDecodeError, 'ignore' drops bad bytes",
            _decode,
            examples=[
                (ids, errors)
                for ids in ([104, 0xE2, 0x82, 105], [0xFF], [226, 130, 172])
                for errors in ("ignore", "backslashreplace")
            ]
            + [([104, 105], "strict"), ([104, 0xE2, 0x82], "strict")],
        ),
        Clause(
            "an unknown id raises a ValueError that names it",
            _decode_unknown,
            examples=[[104, 99999], [7000], [1, 2, 256 + 60 + 3, 4], [-1]],
        ),
    ],
    extra_public=[
        Clause(
            "the docstring's example: decode([226, 130, 172], vocab) == '€' although no single byte is a character",
            _decode,
            examples=[([226, 130, 172], None)],
        )
    ],
)
check_decode, grade_decode = DECODE.graders()


# --------------------------------------------------------------------------- predict, then check


def _docs(start: int, stop: int) -> str:
    """A slice of the Python manual (:func:`coursekit.bpe.python_docs_text`), the chapter's corpus."""
    return ref.python_docs_text()[start:stop]


def _word_end_tokens(pattern: str) -> int:
    """How many of 64 merges learnt on the manual's first 20,000 characters make a token in which a
    space follows a non-space byte (the end of one word glued to the space before the next)."""
    merges = ref.train_naive(_docs(0, 20_000), 256 + 64, pattern)
    vocab = _token_bytes(merges)
    return sum(any(t[i] == 32 and t[i - 1] != 32 for i in range(1, len(t))) for t in vocab)


def _bucket(n: int) -> str:
    return "a" if n == 0 else "b" if n <= 4 else "c" if n <= 20 else "d"


WORD_END_MERGES = Prediction(
    name="predict_word_end_merges",
    question="Without pre-tokenization (pattern '.+': one chunk per line), how many of 64 merges learnt on the "
    "manual's first 20,000 characters make a token where a space follows a non-space (like 'e ')?",
    tests="what the regex split prevents: merges across word boundaries",
    measure=lambda: _bucket(_word_end_tokens(".+")),
    explanation="Without the split, the most frequent pairs of English include a word's last letter and the "
    "space that follows it ('e ', 's ', 't '), and soon whole words with a space on both sides (' the '): the "
    "answer is {truth}, against none at all with the GPT-4 pattern, which puts each space at the start of the "
    "next word. Such tokens waste vocabulary on every word-and-space combination; this is why GPT-2 splits the "
    "text first (Radford et al., 2019).",
    choices={"a": "none", "b": "1 to 4", "c": "5 to 20", "d": "more than 20"},
)


#: SHARED_MERGES's two runs: vocab_size of the run on the text once, and of the run on two copies of it
SHARED_SIZES = (400, 1000)


def _shared_merges() -> int:
    """How many merges of a run to 400 tokens on the manual's first 10,000 characters are, at the same
    position, the merges of a run to 1,000 tokens on two copies of those characters (a list of two texts,
    so that no chunk crosses the join)."""
    text = _docs(0, 10_000)
    once = ref.train(text, SHARED_SIZES[0]).merges
    twice = ref.train([text, text], SHARED_SIZES[1]).merges
    return sum(a == b for a, b in zip(once, twice))


SHARED_MERGES = Prediction(
    name="predict_shared_merges",
    question="Train with the GPT-4 pattern on the manual's first 10,000 characters with vocab_size=400, and on "
    "two copies of them, train([text, text], 1000): how many merges of the first run are, at the same "
    "position, the merges of the second?",
    tests="training is greedy and reads only which pair is most frequent: a larger vocabulary only appends "
    "merges, doubling every count changes none, and vocab_size counts the 256 bytes",
    measure=_shared_merges,
    explanation="All {truth} merges of the first run (400 - 256: the 256 byte tokens are not merges). Two copies "
    "of a text double the frequency of every chunk, so every pair count doubles: the most frequent pair, and "
    "the tie-break between equal counts, are the same at every step, and so are the merges. And each merge "
    "depends only on the merges before it, never on how many are still to come, so the run to 1,000 tokens "
    "begins with the merges of a run to 400. Not 400: vocab_size includes the bytes. Not a handful: more text "
    "changes the merges only when it changes which pairs are frequent relative to each other, and a second "
    "copy changes no ratio. Training a tokenizer on a corpus with every document duplicated is "
    "wasted work; duplicating only some documents, as web crawls do, skews the vocabulary towards them.",
)

#: DIGIT_GROUPS's numbers: runs of 8, 9, 10 and 11 digits
_DIGIT_RUNS = ("12345678", "123456789", "1234567890", "12345678901")
#: its choices: the length of the chunk that holds the units digit, for each run (the measured answer's format)
_DIGIT_LAST = {"a": "3, 3, 3, 3", "b": "2, 3, 1, 2", "c": "1, 1, 1, 1", "d": "8, 9, 10, 11"}


def _units_chunk_lengths() -> str:
    """The digits in the last GPT-4 chunk of each of _DIGIT_RUNS, as in _DIGIT_LAST."""
    return ", ".join(str(len(regex.findall(ref.GPT4_PATTERN, run)[-1])) for run in _DIGIT_RUNS)


DIGIT_GROUPS = Prediction(
    name="predict_digit_groups",
    question="GPT-4's pre-tokenization pattern (cl100k_base's, coursekit.bpe.GPT4_PATTERN) cuts a run of digits "
    "into chunks before any merge. For numbers of 8, 9, 10 and 11 digits (12345678 to 12345678901), how many "
    "digits has the chunk that holds the units digit?",
    tests="digits and place value: GPT-4's pattern groups at most three digits, counted from the left, so the "
    "units digit's chunk depends on the number's length",
    measure=lambda: {v: k for k, v in _DIGIT_LAST.items()}.get(_units_chunk_lengths()),
    explanation="Answer {truth}. The pattern's digit rule, \\p{{N}}{{1,3}}, takes up to three digits, and the "
    "regex scans from the left: 123|456|78, 123|456|789, 123|456|789|0, 123|456|789|01. The last chunk gets "
    "what is left over, the number of digits modulo 3 (3 when it divides evenly). (a) would be the groups of "
    "thousands separators, counted from the right; (c) the single digits of the first Llama models; (d) "
    "GPT-2's pattern, which keeps the whole run as one chunk. No merge crosses a chunk, so the units digit "
    "is a token of its own in a 10-digit number, the second of two digits in an 11-digit one and the last of "
    "three in a 12-digit one: the same place value lands in different positions of different tokens, and "
    "digits to be added do not line up. "
    "Singh and Strouse (2024) found that grouping from the right (writing the commas) improves such models' "
    "arithmetic.",
    choices=dict(_DIGIT_LAST),
)

check_predict_word_end_merges, grade_predict_word_end_merges = WORD_END_MERGES.graders()
check_predict_shared_merges, grade_predict_shared_merges = SHARED_MERGES.graders()
check_predict_digit_groups, grade_predict_digit_groups = DIGIT_GROUPS.graders()


# --------------------------------------------------------------------------- experiment

#: The measurement is deterministic: any correct implementation learns the same merges (the rules fix the
#: tie-break) and counts the same tokens, so it matches the reference up to the rounding of one division.
#: The band, 0.05% either way, accepts that and rejects one merge too many or too few (0.13% to 0.25% at
#: the sizes graded) and every mistake the hints name (characters for bytes, distinct chunks only, ...).
BPT_BAND = 5e-4
#: Training and held-out slices of the manual, as in the chapter (a prefix for training, text far from it).
TRAIN_SLICE, HELD_SLICE = (0, 20_000), (200_000, 210_000)


def _bpt_mistakes(train_text: str, test_text: str, vocab_size: int, pattern: str) -> list[tuple[float, str]]:
    """What the classic mistakes measure, each with its hint."""

    def n_tokens(merges, counts, weighted=True) -> int:
        ranks = _ranks(merges)
        return sum((c if weighted else 1) * len(ref.encode_chunk(ch, ranks)) for ch, c in counts.items())

    merges = ref.train_naive(train_text, vocab_size, pattern)
    counts = ref.chunk_counts(test_text, pattern)
    n, n_bytes = n_tokens(merges, counts), len(test_text.encode("utf-8"))
    out = [
        (
            len(test_text) / n,
            "count the UTF-8 bytes of test_text (len(test_text.encode('utf-8'))), not characters",
        ),
        (n / n_bytes, "return bytes per token (bytes divided by tokens), not tokens per byte"),
        (
            n_bytes / n_tokens(merges, counts, weighted=False),
            "chunk_counts gives each distinct chunk once with its count: multiply each chunk's tokens by its count",
        ),
    ]
    if vocab_size > 256:
        n_big = n_tokens(ref.train_naive(train_text, vocab_size + 256, pattern), counts)
        out.append((n_bytes / n_big, "vocab_size counts the 256 bytes: learn vocab_size - 256 merges"))
        if pattern != "gpt4":
            other = n_tokens(ref.train_naive(train_text, vocab_size), counts)
            out += [
                (n_bytes / other, f"train with the given pattern ({pattern!r}), not the default"),
                (
                    n_bytes / n_tokens(merges, ref.chunk_counts(test_text)),
                    f"split test_text with the given pattern ({pattern!r}) too, not the default",
                ),
            ]
    return out


_BPT_WHY = (
    "the measurement is deterministic: train with your train_naive (vocab_size - 256 merges), encode each "
    "chunk of test_text with encode_chunk, and divide the UTF-8 bytes of test_text by the number of tokens "
    "(if Parts 3 and 4 fail their checks, fix them first)"
)
#: the texts of the fixed measurements, by their names in a hint
_TEXTS = {
    "manual": lambda: _docs(*TRAIN_SLICE),
    "manual[:8000]": lambda: _docs(0, 8000),
    "held_out": lambda: _docs(*HELD_SLICE),
    "sample * 3": lambda: _SAMPLE * 3,
    "sample": lambda: _SAMPLE,
    "python_source": lambda: ref.stdlib_source_text(30_000)[20_000:30_000],
}


def _bpt(g: Grader, bytes_per_token, case) -> None:
    """A fixed measurement, named as a hint shows it: ``"train, test, vocab_size[, pattern]"`` (texts of
    :data:`_TEXTS`, the pattern a Python literal), or a drawn ``(train, test, n_merges, pattern)``."""
    if isinstance(case, str):
        train, test, vocab_size, *pattern = case.split(", ")
        args = (_TEXTS[train](), _TEXTS[test](), int(vocab_size), *map(ast.literal_eval, pattern))
    else:
        args = (case[0], case[1], 256 + case[2], case[3])
    what = f"bytes_per_token({case if isinstance(case, str) else _short(args, 120)})"
    got = call_student(g, what, bytes_per_token, *args)
    g.expect(type(got) is float, f"{what} should return a Python float, got {describe(got)}")
    train_text, test_text, vocab_size, pat = (*args, "gpt4")[:4]
    truth = ref.bytes_per_token(train_text, test_text, vocab_size, pat)
    if abs(got - truth) > BPT_BAND * truth:
        for wrong, hint in _bpt_mistakes(train_text, test_text, vocab_size, pat):
            if abs(got - wrong) <= 1e-9 * abs(wrong) and abs(wrong - truth) > BPT_BAND * truth:
                g.fail(f"{what} gave {got:.5g}, expected {truth:.5g}: {hint}")
    expect_in_band(g, what, got, truth * (1 - BPT_BAND), truth * (1 + BPT_BAND), _BPT_WHY)


def _bpt_unit(g: Grader, bytes_per_token, vocab_size: int) -> None:
    what = f"bytes_per_token(manual, held_out, {vocab_size})"
    got = call_student(g, what, bytes_per_token, _docs(*TRAIN_SLICE), _docs(*HELD_SLICE), vocab_size)
    g.expect(type(got) is float, f"bytes_per_token(...) should return a Python float, got {describe(got)}")
    g.expect(got == 1.0, f"with vocab_size=256 (no merges) every byte is a token: 1.0, got {got!r}")


def _bpt_bad(case) -> Call:
    test_text, vocab_size = case
    return Call(
        f"bytes_per_token(text, {test_text!r}, {vocab_size!r})", (_docs(0, 100), test_text, vocab_size)
    )


BPT = Spec(
    "bytes_per_token",
    [
        Clause(
            "returns a Python float; no merges (vocab_size=256) gives exactly 1.0", _bpt_unit, examples=[256]
        ),
        Clause(
            "held-out manual, GPT-4 pattern: vocab_size 300 and 400, within 0.05% of the reference",
            _bpt,
            examples=["manual, held_out, 300"],  # about 1.41
            also=["manual, held_out, 400"],
        ),
        Clause(
            "the pattern argument is used for training and encoding: 'gpt2' and r'\\S+|\\s+'",
            _bpt,
            examples=[r"manual[:8000], held_out, 320, r'\S+|\s+'"],  # the smaller training text, in public
            also=["manual, held_out, 350, 'gpt2'"],
        ),
        Clause(
            "counts UTF-8 bytes, not characters (a test text with non-ASCII characters)",
            _bpt,
            examples=["sample * 3, sample, 300"],
        ),
        Clause(
            "another domain (Python source) and drawn short texts",
            _bpt,
            st.tuples(
                _TEXT(max_size=30),
                _TEXT(min_size=1, max_size=20),
                st.integers(0, 8),
                st.sampled_from(("gpt4", "gpt2")),
            ),
            examples=[("aaab aaab", "aaab ab", 3, "gpt4")],
            key="bpt.values",
            budget="plenty",
            also=["manual, python_source, 300"],
        ),
        raises(
            _bpt_bad,
            text="raises ValueError for vocab_size < 256 and an empty test_text",
            fix="say which argument is out of range and what came",
            examples=[("abc", 255), ("abc", 0), ("", 300)],
        ),
        raises(
            _bpt_bad,
            text="raises ValueError for a vocab_size that is not an int (a float, a string)",
            fix="check that vocab_size is an int before using it",
            examples=[("abc", 300.0), ("abc", "300")],
        ),
    ],
)
check_bytes_per_token, grade_bytes_per_token = BPT.graders()


# --------------------------------------------------------------------------- the stretch part: special tokens

#: Special strings of the drawn examples: two that share a prefix (the longest must win where both start)
#: and one made of characters the ordinary text also uses.
_SPECIALS = ("<|endoftext|>", "<|end|>", "<|endoftext|>!", "ab")
_EOT_RANKS = {(97, 97): 256}


def _special_in_dict_order(text: str, ranks: dict, special: dict) -> list[int]:
    """A mistake: the special strings tried in the dict's order, not the longest first."""
    pieces = regex.split("(" + "|".join(regex.escape(s) for s in special) + ")", text) if special else [text]
    return [
        i
        for k, piece in enumerate(pieces)
        for i in ([special[piece]] if k % 2 else ref.encode_with_special(piece, ranks, {}))
    ]


def _special(g: Grader, encode_with_special, case) -> None:
    """``(text, ranks, special)``: ranks None, the ranks learnt on a mixed text, special None, ``<|endoftext|>``
    with the next free id; or a drawn ``(parts, names, n_merges, corpus)``: the text joined from ``parts``, the
    ranks of ``n_merges`` merges learnt on ``corpus``, the special strings ``names``."""
    if len(case) == 4:
        parts, names, n_merges, corpus = case
        text, ranks = "".join(parts), _ranks(ref.train_naive(corpus, 256 + n_merges, ".+"))
        start = 256 + len(ranks)
        special = {s: start + 3 * k for k, s in enumerate(names)}  # ids need not be consecutive
        shown = _short(ranks, 200)
    else:
        text, ranks, special = case
        shown = "sample ranks" if ranks is None else str(ranks)
        ranks = _sample_ranks() if ranks is None else ranks
        special = {"<|endoftext|>": 256 + len(ranks)} if special is None else special
    what = f"encode_with_special({_short(text)}, {shown}, {special})"
    got = call_student(g, what, encode_with_special, text, dict(ranks), dict(special))
    g.expect(
        type(got) is list and all(type(i) is int for i in got),
        f"{what} must return a list of int ids, got {_short(got)}",
    )
    expected = ref.encode_with_special(text, ranks, special)
    mistakes = [
        (
            ref.encode_with_special(text, ranks, {}),
            "the special strings were encoded as ordinary text; split the text at them first",
        ),
        (
            _special_in_dict_order(text, ranks, special),
            "where several special strings start at the same place, take the longest (try them longest first)",
        ),
    ]
    for wrong, hint in mistakes if got != expected else ():
        if got == wrong:
            g.fail(f"{what} should be {expected}, got {got}: {hint}")
    g.expect(got == expected, f"{what} should be {expected}, got {got}")


#: encode_with_special's special dicts that the text rules out (with ranks {(97, 97): 256}), by their names
_SPECIAL_BAD = {
    "special {'': 300}": {"": 300},
    "special {'<|e|>': 97} (97 is the byte 'a')": {"<|e|>": 97},
    "special {'<|e|>': 255} (255 is the last byte)": {"<|e|>": 255},
    "special {'<|e|>': 256} and ranks {(97, 97): 256} (256 is a merge)": {"<|e|>": 256},
    "special {'<|e|>': 300, '<|f|>': -1}": {"<|e|>": 300, "<|f|>": -1},
    "special {'<|e|>': 300.0} (a float)": {"<|e|>": 300.0},
}
_LONGEST = {"<|end|>": 300, "<|endoftext|>": 301}  # shorter first in the dict: the order must not matter
_ORDINARY = _ALPHABET + "<|>"

SPECIAL = Spec(
    "encode_with_special",
    [
        Clause(
            "keeps each special token whole, between the encoded pieces, on drawn texts and specials",
            _special,
            st.tuples(
                st.lists(
                    st.one_of(st.text(alphabet=_ORDINARY, max_size=8), st.sampled_from(_SPECIALS)), max_size=6
                ),
                st.lists(st.sampled_from(_SPECIALS), unique=True, max_size=4),
                st.integers(0, 10),
                _TEXT(max_size=24),
            ),
            examples=[(["aa", "<|endoftext|>", "aa"], ["<|endoftext|>"], 1, "aa aa")],
            key="special.values",
            budget="wider",
        ),
        Clause(
            "splits the ordinary pieces into chunks with the GPT-4 pattern (no pair crosses a chunk)",
            _special,
            examples=[
                (_SAMPLE[:120] + "<|endoftext|>" + _SAMPLE[120:240], None, None),  # the next free id
                ("a b<|e|>a b", {(97, 32): 256, (256, 98): 257}, {"<|e|>": 300}),  # (a, space) never meets
            ],
        ),
        Clause(
            "the longest special wins where several start at the same place; the leftmost first",
            _special,
            examples=[
                (t, {}, _LONGEST)
                for t in (
                    "<|endoftext|>",
                    "x<|end|><|endoftext|><|end|>y",
                    "<|endoftext|><|end|>",
                    "<|en<|end|>d|>",
                )
            ]
            + [("bab", {}, {"ab": 300, "ba": 301})],
        ),
        Clause(
            "special strings not in special, and an empty special dict, are ordinary text",
            _special,
            examples=[
                ("<|endoftext|> the fox", None, {}),
                ("<|endoftext|> the fox<|end|>", None, {"<|end|>": 400}),
                ("", None, {"<|end|>": 400}),
                ("é€🙂 <|x|>", None, {}),
            ],
        ),
        raises(
            lambda what: Call(what, ("a<|e|>a", dict(_EOT_RANKS), dict(_SPECIAL_BAD[what]))),
            text="ValueError for an empty special string, an id that is a byte or a merge's id, or not an int",
            fix="name the special token and its id",
            examples=list(_SPECIAL_BAD),
        ),
    ],
)
check_encode_with_special, grade_encode_with_special = SPECIAL.graders()

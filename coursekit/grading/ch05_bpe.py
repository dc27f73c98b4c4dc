"""Checks for Exercise 5 (byte-level BPE).

``check_*`` are the public checks: every clause the hidden checks grade, each on one small fixed
example. ``grade_*`` are the hidden ones: one named check per clause of the part's text and
docstring, on examples drawn across the allowed inputs (:func:`~coursekit.grading.core.for_all`:
short id lists from small alphabets, so that runs, overlaps and ties are common; texts with spaces,
digits, newlines and multi-byte characters; every split pattern the text names), compared with
:mod:`coursekit.bpe`, plus the fixed cases of the classic mistakes with their specific hints
(overlaps, tie-break, merge order, cut UTF-8 characters). A failed example is shrunk to the
smallest one that still fails, and the hint quotes it.

Over 500 lines: one named check per clause of the exercise text for each graded part, public and
hidden, with the inputs that provoke each clause and the common mistakes each hint names; splitting
it would scatter one exercise's specification over several files.
"""

from __future__ import annotations

import regex
from hypothesis import strategies as st

from coursekit import bpe as ref
from coursekit.grading.core import (
    Grader,
    call_student,
    describe,
    expect_value_error,
    for_all,
    probe,
    raise_unless_student_error,
    said,
)
from coursekit.grading.questions import Prediction, expect_in_band

__all__ = [
    "check_get_pair_counts",
    "check_merge",
    "check_train",
    "check_encode_chunk",
    "check_decode",
    "grade_get_pair_counts",
    "grade_merge",
    "grade_train",
    "grade_encode_chunk",
    "grade_decode",
    "check_predict_word_end_merges",
    "grade_predict_word_end_merges",
    "check_predict_shared_merges",
    "grade_predict_shared_merges",
    "check_predict_digit_groups",
    "grade_predict_digit_groups",
    "check_bytes_per_token",
    "grade_bytes_per_token",
    "check_encode_with_special",
    "grade_encode_with_special",
]

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


def _short(x, n: int = 160) -> str:
    text = repr(x)
    return text if len(text) <= n else text[: n - 3] + "..."


def _is_pair_dict(x) -> bool:
    """A dict (a Counter or defaultdict is fine) of (int, int) tuples -> int."""
    return isinstance(x, dict) and all(
        type(k) is tuple and len(k) == 2 and all(type(i) is int for i in k) and type(v) is int
        for k, v in x.items()
    )


def _expect_pair_dict(g: Grader, got, what: str) -> None:
    g.expect(
        _is_pair_dict(got),
        f"{what} returned {_short(got)}: return a dict whose keys are (left, right) tuples "
        "of ints and whose values are int counts",
    )


def _id_lists(max_size: int = 12):
    """Short id lists from a small alphabet (runs and overlaps are common), at an offset (bytes, or ids of merges)."""
    return st.tuples(st.lists(st.integers(0, 3), max_size=max_size), st.sampled_from((0, 97, 256))).map(
        lambda t: [t[1] + i for i in t[0]]
    )


# --------------------------------------------------------------------------- pair counts

_SHARED_DEFAULT = (
    "the counts of earlier calls were kept: a default of counts={} is one dict shared by every call, "
    "so use counts=None and make a new dict inside"
)


def _expect_no_shared_default(g: Grader, get_pair_counts) -> None:
    """Fail with the shared-default hint if a second call without ``counts`` sees the first one's counts."""
    first = call_student(g, "get_pair_counts([11, 12])", get_pair_counts, [11, 12])
    first = dict(first) if isinstance(first, dict) else first  # a snapshot: the same dict may come back
    second = call_student(g, "get_pair_counts([11, 12]) (called again)", get_pair_counts, [11, 12])
    g.expect(
        not isinstance(second, dict) or dict(second) == first,
        f"get_pair_counts([11, 12]) gave {_short(first)}, then {_short(dict(second))} when called again: "
        f"{_SHARED_DEFAULT}",
    )


def grade_get_pair_counts(get_pair_counts) -> None:
    """Grade ``get_pair_counts(ids, counts=None, weight=1)``."""
    g = Grader("get_pair_counts")

    with g.check(
        "returns a dict of every adjacent (left, right) tuple -> int count, overlapping pairs included"
    ):

        def test(ids):
            what = f"get_pair_counts({ids})"
            got = call_student(g, what, get_pair_counts, list(ids))
            _expect_pair_dict(g, got, what)
            expected = ref.get_pair_counts(ids)
            if dict(got) != expected:
                _expect_no_shared_default(g, get_pair_counts)
            if dict(got) != expected and any(a == b == c for a, b, c in zip(ids, ids[1:], ids[2:])):
                g.fail(
                    f"{what} should be {expected}, got {dict(got)}: count every adjacent position "
                    "(zip(ids, ids[1:])), also where pairs overlap"
                )
            g.expect(dict(got) == expected, f"{what} should be {expected}, got {dict(got)}")

        for ids in ([7, 7, 7, 7, 1], [], [5], [1, 2]):
            test(ids)
        for_all("pairs.values", _id_lists(), test, first=[1, 2, 3, 1, 2])

    with g.check("counts=None (the default) starts a new dict on every call"):
        ids = [1, 2, 1, 2]
        first = call_student(g, "get_pair_counts([1, 2, 1, 2])", get_pair_counts, ids)
        second = call_student(g, "get_pair_counts([1, 2, 1, 2]) (called again)", get_pair_counts, ids)
        expected = {(1, 2): 2, (2, 1): 1}
        g.expect(
            isinstance(first, dict) and dict(first) == expected,
            f"get_pair_counts([1, 2, 1, 2]) should be {expected}, got {_short(first)}",
        )
        g.expect(
            isinstance(second, dict) and dict(second) == expected,
            f"called a second time, get_pair_counts([1, 2, 1, 2]) gave {_short(second)} instead of {expected}: "
            f"{_SHARED_DEFAULT}",
        )

    with g.check("adds `weight` per occurrence (counts=None or a dict given)"):

        def test(case):
            ids, weight, keyword = case
            what = (
                f"get_pair_counts({ids}, weight={weight})"
                if keyword
                else f"get_pair_counts({ids}, None, {weight})"
            )
            got = (
                call_student(g, what, get_pair_counts, list(ids), weight=weight)
                if keyword
                else call_student(g, what, get_pair_counts, list(ids), None, weight)
            )
            _expect_pair_dict(g, got, what)
            expected = ref.get_pair_counts(ids, None, weight)
            if dict(got) != expected and dict(got) == ref.get_pair_counts(ids):
                # the unweighted counts, and the same with weight=1: the weight is ignored (not another mistake
                # that happens to give the unweighted counts on this input, such as skipping overlaps)
                once = call_student(
                    g, f"get_pair_counts({ids}, None, 1)", get_pair_counts, list(ids), None, 1
                )
                g.expect(
                    not (isinstance(once, dict) and dict(once) == dict(got)),
                    f"{what} should be {expected}, got {dict(got)}: add {weight} (the weight) per occurrence, not 1",
                )
            g.expect(dict(got) == expected, f"{what} should be {expected}, got {dict(got)}")

        test(([1, 2, 1, 2], 5, False))
        for_all(
            "pairs.weight",
            st.tuples(_id_lists(), st.integers(2, 9), st.booleans()),
            test,
            first=([1, 2], 3, True),
        )

    with g.check("adds into the `counts` dict given, in place, and returns that dict"):

        def test(case):
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
            after = p.args[1]
            g.expect(
                isinstance(after, dict) and dict(after) == expected,
                f"after {what} the counts dict passed in holds {_short(after)}, expected {expected}: add into "
                "that dict (training shares one counts dict across chunks) and return it, not a copy",
            )

        test(([1, 2, 1, 2], {(1, 2): 10, (9, 9): 1}, 5))
        pairs = st.dictionaries(
            st.tuples(st.integers(0, 3), st.integers(0, 3)), st.integers(1, 9), max_size=4
        )
        for_all(
            "pairs.into",
            st.tuples(st.lists(st.integers(0, 3), max_size=10), pairs, st.integers(1, 5)),
            test,
            first=([1, 2], {(1, 2): 1}, 1),
        )

    with g.check("leaves `ids` unchanged"):

        def test(ids):
            after = probe(get_pair_counts, list(ids)).args[0]
            g.expect(after == ids, f"get_pair_counts({ids}) changed its input list to {after}: only read it")

        for_all("pairs.unchanged", _id_lists(), test, max_examples=8, first=[3, 4, 3, 4])

    g.finish()


def check_get_pair_counts(get_pair_counts) -> None:
    g = Grader("get_pair_counts (public)")
    with g.check(
        "a dict of (left, right) tuple -> int count: [1, 2, 3, 1, 2] -> {(1, 2): 2, (2, 3): 1, (3, 1): 1}"
    ):
        got = call_student(g, "get_pair_counts([1, 2, 3, 1, 2])", get_pair_counts, [1, 2, 3, 1, 2])
        _expect_pair_dict(g, got, "get_pair_counts([1, 2, 3, 1, 2])")
        g.expect(dict(got) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}, f"got {dict(got)!r}")
    with g.check("overlapping pairs count: [7, 7, 7] -> {(7, 7): 2}"):
        got = call_student(g, "get_pair_counts([7, 7, 7])", get_pair_counts, [7, 7, 7])
        g.expect(
            isinstance(got, dict) and dict(got) == {(7, 7): 2},
            f"got {_short(got)}: count every adjacent position, also overlapping ones",
        )
    with g.check("counts=None starts a new dict on every call"):
        a = get_pair_counts([1, 2])
        a = dict(a) if isinstance(a, dict) else a  # a snapshot: a shared default dict would change under us
        b = get_pair_counts([1, 2])
        g.expect(
            isinstance(b, dict) and dict(b) == {(1, 2): 1},
            f"calling get_pair_counts([1, 2]) twice gave {_short(a)}, then {_short(b)}: use counts=None, "
            "not counts={} (one dict shared by every call)",
        )
    with g.check("weight: get_pair_counts([1, 2, 1, 2], weight=3) -> {(1, 2): 6, (2, 1): 3}"):
        got = get_pair_counts([1, 2, 1, 2], weight=3)
        g.expect(isinstance(got, dict) and dict(got) == {(1, 2): 6, (2, 1): 3}, f"got {_short(got)}")
    with g.check(
        "adds into the given dict and returns it: get_pair_counts([1, 2], c, 5) with c = {(1, 2): 1}"
    ):
        p = probe(get_pair_counts, [1, 2], {(1, 2): 1}, 5)
        g.expect(isinstance(p.result, dict) and dict(p.result) == {(1, 2): 6}, f"returned {_short(p.result)}")
        g.expect(
            isinstance(p.args[1], dict) and dict(p.args[1]) == {(1, 2): 6},
            f"c became {_short(p.args[1])}, expected {{(1, 2): 6}}: add into c itself",
        )
    with g.check("leaves ids unchanged"):
        g.expect(
            probe(get_pair_counts, [3, 4, 3]).args[0] == [3, 4, 3], "your code changed ids: only read it"
        )
    g.finish()


# --------------------------------------------------------------------------- merge


def _merge_hint(ids, pair, new_id, got, expected) -> str:
    what = f"merge({ids}, {pair}, {new_id})"
    if type(got) is list and got.count(new_id) == 1 < expected.count(new_id):
        return (
            f"{what} gave {got}: only the first occurrence was merged; replace every occurrence, scanning the "
            "whole list"
        )
    if type(got) is list and pair[0] == pair[1] and got.count(new_id) > expected.count(new_id):
        return (
            f"{what} gave {got}, expected {expected}: a token was used in two merges (the middle 5 was used twice "
            "in [5, 5, 5]); after a merge, skip both tokens (i += 2)"
        )
    return f"{what} should be {expected}, got {_short(got)}"


def grade_merge(merge) -> None:
    """Grade ``merge(ids, pair, new_id)``."""
    g = Grader("merge")

    def test(case):
        ids, pair, new_id = case
        got = call_student(g, f"merge({ids}, {pair}, {new_id})", merge, list(ids), pair, new_id)
        g.expect(
            type(got) is list, f"merge({ids}, {pair}, {new_id}) must return a new list, got {describe(got)}"
        )
        expected = ref.merge(ids, pair, new_id)
        g.expect(got == expected, _merge_hint(ids, pair, new_id, got, expected))

    def build(c):
        base, offset, (a, b), new_id = c
        return [offset + i for i in base], (offset + a, offset + b), new_id

    cases = st.tuples(
        st.lists(st.integers(0, 3), max_size=14),
        st.sampled_from((0, 97, 256)),
        st.tuples(st.integers(0, 3), st.integers(0, 3)),
        st.integers(300, 400),
    ).map(build)

    with g.check("returns a new list with every occurrence of the pair replaced, left to right"):
        for case in (
            ([1, 2, 3, 1, 2], (1, 2), 99),
            ([1, 2, 1, 2, 1, 2, 7], (1, 2), 256),
            ([300, 301, 300, 301], (300, 301), 302),
        ):
            test(case)
        for_all("merge.values", cases, test, first=([1, 2, 3, 1, 2], (1, 2), 256))

    with g.check("overlapping occurrences merge left to right without overlap: [5, 5, 5] -> [9, 5]"):
        for ids, expected in (
            ([5, 5, 5], [9, 5]),
            ([5, 5, 5, 5, 5], [9, 9, 5]),
            ([5, 5, 5, 5], [9, 9]),
            ([6, 5, 5, 5, 6], [6, 9, 5, 6]),
        ):
            got = call_student(g, f"merge({ids}, (5, 5), 9)", merge, list(ids), (5, 5), 9)
            g.expect(got == expected, _merge_hint(ids, (5, 5), 9, got, expected))

    with g.check("a pair in the other order, or absent, or cut at the end, is not merged"):
        for ids, pair, expected in (
            ([2, 1, 2], (1, 2), [2, 7]),
            ([2, 1], (1, 2), [2, 1]),
            ([], (1, 2), []),
            ([1], (1, 2), [1]),
            ([3, 1], (1, 2), [3, 1]),
            ([1, 3, 2], (1, 2), [1, 3, 2]),
        ):
            got = call_student(g, f"merge({ids}, {pair}, 7)", merge, list(ids), pair, 7)
            g.expect(got == expected, f"merge({ids}, {pair}, 7) should be {expected}, got {_short(got)}")

    with g.check("leaves `ids` unchanged"):

        def unchanged(case):
            ids, pair, new_id = case
            after = probe(merge, list(ids), pair, new_id).args[0]
            g.expect(
                after == ids,
                f"merge({ids}, {pair}, {new_id}) changed its input list to {after}: build a new "
                "list and leave ids as it was",
            )

        for_all("merge.unchanged", cases, unchanged, max_examples=10, first=([1, 2, 3, 1, 2], (1, 2), 256))

    g.finish()


def check_merge(merge) -> None:
    g = Grader("merge (public)")
    with g.check(
        "returns a new list, every occurrence replaced: merge([1, 2, 3, 1, 2], (1, 2), 256) == [256, 3, 256]"
    ):
        got = call_student(g, "merge([1, 2, 3, 1, 2], (1, 2), 256)", merge, [1, 2, 3, 1, 2], (1, 2), 256)
        g.expect(type(got) is list and got == [256, 3, 256], f"got {got!r}")
    with g.check("left to right without overlap: merge([5, 5, 5], (5, 5), 9) == [9, 5]"):
        got = merge([5, 5, 5], (5, 5), 9)
        g.expect(got == [9, 5], f"got {got!r}: after merging two tokens, continue after both")
    with g.check("other order or absent: merge([2, 1], (1, 2), 7) == [2, 1]"):
        got = merge([2, 1], (1, 2), 7)
        g.expect(got == [2, 1], f"got {got!r}")
    with g.check("leaves ids unchanged"):
        after = probe(merge, [1, 2, 3], (1, 2), 9).args[0]
        g.expect(after == [1, 2, 3], f"ids became {after}: build a new list")
    g.finish()


# --------------------------------------------------------------------------- training


def _train_variant(
    text: str,
    vocab_size: int,
    pattern: str = "gpt4",
    *,
    chunks: bool = True,
    weighted: bool = True,
    tie: str = "smallest",
    stop: bool = True,
    first_id: int = 256,
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


def _as_merges(g: Grader, got, what: str) -> list:
    g.expect(type(got) is list, f"{what} must return the list of merges, got {describe(got)}")
    bad = [p for p in got if not (type(p) is tuple and len(p) == 2 and all(type(i) is int for i in p))]
    g.expect(
        not bad,
        f"{what} returned {_short(got)}: each merge must be a (left, right) tuple of two ints, got "
        f"{_short(bad[0]) if bad else ''}",
    )
    return got


def _expect_merges(g: Grader, train_naive, text: str, vocab_size: int, pattern: str | None) -> None:
    args = (text, vocab_size) if pattern is None else (text, vocab_size, pattern)
    what = f"train_naive({', '.join(_short(a, 60) for a in args)})"
    got = _as_merges(g, call_student(g, what, train_naive, *args), what)
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


def grade_train(train_naive) -> None:
    """Grade ``train_naive(text, vocab_size, pattern="gpt4")``, the training loop."""
    g = Grader("train_naive")

    with g.check("returns the reference merges as (left, right) tuples, merge i creating id 256 + i"):
        for size in (256 + 40, 256 + 5):
            _expect_merges(g, train_naive, _SAMPLE, size, None)

    with g.check("learns the reference merges on drawn texts, sizes and patterns"):
        texts = st.text(alphabet=_ALPHABET, max_size=28)
        for_all(
            "train.values",
            st.tuples(texts, st.integers(256, 272), st.sampled_from(_PATTERNS)),
            lambda c: _expect_merges(g, train_naive, *c),
            max_examples=25,
            first=("ab ab ab ab", 262, ".+"),
        )

    with g.check("splits with the `pattern` argument ('gpt4' by default, 'gpt2' or a regex)"):
        text = "it'S 12345 it'S 12345 ab ab ab ab"
        for pattern in ("gpt2", r"\S+|\s+", ".+", None):
            _expect_merges(g, train_naive, text, 256 + 8, pattern)

    with g.check("pairs never cross chunk boundaries"):
        text = "ab ab ab cd cd"
        got = call_student(g, f"train_naive({text!r}, 260)", train_naive, text, 256 + 4)
        got = _as_merges(g, got, f"train_naive({text!r}, 260)")
        crossing = [t for t in _token_bytes(got) if regex.search(rb"\S ", t)]
        if crossing:
            g.fail(
                f"you learnt the token {crossing[0]!r}, which joins a word and the space after it, which are in "
                "different chunks: split the text with chunk_counts(text, pattern) and count pairs inside each "
                "chunk"
            )
        _expect_merges(g, train_naive, text, 256 + 4, None)

    with g.check("each chunk counts as often as it occurs"):
        _expect_merges(g, train_naive, "xy zw zw zw", 258, None)

    with g.check("ties go to the smallest (left, right) pair"):
        text = "zy ab zy ab"  # (32, 97), (97, 98) and (122, 121) all occur twice
        got = _as_merges(
            g, call_student(g, f"train_naive({text!r}, 257)", train_naive, text, 257), "train_naive"
        )
        g.expect(
            got == [(32, 97)],
            f"in {text!r} the pairs (32, 97), (97, 98) and (122, 121) all occur twice; the rule picks the smallest, "
            f"(32, 97), but you merged {got}: choose max count, then the smallest pair "
            "(for example min(counts, key=lambda p: (-counts[p], p)))",
        )

    with g.check(
        "stops early when no pair occurs twice (or none is left), and learns nothing for vocab_size=256"
    ):
        for text, size in (("abcabc xyz", 256 + 50), ("", 300), ("a", 300), ("a b c d", 300), ("aaaa", 256)):
            _expect_merges(g, train_naive, text, size, None)

    g.finish()


def _token_bytes(merges: list) -> list[bytes]:
    """The bytes of the tokens that ``merges`` create (skipping merges that use unknown ids)."""
    vocab = {i: bytes([i]) for i in range(256)}
    for i, pair in enumerate(merges):
        if len(pair) == 2 and all(x in vocab for x in pair):
            vocab[256 + i] = vocab[pair[0]] + vocab[pair[1]]
    return [vocab[i] for i in range(256, 256 + len(merges)) if i in vocab]


def check_train(train_naive) -> None:
    g = Grader("train_naive (public)")
    with g.check(
        "the worked example: 'aaabdaaabac' learns [(97, 97), (97, 98), (256, 257)] (tuples, ids from 256)"
    ):
        got = call_student(g, "train_naive('aaabdaaabac', 259)", train_naive, "aaabdaaabac", 259)
        g.expect(
            got == [(97, 97), (97, 98), (256, 257)] and all(type(p) is tuple for p in got), f"got {got!r}"
        )
    with g.check("the pattern argument: 'ab ab ab ab' with '.+' learns 3 merges, with the default 2"):
        got = call_student(g, "train_naive('ab ab ab ab', 262, '.+')", train_naive, "ab ab ab ab", 262, ".+")
        g.expect(got == [(97, 98), (32, 256), (257, 257)], f"with pattern '.+' got {got!r}")
        got = train_naive("ab ab ab ab", 262)
        g.expect(
            got == [(97, 98), (32, 256)], f"with the default pattern got {got!r}: pairs never cross chunks"
        )
    with g.check("each chunk counts as often as it occurs: 'xy zw zw zw' learns [(32, 122)]"):
        got = train_naive("xy zw zw zw", 257)
        g.expect(got == [(32, 122)], f"got {got!r}")
    with g.check("ties go to the smallest pair: 'zy ab zy ab' learns [(32, 97)]"):
        got = train_naive("zy ab zy ab", 257)
        g.expect(got == [(32, 97)], f"got {got!r}")
    with g.check(
        "stops early: 'abcabc xyz' learns 2 merges of the 50 allowed, '' none, and vocab_size=256 none"
    ):
        got = train_naive("abcabc xyz", 306), train_naive("", 300), train_naive("aaaa", 256)
        g.expect(got == ([(97, 98), (256, 99)], [], []), f"got {got!r}")
    g.finish()


# --------------------------------------------------------------------------- encoding


def _sample_ranks(size: int = 256 + 60) -> dict:
    return {pair: 256 + i for i, pair in enumerate(ref.train_naive(_SAMPLE, size))}


def _expect_encoding(g: Grader, encode_chunk, chunk: str, ranks: dict, shown: str = "ranks") -> None:
    what = f"encode_chunk({chunk!r}, {shown})"
    got = call_student(g, what, encode_chunk, chunk, dict(ranks))
    g.expect(
        type(got) is list and all(type(i) is int for i in got),
        f"{what} must return a list of int ids, got {_short(got)}",
    )
    expected = ref.encode_chunk(chunk, ranks)
    if got != expected and got == [ord(c) for c in chunk] != list(chunk.encode("utf-8")):
        g.fail(
            f"{what} gave {got}: start from the UTF-8 bytes (list(chunk.encode('utf-8'))), not the characters"
        )
    g.expect(got == expected, f"{what} should be {expected}, got {got}")


def grade_encode_chunk(encode_chunk) -> None:
    """Grade ``encode_chunk(chunk, ranks)``."""
    g = Grader("encode_chunk")

    with g.check("returns a list of int ids, as the reference, on the chunks of a mixed text"):
        ranks = _sample_ranks()
        for chunk in ref.chunk_counts(_SAMPLE):
            _expect_encoding(g, encode_chunk, chunk, ranks, "the ranks of 60 merges learnt on a mixed text")

    with g.check("encodes drawn chunks with the ranks learnt on drawn texts"):

        def test(case):
            text, n_merges, chunk = case
            ranks = {p: 256 + i for i, p in enumerate(ref.train_naive(text, 256 + n_merges, ".+"))}
            _expect_encoding(g, encode_chunk, chunk, ranks, _short(ranks, 300))

        texts = st.text(alphabet=_ALPHABET, max_size=24)
        for_all(
            "encode.values",
            st.tuples(texts, st.integers(0, 12), st.text(alphabet=_ALPHABET, max_size=10)),
            test,
            max_examples=25,
            first=("aaab aaab", 3, "aaab"),
        )

    with g.check("merges by rank (the pair learnt first), not left to right"):
        r = {
            (98, 99): 256,
            (97, 98): 257,
        }  # (b, c) first, then (a, b): "abc" must become [a, bc], not [ab, c]
        got = call_student(g, "encode_chunk('abc', {(98, 99): 256, (97, 98): 257})", encode_chunk, "abc", r)
        if got == [257, 99]:
            g.fail(
                "'abc' became [ab, c]: you merged the leftmost learnt pair; merge the pair with the lowest rank "
                "(the one learnt first) at each step"
            )
        g.expect(
            got == [97, 256], f"with ranks {{(b, c): 256, (a, b): 257}}, 'abc' should be [97, 256], got {got}"
        )
        _expect_encoding(
            g,
            encode_chunk,
            "xabcabc",
            {(98, 99): 256, (120, 97): 257, (97, 256): 258, (257, 256): 259},
            "{(98, 99): 256, (120, 97): 257, (97, 256): 258, (257, 256): 259}",
        )

    with g.check("keeps merging until no learnt pair is left"):
        r = {(97, 97): 256, (256, 256): 257, (257, 97): 258}
        got = call_student(g, f"encode_chunk('aaaaa', {r})", encode_chunk, "aaaaa", r)
        g.expect(
            got == [258],
            f"with ranks {r}, 'aaaaa' should become [258] after three merges, got {got}: "
            "repeat until no adjacent pair is in ranks",
        )

    with g.check("starts from the UTF-8 bytes (non-ASCII text, the empty chunk)"):
        for chunk in ("é", "日本", "🙂", "", "a"):
            _expect_encoding(g, encode_chunk, chunk, {}, "{}")
        euro = {(226, 130): 256, (256, 172): 257}
        _expect_encoding(g, encode_chunk, "€€", euro, str(euro))

    g.finish()


def check_encode_chunk(encode_chunk) -> None:
    g = Grader("encode_chunk (public)")
    ranks = {(97, 97): 256, (256, 97): 257}
    with g.check(
        "a list of ids; with ranks {(a, a): 256, (aa, a): 257}: 'aaa' -> [257], 'aaaa' -> [256, 256]"
    ):
        got = (encode_chunk("aaa", ranks), encode_chunk("aaaa", ranks))
        g.expect(got == ([257], [256, 256]), f"got {got!r}")
    with g.check("by rank, not left to right: with {(b, c): 256, (a, b): 257}, 'abc' -> [97, 256]"):
        got = encode_chunk("abc", {(98, 99): 256, (97, 98): 257})
        g.expect(got == [97, 256], f"got {got!r}: merge the pair learnt first")
    with g.check("UTF-8 bytes: encode_chunk('é', {}) == [195, 169], encode_chunk('', {}) == []"):
        got = encode_chunk("é", {}), encode_chunk("", {})
        g.expect(got == ([195, 169], []), f"got {got!r}")
    g.finish()


# --------------------------------------------------------------------------- decoding


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


def _expect_decoded(g: Grader, decode, ids, vocab, errors: str | None = None, shown: str = "vocab") -> None:
    kwargs = {} if errors is None else {"errors": errors}
    what = f"decode({ids}, {shown}{'' if errors is None else f', errors={errors!r}'})"
    expected = b"".join(vocab[i] for i in ids).decode("utf-8", errors=errors or "replace")
    try:
        got = decode(list(ids), vocab, **kwargs)
    except UnicodeDecodeError as e:
        g.fail(
            f"{what} raised UnicodeDecodeError ({e}): generated text can end in the middle of a character; "
            f"decode with .decode('utf-8', errors=errors), errors={errors or 'replace'!r} here"
        )
    except Exception as e:  # noqa: BLE001 (the student's code may raise anything)
        raise_unless_student_error(e)
        g.fail(f"{what} raised {type(e).__name__.removeprefix('Student')}: {e}")
    g.expect(type(got) is str, f"{what} must return a str, got {describe(got)}")
    data = b"".join(vocab[i] for i in ids)
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


def grade_decode(decode) -> None:
    """Grade ``decode(ids, vocab, errors="replace")``."""
    g = Grader("decode")
    tok = ref.Tokenizer(list(_sample_ranks()), "gpt4")

    with g.check("decode(encode(text)) gives the text back, as a str"):
        for text in (_SAMPLE, "", " ", "🙂🚀 ελληνικά"):
            _expect_decoded(g, decode, tok.encode(text), tok.vocab, shown="the vocabulary of 60 merges")

    with g.check("joins the bytes of all tokens, then decodes once (drawn vocabularies and ids)"):

        def test(case):
            vocab, ids = case
            _expect_decoded(g, decode, ids, vocab, shown=_short({i: vocab[i] for i in sorted(set(ids))}, 200))

        for_all(
            "decode.values",
            _vocabs(),
            test,
            max_examples=25,
            first=({i: bytes([i]) for i in range(256)}, [104, 105]),
        )

    with g.check("a character split across two tokens survives"):
        vocab = dict(tok.vocab)
        euro = "€".encode()  # three bytes
        vocab[1000], vocab[1001] = euro[:2], euro[2:] + b"!"
        _expect_decoded(g, decode, [1000, 1001], vocab, shown="{1000: b'\\xe2\\x82', 1001: b'\\xac!', ...}")

    with g.check(
        "bytes that are not valid UTF-8 become U+FFFD by default (errors='replace') instead of an error"
    ):
        for ids in ([0xE2, 0x82], [104, 0xFF, 105], [0xAC, 0xE2, 0x82, 0xAC, 0xE2]):
            _expect_decoded(g, decode, ids, tok.vocab)

    with g.check(
        "passes `errors` to bytes.decode: 'strict' raises UnicodeDecodeError, 'ignore' drops bad bytes"
    ):
        for ids in ([104, 0xE2, 0x82, 105], [0xFF], [226, 130, 172]):
            _expect_decoded(g, decode, ids, tok.vocab, "ignore")
            _expect_decoded(g, decode, ids, tok.vocab, "backslashreplace")
        _expect_decoded(g, decode, [104, 105], tok.vocab, "strict")
        try:
            got = decode([104, 0xE2, 0x82], tok.vocab, errors="strict")
        except UnicodeDecodeError:
            pass
        except Exception as e:  # noqa: BLE001
            raise_unless_student_error(e)
            g.fail(
                f"decode([104, 0xE2, 0x82], vocab, errors='strict') raised "
                f"{type(e).__name__.removeprefix('Student')} ({e}); with errors='strict' bytes.decode raises "
                "UnicodeDecodeError: pass errors on"
            )
        else:
            g.fail(
                f"decode([104, 0xE2, 0x82], vocab, errors='strict') returned {got!r}: with errors='strict' invalid "
                "bytes raise UnicodeDecodeError; pass errors on to .decode('utf-8', errors=errors)"
            )

    with g.check("an unknown id raises a ValueError that names it"):
        for ids in ([104, 99999], [7000], [1, 2, 256 + 60 + 3, 4], [-1]):
            bad = next(i for i in ids if i not in tok.vocab)
            try:
                got = decode(ids, tok.vocab)
            except ValueError as e:
                g.expect(
                    str(bad) in said(e),
                    f"the ValueError of decode({ids}, vocab) should name the unknown id {bad}, it says: {e}",
                )
            except KeyError:
                g.fail(
                    f"decode({ids}, vocab) raised a bare KeyError: catch it and raise "
                    "ValueError(f'unknown token id {i}') so the user learns which id is wrong"
                )
            except Exception as e:  # noqa: BLE001
                raise_unless_student_error(e)
                g.fail(
                    f"decode({ids}, vocab) raised {type(e).__name__.removeprefix('Student')} ({e}): an id that is "
                    "not in vocab must raise a ValueError that names it"
                )
            else:
                g.fail(
                    f"decode({ids}, vocab) returned {got!r}: an id that is not in vocab ({bad}) must raise a "
                    "ValueError that names it"
                )

    g.finish()


def check_decode(decode) -> None:
    g = Grader("decode (public)")
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"he", 257: b"hel"}
    with g.check("a str: decode([257, 108, 111], vocab) == 'hello'"):
        got = call_student(g, "decode([257, 108, 111], vocab)", decode, [257, 108, 111], vocab)
        g.expect(got == "hello", f"got {got!r}")
    with g.check("joins the bytes, then decodes once: decode([226, 130, 172], vocab) == '€'"):
        got = decode([226, 130, 172], vocab)
        g.expect(got == "€", f"got {got!r}: join the bytes first, then decode once")
    with g.check("invalid bytes become U+FFFD by default: decode([226, 130], vocab) == '\\ufffd'"):
        got = decode([226, 130], vocab)
        g.expect(got == "\ufffd", f"got {got!r}: use .decode('utf-8', errors=errors) with errors='replace'")
    with g.check("errors is passed on: decode([104, 226, 130], vocab, errors='ignore') == 'h'"):
        got = decode([104, 226, 130], vocab, errors="ignore")
        g.expect(got == "h", f"got {got!r}")
    with g.check("an unknown id raises a ValueError that names it: decode([104, 999], vocab)"):
        try:
            got = decode([104, 999], vocab)
        except ValueError as e:
            g.expect("999" in said(e), f"the message should name the id 999, it says: {e}")
        else:
            g.fail(f"returned {got!r}: raise a ValueError naming the unknown id")
    g.finish()


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
    merges = ref.train_naive(train_text, vocab_size, pattern)
    ranks = {p: 256 + i for i, p in enumerate(merges)}
    counts = ref.chunk_counts(test_text, pattern)
    n_tokens = sum(c * len(ref.encode_chunk(ch, ranks)) for ch, c in counts.items())
    n_bytes = len(test_text.encode("utf-8"))
    out = [
        (
            len(test_text) / n_tokens,
            "count the UTF-8 bytes of test_text (len(test_text.encode('utf-8'))), not characters",
        ),
        (n_tokens / n_bytes, "return bytes per token (bytes divided by tokens), not tokens per byte"),
        (
            n_bytes / sum(len(ref.encode_chunk(ch, ranks)) for ch in counts),
            "chunk_counts gives each distinct chunk once with its count: multiply each chunk's tokens by its count",
        ),
    ]
    if vocab_size > 256:
        big = {p: 256 + i for i, p in enumerate(ref.train_naive(train_text, vocab_size + 256, pattern))}
        n_big = sum(c * len(ref.encode_chunk(ch, big)) for ch, c in counts.items())
        out.append((n_bytes / n_big, "vocab_size counts the 256 bytes: learn vocab_size - 256 merges"))
        if pattern != "gpt4":
            other = {p: 256 + i for i, p in enumerate(ref.train_naive(train_text, vocab_size))}
            n_other = sum(c * len(ref.encode_chunk(ch, other)) for ch, c in counts.items())
            n_enc = sum(c * len(ref.encode_chunk(ch, ranks)) for ch, c in ref.chunk_counts(test_text).items())
            out += [
                (n_bytes / n_other, f"train with the given pattern ({pattern!r}), not the default"),
                (
                    n_bytes / n_enc,
                    f"split test_text with the given pattern ({pattern!r}) too, not the default",
                ),
            ]
    return out


def _expect_bpt(
    g: Grader, bytes_per_token, train_text, test_text, vocab_size, pattern=None, shown=""
) -> None:
    args = (train_text, test_text, vocab_size) + (() if pattern is None else (pattern,))
    what = f"bytes_per_token({shown or _short(args, 120)})"
    got = call_student(g, what, bytes_per_token, *args)
    g.expect(type(got) is float, f"{what} should return a Python float, got {describe(got)}")
    pat = "gpt4" if pattern is None else pattern
    truth = ref.bytes_per_token(train_text, test_text, vocab_size, pat)
    if abs(got - truth) > BPT_BAND * truth:
        for wrong, hint in _bpt_mistakes(train_text, test_text, vocab_size, pat):
            if abs(got - wrong) <= 1e-9 * abs(wrong) and abs(wrong - truth) > BPT_BAND * truth:
                g.fail(f"{what} gave {got:.5g}, expected {truth:.5g}: {hint}")
    expect_in_band(
        g,
        what,
        got,
        truth * (1 - BPT_BAND),
        truth * (1 + BPT_BAND),
        "the measurement is deterministic: train with your train_naive (vocab_size - 256 merges), encode each "
        "chunk of test_text with encode_chunk, and divide the UTF-8 bytes of test_text by the number of tokens "
        "(if Parts 3 and 4 fail their checks, fix them first)",
    )


def grade_bytes_per_token(bytes_per_token) -> None:
    """Grade the experiment ``bytes_per_token(train_text, test_text, vocab_size, pattern="gpt4")``."""
    g = Grader("bytes_per_token")
    train_text, held = _docs(*TRAIN_SLICE), _docs(*HELD_SLICE)
    with g.check("returns a Python float; no merges (vocab_size=256) gives exactly 1.0"):
        got = call_student(
            g, "bytes_per_token(manual, held_out, 256)", bytes_per_token, train_text, held, 256
        )
        g.expect(
            type(got) is float, f"bytes_per_token(...) should return a Python float, got {describe(got)}"
        )
        g.expect(got == 1.0, f"with vocab_size=256 (no merges) every byte is a token: 1.0, got {got!r}")
    with g.check("held-out manual, GPT-4 pattern: vocab_size 300 and 400, within 0.05% of the reference"):
        for vocab_size in (300, 400):
            _expect_bpt(
                g, bytes_per_token, train_text, held, vocab_size, shown=f"manual, held_out, {vocab_size}"
            )
    with g.check("the pattern argument is used for training and encoding: 'gpt2' and r'\\S+|\\s+'"):
        _expect_bpt(g, bytes_per_token, train_text, held, 350, "gpt2", shown="manual, held_out, 350, 'gpt2'")
        _expect_bpt(
            g,
            bytes_per_token,
            train_text[:8000],
            held,
            320,
            r"\S+|\s+",
            shown=r"manual[:8000], held_out, 320, r'\S+|\s+'",
        )
    with g.check("counts UTF-8 bytes, not characters (a test text with non-ASCII characters)"):
        _expect_bpt(g, bytes_per_token, _SAMPLE * 3, _SAMPLE, 300, shown="sample * 3, sample, 300")
    with g.check("another domain (Python source) and drawn short texts"):
        source = ref.stdlib_source_text(30_000)[20_000:30_000]
        _expect_bpt(g, bytes_per_token, train_text, source, 300, shown="manual, python_source, 300")

        def test(case):
            train, test_text, n_merges, pattern = case
            _expect_bpt(g, bytes_per_token, train, test_text, 256 + n_merges, pattern)

        for_all(
            "bpt.values",
            st.tuples(
                st.text(alphabet=_ALPHABET, max_size=30),
                st.text(alphabet=_ALPHABET, min_size=1, max_size=20),
                st.integers(0, 8),
                st.sampled_from(("gpt4", "gpt2")),
            ),
            test,
            max_examples=15,
            first=("aaab aaab", "aaab ab", 3, "gpt4"),
        )
    with g.check("raises ValueError for vocab_size < 256 and an empty test_text"):
        for args in (
            (train_text[:100], "abc", 255),
            (train_text[:100], "abc", 0),
            (train_text[:100], "", 300),
        ):
            expect_value_error(
                g,
                lambda args=args: bytes_per_token(*args),
                f"bytes_per_token(text, {args[1]!r}, {args[2]})",
                "say which argument is out of range and what came",
            )
    g.finish()


def check_bytes_per_token(bytes_per_token) -> None:
    """Public check of ``bytes_per_token``: no merges, and one measurement on the manual."""
    g = Grader("bytes_per_token (public)")
    with g.check("bytes_per_token('aaab aaab', 'ab', 256) == 1.0 (no merges: one token per byte)"):
        got = call_student(
            g, "bytes_per_token('aaab aaab', 'ab', 256)", bytes_per_token, "aaab aaab", "ab", 256
        )
        g.expect(got == 1.0 and type(got) is float, f"got {describe(got)}")
    with g.check(
        "train on the manual's first 20,000 characters, vocab_size=300: about 1.41 on held-out text"
    ):
        _expect_bpt(
            g, bytes_per_token, _docs(*TRAIN_SLICE), _docs(*HELD_SLICE), 300, shown="manual, held_out, 300"
        )
    g.finish()


# --------------------------------------------------------------------------- the stretch part: special tokens

#: Special strings of the drawn examples: two that share a prefix (the longest must win where both start)
#: and one made of characters the ordinary text also uses.
_SPECIALS = ("<|endoftext|>", "<|end|>", "<|endoftext|>!", "ab")
_EOT_RANKS = {(97, 97): 256}


def _expect_special(
    g: Grader, encode_with_special, text: str, ranks: dict, special: dict, shown: str = "ranks"
):
    what = f"encode_with_special({_short(text)}, {shown}, {special})"
    got = call_student(g, what, encode_with_special, text, dict(ranks), dict(special))
    g.expect(
        type(got) is list and all(type(i) is int for i in got),
        f"{what} must return a list of int ids, got {_short(got)}",
    )
    expected = ref.encode_with_special(text, ranks, special)
    if got != expected and got == ref.encode_with_special(text, ranks, {}):
        g.fail(
            f"{what} gave {got}: the special strings were encoded as ordinary text; split the text at them first"
        )
    g.expect(got == expected, f"{what} should be {expected}, got {got}")


def grade_encode_with_special(encode_with_special) -> None:
    """Grade the stretch part ``encode_with_special(text, ranks, special)``."""
    g = Grader("encode_with_special")

    with g.check("keeps each special token whole, between the encoded pieces, on drawn texts and specials"):

        def test(case):
            parts, names, n_merges, corpus = case
            ranks = {p: 256 + i for i, p in enumerate(ref.train_naive(corpus, 256 + n_merges, ".+"))}
            start = 256 + len(ranks)
            special = {s: start + 3 * k for k, s in enumerate(names)}  # ids need not be consecutive
            _expect_special(g, encode_with_special, "".join(parts), ranks, special, _short(ranks, 200))

        ordinary = st.text(alphabet=_ALPHABET + "<|>", max_size=8)
        for_all(
            "special.values",
            st.tuples(
                st.lists(st.one_of(ordinary, st.sampled_from(_SPECIALS)), max_size=6),
                st.lists(st.sampled_from(_SPECIALS), unique=True, max_size=4),
                st.integers(0, 10),
                st.text(alphabet=_ALPHABET, max_size=24),
            ),
            test,
            max_examples=25,
            first=(["aa", "<|endoftext|>", "aa"], ["<|endoftext|>"], 1, "aa aa"),
        )

    with g.check("splits the ordinary pieces into chunks with the GPT-4 pattern (no pair crosses a chunk)"):
        ranks = _sample_ranks()
        text = _SAMPLE[:120] + "<|endoftext|>" + _SAMPLE[120:240]
        _expect_special(
            g, encode_with_special, text, ranks, {"<|endoftext|>": 256 + len(ranks)}, "sample ranks"
        )
        crossing = {(97, 32): 256, (256, 98): 257}  # "a b" is the chunks "a", " b": (a, space) never meets
        _expect_special(g, encode_with_special, "a b<|e|>a b", crossing, {"<|e|>": 300}, str(crossing))

    with g.check("the longest special wins where several start at the same place; the leftmost first"):
        special = {"<|end|>": 300, "<|endoftext|>": 301}  # shorter first in the dict: order must not matter
        got = call_student(
            g,
            "encode_with_special('<|endoftext|>', {}, ...)",
            encode_with_special,
            "<|endoftext|>",
            {},
            special,
        )
        g.expect(
            got == [301],
            f"with special {special}, '<|endoftext|>' should be [301], got {got}: where several special strings "
            "start at the same place, take the longest (try them longest first)",
        )
        for text in ("x<|end|><|endoftext|><|end|>y", "<|endoftext|><|end|>", "<|en<|end|>d|>"):
            _expect_special(g, encode_with_special, text, {}, special, "{}")
        _expect_special(g, encode_with_special, "bab", {}, {"ab": 300, "ba": 301}, "{}")

    with g.check("special strings not in special, and an empty special dict, are ordinary text"):
        ranks = _sample_ranks()
        for text, special in (
            ("<|endoftext|> the fox", {}),
            ("<|endoftext|> the fox<|end|>", {"<|end|>": 400}),
            ("", {"<|end|>": 400}),
            ("é€🙂 <|x|>", {}),
        ):
            _expect_special(g, encode_with_special, text, ranks, special, "sample ranks")

    with g.check(
        "ValueError for an empty special string, an id that is a byte or a merge's id, or not an int"
    ):
        for special, what in (
            ({"": 300}, "special {'': 300}"),
            ({"<|e|>": 97}, "special {'<|e|>': 97} (97 is the byte 'a')"),
            ({"<|e|>": 255}, "special {'<|e|>': 255} (255 is the last byte)"),
            ({"<|e|>": 256}, "special {'<|e|>': 256} and ranks {(97, 97): 256} (256 is a merge)"),
            ({"<|e|>": 300, "<|f|>": -1}, "special {'<|e|>': 300, '<|f|>': -1}"),
            ({"<|e|>": 300.0}, "special {'<|e|>': 300.0} (a float)"),
        ):
            expect_value_error(
                g,
                lambda special=special: encode_with_special("a<|e|>a", dict(_EOT_RANKS), special),
                what,
                "name the special token and its id",
            )

    g.finish()


def check_encode_with_special(encode_with_special) -> None:
    """Public checks of ``encode_with_special``: the docstring's example, the longest match, one error."""
    g = Grader("encode_with_special (public)")
    eot = {"<|endoftext|>": 300}
    with g.check("with ranks {(a, a): 256}: 'aa<|endoftext|>aa' -> [256, 300, 256]"):
        got = call_student(
            g,
            "encode_with_special('aa<|endoftext|>aa', ...)",
            encode_with_special,
            "aa<|endoftext|>aa",
            dict(_EOT_RANKS),
            eot,
        )
        g.expect(got == [256, 300, 256], f"got {got!r}")
    with g.check(
        "the longest special wins: with {'<|end|>': 300, '<|endoftext|>': 301}, '<|endoftext|>' -> [301]"
    ):
        special = {"<|end|>": 300, "<|endoftext|>": 301}
        got = call_student(
            g,
            "encode_with_special('<|endoftext|>', {}, ...)",
            encode_with_special,
            "<|endoftext|>",
            {},
            special,
        )
        g.expect(got == [301], f"got {got!r}")
    with g.check("ValueError for a special id that is a byte: special = {'<|e|>': 97}"):
        expect_value_error(g, lambda: encode_with_special("a", {}, {"<|e|>": 97}), "special {'<|e|>': 97}")
    g.finish()

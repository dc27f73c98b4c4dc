"""Checks for Exercise 5 (byte-level BPE).

``check_*`` are the public checks (one small example each); ``grade_*`` the hidden
ones, which compare the student's function with :mod:`coursekit.bpe` on texts the
student has not seen and test the stated rules (overlaps, tie-break, merge order,
cut UTF-8 characters).
"""

from __future__ import annotations

import random

import regex

from coursekit import bpe as ref
from coursekit.grading.core import Grader, describe, generator, probe

__all__ = [
    "check_get_pair_counts", "check_merge", "check_train", "check_encode_chunk", "check_decode",
    "grade_get_pair_counts", "grade_merge", "grade_train", "grade_encode_chunk", "grade_decode",
]

#: Text the hidden checks train and encode on: English, code, digits and non-Latin scripts.
_SAMPLE = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away, and the\n"
    "other foxes follow the first fox into the forest. 1234 + 5678 = 6912.\n"
    "def tokenize(text):\n    return [t for t in text.split() if t]\n"
    "Ünïcödé: naïve café, Straße, ελληνικά, русский, 日本語のテキスト, emoji 🙂🙂🚀.\n"
)


def _ids(name: str, n: int, alphabet: int) -> list[int]:
    rng = random.Random(generator(name).initial_seed())
    return [rng.randrange(alphabet) for _ in range(n)]


def _plain_counts(x) -> dict | None:
    """A dict (a Counter or defaultdict is fine; under the autograder they arrive as dicts)."""
    return dict(x) if isinstance(x, dict) else None


# --------------------------------------------------------------------------- pair counts


def grade_get_pair_counts(get_pair_counts) -> None:
    """Grade ``get_pair_counts(ids, counts=None, weight=1)``."""
    g = Grader("get_pair_counts")

    with g.check("counts adjacent pairs of random sequences"):
        for n, alphabet in ((20, 3), (50, 5), (2, 2)):
            ids = _ids(f"pairs.{n}", n, alphabet)
            got = get_pair_counts(ids)
            g.expect(_plain_counts(got) is not None, f"return a dict of pair -> count, got {describe(got)}")
            g.expect(_plain_counts(got) == ref.get_pair_counts(ids), f"get_pair_counts({ids}) is wrong: expected {ref.get_pair_counts(ids)}")

    with g.check("overlapping pairs all count: [7, 7, 7] holds (7, 7) twice"):
        got = get_pair_counts([7, 7, 7, 7, 1])
        g.expect(
            _plain_counts(got) is not None and got.get((7, 7)) == 3,
            f"get_pair_counts([7, 7, 7, 7, 1]) should count (7, 7) three times, got {got!r}: "
            "count every adjacent position (zip(ids, ids[1:])), also where pairs overlap",
        )

    with g.check("short sequences have no pairs"):
        for ids in ([], [5]):
            got = get_pair_counts(ids)
            g.expect(_plain_counts(got) == {}, f"get_pair_counts({ids}) should be {{}}, got {got!r}")

    with g.check("adds `weight` per occurrence into an existing `counts`"):
        counts = {(1, 2): 10, (9, 9): 1}
        got = get_pair_counts([1, 2, 1, 2], counts, 5)
        expected = {(1, 2): 20, (9, 9): 1, (2, 1): 5}
        g.expect(
            _plain_counts(got) == expected,
            f"get_pair_counts([1, 2, 1, 2], {{(1, 2): 10, (9, 9): 1}}, 5) should add 5 per occurrence to the given dict "
            f"and return it: expected {expected}, got {got!r}",
        )

    with g.check("leaves `ids` unchanged"):
        ids = [3, 4, 3, 4]
        after = probe(get_pair_counts, list(ids)).args[0]
        g.expect(after == ids, "get_pair_counts changed its input list: only read it")

    g.finish()


# --------------------------------------------------------------------------- merge


def grade_merge(merge) -> None:
    """Grade ``merge(ids, pair, new_id)``."""
    g = Grader("merge")

    with g.check("replaces every occurrence of the pair"):
        for n, alphabet in ((30, 3), (60, 4)):
            ids = _ids(f"merge.{n}", n, alphabet)
            pair = (ids[3], ids[4])
            got = merge(ids, pair, 99)
            expected = ref.merge(ids, pair, 99)
            g.expect(type(got) is list, f"merge must return a new list, got {describe(got)}")
            if type(got) is list and got.count(99) == 1 < expected.count(99):
                g.fail("only the first occurrence was merged: replace every occurrence, scanning the whole list")
            g.expect(got == expected, f"merge({ids}, {pair}, 99) should be {expected}, got {got}")

    with g.check("overlapping occurrences merge left to right: [5, 5, 5] -> [9, 5]"):
        got = merge([5, 5, 5], (5, 5), 9)
        if got == [9, 9]:
            g.fail("[5, 5, 5] became [9, 9]: the middle 5 was used twice; after a merge, skip both tokens (i += 2)")
        g.expect(got == [9, 5], f"merge([5, 5, 5], (5, 5), 9) should be [9, 5], got {got}")
        got = merge([5, 5, 5, 5, 5], (5, 5), 9)
        g.expect(got == [9, 9, 5], f"merge([5, 5, 5, 5, 5], (5, 5), 9) should be [9, 9, 5], got {got}")

    with g.check("a pair in the other order, or absent, is not merged"):
        g.expect(merge([2, 1, 2], (1, 2), 7) == [2, 7], "merge([2, 1, 2], (1, 2), 7) should be [2, 7]")
        g.expect(merge([2, 1], (1, 2), 7) == [2, 1], "merge([2, 1], (1, 2), 7) should be [2, 1]: (2, 1) is not (1, 2)")
        g.expect(merge([], (1, 2), 7) == [], "merge([], (1, 2), 7) should be []")
        g.expect(merge([1], (1, 2), 7) == [1], "merge([1], (1, 2), 7) should be [1]: a lone 1 at the end is not a pair")

    g.finish()


# --------------------------------------------------------------------------- training


def grade_train(train_naive) -> None:
    """Grade ``train_naive(text, vocab_size, pattern="gpt4")``, the training loop."""
    g = Grader("train_naive")

    with g.check("learns the reference merges on a mixed text"):
        for size in (256 + 40, 256 + 5):
            got = train_naive(_SAMPLE, size)
            expected = ref.train_naive(_SAMPLE, size)
            g.expect(type(got) is list, f"train_naive must return the list of merges, got {describe(got)}")
            got = [tuple(p) if type(p) in (tuple, list) else p for p in got]
            g.expect(len(got) == len(expected), f"with vocab_size={size} expected {len(expected)} merges, got {len(got)}")
            for i, (a, b) in enumerate(zip(got, expected)):
                if a != b:
                    for shift in (1, -1):
                        if any(x >= 256 for x in b) and tuple(x + shift if x >= 256 else x for x in b) == a:
                            g.fail("the new ids are off by one: merge i creates id 256 + i (the first new id is 256)")
                    g.fail(f"merge {i} should be {b}, got {a} (the merges before it agreed)")

    with g.check("pairs never cross chunk boundaries"):
        text = "ab ab ab cd cd"
        got = [tuple(p) for p in train_naive(text, 256 + 4)]
        expected = ref.train_naive(text, 256 + 4)
        crossing = [t for t in _token_bytes(got) if regex.search(rb"\S ", t)]
        if crossing:
            g.fail(f"you learnt the token {crossing[0]!r}, which joins a word and the space after it, which are in "
                   "different chunks: split the text with chunk_counts(text, pattern) and count pairs inside each chunk")
        g.expect(got == expected, f"train_naive({text!r}, 260) should learn {expected}, got {got}")

    with g.check("ties go to the smallest (left, right) pair"):
        text = "zy ab zy ab"  # (32, 97), (97, 98) and (122, 121) all occur twice
        got = [tuple(p) for p in train_naive(text, 257)]
        g.expect(
            got == [(32, 97)],
            f"in {text!r} the pairs (32, 97), (97, 98) and (122, 121) all occur twice; the rule picks the smallest, "
            f"(32, 97), but you merged {got}: choose max count, then the smallest pair "
            "(for example min(counts, key=lambda p: (-counts[p], p)))",
        )

    with g.check("stops when no pair occurs twice"):
        text = "abcabc xyz"
        got = [tuple(p) for p in train_naive(text, 256 + 50)]
        expected = ref.train_naive(text, 256 + 50)
        g.expect(
            got == expected,
            f"train_naive({text!r}, 306) should stop after {len(expected)} merges ({expected}), got {len(got)}: "
            "stop when the best pair occurs fewer than 2 times (a merge that saves nothing)",
        )

    g.finish()


def _token_bytes(merges: list) -> list[bytes]:
    """The bytes of the tokens that ``merges`` create (skipping merges that use unknown ids)."""
    vocab = {i: bytes([i]) for i in range(256)}
    for i, pair in enumerate(merges):
        if len(pair) == 2 and all(x in vocab for x in pair):
            vocab[256 + i] = vocab[pair[0]] + vocab[pair[1]]
    return [vocab[i] for i in range(256, 256 + len(merges)) if i in vocab]


# --------------------------------------------------------------------------- encoding


def _sample_ranks(size: int = 256 + 60) -> dict:
    return {pair: 256 + i for i, pair in enumerate(ref.train_naive(_SAMPLE, size))}


def grade_encode_chunk(encode_chunk) -> None:
    """Grade ``encode_chunk(chunk, ranks)``."""
    g = Grader("encode_chunk")
    ranks = _sample_ranks()

    with g.check("encodes chunks like the reference"):
        for chunk in ref.chunk_counts(_SAMPLE):
            got = encode_chunk(chunk, ranks)
            expected = ref.encode_chunk(chunk, ranks)
            g.expect(type(got) is list, f"encode_chunk must return a list of ids, got {describe(got)}")
            g.expect(got == expected, f"encode_chunk({chunk!r}) should be {expected}, got {got}")

    with g.check("merges by rank, not left to right"):
        # ranks: (b, c) first, then (a, b); "abc" must become [a, bc], not [ab, c]
        r = {(98, 99): 256, (97, 98): 257}
        got = encode_chunk("abc", r)
        if got == [257, 99]:
            g.fail("'abc' became [ab, c]: you merged the leftmost learnt pair; merge the pair with the lowest rank "
                   "(the one learnt first) at each step")
        g.expect(got == [97, 256], f"with ranks {{(b, c): 256, (a, b): 257}}, 'abc' should be [97, 256], got {got}")

    with g.check("keeps merging until no learnt pair is left"):
        r = {(97, 97): 256, (256, 256): 257, (257, 97): 258}
        got = encode_chunk("aaaaa", r)
        g.expect(got == [258], f"with ranks {r}, 'aaaaa' should become [258] after three merges, got {got}: "
                               "repeat until no adjacent pair is in ranks")

    with g.check("non-ASCII text starts from its UTF-8 bytes"):
        for chunk in ("é", "日本", "🙂"):
            got = encode_chunk(chunk, {})
            g.expect(got == list(chunk.encode("utf-8")), f"encode_chunk({chunk!r}, {{}}) should be its UTF-8 bytes "
                                                         f"{list(chunk.encode('utf-8'))}, got {got}")

    g.finish()


# --------------------------------------------------------------------------- decoding


def grade_decode(decode) -> None:
    """Grade ``decode(ids, vocab)``."""
    g = Grader("decode")
    tok = ref.Tokenizer(list(_sample_ranks()), "gpt4")

    with g.check("decode(encode(text)) gives the text back"):
        for text in (_SAMPLE, "", " ", "🙂🚀 ελληνικά"):
            ids = tok.encode(text)
            got = decode(ids, tok.vocab)
            g.expect(type(got) is str, f"decode must return a str, got {describe(got)}")
            g.expect(got == text, f"decoding the ids of {text[:40]!r} gave {got[:40]!r}")

    with g.check("a character split across two tokens survives"):
        vocab = dict(tok.vocab)
        euro = "€".encode()  # three bytes
        vocab[1000], vocab[1001] = euro[:2], euro[2:] + b"!"
        got = decode([1000, 1001], vocab)
        g.expect(
            got == "€!",
            f"tokens b'\\xe2\\x82' and b'\\xac!' should decode to '€!', got {got!r}: join the bytes of all tokens "
            "first, then decode once (decoding token by token breaks characters split across tokens)",
        )

    with g.check("bytes that are not valid UTF-8 become U+FFFD instead of an error"):
        try:
            got = decode([0xE2, 0x82], tok.vocab)
        except UnicodeDecodeError:
            g.fail("decode([0xE2, 0x82]) (a cut '€') raised UnicodeDecodeError: generated text can end in the middle "
                   "of a character; use .decode('utf-8', errors='replace')")
        g.expect(
            got == "\ufffd",
            f"decode([0xE2, 0x82]) (a cut '€') should be '\\ufffd', got {got!r}: use .decode('utf-8', errors='replace')",
        )

    with g.check("an unknown id raises a ValueError that names it"):
        try:
            got = decode([104, 99999], tok.vocab)
        except ValueError as e:
            g.expect("99999" in str(e), f"the ValueError should name the unknown id 99999, it says: {e}")
        except KeyError:
            g.fail("decode([104, 99999]) raised a bare KeyError: catch it and raise "
                   "ValueError(f'unknown token id {i}') so the user learns which id is wrong")
        else:
            g.fail(f"decode([104, 99999]) returned {got!r}: an id that is not in vocab must raise a ValueError")

    g.finish()


# --------------------------------------------------------------------------- public checks


def check_get_pair_counts(get_pair_counts) -> None:
    g = Grader("get_pair_counts (public)")
    with g.check("[1, 2, 3, 1, 2] -> {(1, 2): 2, (2, 3): 1, (3, 1): 1}"):
        got = get_pair_counts([1, 2, 3, 1, 2])
        g.expect(got == {(1, 2): 2, (2, 3): 1, (3, 1): 1}, f"got {got!r}")
    with g.check("[7, 7, 7] -> {(7, 7): 2} (overlapping pairs count)"):
        got = get_pair_counts([7, 7, 7])
        g.expect(got == {(7, 7): 2}, f"got {got!r}: count every adjacent position, also overlapping ones")
    g.finish()


def check_merge(merge) -> None:
    g = Grader("merge (public)")
    with g.check("merge([1, 2, 3, 1, 2], (1, 2), 256) == [256, 3, 256]"):
        got = merge([1, 2, 3, 1, 2], (1, 2), 256)
        g.expect(got == [256, 3, 256], f"got {got!r}")
    with g.check("merge([5, 5, 5], (5, 5), 9) == [9, 5] (left to right, no overlap)"):
        got = merge([5, 5, 5], (5, 5), 9)
        g.expect(got == [9, 5], f"got {got!r}: after merging two tokens, continue after both")
    g.finish()


def check_train(train_naive) -> None:
    g = Grader("train_naive (public)")
    with g.check("the worked example: 'aaabdaaabac' with the pattern '.+' learns aa, ab, then (aa)(ab)"):
        got = [tuple(p) for p in train_naive("aaabdaaabac", 259, ".+")]
        g.expect(got == [(97, 97), (97, 98), (256, 257)], f"got {got!r}")
    g.finish()


def check_encode_chunk(encode_chunk) -> None:
    g = Grader("encode_chunk (public)")
    ranks = {(97, 97): 256, (256, 97): 257}
    with g.check("with ranks {(a, a): 256, (aa, a): 257}: 'aaa' -> [257], 'aaaa' -> [256, 256]"):
        got = (encode_chunk("aaa", ranks), encode_chunk("aaaa", ranks))
        g.expect(got == ([257], [256, 256]), f"got {got!r}")
    g.finish()


def check_decode(decode) -> None:
    g = Grader("decode (public)")
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"he", 257: b"hel"}
    with g.check("decode([257, 108, 111], vocab) == 'hello'"):
        got = decode([257, 108, 111], vocab)
        g.expect(got == "hello", f"got {got!r}")
    with g.check("decode([226, 130, 172], vocab) == '€' (one character, three byte tokens)"):
        got = decode([226, 130, 172], vocab)
        g.expect(got == "€", f"got {got!r}: join the bytes first, then decode once")
    g.finish()

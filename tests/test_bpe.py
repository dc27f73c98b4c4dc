"""coursekit.bpe against independent references: tiktoken with our ranks, the naive recount loop."""

from __future__ import annotations

import functools

import pytest
import tiktoken

from coursekit import bpe

EOT = "<|endoftext|>"

EDGE_CASES = [
    "",
    " ",
    "   \n\n\t  \r\n ",
    "Hello, world!",
    "don't DON'T we'll they've I'M",
    "!!! ... ??? ;-) (a) [b] {c} <d>",
    "1234567 3.14159 1e-10 0x1F",
    "Straße naïve café Ελληνικά Русский текст",
    "日本語のテキスト 中文文本 한국어",
    "emoji 🙂🚀👩‍👩‍👧 flags 🇩🇪🇯🇵",
    "tabs\tand\nnewlines\n\n\nand trailing spaces   ",
    "def f(x):\n    return x ** 2  # square\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]


@functools.cache
def corpus() -> str:
    return bpe.python_docs_text()


@functools.cache
def trained(pattern: str = "gpt4", vocab_size: int = 1024) -> bpe.Tokenizer:
    return bpe.train(corpus(), vocab_size, pattern, special_tokens=[EOT])


def tiktoken_twin(tok: bpe.Tokenizer) -> tiktoken.Encoding:
    """A tiktoken encoding built offline from our merges, pattern and special tokens."""
    return tiktoken.Encoding(
        name="coursekit-test",
        pat_str=tok.pattern,
        mergeable_ranks=tok.mergeable_ranks(),
        special_tokens=tok.special_tokens,
    )


# --------------------------------------------------------------------------- primitives


def test_pair_counts_count_overlapping_pairs():
    assert bpe.get_pair_counts([1, 2, 3, 1, 2]) == {(1, 2): 2, (2, 3): 1, (3, 1): 1}
    assert bpe.get_pair_counts([7, 7, 7]) == {(7, 7): 2}
    assert bpe.get_pair_counts([5]) == {} and bpe.get_pair_counts([]) == {}


def test_merge_is_left_to_right_without_overlap():
    assert bpe.merge([5, 5, 5, 6], (5, 5), 9) == [9, 5, 6]
    assert bpe.merge([5, 5, 5, 5], (5, 5), 9) == [9, 9]
    assert bpe.merge([1, 2, 1, 2, 1], (1, 2), 7) == [7, 7, 1]
    assert bpe.merge([2, 1], (1, 2), 7) == [2, 1]


def test_the_worked_example_and_its_tie_break():
    """aaabdaaabac: aa (4) first; then ab and (aa)a tie at 2 and (97, 98) < (256, 97) wins."""
    tok = bpe.train("aaabdaaabac", 259, pattern=r".+")
    assert tok.merges == [(97, 97), (97, 98), (256, 257)]
    assert tok.vocab[258] == b"aaab"
    assert tok.encode("aaabdaaabac") == [258, ord("d"), 258, ord("a"), ord("c")]


def test_ties_go_to_the_smallest_pair():
    # every pair occurs exactly twice: (98, 99) < (99, 100) < (100, 98) ...; "bc" is merged first
    tok = bpe.train(["bcd", "bcd", "xyz", "xyz"], 257, pattern=r".+")
    assert tok.merges == [(98, 99)]
    tok = bpe.train(["zy", "zy", "ab", "ab"], 258, pattern=r".+")
    assert tok.merges == [(97, 98), (122, 121)]


def test_training_stops_when_no_pair_repeats():
    tok = bpe.train("abcdef", 300, pattern=r".+")
    assert tok.merges == [] and len(tok) == 256


@pytest.mark.slow  # not in the quick loop: trains twice, once recounting every pair at each merge
def test_incremental_training_equals_the_naive_recount():
    text = corpus()[:40_000]
    for pattern in ("gpt2", "gpt4"):
        assert bpe.train(text, 256 + 300, pattern).merges == bpe.train_naive(text, 256 + 300, pattern)


def test_chunks_of_separate_texts_never_merge_across():
    tok = bpe.train(["ab", "ab", "ab"], 300, pattern=r".+")
    assert tok.merges == [(97, 98)]
    tok = bpe.train(["a", "b", "a", "b"], 300, pattern=r".+")
    assert tok.merges == []


# --------------------------------------------------------------------------- exactness against tiktoken


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_token_ids_equal_tiktoken_on_the_corpus_and_edge_cases(pattern):
    tok = trained(pattern)
    twin = tiktoken_twin(tok)
    text = corpus()
    assert tok.encode(text) == twin.encode_ordinary(text)
    for case in EDGE_CASES:
        assert tok.encode(case) == twin.encode_ordinary(case), case
    with_special = f"first document{EOT}second document"
    assert tok.encode(with_special, allowed_special="all") == twin.encode(with_special, allowed_special="all")


def test_patterns_are_tiktokens():
    """Our split patterns are the ones tiktoken ships for GPT-2 and GPT-4 (read from its source,
    since building those encodings would download their ranks)."""
    import inspect
    import re

    from tiktoken_ext import openai_public

    assert bpe.GPT2_PATTERN == openai_public.r50k_pat_str
    source = inspect.getsource(openai_public.cl100k_base)
    literal = re.search(r'"pat_str": r"""(.*?)"""', source).group(1)
    assert bpe.GPT4_PATTERN == literal


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("case", EDGE_CASES)
def test_decode_inverts_encode(case):
    tok = trained()
    assert tok.decode(tok.encode(case)) == case


def test_decode_inverts_encode_on_the_whole_corpus():
    tok = trained()
    assert tok.decode(tok.encode(corpus())) == corpus()


def test_decoding_a_cut_utf8_character():
    tok = trained()
    ids = tok.encode("€")  # 3 bytes; the trained vocabulary has no token for it
    assert len(ids) > 1
    assert tok.decode_bytes(ids[:1]) == "€".encode()[: len(tok.vocab[ids[0]])]
    assert tok.decode(ids[:1]) == "\ufffd" == tiktoken_twin(tok).decode(ids[:1])
    assert tok.decode(ids[:1]) + tok.decode(ids[1:]) != "€"  # cut characters are lost when decoded apart ...
    assert tok.decode_bytes(ids[:1]) + tok.decode_bytes(ids[1:]) == "€".encode()  # ... but never their bytes
    with pytest.raises(UnicodeDecodeError):
        tok.decode(ids[:1], errors="strict")


def test_special_tokens():
    tok = trained()
    eot = tok.special_tokens[EOT]
    assert eot == len(tok) - 1 == 256 + len(tok.merges)
    assert tok.encode(f"a{EOT}b", allowed_special={EOT}) == tok.encode("a") + [eot] + tok.encode("b")
    with pytest.raises(ValueError, match="special token"):
        tok.encode(f"a{EOT}b")
    plain = tok.encode_ordinary(f"a{EOT}b")
    assert eot not in plain and tok.decode(plain) == f"a{EOT}b"
    with pytest.raises(ValueError, match="not special tokens"):
        tok.encode("x", allowed_special={"<|nope|>"})


def test_save_and_load_round_trip(tmp_path):
    tok = trained()
    path = tok.save(tmp_path / "tok.json")
    again = bpe.Tokenizer.load(path)
    assert (
        again.merges == tok.merges
        and again.pattern == tok.pattern
        and again.special_tokens == tok.special_tokens
    )
    text = corpus()[:20_000] + EOT + EDGE_CASES[9]
    assert again.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")


def test_bad_files_and_bad_input_give_clear_errors(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a coursekit BPE file"):
        bpe.Tokenizer.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"format": "coursekit-bpe", "version": 99}')
    with pytest.raises(ValueError, match="version 99"):
        bpe.Tokenizer.load(tmp_path / "y.json")
    with pytest.raises(ValueError, match="smaller than 256"):
        bpe.train("abc", 200)
    with pytest.raises(ValueError, match="does not exist"):
        bpe.Tokenizer([(300, 1)])
    with pytest.raises(ValueError, match="unknown token id"):
        trained().decode([10**6])
    with pytest.raises(TypeError, match="must be str"):
        trained().encode(b"bytes")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        bpe.read_text(tmp_path / "bin.txt")


def test_corpora():
    text = corpus()
    assert 400_000 < len(text) < 600_000 and "assignment" in text
    source = bpe.stdlib_source_text(max_bytes=50_000)
    assert len(source) == 50_000 and "def " in source


# --------------------------------------------------------------------------- failure modes

NUMBER_CASES = [
    "1234",
    "12345",
    "2024",
    " 2024",
    "1000000",
    "x=3.14159, y=-0.5e10",
    "٣٤٥ ²³ 10¹⁰",
    "a1b22c333d4444",
]


def test_cl100k_splits_digit_runs_into_groups_of_three_from_the_left():
    """The GPT-4 (cl100k_base) pattern, applied with the regex module directly: a run of n digits
    becomes the chunks s[0:3], s[3:6], ... (an exact formula)."""
    import regex

    for n in range(1, 13):
        digits = "".join(str((7 * k + 3) % 10) for k in range(n))
        assert regex.findall(bpe.GPT4_PATTERN, digits) == [digits[i : i + 3] for i in range(0, n, 3)]


def test_single_digit_pattern_is_gpt4_with_each_digit_apart():
    """SINGLE_DIGIT_PATTERN gives GPT-4's chunks, except that each number chunk falls apart into digits."""
    import regex

    assert r"\p{N}{1,3}+" in bpe.GPT4_PATTERN and r"\p{N}{1,3}+" not in bpe.SINGLE_DIGIT_PATTERN
    for text in [*EDGE_CASES, *NUMBER_CASES, corpus()[:30_000]]:
        expected = []
        for chunk in regex.findall(bpe.GPT4_PATTERN, text):
            expected.extend(chunk if regex.fullmatch(r"\p{N}+", chunk) else [chunk])
        got = regex.findall(bpe.SINGLE_DIGIT_PATTERN, text)
        assert got == expected, text[:40]
        assert all(sum(ch.isdigit() for ch in chunk) <= 1 for chunk in got)


def test_a_single_digit_tokenizer_learns_no_multi_digit_token_and_matches_tiktoken():
    text = corpus()[:60_000] + " ".join(str(3 * k * k) for k in range(2_000))  # plenty of numbers
    tok = bpe.train(text, 256 + 300, bpe.SINGLE_DIGIT_PATTERN)
    assert not any(
        sum(ch.isdigit() for ch in tok.vocab[i].decode("utf-8", "ignore")) > 1 for i in range(256, len(tok))
    )
    gpt4 = bpe.train(text, 256 + 300, "gpt4")
    assert any(
        tok_bytes.isdigit() and len(tok_bytes) > 1 for tok_bytes in gpt4.vocab.values()
    )  # it could have
    twin = tiktoken_twin(tok)
    for case in [*EDGE_CASES, *NUMBER_CASES]:
        assert tok.encode(case) == twin.encode_ordinary(case), case
    assert bpe.token_pieces(tok, "12345") == ["1", "2", "3", "4", "5"]


def test_token_pieces_are_tiktokens_token_bytes():
    tok = trained()
    twin = tiktoken_twin(tok)
    for case in [*EDGE_CASES, *NUMBER_CASES, f"a{EOT}b", " strawberry The the  THE"]:
        expected = [
            twin.decode_single_token_bytes(i).decode("utf-8", errors="backslashreplace")
            for i in twin.encode_ordinary(case)
        ]
        assert bpe.token_pieces(tok, case) == expected, case
    assert "".join(bpe.token_pieces(tok, "Hello, world!  x")) == "Hello, world!  x"
    euro = bpe.token_pieces(tok, "€")  # no token for it in this vocabulary: stray bytes are escaped
    assert len(euro) > 1 and euro[0].startswith("\\x")
    with pytest.raises(TypeError, match="must be str"):
        bpe.token_pieces(tok, b"bytes")


def test_token_counts_equal_counting_tiktokens_ids():
    from collections import Counter

    tok = trained("gpt2")
    twin = tiktoken_twin(tok)
    for text in [corpus()[-50_000:], bpe.stdlib_source_text(30_000), ""]:
        assert bpe.token_counts(tok, text) == Counter(twin.encode_ordinary(text))


def test_under_trained_tokens_by_hand():
    # merges: "ab" (4 times) then "cd" (2 times); the model text has "ab" and bytes, never "cd"
    tok = bpe.train(["ab", "ab", "ab", "ab", "cd", "cd"], 258, pattern=r".+")
    assert tok.merges == [(97, 98), (99, 100)]
    rows = bpe.under_trained_tokens(tok, "ab ab ab ab cd cd", "ab ab x")
    assert rows[0] == (257, 2, 0)  # "cd": twice in the tokenizer's text, never in the model's
    assert {i for i, _, _ in rows} == set(range(258)) - {256, ord(" "), ord("x")}
    assert [(a, b) for _, a, b in rows] == sorted(((a, b) for _, a, b in rows), key=lambda r: -r[0])
    assert (256, 4, 2) in bpe.under_trained_tokens(tok, "ab ab ab ab cd cd", "ab ab x", max_count=2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_count"):
            bpe.under_trained_tokens(tok, "ab", "ab", max_count=bad)


def test_under_trained_tokens_against_tiktoken_counts():
    from collections import Counter

    tok = trained()
    twin = tiktoken_twin(tok)
    text_a, text_b = corpus()[:200_000], bpe.stdlib_source_text(100_000)
    count_a, count_b = Counter(twin.encode_ordinary(text_a)), Counter(twin.encode_ordinary(text_b))
    for max_count in (0, 3):
        expected = sorted(
            ((i, count_a[i], count_b[i]) for i in range(256 + len(tok.merges)) if count_b[i] <= max_count),
            key=lambda row: (-row[1], row[0]),
        )
        assert bpe.under_trained_tokens(tok, text_a, text_b, max_count) == expected
    assert tok.special_tokens[EOT] not in {i for i, _, _ in expected}

"""coursekit.data: the corpus is the one defined, splits and tokenizers invert exactly, batches are
windows of the data shifted by one, and randomness comes only from the generator passed in."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from coursekit import bpe, data


@functools.cache
def corpus() -> str:
    return data.python_docs_text()


# --------------------------------------------------------------------------- text


def test_python_docs_is_the_defined_corpus():
    from pydoc_data.topics import topics

    assert data.python_docs_text is bpe.python_docs_text  # one source of truth
    text = corpus()
    assert text == "\n\n".join(topics[k] for k in sorted(topics))
    if sys.version_info[:2] == (3, 11):
        assert len(text) == 465_126  # the size the issue states for Python 3.11
    else:
        assert len(text) > 400_000


def test_load_text_reads_the_corpus_and_user_files(tmp_path):
    assert data.load_text("python-docs") == corpus()
    path = tmp_path / "mine.txt"
    path.write_text("héllo wörld\n🙂\n", encoding="utf-8")
    assert data.load_text(path) == data.load_text(str(path)) == "héllo wörld\n🙂\n"


def test_load_text_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file: 'nope\.txt'.*python-docs"):
        data.load_text("nope.txt")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        data.load_text(tmp_path / "bin.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        data.load_text(tmp_path / "empty.txt")
    with pytest.raises(TypeError, match="corpus name or a path"):
        data.load_text(42)


def test_split_keeps_order_and_cuts_at_the_fraction():
    assert data.split_text("abcdefghij") == ("abcdefghi", "j")
    text = corpus()
    train, val = data.split_text(text)
    assert train + val == text
    assert abs(len(train) - 0.9 * len(text)) < 1 and text.startswith(train) and text.endswith(val)
    train, val = data.split_text(text, 0.5)
    assert train + val == text and abs(len(train) - len(val)) <= 1


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_split_rejects_fractions_outside_0_1(fraction):
    with pytest.raises(ValueError, match=f"strictly between 0 and 1, got {fraction}"):
        data.split_text("abc", fraction)


# --------------------------------------------------------------------------- character tokenizer


def test_char_tokenizer_vocabulary_is_the_sorted_characters():
    tok = data.CharTokenizer.from_text("hello")
    assert tok.chars == ["e", "h", "l", "o"] and tok.vocab_size == len(tok) == 4
    assert tok.encode("hole") == [1, 3, 2, 0]
    text = corpus()
    tok = data.CharTokenizer.from_text(text)
    assert tok.chars == sorted(set(text)) and tok.vocab_size == len(set(text))


def test_char_tokenizer_round_trips_the_corpus_and_its_validation_split():
    text = corpus()
    tok = data.CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert len(ids) == len(text) and min(ids) == 0 and max(ids) == tok.vocab_size - 1
    assert tok.decode(ids) == text
    _, val = data.split_text(text)
    assert tok.decode(torch.tensor(tok.encode(val))) == val  # tensors decode too


def test_char_tokenizer_names_unknown_characters_and_ids():
    tok = data.CharTokenizer.from_text("abc")
    with pytest.raises(
        ValueError, match=r"character 'z' \(U\+007A\) at position 2 is not in the vocabulary of 3"
    ):
        tok.encode("abzc")
    for bad in (3, -1):  # -1 must not wrap around to the last character
        with pytest.raises(ValueError, match=f"unknown token id {bad} \\(vocabulary size 3\\)"):
            tok.decode([0, bad])
    with pytest.raises(ValueError, match="distinct"):
        data.CharTokenizer(["a", "b", "a"])
    with pytest.raises(ValueError, match="one character, got 'ab'"):
        data.CharTokenizer(["ab"])
    with pytest.raises(ValueError, match="at least one character"):
        data.CharTokenizer([])


def test_char_tokenizer_save_and_load(tmp_path):
    text = 'naïve café 🙂\n\t"quotes" \\ backslash'
    tok = data.CharTokenizer.from_text(text)
    again = data.CharTokenizer.load(tok.save(tmp_path / "chars.json"))
    assert again.chars == tok.chars and again.encode(text) == tok.encode(text)
    assert not list(tmp_path.glob("*.tmp"))
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a coursekit character tokenizer file"):
        data.CharTokenizer.load(tmp_path / "x.json")
    (tmp_path / "bpe.json").write_text('{"format": "coursekit-bpe", "version": 1}')
    with pytest.raises(ValueError, match="not a coursekit character tokenizer file"):
        data.CharTokenizer.load(tmp_path / "bpe.json")
    (tmp_path / "v9.json").write_text('{"format": "coursekit-char", "version": 9, "chars": ["a"]}')
    with pytest.raises(ValueError, match="version 9"):
        data.CharTokenizer.load(tmp_path / "v9.json")


# --------------------------------------------------------------------------- BPE and prepare


def test_bpe_tokenizer_is_chapter_5s_and_round_trips():
    text = corpus()[:20_000]
    tok = data.bpe_tokenizer(text, 300)
    assert isinstance(tok, bpe.Tokenizer) and tok.vocab_size == 300
    assert tok.merges == bpe.train(text, 300).merges
    tail = corpus()[-5_000:]
    ids = data.encode_text(tok, tail)
    assert ids.dtype == torch.long and ids.dim() == 1 and len(ids) < len(tail)  # merges compress
    assert tok.decode(ids.tolist()) == tail


def test_prepare_char_encodes_each_split_once(tmp_path):
    text = "the cat sat on the mat. " * 50 + "zebra!"
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    d = data.prepare(path, "char")
    train, val = data.split_text(text)
    assert isinstance(d.tokenizer, data.CharTokenizer) and d.vocab_size == len(set(text))  # 'z' only in val
    assert d.train.dtype == d.val.dtype == torch.long
    assert d.tokenizer.decode(d.train) == train and d.tokenizer.decode(d.val) == val


def test_prepare_bpe_trains_on_the_training_split_only(tmp_path):
    text = "low lower lowest " * 40 + "newer newest wider " * 10
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    d = data.prepare(path, "bpe", vocab_size=270)
    train, val = data.split_text(text)
    assert d.tokenizer.merges == bpe.train(train, 270).merges
    assert d.tokenizer.decode(d.train.tolist()) == train and d.tokenizer.decode(d.val.tolist()) == val


def test_prepare_rejects_inconsistent_arguments():
    with pytest.raises(ValueError, match="'char' or 'bpe', got 'word'"):
        data.prepare("python-docs", "word")
    with pytest.raises(ValueError, match="needs a vocab_size"):
        data.prepare("python-docs", "bpe")
    with pytest.raises(ValueError, match="got vocab_size=100"):
        data.prepare("python-docs", "char", vocab_size=100)


# --------------------------------------------------------------------------- batches


def test_lm_batch_rows_are_windows_and_targets_are_the_next_tokens():
    tokens = torch.arange(1000, 1100)  # token value = 1000 + position, so a row reveals its offset
    g = torch.Generator().manual_seed(0)
    x, y = data.lm_batch(tokens, block_size=8, batch_size=16, generator=g)
    assert x.shape == y.shape == (16, 8) and x.dtype == y.dtype == torch.long
    assert x.is_contiguous() and y.is_contiguous()
    offsets = x[:, 0] - 1000
    expected = tokens[offsets[:, None] + torch.arange(8)]  # (B, T) by explicit indexing
    assert torch.equal(x, expected) and torch.equal(y, expected + 1)


def test_lm_batch_reaches_every_offset_including_the_last():
    tokens = torch.arange(6)  # T = 3: valid offsets 0, 1, 2 (the last window ends on the last token)
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        x, y = data.lm_batch(tokens, 3, 4, g)
        seen.update(x[:, 0].tolist())
        assert int(y.max()) <= 5
    assert seen == {0, 1, 2}
    x, y = data.lm_batch(torch.arange(4), 3, 2, g)  # exactly T + 1 tokens: one window
    assert x.tolist() == [[0, 1, 2]] * 2 and y.tolist() == [[1, 2, 3]] * 2


def test_lm_batch_uses_only_its_generator():
    tokens = torch.arange(500)
    state = torch.get_rng_state()
    a = data.lm_batch(tokens, 16, 8, torch.Generator().manual_seed(3))
    b = data.lm_batch(tokens, 16, 8, torch.Generator().manual_seed(3))
    c = data.lm_batch(tokens, 16, 8, torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_lm_batch_errors():
    g = torch.Generator()
    with pytest.raises(ValueError, match=r"data has 8 tokens, but a window needs block_size \+ 1 = 9"):
        data.lm_batch(torch.arange(8), 8, 2, g)
    with pytest.raises(
        ValueError, match=r"1-D torch.long tensor of token ids, got torch.float32 tensor of shape \(10,\)"
    ):
        data.lm_batch(torch.zeros(10), 4, 2, g)
    with pytest.raises(ValueError, match=r"got torch.int64 tensor of shape \(2, 10\)"):
        data.lm_batch(torch.zeros(2, 10, dtype=torch.long), 4, 2, g)
    with pytest.raises(ValueError, match="at least 1, got 0 and 2"):
        data.lm_batch(torch.arange(10), 0, 2, g)


def test_eval_batches_are_fixed_by_the_seed():
    tokens = torch.arange(1000)
    state = torch.get_rng_state()
    first = data.eval_batches(tokens, 16, 4, n_batches=3, seed=7)
    again = data.eval_batches(tokens, 16, 4, n_batches=3, seed=7)
    other = data.eval_batches(tokens, 16, 4, n_batches=3, seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    assert len(first) == 3 and all(x.shape == y.shape == (4, 16) for x, y in first)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(first, again))
    assert not all(torch.equal(a, b) for (a, _), (b, _) in zip(first, other))
    assert all(torch.equal(y, x + 1) for x, y in first)
    with pytest.raises(ValueError, match="n_batches must be at least 1, got 0"):
        data.eval_batches(tokens, 16, 4, n_batches=0)


def test_split_batches_score_every_whole_window_once():
    tokens = torch.arange(1, 24)  # N = 23: (N - 1) // 4 = 5 windows, 2 tokens left unscored
    batches = data.split_batches(tokens, 4, 2)
    assert [tuple(x.shape) for x, _ in batches] == [(2, 4), (2, 4), (1, 4)]
    xs = torch.cat([x for x, _ in batches]).flatten()
    assert torch.equal(xs, tokens[:20])  # consecutive, no overlap, no gap
    assert all(torch.equal(y, x + 1) for x, y in batches)
    assert data.split_batches(torch.arange(5), 4, 8)[0][0].shape == (1, 4)  # exactly one window
    with pytest.raises(ValueError, match="a window needs block_size \\+ 1 = 5"):
        data.split_batches(torch.arange(4), 4, 2)

"""Wrong implementations for Exercise 5 (BPE), each a mistake students really make."""

from coursekit import bpe as ref
from tests.mutants import Mutant, mutant

MUTANTS = [
    Mutant(
        "pairs_skip_overlaps",
        "get_pair_counts",
        "get_pair_counts",
        "also where pairs overlap",
        """
def get_pair_counts(ids, counts=None, weight=1):
    counts = {} if counts is None else counts
    i = 0
    while i < len(ids) - 1:
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + weight
        i += 2 if ids[i] == ids[i + 1] else 1
    return counts
""",
    ),
    Mutant(
        "pairs_ignore_weight",
        "get_pair_counts",
        "get_pair_counts",
        "add 5 per occurrence",
        """
def get_pair_counts(ids, counts=None, weight=1):
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts
""",
    ),
    Mutant(
        "pairs_new_dict_each_call",
        "get_pair_counts",
        "get_pair_counts",
        "to the given dict",
        """
def get_pair_counts(ids, counts=None, weight=1):
    out = {}
    for pair in zip(ids, ids[1:]):
        out[pair] = out.get(pair, 0) + weight
    return out
""",
    ),
    Mutant(
        "merge_overlapping_twice",
        "merge",
        "merge",
        "the middle 5 was used twice",
        """
def merge(ids, pair, new_id):
    out = []
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
        elif i == 0 or (ids[i - 1], ids[i]) != pair:
            out.append(ids[i])
    if ids and (len(ids) < 2 or (ids[-2], ids[-1]) != pair):
        out.append(ids[-1])
    return out
""",
    ),
    Mutant(
        "merge_first_only",
        "merge",
        "merge",
        "only the first occurrence was merged",
        """
def merge(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)
""",
    ),
    Mutant(
        "train_tie_first_seen",
        "train_naive",
        "train_naive",
        "choose max count, then the smallest pair",
        """
def train_naive(text, vocab_size, pattern="gpt4"):
    freq = chunk_counts(text, pattern)
    chunks = [list(c.encode("utf-8")) for c in freq]
    weights = list(freq.values())
    merges = []
    for new_id in range(256, vocab_size):
        counts = {}
        for ids, w in zip(chunks, weights):
            get_pair_counts(ids, counts, w)
        if not counts:
            break
        pair = max(counts, key=counts.get)
        if counts[pair] < 2:
            break
        chunks = [merge(ids, pair, new_id) for ids in chunks]
        merges.append(pair)
    return merges
""",
    ),
    Mutant(
        "train_ids_off_by_one",
        "train_naive",
        "train_naive",
        "the new ids are off by one",
        """
def train_naive(text, vocab_size, pattern="gpt4"):
    freq = chunk_counts(text, pattern)
    chunks = [list(c.encode("utf-8")) for c in freq]
    weights = list(freq.values())
    merges = []
    for new_id in range(257, vocab_size + 1):
        counts = {}
        for ids, w in zip(chunks, weights):
            get_pair_counts(ids, counts, w)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        chunks = [merge(ids, pair, new_id) for ids in chunks]
        merges.append(pair)
    return merges
""",
    ),
    Mutant(
        "train_across_chunks",
        "train_naive",
        "train_naive",
        "which are in different chunks",
        """
def train_naive(text, vocab_size, pattern="gpt4"):
    ids = list(text.encode("utf-8"))
    merges = []
    for new_id in range(256, vocab_size):
        counts = get_pair_counts(ids)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        ids = merge(ids, pair, new_id)
        merges.append(pair)
    return merges
""",
    ),
    Mutant(
        "train_never_stops",
        "train_naive",
        "train_naive",
        "fewer than 2 times",
        """
def train_naive(text, vocab_size, pattern="gpt4"):
    freq = chunk_counts(text, pattern)
    chunks = [list(c.encode("utf-8")) for c in freq]
    weights = list(freq.values())
    merges = []
    for new_id in range(256, vocab_size):
        counts = {}
        for ids, w in zip(chunks, weights):
            get_pair_counts(ids, counts, w)
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        chunks = [merge(ids, pair, new_id) for ids in chunks]
        merges.append(pair)
    return merges
""",
    ),
    Mutant(
        "encode_greedy_left_to_right",
        "encode_chunk",
        "encode_chunk",
        "you merged the leftmost learnt pair",
        """
def encode_chunk(chunk, ranks):
    ids = list(chunk.encode("utf-8"))
    changed = True
    while changed:
        changed = False
        for i in range(len(ids) - 1):
            pair = (ids[i], ids[i + 1])
            if pair in ranks:
                ids = merge(ids, pair, ranks[pair])
                changed = True
                break
    return ids
""",
    ),
    Mutant(
        "encode_one_merge",
        "encode_chunk",
        "encode_chunk",
        "repeat until no adjacent pair is in ranks",
        """
def encode_chunk(chunk, ranks):
    ids = list(chunk.encode("utf-8"))
    if len(ids) >= 2:
        pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair in ranks:
            ids = merge(ids, pair, ranks[pair])
    return ids
""",
    ),
    Mutant(
        "encode_characters_not_bytes",
        "encode_chunk",
        "encode_chunk",
        "start from the UTF-8 bytes",
        """
def encode_chunk(chunk, ranks):
    ids = [ord(c) for c in chunk]
    while len(ids) >= 2:
        pair = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, float("inf")))
        if pair not in ranks:
            break
        ids = merge(ids, pair, ranks[pair])
    return ids
""",
    ),
    Mutant(
        "decode_token_by_token",
        "decode",
        "decode",
        "decoding token by token breaks characters",
        """
def decode(ids, vocab, errors="replace"):
    return "".join(vocab[i].decode("utf-8", errors=errors) for i in ids)
""",
    ),
    Mutant(
        "decode_strict",
        "decode",
        "decode",
        "errors='replace'",
        """
def decode(ids, vocab, errors="replace"):
    return b"".join(vocab[i] for i in ids).decode("utf-8")
""",
    ),
    # ----------------------------------------------------------------- clauses the graders did not check before
    mutant(
        "pairs_mutable_default",
        ref.get_pair_counts,
        "a default of counts={} is one dict shared",
        ("counts: dict | None = None", "counts: dict | None = {}"),
        ("    counts = {} if counts is None else counts\n", ""),
    ),
    mutant(
        "pairs_copy_not_in_place",
        ref.get_pair_counts,
        "add into that dict",
        ("counts = {} if counts is None else counts", "counts = {} if counts is None else dict(counts)"),
    ),
    mutant(
        "pairs_string_keys",
        ref.get_pair_counts,
        "keys are (left, right) tuples of ints",
        (
            "counts[pair] = counts.get(pair, 0) + weight",
            "counts[str(pair)] = counts.get(str(pair), 0) + weight",
        ),
    ),
    Mutant(
        "merge_in_place",
        "merge",
        "merge",
        "changed its input list",
        """
def merge(ids, pair, new_id):
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == tuple(pair):
            ids[i:i + 2] = [new_id]
        i += 1
    return ids
""",
    ),
    mutant(
        "train_ignores_pattern",
        ref.train_naive,
        "use the pattern argument",
        ("freq = chunk_counts(text, pattern)", "freq = chunk_counts(text)"),
    ),
    mutant(
        "train_unweighted",
        ref.train_naive,
        "each distinct chunk counted once",
        ("get_pair_counts(ids, counts, w)", "get_pair_counts(ids, counts)"),
    ),
    mutant(
        "train_list_pairs",
        ref.train_naive,
        "each merge must be a (left, right) tuple",
        ("merges.append(pair)", "merges.append(list(pair))"),
    ),
    mutant(
        "train_crashes_without_pairs",
        ref.train_naive,
        "raised ValueError",
        ("        if not counts:\n            break\n", ""),
    ),
    mutant(
        "encode_crashes_on_short_chunks",
        ref.encode_chunk,
        "raised ValueError",
        ("while len(ids) >= 2:", "while True:"),
    ),
    Mutant(
        "encode_ranks_in_dict_order",
        "encode_chunk",
        "encode_chunk",
        "not in the mapping's insertion order",
        """
def encode_chunk(chunk, ranks):
    ids = list(chunk.encode("utf-8"))
    for pair, new_id in ranks.items():  # the dict's order taken for the order the pairs were learnt in
        ids = merge(ids, pair, new_id)
    return ids
""",
    ),
    mutant(
        "decode_ignores_errors",
        ref.decode,
        "the errors argument was ignored",
        ('data.decode("utf-8", errors=errors)', 'data.decode("utf-8", errors="replace")'),
    ),
    mutant(
        "decode_error_without_the_id",
        ref.decode,
        "should name the unknown id",
        (
            'raise ValueError(f"unknown token id {e.args[0]} (vocabulary size {len(vocab)})")',
            'raise ValueError("unknown token id")',
        ),
    ),
    Mutant(
        "word_end_thinks_none",
        "predict_word_end_merges",
        "predict_word_end_merges",
        "the experiment gives (c) 5 to 20",
        'predict_word_end_merges = "a"\n',
    ),
    Mutant(
        "word_end_thinks_most",
        "predict_word_end_merges",
        "predict_word_end_merges",
        "you predicted (d) more than 20",
        'predict_word_end_merges = "d"\n',
    ),
    Mutant(
        "word_end_not_a_letter",
        "predict_word_end_merges",
        "predict_word_end_merges",
        "one of the letters",
        "predict_word_end_merges = 8\n",
    ),
    Mutant(
        "shared_counts_vocab_size",
        "predict_shared_merges",
        "predict_shared_merges",
        "the experiment gives 144",
        "predict_shared_merges = 400\n",
    ),
    Mutant(
        "shared_thinks_more_text_changes_merges",
        "predict_shared_merges",
        "predict_shared_merges",
        "you predicted 20",
        "predict_shared_merges = 20\n",
    ),
    Mutant(
        "shared_thinks_nothing_shared",
        "predict_shared_merges",
        "predict_shared_merges",
        "you predicted 0",
        "predict_shared_merges = 0\n",
    ),
    Mutant(
        "shared_as_text",
        "predict_shared_merges",
        "predict_shared_merges",
        "should be a finite number",
        'predict_shared_merges = "144"\n',
    ),
    Mutant(
        "digits_thousands_separators",
        "predict_digit_groups",
        "predict_digit_groups",
        "you predicted (a) 3, 3, 3, 3",
        'predict_digit_groups = "a"\n',
    ),
    Mutant(
        "digits_one_chunk",
        "predict_digit_groups",
        "predict_digit_groups",
        "the experiment gives (b) 2, 3, 1, 2",
        'predict_digit_groups = "d"\n',
    ),
    Mutant(
        "digits_single_digits",
        "predict_digit_groups",
        "predict_digit_groups",
        "you predicted (c) 1, 1, 1, 1",
        'predict_digit_groups = "c"\n',
    ),
    Mutant(
        "digits_the_lengths_themselves",
        "predict_digit_groups",
        "predict_digit_groups",
        "one of the letters",
        'predict_digit_groups = "2, 3, 1, 2"\n',
    ),
    mutant(
        "bpt_counts_characters",
        ref.bytes_per_token,
        "not characters",
        ('return len(test_text.encode("utf-8")) / n_tokens', "return len(test_text) / n_tokens"),
    ),
    mutant(
        "bpt_tokens_per_byte",
        ref.bytes_per_token,
        "not tokens per byte",
        (
            'return len(test_text.encode("utf-8")) / n_tokens',
            'return n_tokens / len(test_text.encode("utf-8"))',
        ),
    ),
    mutant(
        "bpt_ignores_chunk_counts",
        ref.bytes_per_token,
        "multiply each chunk's tokens by its count",
        ("n_tokens += count * len(", "n_tokens += len("),
    ),
    mutant(
        "bpt_vocab_size_is_merges",
        ref.bytes_per_token,
        "learn vocab_size - 256 merges",
        (
            "merges = train_naive(train_text, vocab_size, pattern)",
            "merges = train_naive(train_text, vocab_size + 256, pattern)",
        ),
    ),
    mutant(
        "bpt_trains_with_default_pattern",
        ref.bytes_per_token,
        "train with the given pattern",
        (
            "merges = train_naive(train_text, vocab_size, pattern)",
            "merges = train_naive(train_text, vocab_size)",
        ),
    ),
    mutant(
        "bpt_encodes_with_default_pattern",
        ref.bytes_per_token,
        "split test_text with the given pattern",
        ("chunk_counts(test_text, pattern).items()", "chunk_counts(test_text).items()"),
    ),
    mutant(
        "bpt_measures_the_training_text",
        ref.bytes_per_token,
        "outside the expected band",
        ("chunk_counts(test_text, pattern).items()", "chunk_counts(train_text, pattern).items()"),
    ),
    mutant(
        "bpt_vocab_size_not_checked_as_int",
        ref.bytes_per_token,
        "300.0) your code raised TypeError",
        (
            "if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 256:",
            "if vocab_size < 256:",
        ),
    ),
    mutant(
        "bpt_no_validation",
        ref.bytes_per_token,
        "raise a ValueError",
        ("if not test_text:", "if test_text is None:"),
    ),
    mutant(
        "special_encoded_as_text",
        ref.encode_with_special,
        "split the text at them first",
        ("    if not special:\n        pieces = [text]", "    if True:\n        pieces = [text]"),
    ),
    mutant(
        "special_first_in_dict_order",
        ref.encode_with_special,
        "should be [262]",
        ("for s in sorted(special, key=len, reverse=True))", "for s in special)"),
    ),
    mutant(
        "special_pieces_not_chunked",
        ref.encode_with_special,
        "should be",
        (
            "            for chunk in regex.findall(GPT4_PATTERN, piece):\n"
            "                ids.extend(encode_chunk(chunk, ranks))",
            "            ids.extend(encode_chunk(piece, ranks))",
        ),
    ),
    mutant(
        "special_ids_at_the_end",
        ref.encode_with_special,
        "should be",
        ("    ids: list[int] = []", "    ids: list[int] = []\n    tail: list[int] = []"),
        ("            ids.append(special[piece])", "            tail.append(special[piece])"),
        ("    return ids", "    return ids + tail"),
    ),
    mutant(
        "special_not_escaped",
        ref.encode_with_special,
        "raised KeyError",
        ('"|".join(regex.escape(s) for s', '"|".join(s for s'),
    ),
    mutant(
        "special_no_validation",
        ref.encode_with_special,
        "raise a ValueError",
        ("    for s, i in special.items():", "    for s, i in ():"),
    ),
    mutant(
        "special_id_may_be_a_merge",
        ref.encode_with_special,
        "raise a ValueError",
        (" or i in merge_ids:", ":"),
    ),
]

#: Generated mutants (``scripts/mutation.py``) that no input the text allows tells apart from the answer.
EQUIVALENT = {
    (
        'decode | raise ValueError(f"unknown token id {e.args[0]} (vocabulary size '
        '{len(vocab)})") from None | number | 2'
    ): "a KeyError from a dict lookup holds one argument, the key: e.args[-1] is e.args[0]",
    (
        'encode_with_special | alternatives = "|".join(regex.escape(s) for s in sorted(special, key=len, '
        "reverse=True)) | keyword | 1"
    ): (
        "two specials can match at the same place only if one is a prefix of the other, and reverse "
        "alphabetical order also puts a string before its own prefixes: the longest still wins"
    ),
}

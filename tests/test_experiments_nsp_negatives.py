"""coursekit.experiments.nsp_negatives: Chapter 6's next-sentence pairs with negatives of the same topic.

The pairing is checked against its definition on documents whose tokens say where they come from
(document and place), the two kinds of pairs against each other (same positives' documents, same
segments), and the committed results (which the exercise's question reads) against the code's
settings and a fresh run.
"""

from __future__ import annotations

import json

import pytest
import torch

from coursekit.experiments import nsp_negatives as N

#: a document's tokens: 1,000,000 d + position, so a token names its document and its place
STRIDE = 1_000_000


def segments(doc, n, length=3):
    return [[STRIDE * doc + length * k + t for t in range(length)] for k in range(n)]


def where(segment, length=3):
    """(document, index of the segment in it) from its first token."""
    return segment[0] // STRIDE, (segment[0] % STRIDE) // length


@pytest.mark.parametrize("gap", [2, 3])
def test_same_topic_pairs_keep_the_next_segment_or_draw_a_far_one_of_the_same_document(gap):
    documents = [segments(0, 9), segments(1, 6), segments(2, 14)]
    labels = []
    for seed in range(30):
        pairs = N.same_topic_pairs(documents, torch.Generator().manual_seed(seed), gap)
        assert [where(a) for a, _, _ in pairs] == [
            (d, j) for d, s in enumerate(documents) for j in range(0, len(s) - 1, 2)
        ]
        for a, b, label in pairs:
            (da, ja), (db, jb) = where(a), where(b)
            assert db == da, "a negative comes from a's own document"
            if label == 1:
                assert jb == ja + 1
            else:
                assert abs(jb - ja) >= gap, f"segment {jb} is within {gap} of {ja}"
            labels.append(label)
        assert N.same_topic_pairs(documents, torch.Generator().manual_seed(seed), gap) == pairs
    assert 0.4 < sum(labels) / len(labels) < 0.6, "a fair coin"


def test_same_topic_negatives_reach_every_far_segment():
    documents = [segments(0, 6)]
    drawn = set()
    for seed in range(200):
        for a, b, label in N.same_topic_pairs(documents, torch.Generator().manual_seed(seed)):
            if label == 0:
                drawn.add((where(a)[1], where(b)[1]))
    assert drawn == {(0, 2), (0, 3), (0, 4), (0, 5), (2, 0), (2, 4), (2, 5), (4, 0), (4, 1), (4, 2)}


def test_same_topic_pairs_refuse_what_they_cannot_pair():
    with pytest.raises(ValueError, match="gap must be an integer >= 2"):
        N.same_topic_pairs([segments(0, 6)], torch.Generator(), gap=1)
    with pytest.raises(ValueError, match="document 1 has an empty segment"):
        N.same_topic_pairs([segments(0, 6), [[1], []]], torch.Generator())
    two = [segments(d, 2) for d in range(20)]  # a's only other segment is its neighbour
    with pytest.raises(ValueError, match="has 2 segments: segment 0 has none 2 or more away"):
        N.same_topic_pairs(two, torch.Generator().manual_seed(0))


def tokens():
    sizes = {"short": N.LENGTH * 5, "long": N.LENGTH * 12 + 7, "longer": N.LENGTH * 20, "tiny": N.LENGTH * 2}
    return {name: [STRIDE * d + t for t in range(n)] for d, (name, n) in enumerate(sizes.items())}


def test_both_kinds_pair_the_same_segments_of_the_same_documents_and_keep_test_text_apart():
    toks = tokens()
    built = {k: N.make_pairs(k, toks, seed=0) for k in N.NEGATIVES}
    for k, (train_pairs, test_pairs) in built.items():
        for part, pairs in (("train", train_pairs), ("test", test_pairs)):
            for a, b, _ in pairs:
                assert len(a) == len(b) == N.LENGTH
                doc = a[0] // STRIDE
                half = len(toks[list(toks)[doc]]) * 0.5
                assert all(((t % STRIDE) >= half) == (part == "test") for t in (*a, *b) if t // STRIDE == doc)
            docs = {a[0] // STRIDE for a, _, _ in pairs}
            assert docs == {1, 2}, f"{k} {part}: only halves with {N.MIN_SEGMENTS} segments or more take part"
    assert [a for a, _, _ in built["other topic"][1]] == [a for a, _, _ in built["same topic"][1]]
    same_test = built["same topic"][1]
    assert all(b[0] // STRIDE == a[0] // STRIDE for a, b, _ in same_test)
    other_test = built["other topic"][1]
    assert all(b[0] // STRIDE != a[0] // STRIDE for a, b, label in other_test if label == 0)


def test_make_pairs_refuses_an_unknown_kind():
    with pytest.raises(
        ValueError, match="negatives must be one of \\['other topic', 'same topic'\\], got 'none'"
    ):
        N.make_pairs("none", tokens(), 0)


def test_the_committed_results_are_current():
    """load_results refuses a file written with other settings, so this is the file being current."""
    stored = N.load_results()
    assert stored["settings"] == N.settings()
    assert len(stored["runs"]) == len(stored["seeds"]) >= 3
    for run in stored["runs"]:
        assert run["other topic"]["n_test"] == run["same topic"]["n_test"] > 100
        assert all(0 <= run[k]["accuracy"] <= 1 for k in N.NEGATIVES)


@pytest.mark.slow  # loads the tokenizer, encodes the manual and fits six logistic regressions: about 10 s
def test_the_committed_results_are_those_a_fresh_run_gives():
    """Regenerate with: python -m coursekit.experiments.nsp_negatives (all seeds, seconds)."""
    from coursekit import checkpoints
    from coursekit.experiments import bert_pairs

    stored = N.load_results()
    tokenizer = checkpoints.load(bert_pairs.CHECKPOINT).tokenizer
    assert N.run_seed(stored["seeds"][-1], tokenizer) == stored["runs"][-1]


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["settings"].update(gap=3),
        lambda d: d["settings"].update(checkpoint_sha256="0" * 16),
        lambda d: d["runs"][0].pop("same topic"),
        lambda d: d["runs"].pop(),
    ],
)
def test_load_results_refuses_a_file_of_another_experiment(tmp_path, change):
    data = json.loads(N.RESULTS.read_text())
    change(data)
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="another experiment"):
        N.load_results(tmp_path / "other.json")

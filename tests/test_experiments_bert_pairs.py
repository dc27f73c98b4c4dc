"""coursekit.experiments.bert_pairs: Chapter 6's next-sentence against sentence-order experiment.

The data (segments, the train/test split, the pairs) is checked against its definition on
documents whose tokens say where they come from; the word-overlap features against a direct
computation and against their promise to ignore order; the fine-tuning against what it must feed
the model; and the committed results (which the page loads) against the code's settings and a
fresh run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import TfidfVectorizer

from coursekit.bert import BERT_PRESETS, Bert, BertClassifier, SpecialTokens, pack_pairs
from coursekit.experiments import bert_pairs as P

#: a document's tokens: 1,000,000 d + position, so a token names its document and its place
STRIDE = 1_000_000


def tokens(sizes=(400, 75, 1200, 30)):
    return {f"doc{d}": [STRIDE * d + t for t in range(n)] for d, n in enumerate(sizes)}


def test_cut_segments_are_consecutive_and_as_long_as_drawn():
    ids = list(range(500))
    segments = P.cut_segments(ids, 10, 30, torch.Generator().manual_seed(0))
    joined = [t for s in segments for t in s]
    assert joined == ids[: len(joined)], "consecutive, from the first token, without gaps"
    assert all(10 <= len(s) <= 30 for s in segments)
    assert len(ids) - len(joined) < 30, "only a tail shorter than the longest length is left out"
    assert len({len(s) for s in segments}) > 5, "lengths vary"
    assert P.cut_segments(list(range(10)), 4, 4, torch.Generator()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="1 <= lo <= hi, got lo=5, hi=4"):
        P.cut_segments(ids, 5, 4, torch.Generator())


@pytest.mark.parametrize("fraction", [P.TEST_FRACTION, P.OVERLAP_TEST_FRACTION])
@pytest.mark.parametrize("task", list(P.TASKS))
def test_make_pairs_keeps_test_text_out_of_training(task, fraction):
    toks = tokens()
    train_pairs, test_pairs = P.make_pairs(task, toks, 10, 30, seed=0, test_fraction=fraction)
    lengths = [len(ids) for ids in toks.values()]
    for pairs, is_test in ((train_pairs, False), (test_pairs, True)):
        assert pairs
        for a, b, _ in pairs:
            for t in (*a, *b):
                d, pos = divmod(t, STRIDE)
                assert (pos >= round((1 - fraction) * lengths[d])) == is_test


def test_make_pairs_builds_the_task_it_names():
    toks = tokens()
    for a, b, label in P.make_pairs("sop", toks, 5, 9, seed=1)[0]:
        first, second = (a, b) if label == 1 else (b, a)
        assert second[0] == first[-1] + 1, "neighbours, in order for label 1 and swapped for label 0"
    for a, b, label in P.make_pairs("nsp", toks, 5, 9, seed=1)[0]:
        if label == 1:
            assert b[0] == a[-1] + 1
        else:
            assert b[0] // STRIDE != a[0] // STRIDE, "a random segment of another document"
    assert P.make_pairs("nsp", toks, 5, 9, seed=1) == P.make_pairs("nsp", toks, 5, 9, seed=1)
    with pytest.raises(ValueError, match="task must be one of"):
        P.make_pairs("mlm", toks, 5, 9, seed=1)


class Words:
    """A stand-in tokenizer: id i decodes to the word ``w<i>``."""

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def test_overlap_features_are_cosine_and_jaccard_and_ignore_order():
    words = Words()
    pairs = [([1, 2, 3, 3], [3, 4], 1), ([5, 6], [7, 8], 0), ([1, 9, 9, 2], [2, 1, 5], 1)]
    vectorizer = TfidfVectorizer(sublinear_tf=True).fit([words.decode(s) for p in pairs for s in p[:2]])
    got = P.overlap_features(pairs, words, vectorizer)
    analyze = vectorizer.build_analyzer()
    for row, (a, b, _) in zip(got, pairs):
        va = vectorizer.transform([words.decode(a)]).toarray()[0]
        vb = vectorizer.transform([words.decode(b)]).toarray()[0]
        cosine = va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb))
        sa, sb = set(analyze(words.decode(a))), set(analyze(words.decode(b)))
        assert row == pytest.approx([cosine, len(sa & sb) / len(sa | sb)], abs=1e-12)
    swapped = P.overlap_features([(b, a, 1 - y) for a, b, y in pairs], words, vectorizer)
    assert np.array_equal(got, swapped)


def test_the_overlap_classifier_is_at_exactly_chance_on_both_orders_of_every_pair():
    """Order-free features give a pair and its swap the same prediction, so on a test set holding
    both orders with opposite labels the accuracy is exactly 1/2, whatever was learned."""
    g = torch.Generator().manual_seed(0)

    def segment():
        return torch.randint(0, 40, (int(torch.randint(3, 9, (), generator=g)),), generator=g).tolist()

    train_pairs = [(segment(), segment(), int(torch.rand((), generator=g) < 0.5)) for _ in range(200)]
    test_pairs = [(segment(), segment()) for _ in range(50)]
    test_pairs = [(a, b, 1) for a, b in test_pairs] + [(b, a, 0) for a, b in test_pairs]
    assert P.overlap_accuracy(train_pairs, test_pairs, Words()) == 0.5


def test_segment_ids_of_each_variant():
    types = torch.tensor([[0, 0, 0, 1, 1, 0]])
    assert torch.equal(P.segment_ids(types, "segment ids"), types)
    assert torch.equal(P.segment_ids(types, "all zeros"), torch.zeros_like(types))
    with pytest.raises(ValueError, match="variant must be one of"):
        P.segment_ids(types, "random")


NANO = BERT_PRESETS["nano"]  # vocabulary 64: ordinary ids 0..59, special 60..63
SPECIAL = SpecialTokens.after(NANO.vocab_size - 4)


def nano_pairs(n, seed=0):
    g = torch.Generator().manual_seed(seed)

    def segment():
        return torch.randint(0, 60, (int(torch.randint(1, 6, (), generator=g)),), generator=g).tolist()

    return [(segment(), segment(), int(torch.rand((), generator=g) < 0.5)) for _ in range(n)]


@pytest.mark.parametrize("variant", P.VARIANTS)
def test_pair_accuracy_is_the_share_of_pairs_classified_right_one_by_one(variant):
    """Batches are trimmed to their longest pair; the reference runs each pair alone, untrimmed."""
    torch.manual_seed(0)
    model = BertClassifier(NANO, 2).eval()
    pairs = nano_pairs(37)
    packed = pack_pairs(pairs, SPECIAL, length=NANO.max_len)
    labels = torch.tensor([y for _, _, y in pairs])
    with torch.no_grad():
        right = sum(
            int(
                model(
                    packed[0][i : i + 1], packed[1][i : i + 1], P.segment_ids(packed[2][i : i + 1], variant)
                ).argmax()
            )
            == labels[i]
            for i in range(len(pairs))
        )
    assert P.pair_accuracy(model, packed, labels, variant, batch_size=8) == right / len(pairs)
    assert model.training is False


@pytest.mark.parametrize("variant", P.VARIANTS)
def test_finetune_pairs_feeds_the_variants_segment_ids_and_copies_the_encoder(monkeypatch, variant):
    seen = []
    monkeypatch.setattr(P, "STEPS", 4)
    monkeypatch.setattr(P, "BATCH", 8)
    torch.manual_seed(0)
    bert = Bert(NANO)
    before = {k: v.clone() for k, v in bert.state_dict().items()}
    original = BertClassifier.from_bert

    def spying(*args, **kwargs):
        model = original(*args, **kwargs)
        model.bert.embeddings.segment.register_forward_hook(
            lambda m, inputs, out: seen.append(inputs[0].clone())
        )
        return model

    monkeypatch.setattr(P.BertClassifier, "from_bert", spying)
    result = P.finetune_pairs(bert, SPECIAL, nano_pairs(40), nano_pairs(20, seed=1), variant, seed=0)
    assert len(result["curve"]) == 5 and result["test_accuracy"] == result["curve"][-1]
    assert all(0 <= a <= 1 for a in result["curve"])
    assert len(seen) == 5 + 4, "five evaluations (one batch each) and four training steps"
    ones = [bool((s == 1).any()) for s in seen]
    assert all(ones) if variant == "segment ids" else not any(ones)
    assert all(torch.equal(v, before[k]) for k, v in bert.state_dict().items()), (
        "the encoder given is not trained"
    )


def test_the_committed_results_hold_every_seed_task_length_and_variant_of_the_code():
    """load_results refuses a file written with other settings, so this is the file being current."""
    stored = P.load_results()
    assert stored["settings"] == P.settings()
    assert len(stored["runs"]) == len(stored["seeds"]) >= 3
    for run in stored["runs"]:
        for task in P.TASKS:
            for cell in run["overlap"][task].values():
                assert 0 <= cell["accuracy"] <= 1 and cell["n_test"] > 0
            pairs = run["pairs"][task]
            assert pairs["n_train"] > pairs["n_test"] > 0
            for variant in P.VARIANTS:
                assert len(pairs[variant]["curve"]) == 5
                assert pairs[variant]["test_accuracy"] == pairs[variant]["curve"][-1]
    assert stored["cpu_seconds"] < 360, "the experiment stays within its few minutes of CPU"


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["settings"].update(steps=100),
        lambda d: d["settings"].update(checkpoint_sha256="0" * 16),
        lambda d: d["runs"][0]["pairs"].pop("sop"),
        lambda d: d["runs"].pop(),
    ],
)
def test_load_results_refuses_a_file_of_another_experiment(tmp_path, change):
    data = json.loads(P.RESULTS.read_text())
    change(data)
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="another experiment"):
        P.load_results(tmp_path / "other.json")


@pytest.mark.slow  # loads the checkpoint, fits the overlap classifiers, one fine-tuning run: about 20 s
def test_the_committed_results_are_those_a_fresh_run_gives():
    """Regenerate with: python -m coursekit.experiments.bert_pairs (all seeds, one thread)."""
    from coursekit import checkpoints

    stored = P.load_results()
    seed = stored["seeds"][-1]
    run = stored["runs"][stored["seeds"].index(seed)]
    ck = checkpoints.load(P.CHECKPOINT)
    toks = P.topic_tokens(ck.tokenizer)
    assert P.overlap_sweep(toks, ck.tokenizer, seed) == run["overlap"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train_pairs, test_pairs = P.make_pairs("nsp", toks, *P.PAIR_LENGTHS, seed)
        fresh = P.finetune_pairs(ck.model.bert, ck.special, train_pairs, test_pairs, "all zeros", seed)
    finally:
        torch.set_num_threads(threads)
    stored_run = run["pairs"]["nsp"]["all zeros"]
    # another machine may round a logit the other way: allow two of the test pairs to change
    assert fresh["curve"] == pytest.approx(stored_run["curve"], abs=2 / len(test_pairs) + 1e-9)

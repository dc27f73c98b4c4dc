"""coursekit.experiments.bert_labels: Chapter 6's sweep over the number of labelled passages.

The subsets are checked against their definition (sizes, nesting, seeds), a sweep cell against
what its three classifiers must be given, and the committed results (which the page loads)
against the code's settings and a fresh run.
"""

from __future__ import annotations

import json

import pytest
import torch

from coursekit.experiments import bert_labels as L
from coursekit.experiments.topics import TopicData


def topic_data(n=300):
    ids = torch.arange(n)[:, None].repeat(1, 5)  # row i holds i: a passage names itself
    return TopicData(
        ids, ids >= 0, torch.arange(n) % 4, [f"text {i}" for i in range(n)], [f"t{i}" for i in range(n)]
    )


def rows(d: TopicData) -> list[int]:
    return d.ids[:, 0].tolist()


def test_labelled_subsets_are_nested_samples_without_repetition():
    data = topic_data()
    subsets = {n: rows(L.labelled_subset(data, n, seed=1)) for n in (16, 64, 256, None)}
    assert {n: len(s) for n, s in subsets.items()} == {16: 16, 64: 64, 256: 256, None: 300}
    assert sorted(subsets[None]) == list(range(300)), "all of them, each once"
    assert subsets[64][:16] == subsets[16] and subsets[256][:64] == subsets[64], "a seed's sets are nested"
    assert rows(L.labelled_subset(data, 64, seed=2)) != subsets[64], "another seed, another sample"
    d = L.labelled_subset(data, 16, seed=1)
    assert d.labels.tolist() == [i % 4 for i in subsets[16]]
    assert d.texts == [f"text {i}" for i in subsets[16]] and d.topics == [f"t{i}" for i in subsets[16]]
    assert torch.equal(d.mask, data.mask[subsets[16]])
    for bad in (0, 301):
        with pytest.raises(ValueError, match="n must be between 1 and 300"):
            L.labelled_subset(data, bad, seed=0)


def test_a_sweep_cell_trains_each_classifier_on_the_same_subset(monkeypatch):
    data, test = topic_data(), topic_data(40)
    calls = []

    class History:
        evals = [{"test_accuracy": 0.25}]

    def fake_finetune(bert, config, train_data, test_data, cfg):
        calls.append(("network", bert, rows(train_data), test_data, cfg))
        return None, History()

    def fake_baseline(train_data, test_data):
        calls.append(("tf-idf", None, rows(train_data), test_data, None))
        return 0.5

    monkeypatch.setattr(L, "finetune", fake_finetune)
    monkeypatch.setattr(L, "logistic_regression_baseline", fake_baseline)
    encoder = object()

    class Model:
        bert, config = encoder, "config"

    class Checkpoint:
        model = Model()

    out = L.run_size(32, 2, Checkpoint(), data, test)
    assert out == {"pretrained": 0.25, "random init": 0.25, "tf-idf": 0.5}
    assert [c[1] for c in calls] == [encoder, None, None], "the checkpoint's encoder, then a random one"
    assert all(c[2] == rows(L.labelled_subset(data, 32, 2)) for c in calls)
    assert all(c[3] is test for c in calls)
    for _, _, _, _, cfg in calls[:2]:
        assert (cfg.max_steps, cfg.batch_size, cfg.lr, cfg.seed) == (L.STEPS, L.BATCH, L.LR, 2)


def test_the_committed_results_hold_every_size_classifier_and_seed_of_the_code():
    """load_results refuses a file written with other settings, so this is the file being current."""
    stored = L.load_results()
    assert stored["settings"] == L.settings()
    assert list(stored["runs"]) == [L.size_key(n) for n in L.SIZES]
    assert stored["n_train"] > 256 and stored["n_test"] > 0 and 0 < stored["majority"] < 1
    for runs in stored["runs"].values():
        assert len(runs) == len(stored["seeds"]) >= 3
        assert all(0 <= acc <= 1 for run in runs for acc in run.values())
    assert stored["cpu_seconds"] < 360, "the sweep stays within its few minutes of CPU"


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["settings"].update(lr=3e-4),
        lambda d: d["settings"].update(topics_sha256="0" * 16),
        lambda d: d["runs"].pop("all"),
        lambda d: d["runs"]["16"].pop(),
    ],
)
def test_load_results_refuses_a_file_of_another_sweep(tmp_path, change):
    data = json.loads(L.RESULTS.read_text())
    change(data)
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="another experiment"):
        L.load_results(tmp_path / "other.json")


@pytest.mark.slow  # two fine-tuning runs of 200 steps: about 15 s
def test_the_committed_results_are_those_a_fresh_run_gives():
    """Regenerate with: python -m coursekit.experiments.bert_labels (all seeds, one thread)."""
    from coursekit import checkpoints
    from coursekit.experiments.topics import topic_passages

    stored = L.load_results()
    seed = stored["seeds"][-1]
    ck = checkpoints.load(L.CHECKPOINT)
    train_data, test_data = topic_passages(ck.tokenizer, ck.special)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fresh = L.run_size(16, seed, ck, train_data, test_data)
    finally:
        torch.set_num_threads(threads)
    # another machine may round a logit the other way: allow two test passages to change
    assert fresh == pytest.approx(
        stored["runs"]["16"][stored["seeds"].index(seed)], abs=2 / stored["n_test"] + 1e-9
    )

"""coursekit.experiments.data_scale: Chapter 9's training-set-size sweep of the CNN and the ViT.

The subsets are checked against what they promise (stratified, nested, deterministic, shared by
the models), the recipes against the chapter's, and the committed results (which the page loads)
against the code's settings, its subsets and a fresh run.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from coursekit import vit
from coursekit.experiments import data_scale as ex
from coursekit.experiments import digits


@pytest.fixture(scope="module")
def split():
    return digits.digits_split()


def test_the_largest_size_is_the_whole_training_split(split):
    assert ex.SIZES[-1] == len(split.train_y)
    assert list(ex.SIZES) == sorted(set(ex.SIZES))
    assert torch.equal(ex.subset(split.train_y, len(split.train_y), 0), torch.arange(len(split.train_y)))


def test_subset_of_the_docstring_example():
    labels = torch.tensor([0, 0, 0, 0, 1, 1])
    for seed in range(5):
        idx = ex.subset(labels, 3, seed)
        assert torch.bincount(labels[idx]).tolist() == [2, 1]


@pytest.mark.parametrize("seed", ex.SEEDS)
def test_subsets_are_stratified_nested_sorted_and_deterministic(split, seed):
    y = split.train_y
    share = torch.bincount(y).double() / len(y)  # (10,): each class's share of the training split
    sizes = sorted({*range(1, len(y) + 1, 7), *ex.SIZES})
    previous = set()
    for n in sizes:
        idx = ex.subset(y, n, seed)
        assert len(idx) == n and len(set(idx.tolist())) == n
        assert torch.equal(idx, torch.sort(idx).values)
        counts = torch.bincount(y[idx], minlength=10).double()
        assert bool(((counts - n * share).abs() < 1).all()), f"n={n}: class counts {counts.tolist()}"
        assert previous <= set(idx.tolist()), f"the subset of {n} does not contain the smaller one"
        previous = set(idx.tolist())
        assert torch.equal(ex.subset(y, n, seed), idx)


def test_subsets_differ_between_seeds(split):
    a, b = (ex.subset(split.train_y, 50, s) for s in ex.SEEDS[:2])
    assert not torch.equal(a, b)


def test_subset_rejects_a_size_out_of_range(split):
    with pytest.raises(ValueError, match=r"n must be in \[1, 1437\], got 0"):
        ex.subset(split.train_y, 0, 0)
    with pytest.raises(ValueError, match=r"n must be in \[1, 1437\], got 1438"):
        ex.subset(split.train_y, 1438, 0)


@pytest.mark.parametrize("model", ex.MODELS)
def test_recipes_are_the_chapters_compressed_to_the_same_number_of_updates(model):
    chapter, r = digits.DIGITS_RECIPES[model], ex.recipe(model)
    assert r.train.max_steps == ex.STEPS
    assert r.train.warmup_steps / ex.STEPS == pytest.approx(
        chapter.train.warmup_steps / chapter.train.max_steps, abs=0.01
    )
    same = {"max_steps": 1, "warmup_steps": 0, "eval_interval": 1}  # all else must be the chapter's
    assert replace(r.train, **same) == replace(chapter.train, **same)
    assert (r.max_shift, r.label_smoothing) == (chapter.max_shift, chapter.label_smoothing)


def test_make_model_builds_the_chapters_two_networks():
    assert type(ex.make_model("cnn")) is digits.SmallCNN
    net = ex.make_model("vit")
    assert type(net) is vit.ViT and net.cfg == vit.VIT_PRESETS["small"]
    with pytest.raises(ValueError, match="model must be one of \\['cnn', 'vit'\\], got 'mlp'"):
        ex.make_model("mlp")


def test_the_committed_results_are_current(split):
    """load_results refuses a file written with other settings, so this is the file being current;
    each run's subset fingerprint is the one the code draws now, the same for both models."""
    stored = ex.load_results()
    assert stored["settings"] == ex.settings()
    assert len(stored["seeds"]) >= 3
    for n in ex.SIZES:
        runs = stored["runs"][str(n)]
        for i, seed in enumerate(stored["seeds"]):
            digest = ex.subset_digest(ex.subset(split.train_y, n, seed))
            assert [runs[m][i]["subset"] for m in ex.MODELS] == [digest] * len(ex.MODELS)
            for m in ex.MODELS:
                run = runs[m][i]
                assert (
                    0 < run["test_accuracy"] <= 1 and 0 < run["train_accuracy"] <= 1 and run["final_loss"] > 0
                )


def test_the_committed_baselines_are_those_a_fresh_fit_gives(split):
    stored = ex.load_results()
    seed, n = stored["seeds"][0], ex.SIZES[0]
    assert stored["runs"][str(n)]["baselines"][0] == pytest.approx(ex.baselines_run(n, seed, split), abs=1e-6)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["settings"].update(steps=100),
        lambda d: d["settings"]["recipes"]["vit"].update(lr=3e-3),
        lambda d: d["runs"].pop(str(ex.SIZES[0])),
        lambda d: d["runs"][str(ex.SIZES[0])]["vit"].pop(),
    ],
)
def test_load_results_refuses_a_file_of_another_experiment(tmp_path, change):
    data = json.loads(ex.RESULTS.read_text())
    change(data)
    (tmp_path / "other.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="another experiment"):
        ex.load_results(tmp_path / "other.json")


@pytest.mark.slow  # one training run of STEPS updates per model, about 5 s (CNN) and 13 s (ViT) on one thread
@pytest.mark.parametrize("model", ex.MODELS)
def test_the_committed_results_are_those_a_fresh_run_gives(split, model):
    """Regenerate with: python -m coursekit.experiments.data_scale (all seeds, one thread)."""
    stored = ex.load_results()
    seed, n = stored["seeds"][-1], ex.SIZES[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fresh = ex.train_run(model, n, seed, split)
    finally:
        torch.set_num_threads(threads)
    run = stored["runs"][str(n)][model][stored["seeds"].index(seed)]
    assert fresh["subset"] == run["subset"]
    assert fresh["final_loss"] == pytest.approx(run["final_loss"], abs=1e-4)
    one_image = 1 / len(split.test_y)
    assert fresh["test_accuracy"] == pytest.approx(run["test_accuracy"], abs=1.01 * one_image)
    assert fresh["train_accuracy"] == pytest.approx(run["train_accuracy"], abs=1.01 / n)

"""coursekit.experiments.digits against scikit-learn's own split and baselines, and true properties
of the shifts and the training loop."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from coursekit import train, vit
from coursekit.experiments import digits


def test_digits_split_is_sklearns_stratified_80_20_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    s = digits.digits_split()
    d = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        d.images, d.target, test_size=0.2, stratify=d.target, random_state=0
    )
    assert s.train_x.shape == (1437, 1, 8, 8) and s.test_x.shape == (360, 1, 8, 8)
    assert torch.equal(s.train_y, torch.as_tensor(y_train)) and torch.equal(s.test_y, torch.as_tensor(y_test))
    assert torch.equal(s.test_x[:, 0] * 16, torch.as_tensor(x_test, dtype=torch.float32))
    assert float(s.train_x.min()) == 0.0 and float(s.train_x.max()) == 1.0
    per_class = torch.bincount(torch.as_tensor(d.target))  # stratified: a fifth of every class tests
    assert bool(((torch.bincount(s.test_y) - 0.2 * per_class).abs() < 1).all())


def test_random_shift_moves_each_image_by_a_whole_shift_within_range():
    x = torch.rand(64, 2, 8, 8)
    out = digits.random_shift(x, 1, torch.Generator().manual_seed(0))
    padded = F.pad(x, (2, 2, 2, 2))
    seen = set()
    for b in range(len(x)):
        matches = [
            (dy, dx)
            for dy in (-1, 0, 1)
            for dx in (-1, 0, 1)
            if torch.equal(out[b], padded[b, :, 2 - dy : 10 - dy, 2 - dx : 10 - dx])
        ]
        assert matches, f"image {b} is not a shift of its input by at most one pixel"
        seen.add(matches[0])
    assert len(seen) == 9  # all nine shifts occur among 64 images
    assert torch.equal(digits.random_shift(x, 0, torch.Generator()), x)
    again = digits.random_shift(x, 1, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    with pytest.raises(ValueError, match="max_shift must be >= 0, got -1"):
        digits.random_shift(x, -1, torch.Generator())


def test_fit_classifier_learns_and_records_accuracy():
    s = digits.digits_split()
    cfg = replace(vit.VIT_PRESETS["small"], n_layers=1, d_model=32, n_heads=2)
    torch.manual_seed(0)
    m = vit.ViT(cfg)
    tc = train.TrainConfig(max_steps=100, batch_size=64, lr=3e-3, warmup_steps=10, eval_interval=50)
    history = digits.fit_classifier(
        m,
        s.train_x[:512],
        s.train_y[:512],
        tc,
        label_smoothing=0.1,
        eval_data=(s.test_x[:200], s.test_y[:200]),
    )
    assert [e["step"] for e in history.evals] == [0, 50, 100]
    assert history.evals[-1]["accuracy"] > history.evals[0]["accuracy"] + 0.3
    assert digits.accuracy(m, s.test_x[:200], s.test_y[:200]) == history.evals[-1]["accuracy"]
    assert digits.predict(m, s.test_x[:10]).shape == (10,)


def test_book_recipes_are_well_formed():
    for name, recipe in digits.DIGITS_RECIPES.items():
        assert isinstance(recipe.train, train.TrainConfig) and recipe.max_shift >= 0, name
        assert 0.0 <= recipe.label_smoothing < 1.0, name


def test_small_cnn_and_sklearn_baselines_run_on_the_split():
    s = digits.digits_split()
    assert digits.SmallCNN()(s.test_x[:3]).shape == (3, 10)
    scores = digits.sklearn_baselines(s)
    assert set(scores) == {"logistic regression", "SVM (RBF, gamma=0.001)"}
    assert all(0.9 < v <= 1.0 for v in scores.values())

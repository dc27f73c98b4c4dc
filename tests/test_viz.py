"""coursekit.viz: the heatmap shows what it is given, labelled, and rejects bad shapes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless; must precede any pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from coursekit import viz  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def weights_3x4() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.softmax(torch.randn(3, 4, generator=g, dtype=torch.float64), dim=-1)  # (T, S)


def test_heatmap_image_equals_weights_and_ticks_carry_the_labels():
    w = weights_3x4()
    queries, keys = ["a", "bb", "ccc"], ["w", "x", "y", "z"]
    ax = viz.attention_heatmap(w, queries, keys, title="demo")
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), w.numpy())
    assert [t.get_text() for t in ax.get_yticklabels()] == queries
    assert [t.get_text() for t in ax.get_xticklabels()] == keys
    assert ax.get_title() == "demo"
    assert ax.get_xlabel() and ax.get_ylabel()


def test_heatmap_draws_on_the_given_axes_and_defaults_to_index_labels():
    fig, (left, right) = plt.subplots(1, 2)
    ax = viz.attention_heatmap(weights_3x4().numpy(), ax=right, colorbar=False)
    assert ax is right and not left.images
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]


def test_boolean_mask_is_drawn_as_zeros_and_ones():
    mask = torch.tensor([[True, False], [True, True]])
    ax = viz.attention_heatmap(mask, colorbar=False)
    np.testing.assert_array_equal(np.asarray(ax.images[0].get_array()), [[1.0, 0.0], [1.0, 1.0]])


def test_annotate_writes_one_value_per_cell():
    w = weights_3x4()
    ax = viz.attention_heatmap(w, annotate=True, fmt="{:.3f}", colorbar=False)
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 12
    assert texts[0] == f"{w[0, 0].item():.3f}" and texts[-1] == f"{w[2, 3].item():.3f}"


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4)])
def test_non_matrix_weights_raise_a_clear_error(shape):
    with pytest.raises(ValueError, match=r"2-D \(T, S\) matrix, got shape"):
        viz.attention_heatmap(torch.zeros(shape))


def test_label_count_mismatch_raises():
    with pytest.raises(ValueError, match="query_labels has 2 entries but weights has T=3"):
        viz.attention_heatmap(weights_3x4(), query_labels=["a", "b"])
    with pytest.raises(ValueError, match="key_labels has 5 entries but weights has S=4"):
        viz.attention_heatmap(weights_3x4(), key_labels=list("abcde"))


# --------------------------------------------------------------------------- loss curves


def history_with_evals():
    from coursekit.train import History

    return History(
        steps=[0, 1, 2, 3],
        train_loss=[2.0, 1.5, 1.2, 1.0],
        lr=[0.1] * 4,
        grad_norm=[1.0] * 4,
        evals=[{"step": 0, "val_loss": 2.1, "accuracy": 0.1}, {"step": 4, "val_loss": 1.1, "accuracy": 0.6}],
    )


def test_loss_curves_draw_the_training_loss_and_each_evaluated_loss():
    ax = viz.loss_curves(history_with_evals(), title="run")
    train_line, val_line = ax.lines  # accuracy is not a loss: not drawn by default
    np.testing.assert_array_equal(train_line.get_xdata(), [0, 1, 2, 3])
    np.testing.assert_array_equal(train_line.get_ydata(), [2.0, 1.5, 1.2, 1.0])
    np.testing.assert_array_equal(val_line.get_xdata(), [0, 4])
    np.testing.assert_array_equal(val_line.get_ydata(), [2.1, 1.1])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train (per batch)", "val_loss"]
    assert "step" in ax.get_xlabel() and "loss" in ax.get_ylabel() and ax.get_title() == "run"


def test_loss_curves_use_the_given_axes_and_keys_and_reject_unknown_keys():
    fig, (left, right) = plt.subplots(1, 2)
    ax = viz.loss_curves(history_with_evals(), ax=right, keys=["accuracy"])
    assert ax is right and not left.lines
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), [0.1, 0.6])
    with pytest.raises(
        ValueError, match=r"no evaluation recorded \['bleu'\]; the history has \['val_loss', 'accuracy'\]"
    ):
        viz.loss_curves(history_with_evals(), keys=["bleu"])


def test_loss_curves_of_a_real_run_and_of_an_empty_history():
    from coursekit import train

    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(0)), torch.zeros(8, 1)
    cfg = train.TrainConfig(max_steps=5, warmup_steps=1, eval_interval=2, log_interval=1)
    hist = train.train(
        model,
        lambda step, g: (x, y),
        cfg,
        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
        eval_fn=lambda m: {"val_loss": 0.0},
        progress=False,
    )
    ax = viz.loss_curves(hist)
    assert len(ax.lines) == 2 and len(ax.lines[0].get_xdata()) == 5
    np.testing.assert_array_equal(ax.lines[1].get_xdata(), [0, 2, 4, 5])
    with pytest.raises(ValueError, match="the history is empty"):
        viz.loss_curves(train.History())

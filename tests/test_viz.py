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

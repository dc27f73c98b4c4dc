"""The split/merge-heads diagram draws what :func:`coursekit.multihead.split_heads` does."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from matplotlib.colors import to_rgb
from matplotlib.patches import Rectangle

from coursekit.diagrams.multihead import split_heads_figure, split_heads_layout
from coursekit.multihead import split_heads

SIZES = [(3, 6, 3), (2, 6, 2), (4, 6, 3), (1, 4, 1), (2, 4, 4)]  # (T, C, H)


def drawn(fig):
    """Every labelled cell: gid -> (its text, its fill colour)."""
    ax = fig.axes[0]
    texts = {t.get_gid(): t.get_text() for t in ax.texts if t.get_gid()}
    fills = {p.get_gid(): to_rgb(p.get_facecolor()) for p in ax.patches if isinstance(p, Rectangle)}
    assert texts.keys() == fills.keys()
    return {gid: (texts[gid], fills[gid]) for gid in texts}


@pytest.mark.parametrize(("T", "C", "H"), SIZES)
def test_head_blocks_hold_what_split_heads_returns(T, C, H):
    """Cell (h, t, d) of the drawn (B, H, T, D) shows the feature split_heads puts there."""
    x = torch.arange(T * C).view(1, T, C)  # entry t*C + c names its own token and feature
    heads = split_heads(x, H)  # (1, H, T, D)
    cells = drawn(split_heads_figure(T, C, H))
    D = C // H
    for h in range(H):
        for t in range(T):
            for d in range(D):
                assert int(heads[0, h, t, d]) // C == t  # each token keeps its own row
                assert cells[f"heads:{h}:{t}:{d}"][0] == str(int(heads[0, h, t, d]) % C)
                # and the documented rule: head h holds the contiguous features h*D .. (h+1)*D - 1
                assert cells[f"heads:{h}:{t}:{d}"][0] == str(h * D + d)
    assert len([g for g in cells if g.startswith("heads:")]) == heads.numel()


@pytest.mark.parametrize(("T", "C", "H"), SIZES)
def test_colours_follow_the_head_each_feature_lands_in(T, C, H):
    """A column of x and of the view has the colour of the head block that holds the feature."""
    cells = drawn(split_heads_figure(T, C, H))
    D = C // H
    for t in range(T):
        for c in range(C):
            block = cells[f"heads:{c // D}:{t}:{c % D}"]
            assert cells[f"x:{t}:{c}"] == (str(c), block[1])
            assert cells[f"view:{t}:{c}"] == (str(c), block[1])
    if H > 1:  # different heads get different colours
        assert cells["heads:0:0:0"][1] != cells["heads:1:0:0"][1]


def test_layout_records_shapes_and_round_trip():
    layout = split_heads_layout(3, 6, 3)
    assert layout.viewed_shape == (1, 3, 3, 2)
    assert layout.split_shape == (1, 3, 3, 2)
    assert layout.head_of_feature.tolist() == [0, 0, 1, 1, 2, 2]
    assert layout.round_trip
    assert layout.feature[1].tolist() == [[2, 3]] * 3


def test_a_wrong_split_would_be_drawn_differently(monkeypatch):
    """The diagram follows the function: a split that gives each head every H-th feature shows it."""
    import coursekit.diagrams.multihead as diagram

    def strided(x, n_heads):
        B, T, C = x.shape
        return x.view(B, T, C // n_heads, n_heads).permute(0, 3, 1, 2)  # (B, H, T, D), the pitfall

    monkeypatch.setattr(diagram, "split_heads", strided)
    layout = diagram.split_heads_layout(3, 6, 3)
    assert layout.feature[1, 0].tolist() == [1, 4]
    assert not layout.round_trip


def test_book_size_and_text():
    with matplotlib.rc_context({"font.size": 6}):  # the diagram sets its own sizes
        fig = split_heads_figure()
    width, _ = fig.get_size_inches()
    assert width <= 5.5
    sizes = [t.get_fontsize() for t in fig.axes[0].texts]
    assert sizes and min(sizes) >= 11


def test_too_large_to_draw():
    with pytest.raises(ValueError, match="at most 6 heads"):
        split_heads_figure(T=1, C=8, H=8)
    with pytest.raises(ValueError, match="does not fit"):
        split_heads_figure(T=2, C=12, H=4)

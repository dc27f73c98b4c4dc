"""Chapter 2's diagram: what :func:`~coursekit.multihead.split_heads` and
:func:`~coursekit.multihead.merge_heads` do to a tensor's shape.

:func:`split_heads_layout` runs the real functions on a tiny tensor whose entries name their own
token and feature (``x[0, t, c] = t * C + c``) and reads off where every feature went;
:func:`split_heads_figure` draws exactly that: ``(B, T, C)``, the view ``(B, T, H, D)`` and the
transposed ``(B, H, T, D)``, each cell labelled with its feature index ``c`` and coloured by the
head it ends up in (a lighter shade for each later token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from coursekit.multihead import merge_heads, split_heads

__all__ = ["SplitLayout", "split_heads_figure", "split_heads_layout"]

#: the book's palette (Okabe and Ito), one colour per head
HEAD_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
FONT_PT = 11.5  # the book's text size (coursekit/book.mplstyle); no label is drawn smaller


@dataclass(frozen=True)
class SplitLayout:
    """Where every entry of a ``(1, T, C)`` tensor goes under ``split_heads(x, H)``.

    Attributes:
        T, C, H, D: the tensor's sizes, ``D = C // H``.
        viewed_shape: shape of the intermediate view, ``(B, T, H, D)``.
        split_shape: shape ``split_heads`` returns, ``(B, H, T, D)``.
        token: ``(H, T, D)`` int array, the token (row of ``x``) of each entry of the result.
        feature: ``(H, T, D)`` int array, the feature (column of ``x``) of each entry.
        head_of_feature: ``(C,)`` int array, the head each column of ``x`` ends up in.
        round_trip: whether ``merge_heads(split_heads(x, H))`` gives back ``x``.
    """

    T: int
    C: int
    H: int
    D: int
    viewed_shape: tuple[int, ...]
    split_shape: tuple[int, ...]
    token: np.ndarray
    feature: np.ndarray
    head_of_feature: np.ndarray
    round_trip: bool


def split_heads_layout(T: int = 3, C: int = 6, H: int = 3) -> SplitLayout:
    """Run :func:`split_heads` and :func:`merge_heads` on ``x[0, t, c] = t * C + c`` and record
    where each entry lands.

    Args:
        T: tokens, ``>= 1``.
        C: model width, a multiple of ``H``.
        H: heads.

    Returns:
        A :class:`SplitLayout`. Example: ``T=3, C=6, H=3`` gives ``feature[1] = [[2, 3]] * 3``
        (head 1 holds features 2 and 3 of every token).
    """
    x = torch.arange(T * C).view(1, T, C)  # (B=1, T, C): each entry names its own (t, c)
    heads = split_heads(x, H)  # (1, H, T, D)
    viewed = heads.transpose(1, 2)  # (1, T, H, D): the view before split_heads' transpose
    D = heads.shape[-1]
    entry = heads[0].numpy()  # (H, T, D)
    head_of_feature = np.full(C, -1)
    for h in range(H):
        head_of_feature[np.unique(entry[h] % C)] = h
    return SplitLayout(
        T=T,
        C=C,
        H=H,
        D=D,
        viewed_shape=tuple(viewed.shape),
        split_shape=tuple(heads.shape),
        token=entry // C,
        feature=entry % C,
        head_of_feature=head_of_feature,
        round_trip=bool(torch.equal(merge_heads(heads), x)),
    )


def _shade(colour: str, t: int, T: int) -> tuple[float, float, float]:
    """The head's colour, lighter for later tokens (mixed with white)."""
    amount = 0.75 - 0.4 * t / max(T - 1, 1)
    return tuple(1 - amount * (1 - np.array(to_rgb(colour))))


def split_heads_figure(T: int = 3, C: int = 6, H: int = 3) -> Figure:
    """Draw ``(B, T, C)`` -> view ``(B, T, H, D)`` -> transpose ``(B, H, T, D)``, and merge back.

    Every cell shows its feature index ``c`` and has the colour of the head that
    :func:`split_heads` puts it in (rows get lighter with the token index). Cells carry a ``gid``
    ``"<stage>:<t>:<c>"`` (stages ``x`` and ``view``) or ``"heads:<h>:<t>:<d>"``, so a test can read
    back what was drawn.

    Args:
        T, C, H: sizes of the tiny tensor (batch 1), small enough to fit 5.5 inches (``C <= 6`` or
            so) and ``H <= 6`` (one colour per head).

    Returns:
        The figure, 5.5 inches wide, text at 11.5 pt.

    Raises:
        ValueError: if the tensor is too large to draw legibly, or has more heads than colours.
    """
    layout = split_heads_layout(T, C, H)
    if H > len(HEAD_COLOURS):
        raise ValueError(f"at most {len(HEAD_COLOURS)} heads can be coloured, got H={H}")
    D, cell, gap = layout.D, 0.3, 0.12  # sizes in inches
    B = layout.split_shape[0]
    width, label_w, line = 5.5, 0.62, 0.21  # label_w: room for the row labels "t = 0"
    stage_h = T * cell
    band = 0.75  # between the two rows: the arrows and their labels
    height = 2 * line + stage_h + band + line + 0.3 + stage_h + 0.08
    fig = Figure(figsize=(width, height), layout="none")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, width), ylim=(0, height), aspect="equal")
    ax.axis("off")

    def text(x0, y0, words, **kw):
        ax.text(x0, y0, words, fontsize=FONT_PT, linespacing=1.2, **kw)

    def box(x0, y0, t, c, h, gid):
        ax.add_patch(
            Rectangle(
                (x0, y0),
                cell,
                cell,
                facecolor=_shade(HEAD_COLOURS[h], t, T),
                edgecolor="white",
                lw=1.2,
                gid=gid,
            )
        )
        ax.text(x0 + cell / 2, y0 + cell / 2, str(c), ha="center", va="center", fontsize=FONT_PT, gid=gid)

    def rows(x0, top):
        for t in range(T):
            text(x0 - 0.08, top - (t + 0.5) * cell, f"t = {t}", ha="right", va="center")

    def arrow(start, end):
        ax.add_patch(
            FancyArrowPatch(
                start, end, arrowstyle="-|>", mutation_scale=14, color="0.3", shrinkA=0, shrinkB=0
            )
        )

    # top row: x (B, T, C) and its view (B, T, H, D): the same rows, the features grouped by head
    top = height - 2 * line - 0.04
    x_left = label_w
    for t in range(T):
        for c in range(C):
            box(x_left + c * cell, top - (t + 1) * cell, t, c, layout.head_of_feature[c], f"x:{t}:{c}")
    rows(x_left, top)
    text(x_left, top + 0.04, f"x: (B, T, C)\n= {(B, T, C)}", ha="left", va="bottom")
    view_w = C * cell + (H - 1) * gap
    view_left = width - view_w - 0.05
    block_w = label_w + D * cell
    if view_left - (x_left + C * cell) < 0.6 or H * block_w + (H - 1) * 0.15 > width - 0.1:
        raise ValueError(
            f"T={T}, C={C}, H={H} does not fit {width} inches at {FONT_PT} pt; "
            "draw a smaller tensor (C <= 6 or so)"
        )
    for t in range(T):
        for c in range(C):
            h = layout.head_of_feature[c]
            box(view_left + c * cell + h * gap, top - (t + 1) * cell, t, c, h, f"view:{t}:{c}")
    text(view_left, top + 0.04, f"(B, T, H, D)\n= {layout.viewed_shape}", ha="left", va="bottom")
    mid_y = top - stage_h / 2
    arrow((x_left + C * cell + 0.1, mid_y), (view_left - 0.1, mid_y))
    text((x_left + C * cell + view_left) / 2, mid_y + 0.06, "view", ha="center", va="bottom")

    # bottom row: (B, H, T, D) as split_heads returns it, one T x D block per head
    band_top, band_bottom = top - stage_h - 0.06, top - stage_h - band
    arrow((view_left + view_w / 2, band_top), (view_left + view_w / 2, band_bottom))
    text(
        view_left + view_w / 2 - 0.1, (band_top + band_bottom) / 2, "transpose(1, 2)", ha="right", va="center"
    )
    merge = "merge_heads" if layout.round_trip else "merge_heads does NOT invert it"
    arrow((x_left + 0.3, band_bottom), (x_left + 0.3, band_top))
    text(x_left + 0.4, (band_top + band_bottom) / 2, merge, ha="left", va="center")
    text(
        0.05,
        band_bottom - 0.04,
        f"split_heads(x, H): (B, H, T, D) = {layout.split_shape}",
        ha="left",
        va="top",
    )
    block_top = band_bottom - line - 0.3
    spread = min((width - 0.1 - H * block_w) / max(H - 1, 1), 0.6)
    for h in range(H):
        left = 0.05 + label_w + h * (block_w + spread)
        for t in range(T):
            for d in range(D):
                box(
                    left + d * cell,
                    block_top - (t + 1) * cell,
                    int(layout.token[h, t, d]),
                    int(layout.feature[h, t, d]),
                    h,
                    f"heads:{h}:{t}:{d}",
                )
        rows(left, block_top)
        text(
            left + D * cell / 2,
            block_top + 0.03,
            f"head {h}",
            ha="center",
            va="bottom",
            color=HEAD_COLOURS[h],
        )
    return fig

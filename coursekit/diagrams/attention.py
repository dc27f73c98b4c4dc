"""Chapter 1's diagram: how queries, keys and values flow through one attention call.

The shapes written in the boxes are not typed by hand. :func:`attention_shapes` runs
:func:`coursekit.attention.scaled_dot_product_attention` on tensors whose sizes are all
different (``T = 3, S = 5, C = 7, D = 4`` unless told otherwise), and :func:`symbolic` turns each
measured shape back into the book's letters, so ``(3, 4)`` is drawn as ``(T, D)``. A diagram that
disagreed with the code would need the code to change first.

The drawing helpers :func:`canvas`, :func:`draw_box` and :func:`draw_arrow` work in inches (one
data unit per inch of the figure) and are shared with :mod:`coursekit.diagrams.model`. Every box
carries a ``gid`` naming what it stands for, and its shape label the ``gid`` ``"shape:<name>"``;
the tests read the drawn labels back through them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
from matplotlib.text import Text

from coursekit import viz
from coursekit.attention import scaled_dot_product_attention, scaled_dot_scores

__all__ = [
    "FILL",
    "attention_shapes",
    "canvas",
    "draw_arrow",
    "draw_box",
    "qkv_flow",
    "symbolic",
]

#: box colours (Okabe and Ito's palette, drawn at one third opacity): inputs, learned maps, tensors, operations
FILL = {"input": "#999999", "weight": "#E69F00", "tensor": "#56B4E9", "op": "#009E73", "output": "#CC79A7"}


def symbolic(shape: tuple[int, ...], sizes: dict[str, int]) -> str:
    """Write a measured shape in the book's letters, as mathtext.

    Args:
        shape: a tensor's shape, e.g. ``(3, 4)``.
        sizes: letter -> size, all sizes different, e.g. ``{"T": 3, "D": 4}``.

    Returns:
        ``"$(T, D)$"`` for the example.

    Raises:
        ValueError: if two letters share a size (a size would name two letters) or a dimension
            has no letter.
    """
    if len(set(sizes.values())) != len(sizes):
        raise ValueError(f"every letter needs its own size to be read back, got {sizes}")
    letter = {n: name for name, n in sizes.items()}
    missing = [n for n in shape if n not in letter]
    if missing:
        raise ValueError(f"no letter has size {missing[0]} in shape {tuple(shape)}; the letters are {sizes}")
    return "$(" + ", ".join(letter[n] for n in shape) + ")$"


def attention_shapes(T: int = 3, S: int = 5, C: int = 7, D: int = 4) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in one attention call, measured by running coursekit's code.

    The queries are projected from ``X`` of shape ``(T, C)``; the keys and values from a sequence
    of shape ``(S, C)`` (``X`` itself in self-attention, where ``S = T``). The mask has the
    bottom-right causal pattern of :func:`~coursekit.attention.causal_mask`, extended to ``T > S``
    (where its first rows are fully masked).

    Args:
        T: query length. S: key length. C: model width. D: head width.

    Returns:
        ``{"X", "source", "W_Q", "W_K", "W_V", "Q", "K", "V", "scores", "mask", "weights",
        "output"}`` -> shape, e.g. ``"scores"`` -> ``(T, S)``.
    """
    x, source = torch.zeros(T, C), torch.zeros(S, C)  # (T, C), (S, C)
    w_q, w_k, w_v = (torch.zeros(C, D) for _ in range(3))  # each (C, D): row vectors, q = x W_Q
    q, k, v = x @ w_q, source @ w_k, source @ w_v  # (T, D), (S, D), (S, D)
    mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # (T, S): the causal pattern, for any T and S
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (T, D), (T, S)
    named = {
        "X": x,
        "source": source,
        "W_Q": w_q,
        "W_K": w_k,
        "W_V": w_v,
        "Q": q,
        "K": k,
        "V": v,
        "scores": scaled_dot_scores(q, k),
        "mask": mask,
        "weights": weights,
        "output": out,
    }
    return {name: tuple(t.shape) for name, t in named.items()}


# --------------------------------------------------------------------------- drawing helpers


def canvas(width: float, height: float) -> tuple[Figure, Axes]:
    """A figure of ``width`` x ``height`` inches in the book's style, drawn in inches, no axes."""
    viz.use_book_style()
    # constrained layout without padding lets the axes fill the figure (saving a figure with no layout
    # engine twice would switch constrained layout on, as the book's style asks, and warn)
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    fig.get_layout_engine().set(w_pad=0, h_pad=0, wspace=0, hspace=0)
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    return fig, ax


def draw_box(
    ax: Axes,
    name: str,
    centre: tuple[float, float],
    size: tuple[float, float],
    text: str,
    kind: str = "op",
    shape: str | None = None,
    dashed: bool = False,
    shape_gid: str | None = None,
) -> Text:
    """A rounded box with ``text`` (and, below it, ``shape``) centred in it.

    Args:
        ax: axes from :func:`canvas`. name: the box's ``gid`` (its shape label's is ``"shape:<name>"``).
        centre: ``(x, y)`` in inches. size: ``(width, height)`` in inches.
        text: the label (mathtext allowed). kind: a key of :data:`FILL`.
        shape: a second line, e.g. ``"$(T, D)$"``. dashed: draw the edge dashed (an optional part).
        shape_gid: the second line's ``gid``; ``"shape:<name>"`` by default.

    Returns:
        The label's :class:`~matplotlib.text.Text`.
    """
    (x, y), (w, h) = centre, size
    box = FancyBboxPatch(
        (x - w / 2, y - h / 2),
        w,
        h,
        boxstyle="round,pad=0,rounding_size=0.07",
        facecolor=FILL[kind] + "55",
        edgecolor="black",
        lw=1.0,
        ls="--" if dashed else "-",
    )
    box.set_gid(name)
    ax.add_patch(box)
    if shape is None:
        return ax.text(x, y, text, ha="center", va="center", gid=f"label:{name}")
    label = ax.text(x, y + 0.11, text, ha="center", va="center", gid=f"label:{name}")
    ax.text(x, y - 0.13, shape, ha="center", va="center", gid=shape_gid or f"shape:{name}")
    return label


def draw_arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float], gid: str, **kwargs) -> None:
    """An arrow from ``start`` to ``end`` (inches); ``kwargs`` go to ``FancyArrowPatch``
    (e.g. ``connectionstyle="angle,angleA=0,angleB=90"`` for an elbow)."""
    arrow = FancyArrowPatch(
        start, end, arrowstyle="-|>", mutation_scale=12, lw=1.2, color="black", shrinkA=0, shrinkB=0, **kwargs
    )
    arrow.set_gid(gid)
    ax.add_patch(arrow)


# --------------------------------------------------------------------------- the diagram


def qkv_flow(T: int = 3, S: int = 5, C: int = 7, D: int = 4) -> Figure:
    """Draw the data flow of one attention call, each tensor with its shape in the book's letters.

    ``X (T, C)`` is projected by ``W_Q`` to ``Q (T, D)``; the source sequence ``(S, C)`` (``X``
    itself in self-attention) by ``W_K`` and ``W_V`` to ``K, V (S, D)``; then come the scores
    ``Q K^T / sqrt(D)`` ``(T, S)``, the mask, the softmax over the keys, and the weighted sum of
    the values, ``(T, D)``. The shapes are those :func:`attention_shapes` measures for the given
    sizes, which must all differ.

    Returns:
        A 5.5-inch-wide figure in the book's style.
    """
    sizes = {"T": T, "S": S, "C": C, "D": D}
    shapes = {name: symbolic(shape, sizes) for name, shape in attention_shapes(T, S, C, D).items()}
    fig, ax = canvas(5.5, 6.35)
    xq, xk, xv = 1.0, 2.75, 4.5  # the columns of Q, K and V
    w, h = 1.5, 0.55  # a tensor box
    wide = 3.3  # the boxes acting on the (T, S) scores
    xs = (xq + xk) / 2

    rows = [5.95 - 0.92 * i for i in range(7)]  # inputs, projections, Q K V, scores, mask, softmax, out
    draw_box(ax, "X", (xq, rows[0]), (w, h), "$X$", "input", shapes["X"])
    draw_box(
        ax,
        "source",
        ((xk + xv) / 2, rows[0]),
        (3.2, h),
        "$X$, or another sequence",
        "input",
        shapes["source"],
    )
    for x, name, src in ((xq, "Q", "X"), (xk, "K", "source"), (xv, "V", "source")):
        draw_box(
            ax, f"W_{name}", (x, rows[1]), (w, h), f"$\\times\\, W_{name}$", "weight", shapes[f"W_{name}"]
        )
        draw_box(ax, name, (x, rows[2]), (w, h), f"${name}$", "tensor", shapes[name])
        draw_arrow(ax, (x, rows[0] - h / 2), (x, rows[1] + h / 2), f"flow:{src}->W_{name}")
        draw_arrow(ax, (x, rows[1] - h / 2), (x, rows[2] + h / 2), f"flow:W_{name}->{name}")

    # the root is the character √: mathtext's radical puts its overbar apart from it in a browser's fonts
    draw_box(ax, "scores", (xs, rows[3]), (wide, h), r"scores $QK^\top$ / √$D$", "op", shapes["scores"])
    draw_arrow(ax, (xq, rows[2] - h / 2), (xq, rows[3] + h / 2), "flow:Q->scores")
    draw_arrow(ax, (xk, rows[2] - h / 2), (xk, rows[3] + h / 2), "flow:K->scores")
    draw_box(
        ax,
        "mask",
        (xs, rows[4]),
        (wide, h),
        r"mask: where False, score $\to {-\infty}$",
        "op",
        shapes["mask"],
    )
    draw_arrow(ax, (xs, rows[3] - h / 2), (xs, rows[4] + h / 2), "flow:scores->mask")
    draw_box(
        ax, "weights", (xs, rows[5]), (wide, h), "softmax over keys: weights $A$", "op", shapes["weights"]
    )
    draw_arrow(ax, (xs, rows[4] - h / 2), (xs, rows[5] + h / 2), "flow:mask->weights")
    draw_box(ax, "output", (xs, rows[6]), (wide, h), "output $AV$", "output", shapes["output"])
    draw_arrow(ax, (xs, rows[5] - h / 2), (xs, rows[6] + h / 2), "flow:weights->output")
    # the values wait beside the score path and join at the weighted sum
    draw_arrow(
        ax,
        (xv, rows[2] - h / 2),
        (xs + wide / 2, rows[6]),
        "flow:V->output",
        connectionstyle="angle,angleA=-90,angleB=0,rad=0",
    )
    return fig
